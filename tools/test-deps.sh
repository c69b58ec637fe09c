#!/usr/bin/env bash
# Installs the Python packages the tests use (tests/requirements.txt) into pyenv's newest 3.11,
# the interpreter the numpy test finds them in. Run before the test command, by .ci/run and by
# hand (README: "Run the whole test suite"). Does nothing when they are already there; says so
# and stops when pyenv has no 3.11 (the numpy test then prints SKIPPED).
set -euo pipefail
cd "$(dirname "$0")/.."
root="${PYENV_ROOT:-$HOME/.pyenv}"
python=$(ls -d "$root"/versions/3.11.*/bin/python3.11 2>/dev/null | sort -t. -k3 -n | tail -n 1)
if [ -z "$python" ]; then
    echo "tools/test-deps.sh: no pyenv 3.11 under $root: nothing installed" >&2
    exit 0
fi
if "$python" -c "import numpy" 2>/dev/null; then
    exit 0
fi
"$python" -m pip install --quiet --root-user-action=ignore -r tests/requirements.txt
