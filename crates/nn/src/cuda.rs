//! The CUDA backend: every op of [`Backend`] as a launch of the kernels in `kernels/`, weights
//! uploaded once in their stored formats, activations and the KV cache in GPU memory.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use synaptix_core::DType;
use synaptix_kernels_cuda::ops::{
    self, AttentionParams, DeviceActs, DeviceKv, DeviceMatrix, Epilogue, Glu, RopeParams,
};
use synaptix_kernels_cuda::{fused, sample, CudaDevice, DeviceBuffer};
use synaptix_sample::DevicePick;

use crate::backend::{Backend, DecodeStep};
use crate::cuda_replay::{penalty_pairs, read_pick, rope_table, PickBuffers, Replay};
use crate::linear::{cpu_only, executable};
use crate::{Activation, AttentionSpec, NnError, Result, Rope, RopeStyle, Weight};

/// Activations `[rows, cols]` in GPU memory.
pub struct CudaTensor {
    pub buf: DeviceBuffer<f32>,
    pub rows: usize,
    pub cols: usize,
    /// `buf` already quantized for the matvecs it feeds (by a fused RMSNorm).
    pub prepared: Option<Arc<DeviceActs>>,
}

/// Positions of one step: on the GPU for the kernels, on the host for bookkeeping, plus the
/// RoPE (cos, sin) tables of this step, computed once per RoPE configuration.
pub struct CudaPositions {
    pub dev: Arc<DeviceBuffer<i32>>,
    pub host: Vec<usize>,
    rope_tables: Mutex<Vec<(RopeKey, Arc<DeviceBuffer<f32>>)>>,
}

/// What makes two RoPE tables different.
#[derive(Debug, Clone, PartialEq)]
struct RopeKey {
    n_rot: usize,
    base: u32,
    freq_scale: u32,
    factors: Option<Vec<u32>>,
}

impl RopeKey {
    fn of(rope: &Rope) -> RopeKey {
        RopeKey {
            n_rot: rope.n_rot,
            base: rope.base.to_bits(),
            freq_scale: rope.freq_scale.to_bits(),
            factors: rope
                .freq_factors
                .as_ref()
                .map(|f| f.iter().map(|v| v.to_bits()).collect()),
        }
    }
}

#[derive(Clone)]
pub struct CudaBackend {
    pub device: Arc<CudaDevice>,
    /// ggml's f16 GELU table, uploaded on first use.
    gelu_table: Arc<OnceLock<DeviceBuffer<u16>>>,
    /// Recorded decode steps (CUDA graphs).
    replay: Arc<Replay>,
    /// Set when the output head's launch wrote the step's greedy pick itself
    /// (`SYNAPTIX_HEAD_PICK`), so that `pick` launches no argmax; cleared by `pick` and by
    /// anything that changes the logits after the head.
    head_picked: Arc<AtomicBool>,
}

impl CudaBackend {
    /// Opens GPU `ordinal` (a clear error when CUDA or the GPU is missing).
    pub fn new(ordinal: usize) -> Result<CudaBackend> {
        Ok(CudaBackend {
            device: Arc::new(CudaDevice::new(ordinal)?),
            gelu_table: Arc::new(OnceLock::new()),
            replay: Arc::new(Replay::default()),
            head_picked: Arc::new(AtomicBool::new(false)),
        })
    }

    fn gelu_table(&self) -> Result<&DeviceBuffer<u16>> {
        if let Some(t) = self.gelu_table.get() {
            return Ok(t);
        }
        let bits: Vec<u16> = crate::mlp::gelu_f16_table()
            .iter()
            .map(|h| h.to_bits())
            .collect();
        let uploaded = self.device.upload(&bits)?;
        Ok(self.gelu_table.get_or_init(|| uploaded))
    }

    /// The step's (cos, sin) table for `rope`: angles from the CPU code, so both backends
    /// rotate by identical values.
    fn rope_table(&self, rope: &Rope, pos: &CudaPositions) -> Result<Arc<DeviceBuffer<f32>>> {
        self.replay.note_rope(rope);
        let key = RopeKey::of(rope);
        let mut tables = pos
            .rope_tables
            .lock()
            .map_err(|_| mismatch("rope", "table cache poisoned".into()))?;
        if let Some((_, t)) = tables.iter().find(|(k, _)| *k == key) {
            return Ok(t.clone());
        }
        if self.replay.recording().is_some() {
            // Uploads cannot be recorded; the survey step should have noted this configuration.
            return Err(mismatch(
                "rope",
                "configuration not seen before recording".into(),
            ));
        }
        let t = Arc::new(self.device.upload(&rope_table(rope, &pos.host))?);
        tables.push((key, t.clone()));
        Ok(t)
    }

    /// `y = x · wᵀ` with the epilogue, on the activations `x` was already quantized to when
    /// they suit `w` (by a fused RMSNorm, GLU or attention), else quantizing them here.
    fn matvec(
        &self,
        y: &mut CudaTensor,
        w: &DeviceMatrix,
        x: &CudaTensor,
        epi: Epilogue,
    ) -> Result<()> {
        match &x.prepared {
            Some(acts)
                if ops::activation_format(w.dtype) == Some(acts.dtype())
                    && acts.cols() == w.cols =>
            {
                ops::matvec_quantized_with(&self.device, &mut y.buf, w, acts, epi)?
            }
            _ => ops::matvec_with(&self.device, &mut y.buf, w, &x.buf, epi)?,
        }
        Ok(())
    }

    /// `rms_norm(x) · Wᵢᵀ (+ biasᵢ)` for one row by `kernel` (an `ops` function that normalises
    /// inside the products), or None where that kernel does not apply.
    fn normed_products(
        &self,
        ws: &[(&DeviceMatrix, Option<&DeviceBuffer<f32>>)],
        kernel: ops::NormedMatvec,
        x: &CudaTensor,
        w: &DeviceBuffer<f32>,
        eps: f32,
    ) -> Result<Option<Vec<CudaTensor>>> {
        let mut outs = ws
            .iter()
            .map(|(m, _)| self.tensor(1, m.rows))
            .collect::<Result<Vec<CudaTensor>>>()?;
        let mut parts: Vec<ops::MatvecPart> = outs
            .iter_mut()
            .zip(ws)
            .map(|(y, (m, b))| ops::MatvecPart {
                w: m,
                y: &mut y.buf,
                bias: *b,
            })
            .collect();
        let taken = kernel(&self.device, &mut parts, &x.buf, w, eps)?;
        drop(parts);
        Ok(taken.then_some(outs))
    }

    /// The kernels' name for `act`, and the GELU table GeGLU reads.
    fn glu_kind(&self, act: Activation) -> Result<(Glu, Option<&DeviceBuffer<u16>>)> {
        Ok(match act {
            Activation::Silu => (Glu::Silu, None),
            Activation::GeluTanh => (Glu::GeluTanh, Some(self.gelu_table()?)),
        })
    }

    /// Whether the output head `m` after RMSNorm (weight `w`) may write the greedy pick of a
    /// step recorded with `pick` itself (`SYNAPTIX_HEAD_PICK=1`): one row, no bias, greedy with
    /// no penalties. The kernel may still refuse (`ops::rms_norm_matvec_pick`).
    fn head_with_pick(
        x: &CudaTensor,
        w: &DeviceBuffer<f32>,
        m: &DeviceMatrix,
        bias: Option<&DeviceBuffer<f32>>,
        pick: &DevicePick,
    ) -> bool {
        head_pick()
            && !fusion_disabled()
            && x.rows == 1
            && x.cols == m.cols
            && w.len() == m.cols
            && bias.is_none()
            && pick.top_k == 0
            && pick.penalties.is_none()
    }

    /// An output tensor for an op that writes all of it (every kernel here does; the GPU
    /// parity tests poison outputs to check exactly that), so it is not cleared first.
    fn tensor(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        Ok(CudaTensor {
            // SAFETY: see above: the op this is for writes every element before any read.
            buf: unsafe { self.device.uninit(rows * cols) }?,
            rows,
            cols,
            prepared: None,
        })
    }
}

/// `SYNAPTIX_NO_FUSION` set: RMSNorm and the MLP activation run apart from the quantization of
/// their outputs (for comparisons).
fn fusion_disabled() -> bool {
    static DISABLED: OnceLock<bool> = OnceLock::new();
    *DISABLED.get_or_init(|| std::env::var_os("SYNAPTIX_NO_FUSION").is_some())
}

/// Rows from which a lone matrix after an RMSNorm is taken for an output head (vocabularies:
/// 32k-262k rows; no layer of the supported models is that tall).
const HEAD_MIN_ROWS: usize = 32_768;

/// How the final RMSNorm meets the output head (`SYNAPTIX_HEAD_NORM`): `apart` launches the
/// norm and then the head's product (which quantizes its input itself where the format needs
/// it); `for` launches the norm with the head's quantization inside it; `inside` (the default)
/// lets the head's kernel normalise (and quantize) the row itself where one can (the rules of
/// the layers' products). The same bits each way (cuda_parity). On the H200 (tg128, apart /
/// for / inside): 0.5B Q4_K_M 1,342.2 / 1,343.8 / 1,348.2, 0.5B Q8_0 1,389.0 / 1,388.6 /
/// 1,392.0, 1.5B Q8_0 and Q4_K_M and 7B Q8_0 even.
#[derive(Clone, Copy, PartialEq, Eq)]
enum HeadNorm {
    Apart,
    For,
    Inside,
}

fn head_norm() -> HeadNorm {
    static MODE: OnceLock<HeadNorm> = OnceLock::new();
    *MODE.get_or_init(
        || match std::env::var("SYNAPTIX_HEAD_NORM").ok().as_deref() {
            Some("apart") => HeadNorm::Apart,
            Some("for") => HeadNorm::For,
            _ => HeadNorm::Inside,
        },
    )
}

/// Whether a recorded greedy step's output head writes the pick itself (on by default;
/// `SYNAPTIX_HEAD_PICK=0`: never): the final RMSNorm, the head's product and the argmax in one
/// launch (`matvec_q8p_pick`: Q8_0 heads with split copies and rows of at most 1024 values,
/// 0.5B's). On the H200 0.5B Q8_0 tg128 1,389.0 / 1,388.0 → 1,402.3; the same picks and logits
/// (cuda_parity).
fn head_pick() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("SYNAPTIX_HEAD_PICK").as_deref() != Ok("0"))
}

/// Which prologues the bulk-copy F16 / BF16 kernel runs itself (`SYNAPTIX_BULK_PROLOGUE`):
/// `norm` (the default) normalises the row inside the Q/K/V and gate/up launches; `glu` computes
/// the MLP activation inside the down launch; `all` (or `1`) both; `0` neither. On the H200
/// (tg128) the norm alone gained at 7B (221.0 → 223.6 / 222.0) and 1.5B (553 / 548 → 558 /
/// 557); both together measured even at 7B and slower at 1.5B (528.6 / 526.9 against 535.4 /
/// 537.4): every block reads the gate and up rows (8 bytes per column), on the products'
/// critical path.
fn bulk_prologue(which: &str) -> bool {
    static MODE: OnceLock<String> = OnceLock::new();
    let mode = MODE.get_or_init(|| {
        std::env::var("SYNAPTIX_BULK_PROLOGUE").unwrap_or_else(|_| "norm".to_string())
    });
    matches!(mode.as_str(), "1" | "all") || mode == which
}

/// Whether the MLP activation is fused with a Q8_K quantization (`SYNAPTIX_GLU_Q8K=0`: no, for
/// comparisons). The fused kernel computes each 256-value block with a thread block of 256
/// threads; its first form, one warp per block computing 8 values per lane, measured slower
/// than the two kernels on Qwen2.5 0.5B Q4_K_M decode.
fn glu_q8k_fused() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("SYNAPTIX_GLU_Q8K").as_deref() != Ok("0"))
}

/// The longest row the k-quant row kernel normalises itself (`rms_norm_linear_many`): every
/// block does the norm and the quantization before its first product, which paid at Qwen2.5
/// 1.5B (1536 columns: Q4_K_M tg128 635 → 652-656 t/s on the H200, two launches less per
/// layer) and cost at 7B (3584: 369 → 344, the weights' stream idling behind it).
const NORM_IN_MATVEC_MAX_COLS: usize = 2048;

/// [`NORM_IN_MATVEC_MAX_COLS`], or `SYNAPTIX_NORM_IN_MATVEC_COLS` (comparisons).
fn norm_in_matvec_max_cols() -> usize {
    static COLS: OnceLock<usize> = OnceLock::new();
    *COLS.get_or_init(|| {
        std::env::var("SYNAPTIX_NORM_IN_MATVEC_COLS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(NORM_IN_MATVEC_MAX_COLS)
    })
}

fn mismatch(op: &'static str, detail: String) -> NnError {
    NnError::Kernel(synaptix_core::Error::ShapeMismatch { op, detail })
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Matrix = DeviceMatrix;
    type Vector = DeviceBuffer<f32>;
    type Kv = DeviceKv;
    type Positions = CudaPositions;

    fn name(&self) -> String {
        format!("cuda:{}", self.device.info.ordinal)
    }

    fn matrix(&self, w: &Weight) -> Result<DeviceMatrix> {
        if cpu_only(w.dtype) {
            return Err(NnError::CpuOnlyWeight {
                name: w.name.clone(),
                dtype: w.dtype,
            });
        }
        if w.shape.rank() != 2 || !executable(w.dtype) {
            return Err(NnError::UnsupportedWeight {
                name: w.name.clone(),
                dtype: w.dtype,
            });
        }
        let (rows, cols) = (w.shape.dims()[0], w.shape.dims()[1]);
        Ok(DeviceMatrix::upload(
            &self.device,
            w.dtype,
            rows,
            cols,
            w.data.as_bytes(),
        )?)
    }

    fn vector(&self, values: Vec<f32>) -> Result<DeviceBuffer<f32>> {
        Ok(self.device.upload(&values)?)
    }

    fn kv(&self, n_kv_heads: usize, head_dim: usize, capacity: usize) -> Result<DeviceKv> {
        Ok(DeviceKv::new(&self.device, n_kv_heads, head_dim, capacity)?)
    }

    fn positions(&self, positions: &[usize]) -> Result<CudaPositions> {
        if let Some(inputs) = self.replay.recording() {
            if positions.len() != 1 {
                return Err(mismatch(
                    "positions",
                    "a recorded step has one token".into(),
                ));
            }
            let tables = inputs
                .ropes
                .iter()
                .map(|(r, t)| (RopeKey::of(r), t.clone()))
                .collect();
            return Ok(CudaPositions {
                dev: inputs.pos.clone(),
                host: positions.to_vec(),
                rope_tables: Mutex::new(tables),
            });
        }
        let as_i32: Vec<i32> = positions
            .iter()
            .map(|&p| i32::try_from(p).map_err(|_| mismatch("positions", format!("position {p}"))))
            .collect::<Result<_>>()?;
        Ok(CudaPositions {
            dev: Arc::new(self.device.upload(&as_i32)?),
            host: positions.to_vec(),
            rope_tables: Mutex::new(Vec::new()),
        })
    }

    fn shape(&self, x: &CudaTensor) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn to_host(&self, x: &CudaTensor) -> Result<Vec<f32>> {
        Ok(self.device.download(&x.buf)?)
    }

    fn upload(&self, values: Vec<f32>, rows: usize, cols: usize) -> Result<CudaTensor> {
        if values.len() != rows * cols {
            return Err(NnError::Kernel(synaptix_core::Error::ShapeMismatch {
                op: "upload",
                detail: format!("{} values for [{rows}, {cols}]", values.len()),
            }));
        }
        Ok(CudaTensor {
            buf: self.device.upload(&values)?,
            rows,
            cols,
            prepared: None,
        })
    }

    fn embed(&self, table: &DeviceMatrix, ids: &[u32], scale: Option<f32>) -> Result<CudaTensor> {
        let mut out = self.tensor(ids.len(), table.cols)?;
        let scale = scale.unwrap_or(1.0);
        if let Some(inputs) = self.replay.recording() {
            let ids = inputs.ids.lock().unwrap_or_else(|e| e.into_inner());
            ops::get_rows(&self.device, &mut out.buf, table, &ids, scale)?;
            return Ok(out);
        }
        let ids: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
        let dids = self.device.upload(&ids)?;
        ops::get_rows(&self.device, &mut out.buf, table, &dids, scale)?;
        Ok(out)
    }

    fn linear(
        &self,
        x: &CudaTensor,
        w: &DeviceMatrix,
        bias: Option<&DeviceBuffer<f32>>,
    ) -> Result<CudaTensor> {
        if x.cols != w.cols {
            return Err(mismatch(
                "linear",
                format!("[{}, {}] weight, x has {} columns", w.rows, w.cols, x.cols),
            ));
        }
        let mut y = self.tensor(x.rows, w.rows)?;
        let epi = Epilogue {
            bias,
            residual: None,
        };
        self.matvec(&mut y, w, x, epi)?;
        Ok(y)
    }

    fn linear_many(
        &self,
        x: &CudaTensor,
        ws: &[(&DeviceMatrix, Option<&DeviceBuffer<f32>>)],
    ) -> Result<Vec<CudaTensor>> {
        // x quantized once per activation format the weights need.
        let mut prepared: Vec<(DType, Arc<DeviceActs>)> = Vec::new();
        let mut out = Vec::with_capacity(ws.len());
        let mut i = 0;
        while i < ws.len() {
            // The run of up to three weights from i with one format and row length (Q, K and V;
            // gate and up): one launch for a decode step.
            let (w, _) = ws[i];
            let mut j = i + 1;
            while j < ws.len() && j - i < 3 && ws[j].0.dtype == w.dtype && ws[j].0.cols == w.cols {
                j += 1;
            }
            for &(wt, _) in &ws[i..j] {
                if x.cols != wt.cols {
                    return Err(mismatch(
                        "linear",
                        format!(
                            "[{}, {}] weight, x has {} columns",
                            wt.rows, wt.cols, x.cols
                        ),
                    ));
                }
            }
            let acts = match ops::activation_format(w.dtype) {
                None => None,
                Some(format) => Some(match prepared.iter().find(|(f, _)| *f == format) {
                    Some((_, a)) => a.clone(),
                    None => {
                        let acts = match &x.prepared {
                            Some(p) if p.dtype() == format => p.clone(),
                            _ => {
                                let mut acts =
                                    DeviceActs::new(&self.device, w.dtype, x.rows, x.cols)?;
                                ops::quantize_acts(&self.device, &mut acts, &x.buf)?;
                                Arc::new(acts)
                            }
                        };
                        prepared.push((format, acts.clone()));
                        acts
                    }
                }),
            };
            let mut ys = ws[i..j]
                .iter()
                .map(|(wt, _)| self.tensor(x.rows, wt.rows))
                .collect::<Result<Vec<_>>>()?;
            let mut parts: Vec<ops::MatvecPart> = ys
                .iter_mut()
                .zip(&ws[i..j])
                .map(|(y, &(w, bias))| ops::MatvecPart {
                    w,
                    y: &mut y.buf,
                    bias,
                })
                .collect();
            ops::matvec_many(&self.device, &mut parts, &x.buf, acts.as_deref())?;
            out.extend(ys);
            i = j;
        }
        Ok(out)
    }

    fn linear_add(
        &self,
        x: &CudaTensor,
        w: &DeviceMatrix,
        residual: &mut CudaTensor,
    ) -> Result<()> {
        if x.cols != w.cols || residual.rows != x.rows || residual.cols != w.rows {
            return Err(mismatch(
                "linear_add",
                format!(
                    "[{}, {}] weight, x [{}, {}], residual [{}, {}]",
                    w.rows, w.cols, x.rows, x.cols, residual.rows, residual.cols
                ),
            ));
        }
        let mut y = self.tensor(x.rows, w.rows)?;
        let epi = Epilogue {
            bias: None,
            residual: Some(&residual.buf),
        };
        self.matvec(&mut y, w, x, epi)?;
        *residual = y;
        Ok(())
    }

    fn rms_norm_linear_many(
        &self,
        x: &CudaTensor,
        w: &DeviceBuffer<f32>,
        eps: f32,
        ws: &[(&DeviceMatrix, Option<&DeviceBuffer<f32>>)],
    ) -> Result<Vec<CudaTensor>> {
        // The output head (one matrix of a vocabulary's rows): as `head_norm` says.
        if let [(m, bias)] = ws {
            if m.rows >= HEAD_MIN_ROWS {
                // With the greedy pick in the head's launch where it applies.
                if let Some(inputs) = self
                    .replay
                    .recording()
                    .filter(|inputs| Self::head_with_pick(x, w, m, *bias, &inputs.pick))
                {
                    let mut y = self.tensor(1, m.rows)?;
                    let mut ids = inputs.ids.lock().unwrap_or_else(|e| e.into_inner());
                    if ops::rms_norm_matvec_pick(
                        &self.device,
                        &mut y.buf,
                        m,
                        &x.buf,
                        w,
                        eps,
                        &mut ids,
                    )? {
                        self.head_picked.store(true, Ordering::Relaxed);
                        return Ok(vec![y]);
                    }
                }
                match head_norm() {
                    HeadNorm::Apart => {
                        let h = self.rms_norm(x, w, eps)?;
                        return Ok(vec![self.linear(&h, m, *bias)?]);
                    }
                    HeadNorm::For => {
                        let h = self.rms_norm_for(x, w, eps, &[m])?;
                        return self.linear_many(&h, ws);
                    }
                    HeadNorm::Inside => {}
                }
            }
        }
        // One row against F16 / BF16 weights (Hopper's bulk-copy kernel) or Q8_0 weights with
        // split copies (its Q8_0 form), of up to NORM_IN_MATVEC_MAX_COLS against k-quant
        // weights (the row kernel), or of up to 1024 against legacy formats (the short
        // kernel): the product's blocks normalise (and quantize) the row themselves.
        let one_row = !fusion_disabled() && x.rows == 1 && ws.iter().all(|(m, _)| m.cols == x.cols);
        if one_row
            && bulk_prologue("norm")
            && ws.iter().all(|(m, _)| ops::bulk_applies(&self.device, m))
        {
            if let Some(outs) =
                self.normed_products(ws, ops::rms_norm_matvec_float_many, x, w, eps)?
            {
                return Ok(outs);
            }
        }
        if one_row && bulk_prologue("norm") && ws.iter().all(|(m, _)| ops::q8s_applies(m)) {
            if let Some(outs) =
                self.normed_products(ws, ops::rms_norm_matvec_q8s_many, x, w, eps)?
            {
                return Ok(outs);
            }
        }
        if one_row && x.cols <= norm_in_matvec_max_cols() {
            if let Some(outs) = self.normed_products(ws, ops::rms_norm_matvec_many, x, w, eps)? {
                return Ok(outs);
            }
        }
        if one_row {
            if let Some(outs) =
                self.normed_products(ws, ops::rms_norm_matvec_short_many, x, w, eps)?
            {
                return Ok(outs);
            }
        }
        let consumers: Vec<&DeviceMatrix> = ws.iter().map(|(m, _)| *m).collect();
        let h = self.rms_norm_for(x, w, eps, &consumers)?;
        self.linear_many(&h, ws)
    }

    fn rms_norm_for(
        &self,
        x: &CudaTensor,
        w: &DeviceBuffer<f32>,
        eps: f32,
        consumers: &[&DeviceMatrix],
    ) -> Result<CudaTensor> {
        if fusion_disabled() {
            return self.rms_norm(x, w, eps);
        }
        // One activation format for every consumer: normalise and quantize in one launch.
        let formats: Vec<Option<DType>> = consumers
            .iter()
            .map(|w| ops::activation_format(w.dtype))
            .collect();
        let (Some(first), Some(Some(format))) = (consumers.first(), formats.first()) else {
            return self.rms_norm(x, w, eps);
        };
        if formats.iter().any(|f| *f != Some(*format))
            || !fused::rms_norm_quantized_supported(x.cols, *format)
            || w.len() != x.cols
        {
            return self.rms_norm(x, w, eps);
        }
        let mut y = self.tensor(x.rows, x.cols)?;
        let mut acts = DeviceActs::new(&self.device, first.dtype, x.rows, x.cols)?;
        fused::rms_norm_quantized(&self.device, &mut y.buf, &mut acts, &x.buf, w, eps)?;
        y.prepared = Some(Arc::new(acts));
        Ok(y)
    }

    fn rms_norm(&self, x: &CudaTensor, w: &DeviceBuffer<f32>, eps: f32) -> Result<CudaTensor> {
        let mut y = self.tensor(x.rows, x.cols)?;
        ops::rms_norm(&self.device, &mut y.buf, &x.buf, w, eps)?;
        Ok(y)
    }

    fn rope(
        &self,
        x: &mut CudaTensor,
        rope: &Rope,
        n_heads: usize,
        head_dim: usize,
        pos: &CudaPositions,
    ) -> Result<()> {
        x.prepared = None;
        let params = RopeParams {
            n_heads,
            head_dim,
            n_rot: rope.n_rot,
            neox: rope.style == RopeStyle::Neox,
        };
        let table = self.rope_table(rope, pos)?;
        ops::rope(&self.device, &mut x.buf, &table, params)?;
        Ok(())
    }

    fn rope_qk(
        &self,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        rope: &Rope,
        (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
        pos: &CudaPositions,
        q_scale: Option<f32>,
    ) -> Result<()> {
        q.prepared = None;
        k.prepared = None;
        let params = RopeParams {
            n_heads,
            head_dim,
            n_rot: rope.n_rot,
            neox: rope.style == RopeStyle::Neox,
        };
        let table = self.rope_table(rope, pos)?;
        // The scale rides along only where the rotation touches every query element.
        let fused_scale = q_scale.filter(|_| rope.n_rot == head_dim);
        ops::rope_qk(
            &self.device,
            &mut q.buf,
            &mut k.buf,
            &table,
            params,
            n_kv_heads,
            fused_scale,
        )?;
        if let (Some(s), None) = (q_scale, fused_scale) {
            ops::scale(&self.device, &mut q.buf, s)?;
        }
        Ok(())
    }

    fn scale(&self, x: &mut CudaTensor, s: f32) -> Result<()> {
        x.prepared = None;
        Ok(ops::scale(&self.device, &mut x.buf, s)?)
    }

    fn add(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        if x.buf.len() != y.buf.len() {
            return Err(mismatch(
                "add",
                format!("{} vs {} values", x.buf.len(), y.buf.len()),
            ));
        }
        let mut out = self.tensor(x.rows, x.cols)?;
        ops::add(&self.device, &mut out.buf, &x.buf, &y.buf)?;
        *x = out;
        Ok(())
    }

    fn glu_for(
        &self,
        gate: &CudaTensor,
        up: &CudaTensor,
        act: Activation,
        consumer: &DeviceMatrix,
    ) -> Result<CudaTensor> {
        let Some(format) = ops::activation_format(consumer.dtype) else {
            return self.glu(gate, up, act);
        };
        if fusion_disabled() {
            return self.glu(gate, up, act);
        }
        if (format == DType::Q8K && !glu_q8k_fused())
            || !fused::glu_quantized_supported(gate.cols, format)
            || consumer.cols != gate.cols
            || up.rows != gate.rows
            || up.cols != gate.cols
        {
            return self.glu(gate, up, act);
        }
        let (kind, table) = self.glu_kind(act)?;
        let mut y = self.tensor(gate.rows, gate.cols)?;
        let mut acts = DeviceActs::new(&self.device, consumer.dtype, gate.rows, gate.cols)?;
        fused::glu_quantized(
            &self.device,
            kind,
            &mut y.buf,
            &mut acts,
            &gate.buf,
            &up.buf,
            table,
        )?;
        y.prepared = Some(Arc::new(acts));
        Ok(y)
    }

    fn glu_linear_add(
        &self,
        gate: &CudaTensor,
        up: &CudaTensor,
        act: Activation,
        w: &DeviceMatrix,
        residual: &mut CudaTensor,
    ) -> Result<()> {
        let shapes_fit = gate.rows == 1
            && up.rows == 1
            && gate.cols == up.cols
            && gate.cols == w.cols
            && residual.rows == 1
            && residual.cols == w.rows;
        if !fusion_disabled() && bulk_prologue("glu") && shapes_fit {
            let (kind, table) = self.glu_kind(act)?;
            let mut y = self.tensor(1, w.rows)?;
            if ops::glu_matvec(
                &self.device,
                &mut y.buf,
                w,
                &gate.buf,
                &up.buf,
                kind,
                table,
                Some(&residual.buf),
            )? {
                *residual = y;
                return Ok(());
            }
        }
        let h = self.glu_for(gate, up, act, w)?;
        self.linear_add(&h, w, residual)
    }

    fn glu(&self, gate: &CudaTensor, up: &CudaTensor, act: Activation) -> Result<CudaTensor> {
        let mut out = self.tensor(gate.rows, gate.cols)?;
        let (kind, table) = self.glu_kind(act)?;
        ops::glu(
            &self.device,
            kind,
            &mut out.buf,
            &gate.buf,
            &up.buf,
            gate.cols,
            table,
        )?;
        Ok(out)
    }

    fn attention(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        kv: &mut DeviceKv,
        pos: &CudaPositions,
        spec: &AttentionSpec,
    ) -> Result<CudaTensor> {
        let max_pos = pos.host.iter().copied().max().unwrap_or(0);
        if max_pos >= kv.capacity {
            return Err(NnError::ContextFull {
                pos: max_pos,
                capacity: kv.capacity,
            });
        }
        ops::kv_store(&self.device, kv, &k.buf, &v.buf, &pos.dev)?;
        let mut out = self.tensor(q.rows, q.cols)?;
        let params = AttentionParams {
            n_heads: spec.n_heads,
            scale: spec.scale,
            window: spec.window,
            max_pos,
        };
        ops::attention(&self.device, &mut out.buf, &q.buf, kv, &pos.dev, params)?;
        Ok(out)
    }

    fn rope_attention_for(
        &self,
        (q, k, v): (&mut CudaTensor, &mut CudaTensor, &CudaTensor),
        rope: &Rope,
        heads: (usize, usize, usize),
        q_scale: Option<f32>,
        kv: &mut DeviceKv,
        pos: &CudaPositions,
        spec: &AttentionSpec,
        consumer: &DeviceMatrix,
    ) -> Result<CudaTensor> {
        let (n_heads, n_kv_heads, head_dim) = heads;
        // The fused kernel scales the queries only where the rotation covers them all.
        let scale_fits = q_scale.is_none() || rope.n_rot == head_dim;
        if fusion_disabled()
            || !scale_fits
            || kv.head_dim != head_dim
            || kv.n_kv_heads != n_kv_heads
            || spec.n_heads != n_heads
        {
            self.rope_qk(q, k, rope, heads, pos, q_scale)?;
            return self.attention(q, k, v, kv, pos, spec);
        }
        let max_pos = pos.host.iter().copied().max().unwrap_or(0);
        if max_pos >= kv.capacity {
            return Err(NnError::ContextFull {
                pos: max_pos,
                capacity: kv.capacity,
            });
        }
        q.prepared = None;
        k.prepared = None;
        let rope_params = RopeParams {
            n_heads,
            head_dim,
            n_rot: rope.n_rot,
            neox: rope.style == RopeStyle::Neox,
        };
        let table = self.rope_table(rope, pos)?;
        let params = AttentionParams {
            n_heads,
            scale: spec.scale,
            window: spec.window,
            max_pos,
        };
        // One decode row: RoPE and the cache store inside the one-pass attention launch.
        if ops::rope_in_attention() && q.rows == 1 {
            let mut out = self.tensor(q.rows, q.cols)?;
            let mut k_rot = self.tensor(k.rows, k.cols)?;
            let mut acts = match ops::activation_format(consumer.dtype) {
                Some(format)
                    if consumer.cols == q.cols
                        && !ops::rows_take_raw(consumer)
                        && ops::attention_quantizes_inside(head_dim, q.rows, format) =>
                {
                    Some(DeviceActs::new(
                        &self.device,
                        consumer.dtype,
                        q.rows,
                        q.cols,
                    )?)
                }
                _ => None,
            };
            let new = ops::NewRow {
                k: &k.buf,
                v: &v.buf,
                k_rot: &mut k_rot.buf,
                cos_sin: &table,
                rope: rope_params,
                q_scale,
            };
            if ops::rope_store_attention(
                &self.device,
                &mut out.buf,
                acts.as_mut(),
                &mut q.buf,
                new,
                kv,
                &pos.dev,
                params,
            )? {
                *k = k_rot;
                out.prepared = acts.map(Arc::new);
                return Ok(out);
            }
        }
        ops::rope_qk_store(
            &self.device,
            &mut q.buf,
            &mut k.buf,
            &v.buf,
            kv,
            &table,
            rope_params,
            &pos.dev,
            q_scale,
        )?;
        let mut out = self.tensor(q.rows, q.cols)?;
        match ops::activation_format(consumer.dtype) {
            Some(format)
                if consumer.cols == q.cols
                    && !(q.rows == 1 && ops::rows_take_raw(consumer))
                    && ops::attention_quantizes_inside(head_dim, q.rows, format) =>
            {
                let mut acts = DeviceActs::new(&self.device, consumer.dtype, q.rows, q.cols)?;
                ops::attention_quantized(
                    &self.device,
                    &mut out.buf,
                    &mut acts,
                    &q.buf,
                    kv,
                    &pos.dev,
                    params,
                )?;
                out.prepared = Some(Arc::new(acts));
            }
            _ => ops::attention(&self.device, &mut out.buf, &q.buf, kv, &pos.dev, params)?,
        }
        Ok(out)
    }

    fn last_row(&self, x: CudaTensor) -> Result<CudaTensor> {
        if x.rows <= 1 {
            return Ok(x);
        }
        let start = (x.rows - 1) * x.cols;
        let buf = self
            .device
            .stream()
            .clone_dtod(&x.buf.slice(start..))
            .map_err(synaptix_kernels_cuda::CudaError::from)?;
        Ok(CudaTensor {
            buf,
            rows: 1,
            cols: x.cols,
            prepared: None,
        })
    }

    fn argmax(&self, x: &CudaTensor) -> Result<u32> {
        let start = x.buf.len() - x.cols;
        let last = if start == 0 {
            None
        } else {
            Some(
                self.device
                    .stream()
                    .clone_dtod(&x.buf.slice(start..))
                    .map_err(synaptix_kernels_cuda::CudaError::from)?,
            )
        };
        let mut out = self.device.upload(&[0i32])?;
        ops::argmax(&self.device, last.as_ref().unwrap_or(&x.buf), &mut out)?;
        Ok(self.device.download(&out)?[0] as u32)
    }

    fn pick(&self, logits: CudaTensor, pick: &DevicePick) -> Result<Vec<(u32, f32)>> {
        let dev = &self.device;
        let mut x = self.last_row(logits)?;
        let recording = self.replay.recording();
        if let Some(p) = &pick.penalties {
            match &recording {
                Some(inputs) => sample::apply_penalties(
                    dev,
                    &mut x.buf,
                    &inputs.penalty_pairs,
                    &inputs.penalty_count,
                    p.repeat,
                    p.frequency,
                    p.presence,
                )?,
                None if p.counts.is_empty() => {}
                None => {
                    let pairs = dev.upload(&penalty_pairs(&p.counts))?;
                    let count = dev.upload(&[p.counts.len() as i32])?;
                    sample::apply_penalties(
                        dev,
                        &mut x.buf,
                        &pairs,
                        &count,
                        p.repeat,
                        p.frequency,
                        p.presence,
                    )?;
                }
            }
        }
        let launch = |out: &mut PickBuffers| -> Result<()> {
            if pick.top_k == 0 {
                ops::argmax(dev, &x.buf, &mut out.ids)?;
            } else {
                sample::top_k(
                    dev,
                    &x.buf,
                    pick.top_k,
                    &mut out.ids,
                    &mut out.vals,
                    &mut out.count,
                )?;
            }
            Ok(())
        };
        if let Some(inputs) = recording {
            // Read from the fixed buffers after the recording runs. A greedy pick goes straight
            // into the step's token buffer: the next replay can run on it without the host.
            if pick.top_k == 0 {
                // Unless the head's launch wrote the pick already (`SYNAPTIX_HEAD_PICK`).
                if !self.head_picked.swap(false, Ordering::Relaxed) {
                    let mut ids = inputs.ids.lock().unwrap_or_else(|e| e.into_inner());
                    ops::argmax(dev, &x.buf, &mut ids)?;
                }
            } else {
                let mut out = inputs.out.lock().unwrap_or_else(|e| e.into_inner());
                launch(&mut out)?;
            }
            return Ok(Vec::new());
        }
        let k = pick.top_k.max(1);
        let mut out = PickBuffers {
            ids: dev.zeros(k)?,
            vals: dev.zeros(k)?,
            count: dev.zeros(1)?,
        };
        launch(&mut out)?;
        read_pick(dev, &out, pick.top_k)
    }

    fn decode_step(
        &self,
        key: DecodeStep,
        pick: &DevicePick,
        step: &mut dyn FnMut() -> Result<Vec<(u32, f32)>>,
    ) -> Result<Vec<(u32, f32)>> {
        // A pick the head wrote in a step that did not reach its `pick` is not this step's.
        self.head_picked.store(false, Ordering::Relaxed);
        if std::env::var_os("SYNAPTIX_NO_GRAPHS").is_some() {
            return step();
        }
        self.replay.decode_step(&self.device, key, pick, step)
    }

    fn softcap(&self, x: &mut CudaTensor, cap: f32) -> Result<()> {
        x.prepared = None;
        self.head_picked.store(false, Ordering::Relaxed);
        Ok(ops::softcap(&self.device, &mut x.buf, cap)?)
    }
}
