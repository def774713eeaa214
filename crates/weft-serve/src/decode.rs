//! Continuous batching of generation: each language-model version that generates has one
//! decode thread (started by its first generation request). Every step it runs all its running
//! sequences through one cached forward ([`LanguageModel::forward_cached`]): a new sequence
//! brings its prompt, the others one token each, so sequences join and leave the running batch
//! at every step and a short request never waits for a long one to end. At most
//! `max_sequences` run together; the rest wait in the thread's queue (holding their queue
//! places, so the model's `queue` still bounds what is admitted).
//!
//! A prompt longer than the model's `prefill_chunk` ([`crate::model::LoadOptions`]) runs a chunk
//! of that many tokens per step while the other sequences go on decoding a token each, so that
//! it does not stall them for the whole prompt's forward; the sequence draws its first token after
//! its last chunk. The `n` completions of one prompt (OpenAI's `n`) run the prompt once: after
//! its last chunk its cache is copied into each completion ([`KvCache::fork`]), and each draws its
//! first token from the same logits with its own random stream.
//!
//! Each sequence keeps its own random stream (one draw per token when sampling) and key/value
//! cache, so it draws the tokens it would draw alone, as `weft generate` does: checked on the
//! CPU, whose products give each row the same sums whatever rows run beside it. A backend whose
//! products change their summation order with the number of rows may move a logit by rounding,
//! which can change a token drawn at a near tie. A chunked prompt is not bit for bit the whole
//! prompt's forward: the chunks after the first attend through the cache with the masked product
//! ([`weft_models`]' `kv_cache::attend`; a chunk of one token, the fused kernel without the
//! mask), not the fused causal kernel with its mask, whose row sums run in another order, and a
//! prompt of more than 64 tokens runs whole through other products than its chunks do
//! (docs/serving.md, "Chunked prefill").
//!
//! A step that panics fails the sequences it was running and the thread goes on; a step whose
//! batched forward fails runs each sequence alone, so only the one that cannot run fails.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Weak};
use std::time::Instant;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::OwnedSemaphorePermit;
use weft_core::Generator;
use weft_models::{CachedTokens, KvCache, LanguageModel};

use crate::detok::{Detokenizer, StopText};
use crate::error::ApiError;
use crate::generation::{Constraints, Finish, GenerateParams, Generated, Piece};
use crate::logprobs::TokenLogprob;
use crate::registry::{Admitted, Served};

/// A generation request waiting for, or in, its model's running batch.
pub(crate) struct DecodeJob {
    ids: Vec<i64>,
    params: GenerateParams,
    /// Its stop sequences (not empty strings), bad words and end token.
    constraints: Constraints,
    /// When the request arrived (the time to its first token is measured from here).
    arrived: Instant,
    /// When it was admitted (its time in the queue is measured from here).
    admitted_at: Instant,
    out: UnboundedSender<Piece>,
    /// Given back when the sequence ends, just before its last piece is sent (so a client
    /// that has its answer sees the place free): the version is not drained before.
    permit: Option<OwnedSemaphorePermit>,
    /// The further completions of the same prompt (their own parameters, seed, channel and
    /// queue place; their `ids` unused): the prompt runs once, for all of them.
    siblings: Vec<DecodeJob>,
}

impl DecodeJob {
    /// Ends the sequence: gives its queue place back, then sends `last` (`Done` or `Failed`).
    fn end(&mut self, last: Piece) {
        self.permit.take();
        let _ = self.out.send(last);
    }
}

/// Queues a generation of `params.max_tokens` tokens after the prompt `ids` (checked by the
/// caller), ended early by the first of the stop sequences of `constraints` that its text holds
/// or by its end token, and never drawing its bad words, on the admitted model's decode thread.
/// Its pieces arrive on the returned channel, the last one `Done` or `Failed`; dropping the
/// receiver ends the sequence at its next step.
pub(crate) fn submit(
    admitted: Admitted,
    ids: Vec<i64>,
    params: GenerateParams,
    constraints: impl Into<Constraints>,
    arrived: Instant,
) -> UnboundedReceiver<Piece> {
    let mut one = submit_group(vec![(admitted, params)], ids, constraints, arrived);
    one.pop().expect("one completion asked for")
}

/// Queues several completions of one prompt ([`submit`]), each with its queue place (all of one
/// model version) and its parameters (their seeds differ): the prompt runs once, and each
/// completion then draws what a request for it alone draws. One channel per completion, in order.
pub(crate) fn submit_group(
    asks: Vec<(Admitted, GenerateParams)>,
    ids: Vec<i64>,
    constraints: impl Into<Constraints>,
    arrived: Instant,
) -> Vec<UnboundedReceiver<Piece>> {
    let constraints = constraints.into();
    let mut receivers = Vec::with_capacity(asks.len());
    let mut jobs = Vec::with_capacity(asks.len());
    let mut version = None;
    for (admitted, params) in asks {
        let Admitted { served, permit, at } = admitted;
        let (out, pieces) = unbounded_channel();
        receivers.push(pieces);
        jobs.push(DecodeJob {
            ids: if jobs.is_empty() { ids.clone() } else { Vec::new() },
            params,
            constraints: constraints.clone(),
            arrived,
            admitted_at: at,
            out,
            permit: Some(permit),
            siblings: Vec::new(),
        });
        version.get_or_insert(served);
    }
    let (Some(served), false) = (version, jobs.is_empty()) else {
        return receivers;
    };
    let mut job = jobs.remove(0);
    job.siblings = jobs;
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
        let e = ApiError::internal(format!(
            "model {} version {}: its decode thread is not running",
            served.name, served.version
        ));
        for mut sibling in std::mem::take(&mut job.siblings) {
            sibling.end(Piece::Failed(e.clone()));
        }
        job.end(Piece::Failed(e));
    }
    receivers
}

/// One sequence of the running batch.
struct Sequence {
    job: DecodeJob,
    /// The prompt and the tokens made so far.
    tokens: Vec<i64>,
    prompt_tokens: usize,
    cache: KvCache,
    /// A completion forked from a prompt, until it first runs: the prompt's cache, one copy
    /// shared by all its completions still waiting for a place (each takes its own copy when it
    /// joins the running batch, the last one this copy itself), so waiting completions hold one
    /// cache between them rather than one each.
    snapshot: Option<Arc<KvCache>>,
    rng: Generator,
    /// Ids of the (cropped) context still to run before the next token is drawn: the prompt,
    /// or the context again once it slides past the cache, a chunk per step.
    prefill: Vec<i64>,
    /// The ids to run at the next step.
    feed: Vec<i64>,
    /// Whether its first step has run (its time in the queue is counted then).
    started: bool,
    /// The further completions of its prompt, forked from it once the prompt has run.
    siblings: Vec<DecodeJob>,
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
    fn new(mut job: DecodeJob, lm: &dyn LanguageModel) -> Sequence {
        let siblings = std::mem::take(&mut job.siblings);
        let mut seq = Sequence::of(job, lm.new_cache());
        seq.siblings = siblings;
        seq
    }

    /// `job`'s sequence before its first step: its prompt as its tokens, `cache` (empty), its
    /// own random stream.
    fn of(job: DecodeJob, cache: KvCache) -> Sequence {
        Sequence {
            tokens: job.ids.clone(),
            prompt_tokens: job.ids.len(),
            cache,
            snapshot: None,
            rng: Generator::new(job.params.seed),
            prefill: Vec::new(),
            feed: Vec::new(),
            started: false,
            siblings: Vec::new(),
            detok: Detokenizer::new(job.ids.len()),
            stops: StopText::new(job.constraints.stop.clone()),
            sent: String::new(),
            logprobs: Vec::new(),
            logprobs_sent: 0,
            done: false,
            job,
        }
    }

    /// Completion `job` of the same prompt, going on from this sequence once its prompt has
    /// run (before it draws its first token): the same tokens, the prompt's cache as the
    /// `snapshot` it copies when it first runs (`empty` until then), its own random stream.
    fn fork(&self, job: DecodeJob, snapshot: Arc<KvCache>, empty: KvCache) -> Sequence {
        let mut seq = Sequence::of(job, empty);
        seq.tokens = self.tokens.clone();
        seq.prompt_tokens = self.prompt_tokens;
        seq.detok = Detokenizer::new(self.prompt_tokens);
        seq.snapshot = Some(snapshot);
        seq.started = true;
        seq
    }

    /// Sets the ids of the next step and returns how many of them are context (prompt) ids:
    /// the whole (cropped) context at first and whenever it no longer fits in the cache
    /// (positions move, as for `weft generate`), `chunk` of its ids per step when `chunk > 0`;
    /// else the newest token.
    fn next_feed(&mut self, block: usize, chunk: usize) -> usize {
        if self.prefill.is_empty() && (self.cache.is_empty() || self.cache.room() == 0) {
            self.cache.clear();
            self.prefill = self.tokens[self.tokens.len().saturating_sub(block)..].to_vec();
        }
        if self.prefill.is_empty() {
            self.feed = vec![self.tokens[self.tokens.len() - 1]];
            return 0;
        }
        let take = match chunk {
            0 => self.prefill.len(),
            c => c.min(self.prefill.len()),
        };
        self.feed = self.prefill.drain(..take).collect();
        take
    }

    /// Fails the sequence, and the completions of its prompt not yet forked from it.
    fn fail(&mut self, e: ApiError) {
        for mut sibling in std::mem::take(&mut self.siblings) {
            sibling.end(Piece::Failed(e.clone()));
        }
        self.job.end(Piece::Failed(e));
        self.done = true;
    }

    /// Before its first step, a forked completion takes its own copy of its prompt's cache (the
    /// shared copy itself when no other completion waits on it); one that does not fit in
    /// memory fails alone.
    fn take_snapshot(&mut self, who: &str) {
        if let Some(shared) = self.snapshot.take() {
            match Arc::try_unwrap(shared).or_else(|shared| shared.fork()) {
                Ok(cache) => self.cache = cache,
                Err(e) => self.fail(ApiError::internal(format!("{who}: {e}"))),
            }
        }
    }

    /// Whether a client still reads it (or one of the completions to fork from it).
    fn wanted(&self) -> bool {
        !self.done && (!self.job.out.is_closed() || self.siblings.iter().any(|j| !j.out.is_closed()))
    }
}

/// The decode thread of one model version: runs until the version is dropped (its queue's
/// sender goes with it) and nothing is running.
fn run(served: Weak<Served>, queue: Receiver<DecodeJob>) {
    let mut running: Vec<Sequence> = Vec::new();
    // completions forked from a prompt that found the running batch full: they hold their
    // first token and wait for a place before anything new from the queue
    let mut ready: VecDeque<Sequence> = VecDeque::new();
    loop {
        let first = if running.is_empty() && ready.is_empty() {
            match queue.recv() {
                Ok(job) => Some(job),
                Err(_) => return,
            }
        } else {
            None
        };
        let Some(s) = served.upgrade() else {
            let gone = |seq: &mut Sequence| seq.fail(ApiError::internal("the model version was unloaded"));
            running.iter_mut().chain(ready.iter_mut()).for_each(gone);
            return;
        };
        let Some(lm) = s.lm.clone() else {
            // only language models are given generation requests
            return;
        };
        running.extend(first.map(|job| Sequence::new(job, lm.as_ref())));
        let cap = s.options.max_sequences.max(1);
        ready.retain(Sequence::wanted);
        while running.len() < cap {
            if let Some(seq) = ready.pop_front() {
                running.push(seq);
                continue;
            }
            match queue.try_recv() {
                Ok(job) => running.push(Sequence::new(job, lm.as_ref())),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        // a client that left costs no step; a request for no tokens is answered at once
        for seq in running.iter_mut().filter(|seq| seq.job.params.max_tokens == 0) {
            let nothing = || {
                Piece::Done(Generated {
                    text: String::new(),
                    prompt_tokens: seq.prompt_tokens,
                    completion_tokens: 0,
                    finish: Finish::Length,
                    logprobs: Vec::new(),
                })
            };
            for mut sibling in std::mem::take(&mut seq.siblings) {
                sibling.end(nothing());
            }
            seq.job.end(nothing());
            seq.done = true;
        }
        let who = format!("model {} version {}", s.name, s.version);
        running.iter_mut().for_each(|seq| seq.take_snapshot(&who));
        running.retain(Sequence::wanted);
        if running.is_empty() {
            continue;
        }
        // a panic fails the sequences of this step, not the thread: later requests still run
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step(&s, lm.as_ref(), &mut running)));
        let forked = match stepped {
            Ok(forked) => forked,
            Err(panic) => {
                fail_all(&s, &mut running, panic.as_ref());
                Vec::new()
            }
        };
        running.retain(|seq| !seq.done);
        // behind the completions already waiting: the next round fills the running batch from
        // `ready` in order, before the queue
        ready.extend(forked.into_iter().filter(|seq| !seq.done));
    }
}

/// Fails every sequence of a step that panicked with `panic`.
fn fail_all(s: &Served, running: &mut [Sequence], panic: &(dyn std::any::Any + Send)) {
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

/// One decode step of every running sequence: one cached forward on the model's worker, one
/// token drawn for each whose prompt has run whole, its new text sent, and the finished ones
/// answered. Returns the completions forked from prompts that ran their last chunk.
fn step(served: &Served, lm: &dyn LanguageModel, running: &mut [Sequence]) -> Vec<Sequence> {
    let who = format!("model {} version {}", served.name, served.version);
    let Some(tok) = served.tokenizer.as_ref() else {
        let e = ApiError::internal(format!("{who} has no tokenizer"));
        running.iter_mut().for_each(|seq| seq.fail(e.clone()));
        return Vec::new();
    };
    let block = lm.block_size();
    let chunk = served.options.prefill_chunk;
    let starting: Vec<bool> = running.iter().map(|seq| !seq.started).collect();
    let mut prefilled = 0;
    for seq in running.iter_mut() {
        prefilled += seq.next_feed(block, chunk);
        seq.started = true;
    }
    served
        .stats
        .prefill_tokens
        .fetch_add(prefilled as u64, std::sync::atomic::Ordering::Relaxed);
    let rows = {
        let _worker = served.workers.acquire();
        for (seq, _) in running.iter().zip(&starting).filter(|(_, &s)| s) {
            served.stats.queue.observe(seq.job.admitted_at.elapsed().as_secs_f64());
            for sibling in &seq.siblings {
                served.stats.queue.observe(sibling.admitted_at.elapsed().as_secs_f64());
            }
        }
        let started = Instant::now();
        let rows = forward_rows(lm, running);
        served.stats.decode_step.observe(started.elapsed().as_secs_f64());
        served.stats.decode_batch.observe(running.len() as f64);
        rows
    };
    let limit = tok.vocab_size();
    let mut forked = Vec::new();
    for (seq, row) in running.iter_mut().zip(rows) {
        let row = match row {
            Ok(r) => r,
            Err(e) => {
                seq.fail(ApiError::internal(format!("{who}: {e}")));
                continue;
            }
        };
        if !seq.prefill.is_empty() {
            // a chunk of its prompt: no token until the last one has run
            continue;
        }
        let row = &row[..limit.min(row.len())];
        // one copy of the prompt's cache for all its completions (each copies it again only
        // when it joins the running batch)
        let mut snapshot: Option<Arc<KvCache>> = None;
        for job in std::mem::take(&mut seq.siblings) {
            if job.out.is_closed() {
                continue;
            }
            if snapshot.is_none() {
                match seq.cache.fork() {
                    Ok(cache) => snapshot = Some(Arc::new(cache)),
                    Err(e) => {
                        // the copy does not fit in memory: that completion fails alone
                        let mut job = job;
                        job.end(Piece::Failed(ApiError::internal(format!("{who}: {e}"))));
                        continue;
                    }
                }
            }
            let shared = snapshot.clone().expect("made above");
            let mut sibling = seq.fork(job, shared, lm.new_cache());
            draw(served, tok, &who, &mut sibling, row);
            forked.push(sibling);
        }
        if seq.job.out.is_closed() {
            // its client left: only the completions forked from it go on
            seq.done = true;
        } else {
            draw(served, tok, &who, seq, row);
        }
    }
    forked
}

/// Draws `seq`'s next token from `row` (the logits of its last position, cut to the tokenizer's
/// vocabulary) with its own random stream, and sends what it makes.
fn draw(served: &Served, tok: &weft_data::Tokenizer, who: &str, seq: &mut Sequence, row: &[f64]) {
    let sampling = &seq.job.params.sampling;
    let u = if sampling.temperature > 0.0 {
        let (seed, counter) = seq.rng.take(1);
        weft_core::rng::uniform(seed, counter)
    } else {
        0.0
    };
    let made = seq.tokens.len() - seq.prompt_tokens;
    // bad words: the draw is made from the other tokens, in id order, which is a draw with
    // their logits at minus infinity (the sampler refuses infinite logits)
    let banned = seq.job.constraints.banned(&seq.tokens);
    let chosen = if banned.is_empty() {
        sampling.choose(row, u)
    } else {
        let kept: Vec<usize> = (0..row.len()).filter(|id| banned.binary_search(id).is_err()).collect();
        if kept.is_empty() {
            seq.fail(ApiError::bad_request(format!(
                "bad_words: every token is a bad word after new token {made}: nothing can be generated"
            )));
            return;
        }
        let logits: Vec<f64> = kept.iter().map(|&id| row[id]).collect();
        sampling.choose(&logits, u).map(|i| kept[i])
    };
    let next = match chosen {
        Ok(t) => t as i64,
        Err(e) => {
            seq.fail(ApiError::internal(format!(
                "{who}: new token {made}: {e} (do the model's weights hold NaN or infinity?)"
            )));
            return;
        }
    };
    if let Some(k) = seq.job.params.logprobs {
        seq.logprobs.push(crate::logprobs::from_row(row, next as usize, k));
    }
    // the end token ends the sequence and is not part of its text
    let ended = seq.job.constraints.end_ids.contains(&next);
    if !ended {
        seq.tokens.push(next);
    }
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
    emit(seq, tok, made, ended, who);
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
/// sequence) and, after its last token, at a stop sequence or when it drew its end token
/// (`ended`: the token is not among its tokens), the answer.
fn emit(seq: &mut Sequence, tok: &weft_data::Tokenizer, made: usize, ended: bool, who: &str) {
    let last = ended || made >= seq.job.params.max_tokens;
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
            finish: if stopped || ended { Finish::Stop } else { Finish::Length },
            logprobs: std::mem::take(&mut seq.logprobs),
        }));
        seq.done = true;
    }
}

#[cfg(test)]
mod tests;
