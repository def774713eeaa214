"""Collective latency and bus bandwidth, weft against torch.distributed (gloo), side by side.

Build first (`cargo build --release`), then from the repository root, with a Python that has
torch:

    python3 tools/bench/compare_collectives.py [--nproc 2] [--repeat 3] [--ops all_reduce,...]

Each repeat runs `weft launch ... weft bench collectives --json` and
`python -m torch.distributed.run ... tools/bench/torch_collectives.py --json`, alternating which
goes first; prints per (op, bytes) the median over repeats of each side's median latency and
bus bandwidth, and weft's speed-up (torch time / weft time).
"""

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def rows(cmd, env):
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=env).stdout
    found = []
    for line in out.splitlines():
        line = line.split("]: ", 1)[-1] if line.startswith("[rank") else line
        if line.startswith("{"):
            found.append(json.loads(line))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ops", default="all_reduce,reduce_scatter,all_gather,broadcast,all_to_all")
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--weft", default=os.path.join(ROOT, "target", "release", "weft"))
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    weft = [args.weft, "launch", "--nproc-per-node", str(args.nproc), "--", args.weft, "bench", "collectives",
            "--json", "--ops", args.ops, "--max-bytes", str(args.max_bytes)]
    torch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc),
             os.path.join(HERE, "torch_collectives.py"), "--json", "--ops", args.ops,
             "--max-bytes", str(args.max_bytes)]
    got = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in range(args.repeat):
        order = [("weft", weft), ("torch", torch)] if r % 2 == 0 else [("torch", torch), ("weft", weft)]
        for name, cmd in order:
            for row in rows(cmd, env):
                got[(row["op"], row["bytes"])][name].append(row)
        print(f"[{r + 1}/{args.repeat}] done", file=sys.stderr)
    print(f"{args.nproc} ranks, median of {args.repeat} runs (each the median over calls of the slowest rank)")
    print("| op | bytes | weft µs | torch gloo µs | weft busbw GB/s | torch busbw GB/s | speed-up |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (op, size), sides in sorted(got.items(), key=lambda kv: (args.ops.split(",").index(kv[0][0]), kv[0][1])):
        w = statistics.median(x["median_us"] for x in sides["weft"]) if sides["weft"] else float("nan")
        t = statistics.median(x["median_us"] for x in sides["torch"]) if sides["torch"] else float("nan")
        wb = statistics.median(x["busbw_gbps"] for x in sides["weft"]) if sides["weft"] else float("nan")
        tb = statistics.median(x["busbw_gbps"] for x in sides["torch"]) if sides["torch"] else float("nan")
        print(f"| {op} | {size} | {w:.1f} | {t:.1f} | {wb:.3f} | {tb:.3f} | {t / w:.2f}x |")


if __name__ == "__main__":
    main()
