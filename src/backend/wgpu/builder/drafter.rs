//! The MTP drafter's program (`gemma4_assistant`, spec §3): one draft step recorded with the
//! same blocks as the target's decode step, by a second [`Builder`] over the drafter's config,
//! reading the target's K/V caches and token embedding in place.
//!
//! One step, for the token fed and a backbone-width hidden row (the target's, or the previous
//! step's projection):
//!   x = W_pre [E_target[tok] · √Hb, h]        embed into cat[0, Hb), the hidden copied to cat[Hb, 2Hb)
//!   the drafter's layers                        record_attention / record_ffn, q only: every layer is
//!                                               KV-shared with the target's producer caches
//!   x̂ = norm(x); h' = W_post x̂                 h' is the next step's hidden
//!   tok' = argmax head(x̂)                      the tied head (matvec + softcap_argmax with no cap),
//!                                               or the centroid head (draft_select/score/pick.wgsl)
//!
//! Masks. The drafter's query sits at position p (rope at p) and sees target positions before p:
//! all of them on full layers, the last W + 1 on sliding ones (`DraftKv::visible`). The decode
//! attention kernels see keys `[P + 1 − window, P]` for a query at P, so the drafter's step runs
//! them at `P = p − 1` (its step uniform's pos0) with a window of W + 1: exactly those positions,
//! with no kernel of their own. The rope table is the drafter's own, written for p.
//!
//! The host chains k steps in one command buffer (`WgpuBackend::record_drafts`): each step's
//! argmax is copied to the next step's id and to the drafts, its projection to the next input.

use super::*;
use crate::config::AssistantConfig;

/// The drafter's program and the buffers a round writes and reads.
pub(in crate::backend::wgpu) struct DeviceDrafter {
    pub program: Vec<Dispatch>,
    /// The drafter's step uniform: one token at pos0 = p − 1 (see the module notes).
    pub step_buf: wgpu::Buffer,
    /// The token fed (u32[1]); the embedding reads it.
    pub ids: wgpu::Buffer,
    pub rope_buf: wgpu::Buffer,
    pub rope_stride: usize,
    pub inv_freq: [Vec<f32>; 2],
    /// The pre-projection's input [E_target[tok] · √Hb, h], f32[2 · Hb].
    pub cat: wgpu::Buffer,
    /// The post-projection's output h', f32[Hb].
    pub hidden_out: wgpu::Buffer,
    /// The step's draft (u32[1]).
    pub best: wgpu::Buffer,
    /// The round's drafts, u32[VERIFY_MAX], and their readback.
    pub drafts: wgpu::Buffer,
    pub drafts_read: wgpu::Buffer,
    /// The target's hidden size (Hb).
    pub hb: usize,
    /// A round's prologue when the last round's acceptance is the GPU's (spec_accept.wgsl,
    /// spec_rows.wgsl): accept, commit every cache's accepted rows, the next hidden row and rope
    /// rows into both programs' inputs.
    pub accept: Vec<Dispatch>,
    /// The round state words (spec_params.wgsl) and both steps' words spec_accept writes.
    pub state: wgpu::Buffer,
    pub steps: wgpu::Buffer,
    /// Rope rows of positions near the rounds in flight: position q at row q % RING_ROWS.
    pub ring: wgpu::Buffer,
    /// Each round's drafts (VERIFY_MAX words) then the verify's argmax, read back one round
    /// behind the GPU: round r in buffer r % 2.
    pub round_read: [wgpu::Buffer; 2],
    pub weight_bytes: u64,
    pub state_bytes: u64,
    /// The program's listing ([`WgpuBackend::program_listing`]'s drafter part).
    pub listing: Vec<String>,
}

/// Rows of the rope ring the host keeps filled for the rounds in flight (a round started at q
/// reads rows up to q + 2 · VERIFY_MAX − 1 before the host next writes).
pub(in crate::backend::wgpu) const RING_ROWS: usize = 4 * VERIFY_MAX;

/// Checks that drafter `d` can run over target `target`'s caches as laid out in `kv`.
fn check(target: &Config, kv: &KvLayout, d: &Config, dw: &ModelWeights) -> Result<AssistantConfig> {
    let bad = |m: String| Err(Error::Invalid(format!("drafter: {m}")));
    let Some(a) = d.assistant.clone() else {
        return bad("not a gemma4_assistant model".into());
    };
    let Some(aw) = dw.assistant.as_ref() else {
        return bad("weights lack pre_projection/post_projection".into());
    };
    if a.backbone_hidden_size != target.text.hidden_size || d.text.vocab_size != target.text.vocab_size {
        return bad(format!(
            "backbone_hidden_size {} and vocab {} must be the target's ({} and {})",
            a.backbone_hidden_size, d.text.vocab_size, target.text.hidden_size, target.text.vocab_size
        ));
    }
    if d.layers.iter().any(|l| l.owns_kv()) || d.has_ple() || d.text.enable_moe_block {
        return bad("every layer must be KV-shared, with no per-layer inputs or experts".into());
    }
    for l in &d.layers {
        let Some(p) = target.producer(l.kind) else {
            return bad(format!("the target has no cache-owning {:?} layer to read", l.kind));
        };
        let cs = &kv.caches[kv.read_cache[p]];
        if l.head_dim != cs.head_dim || l.n_heads % cs.n_kv_heads != 0 {
            return bad(format!(
                "layer {} has {} heads × {}, the target's {:?} cache {} kv heads × {}",
                l.index, l.n_heads, l.head_dim, l.kind, cs.n_kv_heads, cs.head_dim
            ));
        }
        if l.kind == AttnKind::Sliding && d.text.sliding_window + 1 > cs.slots {
            return bad(format!(
                "its sliding window {} needs {} target positions, the target's ring holds {}",
                d.text.sliding_window,
                d.text.sliding_window + 1,
                cs.slots
            ));
        }
    }
    if a.use_ordered_embeddings {
        let (nc, k) = (a.num_centroids, a.centroid_intermediate_top_k);
        if aw.centroids.is_none() || aw.token_ordering.is_none() {
            return bad("use_ordered_embeddings without centroids and token_ordering".into());
        }
        // draft_select.wgsl's workgroup arrays; draft_score's grid.
        if nc == 0 || nc > 8192 || k == 0 || k > 64 || !d.text.vocab_size.is_multiple_of(nc) {
            return bad(format!(
                "{nc} centroids keeping {k}: the device head takes 1..=8192 centroids that divide the vocabulary, keeping 1..=64"
            ));
        }
        if k * (d.text.vocab_size / nc) > 65535 {
            return bad(format!(
                "{} tokens per draft to score: the device head scores at most 65535",
                k * d.text.vocab_size / nc
            ));
        }
    }
    Ok(a)
}

/// Records the drafter of `d` over the target program `t` has just recorded (`kv`, `acts`,
/// `weights`: the target's layout, buffers and matrices).
pub(in crate::backend::wgpu) fn record(
    t: &Builder,
    d: &DraftModel,
    kv: &KvLayout,
    acts: &Acts,
    weights: &GpuWeights,
) -> Result<DeviceDrafter> {
    let (dcfg, dw) = (&d.0, d.1.as_ref());
    let a = check(t.cfg, kv, dcfg, dw)?;
    let aw = dw.assistant.as_ref().expect("checked");
    // The config the blocks record from: a sliding window one wider (the module notes), and no
    // softcap (transformers' drafter head has none, whatever text_config says).
    // Its layers' kv heads are the target caches' they read: the reference drafter takes the
    // grouping from the target's K/V, whatever the drafter's config declares.
    let mut cfg = dcfg.clone();
    cfg.text.sliding_window += 1;
    cfg.text.final_logit_softcapping = None;
    for l in &mut cfg.layers {
        let p = t.cfg.producer(l.kind).expect("checked");
        l.n_kv_heads = kv.caches[kv.read_cache[p]].n_kv_heads;
    }
    let opts = WgpuOptions { max_chunk: 1, drafter: None, skip: Vec::new(), ..t.opts.clone() };
    let mut b = Builder::new(t.gpu.clone(), &cfg, opts);
    let (hb, ha, vocab) = (a.backbone_hidden_size, cfg.text.hidden_size, cfg.text.vocab_size);

    let norms = b.upload_norms(dw);
    let dweights = b.upload_weights(dw, 0, false)?;
    let pre = b.upload_matrix(&aw.pre_projection)?;
    let post = b.upload_matrix(&aw.post_projection)?;
    // The target's producer caches, as the drafter's caches 0 (sliding) and 1 (full).
    let kinds = [AttnKind::Sliding, AttnKind::Full];
    let src: Vec<usize> = kinds.iter().map(|&k| t.cfg.producer(k).map_or(usize::MAX, |p| kv.read_cache[p])).collect();
    let mut caches = Vec::new();
    let (mut kbufs, mut vbufs) = (Vec::new(), Vec::new());
    for &c in src.iter().filter(|&&c| c != usize::MAX) {
        caches.push(kv.caches[c]);
        kbufs.push(acts.kcache[c].clone());
        vbufs.push(acts.vcache[c].clone());
    }
    let index_of = |kind: AttnKind| {
        let c = src[kinds.iter().position(|&k| k == kind).expect("two kinds")];
        caches.iter().position(|cs| *cs == kv.caches[c]).expect("checked: the target has the producer")
    };
    let dkv = KvLayout {
        caches: caches.clone(),
        read_cache: cfg.layers.iter().map(|l| index_of(l.kind)).collect(),
        max_ctx: kv.max_ctx,
    };
    let dacts = b.alloc_acts(&dkv, &dweights, 0, false, Some((kbufs, vbufs)))?;
    let cat = b.act("drafter input [embedding, hidden]", 2 * hb)?;
    let hidden_out = b.act("drafter hidden out", hb)?;
    let tuning = &t.opts.tuning;
    let f = Forward {
        norms: &norms,
        weights: &dweights,
        acts: &dacts,
        kv: &dkv,
        eps: cfg.text.rms_norm_eps,
        fold_q_norm: tuning.fold_q_norm,
        attn_short: tuning.attn_short,
        moe_norm: false,
        moe_overlap: false,
        attn_coop: false,
        attn_sums: false,
        streaming: false,
        tail_layer: None,
    };

    // ---- input: the target's scaled embedding beside the hidden row, projected
    b.embed(&weights.embed, &dacts.ids, &cat, embed_scale(hb));
    b.matvec_single(&pre, &cat, 2 * hb, &dacts.xs[0], ha);

    // ---- layers
    let mut st = PassState { cur: 0, residual: None, tail_cut: None };
    for (li, (l, gl)) in cfg.layers.iter().zip(&dweights.layers).enumerate() {
        let layer = Layer { li, l, gl, ln: &norms.layers[li], lw: &dw.layers[li] };
        let post_attn = b.record_attention(&f, layer, &mut st)?;
        b.record_ffn(&f, layer, post_attn, &mut st)?;
    }

    // ---- head: x̂ = norm(x) (record_head's, with the tied head and its argmax when dense)
    let xf = &dacts.xf;
    if a.use_ordered_embeddings {
        b.norm(
            &dacts.xs[st.cur],
            &norms.buf,
            xf,
            NormParams { x_row_sel: 1, count_sel: 1, ..f.plain(ha, norms.final_norm, 0, 1.0) },
        );
        let centroids = b.upload_matrix(aw.centroids.as_ref().expect("checked"))?;
        let order = aw.token_ordering.as_ref().expect("checked");
        let order_buf = b.gpu.upload("drafter token ordering", bytemuck::cast_slice(order));
        b.weight_bytes += 4 * order.len() as u64;
        let (nc, top) = (a.num_centroids, a.centroid_intermediate_top_k);
        let per = vocab / nc;
        let scores = b.act("drafter centroid scores", nc)?;
        let sel = b.act("drafter selected tokens", top * per)?;
        let score = b.act("drafter selected logits", top * per)?;
        b.matvec_single(&centroids, xf, ha, &scores, nc);
        let base = DraftHeadParams {
            n_centroids: nc as u32,
            top_k: top as u32,
            per: per as u32,
            cols: ha as u32,
            ..Default::default()
        };
        let res = vec![Res::Buf(scores), Res::Buf(order_buf), Res::Buf(sel.clone()), Res::Params, Res::Step];
        b.spec(Kernel::DraftSelect, res, &base, 1, GridY::One);
        let embed = &dweights.embed;
        for part in &embed.parts {
            let p = DraftHeadParams { gs: embed.gs as u32, row0: part.row0 as u32, rows: part.rows as u32, ..base };
            let res = weight_res(part, &[&sel, xf, &score]);
            b.spec(Kernel::DraftScore(embed.format), res, &p, (top * per) as u32, GridY::One);
        }
        let res = vec![Res::Buf(score), Res::Buf(sel), Res::Buf(dacts.best.clone()), Res::Params, Res::Step];
        b.spec(Kernel::DraftPick, res, &base, 1, GridY::One);
    } else {
        b.record_head(&f, st.cur)?;
    }
    // h' = W_post x̂, after the head: it reads x̂ too, and nothing in this step reads h'.
    b.matvec_single(&post, xf, ha, &hidden_out, hb);

    let program = b.bind_program()?;
    let listing = std::mem::take(&mut b.listing);
    let drafts = b.gpu.storage("drafts", (4 * VERIFY_MAX) as u64);
    let drafts_read = b.gpu.staging("drafts readback", (4 * VERIFY_MAX) as u64);

    // ---- the round prologue after a round the GPU accepts (spec_accept.wgsl, spec_rows.wgsl)
    if dacts.rope_stride != acts.rope_stride {
        return Err(Error::Invalid(format!(
            "drafter: rope rows of {} values, the target's {} (head dims differ)",
            dacts.rope_stride, acts.rope_stride
        )));
    }
    let state = b.act("speculative round state", 8)?;
    let steps = b.act("speculative round steps", 16)?;
    let ring = b.act("rope ring", RING_ROWS * acts.rope_stride)?;
    let base = SpecParams { k: 0, ring: RING_ROWS as u32, ..Default::default() };
    let res = vec![
        Res::Buf(drafts.clone()),
        Res::Buf(acts.best.clone()),
        Res::Buf(state.clone()),
        Res::Buf(steps.clone()),
        Res::Buf(acts.ids.clone()),
        Res::Buf(dacts.ids.clone()),
        Res::Params,
        Res::Step,
    ];
    b.spec(Kernel::SpecAccept, res, &base, 1, GridY::One);
    let rows = |b: &mut Builder, src: &wgpu::Buffer, dst: &wgpu::Buffer, p: SpecParams| {
        let res = vec![Res::Buf(src.clone()), Res::Buf(dst.clone()), Res::Buf(state.clone()), Res::Params, Res::Step];
        let x = (p.rows * p.elems).div_ceil(256).clamp(1, 1024);
        b.spec(Kernel::SpecRows, res, &p, x, GridY::One);
    };
    for (c, cs) in kv.caches.iter().enumerate() {
        let p = SpecParams { elems: cs.slot_elems() as u32, rows: VERIFY_MAX as u32, slots: cs.slots as u32, ..base };
        for cache in [&acts.kcache[c], &acts.vcache[c]] {
            rows(&mut b, &t.dummy, cache, p);
        }
    }
    let p = SpecParams { elems: hb as u32, rows: 1, mode: 1, dst_off: hb as u32, ..base };
    rows(&mut b, &acts.xf, &cat, p);
    let p = SpecParams { elems: acts.rope_stride as u32, rows: VERIFY_MAX as u32, mode: 2, ..base };
    rows(&mut b, &ring, &acts.rope_buf, p);
    rows(&mut b, &ring, &dacts.rope_buf, SpecParams { rows: 1, ..p });
    let accept = b.bind_program()?;
    let read_len = (4 * 2 * VERIFY_MAX) as u64;
    let round_read = [b.gpu.staging("round readback 0", read_len), b.gpu.staging("round readback 1", read_len)];
    Ok(DeviceDrafter {
        program,
        step_buf: b.step_buf.clone(),
        ids: dacts.ids.clone(),
        rope_buf: dacts.rope_buf.clone(),
        rope_stride: dacts.rope_stride,
        inv_freq: [cfg.text.rope_sliding.inv_freq(), cfg.text.rope_full.inv_freq()],
        cat,
        hidden_out,
        best: dacts.best.clone(),
        drafts,
        drafts_read,
        hb,
        accept,
        state,
        steps,
        ring,
        round_read,
        weight_bytes: b.weight_bytes,
        state_bytes: b.state_bytes,
        listing,
    })
}
