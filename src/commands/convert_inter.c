/*
 * Files that hold different tensors (the HF layout's shards) written together: their units
 * interleaved, one file's next unit (or batch of small pieces) after another's in turn, so
 * that the writer's lanes (writer.h: a lane owns whole files) write and hash them at once
 * instead of one shard at a time. Each file's bytes are the same units in the same order
 * as written alone (bfs__write_file); only which file's unit comes next differs. Its files
 * are begun together and committed in file order at the end (bfs__group_open, _close).
 */
#include "commands/convert.h"
#include "output/units.h"

/* File k's next step: a batch of small pieces, or the next unit of a piece; *progress set
 * when there was one */
static int bfs__inter_step(bfs_run *r, bfs_rank *k, bool *progress)
{
    int rc = 0;
    const bfs_outfile *of = &r->plan->files[k->fidx];
    bool done = false;
    if (k->in_piece) {
        BFS_TRY(bfs__piece_step(r, k, of, &k->pc, &done));
        *progress = true;
        if (done) {
            k->in_piece = false;
            k->pi++;
        }
        return 0;
    }
    if (k->pi >= of->npieces)
        return 0;
    *progress = true;
    const size_t pe = bfs__batch_end(r->plan, of, k->pi, r->unit_bytes);
    k->pf = r->prefetch ? bfs__prefetch_ahead(r->in, r->plan, of, k->pf, k->pi) : k->pf; /* a part: by hand */
    if (pe > k->pi + 1) {
        BFS_TRY(bfs__write_batch(r, k, of, k->pi, pe, false));
        k->pi = pe;
        return 0;
    }
    BFS_TRY(bfs__piece_begin(r, k, of, k->pi, &k->pc, &done));
    if (done)
        k->pi++;
    else
        k->in_piece = true;
cleanup:
    return rc;
}

int bfs__write_interleaved(bfs_run *r, const int *fidx, int n)
{
    int rc = 0;
    BFS_TRY(bfs__group_open(r, fidx, n));
    for (bool progress = true; progress;) {
        progress = false;
        for (int g = 0; g < n; g++)
            BFS_TRY(bfs__inter_step(r, &r->grp[g], &progress));
    }
    BFS_TRY(bfs__group_close(r, fidx, n));
cleanup:
    return rc; /* on failure, bfs__ranks_abort */
}
