#!/usr/bin/env bash
# Runs the fuzz targets in fuzz/ (cargo-fuzz and libFuzzer) on the decoders
# of what guests send, SECONDS_PER_TARGET each (default 60): frames, module
# images and lane chunks. Installs the pinned cargo-fuzz into .cache/cargo-fuzz
# unless it is there. Corpora grow under .cache/fuzz/corpus/TARGET and are
# kept between runs; the image corpus starts from crates/server/testdata.
# Exits non-zero if any target crashed, hung or allocated past its cap,
# printing the input that reproduces it and the command to replay it.
#
# Stable Rust has no sanitizers, so the targets build with `--sanitizer none`:
# cargo-fuzz then passes only stable flags (the SanitizerCoverage pass with
# its LLVM options, `--cfg fuzzing`), and libFuzzer still steers by coverage.
# Debug assertions turn on overflow checks; the cap on allocations that a
# sanitizer's hooks would give libFuzzer is the targets' allocator
# (fuzz/src/lib.rs).
#
# fuzz/ is a workspace of its own with its own Cargo.lock: a dependency
# change in crates/ needs `cargo update --manifest-path fuzz/Cargo.toml -w`.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
version=0.13.2
root=$PWD/.cache/cargo-fuzz
work=.cache/fuzz
targets="frame image lane_chunk"
build=(--sanitizer none --debug-assertions --target-dir "$work/target")

if [ "$("$root/bin/cargo-fuzz" --version 2>/dev/null)" != "cargo-fuzz $version" ]; then
    cargo install --locked --quiet cargo-fuzz --version "$version" --root "$root"
fi
export PATH=$root/bin:$PATH
export RUST_BACKTRACE=1

# The fuzz crate is outside the workspace test.sh checks.
cargo fmt --manifest-path fuzz/Cargo.toml --check
cargo clippy --manifest-path fuzz/Cargo.toml --locked --target-dir "$work/target" -- -D warnings
cargo fuzz build "${build[@]}"

failed=0
for target in $targets; do
    corpus=$work/corpus/$target
    artifacts=$work/artifacts/$target
    log=$work/logs/$target.log
    mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
    if [ "$target" = image ]; then
        for seed in crates/server/testdata/*.fatbin crates/server/testdata/*.cubin crates/server/testdata/*.ptx; do
            [ -e "$corpus/$(basename "$seed")" ] || cp "$seed" "$corpus/"
        done
    fi
    stamp=$work/logs/$target.started
    touch "$stamp"
    # -timeout: an input that takes this long is a hang.
    if cargo fuzz run "${build[@]}" "$target" "$corpus" -- \
        -max_total_time="$seconds" -timeout=10 -artifact_prefix="$artifacts/" -print_final_stats=1 >"$log" 2>&1; then
        done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 | tr -s ' \t' ' ')
        # Keeps only inputs that add coverage: libFuzzer leaves those it replaced with smaller ones.
        cargo fuzz cmin "${build[@]}" "$target" "$corpus" >>"$log" 2>&1
        echo "fuzz $target: ok, $(ls "$corpus" | wc -l) inputs in its corpus (${done_line#* DONE })"
    else
        failed=1
        tail -n 60 "$log"
        echo "fuzz $target: FAILED (whole log: $log)"
        find "$artifacts" -type f -newer "$stamp" | while read -r input; do
            echo "reproduce: PATH=$root/bin:\$PATH cargo fuzz run ${build[*]} $target $input"
        done
    fi
done
exit "$failed"
