#!/usr/bin/env bash
# Builds every checker (the real kernel sources compiled as host C++ through cuda_host.h) and runs
# it. Exit status 0 only if every checker built and passed. See README.md.
#   tools/cuda/emulate/run.sh [family...]     (default: all of them)
# Output binaries go to $CUDA_EMULATE_OUT (default: <repo>/target/cuda-emulate).
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
out="${CUDA_EMULATE_OUT:-$root/target/cuda-emulate}"
cxx="${CXX:-g++}"
families=("$@")
[ ${#families[@]} -eq 0 ] && families=(elementwise elementwise_ops copy reduce nn attention conv optim index linear)
mkdir -p "$out" || exit 1
start=$(date +%s)

# Build in parallel (compiling dominates), logs kept per checker.
pids=()
for f in "${families[@]}"; do
    [ -f "$here/$f.cpp" ] || { echo "no checker $here/$f.cpp"; exit 2; }
    "$cxx" -std=c++20 -O1 -pthread -Wall -Wno-unknown-pragmas -o "$out/$f" "$here/$f.cpp" >"$out/$f.build.log" 2>&1 &
    pids+=($!)
done
failed=0
for i in "${!families[@]}"; do
    if ! wait "${pids[$i]}"; then
        echo "${families[$i]}: BUILD FAILED"
        cat "$out/${families[$i]}.build.log"
        failed=1
    elif [ -s "$out/${families[$i]}.build.log" ]; then
        cat "$out/${families[$i]}.build.log"
    fi
done
[ $failed -eq 0 ] || exit 1

for f in "${families[@]}"; do
    # a kernel whose threads disagree on a barrier would hang: bound each run
    timeout 300 "$out/$f"
    rc=$?
    if [ $rc -ne 0 ]; then
        [ $rc -eq 124 ] && echo "$f: TIMED OUT (deadlocked barrier?)"
        [ $rc -ne 1 ] && [ $rc -ne 124 ] && echo "$f: exited with status $rc"
        failed=1
    fi
done
echo "cuda emulate: $([ $failed -eq 0 ] && echo "all ${#families[@]} checkers passed" || echo FAILED) in $(( $(date +%s) - start ))s"
exit $failed
