//! Generation's key/value cache: a cached forward gives the logits a whole-sequence forward
//! gives at the last position (one token at a time, several new tokens after cached ones, and
//! several sequences of different lengths in one call), and cached generation draws the tokens
//! the whole-context loop draws, past `block_size` too.

use weft_core::{Generator, Tensor, UnaryOp};
use weft_models::gpt::{Gpt, GptConfig};
use weft_models::llama::{Llama, LlamaConfig};
use weft_models::{CachedTokens, LanguageModel, Sampling};
use weft_nn::Module;

const VOCAB: usize = 23;
const BLOCK: usize = 12;

/// Weights spread wider than the initialisation's, so that logits differ clearly between
/// positions (a cache bug then moves them well past rounding).
fn spread(m: &dyn Module) {
    for (i, (_, p)) in m.parameters().into_iter().enumerate() {
        let v: Vec<f32> = (0..p.numel())
            .map(|j| (((j * 7919 + i * 131) % 61) as f32 - 30.0) / 40.0)
            .collect();
        p.copy_from(&Tensor::from_vec(v, p.shape()).unwrap()).unwrap();
    }
}

fn gpt() -> Gpt {
    gpt_of_block(BLOCK)
}

fn gpt_of_block(block_size: usize) -> Gpt {
    let g = Gpt::new(
        GptConfig {
            vocab_size: VOCAB,
            block_size,
            n_layer: 2,
            n_head: 2,
            n_embd: 16,
            bias: true,
            dropout: 0.0,
            activation: UnaryOp::Gelu,
        },
        5,
    )
    .unwrap();
    spread(&g);
    g
}

/// Grouped-query (4 query heads on 2 key/value heads) or plain, tied or not.
fn llama(n_kv_head: usize, tie: bool) -> Llama {
    llama_of_block(n_kv_head, tie, BLOCK)
}

fn llama_of_block(n_kv_head: usize, tie: bool, block_size: usize) -> Llama {
    llama_with(n_kv_head, tie, block_size, None)
}

/// With `head_dim`, Qwen3's attention: heads of that width and an RMSNorm over each query and
/// key head (weights spread away from ones, so that they matter).
fn llama_with(n_kv_head: usize, tie: bool, block_size: usize, head_dim: Option<usize>) -> Llama {
    let l = Llama::new(
        LlamaConfig {
            vocab_size: VOCAB,
            block_size,
            n_layer: 2,
            n_head: 4,
            n_kv_head,
            n_embd: 16,
            intermediate_size: 24,
            rope_theta: 10000.0,
            rope_scaling: None,
            norm_eps: 1e-5,
            tie_embeddings: tie,
            qkv_bias: false,
            head_dim,
            qk_norm: head_dim.is_some(),
            padding_idx: None,
        },
        6,
    )
    .unwrap();
    spread(&l);
    l
}

fn models() -> Vec<(&'static str, Box<dyn LanguageModel>)> {
    vec![
        ("gpt", Box::new(gpt())),
        ("llama gqa", Box::new(llama(2, false))),
        ("llama tied", Box::new(llama(4, true))),
        ("llama qwen3", Box::new(llama_with(2, false, BLOCK, Some(6)))),
    ]
}

/// The whole-sequence forward's logits at the last position of `ids`.
fn last_logits(m: &dyn LanguageModel, ids: &[i64]) -> Vec<f64> {
    let x = Tensor::from_vec(ids.to_vec(), &[1, ids.len()]).unwrap();
    let all = m.forward_ids(&x).unwrap().to_vec_f64();
    all[(ids.len() - 1) * VOCAB..].to_vec()
}

fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * scale,
            "{what}: logit {i}: cached {g} vs whole {w}"
        );
    }
}

fn seq(n: usize, salt: i64) -> Vec<i64> {
    (0..n as i64).map(|i| (i * 7 + salt * 3 + 1) % VOCAB as i64).collect()
}

#[test]
fn one_token_at_a_time_matches_the_whole_sequence() {
    for (name, m) in models() {
        let ids = seq(BLOCK, 1);
        let mut cache = m.new_cache();
        weft_core::no_grad(|| {
            for t in 0..BLOCK {
                let got = m
                    .forward_cached(&mut [CachedTokens {
                        tokens: &ids[t..t + 1],
                        cache: &mut cache,
                    }])
                    .unwrap();
                assert_eq!(got.shape(), &[1, VOCAB]);
                assert_close(
                    &format!("{name} position {t}"),
                    &got.to_vec_f64(),
                    &last_logits(&*m, &ids[..=t]),
                );
            }
        });
        assert_eq!(cache.len(), BLOCK);
        assert!(cache.bytes() > 0);
        // a full cache takes no more
        let e = m
            .forward_cached(&mut [CachedTokens {
                tokens: &[1],
                cache: &mut cache,
            }])
            .unwrap_err()
            .to_string();
        assert!(e.contains("exceed block_size 12"), "{name}: {e}");
    }
}

#[test]
fn caches_grow_by_doubling_and_keep_what_they_held() {
    // block_size 64: the buffers start at 16 positions and grow to 32 and 64 on the way
    let models: Vec<(&str, Box<dyn LanguageModel>)> = vec![
        ("gpt", Box::new(gpt_of_block(64))),
        ("llama gqa", Box::new(llama_of_block(2, false, 64))),
    ];
    for (name, m) in models {
        let ids = seq(50, 6);
        let mut cache = m.new_cache();
        let mut sizes = Vec::new();
        let mut at = 0;
        for len in [5, 14, 17, 29, 33, 50] {
            let got = m
                .forward_cached(&mut [CachedTokens {
                    tokens: &ids[at..len],
                    cache: &mut cache,
                }])
                .unwrap();
            assert_close(
                &format!("{name} up to {len}"),
                &got.to_vec_f64(),
                &last_logits(&*m, &ids[..len]),
            );
            sizes.push(cache.bytes());
            at = len;
        }
        // 16, 16, 32, 32, 64, 64 positions of 2 layers' keys and values (f32)
        let per_position = 2 * 2 * 16 / if name == "gpt" { 1 } else { 2 } * 4;
        let want: Vec<usize> = [16, 16, 32, 32, 64, 64].iter().map(|p| p * per_position).collect();
        assert_eq!(sizes, want, "{name}");
    }
}

#[test]
fn a_prompt_then_several_new_tokens_after_cached_ones() {
    for (name, m) in models() {
        let ids = seq(10, 2);
        let mut cache = m.new_cache();
        for (from, to) in [(0, 4), (4, 7), (7, 8), (8, 10)] {
            let got = m
                .forward_cached(&mut [CachedTokens {
                    tokens: &ids[from..to],
                    cache: &mut cache,
                }])
                .unwrap();
            assert_close(
                &format!("{name} up to {to}"),
                &got.to_vec_f64(),
                &last_logits(&*m, &ids[..to]),
            );
        }
    }
}

#[test]
fn sequences_of_different_lengths_run_together() {
    for (name, m) in models() {
        let (a, b, c) = (seq(9, 3), seq(5, 4), seq(7, 5));
        let (mut ca, mut cb, mut cc) = (m.new_cache(), m.new_cache(), m.new_cache());
        // prompts of different lengths in one call, then decode steps joined by one prompt
        let out = m
            .forward_cached(&mut [
                CachedTokens {
                    tokens: &a[..6],
                    cache: &mut ca,
                },
                CachedTokens {
                    tokens: &b[..2],
                    cache: &mut cb,
                },
            ])
            .unwrap();
        assert_eq!(out.shape(), &[2, VOCAB]);
        let rows = out.to_vec_f64();
        assert_close(&format!("{name} a prompt"), &rows[..VOCAB], &last_logits(&*m, &a[..6]));
        assert_close(&format!("{name} b prompt"), &rows[VOCAB..], &last_logits(&*m, &b[..2]));
        for step in 0..3 {
            let out = m
                .forward_cached(&mut [
                    CachedTokens {
                        tokens: &a[6 + step..7 + step],
                        cache: &mut ca,
                    },
                    CachedTokens {
                        tokens: &b[2 + step..3 + step],
                        cache: &mut cb,
                    },
                    CachedTokens {
                        tokens: if step == 0 { &c[..5] } else { &c[4 + step..5 + step] },
                        cache: &mut cc,
                    },
                ])
                .unwrap()
                .to_vec_f64();
            let c_to = if step == 0 { 5 } else { 5 + step };
            assert_close(
                &format!("{name} a step {step}"),
                &out[..VOCAB],
                &last_logits(&*m, &a[..7 + step]),
            );
            assert_close(
                &format!("{name} b step {step}"),
                &out[VOCAB..2 * VOCAB],
                &last_logits(&*m, &b[..3 + step]),
            );
            assert_close(
                &format!("{name} c step {step}"),
                &out[2 * VOCAB..],
                &last_logits(&*m, &c[..c_to]),
            );
        }
        assert_eq!((ca.len(), cb.len(), cc.len()), (9, 5, 7));
    }
}

/// What generation did before the cache: the whole (cropped) context through the model for
/// every new token.
fn generate_whole(m: &dyn LanguageModel, prompt: &[i64], n: usize, s: &Sampling, seed: u64) -> Vec<i64> {
    let mut rng = Generator::new(seed);
    let mut tokens = prompt.to_vec();
    for _ in 0..n {
        let ctx = &tokens[tokens.len().saturating_sub(BLOCK)..];
        let last = last_logits(m, ctx);
        let u = if s.temperature > 0.0 {
            let (seed, counter) = rng.take(1);
            weft_core::rng::uniform(seed, counter)
        } else {
            0.0
        };
        tokens.push(s.choose(&last, u).unwrap() as i64);
    }
    tokens
}

#[test]
fn cached_generation_draws_the_whole_context_loops_tokens_past_block_size() {
    let sampled = Sampling {
        temperature: 0.9,
        top_k: 0,
        top_p: 1.0,
    };
    for (name, m) in models() {
        for (s, seed) in [(Sampling::greedy(), 0), (sampled, 4), (sampled, 11)] {
            let prompt = seq(5, seed as i64);
            // 5 + 20 tokens: the context passes block_size 12 and slides
            let got = m
                .generate(
                    &Tensor::from_vec(prompt.clone(), &[1, 5]).unwrap(),
                    20,
                    &s,
                    None,
                    &mut Generator::new(seed),
                )
                .unwrap()
                .to_vec::<i64>()
                .unwrap();
            assert_eq!(
                got,
                generate_whole(&*m, &prompt, 20, &s, seed),
                "{name}, {s:?}, seed {seed}"
            );
        }
    }
}

#[test]
fn bad_sequences_are_named() {
    let m = gpt();
    let mut cache = m.new_cache();
    let err = |m: &Gpt, seqs: &mut [CachedTokens]| m.forward_cached(seqs).unwrap_err().to_string();
    assert!(err(&m, &mut []).contains("at least one sequence"));
    assert!(err(
        &m,
        &mut [CachedTokens {
            tokens: &[],
            cache: &mut cache
        }]
    )
    .contains("sequence 0 has no new tokens"));
    let e = err(
        &m,
        &mut [CachedTokens {
            tokens: &[1, 23],
            cache: &mut cache,
        }],
    );
    assert!(e.contains("token id 23 is outside the vocabulary"), "{e}");
    let long = seq(BLOCK + 1, 0);
    let e = err(
        &m,
        &mut [CachedTokens {
            tokens: &long,
            cache: &mut cache,
        }],
    );
    assert!(e.contains("0 cached + 13 new positions exceed block_size 12"), "{e}");
    // a failed call leaves the cache as it was
    assert!(cache.is_empty());
    let mut three = weft_models::KvCache::new(3, BLOCK);
    let e = err(
        &m,
        &mut [CachedTokens {
            tokens: &[1],
            cache: &mut three,
        }],
    );
    assert!(e.contains("cache has 3 layers, the model 2"), "{e}");
}
