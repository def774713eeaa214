#!/usr/bin/env bash
# Installs TensorBoard (PyPI `tensorboard`, pinned) into a virtual environment under
# .cache/tensorboard-venv (ignored by git) for the event-file check in
# crates/weft-cli/tests/runs_tensorboard.rs, which reads weft's event files back with
# TensorBoard's own EventAccumulator (tools/reference/read_tensorboard.py). Idempotent: an
# environment that already imports the pinned version is left as it is. Prints one line; exits
# non-zero when it could not be installed (the test then says it skipped the reader check).
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION="2.21.0"
VENV=".cache/tensorboard-venv"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import tensorboard, sys; sys.exit(tensorboard.__version__ != '$VERSION')" 2>/dev/null; then
  echo "tensorboard $VERSION present in $VENV"
  exit 0
fi
if ! command -v python3 >/dev/null 2>&1; then
  echo "tensorboard not installed: python3 not found" >&2
  exit 1
fi
rm -rf "$VENV"
if python3 -m venv "$VENV" >/dev/null 2>&1 &&
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "tensorboard==$VERSION" >/dev/null 2>&1; then
  echo "tensorboard $VERSION installed in $VENV"
else
  echo "tensorboard not installed: pip install tensorboard==$VERSION into $VENV failed" >&2
  exit 1
fi
