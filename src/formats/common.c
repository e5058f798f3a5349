/*
 * Small helpers shared by the format files in src/formats/: string suffixes
 * and joins, a raw tensor's file for messages, shapes as text, and the derived
 * shape fields every planned tensor needs.
 */
#include "format.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

bool bfs__str_ends(const char *s, const char *suffix)
{
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

char *bfs__str_cat2(const char *a, const char *b)
{
    const size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nb + 1);
    if (s) {
        memcpy(s, a, na);
        memcpy(s + na, b, nb + 1);
    }
    return s;
}

char *bfs__str_ndup(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

const char *bfs__raw_path(const bfs_input *in, const bfs_raw *r) { return in->files[r->file].path; }

void bfs__shape_str(const uint64_t *shape, int ndim, char *buf, size_t cap)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k, "[");
    for (int d = 0; d < ndim && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, d ? ", %llu" : "%llu", (unsigned long long)shape[d]);
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
}

void bfs__finish_shape(bfs_ltensor *t)
{
    t->d0 = t->ndim == 0 ? 1 : t->shape[0];
    t->row_elems = 1;
    for (int d = 1; d < t->ndim; d++)
        t->row_elems *= t->shape[d]; /* bounded by the validated input sizes */
}

/* ---- quantization_config helpers (FP8, INT4, NVFP4 formats) -------------------------- */
const char *bfs__qc_method(const bfs_fctx *c) { return c->method; }

bool bfs__qc_is(const bfs_fctx *c, const char *method) { return c->method && strcasecmp(c->method, method) == 0; }

bool bfs__qc_is_scaled(const bfs_fctx *c)
{
    return bfs__qc_is(c, "fp8") || bfs__qc_is(c, "compressed-tensors") || bfs__qc_is(c, "modelopt");
}

const char *bfs__qc_str(const json_t *o, const char *key)
{
    const json_t *v = o ? json_object_get(o, key) : NULL;
    return json_is_string(v) ? json_string_value(v) : NULL;
}

int64_t bfs__qc_int(const json_t *o, const char *key)
{
    const json_t *v = o ? json_object_get(o, key) : NULL;
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

const json_t *bfs__ct_group_next(const bfs_fctx *c, void **it, const char **format)
{
    json_t *groups = c->qconfig ? json_object_get(c->qconfig, "config_groups") : NULL;
    if (!json_is_object(groups))
        return NULL;
    *it = *it ? json_object_iter_next(groups, *it) : json_object_iter(groups);
    if (!*it)
        return NULL;
    const json_t *g = json_object_iter_value(*it);
    const char *f = bfs__qc_str(g, "format");
    *format = f ? f : bfs__qc_str(c->qconfig, "format");
    if (!*format)
        *format = "";
    const json_t *w = json_object_get(g, "weights");
    return json_is_object(w) ? w : json_null();
}

const json_t *bfs__ct_group_weights(const bfs_fctx *c, size_t k, const char **format)
{
    void *it = NULL;
    const json_t *w = NULL;
    for (size_t i = 0; i <= k; i++)
        if (!(w = bfs__ct_group_next(c, &it, format)))
            return NULL;
    return w;
}

bfs_raw *bfs__sibling(const bfs_input *in, const char *base, const char *suffix, int *rc)
{
    char *n = bfs__str_cat2(base, suffix);
    *rc = 0;
    if (!n) {
        *rc = bfs__err(BFS_ENOMEM, "out of memory");
        return NULL;
    }
    bfs_raw *r = (bfs_raw *)bfs__input_find(in, n);
    free(n);
    return r;
}

bfs_raw *bfs__sibling_of(const bfs_input *in, const bfs_raw *w, const char *suffix, int *rc)
{
    /* raw[] is sorted by name: the names that extend w's follow it in one run */
    const char *base = w->st->name;
    const size_t bl = strlen(base);
    *rc = 0;
    if (w < in->raw || w >= in->raw + in->nraw)
        return bfs__sibling(in, base, suffix, rc);
    for (const bfs_raw *x = w + 1; x < in->raw + in->nraw; x++) {
        if (strncmp(x->st->name, base, bl) != 0)
            return NULL; /* the run is over: no such name */
        if (strcmp(x->st->name + bl, suffix) == 0)
            return (bfs_raw *)x;
        if (x == w + 4)
            break; /* a long run: looked up by hash */
    }
    return bfs__sibling(in, base, suffix, rc);
}

uint64_t bfs__raw_nelem(const bfs_raw *r)
{
    uint64_t n = 1;
    for (int d = 0; d < r->st->ndim; d++)
        n *= r->st->shape[d]; /* bounded: the file holds n * dtype size bytes */
    return n;
}

bool bfs__raw_shape_is(const bfs_raw *r, int ndim, uint64_t d0, uint64_t d1)
{
    return r->st->ndim == ndim && (ndim < 1 || r->st->shape[0] == d0) && (ndim < 2 || r->st->shape[1] == d1);
}
