/*
 * Source hashes: what the manifest records of each input file ("content_xxh3_128", scheme
 * "blocks-1", docs/MANIFEST.md) is computed from exactly the bytes that were dequantized,
 * not from a separate pass, and is a sum of terms that each part of a conversion in parts
 * (convert --ranks) computes from the rows it reads itself:
 *
 *   content_xxh3_128(file) = XXH3-128(bytes [0, data_start), seed 0)
 *                          + sum over the file's blocks of XXH3-128(block bytes, seed = the
 *                            block's absolute offset in the file),   mod 2^128
 *   (each XXH3-128 as the integer high64 * 2^64 + low64; the sum in canonical big-endian hex)
 *
 * The blocks cut each tensor's data [0, n) for the run's world size W:
 *   - a tensor some unit reads, as source range i of output tensor t (bfs__unit_sources):
 *     rank k, holding rows [a, b) of t (dcp: a = k * ceil(d0 / W); hf: [0, d0)), has the
 *     block from E(a) to E(b), E(x) the end of range i of rows [0, x) (E(0) = 0), and the
 *     last rank with rows (b = d0) to n: the bytes its kernels read that no lower rank's
 *     read (bfs__unit_hash_blocks), each byte in one block;
 *   - a tensor no unit reads (quant state, shapes, dropped scales): one block, rank 0's;
 *   - empty blocks (a rank without rows, a 0-byte tensor) add nothing.
 * A run adds its ranks' blocks, and rank 0's terms (the header, the tensors no unit reads)
 * when it holds rank 0: a whole run adds them all; a part records its sum per file and
 * merge adds the parts' (mod 2^128), the whole run's value. Every byte of the input is in
 * exactly one term: `source_bytes_hashed` of a whole run is the input's size, and the
 * parts' add up to it. The blocks follow the plan (W, rows, formats), never the units: a
 * part's --mem or threads do not change them.
 *
 * How each block's hash comes from the bytes the kernels read: convert.c runs a unit as
 * identity check -> kernel -> bfs__srchash_ranges() -> identity check, and the unit's
 * ranges (the same mapping the kernel read) are streamed into their blocks in order,
 * every byte once: a tensor's units read increasing rows in each rank file, and the rank
 * files begin it in rank order, so a block is hashed from its start as its rank's units
 * reach it (a range re-read -- a scale row shared by two units, bnb's 1 KiB nested code --
 * is hashed the first time). Rank files written one after another end a block when the
 * next one begins; interleaved unit by unit (a group's large pieces, convert_ranks.c) they
 * keep one block each open at once (bfs__srchash_hold). A block
 * read whole by one unit is hashed in one call. The identity (device, inode, size, mtime,
 * ctime) is the same before the kernel and after the hash, so no write reached the file
 * between the kernel's read and the hash's read: they read the same bytes. A file that
 * changed fails the run (BFS_EINPUT) before its manifest exists. Rank files reused by a
 * resumed run are hashed the same way without their kernels. Bytes of a block no unit
 * read (none, for the formats of the table: a format's ranges cover its tensors) and the
 * tensors only the planner reads are read here from the same mapping, before the unit's
 * ranges or at the end, under the same identity checks (convert checks every input after
 * bfs__srchash_finish).
 */
#include "input/srchash.h"
#include "base/bfs_io.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Bytes no kernel read (the rest of a block, tensors only the planner reads) are hashed
 * through the map in windows of BFS_SRC_HASH_WINDOW, each window's whole pages dropped
 * from the mapping behind it (MADV_DONTNEED: a read-only file map re-faults them if read
 * again), so that the resident set does not grow with them -- the memory model counts
 * one window. */
static void bfs__hash_mapped(XXH3_state_t *st, const uint8_t *p, uint64_t n)
{
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (uint64_t o = 0; o < n;) {
        const size_t w = n - o < BFS_SRC_HASH_WINDOW ? (size_t)(n - o) : BFS_SRC_HASH_WINDOW;
        if (st) { /* asked for whole: a part's maps read no further than asked (MADV_RANDOM) */
            const uintptr_t wa = (uintptr_t)(p + o) / pg * pg;
            (void)madvise((void *)wa, (uintptr_t)(p + o + w) - wa, MADV_WILLNEED);
            bfs__xxh128_update(st, p + o, w);
        }
        const uintptr_t a = ((uintptr_t)(p + o) + pg - 1) / pg * pg, b = (uintptr_t)(p + o + w) / pg * pg;
        if (b > a)
            (void)madvise((void *)a, b - a, MADV_DONTNEED);
        o += w;
    }
}

/* a block begun and not yet closed: [lo, hi) of raw tensor `raw`'s data, [lo, cursor) hashed */
typedef struct {
    size_t raw;
    uint64_t lo, hi, cursor;
    XXH3_state_t *st; /* while partly hashed */
} bfs_sblock;

typedef struct {
    uint64_t a, b;
} bfs_span;

typedef struct {
    uint64_t front;   /* the end of the last block begun: a tensor's blocks begin in increasing order */
    uint32_t nopen;   /* its blocks open (in bfs_srchash.open) */
    /* the union of the units' ranges read, counted once: sorted disjoint spans */
    uint32_t nsp, csp;
    bfs_span *sp;
} bfs_tensor_hash;

struct bfs_srchash {
    const bfs_input *in;
    const bool *unit_read; /* per raw tensor */
    bool rank0, dry;
    bool hold;             /* bfs__srchash_hold */
    bfs_tensor_hash *th;   /* per raw tensor (in->raw) */
    bfs_sblock *open;      /* the blocks open, of every tensor (a few: one per rank file in flight) */
    size_t nopen, copen;
    uint64_t (*sum)[2];    /* per file: this run's terms added, {low64, high64} */
    uint64_t read, hashed;
    XXH3_state_t *one;     /* a block hashed whole (the same digest as XXH3_128bits_withSeed) */
};

void bfs__srchash_free(bfs_srchash *h)
{
    if (!h)
        return;
    for (size_t i = 0; i < h->nopen; i++)
        XXH3_freeState(h->open[i].st);
    free(h->open);
    for (size_t i = 0; h->th && i < h->in->nraw; i++)
        free(h->th[i].sp);
    free(h->th);
    free(h->sum);
    XXH3_freeState(h->one);
    free(h);
}

static void bfs__term_add(bfs_srchash *h, int file, XXH128_hash_t d)
{
    uint64_t *s = h->sum[file];
    s[0] += d.low64;
    s[1] += d.high64 + (s[0] < d.low64);
}

int bfs__srchash_create(const bfs_input *in, const bool *unit_read, bool rank0, bool dry, bfs_srchash **out)
{
    int rc = 0;
    bfs_srchash *h = calloc(1, sizeof *h);
    *out = NULL;
    if (!h)
        return bfs__err(BFS_ENOMEM, "out of memory");
    h->in = in;
    h->unit_read = unit_read;
    h->rank0 = rank0;
    h->dry = dry;
    h->sum = calloc((size_t)in->nfiles + 1, sizeof *h->sum);
    h->th = calloc(in->nraw + 1, sizeof *h->th);
    h->one = dry ? NULL : XXH3_createState();
    if (!h->sum || !h->th || (!dry && !h->one))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (int f = 0; f < in->nfiles; f++) {
        const uint64_t n = in->files[f].h.data_start;
        h->read += n; /* every run reads every header to plan */
        if (!rank0)
            continue;
        h->hashed += n;
        if (!dry)
            bfs__term_add(h, f, XXH3_128bits(in->files[f].map, (size_t)n));
    }
    *out = h;
    h = NULL;
cleanup:
    bfs__srchash_free(h);
    return rc;
}

/* bytes [b->cursor, to) of r's open block b, which no kernel read, from the map */
static int bfs__block_fill(bfs_srchash *h, const bfs_raw *r, bfs_sblock *b, uint64_t to)
{
    if (to <= b->cursor)
        return 0;
    if (!h->dry && !b->st) {
        if (!(b->st = XXH3_createState()))
            return bfs__err(BFS_ENOMEM, "out of memory hashing tensor \"%s\"", r->st->name);
        XXH3_128bits_reset_withSeed(b->st, r->file_offset + b->lo);
    }
    bfs__hash_mapped(h->dry ? NULL : b->st, r->data + b->cursor, to - b->cursor);
    h->read += to - b->cursor;
    b->cursor = to;
    return 0;
}

/* open block k hashed to its end (the rest from the map): its term added, k no longer open */
static int bfs__block_close(bfs_srchash *h, size_t k)
{
    bfs_sblock *const b = &h->open[k];
    const bfs_raw *r = &h->in->raw[b->raw];
    const int rc = bfs__block_fill(h, r, b, b->hi);
    if (rc < 0)
        return rc;
    if (b->st) /* (none: dry, or added whole by the caller) */
        bfs__term_add(h, r->file, XXH3_128bits_digest(b->st));
    XXH3_freeState(b->st);
    h->hashed += b->hi - b->lo;
    h->th[b->raw].nopen--;
    h->open[k] = h->open[--h->nopen];
    return 0;
}

/* [a, e) of a tensor's data read by a unit, added to the union of its reads: *added, the
 * bytes not in it before. A tensor's ranges come in increasing order per rank file (new
 * spans at the end), in turn between rank files when their units are interleaved. */
static int bfs__read_add(bfs_tensor_hash *t, uint64_t a, uint64_t e, uint64_t *added)
{
    *added = 0;
    if (e <= a)
        return 0;
    uint32_t i = t->nsp, j = t->nsp; /* spans [i, j) touch [a, e) */
    while (i > 0 && t->sp[i - 1].b >= a)
        i--;
    while (j > i && t->sp[j - 1].a > e)
        j--;
    uint64_t covered = 0, na = a, nb = e;
    for (uint32_t k = i; k < j; k++) {
        const uint64_t oa = a > t->sp[k].a ? a : t->sp[k].a, ob = e < t->sp[k].b ? e : t->sp[k].b;
        covered += ob > oa ? ob - oa : 0;
        na = t->sp[k].a < na ? t->sp[k].a : na;
        nb = t->sp[k].b > nb ? t->sp[k].b : nb;
    }
    *added = (e - a) - covered;
    if (j == i) { /* a span of its own */
        if (t->nsp == t->csp) {
            const uint32_t c = t->csp ? 2 * t->csp : 1;
            bfs_span *p = realloc(t->sp, (size_t)c * sizeof *p);
            if (!p)
                return -1;
            t->sp = p;
            t->csp = c;
        }
        memmove(&t->sp[i + 1], &t->sp[i], (size_t)(t->nsp - i) * sizeof *t->sp);
        t->nsp++;
    } else { /* spans [i, j) merged into one */
        memmove(&t->sp[i + 1], &t->sp[j], (size_t)(t->nsp - j) * sizeof *t->sp);
        t->nsp -= j - i - 1;
    }
    t->sp[i] = (bfs_span){na, nb};
    return 0;
}

/* the block [lo, hi) of raw tensor ri that a range falls in: *k, the open one or one begun;
 * 0 when it was closed already (a range re-read after its block's end) */
static int bfs__block_enter(bfs_srchash *h, size_t ri, uint64_t lo, uint64_t hi, size_t *k)
{
    const bfs_raw *r = &h->in->raw[ri];
    bfs_tensor_hash *const t = &h->th[ri];
    for (size_t i = 0; t->nopen > 0 && i < h->nopen;) {
        const bfs_sblock *b = &h->open[i];
        if (b->raw != ri) {
            i++;
            continue;
        }
        if (b->lo == lo && b->hi == hi) {
            *k = i;
            return 1;
        }
        if (!h->hold && lo >= b->hi) { /* the last unit of its rank has passed */
            const int rc = bfs__block_close(h, i);
            if (rc < 0)
                return rc;
            continue; /* the last open block moved into i */
        }
        if (!h->hold || (lo < b->hi && hi > b->lo))
            return bfs__err(BFS_EINTERNAL, "%s: tensor \"%s\": source block [%llu, %llu) while [%llu, %llu) is open",
                            h->in->files[r->file].path, r->st->name, (unsigned long long)lo, (unsigned long long)hi,
                            (unsigned long long)b->lo, (unsigned long long)b->hi);
        i++;
    }
    if (hi <= t->front)
        return 0; /* hashed already: a range re-read after its block's end */
    if (lo < t->front)
        return bfs__err(BFS_EINTERNAL, "%s: tensor \"%s\": source block [%llu, %llu) after one up to %llu",
                        h->in->files[r->file].path, r->st->name, (unsigned long long)lo, (unsigned long long)hi,
                        (unsigned long long)t->front);
    if (h->nopen == h->copen) {
        const size_t c = h->copen ? 2 * h->copen : 8;
        bfs_sblock *p = realloc(h->open, c * sizeof *p);
        if (!p)
            return bfs__err(BFS_ENOMEM, "out of memory hashing tensor \"%s\"", r->st->name);
        h->open = p;
        h->copen = c;
    }
    h->open[h->nopen] = (bfs_sblock){.raw = ri, .lo = lo, .hi = hi, .cursor = lo};
    *k = h->nopen++;
    t->nopen++;
    t->front = hi;
    return 1;
}

/* [off, off + len) of r's data, read by a kernel, and the block blk of r its rank hashes */
static int bfs__srchash_range(bfs_srchash *h, const bfs_srange *s, const bfs_srange *blk)
{
    const bfs_raw *r = s->r;
    const size_t ri = (size_t)(r - h->in->raw);
    bfs_tensor_hash *t = &h->th[ri];
    const uint64_t off = s->off, end = s->off + s->len, lo = blk->off, hi = blk->off + blk->len;
    if (blk->r != r || end > r->nbytes || hi > r->nbytes)
        return bfs__err(BFS_EINTERNAL, "%s: tensor \"%s\": source bytes [%llu, %llu) or block [%llu, %llu) outside its %llu",
                        h->in->files[r->file].path, r->st->name, (unsigned long long)off, (unsigned long long)end,
                        (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)r->nbytes);
    uint64_t added;
    if (bfs__read_add(t, off, end, &added) < 0)
        return bfs__err(BFS_ENOMEM, "out of memory hashing tensor \"%s\"", r->st->name);
    h->read += added;
    if (lo == hi)
        return 0;
    size_t k = 0;
    int rc = bfs__block_enter(h, ri, lo, hi, &k);
    if (rc <= 0)
        return rc;
    bfs_sblock *const b = &h->open[k];
    const uint64_t a = off > b->cursor ? off : b->cursor, e = end < hi ? end : hi; /* new bytes: [a, e) */
    if (e <= a)
        return 0;
    if (!h->dry && !b->st && b->cursor == lo && a == lo && e == hi) { /* the whole block at once */
        XXH3_128bits_reset_withSeed(h->one, r->file_offset + lo);
        bfs__xxh128_update(h->one, r->data + lo, (size_t)(hi - lo));
        bfs__term_add(h, r->file, XXH3_128bits_digest(h->one));
        b->cursor = hi;
        return bfs__block_close(h, k);
    }
    if ((rc = bfs__block_fill(h, r, b, a)) < 0) /* bytes before the kernel's range: no kernel read them */
        return rc;
    if (!h->dry && !b->st) {
        if (!(b->st = XXH3_createState()))
            return bfs__err(BFS_ENOMEM, "out of memory hashing tensor \"%s\"", r->st->name);
        XXH3_128bits_reset_withSeed(b->st, r->file_offset + lo);
    }
    if (!h->dry)
        bfs__xxh128_update(b->st, r->data + a, (size_t)(e - a));
    b->cursor = e;
    return e == hi ? bfs__block_close(h, k) : 0;
}

void bfs__srchash_hold(bfs_srchash *h, bool on) { h->hold = on; }

int bfs__srchash_ranges(bfs_srchash *h, const bfs_srange *s, const bfs_srange *blk, int n)
{
    for (int i = 0; i < n; i++) {
        const int rc = bfs__srchash_range(h, &s[i], &blk[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int bfs__srchash_finish(bfs_srchash *h, char (*hex)[33])
{
    const bfs_input *in = h->in;
    while (h->nopen > 0) { /* the rest of a block after its last unit: no kernel reads it */
        const int rc = bfs__block_close(h, h->nopen - 1);
        if (rc < 0)
            return rc;
    }
    for (size_t i = 0; i < in->nraw; i++) {
        const bfs_raw *r = &in->raw[i];
        if (h->unit_read[i] || !h->rank0 || r->nbytes == 0)
            continue;
        /* read by the planner only: one block, rank 0's */
        XXH3_state_t *st = h->dry ? NULL : XXH3_createState();
        if (!h->dry && !st)
            return bfs__err(BFS_ENOMEM, "out of memory hashing tensor \"%s\"", r->st->name);
        if (st)
            XXH3_128bits_reset_withSeed(st, r->file_offset);
        bfs__hash_mapped(st, r->data, r->nbytes);
        if (st)
            bfs__term_add(h, r->file, XXH3_128bits_digest(st));
        XXH3_freeState(st);
        h->read += r->nbytes;
        h->hashed += r->nbytes;
    }
    for (int f = 0; hex && f < in->nfiles; f++)
        bfs__hash_hex((XXH128_hash_t){.low64 = h->sum[f][0], .high64 = h->sum[f][1]}, hex[f]);
    return 0;
}

void bfs__srchash_bytes(const bfs_srchash *h, uint64_t *read, uint64_t *hashed)
{
    *read = h->read;
    *hashed = h->hashed;
}
