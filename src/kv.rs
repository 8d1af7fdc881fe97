//! KV-cache layout shared by every backend: which layers own a cache, how many slots each has,
//! and which slot holds a position.
//!
//! Sliding layers keep a ring of `sliding_window + max_chunk` slots: a prefill chunk of C tokens
//! at positions `[P, P+C)` writes C new entries while its first query still needs the W−1 before
//! P, so W−1+C distinct slots are needed (W+C keeps it simple). Full layers store positions
//! linearly up to the context length. KV-shared layers own nothing: they read their producer's
//! cache with their own mask. Entries are f32 `[slot][kv_head][head_dim]`.

use crate::config::{AttnKind, Config, KvSource};

/// One layer's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSpec {
    /// The layer that writes it.
    pub layer: usize,
    pub kind: AttnKind,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Number of slots (ring size for sliding layers, context length for full layers).
    pub slots: usize,
}

impl CacheSpec {
    /// f32 values of one slot (one position, all KV heads).
    pub fn slot_elems(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    /// Slot holding position `pos`.
    pub fn slot(&self, pos: usize) -> usize {
        pos % self.slots
    }
    /// Bytes of K plus V.
    pub fn bytes(&self) -> u64 {
        2 * 4 * (self.slots * self.slot_elems()) as u64
    }
}

/// The caches of a model for a given context and chunk size.
#[derive(Debug, Clone)]
pub struct KvLayout {
    pub caches: Vec<CacheSpec>,
    /// For each layer, the index into `caches` it reads (its own, or its producer's).
    pub read_cache: Vec<usize>,
    pub max_ctx: usize,
}

impl KvLayout {
    pub fn new(cfg: &Config, max_ctx: usize, max_chunk: usize) -> Self {
        let w = cfg.text.sliding_window;
        let caches: Vec<CacheSpec> = cfg
            .kv_owning_layers()
            .map(|l| CacheSpec {
                layer: l.index,
                kind: l.kind,
                n_kv_heads: l.n_kv_heads,
                head_dim: l.head_dim,
                slots: match l.kind {
                    AttnKind::Sliding => (w + max_chunk).min(max_ctx),
                    AttnKind::Full => max_ctx,
                },
            })
            .collect();
        let read_cache = cfg
            .layers
            .iter()
            .map(|l| {
                let owner = match l.kv {
                    KvSource::Own { .. } => l.index,
                    KvSource::Shared { producer } => producer,
                };
                match cfg.layers[owner].kv {
                    KvSource::Own { cache } => cache,
                    KvSource::Shared { .. } => unreachable!("producers own their cache"),
                }
            })
            .collect();
        KvLayout { caches, read_cache, max_ctx }
    }

    pub fn bytes(&self) -> u64 {
        self.caches.iter().map(|c| c.bytes()).sum()
    }

    /// The cache the MTP drafter reads for `kind` (its producer layer's, spec §3.2), checked to
    /// hold `positions` when `cached` positions are committed (and, in a ring, all at once).
    pub fn producer_cache(
        &self,
        cfg: &Config,
        kind: AttnKind,
        positions: &std::ops::Range<usize>,
        cached: usize,
    ) -> crate::error::Result<usize> {
        let layer = cfg.producer(kind).ok_or_else(|| {
            crate::error::Error::Invalid(format!(
                "the target has no cache-owning {kind:?} layer for the drafter to read"
            ))
        })?;
        let c = self.read_cache[layer];
        let cs = &self.caches[c];
        if positions.end > cached || (kind == AttnKind::Sliding && positions.len() > cs.slots) {
            return Err(crate::error::Error::Invalid(format!(
                "K/V of positions {positions:?} requested, the cache holds 0..{cached} (ring of {})",
                cs.slots
            )));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn e2b_layout() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-e2b/hf/config.json");
        let cfg = Config::from_file(&p).unwrap();
        let kv = KvLayout::new(&cfg, 4096, 128);
        assert_eq!(kv.caches.len(), 5);
        assert_eq!(kv.caches[0].slots, 16 + 128);
        assert_eq!(kv.caches[4].slots, 4096);
        assert_eq!(kv.read_cache[7], 3); // sliding consumer reads layer 3's cache
        assert_eq!(kv.read_cache[9], 4); // full consumer reads layer 4's cache
                                         // Distinct slots for any W-1+C consecutive positions.
        let c = kv.caches[0];
        let s: std::collections::HashSet<usize> = (1000..1000 + 15 + 128).map(|p| c.slot(p)).collect();
        assert_eq!(s.len(), 15 + 128);
    }
}
