/*
 * bitsandbytes 4-bit (NF4 / FP4, with or without double quant):
 *   P.weight (packed codes, any quant_storage dtype) + P.weight.absmax +
 *   P.weight.quant_map [+ .nested_absmax, .nested_quant_map] +
 *   P.weight.quant_state.bitsandbytes__{nf4,fp4} (a JSON blob in a U8 tensor)
 *   -> P.weight in BF16, shape from the blob. Kernels: kernels/ (bfs_bnb4_desc).
 * Leftover absmax/quant_map pieces or a U8 [n, 1] weight without a blob are errors.
 */
#include "format.h"
#include "../../kernels/ref.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BFS_BNB_MARKER ".quant_state.bitsandbytes__"

static const float bfs__nf4[16] = BFS_NF4_TABLE_INIT;
static const float bfs__fp4[16] = BFS_FP4_TABLE_INIT;

/* Where a planning error points: the quant_state tensor. */
typedef struct {
    const bfs_input *in;
    const bfs_raw *state;
    const char *file, *sname;
    unsigned long long off;
} bfs_bnb_at;

static int bfs__bnb_need(const bfs_bnb_at *at, const char *prefix, const char *suffix, bfs_dtype dt, uint64_t nelem,
                         const char *why, bfs_raw **out)
{
    const bfs_input *in = at->in;
    int rc = 0;
    char *name = bfs__str_cat2(prefix, suffix);
    if (!name)
        return bfs__err(BFS_ENOMEM, "out of memory");
    bfs_raw *r = (bfs_raw *)bfs__input_find(in, name);
    if (!r)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): bitsandbytes quant_state without \"%s\" (%s)", at->file,
                 at->sname, at->off, name, why);
    if (r->st->dtype != dt)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): dtype %s, expected %s (%s)", bfs__raw_path(in, r), name,
                 (unsigned long long)r->file_offset, bfs__dtype_name(r->st->dtype), bfs__dtype_name(dt), why);
    if (r->nbytes != nelem * bfs__dtype_size(dt))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): %llu elements, expected %llu (%s)", bfs__raw_path(in, r),
                 name, (unsigned long long)r->file_offset, (unsigned long long)(r->nbytes / bfs__dtype_size(dt)),
                 (unsigned long long)nelem, why);
    r->used = 1;
    *out = r;
cleanup:
    free(name);
    return rc;
}

static int bfs__dtype_from_torch(const char *s, bfs_dtype *d)
{
    if (strncmp(s, "torch.", 6) == 0)
        s += 6;
    if (strcmp(s, "bfloat16") == 0) *d = BFS_DT_BF16;
    else if (strcmp(s, "float16") == 0 || strcmp(s, "half") == 0) *d = BFS_DT_F16;
    else if (strcmp(s, "float32") == 0 || strcmp(s, "float") == 0) *d = BFS_DT_F32;
    else return -1;
    return 0;
}

/* The quant_state blob: parsed into *root (caller frees), t->src_dtype, t->ndim and
 * t->shape set, *n the element count, *bs the block size. */
static int bfs__bnb_blob(const bfs_bnb_at *at, const char *qt, json_t **root, bfs_ltensor *t, uint64_t *n_out,
                         uint64_t *bs_out)
{
    const bfs_raw *state = at->state;
    const char *file = at->file, *sname = at->sname;
    const unsigned long long off = at->off;
    json_error_t jerr;
    int rc = 0;
    if (state->st->dtype != BFS_DT_U8 || state->st->ndim != 1)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): quant_state blob must be a 1-d U8 tensor", file, sname, off);
    if (state->nbytes > (1u << 20))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): quant_state blob of %llu bytes is implausibly large", file,
                 sname, off, (unsigned long long)state->nbytes);
    *root = json_loadb((const char *)state->data, (size_t)state->nbytes, JSON_REJECT_DUPLICATES, &jerr);
    if (!*root || !json_is_object(*root))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): quant_state is not a JSON object (%s at byte %d)", file,
                 sname, off, *root ? "not an object" : jerr.text, *root ? 0 : jerr.position);
    const json_t *jqt = json_object_get(*root, "quant_type"), *jbs = json_object_get(*root, "blocksize"),
                 *jdt = json_object_get(*root, "dtype"), *jsh = json_object_get(*root, "shape");
    if (!json_is_string(jqt) || strcmp(json_string_value(jqt), qt) != 0)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): quant_state quant_type %s%s%s does not match the key suffix \"%s\"",
                 file, sname, off, json_is_string(jqt) ? "\"" : "", json_is_string(jqt) ? json_string_value(jqt) : "(missing)",
                 json_is_string(jqt) ? "\"" : "", qt);
    if (!json_is_integer(jbs) || json_integer_value(jbs) < 1 || json_integer_value(jbs) > (1 << 20))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): quant_state blocksize missing or out of range", file, sname, off);
    if (!json_is_string(jdt) || bfs__dtype_from_torch(json_string_value(jdt), &t->src_dtype) != 0)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): quant_state dtype %s is not bfloat16/float16/float32", file,
                 sname, off, json_is_string(jdt) ? json_string_value(jdt) : "(missing)");
    if (!json_is_array(jsh) || json_array_size(jsh) > BFS_MAX_DIMS)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): quant_state shape missing or not a list", file, sname, off);
    t->ndim = (int)json_array_size(jsh);
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) {
        const json_t *v = json_array_get(jsh, (size_t)d);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            !bfs__mul_ok(n, (uint64_t)json_integer_value(v), &n) || n > (UINT64_MAX / 4))
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): quant_state shape[%d] invalid or too large", file,
                     sname, off, d);
        t->shape[d] = (uint64_t)json_integer_value(v);
    }
    *n_out = n;
    *bs_out = (uint64_t)json_integer_value(jbs);
cleanup:
    return rc;
}

/* Double quant: the U8 absmax, its float32 nested absmax and 256-entry nested code. */
static int bfs__bnb_nested(const bfs_bnb_at *at, const json_t *root, const char *prefix, uint64_t nblocks,
                           bfs_ltensor *t)
{
    const char *file = at->file, *sname = at->sname;
    const unsigned long long off = at->off;
    const json_t *jnbs = json_object_get(root, "nested_blocksize"), *jnoff = json_object_get(root, "nested_offset");
    bfs_raw *am = NULL, *nam = NULL, *nqm = NULL;
    int rc = 0;
    if (!json_is_integer(jnbs) || json_integer_value(jnbs) < 1 || json_integer_value(jnbs) > (1 << 20))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): quant_state nested_blocksize missing or out of range",
                 file, sname, off);
    if (!json_is_number(jnoff))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): quant_state nested_offset missing or not a number",
                 file, sname, off);
    const json_t *jndt = json_object_get(root, "nested_dtype");
    bfs_dtype ndt;
    if (jndt && (!json_is_string(jndt) || bfs__dtype_from_torch(json_string_value(jndt), &ndt) != 0 || ndt != BFS_DT_F32))
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): quant_state nested_dtype must be float32", file, sname, off);
    const uint64_t nbs = (uint64_t)json_integer_value(jnbs);
    const uint64_t nnested = nblocks / nbs + (nblocks % nbs != 0);
    BFS_TRY(bfs__bnb_need(at, prefix, ".absmax", BFS_DT_U8, nblocks, "one quantized absmax byte per block", &am));
    BFS_TRY(bfs__bnb_need(at, prefix, ".nested_absmax", BFS_DT_F32, nnested, "one float32 per nested block", &nam));
    BFS_TRY(bfs__bnb_need(at, prefix, ".nested_quant_map", BFS_DT_F32, 256, "the 256-entry nested code", &nqm));
    t->bnb.absmax_u8 = am->data;
    t->bnb.nested_absmax = (const float *)nam->data;
    t->bnb.nested_code = (const float *)nqm->data;
    t->bnb.nested_blocksize = (size_t)nbs;
    /* nested_offset is a Python float (double) from .item() on a float32 tensor */
    t->bnb.offset = (float)json_number_value(jnoff);
    t->src[t->nsrc++] = am;
    t->src[t->nsrc++] = nam;
    t->src[t->nsrc++] = nqm;
cleanup:
    return rc;
}

extern const bfs_format bfs__format_bnb4;

static int bfs__bnb_claim(const bfs_fctx *c, bfs_raw *state, bfs_ltensor *t)
{
    const bfs_input *in = c->in;
    const char *sname = state->st->name;
    const char *marker = strstr(sname, BFS_BNB_MARKER);
    if (!marker)
        return 0;
    const bfs_bnb_at at = {in, state, bfs__raw_path(in, state), sname, (unsigned long long)state->file_offset};
    const char *file = at.file;
    const unsigned long long off = at.off;
    int rc = 0;
    char *prefix = NULL;
    json_t *root = NULL;

    if (c->claim == &bfs__format_bnb4 && (json_is_true(json_object_get(c->qconfig, "load_in_8bit")) ||
                                          json_is_true(json_object_get(c->qconfig, "_load_in_8bit"))))
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): a bitsandbytes 4-bit quant_state, but %s says load_in_8bit: true; refusing a checkpoint that contradicts its config",
                        bfs__raw_path(in, state), sname, (unsigned long long)state->file_offset, c->qsource);
    const char *qt = marker + strlen(BFS_BNB_MARKER);
    if (strcmp(qt, "nf4") != 0 && strcmp(qt, "fp4") != 0)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): unknown bitsandbytes quant type \"%s\" (nf4 and fp4 are supported)",
                 file, sname, off, qt);
    prefix = bfs__str_ndup(sname, (size_t)(marker - sname)); /* "P.weight" */
    if (!prefix)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    uint64_t n = 0, bs = 0;
    BFS_TRY(bfs__bnb_blob(&at, qt, &root, t, &n, &bs));
    const uint64_t nblocks = n / bs + (n % bs != 0);

    /* the packed weight: any quant_storage dtype, read as bytes */
    bfs_raw *w = (bfs_raw *)bfs__input_find(in, prefix);
    if (!w)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): bitsandbytes quant_state without its weight \"%s\"", file,
                 sname, off, prefix);
    if (w->nbytes != (n + 1) / 2)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): packed 4-bit weight has %llu bytes but quant_state shape needs %llu",
                 bfs__raw_path(in, w), prefix, (unsigned long long)w->file_offset, (unsigned long long)w->nbytes,
                 (unsigned long long)((n + 1) / 2));
    w->used = 1;
    state->used = 1;

    bfs_raw *qm = NULL, *am = NULL;
    BFS_TRY(bfs__bnb_need(&at, prefix, ".quant_map", BFS_DT_F32, 16, "the 16-entry code table", &qm));
    const float *table = strcmp(qt, "nf4") == 0 ? bfs__nf4 : bfs__fp4;
    /* compared as floats: bitsandbytes' Python table stores FP4 code 8 as +0.0 (an integer -0
     * literal), its C++ and CUDA kernels use -0.0 -- both are the same code table */
    bool same = true;
    for (int k = 0; k < 16; k++) {
        float v;
        memcpy(&v, qm->data + 4 * k, 4);
        same = same && v == table[k];
    }
    if (!same)
        BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): quant_map differs from bitsandbytes' built-in %s table, which every upstream dequant uses",
                 bfs__raw_path(in, qm), qm->st->name, (unsigned long long)qm->file_offset, qt);

    t->double_quant = json_object_get(root, "nested_blocksize") != NULL || json_object_get(root, "nested_offset") != NULL;
    memset(&t->bnb, 0, sizeof t->bnb);
    t->bnb.codes = w->data;
    t->bnb.table = table;
    t->bnb.blocksize = (size_t)bs;
    t->src[0] = w;
    t->src[1] = state;
    t->src[2] = qm;
    t->nsrc = 3;
    if (!t->double_quant) {
        BFS_TRY(bfs__bnb_need(&at, prefix, ".absmax", BFS_DT_F32, nblocks, "one float32 absmax per block", &am));
        t->bnb.absmax_f32 = (const float *)am->data;
        t->src[t->nsrc++] = am;
    } else {
        BFS_TRY(bfs__bnb_nested(&at, root, prefix, nblocks, t));
    }
    /* float32 tensors need no alignment: the kernels load them as bytes (bfs_ld_f32) */
    snprintf(t->quant_type, sizeof t->quant_type, "%s", qt);
    t->name = prefix;
    prefix = NULL;
    t->kind = BFS_K_BNB4;
    t->out_dtype = BFS_DT_BF16;
    t->transform = strcmp(qt, "nf4") == 0 ? (t->double_quant ? "bnb-nf4(double quant)->bf16" : "bnb-nf4->bf16")
                                          : (t->double_quant ? "bnb-fp4(double quant)->bf16" : "bnb-fp4->bf16");
    bfs__finish_shape(t);
    rc = 1;
cleanup:
    json_decref(root);
    free(prefix);
    return rc;
}

static const char *const bfs__bnb_suffixes[] = {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map"};

static int bfs__bnb_leftover(const bfs_fctx *c, bfs_raw *r, bfs_ltensor *t)
{
    const char *nm = r->st->name;
    const char *file = bfs__raw_path(c->in, r);
    for (size_t k = 0; k < sizeof bfs__bnb_suffixes / sizeof *bfs__bnb_suffixes; k++)
        if (bfs__str_ends(nm, bfs__bnb_suffixes[k]) && strstr(nm, ".weight."))
            return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): bitsandbytes quantization data without a quant_state blob for its weight",
                            file, nm, (unsigned long long)r->file_offset);
    if (r->st->dtype == BFS_DT_U8 && (bfs__str_ends(nm, ".weight") || bfs__str_ends(nm, "_proj")) && r->st->ndim == 2 &&
        r->st->shape[1] == 1)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): looks like a packed 4-bit weight (U8 [n, 1]) but has no quant_state",
                        file, nm, (unsigned long long)r->file_offset);
    return 0;
}

/* Every input byte the kernels read for elements [e0, e1): the codes, the blocks' absmax
 * and, with double quant, their nested absmax and the nested code (src[0], src[3..]).
 * The quant_state blob and quant_map (src[1], src[2]) are read by the planner only. */
static int bfs__bnb_sources(const bfs_unit *u, bfs_srange out[BFS_UNIT_MAX_SRC])
{
    const bfs_ltensor *t = u->t;
    const uint64_t e0 = u->row0 * t->row_elems, e1 = u->row1 * t->row_elems, bs = t->bnb.blocksize;
    const uint64_t b0 = e0 / bs, b1 = e1 == e0 ? b0 : (e1 + bs - 1) / bs; /* blocks [b0, b1) */
    out[0] = (bfs_srange){t->src[0], e0 / 2, (e1 + 1) / 2 - e0 / 2};
    if (!t->double_quant) {
        out[1] = (bfs_srange){t->src[3], b0 * 4, (b1 - b0) * 4};
        return 2;
    }
    const uint64_t nbs = t->bnb.nested_blocksize, n0 = b0 / nbs, n1 = b1 == b0 ? n0 : (b1 + nbs - 1) / nbs;
    out[1] = (bfs_srange){t->src[3], b0, b1 - b0};
    out[2] = (bfs_srange){t->src[4], n0 * 4, (n1 - n0) * 4};
    out[3] = (bfs_srange){t->src[5], 0, e1 == e0 ? 0 : 256 * 4};
    return 4;
}

static const char *bfs__bnb_kind_name(const bfs_ltensor *t)
{
    if (strcmp(t->quant_type, "nf4") == 0)
        return t->double_quant ? "bnb-nf4-dq" : "bnb-nf4";
    return t->double_quant ? "bnb-fp4-dq" : "bnb-fp4";
}

extern const bfs_format bfs__format_bnb4;

/* The claim: transformers' BitsAndBytesConfig. 4-bit only: load_in_4bit true,
 * load_in_8bit (LLM.int8()) not; a quant type, when given, nf4 or fp4. */
static int bfs__bnb_detect(const bfs_fctx *c)
{
    if (c->claim != &bfs__format_bnb4)
        return 0;
    const json_t *q = c->qconfig, *qt = json_object_get(q, "bnb_4bit_quant_type");
    const char *bad = NULL;
    const bool b8 = json_is_true(json_object_get(q, "load_in_8bit")) || json_is_true(json_object_get(q, "_load_in_8bit"));
    if (b8 && (json_is_true(json_object_get(q, "load_in_4bit")) || json_is_true(json_object_get(q, "_load_in_4bit"))))
        bad = "both load_in_8bit and load_in_4bit true (which one the weights are is unknown)";
    else if (b8)
        return 0; /* LLM.int8(): bnb8.c's */
    else if (!json_is_true(json_object_get(q, "load_in_4bit")))
        bad = "load_in_4bit not true (not 4-bit weights)";
    else if (qt && !json_is_null(qt) &&
             (!json_is_string(qt) || (strcmp(json_string_value(qt), "nf4") != 0 && strcmp(json_string_value(qt), "fp4") != 0)))
        bad = "a bnb_4bit_quant_type other than \"nf4\" or \"fp4\"";
    if (!bad)
        return 0;
    return bfs__err(BFS_EINPUT, "%s: quantization_config.quant_method \"bitsandbytes\" with %s is not supported (bfshard converts: %s)", c->qsource,
                    bad, c->supported);
}

static const char *const bfs__bnb_methods[] = {"bitsandbytes", NULL};

const bfs_format bfs__format_bnb4 = {
    .name = "bnb4",
    .kinds = BFS_KIND_BIT(BFS_K_BNB4),
    .methods = bfs__bnb_methods,
    .supports = "bitsandbytes 4-bit (nf4, fp4)",
    .layout = "P.weight + .absmax + .quant_map + .quant_state.bitsandbytes__nf4/fp4",
    .claim_optional = true, /* the quant_state blob names the format */
    .detect = bfs__bnb_detect,
    .claim = bfs__bnb_claim,
    .leftover = bfs__bnb_leftover,
    .sources = bfs__bnb_sources,
    .kind_name = bfs__bnb_kind_name,
};
