# libdsa - GNU Make build. `make` builds build/libdsa.a and build/libdsa.so; `make test` runs every
# Criterion suite; `make run` runs the end-to-end DSA layer; `make examples` builds examples/;
# `make install PREFIX=...` installs (headers, both libraries, dsa.pc and dsa-static.pc).
# Usual variables: CUDA_HOME NVCC CC CFLAGS NVCCFLAGS PREFIX DESTDIR LIBDIR INCLUDEDIR ARCH JOBS V.
# Each build step prints one line (`  NVCC cuda/topk/topk.cu`, `  AR   build/libdsa.a`); V=1 prints
# the full commands instead.
# Every target builds with JOBS parallel jobs (default: every core); -jN on the command line wins,
# -j1 means one job.

CUDA_HOME  ?= /usr/local/cuda
NVCC       ?= $(CUDA_HOME)/bin/nvcc
CC         ?= cc
AR         ?= ar
PREFIX     ?= /usr/local
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
BUILD      ?= build
# sm_90a machine code (wgmma, setmaxnreg) plus compute_90 PTX so newer cards can JIT the portable paths.
ARCH       ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)

# Parallel by default (GNU Make 4.3 and newer): only the top-level make sets -j, so an explicit -jN
# (or -j1) on the command line overrides it, and sub-makes share the top level's job server (or run
# serially under -j1); a make that includes this one as a sub-make keeps its own setting.
# `make clean <targets>` stays serial (a parallel clean would race the build).
ifeq ($(MAKELEVEL),0)
ifeq ($(filter clean uninstall,$(MAKECMDGOALS)),)
MAKEFLAGS += -j$(JOBS)
endif
endif

# V=1: the full command lines; otherwise one progress line per step ($(call say,WHAT,FILE) starts
# a recipe line and silences it).
V ?= 0
ifeq ($(V),1)
say =
else
say = @printf '  %-5s%s\n' '$(1)' '$(2)';
endif

VERSION := $(shell sed -n 's/^\#define DSA_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' include/dsa.h | paste -sd. -)

CFLAGS    ?= -O2 -g
override CFLAGS += -std=c99 -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -Iinclude -Isrc -I$(CUDA_HOME)/include -fvisibility=hidden
NVCCFLAGS ?= -O3 -lineinfo
override NVCCFLAGS += -std=c++17 $(ARCH) -Iinclude -Isrc -Icuda -DCUB_WRAPPED_NAMESPACE=dsa_cub \
             -Xcompiler -fvisibility=hidden -Xcompiler -Wall --expt-relaxed-constexpr
LDLIBS_CUDA := -L$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++ -lm
RPATH_CUDA  := -Wl,-rpath,$(CUDA_HOME)/lib64
# libdsa.so's run-time search path (default: the toolkit's lib64). python/setup.py links the Python
# package's copy from the same objects with LIB_SO=build/python/libdsa.so SO_RPATH=-Wl,-rpath,'$ORIGIN'
# on the make command line: the package's loader finds the CUDA libraries by soname.
SO_RPATH   ?= $(RPATH_CUDA)

SRC_C  := $(sort $(wildcard src/*.c))
# cuda/<family>/*.cu: one folder per op family (attn_fwd, attn_bwd, topk, indexer, layout) and
# cuda/common/ for the headers they share; includes are relative to cuda/ (-Icuda).
SRC_CU := $(sort $(wildcard cuda/*/*.cu))
HDRS   := $(wildcard include/*.h src/*.h cuda/*/*.cuh)

# One compile of every file: position-independent objects under $(BUILD)/obj serve both the
# archive and the shared library (-fPIC changes only the host code; the device code, sm_90a SASS
# and compute_90 PTX, is the same with and without it).
OBJ_C  := $(SRC_C:%.c=$(BUILD)/obj/%.o)
OBJ_CU := $(SRC_CU:%.cu=$(BUILD)/obj/%.o)
OBJ    := $(OBJ_C) $(OBJ_CU)

LIB_A  := $(BUILD)/libdsa.a
LIB_SO := $(BUILD)/libdsa.so

TEST_SRC := $(sort $(wildcard tests/*.c))
TEST_BIN := $(BUILD)/tests/dsa_tests
CRITERION_LIBS = $(shell pkg-config --libs criterion 2>/dev/null || echo -lcriterion)

BENCH_COMMON := bench/bench_common.c
BENCH_SRC := $(filter-out $(BENCH_COMMON),$(sort $(wildcard bench/*.c)))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all test check-criterion check-install run bench plots status install uninstall clean sanitize
all: $(LIB_A) $(LIB_SO)

$(BUILD)/obj/src/%.o: src/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(CFLAGS) -fPIC -c $< -o $@
$(BUILD)/obj/cuda/%.o: cuda/%.cu $(HDRS)
	@mkdir -p $(dir $@)
	$(call say,NVCC,$<)$(NVCC) $(NVCCFLAGS) -Xcompiler -fPIC -c $< -o $@

$(LIB_A): $(OBJ)
	@rm -f $@
	$(call say,AR,$@)$(AR) rcs $@ $^
$(LIB_SO): $(OBJ)
	$(call say,LD,$@)$(CC) -shared -o $@ $^ -Wl,-soname,libdsa.so.$(firstword $(subst ., ,$(VERSION))) \
	  $(LDLIBS_CUDA) $(SO_RPATH)

# ---- tests -------------------------------------------------------------------------------------
# Criterion comes from apt-get when missing (as root), else we print the command to run.
check-criterion:
	@if ! printf '#include <criterion/criterion.h>\n' | $(CC) $(CFLAGS) -E -x c - >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make test: installing Criterion (libcriterion-dev) through apt-get"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libcriterion-dev) || exit 1; \
	  else \
	    echo "make test: Criterion is missing; install it with: sudo apt-get install libcriterion-dev"; exit 1; \
	  fi; \
	fi

$(TEST_BIN): $(TEST_SRC) tests/test_common.h tests/test_shared.h $(LIB_A)
	@mkdir -p $(dir $@)
	$(call say,CCLD,$@)$(CC) $(CFLAGS) -Itests -o $@ $(TEST_SRC) $(LIB_A) $(CRITERION_LIBS) $(LDLIBS_CUDA) \
	  $(RPATH_CUDA)

# After Criterion's synthesis the test binary prints a line counting the skipped tests as well
# (tests/test_summary.c): `Criterion: 123 passed, 0 failed, 130 skipped (without a CUDA device)`.
test: check-criterion
	@$(MAKE) --no-print-directory $(TEST_BIN)
	$(TEST_BIN) --jobs $(JOBS) $(TEST_ARGS)
	@$(MAKE) --no-print-directory test-python
	@$(MAKE) --no-print-directory sass-check

# The sm_90a machine code's check (tests/sass/check.sh): no instruction takes an odd uniform register
# pair as its memory descriptor (an illegal instruction on the GPU that only a GPU run finds). It needs
# cuobjdump and nvdisasm (the CUDA toolkit's, or pip's nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm;
# .ci/run installs those) and passes with a note without them.
.PHONY: sass-check
sass-check: $(LIB_A)
	@bash tests/sass/check.sh $(BUILD)/obj/cuda

# The Python package's suites (python/tests, pytest): the installed package when there is one
# (pip install ./python), else the checkout's python/libdsa with $(LIB_SO). They need torch and
# pytest (.ci/run installs both); without them make test says so and skips them.
PYTHON ?= python3
.PHONY: test-python
test-python: $(LIB_SO)
	@if $(PYTHON) -c "import torch, pytest" >/dev/null 2>&1; then \
	  cd python/tests && $(PYTHON) -m pytest -q -p no:cacheprovider; \
	else \
	  echo "make test: the Python suites (python/tests) need torch and pytest: $(PYTHON) -m pip install torch pytest"; \
	fi

# GPU suites under compute-sanitizer (needs a GPU machine). Every (tool, gpu_* test) pair is its own
# process, SANITIZE_JOBS at a time (racecheck first: it is the slowest), each under SANITIZE_TIMEOUT
# seconds, with DSA_TEST_SANITIZE=<tool>: the suites shrink their biggest shapes (same code paths)
# and gpu_large skips (multi-GB tensors). Under initcheck and racecheck the suites also skip the
# indexer's cuBLAS engine: those tools cannot follow cuBLAS's GEMM kernels (initcheck does not see
# their stores: tests/sanitize/initcheck_cublas.cu; racecheck reports hazards inside nvjet_*), and
# --kernel-name-exclude does not help (an excluded kernel's stores are not tracked either, and racecheck
# failed internally with it): tc_sanitize_skips_cublas() in tests/test_common.h, docs/reliability.md.
# SANITIZE_OPTS_<tool> adds options per tool. Logs: $(BUILD)/sanitize/<tool>.<suite>.<test>.log,
# concatenated per tool into $(BUILD)/sanitize/<tool>.log, and one summary line per tool. Any tool
# error (--error-exitcode), failed or crashed test, timeout, or a log without Criterion's synthesis
# line fails the target. SANITIZE_SUITES overrides the suite list (default: every gpu_* suite of
# `dsa_tests --list` except gpu_large); SANITIZE_FILTER, an extended regex matched against each
# "tool suite test" line, keeps only the matching processes (e.g. finishing a cut-off run; on the make
# command line write an end anchor as $$, since make expands $).
SANITIZE_TOOLS   ?= racecheck memcheck initcheck synccheck
SANITIZE_JOBS    ?= 8
SANITIZE_TIMEOUT ?= 560
SANITIZE_SUITES  ?=
SANITIZE_FILTER  ?=
SANITIZER        ?= $(CUDA_HOME)/bin/compute-sanitizer
SANITIZE_DIR     := $(BUILD)/sanitize
SANITIZE_OPTS_initcheck ?=
SANITIZE_OPTS_racecheck ?=
sanitize: check-criterion
	@$(MAKE) --no-print-directory $(TEST_BIN)
	@[ -x "$(SANITIZER)" ] || command -v "$(SANITIZER)" >/dev/null || { echo "make sanitize: $(SANITIZER) not found"; exit 1; }
	@rm -rf $(SANITIZE_DIR) && mkdir -p $(SANITIZE_DIR)
	@$(TEST_BIN) --list 2>/dev/null | awk '/^[A-Za-z0-9_]+: [0-9]+ test/ {s = $$1; sub(":", "", s); next} \
	  {t = $$NF; if (s != "") print s, t}' > $(SANITIZE_DIR)/tests.txt; \
	suites="$(SANITIZE_SUITES)"; \
	[ -n "$$suites" ] || suites=$$(awk '$$1 ~ /^gpu_/ && $$1 != "gpu_large" {print $$1}' $(SANITIZE_DIR)/tests.txt | uniq); \
	[ -n "$$suites" ] || { echo "make sanitize: no gpu_* suite found in $(TEST_BIN) --list"; exit 1; }; \
	echo "== compute-sanitizer: tools $(SANITIZE_TOOLS); suites" $$suites "; one process per test, $(SANITIZE_JOBS) at a time"; \
	for t in $(SANITIZE_TOOLS); do for s in $$suites; do awk -v s=$$s -v t=$$t '$$1 == s {print t, $$1, $$2}' $(SANITIZE_DIR)/tests.txt; done; done | \
	  { if [ -n '$(SANITIZE_FILTER)' ]; then grep -E '$(SANITIZE_FILTER)' || true; else cat; fi; } | \
	  xargs -P $(SANITIZE_JOBS) -L 1 sh -c 'l=$(SANITIZE_DIR)/$$0.$$1.$$2; b=$$(date +%s); \
	    case $$0 in initcheck) o="$(SANITIZE_OPTS_initcheck)";; racecheck) o="$(SANITIZE_OPTS_racecheck)";; *) o="";; esac; \
	    DSA_TEST_SANITIZE=$$0 timeout -k 10 $(SANITIZE_TIMEOUT) "$(SANITIZER)" --tool $$0 $$o --error-exitcode 99 \
	      --target-processes all $(TEST_BIN) --jobs 1 --filter "$$1/$$2" $(TEST_ARGS) >$$l.log 2>&1; \
	    echo $$? >$$l.rc; echo "   $$0 $$1/$$2: exit $$(cat $$l.rc) ($$(( $$(date +%s) - b )) s)"' ; \
	fail=0; \
	for t in $(SANITIZE_TOOLS); do \
	  n=0; bad=""; errs=0; tested=0; failing=0; \
	  for l in $$(ls $(SANITIZE_DIR)/$$t.*.log 2>/dev/null | grep -v "/$$t.log$$"); do \
	    l=$${l%.log}; n=$$((n + 1)); cat $$l.log >>$(SANITIZE_DIR)/$$t.all; \
	    rc=$$(cat $$l.rc 2>/dev/null || echo missing); \
	    e=$$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' $$l.log | awk '{s += $$1} END {print s + 0}'); \
	    errs=$$((errs + e)); \
	    syn=$$(grep 'Synthesis: Tested' $$l.log | tail -1); \
	    tested=$$((tested + $$(echo "$$syn" | sed -n 's/.*Tested: \([0-9]*\).*/\1/p' | awk '{print $$1 + 0}'))); \
	    failing=$$((failing + $$(echo "$$syn" | sed -n 's/.*Failing: \([0-9]*\).*Crashing: \([0-9]*\).*/\1 \2/p' | awk '{print $$1 + $$2 + 0}'))); \
	    if [ "$$rc" != 0 ] || [ -z "$$syn" ]; then \
	      why="exit $$rc"; [ "$$rc" = 124 ] && why="timeout $(SANITIZE_TIMEOUT) s"; [ -z "$$syn" ] && why="$$why, no synthesis"; \
	      bad="$$bad $${l##*/}($$why)"; fi; \
	  done; \
	  mv -f $(SANITIZE_DIR)/$$t.all $(SANITIZE_DIR)/$$t.log 2>/dev/null; \
	  if [ -n "$$bad" ] || [ "$$n" = 0 ] || [ "$$tested" = 0 ]; then fail=1; st=FAIL; else st=ok; fi; \
	  echo "== $$t: $$st: $$n test processes, $$tested tests, $$failing failing/crashing, $$errs sanitizer errors$${bad:+; failed:$$bad} (log $(SANITIZE_DIR)/$$t.log)"; \
	done; \
	exit $$fail

# ---- main job and benchmarks ---------------------------------------------------------------------
$(BUILD)/bench/%: bench/%.c $(BENCH_COMMON) bench/bench_common.h tests/test_shared.h $(LIB_A)
	@mkdir -p $(dir $@)
	$(call say,CCLD,$@)$(CC) $(CFLAGS) -Ibench -Itests -o $@ $< $(BENCH_COMMON) $(LIB_A) $(LDLIBS_CUDA) -ldl $(RPATH_CUDA)

# ---- dev/: standalone research programs (CUDA runtime only, never part of libdsa) ---------------
# dev/atomic_probe.cu: fp32 reduction throughput by access pattern (docs/bwd-sm90-next.md, P0);
# dev/barrier_probe.cu: racecheck on a named-barrier arrive / sync hand-off (docs/reliability.md 3c).
# dev/ring_probe.cu: per-slot fp32 rows through an L2 ring against det0's reductions (docs/bwd-sm90-v3.md VII).
DEV_BIN := $(BUILD)/dev/atomic_probe $(BUILD)/dev/barrier_probe $(BUILD)/dev/ring_probe
.PHONY: dev
dev: $(DEV_BIN)
$(BUILD)/dev/%: dev/%.cu dev/probe_common.cuh cuda/common/sm90_common.cuh
	@mkdir -p $(dir $@)
	$(call say,NVCC,$<)$(NVCC) -O3 -lineinfo -std=c++17 -gencode arch=compute_90a,code=sm_90a -o $@ $<

run: $(BUILD)/bench/dsa_layer
	$(BUILD)/bench/dsa_layer $(RUN_ARGS)

bench: $(BUILD)/bench/dsa_bench
	$(BUILD)/bench/dsa_bench $(if $(SHAPES),--shapes $(SHAPES))

# The README's charts (docs/img/bench-*.png) and its status table, both from the complete runs
# bench/results/*-full.json only (per card the newest): `make plots` draws the charts, `make status`
# draws them and rewrites the table between README.md's status-table markers.
plots:
	@command -v gnuplot >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnuplot-nox; } || { echo "install gnuplot: sudo apt-get install gnuplot-nox"; exit 1; }
	bench/plot.sh

status: plots
	python3 bench/status_table.py --readme README.md bench/results/*-full.json

# ---- install -------------------------------------------------------------------------------------
# Two pkg-config files: dsa.pc links libdsa.so (with an rpath to LIBDIR, so the program starts without
# LD_LIBRARY_PATH), dsa-static.pc names the archive itself (a -ldsa would pick the .so sitting in
# the same folder) plus the CUDA libraries. Both are regenerated whenever PREFIX, LIBDIR, INCLUDEDIR,
# CUDA_HOME or the version change: they depend on a stamp that is rewritten only when those differ.
PC_STAMP := $(BUILD)/pc.stamp
PC_VARS  := prefix=$(PREFIX) libdir=$(LIBDIR) includedir=$(INCLUDEDIR) cuda=$(CUDA_HOME) version=$(VERSION)
$(PC_STAMP): FORCE
	@mkdir -p $(dir $@)
	@[ -f $@ ] && [ "$$(cat $@)" = '$(PC_VARS)' ] || printf '%s\n' '$(PC_VARS)' > $@
.PHONY: FORCE
FORCE:
PC_FMT_HEAD := prefix=%s\nlibdir=%s\nincludedir=%s\ncudalibdir=%s\n\n
PC_FMT_BODY := Version: %s\nCflags: -I$${includedir} -I%s\n
PC_ARGS = '$(PREFIX)' '$(LIBDIR)' '$(INCLUDEDIR)' '$(CUDA_HOME)/lib64' '$(VERSION)' '$(CUDA_HOME)/include'
PC_CUDA_LIBS := -L$${cudalibdir} -lcublas -lcudart -lstdc++ -lm -Wl,-rpath,$${cudalibdir}
$(BUILD)/dsa.pc: $(PC_STAMP) Makefile
	@printf '$(PC_FMT_HEAD)Name: dsa\nDescription: DeepSeek Sparse Attention kernels for Hopper (shared library)\n$(PC_FMT_BODY)Libs: -L$${libdir} -Wl,-rpath,$${libdir} -ldsa\nLibs.private: $(PC_CUDA_LIBS)\n' \
	  $(PC_ARGS) > $@
$(BUILD)/dsa-static.pc: $(PC_STAMP) Makefile
	@printf '$(PC_FMT_HEAD)Name: dsa-static\nDescription: DeepSeek Sparse Attention kernels for Hopper (static library)\n$(PC_FMT_BODY)Libs: $${libdir}/libdsa.a $(PC_CUDA_LIBS)\n' \
	  $(PC_ARGS) > $@

install: all $(BUILD)/dsa.pc $(BUILD)/dsa-static.pc
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PKGCONFIGDIR)
	install -m 644 include/dsa.h $(DESTDIR)$(INCLUDEDIR)/dsa.h
	install -m 644 include/dsa_tune.h $(DESTDIR)$(INCLUDEDIR)/dsa_tune.h
	install -m 644 $(LIB_A) $(DESTDIR)$(LIBDIR)/libdsa.a
	install -m 755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/libdsa.so.$(VERSION)
	ln -sf libdsa.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libdsa.so.$(firstword $(subst ., ,$(VERSION)))
	ln -sf libdsa.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libdsa.so
	install -m 644 $(BUILD)/dsa.pc $(DESTDIR)$(PKGCONFIGDIR)/dsa.pc
	install -m 644 $(BUILD)/dsa-static.pc $(DESTDIR)$(PKGCONFIGDIR)/dsa-static.pc

# A fresh install into a scratch prefix, then the README's own two link lines (the lines of README.md
# that start with `gcc -std=c99 app.c`, with /opt/dsa -> the scratch prefix, app.c ->
# tests/install/example.c, app -> example-<kind>, plus -Wall -Wextra -Wpedantic -Werror): the
# static program must not depend on libdsa.so, the shared one must resolve it from the prefix
# through its rpath; both run (without LD_LIBRARY_PATH; example.c needs no GPU).
CHECK_PREFIX = $(abspath $(BUILD)/install-check)
check-install:
	@rm -rf $(CHECK_PREFIX)
	@$(MAKE) --no-print-directory install PREFIX=$(CHECK_PREFIX) >/dev/null
	@for kind in static shared; do \
	  pc=dsa; [ $$kind = static ] && pc=dsa-static; \
	  line=$$(grep -E "^gcc -std=c99 app\.c .*pkg-config --cflags --libs $$pc\)" README.md | head -1); \
	  [ -n "$$line" ] || { echo "check-install: README.md has no 'gcc -std=c99 app.c ... --libs $$pc)' line"; exit 1; }; \
	  cmd=$$(printf '%s\n' "$$line" | sed -e 's|/opt/dsa|$(CHECK_PREFIX)|g' -e 's|app\.c|tests/install/example.c|' \
	    -e "s|-o app |-o $(CHECK_PREFIX)/example-$$kind |"); \
	  echo "== $$kind, README line: $$line"; \
	  echo "   $$cmd -Wall -Wextra -Wpedantic -Werror"; \
	  sh -c "$$cmd -Wall -Wextra -Wpedantic -Werror" || exit 1; \
	done
	@if ldd $(CHECK_PREFIX)/example-static | grep -q libdsa; then echo "check-install: the static example needs libdsa.so:"; ldd $(CHECK_PREFIX)/example-static; exit 1; fi
	@ldd $(CHECK_PREFIX)/example-shared | grep -q "libdsa.so.[0-9]* => $(CHECK_PREFIX)/lib/libdsa.so" || \
	  { echo "check-install: the shared example does not resolve libdsa.so from $(CHECK_PREFIX)/lib:"; ldd $(CHECK_PREFIX)/example-shared; exit 1; }
	@echo "== ldd: example-static has no libdsa.so dependency; example-shared loads $$(ldd $(CHECK_PREFIX)/example-shared | grep -o '$(CHECK_PREFIX)/lib/libdsa.so[.0-9]*')"
	env -u LD_LIBRARY_PATH $(CHECK_PREFIX)/example-static
	env -u LD_LIBRARY_PATH $(CHECK_PREFIX)/example-shared

# ---- examples ----------------------------------------------------------------------------------
# examples/*.c: plain C99 programs against the public header and build/libdsa.a (the CUDA headers
# are -isystem: they are not pedantic-C99 clean). `make test` builds them first: suite examples runs
# train_step's CPU half (train_step --cpu), suite gpu_examples the whole program
# (tests/test_examples.c).
EXAMPLES_SRC := $(sort $(wildcard examples/*.c))
EXAMPLES_BIN := $(EXAMPLES_SRC:examples/%.c=$(BUILD)/examples/%)
.PHONY: examples
examples: $(EXAMPLES_BIN)
$(BUILD)/examples/%: examples/%.c include/dsa.h $(LIB_A)
	@mkdir -p $(dir $@)
	$(call say,CCLD,$@)$(CC) -std=c99 -O2 -g -Wall -Wextra -Wpedantic -Werror -Iinclude \
	  -isystem $(CUDA_HOME)/include -o $@ $< $(LIB_A) $(LDLIBS_CUDA) $(RPATH_CUDA)
test test-asan: examples

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/dsa.h $(DESTDIR)$(INCLUDEDIR)/dsa_tune.h $(DESTDIR)$(LIBDIR)/libdsa.a \
	  $(DESTDIR)$(LIBDIR)/libdsa.so* $(DESTDIR)$(PKGCONFIGDIR)/dsa.pc $(DESTDIR)$(PKGCONFIGDIR)/dsa-static.pc

clean:
	rm -rf $(BUILD)

# ---- reliability: ASan/UBSan host build and libFuzzer harnesses (docs/reliability.md) ----------
# `make test-asan`: src/*.c and every test suite rebuilt with ASan + UBSan into $(BUILD)/asan (the
# CUDA objects are the normal ones, uninstrumented), then the Criterion binary. Criterion forks per
# test, so a sanitizer report (it aborts the child) is a crashed, i.e. failed, test.
# `make fuzz FUZZ_SECONDS=60`: the libFuzzer harnesses of tests/fuzz/ (clang), each run for
# FUZZ_SECONDS on a corpus under $(BUILD)/fuzz; a crash, leak, timeout or OOM exits non-zero.
SAN_FLAGS     ?= -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
ASAN_BUILD    := $(BUILD)/asan
ASAN_OBJ      := $(SRC_C:%.c=$(ASAN_BUILD)/%.o)
ASAN_TEST_BIN := $(ASAN_BUILD)/dsa_tests
# protect_shadow_gap=0: cudart maps memory in ASan's shadow gap when a GPU is present.
ASAN_RUN_ENV  ?= ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:abort_on_error=1:halt_on_error=1 \
                 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:abort_on_error=1
CLANG         ?= clang
FUZZ_SECONDS  ?= 60
FUZZ_BUILD    := $(BUILD)/fuzz
FUZZ_SRC      := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN      := $(FUZZ_SRC:tests/fuzz/%.c=$(FUZZ_BUILD)/%)
FUZZ_OBJ      := $(SRC_C:%.c=$(FUZZ_BUILD)/%.o)
FUZZ_CFLAGS   := -O1 -g -std=c99 -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -Iinclude -Isrc \
                 -I$(CUDA_HOME)/include -fno-omit-frame-pointer -fno-sanitize-recover=undefined
# allocator_may_return_null + max_allocation_size_mb: a plan too large for the fuzzer's memory is a
# NULL malloc (DSA_ERROR_OUT_OF_HOST_MEMORY path), not a fuzzer OOM report.
FUZZ_RUN_ENV  ?= ASAN_OPTIONS=protect_shadow_gap=0:allocator_may_return_null=1:max_allocation_size_mb=64 \
                 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
FUZZ_ARGS     ?= -timeout=20 -rss_limit_mb=3072 -malloc_limit_mb=1024 -print_final_stats=1

.PHONY: test-asan fuzz fuzz-build
.SECONDARY: $(ASAN_OBJ) $(FUZZ_OBJ)
$(ASAN_BUILD)/src/%.o: src/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(call say,CC,$@)$(CC) $(CFLAGS) $(SAN_FLAGS) -c $< -o $@
$(ASAN_TEST_BIN): $(TEST_SRC) tests/test_common.h tests/test_shared.h $(ASAN_OBJ) $(OBJ_CU)
	@mkdir -p $(dir $@)
	$(call say,CCLD,$@)$(CC) $(CFLAGS) $(SAN_FLAGS) -Itests -o $@ $(TEST_SRC) $(ASAN_OBJ) $(OBJ_CU) \
	  $(CRITERION_LIBS) $(LDLIBS_CUDA) $(RPATH_CUDA)
test-asan: check-criterion
	@$(MAKE) --no-print-directory $(ASAN_TEST_BIN)
	$(ASAN_RUN_ENV) $(ASAN_TEST_BIN) --jobs 2 $(TEST_ARGS)

$(FUZZ_BUILD)/src/%.o: src/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(call say,CC,$@)$(CLANG) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,address,undefined -c $< -o $@
$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h $(FUZZ_OBJ) $(OBJ_CU)
	@mkdir -p $(dir $@)
	$(call say,CCLD,$@)$(CLANG) $(FUZZ_CFLAGS) -Itests/fuzz -fsanitize=fuzzer,address,undefined -o $@ $< $(FUZZ_OBJ) \
	  $(OBJ_CU) $(LDLIBS_CUDA) $(RPATH_CUDA)
fuzz-build: $(FUZZ_BIN)
fuzz: fuzz-build
	@for b in $(FUZZ_BIN); do \
	  n=$$(basename $$b); c=$(FUZZ_BUILD)/corpus_$${n#fuzz_}; seeds=tests/fuzz/corpus_$${n#fuzz_}; \
	  mkdir -p $$c $(FUZZ_BUILD)/artifacts; \
	  echo "== $$n for $(FUZZ_SECONDS) s (corpus $$c)"; \
	  $(FUZZ_RUN_ENV) $$b $(FUZZ_ARGS) -max_total_time=$(FUZZ_SECONDS) \
	    -artifact_prefix=$(FUZZ_BUILD)/artifacts/$$n- $$c $$( [ -d $$seeds ] && echo $$seeds ) || exit 1; \
	done
