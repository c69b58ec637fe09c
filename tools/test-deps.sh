#!/usr/bin/env bash
# Prepares every tool the tests call, before they start, so that no test pays for a first use
# (docs/testing.md). Run by .ci/run and by hand before the full tier (README: "The two
# commands"). Does nothing for what is already there.
#   - numpy, pyarrow and pandas (tests/requirements.txt) into pyenv's newest 3.11, the
#     interpreter the tests that use them find them in;
#   - the Python tools of pymprof's wheel (python/requirements-build.txt: maturin, zig,
#     cargo-zigbuild, auditwheel) into a venv of their own, MPROF_PYTOOLS (default
#     ~/.cache/mprof/pytools), where tools/cc-floor.sh finds zig to link the mprof binary
#     against glibc 2.28; and the wheels of python/tests/requirements.txt (pytest) downloaded
#     into its wheels/ folder, which tests/wheel.rs installs into fresh venvs without the
#     network. Made again when either requirements file changes;
#   - the npm packages of tests/js, from their lockfile (`npm ci`), when npm is installed;
#   - `go tool pprof`, which Go builds on its first call (seconds when idle, over 300 s on a
#     loaded fresh machine: a test must not time out on it), when Go is installed;
#   - the OpenTelemetry Collector the OTLP tests send profiles to (tools/otelcol, Go modules
#     pinned by its go.sum), built when Go is installed into the cache folder that
#     tools/otelcol/path.sh names by the hash of its sources (2.5-3.5 minutes on a fresh,
#     loaded 2-core machine: downloading the modules and compiling; nothing once built).
# The Debian packages (tmux, gdb, chromium, node, npm, Go, script) are .ci/run's to install; a
# tool missing here is said, and its tests print SKIPPED (a failure under MPROF_CI=1).
set -euo pipefail
cd "$(dirname "$0")/.."

root="${PYENV_ROOT:-$HOME/.pyenv}"
python=$(ls -d "$root"/versions/3.11.*/bin/python3.11 2>/dev/null | sort -t. -k3 -n | tail -n 1)
if [ -z "$python" ]; then
    echo "tools/test-deps.sh: no pyenv 3.11 under $root: numpy not installed" >&2
elif ! "$python" -c "import numpy, pyarrow, pandas" 2>/dev/null; then
    "$python" -m pip install --quiet --root-user-action=ignore -r tests/requirements.txt
fi

tools="${MPROF_PYTOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/mprof/pytools}"
want=$(cat python/requirements-build.txt python/tests/requirements.txt | sha256sum | cut -c1-16)
if [ "$(cat "$tools/.made-from" 2>/dev/null)" != "$want" ]; then
    builder=${python:-$(command -v python3)}
    rm -rf "$tools"
    mkdir -p "$(dirname "$tools")"
    "$builder" -m venv "$tools"
    "$tools/bin/pip" install --quiet --disable-pip-version-check -r python/requirements-build.txt
    for version in 3.8 3.13; do
        "$tools/bin/pip" download --quiet --disable-pip-version-check --only-binary=:all: \
            --python-version "$version" --dest "$tools/wheels" -r python/tests/requirements.txt
    done
    echo "$want" >"$tools/.made-from"
fi

# The same test as tests/common/tools.rs: installed, and not older than the lockfile.
if command -v npm >/dev/null; then
    installed=tests/js/node_modules/.package-lock.json
    if [ ! -e "$installed" ] || [ tests/js/package-lock.json -nt "$installed" ]; then
        (cd tests/js && npm ci --no-audit --no-fund --loglevel=error)
    fi
else
    echo "tools/test-deps.sh: no npm: the speedscope tests will be skipped" >&2
fi

go=$(command -v go || true)
if [ -z "$go" ] && [ -x /usr/local/go/bin/go ]; then
    go=/usr/local/go/bin/go
fi
if [ -n "$go" ]; then
    # Builds pprof into Go's cache on the first call; later calls find it there.
    "$go" tool pprof -h >/dev/null 2>&1 || {
        echo "tools/test-deps.sh: \`go tool pprof\` does not run" >&2
        exit 1
    }
    otelcol=$(tools/otelcol/path.sh)
    if [ ! -x "$otelcol" ]; then
        # Built beside its final name, then moved there: a binary at that path is whole.
        mkdir -p "$(dirname "$otelcol")"
        (cd tools/otelcol && "$go" build -mod=readonly -trimpath -ldflags="-s -w" \
            -o "$otelcol.part" .) || {
            echo "tools/test-deps.sh: the test collector (tools/otelcol) did not build with" \
                "$("$go" version) (its go.mod names the Go it needs)" >&2
            exit 1
        }
        mv "$otelcol.part" "$otelcol"
    fi
else
    echo "tools/test-deps.sh: no Go: the go tool pprof and OTLP collector tests will be skipped" >&2
fi
