/*
 * OUTDIR (see outdir.h): path checks, starting the journal of a run (reading and adding
 * to it: journal.c), resume / already done, emptying the directory for a new run, and the same for a part of a conversion
 * in an OUTDIR other parts share. Which files are ours and the lock:
 * outdir_own.c.
 */
#include "output/outdir.h"
#include "output/check.h"
#include "base/bfs_io.h"
#include "output/durable.h"
#include "output/hashfile.h"
#include "output/manifest.h"
#include "output/parts.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* ---- where OUTDIR may be ---------------------------------------------------------------- */
/* Is `child` equal to or inside `parent` (both absolute, canonical)? */
static bool bfs__path_within(const char *child, const char *parent)
{
    const size_t n = strlen(parent);
    return strncmp(child, parent, n) == 0 && (child[n] == '\0' || child[n] == '/' || (n == 1 && parent[0] == '/'));
}

/* canonical path of a directory that may not exist yet: realpath(parent)/base */
static char *bfs__canon_out(const char *outdir)
{
    char buf[PATH_MAX];
    if (realpath(outdir, buf))
        return bfs__strdup(buf);
    char *tmp = bfs__strdup(outdir);
    if (!tmp)
        return NULL;
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/')
        tmp[--n] = '\0';
    char *slash = strrchr(tmp, '/');
    const char *base = slash ? slash + 1 : tmp;
    const char *parent = slash ? (slash == tmp ? "/" : tmp) : ".";
    if (slash)
        *slash = '\0';
    char *res = NULL;
    if (realpath(parent, buf)) {
        res = malloc(strlen(buf) + strlen(base) + 2);
        if (res)
            sprintf(res, "%s/%s", strcmp(buf, "/") ? buf : "", base);
    }
    free(tmp);
    return res;
}

int bfs__outdir_check_paths(const char *input, const char *outdir, const bfs_input *in)
{
    int rc = 0;
    char inbuf[PATH_MAX];
    char *out = bfs__canon_out(outdir);
    if (!out)
        return bfs__errno(BFS_EUSAGE, errno, "%s: cannot resolve the output directory's parent", outdir);
    if (!realpath(in->root, inbuf))
        BFS_FAIL(BFS_EINPUT, "%s: cannot resolve the input directory", input);
    if (bfs__path_within(out, inbuf))
        BFS_FAIL(BFS_EUSAGE, "output directory %s is the input directory or inside it (%s): choose another", outdir, inbuf);
    for (int i = 0; i < in->nfiles; i++) {
        char fb[PATH_MAX];
        if (realpath(in->files[i].path, fb) && bfs__path_within(fb, out))
            BFS_FAIL(BFS_EUSAGE, "input file %s lies inside the output directory %s: choose another", in->files[i].path, outdir);
    }
cleanup:
    free(out);
    return rc;
}

/* ---- the journal (its file: journal.c) ----------------------------------------------- */
/* a new run: the journal holds the fingerprint, then "+ NAME" of every output it may write
 * (so a rerun after kill -9 knows them as ours before any of them exists) */
static int bfs__journal_start(int dirfd, const char *outdir, const char *jname, const char *fingerprint,
                              const char *const *outputs, size_t nout)
{
    size_t cap = 64;
    for (size_t i = 0; i < nout; i++)
        cap += strlen(outputs[i]) + 3;
    char *text = malloc(cap);
    if (!text)
        return bfs__err(BFS_ENOMEM, "out of memory");
    size_t n = (size_t)snprintf(text, cap, "%s\n", fingerprint);
    for (size_t i = 0; i < nout; i++)
        n += (size_t)snprintf(text + n, cap - n, "+ %s\n", outputs[i]);
    if (unlinkat(dirfd, jname, 0) != 0 && errno != ENOENT) {
        free(text);
        return bfs__errno(BFS_EIO, errno, "%s/%s: cannot remove", outdir, jname);
    }
    const int rc = bfs__journal_append(dirfd, outdir, jname, text);
    free(text);
    return rc;
}

/* ---- already done ----------------------------------------------------------------------------- */
bool bfs__outdir_already_done(const char *outdir, const char *fingerprint)
{
    bfs_mf *mr = NULL;
    bool done = false;
    if (bfs__mf_open(outdir, BFS_MANIFEST_NAME, BFS_MF_HEAD_ONLY, NULL, NULL, &mr) == 0) { /* the head only */
        const char *fp = json_string_value(json_object_get(bfs__mf_head(mr), "plan_fingerprint"));
        const bool same = fp && strcmp(fp, fingerprint) == 0;
        bfs__mf_free(mr);
        if (same) {
            bfs__err_clear(); /* as bfs_verify starts */
            done = bfs__check_outdir(outdir, NULL, NULL) == 0;
        }
    }
    bfs__err_clear();
    if (done) {
        /* a run killed between its manifest and removing its journal leaves the journal */
        char *jp = bfs__path_join(outdir, BFS_JOURNAL_NAME);
        if (jp)
            unlink(jp);
        free(jp);
    }
    return done;
}

/* ---- preparing OUTDIR ---------------------------------------------------------------------------- */
static int bfs__outdir_open(const char *outdir, int *dirfd)
{
    struct stat sb;
    if (mkdir(outdir, 0755) != 0 && errno != EEXIST)
        return bfs__errno(errno == ENOSPC || errno == EROFS ? BFS_EIO : BFS_EUSAGE, errno, "%s: cannot create output directory", outdir);
    if (lstat(outdir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return bfs__err(BFS_EUSAGE, "%s: exists and is not a directory", outdir);
    *dirfd = open(outdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (*dirfd < 0)
        return bfs__errno(BFS_EIO, errno, "%s: cannot open output directory", outdir);
    return 0;
}

/* Refuse a directory holding the user's files (or another conversion) without --force;
 * then remove what is ours: temporaries always, and for a new run every file an earlier
 * manifest or journal of bfshard records. A file no record names is never touched. */
static int bfs__outdir_clean(DIR *d, int dirfd, const char *outdir, const char *journal, const bfs_owned *own,
                             bool resume, bool force)
{
    struct dirent *e;
    bool nonempty = false, removed = false;
    /* a run killed while starting leaves a journal without its fingerprint line: debris */
    const bool torn = journal && !(strlen(journal) >= 33 && journal[32] == '\n');
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, "..") || !strcmp(nm, BFS_LOCK_NAME))
            continue;
        if ((bfs__is_tmp_name(nm) && bfs__outdir_is_ours(own, nm)) || bfs__is_part_lock(nm) ||
            (torn && !strcmp(nm, BFS_JOURNAL_NAME)))
            continue; /* an interrupted run's temporary files (a killed part's lock) are not the user's */
        nonempty = true;
    }
    if (nonempty && !resume && !force) {
        if (journal && !torn)
            return bfs__err(BFS_EEXIST, "%s: holds an interrupted conversion of other input or options; use --force to replace it", outdir);
        return bfs__err(BFS_EEXIST, "%s: exists and is not empty; use --force to replace bfshard's files in it (other files are left alone)", outdir);
    }
    rewinddir(d);
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, "..") || !strcmp(nm, BFS_LOCK_NAME) || !bfs__outdir_is_ours(own, nm))
            continue;
        /* resuming: only temporaries go (rank files the journal vouches for are checked next) */
        if (resume && !bfs__is_tmp_name(nm) && !bfs__is_part_lock(nm))
            continue;
        /* unlinkat removes a symlink itself, never its target */
        if (unlinkat(dirfd, nm, 0) != 0 && errno != ENOENT)
            return bfs__errno(BFS_EIO, errno, "%s/%s: cannot remove", outdir, nm);
        removed = true;
    }
    return removed ? bfs__dir_sync(dirfd, outdir) : 0;
}

/* Does the rank file `of` hold the bytes whose hash the journal recorded (want)? */
static bool bfs__rank_file_intact(int dirfd, const bfs_outfile *of, const char *want, XXH3_state_t *st)
{
    const int fd = openat(dirfd, of->name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct stat fs;
    bool ok = fstat(fd, &fs) == 0 && S_ISREG(fs.st_mode) && (uint64_t)fs.st_size == of->size;
    if (ok) {
        XXH3_128bits_reset(st);
        char got[33];
        ok = bfs__hash_file(fd, 0, of->size, of->name, bfs__hash_file_threads(1), st, NULL) == 0;
        bfs__hash_hex(XXH3_128bits_digest(st), got);
        ok = ok && strcmp(got, want) == 0;
    }
    close(fd);
    bfs__err_clear();
    return ok;
}

/* journal lines after the fingerprint: "HASH  NAME" of committed rank files */
static int bfs__outdir_resume(int dirfd, const char *journal, const bfs_plan *plan, const bool *mine, bool *reused,
                              char (*file_hex)[33])
{
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return bfs__err(BFS_ENOMEM, "out of memory");
    for (int f = 0; f < plan->nfiles; f++) {
        const bfs_outfile *of = &plan->files[f];
        char want[33] = {0}, key[512];
        if (mine && !mine[f])
            continue; /* another part's */
        snprintf(key, sizeof key, "  %s\n", of->name);
        const char *hit = strstr(journal, key);
        if (!hit || hit - journal < 32)
            continue;
        memcpy(want, hit - 32, 32);
        if (bfs__rank_file_intact(dirfd, of, want, st)) {
            reused[f] = true;
            memcpy(file_hex[f], want, 33);
        } else if (bfs__cancelled()) {
            break; /* not checked, not bad: it stays for the next run */
        } else {
            unlinkat(dirfd, of->name, 0);
        }
    }
    XXH3_freeState(st);
    if (bfs__cancelled())
        return bfs__err(BFS_EINTR, "interrupted while checking the rank files of the interrupted run");
    /* the reused files' piece hashes are recomputed from disk when the manifest is built */
    return 0;
}

int bfs__outdir_check_space(int dirfd, const char *outdir, const bfs_plan *plan, const bool *reused)
{
    /* a full disk fails here, before any work (each file is also preallocated) */
    uint64_t disk_need = 0;
    struct statvfs vfs;
    for (int f = 0; f < plan->nfiles; f++)
        if (!reused[f])
            disk_need += plan->files[f].size;
    if (fstatvfs(dirfd, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < disk_need)
        return bfs__err(BFS_EIO, "%s: disk full: %llu bytes free, the rank files need %llu (No space left on device); free space or choose another OUTDIR",
                        outdir, (unsigned long long)vfs.f_bavail * vfs.f_frsize, (unsigned long long)disk_need);
    return 0;
}

/* ---- a part of a conversion ------------------------------------------------------------ */
/* Parts of one conversion run in one OUTDIR at once, each holding the OUTDIR lock shared and
 * its own part lock (.bfshard.lock-LIST) exclusively. What another part writes is named by
 * its journal ("+ NAME") before it exists, so a name we do not know yet is looked up again. */

/* The fingerprint a manifest-format file or a journal in OUTDIR names; false when it has none. */
static bool bfs__file_fingerprint(int dirfd, const char *outdir, const char *name, char fp[33])
{
    char *text = NULL;
    bool ok = false;
    if (name[0] == '.') { /* a journal: its first line */
        ok = bfs__read_journal(dirfd, name, &text) == 0 && text && strlen(text) >= 33 && text[32] == '\n';
        if (ok)
            memcpy(fp, text, 32);
    } else { /* a manifest: its head only */
        bfs_mf *mr = NULL;
        if (bfs__mf_openat(dirfd, outdir, name, BFS_MF_HEAD_ONLY, NULL, NULL, &mr) == 0) {
            const char *f = json_string_value(json_object_get(bfs__mf_head(mr), "plan_fingerprint"));
            ok = f && strlen(f) == 32;
            if (ok)
                memcpy(fp, f, 32);
        }
        bfs__mf_free(mr);
    }
    fp[ok ? 32 : 0] = '\0';
    free(text);
    bfs__err_clear();
    return ok;
}

/* Is name ours? A miss reloads what the manifests and journals record once: another part
 * may have started (or finished) since they were read. */
static int bfs__part_is_ours(int dirfd, const char *outdir, bfs_owned *own, const char *name, bool *ours)
{
    *ours = bfs__outdir_is_ours(own, name);
    if (*ours)
        return 0;
    bfs__owned_free(own);
    const int rc = bfs__owned_load(dirfd, outdir, own);
    *ours = rc == 0 && bfs__outdir_is_ours(own, name);
    return rc;
}

/* The part with ranks `list` is running now (it holds its part lock). */
static bool bfs__part_live(int dirfd, const char *list)
{
    char nm[NAME_MAX + 1];
    if ((size_t)snprintf(nm, sizeof nm, BFS_PART_LOCK_PREFIX "%s", list) >= sizeof nm)
        return false;
    const int fd = openat(dirfd, nm, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return false;
    const bool live = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd); /* a lock we got goes with the descriptor; the file stays (its owner may come) */
    return live;
}

void bfs__outdir_remove_debris(int dirfd)
{
    const bfs_owned none = {0};
    const int dfd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0)
            close(dfd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if ((bfs__is_tmp_name(e->d_name) && bfs__outdir_is_ours(&none, e->d_name)) || bfs__is_part_lock(e->d_name))
            unlinkat(dirfd, e->d_name, 0);
    closedir(d);
}

/* Another part's file `nm` (list: its ranks) beside ours: same conversion, no shared rank. */
static int bfs__check_other_part(int dirfd, const char *outdir, const char *nm, const char *list, const char *fingerprint,
                                 bool force, const bfs_plan *plan, const bool *mine)
{
    char fp[33];
    if (!bfs__file_fingerprint(dirfd, outdir, nm, fp))
        return 0; /* a part killed while starting: debris its rerun removes */
    if (strcmp(fp, fingerprint) != 0) {
        if (bfs__part_live(dirfd, list))
            return bfs__err(BFS_EEXIST, "%s/%s: a part of another conversion (plan fingerprint %s, this one %s) is "
                            "being written now (it holds %s/" BFS_PART_LOCK_PREFIX "%s); use another OUTDIR",
                            outdir, nm, fp, fingerprint, outdir, list);
        if (force && unlinkat(dirfd, nm, 0) == 0)
            return 0;
        return bfs__err(BFS_EPARTS, "%s/%s: a part of another conversion (plan fingerprint %s, this one %s); use "
                        "another OUTDIR, or --force to remove it", outdir, nm, fp, fingerprint);
    }
    const int W = plan->world_size;
    bool *other = calloc((size_t)W, sizeof *other);
    if (!other)
        return bfs__err(BFS_ENOMEM, "out of memory");
    int rc = bfs__ranks_parse(list, W, other, nm);
    if (rc < 0) {
        bfs__err_clear();
        rc = bfs__err(BFS_EPARTS, "%s/%s: not a part of --world-size %d", outdir, nm, W);
    }
    for (int r = 0; r < W && rc == 0; r++)
        if (other[r] && mine[r])
            rc = bfs__err(BFS_EPARTS, "%s/%s: its ranks %s include rank %d of this part: every rank belongs to one "
                          "part; remove that part's files or choose other --ranks", outdir, nm, list, r);
    free(other);
    return rc;
}

/* every entry of OUTDIR: another part, another conversion, or the user's file? */
static int bfs__part_scan(DIR *d, int dirfd, const char *outdir, const char *fingerprint, bool force,
                          const bfs_plan *plan, const bool *mine, const char *jname, const char *pname, bfs_owned *own)
{
    struct dirent *e;
    char list[NAME_MAX + 1], fp[33];
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, "..") || !strcmp(nm, jname) || !strcmp(nm, pname))
            continue;
        if (bfs__part_name_list(nm, list, sizeof list)) {
            const int rc = bfs__check_other_part(dirfd, outdir, nm, list, fingerprint, force, plan, mine);
            if (rc < 0)
                return rc;
            continue;
        }
        if (!strcmp(nm, BFS_MANIFEST_NAME) || !strcmp(nm, BFS_JOURNAL_NAME)) {
            if (!bfs__file_fingerprint(dirfd, outdir, nm, fp) || strcmp(fp, fingerprint) == 0)
                continue; /* ours: merge rewrites a stale manifest */
            if (force && unlinkat(dirfd, nm, 0) == 0)
                continue;
            return bfs__err(BFS_EPARTS, "%s/%s: another conversion (plan fingerprint %s, this one %s); use another "
                            "OUTDIR, or --force to replace it", outdir, nm, fp, fingerprint);
        }
        bool ours = false;
        const int rc = bfs__part_is_ours(dirfd, outdir, own, nm, &ours);
        if (rc < 0)
            return rc;
        if (ours || force)
            continue; /* --force: the user's files stay, beside ours */
        return bfs__err(BFS_EEXIST, "%s: holds %s, which is not bfshard's (no manifest or journal of bfshard records "
                        "it); use --force to write beside it (it is left alone)", outdir, nm);
    }
    return 0;
}

/* After our journal is in OUTDIR: every other part's journal or manifest again. Two parts
 * started together each scan before the other's journal is there; each publishes its own,
 * then looks again, so at least one of them sees the other (both may: then both stop). The
 * one that stops removes the journal it just wrote (fresh: it wrote no rank file yet), so
 * it leaves nothing that would refuse the other's later runs. */
static int bfs__part_recheck(int dirfd, const char *outdir, const char *fingerprint, const bfs_plan *plan,
                             const bool *mine, const char *jname, const char *pname, bool fresh)
{
    int rc = 0;
    char list[NAME_MAX + 1];
    const int dfd = dup(dirfd);
    DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
    if (!d) {
        const int en = errno;
        if (dfd >= 0)
            close(dfd);
        return bfs__errno(BFS_EIO, en, "%s: cannot list output directory", outdir);
    }
    rewinddir(d);
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL)
        if (strcmp(e->d_name, jname) && strcmp(e->d_name, pname) && bfs__part_name_list(e->d_name, list, sizeof list))
            rc = bfs__check_other_part(dirfd, outdir, e->d_name, list, fingerprint, false, plan, mine);
    closedir(d);
    if (rc < 0 && fresh && unlinkat(dirfd, jname, 0) == 0)
        (void)bfs__dir_sync(dirfd, outdir);
    return rc;
}

/* our own files only: temporaries always, rank files and their copies unless resuming;
 * a name no manifest or journal of bfshard records is never removed */
static void bfs__part_remove_own(int dirfd, const bfs_plan *plan, const bool *mine, bool resume, const char *pname,
                                 const bfs_owned *own)
{
    static const char *const sfx[] = {"", ".zst", ".bfz"};
    char nm[NAME_MAX + 32];
    for (int f = 0; f < plan->nfiles; f++) {
        if (!mine[f])
            continue;
        for (size_t k = 0; k < sizeof sfx / sizeof *sfx; k++) {
            snprintf(nm, sizeof nm, BFS_TMP_PREFIX "%s%s" BFS_TMP_SUFFIX, plan->files[f].name, sfx[k]);
            if (bfs__outdir_is_ours(own, nm))
                unlinkat(dirfd, nm, 0);
            snprintf(nm, sizeof nm, "%s%s", plan->files[f].name, sfx[k]);
            if ((!resume || k > 0) && bfs__outdir_is_ours(own, nm)) /* a copy is rewritten from the reused file */
                unlinkat(dirfd, nm, 0);
        }
    }
    if (bfs__outdir_is_ours(own, pname))
        unlinkat(dirfd, pname, 0);
}

/* bfs__outdir_prepare (pname NULL: mine NULL, jname the run's journal) and
 * bfs__outdir_prepare_part */
static int bfs__prepare(const char *outdir, const char *fingerprint, bool force, const bfs_plan *plan,
                        const bool *mine, const char *jname, const char *pname, const char *const *outputs,
                        size_t nout, int *dirfd, bool *reused, char (*file_hex)[33])
{
    int rc = 0;
    DIR *d = NULL;
    char *journal = NULL;
    bfs_owned own = {0};
    BFS_TRY(bfs__outdir_open(outdir, dirfd));
    BFS_TRY(bfs__read_journal(*dirfd, jname, &journal));
    const bool resume = pname ? journal && strlen(journal) >= 33 && journal[32] == '\n' && !strncmp(journal, fingerprint, 32) && !force
                              : journal && strncmp(journal, fingerprint, 32) == 0 && !force;
    BFS_TRY(bfs__owned_load(*dirfd, outdir, &own));
    /* an output that would replace a file bfshard did not write: refused, --force or not */
    for (size_t i = 0; i < nout; i++) {
        struct stat sb;
        bool ours = false;
        if (pname && fstatat(*dirfd, outputs[i], &sb, AT_SYMLINK_NOFOLLOW) == 0)
            BFS_TRY(bfs__part_is_ours(*dirfd, outdir, &own, outputs[i], &ours));
        if (!ours)
            BFS_TRY(bfs__outdir_check_foreign(*dirfd, outdir, &own, outputs[i]));
    }
    const int dfd = dup(*dirfd);
    d = dfd < 0 ? NULL : fdopendir(dfd);
    if (!d) {
        const int en = errno;
        if (dfd >= 0)
            close(dfd);
        rc = bfs__errno(BFS_EIO, en, "%s: cannot list output directory", outdir);
        goto cleanup;
    }
    rewinddir(d); /* the dup shares *dirfd's read position */
    if (pname) {
        BFS_TRY(bfs__part_scan(d, *dirfd, outdir, fingerprint, force, plan, mine, jname, pname, &own));
        bfs__part_remove_own(*dirfd, plan, mine, resume, pname, &own);
    } else {
        BFS_TRY(bfs__outdir_clean(d, *dirfd, outdir, journal, &own, resume, force));
    }
    if (pname)
        bfs__test_signal("part-scan"); /* between the scan and the journal (tests: two parts at once) */
    if (resume)
        BFS_TRY(bfs__outdir_resume(*dirfd, journal, plan, mine, reused, file_hex));
    else
        BFS_TRY(bfs__journal_start(*dirfd, outdir, jname, fingerprint, outputs, nout));
    if (pname)
        BFS_TRY(bfs__part_recheck(*dirfd, outdir, fingerprint, plan, mine, jname, pname, !resume));
cleanup:
    if (d)
        closedir(d);
    free(journal);
    bfs__owned_free(&own);
    return rc;
}

int bfs__outdir_prepare(const char *outdir, const char *fingerprint, bool force, const bfs_plan *plan,
                        const char *const *outputs, size_t nout, int *dirfd, bool *reused, char (*file_hex)[33])
{
    return bfs__prepare(outdir, fingerprint, force, plan, NULL, BFS_JOURNAL_NAME, NULL, outputs, nout, dirfd,
                        reused, file_hex);
}

int bfs__outdir_prepare_part(const char *outdir, const char *fingerprint, bool force, const bfs_plan *plan,
                             const bool *mine, const char *jname, const char *pname, const char *const *outputs,
                             size_t nout, int *dirfd, bool *reused, char (*file_hex)[33])
{
    return bfs__prepare(outdir, fingerprint, force, plan, mine, jname, pname, outputs, nout, dirfd, reused,
                        file_hex);
}

bool bfs__outdir_part_done(const char *outdir, const char *fingerprint, const char *pname, const char *jname)
{
    char fp[33];
    bool done = false;
    const int dirfd = open(outdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        return false;
    if (bfs__file_fingerprint(dirfd, outdir, BFS_MANIFEST_NAME, fp) && !strcmp(fp, fingerprint))
        done = bfs__outdir_already_done(outdir, fingerprint);
    else if (bfs__file_fingerprint(dirfd, outdir, pname, fp) && !strcmp(fp, fingerprint))
        done = bfs__check_part(outdir, pname, NULL, NULL) == 0;
    bfs__err_clear();
    if (done)
        unlinkat(dirfd, jname, 0); /* a part killed between its manifest and removing its journal */
    close(dirfd);
    return done;
}
