/*
 * AVX2 MXFP4 (level BFS_CPU_AVX2), both layouts; split from cpu_avx2.c, whose
 * ops table points here (bfs__mxfp4_avx2). Built with -mavx2 -mf16c -mbmi2.
 *
 *  - The 256 x 16 table of bf16 values (mx_lo / mx_hi), one per E8M0 scale,
 *    filled once by ref.h itself (bfs_mxfp4_value); the row-major layout looks
 *    its codes up in it with vpshufb (mx_groups, through cpu_x86.h's x86_mxfp4).
 *  - The transposed layout (bfs__mxfp4_transposed_x86, also the AVX-512 level's):
 *    transposes the code bytes (4x fewer than the output), adds the scale to the
 *    exponent field, and streams each column's 32-row runs as whole lines with
 *    non-temporal stores (see its section).
 * No FTZ/DAZ: values are the reference's bits.
 */
#include "cpu_avx2.h"

#include <pthread.h>

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

void bfs__mxfp4_avx2(const bfs_mxfp4_desc *d, size_t item, size_t o0, size_t o1, uint16_t *out)
{
    pthread_once(&mx_once, mx_init);
    x86_mxfp4(d, item, o0, o1, out, mx_groups);
}
