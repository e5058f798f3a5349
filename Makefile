# bfshard — build. `make` builds build/bfshard and build/libbfshard.a.
# `make test` runs the test suite, `make demo` converts a bundled fixture.
# Missing Debian packages are installed by scripts/install-deps.sh.

CC      ?= gcc
BUILD   ?= build
# No fast-math anywhere: every value must match upstream bit for bit.
# -ffp-contract=off forbids fusing a multiply and an add into an FMA.
OPT     ?= -O2
# gcc's -Wformat-truncation flags snprintf into fixed names on purpose; clang has no such option
NO_FMT_TRUNC := $(shell $(CC) -Werror -Wno-format-truncation -x c -c /dev/null -o /dev/null 2>/dev/null && echo -Wno-format-truncation)
CFLAGS_BASE := -std=c11 $(OPT) -g -Wall -Wextra -Wshadow -Wno-unused-parameter $(NO_FMT_TRUNC) \
               -ffp-contract=off -fno-fast-math -fno-strict-aliasing \
               -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -Iinclude -Isrc -pthread
CFLAGS  += $(CFLAGS_BASE) $(EXTRA_CFLAGS)
LDFLAGS += -pthread $(EXTRA_LDFLAGS)
LIBS    := -ljansson -lxxhash -lzstd -lcrypto -lm

# ---- CUDA: built when nvcc is present (llm.c style) ----------------------------
NVCC      ?= $(shell command -v nvcc 2>/dev/null)
NO_CUDA   ?=
ifeq ($(NO_CUDA),)
ifneq ($(NVCC),)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
HAVE_CUDA := 1
endif
endif

LIB_SRC := $(filter-out src/cli/%,$(wildcard src/*/*.c))
# the CUDA backend (backend_cuda.c, _q.c, _dev.c); backend_cuda_stub.c replaces it without nvcc
CUDA_C_SRC := $(filter-out src/backend/backend_cuda_stub.c,$(wildcard src/backend/backend_cuda*.c))
KCPU_SRC := kernels/cpu_scalar.c kernels/cpu_dispatch.c
KAVX2_SRC := kernels/cpu_avx2.c kernels/cpu_avx2_mxfp4.c kernels/cpu_avx2_ctmx.c kernels/cpu_avx2_woq.c
KAVX512_SRC := kernels/cpu_avx512.c

ifeq ($(HAVE_CUDA),1)
$(info bfshard: building CPU (scalar, avx2, avx512) and CUDA backends with $(NVCC))
CU_SRC  := $(wildcard kernels/*.cu)
# Exactness (every bit as upstream): no FMA contraction, no flush-to-zero, IEEE division
# and square root. Fixed here, last on nvcc's line (the last value of an option wins), and
# not overridable: NVFLAGS set in the environment or on the command line is ignored; add
# flags with EXTRA_NVFLAGS (fast math there is refused). The start-up self-test
# (src/backend/backend_cuda_dev.c) refuses a build that computes inexactly anyway.
NVFLAGS_EXACT := --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
                 -Xcompiler -fno-fast-math,-ffp-contract=off
ifneq ($(filter %fast_math %fast-math,$(EXTRA_NVFLAGS)),)
$(error EXTRA_NVFLAGS: fast math changes bfshard's output bits; it is not allowed)
endif
# SASS for T4 (7.5), A100 (8.0), H100 (9.0), B200 (10.0), RTX 50xx / RTX PRO (12.0), those
# this nvcc knows (nvcc --list-gpu-arch); PTX of the oldest (JIT on any newer GPU, sm_86/89
# run the sm_80 SASS) and of the newest (JIT on future GPUs).
CU_ARCHS_WANT := 75 80 90 100 120
CU_ARCHS := $(filter $(shell $(NVCC) --list-gpu-arch 2>/dev/null | sed -n 's/^compute_//p'),$(CU_ARCHS_WANT))
CU_ARCHS := $(if $(CU_ARCHS),$(CU_ARCHS),80 90)
CU_PTX   := $(firstword $(CU_ARCHS)) $(filter-out $(firstword $(CU_ARCHS)),$(lastword $(CU_ARCHS)))
CU_GENCODE := $(foreach a,$(CU_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
              $(foreach a,$(CU_PTX),-gencode arch=compute_$(a),code=compute_$(a))
override NVFLAGS := -O2 -std=c++17 -Iinclude $(CU_GENCODE) $(EXTRA_NVFLAGS) $(NVFLAGS_EXACT)
CFLAGS  += -DBFS_HAVE_CUDA=1 -I$(CUDA_HOME)/include -DBFS_CUDA_ARCHS='"sm_$(subst $() $(),/,$(CU_ARCHS)) + PTX $(CU_PTX)"'
# static cudart: a missing driver is an error at run time, never a load failure
LIBS    += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
LIB_SRC := $(filter-out src/backend/backend_cuda_stub.c,$(LIB_SRC))
else
$(info bfshard: building CPU backends only (no nvcc found))
CU_SRC  :=
LIB_SRC := $(filter-out $(CUDA_C_SRC),$(LIB_SRC))
endif

HDRS := $(wildcard include/*.h src/*.h src/*/*.h kernels/*.h kernels/*.cuh)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o) $(KCPU_SRC:%.c=$(BUILD)/%.o) \
           $(KAVX2_SRC:%.c=$(BUILD)/%.o) $(KAVX512_SRC:%.c=$(BUILD)/%.o) \
           $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
CLI_SRC := $(wildcard src/cli/*.c)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)

TEST_SRC  := $(wildcard tests/test_*.c)
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_COMMON := $(BUILD)/tests/testutil.o

.PHONY: all deps test demo clean bench interop fuzz asan tsan test-launchers check-layers
all: deps $(BUILD)/bfshard

# Every rule that compiles takes `| deps`: an order-only prerequisite, so that under make -jN
# no compiler starts before the missing packages (their headers) are installed, and, deps
# being phony, it is run every time (quiet and quick when all is present) but never makes
# an object out of date.
deps:
	@scripts/install-deps.sh

# What made this build, recorded in every manifest (src/base/version.c): `git describe` of this
# checkout, "unknown" outside git (a tarball). version.o is rebuilt when it changes.
BFS_REVISION := $(shell [ "$$(git -C . rev-parse --show-toplevel 2>/dev/null)" = "$(realpath $(CURDIR))" ] && \
                  git describe --always --tags --dirty 2>/dev/null || echo unknown)
$(BUILD)/src/base/version.o $(BUILD)/pic/src/base/version.o: CFLAGS += -DBFS_BUILD_REVISION='"$(BFS_REVISION)"'
$(BUILD)/src/base/version.o $(BUILD)/pic/src/base/version.o: $(BUILD)/revision.txt
$(BUILD)/revision.txt: FORCE
	@mkdir -p $(@D)
	@echo '$(BFS_REVISION)' | cmp -s - $@ || echo '$(BFS_REVISION)' > $@
.PHONY: FORCE
FORCE:

$(BUILD)/libbfshard.a: $(LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/bfshard: $(CLI_OBJ) $(BUILD)/libbfshard.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libbfshard.a $(LIBS)

$(BUILD)/%.o: %.c $(HDRS) | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@

$(KAVX2_SRC:%.c=$(BUILD)/%.o): $(BUILD)/%.o: %.c $(wildcard kernels/*.h) | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -mavx2 -mf16c -mbmi2 -c $< -o $@

# the XXH3 update every hash goes through, in its AVX2 form (src/base/io.c picks it at run time)
$(BUILD)/src/base/xxh_avx2.o: src/base/xxh_avx2.c | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -mavx2 -c $< -o $@

$(BUILD)/kernels/cpu_avx512.o: kernels/cpu_avx512.c $(wildcard kernels/*.h) | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mf16c -mbmi2 -c $< -o $@

$(BUILD)/%.cu.o: %.cu $(wildcard kernels/*.h kernels/*.cuh) | deps
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(BUILD)/tests/testutil.o: tests/testutil.c tests/testutil.h | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Isrc -c $< -o $@

$(BUILD)/tests/%: tests/%.c $(TEST_COMMON) $(BUILD)/libbfshard.a tests/testutil.h tests/tu_st.h | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Isrc -o $@ $< $(TEST_COMMON) $(BUILD)/libbfshard.a $(LIBS) -lcmocka $(LDFLAGS)

# the tests that replay the fuzz targets include their sources
$(BUILD)/tests/test_reliability $(BUILD)/tests/test_fuzz_readers $(BUILD)/tests/test_st_scan: $(wildcard fuzz/*.c fuzz/*.h)
# test_st_scan counts the header parser's allocations and fails each in turn
$(BUILD)/tests/test_st_scan: LDFLAGS += -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free

# The README's test command: the test suite, then the layering and documentation checks.
test: all $(TEST_BIN)
	@scripts/run-tests.sh $(BUILD) $(TEST_BIN); rc=$$?; \
	 $(MAKE) --no-print-directory check-layers || rc=1; \
	 $(MAKE) --no-print-directory check-docs || rc=1; \
	 $(MAKE) --no-print-directory check-cuda-exact || rc=1; \
	 $(MAKE) --no-print-directory check-cuda-dev || rc=1; exit $$rc

# the one-way layers of src/ and kernels/ (dev/layers/order), no cycle between
# files, no file over 800 lines nor function over 150, derived from the code and the
# objects of this build (dev/layers/check.py); first its self-test, which breaks each rule
# on purpose in a small made-up tree and must see it fail.
check-layers: all
	@python3 dev/layers/check.py --selftest >$(BUILD)/layers-selftest.log 2>&1 || \
	    { cat $(BUILD)/layers-selftest.log; echo "FAILED: the layering check's self-test"; exit 1; }
	@python3 dev/layers/check.py --build $(BUILD)

# README.md and docs/: no dead relative link or #anchor, no docs page that no link reaches
# from README.md, every option of every command's --help in docs/USAGE.md, the exit codes
# of README.md = `bfshard --help` = the man page (dev/doclinks.py; first its self-test); the man
# page source builds (scdoc, where installed: make install installs it).
.PHONY: check-docs
check-docs: all
	@python3 dev/doclinks.py --selftest >$(BUILD)/doclinks-selftest.log 2>&1 || \
	    { cat $(BUILD)/doclinks-selftest.log; echo "FAILED: the documentation check's self-test"; exit 1; }
	@python3 dev/doclinks.py --bfshard $(BUILD)/bfshard
	@if command -v scdoc >/dev/null 2>&1; then scdoc < doc/bfshard.1.scd > /dev/null || \
	    { echo "FAILED: scdoc cannot build the man page (doc/bfshard.1.scd)"; exit 1; }; fi

# a packed artifact through a real OCI registry on loopback (Debian's docker-registry)
# and back with skopeo, rebuilt and verified (tests/oci/roundtrip.sh; installs them when missing).
.PHONY: test-oci
test-oci: all
	@tests/oci/roundtrip.sh $(BUILD)

# a conversion in parts under real launchers (mpirun; torchrun when make interop's
# venv exists). Installs Debian's openmpi-bin when mpirun is missing.
test-launchers: all
	@scripts/test-launchers.sh $(BUILD)/bfshard

# The README's demo: build, convert a bundled fixture for 4 ranks, verify it.
demo: all
	rm -rf $(BUILD)/demo-out
	$(BUILD)/bfshard convert fixtures/mxfp4-tiny $(BUILD)/demo-out --world-size 4
	$(BUILD)/bfshard verify $(BUILD)/demo-out
	@ls -l $(BUILD)/demo-out

clean:
	rm -rf $(BUILD)

# ---- fuzzing: `make fuzz` builds every fuzz/fuzz_*.c target with clang's libFuzzer ----
# into build/fuzz/ and runs each for FUZZ_SECONDS (default 60) from its seed corpus
# fuzz/corpus/<target>/ (new inputs go to build/fuzz/corpus/<target>/, crashes to
# build/fuzz/artifacts/). A crash fails the rule. `make fuzz-long` runs each for
# FUZZ_LONG_SECONDS (default 3600), the corpora in build/fuzz/corpus/ kept between runs.
# FUZZ_ONLY="manifest sums" runs only those targets. fuzz/<target>.dict is its dictionary,
# fuzz/<target>.options its own libFuzzer flags (after FUZZ_FLAGS: they win). The fuzz
# build reads manifests through a window of FUZZ_MF_WIN bytes (1 MiB elsewhere), so that
# small inputs cross the window's border everywhere.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_LONG_SECONDS ?= 3600
FUZZ_BUILD   := build/fuzz
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_TARGETS := $(patsubst fuzz/fuzz_%.c,%,$(filter-out fuzz/fuzz_common.c,$(wildcard fuzz/fuzz_*.c)))
FUZZ_ONLY    ?= $(FUZZ_TARGETS)
FUZZ_BINS    := $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz_%)
FUZZ_FLAGS   ?= -timeout=20 -rss_limit_mb=2048 -print_final_stats=1
FUZZ_MF_WIN  ?= 61

.PHONY: fuzz-build fuzz-lib fuzz-long valgrind
ifneq ($(BUILD),$(FUZZ_BUILD)/lib)
$(FUZZ_BUILD)/lib/libbfshard.a: fuzz-lib
endif
fuzz-lib:
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD)/lib CC=$(FUZZ_CC) NO_CUDA=1 OPT="-O1" \
	    EXTRA_CFLAGS="$(FUZZ_SAN) -fsanitize=fuzzer-no-link -Wno-unknown-warning-option -DBFS_MF_WIN=$(FUZZ_MF_WIN)" \
	    $(FUZZ_BUILD)/lib/libbfshard.a

$(FUZZ_BUILD)/fuzz_%: fuzz/fuzz_%.c fuzz/fuzz_common.c fuzz/fuzz_common.h $(FUZZ_BUILD)/lib/libbfshard.a | deps
	@mkdir -p $(@D)
	$(FUZZ_CC) $(CFLAGS_BASE) -O1 -Wno-unknown-warning-option -Isrc -Itests $(FUZZ_SAN) -fsanitize=fuzzer \
	    -o $@ $< fuzz/fuzz_common.c $(FUZZ_BUILD)/lib/libbfshard.a -ljansson -lxxhash -lzstd -lcrypto -lm

# the targets after the library, in a make that sees its new date (else a changed library
# may not relink them)
fuzz-build: deps fuzz-lib
	@$(MAKE) --no-print-directory $(FUZZ_BINS)

# $(call fuzz_run,SECONDS): every target of FUZZ_ONLY in turn; the final stats (executions,
# cov, ft) are printed from each log
fuzz_run = @set -e; for t in $(FUZZ_ONLY); do \
	    mkdir -p $(FUZZ_BUILD)/corpus/$$t $(FUZZ_BUILD)/artifacts; \
	    dict=""; [ -f fuzz/$$t.dict ] && dict="-dict=fuzz/$$t.dict"; \
	    opts=""; [ -f fuzz/$$t.options ] && opts="$$(grep -v '^\#' fuzz/$$t.options)"; \
	    echo "== fuzz_$$t for $(1) s"; \
	    $(FUZZ_BUILD)/fuzz_$$t $(FUZZ_FLAGS) $$opts $$dict -max_total_time=$(1) \
	        -artifact_prefix=$(FUZZ_BUILD)/artifacts/$$t- \
	        $(FUZZ_BUILD)/corpus/$$t fuzz/corpus/$$t 2>$(FUZZ_BUILD)/fuzz_$$t.log \
	        || { tail -60 $(FUZZ_BUILD)/fuzz_$$t.log; echo "fuzz_$$t FAILED (log: $(FUZZ_BUILD)/fuzz_$$t.log)"; exit 1; }; \
	    grep -E '^(\#[0-9]+[[:space:]]+DONE|Done|stat::number_of_executed_units)' $(FUZZ_BUILD)/fuzz_$$t.log || true; \
	done

fuzz: fuzz-build
	$(call fuzz_run,$(FUZZ_SECONDS))

fuzz-long: fuzz-build
	$(call fuzz_run,$(FUZZ_LONG_SECONDS))

# ---- sanitizers: `make asan` builds library, CLI and tests with ASan + UBSan into
# build-asan/ and runs the whole test suite; any report fails it. CC=clang or gcc.
ASAN_BUILD ?= build-asan
ASAN_SAN   := -fsanitize=address,undefined -fno-omit-frame-pointer
asan:
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
	 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	 $(MAKE) --no-print-directory BUILD=$(ASAN_BUILD) NO_CUDA=1 OPT="-O1" \
	    EXTRA_CFLAGS="$(ASAN_SAN) -fno-sanitize-recover=undefined" EXTRA_LDFLAGS="$(ASAN_SAN)" test

# ---- ThreadSanitizer on what runs threads against each other: the writer's lanes, the
# readers of byte ranges and of one file's hash, and the CLI converting a fixture with
# several lanes (DCP ranks, HF shards, SHA-256) and verifying it. Any report fails it.
TSAN_BUILD ?= build-tsan
TSAN_TESTS := test_writer test_writer_pool test_hashfile test_read_ranges test_read_ranges_zst
TSAN_RUNS  := "--world-size 8" "--world-size 3 --sha256" "--layout hf --max-shard-size 64K"
TSAN_FIXTURES := fixtures/mxfp4-tiny fixtures/moe-dsv3-fp8
tsan:
	@$(MAKE) --no-print-directory BUILD=$(TSAN_BUILD) NO_CUDA=1 OPT="-O1" \
	    EXTRA_CFLAGS="-fsanitize=thread" EXTRA_LDFLAGS="-fsanitize=thread" \
	    $(TSAN_BUILD)/bfshard $(TSAN_TESTS:%=$(TSAN_BUILD)/tests/%)
	@set -e; export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1; \
	 for t in $(TSAN_TESTS); do echo "== tsan $$t"; $(TSAN_BUILD)/tests/$$t >$(TSAN_BUILD)/$$t.log 2>&1 || \
	     { tail -40 $(TSAN_BUILD)/$$t.log; echo "tsan: $$t FAILED"; exit 1; }; done; \
	 o=$$(mktemp -d); trap 'rm -rf "$$o"' EXIT; \
	 for f in $(TSAN_FIXTURES); do for a in $(TSAN_RUNS); do echo "== tsan convert $$f $$a, verify"; rm -rf "$$o/out"; \
	     $(TSAN_BUILD)/bfshard convert $$f "$$o/out" --device cpu -q -T 4 $$a && \
	     $(TSAN_BUILD)/bfshard verify "$$o/out" -q || { echo "tsan: convert $$f $$a FAILED"; exit 1; }; done; done; \
	 echo "tsan: clean"

# ---- valgrind (memcheck) on a subset: the safetensors tests, and the CLI converting
# and verifying every fixture. Uses the normal build.
VALGRIND ?= valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect -q
valgrind: all $(BUILD)/tests/test_safetensors
	$(VALGRIND) $(BUILD)/tests/test_safetensors
	@set -e; for f in $(filter-out fixtures/expected fixtures/refuse,$(patsubst %/,%,$(wildcard fixtures/*/))); do \
	    echo "== valgrind: convert + verify $$f"; \
	    $(VALGRIND) $(BUILD)/bfshard convert $$f $(BUILD)/valgrind-out --world-size 3 --device cpu \
	        --threads 2 --mem 64K --force --quiet; \
	    $(VALGRIND) $(BUILD)/bfshard verify $(BUILD)/valgrind-out --quiet; \
	done; rm -rf $(BUILD)/valgrind-out

# ---- benchmark: `make bench` (docs/BENCHMARKS.md; bench/bench.py says what each figure is). It
# writes its figures to bench/out/, docs/bench-results.md and README.md's results table.
# Knobs: LAYERS (gpt-oss MXFP4 layers, 24 = gpt-oss-20b), BNB_LAYERS (Llama-3-8B-shaped NF4
# layers, 32 = the real model), VOCAB (embedding rows, 0 = the real models'), WORLD (ranks),
# REPEAT (rounds of every timed run), PY=0 (skip the upstream Python path), PY_LAYERS (layers
# the Python path converts, 0 = all), CHECK=1 (bit-compare upstream and bfshard), RSS_LAYERS,
# MEM_LAYERS (sizes for the predicted-peak-RSS check),
# KEEP_DATA=0 (delete build/bench-data afterwards), BENCH_VENV (an existing venv to use),
# SCALE_LAYERS (DeepSeek-V3-named layers of the 92k-tensor scale case, 0 skips), SCALE_WORLDS,
# LOAD_LAYERS (gpt-oss layers of the load case, 0 skips).
LAYERS     ?= 2
BNB_LAYERS ?= 2
VOCAB      ?= 32000
WORLD      ?= 8
REPEAT     ?= 3
PY         ?= 1
PY_LAYERS  ?= 1
CHECK      ?= 0
RSS_LAYERS ?= 1,4
MEM_LAYERS ?= 1,4
KEEP_DATA  ?= 1
TINY       ?= 200000
SCALE_LAYERS ?= 61
SCALE_WORLDS ?= 8,64,256
LOAD_LAYERS ?= 1
BENCH_VENV ?= $(BUILD)/bench-venv
bench: all
	@bench/setup.sh $(BENCH_VENV)
	@mkdir -p $(BUILD)/bench
	$(CC) $(CFLAGS) -Ikernels -o $(BUILD)/bench/threads_bench bench/threads_bench.c $(BUILD)/libbfshard.a $(LIBS) $(LDFLAGS)
	@if [ -f bench/kernels_bench.c ]; then \
	    $(CC) $(CFLAGS) -Ikernels -o $(BUILD)/bench/kernels_bench bench/kernels_bench.c $(BUILD)/libbfshard.a $(LIBS) $(LDFLAGS) \
	    || { rm -f $(BUILD)/bench/kernels_bench; echo "bench: bench/kernels_bench.c does not build yet: skipped"; }; \
	else rm -f $(BUILD)/bench/kernels_bench; fi
	$(BENCH_VENV)/bin/python bench/bench.py --build $(BUILD) --python $(BENCH_VENV)/bin/python \
	    --layers $(LAYERS) --bnb-layers $(BNB_LAYERS) --vocab $(VOCAB) --world $(WORLD) --repeat $(REPEAT) \
	    --py $(PY) --py-layers $(PY_LAYERS) --check $(CHECK) --rss-layers "$(RSS_LAYERS)" --mem-layers "$(MEM_LAYERS)" --keep-data $(KEEP_DATA) --tiny $(TINY) \
	    --scale-layers $(SCALE_LAYERS) --scale-worlds "$(SCALE_WORLDS)" --load-layers $(LOAD_LAYERS) \
	    --docs docs/bench-results.md --readme README.md

# only the load case of make bench (bench/load_tmpfs.py): gpt-oss-shaped output (LOAD_LAYERS
# layers) for W=2 on tmpfs read by the readinto floor, safetensors, fastsafetensors, Run:ai's
# streamer and bfshard.torch.load, best of 2 rounds; then on disk from a cold cache vs dd. Writes
# bench/out/load/ (`python3 bench/results_md.py --add bench/out/load/latest.json` puts its rows
# beside the last full run's in docs/bench-results.md and README.md)
.PHONY: bench-load
bench-load: all
	@bench/setup.sh $(BENCH_VENV)
	$(BENCH_VENV)/bin/python bench/bench.py --build $(BUILD) --python $(BENCH_VENV)/bin/python --out bench/out/load \
	    --kernels 0 --layers 0 --bnb-layers 0 --fp8-layers 0 --py 0 --rss-layers "" --mem-layers "" --tiny 0 \
	    --scale-layers 0 --partio-layers 0 --loader 0 --node 0 --load-layers $(LOAD_LAYERS)

# only the node case of make bench (bench/node.py): W=8 and --layout hf to tmpfs against
# nproc concurrent dd writers, median of 3 interleaved rounds, PASS at >= 0.6x
.PHONY: bench-node
bench-node: all
	@bench/setup.sh $(BENCH_VENV)
	$(BENCH_VENV)/bin/python bench/node.py --build $(BUILD) --python $(BENCH_VENV)/bin/python

# ---- interop: `make interop` proves the output loads in the real consumers
# (safetensors, FSDP2 + torch.distributed.checkpoint, transformers, torch's own
# consolidation) against the upstream dequant. Creates $(BUILD)/interop-venv from PyPI
# on first use (~3 GB, the only step that needs the network). See tests/interop/run.sh.
interop: all
	@tests/interop/run.sh $(BUILD)

# ---- what the GPU would run, checked without one. Every kernel's PTX (per
# architecture built) and SASS (the build's own objects) has no float FMA, no FTZ, no
# approximation; negative controls (--fmad=true, -ftz=true) must be caught. make test runs
# it on every CUDA build (dev/cuda/exactness.py; cuobjdump from NVIDIA's PyPI wheel).
.PHONY: check-cuda-exact
ifeq ($(HAVE_CUDA),1)
check-cuda-exact: $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
	@python3 dev/cuda/exactness.py --build $(BUILD) --nvcc $(NVCC) --archs "$(CU_ARCHS)" \
	    --flags "-O2 -std=c++17 -Iinclude $(EXTRA_NVFLAGS) $(NVFLAGS_EXACT)" $(CU_SRC)
# dev/cuda/build.sh, which gpu-check.sh runs on a GPU machine: its own link of the kernels and
# the CUDA backend (its kernel list held to kernels/*.cu, the library files they need)
.PHONY: check-cuda-dev
check-cuda-dev:
	@dev/cuda/build.sh link > $(BUILD)/check-cuda-dev.log 2>&1 || \
	    { tail -20 $(BUILD)/check-cuda-dev.log; echo "FAILED: dev/cuda/build.sh link"; exit 1; }
	@echo "check-cuda-dev: dev/cuda/build.sh link: kernels and backend link, 0 devices reported"
else
check-cuda-exact:
	@echo "check-cuda-exact: SKIP: no nvcc (a build without CUDA has no device code)"
check-cuda-dev:
	@echo "check-cuda-dev: SKIP: no nvcc"
endif

# ---- the CUDA backend under the emulated runtime (no GPU needed): `make test-cuda-emu`
# builds bfshard and tests/test_cuda.c with the kernels' host emulation and the strict fake
# runtime of dev/cuda/emu/ into $(BUILD)/cuda-emu/, runs the CUDA tests, then converts every
# fixture in every layout on --device cuda and --device cpu and compares the files byte for
# byte (dev/cuda/emu-check.sh). Fails on any difference. Needs nvcc (the CUDA headers).
EMU_BUILD := $(BUILD)/cuda-emu
.PHONY: test-cuda-emu
ifeq ($(HAVE_CUDA),1)
EMU_NVFLAGS := -O2 -std=c++17 -Iinclude -gencode arch=compute_75,code=sm_75 $(NVFLAGS_EXACT) \
               -DBFS_CUDA_EMULATE=1 -DBFS_HAVE_CUDA=1
EMU_OBJ := $(filter-out $(CUDA_C_SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.cu.o),$(LIB_OBJ)) \
           $(CUDA_C_SRC:src/backend/%.c=$(EMU_BUILD)/%.o) $(CU_SRC:kernels/%.cu=$(EMU_BUILD)/%.cu.o) $(EMU_BUILD)/fake_cudart.o
EMU_LIBS := $(filter-out -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt,$(LIBS))

$(EMU_BUILD)/%.cu.o: kernels/%.cu $(wildcard kernels/*.h kernels/*.cuh) | deps
	@mkdir -p $(@D)
	$(NVCC) $(EMU_NVFLAGS) -c $< -o $@
$(CUDA_C_SRC:src/backend/%.c=$(EMU_BUILD)/%.o): $(EMU_BUILD)/%.o: src/backend/%.c $(HDRS) | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -DBFS_CUDA_EMULATE=1 -c $< -o $@
$(EMU_BUILD)/fake_cudart.o: dev/cuda/emu/fake_cudart.c kernels/common.cuh | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@
$(EMU_BUILD)/bfshard: $(CLI_OBJ) $(EMU_OBJ)
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(EMU_OBJ) $(EMU_LIBS)
$(EMU_BUILD)/test_cuda: tests/test_cuda.c $(TEST_COMMON) $(EMU_OBJ) tests/testutil.h | deps
	$(CC) $(CFLAGS) -DBFS_CUDA_EMULATE=1 -Isrc -o $@ $< $(TEST_COMMON) $(EMU_OBJ) $(EMU_LIBS) -lcmocka $(LDFLAGS)

test-cuda-emu: $(EMU_BUILD)/bfshard $(EMU_BUILD)/test_cuda
	@dev/cuda/emu-check.sh $(EMU_BUILD)
else
test-cuda-emu:
	@echo "test-cuda-emu: SKIP: no nvcc (the emulated CUDA build needs the CUDA toolkit's nvcc and headers)"
endif

# make install, the shared library, the man page, the Python package: mk/install.mk
include mk/install.mk
