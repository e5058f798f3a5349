/*
 * What the AVX2 level's two files (cpu_avx2.c, cpu_avx2_mxfp4.c) share: the
 * vpshufb expansion of 4-bit codes through 16-entry bf16 tables, and the MXFP4
 * kernel's name. Both files are built with -mavx2 -mf16c -mbmi2 (the Makefile's
 * KAVX2_SRC); calls go one way, cpu_avx2.c -> cpu_avx2_mxfp4.c.
 */
#ifndef BFS_KERNELS_CPU_AVX2_H
#define BFS_KERNELS_CPU_AVX2_H

#include <immintrin.h>

#include "cpu_x86.h"

#if !defined(__AVX2__) || !defined(__F16C__)
#error "kernels/cpu_avx2*.c must be built with -mavx2 -mf16c -mbmi2"
#endif

/* ---- 16-entry bf16 tables looked up with vpshufb -------------------------------- */

/* 64 codes (c0 = per lane the codes of one table pair's block, c1 the other's) -> 64 bf16
 * at o, as lut_expand64 with a table pair for c0 (tl0/th0) and one for c1 (tl1/th1). */
static inline void lut_expand64x2(__m256i c0, __m256i c1, __m256i tl0, __m256i th0, __m256i tl1,
                                  __m256i th1, uint16_t *o)
{
    const __m256i l0 = _mm256_shuffle_epi8(tl0, c0), h0 = _mm256_shuffle_epi8(th0, c0);
    const __m256i l1 = _mm256_shuffle_epi8(tl1, c1), h1 = _mm256_shuffle_epi8(th1, c1);
    const __m256i w0 = _mm256_unpacklo_epi8(l0, h0); /* 0..7   | 32..39 */
    const __m256i w1 = _mm256_unpackhi_epi8(l0, h0); /* 8..15  | 40..47 */
    const __m256i w2 = _mm256_unpacklo_epi8(l1, h1); /* 16..23 | 48..55 */
    const __m256i w3 = _mm256_unpackhi_epi8(l1, h1); /* 24..31 | 56..63 */
    _mm256_storeu_si256((__m256i *)o, _mm256_permute2x128_si256(w0, w1, 0x20));
    _mm256_storeu_si256((__m256i *)(o + 16), _mm256_permute2x128_si256(w2, w3, 0x20));
    _mm256_storeu_si256((__m256i *)(o + 32), _mm256_permute2x128_si256(w0, w1, 0x31));
    _mm256_storeu_si256((__m256i *)(o + 48), _mm256_permute2x128_si256(w2, w3, 0x31));
}

/* 64 codes (one per byte; c0 = codes 0..15 | 32..47, c1 = 16..31 | 48..63, the
 * order unpack gives) -> 64 bf16 at o. tl/th: low/high bytes of the table, per lane. */
static inline void lut_expand64(__m256i c0, __m256i c1, __m256i tl, __m256i th, uint16_t *o)
{
    lut_expand64x2(c0, c1, tl, th, tl, th, o);
}

/* 32 codes (c0 = codes 0..15, c1 = 16..31) -> 32 bf16 at o. */
static inline void lut_expand32(__m128i c0, __m128i c1, __m128i tl, __m128i th, uint16_t *o)
{
    const __m128i l0 = _mm_shuffle_epi8(tl, c0), h0 = _mm_shuffle_epi8(th, c0);
    const __m128i l1 = _mm_shuffle_epi8(tl, c1), h1 = _mm_shuffle_epi8(th, c1);
    _mm_storeu_si128((__m128i *)o, _mm_unpacklo_epi8(l0, h0));
    _mm_storeu_si128((__m128i *)(o + 8), _mm_unpackhi_epi8(l0, h0));
    _mm_storeu_si128((__m128i *)(o + 16), _mm_unpacklo_epi8(l1, h1));
    _mm_storeu_si128((__m128i *)(o + 24), _mm_unpackhi_epi8(l1, h1));
}

/* MXFP4, both layouts (cpu_avx2_mxfp4.c): the level's bfs_mxfp4_fn. */
void bfs__mxfp4_avx2(const bfs_mxfp4_desc *d, size_t item, size_t o0, size_t o1, uint16_t *out);

#endif
