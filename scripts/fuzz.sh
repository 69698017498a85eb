#!/usr/bin/env bash
# Builds the fuzz tree (clang, libFuzzer, ASan+UBSan) and runs every
# libFuzzer target of fuzz/: first its whole checked-in corpus once (the
# seeds and the inputs that once crashed it: a regression run), then
# fuzzing for a bounded time from that corpus.
#
#   scripts/fuzz.sh [-s SECONDS] [-o DIR] [-b BUILD] [TARGET...]
#
#   -s SECONDS  fuzzing time per target (default $FUZZ_SECONDS, else 60;
#               0: the regression run only)
#   -o DIR      where crashes and new inputs go (default BUILD/fuzz-out):
#               DIR/TARGET/crash-*, DIR/TARGET/corpus/
#   -b BUILD    the fuzz tree (default build-fuzz)
#   TARGET      proto, store, linker, parse (default: all)
#
# Prints one line per target, "PASS fuzz/T: ..." or "FAIL fuzz/T: ...",
# with its executions; exits non-zero when any failed (a crash, a leak, a
# timeout, or no clang/libFuzzer to build with). A crash is reproduced with
#   BUILD/fuzz/fuzz-T DIR/T/crash-...
# and, once fixed, copied into fuzz/corpus/T/ as crash-<what> so that every
# later run replays it.
set -u
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-60}
out=""
build=build-fuzz
while getopts "s:o:b:" opt; do
    case "$opt" in
    s) seconds=$OPTARG ;;
    o) out=$OPTARG ;;
    b) build=$OPTARG ;;
    *) echo "usage: $0 [-s SECONDS] [-o DIR] [-b BUILD] [TARGET...]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(proto store linker parse)
[ -n "$out" ] || out="$build/fuzz-out"

fail_all() {
    for t in "${targets[@]}"; do
        echo "FAIL fuzz/$t: $1"
    done
    exit 1
}

# The tree: clang with libFuzzer (Debian: clang, libclang-rt-14-dev), no
# tests of its own; optimised (the store's paranoid checks of the debug
# build would take most of the time: the target checks the invariant
# after every step itself).
if [ ! -f "$build/build.ninja" ]; then
    command -v clang >/dev/null || fail_all "clang is not installed (make deps)"
    setup_log=$(mktemp "${TMPDIR:-/tmp}/kvd-fuzz-setup.XXXXXX")
    if ! CC=clang meson setup "$build" --buildtype=debugoptimized -Dfuzz=enabled \
        -Dtests=disabled -Db_sanitize=address,undefined -Db_lundef=false \
        >"$setup_log" 2>&1; then
        tail -5 "$setup_log"
        rm -rf "$build"
        fail_all "meson setup failed: clang or libFuzzer missing? (see $setup_log)"
    fi
    rm -f "$setup_log"
fi
bins=()
for t in "${targets[@]}"; do
    bins+=("fuzz/fuzz-$t")
done
ninja -C "$build" "${bins[@]}" >"$build/fuzz-build.log" 2>&1 ||
    { tail -20 "$build/fuzz-build.log"; fail_all "the fuzz tree does not build"; }

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

failed=0
for t in "${targets[@]}"; do
    bin="$build/fuzz/fuzz-$t"
    seeds="fuzz/corpus/$t"
    dir="$out/$t"
    mkdir -p "$dir/corpus"
    rm -f "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-* # an earlier run's
    log="$dir/log"
    # the regression run: every checked-in input once
    if ! "$bin" -runs=0 -timeout=10 -rss_limit_mb=2048 "$seeds" >"$log" 2>&1; then
        grep -E "ERROR|check failed|SUMMARY|Test unit written" "$log" | head -5
        echo "FAIL fuzz/$t: the checked-in corpus crashes it (see $log)"
        failed=$((failed + 1))
        continue
    fi
    if [ "$seconds" -eq 0 ]; then
        echo "PASS fuzz/$t: corpus of $(ls "$seeds" | wc -l) inputs replayed"
        continue
    fi
    # fuzzing: new inputs go to the scratch corpus (listed first), never
    # into the checked-in one
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$dir/" "$dir/corpus" "$seeds" \
        >>"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    crashes=$(find "$dir" -maxdepth 1 \( -name 'crash-*' -o -name 'leak-*' -o \
        -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
    if [ "$rc" -ne 0 ] || [ "$crashes" -gt 0 ]; then
        grep -E "ERROR|check failed|SUMMARY|Test unit written" "$log" | head -5
        echo "FAIL fuzz/$t: ${execs:-?} executions in ${seconds} s, $crashes crashes in $dir (log $log)"
        failed=$((failed + 1))
    else
        echo "PASS fuzz/$t: ${execs:-?} executions in ${seconds} s, no crash"
    fi
done
[ "$failed" -eq 0 ]
