/*
 * The rank-file stage of bfs_convert (convert.c runs it): each output file's units through
 * the backend into the ring of unit buffers and the writer thread (bfs__write_file,
 * bfs__write_piece, bfs__slot_take), the rank file's temporary opened after the file before
 * it is committed, the next file's units waiting in the ring meanwhile (bfs__unit_push,
 * bfs__rank_start / bfs__rank_finish), its compressed copy (bfs__zcopy_*), a file reused
 * from an interrupted run re-hashed (bfs__rehash_pieces, bfs__hash_reused_sources), the
 * input pages each unit read released (bfs__advise_sources); and for a group of rank files
 * written together, window by window (bfs__write_group, convert_inter.c; units.h: groups),
 * their batches carved from one buffer (bfs__carve) and each window's input pages released
 * after it (bfs__release_window).
 */
#include "commands/convert.h"
#include "commands/commands.h"
#include "backend/backend.h"
#include "plan/plan.h"
#include "base/bfs_io.h"
#include "output/durable.h"
#include "formats/format.h"
#include "output/outdir.h"
#include "output/slices.h"
#include "input/srchash.h"
#include "output/writer.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- source ranges of a unit (prefetch and release); the ranges come from the format */
/* Out of the page cache: only pages [a, b) a unit read whole (inward). A page it shares with
 * a neighbour's bytes (the next rank's slice of the same tensor, or the tensor beside it) is
 * read again by a later rank file: dropped, it came back from disk once per rank (at W=8,
 * the tiny-tensor input was read 8 times: dequant 10 s instead of 3). */
#define BFS_DROP_MIN (64u << 10)
static void bfs__drop_cache(const bfs_infile *f, uint64_t a, uint64_t b)
{
    if (b > f->size)
        b = f->size;
    /* not under BFS_DROP_MIN: a syscall per tiny slice cost more than its pages are worth
     * (DeepSeek-V3's 92k tensors at W=64: 138k calls, ~7% of the run); the kernel's LRU
     * takes those, and no resident set grows with them (they are unmapped) */
    if (a < b && b - a >= BFS_DROP_MIN)
        posix_fadvise(f->fd, (off_t)a, (off_t)(b - a), POSIX_FADV_DONTNEED);
}


#define BFS_RELEASE_SLACK (2ull << 20)
/* Pages [pa, pe) of f unmapped, BFS_RELEASE_SLACK further each side (see below) */
static void bfs__unmap_slack(const bfs_infile *f, uint64_t pa, uint64_t pe)
{
    pe = pe < f->size ? pe : f->size;
    const uint64_t ma = pa > BFS_RELEASE_SLACK ? pa - BFS_RELEASE_SLACK : 0;
    const uint64_t mb = pe + BFS_RELEASE_SLACK < f->size ? pe + BFS_RELEASE_SLACK : f->size;
    madvise((void *)(f->map + ma), (size_t)(mb - ma), MADV_DONTNEED);
}

/* Sorted, merged page ranges pr[0..n) unmapped with their slacks (a batch's, a window's):
 * ranges whose slacks meet in one call, which unmaps what one call each would */
static void bfs__unmap_ranges(const bfs_input *in, const bfs_prange *pr, size_t n)
{
    for (size_t i = 0, j; i < n; i = j) {
        uint64_t pe = pr[i].b;
        for (j = i + 1; j < n && pr[j].file == pr[i].file && pr[j].a <= pe + 2 * BFS_RELEASE_SLACK; j++)
            pe = pr[j].b > pe ? pr[j].b : pe;
        bfs__unmap_slack(&in->files[pr[i].file], pr[i].a, pe);
    }
}

static void bfs__advise_sources(const bfs_input *in, const bfs_unit *u, bool release)
{
    bfs_srange s[BFS_UNIT_MAX_SRC];
    const int n = bfs__unit_sources(u, s);
    const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < n; i++) {
        if (s[i].len == 0)
            continue;
        const bfs_infile *f = &in->files[s[i].r->file];
        const uint64_t a = s[i].r->file_offset + s[i].off, b = a + s[i].len;
        /* outward to pages: unmapping clean shared file pages is always safe */
        const uint64_t pa = a / pg * pg, pb = (b + pg - 1) / pg * pg;
        const uint64_t pe = pb < f->size ? pb : f->size;
        if (release) {
            /* unmapped BFS_RELEASE_SLACK further each side: a fault maps the whole large
             * folio of the page cache (up to 2 MiB), so the neighbouring slice's pages (the
             * next rank's) stay mapped otherwise, one folio per tensor, until that slice's
             * unit: RSS grew with the model. Only unmapped: they stay in the page cache. */
            bfs__unmap_slack(f, pa, pe);
            bfs__drop_cache(f, (a + pg - 1) / pg * pg, b / pg * pg);
        } else {
            madvise((void *)(f->map + pa), (size_t)(pe - pa), MADV_WILLNEED);
        }
    }
}

void bfs__rank_free(bfs_rank *k)
{
    bfs__tmp_abort(&k->t);
    bfs__zst_writer_free(k->zw);
    k->zw = NULL;
    bfs__tmp_abort(&k->zt);
}

/* k zeroed for file fidx */
void bfs__rank_reset(bfs_rank *k, int fidx)
{
    memset(k, 0, sizeof *k);
    k->t = k->zt = (bfs_tmpfile){.fd = -1, .dirfd = -1};
    k->fidx = fidx;
    k->active = true;
}

/* An input truncated or rewritten under us fails the run before a unit reads it,
 * and after its source bytes were hashed (input.c's SIGBUS handler gave it zeros for
 * vanished pages; a rewrite changes the file's ctime): see srchash.c. */
static int bfs__check_sources(const bfs_run *r, const bfs_ltensor *t)
{
    for (int k = 0; k < t->nsrc; k++) {
        const int rc = bfs__input_check(r->in, t->src[k]->file);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- the compressed copy beside a rank file (src/zst.c) ------------------------ */
static int bfs__zcopy_open(bfs_run *r, const bfs_outfile *of, bfs_tmpfile *t, char *zname, size_t cap)
{
    snprintf(zname, cap, "%s%s", of->name, r->o->compress_mode == BFS_ZST_BYTEGROUP ? ".bfz" : ".zst");
    return bfs__tmp_open(t, r->dirfd, r->outdir, zname);
}

/* finish (unless done), commit durably, record for the manifest */
static int bfs__zcopy_commit(bfs_run *r, int fidx, bfs_zst_writer *zw, bool finished, bfs_tmpfile *t,
                             const char *zname)
{
    const int rc = finished ? 0 : bfs__zst_finish(zw, NULL);
    if (rc < 0)
        return rc;
    const int crc = bfs__tmp_commit(t);
    if (crc < 0)
        return crc;
    json_decref(r->zst[fidx]);
    r->zst[fidx] = bfs__zst_manifest_entry(zw, zname);
    return r->zst[fidx] ? 0 : bfs__err(BFS_ENOMEM, "out of memory");
}

/* a rank file reused from an interrupted run: compress it from disk */
int bfs__zcopy_reused(bfs_run *r, int fidx)
{
    int rc = 0;
    char zname[NAME_MAX + 1];
    bfs_tmpfile t = {.fd = -1, .dirfd = -1};
    bfs_zst_writer *zw = NULL;
    char *in = bfs__path_join(r->outdir, r->plan->files[fidx].name);
    if (!in)
        return bfs__err(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__zcopy_open(r, &r->plan->files[fidx], &t, zname, sizeof zname));
    BFS_TRY(bfs__zst_compress_into(in, t.fd, r->o->compress_level, r->o->threads, r->o->compress_mode, &zw));
    BFS_TRY(bfs__zcopy_commit(r, fidx, zw, true, &t, zname));
cleanup:
    bfs__zst_writer_free(zw);
    bfs__tmp_abort(&t);
    free(in);
    return rc;
}

/* The rank file's temporary; its whole size is reserved by the writer lane that owns it,
 * before it writes any of its bytes (bfs_wjob.reserve: on tmpfs the reservation is the page
 * allocation, a third of a run's CPU, taken off the dequantizing thread). */
static int bfs__rank_open(bfs_run *r, const bfs_outfile *of, bfs_tmpfile *t, char *what, size_t cap)
{
    const int rc = bfs__tmp_open(t, r->dirfd, r->outdir, of->name);
    if (rc < 0)
        return rc;
    char path[PATH_MAX + 64]; /* what and t may be parts of one struct */
    snprintf(path, sizeof path, "%s/%s", r->outdir, t->tmp);
    snprintf(what, cap, "%s", path);
    return 0;
}

static int bfs__rank_start(bfs_run *r, bfs_rank *k);

/* The ring (units.h): the next buffer, once the writer is done with the job that last used
 * it; after the push of the job that fills it, bfs__slot_pushed records that job. */
int bfs__slot_take(bfs_run *r, uint8_t **buf)
{
    *buf = r->buf[r->slot];
    return bfs__writer_wait_job(&r->w, r->bufjob[r->slot]);
}

/* The ring's next buffer: the lowest-numbered one the writer is done with, else one not used
 * yet, else the one whose job the writer will be done with first. While the writer keeps up,
 * two or three buffers take turns and the others are never touched: the pages a buffer's
 * first use faults in (and the kernel zeroes: 2 MiB at a time with huge pages) are paid for
 * the buffers the run needs, not for all ring.n of them, in every process, whatever runs. A
 * buffer whose unit waits for its file (bfs__unit_push) is held (bufjob UINT64_MAX). */
static void bfs__slot_next(bfs_run *r)
{
    const uint64_t done = bfs__writer_retired(&r->w);
    int oldest = -1;
    for (int i = 0; i < r->live; i++) {
        if (r->bufjob[i] <= done) {
            r->slot = i;
            return;
        }
        if (oldest < 0 || r->bufjob[i] < r->bufjob[oldest])
            oldest = i;
    }
    r->slot = r->live < r->ring.n ? r->live++ : oldest;
}

void bfs__slot_pushed(bfs_run *r)
{
    r->bufjob[r->slot] = bfs__writer_pushed(&r->w);
    bfs__slot_next(r);
}

/* A unit's job to the writer (slot: it fills the ring's buffer r->slot). A file is begun
 * (bfs__rank_start) only once the file before it is committed, which waits for the writer
 * to end it: until the writer has, this file's units wait in the ring, up to ring.n - 1 of
 * them, so the dequant goes on while the writer writes the last file's tail; then they are
 * queued behind the new file's header, in order. */
static int bfs__unit_push(bfs_run *r, bfs_rank *rk, const bfs_wjob *j, bool slot)
{
    int rc = 0;
    if (!rk->opened) {
        const bfs_rank *prev = &r->rank[r->rank_cur ^ 1];
        if (j && prev->active && r->npend < r->ring.n - 1 && !bfs__writer_file_ended(&r->w, prev->wslot)) {
            r->pend[r->npend] = *j;
            r->pend_slot[r->npend++] = slot ? r->slot : -1;
            if (slot) {
                r->bufjob[r->slot] = UINT64_MAX; /* held until its job is queued, below */
                r->waited++;
                bfs__slot_next(r);
            }
            return 0;
        }
        BFS_TRY(bfs__rank_start(r, rk));
        for (int i = 0; i < r->npend; i++) {
            BFS_TRY(bfs__writer_push(&r->w, &r->pend[i]));
            if (r->pend_slot[i] >= 0)
                r->bufjob[r->pend_slot[i]] = bfs__writer_pushed(&r->w);
        }
        r->npend = 0;
    }
    if (j) {
        BFS_TRY(bfs__writer_use(&r->w, rk->wslot)); /* a group's files take turns */
        BFS_TRY(bfs__writer_push(&r->w, j));
        if (slot)
            bfs__slot_pushed(r);
    }
cleanup:
    return rc;
}

/* The units of a span (bfs__ucur_span) into out, *len bytes, between the identity checks of
 * their inputs: their kernels (timed), then their source bytes hashed into their ranks'
 * blocks (srchash.c) -- the bytes the kernels read, since nothing wrote the file after the
 * check before it -- then their input pages released. */
#define BFS_SPAN_BATCH 64 /* units through the backend at a time (run_batch) */
/* A new stamp for a set of identity checks: each input file checked once under it. */
static unsigned bfs__stamp_next(bfs_run *r)
{
    const unsigned stamp = ++r->stamp ? r->stamp : ++r->stamp; /* 0 is "never" */
    if (stamp == 1)
        memset(r->fstamp, 0, (size_t)r->in->nfiles * sizeof *r->fstamp);
    return stamp;
}

/* t's input files checked (bfs__input_check), those not checked under stamp yet */
static int bfs__check_once(bfs_run *r, const bfs_ltensor *t, unsigned stamp)
{
    for (int i = 0; i < t->nsrc; i++) {
        const int f = t->src[i]->file;
        if (r->fstamp[f] == stamp)
            continue;
        r->fstamp[f] = stamp;
        const int rc = bfs__input_check(r->in, f);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The identity checks of units u[0..n)'s input files, each file once (as bfs__check_batch). */
static int bfs__check_units(bfs_run *r, const bfs_unit *u, int n)
{
    if (n == 1)
        return bfs__check_sources(r, u[0].t);
    const unsigned stamp = bfs__stamp_next(r);
    for (int k = 0; k < n; k++) {
        const int rc = bfs__check_once(r, u[k].t, stamp);
        if (rc < 0)
            return rc;
    }
    return 0;
}
static int bfs__run_units(bfs_run *r, const bfs_unit *u, const uint64_t *ua, const uint64_t *ub, int n);
static int bfs__run_span(bfs_run *r, bfs_ucur *span, uint8_t *out, uint64_t *len)
{
    bfs_unit u[BFS_SPAN_BATCH];
    uint64_t ua[BFS_SPAN_BATCH], ub[BFS_SPAN_BATCH];
    int n = 0, rc = 0;
    bool more = true;
    while (more && rc == 0) {
        more = bfs__ucur_next(span, UINT64_MAX, &u[n], &ua[n], &ub[n]);
        if (more) {
            u[n].out = out + *len;
            *len += (u[n].row1 - u[n].row0) * bfs__sub_row_bytes(u[n].t);
            n++;
        }
        if (n == BFS_SPAN_BATCH || (!more && n > 0)) {
            double t0 = bfs__now();
            rc = bfs__check_units(r, u, n);
            r->t_read += bfs__now() - t0;
            if (rc == 0)
                rc = bfs__run_units(r, u, ua, ub, n);
            t0 = bfs__now();
            if (rc == 0)
                rc = bfs__check_units(r, u, n);
            for (int i = 0; i < n && rc == 0; i++)
                bfs__advise_sources(r->in, &u[i], true);
            r->t_read += bfs__now() - t0;
            n = 0;
        }
    }
    return rc;
}

/* Units u[0..n) of a batch, each a whole piece (a packed one: a whole member; ua, ub: the
 * piece's rows for the hash blocks, bfs__ucur_next): run_batch when the backend has it (one
 * pipeline for them all), else one by one; timed as one (two clock reads a tiny piece were
 * 3% of a DeepSeek-V3 run at W = 64), then their source bytes hashed. */
#define BFS_RUN_BATCH 64
static int bfs__run_units(bfs_run *r, const bfs_unit *u, const uint64_t *ua, const uint64_t *ub, int n)
{
    if (n == 0)
        return 0;
    int rc = 0;
    const double t0 = bfs__now();
    if (r->be->run_batch)
        rc = r->be->run_batch(r->be, u, n);
    for (int i = 0; i < n && rc >= 0 && !r->be->run_batch; i++)
        rc = r->be->run(r->be, &u[i]);
    const double t1 = bfs__now();
    r->t_dequant += t1 - t0;
    for (int i = 0; i < n && rc >= 0; i++) {
        bfs_srange sr[BFS_UNIT_MAX_SRC], blk[BFS_UNIT_MAX_SRC];
        const int ns = bfs__unit_hash_blocks(&u[i], ua[i], ub[i], sr, blk);
        const int hr = ns < 0 ? ns : bfs__srchash_ranges(r->sh, sr, blk, ns);
        if (hr < 0)
            return hr;
    }
    r->t_read += bfs__now() - t1; /* the source hashes read the input again */
    return rc;
}

/* A piece's source bytes into its rank's blocks without its kernel, between identity
 * checks: a piece of a reused file, or one no kernel runs for (no rows, or rows of no
 * bytes: its blocks are begun all the same, so each block has its rank). */
static int bfs__hash_piece(bfs_run *r, const bfs_piece *pc)
{
    const bfs_ltensor *t = &r->plan->t[pc->tensor];
    bfs_ucur cur = bfs__ucur(t, pc->row0, pc->row1);
    bfs_unit u = {.t = t, .row0 = pc->row0, .row1 = pc->row1};
    uint64_t a = pc->row0, b = pc->row1;
    int rc = 0;
    /* a packed tensor's piece: each member's, whole; an empty piece of one holds none */
    for (bool more = t->members ? bfs__ucur_next(&cur, UINT64_MAX, &u, &a, &b) : true; more && rc == 0;
         more = t->members && bfs__ucur_next(&cur, UINT64_MAX, &u, &a, &b)) {
        bfs_srange sr[BFS_UNIT_MAX_SRC], blk[BFS_UNIT_MAX_SRC];
        const int ns = bfs__unit_hash_blocks(&u, a, b, sr, blk);
        rc = ns < 0 ? ns : bfs__check_sources(r, u.t);
        if (rc == 0)
            rc = bfs__srchash_ranges(r->sh, sr, blk, ns);
        if (rc == 0)
            rc = bfs__check_sources(r, u.t);
        if (rc == 0)
            bfs__advise_sources(r->in, &u, true);
    }
    return rc;
}

/* A piece begun (bfs__piece_begin), cut into units one at a time (bfs__piece_step): its units
 * through the backend into the writer; r->slot is the buffer to fill next (round the ring over
 * the whole run: the writer may still be on the last file's last units when the next file's
 * first ones are filled). An empty piece is done at its begin (the hash of nothing). */
int bfs__piece_begin(bfs_run *r, bfs_rank *rk, const bfs_outfile *of, size_t pi, bfs_pcur *pc, bool *done)
{
    const bfs_piece *p = &of->pieces[pi];
    pc->pi = pi;
    pc->t = &r->plan->t[p->tensor];
    const uint64_t row_bytes = bfs__sub_row_bytes(pc->t); /* a packed tensor: its members' rows */
    pc->rows_per_unit = bfs__unit_rows(&r->ring, row_bytes);
    pc->off = p->offset;
    *done = p->row0 == p->row1 || row_bytes == 0;
    if (*done) { /* empty piece: hash of nothing */
        const int rc = bfs__hash_piece(r, p);
        return rc < 0 ? rc
                      : bfs__unit_push(r, rk, &(bfs_wjob){.buf = "", .len = 0, .off = pc->off, .piece = (int)pi,
                                                          .piece_end = true},
                                       false);
    }
    /* a buffer's worth of rows at a time: one unit of t, or of a packed tensor as many of its
     * members' units as fill one (small experts: one writer job for many, as batches are) */
    pc->cur = bfs__ucur(pc->t, p->row0, p->row1);
    pc->more = bfs__ucur_span(&pc->cur, pc->rows_per_unit, &pc->span);
    *done = !pc->more;
    return 0;
}

int bfs__piece_step(bfs_run *r, bfs_rank *rk, const bfs_outfile *of, bfs_pcur *pc, bool *done)
{
    int rc = 0;
    bfs_ucur nspan;
    if (bfs__cancelled())
        BFS_FAIL(BFS_EINTR, "interrupted while writing %s (tensor \"%s\")", of->name, pc->t->name);
    /* at buffer + off % 4096: the writer writes it O_DIRECT from there (writer.h) */
    uint8_t *buf;
    BFS_TRY(bfs__slot_take(r, &buf)); /* the writer is done with it */
    uint8_t *const out = buf + pc->off % BFS_DIO_ALIGN;
    pc->more = bfs__ucur_span(&pc->cur, pc->rows_per_unit, &nspan);
    bfs_ucur peek = nspan;
    bfs_unit next;
    uint64_t na, nb;
    if (pc->more && bfs__ucur_next(&peek, UINT64_MAX, &next, &na, &nb)) {
        const double t0 = bfs__now();
        bfs__advise_sources(r->in, &next, false);
        r->t_read += bfs__now() - t0;
    }
    uint64_t len = 0;
    BFS_TRY(bfs__run_span(r, &pc->span, out, &len));
    const bfs_wjob j = {.buf = out, .len = (size_t)len, .off = pc->off, .piece = (int)pc->pi, .piece_end = !pc->more,
                        .headroom = true};
    bfs__slot_touch(r, out + j.len);
    /* a file's first units are dequantized while the writer writes the last file's last
     * ones: this one is begun once that one is committed (bfs__unit_push) */
    BFS_TRY(bfs__unit_push(r, rk, &j, true));
    pc->off += len;
    bfs__progress(r, pc->t->name);
    pc->span = nspan;
cleanup:
    *done = !pc->more;
    return rc;
}

static int bfs__write_piece(bfs_run *r, bfs_rank *rk, const bfs_outfile *of, size_t pi)
{
    bfs_pcur pc;
    bool done = false;
    int rc = bfs__piece_begin(r, rk, of, pi, &pc, &done);
    while (rc == 0 && !done)
        rc = bfs__piece_step(r, rk, of, &pc, &done);
    return rc;
}

/* A rank file's commit: the writer's end of it (its last units were written while the
 * next file's first ones were dequantized), the compressed copy, fdatasync, rename,
 * journal line. From bfs__rank_poll once the writer has ended it, from bfs__write_file
 * two files later at the latest, or at the end of the run: always in file order. */
int bfs__rank_finish(bfs_run *r, bfs_rank *k)
{
    int rc = 0;
    if (!k->active)
        return 0;
    k->active = false;
    const bfs_outfile *of = &r->plan->files[k->fidx];
    const double t0 = bfs__now();
    BFS_TRY(bfs__writer_wait_file(&r->w, k->wslot));
    if (r->file_sha)
        snprintf(r->file_sha[k->fidx], sizeof r->file_sha[k->fidx], "%s", bfs__writer_file_sha256(&r->w, k->wslot));
    bfs__writer_release_file(&r->w, k->wslot);
    if (k->zw)
        BFS_TRY(bfs__zcopy_commit(r, k->fidx, k->zw, false, &k->zt, k->zname));
    if (fdatasync(k->t.fd) != 0)
        BFS_FAIL(BFS_EIO, "%s: fdatasync failed: %s", k->what, strerror(errno));
    posix_fadvise(k->t.fd, 0, 0, POSIX_FADV_DONTNEED);
    BFS_TRY(bfs__tmp_commit(&k->t));
    BFS_TRY(bfs__outdir_journal_add(r->dirfd, r->outdir, r->mine ? r->jname : BFS_JOURNAL_NAME, r->file_hex[k->fidx],
                                    of->name));
    BFS_TRY(bfs__file_slices(r, k->fidx));
    bfs__plan_pieces_drop(r->plan, k->fidx); /* a lazy plan's (plan.h): done with */
    r->t_commit += bfs__now() - t0;
    bfs__progress(r, ""); /* every byte of this file written */
cleanup:
    bfs__rank_free(k);
    return rc;
}

/* The file before committed (bfs__rank_finish), then this one's temporary opened, given
 * to the writer, its header queued: once the writer has ended the file before, or the
 * ring is full of this one's units (bfs__unit_push), so that the writer writes the last
 * file's last units meanwhile, and a file is never begun before the one before it is
 * committed. */

static int bfs__rank_start(bfs_run *r, bfs_rank *k)
{
    const int rc = bfs__rank_finish(r, &r->rank[r->rank_cur ^ 1]);
    return rc < 0 ? rc : bfs__rank_begin(r, k);
}

/* The rank file's temporary opened, given to the writer (a slot of its own), its header
 * queued for the writer to build. */
int bfs__rank_begin(bfs_run *r, bfs_rank *k)
{
    int rc = 0;
    const bfs_outfile *of = &r->plan->files[k->fidx];
    k->opened = true;
    BFS_TRY(bfs__rank_open(r, of, &k->t, k->what, sizeof k->what));
    if (r->o->compress_level) {
        BFS_TRY(bfs__zcopy_open(r, of, &k->zt, k->zname, sizeof k->zname));
        BFS_TRY(bfs__zst_writer_create(k->zt.fd, r->o->compress_level, r->o->threads, 0, r->o->compress_mode, &k->zw));
    }
    BFS_TRY(bfs__piece_dig_alloc(r, k->fidx));
    BFS_TRY(k->wslot = bfs__writer_begin_file(&r->w, k->t.fd, k->what, r->piece_dig[k->fidx], k->zw, r->plan, of));
    /* [0, data_start): the length and the text, built by the writer's hash thread in one of
     * its two header buffers (writer.h), with its hash for the slice index (slices.c): a
     * group's headers are built and written while its first units are dequantized (a
     * header too large for a buffer fails there, out of memory) */
    BFS_TRY(bfs__writer_push(&r->w, &(bfs_wjob){.buf = NULL, .len = (size_t)of->data_start, .off = 0, .piece = -1,
                                                .headroom = true, .build = true, .reserve = of->size,
                                                .hex = r->hdr_hex ? r->hdr_hex[k->fidx] : NULL}));
cleanup:
    return rc;
}

/* A batch's identity checks: every input file its tensors come from, once. */
static int bfs__check_batch(bfs_run *r, const bfs_outfile *of, size_t p0, size_t p1)
{
    const unsigned stamp = bfs__stamp_next(r);
    for (size_t k = p0; k < p1; k++) {
        const bfs_piece *pc = &of->pieces[k];
        const bfs_ltensor *pt = &r->plan->t[pc->tensor];
        const size_t np = pt->members ? (size_t)(pc->row1 - pc->row0) * pt->npack : 1;
        for (size_t m = 0; m < np; m++) { /* a packed tensor: the members in the piece */
            const int rc = bfs__check_once(r, bfs__part(pt, pt->members ? (size_t)pc->row0 * pt->npack + m : 0), stamp);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

/* A batch's input pages released (as bfs__advise_sources does for one unit), merged. */
static void bfs__release_batch(bfs_run *r, const bfs_outfile *of, size_t p0, size_t p1)
{
    const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    size_t n = bfs__batch_pages(r->plan, of, p0, p1, pg, false, r->pr);
    bfs__unmap_ranges(r->in, r->pr, n);
    n = bfs__batch_pages(r->plan, of, p0, p1, pg, true, r->pr);
    for (size_t i = 0; i < n; i++)
        bfs__drop_cache(&r->in->files[r->pr[i].file], r->pr[i].a, r->pr[i].b);
}

/* ---- groups (units.h): a window's batches carved from one buffer ---------------------- */
/* The window's buffer done with: the next batch or unit takes the next one. */
void bfs__carve_close(bfs_run *r)
{
    if (r->carved) {
        bfs__slot_next(r);
        r->carved = 0;
    }
}

/* Where batch [p0, p1) of `of` goes: in the window's buffer after the shares before it
 * (units.h: bfs__carve_at), or at the start of the next buffer. */
static int bfs__carve(bfs_run *r, const bfs_outfile *of, size_t p0, size_t p1, uint8_t **out)
{
    const uint64_t len = bfs__pieces_bytes(of, p0, p1);
    const uint64_t cap = r->ring.slot + BFS_DIO_ALIGN, off0 = of->pieces[p0].offset;
    uint64_t at = r->carved ? bfs__carve_at(r->carved, off0, len, cap) : UINT64_MAX;
    if (at == UINT64_MAX) {
        bfs__carve_close(r);
        at = bfs__carve_at(0, off0, len, cap);
        if (at == UINT64_MAX)
            return bfs__err(BFS_EINTERNAL, "%s: a batch of %llu bytes outgrows a buffer of %llu", of->name,
                            (unsigned long long)len, (unsigned long long)cap);
        uint8_t *buf;
        const int rc = bfs__slot_take(r, &buf); /* the writer is done with it */
        if (rc < 0)
            return rc;
    }
    *out = r->buf[r->slot] + at;
    r->carved = at + len > 0 ? at + len : 1;
    return 0;
}

/* Pieces [p0, p1) of a file (bfs__batch_end: whole, together within one buffer) as ONE
 * unit: one identity check before their kernels and one after their source bytes were
 * hashed, one writer job (the writer hashes and cuts each piece), one release of their
 * input pages. The bytes are those bfs__write_piece writes for each piece. */
int bfs__write_batch(bfs_run *r, bfs_rank *rk, const bfs_outfile *of, size_t p0, size_t p1, bool carve)
{
    int rc = 0;
    const uint64_t off0 = of->pieces[p0].offset;
    const bfs_ltensor *last = &r->plan->t[of->pieces[p1 - 1].tensor];
    uint64_t len = 0;
    uint8_t *out = NULL;
    if (bfs__cancelled())
        BFS_FAIL(BFS_EINTR, "interrupted while writing %s (tensor \"%s\")", of->name, last->name);
    if (carve) {
        BFS_TRY(bfs__carve(r, of, p0, p1, &out));
    } else {
        uint8_t *buf;
        BFS_TRY(bfs__slot_take(r, &buf)); /* the writer is done with it */
        out = buf + off0 % BFS_DIO_ALIGN;
    }
    double t0 = bfs__now();
    BFS_TRY(bfs__check_batch(r, of, p0, p1));
    r->t_read += bfs__now() - t0;
    bfs_unit u[BFS_RUN_BATCH];
    uint64_t ua[BFS_RUN_BATCH], ub[BFS_RUN_BATCH];
    int n = 0;
    for (size_t k = p0; k < p1; k++) { /* up to BFS_RUN_BATCH units at a time through run_batch */
        const bfs_piece *pc = &of->pieces[k];
        if (pc->row0 == pc->row1 || pc->nbytes == 0) {
            BFS_TRY(bfs__hash_piece(r, pc)); /* no kernel: its blocks all the same */
            continue;
        }
        bfs_ucur cur = bfs__ucur(&r->plan->t[pc->tensor], pc->row0, pc->row1);
        while (bfs__ucur_next(&cur, UINT64_MAX, &u[n], &ua[n], &ub[n])) { /* whole: a packed one's members */
            u[n].out = out + len;
            len += (u[n].row1 - u[n].row0) * bfs__sub_row_bytes(u[n].t);
            if (++n == BFS_RUN_BATCH) {
                BFS_TRY(bfs__run_units(r, u, ua, ub, n));
                n = 0;
            }
        }
    }
    BFS_TRY(bfs__run_units(r, u, ua, ub, n));
    t0 = bfs__now();
    BFS_TRY(bfs__check_batch(r, of, p0, p1));
    bfs__slot_touch(r, out + len);
    if (!carve) /* a window's pages go after the window (bfs__write_group) */
        bfs__release_batch(r, of, p0, p1);
    r->t_read += bfs__now() - t0;
    BFS_TRY(bfs__unit_push(r, rk, &(bfs_wjob){.buf = out, .len = (size_t)len, .off = off0, .piece = (int)p0,
                                              .piece_last = (int)(p1 - 1), .piece_end = true, .headroom = true},
                           !carve));
    if (carve) /* the buffer is free again once its last share's job is done */
        r->bufjob[r->slot] = bfs__writer_pushed(&r->w);
    bfs__progress(r, last->name);
cleanup:
    return rc;
}

int bfs__write_file(bfs_run *r, int fidx)
{
    int rc = 0;
    bfs_rank *const k = &r->rank[r->rank_cur ^= 1]; /* the other one is the file before */
    const bfs_outfile *of = &r->plan->files[fidx];
    BFS_TRY(bfs__plan_pieces(r->plan, fidx)); /* dropped at its commit (bfs__rank_finish) */
    bfs__rank_reset(k, fidx);
    for (size_t pi = 0, pe; pi < of->npieces; pi = pe) {
        pe = bfs__batch_end(r->plan, of, pi, r->unit_bytes);
        k->pf = r->prefetch ? bfs__prefetch_ahead(r->in, r->plan, of, k->pf, pi) : k->pf; /* a part: by hand */
        if (pe > pi + 1)
            BFS_TRY(bfs__write_batch(r, k, of, pi, pe, false));
        else
            BFS_TRY(bfs__write_piece(r, k, of, pi));
    }
    BFS_TRY(bfs__unit_push(r, k, NULL, false)); /* begun, its waiting units queued (or no pieces) */
    BFS_TRY(bfs__writer_end_file(&r->w, r->file_hex[fidx]));
cleanup:
    return rc; /* on failure, bfs__ranks_abort */
}

/* A window's input pages released, merged across the group's files (units.h). */
int bfs__release_window(bfs_run *r, const bfs_gwalk *gw)
{
    const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    size_t n = bfs__window_pages(gw, r->wsteps, r->nwsteps, pg, false, &r->ws);
    if (n == (size_t)-1)
        return bfs__err(BFS_ENOMEM, "out of memory");
    bfs__unmap_ranges(r->in, r->ws.pr, n);
    n = bfs__window_pages(gw, r->wsteps, r->nwsteps, pg, true, &r->ws);
    if (n == (size_t)-1)
        return bfs__err(BFS_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        bfs__drop_cache(&r->in->files[r->ws.pr[i].file], r->ws.pr[i].a, r->ws.pr[i].b);
    r->nwsteps = 0;
    return 0;
}

int bfs__group_open(bfs_run *r, const int *fidx, int n)
{
    int rc = 0;
    BFS_TRY(bfs__ranks_finish(r)); /* the files before, written one at a time, committed */
    if (!r->grp) { /* off the stack: BFS_GROUP_MAX paths */
        if (!(r->grp = calloc(BFS_GROUP_MAX, sizeof *r->grp)))
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        for (int i = 0; i < BFS_GROUP_MAX; i++)
            r->grp[i].t = r->grp[i].zt = (bfs_tmpfile){.fd = -1, .dirfd = -1};
    }
    for (int g = 0; g < n; g++) {
        BFS_TRY(bfs__plan_pieces(r->plan, fidx[g])); /* dropped at its commit */
        bfs__rank_reset(&r->grp[g], fidx[g]);
        BFS_TRY(bfs__rank_begin(r, &r->grp[g]));
    }
cleanup:
    return rc;
}

int bfs__group_close(bfs_run *r, const int *fidx, int n)
{
    int rc = 0;
    for (int g = 0; g < n; g++) {
        BFS_TRY(bfs__writer_use(&r->w, r->grp[g].wslot));
        BFS_TRY(bfs__writer_end_file(&r->w, r->file_hex[fidx[g]]));
    }
    for (int g = 0; g < n; g++) /* in file order, as one at a time */
        BFS_TRY(bfs__rank_finish(r, &r->grp[g]));
cleanup:
    return rc;
}

/* both rank files in flight committed, the older first */
int bfs__ranks_finish(bfs_run *r)
{
    const int rc = bfs__rank_finish(r, &r->rank[r->rank_cur ^ 1]);
    return rc < 0 ? rc : bfs__rank_finish(r, &r->rank[r->rank_cur]);
}

/* after a failure: the writer idle, both rank files' temporaries removed */
void bfs__ranks_abort(bfs_run *r)
{
    if (r->w.mu_init)
        bfs__writer_wait(&r->w, 0); /* the writer may still hold our buffers and files */
    r->npend = 0; /* units that waited for their file: never queued */
    for (int i = 0; i < 2; i++) {
        r->rank[i].active = false;
        bfs__rank_free(&r->rank[i]);
    }
    for (int i = 0; r->grp && i < BFS_GROUP_MAX; i++) {
        r->grp[i].active = false;
        bfs__rank_free(&r->grp[i]);
    }
}

/* A reused file's source bytes, for the source hashes: each piece as one unit, read
 * without its kernel (in the same order and under the same checks as bfs__write_piece). */
int bfs__hash_reused_sources(bfs_run *r, int fidx)
{
    const bfs_outfile *of = &r->plan->files[fidx];
    for (size_t pi = 0; pi < of->npieces; pi++) {
        const int rc = bfs__hash_piece(r, &of->pieces[pi]);
        if (rc < 0)
            return rc;
    }
    return 0;
}
