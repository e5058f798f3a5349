/*
 * The CPU kernel of the issue-38 formats (GPTQ, AWQ GEMM, bitsandbytes 8-bit) for the AVX2
 * and AVX-512 levels: the same values as the scalar reference (bfs__woq_scalar, through
 * ref_woq.h's primitives), computed a row segment at a time. Codes of at most 4 bits go
 * through a table per row: every group's 2^bits values made once (act-order g_idx jumps
 * between groups at every column, so one table per group change would be 16 x the work);
 * 8-bit codes are computed one by one with the group's zero point cached. Plain C: the
 * reads down a GPTQ column are strided, which no vector load helps with.
 */
#include "bfs_kernels.h"
#include "ref.h"
#include "ref_woq.h"

#include <assert.h>
#include <stdlib.h>

/* Row r, columns [c0, c1) of a GPTQ / AWQ weight of at most 4 bits, through lut
 * (ngroups << bits entries: the value of code q in group g at lut[(g << bits) + q]). */
static void woq_row_lut(const bfs_woq_desc *d, size_t r, size_t c0, size_t c1, uint16_t *lut, uint16_t *o)
{
    const unsigned bits = (unsigned)d->bits;
    for (size_t g = 0; g < d->ngroups; g++) {
        const int z = d->layout == BFS_WOQ_GPTQ ? bfs_gptq_zero(d, g, r)
                                                : (int)bfs_awq_field(d->qzeros + g * d->zw * 4, r);
        for (unsigned q = 0; q < (1u << bits); q++)
            lut[(g << bits) + q] = bfs_woq_value(d->scale, g * d->rows + r, d->scale_type, (int)q - z);
    }
    if (d->layout == BFS_WOQ_AWQ) {
        for (size_t c = c0; c < c1; c++)
            *o++ = lut[(bfs_woq_group(d, c) << bits) + bfs_awq_field(d->qweight + c * d->zw * 4, r)];
        return;
    }
    const uint8_t *col = d->qweight + 4 * r;
    if (bits == 3) {
        for (size_t c = c0; c < c1; c++)
            *o++ = lut[(bfs_woq_group(d, c) << 3) + bfs_woq_code(col, d->rows, c, 3)];
        return;
    }
    const unsigned per = 32u / bits, mask = (1u << bits) - 1u;
    for (size_t c = c0; c < c1;) {
        const size_t k = c / per;
        const uint32_t w = bfs_woq_word(col, k * d->rows);
        const size_t ce = (k + 1) * per < c1 ? (k + 1) * per : c1;
        for (; c < ce; c++)
            *o++ = lut[(bfs_woq_group(d, c) << bits) + ((w >> (bits * (unsigned)(c % per))) & mask)];
    }
}

/* Row r, columns [c0, c1) of an 8-bit GPTQ weight: the group's zero point cached. */
static void woq_row_8(const bfs_woq_desc *d, size_t r, size_t c0, size_t c1, uint16_t *o)
{
    const uint8_t *col = d->qweight + 4 * r;
    size_t last = (size_t)-1;
    int z = 0;
    for (size_t c = c0; c < c1; c++) {
        const size_t g = bfs_woq_group(d, c);
        if (g != last) {
            z = bfs_gptq_zero(d, g, r);
            last = g;
        }
        const int q = (int)((bfs_woq_word(col, (c / 4) * d->rows) >> (8u * (unsigned)(c % 4))) & 0xFFu);
        *o++ = bfs_woq_value(d->scale, g * d->rows + r, d->scale_type, q - z);
    }
}

void bfs__woq_rows(const bfs_woq_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    assert(i0 <= i1 && d->cols > 0 && d->rows > 0);
    const size_t C = d->cols;
    uint16_t *lut = NULL;
    const size_t nlut = d->layout == BFS_WOQ_BNB8 || d->bits > 4 ? 0 : d->ngroups << d->bits;
    for (size_t i = i0; i < i1;) {
        const size_t r = i / C, c0 = i % C, c1 = (r + 1) * C <= i1 ? C : c0 + (i1 - i);
        uint16_t *const o = out + (i - i0);
        if (d->layout == BFS_WOQ_BNB8) {
            float scb;
            memcpy(&scb, d->scale + 4 * r, 4);
            const int8_t *q = (const int8_t *)d->qweight + r * C;
            for (size_t c = c0; c < c1; c++)
                o[c - c0] = bfs_bnb8_value((int)q[c], scb);
        } else if (d->bits == 8) {
            woq_row_8(d, r, c0, c1, o);
        } else if (nlut > 2 * (c1 - c0) || (!lut && !(lut = malloc(nlut * sizeof *lut)))) {
            for (size_t c = c0; c < c1; c++) /* a short piece, or no memory: one by one */
                o[c - c0] = bfs_woq_elem(d, r, c);
        } else {
            woq_row_lut(d, r, c0, c1, lut, o);
        }
        i += c1 - c0;
    }
    free(lut);
}
