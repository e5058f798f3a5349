/* Durable commits (see durable.h): temp name, fdatasync, rename, fsync the directory. */
#include "base/base.h"
#include "base/bfs_io.h"
#include "output/durable.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void bfs__tmp_reset(bfs_tmpfile *t)
{
    memset(t, 0, sizeof *t);
    t->fd = -1;
    t->dirfd = -1;
}

static int bfs__tmp_open_tag(bfs_tmpfile *t, int dirfd, const char *dirpath, const char *name, const char *tag);

int bfs__tmp_open(bfs_tmpfile *t, int dirfd, const char *dirpath, const char *name)
{
    return bfs__tmp_open_tag(t, dirfd, dirpath, name, "");
}

static int bfs__tmp_open_tag(bfs_tmpfile *t, int dirfd, const char *dirpath, const char *name, const char *tag)
{
    bfs__tmp_reset(t);
    const size_t nlen = strlen(name);
    if (nlen == 0 || nlen > NAME_MAX || strchr(name, '/'))
        return bfs__err(BFS_EUSAGE, "%s/%s: not a file name", dirpath, name);
    snprintf(t->dir, sizeof t->dir, "%s", dirpath);
    memcpy(t->name, name, nlen + 1);
    if (dirfd < 0) {
        dirfd = open(dirpath, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dirfd < 0)
            return bfs__errno(BFS_EIO, errno, "%s: cannot open directory", dirpath);
        t->own_dir = true;
    }
    t->dirfd = dirfd;
    snprintf(t->tmp, sizeof t->tmp, BFS_TMP_PREFIX "%s%s" BFS_TMP_SUFFIX, name, tag);
    /* ".NAME[TAG].partial" is ours: whatever a killed run (or anyone) left under it goes, so
     * the open below never follows a symlink, never blocks on a FIFO, never appends to junk.
     * Removing it first is safe only because no other live process writes that exact name:
     * a file several parts write at once carries this process's tag (write_durable_shared);
     * any other name has one writer (a rank file belongs to one part, the OUTDIR lock). */
    unlinkat(dirfd, t->tmp, 0);
    t->fd = openat(dirfd, t->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    struct stat sb;
    if (t->fd < 0 || fstat(t->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        const int e = t->fd < 0 ? errno : EINVAL;
        if (t->fd >= 0)
            close(t->fd);
        t->fd = -1;
        t->tmp[0] = '\0';
        bfs__tmp_abort(t);
        return bfs__errno(BFS_EIO, e, "%s/" BFS_TMP_PREFIX "%s%s" BFS_TMP_SUFFIX ": cannot create", dirpath, name, tag);
    }
    bfs__test_signal("tmp");
    return 0;
}

int bfs__tmp_open_path(bfs_tmpfile *t, const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return bfs__tmp_open(t, -1, ".", path);
    char dir[PATH_MAX];
    const size_t dlen = slash == path ? 1 : (size_t)(slash - path);
    if (dlen >= sizeof dir)
        return bfs__err(BFS_EUSAGE, "%s: path too long", path);
    memcpy(dir, path, dlen);
    dir[dlen] = '\0';
    return bfs__tmp_open(t, -1, dir, slash + 1);
}

int bfs__dir_sync(int dirfd, const char *dirpath)
{
    if (fsync(dirfd) != 0 && errno != EINVAL && errno != EROFS) /* EINVAL: fs without dir fsync */
        return bfs__errno(BFS_EIO, errno, "%s: fsync of the directory failed", dirpath);
    return 0;
}

int bfs__tmp_commit(bfs_tmpfile *t)
{
    int rc = 0;
    if (t->fd < 0 || !t->tmp[0])
        BFS_FAIL(BFS_EINTERNAL, "%s/%s: commit of a file that is not open", t->dir, t->name);
    if (bfs__cancelled())
        BFS_FAIL(BFS_EINTR, "interrupted: %s/%s was not written", t->dir, t->name);
    if (fdatasync(t->fd) != 0)
        BFS_FAIL(BFS_EIO, "%s/%s: fdatasync failed: %s", t->dir, t->tmp, strerror(errno));
    const int fd = t->fd;
    t->fd = -1;
    if (close(fd) != 0)
        BFS_FAIL(BFS_EIO, "%s/%s: close failed: %s", t->dir, t->tmp, strerror(errno));
    if (renameat(t->dirfd, t->tmp, t->dirfd, t->name) != 0)
        BFS_FAIL(BFS_EIO, "%s/%s: cannot rename to %s: %s", t->dir, t->tmp, t->name, strerror(errno));
    t->tmp[0] = '\0';
    BFS_TRY(bfs__dir_sync(t->dirfd, t->dir));
cleanup:
    bfs__tmp_abort(t);
    return rc;
}

void bfs__tmp_abort(bfs_tmpfile *t)
{
    if (t->fd >= 0)
        close(t->fd);
    t->fd = -1;
    if (t->tmp[0] && t->dirfd >= 0)
        unlinkat(t->dirfd, t->tmp, 0);
    t->tmp[0] = '\0';
    if (t->own_dir && t->dirfd >= 0)
        close(t->dirfd);
    t->own_dir = false;
    t->dirfd = -1;
}

int bfs__write_durable(int dirfd, const char *dirpath, const char *name, const void *data, size_t len)
{
    return bfs__write_durable_shared(dirfd, dirpath, name, data, len, false);
}

int bfs__write_durable_shared(int dirfd, const char *dirpath, const char *name, const void *data, size_t len, bool shared)
{
    bfs_tmpfile t;
    char tag[32] = "";
    if (shared)
        snprintf(tag, sizeof tag, ".%ld", (long)getpid());
    int rc = bfs__tmp_open_tag(&t, dirfd, dirpath, name, tag);
    if (rc < 0)
        return rc;
    char what[PATH_MAX + NAME_MAX + 32];
    snprintf(what, sizeof what, "%s/%s", t.dir, t.tmp);
    rc = bfs__pwrite_all(t.fd, data, len, 0, what);
    if (rc == 0)
        return bfs__tmp_commit(&t);
    bfs__tmp_abort(&t);
    return rc;
}

int bfs__link_durable(int srcdirfd, const char *srcname, dev_t dev, ino_t ino, int dirfd, const char *dirpath,
                      const char *name)
{
    char tmp[NAME_MAX + 16];
    struct stat sb;
    if (strlen(name) > NAME_MAX - strlen(BFS_TMP_PREFIX BFS_TMP_SUFFIX) || strchr(name, '/'))
        return bfs__err(BFS_EUSAGE, "%s/%s: not a file name", dirpath, name);
    snprintf(tmp, sizeof tmp, BFS_TMP_PREFIX "%s" BFS_TMP_SUFFIX, name);
    unlinkat(dirfd, tmp, 0); /* ours (see bfs__tmp_open_tag) */
    if (linkat(srcdirfd, srcname, dirfd, tmp, 0) != 0) { /* 0: a symlink itself, never its target */
        const int e = errno;
        if (e == EXDEV || e == EPERM || e == EMLINK || e == ENOTSUP || e == EOPNOTSUPP || e == EACCES)
            return 1;
        return bfs__errno(BFS_EIO, e, "%s/%s: cannot hard-link %s", dirpath, tmp, srcname);
    }
    if (fstatat(dirfd, tmp, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode) || sb.st_dev != dev ||
        sb.st_ino != ino) { /* srcname was replaced since the caller checked it */
        unlinkat(dirfd, tmp, 0);
        return bfs__err(BFS_EVERIFY, "%s: changed while it was being packed (not the file that was checked)", srcname);
    }
    if (bfs__cancelled()) {
        unlinkat(dirfd, tmp, 0);
        return bfs__err(BFS_EINTR, "interrupted: %s/%s was not written", dirpath, name);
    }
    if (renameat(dirfd, tmp, dirfd, name) != 0) {
        const int e = errno;
        unlinkat(dirfd, tmp, 0);
        return bfs__errno(BFS_EIO, e, "%s/%s: cannot rename to %s", dirpath, tmp, name);
    }
    /* rename() of two links to one inode does nothing and succeeds: the temporary stays */
    if (fstatat(dirfd, tmp, &sb, AT_SYMLINK_NOFOLLOW) == 0)
        unlinkat(dirfd, tmp, 0);
    return bfs__dir_sync(dirfd, dirpath);
}

bool bfs__is_tmp_name(const char *name)
{
    const size_t n = strlen(name), p = strlen(BFS_TMP_PREFIX), s = strlen(BFS_TMP_SUFFIX);
    return n > p + s && !strncmp(name, BFS_TMP_PREFIX, p) && !strcmp(name + n - s, BFS_TMP_SUFFIX);
}

void bfs__test_signal(const char *point)
{
    static _Atomic int seen;
    const char *v = getenv("BFSHARD_TEST_SIGNAL");
    const size_t n = strlen(point);
    if (!v || strncmp(v, point, n) != 0 || v[n] != ':')
        return;
    char *end = NULL;
    const long sig = strtol(v + n + 1, &end, 10);
    const long nth = end && *end == ':' ? strtol(end + 1, NULL, 10) : 1;
    if (++seen == nth)
        raise((int)sig);
}
