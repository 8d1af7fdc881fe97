//! The MoE expert streamer, shared by every backend: routed experts live in an installation's
//! per-layer files (the loader's [`ExpertFiles`]) and pass through a bounded per-layer slot cache
//! ([`policy::LayerCache`], LFU with recency as tie-break). A backend owns the slot memory (GPU
//! buffer regions, or host memory for the CPU reference); the [`Streamer`] decides which expert
//! sits in which slot, reads the misses with positional reads (distinct misses in parallel) and
//! hands each one's bytes to the backend's `write(slot, blob)`.
//!
//! A step whose experts do not all fit at once (a prefill chunk routes to more distinct experts
//! than there are slots, or top-k > slots) runs in *rounds*: [`Streamer::rounds`] splits the
//! distinct experts into groups of at most `n_slots` (already-resident experts first, so they are
//! not evicted by the step's own misses), and the backend runs its routed kernels once per round
//! with the pairs of other rounds marked [`SKIP`].

pub mod policy;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
pub use crate::loader::ExpertFiles;
pub use policy::{CacheStats, Fill, LayerCache, PlanError, SlotPlan};

/// Slot-table entry of a (token, expert) pair that the current round does not compute.
pub const SKIP: u32 = u32::MAX;

/// Distinct misses read concurrently.
const PARALLEL_READS: usize = 8;

/// How many expert slots a layer gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertSlots {
    /// Every expert resident (loaded once at start, no streaming).
    All,
    /// A bounded cache of this many slots per layer.
    Some(usize),
}

impl std::str::FromStr for ExpertSlots {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "all" {
            return Ok(ExpertSlots::All);
        }
        match s.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(ExpertSlots::Some(n)),
            _ => Err(format!("`{s}` is not a slot count: use a number ≥ 1 or `all`")),
        }
    }
}

/// What streaming cost so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StreamStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub bytes_read: u64,
    /// Wall time spent reading (and copying out) misses.
    pub io_time: Duration,
    /// Tokens routed (counted once per step, not per layer).
    pub tokens: u64,
}

impl StreamStats {
    pub fn hit_rate(&self) -> f64 {
        CacheStats { hits: self.hits, misses: self.misses, evictions: self.evictions }.hit_rate()
    }
    pub fn bytes_per_token(&self) -> f64 {
        if self.tokens == 0 {
            0.0
        } else {
            self.bytes_read as f64 / self.tokens as f64
        }
    }
    pub fn io_ms_per_token(&self) -> f64 {
        if self.tokens == 0 {
            0.0
        } else {
            self.io_time.as_secs_f64() * 1e3 / self.tokens as f64
        }
    }
    /// The figures accumulated after `before` was taken.
    pub fn since(&self, before: &StreamStats) -> StreamStats {
        StreamStats {
            hits: self.hits - before.hits,
            misses: self.misses - before.misses,
            evictions: self.evictions - before.evictions,
            bytes_read: self.bytes_read - before.bytes_read,
            io_time: self.io_time.saturating_sub(before.io_time),
            tokens: self.tokens - before.tokens,
        }
    }
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "hit_rate": self.hit_rate(),
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
            "bytes_read": self.bytes_read,
            "bytes_read_per_token": self.bytes_per_token(),
            "io_ms_per_token": self.io_ms_per_token(),
            "tokens": self.tokens,
        })
    }
}

/// Slot caches of every MoE layer over one installation's expert files.
pub struct Streamer {
    files: std::sync::Arc<ExpertFiles>,
    caches: BTreeMap<usize, LayerCache>,
    /// Id of the next planned use of slots (see `policy` on fences).
    fence: u64,
    bytes_read: u64,
    io_time: Duration,
    tokens: u64,
    bufs: Vec<Vec<u8>>,
}

impl Streamer {
    pub fn new(files: std::sync::Arc<ExpertFiles>, n_slots: usize) -> Self {
        let caches =
            files.layout.layers.keys().map(|&l| (l, LayerCache::new(files.layout.n_experts, n_slots))).collect();
        Streamer { files, caches, fence: 0, bytes_read: 0, io_time: Duration::ZERO, tokens: 0, bufs: Vec::new() }
    }

    pub fn files(&self) -> &ExpertFiles {
        &self.files
    }

    /// Slots per layer (the request clamped to the expert count).
    pub fn n_slots(&self) -> usize {
        self.caches.values().next().map_or(0, |c| c.n_slots())
    }

    /// Counts the tokens of one step (for per-token figures).
    pub fn count_tokens(&mut self, n: usize) {
        self.tokens += n as u64;
    }

    /// Groups the distinct experts of `pairs` (expert per (token, k)) into rounds of at most
    /// `n_slots`, the already-resident ones first.
    pub fn rounds(&self, layer: usize, pairs: &[u32]) -> Vec<Vec<u32>> {
        let cache = &self.caches[&layer];
        let mut distinct: Vec<u32> = Vec::new();
        for &e in pairs {
            if !distinct.contains(&e) {
                distinct.push(e);
            }
        }
        // Stable: first-request order within each class.
        distinct.sort_by_key(|&e| cache.slot_of(e).is_none());
        distinct.chunks(cache.n_slots()).map(|c| c.to_vec()).collect()
    }

    /// Makes `round`'s experts resident in `layer`'s slots: plans, reads the misses (up to
    /// `PARALLEL_READS` at once) and hands each to `write(slot, blob)`. Returns the slot of every
    /// pair, [`SKIP`] for pairs of experts outside `round`.
    ///
    /// Callers write slots through their device queue in submission order (wgpu's
    /// `queue.write_buffer` lands after all earlier submissions, WebGPU's queue timeline), or
    /// synchronously (CPU), so every earlier use of a slot is complete before its overwrite:
    /// `completed` is always the previous fence here. The policy still pins each round's slots, so
    /// no round evicts an expert it needs itself.
    pub fn load(
        &mut self,
        layer: usize,
        round: &[u32],
        pairs: &[u32],
        write: &mut dyn FnMut(u32, &[u8]) -> Result<()>,
    ) -> Result<Vec<u32>> {
        self.files.ensure_verified(layer)?;
        self.fence += 1;
        let cache = self
            .caches
            .get_mut(&layer)
            .ok_or_else(|| Error::Invalid(format!("layer {layer} is not a MoE layer of this installation")))?;
        let plan =
            cache.plan(round, self.fence, self.fence - 1).map_err(|e| Error::Invalid(format!("layer {layer}: {e}")))?;
        let t0 = Instant::now();
        for batch in plan.fills.chunks(PARALLEL_READS) {
            self.bufs.resize_with(batch.len().max(self.bufs.len()), Vec::new);
            let files = &self.files;
            let results: Vec<Result<()>> = if batch.len() == 1 {
                vec![files.read(layer, batch[0].expert, &mut self.bufs[0])]
            } else {
                std::thread::scope(|s| {
                    let handles: Vec<_> = batch
                        .iter()
                        .zip(self.bufs.iter_mut())
                        .map(|(f, buf)| s.spawn(move || files.read(layer, f.expert, buf)))
                        .collect();
                    handles.into_iter().map(|h| h.join().expect("reader threads do not panic")).collect()
                })
            };
            for r in results {
                r?;
            }
            for (i, f) in batch.iter().enumerate() {
                write(f.slot, &self.bufs[i])?;
                self.bytes_read += self.bufs[i].len() as u64;
            }
        }
        self.io_time += t0.elapsed();
        let mut slot_of = BTreeMap::new();
        for (&e, &s) in round.iter().zip(&plan.slots) {
            slot_of.insert(e, s);
        }
        Ok(pairs.iter().map(|e| slot_of.get(e).copied().unwrap_or(SKIP)).collect())
    }

    pub fn stats(&self) -> StreamStats {
        let mut s = StreamStats {
            bytes_read: self.bytes_read,
            io_time: self.io_time,
            tokens: self.tokens,
            ..Default::default()
        };
        for c in self.caches.values() {
            let cs = c.stats();
            s.hits += cs.hits;
            s.misses += cs.misses;
            s.evictions += cs.evictions;
        }
        s
    }
}
