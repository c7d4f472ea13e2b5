//! Quantized weights: dequantization, activation quantization, dot products and matmul.
//!
//! The numerics are those of ggml's CPU backend built portably (no SIMD, no FMA), bit for bit:
//! an activation row is converted once to the partner type of the weight type
//! ([`activation_dtype`]) by ggml's reference quantizers, and each weight row is dotted with it in
//! the exact float operation order of ggml's `_generic` dot products (integer arithmetic inside
//! blocks). Golden outputs of that ggml build are in tests/fixtures/quant/.
//!
//! | weights | activations |
//! |---|---|
//! | F32, MXFP8, NVFP4, SQ1 .. SQ8, SYMB4 | F32 |
//! | F16 | F16 (values rounded to half) |
//! | BF16 | BF16 (values rounded to bfloat16) |
//! | Q4_0, Q5_0, Q8_0, IQ4_NL | Q8_0 |
//! | Q4_1, Q5_1 | Q8_1 |
//! | Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS | Q8_K |
//!
//! Every kernel path (scalar, AVX2, AVX-512, NEON) quantizes and sums in that order, so results are
//! bit-identical across paths and CPUs, and with ggml's portable build.

pub(crate) mod float;
mod importance;
pub(crate) mod iquants;
mod kquants;
mod legacy;
mod matmul;
pub(crate) mod mx;
mod simd;
mod sq;
pub(crate) mod symb;
mod weights;

pub use importance::{quantize_weights_weighted, uses_importance};
pub use symb::encode_group as symb4_encode_group;
pub use weights::{
    finite_amax, nvfp4_tensor_scale, quantize_nvfp4_with_scale, quantize_weights, QUANTIZE_TARGETS,
};

use synaptix_core::{DType, Error, Result};

pub use matmul::{matmul, matmul_many, matmul_quantized, WeightView};

use crate::cpu::{path, Path};

/// Checks that `src` holds exactly `n` elements of `dtype`.
fn check_len(op: &'static str, dtype: DType, src_len: usize, n: usize) -> Result<()> {
    let expected = dtype.bytes_for(n as u64);
    if expected != Some(src_len as u64) {
        let detail = match expected {
            Some(b) => format!("{n} {dtype} elements need {b} bytes, got {src_len}"),
            None => format!(
                "{n} elements is not a whole number of {dtype} blocks of {}",
                dtype.block_len()
            ),
        };
        return Err(Error::ShapeMismatch { op, detail });
    }
    Ok(())
}

/// Dequantizes `dst.len()` elements of `dtype` from `src` (ggml's row layout: consecutive
/// blocks). Results are bit-exact with ggml's `dequantize_row_*` (its `to_float`) and gguf-py's
/// `gguf.quants.dequantize`.
///
/// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (all
/// checked against fixtures from both), the activation types Q8_1, Q8_K (`d * q`), and MXFP8 and
/// NVFP4 (synaptix's own, checked against ml_dtypes).
///
/// Errors: [`Error::UnsupportedDType`] for other types; [`Error::ShapeMismatch`] when
/// `dst.len()` is not a whole number of blocks or `src.len()` is not its byte size.
pub fn dequantize(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    const OP: &str = "dequantize";
    let f: fn(&[u8], &mut [f32]) = match dtype {
        DType::F32 => float::dequantize_f32,
        DType::F16 => float::dequantize_f16,
        DType::BF16 => float::dequantize_bf16,
        DType::Q4_0 => legacy::dequantize_q4_0,
        DType::Q4_1 => legacy::dequantize_q4_1,
        DType::Q5_0 => legacy::dequantize_q5_0,
        DType::Q5_1 => legacy::dequantize_q5_1,
        DType::Q8_0 => legacy::dequantize_q8_0,
        DType::Q8_1 => legacy::dequantize_q8_1,
        DType::Q2K => kquants::dequantize_q2_k,
        DType::Q3K => kquants::dequantize_q3_k,
        DType::Q4K => kquants::dequantize_q4_k,
        DType::Q5K => kquants::dequantize_q5_k,
        DType::Q6K => kquants::dequantize_q6_k,
        DType::Q8K => kquants::dequantize_q8_k,
        DType::MXFP8 => mx::dequantize_mxfp8,
        DType::NVFP4 => mx::dequantize_nvfp4,
        DType::SQ1 => sq::dequantize_sq1,
        DType::SQ2 => sq::dequantize_sq2,
        DType::SQ3 => sq::dequantize_sq3,
        DType::SQ4 => sq::dequantize_sq4,
        DType::SQ5 => sq::dequantize_sq5,
        DType::SQ6 => sq::dequantize_sq6,
        DType::SQ7 => sq::dequantize_sq7,
        DType::SQ8 => sq::dequantize_sq8,
        DType::SYMB4 => symb::dequantize_symb4,
        DType::IQ4NL => iquants::dequantize_iq4_nl,
        DType::IQ4XS => iquants::dequantize_iq4_xs,
        _ => return Err(Error::UnsupportedDType { op: OP, dtype }),
    };
    check_len(OP, dtype, src.len(), dst.len())?;
    f(src, dst);
    Ok(())
}

/// The activation format ggml pairs with weights of type `weight` (see the module table).
pub fn activation_dtype(weight: DType) -> Result<DType> {
    Ok(match weight {
        DType::F32 | DType::F16 | DType::BF16 => weight,
        DType::MXFP8 | DType::NVFP4 | DType::SYMB4 => DType::F32,
        d if d.sq_bits().is_some() => DType::F32,
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4NL => DType::Q8_0,
        DType::IQ4XS => DType::Q8K,
        DType::Q4_1 | DType::Q5_1 => DType::Q8_1,
        DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K => DType::Q8K,
        _ => {
            return Err(Error::UnsupportedDType {
                op: "activation_dtype",
                dtype: weight,
            })
        }
    })
}

/// One activation row quantized for dot products with one weight type.
///
/// Stored structure-of-arrays for the kernels; [`QuantizedActs::to_ggml_bytes`] gives ggml's
/// block layout.
#[derive(Debug, Clone)]
pub struct QuantizedActs {
    /// Activation format: F32, F16, BF16, Q8_0, Q8_1 or Q8_K.
    pub(crate) dtype: DType,
    pub(crate) k: usize,
    /// Block formats: one quant per element, `k` entries.
    pub(crate) qs: Vec<i8>,
    /// Block formats: per-block scale as f32 (Q8_0/Q8_1: the stored half value widened).
    pub(crate) d: Vec<f32>,
    /// Q8_0/Q8_1: per-32-block Σq.
    pub(crate) isum: Vec<i32>,
    /// Q8_1: per-block `s` (half, widened).
    pub(crate) s: Vec<f32>,
    /// Q8_K: sums of each 16 consecutive quants, `k / 16` entries.
    pub(crate) bsums: Vec<i16>,
    /// Q8_K: `qs` in pair order (see `kquants`): in each group of 16, elements `i` and `i + 8`
    /// at positions `2i` and `2i + 1`.
    pub(crate) pq: Vec<i8>,
    /// Q8_K: `|pq|`.
    pub(crate) pq_abs: Vec<u8>,
    /// Float formats: the values after rounding to the format, `k` entries.
    pub(crate) vals: Vec<f32>,
}

impl QuantizedActs {
    /// The activation format (F32, F16, BF16, Q8_0, Q8_1 or Q8_K).
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.k
    }

    pub fn is_empty(&self) -> bool {
        self.k == 0
    }

    /// The row in ggml's byte layout for [`Self::dtype`] (blocks of `dtype().block_bytes()`
    /// bytes; little-endian values for the float formats).
    pub fn to_ggml_bytes(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(self.dtype.block_bytes() * self.k / self.dtype.block_len());
        match self.dtype {
            DType::F32 => self.vals.iter().for_each(|v| out.extend(v.to_le_bytes())),
            DType::F16 => self
                .vals
                .iter()
                .for_each(|v| out.extend(float::f32_to_f16(*v).to_le_bytes())),
            DType::BF16 => self
                .vals
                .iter()
                .for_each(|v| out.extend(float::f32_to_bf16(*v).to_le_bytes())),
            DType::Q8_0 | DType::Q8_1 => {
                for (b, q) in self.qs.chunks_exact(32).enumerate() {
                    out.extend(float::f32_to_f16(self.d[b]).to_le_bytes());
                    if self.dtype == DType::Q8_1 {
                        out.extend(float::f32_to_f16(self.s[b]).to_le_bytes());
                    }
                    out.extend(q.iter().map(|&v| v as u8));
                }
            }
            DType::Q8K => {
                for (b, q) in self.qs.chunks_exact(256).enumerate() {
                    out.extend(self.d[b].to_le_bytes());
                    out.extend(q.iter().map(|&v| v as u8));
                    self.bsums[b * 16..(b + 1) * 16]
                        .iter()
                        .for_each(|v| out.extend(v.to_le_bytes()));
                }
            }
            _ => {}
        }
        out
    }
}

/// Quantizes one activation row `x` (length `k`) for dot products with `weight_dtype` rows,
/// exactly like ggml's reference quantizers: Q8_0 / Q8_1 as `quantize_row_q8_0_ref` / `_q8_1_ref`
/// (`x * (1 / d)` with `d = amax / 127`, rounded half away from zero), Q8_K as
/// `quantize_row_q8_K_ref`; half (ggml's FP32_TO_FP16) and bfloat16 (FP32_TO_BF16) round to
/// nearest even.
///
/// Errors: unsupported weight type; `k` not a multiple of the activation block length (32 or
/// 256).
pub fn quantize_acts(weight_dtype: DType, x: &[f32]) -> Result<QuantizedActs> {
    quantize_acts_on(path(), weight_dtype, x)
}

/// [`quantize_acts`] with the code for `path` (which the CPU must support).
pub(crate) fn quantize_acts_on(
    path: Path,
    weight_dtype: DType,
    x: &[f32],
) -> Result<QuantizedActs> {
    let dtype = activation_dtype(weight_dtype)?;
    let k = x.len();
    let bl = dtype.block_len();
    if !k.is_multiple_of(bl) {
        return Err(Error::ShapeMismatch {
            op: "quantize_acts",
            detail: format!("row of {k} is not a multiple of the {dtype} block length {bl}"),
        });
    }
    let nb = k / bl;
    let mut a = QuantizedActs {
        dtype,
        k,
        qs: Vec::new(),
        d: Vec::new(),
        isum: Vec::new(),
        s: Vec::new(),
        bsums: Vec::new(),
        pq: Vec::new(),
        pq_abs: Vec::new(),
        vals: Vec::new(),
    };
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => a.vals = vec![0.0; k],
        DType::Q8_0 | DType::Q8_1 => {
            a.qs = vec![0; k];
            a.d = vec![0.0; nb];
            a.isum = vec![0; nb];
            if dtype == DType::Q8_1 {
                a.s = vec![0.0; nb];
            }
        }
        _ => {
            a.qs = vec![0; k];
            a.d = vec![0.0; nb];
            a.bsums = vec![0; k / 16];
            a.pq = vec![0; k];
            a.pq_abs = vec![0; k];
        }
    }
    fill_acts(path, x, &mut a);
    Ok(a)
}

/// Quantizes `x` into `a` (allocated for its format and length) with the code for `path`.
fn fill_acts(path: Path, x: &[f32], a: &mut QuantizedActs) {
    #[cfg(target_arch = "x86_64")]
    if path >= Path::Avx2 {
        // SAFETY: the CPU supports the path's features.
        unsafe { simd::x86::fill_acts_avx2(x, a) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if path == Path::Neon {
        // SAFETY: the CPU supports the path's features (NEON).
        unsafe { simd::neon::fill_acts_neon(x, a) };
        return;
    }
    let _ = path;
    fill_acts_portable(x, a);
}

/// The portable quantizers (the reference for `simd::x86::fill_acts_avx2` and
/// `simd::neon::fill_acts_neon`; also their fallback for the formats they do not vectorize).
#[inline(always)]
pub(crate) fn fill_acts_portable(x: &[f32], a: &mut QuantizedActs) {
    match a.dtype {
        DType::F16 => {
            for (v, &xv) in a.vals.iter_mut().zip(x) {
                *v = float::f16_to_f32(float::f32_to_f16(xv));
            }
        }
        DType::BF16 => {
            for (v, &xv) in a.vals.iter_mut().zip(x) {
                *v = float::bf16_to_f32(float::f32_to_bf16(xv));
            }
        }
        DType::Q8_0 | DType::Q8_1 => legacy::quantize_q8(x, a),
        DType::Q8K => kquants::quantize_q8_k(x, a),
        _ => a.vals.copy_from_slice(x),
    }
}

/// A dot kernel for one weight type.
///
/// # Safety
/// `w.len()` must be `weight_dtype.bytes_for(acts.k)`, `acts.dtype` must be
/// `activation_dtype(weight_dtype)` (SIMD kernels read through raw pointers on that basis), and
/// the CPU must support the path the kernel was taken for.
pub(crate) type DotFn = unsafe fn(w: &[u8], acts: &QuantizedActs) -> f32;

/// A kernel for a block of dots: `out[j * stride + i]` = weight row `j` (of `nrows` consecutive
/// rows of `row_bytes` bytes at the start of `w`) · `acts[i]`. Must give exactly the [`DotFn`]
/// result for every pair.
///
/// # Safety
/// As [`DotFn`] for every row and activation row; `w` holds at least `nrows * row_bytes` bytes
/// and `out` at least `(nrows - 1) * stride + acts.len()` values.
pub(crate) type BlockFn = unsafe fn(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
);

/// The kernels of one weight type on one path.
#[derive(Clone, Copy)]
pub(crate) struct Kernels {
    pub(crate) dot: DotFn,
    /// A faster kernel for blocks of dots, if the path has one.
    pub(crate) block: Option<BlockFn>,
}

impl Kernels {
    /// Dots of `nrows` rows with every row of `acts` (see [`BlockFn`]).
    ///
    /// # Safety
    /// As [`BlockFn`].
    #[inline]
    pub(crate) unsafe fn run_block(
        &self,
        w: &[u8],
        row_bytes: usize,
        nrows: usize,
        acts: &[QuantizedActs],
        out: &mut [f32],
        stride: usize,
    ) {
        if let Some(block) = self.block {
            return block(w, row_bytes, nrows, acts, out, stride);
        }
        for j in 0..nrows {
            let row = &w[j * row_bytes..(j + 1) * row_bytes];
            for (i, a) in acts.iter().enumerate() {
                out[j * stride + i] = (self.dot)(row, a);
            }
        }
    }
}

/// Portable kernels; also the reference the SIMD kernels are tested against.
fn scalar_kernel(weight_dtype: DType) -> Option<DotFn> {
    Some(match weight_dtype {
        DType::F32 => |w, a| float::dot_f32(w, &a.vals),
        DType::F16 => |w, a| float::dot_f16(w, &a.vals),
        DType::BF16 => |w, a| float::dot_bf16(w, &a.vals),
        DType::Q4_0 => legacy::dot_q4_0,
        DType::Q4_1 => legacy::dot_q4_1,
        DType::Q5_0 => legacy::dot_q5_0,
        DType::Q5_1 => legacy::dot_q5_1,
        DType::Q8_0 => legacy::dot_q8_0,
        DType::Q2K => kquants::dot_q2_k,
        DType::Q3K => kquants::dot_q3_k,
        DType::Q4K => kquants::dot_q4_k,
        DType::Q5K => kquants::dot_q5_k,
        DType::Q6K => kquants::dot_q6_k,
        DType::MXFP8 => mx::dot_mxfp8,
        DType::NVFP4 => mx::dot_nvfp4,
        DType::SQ1 => sq::dot_sq1,
        DType::SQ2 => sq::dot_sq2,
        DType::SQ3 => sq::dot_sq3,
        DType::SQ4 => sq::dot_sq4,
        DType::SQ5 => sq::dot_sq5,
        DType::SQ6 => sq::dot_sq6,
        DType::SQ7 => sq::dot_sq7,
        DType::SQ8 => sq::dot_sq8,
        DType::SYMB4 => symb::dot_symb4,
        DType::IQ4NL => iquants::dot_iq4_nl,
        DType::IQ4XS => iquants::dot_iq4_xs,
        _ => return None,
    })
}

/// The kernels for `weight_dtype` on `path`, falling back to scalar where a path has none.
pub(crate) fn kernels_for(weight_dtype: DType, path: Path) -> Option<Kernels> {
    let scalar = scalar_kernel(weight_dtype)?;
    let (dot, block) = simd::kernels(weight_dtype, path);
    Some(Kernels {
        dot: dot.unwrap_or(scalar),
        block,
    })
}

/// Validates a weight row against quantized activations; returns the kernels to use.
pub(crate) fn checked_kernels(
    op: &'static str,
    path: Path,
    weight_dtype: DType,
    row_bytes: usize,
    acts: &QuantizedActs,
) -> Result<Kernels> {
    let want = activation_dtype(weight_dtype)?;
    if acts.dtype != want {
        return Err(Error::Invalid {
            op,
            detail: format!(
                "{weight_dtype} weights need {want} activations, got {}",
                acts.dtype
            ),
        });
    }
    check_len(op, weight_dtype, row_bytes, acts.k)?;
    kernels_for(weight_dtype, path).ok_or(Error::UnsupportedDType {
        op,
        dtype: weight_dtype,
    })
}

/// f32 × f32 dot of equal-length slices on `path` (which the CPU must support), in the 32-lane
/// order of `float::dot_f32_slices` (for `ops::dot`; not ggml's order).
pub(crate) fn float_dot(path: Path, w: &[f32], a: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), a.len());
    match simd::f32_dot(path) {
        Some(f) if w.len() == a.len() => {
            // Viewing f32s as bytes is always valid; x86_64 and aarch64 Linux are
            // little-endian, the kernels' byte order.
            let wb = unsafe { std::slice::from_raw_parts(w.as_ptr() as *const u8, w.len() * 4) };
            // SAFETY: `wb` holds `a.len()` f32 values and `path` is supported by the CPU.
            unsafe { f(wb, a) }
        }
        _ => float::dot_f32_slices(w, a),
    }
}

/// Dot product of one weight row (`acts.len()` elements of `weight_dtype`, ggml layout) with
/// activations quantized for that type by [`quantize_acts`]: bit-identical with ggml's
/// `vec_dot` for the type.
pub fn vec_dot(weight_dtype: DType, w_row: &[u8], acts: &QuantizedActs) -> Result<f32> {
    vec_dot_on(path(), weight_dtype, w_row, acts)
}

/// [`vec_dot`] with the kernel for `path` (which the CPU must support).
pub(crate) fn vec_dot_on(
    path: Path,
    weight_dtype: DType,
    w_row: &[u8],
    acts: &QuantizedActs,
) -> Result<f32> {
    let kernels = checked_kernels("vec_dot", path, weight_dtype, w_row.len(), acts)?;
    // SAFETY: checked_kernels verified the row length and the activation format.
    Ok(unsafe { (kernels.dot)(w_row, acts) })
}

/// Explicit kernel paths, for tests and benchmarks that compare paths within one process.
#[doc(hidden)]
pub mod kernel_paths {
    use synaptix_core::{DType, Error, Result};

    use super::{QuantizedActs, WeightView};
    use crate::cpu::Path;

    /// Names of the paths this CPU supports, most portable first (`"scalar"`, `"avx2"`,
    /// `"avx512"` on x86_64; `"scalar"`, `"neon"` on aarch64).
    pub fn supported() -> Vec<&'static str> {
        Path::all_supported()
            .into_iter()
            .map(Path::short_name)
            .collect()
    }

    fn parse(name: &str) -> Result<Path> {
        Path::all_supported()
            .into_iter()
            .find(|p| p.short_name() == name)
            .ok_or_else(|| Error::Invalid {
                op: "kernel_paths",
                detail: format!("kernel path {name:?} is not supported on this CPU"),
            })
    }

    pub fn quantize_acts_on(path: &str, weight_dtype: DType, x: &[f32]) -> Result<QuantizedActs> {
        super::quantize_acts_on(parse(path)?, weight_dtype, x)
    }

    pub fn vec_dot_on(
        path: &str,
        weight_dtype: DType,
        w_row: &[u8],
        acts: &QuantizedActs,
    ) -> Result<f32> {
        super::vec_dot_on(parse(path)?, weight_dtype, w_row, acts)
    }

    pub fn matmul_on(path: &str, w: WeightView, x: &[f32], m: usize, y: &mut [f32]) -> Result<()> {
        super::matmul::matmul_on(parse(path)?, w, x, m, y)
    }

    pub fn matmul_quantized_on(
        path: &str,
        w: WeightView,
        acts: &[QuantizedActs],
        y: &mut [f32],
    ) -> Result<()> {
        super::matmul::matmul_quantized_on(parse(path)?, w, acts, y)
    }
}

#[cfg(test)]
mod tests;
