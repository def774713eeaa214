//! Continuous batching of generation: each language-model version that generates has one
//! decode thread (started by its first generation request). Every step it runs all its running
//! sequences through one cached forward ([`LanguageModel::forward_cached`]): a new sequence
//! brings its prompt, the others one token each, so sequences join and leave the running batch
//! at every step and a short request never waits for a long one to end. At most
//! `max_sequences` run together; the rest wait in the thread's queue (holding their queue
//! places, so the model's `queue` still bounds what is admitted).
//!
//! Each sequence keeps its own random stream (one draw per token when sampling) and key/value
//! cache, so it draws the tokens it would draw alone, as `weft generate` does: checked on the
//! CPU, whose products give each row the same sums whatever rows run beside it. A backend whose
//! products change their summation order with the number of rows may move a logit by rounding,
//! which can change a token drawn at a near tie.
//!
//! A step that panics fails the sequences it was running and the thread goes on; a step whose
//! batched forward fails runs each sequence alone, so only the one that cannot run fails.

use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Weak};
use std::time::Instant;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::OwnedSemaphorePermit;
use weft_core::Generator;
use weft_models::{CachedTokens, KvCache, LanguageModel};

use crate::detok::{Detokenizer, StopText};
use crate::error::ApiError;
use crate::generation::{Finish, GenerateParams, Generated, Piece};
use crate::logprobs::TokenLogprob;
use crate::registry::{Admitted, Served};

/// A generation request waiting for, or in, its model's running batch.
pub(crate) struct DecodeJob {
    ids: Vec<i64>,
    params: GenerateParams,
    /// Its stop sequences (not empty strings).
    stop: Vec<String>,
    /// When the request arrived (the time to its first token is measured from here).
    arrived: Instant,
    /// When it was admitted (its time in the queue is measured from here).
    admitted_at: Instant,
    out: UnboundedSender<Piece>,
    /// Given back when the sequence ends, just before its last piece is sent (so a client
    /// that has its answer sees the place free): the version is not drained before.
    permit: Option<OwnedSemaphorePermit>,
}

impl DecodeJob {
    /// Ends the sequence: gives its queue place back, then sends `last` (`Done` or `Failed`).
    fn end(&mut self, last: Piece) {
        self.permit.take();
        let _ = self.out.send(last);
    }
}

/// Queues a generation of `params.max_tokens` tokens after the prompt `ids` (checked by the
/// caller), ended early by the first of the stop sequences `stop` that its text holds, on the
/// admitted model's decode thread. Its pieces arrive on the returned channel, the
/// last one `Done` or `Failed`; dropping the receiver ends the sequence at its next step.
pub(crate) fn submit(
    admitted: Admitted,
    ids: Vec<i64>,
    params: GenerateParams,
    stop: Vec<String>,
    arrived: Instant,
) -> UnboundedReceiver<Piece> {
    let Admitted { served, permit, at } = admitted;
    let (out, pieces) = unbounded_channel();
    let job = DecodeJob {
        ids,
        params,
        stop,
        arrived,
        admitted_at: at,
        out,
        permit: Some(permit),
    };
    let queue = served.decoder.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        let weak = Arc::downgrade(&served);
        let spawned = std::thread::Builder::new()
            .name(format!("weft-decode-{}", served.name))
            .spawn(move || run(weak, rx));
        if let Err(e) = spawned {
            // the queue's receiver is gone with the closure: every send below fails and says so
            weft_core::errln!(
                "model {} version {}: cannot start its decode thread: {e}",
                served.name,
                served.version
            );
        }
        tx
    });
    if let Err(std::sync::mpsc::SendError(mut job)) = queue.send(job) {
        job.end(Piece::Failed(ApiError::internal(format!(
            "model {} version {}: its decode thread is not running",
            served.name, served.version
        ))));
    }
    pieces
}

/// One sequence of the running batch.
struct Sequence {
    job: DecodeJob,
    /// The prompt and the tokens made so far.
    tokens: Vec<i64>,
    prompt_tokens: usize,
    cache: KvCache,
    rng: Generator,
    /// The ids to run at the next step.
    feed: Vec<i64>,
    /// Turns each new token into new text.
    detok: Detokenizer,
    /// Ends the text at a stop sequence, holding back what could start one.
    stops: StopText,
    /// The text sent so far.
    sent: String,
    /// With `logprobs`, each new token's; the first `logprobs_sent` went with a text piece.
    logprobs: Vec<TokenLogprob>,
    logprobs_sent: usize,
    /// Over: answered, failed, or its client left.
    done: bool,
}

impl Sequence {
    fn new(job: DecodeJob, lm: &dyn LanguageModel) -> Sequence {
        Sequence {
            tokens: job.ids.clone(),
            prompt_tokens: job.ids.len(),
            cache: lm.new_cache(),
            rng: Generator::new(job.params.seed),
            feed: Vec::new(),
            detok: Detokenizer::new(job.ids.len()),
            stops: StopText::new(job.stop.clone()),
            sent: String::new(),
            logprobs: Vec::new(),
            logprobs_sent: 0,
            done: false,
            job,
        }
    }

    /// Sets the ids of the next step: the whole (cropped) context at first and whenever it no
    /// longer fits in the cache (positions move, as for `weft generate`), else the newest token.
    fn next_feed(&mut self, block: usize) {
        if self.cache.is_empty() || self.cache.room() == 0 {
            self.cache.clear();
            self.feed = self.tokens[self.tokens.len().saturating_sub(block)..].to_vec();
        } else {
            self.feed = vec![self.tokens[self.tokens.len() - 1]];
        }
    }

    fn fail(&mut self, e: ApiError) {
        self.job.end(Piece::Failed(e));
        self.done = true;
    }
}

/// The decode thread of one model version: runs until the version is dropped (its queue's
/// sender goes with it) and nothing is running.
fn run(served: Weak<Served>, queue: Receiver<DecodeJob>) {
    let mut running: Vec<Sequence> = Vec::new();
    loop {
        let first = if running.is_empty() {
            match queue.recv() {
                Ok(job) => Some(job),
                Err(_) => return,
            }
        } else {
            None
        };
        let Some(s) = served.upgrade() else {
            let gone = |seq: &mut Sequence| seq.fail(ApiError::internal("the model version was unloaded"));
            running.iter_mut().for_each(gone);
            return;
        };
        let Some(lm) = s.lm.clone() else {
            // only language models are given generation requests
            return;
        };
        running.extend(first.map(|job| Sequence::new(job, lm.as_ref())));
        let cap = s.options.max_sequences.max(1);
        while running.len() < cap {
            match queue.try_recv() {
                Ok(job) => running.push(Sequence::new(job, lm.as_ref())),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        // a client that left costs no step; a request for no tokens is answered at once
        for seq in running.iter_mut().filter(|seq| seq.job.params.max_tokens == 0) {
            seq.job.end(Piece::Done(Generated {
                text: String::new(),
                prompt_tokens: seq.prompt_tokens,
                completion_tokens: 0,
                finish: Finish::Length,
                logprobs: Vec::new(),
            }));
            seq.done = true;
        }
        running.retain(|seq| !seq.done && !seq.job.out.is_closed());
        if running.is_empty() {
            continue;
        }
        // a panic fails the sequences of this step, not the thread: later requests still run
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            step(&s, lm.as_ref(), &mut running);
        }));
        if let Err(panic) = stepped {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            let e = ApiError::internal(format!(
                "model {} version {} failed while generating: {why}",
                s.name, s.version
            ));
            running.iter_mut().for_each(|seq| seq.fail(e.clone()));
        }
        running.retain(|seq| !seq.done);
    }
}

/// One decode step of every running sequence: one cached forward on the model's worker, one
/// token drawn for each, its new text sent, and the finished ones answered.
fn step(served: &Served, lm: &dyn LanguageModel, running: &mut [Sequence]) {
    let who = format!("model {} version {}", served.name, served.version);
    let Some(tok) = served.tokenizer.as_ref() else {
        let e = ApiError::internal(format!("{who} has no tokenizer"));
        running.iter_mut().for_each(|seq| seq.fail(e.clone()));
        return;
    };
    let block = lm.block_size();
    let starting: Vec<bool> = running.iter().map(|seq| seq.cache.is_empty()).collect();
    for seq in running.iter_mut() {
        seq.next_feed(block);
    }
    let rows = {
        let _worker = served.workers.acquire();
        for (seq, _) in running.iter().zip(&starting).filter(|(_, &s)| s) {
            served.stats.queue.observe(seq.job.admitted_at.elapsed().as_secs_f64());
        }
        let started = Instant::now();
        let rows = forward_rows(lm, running);
        served.stats.decode_step.observe(started.elapsed().as_secs_f64());
        served.stats.decode_batch.observe(running.len() as f64);
        rows
    };
    let limit = tok.vocab_size();
    for (seq, row) in running.iter_mut().zip(rows) {
        let row = match row {
            Ok(r) => r,
            Err(e) => {
                seq.fail(ApiError::internal(format!("{who}: {e}")));
                continue;
            }
        };
        let row = &row[..limit.min(row.len())];
        let sampling = &seq.job.params.sampling;
        let u = if sampling.temperature > 0.0 {
            let (seed, counter) = seq.rng.take(1);
            weft_core::rng::uniform(seed, counter)
        } else {
            0.0
        };
        let made = seq.tokens.len() - seq.prompt_tokens;
        let next = match sampling.choose(row, u) {
            Ok(t) => t as i64,
            Err(e) => {
                seq.fail(ApiError::internal(format!(
                    "{who}: new token {made}: {e} (do the model's weights hold NaN or infinity?)"
                )));
                continue;
            }
        };
        if let Some(k) = seq.job.params.logprobs {
            seq.logprobs.push(crate::logprobs::from_row(row, next as usize, k));
        }
        seq.tokens.push(next);
        let made = made + 1;
        served
            .stats
            .generated_tokens
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if made == 1 {
            served
                .stats
                .time_to_first_token
                .observe(seq.job.arrived.elapsed().as_secs_f64());
        }
        emit(seq, tok, made, &who);
    }
}

/// Each running sequence's logits of its last new token, `[vocab]`: one cached forward of all of
/// them, or, when that fails, one of each alone, so that a sequence that cannot run (its cache
/// no longer fits in memory) fails alone. Caches move on only when their forward succeeds.
fn forward_rows(lm: &dyn LanguageModel, running: &mut [Sequence]) -> Vec<weft_core::Result<Vec<f64>>> {
    let mut seqs: Vec<CachedTokens> = running
        .iter_mut()
        .map(|seq| CachedTokens {
            tokens: &seq.feed,
            cache: &mut seq.cache,
        })
        .collect();
    let n = seqs.len();
    match weft_core::no_grad(|| lm.forward_cached(&mut seqs)).and_then(|l| {
        let vocab = l.dim(1)?;
        Ok((l.to_vec_f64(), vocab))
    }) {
        Ok((all, vocab)) => (0..n).map(|i| Ok(all[i * vocab..(i + 1) * vocab].to_vec())).collect(),
        Err(e) if n == 1 => vec![Err(e)],
        Err(_) => seqs
            .iter_mut()
            .map(|one| {
                let mut alone = [CachedTokens {
                    tokens: one.tokens,
                    cache: &mut *one.cache,
                }];
                weft_core::no_grad(|| lm.forward_cached(&mut alone)).map(|l| l.to_vec_f64())
            })
            .collect(),
    }
}

/// Sends `seq`'s new text (once it decodes whole, and without what could start a stop
/// sequence) and, after its last token or at a stop sequence, the answer.
fn emit(seq: &mut Sequence, tok: &weft_data::Tokenizer, made: usize, who: &str) {
    let last = made >= seq.job.params.max_tokens;
    let new = match seq.detok.next(tok, &seq.tokens, last) {
        Ok(t) => t,
        Err(e) => return seq.fail(ApiError::internal(format!("{who}: {e}"))),
    };
    let (piece, stopped) = seq.stops.push(&new, last);
    if !piece.is_empty() {
        let logprobs = seq.logprobs[seq.logprobs_sent..].to_vec();
        seq.logprobs_sent = seq.logprobs.len();
        if seq.job.out.send(Piece::Text(piece.clone(), logprobs)).is_err() {
            // the client left
            seq.done = true;
            return;
        }
        seq.sent.push_str(&piece);
    }
    if last || stopped {
        let sent = std::mem::take(&mut seq.sent);
        let text = match stopped {
            true => sent,
            false => crate::detok::final_text(tok, &seq.tokens[seq.prompt_tokens..], sent),
        };
        seq.job.end(Piece::Done(Generated {
            text,
            prompt_tokens: seq.prompt_tokens,
            completion_tokens: made,
            finish: if stopped { Finish::Stop } else { Finish::Length },
            logprobs: std::mem::take(&mut seq.logprobs),
        }));
        seq.done = true;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use tokio::sync::Semaphore;
    use weft_models::gpt::{Gpt, GptConfig};
    use weft_models::Sampling;

    use super::*;
    use crate::metrics::ModelStats;
    use crate::model::{LoadOptions, Signature};

    const CORPUS: &str = "to be, or not to be: that is the question";

    /// A tiny gpt (block_size 16) with a character tokenizer, decoding up to `max_sequences`
    /// sequences together.
    fn served_gpt(max_sequences: usize) -> Arc<Served> {
        let tok = weft_data::TokenizerSpec::Char.load_with_corpus([CORPUS]).unwrap();
        let config = GptConfig {
            vocab_size: tok.vocab_size(),
            block_size: 16,
            n_layer: 2,
            n_head: 2,
            n_embd: 16,
            bias: true,
            dropout: 0.0,
            activation: weft_core::UnaryOp::Gelu,
        };
        let model = Arc::new(Gpt::new(config, 3).unwrap());
        Arc::new(Served {
            name: "g".into(),
            version: "1".into(),
            kind: "gpt",
            signature: Signature::Tokens {
                vocab: tok.vocab_size(),
                block: 16,
            },
            model: model.clone(),
            lm: Some(model),
            tokenizer: Some(tok),
            source: "g".into(),
            options: LoadOptions {
                max_sequences,
                ..LoadOptions::default()
            },
            load_seconds: 0.0,
            workers: crate::workers::Workers::new(1),
            admitted: Arc::new(Semaphore::new(64)),
            batcher: OnceLock::new(),
            decoder: OnceLock::new(),
            stats: ModelStats::default(),
        })
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
}
