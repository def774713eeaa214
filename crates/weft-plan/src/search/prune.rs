//! What lets the search pass over micro-batch counts without evaluating them: whether any layout
//! of a split fits in memory at a count, and a lower bound on the step time at a count.

use super::*;

/// Whether some 1F1B layout of `split` at `m` micro-batches with recompute `recompute` fits in
/// `usable` bytes per device, at some ZeRO stage and gather dtype, with a cut of each stage's
/// blocks within what its memory allows (1F1B holds no more than GPipe). With `floor`, whether
/// one at `m` or fewer micro-batches might ([`stage_memory_floor`]). Errs towards `true` by a
/// part in 10^9.
pub(super) fn fits_pipelined(
    work: &Workload,
    split: &Split,
    m: usize,
    recompute: bool,
    usable: f64,
    floor: bool,
) -> bool {
    let n_layer = work.model.n_layer as usize;
    let slack = usable * (1.0 + 1e-9);
    group_layouts(split, m, recompute, n_layer)
        .into_iter()
        .filter(|l| l.schedule == Schedule::OneFOneB)
        .any(|layout| {
            let memory = |s: usize, k: usize| {
                if floor {
                    stage_memory_floor(work, &layout, s, k)
                } else {
                    stage_memory_with(work, &layout, s, k).total()
                }
            };
            let mut room = 0usize;
            for s in 0..split.pp {
                let (none, one) = (memory(s, 0), memory(s, 1));
                if one > slack {
                    return false;
                }
                let per_block = one - none;
                room += if per_block <= 0.0 {
                    n_layer
                } else {
                    (((slack - none) / per_block).floor() as usize).clamp(1, n_layer)
                };
            }
            room >= n_layer
        })
}

/// Whether some interleaved layout of `split` at `m` micro-batches with recompute `recompute`
/// fits in `usable` bytes per device with the runtime's even cut (the ends' stages first, each
/// layout given up at its first stage that does not fit).
pub(super) fn fits_interleaved(work: &Workload, split: &Split, m: usize, recompute: bool, usable: f64) -> bool {
    let n_layer = work.model.n_layer as usize;
    let slack = usable * (1.0 + 1e-9);
    let pp = split.pp;
    let order: Vec<usize> = [0, pp - 1].into_iter().chain(1..pp - 1).collect();
    let layouts: Vec<Layout> = group_layouts(split, m, recompute, n_layer)
        .into_iter()
        .filter(|l| l.schedule.chunks() > 1)
        .map(|mut l| {
            l.stage_blocks = interleaved_cut(n_layer, pp, l.schedule.chunks());
            l
        })
        .collect();
    // a stage's activations are the same at every ZeRO stage and gather dtype
    let mut held: BTreeMap<(usize, usize), f64> = BTreeMap::new();
    layouts.iter().any(|layout| {
        order.iter().all(|&s| {
            let blocks = layout.stage_blocks[s];
            let a = *held
                .entry((layout.schedule.chunks(), s))
                .or_insert_with(|| stage_activations(work, layout, s, blocks));
            stage_memory_given(work, layout, s, blocks, a).total() <= slack
        })
    })
}

/// Whether some layout of `split` at its `mi`-th micro-batch count with recompute `recompute`
/// fits in memory ([`fits_pipelined`], [`fits_interleaved`]); `none_below` caches, per split and
/// recompute setting, how many of the smallest counts no 1F1B or GPipe layout fits at (found by
/// bisection on [`stage_memory_floor`]: memory only shrinks with more micro-batches).
pub(super) fn could_fit(
    work: &Workload,
    (si, split): (usize, &Split),
    mi: usize,
    recompute: bool,
    usable: f64,
    none_below: &mut BTreeMap<(usize, bool), usize>,
) -> bool {
    let below = *none_below.entry((si, recompute)).or_insert_with(|| {
        // the first count at or below which a layout might fit
        let (mut lo, mut hi) = (0, split.ms.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if fits_pipelined(work, split, split.ms[mid], recompute, usable, true) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    });
    let m = split.ms[mi];
    (mi >= below && fits_pipelined(work, split, m, recompute, usable, false))
        || (m >= split.pp && fits_interleaved(work, split, m, recompute, usable))
}

/// A lower bound on the predicted step time of every layout of `split` at `m` micro-batches
/// with recompute `recompute` (any schedule, ZeRO stage, gather dtype and cut), from the cost
/// model's own terms ([`crate::cost::step_time`]): a stage's per-micro-batch time is linear in
/// its blocks, so the stages' sum is the same for every cut and the slowest is at least their
/// mean; the pipeline then takes at least `(m - 1/v) slowest + sum / v` (`v` the most chunks
/// an interleaved plan may have here, 1 else), on shared cores at least every stage's `m`
/// passes one after another and the node's compute over its cores; the data-parallel
/// reduction exposes at least its last bucket and what the backward cannot hide on the stage
/// with the most; the optimizer is at least its share of the mean stage's parameters; the
/// step's own all-reduces are what they are. Only pipelines (`pp > 1`) are bounded. The
/// pipeline's sends are taken in `wire` (bf16 bounds every layout, f32 those that send f32).
pub(super) fn lower_bound(
    work: &Workload,
    device: &DeviceSpec,
    split: &Split,
    m: usize,
    recompute: bool,
    wire: CommDtype,
) -> f64 {
    let Split {
        dp, tp, pp, rows, sp, ..
    } = *split;
    let n = work.model.n_layer as usize;
    let nf = n as f64;
    let ppf = pp as f64;
    let rows = (rows / m) as f64;
    let passes = work.grad_accum.max(1) as f64;
    // the per-pass whole-gradient sums left out: a bound for every ZeRO stage (without ZeRO
    // they are summed once a step instead, which the bound leaves out too)
    let u = on_the_wire(
        without_whole_gradient_sums(
            unit_times_sequence(work, device, tp, dp, pp, rows, sp),
            &whole_gradient_sums(work, device, tp, sp),
        ),
        device,
        tp,
        dp,
        pp,
        wire,
    );
    // the stages' sum of a linear function of their blocks, with the ends on the first and last
    let over_stages = |f: &dyn Fn(usize, bool, bool) -> f64| {
        let middle = f(0, false, false);
        f(0, true, false) + f(0, false, true) + (ppf - 2.0) * middle + nf * (f(1, false, false) - middle)
    };
    let sum = over_stages(&|k, first, last| stage_time(&u, k, first, last, recompute));
    let mut slowest = (sum / ppf)
        .max(stage_time(&u, 1, true, false, recompute))
        .max(stage_time(&u, 1, false, true, recompute));
    if pp > 2 {
        slowest = slowest.max(stage_time(&u, 1, false, false, recompute));
    }
    let devices = dp * tp * pp;
    let hbm = device.memory_bandwidth * device.efficiency.memory_bound;
    let params = stage_params(&work.model, tp, pp, n, true, true);
    let mut optimizer = 28.0 * params / ppf / if dp > 1 { dp as f64 } else { 1.0 } / hbm;
    let dp_link = device.link(tp, dp);
    let last_bucket = if dp > 1 {
        all_reduce(BUCKET_BYTES.min(4.0 * params / ppf), dp, dp_link)
    } else {
        0.0
    };
    let (pipeline, reduction) = match device.shared_compute {
        None => {
            let v = if m >= pp {
                (2..=MAX_CHUNKS).rev().find(|&v| n >= v * pp).unwrap_or(1)
            } else {
                1
            } as f64;
            let pipeline = (m as f64 - 1.0 / v) * slowest + sum / v;
            // what the backward of the stage with the most cannot hide: at least the mean (an
            // interleaved plan reduces each chunk's gradients under the passes after its last
            // backward, which may hide all but the last bucket)
            let unhidden = if dp > 1 && v == 1.0 {
                let reduce = ppf * all_reduce(0.0, dp, dp_link) + all_reduce(4.0 * params, dp, dp_link)
                    - all_reduce(0.0, dp, dp_link);
                let backward = over_stages(&|k, first, last| stage_backward_time(&u, k, first, last));
                (reduce - backward) / ppf
            } else {
                0.0
            };
            (pipeline, last_bucket.max(unhidden))
        }
        Some(k) => {
            let no_comm = device.without_links();
            let uc = unit_times_sequence(work, &no_comm, tp, dp, pp, rows, sp);
            let compute = over_stages(&|k, first, last| stage_time(&uc, k, first, last, recompute));
            let per_node = (devices as f64).min(device.devices_per_node as f64);
            let cores = (devices as f64 / per_node).max(1.0) * k;
            optimizer *= (per_node / k).max(1.0);
            let pipeline = m as f64 * (compute / ppf).max(compute * (dp * tp) as f64 / cores);
            // nothing hides it there
            let reduce = if dp > 1 {
                all_reduce(4.0 * params / ppf, dp, dp_link)
            } else {
                0.0
            };
            (pipeline, reduce)
        }
    };
    let own = 2.0 * all_reduce(8.0, devices, device.link(1, devices));
    (passes * pipeline + reduction + optimizer + own) * (1.0 - 1e-9)
}

/// The `top` shortest step times seen among plans that stay in the report, and the shortest
/// among those that reduce and send in f32 (`Layout::communicates_in_f32`): no layout
/// predicted slower than both can enter the first `top` plans or be the first `f32` one.
pub(super) struct Bar {
    pub(super) top: usize,
    pub(super) best: BinaryHeap<Time>,
    pub(super) best_f32: f64,
}

/// A step time ordered by `f64::total_cmp`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Time(pub(super) f64);

impl Eq for Time {}

impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Time {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl Bar {
    pub(super) fn add(&mut self, plan: &Plan) {
        let t = plan.time.step;
        if plan.layout.communicates_in_f32() {
            self.best_f32 = self.best_f32.min(t);
        }
        self.best.push(Time(t));
        if self.best.len() > self.top {
            self.best.pop();
        }
    }

    /// The longest step a layout still worth evaluating may have.
    pub(super) fn limit(&self) -> f64 {
        self.top_limit().max(self.best_f32)
    }

    /// The longest step a layout may have and still enter the first `top` plans.
    pub(super) fn top_limit(&self) -> f64 {
        if self.best.len() >= self.top {
            self.best.peek().map_or(f64::INFINITY, |t| t.0)
        } else {
            f64::INFINITY
        }
    }
}
