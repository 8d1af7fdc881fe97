// decode: Gemma 4 forward steps of 1 to 8 tokens in ONE launch — a decode step (one token), a
// speculative verify (the last accepted token and its drafts) or a prefill piece: embedding,
// per-layer inputs, every layer (attention over the sliding ring and the full cache, KV sharing,
// K-as-V, GeGLU, MoE routing and experts, the per-layer-input gate), the final norm, the tied
// head with softcap, and the argmax of every token.
//
// One kernel for every token count: each mat-vec is an M-column product that reads a weight
// once for the step's M tokens, and a token's arithmetic (its accumulation order, its simd_sum)
// is the same whatever M is, so a verify row is bitwise the decode step at its position — the
// contract of `Backend::verify` — by construction.
//
// Mirrors: the CPU reference `crate::backend::cpu` forward (the math of `crate::reference`:
// rmsnorm, matmul, rope, attend, gelu_tanh, softcap, argmax; routing as its `moe_forward`) and
// the WGSL program of the wgpu backend (embed.wgsl, qmv*.wgsl, head_norm_rope.wgsl,
// attention*.wgsl, gelu_mul.wgsl, router_topk.wgsl, qmv_moe.wgsl, moe_combine.wgsl,
// softcap_argmax.wgsl + argmax_merge.wgsl), fused.
//
// Buffers (the host, `src/backend/metal/`, binds them in this order; wgpu's MSL passthrough
// numbers buffers in bind-group order, so these indices are also the Metal ones):
//   0 table  device const uint*  program table: header (H_*, A_*), layer records (L_*), matrix
//                                descriptors (D_*) — written once at load (`pack.rs` mirrors it)
//   1 wa     device const uint*  weight arena A: every dense matrix (raw checkpoint bytes: f32,
//                                bf16, f16, or MLX affine words + bf16 scales/biases) and every
//                                norm vector as f32; addressed in 4-byte words (16 GiB reach)
//   2 wb     device const uint*  weight arena B: routed experts (stacked matrices, or one
//                                installed blob per slot)
//   3 act    coherent(device) device float*  activations exchanged between threadgroups
//                                (A_* offsets, token t of a region at t × its stride), and each
//                                threadgroup's own copy of the residual stream (A_XG)
//   4 kv     coherent(device) device float*  KV caches: per owning layer K then V, f32
//                                [slot][kv_head][head_dim] — `crate::kv::KvLayout`, shared with
//                                every backend; sliding layers are rings of `slots` positions
//   5 sync   coherent(device) device atomic_uint*  word 0: grid-barrier arrivals (cleared by
//                                the host before each launch); word 32: stall code (0 = none)
//   6 step   device const uint*  [0] M tokens, [1] position of the first, [2] resume (0, or
//                                layer + 1: continue a split step at that layer's stage f), [3]
//                                stop (a layer: end after its stage e; NONE: run to the end),
//                                [4, 4 + MAX_M) the token ids, then per token the f32 rope cos|sin
//                                of the sliding and the full rope (H_ROPE_S / H_ROPE_F, stride
//                                H_ROPE_STRIDE), then (streamed experts) the slot of each expert
//                                at H_STEP_MAP
//   7 out    device float*       [0, MAX_M) argmax per token (uint bits), logits per token at
//                                H_OUT_LOGITS (stride vocab), post-final-norm hidden states at
//                                H_OUT_HIDDEN (stride hidden)
//
// Streamed experts (an installation with fewer slots than experts; one token per step): the
// host must read each MoE layer's routing before it can load the chosen experts, so it splits
// the step there: a launch stops after the layer's stage e (router scores written; the residual
// stays in A_XG), the host routes exactly as `route` does, fills the slots, writes the slot map
// and resumes at stage f. With every expert resident a step is one launch.
//
// Launch: G threadgroups × T threads (T a multiple of 32), ALL co-resident (the stages meet at
// grid barriers: `grid_sync.metal`); the default shape is one threadgroup per GPU core, the most
// Apple GPUs keep resident without an occupancy API. Work is split over the G·T/32 SIMD-groups
// of the grid ("warps"): a mat-vec gives each warp quads of whole rows (lanes stride the columns,
// one simd_sum of four sums per token), attention a (token, query head).
//
// Every threadgroup keeps its own copy of the residual stream of the step's tokens (A_XG, read
// and written only by that group) and updates it with identical arithmetic, so a norm over the
// whole hidden vector needs no grid barrier; a normed input is computed where a mat-vec reads it
// ((x · r) · w, the arithmetic a stored copy would hold). Per layer the grid meets at most 8 times:
//   a  q|k|v rows of norm(x)                                       → Q, K, V      | barrier
//   b  per (token, head): q_norm + rope; k_norm + rope, v_norm → cache slot     | barrier
//   c  per (token, query head): attention over the window / the cache → ATT    | barrier
//   d  o_proj rows                                                 → O        | barrier
//   e  x += norm(O); gate & up rows of norm(x), gelu(g)·u          → GU       | barrier
//   f  down rows                                                   → M        | barrier
//      [MoE: stage e also scores the router, f routes (each group alike) and runs the routed
//       experts' gate & up → EGU, a stage f2 their down rows → ED | barrier; g combines]
//   g  x += norm(M); [PLE] gate rows, gelu(g)·ple                  → PG       | barrier
//   h  [PLE] projection rows                                       → PY       | barrier
//   i  x += norm(PY); x *= layer_scalar   (every group, no barrier: next layer's stage a)
// Arithmetic: f32 throughout; each row is one lane-strided f32 sum folded by simd_sum (butterfly
// order), dequantisation `scale * q + bias` as `crate::quant::dequant_row`; a row's result does
// not depend on the grid, nor on the step's token count.

#include <metal_stdlib>
using namespace metal;

// ---- program table layout (mirrored by `src/backend/metal/pack.rs`, checked by its tests) ----
enum : uint {
    H_HIDDEN = 0, H_VOCAB = 1, H_LAYERS = 2, H_EPS = 3, H_SOFTCAP = 4, H_PLE_DIM = 5,
    H_EMBED = 6, H_EMBED_SCALE = 7, H_PLE_EMBED = 8, H_PLE_PROJ = 9, H_PLE_NORM = 10,
    H_FINAL_NORM = 11, H_LAYER_BASE = 12, H_DESC_BASE = 13, H_ROPE_S = 14, H_ROPE_F = 15,
    H_INV_SQRT_H = 16, H_SQRT_PLE = 17, H_OUT_LOGITS = 18, H_OUT_HIDDEN = 19,
    A_Q = 20, A_K = 21, A_V = 22, A_ATT = 23, A_O = 24, A_GU = 25, A_M = 26, A_PLE = 27,
    A_PG = 28, A_PY = 29, A_BEST = 30, A_SCORES = 31, A_EGU = 32, A_ED = 33, A_XG = 34, H_STEP_MAP = 35,
    H_S_Q = 36, H_S_KV = 37, H_S_GU = 38, H_ROPE_STRIDE = 39, H_S_SCORES = 40, H_S_EGU = 41, H_S_ED = 42,
    H_DRAFT = 43,
    H_WORDS = 48,
};
enum : uint {
    L_KIND = 0, L_HEAD_DIM = 1, L_HEADS = 2, L_KV_HEADS = 3, L_K_OFF = 4, L_V_OFF = 5,
    L_SLOTS = 6, L_WRITES_KV = 7, L_K_EQ_V = 8, L_MLP = 9, L_IN_NORM = 10, L_Q_NORM = 11,
    L_K_NORM = 12, L_POST_ATTN = 13, L_PRE_FF = 14, L_POST_FF = 15, L_SCALAR = 16, L_Q = 17,
    L_K = 18, L_V = 19, L_O = 20, L_GATE = 21, L_UP = 22, L_DOWN = 23, L_PLE_GATE = 24,
    L_PLE_PROJ = 25, L_PLE_POST = 26, L_WINDOW = 27, L_MOE = 28, L_ROUTER = 29, L_ROUTER_SCALE = 30,
    L_EXPERT_SCALE = 31, L_PRE_NORM_2 = 32, L_POST_NORM_1 = 33, L_POST_NORM_2 = 34, L_E_GATE = 35, L_E_UP = 36,
    L_E_DOWN = 37, L_E_GATE_STRIDE = 38, L_E_UP_BASE = 39, L_E_WIDTH = 40, L_TOPK = 41, L_EXPERTS = 42,
    L_E_DOWN_STRIDE = 43, L_E_SLOT_WORDS = 44, L_E_SLOT_MAP = 45,
    L_WORDS = 48,
};
enum : uint { D_FMT = 0, D_ROWS = 1, D_COLS = 2, D_W = 3, D_S = 4, D_B = 5, D_GROUP = 6, D_ARENA = 7, D_WORDS = 8 };
// D_FMT values: 4 and 8 are MLX affine bits; the float formats have their own codes.
enum : uint { FMT_F32 = 32, FMT_BF16 = 16, FMT_F16 = 17, FMT_Q4 = 4, FMT_Q8 = 8 };
constant constexpr uint NONE = 0xffffffffu;
// Most tokens in one step (decode 1; verify: the last accepted token and up to 7 drafts).
constant constexpr uint MAX_M = 8;
// Most head elements a lane holds in registers (head_dim ≤ 512).
constant constexpr uint MAX_PER_LANE = 16;
// Most routed experts per token, and most experts a router ranks (the host checks both).
constant constexpr uint MAX_TOPK = 16;
constant constexpr uint MAX_EXPERTS = 256;

// ---- launch coordinates ----
struct Ctx {
    uint tg, ngroups, lid, nthreads, sg, nsg, lane;
    uint warp() const { return tg * nsg + sg; }
    uint warps() const { return ngroups * nsg; }
};

// ---- number formats ----
inline float bf16_lo(uint w) { return as_type<float>(w << 16); }
inline float bf16_hi(uint w) { return as_type<float>(w & 0xffff0000u); }
// Element `i` of a bf16 array starting at word `base` (element 0 in the low half of a word).
inline float bf16_at(device const uint* a, uint base, uint i) {
    uint w = a[base + (i >> 1)];
    return (i & 1u) ? bf16_hi(w) : bf16_lo(w);
}
// IEEE half bits to float, exactly (no `half` type: the arithmetic stays in f32 everywhere).
inline float f16_bits(uint h) {
    uint s = (h & 0x8000u) << 16;
    uint e = (h >> 10) & 0x1fu;
    uint m = h & 0x3ffu;
    if (e == 0u) {
        float v = float(m) * 5.9604644775390625e-8f; // m · 2^-24
        return s != 0u ? -v : v;
    }
    if (e == 31u) return as_type<float>(s | 0x7f800000u | (m << 13));
    return as_type<float>(s | ((e + 112u) << 23) | (m << 13));
}
inline float f16_at(device const uint* a, uint base, uint i) {
    uint w = a[base + (i >> 1)];
    return f16_bits((i & 1u) ? (w >> 16) : (w & 0xffffu));
}

// ---- matrices ----
struct Mat { uint fmt, rows, cols, w, s, b, group, arena; };

inline Mat mat_at(device const uint* table, uint idx) {
    device const uint* d = table + table[H_DESC_BASE] + idx * D_WORDS;
    Mat m;
    m.fmt = d[D_FMT]; m.rows = d[D_ROWS]; m.cols = d[D_COLS]; m.w = d[D_W];
    m.s = d[D_S]; m.b = d[D_B]; m.group = d[D_GROUP]; m.arena = d[D_ARENA];
    return m;
}

inline device const uint* arena_of(Mat m, device const uint* wa, device const uint* wb) {
    return m.arena == 0u ? wa : wb;
}

// One weight W[r, c] as f32, dequantised as `crate::quant::dequant_row` does.
inline float mat_elem(Mat m, device const uint* a, uint r, uint c) {
    if (m.fmt == FMT_F32) return as_type<float>(a[m.w + r * m.cols + c]);
    if (m.fmt == FMT_BF16) return bf16_at(a, m.w, r * m.cols + c);
    if (m.fmt == FMT_F16) return f16_at(a, m.w, r * m.cols + c);
    uint vpw = 32u / m.fmt;
    uint word = a[m.w + r * (m.cols / vpw) + c / vpw];
    float q = float((word >> (m.fmt * (c % vpw))) & ((1u << m.fmt) - 1u));
    uint g = r * (m.cols / m.group) + c / m.group;
    return bf16_at(a, m.s, g) * q + bf16_at(a, m.b, g);
}

// ---- what a mat-vec reads as x: token t's element i ----
// A plain row per token (activations another stage wrote).
struct Rows {
    coherent(device) device const float* p;
    uint stride;
    float at(uint t, uint i) const { return p[t * stride + i]; }
};

// norm(x_t)[i] · w[i] · post, computed where it is read: the normed inputs of the mat-vecs have
// no room of their own, and this is the arithmetic a stored copy would hold ((x · r) · w, then
// · post, which is exact for post = 1). `r` holds each token's rms scale.
struct NormedRows {
    coherent(device) device const float* p;
    uint stride;
    thread const float* r;
    device const uint* wa;
    uint w_off;
    float post;
    float at(uint t, uint i) const { return p[t * stride + i] * r[t] * as_type<float>(wa[w_off + i]) * post; }
};

// Σ_c W[r, c] · x_t[c] for the four rows r0 … r0+3 (rows past the end repeat the last one;
// callers drop them) and the tokens t < nt, by one SIMD-group: lane l takes the storage words
// l, l+32, … of each row in order, dequantises each weight once for every token, then one
// simd_sum of four sums per token. Token t's sums are the same whatever nt is (its own
// accumulators, the same order), which makes a verify row bitwise a decode step.
template <typename XS>
inline void quad_dot(Mat m, device const uint* a, uint r0, XS xs, uint nt, uint lane, thread float4* out) {
    uint rr[4];
    float acc[MAX_M][4];
    for (uint j = 0; j < 4u; ++j) rr[j] = min(r0 + j, m.rows - 1u);
    for (uint t = 0; t < MAX_M; ++t) {
        for (uint j = 0; j < 4u; ++j) acc[t][j] = 0.0f;
    }
    if (m.fmt == FMT_BF16 || m.fmt == FMT_F16) {
        uint hc = m.cols >> 1;
        for (uint i = lane; i < hc; i += 32u) {
            float x0[MAX_M], x1[MAX_M];
            for (uint t = 0; t < nt; ++t) {
                x0[t] = xs.at(t, 2u * i);
                x1[t] = xs.at(t, 2u * i + 1u);
            }
            for (uint j = 0; j < 4u; ++j) {
                uint w = a[m.w + rr[j] * hc + i];
                float lo = m.fmt == FMT_BF16 ? bf16_lo(w) : f16_bits(w & 0xffffu);
                float hi = m.fmt == FMT_BF16 ? bf16_hi(w) : f16_bits(w >> 16);
                for (uint t = 0; t < nt; ++t) {
                    acc[t][j] += lo * x0[t];
                    acc[t][j] += hi * x1[t];
                }
            }
        }
    } else if (m.fmt == FMT_F32) {
        for (uint i = lane; i < m.cols; i += 32u) {
            float xv[MAX_M];
            for (uint t = 0; t < nt; ++t) xv[t] = xs.at(t, i);
            for (uint j = 0; j < 4u; ++j) {
                float w = as_type<float>(a[m.w + rr[j] * m.cols + i]);
                for (uint t = 0; t < nt; ++t) acc[t][j] += w * xv[t];
            }
        }
    } else {
        uint bits = m.fmt;
        uint vpw = 32u / bits;
        uint wpr = m.cols / vpw;
        uint gpr = m.cols / m.group;
        uint mask = (1u << bits) - 1u;
        for (uint i = lane; i < wpr; i += 32u) {
            uint c0 = i * vpw;
            float xv[MAX_M][8];
            for (uint t = 0; t < nt; ++t) {
                for (uint k = 0; k < vpw; ++k) xv[t][k] = xs.at(t, c0 + k);
            }
            for (uint j = 0; j < 4u; ++j) {
                uint word = a[m.w + rr[j] * wpr + i];
                uint g = rr[j] * gpr + c0 / m.group;
                float s = bf16_at(a, m.s, g);
                float b = bf16_at(a, m.b, g);
                for (uint k = 0; k < vpw; ++k) {
                    float w = s * float((word >> (bits * k)) & mask) + b;
                    for (uint t = 0; t < nt; ++t) acc[t][j] += w * xv[t][k];
                }
            }
        }
    }
    for (uint t = 0; t < nt; ++t) out[t] = simd_sum(float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]));
}

// y_t[r] = (W x_t)[r] · scale for every row and token, quads of rows spread over the grid's
// SIMD-groups; lane 0 stores (token t's row at y + t · y_stride).
template <typename XS>
inline void matvec(Mat m, device const uint* wa, device const uint* wb, XS xs, uint nt,
                   coherent(device) device float* y, uint y_stride, float scale, uint w0, uint nw, uint lane) {
    device const uint* a = arena_of(m, wa, wb);
    for (uint r = 4u * w0; r < m.rows; r += 4u * nw) {
        float4 v[MAX_M];
        quad_dot(m, a, r, xs, nt, lane, v);
        if (lane == 0u) {
            for (uint t = 0; t < nt; ++t) {
                for (uint j = 0; j < 4u && r + j < m.rows; ++j) y[t * y_stride + r + j] = v[t][j] * scale;
            }
        }
    }
}

// ---- threadgroup-wide reductions ----
// Σ v[i]² over n values, the same value in every thread (fixed order: thread-strided partial
// sums, simd_sum, then the SIMD-groups' sums in index order). `v` is a pointer or a row view.
template <typename V>
inline float group_sumsq(V v, uint n, Ctx c, threadgroup float* red) {
    float s = 0.0f;
    for (uint i = c.lid; i < n; i += c.nthreads) s += v[i] * v[i];
    s = simd_sum(s);
    if (c.lane == 0u) red[c.sg] = s;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float t = 0.0f;
    for (uint i = 0; i < c.nsg; ++i) t += red[i];
    threadgroup_barrier(mem_flags::mem_threadgroup); // `red` is reused by the next reduction
    return t;
}

inline float rms_scale(float sumsq, uint n, float eps) {
    return precise::rsqrt(sumsq / float(n) + eps);
}

inline float gelu_tanh(float x) {
    const float c = 0.7978845608028654f; // √(2/π)
    return 0.5f * x * (1.0f + precise::tanh(c * (x + 0.044715f * x * x * x)));
}

// x += norm(v) · w for one token's residual x (this group's copy), v a row another stage wrote.
inline void group_residual(coherent(device) device float* x, coherent(device) device const float* v,
                           device const uint* wa, uint w_off, uint n, float eps, Ctx c, threadgroup float* red) {
    float r = rms_scale(group_sumsq(v, n, c, red), n, eps);
    for (uint i = c.lid; i < n; i += c.nthreads) x[i] += v[i] * r * as_type<float>(wa[w_off + i]);
    threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
}

// ---- MoE: routing and the combined residual ----
// Σ_k w_k · y_k[i] over one token's routed experts, in routing order (as the reference sums them).
struct RoutedSum {
    coherent(device) device const float* ed;
    threadgroup const float* w;
    uint k, h;
    float operator[](uint i) const {
        float v = 0.0f;
        for (uint j = 0; j < k; ++j) v += w[j] * ed[j * h + i];
        return v;
    }
};

// norm_1(dense)[i] + norm_2(routed)[i]: a MoE layer's feed-forward output before post_ff_norm.
struct MoeOut {
    coherent(device) device const float* m;
    float r1;
    device const uint* wa;
    uint pn1;
    RoutedSum rs;
    float r2;
    uint pn2;
    float operator[](uint i) const {
        return m[i] * r1 * as_type<float>(wa[pn1 + i]) + rs[i] * r2 * as_type<float>(wa[pn2 + i]);
    }
};

// Where expert e's weights are: stacked checkpoint matrices (rows e · stride on), or an
// installation's blobs (slot s's copy `s · slot_words` words on; the slot from the host's map
// when experts stream, the expert itself when every one is resident).
inline uint expert_slot(device const uint* L, device const uint* step, device const uint* table, uint e) {
    return L[L_E_SLOT_MAP] != 0u ? step[table[H_STEP_MAP] + e] : e;
}
inline Mat at_slot(Mat m, uint slot, uint slot_words) {
    m.w += slot * slot_words;
    m.s += slot * slot_words;
    m.b += slot * slot_words;
    return m;
}

// Top-k of one token's router scores (ties: the lower expert first), softmax weights over the
// chosen ones renormalised, × per_expert_scale: `sel`/`selw` in threadgroup memory. One thread of
// each group ranks (k · E comparisons); every group computes the same choice from the same
// scores, and the host's `route` (streamed experts) the same comparisons.
inline void route(coherent(device) device const float* scores, uint n_experts, uint k, device const uint* wa,
                  uint scale_off, threadgroup uint* sel, threadgroup float* selw) {
    float m = -INFINITY;
    for (uint e = 0; e < n_experts; ++e) m = max(m, scores[e]);
    uint taken[MAX_EXPERTS / 32];
    for (uint i = 0; i < MAX_EXPERTS / 32; ++i) taken[i] = 0u;
    float p[MAX_TOPK];
    float z = 0.0f;
    for (uint j = 0; j < k; ++j) {
        uint best = 0;
        float bv = -INFINITY;
        bool found = false;
        for (uint e = 0; e < n_experts; ++e) {
            bool free = (taken[e / 32u] & (1u << (e % 32u))) == 0u;
            if (free && (!found || scores[e] > bv)) {
                best = e;
                bv = scores[e];
                found = true;
            }
        }
        taken[best / 32u] |= 1u << (best % 32u);
        sel[j] = best;
        p[j] = precise::exp(bv - m);
        z += p[j];
    }
    for (uint j = 0; j < k; ++j) selw[j] = p[j] / z * as_type<float>(wa[scale_off + sel[j]]);
}

// ---- per-head q/k/v finishing: norm, rope, cache write ----
// One SIMD-group per head vector of length d (lane l holds elements l + 32j, j < ⌈d/32⌉). `cs`
// holds the rope's d/2 cos then d/2 sin values of this position. The rope pairs element i with
// i ± d/2, which another lane may hold, so the normed vector goes through `dst` first: write,
// SIMD-group barrier, read the partners, barrier, write the rotated values.
inline void head_finish(coherent(device) device float* src, coherent(device) device float* dst, device const uint* wa,
                        uint w_off, bool rope, device const uint* step, uint cs, uint d, float eps, uint lane) {
    uint per = (d + 31u) / 32u;
    float v[MAX_PER_LANE];
    float ss = 0.0f;
    for (uint j = 0; j < per; ++j) {
        uint i = lane + 32u * j;
        v[j] = i < d ? src[i] : 0.0f;
        ss += v[j] * v[j];
    }
    float r = rms_scale(simd_sum(ss), d, eps);
    for (uint j = 0; j < per; ++j) {
        uint i = lane + 32u * j;
        v[j] = v[j] * r;
        if (w_off != NONE && i < d) v[j] = v[j] * as_type<float>(wa[w_off + i]);
    }
    if (rope) {
        uint hd = d / 2u;
        for (uint j = 0; j < per; ++j) {
            uint i = lane + 32u * j;
            if (i < d) dst[i] = v[j];
        }
        simdgroup_barrier(mem_flags::mem_device);
        float p[MAX_PER_LANE];
        for (uint j = 0; j < per; ++j) {
            uint i = lane + 32u * j;
            p[j] = i < d ? dst[i < hd ? i + hd : i - hd] : 0.0f;
        }
        simdgroup_barrier(mem_flags::mem_device);
        for (uint j = 0; j < per; ++j) {
            uint i = lane + 32u * j;
            if (i >= d) continue;
            uint f = i < hd ? i : i - hd;
            float cv = as_type<float>(step[cs + f]);
            float sv = as_type<float>(step[cs + hd + f]);
            v[j] = i < hd ? v[j] * cv - p[j] * sv : v[j] * cv + p[j] * sv;
        }
    }
    for (uint j = 0; j < per; ++j) {
        uint i = lane + 32u * j;
        if (i < d) dst[i] = v[j];
    }
}

// ---- attention of one query head (online softmax, scale 1, f32) ----
inline void attend_head(coherent(device) device const float* q, coherent(device) device const float* kc,
                        coherent(device) device const float* vc, coherent(device) device float* out, uint lo, uint pos,
                        uint slots, uint stride, uint d, uint lane) {
    uint per = (d + 31u) / 32u;
    float qv[MAX_PER_LANE], acc[MAX_PER_LANE];
    for (uint j = 0; j < per; ++j) {
        uint i = lane + 32u * j;
        qv[j] = i < d ? q[i] : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (uint p = lo; p <= pos; ++p) {
        uint row = (p % slots) * stride;
        float s = 0.0f;
        for (uint j = 0; j < per; ++j) {
            uint i = lane + 32u * j;
            if (i < d) s += qv[j] * kc[row + i];
        }
        s = simd_sum(s);
        float mn = max(m, s);
        float corr = precise::exp(m - mn);
        float e = precise::exp(s - mn);
        l = l * corr + e;
        for (uint j = 0; j < per; ++j) {
            uint i = lane + 32u * j;
            if (i < d) acc[j] = acc[j] * corr + e * vc[row + i];
        }
        m = mn;
    }
    for (uint j = 0; j < per; ++j) {
        uint i = lane + 32u * j;
        if (i < d) out[i] = acc[j] / l;
    }
}

// ---- the kernel ----
kernel void decode_step(device const uint* table [[buffer(0)]],
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
    threadgroup uint sel[128];   // MoE: each token's routed experts (MAX_M × MAX_TOPK)
    threadgroup float selw[128]; // and their weights
    Ctx c;
    c.tg = tg; c.ngroups = ngroups; c.lid = lid; c.nthreads = nthreads; c.sg = sg; c.nsg = nsg; c.lane = lane;
    const uint w0 = c.warp(), nw = c.warps();
    uint phase = 0;
    coherent(device) device atomic_uint* arrivals = sync;
    coherent(device) device atomic_uint* stall = sync + 32;

    const uint H = table[H_HIDDEN];
    const float eps = as_type<float>(table[H_EPS]);
    const uint nt = min(step[0], MAX_M);
    const uint pos0 = step[1];
    const uint resume = step[2] == 0u ? NONE : step[2] - 1u;
    const uint stop = step[3];
    const uint pd = table[H_PLE_DIM];
    const uint n_layers = table[H_LAYERS];
    const uint lpd = n_layers * pd;
    const uint sq = table[H_S_Q], skv = table[H_S_KV];
    // This group's copy of the step's residual stream: token t at xg + t · H.
    coherent(device) device float* xg = act + table[A_XG] + tg * MAX_M * H;
    float rn[MAX_M]; // per token: the rms scale of x at the current norm

    if (resume == NONE) {
        // ---- embedding: x_t = E[token_t] · √H (every group its own copy; no barrier needed)
        Mat e = mat_at(table, table[H_EMBED]);
        device const uint* ea = arena_of(e, wa, wb);
        float scale = as_type<float>(table[H_EMBED_SCALE]);
        for (uint t = 0; t < nt; ++t) {
            for (uint i = lid; i < H; i += nthreads) xg[t * H + i] = mat_elem(e, ea, step[4 + t], i) * scale;
        }
        threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);

        // ---- per-layer inputs: ple = (norm(W_plmp · x · H^-½) + E_ple[token] · √P) · 2^-½
        if (pd != 0u) {
            matvec(mat_at(table, table[H_PLE_PROJ]), wa, wb, Rows{xg, H}, nt, act + table[A_PLE], lpd,
                   as_type<float>(table[H_INV_SQRT_H]), w0, nw, lane);
            grid_barrier(arrivals, ngroups, phase, lid, stall);
            Mat pe = mat_at(table, table[H_PLE_EMBED]);
            device const uint* pea = arena_of(pe, wa, wb);
            float ts = as_type<float>(table[H_SQRT_PLE]);
            for (uint task = w0; task < nt * n_layers; task += nw) {
                uint t = task / n_layers, li = task % n_layers;
                coherent(device) device float* seg = act + table[A_PLE] + t * lpd + li * pd;
                float ss = 0.0f;
                for (uint i = lane; i < pd; i += 32u) ss += seg[i] * seg[i];
                float r = rms_scale(simd_sum(ss), pd, eps);
                for (uint i = lane; i < pd; i += 32u) {
                    float nv = seg[i] * r * as_type<float>(wa[table[H_PLE_NORM] + i]);
                    seg[i] = (nv + mat_elem(pe, pea, step[4 + t], li * pd + i) * ts) * 0.70710678118654752f;
                }
            }
            // No barrier here: layer 0 first reads these values in its stage g, several barriers on.
        }
    }

    for (uint li = resume == NONE ? 0u : resume; li < n_layers; ++li) {
        device const uint* L = table + table[H_LAYER_BASE] + li * L_WORDS;
        const uint d = L[L_HEAD_DIM], nh = L[L_HEADS], nkv = L[L_KV_HEADS];
        const bool writes = L[L_WRITES_KV] != 0u;
        const uint qd = nh * d, kvd = nkv * d;
        const bool resumed = li == resume;

        if (!resumed) {
            // ---- a: q | k | v rows of norm(x) · w_in
            for (uint t = 0; t < nt; ++t) rn[t] = rms_scale(group_sumsq(xg + t * H, H, c, red), H, eps);
            NormedRows xin = {xg, H, rn, wa, L[L_IN_NORM], 1.0f};
            matvec(mat_at(table, L[L_Q]), wa, wb, xin, nt, act + table[A_Q], sq, 1.0f, w0, nw, lane);
            if (writes) {
                matvec(mat_at(table, L[L_K]), wa, wb, xin, nt, act + table[A_K], skv, 1.0f, w0, nw, lane);
                if (L[L_K_EQ_V] == 0u) {
                    matvec(mat_at(table, L[L_V]), wa, wb, xin, nt, act + table[A_V], skv, 1.0f, w0, nw, lane);
                }
            }
            grid_barrier(arrivals, ngroups, phase, lid, stall);

            // ---- b: q_norm + rope per query head; k_norm + rope and v_norm into the cache slot
            {
                uint cs0 = L[L_KIND] == 0u ? table[H_ROPE_S] : table[H_ROPE_F];
                uint per_tok = nh + (writes ? 2u * nkv : 0u);
                for (uint task = w0; task < nt * per_tok; task += nw) {
                    uint t = task / per_tok, u = task % per_tok;
                    uint cs = cs0 + t * table[H_ROPE_STRIDE];
                    uint slot = (pos0 + t) % L[L_SLOTS];
                    if (u < nh) {
                        coherent(device) device float* qh = act + table[A_Q] + t * sq + u * d;
                        head_finish(qh, qh, wa, L[L_Q_NORM], true, step, cs, d, eps, lane);
                    } else if (u < nh + nkv) {
                        uint h = u - nh;
                        head_finish(act + table[A_K] + t * skv + h * d, kv + L[L_K_OFF] + slot * kvd + h * d, wa,
                                    L[L_K_NORM], true, step, cs, d, eps, lane);
                    } else {
                        uint h = u - nh - nkv;
                        // attention_k_eq_v: V is the raw K projection (before k_norm and rope).
                        uint src = L[L_K_EQ_V] != 0u ? table[A_K] : table[A_V];
                        head_finish(act + src + t * skv + h * d, kv + L[L_V_OFF] + slot * kvd + h * d, wa, NONE,
                                    false, step, cs, d, eps, lane);
                    }
                }
            }
            grid_barrier(arrivals, ngroups, phase, lid, stall);

            // ---- c: attention, one (token, query head) per SIMD-group; token t sees positions
            // up to its own, the step's earlier tokens included (their K/V were written in b)
            {
                uint group = nh / nkv;
                for (uint task = w0; task < nt * nh; task += nw) {
                    uint t = task / nh, h = task % nh;
                    uint pos = pos0 + t;
                    uint lo = L[L_KIND] == 0u ? (pos + 1u > L[L_WINDOW] ? pos + 1u - L[L_WINDOW] : 0u) : 0u;
                    uint kvh = h / group;
                    attend_head(act + table[A_Q] + t * sq + h * d, kv + L[L_K_OFF] + kvh * d, kv + L[L_V_OFF] + kvh * d,
                                act + table[A_ATT] + t * sq + h * d, lo, pos, L[L_SLOTS], kvd, d, lane);
                }
            }
            grid_barrier(arrivals, ngroups, phase, lid, stall);

            // ---- d: o_proj
            matvec(mat_at(table, L[L_O]), wa, wb, Rows{act + table[A_ATT], sq}, nt, act + table[A_O], H, 1.0f, w0, nw,
                   lane);
            grid_barrier(arrivals, ngroups, phase, lid, stall);

            // ---- e: x += norm(o); x̂ = norm(x); gelu(gate x̂) · (up x̂) [MoE: and the router's scores]
            for (uint t = 0; t < nt; ++t) {
                group_residual(xg + t * H, act + table[A_O] + t * H, wa, L[L_POST_ATTN], H, eps, c, red);
            }
        }
        const bool moe = L[L_MOE] != 0u;
        // The feed-forward input's rms scale; MoE layers also route on, and feed their experts,
        // this normed residual (with their own weights).
        for (uint t = 0; t < nt; ++t) rn[t] = rms_scale(group_sumsq(xg + t * H, H, c, red), H, eps);
        if (!resumed) {
            uint mw = L[L_MLP];
            NormedRows xff = {xg, H, rn, wa, L[L_PRE_FF], 1.0f};
            Mat mg = mat_at(table, L[L_GATE]);
            Mat mu = mat_at(table, L[L_UP]);
            device const uint* ga = arena_of(mg, wa, wb);
            device const uint* ua = arena_of(mu, wa, wb);
            uint nd = (mw + 3u) / 4u;
            uint nr = moe ? (L[L_EXPERTS] + 3u) / 4u : 0u;
            for (uint task = w0; task < nd + nr; task += nw) {
                float4 g[MAX_M], u[MAX_M];
                if (task < nd) {
                    uint r = 4u * task;
                    quad_dot(mg, ga, r, xff, nt, lane, g);
                    quad_dot(mu, ua, r, xff, nt, lane, u);
                    if (lane == 0u) {
                        for (uint t = 0; t < nt; ++t) {
                            for (uint j = 0; j < 4u && r + j < mw; ++j) {
                                act[table[A_GU] + t * table[H_S_GU] + r + j] = gelu_tanh(g[t][j]) * u[t][j];
                            }
                        }
                    }
                } else {
                    // Router: scores = W_r (norm(x) · scale · H^-½).
                    uint r = 4u * (task - nd);
                    Mat mr = mat_at(table, L[L_ROUTER]);
                    NormedRows rin = {xg, H, rn, wa, L[L_ROUTER_SCALE], as_type<float>(table[H_INV_SQRT_H])};
                    quad_dot(mr, arena_of(mr, wa, wb), r, rin, nt, lane, g);
                    if (lane == 0u) {
                        for (uint t = 0; t < nt; ++t) {
                            for (uint j = 0; j < 4u && r + j < mr.rows; ++j) {
                                act[table[A_SCORES] + t * table[H_S_SCORES] + r + j] = g[t][j];
                            }
                        }
                    }
                }
            }
            grid_barrier(arrivals, ngroups, phase, lid, stall);
            // A split step: the host reads this layer's routing and loads its experts, then
            // resumes at stage f (the residual stays in this group's A_XG).
            if (li == stop) return;
        }

        // ---- f: down [MoE: route; the routed experts' gate & up, gelu(g)·u]
        const uint topk = moe ? L[L_TOPK] : 0u, ew = L[L_E_WIDTH];
        if (moe) {
            if (lid == 0u) {
                for (uint t = 0; t < nt; ++t) {
                    route(act + table[A_SCORES] + t * table[H_S_SCORES], L[L_EXPERTS], topk, wa, L[L_EXPERT_SCALE],
                          sel + t * MAX_TOPK, selw + t * MAX_TOPK);
                }
            }
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        {
            Mat md = mat_at(table, L[L_DOWN]);
            device const uint* da = arena_of(md, wa, wb);
            uint nd = (H + 3u) / 4u;
            uint qe = (ew + 3u) / 4u;
            for (uint task = w0; task < nd + nt * topk * qe; task += nw) {
                float4 v[MAX_M];
                if (task < nd) {
                    uint r = 4u * task;
                    quad_dot(md, da, r, Rows{act + table[A_GU], table[H_S_GU]}, nt, lane, v);
                    if (lane == 0u) {
                        for (uint t = 0; t < nt; ++t) {
                            for (uint j = 0; j < 4u && r + j < H; ++j) act[table[A_M] + t * H + r + j] = v[t][j];
                        }
                    }
                } else {
                    // One routed expert of one token: its own weights, its own input.
                    uint u = task - nd;
                    uint t = u / (topk * qe), kk = (u / qe) % topk, r = 4u * (u % qe);
                    uint e = expert_slot(L, step, table, sel[t * MAX_TOPK + kk]);
                    Mat mg = at_slot(mat_at(table, L[L_E_GATE]), e, L[L_E_SLOT_WORDS]);
                    Mat mu = at_slot(mat_at(table, L[L_E_UP]), e, L[L_E_SLOT_WORDS]);
                    NormedRows xe = {xg + t * H, H, rn + t, wa, L[L_PRE_NORM_2], 1.0f};
                    uint g0 = e * L[L_E_GATE_STRIDE];
                    float4 g[1], up[1];
                    quad_dot(mg, arena_of(mg, wa, wb), g0 + r, xe, 1u, lane, g);
                    quad_dot(mu, arena_of(mu, wa, wb), g0 + L[L_E_UP_BASE] + r, xe, 1u, lane, up);
                    if (lane == 0u) {
                        for (uint j = 0; j < 4u && r + j < ew; ++j) {
                            act[table[A_EGU] + t * table[H_S_EGU] + kk * ew + r + j] = gelu_tanh(g[0][j]) * up[0][j];
                        }
                    }
                }
            }
        }
        grid_barrier(arrivals, ngroups, phase, lid, stall);

        if (moe) {
            // ---- f2: the routed experts' down rows
            uint qh = (H + 3u) / 4u;
            for (uint task = w0; task < nt * topk * qh; task += nw) {
                uint t = task / (topk * qh), kk = (task / qh) % topk, r = 4u * (task % qh);
                uint e = expert_slot(L, step, table, sel[t * MAX_TOPK + kk]);
                Mat me = at_slot(mat_at(table, L[L_E_DOWN]), e, L[L_E_SLOT_WORDS]);
                float4 v[1];
                quad_dot(me, arena_of(me, wa, wb), e * L[L_E_DOWN_STRIDE] + r,
                         Rows{act + table[A_EGU] + t * table[H_S_EGU] + kk * ew, 0u}, 1u, lane, v);
                if (lane == 0u) {
                    for (uint j = 0; j < 4u && r + j < H; ++j) {
                        act[table[A_ED] + t * table[H_S_ED] + kk * H + r + j] = v[0][j];
                    }
                }
            }
            grid_barrier(arrivals, ngroups, phase, lid, stall);
        }

        // ---- g: x += norm(m) [MoE: m = norm_1(dense) + norm_2(Σ routed)]; per-layer input gate
        for (uint t = 0; t < nt; ++t) {
            coherent(device) device float* x = xg + t * H;
            coherent(device) device const float* m = act + table[A_M] + t * H;
            if (moe) {
                RoutedSum rs = {act + table[A_ED] + t * table[H_S_ED], selw + t * MAX_TOPK, topk, H};
                float r1 = rms_scale(group_sumsq(m, H, c, red), H, eps);
                float r2 = rms_scale(group_sumsq(rs, H, c, red), H, eps);
                MoeOut mo = {m, r1, wa, L[L_POST_NORM_1], rs, r2, L[L_POST_NORM_2]};
                float r3 = rms_scale(group_sumsq(mo, H, c, red), H, eps);
                for (uint i = lid; i < H; i += nthreads) x[i] += mo[i] * r3 * as_type<float>(wa[L[L_POST_FF] + i]);
                threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
            } else {
                group_residual(x, m, wa, L[L_POST_FF], H, eps, c, red);
            }
        }
        if (L[L_PLE_GATE] != NONE) {
            Mat mg = mat_at(table, L[L_PLE_GATE]);
            device const uint* ga = arena_of(mg, wa, wb);
            for (uint r = 4u * w0; r < pd; r += 4u * nw) {
                float4 g[MAX_M];
                quad_dot(mg, ga, r, Rows{xg, H}, nt, lane, g);
                if (lane == 0u) {
                    for (uint t = 0; t < nt; ++t) {
                        for (uint j = 0; j < 4u && r + j < pd; ++j) {
                            act[table[A_PG] + t * pd + r + j] =
                                gelu_tanh(g[t][j]) * act[table[A_PLE] + t * lpd + li * pd + r + j];
                        }
                    }
                }
            }
            grid_barrier(arrivals, ngroups, phase, lid, stall);

            // ---- h: per-layer input projection
            matvec(mat_at(table, L[L_PLE_PROJ]), wa, wb, Rows{act + table[A_PG], pd}, nt, act + table[A_PY], H, 1.0f,
                   w0, nw, lane);
            grid_barrier(arrivals, ngroups, phase, lid, stall);

            // ---- i: x += norm(py)
            for (uint t = 0; t < nt; ++t) {
                group_residual(xg + t * H, act + table[A_PY] + t * H, wa, L[L_PLE_POST], H, eps, c, red);
            }
        }
        float ls = as_type<float>(L[L_SCALAR]);
        for (uint t = 0; t < nt; ++t) {
            for (uint i = lid; i < H; i += nthreads) xg[t * H + i] *= ls;
        }
        threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
    }

    // ---- final norm, head (tied embedding), softcap, argmax per token
    for (uint t = 0; t < nt; ++t) rn[t] = rms_scale(group_sumsq(xg + t * H, H, c, red), H, eps);
    NormedRows xf = {xg, H, rn, wa, table[H_FINAL_NORM], 1.0f};
    if (tg == 0u) {
        for (uint t = 0; t < nt; ++t) {
            for (uint i = lid; i < H; i += nthreads) out[table[H_OUT_HIDDEN] + t * H + i] = xf.at(t, i);
        }
    }
    {
        Mat e = mat_at(table, table[H_EMBED]);
        device const uint* ea = arena_of(e, wa, wb);
        float cap = as_type<float>(table[H_SOFTCAP]);
        uint vocab = table[H_VOCAB];
        float best_v[MAX_M];
        uint best_i[MAX_M];
        for (uint t = 0; t < MAX_M; ++t) {
            best_v[t] = -INFINITY;
            best_i[t] = NONE;
        }
        for (uint r = 4u * w0; r < vocab; r += 4u * nw) {
            float4 v4[MAX_M];
            quad_dot(e, ea, r, xf, nt, lane, v4);
            for (uint t = 0; t < nt; ++t) {
                for (uint j = 0; j < 4u && r + j < vocab; ++j) {
                    float v = v4[t][j];
                    if (cap > 0.0f) v = cap * precise::tanh(v / cap);
                    if (lane == 0u) out[table[H_OUT_LOGITS] + t * vocab + r + j] = v;
                    // Rows ascend, so a strict > keeps the first maximum; NaN never wins.
                    if (v > best_v[t]) {
                        best_v[t] = v;
                        best_i[t] = r + j;
                    }
                }
            }
        }
        if (lane == 0u) {
            for (uint t = 0; t < nt; ++t) {
                act[table[A_BEST] + 2u * (t * nw + w0)] = best_v[t];
                act[table[A_BEST] + 2u * (t * nw + w0) + 1u] = as_type<float>(best_i[t]);
            }
        }
    }
    grid_barrier(arrivals, ngroups, phase, lid, stall);
    if (tg == 0u && lid < nt) {
        uint t = lid;
        float bv = -INFINITY;
        uint bi = NONE;
        for (uint w = 0; w < nw; ++w) {
            float v = act[table[A_BEST] + 2u * (t * nw + w)];
            uint i = as_type<uint>(act[table[A_BEST] + 2u * (t * nw + w) + 1u]);
            if (i != NONE && (bi == NONE || v > bv || (v == bv && i < bi))) {
                bv = v;
                bi = i;
            }
        }
        out[t] = as_type<float>(bi == NONE ? 0u : bi);
    }
}
