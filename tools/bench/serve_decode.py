#!/usr/bin/env python3
"""Continuous batching in `weft serve`, measured over HTTP: many clients generating at once, and a
short request sent while a long one runs, with `--max-sequences 1` (one sequence at a time, as a
server without continuous batching runs them) against `--max-sequences 8` (or the values of
`--sequences`); and, with `--prefill-chunks`, a long prompt joining while short requests stream,
with each `--prefill-chunk` given.

    cargo build --release -p weft-cli
    python3 tools/bench/serve_decode.py [--weft target/release/weft] [--clients 8] [--tokens 64]
                                        [--sequences 1,8] [--prefill-chunks 0,64]

The model is a gpt trained for two steps on the built-in corpus (n_layer 6, n_embd 512, 8 heads,
block_size 256: big enough that a decode step is a few milliseconds); what it says does not
matter, only how long it takes. Every request is greedy (`temperature 0`) with `max_tokens` fixed,
so every run does the same work. Prints, per setting: the wall time for `--clients` concurrent
requests of `--tokens` tokens each (streamed) and the tokens per second that makes, the median
and the slowest client's time to its first token, and the latency of an 8-token request sent
100 ms after a 240-token one (medians of 3 runs). With `--prefill-chunks`, per chunk setting (at
`--max-sequences 8`, the settings alternated run by run): 4 streamed requests of 96 tokens each
with a short prompt, and 300 ms after they start a request whose prompt is 240 tokens long (8 new
tokens); the longest gap between two consecutive tokens of the short streams, their median gap,
and the long request's time to its first token (medians of 3 runs). With `--shared-prompt`: 8
completions of 16 tokens of the 240-token prompt (temperature 1, seeds 1 to 8), as one request
with `n: 8` (the prompt runs once) and as 8 requests with `n: 1` sent at once (each runs it, as
`n` did before its prompt was shared): the wall time and the prompt tokens the server ran
(`weft_prefill_tokens_total`), medians of 3. Standard library only.
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


def token_times(port, tokens, prompt="ROMEO:"):
    """The arrival time (perf_counter) of each streamed text piece of a completion of `tokens`."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                       "stream": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    times = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            if json.loads(line[6:])["choices"][0]["text"]:
                times.append(time.perf_counter())
    return times


def streamed(port, tokens, prompt="ROMEO:"):
    """Seconds from sending to the first streamed text, for a streamed completion of `tokens`."""
    t = time.perf_counter()
    times = token_times(port, tokens, prompt)
    if not times:
        raise SystemExit("a streamed completion sent no text")
    return times[0] - t


# 240 characters: 240 tokens of the built-in corpus's character tokenizer
LONG_PROMPT = ("ROMEO:\nBut soft, what light through yonder window breaks? " * 5)[:240]


def long_prompt_joins(port, streams=4, tokens=96):
    """`streams` streamed completions of `tokens` tokens; 300 ms after they start, one of 8 tokens
    whose prompt is 240 tokens long. Returns the longest and the median gap (s) between
    consecutive tokens of the short streams, and the long request's time to its first token."""
    results, errors = [None] * streams, []

    def short(i):
        try:
            results[i] = token_times(port, tokens)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=short, args=(i,)) for i in range(streams)]
    for th in threads:
        th.start()
    time.sleep(0.3)
    t = time.perf_counter()
    long = token_times(port, 8, prompt=LONG_PROMPT)
    long_first = long[0] - t
    for th in threads:
        th.join()
    if errors:
        raise SystemExit(f"a request failed: {errors[0]}")
    gaps = [b - a for times in results for a, b in zip(times, times[1:])]
    if not gaps or not all(r and len(r) >= tokens // 2 for r in results):
        raise SystemExit("a short stream sent too few pieces")
    if results[0][-1] < t:
        raise SystemExit("the short streams ended before the long prompt arrived; ask for more tokens")
    return max(gaps), statistics.median(gaps), long_first


def sampled(port, n, seed, tokens=16):
    """A completion request of the long prompt with `n` choices (temperature 1, seed `seed`)."""
    body = json.dumps({"model": "m", "prompt": LONG_PROMPT, "max_tokens": tokens, "temperature": 1,
                       "seed": seed, "n": n}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    return [c["text"] for c in out["choices"]]


def prefilled(xport):
    with urllib.request.urlopen(f"http://127.0.0.1:{xport}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("weft_prefill_tokens_total{"):
                return float(line.rsplit(" ", 1)[1])
    raise SystemExit("no weft_prefill_tokens_total in the metrics")


def shared_prompt(port, xport):
    """Wall seconds and prompt tokens run for 8 completions as one `n: 8` request and as 8
    single requests at once, and how many of the 8 texts differ between the two."""
    before = prefilled(xport)
    t = time.perf_counter()
    together = sampled(port, 8, 1)
    wall_n = time.perf_counter() - t
    ran_n = prefilled(xport) - before
    texts, errors = [None] * 8, []

    def one(i):
        try:
            texts[i] = sampled(port, 1, 1 + i)[0]
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    before = prefilled(xport)
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall_single = time.perf_counter() - t
    ran_single = prefilled(xport) - before
    if errors:
        raise SystemExit(f"a request failed: {errors[0]}")
    # a prompt of more than 64 rows beside others goes through the gemm crate, whose rounding
    # depends on the rows around it: a draw at a near tie may differ, so this is counted, not fatal
    differ = sum(a != b for a, b in zip(texts, together))
    return wall_n, ran_n, wall_single, ran_single, differ


def serve(weft, store, max_sequences, prefill_chunk=None):
    port, mport, xport = free_port(), free_port(), free_port()
    chunk = [] if prefill_chunk is None else ["--prefill-chunk", str(prefill_chunk)]
    p = subprocess.Popen([weft, "serve", "--model-store", str(store), "--model", "m=ckpt", "--port", str(port),
                          "--management-port", str(mport), "--metrics-port", str(xport),
                          "--max-sequences", str(max_sequences), "--queue", "64"] + chunk,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.time() + 120
    while time.time() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    serve.metrics_port = xport
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
    ap.add_argument("--prefill-chunks", default="",
                    help="the --prefill-chunk values of the long-prompt case, comma-separated (none: skip it)")
    ap.add_argument("--shared-prompt", action="store_true", help="run the n: 8 case too")
    ap.add_argument("--only-prefill", action="store_true",
                    help="skip the concurrent clients and the short request behind a long one")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="weft-serve-decode-"))
    store = work / "store"
    subprocess.run([a.weft, "train", "--quiet", "--set", "train.steps=2", "--set", "model.n_layer=6",
                    "--set", "model.n_embd=512", "--set", "model.n_head=8", "--set", "model.block_size=256",
                    "--set", "train.eval_every=0", "--set", "train.sample_tokens=0", "--set", "track.enabled=false",
                    "--set", f"train.checkpoint_dir={store / 'ckpt'}"], check=True, cwd=work)
    rows = []
    for seqs in [] if a.only_prefill else [int(v) for v in a.sequences.split(",")]:
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
    chunks = [int(v) for v in a.prefill_chunks.split(",") if v.strip()]
    joins = {c: [] for c in chunks}
    for _ in range(3 if chunks else 0):
        # the settings alternate run by run, each on a fresh server
        for c in chunks:
            p, port = serve(a.weft, store, 8, c)
            try:
                complete(port, 4)  # warm-up
                joins[c].append(long_prompt_joins(port))
            finally:
                p.terminate()
                p.wait()
    shared = []
    if a.shared_prompt:
        p, port = serve(a.weft, store, 8)
        try:
            complete(port, 4)  # warm-up
            shared = [shared_prompt(port, serve.metrics_port) for _ in range(3)]
        finally:
            p.terminate()
            p.wait()
    if rows:
        print(f"{a.clients} clients x {a.tokens} tokens, greedy, streamed; medians of 3 ({os.cpu_count()} CPUs)")
        print("| --max-sequences | wall s | tokens/s | time to first token, median s | slowest client's, s "
              "| 8-token request behind a 240-token one, s |")
        print("|---:|---:|---:|---:|---:|---:|")
        for seqs, wall, rate, ttft, slowest, short in rows:
            print(f"| {seqs} | {wall:.2f} | {rate:.0f} | {ttft:.3f} | {slowest:.3f} | {short:.3f} |")
    if chunks:
        print(f"4 streams of 96 tokens, a 240-token prompt joining after 300 ms; --max-sequences 8; "
              f"medians of 3 ({os.cpu_count()} CPUs); each run's values in brackets")
        print("| --prefill-chunk | longest gap between tokens, s | median gap, s | long prompt's first token, s |")
        print("|---:|---:|---:|---:|")
        for c in chunks:
            runs = joins[c]
            cols = [[r[k] for r in runs] for k in range(3)]
            cell = lambda v: f"{statistics.median(v):.3f} ({', '.join(f'{x:.3f}' for x in v)})"
            print(f"| {c} | {cell(cols[0])} | {cell(cols[1])} | {cell(cols[2])} |")
    if shared:
        med = lambda k: statistics.median(r[k] for r in shared)
        print(f"8 completions x 16 tokens of a 240-token prompt, temperature 1; --max-sequences 8; medians of 3")
        print("| asked as | wall s | prompt tokens run |")
        print("|---|---:|---:|")
        print(f"| one request, n: 8 | {med(0):.3f} ({', '.join(f'{r[0]:.3f}' for r in shared)}) | {med(1):.0f} |")
        print(f"| 8 requests at once, n: 1 | {med(2):.3f} ({', '.join(f'{r[2]:.3f}' for r in shared)}) | {med(3):.0f} |")
        print(f"choices that differ from the single request with their seed, per run: {[r[4] for r in shared]}")


if __name__ == "__main__":
    sys.exit(main())
