#!/bin/sh
# Builds and runs the CUDA pieces on their own, while the rest of libbfshard is
# being written, and on machines without a GPU. From the repository root:
#   dev/cuda/build.sh link   real kernels + backend + static cudart: a tiny main
#                            that must report 0 devices (no driver) without crashing
#   dev/cuda/build.sh emu    tests/test_cuda.c against the fake runtime
#                            (dev/cuda/emu): kernels emulated on the host
#   dev/cuda/build.sh dev    dev/cuda/*_dev.cu (needs a GPU to run)
#   dev/cuda/build.sh bench  dev/cuda/backend_bench.c: run()'s end-to-end GB/s (needs a GPU)
# Objects go to build/dev-cuda/. Flags are the Makefile's.
set -eu
what=${1:-link}
NVCC=${NVCC:-$(command -v nvcc)}
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
O=build/dev-cuda
mkdir -p "$O"
CFLAGS="-std=c11 -O2 -g -Wall -Wextra -Wshadow -Wno-unused-parameter -ffp-contract=off -fno-fast-math \
 -fno-strict-aliasing -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -Iinclude -Isrc -Itests -pthread"
NVFLAGS="-O2 -std=c++17 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true -Xcompiler -fno-fast-math,-ffp-contract=off -Iinclude \
 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90"

# The few library files the CUDA backend needs besides itself: errors (and the escaping of
# their messages), dtypes.
lib_support() {
    gcc $CFLAGS -c src/base/error.c -o $O/error.o
    gcc $CFLAGS -c src/base/escape.c -o $O/escape.o
    gcc $CFLAGS -c src/base/util.c -o $O/util.o
}
SUPPORT="$O/error.o $O/escape.o $O/util.o -ljansson"
# The CUDA backend's files (src/backend/backend_cuda*.c but the stub) taken from the tree as
# the Makefile takes them; the kernels listed, and the list held to kernels/*.cu, so that a
# new kernel cannot be left out of these links.
names() { for f in "$@"; do if [ -f "$f" ]; then basename "$f" ".${f##*.}"; fi; done; }
BACKEND=$(names src/backend/backend_cuda*.c | grep -vx backend_cuda_stub)
KERNELS="bnb4 cast ctmx fp8 int4 mxfp4 nvfp4 woq"
if [ "$(echo $KERNELS)" != "$(echo $(names kernels/*.cu))" ]; then
    echo "dev/cuda/build.sh: KERNELS ($KERNELS) is not kernels/*.cu ($(echo $(names kernels/*.cu)))" >&2
    exit 1
fi
# the CPU kernels for the emulated test's reference, by instruction set as in the Makefile
KCPU=$(names kernels/cpu_scalar.c kernels/cpu_dispatch.c)
KAVX2=$(names kernels/cpu_avx2*.c)
KAVX512=$(names kernels/cpu_avx512*.c)
objs() { for x in $1; do printf '%s ' "$O/$x$2"; done; }

case $what in
link)
    for k in $KERNELS; do "$NVCC" $NVFLAGS -c kernels/$k.cu -o $O/$k.cu.o; done
    for f in $BACKEND; do gcc $CFLAGS -DBFS_HAVE_CUDA=1 -I"$CUDA_HOME/include" -c src/backend/$f.c -o $O/$f.o; done
    lib_support
    gcc $CFLAGS -Isrc -c dev/cuda/link_check.c -o $O/link_check.o
    gcc -pthread -o $O/link_check $O/link_check.o $(objs "$BACKEND" .o) $(objs "$KERNELS" .cu.o) \
        $SUPPORT -L"$CUDA_HOME/lib64" -lcudart_static -ldl -lrt -lstdc++
    $O/link_check
    ;;
emu)
    E="-DBFS_CUDA_EMULATE=1 -DBFS_HAVE_CUDA=1"
    for k in $KERNELS; do "$NVCC" $NVFLAGS $E -c kernels/$k.cu -o $O/$k.emu.o; done
    for f in $BACKEND; do gcc $CFLAGS $E -I"$CUDA_HOME/include" -c src/backend/$f.c -o $O/$f.emu.o; done
    gcc $CFLAGS -I"$CUDA_HOME/include" -c dev/cuda/emu/fake_cudart.c -o $O/fake_cudart.o
    lib_support
    gcc $CFLAGS -Isrc -c tests/testutil.c -o $O/testutil.o
    # the reference (bfs__ref_unit over the CPU kernels) every output is compared with
    gcc $CFLAGS -c src/backend/backend_cpu.c -o $O/backend_cpu.o
    for k in $KCPU; do gcc $CFLAGS -c kernels/$k.c -o $O/$k.o; done
    for k in $KAVX2; do gcc $CFLAGS -mavx2 -mf16c -mbmi2 -c kernels/$k.c -o $O/$k.o; done
    for k in $KAVX512; do
        gcc $CFLAGS -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mf16c -mbmi2 -c kernels/$k.c -o $O/$k.o
    done
    gcc $CFLAGS $E -Isrc -I"$CUDA_HOME/include" -c tests/test_cuda.c -o $O/test_cuda.emu.o
    gcc -pthread -o $O/test_cuda_emu $O/test_cuda.emu.o $O/testutil.o $(objs "$BACKEND" .emu.o) \
        $(objs "$KERNELS" .emu.o) $O/fake_cudart.o $SUPPORT \
        $O/backend_cpu.o $(objs "$KCPU $KAVX2 $KAVX512" .o) -lcmocka -lstdc++
    BFS_TEST_GPTOSS_ITEMS=${BFS_TEST_GPTOSS_ITEMS:-2} $O/test_cuda_emu
    ;;
dev)
    # checked against the scalar reference kernels (kernels/cpu_scalar.c)
    gcc $CFLAGS -c kernels/cpu_scalar.c -o $O/cpu_scalar.o
    for f in dev/cuda/*_dev.cu; do
        b=$(basename "$f" .cu)
        "$NVCC" -O3 -std=c++17 --fmad=false -Ikernels -gencode arch=compute_80,code=sm_80 \
            -gencode arch=compute_90,code=sm_90 -o $O/$b "$f" $O/cpu_scalar.o
        echo "built $O/$b"
    done
    ;;
bench)
    for k in $KERNELS; do "$NVCC" $NVFLAGS -c kernels/$k.cu -o $O/$k.cu.o; done
    for f in $BACKEND; do gcc $CFLAGS -DBFS_HAVE_CUDA=1 -I"$CUDA_HOME/include" -c src/backend/$f.c -o $O/$f.o; done
    lib_support
    gcc $CFLAGS -Isrc -c dev/cuda/backend_bench.c -o $O/backend_bench.o
    gcc -pthread -o $O/backend_bench $O/backend_bench.o $(objs "$BACKEND" .o) $(objs "$KERNELS" .cu.o) \
        $SUPPORT -L"$CUDA_HOME/lib64" -lcudart_static -ldl -lrt -lstdc++
    shift
    $O/backend_bench "$@"
    ;;
*)
    echo "usage: $0 link|emu|dev|bench" >&2
    exit 2
    ;;
esac
