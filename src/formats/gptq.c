/*
 * GPTQ (AutoGPTQ / GPTQModel, quant_method "gptq"; docs/FORMATS.md 9.1), BFS_K_WOQ:
 *   P.qweight I32 [ceil(in * bits / 32), out] (3-bit: 3 words per 32 rows), codes packed
 *   down each column + P.qzeros I32 [ngroups, out * bits / 32] packed along each row +
 *   P.scales F16 (BF16, F32) [ngroups, out] [+ P.g_idx I32 [in], act-order / desc_act]
 * -> P.weight BF16 [out, in] as nn.Linear holds it, the value of GPTQModel's torch
 * dequantize_weight: scales[g_idx] * (q - z) in the scales' dtype, then bf16. Bits 2, 3,
 * 4, 8; sym true or false; zero points in the v1 convention (checkpoint_format / format
 * "gptq": stored z - 1, read back with GPTQModel's v1 -> v2 add) or v2 ("gptq_v2").
 * Refused, naming the field: another format (Marlin "marlin", planar "gptq_p", ...),
 * is_marlin_format, a pack_dtype other than int32, other bits. Also owns the kind's table
 * entries (woq.c) that awq.c and bnb8.c borrow.
 */
#include "formats/woq.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define AT(r) bfs__raw_path(c->in, (r)), (r)->st->name, (unsigned long long)(r)->file_offset

extern const bfs_format bfs__format_gptq;

/* checkpoint_format / format as GPTQConfig reads it: "format", else the legacy
 * "checkpoint_format", else "gptq" (v1). */
static const char *bfs__gptq_fmt(const bfs_fctx *c)
{
    const char *f = bfs__qc_str(c->qconfig, "format");
    if (!f)
        f = bfs__qc_str(c->qconfig, "checkpoint_format");
    return f ? f : "gptq";
}

static int bfs__gptq_detect(const bfs_fctx *c)
{
    if (c->claim != &bfs__format_gptq)
        return 0;
    const char *f = bfs__gptq_fmt(c), *pd = bfs__qc_str(c->qconfig, "pack_dtype");
    int64_t bits, gs;
    const int rc = bfs__woq_cfg_bits(c, &bits, &gs);
    if (rc < 0)
        return rc;
    if (json_is_true(json_object_get(c->qconfig, "is_marlin_format")) || strcasecmp(f, "marlin") == 0)
        return bfs__err(BFS_EINPUT, "%s: quant_method \"gptq\" with Marlin-repacked weights (%s) is not supported: its qweight is in Marlin's tile order, not GPTQ's (bfshard converts: %s)",
                        c->qsource, strcasecmp(f, "marlin") == 0 ? "checkpoint_format \"marlin\"" : "is_marlin_format: true", c->supported);
    if (strcasecmp(f, "gptq") != 0 && strcasecmp(f, "gptq_v2") != 0)
        return bfs__err(BFS_EINPUT, "%s: quant_method \"gptq\" with checkpoint format \"%s\" is not supported (GPTQ \"gptq\" and \"gptq_v2\" are; bfshard converts: %s)",
                        c->qsource, f, c->supported);
    if (pd && strcasecmp(pd, "int32") != 0)
        return bfs__err(BFS_EINPUT, "%s: quant_method \"gptq\" with pack_dtype \"%s\" is not supported (int32 words only)", c->qsource, pd);
    if (bits != 2 && bits != 3 && bits != 4 && bits != 8)
        return bfs__err(BFS_EINPUT, "%s: quant_method \"gptq\" with bits %lld is not supported (2, 3, 4, 8)", c->qsource, (long long)bits);
    if (gs == 0 || gs < -1)
        return bfs__err(BFS_EINPUT, "%s: quant_method \"gptq\" with group_size %lld (a positive size, or -1 for one group)", c->qsource, (long long)gs);
    return 0;
}

/* The shapes the config and qweight [Kw, N] give: in features K, the words Kw must be, the
 * zero-point words per row, the groups. */
typedef struct {
    unsigned bits;
    uint64_t K, N, kw, zw, ng, G;
} bfs_gptq_shape;

static int bfs__gptq_shapes(const bfs_fctx *c, const bfs_raw *qw, const bfs_raw *s, const bfs_raw *qz,
                            const bfs_raw *gi, bfs_gptq_shape *g, int *plain)
{
    int64_t bits, gs;
    const int rc = bfs__woq_cfg_bits(c, &bits, &gs);
    if (rc < 0)
        return rc;
    g->bits = (unsigned)bits;
    g->N = qw->st->shape[1];
    const uint64_t kw = qw->st->shape[0];
    /* in features: g_idx's length, else every code the words hold */
    g->K = gi ? gi->st->shape[0] : bits == 3 ? kw / 3 * 32 : kw * (32 / (uint64_t)bits);
    g->kw = bits == 3 ? (g->K + 31) / 32 * 3 : (g->K * (uint64_t)bits + 31) / 32;
    g->zw = bits == 3 ? (g->N + 31) / 32 * 3 : (g->N * (uint64_t)bits + 31) / 32;
    g->G = gs < 0 ? g->K : (uint64_t)gs;
    g->ng = s->st->ndim == 2 ? s->st->shape[0] : 0;
    char ws[96], ss[96], zs[96];
    bfs__shape_str(qw->st->shape, qw->st->ndim, ws, sizeof ws);
    bfs__shape_str(s->st->shape, s->st->ndim, ss, sizeof ss);
    bfs__shape_str(qz->st->shape, qz->st->ndim, zs, sizeof zs);
    if (g->K == 0 || g->N == 0 || kw != g->kw || (bits == 3 && (g->K % 32 || g->N % 32)))
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): GPTQ %d-bit qweight %s for %llu input features (%s), expected [%llu, out]%s",
                        AT(qw), (int)bits, ws, (unsigned long long)g->K, gi ? "g_idx's length" : "no g_idx",
                        (unsigned long long)g->kw, bits == 3 ? ", in and out multiples of 32" : "");
    if (!bfs__raw_shape_is(s, 2, (g->K + g->G - 1) / g->G, g->N))
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): GPTQ scales %s, expected [%llu, %llu] (ceil(in / group_size %llu), out) for qweight %s",
                        AT(s), ss, (unsigned long long)((g->K + g->G - 1) / g->G), (unsigned long long)g->N,
                        (unsigned long long)g->G, ws);
    if (qz->st->dtype != BFS_DT_I32 || !bfs__raw_shape_is(qz, 2, g->ng, g->zw))
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): GPTQ qzeros %s %s, expected I32 [%llu, %llu] for scales %s",
                        AT(qz), bfs__dtype_name(qz->st->dtype), zs, (unsigned long long)g->ng, (unsigned long long)g->zw, ss);
    if (gi && (gi->st->dtype != BFS_DT_I32 || gi->st->ndim != 1))
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): GPTQ g_idx must be I32 [in], not %s with %d dims", AT(gi),
                        bfs__dtype_name(gi->st->dtype), gi->st->ndim);
    *plain = 1;
    return gi ? bfs__woq_check_gidx(c, gi, g->ng, g->G, plain) : 0;
}

/* The name inspect and the manifest give it: "gptq-int4", "gptq-int4-v2", ... */
static const char *bfs__gptq_qname(unsigned bits, bool v1)
{
    static const char *const v1n[9] = {[2] = "gptq-int2", [3] = "gptq-int3", [4] = "gptq-int4", [8] = "gptq-int8"};
    static const char *const v2n[9] = {[2] = "gptq-int2-v2", [3] = "gptq-int3-v2", [4] = "gptq-int4-v2", [8] = "gptq-int8-v2"};
    return v1 ? v1n[bits] : v2n[bits];
}

static int bfs__gptq_claim(const bfs_fctx *c, bfs_raw *qw, bfs_ltensor *t)
{
    const bfs_st_tensor *st = qw->st;
    int rc = 0;
    char *base = NULL, *name = NULL;
    if (st->dtype != BFS_DT_I32 || !bfs__str_ends(st->name, ".qweight") || !bfs__qc_is(c, "gptq"))
        return 0; /* AWQ's qweight is awq.c's; without the claim it is refused as a leftover */
    base = bfs__str_ndup(st->name, strlen(st->name) - strlen("qweight")); /* "P." */
    name = bfs__str_cat2(base ? base : "", "weight");
    if (!base || !name)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    bfs_raw *s = bfs__sibling(c->in, base, "scales", &rc), *qz = NULL, *gi = NULL;
    if (rc == 0)
        qz = bfs__sibling(c->in, base, "qzeros", &rc);
    if (rc == 0)
        gi = bfs__sibling(c->in, base, "g_idx", &rc);
    if (rc < 0)
        goto cleanup;
    if (st->ndim != 2)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): GPTQ qweight with %d dims, expected 2 ([in * bits / 32, out])", AT(qw), st->ndim);
    if (!s || !qz)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): GPTQ qweight without its \"%s%s\"", AT(qw), base, s ? "qzeros" : "scales");
    const int stype = bfs__woq_scale_type(c, s, st->name);
    BFS_TRY(stype);
    bfs_gptq_shape g;
    int plain;
    BFS_TRY(bfs__gptq_shapes(c, qw, s, qz, gi, &g, &plain));
    const bool v1 = strcasecmp(bfs__gptq_fmt(c), "gptq") == 0;
    qw->used = s->used = qz->used = 1;
    t->src[0] = qw;
    t->src[1] = s;
    t->src[2] = qz;
    t->nsrc = 3;
    if (gi) {
        gi->used = 1;
        t->src[t->nsrc++] = gi;
    }
    t->name = name;
    name = NULL;
    t->kind = BFS_K_WOQ;
    t->out_dtype = BFS_DT_BF16;
    t->ndim = 2;
    t->shape[0] = g.N;
    t->shape[1] = g.K;
    t->woq = (bfs_woq_desc){.qweight = qw->data, .qzeros = qz->data, .scale = s->data, .g_idx = gi && !plain ? gi->data : NULL,
                            .layout = BFS_WOQ_GPTQ, .bits = (int)g.bits, .v1 = v1, .scale_type = stype,
                            .rows = (size_t)g.N, .cols = (size_t)g.K, .group_size = (size_t)g.G,
                            .ngroups = (size_t)g.ng, .zw = (size_t)g.zw};
    t->qname = bfs__gptq_qname(g.bits, v1);
    t->transform = gi ? "gptq scales[g_idx] * (q - z) -> bf16 [out, in]" : "gptq scales[k / G] * (q - z) -> bf16 [out, in]";
    bfs__finish_shape(t);
    rc = 1;
cleanup:
    free(base);
    free(name);
    return rc;
}

static const char *const bfs__gptq_methods[] = {"gptq", NULL};

const bfs_format bfs__format_gptq = {
    .name = "gptq",
    .kinds = BFS_KIND_BIT(BFS_K_WOQ),
    .methods = bfs__gptq_methods,
    .supports = "GPTQ (2/3/4/8-bit, act-order, v1 and v2 zero points)",
    .layout = "P.qweight I32 + P.qzeros + P.scales [+ P.g_idx]",
    .claim_optional = false,
    .detect = bfs__gptq_detect,
    .claim = bfs__gptq_claim,
    .leftover = NULL,
    .sources = bfs__woq_sources,
    .kind_name = bfs__woq_kind_name,
};
