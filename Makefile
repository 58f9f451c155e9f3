# Thin wrapper over CMake: `make deps` installs what the build and tests need, `make demo` runs the
# daemon with 4 client processes, `make test` builds and runs every test. See README.md.
BUILD      ?= build
BUILD_ASAN ?= build-asan
BUILD_TSAN ?= build-tsan
BUILD_FUZZ ?= build-fuzz
FUZZ_SECONDS ?= 600
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

# Debian 12 packages needed to build colld and run its tests. libsystemd-dev: sd_notify for the
# Type=notify unit (optional to the build). systemd, prometheus, help2man and groff-base are
# deploy/check.sh's validators (the test deploy_check): systemd-analyze and systemd-sysusers,
# promtool (on a host that runs systemd the prometheus package also enables a Prometheus server),
# the man pages. python3-venv: the project's Python environment below, whose torch 2.x (PyPI) the
# torch.distributed backend torch_colld is built against (bindings/torch, docs/torch.md), with
# python3-dev's Python.h and g++ (optional to the build: skipped without). iproute2: ip netns and
# tc for test_slowlink (hosts in network namespaces, one link shaped). libibverbs-dev: transport/ib
# (InfiniBand/RoCE between daemons, docs/ib.md); rdma-core, ibverbs-providers (the rxe provider),
# qemu-system-x86, busybox-static, cpio and kmod (modinfo): tests/softroce, two qemu guests of
# Debian's kernel with Soft-RoCE (the kernel package itself is fetched by the test with apt-get
# download into the build directory, never installed). librdmacm-dev: not linked (the endpoints
# travel over the authenticated control channel, not rdma_cm), kept for the tools it carries.
DEB_PACKAGES = gcc make cmake ninja-build pkg-config libgrpc-dev libprotobuf-c-dev protobuf-c-compiler \
               libuv1-dev libssl-dev libcmocka-dev clang libclang-rt-14-dev libsystemd-dev \
               systemd prometheus help2man groff-base python3-venv python3-dev g++ iproute2 \
               libxxhash-dev libibverbs-dev librdmacm-dev rdma-core ibverbs-providers qemu-system-x86 \
               busybox-static cpio kmod

# The project's Python environment: Debian's python3 with exactly the packages of requirements.txt
# (pinned with their hashes; torch 2.x, the Kubernetes schemas' validator, pytest). Remade when
# requirements.txt changes. /usr/bin/python3 stays for what needs only Debian's packages.
VENV ?= .venv

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps deb-deps build demo test test-full test-asan test-tsan test-fuzz fuzz clean image gpu-check

all: build

deps: deb-deps $(VENV)/.requirements

# Installs only the missing packages; does nothing when all are present.
deb-deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	else echo "deps: all packages present"; fi

# --no-deps: nothing but what requirements.txt lists (it leaves out triton, see there).
$(VENV)/.requirements: requirements.txt | deb-deps
	@echo "deps: installing requirements.txt into $(VENV) (about 4 GB the first time, README)"
	rm -rf $(VENV)
	/usr/bin/python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --require-hashes -r requirements.txt
	cp requirements.txt $@

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCOLLD_WERROR=ON $(CMAKE_ARGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	tools/demo.sh $(BUILD)

# `make test` sizes the big matrices for CI (every kind of case, the >= 4 MiB counts and the
# upstream suites on a subset: at most about 12 minutes on 2 cores after the build);
# `make test-full` runs them at their full sizes (COLLD_TEST_FULL=1; about 40 minutes), which CI
# does not.
test: build
	ctest --test-dir $(BUILD) --output-on-failure --timeout 900

test-full: build
	COLLD_TEST_FULL=1 ctest --test-dir $(BUILD) --output-on-failure --timeout 1800

# The tests again with AddressSanitizer + UndefinedBehaviorSanitizer, the big matrices' >= 4 MiB
# counts once per kind (COLLD_TEST_SMALL=1: the chunked paths checked, not every dtype and op).
test-asan: deps
	cmake -S . -B $(BUILD_ASAN) -G Ninja -DCOLLD_WERROR=ON -DCMAKE_BUILD_TYPE=Debug -DCOLLD_SANITIZE=address,undefined
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	COLLD_TEST_SMALL=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(BUILD_ASAN) --output-on-failure --timeout 1200 -LE softroce

# The engine and integration tests with ThreadSanitizer (the collectives matrix at its small
# counts: the >= 4 MiB ones take many minutes under TSan and add no concurrency to check), and
# the CUDA driver test double's own test (label cudafake: its streams are threads). Not the
# _2gpus variants (the same threads as their one-GPU tests, with a second fake device) nor
# test_slowlink (tc-shaped links timed in network namespaces: the threads of test_multinode,
# which runs), nor gpu_collectives_hofault_host (the host's hand-off's faults: the threads of
# gpu_collectives_hofault, about 20 s more) nor gpu_collectives_fault_early (the kill -9 cases of
# gpu_collectives_fault with --gpu-early-launch: the early launch's threads are gpu_collectives_hofault's),
# nor the value matrices gpu_kernels (every dtype x op x length of the kernels' arithmetic on one
# stream) and gpu_collectives_matrix (the daemon's threads of gpu_collectives_stream, which runs),
# nor the _legacy variants test_gpu_cudafake_legacy and gpu_p2p_exchange_legacy (IPC handles in place
# of VMM fds: a different registration call on the same threads as test_gpu_cudafake_vmm and
# gpu_p2p_exchange, which run): they run in `make test` and under ASan.
test-tsan: deps
	cmake -S . -B $(BUILD_TSAN) -G Ninja -DCOLLD_WERROR=ON -DCMAKE_BUILD_TYPE=Debug -DCOLLD_SANITIZE=thread
	cmake --build $(BUILD_TSAN) -j $(JOBS)
	COLLD_TEST_NO_BIG=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	  ctest --test-dir $(BUILD_TSAN) --output-on-failure --timeout 1200 -L 'integration|cudafake' -E '_2gpus$$|^test_slowlink$$|_hofault_host$$|_fault_early$$|^gpu_kernels$$|^gpu_collectives_matrix$$|^test_gpu_cudafake_legacy$$|^gpu_p2p_exchange_legacy$$'

# The libFuzzer harnesses (tests/fuzz, clang with ASan+UBSan): `make test-fuzz` is CI's smoke run
# (30 s each, JOBS at once: a harness is one process on one core); `make fuzz` runs each for
# FUZZ_SECONDS (default 600). New inputs stay in
# $(BUILD_FUZZ)/tests/fuzz/work, crashes in $(BUILD_FUZZ)/tests/fuzz/artifacts.
$(BUILD_FUZZ)/build.ninja:
	CC=clang cmake -S . -B $(BUILD_FUZZ) -G Ninja -DCOLLD_WERROR=ON -DCOLLD_FUZZ=ON -DCOLLD_ENABLE_CUDA=OFF

test-fuzz: deps $(BUILD_FUZZ)/build.ninja
	cmake -S . -B $(BUILD_FUZZ) -DCOLLD_FUZZ_SECONDS=30
	cmake --build $(BUILD_FUZZ) -j $(JOBS) --target fuzzers
	ctest --test-dir $(BUILD_FUZZ) --output-on-failure -L fuzz -j $(JOBS)

fuzz: deps $(BUILD_FUZZ)/build.ninja
	cmake -S . -B $(BUILD_FUZZ) -DCOLLD_FUZZ_SECONDS=$(FUZZ_SECONDS)
	cmake --build $(BUILD_FUZZ) -j $(JOBS) --target fuzzers
	ctest --test-dir $(BUILD_FUZZ) --output-on-failure -L fuzz -j $(JOBS)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_TSAN) $(BUILD_FUZZ)

# `make image`: the container image of deploy/container/Containerfile (Debian packages only),
# with buildah where it is installed (apt-get install buildah), else podman or docker.
IMAGE ?= colld:$(shell grep -o 'colld VERSION [0-9.]*' CMakeLists.txt | cut -d' ' -f3)
image:
	@if command -v buildah >/dev/null 2>&1; then \
	  buildah build --layers -f deploy/container/Containerfile -t $(IMAGE) . ; \
	elif command -v podman >/dev/null 2>&1; then \
	  podman build -f deploy/container/Containerfile -t $(IMAGE) . ; \
	elif command -v docker >/dev/null 2>&1; then \
	  docker build -f deploy/container/Containerfile -t $(IMAGE) . ; \
	else echo "image: needs buildah (apt-get install buildah), podman or docker" >&2; exit 1; fi

# `make bench`: colld against OpenMPI and the memory-bandwidth bound in one run (bench/compare.sh,
# issue 5); raw results, ratios and plots in $(BENCH_RESULTS). BENCH_ARGS="--quick" for a smoke run.
BENCH_PACKAGES = openmpi-bin libopenmpi-dev gnuplot-nox
BENCH_RESULTS ?= $(BUILD)/bench-results
BENCH_ARGS    ?=

.PHONY: bench-deps bench bench-netns

# The build's packages plus OpenMPI (the baseline) and gnuplot (the plots); only the missing ones.
bench-deps:
	@missing=""; for p in $(DEB_PACKAGES) $(BENCH_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "bench-deps: installing$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	else echo "bench-deps: all packages present"; fi

bench: bench-deps $(BUILD)/build.ninja
	bench/compare.sh --build $(BUILD) --results $(BENCH_RESULTS) $(BENCH_ARGS)

# The first run on a real GPU (issue 15 item 6), one command: the hardware-only GPU tests (gpu_hw_*,
# the same programs as CI's GPU tests but on the real driver), none of which may skip, then
# bench/gpu.sh (issue 6's targets: small-message p50, HBM traffic against D2D copies). Prints what
# to record in docs/performance.md and docs/gpu-testing.md. On a GPU machine that cannot build
# colld, bench/gpu-carry.sh runs the same programs from a build made elsewhere (how the first run,
# on an H100, was made).
gpu-check: build
	@ctest --test-dir $(BUILD) --output-on-failure -L hardware >$(BUILD)/gpu-check-tests.txt 2>&1; rc=$$?; \
	  cat $(BUILD)/gpu-check-tests.txt; [ $$rc = 0 ] || { echo "gpu-check: GPU tests failed"; exit 1; }
	@if grep "Not Run\|\*\*\*Skipped" $(BUILD)/gpu-check-tests.txt | grep -qv "_2gpus"; then \
	  echo "gpu-check: GPU tests were skipped: no GPU or driver visible (nvidia-smi?)"; exit 1; fi
	@if grep -q "_2gpus.*Skipped" $(BUILD)/gpu-check-tests.txt; then \
	  echo "gpu-check: note: the _2gpus tests were skipped (fewer than two GPUs visible)"; fi
	bench/gpu.sh --build $(BUILD) $(BENCH_ARGS)
	@echo "gpu-check: record $(BUILD)/gpu-check-tests.txt and bench/gpu.sh's targets (MET/MISSED) in"
	@echo "           docs/gpu-testing.md (first run on hardware) and docs/performance.md"

# Multi-node all-reduce across network namespaces joined by rate-limited veth links (root only).
bench-netns: build
	bench/netns.sh --build $(BUILD) $(BENCH_ARGS)
