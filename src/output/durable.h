/* Durable commits: every file bfshard writes is written under a temporary name
 * (".NAME.partial" beside it), fdatasync'ed, renamed to NAME, and the directory is
 * fsync'ed, so a crash leaves either the old state or the complete new file under a
 * final name — never a partial one. This file and durable.c own that rule; nothing
 * else in src/ calls rename(). */
#ifndef BFS_DURABLE_H
#define BFS_DURABLE_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define BFS_TMP_PREFIX "."
#define BFS_TMP_SUFFIX ".partial"

typedef struct bfs_tmpfile {
    int fd;              /* open for writing while the file is in progress, else -1 */
    int dirfd;           /* directory of the file (owned when own_dir) */
    bool own_dir;
    char dir[PATH_MAX];  /* the directory as given, for messages */
    char name[NAME_MAX + 1];
    char tmp[NAME_MAX + 16]; /* ".NAME.partial"; empty when nothing is left to remove */
} bfs_tmpfile;

/* Start NAME in the directory dirfd (dirpath names it in messages). dirfd < 0:
 * open dirpath. A stale temporary of that name (ours: any type, a FIFO or a symlink
 * included) is removed, then it is created O_EXCL | O_NOFOLLOW | O_NONBLOCK, mode 0644,
 * and checked to be a regular file. */
int bfs__tmp_open(bfs_tmpfile *t, int dirfd, const char *dirpath, const char *name);
/* The same for a path "DIR/NAME" or "NAME". */
int bfs__tmp_open_path(bfs_tmpfile *t, const char *path);
/* fdatasync, close, rename to the final name, fsync the directory. On failure the
 * temporary is removed. The final name is replaced when it exists. After bfs_cancel()
 * nothing is committed: the temporary goes and BFS_EINTR is returned. */
int bfs__tmp_commit(bfs_tmpfile *t);
/* Close and remove the temporary (nothing when committed or never opened). Always
 * safe to call; releases the directory handle when owned. */
void bfs__tmp_abort(bfs_tmpfile *t);
/* Write len bytes of data as NAME in the directory, durably (the three calls above). */
int bfs__write_durable(int dirfd, const char *dirpath, const char *name, const void *data, size_t len);
/* The same, for a file several processes may write at once with the same bytes (the parts
 * of one conversion in a shared OUTDIR): shared gives the temporary this process's own name. */
int bfs__write_durable_shared(int dirfd, const char *dirpath, const char *name, const void *data, size_t len, bool shared);
/* Hard-link srcname (in srcdirfd) as NAME in dirfd, durably (bfshard pack's
 * blobs): linked as ".NAME.partial" (a stale one removed), checked to be the regular file
 * (dev, ino) the caller checked, renamed to NAME (replaced when it exists), the directory
 * fsync'ed. Returns 1, with nothing left behind, when the file system refuses the link
 * (another device, no hard links there, too many links): the caller copies instead. */
int bfs__link_durable(int srcdirfd, const char *srcname, dev_t dev, ino_t ino, int dirfd, const char *dirpath,
                      const char *name);
/* fsync a directory (after renames or unlinks in it). */
int bfs__dir_sync(int dirfd, const char *dirpath);
/* true when name is one of our temporaries (".X.partial"). */
bool bfs__is_tmp_name(const char *name);
/* Test hook: when $BFSHARD_TEST_SIGNAL is "POINT:SIGNUM[:N]" (points: "tmp" = a
 * temporary was just created, "hash" = verify is about to hash a file, "part-scan" = a
 * part scanned OUTDIR and is about to write its journal), raise SIGNUM the
 * Nth time (default 1st) POINT is reached: a signal at a known place, with no timing. */
void bfs__test_signal(const char *point);

#endif
