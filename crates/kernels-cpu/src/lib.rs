//! synaptix-kernels-cpu: CPU compute kernels.
//!
//! - [`quant`]: dequantization of ggml block types, activation quantization, quantized dot
//!   products and the weight × activation matmul, bit-identical with ggml's portable CPU build,
//!   with a portable scalar path plus AVX2 and AVX-512 (x86_64) or NEON (aarch64) paths chosen
//!   at run time.
//! - [`ops`]: small f32 element-wise and row-wise ops (RMS norm, softmax, activations).
//! - [`dense`]: f32 ops over whole sequences for encoder-decoder models (LayerNorm, exact GELU,
//!   products with a bias, 1-D convolution, multi-head attention).
//! - [`conv`]: 1-D convolutions for convolutional speech models (dilated, depthwise,
//!   transposed).
//! - [`cpu_features`] / [`kernel_path`]: what the CPU offers and which kernel path is in use.

pub mod conv;
mod cpu;
pub mod dense;
mod gemm;
pub mod ops;
pub mod quant;
mod team;

pub use cpu::{cpu_features, kernel_path, CpuFeatures, KERNEL_PATH_ENV};
#[doc(hidden)]
pub use quant::kernel_paths;
pub use quant::{
    activation_dtype, dequantize, matmul, matmul_many, matmul_quantized, quantize_acts,
    quantize_weights, vec_dot, QuantizedActs, WeightView, QUANTIZE_TARGETS,
};
pub use quant::{
    finite_amax, nvfp4_tensor_scale, quantize_nvfp4_with_scale, quantize_weights_weighted,
    symb4_encode_group, uses_importance,
};

#[cfg(test)]
pub(crate) mod testutil;
