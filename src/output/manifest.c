/*
 * The manifest's format (see manifest.h): bfshard.manifest.json is built here from a
 * finished conversion, rewritten here for `compress`, sealed here, and read here for
 * verify; xxh128sums.txt is written and checked here. Verify's report lines go
 * through bfs__report (also here: every report line names a manifest entry).
 */
#include "output/manifest.h"
#include "base/bfs_io.h"
#include "output/durable.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* ---- reading ------------------------------------------------------------------------------- */
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

/* ---- reading, streamed --------------------------------------------------------------------
 * A manifest is read through a window of BFS_MF_WIN bytes, never whole (467 MB for 200k
 * tensors at W = 8; a tree of it took 3.4 GB). One pass over the bytes checks the JSON's
 * structure with a strict scanner (strings and their escapes, nesting, colons, commas,
 * whitespace; scalars are runs of [A-Za-z0-9+-.], jansson checks them), hashes them for
 * the seal (the seal's 32 hex digits taken as '0's), finds the top object's "tensors"
 * array and cuts every element out of it: jansson parses each alone
 * (JSON_REJECT_DUPLICATES) and it must be an object. jansson then parses everything but
 * the array (the head), read again from the file with a placeholder string in the
 * array's place. The tensors are read again, one at a time, by bfs__mf_next(). */
#define BFS_MF_WIN ((size_t)1 << 20)
#define BFS_MF_MAXDEPTH 64 /* a manifest nests 5 deep */
#define BFS_MF_RET(expr)                                                                   \
    do {                                                                                   \
        const int rc_ = (expr);                                                            \
        if (rc_ < 0)                                                                       \
            return rc_;                                                                    \
    } while (0)

enum { MS_VALUE, MS_VALUE_OR_END, MS_KEY_OR_END, MS_KEY, MS_COLON, MS_COMMA_OR_END, MS_STR, MS_ESC, MS_UHEX, MS_SCALAR,
       MS_DONE };

struct bfs_mf {
    char *path;
    int fd;
    uint64_t len;
    int flags;
    /* the window: bytes [woff, woff + wlen) of the file; the scanner is at wpos */
    char *win;
    uint64_t woff;
    size_t wlen, wpos;
    /* the scanner */
    int state, depth, uhex;
    bool str_key, key_tensors, want_tensors, in_tensors, seen_tensors, stop_at_array_end;
    unsigned char stack[BFS_MF_MAXDEPTH];
    char key[8];
    size_t keylen;
    uint64_t arr_lo, arr_hi; /* the tensors array: text[arr_lo] '[' .. text[arr_hi - 1] ']' */
    /* the element being cut out */
    bool in_el;
    uint64_t el_off;
    size_t el_seg, el_n, el_cap, nel, ntensors;
    char *el;
    /* the seal: its digits' offset (UINT64_MAX: none), what they say, what the bytes hash to */
    XXH3_state_t *st;
    uint64_t seal_at;
    char seal_want[33], seal_got[33];
    json_t *head;
};

static int bfs__mf_bad(const bfs_mf *r, uint64_t at, const char *what)
{
    return bfs__err(BFS_EINPUT, "%s: not a bfshard manifest (malformed JSON at byte %llu: %s)", r->path,
                    (unsigned long long)at, what);
}

/* hash [off, off + n) with the seal's digits as '0's */
static void bfs__mf_hash(bfs_mf *r, const char *p, size_t n, uint64_t off)
{
    static const char zeros[32] = "00000000000000000000000000000000";
    const uint64_t s = r->seal_at, e = s == UINT64_MAX ? s : s + 32;
    if (s == UINT64_MAX || off + n <= s || off >= e) {
        XXH3_128bits_update(r->st, p, n);
        return;
    }
    const size_t a = s > off ? (size_t)(s - off) : 0, b = e < off + n ? (size_t)(e - off) : n;
    XXH3_128bits_update(r->st, p, a);
    XXH3_128bits_update(r->st, zeros + (a ? 0 : (size_t)(off - s)), b - a);
    XXH3_128bits_update(r->st, p + b, n - b);
}

/* The seal's digits: after the last "manifest_xxh3_128": " in the file, 32 of them and a
 * '"' (bfs__seal_find's rule), found from the end backwards. */
static int bfs__mf_find_seal(bfs_mf *r)
{
    const size_t kl = strlen(BFS_SEAL_KEY);
    uint64_t hi = r->len;
    r->seal_at = UINT64_MAX;
    while (hi >= kl) {
        const uint64_t lo = hi > BFS_MF_WIN ? hi - BFS_MF_WIN : 0;
        const size_t n = (size_t)(hi - lo);
        BFS_MF_RET(bfs__pread_all(r->fd, r->win, n, lo, r->path));
        char *hit = NULL;
        for (char *p = r->win; (p = memmem(p, n - (size_t)(p - r->win), BFS_SEAL_KEY, kl)) != NULL; p++)
            hit = p + kl;
        if (hit) {
            const uint64_t at = lo + (uint64_t)(hit - r->win);
            char d[33];
            if (at + 33 <= r->len) {
                BFS_MF_RET(bfs__pread_all(r->fd, d, 33, at, r->path));
                if (d[32] == '"') {
                    r->seal_at = at;
                    memcpy(r->seal_want, d, 32);
                    r->seal_want[32] = '\0';
                }
            }
            return 0;
        }
        if (lo == 0)
            break;
        hi = lo + kl - 1; /* an occurrence across the windows' border */
    }
    return 0;
}

static int bfs__mf_el_append(bfs_mf *r, const char *p, size_t n)
{
    if (r->el_n + n > r->el_cap) {
        const size_t nc = (r->el_n + n) * 2;
        char *ne = realloc(r->el, nc);
        if (!ne)
            return bfs__err(BFS_ENOMEM, "%s: out of memory reading tensors[%zu]", r->path, r->nel);
        r->el = ne;
        r->el_cap = nc;
    }
    memcpy(r->el + r->el_n, p, n);
    r->el_n += n;
    return 0;
}

/* A value begins with c at byte `at` (window index i). */
static int bfs__mf_value(bfs_mf *r, char c, uint64_t at, size_t i)
{
    const bool tens = r->want_tensors;
    r->want_tensors = false;
    if (r->depth == 0 && c != '{')
        return bfs__mf_bad(r, at, "not a JSON object");
    if (c == ']' || c == '}')
        return bfs__mf_bad(r, at, "expected a value");
    if (r->in_tensors && r->depth == 2) { /* an element of tensors[] */
        if (c != '{') {
            char m[64];
            snprintf(m, sizeof m, "tensors[%zu] is not an object", r->nel);
            return bfs__mf_bad(r, at, m);
        }
        r->in_el = true;
        r->el_off = at;
        r->el_seg = i;
        r->el_n = 0;
    }
    if (tens && c != '[')
        return bfs__mf_bad(r, at, "\"tensors\" is not an array");
    if (c == '{' || c == '[') {
        if (r->depth == BFS_MF_MAXDEPTH)
            return bfs__mf_bad(r, at, "nested too deep");
        r->stack[r->depth++] = (unsigned char)c;
        r->state = c == '{' ? MS_KEY_OR_END : MS_VALUE_OR_END;
        if (tens) {
            r->in_tensors = r->seen_tensors = true;
            r->arr_lo = at;
        }
    } else if (c == '"') {
        r->state = MS_STR;
        r->str_key = false;
    } else if (c == '-' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')) {
        r->state = MS_SCALAR;
    } else {
        return bfs__mf_bad(r, at, "expected a value");
    }
    return 0;
}

/* A value ended at window index i; 1 when it was an element of tensors[] (cut out). */
static int bfs__mf_value_end(bfs_mf *r, size_t i)
{
    r->state = r->depth == 0 ? MS_DONE : MS_COMMA_OR_END;
    if (!(r->in_el && r->depth == 2))
        return 0;
    r->in_el = false;
    BFS_MF_RET(bfs__mf_el_append(r, r->win + r->el_seg, i + 1 - r->el_seg));
    return 1;
}

/* '}' or ']' at byte at: *done when it closed tensors[] and the reader stops there */
static int bfs__mf_closer(bfs_mf *r, char c, uint64_t at, size_t i, bool *done)
{
    if (r->depth == 0 || r->stack[r->depth - 1] != (c == '}' ? '{' : '['))
        return bfs__mf_bad(r, at, c == '}' ? "'}' closes no object" : "']' closes no array");
    r->depth--;
    if (r->in_tensors && r->depth == 1) {
        r->in_tensors = false;
        r->arr_hi = at + 1;
        *done = r->stop_at_array_end;
    }
    return bfs__mf_value_end(r, i);
}

/* Scan on: 1 when an element of tensors[] is cut out (r->el, r->el_n), 0 at the end of
 * the file (or of tensors[] when stop_at_array_end), < 0 on an error. */
static int bfs__mf_scan(bfs_mf *r)
{
    for (;;) {
        if (r->wpos == r->wlen) {
            if (r->in_el && r->wlen > r->el_seg)
                BFS_MF_RET(bfs__mf_el_append(r, r->win + r->el_seg, r->wlen - r->el_seg));
            r->el_seg = 0;
            r->woff += r->wlen;
            r->wpos = r->wlen = 0;
            if (r->woff >= r->len) {
                if (r->state == MS_SCALAR && r->depth == 0)
                    r->state = MS_DONE;
                if (r->state != MS_DONE || r->stop_at_array_end)
                    return bfs__mf_bad(r, r->len, "the file ends inside the JSON (truncated?)");
                return 0;
            }
            r->wlen = r->len - r->woff < BFS_MF_WIN ? (size_t)(r->len - r->woff) : BFS_MF_WIN;
            BFS_MF_RET(bfs__pread_all(r->fd, r->win, r->wlen, r->woff, r->path));
            if (r->st)
                bfs__mf_hash(r, r->win, r->wlen, r->woff);
        }
        const char *w = r->win;
        const size_t n = r->wlen;
        size_t i = r->wpos;
        while (i < n) {
            const char c = w[i];
            const uint64_t at = r->woff + i;
            int got = 0;
            bool done = false;
            switch (r->state) {
            case MS_STR: {
                size_t j = i;
                while (j < n && w[j] != '"' && w[j] != '\\' && (unsigned char)w[j] >= 0x20)
                    j++;
                if (r->str_key && r->depth == 1) { /* a key of the top object: is it "tensors"? */
                    for (size_t k = i; k < j && r->keylen < sizeof r->key; k++)
                        r->key[r->keylen++] = w[k];
                }
                i = j;
                if (i == n)
                    continue;
                const uint64_t sat = r->woff + i;
                if (w[i] == '\\') {
                    if (r->str_key && r->depth == 1)
                        r->keylen = sizeof r->key + 1; /* an escaped key is not the plain "tensors" */
                    r->state = MS_ESC;
                } else if (w[i] == '"') {
                    if (r->str_key) {
                        r->state = MS_COLON;
                        r->key_tensors = r->depth == 1 && r->keylen == 7 && !memcmp(r->key, "tensors", 7);
                        if (r->key_tensors && r->seen_tensors)
                            return bfs__mf_bad(r, sat, "a second \"tensors\" key");
                    } else {
                        got = bfs__mf_value_end(r, i);
                    }
                } else {
                    return bfs__mf_bad(r, sat, "a control character inside a string");
                }
                break;
            }
            case MS_ESC:
                if (c == 'u') {
                    r->uhex = 4;
                    r->state = MS_UHEX;
                } else if (strchr("\"\\/bfnrt", c) && c) {
                    r->state = MS_STR;
                } else {
                    return bfs__mf_bad(r, at, "a bad escape inside a string");
                }
                break;
            case MS_UHEX:
                if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
                    return bfs__mf_bad(r, at, "a bad \\u escape inside a string");
                if (--r->uhex == 0)
                    r->state = MS_STR;
                break;
            case MS_SCALAR:
                if (c == '-' || c == '+' || c == '.' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                    (c >= 'A' && c <= 'Z'))
                    break;
                got = bfs__mf_value_end(r, i - 1); /* never an element: elements are objects */
                continue;                          /* c again, after the scalar */
            default:
                if (c == ' ' || c == '\n' || c == '\t' || c == '\r')
                    break;
                switch (r->state) {
                case MS_VALUE:
                    BFS_MF_RET(bfs__mf_value(r, c, at, i));
                    break;
                case MS_VALUE_OR_END:
                    if (c == ']' || c == '}')
                        got = bfs__mf_closer(r, c, at, i, &done);
                    else
                        BFS_MF_RET(bfs__mf_value(r, c, at, i));
                    break;
                case MS_KEY_OR_END:
                case MS_KEY:
                    if (c == '}' && r->state == MS_KEY_OR_END) {
                        got = bfs__mf_closer(r, c, at, i, &done);
                    } else if (c == '"') {
                        r->state = MS_STR;
                        r->str_key = true;
                        r->keylen = 0;
                    } else {
                        return bfs__mf_bad(r, at, r->state == MS_KEY ? "expected a key after ','" : "expected a key or '}'");
                    }
                    break;
                case MS_COLON:
                    if (c != ':')
                        return bfs__mf_bad(r, at, "expected ':' after a key");
                    r->state = MS_VALUE;
                    r->want_tensors = r->key_tensors;
                    r->key_tensors = false;
                    break;
                case MS_COMMA_OR_END:
                    if (c == ',')
                        r->state = r->stack[r->depth - 1] == '{' ? MS_KEY : MS_VALUE;
                    else if (c == '}' || c == ']')
                        got = bfs__mf_closer(r, c, at, i, &done);
                    else
                        return bfs__mf_bad(r, at, r->stack[r->depth - 1] == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
                    break;
                case MS_DONE:
                    return bfs__mf_bad(r, at, "more after the JSON object");
                }
            }
            if (got < 0)
                return got;
            i++;
            if (got || done) {
                r->wpos = i;
                return done ? 0 : 1;
            }
        }
        r->wpos = i;
    }
}

/* Parse the element cut out: *out an object (new reference). */
static int bfs__mf_parse_el(bfs_mf *r, json_t **out)
{
    json_error_t jerr;
    *out = json_loadb(r->el, r->el_n, JSON_REJECT_DUPLICATES, &jerr);
    if (*out)
        return 0;
    if (json_error_code(&jerr) == json_error_out_of_memory)
        return bfs__err(BFS_ENOMEM, "%s: out of memory reading tensors[%zu]", r->path, r->nel);
    char m[256];
    snprintf(m, sizeof m, "tensors[%zu]: %s", r->nel, jerr.text);
    return bfs__mf_bad(r, r->el_off + (uint64_t)(jerr.position > 0 ? jerr.position : 0), m);
}

/* json_load_callback's source: the file, with a placeholder in tensors[]'s place */
typedef struct {
    const bfs_mf *r;
    uint64_t pos; /* in the virtual text */
    int rc;
} bfs_mf_headsrc;

#define BFS_MF_HOLE_TEXT "\"" BFS_MF_TENSORS_HOLE "\""

static size_t bfs__mf_head_read(void *buf, size_t cap, void *data)
{
    bfs_mf_headsrc *h = data;
    const bfs_mf *r = h->r;
    const uint64_t hl = r->seen_tensors ? strlen(BFS_MF_HOLE_TEXT) : 0;
    const uint64_t a = r->seen_tensors ? r->arr_lo : r->len, b = r->seen_tensors ? r->arr_hi : r->len;
    const uint64_t vlen = a + hl + (r->len - b);
    if (h->pos >= vlen || h->rc)
        return 0;
    size_t n;
    if (h->pos < a) {
        n = a - h->pos < cap ? (size_t)(a - h->pos) : cap;
        if ((h->rc = bfs__pread_all(r->fd, buf, n, h->pos, r->path)) < 0)
            return (size_t)-1;
    } else if (h->pos < a + hl) {
        n = a + hl - h->pos < cap ? (size_t)(a + hl - h->pos) : cap;
        memcpy(buf, BFS_MF_HOLE_TEXT + (h->pos - a), n);
    } else {
        const uint64_t fo = b + (h->pos - a - hl);
        n = r->len - fo < cap ? (size_t)(r->len - fo) : cap;
        if ((h->rc = bfs__pread_all(r->fd, buf, n, fo, r->path)) < 0)
            return (size_t)-1;
    }
    h->pos += n;
    return n;
}

int bfs__mf_open(const char *outdir, const char *name, int flags, bfs_mf_each_fn each, void *user, bfs_mf **out)
{
    return bfs__mf_openat(-1, outdir, name, flags, each, user, out);
}

int bfs__mf_openat(int dirfd, const char *outdir, const char *name, int flags, bfs_mf_each_fn each, void *user,
                   bfs_mf **out)
{
    int rc = 0;
    struct stat sb;
    json_t *t = NULL;
    bfs_mf *r = calloc(1, sizeof *r);
    *out = NULL;
    if (r)
        r->fd = -1;
    if (!r || !(r->path = bfs__path_join(outdir, name)) || !(r->win = malloc(BFS_MF_WIN))) {
        rc = bfs__err(BFS_ENOMEM, "out of memory");
        goto cleanup;
    }
    r->flags = flags;
    /* a FIFO must not block us: it is rejected below */
    r->fd = dirfd < 0 ? open(r->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
                      : openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (r->fd < 0)
        BFS_FAIL(errno == ENOENT || errno == ELOOP || errno == ENOTDIR ? BFS_EINPUT : errno == ENOMEM ? BFS_ENOMEM : BFS_EIO,
                 "%s: cannot open: %s", r->path, strerror(errno));
    if (fstat(r->fd, &sb) != 0)
        BFS_FAIL(BFS_EIO, "%s: cannot stat: %s", r->path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        BFS_FAIL(BFS_EINPUT, "%s: not a regular file", r->path);
    r->len = (uint64_t)sb.st_size;
    BFS_TRY(bfs__mf_find_seal(r));
    if (!(r->st = XXH3_createState()) || XXH3_128bits_reset(r->st) != XXH_OK)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    int got;
    while ((got = bfs__mf_scan(r)) > 0) {
        if (!(flags & BFS_MF_HEAD_ONLY)) {
            BFS_TRY(bfs__mf_parse_el(r, &t));
            if (each)
                BFS_TRY(each(user, r->nel, t));
            json_decref(t);
            t = NULL;
        }
        r->nel++;
    }
    BFS_TRY(got);
    r->ntensors = r->nel;
    bfs__hash_hex(XXH3_128bits_digest(r->st), r->seal_got);
    XXH3_freeState(r->st);
    r->st = NULL;
    {
        bfs_mf_headsrc hs = {r, 0, 0};
        json_error_t jerr;
        r->head = json_load_callback(bfs__mf_head_read, &hs, JSON_REJECT_DUPLICATES, &jerr);
        BFS_TRY(hs.rc);
        if (!r->head && json_error_code(&jerr) == json_error_out_of_memory)
            BFS_FAIL(BFS_ENOMEM, "%s: out of memory", r->path);
        if (!r->head) {
            uint64_t at = (uint64_t)(jerr.position > 0 ? jerr.position : 0);
            const uint64_t hl = strlen(BFS_MF_HOLE_TEXT);
            if (r->seen_tensors && at > r->arr_lo)
                at = at < r->arr_lo + hl ? r->arr_lo : at - r->arr_lo - hl + r->arr_hi;
            rc = bfs__mf_bad(r, at, jerr.text);
            goto cleanup;
        }
    }
    *out = r;
    r = NULL;
cleanup:
    json_decref(t);
    bfs__mf_free(r);
    return rc;
}

void bfs__mf_free(bfs_mf *r)
{
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    XXH3_freeState(r->st);
    json_decref(r->head);
    free(r->el);
    free(r->win);
    free(r->path);
    free(r);
}

const char *bfs__mf_path(const bfs_mf *r) { return r->path; }
json_t *bfs__mf_head(const bfs_mf *r) { return r->head; }
size_t bfs__mf_ntensors(const bfs_mf *r) { return r->ntensors; }
bool bfs__mf_has_tensors(const bfs_mf *r) { return r->seen_tensors; }

int bfs__mf_rewind(bfs_mf *r)
{
    if (!r->seen_tensors)
        return bfs__err(BFS_EINPUT, "%s: not a bfshard manifest (no tensors array)", r->path);
    r->woff = r->arr_lo + 1; /* just after '[' */
    r->wlen = r->wpos = r->el_seg = 0;
    r->state = MS_VALUE_OR_END;
    r->depth = 2;
    r->stack[0] = '{';
    r->stack[1] = '[';
    r->in_tensors = r->stop_at_array_end = true;
    r->in_el = r->want_tensors = r->key_tensors = false;
    r->nel = 0;
    return 0;
}

int bfs__mf_next(bfs_mf *r, json_t **tensor)
{
    *tensor = NULL;
    if (!r->stop_at_array_end)
        BFS_MF_RET(bfs__mf_rewind(r));
    if (!r->in_tensors)
        return 0;
    const int got = bfs__mf_scan(r);
    if (got <= 0)
        return got;
    BFS_MF_RET(bfs__mf_parse_el(r, tensor));
    r->nel++;
    return 1;
}

int bfs__mf_check_seal(const bfs_mf *r, FILE *report)
{
    const char *jv = json_string_value(json_object_get(r->head, BFS_MF_SEAL));
    const bool v = r->seal_at != UINT64_MAX;
    if (v && jv && strcmp(jv, r->seal_want) == 0 && strcmp(r->seal_got, r->seal_want) == 0)
        return 0;
    if (!v || !jv)
        bfs__report(report, "%s: BAD manifest: no \"manifest_xxh3_128\" seal", r->path);
    else
        bfs__report(report, "%s: BAD manifest: its bytes hash to %s, its seal says %s", r->path, r->seal_got, r->seal_want);
    return 1;
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

/* one tensor of tensors[], at depth 2, after "[\n  " (the first) or ",\n  " */
static int bfs__mf_put_elem(bfs_mf_out *w, const json_t *e, bool first)
{
    bfs__mf_puts(w, first ? "[\n  " : ",\n  ");
    const int drc = json_dump_callback(e, bfs__mf_put_tensor, w, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    if (w->rc < 0)
        return w->rc;
    return drc != 0 ? bfs__err(BFS_ENOMEM, "out of memory writing the manifest") : 0;
}

/* the end of tensors[] of n elements */
static void bfs__mf_put_end(bfs_mf_out *w, size_t n) { bfs__mf_puts(w, n ? "\n ]" : "[]"); }

/* writes tensors[]'s bytes; then, the manifest's temporary complete and sealed, pre_commit
 * (may be NULL) runs before the commit: an error there leaves no manifest */
typedef int (*bfs_mf_emit_fn)(bfs_mf_out *w, void *user);
typedef int (*bfs_mf_pre_commit_fn)(void *user); /* before the commit */

static int bfs__mf_write_streamed(int dirfd, const char *outdir, const char *name, const json_t *head,
                                  bfs_mf_emit_fn emit, void *user, bfs_mf_pre_commit_fn pre_commit, void *pre_user)
{
    const size_t flags = JSON_INDENT(1) | JSON_PRESERVE_ORDER, kl = strlen(BFS_MF_TENSORS_KEY);
    const size_t hl = strlen("\"" BFS_MF_TENSORS_HOLE "\"");
    int rc = 0;
    bfs_tmpfile t = {.fd = -1, .dirfd = -1};
    bfs_mf_out w = {.fd = -1};
    size_t len = 0;
    char *text = bfs__json_text(head, flags, &len), *key = NULL, what[PATH_MAX + NAME_MAX + 32], hex[33];
    if (!text)
        BFS_FAIL(BFS_ENOMEM, "out of memory building the manifest");
    key = memmem(text, len, BFS_MF_TENSORS_KEY, kl);
    char *const hole = key ? key + kl : NULL, *const tail = hole ? hole + hl : NULL;
    char *const seal = tail && (size_t)(tail - text) <= len && !memcmp(hole, "\"" BFS_MF_TENSORS_HOLE "\"", hl)
                           ? bfs__seal_find(tail, len - (size_t)(tail - text)) : NULL;
    if (!seal)
        BFS_FAIL(BFS_EINTERNAL, "manifest head without its tensors placeholder or its seal");
    memset(seal, '0', 32); /* a head read from a sealed manifest carries the old seal */
    w.buf = malloc(BFS_MF_BUF);
    w.st = XXH3_createState();
    if (!w.buf || !w.st || XXH3_128bits_reset(w.st) != XXH_OK)
        BFS_FAIL(BFS_ENOMEM, "out of memory writing the manifest");
    BFS_TRY(bfs__tmp_open(&t, dirfd, outdir, name));
    snprintf(what, sizeof what, "%s/%s", t.dir, t.tmp);
    w.fd = t.fd;
    w.what = what;
    bfs__mf_put(&w, text, (size_t)(hole - text));
    BFS_TRY(emit(&w, user));
    const uint64_t seal_at = w.off + w.n + (uint64_t)(seal - tail);
    bfs__mf_put(&w, tail, len - (size_t)(tail - text));
    bfs__mf_flush(&w);
    BFS_TRY(w.rc);
    bfs__hash_hex(XXH3_128bits_digest(w.st), hex);
    BFS_TRY(bfs__pwrite_all(t.fd, hex, 32, seal_at, what));
    if (pre_commit)
        BFS_TRY(pre_commit(pre_user));
    BFS_TRY(bfs__tmp_commit(&t));
cleanup:
    bfs__tmp_abort(&t);
    XXH3_freeState(w.st);
    free(w.buf);
    free(text);
    return rc;
}

/* convert's tensors[]: built from the plan one tensor at a time */
typedef struct {
    const bfs_manifest_in *mi;
    size_t *first;
    bfs_piece_at *at;
} bfs_mf_conv;

static int bfs__mf_emit_conv(bfs_mf_out *w, void *user)
{
    const bfs_mf_conv *c = user;
    const bfs_plan *p = c->mi->plan;
    size_t shards = 0, pieces = 0;
    for (int f = 0; f < p->nfiles; f++)
        pieces += p->files[f].npieces;
    for (size_t i = 0; i < p->nt; i++) {
        json_t *e = bfs__manifest_tensor(c->mi, i, c->first, c->at);
        if (!e)
            return bfs__err(BFS_ENOMEM, "out of memory building the manifest");
        shards += c->first[i + 1] - c->first[i];
        const int rc = bfs__mf_put_elem(w, e, i == 0);
        json_decref(e);
        BFS_MF_RET(rc);
    }
    bfs__mf_put_end(w, p->nt);
    if (shards != pieces) /* every tensor, every shard: never a short manifest */
        return bfs__err(BFS_EINTERNAL, "manifest of %zu shards for %zu pieces", shards, pieces);
    return w->rc;
}

int bfs__manifest_write_conv(int dirfd, const char *outdir, const char *name, const bfs_manifest_in *mi,
                             const json_t *head)
{
    bfs_mf_conv c = {mi, NULL, NULL};
    int rc = bfs__pieces_by_tensor(mi->plan, &c.first, &c.at);
    if (rc == 0)
        rc = bfs__mf_write_streamed(dirfd, outdir, name, head, bfs__mf_emit_conv, &c, NULL, NULL);
    free(c.first);
    free(c.at);
    return rc;
}

/* compress: tensors[] copied byte for byte from the manifest read */
static int bfs__mf_emit_copy(bfs_mf_out *w, void *user)
{
    bfs_mf *r = user;
    r->stop_at_array_end = false; /* the window is ours now: bfs__mf_next() starts over */
    for (uint64_t o = r->arr_lo; o < r->arr_hi && w->rc == 0;) {
        const size_t n = r->arr_hi - o < BFS_MF_WIN ? (size_t)(r->arr_hi - o) : BFS_MF_WIN;
        BFS_MF_RET(bfs__pread_all(r->fd, r->win, n, o, r->path));
        bfs__mf_put(w, r->win, n);
        o += n;
    }
    return w->rc;
}

int bfs__mf_write_copy(int dirfd, const char *outdir, const char *name, const json_t *head, bfs_mf *src)
{
    if (!src->seen_tensors)
        return bfs__err(BFS_EINPUT, "%s: not a bfshard manifest (no tensors array)", src->path);
    return bfs__mf_write_streamed(dirfd, outdir, name, head, bfs__mf_emit_copy, src, NULL, NULL);
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

/* ---- narrowing a bad file down to tensors -------------------------------------------------------
 * The shards by file, built when the first bad file needs them (a manifest that verifies
 * never pays for it), in two passes over tensors[] (count, then place: sorted by file
 * without a second copy), one tensor in memory at a time. 40 bytes per shard of a file
 * in files[], plus each tensor's name once: a bad file then costs its shards. */
#define BFS_SHARD_HEX UINT32_MAX         /* hash[] holds the hash */
#define BFS_SHARD_NOHASH (UINT32_MAX - 1) /* no hash: skipped */

typedef struct {
    uint64_t off, nbytes;
    uint32_t name;    /* the tensor's name in the pool */
    uint32_t hashref; /* BFS_SHARD_HEX, BFS_SHARD_NOHASH, or the manifest's (not hex) hash in the pool */
    uint8_t hash[16];
} bfs_shard_ent;
_Static_assert(sizeof(bfs_shard_ent) == 40, "a shard's index entry is 40 bytes");

struct bfs_shard_index {
    size_t n, nfiles;
    bfs_shard_ent *e;    /* by file (files[] order), then manifest order */
    size_t *first;       /* file i's entries: e[first[i] .. first[i + 1]) */
    json_t *fid;         /* files[] name -> its index */
    char *pool;
    size_t pool_n, pool_cap;
};

void bfs__manifest_shard_index_free(bfs_shard_index *ix)
{
    if (!ix)
        return;
    free(ix->e);
    free(ix->first);
    json_decref(ix->fid);
    free(ix->pool);
    free(ix);
}

static int bfs__ix_pool(bfs_shard_index *ix, const char *s, uint32_t *at)
{
    const size_t n = strlen(s) + 1;
    if (ix->pool_n + n > BFS_SHARD_NOHASH - 1)
        return bfs__err(BFS_ENOMEM, "out of memory indexing the manifest's shards (names over 4 GiB)");
    if (ix->pool_n + n > ix->pool_cap) {
        const size_t nc = (ix->pool_n + n) * 2;
        char *np = realloc(ix->pool, nc);
        if (!np)
            return bfs__err(BFS_ENOMEM, "out of memory indexing the manifest's shards");
        ix->pool = np;
        ix->pool_cap = nc;
    }
    memcpy(ix->pool + ix->pool_n, s, n);
    *at = (uint32_t)ix->pool_n;
    ix->pool_n += n;
    return 0;
}

static void bfs__hash_hex_bytes(const uint8_t h[16], char hex[33])
{
    static const char d[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        hex[2 * i] = d[h[i] >> 4];
        hex[2 * i + 1] = d[h[i] & 15];
    }
    hex[32] = '\0';
}

static bool bfs__hex16(const char *s, uint8_t out[16])
{
    if (strlen(s) != 32)
        return false;
    for (int i = 0; i < 32; i++) {
        const char c = s[i];
        const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            return false;
        out[i / 2] = (uint8_t)(i % 2 ? out[i / 2] | v : v << 4);
    }
    return true;
}

/* the files[] index of a shard's file, or -1 */
static long bfs__ix_file(const bfs_shard_index *ix, const json_t *sh)
{
    const char *sf = json_string_value(json_object_get(sh, "file"));
    const json_t *v = sf ? json_object_get(ix->fid, sf) : NULL;
    return v ? (long)json_integer_value(v) : -1;
}

/* one pass: count (place == NULL) or place each shard at its file's cursor */
static int bfs__ix_pass(bfs_mf *r, bfs_shard_index *ix, size_t *count, size_t *place)
{
    int rc = 0;
    json_t *te = NULL;
    BFS_TRY(bfs__mf_rewind(r));
    while ((rc = bfs__mf_next(r, &te)) > 0) {
        const json_t *shards = json_object_get(te, "shards");
        const char *tname = json_string_value(json_object_get(te, "name"));
        uint32_t name = 0;
        bool named = false;
        for (size_t s = 0; s < json_array_size(shards); s++) {
            const json_t *sh = json_array_get(shards, s);
            const long f = bfs__ix_file(ix, sh);
            if (f < 0)
                continue;
            if (!place) {
                count[f]++;
                continue;
            }
            if (place[f] >= ix->first[f + 1])
                BFS_FAIL(BFS_EINPUT, "%s: changed while it was read", bfs__mf_path(r));
            if (!named) {
                BFS_TRY(bfs__ix_pool(ix, tname ? tname : "?", &name));
                named = true;
            }
            bfs_shard_ent *e = &ix->e[place[f]++];
            const char *sw = bfs__manifest_hash(sh);
            e->off = (uint64_t)json_integer_value(json_object_get(sh, "offset"));
            e->nbytes = (uint64_t)json_integer_value(json_object_get(sh, "nbytes"));
            e->name = name;
            e->hashref = BFS_SHARD_HEX;
            if (!sw)
                e->hashref = BFS_SHARD_NOHASH;
            else if (!bfs__hex16(sw, e->hash))
                BFS_TRY(bfs__ix_pool(ix, sw, &e->hashref));
        }
        json_decref(te);
        te = NULL;
        if (bfs__cancelled())
            BFS_FAIL(BFS_EINTR, "interrupted while verifying %s", bfs__mf_path(r));
    }
cleanup:
    json_decref(te);
    return rc;
}

int bfs__manifest_shard_index(bfs_mf *r, const json_t *files, bfs_shard_index **out)
{
    int rc = 0;
    size_t *cur = NULL;
    bfs_shard_index *ix = calloc(1, sizeof *ix);
    *out = NULL;
    const size_t nf = json_array_size(files);
    if (!ix || !(ix->fid = json_object()) || !(ix->first = calloc(nf + 1, sizeof *ix->first)) ||
        !(cur = calloc(nf + 1, sizeof *cur)))
        BFS_FAIL(BFS_ENOMEM, "out of memory indexing the manifest's shards");
    ix->nfiles = nf;
    for (size_t i = 0; i < nf; i++) {
        const char *nm = json_string_value(json_object_get(json_array_get(files, i), "name"));
        if (nm && !json_object_get(ix->fid, nm) && json_object_set_new(ix->fid, nm, json_integer((json_int_t)i)) != 0)
            BFS_FAIL(BFS_ENOMEM, "out of memory indexing the manifest's shards");
    }
    BFS_TRY(bfs__ix_pass(r, ix, cur, NULL));
    for (size_t i = 0; i < nf; i++) {
        ix->first[i + 1] = ix->first[i] + cur[i];
        cur[i] = ix->first[i];
    }
    ix->n = ix->first[nf];
    if (!(ix->e = calloc(ix->n ? ix->n : 1, sizeof *ix->e)))
        BFS_FAIL(BFS_ENOMEM, "out of memory indexing the manifest's %zu shards", ix->n);
    BFS_TRY(bfs__ix_pass(r, ix, NULL, cur));
    for (size_t i = 0; i < nf; i++)
        if (cur[i] != ix->first[i + 1])
            BFS_FAIL(BFS_EINPUT, "%s: changed while it was read", bfs__mf_path(r));
    *out = ix;
    ix = NULL;
cleanup:
    free(cur);
    bfs__manifest_shard_index_free(ix);
    return rc;
}

int bfs__manifest_narrow(const bfs_shard_index *ix, const char *name, uint64_t size, const char *path, FILE *report,
                         bfs_manifest_hash_fn hash, void *user, bool report_read_errors, uint64_t *first_data)
{
    int bad = 0;
    uint64_t first = size;
    char ep[BFS_ESC_MAX], et[BFS_ESC_MAX], eh[BFS_ESC_MAX];
    const json_t *fv = ix ? json_object_get(ix->fid, name) : NULL;
    const size_t f = fv ? (size_t)json_integer_value(fv) : 0;
    for (size_t k = fv ? ix->first[f] : 0; fv && k < ix->first[f + 1]; k++) {
        const bfs_shard_ent *e = &ix->e[k];
        const char *tname = ix->pool + e->name;
        const uint64_t off = e->off, nb = e->nbytes;
        char sw[33];
        const char *want = sw;
        if (e->hashref == BFS_SHARD_HEX)
            bfs__hash_hex_bytes(e->hash, sw);
        else if (e->hashref != BFS_SHARD_NOHASH)
            want = ix->pool + e->hashref;
        if (off < first)
            first = off;
        if (off > size || nb > size - off || e->hashref == BFS_SHARD_NOHASH)
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
        if (strcmp(got, want) != 0) {
            bfs__report(report, "%s: BAD tensor \"%s\" bytes [%llu, %llu) (hash %s, manifest %s)",
                        bfs__esc(path, ep, sizeof ep), bfs__esc(tname, et, sizeof et), (unsigned long long)off,
                        (unsigned long long)(off + nb), got, bfs__esc(want, eh, sizeof eh));
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
 * same order, what a single run builds. The heads are merged as trees; tensors[] is read
 * from every part in lockstep, one tensor at a time, and written as convert writes it. */
bool bfs__manifest_part_info(const json_t *m, const char **ranks, int *world_size, const char **fingerprint)
{
    const json_t *p = json_object_get(m, "part"), *w = json_object_get(p, "world_size");
    *ranks = json_string_value(json_object_get(p, "ranks"));
    *fingerprint = json_string_value(json_object_get(m, "plan_fingerprint"));
    *world_size = json_is_integer(w) && json_integer_value(w) >= 1 && json_integer_value(w) <= 1000000
                      ? (int)json_integer_value(w) : 0;
    return *ranks && *fingerprint && *world_size && json_is_array(json_object_get(m, "files")) &&
           json_object_get(m, "tensors") && json_is_array(json_object_get(json_object_get(m, "source"), "files"));
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
static int bfs__merge_agree(bfs_mf *const *parts, const char *const *names, int n, const char *outdir, int *W)
{
    const char *r0, *fp0, *rk, *fpk;
    int wk;
    for (int k = 0; k < n; k++)
        if (!bfs__mf_has_tensors(parts[k]) || !bfs__manifest_part_info(bfs__mf_head(parts[k]), &rk, &wk, &fpk))
            return bfs__err(BFS_EINPUT, "%s/%s: not a bfshard part manifest (no \"part\", files or tensors)", outdir, names[k]);
    const json_t *m0 = bfs__mf_head(parts[0]);
    bfs__manifest_part_info(m0, &r0, W, &fp0);
    const json_t *f0 = json_object_get(m0, "files"), *s0 = json_object_get(json_object_get(m0, "source"), "files");
    for (int k = 1; k < n; k++) {
        const json_t *mk = bfs__mf_head(parts[k]);
        bfs__manifest_part_info(mk, &rk, &wk, &fpk);
        if (strcmp(fpk, fp0) != 0 || wk != *W || !json_equal(json_object_get(mk, "options"), json_object_get(m0, "options")) ||
            !json_equal(json_object_get(mk, "version"), json_object_get(m0, "version")))
            return bfs__err(BFS_EPARTS, "%s: %s (plan fingerprint %s) and %s (%s) are parts of different input or options; "
                            "remove the stale one and rerun its part", outdir, names[0], fp0, names[k], fpk);
        const json_t *fk = json_object_get(mk, "files"), *sk = json_object_get(json_object_get(mk, "source"), "files");
        if (json_array_size(fk) != json_array_size(f0) || bfs__mf_ntensors(parts[k]) != bfs__mf_ntensors(parts[0]) ||
            json_array_size(sk) != json_array_size(s0))
            return bfs__err(BFS_EPARTS, "%s: %s and %s list different files or tensors for the same plan", outdir, names[0], names[k]);
    }
    return 0;
}

/* owner[r]: the part holding rank r (its files[] entry hashed) */
static int bfs__merge_owners(bfs_mf *const *parts, const char *const *names, int n, const char *outdir, int W, int *owner)
{
    for (int r = 0; r < W; r++)
        owner[r] = -1;
    for (int k = 0; k < n; k++) {
        const json_t *files = json_object_get(bfs__mf_head(parts[k]), "files");
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

/* the merged head: part 0's, with every rank's files[] entry and every source hash from its part */
static int bfs__merge_head(bfs_mf *const *parts, int n, const char *outdir, int W, const int *owner, json_t **out)
{
    json_t *m = json_deep_copy(bfs__mf_head(parts[0]));
    *out = NULL;
    if (!m)
        return bfs__err(BFS_ENOMEM, "out of memory");
    json_object_del(m, "part");
    json_t *files = json_object_get(m, "files");
    for (size_t i = 0; i < json_array_size(files); i++) {
        const int r = bfs__entry_rank(json_array_get(files, i), W);
        if (r >= 0 && json_array_set_new(files, i, json_deep_copy(json_array_get(
                                                       json_object_get(bfs__mf_head(parts[owner[r]]), "files"), i))) != 0) {
            json_decref(m);
            return bfs__err(BFS_ENOMEM, "out of memory");
        }
    }
    json_t *src = json_object_get(json_object_get(m, "source"), "files");
    for (size_t i = 0; i < json_array_size(src); i++) {
        const json_t *e = NULL;
        for (int k = 0; k < n && !e; k++) {
            e = json_array_get(json_object_get(json_object_get(bfs__mf_head(parts[k]), "source"), "files"), i);
            if (!json_is_string(json_object_get(e, BFS_MF_SRC_HASH)))
                e = NULL;
        }
        if (!e) {
            const int rc = bfs__err(BFS_EINCOMPLETE, "%s: no part hashed source file %s", outdir,
                                    json_string_value(json_object_get(json_array_get(src, i), "name")));
            json_decref(m);
            return rc;
        }
        if (json_array_set_new(src, i, json_deep_copy(e)) != 0) {
            json_decref(m);
            return bfs__err(BFS_ENOMEM, "out of memory");
        }
    }
    if (json_object_set_new(m, BFS_MF_SEAL, json_string(BFS_MF_ZERO_SEAL)) != 0) {
        json_decref(m);
        return bfs__err(BFS_ENOMEM, "out of memory");
    }
    *out = m;
    return 0;
}

typedef struct {
    bfs_mf *const *parts;
    const char *const *names;
    int n, W;
    const int *owner;
    const char *outdir;
    json_t **el; /* tensor t of each part */
    const json_t *head;
    bfs_manifest_pre_commit_fn pre_commit;
    void *pre_user;
} bfs_mf_merge;

/* tensors[t]: part 0's, every shard of a rank from the part holding it */
static int bfs__mf_merge_one(bfs_mf_merge *g, size_t t)
{
    for (int k = 0; k < g->n; k++) {
        const int got = bfs__mf_next(g->parts[k], &g->el[k]);
        if (got == 0)
            return bfs__err(BFS_EPARTS, "%s: %s and %s list different files or tensors for the same plan", g->outdir,
                            g->names[0], g->names[k]);
        BFS_MF_RET(got);
    }
    json_t *sh = json_object_get(g->el[0], "shards");
    for (size_t s = 0; s < json_array_size(sh); s++) {
        const int r = bfs__entry_rank(json_array_get(sh, s), g->W);
        if (r < -1)
            return bfs__err(BFS_EINPUT, "%s: tensors[%zu].shards[%zu] has a rank outside 0..%d", g->outdir, t, s, g->W - 1);
        if (r < 0)
            continue;
        json_t *e = json_array_get(json_object_get(g->el[g->owner[r]], "shards"), s);
        if (!json_is_string(json_object_get(e, BFS_MF_HASH)))
            return bfs__err(BFS_EPARTS, "%s: %s lacks the hash of tensors[%zu].shards[%zu] of its rank %d", g->outdir,
                            g->names[g->owner[r]], t, s, r);
        if (json_array_set(sh, s, e) != 0)
            return bfs__err(BFS_ENOMEM, "out of memory");
    }
    return 0;
}

static int bfs__mf_emit_merge(bfs_mf_out *w, void *user)
{
    bfs_mf_merge *g = user;
    const size_t nt = bfs__mf_ntensors(g->parts[0]);
    int rc = 0;
    for (size_t t = 0; t < nt && rc == 0; t++) {
        rc = bfs__mf_merge_one(g, t);
        if (rc == 0)
            rc = bfs__mf_put_elem(w, g->el[0], t == 0);
        for (int k = 0; k < g->n; k++) {
            json_decref(g->el[k]);
            g->el[k] = NULL;
        }
    }
    if (rc == 0)
        bfs__mf_put_end(w, nt);
    return rc < 0 ? rc : w->rc;
}

static int bfs__mf_merge_pre_commit(void *user)
{
    const bfs_mf_merge *g = user;
    return g->pre_commit ? g->pre_commit(g->pre_user, g->head) : 0;
}

int bfs__manifest_merge(int dirfd, bfs_mf *const *parts, const char *const *names, int n, const char *outdir,
                        bfs_manifest_pre_commit_fn pre_commit, void *pre_user)
{
    int rc = 0, W = 0;
    int *owner = NULL;
    json_t *m = NULL, **el = NULL;
    BFS_TRY(bfs__merge_agree(parts, names, n, outdir, &W));
    if (!(owner = malloc((size_t)W * sizeof *owner)) || !(el = calloc((size_t)n, sizeof *el)))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__merge_owners(parts, names, n, outdir, W, owner));
    BFS_TRY(bfs__merge_head(parts, n, outdir, W, owner, &m));
    for (int k = 0; k < n; k++)
        BFS_TRY(bfs__mf_rewind(parts[k]));
    bfs_mf_merge g = {parts, names, n, W, owner, outdir, el, m, pre_commit, pre_user};
    BFS_TRY(bfs__mf_write_streamed(dirfd, outdir, BFS_MANIFEST_NAME, m, bfs__mf_emit_merge, &g, bfs__mf_merge_pre_commit, &g));
cleanup:
    free(owner);
    free(el);
    json_decref(m);
    return rc;
}
