/*
 * FP8 E4M3 weights with a scale grid (docs/FORMATS.md 6.1, 6.2, 7.1), one kind, BFS_K_FP8:
 *   DeepSeek-V3 block (quant_method "fp8"): P.weight F8_E4M3 [M, N] +
 *     P.weight_scale_inv F32 [ceil(M/bh), ceil(N/bw)], (bh, bw) = weight_block_size;
 *   per-tensor, as transformers loads it (quant_method "fp8", weight_block_size null or
 *     absent): P.weight + one F32 or BF16 P.weight_scale_inv ([], [1] or [1, 1]); the
 *     static P.activation_scale is dropped (qextra.c);
 *   compressed-tensors float-quantized (quant_method "compressed-tensors", a config group
 *     with weights {type float, num_bits 8}): P.weight + P.weight_scale F32/BF16, strategy
 *     tensor [1], channel [M, 1] or block [ceil(M/bh), ceil(N/bw)] (block_structure);
 *   ModelOpt FP8 (quant_method "modelopt", quant_algo "FP8"): P.weight + scalar F32 P.weight_scale;
 *   transformers' fused experts (FP8Experts, quant_method "fp8"): X F8_E4M3 [E, out, in] +
 *     X_scale_inv F32 [E, out/bh, in/bw], bh | out, bw | in (a weight_block_size), or
 *     [E, 1, 1] / gate_up_proj's [E, 2, 1] (weight_block_size null: per expert, per half).
 * -> P.weight in BF16, bf16(f32(f32(w) * scale)). The config decides the block size, never
 * the shapes; the scale's name, dtype and shape must agree with it. The scale may sit in
 * another file of the index. Kernels: kernels/ (bfs_fp8_desc, ref_formats.h).
 */
#include "format.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define AT(r) bfs__raw_path(c->in, (r)), (r)->st->name, (unsigned long long)(r)->file_offset

/* DeepSeek's weight_block_size: [bh, bw], both > 0; absent or null: per-tensor scales,
 * *bh = *bw = 0 (transformers' FineGrainedFP8Config(weight_block_size=None); its
 * Fp8Dequantize takes a scalar scale as one block whatever the config says). */
static int bfs__fp8_block_size(const bfs_fctx *c, uint64_t *bh, uint64_t *bw)
{
    const json_t *b = json_object_get(c->qconfig, "weight_block_size");
    *bh = *bw = 0;
    if (!b || json_is_null(b))
        return 0;
    if (!json_is_array(b) || json_array_size(b) != 2 || !json_is_integer(json_array_get(b, 0)) ||
        !json_is_integer(json_array_get(b, 1)) || json_integer_value(json_array_get(b, 0)) < 1 ||
        json_integer_value(json_array_get(b, 1)) < 1)
        return bfs__err(BFS_EINPUT, "%s: quant_method \"fp8\" with a weight_block_size that is not [rows, cols] (positive integers) or null is not supported",
                        c->qsource ? c->qsource : "config.json");
    *bh = (uint64_t)json_integer_value(json_array_get(b, 0));
    *bw = (uint64_t)json_integer_value(json_array_get(b, 1));
    return 0;
}

static int bfs__fp8_detect(const bfs_fctx *c)
{
    uint64_t bh, bw;
    if (!bfs__qc_is(c, "fp8"))
        return 0;
    const char *fmt = bfs__qc_str(c->qconfig, "fmt");
    if (fmt && strcmp(fmt, "e4m3") != 0)
        return bfs__err(BFS_EINPUT, "config.json: quantization_config.fmt \"%s\" is not supported (FP8 \"e4m3\" is)", fmt);
    /* scale_fmt and expert_dtype: dsv4.c's detect (DeepSeek-V4's keys) */
    return bfs__fp8_block_size(c, &bh, &bw);
}

/* min(b, n) (n at least 1): a block at least as tall as the tensor is the whole tensor. */
static uint64_t bfs__clamp_block(uint64_t b, uint64_t n) { return b < (n ? n : 1) ? b : (n ? n : 1); }

/* compressed-tensors / ModelOpt P.weight_scale: the (bh, bw) of the config group that
 * describes a scale of this shape; an error naming both when none or two different do. */
static int bfs__fp8_ct_block(const bfs_fctx *c, const bfs_raw *w, const bfs_raw *s, uint64_t *bh, uint64_t *bw)
{
    const uint64_t M = w->st->shape[0], N = w->st->shape[1], n = bfs__raw_nelem(s);
    const char *m = bfs__qc_method(c);
    char ss[160];
    bfs__shape_str(s->st->shape, s->st->ndim, ss, sizeof ss);
    if (bfs__qc_is(c, "modelopt")) {
        const char *algo = bfs__qc_str(c->qconfig, "quant_algo");
        if (!algo || strcmp(algo, "FP8") != 0)
            return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): FP8 weight, but config.json quantization_config.quant_algo is \"%s\" (expected \"FP8\")",
                            AT(w), algo ? algo : "(none)");
        if (n != 1 || s->st->ndim > 1)
            return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): ModelOpt FP8 weight_scale shape %s, expected a scalar (config.json quant_algo \"FP8\")",
                            AT(s), ss);
        *bh = bfs__clamp_block(M, M);
        *bw = bfs__clamp_block(N, N);
        return 0;
    }
    if (!bfs__qc_is(c, "compressed-tensors"))
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): FP8 weight with \"%s\", but config.json quantization_config.quant_method is \"%s\" (expected \"compressed-tensors\" or \"modelopt\")",
                        AT(w), s->st->name, m ? m : "(none)");
    int found = 0;
    const char *fmt;
    const json_t *wt;
    size_t kg; /* the module's config group, as compressed-tensors matches it (ctmatch.c) */
    const int grc = bfs__ct_group_of(c, w, &kg);
    if (grc < 0)
        return grc;
    for (size_t k = kg; k == kg && (wt = bfs__ct_group_weights(c, k, &fmt)) != NULL; k++) {
        const char *type = bfs__qc_str(wt, "type"), *strat = bfs__qc_str(wt, "strategy");
        if (strcmp(fmt, "float-quantized") != 0 || !type || strcmp(type, "float") != 0 ||
            bfs__qc_int(wt, "num_bits") != 8 || !strat)
            continue;
        uint64_t gh, gw;
        bool fits;
        if (strcmp(strat, "tensor") == 0) {
            gh = M;
            gw = N;
            fits = n == 1 && s->st->ndim <= 2;
        } else if (strcmp(strat, "channel") == 0) {
            gh = 1;
            gw = N;
            fits = bfs__raw_shape_is(s, 2, M, 1) || bfs__raw_shape_is(s, 1, M, 0);
        } else if (strcmp(strat, "block") == 0) {
            const json_t *b = json_object_get(wt, "block_structure");
            if (!json_is_array(b) || json_array_size(b) != 2 || json_integer_value(json_array_get(b, 0)) < 1 ||
                json_integer_value(json_array_get(b, 1)) < 1)
                return bfs__err(BFS_EINPUT, "config.json: quantization_config config group %zu: strategy \"block\" without a block_structure [rows, cols]", k);
            gh = (uint64_t)json_integer_value(json_array_get(b, 0));
            gw = (uint64_t)json_integer_value(json_array_get(b, 1));
            fits = bfs__raw_shape_is(s, 2, (M + gh - 1) / gh, (N + gw - 1) / gw);
        } else {
            continue;
        }
        if (!fits)
            continue;
        gh = bfs__clamp_block(gh, M);
        gw = bfs__clamp_block(gw, N);
        if (found && (gh != *bh || gw != *bw))
            return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): scale shape %s fits two config groups of config.json quantization_config with different blocks",
                            AT(s), ss);
        *bh = gh;
        *bw = gw;
        found = 1;
    }
    if (!found)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): FP8 scale shape %s does not fit the config group of its module (config group %zu of config.json quantization_config, format \"%s\"; a float-quantized 8-bit group wants [%llu, 1] for channel, [1] for tensor, the block grid for block)",
                        AT(s), ss, kg, bfs__ct_group_weights(c, kg, &fmt) ? fmt : "?", (unsigned long long)M);
    return 0;
}

/* Per-tensor FP8 (weight_block_size null or absent): weight_scale_inv is one F32 or BF16
 * value, 0-d, [1] or [1, 1] (transformers' Fp8Quantize writes [1, 1], its FP8Linear
 * parameter is 0-d; Fp8Dequantize reads any of them as one block). */
static int bfs__fp8_tensor_scale(const bfs_fctx *c, const bfs_raw *w, const bfs_raw *s)
{
    char ss[160];
    bfs__shape_str(s->st->shape, s->st->ndim, ss, sizeof ss);
    if (s->st->dtype != BFS_DT_F32 && s->st->dtype != BFS_DT_BF16)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): per-tensor FP8 scale dtype %s, expected F32 or BF16 (weight \"%s\", config.json weight_block_size null)",
                        AT(s), bfs__dtype_name(s->st->dtype), w->st->name);
    if (bfs__raw_nelem(s) != 1 || s->st->ndim > 2)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): scale shape %s, expected one value ([] or [1, 1]) for weight \"%s\": config.json quantization_config has no weight_block_size (per-tensor FP8)",
                        AT(s), ss, w->st->name);
    return 0;
}

/* quant_method "fp8" with DeepSeek-V4's keys (scale_fmt "ue8m0", expert_dtype "fp4", in
 * quantization_config or at the top of config.json): which, for a message; NULL otherwise. */
static const char *bfs__fp8_v4_key(const bfs_fctx *c)
{
    if (!bfs__qc_is(c, "fp8"))
        return NULL;
    const char *sf = bfs__qc_str(c->qconfig, "scale_fmt"), *ed = bfs__qc_str(c->qconfig, "expert_dtype");
    if (!ed && c->config)
        ed = bfs__qc_str(c->config, "expert_dtype");
    return sf && strcmp(sf, "ue8m0") == 0 ? "scale_fmt \"ue8m0\"" : ed && strcmp(ed, "fp4") == 0 ? "expert_dtype \"fp4\"" : NULL;
}

/* transformers' fused experts (FP8Experts, docs/FORMATS.md 7.8): X F8_E4M3 [E, out, in] +
 * X_scale_inv F32 [E, out/bh, in/bw] under quant_method "fp8" with a weight_block_size, or
 * [E, 1, 1] (gate_up_proj: or [E, 2, 1]) with weight_block_size null, X
 * named as FP8Experts names it (P.gate_up_proj, P.up_proj, P.down_proj) or P.weight.
 * Fp8Dequantize._dequantize_one derives the block from the grid (shape / grid, which must
 * divide): only when bh | out and bw | in is that the config's block, so nothing else is
 * read. Expert e's blocks are then the 2-D kernel's blocks of rows [e out, (e + 1) out) of
 * the [E out, in] view, grid rows [e out/bh, (e + 1) out/bh): one FP8 descriptor with
 * cols = in serves the tensor, a logical row (an expert) being `out` kernel rows. */
/* t: FP8 weight w (shape[0..ndim), the last its columns) times scale s in blocks of bh x bw
 * kernel rows (a 3-D weight's experts are its [E*out, in] rows), claimed: 1, or BFS_ENOMEM */
static int bfs__fp8_fill(bfs_raw *w, bfs_raw *s, bfs_ltensor *t, const uint64_t *shape, int ndim, uint64_t bh,
                         uint64_t bw)
{
    t->name = bfs__strdup(w->st->name);
    if (!t->name)
        return bfs__err(BFS_ENOMEM, "out of memory");
    w->used = s->used = 1;
    t->kind = BFS_K_FP8;
    t->out_dtype = BFS_DT_BF16;
    t->src[0] = w;
    t->src[1] = s;
    t->nsrc = 2;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        t->shape[d] = shape[d];
    t->fp8 = (bfs_fp8_desc){.w = w->data, .scale = s->data,
                            .scale_type = s->st->dtype == BFS_DT_BF16 ? BFS_SCALE_BF16 : BFS_SCALE_F32,
                            .cols = (size_t)shape[ndim - 1], .bh = (size_t)bh, .bw = (size_t)bw};
    t->transform = "fp8 * scale -> bf16";
    bfs__finish_shape(t);
    return 1;
}

static int bfs__fp8_fused(const bfs_fctx *c, bfs_raw *w, bfs_raw *s, bfs_ltensor *t)
{
    const bfs_st_tensor *st = w->st;
    char ws[160], ss[160];
    uint64_t bh = 0, bw = 0;
    bfs__shape_str(st->shape, st->ndim, ws, sizeof ws);
    bfs__shape_str(s->st->shape, s->st->ndim, ss, sizeof ss);
    const char *m = bfs__qc_method(c), *v4 = bfs__fp8_v4_key(c);
    if (!bfs__qc_is(c, "fp8"))
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): FP8 weight shape %s with \"%s\": a 3-D [E, out, in] FP8 weight is read only as transformers' fused experts under quant_method \"fp8\", not \"%s\"",
                        AT(w), ws, s->st->name, m ? m : "(none)");
    if (v4)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): quant_method \"fp8\" with %s is DeepSeek-V4's layout (P.weight + P.scale); a V3-style scale \"%s\" under it is not supported",
                        AT(s), v4, s->st->name);
    const int brc = bfs__fp8_block_size(c, &bh, &bw);
    if (brc < 0)
        return brc;
    const uint64_t E = st->shape[0], M = st->shape[1], N = st->shape[2];
    if (s->st->dtype != BFS_DT_F32)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): FP8 block scale dtype %s, expected F32 (fused experts \"%s\")",
                        AT(s), bfs__dtype_name(s->st->dtype), st->name);
    if (bh == 0) { /* per-expert scalars: [E, 1, 1] (Fp8Quantize), [E, 2, 1] (FP8Experts' gate_up: a half each) */
        const uint64_t halves = bfs__str_ends(st->name, "gate_up_proj") && M % 2 == 0 ? 2 : 1;
        if (M == 0 || N == 0 || s->st->ndim != 3 || s->st->shape[0] != E || s->st->shape[2] != 1 ||
            (s->st->shape[1] != 1 && s->st->shape[1] != halves))
            return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): scale shape %s, expected [%llu, 1, 1]%s for fused FP8 experts \"%s\" %s with config.json weight_block_size null (one scale per expert%s)",
                            AT(s), ss, (unsigned long long)E, halves == 2 ? " or [E, 2, 1]" : "", st->name, ws,
                            halves == 2 ? ", or per half of gate_up_proj" : "");
        t->qname = "fp8-experts";
        return bfs__fp8_fill(w, s, t, (const uint64_t[]){E, M, N}, 3, M / s->st->shape[1], N);
    }
    if (M == 0 || N == 0 || M % bh != 0 || N % bw != 0)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): fused FP8 experts %s: out %llu and in %llu must be positive multiples of config.json weight_block_size [%llu, %llu] (transformers' Fp8Dequantize takes the block as shape / scale grid, which is the config's block only then)",
                        AT(w), ws, (unsigned long long)M, (unsigned long long)N, (unsigned long long)bh, (unsigned long long)bw);
    if (s->st->ndim != 3 || s->st->shape[0] != E || s->st->shape[1] != M / bh || s->st->shape[2] != N / bw)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): scale shape %s, expected [%llu, %llu, %llu] ([E, out/bh, in/bw]) for fused FP8 experts \"%s\" %s with config.json weight_block_size [%llu, %llu]",
                        AT(s), ss, (unsigned long long)E, (unsigned long long)(M / bh), (unsigned long long)(N / bw),
                        st->name, ws, (unsigned long long)bh, (unsigned long long)bw);
    t->qname = "fp8-experts";
    return bfs__fp8_fill(w, s, t, (const uint64_t[]){E, M, N}, 3, bh, bw);
}

static int bfs__fp8_claim(const bfs_fctx *c, bfs_raw *w, bfs_ltensor *t)
{
    const bfs_st_tensor *st = w->st;
    int rc = 0;
    if (st->dtype != BFS_DT_F8_E4M3)
        return 0;
    if (!bfs__str_ends(st->name, ".weight")) { /* FP8Experts' P.gate_up_proj, P.down_proj, ... */
        if (st->ndim != 3 || !bfs__qc_is(c, "fp8"))
            return 0;
        bfs_raw *x = bfs__sibling(c->in, st->name, "_scale_inv", &rc);
        return rc < 0 || !x ? rc : bfs__fp8_fused(c, w, x, t);
    }
    bfs_raw *sinv = bfs__sibling_of(c->in, w, "_scale_inv", &rc);
    if (rc < 0)
        return rc;
    bfs_raw *sc = bfs__sibling_of(c->in, w, "_scale", &rc);
    if (rc < 0)
        return rc;
    const char *m = bfs__qc_method(c);
    if (!sinv && !sc) {
        char *base = bfs__str_ndup(st->name, strlen(st->name) - strlen(".weight"));
        if (!base)
            return bfs__err(BFS_ENOMEM, "out of memory");
        const bfs_raw *v4 = bfs__sibling(c->in, base, ".scale", &rc);
        free(base);
        if (rc < 0 || v4)
            return rc; /* DeepSeek-V4's P.scale: dsv4.c's */
        if (!bfs__qc_is_scaled(c))
            return 0; /* not an FP8-scaled checkpoint: an FP8 tensor is copied as it is */
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): FP8 weight without its scale (\"%s_scale_inv\" or \"%s_scale\"; config.json quantization_config.quant_method \"%s\")",
                        AT(w), st->name, st->name, m);
    }
    if (!m)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): FP8 weight with a scale \"%s\", but config.json has no quantization_config to say how to apply it",
                        AT(w), sinv ? sinv->st->name : sc->st->name);
    if (sinv && sc)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): FP8 weight with both \"%s\" and \"%s\"", AT(w),
                        sinv->st->name, sc->st->name);
    char ws[160], ss[160]; /* the shapes as text, made only for a message (WS, SS) */
#define WS (bfs__shape_str(st->shape, st->ndim, ws, sizeof ws), ws)
#define SS (bfs__shape_str(s->st->shape, s->st->ndim, ss, sizeof ss), ss)
    if (st->ndim == 3)
        return bfs__fp8_fused(c, w, sinv ? sinv : sc, t);
    if (st->ndim != 2)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): FP8 weight shape %s, expected [out, in] (or transformers' fused experts [E, out, in])", AT(w), WS);
    const uint64_t M = st->shape[0], N = st->shape[1];
    uint64_t bh = 0, bw = 0;
    bfs_raw *s = sinv ? sinv : sc;
    const char *v4 = bfs__fp8_v4_key(c);
    if (v4)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): quant_method \"fp8\" with %s is DeepSeek-V4's layout (P.weight + P.scale); a V3-style scale \"%s\" under it is not supported",
                        AT(s), v4, s->st->name);
    if (sinv) {
        if (!bfs__qc_is(c, "fp8"))
            return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): DeepSeek-style FP8 scale, but config.json quantization_config.quant_method is \"%s\" (expected \"fp8\")",
                            AT(sinv), m);
        BFS_TRY(bfs__fp8_block_size(c, &bh, &bw));
        if (bh == 0) {
            BFS_TRY(bfs__fp8_tensor_scale(c, w, s));
            bh = bfs__clamp_block(M, M);
            bw = bfs__clamp_block(N, N);
            t->qname = "fp8-tensor";
        } else {
            if (s->st->dtype != BFS_DT_F32)
                return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): FP8 block scale dtype %s, expected F32 (weight \"%s\")",
                                AT(s), bfs__dtype_name(s->st->dtype), st->name);
            if (!bfs__raw_shape_is(s, 2, (M + bh - 1) / bh, (N + bw - 1) / bw))
                return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): scale shape %s, expected [%llu, %llu] for weight \"%s\" %s with config.json weight_block_size [%llu, %llu]",
                                AT(s), SS, (unsigned long long)((M + bh - 1) / bh), (unsigned long long)((N + bw - 1) / bw),
                                st->name, WS, (unsigned long long)bh, (unsigned long long)bw);
            t->qname = "fp8-block";
        }
    } else {
        if (bfs__qc_is(c, "fp8"))
            return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): config.json quantization_config.quant_method \"fp8\" names the scale \"%s_scale_inv\", not \"%s\"",
                            AT(w), st->name, sc->st->name);
        if (s->st->dtype != BFS_DT_F32 && s->st->dtype != BFS_DT_BF16)
            return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): FP8 scale dtype %s, expected F32 or BF16 (weight \"%s\")",
                            AT(s), bfs__dtype_name(s->st->dtype), st->name);
        BFS_TRY(bfs__fp8_ct_block(c, w, s, &bh, &bw));
        bh = bfs__clamp_block(bh, M);
        bw = bfs__clamp_block(bw, N);
        t->qname = bfs__qc_is(c, "modelopt") ? "modelopt-fp8"
                 : bh >= M && bw >= N && bfs__raw_nelem(s) == 1 ? "ct-fp8-tensor"
                 : bh == 1 && bw >= N ? "ct-fp8-channel" : "ct-fp8-block";
    }
    rc = bfs__fp8_fill(w, s, t, (const uint64_t[]){M, N}, 2, bh, bw);
cleanup:
    return rc;
#undef WS
#undef SS
}

static int bfs__fp8_sources(const bfs_unit *u, bfs_srange out[BFS_UNIT_MAX_SRC])
{
    const bfs_ltensor *t = u->t;
    const bfs_fp8_desc *d = &t->fp8;
    const uint64_t gcols = (d->cols + d->bw - 1) / d->bw, ss = bfs_scale_size(d->scale_type);
    /* kernel rows per logical row: 1, or `out` for fused experts [E, out, in] */
    const uint64_t kr = d->cols ? t->row_elems / d->cols : 1, r0 = u->row0 * kr, r1 = u->row1 * kr;
    const uint64_t g0 = r0 / d->bh, g1 = r1 == r0 ? g0 : (r1 - 1) / d->bh + 1;
    out[0] = (bfs_srange){t->src[0], r0 * d->cols, (r1 - r0) * d->cols};
    out[1] = (bfs_srange){t->src[1], g0 * gcols * ss, (g1 - g0) * gcols * ss};
    return 2;
}

static const char *bfs__fp8_kind_name(const bfs_ltensor *t) { return t->qname; }

static const char *const bfs__fp8_methods[] = {"fp8", "compressed-tensors", "modelopt", NULL};

const bfs_format bfs__format_fp8 = {
    .name = "fp8",
    .kinds = BFS_KIND_BIT(BFS_K_FP8),
    .methods = bfs__fp8_methods,
    .supports = "FP8 E4M3 with block, tensor or channel scales (DeepSeek fp8, transformers per-tensor fp8, compressed-tensors float-quantized, ModelOpt FP8)",
    .layout = "P.weight F8_E4M3 + P.weight_scale_inv or P.weight_scale",
    .claim_optional = false,
    .detect = bfs__fp8_detect,
    .claim = bfs__fp8_claim,
    .leftover = NULL, /* a stray weight_scale_inv: refuse.c */
    .sources = bfs__fp8_sources,
    .kind_name = bfs__fp8_kind_name,
};
