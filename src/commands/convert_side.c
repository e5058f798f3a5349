/*
 * convert's side files (the input folder's files beside the weights; input/sidefiles.c
 * lists and classifies them): the license, the model card, every tokenizer file, remote
 * code and small configs are copied unchanged and hashed in the manifest's files[] (kind
 * "copy"); the rest is skipped, one log line each, and listed in the manifest's skipped[]
 * with the reason. The auto_map entries of config.json and tokenizer_config.json name
 * Python files that must reach the output: one that does not is a warning.
 */
#include "commands/convert.h"
#include "base/bfs_io.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void bfs__slog(const bfs_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bfs__slog(const bfs_run *r, const char *fmt, ...)
{
    if (!r->o->log)
        return;
    va_list ap;
    va_start(ap, fmt);
    bfs__vline(r->o->log, "bfshard: ", fmt, ap);
    va_end(ap);
    fflush(r->o->log);
}

static const bfs_side *bfs__side_find(const bfs_sides *ss, const char *name)
{
    for (size_t i = 0; i < ss->n; i++)
        if (!strcmp(ss->v[i].name, name))
            return &ss->v[i];
    return NULL;
}

/* one auto_map value ("module.Class", "repo--module.Class"): its file must be copied */
static void bfs__automap_ref(const bfs_run *r, const char *file, const char *key, const char *ref)
{
    char mod[256], e1[BFS_ESC_MAX];
    const char *dot = strrchr(ref, '.');
    if (strstr(ref, "--")) /* code of another repository: transformers fetches it from there */
        return;
    if (!dot || dot == ref || (size_t)(dot - ref) + 4 > sizeof mod) {
        bfs__slog(r, "warning: %s: auto_map.%s = \"%s\" is not module.Class", file, key, bfs__esc(ref, e1, sizeof e1));
        return;
    }
    snprintf(mod, sizeof mod, "%.*s.py", (int)(dot - ref), ref);
    const bfs_side *s = bfs__side_find(&r->sides, mod);
    if (s && !s->why)
        return;
    bfs__slog(r, "warning: %s: auto_map.%s names %s, which %s: trust_remote_code will not load it from the output",
              file, key, bfs__esc(mod, e1, sizeof e1), s ? "is skipped (see above)" : "is not in the input folder");
}

/* auto_map of one JSON text: {"AutoX": "module.Class" or ["module.Class", null], ...} */
static void bfs__automap_check(const bfs_run *r, const char *file, const char *text, size_t len)
{
    json_t *j = text ? json_loadb(text, len, JSON_DECODE_INT_AS_REAL, NULL) /* model_max_length: 1e30 */ : NULL;
    const json_t *am = json_object_get(j, "auto_map");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)am, key, v) {
        if (json_is_string(v))
            bfs__automap_ref(r, file, key, json_string_value(v));
        for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++)
            if (json_is_string(json_array_get(v, i)))
                bfs__automap_ref(r, file, key, json_string_value(json_array_get(v, i)));
    }
    json_decref(j);
}

int bfs__side_plan(bfs_run *r)
{
    int rc = 0;
    char e[BFS_ESC_MAX], *tok = NULL;
    size_t ncopy = 0, nskip = 0, toklen = 0;
    BFS_TRY(bfs__sides_list(r->in, &r->sides));
    if (!(r->skipped = json_array()))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (size_t i = 0; i < r->sides.n; i++) {
        const bfs_side *s = &r->sides.v[i];
        if (!s->why) {
            ncopy++;
            continue;
        }
        nskip++;
        bfs__esc(s->name, e, sizeof e); /* the manifest too: a name that is not UTF-8 has no JSON string */
        /* a tokenizer or generation file over the limit is refused, before any rank file: an
         * output without it would fail only when training starts */
        for (size_t a = 0; strstr(s->why, "64 MiB") && a < bfs__naux; a++)
            if (strcmp(s->name, bfs__aux_files[a]) == 0)
                BFS_FAIL(BFS_EINPUT, "%s/%s: %llu bytes, over the 64 MiB limit for side files; the model needs it "
                                     "(tokenizer or generation file), so it is not left out",
                         r->in->root, e, (unsigned long long)s->size);
        bfs__slog(r, "%s%s: not copied: %s", strstr(s->why, "64 MiB") ? "warning: " : "", e, s->why);
        if (json_array_append_new(r->skipped, json_pack("{s:s, s:s}", "name", e, "why", s->why)) != 0)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
    }
    if (json_array_size(r->skipped) != nskip)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    bfs__slog(r, "side files: %zu copied beside the weights, %zu skipped%s", ncopy, nskip,
              r->sides.bfd >= 0 ? " (a Hugging Face cache snapshot: links into its blobs/ read)" : "");
    bfs__automap_check(r, "config.json", r->in->config_json, r->in->config_json ? strlen(r->in->config_json) : 0);
    const bfs_side *t = bfs__side_find(&r->sides, "tokenizer_config.json");
    if (t && !t->why) {
        BFS_TRY(bfs__side_read(&r->sides, t, r->in->root, &tok, &toklen));
        bfs__automap_check(r, "tokenizer_config.json", tok, toklen);
    }
cleanup:
    free(tok);
    return rc;
}

int bfs__sides_each(const bfs_run *r, int (*fn)(void *ctx, const char *name, const char *data, size_t len), void *ctx)
{
    for (size_t i = 0; i < r->sides.n; i++) {
        const bfs_side *s = &r->sides.v[i];
        char *data = NULL;
        size_t len = 0;
        if (s->why)
            continue;
        int rc = bfs__side_read(&r->sides, s, r->in->root, &data, &len);
        if (rc == 0)
            rc = fn(ctx, s->name, data, len);
        free(data);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int bfs__side_hash(void *ctx, const char *name, const char *data, size_t len)
{
    XXH3_state_t *st = ctx;
    XXH3_128bits_update(st, name, strlen(name) + 1);
    XXH3_128bits_update(st, &len, sizeof len);
    XXH3_128bits_update(st, data, len);
    return 0;
}

int bfs__side_fingerprint(const bfs_run *r, XXH3_state_t *st)
{
    /* names and contents (small files, read again when copied), not mtimes: the same side files
     * from a folder or a Hugging Face cache, whose blobs one repo's snapshots share, are the
     * same plan */
    return bfs__sides_each(r, bfs__side_hash, st);
}
