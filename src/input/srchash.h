/* Source hashes (srchash.c): the manifest's hash of every input file, computed from the
 * bytes the kernels read, as they read them, as a sum of position-tagged block hashes, so
 * that each part of a conversion hashes its own rows and merge adds the parts' sums.
 * convert feeds it every unit's source ranges after its kernel ran, each with the block its
 * rank hashes (bfs__unit_hash_blocks); manifest.c writes what it returns. */
#ifndef BFS_SRCHASH_H
#define BFS_SRCHASH_H

#include "input/input.h"

#include <xxhash.h>

/* The source hash's window: srchash.c reads the input through the map in steps of this
 * and drops them (the memory model, src/output/units.c, counts it) */
#define BFS_SRC_HASH_WINDOW (4u << 20)

/* The manifest's name of the scheme below (source.content_xxh3_128_scheme) */
#define BFS_SRC_HASH_SCHEME "blocks-1"

typedef struct bfs_srchash bfs_srchash;

#include "base/bfs_io.h" /* bfs__xxh128_update: every hash over tensor bytes */

/* unit_read[i]: some unit reads in->raw[i] (bfs__sources_read); the others are one block
 * each, rank 0's. rank0: this run adds rank 0's terms (the headers, those tensors): a whole
 * run, or the part that holds rank 0. dry: nothing is hashed, the bytes are counted
 * (inspect --ranks). */
int bfs__srchash_create(const bfs_input *in, const bool *unit_read, bool rank0, bool dry, bfs_srchash **out);
void bfs__srchash_free(bfs_srchash *h); /* accepts NULL */
/* Hash the n input ranges s[] one unit reads (the mapping the kernel read), each into
 * blk[i], the block of s[i].r its rank hashes (bfs__unit_hash_blocks); the caller has
 * checked the inputs' identity before the kernel ran and checks it again after this
 * returns. A tensor's ranges come in increasing order of rows, over the rank files too (in
 * each rank file's, with bfs__srchash_hold). */
int bfs__srchash_ranges(bfs_srchash *h, const bfs_srange *s, const bfs_srange *blk, int n);
/* on: units of several rank files are interleaved (convert's groups), each rank's units
 * in increasing order, ranks begun in increasing order: a block begun does not end the
 * open blocks below it (they end once hashed to their end, or at bfs__srchash_finish);
 * off (the default): a block begun ends the tensor's open block below it. */
void bfs__srchash_hold(bfs_srchash *h, bool on);
/* Hash what no unit read of the blocks begun, and rank 0's tensors no unit reads; then
 * per input file this run's sum of terms, 32 hex, into hex[file]: a whole run's is the
 * file's content hash, a part's is its share of it (merge adds them). */
int bfs__srchash_finish(bfs_srchash *h, char (*hex)[33]);
/* read: input bytes this run read (every header, the union of the units' ranges, the
 * bytes read only to be hashed); hashed: input bytes its terms cover (a whole run: all). */
void bfs__srchash_bytes(const bfs_srchash *h, uint64_t *read, uint64_t *hashed);

#endif
