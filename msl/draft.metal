// draft: k steps of the Gemma 4 MTP drafter (`gemma4_assistant`) in ONE launch, reading the
// target's K/V in place — compiled after decode.metal, whose helpers (mat-vecs, norms, rope,
// attention, grid barrier) it uses, with the same buffers.
//
// Mirrors: `crate::spec::Drafter::step` / `draft_block` (the CPU reference: spec §3.1–3.4).
// Step j: x = W_pre [E_target[tok_j] · √Hb, h_j]; the drafter's layers (q only: every layer
// attends to the target's producer caches, the full layers to positions 0..p, the sliding ones
// to p − W − 1 .. p, all at query position p); final norm; h_{j+1} = W_post x̂; the head (tied
// drafter embedding, or the centroid-masked one: the top centroids' clusters of
// `token_ordering` scored, the rest never chosen); tok_{j+1} = argmax (first index on ties).
// All k steps share p and the target K/V: the drafter writes no cache.
//
// Buffers: as decode.metal. The drafter's program is a second header in the table, at
// table[H_DRAFT] (DH_* words; its layer records use decode.metal's L_* layout with the target's
// producer caches as K/V, its matrices the shared descriptor array); its weights are in arena A.
//   step: [0] token fed at step 0, [1] p, [2] k (≤ MAX_M − 1), rope cos|sin of p at H_ROPE_S /
//         H_ROPE_F (token 0's place), the target hidden row h_0 at DH_STEP_HIDDEN
//   out:  [0, k) the drafts (uint bits)
// Launch: as decode_step (all groups co-resident; the same grid).

enum : uint {
    DH_HIDDEN = 0, DH_BACKBONE = 1, DH_LAYERS = 2, DH_EPS = 3, DH_WINDOW = 4, DH_PRE = 5, DH_POST = 6,
    DH_EMBED = 7, DH_FINAL_NORM = 8, DH_CENTROIDS = 9, DH_ORDER = 10, DH_N_CENTROIDS = 11, DH_TOPK_C = 12,
    DH_LAYER_BASE = 13, DH_TARGET_EMBED = 14, DH_EMBED_SCALE = 15, DH_STEP_HIDDEN = 16,
    DA_X = 17, DA_XG = 18, DA_Q = 19, DA_ATT = 20, DA_O = 21, DA_GU = 22, DA_M = 23, DA_H = 24,
    DA_SCORES = 25, DA_BEST = 26, DA_TOK = 27,
    DH_WORDS = 32,
};
// Most centroids the masked head keeps (the host checks).
constant constexpr uint MAX_TOPK_C = 64;

// The pre-projection's input [E_target[tok] · √Hb, h]: the embedding read where it is used.
struct DraftIn {
    Mat e;
    device const uint* ea;
    uint tok;
    float scale;
    uint hb;
    coherent(device) device const float* h;
    float at(uint t, uint i) const { return i < hb ? mat_elem(e, ea, tok, i) * scale : h[i - hb]; }
};

kernel void draft_block(device const uint* table [[buffer(0)]],
                        device const uint* wa [[buffer(1)]],
                        device const uint* wb [[buffer(2)]],
                        coherent(device) device float* act [[buffer(3)]],
                        coherent(device) device float* kv [[buffer(4)]],
                        coherent(device) device atomic_uint* sync [[buffer(5)]],
                        device const uint* step [[buffer(6)]],
                        device float* out [[buffer(7)]],
                        uint tg [[threadgroup_position_in_grid]],
                        uint ngroups [[threadgroups_per_grid]],
                        uint lid [[thread_index_in_threadgroup]],
                        uint nthreads [[threads_per_threadgroup]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint nsg [[simdgroups_per_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
    threadgroup float red[32];
    threadgroup uint csel[64]; // the chosen centroids (MAX_TOPK_C)
    Ctx c;
    c.tg = tg; c.ngroups = ngroups; c.lid = lid; c.nthreads = nthreads; c.sg = sg; c.nsg = nsg; c.lane = lane;
    const uint w0 = c.warp(), nw = c.warps();
    uint phase = 0;
    coherent(device) device atomic_uint* arrivals = sync;
    coherent(device) device atomic_uint* stall = sync + 32;

    device const uint* D = table + table[H_DRAFT];
    const uint hd = D[DH_HIDDEN], hb = D[DH_BACKBONE];
    const float eps = as_type<float>(D[DH_EPS]);
    const uint p = step[1], k = min(step[2], MAX_M - 1u);
    const uint window = D[DH_WINDOW];
    coherent(device) device float* xg = act + D[DA_XG] + tg * hd; // this group's residual copy
    float rn[1];

    // h_0 from the step words into the first hidden buffer.
    if (tg == 0u) {
        for (uint i = lid; i < hb; i += nthreads) act[D[DA_H] + i] = as_type<float>(step[D[DH_STEP_HIDDEN] + i]);
    }
    grid_barrier(arrivals, ngroups, phase, lid, stall);

    for (uint j = 0; j < k; ++j) {
        uint tok = j == 0u ? step[0] : as_type<uint>(act[D[DA_TOK] + j - 1u]);
        coherent(device) device float* h_in = act + D[DA_H] + (j % 2u) * hb;
        coherent(device) device float* h_out = act + D[DA_H] + ((j + 1u) % 2u) * hb;

        // ---- x = W_pre [E_target[tok] · √Hb, h]
        {
            Mat te = mat_at(table, D[DH_TARGET_EMBED]);
            DraftIn din = {te, arena_of(te, wa, wb), tok, as_type<float>(D[DH_EMBED_SCALE]), hb, h_in};
            matvec(mat_at(table, D[DH_PRE]), wa, wb, din, 1u, act + D[DA_X], hd, 1.0f, w0, nw, lane);
        }
        grid_barrier(arrivals, ngroups, phase, lid, stall);
        for (uint i = lid; i < hd; i += nthreads) xg[i] = act[D[DA_X] + i];
        threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);

        for (uint li = 0; li < D[DH_LAYERS]; ++li) {
            device const uint* L = table + D[DH_LAYER_BASE] + li * L_WORDS;
            const uint d = L[L_HEAD_DIM], nh = L[L_HEADS], nkv = L[L_KV_HEADS];
            const uint kvd = nkv * d;
            // ---- q = rope(q_norm(W_q norm(x))) at p
            rn[0] = rms_scale(group_sumsq(xg, hd, c, red), hd, eps);
            matvec(mat_at(table, L[L_Q]), wa, wb, NormedRows{xg, hd, rn, wa, L[L_IN_NORM], 1.0f}, 1u, act + D[DA_Q],
                   nh * d, 1.0f, w0, nw, lane);
            grid_barrier(arrivals, ngroups, phase, lid, stall);
            uint cs = L[L_KIND] == 0u ? table[H_ROPE_S] : table[H_ROPE_F];
            for (uint h = w0; h < nh; h += nw) {
                coherent(device) device float* qh = act + D[DA_Q] + h * d;
                head_finish(qh, qh, wa, L[L_Q_NORM], true, step, cs, d, eps, lane);
            }
            grid_barrier(arrivals, ngroups, phase, lid, stall);
            // ---- attention over the target's committed positions before p
            {
                uint lo = L[L_KIND] == 0u ? (p > window + 1u ? p - window - 1u : 0u) : 0u;
                uint group = nh / nkv;
                for (uint h = w0; h < nh; h += nw) {
                    uint kvh = h / group;
                    attend_head(act + D[DA_Q] + h * d, kv + L[L_K_OFF] + kvh * d, kv + L[L_V_OFF] + kvh * d,
                                act + D[DA_ATT] + h * d, lo, p - 1u, L[L_SLOTS], kvd, d, lane);
                }
            }
            grid_barrier(arrivals, ngroups, phase, lid, stall);
            matvec(mat_at(table, L[L_O]), wa, wb, Rows{act + D[DA_ATT], 0u}, 1u, act + D[DA_O], hd, 1.0f, w0, nw, lane);
            grid_barrier(arrivals, ngroups, phase, lid, stall);
            // ---- x += norm(o); feed-forward
            group_residual(xg, act + D[DA_O], wa, L[L_POST_ATTN], hd, eps, c, red);
            rn[0] = rms_scale(group_sumsq(xg, hd, c, red), hd, eps);
            {
                NormedRows xff = {xg, hd, rn, wa, L[L_PRE_FF], 1.0f};
                Mat mg = mat_at(table, L[L_GATE]);
                Mat mu = mat_at(table, L[L_UP]);
                uint mw = L[L_MLP];
                for (uint r = 4u * w0; r < mw; r += 4u * nw) {
                    float4 g[1], u[1];
                    quad_dot(mg, arena_of(mg, wa, wb), r, xff, 1u, lane, g);
                    quad_dot(mu, arena_of(mu, wa, wb), r, xff, 1u, lane, u);
                    if (lane == 0u) {
                        for (uint q = 0; q < 4u && r + q < mw; ++q) act[D[DA_GU] + r + q] = gelu_tanh(g[0][q]) * u[0][q];
                    }
                }
            }
            grid_barrier(arrivals, ngroups, phase, lid, stall);
            matvec(mat_at(table, L[L_DOWN]), wa, wb, Rows{act + D[DA_GU], 0u}, 1u, act + D[DA_M], hd, 1.0f, w0, nw,
                   lane);
            grid_barrier(arrivals, ngroups, phase, lid, stall);
            group_residual(xg, act + D[DA_M], wa, L[L_POST_FF], hd, eps, c, red);
            float ls = as_type<float>(L[L_SCALAR]);
            for (uint i = lid; i < hd; i += nthreads) xg[i] *= ls;
            threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
        }

        // ---- x̂ = final_norm(x); h_{j+1} = W_post x̂; the head's scores (no softcap)
        rn[0] = rms_scale(group_sumsq(xg, hd, c, red), hd, eps);
        NormedRows xf = {xg, hd, rn, wa, D[DH_FINAL_NORM], 1.0f};
        matvec(mat_at(table, D[DH_POST]), wa, wb, xf, 1u, h_out, hb, 1.0f, w0, nw, lane);
        Mat e = mat_at(table, D[DH_EMBED]);
        device const uint* ea = arena_of(e, wa, wb);
        float best_v = -INFINITY;
        uint best_i = NONE;
        if (D[DH_CENTROIDS] == NONE) {
            for (uint r = 4u * w0; r < e.rows; r += 4u * nw) {
                float4 v[1];
                quad_dot(e, ea, r, xf, 1u, lane, v);
                for (uint q = 0; q < 4u && r + q < e.rows; ++q) {
                    if (v[0][q] > best_v) {
                        best_v = v[0][q];
                        best_i = r + q;
                    }
                }
            }
        } else {
            // Centroid-masked head: score the centroids, keep the top ones (ties: the lower
            // first), score only their clusters' tokens.
            Mat mc = mat_at(table, D[DH_CENTROIDS]);
            matvec(mc, wa, wb, xf, 1u, act + D[DA_SCORES], mc.rows, 1.0f, w0, nw, lane);
            grid_barrier(arrivals, ngroups, phase, lid, stall);
            uint nc = D[DH_N_CENTROIDS], topc = D[DH_TOPK_C];
            if (lid == 0u) {
                for (uint q = 0; q < topc; ++q) {
                    uint bi = NONE;
                    float bv = -INFINITY;
                    for (uint ci = 0; ci < nc; ++ci) {
                        bool taken = false;
                        for (uint z = 0; z < q; ++z) taken = taken || csel[z] == ci;
                        float v = act[D[DA_SCORES] + ci];
                        if (!taken && (bi == NONE || v > bv)) {
                            bi = ci;
                            bv = v;
                        }
                    }
                    csel[q] = bi;
                }
            }
            threadgroup_barrier(mem_flags::mem_threadgroup);
            uint per = e.rows / nc;
            for (uint cand = w0; cand < topc * per; cand += nw) {
                uint tokc = wa[D[DH_ORDER] + csel[cand / per] * per + cand % per];
                float4 v[1];
                quad_dot(e, ea, tokc, xf, 1u, lane, v);
                if (v[0][0] > best_v || (v[0][0] == best_v && tokc < best_i)) {
                    best_v = v[0][0];
                    best_i = tokc;
                }
            }
        }
        if (lane == 0u) {
            act[D[DA_BEST] + 2u * w0] = best_v;
            act[D[DA_BEST] + 2u * w0 + 1u] = as_type<float>(best_i);
        }
        grid_barrier(arrivals, ngroups, phase, lid, stall);
        if (tg == 0u && lid == 0u) {
            float bv = -INFINITY;
            uint bi = NONE;
            for (uint w = 0; w < nw; ++w) {
                float v = act[D[DA_BEST] + 2u * w];
                uint i = as_type<uint>(act[D[DA_BEST] + 2u * w + 1u]);
                if (i != NONE && (bi == NONE || v > bv || (v == bv && i < bi))) {
                    bv = v;
                    bi = i;
                }
            }
            uint t = bi == NONE ? 0u : bi;
            act[D[DA_TOK] + j] = as_type<float>(t);
            out[j] = as_type<float>(t);
        }
        grid_barrier(arrivals, ngroups, phase, lid, stall);
    }
}
