# Thin wrapper over scripts/install-deps, CMake, ctest and pytest. All logic lives in
# CMakeLists.txt and scripts/; see docs/development.md.
#
#   make            install missing packages, configure and build into build/
#   make test       ... and run every test (ctest, including the kernel-safe check, and pytest)
#   make labtest    a short real A/A `tierlab pair` (2 pairs, ~1-2 min; docs/lab/pair.md)
#   make vmtest     A/A `tierlab vm pair` in QEMU guests, gated (docs/lab/vmlab.md):
#                   [PROFILE=fixed-delay] [PAIRS=8] [OUT=build/vmtest/PROFILE-DATE] [VMSET=--set ...]
#   make test-asan  the same with AddressSanitizer + UndefinedBehaviorSanitizer, in build-asan/
#   make clean      remove build directories

JOBS ?= $(shell nproc)
PY := /usr/bin/python3

.PHONY: all deps build test labtest vmtest test-asan clean

all: build

deps:
	scripts/install-deps build test lab

build: deps
	cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build build -j$(JOBS)

test: build
	cd build && ctest -j$(JOBS) --output-on-failure
	TIERFS_BUILD=$(CURDIR)/build $(PY) -m pytest
	$(MAKE) --no-print-directory labtest

labtest: build
	TIERFS_BUILD=$(CURDIR)/build $(PY) -m pytest -q -s results/tierlab/labtest.py

PROFILE ?= fixed-delay
PAIRS ?= 8
VMTEST_DATE := $(shell date +%Y%m%d-%H%M%S)
# Set on the command line (make vmtest OUT=DIR), not taken from the environment.
ifneq ($(origin OUT),command line)
OUT := build/vmtest/$(PROFILE)-$(VMTEST_DATE)
endif
VMTEST_OUT := $(patsubst %/,%,$(OUT))
VMSET ?= --set probe.rate=100 --set gate.background_min_bytes=0

# The exit status is the gate's (1 when it left no status); the report's path
# and the verdict are printed last. The log and status sit beside OUT.
vmtest: build
	TIERFS_BUILD=$(CURDIR)/build build/bin/tierlab vm image
	mkdir -p $(dir $(VMTEST_OUT))
	{ TIERFS_BUILD=$(CURDIR)/build build/bin/tierlab vm pair --profile $(PROFILE) --pairs $(PAIRS) \
		--out $(VMTEST_OUT) $(VMSET); echo $$? > $(VMTEST_OUT).rc; } 2>&1 | tee $(VMTEST_OUT).log; \
		rc=$$(cat $(VMTEST_OUT).rc 2>/dev/null); \
		echo "vmtest: report $(VMTEST_OUT)/report/report.md (log $(VMTEST_OUT).log)"; \
		echo "vmtest: verdict $$(grep '^gate:' $(VMTEST_OUT).log || echo 'none (see the log)'), exit $${rc:-1}"; \
		exit $${rc:-1}

test-asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTIERFS_SANITIZE=ON
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
		ctest -j$(JOBS) --output-on-failure
	TIERFS_BUILD=$(CURDIR)/build-asan $(PY) -m pytest

clean:
	rm -rf build build-asan build-fuzz
