/*
 * AWQ GEMM (AutoAWQ / llm-awq / GPTQModel, quant_method "awq", version "gemm";
 * docs/FORMATS.md 9.2), BFS_K_WOQ (the kind gptq.c owns):
 *   P.qweight I32 [in, out / 8] (4-bit, AWQ's field order [0, 2, 4, 6, 1, 3, 5, 7]) +
 *   P.qzeros I32 [in / G, out / 8] (the same packing) + P.scales F16 [in / G, out]
 * -> P.weight BF16 [out, in], the value of GPTQModel's dequantize_gemm (what transformers
 * 5.23 loads AWQ with): (q - z) * scales in the scales' dtype, then bf16.
 * zero_point false: the same tensors and formula when the checkpoint has qzeros (AutoAWQ
 * itself cannot export GEMM weights without zero points: from_linear asserts zeros); a
 * qweight without qzeros is refused, as dequantize_gemm cannot read it either.
 * Refused, naming the field: version "gemv" / "gemv_fast" (GPTQModel runs those through its
 * CUDA kernels only, no dequantized weight to match), "exllama", "ipex", "marlin", bits
 * other than 4, a group_size that is not positive.
 */
#include "formats/woq.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define AT(r) bfs__raw_path(c->in, (r)), (r)->st->name, (unsigned long long)(r)->file_offset

extern const bfs_format bfs__format_awq;

/* version as AwqConfig reads it ("gemm" when absent); GPTQModel writes "format". */
static const char *bfs__awq_version(const bfs_fctx *c)
{
    const char *v = bfs__qc_str(c->qconfig, "version");
    if (!v)
        v = bfs__qc_str(c->qconfig, "format");
    return v ? v : "gemm";
}

static int bfs__awq_detect(const bfs_fctx *c)
{
    if (c->claim != &bfs__format_awq)
        return 0;
    const char *v = bfs__awq_version(c);
    int64_t bits, gs;
    const int rc = bfs__woq_cfg_bits(c, &bits, &gs);
    if (rc < 0)
        return rc;
    if (strcasecmp(v, "gemm") != 0)
        return bfs__err(BFS_EINPUT, "%s: quant_method \"awq\" with version \"%s\" is not supported (AWQ \"gemm\" is%s; bfshard converts: %s)",
                        c->qsource, v,
                        strncasecmp(v, "gemv", 4) == 0 ? ": GPTQModel runs GEMV weights through its CUDA kernel only, with no dequantized weight to match" : "",
                        c->supported);
    if (bits != 4)
        return bfs__err(BFS_EINPUT, "%s: quant_method \"awq\" with bits %lld is not supported (4)", c->qsource, (long long)bits);
    if (gs < 1)
        return bfs__err(BFS_EINPUT, "%s: quant_method \"awq\" with group_size %lld (dequantize_gemm repeats each scale row group_size times: a positive size)",
                        c->qsource, (long long)gs);
    return 0;
}

static int bfs__awq_claim(const bfs_fctx *c, bfs_raw *qw, bfs_ltensor *t)
{
    const bfs_st_tensor *st = qw->st;
    int rc = 0;
    char *base = NULL, *name = NULL;
    if (st->dtype != BFS_DT_I32 || !bfs__str_ends(st->name, ".qweight") || !bfs__qc_is(c, "awq"))
        return 0;
    base = bfs__str_ndup(st->name, strlen(st->name) - strlen("qweight")); /* "P." */
    name = bfs__str_cat2(base ? base : "", "weight");
    if (!base || !name)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    bfs_raw *s = bfs__sibling(c->in, base, "scales", &rc), *qz = NULL;
    if (rc == 0)
        qz = bfs__sibling(c->in, base, "qzeros", &rc);
    if (rc < 0)
        goto cleanup;
    if (!s)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): AWQ qweight without its \"%sscales\"", AT(qw), base);
    if (!qz)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): AWQ qweight without \"%sqzeros\" (zero_point false without zero points: GPTQModel's dequantize_gemm cannot read it, and AutoAWQ writes none)",
                 AT(qw), base);
    const int stype = bfs__woq_scale_type(c, s, st->name);
    BFS_TRY(stype);
    int64_t gs;
    BFS_TRY(bfs__woq_cfg_int(c, "group_size", 128, &gs));
    char ws[96], ss[96], zs[96];
    bfs__shape_str(st->shape, st->ndim, ws, sizeof ws);
    bfs__shape_str(s->st->shape, s->st->ndim, ss, sizeof ss);
    bfs__shape_str(qz->st->shape, qz->st->ndim, zs, sizeof zs);
    if (st->ndim != 2 || s->st->ndim != 2 || st->shape[0] == 0)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): AWQ qweight %s and scales %s, expected [in, out / 8] and [in / group_size, out]",
                 AT(qw), ws, ss);
    const uint64_t K = st->shape[0], N = s->st->shape[1], zw = (N + 7) / 8, G = (uint64_t)gs, ng = K / G;
    if (N == 0 || K % G != 0 || st->shape[1] != zw || s->st->shape[0] != ng)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): AWQ qweight %s and scales %s do not fit group_size %llu ([in, ceil(out / 8)] and [in / %llu, out], in %% %llu == 0)",
                 AT(qw), ws, ss, (unsigned long long)G, (unsigned long long)G, (unsigned long long)G);
    if (qz->st->dtype != BFS_DT_I32 || !bfs__raw_shape_is(qz, 2, ng, zw))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): AWQ qzeros %s %s, expected I32 [%llu, %llu]", AT(qz),
                 bfs__dtype_name(qz->st->dtype), zs, (unsigned long long)ng, (unsigned long long)zw);
    qw->used = s->used = qz->used = 1;
    t->src[0] = qw;
    t->src[1] = s;
    t->src[2] = qz;
    t->nsrc = 3;
    t->name = name;
    name = NULL;
    t->kind = BFS_K_WOQ;
    t->out_dtype = BFS_DT_BF16;
    t->ndim = 2;
    t->shape[0] = N;
    t->shape[1] = K;
    t->woq = (bfs_woq_desc){.qweight = qw->data, .qzeros = qz->data, .scale = s->data, .g_idx = NULL,
                            .layout = BFS_WOQ_AWQ, .bits = 4, .v1 = 0, .scale_type = stype, .rows = (size_t)N,
                            .cols = (size_t)K, .group_size = (size_t)G, .ngroups = (size_t)ng, .zw = (size_t)zw};
    t->qname = "awq-gemm";
    t->transform = "awq (q - z) * scales -> bf16 [out, in]";
    bfs__finish_shape(t);
    rc = 1;
cleanup:
    free(base);
    free(name);
    return rc;
}

static const char *const bfs__awq_methods[] = {"awq", NULL};

/* Plans BFS_K_WOQ tensors but declares no kind: gptq.c's row names them and gives their
 * sources (woq.c). */
const bfs_format bfs__format_awq = {
    .name = "awq",
    .kinds = 0,
    .borrows = BFS_KIND_BIT(BFS_K_WOQ),
    .methods = bfs__awq_methods,
    .supports = "AWQ GEMM (4-bit)",
    .layout = "P.qweight I32 [in, out / 8] + P.qzeros + P.scales",
    .claim_optional = false,
    .detect = bfs__awq_detect,
    .claim = bfs__awq_claim,
    .leftover = NULL,
    .sources = NULL,
    .kind_name = NULL,
};
