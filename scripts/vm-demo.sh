#!/usr/bin/env bash
# Runs a CUDA program in a virtual machine that has no NVIDIA driver and no
# GPU, against a gpuplex server on this host.
#
# Usage: scripts/vm-demo.sh [--backend cuda|emulated] [--bin DIR] [--carrier vm|tcp] [--share DIR]...
#                           -- PROGRAM [ARGS...]
#
# Builds (once, cached in $GPUPLEX_VM_CACHE, default .cache/vm) a minimal
# guest: Debian's cloud kernel and busybox; then, per run, an initramfs with
# PROGRAM, the shared libraries it loads, and gpuplex's front-end as the
# guest's libcuda.so.1. Starts `gpuplex serve` on this host and the guest in
# QEMU (KVM where vCPUs run under it, else TCG), runs PROGRAM there, prints its
# stdout and stderr as they were, names the carrier, and exits with
# PROGRAM's status.
#
# Carrier: `vm` (the default) is memory the VM shares with this host, a
# file the server makes that QEMU gives the guest as an ivshmem-plain PCI
# device, which the front-end finds and maps from user space (no network,
# no kernel module), and which holds the program's pinned memory; `tcp` reaches the server over the VM's ordinary
# user-mode network instead (the guest's 10.0.2.2 is this host's loopback),
# with a token.
#
# --share DIR (any number) gives the guest a host folder read-only at the
# same path: an interpreter's libraries, a Python environment with PyTorch
# (`--share /usr/lib/python3.12 --share VENV -- VENV/bin/python3 SCRIPT`).
# Each is packed into an ext4 image (mke2fs -d) that the guest mounts from
# a virtio disk: Debian's cloud kernel has no 9p, and virtiofs needs a
# virtiofsd on the host, which the GPU machines lack. The libraries the
# shares' shared objects load from outside them go into the initramfs with
# the program's.
#
# QEMU comes from Debian (qemu-system-x86, installed with apt-get when
# missing and run as root) or from $GPUPLEX_QEMU (a qemu-system-x86_64 with
# its firmware beside it, for machines without a package manager); the
# kernel and busybox are Debian packages fetched with apt-get download.
# --bin DIR holds gpuplex and libcuda.so (default target/debug, built with
# --features gpuplex/emulated for the emulated backend).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
backend=emulated
bin=$root/target/debug
carrier=vm
shares=()
usage="usage: $0 [--backend cuda|emulated] [--bin DIR] [--carrier vm|tcp] [--share DIR]... -- PROGRAM [ARGS...]"
while [ $# -gt 0 ]; do
    case $1 in
        --backend) backend=$2; shift 2 ;;
        --bin) bin=$2; shift 2 ;;
        --carrier) carrier=$2; shift 2 ;;
        --share) [ -d "$2" ] || { echo "vm-demo: $2: not a folder" >&2; exit 2; }
            shares+=("$(cd "$2" && pwd)"); shift 2 ;;
        --) shift; break ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
if [ $# -lt 1 ]; then
    echo "$usage" >&2
    exit 2
fi
case $carrier in vm|tcp) ;; *) echo "vm-demo: carrier $carrier: vm or tcp" >&2; exit 2 ;; esac
program=$(command -v "$1" || true)
[ -n "$program" ] && [ -x "$program" ] || { echo "vm-demo: $1: not an executable" >&2; exit 127; }
shift
[ -x "$bin/gpuplex" ] && [ -f "$bin/libcuda.so" ] || { echo "vm-demo: $bin has no gpuplex and libcuda.so" >&2; exit 2; }

cache=${GPUPLEX_VM_CACHE:-$root/.cache/vm}
mkdir -p "$cache"
say() { echo "vm-demo: $*" >&2; }

# QEMU: the given one, the system's, or Debian's installed now.
qemu=${GPUPLEX_QEMU:-$(command -v qemu-system-x86_64 || true)}
if [ -z "$qemu" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "installing qemu-system-x86 from Debian"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends qemu-system-x86 >"$cache/apt.log" 2>&1 ||
            { cat "$cache/apt.log" >&2; exit 1; }
        qemu=$(command -v qemu-system-x86_64)
    else
        say "no qemu-system-x86_64: install Debian's qemu-system-x86, or set GPUPLEX_QEMU"
        exit 1
    fi
fi

# Kernel and busybox, unpacked once.
fetch() { # PACKAGE DIR
    if [ ! -e "$2/.done" ]; then
        rm -rf "$2" && mkdir -p "$2"
        (cd "$2" && apt-get download "$1" >/dev/null 2>&1) || { say "cannot download $1"; exit 1; }
        dpkg-deb -x "$2"/*.deb "$2" && rm -f "$2"/*.deb && touch "$2/.done"
    fi
}
if [ ! -e "$cache/kernel/.done" ]; then
    image=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/ { print $2; exit }')
    [ -n "$image" ] || { say "no linux-image-cloud-amd64 in the package lists (apt-get update?)"; exit 1; }
    fetch "$image" "$cache/kernel"
fi
fetch busybox-static "$cache/busybox"
vmlinuz=$(ls "$cache"/kernel/boot/vmlinuz-*)
modules=$(ls -d "$cache"/kernel/lib/modules/*)/kernel

# The guest's root: busybox, the network driver, the program and what it loads.
work=$(mktemp -d /tmp/gpuplex-vm.XXXXXX)
server=""
region=/dev/shm/gpuplex-vm-$$
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    rm -rf "$work" "$region"
}
trap cleanup EXIT
guest=$work/root
mkdir -p "$guest"/{bin,proc,sys,dev,tmp,modules,gpuplex/lib,program,etc,root}
# Who root is: libraries ask (Python's getpass, for one).
echo "root:x:0:0:root:/root:/bin/sh" >"$guest/etc/passwd"
echo "root:x:0:" >"$guest/etc/group"
cp "$cache/busybox/bin/busybox" "$guest/bin/"
for applet in sh mount insmod ip cat mkdir poweroff sync; do ln -s busybox "$guest/bin/$applet"; done
for m in virtio/virtio virtio/virtio_ring virtio/virtio_pci_modern_dev virtio/virtio_pci_legacy_dev \
    virtio/virtio_pci ../net/core/failover net/net_failover net/virtio_net block/virtio_blk; do
    cp "$modules/drivers/$m.ko" "$guest/modules/"
done
shared() { # PATH: whether it lies in a shared folder
    local dir
    for dir in "${shares[@]}"; do case $1 in "$dir"/*) return 0 ;; esac; done
    return 1
}
# The program: run from its share where it lies in one (an interpreter in
# a virtual environment finds the environment by its own path), with each
# link on the way to its file at its own path; else copied.
if shared "$program"; then
    run=$program
    p=$program
    while :; do
        if ! shared "$p"; then mkdir -p "$guest$(dirname "$p")" && cp -P "$p" "$guest$p"; fi
        [ -L "$p" ] || break
        t=$(readlink "$p")
        case $t in /*) p=$t ;; *) p=$(dirname "$p")/$t ;; esac
    done
else
    cp "$program" "$guest/program/"
    run=./$(basename "$program")
fi
# Every library the program, the front-end and the shares' shared objects
# load from outside the shares, at the path the loader looks for it (never
# a driver's: the guest has none), and their folders on the guest's library
# path (the guest has no loader cache).
objects=("$program" "$bin/libcuda.so")
for dir in "${shares[@]}"; do
    while IFS= read -r -d '' so; do objects+=("$so"); done < <(find "$dir" -name '*.so*' -type f -print0)
done
printf '%s\0' "${objects[@]}" | xargs -0 ldd 2>/dev/null | awk '/=> \// { print $3 } /^\t\/[^ ]* \(/ { print $1 }' |
    sort -u | grep -v -e '/libcuda\.so' -e '/libnvidia-' >"$work/libs" || true
while read -r lib; do
    shared "$lib" && continue
    mkdir -p "$guest$(dirname "$lib")"
    cp -L "$lib" "$guest$lib"
done <"$work/libs"
libdirs=$(xargs -r -n1 dirname <"$work/libs" | sort -u | tr '\n' ':')
# Each share an ext4 image, a read-only disk of the guest's.
disks=()
mounts=""
letters=(b c d e f g h i j k l m n o p q r s t u v w x y z)
for i in "${!shares[@]}"; do
    dir=${shares[$i]}
    image=$work/share$i.img
    kib=$(( $(du -sk "$dir" | cut -f1) * 5 / 4 + 65536 ))
    mke2fs -q -F -t ext4 -O ^has_journal -m 0 -d "$dir" "$image" "${kib}k" >/dev/null ||
        { say "cannot pack $dir into an image (mke2fs -d)"; exit 1; }
    disks+=(-drive "file=$image,if=virtio,format=raw,readonly=on")
    [ "$i" -eq 0 ] && dev=vda || dev=vd${letters[$((i - 1))]}
    mounts+="mkdir -p '$dir' && mount -t ext4 -o ro /dev/$dev '$dir'"$'\n'
done
cp "$bin/libcuda.so" "$guest/gpuplex/lib/libcuda.so.1"
token=$work/token
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$token"
chmod 600 "$token"
cp "$token" "$guest/gpuplex/token"

port=$(( 20000 + RANDOM % 20000 ))
case $carrier in
    vm) guest_server=vm; listen=vm:$region ;;
    tcp) guest_server=tcp:10.0.2.2:$port; listen=tcp:127.0.0.1:$port ;;
esac
args=""
for a in "$@"; do args="$args '${a//\'/\'\\\'\'}'"; done
cat >"$guest/init" <<EOF
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/shm
mount -t tmpfs tmp /tmp
mount -t tmpfs shm /dev/shm
if [ $carrier = tcp ] || [ ${#shares[@]} -gt 0 ]; then
    for m in virtio virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci; do
        insmod /modules/\$m.ko
    done
fi
if [ ${#shares[@]} -gt 0 ]; then
    insmod /modules/virtio_blk.ko
$mounts
fi
if [ $carrier = tcp ]; then
    for m in failover net_failover virtio_net; do
        insmod /modules/\$m.ko
    done
    ip link set lo up
    ip link set eth0 up
    ip addr add 10.0.2.15/24 dev eth0
    ip route add default via 10.0.2.2
fi
nvidia=no
ls /dev/nvidia* >/dev/null 2>&1 && nvidia=yes
echo "==vm-demo== nvidia devices: \$nvidia"
cd /program
HOME=/root LD_LIBRARY_PATH=/gpuplex/lib:$libdirs GPUPLEX_SERVER=$guest_server GPUPLEX_TOKEN_FILE=/gpuplex/token \\
    $run$args >/tmp/out 2>/tmp/err
rc=\$?
echo "==vm-demo== stdout"
cat /tmp/out
echo "==vm-demo== stderr"
cat /tmp/err
echo "==vm-demo== exit \$rc"
sync
poweroff -f
EOF
chmod +x "$guest/init"
(cd "$guest" && find . | "$guest/bin/busybox" cpio -o -H newc 2>/dev/null | gzip -1 >"$work/initrd.gz")

# The server: on the VM's region, or on loopback, which the guest's
# user-mode network reaches.
"$bin/gpuplex" serve --backend "$backend" --listen "$listen" --token-file "$token" >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 100); do
    grep -q serving "$work/server.log" && break
    kill -0 "$server" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
    sleep 0.1
done

# KVM where this machine's vCPUs run, else TCG: /dev/kvm may exist where
# they cannot (no nested virtualization), and a guest there hangs rather
# than failing. So the kernel is booted once under KVM for a few seconds:
# a vCPU that runs prints the kernel's banner. The answer is kept in the
# cache (GPUPLEX_VM_ACCEL=kvm|tcg decides instead).
accel=${GPUPLEX_VM_ACCEL:-}
if [ -z "$accel" ] && [ -s "$cache/accel" ]; then
    accel=$(cat "$cache/accel")
elif [ -z "$accel" ] && [ -w /dev/kvm ]; then
    timeout 10 "$qemu" -machine q35,accel=kvm -cpu host -m 256 -nographic -no-reboot -nodefaults -serial stdio \
        -kernel "$vmlinuz" -append "console=ttyS0 panic=-1" >"$work/kvm-probe.log" 2>&1 || true
    grep -q "Linux version" "$work/kvm-probe.log" && accel=kvm || accel=tcg
    echo "$accel" >"$cache/accel"
fi
accel=${accel:-tcg}
case $carrier in
    vm) devices=(-object "memory-backend-file,id=gpuplex,share=on,mem-path=$region,size=$(stat -c %s "$region")"
        -device ivshmem-plain,memdev=gpuplex) ;;
    tcp) devices=(-netdev user,id=net0 -device virtio-net-pci,netdev=net0) ;;
esac
say "guest: $(basename "$vmlinuz"), $accel, carrier $carrier ($guest_server), $backend backend"
started=$(date +%s.%N)
# The CPU: all TCG emulates (AVX2 among it, which libraries such as
# PyTorch's assume), or the host's under KVM.
[ "$accel" = kvm ] && cpu=host || cpu=max
timeout 600 "$qemu" -machine "q35,accel=$accel" -cpu "$cpu" -m "${GPUPLEX_VM_MEMORY:-2048}" -nographic -no-reboot -nodefaults -serial stdio \
    -kernel "$vmlinuz" -initrd "$work/initrd.gz" -append "console=ttyS0 quiet loglevel=0 panic=-1" \
    "${devices[@]}" "${disks[@]}" >"$work/console.log" 2>&1 || true
ended=$(date +%s.%N)
cp "$work/console.log" "$cache/console.log"

# The program's output, as it printed it, out of the console (a marker may
# follow the firmware's screen control codes on its line).
console=$(tr -d '\r' <"$work/console.log")
marked() { awk -v from="==vm-demo== $1" -v to="==vm-demo== $2" 'index($0, from) { on = 1; next } index($0, to) { on = 0 } on'; }
printf '%s\n' "$console" | marked stdout stderr
printf '%s\n' "$console" | marked stderr exit >&2
rc=$(printf '%s\n' "$console" | awk '{ i = index($0, "==vm-demo== exit ") } i { print substr($0, i + 17) }')
nvidia=$(printf '%s\n' "$console" | awk '{ i = index($0, "==vm-demo== nvidia devices: ") } i { print substr($0, i + 28) }')
if [ -z "$rc" ]; then
    say "the guest did not finish; its console ($cache/console.log) ends:"
    tail -30 "$work/console.log" >&2
    exit 1
fi
say "exit $rc in $(awk -v a="$started" -v b="$ended" 'BEGIN { printf "%.1f", b - a }') s from boot to power-off; /dev/nvidia* in the guest: $nvidia"
exit "$rc"
