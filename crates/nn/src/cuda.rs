//! The CUDA backend: every op of [`Backend`] as a launch of the kernels in `kernels/`, weights
//! uploaded once in their stored formats, activations and the KV cache in GPU memory.

use std::sync::{Arc, Mutex, OnceLock};

use synaptix_kernels_cuda::ops::{self, AttentionParams, DeviceKv, DeviceMatrix, Glu, RopeParams};
use synaptix_kernels_cuda::{CudaDevice, DeviceBuffer};

use crate::backend::Backend;
use crate::linear::executable;
use crate::{Activation, AttentionSpec, NnError, Result, Rope, RopeStyle, Weight};

/// Activations `[rows, cols]` in GPU memory.
pub struct CudaTensor {
    pub buf: DeviceBuffer<f32>,
    pub rows: usize,
    pub cols: usize,
}

/// Positions of one step: on the GPU for the kernels, on the host for bookkeeping, plus the
/// RoPE (cos, sin) tables of this step, computed once per RoPE configuration.
pub struct CudaPositions {
    pub dev: DeviceBuffer<i32>,
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
}

impl CudaBackend {
    /// Opens GPU `ordinal` (a clear error when CUDA or the GPU is missing).
    pub fn new(ordinal: usize) -> Result<CudaBackend> {
        Ok(CudaBackend {
            device: Arc::new(CudaDevice::new(ordinal)?),
            gelu_table: Arc::new(OnceLock::new()),
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
        let key = RopeKey::of(rope);
        let mut tables = pos
            .rope_tables
            .lock()
            .map_err(|_| mismatch("rope", "table cache poisoned".into()))?;
        if let Some((_, t)) = tables.iter().find(|(k, _)| *k == key) {
            return Ok(t.clone());
        }
        let half = rope.n_rot / 2;
        let (mut cos, mut sin) = (vec![0f32; half], vec![0f32; half]);
        let mut table = Vec::with_capacity(pos.host.len() * half * 2);
        for &p in &pos.host {
            rope.angles(p, &mut cos, &mut sin);
            for (c, s) in cos.iter().zip(&sin) {
                table.push(*c);
                table.push(*s);
            }
        }
        let t = Arc::new(self.device.upload(&table)?);
        tables.push((key, t.clone()));
        Ok(t)
    }

    /// An output tensor for an op that writes all of it (every kernel here does; the GPU
    /// parity tests poison outputs to check exactly that), so it is not cleared first.
    fn tensor(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        Ok(CudaTensor {
            // SAFETY: see above: the op this is for writes every element before any read.
            buf: unsafe { self.device.uninit(rows * cols) }?,
            rows,
            cols,
        })
    }
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
        let as_i32: Vec<i32> = positions
            .iter()
            .map(|&p| i32::try_from(p).map_err(|_| mismatch("positions", format!("position {p}"))))
            .collect::<Result<_>>()?;
        Ok(CudaPositions {
            dev: self.device.upload(&as_i32)?,
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

    fn embed(&self, table: &DeviceMatrix, ids: &[u32], scale: Option<f32>) -> Result<CudaTensor> {
        let ids: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
        let mut out = self.tensor(ids.len(), table.cols)?;
        let dids = self.device.upload(&ids)?;
        ops::get_rows(
            &self.device,
            &mut out.buf,
            table,
            &dids,
            scale.unwrap_or(1.0),
        )?;
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
        ops::matvec(&self.device, &mut y.buf, w, &x.buf)?;
        if let Some(b) = bias {
            ops::add_bias(&self.device, &mut y.buf, b)?;
        }
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

    fn scale(&self, x: &mut CudaTensor, s: f32) -> Result<()> {
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

    fn glu(&self, gate: &CudaTensor, up: &CudaTensor, act: Activation) -> Result<CudaTensor> {
        let mut out = self.tensor(gate.rows, gate.cols)?;
        let kind = match act {
            Activation::Silu => Glu::Silu,
            Activation::GeluTanh => Glu::GeluTanh,
        };
        let table = match kind {
            Glu::GeluTanh => Some(self.gelu_table()?),
            Glu::Silu => None,
        };
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

    fn softcap(&self, x: &mut CudaTensor, cap: f32) -> Result<()> {
        Ok(ops::softcap(&self.device, &mut x.buf, cap)?)
    }
}
