/*
 * What the AVX2 level's files (cpu_avx2.c, cpu_avx2_mxfp4.c, cpu_avx2_ctmx.c) share:
 * the vpshufb expansion of 4-bit codes through 16-entry bf16 tables, the lookup of E4M3
 * codes in per-scale tables (fp8_lut32), and the MXFP4 kernel's name. All are built with
 * -mavx2 -mf16c -mbmi2 (the Makefile's KAVX2_SRC); calls go one way, cpu_avx2.c ->
 * cpu_avx2_mxfp4.c (cpu_avx2_ctmx.c is reached through cpu_x86.h's declaration).
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

/* ---- E4M3 through per-scale tables (cpu_avx2.c "FP8 by table"; cpu_avx2_ctmx.c) ------ */

/* 32 codes -> 32 bf16 at o; tl, th, ul, uh: the tables in both lanes. The NaN codes take U
 * too (entry 15, unused by e = 0) and no ADJ (a vpshufb index with bit 7 set gives 0). */
static inline void fp8_lut32(__m256i c, __m256i tl, __m256i th, __m256i ul, __m256i uh, uint16_t *o)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i adj = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, -128, -127, -126, -125, -124, -123, -122, -121,
                                         0, 1, 2, 3, 4, 5, 6, 7, -128, -127, -126, -125, -124, -123, -122, -121);
    c = _mm256_permute4x64_epi64(c, 0xD8); /* lanes: codes 0..7, 16..23 | 8..15, 24..31 */
    const __m256i idx = _mm256_and_si256(c, m4);
    const __m256i nan = _mm256_cmpeq_epi8(_mm256_add_epi8(c, c), _mm256_set1_epi8(-2)); /* |c| == 0x7F */
    const __m256i hn = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4), nan);
    const __m256i sub = _mm256_cmpeq_epi8(_mm256_and_si256(c, _mm256_set1_epi8(0x78)), _mm256_setzero_si256());
    const __m256i spec = _mm256_or_si256(sub, nan);
    const __m256i lo = _mm256_blendv_epi8(_mm256_shuffle_epi8(tl, idx), _mm256_shuffle_epi8(ul, idx), spec);
    __m256i hi = _mm256_blendv_epi8(_mm256_shuffle_epi8(th, idx), _mm256_shuffle_epi8(uh, idx), spec);
    hi = _mm256_add_epi8(hi, _mm256_shuffle_epi8(adj, hn));
    _mm256_storeu_si256((__m256i *)o, _mm256_unpacklo_epi8(lo, hi));
    _mm256_storeu_si256((__m256i *)(o + 16), _mm256_unpackhi_epi8(lo, hi));
}

/* The fp8_lut32 tables of E8M0 scale byte s, 2^(s-127): built once, by the reference, and
 * checked against it for all 256 codes (cpu_avx2_ctmx.c ct8_init). */
typedef struct ct8_tab {
    _Alignas(32) uint8_t t[32]; /* T: 16 low bytes, then 16 high bytes */
    _Alignas(32) uint8_t u[32]; /* U: 16 low bytes, then 16 high bytes */
} ct8_tab;

/* The tables of the 256 E8M0 bytes (built at the first call); *ok = 256 flags, 0 where the
 * lookup is not the reference (subnormal results, overflow, byte 255): those multiply.
 * Compressed-tensors MXFP8 and the FP8 kernel's E8M0 block scales use them. */
const ct8_tab *bfs__ct8_tables(const uint8_t **ok);

/* MXFP4, both layouts (cpu_avx2_mxfp4.c): the level's bfs_mxfp4_fn. */
void bfs__mxfp4_avx2(const bfs_mxfp4_desc *d, size_t item, size_t o0, size_t o1, uint16_t *out);

#endif
