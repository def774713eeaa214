#!/usr/bin/env python3
"""Continuous batching in `weft serve`, measured over HTTP: many clients generating at once, and a
short request sent while a long one runs, with `--max-sequences 1` (one sequence at a time, as a
server without continuous batching runs them) against `--max-sequences 8` (or the values of
`--sequences`).

    cargo build --release -p weft-cli
    python3 tools/bench/serve_decode.py [--weft target/release/weft] [--clients 8] [--tokens 64]
                                        [--sequences 1,8]

The model is a gpt trained for two steps on the built-in corpus (n_layer 6, n_embd 512, 8 heads,
block_size 256: big enough that a decode step is a few milliseconds); what it says does not
matter, only how long it takes. Every request is greedy (`temperature 0`) with `max_tokens` fixed,
so every run does the same work. Prints, per setting: the wall time for `--clients` concurrent
requests of `--tokens` tokens each (streamed) and the tokens per second that makes, the median
and the slowest client's time to its first token, and the latency of an 8-token request sent
100 ms after a 240-token one (medians of 3 runs). Standard library only.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def complete(port, tokens, prompt="ROMEO:"):
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": tokens, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    made = out["usage"]["completion_tokens"]
    if made != tokens:
        raise SystemExit(f"asked for {tokens} tokens, got {made}")
    return made


def streamed(port, tokens, prompt="ROMEO:"):
    """Seconds from sending to the first streamed text, for a streamed completion of `tokens`."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                       "stream": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    first = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            if first is None and json.loads(line[6:])["choices"][0]["text"]:
                first = time.perf_counter() - t
    if first is None:
        raise SystemExit("a streamed completion sent no text")
    return first


def serve(weft, store, max_sequences):
    port, mport, xport = free_port(), free_port(), free_port()
    p = subprocess.Popen([weft, "serve", "--model-store", str(store), "--model", "m=ckpt", "--port", str(port),
                          "--management-port", str(mport), "--metrics-port", str(xport),
                          "--max-sequences", str(max_sequences), "--queue", "64"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.time() + 120
    while time.time() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return p, port
        except OSError:
            time.sleep(0.1)
    p.kill()
    raise SystemExit("weft serve did not become ready in 120 s")


def concurrent(port, clients, tokens):
    """Wall seconds for `clients` streamed completions at once, and their times to first text."""
    errors, firsts = [], []

    def one():
        try:
            firsts.append(streamed(port, tokens))
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t
    if errors:
        raise SystemExit(f"a request failed: {errors[0]}")
    return wall, statistics.median(firsts), max(firsts)


def short_behind_long(port):
    long = threading.Thread(target=complete, args=(port, 240))
    long.start()
    time.sleep(0.1)
    t = time.perf_counter()
    complete(port, 8)
    latency = time.perf_counter() - t
    long.join()
    return latency


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weft", default=str(ROOT / "target/release/weft"))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--sequences", default="1,8", help="the --max-sequences values to run, comma-separated")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="weft-serve-decode-"))
    store = work / "store"
    subprocess.run([a.weft, "train", "--quiet", "--set", "train.steps=2", "--set", "model.n_layer=6",
                    "--set", "model.n_embd=512", "--set", "model.n_head=8", "--set", "model.block_size=256",
                    "--set", "train.eval_every=0", "--set", "train.sample_tokens=0", "--set", "track.enabled=false",
                    "--set", f"train.checkpoint_dir={store / 'ckpt'}"], check=True, cwd=work)
    rows = []
    for seqs in [int(v) for v in a.sequences.split(",")]:
        p, port = serve(a.weft, store, seqs)
        try:
            complete(port, 4)  # warm-up
            runs = [concurrent(port, a.clients, a.tokens) for _ in range(3)]
            shorts = [short_behind_long(port) for _ in range(3)]
        finally:
            p.terminate()
            p.wait()
        wall = statistics.median(r[0] for r in runs)
        ttft = statistics.median(r[1] for r in runs)
        slowest = statistics.median(r[2] for r in runs)
        rows.append((seqs, wall, a.clients * a.tokens / wall, ttft, slowest, statistics.median(shorts)))
    print(f"{a.clients} clients x {a.tokens} tokens, greedy, streamed; medians of 3 ({os.cpu_count()} CPUs)")
    print("| --max-sequences | wall s | tokens/s | time to first token, median s | slowest client's, s "
          "| 8-token request behind a 240-token one, s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for seqs, wall, rate, ttft, slowest, short in rows:
        print(f"| {seqs} | {wall:.2f} | {rate:.0f} | {ttft:.3f} | {slowest:.3f} | {short:.3f} |")


if __name__ == "__main__":
    sys.exit(main())
