"""The collective benchmark of `weft bench collectives`, for torch.distributed with the gloo backend.

Same ops, sizes, timing and bandwidth conventions (nccl-tests' busbw). Start it with torch's
launcher, e.g.

    python3 -m torch.distributed.run --nproc-per-node 2 tools/bench/torch_collectives.py --json

Prints, from rank 0, a table or one JSON object per line with op, bytes, ranks, median_us,
algbw_gbps and busbw_gbps. Ops gloo does not implement are skipped with a note on stderr.
"""

import argparse
import json
import sys
import time

import torch
import torch.distributed as dist

OPS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all"]


def bus_factor(op, n):
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def call(op, a, b, c):
    if op == "all_reduce":
        dist.all_reduce(a)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(b, a)
    elif op == "all_gather":
        dist.all_gather_into_tensor(a, b)
    elif op == "broadcast":
        dist.broadcast(a, 0)
    elif op == "reduce":
        dist.reduce(a, 0)
    elif op == "all_to_all":
        dist.all_to_all_single(c, a)


def max_over_ranks(x):
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--min-bytes", type=int, default=4096)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--budget-ms", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    sizes = []
    s = args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= 4
    rows = []
    for op in args.ops.split(","):
        for size in sizes:
            per_rank = max(size // 4 // n, 1)
            elems = per_rank * n
            a, b, c = torch.zeros(elems), torch.zeros(per_rank), torch.zeros(elems)
            try:
                t0 = time.perf_counter()
                for _ in range(2):
                    call(op, a, b, c)
            except (RuntimeError, NotImplementedError) as e:
                if rank == 0:
                    print(f"skipped {op}: {str(e).splitlines()[0]}", file=sys.stderr)
                break
            each = max_over_ranks((time.perf_counter() - t0) / 2)
            iters = min(max(int(args.budget_ms / 1e3 / max(each, 1e-9)), 5), 1000)
            times = []
            for _ in range(iters):
                t = time.perf_counter()
                call(op, a, b, c)
                times.append(time.perf_counter() - t)
            times.sort()
            median = max_over_ranks(times[iters // 2])
            algbw = elems * 4 / median / 1e9
            rows.append(dict(impl="torch-gloo", op=op, bytes=elems * 4, ranks=n, median_us=round(median * 1e6, 1),
                             algbw_gbps=round(algbw, 3), busbw_gbps=round(algbw * bus_factor(op, n), 3)))
    if rank == 0:
        if args.json:
            for r in rows:
                print(json.dumps(r))
        else:
            print("| op | bytes | median µs | algbw GB/s | busbw GB/s |")
            print("|---|---:|---:|---:|---:|")
            for r in rows:
                print(f"| {r['op']} | {r['bytes']} | {r['median_us']} | {r['algbw_gbps']} | {r['busbw_gbps']} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
