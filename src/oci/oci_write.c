/*
 * Writing an OCI image layout (see oci.h): OCIDIR/oci-layout, blobs/sha256/<hex>,
 * index.json. Crash-safe as convert is: every file appears under its final name only
 * complete (durable.h: a temporary, fdatasync, rename, the directory fsync'ed; a blob is
 * hard-linked the same way), blobs first and index.json last, so an OCIDIR is at every
 * instant the old layout plus complete unreferenced blobs; a rerun finds its blobs (the
 * same inode, or bytes that hash to the name) and goes on. Only our own temporaries are
 * ever removed; a foreign blob, manifest or index entry is never deleted, and a file
 * under a blob's name whose bytes are not that blob is an error naming it.
 */
#include "oci/oci.h"
#include "output/durable.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define BFS_OCI_MAX_INDEX (64u << 20)

/* ---- where OCIDIR may be ----------------------------------------------------------------- */
/* realpath of a path that may not exist yet (its parent must) */
static int bfs__real(const char *p, char out[PATH_MAX], const char *what)
{
    if (realpath(p, out))
        return 0;
    if (errno != ENOENT)
        return bfs__errno(BFS_EUSAGE, errno, "%s %s: cannot resolve", what, p);
    char buf[PATH_MAX], dir[PATH_MAX], rd[PATH_MAX];
    if ((size_t)snprintf(buf, sizeof buf, "%s", p) >= sizeof buf)
        return bfs__err(BFS_EUSAGE, "%s %s: path too long", what, p);
    for (size_t n = strlen(buf); n > 1 && buf[n - 1] == '/'; n--)
        buf[n - 1] = '\0';
    char *sl = strrchr(buf, '/');
    const char *base = sl ? sl + 1 : buf;
    snprintf(dir, sizeof dir, "%s", !sl ? "." : sl == buf ? "/" : "");
    if (sl && sl != buf) {
        *sl = '\0';
        snprintf(dir, sizeof dir, "%s", buf);
    }
    if (!base[0] || !strcmp(base, ".") || !strcmp(base, ".."))
        return bfs__err(BFS_EUSAGE, "%s %s: not a directory name", what, p);
    if (!realpath(dir, rd))
        return bfs__errno(BFS_EUSAGE, errno, "%s %s: its parent directory %s", what, p, dir);
    if ((size_t)snprintf(out, PATH_MAX, "%s/%s", strcmp(rd, "/") ? rd : "", base) >= PATH_MAX)
        return bfs__err(BFS_EUSAGE, "%s %s: path too long", what, p);
    return 0;
}

/* a is b or below it */
static bool bfs__under(const char *a, const char *b)
{
    const size_t n = strlen(b);
    return !strncmp(a, b, n) && (a[n] == '\0' || a[n] == '/' || (n == 1 && b[0] == '/'));
}

int bfs__oci_check_paths(const char *outdir, const char *ocidir)
{
    char ro[PATH_MAX], rc_[PATH_MAX];
    if (!realpath(outdir, ro))
        return bfs__errno(BFS_EINPUT, errno, "OUTDIR %s", outdir);
    const int rc = bfs__real(ocidir, rc_, "OCIDIR");
    if (rc < 0)
        return rc;
    if (bfs__under(rc_, ro))
        return bfs__err(BFS_EUSAGE, "OCIDIR %s is %s OUTDIR %s: put the OCI layout beside the checkpoint, not in it",
                        ocidir, strcmp(rc_, ro) ? "inside" : "the same directory as", outdir);
    if (bfs__under(ro, rc_))
        return bfs__err(BFS_EUSAGE, "OUTDIR %s is inside OCIDIR %s: put the OCI layout beside the checkpoint", outdir,
                        ocidir);
    return 0;
}

/* ---- opening OCIDIR ------------------------------------------------------------------------ */
/* a subdirectory of dirfd, made when missing (durably), opened never through a symlink */
static int bfs__subdir(int dirfd, const char *dirpath, const char *name, int *out)
{
    if (mkdirat(dirfd, name, 0755) == 0) {
        const int rc = bfs__dir_sync(dirfd, dirpath);
        if (rc < 0)
            return rc;
    } else if (errno != EEXIST) {
        return bfs__errno(BFS_EIO, errno, "%s/%s: cannot create", dirpath, name);
    }
    *out = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (*out < 0)
        return bfs__errno(BFS_EEXIST, errno, "%s/%s: not a directory of an OCI layout", dirpath, name);
    return 0;
}

/* ".<64 hex>.partial": our blob temporaries (durable.h names) */
static bool bfs__blob_tmp(const char *n)
{
    const size_t p = strlen(BFS_TMP_PREFIX), s = strlen(BFS_TMP_SUFFIX);
    if (strlen(n) != p + 64 + s || strncmp(n, BFS_TMP_PREFIX, p) || strcmp(n + p + 64, BFS_TMP_SUFFIX))
        return false;
    char hex[65];
    memcpy(hex, n + p, 64);
    hex[64] = '\0';
    return bfs__is_sha256_hex(hex);
}

/* what a killed pack left: only names no one else writes */
static void bfs__remove_debris(bfs_oci_dir *d)
{
    unlinkat(d->dirfd, BFS_TMP_PREFIX BFS_OCI_INDEX_FILE BFS_TMP_SUFFIX, 0);
    unlinkat(d->dirfd, BFS_TMP_PREFIX BFS_OCI_LAYOUT_FILE BFS_TMP_SUFFIX, 0);
    const int fd = openat(d->blobfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        if (fd >= 0)
            close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(dir)) != NULL)
        if (bfs__blob_tmp(e->d_name))
            unlinkat(d->blobfd, e->d_name, 0);
    closedir(dir);
}

/* an existing OCIDIR: an OCI layout of version 1.0.0, or empty */
static int bfs__layout_ok(bfs_oci_dir *d, bool *has_layout)
{
    struct stat sb;
    char *p = NULL, *text = NULL;
    size_t len = 0;
    int rc = 0;
    *has_layout = fstatat(d->dirfd, BFS_OCI_LAYOUT_FILE, &sb, AT_SYMLINK_NOFOLLOW) == 0;
    if (*has_layout) {
        json_error_t je;
        if (!S_ISREG(sb.st_mode) || !(p = bfs__path_join(d->path, BFS_OCI_LAYOUT_FILE)))
            BFS_FAIL(BFS_EEXIST, "%s/%s: not a regular file", d->path, BFS_OCI_LAYOUT_FILE);
        BFS_TRY(bfs__read_small_file(p, 1u << 16, &text, &len));
        json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
        const char *v = json_string_value(json_object_get(j, "imageLayoutVersion"));
        const bool ok = v && !strcmp(v, BFS_OCI_LAYOUT_VERSION);
        json_decref(j);
        if (!ok)
            BFS_FAIL(BFS_EINPUT, "%s: not an OCI image layout of version " BFS_OCI_LAYOUT_VERSION, p);
        goto cleanup;
    }
    const int fd = openat(d->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        if (fd >= 0)
            close(fd);
        BFS_FAIL(BFS_EIO, "%s: cannot list", d->path);
    }
    struct dirent *e;
    char first[NAME_MAX + 1] = "";
    while ((e = readdir(dir)) != NULL && !first[0])
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            snprintf(first, sizeof first, "%s", e->d_name);
    closedir(dir);
    if (first[0])
        BFS_FAIL(BFS_EEXIST, "%s: exists, holds %s and is not an OCI image layout (no oci-layout file): pack writes "
                 "into a new or empty directory, or an OCI layout", d->path, first);
cleanup:
    free(p);
    free(text);
    return rc;
}

int bfs__oci_open(const char *ocidir, bfs_oci_dir *d)
{
    int rc = 0;
    bool has_layout = false;
    memset(d, 0, sizeof *d);
    d->path = ocidir;
    d->dirfd = d->blobfd = -1;
    if (mkdir(ocidir, 0755) == 0)
        d->created = true;
    else if (errno != EEXIST)
        return bfs__errno(errno == ENOENT ? BFS_EUSAGE : BFS_EIO, errno, "%s: cannot create", ocidir);
    d->dirfd = open(ocidir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d->dirfd < 0)
        BFS_FAIL(BFS_EEXIST, "%s: not a directory: %s", ocidir, strerror(errno));
    if (flock(d->dirfd, LOCK_EX | LOCK_NB) != 0)
        BFS_FAIL(errno == EWOULDBLOCK ? BFS_EEXIST : BFS_EIO, "%s: another bfshard pack is writing it (%s)", ocidir,
                 strerror(errno));
    if (d->created) { /* the new directory's entry in its parent */
        char parent[PATH_MAX];
        const char *sl = strrchr(ocidir, '/');
        snprintf(parent, sizeof parent, "%.*s", sl ? (int)(sl == ocidir ? 1 : sl - ocidir) : 1, sl ? ocidir : ".");
        const int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (pfd >= 0) {
            rc = bfs__dir_sync(pfd, parent);
            close(pfd);
            BFS_TRY(rc);
        }
    }
    BFS_TRY(bfs__layout_ok(d, &has_layout));
    if (!has_layout) {
        static const char layout[] = "{\"imageLayoutVersion\":\"" BFS_OCI_LAYOUT_VERSION "\"}";
        BFS_TRY(bfs__write_durable(d->dirfd, ocidir, BFS_OCI_LAYOUT_FILE, layout, sizeof layout - 1));
    }
    int bfd = -1;
    BFS_TRY(bfs__subdir(d->dirfd, ocidir, "blobs", &bfd));
    snprintf(d->blobdir, sizeof d->blobdir, "%s/blobs", ocidir);
    rc = bfs__subdir(bfd, d->blobdir, "sha256", &d->blobfd);
    close(bfd);
    BFS_TRY(rc);
    snprintf(d->blobdir, sizeof d->blobdir, "%s/blobs/sha256", ocidir);
    bfs__remove_debris(d);
cleanup:
    return rc;
}

void bfs__oci_close(bfs_oci_dir *d, bool failed)
{
    if (d->blobfd >= 0)
        close(d->blobfd);
    if (d->dirfd >= 0)
        close(d->dirfd);
    d->blobfd = d->dirfd = -1;
    (void)failed; /* what a failed run wrote are complete blobs: a rerun uses them */
}

/* ---- blobs ------------------------------------------------------------------------------------ */
/* An existing blob: 0 when its bytes are those of its name (size and sha256), else BFS_EEXIST. */
static int bfs__blob_check(bfs_oci_dir *d, const char *sha, uint64_t size, uint8_t *buf, size_t bs)
{
    int rc = 0;
    char got[65], what[PATH_MAX];
    struct stat sb;
    bfs_sha256 *s = bfs__sha256_new();
    snprintf(what, sizeof what, "%s/%s", d->blobdir, sha);
    const int fd = openat(d->blobfd, sha, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (!s)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        BFS_FAIL(BFS_EEXIST, "%s: exists and is not a regular file: not bfshard's to replace; remove it", what);
    if ((uint64_t)sb.st_size != size)
        BFS_FAIL(BFS_EEXIST, "%s: exists with %lld bytes, the blob has %llu: not bfshard's to replace; remove it", what,
                 (long long)sb.st_size, (unsigned long long)size);
    BFS_TRY(bfs__hash_range2(fd, 0, size, buf, bs, what, NULL, s));
    BFS_TRY(bfs__sha256_hex(s, got));
    if (strcmp(got, sha) != 0)
        BFS_FAIL(BFS_EEXIST, "%s: exists and its bytes hash to sha256:%s, not to its name: not bfshard's to replace; "
                 "remove it", what, got);
cleanup:
    if (fd >= 0)
        close(fd);
    bfs__sha256_free(s);
    return rc;
}

/* A copy of srcfd as the blob, and its bytes hashed as they land: a thread copies (in the
 * kernel, copy_file_range; else read and write) while this one reads the copy back behind
 * it (from the page cache) into the SHA-256, so the copy runs at the disk's rate and what
 * is hashed is what was written. */
#define BFS_COPY_CHUNK ((uint64_t)64 << 20)
typedef struct {
    int in, out, back; /* the source, the copy, the copy read back */
    uint64_t size;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t done;  /* bytes of the copy written (under mu) */
    int err;        /* errno of a failed copy (under mu) */
    bool stop;      /* the hasher gave up (under mu) */
    uint8_t *buf;   /* the fallback's */
    size_t bs;
} bfs_copier;

static ssize_t bfs__copy_chunk(bfs_copier *c, uint64_t off, size_t n, bool *plain)
{
    if (!*plain) {
        loff_t a = (loff_t)off, b = (loff_t)off;
        const ssize_t k = copy_file_range(c->in, &a, c->out, &b, n, 0);
        if (k > 0 || (k < 0 && errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP))
            return k;
        if (k == 0) { /* the source is shorter than it was: it changed */
            errno = EIO;
            return -1;
        }
        *plain = true; /* a file system without it: read and write */
    }
    const size_t m = n < c->bs ? n : c->bs;
    ssize_t k = pread(c->in, c->buf, m, (off_t)off);
    if (k == 0)
        errno = EIO; /* the source is shorter than it was: it changed */
    if (k <= 0)
        return -1;
    for (ssize_t w = 0; w < k;) {
        const ssize_t x = pwrite(c->out, c->buf + w, (size_t)(k - w), (off_t)(off + (uint64_t)w));
        if (x <= 0) {
            if (x == 0)
                errno = ENOSPC;
            return -1;
        }
        w += x;
    }
    return k;
}

static void *bfs__copier_main(void *arg)
{
    bfs_copier *c = arg;
    bool plain = false, stop = false;
    uint64_t off = 0;
    while (off < c->size && !stop) {
        const uint64_t n = c->size - off < BFS_COPY_CHUNK ? c->size - off : BFS_COPY_CHUNK;
        const ssize_t k = bfs__copy_chunk(c, off, (size_t)n, &plain);
        if (k < 0 && errno == EINTR)
            continue;
        pthread_mutex_lock(&c->mu);
        if (k < 0)
            c->err = errno ? errno : EIO;
        else
            c->done = off += (uint64_t)k;
        stop = c->stop || k < 0;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
    return NULL;
}

/* the copy's bytes [0, size) into s as the copier writes them */
static int bfs__copy_hash(bfs_copier *c, bfs_sha256 *s, const char *what, const char *name)
{
    int rc = 0;
    for (uint64_t h = 0; h < c->size && rc == 0;) {
        pthread_mutex_lock(&c->mu);
        while (c->done <= h && !c->err)
            pthread_cond_wait(&c->cv, &c->mu);
        const uint64_t done = c->done;
        const int err = c->err;
        pthread_mutex_unlock(&c->mu);
        if (done <= h)
            return bfs__errno(BFS_EIO, err, "%s: copying %s failed at byte %llu", what, name, (unsigned long long)done);
        if (bfs__cancelled())
            return bfs__err(BFS_EINTR, "interrupted while copying %s", name);
        const uint64_t n = done - h < c->bs ? done - h : c->bs;
        rc = bfs__pread_all(c->back, c->buf + c->bs, (size_t)n, h, what); /* the second half of buf */
        bfs__sha256_update(s, c->buf + c->bs, (size_t)n);
        h += n;
    }
    return rc;
}

static int bfs__blob_copy(bfs_oci_dir *d, int srcfd, const bfs_oci_layer *l, uint8_t *buf, size_t bs)
{
    int rc = 0;
    bfs_tmpfile t = {.fd = -1, .dirfd = -1};
    char got[65], what[PATH_MAX + 80];
    bfs_sha256 *s = bfs__sha256_new();
    bfs_copier c = {.in = srcfd, .back = -1, .size = l->size, .buf = buf, .bs = bs / 2};
    pthread_t tid;
    bool started = false;
    if (!s)
        return bfs__err(BFS_ENOMEM, "out of memory");
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    BFS_TRY(bfs__tmp_open(&t, d->blobfd, d->blobdir, l->sha256));
    snprintf(what, sizeof what, "%s/%s", d->blobdir, t.tmp);
    c.out = t.fd;
    c.back = openat(d->blobfd, t.tmp, O_RDONLY | O_NOFOLLOW | O_CLOEXEC); /* the temporary is opened write-only */
    if (c.back < 0)
        BFS_FAIL(BFS_EIO, "%s: cannot open to read it back: %s", what, strerror(errno));
    const int fe = posix_fallocate(t.fd, 0, (off_t)l->size); /* a full disk fails here, before the copy */
    if (fe == ENOSPC || fe == EFBIG || fe == EDQUOT)
        BFS_FAIL(BFS_EIO, "%s: cannot reserve %llu bytes: %s", what, (unsigned long long)l->size, strerror(fe));
    if (pthread_create(&tid, NULL, bfs__copier_main, &c) != 0)
        BFS_FAIL(BFS_ENOMEM, "cannot start a thread to copy %s", l->name);
    started = true;
    rc = bfs__copy_hash(&c, s, what, l->name);
    pthread_mutex_lock(&c.mu);
    c.stop = true;
    pthread_mutex_unlock(&c.mu);
    pthread_join(tid, NULL);
    started = false;
    BFS_TRY(rc);
    BFS_TRY(bfs__sha256_hex(s, got));
    if (strcmp(got, l->sha256) != 0)
        BFS_FAIL(BFS_EVERIFY, "%s: its bytes hash to sha256:%s, not sha256:%s (changed since it was checked)", l->name,
                 got, l->sha256);
    BFS_TRY(bfs__tmp_commit(&t));
cleanup:
    if (started) {
        pthread_mutex_lock(&c.mu);
        c.stop = true;
        pthread_mutex_unlock(&c.mu);
        pthread_join(tid, NULL);
    }
    if (c.back >= 0)
        close(c.back);
    bfs__tmp_abort(&t);
    bfs__sha256_free(s);
    pthread_mutex_destroy(&c.mu);
    pthread_cond_destroy(&c.cv);
    return rc;
}

int bfs__oci_put_file(bfs_oci_dir *d, int srcdirfd, int srcfd, const bfs_oci_layer *l, bool copy, uint8_t *buf,
                      size_t bufsize, int *how)
{
    struct stat sb, bd;
    *how = 0;
    if (fstatat(d->blobfd, l->sha256, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
        const bool ours = S_ISREG(sb.st_mode) && sb.st_dev == l->dev && sb.st_ino == l->ino;
        if (!ours)
            return bfs__blob_check(d, l->sha256, l->size, buf, bufsize); /* kept when it is the blob */
        if (!copy)
            return 0; /* linked by an earlier pack */
        /* --copy: our hard link becomes a copy of its own */
    }
    if (!copy && fstat(d->blobfd, &bd) == 0 && bd.st_dev == l->dev) {
        const int rc = bfs__link_durable(srcdirfd, l->name, l->dev, l->ino, d->blobfd, d->blobdir, l->sha256);
        if (rc <= 0) {
            *how = rc == 0 ? 1 : 0;
            return rc;
        }
    }
    *how = 2;
    return bfs__blob_copy(d, srcfd, l, buf, bufsize);
}

int bfs__oci_put_bytes(bfs_oci_dir *d, const void *data, size_t len, char sha[65])
{
    struct stat sb;
    int rc = bfs__sha256_buf(data, len, sha);
    if (rc < 0)
        return rc;
    if (fstatat(d->blobfd, sha, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
        uint8_t *buf = malloc(len ? len : 1);
        if (!buf)
            return bfs__err(BFS_ENOMEM, "out of memory");
        rc = bfs__blob_check(d, sha, len, buf, len ? len : 1);
        free(buf);
        return rc;
    }
    return bfs__write_durable(d->blobfd, d->blobdir, sha, data, len);
}

/* ---- index.json ---------------------------------------------------------------------------- */
static json_t *bfs__index_entry(const char *tag, const char *sha, size_t len)
{
    char dg[80];
    snprintf(dg, sizeof dg, "sha256:%s", sha);
    return json_pack("{s:s, s:s, s:I, s:s, s:{s:s}}", "mediaType", BFS_OCI_MT_MANIFEST, "digest", dg, "size",
                     (json_int_t)len, "artifactType", BFS_MP_ARTIFACT, "annotations", BFS_OCI_ANN_REF, tag);
}

/* the index as it is (NULL when there is none), checked to be one */
static int bfs__index_read(bfs_oci_dir *d, json_t **out)
{
    int rc = 0;
    char *p = bfs__path_join(d->path, BFS_OCI_INDEX_FILE), *text = NULL, esc[2 * JSON_ERROR_TEXT_LENGTH];
    size_t len = 0;
    struct stat sb;
    json_error_t je;
    *out = NULL;
    if (!p)
        return bfs__err(BFS_ENOMEM, "out of memory");
    if (fstatat(d->dirfd, BFS_OCI_INDEX_FILE, &sb, AT_SYMLINK_NOFOLLOW) != 0)
        goto cleanup; /* a new layout */
    if (!S_ISREG(sb.st_mode))
        BFS_FAIL(BFS_EINPUT, "%s: not a regular file", p);
    BFS_TRY(bfs__read_small_file(p, BFS_OCI_MAX_INDEX, &text, &len));
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    const json_t *sv = json_object_get(*out, "schemaVersion");
    if (!*out)
        BFS_FAIL(BFS_EINPUT, "%s: not an OCI image index (line %d: %s); it is left as it is", p, je.line,
                 bfs__esc(je.text, esc, sizeof esc));
    if (!json_is_object(*out) || !json_is_array(json_object_get(*out, "manifests")) ||
        (sv && (!json_is_integer(sv) || json_integer_value(sv) != 2))) {
        json_decref(*out);
        *out = NULL;
        BFS_FAIL(BFS_EINPUT, "%s: not an OCI image index (no manifests array, or not schemaVersion 2); it is left as it is", p);
    }
cleanup:
    free(p);
    free(text);
    return rc;
}

int bfs__oci_index_set(bfs_oci_dir *d, const char *tag, const char *sha, size_t len)
{
    int rc = 0;
    json_t *idx = NULL, *e = bfs__index_entry(tag, sha, len);
    char *text = NULL;
    if (!e)
        return bfs__err(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__index_read(d, &idx));
    if (!idx) {
        idx = json_pack("{s:i, s:s, s:[]}", "schemaVersion", 2, "mediaType", BFS_OCI_MT_INDEX, "manifests");
        if (!idx)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
    }
    json_t *m = json_object_get(idx, "manifests");
    size_t at = json_array_size(m);
    for (size_t i = 0; i < json_array_size(m) && at == json_array_size(m); i++) {
        const char *t = json_string_value(json_object_get(json_object_get(json_array_get(m, i), "annotations"), BFS_OCI_ANN_REF));
        if (t && !strcmp(t, tag))
            at = i; /* the tag moves to this artifact; the manifest it named stays among the blobs */
    }
    if ((at < json_array_size(m) ? json_array_set(m, at, e) : json_array_append(m, e)) != 0)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    text = json_dumps(idx, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__write_durable(d->dirfd, d->path, BFS_OCI_INDEX_FILE, text, strlen(text)));
cleanup:
    json_decref(e);
    json_decref(idx);
    free(text);
    return rc;
}
