//! VITS (Kim et al., 2021) as Piper exports it: phoneme ids in, 22,050 Hz audio out, loaded from
//! a Piper voice (`*.onnx` with its `*.onnx.json`). The weights are the ONNX initializers and
//! every convolution's geometry comes from its graph node; the arithmetic mirrors Piper's
//! `SynthesizerTrn.infer` (its VITS fork) in float32, checked against onnxruntime running the
//! same file (`tests/fixtures/piper/`).
//!
//! The path, for `n` phoneme ids and `f` output frames (activations time-major `[time, ch]`):
//! 1. text encoder: embedding · √hidden, post-norm transformer layers with relative-position
//!    self-attention (keys and values get a learned embedding per offset within ±window) and a
//!    convolutional FFN, then a projection to the prior's mean and log-scale `[n, 2·inter]`;
//! 2. stochastic duration predictor, run backwards: noise `[n, 2]` · noise_w through
//!    flips, rational-quadratic spline couplings conditioned on the encoder output and an
//!    element-wise affine flow, giving log-durations; frames per phoneme =
//!    `ceil(exp(logw) · length_scale)`;
//! 3. each phoneme's prior repeated over its frames, sampled with noise · noise_scale: `[f, inter]`;
//! 4. the residual coupling flow backwards (mean-only couplings with WaveNet-style stacks);
//! 5. the HiFi-GAN generator: transposed convolutions upsampling 256× with multi-receptive-field
//!    residual blocks, then `tanh`: `[f · 256]` samples in [-1, 1].
//!
//! Batch size 1 and no padding, so every mask of the reference is all ones and left out.
//! Single-speaker voices only (a `sid` input is refused).

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde_json::Value;
use synaptix_bundle::onnx::OnnxFile;
use synaptix_kernels_cpu::dense::{
    gelu_erf_inplace, head_of, layer_norm_inplace, linear_f32, softmax_row, tanh_inplace,
};
use synaptix_nn::conv::{Conv1d, InputActivation};

use crate::{ModelError, Result};

/// LayerNorm epsilon of VITS' channel LayerNorm.
const LN_EPS: f32 = 1e-5;
/// HiFi-GAN's LeakyReLU slope inside the generator; its last activation uses PyTorch's default.
const LRELU_SLOPE: f32 = 0.1;
const LRELU_SLOPE_FINAL: f32 = 0.01;
/// The duration flows' spline: interval [-5, 5] (identity outside), bins at least 1e-3 wide and
/// high, derivatives at least 1e-3.
const TAIL_BOUND: f32 = 5.0;
const MIN_BIN: f32 = 1e-3;
const MIN_DERIVATIVE: f32 = 1e-3;

fn bad(path: &Path, problem: impl Into<String>) -> ModelError {
    ModelError::BadHyperParameters {
        path: path.display().to_string(),
        problem: problem.into(),
    }
}

/// The sampling knobs of Piper's `scales` input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scales {
    /// Spread of the latent around the prior mean (variation of timbre and prosody).
    pub noise_scale: f32,
    /// Multiplies every duration: above 1 speaks slower.
    pub length_scale: f32,
    /// Spread of the duration noise (variation of rhythm).
    pub noise_w: f32,
}

/// Standard normal values from a seed: SplitMix64, 53-bit uniforms in (0, 1), Box-Muller in f64
/// (both values of each pair used), cast to f32. `scripts/reference/make_piper_goldens.py`
/// draws the same sequence to feed onnxruntime.
#[derive(Debug, Clone)]
pub struct GaussianNoise {
    state: u64,
    spare: Option<f64>,
}

impl GaussianNoise {
    pub fn new(seed: u64) -> GaussianNoise {
        GaussianNoise {
            state: seed,
            spare: None,
        }
    }

    fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
    }

    pub fn next_f32(&mut self) -> f32 {
        if let Some(v) = self.spare.take() {
            return v as f32;
        }
        let (u1, u2) = (self.uniform(), self.uniform());
        let r = (-2.0 * u1.ln()).sqrt();
        let angle = 2.0 * std::f64::consts::PI * u2;
        self.spare = Some(r * angle.sin());
        (r * angle.cos()) as f32
    }

    /// `channels × steps` values drawn channel by channel (PyTorch's `[channels, steps]` order),
    /// returned time-major `[steps, channels]`.
    fn time_major(&mut self, channels: usize, steps: usize) -> Vec<f32> {
        let mut out = vec![0f32; channels * steps];
        for c in 0..channels {
            for t in 0..steps {
                out[t * channels + c] = self.next_f32();
            }
        }
        out
    }
}

/// What one synthesis produced.
#[derive(Debug, Clone)]
pub struct Synthesis {
    /// Samples in [-1, 1] at the voice's rate (the graph's raw output, before any volume change).
    pub audio: Vec<f32>,
    /// Frames per phoneme id (each frame is [`VitsVoice::hop_length`] samples).
    pub durations: Vec<usize>,
}

struct LayerNormParams {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

impl LayerNormParams {
    fn load(file: &OnnxFile, prefix: &str) -> Result<LayerNormParams> {
        Ok(LayerNormParams {
            gamma: file.f32_values(&format!("{prefix}.gamma"))?,
            beta: file.f32_values(&format!("{prefix}.beta"))?,
        })
    }

    fn apply(&self, x: &mut [f32]) -> Result<()> {
        Ok(layer_norm_inplace(x, &self.gamma, &self.beta, LN_EPS)?)
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, &b)| *a += b);
}

/// `x += y`, long slices split over the rayon pool.
fn par_add_into(x: &mut [f32], y: &[f32]) {
    x.par_chunks_mut(1 << 14)
        .zip(y.par_chunks(1 << 14))
        .for_each(|(a, b)| add_into(a, b));
}

/// Multi-head self-attention with relative positions (heads share the offset embeddings).
struct RelativeAttention {
    q: Conv1d,
    k: Conv1d,
    v: Conv1d,
    o: Conv1d,
    /// `[2·window + 1, head_dim]`: offset `j - i` at row `j - i + window`.
    emb_k: Vec<f32>,
    emb_v: Vec<f32>,
    window: usize,
    heads: usize,
    head_dim: usize,
}

impl RelativeAttention {
    fn load(file: &OnnxFile, prefix: &str, hidden: usize) -> Result<RelativeAttention> {
        let conv = |name: &str| Conv1d::from_onnx_weight(file, &format!("{prefix}.{name}.weight"));
        let emb_name = format!("{prefix}.emb_rel_k");
        let dims = file
            .tensor(&emb_name)
            .map(|t| t.dims.clone())
            .unwrap_or_default();
        let (offsets, head_dim) = match dims[..] {
            [1, o, d] if o % 2 == 1 && d > 0 && hidden.is_multiple_of(d as usize) => {
                (o as usize, d as usize)
            }
            _ => return Err(bad(file.path(), format!("{emb_name} has shape {dims:?}"))),
        };
        Ok(RelativeAttention {
            q: conv("conv_q")?,
            k: conv("conv_k")?,
            v: conv("conv_v")?,
            o: conv("conv_o")?,
            emb_k: file.f32_values(&emb_name)?,
            emb_v: file.f32_values(&format!("{prefix}.emb_rel_v"))?,
            window: offsets / 2,
            heads: hidden / head_dim,
            head_dim,
        })
    }

    /// `x += attention(x)`. Per head: scores `(q/√d)·kᵀ` plus, within ±window, `(q/√d)·emb_k`
    /// of the offset; softmax; `p·v` plus the band's `p·emb_v`.
    fn add_to(&self, x: &mut [f32], t: usize) -> Result<()> {
        let (q, k, v) = (
            self.q.forward_same(x, t)?,
            self.k.forward_same(x, t)?,
            self.v.forward_same(x, t)?,
        );
        let (d, hidden, w) = (self.head_dim, self.heads * self.head_dim, self.window);
        let offsets = 2 * w + 1;
        let scale = 1.0 / (d as f32).sqrt();
        // emb_v transposed to [d, offsets]: the weight of the band product.
        let mut emb_vt = vec![0f32; d * offsets];
        for r in 0..offsets {
            for c in 0..d {
                emb_vt[c * offsets + r] = self.emb_v[r * d + c];
            }
        }
        let mut out = vec![0f32; t * hidden];
        for h in 0..self.heads {
            let mut qh = head_of(&q, t, hidden, h * d, d);
            qh.iter_mut().for_each(|v| *v *= scale);
            let kh = head_of(&k, t, hidden, h * d, d);
            let mut scores = linear_f32(&qh, t, &kh, t, d, None)?;
            let near = linear_f32(&qh, t, &self.emb_k, offsets, d, None)?;
            // Offset r of query i is key i + r - window.
            let key = |i: usize, r: usize| (i + r).checked_sub(w).filter(|&j| j < t);
            for (i, row) in scores.chunks_exact_mut(t).enumerate() {
                for r in 0..offsets {
                    if let Some(j) = key(i, r) {
                        row[j] += near[i * offsets + r];
                    }
                }
                softmax_row(row);
            }
            let mut band = vec![0f32; t * offsets];
            for i in 0..t {
                for r in 0..offsets {
                    if let Some(j) = key(i, r) {
                        band[i * offsets + r] = scores[i * t + j];
                    }
                }
            }
            let mut vt = vec![0f32; d * t];
            for (j, row) in v.chunks_exact(hidden).enumerate() {
                for c in 0..d {
                    vt[c * t + j] = row[h * d + c];
                }
            }
            let oh = linear_f32(&scores, t, &vt, d, t, None)?;
            let ob = linear_f32(&band, t, &emb_vt, d, offsets, None)?;
            for i in 0..t {
                let dst = &mut out[i * hidden + h * d..i * hidden + (h + 1) * d];
                let (a, b) = (&oh[i * d..(i + 1) * d], &ob[i * d..(i + 1) * d]);
                for ((o, &a), &b) in dst.iter_mut().zip(a).zip(b) {
                    *o = a + b;
                }
            }
        }
        Ok(self.o.add_forward(&out, t, InputActivation::Identity, x)?)
    }
}

struct EncoderLayer {
    attention: RelativeAttention,
    norm1: LayerNormParams,
    ffn_in: Conv1d,
    ffn_out: Conv1d,
    norm2: LayerNormParams,
}

/// Text encoder: ids → (hidden `[n, hidden]`, prior mean `[n, inter]`, prior log-scale).
struct TextEncoder {
    /// `[vocab, hidden]`.
    embedding: Vec<f32>,
    vocab: usize,
    hidden: usize,
    layers: Vec<EncoderLayer>,
    proj: Conv1d,
}

impl TextEncoder {
    fn load(file: &OnnxFile) -> Result<TextEncoder> {
        // The embedding table is whatever the graph gathers the `input` ids from (Piper's export
        // names it oddly, e.g. `sid`).
        let table = file
            .graph
            .nodes
            .iter()
            .find(|n| n.op_type == "Gather" && n.inputs.get(1).is_some_and(|i| i == "input"))
            .and_then(|n| file.initializer(&n.inputs[0]))
            .ok_or_else(|| bad(file.path(), "no embedding table is gathered by `input`"))?;
        let (vocab, hidden) = match table.dims[..] {
            [v, h] if v > 0 && h > 0 => (v as usize, h as usize),
            _ => return Err(bad(file.path(), "the embedding table is not 2-D")),
        };
        let embedding = file.tensor_f32(table)?;
        let mut layers = Vec::new();
        while file
            .initializer(&format!(
                "enc_p.encoder.attn_layers.{}.conv_q.weight",
                layers.len()
            ))
            .is_some()
        {
            let i = layers.len();
            let p = "enc_p.encoder";
            let mut ffn_in =
                Conv1d::from_onnx_weight(file, &format!("{p}.ffn_layers.{i}.conv_1.weight"))?;
            let mut ffn_out =
                Conv1d::from_onnx_weight(file, &format!("{p}.ffn_layers.{i}.conv_2.weight"))?;
            // The export pads with a separate node: the reference's "same" padding.
            ffn_in.set_same_padding();
            ffn_out.set_same_padding();
            layers.push(EncoderLayer {
                attention: RelativeAttention::load(file, &format!("{p}.attn_layers.{i}"), hidden)?,
                norm1: LayerNormParams::load(file, &format!("{p}.norm_layers_1.{i}"))?,
                ffn_in,
                ffn_out,
                norm2: LayerNormParams::load(file, &format!("{p}.norm_layers_2.{i}"))?,
            });
        }
        if layers.is_empty() {
            return Err(bad(file.path(), "no text encoder layers (enc_p.encoder.*)"));
        }
        Ok(TextEncoder {
            embedding,
            vocab,
            hidden,
            layers,
            proj: Conv1d::from_onnx_weight(file, "enc_p.proj.weight")?,
        })
    }

    /// Returns `(hidden [n, hidden], stats [n, 2·inter])`.
    fn forward(&self, ids: &[i64]) -> Result<(Vec<f32>, Vec<f32>)> {
        let (n, h) = (ids.len(), self.hidden);
        let scale = (h as f32).sqrt();
        let mut x = Vec::with_capacity(n * h);
        for &id in ids {
            let row = usize::try_from(id).ok().filter(|&r| r < self.vocab).ok_or(
                ModelError::BadInput(format!(
                    "phoneme id {id} is outside the voice's {} ids",
                    self.vocab
                )),
            )?;
            x.extend(
                self.embedding[row * h..(row + 1) * h]
                    .iter()
                    .map(|&v| v * scale),
            );
        }
        for layer in &self.layers {
            layer.attention.add_to(&mut x, n)?;
            layer.norm1.apply(&mut x)?;
            let y = layer.ffn_in.forward_same(&x, n)?;
            layer
                .ffn_out
                .add_forward(&y, n, InputActivation::Relu, &mut x)?;
            layer.norm2.apply(&mut x)?;
        }
        let stats = self.proj.forward_same(&x, n)?;
        Ok((x, stats))
    }
}

/// Dilated depth-separable convolutions with LayerNorm and GELU, residual (`DDSConv`).
struct DdsConv {
    layers: Vec<(Conv1d, LayerNormParams, Conv1d, LayerNormParams)>,
}

impl DdsConv {
    fn load(file: &OnnxFile, prefix: &str) -> Result<DdsConv> {
        let mut layers = Vec::new();
        while file
            .initializer(&format!("{prefix}.convs_sep.{}.weight", layers.len()))
            .is_some()
        {
            let i = layers.len();
            layers.push((
                Conv1d::from_onnx_weight(file, &format!("{prefix}.convs_sep.{i}.weight"))?,
                LayerNormParams::load(file, &format!("{prefix}.norms_1.{i}"))?,
                Conv1d::from_onnx_weight(file, &format!("{prefix}.convs_1x1.{i}.weight"))?,
                LayerNormParams::load(file, &format!("{prefix}.norms_2.{i}"))?,
            ));
        }
        Ok(DdsConv { layers })
    }

    fn forward(&self, x: &mut [f32], t: usize) -> Result<()> {
        for (sep, norm1, pointwise, norm2) in &self.layers {
            let mut y = sep.forward_same(x, t)?;
            norm1.apply(&mut y)?;
            gelu_erf_inplace(&mut y);
            let mut y = pointwise.forward_same(&y, t)?;
            norm2.apply(&mut y)?;
            gelu_erf_inplace(&mut y);
            add_into(x, &y);
        }
        Ok(())
    }
}

/// A spline coupling of the duration predictor (`ConvFlow`, one channel transformed).
struct ConvFlow {
    pre: Conv1d,
    convs: DdsConv,
    proj: Conv1d,
    bins: usize,
    filter_channels: usize,
}

impl ConvFlow {
    fn load(file: &OnnxFile, prefix: &str) -> Result<ConvFlow> {
        let pre = Conv1d::from_onnx_weight(file, &format!("{prefix}.pre.weight"))?;
        let proj = Conv1d::from_onnx_weight(file, &format!("{prefix}.proj.weight"))?;
        // proj gives 3·bins - 1 values per step: widths, heights and the inner derivatives.
        let outs = proj.out_channels();
        if pre.in_channels() != 1 || outs < 5 || (outs + 1) % 3 != 0 {
            return Err(bad(file.path(), format!("{prefix}: unexpected shapes")));
        }
        Ok(ConvFlow {
            filter_channels: pre.out_channels(),
            pre,
            convs: DdsConv::load(file, &format!("{prefix}.convs"))?,
            proj,
            bins: (outs + 1) / 3,
        })
    }

    /// Backwards on `z: [t, 2]` conditioned on `cond: [t, filter_channels]`.
    fn reverse(&self, z: &mut [f32], t: usize, cond: &[f32]) -> Result<()> {
        let x0: Vec<f32> = z.iter().step_by(2).copied().collect();
        let mut h = self.pre.forward_same(&x0, t)?;
        add_into(&mut h, cond);
        self.convs.forward(&mut h, t)?;
        let params = self.proj.forward_same(&h, t)?;
        let per_step = 3 * self.bins - 1;
        let norm = (self.filter_channels as f32).sqrt();
        for (step, p) in params.chunks_exact(per_step).enumerate() {
            let widths: Vec<f32> = p[..self.bins].iter().map(|&v| v / norm).collect();
            let heights: Vec<f32> = p[self.bins..2 * self.bins]
                .iter()
                .map(|&v| v / norm)
                .collect();
            let x1 = &mut z[step * 2 + 1];
            *x1 = spline_inverse(*x1, &widths, &heights, &p[2 * self.bins..]);
        }
        Ok(())
    }
}

fn softmax(v: &[f32]) -> Vec<f32> {
    let max = v.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let e: Vec<f32> = v.iter().map(|&x| (x - max).exp()).collect();
    let sum: f32 = e.iter().sum();
    e.into_iter().map(|x| x / sum).collect()
}

/// Knot positions over [-TAIL_BOUND, TAIL_BOUND] from unnormalised bin sizes: `bins + 1` values.
fn knots(unnormalised: &[f32]) -> Vec<f32> {
    let bins = unnormalised.len();
    let sizes = softmax(unnormalised);
    let mut knots = Vec::with_capacity(bins + 1);
    knots.push(0f32);
    let mut acc = 0f32;
    for s in sizes {
        acc += MIN_BIN + (1.0 - MIN_BIN * bins as f32) * s;
        knots.push(acc);
    }
    let span = 2.0 * TAIL_BOUND;
    let mut knots: Vec<f32> = knots.into_iter().map(|k| span * k - TAIL_BOUND).collect();
    knots[0] = -TAIL_BOUND;
    knots[bins] = TAIL_BOUND;
    knots
}

/// Inverse of the monotonic rational-quadratic spline with linear tails (Durkan et al., 2019),
/// as VITS' `piecewise_rational_quadratic_transform(..., inverse=True, tails="linear")`: the
/// identity outside [-5, 5]; inside, the bin is found among the output knots and the quadratic
/// for the input solved in its stable form.
fn spline_inverse(y: f32, widths: &[f32], heights: &[f32], inner_derivatives: &[f32]) -> f32 {
    if !(-TAIL_BOUND..=TAIL_BOUND).contains(&y) {
        return y;
    }
    let bins = widths.len();
    let xs = knots(widths);
    let ys = knots(heights);
    // The outer derivatives are fixed so the spline meets the identity tails with slope 1.
    let edge = ((1.0 - MIN_DERIVATIVE).exp() - 1.0).ln();
    let softplus = |v: f32| if v > 20.0 { v } else { v.exp().ln_1p() };
    let derivative = |k: usize| {
        let raw = if k == 0 || k == bins {
            edge
        } else {
            inner_derivatives[k - 1]
        };
        MIN_DERIVATIVE + softplus(raw)
    };
    // The last knot is nudged up so y == TAIL_BOUND falls in the last bin.
    let bin = (0..bins)
        .filter(|&k| {
            let knot = if k == bins { ys[k] + 1e-6 } else { ys[k] };
            y >= knot
        })
        .count()
        .saturating_sub(1)
        .min(bins - 1);
    let (x0, w) = (xs[bin], xs[bin + 1] - xs[bin]);
    let (y0, h) = (ys[bin], ys[bin + 1] - ys[bin]);
    let delta = h / w;
    let (d0, d1) = (derivative(bin), derivative(bin + 1));
    let dy = y - y0;
    let a = dy * (d0 + d1 - 2.0 * delta) + h * (delta - d0);
    let b = h * d0 - dy * (d0 + d1 - 2.0 * delta);
    let c = -delta * dy;
    let discriminant = b * b - 4.0 * a * c;
    let root = (2.0 * c) / (-b - discriminant.sqrt());
    root * w + x0
}

/// `exp(-logs)` of the duration predictor's affine flow: `dp.flows.0.logs` where the file keeps
/// it, else the constant the exporter folded it into (the other factor of the `Mul` that takes
/// `x - dp.flows.0.m`).
fn affine_inverse_scale(file: &OnnxFile) -> Result<Vec<f32>> {
    if file.initializer("dp.flows.0.logs").is_some() {
        let logs = file.f32_values("dp.flows.0.logs")?;
        return Ok(logs.iter().map(|&l| (-l).exp()).collect());
    }
    let nodes = &file.graph.nodes;
    let centred = nodes
        .iter()
        .find(|n| n.op_type == "Sub" && n.inputs.get(1).is_some_and(|i| i == "dp.flows.0.m"))
        .and_then(|n| n.outputs.first());
    let scale = centred.and_then(|out| {
        nodes
            .iter()
            .filter(|n| n.op_type == "Mul" && n.inputs.len() == 2)
            .find_map(|n| match (&n.inputs[0], &n.inputs[1]) {
                (a, b) if a == out => Some(b.clone()),
                (a, b) if b == out => Some(a.clone()),
                _ => None,
            })
    });
    match scale {
        Some(name) if file.tensor(&name).is_some() => Ok(file.f32_values(&name)?),
        _ => Err(bad(
            file.path(),
            "the duration predictor's affine flow scale (dp.flows.0.logs) is missing",
        )),
    }
}

/// The stochastic duration predictor, run backwards from noise.
struct DurationPredictor {
    pre: Conv1d,
    convs: DdsConv,
    proj: Conv1d,
    /// The element-wise affine flow's mean and inverse scale `exp(-logs)` (2 channels).
    mean: Vec<f32>,
    inv_scale: Vec<f32>,
    /// Spline couplings in the order the backward pass runs them.
    flows: Vec<ConvFlow>,
}

impl DurationPredictor {
    fn load(file: &OnnxFile) -> Result<DurationPredictor> {
        // Flows: 0 affine, then (spline coupling, flip) pairs at 1, 3, 5, ...; inference skips
        // coupling 1 (VITS drops that "useless" flow), so the export holds only the others.
        let mut couplings: Vec<usize> = (2..64)
            .filter(|i| {
                file.initializer(&format!("dp.flows.{i}.pre.weight"))
                    .is_some()
            })
            .collect();
        couplings.reverse();
        if couplings.is_empty() {
            return Err(bad(
                file.path(),
                "no stochastic duration predictor flows (dp.flows.*): only Piper's VITS with \
                 the stochastic duration predictor is supported",
            ));
        }
        Ok(DurationPredictor {
            pre: Conv1d::from_onnx_weight(file, "dp.pre.weight")?,
            convs: DdsConv::load(file, "dp.convs")?,
            proj: Conv1d::from_onnx_weight(file, "dp.proj.weight")?,
            mean: file.f32_values("dp.flows.0.m")?,
            inv_scale: affine_inverse_scale(file)?,
            flows: couplings
                .iter()
                .map(|i| ConvFlow::load(file, &format!("dp.flows.{i}")))
                .collect::<Result<_>>()?,
        })
    }

    /// Log-durations `[n]` from the encoder's hidden states `[n, hidden]`.
    fn log_durations(
        &self,
        hidden: &[f32],
        n: usize,
        noise_w: f32,
        noise: &mut GaussianNoise,
    ) -> Result<Vec<f32>> {
        if self.mean.len() != 2 || self.inv_scale.len() != 2 {
            return Err(ModelError::BadInput(
                "duration flow is not 2 channels".into(),
            ));
        }
        let mut cond = self.pre.forward_same(hidden, n)?;
        self.convs.forward(&mut cond, n)?;
        let cond = self.proj.forward_same(&cond, n)?;
        let mut z: Vec<f32> = noise
            .time_major(2, n)
            .into_iter()
            .map(|v| v * noise_w)
            .collect();
        let flip = |z: &mut [f32]| z.chunks_exact_mut(2).for_each(|p| p.swap(0, 1));
        for flow in &self.flows {
            flip(&mut z);
            flow.reverse(&mut z, n, &cond)?;
        }
        flip(&mut z);
        for pair in z.chunks_exact_mut(2) {
            for ((v, m), s) in pair.iter_mut().zip(&self.mean).zip(&self.inv_scale) {
                *v = (*v - m) * s;
            }
        }
        Ok(z.iter().step_by(2).copied().collect())
    }
}

/// A mean-only residual coupling layer with its WaveNet-style stack (`ResidualCouplingLayer`).
struct Coupling {
    pre: Conv1d,
    /// (dilated conv to 2·hidden gates, 1×1 conv to residual + skip).
    layers: Vec<(Conv1d, Conv1d)>,
    post: Conv1d,
    hidden: usize,
}

impl Coupling {
    fn load(file: &OnnxFile, prefix: &str) -> Result<Coupling> {
        let mut layers = Vec::new();
        loop {
            let i = layers.len();
            let gate = format!("{prefix}.enc.in_layers.{i}.bias");
            if file.initializer(&gate).is_none() {
                break;
            }
            // Weight-normalised weights are folded into renamed constants: found by their bias.
            layers.push((
                Conv1d::from_onnx_bias(file, &gate)?,
                Conv1d::from_onnx_bias(file, &format!("{prefix}.enc.res_skip_layers.{i}.bias"))?,
            ));
        }
        let pre = Conv1d::from_onnx_weight(file, &format!("{prefix}.pre.weight"))?;
        let post = Conv1d::from_onnx_weight(file, &format!("{prefix}.post.weight"))?;
        if layers.is_empty() || post.out_channels() != pre.in_channels() {
            return Err(bad(
                file.path(),
                format!("{prefix}: not a mean-only coupling"),
            ));
        }
        Ok(Coupling {
            hidden: pre.out_channels(),
            pre,
            layers,
            post,
        })
    }

    /// Backwards on `z: [t, 2·half]`: the second half minus the mean predicted from the first.
    fn reverse(&self, z: &mut [f32], t: usize) -> Result<()> {
        let half = self.pre.in_channels();
        let x0: Vec<f32> = z
            .chunks_exact(2 * half)
            .flat_map(|r| r[..half].iter().copied())
            .collect();
        let mut h = self.pre.forward_same(&x0, t)?;
        let hid = self.hidden;
        let mut skip = vec![0f32; t * hid];
        for (i, (gate, res_skip)) in self.layers.iter().enumerate() {
            // tanh(first half) · sigmoid(second half), sigmoid(b) = (1 + tanh(b/2)) / 2.
            let mut g = gate.forward_same(&h, t)?;
            g.chunks_exact_mut(2 * hid)
                .for_each(|r| r[hid..].iter_mut().for_each(|b| *b *= 0.5));
            tanh_inplace(&mut g);
            let acts: Vec<f32> = g
                .chunks_exact(2 * hid)
                .flat_map(|r| {
                    let (a, b) = r.split_at(hid);
                    a.iter().zip(b).map(|(&a, &b)| a * (0.5 + 0.5 * b))
                })
                .collect();
            let rs = res_skip.forward_same(&acts, t)?;
            if i + 1 < self.layers.len() {
                for ((hr, sr), rr) in h
                    .chunks_exact_mut(hid)
                    .zip(skip.chunks_exact_mut(hid))
                    .zip(rs.chunks_exact(2 * hid))
                {
                    add_into(hr, &rr[..hid]);
                    add_into(sr, &rr[hid..]);
                }
            } else {
                add_into(&mut skip, &rs);
            }
        }
        let mean = self.post.forward_same(&skip, t)?;
        for (row, m) in z.chunks_exact_mut(2 * half).zip(mean.chunks_exact(half)) {
            row[half..].iter_mut().zip(m).for_each(|(x, &m)| *x -= m);
        }
        Ok(())
    }
}

/// HiFi-GAN's residual blocks: type 1 (pairs of dilated convs) or type 2 (single convs).
enum ResBlock {
    Pairs(Vec<(Conv1d, Conv1d)>),
    Singles(Vec<Conv1d>),
}

impl ResBlock {
    fn load(file: &OnnxFile, prefix: &str) -> Result<ResBlock> {
        let count = |p: &str| {
            (0..)
                .take_while(|i| {
                    file.initializer(&format!("{prefix}.{p}.{i}.weight"))
                        .is_some()
                })
                .count()
        };
        let conv = |p: &str, i: usize| -> Result<Conv1d> {
            Ok(Conv1d::from_onnx_weight(
                file,
                &format!("{prefix}.{p}.{i}.weight"),
            )?)
        };
        let (singles, pairs) = (count("convs"), count("convs1"));
        if singles > 0 {
            Ok(ResBlock::Singles(
                (0..singles)
                    .map(|i| conv("convs", i))
                    .collect::<Result<_>>()?,
            ))
        } else if pairs > 0 && count("convs2") == pairs {
            Ok(ResBlock::Pairs(
                (0..pairs)
                    .map(|i| Ok((conv("convs1", i)?, conv("convs2", i)?)))
                    .collect::<Result<_>>()?,
            ))
        } else {
            Err(bad(
                file.path(),
                format!("{prefix}: unknown residual block"),
            ))
        }
    }

    /// `x` plus the block's output, in place.
    fn add_to(&self, x: &mut [f32], t: usize) -> Result<()> {
        let act = InputActivation::LeakyRelu(LRELU_SLOPE);
        match self {
            ResBlock::Singles(convs) => {
                for c in convs {
                    c.residual(x, t, act)?;
                }
            }
            ResBlock::Pairs(pairs) => {
                for (c1, c2) in pairs {
                    let y = c1.forward_activated(x, t, act)?;
                    c2.add_forward(&y, t, act, x)?;
                }
            }
        }
        Ok(())
    }
}

/// The HiFi-GAN generator.
struct Generator {
    conv_pre: Conv1d,
    /// Each upsampling step with its residual blocks (outputs averaged).
    stages: Vec<(Conv1d, Vec<ResBlock>)>,
    conv_post: Conv1d,
}

impl Generator {
    fn load(file: &OnnxFile) -> Result<Generator> {
        let ups = (0..)
            .take_while(|i| file.initializer(&format!("dec.ups.{i}.weight")).is_some())
            .count();
        let blocks = (0..)
            .take_while(|i| {
                file.initializer(&format!("dec.resblocks.{i}.convs.0.weight"))
                    .is_some()
                    || file
                        .initializer(&format!("dec.resblocks.{i}.convs1.0.weight"))
                        .is_some()
            })
            .count();
        if ups == 0 || blocks == 0 || blocks % ups != 0 {
            return Err(bad(
                file.path(),
                format!("generator with {ups} upsamplings and {blocks} residual blocks"),
            ));
        }
        let per_stage = blocks / ups;
        let stages = (0..ups)
            .map(|i| {
                let up = Conv1d::from_onnx_weight(file, &format!("dec.ups.{i}.weight"))?;
                let blocks = (0..per_stage)
                    .map(|j| ResBlock::load(file, &format!("dec.resblocks.{}", i * per_stage + j)))
                    .collect::<Result<_>>()?;
                Ok((up, blocks))
            })
            .collect::<Result<_>>()?;
        Ok(Generator {
            conv_pre: Conv1d::from_onnx_weight(file, "dec.conv_pre.weight")?,
            stages,
            conv_post: Conv1d::from_onnx_weight(file, "dec.conv_post.weight")?,
        })
    }

    /// `z: [frames, inter]` → samples.
    fn forward(&self, z: &[f32], frames: usize) -> Result<Vec<f32>> {
        let mut x = self.conv_pre.forward_same(z, frames)?;
        let mut t = frames;
        for (up, blocks) in &self.stages {
            let (y, t_up) =
                up.upsample_activated(&x, t, InputActivation::LeakyRelu(LRELU_SLOPE))?;
            t = t_up;
            // The blocks' outputs summed in order; the last block works on `y` itself.
            let count = blocks.len();
            let mut y = Some(y);
            let mut sum = Vec::new();
            for (i, block) in blocks.iter().enumerate() {
                let mut out = if i + 1 == count { y.take() } else { y.clone() }.unwrap_or_default();
                block.add_to(&mut out, t)?;
                if i == 0 {
                    sum = out;
                } else {
                    par_add_into(&mut sum, &out);
                }
            }
            let n = blocks.len() as f32;
            sum.par_chunks_mut(1 << 14)
                .for_each(|c| c.iter_mut().for_each(|v| *v /= n));
            x = sum;
        }
        let y = self.conv_post.forward_activated(
            &x,
            t,
            InputActivation::LeakyRelu(LRELU_SLOPE_FINAL),
        )?;
        let mut y = y;
        tanh_inplace(&mut y);
        Ok(y)
    }

    fn hop_length(&self) -> usize {
        // Each upsampling multiplies the length by its stride.
        self.stages.iter().map(|(up, _)| up.stride()).product()
    }
}

/// A Piper voice: the VITS model and its inference defaults.
pub struct VitsVoice {
    onnx_path: PathBuf,
    config_path: PathBuf,
    sample_rate: u32,
    defaults: Scales,
    encoder: TextEncoder,
    durations: DurationPredictor,
    flows: Vec<Coupling>,
    generator: Generator,
}

impl VitsVoice {
    /// A voice from its `.onnx` file or a directory holding one (with `<file>.onnx.json` beside
    /// it).
    pub fn load(path: &Path) -> Result<VitsVoice> {
        let onnx_path = if path.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| bad(path, format!("cannot list: {e}")))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "onnx"))
                .collect();
            found.sort();
            match found.len() {
                1 => found.remove(0),
                0 => return Err(bad(path, "no .onnx voice in this directory")),
                _ => return Err(bad(path, "several .onnx files: name one")),
            }
        } else {
            path.to_path_buf()
        };
        let mut config_path = onnx_path.clone().into_os_string();
        config_path.push(".json");
        let config_path = PathBuf::from(config_path);
        let config: Value = std::fs::read_to_string(&config_path)
            .map_err(|e| bad(&config_path, format!("cannot read the voice config: {e}")))
            .and_then(|t| {
                serde_json::from_str(&t)
                    .map_err(|e| bad(&config_path, format!("invalid JSON: {e}")))
            })?;
        let sample_rate = config["audio"]["sample_rate"]
            .as_u64()
            .filter(|&r| (1000..=192_000).contains(&r))
            .ok_or_else(|| bad(&config_path, "audio.sample_rate is missing or out of range"))?
            as u32;
        let knob = |name: &str, default: f32| {
            config["inference"][name]
                .as_f64()
                .map_or(default, |v| v as f32)
        };
        let defaults = Scales {
            noise_scale: knob("noise_scale", 0.667),
            length_scale: knob("length_scale", 1.0),
            noise_w: knob("noise_w", 0.8),
        };

        let file = OnnxFile::open(&onnx_path)?;
        if file.graph.inputs.iter().any(|i| i.name == "sid") {
            return Err(bad(
                &onnx_path,
                "multi-speaker voices (a `sid` input) are not supported yet",
            ));
        }
        let mut flows = Vec::new();
        for i in (0..64).rev() {
            if file
                .initializer(&format!("flow.flows.{i}.pre.weight"))
                .is_some()
            {
                flows.push(Coupling::load(&file, &format!("flow.flows.{i}"))?);
            }
        }
        let voice = VitsVoice {
            encoder: TextEncoder::load(&file)?,
            durations: DurationPredictor::load(&file)?,
            generator: Generator::load(&file)?,
            flows,
            onnx_path,
            config_path,
            sample_rate,
            defaults,
        };
        let inter = voice.encoder.proj.out_channels() / 2;
        if voice.flows.is_empty() || voice.generator.conv_pre.in_channels() != inter {
            return Err(bad(
                &voice.onnx_path,
                "the flow or generator does not match the encoder",
            ));
        }
        Ok(voice)
    }

    pub fn onnx_path(&self) -> &Path {
        &self.onnx_path
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// The voice config's `inference` values.
    pub fn default_scales(&self) -> Scales {
        self.defaults
    }

    /// Samples per frame (the generator's total upsampling).
    pub fn hop_length(&self) -> usize {
        self.generator.hop_length()
    }

    /// Audio for one sentence's phoneme ids (BOS, pads and EOS included, as Piper builds them).
    /// Noise is drawn from `noise`: first the durations' `[2, n]`, then the latent's
    /// `[inter, frames]`.
    pub fn synthesize(
        &self,
        ids: &[i64],
        scales: Scales,
        noise: &mut GaussianNoise,
    ) -> Result<Synthesis> {
        let n = ids.len();
        if n == 0 {
            return Err(ModelError::EmptyInput);
        }
        let (hidden, stats) = self.encoder.forward(ids)?;
        let logw = self
            .durations
            .log_durations(&hidden, n, scales.noise_w, noise)?;
        let durations: Vec<usize> = logw
            .iter()
            .map(|&l| {
                let w = (l.exp() * scales.length_scale).ceil();
                // NaN or negative (a negative length scale) → 0 frames; capped far above speech.
                if w.is_finite() && w > 0.0 {
                    (w as usize).min(10_000)
                } else {
                    0
                }
            })
            .collect();
        let frames = durations.iter().sum::<usize>().max(1);
        let two_inter = self.encoder.proj.out_channels();
        let inter = two_inter / 2;
        let eps = noise.time_major(inter, frames);
        let mut z = vec![0f32; frames * inter];
        let mut f = 0;
        for (i, &d) in durations.iter().enumerate() {
            let (mean, log_scale) = stats[i * two_inter..(i + 1) * two_inter].split_at(inter);
            for _ in 0..d {
                let row = &mut z[f * inter..(f + 1) * inter];
                let e = &eps[f * inter..(f + 1) * inter];
                for c in 0..inter {
                    row[c] = mean[c] + e[c] * log_scale[c].exp() * scales.noise_scale;
                }
                f += 1;
            }
        }
        // Frames past every phoneme (only the one frame kept when all durations are 0) follow a
        // zero prior, as the reference's empty alignment gives.
        for (row, e) in z[f * inter..]
            .chunks_exact_mut(inter)
            .zip(eps[f * inter..].chunks_exact(inter))
        {
            row.iter_mut()
                .zip(e)
                .for_each(|(v, &e)| *v = e * scales.noise_scale);
        }
        for coupling in &self.flows {
            z.chunks_exact_mut(inter).for_each(|r| r.reverse());
            coupling.reverse(&mut z, frames)?;
        }
        let audio = self.generator.forward(&z, frames)?;
        Ok(Synthesis { audio, durations })
    }
}
