/*
 * Source hashes: what the manifest records of each input file ("content_xxh3_128") is
 * computed from exactly the bytes that were dequantized, not from a separate pass.
 *
 *   content_xxh3_128(file) = XXH3-128 of the concatenation of 16-byte canonical XXH3-128
 *     digests: first of the header bytes [0, 8 + N), then of each tensor's data, in file
 *     order. (Not xxh128sum of the file: the converter reads tensors in output order.)
 *
 * How each tensor's digest comes from the bytes its kernels read: convert.c runs a unit
 * as   identity check -> kernel -> bfs__srchash_unit() -> identity check,   and the
 * unit's ranges (bfs__unit_sources, the same mapping the kernel read, handed over by convert) are streamed into
 * the tensor's hash in order, every byte once: a tensor's units read increasing rows,
 * also across the rank files, so each range starts at or before the bytes already
 * hashed (a range re-read -- an absmax block shared by two units, the 1 KiB nested code
 * -- is hashed the first time). A small tensor (BFS_SRC_HASH_WHOLE) is hashed whole at
 * its first unit, the rows later units read included: those reads are then covered by
 * the identity checks after their units, which compare with the identity at open. The identity (device, inode, size, mtime, ctime) is the
 * same before the kernel and after the hash, so no write reached the file between the
 * kernel's read and the hash's read: they read the same bytes. A file that changed
 * fails the run (BFS_EINPUT) before its manifest exists. Rank files reused by a
 * resumed run are hashed the same way without their kernels; tensors that only the
 * planner reads (a quant_state blob, a quant_map) are hashed at the end, under the
 * same identity check.
 *
 * A part (convert --ranks, parts.c) hashes only the source files its ranks own, so that
 * the merged manifest is the one a single run writes: its units' ranges of other files
 * are ignored, and where its units skip rows of a tensor (another part's ranks) the hash
 * reads the skipped bytes itself from the same mapping, before the unit's ranges and so
 * under the same identity check; what is left after its last unit is read at the end.
 */
#include "input/srchash.h"
#include "base/bfs_io.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Bytes no kernel read (a part's view of other parts' rows, what is left after its last
 * unit, tensors only the planner read) are hashed through the map in windows of
 * BFS_SRC_HASH_WINDOW, each window's whole pages dropped from the mapping behind it
 * (MADV_DONTNEED: a read-only file map re-faults them if read again), so that a part's
 * resident set does not grow with the source files it owns -- the memory model counts
 * one window. */

static void bfs__hash_mapped(XXH3_state_t *st, const uint8_t *p, uint64_t n)
{
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (uint64_t o = 0; o < n;) {
        const size_t w = n - o < BFS_SRC_HASH_WINDOW ? (size_t)(n - o) : BFS_SRC_HASH_WINDOW;
        XXH3_128bits_update(st, p + o, w);
        const uintptr_t a = ((uintptr_t)(p + o) + pg - 1) / pg * pg, b = (uintptr_t)(p + o + w) / pg * pg;
        if (b > a)
            (void)madvise((void *)a, b - a, MADV_DONTNEED);
        o += w;
    }
}

/* A tensor of at most this many bytes is hashed whole at the first unit that reads it */
#define BFS_SRC_HASH_WHOLE (64u << 10)

typedef struct {
    uint64_t cursor;     /* bytes hashed, [0, cursor) of the tensor's data */
    XXH3_state_t *st;    /* while the tensor is partly hashed */
    XXH128_canonical_t digest;
    bool done;
} bfs_tensor_hash;

struct bfs_srchash {
    const bfs_input *in;
    const bool *mine;    /* per file: hashed here; NULL: all (a whole run) */
    size_t *base;        /* per file: index of its first tensor in th[] */
    bfs_tensor_hash *th; /* per file, per tensor in file order */
    XXH128_canonical_t *header; /* per file */
};

void bfs__srchash_free(bfs_srchash *h)
{
    if (!h)
        return;
    size_t n = h->in && h->base ? h->base[h->in->nfiles] : 0;
    for (size_t i = 0; h->th && i < n; i++)
        XXH3_freeState(h->th[i].st);
    free(h->th);
    free(h->base);
    free(h->header);
    free(h);
}

int bfs__srchash_create(const bfs_input *in, const bool *mine, bfs_srchash **out)
{
    int rc = 0;
    bfs_srchash *h = calloc(1, sizeof *h);
    *out = NULL;
    if (!h)
        return bfs__err(BFS_ENOMEM, "out of memory");
    h->in = in;
    h->mine = mine;
    h->base = calloc((size_t)in->nfiles + 1, sizeof *h->base);
    h->header = calloc((size_t)in->nfiles + 1, sizeof *h->header);
    if (!h->base || !h->header)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (int f = 0; f < in->nfiles; f++) {
        h->base[f + 1] = h->base[f] + in->files[f].h.n;
        XXH128_canonicalFromHash(&h->header[f], XXH3_128bits(in->files[f].map, (size_t)in->files[f].h.data_start));
    }
    h->th = calloc(h->base[in->nfiles] + 1, sizeof *h->th);
    if (!h->th)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    *out = h;
    h = NULL;
cleanup:
    bfs__srchash_free(h);
    return rc;
}

static bfs_tensor_hash *bfs__th_of(bfs_srchash *h, const bfs_raw *r)
{
    return &h->th[h->base[r->file] + (size_t)(r->st - h->in->files[r->file].h.t)];
}

/* [off, off + len) of r's data, read by a kernel: hash the part not hashed yet */
static int bfs__srchash_range(bfs_srchash *h, const bfs_raw *r, uint64_t off, uint64_t len)
{
    if (h->mine && !h->mine[r->file])
        return 0; /* another part hashes this file */
    bfs_tensor_hash *t = bfs__th_of(h, r);
    const uint64_t end = off + len;
    if (end <= t->cursor || len == 0)
        return 0;
    uint64_t kread = off; /* where the kernel's read begins */
    if (h->mine && off > t->cursor && end <= r->nbytes)
        off = t->cursor; /* a part: the rows before are another part's, read here */
    if (off > t->cursor || end > r->nbytes)
        return bfs__err(BFS_EINTERNAL, "%s: tensor \"%s\": source bytes [%llu, %llu) read before [%llu, %llu)",
                        h->in->files[r->file].path, r->st->name, (unsigned long long)off, (unsigned long long)end,
                        (unsigned long long)t->cursor, (unsigned long long)off);
    if (t->cursor == 0 && off == 0 && (end == r->nbytes || r->nbytes <= BFS_SRC_HASH_WHOLE)) {
        /* the whole tensor at once: no streaming state. A small tensor read in pieces (one
         * per rank file) is hashed whole at its first: ~640 bytes of XXH3 state per tensor
         * held from the first rank file to the last were 128 MB of 700 at W = 8, 200k
         * tensors. Its later rows are read here before their kernels read them; the
         * identity checks after each of those units cover both reads (see the top). */
        XXH128_canonicalFromHash(&t->digest, XXH3_128bits(r->data, (size_t)r->nbytes));
        t->cursor = r->nbytes;
        t->done = true;
        return 0;
    }
    if (!t->st) {
        t->st = XXH3_createState();
        if (!t->st)
            return bfs__err(BFS_ENOMEM, "out of memory hashing tensor \"%s\"", r->st->name);
        XXH3_128bits_reset(t->st);
    }
    if (kread > t->cursor) /* bytes before the kernel's range: no kernel read them */
        bfs__hash_mapped(t->st, r->data + t->cursor, kread - t->cursor);
    else
        kread = t->cursor;
    XXH3_128bits_update(t->st, r->data + kread, (size_t)(end - kread));
    t->cursor = end;
    if (t->cursor == r->nbytes) {
        XXH128_canonicalFromHash(&t->digest, XXH3_128bits_digest(t->st));
        XXH3_freeState(t->st);
        t->st = NULL;
        t->done = true;
    }
    return 0;
}

int bfs__srchash_ranges(bfs_srchash *h, const bfs_srange *s, int n)
{
    for (int i = 0; i < n; i++) {
        const int rc = bfs__srchash_range(h, s[i].r, s[i].off, s[i].len);
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
        if (h->mine && !h->mine[r->file])
            continue;
        bfs_tensor_hash *t = bfs__th_of(h, r);
        if (t->done)
            continue;
        if (r->nbytes == 0 || t->cursor == 0) { /* empty, or read by the planner only */
            XXH3_state_t *ts = XXH3_createState();
            if (!ts)
                return bfs__err(BFS_ENOMEM, "out of memory hashing tensor \"%s\"", r->st->name);
            XXH3_128bits_reset(ts);
            bfs__hash_mapped(ts, r->data, r->nbytes);
            XXH128_canonicalFromHash(&t->digest, XXH3_128bits_digest(ts));
            XXH3_freeState(ts);
            t->done = true;
            continue;
        }
        /* the rest after its last unit: no kernel reads it */
        bfs__hash_mapped(t->st, r->data + t->cursor, r->nbytes - t->cursor);
        XXH128_canonicalFromHash(&t->digest, XXH3_128bits_digest(t->st));
        XXH3_freeState(t->st);
        t->st = NULL;
        t->cursor = r->nbytes;
        t->done = true;
    }
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return bfs__err(BFS_ENOMEM, "out of memory");
    for (int f = 0; f < in->nfiles; f++) {
        if (h->mine && !h->mine[f])
            continue;
        XXH3_128bits_reset(st);
        XXH3_128bits_update(st, &h->header[f], sizeof h->header[f]);
        for (size_t k = h->base[f]; k < h->base[f + 1]; k++)
            XXH3_128bits_update(st, &h->th[k].digest, sizeof h->th[k].digest);
        bfs__hash_hex(XXH3_128bits_digest(st), hex[f]);
    }
    XXH3_freeState(st);
    return 0;
}
