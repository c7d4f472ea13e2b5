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
    /// Compiled for `sm_90a` only (Hopper's architecture-specific instructions: wgmma), and
    /// loaded only on compute capability 9.0 cards.
    pub hopper_only: bool,
}

const COMMON: &str = include_str!("../../../kernels/common.cuh");
const QUANT8: &str = include_str!("../../../kernels/quant8.cuh");

/// Every kernel file, in a fixed order.
pub const FILES: &[KernelFile] = &[
    KernelFile {
        name: "elementwise",
        source: include_str!("../../../kernels/elementwise.cu"),
        hopper_only: false,
    },
    KernelFile {
        name: "norm",
        source: include_str!("../../../kernels/norm.cu"),
        hopper_only: false,
    },
    KernelFile {
        name: "rope",
        source: include_str!("../../../kernels/rope.cu"),
        hopper_only: false,
    },
    KernelFile {
        name: "embed",
        source: include_str!("../../../kernels/embed.cu"),
        hopper_only: false,
    },
    KernelFile {
        name: "matvec",
        source: include_str!("../../../kernels/matvec.cu"),
        hopper_only: false,
    },
    KernelFile {
        name: "gemm",
        source: include_str!("../../../kernels/gemm.cu"),
        hopper_only: false,
    },
    KernelFile {
        name: "gemm_k",
        source: include_str!("../../../kernels/gemm_k.cu"),
        hopper_only: false,
    },
    KernelFile {
        name: "gemm_wg",
        source: include_str!("../../../kernels/gemm_wg.cu"),
        hopper_only: true,
    },
    KernelFile {
        name: "quantize",
        source: include_str!("../../../kernels/quantize.cu"),
        hopper_only: false,
    },
    KernelFile {
        name: "attention",
        source: include_str!("../../../kernels/attention.cu"),
        hopper_only: false,
    },
    KernelFile {
        name: "sample",
        source: include_str!("../../../kernels/sample.cu"),
        hopper_only: false,
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
