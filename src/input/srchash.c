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
 * every byte once: a tensor's units read increasing rows, also across the rank files, so
 * a block is hashed from its start as its rank's units reach it (a range re-read -- a scale
 * row shared by two units, bnb's 1 KiB nested code -- is hashed the first time). A block
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
            XXH3_128bits_update(st, p + o, w);
        }
        const uintptr_t a = ((uintptr_t)(p + o) + pg - 1) / pg * pg, b = (uintptr_t)(p + o + w) / pg * pg;
        if (b > a)
            (void)madvise((void *)a, b - a, MADV_DONTNEED);
        o += w;
    }
}

typedef struct {
    uint64_t lo, hi;  /* the block begun, [lo, hi) of the tensor's data (while open) */
    uint64_t cursor;  /* [lo, cursor) of it hashed */
    uint64_t done;    /* every block this run hashes of the tensor below here is done */
    uint64_t rd;      /* the units' ranges read up to here (their union is counted) */
    XXH3_state_t *st; /* while the open block is partly hashed */
    bool open;
} bfs_tensor_hash;

struct bfs_srchash {
    const bfs_input *in;
    const bool *unit_read; /* per raw tensor */
    bool rank0, dry;
    bfs_tensor_hash *th;   /* per raw tensor (in->raw) */
    uint64_t (*sum)[2];    /* per file: this run's terms added, {low64, high64} */
    uint64_t read, hashed;
};

void bfs__srchash_free(bfs_srchash *h)
{
    if (!h)
        return;
    for (size_t i = 0; h->th && i < h->in->nraw; i++)
        XXH3_freeState(h->th[i].st);
    free(h->th);
    free(h->sum);
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
    if (!h->sum || !h->th)
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

/* bytes [t->cursor, to) of r's open block, which no kernel read, from the map */
static int bfs__block_fill(bfs_srchash *h, const bfs_raw *r, bfs_tensor_hash *t, uint64_t to)
{
    if (to <= t->cursor)
        return 0;
    if (!h->dry && !t->st) {
        if (!(t->st = XXH3_createState()))
            return bfs__err(BFS_ENOMEM, "out of memory hashing tensor \"%s\"", r->st->name);
        XXH3_128bits_reset_withSeed(t->st, r->file_offset + t->lo);
    }
    bfs__hash_mapped(h->dry ? NULL : t->st, r->data + t->cursor, to - t->cursor);
    h->read += to - t->cursor;
    t->cursor = to;
    return 0;
}

/* the open block hashed to its end (the rest from the map): its term added */
static int bfs__block_close(bfs_srchash *h, const bfs_raw *r, bfs_tensor_hash *t)
{
    const int rc = bfs__block_fill(h, r, t, t->hi);
    if (rc < 0)
        return rc;
    if (t->st) /* (none: dry, or added whole by the caller) */
        bfs__term_add(h, r->file, XXH3_128bits_digest(t->st));
    XXH3_freeState(t->st);
    t->st = NULL;
    t->open = false;
    t->done = t->hi;
    h->hashed += t->hi - t->lo;
    return 0;
}

/* the block [lo, hi) of r that range [off, end) falls in: begun, or the one open */
static int bfs__block_enter(bfs_srchash *h, const bfs_raw *r, bfs_tensor_hash *t, uint64_t lo, uint64_t hi)
{
    if (t->open && lo == t->lo && hi == t->hi)
        return 1;
    if (t->open && lo >= t->hi) {
        const int rc = bfs__block_close(h, r, t); /* the last unit of its rank has passed */
        if (rc < 0)
            return rc;
    }
    if (!t->open && hi <= t->done)
        return 0; /* hashed already: a range re-read after its block's end */
    if (t->open || lo < t->done)
        return bfs__err(BFS_EINTERNAL, "%s: tensor \"%s\": source block [%llu, %llu) after [%llu, %llu)",
                        h->in->files[r->file].path, r->st->name, (unsigned long long)lo, (unsigned long long)hi,
                        (unsigned long long)(t->open ? t->lo : 0), (unsigned long long)(t->open ? t->hi : t->done));
    *t = (bfs_tensor_hash){.lo = lo, .hi = hi, .cursor = lo, .done = t->done, .rd = t->rd, .open = true};
    return 1;
}

/* [off, off + len) of r's data, read by a kernel, and the block blk of r its rank hashes */
static int bfs__srchash_range(bfs_srchash *h, const bfs_srange *s, const bfs_srange *blk)
{
    const bfs_raw *r = s->r;
    bfs_tensor_hash *t = &h->th[r - h->in->raw];
    const uint64_t off = s->off, end = s->off + s->len, lo = blk->off, hi = blk->off + blk->len;
    if (blk->r != r || end > r->nbytes || hi > r->nbytes)
        return bfs__err(BFS_EINTERNAL, "%s: tensor \"%s\": source bytes [%llu, %llu) or block [%llu, %llu) outside its %llu",
                        h->in->files[r->file].path, r->st->name, (unsigned long long)off, (unsigned long long)end,
                        (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)r->nbytes);
    if (end > t->rd) { /* the union of the units' reads: they come in increasing order */
        h->read += end - (off > t->rd ? off : t->rd);
        t->rd = end;
    }
    if (lo == hi)
        return 0;
    int rc = bfs__block_enter(h, r, t, lo, hi);
    if (rc <= 0)
        return rc;
    const uint64_t a = off > t->cursor ? off : t->cursor, e = end < hi ? end : hi; /* new bytes: [a, e) */
    if (e <= a)
        return 0;
    if (!h->dry && !t->st && t->cursor == lo && a == lo && e == hi) { /* the whole block at once */
        bfs__term_add(h, r->file, XXH3_128bits_withSeed(r->data + lo, (size_t)(hi - lo), r->file_offset + lo));
        t->cursor = hi;
        return bfs__block_close(h, r, t);
    }
    if ((rc = bfs__block_fill(h, r, t, a)) < 0) /* bytes before the kernel's range: no kernel read them */
        return rc;
    if (!h->dry && !t->st) {
        if (!(t->st = XXH3_createState()))
            return bfs__err(BFS_ENOMEM, "out of memory hashing tensor \"%s\"", r->st->name);
        XXH3_128bits_reset_withSeed(t->st, r->file_offset + lo);
    }
    if (!h->dry)
        XXH3_128bits_update(t->st, r->data + a, (size_t)(e - a));
    t->cursor = e;
    return e == hi ? bfs__block_close(h, r, t) : 0;
}

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
    for (size_t i = 0; i < in->nraw; i++) {
        const bfs_raw *r = &in->raw[i];
        bfs_tensor_hash *t = &h->th[i];
        if (t->open) { /* the rest of a block after its last unit: no kernel reads it */
            const int rc = bfs__block_close(h, r, t);
            if (rc < 0)
                return rc;
        }
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
