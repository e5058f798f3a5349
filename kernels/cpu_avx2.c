/*
 * AVX2 kernels (level BFS_CPU_AVX2): the bytes of cpu_scalar.c, faster.
 * Built with -mavx2 -mf16c -mbmi2; run only where cpu_dispatch.c found them.
 *
 * 4-bit formats: a value depends only on (code, scale), so each scale gets a
 * 16-entry table of bf16 results, computed with the reference arithmetic
 * (float32 product, then round to nearest even), and the codes are looked up
 * in it with vpshufb: one shuffle for the low bytes, one for the high bytes.
 *  - MXFP4 (both layouts) is in cpu_avx2_mxfp4.c: its 256 scales share one
 *    table of 256 x 16 values; the transposed layout adds the scale to the
 *    exponent field and streams whole lines.
 *  - bnb has one float scale per block: its table is built per block with a
 *    float32 multiply and the bf16 rounding below, in SIMD.
 * The vpshufb expansion (lut_expand*) is in cpu_avx2.h, shared with cpu_avx2_mxfp4.c.
 * No FTZ/DAZ: subnormal products and inputs are computed as IEEE says.
 */
#include "cpu_avx2.h"
#include "ref_formats.h"

#include <float.h>
#include <math.h>

/* ---- bf16 rounding ------------------------------------------------------------ */

/* 8 float32 bit patterns -> bf16 (RNE, NaN -> 0x7FC0), one per dword. */
static inline __m256i bf16_rne8(__m256i u)
{
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r =
        _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                           _mm256_set1_epi32(0x7F800000));
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
}

/* 16 floats (a then b) -> 16 bf16 in order. */
static inline __m256i bf16_pack16(__m256 a, __m256 b)
{
    const __m256i p = _mm256_packus_epi32(bf16_rne8(_mm256_castps_si256(a)),
                                          bf16_rne8(_mm256_castps_si256(b)));
    return _mm256_permute4x64_epi64(p, 0xD8);
}

/* ---- 16-entry bf16 tables looked up with vpshufb -------------------------------- */

/* 16 bf16 (in order) -> [their 16 low bytes | their 16 high bytes] */
static inline __m256i bf16_bytes16(__m256i w)
{
    /* per lane: low bytes of 8 words, then their high bytes */
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0,
                                           2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    return _mm256_permute4x64_epi64(_mm256_shuffle_epi8(w, split), 0xD8);
}

/* 16 bf16 (in order) -> the vpshufb tables: *tl = their low bytes, *th = their high bytes,
 * each in both lanes. */
static inline void lut16_split(__m256i w, __m256i *tl, __m256i *th)
{
    const __m256i bytes = bf16_bytes16(w);
    *tl = _mm256_permute2x128_si256(bytes, bytes, 0x00);
    *th = _mm256_permute2x128_si256(bytes, bytes, 0x11);
}

/* 4-bit codes [e, end) (e even; element i in byte i / 2, nibble order `order` as
 * x86_codes64) through the tables tl/th to *o, 64 then 32 at a time: returns the first
 * element not done (fewer than 32 are left), *o moved past what was written. */
static inline size_t lut_span(const uint8_t *codes, size_t e, size_t end, int order, __m256i tl, __m256i th,
                              uint16_t **o)
{
    for (; e + 64 <= end; e += 64, *o += 64) {
        __m256i c0, c1;
        x86_codes64(_mm256_loadu_si256((const __m256i *)(codes + e / 2)), order, &c0, &c1);
        lut_expand64(c0, c1, tl, th, *o);
    }
    if (e + 32 <= end) {
        __m128i c0, c1;
        x86_codes32(_mm_loadu_si128((const __m128i *)(codes + e / 2)), order, &c0, &c1);
        lut_expand32(c0, c1, _mm256_castsi256_si128(tl), _mm256_castsi256_si128(th), *o);
        e += 32;
        *o += 32;
    }
    return e;
}

/* ---- bitsandbytes 4-bit ------------------------------------------------------------ */

static void bnb4_avx2(const bfs_bnb4_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    x86_bnb_walk walk = x86_bnb_start(d, i0, i1); /* checks the descriptor */
    if (i0 == i1)
        return;
    const __m256 t0 = _mm256_loadu_ps(d->table), t1 = _mm256_loadu_ps(d->table + 8);
    const uint8_t *const codes = d->codes;
    size_t e, bend;
    float scale;
    uint16_t *o = out;
    while (x86_bnb_next(&walk, &e, &bend, &scale)) {
        const __m256 s = _mm256_set1_ps(scale);
        const __m256i w = bf16_pack16(_mm256_mul_ps(t0, s), _mm256_mul_ps(t1, s));
        _Alignas(32) uint16_t lut[16];
        _mm256_store_si256((__m256i *)lut, w);
        __m256i tl, th;
        lut16_split(w, &tl, &th);
        if (e & 1) { /* starts on the second element of a byte */
            o = x86_bnb_lut_run(lut, codes, e, e + 1, o);
            e++;
        }
        e = lut_span(codes, e, bend, X86_BNB, tl, th, &o);
        o = x86_bnb_lut_run(lut, codes, e, bend, o);
    }
}


/* ---- FP8 scaled, INT4 pack-quantized, NVFP4 (also the AVX-512 level's)
 * Every value is ref_formats.h's: the input value (exact in float32) times the scale, one
 * float32 multiply, rounded once to bf16. What makes them fast:
 *  - FP8: per scale, vpshufb tables and an exponent add (see "FP8 by table" below). Scales
 *    where that is not exact (zero, |s| < 2^-119, huge, inf, NaN) multiply (fp8_run):
 *    an E4M3 byte, sign-extended to 16 bits and shifted left by 7 (bit 14 cleared),
 *    is the half-precision pattern of x * 2^-8, exactly, subnormals included; vcvtph2ps
 *    widens it exactly (no subnormal float32 arises), and the run's scale is taken as
 *    s * 2^8 (exact), so the one multiply sees the same real product x * s and rounds it
 *    the same way. With a finite s * 2^8 no product is NaN, so the bf16 rounding needs no
 *    NaN test; the NaN codes 0x7F / 0xFF come out finite and are replaced by 0x7FC0 in
 *    the 16-bit results. Runs whose s * 2^8 is not finite take the general path (e4m3x8).
 *  - INT4: the 16 values of a group, (code - 8 - zp) * scale, are computed once per group
 *    and looked up with vpshufb (lut_expand64), as bnb does.
 *  - NVFP4: a block's 16 values are +-(8 magnitudes * block scale): 8 products per block,
 *    rounded, then the sign bit set for codes 8..15 (x * s rounds symmetrically, and the
 *    code-8 zero of each convention comes out right); four blocks (64 elements) per step,
 *    two tables per vpshufb. The block scale of each of the 256 scale bytes is computed
 *    once per call by the reference (compressed-tensors divides: one divide per block was
 *    0.98x memcpy, the table 1.30x, medians of 6 processes). Blocks whose scale byte is NaN
 *    or whose block scale is not finite (global scale 0, tiny, huge) take the per-element
 *    path (nv_block16).
 * Heads and tails go through the scalar element functions or the run's table. */

/* 8 float32 bit patterns -> bf16 (RNE), one per dword; for values that are not NaN. */
static inline __m256i bf16_rne8_nonan(__m256i u)
{
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
}

/* 8 E4M3 bytes (the low 8 of b) -> float32, exact, without a subnormal float anywhere
 * (subnormal operands cost microcode assists): normals by their bits (exponent + 120),
 * subnormals (e = 0) as m * 2^-9, 0x7F / 0xFF as NaN, then the sign. The general path. */
static inline __m256 e4m3x8(__m128i b)
{
    const __m256i x = _mm256_cvtepu8_epi32(b);
    const __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7F));
    const __m256 normal = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(0x3C000000)));
    const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(mag, _mm256_set1_epi32(7))), _mm256_set1_ps(0x1p-9f));
    const __m256 is_sub = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(mag, _mm256_set1_epi32(0x78)), _mm256_setzero_si256()));
    __m256 v = _mm256_blendv_ps(normal, sub, is_sub);
    const __m256 nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F)));
    v = _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan);
    return _mm256_or_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x80)), 24)));
}

/* 16 E4M3 bytes -> the half-precision patterns of x * 2^-8, exact (NaN codes: finite). */
static inline __m256i e4m3x16_half(__m128i b)
{
    return _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7), _mm256_set1_epi16((short)0xBFFF));
}

/* n E4M3 bytes times one scale sf: the fast steps where sf * 2^8 is finite, else the
 * general ones; the tail by the scalar rule. */
static inline void fp8_run(const uint8_t *w, size_t n, float sf, uint16_t *o)
{
    size_t k = 0;
    const float s8 = sf * 256.0f; /* exact unless it overflows */
    if ((bfs_f32_bits(s8) & 0x7F800000u) != 0x7F800000u) {
        const __m256 s = _mm256_set1_ps(s8);
        const __m256i qnan = _mm256_set1_epi16(0x7FC0), one = _mm256_set1_epi16(1);
        const __m256i nanpat = _mm256_set1_epi16(0x3F80), top = _mm256_set1_epi16((short)0x8000);
        /* per lane: the high words of 4 dwords, then their low words */
        const __m256i hl = _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10,
                                            11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13);
        for (; k + 16 <= n; k += 16) {
            const __m256i h = e4m3x16_half(_mm_loadu_si128((const __m128i *)(w + k)));
            const __m256 a0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), s);
            const __m256 a1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), s);
            /* bf16 RNE on 16-bit halves (no NaN here): hi + (lo + (hi & 1) > 0x8000) */
            const __m256i s0 = _mm256_shuffle_epi8(_mm256_castps_si256(a0), hl);
            const __m256i s1 = _mm256_shuffle_epi8(_mm256_castps_si256(a1), hl);
            const __m256i hi = _mm256_unpacklo_epi64(s0, s1), lo = _mm256_unpackhi_epi64(s0, s1);
            const __m256i t = _mm256_adds_epu16(lo, _mm256_and_si256(hi, one)); /* no wrap: saturates */
            const __m256i up = _mm256_cmpgt_epi16(_mm256_xor_si256(t, top), _mm256_setzero_si256()); /* t > 0x8000 */
            const __m256i r = _mm256_permute4x64_epi64(_mm256_sub_epi16(hi, up), 0xD8);
            /* the NaN codes: |x| == 0x7F (h & 0x3F80 == 0x3F80 only for them) */
            const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(h, nanpat), nanpat);
            _mm256_storeu_si256((__m256i *)(o + k), _mm256_blendv_epi8(r, qnan, nan));
        }
    } else {
        const __m256 s = _mm256_set1_ps(sf);
        for (; k + 16 <= n; k += 16) {
            const __m128i b = _mm_loadu_si128((const __m128i *)(w + k));
            const __m256 a0 = _mm256_mul_ps(e4m3x8(b), s), a1 = _mm256_mul_ps(e4m3x8(_mm_srli_si128(b, 8)), s);
            _mm256_storeu_si256((__m256i *)(o + k), bf16_pack16(a0, a1));
        }
    }
    for (; k < n; k++)
        o[k] = bfs_scaled_value(bfs_e4m3_to_f32(w[k]), sf);
}

/* ---- FP8 by table (the fast path of bfs__fp8_avx2) ---------------------------------------
 * For one scale s the bf16 results of the E4M3 codes come from 16-entry byte tables looked
 * up with vpshufb, as the 4-bit formats do; no multiply per element:
 *  - normal codes (e = 1..15, m): v = (1 + m/8) * 2^(e-7) = (1 + m/8) * 2^(p-7) * 4^h with
 *    p = e & 1, h = e >> 1; the table index m + 8p is the code's low nibble. With
 *    T[m + 8p] = bf16(f32((1 + m/8) * 2^(p-7) * s)), the result is T with 2h added to its
 *    exponent field, i.e. h added to its high byte (nothing carries into the low byte).
 *    That is the reference's bits while every product is a normal float32 (the float32
 *    rounding and the bf16 one then commute with the power of two): |s| >= 2^-119 makes the
 *    smallest, 2^-7 * |s|, normal; below |s| = 2^97 the largest (h = 7, up to 480 * |s| <
 *    2^106) are normal too; from 2^97 up they are compared bit for bit with the
 *    reference when the table is built (an overflow to inf in the bf16 rounding agrees, a
 *    float32 overflow does not; a subnormal T entry, shifted, would not agree either, so
 *    the 2^-119 bound is belt and braces). A scale that fails takes fp8_run, the multiply.
 *  - subnormal and zero codes (e = 0): U[m] = bf16(f32(m * 2^-9 * s)), the reference itself.
 *  - the sign: ADJ[high nibble] = h + 0x80 * sign is added to the high byte, mod 256. v * s
 *    with v < 0 is -(|v| * s) exactly and RNE is symmetric, so a negative code flips the
 *    sign bit of its result, whatever the sign of s (the zero codes too: 0 * s).
 *  - the NaN codes 0x7F / 0xFF: U[15] = 0x7FC0, no ADJ.
 * Tables are cached by column block (FP8_SLOTS per call), each one 64-byte line, and kept
 * while the block's scale value repeats: a DeepSeek 128 x 128 block builds its tables once per
 * 128-row band, not once per row. Where a call spans a row and a row's blocks fit the cache,
 * a band's tables are made current once when the band starts, so its rows run through them
 * with no scale read and no key test per block (a 32 x 32 block, DeepSeek-V4.1 with
 * scale_fmt "float", would pay those every 32 elements: 0.69x memcpy before, 1.03x and 1.09x
 * after, medians of 3 processes on a shared 2-core EPYC). */

enum { FP8_SLOTS = 512 };

/* A slot is two lines, its tables in the first: with one line a slot, the band's tables
 * contiguous, the 32 x 32 F32 row ran at 18 GB/s, with two at 21 (the E8M0 row's rate less
 * the table builds; with 80 or 96 bytes, tables across lines, 14); measured, not explained. */
enum { FP8_SLOT_BYTES = 128 };

typedef struct fp8_cache {
    _Alignas(64) uint8_t tab[FP8_SLOTS][FP8_SLOT_BYTES]; /* T (16 low bytes, 16 high), then U (the same) */
    uint32_t key[FP8_SLOTS];                 /* float32 bits of the slot's scale */
    uint8_t ok[FP8_SLOTS];                   /* the table path is exact for it */
} fp8_cache;

/* s -> the tables t (64 bytes, aligned); whether they may be used. The reference arithmetic,
 * in SIMD. */
static int fp8_tab_build(float s, uint8_t *t)
{
    const uint32_t a = bfs_f32_bits(s) & 0x7FFFFFFFu;
    if (a < 0x04000000u || a >= 0x7F800000u) /* |s| < 2^-119, inf, NaN */
        return 0;
    const __m256 sv = _mm256_set1_ps(s);
    const __m256 mant = _mm256_setr_ps(1.0f, 1.125f, 1.25f, 1.375f, 1.5f, 1.625f, 1.75f, 1.875f);
    const __m256 sub = _mm256_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f);
#define FP8_BF16(x, k) bf16_rne8(_mm256_castps_si256(_mm256_mul_ps(_mm256_mul_ps((x), _mm256_set1_ps(k)), sv)))
    const __m256i t0 = FP8_BF16(mant, 0x1p-7f), t1 = FP8_BF16(mant, 0x1p-6f);
    const __m256i u0 = FP8_BF16(sub, 0x1p-9f);
    /* 16 bf16 in order: T, U twice */
    const __m256i tw = _mm256_permute4x64_epi64(_mm256_packus_epi32(t0, t1), 0xD8);
    const __m256i uw = _mm256_permute4x64_epi64(_mm256_packus_epi32(u0, u0), 0xD8);
    if (a >= 0x70000000u) { /* |s| >= 2^97: the h = 7 products (up to 480 * |s|) compared */
        const __m256i c0 = FP8_BF16(mant, 0x1p7f), c1 = FP8_BF16(mant, 0x1p8f);
        const __m256i cw = _mm256_permute4x64_epi64(_mm256_packus_epi32(c0, c1), 0xD8);
        if (_mm256_movemask_epi8(_mm256_cmpeq_epi16(_mm256_add_epi16(tw, _mm256_set1_epi16(0x0700)), cw)) != -1)
            return 0;
    }
#undef FP8_BF16
    _mm256_store_si256((__m256i *)t, bf16_bytes16(tw));
    _mm256_store_si256((__m256i *)(t + 32), bf16_bytes16(uw));
    t[32 + 15] = 0xC0, t[32 + 31] = 0x7F; /* the NaN codes: 0x7FC0 */
    return 1;
}

/* slot j of c holds the tables of scale s afterwards; whether they may be used */
static inline int fp8_slot(fp8_cache *c, size_t j, float s)
{
    const uint32_t key = bfs_f32_bits(s);
    if (c->key[j] != key) {
        c->key[j] = key;
        c->ok[j] = (uint8_t)fp8_tab_build(s, c->tab[j]);
    }
    return c->ok[j];
}

/* The lookup itself, fp8_lut32, is in cpu_avx2.h (compressed-tensors MXFP8 uses it too). */

/* n E4M3 bytes through the tables t (T: low, high bytes) and u (U) -> n bf16 at o */
static inline void fp8_run_tab(const uint8_t *w, size_t n, const uint8_t *t, const uint8_t *u, uint16_t *o)
{
    const __m256i tl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t));
    const __m256i th = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(t + 16)));
    const __m256i ul = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)u));
    const __m256i uh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(u + 16)));
    size_t k = 0;
    for (; k + 32 <= n; k += 32)
        fp8_lut32(_mm256_loadu_si256((const __m256i *)(w + k)), tl, th, ul, uh, o + k);
    if (k == n)
        return;
    if (n >= 32) { /* the last 32, again over a few done ones */
        fp8_lut32(_mm256_loadu_si256((const __m256i *)(w + n - 32)), tl, th, ul, uh, o + n - 32);
        return;
    }
    _Alignas(32) uint8_t b[32] = {0};
    _Alignas(32) uint16_t r[32];
    memcpy(b, w, n);
    fp8_lut32(_mm256_load_si256((const __m256i *)b), tl, th, ul, uh, r);
    memcpy(o, r, n * 2);
}

/* E8M0 block scales (DeepSeek-V4: U8, or F8_E8M0 whose 255 is NaN): the scale byte picks
 * its tables directly, built once for all 256 bytes (the compressed-tensors MXFP8 ones, the
 * same value: bfs_ctmx_value is bfs_scaled_value by bfs_e8m0_to_f32); nothing is built per
 * block, which a 32 x 32 block (DeepSeek-V4.1) would pay every 1024 elements. The bytes
 * whose lookup is not exact (and 255, +inf or NaN) multiply. */
static void fp8_e8m0_blocks(const uint8_t *w, const uint8_t *sc, size_t nb, size_t bw, int nan255, uint16_t *o)
{
    const uint8_t *ok;
    const ct8_tab *const tabs = bfs__ct8_tables(&ok);
    for (size_t b = 0; b < nb; b++, w += bw, o += bw) {
        const uint8_t s = sc[b];
        if (!ok[s]) {
            fp8_run(w, bw, bfs_e8m0_scale(s, nan255), o);
            continue;
        }
        const ct8_tab *const t = &tabs[s];
        const __m256i tl = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)t->t));
        const __m256i th = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(t->t + 16)));
        const __m256i ul = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)t->u));
        const __m256i uh = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(t->u + 16)));
        for (size_t k = 0; k < bw; k += 32)
            fp8_lut32(_mm256_loadu_si256((const __m256i *)(w + k)), tl, th, ul, uh, o + k);
    }
}

static void fp8_e8m0(const bfs_fp8_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    const uint8_t *ok;
    const ct8_tab *const tabs = bfs__ct8_tables(&ok);
    const int nan255 = d->scale_type == BFS_SCALE_E8M0_NAN;
    const size_t C = d->cols, bw = d->bw, gcols = (C + bw - 1) / bw;
    uint16_t *o = out;
    for (size_t i = i0; i < i1;) {
        const size_t r = i / C, c0 = i % C;
        const size_t cend = i1 - r * C < C ? i1 - r * C : C;
        const uint8_t *const w = d->w + r * C, *const srow = d->scale + (r / d->bh) * gcols;
        size_t g = c0 / bw;
        for (size_t c = c0; c < cend; g++) {
            const size_t ce = (g + 1) * bw < cend ? (g + 1) * bw : cend;
            if (bw % 32 == 0 && c == g * bw && ce - c == bw) { /* whole blocks, to the row's last whole one */
                const size_t nb = (cend - c) / bw;
                fp8_e8m0_blocks(w + c, srow + g, nb, bw, nan255, o);
                o += nb * bw, c += nb * bw, g += nb - 1;
                continue;
            }
            const uint8_t s = srow[g];
            if (ok[s])
                fp8_run_tab(w + c, ce - c, tabs[s].t, tabs[s].u, o);
            else
                fp8_run(w + c, ce - c, bfs_e8m0_scale(s, nan255), o);
            o += ce - c;
            c = ce;
        }
        i = r * C + cend;
    }
}

/* nb whole blocks of width bw (a multiple of 32) of one row, column blocks g0.. whose scales
 * are entries sidx.. of d's grid -> nb * bw bf16 at o; the tables from the cache, made
 * current here unless fresh (the band's, all usable) */
static void fp8_blocks(const bfs_fp8_desc *d, const uint8_t *w, size_t sidx, size_t g0, size_t nb, fp8_cache *c,
                       int fresh, uint16_t *o)
{
    const size_t bw = d->bw;
    for (size_t b = 0; b < nb; b++, w += bw, o += bw) {
        const size_t j = (g0 + b) % FP8_SLOTS;
        if (!fresh && !fp8_slot(c, j, bfs_scale_at(d->scale, sidx + b, d->scale_type))) {
            fp8_run(w, bw, bfs_scale_at(d->scale, sidx + b, d->scale_type), o);
            continue;
        }
        const uint8_t *const t = c->tab[j];
        const __m256i tl = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)t));
        const __m256i th = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(t + 16)));
        const __m256i ul = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(t + 32)));
        const __m256i uh = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(t + 48)));
        for (size_t k = 0; k < bw; k += 32)
            fp8_lut32(_mm256_loadu_si256((const __m256i *)(w + k)), tl, th, ul, uh, o + k);
    }
}

/* the tables of the gcols scales at sc (one band) into slots 0..gcols-1; whether all are usable */
static int fp8_band(const bfs_fp8_desc *d, size_t sidx, size_t gcols, fp8_cache *c)
{
    int all = 1;
    for (size_t g = 0; g < gcols; g++)
        all &= fp8_slot(c, g, bfs_scale_at(d->scale, sidx + g, d->scale_type));
    return all;
}

void bfs__fp8_avx2(const bfs_fp8_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    assert(i0 <= i1 && d->cols > 0 && d->bh > 0 && d->bw > 0);
    if (d->scale_type == BFS_SCALE_E8M0 || d->scale_type == BFS_SCALE_E8M0_NAN) {
        fp8_e8m0(d, i0, i1, out);
        return;
    }
    const size_t C = d->cols, bw = d->bw, gcols = (C + bw - 1) / bw;
    fp8_cache cache; /* slot g % FP8_SLOTS: the tables of column block g's scale */
    for (size_t j = 0; j < FP8_SLOTS && j < gcols; j++)
        cache.key[j] = 0, cache.ok[j] = 0; /* right for s = +0.0, never ok */
    /* a band's tables made current once (fp8_band) where the call spans a row */
    const int banded = gcols <= FP8_SLOTS && i1 - i0 >= C;
    size_t band = SIZE_MAX;
    int fresh = 0; /* the band's slots are current and all usable */
    uint16_t *o = out;
    for (size_t i = i0; i < i1;) { /* a row at a time, its scale blocks without a division */
        const size_t r = i / C, c0 = i % C;
        const size_t cend = i1 - r * C < C ? i1 - r * C : C;
        const uint8_t *const w = d->w + r * C;
        const size_t srow = (r / d->bh) * gcols;
        if (banded && r / d->bh != band) {
            band = r / d->bh;
            fresh = fp8_band(d, srow, gcols, &cache);
        }
        size_t g = c0 / bw;
        for (size_t c = c0; c < cend; g++) {
            const size_t ce = (g + 1) * bw < cend ? (g + 1) * bw : cend;
            if (bw % 32 == 0 && c == g * bw && ce - c == bw) { /* whole blocks, to the row's last whole one */
                const size_t nb = (cend - c) / bw;
                fp8_blocks(d, w + c, srow + g, g, nb, &cache, fresh, o);
                o += nb * bw, c += nb * bw, g += nb - 1;
                continue;
            }
            const float s = bfs_scale_at(d->scale, srow + g, d->scale_type);
            const size_t j = g % FP8_SLOTS;
            if (fp8_slot(&cache, j, s))
                fp8_run_tab(w + c, ce - c, cache.tab[j], cache.tab[j] + 32, o);
            else
                fp8_run(w + c, ce - c, s, o);
            o += ce - c;
            c = ce;
        }
        i = r * C + cend;
    }
}

void bfs__int4_avx2(const bfs_int4_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    assert(i0 <= i1 && d->cols > 0 && d->group_size > 0 && d->group_size * d->ngroups == d->cols);
    const size_t C = d->cols;
    const __m256i iota0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i iota8 = _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15);
    for (size_t i = i0; i < i1;) {
        const size_t r = i / C, c = i % C, g = c / d->group_size;
        const size_t ce = (g + 1) * d->group_size < C ? (g + 1) * d->group_size : C;
        const size_t e = r * C + ce < i1 ? r * C + ce : i1;
        const float sf = bfs_scale_at(d->scale, r * d->ngroups + g, d->scale_bf16);
        const int z = bfs_int4_zp(d, r, g);
        const uint8_t *row = d->packed + r * d->wpr * 4; /* nibble c of the row: byte c/2 */
        uint16_t *o = out + (i - i0);
        size_t cc = c;
        const size_t cend = c + (e - i);
        /* the group's table: code k -> bf16(f32(k - 8 - z) * scale), k - 8 - z exact */
        const __m256 s = _mm256_set1_ps(sf);
        const __m256i off = _mm256_set1_epi32(8 + z);
        const __m256i w = bf16_pack16(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(iota0, off)), s),
                                      _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(iota8, off)), s));
        _Alignas(32) uint16_t lut[16];
        _mm256_store_si256((__m256i *)lut, w);
        if (cend - cc >= 32) {
            __m256i tl, th;
            lut16_split(w, &tl, &th);
            if (cc & 1) {
                *o++ = lut[bfs_int4_nibble(row + (cc / 8) * 4, (unsigned)(cc % 8))];
                cc++;
            }
            cc = lut_span(row, cc, cend, X86_MX, tl, th, &o); /* nibble cc of the row: byte cc / 2 */
        }
        for (; cc < cend; cc++)
            *o++ = lut[bfs_int4_nibble(row + (cc / 8) * 4, (unsigned)(cc % 8))];
        i = e;
    }
}

/* 8 bytes (the low 8 of x) -> 16 nibbles in element order (low nibble first), one per byte. */
static inline __m128i nibbles16(__m128i x)
{
    const __m128i m4 = _mm_set1_epi8(0x0F);
    return _mm_unpacklo_epi8(_mm_and_si128(x, m4), _mm_and_si128(_mm_srli_epi16(x, 4), m4));
}

/* One NVFP4 block (16 elements from element i, i % 16 == 0), any scale: per element. */
static inline void nv_block16(const bfs_nvfp4_desc *d, size_t i, uint16_t *o)
{
    const __m256 tab = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i seven = _mm256_set1_epi32(7), eight = _mm256_set1_epi32(8);
    /* element i is byte i/2 of the whole tensor (rows are whole bytes), scale i/16 */
    const float bs = bfs_nvfp4_block_scale(d->scale[i / 16], d->global_scale, d->modelopt);
    const __m256 s = _mm256_set1_ps(bs);
    const __m128i q = nibbles16(_mm_loadl_epi64((const __m128i *)(d->packed + i / 2)));
    __m256 a[2];
    for (int h = 0; h < 2; h++) {
        const __m256i code = _mm256_cvtepu8_epi32(h ? _mm_srli_si128(q, 8) : q);
        const __m256 mag = _mm256_permutevar8x32_ps(tab, _mm256_and_si256(code, seven));
        __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, eight), 28);
        if (d->modelopt) /* code 8 is +0.0 */
            sign = _mm256_andnot_si256(_mm256_cmpeq_epi32(code, eight), sign);
        a[h] = _mm256_mul_ps(_mm256_or_ps(mag, _mm256_castsi256_ps(sign)), s);
    }
    _mm256_storeu_si256((__m256i *)o, bf16_pack16(a[0], a[1]));
}

void bfs__nvfp4_avx2(const bfs_nvfp4_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    assert(i0 <= i1 && d->cols > 0 && d->cols % 16 == 0);
    const size_t C = d->cols;
    size_t i = i0;
    uint16_t *o = out;
    for (; i < i1 && (i & 15); i++) /* head: to a block boundary (blocks never straddle rows) */
        *o++ = bfs_nvfp4_elem(d, i / C, i % C);
    /* magnitudes 0 .5 1 1.5 | 2 3 4 6 of e2m1, in each lane */
    const __m256 mlo = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 0.0f, 0.5f, 1.0f, 1.5f);
    const __m256 mhi = _mm256_setr_ps(2.0f, 3.0f, 4.0f, 6.0f, 2.0f, 3.0f, 4.0f, 6.0f);
    /* per lane: the low bytes of 8 words twice; their high bytes, then again */
    const __m256i lo8 = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4,
                                         6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i hi8 = _mm256_add_epi8(lo8, _mm256_set1_epi8(1));
    /* the sign of codes 8..15; ModelOpt's code 8 is +0.0, the value of code 0 */
    const __m256i sign = d->modelopt ? _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, -128, -128, -128, -128, -128, -128, -128,
                                                        0, 0, 0, 0, 0, 0, 0, 0, 0, -128, -128, -128, -128, -128, -128, -128)
                                     : _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, -128, -128, -128, -128, -128, -128, -128, -128,
                                                        0, 0, 0, 0, 0, 0, 0, 0, -128, -128, -128, -128, -128, -128, -128, -128);
    /* the block scale of every E4M3 byte, by the reference (256 divides for compressed-
     * tensors' divisor once per call, not one per block); NaN where it is not finite or the
     * byte is E4M3's NaN: those blocks take the per-element path */
    _Alignas(32) float bst[256];
    for (int b = 0; b < 256; b++) {
        const float v = bfs_nvfp4_block_scale((uint8_t)b, d->global_scale, d->modelopt);
        bst[b] = (b & 0x7F) == 0x7F || !(fabsf(v) <= FLT_MAX) ? NAN : v;
    }
    const __m128 inf = _mm_castsi128_ps(_mm_set1_epi32(0x7F800000)), absm = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
    const __m256i b02 = _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2), b13 = _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3);
    for (; i + 64 <= i1; i += 64, o += 64) {
        const uint8_t *const sc = d->scale + i / 16;
        const __m128 bs = _mm_setr_ps(bst[sc[0]], bst[sc[1]], bst[sc[2]], bst[sc[3]]);
        if (_mm_movemask_ps(_mm_cmplt_ps(_mm_and_ps(bs, absm), inf)) != 15) { /* NaN: not finite */
            for (int b = 0; b < 4; b++)
                nv_block16(d, i + 16 * (size_t)b, o + 16 * b);
            continue;
        }
        /* x02 = per lane the 8 rounded magnitudes of block 0 | block 2; x13 of 1 | 3 */
        const __m256 bsy = _mm256_castps128_ps256(bs);
        const __m256 s02 = _mm256_permutevar8x32_ps(bsy, b02), s13 = _mm256_permutevar8x32_ps(bsy, b13);
        const __m256i x02 = _mm256_packus_epi32(bf16_rne8_nonan(_mm256_castps_si256(_mm256_mul_ps(mlo, s02))),
                                                bf16_rne8_nonan(_mm256_castps_si256(_mm256_mul_ps(mhi, s02))));
        const __m256i x13 = _mm256_packus_epi32(bf16_rne8_nonan(_mm256_castps_si256(_mm256_mul_ps(mlo, s13))),
                                                bf16_rne8_nonan(_mm256_castps_si256(_mm256_mul_ps(mhi, s13))));
        const __m256i tl02 = _mm256_shuffle_epi8(x02, lo8), th02 = _mm256_xor_si256(_mm256_shuffle_epi8(x02, hi8), sign);
        const __m256i tl13 = _mm256_shuffle_epi8(x13, lo8), th13 = _mm256_xor_si256(_mm256_shuffle_epi8(x13, hi8), sign);
        __m256i c0, c1; /* per lane: block 0 | 2, block 1 | 3 */
        x86_codes64(_mm256_loadu_si256((const __m256i *)(d->packed + i / 2)), X86_MX, &c0, &c1);
        lut_expand64x2(c0, c1, tl02, th02, tl13, th13, o);
    }
    for (; i + 16 <= i1; i += 16, o += 16)
        nv_block16(d, i, o);
    for (; i < i1; i++)
        *o++ = bfs_nvfp4_elem(d, i / C, i % C);
}

/* ---- casts ------------------------------------------------------------------------- */

static void f32_to_bf16_avx2(const void *in, size_t n, uint16_t *out)
{
    const unsigned char *const p = in; /* only unaligned loads */
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(out + i),
                            bf16_pack16(_mm256_loadu_ps((const float *)(p + 4 * i)),
                                        _mm256_loadu_ps((const float *)(p + 4 * i + 32))));
    bfs__cpu_scalar_ops.f32_to_bf16(p + 4 * i, n - i, out + i); /* the tail */
}

/* f16 -> f32 with vcvtph2ps is exact (subnormals too; not subject to DAZ). */
static void f16_to_bf16_avx2(const void *in, size_t n, uint16_t *out)
{
    const unsigned char *const p = in;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i)));
        const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i + 16)));
        _mm256_storeu_si256((__m256i *)(out + i), bf16_pack16(a, b));
    }
    bfs__cpu_scalar_ops.f16_to_bf16(p + 2 * i, n - i, out + i);
}

/* vcvtpd2ps rounds per MXCSR (nearest even by default), like C's (float)d. */
static void f64_to_bf16_avx2(const void *in, size_t n, uint16_t *out)
{
    const unsigned char *const p = in;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const double *const q = (const double *)(p + 8 * i);
        const __m256 a = _mm256_set_m128(_mm256_cvtpd_ps(_mm256_loadu_pd(q + 4)),
                                         _mm256_cvtpd_ps(_mm256_loadu_pd(q)));
        const __m256 b = _mm256_set_m128(_mm256_cvtpd_ps(_mm256_loadu_pd(q + 12)),
                                         _mm256_cvtpd_ps(_mm256_loadu_pd(q + 8)));
        _mm256_storeu_si256((__m256i *)(out + i), bf16_pack16(a, b));
    }
    bfs__cpu_scalar_ops.f64_to_bf16(p + 8 * i, n - i, out + i);
}

const bfs_kernel_ops bfs__cpu_avx2_ops = {
    .name = "avx2",
    .level = BFS_CPU_AVX2,
    .mxfp4 = bfs__mxfp4_avx2,
    .bnb4 = bnb4_avx2,
    .f32_to_bf16 = f32_to_bf16_avx2,
    .f16_to_bf16 = f16_to_bf16_avx2,
    .f64_to_bf16 = f64_to_bf16_avx2,
    .fp8 = bfs__fp8_avx2,
    .int4 = bfs__int4_avx2,
    .nvfp4 = bfs__nvfp4_avx2,
    .ctmx = bfs__ctmx_avx2, /* cpu_avx2_ctmx.c */
    .woq = bfs__woq_avx2, /* cpu_avx2_woq.c */
};
