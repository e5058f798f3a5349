/* Checked positioned I/O, XXH3-128 and SHA-256 helpers (io.c), and the names of the
 * files a conversion leaves in OUTDIR beside the weights. */
#ifndef BFS_IO_H
#define BFS_IO_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

int bfs__pwrite_all(int fd, const void *buf, size_t len, uint64_t off, const char *what);
int bfs__pread_all(int fd, void *buf, size_t len, uint64_t off, const char *what);
void bfs__hash_hex(XXH128_hash_t h, char out[33]);
/* 16 bytes (a canonical XXH3-128) as 32 lowercase hex digits, and back: false unless s is
 * exactly 32 lowercase hex digits */
void bfs__hex16_str(const uint8_t h[16], char out[33]);
/* A piece's XXH3-128 as its canonical 16 bytes (what a slice index holds), kept binary:
 * never formatted as hex to be parsed back. set: computed. */
typedef struct bfs_dig16 {
    uint8_t b[16];
    bool set;
} bfs_dig16;
void bfs__dig16_of(XXH128_hash_t h, bfs_dig16 *d);
bool bfs__hex16_parse(const char *s, uint8_t out[16]);
/* XXH3-128 update with the fastest code this CPU runs (AVX2 where it has it: xxh_avx2.c; the
 * same digest everywhere): every hash over tensor bytes, from the source hashes to verify. */
void bfs__xxh128_update(XXH3_state_t *st, const void *p, size_t n);
/* Hash [off, off+len) of fd into st, reading through buf (bfs__hash_range2 without SHA-256). */
int bfs__hash_range(int fd, uint64_t off, uint64_t len, uint8_t *buf, size_t bufsize, const char *what,
                    XXH3_state_t *st);

/* SHA-256 through OpenSSL's libcrypto (EVP: SHA-NI or AVX2 where the CPU has
 * them, never code of our own). A context is reused: reset, update..., hex (which ends it). */
typedef struct bfs_sha256 bfs_sha256;
bfs_sha256 *bfs__sha256_new(void); /* NULL when out of memory; ready (reset) */
void bfs__sha256_free(bfs_sha256 *s); /* accepts NULL */
int bfs__sha256_reset(bfs_sha256 *s); /* 0, or BFS_EINTERNAL when libcrypto refuses */
void bfs__sha256_update(bfs_sha256 *s, const void *p, size_t n);
/* 64 lowercase hex digits + NUL; the context must be reset before its next use.
 * 0, or BFS_EINTERNAL when libcrypto failed anywhere since the reset. */
int bfs__sha256_hex(bfs_sha256 *s, char out[65]);
/* SHA-256 of a buffer, as hex. */
int bfs__sha256_buf(const void *p, size_t n, char out[65]);
/* 64 lowercase hex digits, nothing else */
int bfs__is_sha256_hex(const char *s);
/* Hash [off, off+len) of fd into xst (may be NULL) and sha (may be NULL), reading through buf. */
int bfs__hash_range2(int fd, uint64_t off, uint64_t len, uint8_t *buf, size_t bufsize, const char *what,
                     XXH3_state_t *xst, bfs_sha256 *sha);

#define BFS_MANIFEST_NAME "bfshard.manifest.json"
#define BFS_SUMS_NAME "xxh128sums.txt"
#define BFS_SHA256SUMS_NAME "sha256sums.txt" /* `sha256sum -c`; only when the manifest records sha256 */
#endif
