/*
 * A rank file's hashes besides the ones the writer makes (convert_ranks.c writes the file):
 * its slice index written from its pieces' hashes at its commit (bfs__file_slices), and a
 * file reused from an interrupted run re-hashed from disk (bfs__rehash_pieces).
 */
#include "commands/convert.h"
#include "base/bfs_io.h"
#include "output/hashfile.h"
#include "output/slices.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

/* Re-hash a reused file's pieces (the manifest needs them), and with --sha256 the whole
 * file's SHA-256 (its XXH3 the journal recorded and resume checked). */
int bfs__rehash_pieces(bfs_run *r, int fidx)
{
    const bfs_outfile *of = &r->plan->files[fidx];
    int rc = bfs__plan_pieces(r->plan, fidx); /* dropped by the caller when done with the file */
    if (rc == 0)
        rc = bfs__piece_dig_alloc(r, fidx);
    if (rc < 0)
        return rc;
    const int fd = openat(r->dirfd, of->name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return bfs__errno(BFS_EIO, errno, "%s/%s: cannot open", r->outdir, of->name);
    XXH3_state_t *st = XXH3_createState();
    bfs_sha256 *sha = r->file_sha ? bfs__sha256_new() : NULL;
    if (!st || (r->file_sha && !sha))
        rc = bfs__err(BFS_ENOMEM, "out of memory");
    for (size_t pi = 0; pi < of->npieces && rc == 0; pi++) {
        XXH3_128bits_reset(st);
        rc = bfs__hash_range(fd, of->pieces[pi].offset, of->pieces[pi].nbytes, r->buf[0], (size_t)r->ring.slot,
                             of->name, st);
        bfs__dig16_of(XXH3_128bits_digest(st), &r->piece_dig[fidx][pi]);
    }
    if (rc == 0 && sha)
        rc = bfs__hash_file(fd, 0, of->size, of->name, bfs__hash_file_threads(1), NULL, sha);
    if (rc == 0 && sha)
        rc = bfs__sha256_hex(sha, r->file_sha[fidx]);
    bfs__sha256_free(sha);
    XXH3_freeState(st);
    close(fd);
    return rc;
}

int bfs__piece_dig_alloc(bfs_run *r, int fidx)
{
    if (!r->piece_dig[fidx] && !(r->piece_dig[fidx] = calloc(r->plan->files[fidx].npieces + 1, sizeof **r->piece_dig)))
        return bfs__err(BFS_ENOMEM, "%s: out of memory for its piece hashes", r->plan->files[fidx].name);
    return 0;
}

int bfs__file_slices(bfs_run *r, int fidx)
{
    if (r->slices_hex[fidx][0])
        return 0; /* written already */
    if (!r->piece_dig[fidx])
        return bfs__err(BFS_EINTERNAL, "%s: its slice index before its pieces were hashed", r->plan->files[fidx].name);
    const int rc = bfs__slices_write(r->dirfd, r->outdir, r->plan, fidx, r->piece_dig[fidx],
                                     r->hdr_hex && r->hdr_hex[fidx][0] ? r->hdr_hex[fidx] : NULL, r->mine != NULL,
                                     r->slices_hex[fidx], r->slices_sha ? r->slices_sha[fidx] : NULL);
    if (rc < 0)
        return rc;
    free(r->piece_dig[fidx]);
    r->piece_dig[fidx] = NULL;
    return 0;
}
