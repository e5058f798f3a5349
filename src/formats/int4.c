/*
 * INT4 pack-quantized, compressed-tensors W4A16 / W4A16_ASYM (docs/FORMATS.md 6.3), BFS_K_INT4:
 *   P.weight_packed I32 [out, ceil(in/8)] + P.weight_scale F32/BF16 [out, in/G] (group) or
 *   [out, 1] (channel) + P.weight_shape I64 [2] = [out, in]
 *   [+ P.weight_zero_point I32 [ceil(out/8), in/G], asymmetric, packed on dim 0]
 * -> P.weight in BF16, bf16(f32(f32(q - zp) * scale)). The config group (quant_method
 * "compressed-tensors", format "pack-quantized", weights {type int, num_bits 4}) decides
 * the group size and the symmetry; the tensors must agree. Act-order (P.weight_g_idx) is
 * refused. Kernels: kernels/ (bfs_int4_desc, ref_formats.h).
 */
#include "format.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define AT(r) bfs__raw_path(c->in, (r)), (r)->st->name, (unsigned long long)(r)->file_offset

/* The config group describing this weight: its group size (in for channel) and symmetry. */
static int bfs__int4_group(const bfs_fctx *c, const bfs_raw *p, const bfs_raw *s, const bfs_raw *zp,
                           uint64_t out, uint64_t in, uint64_t *G)
{
    int found = 0;
    const char *fmt;
    const json_t *wt;
    char ss[160];
    bfs__shape_str(s->st->shape, s->st->ndim, ss, sizeof ss);
    size_t kg; /* the module's config group, as compressed-tensors matches it (ctmatch.c) */
    const int grc = bfs__ct_group_of(c, p, &kg);
    if (grc < 0)
        return grc;
    for (size_t k = kg; k == kg && (wt = bfs__ct_group_weights(c, k, &fmt)) != NULL; k++) {
        const char *type = bfs__qc_str(wt, "type"), *strat = bfs__qc_str(wt, "strategy");
        if (strcmp(fmt, "pack-quantized") != 0 || !type || strcmp(type, "int") != 0 ||
            bfs__qc_int(wt, "num_bits") != 4 || !strat)
            continue;
        const json_t *sym = json_object_get(wt, "symmetric");
        const bool symmetric = !json_is_false(sym);
        uint64_t g;
        if (strcmp(strat, "group") == 0) {
            const int64_t gs = bfs__qc_int(wt, "group_size");
            if (gs < 1)
                return bfs__err(BFS_EINPUT, "config.json: quantization_config config group %zu: strategy \"group\" without a positive group_size", k);
            g = (uint64_t)gs;
        } else if (strcmp(strat, "channel") == 0) {
            g = in;
        } else {
            continue;
        }
        if (!(g > 0 && in % g == 0 && bfs__raw_shape_is(s, 2, out, in / g)))
            continue;
        if (symmetric != (zp == NULL))
            return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): config.json quantization_config says symmetric: %s, but the weight %s a weight_zero_point",
                            AT(p), symmetric ? "true" : "false", zp ? "has" : "has no");
        if (found && g != *G)
            return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): scale shape %s fits two pack-quantized config groups with different group sizes",
                            AT(s), ss);
        *G = g;
        found = 1;
    }
    if (!found)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): INT4 scale shape %s for weight [%llu, %llu] does not fit the config group of its module (config group %zu of config.json quantization_config, format \"%s\"; a pack-quantized 4-bit int group of size G wants [out, in/G], in %% G == 0; channel: [out, 1])",
                        AT(s), ss, (unsigned long long)out, (unsigned long long)in, kg, bfs__ct_group_weights(c, kg, &fmt) ? fmt : "?");
    return 0;
}

static int bfs__int4_claim(const bfs_fctx *c, bfs_raw *p, bfs_ltensor *t)
{
    const bfs_st_tensor *st = p->st;
    int rc = 0;
    char *base = NULL;
    if (st->dtype != BFS_DT_I32 || !bfs__str_ends(st->name, ".weight_packed"))
        return 0;
    const char *m = bfs__qc_method(c);
    base = bfs__str_ndup(st->name, strlen(st->name) - strlen("_packed")); /* "P.weight" */
    if (!base)
        return bfs__err(BFS_ENOMEM, "out of memory");
    if (!bfs__qc_is(c, "compressed-tensors"))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): compressed-tensors packed weight, but config.json quantization_config.quant_method is \"%s\" (expected \"compressed-tensors\")",
                 AT(p), m ? m : "(none)");
    bfs_raw *s = bfs__sibling(c->in, base, "_scale", &rc), *shp, *zp, *gidx;
    if (rc < 0)
        goto cleanup;
    shp = bfs__sibling(c->in, base, "_shape", &rc);
    if (rc < 0)
        goto cleanup;
    zp = bfs__sibling(c->in, base, "_zero_point", &rc);
    if (rc < 0)
        goto cleanup;
    gidx = bfs__sibling(c->in, base, "_g_idx", &rc);
    if (rc < 0)
        goto cleanup;
    if (!s)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): packed INT4 weight without its scale \"%s_scale\"", AT(p), base);
    if (!shp)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): packed INT4 weight without its \"%s_shape\"", AT(p), base);
    if (gidx)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): act-order INT4 (weight_g_idx) is not supported", AT(gidx));
    if (st->ndim == 3) /* docs/FORMATS.md 7.8 */
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): 3-D packed INT4 weight (fused experts [E, out, in]) is not supported: no upstream writes one (compressed-tensors packs nn.Linear / nn.Embedding weights only)",
                 AT(p));
    if (shp->st->dtype != BFS_DT_I64 || !bfs__raw_shape_is(shp, 1, 2, 0))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): weight_shape must be I64 [2], not %s with %d dims", AT(shp),
                 bfs__dtype_name(shp->st->dtype), shp->st->ndim);
    int64_t dims[2];
    memcpy(dims, shp->data, sizeof dims);
    if (dims[0] < 0 || dims[1] < 1 || dims[1] > (int64_t)1 << 40 || dims[0] > (int64_t)1 << 40)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): weight_shape [%lld, %lld] out of range", AT(shp),
                 (long long)dims[0], (long long)dims[1]);
    const uint64_t out = (uint64_t)dims[0], in = (uint64_t)dims[1], wpr = (in + 7) / 8;
    char ps[160];
    bfs__shape_str(st->shape, st->ndim, ps, sizeof ps);
    if (!bfs__raw_shape_is(p, 2, out, wpr))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): packed shape %s, expected [%llu, %llu] for weight_shape [%llu, %llu] (\"%s\")",
                 AT(p), ps, (unsigned long long)out, (unsigned long long)wpr, (unsigned long long)out,
                 (unsigned long long)in, shp->st->name);
    if (s->st->dtype != BFS_DT_F32 && s->st->dtype != BFS_DT_BF16)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): INT4 scale dtype %s, expected F32 or BF16 (weight \"%s\")", AT(s),
                 bfs__dtype_name(s->st->dtype), st->name);
    uint64_t G = 0;
    BFS_TRY(bfs__int4_group(c, p, s, zp, out, in, &G));
    const uint64_t ng = in / G;
    if (zp && (zp->st->dtype != BFS_DT_I32 || !bfs__raw_shape_is(zp, 2, (out + 7) / 8, ng))) {
        char zs[160];
        bfs__shape_str(zp->st->shape, zp->st->ndim, zs, sizeof zs);
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): zero point %s %s, expected I32 [%llu, %llu] (packed on dim 0) for weight \"%s\"",
                 AT(zp), bfs__dtype_name(zp->st->dtype), zs, (unsigned long long)((out + 7) / 8),
                 (unsigned long long)ng, st->name);
    }
    p->used = s->used = shp->used = 1;
    t->src[0] = p;
    t->src[1] = s;
    t->src[2] = shp;
    t->nsrc = 3;
    if (zp) {
        zp->used = 1;
        t->src[t->nsrc++] = zp;
    }
    t->name = base;
    base = NULL;
    t->kind = BFS_K_INT4;
    t->out_dtype = BFS_DT_BF16;
    t->ndim = 2;
    t->shape[0] = out;
    t->shape[1] = in;
    t->int4 = (bfs_int4_desc){.packed = p->data, .scale = s->data, .zp = zp ? zp->data : NULL,
                              .scale_bf16 = s->st->dtype == BFS_DT_BF16, .cols = (size_t)in, .wpr = (size_t)wpr,
                              .ngroups = (size_t)ng, .group_size = (size_t)G};
    t->qname = zp ? "ct-int4-asym" : "ct-int4";
    t->transform = zp ? "int4 (q - zp) * scale -> bf16" : "int4 q * scale -> bf16";
    bfs__finish_shape(t);
    rc = 1;
cleanup:
    free(base);
    return rc;
}

static int bfs__int4_sources(const bfs_unit *u, bfs_srange out[BFS_UNIT_MAX_SRC])
{
    const bfs_ltensor *t = u->t;
    const bfs_int4_desc *d = &t->int4;
    const uint64_t ss = d->scale_bf16 ? 2 : 4, n = u->row1 - u->row0;
    int k = 0;
    out[k++] = (bfs_srange){t->src[0], u->row0 * d->wpr * 4, n * d->wpr * 4};
    out[k++] = (bfs_srange){t->src[1], u->row0 * d->ngroups * ss, n * d->ngroups * ss};
    if (d->zp) {
        const uint64_t z0 = u->row0 / 8, z1 = n ? (u->row1 + 7) / 8 : z0;
        out[k++] = (bfs_srange){t->src[3], z0 * d->ngroups * 4, (z1 - z0) * d->ngroups * 4};
    }
    return k;
}

static const char *bfs__int4_kind_name(const bfs_ltensor *t) { return t->qname; }

static const char *const bfs__int4_methods[] = {"compressed-tensors", NULL};

const bfs_format bfs__format_int4 = {
    .name = "int4",
    .kinds = BFS_KIND_BIT(BFS_K_INT4),
    .methods = bfs__int4_methods,
    .supports = "INT4 pack-quantized (compressed-tensors W4A16)",
    .layout = "P.weight_packed I32 + P.weight_scale + P.weight_shape",
    .claim_optional = false,
    .detect = NULL,
    .claim = bfs__int4_claim,
    .leftover = NULL,
    .sources = bfs__int4_sources,
    .kind_name = bfs__int4_kind_name,
};
