"""Times, with PyTorch on the CPU, the ops and shapes of `weft bench ops`.

Run from anywhere (needs torch):

    python3 tools/bench/torch_ops.py [--json] [--filter NAME] [--min-ms N] [--threads N]

The cases, shapes, work formulas and timing method mirror crates/weft-cli/src/bench.rs: float32
inputs, 2 warm-up runs, then runs until at least --min-ms milliseconds have passed and at least 5
runs were made (at most 1000), and the median run time is reported with the throughput it implies
(GFLOP/s for matmul, attention and conv2d; GB/s for the memory-bound ops). Op names and shape strings
are the same as weft's so the two outputs can be joined on (op, shape); tools/bench/compare.py does
that. Forward-only ops run under torch.no_grad(); attention runs forward and backward with
F.scaled_dot_product_attention(q, k, v, is_causal=True) and o.backward(dout), clearing the input
gradients after each run, as weft's bench does.

Output: a table by default; with --json, one JSON object per line with the keys op, shape,
median_us, gflops or gbps, threads and impl ("torch"), in weft's format.
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F


def randn(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float32)


def cases():
    """(op, shape, kind, work, run) for every case, in weft's order. kind: "flops" or "bytes"."""
    out = []
    for n in (256, 1024, 2048):
        a, b = randn((n, n), 1), randn((n, n), 2)

        def run(a=a, b=b):
            with torch.no_grad():
                torch.matmul(a, b)

        out.append(("matmul", f"{n}x{n}x{n}", "flops", 2.0 * n * n * n, run))

    rows, cols = 8192, 1024
    nbytes = float(2 * rows * cols * 4)
    x = randn((rows, cols), 3)

    def softmax():
        with torch.no_grad():
            torch.softmax(x, dim=-1)

    out.append(("softmax", f"{rows}x{cols}", "bytes", nbytes, softmax))
    w, b = randn((cols,), 4), randn((cols,), 5)

    def layer_norm():
        with torch.no_grad():
            F.layer_norm(x, (cols,), w, b, eps=1e-5)

    out.append(("layer_norm", f"{rows}x{cols}", "bytes", nbytes, layer_norm))

    def gelu():
        with torch.no_grad():
            F.gelu(x)

    out.append(("gelu", f"{rows}x{cols}", "bytes", nbytes, gelu))

    n, c = 4096, 8192
    logits = randn((n, c), 6)
    targets = (torch.arange(n, dtype=torch.int64) * 7919) % c

    def cross_entropy():
        with torch.no_grad():
            F.cross_entropy(logits, targets, ignore_index=-100, label_smoothing=0.0)

    out.append(("cross_entropy", f"{n}x{c}", "bytes", float(n * c * 4), cross_entropy))

    bsz, h, t, d = 4, 8, 512, 64
    q = randn((bsz, h, t, d), 7).requires_grad_()
    k = randn((bsz, h, t, d), 8).requires_grad_()
    v = randn((bsz, h, t, d), 9).requires_grad_()
    dout = randn((bsz, h, t, d), 10)

    def attention():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.backward(dout)
        for p in (q, k, v):
            p.grad = None

    # 7 matmuls of T x T x D (2 forward, 5 backward), half of each masked away (weft's formula).
    out.append(("attention_fwd_bwd", f"{bsz}x{h}x{t}x{d} causal", "flops", 7.0 * bsz * h * t * t * d, attention))

    cn, cc, hw, co = 16, 64, 56, 64
    cx = randn((cn, cc, hw, hw), 11)
    cw = randn((co, cc, 3, 3), 12)

    def conv2d():
        with torch.no_grad():
            F.conv2d(cx, cw, None, padding=1)

    out.append(("conv2d", f"{cn}x{cc}x{hw}x{hw} k3x3 o{co} pad1", "flops", 2.0 * cn * co * hw * hw * cc * 9, conv2d))
    return out


def measure(run, min_ms):
    """Median seconds of one run: 2 warm-ups, then at least 5 runs and min_ms ms (at most 1000 runs)."""
    for _ in range(2):
        run()
    times = []
    start = time.perf_counter()
    while len(times) < 5 or ((time.perf_counter() - start) * 1e3 < min_ms and len(times) < 1000):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    ap.add_argument("--filter", help="only ops whose name contains this text")
    ap.add_argument("--min-ms", type=int, default=1000, help="minimum measuring time per op, in milliseconds")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    if not args.json:
        print(f"torch bench ops ({threads} threads; median of repeated runs)")
        print(f"{'op':<20} {'shape':<28} {'median_us':>12} {'rate':>10} {'unit':>8}")
    for op, shape, kind, work, run in cases():
        if args.filter and args.filter not in op:
            continue
        secs = measure(run, args.min_ms)
        rate = work / secs / 1e9
        key, unit = ("gflops", "GFLOP/s") if kind == "flops" else ("gbps", "GB/s")
        us = secs * 1e6
        if args.json:
            obj = {"op": op, "shape": shape, "median_us": us, key: rate, "threads": threads, "impl": "torch"}
            # Sorted keys and no spaces, as weft's serde_json output.
            print(json.dumps(obj, sort_keys=True, separators=(",", ":")), flush=True)
        else:
            print(f"{op:<20} {shape:<28} {us:>12.1f} {rate:>10.2f} {unit:>8}", flush=True)


if __name__ == "__main__":
    main()
