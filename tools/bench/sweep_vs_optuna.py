#!/usr/bin/env python3
"""`weft sweep` (TPE + ASHA) beside Optuna (TPE + SuccessiveHalving) on the same trainer, search
space and budget, in one run.

Both drive the same `weft train` binary on the digits mlp (../shared/data/digits.csv.gz; the
base is examples/digits_mlp.toml with `train.steps`, `eval_every` and `eval_batches` set below)
and rank trials by `val_loss` (its last value). The space: `optim.lr` log-uniform on
[1e-3, 0.5], `optim.momentum` uniform on [1e-6, 0.99] (the base's Nesterov momentum needs it
above 0), `optim.weight_decay` log-uniform on
[1e-6, 1e-2]. With `--model gpt`: the tiny character gpt of examples/char_gpt_tiny.toml on the
built-in corpus (AdamW), `optim.lr` log-uniform on [3e-4, 3e-2], `optim.weight_decay` uniform on
[0, 0.2], `optim.grad_clip` log-uniform on [0.1, 10]. For each seed:

- weft, TPE + ASHA (`min_steps`, `reduction_factor` below), TPE without pruning, and
  multivariate TPE (`[sweep] multivariate = true`) + ASHA;
- Optuna, `TPESampler(seed)` + `SuccessiveHalvingPruner(min_resource, reduction_factor)`: its
  objective starts `weft train` with the trial's values, reads `val_loss` from the metrics file as
  it is written, reports it at each evaluation and kills the process when told to prune.

Every trial runs one at a time (parallel = 1) on the same threads, unless `--parallel N` gives
weft's sweeps N trials at once (Optuna's stay sequential); `asha-noliar` and `none-noliar` are
the `asha` and `none` sweeps with `[sweep] constant_liar = false`. Prints the best value of each
and the wall-clock seconds of each sweep, then medians over the seeds. With `none` and an ASHA
variant (`asha2x`: TPE + ASHA with twice the trials), also the wall-clock time each took to reach
the no-pruning sweep's best value (from the sweep's start to the end of the trial that reached
it): the time ASHA saves at an equal best value.

    cargo build -p weft-cli            # or --release, with --weft target/release/weft
    python3 tools/bench/sweep_vs_optuna.py [--seeds 5] [--trials 20] [--steps 800] [--model mlp|gpt] [--weft target/debug/weft]
    python3 tools/bench/sweep_vs_optuna.py --parallel 4 --variants asha,asha-noliar,none,none-noliar   # no optuna needed

Needs optuna (a venv outside the repository); CI does not run it.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT.parent / "shared" / "data" / "digits.csv.gz"
# trial length (set by --steps): evaluations every STEPS / 8 steps, the first rung at the first
STEPS, EVAL_EVERY, EVAL_BATCHES = 800, 100, 3
MIN_STEPS, ETA = 100, 3
SPACE = {
    "optim.lr": ("log_uniform", 1e-3, 0.5),
    # not from 0: the base's Nesterov momentum needs it above 0, and `weft sweep` refuses a
    # range whose end the base config does not load with
    "optim.momentum": ("uniform", 1e-6, 0.99),
    "optim.weight_decay": ("log_uniform", 1e-6, 1e-2),
}
# --model gpt: the tiny character gpt of examples/char_gpt_tiny.toml on the built-in corpus
# (AdamW), its learning rate, weight decay and clipping norm
GPT_SPACE = {
    "optim.lr": ("log_uniform", 3e-4, 3e-2),
    "optim.weight_decay": ("uniform", 0.0, 0.2),
    "optim.grad_clip": ("log_uniform", 0.1, 10.0),
}
MODEL = "mlp"
PARALLEL = 1  # --parallel: trials at once in weft's sweeps
GAMMA = None  # --gamma: weft's TPE good-split quantile of the asha, none and mv sweeps (default: weft's own, 0.1)


def base_config(work: Path) -> Path:
    if MODEL == "gpt":
        text = (ROOT / "examples" / "char_gpt_tiny.toml").read_text()
        text = text.replace("steps = 300", f"steps = {STEPS}").replace("log_every = 25", f"log_every = {EVAL_EVERY}")
        text = text.replace("eval_every = 25", f"eval_every = {EVAL_EVERY}")
        path = work / "base.toml"
        path.write_text(text)
        return path
    text = (ROOT / "examples" / "digits_mlp.toml").read_text()
    text = text.replace('path = "../../shared/data/digits.csv.gz"', f'path = "{DIGITS}"')
    text = text.replace("steps = 500", f"steps = {STEPS}")
    text = text.replace("eval_every = 100", f"eval_every = {EVAL_EVERY}")
    text = text.replace("eval_batches = 2", f"eval_batches = {EVAL_BATCHES}")
    path = work / "base.toml"
    path.write_text(text)
    return path


def weft_sweep(weft, work: Path, base: Path, seed: int, trials: int, pruner: str, multivariate=False, gamma=None,
               liar=True):
    gamma = GAMMA if gamma is None else gamma
    name = (f"w{seed}{pruner}{trials}{'mv' if multivariate else ''}{'' if gamma is None else f'g{gamma}'}"
            f"{'' if liar else 'nl'}")
    params = "\n".join(
        f'"{k}" = {{ distribution = "{d}", min = {lo}, max = {hi} }}' for k, (d, lo, hi) in SPACE.items())
    prune = f'kind = "asha"\nmin_steps = {MIN_STEPS}\nreduction_factor = {ETA}' if pruner == "asha" else 'kind = "none"'
    sweep = work / f"{name}.toml"
    sweep.write_text(f'[sweep]\nbase = "{base}"\nname = "{name}"\nmetric = "val_loss"\ngoal = "minimize"\n'
                     f'method = "tpe"\nmultivariate = {str(multivariate).lower()}\ntrials = {trials}\n'
                     f'parallel = {PARALLEL}\nconstant_liar = {str(liar).lower()}\nseed = {seed}\n'
                     f'{"" if gamma is None else f"gamma = {gamma}"}\n\n'
                     f'[sweep.parameters]\n{params}\n\n[sweep.pruner]\n{prune}\n')
    env = dict(os.environ, WEFT_TRACK_DIR=str(work / "store"), WEFT_NUM_THREADS="2")
    t = time.perf_counter()
    started = time.time()
    p = subprocess.run([weft, "sweep", "--config", str(sweep)], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"weft sweep --config {sweep} failed (exit {p.returncode}):\n{p.stderr.strip()[-2000:]}")
    wall = time.perf_counter() - t
    runs = json.loads(subprocess.run([weft, "runs", "list", "--experiment", name, "--json"], env=env, check=True,
                                     capture_output=True, text=True).stdout)
    done = [r for r in runs if r["status"] == "finished" and "val_loss" in r["metrics"]]
    finished = [r["metrics"]["val_loss"] for r in done]
    pruned = sum(r["status"] == "pruned" for r in runs)
    # (seconds from the sweep's start to the trial's end, its value), in the order they ended
    trace = sorted((r["end_time"] - started, r["metrics"]["val_loss"]) for r in done)
    return min(finished), wall, pruned, trace


def time_to(trace, target):
    """Seconds until a finished trial's value was at most `target`, or None."""
    return next((t for t, v in trace if v <= target), None)


def optuna_sweep(weft, work: Path, base: Path, seed: int, trials: int):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    env = dict(os.environ, WEFT_NUM_THREADS="2")

    def objective(trial):
        sets = []
        for k, (d, lo, hi) in SPACE.items():
            v = trial.suggest_float(k, lo, hi, log=(d == "log_uniform"))
            sets += ["--set", f"{k}={v!r}"]
        metrics = work / f"o{seed}-{trial.number}.jsonl"
        cmd = [weft, "train", "--config", str(base), "--quiet", "--set", "track.enabled=false",
               "--set", f'train.metrics="{metrics}"', *sets]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seen, last = 0, None
        while True:
            done = proc.poll() is not None
            if metrics.exists():
                lines = metrics.read_text().splitlines()
                for line in lines[seen:]:
                    if not line.endswith("}"):
                        break  # a record being written
                    seen += 1
                    rec = json.loads(line)
                    if "val_loss" in rec:
                        last = rec["val_loss"]
                        trial.report(last, rec["step"])
                        if trial.should_prune():
                            proc.kill()
                            proc.wait()
                            raise optuna.TrialPruned()
            if done:
                break
            time.sleep(0.05)
        if proc.returncode != 0 or last is None:
            raise RuntimeError(f"trial {trial.number} failed: {' '.join(cmd)}")
        return last

    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed),
                                pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=MIN_STEPS,
                                                                              reduction_factor=ETA))
    t = time.perf_counter()
    study.optimize(objective, n_trials=trials)
    wall = time.perf_counter() - t
    pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)
    return study.best_value, wall, pruned


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--weft", default=str(ROOT / "target" / "debug" / "weft"))
    ap.add_argument("--steps", type=int, default=800, help="training steps per trial (a multiple of 8)")
    ap.add_argument("--model", choices=["mlp", "gpt"], default="mlp",
                    help="the digits mlp (../shared/data) or the tiny character gpt on the built-in corpus")
    ap.add_argument("--gamma", type=float,
                    help="weft's TPE good-split quantile of the asha, none and mv sweeps (default weft's, 0.1, as Optuna's)")
    ap.add_argument("--parallel", type=int, default=1, help="trials at once in weft's sweeps")
    ap.add_argument("--variants", default="asha,none,optuna,mv",
                    help="which sweeps to run: asha, none (weft TPE without pruning), optuna, mv (multivariate + asha), "
                         "asha10 and asha25 (weft TPE with gamma 0.1 or 0.25 + asha), asha2x (weft TPE + asha with "
                         "twice the trials), asha-noliar and none-noliar (asha and none with constant_liar = false)")
    a = ap.parse_args()
    global STEPS, EVAL_EVERY, MIN_STEPS, MODEL, SPACE, GAMMA, PARALLEL
    GAMMA, PARALLEL = a.gamma, a.parallel
    variants = set(a.variants.split(","))
    known = {"asha", "none", "optuna", "mv", "asha10", "asha25", "asha2x", "asha-noliar", "none-noliar"}
    if not variants <= known:
        sys.exit(f"--variants: unknown {sorted(variants - known)}")
    MODEL = a.model
    if MODEL == "gpt":
        SPACE = GPT_SPACE
    STEPS, EVAL_EVERY, MIN_STEPS = a.steps, a.steps // 8, a.steps // 8
    if MODEL == "mlp" and not DIGITS.exists():
        sys.exit(f"{DIGITS} is missing (../shared/data)")
    # (key, label, runs it) in the order printed
    kinds = [("asha", "weft TPE + ASHA"), ("asha10", "weft TPE (gamma 0.1) + ASHA"),
             ("asha25", "weft TPE (gamma 0.25) + ASHA"), ("asha2x", "weft TPE + ASHA, twice the trials"),
             ("asha-noliar", "weft TPE + ASHA, no constant liar"),
             ("none", "weft TPE, no pruning"), ("none-noliar", "weft TPE, no pruning, no constant liar"),
             ("mv", "weft multivariate TPE + ASHA"), ("optuna", "Optuna TPE + SuccessiveHalving")]
    kinds = [(k, label) for k, label in kinds if k in variants]
    rows = []
    for seed in range(a.seeds):
        work = Path(tempfile.mkdtemp(prefix="weft-sweep-bench-"))
        got = {}
        try:
            base = base_config(work)
            for k, _ in kinds:
                if k == "optuna":
                    got[k] = optuna_sweep(a.weft, work, base, seed, a.trials)
                else:
                    trials = 2 * a.trials if k == "asha2x" else a.trials
                    got[k] = weft_sweep(a.weft, work, base, seed, trials, "none" if k.startswith("none") else "asha",
                                        multivariate=(k == "mv"), gamma={"asha10": 0.1, "asha25": 0.25}.get(k),
                                        liar=not k.endswith("-noliar"))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rows.append(got)
        print(f"seed {seed}: " + " | ".join(f"{label} {got[k][0]:.4f} in {got[k][1]:.1f} s ({got[k][2]} pruned)"
                                             for k, label in kinds), flush=True)
    gamma = "" if GAMMA is None else f", weft gamma {GAMMA}"
    print(f"\n{MODEL}{gamma}: {a.trials} trials per sweep, {STEPS} steps per trial, {PARALLEL} at once (weft), "
          f"{a.seeds} seeds (medians)")
    print("| | best val_loss | sweep wall s | trials pruned |")
    print("|---|---:|---:|---:|")
    for k, label in kinds:
        med = [statistics.median(r[k][j] for r in rows) for j in range(3)]
        print(f"| {label} | {med[0]:.4f} | {med[1]:.1f} | {med[2]:.0f} |")
    if "optuna" in variants:
        wins = [f"{label} {sum(r[k][0] <= r['optuna'][0] for r in rows)}/{len(rows)}"
                for k, label in kinds if k != "optuna"]
        print("\nseeds where weft's best is at least as good as Optuna's: " + ", ".join(wins))
    if "none" in variants:
        # the time each weft sweep took to reach the no-pruning sweep's best (its own: when its
        # best trial ended)
        print("\nwall-clock s to the no-pruning sweep's best value (median over the seeds that reached it)")
        print("| | seeds that reached it | median s | median s of no pruning on those seeds | ratio |")
        print("|---|---:|---:|---:|---:|")
        for k, label in kinds:
            if k in ("optuna",) or k not in variants:
                continue
            pairs = []
            for r in rows:
                reached = time_to(r[k][3], r["none"][0])
                if reached is not None:
                    pairs.append((reached, time_to(r["none"][3], r["none"][0])))
            if pairs:
                mine = statistics.median(p[0] for p in pairs)
                theirs = statistics.median(p[1] for p in pairs)
                print(f"| {label} | {len(pairs)}/{len(rows)} | {mine:.1f} | {theirs:.1f} | {mine / theirs:.2f} |")
            else:
                print(f"| {label} | 0/{len(rows)} | | | |")


if __name__ == "__main__":
    main()
