//! The search end to end: tensor parallelism stays inside a node, pipeline cuts balance
//! predicted time, models that fit nowhere and device counts no layout can use are named
//! errors, and GPT-3 175B plans on 1024 H100 in seconds with a plausible MFU.

mod common;

use common::{gpt, h100, work};
use weft_plan::cost::{stage_time, unit_times};
use weft_plan::search::{balanced_cut, capped_cut};
use weft_plan::{plan, CommDtype, DeviceSpec, Error, ModelKind, ModelShape, SearchOptions, Workload};

#[test]
fn tensor_parallelism_stays_inside_a_node() {
    // 16 heads could be cut 16 ways, but a node has 4 devices
    let w = work(gpt(8, 16, 1024, 32000, 1024), 64);
    let node_of_4 = DeviceSpec {
        devices_per_node: 4,
        ..h100()
    };
    let r = plan(&w, &node_of_4, 16, SearchOptions::default()).unwrap();
    assert!(!r.plans.is_empty());
    assert!(r.plans.iter().all(|p| p.layout.tp <= 4));
    assert!(r.plans.iter().any(|p| p.layout.tp == 4));
    assert_eq!(
        r.ruled_out.get("tp does not divide the 4 devices of a node"),
        Some(&3),
        "{:?}",
        r.ruled_out
    );
    // and the same job on nodes of 8 may cut 8 ways
    let r = plan(&w, &h100(), 16, SearchOptions::default()).unwrap();
    assert!(r.plans.iter().any(|p| p.layout.tp == 8));
    assert!(r.plans.iter().all(|p| p.layout.dp * p.layout.tp * p.layout.pp == 16));
}

#[test]
fn grouped_query_attention_bounds_tensor_parallelism() {
    // 32 query heads but 2 key/value heads: tp may be 1 or 2 only (tp 4 with pp 1 or 2, and
    // tp 8, are ruled out)
    let llama = ModelShape {
        kind: ModelKind::Llama,
        vocab: 32000,
        seq_len: 2048,
        n_layer: 16,
        n_head: 32,
        n_kv_head: 2,
        n_embd: 2048,
        head_dim: 64,
        intermediate: 5632,
        tied: false,
        bias: false,
        qk_norm: false,
    };
    let r = plan(&work(llama, 64), &h100(), 8, SearchOptions::default()).unwrap();
    assert!(r.plans.iter().all(|p| p.layout.tp <= 2));
    assert!(r.plans.iter().any(|p| p.layout.tp == 2));
    assert_eq!(
        r.ruled_out.get("tp does not divide the heads"),
        Some(&3),
        "{:?}",
        r.ruled_out
    );
}

#[test]
fn pipeline_cuts_balance_predicted_time() {
    // a large vocabulary makes the last stage's output layer worth several blocks
    let w = work(gpt(10, 12, 768, 256_000, 1024), 32);
    let u = unit_times(&w, &h100(), 1, 1, 3, 4.0);
    let cut = balanced_cut(&u, 3, 10, false);
    assert_eq!(cut.iter().sum::<usize>(), 10);
    let slowest = |c: &[usize]| {
        (0..c.len())
            .map(|s| stage_time(&u, c[s], s == 0, s + 1 == c.len(), false))
            .fold(0.0, f64::max)
    };
    // every cut of 10 blocks into 3 stages: none has a faster slowest stage
    let mut best = f64::INFINITY;
    for a in 1..=8 {
        for b in 1..=(9 - a) {
            best = best.min(slowest(&[a, b, 10 - a - b]));
        }
    }
    assert_eq!(slowest(&cut), best, "{cut:?}");
    // and it is not the even cut: the last stage takes fewer blocks
    assert!(cut[2] < cut[0], "{cut:?}");
    assert!(slowest(&cut) < slowest(&[4, 3, 3]));
    // with the first stage held to 2 blocks (its memory), the best cut within the caps
    let caps = [2, 10, 10];
    let capped = capped_cut(&u, 10, false, &caps).unwrap();
    assert_eq!(capped[0], 2, "{capped:?}");
    let mut best = f64::INFINITY;
    for b in 1..=7 {
        best = best.min(slowest(&[2, b, 8 - b]));
    }
    assert_eq!(slowest(&capped), best, "{capped:?}");
    // caps that leave no cut
    assert_eq!(capped_cut(&u, 10, false, &[3, 3, 3]), None);
    assert_eq!(capped_cut(&u, 10, false, &[0, 10, 10]), None);
}

#[test]
fn a_model_that_fits_nowhere_says_what_it_needs() {
    // GPT-3 175B on 8 H100: 16 bytes a parameter is 2.8 TB; without data parallelism there is
    // nothing for ZeRO to shard, and Adam's two moments are the largest term
    let w = work(gpt(96, 96, 12288, 50257, 2048), 8);
    let e = plan(&w, &h100(), 8, SearchOptions::default()).unwrap_err();
    let Error::DoesNotFit { term, needed, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(term, "optimizer state", "{e}");
    assert!(needed.ends_with("GB"), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("the least memory a layout needs is") && text.contains("dominates"),
        "{text}"
    );
}

/// A replica of 8192 rows: pipelines are planned at most MAX_MICRO_BATCHES micro-batches (the
/// schedule simulation's work grows with the count: a global batch of 2^30 rows ran for over
/// ten minutes and took gigabytes before the bound).
#[test]
fn micro_batch_counts_are_bounded() {
    use weft_plan::search::MAX_MICRO_BATCHES;
    let w = work(gpt(4, 4, 256, 512, 128), 1 << 14);
    let options = SearchOptions {
        keep_infeasible: usize::MAX,
        ..Default::default()
    };
    let report = plan(&w, &h100(), 2, options).unwrap();
    let all: Vec<_> = report.plans.iter().chain(&report.infeasible).collect();
    assert!(all.iter().any(|p| p.layout.pp == 2), "pipelines are planned");
    let most = all.iter().map(|p| p.layout.micro_batches).max().unwrap();
    assert_eq!(most, MAX_MICRO_BATCHES, "the largest count planned");
}

/// A spec whose rates make every step take forever (a memory bandwidth of 5e-324 bytes/s,
/// which a cluster.toml may no longer give but a spec built in code can): no plan is "best";
/// `weft plan` printed one at `inf` ms and 0 tokens/s.
#[test]
fn a_plan_whose_predicted_time_is_not_finite_is_refused() {
    let w = work(gpt(12, 12, 768, 50257, 1024), 8);
    for crawl in [
        DeviceSpec {
            memory_bandwidth: 5e-324,
            ..h100()
        },
        DeviceSpec {
            inter_latency: f64::INFINITY,
            intra_latency: f64::INFINITY,
            ..h100()
        },
    ] {
        let e = plan(&w, &crawl, 8, SearchOptions::default()).unwrap_err();
        assert!(matches!(e, Error::NoFiniteTime { devices: 8, .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("no layout on 8 x h100-sxm-80gb has a finite predicted step time")
                && text.contains("predicts inf s"),
            "{text}"
        );
    }
}

#[test]
fn device_counts_no_layout_can_use_are_named() {
    // 13 devices: 13 > 12 layers for a pipeline, more than a node for tp, and dp 13 does not
    // divide a batch of 8
    let w = work(gpt(12, 12, 768, 50257, 1024), 8);
    let e = plan(&w, &h100(), 13, SearchOptions::default()).unwrap_err();
    assert!(matches!(e, Error::NoLayout { devices: 13, .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains("dp does not divide the batch of 8 rows"), "{text}");
    for devices in [0, 1 << 40] {
        assert!(matches!(
            plan(&w, &h100(), devices, SearchOptions::default()),
            Err(Error::BadRequest(_))
        ));
    }
    let huge = Workload {
        global_batch: u64::MAX,
        ..w.clone()
    };
    assert!(matches!(
        plan(&huge, &h100(), 8, SearchOptions::default()),
        Err(Error::BadRequest(m)) if m.contains("global batch")
    ));
}

#[test]
fn gpt3_175b_on_1024_h100_plans_in_seconds() {
    let w = work(gpt(96, 96, 12288, 50257, 2048), 1152);
    let start = std::time::Instant::now();
    let r = plan(&w, &h100(), 1024, SearchOptions::default()).unwrap();
    let secs = start.elapsed().as_secs_f64();
    let best = &r.plans[0];
    println!(
        "GPT-3 175B on 1024 h100-sxm-80gb, batch 1152: planned in {secs:.3} s ({} layouts evaluated, {} re-cut to \
         fit); best {} cut {:?}: step {:.3} s, MFU {:.1}%, {:.1} GB per device",
        r.evaluated,
        r.recut,
        best.layout.label(),
        best.layout.stage_blocks,
        best.time.step,
        100.0 * best.mfu,
        best.memory.total() / 1e9
    );
    for p in r.plans.iter().take(5) {
        println!(
            "  {} {:?} {:.3} s {:.1}% {:.1} GB",
            p.layout.label(),
            p.layout.stage_blocks,
            p.time.step,
            100.0 * p.mfu,
            p.memory.total() / 1e9
        );
    }
    assert!(secs < 60.0, "{secs} s");
    // some layouts fit only with fewer blocks on the stages that hold more micro-batches
    assert!(r.recut > 0);
    assert!(r
        .plans
        .iter()
        .any(|p| p.layout.stage_blocks.windows(2).any(|w| w[0] != w[1])));
    assert!(best.layout.tp <= 8);
    assert!(best.memory.total() <= r.usable_memory);
    // Megatron-Core reports 47% at 96 H100 and 42% at 4608 with its interleaved schedule;
    // weft's schedules leave a larger bubble at this scale, and weft's gradient accumulation
    // is a pass of its own (docs/plan.md)
    assert!(best.mfu > 0.20 && best.mfu < 0.55, "{}", best.mfu);
}

#[test]
fn a_1t_model_on_4096_h100_plans_in_seconds() {
    // Narayanan et al.'s 1T GPT: 128 layers, 160 heads, width 25600, vocab 51200, batch 3072
    let w = work(gpt(128, 160, 25600, 51200, 2048), 3072);
    let start = std::time::Instant::now();
    let r = plan(&w, &h100(), 4096, SearchOptions::default()).unwrap();
    let secs = start.elapsed().as_secs_f64();
    let best = &r.plans[0];
    println!(
        "GPT 1T on 4096 h100-sxm-80gb, batch 3072: planned in {secs:.3} s ({} layouts); best {}: MFU {:.1}%",
        r.evaluated,
        best.layout.label(),
        100.0 * best.mfu
    );
    assert!(secs < 60.0, "{secs} s");
    assert!(best.layout.tp <= 8 && best.layout.devices() == 4096);
    assert!(best.mfu > 0.2 && best.mfu < 0.6, "{}", best.mfu);
}

#[test]
fn the_gemm_efficiency_is_calibrated_on_megatron_cores_96_h100_run() {
    // 47% MFU for GPT-3 175B on 96 H100 at a global batch of 1152 (the default efficiency is
    // set from this; a change to the cost model that moves it should move the default too),
    // planned as Megatron-Core ran it: its weight-gradient products add into the accumulated
    // gradients
    let megatron = Workload {
        fused_accumulation: true,
        ..work(gpt(96, 96, 12288, 50257, 2048), 1152)
    };
    let r = plan(&megatron, &h100(), 96, SearchOptions::default()).unwrap();
    let mfu = r.plans[0].mfu;
    assert!((mfu - 0.47).abs() < 0.01, "{mfu}");
    // weft adds each micro-batch's gradients after its backward: a pass over 12 bytes of every
    // parameter of a stage per micro-batch (about a tenth of this plan's step)
    let weft = plan(
        &work(gpt(96, 96, 12288, 50257, 2048), 1152),
        &h100(),
        96,
        SearchOptions::default(),
    )
    .unwrap();
    assert!(weft.plans[0].mfu < mfu - 0.02, "{} vs {mfu}", weft.plans[0].mfu);
}

#[test]
fn data_parallelism_shards_each_pass_of_an_accumulated_batch() {
    // 64 rows a step as 8 passes of 8 rows: weft shards each pass's 8 rows over the replicas,
    // so dp 16 is ruled out and dp x micro_batches divides 8
    let w = Workload {
        grad_accum: 8,
        ..work(gpt(12, 12, 768, 50257, 1024), 64)
    };
    let r = plan(&w, &h100(), 16, SearchOptions::default()).unwrap();
    assert!(
        r.ruled_out.contains_key("dp does not divide the batch of 8 rows"),
        "{:?}",
        r.ruled_out
    );
    assert!(!r.plans.is_empty());
    for p in &r.plans {
        assert_eq!(8 % (p.layout.dp * p.layout.micro_batches), 0, "{}", p.layout.label());
    }
    // a global batch grad_accum does not divide
    let bad = Workload { grad_accum: 3, ..w };
    assert!(matches!(
        plan(&bad, &h100(), 16, SearchOptions::default()),
        Err(Error::BadRequest(m)) if m.contains("grad_accum 3")
    ));
}

/// Sequence-parallel layouts are planned where weft can run them (`tp > 1`, the sequence length
/// divisible by `tp`, the search allowed to) and nowhere else; such a layout holds fewer
/// activation bytes than the same layout without it, and the search picks them where memory
/// decides (GPT-3 175B on 1024 H100).
#[test]
fn sequence_parallel_layouts_are_planned_where_weft_runs_them() {
    let w = work(gpt(96, 96, 12288, 50257, 2048), 1152);
    let every = SearchOptions {
        keep_infeasible: usize::MAX,
        ..Default::default()
    };
    let r = plan(&w, &h100(), 1024, every).unwrap();
    let all: Vec<_> = r.plans.iter().chain(&r.infeasible).collect();
    assert!(all.iter().any(|p| p.layout.sequence_parallel));
    assert!(all.iter().all(|p| !p.layout.sequence_parallel || p.layout.tp > 1));
    assert!(r.plans[0].layout.sequence_parallel, "{}", r.plans[0].layout.label());
    // the same layouts without it: more activations, never fewer
    let mut compared = 0;
    for p in all.iter().filter(|p| p.layout.sequence_parallel) {
        let plain = weft_plan::search::evaluate(
            &w,
            &h100(),
            weft_plan::Layout {
                sequence_parallel: false,
                ..p.layout.clone()
            },
            h100().usable_memory(),
        );
        assert!(plain.memory.activations > p.memory.activations, "{}", p.layout.label());
        compared += 1;
    }
    assert!(compared > 10);
    // not where the search may not, nor where the sequence does not divide by tp
    let off = SearchOptions {
        sequence_parallel: false,
        ..every
    };
    let r = plan(&w, &h100(), 1024, off).unwrap();
    assert!(r.plans.iter().chain(&r.infeasible).all(|p| !p.layout.sequence_parallel));
    let odd = work(gpt(96, 96, 12288, 50257, 2047), 1152);
    let r = plan(&odd, &h100(), 1024, every).unwrap();
    assert!(r.plans.iter().chain(&r.infeasible).all(|p| !p.layout.sequence_parallel));
}

#[test]
fn pipelines_are_planned_sending_f32_and_bf16_and_nothing_else_sends_bf16() {
    let w = work(gpt(96, 96, 12288, 50257, 2048), 1152);
    let r = plan(&w, &h100(), 1024, SearchOptions::default()).unwrap();
    let all: Vec<_> = r.plans.iter().chain(&r.infeasible).collect();
    let bf16: Vec<_> = all
        .iter()
        .filter(|p| p.layout.pipeline_dtype == CommDtype::Bf16)
        .collect();
    assert!(bf16.iter().all(|p| p.layout.pp > 1));
    assert!(bf16.len() > 10);
    // each such plan against the same layout sending f32: faster, the same memory
    for p in r
        .plans
        .iter()
        .filter(|p| p.layout.pipeline_dtype == CommDtype::Bf16)
        .take(20)
    {
        let f32 = weft_plan::search::evaluate(
            &w,
            &h100(),
            weft_plan::Layout {
                pipeline_dtype: CommDtype::F32,
                ..p.layout.clone()
            },
            h100().usable_memory(),
        );
        assert!(f32.time.step > p.time.step, "{}", p.layout.label());
        assert_eq!(f32.memory.total(), p.memory.total(), "{}", p.layout.label());
    }
}
