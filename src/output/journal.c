/*
 * The journal of a run in OUTDIR (outdir.h): .bfshard-inprogress (a part's:
 * .bfshard-inprogress-RANKS; compress's: its own), the plan fingerprint, then "HASH  NAME"
 * of every committed rank file, appended and fsync'ed after each commit. Read by resume
 * (outdir.c) and by the ownership check (outdir_own.c); started by outdir.c.
 */
#include "output/outdir.h"
#include "base/bfs_io.h"
#include "output/durable.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int bfs__read_journal(int dirfd, const char *name, char **text)
{
    *text = NULL;
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > (16 << 20)) {
        close(fd);
        return 0;
    }
    char *t = malloc((size_t)sb.st_size + 1);
    if (!t) {
        close(fd);
        return bfs__err(BFS_ENOMEM, "out of memory");
    }
    const int rc = bfs__pread_all(fd, t, (size_t)sb.st_size, 0, name);
    close(fd);
    if (rc < 0) {
        free(t);
        return 0;
    }
    t[sb.st_size] = '\0';
    *text = t;
    return 0;
}

int bfs__journal_append(int dirfd, const char *outdir, const char *name, const char *line)
{
    int fd = openat(dirfd, name, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0)
        return bfs__errno(BFS_EIO, errno, "%s/%s: cannot open", outdir, name);
    struct stat sb;
    const size_t n = strlen(line);
    const ssize_t k = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? write(fd, line, n) : (errno = EINVAL, -1);
    const int e = errno;
    if (k != (ssize_t)n || fdatasync(fd) != 0) {
        close(fd);
        return bfs__errno(BFS_EIO, k < 0 ? e : ENOSPC, "%s/%s: cannot write", outdir, name);
    }
    close(fd);
    return 0;
}

int bfs__outdir_journal_add(int dirfd, const char *outdir, const char *jname, const char *hex, const char *name)
{
    char line[600];
    snprintf(line, sizeof line, "%s  %s\n", hex, name);
    return bfs__journal_append(dirfd, outdir, jname, line);
}

void bfs__outdir_journal_remove(int dirfd, const char *jname)
{
    unlinkat(dirfd, jname, 0);
    fsync(dirfd);
}

