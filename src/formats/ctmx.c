/*
 * compressed-tensors MX (docs/FORMATS.md 7.2, 7.3, 7.6), one kind, BFS_K_CTMX, three element
 * types:
 *   mxfp8-quantized (a config group {type float, num_bits 8, group_size 32}): P.weight
 *     F8_E4M3 [out, in] + P.weight_scale U8 [out, in/32], E8M0 exponents;
 *   mxfp4-pack-quantized ({type float, num_bits 4, group_size 32}): P.weight_packed U8
 *     [out, in/2] (E2M1 pairs, low nibble = even element) + P.weight_scale U8 [out, in/32],
 *     and no weight_global_scale (that is NVFP4, nvfp4.c);
 *   mxfp6-pack-quantized ({type float, num_bits 6, group_size 32}): P.weight_packed U8
 *     [out, 3*in/4] (four E2M3 codes per 3 bytes, little-endian) + P.weight_scale U8 [out, in/32].
 * -> P.weight in BF16, bf16(f32(v * 2^(s-127))), scale byte 255 = +inf (compressed-tensors'
 * decompress_mx_scale). The U8 scales are E8M0 exponents, never integers. The config group
 * decides the format (MXFP4 and MXFP6 tensors have the same names and dtypes); the tensors must
 * agree (dtype, shape, in % 32 == 0). Asymmetric MX (weight_zero_point) and other group sizes
 * are refused. This row comes before fp8.c and nvfp4.c in the table: it takes F8_E4M3 weights
 * with a U8 scale and U8 packed weights without a global scale, and leaves the rest to them.
 * Kernels: kernels/ (bfs_ctmx_desc, ref_formats.h bfs_ctmx_elem).
 */
#include "format.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AT(r) bfs__raw_path(c->in, (r)), (r)->st->name, (unsigned long long)(r)->file_offset

/* Per element type (BFS_CTMX_*): the config group format, num_bits, the name in messages. */
static const char *const bfs__ctmx_fmt[3] = {"mxfp8-quantized", "mxfp4-pack-quantized", "mxfp6-pack-quantized"};
static const int bfs__ctmx_bits[3] = {8, 4, 6};
static const char *const bfs__ctmx_label[3] = {"MXFP8", "MXFP4", "MXFP6"};

/* The element type of a packed weight r: its config group's format decides (E2M3 for
 * mxfp6-pack-quantized, else E2M1, which bfs__ctmx_group then checks). */
static int bfs__ctmx_packed_elem(const bfs_fctx *c, const bfs_raw *r, int *elem)
{
    const char *fmt = "";
    size_t k;
    const int grc = bfs__ct_group_of(c, r, &k);
    if (grc < 0)
        return grc;
    (void)bfs__ct_group_weights(c, k, &fmt);
    *elem = fmt && strcmp(fmt, bfs__ctmx_fmt[BFS_CTMX_E2M3]) == 0 ? BFS_CTMX_E2M3 : BFS_CTMX_E2M1;
    return 0;
}

/* The config group of r's module (as compressed-tensors matches it, ctmatch.c) must be the
 * element type's format with weights {float, num_bits, group 32}, symmetric, U8 scales: 0, or
 * < 0 with a message naming the group and what differs. */
static int bfs__ctmx_group(const bfs_fctx *c, const bfs_raw *r, int elem)
{
    const char *want = bfs__ctmx_fmt[elem], *fmt = "";
    const int bits = bfs__ctmx_bits[elem];
    size_t k;
    const int grc = bfs__ct_group_of(c, r, &k);
    if (grc < 0)
        return grc;
    const json_t *wt = bfs__ct_group_weights(c, k, &fmt);
    if (!wt || strcmp(fmt, want) != 0)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): %s weight with a U8 (E8M0) scale, but the config group of its module (config group %zu of %s quantization_config) is format \"%s\", not %s {type float, num_bits %d, group_size 32}%s",
                        AT(r), elem == BFS_CTMX_E4M3 ? "MXFP8" : "MXFP4/MXFP6 packed", k, c->qsource, fmt, want, bits,
                        elem == BFS_CTMX_E4M3 ? "" : " or mxfp6-pack-quantized {type float, num_bits 6, group_size 32}");
    const char *type = bfs__qc_str(wt, "type"), *strat = bfs__qc_str(wt, "strategy");
    const char *sd = bfs__qc_str(wt, "scale_dtype");
    if (!type || strcmp(type, "float") != 0 || bfs__qc_int(wt, "num_bits") != bits ||
        bfs__qc_int(wt, "group_size") != 32 || (strat && strcmp(strat, "group") != 0))
        return bfs__err(BFS_EINPUT, "config.json: quantization_config config group %zu: format \"%s\" with weights other than {type float, num_bits %d, strategy group, group_size 32} is not supported",
                        k, want, bits);
    if (json_is_false(json_object_get(wt, "symmetric")))
        return bfs__err(BFS_EINPUT, "config.json: quantization_config config group %zu: asymmetric %s (symmetric: false) is not supported", k, want);
    if (sd && strcmp(sd, "torch.uint8") != 0)
        return bfs__err(BFS_EINPUT, "config.json: quantization_config config group %zu: %s with scale_dtype \"%s\" is not supported (E8M0 exponents stored as \"torch.uint8\" are)",
                        k, want, sd);
    return 0;
}

/* r (a weight candidate) with its scale s: the checks every element type shares. nb: r's
 * columns (bytes of a packed row). */
static int bfs__ctmx_check(const bfs_fctx *c, const bfs_raw *r, const bfs_raw *s, int elem, uint64_t out, uint64_t in, uint64_t nb)
{
    static const char *const inner[3] = {"", "/2", "*3/4"};
    char rs[160], ss[160];
    bfs__shape_str(r->st->shape, r->st->ndim, rs, sizeof rs);
    bfs__shape_str(s->st->shape, s->st->ndim, ss, sizeof ss);
    const int g = bfs__ctmx_group(c, r, elem);
    if (g < 0)
        return g;
    if (r->st->ndim != 2 || in % 32 != 0 || (elem == BFS_CTMX_E2M3 && nb % 3 != 0))
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): %s weight shape %s, expected [out, in%s] with in %% 32 == 0",
                        AT(r), elem == BFS_CTMX_E4M3 ? "MXFP8" : elem == BFS_CTMX_E2M1 ? "MXFP4 packed" : "MXFP6 packed", rs, inner[elem]);
    if (!bfs__raw_shape_is(s, 2, out, in / 32))
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): %s scale shape %s, expected [%llu, %llu] (one E8M0 byte per 32 elements) for weight \"%s\" %s",
                        AT(s), bfs__ctmx_label[elem], ss, (unsigned long long)out, (unsigned long long)(in / 32), r->st->name, rs);
    return 0;
}

static int bfs__ctmx_claim(const bfs_fctx *c, bfs_raw *r, bfs_ltensor *t)
{
    static const char *const qname[3] = {"ct-mxfp8", "ct-mxfp4", "ct-mxfp6"};
    static const char *const transform[3] = {"mxfp8 e4m3 * 2^(s-127) -> bf16", "mxfp4 e2m1 * 2^(s-127) -> bf16",
                                             "mxfp6 e2m3 * 2^(s-127) -> bf16"};
    const bfs_st_tensor *st = r->st;
    const bool packed = bfs__str_ends(st->name, ".weight_packed");
    int rc = 0, elem = BFS_CTMX_E4M3;
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
    const char *label = packed ? "MXFP4/MXFP6" : "MXFP8";
    if (sdt != BFS_DT_U8)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): %s scale dtype %s, expected U8 (E8M0 exponents) for weight \"%s\"",
                 AT(s), label, bfs__dtype_name(sdt), st->name);
    if (!bfs__qc_is(c, "compressed-tensors"))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): %s weight with a U8 (E8M0) scale \"%s\", but config.json quantization_config.quant_method is \"%s\" (expected \"compressed-tensors\")",
                 AT(r), label, s->st->name, c->method ? c->method : "(none)");
    if (zp)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): %s weight with a zero point \"%s\": asymmetric MX is not supported",
                 AT(r), label, zp->st->name);
    if (packed)
        BFS_TRY(bfs__ctmx_packed_elem(c, r, &elem));
    const uint64_t nb = st->ndim == 2 ? st->shape[1] : 0, out = st->ndim == 2 ? st->shape[0] : 0;
    const uint64_t in = elem == BFS_CTMX_E4M3 ? nb : elem == BFS_CTMX_E2M1 ? nb * 2 : nb / 3 * 4;
    BFS_TRY(bfs__ctmx_check(c, r, s, elem, out, in, nb));
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
    t->ctmx = (bfs_ctmx_desc){.w = r->data, .scale = s->data, .elem = elem, .cols = (size_t)in};
    t->qname = qname[elem];
    t->transform = transform[elem];
    bfs__finish_shape(t);
    rc = 1;
cleanup:
    free(base);
    return rc;
}

static int bfs__ctmx_sources(const bfs_unit *u, bfs_srange out[BFS_UNIT_MAX_SRC])
{
    const bfs_ltensor *t = u->t;
    const int e = t->ctmx.elem;
    const uint64_t n = u->row1 - u->row0, C = t->ctmx.cols;
    const uint64_t wb = e == BFS_CTMX_E4M3 ? C : e == BFS_CTMX_E2M1 ? C / 2 : C / 4 * 3; /* bytes a row */
    out[0] = (bfs_srange){t->src[0], u->row0 * wb, n * wb};
    out[1] = (bfs_srange){t->src[1], u->row0 * (C / 32), n * (C / 32)};
    return 2;
}

static const char *bfs__ctmx_kind_name(const bfs_ltensor *t) { return t->qname; }

static const char *const bfs__ctmx_methods[] = {"compressed-tensors", NULL};

const bfs_format bfs__format_ctmx = {
    .name = "ctmx",
    .kinds = BFS_KIND_BIT(BFS_K_CTMX),
    .methods = bfs__ctmx_methods,
    .supports = "compressed-tensors MXFP8, MXFP4 and MXFP6 (mxfp8-quantized, mxfp4-pack-quantized, mxfp6-pack-quantized)",
    .layout = "P.weight F8_E4M3 or P.weight_packed U8 (E2M1 pairs / E2M3 4-in-3) + P.weight_scale U8 (E8M0)",
    .claim_optional = false,
    .detect = NULL,
    .claim = bfs__ctmx_claim,
    .leftover = NULL,
    .sources = bfs__ctmx_sources,
    .kind_name = bfs__ctmx_kind_name,
};
