//! The CPU backend: llama.cpp's portable arithmetic, bit for bit (see `docs/numerics.md`).

use rayon::prelude::*;
use synaptix_kernels_cpu::{dequantize, matmul, matmul_many, WeightView};

use crate::attention::{attend, LayerKv};
use crate::backend::Backend;
use crate::linear::loadable;
use crate::norm::rms_norm_row;
use crate::{Activation, AttentionSpec, NnError, Result, Rope, Weight};

/// Row-major `f32` activations.
#[derive(Debug, Clone)]
pub struct CpuTensor {
    pub data: Vec<f32>,
    pub cols: usize,
}

impl CpuTensor {
    pub fn rows(&self) -> usize {
        self.data.len() / self.cols.max(1)
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend;

/// Elementwise work (norms, activations) from this many values on is split over the rayon pool
/// (prefill); a decode step's single row stays on the calling thread.
const PARALLEL_ELEMENTS: usize = 64 * 1024;

fn mismatch(op: &'static str, detail: String) -> NnError {
    NnError::Kernel(synaptix_core::Error::ShapeMismatch { op, detail })
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Matrix = Weight;
    type Vector = Vec<f32>;
    type Kv = LayerKv;
    type Positions = Vec<usize>;

    fn name(&self) -> String {
        "cpu".into()
    }

    fn matrix(&self, w: &Weight) -> Result<Weight> {
        if w.shape.rank() != 2 || !loadable(w.dtype) {
            return Err(NnError::UnsupportedWeight {
                name: w.name.clone(),
                dtype: w.dtype,
            });
        }
        Ok(w.clone())
    }

    fn vector(&self, values: Vec<f32>) -> Result<Vec<f32>> {
        Ok(values)
    }

    fn kv(&self, n_kv_heads: usize, head_dim: usize, capacity: usize) -> Result<LayerKv> {
        LayerKv::new(n_kv_heads, head_dim, capacity)
    }

    fn positions(&self, positions: &[usize]) -> Result<Vec<usize>> {
        Ok(positions.to_vec())
    }

    fn shape(&self, x: &CpuTensor) -> (usize, usize) {
        (x.rows(), x.cols)
    }

    fn to_host(&self, x: &CpuTensor) -> Result<Vec<f32>> {
        Ok(x.data.clone())
    }

    fn upload(&self, values: Vec<f32>, rows: usize, cols: usize) -> Result<CpuTensor> {
        if values.len() != rows * cols {
            return Err(mismatch(
                "upload",
                format!("{} values for [{rows}, {cols}]", values.len()),
            ));
        }
        Ok(CpuTensor { data: values, cols })
    }

    fn embed(&self, table: &Weight, ids: &[u32], scale: Option<f32>) -> Result<CpuTensor> {
        let (vocab, dim) = (table.shape.dims()[0], table.shape.dims()[1]);
        let row_bytes = table.data.len() / vocab.max(1);
        let mut out = vec![0f32; ids.len() * dim];
        for (&id, dst) in ids.iter().zip(out.chunks_exact_mut(dim)) {
            let id = id as usize;
            if id >= vocab {
                return Err(NnError::Kernel(synaptix_core::Error::Invalid {
                    op: "embedding",
                    detail: format!("token id {id} is outside the vocabulary of {vocab}"),
                }));
            }
            dequantize(
                table.dtype,
                &table.data[id * row_bytes..(id + 1) * row_bytes],
                dst,
            )?;
        }
        if let Some(s) = scale {
            out.iter_mut().for_each(|v| *v *= s);
        }
        Ok(CpuTensor {
            data: out,
            cols: dim,
        })
    }

    fn linear(&self, x: &CpuTensor, w: &Weight, bias: Option<&Vec<f32>>) -> Result<CpuTensor> {
        let (n_out, n_in) = (w.shape.dims()[0], w.shape.dims()[1]);
        if x.cols != n_in {
            return Err(mismatch(
                "linear",
                format!("{} has {n_in} inputs, x has {}", w.name, x.cols),
            ));
        }
        let rows = x.rows();
        let mut y = vec![0f32; rows * n_out];
        let view = WeightView {
            dtype: w.dtype,
            data: w.data.as_bytes(),
            rows: n_out,
            cols: n_in,
        };
        matmul(view, &x.data, rows, &mut y)?;
        if let Some(b) = bias {
            for row in y.chunks_exact_mut(n_out) {
                row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
            }
        }
        Ok(CpuTensor {
            data: y,
            cols: n_out,
        })
    }

    /// One quantization of `x` and, for a single row, one parallel region for all matrices
    /// (`matmul_many`); the same values as separate [`Backend::linear`] calls.
    fn linear_many(
        &self,
        x: &CpuTensor,
        ws: &[(&Weight, Option<&Vec<f32>>)],
    ) -> Result<Vec<CpuTensor>> {
        let rows = x.rows();
        let mut views = Vec::with_capacity(ws.len());
        let mut outs = Vec::with_capacity(ws.len());
        for (w, _) in ws {
            let (n_out, n_in) = (w.shape.dims()[0], w.shape.dims()[1]);
            if x.cols != n_in {
                return Err(mismatch(
                    "linear",
                    format!("{} has {n_in} inputs, x has {}", w.name, x.cols),
                ));
            }
            views.push(WeightView {
                dtype: w.dtype,
                data: w.data.as_bytes(),
                rows: n_out,
                cols: n_in,
            });
            outs.push(vec![0f32; rows * n_out]);
        }
        {
            let mut ys: Vec<&mut [f32]> = outs.iter_mut().map(|y| y.as_mut_slice()).collect();
            matmul_many(&views, &x.data, rows, &mut ys)?;
        }
        Ok(outs
            .into_iter()
            .zip(ws)
            .map(|(mut y, (w, bias))| {
                let n_out = w.shape.dims()[0];
                if let Some(b) = bias {
                    for row in y.chunks_exact_mut(n_out) {
                        row.iter_mut().zip(b.iter()).for_each(|(v, b)| *v += b);
                    }
                }
                CpuTensor {
                    data: y,
                    cols: n_out,
                }
            })
            .collect())
    }

    fn rms_norm(&self, x: &CpuTensor, w: &Vec<f32>, eps: f32) -> Result<CpuTensor> {
        if w.is_empty() || !x.cols.is_multiple_of(w.len()) {
            return Err(mismatch(
                "rms_norm",
                format!("row of {} by weight of {}", x.cols, w.len()),
            ));
        }
        let mut y = x.clone();
        let norm = |row: &mut [f32]| rms_norm_row(row, w, eps);
        if y.data.len() >= PARALLEL_ELEMENTS {
            y.data.par_chunks_mut(w.len()).for_each(norm);
        } else {
            y.data.chunks_exact_mut(w.len()).for_each(norm);
        }
        Ok(y)
    }

    fn rope(
        &self,
        x: &mut CpuTensor,
        rope: &Rope,
        n_heads: usize,
        head_dim: usize,
        pos: &Vec<usize>,
    ) -> Result<()> {
        if x.cols != n_heads * head_dim || x.rows() != pos.len() {
            return Err(mismatch(
                "rope",
                format!(
                    "[{}, {}] for {n_heads}x{head_dim} at {} positions",
                    x.rows(),
                    x.cols,
                    pos.len()
                ),
            ));
        }
        rope.apply(&mut x.data, n_heads, head_dim, pos);
        Ok(())
    }

    fn scale(&self, x: &mut CpuTensor, s: f32) -> Result<()> {
        x.data.iter_mut().for_each(|v| *v *= s);
        Ok(())
    }

    fn add(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<()> {
        if x.data.len() != y.data.len() {
            return Err(mismatch(
                "add",
                format!("{} vs {} values", x.data.len(), y.data.len()),
            ));
        }
        if x.data.len() >= PARALLEL_ELEMENTS {
            x.data
                .par_chunks_mut(PARALLEL_ELEMENTS / 4)
                .zip(y.data.par_chunks(PARALLEL_ELEMENTS / 4))
                .for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(a, b)| *a += b));
        } else {
            x.data.iter_mut().zip(&y.data).for_each(|(a, b)| *a += b);
        }
        Ok(())
    }

    fn glu(&self, gate: &CpuTensor, up: &CpuTensor, act: Activation) -> Result<CpuTensor> {
        if gate.data.len() != up.data.len() || gate.cols != up.cols {
            return Err(mismatch(
                "glu",
                format!("gate {} vs up {}", gate.data.len(), up.data.len()),
            ));
        }
        let mut out = gate.clone();
        // Row by row, elementwise: the same values on any number of threads.
        let apply = |(g, u): (&mut [f32], &[f32])| match act {
            Activation::Silu => crate::attention_kernels::swiglu(g, u),
            Activation::GeluTanh => crate::attention_kernels::geglu(g, u),
        };
        let cols = gate.cols.max(1);
        if out.data.len() >= PARALLEL_ELEMENTS {
            out.data
                .par_chunks_mut(cols)
                .zip(up.data.par_chunks(cols))
                .for_each(apply);
        } else {
            out.data
                .chunks_mut(cols)
                .zip(up.data.chunks(cols))
                .for_each(apply);
        }
        Ok(out)
    }

    fn attention(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        kv: &mut LayerKv,
        pos: &Vec<usize>,
        spec: &AttentionSpec,
    ) -> Result<CpuTensor> {
        kv.write(&k.data, &v.data, pos)?;
        Ok(CpuTensor {
            data: attend(spec, &q.data, kv, pos),
            cols: q.cols,
        })
    }

    fn last_row(&self, mut x: CpuTensor) -> Result<CpuTensor> {
        let rows = x.rows();
        if rows > 1 {
            x.data.drain(..(rows - 1) * x.cols);
        }
        Ok(x)
    }

    fn argmax(&self, x: &CpuTensor) -> Result<u32> {
        let last = &x.data[x.data.len() - x.cols..];
        let mut best = 0usize;
        for (i, &v) in last.iter().enumerate() {
            if v > last[best] {
                best = i;
            }
        }
        Ok(best as u32)
    }

    fn softcap(&self, x: &mut CpuTensor, cap: f32) -> Result<()> {
        x.data.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
        Ok(())
    }
}
