//! synaptix-bundle
