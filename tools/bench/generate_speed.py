#!/usr/bin/env python3
"""Greedy generation speed, weft against transformers on the same CPU threads, in one run.

The model: a GPT of GPT-2's width (n_embd 768, 12 heads, vocab 50304) with 6 layers and a
256-token block; 200 new tokens after a 16-token prompt. transformers' GPT2LMHeadModel runs
`generate(do_sample=False)` with its key/value cache (use_cache=True) and without it; weft runs
`crates/weft-models/examples/generate_speed` (cached `LanguageModel::generate` against the
whole-context loop). Prints tokens/s medians side by side.

    cargo build --release -p weft-models --example generate_speed
    python3 tools/bench/generate_speed.py [--threads 2] [--tokens 200] [--repeats 3]

Needs torch and transformers (a venv outside the repository); CI does not run it.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def torch_rates(threads, tokens, repeats):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=50304, n_positions=256, n_embd=768, n_layer=6, n_head=12,
                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg).eval()
    prompt = torch.tensor([[(i * 97 + 5) % 50304 for i in range(16)]])
    rates = {}
    for use_cache in (True, False):
        runs = []
        for _ in range(repeats):
            t = time.perf_counter()
            with torch.no_grad():
                out = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                                     use_cache=use_cache, pad_token_id=0)
            runs.append(tokens / (time.perf_counter() - t))
            assert out.shape[1] == 16 + tokens
        rates[use_cache] = statistics.median(runs)
    return rates


def weft_rates(threads, tokens, repeats):
    exe = ROOT / "target/release/examples/generate_speed"
    if not exe.exists():
        sys.exit(f"{exe} is missing: cargo build --release -p weft-models --example generate_speed")
    env = dict(os.environ, WEFT_NUM_THREADS=str(threads))
    out = subprocess.run([str(exe), str(tokens), str(repeats)], env=env, check=True, capture_output=True,
                         text=True).stdout
    cached, whole = [], []
    for m in re.finditer(r"cached ([\d.]+) tokens/s, whole context ([\d.]+) tokens/s", out):
        cached.append(float(m.group(1)))
        whole.append(float(m.group(2)))
    return statistics.median(cached), statistics.median(whole)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    w_cached, w_whole = weft_rates(a.threads, a.tokens, a.repeats)
    t = torch_rates(a.threads, a.tokens, a.repeats)
    print(f"greedy generation, {a.tokens} new tokens after 16, {a.threads} threads, medians of {a.repeats}")
    print("| | weft tokens/s | transformers tokens/s | weft / transformers |")
    print("|---|---:|---:|---:|")
    print(f"| with a key/value cache | {w_cached:.1f} | {t[True]:.1f} | {w_cached / t[True]:.2f} |")
    print(f"| whole context each token | {w_whole:.1f} | {t[False]:.1f} | {w_whole / t[False]:.2f} |")


if __name__ == "__main__":
    main()
