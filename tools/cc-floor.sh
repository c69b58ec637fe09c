#!/bin/sh
# The linker of every x86-64 Linux build (.cargo/config.toml; named so that rustc takes it for a
# C compiler). Runs `cc` with rustc's arguments, as cargo would, except for the mprof binary
# itself (target/*/deps/mprof-HASH; its unit tests, named alike, link the test harness and go
# to `cc`, as they read their own build id and debug information): that one is
# linked by zig against glibc 2.28's symbols, so that it loads on glibc 2.28 and older (the
# machine's own glibc makes every reference bind its newest version, 2.34 here). zig comes
# from the Python tools tools/test-deps.sh installs (ziglang and cargo-zigbuild from PyPI, see
# python/requirements-build.txt); where they are missing, the binary is linked by `cc` like the
# rest and tests/wheel.rs says that it misses the floor.
#
# Keeping the linker one fixed path means switching to zig changes no fingerprint: the
# dependencies are never rebuilt for it, only the binary is linked differently (one build
# serves the tests and the wheel).
set -eu
out=
prev=
harness=no
for arg in "$@"; do
    if [ "$prev" = "-o" ]; then out=$arg; fi
    case "$arg" in */libtest-*.rlib) harness=yes ;; esac
    prev=$arg
done
tools="${MPROF_PYTOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/mprof/pytools}"
case "$out:$harness" in
*/deps/mprof-*:no)
    if [ -x "$tools/bin/cargo-zigbuild" ] && [ -x "$tools/bin/python3" ] &&
        [ "${MPROF_LINK_WITH_CC:-0}" != 1 ]; then
        export CARGO_ZIGBUILD_ZIG_COMMAND="$tools/bin/python3"
        export CARGO_ZIGBUILD_ZIG_COMMAND_ARGS="-m ziglang"
        exec "$tools/bin/cargo-zigbuild" zig cc -- -g -fno-sanitize=all \
            -target x86_64-linux-gnu.2.28 -Wl,--build-id "$@"
    fi
    ;;
esac
exec "${MPROF_CC:-cc}" "$@"
