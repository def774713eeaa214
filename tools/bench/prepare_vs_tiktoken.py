"""`weft data prepare --tokenizer gpt2` against Python tiktoken, in MB/s of input text.

Run from the repository root after building weft (`cargo build -p weft-cli`, or `--release` and
pass --weft target/release/weft):

    python3 tools/bench/prepare_vs_tiktoken.py [--weft target/debug/weft] [--copies 45] [--threads 1 2]

The corpus is Tiny Shakespeare (../shared/data/tinyshakespeare.txt) written `--copies` times as
separate files (45 copies: ~50 MB), one document each, so both sides can spread files over threads;
with --one-file, as one file (weft then cuts it into pieces; tiktoken's batch has one text).

- weft: the whole `weft data prepare` (read, tokenize with WEFT_NUM_THREADS threads, cut train/val,
  write u16 shards with block checksums and index.json), wall clock of the process.
- tiktoken: read the files, `encode_ordinary_batch(texts, num_threads=T)`, and write the ids as one
  u16 file (as nanoGPT's prepare.py does): the same work minus the checksums and the split.

The r50k_base ranks are read from the tiktoken-rs crate's copy (sha256 checked), as
tools/reference/make_tokenizer_fixtures.py does: tiktoken cannot download them offline. The script
checks that both sides produced the same number of tokens.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import tiktoken

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "reference"))
from make_tokenizer_fixtures import encodings, find_ranks_dir  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", default="target/debug/weft")
    ap.add_argument("--copies", type=int, default=45)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--shakespeare", default="../shared/data/tinyshakespeare.txt")
    ap.add_argument("--ranks-dir")
    ap.add_argument("--one-file", action="store_true", help="all copies in one file (one document)")
    args = ap.parse_args()
    enc, _ = encodings(find_ranks_dir(args.ranks_dir))
    src = open(args.shakespeare, encoding="utf-8").read()
    tmp = tempfile.mkdtemp(prefix="weft-bench-prepare-")
    try:
        files = []
        for i in range(1 if args.one_file else args.copies):
            p = os.path.join(tmp, f"doc{i:03}.txt")
            with open(p, "w", encoding="utf-8") as f:
                f.write(src * (args.copies if args.one_file else 1))
            files.append(p)
        mb = sum(os.path.getsize(p) for p in files) / 1e6
        rows = []
        for t in args.threads:
            out = os.path.join(tmp, f"out-{t}")
            env = dict(os.environ, WEFT_NUM_THREADS=str(t))
            t0 = time.perf_counter()
            subprocess.run(
                [args.weft, "data", "prepare", "--tokenizer", "gpt2", "--output", out, "--input", *files],
                check=True,
                env=env,
                stdout=subprocess.DEVNULL,
            )
            weft_s = time.perf_counter() - t0
            index = json.load(open(os.path.join(out, "index.json")))
            weft_tokens = sum(s["tokens"] for s in index["splits"].values())

            t0 = time.perf_counter()
            texts = [open(p, encoding="utf-8").read() for p in files]
            ids = enc.encode_ordinary_batch(texts, num_threads=t)
            np.concatenate([np.asarray(x, dtype=np.uint16) for x in ids]).tofile(os.path.join(tmp, f"tt-{t}.bin"))
            tt_s = time.perf_counter() - t0
            # weft adds one <|endoftext|> after each document's train piece and val piece
            tt_tokens = sum(len(x) for x in ids) + 2 * len(files)
            assert weft_tokens == tt_tokens, (weft_tokens, tt_tokens)
            rows.append((t, weft_s, tt_s))
        print(f"corpus: {len(files)} files, {mb:.1f} MB, {weft_tokens} tokens; tiktoken {tiktoken.__version__}")
        print("| threads | weft data prepare | tiktoken encode_ordinary_batch |")
        print("| --- | --- | --- |")
        for t, w, p in rows:
            print(f"| {t} | {mb / w:.1f} MB/s ({w:.2f} s) | {mb / p:.1f} MB/s ({p:.2f} s) |")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
