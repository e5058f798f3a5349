/*
 * AVX2 compressed-tensors MX (level BFS_CPU_AVX2, also the AVX-512 level's): mxfp8-quantized
 * and mxfp4-pack-quantized (docs/FORMATS.md 7.2, 7.3), the bytes of cpu_scalar.c's
 * bfs__ctmx_scalar. Built with -mavx2 -mf16c -mbmi2 (the Makefile's KAVX2_SRC); the ops
 * tables of cpu_avx2.c and cpu_avx512.c point here (bfs__ctmx_avx2, cpu_x86.h).
 *
 *  - MXFP4: a value depends only on (scale byte, code): one 256 x 16 table of bf16 results
 *    (ct_lo / ct_hi), filled once by the reference itself (bfs_ctmx_value), looked up with
 *    vpshufb two 32-element groups per step (cpu_avx2.h's lut_expand64), as gpt-oss MXFP4
 *    does (cpu_avx2_mxfp4.c) with its own table -- here scale byte 255 is +inf, so a zero
 *    code gives NaN there, where gpt-oss's exact ldexp gives zero.
 *  - MXFP8: for scale bytes 10..246 every product of an E4M3 value and 2^(s-127) is a normal
 *    bf16 (from 2^-9 * 2^-117 = 2^-126 to 448 * 2^119 < 2^128), so it is exact and is
 *    bf16(e4m3) with s - 127 added to its exponent field. bf16(e4m3), in 16-bit lanes:
 *    (|b| << 4) + 0x3C00 for the normal codes (the exponent rebiased from 7 to 127), an
 *    8-entry vpshufb table for the subnormal codes m * 2^-9 (zero stays zero), then the sign;
 *    the NaN codes 0x7F / 0xFF give 0x7FC0. The scale is folded into the constant and the
 *    table once per group. Other scale bytes (subnormal results, overflow, +inf) take the
 *    reference, element by element.
 * Groups never straddle rows (cols % 32 == 0): element i is byte i (i / 2 for MXFP4) and
 * scale byte i / 32. Heads and tails go through the reference element (bfs_ctmx_elem).
 * No FTZ/DAZ, no float arithmetic but the reference's.
 */
#include "cpu_avx2.h"
#include "ref_formats.h"

#include <pthread.h>

/* ---- MXFP4 ------------------------------------------------------------------------ */

/* ct_lo[s][code], ct_hi[s][code]: low and high byte of bfs_ctmx_value(e2m1[code], s). */
static _Alignas(64) uint8_t ct_lo[256][16];
static _Alignas(64) uint8_t ct_hi[256][16];
static pthread_once_t ct_once = PTHREAD_ONCE_INIT;

static void ct_init(void)
{
    for (unsigned s = 0; s < 256; s++)
        for (unsigned code = 0; code < 16; code++) {
            const uint16_t v = bfs_ctmx_value(bfs_e2m1_ct_to_f32(code), (uint8_t)s);
            ct_lo[s][code] = (uint8_t)(v & 0xFF);
            ct_hi[s][code] = (uint8_t)(v >> 8);
        }
}

/* ng whole groups from group g0 -> ng * 32 bf16 at o. Low nibble = even element. */
static void ct4_groups(const bfs_ctmx_desc *d, size_t g0, size_t ng, uint16_t *o)
{
    const uint8_t *const blk = d->w + g0 * 16, *const sc = d->scale + g0;
    size_t g = 0;
    for (; g + 2 <= ng; g += 2) { /* two groups, one per lane */
        __m256i c0, c1;
        x86_codes64(_mm256_loadu_si256((const __m256i *)(blk + g * 16)), X86_MX, &c0, &c1);
        const __m256i tl = _mm256_loadu2_m128i((const __m128i *)ct_lo[sc[g + 1]], (const __m128i *)ct_lo[sc[g]]);
        const __m256i th = _mm256_loadu2_m128i((const __m128i *)ct_hi[sc[g + 1]], (const __m128i *)ct_hi[sc[g]]);
        lut_expand64(c0, c1, tl, th, o + g * 32);
    }
    if (g < ng) {
        __m128i c0, c1;
        x86_codes32(_mm_loadu_si128((const __m128i *)(blk + g * 16)), X86_MX, &c0, &c1);
        lut_expand32(c0, c1, _mm_load_si128((const __m128i *)ct_lo[sc[g]]),
                     _mm_load_si128((const __m128i *)ct_hi[sc[g]]), o + g * 32);
    }
}

/* ---- MXFP8 ------------------------------------------------------------------------ */

/* 16 E4M3 bytes -> 16 bf16 of a group whose scale byte is in [10, 246]: norm = 0x3C00 +
 * (s - 127) << 7 in every word, sub = the subnormal codes' bf16 with the same exponent
 * added (word m of each lane; word 0, zero, stays 0). */
static inline __m256i ct8_16(__m128i b, __m256i norm, __m256i sub)
{
    const __m256i x = _mm256_cvtepu8_epi16(b);
    const __m256i mag = _mm256_and_si256(x, _mm256_set1_epi16(0x7F));
    /* vpshufb index of word m: bytes 2m, 2m + 1 (m >= 8: blended away below) */
    const __m256i idx = _mm256_add_epi16(_mm256_mullo_epi16(mag, _mm256_set1_epi16(0x0202)), _mm256_set1_epi16(0x0100));
    const __m256i is_sub = _mm256_cmpgt_epi16(_mm256_set1_epi16(8), mag);
    __m256i v = _mm256_blendv_epi8(_mm256_add_epi16(_mm256_slli_epi16(mag, 4), norm), _mm256_shuffle_epi8(sub, idx), is_sub);
    v = _mm256_or_si256(v, _mm256_and_si256(_mm256_slli_epi16(x, 8), _mm256_set1_epi16((short)0x8000)));
    return _mm256_blendv_epi8(v, _mm256_set1_epi16(0x7FC0), _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7F)));
}

/* ng whole groups from group g0 -> ng * 32 bf16 at o. */
static void ct8_groups(const bfs_ctmx_desc *d, size_t g0, size_t ng, uint16_t *o)
{
    /* bf16 of the subnormal E4M3 codes m * 2^-9, m = 0..7, in each lane */
    const __m256i subt = _mm256_setr_epi16(0, 0x3B00, 0x3B80, 0x3BC0, 0x3C00, 0x3C20, 0x3C40, 0x3C60,
                                           0, 0x3B00, 0x3B80, 0x3BC0, 0x3C00, 0x3C20, 0x3C40, 0x3C60);
    const __m256i not0 = _mm256_setr_epi16(0, -1, -1, -1, -1, -1, -1, -1, 0, -1, -1, -1, -1, -1, -1, -1);
    for (size_t g = g0; g < g0 + ng; g++, o += 32) {
        const unsigned s = d->scale[g];
        const uint8_t *const w = d->w + g * 32;
        if (s - 10u > 236u) { /* results not all normal bf16: the reference */
            for (size_t j = 0; j < 32; j++)
                o[j] = bfs_ctmx_value(bfs_e4m3_to_f32(w[j]), (uint8_t)s);
            continue;
        }
        const __m256i adj = _mm256_set1_epi16((short)(((int)s - 127) * 128));
        const __m256i norm = _mm256_add_epi16(adj, _mm256_set1_epi16(0x3C00));
        const __m256i sub = _mm256_add_epi16(subt, _mm256_and_si256(adj, not0));
        const __m256i b = _mm256_loadu_si256((const __m256i *)w);
        _mm256_storeu_si256((__m256i *)o, ct8_16(_mm256_castsi256_si128(b), norm, sub));
        _mm256_storeu_si256((__m256i *)(o + 16), ct8_16(_mm256_extracti128_si256(b, 1), norm, sub));
    }
}

void bfs__ctmx_avx2(const bfs_ctmx_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    assert(i0 <= i1 && d->cols > 0 && d->cols % 32 == 0);
    size_t i = i0;
    uint16_t *o = out;
    for (; i < i1 && (i & 31); i++) /* head: to a group boundary */
        *o++ = bfs_ctmx_elem(d, i);
    const size_t ng = (i1 - i) / 32;
    if (d->fp4) {
        pthread_once(&ct_once, ct_init);
        ct4_groups(d, i / 32, ng, o);
    } else {
        ct8_groups(d, i / 32, ng, o);
    }
    i += ng * 32;
    o += ng * 32;
    for (; i < i1; i++)
        *o++ = bfs_ctmx_elem(d, i);
}
