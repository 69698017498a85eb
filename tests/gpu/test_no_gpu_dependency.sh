#!/bin/sh
# Description: libkvdock.so ($1) loads the GPU runtimes at run time only
# (dlopen), so it loads on a host with neither installed: its dynamic
# section names no CUDA, ROCm HIP or HSA library as NEEDED.
set -eu
lib=$1
if ! command -v readelf >/dev/null 2>&1; then
    echo "readelf not found (binutils): cannot read $lib" >&2
    exit 1
fi
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p')
if [ -z "$needed" ]; then
    echo "no NEEDED entries read from $lib: readelf -d gave nothing to check" >&2
    exit 1
fi
echo "NEEDED of $lib:"
echo "$needed" | sed 's/^/  /'
bad=$(echo "$needed" | grep -E '^lib(cuda|cudart|nvidia|amdhip64|hsa-runtime64|hsa)' || true)
if [ -n "$bad" ]; then
    echo "libkvdock.so depends on a GPU runtime at link time:" >&2
    echo "$bad" | sed 's/^/  /' >&2
    exit 1
fi
echo "no GPU runtime among them"
