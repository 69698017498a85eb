#!/usr/bin/env python3
"""Runs the tests of one meson suite from a build tree's test list
(meson-info/intro-tests.json), as `meson test --no-rebuild --suite S` would,
for the device machine: its meson is another version than the one that
configured the tree, and meson refuses to load a build directory of
another version.

    run_tests.py BUILD_DIR --suite gpu [--deadline SECONDS] [--log FILE]
                 [--env NAME=VALUE]... [--unset NAME]...

Each test runs with the test's own environment (its variants' variables:
KVDOCK_CUDA_LIBRARY for the fake ones) over this process's, plus the
--env values; --unset removes a variable from the base only (a test that
sets it still gets it).

--real-variants: each CUDA test that meson defines on the fake (its
environment's KVDOCK_CUDA_LIBRARY names the fake) runs a second time as
NAME-real, without KVDOCK_CUDA_LIBRARY (the cases that need a FAKEGPU_*
knob skip on a real runtime), on whatever runtime this process's own
environment leads to (the real libcuda.so.1 on the device machine).
The fake's own tests (names with "fakegpu") are not repeated: meson has
their real twins. Exit 77 is a skip. Each test is bounded by its
meson timeout and by what is left of --deadline; a test still running
there is killed (its process group) and counted as timed out. Prints one
line per test and the counts; the tests' output goes to --log. Exit
status 0 when none failed or timed out, 1 otherwise, 2 for a bad tree.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time


def suite_matches(suites, want):
    # meson writes "suite" as given, or prefixed with the project's name
    # ("kvdock:gpu") for subprojects; accept both
    return any(s == want or s.endswith(":" + want) for s in suites)


def on_fake_cuda(env):
    lib = env.get("KVDOCK_CUDA_LIBRARY")
    # the tests' fake; not a path meant to be missing (linker-no_runtime)
    return lib is not None and "fake" in os.path.basename(lib)


def real_variants(tests):
    names = {t["name"] for t in tests}
    out = []
    for t in tests:
        e = t.get("env") or {}
        name = t["name"] + "-real"
        # the fake's own tests have their real-runtime twins in meson
        # (gpu/fakegpu-on-device-*)
        if not on_fake_cuda(e) or "fakegpu" in t["name"] or name in names:
            continue
        v = dict(t)
        v["name"] = name
        # the FAKEGPU_* knobs stay: a real runtime reads none of them, and
        # where this process's environment leads to the fake again (this
        # script tried without a GPU) the case runs as meson defines it
        v["env"] = {k: x for k, x in e.items() if k != "KVDOCK_CUDA_LIBRARY"}
        out.append(v)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--suite", required=True)
    ap.add_argument("--deadline", type=float, default=0)
    ap.add_argument("--log", default="")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--unset", action="append", default=[])
    ap.add_argument("--real-variants", action="store_true")
    a = ap.parse_args()

    path = os.path.join(a.build, "meson-info", "intro-tests.json")
    try:
        with open(path) as f:
            tests = json.load(f)
    except (OSError, ValueError) as e:
        print(f"run_tests: cannot read {path}: {e}")
        return 2
    tests = [t for t in tests if suite_matches(t.get("suite", []), a.suite)]
    if not tests:
        print(f"run_tests: no test in suite {a.suite} in {path}")
        return 2

    if a.real_variants:
        tests = tests + real_variants(tests)

    base = dict(os.environ)
    for name in a.unset:
        base.pop(name, None)
    for kv in a.env:
        k, _, v = kv.partition("=")
        base[k] = v
    log = open(a.log, "w") if a.log else sys.stdout
    start = time.monotonic()
    counts = {"OK": 0, "FAIL": 0, "SKIP": 0, "TIMEOUT": 0, "EXPECTEDFAIL": 0}
    width = max(len(t["name"]) for t in tests)
    for i, t in enumerate(tests, 1):
        name = t["name"]
        left = a.deadline - (time.monotonic() - start) if a.deadline else None
        if left is not None and left < 1:
            print(f"{i:3}/{len(tests)} {name:{width}} TIMEOUT  (deadline passed before it ran)")
            counts["TIMEOUT"] += 1
            continue
        limit = t.get("timeout") or 0
        limit = limit if limit > 0 else None
        if left is not None:
            limit = min(limit, left) if limit else left
        env = dict(base)
        env.update(t.get("env") or {})
        env.setdefault("MESON_TEST_ITERATION", "1")
        cmd = list(t["cmd"]) + list(t.get("args") or [])
        if log is not sys.stdout:
            log.write(f"==== {name}\n$ {' '.join(cmd)}\n")
            log.flush()
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, cwd=t.get("workdir") or a.build, env=env,
                             stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = p.wait(timeout=limit)
            verdict = None
        except subprocess.TimeoutExpired:
            # the test and whatever it started (a daemon) share its group
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc, verdict = None, "TIMEOUT"
        secs = time.monotonic() - t0
        if verdict is None:
            should_fail = t.get("should_fail", False)
            if rc == 77:
                verdict = "SKIP"
            elif should_fail:
                verdict = "EXPECTEDFAIL" if rc != 0 else "FAIL"
            else:
                verdict = "OK" if rc == 0 else "FAIL"
        counts[verdict] += 1
        tail = f"rc {rc}" if rc is not None else f"killed at {limit:.0f} s"
        print(f"{i:3}/{len(tests)} {name:{width}} {verdict:8} {secs:7.2f}s  ({tail})",
              flush=True)
        if log is not sys.stdout:
            log.write(f"==== {name}: {verdict}, {tail}, {secs:.2f} s\n\n")
            log.flush()
    print(" ".join(f"{k} {v}" for k, v in counts.items()))
    return 1 if counts["FAIL"] or counts["TIMEOUT"] else 0


if __name__ == "__main__":
    sys.exit(main())
