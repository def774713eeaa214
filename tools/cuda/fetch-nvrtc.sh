#!/usr/bin/env bash
# Puts NVRTC (the CUDA runtime compiler, a host library that needs no GPU) under .cache/cuda/lib,
# so that the kernel compile check (crates/weft-core/tests/cuda_kernels.rs) can compile every GPU
# kernel on a machine without CUDA. The version is the CUDA 13.0 that the GPU machines run.
# Idempotent; prints one line.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION="13.0.88"
DEST=".cache/cuda"
if [ -f "$DEST/lib/libnvrtc.so.13" ] && [ "$(cat "$DEST/version" 2>/dev/null)" = "$VERSION" ]; then
  echo "nvrtc $VERSION present in $DEST/lib"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" "nvidia-cuda-nvrtc==$VERSION"
python3 - "$tmp" "$DEST" <<'PY'
import pathlib, shutil, sys, zipfile
tmp, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(tmp.glob("nvidia_cuda_nvrtc-*.whl"))
lib = dest / "lib"
if lib.exists():
    shutil.rmtree(lib)
lib.mkdir(parents=True)
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        base = pathlib.Path(name).name
        if base.startswith(("libnvrtc.so", "libnvrtc-builtins.so")):
            (lib / base).write_bytes(z.read(name))
PY
echo "$VERSION" > "$DEST/version"
echo "nvrtc $VERSION installed in $DEST/lib"
