//! `weft bench ops`: times the core ops at fixed shapes. `tools/bench/torch_ops.py` times the same
//! ops and shapes in PyTorch so the two tables can be put side by side.

use std::time::{Duration, Instant};

use weft_core::{Conv2dParams, DType, Generator, Result, Tensor};

#[derive(clap::Args)]
pub struct OpsArgs {
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Only ops whose name contains this text (none: an error naming the ops).
    #[arg(long)]
    filter: Option<String>,
    /// Minimum measuring time per op, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    min_ms: u64,
}

/// What one op moves: floating-point work or bytes.
enum Work {
    Flops(f64),
    Bytes(f64),
}

struct Case {
    op: &'static str,
    shape: String,
    work: Work,
    run: Box<dyn FnMut() -> Result<()>>,
}

fn randn(shape: &[usize], seed: u64) -> Result<Tensor> {
    Tensor::randn(shape, DType::F32, &mut Generator::new(seed))
}

fn cases(filter: Option<&str>) -> Result<Vec<Case>> {
    let want = |op: &str| filter.is_none_or(|f| op.contains(f));
    let mut cases = Vec::new();
    for n in [256usize, 1024, 2048].into_iter().filter(|_| want(MATMUL)) {
        let (a, b) = (randn(&[n, n], 1)?, randn(&[n, n], 2)?);
        cases.push(Case {
            op: MATMUL,
            shape: format!("{n}x{n}x{n}"),
            work: Work::Flops(2.0 * (n * n * n) as f64),
            run: Box::new(move || a.matmul(&b).map(drop)),
        });
    }
    let (rows, cols) = (8192usize, 1024usize);
    let bytes = (2 * rows * cols * 4) as f64;
    let x = randn(&[rows, cols], 3)?;
    if want(SOFTMAX) {
        let x = x.clone();
        let run = Box::new(move || x.softmax(-1).map(drop));
        cases.push(Case {
            op: SOFTMAX,
            shape: format!("{rows}x{cols}"),
            work: Work::Bytes(bytes),
            run,
        });
    }
    if want(LAYER_NORM) {
        let (w, b, x) = (randn(&[cols], 4)?, randn(&[cols], 5)?, x.clone());
        let run = Box::new(move || x.layer_norm(Some(&w), Some(&b), 1e-5).map(drop));
        cases.push(Case {
            op: LAYER_NORM,
            shape: format!("{rows}x{cols}"),
            work: Work::Bytes(bytes),
            run,
        });
    }
    if want(GELU) {
        let run = Box::new(move || x.gelu().map(drop));
        cases.push(Case {
            op: GELU,
            shape: format!("{rows}x{cols}"),
            work: Work::Bytes(bytes),
            run,
        });
    }
    if want(CROSS_ENTROPY) {
        cases.push(cross_entropy_case()?);
    }
    if want(ATTENTION_FWD_BWD) {
        cases.push(attention_case()?);
    }
    if want(CONV2D) {
        cases.push(conv2d_case()?);
    }
    Ok(cases)
}

fn cross_entropy_case() -> Result<Case> {
    let (n, c) = (4096usize, 8192usize);
    let logits = randn(&[n, c], 6)?;
    let targets = Tensor::from_vec((0..n as i64).map(|i| (i * 7919) % c as i64).collect(), &[n])?;
    Ok(Case {
        op: CROSS_ENTROPY,
        shape: format!("{n}x{c}"),
        work: Work::Bytes((n * c * 4) as f64),
        run: Box::new(move || logits.cross_entropy(&targets, -100, 0.0).map(drop)),
    })
}

fn attention_case() -> Result<Case> {
    let (bsz, h, t, d) = (4usize, 8usize, 512usize, 64usize);
    let q = randn(&[bsz, h, t, d], 7)?.requires_grad_()?;
    let k = randn(&[bsz, h, t, d], 8)?.requires_grad_()?;
    let v = randn(&[bsz, h, t, d], 9)?.requires_grad_()?;
    let dout = randn(&[bsz, h, t, d], 10)?;
    Ok(Case {
        op: ATTENTION_FWD_BWD,
        shape: format!("{bsz}x{h}x{t}x{d} causal"),
        // 7 matmuls of T x T x D (2 forward, 5 backward), half of each masked away.
        work: Work::Flops(7.0 * (bsz * h * t * t * d) as f64),
        run: Box::new(move || {
            let o = Tensor::scaled_dot_product_attention(&q, &k, &v, true, None)?;
            o.backward_with(&dout)?;
            for p in [&q, &k, &v] {
                p.set_grad(None);
            }
            Ok(())
        }),
    })
}

fn conv2d_case() -> Result<Case> {
    let (cn, cc, hw, co) = (16usize, 64usize, 56usize, 64usize);
    let cx = randn(&[cn, cc, hw, hw], 11)?;
    let cw = randn(&[co, cc, 3, 3], 12)?;
    let params = Conv2dParams {
        padding: (1, 1),
        ..Conv2dParams::new()
    };
    Ok(Case {
        op: CONV2D,
        shape: format!("{cn}x{cc}x{hw}x{hw} k3x3 o{co} pad1"),
        work: Work::Flops(2.0 * (cn * co * hw * hw * cc * 9) as f64),
        run: Box::new(move || cx.conv2d(&cw, None, params).map(drop)),
    })
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

pub fn run_ops(args: &OpsArgs) -> std::result::Result<(), String> {
    let cases = cases(args.filter.as_deref()).map_err(|e| e.to_string())?;
    if cases.is_empty() {
        // an empty table and exit 0 read as a run that measured nothing wrong
        return Err(format!(
            "--filter {:?}: no op's name contains it (ops: {})",
            args.filter.as_deref().unwrap_or(""),
            OPS.join(", ")
        ));
    }
    time_ops(args, cases).map_err(|e| e.to_string())
}

// each op's name, once: its case and the list of ops use it
const MATMUL: &str = "matmul";
const SOFTMAX: &str = "softmax";
const LAYER_NORM: &str = "layer_norm";
const GELU: &str = "gelu";
const CROSS_ENTROPY: &str = "cross_entropy";
const ATTENTION_FWD_BWD: &str = "attention_fwd_bwd";
const CONV2D: &str = "conv2d";

/// Every op `weft bench ops` times, in its order.
const OPS: [&str; 7] = [
    MATMUL,
    SOFTMAX,
    LAYER_NORM,
    GELU,
    CROSS_ENTROPY,
    ATTENTION_FWD_BWD,
    CONV2D,
];

fn time_ops(args: &OpsArgs, cases: Vec<Case>) -> Result<()> {
    let threads = weft_core::cpu::threads::num_threads();
    if !args.json {
        weft_core::outln!("weft bench ops ({threads} threads; median of repeated runs)");
        weft_core::outln!(
            "{:<20} {:<28} {:>12} {:>10} {:>8}",
            "op",
            "shape",
            "median_us",
            "rate",
            "unit"
        );
    }
    for mut case in cases {
        for _ in 0..2 {
            (case.run)()?;
        }
        let mut times = Vec::new();
        let start = Instant::now();
        while times.len() < 5 || (start.elapsed() < Duration::from_millis(args.min_ms) && times.len() < 1000) {
            let t0 = Instant::now();
            (case.run)()?;
            times.push(t0.elapsed());
        }
        let med = median(times);
        let secs = med.as_secs_f64();
        let (key, rate, unit) = match case.work {
            Work::Flops(f) => ("gflops", f / secs / 1e9, "GFLOP/s"),
            Work::Bytes(b) => ("gbps", b / secs / 1e9, "GB/s"),
        };
        let us = secs * 1e6;
        if args.json {
            let obj = serde_json::json!({
                "op": case.op, "shape": case.shape, "median_us": us, key: rate, "threads": threads, "impl": "weft"
            });
            weft_core::outln!("{obj}");
        } else {
            weft_core::outln!(
                "{:<20} {:<28} {:>12.1} {:>10.2} {:>8}",
                case.op,
                case.shape,
                us,
                rate,
                unit
            );
        }
    }
    Ok(())
}
