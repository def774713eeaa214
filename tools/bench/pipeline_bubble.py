"""The pipeline bubble, measured from the timeline: the built-in run's GPT (4 blocks, global batch
16) cut into pp = 2 and 4 stages with 1, 2, 4 and 8 micro-batches, one compute thread per rank,
under GPipe and 1F1B (and the interleaved schedule, 2 chunks a rank, when asked).

Build first (`cargo build --release`), then from the repository root:

    python3 tools/bench/pipeline_bubble.py [--steps 12] [--pp 2 4] [--micro 1 2 4 8]
                                           [--schedules gpipe 1f1b interleaved] [--batch 12]

For each run, every stage's idle share of each step is 1 - (time in its micro-batch forward and
backward spans) / (the step's duration), the median over steps 3 and later; it is printed per
stage next to the ideal bubble (p - 1) / (m + p - 1) (interleaved over v = 2 chunks:
(p - 1) / (v m + p - 1)), with the most activation bytes each stage held at once (the metrics'
`activation_bytes`). `--batch` sets `data.batch_size` (so that, for example, 3 micro-batches
divide it). Note: with more ranks than cores (pp = 4 on a 2-core machine), stages share cores,
and a stage's passes stretch while another computes.
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


def run(work, pp, m, schedule, steps, batch=None):
    trace = os.path.join(work, f"trace-{pp}-{m}-{schedule}.json")
    metrics = os.path.join(work, f"m-{pp}-{m}-{schedule}.jsonl")
    if os.path.exists(metrics):  # a repeat: weft refuses to mix a new run into an old run's records
        os.remove(metrics)
    cmd = [WEFT, "launch", "--nproc-per-node", str(pp), "--", WEFT, "train", "--quiet",
           "--set", f"train.steps={steps}", "--set", "train.log_every=1", "--set", "train.eval_every=0",
           "--set", "train.sample_tokens=0", "--set", f"train.trace={json.dumps(trace)}",
           "--set", f"train.metrics={json.dumps(metrics)}", "--set", f"parallel.pp={pp}",
           "--set", f"parallel.micro_batches={m}", "--set", f"parallel.schedule={json.dumps(schedule)}"]
    if batch:
        cmd += ["--set", f"data.batch_size={batch}"]
    subprocess.run(cmd, check=True, env=dict(os.environ, WEFT_NUM_THREADS="1"))
    events = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X"]
    idle = []
    for stage in range(pp):
        mine = [e for e in events if e["pid"] == stage]
        steps_ = sorted((e["ts"], e["ts"] + e["dur"]) for e in mine if e["name"] == "step")
        passes = [(e["ts"], e["ts"] + e["dur"]) for e in mine
                  if e["name"].startswith("forward ") or e["name"].startswith("backward ")]
        shares = []
        for a, b in steps_[2:]:
            busy = sum(min(b, y) - max(a, x) for x, y in passes if x < b and y > a)
            shares.append(1 - busy / (b - a))
        idle.append(statistics.median(shares))
    act = [json.loads(line) for line in open(metrics)][-1]["activation_bytes"]
    return idle, act


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--pp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--micro", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b"],
                    choices=["gpipe", "1f1b", "interleaved"])
    ap.add_argument("--batch", type=int, help="data.batch_size (default: the built-in run's)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="weft-pipeline-")
    print("| pp | m | ideal bubble | schedule | idle share per stage | activation MB per stage |")
    print("|---|---|---:|---|---|---|")
    for pp in args.pp:
        for m in args.micro:
            for schedule in args.schedules:
                idle, act = run(work, pp, m, schedule, args.steps, args.batch)
                v = 2 if schedule == "interleaved" else 1
                ideal = (pp - 1) / (v * m + pp - 1)
                print(f"| {pp} | {m} | {ideal:.3f} | {schedule} | {' / '.join(f'{x:.3f}' for x in idle)} | "
                      f"{' / '.join(f'{a / 1e6:.2f}' for a in act)} |", flush=True)


if __name__ == "__main__":
    main()
