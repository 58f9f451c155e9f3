#!/usr/bin/env bash
# deploy/npm-deps.sh - install the npm packages deploy/check.sh needs (the Kubernetes schemas and
# a YAML parser) into CACHE (default .cache/deploy-npm, ignored by git), exactly the versions of
# deploy/kubernetes/package-lock.json. `make deps` runs it. Does nothing when CACHE already holds
# that lock file's packages.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${1:-$ROOT/.cache/deploy-npm}
LOCK=$ROOT/deploy/kubernetes/package-lock.json
if [ -d "$CACHE/node_modules" ] && cmp -s "$LOCK" "$CACHE/package-lock.json"; then
    echo "npm-deps: packages present in $CACHE"
    exit 0
fi
if ! command -v npm >/dev/null; then
    echo "npm-deps: npm not found (Debian packages nodejs and npm)" >&2
    exit 1
fi
rm -rf "$CACHE"
mkdir -p "$CACHE"
cp "$ROOT/deploy/kubernetes/package.json" "$LOCK" "$CACHE/"
echo "npm-deps: installing the pinned packages of deploy/kubernetes/package-lock.json into $CACHE"
(cd "$CACHE" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
