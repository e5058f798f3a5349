/*
 * AWQ (AutoAWQ / llm-awq / GPTQModel, quant_method "awq"; docs/FORMATS.md 9.2), BFS_K_WOQ
 * (the kind gptq.c owns), 4-bit, F16 scales, -> P.weight BF16 [out, in]:
 *   version "gemm": P.qweight I32 [in, out / 8] (AWQ's field order [0, 2, 4, 6, 1, 3, 5, 7]) +
 *     P.qzeros I32 [in / G, out / 8] (the same packing) + P.scales F16 [in / G, out];
 *   version "gemv": P.qweight I32 [out, in / 8] (fields in column order) + P.qzeros I32
 *     [out, zw] + P.scales F16 [out, zw * 8], zw = calculate_zeros_width(in, G) (padded).
 * The value of GPTQModel's dequantize_gemm (what transformers 5.23 loads GEMM with), which is
 * also the weight GPTQModel's GEMV kernel for more than 8 input rows forms
 * (gemmv2_forward_4bit_cuda_m128n64k32): (q - z) * scales rounded to fp16, then bf16.
 * zero_point false: the same tensors and formula when the checkpoint has qzeros (AutoAWQ
 * itself cannot export weights without zero points: from_linear / pack assert zeros); a
 * qweight without qzeros is refused, as dequantize_gemm cannot read it either.
 * Refused, naming the field: version "gemv_fast" (llm-awq's interleaved int16 words with
 * scaled zeros), "exllama", "ipex", "marlin", bits other than 4, a group_size that is not
 * positive.
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
    if (strcasecmp(v, "gemm") != 0 && strcasecmp(v, "gemv") != 0)
        return bfs__err(BFS_EINPUT, "%s: quant_method \"awq\" with version \"%s\" is not supported (AWQ \"gemm\" and \"gemv\" are%s; bfshard converts: %s)",
                        c->qsource, v,
                        strcasecmp(v, "gemv_fast") == 0 ? "; \"gemv_fast\" is llm-awq's interleaved int16 layout with scaled zero points" : "",
                        c->supported);
    if (bits != 4)
        return bfs__err(BFS_EINPUT, "%s: quant_method \"awq\" with bits %lld is not supported (4)", c->qsource, (long long)bits);
    if (gs < 1)
        return bfs__err(BFS_EINPUT, "%s: quant_method \"awq\" with group_size %lld (dequantize_gemm repeats each scale row group_size times: a positive size)",
                        c->qsource, (long long)gs);
    return 0;
}

/* GPTQModel utils/gemv.py calculate_zeros_width (AutoAWQ 0.2.9's, modules/linear/gemv.py, is the
 * same without group 16): a GEMV weight's qzeros words per row, ceil(in / G / 8) rounded up to
 * a multiple of m = 1, 2, 4, 8 for G >= 128, 64, 32, 16 (bfs__awq_gemv_mult; 0 for the group
 * sizes it raises on). Its kernels check qzeros and scales against it. */
static uint64_t bfs__awq_gemv_mult(uint64_t G) { return G >= 128 ? 1 : G == 64 ? 2 : G == 32 ? 4 : G == 16 ? 8 : 0; }
static uint64_t bfs__awq_gemv_zw(uint64_t in, uint64_t G, uint64_t m) { return ((in / G + 7) / 8 + m - 1) / m * m; }

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
    const int gemv = strcasecmp(bfs__awq_version(c), "gemv") == 0;
    if (st->ndim != 2 || s->st->ndim != 2 || st->shape[0] == 0 || st->shape[1] == 0)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): AWQ qweight %s and scales %s, expected %s", AT(qw), ws, ss,
                 gemv ? "[out, in / 8] and [out, zw * 8] (GEMV)" : "[in, out / 8] and [in / group_size, out]");
    const uint64_t G = (uint64_t)gs;
    uint64_t K, N, zw, ng;
    if (gemv) { /* [out, in / 8], qzeros [out, zw], scales [out, zw * 8], zw padded (calculate_zeros_width) */
        N = st->shape[0];
        K = st->shape[1] * 8; /* no overflow: the tensor's bytes (checked against the file) bound shape[1] */
        ng = K / G;
        const uint64_t m = bfs__awq_gemv_mult(G);
        if (m == 0)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): AWQ GEMV with group_size %llu (GPTQModel's calculate_zeros_width, which lays out its zero points, takes 16, 32, 64 or >= 128)",
                     AT(qw), (unsigned long long)G);
        zw = bfs__awq_gemv_zw(K, G, m);
        if (K % G != 0 || !bfs__raw_shape_is(s, 2, N, zw * 8))
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): AWQ GEMV qweight %s and scales %s do not fit group_size %llu (expected scales [%llu, %llu]: calculate_zeros_width(in %llu, %llu) * 8; in %% %llu == 0)",
                     AT(qw), ws, ss, (unsigned long long)G, (unsigned long long)N, (unsigned long long)(zw * 8),
                     (unsigned long long)K, (unsigned long long)G, (unsigned long long)G);
        if (qz->st->dtype != BFS_DT_I32 || !bfs__raw_shape_is(qz, 2, N, zw))
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): AWQ GEMV qzeros %s %s, expected I32 [%llu, %llu] (calculate_zeros_width)", AT(qz),
                     bfs__dtype_name(qz->st->dtype), zs, (unsigned long long)N, (unsigned long long)zw);
    } else {
        K = st->shape[0];
        N = s->st->shape[1];
        zw = (N + 7) / 8;
        ng = K / G;
        if (N == 0 || K % G != 0 || st->shape[1] != zw || s->st->shape[0] != ng)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): AWQ qweight %s and scales %s do not fit group_size %llu ([in, ceil(out / 8)] and [in / %llu, out], in %% %llu == 0)",
                     AT(qw), ws, ss, (unsigned long long)G, (unsigned long long)G, (unsigned long long)G);
        if (qz->st->dtype != BFS_DT_I32 || !bfs__raw_shape_is(qz, 2, ng, zw))
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): AWQ qzeros %s %s, expected I32 [%llu, %llu]", AT(qz),
                     bfs__dtype_name(qz->st->dtype), zs, (unsigned long long)ng, (unsigned long long)zw);
    }
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
                            .layout = gemv ? BFS_WOQ_GEMV : BFS_WOQ_AWQ, .bits = 4, .v1 = 0, .scale_type = stype, .rows = (size_t)N,
                            .cols = (size_t)K, .group_size = (size_t)G, .ngroups = (size_t)ng, .zw = (size_t)zw};
    t->qname = gemv ? "awq-gemv" : "awq-gemm";
    t->transform = gemv ? "awq gemv (q - z) * scales -> bf16 [out, in]" : "awq (q - z) * scales -> bf16 [out, in]";
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
    .supports = "AWQ GEMM and GEMV (4-bit)",
    .layout = "P.qweight I32 [in, out / 8] (GEMV: [out, in / 8]) + P.qzeros + P.scales",
    .claim_optional = false,
    .detect = bfs__awq_detect,
    .claim = bfs__awq_claim,
    .leftover = NULL,
    .sources = NULL,
    .kind_name = NULL,
};
