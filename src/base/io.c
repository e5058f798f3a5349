/* Checked positioned I/O, XXH3-128 and SHA-256 helpers. */
#include "base/base.h"
#include "base/bfs_io.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

void bfs__dig16_of(XXH128_hash_t h, bfs_dig16 *d)
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    memcpy(d->b, c.digest, 16);
    d->set = true;
}

void bfs__hash_hex(XXH128_hash_t h, char out[33])
{
    bfs_dig16 d;
    bfs__dig16_of(h, &d);
    bfs__hex16_str(d.b, out);
}

void bfs__hex16_str(const uint8_t h[16], char out[33])
{
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hx[h[i] >> 4];
        out[2 * i + 1] = hx[h[i] & 15];
    }
    out[32] = '\0';
}

bool bfs__hex16_parse(const char *s, uint8_t out[16])
{
    static const int8_t v[256] = {
        ['0'] = 1, ['1'] = 2, ['2'] = 3, ['3'] = 4, ['4'] = 5, ['5'] = 6, ['6'] = 7, ['7'] = 8, ['8'] = 9,
        ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16,
    }; /* digit + 1; 0: not a lowercase hex digit (the NUL of a shorter string included) */
    for (int i = 0; i < 16; i++) {
        const int hi = v[(unsigned char)s[2 * i]], lo = hi ? v[(unsigned char)s[2 * i + 1]] : 0;
        if (!hi || !lo)
            return false;
        out[i] = (uint8_t)((hi - 1) << 4 | (lo - 1));
    }
    return s[32] == '\0';
}

int bfs__hash_range(int fd, uint64_t off, uint64_t len, uint8_t *buf, size_t bufsize, const char *what,
                    XXH3_state_t *st)
{
    return bfs__hash_range2(fd, off, len, buf, bufsize, what, st, NULL);
}

/* ---- SHA-256: OpenSSL's EVP (it picks SHA-NI, AVX2 or its assembly for this CPU) ---------- */
struct bfs_sha256 {
    EVP_MD_CTX *ctx;
    bool ok; /* every call since the reset succeeded */
};

static const EVP_MD *bfs__sha256_md(void)
{
    /* fetched once: an implicit fetch on every init costs a lookup per file */
    static const EVP_MD *md;
    const EVP_MD *m = __atomic_load_n(&md, __ATOMIC_ACQUIRE);
    if (!m) {
        EVP_MD *f = EVP_MD_fetch(NULL, "SHA256", NULL);
        const EVP_MD *expect = NULL;
        if (!f)
            return EVP_sha256();
        if (!__atomic_compare_exchange_n(&md, &expect, (const EVP_MD *)f, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            EVP_MD_free(f); /* another thread's won */
        m = __atomic_load_n(&md, __ATOMIC_ACQUIRE);
    }
    return m;
}

bfs_sha256 *bfs__sha256_new(void)
{
    bfs_sha256 *s = calloc(1, sizeof *s);
    if (!s || !(s->ctx = EVP_MD_CTX_new()) || bfs__sha256_reset(s) < 0) {
        bfs__sha256_free(s);
        return NULL;
    }
    return s;
}

void bfs__sha256_free(bfs_sha256 *s)
{
    if (!s)
        return;
    EVP_MD_CTX_free(s->ctx);
    free(s);
}

int bfs__sha256_reset(bfs_sha256 *s)
{
    s->ok = EVP_DigestInit_ex(s->ctx, bfs__sha256_md(), NULL) == 1;
    return s->ok ? 0 : bfs__err(BFS_EINTERNAL, "libcrypto: cannot start a SHA-256 digest");
}

void bfs__sha256_update(bfs_sha256 *s, const void *p, size_t n)
{
    if (n && s->ok)
        s->ok = EVP_DigestUpdate(s->ctx, p, n) == 1;
}

int bfs__sha256_hex(bfs_sha256 *s, char out[65])
{
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dl = 0;
    static const char hx[] = "0123456789abcdef";
    const bool ok = s->ok && EVP_DigestFinal_ex(s->ctx, d, &dl) == 1 && dl == 32;
    s->ok = false; /* reset before the next use */
    memset(out, '0', 64);
    out[64] = '\0';
    if (!ok)
        return bfs__err(BFS_EINTERNAL, "libcrypto: a SHA-256 digest failed");
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hx[d[i] >> 4];
        out[2 * i + 1] = hx[d[i] & 15];
    }
    return 0;
}

int bfs__sha256_buf(const void *p, size_t n, char out[65])
{
    bfs_sha256 *s = bfs__sha256_new();
    if (!s)
        return bfs__err(BFS_ENOMEM, "out of memory");
    bfs__sha256_update(s, p, n);
    const int rc = bfs__sha256_hex(s, out);
    bfs__sha256_free(s);
    return rc;
}

int bfs__is_sha256_hex(const char *s)
{
    if (!s || strlen(s) != 64)
        return 0;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

int bfs__hash_range2(int fd, uint64_t off, uint64_t len, uint8_t *buf, size_t bufsize, const char *what,
                     XXH3_state_t *xst, bfs_sha256 *sha)
{
    while (len > 0) {
        const size_t n = len < bufsize ? (size_t)len : bufsize;
        if (bfs__cancelled())
            return bfs__err(BFS_EINTR, "interrupted while reading %s", what);
        const int rc = bfs__pread_all(fd, buf, n, off, what);
        if (rc < 0)
            return rc;
        if (xst)
            bfs__xxh128_update(xst, buf, n);
        if (sha)
            bfs__sha256_update(sha, buf, n);
        off += n;
        len -= n;
    }
    return 0;
}

/* ---- XXH3-128 with the fastest code this CPU runs (the same digest everywhere) --------- */
void bfs__xxh3_128_update_avx2(void *state, const void *p, size_t n); /* xxh_avx2.c */

void bfs__xxh128_update(XXH3_state_t *st, const void *p, size_t n)
{
#if defined(__x86_64__) || defined(__i386__)
    static int avx2 = -1; /* read and written with __atomic builtins: the same value from any thread */
    int a = __atomic_load_n(&avx2, __ATOMIC_RELAXED);
    if (a < 0) {
        __builtin_cpu_init();
        a = __builtin_cpu_supports("avx2") ? 1 : 0;
        __atomic_store_n(&avx2, a, __ATOMIC_RELAXED);
    }
    if (a) {
        bfs__xxh3_128_update_avx2(st, p, n);
        return;
    }
#endif
    XXH3_128bits_update(st, p, n);
}
