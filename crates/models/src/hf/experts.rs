//! A Hugging Face checkpoint's mixture-of-experts tensors as llama.cpp's stacked ones.
//!
//! transformers 5 saves each layer's experts fused (`mlp.experts.gate_up_proj`
//! `[E, 2·ff, d]`, gate rows first, and `mlp.experts.down_proj` `[E, d, ff]`); published
//! checkpoints hold one tensor per expert (`mlp.experts.{e}.{gate,up,down}_proj.weight`, and
//! Mixtral's `block_sparse_moe.experts.{e}.{w1,w3,w2}.weight`). Either becomes
//! `blk.N.ffn_{gate,up}_exps.weight` `[E, ff, d]` and `ffn_down_exps.weight` `[E, d, ff]`, with
//! the router (`mlp.gate` / `block_sparse_moe.gate`) as `ffn_gate_inp.weight` `[E, d]`.

use std::collections::BTreeMap;

use synaptix_core::{Blob, DType, Shape};

/// Which part of a layer's experts a tensor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExpertPart {
    Router,
    /// All experts' gate and up projections, fused.
    GateUp,
    /// All experts' down projections.
    Down,
    Gate(usize),
    Up(usize),
    DownOf(usize),
}

/// The layer and expert part of a transformers tensor name (without the model prefix), if it
/// is one.
pub(crate) fn expert_part(name: &str) -> Option<(usize, ExpertPart)> {
    let rest = name.strip_prefix("layers.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let part = match part {
        "mlp.gate.weight" | "block_sparse_moe.gate.weight" => ExpertPart::Router,
        "mlp.experts.gate_up_proj" => ExpertPart::GateUp,
        "mlp.experts.down_proj" => ExpertPart::Down,
        _ => {
            let rest = part
                .strip_prefix("mlp.experts.")
                .or_else(|| part.strip_prefix("block_sparse_moe.experts."))?;
            let (e, which) = rest.split_once('.')?;
            let e: usize = e.parse().ok()?;
            match which {
                "gate_proj.weight" | "w1.weight" => ExpertPart::Gate(e),
                "up_proj.weight" | "w3.weight" => ExpertPart::Up(e),
                "down_proj.weight" | "w2.weight" => ExpertPart::DownOf(e),
                _ => return None,
            }
        }
    };
    Some((layer, part))
}

/// One stored tensor.
#[derive(Clone)]
pub(crate) struct Piece {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub blob: Blob,
}

/// A layer's expert tensors as they are found.
#[derive(Default)]
pub(crate) struct LayerExperts {
    parts: BTreeMap<(u8, usize), Piece>,
}

fn key(part: ExpertPart) -> (u8, usize) {
    match part {
        ExpertPart::Router => (0, 0),
        ExpertPart::GateUp => (1, 0),
        ExpertPart::Down => (2, 0),
        ExpertPart::Gate(e) => (3, e),
        ExpertPart::Up(e) => (4, e),
        ExpertPart::DownOf(e) => (5, e),
    }
}

type Tensor = (String, DType, Shape, Blob);

impl LayerExperts {
    pub fn add(&mut self, part: ExpertPart, piece: Piece) -> Result<(), String> {
        if self.parts.insert(key(part), piece).is_some() {
            return Err(format!("{part:?} appears twice"));
        }
        Ok(())
    }

    /// Experts `0..n_expert` of kind `kind` (3: gate, 4: up, 5: down) stacked into one
    /// `[n_expert, rows, cols]` tensor.
    fn stack(&self, kind: u8, n_expert: usize, what: &str) -> Result<Piece, String> {
        let mut bytes = Vec::new();
        let mut first: Option<&Piece> = None;
        for e in 0..n_expert {
            let p = self
                .parts
                .get(&(kind, e))
                .ok_or_else(|| format!("expert {e} has no {what} projection"))?;
            if let Some(f) = first {
                if f.dtype != p.dtype || f.shape != p.shape {
                    return Err(format!(
                        "expert {e}'s {what} projection is {} {:?}, expert 0's {} {:?}",
                        p.dtype, p.shape, f.dtype, f.shape
                    ));
                }
            }
            first.get_or_insert(p);
            bytes.extend_from_slice(p.blob.as_bytes());
        }
        let f = first.ok_or("no experts")?;
        if f.shape.len() != 2 {
            return Err(format!("{what} projections of rank {}", f.shape.len()));
        }
        Ok(Piece {
            dtype: f.dtype,
            shape: vec![n_expert, f.shape[0], f.shape[1]],
            blob: Blob::from_vec(bytes),
        })
    }

    /// The layer's GGUF tensors, `n_expert` experts each.
    pub fn assemble(self, layer: usize, n_expert: usize) -> Result<Vec<Tensor>, String> {
        let name = |n: &str| format!("blk.{layer}.{n}.weight");
        let router = self
            .parts
            .get(&key(ExpertPart::Router))
            .ok_or("no router")?;
        if router.shape.len() != 2 || router.shape[0] != n_expert {
            return Err(format!(
                "router of shape {:?} for {n_expert} experts",
                router.shape
            ));
        }
        let (gate, up) = match self.parts.get(&key(ExpertPart::GateUp)) {
            Some(fused) => {
                let &[e, rows, cols] = fused.shape.as_slice() else {
                    return Err(format!("gate_up_proj of shape {:?}", fused.shape));
                };
                if e != n_expert || rows % 2 != 0 || fused.dtype.block_len() != 1 {
                    return Err(format!(
                        "gate_up_proj of shape {:?} for {n_expert} experts",
                        fused.shape
                    ));
                }
                let half = rows / 2 * cols * fused.dtype.block_bytes();
                let all = fused.blob.as_bytes();
                let (mut g, mut u) = (Vec::with_capacity(all.len() / 2), Vec::new());
                u.reserve(all.len() / 2);
                for expert in all.chunks_exact(2 * half) {
                    g.extend_from_slice(&expert[..half]);
                    u.extend_from_slice(&expert[half..]);
                }
                let shape = vec![e, rows / 2, cols];
                let piece = |bytes| Piece {
                    dtype: fused.dtype,
                    shape: shape.clone(),
                    blob: Blob::from_vec(bytes),
                };
                (piece(g), piece(u))
            }
            None => (
                self.stack(3, n_expert, "gate")?,
                self.stack(4, n_expert, "up")?,
            ),
        };
        let down = match self.parts.get(&key(ExpertPart::Down)) {
            Some(d) => {
                if d.shape.len() != 3 || d.shape[0] != n_expert {
                    return Err(format!("down_proj of shape {:?}", d.shape));
                }
                d.clone()
            }
            None => self.stack(5, n_expert, "down")?,
        };
        let out = |n: &str, p: &Piece| {
            (
                name(n),
                p.dtype,
                Shape::new(p.shape.clone()),
                p.blob.clone(),
            )
        };
        Ok(vec![
            out("ffn_gate_inp", router),
            out("ffn_gate_exps", &gate),
            out("ffn_up_exps", &up),
            out("ffn_down_exps", &down),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_both_layouts() {
        assert_eq!(
            expert_part("layers.3.mlp.gate.weight"),
            Some((3, ExpertPart::Router))
        );
        assert_eq!(
            expert_part("layers.0.block_sparse_moe.experts.7.w3.weight"),
            Some((0, ExpertPart::Up(7)))
        );
        assert_eq!(
            expert_part("layers.1.mlp.experts.gate_up_proj"),
            Some((1, ExpertPart::GateUp))
        );
        assert_eq!(
            expert_part("layers.1.mlp.experts.2.down_proj.weight"),
            Some((1, ExpertPart::DownOf(2)))
        );
        assert_eq!(expert_part("layers.1.mlp.gate_proj.weight"), None);
    }

    #[test]
    fn fused_gate_up_splits_per_expert() {
        // 2 experts, ff 1, d 2 in F32: expert e rows: gate [e0, e1], up [e2, e3].
        let values: Vec<f32> = vec![0., 1., 2., 3., 10., 11., 12., 13.];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut le = LayerExperts::default();
        let piece = |shape: Vec<usize>, bytes: Vec<u8>| Piece {
            dtype: DType::F32,
            shape,
            blob: Blob::from_vec(bytes),
        };
        le.add(ExpertPart::Router, piece(vec![2, 2], vec![0; 16]))
            .unwrap();
        le.add(ExpertPart::GateUp, piece(vec![2, 2, 2], bytes))
            .unwrap();
        le.add(ExpertPart::Down, piece(vec![2, 2, 1], vec![0; 16]))
            .unwrap();
        let t = le.assemble(0, 2).unwrap();
        let f32s = |b: &Blob| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        assert_eq!(t[1].0, "blk.0.ffn_gate_exps.weight");
        assert_eq!(f32s(&t[1].3), vec![0., 1., 10., 11.]);
        assert_eq!(f32s(&t[2].3), vec![2., 3., 12., 13.]);
        assert_eq!(t[1].2.dims(), &[2, 1, 2]);
    }
}
