/*
 * OUTDIR's ownership and its lock (see outdir.h): which files of OUTDIR bfshard wrote
 * (the names its manifests and journals record, its hidden files, the temporaries of
 * names it writes), refusing a file that is not ours, and the flock on .bfshard.lock (a
 * whole run's exclusive one; a part's shared one and its own part lock).
 */
#include "output/outdir.h"
#include "base/bfs_io.h"
#include "output/durable.h"
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
#include <time.h>
#include <unistd.h>

const char *const bfs__aux_files[] = {
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt", "generation_config.json",
    "chat_template.jinja", "chat_template.json", "preprocessor_config.json", "processor_config.json",
    "spiece.model", "tokenizer.tiktoken",
};
const size_t bfs__naux = sizeof bfs__aux_files / sizeof *bfs__aux_files;

/* name ends with sfx and has something before it */
static bool bfs__has_suffix(const char *name, const char *sfx)
{
    const size_t n = strlen(name), k = strlen(sfx);
    return n > k && strcmp(name + n - k, sfx) == 0;
}

/* A name bfshard could write (the X of a temporary ".X.partial" that is ours to remove). */
static bool bfs__ourish(const char *name)
{
    if (bfs__has_suffix(name, ".safetensors") || bfs__has_suffix(name, ".safetensors.zst") ||
        bfs__has_suffix(name, ".safetensors.bfz"))
        return true;
    if (!strcmp(name, BFS_MANIFEST_NAME) || !strcmp(name, BFS_SUMS_NAME) || !strcmp(name, BFS_SHA256SUMS_NAME) ||
        !strcmp(name, "config.json") ||
        !strcmp(name, "model.safetensors.index.json"))
        return true;
    for (size_t i = 0; i < bfs__naux; i++)
        if (!strcmp(name, bfs__aux_files[i]))
            return true;
    return false;
}

/* a part's lock ".bfshard.lock-LIST" */
bool bfs__is_part_lock(const char *name)
{
    const size_t p = strlen(BFS_PART_LOCK_PREFIX), n = strlen(name);
    return n > p && !strncmp(name, BFS_PART_LOCK_PREFIX, p) && strspn(name + p, "0123456789-,") == n - p;
}

/* bfshard's own hidden files: the locks and the journals (a part's too) */
static bool bfs__is_reserved(const char *name)
{
    char list[NAME_MAX + 1];
    if (!strcmp(name, BFS_LOCK_NAME) || !strcmp(name, BFS_JOURNAL_NAME) || !strcmp(name, BFS_ZJOURNAL_NAME) ||
        bfs__is_part_lock(name))
        return true;
    return name[0] == '.' && bfs__part_name_list(name, list, sizeof list);
}

/* ---- which files of OUTDIR are ours ------------------------------------------------------ */
static bool bfs__plain_name(const char *nm, size_t n)
{
    return n > 0 && n <= NAME_MAX && nm[0] != '.' && !memchr(nm, '/', n) && !memchr(nm, '\0', n);
}

static int bfs__owned_add(bfs_owned *o, const char *nm, size_t n)
{
    if (!bfs__plain_name(nm, n) || bfs__owned_has(o, nm, n))
        return 0;
    if (o->n == o->cap) {
        const size_t cap = o->cap ? 2 * o->cap : 64;
        char **v = realloc(o->names, cap * sizeof *v);
        if (!v)
            return bfs__err(BFS_ENOMEM, "out of memory");
        o->names = v;
        o->cap = cap;
    }
    char *c = malloc(n + 1);
    if (!c)
        return bfs__err(BFS_ENOMEM, "out of memory");
    memcpy(c, nm, n);
    c[n] = '\0';
    o->names[o->n++] = c;
    return 0;
}

bool bfs__owned_has(const bfs_owned *o, const char *nm, size_t n)
{
    for (size_t i = 0; i < o->n; i++)
        if (strlen(o->names[i]) == n && !memcmp(o->names[i], nm, n))
            return true;
    return false;
}

void bfs__owned_free(bfs_owned *o)
{
    for (size_t i = 0; i < o->n; i++)
        free(o->names[i]);
    free(o->names);
    memset(o, 0, sizeof *o);
}

/* names in a journal: "HASH  NAME" (a committed rank file) and "+ NAME" (an output the run
 * was about to write); only complete lines count */
static int bfs__owned_journal(bfs_owned *o, const char *text)
{
    for (const char *l = text; l && *l;) {
        const char *nl = strchr(l, '\n');
        if (!nl)
            break;
        const size_t ll = (size_t)(nl - l);
        int rc = 0;
        if (ll > 2 && l[0] == '+' && l[1] == ' ')
            rc = bfs__owned_add(o, l + 2, ll - 2);
        else if (ll > 34 && l[32] == ' ' && l[33] == ' ')
            rc = bfs__owned_add(o, l + 34, ll - 34);
        if (rc < 0)
            return rc;
        l = nl + 1;
    }
    return 0;
}


/* a bfshard manifest (OUTDIR's, or a part's named mname): its files, their compressed
 * copies, itself and (OUTDIR's) the sums file; nothing when it is not one */
static int bfs__owned_manifest(bfs_owned *o, const char *outdir, const char *mname)
{
    int rc = 0;
    bfs_mf *mr = NULL;
    /* the head only: files[] (tensors[] is scanned, not parsed) */
    if (bfs__mf_open(outdir, mname, BFS_MF_HEAD_ONLY, NULL, NULL, &mr) == 0 &&
        json_is_array(json_object_get(bfs__mf_head(mr), "files"))) {
        const json_t *files = json_object_get(bfs__mf_head(mr), "files");
        BFS_TRY(bfs__owned_add(o, mname, strlen(mname)));
        if (!strcmp(mname, BFS_MANIFEST_NAME))
            BFS_TRY(bfs__owned_add(o, BFS_SUMS_NAME, strlen(BFS_SUMS_NAME)));
        /* sha256sums.txt only when this manifest wrote one: else a file of that name is the user's */
        if (!strcmp(mname, BFS_MANIFEST_NAME) && bfs__manifest_has_sha256(files))
            BFS_TRY(bfs__owned_add(o, BFS_SHA256SUMS_NAME, strlen(BFS_SHA256SUMS_NAME)));
        for (size_t i = 0; i < json_array_size(files); i++) {
            const json_t *f = json_array_get(files, i);
            const char *nm = json_string_value(json_object_get(f, "name"));
            const char *zn = json_string_value(json_object_get(json_object_get(f, "zst"), "name"));
            if (nm)
                BFS_TRY(bfs__owned_add(o, nm, strlen(nm)));
            if (zn)
                BFS_TRY(bfs__owned_add(o, zn, strlen(zn)));
        }
    }
    bfs__err_clear();
cleanup:
    bfs__mf_free(mr);
    return rc;
}

static int bfs__owned_journal_file(bfs_owned *o, int dirfd, const char *jname)
{
    char *jt = NULL;
    int rc = bfs__read_journal(dirfd, jname, &jt);
    if (rc == 0)
        rc = bfs__owned_journal(o, jt);
    free(jt);
    return rc;
}

int bfs__owned_load(int dirfd, const char *outdir, bfs_owned *o)
{
    int rc = 0;
    DIR *d = NULL;
    char list[NAME_MAX + 1];
    memset(o, 0, sizeof *o);
    BFS_TRY(bfs__owned_manifest(o, outdir, BFS_MANIFEST_NAME));
    BFS_TRY(bfs__owned_journal_file(o, dirfd, BFS_JOURNAL_NAME));
    BFS_TRY(bfs__owned_journal_file(o, dirfd, BFS_ZJOURNAL_NAME));
    /* the parts of a conversion: their manifests and journals */
    /* a descriptor of its own: a dup() would share (and move) dirfd's read position */
    const int dfd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || !(d = fdopendir(dfd))) {
        const int en = errno;
        if (dfd >= 0)
            close(dfd);
        rc = bfs__errno(BFS_EIO, en, "%s: cannot list output directory", outdir);
        goto cleanup;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!bfs__part_name_list(e->d_name, list, sizeof list))
            continue;
        if (e->d_name[0] == '.')
            BFS_TRY(bfs__owned_journal_file(o, dirfd, e->d_name));
        else
            BFS_TRY(bfs__owned_manifest(o, outdir, e->d_name));
    }
cleanup:
    if (d)
        closedir(d);
    if (rc < 0)
        bfs__owned_free(o);
    return rc;
}

bool bfs__outdir_is_ours(const bfs_owned *o, const char *name)
{
    const size_t n = strlen(name), p = strlen(BFS_TMP_PREFIX), sl = strlen(BFS_TMP_SUFFIX);
    if (bfs__is_reserved(name))
        return true;
    if (bfs__is_tmp_name(name)) {
        /* ".X.partial": ours when X is a name bfshard writes */
        char x[NAME_MAX + 1];
        const size_t xl = n - p - sl;
        if (xl > NAME_MAX)
            return false;
        memcpy(x, name + p, xl);
        x[xl] = '\0';
        if (bfs__ourish(x) || bfs__owned_has(o, x, xl))
            return true;
        /* ".X.PID.partial": a file several parts write, with the writer's tag */
        char *dot = strrchr(x, '.');
        if (!dot || dot == x || !dot[1] || strspn(dot + 1, "0123456789") != strlen(dot + 1))
            return false;
        *dot = '\0';
        return bfs__ourish(x) || bfs__owned_has(o, x, (size_t)(dot - x));
    }
    return bfs__owned_has(o, name, n);
}

int bfs__outdir_check_foreign(int dirfd, const char *outdir, const bfs_owned *o, const char *name)
{
    struct stat sb;
    if (fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || bfs__outdir_is_ours(o, name))
        return 0;
    return bfs__err(BFS_EEXIST, "%s/%s: exists and was not written by bfshard (no manifest or journal of bfshard records it); bfshard never replaces such a file, --force included: move it away",
                    outdir, name);
}

/* ---- the lock --------------------------------------------------------------------------------- */
/* flock OUTDIR/name (op: LOCK_EX or LOCK_SH) on the file that is there: a holder removes it
 * as it finishes (while holding it exclusively), so a lock on a file no longer there is
 * retried. A shared lock is also retried for a moment when refused: a finishing part holds
 * it exclusively just long enough to remove it. */
static int bfs__lock_file(int dirfd, const char *outdir, const char *name, int op, int *fdp)
{
    int rc = 0, fd = -1, busy = 0;
    struct stat sl, sp;
    for (int tries = 0;; tries++) {
        fd = openat(dirfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
        if (fd < 0 || fstat(fd, &sl) != 0 || !S_ISREG(sl.st_mode))
            BFS_FAIL(BFS_EIO, "%s/%s: cannot open the lock file: %s", outdir, name,
                     fd < 0 ? strerror(errno) : "not a regular file");
        if (flock(fd, op | LOCK_NB) != 0) {
            const int e = errno;
            if (e == EWOULDBLOCK && op == LOCK_SH && busy++ < 40) {
                close(fd);
                fd = -1;
                nanosleep(&(struct timespec){.tv_nsec = 25 * 1000 * 1000}, NULL);
                continue;
            }
            char pid[32] = {0};
            const ssize_t k = pread(fd, pid, sizeof pid - 1, 0);
            for (ssize_t i = 0; i < k; i++)
                if (pid[i] < '0' || pid[i] > '9')
                    pid[i] = '\0';
            if (e == EWOULDBLOCK)
                BFS_FAIL(BFS_EEXIST, "%s: another bfshard (pid %s) is writing to it (it holds %s/%s); wait for it to finish",
                         outdir, pid[0] ? pid : "unknown", outdir, name);
            BFS_FAIL(BFS_EIO, "%s/%s: cannot lock: %s", outdir, name, strerror(e));
        }
        /* the holder before us may have removed the file as it finished: lock the one that is there */
        if (fstatat(dirfd, name, &sp, AT_SYMLINK_NOFOLLOW) == 0 && sp.st_dev == sl.st_dev && sp.st_ino == sl.st_ino)
            break;
        close(fd);
        fd = -1;
        if (tries > 100)
            BFS_FAIL(BFS_EIO, "%s/%s: the lock file keeps being replaced", outdir, name);
    }
    /* the pid is for the message of the next one (best effort: a full disk or a file-size
     * limit fails the run where it writes its outputs, with that file's name); shared
     * holders: the first one's */
    char line[32];
    const int n = snprintf(line, sizeof line, "%ld\n", (long)getpid());
    if (op == LOCK_EX ? ftruncate(fd, 0) == 0 : fstat(fd, &sl) == 0 && sl.st_size == 0)
        if (pwrite(fd, line, (size_t)n, 0) != n && ftruncate(fd, 0) != 0) { /* nothing more to do */ }
    *fdp = fd;
    fd = -1;
cleanup:
    if (fd >= 0) /* the lock file is not ours to remove: another run may hold it */
        close(fd);
    return rc;
}

static int bfs__lock_dir(const char *outdir, bool create, bfs_outdir_lock *lk)
{
    struct stat sb;
    lk->fd = lk->dirfd = lk->pfd = -1;
    lk->created = false;
    if (create) {
        if (mkdir(outdir, 0755) == 0)
            lk->created = true;
        else if (errno != EEXIST)
            return bfs__errno(errno == ENOSPC || errno == EROFS ? BFS_EIO : BFS_EUSAGE, errno, "%s: cannot create output directory", outdir);
    }
    if (stat(outdir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return bfs__err(create ? BFS_EUSAGE : BFS_EINPUT, "%s: %s", outdir,
                        errno == ENOENT ? "no such directory" : "exists and is not a directory");
    lk->dirfd = open(outdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lk->dirfd < 0)
        return bfs__errno(BFS_EIO, errno, "%s: cannot open directory", outdir);
    return 0;
}

int bfs__outdir_lock(const char *outdir, bool create, bfs_outdir_lock *lk)
{
    int rc = 0;
    lk->part = false;
    BFS_TRY(bfs__lock_dir(outdir, create, lk));
    BFS_TRY(bfs__lock_file(lk->dirfd, outdir, BFS_LOCK_NAME, LOCK_EX, &lk->fd));
cleanup:
    if (rc < 0 && lk->dirfd >= 0) {
        close(lk->dirfd);
        lk->dirfd = -1;
    }
    return rc;
}

int bfs__outdir_lock_part(const char *outdir, bool create, const char *list, bfs_outdir_lock *lk)
{
    int rc = 0;
    lk->part = true;
    BFS_TRY(bfs__lock_dir(outdir, create, lk));
    if ((size_t)snprintf(lk->pname, sizeof lk->pname, BFS_PART_LOCK_PREFIX "%s", list) >= sizeof lk->pname)
        BFS_FAIL(BFS_EUSAGE, "--ranks %s: the list is too long to name its part's files; give fewer ranges", list);
    /* shared with the other parts; a whole run, merge and compress take it exclusively */
    BFS_TRY(bfs__lock_file(lk->dirfd, outdir, BFS_LOCK_NAME, LOCK_SH, &lk->fd));
    /* one process per part */
    BFS_TRY(bfs__lock_file(lk->dirfd, outdir, lk->pname, LOCK_EX, &lk->pfd));
cleanup:
    if (rc < 0) {
        if (lk->fd >= 0)
            close(lk->fd);
        if (lk->dirfd >= 0)
            close(lk->dirfd);
        lk->fd = lk->dirfd = lk->pfd = -1;
    }
    return rc;
}

void bfs__outdir_unlock(bfs_outdir_lock *lk, const char *outdir, bool failed)
{
    const bool held = lk->fd >= 0;
    if (lk->part && lk->pfd >= 0) {
        unlinkat(lk->dirfd, lk->pname, 0); /* while we hold it: see bfs__lock_file */
        close(lk->pfd);
    }
    if (held) {
        /* a part's lock is shared: only the last holder (the one that gets it exclusively)
         * removes it, the others still hold this file */
        if (!lk->part || flock(lk->fd, LOCK_EX | LOCK_NB) == 0)
            unlinkat(lk->dirfd, BFS_LOCK_NAME, 0);
        close(lk->fd);
    }
    if (lk->dirfd >= 0)
        close(lk->dirfd);
    /* a failed run leaves no empty directory it created */
    if (failed && lk->created && held)
        rmdir(outdir);
    lk->fd = lk->dirfd = -1;
    if (lk->part)
        lk->pfd = -1;
    lk->created = false;
}
