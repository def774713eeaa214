#!/usr/bin/env bash
# `weft serve` against TorchServe on the same model and the same requests, loopback only,
# bounded in time (4 runs of SECONDS + 1 s each, per repeat).
#
#   [PYTHON=python3] tools/bench/serve_vs_torchserve.sh [SECONDS] [CLIENTS] [TS_WORKERS] [REPEAT]
#
# The model: the digits mlp (examples/digits_mlp.toml: 64 -> 128 -> 64 -> 10), trained for 50
# steps by weft (needs ../shared/data). TorchServe serves the same weights through
# tools/bench/torchserve/digits_handler.py (torch's Linear and ReLU). Both take the TorchServe-style
# request, `POST /predictions/digits` with the rows as nested JSON arrays, from the same load
# generator (crates/weft-cli/examples/serve_load.rs, CLIENTS threads on keep-alive connections,
# 16 by default), first with batching off (weft `--max-batch-size 1`, TorchServe `batch_size=1`),
# then on (16 requests, 2 ms delay, on both). TorchServe runs TS_WORKERS backend workers (2,
# one per core of the development machine); weft its default single worker, whose products use
# WEFT_NUM_THREADS threads. Prints one JSON line per run (requests, failures, requests/s, p50 and
# p99 latency in ms). Before each run one request's answer is kept; at the end the script fails
# unless the last TorchServe answer's logits equal the last weft answer's within 1e-4.
#
# PYTHON must have torch, safetensors, torchserve and torch-model-archiver; without PYTHON the
# script makes a virtual environment in target/bench-venv-torchserve and installs them from
# PyPI (several GB: torch). TorchServe needs a Java runtime: without `java` on the PATH the script
# installs Debian's openjdk-17-jre-headless (as root).
set -euo pipefail
SECS=${1:-10}
CLIENTS=${2:-16}
TS_WORKERS=${3:-2}
REPEAT=${4:-1}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
if [ ! -d ../shared/data ]; then
    echo "serve_vs_torchserve: ../shared/data (the digits) is absent" >&2
    exit 2
fi
if [ -z "${PYTHON:-}" ]; then
    VENV=$ROOT/target/bench-venv-torchserve
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q torch safetensors torchserve torch-model-archiver
    PYTHON=$VENV/bin/python
fi
BINDIR=$(dirname "$PYTHON")
if ! command -v java > /dev/null; then
    apt-get update -q > /dev/null && apt-get install -y -q openjdk-17-jre-headless > /dev/null
fi
cargo build --release -p weft-cli --bin weft --example serve_load
BIN=$ROOT/target/release
WORK=$(mktemp -d)
SERVER=
trap 'kill $SERVER 2>/dev/null || true; "$BINDIR/torchserve" --stop > /dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
"$BIN/weft" train --config examples/digits_mlp.toml --quiet \
    --set train.steps=50 --set train.eval_every=0 --set "train.checkpoint_dir=\"$WORK/store/digits\""
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$WORK/token"
# the TorchServe archive: the handler and the checkpoint's weights
mkdir -p "$WORK/ts-store"
cp "$WORK"/store/digits/step-*/model-rank-00000.safetensors "$WORK/model.safetensors"
"$BINDIR/torch-model-archiver" --model-name digits --version 1.0 \
    --handler tools/bench/torchserve/digits_handler.py --extra-files "$WORK/model.safetensors" \
    --export-path "$WORK/ts-store" --force
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_for() { # url
    for _ in $(seq 900); do
        curl -sf "$1" > /dev/null && return 0
        sleep 0.1
    done
    echo "serve_vs_torchserve: $1 did not answer" >&2
    exit 1
}
ROW="[[$(seq -s, 0 63 | awk -F, '{for (i = 1; i <= NF; i++) printf "%s%.4f", (i > 1 ? "," : ""), ($i % 17) / 17}')]]"
load() { # label, url
    curl -sf -H 'content-type: application/json' -d "$ROW" "$2" > "$WORK/answer-$(echo "$1" | cut -d, -f1)"
    printf '%s ' "$1"
    "$BIN/examples/serve_load" --url "$2" --body nested --shape 64 --clients "$CLIENTS" --seconds "$SECS"
}
weft_run() { # label, batch size, delay ms
    local port; port=$(free_port)
    "$BIN/weft" serve --model-store "$WORK/store" --model digits=digits --port "$port" \
        --management-port "$(free_port)" --metrics-port "$(free_port)" --token-file "$WORK/token" \
        --max-batch-size "$2" --max-batch-delay-ms "$3" > /dev/null 2>&1 &
    SERVER=$!
    wait_for "http://127.0.0.1:$port/ping"
    load "$1" "http://127.0.0.1:$port/predictions/digits"
    kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
    SERVER=
}
torchserve_run() { # label, batch size, delay ms
    local port mport; port=$(free_port); mport=$(free_port)
    cat > "$WORK/config.properties" <<EOF
inference_address=http://127.0.0.1:$port
management_address=http://127.0.0.1:$mport
metrics_address=http://127.0.0.1:$(free_port)
disable_token_authorization=true
enable_model_api=true
EOF
    (cd "$WORK" && "$BINDIR/torchserve" --start --ncs --foreground --model-store "$WORK/ts-store" \
        --ts-config "$WORK/config.properties" --disable-token-auth > "$WORK/torchserve.log" 2>&1) &
    SERVER=$!
    wait_for "http://127.0.0.1:$port/ping"
    curl -sf -X POST "http://127.0.0.1:$mport/models?url=digits.mar&batch_size=$2&max_batch_delay=$3&initial_workers=$TS_WORKERS&synchronous=true" > /dev/null \
        || { echo "serve_vs_torchserve: TorchServe did not register the model (log: torchserve.log)" >&2; tail -20 "$WORK/torchserve.log" >&2; exit 1; }
    load "$1" "http://127.0.0.1:$port/predictions/digits"
    "$BINDIR/torchserve" --stop > /dev/null 2>&1 || true
    wait "$SERVER" 2>/dev/null || true
    SERVER=
}
for r in $(seq "$REPEAT"); do
    echo "# repeat $r of $REPEAT"
    weft_run "weft, batching off:" 1 0
    torchserve_run "TorchServe ($TS_WORKERS workers), batching off:" 1 0
    weft_run "weft, batching on (16, 2 ms):" 16 2
    torchserve_run "TorchServe ($TS_WORKERS workers), batching on (16, 2 ms):" 16 2
done
python3 - "$WORK/answer-weft" "$WORK/answer-TorchServe ($TS_WORKERS workers)" <<'EOF'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
worst = max(abs(x - y) for x, y in zip(a[0], b[0]))
if len(a[0]) != len(b[0]) or worst > 1e-4:
    sys.exit(f"the answers differ: weft {a}, TorchServe {b}")
print(f"the same answer from both (largest difference {worst:.1e})")
EOF
