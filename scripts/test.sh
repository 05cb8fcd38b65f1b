#!/usr/bin/env bash
# Runs every test gpuplex has that needs no GPU, on a fresh machine: installs
# the pinned CUDA 13.0 compiler from PyPI (for the end-to-end programs), then
# formatting, lints, the build, unit/integration/end-to-end tests, docs and
# a bounded fuzzing run.
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
# A minute of coverage-guided fuzzing per decoder of guest input (fuzz/).
scripts/fuzz.sh
echo "all tests passed"
