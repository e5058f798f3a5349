/* Small utilities: dtypes, strings, paths, sizes. */
#include "base/base.h"

#include <jansson.h>

#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct {
    const char *name;
    size_t size;
} bfs__dtypes[BFS_DT_COUNT] = {
    [BFS_DT_BOOL] = {"BOOL", 1}, [BFS_DT_U8] = {"U8", 1},     [BFS_DT_I8] = {"I8", 1},
    [BFS_DT_U16] = {"U16", 2},   [BFS_DT_I16] = {"I16", 2},   [BFS_DT_F16] = {"F16", 2},
    [BFS_DT_BF16] = {"BF16", 2}, [BFS_DT_U32] = {"U32", 4},   [BFS_DT_I32] = {"I32", 4},
    [BFS_DT_F32] = {"F32", 4},   [BFS_DT_U64] = {"U64", 8},   [BFS_DT_I64] = {"I64", 8},
    [BFS_DT_F64] = {"F64", 8},   [BFS_DT_F8_E4M3] = {"F8_E4M3", 1},
    [BFS_DT_F8_E5M2] = {"F8_E5M2", 1}, [BFS_DT_F8_E8M0] = {"F8_E8M0", 1},
};

int bfs__dtype_parse(const char *s, bfs_dtype *out)
{
    for (int i = 0; i < BFS_DT_COUNT; i++)
        if (strcmp(s, bfs__dtypes[i].name) == 0) {
            *out = (bfs_dtype)i;
            return 0;
        }
    return -1;
}

const char *bfs__dtype_name(bfs_dtype d) { return (unsigned)d < BFS_DT_COUNT ? bfs__dtypes[d].name : "?"; }
size_t bfs__dtype_size(bfs_dtype d) { return (unsigned)d < BFS_DT_COUNT ? bfs__dtypes[d].size : 0; }

char *bfs__strdup(const char *s)
{
    const size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

int bfs__grow(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc = nc > SIZE_MAX / 2 ? need : nc * 2;
    if (nc > SIZE_MAX / size)
        return BFS_ENOMEM;
    void *np = realloc(*p, nc * size);
    if (!np)
        return BFS_ENOMEM;
    *p = np;
    *cap = nc;
    return 0;
}

char *bfs__path_join(const char *a, const char *b)
{
    const size_t na = strlen(a), nb = strlen(b);
    char *p = malloc(na + nb + 2);
    if (!p)
        return NULL;
    memcpy(p, a, na);
    size_t k = na;
    if (k > 0 && p[k - 1] != '/')
        p[k++] = '/';
    memcpy(p + k, b, nb + 1);
    return p;
}

/* Read a regular file of at most max bytes, NUL-terminated. */
int bfs__read_small_file(const char *path, size_t max, char **out, size_t *len)
{
    int rc = 0, fd = -1;
    char *buf = NULL;
    struct stat st;
    *out = NULL;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block us: it is rejected below */
    if (fd < 0)
        return bfs__errno(errno == ENOENT || errno == ELOOP || errno == ENOTDIR ? BFS_EINPUT
                          : errno == ENOMEM                                   ? BFS_ENOMEM
                                                                              : BFS_EIO,
                          errno, "%s: cannot open", path);
    if (fstat(fd, &st) != 0)
        BFS_FAIL(BFS_EIO, "%s: cannot stat", path);
    if (!S_ISREG(st.st_mode))
        BFS_FAIL(BFS_EINPUT, "%s: not a regular file", path);
    if ((uint64_t)st.st_size > max)
        BFS_FAIL(BFS_EINPUT, "%s: %lld bytes, larger than the %zu allowed for this file", path,
                 (long long)st.st_size, max);
    buf = malloc((size_t)st.st_size + 1);
    if (!buf)
        BFS_FAIL(BFS_ENOMEM, "%s: out of memory", path);
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        const ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = bfs__errno(BFS_EIO, errno, "%s: read failed at byte %zu", path, got);
            goto cleanup;
        }
        if (n == 0)
            BFS_FAIL(BFS_EINPUT, "%s: file shrank while reading (at byte %zu)", path, got);
        got += (size_t)n;
    }
    buf[got] = '\0';
    *out = buf;
    buf = NULL;
    if (len)
        *len = got;
cleanup:
    free(buf);
    if (fd >= 0)
        close(fd);
    return rc;
}

/* json_dumps plus a final newline, as a text file should end; NULL when out of memory.
 * Not json_dumps() itself: jansson (2.14) ignores a failed write of an object's key, so
 * one failed allocation of its buffer can drop a '"' and the dump still succeeds. Here a
 * failure is sticky: every later write fails too, and the dump with it. */
typedef struct {
    char *buf;
    size_t n, cap;
    bool failed;
} bfs_json_buf;

static int bfs__json_buf_put(const char *s, size_t len, void *data)
{
    bfs_json_buf *b = data;
    if (!b->failed && len + 2 > b->cap - b->n) { /* room for the '\n' and the NUL too */
        size_t nc = b->cap ? b->cap : 4096;
        while (nc - b->n < len + 2 && nc <= SIZE_MAX / 2)
            nc *= 2;
        char *nb = nc - b->n >= len + 2 ? realloc(b->buf, nc) : NULL;
        if (nb) {
            b->buf = nb;
            b->cap = nc;
        } else
            b->failed = true;
    }
    if (b->failed)
        return -1;
    memcpy(b->buf + b->n, s, len);
    b->n += len;
    return 0;
}

/* json_dumps() without its silent truncation (see above): the text alone, NUL-ended */
char *bfs__json_dump(const json_t *j, size_t flags)
{
    bfs_json_buf b = {0};
    if (json_dump_callback(j, bfs__json_buf_put, &b, flags) != 0 || b.failed || bfs__json_buf_put("", 0, &b) != 0) {
        free(b.buf);
        return NULL;
    }
    b.buf[b.n] = '\0';
    return b.buf;
}

char *bfs__json_show(const json_t *j, size_t flags)
{
    char *s = bfs__json_dump(j, flags);
    if (!s)
        return NULL;
    /* jansson writes DEL and C1 as they are; each is at most 2 bytes, its escape 6 */
    size_t extra = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        extra += *p == 0x7f ? 5 : *p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f ? 4 : 0;
    if (!extra)
        return s;
    const size_t len = strlen(s);
    char *t = malloc(len + extra + 1);
    if (!t) {
        free(s);
        return NULL;
    }
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p == 0x7f)
            k += (size_t)sprintf(t + k, "\\u%04x", *p);
        else if (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f)
            k += (size_t)sprintf(t + k, "\\u%04x", *++p);
        else
            t[k++] = (char)*p;
    t[k] = '\0';
    free(s);
    return t;
}

char *bfs__json_text(const json_t *j, size_t flags, size_t *len)
{
    bfs_json_buf b = {0};
    if (json_dump_callback(j, bfs__json_buf_put, &b, flags) != 0 || b.failed || bfs__json_buf_put("", 0, &b) != 0) {
        free(b.buf);
        return NULL;
    }
    b.buf[b.n] = '\n';
    b.buf[b.n + 1] = '\0';
    if (len)
        *len = b.n + 1;
    return b.buf;
}
