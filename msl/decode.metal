// decode: one Gemma 4 decode step (one token) in ONE launch — embedding, per-layer inputs, every
// layer (attention over the sliding ring and the full cache, KV sharing, K-as-V, GeGLU, the
// per-layer-input gate), the final norm, the tied head with softcap, and the argmax.
//
// Mirrors: the CPU reference `crate::backend::cpu` forward (the math of `crate::reference`:
// rmsnorm, matmul, rope, attend, gelu_tanh, softcap, argmax) and the WGSL program of the wgpu
// backend (embed.wgsl, qmv*.wgsl, head_norm_rope.wgsl, attention*.wgsl, gelu_mul.wgsl,
// softcap_argmax.wgsl + argmax_merge.wgsl), fused.
//
// Buffers (the host, `src/backend/metal/`, binds them in this order; wgpu's MSL passthrough
// numbers buffers in bind-group order, so these indices are also the Metal ones):
//   0 table  device const uint*  program table: header (H_*), layer records (L_*), matrix
//                                descriptors (D_*) — written once at load (`pack.rs` mirrors it)
//   1 wa     device const uint*  weight arena A: every dense matrix (raw checkpoint bytes: f32,
//                                bf16, f16, or MLX affine words + bf16 scales/biases) and every
//                                norm vector as f32; addressed in 4-byte words (16 GiB reach)
//   2 wb     device const uint*  weight arena B (routed experts; a 16-byte dummy without MoE)
//   3 act    coherent(device) device float*  activations exchanged between threadgroups (A_* offsets)
//   4 kv     coherent(device) device float*  KV caches: per owning layer K then V, f32
//                                [slot][kv_head][head_dim] — `crate::kv::KvLayout`, shared with
//                                every backend; sliding layers are rings of `slots` positions
//   5 sync   coherent(device) device atomic_uint*  word 0: grid-barrier arrivals (cleared by the host
//                                before each launch); word 32: stall code (0 = none)
//   6 step   device const uint*  this step: [0] token, [1] position, [2] resume (0, or layer + 1:
//                                continue a split step at that layer's stage f), [3] stop (a layer:
//                                end after its stage e, x saved to A_X; NONE: run to the end),
//                                then f32 rope cos|sin of the sliding and the full rope at
//                                H_ROPE_S / H_ROPE_F, then (streamed experts) the slot of each
//                                expert of the layer being resumed at H_STEP_MAP
//   7 out    device float*       [0] argmax (uint bits), logits at H_OUT_LOGITS, the
//                                post-final-norm hidden state at H_OUT_HIDDEN
//
// Streamed experts (an installation with fewer slots than experts): the host must read each MoE
// layer's routing before it can load the chosen experts, so it splits the step there: a launch
// stops after the layer's stage e (router scores written, x saved), the host routes exactly as
// `route` does, fills the slots, writes the slot map and resumes at stage f. With every expert
// resident the step stays one launch.
//
// Launch: G threadgroups × T threads (T a multiple of 32), ALL co-resident (the stages meet at
// grid barriers: `grid_sync.metal`); the default shape is one threadgroup per GPU core, the most
// Apple GPUs keep resident without an occupancy API. Work is split over the G·T/32 SIMD-groups
// of the grid ("warps"): a mat-vec gives each warp quads of whole rows (lanes stride the columns,
// one simd_sum of four sums per quad), attention a whole query head.
//
// The residual stream never leaves threadgroup memory: every threadgroup keeps its own copy of
// x (KESTREL_MAX_HIDDEN floats) and updates it with identical arithmetic, so a norm over the
// whole hidden vector needs no grid barrier. Per layer the grid meets at most 8 times:
//   a  x̂ = norm(x) in threadgroup memory; q|k|v rows             → Q, K, V      | barrier
//   b  per head: q_norm + rope; k_norm + rope, v_norm → cache slot             | barrier
//   c  per query head: attention over the window / the whole cache → ATT       | barrier
//   d  o_proj rows                                                 → O        | barrier
//   e  x += norm(O); x̂ = norm(x); gate & up rows, gelu(g)·u        → GU       | barrier
//   f  down rows                                                   → M        | barrier
//      [MoE: stage e also scores the router, f routes (each group alike) and runs the routed
//       experts' gate & up → EGU, a stage f2 their down rows → ED | barrier; g combines]
//   g  x += norm(M); [PLE] gate rows, gelu(g)·ple                  → PG       | barrier
//   h  [PLE] projection rows                                       → PY       | barrier
//   i  x += norm(PY); x *= layer_scalar   (every group, no barrier: next layer's stage a)
// Arithmetic: f32 throughout; each row is one lane-strided f32 sum folded by simd_sum (butterfly
// order), dequantisation `scale * q + bias` as `crate::quant::dequant_row`; a row's result does
// not depend on the grid size.
//
// Host-supplied definitions: KESTREL_MAX_HIDDEN (threadgroup array length ≥ hidden size).

#include <metal_stdlib>
using namespace metal;

// ---- program table layout (mirrored by `src/backend/metal/pack.rs`, checked by its tests) ----
enum : uint {
    H_HIDDEN = 0, H_VOCAB = 1, H_LAYERS = 2, H_EPS = 3, H_SOFTCAP = 4, H_PLE_DIM = 5,
    H_EMBED = 6, H_EMBED_SCALE = 7, H_PLE_EMBED = 8, H_PLE_PROJ = 9, H_PLE_NORM = 10,
    H_FINAL_NORM = 11, H_LAYER_BASE = 12, H_DESC_BASE = 13, H_ROPE_S = 14, H_ROPE_F = 15,
    H_INV_SQRT_H = 16, H_SQRT_PLE = 17, H_OUT_LOGITS = 18, H_OUT_HIDDEN = 19,
    A_Q = 20, A_K = 21, A_V = 22, A_ATT = 23, A_O = 24, A_GU = 25, A_M = 26, A_PLE = 27,
    A_PG = 28, A_PY = 29, A_BEST = 30, A_SCORES = 31, A_EGU = 32, A_ED = 33, A_X = 34, H_STEP_MAP = 35,
    H_WORDS = 40,
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

// Σ_c W[r, c] · x[c] for the four rows r0 … r0+3 (rows past the end repeat the last one; callers
// drop them), by one SIMD-group: lane l takes the storage words l, l+32, … of each row in order,
// reading each x value once for the four rows, then one simd_sum of the four sums. Every lane
// returns the sums. Row j's arithmetic is the same whichever quad it falls in, so a product is
// independent of the grid. `x` lives in threadgroup or device memory (the template keeps one body
// for both address spaces).
template <typename XPtr>
inline float4 quad_dot(Mat m, device const uint* a, uint r0, XPtr x, uint lane) {
    uint rr[4];
    float acc[4];
    for (uint j = 0; j < 4u; ++j) {
        rr[j] = min(r0 + j, m.rows - 1u);
        acc[j] = 0.0f;
    }
    if (m.fmt == FMT_BF16 || m.fmt == FMT_F16) {
        uint hc = m.cols >> 1;
        for (uint i = lane; i < hc; i += 32u) {
            float x0 = x[2u * i], x1 = x[2u * i + 1u];
            for (uint j = 0; j < 4u; ++j) {
                uint w = a[m.w + rr[j] * hc + i];
                float lo = m.fmt == FMT_BF16 ? bf16_lo(w) : f16_bits(w & 0xffffu);
                float hi = m.fmt == FMT_BF16 ? bf16_hi(w) : f16_bits(w >> 16);
                acc[j] += lo * x0;
                acc[j] += hi * x1;
            }
        }
    } else if (m.fmt == FMT_F32) {
        for (uint i = lane; i < m.cols; i += 32u) {
            float xv = x[i];
            for (uint j = 0; j < 4u; ++j) acc[j] += as_type<float>(a[m.w + rr[j] * m.cols + i]) * xv;
        }
    } else {
        uint bits = m.fmt;
        uint vpw = 32u / bits;
        uint wpr = m.cols / vpw;
        uint gpr = m.cols / m.group;
        uint mask = (1u << bits) - 1u;
        float xs[8];
        for (uint i = lane; i < wpr; i += 32u) {
            uint c0 = i * vpw;
            for (uint k = 0; k < vpw; ++k) xs[k] = x[c0 + k];
            for (uint j = 0; j < 4u; ++j) {
                uint word = a[m.w + rr[j] * wpr + i];
                uint g = rr[j] * gpr + c0 / m.group;
                float s = bf16_at(a, m.s, g);
                float b = bf16_at(a, m.b, g);
                for (uint k = 0; k < vpw; ++k) {
                    float q = float((word >> (bits * k)) & mask);
                    acc[j] += (s * q + b) * xs[k];
                }
            }
        }
    }
    return simd_sum(float4(acc[0], acc[1], acc[2], acc[3]));
}

// y[r] = W x for every row, quads of rows spread over the grid's SIMD-groups; lane 0 stores.
template <typename XPtr>
inline void matvec(Mat m, device const uint* wa, device const uint* wb, XPtr x, coherent(device) device float* y,
                   float scale, uint w0, uint nw, uint lane) {
    device const uint* a = arena_of(m, wa, wb);
    for (uint r = 4u * w0; r < m.rows; r += 4u * nw) {
        float4 v = quad_dot(m, a, r, x, lane);
        if (lane == 0u) {
            for (uint j = 0; j < 4u && r + j < m.rows; ++j) y[r + j] = v[j] * scale;
        }
    }
}

// ---- threadgroup-wide reductions ----
// Σ v[i]² over n values, the same value in every thread (fixed order: lane-strided partial sums,
// simd_sum, then the SIMD-groups' sums in index order).
template <typename VPtr>
inline float group_sumsq(VPtr v, uint n, Ctx c, threadgroup float* red) {
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

// dst = norm(src) · w over the hidden vector, both in threadgroup memory.
inline void group_norm(threadgroup const float* src, threadgroup float* dst, device const uint* wa, uint w_off,
                       uint n, float eps, Ctx c, threadgroup float* red) {
    float r = rms_scale(group_sumsq(src, n, c, red), n, eps);
    for (uint i = c.lid; i < n; i += c.nthreads) dst[i] = src[i] * r * as_type<float>(wa[w_off + i]);
    threadgroup_barrier(mem_flags::mem_threadgroup);
}

// x += norm(v) · w, with v a device vector another stage wrote (every group, same arithmetic).
inline void group_residual(threadgroup float* x, coherent(device) device const float* v, device const uint* wa, uint w_off,
                           uint n, float eps, Ctx c, threadgroup float* red) {
    float r = rms_scale(group_sumsq(v, n, c, red), n, eps);
    for (uint i = c.lid; i < n; i += c.nthreads) x[i] += v[i] * r * as_type<float>(wa[w_off + i]);
    threadgroup_barrier(mem_flags::mem_threadgroup);
}

// ---- MoE: inputs computed on the fly, routing, the combined residual ----
// norm(x)[i] · w[i] · post, read where a mat-vec reads x: the router's and the experts' inputs
// have no room of their own in threadgroup memory, and this is the arithmetic a stored copy
// would hold ((x · r) · w, then · post, which is exact for post = 1).
struct NormedX {
    threadgroup const float* x;
    float r;
    device const uint* wa;
    uint w_off;
    float post;
    float operator[](uint i) const { return x[i] * r * as_type<float>(wa[w_off + i]) * post; }
};

// Σ_k w_k · y_k[i] over the routed experts, in routing order (as the reference sums them).
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

// Top-k of the router's scores (ties: the lower expert first), softmax weights over the chosen
// ones renormalised, × per_expert_scale: `sel`/`selw` in threadgroup memory. One thread of each
// group ranks (k · E comparisons); every group computes the same choice from the same scores.
inline void route(coherent(device) device const float* scores, uint n_experts, uint k, device const uint* wa,
                  uint scale_off, threadgroup uint* sel, threadgroup float* selw, uint lid) {
    if (lid == 0u) {
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
    threadgroup_barrier(mem_flags::mem_threadgroup);
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
    threadgroup float x[KESTREL_MAX_HIDDEN];  // the residual stream (every group's own copy)
    threadgroup float xn[KESTREL_MAX_HIDDEN]; // its normed form, the input of the next mat-vecs
    threadgroup float red[32];
    threadgroup uint sel[16];   // MoE: the routed experts of this layer (MAX_TOPK)
    threadgroup float selw[16]; // and their weights
    Ctx c;
    c.tg = tg; c.ngroups = ngroups; c.lid = lid; c.nthreads = nthreads; c.sg = sg; c.nsg = nsg; c.lane = lane;
    const uint w0 = c.warp(), nw = c.warps();
    uint phase = 0;
    coherent(device) device atomic_uint* arrivals = sync;
    coherent(device) device atomic_uint* stall = sync + 32;

    const uint H = table[H_HIDDEN];
    const float eps = as_type<float>(table[H_EPS]);
    const uint token = step[0];
    const uint pos = step[1];
    const uint resume = step[2] == 0u ? NONE : step[2] - 1u;
    const uint stop = step[3];
    const uint pd = table[H_PLE_DIM];

    if (resume != NONE) {
        // A split step continues: x as the stopped launch saved it; the per-layer inputs and the
        // caches are still in device memory.
        for (uint i = lid; i < H; i += nthreads) x[i] = act[table[A_X] + i];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }

    // ---- embedding: x = E[token] · √H (every group; no barrier needed)
    if (resume == NONE) {
        Mat e = mat_at(table, table[H_EMBED]);
        device const uint* ea = arena_of(e, wa, wb);
        float scale = as_type<float>(table[H_EMBED_SCALE]);
        for (uint i = lid; i < H; i += nthreads) x[i] = mat_elem(e, ea, token, i) * scale;
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }

    // ---- per-layer inputs: ple = (norm(W_plmp · x · H^-½) + E_ple[token] · √P) · 2^-½
    if (pd != 0u && resume == NONE) {
        matvec(mat_at(table, table[H_PLE_PROJ]), wa, wb, (threadgroup const float*)x, act + table[A_PLE],
               as_type<float>(table[H_INV_SQRT_H]), w0, nw, lane);
        grid_barrier(arrivals, ngroups, phase, lid, stall);
        Mat pe = mat_at(table, table[H_PLE_EMBED]);
        device const uint* pea = arena_of(pe, wa, wb);
        float ts = as_type<float>(table[H_SQRT_PLE]);
        uint nl = table[H_LAYERS];
        for (uint li = w0; li < nl; li += nw) {
            coherent(device) device float* seg = act + table[A_PLE] + li * pd;
            float ss = 0.0f;
            for (uint i = lane; i < pd; i += 32u) ss += seg[i] * seg[i];
            float r = rms_scale(simd_sum(ss), pd, eps);
            for (uint i = lane; i < pd; i += 32u) {
                float nv = seg[i] * r * as_type<float>(wa[table[H_PLE_NORM] + i]);
                seg[i] = (nv + mat_elem(pe, pea, token, li * pd + i) * ts) * 0.70710678118654752f;
            }
        }
        // No barrier here: layer 0 first reads these values in its stage g, several barriers on.
    }

    const uint n_layers = table[H_LAYERS];
    for (uint li = resume == NONE ? 0u : resume; li < n_layers; ++li) {
        device const uint* L = table + table[H_LAYER_BASE] + li * L_WORDS;
        const uint d = L[L_HEAD_DIM], nh = L[L_HEADS], nkv = L[L_KV_HEADS];
        const bool writes = L[L_WRITES_KV] != 0u;
        const uint qd = nh * d, kvd = nkv * d;
        const bool resumed = li == resume;

        if (!resumed) {
        // ---- a: x̂ = norm(x); q | k | v rows
        group_norm(x, xn, wa, L[L_IN_NORM], H, eps, c, red);
        {
            // Quads of q rows, then of k rows, then of v rows, one index space over the grid.
            uint nq = (qd + 3u) / 4u, nk = writes ? (kvd + 3u) / 4u : 0u;
            uint nv = writes && L[L_K_EQ_V] == 0u ? nk : 0u;
            for (uint t = w0; t < nq + nk + nv; t += nw) {
                uint which = t < nq ? 0u : (t < nq + nk ? 1u : 2u);
                uint quad = which == 0u ? t : (which == 1u ? t - nq : t - nq - nk);
                Mat m = mat_at(table, which == 0u ? L[L_Q] : (which == 1u ? L[L_K] : L[L_V]));
                uint dst = which == 0u ? table[A_Q] : (which == 1u ? table[A_K] : table[A_V]);
                float4 v = quad_dot(m, arena_of(m, wa, wb), 4u * quad, (threadgroup const float*)xn, lane);
                if (lane == 0u) {
                    for (uint j = 0; j < 4u && 4u * quad + j < m.rows; ++j) act[dst + 4u * quad + j] = v[j];
                }
            }
        }
        grid_barrier(arrivals, ngroups, phase, lid, stall);

        // ---- b: q_norm + rope per query head; k_norm + rope and v_norm into the cache slot
        {
            uint cs = L[L_KIND] == 0u ? table[H_ROPE_S] : table[H_ROPE_F];
            uint slot = pos % L[L_SLOTS];
            uint tasks = nh + (writes ? 2u * nkv : 0u);
            for (uint t = w0; t < tasks; t += nw) {
                if (t < nh) {
                    coherent(device) device float* qh = act + table[A_Q] + t * d;
                    head_finish(qh, qh, wa, L[L_Q_NORM], true, step, cs, d, eps, lane);
                } else if (t < nh + nkv) {
                    uint h = t - nh;
                    head_finish(act + table[A_K] + h * d, kv + L[L_K_OFF] + slot * kvd + h * d, wa, L[L_K_NORM], true,
                                step, cs, d, eps, lane);
                } else {
                    uint h = t - nh - nkv;
                    // attention_k_eq_v: V is the raw K projection (before k_norm and rope).
                    uint src = L[L_K_EQ_V] != 0u ? table[A_K] : table[A_V];
                    head_finish(act + src + h * d, kv + L[L_V_OFF] + slot * kvd + h * d, wa, NONE, false, step, cs, d,
                                eps, lane);
                }
            }
        }
        grid_barrier(arrivals, ngroups, phase, lid, stall);

        // ---- c: attention, one query head per SIMD-group
        {
            uint lo = L[L_KIND] == 0u ? (pos + 1u > L[L_WINDOW] ? pos + 1u - L[L_WINDOW] : 0u) : 0u;
            uint group = nh / nkv;
            for (uint h = w0; h < nh; h += nw) {
                uint kvh = h / group;
                attend_head(act + table[A_Q] + h * d, kv + L[L_K_OFF] + kvh * d, kv + L[L_V_OFF] + kvh * d,
                            act + table[A_ATT] + h * d, lo, pos, L[L_SLOTS], kvd, d, lane);
            }
        }
        grid_barrier(arrivals, ngroups, phase, lid, stall);

        // ---- d: o_proj
        matvec(mat_at(table, L[L_O]), wa, wb, (coherent(device) device const float*)(act + table[A_ATT]),
               act + table[A_O], 1.0f, w0, nw, lane);
        grid_barrier(arrivals, ngroups, phase, lid, stall);

        // ---- e: x += norm(o); x̂ = norm(x); gelu(gate x̂) · (up x̂) [MoE: and the router's scores]
        group_residual(x, act + table[A_O], wa, L[L_POST_ATTN], H, eps, c, red);
        group_norm(x, xn, wa, L[L_PRE_FF], H, eps, c, red);
        }
        const bool moe = L[L_MOE] != 0u;
        // MoE layers route on, and feed their experts, the residual x normed without a weight.
        const float rx = moe ? rms_scale(group_sumsq((threadgroup const float*)x, H, c, red), H, eps) : 1.0f;
        if (!resumed) {
            Mat mg = mat_at(table, L[L_GATE]);
            Mat mu = mat_at(table, L[L_UP]);
            uint mw = L[L_MLP];
            uint nd = (mw + 3u) / 4u;
            uint nr = moe ? (L[L_EXPERTS] + 3u) / 4u : 0u;
            for (uint t = w0; t < nd + nr; t += nw) {
                if (t < nd) {
                    uint r = 4u * t;
                    float4 g = quad_dot(mg, arena_of(mg, wa, wb), r, (threadgroup const float*)xn, lane);
                    float4 u = quad_dot(mu, arena_of(mu, wa, wb), r, (threadgroup const float*)xn, lane);
                    if (lane == 0u) {
                        for (uint j = 0; j < 4u && r + j < mw; ++j) act[table[A_GU] + r + j] = gelu_tanh(g[j]) * u[j];
                    }
                } else {
                    // Router: scores = W_r (norm(x) · scale · H^-½).
                    uint r = 4u * (t - nd);
                    Mat mr = mat_at(table, L[L_ROUTER]);
                    NormedX rin = {x, rx, wa, L[L_ROUTER_SCALE], as_type<float>(table[H_INV_SQRT_H])};
                    float4 v = quad_dot(mr, arena_of(mr, wa, wb), r, rin, lane);
                    if (lane == 0u) {
                        for (uint j = 0; j < 4u && r + j < mr.rows; ++j) act[table[A_SCORES] + r + j] = v[j];
                    }
                }
            }
        }
        if (!resumed) {
            grid_barrier(arrivals, ngroups, phase, lid, stall);
            if (li == stop) {
                // The host routes this layer and loads its experts, then resumes at stage f.
                if (tg == 0u) {
                    for (uint i = lid; i < H; i += nthreads) act[table[A_X] + i] = x[i];
                }
                return;
            }
        }

        // ---- f: down [MoE: route; the routed experts' gate & up, gelu(g)·u]
        const uint topk = moe ? L[L_TOPK] : 0u, ew = L[L_E_WIDTH];
        if (moe) route(act + table[A_SCORES], L[L_EXPERTS], topk, wa, L[L_EXPERT_SCALE], sel, selw, lid);
        {
            Mat md = mat_at(table, L[L_DOWN]);
            uint nd = (H + 3u) / 4u;
            uint qe = (ew + 3u) / 4u;
            for (uint t = w0; t < nd + topk * qe; t += nw) {
                if (t < nd) {
                    uint r = 4u * t;
                    float4 v = quad_dot(md, arena_of(md, wa, wb), r,
                                        (coherent(device) device const float*)(act + table[A_GU]), lane);
                    if (lane == 0u) {
                        for (uint j = 0; j < 4u && r + j < H; ++j) act[table[A_M] + r + j] = v[j];
                    }
                } else {
                    uint kk = (t - nd) / qe, r = 4u * ((t - nd) % qe);
                    uint e = expert_slot(L, step, table, sel[kk]);
                    Mat mg = at_slot(mat_at(table, L[L_E_GATE]), e, L[L_E_SLOT_WORDS]);
                    Mat mu = at_slot(mat_at(table, L[L_E_UP]), e, L[L_E_SLOT_WORDS]);
                    NormedX xe = {x, rx, wa, L[L_PRE_NORM_2], 1.0f};
                    uint g0 = e * L[L_E_GATE_STRIDE];
                    float4 g = quad_dot(mg, arena_of(mg, wa, wb), g0 + r, xe, lane);
                    float4 u = quad_dot(mu, arena_of(mu, wa, wb), g0 + L[L_E_UP_BASE] + r, xe, lane);
                    if (lane == 0u) {
                        for (uint j = 0; j < 4u && r + j < ew; ++j) {
                            act[table[A_EGU] + kk * ew + r + j] = gelu_tanh(g[j]) * u[j];
                        }
                    }
                }
            }
        }
        grid_barrier(arrivals, ngroups, phase, lid, stall);

        if (moe) {
            // ---- f2: the routed experts' down rows
            uint qh = (H + 3u) / 4u;
            for (uint t = w0; t < topk * qh; t += nw) {
                uint kk = t / qh, r = 4u * (t % qh);
                uint e = expert_slot(L, step, table, sel[kk]);
                Mat me = at_slot(mat_at(table, L[L_E_DOWN]), e, L[L_E_SLOT_WORDS]);
                float4 v = quad_dot(me, arena_of(me, wa, wb), e * L[L_E_DOWN_STRIDE] + r,
                                    (coherent(device) device const float*)(act + table[A_EGU] + kk * ew), lane);
                if (lane == 0u) {
                    for (uint j = 0; j < 4u && r + j < H; ++j) act[table[A_ED] + kk * H + r + j] = v[j];
                }
            }
            grid_barrier(arrivals, ngroups, phase, lid, stall);
        }

        // ---- g: x += norm(m) [MoE: m = norm_1(dense) + norm_2(Σ routed)]; per-layer input gate
        if (moe) {
            coherent(device) device const float* m = act + table[A_M];
            RoutedSum rs = {act + table[A_ED], selw, topk, H};
            float r1 = rms_scale(group_sumsq(m, H, c, red), H, eps);
            float r2 = rms_scale(group_sumsq(rs, H, c, red), H, eps);
            MoeOut mo = {m, r1, wa, L[L_POST_NORM_1], rs, r2, L[L_POST_NORM_2]};
            float r3 = rms_scale(group_sumsq(mo, H, c, red), H, eps);
            for (uint i = lid; i < H; i += nthreads) x[i] += mo[i] * r3 * as_type<float>(wa[L[L_POST_FF] + i]);
            threadgroup_barrier(mem_flags::mem_threadgroup);
        } else {
            group_residual(x, act + table[A_M], wa, L[L_POST_FF], H, eps, c, red);
        }
        if (L[L_PLE_GATE] != NONE) {
            Mat mg = mat_at(table, L[L_PLE_GATE]);
            device const uint* ga = arena_of(mg, wa, wb);
            for (uint r = 4u * w0; r < pd; r += 4u * nw) {
                float4 g = quad_dot(mg, ga, r, (threadgroup const float*)x, lane);
                if (lane == 0u) {
                    for (uint j = 0; j < 4u && r + j < pd; ++j) {
                        act[table[A_PG] + r + j] = gelu_tanh(g[j]) * act[table[A_PLE] + li * pd + r + j];
                    }
                }
            }
            grid_barrier(arrivals, ngroups, phase, lid, stall);

            // ---- h: per-layer input projection
            matvec(mat_at(table, L[L_PLE_PROJ]), wa, wb, (coherent(device) device const float*)(act + table[A_PG]),
                   act + table[A_PY], 1.0f, w0, nw, lane);
            grid_barrier(arrivals, ngroups, phase, lid, stall);

            // ---- i: x += norm(py)
            group_residual(x, act + table[A_PY], wa, L[L_PLE_POST], H, eps, c, red);
        }
        float ls = as_type<float>(L[L_SCALAR]);
        for (uint i = lid; i < H; i += nthreads) x[i] *= ls;
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }

    // ---- final norm, head (tied embedding), softcap, argmax
    group_norm(x, xn, wa, table[H_FINAL_NORM], H, eps, c, red);
    if (tg == 0u) {
        for (uint i = lid; i < H; i += nthreads) out[table[H_OUT_HIDDEN] + i] = xn[i];
    }
    {
        Mat e = mat_at(table, table[H_EMBED]);
        device const uint* ea = arena_of(e, wa, wb);
        float cap = as_type<float>(table[H_SOFTCAP]);
        uint vocab = table[H_VOCAB];
        float best_v = -INFINITY;
        uint best_i = NONE;
        for (uint r = 4u * w0; r < vocab; r += 4u * nw) {
            float4 v4 = quad_dot(e, ea, r, (threadgroup const float*)xn, lane);
            for (uint j = 0; j < 4u && r + j < vocab; ++j) {
                float v = v4[j];
                if (cap > 0.0f) v = cap * precise::tanh(v / cap);
                if (lane == 0u) out[table[H_OUT_LOGITS] + r + j] = v;
                // Rows ascend, so a strict > keeps the first maximum; NaN never wins.
                if (v > best_v) {
                    best_v = v;
                    best_i = r + j;
                }
            }
        }
        if (lane == 0u) {
            act[table[A_BEST] + 2u * w0] = best_v;
            act[table[A_BEST] + 2u * w0 + 1u] = as_type<float>(best_i);
        }
    }
    grid_barrier(arrivals, ngroups, phase, lid, stall);
    if (tg == 0u && lid == 0u) {
        float bv = -INFINITY;
        uint bi = NONE;
        for (uint w = 0; w < nw; ++w) {
            float v = act[table[A_BEST] + 2u * w];
            uint i = as_type<uint>(act[table[A_BEST] + 2u * w + 1u]);
            if (i != NONE && (bi == NONE || v > bv || (v == bv && i < bi))) {
                bv = v;
                bi = i;
            }
        }
        out[0] = as_type<float>(bi == NONE ? 0u : bi);
    }
}
