//! Tokens per second of generation with the key/value cache against the whole-context loop
//! (every new token runs the whole cropped context again, and only its last position through the
//! output layer), on a GPT of GPT-2's width and 6 layers with a 256-token block, greedy.
//!
//! `cargo run --release -p weft-models --example generate_speed [new_tokens] [repeats]`

use std::time::Instant;

use weft_core::{Generator, Tensor, UnaryOp};
use weft_models::gpt::{Gpt, GptConfig};
use weft_models::{CachedTokens, LanguageModel, Sampling};

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let new_tokens = args.first().copied().unwrap_or(200);
    let repeats = args.get(1).copied().unwrap_or(3).max(1);
    let block = 256;
    let g = Gpt::new(
        GptConfig {
            vocab_size: 50304,
            block_size: block,
            n_layer: 6,
            n_head: 12,
            n_embd: 768,
            bias: true,
            dropout: 0.0,
            activation: UnaryOp::GeluTanh,
        },
        0,
    )
    .expect("model");
    let prompt: Vec<i64> = (0..16).map(|i| (i * 97 + 5) % 50304).collect();
    let p = Tensor::from_vec(prompt.clone(), &[1, prompt.len()]).expect("prompt");
    let greedy = Sampling::greedy();
    // each token runs the model over the whole cropped context with a fresh cache, and only the
    // last position goes through the output layer (as transformers' generate does without its
    // cache: it asks for the last position's logits alone)
    let whole = |n: usize| -> Vec<i64> {
        weft_core::no_grad(|| {
            let mut tokens = prompt.clone();
            for _ in 0..n {
                let ctx = &tokens[tokens.len().saturating_sub(block)..];
                let mut cache = g.new_cache();
                let logits = g
                    .forward_cached(&mut [CachedTokens {
                        tokens: ctx,
                        cache: &mut cache,
                    }])
                    .and_then(|l| l.reshape(&[-1]))
                    .expect("forward")
                    .to_vec_f64();
                tokens.push(greedy.choose(&logits, 0.0).expect("choose") as i64);
            }
            tokens
        })
    };
    let mut ratios = Vec::new();
    for r in 0..repeats {
        let t = Instant::now();
        let cached = g
            .generate(&p, new_tokens, &greedy, None, &mut Generator::new(0))
            .and_then(|o| o.to_vec::<i64>())
            .expect("generate");
        let cached_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let plain = whole(new_tokens);
        let whole_s = t.elapsed().as_secs_f64();
        assert_eq!(cached, plain, "the two loops drew different tokens");
        println!(
            "run {r}: cached {:.1} tokens/s, whole context {:.1} tokens/s, {:.1}x",
            new_tokens as f64 / cached_s,
            new_tokens as f64 / whole_s,
            whole_s / cached_s
        );
        ratios.push(whole_s / cached_s);
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "median speed-up over {repeats} runs: {:.1}x ({new_tokens} new tokens after a 16-token prompt)",
        ratios[ratios.len() / 2]
    );
}
