#!/usr/bin/env bash
# Packs what scripts/vm-demo.sh needs into one folder, for a machine that
# has no package manager or no network (the GPU machines): this machine's
# QEMU (Debian's qemu-system-x86, with the libraries and the loader it runs
# with, the firmware a -kernel boot reads and the TCG accelerator module)
# and the guest kernel and busybox from vm-demo.sh's cache.
#
# Usage: scripts/vm-bundle.sh OUT_DIR
#   then, on the other machine:
#   GPUPLEX_QEMU=OUT_DIR/qemu/qemu GPUPLEX_VM_CACHE=OUT_DIR/cache scripts/vm-demo.sh ...
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
out=$1
cache=${GPUPLEX_VM_CACHE:-$root/.cache/vm}
qemu=$(command -v qemu-system-x86_64) || { echo "vm-bundle: no qemu-system-x86_64 (install qemu-system-x86)" >&2; exit 1; }
# The guest's kernel and busybox: vm-demo.sh fetches them on first use.
if [ ! -e "$cache/kernel/.done" ] || [ ! -e "$cache/busybox/.done" ]; then
    echo "vm-bundle: no guest in $cache yet: run scripts/vm-demo.sh once first" >&2
    exit 1
fi

rm -rf "$out"
mkdir -p "$out/qemu/lib" "$out/qemu/share" "$out/qemu/modules" "$out/cache/kernel/boot" "$out/cache/busybox"
cp "$qemu" "$out/qemu/"
modules=$(dirname "$(dpkg -S accel-tcg-x86_64.so | awk "{ print \$2; exit }")")
cp "$modules/accel-tcg-x86_64.so" "$out/qemu/modules/"
# Every library QEMU and its accelerator load, and the loader that loads them.
ldd "$qemu" "$out/qemu/modules/accel-tcg-x86_64.so" |
    awk '/=> \// { print $3 } /^\t\/[^ ]* \(/ { print $1 }' | sort -u | while read -r lib; do
    cp -L "$lib" "$out/qemu/lib/"
done
for firmware in /usr/share/seabios/bios-256k.bin /usr/share/qemu/linuxboot_dma.bin /usr/share/qemu/kvmvapic.bin; do
    cp -L "$firmware" "$out/qemu/share/"
done
cat >"$out/qemu/qemu" <<'EOF'
#!/bin/sh
# QEMU with the libraries, firmware and modules packed beside it.
d=$(dirname "$(readlink -f "$0")")
QEMU_MODULE_DIR=$d/modules exec "$d/lib/ld-linux-x86-64.so.2" --library-path "$d/lib" \
    "$d/qemu-system-x86_64" -L "$d/share" "$@"
EOF
chmod +x "$out/qemu/qemu"

# The kernel, and of its modules only those vm-demo.sh loads.
cp "$cache"/kernel/boot/vmlinuz-* "$out/cache/kernel/boot/"
kernel=$(ls -d "$cache"/kernel/lib/modules/*)
for m in drivers/virtio/virtio drivers/virtio/virtio_ring drivers/virtio/virtio_pci_modern_dev \
    drivers/virtio/virtio_pci_legacy_dev drivers/virtio/virtio_pci net/core/failover drivers/net/net_failover \
    drivers/net/virtio_net drivers/block/virtio_blk; do
    mkdir -p "$out/cache/kernel/lib/modules/$(basename "$kernel")/kernel/$(dirname "$m")"
    cp "$kernel/kernel/$m.ko" "$out/cache/kernel/lib/modules/$(basename "$kernel")/kernel/$m.ko"
done
cp -r "$cache/busybox/bin" "$out/cache/busybox/"
touch "$out/cache/kernel/.done" "$out/cache/busybox/.done"
"$out/qemu/qemu" --version | head -1 >&2
du -sh "$out" >&2
