#!/usr/bin/env bash
# Prepares the device check (tests/gpu/README.md), HERE, on a machine with
# kvdock's Debian build dependencies (make deps): builds a release tree with
# the tests in build-device/ and downloads, into build-device/debs/, the
# .deb of every library its programs load that is not glibc or the
# compiler's runtime (the device machine has CUDA, PyTorch, meson and ninja
# but none of kvdock's Debian libraries, and no network). Then everything
# the `run` call carries (the working tree and build-device/) must fit the
# device tool's 64 MiB: the total is printed, and the script fails past it.
#
#   tests/gpu/prepare-device.sh [--no-build]
#
# --no-build: only the .debs and the size (the tree is built already).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
build=build-device
limit=$((64 * 1024 * 1024))

if [ "${1:-}" != "--no-build" ]; then
    if [ ! -f $build/build.ninja ]; then
        # no -Werror: at -O3 gcc 12 warns (format-truncation) in test code
        # the debugoptimized trees build clean; the device tree is for running
        meson setup $build --buildtype=release -Dtests=enabled -Dwerror=false
    fi
    ninja -C $build -j "${NINJA_JOBS:-2}"
fi

# Where the tree was built: the device script links this path to its copy
# of the repository, so the absolute paths in the tree (meson's test list,
# the tests' KVDOCKD and friends) resolve there.
echo "$root" > $build/device-root.txt
meson --version > $build/device-meson-version.txt

# Every ELF program and shared library of the tree, the daemon, the CLI,
# libkvdock, the bench and the test programs among them.
mapfile -t elves < <(find $build -path $build/debs -prune -o -type f \
    \( -perm -u+x -o -name '*.so*' \) -print |
    while read -r f; do
        head -c 4 "$f" 2>/dev/null | grep -q $'\x7fELF' && echo "$f"
    done)
echo "ELF files in $build: ${#elves[@]}"

# The libraries they load (ldd: the closure, their own dependencies too),
# then UCX's transport modules (dlopened by UCX, so ldd of our programs
# does not list them) and what they load.
ucx_mods=$(dpkg -L libucx0 2>/dev/null | grep '/ucx/lib.*\.so\.[0-9]*$' || true)
libs=$( { for f in "${elves[@]}" $ucx_mods; do ldd "$f" 2>/dev/null; done; } |
        awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u)
# dpkg -S answers with the path dpkg installed: /lib and /usr/lib are one
# directory on a merged-/usr system, so a path not found is retried
# through the other.
owner() {
    local p=$1 real
    dpkg -S "$p" 2>/dev/null && return
    real=$(readlink -f "$p")
    dpkg -S "$real" 2>/dev/null && return
    case $real in
    /usr/lib/*) dpkg -S "${real#/usr}" 2>/dev/null && return ;;
    /lib/*) dpkg -S "/usr$real" 2>/dev/null && return ;;
    esac
    echo "no-package: $p"
}
# Not carried: glibc (the device's is newer than this Debian's, and a
# program built against an older glibc runs on a newer one; two glibcs
# cannot share a process), and the compiler's runtime (libgcc_s,
# libstdc++), which every Linux with CUDA has, as new as ours or newer.
skip='^(libc6|libgcc-s1|libstdc\+\+6|libc6-dev)$'
# (the tree's own libraries, libkvdock.so, travel with the tree)
libs=$(echo "$libs" | grep -v "^$root/" || true)
pkgs=$(for l in $libs; do owner "$l"; done |
       awk -F': ' '{ print $1 }' | tr ',' '\n' | sed 's/^ *//; s/:amd64$//' | sort -u)
if echo "$pkgs" | grep -q '^no-package'; then
    echo "libraries no package owns (not carried):" >&2
    for l in $libs; do owner "$l"; done | grep '^no-package' >&2
fi
pkgs=$(echo "$pkgs" | grep -v '^no-package' | grep -Ev "$skip" || true)
# libucx0 is there through libucp.so; its modules need libibverbs1 and
# librdmacm1 only for RDMA transports (named here so that they come even
# when ldd above found them through another path).
pkgs=$(printf '%s\n' $pkgs libucx0 | sort -u)

rm -rf $build/debs
mkdir -p $build/debs
# (apt-get warns that it downloads as root into a directory its _apt user
# cannot write: harmless)
(cd $build/debs && apt-get download $pkgs 2>&1 >/dev/null | grep -v 'unsandboxed' >&2 || true)
for p in $pkgs; do
    ls $build/debs/"${p}"_*.deb >/dev/null 2>&1 || { echo "apt-get download $p failed" >&2; exit 1; }
done
# pkgs and versions, for the record of what ran there
(cd $build/debs && ls *.deb) > $build/debs/MANIFEST
echo "packages carried ($(echo $pkgs | wc -w)): $(echo $pkgs)"
echo "debs: $(du -sb $build/debs | cut -f1) bytes"

# What travels: tracked files and untracked files git does not ignore,
# plus the carried build-device/.
tree_bytes=$(git ls-files -z --cached --others --exclude-standard |
             xargs -0 -r stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
build_bytes=$(du -sb $build | cut -f1)
# a shared/ folder inside the checkout travels too, ignored or not
if [ -d shared ] && git check-ignore -q shared; then
    tree_bytes=$((tree_bytes + $(du -sb shared | cut -f1)))
fi
total=$((tree_bytes + build_bytes))
printf 'working tree %d + %s %d = %d bytes (%.1f MiB of the 64 MiB limit)\n' \
    "$tree_bytes" "$build" "$build_bytes" "$total" "$(echo "$total / 1048576" | bc -l)"
if [ "$total" -gt "$limit" ]; then
    # nothing there rebuilds: the objects and static libraries can go (the
    # next ninja here builds them again)
    echo "over the device tool's 64 MiB: dropping $build's object files and static libraries"
    find $build -path $build/debs -prune -o -type f \( -name '*.o' -o -name '*.a' \) -print0 |
        xargs -0 -r rm -f
    build_bytes=$(du -sb $build | cut -f1)
    total=$((tree_bytes + build_bytes))
    printf 'now %d bytes (%.1f MiB)\n' "$total" "$(echo "$total / 1048576" | bc -l)"
    if [ "$total" -gt "$limit" ]; then
        echo "still over 64 MiB: carry less" >&2
        exit 1
    fi
fi
