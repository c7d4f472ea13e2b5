//! What every decoder-only model shares around its blocks: the token embedding, the final
//! norm and the output head (tied to the embedding when the file has no `output.weight`).

use synaptix_nn::{
    record, Backend, DecodeStep, Embedding, KvCache, Linear, RmsNorm, Tap, VarBuilder,
};

use synaptix_sample::DevicePick;

use crate::{next_positions, HParams, Logits, Result};

pub struct Trunk<B: Backend> {
    pub embedding: Embedding<B>,
    /// Multiplies embeddings (Gemma: `sqrt(n_embd)`).
    pub embed_scale: Option<f32>,
    pub output_norm: RmsNorm<B>,
    pub output: Linear<B>,
    /// `cap * tanh(logits / cap)` when set (final-logit soft-capping).
    pub final_softcap: Option<f32>,
}

impl<B: Backend> Trunk<B> {
    pub fn load(be: &B, vb: &VarBuilder, hp: &HParams, embed_scale: Option<f32>) -> Result<Self> {
        let embd = vb.get("token_embd.weight")?;
        let output = match vb.get_opt("output.weight")? {
            Some(w) => Linear::from_weight(be, &w, None, hp.n_vocab, hp.n_embd)?,
            None => Linear::from_weight(be, &embd, None, hp.n_vocab, hp.n_embd)?,
        };
        Ok(Trunk {
            embedding: Embedding::new(be, &embd, hp.n_vocab, hp.n_embd)?,
            embed_scale,
            output_norm: RmsNorm::load(be, vb, "output_norm", hp.n_embd, hp.rms_eps)?,
            output,
            final_softcap: None,
        })
    }

    /// Embeds `tokens`, runs `block` for every layer, then the head; returns the logits.
    pub fn run(
        &self,
        be: &B,
        tokens: &[u32],
        cache: &mut KvCache<B>,
        logits: Logits,
        tap: &mut dyn Tap,
        mut block: impl FnMut(
            usize,
            &mut B::Tensor,
            &B::Positions,
            &mut B::Kv,
            &mut dyn Tap,
        ) -> Result<()>,
    ) -> Result<B::Tensor> {
        let positions = be.positions(&next_positions(cache, tokens.len())?)?;
        let mut x = self.embedding.lookup(be, tokens, self.embed_scale)?;
        record(be, tap, "", "inp_embd", &x)?;
        for (il, kv) in cache.layers.iter_mut().enumerate() {
            block(il, &mut x, &positions, kv, tap)?;
        }
        cache.len += tokens.len();
        if logits == Logits::Last {
            x = be.last_row(x)?;
        }
        // The normalised rows exist on their own only when a tap wants them; otherwise the
        // backend may normalise inside the head's product.
        let mut out = if tap.wants("result_norm") {
            let x = self.output_norm.forward_for(be, &x, &[&self.output])?;
            record(be, tap, "", "result_norm", &x)?;
            self.output.forward(be, &x)?
        } else {
            let [out] = self
                .output_norm
                .forward_linear_many(be, &x, [&self.output])?;
            out
        };
        if let Some(cap) = self.final_softcap {
            be.softcap(&mut out, cap)?;
        }
        record(be, tap, "", "result_output", &out)?;
        Ok(out)
    }
}

/// The layers between the embedding and the head: what distinguishes one architecture.
pub trait Layers<B: Backend>: Send + Sync {
    /// Runs layer `il` on `x` in place.
    fn forward(
        &self,
        be: &B,
        il: usize,
        x: &mut B::Tensor,
        pos: &B::Positions,
        kv: &mut B::Kv,
        tap: &mut dyn Tap,
    ) -> Result<()>;
}

/// A decoder-only model: the shared trunk around an architecture's layers, on a backend.
pub struct Decoder<B: Backend, L> {
    pub(crate) be: B,
    pub(crate) info: crate::ModelInfo,
    pub(crate) trunk: Trunk<B>,
    pub(crate) layers: L,
}

impl<B: Backend, L: Layers<B>> Decoder<B, L> {
    fn logits(
        &self,
        tokens: &[u32],
        cache: &mut KvCache<B>,
        logits: Logits,
        tap: &mut dyn Tap,
    ) -> Result<B::Tensor> {
        cache.chained = false;
        let (be, layers) = (&self.be, &self.layers);
        self.trunk
            .run(be, tokens, cache, logits, tap, |il, x, pos, kv, tap| {
                layers.forward(be, il, x, pos, kv, tap)
            })
    }
}

impl<B: Backend, L: Layers<B>> crate::CausalLm for Decoder<B, L> {
    fn info(&self) -> &crate::ModelInfo {
        &self.info
    }

    fn device(&self) -> String {
        self.be.name()
    }

    fn new_cache(&self, n_ctx: usize) -> Result<Box<dyn crate::Cache>> {
        Ok(Box::new(KvCache::new(
            &self.be,
            &self.info.hparams.kv_layout(),
            n_ctx,
        )?))
    }

    fn forward(
        &self,
        tokens: &[u32],
        cache: &mut dyn crate::Cache,
        logits: Logits,
        tap: &mut dyn Tap,
    ) -> Result<Vec<f32>> {
        let out = self.logits(tokens, crate::own_cache::<B>(cache)?, logits, tap)?;
        Ok(self.be.to_host(&out)?)
    }

    fn forward_pick(
        &self,
        tokens: &[u32],
        cache: &mut dyn crate::Cache,
        pick: &DevicePick,
    ) -> Result<Vec<(u32, f32)>> {
        self.forward_pick_more(tokens, cache, pick, false)
    }

    fn forward_pick_more(
        &self,
        tokens: &[u32],
        cache: &mut dyn crate::Cache,
        pick: &DevicePick,
        more: bool,
    ) -> Result<Vec<(u32, f32)>> {
        let kv = crate::own_cache::<B>(cache)?;
        let follows = std::mem::take(&mut kv.chained);
        let [token] = *tokens else {
            let out = self.logits(tokens, kv, Logits::Last, &mut synaptix_nn::NoTap)?;
            return Ok(self.be.pick(out, pick)?);
        };
        // One token: the backend may replay a recording of this step instead of running it.
        let len = kv.len;
        let key = DecodeStep {
            cache_id: kv.id,
            token,
            position: len,
            // The step after this one must fit in the cache.
            continues: more && pick.top_k == 0 && pick.penalties.is_none() && len + 1 < kv.capacity,
            follows,
        };
        let mut failure = None;
        let picked = self.be.decode_step(key, pick, &mut || {
            kv.len = len;
            let out = self
                .logits(tokens, kv, Logits::Last, &mut synaptix_nn::NoTap)
                .map_err(|e| {
                    let message = e.to_string();
                    failure = Some(e);
                    synaptix_nn::NnError::Step(message)
                })?;
            self.be.pick(out, pick)
        });
        match (picked, failure) {
            (Ok(t), _) => {
                kv.len = len + 1;
                kv.chained = key.continues;
                Ok(t)
            }
            (Err(_), Some(model_error)) => Err(model_error),
            (Err(e), None) => Err(e.into()),
        }
    }
}
