#!/usr/bin/env bash
# Builds the CUDA test programs of tests/cuda into OUT_DIR.
#
# Usage: scripts/build-cuda-tests.sh OUT_DIR LIBCUDA_DIR
#
# Driver-API programs (tests/cuda/*.cpp, *.cu), into OUT_DIR: device code
# (NAME.cu) is built with the nvcc on PATH into OUT_DIR/images: a fatbin with
# SASS for sm_75 and sm_90 and compute_90 PTX, plus the single formats
# module_formats loads. Host code (NAME.cpp) uses cuda.h only and is built
# with the host C++ compiler ($CXX, default c++), embedding the images with
# .incbin, and linked with -L LIBCUDA_DIR -lcuda (our front-end in CI, the
# toolkit's stubs on a GPU machine). No CUDA runtime is linked.
#
# Runtime-API programs (tests/cuda/runtime/NAME.cu), into OUT_DIR/runtime:
# ordinary CUDA C++ built by nvcc, each linked twice, as NAME.static (static
# cudart, nvcc's default) and NAME.shared (-cudart=shared, with an rpath to
# the directory holding libcudart.so.13). Not linked with libcuda: the
# runtime loads libcuda.so.1 itself when the program starts.
#
# Library programs (tests/cuda/libraries/NAME.cu), into OUT_DIR/libraries,
# static and shared as above: only where the toolkit has cuBLAS and cuFFT
# (lib64/libcublas.so next to nvcc, as on a GPU machine). One that fails to
# build is reported and left out; it fails nothing else.
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
echo "built $(ls "$src"/*.cpp | wc -l) driver-API programs in $out" >&2

# nvcc's own libraries: lib64 in a toolkit, lib in the PyPI package.
toolkit=$(cd "$(dirname "$nvcc")/.." && pwd)
cudart=""
for dir in "$toolkit/lib64" "$toolkit/lib" "$toolkit/targets/x86_64-linux/lib"; do
    if [ -f "$dir/libcudart_static.a" ]; then cudart=$dir; break; fi
done
[ -n "$cudart" ] || { echo "no libcudart_static.a next to $nvcc" >&2; exit 1; }
link=(-L"$cudart")
# The PyPI package has libcudart.so.13 but no libcudart.so for -lcudart:
# link through a private symlink; the program still needs libcudart.so.13.
if [ ! -e "$cudart/libcudart.so" ]; then
    so=$(ls "$cudart"/libcudart.so.* 2>/dev/null | head -1)
    [ -n "$so" ] || { echo "no libcudart.so.* in $cudart" >&2; exit 1; }
    mkdir -p "$out/cudart-link"
    ln -sf "$so" "$out/cudart-link/libcudart.so"
    link+=(-L"$out/cudart-link")
fi
shared=(-cudart=shared -Xlinker -rpath -Xlinker "$cudart")

# Compiles CU once and links it twice, as EXE.static (static cudart, nvcc's
# default) and EXE.shared; further arguments are link flags.
build_runtime_program() {
    local cu=$1 exe=$2
    shift 2
    "$nvcc" -c -O2 "${gencode[@]}" -o "$exe.o" "$cu" &&
        "$nvcc" -o "$exe.static" "$exe.o" "${link[@]}" "$@" &&
        "$nvcc" "${shared[@]}" -o "$exe.shared" "$exe.o" "${link[@]}" "$@"
}

mkdir -p "$out/runtime"
for cu in "$src"/runtime/*.cu; do
    run build_runtime_program "$cu" "$out/runtime/$(basename "$cu" .cu)" -lpthread
done
wait_all
echo "built $(ls "$src"/runtime/*.cu | wc -l) runtime programs in $out/runtime, static and shared" >&2

# Library programs: a failure here is reported but stops nothing else; a
# program that failed to build is missing from OUT_DIR/libraries.
if [ -f "$toolkit/lib64/libcublas.so" ] && [ -f "$toolkit/lib64/libcufft.so" ]; then
    mkdir -p "$out/libraries"
    build_runtime_program "$src/libraries/cublas_gemm.cu" "$out/libraries/cublas_gemm" -lcublas ||
        echo "cublas_gemm failed to build" >&2
    build_runtime_program "$src/libraries/cufft_1d.cu" "$out/libraries/cufft_1d" -lcufft ||
        echo "cufft_1d failed to build" >&2
    echo "built the library programs in $out/libraries" >&2
else
    echo "no cuBLAS/cuFFT in $toolkit/lib64: library programs not built" >&2
fi
