/*
 * GPTQ, AWQ GEMM / GEMV and bitsandbytes 8-bit -> BF16 for the AVX2 and AVX-512 levels: the
 * bytes of the scalar reference (bfs__woq_scalar, ref_woq.h), 16 output rows at a time.
 *
 * GPTQ and AWQ store the weight transposed ([in, out]): a 32-byte load of a GPTQ qweight row
 * (or one AWQ word) holds 8 output rows' codes. Two ways to the values, both through the
 * reference's arithmetic (s * (q - z) exact in float32, vcvtps2ph to fp16 for F16 scales
 * (nearest even, subnormals kept), then bf16):
 *  - plain groups (no act-order g_idx; GPTQ 4-bit and AWQ): per row and group, the 16 values
 *    a code can take, looked up with two vpshufb (low and high bytes) for 16 columns of a row
 *    at once. GPTQ's words unpack into a row's 16 codes per 128-bit lane; AWQ's words are
 *    transposed into that order first (8 x 8 nibbles).
 *  - otherwise (act-order, 2/3/8 bits, cut tiles): a vector lane per output row, each lane
 *    computing its value with the group's zero point and scale from a per-tile table; 8
 *    columns' vectors are transposed into rows.
 * A row's 32 columns are stored together (64 bytes), non-temporally where the rows are 32-byte
 * aligned and the range is over BFS_WOQ_NT_BYTES. Tiles go in bands of 8 through the columns
 * (AWQ: a column's words for 128 rows are one line; GPTQ: a qweight row's for 128 rows, one
 * stretch of a page). Tiles start at multiples of 16 rows; a cut tile (the range's
 * first and last rows, the weight's last rows) or a last chunk of under 8 columns goes through
 * a small buffer, copied clipped. bitsandbytes 8-bit is row-major: 16 columns a step, two
 * float32 multiplies each. AWQ GEMV is row-major too: a table per row and group (gemv_rows).
 * Built with -mavx2 -mf16c -mbmi2; no FTZ/DAZ.
 */
#include "cpu_avx2.h"
#include "ref.h"
#include "ref_woq.h"

#include <assert.h>
#include <stdlib.h>

/* The per-column loops are unrolled (shift counts become constants, values stay in registers). */
/* outputs from this size on are stored non-temporally (where aligned): past a core's L2 */
#define BFS_WOQ_NT_BYTES ((size_t)4 << 20)
#if defined(__GNUC__)
#define BFS_WOQ_INLINE inline __attribute__((always_inline))
#define BFS_WOQ_UNROLL _Pragma("GCC unroll 32")
#else
#define BFS_WOQ_INLINE inline
#define BFS_WOQ_UNROLL
#endif

/* 8 float32 bit patterns -> bf16 (RNE), one per dword; NaN -> 0x7FC0 when nan is set. */
static inline __m256i woq_bf16(__m256 v, int nan)
{
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    if (!nan)
        return r;
    const __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), isnan);
}

/* Scale i of d as float32 (exact for every type); *special |= it is infinite or NaN. */
static inline float woq_scale1(const bfs_woq_desc *d, size_t i, int *special)
{
    float s;
    if (d->scale_type == BFS_WOQ_F32) {
        memcpy(&s, d->scale + 4 * i, 4);
    } else {
        uint16_t h;
        memcpy(&h, d->scale + 2 * i, 2);
        s = d->scale_type == BFS_WOQ_F16 ? bfs_f32_from_f16(h) : bfs_f32_from_bf16(h);
    }
    *special |= (bfs_f32_bits(s) & 0x7F800000u) == 0x7F800000u;
    return s;
}

/* One output tile: rows [r0, r0 + 16) as two halves of 8 lanes (lanes past nr are padding), the
 * zero point and scale of every group per row, and where its output goes. 16 rows: one 64-byte
 * line of a GPTQ qweight row, two AWQ words. */
typedef struct woq_tile {
    const bfs_woq_desc *d;
    size_t r0, nr;
    const int32_t *zt; /* [ngroups][16] */
    const float *st;   /* [ngroups][16] */
    int f16, nan;      /* round through fp16; some scale is NaN or infinite */
    int whole;         /* all 16 rows whole in [i0, i1): store straight */
    int nt;            /* rows 32-byte aligned in a large range: non-temporal 64-byte stores */
    size_t i0, i1;     /* the caller's range, for the clipped stores */
    uint16_t *out;     /* element i at out[i - i0] */
} woq_tile;

/* The bf16 values of 8 lanes' codes q, their zero points and scales at zt/st + o, in the high
 * half of each dword (the low half is garbage; woq_store8x8 takes the high halves). The bf16
 * rounding adds 0x7FFF plus the kept lsb, found by a compare: no shift, as the shift units
 * are the ones the code extraction and the fp16 conversions keep busy. */
static BFS_WOQ_INLINE __m256i woq_value8(const woq_tile *t, __m256i q, size_t o, int f16, int nan)
{
    const __m256i z = _mm256_load_si256((const __m256i *)(t->zt + o));
    const __m256 s = _mm256_load_ps(t->st + o);
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, z)), s);
    if (f16)
        v = _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256i u = _mm256_castps_si256(v), b16 = _mm256_set1_epi32(0x10000);
    const __m256i lsb = _mm256_cmpeq_epi32(_mm256_and_si256(u, b16), b16); /* -1 where bit 16 is set */
    const __m256i r = _mm256_sub_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
    if (!nan)
        return r;
    const __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC00000), isnan);
}

/* Two columns' values x, y (bf16 in each dword's high half) -> dwords x | y << 16. */
static BFS_WOQ_INLINE __m256i woq_pair(__m256i x, __m256i y) { return _mm256_blend_epi16(_mm256_srli_epi32(x, 16), y, 0xAA); }

/* Eight columns' values v[0..7] of half h (lane = row r0 + 8h + lane, woq_value8's) ->
 * rows of 8 bf16, columns [c0, c0 + 8), clipped to the tile's rows, the range and the weight's
 * columns. */
static BFS_WOQ_INLINE void woq_store8x8(const woq_tile *t, const __m256i v[8], size_t c0, size_t h, uint16_t (*stage)[32])
{
    const __m256i a0 = woq_pair(v[0], v[1]), a1 = woq_pair(v[2], v[3]);
    const __m256i a2 = woq_pair(v[4], v[5]), a3 = woq_pair(v[6], v[7]);
    const __m256i b0 = _mm256_unpacklo_epi32(a0, a1), b1 = _mm256_unpackhi_epi32(a0, a1);
    const __m256i b2 = _mm256_unpacklo_epi32(a2, a3), b3 = _mm256_unpackhi_epi32(a2, a3);
    const __m256i x0 = _mm256_unpacklo_epi64(b0, b2), x1 = _mm256_unpackhi_epi64(b0, b2); /* rows 0|4, 1|5 */
    const __m256i x2 = _mm256_unpacklo_epi64(b1, b3), x3 = _mm256_unpackhi_epi64(b1, b3); /* rows 2|6, 3|7 */
    const size_t C = t->d->cols, r0 = t->r0 + 8 * h;
    if (stage) { /* a whole block: rows 8h.. of the stage, columns c0 % 32.. */
        uint16_t *o = stage[8 * h] + c0 % 32;
        _mm_store_si128((__m128i *)o, _mm256_castsi256_si128(x0));
        _mm_store_si128((__m128i *)(o + 32), _mm256_castsi256_si128(x1));
        _mm_store_si128((__m128i *)(o + 64), _mm256_castsi256_si128(x2));
        _mm_store_si128((__m128i *)(o + 96), _mm256_castsi256_si128(x3));
        _mm_store_si128((__m128i *)(o + 128), _mm256_extracti128_si256(x0, 1));
        _mm_store_si128((__m128i *)(o + 160), _mm256_extracti128_si256(x1, 1));
        _mm_store_si128((__m128i *)(o + 192), _mm256_extracti128_si256(x2, 1));
        _mm_store_si128((__m128i *)(o + 224), _mm256_extracti128_si256(x3, 1));
        return;
    }
    if (t->whole && c0 + 8 <= C) {
        uint16_t *o = t->out + (r0 * C + c0 - t->i0);
        _mm_storeu_si128((__m128i *)o, _mm256_castsi256_si128(x0));
        _mm_storeu_si128((__m128i *)(o + C), _mm256_castsi256_si128(x1));
        _mm_storeu_si128((__m128i *)(o + 2 * C), _mm256_castsi256_si128(x2));
        _mm_storeu_si128((__m128i *)(o + 3 * C), _mm256_castsi256_si128(x3));
        _mm_storeu_si128((__m128i *)(o + 4 * C), _mm256_extracti128_si256(x0, 1));
        _mm_storeu_si128((__m128i *)(o + 5 * C), _mm256_extracti128_si256(x1, 1));
        _mm_storeu_si128((__m128i *)(o + 6 * C), _mm256_extracti128_si256(x2, 1));
        _mm_storeu_si128((__m128i *)(o + 7 * C), _mm256_extracti128_si256(x3, 1));
        return;
    }
    _Alignas(32) uint16_t buf[8][8];
    const __m256i x[4] = {x0, x1, x2, x3};
    for (int l = 0; l < 4; l++) {
        _mm_store_si128((__m128i *)buf[l], _mm256_castsi256_si128(x[l]));
        _mm_store_si128((__m128i *)buf[l + 4], _mm256_extracti128_si256(x[l], 1));
    }
    for (size_t l = 0; l < 8 && 8 * h + l < t->nr; l++) {
        const size_t e = (r0 + l) * C + c0;
        const size_t lo = e > t->i0 ? e : t->i0;
        size_t hi = e + (C - c0 < 8 ? C - c0 : 8);
        hi = hi < t->i1 ? hi : t->i1;
        if (lo < hi)
            memcpy(t->out + (lo - t->i0), buf[l] + (lo - e), (hi - lo) * 2);
    }
}

/* 16 rows' 32 columns (64 bytes each) at row r0's column c: non-temporal where aligned. */
static BFS_WOQ_INLINE void woq_rows64(const woq_tile *t, size_t c, const __m256i *a, const __m256i *b, size_t n)
{
    const size_t C = t->d->cols;
    uint16_t *o = t->out + (t->r0 * C + c - t->i0);
    if (t->nt) {
        for (size_t l = 0; l < n; l++) {
            _mm256_stream_si256((__m256i *)(o + l * C), a[l]);
            _mm256_stream_si256((__m256i *)(o + l * C + 16), b[l]);
        }
    } else {
        for (size_t l = 0; l < n; l++) {
            _mm256_storeu_si256((__m256i *)(o + l * C), a[l]);
            _mm256_storeu_si256((__m256i *)(o + l * C + 16), b[l]);
        }
    }
}

/* A whole block's stage (16 rows x 32 columns) out to the tile's rows. */
static BFS_WOQ_INLINE void woq_stage_out(const woq_tile *t, size_t c, uint16_t (*stage)[32])
{
    __m256i a[16], b[16];
    for (size_t l = 0; l < 16; l++) {
        a[l] = _mm256_load_si256((const __m256i *)stage[l]);
        b[l] = _mm256_load_si256((const __m256i *)(stage[l] + 16));
    }
    woq_rows64(t, c, a, b, 16);
}

/* The groups of columns, in order, without a division per column: g_idx's entry, or c / group_size
 * kept as the group and where it ends. */
typedef struct woq_groups {
    size_t g, end;
} woq_groups;

/* The table offsets (16 * group) of columns [c0, c0 + 32); 0 past the weight's columns, whose
 * values are dropped. */
static void woq_groups32(const bfs_woq_desc *d, woq_groups *w, size_t c0, size_t g16[32])
{
    for (size_t j = 0; j < 32; j++) {
        const size_t c = c0 + j;
        if (c >= d->cols) {
            g16[j] = 0;
        } else if (d->g_idx) {
            g16[j] = 16 * (size_t)bfs_woq_word(d->g_idx, c);
        } else {
            if (c >= w->end) {
                w->g = c / d->group_size;
                w->end = (w->g + 1) * d->group_size;
            }
            g16[j] = 16 * w->g;
        }
    }
}

/* Half h's words k of a GPTQ qweight (row k of the [kw][rows] array); 0 past its ends. */
static inline __m256i gptq_words(const woq_tile *t, size_t k, size_t kw, size_t h)
{
    const bfs_woq_desc *d = t->d;
    if (k >= kw || t->nr <= 8 * h)
        return _mm256_setzero_si256();
    const uint8_t *p = d->qweight + 4 * (k * d->rows + t->r0 + 8 * h);
    if (t->nr >= 8 * h + 8)
        return _mm256_loadu_si256((const __m256i *)p);
    _Alignas(32) uint32_t w[8] = {0};
    memcpy(w, p, 4 * (t->nr - 8 * h));
    return _mm256_load_si256((const __m256i *)w);
}

/* GPTQ, one tile, columns [c, c + 32) from words k (3-bit: 3 words a block; else `bits`). bits,
 * f16 and nan are constants in each instance (WOQ_FNS), so every loop unrolls. */
static BFS_WOQ_INLINE void gptq_block(const woq_tile *t, size_t c, size_t k, const size_t *g16, unsigned bits, int f16,
                                      int nan)
{
    const bfs_woq_desc *d = t->d;
    const size_t kw = bfs_gptq_kw(d), bw = bits == 3 ? 3 : bits, n8 = d->cols - c >= 32 ? 4 : (d->cols - c + 7) / 8;
    const size_t pf = 4 * 16 * d->rows; /* 16 qweight rows ahead */
    const __m256i mask = _mm256_set1_epi32((int)((1u << bits) - 1u));
    __m256i w[2][8], v[8];
    _Alignas(32) uint16_t stage_buf[16][32];
    uint16_t(*stage)[32] = t->whole && n8 == 4 ? stage_buf : NULL;
    BFS_WOQ_UNROLL
    for (size_t j = 0; j < bw; j++) {
        const char *p = (const char *)(d->qweight + 4 * ((k + j) * d->rows + t->r0)) + pf;
        _mm_prefetch(p, _MM_HINT_T0);
        _mm_prefetch(p + 60, _MM_HINT_T0);
        w[0][j] = gptq_words(t, k + j, kw, 0);
        w[1][j] = gptq_words(t, k + j, kw, 1);
    }
    BFS_WOQ_UNROLL
    for (size_t c8 = 0; c8 < 32; c8 += 8) {
        if (c8 / 8 >= n8)
            break;
        BFS_WOQ_UNROLL
        for (size_t h = 0; h < 2; h++) {
            BFS_WOQ_UNROLL
            for (unsigned j = 0; j < 8; j++) {
                const unsigned bit = (unsigned)(c8 + j) * bits, wi = bit / 32, sh = bit % 32;
                __m256i q = _mm256_srli_epi32(w[h][wi], (int)sh);
                if (sh + bits > 32)
                    q = _mm256_or_si256(q, _mm256_slli_epi32(w[h][wi + 1], (int)(32 - sh)));
                v[j] = woq_value8(t, _mm256_and_si256(q, mask), g16[c8 + j] + 8 * h, f16, nan);
            }
            woq_store8x8(t, v, c + c8, h, stage);
        }
    }
    if (stage)
        woq_stage_out(t, c, stage);
}

/* The 8 fields of an AWQ word in row order: row i's code is field {0, 4, 1, 5, 2, 6, 3, 7}[i]. */
static BFS_WOQ_INLINE __m256i awq_fields8(uint32_t w)
{
    const __m256i sh = _mm256_setr_epi32(0, 16, 4, 20, 8, 24, 12, 28);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh), _mm256_set1_epi32(15));
}

/* AWQ, one tile (r0 a multiple of 8), columns [c, c + 32): column c's codes are the fields of
 * words qweight[c][r0/8] (half 0) and [r0/8 + 1] (half 1), field {0, 4, 1, 5, 2, 6, 3, 7}[lane]. */
static BFS_WOQ_INLINE void awq_block(const woq_tile *t, size_t c, size_t k, const size_t *g16, unsigned bits, int f16,
                                     int nan)
{
    const bfs_woq_desc *d = t->d;
    const size_t C = d->cols, pf = 4 * 16 * d->zw, nh = t->nr > 8 ? 2 : 1;
    const uint8_t *col = d->qweight + 4 * (t->r0 / 8);
    __m256i v[8];
    _Alignas(32) uint16_t stage_buf[16][32];
    uint16_t(*stage)[32] = t->whole && c + 32 <= C ? stage_buf : NULL;
    (void)k, (void)bits;
    for (size_t c8 = 0; c8 < 32 && c + c8 < C; c8 += 8)
        for (size_t h = 0; h < nh; h++) {
            BFS_WOQ_UNROLL
            for (size_t j = 0; j < 8; j++) {
                __m256i q = _mm256_setzero_si256();
                if (c + c8 + j < C) {
                    const uint8_t *p = col + 4 * ((c + c8 + j) * d->zw + h);
                    if (h == 0)
                        _mm_prefetch((const char *)p + pf, _MM_HINT_T0);
                    q = awq_fields8(bfs_woq_word(p, 0));
                }
                v[j] = woq_value8(t, q, g16[c8 + j] + 8 * h, f16, nan);
            }
            woq_store8x8(t, v, c + c8, h, stage);
        }
    if (stage)
        woq_stage_out(t, c, stage);
}

/* One block of one tile: an instance per layout, code width, fp16 rounding and NaN handling. */
typedef void (*woq_block_fn)(const woq_tile *t, size_t c, size_t k, const size_t *g16);
#define WOQ_FN(name, body, bits, f16, nan)                                                      \
    static void name(const woq_tile *t, size_t c, size_t k, const size_t *g16)                  \
    {                                                                                           \
        body(t, c, k, g16, bits, f16, nan);                                                     \
    }
#define WOQ_FNS(pre, body, bits)                                                                \
    WOQ_FN(pre##_00, body, bits, 0, 0)                                                          \
    WOQ_FN(pre##_01, body, bits, 0, 1) WOQ_FN(pre##_10, body, bits, 1, 0) WOQ_FN(pre##_11, body, bits, 1, 1)
WOQ_FNS(gptq2, gptq_block, 2)
WOQ_FNS(gptq3, gptq_block, 3)
WOQ_FNS(gptq4, gptq_block, 4)
WOQ_FNS(gptq8, gptq_block, 8)
WOQ_FNS(awq4, awq_block, 4)
#undef WOQ_FNS
#undef WOQ_FN
/* [gptq 2, 3, 4, 8 bits; awq][f16][nan] */
static const woq_block_fn woq_fns[5][2][2] = {
    {{gptq2_00, gptq2_01}, {gptq2_10, gptq2_11}}, {{gptq3_00, gptq3_01}, {gptq3_10, gptq3_11}},
    {{gptq4_00, gptq4_01}, {gptq4_10, gptq4_11}}, {{gptq8_00, gptq8_01}, {gptq8_10, gptq8_11}},
    {{awq4_00, awq4_01}, {awq4_10, awq4_11}},
};

/* ---- GPTQ 4-bit with plain groups (no act-order): a table per row and group -----------------
 * Where a group spans whole runs of 16 columns, a row's 16 columns of one group take their
 * values from that row's 16 possible ones: two vpshufb (low bytes, high bytes) give 16 bf16.
 * The codes come transposed into rows by unpacking two qweight rows' words (16 nibbles a row),
 * a 128-bit lane per row: rows p and p + 4 share a ymm, so each pair has its own tables. */

/* The 16 possible values of a code 0..15 with zero point z and scale s -> [16 low bytes | 16
 * high bytes], through woq_value8's arithmetic: the same rounding as every other path. */
static BFS_WOQ_INLINE __m256i lut_vals(int32_t zp, float sc, int f16, int nan)
{
    const __m256i iota0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), iota8 = _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15);
    const __m256i z = _mm256_set1_epi32(zp);
    const __m256 s = _mm256_set1_ps(sc);
    __m256 a = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(iota0, z)), s);
    __m256 b = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(iota8, z)), s);
    if (f16) {
        a = _mm256_cvtph_ps(_mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        b = _mm256_cvtph_ps(_mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(woq_bf16(a, nan), woq_bf16(b, nan)), 0xD8);
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14,
                                           1, 3, 5, 7, 9, 11, 13, 15);
    return _mm256_permute4x64_epi64(_mm256_shuffle_epi8(w, split), 0xD8);
}

/* One row's table: the tile's zero point and scale at o. */
static BFS_WOQ_INLINE __m256i lut_row(const woq_tile *t, size_t o, int f16) { return lut_vals(t->zt[o], t->st[o], f16, t->nan); }

/* Two rows' 16 codes (a ymm: row p's in lane 0, row p + 4's in lane 1) -> their 16 bf16 each:
 * *x = row p's, *y = row p + 4's. */
static BFS_WOQ_INLINE void lut_pair(__m256i codes, __m256i tl, __m256i th, __m256i *x, __m256i *y)
{
    const __m256i l = _mm256_shuffle_epi8(tl, codes), h = _mm256_shuffle_epi8(th, codes);
    const __m256i a = _mm256_unpacklo_epi8(l, h), b = _mm256_unpackhi_epi8(l, h); /* columns 0..7 | 8..15 */
    *x = _mm256_permute2x128_si256(a, b, 0x20);
    *y = _mm256_permute2x128_si256(a, b, 0x31);
}

/* Eight rows' 16 codes each from two qweight rows' words w0, w1 (lane = row): row l's 16 bf16 at
 * v[l], through the half's tables. */
static BFS_WOQ_INLINE void lut_rows16(__m256i w0, __m256i w1, const __m256i *tl, const __m256i *th, __m256i v[8])
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    /* per 64 bits: a row's two words, its 16 codes; rows 0, 1 | 4, 5 and 2, 3 | 6, 7 */
    const __m256i pr[2] = {_mm256_unpacklo_epi32(w0, w1), _mm256_unpackhi_epi32(w0, w1)};
    BFS_WOQ_UNROLL
    for (size_t i = 0; i < 2; i++) {
        const __m256i lo = _mm256_and_si256(pr[i], m4), hi = _mm256_and_si256(_mm256_srli_epi16(pr[i], 4), m4);
        const size_t p = 2 * i; /* rows p | p + 4, then p + 1 | p + 5 */
        lut_pair(_mm256_unpacklo_epi8(lo, hi), tl[p], th[p], &v[p], &v[p + 4]);
        lut_pair(_mm256_unpackhi_epi8(lo, hi), tl[p + 1], th[p + 1], &v[p + 1], &v[p + 5]);
    }
}

/* Group g's tables for a tile, each half's pairs of lanes (p, p + 4): tl low bytes, th high
 * bytes; lane p takes row rowof[p] of the half. */
static void lut_group(const woq_tile *t, size_t g, const size_t rowof[8], __m256i tl[2][4], __m256i th[2][4])
{
    for (size_t h = 0; h < 2; h++) {
        __m256i rb[8];
        for (size_t p = 0; p < 8; p++)
            rb[p] = lut_row(t, 16 * g + 8 * h + rowof[p], t->f16);
        for (size_t p = 0; p < 4; p++) {
            tl[h][p] = _mm256_permute2x128_si256(rb[p], rb[p + 4], 0x20);
            th[h][p] = _mm256_permute2x128_si256(rb[p], rb[p + 4], 0x31);
        }
    }
}

/* A band of whole 16-row tiles (consecutive) of a 4-bit GPTQ weight whose groups are runs of
 * 32 columns: each row's 32 columns a step, stored together (a row's 64 bytes at once: model
 * widths make the rows 4 KiB multiples apart, the same L1 set, so lines written in pieces
 * would be evicted between them). Group by group, each tile of the band in turn: the group's
 * qweight rows (group_size / 8 of them, 4 * out bytes apart, a page each) stay in the TLB for
 * the whole band, where one tile going through all the columns alone would miss it every 64
 * bytes on a file's 4 KiB pages. */
static void gptq4_lut_band(const woq_tile *t, size_t nt)
{
    const bfs_woq_desc *d = t->d;
    static const size_t rows[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    const size_t C = d->cols, R = d->rows, G = d->group_size;
    for (size_t g = 0; g < d->ngroups; g++) {
        const size_t c1 = (g + 1) * G < C ? (g + 1) * G : C;
        for (size_t i = 0; i < nt; i++) {
            __m256i tl[2][4], th[2][4];
            lut_group(&t[i], g, rows, tl, th);
            for (size_t c = g * G; c < c1; c += 32) {
                const uint8_t *q = d->qweight + 4 * ((c / 8) * R + t[i].r0);
                for (size_t j = 4; j < 8; j++) { /* the next step's words */
                    _mm_prefetch((const char *)q + 4 * j * R, _MM_HINT_T0);
                    _mm_prefetch((const char *)q + 4 * j * R + 60, _MM_HINT_T0);
                }
                BFS_WOQ_UNROLL
                for (size_t h = 0; h < 2; h++) {
                    const uint8_t *qh = q + 32 * h;
                    __m256i a[8], b[8];
                    lut_rows16(_mm256_loadu_si256((const __m256i *)qh), _mm256_loadu_si256((const __m256i *)(qh + 4 * R)), tl[h],
                               th[h], a);
                    lut_rows16(_mm256_loadu_si256((const __m256i *)(qh + 8 * R)), _mm256_loadu_si256((const __m256i *)(qh + 12 * R)),
                               tl[h], th[h], b);
                    const woq_tile th8 = {.d = d, .r0 = t[i].r0 + 8 * h, .nt = t[i].nt, .i0 = t[i].i0, .out = t[i].out};
                    woq_rows64(&th8, c, a, b, 8);
                }
            }
        }
    }
}

/* ---- AWQ with the same tables: its words transposed into GPTQ's order ------------------------
 * An AWQ word holds one column's codes of 8 rows (field p: row {0, 2, 4, 6, 1, 3, 5, 7}[p]); 8
 * columns' words are an 8 x 8 nibble matrix whose transpose is 8 words of 8 columns each, the
 * order lut_rows16 takes, lane p for the rows of field p. */

/* The 8 x 8 transpose of nibbles (lane j, nibble p) -> (lane p, nibble j): swap the off-diagonal
 * 4 x 4 blocks, then the 2 x 2 blocks within them, then single nibbles. */
static BFS_WOQ_INLINE __m256i nib_transpose8(__m256i v)
{
    __m256i s = _mm256_permute2x128_si256(v, v, 0x01); /* lane j ^ 4 */
    const __m256i m16 = _mm256_set1_epi32(0x0000FFFF);
    v = _mm256_blend_epi32(_mm256_or_si256(_mm256_and_si256(v, m16), _mm256_slli_epi32(s, 16)),
                           _mm256_or_si256(_mm256_andnot_si256(m16, v), _mm256_srli_epi32(s, 16)), 0xF0);
    s = _mm256_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2)); /* lane j ^ 2 */
    const __m256i m8 = _mm256_set1_epi32(0x00FF00FF);
    v = _mm256_blend_epi32(_mm256_or_si256(_mm256_and_si256(v, m8), _mm256_andnot_si256(m8, _mm256_slli_epi32(s, 8))),
                           _mm256_or_si256(_mm256_andnot_si256(m8, v), _mm256_and_si256(m8, _mm256_srli_epi32(s, 8))), 0xCC);
    s = _mm256_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)); /* lane j ^ 1 */
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    return _mm256_blend_epi32(_mm256_or_si256(_mm256_and_si256(v, m4), _mm256_andnot_si256(m4, _mm256_slli_epi32(s, 4))),
                              _mm256_or_si256(_mm256_andnot_si256(m4, v), _mm256_and_si256(m4, _mm256_srli_epi32(s, 4))), 0xAA);
}

/* The 8 bytes at x, then the 8 at y. */
static BFS_WOQ_INLINE __m128i awq_ld2(const uint8_t *x, const uint8_t *y)
{
    return _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64((const __m128i *)x)), (const double *)y));
}

/* Columns [c, c + 8) of AWQ words w and w + 1 (rows 8w.. and 8w + 8..), transposed: *h0, *h1 =
 * their 8 lanes (field p) of 8 columns' codes each. */
static BFS_WOQ_INLINE void awq_words8(const bfs_woq_desc *d, size_t c, size_t w, __m256i *h0, __m256i *h1)
{
    const uint8_t *p = d->qweight + 4 * (c * d->zw + w);
    const size_t st = 4 * d->zw;
    /* each 64 bits: a column's (word w, word w + 1), loaded into the vector directly (through a
     * stack array, four 8-byte stores read back as one 32-byte load defeat store forwarding);
     * -> [w of columns 0..3 | w of 4..7], then w + 1 */
    const __m256i a = _mm256_shuffle_epi32(_mm256_set_m128i(awq_ld2(p + 2 * st, p + 3 * st), awq_ld2(p, p + st)), _MM_SHUFFLE(3, 1, 2, 0));
    const __m256i b = _mm256_shuffle_epi32(_mm256_set_m128i(awq_ld2(p + 6 * st, p + 7 * st), awq_ld2(p + 4 * st, p + 5 * st)),
                                           _MM_SHUFFLE(3, 1, 2, 0));
    const __m256i a4 = _mm256_permute4x64_epi64(a, _MM_SHUFFLE(3, 1, 2, 0)), b4 = _mm256_permute4x64_epi64(b, _MM_SHUFFLE(3, 1, 2, 0));
    *h0 = nib_transpose8(_mm256_permute2x128_si256(a4, b4, 0x20));
    *h1 = nib_transpose8(_mm256_permute2x128_si256(a4, b4, 0x31));
}

/* A band of whole 16-row tiles (t[0].r0 a multiple of 16, consecutive) of an AWQ weight whose
 * groups are runs of 32 columns, 32 columns a step for all of them: a column's words for the
 * band's 128 rows are one line, read once (and the next step's prefetched). */
static void awq_lut_band(const woq_tile *t, size_t nt)
{
    static const size_t rowof[8] = {0, 2, 4, 6, 1, 3, 5, 7}; /* field p's row */
    const bfs_woq_desc *d = t->d;
    const size_t C = d->cols, G = d->group_size, st = 4 * d->zw;
    for (size_t g = 0; g < d->ngroups; g++) {
        __m256i tl[8][2][4], th[8][2][4];
        for (size_t i = 0; i < nt; i++)
            lut_group(&t[i], g, rowof, tl[i], th[i]);
        const size_t c1 = (g + 1) * G < C ? (g + 1) * G : C;
        for (size_t c = g * G; c < c1; c += 32) {
            const char *pf = (const char *)(d->qweight + (c + 96) * st + 4 * (t[0].r0 / 8));
            for (size_t j = 0; j < 32; j++)
                _mm_prefetch(pf + j * st, _MM_HINT_T0);
            for (size_t i = 0; i < nt; i++) {
                __m256i wv[4][2], a[2][8], b[2][8], ra[16], rbv[16];
                for (size_t k = 0; k < 4; k++)
                    awq_words8(d, c + 8 * k, t[i].r0 / 8, &wv[k][0], &wv[k][1]);
                for (size_t h = 0; h < 2; h++) {
                    lut_rows16(wv[0][h], wv[1][h], tl[i][h], th[i][h], a[h]);
                    lut_rows16(wv[2][h], wv[3][h], tl[i][h], th[i][h], b[h]);
                    for (size_t p = 0; p < 8; p++) {
                        ra[8 * h + rowof[p]] = a[h][p];
                        rbv[8 * h + rowof[p]] = b[h][p];
                    }
                }
                woq_rows64(&t[i], c, ra, rbv, 16);
            }
        }
    }
}

/* The zero points of rows [r, r + 8) (r a multiple of 8) from one packed qzeros row: GPTQ 2, 4
 * or 8 bits (v1: the whole word + 0x..0101 first, as bfs_gptq_zero_at), or AWQ's field order. */
static inline __m256i zeros8(const uint8_t *zrow, size_t r, unsigned bits, int v1, int awq)
{
    if (awq)
        return awq_fields8(bfs_woq_word(zrow, r / 8));
    const size_t per = 32 / bits, wi = r / per;
    const unsigned sh0 = bits * (unsigned)(r % per);
    uint32_t two[2] = {bfs_woq_word(zrow, wi), bits == 8 ? bfs_woq_word(zrow, wi + 1) : 0};
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i bit = _mm256_add_epi32(_mm256_set1_epi32((int)sh0), _mm256_mullo_epi32(lane, _mm256_set1_epi32((int)bits)));
    __m256i w = _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)two)), _mm256_srli_epi32(bit, 5));
    if (v1)
        w = _mm256_add_epi32(w, _mm256_set1_epi32((int)(bits == 2 ? 0x55555555u : bits == 4 ? 0x11111111u : 0x01010101u)));
    w = _mm256_srlv_epi32(w, _mm256_and_si256(bit, _mm256_set1_epi32(31)));
    return _mm256_and_si256(w, _mm256_set1_epi32((int)((1u << bits) - 1u)));
}

/* The scales of rows [r, r + 8) of group g as float32 (exact for every type). */
static inline __m256 scales8(const bfs_woq_desc *d, size_t i)
{
    if (d->scale_type == BFS_WOQ_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d->scale + 2 * i)));
    if (d->scale_type == BFS_WOQ_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(d->scale + 2 * i))), 16));
    return _mm256_loadu_ps((const float *)(d->scale + 4 * i));
}

/* The tile's tables: every group's zero point and scale per row (0 past nr). A whole tile of
 * GPTQ 2 / 4 / 8 bits or AWQ in vectors, the others (3-bit, the weight's last rows) one by one. */
static void woq_tables(woq_tile *t, int32_t *zt, float *st)
{
    const bfs_woq_desc *d = t->d;
    int special = 0;
    if (t->nr == 16 && (d->layout == BFS_WOQ_AWQ || d->bits != 3)) {
        const __m256i e = _mm256_set1_epi32(0x7F800000);
        __m256i sp = _mm256_setzero_si256();
        for (size_t g = 0; g < d->ngroups; g++)
            for (size_t h = 0; h < 2; h++) {
                const size_t r = t->r0 + 8 * h;
                const __m256 s = scales8(d, g * d->rows + r);
                _mm256_store_si256((__m256i *)(zt + 16 * g + 8 * h),
                                   zeros8(d->qzeros + g * d->zw * 4, r, (unsigned)d->bits, d->v1, d->layout == BFS_WOQ_AWQ));
                _mm256_store_ps(st + 16 * g + 8 * h, s);
                sp = _mm256_or_si256(sp, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(s), e), e));
            }
        special = !_mm256_testz_si256(sp, sp);
    } else {
        for (size_t g = 0; g < d->ngroups; g++)
            for (size_t l = 0; l < 16; l++) {
                const size_t r = t->r0 + l;
                int z = 0;
                float s = 0.0f;
                if (l < t->nr) {
                    z = d->layout == BFS_WOQ_GPTQ ? bfs_gptq_zero(d, g, r) : (int)bfs_awq_field(d->qzeros + g * d->zw * 4, r);
                    s = woq_scale1(d, g * d->rows + r, &special);
                }
                zt[16 * g + l] = z;
                st[16 * g + l] = s;
            }
    }
    t->zt = zt;
    t->st = st;
    t->f16 = d->scale_type == BFS_WOQ_F16;
    t->nan = special;
}

/* ---- AWQ GEMV: row-major as the output ---------------------------------------------------
 * A row's codes are 8 a word in column order, so 16 bytes are its next 32 columns. Per row and
 * group, the 16 values a code can take (lut_vals); two vpshufb give 32 bf16 a step. Columns
 * that do not start or fill a run of 16 within a group take the reference's arithmetic. */

/* 32 codes (a row's 16 bytes at q: low nibble first) -> bf16 through tables tl / th (the low
 * and high bytes, the same in both lanes), stored at o (non-temporal where nt). */
static BFS_WOQ_INLINE void gemv_step32(const uint8_t *q, __m256i tl, __m256i th, uint16_t *o, int nt)
{
    const __m128i m4 = _mm_set1_epi8(0x0F), x = _mm_loadu_si128((const __m128i *)q);
    const __m128i lo = _mm_and_si128(x, m4), hi = _mm_and_si128(_mm_srli_epi16(x, 4), m4);
    const __m256i codes = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi)); /* 0..15 | 16..31 */
    const __m256i l = _mm256_shuffle_epi8(tl, codes), h = _mm256_shuffle_epi8(th, codes);
    const __m256i a = _mm256_unpacklo_epi8(l, h), b = _mm256_unpackhi_epi8(l, h); /* 0..7 | 16..23, 8..15 | 24..31 */
    const __m256i x0 = _mm256_permute2x128_si256(a, b, 0x20), x1 = _mm256_permute2x128_si256(a, b, 0x31);
    if (nt) {
        _mm256_stream_si256((__m256i *)o, x0);
        _mm256_stream_si256((__m256i *)(o + 16), x1);
    } else {
        _mm256_storeu_si256((__m256i *)o, x0);
        _mm256_storeu_si256((__m256i *)(o + 16), x1);
    }
}

/* 16 codes (8 bytes at q) -> bf16 through tables tl / th, stored at o. */
static BFS_WOQ_INLINE void gemv_step16(const uint8_t *q, __m256i tl, __m256i th, uint16_t *o)
{
    const __m128i m4 = _mm_set1_epi8(0x0F), x = _mm_loadl_epi64((const __m128i *)q);
    const __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(x, m4), _mm_and_si128(_mm_srli_epi16(x, 4), m4));
    const __m128i l = _mm_shuffle_epi8(_mm256_castsi256_si128(tl), codes), h = _mm_shuffle_epi8(_mm256_castsi256_si128(th), codes);
    _mm_storeu_si128((__m128i *)o, _mm_unpacklo_epi8(l, h));
    _mm_storeu_si128((__m128i *)(o + 8), _mm_unpackhi_epi8(l, h));
}

static void gemv_rows(const bfs_woq_desc *d, size_t i0, size_t i1, uint16_t *out, int stream)
{
    const size_t C = d->cols, G = d->group_size, W = C / 8;
    for (size_t i = i0; i < i1;) {
        const size_t r = i / C, c0 = i % C, c1 = (r + 1) * C <= i1 ? C : c0 + (i1 - i);
        const uint8_t *q = d->qweight + 4 * r * W, *zrow = d->qzeros + 4 * r * d->zw;
        uint16_t *o = out + (i - i0) - c0; /* o[c]: column c of row r */
        for (size_t c = c0; c < c1;) {
            const size_t g = c / G, ge = (g + 1) * G < c1 ? (g + 1) * G : c1;
            const size_t a = (c + 15) / 16 * 16; /* where runs of 16 start (a group's start, as G % 16 == 0) */
            if (G % 16 == 0 && a + 16 <= ge) {
                for (; c < a; c++)
                    o[c] = bfs_awqv_value(d->qweight, d->qzeros, d->scale, r, C, d->zw, c, g, d->scale_type);
                int nan = 0;
                const float s = woq_scale1(d, r * d->zw * 8 + g, &nan);
                const __m256i v = lut_vals((int32_t)bfs_woq_code(zrow, 1, g, 4), s, d->scale_type == BFS_WOQ_F16, nan);
                const __m256i tl = _mm256_permute2x128_si256(v, v, 0x00), th = _mm256_permute2x128_si256(v, v, 0x11);
                const int nt = stream && (uintptr_t)(o + c) % 32 == 0;
                for (; c + 32 <= ge; c += 32)
                    gemv_step32(q + c / 2, tl, th, o + c, nt);
                for (; c + 16 <= ge; c += 16)
                    gemv_step16(q + c / 2, tl, th, o + c);
            }
            for (; c < ge; c++)
                o[c] = bfs_awqv_value(d->qweight, d->qzeros, d->scale, r, C, d->zw, c, g, d->scale_type);
        }
        i += c1 - c0;
    }
}

/* Rows of a bitsandbytes 8-bit weight: f32(f32(q * SCB[r]) * f32(1/127)), 16 at a time. */
static void bnb8_rows(const bfs_woq_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    const size_t C = d->cols;
    const __m256 k = _mm256_set1_ps(7.874015718698502e-3f);
    for (size_t i = i0; i < i1;) {
        const size_t r = i / C, c0 = i % C, c1 = (r + 1) * C <= i1 ? C : c0 + (i1 - i);
        float scb;
        memcpy(&scb, d->scale + 4 * r, 4);
        const __m256 s = _mm256_set1_ps(scb);
        const int nan = (bfs_f32_bits(scb) & 0x7F800000u) == 0x7F800000u;
        const int8_t *q = (const int8_t *)d->qweight + r * C;
        uint16_t *o = out + (i - i0);
        size_t c = c0;
        for (; c + 16 <= c1; c += 16, o += 16) {
            const __m128i b = _mm_loadu_si128((const __m128i *)(q + c));
            const __m256 x0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
            const __m256 x1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
            const __m256i p = _mm256_packus_epi32(woq_bf16(_mm256_mul_ps(_mm256_mul_ps(x0, s), k), nan),
                                                  woq_bf16(_mm256_mul_ps(_mm256_mul_ps(x1, s), k), nan));
            _mm256_storeu_si256((__m256i *)o, _mm256_permute4x64_epi64(p, 0xD8));
        }
        for (; c < c1; c++)
            *o++ = bfs_bnb8_value((int)q[c], scb);
        i += c1 - c0;
    }
}

void bfs__woq_avx2(const bfs_woq_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    assert(i0 <= i1 && d->cols > 0 && d->rows > 0);
    if (i0 == i1)
        return;
    if (d->layout == BFS_WOQ_BNB8) {
        bnb8_rows(d, i0, i1, out);
        return;
    }
    if (d->layout == BFS_WOQ_GEMV) {
        gemv_rows(d, i0, i1, out, (i1 - i0) * 2 >= BFS_WOQ_NT_BYTES);
        _mm_sfence();
        return;
    }
    /* A band of up to 8 tiles goes through the columns together, 32 at a time. AWQ: a column's
     * words for 128 rows are one line, read once while in cache. GPTQ: a qweight row's words for
     * 128 rows are 512 contiguous bytes, where a tile alone would touch a new page every 64
     * bytes (qweight rows are 4 * out bytes apart) and miss the TLB. */
    enum { WOQ_BAND = 8 };
    const size_t C = d->cols, rfirst = i0 / C, rlast = (i1 - 1) / C; /* rows the range touches */
    const size_t tab = d->ngroups * 16;                                /* a tile's table entries */
    int32_t *zt = aligned_alloc(32, WOQ_BAND * tab * 4);
    float *st = aligned_alloc(32, WOQ_BAND * tab * 4);
    if (!zt || !st) { /* no memory: the reference, element by element */
        free(zt);
        free(st);
        bfs__woq_scalar(d, i0, i1, out);
        return;
    }
    const int kind = d->layout == BFS_WOQ_AWQ ? 4 : d->bits == 2 ? 0 : d->bits == 3 ? 1 : d->bits == 4 ? 2 : 3;
    const size_t bw = d->bits == 3 ? 3 : (size_t)d->bits; /* GPTQ words a block of 32 columns */
    /* non-temporal stores where the rows are 32-byte aligned and the range is larger than a
     * core's caches (as memcpy does): the output is not read back soon */
    const int stream = (uintptr_t)(out + (C - i0 % C) % C) % 32 == 0 && C % 16 == 0 && (i1 - i0) * 2 >= BFS_WOQ_NT_BYTES;
    const int lut = (kind == 2 || kind == 4) && !d->g_idx && d->group_size % 32 == 0 && C % 32 == 0;
    for (size_t b0 = rfirst / 16 * 16; b0 <= rlast; b0 += 16 * WOQ_BAND) {
        woq_tile t[WOQ_BAND];
        woq_block_fn fn[WOQ_BAND];
        size_t nt = 0, nlut = 0;
        for (size_t r0 = b0; r0 <= rlast && r0 < b0 + 16 * WOQ_BAND; r0 += 16) {
            woq_tile *const x = &t[nt];
            *x = (woq_tile){.d = d, .r0 = r0, .nr = d->rows - r0 < 16 ? d->rows - r0 : 16, .i0 = i0, .i1 = i1, .out = out};
            x->whole = x->nr == 16 && r0 * C >= i0 && (r0 + 16) * C <= i1;
            x->nt = stream && x->whole;
            woq_tables(x, zt + nt * tab, st + nt * tab);
            fn[nt++] = woq_fns[kind][x->f16][x->nan];
            nlut += lut && x->whole && r0 % 16 == 0;
        }
        if (nlut == nt) { /* every tile by its tables */
            if (d->layout == BFS_WOQ_AWQ)
                awq_lut_band(t, nt);
            else
                gptq4_lut_band(t, nt);
            continue;
        }
        woq_groups gw = {0, 0};
        size_t g16[32];
        for (size_t c = 0, k = 0; c < C; c += 32, k += bw) {
            woq_groups32(d, &gw, c, g16);
            for (size_t i = 0; i < nt; i++)
                fn[i](&t[i], c, k, g16);
        }
    }
    _mm_sfence();
    free(zt);
    free(st);
}
