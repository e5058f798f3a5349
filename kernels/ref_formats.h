/*
 * Scalar reference routines for the FP8, INT4 and NVFP4 input formats (docs/FORMATS.md section 6).
 * Plain portable C11, header only, no src/ includes. Each routine dequantizes the rows
 * [r0, r1) of one 2-D weight [rows, cols] into bf16, row-major, out[(r - r0) * cols + c].
 *
 * Rules, each matching the upstream function bit for bit (fixtures/FINDINGS-quant.txt):
 *  - E4M3 (float8_e4m3fn): exact in float32; 0x7F / 0xFF are NaN, there is no inf.
 *  - FP8 scaled (DeepSeek-V3 block weight_scale_inv, compressed-tensors float-quantized
 *    tensor / channel / block weight_scale): bf16(f32(f32(w) * f32(scale))). A BF16 scale
 *    gives the same bits (its product is exact in float32, rounded once).
 *  - INT4 pack-quantized (compressed-tensors): element c of a row is bits 4*(c%8).. of the
 *    little-endian int32 word c/8, q = nibble - 8; zero point packed the same way on dim 0;
 *    bf16(f32(f32(q - zp) * f32(scale))).
 *  - NVFP4 compressed-tensors: low nibble = even element, e2m1 code 8 = -0.0;
 *    bf16(f32(e2m1 * f32(f32(scale_e4m3) / global_scale)))  (global scale: a divisor).
 *  - NVFP4 ModelOpt: low nibble = even element, e2m1 code 8 = +0.0;
 *    bf16(f32(e2m1 * f32(f32(scale_e4m3) * weight_scale_2)))  (scale_2: a multiplier).
 *  - compressed-tensors MX (docs/FORMATS.md 7.2, 7.3): E8M0 scale byte s per 32
 *    elements decoded as decompress_mx_scale does (2^(s-127) exactly, s = 0 the subnormal
 *    2^-127, s = 255 +inf: there is no NaN scale); bf16(f32(v * scale)) with v the E4M3 value
 *    (mxfp8-quantized), the E2M1 value, code 8 = -0.0 (mxfp4-pack-quantized), or the FP6 E2M3
 *    value, code 32 = -0.0 (mxfp6-pack-quantized, docs/FORMATS.md 7.6). So 0 * inf is NaN,
 *    unlike gpt-oss MXFP4 (ref.h bfs_mxfp4_value, an exact ldexp).
 *  - DeepSeek-V4 (docs/FORMATS.md 8): FP8 block weights are the FP8 scaled rule with E8M0
 *    block scales (bfs_scale_at), FP4 experts the compressed-tensors MXFP4 rule; an F8_E8M0
 *    scale byte 255 is NaN there (torch.float8_e8m0fnu), a U8 one +inf (bfs_e8m0_scale).
 * Every product and quotient is one float32 operation: build with -ffp-contract=off.
 */
#ifndef BFS_KERNELS_REF_FORMATS_H
#define BFS_KERNELS_REF_FORMATS_H

#include "bfs_kernels.h"
#include "ref.h"

/* float8_e4m3fn -> float32, exact. Subnormals are m * 2^-9; 0x7F / 0xFF -> quiet NaN
 * (sign kept); no infinities exist in this encoding. */
BFS_HD float bfs_e4m3_to_f32(uint8_t b)
{
    const uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    const uint32_t e = (b >> 3) & 0x0Fu;
    const uint32_t m = b & 0x07u;
    if (e == 0x0F && m == 0x07)
        return bfs_bits_f32(sign | 0x7FC00000u);
    if (e == 0) {
        /* m * 2^-9, exact: the product of a small integer and a power of two */
        const float v = (float)m * bfs_bits_f32(0x3B000000u); /* 2^-9 */
        return bfs_bits_f32(bfs_f32_bits(v) | sign);
    }
    return bfs_bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

/* One scaled element: bf16(f32(v * scale)), a single float32 multiply. */
BFS_HD uint16_t bfs_scaled_value(float v, float scale) { return bfs_bf16_from_f32(v * scale); }

/* FP8 weight [rows, cols] times a float32 scale grid [ceil(rows/bh), ceil(cols/bw)].
 * DeepSeek-V3 block: bh = bw = 128. compressed-tensors per-tensor: bh = rows, bw = cols
 * (grid 1 x 1); per-channel: bh = 1, bw = cols. Partial edge blocks use their block's scale. */
static inline void bfs_ref_fp8_scaled_rows(const uint8_t *w, const float *scale, size_t rows,
                                           size_t cols, size_t bh, size_t bw, size_t r0,
                                           size_t r1, uint16_t *out)
{
    const size_t gcols = (cols + bw - 1) / bw;
    (void)rows;
    for (size_t r = r0; r < r1; r++)
        for (size_t c = 0; c < cols; c++) {
            const float s = scale[(r / bh) * gcols + c / bw];
            out[(r - r0) * cols + c] = bfs_scaled_value(bfs_e4m3_to_f32(w[r * cols + c]), s);
        }
}

/* 4-bit field k (0..7) of the little-endian int32 word at p. */
BFS_HD unsigned bfs_int4_nibble(const uint8_t *p, unsigned k)
{
    const uint8_t b = p[k >> 1];
    return (k & 1u) ? (unsigned)(b >> 4) : (unsigned)(b & 0x0Fu);
}

/* compressed-tensors pack-quantized INT4 (num_bits 4):
 *   packed  [rows, wpr] int32 (as bytes, little-endian), wpr = ceil(cols / 8)
 *   scale   [rows, ngroups] float32 values (BF16/F16/F32 scales converted exactly),
 *           ngroups = cols / group_size (channel strategy: group_size = cols, ngroups 1)
 *   zp      NULL (symmetric) or [ceil(rows / 8), ngroups] int32 packed on dim 0:
 *           zp[r][g] = field r % 8 of word [r / 8][g], minus 8. */
static inline void bfs_ref_int4_pack_rows(const uint8_t *packed, size_t wpr, const float *scale,
                                          size_t ngroups, size_t group_size, const uint8_t *zp,
                                          size_t cols, size_t r0, size_t r1, uint16_t *out)
{
    for (size_t r = r0; r < r1; r++)
        for (size_t c = 0; c < cols; c++) {
            const size_t g = c / group_size;
            const int q = (int)bfs_int4_nibble(packed + (r * wpr + c / 8) * 4, (unsigned)(c % 8)) - 8;
            int z = 0;
            if (zp != NULL)
                z = (int)bfs_int4_nibble(zp + ((r / 8) * ngroups + g) * 4, (unsigned)(r % 8)) - 8;
            out[(r - r0) * cols + c] = bfs_scaled_value((float)(q - z), scale[r * ngroups + g]);
        }
}

/* NVFP4 e2m1 code -> float32. compressed-tensors computes table[code & 7] * (sign ? -1 : 1),
 * so code 8 is -0.0; ModelOpt's table holds the integer 0 at index 8, so code 8 is +0.0. */
BFS_HD float bfs_e2m1_ct_to_f32(unsigned code) { return bfs_e2m1_to_f32(code); }

BFS_HD float bfs_e2m1_modelopt_to_f32(unsigned code)
{
    return (code & 15u) == 8u ? 0.0f : bfs_e2m1_to_f32(code);
}

/* NVFP4 packed [rows, cols/2] U8 (low nibble = even element) with per-16 E4M3 scales
 * [rows, cols/16]. modelopt = 0: compressed-tensors, block scale = f32(s) / global_scale;
 * modelopt = 1: ModelOpt, block scale = f32(s) * global_scale (weight_scale_2). */
static inline void bfs_ref_nvfp4_rows(const uint8_t *packed, const uint8_t *scale_e4m3,
                                      float global_scale, int modelopt, size_t cols, size_t r0,
                                      size_t r1, uint16_t *out)
{
    const size_t nblk = cols / 16;
    for (size_t r = r0; r < r1; r++)
        for (size_t c = 0; c < cols; c++) {
            const uint8_t b = packed[r * (cols / 2) + c / 2];
            const unsigned code = (c & 1) ? (unsigned)(b >> 4) : (unsigned)(b & 0x0Fu);
            const float s = bfs_e4m3_to_f32(scale_e4m3[r * nblk + c / 16]);
            const float bs = modelopt ? s * global_scale : s / global_scale;
            const float v = modelopt ? bfs_e2m1_modelopt_to_f32(code) : bfs_e2m1_ct_to_f32(code);
            out[(r - r0) * cols + c] = bfs_scaled_value(v, bs);
        }
}

/* ---- per element over the kernel descriptors (bfs_kernels.h): the scalar ops, the SIMD
 * tails and the CUDA kernels all compute an element through these ---------------------- */

/* E8M0 byte s as float32: 2^(s-127) exactly; 255 is +inf (U8 exponents, exp2(255 - 127.0)
 * in float32) or NaN (nan255: torch.float8_e8m0fnu -> float32). */
BFS_HD float bfs_e8m0_scale(uint8_t s, int nan255)
{
    return nan255 && s == 255 ? bfs_bits_f32(0x7FC00000u) : bfs_e8m0_to_f32(s);
}

/* Scale i of a scale array of type t (bfs_scale_type; F32 and BF16 read unaligned), as
 * float32 (exact). */
BFS_HD float bfs_scale_at(const uint8_t *p, size_t i, int t)
{
    if (t == BFS_SCALE_E8M0 || t == BFS_SCALE_E8M0_NAN)
        return bfs_e8m0_scale(p[i], t == BFS_SCALE_E8M0_NAN);
    if (t == BFS_SCALE_BF16) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return bfs_f32_from_bf16(h);
    }
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
}

/* Element (r, c) of an FP8 scaled weight. */
BFS_HD uint16_t bfs_fp8_elem(const bfs_fp8_desc *d, size_t r, size_t c)
{
    const size_t gcols = (d->cols + d->bw - 1) / d->bw;
    const float s = bfs_scale_at(d->scale, (r / d->bh) * gcols + c / d->bw, d->scale_type);
    return bfs_scaled_value(bfs_e4m3_to_f32(d->w[r * d->cols + c]), s);
}

/* Zero point of row r, group g (0 when symmetric). */
BFS_HD int bfs_int4_zp(const bfs_int4_desc *d, size_t r, size_t g)
{
    if (d->zp == NULL)
        return 0;
    return (int)bfs_int4_nibble(d->zp + ((r / 8) * d->ngroups + g) * 4, (unsigned)(r % 8)) - 8;
}

/* Element (r, c) of an INT4 pack-quantized weight. */
BFS_HD uint16_t bfs_int4_elem(const bfs_int4_desc *d, size_t r, size_t c)
{
    const size_t g = c / d->group_size;
    const int q = (int)bfs_int4_nibble(d->packed + (r * d->wpr + c / 8) * 4, (unsigned)(c % 8)) - 8;
    return bfs_scaled_value((float)(q - bfs_int4_zp(d, r, g)), bfs_scale_at(d->scale, r * d->ngroups + g, d->scale_bf16));
}

/* The block scale of NVFP4 scale byte s: f32(s) / global (compressed-tensors) or
 * f32(s) * global (ModelOpt). */
BFS_HD float bfs_nvfp4_block_scale(uint8_t s, float global_scale, int modelopt)
{
    const float f = bfs_e4m3_to_f32(s);
    return modelopt ? f * global_scale : f / global_scale;
}

/* An NVFP4 code times its block scale, the convention's code-8 sign. */
BFS_HD uint16_t bfs_nvfp4_value(unsigned code, float block_scale, int modelopt)
{
    const float v = modelopt ? bfs_e2m1_modelopt_to_f32(code) : bfs_e2m1_ct_to_f32(code);
    return bfs_scaled_value(v, block_scale);
}

/* Element (r, c) of an NVFP4 weight. */
BFS_HD uint16_t bfs_nvfp4_elem(const bfs_nvfp4_desc *d, size_t r, size_t c)
{
    const uint8_t b = d->packed[r * (d->cols / 2) + c / 2];
    const unsigned code = (c & 1) ? (unsigned)(b >> 4) : (unsigned)(b & 0x0Fu);
    const float bs = bfs_nvfp4_block_scale(d->scale[r * (d->cols / 16) + c / 16], d->global_scale, d->modelopt);
    return bfs_nvfp4_value(code, bs, d->modelopt);
}

/* A compressed-tensors MX element: v (exact in float32) times the E8M0 scale byte s as
 * compressed-tensors decodes it (2.0 ** (s - 127) in bfloat16: bfs_e8m0_to_f32, +inf for 255),
 * in one float32 multiply (torch's bfloat16 multiply: the float32 product, rounded once). The
 * product is exact but for overflow; 0 * inf (s = 255) is NaN. */
BFS_HD uint16_t bfs_ctmx_value(float v, uint8_t s) { return bfs_scaled_value(v, bfs_e8m0_to_f32(s)); }

/* FP6 E2M3 code (6 bits, compressed-tensors compressors/mxfp6/helpers.py kE2M3ToFloat) ->
 * float32, exact: bit 5 the sign (code 32 is -0.0), then 2 exponent bits e and 3 mantissa bits
 * m: m / 8 for e = 0, (1 + m / 8) * 2^(e-1) otherwise (0 .. 7.5). */
BFS_HD float bfs_e2m3_to_f32(unsigned code)
{
    const uint32_t sign = (uint32_t)(code & 0x20u) << 26, e = (code >> 3) & 3u, m = code & 7u;
    if (e == 0) {
        const float v = (float)m * 0.125f; /* exact */
        return bfs_bits_f32(bfs_f32_bits(v) | sign);
    }
    return bfs_bits_f32(sign | ((e + 126u) << 23) | (m << 20));
}

/* Code j (0..3) of the MXFP6 word at p: bits 6j..6j+5 of the little-endian 24-bit word
 * p[0] | p[1] << 8 | p[2] << 16 (element 4k + j of a row is code j of its word k). */
BFS_HD unsigned bfs_fp6_code(const uint8_t *p, unsigned j)
{
    const uint32_t word = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
    return (unsigned)(word >> (6 * j)) & 0x3Fu;
}

/* The first byte of w that holds element i (element type elem, BFS_CTMX_*). */
BFS_HD uint64_t bfs_ctmx_byte(int elem, uint64_t i)
{
    return elem == BFS_CTMX_E4M3 ? i : elem == BFS_CTMX_E2M1 ? i / 2 : (i / 4) * 3;
}

/* The value (float32, exact) of element i of w, whose byte 0 is byte bfs_ctmx_byte(elem, e0)
 * of the tensor (e0 = 0: the whole tensor); the chunks of ctmx.cu start anywhere. */
BFS_HD float bfs_ctmx_code_value(const uint8_t *w, int elem, uint64_t i, uint64_t e0)
{
    if (elem == BFS_CTMX_E2M1) {
        const uint8_t b = w[i / 2 - e0 / 2];
        return bfs_e2m1_ct_to_f32((i & 1) ? (unsigned)(b >> 4) : (unsigned)(b & 0x0Fu));
    }
    if (elem == BFS_CTMX_E2M3)
        return bfs_e2m3_to_f32(bfs_fp6_code(w + (i / 4 - e0 / 4) * 3, (unsigned)(i % 4)));
    return bfs_e4m3_to_f32(w[i - e0]);
}

/* Element i of a compressed-tensors MX weight (flat: rows are whole groups). */
BFS_HD uint16_t bfs_ctmx_elem(const bfs_ctmx_desc *d, size_t i)
{
    const float v = bfs_ctmx_code_value(d->w, d->elem, i, 0);
    return bfs_scaled_value(v, bfs_e8m0_scale(d->scale[i / 32], d->nan255));
}

#endif
