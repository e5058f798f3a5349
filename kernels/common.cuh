/*
 * Shared by the CUDA kernels (the .cu files beside it, C++ under nvcc) and the
 * CUDA backend's host side (src/backend_cuda.c, C under gcc): the error macros, the
 * launchers' C interface, and on the device side a few helpers. Kernel-level types
 * only: src/backend_cuda.c translates the library's tensors and units into them.
 *
 * Launchers take device pointers and a stream, enqueue, and return 0 or
 * BFS_EDEVICE (message through bfs__err naming the kernel). Every device
 * pointer they take must be 256-byte aligned (cudaMalloc'd arena offsets), so
 * vector loads and stores never need a check on the host side.
 *
 * Building with -DBFS_CUDA_EMULATE turns every launcher into a host emulation
 * of the same kernel code (each block's threads run phase by phase, with the
 * same shared memory layout), enqueued on the fake runtime of dev/cuda/emu/.
 * That is how the index arithmetic is tested on machines without a GPU.
 */
#ifndef BFS_KERNELS_COMMON_CUH
#define BFS_KERNELS_COMMON_CUH

/* System headers first, outside extern "C", so the includes below are no-ops. */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "bfshard.h"     /* the BFS_E* codes (public header; no src/ header here) */
#include "bfs_kernels.h" /* bfs_cast_src */

#ifdef __cplusplus
extern "C" {
#endif

/* The launchers report through the library's error recorder (src/error.c). src/bfs_internal.h
 * declares it as well; src/backend_cuda.c includes both, so the compiler checks they agree. */
int bfs__err(int code, const char *fmt, ...);

/* ---- errors ---------------------------------------------------------------
 * BFS_CUDA_ERR(e, "what") records "CUDA error in what: cudaErrorX (text) at
 * file:line" and evaluates to BFS_EDEVICE.
 * CUDA_CHECK(call) needs `int rc` and a `cleanup:` label (as BFS_TRY does);
 * CUDA_CHECK_RET(call) returns BFS_EDEVICE from the enclosing function. */
#define BFS_CUDA_ERR(e, what)                                                              \
    bfs__err(BFS_EDEVICE, "CUDA error in %s: %s (%s) at %s:%d", (what), cudaGetErrorName(e), \
             cudaGetErrorString(e), __FILE__, __LINE__)

#define CUDA_CHECK(call)                                                                   \
    do {                                                                                   \
        const cudaError_t bfs_cu_e_ = (call);                                              \
        if (bfs_cu_e_ != cudaSuccess) {                                                    \
            rc = BFS_CUDA_ERR(bfs_cu_e_, #call);                                           \
            goto cleanup;                                                                  \
        }                                                                                  \
    } while (0)

#define CUDA_CHECK_RET(call)                                                               \
    do {                                                                                   \
        const cudaError_t bfs_cu_e_ = (call);                                              \
        if (bfs_cu_e_ != cudaSuccess)                                                      \
            return BFS_CUDA_ERR(bfs_cu_e_, #call);                                         \
    } while (0)

/* Alignment of every device pointer passed to a launcher. */
#define BFS_CU_PTR_ALIGN 256u

/* ---- launchers ---------------------------------------------------------------- */

/* MXFP4 -> BF16 of n_items items, each blocks [R][G][16] and scales [R][G],
 * contiguous (item i at blocks + i*R*G*16, scales + i*R*G). Output, contiguous:
 * transpose = 0: per item [R][G*32];  transpose = 1: per item [G*32][R]. */
int bfs__cu_mxfp4(const uint8_t *blocks, const uint8_t *scales, size_t n_items, size_t R,
                  size_t G, int transpose, uint16_t *out, cudaStream_t stream);

/* bitsandbytes 4-bit -> BF16 of n consecutive elements of a tensor, elements
 * [i0, i0 + n) of the whole tensor; every array is base-adjusted: */
typedef struct bfs_cu_bnb4_args {
    const uint8_t *codes;       /* byte 0 = byte i0 / 2 of the tensor */
    unsigned parity;            /* i0 & 1: element i0 is the low nibble of codes[0] */
    size_t n;                   /* elements */
    const float *absmax_f32;    /* without double quant; [0] = block b0 = i0 / blocksize */
    const uint8_t *absmax_u8;   /* with double quant; [0] = block b0 */
    uint64_t block_off;         /* i0 - b0 * blocksize */
    size_t blocksize;
    const float *nested_absmax; /* [0] = nested block b0 / nested_blocksize */
    uint64_t nested_off;        /* b0 % nested_blocksize */
    size_t nested_blocksize;
    float offset;
    const float *table;         /* 16 floats, on the device */
    const float *nested_code;   /* 256 floats, on the device (double quant) */
    uint16_t *out;              /* n bf16 */
} bfs_cu_bnb4_args;

int bfs__cu_bnb4(const bfs_cu_bnb4_args *a, cudaStream_t stream);

/* FP8, INT4, NVFP4 (docs/FORMATS.md section 6): elements [e0, e0 + n) of one 2-D weight
 * [rows][cols] (element i is row i / cols, column i % cols). Every input array is
 * base-adjusted: its [0] is the first entry the chunk needs, and the args say which entry
 * of the whole tensor that is. Values as ref_formats.h computes them, bit for bit. */
typedef struct bfs_cu_fp8_args {
    const uint8_t *w;     /* [0] = element e0 */
    const uint8_t *scale; /* [0] = grid row g0: [..][ceil(cols / bw)] F32, BF16 or E8M0 */
    int scale_type;       /* bfs_scale_type */
    uint64_t e0, g0;
    size_t n, cols, bh, bw;
    uint16_t *out;        /* n bf16 */
} bfs_cu_fp8_args;
int bfs__cu_fp8(const bfs_cu_fp8_args *a, cudaStream_t stream);

typedef struct bfs_cu_int4_args {
    const uint8_t *packed; /* [0] = int32 word w0 of the whole [rows][wpr] array */
    const uint8_t *scale;  /* [0] = scale row r0: [..][ngroups] F32 or BF16 */
    const uint8_t *zp;     /* NULL, or [0] = zero-point row z0: [..][ngroups] int32 */
    int scale_bf16;
    uint64_t e0, w0, r0, z0;
    size_t n, cols, wpr, ngroups, group_size;
    uint16_t *out;
} bfs_cu_int4_args;
int bfs__cu_int4(const bfs_cu_int4_args *a, cudaStream_t stream);

typedef struct bfs_cu_nvfp4_args {
    const uint8_t *packed; /* [0] = byte b0 of the whole [rows][cols / 2] array */
    const uint8_t *scale;  /* [0] = E4M3 scale s0 of the whole [rows][cols / 16] array */
    const float *bs;       /* [256]: the block scale of each E4M3 scale byte, made by the host
                            * with bfs_nvfp4_block_scale (so the kernel divides nothing) */
    int modelopt;
    uint64_t e0, b0, s0;
    size_t n, cols;
    uint16_t *out;
} bfs_cu_nvfp4_args;
int bfs__cu_nvfp4(const bfs_cu_nvfp4_args *a, cudaStream_t stream);

/* compressed-tensors MX (docs/FORMATS.md section 7): elements [e0, e0 + n) of one
 * weight [rows][cols] (cols % 32 == 0), flat: element i is in w byte bfs_ctmx_byte(elem, i)
 * (i, i / 2, or the 3-byte word at 3 (i / 4) for E2M3) and E8M0 scale byte i / 32. */
typedef struct bfs_cu_ctmx_args {
    const uint8_t *w;     /* [0] = byte b0 = bfs_ctmx_byte(elem, e0) of the whole w array */
    const uint8_t *scale; /* [0] = scale byte s0 = e0 / 32 */
    int elem;             /* BFS_CTMX_E4M3, _E2M1, _E2M3 (bfs_kernels.h) */
    int nan255;           /* E8M0 byte 255: 0 = +inf (U8), 1 = NaN (F8_E8M0) */
    uint64_t e0, b0, s0;
    size_t n, cols;
    uint16_t *out;
} bfs_cu_ctmx_args;
int bfs__cu_ctmx(const bfs_cu_ctmx_args *a, cudaStream_t stream);

/* GPTQ / AWQ GEMM / bitsandbytes 8-bit (docs/FORMATS.md section 9): output rows
 * [r0, r0 + nrows) of a [rows][cols] weight, out [nrows][cols]. Every input array holds only
 * what the chunk's rows need (gathered by the host): */
typedef struct bfs_cu_woq_args {
    const uint8_t *qweight; /* GPTQ: [kw][nrows] words (columns r0..); AWQ: [cols][zc] words
                             * (words w0..); GEMV: [nrows][cols / 8] words; BNB8: [nrows][cols] int8 */
    const uint8_t *qzeros;  /* GPTQ / AWQ: [ngroups][zc] words from word w0; GEMV: [nrows][zc]; BNB8: NULL */
    const uint8_t *scale;   /* GPTQ / AWQ: [ngroups][nrows] F16 / BF16 / F32; GEMV: [nrows][zc * 8];
                             * BNB8: [nrows] F32 */
    const uint8_t *g_idx;   /* GPTQ: the whole I32 [cols], or NULL (c / group_size) */
    int layout, bits, v1, scale_type; /* bfs_woq_desc's */
    uint64_t r0;            /* the chunk's first output row */
    uint64_t zr0;           /* the zero-point code of word w0's first field (w0 / wpb * per); GEMV: r0 */
    size_t nrows, cols, zc, group_size;
    size_t n;               /* nrows * cols: the elements */
    uint16_t *out;
} bfs_cu_woq_args;
int bfs__cu_woq(const bfs_cu_woq_args *a, cudaStream_t stream);

/* n elements of F32, F16 or F64 -> BF16. */
int bfs__cu_cast(const void *in, bfs_cast_src src, size_t n, uint16_t *out, cudaStream_t stream);

/* Where a kernel thread is: its block, the grid, its thread. Real kernels fill it from
 * blockIdx/gridDim/threadIdx (BFS_CU_IDX); the emulation from its own loops. */
typedef struct bfs_cu_idx {
    unsigned bx, by, bz; /* blockIdx */
    unsigned gx, gy, gz; /* gridDim */
    unsigned tid, nt;    /* threadIdx.x, blockDim.x */
} bfs_cu_idx;

/* A kernel is written as phases: phase p of every thread of a block runs before phase p+1
 * of any (a __syncthreads() between them), and nothing else is ordered. The real kernel
 * loops over the phases with a barrier between; the emulation runs them the same way. */
typedef void (*bfs_emu_phase_fn)(const void *arg, void *smem, const bfs_cu_idx *ix, int phase);

#ifdef BFS_CUDA_EMULATE
/* Provided by the fake runtime (dev/cuda/emu/fake_cudart.c). A kernel launch on stream:
 * grid (gx, gy, gz) of nthreads threads, smem bytes of shared memory per block, nphases
 * phases of fn(arg, smem, idx, phase); arg (size bytes) is copied. Checked against CUDA's
 * launch limits; an error is reported as a real launch's is (cudaGetLastError). */
cudaError_t bfs__emu_launch(cudaStream_t stream, unsigned gx, unsigned gy, unsigned gz, unsigned nthreads,
                            size_t smem, int nphases, bfs_emu_phase_fn fn, const void *arg, size_t size);
/* The n-th copy or kernel enqueued from now fails as a kernel fault would
 * (cudaErrorIllegalAddress, sticky on its device); n <= 0 clears the fault. */
void bfs__emu_fail_at(long n);
/* Change the fake machine ("devices", "driver", "busy", "cc", "ftz", "mem", "steal" (bytes
 * another process holds on dev), "reset"), and read it ("contexts" created on dev, "used"). */
void bfs__emu_set(const char *key, int dev, long long value);
long long bfs__emu_get(const char *key, int dev);
#endif

#ifdef __cplusplus
}
#endif

/* ---- device side ------------------------------------------------------------------ */
#ifdef __CUDACC__
#include "ref.h"

#define BFS_CU_THREADS 256

typedef struct bfs_cu_nosmem { char unused; } bfs_cu_nosmem; /* a kernel without shared memory */

static inline unsigned bfs_cu_grid(size_t work_items, size_t per_thread)
{
    const size_t threads = (work_items + per_thread - 1) / per_thread;
    size_t blocks = (threads + BFS_CU_THREADS - 1) / BFS_CU_THREADS;
    /* grid-stride loops cover the rest; 2^16 blocks keep every SM busy */
    if (blocks > 65536)
        blocks = 65536;
    return blocks ? (unsigned)blocks : 1u;
}

/* Two bf16 in one 32-bit word, the first at the lower address. */
BFS_HD uint32_t bfs_cu_pack2(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

/* Per-thread elements of the element-wise kernels (fp8.cu, int4.cu, nvfp4.cu, ctmx.cu) and bnb4.cu. */
#define BFS_CU_PER_THREAD 8

/* v[0..cnt) to out[0..cnt): one 16-byte store when all 8 are there (out + k0 with k0 % 8 == 0
 * on a 256-aligned base is 16-byte aligned), else one by one. */
BFS_HD void bfs_cu_store8(uint16_t *o, const uint16_t v[BFS_CU_PER_THREAD], size_t cnt)
{
    if (cnt == BFS_CU_PER_THREAD) {
        uint4 w;
        w.x = bfs_cu_pack2(v[0], v[1]);
        w.y = bfs_cu_pack2(v[2], v[3]);
        w.z = bfs_cu_pack2(v[4], v[5]);
        w.w = bfs_cu_pack2(v[6], v[7]);
        *(uint4 *)o = w;
    } else {
#pragma unroll
        for (unsigned j = 0; j < BFS_CU_PER_THREAD; j++) /* constant indices: v stays in registers */
            if (j < cnt)
                o[j] = v[j];
    }
}

/* The launch's index, on the device. */
#define BFS_CU_IDX() \
    bfs_cu_idx{blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z, threadIdx.x, blockDim.x}

/* Elements [k0, k0 + 8) (fewer at the end: n in all) of a chunk that starts at element e0
 * of a row-major tensor of `cols` columns: each value is f(r, c, k) (the element's row,
 * column, and index in the chunk), in order, then one bfs_cu_store8 to out + k0.
 * The walk of fp8.cu, int4.cu, nvfp4.cu, ctmx.cu. */
template <typename F>
BFS_HD void bfs_cu_rows8(uint16_t *out, uint64_t e0, uint64_t cols, size_t n, size_t k0, F f)
{
    const size_t cnt = n - k0 < BFS_CU_PER_THREAD ? n - k0 : BFS_CU_PER_THREAD;
    const uint64_t i0 = e0 + k0;
    uint64_t r = i0 / cols, c = i0 % cols;
    uint16_t v[BFS_CU_PER_THREAD];
#pragma unroll
    for (unsigned j = 0; j < BFS_CU_PER_THREAD; j++) {
        if (j < cnt) {
            v[j] = f(r, c, k0 + j);
            if (++c == cols) {
                c = 0;
                r++;
            }
        }
    }
    bfs_cu_store8(out + k0, v, cnt);
}

/* A one-phase element-wise kernel without shared memory, from EIGHT(a, k0) (elements
 * [k0, k0 + 8) of the chunk of args a, of type ARGS, a.n elements): its grid-stride
 * phase PHASE, its __global__ kernel K, and (emulated builds) its bfs_emu_phase_fn EMU,
 * for BFS_CU_LAUNCH(K, EMU, 1, bfs_cu_nosmem, ...). */
#ifdef BFS_CUDA_EMULATE
#define BFS_CU_ELEMWISE_EMU_(ARGS, PHASE, EMU)                                              \
    static void EMU(const void *a, void *s, const bfs_cu_idx *ix, int ph)                   \
    {                                                                                      \
        (void)s, (void)ph;                                                                 \
        PHASE(*(const ARGS *)a, *ix);                                                      \
    }
#else
#define BFS_CU_ELEMWISE_EMU_(ARGS, PHASE, EMU)
#endif
#define BFS_CU_ELEMWISE(ARGS, EIGHT, PHASE, K, EMU)                                         \
    BFS_HD void PHASE(const ARGS &a, const bfs_cu_idx &ix)                                 \
    {                                                                                      \
        const size_t stride = (size_t)ix.gx * ix.nt * BFS_CU_PER_THREAD;                   \
        for (size_t k0 = ((size_t)ix.bx * ix.nt + ix.tid) * BFS_CU_PER_THREAD; k0 < a.n;   \
             k0 += stride)                                                                 \
            EIGHT(a, k0);                                                                  \
    }                                                                                      \
    __global__ void __launch_bounds__(BFS_CU_THREADS) K(const ARGS a) { PHASE(a, BFS_CU_IDX()); } \
    BFS_CU_ELEMWISE_EMU_(ARGS, PHASE, EMU)

/* Kernel launch prologue / epilogue: a launch reports a bad configuration through
 * cudaGetLastError, which also returns any earlier error of this thread that nobody
 * collected; clear that first so a launch never reports someone else's error (a sticky
 * error, the context's, cannot be cleared and comes back at once). Faults in the kernel
 * itself surface at the next synchronisation, through CUDA_CHECK. */
#define BFS_CU_PRELAUNCH()                                                                 \
    do {                                                                                   \
        const cudaError_t bfs_cu_p_ = cudaGetLastError();                                  \
        if (bfs_cu_p_ != cudaSuccess && cudaGetLastError() == bfs_cu_p_)                   \
            return BFS_CUDA_ERR(bfs_cu_p_, "the device, before a launch (context lost)");  \
    } while (0)
#define BFS_CU_LAUNCHED(name)                                                              \
    do {                                                                                   \
        const cudaError_t bfs_cu_e_ = cudaGetLastError();                                  \
        if (bfs_cu_e_ != cudaSuccess)                                                      \
            return BFS_CUDA_ERR(bfs_cu_e_, "launch of " name);                             \
    } while (0)

/* The (emulated or real) launch of a phase kernel: K is the __global__ kernel, F its
 * bfs_emu_phase_fn twin, A the argument struct (by value), S its shared memory type. */
#ifdef BFS_CUDA_EMULATE
#define BFS_CU_LAUNCH(K, F, NPH, S, gx, gy, gz, stream, a)                                  \
    (void)bfs__emu_launch(stream, gx, gy, gz, BFS_CU_THREADS, sizeof(S), NPH, F, &(a), sizeof(a))
#else
#define BFS_CU_LAUNCH(K, F, NPH, S, gx, gy, gz, stream, a) K<<<dim3(gx, gy, gz), BFS_CU_THREADS, 0, stream>>>(a)
#endif

#endif /* __CUDACC__ */

#endif
