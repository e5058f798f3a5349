/*
 * Files written together with their units interleaved, one file's next unit after another's
 * in turn, so that the writer's lanes (writer.h: a lane owns whole files) write and hash
 * them at once instead of one file at a time: files that hold different tensors (the HF
 * layout's shards: every unit or batch of small pieces), and a group of rank files written
 * window by window (bfs__write_group, units.h: groups): each window's small pieces one batch
 * a file (convert_ranks.c), its large pieces cut unit by unit in turn (bfs__group_piece,
 * _drain). Each file's bytes are the same units in the same order as
 * written alone (bfs__write_file); only which file's unit comes next differs. The files
 * are begun together and committed in file order at the end (bfs__group_open, _close).
 */
#include "commands/convert.h"
#include "input/srchash.h"
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

/* The large pieces begun (bfs__group_piece), cut unit by unit in turn, one unit of each
 * file's piece after another's, so that the files' lanes (writer.h) write at once instead
 * of one file's piece filling the ring while the other lanes wait for it. Each file's units
 * are the same and in the same order as one piece after another; only which file's unit
 * comes next differs, and the source hash keeps each rank's block of the tensor open
 * meanwhile (bfs__srchash_hold). */
static int bfs__group_drain(bfs_run *r, int n)
{
    int rc = 0, active = 0;
    for (int g = 0; g < n; g++)
        active += r->grp[g].in_piece;
    bfs__srchash_hold(r->sh, active > 1); /* several ranks' blocks of a tensor open at once */
    for (bool more = active > 0; more;) {
        more = false;
        for (int g = 0; g < n; g++) {
            bfs_rank *const k = &r->grp[g];
            if (!k->in_piece)
                continue;
            bool done = false;
            BFS_TRY(bfs__piece_step(r, k, &r->plan->files[k->fidx], &k->pc, &done));
            r->interleaved += active > 1;
            k->in_piece = !done;
            more = more || !done;
        }
    }
cleanup:
    bfs__srchash_hold(r->sh, false);
    return rc;
}

/* A window's large piece for the group's file g: begun, and cut with the others begun
 * (bfs__group_drain) once the window has no more of them, or once g's piece before it is */
static int bfs__group_piece(bfs_run *r, int g, int n, size_t pi)
{
    int rc = 0;
    bfs_rank *const k = &r->grp[g];
    if (k->in_piece)
        BFS_TRY(bfs__group_drain(r, n));
    bool done = false;
    BFS_TRY(bfs__piece_begin(r, k, &r->plan->files[k->fidx], pi, &k->pc, &done));
    k->in_piece = !done;
cleanup:
    return rc;
}

int bfs__write_group(bfs_run *r, const int *fidx, int n)
{
    int rc = 0;
    bfs_gwalk gw;
    bfs_gstep s;
    BFS_TRY(bfs__group_open(r, fidx, n));
    bfs__gwalk_init(&gw, r->plan, fidx, n, &r->ring);
    while (bfs__gwalk_next(&gw, &s)) {
        if (s.window_end || !s.batch)
            bfs__carve_close(r);
        if (s.window_end || s.batch)
            BFS_TRY(bfs__group_drain(r, n));
        if (s.window_end) {
            const double t0 = bfs__now();
            BFS_TRY(bfs__release_window(r, &gw));
            r->t_read += bfs__now() - t0;
            continue;
        }
        bfs_rank *const k = &r->grp[s.g];
        const bfs_outfile *of = &r->plan->files[k->fidx];
        k->pf = r->prefetch ? bfs__prefetch_ahead(r->in, r->plan, of, k->pf, s.p0) : k->pf; /* a part: by hand */
        if (!s.batch) {
            BFS_TRY(bfs__group_piece(r, s.g, n, s.p0));
            continue;
        }
        BFS_TRY(bfs__write_batch(r, k, of, s.p0, s.p1, true));
        if (bfs__grow((void **)&r->wsteps, &r->cwsteps, r->nwsteps + 1, sizeof *r->wsteps) < 0)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        r->wsteps[r->nwsteps++] = s;
    }
    BFS_TRY(bfs__group_drain(r, n));
    BFS_TRY(bfs__group_close(r, fidx, n));
cleanup:
    return rc; /* on failure, bfs__ranks_abort */
}
