/*
 * What the x86 kernels (cpu_avx2.c, cpu_avx2_mxfp4.c, cpu_avx512.c) share: the
 * nibble order of the 4-bit formats spelled in vectors, the walk over bnb blocks
 * and their scales, and the skeleton of the MXFP4 kernel around a level's row dequant.
 * Values always come from ref.h's rules; only the vector spelling lives here.
 *
 * Include after the intrinsics (<immintrin.h>, or SIMDe with native aliases):
 * this header uses the SSE/AVX2 intrinsics it finds, and includes none itself.
 */
#ifndef BFS_KERNELS_CPU_X86_H
#define BFS_KERNELS_CPU_X86_H

#include "bfs_kernels.h"
#include "ref.h"

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

/* ---- nibble order (ref.h: bfs_mxfp4_nibble, bfs_bnb4_code) ------------------------ */

/* Which nibble of byte k is element 2k: the low one (MXFP4) or the high one (bnb). */
enum { X86_MX = 0, X86_BNB = 1 };

/* 32 code bytes -> 64 codes, one per byte, in element order within each 128-bit lane:
 * *c0 = the elements of bytes 0..7 | 16..23, *c1 = those of bytes 8..15 | 24..31. */
static inline void x86_codes64(__m256i x, int order, __m256i *c0, __m256i *c1)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(x, m4), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
    const __m256i even = order == X86_MX ? lo : hi, odd = order == X86_MX ? hi : lo;
    *c0 = _mm256_unpacklo_epi8(even, odd);
    *c1 = _mm256_unpackhi_epi8(even, odd);
}

/* 16 code bytes -> 32 codes: *c0 = the elements of bytes 0..7, *c1 = those of bytes 8..15. */
static inline void x86_codes32(__m128i x, int order, __m128i *c0, __m128i *c1)
{
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(x, m4), hi = _mm_and_si128(_mm_srli_epi16(x, 4), m4);
    const __m128i even = order == X86_MX ? lo : hi, odd = order == X86_MX ? hi : lo;
    *c0 = _mm_unpacklo_epi8(even, odd);
    *c1 = _mm_unpackhi_epi8(even, odd);
}

/* ---- bnb 4-bit: blocks and their scales ------------------------------------------- */

/* Walks elements [i0, i1) block by block: each x86_bnb_next() gives the next block's
 * part [*e0, *e1) and its scale (absmax, or the double-quant scale of ref.h, the nested
 * block followed without a division per block). */
typedef struct x86_bnb_walk {
    const bfs_bnb4_desc *d;
    size_t e, end; /* next element, end of the range */
    size_t b;      /* block of e */
    size_t nb, nb_end; /* nested block of b, and its first block past it */
} x86_bnb_walk;

static inline x86_bnb_walk x86_bnb_start(const bfs_bnb4_desc *d, size_t i0, size_t i1)
{
    assert(i0 <= i1 && d->blocksize > 0);
    assert(d->absmax_u8 ? d->nested_blocksize > 0 : d->absmax_f32 != NULL);
    x86_bnb_walk w = {d, i0, i1, i0 / d->blocksize, 0, 0};
    if (d->absmax_u8) {
        w.nb = w.b / d->nested_blocksize;
        w.nb_end = (w.nb + 1) * d->nested_blocksize;
    }
    return w;
}

static inline int x86_bnb_next(x86_bnb_walk *w, size_t *e0, size_t *e1, float *scale)
{
    const bfs_bnb4_desc *d = w->d;
    if (w->e >= w->end)
        return 0;
    *e0 = w->e;
    *e1 = (w->b + 1) * d->blocksize < w->end ? (w->b + 1) * d->blocksize : w->end;
    if (d->absmax_u8) {
        if (w->b == w->nb_end) {
            w->nb++;
            w->nb_end += d->nested_blocksize;
        }
        *scale = bfs_bnb4_dq_scale(bfs_ld_f32(d->nested_code, d->absmax_u8[w->b]), bfs_ld_f32(d->nested_absmax, w->nb),
                                   d->offset);
    } else {
        *scale = bfs_ld_f32(d->absmax_f32, w->b);
    }
    w->e = *e1;
    w->b++;
    return 1;
}

/* Elements [e, end) from a block's bf16 table, one at a time (odd heads, tails). */
static inline uint16_t *x86_bnb_lut_run(const uint16_t *lut, const uint8_t *codes, size_t e, size_t end,
                                        uint16_t *o)
{
    for (; e < end; e++)
        *o++ = lut[bfs_bnb4_code(codes, e)];
    return o;
}

/* ---- FP8, INT4, NVFP4: the AVX2 kernels (cpu_avx2.c), also the AVX-512 level's ------------ */
void bfs__fp8_avx2(const bfs_fp8_desc *d, size_t i0, size_t i1, uint16_t *out);
void bfs__int4_avx2(const bfs_int4_desc *d, size_t i0, size_t i1, uint16_t *out);
void bfs__nvfp4_avx2(const bfs_nvfp4_desc *d, size_t i0, size_t i1, uint16_t *out);
/* ---- compressed-tensors MX: the AVX2 kernel (cpu_avx2_ctmx.c), also AVX-512's --------------- */
void bfs__ctmx_avx2(const bfs_ctmx_desc *d, size_t i0, size_t i1, uint16_t *out);
/* ---- GPTQ, AWQ GEMM, bitsandbytes 8-bit: the AVX2 kernel (cpu_avx2_woq.c), also AVX-512's ---- */
void bfs__woq_avx2(const bfs_woq_desc *d, size_t i0, size_t i1, uint16_t *out);

/* ---- MXFP4 --------------------------------------------------------------------------- */

/* A level's row dequant: ng consecutive groups of one row (codes blk, scales sc) -> ng*32 bf16 at o. */
typedef void (*x86_mx_groups_fn)(const uint8_t *blk, const uint8_t *sc, size_t ng, uint16_t *o);
/* The transposed layout, output rows [o0, o1) of one item: byte transposes, the scale
 * added to the exponent, non-temporal runs per output row (cpu_avx2_mxfp4.c; AVX2 suffices). */
void bfs__mxfp4_transposed_x86(const bfs_mxfp4_desc *d, size_t item, size_t o0, size_t o1, uint16_t *out);

/* A level's bfs_mxfp4_fn from its row dequant (inlined with a constant `groups`). */
static inline void x86_mxfp4(const bfs_mxfp4_desc *d, size_t item, size_t o0, size_t o1, uint16_t *out,
                             x86_mx_groups_fn groups)
{
    const size_t R = d->R, G = d->G, C = G * 32;
    assert(o0 <= o1 && o1 <= (d->transpose ? C : R));
    if (d->transpose) {
        bfs__mxfp4_transposed_x86(d, item, o0, o1, out);
        return;
    }
    const uint8_t *const blocks = d->blocks + item * R * G * 16;
    const uint8_t *const scales = d->scales + item * R * G;
    for (size_t r = o0; r < o1; r++)
        groups(blocks + r * G * 16, scales + r * G, G, out + (r - o0) * C);
}

#endif
