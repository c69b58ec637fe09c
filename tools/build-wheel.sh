#!/usr/bin/env bash
# Builds pymprof's wheel into DIR (default dist/): `pip install DIR/pymprof-*.whl` then gives
# the mprof command, `python -m pymprof`, pymprof.tracemalloc and the pytest plugin.
#
# maturin (python/pyproject.toml) packages the mprof binary of the release build, which
# carries the agent, with the Python package python/pymprof. Run tools/test-deps.sh first: it
# installs maturin and zig, with which the binary is linked against glibc 2.28 (see
# tools/cc-floor.sh), and maturin refuses a binary that needs a newer glibc than the
# manylinux_2_28 tag says. The release build is the one `cargo build --release` (or the test
# suite) makes: when it is there, nothing is compiled again.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-dist}")
tools="${MPROF_PYTOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/mprof/pytools}"
if [ ! -x "$tools/bin/maturin" ]; then
    echo "tools/build-wheel.sh: no maturin in $tools: run tools/test-deps.sh first" >&2
    exit 2
fi
cd python
exec "$tools/bin/maturin" build --release --compatibility manylinux_2_28 --out "$out"
