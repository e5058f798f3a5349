/*
 * AVX2 kernels (level BFS_CPU_AVX2): the bytes of cpu_scalar.c, faster.
 * Built with -mavx2 -mf16c -mbmi2; run only where cpu_dispatch.c found them.
 *
 * 4-bit formats: a value depends only on (code, scale), so each scale gets a
 * 16-entry table of bf16 results, computed with the reference arithmetic
 * (float32 product, then round to nearest even), and the codes are looked up
 * in it with vpshufb: one shuffle for the low bytes, one for the high bytes.
 *  - MXFP4 has 256 scales: one table of 256 x 16 values, filled once by
 *    ref.h itself (bfs_mxfp4_value).
 *  - bnb has one float scale per block: its table is built per block with a
 *    float32 multiply and the bf16 rounding below, in SIMD.
 * The transposed MXFP4 layout transposes the code bytes (4x fewer than the
 * output) and adds the scale to the exponent field (see its section), and
 * streams each column's 32-row runs as whole lines with non-temporal stores.
 * No FTZ/DAZ: subnormal products and inputs are computed as IEEE says.
 */
#include <immintrin.h>

#include "cpu_x86.h"
#include "ref_formats.h"

#include <float.h>
#include <math.h>
#include <pthread.h>

#if !defined(__AVX2__) || !defined(__F16C__)
#error "kernels/cpu_avx2.c must be built with -mavx2 -mf16c -mbmi2"
#endif

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

/* ---- MXFP4 ------------------------------------------------------------------------ */

/* mx_lo[s][code], mx_hi[s][code]: low and high byte of bfs_mxfp4_value(code, 2^(s-127)). */
static _Alignas(64) uint8_t mx_lo[256][16];
static _Alignas(64) uint8_t mx_hi[256][16];
static pthread_once_t mx_once = PTHREAD_ONCE_INIT;

static void mx_init(void)
{
    for (unsigned s = 0; s < 256; s++)
        for (unsigned code = 0; code < 16; code++) {
            const uint16_t v = bfs_mxfp4_value(code, bfs_e8m0_to_f32((uint8_t)s));
            mx_lo[s][code] = (uint8_t)(v & 0xFF);
            mx_hi[s][code] = (uint8_t)(v >> 8);
        }
}

/* ng consecutive groups of one row (blocks blk, scales sc) -> ng*32 bf16 at o.
 * Low nibble = even element. */
static inline void mx_groups(const uint8_t *blk, const uint8_t *sc, size_t ng, uint16_t *o)
{
    size_t g = 0;
    for (; g + 2 <= ng; g += 2) { /* two groups, one per lane */
        __m256i c0, c1; /* per lane: elements 0..15, then 16..31 of that lane's group */
        x86_codes64(_mm256_loadu_si256((const __m256i *)(blk + g * 16)), X86_MX, &c0, &c1);
        const __m256i tl = _mm256_loadu2_m128i((const __m128i *)mx_lo[sc[g + 1]],
                                               (const __m128i *)mx_lo[sc[g]]);
        const __m256i th = _mm256_loadu2_m128i((const __m128i *)mx_hi[sc[g + 1]],
                                               (const __m128i *)mx_hi[sc[g]]);
        lut_expand64(c0, c1, tl, th, o + g * 32);
    }
    if (g < ng) {
        __m128i c0, c1;
        x86_codes32(_mm_loadu_si128((const __m128i *)(blk + g * 16)), X86_MX, &c0, &c1);
        lut_expand32(c0, c1, _mm_load_si128((const __m128i *)mx_lo[sc[g]]),
                     _mm_load_si128((const __m128i *)mx_hi[sc[g]]), o + g * 32);
    }
}

/* ---- MXFP4, transposed layout ------------------------------------------------------
 * Output row c (source column) holds the R source rows: out[c][r] = value(r, c). A tile is
 * 16 source rows of one group (rows r..r+7 in lane 0, r+8..r+15 in lane 1); an 8x16 byte
 * transpose per lane puts each code byte position's 8 rows in one qword, so after the nibble
 * split and the vpshufb lookups, one unpack gives a column's 16 rows as 16 bf16, in order.
 * The value is not looked up per scale: for s in [2, 252] the product e2m1 * 2^(s-127) is a
 * normal bf16 (exponents 1..254), so it is the bf16 of the e2m1 value with s - 127 added to
 * its exponent field (zero stays zero) -- exact, and the reference's bits. Any other scale in
 * a tile sends that tile through the 256 x 16 table (mx_lo / mx_hi), also the reference's.
 * Two tiles (32 rows) make each column's run one whole 64-byte line: streamed with two
 * back-to-back non-temporal stores when the run is line-aligned (no read for ownership, the
 * write-combining buffer completes at once). Loop order: blocks of TX_RB rows, within them
 * strips of TX_GS groups (one 64-byte input line per row), 32-row tiles down the block, with
 * the next tiles' input lines prefetched (their stride, G * 16 bytes, defeats the hardware
 * prefetcher). A strip of whole groups (the common case) takes the fast path: the scale
 * bytes of 4 groups x 32 rows come with 4 gathers and a byte transpose, the range check is
 * one vector compare, each group's two next tiles go in turn (128-byte runs per column,
 * fewer open DRAM rows than 64), and the tile body is inlined with no per-column tests.
 * Tuned on AMD Zen 3 (TX_GS 1..8, TX_RB 128..5760, 1..4 tiles per group): 0.97x memcpy
 * before the fast path, 1.17-1.28x (median of 10-12 processes) with it. */
enum { TX_GS = 4, TX_RB = 256 };
_Static_assert(TX_GS == 4, "the fast path gathers the scales of 4 groups (tx_scales4x32)");

/* 16 rows from p (row stride rs) of one group -> d[q]: per lane (rows 0..7 | 8..15),
 * qword 0 = code byte 2q of the 8 rows, qword 1 = code byte 2q + 1. */
#define TX_INLINE static inline __attribute__((always_inline))

TX_INLINE void tx_bytes16(const uint8_t *p, size_t rs, __m256i d[8])
{
    __m256i a[8], b[8];
    for (int i = 0; i < 8; i++)
        a[i] = _mm256_loadu2_m128i((const __m128i *)(p + (size_t)(i + 8) * rs), (const __m128i *)(p + (size_t)i * rs));
    for (int j = 0; j < 4; j++) { /* words: rows 2j, 2j+1 at byte k (b[2j]: k < 8) */
        b[2 * j] = _mm256_unpacklo_epi8(a[2 * j], a[2 * j + 1]);
        b[2 * j + 1] = _mm256_unpackhi_epi8(a[2 * j], a[2 * j + 1]);
    }
    for (int h = 0; h < 2; h++) { /* dwords: rows 4h..4h+3 at byte 4k + dword (a[4h + k]) */
        a[4 * h + 0] = _mm256_unpacklo_epi16(b[4 * h], b[4 * h + 2]);
        a[4 * h + 1] = _mm256_unpackhi_epi16(b[4 * h], b[4 * h + 2]);
        a[4 * h + 2] = _mm256_unpacklo_epi16(b[4 * h + 1], b[4 * h + 3]);
        a[4 * h + 3] = _mm256_unpackhi_epi16(b[4 * h + 1], b[4 * h + 3]);
    }
    for (int k = 0; k < 4; k++) { /* qwords: rows 0..7 at bytes 4k..4k+1 and 4k+2..4k+3 */
        d[2 * k] = _mm256_unpacklo_epi32(a[k], a[4 + k]);
        d[2 * k + 1] = _mm256_unpackhi_epi32(a[k], a[4 + k]);
    }
}

/* bf16 of e2m1 code 0..15: low bytes, high bytes (one lane's worth) */
#define TX_LO 0x00, 0x00, (char)0x80, (char)0xC0, 0x00, 0x40, (char)0x80, (char)0xC0
#define TX_HI 0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40, \
              (char)0x80, (char)0xBF, (char)0xBF, (char)0xBF, (char)0xC0, (char)0xC0, (char)0xC0, (char)0xC0

/* codes x (per lane: qword 0 = column c, qword 1 = column c + 2, of 8 rows) -> the two
 * columns' 16 rows each; adj = (s - 127) << 7 per row, added to nonzero values. */
TX_INLINE void tx_values(__m256i x, __m256i adj, __m256i *v0, __m256i *v1)
{
    const __m256i tl = _mm256_setr_epi8(TX_LO, TX_LO, TX_LO, TX_LO);
    const __m256i th = _mm256_setr_epi8(TX_HI, TX_HI);
    const __m256i mag = _mm256_set1_epi16(0x7FFF);
    const __m256i l = _mm256_shuffle_epi8(tl, x), h = _mm256_shuffle_epi8(th, x);
    const __m256i w0 = _mm256_unpacklo_epi8(l, h), w1 = _mm256_unpackhi_epi8(l, h);
    *v0 = _mm256_add_epi16(w0, _mm256_sign_epi16(adj, _mm256_and_si256(w0, mag)));
    *v1 = _mm256_add_epi16(w1, _mm256_sign_epi16(adj, _mm256_and_si256(w1, mag)));
}

/* n scale bytes all in [2, 252], where the exponent add is exact */
static inline int tx_scales_ok(const uint8_t *s, size_t n)
{
    unsigned bad = 0;
    for (size_t i = 0; i < n; i++)
        bad |= (unsigned)s[i] - 2u > 250u;
    return !bad;
}

/* 16 * nh rows (nh = 1, 2) of one group from grp (row stride rs), scales s (16 * nh, all
 * ok) -> columns [ca, cb) of the group at o + c * R (o: the group's column 0, first row).
 * nt: stream; the caller made each column's 32-row run one aligned line. */
static inline void tx_tile(const uint8_t *grp, size_t rs, const uint8_t *s, int nh, size_t ca,
                           size_t cb, uint16_t *o, size_t R, int nt)
{
    __m256i d[2][8], adj[2];
    for (int h = 0; h < nh; h++) {
        tx_bytes16(grp + (size_t)h * 16 * rs, rs, d[h]);
        const __m256i sv = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(s + 16 * h)));
        adj[h] = _mm256_slli_epi16(_mm256_sub_epi16(sv, _mm256_set1_epi16(127)), 7);
    }
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (size_t q = 0; q < 8; q++) {
        __m256i v[2][4]; /* [half][column 4q + k] */
        for (int h = 0; h < nh; h++) {
            tx_values(_mm256_and_si256(d[h][q], m4), adj[h], &v[h][0], &v[h][2]);
            tx_values(_mm256_and_si256(_mm256_srli_epi16(d[h][q], 4), m4), adj[h], &v[h][1], &v[h][3]);
        }
        for (size_t k = 0; k < 4; k++) {
            const size_t c = 4 * q + k;
            if (c < ca || c >= cb)
                continue;
            uint16_t *const oc = o + c * R;
            if (nt) {
                _mm256_stream_si256((__m256i *)oc, v[0][k]);
                _mm256_stream_si256((__m256i *)(oc + 16), v[1][k]);
            } else {
                for (int h = 0; h < nh; h++)
                    _mm256_storeu_si256((__m256i *)(oc + 16 * h), v[h][k]);
            }
        }
    }
}

/* sv: 32 scale bytes -> the exponent adds of rows 0..15 (a0) and 16..31 (a1); 0 when a
 * scale is outside [2, 252] (then the tile goes through the table) */
TX_INLINE int tx_adj32(__m256i sv, __m256i *a0, __m256i *a1)
{
    const __m256i ok = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_min_epu8(sv, _mm256_set1_epi8((char)252)), sv),
                                        _mm256_cmpeq_epi8(_mm256_max_epu8(sv, _mm256_set1_epi8(2)), sv));
    const __m256i b = _mm256_set1_epi16(127);
    *a0 = _mm256_slli_epi16(_mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(sv)), b), 7);
    *a1 = _mm256_slli_epi16(_mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(sv, 1)), b), 7);
    return _mm256_movemask_epi8(ok) == -1;
}

/* The whole 32 x 32 tile of one group, streamed: every column's 32 rows are one aligned
 * line at o + c * R. Values are stored as they are made (no arrays of results). */
TX_INLINE void tx_tile32(const uint8_t *grp, size_t rs, __m256i a0, __m256i a1, uint16_t *o, size_t R)
{
    __m256i d0[8], d1[8];
    tx_bytes16(grp, rs, d0);
    tx_bytes16(grp + 16 * rs, rs, d1);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (size_t q = 0; q < 8; q++) {
        __m256i x0, x2, y0, y2;
        uint16_t *const oq = o + 4 * q * R;
        tx_values(_mm256_and_si256(d0[q], m4), a0, &x0, &x2);
        tx_values(_mm256_and_si256(d1[q], m4), a1, &y0, &y2);
        _mm256_stream_si256((__m256i *)oq, x0);
        _mm256_stream_si256((__m256i *)(oq + 16), y0);
        _mm256_stream_si256((__m256i *)(oq + 2 * R), x2);
        _mm256_stream_si256((__m256i *)(oq + 2 * R + 16), y2);
        tx_values(_mm256_and_si256(_mm256_srli_epi16(d0[q], 4), m4), a0, &x0, &x2);
        tx_values(_mm256_and_si256(_mm256_srli_epi16(d1[q], 4), m4), a1, &y0, &y2);
        _mm256_stream_si256((__m256i *)(oq + R), x0);
        _mm256_stream_si256((__m256i *)(oq + R + 16), y0);
        _mm256_stream_si256((__m256i *)(oq + 3 * R), x2);
        _mm256_stream_si256((__m256i *)(oq + 3 * R + 16), y2);
    }
}

/* The scale bytes of 4 groups (from p, row stride G) for 32 rows -> sv[k]: group k's 32 */
TX_INLINE void tx_scales4x32(const uint8_t *p, size_t G, __m256i sv[4])
{
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)G));
    /* per lane: 4 rows x 4 groups -> 4 groups x 4 rows; then dwords (g0 r0-3, g1, g2, g3 |
     * g0 r4-7, ...) -> qwords g0 r0-7, g1 r0-7, g2, g3 */
    const __m256i by = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                        0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i dw = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i q[4];
    for (int j = 0; j < 4; j++) {
        const __m256i g = _mm256_i32gather_epi32((const int *)(p + (size_t)8 * j * G), idx, 1);
        q[j] = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(g, by), dw);
    }
    /* q[j] qword k = group k, rows 8j..8j+7 */
    const __m256i l01 = _mm256_unpacklo_epi64(q[0], q[1]), h01 = _mm256_unpackhi_epi64(q[0], q[1]);
    const __m256i l23 = _mm256_unpacklo_epi64(q[2], q[3]), h23 = _mm256_unpackhi_epi64(q[2], q[3]);
    /* l01 = (g0: r0-7, r8-15 | g2: r0-7, r8-15); h01 the same for g1 | g3 */
    sv[0] = _mm256_permute2x128_si256(l01, l23, 0x20);
    sv[2] = _mm256_permute2x128_si256(l01, l23, 0x31);
    sv[1] = _mm256_permute2x128_si256(h01, h23, 0x20);
    sv[3] = _mm256_permute2x128_si256(h01, h23, 0x31);
}

/* rows [r0, r1) of group g, columns [ca, cb) of it, through the table (any scale) */
static void tx_rows_table(const uint8_t *blk, const uint8_t *sc, size_t G, size_t g, size_t r0,
                          size_t r1, size_t ca, size_t cb, uint16_t *o, size_t R)
{
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *const grp = blk + (r * G + g) * 16;
        const unsigned s = sc[r * G + g];
        for (size_t c = ca; c < cb; c++) {
            const unsigned code = bfs_mxfp4_code(grp, c);
            o[c * R + r] = (uint16_t)(mx_lo[s][code] | mx_hi[s][code] << 8);
        }
    }
}

/* rows [r, r + 16) of group g, regular stores, any scale */
static void tx_rows16(const uint8_t *blk, const uint8_t *sc, size_t G, size_t g, size_t r, size_t ca,
                      size_t cb, uint16_t *o, size_t R)
{
    uint8_t s[16];
    for (size_t i = 0; i < 16; i++)
        s[i] = sc[(r + i) * G + g];
    if (tx_scales_ok(s, 16))
        tx_tile(blk + (r * G + g) * 16, G * 16, s, 1, ca, cb, o + r, R, 0);
    else
        tx_rows_table(blk, sc, G, g, r, r + 16, ca, cb, o, R);
}

/* rows [a, b) of group g outside the streamed span, with regular stores: 16-row tiles
 * (the last one moved back to end at b, rewriting a few rows), the table below 16 rows */
static void tx_rows_edge(const uint8_t *blk, const uint8_t *sc, size_t G, size_t g, size_t a, size_t b,
                         size_t ca, size_t cb, uint16_t *o, size_t R)
{
    if (b - a < 16 && b < 16) {
        tx_rows_table(blk, sc, G, g, a, b, ca, cb, o, R);
        return;
    }
    for (size_t r = a; r < b; r += 16)
        tx_rows16(blk, sc, G, g, b - r < 16 ? b - 16 : r, ca, cb, o, R);
}

/* Shared with cpu_avx512.c (cpu_x86.h): AVX2 is all it needs. */
void bfs__mxfp4_transposed_x86(const bfs_mxfp4_desc *d, size_t item, size_t o0, size_t o1, uint16_t *out)
{
    pthread_once(&mx_once, mx_init);
    const size_t R = d->R, G = d->G;
    const uint8_t *const blk = d->blocks + item * R * G * 16;
    const uint8_t *const sc = d->scales + item * R * G;
    if (o0 == o1)
        return;
    /* Rows [r_a, r_b) go in streamed 32-row tiles: convert puts a unit at its file offset
     * mod 4096 (O_DIRECT), so out is rarely aligned; when every output row is aligned alike
     * (R * 2 a multiple of 64), the first r_a rows bring the runs to line boundaries. The
     * rows before r_a and after r_b go with regular stores. */
    size_t r_a = 0, r_b = 0;
    if ((R * 2) % 64 == 0 && ((uintptr_t)out & 1) == 0) {
        r_a = ((64 - (uintptr_t)out % 64) % 64) / 2;
        if (r_a < R)
            r_b = r_a + (R - r_a) / 32 * 32;
        else
            r_a = 0;
    }
    uint16_t *const ob = out - o0 * R; /* output row c of the item at ob + c * R */
    const size_t g_a = o0 / 32, g_end = (o1 + 31) / 32;
#define TX_COLS(g) size_t ca = o0 > (g) * 32 ? o0 - (g) * 32 : 0, cb = o1 < (g) * 32 + 32 ? o1 - (g) * 32 : 32
    if (r_a == r_b) { /* nothing streamed */
        for (size_t g = g_a; g < g_end; g++) {
            TX_COLS(g);
            tx_rows_edge(blk, sc, G, g, 0, R, ca, cb, ob + g * 32 * R, R);
        }
    }
    for (size_t rb = r_a; rb < r_b; rb += TX_RB) {
        const size_t re = r_b - rb < TX_RB ? r_b : rb + TX_RB;
        for (size_t g0 = g_a; g0 < g_end; g0 += TX_GS) {
            const size_t ng = g_end - g0 < TX_GS ? g_end - g0 : TX_GS;
            if (rb == r_a && r_a > 0) /* the head rows, beside the strip's first tile */
                for (size_t g = g0; g < g0 + ng; g++) {
                    TX_COLS(g);
                    tx_rows_edge(blk, sc, G, g, 0, r_a, ca, cb, ob + g * 32 * R, R);
                }
            for (size_t r = rb; r < re; r += 32) {
                /* whole groups: two tiles of each in turn (128-byte runs per column) */
                const int whole = ng == TX_GS && o0 <= g0 * 32 && (g0 + TX_GS) * 32 <= o1;
                const int nt = whole && r + 64 <= re ? 2 : 1;
                const size_t pa = r + 32 * (size_t)nt, pb = pa + 32 * (size_t)nt < re ? pa + 32 * (size_t)nt : re;
                for (size_t i = pa; i < pb; i++) { /* the next step's input lines (1 or 2 per row) */
                    const char *const pl = (const char *)(blk + (i * G + g0) * 16);
                    _mm_prefetch(pl, _MM_HINT_T0);
                    _mm_prefetch(pl + ng * 16 - 1, _MM_HINT_T0);
                }
                if (whole) {
                    __m256i sv[2][TX_GS];
                    for (int t = 0; t < nt; t++)
                        tx_scales4x32(sc + (r + 32 * t) * G + g0, G, sv[t]);
                    for (size_t k = 0; k < TX_GS; k++) {
                        const size_t g = g0 + k;
                        for (int t = 0; t < nt; t++) {
                            const size_t rt = r + 32 * (size_t)t;
                            __m256i a0, a1;
                            if (tx_adj32(sv[t][k], &a0, &a1)) {
                                tx_tile32(blk + (rt * G + g) * 16, G * 16, a0, a1, ob + g * 32 * R + rt, R);
                            } else {
                                tx_rows16(blk, sc, G, g, rt, 0, 32, ob + g * 32 * R, R);
                                tx_rows16(blk, sc, G, g, rt + 16, 0, 32, ob + g * 32 * R, R);
                            }
                        }
                    }
                    r += 32 * (size_t)(nt - 1);
                    continue;
                }
                uint8_t s[TX_GS][32];
                for (size_t i = 0; i < 32; i++)
                    for (size_t k = 0; k < ng; k++)
                        s[k][i] = sc[(r + i) * G + g0 + k];
                for (size_t k = 0; k < ng; k++) {
                    const size_t g = g0 + k;
                    TX_COLS(g);
                    uint16_t *const og = ob + g * 32 * R;
                    if (tx_scales_ok(s[k], 32)) {
                        tx_tile(blk + (r * G + g) * 16, G * 16, s[k], 2, ca, cb, og + r, R, 1);
                    } else {
                        tx_rows16(blk, sc, G, g, r, ca, cb, og, R);
                        tx_rows16(blk, sc, G, g, r + 16, ca, cb, og, R);
                    }
                }
            }
            if (re == r_b && r_b < R) /* the tail rows, beside the strip's last tile */
                for (size_t g = g0; g < g0 + ng; g++) {
                    TX_COLS(g);
                    tx_rows_edge(blk, sc, G, g, r_b, R, ca, cb, ob + g * 32 * R, R);
                }
        }
    }
#undef TX_COLS
    _mm_sfence(); /* order the non-temporal stores before whatever the caller does next */
}

static void mxfp4_avx2(const bfs_mxfp4_desc *d, size_t item, size_t o0, size_t o1, uint16_t *out)
{
    pthread_once(&mx_once, mx_init);
    x86_mxfp4(d, item, o0, o1, out, mx_groups);
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


/* ---- issue-12 formats: FP8 scaled, INT4 pack-quantized, NVFP4 (also the AVX-512 level's)
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
 *    smallest, 2^-7 * |s|, normal; the largest (h = 7) are compared bit for bit with the
 *    reference when the table is built (an overflow to inf in the bf16 rounding agrees, a
 *    float32 overflow does not; a subnormal T entry, shifted, would not agree either, so
 *    the 2^-119 bound is belt and braces). A scale that fails takes fp8_run, the multiply.
 *  - subnormal and zero codes (e = 0): U[m] = bf16(f32(m * 2^-9 * s)), the reference itself.
 *  - the sign: ADJ[high nibble] = h + 0x80 * sign is added to the high byte, mod 256. v * s
 *    with v < 0 is -(|v| * s) exactly and RNE is symmetric, so a negative code flips the
 *    sign bit of its result, whatever the sign of s (the zero codes too: 0 * s).
 *  - the NaN codes 0x7F / 0xFF: U[15] = 0x7FC0, no ADJ.
 * Tables are cached by scale value (FP8_SLOTS per call): a DeepSeek 128 x 128 block builds
 * its tables once per 128-row band, not once per row. */

typedef struct fp8_tab {
    _Alignas(32) uint8_t t[32]; /* T: 16 low bytes, then 16 high bytes */
    uint8_t u[32];              /* U: low bytes (entries 0..7), then high bytes */
    uint32_t key;               /* float32 bits of s */
    int ok;                     /* the table path is exact for s */
} fp8_tab;

/* s -> *t: the tables, and whether they may be used; the reference arithmetic, in SIMD */
static void fp8_tab_build(float s, fp8_tab *t)
{
    t->key = bfs_f32_bits(s);
    t->ok = 0;
    const uint32_t a = t->key & 0x7FFFFFFFu;
    if (a < 0x04000000u || a >= 0x7F800000u) /* |s| < 2^-119, inf, NaN */
        return;
    const __m256 sv = _mm256_set1_ps(s);
    const __m256 mant = _mm256_setr_ps(1.0f, 1.125f, 1.25f, 1.375f, 1.5f, 1.625f, 1.75f, 1.875f);
    const __m256 sub = _mm256_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f);
#define FP8_BF16(x, k) bf16_rne8(_mm256_castps_si256(_mm256_mul_ps(_mm256_mul_ps((x), _mm256_set1_ps(k)), sv)))
    const __m256i t0 = FP8_BF16(mant, 0x1p-7f), t1 = FP8_BF16(mant, 0x1p-6f);
    const __m256i c0 = FP8_BF16(mant, 0x1p7f), c1 = FP8_BF16(mant, 0x1p8f); /* h = 7 */
    const __m256i u0 = FP8_BF16(sub, 0x1p-9f);
#undef FP8_BF16
    /* 16 bf16 in order: T, the h = 7 products, U twice */
    const __m256i tw = _mm256_permute4x64_epi64(_mm256_packus_epi32(t0, t1), 0xD8);
    const __m256i cw = _mm256_permute4x64_epi64(_mm256_packus_epi32(c0, c1), 0xD8);
    const __m256i uw = _mm256_permute4x64_epi64(_mm256_packus_epi32(u0, u0), 0xD8);
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi16(_mm256_add_epi16(tw, _mm256_set1_epi16(0x0700)), cw)) != -1)
        return;
    _mm256_store_si256((__m256i *)t->t, bf16_bytes16(tw));
    _mm256_storeu_si256((__m256i *)t->u, bf16_bytes16(uw));
    t->u[15] = 0xC0, t->u[31] = 0x7F; /* the NaN codes: 0x7FC0 */
    t->ok = 1;
}

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

/* n E4M3 bytes through the tables of t (t->ok) -> n bf16 at o */
static inline void fp8_run_tab(const uint8_t *w, size_t n, const fp8_tab *t, uint16_t *o)
{
    const __m256i tl = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)t->t));
    const __m256i th = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(t->t + 16)));
    const __m256i ul = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t->u));
    const __m256i uh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(t->u + 16)));
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

enum { FP8_SLOTS = 64 };

void bfs__fp8_avx2(const bfs_fp8_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    assert(i0 <= i1 && d->cols > 0 && d->bh > 0 && d->bw > 0);
    const size_t C = d->cols, bw = d->bw, gcols = (C + bw - 1) / bw;
    fp8_tab cache[FP8_SLOTS]; /* slot g % FP8_SLOTS: the tables of column block g's scale */
    for (size_t j = 0; j < FP8_SLOTS; j++)
        cache[j].key = 0, cache[j].ok = 0; /* right for s = +0.0, never ok */
    uint16_t *o = out;
    for (size_t i = i0; i < i1;) { /* a row at a time, its scale blocks without a division */
        const size_t r = i / C, c0 = i % C;
        const size_t cend = i1 - r * C < C ? i1 - r * C : C;
        const uint8_t *const w = d->w + r * C;
        const size_t srow = (r / d->bh) * gcols;
        size_t g = c0 / bw;
        for (size_t c = c0; c < cend; g++) {
            const size_t ce = (g + 1) * bw < cend ? (g + 1) * bw : cend;
            const float s = bfs_scale_at(d->scale, srow + g, d->scale_bf16);
            fp8_tab *const t = &cache[g % FP8_SLOTS];
            if (t->key != bfs_f32_bits(s))
                fp8_tab_build(s, t);
            if (t->ok)
                fp8_run_tab(w + c, ce - c, t, o);
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
    .mxfp4 = mxfp4_avx2,
    .bnb4 = bnb4_avx2,
    .f32_to_bf16 = f32_to_bf16_avx2,
    .f16_to_bf16 = f16_to_bf16_avx2,
    .f64_to_bf16 = f64_to_bf16_avx2,
    .fp8 = bfs__fp8_avx2,
    .int4 = bfs__int4_avx2,
    .nvfp4 = bfs__nvfp4_avx2,
};

/* ---- XXH3-128 streaming update, AVX2 ----------------------------------------------- */
/* The writer hashes every output byte twice (file and piece); the shared libxxhash is
 * built for baseline x86-64 (SSE2). This is the same xxhash.h code with its AVX2
 * accumulate loop, inlined here: the same digests (XXH3 is defined independently of the
 * vector width), about twice the rate. `state` is an XXH3_state_t of the same xxhash.h
 * (made and reset by libxxhash; its layout is the header's). */
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

void bfs__xxh3_128_update_avx2(void *state, const void *p, size_t n)
{
    XXH3_128bits_update((XXH3_state_t *)state, p, n);
}
