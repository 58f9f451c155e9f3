#!/usr/bin/env bash
# test_slowlink.sh - a real slow link, named (issue 18 item 1).
#
#   tests/integration/test_slowlink.sh --build DIR
#
# Three hosts in network namespaces (a bridge in a hub namespace, veth pairs, as bench/netns.sh),
# one colld per host. ONE directed link is shaped with tc: host0's traffic to host2 goes through a
# tbf of SLOW_RATE (8 Mbit/s, 1 MB/s), every other link is unshaped (hundreds of MB/s on veth).
# Real multi-node all-reduces then run over every directed link: communicator A places its ranks
# so that its ring is host0 -> host2 -> host1 -> host0, communicator B so that it is host0 ->
# host1 -> host2 -> host0. Then the test asserts, waiting for each condition (never a fixed
# sleep), that
#   - collctl --json status of host0 and host2 names exactly one slow link, host0 -> host2, and
#     host1's names none;
#   - host0 recorded one slow_link event naming it;
#   - host0's Prometheus metrics say colld_peer_link_slow{peer="host2",direction="send"} 1 and
#     no other link is slow;
#   - collctl doctor --local on host0 exits 1 naming "host0 → host2" (text and --json), and on
#     host1 finds no slow link of its own; collctl doctor on host1 (across nodes) shows host0's
#     finding, named [host0];
#   - collctl probe on host0 and on host2 exits 1 naming host0 -> host2 (and only it), and on
#     host1 exits 0;
#   - a collective that finishes while the link is slow notes it in its communicator's flight
#     recorder: collctl trace on host0 shows "slow link: host0 → host2: ..." while communicator C
#     runs over it.
# The ratio is large (1 MB/s against 25) and the rule's margin is 4x, so the verdict does not
# depend on the machine's speed.
#
# Needs root, `ip netns` and `tc` (iproute2): exits 77 saying why otherwise.
set -euo pipefail

build=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    *) echo "usage: $0 --build DIR" >&2; exit 2 ;;
  esac
done
[ -n "$build" ] || { echo "usage: $0 --build DIR" >&2; exit 2; }
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, veth pairs, tc qdiscs)"
command -v ip >/dev/null && command -v tc >/dev/null || skip "needs 'ip' and 'tc' (Debian: iproute2)"
ip netns list >/dev/null 2>&1 || skip "'ip netns' does not work here"
colld="$build/server/colld" collctl="$build/tools/collctl" perf="$build/tools/colld-perf"
for b in "$colld" "$collctl" "$perf"; do [ -x "$b" ] || { echo "FAIL: $b is not built" >&2; exit 1; }; done

SLOW_RATE=8mbit
FAST_RATE=200mbit
tag="sl$$"
run=$(mktemp -d /tmp/colld-slowlink.XXXXXX)
pids=()
cleanup() {
  local p n
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for n in $(ip netns list 2>/dev/null | awk -v t="$tag-" 'index($1, t) == 1 { print $1 }'); do
    ip netns del "$n" 2>/dev/null || true
  done
  rm -rf "$run"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for i in 0 1 2; do
    echo "---- host$i status" >&2
    ip netns exec "$tag-h$i" "$collctl" --socket "$run/h$i.sock" status 2>&1 | sed -n '/^LINKS/,/^$/p' >&2 || true
    echo "---- host$i log (tail)" >&2
    tail -n 15 "$run/h$i.log" >&2 || true
  done
  exit 1
}
ns() { printf '%s-h%d' "$tag" "$1"; }
addr() { printf '10.78.0.%d' $(($1 + 1)); }
on() { local h=$1; shift; ip netns exec "$(ns "$h")" "$@"; } # (not for background processes: $! must be theirs)

# ---- the network: 3 hosts on a bridge, host0 -> host2 shaped ----------------------------------
ip netns add "$tag-hub"
ip -n "$tag-hub" link add br0 type bridge
ip -n "$tag-hub" link set br0 up
for i in 0 1 2; do
  ip netns add "$(ns "$i")"
  ip link add eth0 netns "$(ns "$i")" type veth peer name "vh$i" netns "$tag-hub"
  ip -n "$tag-hub" link set "vh$i" master br0 up
  ip -n "$(ns "$i")" addr add "$(addr "$i")/24" dev eth0
  ip -n "$(ns "$i")" link set eth0 up
  ip -n "$(ns "$i")" link set lo up
done
# Every host's egress is limited to FAST_RATE (25 MB/s) by a tbf, so the healthy links are alike
# whatever the machine (unshaped veth links run at whatever the CPUs allow, several GB/s apart);
# on host0 an htb (classes at 10 Gbit/s, which do not limit) sends packets to host2 through a
# tbf of SLOW_RATE instead: the one slow link. Bursts are above a full-size GSO packet, so such
# packets pass whole. htb rather than prio: some kernels are built without sch_prio.
tc -n "$(ns 0)" qdisc add dev eth0 root handle 1: htb default 10 r2q 100000
tc -n "$(ns 0)" class add dev eth0 parent 1: classid 1:10 htb rate 10gbit
tc -n "$(ns 0)" class add dev eth0 parent 1: classid 1:20 htb rate 10gbit
tc -n "$(ns 0)" qdisc add dev eth0 parent 1:10 handle 10: tbf rate "$FAST_RATE" burst 70000 latency 200ms
tc -n "$(ns 0)" qdisc add dev eth0 parent 1:20 handle 20: tbf rate "$SLOW_RATE" burst 70000 latency 200ms
tc -n "$(ns 0)" filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst "$(addr 2)/32" flowid 1:20
for i in 1 2; do
  tc -n "$(ns "$i")" qdisc add dev eth0 root tbf rate "$FAST_RATE" burst 70000 latency 200ms
done

# ---- the daemons ------------------------------------------------------------------------------
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$run/secret"
chmod 600 "$run/secret"
for i in 0 1 2; do
  ip netns exec "$(ns "$i")" "$colld" --socket "$run/h$i.sock" --listen "$(addr "$i"):7710" --node-name "host$i" \
    --cluster-secret-file "$run/secret" --peers 10.78.0.0/24:7710 --metrics 127.0.0.1:9470 --log-level info \
    --log-file "$run/h$i.log" >/dev/null 2>"$run/h$i.err" &
  pids+=($!)
done
for i in 0 1 2; do
  for _ in $(seq 1 500); do [ -S "$run/h$i.sock" ] && break; sleep 0.01; done
  [ -S "$run/h$i.sock" ] || fail "colld on host$i did not start"
done

# ---- real collectives over every directed link --------------------------------------------------
# run_comm NAME SIZE ITERS HOST-OF-RANK0 HOST-OF-RANK1 HOST-OF-RANK2: one 3-rank all-reduce
# communicator (ring order = the hosts of ranks 0, 1, 2), the unique id made on host0.
run_comm() {
  local name=$1 size=$2 iters=$3 r hex upid
  shift 3
  ip netns exec "$(ns 0)" "$perf" --make-uid --socket "$run/h0.sock" --timeout-ms 60000 >"$run/$name.uid" &
  upid=$!
  pids+=("$upid")
  for _ in $(seq 1 500); do [ -s "$run/$name.uid" ] && break; sleep 0.01; done
  hex=$(cat "$run/$name.uid")
  [ -n "$hex" ] || fail "colld-perf --make-uid gave no id"
  local rp=()
  for r in 0 1 2; do
    local h=${1}
    shift
    ip netns exec "$(ns "$h")" "$perf" --join "$hex" -p 3 --rank "$r" --socket "$run/h$h.sock" -t allreduce -d float -o sum \
      -b "$size" -e "$size" -n "$iters" -w 0 -c 0 -z 1 --timeout-ms 60000 >"$run/$name.rank$r.out" 2>&1 &
    rp+=($!)
  done
  for r in 0 1 2; do
    wait "${rp[$r]}" || { cat "$run/$name.rank$r.out" >&2; fail "communicator $name: rank $r failed"; }
  done
  kill -TERM "$upid" 2>/dev/null || true
  wait "$upid" 2>/dev/null || true
}
t0=$(date +%s)
run_comm A 1M 2 0 2 1 # ring host0 -> host2 -> host1 -> host0: the slow link carries ~2.8 MB
run_comm B 8M 4 0 1 2 # ring host0 -> host1 -> host2 -> host0: the fast reverse directions
echo "collectives done in $(($(date +%s) - t0)) s"

# ---- the verdicts -------------------------------------------------------------------------------
# slow_links HOST: the slow links collctl status names there, "FROM>TO" one per line.
slow_links() {
  on "$1" "$collctl" --socket "$run/h$1.sock" --json status |
    python3 -c 'import json,sys
d = json.load(sys.stdin)
for l in d["slow_links"]: print(l["from"] + ">" + l["to"])'
}
# measured HOST: how many of its 4 directed links have a rate.
measured() {
  on "$1" "$collctl" --socket "$run/h$1.sock" --json status |
    python3 -c 'import json,sys
d = json.load(sys.stdin)
print(sum((p["tx_rate"] > 0) + (p["rx_rate"] > 0) for p in d["peers"]))'
}
# Wait until every host has all 4 of its links measured (the send rates come with the peers'
# heartbeats, within a heartbeat interval or two of the traffic).
for _ in $(seq 1 150); do
  [ "$(measured 0)" = 4 ] && [ "$(measured 1)" = 4 ] && [ "$(measured 2)" = 4 ] && break
  sleep 0.1
done
for i in 0 1 2; do [ "$(measured "$i")" = 4 ] || fail "host$i: only $(measured "$i") of 4 links measured"; done

[ "$(slow_links 0)" = "host0>host2" ] || fail "host0 names slow links '$(slow_links 0)', expected host0>host2"
[ "$(slow_links 2)" = "host0>host2" ] || fail "host2 names slow links '$(slow_links 2)', expected host0>host2"
[ -z "$(slow_links 1)" ] || fail "host1 names slow links '$(slow_links 1)', expected none"
echo "status: host0 and host2 name host0 -> host2, host1 nothing"
on 0 "$collctl" --socket "$run/h0.sock" status | sed -n '/^LINKS/,/^$/p'

# the slow_link event (host0), naming the link
ev=$(on 0 "$collctl" --socket "$run/h0.sock" events)
printf '%s\n' "$ev" | grep slow_link | grep -q "host0 → host2: " || fail "host0 recorded no slow_link event: $ev"
[ "$(printf '%s\n' "$ev" | grep -c slow_link)" = 1 ] || fail "host0 recorded more than one slow_link event: $ev"
echo "events: $(printf '%s\n' "$ev" | grep slow_link)"

# metrics on host0
metrics=$(on 0 python3 -c 'import urllib.request
print(urllib.request.urlopen("http://127.0.0.1:9470/metrics", timeout=5).read().decode())')
slow_lines=$(printf '%s\n' "$metrics" | grep '^colld_peer_link_slow{' | grep ' 1$' || true)
[ "$slow_lines" = 'colld_peer_link_slow{peer="host2",direction="send"} 1' ] ||
  fail "host0 metrics: slow lines '$slow_lines'"
printf '%s\n' "$metrics" | grep -q '^colld_peer_rtt_seconds{peer="host2"}' || fail "host0 metrics: no RTT of host2"
printf '%s\n' "$metrics" | grep -q '^colld_peer_tcp_retransmits_total{peer="host2"}' ||
  fail "host0 metrics: no retransmit counter of host2"
echo "metrics: colld_peer_link_slow names host2/send on host0"

# doctor
set +e
# (--local: each node's own measurements; without it a node's doctor also shows the others')
out=$(on 0 "$collctl" --socket "$run/h0.sock" doctor --local)
rc=$?
set -e
echo "$out"
[ "$rc" = 1 ] || fail "doctor on host0 exited $rc, expected 1"
printf '%s\n' "$out" | grep -q "slow-link  \[host0\] host0 → host2: " || fail "doctor on host0 does not name host0 → host2"
[ "$(printf '%s\n' "$out" | grep -c slow-link)" = 1 ] || fail "doctor on host0 names more than one slow link"
set +e
json=$(on 0 "$collctl" --socket "$run/h0.sock" --json doctor --local)
set -e
printf '%s\n' "$json" | python3 -c 'import json,sys
d = json.load(sys.stdin)
s = [f for f in d["findings"] if f["what"] == "slow-link"]
assert len(s) == 1 and s[0]["severity"] == "problem" and s[0]["node"] == "host0" and s[0]["text"].startswith("host0 \u2192 host2: "), s' ||
  fail "doctor --json on host0 does not name host0 → host2"
set +e
out=$(on 1 "$collctl" --socket "$run/h1.sock" doctor --local)
set -e
printf '%s\n' "$out" | grep -q slow-link && fail "doctor --local on host1 names a slow link: $out"
# across nodes: doctor on host1 shows host0's finding, named as host0's
set +e
out=$(on 1 "$collctl" --socket "$run/h1.sock" doctor)
set -e
printf '%s\n' "$out" | grep -q "slow-link  \[host0\] host0 → host2: " ||
  fail "doctor on host1 does not show host0's slow link host0 → host2: $out"
echo "doctor: names host0 → host2 on host0, nothing of its own on host1, host0's finding from host1"

# probe
if "$collctl" --help 2>&1 | grep -q '^  probe'; then
  # probe_slow HOST: the slow links probe names, "FROM>TO" per line; its exit status in $run/rc
  probe_slow() {
    set +e
    on "$1" "$collctl" --socket "$run/h$1.sock" --json probe --bytes 1M >"$run/probe$1.json"
    echo $? >"$run/rc"
    set -e
    python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))
for l in d["slow_links"]: print(l["from"] + ">" + l["to"])' "$run/probe$1.json"
  }
  for h in 0 2 1; do
    want=host0\>host2
    [ "$h" = 1 ] && want=""
    got=$(probe_slow "$h")
    rc=$(cat "$run/rc")
    [ "$got" = "$want" ] || { cat "$run/probe$h.json" >&2; fail "probe on host$h names '$got', expected '$want'"; }
    [ "$rc" = "$([ -n "$want" ] && echo 1 || echo 0)" ] || fail "probe on host$h exited $rc"
  done
  on 0 "$collctl" --socket "$run/h0.sock" probe --bytes 1M || true
  echo "probe: names host0 -> host2 on host0 and host2, nothing on host1"
fi
# trace: a collective that finishes while the link is slow says so in its communicator's flight
# recorder (collctl trace on host0 names the link), while communicator C runs over it.
(run_comm C 64K 60 0 2 1) &
cpid=$!
found=""
for _ in $(seq 1 300); do
  id=$(on 0 "$collctl" --socket "$run/h0.sock" --json status | python3 -c 'import json,sys
d = json.load(sys.stdin)
print(next((str(c["id"]) for c in d.get("comms", []) if c.get("name") == "colld-perf"), ""))')
  if [ -n "$id" ]; then
    found=$(on 0 "$collctl" --socket "$run/h0.sock" --json trace "$id" 2>/dev/null | python3 -c 'import json,sys
d = json.load(sys.stdin)
print(next((e["note"] for e in d["entries"] if e["note"].startswith("slow link: host0 \u2192 host2: ")), ""))' 2>/dev/null || true)
    [ -n "$found" ] && break
  fi
  sleep 0.1
done
wait "$cpid" || fail "communicator C failed"
[ -n "$found" ] || fail "no collective of communicator C noted the slow link in collctl trace on host0"
echo "trace: $found"

# the daemons stop cleanly (under ASan: no leak, no error report)
for i in 0 1 2; do
  kill -TERM "${pids[$i]}"
  rc=0
  wait "${pids[$i]}" || rc=$?
  [ "$rc" = 0 ] || { cat "$run/h$i.err" >&2; fail "colld on host$i exited $rc"; }
done
pids=()
echo "PASS in $(($(date +%s) - t0)) s"
