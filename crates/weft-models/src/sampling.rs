//! Sampling: how a language model's next token is chosen from its last
//! logits as Hugging Face's `generate(do_sample=True)` draws it: the logits divided by the
//! temperature, then the top-k filter, then the top-p (nucleus) filter, then one draw from what
//! is left. Temperature 0 is greedy decoding (`do_sample=False`): the most likely token, no draw.

use weft_core::{Error, Result};

/// How the next token is chosen from the logits of the last position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Divides the logits before the softmax: below 1 sharpens the distribution, above 1
    /// flattens it. 0: greedy, the most likely token (the lowest id among equal ones).
    pub temperature: f64,
    /// Keeps the `top_k` largest logits (and any equal to the `top_k`-th), as `torch.topk` and
    /// Hugging Face's `TopKLogitsWarper`. 0: off.
    pub top_k: usize,
    /// Nucleus sampling: keeps the smallest set of most likely tokens whose probabilities (after
    /// temperature and top-k) add up to `top_p` or more; never fewer than one token. In `(0, 1]`;
    /// 1: off.
    pub top_p: f64,
}

impl Default for Sampling {
    /// Temperature 0.8, top-k 40, top-p off (nanoGPT's `sample.py`).
    fn default() -> Self {
        Sampling {
            temperature: 0.8,
            top_k: 40,
            top_p: 1.0,
        }
    }
}

pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::Invalid {
        op: "generate",
        msg: msg.into(),
    }
}

impl Sampling {
    /// Greedy decoding: the most likely token at every step.
    pub fn greedy() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
        }
    }

    /// Checks that `temperature` is finite and `>= 0` and `top_p` lies in `(0, 1]`.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(invalid(format!(
                "temperature {} must be a finite number >= 0 (0: greedy)",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(invalid(format!("top_p {} is outside (0, 1] (1: off)", self.top_p)));
        }
        Ok(())
    }

    /// The probability of each token given the logits of one position (`[V]`, any scale): the
    /// distribution a draw is made from, zero for every token a filter removed, summing to 1.
    /// Greedy: 1 for the first largest logit, 0 elsewhere. Errors on an empty or non-finite
    /// logit vector.
    pub fn probabilities(&self, logits: &[f64]) -> Result<Vec<f64>> {
        self.validate()?;
        if logits.is_empty() {
            return Err(invalid("no logits to choose a token from"));
        }
        if let Some((id, l)) = logits.iter().enumerate().find(|(_, l)| !l.is_finite()) {
            return Err(invalid(format!("the logit of token {id} is {l}")));
        }
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if self.temperature == 0.0 {
            let first = logits.iter().position(|&l| l == max).unwrap_or(0);
            let mut p = vec![0.0; logits.len()];
            p[first] = 1.0;
            return Ok(p);
        }
        // (l - max) / T rather than l / T - max: the same distribution, and no overflow for a
        // temperature near 0 (every scaled logit is <= 0, the largest exactly 0)
        let scaled: Vec<f64> = logits.iter().map(|l| (l - max) / self.temperature).collect();
        let mut weights: Vec<f64> = scaled.iter().map(|s| s.exp()).collect();
        if self.top_k > 0 && self.top_k < scaled.len() {
            let mut sorted = scaled.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let cut = sorted[self.top_k - 1];
            for (w, s) in weights.iter_mut().zip(&scaled) {
                if *s < cut {
                    *w = 0.0;
                }
            }
        }
        let mut probs = normalized(weights);
        if self.top_p < 1.0 {
            // most likely first; equal probabilities in id order
            let mut order: Vec<usize> = (0..probs.len()).collect();
            order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
            // a token is kept while the tokens before it hold less than top_p: the one that
            // brings the sum to top_p or past it is the last kept
            let mut before = 0.0;
            for &id in &order {
                if before < self.top_p {
                    before += probs[id];
                } else {
                    probs[id] = 0.0;
                }
            }
            probs = normalized(probs);
        }
        Ok(probs)
    }

    /// The token drawn from [`probabilities`](Self::probabilities) with `u`, a uniform number
    /// in `[0, 1)`: the first id whose cumulative probability exceeds `u` (never a token of
    /// probability 0). Greedy ignores `u`.
    pub fn choose(&self, logits: &[f64], u: f64) -> Result<usize> {
        let probs = self.probabilities(logits)?;
        let mut u = u;
        let mut last = 0;
        for (id, &p) in probs.iter().enumerate() {
            if p > 0.0 {
                if u < p {
                    return Ok(id);
                }
                u -= p;
                last = id;
            }
        }
        // the probabilities' rounding left u past their sum
        Ok(last)
    }
}

/// `weights / sum(weights)`; the sum is positive (the largest weight is 1, or one kept token's).
fn normalized(weights: Vec<f64>) -> Vec<f64> {
    let total: f64 = weights.iter().sum();
    weights.into_iter().map(|w| w / total).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpt::{Gpt, GptConfig};
    use crate::LanguageModel;
    use weft_core::{DType, Generator, Tensor};
    use weft_nn::Module;

    /// Logits whose softmax is `probs` (at temperature 1).
    fn logits_of(probs: &[f64]) -> Vec<f64> {
        probs.iter().map(|p| p.ln()).collect()
    }

    fn sampling(temperature: f64, top_k: usize, top_p: f64) -> Sampling {
        Sampling {
            temperature,
            top_k,
            top_p,
        }
    }

    fn assert_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
        }
    }

    // the distribution of most tests: probabilities 0.5, 0.25, 0.15, 0.1 (ids 0..4), given in
    // shuffled order (ids 2, 0, 3, 1) so that no filter can rely on the ids being sorted
    const P: [f64; 4] = [0.15, 0.5, 0.1, 0.25];

    #[test]
    fn temperature_divides_the_logits() {
        assert_close(&sampling(1.0, 0, 1.0).probabilities(&logits_of(&P)).unwrap(), &P);
        // T = 0.5 squares the probabilities: 0.0225, 0.25, 0.01, 0.0625 over 0.345
        let sq = [0.0225 / 0.345, 0.25 / 0.345, 0.01 / 0.345, 0.0625 / 0.345];
        assert_close(&sampling(0.5, 0, 1.0).probabilities(&logits_of(&P)).unwrap(), &sq);
        // T = 2 takes square roots
        let roots: Vec<f64> = P.iter().map(|p| p.sqrt()).collect();
        let sum: f64 = roots.iter().sum();
        let want: Vec<f64> = roots.iter().map(|r| r / sum).collect();
        assert_close(&sampling(2.0, 0, 1.0).probabilities(&logits_of(&P)).unwrap(), &want);
        // logits of any scale: a shift changes nothing, and a temperature near 0 does not overflow
        let shifted: Vec<f64> = logits_of(&P).iter().map(|l| l + 1e4).collect();
        assert_close(&sampling(1.0, 0, 1.0).probabilities(&shifted).unwrap(), &P);
        assert_close(
            &sampling(1e-300, 0, 1.0).probabilities(&logits_of(&P)).unwrap(),
            &[0.0, 1.0, 0.0, 0.0],
        );
    }

    #[test]
    fn top_k_keeps_the_k_largest() {
        // ids 1 (0.5) and 3 (0.25), renormalized: 2/3, 1/3
        let two = [0.0, 2.0 / 3.0, 0.0, 1.0 / 3.0];
        assert_close(&sampling(1.0, 2, 1.0).probabilities(&logits_of(&P)).unwrap(), &two);
        assert_close(
            &sampling(1.0, 1, 1.0).probabilities(&logits_of(&P)).unwrap(),
            &[0.0, 1.0, 0.0, 0.0],
        );
        // k >= V and k = 0 are off
        for k in [0, 4, 100] {
            assert_close(&sampling(1.0, k, 1.0).probabilities(&logits_of(&P)).unwrap(), &P);
        }
        // a tie at the k-th value keeps every tied token (torch.topk's threshold, `<` removes)
        let tied = logits_of(&[0.4, 0.2, 0.2, 0.2]);
        assert_close(
            &sampling(1.0, 2, 1.0).probabilities(&tied).unwrap(),
            &[0.4, 0.2, 0.2, 0.2],
        );
    }

    #[test]
    fn top_p_keeps_the_smallest_set_that_reaches_p() {
        let probs = |top_p| sampling(1.0, 0, top_p).probabilities(&logits_of(&P)).unwrap();
        // cumulative in order of probability: 0.5, 0.75, 0.9, 1.0
        // p = 0.3: the most likely token alone already reaches it
        assert_close(&probs(0.3), &[0.0, 1.0, 0.0, 0.0]);
        // p = 0.6: 0.5 is short of it, 0.5 + 0.25 reaches it
        assert_close(&probs(0.6), &[0.0, 2.0 / 3.0, 0.0, 1.0 / 3.0]);
        // p = 0.8: three tokens (0.9)
        assert_close(&probs(0.8), &[0.15 / 0.9, 0.5 / 0.9, 0.0, 0.25 / 0.9]);
        // p = 0.95: all four
        assert_close(&probs(0.95), &P);
        // a tiny p still keeps one token
        assert_close(&probs(1e-12), &[0.0, 1.0, 0.0, 0.0]);
        assert_close(&probs(1.0), &P);
    }

    #[test]
    fn filters_apply_temperature_then_top_k_then_top_p() {
        // temperature before top-p: at T = 0.5 the most likely token holds 0.25 / 0.345 = 0.725,
        // enough for p = 0.7 alone; at T = 1 it holds 0.5 and a second token is needed
        assert_close(
            &sampling(0.5, 0, 0.7).probabilities(&logits_of(&P)).unwrap(),
            &[0.0, 1.0, 0.0, 0.0],
        );
        assert_close(
            &sampling(1.0, 0, 0.7).probabilities(&logits_of(&P)).unwrap(),
            &[0.0, 2.0 / 3.0, 0.0, 1.0 / 3.0],
        );
        // top-k before top-p: top-k 3 leaves 0.5, 0.25, 0.15 renormalized to 5/9, 5/18, 1/6;
        // cumulative 5/9, 15/18: p = 0.8 is reached with two tokens (on the whole
        // distribution, 0.75 < 0.8 would take a third)
        assert_close(
            &sampling(1.0, 3, 0.8).probabilities(&logits_of(&P)).unwrap(),
            &[0.0, 2.0 / 3.0, 0.0, 1.0 / 3.0],
        );
        assert_close(
            &sampling(1.0, 0, 0.8).probabilities(&logits_of(&P)).unwrap(),
            &[0.15 / 0.9, 0.5 / 0.9, 0.0, 0.25 / 0.9],
        );
        // all three: T = 2 gives weights sqrt(p): 0.387, 0.707, 0.316, 0.5 (sum 1.910); top-k 3
        // drops id 2, leaving 0.707, 0.5, 0.387 over 1.594 = 0.444, 0.314, 0.243; p = 0.7
        // keeps the first two (0.444 < 0.7 <= 0.757)
        let (a, b) = (0.5f64.sqrt(), 0.25f64.sqrt());
        assert_close(
            &sampling(2.0, 3, 0.7).probabilities(&logits_of(&P)).unwrap(),
            &[0.0, a / (a + b), 0.0, b / (a + b)],
        );
    }

    #[test]
    fn greedy_takes_the_first_largest_logit() {
        let greedy = Sampling::greedy();
        for u in [0.0, 0.5, 0.999] {
            assert_eq!(greedy.choose(&logits_of(&P), u).unwrap(), 1);
        }
        assert_eq!(greedy.choose(&[1.0, 3.0, -2.0, 3.0], 0.7).unwrap(), 1);
        // greedy ignores the filters (its token survives all of them anyway)
        assert_eq!(sampling(0.0, 1, 0.1).choose(&[0.0, 0.0, 5.0], 0.3).unwrap(), 2);
    }

    #[test]
    fn a_draw_follows_the_cumulative_probabilities() {
        let s = sampling(1.0, 0, 0.8);
        // kept: id 0 (0.15/0.9), id 1 (0.5/0.9), id 3 (0.25/0.9); id 2 never
        let (c0, c1) = (0.15 / 0.9, 0.65 / 0.9);
        let l = logits_of(&P);
        assert_eq!(s.choose(&l, 0.0).unwrap(), 0);
        assert_eq!(s.choose(&l, c0 - 1e-9).unwrap(), 0);
        assert_eq!(s.choose(&l, c0 + 1e-9).unwrap(), 1);
        assert_eq!(s.choose(&l, c1 - 1e-9).unwrap(), 1);
        assert_eq!(s.choose(&l, c1 + 1e-9).unwrap(), 3);
        // past the sum by rounding: the last kept token, not the filtered id 2... nor a later one
        assert_eq!(s.choose(&l, 1.0).unwrap(), 3);
        assert_eq!(
            sampling(1.0, 2, 1.0).choose(&logits_of(&[0.3, 0.6, 0.1]), 1.0).unwrap(),
            1
        );
        // the frequencies of many draws match the probabilities
        let mut rng = Generator::new(7);
        let mut counts = [0usize; 4];
        let n = 40_000;
        for _ in 0..n {
            let (seed, c) = rng.take(1);
            counts[s.choose(&l, weft_core::rng::uniform(seed, c)).unwrap()] += 1;
        }
        let want = [0.15 / 0.9, 0.5 / 0.9, 0.0, 0.25 / 0.9];
        for (id, (&c, w)) in counts.iter().zip(want).enumerate() {
            let f = c as f64 / n as f64;
            assert!((f - w).abs() < 0.01, "token {id}: frequency {f}, probability {w}");
        }
    }

    #[test]
    fn bad_settings_and_logits_are_errors() {
        for (s, what) in [
            (sampling(-1.0, 0, 1.0), "temperature -1"),
            (sampling(f64::NAN, 0, 1.0), "temperature NaN"),
            (sampling(f64::INFINITY, 0, 1.0), "temperature inf"),
            (sampling(1.0, 0, 0.0), "top_p 0"),
            (sampling(1.0, 0, 1.5), "top_p 1.5"),
            (sampling(1.0, 0, f64::NAN), "top_p NaN"),
        ] {
            let e = s.probabilities(&[0.0, 1.0]).unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        }
        let e = Sampling::default()
            .choose(&[0.0, f64::NAN], 0.5)
            .unwrap_err()
            .to_string();
        assert!(e.contains("token 1 is NaN"), "{e}");
        assert!(Sampling::default().choose(&[], 0.5).is_err());
    }

    fn tiny_gpt() -> Gpt {
        let cfg = GptConfig {
            vocab_size: 11,
            block_size: 4,
            n_layer: 1,
            n_head: 2,
            n_embd: 8,
            bias: true,
            dropout: 0.0,
            activation: weft_core::UnaryOp::Gelu,
        };
        let g = Gpt::new(cfg, 3).unwrap();
        // larger weights than the initialisation's, so the logits differ clearly
        for (_, p) in g.parameters() {
            let v: Vec<f32> = (0..p.numel()).map(|i| ((i * 7919 % 61) as f32 - 30.0) / 10.0).collect();
            p.copy_from(&Tensor::from_vec(v, p.shape()).unwrap()).unwrap();
        }
        g
    }

    fn ids(v: &[i64]) -> Tensor {
        Tensor::from_vec(v.to_vec(), &[1, v.len()]).unwrap()
    }

    #[test]
    fn greedy_generation_appends_each_steps_argmax_cropping_to_block_size() {
        let g = tiny_gpt();
        let prompt = [3i64, 1, 4, 1, 5];
        let out = g
            .generate(&ids(&prompt), 6, &Sampling::greedy(), None, &mut Generator::new(0))
            .unwrap()
            .to_vec::<i64>()
            .unwrap();
        assert_eq!(out.len(), 11);
        assert_eq!(out[..5], prompt);
        let mut expected = prompt.to_vec();
        for _ in 0..6 {
            // the last block_size = 4 tokens
            let ctx = &expected[expected.len() - 4..];
            let logits = g.forward(&ids(ctx)).unwrap().to_vec_f64();
            let last = &logits[3 * 11..];
            let max = last.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            expected.push(last.iter().position(|&l| l == max).unwrap() as i64);
        }
        assert_eq!(out, expected);
        // top-k 1 and a tiny top-p are greedy too, whatever the seed
        for s in [sampling(1.0, 1, 1.0), sampling(0.7, 0, 1e-9)] {
            let o = g.generate(&ids(&prompt), 6, &s, None, &mut Generator::new(9)).unwrap();
            assert_eq!(o.to_vec::<i64>().unwrap(), expected);
        }
    }

    #[test]
    fn sampled_generation_is_seeded_and_stays_below_the_vocab_limit() {
        let g = tiny_gpt();
        let s = sampling(1e4, 0, 1.0);
        let run = |seed| {
            g.generate(&ids(&[1]), 200, &s, Some(3), &mut Generator::new(seed))
                .unwrap()
                .to_vec::<i64>()
                .unwrap()
        };
        let a = run(1);
        assert_eq!(a, run(1));
        assert_ne!(a, run(2));
        assert!(a[1..].iter().all(|&t| (0..3).contains(&t)), "{a:?}");
        assert!(
            (0..3).all(|t| a.contains(&t)),
            "a hot temperature draws every id: {a:?}"
        );
    }

    #[test]
    fn generation_refuses_bad_inputs_with_an_error() {
        let g = tiny_gpt();
        let mut rng = Generator::new(0);
        let s = Sampling::default();
        let empty = Tensor::from_vec(Vec::<i64>::new(), &[1, 0]).unwrap();
        assert!(g.generate(&empty, 1, &s, None, &mut rng).is_err());
        let two_rows = Tensor::from_vec(vec![1i64, 2], &[2, 1]).unwrap();
        assert!(g.generate(&two_rows, 1, &s, None, &mut rng).is_err());
        let e = g.generate(&ids(&[1]), usize::MAX, &s, None, &mut rng).unwrap_err();
        assert!(e.to_string().contains("do not fit in memory"), "{e}");
        assert!(g
            .generate(&ids(&[1]), 1, &sampling(-1.0, 0, 1.0), None, &mut rng)
            .is_err());
        // no token ever out of range
        assert!(g.generate(&ids(&[11]), 1, &s, None, &mut rng).is_err());
        assert!(g.generate(&ids(&[1]), 1, &s, Some(0), &mut rng).is_err());
        // weights holding NaN
        g.ln_f
            .weight
            .copy_from(&Tensor::full(&[8], f64::NAN, DType::F32).unwrap())
            .unwrap();
        let e = g.generate(&ids(&[1]), 3, &s, None, &mut rng).unwrap_err().to_string();
        assert!(e.contains("new token 0") && e.contains("NaN"), "{e}");
        // zero new tokens: the ids as they were
        let g = tiny_gpt();
        let same = g.generate(&ids(&[1, 2]), 0, &s, None, &mut rng).unwrap();
        assert_eq!(same.to_vec::<i64>().unwrap(), vec![1, 2]);
    }
}
