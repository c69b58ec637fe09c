#!/usr/bin/env bash
# Prints where the test collector (this folder's Go program) is built: a folder of the cache
# named by the hash of its sources (go.mod, go.sum, *.go), so that changing them means a new
# build. tools/test-deps.sh builds it there; tests/common/otelcol.rs runs this script to find it.
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")"
hash=$(cat go.mod go.sum ./*.go | sha256sum | cut -c1-16)
echo "${XDG_CACHE_HOME:-$HOME/.cache}/mprof/otelcol/$hash/otelcol"
