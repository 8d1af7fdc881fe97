//! The program recorder: [`Builder`] uploads a model's weights (split where a matrix exceeds the
//! adapter's storage-binding limit), allocates every activation, KV and scratch buffer for the
//! largest chunk, and records the forward pass as [`Spec`]s (one per dispatch, with its params
//! and the step forms it runs in) that [`WgpuBackend`] encodes each step. The module's overview
//! (why the program has the shape it has) is in `mod.rs`.

use super::*;
use crate::config::LayerSpec;
use crate::loader::{LayerWeights, MoeWeights};

mod drafter;
pub(super) use drafter::{DeviceDrafter, RING_ROWS};

/// Uploads weights, allocates buffers and records the program.
pub(super) struct Builder<'a> {
    gpu: Gpu,
    cfg: &'a Config,
    opts: WgpuOptions,
    pipelines: Pipelines,
    params: Vec<u8>,
    specs: Vec<Spec>,
    dummy: wgpu::Buffer,
    step_buf: wgpu::Buffer,
    weight_bytes: u64,
    /// Bytes of tables only gathered from (the PLE embedding), not streamed each step.
    gather_only_bytes: u64,
    /// Bytes of routed-expert stacks or slots resident on the GPU.
    expert_bytes: u64,
    /// Routed-expert bytes one decode token reads (top_k experts per MoE layer).
    routed_decode_bytes: u64,
    state_bytes: u64,
    slot_layers: BTreeMap<usize, SlotLayer>,
    marks: Vec<Mark>,
    /// The [`Scratch`] buffers and their sizes in floats.
    scratch: [Option<(wgpu::Buffer, usize)>; 3],
    /// Group sums written by chunk norms for the tensor-core mat-mats that read their outputs:
    /// a region of one buffer per (norm, output), never shared, so no later dispatch can
    /// overwrite sums before their readers run.
    sum_regions: Vec<NormSums>,
    /// The regions' total, in floats.
    norm_sums_len: u64,
    /// x's group sums written by the kernels that write x (norms, the GeGLU mat-mat, the PLE
    /// gate's gelu_mul, the tensor-core attention) rather than by group_sum passes
    /// ([`Tuning::producer_sums`]).
    producer_sums: bool,
    /// The PLE gate's gelu_mul adds its split-k partials itself ([`Tuning::gelu_splits`]).
    gelu_splits: bool,
    /// Threads per row of the chunk norms' rows form (rmsnorm_rows.wgsl; 0: the chunk norms
    /// keep rmsnorm.wgsl's form: [`Tuning::rows_norms`] off).
    norm_rows: u32,
    /// Chunks' residual norms read a split-k mat-mat's partials themselves, in the rows form,
    /// and the qmm_sum that would write their input goes ([`Tuning::norm_splits`]).
    norm_splits: bool,
    /// [`Builder::list_program`]'s lines, made when the program is bound.
    listing: Vec<String>,
}

/// One output of a recorded rmsnorm: `slot` 0 is `out`, 1..=3 the chained outputs.
#[derive(Clone, Copy)]
struct NormOut {
    spec: usize,
    slot: u32,
}

/// Where a mat-mat's x comes from, for the group sums its tensor-core form reads.
#[derive(Clone)]
enum XFrom {
    /// Not known here: a group_sum dispatch takes them.
    Any,
    /// A norm's output: the norm can write them ([`Builder::norm_sums`]).
    Norm(NormOut),
    /// Written by x's producer (the GeGLU mat-mat, the PLE gate's gelu_mul, the tensor-core
    /// attention): rows of `cols` values in groups of `gs`.
    Sums { sums: Res, cols: usize, gs: usize },
}

/// Where a chunk norm writes the group sums of one of its outputs.
struct NormSums {
    out: NormOut,
    /// Offset and length in floats, in the norms' group-sum buffer.
    off: u64,
    len: u64,
}

/// Buffers shared by the chunk dispatches that use them in turn (each reads what it needs before
/// the next one writes).
#[derive(Clone, Copy)]
enum Scratch {
    /// Partial sums of split-k qmm dispatches, summed by qmm_sum before the next split writes.
    SplitK = 0,
    /// x's group sums (group_sum), read by the tensor-core mat-mat recorded right after.
    GroupSums = 1,
    /// The group sums of x written by its producer (the GeGLU mat-mat, the PLE gate's gelu_mul,
    /// the tensor-core attention), read by the projection recorded right after.
    ProducerSums = 2,
}

/// The bindings of a weight-reading kernel: the part's weights, scales and biases, then `bufs`
/// (selector, x, y, …), the params and the step.
fn weight_res(part: &GpuPart, bufs: &[&wgpu::Buffer]) -> Vec<Res> {
    let mut res = vec![Res::Buf(part.w.clone()), Res::Buf(part.scales.clone()), Res::Buf(part.biases.clone())];
    res.extend(bufs.iter().map(|b| Res::Buf((*b).clone())));
    res.extend([Res::Params, Res::Step]);
    res
}

/// Params of the routed-expert kernels for `rows` rows per expert of `m` (see moe_params.wgsl).
#[allow(clippy::too_many_arguments)]
fn moe_params(
    m: &GpuMatrix,
    expert_stride: usize,
    row_off: usize,
    rows: usize,
    top_k: usize,
    x_tok_stride: usize,
    x_slot_stride: usize,
) -> MoeMatmulParams {
    MoeMatmulParams {
        rows: rows as u32,
        cols: m.cols as u32,
        gs: m.gs as u32,
        expert_stride: expert_stride as u32,
        row_off: row_off as u32,
        top_k: top_k as u32,
        x_tok_stride: x_tok_stride as u32,
        x_slot_stride: x_slot_stride as u32,
        y_stride: rows as u32,
        ..Default::default()
    }
}

/// The decode (one token) and verify (`MATMUL_VERIFY_TOK` tokens) kernels of a mat-vec over
/// `part` of `m`, each with its grid x and token tile: qmv for 4-bit, else the matmul tile.
fn decode_forms(m: &GpuMatrix, part: &GpuPart, x_stride: usize) -> ((Kernel, u32, u32), (Kernel, u32, u32)) {
    let rows = part.rows as u32;
    let form = |tok: u32| {
        let qmv = if m.format == Format::Q4 { qmv_shape(part.rows, m.cols, x_stride, tok) } else { None };
        match qmv {
            Some((k, rows_per_wg)) => (k, rows.div_ceil(rows_per_wg), tok),
            None => (Kernel::Matmul(m.format, tok), rows.div_ceil(matmul_rows(tok)), tok),
        }
    };
    (form(1), form(MATMUL_VERIFY_TOK))
}

/// The params of a mat-mat or mat-vec over `part` of `m` (its rows of y at `part.row0`);
/// `on_out`: its tokens are the step's output rows (the LM head).
fn part_params(m: &GpuMatrix, part: &GpuPart, x_stride: usize, y_stride: usize, on_out: bool) -> MatmulParams {
    MatmulParams {
        rows: part.rows as u32,
        cols: m.cols as u32,
        gs: m.gs as u32,
        x_stride: x_stride as u32,
        y_stride: y_stride as u32,
        y_off: part.row0 as u32,
        count_sel: on_out as u32,
        k_splits: 0,
    }
}

/// The params of the stacked [G; U] GeGLU over `rows` gate rows of `m` (`matmul_glu`): y holds
/// `2 · rows` per token, the GeGLU in its first half.
fn glu_params(m: &GpuMatrix, rows: usize, x_stride: usize) -> MatmulParams {
    MatmulParams {
        rows: rows as u32,
        cols: m.cols as u32,
        gs: m.gs as u32,
        x_stride: x_stride as u32,
        y_stride: 2 * rows as u32,
        y_off: 0,
        count_sel: 0,
        k_splits: 0,
    }
}

/// Where each norm's weights start in the norm-weights buffer, for one layer.
struct LayerNorms {
    input: u32,
    post_attn: u32,
    pre_ff: u32,
    post_ff: u32,
    q: u32,
    k: u32,
    ple_post: u32,
    /// MoE: router scale, pre_feedforward_layernorm_2, post_feedforward_layernorm_1/2.
    moe: Option<[u32; 4]>,
}

/// The norm weights: one buffer, offsets recorded per use ([`Builder::upload_norms`]).
struct Norms {
    buf: wgpu::Buffer,
    layers: Vec<LayerNorms>,
    final_norm: u32,
    /// The per-layer inputs' projection norm (`NO_WEIGHT` without them).
    ple: u32,
}

/// The model's matrices on the GPU ([`Builder::upload_weights`]).
struct GpuWeights {
    /// The token embedding, also the tied LM head.
    embed: GpuMatrix,
    /// The per-layer inputs' embedding table and model projection.
    ple: Option<(GpuMatrix, GpuMatrix)>,
    layers: Vec<GpuLayer>,
}

struct GpuLayer {
    proj: Proj,
    o: GpuMatrix,
    mlp: Mlp,
    down: GpuMatrix,
    ple: Option<(GpuMatrix, GpuMatrix)>,
    moe: Option<GpuMoe>,
}

/// The attention input projections: q, k and v (k only for K-as-V layers) stacked into
/// one 4-bit matrix (one mat-vec writes q | k | v), or separate (KV-sharing layers have
/// only q; other formats).
enum Proj {
    Separate { q: GpuMatrix, k: Option<GpuMatrix>, v: Option<GpuMatrix> },
    Stacked(GpuMatrix),
}

/// The MLP's gate and up projections: one stacked 4-bit matrix whose decode mat-vec
/// applies the GeGLU itself (qmv_glu), or two matrices and gelu_mul.
enum Mlp {
    Split { gate: GpuMatrix, up: GpuMatrix },
    Stacked(GpuMatrix),
}

/// Routed experts, every expert resident (stacked along rows).
struct GpuMoe {
    router: GpuMatrix,
    per_expert_scale: wgpu::Buffer,
    /// (matrix, expert_stride, row_off) of the gate and up projections.
    gate: (GpuMatrix, usize, usize),
    up: Option<GpuMatrix>,
    up_off: usize,
    down: GpuMatrix,
}

/// The MoE blocks' buffers: dense out, router logits, router idx, router weights, router input,
/// the expert slot table, expert gate, expert up and expert out.
type MoeBufs = (
    wgpu::Buffer,
    wgpu::Buffer,
    wgpu::Buffer,
    wgpu::Buffer,
    wgpu::Buffer,
    wgpu::Buffer,
    wgpu::Buffer,
    wgpu::Buffer,
    wgpu::Buffer,
);

/// The step's activation buffers, sized for the largest chunk, and the KV caches
/// ([`Builder::alloc_acts`]).
struct Acts {
    /// Output rows the head computes in one step.
    logit_rows: usize,
    ids: wgpu::Buffer,
    rope_buf: wgpu::Buffer,
    /// Values per token of `rope_buf` (the sliding layers' head_dim, then the full layers').
    rope_stride: usize,
    /// The residual stream's two buffers ([`PassState::cur`]).
    xs: [wgpu::Buffer; 2],
    xn: wgpu::Buffer,
    xn2: wgpu::Buffer,
    q: wgpu::Buffer,
    att: wgpu::Buffer,
    q_sep: wgpu::Buffer,
    ktmp: wgpu::Buffer,
    vtmp: wgpu::Buffer,
    qkv: wgpu::Buffer,
    o: wgpu::Buffer,
    attn_part: wgpu::Buffer,
    g: wgpu::Buffer,
    u: wgpu::Buffer,
    xf: wgpu::Buffer,
    logits: wgpu::Buffer,
    best: wgpu::Buffer,
    argmax_part: wgpu::Buffer,
    moe_bufs: Option<MoeBufs>,
    moe_groups: Option<Groups>,
    /// The per-layer inputs, their context projection and the PLE gate.
    ple_bufs: Option<(wgpu::Buffer, wgpu::Buffer, wgpu::Buffer)>,
    kcache: Vec<wgpu::Buffer>,
    vcache: Vec<wgpu::Buffer>,
}

/// What every block of the forward pass reads: the norm offsets, weights and buffers, the KV
/// layout and the switches read once per build ([`Builder::record`]).
struct Forward<'p> {
    norms: &'p Norms,
    weights: &'p GpuWeights,
    acts: &'p Acts,
    kv: &'p KvLayout,
    eps: f32,
    fold_q_norm: bool,
    attn_short: u32,
    moe_norm: bool,
    moe_overlap: bool,
    attn_coop: bool,
    attn_sums: bool,
    streaming: bool,
    /// The layer whose attention starts a prompt's tail, if any.
    tail_layer: Option<usize>,
}

impl Forward<'_> {
    /// The params of a norm of one segment of `n` values.
    fn plain(&self, n: usize, w_off: u32, mode: u32, post: f32) -> NormParams {
        NormParams {
            n: n as u32,
            segs: 1,
            x_stride: n as u32,
            x_row_sel: 0,
            out_stride: n as u32,
            w_off,
            mode,
            count_sel: 0,
            pre: 1.0,
            post,
            eps: self.eps,
            ..Default::default()
        }
    }
}

/// One layer, as its blocks record it: its index, config, matrices, norm offsets and weights.
#[derive(Clone, Copy)]
struct Layer<'p> {
    li: usize,
    l: &'p LayerSpec,
    gl: &'p GpuLayer,
    ln: &'p LayerNorms,
    lw: &'p LayerWeights,
}

/// What the layers hand on to each other as they record.
struct PassState {
    /// The residual stream: xs[cur] holds it; a residual norm writes xs[cur ^ 1] and flips cur.
    cur: usize,
    /// The residual norm that ended the last layer, for the next input norm.
    residual: Option<usize>,
    /// Where the prompt's tail starts ([`Forward::tail_layer`]), and the rows it reads by token of
    /// that layer's residual and q.
    tail_cut: Option<TailCut>,
}

/// The first dispatch of a prompt's tail, its layer, and (buffer, bytes per row) of each buffer
/// the tail reads by token.
type TailCut = (usize, usize, Vec<(wgpu::Buffer, u64)>);

/// How a MoE layer's experts record, decided by its feed-forward block ([`Builder::record_ffn`]).
struct MoePlan {
    /// The moe_norm dispatch that closes the block in decode and verify steps.
    closing: Option<Kernel>,
    /// The dense branch's own decode buffers (its GeGLU and its down projection's output) when
    /// it runs beside the routed one.
    overlap: Option<(wgpu::Buffer, wgpu::Buffer)>,
    /// Where the router's dispatches end ([`Mark::route_end`]).
    route_end: Option<usize>,
    /// The norm that wrote the experts' input (pre_norm_2(h)) into xn2.
    xn2_from: Option<NormOut>,
    /// The dense down projection's x stride.
    down_x_stride: usize,
}

impl<'a> Builder<'a> {
    /// Uploads `w`, records its program and returns the backend that runs it.
    pub(super) fn build(gpu: Gpu, cfg: &'a Config, w: &'a Arc<ModelWeights>, opts: WgpuOptions) -> Result<WgpuBackend> {
        Self::new(gpu, cfg, opts).record(w)
    }

    /// A recorder for `cfg` with nothing uploaded or recorded yet.
    fn new(gpu: Gpu, cfg: &'a Config, opts: WgpuOptions) -> Self {
        let t = &opts.tuning;
        let (producer_sums, gelu_splits, norm_splits) = (t.producer_sums, t.gelu_splits, t.norm_splits);
        let norm_rows = if t.rows_norms { RMSNORM_ROWS_WG } else { 0 };
        // One vec4: the largest array element a kernel binds (rmsnorm_rows.wgsl's rows).
        let dummy = gpu.storage("unused", 16);
        let step_buf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("step"),
            size: std::mem::size_of::<Step>() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let pipelines = Pipelines::new(&gpu, &opts.tuning);
        Builder {
            gpu,
            cfg,
            opts,
            pipelines,
            params: Vec::new(),
            specs: Vec::new(),
            dummy,
            step_buf,
            weight_bytes: 0,
            gather_only_bytes: 0,
            expert_bytes: 0,
            routed_decode_bytes: 0,
            state_bytes: 0,
            slot_layers: BTreeMap::new(),
            marks: Vec::new(),
            scratch: [None, None, None],
            sum_regions: Vec::new(),
            norm_sums_len: 0,
            producer_sums,
            gelu_splits,
            norm_rows,
            norm_splits,
            listing: Vec::new(),
        }
    }

    fn check_binding(&self, what: &str, bytes: u64) -> Result<()> {
        if bytes > self.gpu.adapter_max_binding {
            return Err(Error::Gpu(format!(
                "{what} needs {} MiB in one binding, the adapter allows {} MiB: lower --ctx or --chunk",
                bytes >> 20,
                self.gpu.adapter_max_binding >> 20
            )));
        }
        Ok(())
    }

    fn act(&mut self, label: &str, elems: usize) -> Result<wgpu::Buffer> {
        // At least one vec4 (a placeholder may be bound where a kernel reads rows of vec4).
        let bytes = (4 * elems.max(4)) as u64;
        self.check_binding(label, bytes)?;
        self.state_bytes += bytes;
        Ok(self.gpu.storage(label, bytes))
    }

    fn upload_matrix(&mut self, m: &Matrix) -> Result<GpuMatrix> {
        self.upload_matrix_parts(m, self.gpu.max_binding)
    }

    /// Uploads `ms` stacked along rows as one 4-bit matrix (in order) when all are 4-bit of the
    /// same width and groups, the decode kernels apply (whole 64-value groups), and the stack
    /// fits one binding; `None` otherwise.
    fn upload_stacked(&mut self, ms: &[&Matrix]) -> Result<Option<GpuMatrix>> {
        let cols = ms[0].cols();
        let mut parts: Vec<[&[u8]; 3]> = Vec::new();
        let mut gs = 0;
        for m in ms {
            let Matrix::Quant { layout, w, scales, biases, .. } = m else { return Ok(None) };
            if layout.bits != 4 || m.cols() != cols || !cols.is_multiple_of(64) || (gs != 0 && layout.group_size != gs)
            {
                return Ok(None);
            }
            gs = layout.group_size;
            parts.push([w.bytes(), scales.bytes(), biases.bytes()]);
        }
        if parts.iter().map(|p| p[0].len() as u64).sum::<u64>() > self.gpu.max_binding {
            return Ok(None);
        }
        let rows = ms.iter().map(|m| m.rows()).sum();
        let label = ms.iter().map(|m| m.name()).collect::<Vec<_>>().join("+");
        let pieces = |i: usize| parts.iter().map(|p| p[i]).collect::<Vec<&[u8]>>();
        let part = GpuPart {
            row0: 0,
            rows,
            w: self.gpu.upload_concat(&label, &pieces(0))?,
            scales: self.gpu.upload_concat(&format!("{label}.scales"), &pieces(1))?,
            biases: self.gpu.upload_concat(&format!("{label}.biases"), &pieces(2))?,
        };
        self.weight_bytes += parts.iter().flatten().map(|b| b.len() as u64).sum::<u64>();
        Ok(Some(GpuMatrix { format: Format::Q4, cols, gs, parts: vec![part] }))
    }

    /// Uploads split 4-bit expert stacks `gate` and `up` (`experts` experts of `rows` rows each)
    /// as one fused stack, expert e's gate rows then its up rows (HF's gate_up layout), so that
    /// decode runs one GeGLU mat-vec for both; `None` (nothing uploaded) where the formats
    /// differ or the fused stack exceeds one binding.
    fn upload_experts_fused(&mut self, gate: &Matrix, up: &Matrix, experts: usize) -> Result<Option<GpuMatrix>> {
        let (
            Matrix::Quant { layout: lg, w: wg, scales: sg, biases: bg, .. },
            Matrix::Quant { layout: lu, w: wu, scales: su, biases: bu, .. },
        ) = (gate, up)
        else {
            return Ok(None);
        };
        let (rows, cols) = (gate.rows(), gate.cols());
        if lg.bits != 4
            || lu.bits != 4
            || lg.group_size != lu.group_size
            || up.rows() != rows
            || up.cols() != cols
            || rows % experts != 0
        {
            return Ok(None);
        }
        if (wg.bytes().len() + wu.bytes().len()) as u64 > self.gpu.adapter_max_binding {
            return Ok(None);
        }
        fn interleave<'b>(a: &'b [u8], b: &'b [u8], experts: usize) -> Vec<&'b [u8]> {
            let (ea, eb) = (a.len() / experts, b.len() / experts);
            (0..experts).flat_map(|e| [&a[e * ea..(e + 1) * ea], &b[e * eb..(e + 1) * eb]]).collect()
        }
        let label = format!("{}+{}", gate.name(), up.name());
        let part = GpuPart {
            row0: 0,
            rows: 2 * rows,
            w: self.gpu.upload_concat(&label, &interleave(wg.bytes(), wu.bytes(), experts))?,
            scales: self.gpu.upload_concat(&format!("{label}.scales"), &interleave(sg.bytes(), su.bytes(), experts))?,
            biases: self.gpu.upload_concat(&format!("{label}.biases"), &interleave(bg.bytes(), bu.bytes(), experts))?,
        };
        let bytes = [wg, wu, sg, su, bg, bu].iter().map(|t| t.bytes().len() as u64).sum::<u64>();
        self.weight_bytes += bytes;
        self.expert_bytes += bytes;
        Ok(Some(GpuMatrix { format: Format::Q4, cols, gs: lg.group_size, parts: vec![part] }))
    }

    /// Uploads a matrix that kernels index as a whole (an expert stack): one part, or an error
    /// when it exceeds the adapter's binding limit.
    fn upload_matrix_whole(&mut self, m: &Matrix) -> Result<GpuMatrix> {
        let before = self.weight_bytes;
        let g = self.upload_matrix_parts(m, self.gpu.adapter_max_binding)?;
        self.expert_bytes += self.weight_bytes - before;
        if g.parts.len() != 1 {
            return Err(Error::Gpu(format!(
                "{}: the resident expert stack ({} MiB) exceeds one binding ({} MiB); expert streaming is needed",
                m.name(),
                m.nbytes() >> 20,
                self.gpu.adapter_max_binding >> 20
            )));
        }
        Ok(g)
    }

    fn upload_matrix_parts(&mut self, m: &Matrix, max_part: u64) -> Result<GpuMatrix> {
        let (rows, cols) = (m.rows(), m.cols());
        // Bytes per row of each buffer of a part, and the format.
        let (format, gs, row_bytes): (Format, usize, [usize; 3]) = match m {
            Matrix::Float { t, .. } => match t.dtype() {
                DType::BF16 => (Format::Bf16, 0, [2 * cols, 0, 0]),
                _ => (Format::F32, 0, [4 * cols, 0, 0]),
            },
            Matrix::Quant { layout, .. } => {
                let f = if layout.bits == 4 { Format::Q4 } else { Format::Q8 };
                let g = 2 * cols / layout.group_size;
                (f, layout.group_size, [cols * layout.bits as usize / 8, g, g])
            }
        };
        let widest = *row_bytes.iter().max().expect("three entries") as u64;
        let per_part = (max_part / widest) as usize;
        if per_part == 0 {
            return Err(Error::Gpu(format!("{}: one row ({widest} bytes) exceeds the binding limit", m.name())));
        }
        let mut parts = Vec::new();
        let mut row0 = 0;
        while row0 < rows {
            let n = per_part.min(rows - row0);
            let range = |rb: usize| row0 * rb..(row0 + n) * rb;
            let label = format!("{}[{row0}..{}]", m.name(), row0 + n);
            let part = match m {
                Matrix::Float { t, .. } => {
                    let w = match t.dtype() {
                        DType::F16 => {
                            // Widened to f32 (exact): one float format less in every kernel.
                            let src = &t.bytes()[row0 * cols * 2..(row0 + n) * cols * 2];
                            let f: Vec<f32> = crate::quant::floats_to_f32(src, DType::F16);
                            self.gpu.upload(&label, bytemuck::cast_slice(&f))
                        }
                        _ => self.gpu.upload(&label, &t.bytes()[range(row_bytes[0])]),
                    };
                    GpuPart { row0, rows: n, w, scales: self.dummy.clone(), biases: self.dummy.clone() }
                }
                Matrix::Quant { w, scales, biases, .. } => GpuPart {
                    row0,
                    rows: n,
                    w: self.gpu.upload(&label, &w.bytes()[range(row_bytes[0])]),
                    scales: self.gpu.upload(&format!("{label}.scales"), &scales.bytes()[range(row_bytes[1])]),
                    biases: self.gpu.upload(&format!("{label}.biases"), &biases.bytes()[range(row_bytes[2])]),
                },
            };
            self.weight_bytes += (n * row_bytes.iter().sum::<usize>()) as u64;
            parts.push(part);
            row0 += n;
        }
        Ok(GpuMatrix { format, cols, gs, parts })
    }

    /// Allocates `n_slots` expert slots of every routed matrix of `layer` (one buffer per
    /// matrix piece, slots at the per-expert stride) and returns them as expert matrices.
    fn slot_layer(&mut self, files: &ExpertFiles, n_slots: usize) -> Result<SlotLayer> {
        let mut parts = Vec::new();
        for pl in &files.layout.parts {
            let format = match (pl.format.as_str(), pl.bits()) {
                (_, Some(4)) => Format::Q4,
                (_, Some(_)) => Format::Q8,
                ("bf16", None) => Format::Bf16,
                _ => Format::F32,
            };
            // f16 values are widened to f32 in the slot, as resident f16 matrices are.
            let widen = if pl.format == "f16" { 2 } else { 1 };
            let mut buf = |what: &str, span: Option<(u64, u64)>| -> Result<wgpu::Buffer> {
                let Some((_, len)) = span else { return Ok(self.dummy.clone()) };
                if len % 4 != 0 {
                    return Err(Error::Gpu(format!(
                        "expert part `{}` {what}: {len} bytes per expert is not a multiple of 4 (a GPU copy unit)",
                        pl.role
                    )));
                }
                let bytes = n_slots as u64 * len * widen;
                self.check_binding(&format!("expert slots `{}` {what}", pl.role), bytes)?;
                self.weight_bytes += bytes;
                self.expert_bytes += bytes;
                Ok(self.gpu.storage(&format!("expert slots {} {what}", pl.role), bytes))
            };
            let w = buf("values", Some(pl.w))?;
            let scales = buf("scales", pl.scales)?;
            let biases = buf("biases", pl.biases)?;
            let gm = GpuMatrix {
                format,
                cols: pl.cols,
                gs: pl.group_size,
                parts: vec![GpuPart { row0: 0, rows: n_slots * pl.rows, w, scales, biases }],
            };
            parts.push((pl.clone(), gm));
        }
        Ok(SlotLayer { parts })
    }

    fn push_params<T: bytemuck::Pod>(&mut self, p: &T) -> (u64, u64) {
        let align = self.gpu.limits.min_uniform_buffer_offset_alignment.max(16) as usize;
        let off = self.params.len().next_multiple_of(align);
        self.params.resize(off, 0);
        self.params.extend_from_slice(bytemuck::bytes_of(p));
        (off as u64, std::mem::size_of::<T>() as u64)
    }

    fn spec<T: bytemuck::Pod>(&mut self, kernel: Kernel, res: Vec<Res>, p: &T, x: u32, y: GridY) {
        let (param_off, param_len) = self.push_params(p);
        self.specs.push(Spec {
            only: Only::Always,
            kernel,
            single: None,
            verify: None,
            res,
            param_off,
            param_len,
            x,
            x_from_out: false,
            x_from_tokens: false,
            y,
            ready: Vec::new(),
            keys: None,
        });
    }

    /// The `which` scratch buffer, at least `elems` floats (a larger one replaces it; the
    /// dispatches recorded with the old one keep it).
    fn scratch(&mut self, which: Scratch, elems: usize) -> Result<wgpu::Buffer> {
        if let Some((b, n)) = &self.scratch[which as usize] {
            if *n >= elems {
                return Ok(b.clone());
            }
        }
        let label = match which {
            Scratch::SplitK => "qmm split-k partials",
            Scratch::GroupSums => "qmm_coop group sums",
            Scratch::ProducerSums => "producer-written group sums",
        };
        let b = self.act(label, elems)?;
        self.scratch[which as usize] = Some((b.clone(), elems));
        Ok(b)
    }

    /// The group sums of x, f32[count · mult, cols / gs], that a tensor-core mat-mat reads for
    /// the bias part (chunk steps only): those x's producer wrote, or has the norm that wrote x
    /// write them where it can, else a group_sum dispatch of their own.
    #[allow(clippy::too_many_arguments)]
    fn x_sums(
        &mut self,
        x: &wgpu::Buffer,
        cols: usize,
        gs: usize,
        stride: usize,
        mult: usize,
        on_out: bool,
        from: XFrom,
    ) -> Result<Res> {
        let rows_of_x = mult == 1 && !on_out;
        match from {
            XFrom::Sums { sums, cols: c, gs: g } if rows_of_x && (c, g) == (cols, gs) => return Ok(sums),
            XFrom::Norm(f) if rows_of_x => {
                if let Some(r) = self.norm_sums(f, cols, gs, stride) {
                    return Ok(r);
                }
            }
            _ => {}
        }
        Ok(Res::Buf(self.group_sum(x, cols, gs, stride, mult, on_out)?))
    }

    /// Has the chunk norm `from.spec` also write its output `from.slot`'s group sums and
    /// returns where they land. Chunks run every norm in the rows form (rmsnorm_rows.wgsl, given
    /// by rows_norms once the program is recorded), so that form's rules decide
    /// ([`kernels::rmsnorm_rows`]: one segment, rows of whole vec4s and groups); decode and
    /// verify steps keep rmsnorm.wgsl's form, which writes no sums. None (then group_sum runs)
    /// where the rows form would not take the norm with these sums (or is off:
    /// [`Tuning::rows_norms`]), for the LM head's rows, for another row layout or group size
    /// than the reader's, and without [`Tuning::producer_sums`].
    fn norm_sums(&mut self, from: NormOut, cols: usize, gs: usize, stride: usize) -> Option<Res> {
        if let Some(i) = self.sum_regions.iter().position(|r| r.out.spec == from.spec && r.out.slot == from.slot) {
            let np = self.norm_params(from.spec);
            return (np.gs as usize == gs && np.n as usize == cols).then_some(Res::NormSums(Some(i)));
        }
        let np = self.norm_params(from.spec);
        let out_stride = if from.slot == 0 { np.out_stride } else { np.out2_stride };
        let with_sums = NormParams { gs: gs as u32, sums: np.sums | 1 << from.slot, ..np };
        let applies = self.producer_sums
            && np.x_row_sel == 0
            && np.count_sel == 0
            && from.slot <= np.chain
            && np.n as usize == cols
            && out_stride as usize == stride
            && (np.gs == 0 || np.gs as usize == gs)
            && rmsnorm_rows(&with_sums, self.norm_rows).is_some();
        if !applies {
            return None;
        }
        // Regions start at the adapter's storage offset alignment; the norms bind the whole
        // buffer, so it must fit one binding.
        let align = (self.gpu.limits.min_storage_buffer_offset_alignment as u64 / 4).max(1);
        let off = self.norm_sums_len.next_multiple_of(align);
        let len = (self.opts.max_chunk * cols / gs) as u64;
        if 4 * (off + len) > self.gpu.adapter_max_binding {
            return None;
        }
        self.norm_sums_len = off + len;
        self.sum_regions.push(NormSums { out: from, off, len });
        self.edit_params(from.spec, |p: &mut NormParams| {
            p.gs = gs as u32;
            p.sums |= 1 << from.slot;
            p.sum_off[from.slot as usize] = off as u32;
        });
        self.specs[from.spec].res[9] = Res::NormSums(None);
        Some(Res::NormSums(Some(self.sum_regions.len() - 1)))
    }

    /// Gives every chunk norm the rows form (rmsnorm_rows.wgsl) where it applies, and decode
    /// and verify steps rmsnorm.wgsl's form (verify must equal decode bitwise; chunks need
    /// not). Runs once the program is recorded: fuse_norm reads the norms' specs as
    /// rmsnorm.wgsl's until then. A norm that reads split-k partials or writes group sums was
    /// given them because the rows form takes it (residual_norm, norm_sums): finding no rows
    /// form for it here is an internal error, not a fallback (x or the sums would be stale).
    fn rows_norms(&mut self) -> Result<()> {
        for i in 0..self.specs.len() {
            let Kernel::RmsNorm { .. } = self.specs[i].kernel else { continue };
            if self.specs[i].only == Only::Single {
                continue;
            }
            let np = self.norm_params(i);
            let Some(rows) = rmsnorm_rows(&np, self.norm_rows) else {
                if np.splits > 1 || np.sums != 0 {
                    return Err(Error::Gpu(format!(
                        "internal: a chunk norm with {} split-k partials and sums {:#x} has no rows form (n {})",
                        np.splits, np.sums, np.n
                    )));
                }
                continue;
            };
            let sp = &mut self.specs[i];
            if sp.single.is_none() {
                sp.single = Some((sp.kernel, sp.x, 1));
                sp.verify = Some((sp.kernel, sp.x, 1));
            }
            sp.kernel = rows;
        }
        Ok(())
    }

    /// Records group_sum over the `count · mult` rows of x (chunk steps only: the tensor-core
    /// mat-mats' bias part) and returns the buffer of the sums, f32[count · mult, cols / gs].
    fn group_sum(
        &mut self,
        x: &wgpu::Buffer,
        cols: usize,
        gs: usize,
        stride: usize,
        mult: usize,
        on_out: bool,
    ) -> Result<wgpu::Buffer> {
        let groups = cols / gs;
        let xsum = self.scratch(Scratch::GroupSums, self.opts.max_chunk * mult * groups)?;
        let p = GroupSumParams {
            cols: cols as u32,
            gs: gs as u32,
            stride: stride as u32,
            mult: mult as u32,
            count_sel: on_out as u32,
            _pad: [0; 3],
        };
        let res = vec![Res::Buf(x.clone()), Res::Buf(xsum.clone()), Res::Params, Res::Step];
        let gy = if on_out { GridY::Out } else { GridY::Tokens };
        self.spec(Kernel::GroupSum, res, &p, group_sum_groups_x(mult * groups), gy);
        self.specs.last_mut().expect("just pushed").only = Only::Multi;
        Ok(xsum)
    }

    /// When the last recorded chunk dispatch is a qmm_sum adding a split-k mat-mat's partials
    /// into `y` (rows of `rows` values, nothing else in them), removes it and returns the
    /// partials and their count, for a reader that adds them itself (gelu_mul's chunk form, the
    /// rows-form residual norm). Only chunks run qmm_sum; the mat-mat may have recorded its
    /// decode-only form after it.
    fn take_split_sum(&mut self, y: &wgpu::Buffer, rows: usize) -> Option<(wgpu::Buffer, u32)> {
        // Decode-only specs the mat-mat recorded after its qmm_sum are passed over.
        let i = self.specs.iter().rposition(|sp| sp.only != Only::Single)?;
        let sp = &self.specs[i];
        let (Kernel::QmmSum, [Res::Buf(part), Res::Buf(dst), ..]) = (sp.kernel, sp.res.as_slice()) else { return None };
        let mp: MatmulParams =
            bytemuck::pod_read_unaligned(&self.params[sp.param_off as usize..(sp.param_off + sp.param_len) as usize]);
        if dst != y || (mp.rows as usize, mp.y_stride as usize, mp.y_off, mp.count_sel) != (rows, rows, 0, 0) {
            return None;
        }
        let found = (part.clone(), mp.k_splits);
        // Only the decode-only specs after it shift: no recorded index points at them.
        debug_assert!(self.marks.iter().all(|m| m.experts_end <= i), "a streaming mark past the removed qmm_sum");
        self.specs.remove(i);
        Some(found)
    }

    /// Whether prefill chunks run on tensor cores — the mat-mats, and the attention with
    /// [`Tuning::coop_attention`] (the device and [`Tuning::tensor_cores`]).
    fn tensor_cores(&self) -> bool {
        self.gpu.coop_f16() && self.opts.tuning.tensor_cores
    }

    /// `y[t, r] = W x[t]` over all parts of `m`.
    fn matmul(
        &mut self,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        x_stride: usize,
        y: &wgpu::Buffer,
        y_stride: usize,
        on_out: bool,
    ) -> Result<()> {
        self.matmul_steps(m, x, x_stride, y, y_stride, on_out, true, XFrom::Any)
    }

    /// `matmul` of an x whose producer is known (`from`: where x's group sums can come from).
    fn matmul_from(
        &mut self,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        x_stride: usize,
        y: &wgpu::Buffer,
        y_stride: usize,
        from: XFrom,
    ) -> Result<()> {
        self.matmul_steps(m, x, x_stride, y, y_stride, false, true, from)
    }

    /// `matmul`, with its decode and verify forms only when `decode` (else chunks only); x
    /// produced as `from` says.
    #[allow(clippy::too_many_arguments)]
    fn matmul_steps(
        &mut self,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        x_stride: usize,
        y: &wgpu::Buffer,
        y_stride: usize,
        on_out: bool,
        decode: bool,
        from: XFrom,
    ) -> Result<()> {
        for part in &m.parts {
            let p = part_params(m, part, x_stride, y_stride, on_out);
            // Chunks: the tiled 4-bit mat-mat where it applies, else the 8-token matmul tile.
            // The LM head never on tensor cores: it is then one spec with its decode variants,
            // as on every device without them, so a chunk's single output row takes the
            // mat-vec (`encode`: count 1) instead of 128-token tiles over all its rows that
            // hold one real token each (ledger: 2026-12-02 lm-head-matvec: E4B chunks 60.1 →
            // 58.6 ms, E2B 34.0 → 33.0, 26B 88.4 → 86.8). `lm_head_matvec=off`: the tensor-core
            // form.
            let coop = self.tensor_cores() && !(on_out && self.opts.tuning.lm_head_matvec);
            let (kernel, tile, rows_per_wg) = if qmm_applies(m.format, m.cols, x_stride) {
                let (k, rows_per_wg, tok) = qmm_shape(part.rows, coop);
                (k, tok, rows_per_wg)
            } else {
                (Kernel::Matmul(m.format, MATMUL_TOK), MATMUL_TOK, matmul_rows(MATMUL_TOK))
            };
            let gx = (part.rows as u32).div_ceil(rows_per_wg);
            let splits = match kernel {
                Kernel::Qmm { .. } | Kernel::QmmCoop { .. } if !on_out => {
                    let rule = qmm_splits(
                        matches!(kernel, Kernel::QmmCoop { .. }),
                        part.rows,
                        m.cols,
                        self.opts.max_chunk,
                        rows_per_wg,
                        tile,
                    );
                    // WgpuOptions::min_k_splits: the most splits up to it whose ranges are whole groups.
                    let forced = (0..=self.opts.min_k_splits.max(1).ilog2())
                        .rev()
                        .map(|e| 1u32 << e)
                        .find(|&s| m.cols.is_multiple_of(64 * s as usize))
                        .unwrap_or(1);
                    rule.max(forced)
                }
                _ => 1,
            };
            // The tensor-core mat-mat reads x's group sums (one more binding, so its decode and
            // verify forms get a spec of their own).
            let xsum = match kernel {
                Kernel::QmmCoop { .. } => Some(self.x_sums(x, m.cols, m.gs, x_stride, 1, on_out, from.clone())?),
                _ => None,
            };
            let chunk_res = |bufs: &[&wgpu::Buffer]| {
                let mut res = weight_res(part, bufs);
                res.extend(xsum.clone());
                res
            };
            if splits > 1 {
                // Split k: partials into the scratch, then their sum into y.
                let scratch = self.scratch(Scratch::SplitK, splits as usize * self.opts.max_chunk * part.rows)?;
                let ps = MatmulParams { y_stride: part.rows as u32, y_off: 0, k_splits: splits, ..p };
                self.spec(kernel, chunk_res(&[x, &scratch]), &ps, gx, GridY::SplitTokenTiles(tile, splits));
                self.specs.last_mut().expect("just pushed").only = Only::Multi;
                let res = vec![Res::Buf(scratch), Res::Buf(y.clone()), Res::Params, Res::Step];
                self.spec(
                    Kernel::QmmSum,
                    res,
                    &MatmulParams { k_splits: splits, ..p },
                    (part.rows as u32).div_ceil(256),
                    GridY::Tokens,
                );
                self.specs.last_mut().expect("just pushed").only = Only::Multi;
            } else {
                let gy = if on_out { GridY::OutTiles(tile) } else { GridY::TokenTiles(tile) };
                self.spec(kernel, chunk_res(&[x, y]), &p, gx, gy);
                if !decode || xsum.is_some() {
                    self.specs.last_mut().expect("just pushed").only = Only::Multi;
                }
            }
            if !decode {
                continue;
            }
            let (single, verify) = decode_forms(m, part, x_stride);
            if splits > 1 || xsum.is_some() {
                // Decode and verify steps write y directly, from a spec of their own.
                let gy = if on_out { GridY::OutTiles(verify.2) } else { GridY::TokenTiles(verify.2) };
                self.spec(verify.0, weight_res(part, &[x, y]), &p, verify.1, gy);
                self.specs.last_mut().expect("just pushed").only = Only::Single;
            }
            let sp = self.specs.last_mut().expect("just pushed");
            sp.single = Some(single);
            sp.verify = Some(verify);
        }
        Ok(())
    }

    /// The decode and verify forms of `matmul` alone, one spec per part, where a program
    /// records them apart from the chunk forms (`matmul_steps` with `decode` false).
    fn matvec_single(&mut self, m: &GpuMatrix, x: &wgpu::Buffer, x_stride: usize, y: &wgpu::Buffer, y_stride: usize) {
        for part in &m.parts {
            let p = part_params(m, part, x_stride, y_stride, false);
            let (single, verify) = decode_forms(m, part, x_stride);
            self.spec(verify.0, weight_res(part, &[x, y]), &p, verify.1, GridY::TokenTiles(verify.2));
            let sp = self.specs.last_mut().expect("just pushed");
            sp.only = Only::Single;
            sp.single = Some(single);
            sp.verify = Some(verify);
        }
    }

    /// `y[t, r] = gelu_tanh(G x[t]) · (U x[t])` for a stacked [G; U] 4-bit matrix `m` of
    /// `2 · rows` rows, into the first `rows` of each `2 · rows`-wide row of `y`. Chunks run the
    /// stacked mat-mat and gelu_mul over the two halves; decode and verify steps one qmv_glu
    /// (recorded here when `decode`, else by the caller's `glu_single`). Returns where the
    /// output's group sums are (the tensor-core form writes them).
    #[allow(clippy::too_many_arguments)]
    fn matmul_glu(
        &mut self,
        m: &GpuMatrix,
        rows: usize,
        x: &wgpu::Buffer,
        x_stride: usize,
        y: &wgpu::Buffer,
        from: NormOut,
        decode: bool,
    ) -> Result<XFrom> {
        let part = &m.parts[0];
        debug_assert_eq!((m.parts.len(), part.rows), (1, 2 * rows), "a stacked matrix is one part");
        let p = glu_params(m, rows, x_stride);
        // Chunks: the GeGLU in the tensor-core mat-mat's epilogue where it runs unsplit, else
        // the stacked mat-mat and gelu_mul.
        let (glu, per_wg, tok) = qmm_coop_glu_shape();
        // `coop_glu=off`: the mat-mat and gelu_mul apart.
        let glu_coop = self.tensor_cores()
            && self.opts.tuning.coop_glu
            && qmm_applies(m.format, m.cols, x_stride)
            && qmm_splits(true, rows, m.cols, self.opts.max_chunk, per_wg, tok) == 1;
        let mut sums = XFrom::Any;
        if glu_coop {
            let xsum = self.x_sums(x, m.cols, m.gs, x_stride, 1, false, XFrom::Norm(from))?;
            let ysum = self.scratch(Scratch::ProducerSums, self.opts.max_chunk * rows.div_ceil(64))?;
            let mut res = weight_res(part, &[x, y]);
            res.extend([xsum, Res::Buf(ysum.clone())]);
            self.spec(glu, res, &p, (rows as u32).div_ceil(per_wg), GridY::TokenTiles(tok));
            self.specs.last_mut().expect("just pushed").only = Only::Multi;
            // Without producer sums the down projection takes group_sum's instead (an A/B; the
            // epilogue still writes these).
            if self.producer_sums {
                sums = XFrom::Sums { sums: Res::Buf(ysum), cols: rows, gs: 64 };
            }
        } else {
            self.matmul_steps(m, x, x_stride, y, 2 * rows, false, false, XFrom::Norm(from))?;
            let dummy = self.dummy.clone();
            self.gelu_mul(
                y,
                &dummy,
                GeluParams {
                    n: rows as u32,
                    a_stride: 2 * rows as u32,
                    b_off: rows as u32,
                    b_in_a: 1,
                    ..Default::default()
                },
            );
            self.specs.last_mut().expect("just pushed").only = Only::Multi;
        }
        if decode {
            self.glu_single(m, rows, x, x_stride, y);
        }
        Ok(sums)
    }

    /// The decode and verify forms of `matmul_glu` (one qmv_glu spec), where a program records
    /// them apart from the chunk forms (`matmul_glu` with `decode` false).
    fn glu_single(&mut self, m: &GpuMatrix, rows: usize, x: &wgpu::Buffer, x_stride: usize, y: &wgpu::Buffer) {
        let p = glu_params(m, rows, x_stride);
        let res = weight_res(&m.parts[0], &[x, y]);
        let tuning = self.opts.tuning.clone();
        let shape = |tok| {
            let (k, per_wg) =
                qmv_glu_shape(rows, m.cols, x_stride, tok, &tuning).expect("stacked only where qmv applies");
            (k, (rows as u32).div_ceil(per_wg), tok)
        };
        let (vk, vx, vt) = shape(MATMUL_VERIFY_TOK);
        self.spec(vk, res, &p, vx, GridY::TokenTiles(vt));
        let sp = self.specs.last_mut().expect("just pushed");
        sp.only = Only::Single;
        sp.single = Some(shape(1));
        sp.verify = Some((vk, vx, vt));
    }

    /// `y[t, r] = gelu_tanh(G x[t])[r] · b[t · b_stride + b_off + r]` for the `rows`-row gate `m`
    /// (the per-layer input gate): chunks run the mat-mat and gelu_mul, decode and verify steps
    /// one gated qmv where it applies. Returns where y's group sums are, if written.
    #[allow(clippy::too_many_arguments)]
    fn ple_gate(
        &mut self,
        m: &GpuMatrix,
        x: &wgpu::Buffer,
        x_stride: usize,
        y: &wgpu::Buffer,
        b: &wgpu::Buffer,
        rows: usize,
        b_stride: usize,
        b_off: usize,
        from: NormOut,
    ) -> Result<XFrom> {
        let gelu = GeluParams {
            n: rows as u32,
            a_stride: rows as u32,
            b_stride: b_stride as u32,
            b_off: b_off as u32,
            ..Default::default()
        };
        let shape = |tok| {
            if m.format == Format::Q4 && m.parts.len() == 1 {
                qmv_gelu_b_shape(rows, m.cols, x_stride, tok)
            } else {
                None
            }
        };
        let fused = shape(MATMUL_VERIFY_TOK).zip(shape(1));
        // Chunks (and every step where the gated qmv does not apply): the mat-mat, then gelu_mul.
        self.matmul_steps(m, x, x_stride, y, rows, false, fused.is_none(), XFrom::Norm(from))?;
        let Some(((vk, vper), (sk, sper))) = fused else {
            self.gelu_mul(y, b, gelu);
            return Ok(XFrom::Any);
        };
        // gelu_mul runs in chunks only: where the tensor-core projection reads its output, it
        // also writes that output's group sums (`producer_sums=off`: group_sum).
        let mut sums = XFrom::Any;
        if self.tensor_cores() && self.producer_sums {
            let asum = self.scratch(Scratch::ProducerSums, self.opts.max_chunk * rows.div_ceil(64))?;
            // Where the gate's mat-mat was split in k, gelu_mul adds its partials itself and the
            // qmm_sum that would write y goes (`gelu_splits=off`: not).
            let taken = if self.gelu_splits { self.take_split_sum(y, rows) } else { None };
            let (part, splits) = match taken {
                Some((part, splits)) => (part, splits),
                None => (b.clone(), 0),
            };
            let res = vec![
                Res::Buf(y.clone()),
                Res::Buf(b.clone()),
                Res::Params,
                Res::Step,
                Res::Buf(asum.clone()),
                Res::Buf(part),
            ];
            self.spec(Kernel::GeluMulSums, res, &GeluParams { splits, ..gelu }, gelu.n.div_ceil(64), GridY::Tokens);
            sums = XFrom::Sums { sums: Res::Buf(asum), cols: rows, gs: 64 };
        } else {
            self.gelu_mul(y, b, gelu);
        }
        self.specs.last_mut().expect("just pushed").only = Only::Multi;
        let part = &m.parts[0];
        let p = QmvGeluParams {
            m: MatmulParams {
                rows: rows as u32,
                cols: m.cols as u32,
                gs: m.gs as u32,
                x_stride: x_stride as u32,
                y_stride: rows as u32,
                y_off: 0,
                count_sel: 0,
                k_splits: 0,
            },
            b_stride: b_stride as u32,
            b_off: b_off as u32,
            _pad: [0; 2],
        };
        let mut res = weight_res(part, &[x, y]);
        res.push(Res::Buf(b.clone()));
        let vt = MATMUL_VERIFY_TOK;
        let vx = (rows as u32).div_ceil(vper);
        self.spec(vk, res, &p, vx, GridY::TokenTiles(vt));
        let sp = self.specs.last_mut().expect("just pushed");
        sp.only = Only::Single;
        sp.single = Some((sk, (rows as u32).div_ceil(sper), 1));
        sp.verify = Some((vk, vx, vt));
        Ok(sums)
    }

    /// Routed-expert mat-vec: `y[t, j, r] = W[idx[t,j] · stride + off + r] · x[t, j]`; decode
    /// steps run it per (token, expert) pair, chunks per expert over `groups` (see moe_group).
    /// `with_single`: also record the decode/verify form (false where `moe_glu` recorded it);
    /// `from`: the norm output that wrote x, if any.
    #[allow(clippy::too_many_arguments)]
    fn moe_matmul(
        &mut self,
        m: &GpuMatrix,
        expert_stride: usize,
        row_off: usize,
        rows: usize,
        idx: &wgpu::Buffer,
        groups: &Groups,
        x: &wgpu::Buffer,
        x_tok_stride: usize,
        x_slot_stride: usize,
        y: &wgpu::Buffer,
        top_k: usize,
        with_single: bool,
        from: XFrom,
    ) -> Result<()> {
        // Expert stacks are indexed across the whole matrix: one part (checked at upload).
        debug_assert_eq!(m.parts.len(), 1, "expert stack split across bindings");
        let part = &m.parts[0];
        let p = moe_params(m, expert_stride, row_off, rows, top_k, x_tok_stride, x_slot_stride);
        // Same bindings but the selector: the per-pair expert ids, or moe_group's lists.
        let res = |sel: &wgpu::Buffer| weight_res(part, &[sel, x, y]);
        let x_groups = (rows as u32).div_ceil(MATMUL_ROWS);
        // Decode/verify: qmv's loop per pair for 4-bit experts, else the one-row-group kernel.
        let qmv = if m.format == Format::Q4 {
            qmv_moe_shape(rows, m.cols, top_k, x_tok_stride, x_slot_stride, &self.opts.tuning)
        } else {
            None
        };
        let (kernel, x_pairs) = match qmv {
            Some((k, per_wg)) => (k, (rows as u32).div_ceil(per_wg)),
            None => (Kernel::MoeMatmul(m.format), x_groups),
        };
        if with_single {
            self.spec(kernel, res(idx), &p, x_pairs, GridY::Slots(top_k as u32));
            self.specs.last_mut().expect("just pushed").only = Only::Single;
        }
        let p = MoeMatmulParams { group_stride: groups.stride as u32, n_groups: groups.n as u32, ..p };
        // Chunks: qmm's tile per expert where it applies, else the 8-pair grouped kernel.
        if qmm_applies(m.format, m.cols, x_tok_stride) && x_slot_stride.is_multiple_of(4) {
            // The tensor-core form reads x's group sums per row of x: per token (every slot reads
            // its token's x) or per pair (a row per slot); other layouts take the SIMT qmm_moe.
            let rows_of_x = match x_slot_stride {
                0 => Some(1),
                s if x_tok_stride == top_k * s => Some(top_k),
                _ => None,
            };
            let coop = self.tensor_cores() && rows_of_x.is_some();
            let (kernel, rows_per_wg, tok) = qmm_moe_shape(coop);
            let mut res = res(&groups.buf);
            if let Some(mult) = rows_of_x.filter(|_| coop) {
                let stride = if mult == 1 { x_tok_stride } else { x_slot_stride };
                res.push(self.x_sums(x, m.cols, m.gs, stride, mult, false, from)?);
            }
            let x = groups.n as u32 * (rows as u32).div_ceil(rows_per_wg);
            self.spec(kernel, res, &p, x, GridY::TokenTiles(tok));
        } else {
            self.spec(
                Kernel::MoeMatmulGrouped(m.format),
                res(&groups.buf),
                &p,
                x_groups,
                GridY::Fixed(groups.n as u32),
            );
        }
        self.specs.last_mut().expect("just pushed").only = Only::Multi;
        Ok(())
    }

    /// Decode/verify form of a fused gate_up expert stack with the GeGLU as epilogue:
    /// `y[t, j, r] = gelu_tanh(G_e[r] · x[t, j]) · U_e[r] · x[t, j]` (qmv_moe_glu), in place of
    /// the gate and up mat-vecs and gelu_mul; false (nothing recorded) where it does not apply.
    #[allow(clippy::too_many_arguments)]
    fn moe_glu(
        &mut self,
        m: &GpuMatrix,
        expert_stride: usize,
        row_off: usize,
        up_off: usize,
        rows: usize,
        idx: &wgpu::Buffer,
        x: &wgpu::Buffer,
        x_tok_stride: usize,
        x_slot_stride: usize,
        y: &wgpu::Buffer,
        top_k: usize,
    ) -> bool {
        if m.format != Format::Q4 {
            return false;
        }
        let Some((kernel, per_wg)) =
            qmv_moe_glu_shape(rows, m.cols, top_k, x_tok_stride, x_slot_stride, &self.opts.tuning)
        else {
            return false;
        };
        let part = &m.parts[0];
        let p = MoeMatmulParams {
            up_off: up_off as u32,
            ..moe_params(m, expert_stride, row_off, rows, top_k, x_tok_stride, x_slot_stride)
        };
        let res = weight_res(part, &[idx, x, y]);
        self.spec(kernel, res, &p, (rows as u32).div_ceil(per_wg), GridY::Slots(top_k as u32));
        self.specs.last_mut().expect("just pushed").only = Only::Single;
        true
    }

    /// Lists each expert's (or slot's) routed pairs of a chunk for the grouped expert kernel.
    fn moe_group(&mut self, idx: &wgpu::Buffer, groups: &Groups, top_k: usize) {
        let res = vec![Res::Buf(idx.clone()), Res::Buf(groups.buf.clone()), Res::Params, Res::Step];
        self.spec(
            Kernel::MoeGroup,
            res,
            &GroupParams { top_k: top_k as u32, stride: groups.stride as u32, _pad: [0; 2] },
            groups.n as u32,
            GridY::One,
        );
        self.specs.last_mut().expect("just pushed").only = Only::Multi;
    }

    fn embed(&mut self, m: &GpuMatrix, ids: &wgpu::Buffer, out: &wgpu::Buffer, scale: f32) {
        for part in &m.parts {
            let p = EmbedParams {
                rows: part.rows as u32,
                cols: m.cols as u32,
                gs: m.gs as u32,
                row0: part.row0 as u32,
                scale,
                _pad: [0; 3],
            };
            let res = weight_res(part, &[ids, out]);
            self.spec(Kernel::Embed(m.format), res, &p, (m.cols as u32).div_ceil(8).div_ceil(64), GridY::Tokens);
        }
    }

    /// Records an rmsnorm; returns its spec index (for [`Builder::chain_norm`]).
    fn norm(&mut self, x: &wgpu::Buffer, wt: &wgpu::Buffer, out: &wgpu::Buffer, p: NormParams) -> usize {
        let y = if p.count_sel == 1 { GridY::Out } else { GridY::Tokens };
        let d = || Res::Buf(self.dummy.clone());
        // `res` (binding 8, read by mode 2 only): the weights stand in (read-only there too; the
        // dummy is bound writable at 3..5, and one buffer may not be both in a dispatch).
        // `xsum` (binding 9, the rows form's group sums: Builder::norm_sums): the dummy until
        // asked for.
        // `part` (10, read by the rows form over partials: Builder::residual_norm): the weights.
        let res = vec![
            Res::Buf(x.clone()),
            Res::Buf(wt.clone()),
            Res::Buf(out.clone()),
            d(),
            d(),
            d(),
            Res::Params,
            Res::Step,
            Res::Buf(wt.clone()),
            d(),
            Res::Buf(wt.clone()),
        ];
        self.spec(
            rmsnorm(p.n as usize, self.gpu.limits.max_compute_invocations_per_workgroup, &self.opts.tuning),
            res,
            &p,
            p.segs,
            y,
        );
        self.specs.len() - 1
    }

    /// A sandwich post-norm folded into the residual add: `out = (res + norm(a) · w) · post`
    /// (rmsnorm mode 2). The residual stream ping-pongs between two buffers (`res` → `out`), so
    /// that a decode step can run this norm inside the next mat-vec instead ([`Self::fuse_norm`]).
    /// In chunks, where a split-k mat-mat wrote `a` through a qmm_sum, the norm's rows form
    /// reads the partials instead and that qmm_sum goes (`Builder::norm_splits`; `a` is read by
    /// this norm alone).
    fn residual_norm(
        &mut self,
        a: &wgpu::Buffer,
        wt: &wgpu::Buffer,
        res: &wgpu::Buffer,
        out: &wgpu::Buffer,
        p: NormParams,
    ) -> usize {
        let p = NormParams { mode: 2, ..p };
        // Whether the rows form takes this norm over partials (rows_norms gives it that form).
        let rows_take_parts =
            self.norm_splits && rmsnorm_rows(&NormParams { splits: 2, ..p }, self.norm_rows).is_some();
        let parts = if rows_take_parts { self.take_split_sum(a, p.n as usize) } else { None };
        let spec = self.norm(a, wt, out, NormParams { splits: parts.as_ref().map_or(0, |(_, s)| *s), ..p });
        self.specs[spec].res[8] = Res::Buf(res.clone());
        if let Some((part, _)) = parts {
            self.specs[spec].res[10] = Res::Buf(part);
        }
        spec
    }

    /// The params of the rmsnorm spec `spec`.
    fn norm_params(&self, spec: usize) -> NormParams {
        let sp = &self.specs[spec];
        debug_assert!(matches!(sp.kernel, Kernel::RmsNorm { .. }), "not a norm");
        bytemuck::pod_read_unaligned(&self.params[sp.param_off as usize..(sp.param_off + sp.param_len) as usize])
    }

    /// Changes the params spec `spec` was recorded with (`P`: their type) in place.
    fn edit_params<P: bytemuck::Pod>(&mut self, spec: usize, edit: impl FnOnce(&mut P)) {
        let sp = &self.specs[spec];
        let range = sp.param_off as usize..(sp.param_off + sp.param_len) as usize;
        let mut p: P = bytemuck::pod_read_unaligned(&self.params[range.clone()]);
        edit(&mut p);
        self.params[range].copy_from_slice(bytemuck::bytes_of(&p));
    }

    /// Moves the residual norm `norm` (with at most one chained norm) into the decode and verify
    /// form of the 4-bit mat-vec recorded from spec `first` on, whose input is that norm's last
    /// output: the mat-vec then runs qmv_norm.wgsl's prologue (it reads the norm's input and
    /// residual, writes the updated residual), the norm runs in chunks only. One dispatch fewer
    /// per fused norm in decode and verify steps; nothing changes where it does not apply.
    fn fuse_norm(&mut self, norm: usize, first: usize, h: usize) {
        let np = self.norm_params(norm);
        let sp = &self.specs[norm];
        let plain_rows = np.segs == 1
            && np.x_stride == h as u32
            && np.out_stride == h as u32
            && np.x_row_sel == 0
            && np.count_sel == 0;
        let applies = np.mode == 2
            && np.chain <= 1
            && np.pre == 1.0
            && np.w_off != NO_WEIGHT
            && np.w_off.is_multiple_of(4)
            && plain_rows
            && (np.chain == 0 || (np.out2_stride == h as u32 && np.w2_off != NO_WEIGHT && np.w2_off.is_multiple_of(4)));
        let (up_to, wide) = (self.opts.tuning.fuse_norms_up_to, self.opts.tuning.fuse_wide);
        if up_to == 0 || !applies || !matches!(sp.only, Only::Always) {
            return;
        }
        let max_wg = self.gpu.limits.max_compute_workgroup_storage_size;
        // One decode dispatch must read the norm's output (a matrix in several parts is not fused).
        let mut decode_forms =
            (first..self.specs.len()).filter(|&i| self.specs[i].only != Only::Multi && self.specs[i].single.is_some());
        let (Some(ci), None) = (decode_forms.next(), decode_forms.next()) else {
            return;
        };
        let c = &self.specs[ci];
        let (Some((sk, sx, _)), Some((vk, vx, _))) = (c.single, c.verify) else {
            return;
        };
        if !fuse_norm_into(sk, h, up_to, wide) {
            return;
        }
        let t = &self.opts.tuning;
        let (Some(sk), Some(vk)) = (with_norm(sk, 1, h, max_wg, t), with_norm(vk, PRO_VERIFY_TOK, h, max_wg, t)) else {
            return;
        };
        // The consumer's bindings with x replaced by the norm's input, then the prologue's.
        let buf = |r: &Res| match r {
            Res::Buf(b) => b.clone(),
            _ => unreachable!("rmsnorm binds buffers at 0, 1, 2 and 8"),
        };
        let (a, wt, out, res_in) = (buf(&sp.res[0]), buf(&sp.res[1]), buf(&sp.res[2]), buf(&sp.res[8]));
        let mut res = c.res.clone();
        res[3] = Res::Buf(a);
        let pro = NormPro {
            w1: np.w_off,
            post1: np.post,
            w2: if np.chain == 1 { np.w2_off } else { 0 },
            post2: np.post2,
            eps: np.eps,
            second: np.chain,
            _pad: [0; 2],
        };
        let (param_off, param_len) = (c.param_off, c.param_len);
        let (pro_off, pro_len) = self.push_params(&pro);
        res.extend([Res::Buf(res_in), Res::Buf(wt), Res::Buf(out), Res::ParamsAt(pro_off, pro_len)]);
        let fused = Spec {
            only: Only::Single,
            kernel: sk,
            single: Some((sk, sx, 1)),
            verify: Some((vk, vx, PRO_VERIFY_TOK)),
            res,
            param_off,
            param_len,
            x: sx,
            x_from_out: false,
            x_from_tokens: false,
            y: GridY::TokenTiles(PRO_VERIFY_TOK),
            ready: Vec::new(),
            keys: None,
        };
        self.specs[norm].only = Only::Multi;
        let c = &mut self.specs[ci];
        if c.only == Only::Single {
            self.specs[ci] = fused;
        } else {
            c.chunks_only();
            self.specs.insert(ci + 1, fused);
        }
    }

    /// Folds a later norm of the rows the residual norm `spec` wrote (weight at `w_off`, scaled
    /// by `post`, into `dst`, rows `stride` apart) into that norm: one dispatch fewer, the same
    /// arithmetic. Up to three per norm, all with one stride. Returns the output it added.
    fn chain_norm(&mut self, spec: usize, w_off: u32, post: f32, dst: &wgpu::Buffer, stride: usize) -> NormOut {
        let chain = self.norm_params(spec).chain;
        self.specs[spec].res[3 + chain as usize] = Res::Buf(dst.clone());
        self.edit_params(spec, |p: &mut NormParams| {
            debug_assert!(p.segs == 1 && p.chain < 3, "chains need one segment, at most three outputs");
            debug_assert!(p.chain == 0 || p.out2_stride == stride as u32, "chained outputs share a stride");
            match p.chain {
                0 => (p.w2_off, p.post2) = (w_off, post),
                1 => (p.w3_off, p.post3) = (w_off, post),
                _ => (p.w4_off, p.post4) = (w_off, post),
            }
            p.chain += 1;
            p.out2_stride = stride as u32;
        });
        NormOut { spec, slot: chain + 1 }
    }

    fn head_norm_rope(
        &mut self,
        src: &wgpu::Buffer,
        wt: &wgpu::Buffer,
        rope: &wgpu::Buffer,
        dst: &wgpu::Buffer,
        p: HeadParams,
    ) {
        let res = vec![
            Res::Buf(src.clone()),
            Res::Buf(wt.clone()),
            Res::Buf(rope.clone()),
            Res::Buf(dst.clone()),
            Res::Params,
            Res::Step,
        ];
        self.spec(Kernel::HeadNormRope { wg: head_norm_wg(p.d as usize) }, res, &p, p.n_heads, GridY::Tokens);
    }

    fn gelu_mul(&mut self, a: &wgpu::Buffer, b: &wgpu::Buffer, p: GeluParams) {
        let res = vec![Res::Buf(a.clone()), Res::Buf(b.clone()), Res::Params, Res::Step];
        self.spec(Kernel::GeluMul, res, &p, p.n.div_ceil(64), GridY::Tokens);
    }

    /// Uploads everything and records the forward pass (spec §2.2, in order).
    fn record(mut self, w: &Arc<ModelWeights>) -> Result<WgpuBackend> {
        let cfg = self.cfg;
        let t = &cfg.text;
        let c = self.opts.max_chunk;
        let kv = KvLayout::new(cfg, self.opts.max_ctx, c);
        let tuning = &self.opts.tuning;
        let (fold_q_norm, attn_short) = (tuning.fold_q_norm, tuning.attn_short);
        let (moe_norm, moe_overlap) = (tuning.moe_norm, tuning.moe_overlap);
        // Chunk attention on tensor cores where the mat-mats run there.
        let attn_coop = self.tensor_cores() && tuning.coop_attention;
        let attn_sums = tuning.attn_sums && self.producer_sums;
        // Expert slots of an installation: all experts (resident) or a streamed cache.
        let n_slots = match self.opts.expert_slots {
            ExpertSlots::Some(s) => s.min(t.num_experts),
            ExpertSlots::All => t.num_experts,
        };
        // `--expert-slots N` streams even when N ≥ the expert count (slots fill on first use);
        // `all` loads every expert at start.
        let streaming = w.expert_files.is_some() && matches!(self.opts.expert_slots, ExpertSlots::Some(_));

        // ---- norm weights: one buffer, offsets recorded per use
        let norms = self.upload_norms(w);

        // ---- weights
        let weights = self.upload_weights(w, n_slots, streaming)?;

        // ---- activations, sized for the largest chunk
        let acts = self.alloc_acts(&kv, &weights, n_slots, streaming, None)?;

        let f = Forward {
            norms: &norms,
            weights: &weights,
            acts: &acts,
            kv: &kv,
            eps: t.rms_norm_eps,
            fold_q_norm,
            attn_short,
            moe_norm,
            moe_overlap,
            attn_coop,
            attn_sums,
            streaming,
            // A prompt's tail (WgpuOptions::prompt_tail) starts at the attention of the last layer
            // that writes K/V. Not with streamed experts: their steps run in host-driven parts.
            tail_layer: cfg
                .layers
                .iter()
                .rposition(|l| matches!(l.kv, KvSource::Own { .. }))
                .filter(|_| self.opts.tuning.prompt_tail && !streaming),
        };

        // ---- the program
        self.record_inputs(&f)?;
        let mut state = PassState { cur: 0, residual: None, tail_cut: None };
        for (li, (l, gl)) in cfg.layers.iter().zip(&weights.layers).enumerate() {
            let layer = Layer { li, l, gl, ln: &norms.layers[li], lw: &w.layers[li] };
            let post_attn = self.record_attention(&f, layer, &mut state)?;
            let post_ff = self.record_ffn(&f, layer, post_attn, &mut state)?;
            self.record_ple(&f, layer, post_ff, &mut state)?;
        }

        // ---- head: final norm of the output rows, tied LM head, softcap + argmax
        self.record_head(&f, state.cur)?;

        self.rows_norms()?;

        let tail = self.prompt_tail(&f, state);

        // ---- bind groups
        let program = self.bind_program()?;

        // ---- the MTP drafter's program, over this program's caches and embedding
        let drafter = match self.opts.drafter.clone() {
            Some(d) => Some(drafter::record(&self, &d, &kv, &acts, &weights)?),
            None => None,
        };

        let streaming = self.streaming_state(w, &acts, n_slots, streaming);
        Ok(self.into_backend(w, kv, acts, program, tail, streaming, drafter))
    }

    /// The norm weights in one buffer, each norm at the offset recorded for its uses.
    fn upload_norms(&mut self, w: &ModelWeights) -> Norms {
        let mut norms: Vec<f32> = Vec::new();
        // Each norm starts at a multiple of 4 values: the fused-norm mat-vec reads them as vec4.
        let mut add_norm = |v: &[f32]| -> u32 {
            norms.resize(norms.len().next_multiple_of(4), 0.0);
            let off = norms.len() as u32;
            norms.extend_from_slice(v);
            off
        };
        let layer_norms: Vec<LayerNorms> = w
            .layers
            .iter()
            .map(|lw| LayerNorms {
                input: add_norm(&lw.input_norm),
                post_attn: add_norm(&lw.post_attn_norm),
                pre_ff: add_norm(&lw.pre_ff_norm),
                post_ff: add_norm(&lw.post_ff_norm),
                q: add_norm(&lw.q_norm),
                k: lw.k_norm.as_ref().map_or(NO_WEIGHT, |k| add_norm(k)),
                ple_post: lw.ple.as_ref().map_or(NO_WEIGHT, |p| add_norm(&p.post_norm)),
                moe: lw.moe.as_ref().map(|m| {
                    [
                        add_norm(&m.router_scale),
                        add_norm(&m.pre_norm_2),
                        add_norm(&m.post_norm_1),
                        add_norm(&m.post_norm_2),
                    ]
                }),
            })
            .collect();
        let final_norm = add_norm(&w.final_norm);
        let ple_norm = w.ple.as_ref().map_or(NO_WEIGHT, |p| add_norm(&p.projection_norm));
        norms.resize(norms.len().next_multiple_of(4), 0.0);
        let norm_buf = self.gpu.upload("norm weights", bytemuck::cast_slice(&norms));
        self.weight_bytes += 4 * norms.len() as u64;
        Norms { buf: norm_buf, layers: layer_norms, final_norm, ple: ple_norm }
    }

    /// The model's matrices: the embedding (also the LM head), the per-layer inputs' table and
    /// projection, and each layer's.
    fn upload_weights(&mut self, w: &ModelWeights, n_slots: usize, streaming: bool) -> Result<GpuWeights> {
        let embed = self.upload_matrix(&w.embed)?;
        let ple_w = match &w.ple {
            Some(p) => {
                let before = self.weight_bytes;
                let table = self.upload_matrix(&p.embed)?;
                self.gather_only_bytes += self.weight_bytes - before;
                Some((table, self.upload_matrix(&p.model_projection)?))
            }
            None => None,
        };
        let mut layers = Vec::with_capacity(w.layers.len());
        for (li, lw) in w.layers.iter().enumerate() {
            layers.push(GpuLayer {
                proj: {
                    let stack: Vec<&Matrix> =
                        [Some(&lw.q_proj), lw.k_proj.as_ref(), lw.v_proj.as_ref()].into_iter().flatten().collect();
                    match if stack.len() > 1 { self.upload_stacked(&stack)? } else { None } {
                        Some(m) => Proj::Stacked(m),
                        None => Proj::Separate {
                            q: self.upload_matrix(&lw.q_proj)?,
                            k: lw.k_proj.as_ref().map(|m| self.upload_matrix(m)).transpose()?,
                            v: lw.v_proj.as_ref().map(|m| self.upload_matrix(m)).transpose()?,
                        },
                    }
                },
                o: self.upload_matrix(&lw.o_proj)?,
                mlp: match self.upload_stacked(&[&lw.gate_proj, &lw.up_proj])? {
                    Some(gu) => Mlp::Stacked(gu),
                    None => {
                        Mlp::Split { gate: self.upload_matrix(&lw.gate_proj)?, up: self.upload_matrix(&lw.up_proj)? }
                    }
                },
                down: self.upload_matrix(&lw.down_proj)?,
                ple: match &lw.ple {
                    Some(p) => Some((self.upload_matrix(&p.input_gate)?, self.upload_matrix(&p.projection)?)),
                    None => None,
                },
                moe: match &lw.moe {
                    Some(m) => Some(self.upload_moe(w, li, m, n_slots, streaming)?),
                    None => None,
                },
            });
        }
        Ok(GpuWeights { embed, ple: ple_w, layers })
    }

    /// A MoE layer's router and routed experts: the checkpoint's stacks, or an installation's
    /// expert slots (filled here unless they stream).
    fn upload_moe(
        &mut self,
        w: &ModelWeights,
        li: usize,
        m: &MoeWeights,
        n_slots: usize,
        streaming: bool,
    ) -> Result<GpuMoe> {
        let t = &self.cfg.text;
        let iw = t.moe_intermediate_size;
        let (gate, up, up_off, down) = match (&m.experts, &w.expert_files) {
            (Some(st), _) => {
                let before = self.weight_bytes;
                let (gate, up, up_off) = match &st.gate_up {
                    ExpertGateUp::Fused(gu) => ((self.upload_matrix_whole(gu)?, 2 * iw, 0), None, iw),
                    ExpertGateUp::Split { gate, up } => match self.upload_experts_fused(gate, up, t.num_experts)? {
                        Some(gu) => ((gu, 2 * iw, 0), None, iw),
                        None => ((self.upload_matrix_whole(gate)?, iw, 0), Some(self.upload_matrix_whole(up)?), 0),
                    },
                };
                let down = self.upload_matrix_whole(&st.down)?;
                self.routed_decode_bytes +=
                    (self.weight_bytes - before) * t.top_k_experts as u64 / t.num_experts as u64;
                (gate, up, up_off, down)
            }
            (None, Some(files)) => {
                let sl = self.slot_layer(files, n_slots)?;
                let per_expert: u64 = files
                    .layout
                    .parts
                    .iter()
                    .map(|p| p.w.1 + p.scales.map_or(0, |s| s.1) + p.biases.map_or(0, |b| b.1))
                    .sum();
                self.routed_decode_bytes += per_expert * t.top_k_experts as u64;
                let get = |role: &str| sl.parts.iter().find(|(p, _)| p.role == role).map(|(_, g)| g.clone());
                let down = get("down").ok_or_else(|| Error::Invalid("expert layout has no `down` part".into()))?;
                let r = match get("gate_up") {
                    Some(gu) => ((gu, 2 * iw, 0), None, iw, down),
                    None => {
                        let gate =
                            get("gate").ok_or_else(|| Error::Invalid("expert layout has no `gate` part".into()))?;
                        ((gate, iw, 0), get("up"), 0, down)
                    }
                };
                if !streaming {
                    // Every expert resident: slot e holds expert e, filled once.
                    files.for_each_expert(li, |e, blob| {
                        sl.write(&self.gpu.queue, e, blob);
                        Ok(())
                    })?;
                    // Flush the layer's staged copies now: queued writes hold
                    // host-visible staging memory until a submit completes
                    // (without this, 26B-A4B peaked at 37 GB of GPU memory).
                    self.gpu.queue.submit([]);
                    self.gpu
                        .device
                        .poll(wgpu::PollType::wait_indefinitely())
                        .map_err(|e| Error::Gpu(format!("device poll failed: {e}")))?;
                }
                self.slot_layers.insert(li, sl);
                r
            }
            (None, None) => return Err(Error::Invalid("MoE layer without expert weights".into())),
        };
        Ok(GpuMoe {
            router: self.upload_matrix(&m.router_proj)?,
            per_expert_scale: self.gpu.upload("per_expert_scale", bytemuck::cast_slice(&m.per_expert_scale)),
            gate,
            up,
            up_off,
            down,
        })
    }

    /// The step's activation buffers, sized for the largest chunk, and the KV caches.
    /// `caches`: K and V buffers of `kv.caches` that exist already (the target's, which a drafter
    /// reads), else allocated here.
    fn alloc_acts(
        &mut self,
        kv: &KvLayout,
        weights: &GpuWeights,
        n_slots: usize,
        streaming: bool,
        caches: Option<(Vec<wgpu::Buffer>, Vec<wgpu::Buffer>)>,
    ) -> Result<Acts> {
        let cfg = self.cfg;
        let t = &cfg.text;
        let c = self.opts.max_chunk;
        let (h, vocab) = (t.hidden_size, t.vocab_size);
        let q_max = cfg.layers.iter().map(|l| l.q_dim()).max().unwrap_or(0);
        let kv_max = cfg.layers.iter().map(|l| l.kv_dim()).max().unwrap_or(0);
        let mlp_max = cfg.layers.iter().map(|l| l.mlp_width).max().unwrap_or(0);
        let (pd, nl) = (t.hidden_size_per_layer_input, t.num_hidden_layers);
        let logit_rows = c.min((self.gpu.adapter_max_binding / (4 * vocab as u64)).max(1) as usize);
        let ids = self.act("ids", c)?;
        let (ds, df) = (t.head_dim, t.global_head_dim);
        let rope_stride = ds + df;
        let rope_buf = self.act("rope table", c * rope_stride)?;
        let x = self.act("x (residual)", c * h)?;
        // The residual stream's other buffer: each residual norm reads one and writes the other.
        let x_alt = self.act("x (residual, other)", c * h)?;
        let xn = self.act("xn (normed)", c * h)?;
        let xn2 = self.act("xn2 (MoE pre-expert norm)", if t.enable_moe_block { c * h } else { 1 })?;
        let q = self.act("q", c * q_max)?;
        let att = self.act("att", c * q_max)?;
        // A separate q projection's output (before its norm and rope), apart from `att`: the
        // decode attention that norms q itself (attention_short's q-norm form) reads it while
        // writing att.
        let q_sep = self.act("q (separate projection)", c * q_max)?;
        let ktmp = self.act("k", c * kv_max.max(1))?;
        let vtmp = self.act("v", c * kv_max.max(1))?;
        let qkv = self.act("q|k|v", c * (q_max + 2 * kv_max))?;
        let o = self.act("o", c * h)?;
        let heads_max = cfg.layers.iter().map(|l| l.n_heads).max().unwrap_or(0);
        let d_max = cfg.layers.iter().map(|l| l.head_dim).max().unwrap_or(0);
        let attn_part = self.act("attention splits", VERIFY_MAX * heads_max * ATTN_SPLITS as usize * (d_max + 2))?;
        // Gate and up side by side per token when stacked; the GeGLU lands in the gate half.
        let g = self.act("ffn gate", c * 2 * mlp_max)?;
        let u = self.act("ffn up", c * mlp_max)?;
        let xf = self.act("final hidden", logit_rows * h)?;
        let logits = self.act("logits", logit_rows * vocab)?;
        let best = self.act("argmax", logit_rows)?;
        let argmax_part = self.act("argmax chunks", logit_rows * 2 * argmax_chunks(vocab) as usize)?;
        let (ne, tk, iw) = (t.num_experts, t.top_k_experts, t.moe_intermediate_size);
        let moe_bufs = if t.enable_moe_block {
            Some((
                self.act("moe dense out", c * h)?,
                self.act("router logits", c * ne)?,
                self.act("router idx", c * tk)?,
                self.act("router weights", c * tk)?,
                self.act("router input", c * h)?,
                // Streaming: the host writes each pair's slot here (the router's idx otherwise).
                if streaming { self.gpu.storage("expert slot table", (4 * c * tk) as u64) } else { self.dummy.clone() },
                self.act("expert gate", c * tk * iw)?,
                self.act("expert up", c * tk * iw)?,
                self.act("expert out", c * tk * h)?,
            ))
        } else {
            None
        };
        // One list per expert (resident) or slot (streamed), each with room for every token.
        let moe_groups = if t.enable_moe_block {
            let n = if streaming { n_slots } else { ne };
            let stride = 1 + c;
            Some(Groups { buf: self.act("expert groups", n * stride)?, n, stride })
        } else {
            None
        };
        let ple_bufs = if weights.ple.is_some() {
            Some((
                self.act("ple inputs", c * nl * pd)?,
                self.act("ple context", c * nl * pd)?,
                self.act("ple gate", c * pd)?,
            ))
        } else {
            None
        };
        let (kcache, vcache) = match caches {
            Some(kv_bufs) => kv_bufs,
            None => {
                let (mut kcache, mut vcache) = (Vec::new(), Vec::new());
                for (i, cs) in kv.caches.iter().enumerate() {
                    let elems = (cs.slots + VERIFY_MAX) * cs.slot_elems();
                    kcache.push(self.act(&format!("k cache {i} (layer {})", cs.layer), elems)?);
                    vcache.push(self.act(&format!("v cache {i} (layer {})", cs.layer), elems)?);
                }
                (kcache, vcache)
            }
        };
        Ok(Acts {
            logit_rows,
            ids,
            rope_buf,
            rope_stride,
            xs: [x, x_alt],
            xn,
            xn2,
            q,
            att,
            q_sep,
            ktmp,
            vtmp,
            qkv,
            o,
            attn_part,
            g,
            u,
            xf,
            logits,
            best,
            argmax_part,
            moe_bufs,
            moe_groups,
            ple_bufs,
            kcache,
            vcache,
        })
    }

    /// The token embedding into the residual stream, and the per-layer inputs.
    fn record_inputs(&mut self, f: &Forward) -> Result<()> {
        let Acts { ids, xs, ple_bufs, .. } = f.acts;
        let norm_buf = &f.norms.buf;
        let t = &self.cfg.text;
        let (h, eps) = (t.hidden_size, t.rms_norm_eps);
        let (pd, nl) = (t.hidden_size_per_layer_input, t.num_hidden_layers);
        self.embed(&f.weights.embed, ids, &xs[0], embed_scale(h));
        if let (Some((ple_e, ple_p)), Some((ple_all, ple_ctx, _))) = (&f.weights.ple, ple_bufs) {
            // ple = (norm(W_plmp · h · H^-½) + E_ple[id] · √P) · 2^-½
            self.embed(ple_e, ids, ple_all, (pd as f64).sqrt() as f32);
            self.matmul(ple_p, &xs[0], h, ple_ctx, nl * pd, false)?;
            self.norm(
                ple_ctx,
                norm_buf,
                ple_all,
                NormParams {
                    n: pd as u32,
                    segs: nl as u32,
                    x_stride: (nl * pd) as u32,
                    x_row_sel: 0,
                    out_stride: (nl * pd) as u32,
                    w_off: f.norms.ple,
                    mode: 1,
                    count_sel: 0,
                    pre: (h as f64).powf(-0.5) as f32,
                    post: std::f32::consts::FRAC_1_SQRT_2,
                    eps,
                    ..Default::default()
                },
            );
        }
        Ok(())
    }

    /// A layer's attention block: the input norm, the q, k and v projections, their head
    /// norms and rope (k and v into the cache), the chunk attention and the decode and verify
    /// forms, the o projection and the post-attention residual norm (returned).
    fn record_attention(&mut self, f: &Forward, layer: Layer, st: &mut PassState) -> Result<usize> {
        let Layer { li, l, gl, ln, .. } = layer;
        let Acts { xs, xn, q, att, q_sep, ktmp, vtmp, qkv, o, attn_part, rope_buf, kcache, vcache, .. } = f.acts;
        let (kv, norm_buf, rope_stride) = (f.kv, &f.norms.buf, f.acts.rope_stride);
        let t = &self.cfg.text;
        let (c, h, eps, ds) = (self.opts.max_chunk, t.hidden_size, t.rms_norm_eps, t.head_dim);
        let d = l.head_dim;
        let rope_off = if l.kind == AttnKind::Full { ds } else { 0 };
        let rc = kv.read_cache[li];
        let slots = kv.caches[rc].slots as u32;

        // attention block; the input norm rides on the last layer's final residual norm
        let input_norm = st.residual.take();
        // Where xn comes from: chunk norms can also write its group sums for the mat-mats.
        let xn_from = match input_norm {
            Some(prev) => self.chain_norm(prev, ln.input, 1.0, xn, h),
            None => NormOut { spec: self.norm(&xs[st.cur], norm_buf, xn, f.plain(h, ln.input, 0, 1.0)), slot: 0 },
        };
        // Where q, k and v land: (buffer, offset in a row, row stride) each.
        let first = self.specs.len();
        // A KV-sharing layer's raw q and where its heads lie, when attention_split norms it.
        let mut q_raw: Option<(wgpu::Buffer, QNormParams)> = None;
        let (qs, ks, vs) = match &gl.proj {
            Proj::Stacked(m) => {
                let rows = m.parts[0].rows;
                self.matmul_from(m, xn, h, qkv, rows, XFrom::Norm(xn_from))?;
                let k_off = l.q_dim();
                // attention_k_eq_v: V = raw K projection
                let v_off = if rows > l.q_dim() + l.kv_dim() { k_off + l.kv_dim() } else { k_off };
                ((qkv, 0, rows), (qkv, k_off, rows), (qkv, v_off, rows))
            }
            Proj::Separate { q: qm, k, v } => {
                self.matmul_from(qm, xn, h, q_sep, l.q_dim(), XFrom::Norm(xn_from))?;
                if let Some(k) = k {
                    self.matmul_from(k, xn, h, ktmp, l.kv_dim(), XFrom::Norm(xn_from))?;
                }
                if let Some(v) = v {
                    self.matmul_from(v, xn, h, vtmp, l.kv_dim(), XFrom::Norm(xn_from))?;
                }
                let vsrc = if v.is_some() { vtmp } else { ktmp };
                ((q_sep, 0, l.q_dim()), (ktmp, 0, l.kv_dim()), (vsrc, 0, l.kv_dim()))
            }
        };
        // The input norm inside its reader: the stacked q|k|v, or a KV-sharing layer's q
        // (separate q, k and v are three readers: fuse_norm leaves the norm alone then).
        if let Some(prev) = input_norm {
            self.fuse_norm(prev, first, h);
        }
        match (l.kv, &gl.proj) {
            (KvSource::Own { cache }, Proj::Stacked(_)) => {
                // One dispatch for the q, k and v heads of the stacked row.
                let p = QkvParams {
                    d: d as u32,
                    src_stride: qs.2 as u32,
                    rope_off: rope_off as u32,
                    rope_stride: rope_stride as u32,
                    n_q: l.n_heads as u32,
                    n_kv: l.n_kv_heads as u32,
                    k_off: ks.1 as u32,
                    v_off: vs.1 as u32,
                    q_w: ln.q,
                    k_w: ln.k,
                    slots: kv.caches[cache].slots as u32,
                    eps,
                };
                let res = vec![
                    Res::Buf(qkv.clone()),
                    Res::Buf(norm_buf.clone()),
                    Res::Buf(rope_buf.clone()),
                    Res::Buf(q.clone()),
                    Res::Buf(kcache[cache].clone()),
                    Res::Buf(vcache[cache].clone()),
                    Res::Params,
                    Res::Step,
                ];
                self.spec(
                    Kernel::QkvNormRope { wg: head_norm_wg(p.d as usize) },
                    res,
                    &p,
                    (l.n_heads + 2 * l.n_kv_heads) as u32,
                    GridY::Tokens,
                );
            }
            (kv_src, _) => {
                if let KvSource::Own { cache } = kv_src {
                    let base = HeadParams {
                        d: d as u32,
                        n_heads: l.n_kv_heads as u32,
                        src_stride: ks.2 as u32,
                        w_off: ln.k,
                        rope: 1,
                        rope_off: rope_off as u32,
                        rope_stride: rope_stride as u32,
                        dst_mode: 1,
                        slots: kv.caches[cache].slots as u32,
                        eps,
                        src_off: ks.1 as u32,
                        _pad: 0,
                    };
                    let (kb, vb) = (ks.0.clone(), vs.0.clone());
                    self.head_norm_rope(&kb, norm_buf, rope_buf, &kcache[cache], base);
                    self.head_norm_rope(
                        &vb,
                        norm_buf,
                        rope_buf,
                        &vcache[cache],
                        HeadParams { w_off: NO_WEIGHT, rope: 0, src_stride: vs.2 as u32, src_off: vs.1 as u32, ..base },
                    );
                }
                let qb = qs.0.clone();
                self.head_norm_rope(
                    &qb,
                    norm_buf,
                    rope_buf,
                    q,
                    HeadParams {
                        d: d as u32,
                        n_heads: l.n_heads as u32,
                        src_stride: qs.2 as u32,
                        w_off: ln.q,
                        rope: 1,
                        rope_off: rope_off as u32,
                        rope_stride: rope_stride as u32,
                        dst_mode: 0,
                        slots: 0,
                        eps,
                        src_off: qs.1 as u32,
                        _pad: 0,
                    },
                );
                if f.fold_q_norm {
                    // Chunks only: decode and verify steps norm q in attention_split.
                    self.specs.last_mut().expect("just pushed").only = Only::Multi;
                    let qp = QNormParams {
                        src_stride: qs.2 as u32,
                        src_off: qs.1 as u32,
                        w_off: ln.q,
                        rope_off: rope_off as u32,
                        rope_stride: rope_stride as u32,
                        eps,
                        _pad: [0; 2],
                    };
                    q_raw = Some((qb, qp));
                }
            }
        }
        let ap = AttnParams {
            d: d as u32,
            n_heads: l.n_heads as u32,
            n_kv_heads: l.n_kv_heads as u32,
            slots,
            window: if l.kind == AttnKind::Sliding { t.sliding_window as u32 } else { 0 },
            n_splits: ATTN_SPLITS,
            short_max: if d % 8 == 0 && d <= 1024 { f.attn_short } else { 0 },
            _pad: 0,
        };
        // Chunks (prefill): 16 queries per workgroup share each key tile, or 32 on tensor cores.
        let mut res = vec![
            Res::Buf(q.clone()),
            Res::Buf(kcache[rc].clone()),
            Res::Buf(vcache[rc].clone()),
            Res::Buf(att.clone()),
            Res::Params,
            Res::Step,
        ];
        // The tensor-core form also writes its output's sums over each 64-dim value stage,
        // the o projection's group sums of x, instead of a group_sum pass
        // (`attn_sums=off`: not).
        let mut o_from = XFrom::Any;
        let (chunk_attn, bq) = match attention_chunk_coop(d) {
            Some(Kernel::AttentionCoop { d, .. }) if f.attn_coop && f.attn_sums => {
                let osum = self.scratch(Scratch::ProducerSums, c * l.q_dim() / 64)?;
                res.push(Res::Buf(osum.clone()));
                o_from = XFrom::Sums { sums: Res::Buf(osum), cols: l.q_dim(), gs: 64 };
                (Kernel::AttentionCoop { d, sums: true }, ATTN_COOP_BQ)
            }
            Some(k) if f.attn_coop => (k, ATTN_COOP_BQ),
            _ => (attention_chunk(d), ATTN_BQ),
        };
        if f.tail_layer == Some(li) {
            // What the rest of the program reads by token that the part before it wrote:
            // the residual into this layer, q as decode's attention reads it (the raw
            // projection where attention_split norms it) and, below, the per-layer inputs
            // and the rope row.
            let mut rows = vec![(xs[st.cur].clone(), 4 * h as u64)];
            rows.push(match &q_raw {
                Some((qb, _)) => (qb.clone(), 4 * qs.2 as u64),
                None => (q.clone(), 4 * l.q_dim() as u64),
            });
            st.tail_cut = Some((self.specs.len(), li, rows));
        }
        self.spec(chunk_attn, res, &ap, l.n_heads as u32, GridY::TokenTiles(bq));
        self.specs.last_mut().expect("just pushed").only = Only::Multi;
        // Decode and verify: the keys split over attn_splits() workgroups per head, then
        // merged; rows of at most ap.short_max keys in one dispatch instead (attention_short).
        let qnorm = q_raw.is_some();
        let (qb, extra) = match q_raw.take() {
            Some((qb, qp)) => {
                let (off, len) = self.push_params(&qp);
                (qb, vec![Res::Buf(norm_buf.clone()), Res::Buf(rope_buf.clone()), Res::ParamsAt(off, len)])
            }
            None => (q.clone(), Vec::new()),
        };
        let attn_res = |out: &wgpu::Buffer| {
            [
                vec![
                    Res::Buf(qb.clone()),
                    Res::Buf(kcache[rc].clone()),
                    Res::Buf(vcache[rc].clone()),
                    Res::Buf(out.clone()),
                    Res::Params,
                    Res::Step,
                ],
                extra.clone(),
            ]
            .concat()
        };
        let owner = |short| Some(KeysOwner { short, window: ap.window, max: ap.short_max });
        if ap.short_max < u32::MAX {
            self.spec(attention_split(d, qnorm), attn_res(attn_part), &ap, l.n_heads as u32, GridY::Slots(ap.n_splits));
            self.specs.last_mut().expect("just pushed").only = Only::Single;
            self.specs.last_mut().expect("just pushed").keys = owner(false);
            let res = vec![Res::Buf(attn_part.clone()), Res::Buf(att.clone()), Res::Params, Res::Step];
            self.spec(Kernel::AttentionCombine, res, &ap, l.n_heads as u32, GridY::Tokens);
            self.specs.last_mut().expect("just pushed").only = Only::Single;
            self.specs.last_mut().expect("just pushed").keys = owner(false);
        }
        if ap.short_max > 0 {
            self.spec(
                attention_short(d, qnorm, &self.gpu.device_limits()),
                attn_res(att),
                &ap,
                l.n_heads as u32,
                GridY::Tokens,
            );
            self.specs.last_mut().expect("just pushed").only = Only::Single;
            self.specs.last_mut().expect("just pushed").keys = owner(true);
        }
        self.matmul_from(&gl.o, att, l.q_dim(), o, h, o_from)?;
        let post_attn = self.residual_norm(o, norm_buf, &xs[st.cur], &xs[st.cur ^ 1], f.plain(h, ln.post_attn, 2, 1.0));
        st.cur ^= 1;
        Ok(post_attn)
    }

    /// A layer's feed-forward block: the pre-feed-forward norm, the router (MoE layers), the
    /// dense MLP, the routed experts and the post-feed-forward residual norm (returned).
    fn record_ffn(&mut self, f: &Forward, layer: Layer, post_attn: usize, st: &mut PassState) -> Result<usize> {
        let Layer { l, gl, ln, lw, .. } = layer;
        let Acts { xs, xn, .. } = f.acts;
        let norm_buf = &f.norms.buf;
        let t = &self.cfg.text;
        let (h, tk) = (t.hidden_size, t.top_k_experts);

        // feed-forward block
        let ff_from = self.chain_norm(post_attn, ln.pre_ff, 1.0, xn, h);
        // Decode and verify steps close a MoE block in one moe_norm dispatch where its
        // registers hold the row; chunks run the dense post-norm, moe_combine and the
        // routed post-norm.
        let max_wg = self.gpu.limits.max_compute_invocations_per_workgroup;
        let closing = match moe_norm(h, tk, max_wg, &self.opts.tuning) {
            k @ Kernel::MoeNorm { v, wg, .. } if f.moe_norm && gl.moe.is_some() && h <= (v * wg) as usize => Some(k),
            _ => None,
        };
        // Decode and verify steps of a resident MoE model run the dense branch beside the
        // routed one: its GeGLU mat-vec with the experts' and its down projection with
        // theirs, each pair without a barrier between (`Dispatch::ready`). For that the
        // dense branch's decode forms write buffers of their own per layer (new to the pass
        // when they write them), and moe_norm reads the dense output from there.
        let overlap = match (&gl.mlp, closing) {
            (Mlp::Stacked(_), Some(_)) if f.moe_overlap && !f.streaming => {
                let rows = VERIFY_MAX;
                Some((
                    self.act("ffn gate (dense branch, decode)", rows * 2 * l.mlp_width)?,
                    self.act("moe dense out (decode)", rows * h)?,
                ))
            }
            _ => None,
        };
        // MoE layers route first, so that a streamed step can hand the top-k to the host and
        // run the dense branch while the host reads the missing experts.
        let (route_end, xn2_from) = self.record_router(f, layer, post_attn)?;
        let down_x_stride = self.record_mlp(f, layer, post_attn, ff_from, overlap.is_none())?;
        let ff_out = self.record_moe(f, layer, MoePlan { closing, overlap, route_end, xn2_from, down_x_stride })?;
        let post_ff_scale = if gl.ple.is_some() { 1.0 } else { lw.layer_scalar };
        let post_ff = self.residual_norm(
            ff_out,
            norm_buf,
            &xs[st.cur],
            &xs[st.cur ^ 1],
            f.plain(h, ln.post_ff, 2, post_ff_scale),
        );
        st.cur ^= 1;
        st.residual = Some(post_ff);
        Ok(post_ff)
    }

    /// A MoE layer's router: its input norm and the experts' (both chained onto the
    /// post-attention norm), the router projection and its top-k. Returns where its dispatches
    /// end and the experts' input norm (none on dense layers).
    fn record_router(
        &mut self,
        f: &Forward,
        layer: Layer,
        post_attn: usize,
    ) -> Result<(Option<usize>, Option<NormOut>)> {
        let Layer { gl, ln, .. } = layer;
        let Acts { xn2, moe_bufs, .. } = f.acts;
        let t = &self.cfg.text;
        let (h, ne, tk) = (t.hidden_size, t.num_experts, t.top_k_experts);
        let mut route_end = None;
        let mut xn2_from = None;
        if let (Some(moe), Some((_, logits_r, idx, wts, xr, ..)), Some([rs, ..])) = (&gl.moe, moe_bufs, ln.moe) {
            // router on norm(h) · scale · H^-½, and the experts' input pre_norm_2(h): both norms
            // of the rows the post-attention norm just wrote, chained onto it.
            let xr_from = self.chain_norm(post_attn, rs, (h as f64).powf(-0.5) as f32, xr, h);
            let pre2 = ln.moe.expect("MoE layers have their norms")[1];
            xn2_from = Some(self.chain_norm(post_attn, pre2, 1.0, xn2, h));
            self.matmul_from(&moe.router, xr, h, logits_r, ne, XFrom::Norm(xr_from))?;
            let res = vec![
                Res::Buf(logits_r.clone()),
                Res::Buf(moe.per_expert_scale.clone()),
                Res::Buf(idx.clone()),
                Res::Buf(wts.clone()),
                Res::Params,
                Res::Step,
            ];
            self.spec(
                Kernel::RouterTopk,
                res,
                &RouterParams { n_experts: ne as u32, top_k: tk as u32, _pad: [0; 2] },
                1,
                GridY::Tokens,
            );
            self.specs.last_mut().expect("just pushed").one_workgroup_per_token();
            route_end = Some(self.specs.len());
        }
        Ok((route_end, xn2_from))
    }

    /// A layer's dense MLP: gate and up (stacked: one GeGLU mat-mat) and the down projection
    /// into `o`. `decode`: with their decode and verify forms (not when the dense branch runs
    /// beside the experts). Returns the down projection's x stride.
    fn record_mlp(
        &mut self,
        f: &Forward,
        layer: Layer,
        post_attn: usize,
        ff_from: NormOut,
        decode: bool,
    ) -> Result<usize> {
        let Layer { l, gl, .. } = layer;
        let Acts { xn, g, u, o, .. } = f.acts;
        let h = self.cfg.text.hidden_size;
        let (down_x_stride, down_from) = match &gl.mlp {
            Mlp::Split { gate, up } => {
                self.matmul_from(gate, xn, h, g, l.mlp_width, XFrom::Norm(ff_from))?;
                self.matmul_from(up, xn, h, u, l.mlp_width, XFrom::Norm(ff_from))?;
                self.gelu_mul(
                    g,
                    u,
                    GeluParams {
                        n: l.mlp_width as u32,
                        a_stride: l.mlp_width as u32,
                        b_stride: l.mlp_width as u32,
                        b_off: 0,
                        ..Default::default()
                    },
                );
                (l.mlp_width, XFrom::Any)
            }
            Mlp::Stacked(gu) => {
                let first = self.specs.len();
                let sums = self.matmul_glu(gu, l.mlp_width, xn, h, g, ff_from, decode)?;
                if gl.moe.is_none() {
                    self.fuse_norm(post_attn, first, h);
                }
                (2 * l.mlp_width, sums)
            }
        };
        self.matmul_steps(&gl.down, g, down_x_stride, o, h, false, decode, down_from)?;
        Ok(down_x_stride)
    }

    /// A MoE layer's routed experts (and the dense branch's decode forms beside them, when
    /// they overlap), moe_combine and the post-norms that close the block. Returns the
    /// block's output: `m1` on MoE layers, else the dense MLP's `o`.
    fn record_moe<'p>(&mut self, f: &Forward<'p>, layer: Layer, plan: MoePlan) -> Result<&'p wgpu::Buffer> {
        let Layer { li, l, gl, ln, .. } = layer;
        let Acts { xn, xn2, o, moe_bufs, moe_groups, .. } = f.acts;
        let norm_buf = &f.norms.buf;
        let MoePlan { closing, overlap, route_end, xn2_from, down_x_stride } = plan;
        let t = &self.cfg.text;
        let (h, eps) = (t.hidden_size, t.rms_norm_eps);
        let (tk, iw) = (t.top_k_experts, t.moe_intermediate_size);
        let mut ff_out = o;
        if let (Some(moe), Some((m1, _, idx, wts, _, slot_idx, eg, eu, eo)), Some([_, _, post1, post2])) =
            (&gl.moe, moe_bufs, ln.moe)
        {
            // m = post_norm_1(dense) + post_norm_2(Σ_j w_j · expert_j(pre_norm_2(h))), the
            // experts reading pre_norm_2(h) from xn2 (chained above)
            let dense_norm = self.norm(o, norm_buf, m1, f.plain(h, post1, 0, 1.0));
            if closing.is_some() {
                self.specs[dense_norm].only = Only::Multi;
            }
            let experts_begin = self.specs.len();
            let sel = if f.streaming { slot_idx } else { idx };
            let groups = moe_groups.as_ref().expect("allocated for MoE models");
            self.moe_group(sel, groups, tk);
            let (gm, gstride, goff) = &moe.gate;
            // Fused gate_up: decode/verify run one GeGLU mat-vec; chunks the grouped kernels.
            let glu = moe.up.is_none() && self.moe_glu(gm, *gstride, *goff, moe.up_off, iw, sel, xn2, h, 0, eg, tk);
            if let (Some((g1, _)), Mlp::Stacked(gu)) = (&overlap, &gl.mlp) {
                // The dense GeGLU beside the experts' (xn made ready by their dispatch).
                if glu {
                    self.specs.last_mut().expect("just pushed").ready.push(xn.clone());
                }
                self.glu_single(gu, l.mlp_width, xn, h, g1);
            }
            self.moe_matmul(
                gm,
                *gstride,
                *goff,
                iw,
                sel,
                groups,
                xn2,
                h,
                0,
                eg,
                tk,
                !glu,
                xn2_from.map_or(XFrom::Any, XFrom::Norm),
            )?;
            let (um, ustride, uoff) = match &moe.up {
                Some(u) => (u, iw, 0),
                None => (gm, *gstride, moe.up_off),
            };
            self.moe_matmul(
                um,
                ustride,
                uoff,
                iw,
                sel,
                groups,
                xn2,
                h,
                0,
                eu,
                tk,
                !glu,
                xn2_from.map_or(XFrom::Any, XFrom::Norm),
            )?;
            self.gelu_mul(
                eg,
                eu,
                GeluParams {
                    n: (tk * iw) as u32,
                    a_stride: (tk * iw) as u32,
                    b_stride: (tk * iw) as u32,
                    b_off: 0,
                    ..Default::default()
                },
            );
            if glu {
                self.specs.last_mut().expect("just pushed").only = Only::Multi;
            }
            let routed_down = self.specs.len();
            self.moe_matmul(&moe.down, h, 0, h, sel, groups, eg, tk * iw, iw, eo, tk, true, XFrom::Any)?;
            if let Some((g1, d1)) = &overlap {
                // The dense down projection beside the experts' (its decode spec, recorded
                // first, makes the dense GeGLU's output ready).
                self.specs[routed_down].ready.push(g1.clone());
                self.matvec_single(&gl.down, g1, down_x_stride, d1, h);
            }
            if f.streaming {
                let route_end = route_end.expect("recorded above for MoE layers");
                self.marks.push(Mark { layer: li, route_end, experts_begin, experts_end: self.specs.len() });
            }
            let res = vec![Res::Buf(wts.clone()), Res::Buf(eo.clone()), Res::Buf(o.clone()), Res::Params, Res::Step];
            self.spec(
                Kernel::MoeCombine,
                res,
                &CombineParams { n: h as u32, top_k: tk as u32, _pad: [0; 2] },
                (h as u32).div_ceil(64),
                GridY::Tokens,
            );
            let combine = self.specs.len() - 1;
            let routed_norm = self.norm(o, norm_buf, m1, f.plain(h, post2, 1, 1.0));
            if let Some(kernel) = closing {
                self.specs[combine].only = Only::Multi;
                self.specs[routed_norm].only = Only::Multi;
                let dense = overlap.as_ref().map_or(o, |(_, d1)| d1);
                let res = vec![
                    Res::Buf(dense.clone()),
                    Res::Buf(eo.clone()),
                    Res::Buf(wts.clone()),
                    Res::Buf(norm_buf.clone()),
                    Res::Buf(m1.clone()),
                    Res::Params,
                    Res::Step,
                ];
                let p = MoeNormParams {
                    n: h as u32,
                    w1_off: post1,
                    w2_off: post2,
                    eps,
                    post1: 1.0,
                    post2: 1.0,
                    _pad: [0; 2],
                };
                self.spec(kernel, res, &p, 1, GridY::Tokens);
                self.specs.last_mut().expect("just pushed").only = Only::Single;
            }
            ff_out = m1;
        }
        Ok(ff_out)
    }

    /// A layer's per-layer input (PLE): the gate, its projection and the residual norm that
    /// applies the layer scalar.
    fn record_ple(&mut self, f: &Forward, layer: Layer, post_ff: usize, st: &mut PassState) -> Result<()> {
        let Layer { li, gl, ln, lw, .. } = layer;
        let Acts { xs, o, ple_bufs, .. } = f.acts;
        let norm_buf = &f.norms.buf;
        let t = &self.cfg.text;
        let h = t.hidden_size;
        let (pd, nl) = (t.hidden_size_per_layer_input, t.num_hidden_layers);

        // per-layer input, then the layer scalar
        if let (Some((gate, proj)), Some((ple_all, _, ple_g))) = (&gl.ple, ple_bufs) {
            let first = self.specs.len();
            let sums = self.ple_gate(
                gate,
                &xs[st.cur],
                h,
                ple_g,
                ple_all,
                pd,
                nl * pd,
                li * pd,
                NormOut { spec: post_ff, slot: 0 },
            )?;
            self.fuse_norm(post_ff, first, h);
            self.matmul_from(proj, ple_g, pd, o, h, sums)?;
            st.residual = Some(self.residual_norm(
                o,
                norm_buf,
                &xs[st.cur],
                &xs[st.cur ^ 1],
                f.plain(h, ln.ple_post, 2, lw.layer_scalar),
            ));
            st.cur ^= 1;
        }
        Ok(())
    }

    /// The head, on the output rows of the residual stream's `xs[cur]`.
    fn record_head(&mut self, f: &Forward, cur: usize) -> Result<()> {
        let Acts { xs, xf, logits, best, argmax_part, .. } = f.acts;
        let t = &self.cfg.text;
        let (h, vocab) = (t.hidden_size, t.vocab_size);
        self.norm(
            &xs[cur],
            &f.norms.buf,
            xf,
            NormParams { x_row_sel: 1, count_sel: 1, ..f.plain(h, f.norms.final_norm, 0, 1.0) },
        );
        self.matmul(&f.weights.embed, xf, h, logits, vocab, true)?;
        let cap = t.final_logit_softcapping.unwrap_or(0.0);
        let chunks = argmax_chunks(vocab);
        let (param_off, param_len) = self.push_params(&ArgmaxParams { vocab: vocab as u32, cap, chunks, _pad: 0 });
        let res = vec![
            Res::Buf(logits.clone()),
            Res::Buf(argmax_part.clone()),
            Res::Buf(best.clone()),
            Res::Params,
            Res::Step,
        ];
        let pass = |kernel, x, x_from_out, y| Spec {
            only: Only::Always,
            kernel,
            single: None,
            verify: None,
            res: res.clone(),
            param_off,
            param_len,
            x,
            x_from_out,
            x_from_tokens: false,
            y,
            ready: Vec::new(),
            keys: None,
        };
        self.specs.push(pass(Kernel::SoftcapArgmax, chunks, false, GridY::Out));
        self.specs.push(pass(Kernel::ArgmaxMerge, 0, true, GridY::One));
        Ok(())
    }

    /// The prompt's tail, from where the layers cut it.
    fn prompt_tail(&self, f: &Forward, st: PassState) -> Option<PromptTail> {
        let Acts { rope_buf, ple_bufs, .. } = f.acts;
        let t = &self.cfg.text;
        let (pd, nl) = (t.hidden_size_per_layer_input, t.num_hidden_layers);
        match st.tail_cut {
            Some((start, layer, mut rows)) => {
                debug_assert!(
                    matches!(self.specs[start].kernel, Kernel::Attention { .. } | Kernel::AttentionCoop { .. }),
                    "the tail starts at a chunk attention"
                );
                rows.push((rope_buf.clone(), 4 * f.acts.rope_stride as u64));
                if let Some((ple_all, ..)) = ple_bufs {
                    rows.push((ple_all.clone(), 4 * (nl * pd) as u64));
                }
                let bytes = rows.iter().map(|r| r.1).sum();
                Some(PromptTail {
                    start,
                    layer,
                    rows,
                    scratch: self.gpu.storage("prompt tail rows", bytes),
                    step: self.gpu.storage("prompt tail step", std::mem::size_of::<Step>() as u64),
                })
            }
            None => None,
        }
    }

    /// The recorded specs as dispatches, each with its bind group.
    fn bind_program(&mut self) -> Result<Vec<Dispatch>> {
        let param_buf = {
            use wgpu::util::DeviceExt;
            self.gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("kernel params"),
                contents: &self.params,
                usage: wgpu::BufferUsages::UNIFORM,
            })
        };
        // The chunk norms' group sums, one region per (norm, output) that a mat-mat reads.
        let norm_sums_buf = match self.norm_sums_len {
            0 => None,
            n => Some(self.act("chunk norms' group sums", n as usize)?),
        };
        let mut program = Vec::with_capacity(self.specs.len());
        let specs = std::mem::take(&mut self.specs);
        self.listing = self.list_program(&specs);
        for s in specs {
            let (pipeline, layout) = self.pipelines.get(&self.gpu.device, s.kernel)?.clone();
            let mut variant = |v: Option<(Kernel, u32, u32)>, retile: bool| -> Result<Option<Variant>> {
                let Some((k, x, tok)) = v else { return Ok(None) };
                let mut smaller = Vec::new();
                if retile {
                    for t in 2..tok {
                        let Some(kt) = k.with_tok(t) else { break };
                        smaller.push(self.pipelines.get(&self.gpu.device, kt)?.0.clone());
                    }
                }
                Ok(Some(Variant {
                    pipeline: self.pipelines.get(&self.gpu.device, k)?.0.clone(),
                    x,
                    tok,
                    label: k.label(),
                    smaller,
                }))
            };
            let single = variant(s.single, false)?;
            let verify = variant(s.verify, true)?;
            let entries: Vec<wgpu::BindGroupEntry> = s
                .res
                .iter()
                .enumerate()
                .map(|(i, r)| wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: match r {
                        Res::Buf(b) => b.as_entire_binding(),
                        Res::Params => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &param_buf,
                            offset: s.param_off,
                            size: std::num::NonZeroU64::new(s.param_len),
                        }),
                        Res::ParamsAt(offset, len) => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &param_buf,
                            offset: *offset,
                            size: std::num::NonZeroU64::new(*len),
                        }),
                        Res::Step => self.step_buf.as_entire_binding(),
                        Res::NormSums(region) => {
                            let buffer = norm_sums_buf.as_ref().expect("a region was asked for");
                            match region {
                                None => buffer.as_entire_binding(),
                                Some(i) => {
                                    let r = &self.sum_regions[*i];
                                    wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                        buffer,
                                        offset: 4 * r.off,
                                        size: std::num::NonZeroU64::new(4 * r.len),
                                    })
                                }
                            }
                        }
                    },
                })
                .collect();
            let label = s.kernel.label();
            let scope = self.gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
            let bind_group = self.gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&label),
                layout: &layout,
                entries: &entries,
            });
            if let Some(e) = pollster::block_on(scope.pop()) {
                return Err(Error::Gpu(format!("binding {label}: {e}")));
            }
            program.push(Dispatch {
                label: s.kernel.label(),
                only: s.only,
                pipeline,
                single,
                verify,
                bind_group,
                x: s.x,
                x_from_out: s.x_from_out,
                x_from_tokens: s.x_from_tokens,
                y: s.y,
                ready: s.ready,
                keys: s.keys,
            });
        }
        Ok(program)
    }

    /// One line per recorded dispatch: its step forms, kernels (label and a hash of the WGSL each
    /// compiles), grid rules, bindings (buffers numbered in order of first use, with their sizes;
    /// params as bytes) and readiness marks: what [`WgpuBackend::program_listing`] returns, so two
    /// builds can be compared dispatch by dispatch.
    // Buffers are hashed by identity (wgpu hashes the handle's address), never by contents.
    #[allow(clippy::mutable_key_type)]
    fn list_program(&self, specs: &[Spec]) -> Vec<String> {
        use std::fmt::Write;
        let mut ids: std::collections::HashMap<wgpu::Buffer, usize> = std::collections::HashMap::new();
        let mut buf = |b: &wgpu::Buffer| {
            let n = ids.len();
            format!("b{}:{}", *ids.entry(b.clone()).or_insert(n), b.size())
        };
        let kernel = |k: Kernel| format!("{}#{:016x}", k.label(), self.pipelines.source_hash(k));
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let form = |v: &Option<(Kernel, u32, u32)>, retile: bool| match v {
            None => "-".to_string(),
            Some((k, x, tok)) => {
                let smaller: Vec<String> =
                    if retile { (2..*tok).filter_map(|t| k.with_tok(t)).map(kernel).collect() } else { Vec::new() };
                format!("{} x={x} tok={tok} smaller=[{}]", kernel(*k), smaller.join(","))
            }
        };
        let only = |o: Only| match o {
            Only::Always => "always",
            Only::Single => "single",
            Only::Multi => "multi",
        };
        let mut lines = Vec::with_capacity(specs.len());
        for (i, s) in specs.iter().enumerate() {
            let mut line = format!(
                "{i} {} {} | single {} | verify {}",
                only(s.only),
                kernel(s.kernel),
                form(&s.single, false),
                form(&s.verify, true)
            );
            let x = if s.x_from_out {
                "out".to_string()
            } else if s.x_from_tokens {
                "tokens".to_string()
            } else {
                s.x.to_string()
            };
            let y = match s.y {
                GridY::One => "one".to_string(),
                GridY::Tokens => "tokens".to_string(),
                GridY::TokenTiles(k) => format!("tokens/{k}"),
                GridY::SplitTokenTiles(k, sp) => format!("tokens/{k}*{sp}"),
                GridY::Out => "out".to_string(),
                GridY::OutTiles(k) => format!("out/{k}"),
                GridY::Slots(k) => format!("slots{k}"),
                GridY::Fixed(k) => format!("fixed{k}"),
            };
            let _ = write!(line, " | grid {x} {y} |");
            for r in &s.res {
                let _ = match r {
                    Res::Buf(b) => write!(line, " {}", buf(b)),
                    Res::Params => {
                        write!(
                            line,
                            " p:{}",
                            hex(&self.params[s.param_off as usize..(s.param_off + s.param_len) as usize])
                        )
                    }
                    Res::ParamsAt(off, len) => {
                        write!(line, " p:{}", hex(&self.params[*off as usize..(off + len) as usize]))
                    }
                    Res::Step => write!(line, " step"),
                    Res::NormSums(None) => write!(line, " sums"),
                    Res::NormSums(Some(r)) => {
                        let r = &self.sum_regions[*r];
                        write!(line, " sums[{}+{}]", r.off, r.len)
                    }
                };
            }
            let ready: Vec<String> = s.ready.iter().map(&mut buf).collect();
            let keys =
                s.keys.map_or("-".to_string(), |k| format!("short={} window={} max={}", k.short, k.window, k.max));
            let _ = write!(line, " | ready [{}] | keys {keys}", ready.join(","));
            lines.push(line);
        }
        lines
    }

    /// The host side of a streamed installation's expert cache (none unless `streaming`).
    fn streaming_state(&mut self, w: &ModelWeights, acts: &Acts, n_slots: usize, streaming: bool) -> Option<Streaming> {
        let c = self.opts.max_chunk;
        let tk = self.cfg.text.top_k_experts;
        match (&w.expert_files, &acts.moe_bufs) {
            (Some(files), Some((_, _, idx, _, _, slot_idx, ..))) if streaming => Some(Streaming {
                streamer: Streamer::new(files.clone(), n_slots),
                slots: std::mem::take(&mut self.slot_layers),
                marks: std::mem::take(&mut self.marks),
                route_idx: idx.clone(),
                idx_read: self.gpu.staging("router idx readback", (4 * c * tk) as u64),
                slot_idx: slot_idx.clone(),
                top_k: tk,
            }),
            _ => None,
        }
    }

    /// The backend that runs the recorded program.
    #[allow(clippy::too_many_arguments)]
    fn into_backend(
        self,
        w: &Arc<ModelWeights>,
        kv: KvLayout,
        acts: Acts,
        program: Vec<Dispatch>,
        tail: Option<PromptTail>,
        streaming: Option<Streaming>,
        drafter: Option<DeviceDrafter>,
    ) -> WgpuBackend {
        let cfg = self.cfg;
        let t = &cfg.text;
        let vocab = t.vocab_size;
        let Acts { ids, rope_buf, rope_stride, best, logits, xf, kcache, vcache, logit_rows, .. } = acts;
        let commit_scratch = self.gpu.storage(
            "commit scratch",
            (VERIFY_MAX * kv.caches.iter().map(|c| c.slot_elems()).max().unwrap_or(1) * 4) as u64,
        );
        let best_read = self.gpu.staging("argmax readback", (4 * logit_rows) as u64);
        let chain_read = [self.gpu.staging("run-ahead argmax 0", 4), self.gpu.staging("run-ahead argmax 1", 4)];
        let logits_read = self.gpu.staging("logits readback", (4 * logit_rows * vocab) as u64);
        WgpuBackend {
            cfg: cfg.clone(),
            kv,
            opts: self.opts.clone(),
            program,
            step_buf: self.step_buf.clone(),
            ids_buf: ids,
            rope_buf,
            best_buf: best,
            logits_buf: logits,
            best_read,
            chain_read,
            encode_time: std::time::Duration::ZERO,
            encode_steps: 0,
            logits_read,
            logit_rows,
            max_groups: self.gpu.limits.max_compute_workgroups_per_dimension,
            inv_freq: [t.rope_sliding.inv_freq(), t.rope_full.inv_freq()],
            rope_stride,
            rope_host: Vec::new(),
            read_scratch: Vec::new(),
            profiler: None,
            skip: self.opts.skip.clone(),
            profile: Vec::new(),
            decode_bytes: self.weight_bytes - self.gather_only_bytes - self.expert_bytes + self.routed_decode_bytes,
            weight_bytes: self.weight_bytes + drafter.as_ref().map_or(0, |d| d.weight_bytes),
            state_bytes: self.state_bytes + drafter.as_ref().map_or(0, |d| d.state_bytes),
            drafter,
            draft_row: None,
            streaming,
            weights: w.clone(),
            kcache,
            vcache,
            final_hidden: xf.clone(),
            last_rows: 0,
            cached: 0,
            verifying: false,
            segmented: self.opts.tuning.submit_segments,
            staged: None,
            commit_scratch,
            tail,
            listing: self.listing,
            gpu: self.gpu,
        }
    }
}
