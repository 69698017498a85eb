#!/usr/bin/env bash
# The device check of issue 13, run THERE (the machine with the GPU), from
# the repository root, by the device tool's command (tests/gpu/README.md):
# the GPU tests on the real CUDA driver (and their fake-runtime variants),
# then the GPU bench for the four layouts, in at most 8 minutes. The tree
# and the libraries come from tests/gpu/prepare-device.sh, run here before.
#
#   tests/gpu/run-on-device.sh
#
# Writes into $OUT (the tool brings back at most 8 files): summary.txt (the
# last lines it prints too), env.txt (GPU, driver, libraries), tests.txt
# (one line per test), tests-log.txt (their output), bench.txt (the bench's
# table), logs.tar.gz (the rest). Exits non-zero when a test failed or the
# bench did not complete. Budget variables (seconds): DEVICE_TEST_S (240),
# DEVICE_BENCH_S (180); DEVICE_BENCH_PAGES (64), DEVICE_BENCH_RUNS (20).
#
# Here, with KVDOCK_CUDA_LIBRARY naming the fake (libfakecuda.so.1), it runs
# end to end on the fake: that is how the script itself is tested.
set -u
cd "$(dirname "$0")/../.."
start=$(date +%s)
OUT=${OUT:-$PWD/build-device/device-out}
mkdir -p "$OUT"
build=build-device
test_s=${DEVICE_TEST_S:-240}
bench_s=${DEVICE_BENCH_S:-180}
pages=${DEVICE_BENCH_PAGES:-64}
runs=${DEVICE_BENCH_RUNS:-20}
suite=${DEVICE_SUITE:-gpu} # another suite: for testing this script
summary=$OUT/summary.txt
work=$(mktemp -d /tmp/kvdock-device.XXXXXX)
say() { echo "$*" | tee -a "$summary"; }
: > "$summary"

if [ ! -f $build/device-root.txt ] || [ ! -d $build/debs ]; then
    say "no prepared $build (device-root.txt, debs/): run tests/gpu/prepare-device.sh first, then carry $build"
    exit 2
fi

# The tree's absolute paths (meson's test list, KVDOCKD in the tests'
# environment, the bench's daemon) name the directory it was built in;
# that path is made to lead here.
root=$(cat $build/device-root.txt)
if [ "$(readlink -f "$root" 2>/dev/null)" != "$(readlink -f "$PWD")" ]; then
    if [ -e "$root" ] || [ -L "$root" ]; then
        say "$root exists here and is not this checkout: the tree's absolute paths lead there"
    else
        mkdir -p "$(dirname "$root")" && ln -s "$PWD" "$root" &&
            say "linked $root -> $PWD (the tree's absolute paths)"
    fi
fi

# The Debian libraries, unpacked into a prefix of their own (never into /,
# where they would replace the machine's).
prefix=$work/prefix
mkdir -p "$prefix"
for deb in $build/debs/*.deb; do
    if command -v dpkg >/dev/null; then
        dpkg -x "$deb" "$prefix"
    else
        # no dpkg: a .deb is an ar archive whose data.tar.xz holds the files
        python3 - "$deb" "$prefix" <<'PY'
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
pos = 8  # "!<arch>\n", then 60-byte headers: name 16, size at 48..58
while pos + 60 <= len(data):
    name = data[pos:pos + 16].decode().strip().rstrip("/")
    size = int(data[pos + 48:pos + 58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    if name.startswith("data.tar"):
        tarfile.open(fileobj=io.BytesIO(body), mode="r:*").extractall(sys.argv[2])
        sys.exit(0)
    pos += 60 + size + (size & 1)
sys.exit("no data.tar in " + sys.argv[1])
PY
    fi || say "cannot unpack $deb"
done
libdirs=$prefix/usr/lib/x86_64-linux-gnu:$prefix/lib/x86_64-linux-gnu
# UCX looks for its transport modules beside its own library by default,
# as installed: here they are in the prefix
ucx_mods=$prefix/usr/lib/x86_64-linux-gnu/ucx

# The real driver: libkvdock dlopens libcuda.so.1 by name. Where the
# loader's cache does not have it (a driver mounted outside the standard
# directories), its directory goes last in the search path.
real_cuda=""
if [ -z "${KVDOCK_CUDA_LIBRARY:-}" ]; then
    if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
        for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu \
            /usr/lib64; do
            if [ -e "$d/libcuda.so.1" ]; then
                real_cuda=$d
                break
            fi
        done
    fi
    [ -n "$real_cuda" ] && libdirs=$libdirs:$real_cuda
fi
libpath=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
run_env=(env LD_LIBRARY_PATH="$libpath" UCX_MODULE_DIR="$ucx_mods")

{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -a)"
    echo "checkout: $PWD (built at $root, meson $(cat $build/device-meson-version.txt 2>/dev/null))"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "KVDOCK_CUDA_LIBRARY: ${KVDOCK_CUDA_LIBRARY:-(unset: the real libcuda.so.1)}"
    echo "libcuda.so.1 from: ${real_cuda:-the loader cache} $(ldconfig -p 2>/dev/null | grep 'libcuda\.so\.1 ' | head -1)"
    echo "LD_LIBRARY_PATH for the tests: $libpath"
    echo "meson here: $(meson --version 2>/dev/null || echo none)"
    echo "--- nvidia-smi"
    nvidia-smi 2>&1 | head -20 || echo "no nvidia-smi"
    nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,memory.total --format=csv 2>&1 || true
    echo "--- packages carried"
    cat $build/debs/MANIFEST 2>/dev/null
    echo "--- ldd of kvdockd, libkvdock, kvdock-bench (with the carried libraries)"
    for f in $build/daemon/kvdockd $build/linker/libkvdock.so $build/bench/kvdock-bench; do
        echo "$f:"
        "${run_env[@]}" ldd "$f" 2>&1
    done
    echo "--- io_uring, /dev/shm"
    ls -ld /dev/shm 2>&1
    df -h /dev/shm 2>&1 | tail -1
} > "$OUT/env.txt" 2>&1
if "${run_env[@]}" ldd $build/daemon/kvdockd $build/bench/kvdock-bench 2>&1 | grep -q 'not found'; then
    say "libraries missing (env.txt):"
    "${run_env[@]}" ldd $build/daemon/kvdockd $build/bench/kvdock-bench 2>&1 | grep 'not found' |
        sort -u | tee -a "$summary"
fi

# --- the GPU tests: the suite gpu, KVDOCK_CUDA_LIBRARY as this script got
# it (unset on the device: the real driver). meson defines the CUDA tests on
# the fake (they set KVDOCK_CUDA_LIBRARY in their own environment): those
# run as defined, and again without the fake as NAME-real (run_tests.py
# --real-variants). meson test itself cannot run them there: that meson is
# another version than the one that configured the tree, and refuses it;
# run_tests.py runs meson's test list (meson-info/intro-tests.json) as
# `meson test --no-rebuild --suite gpu` would.
tests_rc=0
say "== GPU tests (suite $suite, at most ${test_s} s)"
timeout -k 10 $((test_s + 5)) python3 tests/gpu/run_tests.py $build --suite "$suite" \
    --real-variants --deadline "$test_s" --log "$OUT/tests-log.txt" \
    --env LD_LIBRARY_PATH="$libpath" --env UCX_MODULE_DIR="$ucx_mods" \
    > "$OUT/tests.txt" 2>&1 || tests_rc=$?
# one line per test, and the counts
tail -n 60 "$OUT/tests.txt" | tee -a "$summary"
say "tests: exit $tests_rc"

# --- the bench: --memory cuda for the four layouts, bytes verified after
# every load; its own timeout inside what the tests left of the 8 minutes.
left=$((480 - 30 - ($(date +%s) - start)))
[ "$left" -lt "$bench_s" ] && bench_s=$left
bench_rc=0
if [ "$bench_s" -lt 30 ]; then
    say "== bench: skipped, ${left} s left of the 8 minutes"
    bench_rc=1
else
    # the daemon's pool lives in /dev/shm: 3 GiB, or half of what a smaller
    # /dev/shm has free
    pool=3G
    shm_free=$(df -B1M --output=avail /dev/shm 2>/dev/null | tail -1 | tr -d ' ')
    if [ -n "$shm_free" ] && [ "$shm_free" -lt 6144 ]; then
        pool=$((shm_free / 2))M
    fi
    say "== bench: kvdock-bench linker --memory cuda, $pages pages, $runs runs, pool $pool (at most ${bench_s} s)"
    "${run_env[@]}" timeout -k 10 "$bench_s" $build/bench/kvdock-bench linker \
        --kvdockd $build/daemon/kvdockd --memory cuda --pages "$pages" --runs "$runs" \
        --pool "$pool" \
        --layouts mha,mla,hybrid,scattered > "$OUT/bench.txt" 2>&1 || bench_rc=$?
    # the table (the linker's info lines stay in bench.txt)
    grep -v " info " "$OUT/bench.txt" | tee -a "$summary"
fi
say "bench: exit $bench_rc"

# the rest in one file: the tree's record of what was built, for the notes
tar -czf "$OUT/logs.tar.gz" -C "$PWD" $build/meson-info $build/meson-logs \
    $build/debs/MANIFEST 2>/dev/null || true
rm -rf "$work"
say "device check: tests exit $tests_rc, bench exit $bench_rc, $(($(date +%s) - start)) s"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
