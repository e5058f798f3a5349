/*
 * What a manifest says about the model as a whole (see manifest.h, bfs__manifest_summary):
 * the tensors' dtypes and element count, the quantized formats they were converted from,
 * the head's facts (version, options, seal, fingerprint) and files[]. One windowed read;
 * bfshard pack builds the ModelPack config from it and verify of an OCIDIR checks that
 * config against it. Calls go one way: manifest_summary.c -> manifest_read.c -> _common.
 */
#include "output/manifest_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    bfs_manifest_summary *s;
    char fmt[16][64];
    int nfmt;
    bool overflow;
} bfs_summary_walk;

/* one tensor: its dtype, its elements, and its format when it was dequantized */
static int bfs__summary_tensor(void *user, size_t i, const json_t *t)
{
    bfs_summary_walk *w = user;
    bfs_dtype dt;
    const char *dn = json_string_value(json_object_get(t, "dtype"));
    const char *fmt = json_string_value(json_object_get(t, "format"));
    const char *act = json_string_value(json_object_get(t, "action"));
    const json_t *shape = json_object_get(t, "shape");
    if (!dn || bfs__dtype_parse(dn, &dt) != 0 || !json_is_array(shape))
        return bfs__err(BFS_EINPUT, "tensors[%zu]: no dtype bfshard knows, or no shape", i);
    w->s->dtypes |= 1u << dt;
    uint64_t n = 1;
    for (size_t d = 0; d < json_array_size(shape); d++) {
        const json_t *v = json_array_get(shape, d);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || !bfs__mul_ok(n, (uint64_t)json_integer_value(v), &n))
            return bfs__err(BFS_EINPUT, "tensors[%zu]: a shape that is not a list of sizes", i);
    }
    if (!bfs__add_ok(w->s->params, n, &w->s->params))
        w->overflow = true;
    if (!fmt || !act || strcmp(act, "dequantized") != 0)
        return 0;
    for (int k = 0; k < w->nfmt; k++)
        if (!strcmp(w->fmt[k], fmt))
            return 0;
    if (w->nfmt < 16 && strlen(fmt) < sizeof w->fmt[0])
        snprintf(w->fmt[w->nfmt++], sizeof w->fmt[0], "%s", fmt);
    return 0;
}

static int bfs__cmp_str(const void *a, const void *b) { return strcmp(a, b); }

static void bfs__copy_str(char *dst, size_t cap, const json_t *v)
{
    const char *s = json_string_value(v);
    dst[0] = '\0';
    if (s && strlen(s) < cap)
        memcpy(dst, s, strlen(s) + 1);
}

int bfs__manifest_summary(int dirfd, const char *dir, const char *name, bfs_manifest_summary *s)
{
    int rc = 0;
    bfs_mf *mr = NULL;
    bfs_summary_walk w = {.s = s};
    memset(s, 0, sizeof *s);
    BFS_TRY(bfs__mf_openat(dirfd, dir, name, 0, bfs__summary_tensor, &w, &mr));
    const json_t *h = bfs__mf_head(mr), *opt = json_object_get(h, "options");
    const json_t *files = json_object_get(h, "files");
    if (!json_is_array(files) || !bfs__mf_has_tensors(mr) || !json_is_object(opt))
        BFS_FAIL(BFS_EINPUT, "%s: not a bfshard manifest (no files, tensors or options)", bfs__mf_path(mr));
    if (json_object_get(h, "part"))
        BFS_FAIL(BFS_EINPUT, "%s: a part's manifest: run `bfshard merge` first", bfs__mf_path(mr));
    s->seal_ok = bfs__mf_check_seal(mr, NULL) == 0;
    if (w.overflow)
        s->params = UINT64_MAX;
    qsort(w.fmt, (size_t)w.nfmt, sizeof w.fmt[0], bfs__cmp_str);
    for (int k = 0; k < w.nfmt; k++) /* 16 names of < 64 bytes fit */
        snprintf(s->formats + strlen(s->formats), sizeof s->formats - strlen(s->formats), "%s%s", k ? "," : "",
                 w.fmt[k]);
    bfs__copy_str(s->quant_method, sizeof s->quant_method,
                  json_object_get(json_object_get(json_object_get(h, "source"), "quantization_config"), "quant_method"));
    bfs__copy_str(s->version, sizeof s->version, json_object_get(h, "version"));
    bfs__copy_str(s->layout, sizeof s->layout, json_object_get(opt, "layout"));
    bfs__copy_str(s->seal, sizeof s->seal, json_object_get(h, BFS_MF_SEAL));
    bfs__copy_str(s->fingerprint, sizeof s->fingerprint, json_object_get(h, "plan_fingerprint"));
    const json_t *ws = json_object_get(opt, "world_size");
    s->world_size = json_is_integer(ws) && json_integer_value(ws) >= 1 && json_integer_value(ws) <= 1000000
                        ? (int)json_integer_value(ws) : 0;
    if (!s->world_size || !s->layout[0] || !s->seal[0] || !s->fingerprint[0])
        BFS_FAIL(BFS_EINPUT, "%s: not a bfshard manifest (options, seal or plan fingerprint missing)", bfs__mf_path(mr));
    s->files = json_deep_copy(files);
    if (!s->files)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
cleanup:
    bfs__mf_free(mr);
    return rc;
}
