//! Pipeline parallelism in the trainer: this rank runs one stage of a [`StagedModel`] over the
//! micro-batches of each step, in the order its [`PipelineSchedule`] gives, passing activations
//! forward and their gradients back to the neighbouring stages (sends are asynchronous;
//! receives block until the neighbour's message is there). Under the interleaved schedule the
//! model is cut into `v p` virtual stages and this rank runs `v` of them (chunk `c` is virtual
//! stage `c p + rank`); the last rank's chunk `c` hands its activations to the first rank's
//! chunk `c + 1`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use weft_core::storage::Storage;
use weft_core::Tensor;
use weft_dist::pipeline::{Action, PipelineSchedule};
use weft_dist::trace::span;
use weft_dist::{ProcessGroup, ReduceOp, Work};
use weft_models::StagedModel;

use crate::error::{Error, Result};

/// Tags of the two message streams between neighbouring stages.
const ACTIVATIONS: u32 = 0;
const GRADIENTS: u32 = 1;

/// This rank's stage of a pipeline.
pub struct Pipeline {
    model: Arc<dyn StagedModel>,
    group: ProcessGroup,
    schedule: PipelineSchedule,
    micro_batches: usize,
    ends: Option<ProcessGroup>,
    recompute: bool,
    /// The parameters this stage trains, and their storages (left out of activation bytes).
    params: Vec<(String, Tensor)>,
    param_storages: HashSet<*const Storage>,
    /// The stage (rank) that owns each of the model's parameters: the first that uses it.
    owners: BTreeMap<String, usize>,
    /// Parameters held by the first and the last stage (tied weights).
    shared: Vec<String>,
    /// What activations and their gradients travel between stages as (`parallel.pipeline_dtype`):
    /// f32 by default, or bf16, half the bytes, rounded on the way.
    wire: weft_core::DType,
    /// Under interleaving, where each chunk's parameters but the first's begin in `params`.
    chunk_starts: Vec<usize>,
}

/// A running count of the bytes the autograd graphs in flight hold together: each storage once
/// however many graphs reach it, a graph's storages walked once when it is added and forgotten
/// when it is removed (a step with many micro-batches in flight does not walk them all again at
/// every pass).
struct HeldGraphs {
    /// Per storage address: its bytes and how many held graphs reach it.
    storages: HashMap<usize, (usize, usize)>,
    /// The storages of the graph held at each slot.
    slots: Vec<Vec<(usize, usize)>>,
    total: usize,
}

impl HeldGraphs {
    fn new(slots: usize) -> HeldGraphs {
        HeldGraphs {
            storages: HashMap::new(),
            slots: vec![Vec::new(); slots],
            total: 0,
        }
    }

    /// The graph behind `out` held at `slot` (replacing what was there).
    fn add(&mut self, slot: usize, out: &Tensor, skip: &dyn Fn(&Tensor) -> bool) {
        self.remove(slot);
        let held = Tensor::graph_storages(std::slice::from_ref(out), skip);
        for &(addr, bytes) in &held {
            let e = self.storages.entry(addr).or_insert((bytes, 0));
            if e.1 == 0 {
                self.total += bytes;
            }
            e.1 += 1;
        }
        self.slots[slot] = held;
    }

    /// The graph at `slot` is gone (its backward ran).
    fn remove(&mut self, slot: usize) {
        for (addr, _) in std::mem::take(&mut self.slots[slot]) {
            if let Some(e) = self.storages.get_mut(&addr) {
                e.1 -= 1;
                if e.1 == 0 {
                    self.total -= e.0;
                    self.storages.remove(&addr);
                }
            }
        }
    }

    /// The held graphs' bytes, and the autocast copies the step's region keeps that no held
    /// graph reaches any more.
    fn bytes(&self, skip: &dyn Fn(&Tensor) -> bool) -> usize {
        let cached = Tensor::graph_storages(&weft_core::autocast_cached_casts(), skip);
        self.total
            + cached
                .iter()
                .filter(|(addr, _)| !self.storages.contains_key(addr))
                .map(|&(_, bytes)| bytes)
                .sum::<usize>()
    }
}

/// What a stage keeps of a micro-batch between its forward and its backward.
struct Live {
    input: Tensor,
    /// The recorded output; `None` when it is recomputed.
    output: Option<Tensor>,
    /// Where the dropout stream stood when the forward began.
    rng_offset: u64,
}

impl Pipeline {
    /// This rank's stage of `model` over `group` (the ranks holding the stages, in stage
    /// order; this rank's stage is its rank there), running `micro_batches` per step in
    /// `schedule`'s order. `ends` is, on the first and last stage, the group over which tied
    /// weights sum their gradients. With `recompute`, forwards run without recording and keep
    /// only their input; each backward first runs its forward again (with the dropout stream
    /// replayed), so a stage holds one micro-batch's activations at a time, for about one more
    /// forward each. Errors when the model cannot be cut into the group's stages.
    pub fn new(
        model: Arc<dyn StagedModel>,
        group: ProcessGroup,
        schedule: PipelineSchedule,
        micro_batches: usize,
        ends: Option<ProcessGroup>,
        recompute: bool,
    ) -> Result<Pipeline> {
        let stages = group.size();
        if let Some(why) = schedule.check(stages, micro_batches) {
            return Err(Error::Config(format!("parallel.schedule: {why}")));
        }
        let chunks = schedule.chunks();
        let virtual_stages = stages * chunks;
        let mut owners = BTreeMap::new();
        for v in (0..virtual_stages).rev() {
            for (name, _) in model.stage_parameters(v, virtual_stages)? {
                owners.insert(name, v % stages);
            }
        }
        // this rank's chunks' parameters, each once, and where each chunk's begin
        let mut params: Vec<(String, Tensor)> = Vec::new();
        let mut chunk_starts = Vec::new();
        for c in 0..chunks {
            if c > 0 {
                chunk_starts.push(params.len());
            }
            for (name, t) in model.stage_parameters(c * stages + group.rank(), virtual_stages)? {
                if !params.iter().any(|(n, _)| *n == name) {
                    params.push((name, t));
                }
            }
        }
        let param_storages = params.iter().map(|(_, p)| Arc::as_ptr(p.storage())).collect();
        let shared = model.shared_parameters();
        Ok(Pipeline {
            model,
            group,
            schedule,
            micro_batches,
            ends,
            recompute,
            wire: weft_core::DType::F32,
            chunk_starts,
            params,
            param_storages,
            owners,
            shared,
        })
    }

    /// The ranks holding the stages, in stage order.
    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    pub fn stage(&self) -> usize {
        self.group.rank()
    }

    pub fn stages(&self) -> usize {
        self.group.size()
    }

    fn is_first(&self) -> bool {
        self.stage() == 0
    }

    fn is_last(&self) -> bool {
        self.stage() + 1 == self.stages()
    }

    /// Model chunks this rank holds (its virtual stages: 1 but under interleaving).
    fn chunks(&self) -> usize {
        self.schedule.chunks()
    }

    /// This rank's chunk `c` as a virtual stage of all of them: `(index, count)`.
    fn virtual_stage(&self, c: usize) -> (usize, usize) {
        (c * self.stages() + self.stage(), self.stages() * self.chunks())
    }

    /// The ranks before and after this one around the ring of stages (under interleaving the
    /// last rank's chunk feeds the first rank's next chunk).
    fn prev_rank(&self) -> usize {
        (self.stage() + self.stages() - 1) % self.stages()
    }

    fn next_rank(&self) -> usize {
        (self.stage() + 1) % self.stages()
    }

    /// The parameters this stage trains.
    pub fn parameters(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// Where each of this rank's model chunks but the first begins in [`Pipeline::parameters`]
    /// (empty but under the interleaved schedule): a chunk's gradients are whole after its own
    /// last backward, so data parallelism reduces them in buckets of their own
    /// (`weft_dist::DdpOptions::bucket_breaks`).
    pub fn chunk_starts(&self) -> &[usize] {
        &self.chunk_starts
    }

    /// This pipeline with activations and their gradients sent between stages as `dtype` (f32,
    /// the default, or bf16: half the bytes, each value rounded to bf16 on the way, as
    /// Megatron-LM's `pipeline_dtype`); the receiver widens them back to the dtype the stage
    /// computes in.
    pub fn with_wire_dtype(mut self, dtype: weft_core::DType) -> Pipeline {
        self.wire = dtype;
        self
    }

    /// `t` as it travels to the next or previous stage.
    fn to_wire(&self, t: &Tensor) -> Result<Tensor> {
        Ok(if t.dtype() == self.wire {
            t.clone()
        } else {
            t.cast(self.wire)?
        })
    }

    /// What arrived in `buf`, in `dtype`.
    fn from_wire(buf: Tensor, dtype: weft_core::DType) -> Result<Tensor> {
        Ok(if buf.dtype() == dtype { buf } else { buf.cast(dtype)? })
    }

    /// Whether forwards run without recording and are rebuilt before their backward.
    pub fn recomputes(&self) -> bool {
        self.recompute
    }

    /// The micro-batches of `(x, y)`: `micro_batches` equal runs of rows.
    fn split(&self, t: &Tensor) -> Result<Vec<Tensor>> {
        let rows = t.shape().first().copied().unwrap_or(0);
        let m = self.micro_batches;
        if rows % m != 0 {
            return Err(Error::Config(format!(
                "parallel.micro_batches: {m} does not divide this rank's batch of {rows} rows"
            )));
        }
        (0..m)
            .map(|i| Ok(t.narrow(0, i * (rows / m), rows / m)?.contiguous_copy()?))
            .collect()
    }

    /// The forward and backward passes of one step (or of one of a step's accumulated batches)
    /// over the micro-batches of `(x, y)`; `backward(output, seed, last)` runs one
    /// micro-batch's backward (`last`: the final one of its chunk in this call, after which the
    /// gradients of that chunk's parameters are whole: data parallelism reduces them then, each
    /// chunk's once). Gradients accumulate over
    /// the micro-batches, each loss weighted `scale / m` (`scale`: 1, or `1/K` for one of `K`
    /// accumulated batches). Returns, on every stage, the mean loss over the micro-batches and
    /// the most activation bytes each stage held at once (the autograd graphs of the
    /// micro-batches between their forward and backward, parameters not counted), in stage
    /// order.
    pub fn run_step(
        &self,
        x: &Tensor,
        y: &Tensor,
        scale: f64,
        backward: &mut dyn FnMut(&Tensor, &Tensor, bool) -> Result<()>,
    ) -> Result<(f64, Vec<usize>)> {
        let is_param = |t: &Tensor| self.param_storages.contains(&Arc::as_ptr(t.storage()));
        let m = self.micro_batches;
        // under recompute, the input each (chunk, micro-batch) keeps, at `c * m + i`
        let (mut held, mut peak) = (vec![0usize; self.chunks() * m], 0usize);
        // the graphs held at `c * m + i`, counted together (micro-batches share their
        // parameters' autocast copies)
        let mut graphs = HeldGraphs::new(self.chunks() * m);
        let (xs, ys) = (self.split(x)?, self.split(y)?);
        let shape = self.model.activation_shape(xs[0].shape());
        let (stage, stages) = (self.stage(), self.stages());
        let mut live: Vec<Option<Live>> = (0..self.chunks() * m).map(|_| None).collect();
        let ctx = self.model.stage_context();
        let mut sends: Vec<Work> = Vec::new();
        let mut loss = 0.0;
        let actions = self.schedule.chunk_actions(stage, stages, m);
        for (c, action) in actions {
            let (vstage, vstages) = self.virtual_stage(c);
            let (first, last) = (vstage == 0, vstage + 1 == vstages);
            // what a span names: the micro-batch, and its chunk under interleaving
            let pass = |what: &str, i: usize| match self.chunks() {
                1 => format!("{what} {i}"),
                _ => format!("{what} {i} (chunk {c})"),
            };
            match action {
                Action::Forward(i) => {
                    let input = if first {
                        xs[i].clone()
                    } else {
                        let buf = Tensor::zeros(&shape, self.wire)?;
                        self.group.recv(&buf, self.prev_rank(), ACTIVATIONS)?.wait()?;
                        Self::from_wire(buf, weft_core::DType::F32)?.requires_grad_()?
                    };
                    let _s = span("compute", pass("forward", i));
                    let rng_offset = ctx.rng_offset();
                    let out = if self.recompute {
                        weft_core::no_grad(|| self.model.stage_forward(vstage, vstages, &input, &ys[i]))?
                    } else {
                        self.model.stage_forward(vstage, vstages, &input, &ys[i])?
                    };
                    if last {
                        loss += out.item()?;
                    } else {
                        sends.push(
                            self.group
                                .send(&self.to_wire(&out.detach())?, self.next_rank(), ACTIVATIONS)?,
                        );
                    }
                    let slot = c * m + i;
                    if self.recompute {
                        held[slot] = input.numel() * input.dtype().size_in_bytes();
                    } else {
                        graphs.add(slot, &out, &is_param);
                    }
                    let output = (!self.recompute).then_some(out);
                    live[slot] = Some(Live {
                        input,
                        output,
                        rng_offset,
                    });
                    peak = peak.max(graphs.bytes(&is_param) + held.iter().sum::<usize>());
                }
                Action::Backward(i) => {
                    let Live {
                        input,
                        output,
                        rng_offset,
                    } = live[c * m + i].take().ok_or_else(|| {
                        Error::Run(format!(
                            "pipeline: backward of {} before its forward",
                            pass("micro-batch", i)
                        ))
                    })?;
                    let out = match output {
                        Some(out) => out,
                        None => {
                            let _s = span("compute", pass("recompute", i));
                            let now = ctx.rng_offset();
                            ctx.set_rng_offset(rng_offset);
                            let out = self.model.stage_forward(vstage, vstages, &input, &ys[i]);
                            ctx.set_rng_offset(now);
                            let out = out?;
                            held[c * m + i] = 0;
                            graphs.add(c * m + i, &out, &is_param);
                            peak = peak.max(graphs.bytes(&is_param) + held.iter().sum::<usize>());
                            out
                        }
                    };
                    let seed = if last {
                        Tensor::from_vec(vec![scale / m as f64], &[])?.cast(out.dtype())?
                    } else {
                        let buf = Tensor::zeros(&shape, self.wire)?;
                        self.group.recv(&buf, self.next_rank(), GRADIENTS)?.wait()?;
                        Self::from_wire(buf, out.dtype())?
                    };
                    {
                        let _s = span("compute", pass("backward", i));
                        backward(&out, &seed, i + 1 == m)?;
                    }
                    held[c * m + i] = 0;
                    graphs.remove(c * m + i);
                    if !first {
                        let g = input
                            .grad()
                            .ok_or_else(|| Error::Run(format!("pipeline: stage {stage} got no input gradient")))?;
                        sends.push(self.group.send(&self.to_wire(&g)?, self.prev_rank(), GRADIENTS)?);
                    }
                }
            }
        }
        for w in sends {
            w.wait()?;
        }
        self.share(loss / m as f64, peak)
    }

    /// One all-reduce over the stages: the last stage's `loss`, and every stage's `bytes` in
    /// stage order, on every stage.
    fn share(&self, loss: f64, bytes: usize) -> Result<(f64, Vec<usize>)> {
        let mut v = vec![0.0f64; 1 + self.stages()];
        if self.is_last() {
            v[0] = loss;
        }
        v[1 + self.stage()] = bytes as f64;
        let t = Tensor::from_vec(v, &[1 + self.stages()])?;
        self.group.all_reduce(&t, ReduceOp::Sum)?.wait()?;
        let v = t.to_vec::<f64>()?;
        Ok((v[0], v[1..].iter().map(|&x| x as usize).collect()))
    }

    /// The loss of one batch through every stage (every chunk, in virtual-stage order),
    /// forward only (evaluation), on every stage.
    pub fn forward_loss(&self, x: &Tensor, y: &Tensor) -> Result<f64> {
        let mut loss = 0.0;
        for c in 0..self.chunks() {
            let (vstage, vstages) = self.virtual_stage(c);
            let input = if vstage == 0 {
                x.clone()
            } else {
                let buf = Tensor::zeros(&self.model.activation_shape(x.shape()), self.wire)?;
                self.group.recv(&buf, self.prev_rank(), ACTIVATIONS)?.wait()?;
                Self::from_wire(buf, weft_core::DType::F32)?
            };
            let out = self.model.stage_forward(vstage, vstages, &input, y)?;
            if vstage + 1 == vstages {
                loss = out.item()?;
            } else {
                self.group
                    .send(&self.to_wire(&out)?, self.next_rank(), ACTIVATIONS)?
                    .wait()?;
            }
        }
        Ok(self.share(loss, 0)?.0)
    }

    /// After the step's backwards: sums the gradients of weights tied across the first and
    /// last stage over those two stages.
    pub fn sum_shared_gradients(&self, params: &[(String, Tensor)]) -> Result<()> {
        let Some(ends) = &self.ends else {
            return Ok(());
        };
        for name in &self.shared {
            if let Some((_, p)) = params.iter().find(|(n, _)| n == name) {
                let g = p
                    .grad()
                    .ok_or_else(|| Error::Run(format!("pipeline: tied parameter {name:?} has no gradient")))?;
                ends.all_reduce(&g, ReduceOp::Sum)?.wait()?;
            }
        }
        Ok(())
    }

    /// Whether this stage counts `name` in the gradient norm: a tied weight is counted on the
    /// first stage only.
    pub fn counts_in_norm(&self, name: &str) -> bool {
        self.is_first() || !self.shared.iter().any(|n| n == name)
    }

    /// The stage that owns (trains, and writes to checkpoints) parameter `name`: the first
    /// that uses it.
    pub fn owner(&self, name: &str) -> Result<usize> {
        self.owners
            .get(name)
            .copied()
            .ok_or_else(|| Error::Run(format!("pipeline: no stage uses parameter {name:?}")))
    }
}
