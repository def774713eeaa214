#!/usr/bin/env python3
"""Gradient accumulation fusion on the CPU: one `weft train` binary, `train.fuse_accumulation`
on and off, runs alternated, median step time.

A llama (n_embd 512, 4 layers, intermediate 1376, vocabulary 512) on the built-in text, trained
for `--steps` optimizer steps of `--accum` micro-batches of `--batch` rows of `--block` tokens;
each run's `step_ms` of its steps after the first three (warm-up), median per run, then the
median over `--repeat` runs of each setting. The losses of the two settings are compared too:
fusion changes no bits, so they must be equal.

    python3 tools/bench/accumulation_fusion.py [--weft target/release/weft] [--threads 1]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))

TOML = """[model]
kind = "llama"
vocab_size = 512
block_size = {block}
n_layer = 4
n_head = 8
n_kv_head = 4
n_embd = 512
intermediate_size = 1376

[data]
kind = "text"
path = "builtin"
batch_size = {batch}

[optim]
kind = "adamw"
lr = 0.0003

[train]
steps = {steps}
grad_accum = {accum}
log_every = 1
metrics = "{metrics}"
overwrite = true
fuse_accumulation = {fuse}
"""

WARMUP = 3


def run(weft, work, threads, fuse, args):
    metrics = os.path.join(work, f"metrics-{fuse}.jsonl")
    config = os.path.join(work, f"run-{fuse}.toml")
    with open(config, "w") as f:
        f.write(TOML.format(block=args.block, batch=args.batch, steps=WARMUP + args.steps,
                            accum=args.accum, metrics=metrics, fuse=str(fuse).lower()))
    env = dict(os.environ, WEFT_NUM_THREADS=str(threads))
    subprocess.run([weft, "train", "--quiet", "--config", config], cwd=work, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in open(metrics) if '"step_ms"' in line]
    steps = [r for r in rows if "step_ms" in r]
    ms = statistics.median(r["step_ms"] for r in steps[WARMUP:])
    return ms, [r["loss"] for r in steps]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weft", default=os.path.join(ROOT, "target", "release", "weft"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--accum", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--block", type=int, default=128)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="weft-accum-fusion-")
    times = {True: [], False: []}
    losses = {}
    for r in range(args.repeat):
        order = (True, False) if r % 2 == 0 else (False, True)
        for fuse in order:
            ms, loss = run(args.weft, work, args.threads, fuse, args)
            times[fuse].append(ms)
            losses.setdefault(fuse, loss)
            print(f"[{r + 1}/{args.repeat}] fuse_accumulation={str(fuse).lower()}: {ms:.1f} ms",
                  file=sys.stderr)
    same = losses[True] == losses[False]
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"threads {args.threads}, {args.accum} micro-batches of {args.batch} x {args.block} tokens a step")
    print("| fuse_accumulation | median step ms | per run |")
    print("|---|---:|---|")
    for fuse, med in ((False, off), (True, on)):
        print(f"| {str(fuse).lower()} | {med:.1f} | {', '.join(f'{t:.1f}' for t in times[fuse])} |")
    print(f"on / off: {on / off:.3f}; losses equal bit for bit: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
