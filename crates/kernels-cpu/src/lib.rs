//! synaptix-kernels-cpu
