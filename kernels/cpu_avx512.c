/*
 * AVX-512 kernels (level BFS_CPU_AVX512: F, BW, VL, DQ): the bytes of
 * cpu_scalar.c, faster. Run only where cpu_dispatch.c found the features.
 *
 * Same plan as cpu_avx2.c; what AVX-512 changes:
 *  - 4-bit codes are widened to words and looked up with vpermw in a 16-word
 *    bf16 table (one instruction for 32 elements, no low/high byte split);
 *  - float32 -> bf16 packs 32 results with one vpermt2w.
 * bf16 rounding is the integer rule of ref.h, not vcvtneps2bf16 (AVX512_BF16):
 * that instruction flushes subnormal inputs to zero and keeps a NaN's sign and
 * payload instead of giving 0x7FC0, so its bytes differ from upstream's.
 * The transposed MXFP4 path is cpu_avx2_mxfp4.c's (tile, 16x16 transposes in L1,
 * non-temporal runs per output row), fed by this file's row dequant; what the two
 * files share is in cpu_x86.h. No FTZ/DAZ. Tails (fewer than 16..32 elements) are
 * the scalar reference's (cpu_scalar.c).
 *
 * Built with -DBFS_AVX512_SIMDE (and without the -mavx512* flags), this file
 * runs on any x86-64 through SIMDe's emulation of the AVX-512 intrinsics, under
 * another symbol: tests/test_kernels.c uses that to check the logic of this
 * file on CPUs without AVX-512 (see the command there). The emulation does not
 * prove the instructions' own arithmetic, which is the AVX2 file's (cvtph2ps,
 * cvtpd2ps, mulps) or IEEE's.
 */
#include <pthread.h>

#if defined(BFS_AVX512_SIMDE)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#define BFS_AVX512_OPS bfs__cpu_avx512_emu_ops
#else
#include <immintrin.h>
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || \
    !defined(__AVX512DQ__) || !defined(__F16C__)
#error "kernels/cpu_avx512.c must be built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mf16c -mbmi2"
#endif
#define BFS_AVX512_OPS bfs__cpu_avx512_ops
#endif

#if defined(BFS_AVX512_SIMDE) /* what SIMDe 0.7 lacks, element by element */
static inline __m256i cvt_epi32_epi16(__m512i v)
{
    int32_t d[16];
    int16_t w[16];
    _mm512_storeu_si512(d, v);
    for (int i = 0; i < 16; i++)
        w[i] = (int16_t)d[i];
    return _mm256_loadu_si256((const __m256i *)w);
}
static inline __m512 cvt_ph_ps(__m256i h)
{
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_cvtph_ps(_mm256_castsi256_si128(h))),
                              _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), 1);
}
static inline __m256 cvt_pd_ps(__m512d v)
{
    double d[8];
    float f[8];
    _mm512_storeu_pd(d, v);
    for (int i = 0; i < 8; i++)
        f[i] = (float)d[i];
    return _mm256_loadu_ps(f);
}
#else
#define cvt_epi32_epi16 _mm512_cvtepi32_epi16 /* vpmovdw: truncates */
#define cvt_ph_ps _mm512_cvtph_ps
#define cvt_pd_ps _mm512_cvtpd_ps
#endif

#include "cpu_x86.h"

/* ---- bf16 rounding ------------------------------------------------------------- */

/* 16 float32 bit patterns -> bf16 (RNE, NaN -> 0x7FC0), one per dword. */
static inline __m512i bf16_rne16(__m512i u)
{
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r =
        _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
    return _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
}

/* word 2k of the pair (a, b): the low halves of 32 dwords, in order */
static const uint16_t even_words[32] = {0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20,
                                        22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42,
                                        44, 46, 48, 50, 52, 54, 56, 58, 60, 62};

/* 32 floats (a then b) -> 32 bf16 in order. */
static inline __m512i bf16_pack32(__m512 a, __m512 b, __m512i even)
{
    return _mm512_permutex2var_epi16(bf16_rne16(_mm512_castps_si512(a)), even,
                                     bf16_rne16(_mm512_castps_si512(b)));
}

/* 32 codes (bytes, each < 16) -> 32 bf16 from the 16-word table lut. */
static inline __m512i lut_words32(__m256i codes, __m512i lut)
{
    /* sign and zero extension agree on codes < 16 */
    return _mm512_permutexvar_epi16(_mm512_cvtepi8_epi16(codes), lut);
}

static inline __m512i lut_load16(const uint16_t *t)
{
    return _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)t));
}

/* ---- MXFP4 ----------------------------------------------------------------------- */

/* mx_lut[s][code] = bfs_mxfp4_value(code, 2^(s-127)) */
static _Alignas(64) uint16_t mx_lut[256][16];
static pthread_once_t mx_once = PTHREAD_ONCE_INIT;

static void mx_init(void)
{
    for (unsigned s = 0; s < 256; s++)
        for (unsigned code = 0; code < 16; code++)
            mx_lut[s][code] = bfs_mxfp4_value(code, bfs_e8m0_to_f32((uint8_t)s));
}

/* ng consecutive groups of one row -> ng*32 bf16 at o. Low nibble = even element. */
static inline void mx_groups(const uint8_t *blk, const uint8_t *sc, size_t ng, uint16_t *o)
{
    size_t g = 0;
    for (; g + 2 <= ng; g += 2) {
        __m256i u0, u1; /* u0: A 0..15 | B 0..15, u1: A 16..31 | B 16..31 */
        x86_codes64(_mm256_loadu_si256((const __m256i *)(blk + g * 16)), X86_MX, &u0, &u1);
        _mm512_storeu_si512(o + g * 32, lut_words32(_mm256_permute2x128_si256(u0, u1, 0x20),
                                                    lut_load16(mx_lut[sc[g]])));
        _mm512_storeu_si512(o + g * 32 + 32, lut_words32(_mm256_permute2x128_si256(u0, u1, 0x31),
                                                         lut_load16(mx_lut[sc[g + 1]])));
    }
    if (g < ng) {
        __m128i c0, c1;
        x86_codes32(_mm_loadu_si128((const __m128i *)(blk + g * 16)), X86_MX, &c0, &c1);
        const __m256i codes = _mm256_set_m128i(c1, c0);
        _mm512_storeu_si512(o + g * 32, lut_words32(codes, lut_load16(mx_lut[sc[g]])));
    }
}

static void mxfp4_avx512(const bfs_mxfp4_desc *d, size_t item, size_t o0, size_t o1,
                         uint16_t *out)
{
    pthread_once(&mx_once, mx_init);
    x86_mxfp4(d, item, o0, o1, out, mx_groups);
}

/* ---- bitsandbytes 4-bit ---------------------------------------------------------------- */

static void bnb4_avx512(const bfs_bnb4_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    x86_bnb_walk walk = x86_bnb_start(d, i0, i1); /* checks the descriptor */
    if (i0 == i1)
        return;
    const __m512 table = _mm512_loadu_ps(d->table);
    const uint8_t *const codes = d->codes;
    size_t e, bend;
    float scale;
    uint16_t *o = out;
    while (x86_bnb_next(&walk, &e, &bend, &scale)) {
        _Alignas(32) uint16_t lut[16];
        _mm256_store_si256((__m256i *)lut,
                           cvt_epi32_epi16(bf16_rne16(_mm512_castps_si512(
                               _mm512_mul_ps(table, _mm512_set1_ps(scale))))));
        const __m512i t = lut_load16(lut);

        if (e & 1) { /* starts on the second element of a byte */
            o = x86_bnb_lut_run(lut, codes, e, e + 1, o);
            e++;
        }
        for (; e + 64 <= bend; e += 64, o += 64) {
            __m256i u0, u1; /* u0: 0..15 | 32..47, u1: 16..31 | 48..63 */
            x86_codes64(_mm256_loadu_si256((const __m256i *)(codes + e / 2)), X86_BNB, &u0, &u1);
            _mm512_storeu_si512(o, lut_words32(_mm256_permute2x128_si256(u0, u1, 0x20), t));
            _mm512_storeu_si512(o + 32, lut_words32(_mm256_permute2x128_si256(u0, u1, 0x31), t));
        }
        if (e + 32 <= bend) {
            __m128i c0, c1;
            x86_codes32(_mm_loadu_si128((const __m128i *)(codes + e / 2)), X86_BNB, &c0, &c1);
            _mm512_storeu_si512(o, lut_words32(_mm256_set_m128i(c1, c0), t));
            e += 32;
            o += 32;
        }
        o = x86_bnb_lut_run(lut, codes, e, bend, o);
    }
}

/* ---- casts ----------------------------------------------------------------------------- */

static void f32_to_bf16_avx512(const void *in, size_t n, uint16_t *out)
{
    const unsigned char *const p = in; /* only unaligned loads */
    const __m512i even = _mm512_loadu_si512(even_words);
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        _mm512_storeu_si512(out + i, bf16_pack32(_mm512_loadu_ps(p + 4 * i),
                                                 _mm512_loadu_ps(p + 4 * i + 64), even));
    bfs__cpu_scalar_ops.f32_to_bf16(p + 4 * i, n - i, out + i); /* the tail */
}

/* f16 -> f32 with vcvtph2ps is exact (subnormals too; not subject to DAZ). */
static void f16_to_bf16_avx512(const void *in, size_t n, uint16_t *out)
{
    const unsigned char *const p = in;
    const __m512i even = _mm512_loadu_si512(even_words);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 a = cvt_ph_ps(_mm256_loadu_si256((const __m256i *)(p + 2 * i)));
        const __m512 b = cvt_ph_ps(_mm256_loadu_si256((const __m256i *)(p + 2 * i + 32)));
        _mm512_storeu_si512(out + i, bf16_pack32(a, b, even));
    }
    bfs__cpu_scalar_ops.f16_to_bf16(p + 2 * i, n - i, out + i);
}

/* vcvtpd2ps rounds per MXCSR (nearest even by default), like C's (float)d. */
static void f64_to_bf16_avx512(const void *in, size_t n, uint16_t *out)
{
    const unsigned char *const p = in;
    const __m512i even = _mm512_loadu_si512(even_words);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 f[2];
        for (int h = 0; h < 2; h++) {
            const unsigned char *const q = p + 8 * (i + 16 * (size_t)h);
            f[h] = _mm512_insertf32x8(_mm512_castps256_ps512(cvt_pd_ps(_mm512_loadu_pd(q))),
                                      cvt_pd_ps(_mm512_loadu_pd(q + 64)), 1);
        }
        _mm512_storeu_si512(out + i, bf16_pack32(f[0], f[1], even));
    }
    bfs__cpu_scalar_ops.f64_to_bf16(p + 8 * i, n - i, out + i);
}

const bfs_kernel_ops BFS_AVX512_OPS = {
    .name = "avx512",
    .level = BFS_CPU_AVX512,
    .mxfp4 = mxfp4_avx512,
    .bnb4 = bnb4_avx512,
    .f32_to_bf16 = f32_to_bf16_avx512,
    .f16_to_bf16 = f16_to_bf16_avx512,
    .f64_to_bf16 = f64_to_bf16_avx512,
    .fp8 = bfs__fp8_avx2, /* the AVX2 kernels (cpu_x86.h): memory-bound, 512-bit gains nothing measurable */
    .int4 = bfs__int4_avx2,
    .nvfp4 = bfs__nvfp4_avx2,
    .ctmx = bfs__ctmx_avx2, /* cpu_avx2_ctmx.c: memory-bound as well */
    .woq = bfs__woq_avx2, /* cpu_avx2_woq.c */
};
