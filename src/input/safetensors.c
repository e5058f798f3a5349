/*
 * safetensors reader. The format (huggingface/safetensors, src/tensor.rs):
 *   1. bytes 0..8: little-endian u64 N, the header length; N <= 100,000,000;
 *   2. bytes 8..8+N: UTF-8 JSON object, starting with '{', possibly space padded;
 *      entries "name": {"dtype", "shape", "data_offsets": [begin, end]} and an
 *      optional "__metadata__": {string: string};
 *   3. bytes 8+N..EOF: the data section. Sorted by offset, the tensors cover it
 *      exactly: no gap, no overlap; end - begin == prod(shape) * sizeof(dtype).
 * Nothing read here is trusted: every number is checked before use. This file owns
 * the byte rules (safetensors.h): the length prefix, its limit, the header's padding.
 */
#include "input/input.h"
#include "input/safetensors.h"
#include "base/json_scan.h"

#include <assert.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bfs__cmp_begin(const void *a, const void *b)
{
    const bfs_st_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

int bfs__st_header_len(const uint8_t prefix[8], uint64_t file_size, const char *what, uint64_t *n)
{
    assert(file_size >= 8);
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | prefix[i];
    *n = v;
    if (v > BFS_ST_MAX_HEADER)
        return bfs__err(BFS_EINPUT, "%s: header length %llu at offset 0 exceeds the %llu-byte limit", what,
                        (unsigned long long)v, BFS_ST_MAX_HEADER);
    if (v > file_size - 8)
        return bfs__err(BFS_EINPUT, "%s: header length %llu at offset 0 runs past the end of the file (%llu bytes; truncated?)",
                        what, (unsigned long long)v, (unsigned long long)file_size);
    return 0;
}

void bfs__st_put_len(uint8_t prefix[8], uint64_t n)
{
    for (int i = 0; i < 8; i++)
        prefix[i] = (uint8_t)(n >> (8 * i));
}

char *bfs__st_header_text(const json_t *hdr, size_t align, size_t *len)
{
    assert(align > 0);
    char *text = bfs__json_dump(hdr, JSON_COMPACT);
    if (!text)
        return NULL;
    const size_t n = strlen(text), hl = ((8 + n + align - 1) / align) * align - 8;
    char *out = malloc(hl + 1);
    if (out) {
        memcpy(out, text, n);
        memset(out + n, ' ', hl - n);
        out[hl] = '\0';
        *len = hl;
    }
    free(text);
    return out;
}

void bfs__st_header_free(bfs_st_header *h)
{
    if (!h)
        return;
    for (size_t i = 0; i < h->n; i++)
        free(h->t[i].name);
    free(h->t);
    free(h->metadata_json);
    memset(h, 0, sizeof *h);
}

/* ---- the header, streamed ----------------------------------------------------------------
 * One pass of the JSON scanner (base/json_scan.h: jansson's grammar, duplicate keys refused
 * in every object) fills the table: no tree, memory is the table, the names, the scanner's
 * key sets and __metadata__'s pairs. The rules on what the JSON says are checked in the
 * order they were on the jansson tree: a refusal of what a tensor's entry says is kept
 * (st_refuse) while the rest of the text is scanned, because any JSON error anywhere in
 * the header is reported first, as json_loadb found it before anything was looked at. */
enum { ST_REFUSED = 1 };
#define ST_NEXT(r, tok)                                  \
    do {                                                 \
        const int rc_ = bfs__js_next(&(r)->js, &(tok)); \
        if (rc_)                                         \
            return rc_;                                  \
    } while (0)
 /* an entry broke a rule: the message is in r->msg */

typedef struct {
    uint32_t koff, voff;   /* s_off of a __metadata__ key and of its string value */
    uint32_t kraw, vraw;   /* their raw lengths */
} st_meta;

typedef struct {
    bfs_jscan js;
    const char *what;
    bfs_st_header *h;
    size_t cap;            /* h->t's room */
    st_meta *meta;
    size_t nmeta, metacap;
    bool has_meta;
    char msg[1024];
} st_rd;

/* what one tensor's entry holds, as read: fields absent, of another type, or their values */
typedef struct {
    bool d_has, d_str, s_has, s_arr, o_has, o_arr;
    char d[1024];          /* "dtype", decoded; cut at the length of a message */
    size_t d_len, s_n, o_n;
    bool s_ok[BFS_MAX_DIMS], o_ok[2]; /* a non-negative integer */
    uint64_t s_v[BFS_MAX_DIMS], o_v[2];
} st_fields;

__attribute__((format(printf, 2, 3))) static int st_refuse(st_rd *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    return ST_REFUSED;
}

/* an array's elements: how many, and the first max of them as non-negative integers */
static int st_uints(st_rd *r, bool *has, bool *arr, size_t *n, bool *ok, uint64_t *v, size_t max)
{
    bfs_jtok tok;
    ST_NEXT(r, tok);
    *has = true;
    *arr = tok == BFS_JT_ARR;
    if (!*arr)
        return bfs__js_skip(&r->js, tok);
    for (*n = 0;; (*n)++) {
        ST_NEXT(r, tok);
        if (tok == BFS_JT_ARR_END)
            return 0;
        if (*n < max) {
            ok[*n] = tok == BFS_JT_INT && r->js.ival >= 0;
            v[*n] = ok[*n] ? (uint64_t)r->js.ival : 0;
        }
        const int rc = bfs__js_skip(&r->js, tok);
        if (rc)
            return rc;
    }
}

static int st_fields_read(st_rd *r, st_fields *f)
{
    bfs_jtok tok;
    for (;;) {
        ST_NEXT(r, tok);
        if (tok == BFS_JT_OBJ_END)
            return 0;
        const char *k = bfs__js_str(&r->js, NULL);
        if (!k)
            return BFS_ENOMEM;
        int rc = 0;
        if (strcmp(k, "dtype") == 0) {
            ST_NEXT(r, tok);
            f->d_has = true;
            f->d_str = tok == BFS_JT_STR;
            if (f->d_str) {
                const char *d = bfs__js_str(&r->js, &f->d_len);
                if (!d)
                    return BFS_ENOMEM;
                snprintf(f->d, sizeof f->d, "%s", d);
            }
            rc = bfs__js_skip(&r->js, tok);
        } else if (strcmp(k, "shape") == 0) {
            rc = st_uints(r, &f->s_has, &f->s_arr, &f->s_n, f->s_ok, f->s_v, BFS_MAX_DIMS);
        } else if (strcmp(k, "data_offsets") == 0) {
            rc = st_uints(r, &f->o_has, &f->o_arr, &f->o_n, f->o_ok, f->o_v, 2);
        } else { /* other fields are allowed, and ignored */
            ST_NEXT(r, tok);
            rc = bfs__js_skip(&r->js, tok);
        }
        if (rc)
            return rc;
    }
}

/* The entry of tensor t (its name set) read and checked: 0, ST_REFUSED, or the scanner's error */
static int st_entry(st_rd *r, bfs_st_tensor *t)
{
    const char *what = r->what, *key = t->name;
    const uint64_t data_size = r->h->data_size, data_start = r->h->data_start;
    bfs_jtok tok;
    ST_NEXT(r, tok);
    if (tok != BFS_JT_OBJ)
        return st_refuse(r, "%s: tensor \"%s\": header entry is not an object", what, key);
    st_fields f = {0};
    const int rc = st_fields_read(r, &f);
    if (rc)
        return rc;
    if (!f.d_str)
        return st_refuse(r, "%s: tensor \"%s\": missing or non-string \"dtype\"", what, key);
    if (f.d_len >= sizeof f.d || bfs__dtype_parse(f.d, &t->dtype) != 0)
        return st_refuse(r, "%s: tensor \"%s\": unsupported dtype \"%s\"", what, key, f.d);
    if (!f.s_arr)
        return st_refuse(r, "%s: tensor \"%s\": missing or non-array \"shape\"", what, key);
    if (f.s_n > BFS_MAX_DIMS)
        return st_refuse(r, "%s: tensor \"%s\": %zu dimensions, at most %d supported", what, key, f.s_n, BFS_MAX_DIMS);
    t->ndim = (int)f.s_n;
    uint64_t elems = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (!f.s_ok[d])
            return st_refuse(r, "%s: tensor \"%s\": shape[%d] is not a non-negative integer", what, key, d);
        t->shape[d] = f.s_v[d];
        if (!bfs__mul_ok(elems, t->shape[d], &elems))
            return st_refuse(r, "%s: tensor \"%s\": shape product overflows", what, key);
    }
    uint64_t nbytes;
    if (!bfs__mul_ok(elems, bfs__dtype_size(t->dtype), &nbytes))
        return st_refuse(r, "%s: tensor \"%s\": byte size overflows", what, key);
    /* a zero dimension makes the product 0 whatever the others are: check them too,
     * so that no partial product a planner forms from this shape can wrap */
    if (!bfs__shape_ok(t->shape, t->ndim, bfs__dtype_size(t->dtype)))
        return st_refuse(r, "%s: tensor \"%s\": shape too large (its non-zero dimensions times %zu bytes exceed %llu)",
                         what, key, bfs__dtype_size(t->dtype), (unsigned long long)BFS_MAX_EXTENT);
    if (!f.o_arr || f.o_n != 2 || !f.o_ok[0] || !f.o_ok[1])
        return st_refuse(r, "%s: tensor \"%s\": \"data_offsets\" is not two non-negative integers", what, key);
    t->begin = f.o_v[0];
    t->end = f.o_v[1];
    if (t->end < t->begin)
        return st_refuse(r, "%s: tensor \"%s\": data_offsets [%llu, %llu] end before begin", what, key,
                         (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end - t->begin != nbytes)
        return st_refuse(r, "%s: tensor \"%s\": data_offsets [%llu, %llu] hold %llu bytes but %s x shape needs %llu",
                         what, key, (unsigned long long)t->begin, (unsigned long long)t->end,
                         (unsigned long long)(t->end - t->begin), bfs__dtype_name(t->dtype), (unsigned long long)nbytes);
    if (t->end > data_size)
        return st_refuse(r, "%s: tensor \"%s\": data ends at file offset %llu, past the end of the file (%llu bytes; truncated?)",
                         what, key, (unsigned long long)(data_start + t->end), (unsigned long long)(data_start + data_size));
    return 0;
}

/* __metadata__: an object of strings, its pairs kept (as places in the text) */
static int st_metadata(st_rd *r)
{
    bfs_jtok tok;
    r->has_meta = true;
    ST_NEXT(r, tok);
    if (tok != BFS_JT_OBJ)
        return st_refuse(r, "%s: __metadata__ is not an object", r->what);
    for (;;) {
        ST_NEXT(r, tok);
        if (tok == BFS_JT_OBJ_END)
            return 0;
        const st_meta m = {(uint32_t)r->js.s_off, 0, (uint32_t)r->js.s_raw, 0};
        ST_NEXT(r, tok);
        if (tok != BFS_JT_STR) {
            const char *mk = bfs__js_str_at(&r->js, m.koff, NULL);
            return mk ? st_refuse(r, "%s: __metadata__ value of \"%s\" is not a string", r->what, mk) : BFS_ENOMEM;
        }
        if (bfs__grow((void **)&r->meta, &r->metacap, r->nmeta + 1, sizeof *r->meta) != 0)
            return BFS_ENOMEM;
        r->meta[r->nmeta] = m;
        r->meta[r->nmeta].voff = (uint32_t)r->js.s_off;
        r->meta[r->nmeta].vraw = (uint32_t)r->js.s_raw;
        r->nmeta++;
    }
}

static int st_meta_cmp(const void *a, const void *b, void *js)
{
    return bfs__js_strcmp(js, ((const st_meta *)a)->koff, ((const st_meta *)b)->koff);
}

/* __metadata__ as json_dumps(JSON_COMPACT | JSON_SORT_KEYS) wrote it from the tree */
static int st_meta_dump(st_rd *r)
{
    size_t cap = 3;
    for (size_t i = 0; i < r->nmeta; i++)
        cap += (size_t)r->meta[i].kraw + r->meta[i].vraw + 6;
    char *out = malloc(cap);
    if (!out)
        return BFS_ENOMEM;
    if (r->nmeta > 1) /* with none, meta is NULL: not for qsort_r */
        qsort_r(r->meta, r->nmeta, sizeof *r->meta, st_meta_cmp, &r->js);
    size_t n = 0;
    out[n++] = '{';
    for (size_t i = 0; i < r->nmeta; i++) {
        if (i)
            out[n++] = ',';
        n += bfs__js_dump_str(&r->js, r->meta[i].koff, out + n);
        out[n++] = ':';
        n += bfs__js_dump_str(&r->js, r->meta[i].voff, out + n);
    }
    out[n++] = '}';
    out[n] = '\0';
    r->h->metadata_json = out;
    return 0;
}

/* a top-level member: its key just read */
static int st_member(st_rd *r)
{
    bfs_st_header *h = r->h;
    size_t klen = 0;
    const char *key = bfs__js_str(&r->js, &klen);
    if (!key)
        return BFS_ENOMEM;
    if (klen == 0 || klen > 4096)
        return st_refuse(r, "%s: header has an empty or overlong tensor name", r->what);
    if (strcmp(key, "__metadata__") == 0)
        return st_metadata(r);
    if (bfs__grow((void **)&h->t, &r->cap, h->n + 1, sizeof *h->t) != 0)
        return BFS_ENOMEM;
    bfs_st_tensor *t = &h->t[h->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = bfs__strdup(key)))
        return BFS_ENOMEM;
    h->n++; /* freed with the table whatever comes */
    const int rc = st_entry(r, t);
    if (rc == 0)
        return 0;
    free(t->name);
    h->n--;
    return rc;
}

/* The top object's members into the table: 0; BFS_EINPUT, BFS_ENOMEM with the message set */
static int st_scan(st_rd *r)
{
    bfs_jtok tok;
    int rc = bfs__js_next(&r->js, &tok);
    assert(rc != 0 || tok == BFS_JT_OBJ); /* the caller saw the '{' */
    while (rc == 0) {
        rc = bfs__js_next(&r->js, &tok);
        if (rc == 0 && tok == BFS_JT_OBJ_END)
            break;
        if (rc == 0)
            rc = st_member(r);
    }
    const bool refused = rc == ST_REFUSED;
    while (rc == ST_REFUSED || (rc == 0 && tok != BFS_JT_END)) /* the rest, for a JSON error in it */
        rc = bfs__js_next(&r->js, &tok);
    if (rc == 0 && r->has_meta && !refused)
        rc = st_meta_dump(r);
    if (rc == BFS_ENOMEM)
        return bfs__err(BFS_ENOMEM, "%s: out of memory reading the header (%zu tensors so far)", r->what, r->h->n);
    if (rc)
        return bfs__err(BFS_EINPUT, "%s: header is not valid JSON at header byte %zu (file offset %llu): %s", r->what,
                        r->js.why_at, (unsigned long long)(8 + r->js.why_at), r->js.why);
    if (refused)
        return bfs__err(BFS_EINPUT, "%s", r->msg);
    return 0;
}

int bfs__st_parse(const uint8_t *buf, uint64_t file_size, const char *what, bfs_st_header *h)
{
    int rc = 0;
    st_rd r = {.what = what, .h = h};
    memset(h, 0, sizeof *h);

    if (file_size < 8)
        BFS_FAIL(BFS_EINPUT, "%s: %llu bytes, too short for a safetensors file (needs the 8-byte header length at offset 0)",
                 what, (unsigned long long)file_size);
    uint64_t n = 0;
    BFS_TRY(bfs__st_header_len(buf, file_size, what, &n));
    if (n < 2 || buf[8] != '{')
        BFS_FAIL(BFS_EINPUT, "%s: header at offset 8 does not start with '{'", what);
    h->header_len = n;
    h->data_start = 8 + n;
    h->data_size = file_size - h->data_start;

    if (bfs__grow((void **)&h->t, &r.cap, 1, sizeof *h->t) != 0) /* a table even when empty */
        BFS_FAIL(BFS_ENOMEM, "%s: out of memory for the header's entries", what);
    BFS_TRY(bfs__js_init(&r.js, (const char *)buf + 8, (size_t)n));
    BFS_TRY(st_scan(&r));

    qsort(h->t, h->n, sizeof *h->t, bfs__cmp_begin);
    uint64_t pos = 0;
    for (size_t i = 0; i < h->n; i++) {
        const bfs_st_tensor *t = &h->t[i];
        if (t->begin != pos)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\": data begins at file offset %llu but the previous tensor ends at %llu (%s)",
                     what, t->name, (unsigned long long)(h->data_start + t->begin),
                     (unsigned long long)(h->data_start + pos), t->begin > pos ? "gap" : "overlap");
        pos = t->end;
    }
    if (pos != h->data_size)
        BFS_FAIL(BFS_EINPUT, "%s: tensors end at file offset %llu but the file has %llu bytes (trailing data or truncated)",
                 what, (unsigned long long)(h->data_start + pos), (unsigned long long)file_size);

cleanup:
    bfs__js_free(&r.js);
    free(r.meta);
    if (rc < 0)
        bfs__st_header_free(h);
    return rc;
}
