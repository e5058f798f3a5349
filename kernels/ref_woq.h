/*
 * Scalar reference routines for weight-only integer formats (docs/FORMATS.md section 9): GPTQ
 * (GPTQModel / AutoGPTQ, v1 and v2 zero points, 2/3/4/8 bits, act-order g_idx), AWQ GEMM
 * (4-bit, AWQ's field order) and bitsandbytes LLM.int8() (int8 + SCB). Plain portable C11,
 * header only; cpu_scalar.c computes every element through bfs_woq_elem, cpu_avx2_woq.c and
 * woq.cu through its primitives, and every backend is checked against it.
 *
 * Rules (each checked bit for bit against the upstream function, fixtures/FINDINGS-gptq.txt):
 *  - codes: a little-endian bit stream of 32-bit words, code j at bit j * bits (GPTQModel
 *    utils/model_dequant.py unpack_rows / unpack_cols / _unpack_rows_3bit: 3-bit codes 10
 *    and 21 of each 3-word block straddle two words); GPTQ qweight's streams run down its
 *    columns, qzeros' along its rows.
 *  - GPTQ v1 zero points (GPTQModel utils/model.py convert_gptq_v1_to_v2_format_module):
 *    2/4/8 bits add 0x55555555 / 0x11111111 / 0x01010101 to the whole int32 word (carries
 *    into the next field kept: that is how a stored -1 restores a zero point of 0); 3 bits
 *    add 1 to each field mod 8.
 *  - AWQ GEMM (GPTQModel quantization/awq/utils/packing_utils.py dequantize_gemm): output
 *    column r of a packed row is field {0, 4, 1, 5, 2, 6, 3, 7}[r % 8] of word r / 8.
 *  - AWQ GEMV (GPTQModel nn_modules/qlinear/gemv_awq.py pack, pack_awq_columns without an
 *    order): qweight [out, in / 8], code c of a row in field c % 8 of word c / 8; qzeros
 *    [out, zw] the same way along the groups; scales [out, zw * 8].
 *  - value: (q - z) exact as an integer; s * (q - z) is exact in float32 for F16 and BF16
 *    scales (11- or 8-bit significand times at most 9 bits), rounded once to the scale's
 *    dtype as torch's fp16 / bf16 multiply does, then to bf16 (fp16 -> bf16 is a second
 *    rounding, as the .to(torch.bfloat16) of the fp16 weight). F32 scales: the float32
 *    product, then bf16.
 *  - bitsandbytes 8-bit (bitsandbytes _ops.py int8_vectorwise_dequant, "default" kernel):
 *    A * stats.view(-1, 1) * 7.874015718698502e-3, two float32 multiplies (the Python
 *    scalar becomes a float32), then bf16.
 * Build with -ffp-contract=off (nvcc --fmad=false): every product is one rounding.
 */
#ifndef BFS_KERNELS_REF_WOQ_H
#define BFS_KERNELS_REF_WOQ_H

#include "bfs_kernels.h"
#include "ref.h"

/* float32 -> IEEE half, round to nearest even (overflow to +-inf, subnormals kept, NaN
 * stays NaN), as torch's float -> half. */
BFS_HD uint16_t bfs_f16_from_f32(float f)
{
    const uint32_t u = bfs_f32_bits(f), a = u & 0x7FFFFFFFu;
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7F800000u)
        return (uint16_t)(sign | 0x7E00u);
    if (a >= 0x477FF000u) /* 65520 and up (inf too) round to inf */
        return (uint16_t)(sign | 0x7C00u);
    if (a >= 0x38800000u) { /* a normal half: rebias the exponent, round off 13 bits */
        const uint32_t r = a - 0x38000000u;
        return (uint16_t)(sign | ((r + 0x0FFFu + ((r >> 13) & 1u)) >> 13));
    }
    const uint32_t e = a >> 23; /* below 2^-14: a multiple of 2^-24, rounded */
    if (e < 102)                 /* under 2^-25: 0 (2^-25 itself is a tie, to even 0) */
        return sign;
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u, sh = 126u - e; /* 14 .. 24 */
    uint32_t q = m >> sh;
    const uint32_t rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1u);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return (uint16_t)(sign | q);
}

/* The rows of GPTQ's qweight: ceil(cols * bits / 32) words per column (3-bit: 3 per 32). */
BFS_HD size_t bfs_gptq_kw(const bfs_woq_desc *d)
{
    return d->bits == 3 ? (d->cols + 31) / 32 * 3 : (d->cols * (size_t)d->bits + 31) / 32;
}

/* A little-endian int32 word of p (unaligned). */
BFS_HD uint32_t bfs_woq_word(const uint8_t *p, size_t i)
{
    uint32_t w;
    memcpy(&w, p + 4 * i, 4);
    return w;
}

/* Code j of a bit stream of `bits`-bit codes (2, 3, 4, 8): w(k) gives its word k. The
 * words of a GPTQ column are `stride` words apart. */
BFS_HD unsigned bfs_woq_code(const uint8_t *p, size_t stride, size_t j, unsigned bits)
{
    const size_t bit = j * bits, k = bit / 32;
    const unsigned sh = (unsigned)(bit % 32);
    uint32_t v = bfs_woq_word(p, k * stride) >> sh;
    if (sh + bits > 32)
        v |= bfs_woq_word(p, (k + 1) * stride) << (32 - sh);
    return v & ((1u << bits) - 1u);
}

/* GPTQ zero point j of a qzeros row (its bit stream), the v1 convention restored. */
BFS_HD int bfs_gptq_zero_at(const uint8_t *row, size_t j, unsigned bits, int v1)
{
    if (bits == 3) {
        const unsigned z = bfs_woq_code(row, 1, j, 3);
        return (int)(v1 ? (z + 1u) & 7u : z);
    }
    const unsigned per = 32u / bits;
    uint32_t w = bfs_woq_word(row, j / per);
    if (v1)
        w += bits == 2 ? 0x55555555u : bits == 4 ? 0x11111111u : 0x01010101u;
    return (int)((w >> (bits * (unsigned)(j % per))) & ((1u << bits) - 1u));
}

/* GPTQ zero point of output row r in group g. */
BFS_HD int bfs_gptq_zero(const bfs_woq_desc *d, size_t g, size_t r)
{
    return bfs_gptq_zero_at(d->qzeros + g * d->zw * 4, r, (unsigned)d->bits, d->v1);
}

/* AWQ GEMM field of output column r in a packed row (AWQ_REVERSE_ORDER). */
BFS_HD unsigned bfs_awq_field(const uint8_t *row, size_t r)
{
    const unsigned f = (0x73625140u >> (4u * (unsigned)(r % 8))) & 7u; /* 0 4 1 5 2 6 3 7 */
    return (bfs_woq_word(row, r / 8) >> (4u * f)) & 15u;
}

/* s * (q - z) rounded as upstream: through float16 for an F16 scale, then bf16. */
BFS_HD uint16_t bfs_woq_value(const uint8_t *scale, size_t i, int type, int diff)
{
    float s;
    if (type == BFS_WOQ_F16) {
        uint16_t h;
        memcpy(&h, scale + 2 * i, 2);
        s = bfs_f32_from_f16(h);
        return bfs_bf16_from_f32(bfs_f32_from_f16(bfs_f16_from_f32(s * (float)diff)));
    }
    if (type == BFS_WOQ_BF16) {
        uint16_t h;
        memcpy(&h, scale + 2 * i, 2);
        s = bfs_f32_from_bf16(h);
    } else {
        memcpy(&s, scale + 4 * i, 4);
    }
    return bfs_bf16_from_f32(s * (float)diff);
}

/* One bitsandbytes 8-bit element: f32(f32(q * scb) * f32(1 / 127)), then bf16. */
BFS_HD uint16_t bfs_bnb8_value(int q, float scb)
{
#if defined(__CUDA_ARCH__)
    return bfs_bf16_from_f32(__fmul_rn(__fmul_rn((float)q, scb), 7.874015718698502e-3f));
#else
    const float p = (float)q * scb;
    return bfs_bf16_from_f32(p * 7.874015718698502e-3f);
#endif
}

/* AWQ GEMV element (rl, c), c in group g, of the arrays given: qweight [.][cols / 8], qzeros
 * [.][zw], scales [.][zw * 8] (rl counts from their first row). */
BFS_HD uint16_t bfs_awqv_value(const uint8_t *qweight, const uint8_t *qzeros, const uint8_t *scale, size_t rl,
                               size_t cols, size_t zw, size_t c, size_t g, int type)
{
    const int q = (int)bfs_woq_code(qweight + rl * (cols / 8) * 4, 1, c, 4);
    const int z = (int)bfs_woq_code(qzeros + rl * zw * 4, 1, g, 4);
    return bfs_woq_value(scale, rl * zw * 8 + g, type, q - z);
}

/* The group of input column c (GPTQ: g_idx[c]; else c / group_size). */
BFS_HD size_t bfs_woq_group(const bfs_woq_desc *d, size_t c)
{
    if (d->g_idx)
        return (size_t)bfs_woq_word(d->g_idx, c);
    return c / d->group_size;
}

/* Element (r, c) of the [out, in] weight. */
BFS_HD uint16_t bfs_woq_elem(const bfs_woq_desc *d, size_t r, size_t c)
{
    if (d->layout == BFS_WOQ_BNB8) {
        float scb;
        memcpy(&scb, d->scale + 4 * r, 4);
        return bfs_bnb8_value((int)(int8_t)d->qweight[r * d->cols + c], scb);
    }
    const size_t g = bfs_woq_group(d, c);
    if (d->layout == BFS_WOQ_GEMV)
        return bfs_awqv_value(d->qweight, d->qzeros, d->scale, r, d->cols, d->zw, c, g, d->scale_type);
    int q, z;
    if (d->layout == BFS_WOQ_GPTQ) {
        q = (int)bfs_woq_code(d->qweight + 4 * r, d->rows, c, (unsigned)d->bits);
        z = bfs_gptq_zero(d, g, r);
    } else {
        q = (int)bfs_awq_field(d->qweight + c * d->zw * 4, r);
        z = (int)bfs_awq_field(d->qzeros + g * d->zw * 4, r);
    }
    return bfs_woq_value(d->scale, g * d->rows + r, d->scale_type, q - z);
}

#endif
