//! 1-D convolutions over time-major activations `[time, channels]` (the layout of the dense ops),
//! for convolutional speech models (VITS / HiFi-GAN): dilated and padded convolution as
//! im2col + the register-tiled product, depthwise (one filter per channel) convolution, and
//! transposed (upsampling) convolution as one product followed by overlap-add. Weights are kept
//! in PyTorch's layouts (`[c_out, c_in, kernel]` for a convolution, `[c_in, c_out, kernel]` for a
//! transposed one) except where a function says otherwise. Shapes are checked; mismatches are
//! [`Error::ShapeMismatch`].

use rayon::prelude::*;
use synaptix_core::{Error, Result};

use crate::dense::linear;
use crate::gemm::{gemm_nt, gemm_nt_strided, WeightRef};

fn mismatch(op: &'static str, detail: String) -> Error {
    Error::ShapeMismatch { op, detail }
}

/// Output rows per parallel task of the element-wise loops: enough work per task that waking
/// a thread is worth it.
const ROWS_PER_TASK: usize = 64;

/// Geometry of a 1-D convolution along time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeometry {
    pub kernel: usize,
    pub stride: usize,
    pub dilation: usize,
    /// Zeros before the first input step.
    pub pad_left: usize,
    /// Zeros after the last input step.
    pub pad_right: usize,
}

impl ConvGeometry {
    /// Output steps for `t_in` input steps, `None` when the padded input is shorter than the
    /// dilated kernel (or a field is zero).
    pub fn output_len(&self, t_in: usize) -> Option<usize> {
        if self.kernel == 0 || self.stride == 0 || self.dilation == 0 {
            return None;
        }
        let span = self.dilation.checked_mul(self.kernel - 1)? + 1;
        let padded = t_in
            .checked_add(self.pad_left)?
            .checked_add(self.pad_right)?;
        padded.checked_sub(span).map(|room| room / self.stride + 1)
    }

    /// The input step that tap `j` of output step `t` reads, `None` inside the padding.
    #[inline]
    fn input_step(&self, t: usize, j: usize, t_in: usize) -> Option<usize> {
        (t * self.stride + j * self.dilation)
            .checked_sub(self.pad_left)
            .filter(|&s| s < t_in)
    }
}

/// A convolution weight `[c_out, c_in, kernel]` (PyTorch's layout) rearranged tap-major,
/// `[c_out, kernel, c_in]`: each output channel's row then lines up with `kernel` consecutive
/// time-major input rows, the layout [`conv1d_dilated`] multiplies by.
pub fn tap_major_weight(w: &[f32], c_out: usize, c_in: usize, kernel: usize) -> Vec<f32> {
    let mut out = vec![0f32; w.len()];
    for o in 0..c_out {
        for i in 0..c_in {
            for j in 0..kernel {
                out[(o * kernel + j) * c_in + i] = w[(o * c_in + i) * kernel + j];
            }
        }
    }
    out
}

/// Convolution `x: [t_in, c_in]` with a tap-major weight `[c_out, kernel, c_in]` (see
/// [`tap_major_weight`]) (+ bias) → `([t_out, c_out], t_out)`.
///
/// With stride 1 nothing is unrolled: in the zero-padded input, output step `t` reads rows `t,
/// t + d, ..., t + (kernel - 1)·d`. For dilation 1 those are `kernel` consecutive rows, i.e.
/// `kernel·c_in` consecutive values, so the product reads its rows straight from the padded
/// input with a row stride of `c_in` (overlapping windows). For dilation `d` the padded input is
/// first split into `d` phases (rows `r, r + d, r + 2d, ...`), where the same holds, and each
/// phase's outputs are put back in time order. Other strides unroll each window (im2col).
pub fn conv1d_dilated(
    x: &[f32],
    t_in: usize,
    c_in: usize,
    w: WeightRef,
    c_out: usize,
    bias: Option<&[f32]>,
    geometry: ConvGeometry,
) -> Result<(Vec<f32>, usize)> {
    const OP: &str = "conv1d";
    let ConvGeometry {
        kernel,
        stride,
        dilation,
        pad_left,
        pad_right,
    } = geometry;
    let t_out = geometry.output_len(t_in).ok_or_else(|| {
        mismatch(
            OP,
            format!("{t_in} input steps are too few for {geometry:?}"),
        )
    })?;
    if x.len() != t_in * c_in {
        return Err(mismatch(
            OP,
            format!("x has {} values, expected {t_in}×{c_in}", x.len()),
        ));
    }
    let cols = c_in * kernel;
    if w.len() != c_out * cols {
        return Err(mismatch(
            OP,
            format!(
                "weight has {} values, expected {c_out}×{kernel}×{c_in}",
                w.len()
            ),
        ));
    }
    if bias.is_some_and(|b| b.len() != c_out) {
        return Err(mismatch(OP, format!("bias is not {c_out} values")));
    }
    let mut y = vec![0f32; t_out * c_out];
    if stride != 1 {
        let mut unrolled = vec![0f32; t_out * cols];
        unrolled
            .par_chunks_mut(cols)
            .enumerate()
            .for_each(|(t, row)| {
                for (j, tap) in row.chunks_exact_mut(c_in).enumerate() {
                    if let Some(s) = geometry.input_step(t, j, t_in) {
                        tap.copy_from_slice(&x[s * c_in..(s + 1) * c_in]);
                    }
                }
            });
        gemm_nt(&unrolled, t_out, w, c_out, cols, &mut y);
    } else {
        let padded_len = t_in + pad_left + pad_right;
        for phase in 0..dilation {
            // Padded rows phase, phase + d, ...; outputs phase, phase + d, ...
            let rows = (padded_len - phase).div_ceil(dilation);
            let outs = (t_out.saturating_sub(phase)).div_ceil(dilation);
            if outs == 0 {
                continue;
            }
            let mut a = vec![0f32; rows * c_in];
            for (s, row) in a.chunks_exact_mut(c_in).enumerate() {
                let p = phase + s * dilation;
                if let Some(src) = p.checked_sub(pad_left).filter(|&q| q < t_in) {
                    row.copy_from_slice(&x[src * c_in..(src + 1) * c_in]);
                }
            }
            if dilation == 1 {
                gemm_nt_strided(&a, c_in, outs, w, c_out, cols, &mut y);
            } else {
                let mut part = vec![0f32; outs * c_out];
                gemm_nt_strided(&a, c_in, outs, w, c_out, cols, &mut part);
                for (s, row) in part.chunks_exact(c_out).enumerate() {
                    let t = phase + s * dilation;
                    y[t * c_out..(t + 1) * c_out].copy_from_slice(row);
                }
            }
        }
    }
    if let Some(b) = bias {
        for row in y.chunks_exact_mut(c_out) {
            row.iter_mut().zip(b).for_each(|(v, &b)| *v += b);
        }
    }
    Ok((y, t_out))
}

/// Depthwise convolution (PyTorch `groups == channels`): `x: [t_in, channels]`, `w: [channels,
/// 1, kernel]` (+ bias) → `([t_out, channels], t_out)`; each channel is filtered by its own
/// kernel.
pub fn depthwise_conv1d(
    x: &[f32],
    t_in: usize,
    channels: usize,
    w: &[f32],
    bias: Option<&[f32]>,
    geometry: ConvGeometry,
) -> Result<(Vec<f32>, usize)> {
    const OP: &str = "depthwise_conv1d";
    let kernel = geometry.kernel;
    let t_out = geometry.output_len(t_in).ok_or_else(|| {
        mismatch(
            OP,
            format!("{t_in} input steps are too few for {geometry:?}"),
        )
    })?;
    if x.len() != t_in * channels || w.len() != channels * kernel {
        return Err(mismatch(
            OP,
            format!(
                "x has {} values for {t_in}×{channels}, weight {} for {channels}×1×{kernel}",
                x.len(),
                w.len()
            ),
        ));
    }
    if bias.is_some_and(|b| b.len() != channels) {
        return Err(mismatch(OP, format!("bias is not {channels} values")));
    }
    // Taps transposed to `[kernel][channels]` so the inner loop runs along channels.
    let mut taps = vec![0f32; kernel * channels];
    for c in 0..channels {
        for j in 0..kernel {
            taps[j * channels + c] = w[c * kernel + j];
        }
    }
    let mut y = vec![0f32; t_out * channels];
    y.par_chunks_mut(channels * ROWS_PER_TASK)
        .enumerate()
        .for_each(|(task, rows)| {
            for (r, row) in rows.chunks_exact_mut(channels).enumerate() {
                let t = task * ROWS_PER_TASK + r;
                match bias {
                    Some(b) => row.copy_from_slice(b),
                    None => row.fill(0.0),
                }
                for j in 0..kernel {
                    if let Some(s) = geometry.input_step(t, j, t_in) {
                        let src = &x[s * channels..(s + 1) * channels];
                        let tap = &taps[j * channels..(j + 1) * channels];
                        for ((o, &v), &k) in row.iter_mut().zip(src).zip(tap) {
                            *o += v * k;
                        }
                    }
                }
            }
        });
    Ok((y, t_out))
}

/// A transposed convolution's weight `[c_in, c_out, kernel]` (PyTorch's `ConvTranspose1d`
/// layout) rearranged to `[kernel, c_out, c_in]`: row `j·c_out + o` holds the inputs' weights of
/// output channel `o` at tap `j`, the layout [`conv_transpose1d`] multiplies by.
pub fn transposed_conv_weight(w: &[f32], c_in: usize, c_out: usize, kernel: usize) -> Vec<f32> {
    let mut out = vec![0f32; w.len()];
    for i in 0..c_in {
        for o in 0..c_out {
            for j in 0..kernel {
                out[(j * c_out + o) * c_in + i] = w[(i * c_out + o) * kernel + j];
            }
        }
    }
    out
}

/// Transposed convolution (upsampling by `stride`): `x: [t_in, c_in]`, `w` from
/// [`transposed_conv_weight`] (`[kernel, c_out, c_in]`) (+ bias) → `([t_out, c_out], t_out)`
/// with `t_out = (t_in - 1)·stride + kernel - pad_left - pad_right`. Input step `t`'s tap `j`
/// lands on output step `t·stride + j - pad_left`: one product `P = x · wᵀ` gives every tap's
/// contribution `P[t][j][o]`, then each output row sums the taps that land on it.
pub fn conv_transpose1d(
    x: &[f32],
    t_in: usize,
    c_in: usize,
    w: &[f32],
    c_out: usize,
    bias: Option<&[f32]>,
    geometry: ConvGeometry,
) -> Result<(Vec<f32>, usize)> {
    const OP: &str = "conv_transpose1d";
    let ConvGeometry {
        kernel,
        stride,
        dilation,
        pad_left,
        pad_right,
    } = geometry;
    let full = t_in
        .checked_sub(1)
        .and_then(|t| t.checked_mul(stride))
        .and_then(|t| t.checked_add(kernel));
    let t_out = full.and_then(|f| f.checked_sub(pad_left + pad_right));
    let t_out = match t_out {
        Some(t) if dilation == 1 && stride > 0 && kernel > 0 && t > 0 => t,
        _ => {
            return Err(mismatch(
                OP,
                format!("{t_in} input steps do not fit {geometry:?} (dilation must be 1)"),
            ))
        }
    };
    if x.len() != t_in * c_in || w.len() != kernel * c_out * c_in {
        return Err(mismatch(
            OP,
            format!(
                "x has {} values for {t_in}×{c_in}, weight {} for {c_in}×{c_out}×{kernel}",
                x.len(),
                w.len()
            ),
        ));
    }
    if bias.is_some_and(|b| b.len() != c_out) {
        return Err(mismatch(OP, format!("bias is not {c_out} values")));
    }
    // [t_in, kernel·c_out]: tap j of input step t for output channel o at [t][j·c_out + o].
    let taps = linear(x, t_in, WeightRef::F32(w), kernel * c_out, c_in, None)?;
    let mut y = vec![0f32; t_out * c_out];
    y.par_chunks_mut(c_out * ROWS_PER_TASK)
        .enumerate()
        .for_each(|(task, rows)| {
            for (r, row) in rows.chunks_exact_mut(c_out).enumerate() {
                if let Some(b) = bias {
                    row.copy_from_slice(b);
                }
                // Input steps t with u + pad_left = t·stride + j for some tap j in [0, kernel).
                let at = task * ROWS_PER_TASK + r + pad_left;
                let t_first = (at + 1).saturating_sub(kernel).div_ceil(stride);
                let t_last = (at / stride).min(t_in - 1);
                for t in t_first..=t_last {
                    let j = at - t * stride;
                    let src = &taps[(t * kernel + j) * c_out..(t * kernel + j + 1) * c_out];
                    row.iter_mut().zip(src).for_each(|(o, &v)| *o += v);
                }
            }
        });
    Ok((y, t_out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 % 97) as f32 / 48.0 - 1.0) * scale)
            .collect()
    }

    /// Direct definition of a (grouped) convolution in channel-major loops, for comparison.
    #[allow(clippy::too_many_arguments)]
    fn reference_conv(
        x: &[f32],
        t_in: usize,
        c_in: usize,
        w: &[f32],
        c_out: usize,
        groups: usize,
        bias: &[f32],
        g: ConvGeometry,
    ) -> Vec<f32> {
        let t_out = g.output_len(t_in).unwrap();
        let (cin_g, cout_g) = (c_in / groups, c_out / groups);
        let mut y = vec![0f32; t_out * c_out];
        for t in 0..t_out {
            for o in 0..c_out {
                let grp = o / cout_g;
                let mut acc = bias[o] as f64;
                for i in 0..cin_g {
                    for j in 0..g.kernel {
                        let pos = (t * g.stride + j * g.dilation) as i64 - g.pad_left as i64;
                        if pos >= 0 && (pos as usize) < t_in {
                            let xi = x[pos as usize * c_in + grp * cin_g + i];
                            acc += (w[(o * cin_g + i) * g.kernel + j] * xi) as f64;
                        }
                    }
                }
                y[t * c_out + o] = acc as f32;
            }
        }
        y
    }

    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol, "at {i}: {x} vs {y}");
        }
    }

    #[test]
    fn dilated_conv_matches_the_definition() {
        for &(t_in, c_in, c_out, kernel, dilation, pl, pr, stride) in &[
            (37, 5, 7, 3, 1, 1, 1, 1),
            (50, 8, 6, 5, 6, 12, 12, 1),
            (29, 4, 3, 7, 3, 9, 9, 1),
            (40, 3, 5, 4, 2, 0, 3, 2),
            (9000, 2, 3, 3, 1, 1, 1, 1),
        ] {
            let g = ConvGeometry {
                kernel,
                stride,
                dilation,
                pad_left: pl,
                pad_right: pr,
            };
            let x = ramp(t_in * c_in, 1.0);
            let w = ramp(c_out * c_in * kernel, 0.5);
            let b = ramp(c_out, 0.1);
            let tap_major = tap_major_weight(&w, c_out, c_in, kernel);
            let (y, t_out) = conv1d_dilated(
                &x,
                t_in,
                c_in,
                WeightRef::F32(&tap_major),
                c_out,
                Some(&b),
                g,
            )
            .unwrap();
            assert_eq!(t_out, g.output_len(t_in).unwrap());
            close(
                &y,
                &reference_conv(&x, t_in, c_in, &w, c_out, 1, &b, g),
                1e-4,
            );
        }
    }

    #[test]
    fn depthwise_conv_matches_the_definition() {
        let (t_in, c) = (33, 6);
        let g = ConvGeometry {
            kernel: 3,
            stride: 1,
            dilation: 9,
            pad_left: 9,
            pad_right: 9,
        };
        let x = ramp(t_in * c, 1.0);
        let w = ramp(c * 3, 0.7);
        let b = ramp(c, 0.2);
        let (y, _) = depthwise_conv1d(&x, t_in, c, &w, Some(&b), g).unwrap();
        close(&y, &reference_conv(&x, t_in, c, &w, c, c, &b, g), 1e-5);
    }

    #[test]
    fn transposed_conv_matches_the_definition() {
        for &(t_in, c_in, c_out, kernel, stride, pad) in
            &[(11, 6, 4, 16, 8, 4), (7, 3, 5, 8, 4, 2), (5, 2, 2, 3, 1, 0)]
        {
            let w = ramp(c_in * c_out * kernel, 0.3);
            let x = ramp(t_in * c_in, 1.0);
            let b = ramp(c_out, 0.1);
            let g = ConvGeometry {
                kernel,
                stride,
                dilation: 1,
                pad_left: pad,
                pad_right: pad,
            };
            let packed = transposed_conv_weight(&w, c_in, c_out, kernel);
            let (y, t_out) = conv_transpose1d(&x, t_in, c_in, &packed, c_out, Some(&b), g).unwrap();
            assert_eq!(t_out, (t_in - 1) * stride + kernel - 2 * pad);
            // Scatter definition: out[t·stride + j - pad][o] += x[t][i] · w[i][o][j].
            let mut want = vec![0f32; t_out * c_out];
            for u in 0..t_out {
                want[u * c_out..(u + 1) * c_out].copy_from_slice(&b);
            }
            for t in 0..t_in {
                for j in 0..kernel {
                    let Some(u) = (t * stride + j).checked_sub(pad).filter(|&u| u < t_out) else {
                        continue;
                    };
                    for o in 0..c_out {
                        for i in 0..c_in {
                            want[u * c_out + o] +=
                                x[t * c_in + i] * w[(i * c_out + o) * kernel + j];
                        }
                    }
                }
            }
            close(&y, &want, 1e-4);
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let g = ConvGeometry {
            kernel: 5,
            stride: 1,
            dilation: 2,
            pad_left: 0,
            pad_right: 0,
        };
        let x = vec![0f32; 8];
        let w = vec![0f32; 5];
        assert!(conv1d_dilated(&x, 8, 1, WeightRef::F32(&w), 1, None, g).is_err());
        assert!(conv1d_dilated(&x, 4, 1, WeightRef::F32(&w), 1, None, g).is_err());
        assert!(depthwise_conv1d(&x, 8, 1, &w, None, g).is_err());
        let gt = ConvGeometry {
            dilation: 1,
            stride: 2,
            ..g
        };
        assert!(conv_transpose1d(&x, 8, 1, &w[..4], 1, None, gt).is_err());
        assert!(conv_transpose1d(&[], 0, 1, &w, 1, None, gt).is_err());
    }
}
