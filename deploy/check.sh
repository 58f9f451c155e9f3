#!/usr/bin/env bash
# deploy/check.sh - validate everything in deploy/ and the conventions operators rely on:
#
#   systemd      the unit (systemd-analyze verify, no warning allowed) and the sysusers file
#   config       deploy/systemd/colld.conf is exactly what `colld --print-config` prints for the
#                settings below, and loads back to itself
#   kubernetes   the Kustomize base and overlays, the client pod and the PodMonitor against the
#                Kubernetes schemas (deploy/kubernetes/validate.py), colld's options included; the
#                PodMonitor against cloudcoil-models-prometheus-operator 0.80.1.0's models
#                (prometheus-operator v0.80.1)
#   prometheus   the alert rules (promtool check + unit tests) and both scrape configurations
#   daemon       a real colld: --version of the three programs, /healthz and /readyz on --health
#                and --metrics, /metrics,
#                schema_version in collctl's JSON, status --watch, drain on SIGTERM
#   grafana      the dashboard parses, its queries are valid PromQL (promtool) and every metric
#                it or the alert rules use is one the daemon exports (deploy/grafana/check.py)
#   man          the generated man pages format without a groff warning
#   completion   bash completion offers colld's options and collctl's commands
#
# kubernetes-selftest and grafana-selftest then feed the two validators broken copies of the real
# files, one fault each (a schema type error, an unknown field, ...): each must be rejected with
# its message, so a validator that stopped checking something cannot pass unnoticed.
#
# usage: deploy/check.sh [--build DIR] [--update]
#   --build DIR  the CMake build directory (default: build)
#   --update     rewrite deploy/systemd/colld.conf from the daemon instead of comparing
#
# CTest runs it as the test deploy_check (label deploy), so `make test` and CI run it. The tools
# come from `make deps`: Debian's systemd, prometheus, help2man and groff-base, and the project's
# Python environment .venv (requirements.txt: kubernetes-validate with its schemas, jsonschema,
# PyYAML, cloudcoil-models-prometheus-operator with its pydantic models), whose python runs the
# two validators; COLLD_PYTHON names another python that has those packages. A missing tool
# fails the check when CI=true and skips it otherwise. Prints one line per check and a summary
# "N passed, N failed, N skipped"; exits 1 on a failure, 77 when everything was skipped.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=build
UPDATE=0
while [ $# -gt 0 ]; do
    case $1 in
    --build) BUILD=$2; shift 2 ;;
    --update) UPDATE=1; shift ;;
    *) echo "usage: $0 [--build DIR] [--update]" >&2; exit 2 ;;
    esac
done
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
COLLD=$BUILD/server/colld
COLLCTL=$BUILD/tools/collctl
PERF=$BUILD/tools/colld-perf
MANDIR=$BUILD/deploy/man
PYTHON=${COLLD_PYTHON:-$ROOT/.venv/bin/python}
# The settings of the sample configuration (deploy/systemd/colld.conf); the rest are defaults.
SAMPLE_ARGS=(--socket /run/colld/colld.sock --socket-mode 0660 --metrics 127.0.0.1:9464 --drain-timeout-ms 600000)

TMP=$(mktemp -d /tmp/colld-deploy-check.XXXXXX)
DAEMON_PID=
cleanup() {
    if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        kill -KILL "$DAEMON_PID" 2>/dev/null
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT

passed=0 failed=0 skipped=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
# A tool is missing: a failure in CI, a skip elsewhere.
missing() {
    if [ "${CI:-}" = true ]; then
        fail "$1" "$2 (CI must run every check: make deps installs it)"
    else
        echo "SKIP $1: $2 (make deps installs it)"
        skipped=$((skipped + 1))
    fi
}
have() { command -v "$1" >/dev/null 2>&1; }

for bin in "$COLLD" "$COLLCTL" "$PERF"; do
    if [ ! -x "$bin" ]; then
        echo "deploy/check.sh: $bin is not built (cmake --build $BUILD)" >&2
        exit 1
    fi
done
VERSION=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$BUILD/CMakeCache.txt")

# ------------------------------------------------------------------------------------------------
check_systemd() {
    if ! have systemd-analyze || ! have systemd-sysusers; then
        missing systemd "systemd-analyze/systemd-sysusers not found"
        return
    fi
    # verify checks that ExecStart exists and that Documentation= man pages resolve: point both
    # at this build.
    # Without man pages in this build (no help2man when it was configured) the man check says
    # so; here the Documentation= lines are then not looked up.
    local dir=$TMP/systemd out man=yes
    mkdir -p "$dir/man/man8" "$dir/root/etc"
    cp "$MANDIR"/man8/*.8 "$dir/man/man8/" 2>/dev/null || man=no
    sed "s|/usr/sbin/colld|$COLLD|" "$ROOT/deploy/systemd/colld.service" >"$dir/colld.service"
    out=$(MANPATH=$dir/man systemd-analyze verify --man=$man "$dir/colld.service" 2>&1)
    if [ $? -ne 0 ] || [ -n "$out" ]; then
        fail systemd-unit "systemd-analyze verify: $out"
    else
        pass systemd-unit
    fi
    out=$(systemd-sysusers --root="$dir/root" "$ROOT/deploy/systemd/colld.sysusers" 2>&1)
    if [ $? -ne 0 ] || ! grep -q '^colld:x:[0-9]*:[0-9]*:.*:/usr/sbin/nologin$' "$dir/root/etc/passwd" ||
        ! grep -q '^colld:x:' "$dir/root/etc/group"; then
        fail systemd-sysusers "$out"
    else
        pass systemd-sysusers
    fi
}

# ------------------------------------------------------------------------------------------------
check_config() {
    local sample=$ROOT/deploy/systemd/colld.conf
    "$COLLD" "${SAMPLE_ARGS[@]}" --print-config >"$TMP/colld.conf" 2>"$TMP/conf.err" || {
        fail config "colld --print-config: $(cat "$TMP/conf.err")"
        return
    }
    if [ $UPDATE = 1 ]; then
        cp "$TMP/colld.conf" "$sample"
        echo "updated $sample"
    fi
    if ! diff -u "$sample" "$TMP/colld.conf" >"$TMP/conf.diff"; then
        fail config "deploy/systemd/colld.conf differs from colld --print-config (deploy/check.sh --update rewrites it):
$(cat "$TMP/conf.diff")"
        return
    fi
    # It loads, and gives the same configuration back.
    if ! "$COLLD" --config "$sample" --print-config >"$TMP/colld2.conf" 2>"$TMP/conf.err" ||
        ! diff -u "$sample" "$TMP/colld2.conf" >"$TMP/conf.diff"; then
        fail config "colld --config colld.conf does not load back to itself: $(cat "$TMP/conf.err" "$TMP/conf.diff")"
        return
    fi
    pass config
}

# ------------------------------------------------------------------------------------------------
check_kubernetes() {
    if [ ! -x "$PYTHON" ]; then
        missing kubernetes "no $PYTHON (the project's Python environment; COLLD_PYTHON names another)"
        return
    fi
    if ! "$PYTHON" -c 'import kubernetes_validate, jsonschema, referencing, yaml' 2>/dev/null; then
        missing kubernetes "$PYTHON lacks the packages of requirements.txt (kubernetes-validate, jsonschema, PyYAML)"
        return
    fi
    # The PodMonitor's schema comes from it (validate.py imports it when it meets the PodMonitor).
    if ! "$PYTHON" -c 'import cloudcoil.models.prometheus_operator.v1' 2>/dev/null; then
        missing kubernetes "$PYTHON lacks cloudcoil-models-prometheus-operator (requirements.txt pins 0.80.1.0), the PodMonitor's schema"
        return
    fi
    local k=$ROOT/deploy/kubernetes out
    "$COLLD" --help >"$TMP/colld-help.txt"
    if out=$("$PYTHON" "$k/validate.py" --colld-help "$TMP/colld-help.txt" "$k/base" \
        "$k/overlays/gpu" "$k/overlays/rdma" "$k/examples/client-pod.yaml" "$k/monitoring/podmonitor.yaml" 2>&1); then
        pass "kubernetes ($out)"
    else
        fail kubernetes "$out"
    fi
    selftest_kubernetes
}

# ------------------------------------------------------------------------------------------------
# The self-tests: broken copies of the real files in $TMP/broken, one fault each, and the message
# each must be rejected with. broken NAME SOURCE SED-SCRIPT MESSAGE writes one; a SED-SCRIPT that
# no longer changes its source (the file was edited) is itself a failure.
BROKEN_NAMES=() BROKEN_MESSAGES=() BROKEN_ERRORS=""
broken() {
    mkdir -p "$(dirname "$TMP/broken/$1")"
    sed "$3" "$2" >"$TMP/broken/$1"
    if cmp -s "$2" "$TMP/broken/$1"; then
        BROKEN_ERRORS="$BROKEN_ERRORS; the edit of $1 ($3) changes nothing in $2: update the self-test"
    fi
    BROKEN_NAMES+=("$1")
    BROKEN_MESSAGES+=("$4")
}

# Every broken file named since the last call must have exactly one problem line in $2 (the
# validator's output), which contains its message; $1 names the test.
broken_verdict() {
    local test=$1 out=$2 i lines bad=$BROKEN_ERRORS
    for i in "${!BROKEN_NAMES[@]}"; do
        lines=$(grep -F -- "$TMP/broken/${BROKEN_NAMES[$i]}:" <<<"$out")
        if [ -z "$lines" ]; then
            bad="$bad; ${BROKEN_NAMES[$i]} was not rejected (expected: ${BROKEN_MESSAGES[$i]})"
        elif [ "$(wc -l <<<"$lines")" != 1 ] || ! grep -qF -- "${BROKEN_MESSAGES[$i]}" <<<"$lines"; then
            bad="$bad; ${BROKEN_NAMES[$i]}: expected the one problem '${BROKEN_MESSAGES[$i]}', got: $lines"
        fi
    done
    if [ -n "$bad" ]; then
        fail "$test" "${bad#; }"
    else
        pass "$test (${#BROKEN_NAMES[@]} broken inputs rejected)"
    fi
    BROKEN_NAMES=() BROKEN_MESSAGES=() BROKEN_ERRORS=""
}

# shellcheck disable=SC2016 # the $(...) and $a below are sed's and the manifest's, not the shell's
selftest_kubernetes() {
    local k=$ROOT/deploy/kubernetes ds=$ROOT/deploy/kubernetes/base/daemonset.yaml out rc=0
    local pm=$ROOT/deploy/kubernetes/monitoring/podmonitor.yaml
    broken type.yaml "$ds" 's/terminationGracePeriodSeconds: 660/terminationGracePeriodSeconds: "660"/' \
        "/spec/template/spec/terminationGracePeriodSeconds '660' is not of type 'integer'"
    broken unknown-field.yaml "$ds" 's/hostIPC: false/hostIPc: false/' "unknown field /spec/template/spec/hostIPc"
    broken undefined-var.yaml "$ds" 's/=$(NODE_NAME)$/=$(NODE_NAMES)/' \
        "'--node-name=\$(NODE_NAMES)' uses \$(NODE_NAMES), which env does not define"
    broken probe-port.yaml "$ds" '/readinessProbe:/,/port:/s/port: health/port: healthz/' \
        "readinessProbe uses port 'healthz', which is not declared"
    broken volume.yaml "$ds" 's/^            - name: cluster-secret$/            - name: cluster-secrets/' \
        "volumeMount 'cluster-secrets' names no volume"
    broken colld-option.yaml "$ds" 's/--drain-timeout-ms=/--drain-timeout=/' \
        "--drain-timeout is not an option of colld (colld --help)"
    cp "$k/base/namespace.yaml" "$k/base/daemonset.yaml" "$TMP/broken/"
    broken kustomize/kustomization.yaml "$k/base/kustomization.yaml" \
        's|^  - namespace.yaml|  - ../namespace.yaml|; s|^  - daemonset.yaml|  - ../daemonset.yaml|; $a commonLabels: {team: ml}' \
        "field 'commonLabels' is not one this builder implements"
    broken podmonitor-type.yaml "$pm" 's/interval: 15s/interval: 15 seconds/' \
        "/spec/podMetricsEndpoints/0/interval '15 seconds' does not match"
    broken podmonitor-field.yaml "$pm" 's|path: /metrics|paht: /metrics|' "unknown field /spec/podMetricsEndpoints/0/paht"
    local inputs=() name
    for name in "${BROKEN_NAMES[@]}"; do
        case $name in */kustomization.yaml) inputs+=("$TMP/broken/${name%/*}") ;; *) inputs+=("$TMP/broken/$name") ;; esac
    done
    out=$("$PYTHON" "$k/validate.py" --colld-help "$TMP/colld-help.txt" "${inputs[@]}" 2>&1) || rc=$?
    [ $rc = 1 ] || BROKEN_ERRORS="$BROKEN_ERRORS; validate.py exited $rc on the broken inputs, not 1"
    broken_verdict kubernetes-selftest "$out"
}

# ------------------------------------------------------------------------------------------------
check_prometheus() {
    if ! have promtool; then
        missing prometheus "promtool not found (Debian package prometheus)"
        return
    fi
    local p=$ROOT/deploy/prometheus out
    if out=$(cd "$p" && promtool check rules colld-rules.yml 2>&1 && promtool test rules colld-rules.test.yml 2>&1); then
        pass prometheus-rules
    else
        fail prometheus-rules "$out"
    fi
    # The configurations read colld-rules.yml relative to themselves.
    cp "$p/colld-rules.yml" "$p/scrape-static.yml" "$TMP/"
    if out=$(promtool check config "$TMP/scrape-static.yml" 2>&1); then
        pass prometheus-scrape-static
    else
        fail prometheus-scrape-static "$out"
    fi
    # Debian's promtool is built without Kubernetes service discovery: there the job is checked
    # with a static target in its place (the relabelling and everything else as written).
    cp "$p/scrape-kubernetes.yml" "$TMP/"
    out=$(promtool check config "$TMP/scrape-kubernetes.yml" 2>&1)
    if [ $? -ne 0 ] && grep -q "field kubernetes_sd_configs not found" <<<"$out"; then
        awk '/kubernetes_sd_configs:/ { print "    static_configs:"; print "      - targets: [\"node:9464\"]"; skip = 1; next }
             skip && /^    [a-z]/ { skip = 0 } !skip' "$p/scrape-kubernetes.yml" >"$TMP/scrape-kubernetes.yml"
        out=$(promtool check config "$TMP/scrape-kubernetes.yml" 2>&1)
    fi
    if [ $? -eq 0 ]; then
        pass prometheus-scrape-kubernetes
    else
        fail prometheus-scrape-kubernetes "$out"
    fi
}

# ------------------------------------------------------------------------------------------------
# GET path from 127.0.0.1:port with bash's /dev/tcp (no curl needed); the response into a file.
http_get() {
    local port=$1 path=$2 out=$3
    (
        exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
        printf 'GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' "$path" >&3
        timeout 10 cat <&3 >"$out"
    )
}

check_daemon() {
    local v
    for prog in "$COLLD" "$COLLCTL" "$PERF"; do
        v=$("$prog" --version 2>&1)
        if [ "$v" != "$(basename "$prog") $VERSION" ]; then
            fail version "$prog --version printed '$v', expected '$(basename "$prog") $VERSION'"
            return
        fi
    done
    pass "version ($VERSION)"

    local sock=$TMP/d/colld.sock port hport
    mkdir -p "$TMP/d"
    "$COLLD" --socket "$sock" --metrics 127.0.0.1:0 --health 127.0.0.1:0 --drain-timeout-ms 20000 2>"$TMP/d/log" &
    DAEMON_PID=$!
    for _ in $(seq 100); do
        grep -q "health on http://" "$TMP/d/log" && break
        sleep 0.1
    done
    port=$(sed -n 's|.*metrics on http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' "$TMP/d/log")
    hport=$(sed -n 's|.*health on http://127.0.0.1:\([0-9]*\)/healthz.*|\1|p' "$TMP/d/log")
    if [ -z "$port" ] || [ -z "$hport" ]; then
        fail daemon "colld did not start: $(cat "$TMP/d/log")"
        return
    fi
    # The probes of the DaemonSet go to --health; the metrics port answers them too.
    local p bad_health=""
    for p in "$hport" "$port"; do
        http_get "$p" /healthz "$TMP/healthz"
        http_get "$p" /readyz "$TMP/readyz"
        if ! head -1 "$TMP/healthz" | grep -q "^HTTP/1.1 200" || ! tail -1 "$TMP/healthz" | grep -qx "ok"; then
            bad_health="port $p /healthz: $(cat "$TMP/healthz")"
        elif ! head -1 "$TMP/readyz" | grep -q "^HTTP/1.1 200" || ! tail -1 "$TMP/readyz" | grep -qx "ready"; then
            bad_health="port $p /readyz: $(cat "$TMP/readyz")"
        fi
    done
    http_get "$hport" /metrics "$TMP/health-metrics"
    head -1 "$TMP/health-metrics" | grep -q "^HTTP/1.1 404" ||
        bad_health="the health port answered /metrics: $(head -1 "$TMP/health-metrics")"
    if [ -n "$bad_health" ]; then
        fail healthz "$bad_health"
    else
        pass "healthz+readyz (--health and --metrics)"
    fi
    http_get "$port" /metrics "$TMP/metrics.http"
    sed '1,/^\r$/d' "$TMP/metrics.http" >"$TMP/metrics.txt"
    if ! grep -q '^colld_build_info' "$TMP/metrics.txt"; then
        fail metrics "no colld_build_info in /metrics: $(head -5 "$TMP/metrics.http")"
    fi

    # Every --json output of collctl carries schema_version; status --watch repeats the status.
    local bad=""
    for cmd in "status" "policy" "events --backlog 1"; do
        # shellcheck disable=SC2086
        "$COLLCTL" --socket "$sock" --json $cmd >"$TMP/json" 2>&1 || bad="$bad; collctl --json $cmd failed: $(cat "$TMP/json")"
        while read -r line; do
            [[ $line == '{"schema_version":1,'* ]] || bad="$bad; collctl --json $cmd printed: ${line:0:80}"
        done <"$TMP/json"
    done
    "$COLLCTL" --socket "$sock" --json status --watch --interval 1 --count 2 >"$TMP/watch" 2>&1 ||
        bad="$bad; status --watch failed: $(cat "$TMP/watch")"
    [ "$(grep -c '^{"schema_version":1,"daemon_version"' "$TMP/watch")" = 2 ] ||
        bad="$bad; status --watch --count 2 printed: $(cat "$TMP/watch")"
    if [ -n "$bad" ]; then fail collctl-json "${bad#; }"; else pass "collctl-json+watch"; fi

    # SIGTERM drains (nothing runs, so it stops at once) and the daemon exits 0.
    kill -TERM "$DAEMON_PID"
    local rc=0
    wait "$DAEMON_PID" || rc=$?
    DAEMON_PID=
    if [ $rc -ne 0 ] || ! grep -q "drain: no communicator left, stopping" "$TMP/d/log"; then
        fail drain "exit $rc: $(cat "$TMP/d/log")"
    else
        pass drain-on-sigterm
    fi
}

# ------------------------------------------------------------------------------------------------
check_grafana() {
    # check.py needs only Python's standard library: any python3 runs it.
    local py=$PYTHON
    [ -x "$py" ] || py=$(command -v python3) || {
        missing grafana "no $PYTHON and no python3"
        return
    }
    if [ ! -s "$TMP/metrics.txt" ]; then
        fail grafana "no scrape of the daemon to compare with (the daemon check failed)"
        return
    fi
    local g=$ROOT/deploy/grafana rules=$ROOT/deploy/prometheus/colld-rules.yml out syntax
    if ! out=$("$py" "$g/check.py" "$g/colld.json" "$rules" "$TMP/metrics.txt" "$TMP/dashboard-rules.yml" 2>&1); then
        fail grafana "$out"
    elif ! have promtool; then
        missing grafana-promql "promtool not found"
        pass "grafana ($out)"
    elif ! syntax=$(promtool check rules "$TMP/dashboard-rules.yml" 2>&1); then
        fail grafana "a dashboard query is not valid PromQL: $syntax"
    else
        pass "grafana ($out)"
    fi
    selftest_grafana "$py"
}

selftest_grafana() {
    local py=$1 g=$ROOT/deploy/grafana rules=$ROOT/deploy/prometheus/colld-rules.yml out out2 rc=0 rc2=0
    broken duplicate-id.json "$g/colld.json" '0,/"id": 2$/s//"id": 1/' "panel id 1 used twice"
    broken unknown-metric.json "$g/colld.json" 's/(colld_draining{/(colld_drainig{/' \
        "'colld_drainig' is not a metric colld exports"
    broken unknown-metric-rules.yml "$rules" 's/expr: colld_draining == 1/expr: colld_drained == 1/' \
        "'colld_drained' is not a metric colld exports"
    out=$("$py" "$g/check.py" "$TMP/broken/duplicate-id.json" "$rules" "$TMP/metrics.txt" "$TMP/broken/out.yml" 2>&1) || rc=$?
    out2=$("$py" "$g/check.py" "$TMP/broken/unknown-metric.json" "$TMP/broken/unknown-metric-rules.yml" \
        "$TMP/metrics.txt" "$TMP/broken/out.yml" 2>&1) || rc2=$?
    if [ $rc != 1 ] || [ $rc2 != 1 ]; then
        BROKEN_ERRORS="$BROKEN_ERRORS; check.py exited $rc and $rc2 on the broken inputs, not 1"
    fi
    out="$out
$out2"
    broken_verdict grafana-selftest "$out"
}

# ------------------------------------------------------------------------------------------------
check_man() {
    if ! have groff; then
        missing man "groff not found (Debian package groff-base)"
        return
    fi
    local page out bad=""
    if [ ! -s "$MANDIR/man8/colld.8" ] || [ ! -s "$MANDIR/man8/collctl.8" ]; then
        missing man "no man pages in $BUILD: help2man was not found when it was configured (reconfigure after make deps)"
        return
    fi
    for page in colld collctl; do
        out=$(groff -man -ww -z "$MANDIR/man8/$page.8" 2>&1)
        [ -z "$out" ] || bad="$bad; $page.8: $out"
    done
    # Generated from --help: the newest option and command must be there.
    grep -qF 'drain\-timeout\-ms' "$MANDIR/man8/colld.8" 2>/dev/null || bad="$bad; colld.8 lacks the options"
    grep -qF 'status [\-\-watch' "$MANDIR/man8/collctl.8" 2>/dev/null || bad="$bad; collctl.8 lacks the commands"
    if [ -n "$bad" ]; then fail man "${bad#; }"; else pass man; fi
}

# ------------------------------------------------------------------------------------------------
check_completion() {
    local out
    out=$(bash -c '
        source "$1/deploy/bash-completion/colld"
        show() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); "$FN"; echo "${COMPREPLY[*]}"; }
        FN=_colld show "$2" --drain
        FN=_colld show "$2" --log-level ""
        FN=_collctl show "$3" ""
        FN=_collctl show "$3" --socket x policy ""
        FN=_collctl show "$3" status --wa
        FN=_colld show "$4" --vers
    ' _ "$ROOT" "$COLLD" "$COLLCTL" "$PERF" 2>&1)
    local want="--drain-timeout-ms
none error warn info debug trace
abort doctor events peer policy probe status trace
set clear
--watch
--version"
    if [ "$out" = "$want" ]; then pass completion; else fail completion "got:
$out
expected:
$want"; fi
}

check_systemd
check_config
check_kubernetes
check_prometheus
check_daemon
check_grafana
check_man
check_completion

echo "deploy: $passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ] || exit 1
[ $passed -gt 0 ] || exit 77
exit 0
