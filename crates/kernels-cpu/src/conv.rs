//! 1-D convolutions over time-major activations `[time, channels]` (the layout of the dense ops),
//! for convolutional speech models (VITS / HiFi-GAN): dilated and padded convolution as
//! im2col + the register-tiled product, depthwise (one filter per channel) convolution, and
//! transposed (upsampling) convolution as one product followed by overlap-add. Weights are kept
//! in PyTorch's layouts (`[c_out, c_in, kernel]` for a convolution, `[c_in, c_out, kernel]` for a
//! transposed one) except where a function says otherwise. Shapes are checked; mismatches are
//! [`Error::ShapeMismatch`].

use std::ops::Range;

use rayon::prelude::*;
use synaptix_core::{Error, Result};

use crate::gemm::{gemm_packed_into, Epilogue, PackedWeight, WeightRef};

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
/// time-major input rows, the layout the products multiply by.
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

/// A dense convolution's weight, tap-major and packed once for the register-tiled products.
#[derive(Debug, Clone)]
pub struct ConvWeight {
    packed: PackedWeight,
    c_in: usize,
    c_out: usize,
    kernel: usize,
}

impl ConvWeight {
    /// From PyTorch's layout `[c_out, c_in, kernel]`.
    pub fn new(w: &[f32], c_out: usize, c_in: usize, kernel: usize) -> Result<ConvWeight> {
        if w.len() != c_out * c_in * kernel || kernel == 0 {
            return Err(mismatch(
                "conv1d weight",
                format!("{} values, expected {c_out}×{c_in}×{kernel}", w.len()),
            ));
        }
        let tap_major = tap_major_weight(w, c_out, c_in, kernel);
        Ok(ConvWeight::from_tap_major(
            WeightRef::F32(&tap_major),
            c_out,
            c_in,
            kernel,
        ))
    }

    fn from_tap_major(w: WeightRef, c_out: usize, c_in: usize, kernel: usize) -> ConvWeight {
        ConvWeight {
            packed: PackedWeight::new(w, c_out, c_in * kernel),
            c_in,
            c_out,
            kernel,
        }
    }

    pub fn in_channels(&self) -> usize {
        self.c_in
    }

    pub fn out_channels(&self) -> usize {
        self.c_out
    }

    pub fn kernel(&self) -> usize {
        self.kernel
    }
}

/// An element-wise function applied to a convolution's input as it is read (fused into the copy
/// the convolution makes anyway).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InputActivation {
    Identity,
    Relu,
    /// `x` for `x ≥ 0`, `slope·x` below.
    LeakyRelu(f32),
}

impl InputActivation {
    #[inline]
    fn apply(self, v: f32) -> f32 {
        match self {
            InputActivation::Identity => v,
            InputActivation::Relu => v.max(0.0),
            InputActivation::LeakyRelu(slope) => {
                if v < 0.0 {
                    v * slope
                } else {
                    v
                }
            }
        }
    }

    fn copy(self, dst: &mut [f32], src: &[f32]) {
        match self {
            InputActivation::Identity => dst.copy_from_slice(src),
            _ => dst
                .iter_mut()
                .zip(src)
                .for_each(|(d, &s)| *d = self.apply(s)),
        }
    }
}

/// Convolution `x: [t_in, c_in]` with a tap-major weight `[c_out, kernel, c_in]` (see
/// [`tap_major_weight`]) (+ bias) → `([t_out, c_out], t_out)`.
pub fn conv1d_dilated(
    x: &[f32],
    t_in: usize,
    c_in: usize,
    w: WeightRef,
    c_out: usize,
    bias: Option<&[f32]>,
    geometry: ConvGeometry,
) -> Result<(Vec<f32>, usize)> {
    let kernel = geometry.kernel;
    if kernel == 0 || w.len() != c_out * c_in * kernel {
        return Err(mismatch(
            "conv1d",
            format!(
                "weight has {} values, expected {c_out}×{kernel}×{c_in}",
                w.len()
            ),
        ));
    }
    let weight = ConvWeight::from_tap_major(w, c_out, c_in, kernel);
    let t_out = output_len_checked(t_in, geometry)?;
    let mut y = vec![0f32; t_out * c_out];
    conv1d_into(
        x,
        t_in,
        &weight,
        bias,
        geometry,
        InputActivation::Identity,
        &mut y,
        false,
    )?;
    Ok((y, t_out))
}

fn output_len_checked(t_in: usize, geometry: ConvGeometry) -> Result<usize> {
    geometry.output_len(t_in).ok_or_else(|| {
        mismatch(
            "conv1d",
            format!("{t_in} input steps are too few for {geometry:?}"),
        )
    })
}

/// The rows each product reads, activation applied: with stride 1, the zero-padded input split
/// into `dilation` phases (rows `r, r + d, r + 2d, ...`) with how many outputs each phase makes
/// (output `t` reads padded rows `t, t + d, ..., t + (kernel - 1)·d`: in its phase `t mod d`,
/// `kernel` consecutive rows from `t div d`, i.e. `kernel·c_in` consecutive values); other
/// strides, one unrolled window per output (im2col), as one phase.
fn product_inputs(
    x: &[f32],
    t_in: usize,
    c_in: usize,
    geometry: ConvGeometry,
    t_out: usize,
    act: InputActivation,
    buf: &mut Vec<f32>,
) -> Vec<(Range<usize>, usize)> {
    let ConvGeometry {
        kernel,
        stride,
        dilation,
        pad_left,
        pad_right,
    } = geometry;
    buf.clear();
    if stride != 1 {
        let cols = c_in * kernel;
        buf.resize(t_out * cols, 0f32);
        buf.par_chunks_mut(cols).enumerate().for_each(|(t, row)| {
            for (j, tap) in row.chunks_exact_mut(c_in).enumerate() {
                if let Some(s) = geometry.input_step(t, j, t_in) {
                    act.copy(tap, &x[s * c_in..(s + 1) * c_in]);
                }
            }
        });
        return vec![(0..buf.len(), t_out)];
    }
    let padded_len = t_in + pad_left + pad_right;
    let phases: Vec<(Range<usize>, usize)> = (0..dilation)
        .scan(0, |start, phase| {
            let rows = (padded_len - phase).div_ceil(dilation);
            let outs = t_out.saturating_sub(phase).div_ceil(dilation);
            let range = *start..*start + rows * c_in;
            *start = range.end;
            Some((range, outs))
        })
        .collect();
    buf.resize(phases.last().map_or(0, |(r, _)| r.end), 0f32);
    // One parallel pass over every phase's rows (a pass per phase would wake the pool `d`
    // times): buffer row `g` is row `g - first` of the phase whose rows start at `first`.
    let firsts: Vec<usize> = phases.iter().map(|(r, _)| r.start / c_in).collect();
    buf.par_chunks_mut(c_in * ROWS_PER_TASK)
        .enumerate()
        .for_each(|(task, chunk)| {
            for (r, row) in chunk.chunks_exact_mut(c_in).enumerate() {
                let g = task * ROWS_PER_TASK + r;
                let phase = firsts.partition_point(|&f| f <= g) - 1;
                let p = phase + (g - firsts[phase]) * dilation;
                if let Some(src) = p.checked_sub(pad_left).filter(|&q| q < t_in) {
                    act.copy(row, &x[src * c_in..(src + 1) * c_in]);
                }
            }
        });
    phases
}

thread_local! {
    /// The phase copies of the last convolution run on this thread, kept for the next: a voice
    /// runs hundreds of convolutions per sentence, and fresh buffers each time cost page faults.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `product_inputs` into this thread's scratch buffer, then `products_into`.
#[allow(clippy::too_many_arguments)]
fn convolve(
    x: &[f32],
    t_in: usize,
    w: &ConvWeight,
    bias: Option<&[f32]>,
    geometry: ConvGeometry,
    t_out: usize,
    act: InputActivation,
    out: &mut [f32],
    accumulate: bool,
) {
    let mut buf = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let phases = product_inputs(x, t_in, w.c_in, geometry, t_out, act, &mut buf);
    products_into(&buf, &phases, w, bias, geometry, out, accumulate);
    SCRATCH.with(|s| *s.borrow_mut() = buf);
}

/// Runs the products of [`product_inputs`] and stores (or with `accumulate` adds) each output
/// row plus the bias into `out: [t_out, c_out]`.
fn products_into(
    buf: &[f32],
    inputs: &[(Range<usize>, usize)],
    w: &ConvWeight,
    bias: Option<&[f32]>,
    geometry: ConvGeometry,
    out: &mut [f32],
    accumulate: bool,
) {
    let (c_in, c_out) = (w.c_in, w.c_out);
    // Phases interleave their outputs every `step` rows (the dilation; 1 for im2col).
    let step = if geometry.stride == 1 {
        geometry.dilation
    } else {
        1
    };
    let lda = if geometry.stride == 1 {
        c_in
    } else {
        c_in * w.kernel
    };
    for (phase, (range, outs)) in inputs.iter().enumerate() {
        if *outs == 0 {
            continue;
        }
        let a = &buf[range.clone()];
        // Phase outputs are rows phase, phase + step, ...: `step` rows apart in `out`.
        gemm_packed_into(
            a,
            lda,
            *outs,
            &w.packed,
            &mut out[phase * c_out..],
            step * c_out,
            Epilogue { accumulate, bias },
        );
    }
}

fn check_conv(
    x_len: usize,
    t_in: usize,
    w: &ConvWeight,
    bias: Option<&[f32]>,
    geometry: ConvGeometry,
) -> Result<usize> {
    if geometry.kernel != w.kernel {
        return Err(mismatch(
            "conv1d",
            format!("kernel {} for a weight of {}", geometry.kernel, w.kernel),
        ));
    }
    if x_len != t_in * w.c_in {
        return Err(mismatch(
            "conv1d",
            format!("x has {x_len} values, expected {t_in}×{}", w.c_in),
        ));
    }
    if bias.is_some_and(|b| b.len() != w.c_out) {
        return Err(mismatch(
            "conv1d",
            format!("bias is not {} values", w.c_out),
        ));
    }
    output_len_checked(t_in, geometry)
}

/// `out = conv(act(x)) + bias`, or with `accumulate` `out += conv(act(x)) + bias`, for `x:
/// [t_in, c_in]` and `out: [t_out, c_out]`; returns `t_out`.
///
/// With stride 1 nothing is unrolled: the products read their rows straight from the padded
/// input, one phase per dilation step (see `product_inputs`). Other strides unroll each window
/// (im2col).
#[allow(clippy::too_many_arguments)]
pub fn conv1d_into(
    x: &[f32],
    t_in: usize,
    w: &ConvWeight,
    bias: Option<&[f32]>,
    geometry: ConvGeometry,
    act: InputActivation,
    out: &mut [f32],
    accumulate: bool,
) -> Result<usize> {
    let t_out = check_conv(x.len(), t_in, w, bias, geometry)?;
    if out.len() != t_out * w.c_out {
        return Err(mismatch(
            "conv1d",
            format!("out has {} values, expected {t_out}×{}", out.len(), w.c_out),
        ));
    }
    convolve(x, t_in, w, bias, geometry, t_out, act, out, accumulate);
    Ok(t_out)
}

/// The residual step `x += conv(act(x)) + bias` in place, for a length-keeping convolution
/// (`c_out == c_in`, `t_out == t`).
pub fn conv1d_residual(
    x: &mut [f32],
    t: usize,
    w: &ConvWeight,
    bias: Option<&[f32]>,
    geometry: ConvGeometry,
    act: InputActivation,
) -> Result<()> {
    let t_out = check_conv(x.len(), t, w, bias, geometry)?;
    if t_out != t || w.c_out != w.c_in {
        return Err(mismatch(
            "conv1d residual",
            format!(
                "{t} steps of {} channels in, {t_out} of {} out",
                w.c_in, w.c_out
            ),
        ));
    }
    // The products read their own copies of the input, so the output may overwrite it.
    let mut buf = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let phases = product_inputs(x, t, w.c_in, geometry, t_out, act, &mut buf);
    products_into(&buf, &phases, w, bias, geometry, x, true);
    SCRATCH.with(|s| *s.borrow_mut() = buf);
    Ok(())
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
/// layout), packed once for [`conv_transpose1d`] with a given stride.
///
/// When the stride divides the kernel, the upsampling is `stride` ordinary convolutions of
/// `kernel / stride` taps over the input, one per output phase: output `u` with `u + pad_left =
/// q·stride + r` sums input steps `q - m` through taps `r + m·stride` (`m < kernel / stride`),
/// i.e. phase `r` reads `kernel / stride` consecutive rows of the input padded with
/// `kernel / stride - 1` zero rows in front, and its outputs lie `stride` rows apart. Otherwise one
/// product gives every tap's contribution and each output row sums the taps that land on it.
#[derive(Debug, Clone)]
pub struct TransposedConvWeight {
    kind: TransposedKind,
    c_in: usize,
    c_out: usize,
    kernel: usize,
    stride: usize,
}

#[derive(Debug, Clone)]
enum TransposedKind {
    /// Per output phase `r`: `[c_out, kernel / stride, c_in]`, tap `m'` holding kernel tap
    /// `r + (kernel / stride - 1 - m')·stride`.
    Phases(Vec<PackedWeight>),
    /// `[kernel, c_out, c_in]`: row `j·c_out + o` holds output channel `o`'s weights at tap `j`.
    Taps(PackedWeight),
}

impl TransposedConvWeight {
    pub fn new(w: &[f32], c_in: usize, c_out: usize, kernel: usize, stride: usize) -> Result<Self> {
        if kernel == 0 || stride == 0 || w.len() != c_in * c_out * kernel {
            return Err(mismatch(
                "conv_transpose1d weight",
                format!(
                    "{} values, expected {c_in}×{c_out}×{kernel} (stride {stride})",
                    w.len()
                ),
            ));
        }
        let at = |i: usize, o: usize, j: usize| w[(i * c_out + o) * kernel + j];
        let kind = if kernel.is_multiple_of(stride) {
            let taps = kernel / stride;
            let phases = (0..stride)
                .map(|r| {
                    let mut rows = vec![0f32; c_out * taps * c_in];
                    for o in 0..c_out {
                        for m in 0..taps {
                            let j = r + (taps - 1 - m) * stride;
                            for i in 0..c_in {
                                rows[(o * taps + m) * c_in + i] = at(i, o, j);
                            }
                        }
                    }
                    PackedWeight::new(WeightRef::F32(&rows), c_out, taps * c_in)
                })
                .collect();
            TransposedKind::Phases(phases)
        } else {
            let mut rows = vec![0f32; w.len()];
            for i in 0..c_in {
                for o in 0..c_out {
                    for j in 0..kernel {
                        rows[(j * c_out + o) * c_in + i] = at(i, o, j);
                    }
                }
            }
            TransposedKind::Taps(PackedWeight::new(
                WeightRef::F32(&rows),
                kernel * c_out,
                c_in,
            ))
        };
        Ok(TransposedConvWeight {
            kind,
            c_in,
            c_out,
            kernel,
            stride,
        })
    }
}

/// Transposed convolution (upsampling by `stride`): `x: [t_in, c_in]` (+ bias) → `([t_out,
/// c_out], t_out)` with `t_out = (t_in - 1)·stride + kernel - pad_left - pad_right`: input step
/// `t`'s tap `j` lands on output step `t·stride + j - pad_left` (see [`TransposedConvWeight`]
/// for how it is computed); `act` is applied to the input as it is read.
pub fn conv_transpose1d(
    x: &[f32],
    t_in: usize,
    w: &TransposedConvWeight,
    bias: Option<&[f32]>,
    geometry: ConvGeometry,
    act: InputActivation,
) -> Result<(Vec<f32>, usize)> {
    const OP: &str = "conv_transpose1d";
    let (c_in, c_out) = (w.c_in, w.c_out);
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
        Some(t) if dilation == 1 && stride == w.stride && kernel == w.kernel && t > 0 => t,
        _ => {
            return Err(mismatch(
                OP,
                format!(
                    "{t_in} input steps do not fit {geometry:?} (dilation must be 1; the weight \
                     is for kernel {} and stride {})",
                    w.kernel, w.stride
                ),
            ))
        }
    };
    if x.len() != t_in * c_in {
        return Err(mismatch(
            OP,
            format!("x has {} values for {t_in}×{c_in}", x.len()),
        ));
    }
    if bias.is_some_and(|b| b.len() != c_out) {
        return Err(mismatch(OP, format!("bias is not {c_out} values")));
    }
    let mut y = vec![0f32; t_out * c_out];
    match &w.kind {
        TransposedKind::Phases(phases) => {
            let taps = kernel / stride;
            // Input rows behind `taps - 1` zero rows, zeros after as far as any phase reads.
            let last_q = (t_out - 1 + pad_left) / stride;
            let rows = (last_q + taps).max(taps - 1 + t_in);
            let mut padded = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
            padded.clear();
            padded.resize(rows * c_in, 0f32);
            padded[(taps - 1) * c_in..(taps - 1 + t_in) * c_in]
                .par_chunks_mut(c_in * ROWS_PER_TASK)
                .zip(x.par_chunks(c_in * ROWS_PER_TASK))
                .for_each(|(dst, src)| act.copy(dst, src));
            for (r, packed) in phases.iter().enumerate() {
                // Outputs u = q·stride + r - pad_left for q from q_first while u < t_out.
                let q_first = pad_left.saturating_sub(r).div_ceil(stride);
                let Some(q_last) = (t_out - 1 + pad_left).checked_sub(r).map(|v| v / stride) else {
                    continue;
                };
                if q_last < q_first {
                    continue;
                }
                let u_first = q_first * stride + r - pad_left;
                gemm_packed_into(
                    &padded[q_first * c_in..],
                    c_in,
                    q_last - q_first + 1,
                    packed,
                    &mut y[u_first * c_out..],
                    stride * c_out,
                    Epilogue {
                        accumulate: false,
                        bias,
                    },
                );
            }
            SCRATCH.with(|s| *s.borrow_mut() = padded);
        }
        TransposedKind::Taps(packed) => {
            // [t_in, kernel·c_out]: tap j of input step t for output channel o at [t][j·c_out + o].
            let activated: Vec<f32> = x.iter().map(|&v| act.apply(v)).collect();
            let mut taps = vec![0f32; t_in * kernel * c_out];
            gemm_packed_into(
                &activated,
                c_in,
                t_in,
                packed,
                &mut taps,
                kernel * c_out,
                Epilogue::default(),
            );
            y.par_chunks_mut(c_out * ROWS_PER_TASK)
                .enumerate()
                .for_each(|(task, rows)| {
                    for (r, row) in rows.chunks_exact_mut(c_out).enumerate() {
                        if let Some(b) = bias {
                            row.copy_from_slice(b);
                        }
                        // Input steps t with u + pad_left = t·stride + j, j in [0, kernel).
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
        }
    }
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

    /// Input activation, accumulation and the in-place residual step against the plain
    /// convolution of the activated input.
    #[test]
    fn fused_forms_match_the_plain_convolution() {
        for &(t, c, kernel, dilation) in &[(40, 6, 3, 1), (57, 5, 5, 6), (33, 4, 7, 3)] {
            let g = ConvGeometry {
                kernel,
                stride: 1,
                dilation,
                pad_left: dilation * (kernel - 1) / 2,
                pad_right: dilation * (kernel - 1) / 2,
            };
            let x = ramp(t * c, 1.0);
            let w = ramp(c * c * kernel, 0.4);
            let b = ramp(c, 0.1);
            let weight = ConvWeight::new(&w, c, c, kernel).unwrap();
            for act in [
                InputActivation::Identity,
                InputActivation::Relu,
                InputActivation::LeakyRelu(0.1),
            ] {
                let activated: Vec<f32> = x.iter().map(|&v| act.apply(v)).collect();
                let plain = reference_conv(&activated, t, c, &w, c, 1, &b, g);
                let mut out = vec![0f32; t * c];
                conv1d_into(&x, t, &weight, Some(&b), g, act, &mut out, false).unwrap();
                close(&out, &plain, 1e-4);
                let mut acc = x.clone();
                conv1d_into(&x, t, &weight, Some(&b), g, act, &mut acc, true).unwrap();
                let want: Vec<f32> = x.iter().zip(&plain).map(|(a, b)| a + b).collect();
                close(&acc, &want, 1e-4);
                let mut inplace = x.clone();
                conv1d_residual(&mut inplace, t, &weight, Some(&b), g, act).unwrap();
                close(&inplace, &want, 1e-4);
            }
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
        // Strides that divide the kernel (per-phase products), and 5 / 2 (taps then overlap-add).
        for &(t_in, c_in, c_out, kernel, stride, pad) in &[
            (11, 6, 4, 16, 8, 4),
            (7, 3, 5, 8, 4, 2),
            (5, 2, 2, 3, 1, 0),
            (9, 3, 4, 5, 2, 1),
            (1, 2, 3, 16, 8, 4),
            (6, 2, 3, 6, 3, 0),
        ] {
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
            let packed = TransposedConvWeight::new(&w, c_in, c_out, kernel, stride).unwrap();
            let (y, t_out) =
                conv_transpose1d(&x, t_in, &packed, Some(&b), g, InputActivation::Identity)
                    .unwrap();
            // The activation is applied to the input as it is read.
            let leaky = InputActivation::LeakyRelu(0.1);
            let activated: Vec<f32> = x.iter().map(|&v| leaky.apply(v)).collect();
            let (fused, _) = conv_transpose1d(&x, t_in, &packed, Some(&b), g, leaky).unwrap();
            let (plain, _) = conv_transpose1d(
                &activated,
                t_in,
                &packed,
                Some(&b),
                g,
                InputActivation::Identity,
            )
            .unwrap();
            assert_eq!(fused, plain);
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
        assert!(TransposedConvWeight::new(&w[..4], 1, 1, 5, 2).is_err());
        let tw = TransposedConvWeight::new(&w, 1, 1, 5, 2).unwrap();
        let id = InputActivation::Identity;
        assert!(conv_transpose1d(&x, 8, &tw, None, ConvGeometry { stride: 3, ..gt }, id).is_err());
        assert!(conv_transpose1d(&x[..7], 8, &tw, None, gt, id).is_err());
        assert!(conv_transpose1d(&[], 0, &tw, None, gt, id).is_err());
        assert!(conv_transpose1d(&x, 8, &tw, Some(&[1.0, 2.0]), gt, id).is_err());
    }
}
