#!/usr/bin/env bash
# Runs every test gpuplex has that needs no GPU, on a fresh machine: installs
# the pinned CUDA 13.0 compiler from PyPI (for the end-to-end programs), then
# formatting, lints, the build, unit/integration/end-to-end tests, docs, a
# program in a virtual machine (QEMU and a Debian kernel, fetched with
# apt-get) and a bounded fuzzing run.
# The GPU suite is scripts/gpu-suite.sh, run on a machine with a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

GPUPLEX_NVCC_DIR="$(scripts/install-nvcc.sh)"
export GPUPLEX_NVCC_DIR
# The end-to-end tests must not skip themselves here.
export GPUPLEX_REQUIRE_NVCC=1

cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The production build, without the emulated test device, lints clean too.
cargo clippy --workspace --locked -- -D warnings
# The end-to-end tests run target/debug/gpuplex (with the emulated device,
# as the tests build it) with target/debug/libcuda.so.
cargo build --workspace --locked --features gpuplex/emulated
cargo test --workspace --locked
RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --no-deps --locked
# A runtime-API program in a virtual machine (QEMU, TCG) with no NVIDIA
# driver, against the emulated server on this host: output as expected.
vm=$(mktemp -d)
# (PyPI's nvcc keeps its static runtime in lib/, beside bin/.)
"$GPUPLEX_NVCC_DIR/nvcc" -o "$vm/vector_add" tests/cuda/runtime/vector_add.cu -L "$GPUPLEX_NVCC_DIR/../lib"
scripts/vm-demo.sh --backend emulated -- "$vm/vector_add" >"$vm/out" 2>"$vm/err"
cmp "$vm/out" tests/cuda/expected/runtime/vector_add.txt || { diff "$vm/out" tests/cuda/expected/runtime/vector_add.txt; exit 1; }
# The front-end in the guest said nothing either (the runtime's calls at exit included).
if grep '^gpuplex\[' "$vm/err"; then exit 1; fi
rm -rf "$vm"
# A minute of coverage-guided fuzzing per decoder of guest input (fuzz/).
scripts/fuzz.sh
echo "all tests passed"
