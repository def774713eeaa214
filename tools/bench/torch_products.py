"""PyTorch's CPU matrix products at the shapes of crates/weft-core/examples/bf16_products.rs: the
forward `x @ w^T` and the backward's `g @ w` and `g^T @ x` of a projection with m rows, k inputs and
n outputs, in float32 and bfloat16, GFLOP/s of the median of 10 rounds of 10 calls (after 3 warm-up
calls), on --threads threads.

    python3 tools/bench/torch_products.py [--threads 1] [m k n ...]

With no sizes: 2048 256 688, 2048 688 256 and 1024 1024 1024.
"""

import argparse
import statistics
import time

import torch


def rate(f, flops):
    for _ in range(3):
        f()
    rounds = []
    for _ in range(10):
        t = time.perf_counter()
        for _ in range(10):
            f()
        rounds.append((time.perf_counter() - t) / 10)
    return flops / statistics.median(rounds) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("sizes", type=int, nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sizes = args.sizes or [2048, 256, 688, 2048, 688, 256, 1024, 1024, 1024]
    if len(sizes) % 3:
        ap.error("sizes come in threes: m k n")
    print(f"torch {torch.__version__}; {args.threads} threads")
    for i in range(0, len(sizes), 3):
        m, k, n = sizes[i:i + 3]
        flops = 2.0 * m * n * k
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(m, k).to(dtype)
            w = torch.randn(n, k).to(dtype)
            g = torch.randn(m, n).to(dtype)
            print(f"{str(dtype).removeprefix('torch.')} {m}x{k}x{n}: "
                  f"x @ w^T {rate(lambda: x @ w.t(), flops):.1f}, "
                  f"g @ w {rate(lambda: g @ w, flops):.1f}, "
                  f"g^T @ x {rate(lambda: g.t() @ x, flops):.1f} GFLOP/s")


if __name__ == "__main__":
    main()
