#!/usr/bin/env bash
# Builds gpuplex (release) and installs it under PREFIX (default /usr/local):
#   PREFIX/bin/gpuplex
#   PREFIX/lib/gpuplex/libcuda.so and libcuda.so.1   the front-end, which
#       `gpuplex run` finds there; kept out of the linker's search path so
#       that nothing, the server least of all, takes it for NVIDIA's driver
#   PREFIX/share/gpuplex/                            the systemd unit and an
#       example configuration (packaging/), to copy where the system wants them
# From an unpacked release tarball (bin/gpuplex present beside this script's
# folder, no Cargo.toml) it installs what is there without building.
#
# Usage: scripts/install.sh [PREFIX]     (DESTDIR is honoured, for packagers)
set -euo pipefail

prefix=${1:-/usr/local}
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${DESTDIR:-}$prefix

if [ -f "$root/Cargo.toml" ]; then
    command -v cargo >/dev/null || { echo "install.sh: cargo not found: install Rust (https://rustup.rs) first" >&2; exit 1; }
    (cd "$root" && cargo build --release --locked)
    bin=$root/target/release/gpuplex
    lib=$root/target/release/libcuda.so
else
    bin=$root/bin/gpuplex
    lib=$root/lib/gpuplex/libcuda.so
fi
[ -x "$bin" ] && [ -f "$lib" ] || { echo "install.sh: no gpuplex or libcuda.so to install in $root" >&2; exit 1; }

install -d "$dest/bin" "$dest/lib/gpuplex" "$dest/share/gpuplex"
install -m 755 "$bin" "$dest/bin/gpuplex"
install -m 755 "$lib" "$dest/lib/gpuplex/libcuda.so"
ln -sf libcuda.so "$dest/lib/gpuplex/libcuda.so.1"
for f in gpuplex.service gpuplex.toml; do
    install -m 644 "$root/packaging/$f" "$dest/share/gpuplex/$f"
done
echo "installed gpuplex in $dest: run programs with '$prefix/bin/gpuplex run -- PROGRAM'"
echo "as a service: see $prefix/share/gpuplex/gpuplex.service (docs/install.md)"
