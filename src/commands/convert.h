/*
 * convert.h: private to bfs_convert (convert.c: setup, start, finish, orchestration;
 * convert_ranks.c: the rank-file stage). The run's state and the functions the two share.
 */
#ifndef BFS_CONVERT_H
#define BFS_CONVERT_H

#include "commands/commands.h"
#include "backend/backend.h"
#include "plan/plan.h"
#include "output/durable.h"
#include "output/outdir.h"
#include "input/srchash.h"
#include "output/writer.h"

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

/* a piece being cut into units (bfs__piece_begin, bfs__piece_step) */
typedef struct bfs_pcur {
    size_t pi;
    const bfs_ltensor *t;
    uint64_t rows_per_unit, off; /* off: the next unit's offset in the file */
    bfs_ucur cur, span;
    bool more;
} bfs_pcur;

/* a rank file between its open and its commit (bfs__write_file, bfs__rank_finish) */
typedef struct bfs_rank {
    bool active;                 /* not yet committed (or aborted) */
    bool opened;                 /* bfs__rank_start ran */
    int fidx, wslot;
    bfs_tmpfile t, zt;           /* the rank file's temporary, its compressed copy's */
    bfs_zst_writer *zw;
    char zname[NAME_MAX + 1];
    char what[PATH_MAX + 64];    /* the temporary's path, for messages (the writer's too) */
    size_t pf;                   /* pieces [0, pf) read ahead (bfs__prefetch_pieces) */
    size_t pi;                   /* (interleaved files) the next piece, and the one being cut */
    bool in_piece;
    bfs_pcur pc;
} bfs_rank;

typedef struct bfs_run {
    const bfs_convert_opts *o;
    const char *outdir;
    int dirfd;
    bfs_input *in;
    bfs_plan *plan;
    bfs_backend *be;
    uint8_t *buf[BFS_RING_MAX]; /* the ring of unit buffers (units.h), ring.n of them */
    uint64_t bufjob[BFS_RING_MAX]; /* per buffer: the writer job that last used it + 1 (bfs__writer_wait_job) */
    uint64_t touched[BFS_RING_MAX]; /* per buffer: the end of the bytes filled in it so far (BFSHARD_STAGES) */
    bool buf_pinned;           /* buf[] from the backend's host_alloc (CUDA: pinned, D2H lands in place) */
    bfs_ring ring;             /* units' target size, each buffer's capacity, how many */
    uint64_t unit_bytes;       /* ring.unit */
    bfs_writer w;
    char (*file_hex)[33];      /* per output file */
    char (*file_sha)[65];      /* per output file: SHA-256 (--sha256), else NULL */
    json_t **zst;              /* per output file: its compressed copy's manifest entry */
    bfs_dig16 **piece_dig;     /* per output file, per piece: its XXH3-128 */
    char (*hdr_hex)[33];       /* per output file: XXH3-128 of its header bytes, as written ("": not known) */
    char (*slices_hex)[33];    /* per output file: its slice index's XXH3-128, once written ("": not yet) */
    char (*slices_sha)[65];    /* per output file: its SHA-256 (--sha256), else NULL */
    bool *reused;
    char fingerprint[33];
    char (*src_hex)[33];       /* per input file: its content hash (a part: its terms' sum, srchash.c) */
    bool *unit_read;           /* per input tensor (in->raw): some unit reads it (bfs__sources_read) */
    bfs_srchash *sh;           /* the source hashes, from the bytes the kernels read (srchash.c) */
    json_t *aux;               /* extra files written: manifest files[] entries */
    bfs_sides sides;           /* the input folder's side files: copied or skipped (convert_side.c) */
    json_t *skipped;           /* the manifest's skipped[]: those not copied, and why */
    /* a part; mine == NULL for a whole run */
    bool *mine;                /* per output file: this part writes it */
    bool prefetch;             /* a part: input maps MADV_RANDOM, its ranges read ahead by hand */
    char part[128];            /* the canonical rank list */
    char pname[NAME_MAX + 1], jname[NAME_MAX + 1]; /* the part's manifest and journal */
    uint64_t part_bytes;       /* tensor bytes the part writes */
    uint64_t src_read;         /* input bytes the source-hash terms of this run cover (srchash.c) */
    uint64_t in_read;          /* input bytes read: headers, the units' ranges, bytes read to hash */
    uint64_t dev_read0;        /* bfs__device_read_bytes() when the run began */
    bfs_outdir_lock lock;      /* one writer per OUTDIR */
    double t_dequant, t_commit; /* stage times (BFSHARD_STAGES=1) */
    double t_read;             /* the input's identity checks, source hashes, read-ahead, release */
    double t_files0;           /* bfs__now() when the rank files began (0: not yet) */
    double t_input, t_plan, t_layout, t_setup, t_files, t_manifest; /* and the phases around the rank files */
    int slot;                  /* the unit buffer to fill next (bfs__slot_next) */
    int live;                  /* buffers used so far: [0, live) (bfs__slot_next) */
    uint64_t waited;           /* units that waited in the ring for their file (BFSHARD_STAGES) */
    uint64_t interleaved;      /* a group's units cut in turn with another file's piece (BFSHARD_STAGES) */
    bfs_wjob pend[BFS_RING_MAX]; /* a file's first units, waiting for the file before to be committed */
    int pend_slot[BFS_RING_MAX], npend; /* their buffers (-1: none) */
    bfs_prange *pr;            /* a batch's input pages (BFS_BATCH_MAX * BFS_UNIT_MAX_SRC) */
    unsigned *fstamp, stamp;   /* per input file: the last batch check that took it */
    bfs_rank rank[2];          /* the rank file being written, and the one before (committing) */
    int rank_cur;
    int group;                 /* rank files written together (units.h: bfs__group_size); 1: one at a time */
    bfs_rank *grp;             /* a group's files (bfs__write_group), BFS_GROUP_MAX once a group runs */
    uint64_t carved;           /* bytes of buffer r->slot a window's batches took (0: none yet) */
    bfs_gstep *wsteps;         /* a window's batches, to release their input pages after it */
    size_t nwsteps, cwsteps;
    bfs_wscratch ws;           /* their input pages (units.h) */
} bfs_run;

/* convert.c */
/* Progress: bytes the writer has written (not merely queued), with each stage's busy
 * fraction so far (convert_stages.c); the run's last report, once every file is written, has
 * bytes_done == bytes_total (convert.c: done). */
void bfs__progress_run(bfs_run *r, const char *tensor, bool done);
static inline void bfs__progress(bfs_run *r, const char *tensor)
{
    if (r->o->progress)
        bfs__progress_run(r, tensor, false);
}
/* Each stage's busy fraction over el seconds (0: since the rank files began; bfs_progress's busy_*). */
void bfs__busy(bfs_run *r, double el, double *read, double *dequant, double *hash, double *write);

/* convert_ranks.c */
void bfs__rank_free(bfs_rank *k);
/* k zeroed for file fidx */
void bfs__rank_reset(bfs_rank *k, int fidx);
/* The rank file's temporary opened, given to the writer, its header queued. */
int bfs__rank_begin(bfs_run *r, bfs_rank *k);
/* Its commit once the writer has ended it: fdatasync, rename, journal line, slice index. */
int bfs__rank_finish(bfs_run *r, bfs_rank *k);
/* Pieces [p0, p1) of a file as one unit (bfs__batch_end); carve: in a group's window buffer. */
int bfs__write_batch(bfs_run *r, bfs_rank *rk, const bfs_outfile *of, size_t p0, size_t p1, bool carve);
/* Piece pi of a file begun (*done: nothing more to do, an empty piece pushed), then cut into
 * units, one a step (*done after its last). */
int bfs__piece_begin(bfs_run *r, bfs_rank *rk, const bfs_outfile *of, size_t pi, bfs_pcur *pc, bool *done);
int bfs__piece_step(bfs_run *r, bfs_rank *rk, const bfs_outfile *of, bfs_pcur *pc, bool *done);
int bfs__write_file(bfs_run *r, int fidx);
/* (convert_inter.c) Files fidx[0..n) (2 <= n <= BFS_GROUP_MAX, consecutive, none reused)
 * written together (units.h: groups), each committed in order at the end. */
int bfs__write_group(bfs_run *r, const int *fidx, int n);
/* A group's files begun (the files before committed first), and at its end ended and
 * committed in file order. */
int bfs__group_open(bfs_run *r, const int *fidx, int n);
int bfs__group_close(bfs_run *r, const int *fidx, int n);
/* convert_inter.c: the same for files that hold different tensors (the HF layout): their
 * units interleaved, one each in turn, so that the writer's lanes write them at once. */
int bfs__write_interleaved(bfs_run *r, const int *fidx, int n);
/* (convert_ranks.c, for bfs__write_group) the window's buffer done with: the next batch or
 * unit takes the next one; a window's input pages released, merged across the group's files */
void bfs__carve_close(bfs_run *r);
int bfs__release_window(bfs_run *r, const bfs_gwalk *gw);
/* Bytes up to `end` of the current buffer (r->slot) filled: what BFSHARD_STAGES reports
 * as the buffers' touched bytes, beside the memory model's count (units.h). */
static inline void bfs__slot_touch(bfs_run *r, const uint8_t *end)
{
    const uint64_t n = (uint64_t)(end - r->buf[r->slot]);
    r->touched[r->slot] = n > r->touched[r->slot] ? n : r->touched[r->slot];
}

/* The unit buffer to fill next, once the writer is done with it (bfs__slot_pushed after its push). */
int bfs__slot_take(bfs_run *r, uint8_t **buf);
void bfs__slot_pushed(bfs_run *r);
int bfs__ranks_finish(bfs_run *r);
void bfs__ranks_abort(bfs_run *r);
int bfs__zcopy_reused(bfs_run *r, int fidx);
int bfs__hash_reused_sources(bfs_run *r, int fidx);
int bfs__rehash_pieces(bfs_run *r, int fidx);
/* File fidx's slice index (slices.h) written from its pieces' hashes, which are then freed:
 * at its commit, so that the hashes held do not grow with files x tensors. */
int bfs__file_slices(bfs_run *r, int fidx);
/* File fidx's piece hashes (r->piece_dig[fidx]) allocated, when they are not yet. */
int bfs__piece_dig_alloc(bfs_run *r, int fidx);

/* BFSHARD_STAGES=1: the run's seconds per stage, one JSON line on stderr (make bench). */
void bfs__stages_print(const bfs_run *r, double total);
/* A small file written durably into OUTDIR (convert.c); kind != NULL: recorded in the
 * manifest's files[] with that kind. */
int bfs__write_small(bfs_run *r, const char *name, const void *data, size_t len, const char *kind);
/* The side files (convert_side.c): listed, skipped ones logged and recorded, auto_map
 * checked, before any rank file; their names and contents into the fingerprint (convert.c copies
 * them at the end, with the other small files). */
int bfs__side_plan(bfs_run *r);
int bfs__side_fingerprint(const bfs_run *r, XXH3_state_t *st);
/* fn(ctx, name, bytes) for each side file to be copied, read again (bfs__side_read: still the
 * file that was listed); stops at fn's first failure. */
int bfs__sides_each(const bfs_run *r, int (*fn)(void *ctx, const char *name, const char *data, size_t len), void *ctx);

#endif
