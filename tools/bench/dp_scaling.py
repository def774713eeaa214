"""Strong scaling of data parallelism: the built-in run's GPT (`weft train` without a config:
vocab 128, block 64, 4 layers, 4 heads, n_embd 128, global batch 16, AdamW with clipping) at
dp = 1 and dp = 2, one compute thread per rank, same global batch.

Build first (`cargo build --release`), then from the repository root:

    python3 tools/bench/dp_scaling.py [--repeat 3] [--steps 40] [--bucket-cap-mb 25]

Each repeat runs dp = 1 and dp = 2 (alternating which goes first) and takes the median
`step_ms` over steps 5 and later. Prints per repeat and the median over repeats: both step
times, the efficiency t1 / (2 t2), and from the dp = 2 timeline the share of gradient
all-reduce time that ran while backward was still running (overlap).
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
WEFT = os.path.join(ROOT, "target", "release", "weft")

# The built-in run (`weft train` without --config), made a short, quiet timing run.
OVERRIDES = ["train.log_every=1", "train.eval_every=0", "train.sample_tokens=0"]


def median_step_ms(path):
    rows = [json.loads(line) for line in open(path)]
    return statistics.median(r["step_ms"] for r in rows[5:])


def run(work, dp, steps, bucket_cap_mb):
    metrics = os.path.join(work, f"m{dp}.jsonl")
    trace = os.path.join(work, f"trace{dp}.json")
    cmd = [WEFT, "train", "--quiet", "--set", f"train.steps={steps}",
           "--set", f"train.metrics={json.dumps(metrics)}",
           "--set", f"train.trace={json.dumps(trace)}",
           "--set", f"parallel.dp={dp}", "--set", f"parallel.bucket_cap_mb={bucket_cap_mb}"]
    for o in OVERRIDES:
        cmd += ["--set", o]
    if dp > 1:
        cmd = [WEFT, "launch", "--nproc-per-node", str(dp), "--"] + cmd
    env = dict(os.environ, WEFT_NUM_THREADS="1")
    subprocess.run(cmd, check=True, env=env)
    return median_step_ms(metrics), trace


def overlap(trace_path):
    """Share of the gradient all-reduce time (f32 buckets on the comm threads) that fell
    inside a backward span of the same rank."""
    events = json.load(open(trace_path))["traceEvents"]
    hidden = total = 0.0
    for pid in {e["pid"] for e in events}:
        mine = [e for e in events if e["pid"] == pid and e.get("ph") == "X"]
        backward = [(e["ts"], e["ts"] + e["dur"]) for e in mine if e["name"] == "backward"]
        for e in mine:
            if e.get("cat") == "comm" and e["name"].startswith("all_reduce(avg, f32"):
                a, b = e["ts"], e["ts"] + e["dur"]
                total += b - a
                hidden += sum(max(0.0, min(b, y) - max(a, x)) for x, y in backward)
    return hidden / total if total else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="weft-dp-scaling-")
    rows = []
    for i in range(args.repeat):
        order = [1, 2] if i % 2 == 0 else [2, 1]
        got = {}
        for dp in order:
            got[dp] = run(work, dp, args.steps, args.bucket_cap_mb)
        t1, (t2, trace) = got[1][0], got[2]
        rows.append((t1, t2, t1 / (2 * t2), overlap(trace)))
        print(f"[{i + 1}/{args.repeat}] dp=1 {t1:.1f} ms, dp=2 {t2:.1f} ms, efficiency {rows[-1][2]:.3f}, "
              f"all-reduce overlapped with backward {rows[-1][3]:.0%}", flush=True)
    med = [statistics.median(r[k] for r in rows) for k in range(4)]
    print(f"median of {args.repeat}: dp=1 {med[0]:.1f} ms/step, dp=2 {med[1]:.1f} ms/step, "
          f"efficiency t1/(2 t2) = {med[2]:.3f}, overlap {med[3]:.0%} (bucket_cap_mb {args.bucket_cap_mb})")


if __name__ == "__main__":
    main()
