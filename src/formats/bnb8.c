/*
 * bitsandbytes 8-bit (LLM.int8(), quant_method "bitsandbytes" with load_in_8bit: true;
 * docs/FORMATS.md 9.3), BFS_K_WOQ (the kind gptq.c owns):
 *   P.weight I8 [out, in] + P.SCB F32 [out] (row-wise absmax) [+ P.weight_format U8 [],
 *   0 = "row", the only layout bitsandbytes >= 0.45 writes]
 * -> P.weight BF16 [out, in], the value of bitsandbytes' int8_vectorwise_dequant (what
 * transformers' dequantize_bnb_weight calls): A * SCB * 7.874015718698502e-3 in float32,
 * then bf16. The outlier threshold (llm_int8_threshold) is a forward-time setting: the file
 * holds no outlier state, the int8 weight is the whole weight. A weight_format other than
 * 0 (col32, col_turing, col_ampere: tiled layouts of old bitsandbytes) is refused.
 */
#include "formats/woq.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AT(r) bfs__raw_path(c->in, (r)), (r)->st->name, (unsigned long long)(r)->file_offset

/* The claim is bitsandbytes 8-bit (bnb4.c's detect leaves it to this file). */
static bool bfs__bnb8_claimed(const bfs_fctx *c)
{
    return bfs__qc_is(c, "bitsandbytes") && (json_is_true(json_object_get(c->qconfig, "load_in_8bit")) ||
                                             json_is_true(json_object_get(c->qconfig, "_load_in_8bit")));
}

static int bfs__bnb8_claim(const bfs_fctx *c, bfs_raw *w, bfs_ltensor *t)
{
    const bfs_st_tensor *st = w->st;
    int rc = 0;
    char *base = NULL;
    if (st->dtype != BFS_DT_I8 || !bfs__str_ends(st->name, "weight") || !bfs__qc_is(c, "bitsandbytes"))
        return 0;
    base = bfs__str_ndup(st->name, strlen(st->name) - strlen("weight")); /* "P." */
    if (!base)
        return bfs__err(BFS_ENOMEM, "out of memory");
    bfs_raw *scb = bfs__sibling(c->in, base, "SCB", &rc), *wf = NULL;
    if (rc == 0)
        wf = bfs__sibling_of(c->in, w, "_format", &rc);
    if (rc < 0)
        goto cleanup;
    if (!scb) {
        rc = 0; /* an int8 weight without SCB is no LLM.int8() weight: the refuse row names it */
        goto cleanup;
    }
    if (!bfs__bnb8_claimed(c))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): bitsandbytes 8-bit weight (I8 + SCB), but %s does not say load_in_8bit: true; refusing a checkpoint that contradicts its config",
                 AT(w), c->qsource);
    if (st->ndim != 2 || st->shape[0] == 0 || st->shape[1] == 0)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): bitsandbytes 8-bit weight with %d dims, expected [out, in]", AT(w), st->ndim);
    if (scb->st->dtype != BFS_DT_F32 || !bfs__raw_shape_is(scb, 1, st->shape[0], 0)) {
        char ss[96];
        bfs__shape_str(scb->st->shape, scb->st->ndim, ss, sizeof ss);
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): SCB %s %s, expected F32 [%llu] (one absmax per row of \"%s\")", AT(scb),
                 bfs__dtype_name(scb->st->dtype), ss, (unsigned long long)st->shape[0], st->name);
    }
    if (wf) {
        uint64_t v = 0;
        if (bfs__raw_nelem(wf) != 1 || (wf->st->dtype != BFS_DT_U8 && wf->st->dtype != BFS_DT_I64 && wf->st->dtype != BFS_DT_I32))
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): weight_format must be one integer", AT(wf));
        memcpy(&v, wf->data, wf->nbytes < sizeof v ? (size_t)wf->nbytes : sizeof v);
        if (v != 0)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): bitsandbytes 8-bit weight_format %llu (a tiled col32 / turing / ampere layout of old bitsandbytes) is not supported: only 0, \"row\"",
                     AT(wf), (unsigned long long)v);
        wf->used = 1;
    }
    w->used = scb->used = 1;
    t->src[0] = w;
    t->src[1] = scb;
    t->nsrc = 2;
    t->name = bfs__str_cat2(base, "weight");
    if (!t->name)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    t->kind = BFS_K_WOQ;
    t->out_dtype = BFS_DT_BF16;
    t->ndim = 2;
    t->shape[0] = st->shape[0];
    t->shape[1] = st->shape[1];
    t->woq = (bfs_woq_desc){.qweight = w->data, .qzeros = NULL, .scale = scb->data, .g_idx = NULL,
                            .layout = BFS_WOQ_BNB8, .bits = 8, .scale_type = BFS_WOQ_F32,
                            .rows = (size_t)st->shape[0], .cols = (size_t)st->shape[1], .group_size = (size_t)st->shape[1],
                            .ngroups = 1, .zw = 0};
    t->qname = "bnb-int8";
    t->transform = "int8 * SCB / 127 -> bf16";
    bfs__finish_shape(t);
    rc = 1;
cleanup:
    free(base);
    return rc;
}

static const char *const bfs__bnb8_methods[] = {"bitsandbytes", NULL};

/* Plans BFS_K_WOQ tensors but declares no kind: gptq.c's row names them (woq.c). */
const bfs_format bfs__format_bnb8 = {
    .name = "bnb8",
    .kinds = 0,
    .borrows = BFS_KIND_BIT(BFS_K_WOQ),
    .methods = bfs__bnb8_methods,
    .supports = "bitsandbytes 8-bit (LLM.int8())",
    .layout = "P.weight I8 + P.SCB F32",
    .claim_optional = false,
    .detect = NULL,
    .claim = bfs__bnb8_claim,
    .leftover = NULL,
    .sources = NULL,
    .kind_name = NULL,
};
