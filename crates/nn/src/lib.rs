//! synaptix-nn
