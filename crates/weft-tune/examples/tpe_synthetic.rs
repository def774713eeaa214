//! weft's samplers on four synthetic functions, for `tools/bench/tpe_vs_optuna.py`, which runs
//! Optuna's on the same functions and prints both side by side.
//!
//! ```sh
//! cargo run --release -p weft-tune --example tpe_synthetic -- SEEDS BUDGET
//! ```
//!
//! Prints one JSON line per (function, sampler): the best value each seed's sequential run of
//! `BUDGET` trials found (10 random trials first for TPE, as Optuna's default).

use std::io::Write;

use weft_tune::sampler::{Observation, Outcome, Random, Sampler, Tpe};
use weft_tune::space::{Space, Value};

/// A function of the trial's values, read by key.
type Objective = Box<dyn Fn(&dyn Fn(&str) -> f64) -> f64>;

fn space(text: &str) -> Space {
    let table = text.parse::<toml::Table>().expect("a TOML table");
    Space::from_toml(&table, "bench").expect("a search space")
}

/// The four functions, with their spaces (the same as the script's Optuna side).
fn functions() -> Vec<(&'static str, Space, Objective)> {
    let pi = std::f64::consts::PI;
    vec![
        (
            // a learning rate's bowl, optimum at 3e-3 on a log scale
            "bowl1d",
            space("\"o.lr\" = { distribution = \"log_uniform\", min = 1e-5, max = 1.0 }"),
            Box::new(|g| (g("o.lr").log10() - 3e-3f64.log10()).powi(2)),
        ),
        (
            // Branin on [-5, 10] x [0, 15]: minimum 0.397887
            "branin",
            space(
                "\"a.x\" = { distribution = \"uniform\", min = -5.0, max = 10.0 }\n\
                 \"a.y\" = { distribution = \"uniform\", min = 0.0, max = 15.0 }",
            ),
            Box::new(move |g| {
                let (x, y) = (g("a.x"), g("a.y"));
                let b = 5.1 / (4.0 * pi * pi);
                (y - b * x * x + 5.0 / pi * x - 6.0).powi(2) + 10.0 * (1.0 - 1.0 / (8.0 * pi)) * x.cos() + 10.0
            }),
        ),
        (
            // SGD's learning rate and momentum act together (lr / (1 - m)); weight decay alone
            "sgdlike",
            space(
                "\"o.lr\" = { distribution = \"log_uniform\", min = 1e-3, max = 0.5 }\n\
                 \"o.m\" = { distribution = \"uniform\", min = 0.0, max = 0.99 }\n\
                 \"o.wd\" = { distribution = \"log_uniform\", min = 1e-6, max = 1e-2 }",
            ),
            Box::new(|g| {
                let eff = (g("o.lr") / (1.0 - g("o.m"))).log10() - 0.3f64.log10();
                0.04 + 0.05 * eff * eff + 0.002 * (g("o.wd").log10() + 4.0).powi(2)
            }),
        ),
        (
            // Hartmann 3-D on the unit cube: minimum -3.86278
            "hartmann3",
            space(
                "\"h.x0\" = { distribution = \"uniform\", min = 0.0, max = 1.0 }\n\
                 \"h.x1\" = { distribution = \"uniform\", min = 0.0, max = 1.0 }\n\
                 \"h.x2\" = { distribution = \"uniform\", min = 0.0, max = 1.0 }",
            ),
            Box::new(|g| {
                let x = [g("h.x0"), g("h.x1"), g("h.x2")];
                let a = [
                    [3.0, 10.0, 30.0],
                    [0.1, 10.0, 35.0],
                    [3.0, 10.0, 30.0],
                    [0.1, 10.0, 35.0],
                ];
                let p = [
                    [0.3689, 0.117, 0.2673],
                    [0.4699, 0.4387, 0.747],
                    [0.1091, 0.8732, 0.5547],
                    [0.03815, 0.5743, 0.8828],
                ];
                let alpha = [1.0, 1.2, 3.0, 3.2];
                -(0..4)
                    .map(|i| alpha[i] * (-(0..3).map(|j| a[i][j] * (x[j] - p[i][j]).powi(2)).sum::<f64>()).exp())
                    .sum::<f64>()
            }),
        ),
    ]
}

/// The best value `sampler` finds in `budget` sequential trials.
fn best_of(sampler: &mut dyn Sampler, space: &Space, budget: u64, f: &Objective) -> f64 {
    let mut history: Vec<Observation> = Vec::new();
    let mut best = f64::INFINITY;
    for trial in 0..budget {
        let values = sampler.suggest(trial, space, &history).expect("a suggestion");
        let get = |key: &str| -> f64 {
            let i = space
                .params
                .iter()
                .position(|p| p.key == key)
                .expect("a parameter of the space");
            match values[i] {
                Value::Float(x) => x,
                Value::Int(i) => i as f64,
                Value::Choice(c) => c as f64,
            }
        };
        let y = f(&get);
        best = best.min(y);
        history.push(Observation {
            values,
            outcome: Outcome::Finished(y),
        });
    }
    best
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: u64| args.get(i).map_or(default, |a| a.parse().expect("a number"));
    let (seeds, budget) = (arg(0, 200), arg(1, 20));
    let mut out = std::io::stdout().lock();
    for (name, space, f) in functions() {
        for sampler in ["tpe", "tpe-multivariate", "random"] {
            let bests: Vec<f64> = (0..seeds)
                .map(|seed| {
                    let mut s: Box<dyn Sampler> = match sampler {
                        "tpe" => Box::new(Tpe::new(seed, 10)),
                        "tpe-multivariate" => Box::new(Tpe::multivariate(seed, 10)),
                        _ => Box::new(Random::new(seed)),
                    };
                    best_of(s.as_mut(), &space, budget, &f)
                })
                .collect();
            let list: Vec<String> = bests.iter().map(|b| format!("{b:?}")).collect();
            let line = format!(
                "{{\"function\": \"{name}\", \"sampler\": \"weft {sampler}\", \"bests\": [{}]}}",
                list.join(", ")
            );
            // a reader that has gone (a closed pipe) ends the run
            if writeln!(out, "{line}").is_err() {
                return;
            }
        }
    }
}
