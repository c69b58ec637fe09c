#!/usr/bin/env bash
# Makes the agent's profile again (injector/agent.profdata), which the build uses to lay out the
# agent's code by how often each part runs (see injector/build.rs). The profile comes from the
# benchmarks' own workloads:
# - the tornado web server and the allocation-bound job at the default rate (benches/overhead.py);
# - `--rate 1` through a 30-deep and a 1-deep Python stack (benches/workloads/deep_stack.py), on
#   pyenv's newest 3.11 and 3.12.
# Run it after changing the agent's slow paths: functions changed since the profile was made are
# compiled as without one. Installs what it needs if it is missing (the toolchain's
# llvm-profdata with rustup, tornado with pip); takes about two minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
find_profdata() {
    ls "$(rustc --print sysroot)"/lib/rustlib/*/bin/llvm-profdata 2>/dev/null | head -n 1 || true
}
profdata=$(find_profdata)
if [ -z "$profdata" ] && command -v rustup >/dev/null; then
    rustup component add llvm-tools
    profdata=$(find_profdata)
fi
if [ -z "$profdata" ]; then
    echo "tools/agent-pgo.sh: no llvm-profdata in the toolchain (rustup component add llvm-tools)" >&2
    exit 1
fi
root="${PYENV_ROOT:-$HOME/.pyenv}"
newest() {
    ls -d "$root"/versions/"$1".*/bin/python"$1" 2>/dev/null | sort -t. -k3 -n | tail -n 1
}
py311=$(newest 3.11)
py312=$(newest 3.12)
if [ -z "$py311" ] || [ -z "$py312" ]; then
    echo "tools/agent-pgo.sh: needs pyenv's 3.11 and 3.12 under $root" >&2
    exit 1
fi
if ! "$py311" -c "import tornado" 2>/dev/null; then
    "$py311" -m pip install --quiet --root-user-action=ignore -r benches/requirements.txt
fi
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
export LLVM_PROFILE_FILE="$raw/%p.profraw"
MPROF_AGENT_PGO="generate=$raw" CARGO_TARGET_DIR=target/pgo-generate \
    cargo build --release --quiet --bin mprof
mprof=target/pgo-generate/release/mprof
python3 benches/overhead.py --python "$py311" --mprof "$mprof" --runs 2 \
    --workloads tornado,alloc --configs none,mprof --no-memray
for python in "$py311" "$py312"; do
    for depth in 30 0; do
        "$mprof" record --quiet --rate 1 -o "$raw/capture.mprof" -- \
            "$python" benches/workloads/deep_stack.py 200000 "$depth"
    done
done
count=$(ls "$raw"/*.profraw | wc -l)
if [ "$count" -lt 8 ]; then
    echo "tools/agent-pgo.sh: only $count profiles written, 8 expected" >&2
    exit 1
fi
"$profdata" merge -o injector/agent.profdata "$raw"/*.profraw
echo "injector/agent.profdata from $count processes; rebuild with cargo build --release"
