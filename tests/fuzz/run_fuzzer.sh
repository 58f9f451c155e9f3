#!/bin/sh
# run_fuzzer.sh FUZZER CORPUS BUILD_DIR SECONDS: one bounded libFuzzer run (the fuzz tests).
# New inputs go to a working corpus in the build tree; the checked-in CORPUS is read, never
# written. A crash, a leak, a time-out of one input (10 s) or an out-of-memory (2 GiB) fails the
# run and leaves the input in BUILD_DIR/artifacts/.
set -eu
fuzzer=$1 corpus=$2 dir=$3 secs=$4
name=$(basename "$fuzzer")
mkdir -p "$dir/work/$name" "$dir/artifacts"
exec "$fuzzer" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/$name-" "$dir/work/$name" "$corpus"
