/*
 * What GPTQ (gptq.c), AWQ (awq.c) and bitsandbytes 8-bit (bnb8.c; docs/FORMATS.md 9) share: the
 * input ranges of a unit of a BFS_K_WOQ tensor (bfs_woq_desc, kernels/bfs_kernels.h), its
 * kind name, and the checks of the scale dtype, the act-order group index and the claim's
 * integers. gptq.c's row of the table owns the kind; awq.c and bnb8.c borrow it.
 */
#include "formats/woq.h"
#include "../../kernels/ref_woq.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#define AT(r) bfs__raw_path(c->in, (r)), (r)->st->name, (unsigned long long)(r)->file_offset

/* Columns [c0, c1) of every one of `nrows` rows of `ld` entries of es bytes: from the first
 * to the last byte they take. Empty for c0 == c1. */
static bfs_srange bfs__woq_cols(const bfs_raw *r, uint64_t nrows, uint64_t ld, uint64_t es, uint64_t c0, uint64_t c1)
{
    if (c0 >= c1 || nrows == 0)
        return (bfs_srange){r, c0 * es, 0};
    return (bfs_srange){r, c0 * es, ((nrows - 1) * ld + (c1 - c0)) * es};
}

int bfs__woq_sources(const bfs_unit *u, bfs_srange out[BFS_UNIT_MAX_SRC])
{
    const bfs_ltensor *t = u->t;
    const bfs_woq_desc *d = &t->woq;
    const uint64_t r0 = u->row0, r1 = u->row1, n = r1 - r0;
    const uint64_t ss = d->scale_type == BFS_WOQ_F32 ? 4 : 2;
    if (d->layout == BFS_WOQ_BNB8) {
        out[0] = (bfs_srange){t->src[0], r0 * d->cols, n * d->cols};
        out[1] = (bfs_srange){t->src[1], r0 * 4, n * 4};
        return 2;
    }
    if (d->layout == BFS_WOQ_GEMV) { /* row-major as the output: the rows of each array */
        out[0] = (bfs_srange){t->src[0], r0 * (d->cols / 8) * 4, n * (d->cols / 8) * 4};
        out[1] = (bfs_srange){t->src[1], r0 * d->zw * 8 * ss, n * d->zw * 8 * ss};
        out[2] = (bfs_srange){t->src[2], r0 * d->zw * 4, n * d->zw * 4};
        return 3;
    }
    /* the packed words of output rows [r0, r1): 3-bit zero points in blocks of 3 words per 32 */
    const uint64_t per = d->layout == BFS_WOQ_AWQ ? 8 : d->bits == 3 ? 32 : 32 / (uint64_t)d->bits;
    const uint64_t wpb = d->layout == BFS_WOQ_GPTQ && d->bits == 3 ? 3 : 1;
    const uint64_t w0 = r0 / per * wpb, w1 = n ? ((r1 - 1) / per + 1) * wpb : w0;
    int k = 0;
    if (d->layout == BFS_WOQ_GPTQ)
        out[k++] = bfs__woq_cols(t->src[0], bfs_gptq_kw(d), d->rows, 4, r0, r1);
    else
        out[k++] = bfs__woq_cols(t->src[0], d->cols, d->zw, 4, w0, w1);
    out[k++] = bfs__woq_cols(t->src[1], d->ngroups, d->rows, ss, r0, r1);
    out[k++] = bfs__woq_cols(t->src[2], d->ngroups, d->zw, 4, w0, w1);
    if (t->nsrc > 3) /* g_idx, read whole (also where it is plain and the kernels skip it) */
        out[k++] = (bfs_srange){t->src[3], 0, n ? d->cols * 4 : 0};
    return k;
}

const char *bfs__woq_kind_name(const bfs_ltensor *t) { return t->qname; }

int bfs__woq_scale_type(const bfs_fctx *c, const bfs_raw *s, const char *weight)
{
    if (s->st->dtype == BFS_DT_F16)
        return BFS_WOQ_F16;
    /* GPTQModel registers scales as float16 buffers: whether a BF16 / F32 scale is rounded
     * to fp16 on load depends on how the loader assigns it; no writer makes one */
    return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): scales of dtype %s, expected F16 (GPTQModel keeps scales as float16 buffers; weight \"%s\")",
                    AT(s), bfs__dtype_name(s->st->dtype), weight);
}

int bfs__woq_check_gidx(const bfs_fctx *c, const bfs_raw *gi, uint64_t ngroups, uint64_t group_size, int *plain)
{
    const uint64_t n = gi->st->shape[0];
    *plain = 1;
    for (uint64_t i = 0; i < n; i++) {
        int32_t g;
        memcpy(&g, gi->data + 4 * i, 4);
        if (g < 0 || (uint64_t)g >= ngroups)
            return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): g_idx[%llu] = %d, not a group of the %llu the scales hold",
                            AT(gi), (unsigned long long)i, (int)g, (unsigned long long)ngroups);
        *plain &= (uint64_t)g == i / group_size;
    }
    return 0;
}

int bfs__woq_cfg_int(const bfs_fctx *c, const char *key, int64_t dflt, int64_t *v)
{
    const json_t *j = c->qconfig ? json_object_get(c->qconfig, key) : NULL;
    *v = dflt;
    if (!j || json_is_null(j))
        return 0;
    if (!json_is_integer(j))
        return bfs__err(BFS_EINPUT, "%s: quantization config \"%s\" is not an integer", c->qsource, key);
    *v = (int64_t)json_integer_value(j);
    return 0;
}

int bfs__woq_cfg_bits(const bfs_fctx *c, int64_t *bits, int64_t *group_size)
{
    const int rc = bfs__woq_cfg_int(c, "bits", 4, bits);
    return rc < 0 ? rc : bfs__woq_cfg_int(c, "group_size", 128, group_size);
}
