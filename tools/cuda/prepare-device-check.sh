#!/usr/bin/env bash
# Builds what the GPU checks run (tools/cuda/device-check.sh) and puts it in .gpu/ (ignored), to
# be carried to the GPU machine with the device tool's `carry: [".gpu"]` (64 MiB at most): the
# release `weft` binary and the release test binaries of the GPU tests, stripped.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .gpu && mkdir -p .gpu/bin
cargo build --release -p weft-cli
cp target/release/weft .gpu/bin/weft
# test binaries: name -> path, from cargo's JSON messages
cargo test --release --no-run --message-format=json \
  -p weft-core --test cuda_ops --test cuda_kernels --test torch_fixtures \
  -p weft-cli --test train_alignment --test train_device --test train_parallel --test train_llama 2>/dev/null |
  python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], ".gpu/bin/" + m["target"]["name"])
        print(m["target"]["name"])
'
strip .gpu/bin/* 2>/dev/null || true
cp tools/cuda/device-check.sh .gpu/
du -sh .gpu
total=$(du -sm .gpu | cut -f1)
if [ "$total" -gt 60 ]; then
  echo "warning: .gpu is ${total} MiB; the device tool carries 64 MiB at most" >&2
fi
