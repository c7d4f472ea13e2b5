//! The CUDA sources of `kernels/`, embedded in the binary.
//!
//! One file per op family; every file starts with `#include "common.cuh"` (and those that
//! quantize activations include `quant8.cuh`), spliced in textually so NVRTC needs no include
//! paths (and no CUDA headers on the user's machine).

/// One `.cu` file.
#[derive(Debug, Clone, Copy)]
pub struct KernelFile {
    /// File stem, also the module name (`norm` for `kernels/norm.cu`).
    pub name: &'static str,
    pub source: &'static str,
}

const COMMON: &str = include_str!("../../../kernels/common.cuh");
const QUANT8: &str = include_str!("../../../kernels/quant8.cuh");

/// Every kernel file, in a fixed order.
pub const FILES: &[KernelFile] = &[
    KernelFile {
        name: "elementwise",
        source: include_str!("../../../kernels/elementwise.cu"),
    },
    KernelFile {
        name: "norm",
        source: include_str!("../../../kernels/norm.cu"),
    },
    KernelFile {
        name: "rope",
        source: include_str!("../../../kernels/rope.cu"),
    },
    KernelFile {
        name: "embed",
        source: include_str!("../../../kernels/embed.cu"),
    },
    KernelFile {
        name: "matvec",
        source: include_str!("../../../kernels/matvec.cu"),
    },
    KernelFile {
        name: "gemm",
        source: include_str!("../../../kernels/gemm.cu"),
    },
    KernelFile {
        name: "gemm_k",
        source: include_str!("../../../kernels/gemm_k.cu"),
    },
    KernelFile {
        name: "quantize",
        source: include_str!("../../../kernels/quantize.cu"),
    },
    KernelFile {
        name: "attention",
        source: include_str!("../../../kernels/attention.cu"),
    },
    KernelFile {
        name: "sample",
        source: include_str!("../../../kernels/sample.cu"),
    },
];

const INCLUDE_LINE: &str = "#include \"common.cuh\"";
const QUANT8_LINE: &str = "#include \"quant8.cuh\"";

/// The file's source with the shared headers spliced in.
pub fn full_source(file: &KernelFile) -> String {
    file.source
        .replacen(INCLUDE_LINE, COMMON, 1)
        .replacen(QUANT8_LINE, QUANT8, 1)
}

pub fn find(name: &str) -> Option<&'static KernelFile> {
    FILES.iter().find(|f| f.name == name)
}
