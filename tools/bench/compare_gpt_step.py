"""Training-step time of the speed-target GPT, weft against PyTorch eager, on the same batches.

Build first (`cargo build --release`), then from the repository root, with a Python that has torch
and safetensors:

    python3 tools/bench/compare_gpt_step.py [--threads 2] [--repeat 3] [--weft target/release/weft]

Each repeat runs tools/bench/torch_gpt_step.py (50 timed steps after 5 warm-up steps; it also saves
its batches) and `weft train` with tools/bench/gpt_step.toml on those batches (55 steps, the first 5
dropped), alternating which goes first. Both report the wall time of whole steps (forward, backward,
clipping, optimizer). Prints the median over repeats of each side's median step time.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def torch_step(threads, batches):
    cmd = [sys.executable, os.path.join(HERE, "torch_gpt_step.py"), "--threads", str(threads), "--json",
           "--save-batches", batches]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["median_ms"]


def weft_step(weft, threads, workdir):
    env = dict(os.environ, WEFT_NUM_THREADS=str(threads))
    metrics = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    subprocess.run([weft, "train", "--quiet", "--config", os.path.join(workdir, "gpt_step.toml")], check=True, env=env)
    times = [json.loads(line)["step_ms"] for line in open(metrics)]
    return statistics.median(times[5:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--weft", default=os.path.join(ROOT, "target", "release", "weft"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="weft-gpt-step-")
    shutil.copy(os.path.join(HERE, "gpt_step.toml"), work)
    batches = os.path.join(work, "batches.safetensors")
    torch_ms, weft_ms = [], []
    for r in range(args.repeat):
        if r % 2 == 0:
            torch_ms.append(torch_step(args.threads, batches))
            weft_ms.append(weft_step(args.weft, args.threads, work))
        else:
            weft_ms.append(weft_step(args.weft, args.threads, work))
            torch_ms.append(torch_step(args.threads, batches))
        print(f"[{r + 1}/{args.repeat}] torch {torch_ms[-1]:.1f} ms, weft {weft_ms[-1]:.1f} ms", file=sys.stderr)
    t, w = statistics.median(torch_ms), statistics.median(weft_ms)
    print(f"| threads | torch eager median ms | weft median ms | weft / torch |")
    print(f"|---:|---:|---:|---:|")
    print(f"| {args.threads} | {t:.1f} | {w:.1f} | {w / t:.2f} |")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
