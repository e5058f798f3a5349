# bfshard — installation, the shared library, the man page and the Python package's
# native parts. Included at the end of the Makefile, so LIB_SRC, KCPU_SRC, CU_SRC, CLI_OBJ,
# LIBS and HAVE_CUDA are already set.
#
#   make install [PREFIX=/usr/local] [DESTDIR=]   bin/bfshard, lib/libbfshard.so.0 + .a,
#                                                include/bfshard.h, lib/pkgconfig/bfshard.pc,
#                                                share/man/man1/bfshard.1, bash completion
#   make uninstall [PREFIX=] [DESTDIR=]           removes exactly those files
#   make test-install                             install into a temp PREFIX, build a C
#                                                consumer with pkg-config, render the man page
#   make python-native                            what the Python package bundles (python/)
#   make test-python                              pip install ./python in a fresh venv, and a
#                                                wheel in another, then python/tests/
#
# The shared library is built from its own -fPIC objects under $(BUILD)/pic/, so the
# static library, the CLI and the tests are built exactly as before.

PREFIX     ?= /usr/local
DESTDIR    ?=
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR     ?= $(PREFIX)/share/man
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
INSTALL    ?= install
SCDOC      ?= scdoc

BFS_VERSION := $(shell sed -n 's/^\#define BFS_VERSION_STRING "\(.*\)"/\1/p' include/bfshard.h)
BFS_SOMAJOR := $(shell sed -n 's/^\#define BFS_VERSION_MAJOR \([0-9]*\).*/\1/p' include/bfshard.h)
SONAME      := libbfshard.so.$(BFS_SOMAJOR)
SHLIB       := $(BUILD)/libbfshard.so.$(BFS_VERSION)

PIC_OBJ := $(LIB_OBJ:$(BUILD)/%=$(BUILD)/pic/%)

# The exported symbols are exactly the functions include/bfshard.h declares; everything
# else (bfs__*, the kernels, cudart_static) stays local to the library.
$(BUILD)/libbfshard.map: include/bfshard.h mk/install.mk
	@mkdir -p $(@D)
	@{ echo '{ global:'; grep -v '^typedef' include/bfshard.h | \
	   sed -n 's/^[a-z][a-z0-9_ ]*[ *]\(bfs_[a-z0-9_]*\)(.*/    \1;/p'; echo '  local: *; };'; } > $@

$(BUILD)/pic/%.o: %.c $(HDRS) | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -fPIC -c $< -o $@

$(KAVX2_SRC:%.c=$(BUILD)/pic/%.o): $(BUILD)/pic/%.o: %.c $(wildcard kernels/*.h) | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -fPIC -mavx2 -mf16c -mbmi2 -c $< -o $@

$(BUILD)/pic/src/base/xxh_avx2.o: src/base/xxh_avx2.c | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -fPIC -mavx2 -c $< -o $@

$(BUILD)/pic/kernels/cpu_avx512.o: kernels/cpu_avx512.c $(wildcard kernels/*.h) | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -fPIC -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mf16c -mbmi2 -c $< -o $@

$(BUILD)/pic/%.cu.o: %.cu $(wildcard kernels/*.h kernels/*.cuh) | deps
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) -Xcompiler -fPIC -c $< -o $@

$(SHLIB): $(PIC_OBJ) $(BUILD)/libbfshard.map
	$(CC) $(LDFLAGS) -shared -Wl,-soname,$(SONAME) -Wl,--version-script=$(BUILD)/libbfshard.map \
	    -Wl,--no-undefined -o $@ $(PIC_OBJ) $(LIBS)

$(BUILD)/$(SONAME) $(BUILD)/libbfshard.so: $(SHLIB)
	ln -sf $(notdir $(SHLIB)) $@

# pkg-config: Libs.private and Requires.private are what a static link needs.
BFS_PC_PRIVATE := -lm -pthread
ifeq ($(HAVE_CUDA),1)
BFS_PC_PRIVATE += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
endif
$(BUILD)/bfshard.pc: include/bfshard.h mk/install.mk
	@mkdir -p $(@D)
	@printf '%s\n' \
	    'prefix=$(PREFIX)' \
	    'exec_prefix=$${prefix}' \
	    'libdir=$(patsubst $(PREFIX)%,$${exec_prefix}%,$(LIBDIR))' \
	    'includedir=$(patsubst $(PREFIX)%,$${prefix}%,$(INCLUDEDIR))' \
	    '' \
	    'Name: bfshard' \
	    'Description: quantized Hugging Face checkpoints (MXFP4, bitsandbytes NF4/FP4) to BF16 FSDP rank shards' \
	    'Version: $(BFS_VERSION)' \
	    'Requires.private: jansson libxxhash libzstd libcrypto' \
	    'Cflags: -I$${includedir}' \
	    'Libs: -L$${libdir} -lbfshard' \
	    'Libs.private: $(BFS_PC_PRIVATE)' > $@

# The man page: doc/bfshard.1.scd is the source, scdoc renders it.
$(BUILD)/bfshard.1: doc/bfshard.1.scd
	@mkdir -p $(@D)
	@command -v $(SCDOC) >/dev/null 2>&1 || scripts/install-deps.sh --install
	$(SCDOC) < $< > $@

.PHONY: shared man install uninstall test-install python-native test-python
shared: $(SHLIB) $(BUILD)/$(SONAME) $(BUILD)/libbfshard.so
man: $(BUILD)/bfshard.1

# $(BUILD)/bfshard.pc embeds PREFIX: always rewritten by install.
install: all shared man
	@rm -f $(BUILD)/bfshard.pc && $(MAKE) --no-print-directory $(BUILD)/bfshard.pc
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR) \
	    $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(BASHCOMPDIR)
	$(INSTALL) -m 755 $(BUILD)/bfshard $(DESTDIR)$(BINDIR)/bfshard
	$(INSTALL) -m 755 $(SHLIB) $(DESTDIR)$(LIBDIR)/$(notdir $(SHLIB))
	ln -sf $(notdir $(SHLIB)) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libbfshard.so
	$(INSTALL) -m 644 $(BUILD)/libbfshard.a $(DESTDIR)$(LIBDIR)/libbfshard.a
	$(INSTALL) -m 644 include/bfshard.h $(DESTDIR)$(INCLUDEDIR)/bfshard.h
	$(INSTALL) -m 644 $(BUILD)/bfshard.pc $(DESTDIR)$(LIBDIR)/pkgconfig/bfshard.pc
	$(INSTALL) -m 644 $(BUILD)/bfshard.1 $(DESTDIR)$(MANDIR)/man1/bfshard.1
	$(INSTALL) -m 644 doc/bfshard.bash-completion $(DESTDIR)$(BASHCOMPDIR)/bfshard
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" -eq 0 ] && command -v ldconfig >/dev/null 2>&1; then \
	    ldconfig || true; fi

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/bfshard \
	    $(DESTDIR)$(LIBDIR)/$(notdir $(SHLIB)) $(DESTDIR)$(LIBDIR)/$(SONAME) \
	    $(DESTDIR)$(LIBDIR)/libbfshard.so $(DESTDIR)$(LIBDIR)/libbfshard.a \
	    $(DESTDIR)$(INCLUDEDIR)/bfshard.h $(DESTDIR)$(LIBDIR)/pkgconfig/bfshard.pc \
	    $(DESTDIR)$(MANDIR)/man1/bfshard.1 $(DESTDIR)$(BASHCOMPDIR)/bfshard

test-install: all shared man
	@tests/install/run.sh $(BUILD)

# ---- the Python package's native parts (python/setup.py runs this) -------------------
# $(PY_NATIVE)/ holds what the package bundles, so the wheel needs none of the -dev or
# runtime packages of jansson, xxhash, zstd and OpenSSL's libcrypto:
#   _libbfshard.so  the library and python/bfshard_abi.c (struct layouts, checked by the
#                   ctypes binding at import). xxhash is linked in from its static archive
#                   and hidden (--exclude-libs); Debian's libjansson.a and libzstd.a are not
#                   -fPIC, so those two, and OpenSSL's libcrypto.so.3 (SHA-256), are copied
#                   beside it (libjansson.so.4, libzstd.so.1, libcrypto.so.3) and found
#                   through RUNPATH $ORIGIN. bundle.txt lists the files to ship.
#   bfshard         the CLI: all four linked in from their static archives.
# Left to the system: libc, libm, libgcc_s and libstdc++ (CUDA), all in the manylinux policy.
PY_NATIVE    := $(BUILD)/python
PY_BUNDLED   := jansson zstd crypto
PY_LIB_LIBS  := -Wl,-Bstatic -lxxhash -Wl,-Bdynamic -ljansson -lzstd -lcrypto \
                $(filter-out -ljansson -lxxhash -lzstd -lcrypto,$(LIBS))
PY_CLI_LIBS  := -Wl,-Bstatic -ljansson -lxxhash -lzstd -lcrypto -Wl,-Bdynamic \
                $(filter-out -ljansson -lxxhash -lzstd -lcrypto,$(LIBS))

$(PY_NATIVE)/libbfshard_py.map: $(BUILD)/libbfshard.map
	@mkdir -p $(@D)
	sed 's/global:/global:\n    bfs_py_abi_layout;\n    bfs_py_version;/' $< > $@

$(PY_NATIVE)/bfshard_abi.o: python/bfshard_abi.c include/bfshard.h | deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -fPIC -c $< -o $@

$(PY_NATIVE)/_libbfshard.so: $(PIC_OBJ) $(PY_NATIVE)/bfshard_abi.o $(PY_NATIVE)/libbfshard_py.map
	$(CC) $(LDFLAGS) -shared -Wl,--version-script=$(PY_NATIVE)/libbfshard_py.map -Wl,--exclude-libs,ALL \
	    -Wl,--no-undefined -Wl,--enable-new-dtags -Wl,-rpath,'$$ORIGIN' \
	    -o $@ $(PIC_OBJ) $(PY_NATIVE)/bfshard_abi.o $(PY_LIB_LIBS)
	@set -e; cd $(@D) && rm -f $(PY_BUNDLED:%=lib%.so*) && echo _libbfshard.so > bundle.txt; \
	for l in $(PY_BUNDLED); do \
	    so=$$(ldd $(@F) | awk -v l="lib$$l.so" 'index($$1, l) == 1 { print $$3 }'); \
	    [ -f "$$so" ] || { echo "python-native: lib$$l.so not found by ldd $@" >&2; exit 1; }; \
	    echo "python-native: bundling $$so"; cp -L "$$so" . && basename "$$so" >> bundle.txt; \
	done

$(PY_NATIVE)/bfshard: $(CLI_OBJ) $(BUILD)/libbfshard.a
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libbfshard.a $(PY_CLI_LIBS)

python-native: deps $(PY_NATIVE)/_libbfshard.so $(PY_NATIVE)/bfshard

test-python: all
	@python/tests/run.sh $(BUILD)
