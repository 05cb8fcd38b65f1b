#!/usr/bin/env bash
# The GPU suite: every test program of tests/cuda (driver API; runtime API
# with static and shared cudart, as rt/NAME.static and rt/NAME.shared; the
# cuBLAS and cuFFT programs as lib/NAME.*; tests/python/torch_smoke.py where
# PyTorch is installed), natively and through
# `gpuplex run --backend cuda`, with stdout and exit status compared and both
# timed; the programs that make large copies again without shared memory, so
# that those cross bulk lanes (as lanes/NAME); then the cuda-backend checks that a killed client's memory comes
# back, that garbage on the server's socket harms no other client, and that
# programs running at once on one server each print what they print alone.
#
# Usage: scripts/gpu-suite.sh [BIN_DIR]
#   BIN_DIR (or $GPUPLEX_BIN_DIR) holds prebuilt `gpuplex` and `libcuda.so`.
#   $CUDA_HOME (default /usr/local/cuda) provides nvcc and lib64/stubs.
#   With $OUT set, the summary and a tarball of all logs are written there.
# Exits non-zero if anything failed.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-${GPUPLEX_BIN_DIR:-}}
if [ -z "$bin" ] || [ ! -x "$bin/gpuplex" ] || [ ! -f "$bin/libcuda.so" ]; then
    echo "usage: $0 BIN_DIR (or GPUPLEX_BIN_DIR): a directory with gpuplex and libcuda.so" >&2
    exit 2
fi
bin=$(cd "$bin" && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
work=$(mktemp -d /tmp/gpu-suite.XXXXXX)
logs=$work/logs
progs=$work/programs
mkdir -p "$logs"
summary=$logs/summary.txt
failures=0
server=""
holder=""

say() { echo "$*" | tee -a "$summary"; }
fail() { say "FAIL: $*"; failures=$((failures + 1)); }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

finish() {
    if [ -n "$holder" ]; then kill -KILL -- "-$holder" 2>/dev/null || true; fi
    if [ -n "$server" ]; then
        kill "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
    fi
    if [ -n "${OUT:-}" ]; then
        cp "$summary" "$OUT/gpu-suite-summary.txt"
        tar czf "$OUT/gpu-suite-logs.tgz" -C "$work" logs
    fi
    return 0
}
trap finish EXIT

say "gpu suite: $(nvidia-smi -L 2>/dev/null | head -1), gpuplex from $bin"
PATH="$cuda/bin:$PATH" "$root/scripts/build-cuda-tests.sh" "$progs" "$cuda/lib64/stubs" 2>"$logs/build.log" ||
    { cat "$logs/build.log"; fail "build"; exit 1; }

# Runs PROG ARGS with a time limit; stdout, stderr, status and seconds go to
# $logs/TAG.{out,err,rc,time}.
timed() {
    local tag=$1 t0 t1 rc=0
    shift
    t0=$(now)
    timeout 300 "$@" >"$logs/$tag.out" 2>"$logs/$tag.err" || rc=$?
    t1=$(now)
    echo "$rc" >"$logs/$tag.rc"
    elapsed "$t0" "$t1" >"$logs/$tag.time"
}

# Runs PROG natively and through gpuplex (with the environment $via
# sets, if any) and prints a row of the table:
# stdout and exit status must match, and match EXPECTED (a file of the
# expected stdout) where there is one. NAME names the row and the logs.
declare -A program_of
compare() {
    local name=$1 prog=$2 expected=$3 problems=() native_rc gpuplex_rc tn tg ratio result
    program_of[$name]=$prog
    mkdir -p "$(dirname "$logs/$name")"
    if [ ! -x "$prog" ]; then
        say "$(printf '%-28s %10s %10s %7s  %s' "$name" - - - "FAIL: not built (logs/build.log)")"
        failures=$((failures + 1))
        return
    fi
    timed "$name.native" "$prog"
    timed "$name.gpuplex" env ${via:-} "$bin/gpuplex" run --backend cuda -- "$prog"
    native_rc=$(cat "$logs/$name.native.rc")
    gpuplex_rc=$(cat "$logs/$name.gpuplex.rc")
    [ "$native_rc" = 0 ] || problems+=("native exit $native_rc")
    [ "$gpuplex_rc" = "$native_rc" ] || problems+=("gpuplex exit $gpuplex_rc")
    diff -u "$logs/$name.native.out" "$logs/$name.gpuplex.out" >"$logs/$name.diff" ||
        problems+=("stdout differs from native (logs/$name.diff)")
    if [ -f "$expected" ]; then
        cmp -s "$expected" "$logs/$name.native.out" || problems+=("native differs from ${expected#"$root/tests/cuda/"}")
        cmp -s "$expected" "$logs/$name.gpuplex.out" || problems+=("gpuplex differs from ${expected#"$root/tests/cuda/"}")
    fi
    tn=$(cat "$logs/$name.native.time")
    tg=$(cat "$logs/$name.gpuplex.time")
    ratio=$(awk -v n="$tn" -v g="$tg" 'BEGIN { printf "%.2f", (n > 0 ? g / n : 0) }')
    result=PASS
    [ ${#problems[@]} -eq 0 ] || result="FAIL: $(IFS=';'; echo "${problems[*]}")"
    say "$(printf '%-28s %10s %10s %7s  %s' "$name" "$tn" "$tg" "$ratio" "$result")"
    [ "$result" = PASS ] || failures=$((failures + 1))
}

# Driver API: everything but mem_info and hold_memory, whose output is the
# GPU's state.
programs=(device_query vector_add copies memsets streams_events module_globals
    mixed_params module_formats contexts expected_errors)

say ""
say "$(printf '%-28s %10s %10s %7s  %s' program native_s gpuplex_s ratio result)"
for name in "${programs[@]}"; do
    compare "$name" "$progs/$name" "$root/tests/cuda/expected/$name.txt"
done

# Runtime API, each program with static and with shared cudart; one
# expected file serves both.
for cu in "$root"/tests/cuda/runtime/*.cu; do
    name=$(basename "$cu" .cu)
    for linkage in static shared; do
        compare "rt/$name.$linkage" "$progs/runtime/$name.$linkage" "$root/tests/cuda/expected/runtime/$name.txt"
    done
done

# cuBLAS and cuFFT: built where the toolkit has them; no expected files.
if [ -d "$progs/libraries" ]; then
    for cu in "$root"/tests/cuda/libraries/*.cu; do
        name=$(basename "$cu" .cu)
        for linkage in static shared; do
            compare "lib/$name.$linkage" "$progs/libraries/$name.$linkage" ""
        done
    done
else
    say "lib/*: not built: no cuBLAS/cuFFT in $cuda/lib64"
fi

# PyTorch, where python3 has it: a real framework on top of the runtime,
# cuBLAS and cuDNN; no expected file, since its output names the GPU.
if python3 -c "import torch" 2>/dev/null; then
    torch_smoke=$work/torch_smoke
    printf '#!/bin/sh\nexec python3 %s\n' "$root/tests/python/torch_smoke.py" >"$torch_smoke"
    chmod +x "$torch_smoke"
    compare "py/torch_smoke" "$torch_smoke" ""
else
    say "py/torch_smoke: skipped: python3 cannot import torch"
fi

# Bulk lanes: with no shared memory (GPUPLEX_CARRIER=socket, as over TCP),
# copies of 1 MiB or more cross the lanes, in order with kernels and the
# rest. These programs make such copies (vector_add's result and atomics'
# counters after their kernels, copies' up to 256 MiB each way).
via=GPUPLEX_CARRIER=socket
for name in vector_add copies rt/atomics.shared rt/streams_overlap.static; do
    compare "lanes/$name" "${program_of[$name]}" ""
done
if [ -n "${program_of[py/torch_smoke]:-}" ]; then
    compare "lanes/py/torch_smoke" "${program_of[py/torch_smoke]}" ""
fi
via=

# The server-side checks, on a server of our own.
say ""
sock=$work/gpuplex.sock
"$bin/gpuplex" serve --backend cuda --listen "unix:$sock" >"$logs/serve.log" 2>&1 &
server=$!
for _ in $(seq 300); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { fail "server did not create $sock"; exit 1; }
client() { "$bin/gpuplex" run --server "unix:$sock" -- "$@"; }
# Free bytes as mem_info reports them through the server; empty on failure.
free_mem() { client "$progs/mem_info" 2>>"$logs/mem_info.err" | awk '$1 == "free" { print $2 }' || true; }

# Waits up to $2 seconds for a line starting with $3 in file $1.
wait_line() {
    local end=$((SECONDS + $2))
    while [ $SECONDS -lt $end ]; do grep -q "^$3" "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}

# 1. A killed client's memory is back within a second.
before=$(free_mem)
[ -n "$before" ] || { fail "mem_info through the server"; exit 1; }
# Its own session (no job control here, so setsid does not fork): the kill
# below reaches gpuplex run and the program, whichever of them holds what.
setsid "$bin/gpuplex" run --server "unix:$sock" -- "$progs/hold_memory" 4096 >"$logs/hold.out" 2>&1 &
holder=$!
if ! wait_line "$logs/hold.out" 120 holding; then
    fail "hold_memory did not report holding"
else
    during=$(free_mem)
    [ -n "$during" ] && [ "$during" -le $((before - (4096 << 20))) ] ||
        fail "holding 4096 MiB: free $before -> $during"
    kill -KILL -- "-$holder"
    wait "$holder" 2>/dev/null || true
    holder=""
    t0=$(now)
    while :; do
        after=$(free_mem)
        took=$(elapsed "$t0" "$(now)")
        [ "$after" = "$before" ] && { say "cleanup: free back to $before after ${took} s: PASS"; break; }
        if awk -v t="$took" 'BEGIN { exit !(t > 1) }'; then
            fail "cleanup: free $after ${took} s after SIGKILL, want $before"
            break
        fi
    done
fi

# 2. Garbage on the socket while another client works.
client "$progs/copies" >"$logs/garbage-copies.out" 2>"$logs/garbage-copies.err" &
long=$!
wait_line "$logs/garbage-copies.out" 120 "size=" || true
python3 - "$sock" <<'PY' || fail "garbage: could not connect to the socket"
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.settimeout(1)
try:
    s.sendall(os.urandom(4096))
    s.recv(4096)
except OSError:
    pass  # a hang-up or silence are both fine
PY
rc=0
wait "$long" || rc=$?
if [ "$rc" != 0 ]; then
    fail "garbage: copies beside it exited $rc"
elif ! cmp -s "$logs/copies.native.out" "$logs/garbage-copies.out"; then
    fail "garbage: copies beside it printed something else"
elif [ -z "$(free_mem)" ]; then
    fail "garbage: mem_info failed afterwards"
else
    say "garbage: copies unharmed, server still answers: PASS"
fi

# 3. Tenants side by side: programs of each kind at once on this one server,
# each of which must print what it printed natively, alone on the GPU.
tenants=()
for name in vector_add streams_events rt/multithreaded.shared rt/matrix_mul.static lib/cublas_gemm.shared py/torch_smoke; do
    if [ -x "${program_of[$name]:-}" ]; then tenants+=("$name"); fi
done
declare -A tenant_pid
t0=$(now)
for name in "${tenants[@]}"; do
    mkdir -p "$(dirname "$logs/tenants/$name")"
    client "${program_of[$name]}" >"$logs/tenants/$name.out" 2>"$logs/tenants/$name.err" &
    tenant_pid[$name]=$!
done
bad=()
for name in "${tenants[@]}"; do
    rc=0
    wait "${tenant_pid[$name]}" || rc=$?
    if [ "$rc" != 0 ] || ! cmp -s "$logs/$name.native.out" "$logs/tenants/$name.out"; then
        bad+=("$name (exit $rc)")
    fi
done
if [ ${#bad[@]} -eq 0 ]; then
    say "tenants: ${#tenants[@]} programs at once on one server, each as alone natively, in $(elapsed "$t0" "$(now)") s: PASS"
else
    fail "tenants: ${bad[*]} differed from native (logs/tenants/)"
fi

say ""
if [ "$failures" -eq 0 ]; then say "gpu suite: all passed"; else say "gpu suite: $failures failed"; fi
[ "$failures" -eq 0 ]
