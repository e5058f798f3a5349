/*
 * NVFP4 (docs/FORMATS.md 6.4, 6.5), BFS_K_NVFP4, two conventions that must never be
 * confused -- the config.json quant_method and the tensor names and dtypes must all agree:
 *   compressed-tensors nvfp4-pack-quantized (quant_method "compressed-tensors", a config
 *     group {type float, num_bits 4, group_size 16}): P.weight_packed U8 [out, in/2] +
 *     P.weight_scale F8_E4M3 [out, in/16] + P.weight_global_scale F32 [1], a DIVISOR;
 *     e2m1 code 8 = -0.0;
 *   ModelOpt (quant_method "modelopt", quant_algo "NVFP4"): P.weight U8 [out, in/2] +
 *     P.weight_scale F8_E4M3 [out, in/16] + P.weight_scale_2 F32 [], a MULTIPLIER;
 *     e2m1 code 8 = +0.0.
 * -> P.weight in BF16. Low nibble = even element in both. The global scale is read here,
 * once. Kernels: kernels/ (bfs_nvfp4_desc, ref_formats.h).
 */
#include "format.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define AT(r) bfs__raw_path(c->in, (r)), (r)->st->name, (unsigned long long)(r)->file_offset

static bool bfs__is_modelopt_nvfp4(const bfs_fctx *c)
{
    const char *algo = bfs__qc_str(c->qconfig, "quant_algo");
    return bfs__qc_is(c, "modelopt") && algo && strcmp(algo, "NVFP4") == 0;
}

static int bfs__nvfp4_detect(const bfs_fctx *c)
{
    const char *algo = bfs__qc_str(c->qconfig, "quant_algo");
    if (!bfs__qc_is(c, "modelopt"))
        return 0;
    if (!algo || (strcmp(algo, "NVFP4") != 0 && strcmp(algo, "FP8") != 0))
        return bfs__err(BFS_EINPUT, "config.json: quantization_config.quant_algo \"%s\" of ModelOpt is not supported (NVFP4 and FP8 are)",
                        algo ? algo : "(none)");
    const char *fmt;
    const json_t *wt;
    void *it = NULL;
    for (size_t k = 0; (wt = bfs__ct_group_next(c, &it, &fmt)) != NULL; k++) {
        const int64_t gs = bfs__qc_int(wt, "group_size");
        if (strcmp(algo, "NVFP4") == 0 && gs != -1 && gs != 16)
            return bfs__err(BFS_EINPUT, "config.json: quantization_config config group %zu: NVFP4 group_size %lld, expected 16", k,
                            (long long)gs);
    }
    return 0;
}

/* compressed-tensors: the config group of p's module (ctmatch.c) must describe NVFP4 weights. */
static int bfs__nvfp4_ct_group(const bfs_fctx *c, const bfs_raw *p)
{
    const char *fmt;
    const json_t *wt;
    size_t kg;
    const int grc = bfs__ct_group_of(c, p, &kg);
    if (grc < 0)
        return grc;
    for (size_t k = kg; k == kg && (wt = bfs__ct_group_weights(c, k, &fmt)) != NULL; k++) {
        const char *type = bfs__qc_str(wt, "type");
        if (strcmp(fmt, "nvfp4-pack-quantized") == 0 && type && strcmp(type, "float") == 0 &&
            bfs__qc_int(wt, "num_bits") == 4 && bfs__qc_int(wt, "group_size") == 16)
            return 0;
    }
    return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): NVFP4 weight (with weight_global_scale), but the config group of its module (config group %zu of config.json quantization_config, format \"%s\") is not nvfp4-pack-quantized {type float, num_bits 4, group_size 16}",
                    AT(p), kg, bfs__ct_group_weights(c, kg, &fmt) ? fmt : "?");
}

static int bfs__nvfp4_claim(const bfs_fctx *c, bfs_raw *p, bfs_ltensor *t)
{
    const bfs_st_tensor *st = p->st;
    const bool packed_name = bfs__str_ends(st->name, ".weight_packed");
    int rc = 0;
    char *base = NULL;
    if (st->dtype != BFS_DT_U8 || (!packed_name && !bfs__str_ends(st->name, ".weight")))
        return 0;
    base = packed_name ? bfs__str_ndup(st->name, strlen(st->name) - strlen("_packed")) : bfs__strdup(st->name);
    if (!base)
        return bfs__err(BFS_ENOMEM, "out of memory");
    bfs_raw *gs = bfs__sibling(c->in, base, "_global_scale", &rc), *s2, *s;
    if (rc < 0)
        goto cleanup;
    s2 = bfs__sibling(c->in, base, "_scale_2", &rc);
    if (rc < 0)
        goto cleanup;
    s = bfs__sibling(c->in, base, "_scale", &rc);
    if (rc < 0)
        goto cleanup;
    const char *m = bfs__qc_method(c);
    const bool modelopt_cfg = bfs__is_modelopt_nvfp4(c);
    if (!packed_name) { /* P.weight U8: ModelOpt, if it has a weight_scale_2 or the config says so */
        if (gs)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): U8 weight with \"%s\": compressed-tensors NVFP4 names its weight \"%s_packed\"",
                     AT(p), gs->st->name, base);
        if (!s2) {
            if (modelopt_cfg && s)
                BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): ModelOpt NVFP4 weight without its \"%s_scale_2\" (config.json quant_algo \"NVFP4\")",
                         AT(p), base);
            rc = 0; /* a plain U8 tensor named weight: not ours */
            goto cleanup;
        }
        if (!modelopt_cfg)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): ModelOpt NVFP4 tensor, but config.json quantization_config is quant_method \"%s\", quant_algo \"%s\" (expected \"modelopt\", \"NVFP4\")",
                     AT(s2), m ? m : "(none)",
                     bfs__qc_str(c->qconfig, "quant_algo") ? bfs__qc_str(c->qconfig, "quant_algo") : "(none)");
    } else {
        if (s2)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): compressed-tensors packed weight with ModelOpt's \"%s\"", AT(p),
                     s2->st->name);
        if (!gs)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): U8 packed weight without its \"%s_global_scale\" (NVFP4) -- 8-bit or other packings are not supported",
                     AT(p), base);
        if (!bfs__qc_is(c, "compressed-tensors"))
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): compressed-tensors NVFP4 weight, but config.json quantization_config.quant_method is \"%s\" (expected \"compressed-tensors\")",
                     AT(p), m ? m : "(none)");
        BFS_TRY(bfs__nvfp4_ct_group(c, p));
    }
    bfs_raw *g = packed_name ? gs : s2;
    if (!s)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): NVFP4 weight without its scale \"%s_scale\"", AT(p), base);
    char ps[160], ss[160], gsh[160];
    bfs__shape_str(st->shape, st->ndim, ps, sizeof ps);
    bfs__shape_str(s->st->shape, s->st->ndim, ss, sizeof ss);
    bfs__shape_str(g->st->shape, g->st->ndim, gsh, sizeof gsh);
    if (st->ndim != 2 || st->shape[1] % 8 != 0)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): NVFP4 packed shape %s, expected [out, in/2] with in %% 16 == 0", AT(p), ps);
    const uint64_t out = st->shape[0], in = st->shape[1] * 2;
    if (s->st->dtype != BFS_DT_F8_E4M3 || !bfs__raw_shape_is(s, 2, out, in / 16))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): NVFP4 scale %s %s, expected F8_E4M3 [%llu, %llu] for weight \"%s\" %s",
                 AT(s), bfs__dtype_name(s->st->dtype), ss, (unsigned long long)out, (unsigned long long)(in / 16), st->name, ps);
    if (g->st->dtype != BFS_DT_F32 || bfs__raw_nelem(g) != 1 || g->st->ndim > 1)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): NVFP4 %s %s %s, expected one F32 value (weight \"%s\")", AT(g),
                 packed_name ? "global scale" : "weight_scale_2", bfs__dtype_name(g->st->dtype), gsh, st->name);
    float gv;
    memcpy(&gv, g->data, sizeof gv);
    p->used = s->used = g->used = 1;
    t->name = base;
    base = NULL;
    t->kind = BFS_K_NVFP4;
    t->out_dtype = BFS_DT_BF16;
    t->src[0] = p;
    t->src[1] = s;
    t->src[2] = g;
    t->nsrc = 3;
    t->ndim = 2;
    t->shape[0] = out;
    t->shape[1] = in;
    t->nv = (bfs_nvfp4_desc){.packed = p->data, .scale = s->data, .global_scale = gv, .modelopt = !packed_name,
                             .cols = (size_t)in};
    t->qname = packed_name ? "ct-nvfp4" : "modelopt-nvfp4";
    t->transform = packed_name ? "nvfp4 e2m1 * (scale / global_scale) -> bf16" : "nvfp4 e2m1 * (scale * weight_scale_2) -> bf16";
    bfs__finish_shape(t);
    rc = 1;
cleanup:
    free(base);
    return rc;
}

static int bfs__nvfp4_sources(const bfs_unit *u, bfs_srange out[BFS_UNIT_MAX_SRC])
{
    const bfs_ltensor *t = u->t;
    const uint64_t n = u->row1 - u->row0, C = t->nv.cols;
    out[0] = (bfs_srange){t->src[0], u->row0 * (C / 2), n * (C / 2)};
    out[1] = (bfs_srange){t->src[1], u->row0 * (C / 16), n * (C / 16)};
    return 2;
}

static const char *bfs__nvfp4_kind_name(const bfs_ltensor *t) { return t->qname; }

static const char *const bfs__nvfp4_methods[] = {"compressed-tensors", "modelopt", NULL};

const bfs_format bfs__format_nvfp4 = {
    .name = "nvfp4",
    .kinds = BFS_KIND_BIT(BFS_K_NVFP4),
    .methods = bfs__nvfp4_methods,
    .supports = "NVFP4 (compressed-tensors nvfp4-pack-quantized, ModelOpt NVFP4)",
    .layout = "P.weight_packed U8 + P.weight_global_scale, or P.weight U8 + P.weight_scale_2",
    .claim_optional = false,
    .detect = bfs__nvfp4_detect,
    .claim = bfs__nvfp4_claim,
    .leftover = NULL,
    .sources = bfs__nvfp4_sources,
    .kind_name = bfs__nvfp4_kind_name,
};
