#!/usr/bin/env bash
# Builds a release tarball, dist/gpuplex-VERSION-ARCH-linux.tar.gz, laid out
# as an install prefix (bin/, lib/gpuplex/, share/gpuplex/, share/doc/gpuplex/)
# with scripts/install.sh inside: unpack it anywhere and run
# `scripts/install.sh [PREFIX]` there, or unpack it straight into a prefix.
#
# Usage: scripts/release.sh
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cargo build --release --locked
version=$(target/release/gpuplex --version | awk '{ print $2 }')
name=gpuplex-$version-$(uname -m)-linux
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
top=$stage/$name
install -d "$top/bin" "$top/lib/gpuplex" "$top/share/gpuplex" "$top/share/doc/gpuplex" "$top/scripts" "$top/packaging"
install -m 755 target/release/gpuplex "$top/bin/gpuplex"
install -m 755 target/release/libcuda.so "$top/lib/gpuplex/libcuda.so"
ln -s libcuda.so "$top/lib/gpuplex/libcuda.so.1"
install -m 755 scripts/install.sh "$top/scripts/install.sh"
for f in gpuplex.service gpuplex.toml; do
    install -m 644 "packaging/$f" "$top/share/gpuplex/$f"
    install -m 644 "packaging/$f" "$top/packaging/$f"
done
install -m 644 README.md CHANGELOG.md docs/*.md "$top/share/doc/gpuplex/"
mkdir -p dist
tar -C "$stage" -czf "dist/$name.tar.gz" "$name"
echo "dist/$name.tar.gz"
