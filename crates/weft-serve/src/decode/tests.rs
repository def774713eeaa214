use weft_models::Sampling;

use super::*;
use crate::model::LoadOptions;

/// A tiny gpt (block_size 16) with a character tokenizer, decoding up to `max_sequences`
/// sequences together, prompts whole.
fn served_gpt(max_sequences: usize) -> Arc<Served> {
    served_gpt_chunked(max_sequences, 0)
}

/// [`served_gpt`] running prompts in chunks of `prefill_chunk` tokens (0: whole).
fn served_gpt_chunked(max_sequences: usize, prefill_chunk: usize) -> Arc<Served> {
    Arc::new(crate::model::test_gpt_with(LoadOptions {
        max_sequences,
        prefill_chunk,
        ..LoadOptions::default()
    }))
}

/// A request: the prompt's ids, new tokens, temperature (0: greedy) and seed.
fn request(s: &Served, prompt: &str, tokens: usize, temperature: f64, seed: u64) -> (Vec<i64>, GenerateParams) {
    let ids = s.tokenizer.as_ref().unwrap().encode(prompt).unwrap();
    let params = GenerateParams {
        max_tokens: tokens,
        sampling: Sampling {
            temperature,
            top_k: 0,
            top_p: 1.0,
        },
        seed,
        logprobs: None,
    };
    (ids.into_iter().map(i64::from).collect(), params)
}

/// Every piece of one generation until its answer; the text pieces must add up to it.
fn answer(mut pieces: UnboundedReceiver<Piece>) -> Generated {
    let mut streamed = String::new();
    loop {
        match pieces.blocking_recv() {
            Some(Piece::Text(t, _)) => streamed.push_str(&t),
            Some(Piece::Done(g)) => {
                assert_eq!(streamed, g.text);
                return g;
            }
            Some(Piece::Failed(e)) => panic!("{}", e.message),
            None => panic!("the decode thread stopped"),
        }
    }
}

fn submit_one(s: &Arc<Served>, ids: &[i64], params: GenerateParams) -> UnboundedReceiver<Piece> {
    submit(
        Admitted::new(s).unwrap(),
        ids.to_vec(),
        params,
        Vec::new(),
        Instant::now(),
    )
}

#[test]
fn sequences_join_and_leave_the_running_batch_drawing_what_they_draw_alone() {
    let s = served_gpt(8);
    // a long one passing block_size (its context slides), then three short ones
    let requests = [
        request(&s, "to be", 30, 0.8, 1),
        request(&s, "not", 3, 0.0, 0),
        request(&s, "the question", 4, 1.0, 9),
        request(&s, "o", 2, 0.5, 4),
    ];
    let alone: Vec<Generated> = requests
        .iter()
        .map(|(ids, p)| answer(submit_one(&s, ids, *p)))
        .collect();
    let (steps_alone, _) = s.stats.decode_batch.snapshot();
    assert_eq!(steps_alone, 39, "one step per token when alone");
    // all four queued while the worker is held: the short ones join the long one's batch
    let worker = s.workers.acquire();
    let mut pending: Vec<Option<UnboundedReceiver<Piece>>> =
        requests.iter().map(|(ids, p)| Some(submit_one(&s, ids, *p))).collect();
    drop(worker);
    let mut finished = Vec::new();
    let mut together: Vec<Option<Generated>> = vec![None; 4];
    while finished.len() < 4 {
        for (i, slot) in pending.iter_mut().enumerate() {
            if let Some(rx) = slot.as_mut() {
                match rx.try_recv() {
                    Ok(Piece::Done(g)) => {
                        together[i] = Some(g);
                        finished.push(i);
                        *slot = None;
                    }
                    Ok(Piece::Failed(e)) => panic!("{}", e.message),
                    Ok(Piece::Text(..)) | Err(_) => {}
                }
            }
        }
        std::thread::yield_now();
    }
    for (i, g) in together.into_iter().enumerate() {
        assert_eq!(g.as_ref(), Some(&alone[i]), "request {i}");
    }
    // the long one, admitted first, ends last: the short ones did not wait for it
    assert_eq!(finished.last(), Some(&0), "{finished:?}");
    let (steps, sequences) = s.stats.decode_batch.snapshot();
    let steps_together = steps - steps_alone;
    assert!(steps_together <= 31, "{steps_together} steps for 39 tokens");
    assert_eq!(sequences as u64, 39 + 39, "every token counted once per step");
    assert_eq!(s.queue_depth(), 0, "every queue place was given back");
}

#[test]
fn at_most_max_sequences_run_together_and_a_client_that_leaves_ends_its_sequence() {
    let s = served_gpt(2);
    let worker = s.workers.acquire();
    let pending: Vec<_> = (0..4)
        .map(|i| {
            let (ids, p) = request(&s, "be", 5, 0.0, i);
            submit_one(&s, &ids, p)
        })
        .collect();
    // a fifth whose client leaves at once
    let (ids, p) = request(&s, "to", 14, 0.0, 0);
    drop(submit_one(&s, &ids, p));
    drop(worker);
    for rx in pending {
        assert_eq!(answer(rx).completion_tokens, 5);
    }
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while s.queue_depth() > 0 && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(s.queue_depth(), 0, "the left sequence gave its place back");
    let (steps, sequences) = s.stats.decode_batch.snapshot();
    // 4 x 5 tokens two at a time and at most one token of the left one
    assert!(
        sequences <= 21.0 && steps >= 10,
        "{steps} steps, {sequences} sequence-steps"
    );
    assert!(sequences / steps as f64 <= 2.0);
}

#[test]
fn a_stop_sequence_ends_the_sequence_before_max_tokens() {
    let s = served_gpt(8);
    let (ids, p) = request(&s, "to be", 30, 0.8, 2);
    let full = answer(submit_one(&s, &ids, p));
    assert_eq!((full.completion_tokens, full.finish), (30, Finish::Length));
    let stop: String = full.text.chars().skip(12).take(2).collect();
    let at = full.text.find(&stop).unwrap();
    let rx = submit(Admitted::new(&s).unwrap(), ids, p, vec![stop.clone()], Instant::now());
    let cut = answer(rx);
    assert_eq!(cut.text, full.text[..at]);
    assert_eq!(cut.finish, Finish::Stop);
    // one token a character: the sequence ended with the stop's last token
    assert_eq!(cut.completion_tokens, full.text[..at].chars().count() + 2);
    assert_eq!(s.queue_depth(), 0);
}

/// The context tokens the decode steps ran.
fn prefilled(s: &Served) -> u64 {
    s.stats.prefill_tokens.load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn n_completions_run_their_prompt_once_and_draw_what_each_draws_alone() {
    // 2 running at most: two of the four forked completions wait for a place
    for max_sequences in [8, 2] {
        let s = served_gpt(max_sequences);
        // 6 + 6 tokens: the context does not slide past block_size
        let (ids, p) = request(&s, "not to", 6, 0.9, 11);
        let seeds = [11, 12, 13, 14];
        let alone: Vec<Generated> = seeds
            .iter()
            .map(|&seed| answer(submit_one(&s, &ids, GenerateParams { seed, ..p })))
            .collect();
        assert_eq!(prefilled(&s), 4 * ids.len() as u64, "each alone runs its prompt");
        assert!(alone.iter().any(|g| g.text != alone[0].text), "{alone:?}");
        let (steps_alone, _) = s.stats.decode_batch.snapshot();
        let asks = seeds
            .iter()
            .map(|&seed| (Admitted::new(&s).unwrap(), GenerateParams { seed, ..p }))
            .collect();
        let together: Vec<Generated> = submit_group(asks, ids.clone(), Vec::new(), Instant::now())
            .into_iter()
            .map(answer)
            .collect();
        assert_eq!(together, alone, "max_sequences {max_sequences}");
        assert_eq!(
            prefilled(&s),
            5 * ids.len() as u64,
            "the four completions ran their prompt once"
        );
        let (steps, sequences) = s.stats.decode_batch.snapshot();
        // one step of the prompt, then 5 more tokens each, at most max_sequences a step
        let rows = sequences as u64 - 4 * 6;
        assert_eq!(rows, 1 + 4 * 5, "max_sequences {max_sequences}");
        let want_steps = if max_sequences >= 4 { 6 } else { 1 + 10 };
        assert_eq!(steps - steps_alone, want_steps, "max_sequences {max_sequences}");
        assert_eq!(s.queue_depth(), 0, "every queue place was given back");
    }
}

#[test]
fn completions_whose_clients_left_are_not_forked() {
    let s = served_gpt(8);
    let (ids, p) = request(&s, "to be", 4, 0.7, 3);
    let asks = (0..3)
        .map(|i| (Admitted::new(&s).unwrap(), GenerateParams { seed: 3 + i, ..p }))
        .collect();
    let worker = s.workers.acquire();
    let mut rxs = submit_group(asks, ids.clone(), Vec::new(), Instant::now());
    // the first (whose sequence runs the prompt) and the third leave before it runs
    drop(rxs.remove(2));
    drop(rxs.remove(0));
    drop(worker);
    let kept = answer(rxs.pop().unwrap());
    let alone = answer(submit_one(&s, &ids, GenerateParams { seed: 4, ..p }));
    assert_eq!(kept, alone);
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while s.queue_depth() > 0 && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(s.queue_depth(), 0);
    assert_eq!(s.stats.generated_tokens.load(std::sync::atomic::Ordering::Relaxed), 8);
}

#[test]
fn a_chunked_prompt_lets_the_others_decode_and_draws_its_first_token_after_its_last_chunk() {
    let long = "to be, or not"; // 13 tokens: chunks of 4, 4, 4 and 1
    for chunk in [0, 4] {
        let s = served_gpt_chunked(8, chunk);
        let (short_ids, short) = request(&s, "o", 3, 0.0, 0);
        let (long_ids, long_p) = request(&s, long, 1, 0.0, 0);
        let worker = s.workers.acquire();
        let short_rx = submit_one(&s, &short_ids, short);
        let long_rx = submit_one(&s, &long_ids, long_p);
        // both join by the second step (the worker was held while they were sent)
        drop(worker);
        assert_eq!(answer(short_rx).completion_tokens, 3);
        let got = answer(long_rx);
        let (steps, rows) = s.stats.decode_batch.snapshot();
        assert_eq!(prefilled(&s), 14, "chunk {chunk}");
        if chunk == 0 {
            // the long prompt runs whole in one step and draws its token there
            assert_eq!(rows, 3.0 + 1.0, "chunk {chunk}");
        } else {
            // its 4 chunks take 4 steps, the short one's 3 tokens running beside them
            assert_eq!(rows, 3.0 + 4.0, "chunk {chunk}");
            assert!((4..=5).contains(&steps), "chunk {chunk}: {steps} steps");
        }
        // greedy: the same tokens as the prompt whole (see the logits test below)
        let want = answer(submit_one(&served_gpt(8), &long_ids, long_p));
        assert_eq!(got, want, "chunk {chunk}");
    }
}

/// The logits of a prompt's last position run whole and in chunks of `chunk` (each after
/// the cached ones).
fn whole_and_chunked(lm: &dyn LanguageModel, ids: &[i64], chunk: usize) -> (Vec<f64>, Vec<f64>) {
    let run = |parts: Vec<&[i64]>| {
        let mut cache = lm.new_cache();
        let mut last = Vec::new();
        for part in parts {
            let l = weft_core::no_grad(|| {
                lm.forward_cached(&mut [CachedTokens {
                    tokens: part,
                    cache: &mut cache,
                }])
            })
            .unwrap();
            last = l.to_vec_f64();
        }
        last
    };
    (run(vec![ids]), run(ids.chunks(chunk).collect()))
}

#[test]
fn chunked_prompts_give_the_whole_prompts_logits_within_rounding() {
    let s = served_gpt(8);
    let tok = s.tokenizer.as_ref().unwrap();
    let llama = weft_models::llama::Llama::new(
        weft_models::llama::LlamaConfig {
            vocab_size: tok.vocab_size(),
            block_size: 16,
            n_layer: 2,
            n_head: 4,
            n_kv_head: 2,
            n_embd: 16,
            intermediate_size: 32,
            rope_theta: weft_models::llama::LlamaConfig::DEFAULT_ROPE_THETA,
            rope_scaling: None,
            norm_eps: weft_models::llama::LlamaConfig::DEFAULT_NORM_EPS,
            tie_embeddings: false,
            qkv_bias: false,
            head_dim: None,
            qk_norm: false,
            padding_idx: None,
        },
        5,
    )
    .unwrap();
    let ids: Vec<i64> = tok
        .encode("to be, or not to b")
        .unwrap()
        .into_iter()
        .take(16)
        .map(i64::from)
        .collect();
    let models: [(&str, &dyn LanguageModel); 2] = [("gpt", s.lm.as_ref().unwrap().as_ref()), ("llama", &llama)];
    for (name, lm) in models {
        let (mut bitwise, mut largest) = (0, 0.0f64);
        for chunk in 1..ids.len() {
            let (whole, chunked) = whole_and_chunked(lm, &ids, chunk);
            let worst = whole
                .iter()
                .zip(&chunked)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(worst <= 1e-6, "{name}, chunk {chunk}: logits differ by {worst}");
            bitwise += usize::from(worst == 0.0);
            largest = largest.max(worst);
            let argmax = |r: &[f64]| (0..r.len()).max_by(|&a, &b| r[a].total_cmp(&r[b])).unwrap();
            assert_eq!(argmax(&whole), argmax(&chunked), "{name}, chunk {chunk}");
        }
        eprintln!(
            "{name}: {bitwise} of {} chunk sizes gave the same bits; the largest difference {largest:e}",
            ids.len() - 1
        );
    }
}
