//! The policy half of the MoE expert streamer: which expert sits in which cache slot, what must be
//! read before a step, and what may be evicted. Pure bookkeeping: no GPU, no files.
//!
//! A MoE layer has `n_experts` experts (128 on 26B-A4B) of which the router picks a few per token
//! (8). Expert weights stream from per-layer files into a bounded per-layer cache of `n_slots`
//! slots (default 16, `--expert-slots`); a slot is a fixed region of a few long-lived GPU buffers,
//! so "loading an expert" means "writing its bytes into a slot's region". [`LayerCache::plan`]
//! turns one step's routed experts into a slot index per expert plus the list of [`Fill`]s (misses)
//! the caller must read before submitting the routed kernel.
//!
//! # Eviction: LFU, recency as tie-break
//! A miss takes a free slot if there is one, otherwise evicts the resident expert with the lowest
//! use count; ties go to the least recently used, then to the lowest slot index (deterministic, so
//! runs are reproducible). Routing in these models is skewed and sticky over a sequence: some
//! experts are picked far more often than others, and pure recency (LRU) evicts a hot expert after
//! one unlucky burst of others. Peers measured LRU → LFU at +3% decode throughput.
//!
//! Counts belong to the slot (reset to 1 when an expert is filled), i.e. frequency *while
//! resident*: that is the design we were given and keeps state at O(n_slots).
//!
//! # Aging
//! Counts are halved every `age_period` successful plans ([`DEFAULT_AGE_PERIOD`]). Without aging an
//! expert that was hot early (say, during a system prompt on another topic) would keep a count no
//! newcomer can reach and squat its slot forever; a saturating counter would not fix that (it just
//! stops growing). Halving turns the count into an exponentially decaying frequency with a
//! half-life of `age_period` steps, and bounds it: between halvings a count grows by at most
//! `age_period` (one bump per plan), so it never exceeds `2 * age_period`; the `u32` cannot
//! overflow for any `age_period` ≤ 2³¹ (the add is saturating anyway, as a belt).
//!
//! # GPU safety
//! Every slot a step uses (hit or fill) is pinned with that step's submission `fence`. A slot is an
//! eviction candidate only when its newest reader fence ≤ `completed` (the newest fence the GPU has
//! finished): overwriting it earlier would change weights under a kernel that is still reading
//! them. Since every write to a slot happens for a plan, and the plan pins it with a fence newer than
//! `completed`, the same rule also keeps two writes to one slot from being in flight together. Experts
//! requested by the same step are never evicted (the step needs them all at once).
//!
//! A failed plan changes nothing (hits are not counted, nothing is evicted), so the caller can wait
//! for the GPU (see [`PlanError::AllSlotsInFlight`]'s `wait_for`) and call `plan` again.

/// Default number of plans between halvings of the use counts. A guess, not a measurement: long
/// enough (tens of tokens) that a count reflects more than a burst, short enough that an expert
/// gone cold loses its slot within a few hundred tokens. Tune with [`LayerCache::with_age_period`].
pub const DEFAULT_AGE_PERIOD: u32 = 64;

/// Where an expert's weights are for one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotPlan {
    /// Slot of each requested expert, in request order (duplicates get the same slot).
    pub slots: Vec<u32>,
    /// Misses to read before the step, one per distinct missing expert, each to a distinct slot.
    pub fills: Vec<Fill>,
}

/// One miss: read `expert`'s weights into `slot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fill {
    pub expert: u32,
    pub slot: u32,
    /// The expert that held `slot` before (now no longer resident), if any.
    pub evicted: Option<u32>,
}

/// Hit/miss/eviction counters, per distinct expert per step (a duplicate within one request is
/// not counted twice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Misses that displaced a resident expert (misses into free slots are not evictions).
    pub evictions: u64,
}

impl CacheStats {
    /// hits / (hits + misses); 0 before any request.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

/// Why a step could not be planned. The cache is unchanged in every case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The step needs more distinct experts at once than there are slots. Not retryable: split the
    /// step (e.g. a prefill chunk) into smaller ones, or raise `--expert-slots`.
    #[error("a step needs {requested} distinct experts but the layer cache has only {slots} slots: split the step or raise --expert-slots")]
    TooManyExperts { requested: usize, slots: usize },
    /// Enough slots exist, but too few are free of queued GPU work. Retryable: wait until the GPU
    /// has completed fence `wait_for`, then call `plan` again with that `completed`; it will succeed.
    #[error("{needed} slots needed but only {available} are not read by in-flight GPU work: wait for fence {wait_for} and retry")]
    AllSlotsInFlight { needed: usize, available: usize, wait_for: u64 },
    /// The router produced an expert index the layer does not have (a corrupt router or config).
    #[error("expert {expert} out of range: the layer has {n_experts} experts")]
    ExpertOutOfRange { expert: u32, n_experts: usize },
}

impl PlanError {
    /// True when waiting for the GPU and retrying the same plan will succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, PlanError::AllSlotsInFlight { .. })
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    expert: Option<u32>,
    /// Uses while resident, halved every `age_period` plans.
    count: u32,
    /// `clock` of the last plan that used this slot.
    last_use: u64,
    /// Newest GPU fence that reads this slot; reusable once `completed >= pinned_until`.
    pinned_until: u64,
}

/// One MoE layer's expert slot cache (policy only).
#[derive(Debug, Clone)]
pub struct LayerCache {
    n_experts: usize,
    slots: Vec<Slot>,
    /// Expert → slot, `None` when not resident. Inverse of `Slot::expert`.
    slot_of: Vec<Option<u32>>,
    /// Expert → `clock` of the last plan that requested it. Marks "requested by this step" without
    /// clearing a set per plan.
    requested: Vec<u64>,
    /// Advanced on every `plan` call, failed ones included, so stale `requested` marks left by a
    /// failed plan never match the retry.
    clock: u64,
    age_period: u32,
    plans_since_aging: u32,
    stats: CacheStats,
}

impl LayerCache {
    /// A cache of `n_slots` slots for a layer of `n_experts` experts, all slots empty.
    ///
    /// `n_slots` is clamped to `n_experts`: extra slots could never be used, so the caller should
    /// size its GPU buffers from [`n_slots`](Self::n_slots), not from what it asked for. With
    /// `n_slots ≥ n_experts` everything fits and nothing is ever evicted.
    ///
    /// # Panics
    /// If `n_experts` or `n_slots` is 0 (a configuration bug, checked where the CLI parses it).
    pub fn new(n_experts: usize, n_slots: usize) -> Self {
        assert!(n_experts >= 1, "a MoE layer needs at least one expert");
        assert!(n_slots >= 1, "the expert cache needs at least one slot");
        assert!(n_experts <= u32::MAX as usize);
        let n_slots = n_slots.min(n_experts);
        LayerCache {
            n_experts,
            slots: vec![Slot::default(); n_slots],
            slot_of: vec![None; n_experts],
            requested: vec![0; n_experts],
            clock: 0,
            age_period: DEFAULT_AGE_PERIOD,
            plans_since_aging: 0,
            stats: CacheStats::default(),
        }
    }

    /// Sets the number of successful plans between halvings of the use counts (≥ 1).
    pub fn with_age_period(mut self, age_period: u32) -> Self {
        assert!(age_period >= 1, "age_period must be at least 1");
        self.age_period = age_period;
        self
    }

    /// Usable slots (the requested count clamped to `n_experts`).
    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    pub fn n_experts(&self) -> usize {
        self.n_experts
    }

    /// Plans one step that needs `experts` (distinct or not; duplicates share a slot). `fence` is
    /// the id of the GPU submission that will read these slots (must be newer than `completed`);
    /// `completed` is the newest fence the GPU has finished.
    ///
    /// Hits bump frequency and recency. Misses take a free slot, else evict the resident expert
    /// with the lowest use count, ties → least recently used, ties → lowest slot; never evicting an
    /// expert requested by this same step, nor a slot whose last reader fence > `completed`.
    /// Fills are listed in first-request order of the missing experts.
    ///
    /// On `Err` nothing changed: [`PlanError::AllSlotsInFlight`] means wait for the GPU and retry.
    pub fn plan(&mut self, experts: &[u32], fence: u64, completed: u64) -> Result<SlotPlan, PlanError> {
        debug_assert!(
            fence > completed,
            "fence {fence} of an unsubmitted step must be newer than completed {completed}"
        );
        for &e in experts {
            if e as usize >= self.n_experts {
                return Err(PlanError::ExpertOutOfRange { expert: e, n_experts: self.n_experts });
            }
        }
        self.clock += 1;
        let now = self.clock;

        // Distinct experts in first-occurrence order; `requested` marks them for the victim filter.
        let mut distinct = Vec::with_capacity(experts.len());
        for &e in experts {
            if self.requested[e as usize] != now {
                self.requested[e as usize] = now;
                distinct.push(e);
            }
        }
        if distinct.len() > self.slots.len() {
            return Err(PlanError::TooManyExperts { requested: distinct.len(), slots: self.slots.len() });
        }
        let misses: Vec<u32> = distinct.iter().copied().filter(|&e| self.slot_of[e as usize].is_none()).collect();

        // Victims, best first. Free slots sort before occupied ones (`false < true`): filling an
        // empty slot costs no resident expert.
        let mut candidates: Vec<(bool, u32, u64, u32)> = Vec::new();
        if !misses.is_empty() {
            for (i, s) in self.slots.iter().enumerate() {
                let requested_now = s.expert.is_some_and(|e| self.requested[e as usize] == now);
                if !requested_now && s.pinned_until <= completed {
                    candidates.push((s.expert.is_some(), s.count, s.last_use, i as u32));
                }
            }
            if candidates.len() < misses.len() {
                // Slots not needed by this step: there are at least `misses` of them (distinct ≤
                // n_slots), so waiting for the misses-th oldest reader fence frees enough.
                let mut fences: Vec<u64> = self
                    .slots
                    .iter()
                    .filter(|s| s.expert.is_none_or(|e| self.requested[e as usize] != now))
                    .map(|s| s.pinned_until)
                    .collect();
                fences.sort_unstable();
                return Err(PlanError::AllSlotsInFlight {
                    needed: misses.len(),
                    available: candidates.len(),
                    wait_for: fences[misses.len() - 1],
                });
            }
            candidates.sort_unstable();
        }

        // Commit: nothing below can fail.
        for &e in &distinct {
            if let Some(si) = self.slot_of[e as usize] {
                let s = &mut self.slots[si as usize];
                s.count = s.count.saturating_add(1);
                s.last_use = now;
                s.pinned_until = s.pinned_until.max(fence);
                self.stats.hits += 1;
            }
        }
        let mut fills = Vec::with_capacity(misses.len());
        for (&e, &(_, _, _, si)) in misses.iter().zip(&candidates) {
            let s = &mut self.slots[si as usize];
            let evicted = s.expert;
            if let Some(old) = evicted {
                self.slot_of[old as usize] = None;
                self.stats.evictions += 1;
            }
            *s = Slot { expert: Some(e), count: 1, last_use: now, pinned_until: s.pinned_until.max(fence) };
            self.slot_of[e as usize] = Some(si);
            self.stats.misses += 1;
            fills.push(Fill { expert: e, slot: si, evicted });
        }
        let slots =
            experts.iter().map(|&e| self.slot_of[e as usize].expect("every requested expert is resident")).collect();

        self.plans_since_aging += 1;
        if self.plans_since_aging >= self.age_period {
            self.plans_since_aging = 0;
            for s in &mut self.slots {
                s.count /= 2;
            }
        }
        Ok(SlotPlan { slots, fills })
    }

    /// The slot holding `expert`, if resident (out-of-range experts are not resident).
    pub fn slot_of(&self, expert: u32) -> Option<u32> {
        self.slot_of.get(expert as usize).copied().flatten()
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    pub fn reset_stats(&mut self) {
        self.stats = CacheStats::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Plans with the GPU fully caught up (nothing in flight).
    fn idle(c: &mut LayerCache, experts: &[u32]) -> SlotPlan {
        let f = c.clock + 1;
        c.plan(experts, f + 1_000_000, f + 999_999).unwrap()
    }

    fn evicted(p: &SlotPlan) -> Vec<Option<u32>> {
        p.fills.iter().map(|f| f.evicted).collect()
    }

    #[test]
    fn hits_and_misses_are_counted() {
        let mut c = LayerCache::new(8, 4);
        let p = idle(&mut c, &[0, 1]);
        assert_eq!(p.fills.len(), 2);
        let p = idle(&mut c, &[1, 2]);
        assert_eq!(p.fills, vec![Fill { expert: 2, slot: 2, evicted: None }]);
        assert_eq!(p.slots, vec![1, 2]);
        assert_eq!(c.stats(), CacheStats { hits: 1, misses: 3, evictions: 0 });
        assert!((c.stats().hit_rate() - 0.25).abs() < 1e-12);
        c.reset_stats();
        assert_eq!(c.stats(), CacheStats::default());
        assert_eq!(c.stats().hit_rate(), 0.0);
        assert_eq!(c.slot_of(2), Some(2));
        assert_eq!(c.slot_of(3), None);
        assert_eq!(c.slot_of(99), None);
    }

    #[test]
    fn evicts_lowest_count_first() {
        let mut c = LayerCache::new(8, 3);
        idle(&mut c, &[0, 1, 2]);
        idle(&mut c, &[0, 2]);
        idle(&mut c, &[0]);
        idle(&mut c, &[2]);
        // Counts 0 → 3, 2 → 3. Make 1 the most recent (count 2) so only the count can pick it.
        idle(&mut c, &[1]);
        let p = idle(&mut c, &[5]);
        assert_eq!(evicted(&p), vec![Some(1)]);
        // 0 and 2 now at 4, 5 at 1: 5 goes next although it is the most recently used.
        idle(&mut c, &[0, 2]);
        let p = idle(&mut c, &[6]);
        assert_eq!(evicted(&p), vec![Some(5)]);
        assert_eq!(c.stats().evictions, 2);
    }

    #[test]
    fn ties_go_to_least_recent_then_lowest_slot() {
        let mut c = LayerCache::new(8, 3);
        idle(&mut c, &[0]);
        idle(&mut c, &[1]);
        idle(&mut c, &[2]);
        // All count 1: the least recently used (0) goes, then 1.
        assert_eq!(evicted(&idle(&mut c, &[3])), vec![Some(0)]);
        assert_eq!(evicted(&idle(&mut c, &[4])), vec![Some(1)]);

        // Same count, same recency: lowest slot, not lowest expert id.
        let mut c = LayerCache::new(8, 3);
        let p = idle(&mut c, &[2, 1, 0]);
        assert_eq!(p.slots, vec![0, 1, 2]);
        let p = idle(&mut c, &[5]);
        assert_eq!(p.fills, vec![Fill { expert: 5, slot: 0, evicted: Some(2) }]);
    }

    #[test]
    fn duplicates_share_a_slot_and_one_fill() {
        let mut c = LayerCache::new(8, 4);
        let p = idle(&mut c, &[3, 3, 1, 3]);
        assert_eq!(p.fills.len(), 2);
        assert_eq!(p.slots[0], p.slots[1]);
        assert_eq!(p.slots[0], p.slots[3]);
        assert_ne!(p.slots[0], p.slots[2]);
        assert_eq!(c.stats(), CacheStats { hits: 0, misses: 2, evictions: 0 });
        // Duplicates count as one use, and do not count against the slot budget.
        assert_eq!(c.slots[p.slots[0] as usize].count, 1);
        let mut c = LayerCache::new(8, 1);
        assert_eq!(idle(&mut c, &[4, 4, 4]).fills.len(), 1);
    }

    #[test]
    fn never_evicts_an_expert_of_the_same_step() {
        let mut c = LayerCache::new(8, 3);
        idle(&mut c, &[0, 1, 2]);
        idle(&mut c, &[1, 2]);
        idle(&mut c, &[1, 2]);
        // 0 is the obvious victim (count 1, oldest) but this step needs it: 1 or 2 must go.
        let p = idle(&mut c, &[0, 7]);
        assert_eq!(p.fills.len(), 1);
        assert_ne!(p.fills[0].evicted, Some(0));
        assert_eq!(c.slot_of(0), Some(p.slots[0]));
        // Full-width request of fresh experts plus residents: only non-requested residents go.
        let mut c = LayerCache::new(8, 4);
        idle(&mut c, &[0, 1, 2, 3]);
        let p = idle(&mut c, &[3, 4, 0, 5]);
        let ev: HashSet<_> = evicted(&p).into_iter().collect();
        assert_eq!(ev, HashSet::from([Some(1), Some(2)]));
    }

    #[test]
    fn in_flight_slots_are_not_reused() {
        let mut c = LayerCache::new(8, 2);
        c.plan(&[0], 5, 0).unwrap(); // slot 0 read by fence 5
        c.plan(&[1], 6, 0).unwrap(); // slot 1 read by fence 6
        let before = (c.slot_of.clone(), c.stats());
        let err = c.plan(&[2], 7, 4).unwrap_err();
        assert_eq!(err, PlanError::AllSlotsInFlight { needed: 1, available: 0, wait_for: 5 });
        assert!(err.is_retryable());
        // A failed plan changed nothing.
        assert_eq!((c.slot_of.clone(), c.stats()), before);
        // Fence 5 done: slot 0 is reusable, slot 1 (fence 6) is not: two misses do not fit.
        let err = c.plan(&[2, 3], 7, 5).unwrap_err();
        assert_eq!(err, PlanError::AllSlotsInFlight { needed: 2, available: 1, wait_for: 6 });
        let p = c.plan(&[2], 7, 5).unwrap();
        assert_eq!(p.fills, vec![Fill { expert: 2, slot: 0, evicted: Some(0) }]);
        // Slot 0 is now read by fence 7, slot 1 by 6: with completed 6 only slot 1 can go.
        let p = c.plan(&[3], 8, 6).unwrap();
        assert_eq!(p.fills[0].slot, 1);
        // A hit re-pins: slot of expert 2 is read by fence 9, so with completed 8 only slot 1
        // (expert 3, fence 8) is free.
        c.plan(&[2], 9, 7).unwrap();
        let p = c.plan(&[4], 10, 8).unwrap();
        assert_eq!(p.fills, vec![Fill { expert: 4, slot: 1, evicted: Some(3) }]);
        // Retry after waiting for the reported fence succeeds.
        let err = c.plan(&[5, 6], 11, 8).unwrap_err();
        let PlanError::AllSlotsInFlight { wait_for, .. } = err else { panic!("{err}") };
        assert_eq!(wait_for, 10);
        assert_eq!(c.plan(&[5, 6], 11, wait_for).unwrap().fills.len(), 2);
    }

    #[test]
    fn hits_need_no_free_slot() {
        let mut c = LayerCache::new(8, 2);
        c.plan(&[0, 1], 1, 0).unwrap();
        // Everything in flight, but all hits: fine.
        let p = c.plan(&[1, 0], 2, 0).unwrap();
        assert!(p.fills.is_empty());
        assert_eq!(p.slots, vec![1, 0]);
    }

    #[test]
    fn errors() {
        let mut c = LayerCache::new(8, 2);
        let err = c.plan(&[0, 1, 2], 1, 0).unwrap_err();
        assert_eq!(err, PlanError::TooManyExperts { requested: 3, slots: 2 });
        assert!(!err.is_retryable());
        // Duplicates do not count toward the limit.
        assert!(c.plan(&[0, 1, 0, 1], 1, 0).is_ok());
        let err = c.plan(&[1, 8], 2, 1).unwrap_err();
        assert_eq!(err, PlanError::ExpertOutOfRange { expert: 8, n_experts: 8 });
        assert!(err.to_string().contains("expert 8"));
        // The failed plans left everything as it was, and a retry of the same request works
        // (stale "requested" marks from the failed call must not hide experts).
        assert_eq!(c.stats(), CacheStats { hits: 0, misses: 2, evictions: 0 });
        let p = c.plan(&[1, 0], 3, 2).unwrap();
        assert_eq!(p.slots, vec![1, 0]);
        assert_eq!(c.stats().hits, 2);
    }

    #[test]
    fn everything_fits_never_evicts() {
        let mut c = LayerCache::new(16, 40);
        assert_eq!(c.n_slots(), 16);
        let mut rng = SplitMix(7);
        for _ in 0..500 {
            let req: Vec<u32> = (0..8).map(|_| (rng.next() % 16) as u32).collect();
            idle(&mut c, &req);
        }
        assert_eq!(c.stats().evictions, 0);
        assert_eq!(c.stats().misses, 16);
    }

    #[test]
    fn disjoint_request_evicts_all_when_slots_equal_top_k() {
        let mut c = LayerCache::new(128, 8);
        idle(&mut c, &[0, 1, 2, 3, 4, 5, 6, 7]);
        let p = idle(&mut c, &[8, 9, 10, 11, 12, 13, 14, 15]);
        assert_eq!(p.fills.len(), 8);
        let ev: HashSet<u32> = p.fills.iter().map(|f| f.evicted.unwrap()).collect();
        assert_eq!(ev, (0..8).collect());
        assert_eq!(c.stats(), CacheStats { hits: 0, misses: 16, evictions: 8 });
        assert!((0..8).all(|e| c.slot_of(e).is_none()));
    }

    #[test]
    fn counts_age_and_stay_bounded() {
        // An expert hammered early loses its slot once it goes cold, thanks to halving.
        let mut c = LayerCache::new(8, 2).with_age_period(4);
        for _ in 0..1000 {
            idle(&mut c, &[0]);
        }
        // Bound: halved every 4 plans, a count never exceeds 2 * 4.
        assert!(c.slots[c.slot_of(0).unwrap() as usize].count <= 8);
        // Now 1 and 2 alternate: the cold expert 0 must eventually be evicted instead of
        // 1/2 thrashing each other through the other slot.
        let mut evicted_zero = false;
        for i in 0..40 {
            let p = idle(&mut c, &[1 + (i % 2)]);
            evicted_zero |= p.fills.iter().any(|f| f.evicted == Some(0));
        }
        assert!(evicted_zero);
        assert_eq!(c.slot_of(0), None);
        // Without aging (huge period), the same workload keeps 0 resident and thrashes 1/2.
        let mut c = LayerCache::new(8, 2).with_age_period(u32::MAX);
        for _ in 0..1000 {
            idle(&mut c, &[0]);
        }
        for i in 0..40 {
            idle(&mut c, &[1 + (i % 2)]);
        }
        assert!(c.slot_of(0).is_some());
        assert_eq!(c.stats().evictions, 39);
        // Saturation as a belt: a count at u32::MAX stays there.
        let s = c.slot_of(0).unwrap() as usize;
        c.slots[s].count = u32::MAX;
        idle(&mut c, &[0]);
        assert_eq!(c.slots[s].count, u32::MAX);
    }

    struct SplitMix(u64);
    impl SplitMix {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
    }

    /// Checks one successful plan against the state before it, and the cache's own invariants.
    fn check(c: &LayerCache, before: &LayerCache, req: &[u32], p: &SlotPlan, completed: u64, fence: u64) {
        // Maps are inverse bijections on resident experts; no slot holds two experts.
        let mut seen = HashSet::new();
        for (i, s) in c.slots.iter().enumerate() {
            if let Some(e) = s.expert {
                assert!(seen.insert(e), "expert {e} in two slots");
                assert_eq!(c.slot_of[e as usize], Some(i as u32));
            }
        }
        for (e, so) in c.slot_of.iter().enumerate() {
            if let Some(si) = so {
                assert_eq!(c.slots[*si as usize].expert, Some(e as u32));
            }
        }
        // Every requested expert has the slot the plan says, and is pinned by this fence.
        assert_eq!(p.slots.len(), req.len());
        for (&e, &si) in req.iter().zip(&p.slots) {
            assert_eq!(c.slot_of(e), Some(si));
            assert!(c.slots[si as usize].pinned_until >= fence);
        }
        // Fills are exactly the distinct misses, to distinct slots, each evicting what the slot
        // held, never a requested expert, never a slot still in flight.
        let misses: HashSet<u32> = req.iter().copied().filter(|&e| before.slot_of(e).is_none()).collect();
        let filled: HashSet<u32> = p.fills.iter().map(|f| f.expert).collect();
        assert_eq!(filled, misses);
        assert_eq!(p.fills.len(), misses.len());
        let fslots: HashSet<u32> = p.fills.iter().map(|f| f.slot).collect();
        assert_eq!(fslots.len(), p.fills.len());
        for f in &p.fills {
            let old = before.slots[f.slot as usize];
            assert_eq!(f.evicted, old.expert);
            assert!(old.pinned_until <= completed, "slot {} reused while in flight", f.slot);
            if let Some(v) = f.evicted {
                assert!(!req.contains(&v));
                assert_eq!(c.slot_of(v), None);
            }
        }
        // Residents other than fills are untouched.
        for (i, (a, b)) in before.slots.iter().zip(&c.slots).enumerate() {
            if !fslots.contains(&(i as u32)) {
                assert_eq!(a.expert, b.expert);
            }
        }
        // Stats moved by exactly this step's distinct experts.
        let distinct: HashSet<u32> = req.iter().copied().collect();
        let (s0, s1) = (before.stats(), c.stats());
        assert_eq!(s1.misses - s0.misses, misses.len() as u64);
        assert_eq!(s1.hits - s0.hits, (distinct.len() - misses.len()) as u64);
        assert_eq!(s1.evictions - s0.evictions, p.fills.iter().filter(|f| f.evicted.is_some()).count() as u64);
        assert!(c.slots.iter().all(|s| s.count <= 2 * c.age_period));
    }

    #[test]
    fn random_workload_keeps_invariants() {
        for (seed, n_slots, lag) in [(1u64, 16usize, 3u64), (2, 8, 0), (3, 12, 2), (4, 9, 1)] {
            let mut rng = SplitMix(seed);
            let mut c = LayerCache::new(128, n_slots).with_age_period(16);
            let mut completed = 0u64;
            let mut retries = 0;
            for fence in 1..=4000u64 {
                // Skewed routing (a few hot experts), top-8, duplicates allowed.
                let req: Vec<u32> = (0..8)
                    .map(|_| {
                        let u = (rng.next() % 1024) as f64 / 1024.0;
                        ((u * u * u) * 128.0) as u32
                    })
                    .collect();
                // The GPU trails by a random 0..=lag fences.
                completed = completed.max(fence.saturating_sub(1 + rng.next() % (lag + 1)));
                let before = c.clone();
                let p = match c.plan(&req, fence, completed) {
                    Ok(p) => p,
                    Err(PlanError::AllSlotsInFlight { wait_for, .. }) => {
                        assert!(wait_for > completed && wait_for < fence);
                        retries += 1;
                        completed = wait_for;
                        c.plan(&req, fence, completed).expect("retry after wait_for succeeds")
                    }
                    Err(e) => panic!("{e}"),
                };
                check(&c, &before, &req, &p, completed, fence);
            }
            let st = c.stats();
            assert!(st.hits > 0 && st.evictions > 0, "{st:?}");
            if lag == 0 {
                assert_eq!(retries, 0, "lag 0: nothing is ever in flight");
            } else {
                assert!(retries > 0, "the wait-and-retry path was exercised");
            }
        }
    }
}
