use crate::{Backend, Result};

/// The KV caches of all layers on one backend, plus how many positions are filled.
pub struct KvCache<B: Backend> {
    pub layers: Vec<B::Kv>,
    pub capacity: usize,
    /// Positions `0..len` hold valid keys and values.
    pub len: usize,
    /// Unique for the life of the process: what a backend keys work recorded for this cache by
    /// (a recorded decode step refers to these layers' buffers).
    pub id: u64,
    /// The last operation on the cache was a decode step whose caller continues on its pick
    /// ([`crate::DecodeStep::continues`]); anything else clears it.
    pub chained: bool,
}

/// Source of [`KvCache::id`].
static NEXT_CACHE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl<B: Backend> KvCache<B> {
    /// `per_layer[i] = (n_kv_heads, head_dim)` of layer `i`.
    pub fn new(be: &B, per_layer: &[(usize, usize)], capacity: usize) -> Result<Self> {
        Ok(KvCache {
            layers: per_layer
                .iter()
                .map(|&(h, d)| be.kv(h, d, capacity))
                .collect::<Result<_>>()?,
            capacity,
            len: 0,
            id: NEXT_CACHE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            chained: false,
        })
    }

    /// Forgets positions `n..` (the next forward writes from `n`).
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
        self.chained = false;
    }
}
