//! synaptix-infer
