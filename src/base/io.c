/* Checked positioned I/O and XXH3-128 helpers. */
#include "base/base.h"
#include "base/bfs_io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int bfs__pwrite_all(int fd, const void *buf, size_t len, uint64_t off, const char *what)
{
    const uint8_t *p = buf;
    while (len > 0) {
        const size_t chunk = len > (1u << 30) ? (1u << 30) : len;
        const ssize_t n = pwrite(fd, p, chunk, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return bfs__errno(BFS_EIO, errno, "%s: write of %zu bytes at offset %llu failed", what, chunk,
                              (unsigned long long)off);
        if (n == 0)
            return bfs__err(BFS_EIO, "%s: write at offset %llu wrote nothing (disk full?)", what, (unsigned long long)off);
        p += n;
        off += (uint64_t)n;
        len -= (size_t)n;
    }
    return 0;
}

int bfs__pread_all(int fd, void *buf, size_t len, uint64_t off, const char *what)
{
    uint8_t *p = buf;
    while (len > 0) {
        const ssize_t n = pread(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return bfs__errno(BFS_EIO, errno, "%s: read of %zu bytes at offset %llu failed", what, len,
                              (unsigned long long)off);
        if (n == 0)
            return bfs__err(BFS_EINPUT, "%s: unexpected end of file at offset %llu (truncated?)", what,
                            (unsigned long long)off);
        p += n;
        off += (uint64_t)n;
        len -= (size_t)n;
    }
    return 0;
}

void bfs__hash_hex(XXH128_hash_t h, char out[33])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hx[c.digest[i] >> 4];
        out[2 * i + 1] = hx[c.digest[i] & 15];
    }
    out[32] = '\0';
}

int bfs__hash_range(int fd, uint64_t off, uint64_t len, uint8_t *buf, size_t bufsize, const char *what,
                    XXH3_state_t *st, XXH3_state_t *st2)
{
    while (len > 0) {
        const size_t n = len < bufsize ? (size_t)len : bufsize;
        if (bfs__cancelled())
            return bfs__err(BFS_EINTR, "interrupted while reading %s", what);
        const int rc = bfs__pread_all(fd, buf, n, off, what);
        if (rc < 0)
            return rc;
        XXH3_128bits_update(st, buf, n);
        if (st2)
            XXH3_128bits_update(st2, buf, n);
        off += n;
        len -= n;
    }
    return 0;
}
