//! synaptix-sample
