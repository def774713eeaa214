#!/usr/bin/env bash
# Installs Chromium from the system's packages (Debian's `chromium`) for the dashboard's browser
# checks in crates/weft-cli/tests/ui.rs and ui_streams.rs, which start it headless against `weft ui`. Idempotent: an
# installed chromium is left as it is. Prints one line; exits non-zero when it could not be
# installed (the test then says it skipped the browser check).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  echo "chromium present: $(command -v chromium)"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "chromium not installed: apt-get not found (install Chromium from the system's packages)" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo -n"
  else
    echo "chromium not installed: not root and no sudo" >&2
    exit 1
  fi
fi
if $SUDO apt-get install -y chromium >/dev/null 2>&1 ||
  { $SUDO apt-get update >/dev/null 2>&1 && $SUDO apt-get install -y chromium >/dev/null 2>&1; }; then
  echo "chromium installed: $(command -v chromium)"
else
  echo "chromium not installed: apt-get install chromium failed" >&2
  exit 1
fi
