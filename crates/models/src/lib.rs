//! synaptix-models
