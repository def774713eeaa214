"""Puts `weft bench ops` and tools/bench/torch_ops.py side by side as a markdown table.

Build the release binary first (`cargo build --release`), then run from the repository root with
the Python that has torch:

    python3 tools/bench/compare.py [--threads 2] [--repeat 3] [--min-ms 1000]
        [--filter NAME] [--weft target/release/weft]

Each repeat runs `weft bench ops --json` (with WEFT_NUM_THREADS set to --threads) and
`torch_ops.py --json --threads N` (with this interpreter), alternating which goes first. For every
(op, shape) the median over the repeats of each side's median time is taken, and the table shows
both times, both rates (GFLOP/s or GB/s) and the weft/torch throughput ratio (above 1: weft is
faster).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def run_json(cmd, env=None):
    """Runs cmd and returns the JSON objects it printed, one per line (other lines are skipped)."""
    res = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=False)
    if res.returncode != 0:
        sys.exit(f"command failed with status {res.returncode}: {' '.join(cmd)}")
    rows = []
    for line in res.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def rate_of(row):
    """(rate, unit) of one result row."""
    if "gflops" in row:
        return row["gflops"], "GFLOP/s"
    return row["gbps"], "GB/s"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weft", default=os.path.join(ROOT, "target", "release", "weft"), help="the weft binary")
    ap.add_argument("--threads", type=int, default=2, help="threads for both (default 2)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each side, alternating (default 1)")
    ap.add_argument("--min-ms", type=int, default=1000, help="minimum measuring time per op, in milliseconds")
    ap.add_argument("--filter", help="only ops whose name contains this text")
    args = ap.parse_args()

    if not os.path.exists(args.weft):
        sys.exit(f"{args.weft} not found: build it with `cargo build --release`, or pass --weft PATH")
    common = ["--json", "--min-ms", str(args.min_ms)]
    if args.filter:
        common += ["--filter", args.filter]
    weft_cmd = [args.weft, "bench", "ops"] + common
    weft_env = dict(os.environ, WEFT_NUM_THREADS=str(args.threads))
    torch_cmd = [sys.executable, os.path.join(HERE, "torch_ops.py"), "--threads", str(args.threads)] + common

    # (impl, op, shape) -> list of rows, one per repeat; order: first appearance (weft's order).
    results = {}
    order = []
    for i in range(args.repeat):
        sides = [("weft", weft_cmd, weft_env), ("torch", torch_cmd, None)]
        if i % 2 == 1:
            sides.reverse()
        for impl, cmd, env in sides:
            print(f"[{i + 1}/{args.repeat}] {impl} ...", file=sys.stderr, flush=True)
            for row in run_json(cmd, env):
                key = (row["op"], row["shape"])
                if key not in order:
                    order.append(key)
                results.setdefault((impl, key), []).append(row)
    weft_keys = [k for k in order if ("weft", k) in results]
    order = weft_keys + [k for k in order if k not in weft_keys]

    def summary(impl, key):
        rows = results.get((impl, key))
        if not rows:
            return None
        us = statistics.median(r["median_us"] for r in rows)
        rate = statistics.median(rate_of(r)[0] for r in rows)
        return us, rate, rate_of(rows[0])[1]

    print(f"{args.threads} threads, median of {args.repeat} run(s) of each side\n")
    print("| op | shape | weft median_us | torch median_us | weft rate | torch rate | weft/torch throughput |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for key in order:
        w, t = summary("weft", key), summary("torch", key)
        cells = [key[0], key[1]]
        cells.append(f"{w[0]:.1f}" if w else "-")
        cells.append(f"{t[0]:.1f}" if t else "-")
        cells.append(f"{w[1]:.2f} {w[2]}" if w else "-")
        cells.append(f"{t[1]:.2f} {t[2]}" if t else "-")
        cells.append(f"{w[1] / t[1]:.2f}x" if w and t and t[1] > 0 else "-")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
