//! The portable GPU backend: WGSL kernels through wgpu (Vulkan, Metal, DX12).
//!
//! At construction every weight is uploaded once (split into row ranges that fit the adapter's
//! storage-binding limit), every activation and KV buffer is allocated for the largest chunk,
//! and the whole forward pass is recorded as a *program*: a list of dispatches with their bind
//! groups and params already made. A step then only writes the step uniform, the token ids and
//! the rope table, encodes the program into ONE compute pass, submits once, and reads back the
//! argmax (and logits when asked). Nothing is allocated in the decode loop. `builder.rs` uploads
//! and records; this file runs the steps.
//!
//! Matrix products pick a variant per step kind: prefill chunks the tiled mat-mat (`qmm` for
//! 4-bit, the 8-token `matmul` tile otherwise), decode the mat-vec (`qmv` for 4-bit), verify
//! the mat-vec's 4-token tile (see [`crate::kernels::qmv_shape`]).
//!
//! A decode step is a chain of dependent dispatches, each costing a barrier and its own
//! latency, so the program is recorded with as few as the arithmetic allows (ledger: 2026-11-30
//! norm-chain-glu-stack, 2026-11-30 qkv-stack, 2026-11-30 qkv-norm-rope): 4-bit q | k | v and
//! gate | up are stacked into one matrix each at upload (decode runs `qmv_glu`, the GeGLU as the
//! mat-vec's epilogue; routed experts `qmv_moe_glu`), the q, k and v heads are normalised and
//! rotated in one `qkv_norm_rope`, and a residual post-norm also writes the next blocks' input
//! norms of the rows it updated (rmsnorm's `chain`). Greedy decode runs one step ahead of the
//! host ([`Backend::decode_greedy`]): the next step reads its id from the last step's argmax on
//! the GPU, so recording overlaps the GPU (ledger: 2026-11-30 run-ahead-decode).
//!
//! Activations are f32 (the reference path). MoE layers (26B-A4B): router top-k on the GPU, then
//! gathered expert mat-vecs over the layer's expert matrix. That matrix is the checkpoint's
//! stacked experts, or (an installation) `n_slots` expert-sized slots in long-lived buffers: with
//! every expert resident the slots are filled once at start; with fewer slots, experts stream:
//! the step is cut after each MoE layer's router, the top-k comes back to the host, the
//! [`Streamer`] reads the misses into their slots, then the routed kernels run (once per round
//! when a step needs more distinct experts than there are slots). The dense shared-expert branch
//! is submitted before the host waits, so it runs while the misses are read. With every expert
//! resident, decode and verify steps run the dense branch's mat-vecs beside the experts' instead
//! (no barrier between them: [`Tuning::moe_overlap`]).
//!
//! Speculative verify steps run the decode form of every kernel for all their tokens (split
//! attention, per-pair experts, the mat-vec's token tile), so each row's logits are bitwise a
//! decode's; their K/V go to staging rows after each cache's slots (`kv_row` in common.wgsl)
//! until `commit` copies the accepted ones into the ring.

mod builder;
pub mod context;
pub mod harness;
pub mod pipelines;
pub mod source;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::backend::{Backend, MemoryUse, OnRound, Readback, StepOutput};
use crate::config::{AttnKind, Config, KvSource};
use crate::error::{Error, Result};
use crate::kernels::*;
use crate::kv::KvLayout;
use crate::loader::installed::PartLayout;
use crate::loader::{ExpertFiles, ExpertGateUp, Matrix, ModelWeights};
use crate::quant::DType;
use crate::reference::{self, embed_scale};
use crate::streamer::{ExpertSlots, StreamStats, Streamer};
use builder::{Builder, DeviceDrafter, RING_ROWS};
pub use context::Gpu;
use pipelines::Pipelines;

/// Most tokens one `verify` scores (the last accepted token and up to 7 drafts): the staging
/// rows each K/V cache keeps after its slots.
pub const VERIFY_MAX: usize = 8;

/// Program entries (dispatches, some of which a step's form skips) in the first segment a step
/// submits while recording the rest (`run`); each later segment doubles.
const FIRST_SEGMENT: usize = 16;

/// Construction options.
#[derive(Debug, Clone)]
pub struct WgpuOptions {
    /// Context length the KV cache holds.
    pub max_ctx: usize,
    /// Largest prefill chunk.
    pub max_chunk: usize,
    /// Cap on one storage binding, below the adapter's (tests use it to force tensor splitting).
    pub max_binding: Option<u64>,
    /// Expert slots per MoE layer of an installation (`All`: every expert resident).
    pub expert_slots: ExpertSlots,
    /// Split the k loop of every chunk mat-mat at least this many ways (a power of two; fewer
    /// where its columns do not divide into whole groups) on top of what the measured rule
    /// picks: tests use it to run the split path on models too small to split (1: the rule
    /// alone).
    pub min_k_splits: u32,
    /// Every kernel and program choice (see [`Tuning`]).
    pub tuning: Tuning,
    /// Kernel label prefixes whose dispatches are left out of every step: a measurement setting
    /// that gives a kernel's marginal cost in the pipelined step (the step without it against
    /// the step with it; `kestrel bench --skip`). The output is wrong while it is set.
    pub skip: Vec<String>,
    /// An MTP drafter to record beside the target: [`Backend::draft_verify`] then drafts on the
    /// GPU over the target's K/V in place.
    pub drafter: Option<DraftModel>,
}

/// A `gemma4_assistant` drafter's config and weights, for [`WgpuOptions::drafter`].
#[derive(Clone)]
pub struct DraftModel(pub Config, pub Arc<ModelWeights>);

impl std::fmt::Debug for DraftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DraftModel({} layers, hidden {})", self.0.layers.len(), self.0.text.hidden_size)
    }
}

impl Default for WgpuOptions {
    fn default() -> Self {
        WgpuOptions {
            max_ctx: 4096,
            max_chunk: 128,
            max_binding: None,
            expert_slots: ExpertSlots::All,
            min_k_splits: 1,
            tuning: Tuning::default(),
            skip: Vec::new(),
            drafter: None,
        }
    }
}

/// One row range of a weight matrix, in buffers no larger than the binding limit.
#[derive(Clone)]
struct GpuPart {
    row0: usize,
    rows: usize,
    w: wgpu::Buffer,
    scales: wgpu::Buffer,
    biases: wgpu::Buffer,
}

/// A weight matrix on the GPU.
#[derive(Clone)]
struct GpuMatrix {
    format: Format,
    cols: usize,
    gs: usize,
    parts: Vec<GpuPart>,
}

/// moe_group's output: `n` lists (one per expert or slot) of up to `stride - 1` pairs.
struct Groups {
    buf: wgpu::Buffer,
    n: usize,
    stride: usize,
}

/// One MoE layer's expert slots: for each routed matrix, a matrix of `n_slots` experts' rows.
struct SlotLayer {
    parts: Vec<(PartLayout, GpuMatrix)>,
}

impl SlotLayer {
    /// Copies one expert blob into `slot` of every part (queued: lands before the next submit).
    fn write(&self, queue: &wgpu::Queue, slot: u32, blob: &[u8]) {
        for (pl, gm) in &self.parts {
            let gp = &gm.parts[0];
            let spans = [(Some(pl.w), &gp.w), (pl.scales, &gp.scales), (pl.biases, &gp.biases)];
            for (span, buf) in spans {
                let Some((off, len)) = span else { continue };
                let src = &blob[off as usize..(off + len) as usize];
                if pl.format == "f16" {
                    // Resident f16 matrices are widened to f32 at upload; slots hold the same.
                    let f: Vec<f32> = crate::quant::floats_to_f32(src, DType::F16);
                    queue.write_buffer(buf, slot as u64 * 2 * len, bytemuck::cast_slice(&f));
                } else {
                    queue.write_buffer(buf, slot as u64 * len, src);
                }
            }
        }
    }
}

/// Where a MoE layer's routed part sits in the program: dispatches `[.., route_end)` end with
/// the router's top-k, `[route_end, experts_begin)` are the dense branch (independent of the
/// experts), `[experts_begin, experts_end)` the routed kernels.
#[derive(Debug, Clone, Copy)]
struct Mark {
    layer: usize,
    route_end: usize,
    experts_begin: usize,
    experts_end: usize,
}

/// Streaming state: the host side of the expert cache and the buffers it talks through.
struct Streaming {
    streamer: Streamer,
    slots: BTreeMap<usize, SlotLayer>,
    marks: Vec<Mark>,
    /// The router's top-k (written on the GPU), its readback, and the slot table (written by the host).
    route_idx: wgpu::Buffer,
    idx_read: wgpu::Buffer,
    slot_idx: wgpu::Buffer,
    top_k: usize,
}

/// How the y dimension of a dispatch grid follows the step.
#[derive(Clone, Copy)]
enum GridY {
    /// A single row of workgroups.
    One,
    /// One per token of the step.
    Tokens,
    /// `ceil(n_tokens / k)`.
    TokenTiles(u32),
    /// `ceil(n_tokens / k) · splits` (split-k qmm).
    SplitTokenTiles(u32, u32),
    /// One per output row (the rows the LM head computes).
    Out,
    /// `ceil(n_out / k)`.
    OutTiles(u32),
    /// `k` (routed slots), with the tokens along z.
    Slots(u32),
    /// `k`, whatever the step.
    Fixed(u32),
}

/// A dispatch of the recorded program.
struct Dispatch {
    /// Kernel name, for profiles.
    label: String,
    only: Only,
    pipeline: wgpu::ComputePipeline,
    /// The variant for steps where the grid's count is 1 (decode): same bindings, no token
    /// tile, and its own grid x.
    single: Option<Variant>,
    /// The variant for verify steps of several tokens (matmul: a 4-token tile), its grid x and
    /// token tile.
    verify: Option<Variant>,
    bind_group: wgpu::BindGroup,
    /// Grid x (fixed), or, when `x_from_out`, one per output row, or when `x_from_tokens`,
    /// one per token.
    x: u32,
    x_from_out: bool,
    x_from_tokens: bool,
    y: GridY,
    /// Buffers moved to the read-only storage state (`transition_resources`) just before this
    /// dispatch. wgpu puts a barrier before a dispatch only for buffers whose state it changes
    /// (any buffer it writes that the pass used before, any buffer it reads that was last
    /// written), and on Vulkan that barrier waits for every dispatch recorded before it. A
    /// dispatch whose inputs were made ready here and whose outputs are new to the pass gets no
    /// barrier, so it runs beside this one (the concurrent MoE branches,
    /// `WgpuOptions::moe_overlap`).
    ready: Vec<wgpu::Buffer>,
    /// A decode attention kernel that computes only some rows: one-row steps skip it where
    /// another owns the row.
    keys: Option<KeysOwner>,
}

impl Dispatch {
    /// The kernel label of the form `variant` runs: 1 the decode variant, 2 the verify one,
    /// else the dispatch's own pipeline (`encode`'s numbering, which profiles record).
    fn label_of(&self, variant: u8) -> &str {
        match (variant, &self.single, &self.verify) {
            (1, Some(v), _) | (2, _, Some(v)) => &v.label,
            _ => &self.label,
        }
    }
}

/// Another pipeline for the same bindings, run for some steps instead of a dispatch's own.
struct Variant {
    pipeline: wgpu::ComputePipeline,
    /// Grid x (rows / rows per workgroup).
    x: u32,
    /// Token tile: the grid's y is ceil(count / tok).
    tok: u32,
    /// Kernel label, for profiles (the `tok` tile's, also where a smaller one ran).
    label: String,
    /// The same kernel at token tiles 2 ..= tok − 1 (index t − 2), where it has them
    /// (`Kernel::with_tok`): a verify of fewer tokens than `tok` runs the tile of its size, not
    /// `tok` tokens' arithmetic with the missing ones clamped. Empty: always `tok`.
    smaller: Vec<wgpu::ComputePipeline>,
}

impl Variant {
    /// The pipeline and token tile for `count` tokens (`smaller` holds only tiles under `tok`).
    fn tile(&self, count: u32) -> (&wgpu::ComputePipeline, u32) {
        let t = count.min(self.tok);
        match t.checked_sub(2).and_then(|i| self.smaller.get(i as usize)) {
            Some(pipeline) => (pipeline, t),
            None => (&self.pipeline, self.tok),
        }
    }
}

/// Where a step's token ids come from.
#[derive(Clone, Copy)]
enum Ids<'a> {
    /// The host's, written before the step.
    Host(&'a [u32]),
    /// `n` ids a command buffer submitted before the step leaves in the ids buffer.
    OnDevice(usize),
}

/// Rope tables of positions `pos0 .. pos0 + n`, a row of `stride` values each: the sliding
/// layers' cos | sin (`dims.0` values), then the full layers' (`dims.1`).
fn rope_rows(out: &mut Vec<f32>, inv_freq: &[Vec<f32>; 2], dims: (usize, usize), stride: usize, pos0: usize, n: usize) {
    let (ds, df) = dims;
    out.resize(n * stride, 0.0);
    for t in 0..n {
        let row = &mut out[t * stride..(t + 1) * stride];
        let (s, f) = row.split_at_mut(ds);
        let (cs, ss) = s.split_at_mut(ds / 2);
        reference::rope_table(&inv_freq[0], pos0 + t, cs, ss);
        let (cf, sf) = f[..df].split_at_mut(df / 2);
        reference::rope_table(&inv_freq[1], pos0 + t, cf, sf);
    }
}

/// A resource of a dispatch under construction, in WGSL binding order.
#[derive(Clone)]
enum Res {
    Buf(wgpu::Buffer),
    Params,
    /// A second params block (offset, length) in the params buffer: the fused-norm prologue's.
    ParamsAt(u64, u64),
    Step,
    /// The chunk norms' group sums (made once every norm is recorded): the whole buffer (the
    /// norms write it), or one region of [`Builder::sum_regions`] (a mat-mat reads it).
    NormSums(Option<usize>),
}

/// Which steps run a dispatch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Only {
    Always,
    /// Steps of one token (decode).
    Single,
    /// Steps of several tokens (prefill chunks).
    Multi,
}

struct Spec {
    only: Only,
    kernel: Kernel,
    /// The decode variant, its grid x and token tile (1).
    single: Option<(Kernel, u32, u32)>,
    verify: Option<(Kernel, u32, u32)>,
    res: Vec<Res>,
    param_off: u64,
    param_len: u64,
    x: u32,
    x_from_out: bool,
    x_from_tokens: bool,
    y: GridY,
    /// Buffers moved to the read-only storage state just before this dispatch (one barrier
    /// with its own), for a dispatch recorded after it: see `Dispatch::ready`.
    ready: Vec<wgpu::Buffer>,
    /// Decode attention's row owner: see `Dispatch::keys`.
    keys: Option<KeysOwner>,
}

impl Spec {
    /// Leaves this dispatch to prefill chunks (a decode and verify form took its work).
    fn chunks_only(&mut self) {
        if self.only != Only::Multi {
            (self.only, self.single, self.verify) = (Only::Multi, None, None);
        }
    }

    /// A grid of one workgroup per token of the step: (n_tokens, 1).
    fn one_workgroup_per_token(&mut self) {
        self.x = 0;
        self.x_from_tokens = true;
        self.y = GridY::One;
    }
}

/// Which decode attention kernels own a row (attention_params.wgsl's short_row): rows of at most
/// `max` keys are attention_short's (`short`), the others attention_split's and
/// attention_combine's. A one-row step dispatches only the owner's kernels; steps of several
/// rows dispatch all of them and each kernel skips the rows it does not own.
#[derive(Clone, Copy, PartialEq, Eq)]
struct KeysOwner {
    short: bool,
    /// The layer's sliding window (0: full attention).
    window: u32,
    max: u32,
}

impl KeysOwner {
    /// Whether this dispatch computes the row of a query at `pos`.
    fn owns(&self, pos: usize) -> bool {
        let first = if self.window > 0 && pos + 1 > self.window as usize { pos + 1 - self.window as usize } else { 0 };
        (pos + 1 - first <= self.max as usize) == self.short
    }
}

/// GPU time of one kernel over a profiled step.
#[derive(Debug, Clone)]
pub struct KernelTime {
    pub kernel: String,
    pub dispatches: usize,
    pub micros: f64,
}

/// Timestamp queries around every dispatch of one step (`kestrel bench`).
struct Profiler {
    /// A timestamp after every dispatch (per-kernel times), or only at the pass's two ends
    /// (the step's GPU time, undisturbed by hundreds of timestamp writes).
    per_dispatch: bool,
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    capacity: u32,
}

impl Profiler {
    /// Timestamps one step writes for `dispatches` dispatches: the pass start, then one per
    /// dispatch or only the pass end.
    fn queries_written(&self, dispatches: usize) -> u32 {
        if self.per_dispatch {
            dispatches as u32 + 1
        } else {
            2
        }
    }
}

/// The portable GPU backend.
pub struct WgpuBackend {
    gpu: Gpu,
    cfg: Config,
    kv: KvLayout,
    opts: WgpuOptions,
    program: Vec<Dispatch>,
    step_buf: wgpu::Buffer,
    ids_buf: wgpu::Buffer,
    rope_buf: wgpu::Buffer,
    best_buf: wgpu::Buffer,
    logits_buf: wgpu::Buffer,
    best_read: wgpu::Buffer,
    /// Argmax readback of run-ahead greedy decode (`decode_greedy`): step i lands in buffer
    /// i % 2 while the host maps the other.
    chain_read: [wgpu::Buffer; 2],
    /// Host time spent recording and submitting steps, and how many (`host_encode`).
    encode_time: std::time::Duration,
    encode_steps: u64,
    logits_read: wgpu::Buffer,
    /// Rows of logits one step can produce (bounded by the binding limit).
    logit_rows: usize,
    /// Workgroups one grid dimension allows.
    max_groups: u32,
    inv_freq: [Vec<f32>; 2],
    rope_stride: usize,
    rope_host: Vec<f32>,
    read_scratch: Vec<u8>,
    profiler: Option<Profiler>,
    /// Kernel label prefixes whose dispatches are left out of every step (`kestrel bench --skip
    /// a,b`): a measurement knob that gives a kernel's marginal cost in the pipelined step (the
    /// step without it against the step with it). The output is wrong while it is set.
    skip: Vec<String>,
    /// Per-kernel GPU time of the last profiled step.
    profile: Vec<KernelTime>,
    /// Weight bytes one decode step reads: every matrix but the per-layer embedding table (one
    /// row of it is gathered), and of the routed experts only the top_k / num_experts a token
    /// picks.
    decode_bytes: u64,
    weight_bytes: u64,
    state_bytes: u64,
    streaming: Option<Streaming>,
    /// The weights (host side): the drafter reads the token embedding from them.
    weights: Arc<ModelWeights>,
    /// K and V caches, one pair per KV-owning layer (`kv.caches` order), each `slots +
    /// VERIFY_MAX` rows.
    kcache: Vec<wgpu::Buffer>,
    vcache: Vec<wgpu::Buffer>,
    /// Final-norm hidden rows of the last step's output rows.
    final_hidden: wgpu::Buffer,
    last_rows: usize,
    /// Positions in the cache (committed).
    cached: usize,
    /// A verify step is running: decode-form kernels for every token, K/V to staging rows.
    verifying: bool,
    /// Steps go to the queue in segments as they are recorded (`run`, [`WgpuOptions::submit_segments`]).
    segmented: bool,
    /// `(pos0, rows)` staged by the last verify, until commit.
    staged: Option<(usize, usize)>,
    /// VERIFY_MAX rows of the widest cache: commit copies staged rows through it.
    commit_scratch: wgpu::Buffer,
    /// Where a prompt step's part past its last K/V write starts, when it runs for the last
    /// token alone ([`WgpuOptions::prompt_tail`]).
    tail: Option<PromptTail>,
    /// The recorded program, a line per dispatch ([`WgpuBackend::program_listing`]).
    listing: Vec<String>,
    /// The MTP drafter's program, when built with one ([`WgpuOptions::drafter`]).
    drafter: Option<DeviceDrafter>,
    /// The row of `final_hidden` whose argmax is the next token to feed (the drafter's first
    /// hidden input): the last row after a prompt or decode step, row n after `commit(n + 1)`.
    draft_row: Option<usize>,
}

/// The part of a prompt step past its last K/V write, run as a decode step of its last token:
/// from dispatch `start` (the last KV-owning layer's chunk attention) on, after the rows that
/// part reads of the last token are moved to row 0.
struct PromptTail {
    start: usize,
    /// The layer whose attention `start` is.
    layer: usize,
    /// (buffer, bytes per row): that layer's residual and q (as decode's attention reads it),
    /// the rope table and the per-layer inputs, each indexed by token.
    rows: Vec<(wgpu::Buffer, u64)>,
    /// Room for one row of each (a copy may not read and write one buffer).
    scratch: wgpu::Buffer,
    /// The tail's step (one token at the last position), copied over the step's uniform
    /// between the two parts.
    step: wgpu::Buffer,
}

impl WgpuBackend {
    /// Opens the GPU, uploads the weights and records the program.
    pub fn new(cfg: Config, w: Arc<ModelWeights>, opts: WgpuOptions) -> Result<Self> {
        let gpu = Gpu::new(opts.max_binding)?;
        Self::with_gpu(gpu, cfg, w, opts)
    }

    pub fn with_gpu(gpu: Gpu, cfg: Config, w: Arc<ModelWeights>, opts: WgpuOptions) -> Result<Self> {
        if cfg.text.enable_moe_block && cfg.text.num_experts > ROUTER_TOPK_WG as usize {
            return Err(Error::Invalid(format!(
                "{} experts: the router kernel handles at most {ROUTER_TOPK_WG} (use --backend cpu for this model)",
                cfg.text.num_experts
            )));
        }
        if cfg.assistant.is_some() {
            return Err(Error::Invalid("this is a gemma4_assistant drafter: pass it as --draft, not --model".into()));
        }
        for l in &cfg.layers {
            // Gemma 4 uses 256 and 512; the chunk attention's value slices need d ≤ 512.
            if l.head_dim > 512 || l.head_dim % 8 != 0 {
                return Err(Error::Invalid(format!(
                    "layer {}: head_dim {} is not a multiple of 8 up to 512, as the attention kernels need",
                    l.index, l.head_dim
                )));
            }
        }
        Builder::build(gpu, &cfg, &w, opts)
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The options the backend was built with (its [`Tuning`] among them).
    pub fn options(&self) -> &WgpuOptions {
        &self.opts
    }

    /// Weight bytes one decode step reads (what bounds decode speed).
    pub fn decode_bytes(&self) -> u64 {
        self.decode_bytes
    }

    /// Expert streaming figures, when experts stream through a slot cache.
    pub fn stream_stats(&self) -> Option<StreamStats> {
        self.streaming.as_ref().map(|s| s.streamer.stats())
    }

    /// Times every dispatch of the following steps (timestamps inside the pass) until turned
    /// off; read the result of the last step with [`WgpuBackend::last_profile`].
    pub fn set_profiling(&mut self, on: bool) -> Result<()> {
        self.set_timing(on, true)
    }

    /// Times the whole pass of the following steps (two timestamps) until turned off; the last
    /// step's GPU time is [`WgpuBackend::last_profile`]'s one entry, `step`.
    pub fn set_step_timing(&mut self, on: bool) -> Result<()> {
        self.set_timing(on, false)
    }

    /// Host time spent recording and submitting steps so far (what run-ahead decode hides
    /// behind the GPU), and how many steps.
    pub fn host_encode(&self) -> (std::time::Duration, u64) {
        (self.encode_time, self.encode_steps)
    }

    /// Dispatches one decode step records.
    /// The layer from whose attention on a prompt step runs for its last token alone
    /// ([`Tuning::prompt_tail`]); None where every layer runs for every token.
    pub fn prompt_tail_layer(&self) -> Option<usize> {
        self.tail.as_ref().map(|t| t.layer)
    }

    /// The recorded program, one line per dispatch: step forms, kernels (label and a hash of their
    /// WGSL), grid rules, bindings and params bytes. Two builds that list the same lines record
    /// the same program: how a refactor shows it changed nothing the GPU runs.
    pub fn program_listing(&self) -> String {
        let drafter = self.drafter.iter().flat_map(|d| d.listing.iter().map(|l| format!("drafter {l}\n")));
        self.listing.iter().map(|l| format!("{l}\n")).chain(drafter).collect()
    }

    /// Dispatches of a decode step at `pos` (which decode attention kernels run depends on it).
    pub fn decode_dispatches(&self, pos: usize) -> usize {
        self.program.iter().filter(|d| d.only != Only::Multi && d.keys.is_none_or(|k| k.owns(pos))).count()
    }

    /// Dispatches of a decode step that make buffers ready for the next one to run beside
    /// them ([`Tuning::moe_overlap`]: two per MoE layer where it applies).
    pub fn overlapped_pairs(&self) -> usize {
        self.program.iter().filter(|d| d.only != Only::Multi && !d.ready.is_empty()).count()
    }

    fn set_timing(&mut self, on: bool, per_dispatch: bool) -> Result<()> {
        if !on {
            self.profiler = None;
            return Ok(());
        }
        if self.streaming.is_some() {
            return Err(Error::Gpu(
                "per-kernel times need one pass per step: run with every expert resident (--expert-slots all)".into(),
            ));
        }
        if !self.gpu.can_profile() {
            return Err(Error::Gpu(
                "this adapter has no timestamp queries inside passes: per-kernel times are unavailable".into(),
            ));
        }
        let capacity = (self.program.len() as u32 + 1).min(wgpu::QUERY_SET_MAX_QUERIES);
        if (self.program.len() as u32 + 1) > capacity {
            return Err(Error::Gpu(format!(
                "{} dispatches per step exceed the {capacity} timestamps of a query set",
                self.program.len()
            )));
        }
        let dev = &self.gpu.device;
        let queries = dev.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("kernel timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: capacity,
        });
        let size = 8 * capacity as u64;
        let resolve = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamp resolve"),
            size,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let read = self.gpu.staging("timestamp readback", size);
        self.profiler = Some(Profiler { per_dispatch, queries, resolve, read, capacity });
        Ok(())
    }

    /// Per-kernel GPU time of the last profiled step, largest first.
    pub fn last_profile(&self) -> &[KernelTime] {
        &self.profile
    }

    fn collect_profile(&mut self, executed: &[(usize, u8)]) -> Result<()> {
        let p = self.profiler.as_ref().expect("called with a profiler");
        let n = p.queries_written(executed.len()) as usize;
        debug_assert!(n as u32 <= p.capacity);
        let mut bytes = Vec::new();
        self.gpu.read(&p.read, 8 * n as u64, &mut bytes)?;
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes);
        let ns_per_tick = self.gpu.queue.get_timestamp_period() as f64;
        if !p.per_dispatch {
            let us = ticks[1].saturating_sub(ticks[0]) as f64 * ns_per_tick / 1e3;
            self.profile = vec![KernelTime { kernel: "step".into(), dispatches: executed.len(), micros: us }];
            return Ok(());
        }
        let mut by_kernel: Vec<KernelTime> = Vec::new();
        for (k, &(di, variant)) in executed.iter().enumerate() {
            let us = ticks[k + 1].saturating_sub(ticks[k]) as f64 * ns_per_tick / 1e3;
            let d = &self.program[di];
            let label = d.label_of(variant);
            match by_kernel.iter_mut().find(|t| t.kernel == label) {
                Some(t) => {
                    t.micros += us;
                    t.dispatches += 1;
                }
                None => by_kernel.push(KernelTime { kernel: label.to_string(), dispatches: 1, micros: us }),
            }
        }
        by_kernel.sort_by(|a, b| b.micros.total_cmp(&a.micros));
        self.profile = by_kernel;
        Ok(())
    }

    fn write_rope(&mut self, pos0: usize, n: usize) {
        let (ds, df) = (self.cfg.text.head_dim, self.cfg.text.global_head_dim);
        rope_rows(&mut self.rope_host, &self.inv_freq, (ds, df), self.rope_stride, pos0, n);
        self.gpu.queue.write_buffer(&self.rope_buf, 0, bytemuck::cast_slice(&self.rope_host));
    }

    /// Runs the program for `tokens` at `pos0`, producing `n_out` rows of logits (the last ones).
    fn run(&mut self, tokens: &[u32], pos0: usize, n_out: usize, readback: Readback) -> Result<StepOutput> {
        self.run_ids(Ids::Host(tokens), pos0, n_out, readback)
    }

    /// [`Self::run`] for ids from the host, or already in the ids buffer (a drafter's).
    fn run_ids(&mut self, ids: Ids, pos0: usize, n_out: usize, readback: Readback) -> Result<StepOutput> {
        let n = match ids {
            Ids::Host(t) => t.len(),
            Ids::OnDevice(n) => n,
        };
        if n == 0 || n > self.opts.max_chunk {
            return Err(Error::Invalid(format!("a step takes 1..={} tokens, got {n}", self.opts.max_chunk)));
        }
        if pos0 + n > self.kv.max_ctx {
            return Err(Error::Invalid(format!(
                "position {} is past the context of {} (raise --ctx)",
                pos0 + n,
                self.kv.max_ctx
            )));
        }
        if n_out > self.logit_rows {
            return Err(Error::Invalid(format!("{n_out} logit rows requested, the buffers hold {}", self.logit_rows)));
        }
        let vocab = self.cfg.text.vocab_size;
        if let Ids::Host(tokens) = ids {
            if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= vocab) {
                return Err(Error::Invalid(format!("token id {bad} is outside the vocabulary (size {vocab})")));
            }
            self.gpu.queue.write_buffer(&self.ids_buf, 0, bytemuck::cast_slice(tokens));
        }
        let step = Step {
            n_tokens: n as u32,
            pos0: pos0 as u32,
            n_out: n_out as u32,
            out_row0: (n - n_out) as u32,
            staged: self.verifying as u32,
            ..Default::default()
        };
        self.gpu.queue.write_buffer(&self.step_buf, 0, bytemuck::bytes_of(&step));
        self.write_rope(pos0, n);

        // Validation errors (a bug, or a device limit the recording missed) become an Err here
        // instead of wgpu's default panic.
        let scope = self.gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut executed: Vec<(usize, u8)> = Vec::new();
        let mut start = 0;
        if let Some(mut st) = self.streaming.take() {
            let r = self.run_streamed_layers(&mut st, n, pos0, n_out, &mut start);
            self.streaming = Some(st);
            if let Err(e) = r {
                let _ = pollster::block_on(scope.pop());
                return Err(e);
            }
        }
        let t_enc = std::time::Instant::now();
        // A prompt step that returns at most one row runs the program up to `head_end` (the last
        // K/V write) for every token, then, for a row, the rest as a decode step of the last.
        let cut = self.tail.as_ref().filter(|_| n > 1 && n_out <= 1 && !self.verifying);
        let head_end = cut.map_or(self.program.len(), |t| t.start);
        let tail = cut.filter(|_| n_out == 1);
        if let Some(t) = tail {
            let step = Step { n_tokens: 1, pos0: (pos0 + n - 1) as u32, n_out: 1, ..Default::default() };
            self.gpu.queue.write_buffer(&t.step, 0, bytemuck::bytes_of(&step));
        }
        // Segments of 16, 32, 64, … dispatches go to the queue as they are recorded, so that the
        // GPU starts on a chunk while the host records the rest (500–800 dispatches take the host
        // 2–4 ms; a dispatch of a 512-token chunk takes the GPU ≈ 50–100 µs, so the host stays
        // ahead after the first). One pass when profiling (its timestamps).
        if self.profiler.is_none() && self.segmented {
            let mut seg = FIRST_SEGMENT;
            while head_end - start > seg {
                self.submit_range(start..start + seg, n, pos0, n_out, None);
                start += seg;
                seg *= 2;
            }
        }
        let mut enc = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        {
            let mut pass =
                enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("forward"), timestamp_writes: None });
            if let Some(p) = &self.profiler {
                pass.write_timestamp(&p.queries, 0);
            }
            self.encode(&mut pass, start..head_end, n, pos0, n_out, &mut executed);
            if let Some(p) = self.profiler.as_ref().filter(|p| !p.per_dispatch && tail.is_none()) {
                pass.write_timestamp(&p.queries, 1);
            }
        }
        if let Some(t) = tail {
            // Row n − 1 of each buffer the tail reads by token becomes row 0, through the
            // scratch; then the tail's step replaces the prompt's.
            let mut off = 0;
            for (buf, row) in &t.rows {
                enc.copy_buffer_to_buffer(buf, (n as u64 - 1) * row, &t.scratch, off, Some(*row));
                off += row;
            }
            off = 0;
            for (buf, row) in &t.rows {
                enc.copy_buffer_to_buffer(&t.scratch, off, buf, 0, Some(*row));
                off += row;
            }
            enc.copy_buffer_to_buffer(&t.step, 0, &self.step_buf, 0, Some(std::mem::size_of::<Step>() as u64));
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("prompt tail"),
                timestamp_writes: None,
            });
            self.encode(&mut pass, head_end..self.program.len(), 1, pos0 + n - 1, 1, &mut executed);
            if let Some(p) = self.profiler.as_ref().filter(|p| !p.per_dispatch) {
                pass.write_timestamp(&p.queries, 1);
            }
        }
        if let Some(p) = &self.profiler {
            let n = p.queries_written(executed.len());
            enc.resolve_query_set(&p.queries, 0..n, &p.resolve, 0);
            enc.copy_buffer_to_buffer(&p.resolve, 0, &p.read, 0, Some(8 * n as u64));
        }
        let want_logits = readback != Readback::Argmax && n_out > 0;
        if n_out > 0 {
            enc.copy_buffer_to_buffer(&self.best_buf, 0, &self.best_read, 0, Some((4 * n_out) as u64));
            if want_logits {
                enc.copy_buffer_to_buffer(&self.logits_buf, 0, &self.logits_read, 0, Some((4 * n_out * vocab) as u64));
            }
        }
        self.gpu.queue.submit([enc.finish()]);
        self.encode_time += t_enc.elapsed();
        self.encode_steps += 1;
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("step rejected by the device: {e}")));
        }
        if self.profiler.is_some() {
            self.collect_profile(&executed)?;
        }
        let mut out = StepOutput::default();
        if n_out == 0 {
            // Wait so errors surface in this step, not the next.
            self.gpu
                .device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| Error::Gpu(format!("device poll failed: {e}")))?;
            return Ok(out);
        }
        let mut scratch = std::mem::take(&mut self.read_scratch);
        self.gpu.read(&self.best_read, (4 * n_out) as u64, &mut scratch)?;
        out.argmax = bytemuck::pod_collect_to_vec(&scratch);
        if want_logits {
            self.gpu.read(&self.logits_read, (4 * n_out * vocab) as u64, &mut scratch)?;
            out.logits = bytemuck::pod_collect_to_vec(&scratch);
        }
        self.read_scratch = scratch;
        Ok(out)
    }
    /// Submits one decode step at `pos` whose input id is `token`, or, when `None`, the argmax
    /// the previous step left in the ids buffer (run-ahead: the host has not read it yet). The
    /// step's argmax goes to `read` and to the ids buffer for the step after it.
    fn submit_decode(&mut self, token: Option<u32>, pos: usize, read: usize) -> Result<wgpu::SubmissionIndex> {
        if pos + 1 > self.kv.max_ctx {
            return Err(Error::Invalid(format!(
                "position {} is past the context of {} (raise --ctx)",
                pos + 1,
                self.kv.max_ctx
            )));
        }
        let step = Step { n_tokens: 1, pos0: pos as u32, n_out: 1, out_row0: 0, staged: 0, ..Default::default() };
        self.gpu.queue.write_buffer(&self.step_buf, 0, bytemuck::bytes_of(&step));
        if let Some(t) = token {
            self.gpu.queue.write_buffer(&self.ids_buf, 0, bytemuck::bytes_of(&t));
        }
        self.write_rope(pos, 1);
        let scope = self.gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let t_enc = std::time::Instant::now();
        let mut enc =
            self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("decode step") });
        {
            let mut pass =
                enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("forward"), timestamp_writes: None });
            self.encode(&mut pass, 0..self.program.len(), 1, pos, 1, &mut Vec::new());
        }
        enc.copy_buffer_to_buffer(&self.best_buf, 0, &self.chain_read[read], 0, Some(4));
        enc.copy_buffer_to_buffer(&self.best_buf, 0, &self.ids_buf, 0, Some(4));
        let index = self.gpu.queue.submit([enc.finish()]);
        self.encode_time += t_enc.elapsed();
        self.encode_steps += 1;
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("step rejected by the device: {e}")));
        }
        Ok(index)
    }

    /// Records dispatches `range` of the program for a step of `n` tokens from position `pos0`
    /// and `n_out` output rows.
    fn encode(
        &self,
        pass: &mut wgpu::ComputePass,
        range: std::ops::Range<usize>,
        n: usize,
        pos0: usize,
        n_out: usize,
        executed: &mut Vec<(usize, u8)>,
    ) {
        self.encode_program(&self.program, pass, range, n, Some((pos0, pos0)), n_out, Some(executed));
    }

    /// [`Self::encode`] for any recorded program (the drafter's: `executed` None, untimed).
    /// `pos0`: the step's first position, or the range it lies in when only the GPU knows it (a
    /// round after one it accepted): a one-token step then dispatches every decode attention
    /// kernel that owns the row at some position of the range (each computes only the rows it
    /// owns); None: any position.
    #[allow(clippy::too_many_arguments)]
    fn encode_program(
        &self,
        program: &[Dispatch],
        pass: &mut wgpu::ComputePass,
        range: std::ops::Range<usize>,
        n: usize,
        pos0: Option<(usize, usize)>,
        n_out: usize,
        mut executed: Option<&mut Vec<(usize, u8)>>,
    ) {
        // Verify steps run the decode form of every kernel (split attention, per-pair experts) for
        // all their tokens: that is what makes each row's logits bitwise a decode's.
        let single_form = n == 1 || self.verifying;
        for di in range {
            let d = &program[di];
            match d.only {
                Only::Single if !single_form => continue,
                Only::Multi if single_form => continue,
                _ => {}
            }
            if n == 1 && pos0.is_some_and(|(lo, hi)| d.keys.is_some_and(|k| !(lo..=hi).any(|p| k.owns(p)))) {
                continue;
            }
            let mut z_tokens = false;
            let y = match d.y {
                GridY::Slots(k) => {
                    z_tokens = true;
                    k
                }
                GridY::One => 1,
                GridY::Fixed(k) => k,
                GridY::Tokens => n as u32,
                GridY::TokenTiles(k) => (n as u32).div_ceil(k),
                GridY::SplitTokenTiles(k, splits) => (n as u32).div_ceil(k) * splits,
                GridY::Out => n_out as u32,
                GridY::OutTiles(k) => (n_out as u32).div_ceil(k),
            };
            let x = if d.x_from_out {
                n_out as u32
            } else if d.x_from_tokens {
                n as u32
            } else {
                d.x
            };
            if x == 0 || y == 0 {
                continue;
            }
            let (x, z) = fold_grid(x, self.max_groups);
            let count = match d.y {
                GridY::Out | GridY::OutTiles(_) => n_out,
                _ => n,
            };
            let (pipeline, x, y, z, variant) = match (&d.single, &d.verify) {
                (Some(v), _) if count == 1 => {
                    let (sx, sz) = fold_grid(v.x, self.max_groups);
                    (&v.pipeline, sx, 1, sz, 1)
                }
                (_, Some(v)) if self.verifying => {
                    let (vx, vz) = fold_grid(v.x, self.max_groups);
                    let (pipeline, tok) = v.tile(count as u32);
                    (pipeline, vx, (count as u32).div_ceil(tok), vz, 2)
                }
                _ => (&d.pipeline, x, y, z, 0),
            };
            // Slot grids put the tokens on z, so their x must not need folding (rows ≤
            // 4 · 65535 for the expert and attention kernels that use them).
            debug_assert!(!z_tokens || z == 1, "slot grid with a folded x");
            let z = if z_tokens { n as u32 } else { z };
            if self.skip.iter().any(|s| d.label_of(variant).starts_with(s.as_str())) {
                continue;
            }
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &d.bind_group, &[]);
            if !d.ready.is_empty() {
                let ready = d
                    .ready
                    .iter()
                    .map(|buffer| wgpu::BufferTransition { buffer, state: wgpu::BufferUses::STORAGE_READ_ONLY });
                pass.transition_resources(ready, std::iter::empty());
            }
            pass.dispatch_workgroups(x, y, z);
            if let (Some(p), Some(executed)) = (&self.profiler, executed.as_deref_mut()) {
                executed.push((di, variant));
                if p.per_dispatch {
                    pass.write_timestamp(&p.queries, executed.len() as u32);
                }
            }
        }
    }

    /// Submits `range` as its own command buffer.
    fn submit_range(
        &self,
        range: std::ops::Range<usize>,
        n: usize,
        pos0: usize,
        n_out: usize,
        copy: Option<(&wgpu::Buffer, &wgpu::Buffer, u64)>,
    ) -> wgpu::SubmissionIndex {
        let mut enc =
            self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step segment") });
        {
            let mut pass =
                enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("segment"), timestamp_writes: None });
            self.encode(&mut pass, range, n, pos0, n_out, &mut Vec::new());
        }
        if let Some((src, dst, len)) = copy {
            enc.copy_buffer_to_buffer(src, 0, dst, 0, Some(len));
        }
        self.gpu.queue.submit([enc.finish()])
    }

    /// Runs the program up to the last MoE layer's routed kernels, streaming each layer's
    /// experts in between; leaves `start` at the first dispatch still to run.
    fn run_streamed_layers(
        &mut self,
        st: &mut Streaming,
        n: usize,
        pos0: usize,
        n_out: usize,
        start: &mut usize,
    ) -> Result<()> {
        let idx_bytes = (4 * n * st.top_k) as u64;
        let mut scratch = std::mem::take(&mut self.read_scratch);
        for mi in 0..st.marks.len() {
            let mk = st.marks[mi];
            let routed =
                self.submit_range(*start..mk.route_end, n, pos0, n_out, Some((&st.route_idx, &st.idx_read, idx_bytes)));
            // The dense branch does not read the experts: it runs while the host reads misses.
            self.submit_range(mk.route_end..mk.experts_begin, n, pos0, n_out, None);
            self.gpu.read_after(&st.idx_read, idx_bytes, Some(routed), &mut scratch)?;
            let pairs: Vec<u32> = bytemuck::pod_collect_to_vec(&scratch);
            let slots = &st.slots[&mk.layer];
            let queue = &self.gpu.queue;
            for round in st.streamer.rounds(mk.layer, &pairs) {
                let table = st.streamer.load(mk.layer, &round, &pairs, &mut |slot, blob| {
                    slots.write(queue, slot, blob);
                    Ok(())
                })?;
                queue.write_buffer(&st.slot_idx, 0, bytemuck::cast_slice(&table));
                self.submit_range(mk.experts_begin..mk.experts_end, n, pos0, n_out, None);
            }
            *start = mk.experts_end;
        }
        st.streamer.count_tokens(n);
        self.read_scratch = scratch;
        Ok(())
    }
}

/// The MTP drafter on the GPU ([`WgpuOptions::drafter`]).
impl WgpuBackend {
    /// Records `k` drafter steps at query position `pos` into `enc`, the first fed the token the
    /// drafter's ids hold and the hidden row in its input, each next one the last one's draft and
    /// projection; the drafts go to `drafts` (and to `also`, at byte offset `.1`, when given).
    /// The caller has written the step uniform, the rope table and the first id.
    fn record_drafts(
        &self,
        enc: &mut wgpu::CommandEncoder,
        k: usize,
        pos: (usize, usize),
        also: Option<(&wgpu::Buffer, u64)>,
    ) {
        let d = self.drafter.as_ref().expect("checked by the callers");
        let hb = 4 * d.hb as u64;
        for j in 0..k {
            {
                let mut pass = enc
                    .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("draft"), timestamp_writes: None });
                // pos0 = p − 1: see builder/drafter.rs on the masks.
                self.encode_program(
                    &d.program,
                    &mut pass,
                    0..d.program.len(),
                    1,
                    Some((pos.0 - 1, pos.1 - 1)),
                    1,
                    None,
                );
            }
            enc.copy_buffer_to_buffer(&d.best, 0, &d.drafts, 4 * j as u64, Some(4));
            if j + 1 < k {
                enc.copy_buffer_to_buffer(&d.best, 0, &d.ids, 0, Some(4));
                enc.copy_buffer_to_buffer(&d.hidden_out, 0, &d.cat, hb, Some(hb));
            }
        }
        if let Some((buf, off)) = also {
            enc.copy_buffer_to_buffer(&d.drafts, 0, buf, off, Some(4 * k as u64));
        }
        enc.copy_buffer_to_buffer(&d.drafts, 0, &d.drafts_read, 0, Some(4 * k as u64));
    }

    /// Checks a drafting request and writes the drafter's step uniform, rope row and first id.
    fn start_drafts(&mut self, token: u32, pos: usize, k: usize) -> Result<()> {
        let d = self.drafter.as_ref().expect("checked by the callers");
        if k == 0 || k + 1 > self.max_verify() || pos == 0 || pos != self.cached {
            return Err(Error::Invalid(format!(
                "a draft of {k} tokens at position {pos}: 1..{} drafts at the committed length {} (> 0)",
                self.max_verify(),
                self.cached
            )));
        }
        if token as usize >= self.cfg.text.vocab_size {
            return Err(Error::Invalid(format!("token id {token} is outside the vocabulary")));
        }
        let step = Step { n_tokens: 1, pos0: (pos - 1) as u32, n_out: 1, out_row0: 0, staged: 0, ..Default::default() };
        let q = &self.gpu.queue;
        q.write_buffer(&d.step_buf, 0, bytemuck::bytes_of(&step));
        q.write_buffer(&d.ids, 0, bytemuck::bytes_of(&token));
        let dims = (self.cfg.text.head_dim, self.cfg.text.global_head_dim);
        let mut rope = std::mem::take(&mut self.rope_host);
        rope_rows(&mut rope, &d.inv_freq, dims, d.rope_stride, pos, 1);
        q.write_buffer(&d.rope_buf, 0, bytemuck::cast_slice(&rope));
        self.rope_host = rope;
        Ok(())
    }

    /// Keeps the rope ring holding the rows of positions `from .. from + 3 · VERIFY_MAX` (every
    /// row a round started at most k + 1 positions after `from` can read: spec_rows' mode 2),
    /// writing only those past `*filled`, the end of what it already holds (0: nothing), which it
    /// advances. Rows of positions before `from` may be overwritten: the rounds that read them
    /// were submitted before, and the writes land after them.
    fn fill_ring(&mut self, from: usize, filled: &mut usize) {
        let d = self.drafter.as_ref().expect("checked by the callers");
        let dims = (self.cfg.text.head_dim, self.cfg.text.global_head_dim);
        let (stride, end) = (self.rope_stride, from + 3 * VERIFY_MAX);
        let start = (*filled).clamp(from, end);
        if start == end {
            return;
        }
        let n = end - start;
        let mut rope = std::mem::take(&mut self.rope_host);
        rope_rows(&mut rope, &self.inv_freq, dims, stride, start, n);
        // Up to two contiguous pieces of the ring.
        let first = (start % RING_ROWS, (RING_ROWS - start % RING_ROWS).min(n));
        let q = &self.gpu.queue;
        q.write_buffer(&d.ring, (4 * first.0 * stride) as u64, bytemuck::cast_slice(&rope[..first.1 * stride]));
        if first.1 < n {
            q.write_buffer(&d.ring, 0, bytemuck::cast_slice(&rope[first.1 * stride..]));
        }
        self.rope_host = rope;
        *filled = end;
    }

    /// Records a round's body after its prologue: k drafter steps (drafts also behind the first id
    /// in the target's ids), the k + 1 verify, and the drafts and argmax copied to readback `slot`.
    /// `pos`: the range the round's first position lies in (one position where the host knows it).
    fn record_round(&mut self, enc: &mut wgpu::CommandEncoder, k: usize, pos: (usize, usize), slot: usize) {
        self.record_drafts(enc, k, pos, Some((&self.ids_buf, 4)));
        self.verifying = true;
        {
            let mut pass =
                enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("verify"), timestamp_writes: None });
            self.encode_program(&self.program, &mut pass, 0..self.program.len(), k + 1, Some(pos), k + 1, None);
        }
        self.verifying = false;
        let d = self.drafter.as_ref().expect("checked by the callers");
        let read = &d.round_read[slot];
        enc.copy_buffer_to_buffer(&d.drafts, 0, read, 0, Some(4 * k as u64));
        enc.copy_buffer_to_buffer(&self.best_buf, 0, read, 4 * VERIFY_MAX as u64, Some(4 * (k + 1) as u64));
    }

    /// Submits the round after one the GPU accepts: spec_accept and spec_rows (commit, next hidden,
    /// rope rows), both step uniforms from the words spec_accept wrote, then the round's body.
    /// `after`: where the round it accepts started (the next one starts 1 ..= k + 1 later).
    fn submit_accepted_round(&mut self, k: usize, after: usize, slot: usize) -> Result<wgpu::SubmissionIndex> {
        let scope = self.gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut enc = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("round") });
        let d = self.drafter.as_ref().expect("checked by the callers");
        {
            let mut pass =
                enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("accept"), timestamp_writes: None });
            self.encode_program(&d.accept, &mut pass, 0..d.accept.len(), 1, None, 1, None);
        }
        let step = std::mem::size_of::<Step>() as u64;
        enc.copy_buffer_to_buffer(&d.steps, 0, &self.step_buf, 0, Some(step));
        enc.copy_buffer_to_buffer(&d.steps, step, &d.step_buf, 0, Some(step));
        self.record_round(&mut enc, k, (after + 1, after + k + 1), slot);
        let index = self.gpu.queue.submit([enc.finish()]);
        match pollster::block_on(scope.pop()) {
            Some(e) => Err(Error::Gpu(format!("speculative round rejected by the device: {e}"))),
            None => Ok(index),
        }
    }

    /// Reads a round's readback `slot` once submission `after` is done: the drafts in words
    /// `[0, k)`, the verify's argmax in `[VERIFY_MAX, VERIFY_MAX + k]`. No allocation: rounds
    /// read one of these each.
    fn read_round(&mut self, slot: usize, after: wgpu::SubmissionIndex) -> Result<[u32; 2 * VERIFY_MAX]> {
        let d = self.drafter.as_ref().expect("checked by the callers");
        let mut scratch = std::mem::take(&mut self.read_scratch);
        let r = self.gpu.read_after(&d.round_read[slot], (4 * 2 * VERIFY_MAX) as u64, Some(after), &mut scratch);
        let mut words = [0u32; 2 * VERIFY_MAX];
        if r.is_ok() {
            bytemuck::cast_slice_mut::<u32, u8>(&mut words).copy_from_slice(&scratch);
        }
        self.read_scratch = scratch;
        r.map(|_| words)
    }

    /// The last drafter step's projected hidden (`post_projection` output, the next step's
    /// input), read back: tests compare it with the host drafter's.
    pub fn draft_hidden(&self) -> Result<Vec<f32>> {
        let d = self.drafter.as_ref().ok_or_else(|| Error::Invalid("built without a drafter".into()))?;
        let len = 4 * d.hb as u64;
        let staging = self.gpu.staging("drafter hidden readback", len);
        let mut enc = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("hidden") });
        enc.copy_buffer_to_buffer(&d.hidden_out, 0, &staging, 0, Some(len));
        self.gpu.queue.submit([enc.finish()]);
        let mut bytes = Vec::new();
        self.gpu.read(&staging, len, &mut bytes)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Reads the drafts the last round left in the readback buffer.
    fn read_drafts(&mut self, k: usize) -> Result<Vec<u32>> {
        let d = self.drafter.as_ref().expect("checked by the callers");
        let mut scratch = std::mem::take(&mut self.read_scratch);
        let r = self.gpu.read(&d.drafts_read, 4 * k as u64, &mut scratch);
        let drafts = bytemuck::pod_collect_to_vec(&scratch);
        self.read_scratch = scratch;
        r.map(|_| drafts)
    }
}

impl Backend for WgpuBackend {
    fn name(&self) -> &str {
        "wgpu"
    }
    fn device_info(&self) -> String {
        self.gpu.describe()
    }
    fn config(&self) -> &Config {
        &self.cfg
    }
    fn max_chunk(&self) -> usize {
        self.opts.max_chunk
    }
    fn max_context(&self) -> usize {
        self.kv.max_ctx
    }
    fn prefill(&mut self, tokens: &[u32], pos: usize, readback: Readback) -> Result<StepOutput> {
        let n_out = match readback {
            Readback::AllLogits => tokens.len(),
            Readback::Nothing => 0,
            _ => 1,
        };
        self.staged = None;
        let out = self.run(tokens, pos, n_out, readback)?;
        self.cached = pos + tokens.len();
        self.last_rows = n_out;
        self.draft_row = n_out.checked_sub(1);
        Ok(out)
    }
    fn verify(&mut self, tokens: &[u32], pos: usize, with_logits: bool) -> Result<StepOutput> {
        let n = tokens.len();
        if n == 0 || n > self.max_verify() {
            return Err(Error::Invalid(format!("a verify scores 1..={} tokens, got {n}", self.max_verify())));
        }
        if pos != self.cached {
            return Err(Error::Invalid(format!(
                "verify at position {pos}, but the cache holds {} positions",
                self.cached
            )));
        }
        self.verifying = true;
        let out = self.run(tokens, pos, n, if with_logits { Readback::AllLogits } else { Readback::Argmax });
        self.verifying = false;
        let out = out?;
        self.staged = Some((pos, n));
        self.last_rows = n;
        self.draft_row = None;
        Ok(out)
    }
    fn max_verify(&self) -> usize {
        VERIFY_MAX.min(self.opts.max_chunk)
    }
    /// Runs one step ahead of the host: step i + 1 (its id taken from step i's argmax on the
    /// GPU) is recorded and submitted before the host waits for step i's id, so the recording
    /// of a step overlaps the GPU's work on the previous one. Streamed experts need the host
    /// between the router and the experts, and profiles one step alone: both take the plain
    /// loop.
    fn decode_greedy(
        &mut self,
        token: u32,
        pos: usize,
        max: usize,
        on_token: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<usize> {
        if self.streaming.is_some() || self.profiler.is_some() {
            return crate::backend::greedy_steps(self, token, pos, max, on_token);
        }
        if max == 0 {
            return Ok(0);
        }
        self.staged = None;
        let mut scratch = std::mem::take(&mut self.read_scratch);
        let mut in_flight = self.submit_decode(Some(token), pos, 0)?;
        let mut produced = 0;
        // Whether a step past the last id handed out was already submitted when the host stopped.
        let mut ran_past = false;
        let result = loop {
            // Step `produced` is in flight; queue the one after it unless it is the last.
            let next = if produced + 1 < max {
                Some(self.submit_decode(None, pos + produced + 1, (produced + 1) % 2))
            } else {
                None
            };
            let next = match next.transpose() {
                Ok(n) => n,
                Err(e) => break Err(e),
            };
            if let Err(e) = self.gpu.read_after(&self.chain_read[produced % 2], 4, Some(in_flight), &mut scratch) {
                break Err(e);
            }
            let tok: u32 = bytemuck::pod_read_unaligned(&scratch[..4]);
            produced += 1;
            // The cache holds the positions of the ids handed out. A step run ahead past the
            // last one wrote K/V at the next position, which the next step there overwrites
            // before any read (reads reach only positions this sequence has written).
            self.cached = pos + produced;
            match on_token(tok) {
                Ok(true) => {}
                Ok(false) => {
                    ran_past = next.is_some();
                    break Ok(produced);
                }
                Err(e) => break Err(e),
            }
            match next {
                Some(n) => in_flight = n,
                None => break Ok(produced),
            }
        };
        self.read_scratch = scratch;
        // The final-norm hidden row is the last step run's: none of the ids' when a step ran past.
        self.last_rows = if ran_past { 0 } else { 1 };
        self.draft_row = if ran_past { None } else { Some(0) };
        result
    }
    fn commit(&mut self, n: usize) -> Result<()> {
        let Some((pos0, rows)) = self.staged.take() else {
            return Err(Error::Invalid("commit without a verify before it".into()));
        };
        if n > rows {
            return Err(Error::Invalid(format!("commit of {n} rows, the last verify staged {rows}")));
        }
        // Staging row r holds position pos0 + r: copy it to that position's ring row, through
        // a scratch buffer (a copy may not read and write one buffer).
        let scope = self.gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut enc = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("commit") });
        for (i, cs) in self.kv.caches.iter().enumerate() {
            let row = (cs.slot_elems() * 4) as u64;
            for cache in [&self.kcache[i], &self.vcache[i]] {
                enc.copy_buffer_to_buffer(cache, cs.slots as u64 * row, &self.commit_scratch, 0, Some(n as u64 * row));
                for r in 0..n {
                    let dst = ((pos0 + r) % cs.slots) as u64 * row;
                    enc.copy_buffer_to_buffer(&self.commit_scratch, r as u64 * row, cache, dst, Some(row));
                }
            }
        }
        self.gpu.queue.submit([enc.finish()]);
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("commit rejected by the device: {e}")));
        }
        self.cached = pos0 + n;
        // The last committed row's argmax is the next token; its hidden row feeds the drafter.
        self.draft_row = n.checked_sub(1);
        Ok(())
    }
    fn draft_context(&self) -> Option<&dyn crate::spec::DraftContext> {
        Some(self)
    }
    /// Drafts on the GPU from a hidden row the host passes (tests compare it with the host
    /// drafter's); the speculative loop uses [`Backend::draft_verify`], which keeps it there.
    fn draft(&mut self, token: u32, hidden: &[f32], pos: usize, k: usize) -> Result<Option<Vec<u32>>> {
        let Some(d) = &self.drafter else { return Ok(None) };
        if hidden.len() != d.hb {
            return Err(Error::Invalid(format!("a hidden row of {} values, the drafter takes {}", hidden.len(), d.hb)));
        }
        self.gpu.queue.write_buffer(&d.cat, 4 * d.hb as u64, bytemuck::cast_slice(hidden));
        self.start_drafts(token, pos, k)?;
        let scope = self.gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut enc = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("draft") });
        self.record_drafts(&mut enc, k, (pos, pos), None);
        self.gpu.queue.submit([enc.finish()]);
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("draft rejected by the device: {e}")));
        }
        self.read_drafts(k).map(Some)
    }
    /// Drafts k tokens from `token` and the hidden row that produced it (left on the GPU by the
    /// last step or commit), copies them behind `token` in the ids buffer and verifies the k + 1
    /// tokens, all submitted before the host waits once, for the verify's argmax.
    fn draft_verify(&mut self, token: u32, pos: usize, k: usize) -> Result<Option<(Vec<u32>, StepOutput)>> {
        let Some(d) = &self.drafter else { return Ok(None) };
        if self.streaming.is_some() {
            // Streamed experts need the host inside every target step: the plain loop.
            return Ok(None);
        }
        let Some(row) = self.draft_row.filter(|&r| r < self.last_rows) else {
            return Err(Error::Invalid("drafting needs a target step first (no hidden state kept)".into()));
        };
        let hb = 4 * d.hb as u64;
        let (cat, final_hidden) = (d.cat.clone(), self.final_hidden.clone());
        self.start_drafts(token, pos, k)?;
        self.gpu.queue.write_buffer(&self.ids_buf, 0, bytemuck::bytes_of(&token));
        let scope = self.gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut enc = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("draft") });
        enc.copy_buffer_to_buffer(&final_hidden, row as u64 * hb, &cat, hb, Some(hb));
        self.record_drafts(&mut enc, k, (pos, pos), Some((&self.ids_buf, 4)));
        self.gpu.queue.submit([enc.finish()]);
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("draft rejected by the device: {e}")));
        }
        self.verifying = true;
        let out = self.run_ids(Ids::OnDevice(k + 1), pos, k + 1, Readback::Argmax);
        self.verifying = false;
        let out = out?;
        self.staged = Some((pos, k + 1));
        self.last_rows = k + 1;
        self.draft_row = None;
        Ok(Some((self.read_drafts(k)?, out)))
    }
    /// Rounds one ahead of the host: round r + 1 starts with the GPU accepting round r (its
    /// commit, the next id, hidden row, positions and rope rows: spec_accept/spec_rows), so it is
    /// recorded and submitted before the host reads round r. Round 0 is set up by the host, as
    /// `draft_verify` does. A round is run ahead only where the context has room for it wherever
    /// the round before ends; without room the rounds stop (the last one committed from the
    /// host) and the caller goes on with its own loop.
    fn speculate(&mut self, token: u32, pos: usize, k: usize, on_round: OnRound<'_>) -> Result<Option<usize>> {
        let Some(d) = &self.drafter else { return Ok(None) };
        if self.streaming.is_some() || self.profiler.is_some() {
            return Ok(None);
        }
        let Some(row) = self.draft_row.filter(|&r| r < self.last_rows) else {
            return Err(Error::Invalid("drafting needs a target step first (no hidden state kept)".into()));
        };
        // A round started at most k + 1 after `p` stays below p + 2 (k + 1).
        let max_ctx = self.kv.max_ctx;
        let room = move |p: usize| p + 2 * (k + 1) <= max_ctx;
        if !room(pos) {
            return Ok(None);
        }
        // ---- round 0, set up by the host
        let hb = 4 * d.hb as u64;
        let (cat, final_hidden, state) = (d.cat.clone(), self.final_hidden.clone(), d.state.clone());
        self.start_drafts(token, pos, k)?;
        let q = &self.gpu.queue;
        q.write_buffer(&self.ids_buf, 0, bytemuck::bytes_of(&token));
        let step =
            Step { n_tokens: (k + 1) as u32, pos0: pos as u32, n_out: (k + 1) as u32, staged: 1, ..Default::default() };
        q.write_buffer(&self.step_buf, 0, bytemuck::bytes_of(&step));
        q.write_buffer(&state, 0, bytemuck::cast_slice(&[pos as u32, 0, 0, 0, k as u32]));
        self.write_rope(pos, k + 1);
        let mut ring_filled = 0;
        self.fill_ring(pos, &mut ring_filled);
        let scope = self.gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut enc = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("round") });
        enc.copy_buffer_to_buffer(&final_hidden, row as u64 * hb, &cat, hb, Some(hb));
        self.record_round(&mut enc, k, (pos, pos), 0);
        let mut in_flight = self.gpu.queue.submit([enc.finish()]);
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("speculative round rejected by the device: {e}")));
        }
        self.staged = None;
        self.draft_row = None;
        self.last_rows = 0;
        // `p`: where the round being read started (known: the host has read the ones before).
        let mut p = pos;
        let mut r = 0;
        loop {
            let ahead = if room(p) {
                self.fill_ring(p, &mut ring_filled);
                Some(self.submit_accepted_round(k, p, (r + 1) % 2)?)
            } else {
                None
            };
            let words = self.read_round(r % 2, in_flight)?;
            let (drafts, argmax) = (&words[..k], &words[VERIFY_MAX..VERIFY_MAX + k + 1]);
            let n = drafts.iter().zip(argmax).take_while(|(d, t)| d == t).count();
            let (start, go) = (p, on_round(drafts, argmax)?);
            p += n + 1;
            r += 1;
            match ahead {
                Some(next) if go => in_flight = next,
                Some(_) => {
                    // The round run ahead committed this one's rows first; its own are staged
                    // and never committed.
                    self.cached = p;
                    return Ok(Some(r));
                }
                None => {
                    self.staged = Some((start, k + 1));
                    self.last_rows = k + 1;
                    self.commit(n + 1)?;
                    return Ok(Some(r));
                }
            }
        }
    }
    fn reset(&mut self) {
        // Positions restart at 0 and every read is masked to positions already written in this
        // sequence, so stale cache contents are never seen.
        self.cached = 0;
        self.staged = None;
        self.last_rows = 0;
        self.draft_row = None;
    }
    fn memory(&self) -> MemoryUse {
        MemoryUse { weight_bytes: self.weight_bytes, state_bytes: self.state_bytes }
    }
    fn stream_stats(&self) -> Option<StreamStats> {
        WgpuBackend::stream_stats(self)
    }
    fn tuning(&self) -> Option<&Tuning> {
        Some(&self.opts.tuning)
    }
}

/// The drafter's view of this target, by readback: K/V rows of the producer layers (from their
/// ring rows), the final-norm hidden rows of the last step, and token embeddings from the host
/// copy of the weights. Correct, not fast: a GPU drafter would read them in place.
impl crate::spec::DraftContext for WgpuBackend {
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
        let row = (cs.slot_elems() * 4) as u64;
        let n = positions.len() as u64;
        let read = |buf: &wgpu::Buffer| -> Result<Vec<f32>> {
            if n == 0 {
                return Ok(Vec::new());
            }
            let staging = self.gpu.staging("drafter kv readback", n * row);
            let mut enc =
                self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("drafter kv") });
            for (i, p) in positions.clone().enumerate() {
                enc.copy_buffer_to_buffer(buf, (p % cs.slots) as u64 * row, &staging, i as u64 * row, Some(row));
            }
            self.gpu.queue.submit([enc.finish()]);
            let mut bytes = Vec::new();
            self.gpu.read(&staging, n * row, &mut bytes)?;
            Ok(bytemuck::pod_collect_to_vec(&bytes))
        };
        Ok(crate::spec::KvRows {
            start: positions.start,
            k: read(&self.kcache[c])?,
            v: read(&self.vcache[c])?,
            n_kv_heads: cs.n_kv_heads,
            head_dim: cs.head_dim,
        })
    }
    fn last_hidden(&self) -> Result<Vec<f32>> {
        let bytes_len = (4 * self.last_rows * self.cfg.text.hidden_size) as u64;
        if bytes_len == 0 {
            return Ok(Vec::new());
        }
        let staging = self.gpu.staging("hidden readback", bytes_len);
        let mut enc = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("hidden") });
        enc.copy_buffer_to_buffer(&self.final_hidden, 0, &staging, 0, Some(bytes_len));
        self.gpu.queue.submit([enc.finish()]);
        let mut bytes = Vec::new();
        self.gpu.read(&staging, bytes_len, &mut bytes)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }
}
