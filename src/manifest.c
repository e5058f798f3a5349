/*
 * The manifest's format (see manifest.h): bfshard.manifest.json is built here from a
 * finished conversion, rewritten here for `compress`, sealed here, and read here for
 * verify; xxh128sums.txt is written and checked here. Verify's report lines go
 * through bfs__report (also here: every report line names a manifest entry).
 */
#include "manifest.h"
#include "bfs_io.h"
#include "durable.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define BFS_MF_HASH "xxh3_128"
#define BFS_MF_SRC_HASH "content_xxh3_128" /* source.files[]: srchash.c */
#define BFS_MF_SEAL "manifest_xxh3_128"
#define BFS_MF_ZERO_SEAL "00000000000000000000000000000000"
/* the head's "tensors" until bfs__manifest_write_conv() writes the array in its place */
#define BFS_MF_TENSORS_HOLE "bfshard: the tensors array goes here"

void bfs__report(FILE *out, const char *fmt, ...)
{
    if (!out)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fputc('\n', out);
}

const char *bfs__manifest_hash(const json_t *entry) { return json_string_value(json_object_get(entry, BFS_MF_HASH)); }
bool bfs__manifest_hash_elsewhere(const json_t *entry) { return json_is_null(json_object_get(entry, BFS_MF_HASH)); }

json_t *bfs__manifest_aux_entry(const char *name, uint64_t size, const char *hex, const char *kind)
{
    return json_pack("{s:s, s:I, s:s, s:s}", "name", name, "size", (json_int_t)size, BFS_MF_HASH, hex, "kind", kind);
}

json_t *bfs__manifest_zst_entry(const char *zname, uint64_t size, const char *hex, const char *format, int level,
                                uint64_t frame_bytes, uint64_t frames)
{
    return json_pack("{s:s, s:I, s:s, s:s, s:i, s:I, s:I}", "name", zname, "size", (json_int_t)size, BFS_MF_HASH, hex,
                     "format", format, "level", level, "frame_bytes", (json_int_t)frame_bytes, "frames",
                     (json_int_t)frames);
}

/* ---- building ---------------------------------------------------------------------------- */
/* a hash, or null where another part of the conversion knows it */
static json_t *bfs__hash_val(const char *hex, bool known) { return known ? json_string(hex) : json_null(); }

/* NULL when out of memory (never a short shape) */
static json_t *bfs__shape_json(const uint64_t *s, int n)
{
    json_t *a = json_array();
    for (int d = 0; a && d < n; d++)
        if (json_array_append_new(a, json_integer((json_int_t)s[d])) != 0) {
            json_decref(a);
            a = NULL;
        }
    return a;
}

/* NULL when out of memory: jansson drops a NULL value silently, so every key is checked */
static json_t *bfs__manifest_head(const bfs_manifest_in *mi)
{
    const bfs_convert_opts *o = mi->o;
    json_t *m = json_object();
    bool ok = m != NULL;
    ok = ok && json_object_set_new(m, "tool", json_string("bfshard")) == 0;
    ok = ok && json_object_set_new(m, "version", json_string(BFS_VERSION_STRING)) == 0;
    ok = ok && json_object_set_new(m, "revision", json_string(bfs_build_revision())) == 0; /* git describe of the build */
    ok = ok && json_object_set_new(m, "manifest_version", json_integer(1)) == 0;
    ok = ok && json_object_set_new(m, "hash", json_string("XXH3-128 (canonical big-endian hex, as xxh128sum)")) == 0;
    ok = ok && json_object_set_new(m, "plan_fingerprint", json_string(mi->fingerprint)) == 0;
    ok = ok && json_object_set_new(m, "options",
                                   json_pack("{s:i, s:s, s:s, s:b, s:I}", "world_size", o->world_size, "layout",
                                             mi->plan->layout == BFS_LAYOUT_DCP ? "dcp" : "hf", "mxfp4_layout",
                                             o->mxfp4_layout == BFS_MXFP4_HF ? "hf" : "openai", "keep_dtype",
                                             o->keep_dtype, "max_shard_size", (json_int_t)o->max_shard_size)) == 0;
    /* source.files[].content_xxh3_128: XXH3-128 of the canonical digests of the file's header
     * and of each tensor's data in file order, from the bytes the kernels read (srchash.c) */
    json_t *src = json_array();
    for (int i = 0; ok && src && i < mi->in->nfiles; i++)
        ok = json_array_append_new(src, json_pack("{s:s, s:I, s:o}", "name", mi->in->files[i].name, "size",
                                                  (json_int_t)mi->in->files[i].size, BFS_MF_SRC_HASH,
                                                  bfs__hash_val(mi->src_hex[i], !mi->src_mine || mi->src_mine[i]))) == 0;
    if (!ok || !src || json_array_size(src) != (size_t)mi->in->nfiles) {
        json_decref(src);
        json_decref(m);
        return NULL;
    }
    json_t *sobj = json_pack("{s:o}", "files", src);
    ok = json_object_set_new(m, "source", sobj) == 0;
    if (ok && mi->in->config_json) {
        json_error_t jerr;
        json_t *cfg = json_loads(mi->in->config_json, 0, &jerr);
        json_t *qc = cfg ? json_object_get(cfg, "quantization_config") : NULL;
        if (!cfg && json_error_code(&jerr) == json_error_out_of_memory)
            ok = false;
        if (qc && json_object_set(sobj, "quantization_config", qc) != 0)
            ok = false;
        json_decref(cfg);
    }
    if (!ok) {
        json_decref(m);
        return NULL;
    }
    return m;
}

static json_t *bfs__manifest_files(const bfs_manifest_in *mi)
{
    const bfs_plan *p = mi->plan;
    json_t *files = json_array();
    for (int f = 0; f < p->nfiles; f++) {
        json_t *e = json_pack("{s:s, s:I, s:o, s:s}", "name", p->files[f].name, "size", (json_int_t)p->files[f].size,
                              BFS_MF_HASH, bfs__hash_val(mi->file_hex[f], !mi->mine || mi->mine[f]), "kind", "weights");
        if (e && ((p->layout == BFS_LAYOUT_DCP && json_object_set_new(e, "rank", json_integer(f)) != 0) ||
                  (mi->zst && mi->zst[f] && json_object_set(e, "zst", mi->zst[f]) != 0))) {
            json_decref(e); /* one file short: the caller counts them */
            e = NULL;
        }
        json_array_append_new(files, e);
    }
    for (size_t i = 0; i < json_array_size(mi->aux); i++)
        json_array_append(files, json_array_get(mi->aux, i));
    return files;
}

/* Where each tensor's pieces are, as one pass over the files: tensor i's pieces are
 * at[first[i] .. first[i + 1]) in file order, so the manifest costs the number of
 * pieces, never tensors x pieces. */
typedef struct {
    int file;
    size_t piece;
} bfs_piece_at;

static int bfs__pieces_by_tensor(const bfs_plan *p, size_t **first_out, bfs_piece_at **at_out)
{
    size_t *first = calloc(p->nt + 2, sizeof *first), total = 0;
    bfs_piece_at *at = NULL;
    *first_out = NULL;
    *at_out = NULL;
    if (!first)
        return bfs__err(BFS_ENOMEM, "out of memory building the manifest");
    for (int f = 0; f < p->nfiles; f++)
        for (size_t pi = 0; pi < p->files[f].npieces; pi++)
            first[p->files[f].pieces[pi].tensor + 2]++;
    for (size_t i = 0; i < p->nt; i++) /* first[i + 2] becomes where tensor i + 1 begins */
        first[i + 2] += first[i + 1];
    for (int f = 0; f < p->nfiles; f++)
        total += p->files[f].npieces;
    at = calloc(total ? total : 1, sizeof *at);
    if (!at) {
        free(first);
        return bfs__err(BFS_ENOMEM, "out of memory building the manifest");
    }
    for (int f = 0; f < p->nfiles; f++) /* first[i + 1] is tensor i's fill cursor */
        for (size_t pi = 0; pi < p->files[f].npieces; pi++)
            at[first[p->files[f].pieces[pi].tensor + 1]++] = (bfs_piece_at){f, pi};
    *first_out = first; /* now first[i] .. first[i + 1] */
    *at_out = at;
    return 0;
}

/* tensors[i].shards: one per piece of tensor i, in file order */
static json_t *bfs__manifest_shards(const bfs_manifest_in *mi, size_t i, const size_t *first, const bfs_piece_at *at)
{
    const bfs_plan *p = mi->plan;
    const bfs_ltensor *t = &p->t[i];
    json_t *shards = json_array();
    for (size_t k = first[i]; k < first[i + 1]; k++) {
        const int f = at[k].file;
        const size_t pi = at[k].piece;
        const bfs_outfile *of = &p->files[f];
        const bfs_piece *pc = &of->pieces[pi];
        uint64_t shape[BFS_MAX_DIMS], so[BFS_MAX_DIMS] = {0};
        memcpy(shape, t->shape, sizeof shape);
        if (t->ndim > 0)
            shape[0] = pc->row1 - pc->row0;
        so[0] = pc->row0;
        json_t *s = json_pack("{s:s, s:I, s:I, s:o, s:o, s:o}", "file", of->name, "offset", (json_int_t)pc->offset,
                              "nbytes", (json_int_t)pc->nbytes, "shape", bfs__shape_json(shape, t->ndim),
                              "saved_offsets", bfs__shape_json(so, t->ndim), BFS_MF_HASH,
                              bfs__hash_val(mi->piece_hex[f][pi], !mi->mine || mi->mine[f]));
        if (p->layout == BFS_LAYOUT_DCP && s && json_object_set_new(s, "rank", json_integer(f)) != 0) {
            json_decref(s); /* one shard short: the caller counts them */
            s = NULL;
        }
        json_array_append_new(shards, s);
    }
    return shards;
}

/* tensors[i], complete (its shards counted), or NULL when out of memory */
static json_t *bfs__manifest_tensor(const bfs_manifest_in *mi, size_t i, const size_t *first, const bfs_piece_at *at)
{
    const bfs_plan *p = mi->plan;
    const bfs_ltensor *t = &p->t[i];
    json_t *srcs = json_array(), *shards = NULL, *e = NULL;
    bool whole = srcs != NULL;
    for (int k = 0; whole && k < t->nsrc; k++)
        whole = json_array_append_new(srcs, json_string(t->src[k]->st->name)) == 0;
    if (!whole) {
        json_decref(srcs);
        return NULL;
    }
    e = json_pack("{s:s, s:s, s:o, s:s, s:s, s:o}", "name", t->name, "dtype", bfs__dtype_name(t->out_dtype), "shape",
                  bfs__shape_json(t->shape, t->ndim), "format", bfs__kind_name(t), "transform", t->transform,
                  "sources", srcs);
    whole = e && json_object_set_new(e, "action", json_string(bfs__kind_action(t))) == 0;
    if (whole &&
        (t->kind == BFS_K_BNB4 || t->kind == BFS_K_CAST || (t->kind == BFS_K_PASS && t->out_dtype != t->src_dtype)))
        whole = json_object_set_new(e, "source_dtype", json_string(bfs__dtype_name(t->src_dtype))) == 0;
    /* jansson answers an allocation failure with NULL, which json_*_append_new() drops
     * silently: count what was built, so that a short manifest is never written */
    shards = bfs__manifest_shards(mi, i, first, at);
    if (!whole || json_array_size(shards) != first[i + 1] - first[i]) {
        json_decref(shards);
        json_decref(e);
        return NULL;
    }
    if (json_object_set_new(e, "shards", shards) == 0) /* takes shards, also on failure */
        return e;
    json_decref(e);
    return NULL;
}

int bfs__manifest_build_head(const bfs_manifest_in *mi, json_t **out)
{
    json_t *m = bfs__manifest_head(mi);
    *out = NULL;
    if (!m)
        return bfs__err(BFS_ENOMEM, "out of memory building the manifest");
    json_t *files = bfs__manifest_files(mi);
    /* jansson answers an allocation failure with NULL, which json_*_append_new() drops
     * silently: count what was built, so that a short manifest is never written */
    bool whole = files && json_array_size(files) == (size_t)mi->plan->nfiles + json_array_size(mi->aux);
    if (json_object_set_new(m, "files", files) != 0 ||
        json_object_set_new(m, "tensors", json_string(BFS_MF_TENSORS_HOLE)) != 0) /* bfs__manifest_write_conv */
        whole = false;
    if (mi->plan->ndropped) { /* input tensors with no output (docs/FORMATS.md 6.0) */
        json_t *d = json_array();
        for (size_t i = 0; d && i < mi->plan->ndropped; i++)
            if (json_array_append_new(d, json_string(mi->plan->dropped[i])) != 0)
                whole = false;
        if (json_object_set_new(m, "dropped", d) != 0)
            whole = false;
    }
    if (mi->part && json_object_set_new(m, "part", json_pack("{s:s, s:i}", "ranks", mi->part, "world_size",
                                                             mi->o->world_size)) != 0)
        whole = false;
    if (json_object_set_new(m, BFS_MF_SEAL, json_string(BFS_MF_ZERO_SEAL)) != 0 || !whole) { /* sealed on write */
        json_decref(m);
        return bfs__err(BFS_ENOMEM, "out of memory building the manifest");
    }
    *out = m;
    return 0;
}

/* ---- the seal ------------------------------------------------------------------------------
 * bfshard.manifest.json carries "manifest_xxh3_128": the XXH3-128 of the whole file as
 * written with that value set to 32 '0's. Any changed byte of the manifest shows:
 * its hash no longer matches, or the seal is gone. Whoever writes or rewrites a
 * manifest goes through bfs__manifest_write(), which seals its final bytes.
 * xxh128sums.txt may hold only lines "HASH  NAME\n" that agree with the manifest. */
#define BFS_SEAL_KEY "\"" BFS_MF_SEAL "\": \""

static char *bfs__seal_find(char *text, size_t len)
{
    const size_t kl = strlen(BFS_SEAL_KEY);
    char *hit = NULL;
    for (char *p = text; (p = memmem(p, len - (size_t)(p - text), BFS_SEAL_KEY, kl)) != NULL; p += kl)
        hit = p + kl;
    if (!hit || (size_t)(hit - text) + 33 > len || hit[32] != '"')
        return NULL;
    return hit;
}

int bfs__manifest_seal(char *text, size_t len)
{
    char *v = bfs__seal_find(text, len), hex[33];
    if (!v)
        return bfs__err(BFS_EINTERNAL, "manifest without a \"manifest_xxh3_128\" field to seal");
    memset(v, '0', 32);
    bfs__hash_hex(XXH3_128bits(text, len), hex);
    memcpy(v, hex, 32);
    return 0;
}

int bfs__manifest_check_seal(const char *mpath, const char *text, size_t len, const json_t *m, FILE *report)
{
    char *copy = malloc(len + 1), got[33] = "", want[33] = "";
    char *v = copy ? bfs__seal_find(memcpy(copy, text, len), len) : NULL;
    const char *jv = json_string_value(json_object_get(m, BFS_MF_SEAL));
    if (v) {
        memcpy(want, v, 32);
        memset(v, '0', 32);
        bfs__hash_hex(XXH3_128bits(copy, len), got);
    }
    free(copy);
    if (v && jv && strcmp(jv, want) == 0 && strcmp(got, want) == 0)
        return 0;
    if (!v || !jv)
        bfs__report(report, "%s: BAD manifest: no \"manifest_xxh3_128\" seal", mpath);
    else
        bfs__report(report, "%s: BAD manifest: its bytes hash to %s, its seal says %s", mpath, got, want);
    return 1;
}

/* ---- reading ------------------------------------------------------------------------------- */
int bfs__manifest_load(const char *outdir, char **mpath, char **text, size_t *len, json_t **m, json_error_t *jerr)
{
    return bfs__manifest_load_as(outdir, BFS_MANIFEST_NAME, mpath, text, len, m, jerr);
}

int bfs__manifest_load_as(const char *outdir, const char *name, char **mpath, char **text, size_t *len, json_t **m,
                          json_error_t *jerr)
{
    *m = NULL;
    *text = NULL;
    *mpath = bfs__path_join(outdir, name);
    if (!*mpath)
        return bfs__err(BFS_ENOMEM, "out of memory");
    const int rc = bfs__read_small_file(*mpath, 1u << 30, text, len);
    if (rc < 0)
        return rc;
    *m = json_loads(*text, JSON_REJECT_DUPLICATES, jerr);
    return 0;
}

bool bfs__manifest_file_get(const json_t *files, size_t i, bfs_manifest_file *out)
{
    json_t *f = json_array_get(files, i);
    const json_t *jsz = json_object_get(f, "size");
    memset(out, 0, sizeof *out);
    out->name = json_string_value(json_object_get(f, "name"));
    out->hash = bfs__manifest_hash(f);
    out->kind = json_string_value(json_object_get(f, "kind"));
    out->zst = json_object_get(f, "zst");
    if (!out->name || !out->hash || !json_is_integer(jsz) || strchr(out->name, '/') || out->name[0] == '.')
        return false;
    out->size = (uint64_t)json_integer_value(jsz);
    return true;
}

/* ---- writing -------------------------------------------------------------------------------- */
int bfs__manifest_write(int dirfd, const char *outdir, json_t *m)
{
    return bfs__manifest_write_as(dirfd, outdir, BFS_MANIFEST_NAME, m);
}

int bfs__manifest_write_as(int dirfd, const char *outdir, const char *name, json_t *m)
{
    size_t n = 0;
    if (!json_is_string(json_object_get(m, BFS_MF_SEAL)))
        json_object_set_new(m, BFS_MF_SEAL, json_string(BFS_MF_ZERO_SEAL));
    char *text = bfs__json_text(m, JSON_INDENT(1) | JSON_PRESERVE_ORDER, &n);
    if (!text)
        return bfs__err(BFS_ENOMEM, "out of memory building the manifest");
    int rc = bfs__manifest_seal(text, n);
    if (rc == 0)
        rc = bfs__write_durable(dirfd, outdir, name, text, n);
    free(text);
    return rc;
}

/* ---- a conversion's manifest, streamed ----------------------------------------------------
 * tensors[] has an object per tensor and one per piece (1.6M pieces for 200k tensors at
 * W = 8): it is never a tree in memory. The head (bfs__manifest_build_head: every key,
 * "tensors" a placeholder string) is dumped whole, and the array goes in the
 * placeholder's place one tensor at a time: built as a small tree, dumped, freed. The
 * bytes are exactly json_dumps() of the whole tree with JSON_INDENT(1) |
 * JSON_PRESERVE_ORDER, plus '\n': a tensor is at depth 2, so its own dump gets two
 * spaces after each '\n' (a JSON string never holds a raw newline), and the array's
 * frame is jansson's, "[\n  " A ",\n  " B "\n ]", or "[]" when empty. The seal is
 * hashed as the bytes go out (the zero seal in place) and then written at its offset,
 * before the commit: temp file, fdatasync, rename, directory fsync (durable.h). */
#define BFS_MF_TENSORS_KEY "\n \"tensors\": " /* only a key of the top object follows "\n " */
#define BFS_MF_BUF ((size_t)1 << 20)

typedef struct {
    int fd;
    const char *what; /* the temporary's path, for messages */
    char *buf;
    size_t n;         /* bytes in buf */
    uint64_t off;     /* bytes written before them */
    XXH3_state_t *st; /* of every byte handed over */
    int rc;           /* the first error; then nothing more is written */
} bfs_mf_out;

static void bfs__mf_flush(bfs_mf_out *w)
{
    if (w->rc == 0 && w->n) {
        XXH3_128bits_update(w->st, w->buf, w->n);
        w->rc = bfs__pwrite_all(w->fd, w->buf, w->n, w->off, w->what);
        w->off += w->n;
    }
    w->n = 0;
}

static void bfs__mf_put(bfs_mf_out *w, const char *s, size_t len)
{
    while (len && w->rc == 0) {
        if (w->n == BFS_MF_BUF)
            bfs__mf_flush(w);
        const size_t k = len < BFS_MF_BUF - w->n ? len : BFS_MF_BUF - w->n;
        memcpy(w->buf + w->n, s, k);
        w->n += k;
        s += k;
        len -= k;
    }
}

static void bfs__mf_puts(bfs_mf_out *w, const char *s) { bfs__mf_put(w, s, strlen(s)); }

/* json_dump_callback()'s sink for a tensor: depth 2 */
static int bfs__mf_put_tensor(const char *s, size_t len, void *data)
{
    bfs_mf_out *w = data;
    const char *nl;
    while ((nl = memchr(s, '\n', len)) != NULL) {
        const size_t k = (size_t)(nl - s) + 1;
        bfs__mf_put(w, s, k);
        bfs__mf_put(w, "  ", 2);
        s += k;
        len -= k;
    }
    bfs__mf_put(w, s, len);
    return w->rc < 0 ? -1 : 0;
}

int bfs__manifest_write_conv(int dirfd, const char *outdir, const char *name, const bfs_manifest_in *mi,
                             const json_t *head)
{
    const size_t flags = JSON_INDENT(1) | JSON_PRESERVE_ORDER, kl = strlen(BFS_MF_TENSORS_KEY);
    const size_t hl = strlen("\"" BFS_MF_TENSORS_HOLE "\"");
    const bfs_plan *p = mi->plan;
    int rc = 0;
    bfs_tmpfile t = {.fd = -1, .dirfd = -1};
    bfs_mf_out w = {.fd = -1};
    size_t *first = NULL, len = 0, shards = 0, pieces = 0;
    bfs_piece_at *at = NULL;
    char *text = bfs__json_text(head, flags, &len), *key = NULL, what[PATH_MAX + NAME_MAX + 32], hex[33];
    if (!text)
        BFS_FAIL(BFS_ENOMEM, "out of memory building the manifest");
    key = memmem(text, len, BFS_MF_TENSORS_KEY, kl);
    char *const hole = key ? key + kl : NULL, *const tail = hole ? hole + hl : NULL;
    char *const seal = tail && (size_t)(tail - text) <= len && !memcmp(hole, "\"" BFS_MF_TENSORS_HOLE "\"", hl)
                           ? bfs__seal_find(tail, len - (size_t)(tail - text)) : NULL;
    if (!seal)
        BFS_FAIL(BFS_EINTERNAL, "manifest head without its tensors placeholder or its seal");
    BFS_TRY(bfs__pieces_by_tensor(p, &first, &at));
    for (int f = 0; f < p->nfiles; f++)
        pieces += p->files[f].npieces;
    w.buf = malloc(BFS_MF_BUF);
    w.st = XXH3_createState();
    if (!w.buf || !w.st || XXH3_128bits_reset(w.st) != XXH_OK)
        BFS_FAIL(BFS_ENOMEM, "out of memory writing the manifest");
    BFS_TRY(bfs__tmp_open(&t, dirfd, outdir, name));
    snprintf(what, sizeof what, "%s/%s", t.dir, t.tmp);
    w.fd = t.fd;
    w.what = what;
    bfs__mf_put(&w, text, (size_t)(hole - text));
    bfs__mf_puts(&w, p->nt ? "[\n  " : "[]");
    for (size_t i = 0; i < p->nt && w.rc == 0; i++) {
        json_t *e = bfs__manifest_tensor(mi, i, first, at);
        if (!e)
            BFS_FAIL(BFS_ENOMEM, "out of memory building the manifest");
        shards += first[i + 1] - first[i];
        const int drc = json_dump_callback(e, bfs__mf_put_tensor, &w, flags);
        json_decref(e);
        if (drc != 0 && w.rc == 0)
            BFS_FAIL(BFS_ENOMEM, "out of memory writing the manifest");
        bfs__mf_puts(&w, i + 1 < p->nt ? ",\n  " : "\n ]");
    }
    const uint64_t seal_at = w.off + w.n + (uint64_t)(seal - tail);
    bfs__mf_put(&w, tail, len - (size_t)(tail - text));
    bfs__mf_flush(&w);
    BFS_TRY(w.rc);
    if (shards != pieces) /* every tensor, every shard: never a short manifest */
        BFS_FAIL(BFS_EINTERNAL, "manifest of %zu shards for %zu pieces", shards, pieces);
    bfs__hash_hex(XXH3_128bits_digest(w.st), hex);
    BFS_TRY(bfs__pwrite_all(t.fd, hex, 32, seal_at, what));
    BFS_TRY(bfs__tmp_commit(&t));
cleanup:
    bfs__tmp_abort(&t);
    XXH3_freeState(w.st);
    free(w.buf);
    free(first);
    free(at);
    free(text);
    return rc;
}

static bool bfs__exists_at(int dirfd, const char *name)
{
    struct stat sb;
    return fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0;
}

/* one "HASH  NAME\n" line, growing the buffer */
static int bfs__sums_line(char **buf, size_t *len, size_t *cap, const char *hash, const char *name)
{
    const size_t need = strlen(hash) + strlen(name) + 4;
    if (*len + need > *cap) {
        const size_t nc = (*cap + need) * 2;
        char *nb = realloc(*buf, nc);
        if (!nb)
            return bfs__err(BFS_ENOMEM, "out of memory");
        *buf = nb;
        *cap = nc;
    }
    *len += (size_t)snprintf(*buf + *len, *cap - *len, "%s  %s\n", hash, name);
    return 0;
}

int bfs__manifest_write_sums(int dirfd, const char *outdir, const json_t *files)
{
    int rc = 0;
    char *sums = NULL;
    size_t k = 0, cap = 0;
    for (size_t i = 0; i < json_array_size(files); i++) {
        const json_t *f = json_array_get(files, i), *z = json_object_get(f, "zst");
        const char *name = json_string_value(json_object_get(f, "name")), *hx = bfs__manifest_hash(f);
        const char *zn = json_string_value(json_object_get(z, "name")), *zh = bfs__manifest_hash(z);
        if (name && hx && bfs__exists_at(dirfd, name))
            BFS_TRY(bfs__sums_line(&sums, &k, &cap, hx, name));
        if (zn && zh && bfs__exists_at(dirfd, zn))
            BFS_TRY(bfs__sums_line(&sums, &k, &cap, zh, zn));
    }
    BFS_TRY(bfs__write_durable(dirfd, outdir, BFS_SUMS_NAME, sums ? sums : "", k));
cleanup:
    free(sums);
    return rc;
}

/* ---- xxh128sums.txt against the manifest ------------------------------------------------------
 * An index name -> [hash, ...] of files[] and their compressed copies, built once: each
 * line is then one lookup (a 3000-file manifest used to cost lines x files). */
static int bfs__sums_index_add(json_t *ix, const json_t *e)
{
    const char *n = json_string_value(json_object_get(e, "name")), *h = bfs__manifest_hash(e);
    if (!n || !h)
        return 0;
    json_t *a = json_object_get(ix, n);
    if (!a && (json_object_set_new(ix, n, a = json_array()) != 0 || !a))
        return -1;
    return json_array_append_new(a, json_string(h));
}

int bfs__manifest_check_sums(const char *outdir, const json_t *files, FILE *report)
{
    char *path = bfs__path_join(outdir, BFS_SUMS_NAME), *text = NULL, ep[BFS_ESC_MAX];
    size_t len = 0, pos = 0;
    int bad = 0, line = 0;
    json_t *ix = json_object();
    if (!path || !ix) {
        free(path);
        json_decref(ix);
        return 1;
    }
    for (size_t i = 0; i < json_array_size(files); i++) {
        const json_t *f = json_array_get(files, i);
        if (bfs__sums_index_add(ix, f) != 0 || bfs__sums_index_add(ix, json_object_get(f, "zst")) != 0) {
            bfs__report(report, "%s: cannot check: out of memory", bfs__esc(path, ep, sizeof ep));
            bad = 1;
            goto cleanup;
        }
    }
    if (bfs__read_small_file(path, 1u << 30, &text, &len) != 0) {
        bfs__report(report, "%s: MISSING or unreadable (%s)", bfs__esc(path, ep, sizeof ep), bfs_last_error());
        bfs__err_clear();
        bad = 1;
        goto cleanup;
    }
    while (pos < len) {
        const char *l = text + pos, *nl = memchr(l, '\n', len - pos);
        const size_t ll = nl ? (size_t)(nl - l) : len - pos;
        bool ok = nl && ll > 34 && l[32] == ' ' && l[33] == ' ';
        for (int i = 0; ok && i < 32; i++)
            ok = (l[i] >= '0' && l[i] <= '9') || (l[i] >= 'a' && l[i] <= 'f');
        const json_t *hs = ok ? json_object_getn(ix, l + 34, ll - 34) : NULL;
        bool found = false;
        for (size_t k = 0; k < json_array_size(hs) && !found; k++) {
            const char *h = json_string_value(json_array_get(hs, k));
            found = h && strlen(h) == 32 && !strncmp(h, l, 32);
        }
        line++;
        if (!found) {
            bfs__report(report, "%s: BAD line %d: not \"HASH  NAME\" of a file in the manifest", bfs__esc(path, ep, sizeof ep), line);
            bad++;
        }
        pos += ll + 1;
    }
cleanup:
    json_decref(ix);
    free(text);
    free(path);
    return bad;
}

/* ---- narrowing a bad file down to tensors ------------------------------------------------------- */
typedef struct {
    const char *file, *tname;
    const json_t *sh;
    size_t order; /* position in the manifest: reports keep its order */
} bfs_shard_ref;

struct bfs_shard_index {
    size_t n;
    bfs_shard_ref *r;
};

static int bfs__cmp_shard_ref(const void *a, const void *b)
{
    const bfs_shard_ref *x = a, *y = b;
    const int c = strcmp(x->file, y->file);
    return c ? c : (x->order > y->order) - (x->order < y->order);
}

void bfs__manifest_shard_index_free(bfs_shard_index *ix)
{
    if (ix)
        free(ix->r);
    free(ix);
}

int bfs__manifest_shard_index(const json_t *tensors, bfs_shard_index **out)
{
    size_t n = 0;
    *out = NULL;
    for (size_t t = 0; t < json_array_size(tensors); t++)
        n += json_array_size(json_object_get(json_array_get(tensors, t), "shards"));
    bfs_shard_index *ix = calloc(1, sizeof *ix);
    if (!ix || !(ix->r = calloc(n ? n : 1, sizeof *ix->r))) {
        free(ix);
        return bfs__err(BFS_ENOMEM, "out of memory indexing the manifest's shards");
    }
    for (size_t t = 0; t < json_array_size(tensors); t++) {
        const json_t *te = json_array_get(tensors, t), *shards = json_object_get(te, "shards");
        const char *tname = json_string_value(json_object_get(te, "name"));
        for (size_t s = 0; s < json_array_size(shards); s++) {
            const json_t *sh = json_array_get(shards, s);
            const char *sf = json_string_value(json_object_get(sh, "file"));
            if (sf)
                ix->r[ix->n] = (bfs_shard_ref){sf, tname ? tname : "?", sh, ix->n}, ix->n++;
        }
    }
    qsort(ix->r, ix->n, sizeof *ix->r, bfs__cmp_shard_ref);
    *out = ix;
    return 0;
}

int bfs__manifest_narrow(const bfs_shard_index *ix, const char *name, uint64_t size, const char *path, FILE *report,
                         bfs_manifest_hash_fn hash, void *user, bool report_read_errors, uint64_t *first_data)
{
    int bad = 0;
    uint64_t first = size;
    char ep[BFS_ESC_MAX], et[BFS_ESC_MAX], eh[BFS_ESC_MAX];
    size_t lo = 0, hi = ix ? ix->n : 0;
    while (lo < hi) { /* the first shard of file `name` */
        const size_t mid = lo + (hi - lo) / 2;
        if (strcmp(ix->r[mid].file, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t k = lo; ix && k < ix->n && strcmp(ix->r[k].file, name) == 0; k++) {
        const json_t *sh = ix->r[k].sh;
        const char *tname = ix->r[k].tname;
        const uint64_t off = (uint64_t)json_integer_value(json_object_get(sh, "offset"));
        const uint64_t nb = (uint64_t)json_integer_value(json_object_get(sh, "nbytes"));
        const char *sw = bfs__manifest_hash(sh);
        if (off < first)
            first = off;
        if (off > size || nb > size - off || !sw)
            continue;
        char got[33];
        if (hash(user, off, nb, got) < 0) {
            if (report_read_errors) {
                bfs__report(report, "%s: BAD tensor \"%s\" bytes [%llu, %llu): %s", bfs__esc(path, ep, sizeof ep),
                            bfs__esc(tname, et, sizeof et), (unsigned long long)off, (unsigned long long)(off + nb),
                            bfs_last_error());
                bfs__err_clear();
            }
            continue;
        }
        if (strcmp(got, sw) != 0) {
            bfs__report(report, "%s: BAD tensor \"%s\" bytes [%llu, %llu) (hash %s, manifest %s)",
                        bfs__esc(path, ep, sizeof ep), bfs__esc(tname, et, sizeof et), (unsigned long long)off,
                        (unsigned long long)(off + nb), got, bfs__esc(sw, eh, sizeof eh));
            bad++;
        }
    }
    if (first_data)
        *first_data = first;
    return bad;
}

/* ---- parts (ISSUE 13): a part's manifest is the whole manifest with null hashes where
 * another part knows them, plus "part": {"ranks", "world_size"}. Merging takes every
 * rank's entries (files[], tensors[].shards[]) from the one part that holds the rank and
 * every source hash from a part that hashed it: the result is, key for key and in the
 * same order, what a single run builds. ------------------------------------------------------ */
bool bfs__manifest_part_info(const json_t *m, const char **ranks, int *world_size, const char **fingerprint)
{
    const json_t *p = json_object_get(m, "part"), *w = json_object_get(p, "world_size");
    *ranks = json_string_value(json_object_get(p, "ranks"));
    *fingerprint = json_string_value(json_object_get(m, "plan_fingerprint"));
    *world_size = json_is_integer(w) && json_integer_value(w) >= 1 && json_integer_value(w) <= 1000000
                      ? (int)json_integer_value(w) : 0;
    return *ranks && *fingerprint && *world_size && json_is_array(json_object_get(m, "files")) &&
           json_is_array(json_object_get(m, "tensors")) &&
           json_is_array(json_object_get(json_object_get(m, "source"), "files"));
}

/* the rank of a files[] or shards[] entry, -1 when it has none; < -1 when out of 0..W-1 */
static int bfs__entry_rank(const json_t *e, int W)
{
    const json_t *r = json_object_get(e, "rank");
    if (!r)
        return -1;
    if (!json_is_integer(r) || json_integer_value(r) < 0 || json_integer_value(r) >= W)
        return -2;
    return (int)json_integer_value(r);
}

/* every part agrees with part 0 on what determines the bytes and on the manifest's shape */
static int bfs__merge_agree(json_t *const *parts, const char *const *names, int n, const char *outdir, int *W)
{
    const char *r0, *fp0, *rk, *fpk;
    int wk;
    for (int k = 0; k < n; k++)
        if (!bfs__manifest_part_info(parts[k], &rk, &wk, &fpk))
            return bfs__err(BFS_EINPUT, "%s/%s: not a bfshard part manifest (no \"part\", files or tensors)", outdir, names[k]);
    bfs__manifest_part_info(parts[0], &r0, W, &fp0);
    const json_t *f0 = json_object_get(parts[0], "files"), *t0 = json_object_get(parts[0], "tensors");
    const json_t *s0 = json_object_get(json_object_get(parts[0], "source"), "files");
    for (int k = 1; k < n; k++) {
        bfs__manifest_part_info(parts[k], &rk, &wk, &fpk);
        if (strcmp(fpk, fp0) != 0 || wk != *W || !json_equal(json_object_get(parts[k], "options"), json_object_get(parts[0], "options")) ||
            !json_equal(json_object_get(parts[k], "version"), json_object_get(parts[0], "version")))
            return bfs__err(BFS_EPARTS, "%s: %s (plan fingerprint %s) and %s (%s) are parts of different input or options; "
                            "remove the stale one and rerun its part", outdir, names[0], fp0, names[k], fpk);
        const json_t *fk = json_object_get(parts[k], "files"), *tk = json_object_get(parts[k], "tensors");
        const json_t *sk = json_object_get(json_object_get(parts[k], "source"), "files");
        if (json_array_size(fk) != json_array_size(f0) || json_array_size(tk) != json_array_size(t0) ||
            json_array_size(sk) != json_array_size(s0))
            return bfs__err(BFS_EPARTS, "%s: %s and %s list different files or tensors for the same plan", outdir, names[0], names[k]);
    }
    return 0;
}

/* owner[r]: the part holding rank r (its files[] entry hashed) */
static int bfs__merge_owners(json_t *const *parts, const char *const *names, int n, const char *outdir, int W, int *owner)
{
    for (int r = 0; r < W; r++)
        owner[r] = -1;
    for (int k = 0; k < n; k++) {
        const json_t *files = json_object_get(parts[k], "files");
        for (size_t i = 0; i < json_array_size(files); i++) {
            const json_t *e = json_array_get(files, i);
            const int r = bfs__entry_rank(e, W);
            if (r < -1)
                return bfs__err(BFS_EINPUT, "%s/%s: files[%zu] has a rank outside 0..%d", outdir, names[k], i, W - 1);
            if (r < 0 || !json_is_string(json_object_get(e, BFS_MF_HASH)))
                continue;
            if (owner[r] >= 0)
                return bfs__err(BFS_EPARTS, "%s: rank %d is in both %s and %s: parts must not overlap; remove one and merge",
                                outdir, r, names[owner[r]], names[k]);
            owner[r] = k;
        }
    }
    int missing = 0, first = -1;
    for (int r = 0; r < W; r++)
        if (owner[r] < 0 && missing++ == 0)
            first = r;
    if (missing)
        return bfs__err(BFS_EINCOMPLETE, "%s: %d of %d ranks are in no finished part (first: rank %d); run their parts "
                        "(convert --ranks), then merge", outdir, missing, W, first);
    return 0;
}

int bfs__manifest_merge(json_t *const *parts, const char *const *names, int n, const char *outdir, json_t **out)
{
    int rc = 0, W = 0;
    int *owner = NULL;
    json_t *m = NULL;
    *out = NULL;
    BFS_TRY(bfs__merge_agree(parts, names, n, outdir, &W));
    if (!(owner = malloc((size_t)W * sizeof *owner)))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__merge_owners(parts, names, n, outdir, W, owner));
    if (!(m = json_deep_copy(parts[0])))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    json_object_del(m, "part");
    /* files[]: a rank's entry from its part (with its compressed copy, if any) */
    json_t *files = json_object_get(m, "files");
    for (size_t i = 0; i < json_array_size(files); i++) {
        const int r = bfs__entry_rank(json_array_get(files, i), W);
        if (r >= 0)
            json_array_set_new(files, i, json_deep_copy(json_array_get(json_object_get(parts[owner[r]], "files"), i)));
    }
    /* tensors[].shards[]: likewise */
    json_t *tensors = json_object_get(m, "tensors");
    for (size_t t = 0; t < json_array_size(tensors); t++) {
        json_t *sh = json_object_get(json_array_get(tensors, t), "shards");
        for (size_t s = 0; s < json_array_size(sh); s++) {
            const int r = bfs__entry_rank(json_array_get(sh, s), W);
            if (r < -1)
                BFS_FAIL(BFS_EINPUT, "%s: tensors[%zu].shards[%zu] has a rank outside 0..%d", outdir, t, s, W - 1);
            if (r < 0)
                continue;
            const json_t *osh = json_object_get(json_array_get(json_object_get(parts[owner[r]], "tensors"), t), "shards");
            const json_t *e = json_array_get(osh, s);
            if (!json_is_string(json_object_get(e, BFS_MF_HASH)))
                BFS_FAIL(BFS_EPARTS, "%s: %s lacks the hash of tensors[%zu].shards[%zu] of its rank %d", outdir,
                         names[owner[r]], t, s, r);
            json_array_set_new(sh, s, json_deep_copy(e));
        }
    }
    /* source.files[]: each hashed by one part */
    json_t *src = json_object_get(json_object_get(m, "source"), "files");
    for (size_t i = 0; i < json_array_size(src); i++) {
        int k = 0;
        while (k < n && !json_is_string(json_object_get(
                            json_array_get(json_object_get(json_object_get(parts[k], "source"), "files"), i), BFS_MF_SRC_HASH)))
            k++;
        if (k == n)
            BFS_FAIL(BFS_EINCOMPLETE, "%s: no part hashed source file %s", outdir,
                     json_string_value(json_object_get(json_array_get(src, i), "name")));
        json_array_set_new(src, i, json_deep_copy(json_array_get(json_object_get(json_object_get(parts[k], "source"), "files"), i)));
    }
    json_object_set_new(m, BFS_MF_SEAL, json_string(BFS_MF_ZERO_SEAL));
    *out = m;
    m = NULL;
cleanup:
    free(owner);
    json_decref(m);
    return rc;
}
