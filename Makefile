# kvferry: `make demo` runs the main job, `make check` runs every test.
# Both install missing Debian packages first (scripts/install-deps.sh).

BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
GPU_BUILD ?= build-gpu
PREFIX ?= /usr/local
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all deps configure build check demo sanitize tsan gpu-check install clean format python-check

all: build

deps:
	@sh scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	@$(MAKE) --no-print-directory deps
	cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j$(JOBS)

check: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# demo: what this machine offers, a verified bench with what each of its rows
# means, then a short replay of a generated mixed workload (system prompts,
# multi-turn chats, few-shot templates) through the cache's host and disk
# tiers, every block got back verified (docs/replay.md). Quiet: the build's
# own output only when it fails, no make directory lines.
demo: configure
	@cmake --build $(BUILD) -j$(JOBS) -- --no-print-directory >$(BUILD)/demo-build.log 2>&1 || \
	  { cat $(BUILD)/demo-build.log; exit 1; }
	@echo "== 1. kvferry info: what this machine offers"
	@$(BUILD)/kvferry info
	@echo
	@echo "== 2. kvferry bench: blocks offloaded (primary -> secondary slots) and onboarded"
	@echo "   back, every byte checked. Rows, in GB/s of the bytes moved:"
	@echo "   ceiling    the same bytes in one large copy (one memcpy; on a GPU one pinned"
	@echo "              cudaMemcpy): what the memory system gives, no blocks to gather"
	@echo "   reference  the usual algorithm: one copy call per block (one thread; on a"
	@echo "              GPU one cudaMemcpyAsync per block)"
	@echo "   kvferry    this library's kvf_offload / kvf_onboard of the same blocks"
	@echo "   kvferry / ceiling, kvferry / reference: its ratio to each (1.00x: as fast)"
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
	clang-format -i include/*.h src/*.c src/*.h src/*.cu tools/*.c tools/*.h tests/*.c tests/*.h bench/*.c

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(GPU_BUILD)

# The Python binding's tests alone (they also run in `make check`).
python-check: build
	KVFERRY_LIBRARY=$(abspath $(BUILD))/libkvferry.so python3 -m pytest -q -p no:cacheprovider python/tests
