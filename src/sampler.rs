//! Choosing the next token from one row of logits. This module owns the sampling settings
//! ([`SamplerConfig`], with the command-line validation of them), the seeded sampler
//! ([`Sampler`]: repetition penalty, temperature, top-k, top-p, in `transformers`' order and
//! semantics) and [`argmax`], which the greedy path and the backends' CPU code share so that
//! ties and NaNs resolve the same way everywhere.

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use crate::error::{Error, Result};

/// Sampling settings. The default is greedy decoding.
#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// Softmax temperature; 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability adds up to at least `top_p`; 1.0 = off.
    pub top_p: f32,
    /// Penalise tokens already in the prompt or output (HF semantics); 1.0 = off.
    pub repetition_penalty: f32,
    /// Seed of the random stream; the same seed and inputs give the same tokens.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig { temperature: 0.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, seed: 0 }
    }
}

impl SamplerConfig {
    /// Checks the ranges; errors name the command-line flag to fix.
    pub fn validate(&self) -> Result<()> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(Error::Invalid(format!("--temp must be a finite number >= 0 (0 = greedy), got {t}")));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(Error::Invalid(format!("--top-p must be in (0, 1] (1 = off), got {p}")));
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(Error::Invalid(format!("--repetition-penalty must be a finite number > 0 (1 = off), got {r}")));
        }
        Ok(())
    }

    /// True when the choice is a plain argmax of the logits: no temperature, no penalty.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 && self.repetition_penalty == 1.0
    }
}

/// A seeded sampler. Random numbers are drawn only for non-greedy steps, so a run's stream
/// depends only on the seed and the sequence of sampled (non-greedy) steps.
pub struct Sampler {
    cfg: SamplerConfig,
    rng: ChaCha8Rng,
    /// Reused across calls: (token id, scaled logit) of the surviving candidates.
    cand: Vec<(u32, f64)>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

impl Sampler {
    /// A sampler whose random stream starts from `cfg.seed`.
    pub fn new(cfg: SamplerConfig) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        Sampler { cfg, rng, cand: Vec::new() }
    }

    /// The settings this sampler was built with.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Picks the next token.
    ///
    /// `logits`: one row over the vocabulary (modified in place). `history`: prompt + generated
    /// ids so far, for the repetition penalty (HF semantics: each distinct id in history:
    /// `logit > 0 ? logit / p : logit * p`; ids outside the row are ignored).
    ///
    /// Temperature 0 → argmax after the penalty (first index of the maximum, like
    /// `torch.argmax`). Otherwise: penalty, / temperature, top-k (ties with the k-th value are
    /// kept, like HF), top-p (HF `TopPLogitsWarper`: the smallest set whose cumulative
    /// probability reaches `top_p`, never empty), softmax in f64, one draw from the seeded
    /// stream. A row with no finite logit falls back to [`argmax`].
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        let cfg = &self.cfg;
        if cfg.repetition_penalty != 1.0 {
            apply_repetition_penalty(logits, history, cfg.repetition_penalty);
        }
        if cfg.temperature == 0.0 {
            return argmax(logits);
        }

        // Work in f64 from here: dividing by a tiny temperature must not overflow f32.
        let inv_t = 1.0 / f64::from(cfg.temperature);
        let cand = &mut self.cand;
        cand.clear();
        cand.extend(
            logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, f64::from(l) * inv_t)),
        );
        if cand.is_empty() {
            return argmax(logits);
        }
        let by_logit_desc = |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));

        if cfg.top_k > 0 && cfg.top_k < cand.len() {
            let k = cfg.top_k;
            cand.select_nth_unstable_by(k - 1, by_logit_desc);
            let kth = cand[k - 1].1;
            // HF removes only scores strictly below the k-th: ties with it survive.
            cand.retain(|c| c.1 >= kth);
        }
        // Descending order, index-stable: makes top-p and the draw deterministic.
        cand.sort_unstable_by(by_logit_desc);

        let max = cand[0].1;
        let mut probs: Vec<f64> = cand.iter().map(|c| (c.1 - max).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);

        let mut keep = probs.len();
        if cfg.top_p < 1.0 {
            // HF drops a token when the mass of it and everything less likely is <= 1 - top_p,
            // i.e. keeps token j while the mass strictly above it is < top_p.
            let top_p = f64::from(cfg.top_p);
            let mut above = 0.0;
            keep = 0;
            for &p in &probs {
                if keep > 0 && above >= top_p {
                    break;
                }
                above += p;
                keep += 1;
            }
        }

        let mass: f64 = probs[..keep].iter().sum();
        let u = unit_f64(&mut self.rng) * mass;
        let mut acc = 0.0;
        for (c, &p) in cand[..keep].iter().zip(&probs[..keep]) {
            acc += p;
            if u < acc {
                return c.0;
            }
        }
        // Rounding can leave u just above the last partial sum: that is the last kept token.
        cand[keep - 1].0
    }
}

/// HF `RepetitionPenaltyLogitsProcessor`: every distinct id in `history` once.
fn apply_repetition_penalty(logits: &mut [f32], history: &[u32], penalty: f32) {
    let mut seen = vec![false; logits.len()];
    for &id in history {
        let i = id as usize;
        if i < logits.len() && !seen[i] {
            seen[i] = true;
            let l = logits[i];
            logits[i] = if l > 0.0 { l / penalty } else { l * penalty };
        }
    }
}

/// A uniform double in [0, 1) from the top 53 bits of one u64.
fn unit_f64(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

pub use crate::reference::argmax;

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(temperature: f32, top_k: usize, top_p: f32, rep: f32, seed: u64) -> SamplerConfig {
        SamplerConfig { temperature, top_k, top_p, repetition_penalty: rep, seed }
    }

    /// A fixed, bumpy row of logits with a unique maximum at index 37.
    fn row() -> Vec<f32> {
        let mut v: Vec<f32> = (0..100).map(|i| ((i * 7919) % 97) as f32 / 20.0).collect();
        v[37] = 10.0;
        v
    }

    #[test]
    fn argmax_takes_first_of_ties_and_ignores_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN, 1.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 1);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn greedy_is_argmax_with_first_tie() {
        let mut s = Sampler::new(SamplerConfig::default());
        assert!(s.config().is_greedy());
        let mut l = vec![0.5, 2.0, -1.0, 2.0];
        assert_eq!(s.sample(&mut l, &[]), 1);
        let mut r = row();
        assert_eq!(s.sample(&mut r, &[]), 37);
    }

    #[test]
    fn top_k_one_is_argmax_at_any_temperature() {
        for &t in &[0.1f32, 1.0, 5.0, 100.0] {
            for seed in 0..20 {
                let mut s = Sampler::new(cfg(t, 1, 1.0, 1.0, seed));
                let mut r = row();
                assert_eq!(s.sample(&mut r, &[]), 37, "temp {t} seed {seed}");
            }
        }
    }

    #[test]
    fn tiny_top_p_is_argmax() {
        for seed in 0..50 {
            let mut s = Sampler::new(cfg(2.0, 0, 1e-6, 1.0, seed));
            let mut r = row();
            assert_eq!(s.sample(&mut r, &[]), 37, "seed {seed}");
        }
    }

    #[test]
    fn seed_determines_the_sequence() {
        let draw = |seed: u64| -> Vec<u32> {
            let mut s = Sampler::new(cfg(1.0, 0, 1.0, 1.0, seed));
            (0..64).map(|_| s.sample(&mut [0.0; 1000], &[])).collect()
        };
        assert_eq!(draw(7), draw(7));
        // 64 draws from 1000 equally likely tokens: identical streams by chance are ~1e-192.
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn repetition_penalty_flips_the_choice() {
        // Positive logits are divided: 2.0 / 1.2 = 1.67 < 1.9.
        let mut s = Sampler::new(cfg(0.0, 0, 1.0, 1.2, 0));
        assert!(!s.config().is_greedy());
        assert_eq!(s.sample(&mut [2.0, 1.9], &[]), 0);
        assert_eq!(s.sample(&mut [2.0, 1.9], &[0, 0, 5000]), 1);
        // Negative logits are multiplied: -1.0 * 1.2 = -1.2 < -1.1.
        assert_eq!(s.sample(&mut [-1.0, -1.1], &[0]), 1);
        // The same through the sampling path (top_k = 1 makes it deterministic).
        let mut s = Sampler::new(cfg(0.7, 1, 1.0, 1.2, 3));
        assert_eq!(s.sample(&mut [2.0, 1.9], &[0]), 1);
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_p() {
        // probs ≈ [0.643, 0.237, 0.087, 0.032]: top_p 0.7 keeps the first two.
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let mut seen = [false; 4];
        for seed in 0..400 {
            let mut s = Sampler::new(cfg(1.0, 0, 0.7, 1.0, seed));
            seen[s.sample(&mut logits.to_vec(), &[]) as usize] = true;
        }
        assert_eq!(seen, [true, true, false, false]);
    }

    #[test]
    fn frequencies_match_the_softmax() {
        let logits = [1.0f32, 2.0, 0.5];
        let m = logits.iter().map(|&l| f64::from(l).exp()).sum::<f64>();
        let exact: Vec<f64> = logits.iter().map(|&l| f64::from(l).exp() / m).collect();
        let n = 20_000;
        let mut counts = [0usize; 3];
        let mut s = Sampler::new(cfg(1.0, 0, 1.0, 1.0, 1234));
        for _ in 0..n {
            counts[s.sample(&mut logits.to_vec(), &[]) as usize] += 1;
        }
        // The standard error of a frequency is sqrt(p(1-p)/n) <= sqrt(0.25/20000) ≈ 0.0035, so
        // 0.02 is more than 5 sigma: a correct sampler essentially never fails this.
        for (c, p) in counts.iter().zip(&exact) {
            let f = *c as f64 / n as f64;
            assert!((f - p).abs() < 0.02, "frequency {f} vs probability {p}");
        }
    }

    #[test]
    fn non_finite_rows_fall_back_to_argmax() {
        let mut s = Sampler::new(cfg(1.0, 0, 1.0, 1.0, 0));
        assert_eq!(s.sample(&mut [f32::NEG_INFINITY, f32::NAN], &[]), 0);
        assert_eq!(s.sample(&mut [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY], &[]), 1);
    }

    #[test]
    fn validate_names_the_flag() {
        assert!(SamplerConfig::default().validate().is_ok());
        let bad = |c: SamplerConfig, flag: &str| {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(flag), "{e}");
        };
        bad(cfg(-1.0, 0, 1.0, 1.0, 0), "--temp");
        bad(cfg(f32::NAN, 0, 1.0, 1.0, 0), "--temp");
        bad(cfg(1.0, 0, 0.0, 1.0, 0), "--top-p");
        bad(cfg(1.0, 0, 1.5, 1.0, 0), "--top-p");
        bad(cfg(1.0, 0, 1.0, 0.0, 0), "--repetition-penalty");
    }
}
