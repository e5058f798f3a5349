/*
 * bfs_pack: a bfshard OUTDIR as an OCI image layout holding a CNCF ModelPack
 * artifact (src/oci/ owns the format and the writing; docs/OCI.md describes it).
 *
 *   paths (OCIDIR not OUTDIR, nor either inside the other) -> OUTDIR locked -> its
 *   manifest read once (seal, summary, files[]) and its sums files checked -> every file
 *   checked (a regular file, not a link; its size) -> each file in path order: its
 *   SHA-256 (the one convert --sha256 recorded, for a file unchanged since the manifest;
 *   else read, with its XXH3-128 checked against the manifest in the same pass) and its
 *   blob (hard link or copy) -> the config blob, the manifest blob -> index.json.
 *
 * An OUTDIR that does not verify is refused (BFS_EVERIFY) before index.json names
 * anything; the blobs already written are complete and a rerun reuses them.
 */
#include "commands/commands.h"
#include "oci/oci.h"
#include "output/durable.h"
#include "output/manifest.h"
#include "output/outdir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BFS_PACK_BUF (8u << 20)

typedef struct {
    const bfs_pack_opts *o;
    const char *outdir;
    bfs_outdir_lock lk;
    bfs_manifest_summary sum;
    struct timespec mf_mtime; /* the manifest's: a file modified after it is re-hashed */
    bfs_oci_layer *l;
    size_t n;
    uint8_t *buf;
    bfs_sha256 *sha;
    XXH3_state_t *xst;
    bfs_pack_result *res;
} bfs_pack_run;

static void bfs__plog(const bfs_pack_run *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bfs__plog(const bfs_pack_run *p, const char *fmt, ...)
{
    if (!p->o->log)
        return;
    va_list ap;
    va_start(ap, fmt);
    bfs__vline(p->o->log, "bfshard: pack: ", fmt, ap); /* escaped: names come from the OUTDIR */
    va_end(ap);
    fflush(p->o->log);
}

static int bfs__cmp_layer(const void *a, const void *b)
{
    return strcmp(((const bfs_oci_layer *)a)->name, ((const bfs_oci_layer *)b)->name);
}

/* ---- the OUTDIR, read and checked ---------------------------------------------------------------- */
/* the manifest (a merged one), its seal, its sums files */
static int bfs__pack_manifest(bfs_pack_run *p)
{
    struct stat sb;
    char ep[BFS_ESC_MAX];
    bfs__esc(p->outdir, ep, sizeof ep);
    if (fstatat(p->lk.dirfd, BFS_MANIFEST_NAME, &sb, AT_SYMLINK_NOFOLLOW) != 0)
        return bfs__err(BFS_EINPUT, "%s: no %s: not a finished bfshard conversion (a conversion in parts: run "
                        "`bfshard merge` first)", ep, BFS_MANIFEST_NAME);
    if (!S_ISREG(sb.st_mode))
        return bfs__err(BFS_EVERIFY, "%s/%s: not a regular file: the OUTDIR does not verify", ep, BFS_MANIFEST_NAME);
    p->mf_mtime = sb.st_mtim;
    int rc = bfs__manifest_summary(p->lk.dirfd, p->outdir, BFS_MANIFEST_NAME, &p->sum);
    if (rc < 0)
        return rc;
    if (!p->sum.seal_ok)
        return bfs__err(BFS_EVERIFY, "%s/%s: its bytes do not match its seal (changed after it was written): the "
                        "OUTDIR does not verify", ep, BFS_MANIFEST_NAME);
    if (bfs__manifest_check_sums(p->outdir, p->sum.files, NULL) != 0)
        return bfs__err(BFS_EVERIFY, "%s: %s%s does not agree with the manifest: the OUTDIR does not verify "
                        "(`bfshard verify` names the line)", ep, BFS_SUMS_NAME,
                        bfs__manifest_has_sha256(p->sum.files) ? " or " BFS_SHA256SUMS_NAME : "");
    return 0;
}

/* one layer for OUTDIR's `name`: a regular file (never a link) of the size the manifest says */
static int bfs__pack_add(bfs_pack_run *p, const char *name, const bfs_manifest_file *mf)
{
    struct stat sb;
    char ep[BFS_ESC_MAX], en[BFS_ESC_MAX];
    bfs_oci_layer *l = &p->l[p->n];
    bfs__esc(p->outdir, ep, sizeof ep);
    bfs__esc(name, en, sizeof en);
    if (strlen(name) >= sizeof l->name)
        return bfs__err(BFS_EINPUT, "%s/%s: a name too long for a layer", ep, en);
    memset(l, 0, sizeof *l);
    snprintf(l->name, sizeof l->name, "%s", name);
    l->rank = mf ? mf->rank : -1;
    l->media_type = bfs__oci_media_type(name, mf ? mf->kind : NULL);
    if (fstatat(p->lk.dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT && mf && mf->zst)
            return bfs__err(BFS_EINPUT, "%s/%s: only its compressed copy is there: `bfshard decompress` it first (a "
                            "layer is the uncompressed file)", ep, en);
        return bfs__errno(BFS_EVERIFY, errno, "%s/%s: MISSING: the OUTDIR does not verify", ep, en);
    }
    if (S_ISLNK(sb.st_mode))
        return bfs__err(BFS_EVERIFY, "%s/%s: a symbolic link, not the file bfshard wrote: refused (its blob would be "
                        "whatever the link points to)", ep, en);
    if (!S_ISREG(sb.st_mode))
        return bfs__err(BFS_EVERIFY, "%s/%s: NOT A REGULAR FILE: the OUTDIR does not verify", ep, en);
    if (mf && (uint64_t)sb.st_size != mf->size)
        return bfs__err(BFS_EVERIFY, "%s/%s: BAD SIZE: %lld bytes, the manifest says %llu: the OUTDIR does not verify",
                        ep, en, (long long)sb.st_size, (unsigned long long)mf->size);
    l->size = (uint64_t)sb.st_size;
    if (mf)
        snprintf(l->xxh3, sizeof l->xxh3, "%s", mf->hash);
    /* the recorded digest stands for a file not modified since its manifest was written */
    const bool newer = sb.st_mtim.tv_sec > p->mf_mtime.tv_sec ||
                       (sb.st_mtim.tv_sec == p->mf_mtime.tv_sec && sb.st_mtim.tv_nsec > p->mf_mtime.tv_nsec);
    if (mf && mf->sha256)
        snprintf(l->recorded, sizeof l->recorded, "%s", mf->sha256);
    if (l->recorded[0] && !p->o->verify && !newer)
        memcpy(l->sha256, l->recorded, sizeof l->sha256);
    p->n++;
    return 0;
}

static int bfs__pack_files(bfs_pack_run *p)
{
    const json_t *files = p->sum.files;
    const size_t nf = json_array_size(files);
    char ep[BFS_ESC_MAX];
    if (!(p->l = calloc(nf + 3, sizeof *p->l)))
        return bfs__err(BFS_ENOMEM, "out of memory");
    for (size_t i = 0; i < nf; i++) {
        bfs_manifest_file mf;
        if (!bfs__manifest_file_get(files, i, &mf))
            return bfs__err(BFS_EINPUT, "%s/%s: files[%zu] is malformed", bfs__esc(p->outdir, ep, sizeof ep),
                            BFS_MANIFEST_NAME, i);
        const int rc = bfs__pack_add(p, mf.name, &mf);
        if (rc < 0)
            return rc;
    }
    /* the manifest itself and its sums files: a pulled copy is an OUTDIR `bfshard verify` checks */
    int rc = bfs__pack_add(p, BFS_MANIFEST_NAME, NULL);
    if (rc == 0)
        rc = bfs__pack_add(p, BFS_SUMS_NAME, NULL);
    if (rc == 0 && bfs__manifest_has_sha256(files))
        rc = bfs__pack_add(p, BFS_SHA256SUMS_NAME, NULL);
    if (rc < 0)
        return rc;
    qsort(p->l, p->n, sizeof *p->l, bfs__cmp_layer);
    for (size_t i = 1; i < p->n; i++)
        if (!strcmp(p->l[i - 1].name, p->l[i].name))
            return bfs__err(BFS_EINPUT, "%s/%s: lists %s twice", bfs__esc(p->outdir, ep, sizeof ep), BFS_MANIFEST_NAME,
                            p->l[i].name);
    return 0;
}

/* ---- each layer: its digest, its blob ------------------------------------------------------------- */
/* the open file: what was checked, and its SHA-256 (read, its XXH3-128 checked on the way) when not recorded */
static int bfs__pack_digest(bfs_pack_run *p, bfs_oci_layer *l, int fd)
{
    int rc = 0;
    struct stat sb;
    char path[PATH_MAX + NAME_MAX + 2], got[33], sha[65];
    snprintf(path, sizeof path, "%s/%s", p->outdir, l->name);
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != l->size)
        return bfs__err(BFS_EVERIFY, "%s: changed while it was being packed", path);
    l->dev = sb.st_dev;
    l->ino = sb.st_ino;
    if (l->sha256[0])
        return 0; /* recorded by convert --sha256 */
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL); /* read ahead while the last chunk is hashed */
    XXH3_128bits_reset(p->xst);
    BFS_TRY(bfs__sha256_reset(p->sha));
    BFS_TRY(bfs__hash_range2(fd, 0, l->size, p->buf, BFS_PACK_BUF, path, p->xst, p->sha));
    BFS_TRY(bfs__sha256_hex(p->sha, sha));
    p->res->bytes_hashed += l->size;
    bfs__hash_hex(XXH3_128bits_digest(p->xst), got);
    if (l->xxh3[0] && strcmp(got, l->xxh3) != 0)
        BFS_FAIL(BFS_EVERIFY, "%s: BAD: XXH3-128 %s, the manifest says %s: the OUTDIR does not verify", path, got,
                 l->xxh3);
    if (l->recorded[0] && strcmp(sha, l->recorded) != 0)
        BFS_FAIL(BFS_EVERIFY, "%s: BAD sha256 %s, the manifest says %s: the OUTDIR does not verify", path, sha,
                 l->recorded);
    memcpy(l->sha256, sha, sizeof sha);
cleanup:
    return rc;
}

static int bfs__pack_layers(bfs_pack_run *p, bfs_oci_dir *d)
{
    int rc = 0;
    for (size_t i = 0; i < p->n; i++) {
        bfs_oci_layer *l = &p->l[i];
        if (bfs__cancelled())
            return bfs__err(BFS_EINTR, "interrupted while packing %s", p->outdir);
        const int fd = openat(p->lk.dirfd, l->name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
            return bfs__errno(BFS_EVERIFY, errno, "%s/%s: cannot open (changed while it was being packed?)", p->outdir,
                              l->name);
        int how = 0;
        rc = bfs__pack_digest(p, l, fd);
        if (rc == 0)
            rc = bfs__oci_put_file(d, p->lk.dirfd, fd, l, p->o->copy != 0, p->buf, BFS_PACK_BUF, &how);
        close(fd);
        if (rc < 0)
            return rc;
        p->res->linked += how == 1;
        p->res->copied += how == 2;
        p->res->kept += how == 0;
        p->res->bytes += l->size;
        bfs__test_signal("pack"); /* a blob is complete (tests: kill -9 here, then rerun) */
    }
    p->res->layers = p->n;
    return 0;
}

/* the config and manifest blobs, then index.json: the artifact exists once that is committed */
static int bfs__pack_commit(bfs_pack_run *p, bfs_oci_dir *d, const char *tag, const char *created)
{
    int rc = 0;
    char *cfg = NULL, *man = NULL, csha[65], msha[65], name[NAME_MAX + 1];
    size_t clen = 0, mlen = 0;
    bfs_oci_facts f;
    memset(&f, 0, sizeof f);
    bfs__oci_facts_from(&p->sum, &f);
    if (!p->o->name) { /* the OUTDIR's directory name */
        char real[PATH_MAX];
        const char *b = realpath(p->outdir, real) ? strrchr(real, '/') : NULL;
        snprintf(name, sizeof name, "%s", b && b[1] ? b + 1 : "model");
    }
    f.name = p->o->name ? p->o->name : name;
    f.revision = p->o->revision;
    f.created = created;
    if (!f.name[0])
        BFS_FAIL(BFS_EUSAGE, "--name must not be empty");
    BFS_TRY(bfs__oci_config_json(&f, p->l, p->n, &cfg, &clen));
    BFS_TRY(bfs__oci_put_bytes(d, cfg, clen, csha));
    BFS_TRY(bfs__oci_manifest_json(&f, csha, clen, p->l, p->n, &man, &mlen));
    BFS_TRY(bfs__oci_put_bytes(d, man, mlen, msha));
    if (bfs__cancelled())
        BFS_FAIL(BFS_EINTR, "interrupted: %s was not tagged", d->path);
    BFS_TRY(bfs__oci_index_set(d, tag, msha, mlen));
    snprintf(p->res->manifest_digest, sizeof p->res->manifest_digest, "sha256:%s", msha);
cleanup:
    free(cfg);
    free(man);
    return rc;
}

int bfs_pack(const char *outdir, const char *ocidir, const bfs_pack_opts *o_arg, bfs_pack_result *res_arg)
{
    int rc = 0;
    bfs_pack_opts opts;
    bfs_pack_result result;
    bfs_oci_dir d = {.dirfd = -1, .blobfd = -1};
    bfs_pack_run P = {.o = &opts, .outdir = outdir, .res = &result, .lk = {.fd = -1, .dirfd = -1, .pfd = -1}};
    bfs_pack_run *p = &P;
    char created[40];
    const double t0 = bfs__now();
    bfs__err_clear();
    bfs__cancel_reset();
    bfs_pack_opts_init(&opts);
    bfs_pack_result_init(&result);
    BFS_TRY(bfs__struct_out_check(res_arg, "bfs_pack_result"));
    BFS_TRY(bfs__struct_in(&opts, sizeof opts, o_arg, "bfs_pack_opts"));
    if (!outdir || !ocidir)
        BFS_FAIL(BFS_EUSAGE, "pack needs OUTDIR and OCIDIR");
    const char *tag = opts.tag ? opts.tag : BFS_OCI_DEFAULT_TAG;
    if (!bfs__oci_tag_ok(tag))
        BFS_FAIL(BFS_EUSAGE, "--tag %s: a tag is 1 to 128 of A-Z a-z 0-9 . _ -, not beginning with . or -", tag);
    if (opts.created)
        BFS_TRY(bfs__oci_created(opts.created, created));
    BFS_TRY(bfs__oci_check_paths(outdir, ocidir));
    p->buf = malloc(BFS_PACK_BUF);
    p->sha = bfs__sha256_new();
    p->xst = XXH3_createState();
    if (!p->buf || !p->sha || !p->xst)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__outdir_lock(outdir, false, &p->lk)); /* no convert, compress or merge meanwhile */
    BFS_TRY(bfs__pack_manifest(p));
    BFS_TRY(bfs__pack_files(p));
    BFS_TRY(bfs__oci_open(ocidir, &d));
    bfs__plog(p, "%s -> %s:%s: %zu layers", outdir, ocidir, tag, p->n);
    BFS_TRY(bfs__pack_layers(p, &d));
    BFS_TRY(bfs__pack_commit(p, &d, tag, opts.created ? created : NULL));
    bfs__plog(p, "%s:%s = %s (%llu blobs hard-linked, %llu copied, %llu already there; %llu bytes hashed)", ocidir,
              tag, result.manifest_digest, (unsigned long long)result.linked, (unsigned long long)result.copied,
              (unsigned long long)result.kept, (unsigned long long)result.bytes_hashed);
cleanup:
    bfs__oci_close(&d, rc < 0);
    bfs__outdir_unlock(&p->lk, outdir, false);
    json_decref(p->sum.files);
    free(p->l);
    free(p->buf);
    bfs__sha256_free(p->sha);
    XXH3_freeState(p->xst);
    result.seconds = bfs__now() - t0;
    bfs__struct_out(res_arg, &result, sizeof result);
    return rc;
}
