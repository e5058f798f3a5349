/*
 * AVX2 compressed-tensors MX (level BFS_CPU_AVX2, also the AVX-512 level's): mxfp8-quantized,
 * mxfp4-pack-quantized and mxfp6-pack-quantized (docs/FORMATS.md 7.2, 7.3, 7.6), the bytes of cpu_scalar.c's
 * bfs__ctmx_scalar. Built with -mavx2 -mf16c -mbmi2 (the Makefile's KAVX2_SRC); the ops
 * tables of cpu_avx2.c and cpu_avx512.c point here (bfs__ctmx_avx2, cpu_x86.h).
 *
 *  - MXFP4: a value depends only on (scale byte, code): one 256 x 16 table of bf16 results
 *    (ct_lo / ct_hi), filled once by the reference itself (bfs_ctmx_value), looked up with
 *    vpshufb two 32-element groups per step (cpu_avx2.h's lut_expand64), as gpt-oss MXFP4
 *    does (cpu_avx2_mxfp4.c) with its own table -- here scale byte 255 is +inf, so a zero
 *    code gives NaN there, where gpt-oss's exact ldexp gives zero.
 *  - MXFP8: the E4M3 codes are looked up in the 16-entry tables of their group's scale byte
 *    (cpu_avx2.h's fp8_lut32, the FP8 kernel's lookup: a normal code's table entry with its
 *    exponent's high bits added to the high byte, the subnormal ones and NaN from a second
 *    table, the sign flipped for negative codes). The tables of all 256 scale bytes are built
 *    once by the reference and checked against it for every code; the bytes where the lookup
 *    is not the reference (subnormal results, overflow, the +inf of 255) multiply, element by
 *    element. Measured (one thread, AMD EPYC, medians of 3 processes): MXFP8 with an integer
 *    exponent add per element was 1.05x memcpy; by table it is the figure in docs/bench-results.md.
 *  - MXFP6: a value depends only on (scale byte, 6-bit code): a 257 x 64 table by the
 *    reference; the codes of a group's eight 24-bit words shifted out, packed to bytes and
 *    looked up with vpshufb in the row's magnitudes, the sign or-ed in (ct6_bytes; rows where
 *    that is not the table, byte 255, gather from it: ct6_groups). By gathers alone MXFP6 was
 *    0.31x memcpy (one thread, AMD EPYC); by bytes it is the figure in docs/bench-results.md.
 * The MXFP8 tables also serve the FP8 kernel's E8M0 block scales (DeepSeek-V4, cpu_avx2.c
 * fp8_e8m0, through bfs__ct8_tables). DeepSeek-V4's FP4 experts take the MXFP4 path; with nan255 (F8_E8M0 scales) byte 255 is
 * NaN, a 257th table row. Groups never straddle rows (cols % 32 == 0): element i is byte i (i / 2 for MXFP4) and
 * scale byte i / 32. Heads and tails go through the reference element (bfs_ctmx_elem).
 * No FTZ/DAZ, no float arithmetic but the reference's.
 */
#include "cpu_avx2.h"
#include "ref_formats.h"

#include <pthread.h>

/* ---- MXFP4 ------------------------------------------------------------------------ */

/* ct_lo[s][code], ct_hi[s][code]: low and high byte of the reference value of e2m1[code]
 * under scale byte s (255: +inf); row 256 is byte 255 as NaN (nan255, F8_E8M0 scales). */
static _Alignas(64) uint8_t ct_lo[257][16];
static _Alignas(64) uint8_t ct_hi[257][16];
static pthread_once_t ct_once = PTHREAD_ONCE_INIT;

static void ct_init(void)
{
    for (unsigned s = 0; s < 257; s++)
        for (unsigned code = 0; code < 16; code++) {
            const float sc = bfs_e8m0_scale((uint8_t)(s > 255 ? 255 : s), s > 255);
            const uint16_t v = bfs_scaled_value(bfs_e2m1_ct_to_f32(code), sc);
            ct_lo[s][code] = (uint8_t)(v & 0xFF);
            ct_hi[s][code] = (uint8_t)(v >> 8);
        }
}

/* The table row of scale byte s: s, or 256 for a NaN 255. */
static inline unsigned ct_row(const bfs_ctmx_desc *d, uint8_t s) { return s + (unsigned)(d->nan255 && s == 255); }

/* ng whole groups from group g0 -> ng * 32 bf16 at o. Low nibble = even element. */
static void ct4_groups(const bfs_ctmx_desc *d, size_t g0, size_t ng, uint16_t *o)
{
    const uint8_t *const blk = d->w + g0 * 16, *const sc = d->scale + g0;
    size_t g = 0;
    for (; g + 2 <= ng; g += 2) { /* two groups, one per lane */
        __m256i c0, c1;
        x86_codes64(_mm256_loadu_si256((const __m256i *)(blk + g * 16)), X86_MX, &c0, &c1);
        const unsigned s0 = ct_row(d, sc[g]), s1 = ct_row(d, sc[g + 1]);
        const __m256i tl = _mm256_loadu2_m128i((const __m128i *)ct_lo[s1], (const __m128i *)ct_lo[s0]);
        const __m256i th = _mm256_loadu2_m128i((const __m128i *)ct_hi[s1], (const __m128i *)ct_hi[s0]);
        lut_expand64(c0, c1, tl, th, o + g * 32);
    }
    if (g < ng) {
        __m128i c0, c1;
        x86_codes32(_mm_loadu_si128((const __m128i *)(blk + g * 16)), X86_MX, &c0, &c1);
        const unsigned s0 = ct_row(d, sc[g]);
        lut_expand32(c0, c1, _mm_load_si128((const __m128i *)ct_lo[s0]),
                     _mm_load_si128((const __m128i *)ct_hi[s0]), o + g * 32);
    }
}

/* ---- MXFP8 ------------------------------------------------------------------------ */

/* Per E8M0 byte s, the vpshufb tables of cpu_avx2.h's fp8_lut32 ("FP8 by table" in
 * cpu_avx2.c): T[m + 8p] = bf16((1 + m/8) * 2^(p-7) * 2^(s-127)) for the normal codes (the
 * exponent's high bits h = e >> 1 are added to T's high byte by the lookup), U[m] =
 * bf16(m * 2^-9 * 2^(s-127)) for the subnormal ones, U[15] = 0x7FC0 for the NaN codes; each
 * by the reference (bfs_ctmx_value). A byte's tables are used only when the lookup gives the
 * reference's bits for all 256 codes, checked once here (bytes 8..246: every shifted product
 * is a normal bf16); the others (subnormal results, overflow, the +inf of 255) multiply. */
static ct8_tab ct8[256];
static uint8_t ct8_ok[256];
static pthread_once_t ct8_once = PTHREAD_ONCE_INIT;

static void ct8_init(void)
{
    for (unsigned s = 0; s < 256; s++) {
        uint16_t T[16], U[16] = {0};
        for (unsigned k = 0; k < 16; k++) {
            const float v = (1.0f + (float)(k & 7) / 8.0f) * ((k & 8) ? 0x1p-6f : 0x1p-7f); /* exact */
            T[k] = bfs_ctmx_value(v, (uint8_t)s);
            if (k < 8)
                U[k] = bfs_ctmx_value(bfs_e4m3_to_f32((uint8_t)k), (uint8_t)s);
        }
        U[15] = 0x7FC0;
        for (unsigned k = 0; k < 16; k++) {
            ct8[s].t[k] = (uint8_t)T[k], ct8[s].t[16 + k] = (uint8_t)(T[k] >> 8);
            ct8[s].u[k] = (uint8_t)U[k], ct8[s].u[16 + k] = (uint8_t)(U[k] >> 8);
        }
        /* the lookup, element by element, against the reference for every code */
        unsigned ok = 1;
        for (unsigned b = 0; b < 256 && ok; b++) {
            const unsigned idx = b & 15, hn = b >> 4, nan = (b & 0x7F) == 0x7F, spec = (b & 0x78) == 0 || nan;
            uint16_t v = spec ? U[nan ? 15 : idx] : T[idx];
            if (!nan)
                v = (uint16_t)(v + (((hn & 7) + (hn & 8) * 16u) << 8)); /* ADJ: h, the sign */
            ok = v == bfs_ctmx_value(bfs_e4m3_to_f32((uint8_t)b), (uint8_t)s);
        }
        ct8_ok[s] = (uint8_t)(ok && s != 255); /* 255 depends on nan255: always multiplied */
    }
}

const ct8_tab *bfs__ct8_tables(const uint8_t **ok)
{
    pthread_once(&ct8_once, ct8_init);
    *ok = ct8_ok;
    return ct8;
}

/* ng whole groups from group g0 -> ng * 32 bf16 at o. */
static void ct8_groups(const bfs_ctmx_desc *d, size_t g0, size_t ng, uint16_t *o)
{
    for (size_t g = g0; g < g0 + ng; g++, o += 32) {
        const uint8_t s = d->scale[g];
        const uint8_t *const w = d->w + g * 32;
        if (!ct8_ok[s]) { /* ct8_ok[255] is 0: byte 255 (+inf, or NaN with nan255) multiplies */
            const float sf = bfs_e8m0_scale(s, d->nan255);
            for (size_t j = 0; j < 32; j++)
                o[j] = bfs_scaled_value(bfs_e4m3_to_f32(w[j]), sf);
            continue;
        }
        const ct8_tab *const t = &ct8[s];
        fp8_lut32(_mm256_loadu_si256((const __m256i *)w),
                  _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)t->t)),
                  _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(t->t + 16))),
                  _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)t->u)),
                  _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(t->u + 16))), o);
    }
}

/* ---- MXFP6 ------------------------------------------------------------------------ */

/* ct6[row][code]: the reference value of E2M3 code (0..63, sign included) under scale row
 * (ct_row: byte s, 256 = 255 as NaN), as a 32-bit gather entry. */
static _Alignas(64) uint32_t ct6[257][64];
static pthread_once_t ct6_once = PTHREAD_ONCE_INIT;

static void ct6_init(void)
{
    for (unsigned s = 0; s < 257; s++)
        for (unsigned code = 0; code < 64; code++)
            ct6[s][code] = bfs_scaled_value(bfs_e2m3_to_f32(code), bfs_e8m0_scale((uint8_t)(s > 255 ? 255 : s), s > 255));
}

/* ng whole groups from group g0 -> ng * 32 bf16 at o. A group is 24 bytes, eight 24-bit
 * words: bytes 0..15 and 8..23 (never past the group) are loaded into the two lanes, vpshufb
 * puts word k in dword k; the 8 elements 8q.. are codes 0..3 of words 2q, 2q + 1, shifted
 * out by vpsrlvd and looked up by vpgatherdd in the group's row. */
static void ct6_groups(const bfs_ctmx_desc *d, size_t g0, size_t ng, uint16_t *o)
{
    const __m256i words = _mm256_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1,
                                           4, 5, 6, -1, 7, 8, 9, -1, 10, 11, 12, -1, 13, 14, 15, -1);
    const __m256i shifts = _mm256_setr_epi32(0, 6, 12, 18, 0, 6, 12, 18), m63 = _mm256_set1_epi32(63);
    for (size_t g = g0; g < g0 + ng; g++, o += 32) {
        const uint8_t *const p = d->w + g * 24;
        const __m256i raw = _mm256_loadu2_m128i((const __m128i *)(p + 8), (const __m128i *)p);
        const __m256i w = _mm256_shuffle_epi8(raw, words);
        const int *const tab = (const int *)ct6[ct_row(d, d->scale[g])];
        __m256i r[4];
        for (int q = 0; q < 4; q++) {
            const __m256i sel = _mm256_setr_epi32(2 * q, 2 * q, 2 * q, 2 * q, 2 * q + 1, 2 * q + 1, 2 * q + 1, 2 * q + 1);
            const __m256i code = _mm256_and_si256(_mm256_srlv_epi32(_mm256_permutevar8x32_epi32(w, sel), shifts), m63);
            r[q] = _mm256_i32gather_epi32(tab, code, 4);
        }
        /* packus interleaves the lanes: [r0 lo, r1 lo, r0 hi, r1 hi] -> r0, r1 in order */
        _mm256_storeu_si256((__m256i *)o, _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xD8));
        _mm256_storeu_si256((__m256i *)(o + 16), _mm256_permute4x64_epi64(_mm256_packus_epi32(r[2], r[3]), 0xD8));
    }
}

/* The byte path of MXFP6: a value is +-(|code| under the scale), the sign the code's bit 5
 * (x * s rounds symmetrically), so per scale row two 16-entry halves of the 32 magnitudes'
 * low and high bytes (c6_lo / c6_hi [row][0..31]) looked up with vpshufb, 32 codes at once;
 * c6_ok[row]: that gives the reference (ct6) for all 64 codes. Rows whose products include
 * NaN (byte 255: 0 * inf, or NaN) are not: they take ct6_groups. */
static _Alignas(64) uint8_t c6_lo[257][32];
static _Alignas(64) uint8_t c6_hi[257][32];
static uint8_t c6_ok[257];

static void c6_init(void)
{
    ct6_init();
    for (unsigned r = 0; r < 257; r++) {
        unsigned ok = 1;
        for (unsigned code = 0; code < 32; code++)
            c6_lo[r][code] = (uint8_t)ct6[r][code], c6_hi[r][code] = (uint8_t)(ct6[r][code] >> 8);
        for (unsigned code = 0; code < 64 && ok; code++)
            ok = ct6[r][code] == (ct6[r][code & 31] | (code & 32u) << 10);
        c6_ok[r] = (uint8_t)ok;
    }
}

/* ng whole groups from group g0 -> ng * 32 bf16 at o, by bytes (c6_*), a row not c6_ok by
 * ct6_groups. The codes of a group's eight 24-bit words (dword k = word k, as ct6_groups):
 * code j of every word by a shift and a mask, packed to bytes (lane: code j of word k' at
 * 4j + k'), put in element order (4k' + j) by one vpshufb, then looked up. */
static void ct6_bytes(const bfs_ctmx_desc *d, size_t g0, size_t ng, uint16_t *o)
{
    const __m256i words = _mm256_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1,
                                           4, 5, 6, -1, 7, 8, 9, -1, 10, 11, 12, -1, 13, 14, 15, -1);
    const __m256i tr = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                        0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i m63 = _mm256_set1_epi32(63), m15 = _mm256_set1_epi8(15), m32 = _mm256_set1_epi8(32);
    for (size_t g = g0; g < g0 + ng; g++, o += 32) {
        const unsigned row = ct_row(d, d->scale[g]);
        if (!c6_ok[row]) {
            ct6_groups(d, g, 1, o);
            continue;
        }
        const uint8_t *const p = d->w + g * 24;
        const __m256i w = _mm256_shuffle_epi8(_mm256_loadu2_m128i((const __m128i *)(p + 8), (const __m128i *)p), words);
        const __m256i c0 = _mm256_and_si256(w, m63), c1 = _mm256_and_si256(_mm256_srli_epi32(w, 6), m63);
        const __m256i c2 = _mm256_and_si256(_mm256_srli_epi32(w, 12), m63), c3 = _mm256_srli_epi32(w, 18);
        const __m256i c = _mm256_shuffle_epi8(
            _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3)), tr);
        const __m256i idx = _mm256_and_si256(c, m15);
        const __m256i hi16 = _mm256_slli_epi16(c, 3); /* bit 4 of each code -> bit 7 of its byte */
        const __m256i tl0 = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)c6_lo[row]));
        const __m256i tl1 = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(c6_lo[row] + 16)));
        const __m256i th0 = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)c6_hi[row]));
        const __m256i th1 = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(c6_hi[row] + 16)));
        const __m256i lo = _mm256_blendv_epi8(_mm256_shuffle_epi8(tl0, idx), _mm256_shuffle_epi8(tl1, idx), hi16);
        __m256i hi = _mm256_blendv_epi8(_mm256_shuffle_epi8(th0, idx), _mm256_shuffle_epi8(th1, idx), hi16);
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(c, m32), 2)); /* the sign */
        const __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi);
        _mm256_storeu_si256((__m256i *)o, _mm256_permute2x128_si256(a, b, 0x20));
        _mm256_storeu_si256((__m256i *)(o + 16), _mm256_permute2x128_si256(a, b, 0x31));
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
    if (d->elem == BFS_CTMX_E2M1) {
        pthread_once(&ct_once, ct_init);
        ct4_groups(d, i / 32, ng, o);
    } else if (d->elem == BFS_CTMX_E2M3) {
        pthread_once(&ct6_once, c6_init);
        ct6_bytes(d, i / 32, ng, o);
    } else {
        pthread_once(&ct8_once, ct8_init);
        ct8_groups(d, i / 32, ng, o);
    }
    i += ng * 32;
    o += ng * 32;
    for (; i < i1; i++)
        *o++ = bfs_ctmx_elem(d, i);
}
