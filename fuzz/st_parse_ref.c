/*
 * The oracle of the safetensors header parser: bfs__st_parse as it was on a jansson tree
 * (json_loadb(JSON_REJECT_DUPLICATES), then the rules on the tree), before the streamed
 * scanner replaced it. fz_st_differ() runs both on one image: they must accept
 * the same headers with the same table and __metadata__ text, and refuse the same ones,
 * with the same message where it is not jansson's own JSON error text. Included by
 * fuzz/fuzz_st_parse.c and tests/test_st_scan.c.
 */
#include "../tests/bfs_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fz_ref_cmp_begin(const void *a, const void *b)
{
    const bfs_st_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int fz_ref_u64_of(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int fz_st_parse_ref(const uint8_t *buf, uint64_t file_size, const char *what, bfs_st_header *h)
{
    int rc = 0;
    json_t *root = NULL;
    json_error_t jerr;
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

    /* no JSON_ALLOW_NUL: a NUL inside a string ("F32\u0000x") would make a C string that
     * means something else than the JSON ("F32") */
    root = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        BFS_FAIL(BFS_EINPUT, "%s: header is not valid JSON at header byte %d (file offset %llu): %s", what,
                 jerr.position, (unsigned long long)(8 + (uint64_t)(jerr.position > 0 ? jerr.position : 0)), jerr.text);
    if (!json_is_object(root))
        BFS_FAIL(BFS_EINPUT, "%s: header is not a JSON object", what);

    const size_t cap = json_object_size(root);
    h->t = calloc(cap ? cap : 1, sizeof *h->t);
    if (!h->t)
        BFS_FAIL(BFS_ENOMEM, "%s: out of memory for %zu header entries", what, cap);

    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strlen(key) != strnlen(key, 4096) || strlen(key) == 0)
            BFS_FAIL(BFS_EINPUT, "%s: header has an empty or overlong tensor name", what);
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(val))
                BFS_FAIL(BFS_EINPUT, "%s: __metadata__ is not an object", what);
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv))
                    BFS_FAIL(BFS_EINPUT, "%s: __metadata__ value of \"%s\" is not a string", what, mk);
            }
            h->metadata_json = bfs__json_dump(val, JSON_COMPACT | JSON_SORT_KEYS);
            continue;
        }
        bfs_st_tensor *t = &h->t[h->n];
        if (!json_is_object(val))
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\": header entry is not an object", what, key);
        const json_t *jd = json_object_get(val, "dtype");
        const json_t *js = json_object_get(val, "shape");
        const json_t *jo = json_object_get(val, "data_offsets");
        if (!json_is_string(jd))
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\": missing or non-string \"dtype\"", what, key);
        if (strlen(json_string_value(jd)) != json_string_length(jd) || bfs__dtype_parse(json_string_value(jd), &t->dtype) != 0)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\": unsupported dtype \"%s\"", what, key, json_string_value(jd));
        if (!json_is_array(js))
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\": missing or non-array \"shape\"", what, key);
        if (json_array_size(js) > BFS_MAX_DIMS)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\": %zu dimensions, at most %d supported", what, key,
                     json_array_size(js), BFS_MAX_DIMS);
        t->ndim = (int)json_array_size(js);
        uint64_t elems = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (fz_ref_u64_of(json_array_get(js, (size_t)d), &t->shape[d]) != 0)
                BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\": shape[%d] is not a non-negative integer", what, key, d);
            if (!bfs__mul_ok(elems, t->shape[d], &elems))
                BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\": shape product overflows", what, key);
        }
        uint64_t nbytes;
        if (!bfs__mul_ok(elems, bfs__dtype_size(t->dtype), &nbytes))
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\": byte size overflows", what, key);
        /* a zero dimension makes the product 0 whatever the others are: check them too,
         * so that no partial product a planner forms from this shape can wrap */
        if (!bfs__shape_ok(t->shape, t->ndim, bfs__dtype_size(t->dtype)))
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\": shape too large (its non-zero dimensions times %zu bytes exceed %llu)",
                     what, key, bfs__dtype_size(t->dtype), (unsigned long long)BFS_MAX_EXTENT);
        if (!json_is_array(jo) || json_array_size(jo) != 2 ||
            fz_ref_u64_of(json_array_get(jo, 0), &t->begin) != 0 ||
            fz_ref_u64_of(json_array_get(jo, 1), &t->end) != 0)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\": \"data_offsets\" is not two non-negative integers", what, key);
        if (t->end < t->begin)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\": data_offsets [%llu, %llu] end before begin", what, key,
                     (unsigned long long)t->begin, (unsigned long long)t->end);
        if (t->end - t->begin != nbytes)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\": data_offsets [%llu, %llu] hold %llu bytes but %s x shape needs %llu",
                     what, key, (unsigned long long)t->begin, (unsigned long long)t->end,
                     (unsigned long long)(t->end - t->begin), bfs__dtype_name(t->dtype), (unsigned long long)nbytes);
        if (t->end > h->data_size)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\": data ends at file offset %llu, past the end of the file (%llu bytes; truncated?)",
                     what, key, (unsigned long long)(h->data_start + t->end), (unsigned long long)file_size);
        t->name = bfs__strdup(key);
        if (!t->name)
            BFS_FAIL(BFS_ENOMEM, "%s: out of memory", what);
        h->n++;
    }

    qsort(h->t, h->n, sizeof *h->t, fz_ref_cmp_begin);
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
    json_decref(root);
    if (rc < 0)
        bfs__st_header_free(h);
    return rc;
}

/* Both parsers on one image: NULL when they agree, else what differs (in a static buffer).
 * A failed allocation in either is no disagreement. */
static const char *fz_st_differ(const uint8_t *buf, uint64_t file_size, const char *what)
{
    static char why[2200];
    char msg[1024];
    bfs_st_header a, b;
    bfs__err_clear();
    const int ra = bfs__st_parse(buf, file_size, what, &a);
    snprintf(msg, sizeof msg, "%s", bfs_last_error());
    bfs__err_clear();
    const int rb = fz_st_parse_ref(buf, file_size, what, &b);
    const char *ref = bfs_last_error();
    why[0] = '\0';
    if (ra == BFS_ENOMEM || rb == BFS_ENOMEM) {
    } else if ((ra == 0) != (rb == 0)) {
        snprintf(why, sizeof why, "scanner %d (%s), jansson %d (%s)", ra, msg, rb, ref);
    } else if (ra != 0) {
        const bool ja = strstr(msg, "is not valid JSON") != NULL, jb = strstr(ref, "is not valid JSON") != NULL;
        if (ja != jb || (!ja && strcmp(msg, ref) != 0))
            snprintf(why, sizeof why, "scanner: %s; jansson: %s", msg, ref);
    } else if (a.n != b.n || a.header_len != b.header_len || a.data_start != b.data_start || a.data_size != b.data_size) {
        snprintf(why, sizeof why, "%zu tensors, jansson %zu", a.n, b.n);
    } else if ((a.metadata_json == NULL) != (b.metadata_json == NULL) ||
               (a.metadata_json && strcmp(a.metadata_json, b.metadata_json) != 0)) {
        snprintf(why, sizeof why, "__metadata__ %s, jansson %s", a.metadata_json ? a.metadata_json : "none",
                 b.metadata_json ? b.metadata_json : "none");
    } else {
        for (size_t i = 0; i < a.n && !why[0]; i++) {
            const bfs_st_tensor *x = &a.t[i], *y = &b.t[i];
            if (strcmp(x->name, y->name) != 0 || x->dtype != y->dtype || x->ndim != y->ndim || x->begin != y->begin ||
                x->end != y->end || memcmp(x->shape, y->shape, sizeof x->shape) != 0)
                snprintf(why, sizeof why, "tensor %zu: \"%s\", jansson \"%s\"", i, x->name, y->name);
        }
    }
    if (ra == 0)
        bfs__st_header_free(&a);
    if (rb == 0)
        bfs__st_header_free(&b);
    return why[0] ? why : NULL;
}
