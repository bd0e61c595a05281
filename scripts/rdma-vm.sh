#!/usr/bin/env bash
# A real kernel RDMA stack for the tests, on a machine without an RDMA NIC: a stock Debian kernel
# with soft-RoCE (rdma_rxe) booted in QEMU (TCG), its root filesystem made with debootstrap from
# Debian's packages. Nothing prebuilt is downloaded.
#
#   scripts/rdma-vm.sh build [DIR]   kernel + initramfs into DIR (default target/rdma-vm); kept
#                                    there and reused while its recipe is unchanged
#   scripts/rdma-vm.sh run DIR SHARE JOB [NET [IP]]
#                                    boots one VM: SHARE (a host folder) is mounted at /host (or
#                                    at $RDMA_VM_MOUNT: the same path as on the host lets binaries
#                                    find what they were built beside), JOB (a path inside SHARE)
#                                    runs as root once rxe0 is up, its exit status lands in
#                                    SHARE/JOB.rc and the VM powers off. The console goes to
#                                    standard output.
#                                    NET: `user` (default; 10.0.2.15, QEMU's user network),
#                                    `listen:PORT` or `connect:PORT` (two VMs joined by a socket
#                                    on 127.0.0.1:PORT; give each its IP, e.g. 10.77.0.1/24);
#                                    several, comma-separated, for several NICs (ethN, rxeN),
#                                    with as many IPs.
#
# Needs root (debootstrap, chroot), debootstrap, dpkg-deb, cpio, zstd and qemu-system-x86_64.
# What works and what does not on these machines: ../shared/reference/rdma-softroce.md (rxe in
# one VM over its own address, or one rxe per VM across two VMs; KVM cannot boot a stock kernel
# here, so TCG it is).
set -euo pipefail

# The recipe: changing any of these rebuilds the image.
SUITE=bookworm
# python3: the Python client's test against a store serving RDMA; libnuma1: Mooncake's wheel.
PACKAGES=rdma-core,ibverbs-utils,ibverbs-providers,perftest,iproute2,kmod,rdmacm-utils,procps,curl,python3,libnuma1
# crc32_generic: rxe asks the crypto API for "crc32" by name, which no module dependency names.
MODULES="virtio_pci virtio_net 9p 9pnet_virtio crc32_generic rdma_rxe ib_uverbs rdma_ucm ib_umad"
RECIPE="v5 $SUITE $PACKAGES $MODULES"

die() { echo "rdma-vm: $*" >&2; exit 1; }

# The kernel package Debian's linux-image-amd64 points at now, e.g. linux-image-6.1.0-56-amd64.
kernel_package() {
    apt-cache depends linux-image-amd64 2>/dev/null \
        | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}

write_init() {
    cat >"$1" <<'EOF'
#!/bin/sh
# rbgctl's RDMA test VM: mounts, modules, network, soft-RoCE, then the job; powers off after.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/shm /dev/pts /tmp /run /host
mount -t tmpfs -o mode=1777 shm /dev/shm
mount -t tmpfs -o mode=1777 tmp /tmp
mount -t tmpfs run /run
ip=10.0.2.15/24
mnt=/host
for word in $(cat /proc/cmdline); do
    case "$word" in
        rvm.job=*) job=${word#rvm.job=} ;;
        rvm.mnt=*) mnt=${word#rvm.mnt=} ;;
        rvm.ip=*) ip=${word#rvm.ip=} ;;
    esac
done
say() { echo "rdma-vm: $*" >/dev/console; }
modprobe -a @MODULES@ || say "a module did not load"
mkdir -p "$mnt"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576,cache=loose host0 "$mnt" \
    || say "cannot mount the host's folder"
hostname rdma-vm
ip link set lo up
# One address per NIC (comma-separated), in order: eth0, eth1, ...; soft-RoCE rxeN on ethN.
n=0
for addr in $(echo "$ip" | tr ',' ' '); do
    ip link set "eth$n" up
    ip addr add "$addr" dev "eth$n"
    rdma link add "rxe$n" type rxe netdev "eth$n" || say "cannot add rxe$n on eth$n"
    n=$((n + 1))
done
# Each port goes ACTIVE once its link is up; wait for them (bounded).
i=0
while [ $i -lt $n ]; do
    t=0
    until grep -q ACTIVE "/sys/class/infiniband/rxe$i/ports/1/state" 2>/dev/null || [ $t -ge 50 ]; do
        sleep 0.1; t=$((t + 1))
    done
    say "rxe$i $(cat "/sys/class/infiniband/rxe$i/ports/1/state" 2>/dev/null), eth$i"
    i=$((i + 1))
done
rc=99
if [ -n "${job:-}" ] && [ -f "$mnt/$job" ]; then
    ( cd "$(dirname "$mnt/$job")" && sh "$mnt/$job" ) </dev/null >/dev/console 2>&1
    rc=$?
    echo "$rc" >"$mnt/$job.rc"
else
    say "no job (rvm.job=${job:-})"
fi
say "job exited $rc; powering off"
sync
echo o >/proc/sysrq-trigger
sleep 5
EOF
    sed -i "s/@MODULES@/$MODULES/" "$1"
    chmod 755 "$1"
}

build() {
    local dir=${1:-target/rdma-vm}
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [ -f "$dir/recipe" ] && [ "$(cat "$dir/recipe")" = "$RECIPE" ] \
        && [ -f "$dir/vmlinuz" ] && [ -f "$dir/initrd.img" ]; then
        echo "rdma-vm: $dir is up to date"
        return
    fi
    [ "$(id -u)" = 0 ] || die "build needs root (debootstrap, chroot)"
    for tool in debootstrap dpkg-deb cpio zstd apt-get; do
        command -v "$tool" >/dev/null || die "build needs $tool"
    done
    local pkg
    pkg=$(kernel_package)
    if [ -z "$pkg" ]; then
        apt-get update -qq >/dev/null 2>&1 || true
        pkg=$(kernel_package)
    fi
    [ -n "$pkg" ] || die "apt-cache knows no linux-image-amd64 (is a Debian mirror reachable?)"
    local work="$dir/work"
    rm -rf "$work" "$dir/recipe"
    mkdir -p "$work"
    echo "rdma-vm: $pkg from Debian"
    (cd "$work" && apt-get download "$pkg" >/dev/null 2>&1) || die "cannot download $pkg"
    dpkg-deb -x "$work"/"$pkg"_*.deb "$work/kernel"
    local version
    version=$(ls "$work/kernel/lib/modules")
    echo "rdma-vm: debootstrap $SUITE ($PACKAGES)"
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$work/root" \
        >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log"; die "debootstrap failed"; }
    # Only the modules the VM loads, with their dependencies (found by the VM's own modprobe).
    mkdir -p "$work/root/lib/modules"
    cp -a "$work/kernel/lib/modules/$version" "$work/root/lib/modules/"
    chroot "$work/root" depmod "$version"
    local keep
    # shellcheck disable=SC2086
    keep=$(chroot "$work/root" modprobe -a -S "$version" --show-depends $MODULES \
        | awk '$1 == "insmod" { print $2 }' | sort -u)
    [ -n "$keep" ] || die "modprobe found none of: $MODULES"
    find "$work/root/lib/modules/$version/kernel" -name '*.ko*' | while read -r ko; do
        grep -qxF "${ko#"$work/root"}" <<<"$keep" || rm -f "$ko"
    done
    chroot "$work/root" depmod "$version"
    # What the VM does not need: documentation, caches, apt's lists.
    rm -rf "$work/root"/usr/share/{doc,man,info,locale} "$work/root"/var/cache/apt/* \
        "$work/root"/var/lib/apt/lists/*
    write_init "$work/root/init"
    echo "rdma-vm: packing the initramfs"
    (cd "$work/root" && find . -print0 | cpio --null -o -H newc --quiet | zstd -q -T0 -9) \
        >"$dir/initrd.img"
    cp "$work/kernel/boot/vmlinuz-$version" "$dir/vmlinuz"
    echo "$version" >"$dir/kernel-version"
    rm -rf "$work"
    echo "$RECIPE" >"$dir/recipe"
    echo "rdma-vm: $dir ready ($(du -h "$dir/initrd.img" | cut -f1) initramfs, kernel $version)"
}

run() {
    [ $# -ge 3 ] || die "usage: run DIR SHARE JOB [NET [IP]]"
    local dir=$1 share=$2 job=$3 net=${4:-user} ip=${5:-10.0.2.15/24}
    command -v qemu-system-x86_64 >/dev/null || die "run needs qemu-system-x86_64"
    [ -f "$dir/vmlinuz" ] || die "no VM in $dir: run '$0 build $dir' first"
    [ -f "$share/$job" ] || die "no job $share/$job"
    rm -f "$share/$job.rc"
    # One NIC per NET (comma-separated): `user`, or `listen:PORT` / `connect:PORT`.
    local nic=() k=0 spec
    for spec in $(echo "$net" | tr ',' ' '); do
        local mac
        mac=52:54:00:12:$(printf %02x $((k + 1))):$(printf %02x $((RANDOM % 200 + 16)))
        case "$spec" in
            user) nic+=(-nic "user,model=virtio-net-pci,mac=$mac") ;;
            listen:* | connect:*)
                nic+=(-netdev "socket,id=n$k,${spec%%:*}=127.0.0.1:${spec#*:}"
                    -device "virtio-net-pci,netdev=n$k,mac=$mac") ;;
            *) die "NET is user, listen:PORT or connect:PORT (comma-separated), not $spec" ;;
        esac
        k=$((k + 1))
    done
    # TCG only: KVM here cannot boot a stock kernel (see the reference note).
    exec qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m "${RDMA_VM_MEMORY:-2048}" \
        -kernel "$dir/vmlinuz" -initrd "$dir/initrd.img" \
        -append "console=ttyS0 quiet panic=-1 rvm.job=$job rvm.ip=$ip rvm.mnt=${RDMA_VM_MOUNT:-/host}" \
        -display none -serial stdio -monitor none -no-reboot \
        -virtfs "local,path=$share,mount_tag=host0,security_model=none" \
        "${nic[@]}"
}

case "${1:-}" in
    build) shift; build "$@" ;;
    run) shift; run "$@" ;;
    *) die "usage: $0 build [DIR] | run DIR SHARE JOB [NET [IP]]" ;;
esac
