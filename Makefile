# Thin wrapper over scripts/install-deps, CMake, ctest and pytest. All logic lives in
# CMakeLists.txt and scripts/; see docs/development.md.
#
#   make            install missing packages, configure and build into build/
#   make test       ... and run every test (ctest, including the kernel-safe check, and pytest)
#   make labtest    a short real A/A `tierlab pair` (2 pairs, ~1-2 min; docs/lab/pair.md)
#   make test-asan  the same with AddressSanitizer + UndefinedBehaviorSanitizer, in build-asan/
#   make clean      remove build directories

JOBS ?= $(shell nproc)
PY := /usr/bin/python3

.PHONY: all deps build test labtest test-asan clean

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

test-asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTIERFS_SANITIZE=ON
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
		ctest -j$(JOBS) --output-on-failure
	TIERFS_BUILD=$(CURDIR)/build-asan $(PY) -m pytest

clean:
	rm -rf build build-asan build-fuzz
