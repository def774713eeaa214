"""Compiled mode on the CPU speed-target GPT: weft eager, weft `compile = true`, PyTorch eager and
torch.compile, on the same batches, in one run.

Build first (`cargo build --release`), then from the repository root, with a Python that has torch
and safetensors:

    python3 tools/bench/compare_compiled.py [--threads 2] [--repeat 3] [--no-torch-compile]

Model and step as tools/bench/compare_gpt_step.py (vocab 65, block 64, 4 layers, 4 heads, n_embd
128, batch 16, AdamW + clipping; tools/bench/gpt_step.toml). Each repeat runs every side once, in a
rotating order. Per side: the median step time over steps 6-55 (weft) or the 50 timed steps after
5 warm-up steps (torch), the first step's time (weft: eager run plus capture; torch.compile's
compile happens in its warm-up and is reported by its own script's total time), the peak
resident memory of the process (`wait4`'s ru_maxrss), and for weft the most tensor bytes held at
once in a step (the metrics' `host_mem_bytes`, largest over steps 6-55). weft compiled runs with
`compile_recompute` on (the default) and off. Prints medians over the repeats.
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def run(cmd, env=None):
    """Runs cmd; returns (stdout, wall seconds, peak RSS in MiB)."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    if status != 0:
        sys.exit(f"{cmd} failed with status {status}")
    return out, time.perf_counter() - t, usage.ru_maxrss / 1024


def torch_side(threads, batches, compile_):
    cmd = [sys.executable, os.path.join(HERE, "torch_gpt_step.py"), "--threads", str(threads), "--json",
           "--save-batches", batches]
    if compile_:
        cmd.append("--compile")
    out, wall, rss = run(cmd)
    r = json.loads(out.strip().splitlines()[-1])
    return {"median_ms": r["median_ms"], "first": f"{wall:.1f} s whole script", "rss": rss, "tensors": None}


def weft_side(weft, threads, workdir, compile_, recompute=True):
    env = dict(os.environ, WEFT_NUM_THREADS=str(threads))
    metrics = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [weft, "train", "--quiet", "--config", os.path.join(workdir, "gpt_step.toml"),
           "--set", f"train.compile={'true' if compile_ else 'false'}",
           "--set", f"train.compile_recompute={'true' if recompute else 'false'}"]
    _, _, rss = run(cmd, env)
    records = [json.loads(line) for line in open(metrics)]
    records = [r for r in records if "step_ms" in r]
    times = [r["step_ms"] for r in records]
    tensors = max(r.get("host_mem_bytes", 0) for r in records[5:]) / 2**20
    return {"median_ms": statistics.median(times[5:]), "first": f"{times[0]:.1f} ms first step", "rss": rss,
            "tensors": tensors}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--weft", default=os.path.join(ROOT, "target", "release", "weft"))
    ap.add_argument("--no-torch-compile", action="store_true", help="skip torch.compile (slow to compile)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="weft-compiled-")
    shutil.copy(os.path.join(HERE, "gpt_step.toml"), work)
    batches = os.path.join(work, "batches.safetensors")
    # the batches must exist before weft's first run
    torch_side(args.threads, batches, False)
    sides = {
        "torch eager": lambda: torch_side(args.threads, batches, False),
        "weft eager": lambda: weft_side(args.weft, args.threads, work, False),
        "weft compiled": lambda: weft_side(args.weft, args.threads, work, True),
        "weft compiled, no recompute": lambda: weft_side(args.weft, args.threads, work, True, recompute=False),
    }
    if not args.no_torch_compile:
        sides["torch.compile"] = lambda: torch_side(args.threads, batches, True)
    names = list(sides)
    results = {n: [] for n in names}
    for r in range(args.repeat):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            results[n].append(sides[n]())
            print(f"[{r + 1}/{args.repeat}] {n}: {results[n][-1]}", file=sys.stderr)
    base = statistics.median(x["median_ms"] for x in results["weft eager"])
    print(f"| {args.threads} threads | median step ms | vs weft eager | peak RSS MiB | peak tensor MiB | first step |")
    print("|---|---:|---:|---:|---:|---|")
    for n in names:
        ms = statistics.median(x["median_ms"] for x in results[n])
        rss = statistics.median(x["rss"] for x in results[n])
        tensors = results[n][-1]["tensors"]
        tensors = "-" if tensors is None else f"{statistics.median(x['tensors'] for x in results[n]):.1f}"
        print(f"| {n} | {ms:.1f} | {base / ms:.2f}x | {rss:.0f} | {tensors} | {results[n][-1]['first']} |")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
