/*
 * Verify's checks beyond the seal (see manifest.h): xxh128sums.txt (and sha256sums.txt)
 * against the manifest,
 * and narrowing a file that does not match down to its tensors through an index of the
 * shards by file, built from tensors[] read again one tensor at a time.
 */
#include "output/manifest_int.h"

#include <stdlib.h>
#include <string.h>

/* ---- xxh128sums.txt (and sha256sums.txt) against the manifest -----------------------------------
 * An index name -> [hash, ...] of files[] and their compressed copies, built once: each
 * line is then one lookup (a 3000-file manifest used to cost lines x files). */
static int bfs__sums_index_add(json_t *ix, const json_t *e, const char *key)
{
    const char *n = json_string_value(json_object_get(e, "name")), *h = json_string_value(json_object_get(e, key));
    if (!n || !h)
        return 0;
    json_t *a = json_object_get(ix, n);
    if (!a && (json_object_set_new(ix, n, a = json_array()) != 0 || !a))
        return -1;
    return json_array_append_new(a, json_string(h));
}

/* `name` in OUTDIR: lines "HEX  NAME" (hexlen digits) of the entries' `key` hashes */
static int bfs__check_sums_file(const char *outdir, const json_t *files, FILE *report, const char *name,
                                const char *key, size_t hexlen)
{
    char *path = bfs__path_join(outdir, name), *text = NULL, ep[BFS_ESC_MAX];
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
        if (bfs__sums_index_add(ix, f, key) != 0 || bfs__sums_index_add(ix, json_object_get(f, "zst"), key) != 0) {
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
        bool ok = nl && ll > hexlen + 2 && l[hexlen] == ' ' && l[hexlen + 1] == ' ';
        for (size_t i = 0; ok && i < hexlen; i++)
            ok = (l[i] >= '0' && l[i] <= '9') || (l[i] >= 'a' && l[i] <= 'f');
        const json_t *hs = ok ? json_object_getn(ix, l + hexlen + 2, ll - hexlen - 2) : NULL;
        bool found = false;
        for (size_t k = 0; k < json_array_size(hs) && !found; k++) {
            const char *h = json_string_value(json_array_get(hs, k));
            found = h && strlen(h) == hexlen && !strncmp(h, l, hexlen);
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

int bfs__manifest_check_sums(const char *outdir, const json_t *files, FILE *report)
{
    int bad = bfs__check_sums_file(outdir, files, report, BFS_SUMS_NAME, BFS_MF_HASH, 32);
    if (bfs__manifest_has_sha256(files)) /* a manifest without sha256 has no such file to check */
        bad += bfs__check_sums_file(outdir, files, report, BFS_SHA256SUMS_NAME, BFS_MF_SHA256, 64);
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
            else if (!bfs__hex16_parse(sw, e->hash))
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
            bfs__hex16_str(e->hash, sw);
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
