/* A byte range of one file hashed in file order (XXH3-128, and SHA-256 when asked) while
 * several threads read it ahead (hashfile.c). XXH3 and SHA-256 are sequential, so one file's
 * digest is one thread's work at a time; what several threads can share is the reading (on
 * a page-cached or tmpfs file, the copy out of the page cache costs more than the XXH3):
 * every thread reads the next chunk into a bounded ring, and whichever finds the chunk next
 * in file order read hashes it. verify and resume's re-hash of a finished file use it. */
#ifndef BFS_HASHFILE_H
#define BFS_HASHFILE_H

#include "base/bfs_io.h"

#include <stdint.h>

/* the chunk each read brings in: small enough to be hashed while it is still in L2 */
#define BFS_HASHFILE_CHUNK (1u << 20)
#define BFS_HASHFILE_THREADS 16

/* [off, off + len) of fd into xst and sha (either may be NULL), in file order, read by up to
 * `threads` threads (the caller's among them; <= 1: the caller's alone, no thread started;
 * at most BFS_HASHFILE_THREADS), through a ring of 2 chunks a thread. `what` names the file
 * in errors: a short read or a read error names it and the offset; bfs_cancel() stops it
 * with BFS_EINTR. Returns 0 or a BFS_E* code. */
int bfs__hash_file(int fd, uint64_t off, uint64_t len, const char *what, int threads, XXH3_state_t *xst,
                   bfs_sha256 *sha);

/* The threads for one file when `nfiles` files are hashed at once on this machine's CPUs
 * (each file gets its share, at least 1); files under BFS_HASHFILE_BIG bytes take too
 * little time to count among them. */
#define BFS_HASHFILE_BIG (64ull << 20)
int bfs__hash_file_threads(size_t nfiles);

#endif
