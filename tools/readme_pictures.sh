#!/usr/bin/env bash
# Makes the README's pictures from the quick-start example: the flamegraph of what stays live
# and the timeline, screenshotted by headless Chromium at 1200 px.
# Usage: tools/readme_pictures.sh [PYTHON]   (needs a release build and chromium)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mprof=target/release/mprof
"$mprof" record -q -o "$work/example.mprof" -- "$python" examples/leaky_cache.py >/dev/null
"$mprof" flamegraph "$work/example.mprof" --view live -o "$work/flamegraph.svg"
"$mprof" timeline "$work/example.mprof" -o "$work/timeline.svg"
shoot() {
    chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --hide-scrollbars --user-data-dir="$work/profile" --window-size="$2" \
        --screenshot="$3" "file://$1" 2>/dev/null
}
height=$(grep -o 'height="[0-9]*"' "$work/flamegraph.svg" | head -1 | tr -dc 0-9)
shoot "$work/flamegraph.svg" "1200,$height" docs/images/flamegraph.png
shoot "$work/timeline.svg" 1200,500 docs/images/timeline.png
echo "wrote docs/images/flamegraph.png docs/images/timeline.png"
