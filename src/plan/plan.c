/*
 * Plan: group raw tensors into logical output tensors by trying the format
 * table (src/formats/table.c) over them, then lay out every output file
 * (complete header, offsets, size) before any data moves.
 *
 * First the input's quantization claim (config.json, quantize_config.json) is
 * resolved and judged (src/formats/refuse.c) and every format's detect() sees it.
 * Grouping (shared/FORMATS.md), two passes over the raw tensors in name order:
 *   1. every format's claim(): a tensor that anchors a group of that format
 *      (MXFP4 X_blocks, a bitsandbytes quant_state blob) becomes one output
 *      tensor and marks its sources used;
 *   2. every tensor left unused goes through the formats' leftover() in table
 *      order: one that looks like a stray piece of a format is an error, an
 *      activation / KV-cache scale of a quantized checkpoint is dropped (listed
 *      in plan->dropped), the rest passes through (cast to BF16 or copied, the
 *      last row).
 * Between the passes the groups are checked against the claim (refuse.c).
 * Output names must be unique; the plan is sorted by output name.
 */
#include "plan/plan.h"
#include "formats/format.h"
#include "input/safetensors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bfs__cmp_lt(const void *a, const void *b)
{
    const bfs_ltensor *x = a, *y = b;
    return strcmp(x->name, y->name);
}

void bfs__plan_free(bfs_plan *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->nt; i++)
        free(p->t[i].name);
    free(p->t);
    for (int f = 0; f < p->nfiles; f++) {
        free(p->files[f].name);
        free(p->files[f].pieces);
    }
    free(p->files);
    free(p->dropped);
    free(p->name_jlen);
    free(p);
}

/* The formats' view of the input: config.json parsed once (validated by input.c). */
static int bfs__fctx_open(const bfs_input *in, const bfs_convert_opts *o, bfs_fctx *c, json_t **cfg)
{
    *cfg = NULL;
    *c = (bfs_fctx){.in = in, .o = o};
    bfs__supported_list(c->supported, sizeof c->supported);
    if (!in->config_json)
        return 0;
    *cfg = json_loads(in->config_json, 0, NULL);
    if (!*cfg)
        return bfs__err(BFS_ENOMEM, "out of memory");
    c->config = *cfg;
    return 0;
}

int bfs__plan_tensors(const bfs_input *in, const bfs_convert_opts *o, bfs_plan **out)
{
    int rc = 0;
    bfs_fctx c;
    bfs_qclaim own = {NULL, NULL, NULL};
    json_t *cfg = NULL;
    bfs_plan *p = calloc(1, sizeof *p);
    *out = NULL;
    if (!p)
        return bfs__err(BFS_ENOMEM, "out of memory");
    p->t = calloc(in->nraw ? in->nraw : 1, sizeof *p->t);
    p->dropped = calloc(in->nraw ? in->nraw : 1, sizeof *p->dropped);
    if (!p->t || !p->dropped)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__fctx_open(in, o, &c, &cfg));
    BFS_TRY(bfs__quant_claim(&c, &own));
    for (const bfs_format *const *f = bfs__formats; *f; f++)
        if ((*f)->detect)
            BFS_TRY((*f)->detect(&c));
    for (size_t i = 0; i < in->nraw; i++)
        ((bfs_raw *)&in->raw[i])->used = 0;

    /* pass 1: groups anchored by one of their tensors; the claimed format tries first,
     * so of two formats that share a tensor layout the one the config names takes it */
    for (size_t i = 0; i < in->nraw; i++) {
        bfs_raw *r = (bfs_raw *)&in->raw[i];
        for (int k = -1; k < 0 || bfs__formats[k]; k++) { /* -1: the claimed format */
            const bfs_format *fmt = k < 0 ? c.claim : bfs__formats[k];
            if (!fmt || !fmt->claim || (k >= 0 && fmt == c.claim))
                continue;
            memset(&p->t[p->nt], 0, sizeof p->t[p->nt]); /* nothing of a claim that did not take it */
            BFS_TRY(fmt->claim(&c, r, &p->t[p->nt]));
            if (rc > 0) {
                p->t[p->nt].by = fmt;
                p->nt++;
                break;
            }
        }
    }
    BFS_TRY(bfs__quant_check_groups(&c, p->t, p->nt));
    /* pass 2: leftovers; the last format takes whatever the others do not refuse */
    for (size_t i = 0; i < in->nraw; i++) {
        bfs_raw *r = (bfs_raw *)&in->raw[i];
        if (r->used)
            continue;
        rc = 0;
        for (const bfs_format *const *f = bfs__formats; *f && rc == 0; f++)
            if ((*f)->leftover) {
                memset(&p->t[p->nt], 0, sizeof p->t[p->nt]);
                BFS_TRY((*f)->leftover(&c, r, &p->t[p->nt]));
            }
        if (rc == 0)
            BFS_FAIL(BFS_EINTERNAL, "tensor \"%s\": no format took it", r->st->name);
        if (rc == 2) /* dropped: no output tensor (raw names are sorted, so is the list) */
            p->dropped[p->ndropped++] = r->st->name;
        else
            p->nt++;
    }
    rc = 0;
    if (p->nt < in->nraw) { /* a quantized input: fewer output tensors than input ones */
        bfs_ltensor *q = realloc(p->t, (p->nt ? p->nt : 1) * sizeof *p->t);
        if (q)
            p->t = q;
    }
    /* Every output shape, before it can reach a header: each dimension and the product of the
     * non-zero ones in output bytes fit an int64 (a zero-element tensor, say E = 0 MXFP4
     * experts, has no bytes to bound its other dimensions). */
    for (size_t i = 0; i < p->nt; i++) {
        const bfs_ltensor *t = &p->t[i];
        if (!bfs__shape_ok(t->shape, t->ndim, bfs__dtype_size(t->out_dtype))) {
            char shp[256];
            bfs__shape_str(t->shape, t->ndim, shp, sizeof shp);
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): output tensor \"%s\" of shape %s (%s) is too large: its size overflows",
                     bfs__raw_path(in, t->src[0]), t->src[0]->st->name, (unsigned long long)t->src[0]->file_offset,
                     t->name, shp, bfs__dtype_name(t->out_dtype));
        }
    }
    qsort(p->t, p->nt, sizeof *p->t, bfs__cmp_lt);
    for (size_t i = 1; i < p->nt; i++)
        if (strcmp(p->t[i - 1].name, p->t[i].name) == 0)
            BFS_FAIL(BFS_EINPUT, "two input groups produce the output tensor \"%s\" (e.g. both \"%s\" and \"%s\")",
                     p->t[i].name, p->t[i - 1].src[0]->st->name, p->t[i].src[0]->st->name);
    for (size_t i = 0; i < p->nt; i++) {
        const bfs_ltensor *t = &p->t[i];
        const uint64_t rb = t->row_elems * bfs__dtype_size(t->out_dtype);
        if (t->d0 > 0 && rb > p->max_row_bytes) /* a zero-element tensor needs no buffer */
            p->max_row_bytes = rb;
    }
    *out = p;
    p = NULL;
cleanup:
    bfs__qclaim_free(&own);
    json_decref(cfg);
    bfs__plan_free(p);
    return rc;
}

/* ---- layout ------------------------------------------------------------------------- */
static size_t bfs__align_of(bfs_dtype d) { return bfs__dtype_size(d); }

static int bfs__cmp_file_order(const void *a, const void *b, void *arg)
{
    const bfs_plan *p = arg;
    const bfs_piece *x = a, *y = b;
    const bfs_ltensor *tx = &p->t[x->tensor], *ty = &p->t[y->tensor];
    const size_t ax = bfs__align_of(tx->out_dtype), ay = bfs__align_of(ty->out_dtype);
    if (ax != ay)
        return ax > ay ? -1 : 1; /* as the upstream writer: alignment desc, then name */
    return strcmp(tx->name, ty->name);
}

/* ---- the header text, written directly (jansson for 200k tensors x ranks costs seconds):
 * byte for byte what bfs__json_dump(JSON_COMPACT) makes of the same object, keys in insertion
 * order; a string holding a control character is escaped by jansson itself.
 * The plan keeps no header text: the layout runs the same emitter in counting mode for
 * each file's header length (its data offsets follow from it), and bfs__plan_header
 * builds one file's text when convert writes that file, checking that the length is the
 * one counted. (All W headers held at once were 270 MB of 700 at W = 8, 200k tensors.) */
typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
    bool count; /* count the bytes only (p stays NULL) */
    bool esc;   /* inside a JSON string: '"' and '\\' escaped (DCP_SHARDING_INFO) */
    bool fixed; /* p is the caller's: never regrown (out of room: oom) */
} bfs_sbuf;

static void bfs__sb_raw(bfs_sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->count) {
        b->n += n;
        return;
    }
    if (b->cap - b->n <= n) {
        if (b->fixed) {
            b->oom = true;
            return;
        }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->n <= n)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

/* s, escaped as a JSON string's content when b->esc: the text never holds a control
 * character there (every name in it went through bfs__sb_json_str), so '"' and '\\'
 * are all jansson escapes in it */
/* s (n bytes) through emit, each '"' and '\\' preceded by a backslash */
static void bfs__sb_escape(bfs_sbuf *b, const char *s, size_t n, void (*emit)(bfs_sbuf *, const char *, size_t))
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '"' || s[i] == '\\') {
            emit(b, s + k, i - k);
            emit(b, s[i] == '"' ? "\\\"" : "\\\\", 2);
            k = i + 1;
        }
    emit(b, s + k, n - k);
}

static void bfs__sb_put(bfs_sbuf *b, const char *s, size_t n)
{
    if (b->esc)
        bfs__sb_escape(b, s, n, bfs__sb_raw);
    else
        bfs__sb_raw(b, s, n);
}

static void bfs__sb_str(bfs_sbuf *b, const char *s) { bfs__sb_put(b, s, strlen(s)); }

static void bfs__sb_u64(bfs_sbuf *b, uint64_t v)
{
    char t[24];
    size_t k = sizeof t;
    do {
        t[--k] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    bfs__sb_raw(b, t + k, sizeof t - k); /* digits need no escape */
}

/* s (n bytes, valid UTF-8) as a JSON string, quoted */
static void bfs__sb_json_str(bfs_sbuf *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20) { /* \n, \u001f...: jansson's own escapes */
            json_t *j = json_stringn(s, n);
            char *t = j ? bfs__json_dump(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
            if (t)
                bfs__sb_str(b, t);
            else
                b->oom = true;
            free(t);
            json_decref(j);
            return;
        }
    bfs__sb_put(b, "\"", 1);
    bfs__sb_escape(b, s, n, bfs__sb_put); /* escaped again where the whole is inside a string */
    bfs__sb_put(b, "\"", 1);
}

static void bfs__sb_shape(bfs_sbuf *b, const uint64_t *shape, int ndim)
{
    bfs__sb_raw(b, "[", 1);
    for (int d = 0; d < ndim; d++) {
        if (d)
            bfs__sb_raw(b, ",", 1);
        bfs__sb_u64(b, shape[d]);
    }
    bfs__sb_raw(b, "]", 1);
}

/* tensor i's name as a JSON string, from the plan's cache of each name's JSON length
 * (outside [0] and inside [1] a string) when there is one (issue 22: every file's header
 * counted and built, W x tensors names escaped over and over): counted from it, or copied
 * as it is where it says there is nothing to escape */
static void bfs__sb_name(bfs_sbuf *b, const bfs_plan *p, int i)
{
    const uint32_t *jl = p->name_jlen;
    if (b->count && jl && !b->oom) {
        b->n += jl[2 * (size_t)i + b->esc];
    } else if (jl && jl[2 * (size_t)i + 1] - jl[2 * (size_t)i] == 2) {
        /* nothing to escape (quoted: 2 bytes more; inside a string: 4), copied as it is */
        const size_t n = jl[2 * (size_t)i] - 2;
        bfs__sb_raw(b, b->esc ? "\\\"" : "\"", b->esc ? 2 : 1);
        bfs__sb_raw(b, p->t[i].name, n);
        bfs__sb_raw(b, b->esc ? "\\\"" : "\"", b->esc ? 2 : 1);
    } else {
        bfs__sb_json_str(b, p->t[i].name, strlen(p->t[i].name));
    }
}

/* ---- the header's entries, the fast way (issue 22: at W = 64 every rank file's header lists
 * all 92k tensors of DeepSeek-V3, 600 MB of text; through bfs__sb_raw a piece at a time
 * that was 10-15% of a run). Where the plan's cache says a name needs no escape, an
 * entry is counted by arithmetic and written straight into the buffer, which has room
 * for its longest form; every other entry (and a plan without the cache) goes the
 * general way above. The bytes are the same: tests/group_identical.sh and every test
 * that compares outputs with a whole run's or the upstream writer's. */
static size_t bfs__u64_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

static char *bfs__u64_put(char *o, uint64_t v)
{
    char t[20];
    size_t k = sizeof t;
    do {
        t[--k] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    memcpy(o, t + k, sizeof t - k);
    return o + (sizeof t - k);
}

/* "[a,b,c]" */
static size_t bfs__dims_len(const uint64_t *s, int ndim)
{
    size_t n = 2 + (ndim > 1 ? (size_t)ndim - 1 : 0);
    for (int d = 0; d < ndim; d++)
        n += bfs__u64_len(s[d]);
    return n;
}

static char *bfs__dims_put(char *o, const uint64_t *s, int ndim)
{
    *o++ = '[';
    for (int d = 0; d < ndim; d++) {
        if (d)
            *o++ = ',';
        o = bfs__u64_put(o, s[d]);
    }
    *o++ = ']';
    return o;
}

/* tensor ti's name as it goes in (quotes and all: b->esc's form) when the fast way takes it:
 * its bytes (no escape needed) in *name, their count in *nl; 0 when it does not */
static size_t bfs__fast_name(const bfs_sbuf *b, const bfs_plan *p, size_t ti, const char **name, size_t *nl)
{
    const uint32_t *jl = p->name_jlen;
    if (!jl || b->oom || jl[2 * ti + 1] - jl[2 * ti] != 2)
        return 0;
    *name = p->t[ti].name;
    *nl = jl[2 * ti] - 2;
    return jl[2 * ti + b->esc];
}

/* room to write an entry of a name of nl bytes and ndim dims straight in, or false */
static bool bfs__fast_room(const bfs_sbuf *b, size_t nl, int ndim)
{
    return !b->count && b->cap - b->n > nl + 160 + 21 * (size_t)ndim;
}

static const char bfs__so_key[] = ":{\\\"saved_offsets\\\":"; /* escaped: inside the string */
static const char bfs__k_dtype[] = ":{\"dtype\":\"", bfs__k_shape[] = "\",\"shape\":", bfs__k_off[] = ",\"data_offsets\":[";
#define BFS_PUT(o, lit) (memcpy((o), (lit), sizeof(lit) - 1), (o) += sizeof(lit) - 1)

/* DCP_SHARDING_INFO's entry of piece i (after ',' unless the first): 1 done, 0 not taken */
static int bfs__fast_so(bfs_sbuf *b, const bfs_plan *p, size_t i, const bfs_piece *pc, const uint64_t *so)
{
    const bfs_ltensor *t = &p->t[pc->tensor];
    const char *name;
    size_t nl = 0;
    const size_t jn = bfs__fast_name(b, p, pc->tensor, &name, &nl);
    if (!jn)
        return 0;
    if (b->count) {
        b->n += (i ? 1 : 0) + jn + sizeof bfs__so_key - 1 + bfs__dims_len(so, t->ndim) + 1;
        return 1;
    }
    if (!bfs__fast_room(b, nl, t->ndim))
        return 0;
    char *o = b->p + b->n;
    if (i)
        *o++ = ',';
    BFS_PUT(o, "\\\"");
    memcpy(o, name, nl);
    o += nl;
    BFS_PUT(o, "\\\"");
    BFS_PUT(o, bfs__so_key);
    o = bfs__dims_put(o, so, t->ndim);
    *o++ = '}';
    b->n = (size_t)(o - b->p);
    return 1;
}

/* the entry of a piece of shape[] at data offsets [pos, end) (after ','): 1 done, 0 not taken */
static int bfs__fast_entry(bfs_sbuf *b, const bfs_plan *p, const bfs_piece *pc, const uint64_t *shape, uint64_t pos,
                           uint64_t end)
{
    const bfs_ltensor *t = &p->t[pc->tensor];
    const char *name, *dt = bfs__dtype_name(t->out_dtype);
    size_t nl = 0;
    const size_t jn = bfs__fast_name(b, p, pc->tensor, &name, &nl), dl = strlen(dt);
    if (!jn || dl > 16)
        return 0;
    if (b->count) {
        b->n += 1 + jn + sizeof bfs__k_dtype - 1 + dl + sizeof bfs__k_shape - 1 + bfs__dims_len(shape, t->ndim) +
                sizeof bfs__k_off - 1 + bfs__u64_len(pos) + 1 + bfs__u64_len(end) + 2;
        return 1;
    }
    if (!bfs__fast_room(b, nl, t->ndim))
        return 0;
    char *o = b->p + b->n;
    *o++ = ',';
    *o++ = '"';
    memcpy(o, name, nl);
    o += nl;
    *o++ = '"';
    BFS_PUT(o, bfs__k_dtype);
    memcpy(o, dt, dl);
    o += dl;
    BFS_PUT(o, bfs__k_shape);
    o = bfs__dims_put(o, shape, t->ndim);
    BFS_PUT(o, bfs__k_off);
    o = bfs__u64_put(o, pos);
    *o++ = ',';
    o = bfs__u64_put(o, end);
    BFS_PUT(o, "]}");
    b->n = (size_t)(o - b->p);
    return 1;
}

/* File f's header up to its closing '}' (the pieces' nbytes set; their offsets counted
 * from the data section here). */
static void bfs__emit_header(const bfs_plan *p, const bfs_outfile *f, bfs_sbuf *b)
{
    const bool dcp = p->layout == BFS_LAYOUT_DCP;
    bfs__sb_str(b, "{\"__metadata__\":{");
    if (dcp) { /* a JSON text as a JSON string: {"name":{"saved_offsets":[r0,0..]},...} */
        bfs__sb_str(b, "\"DCP_SHARDING_INFO\":\"");
        b->esc = true;
        bfs__sb_put(b, "{", 1);
        for (size_t i = 0; i < f->npieces; i++) {
            const bfs_piece *pc = &f->pieces[i];
            const bfs_ltensor *t = &p->t[pc->tensor];
            uint64_t so[BFS_MAX_DIMS] = {0};
            so[0] = pc->row0;
            if (bfs__fast_so(b, p, i, pc, so))
                continue;
            if (i)
                bfs__sb_raw(b, ",", 1);
            bfs__sb_name(b, p, pc->tensor);
            bfs__sb_raw(b, bfs__so_key, sizeof bfs__so_key - 1);
            bfs__sb_shape(b, so, t->ndim);
            bfs__sb_raw(b, "}", 1);
        }
        bfs__sb_put(b, "}", 1);
        b->esc = false;
        bfs__sb_str(b, "\",\"DCP_VERSION\":\"1.0\",");
    }
    bfs__sb_str(b, "\"format\":\"pt\"}");
    uint64_t pos = 0;
    for (size_t i = 0; i < f->npieces; i++) {
        const bfs_piece *pc = &f->pieces[i];
        const bfs_ltensor *t = &p->t[pc->tensor];
        uint64_t shape[BFS_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (t->ndim > 0)
            shape[0] = pc->row1 - pc->row0;
        if (bfs__fast_entry(b, p, pc, shape, pos, pos + pc->nbytes)) {
            pos += pc->nbytes;
            continue;
        }
        const char *dt = bfs__dtype_name(t->out_dtype);
        bfs__sb_raw(b, ",", 1);
        bfs__sb_name(b, p, pc->tensor);
        bfs__sb_raw(b, bfs__k_dtype, sizeof bfs__k_dtype - 1);
        bfs__sb_raw(b, dt, strlen(dt));
        bfs__sb_raw(b, bfs__k_shape, sizeof bfs__k_shape - 1);
        bfs__sb_shape(b, shape, t->ndim);
        bfs__sb_raw(b, bfs__k_off, sizeof bfs__k_off - 1);
        bfs__sb_u64(b, pos);
        bfs__sb_raw(b, ",", 1);
        bfs__sb_u64(b, pos + pc->nbytes); /* bounded by the layout */
        bfs__sb_raw(b, "]}", 2);
        pos += pc->nbytes;
    }
    bfs__sb_put(b, "}", 1);
}

/* space padded: the data section starts on a 64-byte boundary */
static uint64_t bfs__padded_len(uint64_t n) { return ((8 + n + 63) / 64) * 64 - 8; }

/* f's header text into b (room for hl + 1 bytes), padded with spaces to hl, NUL after */
static int bfs__header_text(const bfs_plan *p, const bfs_outfile *f, bfs_sbuf *b)
{
    const uint64_t hl = f->data_start - 8;
    bfs__emit_header(p, f, b);
    if (b->oom)
        return bfs__err(BFS_ENOMEM, "%s: out of memory building its %llu-byte header", f->name, (unsigned long long)hl);
    if (bfs__padded_len(b->n) != hl || b->cap <= hl)
        return bfs__err(BFS_EINTERNAL, "%s: header of %zu bytes, the plan counted %llu", f->name, b->n,
                        (unsigned long long)hl);
    memset(b->p + b->n, ' ', (size_t)hl - b->n);
    b->p[hl] = '\0';
    return 0;
}

int bfs__plan_header(const bfs_plan *p, const bfs_outfile *f, char **out)
{
    const uint64_t hl = f->data_start - 8;
    *out = NULL;
    if (hl >= SIZE_MAX)
        return bfs__err(BFS_ENOMEM, "%s: out of memory building its %llu-byte header", f->name, (unsigned long long)hl);
    bfs_sbuf b = {.p = malloc((size_t)hl + 1), .cap = (size_t)hl + 1, .fixed = true}; /* the length counted */
    if (!b.p)
        return bfs__err(BFS_ENOMEM, "%s: out of memory building its %llu-byte header", f->name, (unsigned long long)hl);
    const int rc = bfs__header_text(p, f, &b);
    if (rc < 0) {
        free(b.p);
        return rc;
    }
    *out = b.p;
    return 0;
}

int bfs__plan_header_into(const bfs_plan *p, const bfs_outfile *f, char *buf, size_t cap)
{
    const uint64_t hl = f->data_start - 8;
    if (cap <= f->data_start)
        return bfs__err(BFS_EINTERNAL, "%s: a %zu-byte buffer for its %llu-byte header", f->name, cap,
                        (unsigned long long)f->data_start);
    bfs__st_put_len((uint8_t *)buf, hl); /* safetensors: the header's length, u64 little-endian */
    bfs_sbuf b = {.p = buf + 8, .cap = cap - 8, .fixed = true};
    return bfs__header_text(p, f, &b);
}

/* One file's offsets and size from its pieces (already in file order); its header is
 * counted, not kept. */
static int bfs__finish_file(bfs_plan *p, bfs_outfile *f)
{
    uint64_t pos = 0;
    for (size_t i = 0; i < f->npieces; i++) {
        bfs_piece *pc = &f->pieces[i];
        const bfs_ltensor *t = &p->t[pc->tensor];
        pc->nbytes = (pc->row1 - pc->row0) * t->row_elems * bfs__dtype_size(t->out_dtype);
        pc->offset = pos; /* relative for now */
        uint64_t end;
        if (!bfs__add_ok(pos, pc->nbytes, &end) || end > BFS_MAX_EXTENT)
            return bfs__err(BFS_EINPUT, "%s: tensor \"%s\": the file's data would exceed %llu bytes", f->name, t->name,
                            (unsigned long long)BFS_MAX_EXTENT);
        pos = end;
    }
    if (!p->name_jlen && !p->name_jlen_failed) { /* once a plan: each name's JSON length, both ways */
        p->name_jlen = malloc((p->nt + 1) * 2 * sizeof *p->name_jlen);
        for (size_t i = 0; p->name_jlen && i < p->nt; i++)
            for (int e = 0; e < 2 && p->name_jlen; e++) {
                bfs_sbuf c = {.count = true, .esc = e != 0};
                bfs__sb_json_str(&c, p->t[i].name, strlen(p->t[i].name));
                if (c.oom || c.n > UINT32_MAX) {
                    free(p->name_jlen);
                    p->name_jlen = NULL;
                } else {
                    p->name_jlen[2 * i + (size_t)e] = (uint32_t)c.n;
                }
            }
        p->name_jlen_failed = !p->name_jlen;
    }
    bfs_sbuf b = {.count = true}; /* no name cache (out of memory): every name counted */
    bfs__emit_header(p, f, &b);
    if (b.oom)
        return bfs__err(BFS_ENOMEM, "out of memory");
    const uint64_t hl = bfs__padded_len(b.n);
    if (hl > BFS_ST_MAX_HEADER)
        return bfs__err(BFS_EINPUT, "%s: its header (%zu tensors) would be %llu bytes, over the %llu-byte limit of safetensors readers; use a larger --world-size or fewer tensors per file",
                        f->name, f->npieces, (unsigned long long)hl, BFS_ST_MAX_HEADER);
    f->data_start = 8 + hl;
    for (size_t i = 0; i < f->npieces; i++)
        f->pieces[i].offset += f->data_start;
    if (!bfs__add_ok(f->data_start, pos, &f->size) || f->size > BFS_MAX_EXTENT ||
        !bfs__add_ok(p->total_bytes, pos, &p->total_bytes) || p->total_bytes > BFS_MAX_EXTENT)
        return bfs__err(BFS_EINPUT, "%s: the output would exceed %llu bytes", f->name, (unsigned long long)BFS_MAX_EXTENT);
    return 0;
}

/* Pieces in file order, as the upstream writer: alignment (dtype size) descending, then
 * name. The plan's tensors are sorted by name and a file's pieces are added in tensor
 * order, one per tensor, so a stable pass per alignment is that order (no name compared). */
static int bfs__file_order(const bfs_plan *p, bfs_outfile *f)
{
    static const size_t aligns[] = {8, 4, 2, 1};
    bfs_piece *o = malloc((f->npieces + 1) * sizeof *o);
    size_t n = 0;
    if (!o)
        return bfs__err(BFS_ENOMEM, "out of memory");
    for (size_t a = 0; a < sizeof aligns / sizeof *aligns; a++)
        for (size_t i = 0; i < f->npieces; i++)
            if (bfs__align_of(p->t[f->pieces[i].tensor].out_dtype) == aligns[a])
                o[n++] = f->pieces[i];
    if (n != f->npieces) { /* a dtype size outside {1, 2, 4, 8}: the comparison sort */
        free(o);
        qsort_r(f->pieces, f->npieces, sizeof *f->pieces, bfs__cmp_file_order, (void *)p);
        return 0;
    }
    memcpy(f->pieces, o, n * sizeof *o);
    free(o);
    return 0;
}

/* The rank files' pieces: tensor i has rows on ranks [0, n) (torch.chunk), so walking the
 * tensors once and each tensor's ranks costs the number of pieces, never ranks x tensors. */
static uint64_t bfs__dcp_ranks(const bfs_ltensor *t, uint64_t W)
{
    if (t->ndim == 0 || t->d0 == 0) /* a 0-d tensor cannot be chunked; an empty one is recorded once: rank 0 */
        return 1;
    const uint64_t chunk = (t->d0 + W - 1) / W;
    return (t->d0 + chunk - 1) / chunk;
}

static int bfs__layout_dcp(bfs_plan *p, uint64_t W, const bool *only)
{
    int rc = 0;
    char name[128];
    size_t *count = calloc(W, sizeof *count);
    /* a part (only): the files it does not write get no pieces (their tensors x ranks of
     * plan were most of its layout and memory), their data bytes only, for the plan's total */
    uint64_t *bytes = only ? calloc(W, sizeof *bytes) : NULL;
    p->files = calloc(W, sizeof *p->files);
    if (!count || !p->files || (only && !bytes))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (size_t i = 0; i < p->nt; i++) {
        const bfs_ltensor *t = &p->t[i];
        const uint64_t rb = t->row_elems * bfs__dtype_size(t->out_dtype);
        for (uint64_t r = 0, n = bfs__dcp_ranks(t, W); r < n; r++) {
            count[r]++;
            if (only && !only[r]) {
                uint64_t a = 0, b = t->ndim == 0 ? 1 : 0;
                if (t->ndim > 0)
                    bfs__chunk_rows(t->d0, W, r, &a, &b);
                bytes[r] += (b - a) * rb; /* bounded: the tensor's bytes were checked by the plan */
            }
        }
    }
    size_t first_nd = p->nt; /* the first tensor that has a dim 0, for ranks without rows */
    for (size_t i = 0; i < p->nt && first_nd == p->nt; i++)
        if (p->t[i].ndim > 0)
            first_nd = i;
    for (uint64_t r = 0; r < W; r++) {
        bfs_outfile *f = &p->files[r];
        p->nfiles = (int)r + 1;
        snprintf(name, sizeof name, "shard-%05llu-model-00001-of-00001.safetensors", (unsigned long long)r + 1);
        f->name = bfs__strdup(name);
        f->pieces = calloc(only && !only[r] ? 1 : count[r] + 1, sizeof *f->pieces);
        if (!f->name || !f->pieces)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < p->nt; i++) {
        const bfs_ltensor *t = &p->t[i];
        for (uint64_t r = 0, n = bfs__dcp_ranks(t, W); r < n; r++) {
            if (only && !only[r])
                continue;
            uint64_t a = 0, b = t->ndim == 0 ? 1 : 0;
            if (t->ndim > 0)
                bfs__chunk_rows(t->d0, W, r, &a, &b);
            bfs_outfile *f = &p->files[r];
            f->pieces[f->npieces++] = (bfs_piece){.tensor = (int)i, .row0 = a, .row1 = b};
        }
    }
    for (uint64_t r = 0; r < W; r++) {
        bfs_outfile *f = &p->files[r];
        if (only && !only[r]) { /* another part's: no pieces, no header, size 0; its data counted */
            if (!bfs__add_ok(p->total_bytes, bytes[r], &p->total_bytes) || p->total_bytes > BFS_MAX_EXTENT)
                BFS_FAIL(BFS_EINPUT, "%s: the output would exceed %llu bytes", f->name, (unsigned long long)BFS_MAX_EXTENT);
            continue;
        }
        /* A rank with no rows of any tensor still gets one entry, zero rows at offset d0
         * (what torch's HuggingFaceStorageWriter writes for an empty shard): torch's
         * consolidate_safetensors_files rejects a file whose DCP_SHARDING_INFO is {}. */
        if (f->npieces == 0 && first_nd < p->nt)
            f->pieces[f->npieces++] = (bfs_piece){.tensor = (int)first_nd, .row0 = p->t[first_nd].d0, .row1 = p->t[first_nd].d0};
        BFS_TRY(bfs__file_order(p, f));
        BFS_TRY(bfs__finish_file(p, f));
    }
cleanup:
    free(count);
    free(bytes);
    return rc;
}

/* greedy split in name order, as transformers' save_pretrained */
static int bfs__layout_hf(bfs_plan *p, uint64_t max)
{
    int rc = 0, nf = 0;
    char name[128];
    uint64_t cur = 0;
    int *which = calloc(p->nt ? p->nt : 1, sizeof *which);
    size_t *count = calloc(p->nt + 1, sizeof *count);
    if (!which || !count)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (size_t i = 0; i < p->nt; i++) {
        const uint64_t nb = p->t[i].d0 * p->t[i].row_elems * bfs__dtype_size(p->t[i].out_dtype);
        if (nf == 0 || (cur > 0 && (cur + nb > max || cur + nb < cur))) {
            nf++;
            cur = 0;
        }
        cur += nb;
        which[i] = nf - 1;
        count[nf - 1]++;
    }
    if (nf == 0)
        nf = 1;
    p->files = calloc((size_t)nf, sizeof *p->files);
    if (!p->files)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (int k = 0; k < nf; k++) {
        bfs_outfile *f = &p->files[k];
        p->nfiles = k + 1;
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, nf);
        f->name = bfs__strdup(name);
        f->pieces = calloc(count[k] + 1, sizeof *f->pieces);
        if (!f->name || !f->pieces)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < p->nt; i++) {
        bfs_outfile *f = &p->files[which[i]];
        f->pieces[f->npieces++] = (bfs_piece){.tensor = (int)i, .row0 = 0, .row1 = p->t[i].d0};
    }
    for (int k = 0; k < nf; k++) {
        bfs_outfile *f = &p->files[k];
        BFS_TRY(bfs__file_order(p, f));
        BFS_TRY(bfs__finish_file(p, f));
    }
cleanup:
    free(which);
    free(count);
    return rc;
}

int bfs__plan_layout(bfs_plan *p, const bfs_convert_opts *o) { return bfs__plan_layout_for(p, o, NULL); }

int bfs__plan_layout_for(bfs_plan *p, const bfs_convert_opts *o, const bool *only)
{
    p->world_size = o->world_size;
    p->layout = o->layout;
    p->total_bytes = 0;
    if (o->layout == BFS_LAYOUT_DCP)
        return bfs__layout_dcp(p, (uint64_t)o->world_size, only);
    return bfs__layout_hf(p, o->max_shard_size ? o->max_shard_size : 5000000000ull);
}
