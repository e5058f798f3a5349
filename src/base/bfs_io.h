/* Checked positioned I/O, XXH3-128 helpers (io.c), and the names of the files a
 * conversion leaves in OUTDIR beside the weights. */
#ifndef BFS_IO_H
#define BFS_IO_H
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

int bfs__pwrite_all(int fd, const void *buf, size_t len, uint64_t off, const char *what);
int bfs__pread_all(int fd, void *buf, size_t len, uint64_t off, const char *what);
void bfs__hash_hex(XXH128_hash_t h, char out[33]);
/* Hash [off, off+len) of fd into st (and st2 when not NULL), reading through buf. */
int bfs__hash_range(int fd, uint64_t off, uint64_t len, uint8_t *buf, size_t bufsize, const char *what,
                    XXH3_state_t *st, XXH3_state_t *st2);

#define BFS_MANIFEST_NAME "bfshard.manifest.json"
#define BFS_SUMS_NAME "xxh128sums.txt"
#endif
