/*
 * The hash check of an OUTDIR (check.h): re-hash every file against bfshard.manifest.json
 * (or, in a node-local OUTDIR of parts, against each part manifest). A file whose hash
 * differs is narrowed down to the tensors (and byte ranges) that differ, or to its header
 * when all tensors match. A compressed copy (files[].zst) is checked by its own hash and
 * by streaming decompression. Uses manifest*.c (the format), parts.c (part names) and the
 * zst reader. bfs_verify (src/commands/verify.c) and resume's "already done"
 * (outdir.c) call it.
 */
#include "output/check.h"
#include "zst/zst.h"
#include "base/bfs_io.h"
#include "output/durable.h"
#include "output/hashfile.h"
#include "output/manifest.h"
#include "output/parts.h"
#include "output/slices.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BFS_VERIFY_BUF (8u << 20)

/* ---- hashing a byte range of a plain file or of a compressed copy ------------------------ */
typedef struct {
    int fd;
    const char *path;
    uint8_t *buf;
    size_t bs;
    XXH3_state_t *st;
    bfs_sha256 *sha; /* the whole file's SHA-256, where the manifest records one */
} bfs_fd_hasher;

static int bfs__hash_fd_range(void *user, uint64_t off, uint64_t nb, char hex[33])
{
    bfs_fd_hasher *h = user;
    XXH3_128bits_reset(h->st);
    const int rc = bfs__hash_range(h->fd, off, nb, h->buf, h->bs, h->path, h->st);
    bfs__hash_hex(XXH3_128bits_digest(h->st), hex);
    return rc;
}

static int bfs__sink_xxh3(void *user, const uint8_t *p, size_t n)
{
    bfs__xxh128_update(user, p, n);
    return 0;
}

typedef struct {
    bfs_zst_reader *r;
    XXH3_state_t *st;
} bfs_zst_hasher;

static int bfs__hash_zst_range(void *user, uint64_t off, uint64_t nb, char hex[33])
{
    bfs_zst_hasher *h = user;
    XXH3_128bits_reset(h->st);
    const int rc = bfs__zst_read_range(h->r, off, nb, bfs__sink_xxh3, h->st);
    bfs__hash_hex(XXH3_128bits_digest(h->st), hex);
    return rc;
}

static int bfs__read_fd(void *user, uint64_t off, uint64_t nb, void *dst)
{
    const bfs_fd_hasher *h = user;
    return bfs__pread_all(h->fd, dst, (size_t)nb, off, h->path);
}

typedef struct {
    uint8_t *p;
} bfs_copy_sink;

static int bfs__sink_copy(void *user, const uint8_t *p, size_t n)
{
    bfs_copy_sink *c = user;
    memcpy(c->p, p, n);
    c->p += n;
    return 0;
}

static int bfs__read_zst(void *user, uint64_t off, uint64_t nb, void *dst)
{
    const bfs_zst_hasher *h = user;
    bfs_copy_sink c = {dst};
    return bfs__zst_read_range(h->r, off, nb, bfs__sink_copy, &c);
}

/* What narrowing a bad file needs, built when the first bad file needs it (a manifest that
 * verifies never pays for it): v1, the manifest's shards by file; v2, each
 * weights file's slice index entry in files[] by the file it indexes. */
typedef struct {
    bfs_mf *mr;
    const json_t *files;
    const char *outdir;
    int version;
    bfs_shard_index *ix;
    json_t *of; /* v2: weights name -> its slice index's files[] position */
} bfs_lazy_index;

static int bfs__index(bfs_lazy_index *l, const bfs_shard_index **out)
{
    const int rc = l->ix ? 0 : bfs__manifest_shard_index(l->mr, l->files, &l->ix);
    *out = l->ix;
    return rc;
}

/* v2: file `name`'s slice index, read whole and checked against its files[] entry; NULL
 * (reported) when it cannot be used */
static uint8_t *bfs__slices_load(bfs_lazy_index *l, const char *name, const char *path, FILE *report, size_t *len,
                                 const char **ixname)
{
    char ep[BFS_ESC_MAX], en[BFS_ESC_MAX], got[33];
    if (!l->of && (l->of = json_object()) != NULL)
        for (size_t i = 0; i < json_array_size(l->files); i++) {
            const json_t *e = json_array_get(l->files, i);
            const char *of = json_string_value(json_object_get(e, "of"));
            const char *kind = json_string_value(json_object_get(e, "kind"));
            if (of && kind && !strcmp(kind, "slices"))
                json_object_set_new(l->of, of, json_integer((json_int_t)i));
        }
    const json_t *iv = json_object_get(l->of, name);
    bfs_manifest_file mf;
    if (!iv || !bfs__manifest_file_get(l->files, (size_t)json_integer_value(iv), &mf) || !mf.hash)
        return NULL; /* not a weights file, or another part's */
    *ixname = mf.name;
    char *ip = bfs__path_join(l->outdir, mf.name);
    uint8_t *b = NULL;
    struct stat sb;
    const int fd = ip ? open(ip, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) : -1;
    bool ok = fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size == mf.size &&
              mf.size <= SIZE_MAX && (b = malloc(mf.size ? (size_t)mf.size : 1)) != NULL &&
              bfs__pread_all(fd, b, (size_t)mf.size, 0, ip) == 0;
    if (ok) {
        bfs__hash_hex(XXH3_128bits(b, (size_t)mf.size), got);
        ok = strcmp(got, mf.hash) == 0;
    }
    bfs__err_clear();
    if (fd >= 0)
        close(fd);
    free(ip);
    if (!ok) {
        bfs__report(report, "%s: not narrowed to tensors: its slice index %s does not match the manifest",
                    bfs__esc(path, ep, sizeof ep), bfs__esc(mf.name, en, sizeof en));
        free(b);
        return NULL;
    }
    *len = (size_t)mf.size;
    return b;
}

/* A file that does not match, narrowed down to tensors: the number reported, or a BFS_E*
 * code; *first_data: where its data begins (its header before). */
static int bfs__narrow(bfs_lazy_index *l, const char *name, uint64_t size, const char *path, FILE *report,
                       bfs_slices_hash_fn hash, bfs_slices_read_fn rd, void *user, bool read_errors,
                       uint64_t *first_data)
{
    *first_data = size;
    if (l->version < 2) {
        const bfs_shard_index *ix;
        const int irc = bfs__index(l, &ix);
        if (irc < 0)
            return irc;
        return bfs__manifest_narrow(ix, name, size, path, report, hash, user, read_errors, first_data);
    }
    size_t len = 0;
    const char *ixname = NULL;
    uint8_t *b = bfs__slices_load(l, name, path, report, &len, &ixname);
    if (!b)
        return 0; /* the caller reports the file */
    int rc = bfs__slices_narrow(b, len, ixname, path, size, report, rd, hash, user, read_errors, first_data);
    if (rc == BFS_EINPUT) {
        char ep[BFS_ESC_MAX];
        bfs__report(report, "%s: not narrowed to tensors: %s", bfs__esc(path, ep, sizeof ep), bfs_last_error());
        bfs__err_clear();
        rc = 0;
    }
    free(b);
    return rc;
}

/* ---- a compressed copy ------------------------------------------------------------------- */
/* Decompress and hash, never touching the disk: true when it matches; else msg says why. */
static bool bfs__zst_content_ok(bfs_zst_reader *r, XXH3_state_t *st, uint64_t usize, const char *uwant, char *msg,
                                size_t cap)
{
    bool uok = false;
    XXH3_128bits_reset(st);
    if (bfs__zst_reader_size(r) != usize) {
        snprintf(msg, cap, "decompresses to %llu bytes, manifest says %llu", (unsigned long long)bfs__zst_reader_size(r),
                 (unsigned long long)usize);
    } else if (bfs__zst_read_range(r, 0, usize, bfs__sink_xxh3, st) == 0 && bfs__zst_check_empty_frames(r) == 0) {
        char uh[33];
        bfs__hash_hex(XXH3_128bits_digest(st), uh);
        uok = strcmp(uh, uwant) == 0;
        if (!uok)
            snprintf(msg, cap, "decompressed hash %s, manifest %s", uh, uwant);
    } else {
        snprintf(msg, cap, "%s", bfs_last_error());
    }
    return uok;
}

/* The "zst" entry of files[]: compressed hash, then a streaming decompression against
 * the uncompressed size and hash, narrowed down to tensors on a mismatch. Returns the
 * number of problems reported, or a BFS_E* code. */
static int bfs__verify_zst(const char *outdir, const bfs_manifest_file *mf, bfs_lazy_index *li, FILE *report,
                           uint64_t *checked)
{
    int rc = 0, bad = 0, fd = -1;
    bfs_zst_reader *r = NULL;
    uint8_t *buf = NULL;
    char path[PATH_MAX], got[33], msg[1024], ep[BFS_ESC_MAX], eh[BFS_ESC_MAX];
    const size_t bs = 4u << 20;
    XXH3_state_t *st = XXH3_createState();
    const json_t *z = mf->zst;
    const char *zn = json_string_value(json_object_get(z, "name"));
    const char *zwant = bfs__manifest_hash(z);
    const json_t *jzs = json_object_get(z, "size");
    if (!st || !(buf = malloc(bs)))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    if (!zn || !zwant || !json_is_integer(jzs) || strchr(zn, '/') || zn[0] == '.')
        BFS_FAIL(BFS_EINPUT, "%s/%s: the \"zst\" entry of \"%s\" is malformed", outdir, BFS_MANIFEST_NAME,
                 bfs__esc(mf->name, ep, sizeof ep));
    snprintf(path, sizeof path, "%s/%s", outdir, zn);
    const uint64_t zsize = (uint64_t)json_integer_value(jzs), usize = mf->size;
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block us */
    struct stat sb;
    bfs__esc(path, ep, sizeof ep);
    if (fd < 0) {
        bfs__report(report, "%s: MISSING (%s)", ep, strerror(errno));
        bad = 1;
        goto cleanup;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        bfs__report(report, "%s: NOT A REGULAR FILE", ep);
        bad = 1;
        goto cleanup;
    }
    if ((uint64_t)sb.st_size != zsize) {
        bfs__report(report, "%s: BAD SIZE: %lld bytes, manifest says %llu", ep, (long long)sb.st_size,
                    (unsigned long long)zsize);
        bad = 1;
        goto cleanup;
    }
    XXH3_128bits_reset(st);
    BFS_TRY(bfs__hash_range(fd, 0, zsize, buf, bs, path, st));
    *checked += zsize;
    bfs__hash_hex(XXH3_128bits_digest(st), got);
    const bool zok = strcmp(got, zwant) == 0;
    bool uok = false;
    msg[0] = '\0';
    bfs__err_clear();
    if (bfs__zst_reader_open(path, &r) == 0)
        uok = bfs__zst_content_ok(r, st, usize, mf->hash, msg, sizeof msg);
    else
        snprintf(msg, sizeof msg, "%s", bfs_last_error());
    bfs__err_clear();
    if (bfs__cancelled())
        BFS_FAIL(BFS_EINTR, "interrupted while verifying %s", path);
    if (zok && uok)
        goto cleanup;
    bad = 1;
    if (!zok)
        bfs__report(report, "%s: BAD compressed file (hash %s, manifest %s)%s%s", ep, got, bfs__esc(zwant, eh, sizeof eh),
                    msg[0] ? ": " : "", msg);
    else
        bfs__report(report, "%s: BAD: %s", ep, msg);
    if (r) {
        bfs_zst_hasher h = {r, st};
        uint64_t first_data;
        const int nrc = bfs__narrow(li, mf->name, usize, path, report, bfs__hash_zst_range, bfs__read_zst, &h, true,
                                    &first_data);
        BFS_TRY(nrc < 0 ? nrc : 0);
    }
cleanup:
    if (fd >= 0)
        close(fd);
    bfs__zst_reader_free(r);
    XXH3_freeState(st);
    free(buf);
    return rc < 0 ? rc : bad;
}

/* ---- the files hashed ahead, several at once ------------------------------------------------ */
/* The plain files of a manifest are hashed by up to BFS_VERIFY_THREADS threads at once (one
 * file each at a time), before the files are checked in manifest order, so that a verify
 * reads and hashes at the storage's parallel rate. Fewer files than CPUs: each file is read
 * by the CPUs the others leave (hashfile.h: its digests stay one thread's at a time, in file
 * order; a lone file is read that way by verify_plain itself). A file hashed ahead that is a
 * regular file of the recorded size has its digests taken from here; any other (missing, of
 * another size, a read error) is checked as before, in order, and reported there. */
#define BFS_VERIFY_THREADS 16
typedef struct {
    char got[33], sgot[65];
    bool ok;
} bfs_prehash;
typedef struct {
    const char *outdir;
    const json_t *files;
    bool partial;
    bfs_prehash *pre;
    int threads_per_file; /* readers of one file (hashfile.h): the CPUs the files leave */
    _Atomic size_t next;
} bfs_prehash_job;

/* File i hashed ahead, when it is a regular file of its recorded size. */
static void bfs__prehash_one(const bfs_prehash_job *pj, size_t i, bfs_fd_hasher *h)
{
    bfs_manifest_file mf;
    const json_t *fe = json_array_get(pj->files, i);
    if ((pj->partial && bfs__manifest_hash_elsewhere(fe)) || !bfs__manifest_file_get(pj->files, i, &mf))
        return;
    char *path = bfs__path_join(pj->outdir, mf.name);
    const int fd = path ? open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) : -1;
    struct stat sb;
    bool ok = fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size == mf.size;
    XXH3_128bits_reset(h->st);
    h->fd = fd;
    h->path = path;
    ok = ok && (!mf.sha256 || bfs__sha256_reset(h->sha) == 0) &&
         bfs__hash_file(fd, 0, mf.size, path, pj->threads_per_file, h->st, mf.sha256 ? h->sha : NULL) == 0 &&
         (!mf.sha256 || bfs__sha256_hex(h->sha, pj->pre[i].sgot) == 0);
    if (ok)
        bfs__hash_hex(XXH3_128bits_digest(h->st), pj->pre[i].got);
    pj->pre[i].ok = ok;
    if (fd >= 0)
        close(fd);
    free(path);
}

static void *bfs__prehash_main(void *p)
{
    bfs_prehash_job *const pj = p;
    bfs_fd_hasher h = {.fd = -1, .st = XXH3_createState(), .sha = bfs__sha256_new()};
    const size_t n = json_array_size(pj->files);
    for (size_t i; h.st && h.sha && (i = atomic_fetch_add(&pj->next, 1)) < n && !bfs__cancelled();)
        bfs__prehash_one(pj, i, &h);
    XXH3_freeState(h.st);
    bfs__sha256_free(h.sha);
    return NULL;
}

/* The manifest's plain files hashed ahead (NULL: not worth threads, or out of memory: every
 * file is hashed in order, as before). */
static bfs_prehash *bfs__prehash(const char *outdir, const json_t *files, bool partial)
{
    const size_t n = json_array_size(files);
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t t = cpus > 1 ? (size_t)cpus : 1;
    t = t < BFS_VERIFY_THREADS ? t : BFS_VERIFY_THREADS;
    t = t < n ? t : n;
    if (t < 2)
        return NULL;
    /* the CPUs shared by the files that take time: a config.json beside one big shard
     * leaves the shard every reader */
    size_t big = 0;
    for (size_t i = 0; i < n; i++) {
        bfs_manifest_file mf;
        big += bfs__manifest_file_get(files, i, &mf) && mf.size >= BFS_HASHFILE_BIG;
    }
    bfs_prehash_job pj = {.outdir = outdir, .files = files, .partial = partial, .pre = calloc(n, sizeof *pj.pre),
                          .threads_per_file = bfs__hash_file_threads(big)};
    pthread_t tid[BFS_VERIFY_THREADS];
    size_t started = 0;
    while (pj.pre && started < t && pthread_create(&tid[started], NULL, bfs__prehash_main, &pj) == 0)
        started++;
    for (size_t k = 0; k < started; k++)
        pthread_join(tid[k], NULL);
    return pj.pre;
}

/* ---- a plain file ---------------------------------------------------------------------------- */
/* Number of problems reported (0 or 1), or a BFS_E* code. pre: its digests, hashed ahead, or NULL. */
static int bfs__verify_plain(const char *path, const bfs_manifest_file *mf, bfs_lazy_index *li, FILE *report,
                             bfs_fd_hasher *h, uint64_t *checked, const bfs_prehash *pre)
{
    int rc = 0;
    struct stat sb;
    char got[33], sgot[65] = "", ep[BFS_ESC_MAX], eh[BFS_ESC_MAX];
    bfs__esc(path, ep, sizeof ep);
    h->fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block us */
    h->path = path;
    if (h->fd < 0 && mf->zst && errno == ENOENT) /* only the compressed copy is kept */
        return 0;
    if (h->fd < 0) {
        bfs__report(report, "%s: MISSING (%s)", ep, strerror(errno));
        return 1;
    }
    if (fstat(h->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        bfs__report(report, "%s: NOT A REGULAR FILE", ep);
        rc = 1;
        goto cleanup;
    }
    if ((uint64_t)sb.st_size != mf->size) {
        bfs__report(report, "%s: BAD SIZE: %lld bytes, manifest says %llu", ep, (long long)sb.st_size,
                    (unsigned long long)mf->size);
        rc = 1;
        goto cleanup;
    }
    bfs__test_signal("hash");
    if (pre && pre->ok) {
        if (bfs__cancelled()) { /* where its own read would have seen it */
            rc = bfs__err(BFS_EINTR, "interrupted while hashing %s", path);
            goto cleanup;
        }
        memcpy(got, pre->got, sizeof got);
        memcpy(sgot, pre->sgot, sizeof sgot);
    } else { /* both hashes from one read */
        XXH3_128bits_reset(h->st);
        if (mf->sha256)
            BFS_TRY(bfs__sha256_reset(h->sha));
        BFS_TRY(bfs__hash_file(h->fd, 0, mf->size, path, bfs__hash_file_threads(1), h->st, mf->sha256 ? h->sha : NULL));
        bfs__hash_hex(XXH3_128bits_digest(h->st), got);
        if (mf->sha256)
            BFS_TRY(bfs__sha256_hex(h->sha, sgot));
    }
    if (mf->sha256 && strcmp(got, mf->hash) == 0 && strcmp(sgot, mf->sha256) != 0) {
        bfs__report(report, "%s: BAD sha256 %s, manifest %s (its XXH3-128 matches)", ep, sgot, mf->sha256);
        rc = 1;
        goto cleanup;
    }
    *checked += mf->size;
    if (strcmp(got, mf->hash) == 0)
        goto cleanup;
    rc = 1;
    uint64_t first_data = mf->size;
    const int nrc = bfs__narrow(li, mf->name, mf->size, path, report, bfs__hash_fd_range, bfs__read_fd, h, false,
                                &first_data);
    if (nrc < 0) {
        rc = nrc;
        goto cleanup;
    }
    if (nrc == 0)
        bfs__report(report, "%s: BAD header or metadata bytes [0, %llu) (file hash %s, manifest %s)", ep,
                    (unsigned long long)(first_data < mf->size ? first_data : mf->size), got, bfs__esc(mf->hash, eh, sizeof eh));
cleanup:
    close(h->fd);
    h->fd = -1;
    return rc;
}

/* stray weight files confuse loaders that glob *.safetensors; the names are looked up
 * in a set built once (entries x files was quadratic) */
static int bfs__verify_extra(const char *outdir, const json_t *files, FILE *report)
{
    int bad = 0;
    char ep[BFS_ESC_MAX], en[BFS_ESC_MAX];
    json_t *names = json_object();
    DIR *d = names ? opendir(outdir) : NULL;
    if (!d) {
        json_decref(names);
        return 0;
    }
    for (size_t i = 0; i < json_array_size(files); i++) {
        const char *nm = json_string_value(json_object_get(json_array_get(files, i), "name"));
        if (nm && json_object_set_new(names, nm, json_true()) != 0) {
            bfs__report(report, "%s: cannot check for extra files: out of memory", bfs__esc(outdir, ep, sizeof ep));
            bad = 1;
            goto cleanup;
        }
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const size_t n = strlen(e->d_name);
        if (n <= 12 || strcmp(e->d_name + n - 12, ".safetensors") != 0 || json_object_get(names, e->d_name))
            continue;
        bfs__report(report, "%s/%s: EXTRA .safetensors file not in the manifest", bfs__esc(outdir, ep, sizeof ep),
                    bfs__esc(e->d_name, en, sizeof en));
        bad++;
    }
cleanup:
    closedir(d);
    json_decref(names);
    return bad;
}

/* One manifest-format file (the merged manifest, or a part's: partial) against OUTDIR:
 * the number of problems reported in *bad. A part's entries with a null hash belong to
 * other parts: skipped, their ranks left out of here[] (may be NULL). */
static int bfs__cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* files[] names each file once: a manifest that lists one twice is not one bfshard wrote
 * (and would have it hashed once per entry). n log n, one pointer per entry. */
static int bfs__files_unique(const json_t *files, const char *mpath)
{
    const size_t n = json_array_size(files);
    const char **v = malloc((n ? n : 1) * sizeof *v), **of = malloc((n ? n : 1) * sizeof *of);
    int rc = 0;
    char e[BFS_ESC_MAX];
    if (!v || !of) {
        free(v);
        free(of);
        return bfs__err(BFS_ENOMEM, "out of memory");
    }
    size_t k = 0, ko = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *fe = json_array_get(files, i);
        const char *nm = json_string_value(json_object_get(fe, "name"));
        const char *kind = json_string_value(json_object_get(fe, "kind"));
        const char *o = json_string_value(json_object_get(fe, "of"));
        if (nm)
            v[k++] = nm;
        if (o && kind && !strcmp(kind, "slices"))
            of[ko++] = o;
    }
    qsort(v, k, sizeof *v, bfs__cmp_str);
    qsort(of, ko, sizeof *of, bfs__cmp_str);
    for (size_t i = 1; i < k && rc == 0; i++)
        if (strcmp(v[i - 1], v[i]) == 0)
            rc = bfs__err(BFS_EINPUT, "%s: files[] lists \"%s\" more than once: not a manifest bfshard wrote", mpath,
                          bfs__esc(v[i], e, sizeof e));
    for (size_t i = 1; i < ko && rc == 0; i++) /* v2: one slice index a weights file */
        if (strcmp(of[i - 1], of[i]) == 0)
            rc = bfs__err(BFS_EINPUT, "%s: files[] lists two slice indexes for \"%s\": not a manifest bfshard wrote",
                          mpath, bfs__esc(of[i], e, sizeof e));
    free(v);
    free(of);
    return rc;
}

static int bfs__verify_manifest(const char *outdir, const char *name, bool partial, FILE *report, bfs_fd_hasher *h,
                                uint64_t *checked, int *bad, bool *here, int W)
{
    int rc = 0;
    bfs_mf *mr = NULL;
    bfs_lazy_index li = {0};
    bfs_prehash *pre = NULL;
    /* read once here (structure, seal, every tensor parsed), again only to narrow a bad file down */
    BFS_TRY(bfs__mf_open(outdir, name, 0, NULL, NULL, &mr));
    const char *mpath = bfs__mf_path(mr);
    const json_t *m = bfs__mf_head(mr), *files = json_object_get(m, "files");
    if (!json_is_array(files) || !bfs__mf_has_tensors(mr))
        BFS_FAIL(BFS_EINPUT, "%s: not a bfshard manifest (missing files/tensors)", mpath);
    BFS_TRY(bfs__files_unique(files, mpath));
    li.mr = mr;
    li.files = files;
    li.outdir = outdir;
    const json_t *jv = json_object_get(m, "manifest_version");
    li.version = json_is_integer(jv) && json_integer_value(jv) >= 2 ? 2 : 1;
    *bad += bfs__mf_check_seal(mr, report); /* bfshard compress re-seals what it rewrites */
    if (!partial)
        *bad += bfs__manifest_check_sums(outdir, files, report);
    pre = bfs__prehash(outdir, files, partial);

    for (size_t i = 0; i < json_array_size(files); i++) {
        bfs_manifest_file mf;
        const json_t *fe = json_array_get(files, i), *jr = json_object_get(fe, "rank");
        if (bfs__cancelled())
            BFS_FAIL(BFS_EINTR, "interrupted while verifying %s", outdir);
        if (partial && bfs__manifest_hash_elsewhere(fe))
            continue; /* another part's rank */
        if (!bfs__manifest_file_get(files, i, &mf))
            BFS_FAIL(BFS_EINPUT, "%s: files[%zu] is malformed", mpath, i);
        if (here && json_is_integer(jr) && json_integer_value(jr) >= 0 && json_integer_value(jr) < W)
            here[json_integer_value(jr)] = true;
        if (mf.zst) {
            const int zb = bfs__verify_zst(outdir, &mf, &li, report, checked);
            if (zb < 0)
                BFS_FAIL(zb, "%s", bfs_last_error());
            *bad += zb;
        }
        char *path = bfs__path_join(outdir, mf.name);
        if (!path)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        const int pb = bfs__verify_plain(path, &mf, &li, report, h, checked, pre ? &pre[i] : NULL);
        free(path);
        BFS_TRY(pb);
        *bad += pb;
    }
    *bad += bfs__verify_extra(outdir, files, report);
cleanup:
    free(pre);
    bfs__manifest_shard_index_free(li.ix);
    json_decref(li.of);
    bfs__mf_free(mr);
    return rc;
}

/* The part manifests in OUTDIR, sorted; *n = 0 when none. */
static int bfs__list_parts(const char *outdir, char ***names, int *n)
{
    *names = NULL;
    *n = 0;
    DIR *d = opendir(outdir);
    if (!d)
        return 0;
    const int rc = bfs__part_manifests(d, names, n);
    closedir(d);
    return rc;
}

/* A node-local OUTDIR with some parts and no merged manifest: check those, name the rest. */
static int bfs__verify_parts(const char *outdir, char **names, int n, FILE *report, bfs_fd_hasher *h,
                             uint64_t *checked, int *bad)
{
    int rc = 0, W = 0;
    bool *here = NULL;
    char *list = NULL;
    /* the world size from the first part manifest (each part manifest names it) */
    {
        bfs_mf *mr = NULL;
        const char *rk, *fp;
        BFS_TRY(bfs__mf_open(outdir, names[0], BFS_MF_HEAD_ONLY, NULL, NULL, &mr));
        const bool ok = bfs__manifest_part_info(bfs__mf_head(mr), &rk, &W, &fp);
        if (!ok)
            rc = bfs__err(BFS_EINPUT, "%s: not a bfshard part manifest", bfs__mf_path(mr));
        bfs__mf_free(mr);
        BFS_TRY(rc);
    }
    if (!(here = calloc((size_t)W, sizeof *here)) || !(list = malloc(4096)))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        BFS_TRY(bfs__verify_manifest(outdir, names[i], true, report, h, checked, bad, here, W));
    for (int r = 0; r < W; r++)
        here[r] = !here[r];
    if (bfs__ranks_format(here, W, list, 4096) < 0) {
        bfs__err_clear();
        snprintf(list, 4096, "(a long list)");
    }
    if (list[0])
        bfs__report(report, "%s: ranks %s are elsewhere (this OUTDIR holds %d part(s) of a --world-size %d conversion, "
                    "not merged)", outdir, list, n, W);
cleanup:
    free(here);
    free(list);
    return rc;
}

int bfs__check_part(const char *outdir, const char *pname, FILE *report, uint64_t *bytes_checked)
{
    int rc = 0, bad = 0;
    uint64_t checked = 0;
    bfs_fd_hasher h = {.fd = -1, .bs = BFS_VERIFY_BUF, .st = XXH3_createState(), .sha = bfs__sha256_new()};
    if (!h.st || !h.sha || !(h.buf = malloc(h.bs)))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__verify_manifest(outdir, pname, true, report, &h, &checked, &bad, NULL, 0));
    if (bad)
        rc = bfs__err(BFS_EVERIFY, "%s/%s: %d problem(s) found", outdir, pname, bad);
cleanup:
    if (bytes_checked)
        *bytes_checked = checked;
    XXH3_freeState(h.st);
    bfs__sha256_free(h.sha);
    free(h.buf);
    return rc;
}

int bfs__check_outdir(const char *outdir, FILE *report, uint64_t *bytes_checked)
{
    int rc = 0, bad = 0, nparts = 0;
    char **parts = NULL;
    bfs_fd_hasher h = {.fd = -1, .bs = BFS_VERIFY_BUF, .st = XXH3_createState(), .sha = bfs__sha256_new()};
    uint64_t checked = 0;
    struct stat sb;

    if (!h.st || !h.sha || !(h.buf = malloc(h.bs)))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    char *mp = bfs__path_join(outdir, BFS_MANIFEST_NAME);
    const bool merged = mp && lstat(mp, &sb) == 0;
    free(mp);
    if (!merged)
        BFS_TRY(bfs__list_parts(outdir, &parts, &nparts));
    if (nparts > 0)
        BFS_TRY(bfs__verify_parts(outdir, parts, nparts, report, &h, &checked, &bad));
    else
        BFS_TRY(bfs__verify_manifest(outdir, BFS_MANIFEST_NAME, false, report, &h, &checked, &bad, NULL, 0));
    if (bad)
        rc = bfs__err(BFS_EVERIFY, "%s: %d problem(s) found", outdir, bad);
cleanup:
    if (bytes_checked)
        *bytes_checked = checked;
    for (int i = 0; i < nparts; i++)
        free(parts[i]);
    free(parts);
    XXH3_freeState(h.st);
    bfs__sha256_free(h.sha);
    free(h.buf);
    return rc;
}
