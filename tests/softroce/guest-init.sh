#!/bin/busybox sh
# guest-init.sh - /init of a Soft-RoCE guest (softroce.sh): rxe0 on eth0, one colld with
# --net-transport ib, then this node's part of the test. Lines starting "SR node<N> " are the
# results softroce.sh checks. Guest 1 publishes unique ids and its progress over busybox httpd;
# guest 2 polls for them with wget.
/bin/busybox --install -s /bin
echo # the console's escape codes end their line, not ours
export PATH=/bin:/sbin:/usr/bin
export LD_LIBRARY_PATH=/usr/local/lib/colld # libcolld (softroce.sh's copy_libs)
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/shm /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t configfs configfs /sys/kernel/config 2>/dev/null
N=$(sed -n 's/.*colld_node=\([0-9]\).*/\1/p' /proc/cmdline)
OTHER=$((3 - N))
say() { echo "SR node$N $*"; }
finish() {
    say "end"
    sync
    poweroff -f
}
t0=$(cut -d' ' -f1 /proc/uptime)
for m in $(cat /mods/order); do
    insmod /mods/$m.ko || say "insmod $m failed"
done
ip link set lo up
ip link set eth0 up
ip addr add 10.0.0.$N/24 dev eth0
rdma link add rxe0 type rxe netdev eth0 || { say "rdma link add failed"; finish; }
i=0
until rdma link show rxe0/1 2>/dev/null | grep -q "state ACTIVE"; do
    i=$((i + 1))
    [ $i -gt 300 ] && { say "rxe0 never became active"; rdma link show; finish; }
    sleep 0.1
done
say "rxe0 active at $(cut -d' ' -f1 /proc/uptime) s (boot to modules $t0 s)"

SOCK=/run/colld.sock
colld --socket $SOCK --listen 10.0.0.$N:7070 --node-name guest$N --cluster-secret-file /etc/colld-secret \
    --peers 10.0.0.0/24:7070 --net-transport ib --heartbeat-ms 2000 --heartbeat-misses 5 --peer-handshake-ms 15000 --log-level info --log-file /tmp/colld.log \
    --test-ib-fault-file /tmp/ib-fault >/tmp/colld.out 2>&1 &
COLLD=$!
i=0
until [ -S $SOCK ] && collctl --socket $SOCK status >/dev/null 2>&1; do
    i=$((i + 1))
    [ $i -gt 200 ] && { say "colld did not start"; cat /tmp/colld.out; finish; }
    sleep 0.1
done
say "colld up at $(cut -d' ' -f1 /proc/uptime) s"

mkdir -p /tmp/www /tmp/sync
[ $N = 1 ] && httpd -p 8080 -h /tmp/www
# publish NAME: guest 1 serves /tmp/www/NAME; fetch NAME: guest 2 waits for it (120 s at most).
fetch() {
    i=0
    until wget -q -O /tmp/$1 http://10.0.0.1:8080/$1 2>/dev/null; do
        i=$((i + 1))
        [ $i -gt 1200 ] && { say "no $1 from guest 1"; finish; }
        sleep 0.1
    done
    cat /tmp/$1
}
uid_for() { # phase: guest 1 makes a unique id and publishes it, guest 2 fetches it
    if [ $N = 1 ]; then
        colld-softroce-uid $SOCK 600 >/tmp/uid$1 2>/tmp/uid$1.err &
        p=$!
        i=0
        until [ -s /tmp/uid$1 ]; do # (inside $(...): what it says goes to the console on stderr)
            i=$((i + 1))
            if ! kill -0 $p 2>/dev/null || [ $i -gt 600 ]; then
                say "no unique id $1: $(cat /tmp/uid$1.err)" >&2
                finish >&2
            fi
            sleep 0.05
        done
        cp /tmp/uid$1 /tmp/www/uid$1
        cat /tmp/uid$1
    else
        fetch uid$1
    fi
}
status_line() {
    collctl --socket $SOCK status >/tmp/status 2>&1
    grep -A3 "^TRANSPORT" /tmp/status | grep "guest$OTHER" | head -1
}
RANK=$((N - 1))
COLL="colld-test-coll --socket $SOCK --nranks 2 --rank $RANK"

# 1. the exact matrix at small counts and a 4 MiB float32 all-reduce over IB
UID1=$(uid_for 1)
$COLL --uid "$UID1" --kinds allreduce --dtypes float32,int32 --exact-values --big-min >/tmp/coll1 2>&1
say "coll1 rc=$? $(tail -1 /tmp/coll1)"
say "transport $(status_line) "
collctl --socket $SOCK probe --bytes 256K >/tmp/probe 2>&1
say "probe rc=$? $(grep -m1 "guest$OTHER" /tmp/probe)"

# 2. a QP error injected on guest 1 while a communicator is formed: its next collective fails
UID2=$(uid_for 2)
if [ $N = 1 ]; then
    $COLL --uid "$UID2" --mode small --iters 40 --checkpoints 10 --sync-dir /tmp/sync >/tmp/coll2 2>&1 &
    R=$!
    i=0
    until [ -e /tmp/sync/at-10 ] || [ $i -gt 600 ]; do i=$((i + 1)); sleep 0.1; done
    touch /tmp/ib-fault
    sleep 2
    touch /tmp/sync/go-10
    wait $R
    rc=$?
else
    $COLL --uid "$UID2" --mode small --iters 40 >/tmp/coll2 2>&1
    rc=$?
fi
say "coll2 rc=$rc $(grep -h -m1 COLLD_ERR /tmp/coll2) $(grep -m1 'IB link' /tmp/colld.log)"

# 3. IB negotiated again on the next connection: exact again
UID3=$(uid_for 3)
$COLL --uid "$UID3" --kinds allreduce --dtypes float32 --exact-values --no-big >/tmp/coll3 2>&1
say "coll3 rc=$? $(tail -1 /tmp/coll3)"
say "transport-after $(status_line) "

# 4. guest 2's daemon killed: guest 1 reports the peer lost
if [ $N = 2 ]; then
    fetch kill >/dev/null
    kill -9 $COLLD
    say "colld killed"
    sleep 3 # guest 1 sees the connection reset, then this guest powers off
else
    touch /tmp/www/kill
    i=0
    until collctl --socket $SOCK status 2>/dev/null | grep "guest2" | grep -q " lost "; do
        i=$((i + 1))
        [ $i -gt 150 ] && { say "peer never lost"; collctl --socket $SOCK status; finish; }
        sleep 0.1
    done
    say "peer-lost $(collctl --socket $SOCK status | grep -m1 guest2)"
fi
grep -E "WARN|ERROR" /tmp/colld.log | tail -8 | sed "s/^/SR node$N log /"
finish
