//! What every decoder-only model shares around its blocks: the token embedding, the final
//! norm and the output head (tied to the embedding when the file has no `output.weight`).

use synaptix_nn::{record, Embedding, KvCache, LayerKv, Linear, RmsNorm, Tap, VarBuilder};

use crate::{next_positions, HParams, Logits, Result};

pub(crate) struct Trunk {
    pub embedding: Embedding,
    /// Multiplies embeddings (Gemma: `sqrt(n_embd)`).
    pub embed_scale: Option<f32>,
    pub output_norm: RmsNorm,
    pub output: Linear,
}

impl Trunk {
    pub fn load(vb: &VarBuilder, hp: &HParams, embed_scale: Option<f32>) -> Result<Trunk> {
        let embd = vb.get("token_embd.weight")?;
        let output = match vb.get_opt("output.weight")? {
            Some(w) => Linear::from_weight(w, None, hp.n_vocab, hp.n_embd)?,
            None => Linear::from_weight(embd.clone(), None, hp.n_vocab, hp.n_embd)?,
        };
        Ok(Trunk {
            embedding: Embedding::new(embd, hp.n_vocab, hp.n_embd)?,
            embed_scale,
            output_norm: RmsNorm::load(vb, "output_norm", hp.n_embd, hp.rms_eps)?,
            output,
        })
    }

    /// Embeds `tokens`, runs `block` for every layer, then the head.
    pub fn run(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        logits: Logits,
        tap: &mut dyn Tap,
        mut block: impl FnMut(usize, &mut [f32], &[usize], &mut LayerKv, &mut dyn Tap) -> Result<()>,
    ) -> Result<Vec<f32>> {
        let positions = next_positions(cache, tokens.len())?;
        let dim = self.embedding.dim();
        let mut x = self.embedding.lookup(tokens)?;
        if let Some(s) = self.embed_scale {
            x.iter_mut().for_each(|v| *v *= s);
        }
        record(tap, "", "inp_embd", tokens.len(), &x);
        for (il, kv) in cache.layers.iter_mut().enumerate() {
            block(il, &mut x, &positions, kv, tap)?;
        }
        cache.len += tokens.len();
        let rows = match logits {
            Logits::All => tokens.len(),
            Logits::Last => {
                x.drain(..(tokens.len() - 1) * dim);
                1
            }
        };
        self.output_norm.forward_inplace(&mut x);
        record(tap, "", "result_norm", rows, &x);
        let out = self.output.forward(&x, rows)?;
        record(tap, "", "result_output", rows, &out);
        Ok(out)
    }
}
