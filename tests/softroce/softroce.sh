#!/bin/bash
# softroce.sh - colld over InfiniBand verbs between two machines, on Soft-RoCE (rdma_rxe): two qemu
# guests (TCG: no KVM needed) of Debian's own kernel, joined by a qemu socket network on
# 127.0.0.1, each with rxe0 on its virtio NIC and one colld started with --net-transport ib.
#
#   1. a multi-node all-reduce between a rank on each guest, checked exactly (colld-test-coll: the
#      exact matrix at small counts and one 4 MiB float32 all-reduce, many DATA writes through the
#      credits), with both daemons' collctl status naming the link's transport "ib";
#   2. a QP error injected on guest 2 (collctl ib-fault: its QP to guest 1 moved to the error
#      state): the next collective fails on both guests with COLLD_ERR_NODE_LOST naming the IB
#      link, the daemons reconnect and negotiate IB again, and an all-reduce is exact again;
#   3. guest 2's daemon killed: guest 1 reports the peer lost.
#
# Built from Debian's packages only: the kernel package (the one linux-image-amd64 depends on) is
# fetched with apt-get download and unpacked with dpkg-deb -x into the cache (never installed on
# the host; reruns reuse it), busybox-static, rdma-core's provider and iproute2's rdma tool, and
# colld's own binaries with their shared libraries (ldd) in the initramfs.
#
# Usage: softroce.sh --build BUILD_DIR   (cache: $COLLD_SOFTROCE_CACHE or BUILD_DIR/softroce)
# Exit 0 passed, 1 failed, 77 skipped (no qemu, busybox or kernel package: says which).
set -euo pipefail

BUILD=
while [ $# -gt 0 ]; do
    case "$1" in
    --build) BUILD=$(cd "$2" && pwd); shift 2 ;;
    *) echo "usage: $0 --build BUILD_DIR" >&2; exit 2 ;;
    esac
done
[ -n "$BUILD" ] || { echo "usage: $0 --build BUILD_DIR" >&2; exit 2; }
CACHE=${COLLD_SOFTROCE_CACHE:-$BUILD/softroce}
GUEST_TIMEOUT=${COLLD_SOFTROCE_TIMEOUT:-240}
T0=$(date +%s.%N)
step() { awk -v a="$T0" -v b="$(date +%s.%N)" -v m="$*" 'BEGIN { printf "softroce: [%6.1f s] %s\n", b - a, m }'; }
skip() { echo "softroce: SKIP: $*"; exit 77; }
die() { echo "softroce: FAIL: $*"; exit 1; }

command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 missing (make deps installs qemu-system-x86)"
BUSYBOX=/bin/busybox
[ -x "$BUSYBOX" ] && ! ldd "$BUSYBOX" >/dev/null 2>&1 || skip "no static busybox (busybox-static)"
command -v rdma >/dev/null || skip "iproute2's rdma tool missing"
PROVIDER=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so 2>/dev/null | head -1)
[ -n "$PROVIDER" ] || skip "rdma-core's rxe provider missing (ibverbs-providers)"
for b in tools/collctl server/colld tests/integration/colld-test-coll tests/softroce/colld-softroce-uid; do
    [ -x "$BUILD/$b" ] || die "$BUILD/$b not built"
done

ldd "$BUILD/server/colld" | grep -q libibverbs || skip "colld was built without libibverbs (libibverbs-dev)"

# ---- the kernel: Debian's, cached ---------------------------------------------------------------
mkdir -p "$CACHE/debs"
KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[ -n "$KPKG" ] || skip "apt-cache does not know linux-image-amd64 (run apt-get update)"
KVER=${KPKG#linux-image-}
KDIR=$CACHE/kernel-$KVER
if [ ! -f "$KDIR/.unpacked" ]; then
    step "fetching $KPKG (apt-get download, cached in $CACHE/debs)"
    ls "$CACHE/debs/${KPKG}_"*.deb >/dev/null 2>&1 || (cd "$CACHE/debs" && apt-get download "$KPKG" >/dev/null 2>&1) ||
        skip "apt-get download $KPKG failed (no network?)"
    rm -rf "$KDIR"
    dpkg-deb -x "$CACHE/debs/${KPKG}_"*.deb "$KDIR"
    touch "$KDIR/.unpacked"
fi
VMLINUZ=$KDIR/boot/vmlinuz-$KVER
MODDIR=$KDIR/lib/modules/$KVER
step "kernel $KVER"

# ---- the initramfs --------------------------------------------------------------------------------
ROOT=$CACHE/root
rm -rf "$ROOT"
mkdir -p "$ROOT"/{bin,sbin,etc,proc,sys,dev,tmp,run,mods,usr/bin,etc/libibverbs.d}
cp "$BUSYBOX" "$ROOT/bin/busybox"

# Modules in dependency order (modinfo -F depends; the package has no modules.dep).
declare -A SEEN
ORDER=()
add_mod() {
    local m=$1 f
    [ -n "${SEEN[$m]:-}" ] && return 0
    SEEN[$m]=1
    f=$(find "$MODDIR/kernel" -name "$m.ko*" | head -1)
    [ -n "$f" ] || { [ -d "/sys/module/$m" ] || true; return 0; } # built in
    local deps
    deps=$(modinfo -F depends "$f" | tr ',' ' ')
    for d in $deps; do add_mod "$d"; done
    case "$f" in
    *.xz) xz -dc "$f" >"$ROOT/mods/$m.ko" ;;
    *) cp "$f" "$ROOT/mods/$m.ko" ;;
    esac
    ORDER+=("$m")
}
for m in virtio virtio_ring virtio_pci virtio_net crc32_generic configfs udp_tunnel ip6_udp_tunnel ib_core \
    ib_uverbs iw_cm ib_cm rdma_cm rdma_ucm rdma_rxe; do
    add_mod "$m"
done
printf '%s\n' "${ORDER[@]}" >"$ROOT/mods/order"

# Binaries and their libraries: the system's at their paths, colld's own (libcolld, found through
# the build tree's RUNPATH, which may lie under /tmp: the guest mounts a tmpfs there) in
# /usr/local/lib/colld, on the guests' LD_LIBRARY_PATH (guest-init.sh).
copy_libs() {
    ldd "$1" | awk '/=> \// {print $3} /^\t\/lib/ {print $1}' | while read -r lib; do
        case "$lib" in
        /lib/* | /lib64/* | /usr/lib/* | /usr/lib64/*) dst=$ROOT$lib ;;
        *) dst=$ROOT/usr/local/lib/colld/$(basename "$lib") ;;
        esac
        [ -e "$dst" ] && continue
        mkdir -p "$(dirname "$dst")"
        cp -L "$lib" "$dst"
    done
}
for b in "$BUILD/server/colld" "$BUILD/tools/collctl" "$BUILD/tests/integration/colld-test-coll" \
    "$BUILD/tests/softroce/colld-softroce-uid" "$(command -v rdma)"; do
    cp -L "$b" "$ROOT/usr/bin/"
    copy_libs "$b"
done
mkdir -p "$ROOT$(dirname "$PROVIDER")"
cp -L "$PROVIDER" "$ROOT$PROVIDER"
copy_libs "$PROVIDER"
cp /etc/libibverbs.d/rxe.driver "$ROOT/etc/libibverbs.d/"
echo "softroce-test-cluster-secret-0123456789" >"$ROOT/etc/colld-secret"
chmod 600 "$ROOT/etc/colld-secret"
echo "root:x:0:0:root:/:/bin/sh" >"$ROOT/etc/passwd"
echo "root:x:0:" >"$ROOT/etc/group"
cp "$(dirname "$0")/guest-init.sh" "$ROOT/init"
chmod 755 "$ROOT/init"
(cd "$ROOT" && find . | cpio -o -H newc --quiet) >"$CACHE/initrd.cpio"
step "initramfs: $(du -m "$CACHE/initrd.cpio" | cut -f1) MiB, modules: ${ORDER[*]}"

# ---- two guests ---------------------------------------------------------------------------------
PORT=$((20000 + RANDOM % 20000))
RUN=$CACHE/run
rm -rf "$RUN"
mkdir -p "$RUN"
boot() {
    local n=$1 net=$2
    timeout "$GUEST_TIMEOUT" qemu-system-x86_64 -machine q35 -cpu max -smp 1 -m 1024 -nographic -no-reboot \
        -kernel "$VMLINUZ" -initrd "$CACHE/initrd.cpio" \
        -append "console=ttyS0 quiet loglevel=3 panic=-1 colld_node=$n" \
        -netdev "socket,id=n0,$net" -device "virtio-net-pci,netdev=n0,mac=52:54:00:12:34:0$n" \
        </dev/null >"$RUN/guest$n.log" 2>&1 &
}
boot 1 "listen=127.0.0.1:$PORT"
G1=$!
sleep 0.5
boot 2 "connect=127.0.0.1:$PORT"
G2=$!
step "guests booting (qemu $G1, $G2; consoles in $RUN)"
# Once one guest has ended, the other gets 60 s more, then is stopped: a guest left waiting for its
# peer (a step that failed on the other side) ends the test then, not at GUEST_TIMEOUT.
alive() { kill -0 "$1" 2>/dev/null; }
while alive "$G1" && alive "$G2"; do sleep 0.5; done
for _ in $(seq 120); do
    alive "$G1" || alive "$G2" || break
    sleep 0.5
done
for g in "$G1" "$G2"; do
    alive "$g" && kill "$g" 2>/dev/null
done
rc1=0 rc2=0
wait "$G1" || rc1=$?
wait "$G2" || rc2=$?
step "guests ended (qemu exit $rc1, $rc2)"
grep -ah "SR node" "$RUN/guest1.log" "$RUN/guest2.log" | grep -v " log " | tr -d '\r' || true

# ---- the verdict ---------------------------------------------------------------------------------
fail=0
want() { # FILE PATTERN WHAT
    grep -q -- "$2" "$RUN/$1" || { echo "softroce: missing in $1: $3 ($2)"; fail=1; }
}
for n in 1 2; do
    want guest$n.log "SR node$n rxe0 active" "rxe0 ACTIVE"
    want guest$n.log "^SR node$n coll1 rc=0" "the first all-reduce exact"
    want guest$n.log "^SR node$n transport .* ib " "collctl status naming ib"
    want guest$n.log "^SR node$n probe rc=0 .* ib " "collctl probe over the link naming ib"
    want guest$n.log "^SR node$n coll2 rc=[1-9].*COLLD_ERR_NODE_LOST" "the collective after the QP error failing"
    want guest$n.log "^SR node$n coll3 rc=0" "an exact all-reduce after IB was negotiated again"
done
want guest1.log "^SR node1 coll2 .*IB link to 10.0.0.2:7070 failed: work completion" "the QP error named"
want guest1.log "^SR node1 peer-lost " "guest 2's daemon killed: the peer lost"
if [ $fail -ne 0 ]; then
    echo "---- guest 1 ----"; tail -60 "$RUN/guest1.log"
    echo "---- guest 2 ----"; tail -60 "$RUN/guest2.log"
    die "see above"
fi
step "passed"
