/*
 * AMD Quark exports (quant_method "quark", amd-quark 0.13 export_safetensors, custom_mode
 * "quark", weight_format "real_quantized"; docs/FORMATS.md 7.7), two weight schemes:
 *   MXFP4 (a weight spec {dtype "fp4", qscheme "per_group", group_size 32, scale_format "e8m0"}):
 *     P.weight U8 [out, in/2] (E2M1 pairs, low nibble = even element: Pack_fp4) +
 *     P.weight_scale U8 [out, in/32] (E8M0 exponents, bias 127);
 *   FP8 per tensor ({dtype "fp8_e4m3", qscheme "per_tensor"}): P.weight F8_E4M3 [out, in] +
 *     P.weight_scale BF16 or F32 [] (the model's dtype).
 * -> P.weight in BF16 by the kernels of compressed-tensors MXFP4 (BFS_K_CTMX, E2M1: the same
 * rule, 255 = +inf) and of per-tensor FP8 (BFS_K_FP8, one block): measured against Quark's reload
 * path (fixtures/FINDINGS-quark.txt). Activation-only tensors (P.input_scale, P.output_scale and
 * their zero points, P.k_scale, P.v_scale) are dropped.
 * Which spec quantizes a module is Quark's rule (quantization/model_transformation.py): exclude
 * (fnmatch) -> none; layer_quant_config (exact name, then fnmatch in file order) -> layer_type_quant_config
 * (by class: unknown here, any of its specs) -> global_quant_config. The tensors must agree with it.
 * Refused (exit 3, one line): every other Quark weight spec (int4/uint4 with its reordered int32
 * packing, fp6, mx, fp8 per channel or group, e5m2, bias specs), fake_quantized exports, weight
 * merge groups, an algo_config, a tensor that disagrees with its spec.
 */
#include "format.h"

#include <fnmatch.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QTRY(e)                       \
    do {                              \
        const int qrc_ = (e);         \
        if (qrc_ < 0)                 \
            return qrc_;              \
    } while (0)
#define AT(r) bfs__raw_path(c->in, (r)), (r)->st->name, (unsigned long long)(r)->file_offset

enum { QK_NONE = 0, QK_MXFP4 = 1, QK_FP8 = 2, QK_ANY = 3 }; /* bits: what a module may hold */

static bool bfs__quark(const bfs_fctx *c) { return bfs__qc_is(c, "quark"); }

static bool bfs__js_is(const json_t *o, const char *key, const char *want)
{
    const char *v = bfs__qc_str(o, key);
    return v && strcmp(v, want) == 0;
}

static bool bfs__js_null(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return !v || json_is_null(v);
}

/* A layer config's weight spec: QK_NONE (null), QK_MXFP4, QK_FP8; < 0 naming where for any other. */
static int bfs__quark_spec(const bfs_fctx *c, const json_t *layer, const char *where, int *out)
{
    const json_t *w = layer ? json_object_get(layer, "weight") : NULL;
    *out = QK_NONE;
    if (!json_is_object(layer))
        return bfs__err(BFS_EINPUT, "%s: quantization_config.%s is not a JSON object", c->qsource, where);
    if (!bfs__js_null(layer, "bias"))
        return bfs__err(BFS_EINPUT, "%s: quantization_config.%s.bias: quantized biases are not supported (bfshard converts Quark MXFP4 and per-tensor FP8 weights)",
                        c->qsource, where);
    if (!w || json_is_null(w))
        return 0;
    if (!json_is_object(w))
        return bfs__err(BFS_EINPUT, "%s: quantization_config.%s.weight is not one spec (a list of specs, double quantization, is not supported)",
                        c->qsource, where);
    const char *dt = bfs__qc_str(w, "dtype"), *qs = bfs__qc_str(w, "qscheme");
    const bool plain = bfs__js_null(w, "block_size") && bfs__js_null(w, "mx_element_dtype") &&
                       !json_is_true(json_object_get(w, "is_scale_quant"));
    if (plain && dt && strcmp(dt, "fp4") == 0 && qs && strcmp(qs, "per_group") == 0 &&
        bfs__qc_int(w, "group_size") == 32 && bfs__js_is(w, "scale_format", "e8m0") &&
        (bfs__qc_int(w, "ch_axis") == -1 || bfs__qc_int(w, "ch_axis") == 1))
        *out = QK_MXFP4;
    else if (plain && dt && strcmp(dt, "fp8_e4m3") == 0 && qs && strcmp(qs, "per_tensor") == 0 &&
             bfs__js_null(w, "scale_format") && bfs__js_null(w, "group_size"))
        *out = QK_FP8;
    else
        return bfs__err(BFS_EINPUT, "%s: quantization_config.%s.weight {dtype \"%s\", qscheme \"%s\", group_size %lld, scale_format \"%s\"} is not supported (Quark MXFP4 {fp4, per_group, 32, e8m0} and per-tensor FP8 {fp8_e4m3, per_tensor} are)",
                        c->qsource, where, dt ? dt : "?", qs ? qs : "?", (long long)bfs__qc_int(w, "group_size"),
                        bfs__qc_str(w, "scale_format") ? bfs__qc_str(w, "scale_format") : "null");
    return 0;
}

/* Every layer config of a map (layer_quant_config, layer_type_quant_config): supported specs;
 * *any gets the bits of the schemes it holds. */
static int bfs__quark_map(const bfs_fctx *c, const char *key, int *any)
{
    const json_t *m = json_object_get(c->qconfig, key);
    const char *k;
    const json_t *v;
    char where[300];
    if (!m || json_is_null(m))
        return 0;
    if (!json_is_object(m))
        return bfs__err(BFS_EINPUT, "%s: quantization_config.%s is not a JSON object", c->qsource, key);
    json_object_foreach((json_t *)m, k, v) {
        int s;
        snprintf(where, sizeof where, "%s[\"%.200s\"]", key, k);
        if (strstr(k, "[^"))
            return bfs__err(BFS_EINPUT, "%s: quantization_config.%s: a \"[^\" pattern (a literal ^ to Python's fnmatch, a negation to C's) is not supported",
                            c->qsource, where);
        QTRY(bfs__quark_spec(c, v, where, &s));
        *any |= s;
    }
    return 0;
}

static int bfs__quark_detect(const bfs_fctx *c)
{
    int any = 0, g;
    if (c->claim == NULL || !bfs__quark(c))
        return 0;
    const json_t *ex = json_object_get(c->qconfig, "export");
    const char *wf = ex ? bfs__qc_str(ex, "weight_format") : NULL;
    if (!json_is_object(ex) || !wf || strcmp(wf, "real_quantized") != 0)
        return bfs__err(BFS_EINPUT, "%s: quantization_config.export.weight_format \"%s\" is not supported (Quark's \"real_quantized\" exports are)",
                        c->qsource, wf ? wf : "(none)");
    const json_t *mg = json_object_get(ex, "weight_merge_groups");
    if (mg && !json_is_null(mg) && !(json_is_array(mg) && json_array_size(mg) == 0))
        return bfs__err(BFS_EINPUT, "%s: quantization_config.export.weight_merge_groups (shared scales across merged weights) is not supported", c->qsource);
    if (!bfs__js_null(c->qconfig, "algo_config"))
        return bfs__err(BFS_EINPUT, "%s: quantization_config.algo_config is set (a Quark algorithm such as AWQ, GPTQ, SmoothQuant or rotation may leave tensors bfshard has not measured); only algo_config null is supported",
                        c->qsource);
    const json_t *gq = json_object_get(c->qconfig, "global_quant_config");
    if (!gq)
        return bfs__err(BFS_EINPUT, "%s: quantization_config (quant_method \"quark\") has no global_quant_config", c->qsource);
    QTRY(bfs__quark_spec(c, gq, "global_quant_config", &g));
    QTRY(bfs__quark_map(c, "layer_quant_config", &any));
    QTRY(bfs__quark_map(c, "layer_type_quant_config", &any));
    const json_t *exl = json_object_get(c->qconfig, "exclude");
    if (exl && !json_is_null(exl) && !json_is_array(exl))
        return bfs__err(BFS_EINPUT, "%s: quantization_config.exclude is not a list", c->qsource);
    return 0;
}

static bool bfs__fnmatch(const char *pat, const char *name) { return fnmatch(pat, name, FNM_NOESCAPE) == 0; }

/* What Quark's config gives module m (QK_* bits, QK_ANY-like when a class decides). */
static int bfs__quark_module(const bfs_fctx *c, const char *m, int *out, const char **why)
{
    const json_t *exl = json_object_get(c->qconfig, "exclude"), *v;
    const json_t *lq = json_object_get(c->qconfig, "layer_quant_config");
    const json_t *lt = json_object_get(c->qconfig, "layer_type_quant_config");
    size_t i;
    const char *k;
    json_array_foreach(exl, i, v)
        if (json_is_string(v) && bfs__fnmatch(json_string_value(v), m)) {
            *out = QK_NONE;
            *why = "quantization_config.exclude";
            return 0;
        }
    *why = "quantization_config.layer_quant_config";
    const json_t *hit = json_is_object(lq) ? json_object_get(lq, m) : NULL;
    if (hit)
        return bfs__quark_spec(c, hit, "layer_quant_config", out);
    if (json_is_object(lq))
        json_object_foreach((json_t *)lq, k, v)
            if (bfs__fnmatch(k, m))
                return bfs__quark_spec(c, v, "layer_quant_config", out);
    if (json_is_object(lt) && json_object_size(lt) > 0) {
        /* by module class, which a checkpoint does not name: any spec of the map or the global one */
        int a = 0, g = 0;
        QTRY(bfs__quark_map(c, "layer_type_quant_config", &a));
        QTRY(bfs__quark_spec(c, json_object_get(c->qconfig, "global_quant_config"), "global_quant_config", &g));
        *out = a | g | 4; /* 4: "or none": the class may be one no spec names */
        *why = "quantization_config.layer_type_quant_config";
        return 0;
    }
    *why = "quantization_config.global_quant_config";
    return bfs__quark_spec(c, json_object_get(c->qconfig, "global_quant_config"), "global_quant_config", out);
}

static int bfs__quark_claim(const bfs_fctx *c, bfs_raw *r, bfs_ltensor *t)
{
    const bfs_st_tensor *st = r->st;
    int rc = 0, want = 0;
    const char *why = "";
    char *mod = NULL;
    char ws[160], ss[160];
    if (!bfs__quark(c) || !bfs__str_ends(st->name, ".weight"))
        return 0;
    bfs_raw *s = bfs__sibling(c->in, st->name, "_scale", &rc), *zp = NULL;
    if (rc < 0)
        return rc;
    if ((zp = bfs__sibling(c->in, st->name, "_zero_point", &rc)) == NULL && rc < 0)
        return rc;
    const bool qdt = st->dtype == BFS_DT_U8 || st->dtype == BFS_DT_F8_E4M3;
    if (!s && !zp)
        return 0; /* unquantized (a quantized dtype alone: refuse.c) */
    mod = bfs__str_ndup(st->name, strlen(st->name) - strlen(".weight"));
    if (!mod)
        return bfs__err(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__quark_module(c, mod, &want, &why));
    bfs__shape_str(st->shape, st->ndim, ws, sizeof ws);
    if (zp)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): a Quark weight with a zero point \"%s\" (asymmetric integer schemes) is not supported",
                 AT(r), zp->st->name);
    bfs__shape_str(s->st->shape, s->st->ndim, ss, sizeof ss);
    const int got = st->dtype == BFS_DT_U8 ? QK_MXFP4 : st->dtype == BFS_DT_F8_E4M3 ? QK_FP8 : 0;
    if (!qdt)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): a %s weight beside the scale \"%s\": Quark writes U8 (MXFP4) or F8_E4M3 (FP8) weights with a weight_scale",
                 AT(r), bfs__dtype_name(st->dtype), s->st->name);
    if (!(want & got))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): stored as Quark %s, but %s of %s gives module \"%s\" %s",
                 AT(r), got == QK_MXFP4 ? "MXFP4 (U8)" : "FP8 (F8_E4M3)", why, c->qsource, mod,
                 (want & 3) == QK_NONE ? "no weight quantization" : (want & 3) == QK_MXFP4 ? "MXFP4" : "per-tensor FP8");
    if (got == QK_MXFP4) {
        const uint64_t out = st->ndim == 2 ? st->shape[0] : 0, in = st->ndim == 2 ? st->shape[1] * 2 : 0;
        if (st->ndim != 2 || in == 0 || in % 32 != 0)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): Quark MXFP4 weight shape %s, expected [out, in/2] with in %% 32 == 0",
                     AT(r), ws);
        if (s->st->dtype != BFS_DT_U8 || !bfs__raw_shape_is(s, 2, out, in / 32))
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): Quark MXFP4 scale %s %s, expected U8 (E8M0) [%llu, %llu] for weight \"%s\" %s",
                     AT(s), bfs__dtype_name(s->st->dtype), ss, (unsigned long long)out, (unsigned long long)(in / 32), st->name, ws);
        t->kind = BFS_K_CTMX;
        t->shape[0] = out;
        t->shape[1] = in;
        t->ctmx = (bfs_ctmx_desc){.w = r->data, .scale = s->data, .elem = BFS_CTMX_E2M1, .cols = (size_t)in};
        t->qname = "quark-mxfp4";
        t->transform = "quark mxfp4 e2m1 * 2^(s-127) -> bf16";
    } else {
        const uint64_t M = st->ndim == 2 ? st->shape[0] : 0, N = st->ndim == 2 ? st->shape[1] : 0;
        if (st->ndim != 2)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): Quark FP8 weight shape %s, expected [out, in]", AT(r), ws);
        if ((s->st->dtype != BFS_DT_BF16 && s->st->dtype != BFS_DT_F32) || s->st->ndim != 0)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): Quark per-tensor FP8 scale %s %s, expected one BF16 or F32 value [] for weight \"%s\"",
                     AT(s), bfs__dtype_name(s->st->dtype), ss, st->name);
        t->kind = BFS_K_FP8;
        t->shape[0] = M;
        t->shape[1] = N;
        t->fp8 = (bfs_fp8_desc){.w = r->data, .scale = s->data,
                                .scale_type = s->st->dtype == BFS_DT_BF16 ? BFS_SCALE_BF16 : BFS_SCALE_F32,
                                .cols = (size_t)N, .bh = (size_t)(M ? M : 1), .bw = (size_t)(N ? N : 1)};
        t->qname = "quark-fp8";
        t->transform = s->st->dtype == BFS_DT_BF16 ? "quark fp8 e4m3 * scale [BF16 per tensor] -> bf16"
                                                   : "quark fp8 e4m3 * scale [F32 per tensor] -> bf16";
    }
    r->used = s->used = 1;
    t->name = bfs__strdup(st->name);
    if (!t->name)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    t->out_dtype = BFS_DT_BF16;
    t->src[0] = r;
    t->src[1] = s;
    t->nsrc = 2;
    t->ndim = 2;
    bfs__finish_shape(t);
    rc = 1;
cleanup:
    free(mod);
    return rc;
}

static const char *const bfs__quark_dropped[] = {
    ".input_scale", ".input_zero_point", ".output_scale", ".output_zero_point", ".k_scale", ".v_scale",
};

static int bfs__quark_leftover(const bfs_fctx *c, bfs_raw *r, bfs_ltensor *t)
{
    (void)t;
    const char *nm = r->st->name;
    if (!bfs__quark(c))
        return 0;
    if (bfs__str_ends(nm, ".weight_scale") || bfs__str_ends(nm, ".weight_zero_point"))
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): a weight scale or zero point that no quantized weight uses (its weight is missing), under %s quant_method \"quark\"",
                        AT(r), c->qsource);
    for (size_t k = 0; k < sizeof bfs__quark_dropped / sizeof *bfs__quark_dropped; k++)
        if (bfs__str_ends(nm, bfs__quark_dropped[k])) {
            r->used = 1;
            return 2;
        }
    return 0;
}

static const char *const bfs__quark_methods[] = {"quark", NULL};

/* Plans BFS_K_CTMX and BFS_K_FP8 tensors but declares no kind: ctmx.c and fp8.c name them
 * (t->qname) and list their sources; the planner records this row as their claimer (t->by). */
const bfs_format bfs__format_quark = {
    .name = "quark",
    .kinds = 0,
    .borrows = BFS_KIND_BIT(BFS_K_FP8) | BFS_KIND_BIT(BFS_K_CTMX),
    .methods = bfs__quark_methods,
    .supports = "AMD Quark MXFP4 and per-tensor FP8 weights (quant_method quark)",
    .layout = "P.weight U8 (E2M1 pairs) + P.weight_scale U8 (E8M0), or P.weight F8_E4M3 + P.weight_scale BF16/F32 []",
    .claim_optional = false,
    .detect = bfs__quark_detect,
    .claim = bfs__quark_claim,
    .leftover = bfs__quark_leftover,
    .sources = NULL,
    .kind_name = NULL,
};
