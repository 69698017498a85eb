# kvdock: the two commands of the README.
#
#   make run    install missing Debian packages, build, start kvdockd in the
#               foreground on the embedded default (a 1 GiB pool, the socket
#               under $XDG_RUNTIME_DIR or /tmp); Ctrl-C drains and exits.
#   make test   install missing packages, build the normal, the ASan+UBSan
#               and the ThreadSanitizer trees, run the whole suite in the
#               first two and the linker, daemon and simulator suites in
#               the third, the Python suite (tests/python, Debian's
#               /usr/bin/python3) against the first, then each fuzz target briefly (FUZZ_CI_SECONDS
#               each, after replaying its corpus); the last line is "N
#               passed, N failed, N skipped".
#   make fuzz   build the fuzz tree (clang, libFuzzer, ASan+UBSan) and run
#               each libFuzzer target of fuzz/ for FUZZ_SECONDS (60) from
#               its corpus; crashes go to FUZZ_OUT/<target>/; fails on any.
#
#   make chaos  workers doing random lookups, loads and offloads while the
#               driver SIGKILLs and SIGSTOPs workers and the daemon (restarted
#               on its pool file and journal); after each daemon restart and
#               each round the store's invariant, no leak, every acknowledged
#               object byte-exact, those acknowledged before a daemon kill
#               included (CHAOS_ROUNDS=5, CHAOS_WORKERS=4, CHAOS_SEED=1;
#               CHAOS_ASAN=1 runs the ASan+UBSan tree). A short run of it,
#               chaos/restart, is part of make test; this one is not.
#   make soak DURATION=600   the same workload without injuries for DURATION
#               seconds; the daemon's RSS every second into $(BUILD)/soak.csv,
#               failing when it drifts after warm-up (SOAK_MAX_DRIFT_MIB=8,
#               SOAK_MAX_SLOPE_KIBS=8).
#
# Other targets: build, bench, format, format-check, clean.

SHELL := /bin/bash
BUILD ?= build
BUILD_ASAN ?= build-asan
BUILD_TSAN ?= build-tsan
BUILD_BENCH ?= build-bench
BUILD_FUZZ ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_CI_SECONDS ?= 15
FUZZ_OUT ?= $(BUILD_FUZZ)/fuzz-out
POOL_SIZE ?= 1G
RUN_ARGS ?=

# Debian packages the build and the tests need (pkg-config names in meson.build);
# clang and libclang-rt-14-dev (libFuzzer, clang 14's runtimes) for fuzz/;
# Debian's python3-torch, -numpy, -pytest for the Python suite (tests/python,
# run with /usr/bin/python3: the python3 first on PATH may be another).
# libamdhip64-dev (ROCm 5.2) for the HIP headers: the HIP backend and the fake
# HIP runtime of tests/gpu build against them (CUDA's cuda.h comes from the
# toolkit in /usr/local/cuda where installed; neither is linked).
DEBS := gcc make pkg-config meson ninja-build python3 protobuf-c-compiler \
	libprotobuf-c-dev libssl-dev libucx-dev libibverbs-dev \
	libmicrohttpd-dev libcmocka-dev clang-format iproute2 ucx-utils curl \
	clang libclang-rt-14-dev python3-torch python3-numpy python3-pytest \
	liburing-dev e2fsprogs util-linux fio etcd-server libcurl4-openssl-dev libcjson-dev \
	libamdhip64-dev

CHAOS_ROUNDS ?= 5
CHAOS_WORKERS ?= 4
CHAOS_SEED ?= 1
CHAOS_ARGS ?=
DURATION ?= 600
SOAK_MAX_DRIFT_MIB ?= 8
SOAK_MAX_SLOPE_KIBS ?= 8
ifeq ($(CHAOS_ASAN),1)
CHAOS_TREE := $(BUILD_ASAN)
else
CHAOS_TREE := $(BUILD)
endif

.PHONY: deps build run test fuzz bench chaos soak format format-check clean

# Installs only what is missing, non-interactively; needs root (or sudo).
deps:
	@missing=""; for p in $(DEBS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BUILD)/build.ninja: | deps
	meson setup $(BUILD) --buildtype=debugoptimized

$(BUILD_ASAN)/build.ninja: | deps
	meson setup $(BUILD_ASAN) --buildtype=debug -Db_sanitize=address,undefined -Db_lundef=false

$(BUILD_TSAN)/build.ninja: | deps
	meson setup $(BUILD_TSAN) --buildtype=debug -Db_sanitize=thread -Db_lundef=false

$(BUILD_BENCH)/build.ninja: | deps
	meson setup $(BUILD_BENCH) --buildtype=release -Dtests=disabled

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

run: build
	exec ./$(BUILD)/daemon/kvdockd --pool-size $(POOL_SIZE) $(RUN_ARGS)

test: deps $(BUILD)/build.ninja $(BUILD_ASAN)/build.ninja $(BUILD_TSAN)/build.ninja
	ninja -C $(BUILD)
	ninja -C $(BUILD_ASAN)
	ninja -C $(BUILD_TSAN)
	PY_BUILD=$(BUILD) FUZZ_BUILD=$(BUILD_FUZZ) FUZZ_SECONDS=$(FUZZ_CI_SECONDS) \
	  ./scripts/run-tests.sh $(BUILD) $(BUILD_ASAN) $(BUILD_TSAN)

# The fuzz tree is set up by scripts/fuzz.sh (clang; see there).
fuzz: deps
	./scripts/fuzz.sh -s $(FUZZ_SECONDS) -b $(BUILD_FUZZ) -o $(FUZZ_OUT)

bench: deps $(BUILD_BENCH)/build.ninja
	ninja -C $(BUILD_BENCH)
	meson test -C $(BUILD_BENCH) --benchmark -v

chaos: deps $(CHAOS_TREE)/build.ninja
	ninja -C $(CHAOS_TREE)
	./$(CHAOS_TREE)/tests/chaos/kvdock-chaos --kvdockd ./$(CHAOS_TREE)/daemon/kvdockd \
	  --rounds $(CHAOS_ROUNDS) --workers $(CHAOS_WORKERS) --seed $(CHAOS_SEED) $(CHAOS_ARGS)

soak: deps $(CHAOS_TREE)/build.ninja
	ninja -C $(CHAOS_TREE)
	./$(CHAOS_TREE)/tests/chaos/kvdock-chaos --kvdockd ./$(CHAOS_TREE)/daemon/kvdockd --soak \
	  --duration $(DURATION) --workers $(CHAOS_WORKERS) --seed $(CHAOS_SEED) \
	  --csv $(CHAOS_TREE)/soak.csv --max-drift-mib $(SOAK_MAX_DRIFT_MIB) \
	  --max-slope-kibs $(SOAK_MAX_SLOPE_KIBS) $(CHAOS_ARGS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

format-check:
	clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_TSAN) $(BUILD_BENCH) $(BUILD_FUZZ)
