/*
 * DeepSeek-V4 checkpoints (docs/FORMATS.md section 8), quant_method "fp8" with the V4 layout:
 * the scale of P.weight is P.scale (V3: P.weight_scale_inv), names kept as they are.
 *   FP8 weights: P.weight F8_E4M3 [M, N] + P.scale [ceil(M/bh), ceil(N/bw)], (bh, bw) =
 *     weight_block_size; scale_fmt "ue8m0": E8M0 bytes, stored F8_E8M0 or U8; "float": F32.
 *     -> the FP8 kernel (BFS_K_FP8, scale type E8M0 / E8M0_NAN / F32).
 *   FP4 routed experts (expert_dtype "fp4", in quantization_config or, V4, at the top of
 *     config.json): P.weight I8 [out, in/2] (E2M1 pairs, low nibble = even element) +
 *     P.scale E8M0 [out, in/32] -> the compressed-tensors MXFP4 kernel (BFS_K_CTMX, elem E2M1),
 *     whose rule is transformers' Fp8Dequantize._dequantize_one for these (code 8 = -0.0).
 * Byte 255 of an E8M0 scale is NaN when stored F8_E8M0 (torch.float8_e8m0fnu) and +inf
 * when stored U8 (transformers' exp2(s - 127.0)); byte 0 is 2^-127 in both.
 * Everything that looks like this layout but is not exactly it is refused (exit 3, naming
 * file and tensor): scale dtype or shape, I8 outside the routed experts, config vs tensors.
 * The F32 tensors V4 keeps in float32 (hc_*, attn_sink, ape, gate bias, norms) are the plan's
 * float32 rule's (src/plan/fp32.c), as every model type's.
 */
#include "format.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AT(r) bfs__raw_path(c->in, (r)), (r)->st->name, (unsigned long long)(r)->file_offset

/* The config's expert_dtype: quantization_config's (V4.1), else the top level's (V4);
 * NULL when neither. */
static const char *bfs__dsv4_expert_dtype(const bfs_fctx *c)
{
    const char *q = c->qconfig ? bfs__qc_str(c->qconfig, "expert_dtype") : NULL;
    return q ? q : c->config ? bfs__qc_str(c->config, "expert_dtype") : NULL;
}

static int bfs__dsv4_detect(const bfs_fctx *c)
{
    if (!bfs__qc_is(c, "fp8"))
        return 0;
    const char *sf = bfs__qc_str(c->qconfig, "scale_fmt"), *ed = bfs__dsv4_expert_dtype(c);
    const char *top = c->config ? bfs__qc_str(c->config, "expert_dtype") : NULL;
    const char *qed = bfs__qc_str(c->qconfig, "expert_dtype");
    if (sf && strcmp(sf, "float") != 0 && strcmp(sf, "ue8m0") != 0)
        return bfs__err(BFS_EINPUT, "%s: quantization_config.scale_fmt \"%s\" of quant_method \"fp8\" is not supported (\"float\" and \"ue8m0\" are)",
                        c->qsource, sf);
    if (ed && strcmp(ed, "fp8") != 0 && strcmp(ed, "fp4") != 0)
        return bfs__err(BFS_EINPUT, "%s: expert_dtype \"%s\" of quant_method \"fp8\" is not supported (\"fp8\" and \"fp4\" are)",
                        c->qsource, ed);
    if (top && qed && strcmp(top, qed) != 0)
        return bfs__err(BFS_EINPUT, "%s: expert_dtype \"%s\" at the top of config.json disagrees with quantization_config.expert_dtype \"%s\"",
                        c->qsource, top, qed);
    return 0;
}

/* A routed expert's weight: ".experts.<n>." in its name (shared_experts are not). */
static bool bfs__dsv4_routed(const char *name) { return strstr(name, ".experts.") != NULL; }

/* The scale of an FP8 weight: dtype per scale_fmt, shape the block grid. */
static int bfs__dsv4_fp8(const bfs_fctx *c, const bfs_raw *w, const bfs_raw *s, bfs_ltensor *t)
{
    const char *sf = bfs__qc_str(c->qconfig, "scale_fmt");
    const bool ue8m0 = sf && strcmp(sf, "ue8m0") == 0;
    const bfs_dtype sdt = s->st->dtype;
    const json_t *b = json_object_get(c->qconfig, "weight_block_size");
    char ws[160], ss[160];
    bfs__shape_str(w->st->shape, w->st->ndim, ws, sizeof ws);
    bfs__shape_str(s->st->shape, s->st->ndim, ss, sizeof ss);
    if (w->st->ndim != 2)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): FP8 weight shape %s, expected [out, in]", AT(w), ws);
    if (ue8m0 ? sdt != BFS_DT_F8_E8M0 && sdt != BFS_DT_U8 : sdt != BFS_DT_F32)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): FP8 block scale dtype %s, expected %s for weight \"%s\" (config.json quantization_config.scale_fmt \"%s\")",
                        AT(s), bfs__dtype_name(sdt), ue8m0 ? "F8_E8M0 or U8 (E8M0 exponents)" : "F32", w->st->name,
                        sf ? sf : "float");
    if (!json_is_array(b) || json_array_size(b) != 2 || json_integer_value(json_array_get(b, 0)) < 1 ||
        json_integer_value(json_array_get(b, 1)) < 1)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): a DeepSeek-V4 block scale needs config.json quantization_config.weight_block_size [rows, cols]",
                        AT(s));
    const uint64_t M = w->st->shape[0], N = w->st->shape[1];
    const uint64_t bh = (uint64_t)json_integer_value(json_array_get(b, 0)), bw = (uint64_t)json_integer_value(json_array_get(b, 1));
    if (!bfs__raw_shape_is(s, 2, (M + bh - 1) / bh, (N + bw - 1) / bw))
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): scale shape %s, expected [%llu, %llu] for weight \"%s\" %s with config.json weight_block_size [%llu, %llu]",
                        AT(s), ss, (unsigned long long)((M + bh - 1) / bh), (unsigned long long)((N + bw - 1) / bw),
                        w->st->name, ws, (unsigned long long)bh, (unsigned long long)bw);
    t->kind = BFS_K_FP8;
    t->shape[0] = M;
    t->shape[1] = N;
    t->fp8 = (bfs_fp8_desc){.w = w->data, .scale = s->data,
                            .scale_type = sdt == BFS_DT_F8_E8M0 ? BFS_SCALE_E8M0_NAN : sdt == BFS_DT_U8 ? BFS_SCALE_E8M0 : BFS_SCALE_F32,
                            .cols = (size_t)N, .bh = (size_t)(bh < M ? bh : M ? M : 1), .bw = (size_t)(bw < N ? bw : N ? N : 1)};
    t->qname = ue8m0 ? "dsv4-fp8-ue8m0" : "dsv4-fp8";
    t->transform = sdt == BFS_DT_F8_E8M0 ? "fp8 e4m3 * 2^(s-127) [F8_E8M0 block scale, 255 = NaN] -> bf16"
                 : sdt == BFS_DT_U8     ? "fp8 e4m3 * 2^(s-127) [U8 block scale, 255 = +inf] -> bf16"
                                        : "fp8 e4m3 * scale [F32 block scale] -> bf16";
    return 0;
}

/* An FP4 routed expert: I8 [out, in/2] with E8M0 scales [out, in/32]. */
static int bfs__dsv4_fp4(const bfs_fctx *c, const bfs_raw *w, const bfs_raw *s, bfs_ltensor *t)
{
    const bfs_dtype sdt = s->st->dtype;
    const char *ed = bfs__dsv4_expert_dtype(c);
    char ws[160], ss[160];
    bfs__shape_str(w->st->shape, w->st->ndim, ws, sizeof ws);
    bfs__shape_str(s->st->shape, s->st->ndim, ss, sizeof ss);
    if (!bfs__dsv4_routed(w->st->name))
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): an I8 (FP4) weight outside the routed experts (\".experts.N.\"): DeepSeek-V4 packs only those",
                        AT(w));
    if (!ed || strcmp(ed, "fp4") != 0)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): I8 (FP4) expert weight, but config.json expert_dtype is \"%s\" (expected \"fp4\")",
                        AT(w), ed ? ed : "(none)");
    if (sdt != BFS_DT_F8_E8M0 && sdt != BFS_DT_U8)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): FP4 expert scale dtype %s, expected F8_E8M0 or U8 (E8M0 exponents) for weight \"%s\"",
                        AT(s), bfs__dtype_name(sdt), w->st->name);
    const uint64_t out = w->st->ndim == 2 ? w->st->shape[0] : 0, in = w->st->ndim == 2 ? w->st->shape[1] * 2 : 0;
    if (w->st->ndim != 2 || in == 0 || in % 32 != 0)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): FP4 expert weight shape %s, expected [out, in/2] with in %% 32 == 0",
                        AT(w), ws);
    if (!bfs__raw_shape_is(s, 2, out, in / 32))
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): FP4 expert scale shape %s, expected [%llu, %llu] (one E8M0 byte per 32 elements) for weight \"%s\" %s",
                        AT(s), ss, (unsigned long long)out, (unsigned long long)(in / 32), w->st->name, ws);
    t->kind = BFS_K_CTMX;
    t->shape[0] = out;
    t->shape[1] = in;
    t->ctmx = (bfs_ctmx_desc){.w = w->data, .scale = s->data, .elem = BFS_CTMX_E2M1, .cols = (size_t)in, .nan255 = sdt == BFS_DT_F8_E8M0};
    t->qname = "dsv4-fp4-ue8m0";
    t->transform = sdt == BFS_DT_F8_E8M0 ? "fp4 e2m1 * 2^(s-127) [F8_E8M0 scale per 32, 255 = NaN] -> bf16"
                                          : "fp4 e2m1 * 2^(s-127) [U8 scale per 32, 255 = +inf] -> bf16";
    return 0;
}

static int bfs__dsv4_claim(const bfs_fctx *c, bfs_raw *w, bfs_ltensor *t)
{
    const bfs_st_tensor *st = w->st;
    int rc = 0;
    char *base = NULL;
    if ((st->dtype != BFS_DT_F8_E4M3 && st->dtype != BFS_DT_I8) || !bfs__str_ends(st->name, ".weight"))
        return 0;
    base = bfs__str_ndup(st->name, strlen(st->name) - strlen(".weight"));
    if (!base)
        return bfs__err(BFS_ENOMEM, "out of memory");
    bfs_raw *s = bfs__sibling(c->in, base, ".scale", &rc);
    if (rc < 0 || !s)
        goto cleanup; /* no P.scale: not this layout */
    if (!bfs__qc_is(c, "fp8"))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): %s weight with a DeepSeek-V4 scale \"%s\", but config.json quantization_config.quant_method is \"%s\" (expected \"fp8\")",
                 AT(w), bfs__dtype_name(st->dtype), s->st->name, c->method ? c->method : "(none)");
    const char *ed = bfs__dsv4_expert_dtype(c);
    if (st->dtype == BFS_DT_F8_E4M3 && bfs__dsv4_routed(st->name) && ed && strcmp(ed, "fp4") == 0)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): an FP8 routed expert weight, but config.json expert_dtype is \"fp4\" (FP4 experts are I8)",
                 AT(w));
    t->nsrc = 2;
    t->ndim = 2;
    t->out_dtype = BFS_DT_BF16;
    BFS_TRY(st->dtype == BFS_DT_I8 ? bfs__dsv4_fp4(c, w, s, t) : bfs__dsv4_fp8(c, w, s, t));
    t->src[0] = w;
    t->src[1] = s;
    t->name = bfs__strdup(st->name); /* the checkpoint's own name */
    if (!t->name)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    w->used = s->used = 1;
    bfs__finish_shape(t);
    rc = 1;
cleanup:
    free(base);
    return rc;
}

static const char *const bfs__dsv4_methods[] = {"fp8", NULL};

/* Plans BFS_K_FP8 and BFS_K_CTMX tensors but declares no kind: fp8.c and ctmx.c name them
 * (t->qname) and list their sources; the planner records this row as their claimer (t->by).
 * After fp8.c in the table (fp8.c is quant_method fp8's claim, tried first on every tensor,
 * and leaves a weight with a P.scale and no V3 scale to this row). */
const bfs_format bfs__format_dsv4 = {
    .name = "dsv4",
    .kinds = 0,
    .borrows = BFS_KIND_BIT(BFS_K_FP8) | BFS_KIND_BIT(BFS_K_CTMX),
    .methods = bfs__dsv4_methods,
    .supports = "DeepSeek-V4 (quant_method fp8, P.scale: FP8 with E8M0 or F32 block scales, FP4 experts)",
    .layout = "P.weight F8_E4M3 or I8 (FP4 experts) + P.scale",
    .claim_optional = false,
    .detect = bfs__dsv4_detect,
    .claim = bfs__dsv4_claim,
    .leftover = NULL,
    .sources = NULL,
    .kind_name = NULL,
};
