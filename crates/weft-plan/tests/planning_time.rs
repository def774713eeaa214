//! Planning time of accepted inputs that took minutes: a thousand layers, thousands of devices
//! and a global batch of 3603600 rows (480 divisors, a few hundred micro-batch counts for every
//! pipeline). Every micro-batch count of every split was evaluated, each cut by an `O(pp n^2)`
//! dynamic programme: 54-65 s, 133 s and 460 s in a release build (docs/plan.md, "Predictions
//! and planning times"). A debug build takes about 0.4 s now; the bound leaves room for a loaded
//! machine.

use std::time::Instant;

mod common;

use common::h100;
use weft_plan::{plan, DeviceSpec, ModelKind, ModelShape, Precision, SearchOptions, Workload};

/// A GPT of GPT-2's vocabulary.
fn gpt(n_layer: u64, n_head: u64, n_embd: u64, seq_len: u64) -> ModelShape {
    common::gpt(n_layer, n_head, n_embd, 50257, seq_len)
}

/// A workload on GPUs, which repeat grouped-query keys and values.
fn work(model: ModelShape, global_batch: u64) -> Workload {
    Workload {
        kv_repeated: true,
        ..common::work(model, global_batch)
    }
}

/// Plans and returns the seconds it took, printing the outcome.
fn timed(name: &str, w: &Workload, device: &DeviceSpec, devices: usize) -> f64 {
    let start = Instant::now();
    let r = plan(
        w,
        device,
        devices,
        SearchOptions {
            keep_infeasible: 10,
            ..Default::default()
        },
    );
    let secs = start.elapsed().as_secs_f64();
    match &r {
        Ok(r) => println!(
            "{name}: {secs:.2} s, {} evaluated, {} skipped, {} feasible; best {} at {:.1} s a step",
            r.evaluated,
            r.skipped,
            r.plans.len(),
            r.plans[0].layout.label(),
            r.plans[0].time.step
        ),
        Err(e) => println!("{name}: {secs:.2} s: {e}"),
    }
    secs
}

#[test]
fn a_thousand_layers_on_thousands_of_devices_plan_in_seconds() {
    let batch = 3_603_600;
    let mut total = 0.0;
    // GPT-3's width at 1024 layers on 8192 H100 (fits no layout)
    total += timed(
        "1024 layers, 8192 devices",
        &work(gpt(1024, 96, 12288, 2048), batch),
        &h100(),
        8192,
    );
    total += timed(
        "960 layers, 960 devices",
        &work(gpt(960, 64, 4096, 128), batch),
        &h100(),
        960,
    );
    total += timed(
        "1008 layers, 5040 devices",
        &work(gpt(1008, 64, 4096, 128), batch),
        &h100(),
        5040,
    );
    // devices that share compute: every pipeline simulated pass by pass
    let shared = DeviceSpec {
        shared_compute: Some(1.0),
        ..h100()
    };
    total += timed(
        "960 layers, 960 devices sharing compute",
        &work(gpt(960, 64, 4096, 128), batch),
        &shared,
        960,
    );
    // 0.4 s in a debug build (the test profile) after the fix, minutes before it; 2.7 s once
    // interleaved plans took any micro-batch count, 5 s once pipelines were planned sending f32
    // and bf16: the bound leaves room for a loaded 2-core machine running other tests beside it
    assert!(total < 20.0, "{total} s");
}

/// What the bounds leave out could not have been among the best: the first `K` plans and the
/// first that reduces in f32 (what `[parallel] auto` takes) are those of the search that
/// evaluates every micro-batch count (`keep_infeasible` past every plan turns the bounds off),
/// over models, devices that share compute or not, gradient accumulation and precisions.
#[test]
fn the_bounds_leave_out_no_plan_that_would_rank() {
    let llama = ModelShape {
        kind: ModelKind::Llama,
        vocab: 32000,
        seq_len: 2048,
        n_layer: 32,
        n_head: 32,
        n_kv_head: 8,
        n_embd: 4096,
        head_dim: 128,
        intermediate: 11008,
        tied: false,
        bias: false,
        qk_norm: false,
    };
    let cpu = DeviceSpec {
        name: "cpu".into(),
        devices_per_node: 4,
        flops_bf16: 2e10,
        flops_f32: 2e10,
        memory_bytes: 4e9,
        memory_bandwidth: 1e10,
        intra_bandwidth: 2e9,
        intra_latency: 3e-5,
        inter_bandwidth: 2e9,
        inter_latency: 3e-5,
        shared_compute: Some(1.9),
        gpu: false,
        pass_cost: weft_plan::PassCost {
            time_scale: 1.05,
            block: 1e-4,
            ends: 2e-4,
        },
        ..h100()
    };
    let small = ModelShape {
        vocab: 512,
        ..gpt(8, 4, 128, 64)
    };
    let cases: Vec<(&str, Workload, DeviceSpec, usize)> = vec![
        ("gpt2 on 8", work(gpt(12, 12, 768, 1024), 512), h100(), 8),
        ("gpt2 on 64", work(gpt(12, 12, 768, 1024), 512), h100(), 64),
        ("gpt3 on 96", work(gpt(96, 96, 12288, 2048), 1152), h100(), 96),
        ("gpt3 on 4608", work(gpt(96, 96, 12288, 2048), 1152), h100(), 4608),
        (
            "gpt3 on 96, fused",
            Workload {
                fused_accumulation: true,
                ..work(gpt(96, 96, 12288, 2048), 1152)
            },
            h100(),
            96,
        ),
        ("gpt3 on 1024", work(gpt(96, 96, 12288, 2048), 1152), h100(), 1024),
        (
            "gpt3 on 1024, 4 passes",
            Workload {
                grad_accum: 4,
                ..work(gpt(96, 96, 12288, 2048), 1152)
            },
            h100(),
            1024,
        ),
        ("llama on 64", work(llama.clone(), 512), h100(), 64),
        (
            "llama in f32 on 32 a100",
            Workload {
                precision: Precision::F32,
                ..work(llama, 256)
            },
            DeviceSpec::builtin("a100-sxm-80gb").unwrap(),
            32,
        ),
        ("small on 4 shared cpus", work(small.clone(), 64), cpu.clone(), 4),
        ("small on 8 shared cpus", work(small, 96), cpu, 8),
    ];
    for (name, w, device, devices) in cases {
        let every = plan(
            &w,
            &device,
            devices,
            SearchOptions {
                keep_infeasible: usize::MAX,
                ..Default::default()
            },
        )
        .unwrap();
        let top = plan(
            &w,
            &device,
            devices,
            SearchOptions {
                keep_infeasible: 10,
                ..Default::default()
            },
        )
        .unwrap();
        let first = |r: &weft_plan::PlanReport, k: usize| -> Vec<(String, Vec<usize>, f64, f64)> {
            r.plans
                .iter()
                .take(k)
                .map(|p| {
                    (
                        p.layout.label(),
                        p.layout.stage_blocks.clone(),
                        p.time.step,
                        p.memory.total(),
                    )
                })
                .collect()
        };
        assert_eq!(first(&top, 10), first(&every, 10), "{name}");
        // every layout is evaluated or counted as skipped
        assert_eq!(top.evaluated + top.skipped, every.evaluated + every.skipped, "{name}");
        let f32_first = |r: &weft_plan::PlanReport| {
            r.plans
                .iter()
                .find(|p| p.layout.communicates_in_f32())
                .map(|p| (p.layout.label(), p.layout.stage_blocks.clone()))
        };
        let auto = plan(
            &w,
            &device,
            devices,
            SearchOptions {
                keep_infeasible: 0,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(f32_first(&auto), f32_first(&every), "{name}");
        assert_eq!(first(&auto, 1), first(&every, 1), "{name}");
        println!(
            "{name}: {} of {} layouts evaluated ({} with the first plan only), best {}",
            top.evaluated,
            every.evaluated + every.skipped,
            auto.evaluated,
            top.plans[0].layout.label()
        );
    }
}
