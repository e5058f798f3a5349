/* How a conversion's work and memory are sized (units.c): the ring of unit buffers (THE
 * rule: convert allocates them, inspect reports them), batches of small
 * pieces and the input pages they read, the buffers' page size, and the memory model a
 * run touches, from which inspect predicts the peak RSS and convert --max-rss picks --mem. */
#ifndef BFS_UNITS_H
#define BFS_UNITS_H

#include "plan/plan.h"
#include "input/srchash.h" /* BFS_SRC_HASH_WINDOW, in the memory model */

#include <stdbool.h>
#include <stdint.h>

#define BFS_DEFAULT_MEM (256ull << 20)
/* O_DIRECT alignment of file offsets, lengths and buffer addresses; also the headroom
 * convert leaves before each unit's output (see bfs_wjob.headroom) */
#define BFS_DIO_ALIGN 4096u
/* the writer's carry buffer (its own allocation, counted by inspect) */
#define BFS_CARRY_BYTES (1u << 20)

/* The ring of unit buffers (to keep the disk busy). Units of about BFS_UNIT_BYTES
 * (never less than one dim-0 row, never more than --mem/2, no bigger than the largest
 * piece or batch needs), each dequantized into the next of `n` buffers and drained by the
 * writer in order, so the writer always has the next unit queued, across tensors and rank
 * files. The ring is --mem up to BFS_RING_BYTES or 4 buffers, whichever is more: beyond
 * that a bigger --mem buys no more overlap, only coarser units, bubbles and first-touch
 * faults (measured: --mem 1G was slower than 64M), so it is not used. 2 <= n <= BFS_RING_MAX. */
#define BFS_UNIT_BYTES (8ull << 20)
#define BFS_RING_BYTES (64ull << 20)
#define BFS_RING_MAX 16
typedef struct bfs_ring {
    uint64_t unit;  /* a unit's target bytes: rows per unit = max(1, unit / row bytes) */
    uint64_t slot;  /* each buffer's capacity: the largest unit (a row may pass `unit`) */
    int n;          /* buffers */
} bfs_ring;
/* The ring for --mem `mem` (0: the default). mine: per output file, whether this run
 * writes it (NULL: all). Returns false when the largest indivisible unit (one dim-0 row)
 * exceeds mem/2 (two must be in flight). */
#define BFS_BATCH_BYTES (8ull << 20)
bool bfs__ring_budget(const bfs_plan *p, const bool *mine, uint64_t mem, bfs_ring *rg);
/* rows of a tensor whose rows are row_bytes long in one unit (convert and the model alike) */
static inline uint64_t bfs__unit_rows(const bfs_ring *rg, uint64_t row_bytes)
{
    return row_bytes == 0 ? UINT64_MAX : rg->unit / row_bytes > 0 ? rg->unit / row_bytes : 1;
}

/* Batches: consecutive whole pieces of one file whose bytes together fit one unit
 * buffer and BFS_BATCH_BYTES go through the pipeline as ONE unit (one identity check, one writer job, one
 * release of their input pages), so that a model of many small tensors does not pay
 * per-tensor syscalls and hand-offs. Returns the end of the batch that begins at piece
 * pi: > pi + 1 for a batch, pi + 1 for a piece on its own (cut into units of rows,
 * bfs__write_piece). At most BFS_BATCH_MAX kernel units (a packed tensor's piece: one per member). */
#define BFS_BATCH_MAX 4096
size_t bfs__batch_end(const bfs_plan *p, const bfs_outfile *of, size_t pi, uint64_t unit_bytes);
/* The bytes of pieces [p0, p1) of `of` together (a batch's) */
static inline uint64_t bfs__pieces_bytes(const bfs_outfile *of, size_t p0, size_t p1)
{
    uint64_t n = 0;
    for (size_t k = p0; k < p1; k++)
        n += of->pieces[k].nbytes;
    return n;
}
/* Reading ahead by hand, for a run whose input maps are MADV_RANDOM (a part: no readahead
 * past its thin bands of each weight): MADV_WILLNEED on exactly the source ranges of pieces
 * [p0, p1) of `of` (page-rounded outward, neighbours within a few pages joined), so that the
 * storage delivers those bytes, asynchronously, while the pieces before them dequantize. */
void bfs__prefetch_pieces(const bfs_input *in, const bfs_plan *p, const bfs_outfile *of, size_t p0, size_t p1,
                          uint64_t *dry); /* dry: the bytes it would ask for, added there; nothing advised */
/* The window: pieces [0, pf) read ahead already, piece pi next to be written: those whose data
 * starts within BFS_PREFETCH_AHEAD of pi's read ahead now, so that requests are in flight
 * while pi's units dequantize. Returns the new pf. */
#define BFS_PREFETCH_AHEAD (128ull << 20)
size_t bfs__prefetch_ahead(const bfs_input *in, const bfs_plan *p, const bfs_outfile *of, size_t pf, size_t pi);
/* The input pages that pieces [p0, p1) of `of` read (dim-0 rows of their sources),
 * outward to pages of `pg` bytes (inward: only the pages they read whole; none where a
 * source range holds no whole page), sorted by (file, offset) and merged where they touch:
 * at most BFS_UNIT_MAX_SRC per kernel unit (bfs__batch_end: BFS_BATCH_MAX units) into out. Returns how many. */
typedef struct bfs_prange {
    int file;
    uint64_t a, b; /* page-aligned [a, b) of the file (b may pass its end by < pg) */
} bfs_prange;
size_t bfs__batch_pages(const bfs_plan *p, const bfs_outfile *of, size_t p0, size_t p1, uint64_t pg, bool inward,
                        bfs_prange *out);
/* The bytes of ranges pr[0..n) together */
static inline uint64_t bfs__pranges_bytes(const bfs_prange *pr, size_t n)
{
    uint64_t b = 0;
    for (size_t i = 0; i < n; i++)
        b += pr[i].b - pr[i].a;
    return b;
}

/* Groups (against a per-piece cost). In the DCP layout every rank file holds a slice of
 * every tensor, so written one after another, W files read each input page W times, and
 * with tiny tensors each of those reads faults the page in again (the pages are released
 * after each unit, so that the resident set does not grow with the model). Up to
 * BFS_GROUP_MAX rank files are therefore written together, tensor-major, window by window:
 * a window is the same run of tensors in every file of the group (their common file order:
 * alignment, then name), each file's small pieces a batch carved from ONE ring buffer
 * (each file a share `cap` of it), so a window's input pages are faulted once for the
 * group and released after it. Large pieces are cut into units as bfs__write_piece does.
 * In the HF layout (files of different tensors) a group's files are interleaved unit by
 * unit instead (convert_inter.c), so that the writer's lanes write them at once: at most
 * half the ring's buffers of them (at least 2), each unit as written alone.
 * bfs__group_size picks G (1: one file at a time, as before): the
 * files this run writes, two headers (a group takes turns with two buffers) and every file's
 * carry within --mem / 2, a share of at
 * least BFS_GROUP_MIN_SHARE; BFSHARD_GROUP=N caps it (bench and tests). Convert and the
 * memory model walk the same steps (bfs__gwalk_next). */
#define BFS_GROUP_MAX 32
#define BFS_GROUP_MIN_SHARE 4096u
int bfs__group_size(const bfs_plan *p, const bool *mine, const bfs_ring *rg, uint64_t mem);
typedef struct bfs_gwalk {
    const bfs_plan *p;
    int n;                     /* files in the group */
    int f[BFS_GROUP_MAX];      /* their indices in the plan */
    size_t pi[BFS_GROUP_MAX];  /* each one's next piece */
    uint64_t cap;              /* a file's share of the window's buffer: its batches' bytes */
    uint64_t kmax;             /* the window's last tensor, by its file-order key */
    int g;
    bool in_window;
} bfs_gwalk;
typedef struct bfs_gstep {
    bool window_end;           /* the window's last step was the one before: release its pages */
    int g;                     /* the file (index in the group) */
    size_t p0, p1;             /* its pieces */
    bool batch;                /* [p0, p1) as one batch carved from the window's buffer; else
                                * piece p0 (p1 = p0 + 1) cut into units */
} bfs_gstep;
void bfs__gwalk_init(bfs_gwalk *gw, const bfs_plan *p, const int *files, int n, const bfs_ring *rg);
/* The next step; false once every file of the group is done (after a window_end). */
bool bfs__gwalk_next(bfs_gwalk *gw, bfs_gstep *s);
/* Where a batch of len bytes at file offset off goes in a buffer whose first `used` bytes
 * are taken (0: a fresh buffer): its output at the returned offset (aligned + off % 4096:
 * the writer's headroom before it, as in a unit of its own), or UINT64_MAX when it does
 * not fit the buffer's `cap` bytes. */
static inline uint64_t bfs__carve_at(uint64_t used, uint64_t off, uint64_t len, uint64_t cap)
{
    const uint64_t base = (used + BFS_DIO_ALIGN - 1) / BFS_DIO_ALIGN * BFS_DIO_ALIGN;
    return base + off % BFS_DIO_ALIGN + len <= cap ? base + off % BFS_DIO_ALIGN : UINT64_MAX;
}
/* The input pages the batch steps[0..n) of a window read, as bfs__batch_pages gives them
 * for one file: per tensor, the rows of all the group's files together (consecutive ranks:
 * one range of rows), sorted and merged into ws->pr. Returns how many, or (size_t)-1 out
 * of memory. ws: zeroed before the first call, bfs__wscratch_free after the last. */
typedef struct bfs_wscratch {
    uint64_t *lo, *hi;   /* per tensor of the plan: the window's rows (lo > hi: none yet) */
    int *list;           /* the window's tensors */
    size_t nlist, clist;
    bfs_prange *pr;
    size_t cpr;
} bfs_wscratch;
size_t bfs__window_pages(const bfs_gwalk *gw, const bfs_gstep *steps, size_t n, uint64_t pg, bool inward,
                         bfs_wscratch *ws);
void bfs__wscratch_free(bfs_wscratch *ws);

/* The writer's lanes (writer.h: a writer thread and a hash thread each, owning whole files):
 * files written at once spread over min(files, threads) lanes, at most BFS_WRITER_LANES, so
 * that a group's files are written and hashed on as many threads as the run has; files
 * written one at a time (a group of 1) take one lane, as each file begins only once the one
 * before is committed. threads <= 0: one per online CPU. BFSHARD_WRITERS=N sets the lanes
 * (up to the group) whatever the CPUs (tests and bench). */
#define BFS_WRITER_LANES 16
int bfs__writer_lanes(int group, int threads);

/* The unit buffers' page: BFS_HUGE_PAGE where transparent huge pages may back them
 * (/sys/kernel/mm/transparent_hugepage/enabled not "never"; BFSHARD_HUGEPAGES=0 turns
 * them off), else 4096. Convert allocates the buffers on it and advises MADV_HUGEPAGE:
 * the transposed kernels write each unit in runs to thousands of rows, one TLB entry per
 * 2 MiB instead of per 4 KiB (measured: 0.56x -> 1.1x memcpy). The memory model counts
 * the buffers' pages in it. */
#define BFS_HUGE_PAGE ((uint64_t)2 << 20)
uint64_t bfs__buf_page(void);

/* The memory a convert with this plan and --mem touches, unit by unit as convert cuts
 * them (bfs__mem_model walks the same units): what inspect adds to its own resident
 * set (the program, the plan, the input headers) to predict convert's peak RSS. It counts
 * every buffer of the ring touched, as when the writer lags behind the dequant; a run whose
 * writer keeps up takes turns on fewer of them (convert's bfs__slot_next), and peaks lower
 * by the buffers it never used (BFSHARD_STAGES: buffers_used, buffers_touched_bytes). */
typedef struct bfs_mem_model {
    bfs_ring ring;         /* bfs__ring_budget's */
    uint64_t unit_bytes;   /* each buffer's capacity (ring.slot), + BFS_DIO_ALIGN headroom */
    /* at the unit where their sum peaks: */
    uint64_t buffers;      /* pages of the ring's buffers touched so far (they keep them) */
    uint64_t input;        /* mapped input pages the unit reads (released after it) */
    uint64_t fixed;        /* the writer's carries, the headers held, the source-hash window, thread stacks */
    int group;             /* bfs__group_size's */
} bfs_mem_model;
int bfs__mem_model(const bfs_plan *p, const bool *mine, uint64_t mem, int nthreads, bfs_mem_model *m);
/* base (the resident set besides the model's parts, bfs__base_rss) + the
 * model = the predicted peak. threads <= 0: one per online CPU. */
int bfs__predict_rss(const bfs_plan *p, const bool *mine, uint64_t mem, int threads, uint64_t base, bfs_mem_model *m,
                     uint64_t *peak);
/* The program, the input headers, the plan and the largest header of the files this run
 * writes (mine: per output file; NULL: all): a deterministic estimate. */
uint64_t bfs__base_rss(const bfs_input *in, const bfs_plan *p, const bool *mine);
/* o->mem, or for o->max_rss the largest --mem up to the default (in 64 KiB steps)
 * whose predicted peak fits: BFS_ENOMEM naming the least peak when none does. */
int bfs__pick_mem(const bfs_input *in, const bfs_plan *p, const bool *mine, const bfs_convert_opts *o, uint64_t *mem);

#endif
