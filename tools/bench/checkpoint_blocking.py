"""How long saving a checkpoint blocks training: the built-in run's GPT, 40 steps with a checkpoint
every 10, read from the timeline. Each rank copies the pieces of the state it owns (the part
that blocks, span "copy step N"), then a background thread serializes, writes and fsyncs its
files ("write step N") while the next steps run; rank 0's thread also waits for every other
rank's files and completes the checkpoint.

Build first (`cargo build --release`), then from the repository root:

    python3 tools/bench/checkpoint_blocking.py [--repeat 3] [--layout "dp=2 zero=3"]

Prints, per repeat, the blocking milliseconds summed over the 4 checkpoints (of the rank that
blocked longest), the background milliseconds of rank 0 (until each checkpoint was complete),
and the blocking share of the whole save, blocking / (blocking + write).
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WEFT = os.path.join(HERE, "..", "..", "target", "release", "weft")


def run(work, layout):
    trace = os.path.join(work, "trace.json")
    sets = ["train.steps=40", "train.checkpoint_every=10", "train.eval_every=0", "train.sample_tokens=0",
            f"train.checkpoint_dir={json.dumps(os.path.join(work, 'ckpt'))}", f"train.trace={json.dumps(trace)}"]
    ranks = 1
    for kv in layout.split():
        key, value = kv.split("=")
        sets.append(f"parallel.{key}={value}")
        if key in ("dp", "tp", "pp"):
            ranks *= int(value)
    cmd = [WEFT, "train", "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    if ranks > 1:
        cmd = [WEFT, "launch", "--nproc-per-node", str(ranks), "--"] + cmd
    subprocess.run(cmd, check=True, env=dict(os.environ, WEFT_NUM_THREADS="1"))
    events = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X"]
    blocking = max(sum(e["dur"] for e in events if e["pid"] == pid and e["name"].startswith("copy step"))
                   for pid in {e["pid"] for e in events}) / 1e3
    write = sum(e["dur"] for e in events if e["pid"] == 0 and e["name"].startswith("write step")) / 1e3
    return blocking, write


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--layout", default="", help='e.g. "dp=2 zero=3" (default: one process)')
    args = ap.parse_args()
    shares = []
    for i in range(args.repeat):
        work = tempfile.mkdtemp(prefix="weft-ckpt-")
        blocking, write = run(work, args.layout)
        shares.append(blocking / (blocking + write))
        print(f"[{i + 1}/{args.repeat}] blocking {blocking:.1f} ms, background write {write:.1f} ms, "
              f"blocking share {shares[-1]:.3f}", flush=True)
    print(f"median blocking share ({args.layout or 'one process'}): {statistics.median(shares):.3f}")


if __name__ == "__main__":
    main()
