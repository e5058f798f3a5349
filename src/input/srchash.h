/* Source hashes (srchash.c): the manifest's hash of every input file, computed from the
 * bytes the kernels read, as they read them. convert feeds it every unit's source ranges after
 * its kernel ran; manifest.c writes what it returns. */
#ifndef BFS_SRCHASH_H
#define BFS_SRCHASH_H

#include "input/input.h"

/* The source hash's window: srchash.c reads the input through the map in steps of this
 * and drops them (the memory model, src/output/units.c, counts it) */
#define BFS_SRC_HASH_WINDOW (4u << 20)

typedef struct bfs_srchash bfs_srchash;

/* mine: per input file, whether this run hashes it (a part of convert --ranks hashes the
 * files its ranks own, parts.c); NULL: every file. A part's units may skip the rows of a
 * tensor that other parts convert: those bytes are read by the hash itself. */
int bfs__srchash_create(const bfs_input *in, const bool *mine, bfs_srchash **out);
void bfs__srchash_free(bfs_srchash *h); /* accepts NULL */
/* Hash the n input ranges s[] one unit reads (bfs__unit_sources gives them: the mapping the
 * kernel read); the caller has checked the inputs' identity before the kernel ran and
 * checks it again after this returns. */
int bfs__srchash_ranges(bfs_srchash *h, const bfs_srange *s, int n);
/* Hash what no unit read (tensors only the planner read, rows of other parts) and give
 * every hashed input file's content hash, 32 hex, into hex[file] (others: untouched). */
int bfs__srchash_finish(bfs_srchash *h, char (*hex)[33]);

#endif
