#!/usr/bin/env python3
"""weft's TPE against Optuna's on four synthetic functions: no training in the loop, so the
comparison is of the samplers alone, over many seeds.

    cargo build --release -p weft-tune --example tpe_synthetic
    python3 tools/bench/tpe_vs_optuna.py [--seeds 200] [--budget 20]

Needs `optuna` (PyPI). Each seed is one sequential run of `--budget` trials (TPE: 10 random
trials first, both sides' default); the table gives, per function and sampler, the median,
75th and 90th percentile and mean of the best value found (lower is better). Optuna's
`TPESampler(seed=s)` is its default, multivariate since Optuna 5; `multivariate=False` is the
independent one. weft's side is `crates/weft-tune/examples/tpe_synthetic.rs`, whose functions
and spaces are the same as below.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys

try:
    import optuna
except ImportError:
    sys.exit("optuna is not installed: pip install optuna")

optuna.logging.set_verbosity(optuna.logging.WARNING)
PI = math.pi


def bowl1d(t):
    return (math.log10(t.suggest_float("o.lr", 1e-5, 1.0, log=True)) - math.log10(3e-3)) ** 2


def branin(t):
    x = t.suggest_float("a.x", -5.0, 10.0)
    y = t.suggest_float("a.y", 0.0, 15.0)
    b = 5.1 / (4 * PI * PI)
    return (y - b * x * x + 5 / PI * x - 6) ** 2 + 10 * (1 - 1 / (8 * PI)) * math.cos(x) + 10


def sgdlike(t):
    lr = t.suggest_float("o.lr", 1e-3, 0.5, log=True)
    m = t.suggest_float("o.m", 0.0, 0.99)
    wd = t.suggest_float("o.wd", 1e-6, 1e-2, log=True)
    eff = math.log10(lr / (1 - m)) - math.log10(0.3)
    return 0.04 + 0.05 * eff * eff + 0.002 * (math.log10(wd) + 4) ** 2


def hartmann3(t):
    x = [t.suggest_float(f"h.x{i}", 0.0, 1.0) for i in range(3)]
    a = [[3, 10, 30], [0.1, 10, 35], [3, 10, 30], [0.1, 10, 35]]
    p = [[0.3689, 0.117, 0.2673], [0.4699, 0.4387, 0.747], [0.1091, 0.8732, 0.5547], [0.03815, 0.5743, 0.8828]]
    alpha = [1, 1.2, 3, 3.2]
    return -sum(alpha[i] * math.exp(-sum(a[i][j] * (x[j] - p[i][j]) ** 2 for j in range(3))) for i in range(4))


FUNCTIONS = {"bowl1d": bowl1d, "branin": branin, "sgdlike": sgdlike, "hartmann3": hartmann3}
SAMPLERS = {
    "optuna tpe (default)": lambda s: optuna.samplers.TPESampler(seed=s),
    "optuna tpe multivariate=False": lambda s: optuna.samplers.TPESampler(seed=s, multivariate=False),
    "optuna random": lambda s: optuna.samplers.RandomSampler(seed=s),
}


def stats(bests):
    b = sorted(bests)
    n = len(b)
    return b[n // 2], b[n * 3 // 4], b[n * 9 // 10], statistics.mean(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--budget", type=int, default=20)
    ap.add_argument("--example", default="target/release/examples/tpe_synthetic")
    args = ap.parse_args()
    if not os.path.exists(args.example):
        sys.exit(f"{args.example}: build it first: cargo build --release -p weft-tune --example tpe_synthetic")
    rows = {}
    out = subprocess.run([args.example, str(args.seeds), str(args.budget)], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        r = json.loads(line)
        rows[(r["function"], r["sampler"])] = r["bests"]
    for name, f in FUNCTIONS.items():
        for label, make in SAMPLERS.items():
            bests = []
            for s in range(args.seeds):
                study = optuna.create_study(sampler=make(s))
                study.optimize(f, n_trials=args.budget)
                bests.append(study.best_value)
            rows[(name, label)] = bests
            print(f"  {name} {label}: done", file=sys.stderr, flush=True)
    print(f"Optuna {optuna.__version__}; {args.seeds} seeds of {args.budget} trials; best value found (lower is better)\n")
    print("| function | sampler | median | p75 | p90 | mean |")
    print("|---|---|---:|---:|---:|---:|")
    for name in FUNCTIONS:
        for (fn, label), bests in rows.items():
            if fn == name:
                med, p75, p90, mean = stats(bests)
                print(f"| {name} | {label} | {med:.5g} | {p75:.5g} | {p90:.5g} | {mean:.5g} |")


if __name__ == "__main__":
    main()
