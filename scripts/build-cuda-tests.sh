#!/usr/bin/env bash
# Builds the driver-API test programs of tests/cuda into OUT_DIR.
#
# Usage: scripts/build-cuda-tests.sh OUT_DIR LIBCUDA_DIR
#
# Device code (NAME.cu) is built with the nvcc on PATH into OUT_DIR/images:
# a fatbin with SASS for sm_75 and sm_90 and compute_90 PTX, plus the single
# formats module_formats loads. Host code (NAME.cpp) uses cuda.h only and is
# built with the host C++ compiler ($CXX, default c++), embedding the images
# with .incbin, and linked with -L LIBCUDA_DIR -lcuda (our front-end in CI,
# the toolkit's stubs on a GPU machine). No CUDA runtime is linked.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 OUT_DIR LIBCUDA_DIR" >&2
    exit 2
fi
src=$(cd "$(dirname "$0")/../tests/cuda" && pwd)
mkdir -p "$1/images"
out=$(cd "$1" && pwd)
libdir=$2
img=$out/images
nvcc=$(command -v nvcc) || { echo "nvcc not found on PATH" >&2; exit 1; }
include=$(dirname "$nvcc")/../include
[ -f "$include/cuda.h" ] || { echo "no cuda.h next to $nvcc" >&2; exit 1; }
cxx=${CXX:-c++}

gencode=(-gencode arch=compute_75,code=sm_75 -gencode "arch=compute_90,code=[sm_90,compute_90]")

# Runs the given commands in parallel, one per CPU, failing if any fails.
jobs_max=$(nproc 2>/dev/null || echo 2)
pids=()
run() {
    "$@" &
    pids+=($!)
    if [ ${#pids[@]} -ge "$jobs_max" ]; then wait_all; fi
}
wait_all() {
    local pid failed=0
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    pids=()
    [ "$failed" -eq 0 ] || { echo "build failed" >&2; exit 1; }
}

for cu in "$src"/*.cu; do
    name=$(basename "$cu" .cu)
    run "$nvcc" -fatbin "${gencode[@]}" -o "$img/$name.fatbin" "$cu"
done
# The single formats of one kernel, for module_formats. PTX for the oldest
# target so that any supported device can JIT it.
run "$nvcc" -cubin -arch=sm_75 -o "$img/vector_add.sm_75.cubin" "$src/vector_add.cu"
run "$nvcc" -cubin -arch=sm_90 -o "$img/vector_add.sm_90.cubin" "$src/vector_add.cu"
run "$nvcc" -ptx -arch=compute_75 -o "$img/vector_add.ptx" "$src/vector_add.cu"
wait_all

for cpp in "$src"/*.cpp; do
    name=$(basename "$cpp" .cpp)
    run "$cxx" -std=c++17 -O2 -Wall -Wextra -pthread -I"$include" -I"$src" "-Wa,-I,$img" \
        -o "$out/$name" "$cpp" -L"$libdir" -lcuda
done
wait_all
echo "built $(ls "$src"/*.cpp | wc -l) programs in $out" >&2
