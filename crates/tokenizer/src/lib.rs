//! synaptix-tokenizer
