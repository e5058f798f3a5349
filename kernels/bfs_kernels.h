/*
 * Dequant kernels: one signature per operation, several implementations
 * (scalar reference, AVX2, AVX-512 on the CPU; CUDA beside them in kernels/ as .cu).
 * Every implementation must give the bytes of the scalar one (tests/test_kernels.c).
 */
#ifndef BFS_KERNELS_H
#define BFS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* MXFP4 tensor: blocks [n_items][R][G][16] bytes, scales [n_items][R][G] bytes.
 * One item's logical matrix is [R][C] with C = G*32 columns.
 * transpose = 0: the item's output is [R][C] (openai/gpt-oss layout);
 * transpose = 1: the item's output is [C][R] (transformers >= 4.56 layout). */
typedef struct bfs_mxfp4_desc {
    const uint8_t *blocks; /* base of the whole tensor */
    const uint8_t *scales; /* base of the whole tensor */
    size_t R, G;
    int transpose;
} bfs_mxfp4_desc;

/* Writes output rows [o0, o1) of item `item` to out (out[0] is the first
 * element of output row o0). Output rows are r (transpose = 0) or c (transpose = 1). */
typedef void (*bfs_mxfp4_fn)(const bfs_mxfp4_desc *d, size_t item, size_t o0, size_t o1,
                             uint16_t *out);

/* bitsandbytes 4-bit tensor of n elements. Element i: code = bfs_bnb4_code(codes, i),
 * block b = i / blocksize, scale = absmax_f32[b], or with double quant
 * bfs_bnb4_dq_scale(nested_code[absmax_u8[b]], nested_absmax[b / nested_blocksize], offset). */
typedef struct bfs_bnb4_desc { /* the float32 pointers may be unaligned: read with bfs_ld_f32 (ref.h) */
    const uint8_t *codes;
    const float *table; /* 16 entries */
    size_t blocksize;
    const float *absmax_f32;  /* set without double quant */
    const uint8_t *absmax_u8; /* set with double quant */
    const float *nested_code; /* 256 entries */
    const float *nested_absmax;
    size_t nested_blocksize;
    float offset;
} bfs_bnb4_desc;

/* Writes elements [i0, i1) to out (out[0] is element i0). */
typedef void (*bfs_bnb4_fn)(const bfs_bnb4_desc *d, size_t i0, size_t i1, uint16_t *out);

/* ---- FP8, INT4, NVFP4 (docs/FORMATS.md section 6; rules in ref_formats.h) ----------------
 * All three take elements [i0, i1) of one 2-D weight [rows][cols] (element i is row
 * i / cols, column i % cols) and write them to out (out[0] is element i0). Scales are
 * read unaligned, little-endian: float32, or bfloat16 when scale_bf16 is set (FP8: the
 * scale_type below). */

/* How the entries of a scale array are stored (ref_formats.h bfs_scale_at). The E8M0 types
 * are power-of-two bytes, 2^(s-127) exactly (s = 0: the subnormal 2^-127), never integers;
 * they differ in byte 255 only, as torch decodes each storage (docs/FORMATS.md 8). */
typedef enum bfs_scale_type {
    BFS_SCALE_F32 = 0,
    BFS_SCALE_BF16 = 1,
    BFS_SCALE_E8M0 = 2,     /* U8 exponents: 255 is +inf (transformers' exp2(s - 127.0)) */
    BFS_SCALE_E8M0_NAN = 3, /* F8_E8M0 (torch.float8_e8m0fnu): 255 is NaN */
} bfs_scale_type;

/* Bytes per entry of a scale array of type t (bfs_scale_type). */
static inline unsigned bfs_scale_size(int t) { return t == BFS_SCALE_F32 ? 4u : t == BFS_SCALE_BF16 ? 2u : 1u; }

/* FP8 E4M3 weight with a scale grid [ceil(rows/bh)][ceil(cols/bw)] (a multiplier):
 * DeepSeek-V3 block (bh = bw = 128), compressed-tensors tensor (bh = rows, bw = cols),
 * channel (bh = 1, bw = cols) or block, DeepSeek-V4 block (E8M0 scales). */
typedef struct bfs_fp8_desc {
    const uint8_t *w;      /* [rows][cols] E4M3 */
    const uint8_t *scale;  /* the grid */
    int scale_type;        /* bfs_scale_type */
    size_t cols, bh, bw;
} bfs_fp8_desc;
typedef void (*bfs_fp8_fn)(const bfs_fp8_desc *d, size_t i0, size_t i1, uint16_t *out);

/* compressed-tensors pack-quantized INT4: packed [rows][wpr] int32 words (as bytes),
 * scale [rows][ngroups], zero point NULL (symmetric) or [ceil(rows/8)][ngroups] int32
 * packed on dim 0. group_size * ngroups == cols. */
typedef struct bfs_int4_desc {
    const uint8_t *packed;
    const uint8_t *scale;
    const uint8_t *zp;
    int scale_bf16;
    size_t cols, wpr, ngroups, group_size;
} bfs_int4_desc;
typedef void (*bfs_int4_fn)(const bfs_int4_desc *d, size_t i0, size_t i1, uint16_t *out);

/* NVFP4: packed [rows][cols/2] (low nibble = even element), E4M3 scales [rows][cols/16].
 * modelopt = 0: compressed-tensors (global_scale a divisor, code 8 = -0.0);
 * modelopt = 1: ModelOpt (global_scale = weight_scale_2, a multiplier, code 8 = +0.0). */
typedef struct bfs_nvfp4_desc {
    const uint8_t *packed;
    const uint8_t *scale;
    float global_scale;
    int modelopt;
    size_t cols;
} bfs_nvfp4_desc;
typedef void (*bfs_nvfp4_fn)(const bfs_nvfp4_desc *d, size_t i0, size_t i1, uint16_t *out);

/* ---- compressed-tensors MX (docs/FORMATS.md section 7) -------------------------------- */

/* compressed-tensors MX, mxfp8-quantized (elem BFS_CTMX_E4M3), mxfp4-pack-quantized
 * (BFS_CTMX_E2M1) and mxfp6-pack-quantized (BFS_CTMX_E2M3): one E8M0 scale byte per 32
 * elements of a row (cols % 32 == 0), scale [rows][cols / 32]. E4M3: w is [rows][cols];
 * E2M1: w is [rows][cols / 2] pairs (low nibble = even element, code 8 = -0.0); E2M3: w is
 * [rows][3 * cols / 4], four 6-bit codes per 3 bytes (the little-endian 24-bit word of bytes
 * 3k..3k+2 holds element 4k + j in bits 6j..6j+5; bit 5 of a code is the sign, code 32 =
 * -0.0). Element i of the tensor is w byte i / i / 2 / 3 * (i / 4) (bfs_ctmx_byte) and scale
 * byte i / 32. Value: ref_formats.h bfs_ctmx_value (scale byte 255 is +inf, not NaN).
 * DeepSeek-V4's FP4 experts (I8 pairs, the same nibbles and code 8) are this with E2M1;
 * nan255 = 1 when their scales are F8_E8M0, whose byte 255 torch decodes as NaN. */
enum { BFS_CTMX_E4M3 = 0, BFS_CTMX_E2M1 = 1, BFS_CTMX_E2M3 = 2 };
typedef struct bfs_ctmx_desc {
    const uint8_t *w;
    const uint8_t *scale;
    int elem; /* BFS_CTMX_E4M3, _E2M1 or _E2M3 */
    size_t cols;
    int nan255; /* scale byte 255: 0 = +inf (U8 exponents), 1 = NaN (F8_E8M0) */
} bfs_ctmx_desc;
typedef void (*bfs_ctmx_fn)(const bfs_ctmx_desc *d, size_t i0, size_t i1, uint16_t *out);

/* ---- GPTQ, AWQ, bitsandbytes 8-bit (docs/FORMATS.md section 9) -------------------------------
 * Weight-only integer quantization of an nn.Linear weight, written [rows = out][cols = in]
 * (element i is row i / cols, column i % cols), whatever the storage order: GPTQ and AWQ
 * GEMM store it transposed ([in, out]), so output row r is column r of their arrays; AWQ GEMV
 * stores it as the output is ([out, in]). Values
 * (ref_woq.h bfs_woq_elem): code q, zero z, scale s of the element's group,
 *   scale F16:  bf16(f32(f16(s * (q - z))))  (GPTQModel's dequant, in the checkpoint's fp16)
 *   scale BF16 / F32: bf16(f32(s * (q - z)))
 *   BNB8: bf16(f32(f32(q * SCB[r]) * f32(7.874015718698502e-3)))  (int8_vectorwise_dequant)
 * Every array is read unaligned, little-endian. */
enum { BFS_WOQ_GPTQ = 0, BFS_WOQ_AWQ = 1, BFS_WOQ_BNB8 = 2, BFS_WOQ_GEMV = 3 };
enum { BFS_WOQ_F16 = 0, BFS_WOQ_BF16 = 1, BFS_WOQ_F32 = 2 };
typedef struct bfs_woq_desc {
    /* GPTQ: I32 [ceil(cols * bits / 32)][rows], each column a little-endian bit stream of
     *       codes along dim 0 (code c at bit c * bits; 3-bit codes may straddle two words);
     * AWQ:  I32 [cols][ceil(rows / 8)] 4-bit, code r of a row in field AWQ_ORDER^-1[r % 8]
     *       = {0, 4, 1, 5, 2, 6, 3, 7}[r % 8] of word r / 8;
     * GEMV: I32 [rows][cols / 8] 4-bit, code c of a row in field c % 8 of word c / 8;
     * BNB8: I8 [rows][cols]. */
    const uint8_t *qweight;
    /* GPTQ: I32 [ngroups][zw], zero r of group g = code r of row g's bit stream (v1: each
     *       2/4/8-bit word + 0x..0101 (one per field, carries kept), 3-bit: field + 1 mod 8);
     * AWQ:  I32 [ngroups][zw], packed as qweight's rows;
     * GEMV: I32 [rows][zw], zero g of a row in field g % 8 of word g / 8 (zw >= ngroups / 8,
     *       padded as GPTQModel's calculate_zeros_width pads); BNB8: NULL. */
    const uint8_t *qzeros;
    /* GPTQ/AWQ [ngroups][rows] (scale_type); GEMV [rows][zw * 8] (padded as qzeros);
     * BNB8: SCB F32 [rows] */
    const uint8_t *scale;
    const uint8_t *g_idx; /* GPTQ: I32 [cols], every entry in [0, ngroups); NULL: c / group_size */
    int layout;           /* BFS_WOQ_GPTQ, _AWQ, _BNB8, _GEMV */
    int bits;             /* GPTQ 2, 3, 4, 8; AWQ, GEMV 4; BNB8 8 */
    int v1;               /* GPTQ: the v1 zero-point convention (stored zero + 1) */
    int scale_type;       /* BFS_WOQ_F16, _BF16, _F32 */
    size_t rows, cols, group_size, ngroups, zw;
} bfs_woq_desc;
typedef void (*bfs_woq_fn)(const bfs_woq_desc *d, size_t i0, size_t i1, uint16_t *out);

/* Casts to bf16 (round to nearest even, NaN -> 0x7FC0). F64 goes through float32
 * first, as torch's .to(torch.bfloat16) does. Inputs may be unaligned. */
typedef void (*bfs_cast_fn)(const void *in, size_t n, uint16_t *out);

/* Source type of a cast (the CPU ops have one function each; the CUDA launcher takes this). */
typedef enum bfs_cast_src { BFS_CAST_F32 = 0, BFS_CAST_F16 = 1, BFS_CAST_F64 = 2 } bfs_cast_src;

enum { BFS_CPU_SCALAR = 0, BFS_CPU_AVX2 = 1, BFS_CPU_AVX512 = 2, BFS_CPU_NLEVELS = 3 };

typedef struct bfs_kernel_ops {
    const char *name; /* "scalar", "avx2", "avx512" */
    int level;
    bfs_mxfp4_fn mxfp4;
    bfs_bnb4_fn bnb4;
    bfs_cast_fn f32_to_bf16;
    bfs_cast_fn f16_to_bf16;
    bfs_cast_fn f64_to_bf16;
    bfs_fp8_fn fp8;
    bfs_int4_fn int4;
    bfs_nvfp4_fn nvfp4;
    bfs_ctmx_fn ctmx;
    bfs_woq_fn woq; /* GPTQ, AWQ, bitsandbytes 8-bit */
} bfs_kernel_ops;

/* The scalar reference (cpu_scalar.c): plain loops over ref.h, present in every build.
 * Every other implementation, CPU or CUDA, must give its bytes. */
extern const bfs_kernel_ops bfs__cpu_scalar_ops;
/* Its dequant ops by name (the SIMD kernels' tails). */
void bfs__fp8_scalar(const bfs_fp8_desc *d, size_t i0, size_t i1, uint16_t *out);
void bfs__int4_scalar(const bfs_int4_desc *d, size_t i0, size_t i1, uint16_t *out);
void bfs__nvfp4_scalar(const bfs_nvfp4_desc *d, size_t i0, size_t i1, uint16_t *out);
void bfs__ctmx_scalar(const bfs_ctmx_desc *d, size_t i0, size_t i1, uint16_t *out);
void bfs__woq_scalar(const bfs_woq_desc *d, size_t i0, size_t i1, uint16_t *out);

/* The cast of k from source type s. */
static inline bfs_cast_fn bfs_kernels_cast(const bfs_kernel_ops *k, bfs_cast_src s)
{
    return s == BFS_CAST_F32 ? k->f32_to_bf16 : s == BFS_CAST_F16 ? k->f16_to_bf16 : k->f64_to_bf16;
}

/* Highest level this CPU and build support. */
int bfs_kernels_best_level(void);
/* Kernels of one level; level < 0 means the best. NULL when that level is not
 * supported by this CPU or build. */
const bfs_kernel_ops *bfs_kernels_cpu(int level);

#ifdef __cplusplus
}
#endif
#endif
