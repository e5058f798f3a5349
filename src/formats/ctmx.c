/*
 * compressed-tensors MX (docs/FORMATS.md 7.2, 7.3), one kind, BFS_K_CTMX, two element types:
 *   mxfp8-quantized (a config group {type float, num_bits 8, group_size 32}): P.weight
 *     F8_E4M3 [out, in] + P.weight_scale U8 [out, in/32], E8M0 exponents;
 *   mxfp4-pack-quantized ({type float, num_bits 4, group_size 32}): P.weight_packed U8
 *     [out, in/2] (E2M1 pairs, low nibble = even element) + P.weight_scale U8 [out, in/32],
 *     and no weight_global_scale (that is NVFP4, nvfp4.c).
 * -> P.weight in BF16, bf16(f32(v * 2^(s-127))), scale byte 255 = +inf (compressed-tensors'
 * decompress_mx_scale). The U8 scales are E8M0 exponents, never integers. The config group
 * decides the format; the tensors must agree (dtype, shape, in % 32 == 0). mxfp6-pack-quantized,
 * asymmetric MX (weight_zero_point) and other group sizes are refused. This row comes before
 * fp8.c and nvfp4.c in the table: it takes F8_E4M3 weights with a U8 scale and U8 packed
 * weights without a global scale, and leaves the rest to them. Kernels: kernels/
 * (bfs_ctmx_desc, ref_formats.h bfs_ctmx_elem).
 */
#include "format.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AT(r) bfs__raw_path(c->in, (r)), (r)->st->name, (unsigned long long)(r)->file_offset

/* The config group of r's module (as compressed-tensors matches it, ctmatch.c) must be
 * fp4 = 1 "mxfp4-pack-quantized" with weights {float, 4 bits, group 32} or fp4 = 0
 * "mxfp8-quantized" with {float, 8 bits, group 32}, symmetric, U8 scales: 0, or < 0 with
 * a message naming the group and what differs. */
static int bfs__ctmx_group(const bfs_fctx *c, const bfs_raw *r, int fp4)
{
    const char *want = fp4 ? "mxfp4-pack-quantized" : "mxfp8-quantized", *fmt = "";
    size_t k;
    const int grc = bfs__ct_group_of(c, r, &k);
    if (grc < 0)
        return grc;
    const json_t *wt = bfs__ct_group_weights(c, k, &fmt);
    if (!wt || strcmp(fmt, want) != 0)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): %s weight with a U8 (E8M0) scale, but the config group of its module (config group %zu of %s quantization_config) is format \"%s\", not %s {type float, num_bits %d, group_size 32}",
                        AT(r), fp4 ? "MXFP4" : "MXFP8", k, c->qsource, fmt, want, fp4 ? 4 : 8);
    const char *type = bfs__qc_str(wt, "type"), *strat = bfs__qc_str(wt, "strategy");
    const char *sd = bfs__qc_str(wt, "scale_dtype");
    if (!type || strcmp(type, "float") != 0 || bfs__qc_int(wt, "num_bits") != (fp4 ? 4 : 8) ||
        bfs__qc_int(wt, "group_size") != 32 || (strat && strcmp(strat, "group") != 0))
        return bfs__err(BFS_EINPUT, "config.json: quantization_config config group %zu: format \"%s\" with weights other than {type float, num_bits %d, strategy group, group_size 32} is not supported",
                        k, want, fp4 ? 4 : 8);
    if (json_is_false(json_object_get(wt, "symmetric")))
        return bfs__err(BFS_EINPUT, "config.json: quantization_config config group %zu: asymmetric %s (symmetric: false) is not supported", k, want);
    if (sd && strcmp(sd, "torch.uint8") != 0)
        return bfs__err(BFS_EINPUT, "config.json: quantization_config config group %zu: %s with scale_dtype \"%s\" is not supported (E8M0 exponents stored as \"torch.uint8\" are)",
                        k, want, sd);
    return 0;
}

/* r (a weight candidate) with its scale s: the checks both element types share. */
static int bfs__ctmx_check(const bfs_fctx *c, const bfs_raw *r, const bfs_raw *s, int fp4, uint64_t out, uint64_t in)
{
    char rs[160], ss[160];
    bfs__shape_str(r->st->shape, r->st->ndim, rs, sizeof rs);
    bfs__shape_str(s->st->shape, s->st->ndim, ss, sizeof ss);
    const int g = bfs__ctmx_group(c, r, fp4);
    if (g < 0)
        return g;
    if (r->st->ndim != 2 || in % 32 != 0)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): %s weight shape %s, expected [out, in%s] with in %% 32 == 0",
                        AT(r), fp4 ? "MXFP4 packed" : "MXFP8", rs, fp4 ? "/2" : "");
    if (!bfs__raw_shape_is(s, 2, out, in / 32))
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): %s scale shape %s, expected [%llu, %llu] (one E8M0 byte per 32 elements) for weight \"%s\" %s",
                        AT(s), fp4 ? "MXFP4" : "MXFP8", ss, (unsigned long long)out, (unsigned long long)(in / 32), r->st->name, rs);
    return 0;
}

static int bfs__ctmx_claim(const bfs_fctx *c, bfs_raw *r, bfs_ltensor *t)
{
    const bfs_st_tensor *st = r->st;
    const bool packed = bfs__str_ends(st->name, ".weight_packed");
    int rc = 0;
    char *base = NULL;
    if (!(st->dtype == BFS_DT_F8_E4M3 && bfs__str_ends(st->name, ".weight")) && !(st->dtype == BFS_DT_U8 && packed))
        return 0;
    base = packed ? bfs__str_ndup(st->name, strlen(st->name) - strlen("_packed")) : bfs__strdup(st->name);
    if (!base)
        return bfs__err(BFS_ENOMEM, "out of memory");
    bfs_raw *s = bfs__sibling(c->in, base, "_scale", &rc), *gs = NULL, *zp = NULL;
    if (rc < 0)
        goto cleanup;
    if (packed && (gs = bfs__sibling(c->in, base, "_global_scale", &rc)) == NULL && rc < 0)
        goto cleanup;
    if ((zp = bfs__sibling(c->in, base, "_zero_point", &rc)) == NULL && rc < 0)
        goto cleanup;
    /* not ours: no scale, a float scale (FP8: F32/BF16/F16; NVFP4: E4M3), a global scale
     * (NVFP4). Ours, to be checked: an integer scale (E8M0 exponents, U8; I8 is refused) */
    const bfs_dtype sdt = s ? s->st->dtype : BFS_DT_F32;
    if (!s || gs || (sdt != BFS_DT_U8 && sdt != BFS_DT_I8)) {
        rc = 0;
        goto cleanup;
    }
    const int fp4 = packed;
    if (sdt != BFS_DT_U8)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): %s scale dtype %s, expected U8 (E8M0 exponents) for weight \"%s\"",
                 AT(s), fp4 ? "MXFP4" : "MXFP8", bfs__dtype_name(sdt), st->name);
    if (!bfs__qc_is(c, "compressed-tensors"))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): %s weight with a U8 (E8M0) scale \"%s\", but config.json quantization_config.quant_method is \"%s\" (expected \"compressed-tensors\")",
                 AT(r), fp4 ? "MXFP4" : "MXFP8", s->st->name, c->method ? c->method : "(none)");
    if (zp)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): %s weight with a zero point \"%s\": asymmetric MX is not supported",
                 AT(r), fp4 ? "MXFP4" : "MXFP8", zp->st->name);
    const uint64_t out = st->ndim == 2 ? st->shape[0] : 0, in = st->ndim == 2 ? st->shape[1] * (fp4 ? 2 : 1) : 0;
    BFS_TRY(bfs__ctmx_check(c, r, s, fp4, out, in));
    r->used = s->used = 1;
    t->name = base;
    base = NULL;
    t->kind = BFS_K_CTMX;
    t->out_dtype = BFS_DT_BF16;
    t->src[0] = r;
    t->src[1] = s;
    t->nsrc = 2;
    t->ndim = 2;
    t->shape[0] = out;
    t->shape[1] = in;
    t->ctmx = (bfs_ctmx_desc){.w = r->data, .scale = s->data, .fp4 = fp4, .cols = (size_t)in};
    t->qname = fp4 ? "ct-mxfp4" : "ct-mxfp8";
    t->transform = fp4 ? "mxfp4 e2m1 * 2^(s-127) -> bf16" : "mxfp8 e4m3 * 2^(s-127) -> bf16";
    bfs__finish_shape(t);
    rc = 1;
cleanup:
    free(base);
    return rc;
}

static int bfs__ctmx_sources(const bfs_unit *u, bfs_srange out[BFS_UNIT_MAX_SRC])
{
    const bfs_ltensor *t = u->t;
    const uint64_t n = u->row1 - u->row0, C = t->ctmx.cols, wb = t->ctmx.fp4 ? C / 2 : C;
    out[0] = (bfs_srange){t->src[0], u->row0 * wb, n * wb};
    out[1] = (bfs_srange){t->src[1], u->row0 * (C / 32), n * (C / 32)};
    return 2;
}

static const char *bfs__ctmx_kind_name(const bfs_ltensor *t) { return t->qname; }

/* A compressed-tensors claim whose config groups name an MX format bfshard does not convert. */
static int bfs__ctmx_detect(const bfs_fctx *c)
{
    const char *fmt;
    void *it = NULL;
    if (!bfs__qc_is(c, "compressed-tensors"))
        return 0;
    for (size_t k = 0; bfs__ct_group_next(c, &it, &fmt) != NULL; k++)
        if (strcmp(fmt, "mxfp6-pack-quantized") == 0)
            return bfs__err(BFS_EINPUT, "%s: quantization_config config group %zu: format \"mxfp6-pack-quantized\" is not supported (bfshard converts: %s)",
                            c->qsource, k, c->supported);
    return 0;
}

static const char *const bfs__ctmx_methods[] = {"compressed-tensors", NULL};

const bfs_format bfs__format_ctmx = {
    .name = "ctmx",
    .kinds = BFS_KIND_BIT(BFS_K_CTMX),
    .methods = bfs__ctmx_methods,
    .supports = "compressed-tensors MXFP8 and MXFP4 (mxfp8-quantized, mxfp4-pack-quantized)",
    .layout = "P.weight F8_E4M3 or P.weight_packed U8 + P.weight_scale U8 (E8M0)",
    .claim_optional = false,
    .detect = bfs__ctmx_detect,
    .claim = bfs__ctmx_claim,
    .leftover = NULL,
    .sources = bfs__ctmx_sources,
    .kind_name = bfs__ctmx_kind_name,
};
