//! A layout: how a job's devices and its batch are shared out (weft's `[parallel]` keys).

/// Pipeline schedule (`parallel.schedule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// Every forward, then every backward: a stage holds all `m` micro-batches.
    GPipe,
    /// `p - 1 - s` warm-up forwards on stage `s`, then one forward and one backward in turn:
    /// stage `s` holds at most `min(p - s, m)` micro-batches.
    OneFOneB,
    /// Interleaved 1F1B over this many model chunks per stage (Megatron-LM's virtual stages,
    /// `weft_dist::pipeline::PipelineSchedule::Interleaved`): `m >= p` micro-batches in groups
    /// of `p` or more (what `m mod p` leaves over shared out); the chunk passes of stage `s`
    /// after `(p - 1 - s) 2 + (v - 1) g` warm-up forwards alternate, `g` the largest group.
    Interleaved(usize),
}

impl Schedule {
    pub fn name(self) -> &'static str {
        match self {
            Schedule::GPipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
            Schedule::Interleaved(_) => "interleaved",
        }
    }

    /// Model chunks per stage: `v` interleaved, else 1.
    pub fn chunks(self) -> usize {
        match self {
            Schedule::Interleaved(v) => v,
            _ => 1,
        }
    }

    /// Passes whose activations stage `stage` of `stages` holds at once with `m` micro-batches
    /// (`weft_dist::pipeline::PipelineSchedule::peak_in_flight`): micro-batches, or under
    /// interleaving (chunk, micro-batch) passes.
    pub fn in_flight(self, stage: usize, stages: usize, m: usize) -> usize {
        match self {
            Schedule::GPipe => m,
            Schedule::OneFOneB => (stages - stage).min(m),
            Schedule::Interleaved(_) => {
                let (mut live, mut peak) = (0usize, 0usize);
                for (_, forward) in self.chunk_order(stage, stages, m) {
                    if forward {
                        live += 1;
                        peak = peak.max(live);
                    } else {
                        live -= 1;
                    }
                }
                peak
            }
        }
    }

    /// The chunk of each pass of stage `stage` in order, with whether it is a forward, under
    /// the interleaved schedule (empty for the others, whose [`Schedule::in_flight`] has a closed
    /// form): the runtime's order, `weft_dist::pipeline::PipelineSchedule::chunk_actions`, which
    /// this crate does not depend on; `weft_train::plan_shape`'s tests hold the two equal.
    pub fn chunk_order(self, stage: usize, stages: usize, m: usize) -> Vec<(usize, bool)> {
        let Schedule::Interleaved(v) = self else {
            return Vec::new();
        };
        let (p, total) = (stages, m * v);
        // each group runs through chunk 0, then chunk 1, ...
        let groups = interleaved_groups(p, m);
        let forwards: Vec<usize> = groups
            .iter()
            .flat_map(|&g| (0..v).flat_map(move |c| std::iter::repeat_n(c, g)))
            .collect();
        let chunk = |k: usize, forward: bool| if forward { forwards[k] } else { v - 1 - forwards[k] };
        let largest = GroupSizes::of(p, m).largest();
        let warmup = if m == p {
            total
        } else {
            ((p - 1 - stage) * 2 + (v - 1) * largest).min(total)
        };
        let mut out: Vec<(usize, bool)> = (0..warmup).map(|k| (chunk(k, true), true)).collect();
        for k in 0..total - warmup {
            out.push((chunk(warmup + k, true), true));
            out.push((chunk(k, false), false));
        }
        out.extend((total - warmup..total).map(|k| (chunk(k, false), false)));
        out
    }
}

/// The interleaved schedule's groups of micro-batches, with `p` stages and `m` micro-batches, in
/// order: `m / p` groups of `p`, what `m mod p` leaves over shared out as evenly as it goes, the
/// first groups taking one more (`weft_dist::pipeline::interleaved_groups`; one group of `m`
/// when `m < p`, which the runtime refuses).
pub fn interleaved_groups(p: usize, m: usize) -> Vec<usize> {
    let g = GroupSizes::of(p, m);
    let mut out = vec![g.larger; g.larger_count];
    out.resize(g.count, g.smaller);
    out
}

/// [`interleaved_groups`] without listing them: `larger_count` groups of `larger` first, then
/// groups of `smaller` (`larger = smaller + 1`; `larger_count` is 0 when `m` shares out evenly),
/// `count` in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupSizes {
    pub count: usize,
    pub larger_count: usize,
    pub larger: usize,
    pub smaller: usize,
}

impl GroupSizes {
    pub fn of(p: usize, m: usize) -> GroupSizes {
        match m / p {
            0 => GroupSizes {
                count: 1,
                larger_count: 0,
                larger: m,
                smaller: m,
            },
            n => GroupSizes {
                count: n,
                larger_count: (m % p) % n,
                larger: p + (m % p) / n + 1,
                smaller: p + (m % p) / n,
            },
        }
    }

    /// The largest group (what the warm-up must cover).
    pub fn largest(&self) -> usize {
        if self.larger_count > 0 {
            self.larger
        } else {
            self.smaller
        }
    }
}

/// Dtype of ZeRO's parameter gathers and (stages 2 and 3) gradient reduce-scatters
/// (`parallel.comm_dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CommDtype {
    F32,
    Bf16,
}

impl CommDtype {
    pub fn bytes(self) -> f64 {
        match self {
            CommDtype::F32 => 4.0,
            CommDtype::Bf16 => 2.0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CommDtype::F32 => "f32",
            CommDtype::Bf16 => "bf16",
        }
    }
}

/// One point of the search space.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    pub dp: usize,
    pub tp: usize,
    pub pp: usize,
    /// ZeRO stage 0-3 across the `dp` ranks.
    pub zero: usize,
    /// Micro-batches per step on each data-parallel replica (1 without a pipeline).
    pub micro_batches: usize,
    pub schedule: Schedule,
    pub recompute: bool,
    pub comm_dtype: CommDtype,
    /// What pipeline stages send each other, activations and their gradients
    /// (`parallel.pipeline_dtype`; f32 without a pipeline).
    pub pipeline_dtype: CommDtype,
    /// Sequence parallelism across the `tp` ranks (`parallel.sequence_parallel`; only with
    /// `tp > 1`).
    pub sequence_parallel: bool,
    /// Blocks per pipeline stage, in stage order (`[n_layer]` without a pipeline; interleaved,
    /// the sums of each stage's virtual stages: [`Layout::config_stage_blocks`] gives those).
    pub stage_blocks: Vec<usize>,
}

impl Layout {
    /// `parallel.stage_blocks` of this layout: blocks per stage, or interleaved, per virtual
    /// stage (`pp x chunks` of them, the even cut the search assumed).
    pub fn config_stage_blocks(&self) -> Vec<usize> {
        match self.schedule {
            Schedule::Interleaved(v) => crate::search::virtual_stage_blocks(self.stage_blocks.iter().sum(), self.pp, v),
            _ => self.stage_blocks.clone(),
        }
    }

    /// Devices the layout uses.
    pub fn devices(&self) -> usize {
        self.dp * self.tp * self.pp
    }

    /// `dp2 tp4 pp8 zero1 m16 1f1b sp rc bf16 p2p-bf16` (`interleaved-v2` for two chunks a
    /// stage; `sp`: sequence-parallel; `bf16`: ZeRO's `comm_dtype`; `p2p-bf16`: the pipeline's
    /// sends): the layout in one short word list.
    pub fn label(&self) -> String {
        let schedule = match self.schedule {
            Schedule::Interleaved(v) => format!("interleaved-v{v}"),
            s => s.name().to_string(),
        };
        let mut s = format!(
            "dp{} tp{} pp{} zero{} m{} {schedule}",
            self.dp, self.tp, self.pp, self.zero, self.micro_batches,
        );
        if self.sequence_parallel {
            s.push_str(" sp");
        }
        if self.recompute {
            s.push_str(" rc");
        }
        if self.comm_dtype == CommDtype::Bf16 {
            s.push_str(" bf16");
        }
        if self.pipeline_dtype == CommDtype::Bf16 {
            s.push_str(" p2p-bf16");
        }
        s
    }

    /// Whether nothing is rounded on its way between ranks beyond what the run computes in:
    /// ZeRO's gathers and reductions and the pipeline's sends in f32 (what
    /// `parallel.auto` chooses among).
    pub fn communicates_in_f32(&self) -> bool {
        self.comm_dtype == CommDtype::F32 && self.pipeline_dtype == CommDtype::F32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_follows_the_schedules() {
        assert_eq!(Schedule::GPipe.in_flight(0, 4, 8), 8);
        assert_eq!(Schedule::OneFOneB.in_flight(0, 4, 8), 4);
        assert_eq!(Schedule::OneFOneB.in_flight(3, 4, 8), 1);
        assert_eq!(Schedule::OneFOneB.in_flight(0, 4, 2), 2);
        // 2 chunks on 4 stages, 8 micro-batches: (4 - 1 - s) 2 + 4 warm-up passes, then one more
        assert_eq!(Schedule::Interleaved(2).in_flight(0, 4, 8), 11);
        assert_eq!(Schedule::Interleaved(2).in_flight(3, 4, 8), 5);
        // as many micro-batches as stages: every forward first
        assert_eq!(Schedule::Interleaved(2).in_flight(3, 4, 4), 8);
        // 10 micro-batches on 4 stages: two groups of 5, which the warm-up covers:
        // (4 - 1 - s) 2 + 5 passes, then one more
        assert_eq!(Schedule::Interleaved(2).in_flight(0, 4, 10), 12);
        assert_eq!(Schedule::Interleaved(2).in_flight(3, 4, 10), 6);
        // the runtime's groups (`weft_dist::pipeline::interleaved_groups`' own test has the same)
        assert_eq!(interleaved_groups(16, 72), [18, 18, 18, 18]);
        assert_eq!(interleaved_groups(4, 11), [6, 5]);
        assert_eq!(interleaved_groups(3, 7), [4, 3]);
        assert_eq!(interleaved_groups(4, 7), [7]);
        assert_eq!(interleaved_groups(4, 8), [4, 4]);
        assert_eq!(GroupSizes::of(4, 11).largest(), 6);
        assert_eq!(GroupSizes::of(4, 8).largest(), 4);
    }
}
