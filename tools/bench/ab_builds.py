"""Step time of two weft builds on the built-in run, alternating, one process and dp = 2.

    python3 tools/bench/ab_builds.py --old /path/to/old/weft [--new target/release/weft] [--repeat 6]

Each repeat runs both builds (alternating which goes first) for 80 steps and takes the median
step time of steps 6 to 80 from the metrics file; one process uses 2 threads, dp = 2 runs under
`weft launch` with 1 thread per rank. Prints the median over repeats of each build and their ratio.
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def run(weft, dp):
    work = tempfile.mkdtemp(prefix="weft-ab-")
    metrics = os.path.join(work, "m.jsonl")
    cmd = [weft, "train", "--quiet"]
    for s in ["train.steps=80", "train.log_every=1", "train.eval_every=0", "train.sample_tokens=0",
              f"train.metrics={json.dumps(metrics)}"]:
        cmd += ["--set", s]
    env = dict(os.environ, WEFT_NUM_THREADS="2")
    if dp > 1:
        cmd = [weft, "launch", "--nproc-per-node", str(dp), "--"] + cmd + ["--set", f"parallel.dp={dp}"]
        env["WEFT_NUM_THREADS"] = "1"
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in open(metrics)]
    return statistics.median(r["step_ms"] for r in rows[5:] if "step_ms" in r)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default=os.path.join(ROOT, "target", "release", "weft"))
    ap.add_argument("--repeat", type=int, default=6)
    args = ap.parse_args()
    for dp in [1, 2]:
        got = {"old": [], "new": []}
        for i in range(args.repeat):
            order = [("old", args.old), ("new", args.new)]
            for name, weft in (order if i % 2 == 0 else order[::-1]):
                got[name].append(run(weft, dp))
        old, new = statistics.median(got["old"]), statistics.median(got["new"])
        print(f"dp={dp}: old {old:.2f} ms, new {new:.2f} ms, new/old {new / old:.3f}", flush=True)


if __name__ == "__main__":
    main()
