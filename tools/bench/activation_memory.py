"""Memory and step time of two weft builds on the built-in run's models, alternating.

    python3 tools/bench/activation_memory.py --old /path/to/old/weft [--new target/release/weft]
        [--repeat 3] [--steps 8]

For each case (the built-in gpt and a llama of the same size, f32 and bf16, one process; the
built-in gpt as dp1 tp2 pp2 with 4 micro-batches under `weft launch`), both builds run
`--steps` steps, alternating which goes first. Reported per build, as medians over repeats:
the peak bytes allocated during a step (`host_mem_bytes`, the largest over steps and ranks),
the activation bytes a pipeline logged (`activation_bytes`, the largest stage), and the median
step time of the second half of the steps.
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))

RUN = ["train.log_every=1", "train.eval_every=0", "train.sample_tokens=0"]
LLAMA = ['model.kind="llama"', "model.n_kv_head=2", "model.intermediate_size=344"]
LLAMA_UNSET = ["model.bias", "model.dropout"]
PIPELINE = ["parallel.tp=2", "parallel.pp=2", "parallel.micro_batches=4", 'parallel.schedule="1f1b"',
            "parallel.stage_blocks=[2, 2]"]

CASES = [
    # name, sets, unsets, ranks
    ("gpt f32", [], [], 1),
    ("gpt bf16", ['train.precision="bf16"'], [], 1),
    ("llama f32", LLAMA, LLAMA_UNSET, 1),
    ("llama bf16", LLAMA + ['train.precision="bf16"'], LLAMA_UNSET, 1),
    ("gpt f32 tp2 pp2 m4", PIPELINE, [], 4),
    ("gpt bf16 tp2 pp2 m4", PIPELINE + ['train.precision="bf16"'], [], 4),
]


def run(weft, sets, unsets, ranks, steps):
    work = tempfile.mkdtemp(prefix="weft-mem-")
    metrics = os.path.join(work, "m.jsonl")
    cmd = [weft, "train", "--quiet"]
    for s in RUN + sets + [f"train.steps={steps}", f"train.metrics={json.dumps(metrics)}"]:
        cmd += ["--set", s]
    for u in unsets:
        cmd += ["--unset", u]
    env = dict(os.environ, WEFT_NUM_THREADS="2")
    if ranks > 1:
        cmd = [weft, "launch", "--nproc-per-node", str(ranks), "--"] + cmd
        env["WEFT_NUM_THREADS"] = "1"
    subprocess.run(cmd, check=True, env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in open(metrics) if line.strip()]
    steps_ = [r for r in rows if "step_ms" in r]
    peak = max(r.get("host_mem_bytes", 0) for r in steps_)
    acts = [max(r["activation_bytes"]) for r in steps_ if r.get("activation_bytes")]
    ms = statistics.median(r["step_ms"] for r in steps_[len(steps_) // 2:])
    return peak, (max(acts) if acts else None), ms


def mb(x):
    return "-" if x is None else f"{x / 1e6:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default=os.path.join(ROOT, "target", "release", "weft"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    print("| case | peak MB old | peak MB new | new/old | activations MB old | new | step ms old | new |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, sets, unsets, ranks in CASES:
        got = {"old": [], "new": []}
        for i in range(args.repeat):
            order = [("old", args.old), ("new", args.new)]
            for which, weft in (order if i % 2 == 0 else order[::-1]):
                got[which].append(run(weft, sets, unsets, ranks, args.steps))

        def med(which, k):
            vals = [g[k] for g in got[which] if g[k] is not None]
            return statistics.median(vals) if vals else None

        po, pn = med("old", 0), med("new", 0)
        print(f"| {name} | {mb(po)} | {mb(pn)} | {pn / po:.3f} | {mb(med('old', 1))} | {mb(med('new', 1))} "
              f"| {med('old', 2):.1f} | {med('new', 2):.1f} |", flush=True)


if __name__ == "__main__":
    main()
