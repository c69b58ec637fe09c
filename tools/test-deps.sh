#!/usr/bin/env bash
# Installs what the tests use from PyPI. Run before the test command, by .ci/run and by hand
# (README: "Run the whole test suite"); does nothing that is done already.
#
# - tests/requirements.txt (numpy) into pyenv's newest 3.11, the interpreter the numpy test
#   finds it in; says so and skips it when pyenv has no 3.11 (the numpy test then prints
#   SKIPPED).
# - The Python tools of pymprof's wheel (python/requirements-build.txt: maturin, zig,
#   cargo-zigbuild, auditwheel) into a venv of their own, MPROF_PYTOOLS (default
#   ~/.cache/mprof/pytools), where tools/cc-floor.sh finds zig to link the mprof binary
#   against glibc 2.28; and the wheels of python/tests/requirements.txt (pytest) downloaded
#   into its wheels/ folder, which tests/wheel.rs installs into fresh venvs without the
#   network. Made again when either requirements file changes.
set -euo pipefail
cd "$(dirname "$0")/.."
root="${PYENV_ROOT:-$HOME/.pyenv}"
python=$(ls -d "$root"/versions/3.11.*/bin/python3.11 2>/dev/null | sort -t. -k3 -n | tail -n 1)
if [ -z "$python" ]; then
    echo "tools/test-deps.sh: no pyenv 3.11 under $root: numpy not installed" >&2
elif ! "$python" -c "import numpy" 2>/dev/null; then
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
