# libdsa - GNU Make build. `make` builds build/libdsa.a and build/libdsa.so; `make test` runs every
# Criterion suite; `make run` runs the end-to-end DSA layer; `make install PREFIX=...` installs.
# Usual variables: CUDA_HOME NVCC CC CFLAGS NVCCFLAGS PREFIX DESTDIR LIBDIR INCLUDEDIR ARCH.

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

VERSION := $(shell sed -n 's/^\#define DSA_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' include/dsa.h | paste -sd. -)

CFLAGS    ?= -O2 -g
CFLAGS    += -std=c99 -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -Iinclude -Isrc -I$(CUDA_HOME)/include -fvisibility=hidden
NVCCFLAGS ?= -O3 -lineinfo
NVCCFLAGS += -std=c++17 $(ARCH) -Iinclude -Isrc -DCUB_WRAPPED_NAMESPACE=dsa_cub \
             -Xcompiler -fvisibility=hidden -Xcompiler -Wall --expt-relaxed-constexpr
LDLIBS_CUDA := -L$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++ -lm
RPATH_CUDA  := -Wl,-rpath,$(CUDA_HOME)/lib64

SRC_C  := $(sort $(wildcard src/*.c))
SRC_CU := $(sort $(wildcard cuda/*.cu))
HDRS   := $(wildcard include/*.h src/*.h cuda/*.cuh)

OBJ_STATIC := $(SRC_C:%.c=$(BUILD)/static/%.o) $(SRC_CU:%.cu=$(BUILD)/static/%.o)
OBJ_SHARED := $(SRC_C:%.c=$(BUILD)/shared/%.o) $(SRC_CU:%.cu=$(BUILD)/shared/%.o)

LIB_A  := $(BUILD)/libdsa.a
LIB_SO := $(BUILD)/libdsa.so

TEST_SRC := $(sort $(wildcard tests/*.c))
TEST_BIN := $(BUILD)/tests/dsa_tests
CRITERION_LIBS = $(shell pkg-config --libs criterion 2>/dev/null || echo -lcriterion)

BENCH_COMMON := bench/bench_common.c
BENCH_SRC := $(filter-out $(BENCH_COMMON),$(sort $(wildcard bench/*.c)))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all test check-criterion check-install run bench plots install uninstall clean sanitize
all: $(LIB_A) $(LIB_SO)

$(BUILD)/static/src/%.o: src/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
$(BUILD)/shared/src/%.o: src/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -c $< -o $@
$(BUILD)/static/cuda/%.o: cuda/%.cu $(HDRS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
$(BUILD)/shared/cuda/%.o: cuda/%.cu $(HDRS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Xcompiler -fPIC -c $< -o $@

$(LIB_A): $(OBJ_STATIC)
	@rm -f $@
	$(AR) rcs $@ $^
$(LIB_SO): $(OBJ_SHARED)
	$(CC) -shared -o $@ $^ -Wl,-soname,libdsa.so.$(firstword $(subst ., ,$(VERSION))) $(LDLIBS_CUDA)

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

$(TEST_BIN): $(TEST_SRC) tests/test_common.h $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $(TEST_SRC) $(LIB_A) $(CRITERION_LIBS) $(LDLIBS_CUDA) $(RPATH_CUDA)

test: check-criterion
	@$(MAKE) --no-print-directory $(TEST_BIN)
	$(TEST_BIN) --jobs $(JOBS) $(TEST_ARGS)

# GPU suites under compute-sanitizer (needs a GPU machine).
SANITIZE_TOOLS ?= memcheck racecheck initcheck synccheck
sanitize: check-criterion
	@$(MAKE) --no-print-directory $(TEST_BIN)
	@for t in $(SANITIZE_TOOLS); do \
	  echo "== compute-sanitizer --tool $$t"; \
	  compute-sanitizer --tool $$t --error-exitcode 1 --target-processes all $(TEST_BIN) --jobs 1 --filter 'gpu*/*' $(TEST_ARGS) || exit 1; \
	done

# ---- main job and benchmarks ---------------------------------------------------------------------
$(BUILD)/bench/%: bench/%.c $(BENCH_COMMON) bench/bench_common.h $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Ibench -o $@ $< $(BENCH_COMMON) $(LIB_A) $(LDLIBS_CUDA) $(RPATH_CUDA)

run: $(BUILD)/bench/dsa_layer
	$(BUILD)/bench/dsa_layer $(RUN_ARGS)

bench: $(BUILD)/bench/dsa_bench
	$(BUILD)/bench/dsa_bench $(if $(SHAPES),--shapes $(SHAPES))

plots:
	@command -v gnuplot >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnuplot-nox; } || { echo "install gnuplot: sudo apt-get install gnuplot-nox"; exit 1; }
	bench/plot.sh

# ---- install -------------------------------------------------------------------------------------
$(BUILD)/dsa.pc: Makefile
	@mkdir -p $(dir $@)
	@printf 'prefix=%s\nlibdir=%s\nincludedir=%s\ncudalibdir=%s\n\nName: dsa\nDescription: DeepSeek Sparse Attention kernels for Hopper\nVersion: %s\nCflags: -I$${includedir} -I%s\nLibs: -L$${libdir} -ldsa\nLibs.private: -L$${cudalibdir} -lcublas -lcudart -lstdc++ -lm -Wl,-rpath,$${cudalibdir}\n' \
	  '$(PREFIX)' '$(LIBDIR)' '$(INCLUDEDIR)' '$(CUDA_HOME)/lib64' '$(VERSION)' '$(CUDA_HOME)/include' > $@

install: all $(BUILD)/dsa.pc
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PKGCONFIGDIR)
	install -m 644 include/dsa.h $(DESTDIR)$(INCLUDEDIR)/dsa.h
	install -m 644 $(LIB_A) $(DESTDIR)$(LIBDIR)/libdsa.a
	install -m 755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/libdsa.so.$(VERSION)
	ln -sf libdsa.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libdsa.so.$(firstword $(subst ., ,$(VERSION)))
	ln -sf libdsa.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libdsa.so
	install -m 644 $(BUILD)/dsa.pc $(DESTDIR)$(PKGCONFIGDIR)/dsa.pc

# Installs into a scratch prefix and builds a strict C99 program against libdsa.a through
# `pkg-config --static --libs dsa` (the shared library is removed from the scratch prefix so -ldsa
# can only resolve to the static archive).
CHECK_PREFIX = $(abspath $(BUILD)/install-check)
check-install:
	@rm -rf $(CHECK_PREFIX)
	@$(MAKE) --no-print-directory install PREFIX=$(CHECK_PREFIX) >/dev/null
	rm -f $(CHECK_PREFIX)/lib/libdsa.so*
	gcc -std=c99 -Wall -Wextra -Wpedantic -Werror tests/install/example.c -o $(CHECK_PREFIX)/example \
	  $$(PKG_CONFIG_PATH=$(CHECK_PREFIX)/lib/pkgconfig pkg-config --cflags --static --libs dsa)
	@! ldd $(CHECK_PREFIX)/example | grep -q libdsa || { echo "example linked libdsa dynamically"; exit 1; }
	$(CHECK_PREFIX)/example

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/dsa.h $(DESTDIR)$(LIBDIR)/libdsa.a $(DESTDIR)$(LIBDIR)/libdsa.so* $(DESTDIR)$(PKGCONFIGDIR)/dsa.pc

clean:
	rm -rf $(BUILD)
