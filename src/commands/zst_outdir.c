/*
 * Compressed artifacts, the OUTDIR side: compress every rank file of a bfshard
 * output directory and record the copies in its manifest (written durably before
 * any rank file is removed by --rm); the manifest entry of a finished writer.
 * The format is described in zst_format.h; the writer is zst_write.c, the reader
 * zst_read.c, the single-file commands zst_file.c; verify.c checks the copies.
 */
#include "commands/commands.h"
#include "backend/backend.h"
#include "plan/plan.h"
#include "base/bfs_io.h"
#include "output/durable.h"
#include "output/manifest.h"
#include "output/outdir.h"
#include "zst/zst.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

struct json_t *bfs__zst_manifest_entry(const bfs_zst_writer *w, const char *zname)
{
    char hx[33];
    bfs__zst_writer_hashes(w, hx, NULL);
    return bfs__manifest_zst_entry(zname, w->out_off, hx, bfs__zst_mode_name(w->mode), w->level, w->frame_max, w->nent);
}

/* For convert's reused rank files: compress in_path into the open ofd; *wout is finished. */

/* ==== OUTDIR: compress rank files, record them in the manifest ====================
 * One writer at a time (the OUTDIR lock). Before a copy's temporary is created its name
 * goes to the journal (.bfshard-compress-inprogress, "+ NAME"), and the manifest is
 * committed durably with each new "zst" entry, so a run killed at any point leaves every
 * file it made either recorded in the manifest or named in the journal: a rerun keeps the
 * recorded copies made with the same options, replaces the others, and never replaces a
 * file that neither names. The journal goes once the manifest and the sums file are
 * final; --rm removes rank files only after that manifest commit. */
typedef struct {
    const char *outdir;
    int dirfd;
    bfs_mf *mr;            /* the manifest read; its head gets the "zst" entries */
    const bfs_owned *own;  /* names the manifest and journals record */
    bool resume;           /* the journal of an interrupted compress is there */
} bfs_zst_odir;

static bool bfs__zst_exists(int dirfd, const char *name)
{
    struct stat sb;
    return fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0;
}

/* The recorded copy zname (entry z) was made with these options and its bytes are still
 * those recorded: an interrupted run's finished work, kept. */
static bool bfs__zst_recorded_intact(int dirfd, const json_t *z, const char *zname, const bfs_compress_opts *o)
{
    const size_t fb = (size_t)(o->frame_bytes ? o->frame_bytes : BFS_ZST_DEFAULT_FRAME) & ~(size_t)63;
    const char *fmt = json_string_value(json_object_get(z, "format"));
    const char *want = bfs__manifest_hash(z);
    const json_t *jsz = json_object_get(z, "size");
    if (!fmt || !want || !json_is_integer(jsz) || strcmp(fmt, bfs__zst_mode_name(o->mode)) != 0 ||
        json_integer_value(json_object_get(z, "level")) != (o->level ? o->level : ZSTD_CLEVEL_DEFAULT) ||
        (uint64_t)json_integer_value(json_object_get(z, "frame_bytes")) != fb)
        return false;
    const int fd = openat(dirfd, zname, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    bool ok = fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size == json_integer_value(jsz);
    XXH3_state_t *st = ok ? XXH3_createState() : NULL;
    uint8_t *buf = ok ? malloc(1u << 20) : NULL;
    if (ok && st && buf) {
        char got[33];
        XXH3_128bits_reset(st);
        ok = bfs__hash_range(fd, 0, (uint64_t)sb.st_size, buf, 1u << 20, zname, st) == 0;
        bfs__hash_hex(XXH3_128bits_digest(st), got);
        ok = ok && strcmp(got, want) == 0;
    } else {
        ok = false;
    }
    free(buf);
    XXH3_freeState(st);
    if (fd >= 0)
        close(fd);
    bfs__err_clear();
    return ok;
}

/* Compress one weights entry of the manifest beside its rank file, record it in the
 * entry (f) and commit the manifest. A rank file already gone with its copy recorded is
 * skipped, and so is, when resuming, a recorded copy made with the same options. */
static int bfs__zst_compress_entry(const bfs_zst_odir *od, json_t *f, const bfs_manifest_file *mf,
                                   const bfs_compress_opts *o, bfs_compress_result *res)
{
    int rc = 0;
    const char *outdir = od->outdir;
    const int dirfd = od->dirfd;
    bfs_tmpfile t = {.fd = -1, .dirfd = -1};
    bfs_zst_writer *w = NULL;
    char zname[1024], out[PATH_MAX + 1100], inp[PATH_MAX], line[1100];
    struct stat sb;
    const char *recorded = json_string_value(json_object_get(mf->zst, "name"));
    if (fstatat(dirfd, mf->name, &sb, 0) != 0) {
        /* compressed earlier with --rm: nothing to do when its .zst is recorded and present */
        if (recorded && !strchr(recorded, '/') && recorded[0] != '.' && bfs__zst_exists(dirfd, recorded))
            return 0;
        return bfs__err(BFS_EINPUT, "%s/%s: missing (run bfshard verify)", outdir, mf->name);
    }
    snprintf(zname, sizeof zname, "%s%s", mf->name, o->mode == BFS_ZST_BYTEGROUP ? ".bfz" : ".zst");
    snprintf(out, sizeof out, "%s/%s", outdir, zname);
    snprintf(inp, sizeof inp, "%s/%s", outdir, mf->name);
    if (bfs__zst_exists(dirfd, zname)) {
        const bool is_recorded = recorded && !strcmp(recorded, zname);
        if (!bfs__outdir_is_ours(od->own, zname))
            return bfs__outdir_check_foreign(dirfd, outdir, od->own, zname);
        if (od->resume && is_recorded && bfs__zst_recorded_intact(dirfd, mf->zst, zname, o)) {
            bfs__line(o->log, "bfshard: %s: kept from the interrupted run (hash verified)", zname);
            return 0;
        }
        if (bfs__cancelled())
            return bfs__err(BFS_EINTR, "interrupted while checking %s", out);
        if (is_recorded && !od->resume && !o->force)
            return bfs__err(BFS_EEXIST, "%s: already exists (use --force to replace it)", out);
        /* ours (recorded, or named by an interrupted run's journal): replaced by the commit */
    }
    uint64_t isz = 0;
    snprintf(line, sizeof line, "+ %s\n", zname);
    BFS_TRY(bfs__journal_append(dirfd, outdir, BFS_ZJOURNAL_NAME, line));
    BFS_TRY(bfs__tmp_open(&t, dirfd, outdir, zname));
    BFS_TRY(bfs__zst_compress_fd(inp, t.fd, o, &w, &isz));
    char zhex[33], uhex[33];
    bfs__zst_writer_hashes(w, zhex, uhex);
    if (isz != mf->size || strcmp(uhex, mf->hash) != 0)
        BFS_FAIL(BFS_EVERIFY, "%s: does not match its manifest (%llu bytes, hash %s; manifest %lld bytes, %s): run bfshard verify; nothing was compressed",
                 inp, (unsigned long long)isz, uhex, (long long)mf->size, mf->hash);
    BFS_TRY(bfs__tmp_commit(&t));
    json_t *z = bfs__zst_manifest_entry(w, zname);
    if (!z)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    json_object_set_new(f, "zst", z);
    /* recorded now, so a rerun after a crash keeps it */
    BFS_TRY(bfs__mf_write_copy(dirfd, outdir, BFS_MANIFEST_NAME, bfs__mf_head(od->mr), od->mr));
    bfs__line(o->log, "bfshard: %s -> %s: %llu -> %llu bytes (%.3fx), %llu frames", mf->name, zname,
              (unsigned long long)isz, (unsigned long long)w->out_off, w->out_off ? (double)isz / (double)w->out_off : 0.0,
              (unsigned long long)w->nent);
    if (res) {
        res->bytes_in += isz;
        res->bytes_out += w->out_off;
        res->files++;
        res->frames += w->nent;
    }
cleanup:
    bfs__tmp_abort(&t);
    bfs__zst_writer_free(w);
    return rc;
}

/* --rm: the rank files that have a recorded compressed copy go, then the directory is synced */
static int bfs__zst_remove_compressed(const char *outdir, int dirfd, const json_t *files)
{
    for (size_t i = 0; i < json_array_size(files); i++) {
        const json_t *f = json_array_get(files, i);
        const char *name = json_string_value(json_object_get(f, "name"));
        if (json_object_get(f, "zst") && name && unlinkat(dirfd, name, 0) != 0 && errno != ENOENT)
            return bfs__err(BFS_EIO, "%s/%s: cannot remove: %s", outdir, name, strerror(errno));
    }
    return bfs__dir_sync(dirfd, outdir);
}

int bfs_compress_outdir(const char *outdir, const bfs_compress_opts *o_arg, bfs_compress_result *res_arg)
{
    int rc = 0;
    bfs_mf *mr = NULL;
    bfs_compress_opts opts, *o = &opts;
    bfs_compress_result result, *res = &result;
    bfs_outdir_lock lk = {.fd = -1, .dirfd = -1};
    bfs_owned own = {0};
    struct timespec t0;
    BFS_TRY(bfs__zst_run_begin(o_arg, o, res_arg, res, &t0));
    BFS_TRY(bfs__outdir_lock(outdir, false, &lk));
    /* read once (structure, every tensor parsed); each rewrite copies tensors[] through */
    BFS_TRY(bfs__mf_open(outdir, BFS_MANIFEST_NAME, 0, NULL, NULL, &mr));
    const char *mpath = bfs__mf_path(mr);
    json_t *files = json_object_get(bfs__mf_head(mr), "files");
    if (!json_is_array(files) || !bfs__mf_has_tensors(mr))
        BFS_FAIL(BFS_EINPUT, "%s: not a bfshard manifest (%s)", mpath, json_is_array(files) ? "no tensors array" : "no files array");
    const int dirfd = lk.dirfd;
    BFS_TRY(bfs__owned_load(dirfd, outdir, &own));
    const bfs_zst_odir od = {.outdir = outdir, .dirfd = dirfd, .mr = mr, .own = &own,
                             .resume = bfs__zst_exists(dirfd, BFS_ZJOURNAL_NAME)};
    for (size_t i = 0; i < json_array_size(files); i++) {
        bfs_manifest_file mf;
        if (!bfs__manifest_file_get(files, i, &mf))
            BFS_FAIL(BFS_EINPUT, "%s: files[%zu] is malformed", mpath, i);
        if (mf.kind && strcmp(mf.kind, "weights") == 0)
            BFS_TRY(bfs__zst_compress_entry(&od, json_array_get(files, i), &mf, o, res));
    }
    if (bfs__cancelled())
        BFS_FAIL(BFS_EINTR, "interrupted while compressing %s", outdir);
    /* the manifest first (durably, re-sealed), then the originals may go */
    BFS_TRY(bfs__mf_write_copy(dirfd, outdir, BFS_MANIFEST_NAME, bfs__mf_head(mr), mr));
    if (o->remove)
        BFS_TRY(bfs__zst_remove_compressed(outdir, dirfd, files));
    /* xxh128sums.txt: every file that is there, compressed ones included */
    BFS_TRY(bfs__manifest_write_sums(dirfd, outdir, files));
    if (unlinkat(dirfd, BFS_ZJOURNAL_NAME, 0) == 0)
        BFS_TRY(bfs__dir_sync(dirfd, outdir));
cleanup:
    bfs__owned_free(&own);
    bfs__outdir_unlock(&lk, outdir, false);
    bfs__mf_free(mr);
    bfs__zst_run_end(res_arg, res, &t0);
    return rc;
}
