/*
 * Writing manifests (see manifest.h): the streamed writer that puts a head and its
 * tensors[] out one tensor at a time and seals the bytes before the durable commit
 * (convert's manifest, manifest.c, goes through it), compress's rewrite (tensors[]
 * copied byte for byte from the manifest read), xxh128sums.txt, and the merge of a
 * conversion's parts into the manifest a single run writes.
 */
#include "output/manifest_int.h"
#include "output/durable.h"
#include "output/parts.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* ---- a conversion's manifest, streamed ----------------------------------------------------
 * tensors[] has an object per tensor and one per piece (1.6M pieces for 200k tensors at
 * W = 8): it is never a tree in memory. The head (bfs__manifest_build_head: every key,
 * "tensors" a placeholder string) is dumped whole, and the array goes in the
 * placeholder's place one tensor at a time: built as a small tree, dumped, freed. The
 * bytes are exactly json_dumps() of the whole tree with JSON_INDENT(1) |
 * JSON_PRESERVE_ORDER, plus '\n': a tensor is at depth 2, so its own dump gets two
 * spaces after each '\n' (a JSON string never holds a raw newline), and the array's
 * frame is jansson's, "[\n  " A ",\n  " B "\n ]", or "[]" when empty. The seal is the
 * head's last member; it is hashed as the bytes go out (the zero seal in place) and then
 * written at its offset, before the commit: temp file, fdatasync, rename, directory fsync
 * (durable.h). */
#define BFS_MF_TENSORS_KEY "\n \"tensors\": " /* only a key of the top object follows "\n " */
#define BFS_MF_BUF ((size_t)1 << 20)


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
int bfs__mf_put_elem(bfs_mf_out *w, const json_t *e, bool first)
{
    bfs__mf_puts(w, first ? "[\n  " : ",\n  ");
    const int drc = json_dump_callback(e, bfs__mf_put_tensor, w, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    if (w->rc < 0)
        return w->rc;
    return drc != 0 ? bfs__err(BFS_ENOMEM, "out of memory writing the manifest") : 0;
}

int bfs__mf_put_line(bfs_mf_out *w, const json_t *e, bool first)
{
    bfs__mf_puts(w, first ? "[\n  " : ",\n  ");
    const int drc = json_dump_callback(e, bfs__mf_put_tensor, w, JSON_INDENT(0) | JSON_PRESERVE_ORDER);
    if (w->rc < 0)
        return w->rc;
    return drc != 0 ? bfs__err(BFS_ENOMEM, "out of memory writing the manifest") : 0;
}

/* the end of tensors[] of n elements */
void bfs__mf_put_end(bfs_mf_out *w, size_t n) { bfs__mf_puts(w, n ? "\n ]" : "[]"); }


int bfs__mf_write_streamed(int dirfd, const char *outdir, const char *name, const json_t *head,
                           bfs_mf_emit_fn emit, void *user, bfs_mf_pre_commit_fn pre_commit, void *pre_user)
{
    const size_t flags = JSON_INDENT(1) | JSON_PRESERVE_ORDER, kl = strlen(BFS_MF_TENSORS_KEY);
    const size_t hl = strlen("\"" BFS_MF_TENSORS_HOLE "\"");
    int rc = 0;
    bfs_tmpfile t = {.fd = -1, .dirfd = -1};
    bfs_mf_out w = {.fd = -1};
    size_t len = 0;
    char *text = NULL, *key = NULL, what[PATH_MAX + NAME_MAX + 32], hex[33];
    /* The seal goes last, as 32 '0's, whatever a head read from a file held there: none, a
     * value of another length or with escapes, one before "tensors", or a nested
     * "manifest_xxh3_128" after it would each be taken for the seal (found by fuzz_manifest) */
    json_t *h = json_copy((json_t *)head); /* shallow: only the seal member is its own */
    if (h && json_object_size(h) != json_object_size(head)) { /* json_copy drops a key it failed to add */
        json_decref(h);
        h = NULL;
    }
    if (h)
        json_object_del(h, BFS_MF_SEAL);
    if (!h || json_object_set_new(h, BFS_MF_SEAL, json_string(BFS_MF_ZERO_SEAL)) != 0 || !(text = bfs__json_text(h, flags, &len)))
        BFS_FAIL(BFS_ENOMEM, "out of memory building the manifest");
    key = memmem(text, len, BFS_MF_TENSORS_KEY, kl);
    char *const hole = key ? key + kl : NULL, *const tail = hole ? hole + hl : NULL;
    char *const seal = tail && (size_t)(tail - text) <= len && !memcmp(hole, "\"" BFS_MF_TENSORS_HOLE "\"", hl)
                           ? bfs__seal_find(tail, len - (size_t)(tail - text)) : NULL;
    if (!seal)
        BFS_FAIL(BFS_EINTERNAL, "manifest head without its tensors placeholder or its seal");
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
    json_decref(h);
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
    char *sums = NULL, *shas = NULL;
    size_t k = 0, cap = 0, ks = 0, caps = 0;
    const bool sha = bfs__manifest_has_sha256(files);
    for (size_t i = 0; i < json_array_size(files); i++) {
        const json_t *f = json_array_get(files, i), *z = json_object_get(f, "zst");
        const char *name = json_string_value(json_object_get(f, "name")), *hx = bfs__manifest_hash(f);
        const char *zn = json_string_value(json_object_get(z, "name")), *zh = bfs__manifest_hash(z);
        const char *sh = bfs__manifest_sha256(f);
        const bool here = name && bfs__exists_at(dirfd, name);
        if (here && hx)
            BFS_TRY(bfs__sums_line(&sums, &k, &cap, hx, name));
        if (here && sh)
            BFS_TRY(bfs__sums_line(&shas, &ks, &caps, sh, name));
        if (zn && zh && bfs__exists_at(dirfd, zn))
            BFS_TRY(bfs__sums_line(&sums, &k, &cap, zh, zn));
    }
    BFS_TRY(bfs__write_durable(dirfd, outdir, BFS_SUMS_NAME, sums ? sums : "", k));
    if (sha) /* `sha256sum -c sha256sums.txt` */
        BFS_TRY(bfs__write_durable(dirfd, outdir, BFS_SHA256SUMS_NAME, shas ? shas : "", ks));
cleanup:
    free(sums);
    free(shas);
    return rc;
}

/* ---- parts: a part's manifest is the whole run's head with null hashes where
 * another part knows them, plus "part": {"ranks", "world_size", "tensors_total"}. Merging takes every
 * rank's entries (files[], and in v1 tensors[].shards[]) from the one part that holds the
 * rank, each slice index's entry (v2) and every source hash from the part that hashed it:
 * the result is, key for key and in the same order, what a single run builds. The heads
 * are merged as trees. A v2 tensors[] holds nothing per rank (docs/MANIFEST.md), and each part
 * lists its ranks' share of it (bfs__part_share): the shares are put together in rank
 * order, scanned, never parsed, so merging costs parts + files + the list's bytes (a part
 * from before shares lists them all: its list is copied byte for byte). A v1 tensors[] is
 * read from every part in lockstep, one tensor at a time, and written as convert wrote it. */
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
            !json_equal(json_object_get(mk, "version"), json_object_get(m0, "version")) ||
            !json_equal(json_object_get(mk, "manifest_version"), json_object_get(m0, "manifest_version")))
            return bfs__err(BFS_EPARTS, "%s: %s (plan fingerprint %s) and %s (%s) are parts of different input or options; "
                            "remove the stale one and rerun its part", outdir, names[0], fp0, names[k], fpk);
        const json_t *xk = json_object_get(json_object_get(mk, "source"), BFS_MF_SRC_SCHEME);
        const json_t *x0 = json_object_get(json_object_get(m0, "source"), BFS_MF_SRC_SCHEME);
        if ((xk || x0) && !json_equal(xk, x0)) /* a bfshard before "blocks-1" wrote one of them */
            return bfs__err(BFS_EPARTS, "%s: %s and %s hash the sources differently (%s %s, %s); rerun one of them with "
                            "this bfshard", outdir, names[0], names[k], BFS_MF_SRC_SCHEME,
                            x0 ? json_string_value(x0) : "none", xk ? json_string_value(xk) : "none");
        const json_t *fk = json_object_get(mk, "files"), *sk = json_object_get(json_object_get(mk, "source"), "files");
        if (json_array_size(fk) != json_array_size(f0) || json_array_size(sk) != json_array_size(s0))
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

/* A part's "part".tensors_total: 1 and *T when its tensors[] is its ranks' share, 0 when
 * it lists every tensor (a bfshard before shares), < 0 when malformed. */
static int bfs__part_total(const bfs_mf *part, const char *outdir, const char *name, uint64_t *T)
{
    const json_t *t = json_object_get(json_object_get(bfs__mf_head(part), "part"), BFS_MF_PART_TENSORS);
    *T = 0;
    if (!t)
        return 0;
    if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > ((json_int_t)1 << 40))
        return bfs__err(BFS_EINPUT, "%s/%s: part.%s is not a tensor count", outdir, name, BFS_MF_PART_TENSORS);
    *T = (uint64_t)json_integer_value(t);
    return 1;
}

/* Every part lists the tensors the plan says it does: its ranks' share of T (bfs__part_share),
 * or all T of them (a part by a bfshard before shares; *full: the first such part, or -1).
 * Counted by the read, so a part that lost or gained one is refused before anything is written. */
static int bfs__merge_tensor_counts(bfs_mf *const *parts, const char *const *names, int n, const char *outdir, int W,
                                    const int *owner, uint64_t *T, int *full)
{
    int rc = 0, first = -1; /* the first part that lists a share */
    uint64_t *want = calloc((size_t)n, sizeof *want);
    bool *all = calloc((size_t)n, sizeof *all);
    *full = -1;
    *T = 0;
    if (!want || !all)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (int k = 0; k < n; k++) {
        uint64_t Tk = 0;
        const int got = bfs__part_total(parts[k], outdir, names[k], &Tk);
        BFS_TRY(got);
        if ((all[k] = got == 0)) {
            *full = *full < 0 ? k : *full;
            continue;
        }
        if (first >= 0 && Tk != *T)
            BFS_FAIL(BFS_EPARTS, "%s: %s and %s list different files or tensors for the same plan", outdir,
                     names[first], names[k]);
        first = first < 0 ? k : first;
        *T = Tk;
    }
    if (*full >= 0) {
        if (first >= 0 && bfs__mf_ntensors(parts[*full]) != *T)
            BFS_FAIL(BFS_EPARTS, "%s: %s and %s list different files or tensors for the same plan", outdir,
                     names[*full], names[first]);
        *T = bfs__mf_ntensors(parts[*full]);
    }
    for (int r = 0; r < W; r++) {
        uint64_t lo = 0;
        want[owner[r]] += bfs__part_share(*T, W, r, &lo);
    }
    for (int k = 0; k < n; k++)
        if (bfs__mf_ntensors(parts[k]) != (all[k] ? *T : want[k]))
            BFS_FAIL(BFS_EPARTS, "%s/%s lists %zu tensors where its ranks hold %llu of %llu: rerun that part", outdir,
                     names[k], bfs__mf_ntensors(parts[k]), (unsigned long long)(all[k] ? *T : want[k]),
                     (unsigned long long)*T);
cleanup:
    free(want);
    free(all);
    return rc;
}

/* The merged source.files[] (in m, part 0's head): each file's content hash the sum of the
 * parts' sums of their terms (scheme "blocks-1", srchash.c), mod 2^128; before that scheme
 * (no content_xxh3_128_scheme) one part hashed each file whole and holds its hash. */
static int bfs__merge_sources(bfs_mf *const *parts, const char *const *names, int n, const char *outdir, json_t *m)
{
    json_t *src = json_object_get(json_object_get(m, "source"), "files");
    const bool sum = json_object_get(json_object_get(m, "source"), BFS_MF_SRC_SCHEME) != NULL;
    for (size_t i = 0; i < json_array_size(src); i++) {
        json_t *e = json_array_get(src, i);
        const json_t *from = NULL;
        uint64_t lo = 0, hi = 0;
        for (int k = 0; k < n; k++) {
            const json_t *ek = json_array_get(json_object_get(json_object_get(bfs__mf_head(parts[k]), "source"), "files"), i);
            if (!sum) {
                if (!from && json_is_string(json_object_get(ek, BFS_MF_SRC_HASH)))
                    from = ek;
                continue;
            }
            const char *hx = json_string_value(json_object_get(ek, BFS_MF_SRC_PART));
            XXH128_canonical_t c;
            if (!hx || !bfs__hex16_parse(hx, c.digest))
                return bfs__err(BFS_EINPUT, "%s/%s: source.files[%zu] has no %s (32 hex)", outdir, names[k], i,
                                BFS_MF_SRC_PART);
            const XXH128_hash_t d = XXH128_hashFromCanonical(&c);
            lo += d.low64;
            hi += d.high64 + (lo < d.low64);
        }
        if (!sum && !from)
            return bfs__err(BFS_EINCOMPLETE, "%s: no part hashed source file %s", outdir,
                            json_string_value(json_object_get(e, "name")));
        if (!sum) {
            if (json_array_set_new(src, i, json_deep_copy(from)) != 0)
                return bfs__err(BFS_ENOMEM, "out of memory");
            continue;
        }
        char hex[33];
        bfs__hash_hex((XXH128_hash_t){.low64 = lo, .high64 = hi}, hex);
        if (json_object_set_new(e, BFS_MF_SRC_HASH, json_string(hex)) != 0 || json_object_del(e, BFS_MF_SRC_PART) != 0)
            return bfs__err(BFS_ENOMEM, "out of memory");
    }
    return 0;
}

/* the merged head: part 0's, with every rank's files[] entry from its part, and the sources' hashes */
static int bfs__merge_head(bfs_mf *const *parts, const char *const *names, int n, const char *outdir, int W,
                           const int *owner, json_t **out)
{
    json_t *m = json_deep_copy(bfs__mf_head(parts[0]));
    *out = NULL;
    if (!m)
        return bfs__err(BFS_ENOMEM, "out of memory");
    json_object_del(m, "part");
    json_t *files = json_object_get(m, "files");
    for (size_t i = 0; i < json_array_size(files); i++) {
        const int r = bfs__entry_rank(json_array_get(files, i), W);
        const json_t *e = r >= 0 ? json_array_get(json_object_get(bfs__mf_head(parts[owner[r]]), "files"), i) : NULL;
        const char *kind = json_string_value(json_object_get(json_array_get(files, i), "kind"));
        if (r < 0 && kind && !strcmp(kind, "slices")) /* v2: a slice index, from the part that wrote it */
            for (int k = 0; k < n && !e; k++) {
                e = json_array_get(json_object_get(bfs__mf_head(parts[k]), "files"), i);
                if (!json_is_string(json_object_get(e, BFS_MF_HASH)))
                    e = NULL;
            }
        if (r < 0 && kind && !strcmp(kind, "slices") && !e) {
            const int rc = bfs__err(BFS_EINCOMPLETE, "%s: no part wrote %s", outdir,
                                    json_string_value(json_object_get(json_array_get(files, i), "name")));
            json_decref(m);
            return rc;
        }
        if (e && json_array_set_new(files, i, json_deep_copy(e)) != 0) {
            json_decref(m);
            return bfs__err(BFS_ENOMEM, "out of memory");
        }
    }
    const int rc = bfs__merge_sources(parts, names, n, outdir, m);
    if (rc < 0) {
        json_decref(m);
        return rc;
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
    uint64_t T; /* tensors */
    int full;   /* a part listing all of them (a bfshard before shares), or -1 */
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

/* v2 tensors[] from the parts' shares, in rank order, each element's bytes as its part wrote them */
static int bfs__mf_emit_shares(bfs_mf_out *w, bfs_mf_merge *g)
{
    size_t k = 0;
    for (int r = 0; r < g->W; r++) {
        uint64_t lo = 0;
        const uint64_t cnt = bfs__part_share(g->T, g->W, r, &lo);
        bfs_mf *part = g->parts[g->owner[r]];
        for (uint64_t i = 0; i < cnt; i++, k++) {
            const char *el = NULL;
            size_t len = 0;
            const int got = bfs__mf_next_raw(part, &el, &len);
            BFS_MF_RET(got);
            if (got == 0) /* counted when read: only a file changed since */
                return bfs__err(BFS_EPARTS, "%s: %s changed while merging: rerun that part", g->outdir,
                                g->names[g->owner[r]]);
            bfs__mf_puts(w, k == 0 ? "[\n  " : ",\n  ");
            bfs__mf_put(w, el, len);
        }
    }
    bfs__mf_put_end(w, k);
    return w->rc;
}

static int bfs__mf_emit_merge(bfs_mf_out *w, void *user)
{
    bfs_mf_merge *g = user;
    const json_t *mv = json_object_get(g->head, "manifest_version");
    /* v2: tensors[] has no per-rank records: each part's share in rank order, or all of one part's as is */
    if (json_is_integer(mv) && json_integer_value(mv) >= 2)
        return g->full >= 0 ? bfs__mf_emit_copy(w, g->parts[g->full]) : bfs__mf_emit_shares(w, g);
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
    uint64_t T = 0;
    int full = -1;
    BFS_TRY(bfs__merge_tensor_counts(parts, names, n, outdir, W, owner, &T, &full));
    BFS_TRY(bfs__merge_head(parts, names, n, outdir, W, owner, &m));
    for (int k = 0; k < n; k++)
        BFS_TRY(bfs__mf_rewind(parts[k]));
    bfs_mf_merge g = {parts, names, n, W, owner, outdir, T, full, el, m, pre_commit, pre_user};
    BFS_TRY(bfs__mf_write_streamed(dirfd, outdir, BFS_MANIFEST_NAME, m, bfs__mf_emit_merge, &g, bfs__mf_merge_pre_commit, &g));
cleanup:
    free(owner);
    free(el);
    json_decref(m);
    return rc;
}
