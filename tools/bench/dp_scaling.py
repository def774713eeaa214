"""Strong scaling of data parallelism: the built-in run's GPT (`weft train` without a config:
vocab 128, block 64, 4 layers, 4 heads, n_embd 128, global batch 16, AdamW with clipping) at
dp = 1 and dp = 2, one compute thread per rank, same global batch.

Build first (`cargo build --release`), then from the repository root:

    python3 tools/bench/dp_scaling.py [--repeat 3] [--steps 40] [--bucket-cap-mb 25]
                                      [--zero 0 1 2 3] [--torch PYTHON]

Each repeat runs dp = 1 and dp = 2 at each ZeRO stage asked for (alternating the order) and
takes the median `step_ms` over steps 5 and later. Prints per repeat and the median over
repeats: the step times, the efficiency t1 / (2 t2), and from the zero = 0 timeline the share of
gradient all-reduce time that ran while backward was still running (overlap). With --torch (a
Python that has torch), each repeat also runs tools/bench/torch_dp_scaling.py side by side:
PyTorch without wrapping at 1 process, DistributedDataParallel (gloo) at 2, and, when stage 3
is asked for, FSDP2's fully_shard at 2.
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


def run(work, dp, steps, bucket_cap_mb, zero=0):
    metrics = os.path.join(work, f"m{dp}-{zero}.jsonl")
    trace = os.path.join(work, f"trace{dp}-{zero}.json")
    if os.path.exists(metrics):  # a repeat: weft refuses to mix a new run into an old run's records
        os.remove(metrics)
    cmd = [WEFT, "train", "--quiet", "--set", f"train.steps={steps}",
           "--set", f"train.metrics={json.dumps(metrics)}",
           "--set", f"train.trace={json.dumps(trace)}",
           "--set", f"parallel.dp={dp}", "--set", f"parallel.bucket_cap_mb={bucket_cap_mb}",
           "--set", f"parallel.zero={zero if dp > 1 else 0}"]
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


def torch_run(python, nproc, mode, steps):
    script = os.path.join(HERE, "torch_dp_scaling.py")
    out = subprocess.run([python, script, "--nproc", str(nproc), "--mode", mode, "--steps", str(steps),
                          "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["median_ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--zero", type=int, nargs="+", default=[0], choices=[0, 1, 2, 3])
    ap.add_argument("--torch", metavar="PYTHON", help="also run PyTorch DDP/FSDP with this Python")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="weft-dp-scaling-")
    rows = []
    for i in range(args.repeat):
        jobs = [("weft", 1, 0)] + [("weft", 2, z) for z in args.zero]
        if args.torch:
            jobs += [("torch", 1, "ddp"), ("torch", 2, "ddp")]
            if 3 in args.zero:
                jobs.append(("torch", 2, "fsdp"))
        if i % 2 == 1:
            jobs.reverse()
        got = {}
        for impl, dp, kind in jobs:
            if impl == "weft":
                got[(impl, dp, kind)] = run(work, dp, args.steps, args.bucket_cap_mb, kind)
            else:
                got[(impl, dp, kind)] = (torch_run(args.torch, dp, kind, args.steps), None)
        row = {}
        t1 = got[("weft", 1, 0)][0]
        row["weft dp=1"] = t1
        for z in args.zero:
            t2, trace = got[("weft", 2, z)]
            row[f"weft dp=2 zero={z}"] = t2
            row[f"weft efficiency zero={z}"] = t1 / (2 * t2)
            if z == 0:
                row["weft overlap"] = overlap(trace)
        if args.torch:
            tt1 = got[("torch", 1, "ddp")][0]
            row["torch dp=1"] = tt1
            for mode in ["ddp", "fsdp"]:
                if ("torch", 2, mode) in got:
                    row[f"torch dp=2 {mode}"] = got[("torch", 2, mode)][0]
                    row[f"torch efficiency {mode}"] = tt1 / (2 * got[("torch", 2, mode)][0])
        rows.append(row)
        print(f"[{i + 1}/{args.repeat}] " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
    print(f"median of {args.repeat} (bucket_cap_mb {args.bucket_cap_mb}; times in ms/step):")
    for key in rows[0]:
        print(f"  {key}: {statistics.median(r[key] for r in rows):.3f}")


if __name__ == "__main__":
    main()
