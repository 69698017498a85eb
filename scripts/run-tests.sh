#!/usr/bin/env bash
# Runs the whole suite in each build directory given (the normal tree and the
# ASan+UBSan tree), then the source checks, and ends with one line
#   N passed, N failed, N skipped
# counted over everything. Exits non-zero when anything failed.
set -u
cd "$(dirname "$0")/.."

passed=0 failed=0 skipped=0
failures=()

for dir in "$@"; do
    echo "== meson test in $dir"
    meson test -C "$dir" --num-processes 2 --print-errorlogs
    log="$dir/meson-logs/testlog.json"
    if [ ! -s "$log" ]; then
        echo "no test log in $dir: counting the run as failed"
        failed=$((failed + 1))
        failures+=("$dir: no tests ran")
        continue
    fi
    # one JSON object per test; result is OK, FAIL, SKIP, TIMEOUT, ERROR, ...
    while IFS=$'\t' read -r result name; do
        case "$result" in
        OK|EXPECTEDFAIL) passed=$((passed + 1)) ;;
        SKIP) skipped=$((skipped + 1)) ;;
        *) failed=$((failed + 1)); failures+=("$dir: $name ($result)") ;;
        esac
    done < <(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    line = line.strip()
    if line:
        t = json.loads(line)
        print(t["result"] + "\t" + t["name"])
' "$log")
done

echo "== clang-format check"
if files=$(git ls-files '*.c' '*.h' 2>/dev/null) && [ -n "$files" ]; then
    if clang-format --dry-run --Werror $files >/dev/null 2>&1; then
        passed=$((passed + 1))
    else
        clang-format --dry-run --Werror $files 2>&1 | head -20
        failed=$((failed + 1))
        failures+=("format: run 'make format'")
    fi
fi

for f in "${failures[@]+"${failures[@]}"}"; do
    echo "FAILED: $f"
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
