#!/usr/bin/env bash
# Dynamic batching off versus on for `weft serve` on the digits mlp (examples/digits_mlp.toml:
# 64 -> 128 -> 64 -> 10) or, with MODEL=convnet, the digits convnet
# (examples/digits_convnet.toml: 1x8x8 images, channels 16 and 32), loopback only, bounded in
# time (two runs of SECONDS + 1 s each).
#
#   [MODEL=mlp|convnet] [SETS="model.channels=[64,128]"] tools/bench/serve_batching.sh [PROFILE] [CLIENTS] [SECONDS] [BATCH] [DELAY_MS] [ROWS]
#
# PROFILE is the cargo profile the binaries are built with (release by default; debug works),
# CLIENTS the concurrent clients (16), SECONDS each run's measured seconds (10), BATCH and
# DELAY_MS the batching run's --max-batch-size (16) and --max-batch-delay-ms (2), ROWS the rows
# per request (1). SETS: further `KEY=VALUE` overrides of the example's config, space-separated
# (a wider model). Builds `weft` and the load generator (crates/weft-cli/examples/serve_load.rs),
# trains the model for 50 steps into a temporary model store (weights do not change the cost of
# a forward), then serves it with --max-batch-size 1 and with batching, and prints one JSON line
# per run (requests, failures, requests/s, p50 and p99 latency in ms) and the mean batch size.
set -euo pipefail
PROFILE=${1:-release}
CLIENTS=${2:-16}
SECS=${3:-10}
BATCH=${4:-16}
DELAY=${5:-2}
ROWS=${6:-1}
MODEL=${MODEL:-mlp}
case $MODEL in
    mlp) SHAPE=64 ;;
    convnet) SHAPE=1,8,8 ;;
    *) echo "MODEL: mlp or convnet" >&2; exit 2 ;;
esac
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
FLAG=$([ "$PROFILE" = release ] && echo --release || echo)
cargo build $FLAG -p weft-cli --bin weft --example serve_load
BIN=$ROOT/target/$PROFILE
STORE=$(mktemp -d)
trap 'kill $SERVER 2>/dev/null || true; rm -rf "$STORE"' EXIT
SERVER=
EXTRA=()
read -r -a KVS <<< "${SETS:-}"
for kv in ${KVS[@]+"${KVS[@]}"}; do EXTRA+=(--set "$kv"); done
"$BIN/weft" train --config "examples/digits_$MODEL.toml" --quiet ${EXTRA[@]+"${EXTRA[@]}"} \
    --set train.steps=50 --set train.eval_every=0 --set "train.checkpoint_dir=\"$STORE/digits\""
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$STORE/token"
run() { # label, extra serve flags...
    local label=$1; shift
    local port mport; port=$(free_port); mport=$(free_port)
    "$BIN/weft" serve --model-store "$STORE" --model digits=digits --port "$port" \
        --management-port "$(free_port)" --metrics-port "$mport" --token-file "$STORE/token" \
        "$@" > /dev/null 2>&1 &
    SERVER=$!
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$port/v2/health/ready" > /dev/null && break
        sleep 0.1
    done
    printf '%s ' "$label"
    "$BIN/examples/serve_load" --url "http://127.0.0.1:$port/v2/models/digits/infer" \
        --shape "$SHAPE" --clients "$CLIENTS" --seconds "$SECS" --rows "$ROWS"
    # requests per forward over the whole run (warm-up included), from the server's metrics
    curl -s "http://127.0.0.1:$mport/metrics" | awk '/^weft_batch_size_sum/ {s=$2} /^weft_batch_size_count/ {c=$2}
        /^weft_inference_duration_seconds_sum/ {t=$2}
        END {printf "  mean requests per forward: %.2f over %d forwards of %.3f ms (worker busy %.1f s)\n", s/c, c, 1e3*t/c, t}'
    kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
}
run "batching off (--max-batch-size 1):" --max-batch-size 1
run "batching on (--max-batch-size $BATCH --max-batch-delay-ms $DELAY):" \
    --max-batch-size "$BATCH" --max-batch-delay-ms "$DELAY"
