//! The Metal backend: the raw-MSL kernels of `msl/`, one launch per step, run on an Apple GPU
//! through wgpu's MSL passthrough (`--backend metal`) or on the CPU through the MSL emulator
//! (`--backend msl-emu`, slow, for cross-checking the same `.metal` files).
//!
//! The host is small on purpose: [`pack`] lays the weights out once (arenas + program table),
//! and each step writes its token ids, first position and each token's two rope tables
//! (computed by `crate::reference::rope_table`, as every backend does), clears the grid-barrier
//! counter, launches `decode_step` and reads back what the caller asked for. The KV cache has
//! the shared layout of `crate::kv::KvLayout`.
//!
//! One kernel serves every step of up to `pack::MAX_M` tokens: a decode step is one token, a
//! `verify` the last accepted token and its drafts in one launch (each weight read once for all
//! rows, each row's arithmetic the decode step's, so its logits are bitwise decode's), a prefill
//! pieces of `MAX_M` tokens. The verify rows' K/V land in the cache past the committed length,
//! where nothing reads them: attention reads positions up to its own, each rewritten by the step
//! that owns it, and the sliding rings hold window + `MAX_VERIFY` slots, so a rejected row never
//! overwrites a position a later query needs (`crate::kv`). `commit(n)` then only moves the
//! committed length. Built with a drafter (`MetalOptions::drafter`), `Backend::draft` runs all
//! k drafter steps in one `draft_block` launch over the target's K/V in place; the host
//! drafter reads K/V and hidden states back (`DraftContext`) otherwise. Streamed experts run
//! one token per step, split after each MoE layer's router (`step`).

pub mod device;
pub mod emu;
pub mod pack;
pub mod passthrough;

use std::sync::Arc;

use crate::backend::{Backend, MemoryUse, Readback, StepOutput};
use crate::config::{AttnKind, Config};
use crate::error::{Error, Result};
use crate::kv::KvLayout;
use crate::loader::ModelWeights;
use crate::reference;
use crate::streamer::{ExpertSlots, StreamStats, Streamer};

pub use device::{Buf, EmuDevice, Launch, MslDevice, MslProgram};

/// The `.metal` files of the program, in translation-unit order: `decode_step` and the drafter's
/// `draft_block` (which uses decode.metal's helpers).
pub const DECODE_FILES: [(&str, &str); 3] = [
    ("grid_sync.metal", include_str!("../../../msl/grid_sync.metal")),
    ("decode.metal", include_str!("../../../msl/decode.metal")),
    ("draft.metal", include_str!("../../../msl/draft.metal")),
];

/// The program's kernels.
pub const KERNELS: [&str; 2] = ["decode_step", "draft_block"];

/// The decode program with its host-supplied definitions.
pub fn decode_program() -> MslProgram {
    MslProgram { files: DECODE_FILES.to_vec() }
}

/// Options of a Metal-kernel backend.
#[derive(Clone)]
pub struct MetalOptions {
    pub max_ctx: usize,
    /// Grid of the decode launch; `None` picks the device's default.
    pub launch: Option<Launch>,
    /// An installation's experts: slots per MoE layer (streamed), or all resident.
    pub expert_slots: ExpertSlots,
    /// An MTP drafter (`gemma4_assistant` config and weights) to run on the device
    /// (`draft_block`), reading this target's K/V in place.
    pub drafter: Option<(Config, Arc<ModelWeights>)>,
}

impl Default for MetalOptions {
    fn default() -> Self {
        MetalOptions { max_ctx: 4096, launch: None, expert_slots: ExpertSlots::All, drafter: None }
    }
}

/// Most tokens one `verify` takes (the last accepted token and up to 7 drafts): one launch.
pub const MAX_VERIFY: usize = pack::MAX_M;

/// The default emulator grid: four threadgroups of 64 threads (8 SIMD-groups). Enough groups
/// that every grid barrier has real arrivals to wait for, few enough fibers to stay quick.
pub const EMU_LAUNCH: Launch = Launch { groups: 4, threads: 64 };

/// The Gemma 4 forward pass through the MSL kernels on `D`.
pub struct MetalBackend {
    cfg: Config,
    weights: Arc<ModelWeights>,
    kv: KvLayout,
    dev: Box<dyn MslDevice>,
    packed: pack::Packed,
    launch: Launch,
    max_ctx: usize,
    inv_freq: [Vec<f32>; 2],
    /// Positions written to the cache so far (`0..cached`).
    cached: usize,
    weight_bytes: u64,
    state_bytes: u64,
    /// Post-final-norm hidden states of the last step's rows, `[rows][hidden]`.
    last_hidden: Vec<f32>,
    step_words: Vec<u32>,
    /// Rows the last `verify` ran (what `commit` may keep).
    staged: usize,
    /// Streamed experts: the slot caches, and the bytes from one blob to the next.
    streamer: Option<Streamer>,
    expert_stride: usize,
    /// cos | sin of one rope (allocated once: the step loop writes rope tables every token).
    rope_scratch: Vec<f32>,
    /// Streamed experts: the MoE layers a step stops after (empty: one launch per step).
    stops: Vec<usize>,
}

impl MetalBackend {
    /// On the MSL emulator.
    pub fn emulated(cfg: Config, w: Arc<ModelWeights>, opts: MetalOptions) -> Result<Self> {
        let launch = opts.launch.unwrap_or(EMU_LAUNCH);
        Self::build(cfg, w, &opts, launch, |sizes| {
            Ok(Box::new(EmuDevice::new(&decode_program(), sizes, Default::default())?))
        })
    }

    /// On the Metal GPU (through wgpu's MSL passthrough).
    pub fn on_gpu(cfg: Config, w: Arc<ModelWeights>, opts: MetalOptions) -> Result<Self> {
        let gpu = passthrough::MetalGpu::open()?;
        let launch = opts.launch.unwrap_or_else(|| gpu.default_launch());
        Self::build(cfg, w, &opts, launch, move |sizes| {
            Ok(Box::new(passthrough::PassthroughDevice::new(gpu, &decode_program(), sizes, launch)?))
        })
    }

    fn build(
        cfg: Config,
        w: Arc<ModelWeights>,
        opts: &MetalOptions,
        launch: Launch,
        device: impl FnOnce([usize; device::BUFFERS]) -> Result<Box<dyn MslDevice>>,
    ) -> Result<Self> {
        let max_ctx = opts.max_ctx;
        if launch.threads == 0 || !launch.threads.is_multiple_of(32) || launch.groups == 0 {
            return Err(Error::Invalid(format!(
                "launch of {} groups × {} threads: the kernels need whole SIMD-groups of 32 and at least one group",
                launch.groups, launch.threads
            )));
        }
        // An installation's experts: every one resident (slot = expert), or streamed through
        // `slots` per layer, which must hold one token's top-k (a step routes one token at a time).
        let (installed, streamer) = match (&w.expert_files, opts.expert_slots) {
            (None, _) => (None, None),
            (Some(files), ExpertSlots::All) => (Some((files.clone(), files.layout.n_experts, false)), None),
            (Some(files), ExpertSlots::Some(n)) => {
                let n = n.min(files.layout.n_experts);
                let k = cfg.text.top_k_experts;
                if n < k {
                    return Err(Error::Invalid(format!(
                        "--expert-slots {n} is fewer than the {k} experts a token routes to: the Metal kernels need at least {k}"
                    )));
                }
                (Some((files.clone(), n, true)), Some(Streamer::new(files.clone(), n)))
            }
        };
        // One token per step, but a verify writes up to MAX_VERIFY rows past the committed ones.
        let kv = KvLayout::new(&cfg, max_ctx, MAX_VERIFY);
        let inst = installed.as_ref().map(|(f, slots, streamed)| pack::InstalledExperts {
            layout: &f.layout,
            slots: *slots,
            streamed: *streamed,
        });
        let drafter = opts.drafter.as_ref().map(|(c, w)| (c, w.as_ref()));
        let packed =
            pack::pack(&cfg, &w, &kv, launch.groups as usize, launch.warps() as usize, inst.as_ref(), drafter)?;
        let sizes = [
            packed.table.len() * 4,
            packed.arena.len() * 4,
            packed.arena_b.len() * 4,
            packed.act_len * 4,
            packed.kv_len * 4,
            256, // word 0 arrivals, word 32 stall: separate 128-byte lines
            packed.step_len * 4,
            packed.out_len * 4,
        ];
        let mut dev = device(sizes)?;
        dev.write(Buf::Table, 0, bytemuck::cast_slice(&packed.table))?;
        dev.write(Buf::ArenaA, 0, bytemuck::cast_slice(&packed.arena))?;
        dev.write(Buf::ArenaB, 0, bytemuck::cast_slice(&packed.arena_b))?;
        if let Some((files, _, false)) = &installed {
            // Every expert resident: blob e in slot e, read once now.
            let stride = files.layout.blob_stride as usize;
            for (&layer, &region) in &packed.expert_regions {
                files.for_each_expert(layer, |e, blob| dev.write(Buf::ArenaB, region + e as usize * stride, blob))?;
            }
        }
        let inv_freq = [cfg.text.rope_sliding.inv_freq(), cfg.text.rope_full.inv_freq()];
        let weight_bytes = ((packed.arena.len() + packed.arena_b.len()) * 4) as u64;
        let state_bytes = ((packed.act_len + packed.kv_len) * 4) as u64;
        let step_words = vec![0u32; packed.step_len];
        let expert_stride = installed.as_ref().map_or(0, |(f, _, _)| f.layout.blob_stride as usize);
        let rope_scratch = vec![0.0f32; 2 * packed.rope_half[0].max(packed.rope_half[1])];
        let stops = if streamer.is_some() { packed.expert_regions.keys().copied().collect() } else { Vec::new() };
        Ok(MetalBackend {
            stops,
            streamer,
            expert_stride,
            rope_scratch,
            cfg,
            weights: w,
            kv,
            dev,
            packed,
            launch,
            max_ctx,
            inv_freq,
            cached: 0,
            weight_bytes,
            state_bytes,
            last_hidden: Vec::new(),
            step_words,
            staged: 0,
        })
    }

    /// The grid each step launches.
    pub fn launch_shape(&self) -> Launch {
        self.launch
    }

    /// One launch of `kernel` with the step words as they are; reports a stalled barrier.
    fn launch_kernel(&mut self, kernel: &str) -> Result<()> {
        self.dev.write(Buf::Step, 0, bytemuck::cast_slice(&self.step_words))?;
        self.dev.write(Buf::Sync, 0, &[0u8; 256])?;
        self.dev.launch(kernel, self.launch)?;
        let mut stall = [0u8; 4];
        self.dev.read(Buf::Sync, 32 * 4, &mut stall)?;
        if u32::from_le_bytes(stall) != 0 {
            return Err(Error::Gpu(format!(
                "{}: a grid barrier of {kernel} timed out: the {} threadgroups were not all resident at once; launch fewer",
                self.dev.name(),
                self.launch.groups
            )));
        }
        Ok(())
    }

    /// After a launch stopped at MoE `layer`: routes as the kernel will (`route` in
    /// decode.metal: the first maximum of the untaken scores, k times), has the streamer make
    /// those experts resident, and writes their slots into the step's slot map.
    fn load_routed(&mut self, layer: usize) -> Result<()> {
        let t = &self.cfg.text;
        let (e, k) = (t.num_experts, t.top_k_experts);
        let mut scores = vec![0.0f32; e];
        self.dev.read(
            Buf::Act,
            self.packed.table[pack::A_SCORES] as usize * 4,
            bytemuck::cast_slice_mut(&mut scores),
        )?;
        let chosen = route(&scores, k);
        let streamer = self.streamer.as_mut().expect("stops only where experts stream");
        let rounds = streamer.rounds(layer, &chosen);
        let [round] = &rounds[..] else {
            return Err(Error::Invalid(format!("layer {layer}: {} experts need {} rounds of slots", k, rounds.len())));
        };
        let region = self.packed.expert_regions[&layer];
        let (dev, stride) = (&mut self.dev, self.expert_stride);
        let slots = streamer.load(layer, round, &chosen, &mut |slot, blob| {
            dev.write(Buf::ArenaB, region + slot as usize * stride, blob)
        })?;
        let map = self.packed.table[pack::H_STEP_MAP] as usize;
        for (&ex, &slot) in chosen.iter().zip(&slots) {
            self.step_words[map + ex as usize] = slot;
        }
        Ok(())
    }

    /// Checks a step of `tokens` at `pos`: within the context, continuing the cached sequence,
    /// every id in the vocabulary.
    fn check_step(&self, tokens: &[u32], pos: usize) -> Result<()> {
        if pos + tokens.len() > self.max_ctx {
            return Err(Error::Invalid(format!(
                "position {} is past the context of {}",
                pos + tokens.len(),
                self.max_ctx
            )));
        }
        if pos > self.cached {
            return Err(Error::Invalid(format!(
                "step at position {pos}, but the cache holds positions 0..{}: steps must continue the sequence",
                self.cached
            )));
        }
        let vocab = self.cfg.text.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::Invalid(format!("token id {bad} is outside the vocabulary (size {vocab})")));
        }
        Ok(())
    }

    /// Token slot `t`'s rope tables in the step words: cos | sin of `pos` for the sliding rope,
    /// then for the full one (`crate::reference::rope_table`, as every backend computes them).
    fn write_rope(&mut self, t: usize, pos: usize) {
        let stride = 2 * (self.packed.rope_half[0] + self.packed.rope_half[1]);
        let mut at = pack::STEP_ROPE + t * stride;
        for (k, inv) in self.inv_freq.iter().enumerate() {
            let half = self.packed.rope_half[k];
            let (cos, sin) = self.rope_scratch.split_at_mut(half);
            reference::rope_table(inv, pos, cos, &mut sin[..half]);
            for (i, v) in self.rope_scratch[..2 * half].iter().enumerate() {
                self.step_words[at + i] = v.to_bits();
            }
            at += 2 * half;
        }
    }

    /// Tokens one launch runs: `MAX_M`, or one when experts stream (the host routes each
    /// token's experts between the launches of its step).
    fn per_launch(&self) -> usize {
        if self.streamer.is_some() {
            1
        } else {
            pack::MAX_M
        }
    }

    /// One step of `tokens` (at most `per_launch`) at `pos0..`: every token's argmax, and its
    /// logits when asked; the tokens' hidden states are appended to `last_hidden`.
    fn step(&mut self, tokens: &[u32], pos0: usize, logits: bool) -> Result<(Vec<u32>, Vec<f32>)> {
        let n = tokens.len();
        debug_assert!(n >= 1 && n <= self.per_launch());
        let s = &mut self.step_words;
        s[pack::STEP_COUNT] = n as u32;
        s[pack::STEP_POS] = pos0 as u32;
        s[pack::STEP_TOKENS..pack::STEP_TOKENS + n].copy_from_slice(tokens);
        for t in 0..n {
            self.write_rope(t, pos0 + t);
        }
        // With streamed experts the step stops after each MoE layer's router, and the host
        // loads that layer's experts before resuming; otherwise one launch.
        let mut resume = 0u32;
        for i in 0..=self.stops.len() {
            let stop = self.stops.get(i).copied();
            self.step_words[pack::STEP_RESUME] = resume;
            self.step_words[pack::STEP_STOP] = stop.map_or(pack::NONE, |l| l as u32);
            self.launch_kernel("decode_step")?;
            if let Some(layer) = stop {
                self.load_routed(layer)?;
                resume = layer as u32 + 1;
            }
        }
        if let Some(s) = &mut self.streamer {
            s.count_tokens(n);
        }
        // The argmax words and the logits are adjacent in `out`: one read for both.
        let vocab = self.cfg.text.vocab_size;
        let mut head = vec![0u32; pack::OUT_LOGITS + if logits { n * vocab } else { 0 }];
        self.dev.read(Buf::Out, 0, bytemuck::cast_slice_mut(&mut head))?;
        let argmax = head[..n].to_vec();
        let out: Vec<f32> = head[pack::OUT_LOGITS..].iter().map(|&b| f32::from_bits(b)).collect();
        let h = self.cfg.text.hidden_size;
        let at = self.last_hidden.len();
        self.last_hidden.resize(at + n * h, 0.0);
        self.dev.read(Buf::Out, self.packed.out_hidden() * 4, bytemuck::cast_slice_mut(&mut self.last_hidden[at..]))?;
        Ok((argmax, out))
    }
}

/// The experts `route` in decode.metal picks from `scores`: k times the first maximum among the
/// experts not yet taken (comparisons only, so host and kernel agree exactly).
fn route(scores: &[f32], k: usize) -> Vec<u32> {
    let mut taken = vec![false; scores.len()];
    let mut out = Vec::with_capacity(k);
    for _ in 0..k {
        let mut best: Option<(usize, f32)> = None;
        for (e, &v) in scores.iter().enumerate() {
            if !taken[e] && best.is_none_or(|(_, bv)| v > bv) {
                best = Some((e, v));
            }
        }
        let (e, _) = best.expect("k ≤ the expert count");
        taken[e] = true;
        out.push(e as u32);
    }
    out
}

impl Backend for MetalBackend {
    fn name(&self) -> &str {
        self.dev.name()
    }
    fn device_info(&self) -> String {
        format!("{} ({} threadgroups × {} threads)", self.dev.info(), self.launch.groups, self.launch.threads)
    }
    fn config(&self) -> &Config {
        &self.cfg
    }
    fn max_chunk(&self) -> usize {
        512
    }
    fn max_context(&self) -> usize {
        self.max_ctx
    }
    fn prefill(&mut self, tokens: &[u32], pos: usize, readback: Readback) -> Result<StepOutput> {
        if tokens.is_empty() {
            return Err(Error::Invalid("prefill of zero tokens".into()));
        }
        self.check_step(tokens, pos)?;
        self.last_hidden.clear();
        self.staged = 0;
        let mut out = StepOutput::default();
        let vocab = self.cfg.text.vocab_size;
        let per = self.per_launch();
        let mut done = 0;
        for piece in tokens.chunks(per) {
            let last = done + piece.len() == tokens.len();
            let want_logits = match readback {
                Readback::AllLogits => true,
                Readback::LastLogits => last,
                Readback::Argmax | Readback::Nothing => false,
            };
            let (am, logits) = self.step(piece, pos + done, want_logits)?;
            done += piece.len();
            self.cached = pos + done;
            match readback {
                Readback::AllLogits => {
                    out.argmax.extend_from_slice(&am);
                    out.logits.extend_from_slice(&logits);
                }
                Readback::LastLogits | Readback::Argmax if last => {
                    out.argmax.push(*am.last().expect("a piece has tokens"));
                    if readback == Readback::LastLogits {
                        out.logits = logits[logits.len() - vocab..].to_vec();
                    }
                }
                _ => {}
            }
        }
        Ok(out)
    }
    fn reset(&mut self) {
        // The cache contents become unused: attention only reads positions < the step's own.
        self.cached = 0;
        self.staged = 0;
        self.last_hidden.clear();
    }
    fn memory(&self) -> MemoryUse {
        MemoryUse { weight_bytes: self.weight_bytes, state_bytes: self.state_bytes }
    }
    fn verify(&mut self, tokens: &[u32], pos: usize, with_logits: bool) -> Result<StepOutput> {
        if tokens.is_empty() || tokens.len() > MAX_VERIFY {
            return Err(Error::Invalid(format!("verify of {} tokens: 1..={MAX_VERIFY} are supported", tokens.len())));
        }
        if pos != self.cached {
            return Err(Error::Invalid(format!(
                "verify at position {pos}, but the cache holds positions 0..{}: a verify continues the committed sequence",
                self.cached
            )));
        }
        self.check_step(tokens, pos)?;
        self.last_hidden.clear();
        let mut out = StepOutput::default();
        let mut result = Ok(());
        // One launch for every row (streamed experts: one per row, routed between launches).
        let per = self.per_launch();
        for (i, piece) in tokens.chunks(per).enumerate() {
            match self.step(piece, pos + i * per, with_logits) {
                Ok((am, logits)) => {
                    out.argmax.extend_from_slice(&am);
                    out.logits.extend_from_slice(&logits);
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        // The rows stay past the committed length, success or not, until `commit`.
        self.staged = if result.is_ok() { tokens.len() } else { 0 };
        result.map(|()| out)
    }
    fn max_verify(&self) -> usize {
        MAX_VERIFY
    }
    fn commit(&mut self, n: usize) -> Result<()> {
        if n > self.staged {
            return Err(Error::Invalid(format!("commit of {n} rows, the last verify staged {}", self.staged)));
        }
        self.cached += n;
        self.staged = 0;
        Ok(())
    }
    fn draft_context(&self) -> Option<&dyn crate::spec::DraftContext> {
        Some(self)
    }
    fn stream_stats(&self) -> Option<StreamStats> {
        self.streamer.as_ref().map(|s| s.stats())
    }
    fn draft(&mut self, token: u32, hidden: &[f32], pos: usize, k: usize) -> Result<Option<Vec<u32>>> {
        if self.packed.table[pack::H_DRAFT] == 0 {
            return Ok(None);
        }
        let h = self.cfg.text.hidden_size;
        if k == 0 || k >= pack::MAX_M || hidden.len() != h || pos == 0 || pos > self.cached {
            return Err(Error::Invalid(format!(
                "draft of {k} tokens at position {pos} with a hidden row of {} values: 1..{} drafts, {h} values, a position in 1..={}",
                hidden.len(),
                pack::MAX_M,
                self.cached
            )));
        }
        let s = &mut self.step_words;
        s[0] = token;
        s[1] = pos as u32;
        s[2] = k as u32;
        self.write_rope(0, pos);
        let s = &mut self.step_words;
        let dh = self.packed.table[pack::H_DRAFT] as usize;
        let hidden_at = self.packed.table[dh + pack::DH_STEP_HIDDEN] as usize;
        for (j, v) in hidden.iter().enumerate() {
            s[hidden_at + j] = v.to_bits();
        }
        self.launch_kernel("draft_block")?;
        let mut drafts = vec![0u32; k];
        self.dev.read(Buf::Out, 0, bytemuck::cast_slice_mut(&mut drafts))?;
        Ok(Some(drafts))
    }
}

impl crate::spec::DraftContext for MetalBackend {
    fn hidden_size(&self) -> usize {
        self.cfg.text.hidden_size
    }
    fn cached_len(&self) -> usize {
        self.cached
    }
    fn token_embedding(&self, token: u32) -> Result<Vec<f32>> {
        self.weights.scaled_embedding(&self.cfg, token)
    }
    fn producer_kv(&self, kind: AttnKind, positions: std::ops::Range<usize>) -> Result<crate::spec::KvRows> {
        let c = self.kv.producer_cache(&self.cfg, kind, &positions, self.cached)?;
        let cs = &self.kv.caches[c];
        let (k_off, v_off) = self.packed.cache_offsets[c];
        let row = cs.slot_elems();
        let read = |base: usize| -> Result<Vec<f32>> {
            let mut out = vec![0.0f32; positions.len() * row];
            for (i, p) in positions.clone().enumerate() {
                let at = (base + cs.slot(p) * row) * 4;
                self.dev.read(Buf::Kv, at, bytemuck::cast_slice_mut(&mut out[i * row..(i + 1) * row]))?;
            }
            Ok(out)
        };
        Ok(crate::spec::KvRows {
            start: positions.start,
            k: read(k_off)?,
            v: read(v_off)?,
            n_kv_heads: cs.n_kv_heads,
            head_dim: cs.head_dim,
        })
    }
    fn last_hidden(&self) -> Result<Vec<f32>> {
        Ok(self.last_hidden.clone())
    }
}
