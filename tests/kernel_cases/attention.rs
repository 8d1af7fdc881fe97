//! Attention: the chunk kernels of prefill (`attention`, and `attention_coop` on tensor cores:
//! an ignored test, for devices with f16 cooperative matrices) on [`AttnCase`]'s table, and
//! decode attention on the same cases: `attention_split` + `attention_combine`, `attention_short`,
//! each with q given and with q before its norm and rope.

use super::*;
use kestrel::kernels::*;
use kestrel::reference;

/// Token t (position pos0 + t) of every query head attends to positions [lo, pos0 + t] of its
/// kv head, read from ring caches of `slots` slots; window 0 = full attention.
#[derive(Clone, Copy)]
pub struct AttnCase {
    pub d: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub tokens: usize,
    pub pos0: usize,
    pub window: usize,
    pub slots: usize,
    /// q drawn from [-q_range, q_range) (1 by the rule): larger ranges give peaked softmaxes
    /// whose running maximum moves often, smaller ones near-uniform weights.
    pub q_range: f32,
    /// Run attention_coop.wgsl (tensor cores) instead of attention.wgsl.
    pub coop: bool,
    /// attention_coop's form that also writes its output's sums over each 64-dim value stage.
    pub sums: bool,
}

impl AttnCase {
    pub fn new(
        d: usize,
        heads: usize,
        kv_heads: usize,
        tokens: usize,
        pos0: usize,
        window: usize,
        slots: usize,
    ) -> Self {
        AttnCase { d, heads, kv_heads, tokens, pos0, window, slots, q_range: 1.0, coop: false, sums: false }
    }

    /// The CPU's attention output for queries `q` ([token][head · d]) over the ring caches.
    pub fn reference(&self, q: &[f32], kc: &[f32], vc: &[f32]) -> Vec<Option<f64>> {
        let &AttnCase { d, heads, kv_heads, tokens, pos0, window, slots, .. } = self;
        let lo = |p: usize| if window > 0 { (p + 1).saturating_sub(window) } else { 0 };
        let (qrow, kvrow, group) = (heads * d, kv_heads * d, heads / kv_heads);
        let mut want = vec![None; tokens * qrow];
        let mut o = vec![0.0f32; d];
        for t in 0..tokens {
            let p = pos0 + t;
            for h in 0..heads {
                let kvh = h / group;
                reference::attend(
                    &q[t * qrow + h * d..][..d],
                    lo(p)..p + 1,
                    |pos| &kc[(pos % slots) * kvrow + kvh * d..][..d],
                    |pos| &vc[(pos % slots) * kvrow + kvh * d..][..d],
                    &mut o,
                );
                for i in 0..d {
                    want[t * qrow + h * d + i] = Some(o[i] as f64);
                }
            }
        }
        want
    }
}

impl Case for AttnCase {
    fn kernel(&self) -> Kernel {
        if self.coop {
            assert!(attention_chunk_coop(self.d).is_some(), "{}: a head dim attention_coop does not take", self.name());
            Kernel::AttentionCoop { d: self.d as u32, sums: self.sums }
        } else {
            attention_chunk(self.d)
        }
    }

    fn name(&self) -> String {
        let c = self;
        let mut s = format!(
            "{}(d={},heads={},kv_heads={},tokens={},pos0={},window={},slots={}",
            if c.sums {
                "attention_coop_sums"
            } else if c.coop {
                "attention_coop"
            } else {
                "attention"
            },
            c.d,
            c.heads,
            c.kv_heads,
            c.tokens,
            c.pos0,
            c.window,
            c.slots
        );
        if c.q_range != 1.0 {
            s += &format!(",q_range={}", c.q_range);
        }
        s + ")"
    }

    fn build(&self, rng: &mut Rng, want: Want) -> Launch {
        let &AttnCase { d, heads, kv_heads, tokens, pos0, window, slots, q_range, sums, .. } = self;
        let lo = |p: usize| if window > 0 { (p + 1).saturating_sub(window) } else { 0 };
        // Every position the step reads must have its own slot.
        assert!(pos0 + tokens - lo(pos0) <= slots, "{}: the ring is too small for this step", self.name());
        let (qrow, kvrow) = (heads * d, kv_heads * d);
        let q: Vec<f32> = rng.vec(tokens * qrow).into_iter().map(|v| v * q_range).collect();
        let kc = rng.vec(slots * kvrow);
        let vc = rng.vec(slots * kvrow);
        // The tensor-core form's sums of each 64 values of o (one value stage): sums of 64
        // outputs within tol::ATTN, the same bound.
        let groups = qrow / 64;
        let (want_o, want_s) = want
            .then(|| {
                let want = self.reference(&q, &kc, &vc);
                let want_s: Vec<Option<f64>> = (0..tokens * groups)
                    .map(|i| Some((0..64).map(|j| want[i * 64 + j].expect("every output is compared")).sum()))
                    .collect();
                (want, want_s)
            })
            .unzip();
        let mut bufs = vec![
            input_words("q", &bits(&q)),
            input_words("k cache", &bits(&kc)),
            input_words("v cache", &bits(&vc)),
            output_f32("o", vec![POISON; tokens * qrow], want_o, tol::ATTN),
        ];
        if sums {
            bufs.push(output_f32("osum", vec![POISON; tokens * groups], want_s, tol::ATTN));
        }
        let p = AttnParams {
            d: d as u32,
            n_heads: heads as u32,
            n_kv_heads: kv_heads as u32,
            slots: slots as u32,
            window: window as u32,
            n_splits: 1,
            short_max: 0,
            _pad: 0,
        };
        let step = Step {
            n_tokens: tokens as u32,
            pos0: pos0 as u32,
            n_out: 1,
            out_row0: tokens as u32 - 1,
            ..Default::default()
        };
        let bq = if self.coop { ATTN_COOP_BQ } else { ATTN_BQ };
        launch(self.kernel(), bufs, &p, step, (heads, tokens.div_ceil(bq as usize)))
    }
}

pub fn attention_cases() -> Vec<Box<dyn Case>> {
    attention_shapes().into_iter().map(|c| Box::new(c) as Box<dyn Case>).collect()
}

pub fn attention_shapes() -> Vec<AttnCase> {
    let mut v: Vec<AttnCase> = Vec::new();
    let a = AttnCase::new;
    // Full attention: every head_dim × GQA group 1, 2, 4; 73 positions cross a 64-key tile.
    for d in [32, 64, 256, 512] {
        for (heads, kv) in [(4, 4), (4, 2), (8, 2)] {
            v.push(a(d, heads, kv, 3, 70, 0, 80));
        }
    }
    // The first chunk (causal inside the step), one key, token counts; E2B's 8:1 grouping.
    for tokens in [1, 9, 17] {
        v.push(a(64, 8, 1, tokens, 0, 0, 17));
        v.push(a(64, 8, 1, tokens, 59, 0, 80));
    }
    // A long full-attention context at E2B's global head_dim.
    v.push(a(512, 8, 1, 2, 600, 0, 602));
    // Sliding window 16 (the fixtures'): before the window fills, crossing it, and with the
    // ring wrapped many times (slots = window + tokens − 1, the fewest that work, and + 1).
    for tokens in [1, 9, 17] {
        for pos0 in [0, 10, 200] {
            v.push(a(32, 4, 1, tokens, pos0, 16, 16 + tokens - 1));
        }
        v.push(a(64, 4, 2, tokens, 75, 16, 16 + tokens));
    }
    // E2B's sliding layers: window 512, d 256, 8:1, crossing the window and wrapped.
    v.push(a(256, 8, 1, 3, 510, 512, 515));
    v.push(a(256, 8, 1, 3, 1000, 512, 515));
    // Chunks of several 16-query tiles (the last one partial): a first chunk (each tile's keys
    // end inside a 64-key tile), a later one crossing 64-key tiles at odd offsets, sliding
    // windows that start inside a query tile and a wrapped ring, E4B's global head dim.
    v.push(a(256, 8, 2, 40, 0, 0, 40));
    v.push(a(64, 4, 2, 33, 100, 0, 133));
    v.push(a(32, 4, 1, 40, 10, 16, 16 + 40 - 1));
    v.push(a(40, 2, 1, 50, 300, 20, 70));
    v.push(a(512, 4, 2, 20, 90, 0, 110));
    v
}

/// Decode attention: attention_split (keys over ATTN_SPLITS workgroups per head) then
/// attention_combine, as the backend runs one-token and verify steps, against the same CPU
/// reference as `attention`: E2B's sliding and global heads, fewer keys than splits (empty
/// splits), a wrapped sliding ring with several tokens, splits of more than one 64-key tile, and
/// head dims that are not whole 64-lane rounds. Each case twice: q given, and q before its norm
/// and rope (the q-norm form: head_norm_rope's case of the same heads makes the strided raw q,
/// weights and rope table, and its CPU output is the reference's q).
#[test]
fn split_attention_matches_the_cpu_reference() {
    use super::norms::{HeadCase, RopeKind};
    use kestrel::kernels::runner::PARAMS2_AT;
    crate::each_runner(|h| {
        let a = AttnCase::new;
        let cases = [
            a(256, 8, 1, 1, 130, 512, 640),
            // 35 keys per split at head dim 256: several rounds of keys in flight and a partial one.
            a(256, 8, 1, 1, 1100, 0, 1101),
            a(512, 8, 1, 1, 600, 0, 602),
            a(32, 4, 1, 5, 0, 0, 16),
            a(32, 4, 1, 3, 200, 16, 18),
            a(64, 4, 2, 1, 2100, 0, 2101),
            a(64, 8, 2, 4, 70, 0, 80),
            // Head dims that leave lanes idle (40: one dim per lane on 40 lanes; 200: the fourth
            // dim on 8 lanes), more keys than one round of loads leaves in flight.
            a(40, 4, 1, 2, 90, 0, 100),
            a(200, 2, 1, 1, 70, 0, 80),
        ];
        for qnorm in [false, true] {
            for c in cases {
                let name = format!("{}{}", c.name(), if qnorm { " qnorm" } else { "" });
                let mut rng = Rng::new(seed_of(&name));
                let l = c.build(&mut rng, Want::Reference);
                let Check::F32 { want, tol } = &l.bufs[3].check else { unreachable!("attention's o is an f32 output") };
                let splits = ATTN_SPLITS as usize;
                let mut p: AttnParams = l.params_as();
                p.n_splits = ATTN_SPLITS;
                let mut params = bytemuck::bytes_of(&p).to_vec();
                let part = vec![0u8; 4 * c.tokens * c.heads * splits * (c.d + 2)];
                let mut bufs = vec![l.bufs[0].bytes.clone(), l.bufs[1].bytes.clone(), l.bufs[2].bytes.clone(), part];
                let mut want = want.clone();
                if qnorm {
                    // Sliding layers rotate every pair, full ones a quarter (Gemma 4's two ropes).
                    let rope = if c.window > 0 {
                        RopeKind::Default { theta: 10_000.0 }
                    } else {
                        RopeKind::Proportional { theta: 1_000_000.0, partial: 0.25 }
                    };
                    let hc = HeadCase { src_off: 3, src_pad: 5, ..HeadCase::new(c.d, c.heads, c.tokens, c.pos0, rope) };
                    let hl = hc.build(&mut rng, Want::Reference);
                    let Check::F32 { want: q_want, .. } = &hl.bufs[3].check else {
                        unreachable!("head_norm_rope's dst is an f32 output")
                    };
                    let q: Vec<f32> = q_want.iter().map(|v| v.expect("dst_mode 0 writes every value") as f32).collect();
                    let f = |b: &Buf| f32s(&b.bytes);
                    want = c.reference(&q, &f(&l.bufs[1]), &f(&l.bufs[2]));
                    let hp: HeadParams = hl.params_as();
                    let qp = QNormParams {
                        src_stride: hp.src_stride,
                        src_off: hp.src_off,
                        w_off: hp.w_off,
                        rope_off: hp.rope_off,
                        rope_stride: hp.rope_stride,
                        eps: hp.eps,
                        _pad: [0; 2],
                    };
                    bufs[0] = hl.bufs[0].bytes.clone();
                    bufs.extend([hl.bufs[1].bytes.clone(), hl.bufs[2].bytes.clone()]);
                    params.resize(PARAMS2_AT, 0);
                    params.extend_from_slice(bytemuck::bytes_of(&qp));
                }
                // Which rows attention_short takes (AttnParams::short_max): none (split + combine
                // alone), every row, and, with several tokens, the rows up to the middle one's key
                // count (all three kernels writing one output, each row once: a verify step's
                // program). The keys of the row at position P: P + 1 − first_key(P).
                let keys = |t: usize| {
                    let pos = c.pos0 + t;
                    (pos + 1 - if c.window > 0 && pos + 1 > c.window { pos + 1 - c.window } else { 0 }) as u32
                };
                let mut owners = vec![("split", 0), ("short", u32::MAX)];
                if c.tokens > 1 {
                    owners.push(("mixed", keys(c.tokens / 2)));
                }
                let limits = h.limits();
                for (form, short_max) in owners {
                    let p = AttnParams { short_max, ..p };
                    params[..std::mem::size_of::<AttnParams>()].copy_from_slice(bytemuck::bytes_of(&p));
                    let short_rows = (0..c.tokens).filter(|&t| keys(t) <= short_max).count();
                    let mut o = l.bufs[3].bytes.clone();
                    if short_rows < c.tokens {
                        let out = h
                            .run(
                                attention_split(c.d, qnorm),
                                &bufs,
                                &params,
                                l.step,
                                (c.heads as u32, ATTN_SPLITS, c.tokens as u32),
                            )
                            .unwrap();
                        o = h
                            .run(
                                Kernel::AttentionCombine,
                                &[out[3].clone(), o],
                                bytemuck::bytes_of(&p),
                                l.step,
                                (c.heads as u32, c.tokens as u32, 1),
                            )
                            .unwrap()
                            .swap_remove(1);
                    }
                    // The short kernel at the two largest workgroup sizes (512 the default, 1024),
                    // where the device's limits give them.
                    let mut forms: Vec<(String, Option<Kernel>)> = Vec::new();
                    for max_wg in [512, 1024] {
                        let k = attention_short_form(c.d, qnorm, max_wg, &limits);
                        // A device whose limits give both caps the same size runs it once.
                        if short_rows > 0 && !forms.iter().any(|f| f.1 == Some(k)) {
                            let Kernel::AttentionShort { wg, .. } = k else {
                                unreachable!("attention_short_form gives attention_short")
                            };
                            forms.push((format!(" wg{wg}"), Some(k)));
                        }
                    }
                    if forms.is_empty() {
                        forms.push((String::new(), None));
                    }
                    for (sum_form, kernel) in forms {
                        let mut o = o.clone();
                        if let Some(k) = kernel {
                            let mut sb = bufs.clone();
                            sb[3] = o;
                            o = h
                                .run(k, &sb, &params, l.step, (c.heads as u32, c.tokens as u32, 1))
                                .unwrap()
                                .swap_remove(3);
                        }
                        // POISON left in o (a row no kernel wrote, or one written twice and wrong) fails here.
                        let got: Vec<f32> = words(&o).into_iter().map(f32::from_bits).collect();
                        let (g, r): (Vec<f32>, Vec<f64>) =
                            want.iter().zip(&got).filter_map(|(w, &g)| w.map(|w| (g, w))).unzip();
                        match compare(&g, &r, *tol) {
                        Ok(nmse) => println!("split {name} {form}{sum_form} ({short_rows} of {} rows short) [{}]: o NMSE {nmse:.1e} OK", c.tokens, h.backend()),
                        Err(e) => panic!("split {name} {form}{sum_form}: {e}"),
                    }
                    }
                }
            }
        }
    });
}

/// Chunk attention on tensor cores (attention_coop.wgsl) on attention's cases whose head dim it
/// takes (a multiple of 64), and at full size: E4B's sliding layers (d 256, 8:2, window 512)
/// over a first 512-token chunk and a later one in a wrapped ring, E2B's global layers (d 512,
/// 8:1) over a longer context, and q ranges from near-uniform weights to weights so peaked that
/// the running maximum moves on most tiles (O rescaled). Needs f16 cooperative matrices, as
/// qmm_coop's test. Same tolerance as attention: the f16 halves leave ~2^-21 of each product
/// (attention_coop.wgsl), far inside tol::ATTN.
#[test]
#[ignore = "needs f16 cooperative matrices (tensor cores): run with --include-ignored on such a device"]
fn attention_coop_matches_the_cpu_reference() {
    crate::each_runner(|h| {
        assert!(h.coop_f16(), "{} has no f16 cooperative matrices: attention_coop cannot run here", h.describe());
        let mut cases: Vec<AttnCase> =
            attention_shapes().into_iter().filter(|c| attention_chunk_coop(c.d).is_some()).collect();
        let a = AttnCase::new;
        cases.extend([
            a(256, 8, 2, 512, 0, 512, 1023),
            a(256, 8, 2, 512, 700, 512, 1023),
            a(512, 8, 1, 300, 400, 0, 700),
        ]);
        for q_range in [0.01, 4.0, 16.0] {
            cases.extend(
                [a(256, 4, 1, 100, 50, 0, 150), a(64, 4, 2, 70, 30, 16, 85)].map(|c| AttnCase { q_range, ..c }),
            );
        }
        // Each case in both forms: the plain one, and the one that also writes the output's sums.
        let cases = cases
            .into_iter()
            .flat_map(|c| [false, true].map(|sums| Box::new(AttnCase { coop: true, sums, ..c }) as Box<dyn Case>));
        let failures = run_all(h, cases);
        assert!(failures.is_empty(), "{} attention_coop case(s) failed:\n{}", failures.len(), failures.join("\n"));
    });
}
