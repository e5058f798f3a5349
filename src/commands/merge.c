/*
 * bfs_merge: the coordinator step of a conversion in parts. It turns the parts'
 * manifests in one OUTDIR (bfshard.part-R.json, src/output/parts.c names them) into the
 * manifest and xxh128sums.txt a single run writes, under OUTDIR's lock; manifest.c owns
 * the format and does the merging of the JSON.
 *
 * A part of ranks R converts only R's rank files (convert.c), reading only their rows of
 * the input (and every header), adds R's terms of each source file's hash (src/input/
 * srchash.c: the blocks of the rows R's kernels read), and writes bfshard.part-R.json: the
 * manifest with null hashes where another part knows them, its sums of terms, and its
 * ranks' share of tensors[] (bfs__part_share).
 */
#include "commands/commands.h"
#include "base/bfs_io.h"
#include "output/durable.h"
#include "output/manifest.h"
#include "output/outdir.h"
#include "output/parts.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The part manifests in OUTDIR, sorted by name: names[] (malloc'ed), each read (its head,
 * its tensors checked and counted) and its seal checked. */
static int bfs__load_parts(const char *outdir, char ***names, bfs_mf ***parts, int *n)
{
    int rc = 0;
    DIR *d = opendir(outdir);
    *names = NULL;
    *parts = NULL;
    *n = 0;
    if (!d)
        return bfs__errno(errno == ENOENT ? BFS_EUSAGE : BFS_EIO, errno, "%s: cannot open the output directory", outdir);
    BFS_TRY(bfs__part_manifests(d, names, n));
    if (*n == 0)
        goto cleanup;
    if (!(*parts = calloc((size_t)*n, sizeof **parts)))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (int i = 0; i < *n; i++) {
        BFS_TRY(bfs__mf_open(outdir, (*names)[i], BFS_MF_HEAD_ONLY, NULL, NULL, &(*parts)[i]));
        if (bfs__mf_check_seal((*parts)[i], NULL))
            BFS_FAIL(BFS_EINPUT, "%s: its seal does not match its bytes (edited or torn): rerun that part",
                     bfs__mf_path((*parts)[i]));
    }
cleanup:
    closedir(d);
    return rc;
}

/* every weights file of the merged manifest is in OUTDIR with its size */
static int bfs__merge_check_files(const char *outdir, int dirfd, const json_t *m)
{
    const json_t *files = json_object_get(m, "files");
    for (size_t i = 0; i < json_array_size(files); i++) {
        bfs_manifest_file mf;
        struct stat sb;
        if (!bfs__manifest_file_get(files, i, &mf))
            return bfs__err(BFS_EINPUT, "%s: files[%zu] of the parts is malformed", outdir, i);
        const bool have = fstatat(dirfd, mf.name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode);
        if (have && (uint64_t)sb.st_size == mf.size)
            continue;
        const char *zn = json_string_value(json_object_get(mf.zst, "name"));
        if (!have && zn && fstatat(dirfd, zn, &sb, AT_SYMLINK_NOFOLLOW) == 0)
            continue; /* only the compressed copy is kept */
        return bfs__err(BFS_EINCOMPLETE, "%s/%s: %s (its part's manifest lists %llu bytes): rerun that part, then merge",
                        outdir, mf.name, have ? "wrong size" : "missing", (unsigned long long)mf.size);
    }
    return 0;
}

typedef struct {
    const char *outdir;
    int dirfd;
    json_t *files; /* the merged files[], for the sums written after the manifest */
} bfs_merge_ctx;

/* with the merged manifest's temporary complete: its files are there. The sums files follow
 * the manifest's commit (convert.c's rule: a sums file never stands without its manifest). */
static int bfs__merge_pre_commit(void *user, const json_t *head)
{
    bfs_merge_ctx *c = user;
    const int rc = bfs__merge_check_files(c->outdir, c->dirfd, head);
    if (rc < 0)
        return rc;
    c->files = json_deep_copy(json_object_get(head, "files"));
    return c->files ? 0 : bfs__err(BFS_ENOMEM, "out of memory");
}

int bfs_merge(const char *outdir, FILE *log)
{
    int rc = 0, n = 0;
    char **names = NULL;
    bfs_mf **parts = NULL;
    bfs_outdir_lock lk = {.fd = -1, .dirfd = -1};
    bfs_merge_ctx mc = {outdir, -1, NULL};
    struct stat sd;
    bfs__err_clear();
    if (stat(outdir, &sd) != 0)
        BFS_FAIL(errno == ENOENT ? BFS_EUSAGE : BFS_EIO, "%s: cannot open the output directory: %s", outdir, strerror(errno));
    /* alone in OUTDIR: no part is being written (parts hold the lock shared) */
    BFS_TRY(bfs__outdir_lock(outdir, false, &lk));
    const int dirfd = lk.dirfd;
    mc.dirfd = dirfd;
    BFS_TRY(bfs__load_parts(outdir, &names, &parts, &n));
    if (n == 0) {
        char *mp = bfs__path_join(outdir, BFS_MANIFEST_NAME);
        struct stat sb;
        const bool merged = mp && stat(mp, &sb) == 0;
        free(mp);
        if (merged) {
            bfs__line(log, "bfshard: %s: already merged (no parts left; bfshard verify checks it)", outdir);
            goto cleanup;
        }
        BFS_FAIL(BFS_EINCOMPLETE, "%s: no part manifests (" BFS_PART_PREFIX "RANKS" BFS_PART_SUFFIX
                 ") to merge: run convert --ranks first", outdir);
    }
    BFS_TRY(bfs__manifest_merge(dirfd, parts, (const char *const *)names, n, outdir, bfs__merge_pre_commit, &mc));
    BFS_TRY(bfs__manifest_write_sums(dirfd, outdir, mc.files));
    for (int i = 0; i < n; i++) {
        bfs__line(log, "bfshard: merged %s/%s", outdir, names[i]); /* a part's name, from the directory */
        unlinkat(dirfd, names[i], 0);
    }
    bfs__outdir_remove_debris(dirfd); /* what killed parts left: temporaries, part locks */
    BFS_TRY(bfs__dir_sync(dirfd, outdir));
cleanup:
    json_decref(mc.files);
    bfs__outdir_unlock(&lk, outdir, false);
    for (int i = 0; i < n; i++) {
        free(names[i]);
        if (parts)
            bfs__mf_free(parts[i]);
    }
    free(names);
    free(parts);
    return rc;
}
