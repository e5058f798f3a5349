/*
 * bfs_read_ranges_zst: byte ranges of the file a seekable zstd copy decompresses to, read
 * straight into memory from several threads (what bfshard.torch.load() reads a rank file
 * with when only its compressed copy is there), and bfs_zst_uncompressed_size. Only the
 * frames that hold a range are decoded; frames are independent, so each is one job that
 * the next free thread takes. A frame inside a single range is decoded straight into its
 * destination; one shared by several ranges, or only partly asked for, goes through the
 * thread's decode buffer. Every frame's size and checksum is checked (zst_read.c).
 * bfs_read_ranges_zst_xxh128 decodes every frame (job k: frame k) and hashes the whole
 * decompressed file in order: a frame not inside one range is decoded whole into the
 * thread's frame buffer and copied from there; each frame is hashed from where it landed by
 * the thread that decoded it, in its turn (bfs_turns, base/read_ranges.c).
 */
#include "zst/zst.h"
#include "base/bfs_io.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct bfs_zr_pair { /* range i needs frame k */
    uint32_t k;
    size_t i;
    uint64_t off; /* ranges[i].offset, for the order */
} bfs_zr_pair;

typedef struct bfs_zr {
    const bfs_zst_reader *r;
    const bfs_range *ranges;
    bfs_zr_pair *pairs; /* by frame, then by range offset */
    size_t *job;        /* job j: pairs[job[j], job[j + 1]), all of one frame */
    size_t njobs;
    _Atomic size_t next;
    _Atomic int failed;
    bfs_errslot err;
    /* hashing (bfs_read_ranges_zst_xxh128); st NULL: not hashing. Job k is frame k, its
     * pairs [fjob[k], fjob[k + 1]). */
    size_t *fjob;
    XXH3_state_t *st; /* written only by the thread whose turn it is */
    bfs_turns turns;
} bfs_zr;

static int bfs__zr_cmp(const void *a, const void *b)
{
    const bfs_zr_pair *p = a, *q = b;
    if (p->k != q->k)
        return p->k < q->k ? -1 : 1;
    if (p->off != q->off)
        return p->off < q->off ? -1 : 1;
    return p->i < q->i ? -1 : p->i > q->i;
}

typedef struct { /* a frame's bytes, copied into the ranges of one job */
    const bfs_zr *zr;
    const bfs_zr_pair *p, *end;
    uint64_t pos; /* uncompressed offset of the next byte delivered */
} bfs_zr_copy;

static int bfs__zr_sink(void *user, const uint8_t *b, size_t n)
{
    bfs_zr_copy *c = user;
    const uint64_t s = c->pos, e = s + n;
    c->pos = e;
    for (const bfs_zr_pair *p = c->p; p < c->end && p->off < e; p++) {
        const bfs_range *rg = &c->zr->ranges[p->i];
        const uint64_t lo = s > rg->offset ? s : rg->offset;
        const uint64_t hi = e < rg->offset + rg->length ? e : rg->offset + rg->length;
        if (lo < hi)
            memcpy((uint8_t *)rg->dest + (lo - rg->offset), b + (lo - s), (size_t)(hi - lo));
    }
    return 0;
}

static int bfs__zr_job(const bfs_zr *zr, bfs_zst_dec *d, size_t j)
{
    const bfs_zr_pair *p = &zr->pairs[zr->job[j]], *end = &zr->pairs[zr->job[j + 1]];
    uint64_t doff, coff;
    uint32_t ds;
    bfs__zst_frame_span(zr->r, p->k, &doff, &ds, &coff);
    if (bfs__cancelled())
        return bfs__err(BFS_EINTR, "%s: interrupted (cancelled) at uncompressed offset %llu (frame %u, compressed offset %llu)",
                        bfs__zst_reader_name(zr->r), (unsigned long long)doff, p->k, (unsigned long long)coff);
    const bfs_range *rg = &zr->ranges[p->i];
    if (end - p == 1 && rg->offset <= doff && rg->offset + rg->length >= doff + ds) /* the frame lies in one range */
        return bfs__zst_decode_frame(zr->r, d, p->k, (uint8_t *)rg->dest + (doff - rg->offset), NULL, NULL);
    bfs_zr_copy c = {.zr = zr, .p = p, .end = end, .pos = doff};
    return bfs__zst_decode_frame(zr->r, d, p->k, NULL, bfs__zr_sink, &c);
}

/* hashing: frame k decoded into the ranges (inside one: straight into it; else whole into
 * *fbuf and copied from there), then, in its turn, hashed from where it landed; 1: another
 * thread failed */
static int bfs__zrh_job(bfs_zr *zr, bfs_zst_dec *d, uint32_t k, uint8_t **fbuf, size_t *fcap)
{
    const bfs_zr_pair *p = &zr->pairs[zr->fjob[k]], *end = &zr->pairs[zr->fjob[k + 1]];
    uint64_t doff, coff;
    uint32_t ds;
    bfs__zst_frame_span(zr->r, k, &doff, &ds, &coff);
    if (bfs__cancelled())
        return bfs__err(BFS_EINTR, "%s: interrupted (cancelled) at uncompressed offset %llu (frame %u, compressed offset %llu)",
                        bfs__zst_reader_name(zr->r), (unsigned long long)doff, k, (unsigned long long)coff);
    const uint8_t *at = NULL;
    if (ds > 0) {
        const bfs_range *rg = p < end ? &zr->ranges[p->i] : NULL;
        if (end - p == 1 && rg->offset <= doff && rg->offset + rg->length >= doff + ds) { /* inside one range */
            uint8_t *dst = (uint8_t *)rg->dest + (doff - rg->offset);
            const int rc = bfs__zst_decode_frame(zr->r, d, k, dst, NULL, NULL);
            if (rc < 0)
                return rc;
            at = dst;
        } else {
            if (ds > *fcap) {
                free(*fbuf);
                *fbuf = malloc(ds);
                *fcap = *fbuf ? ds : 0;
                if (*fbuf == NULL)
                    return bfs__err(BFS_ENOMEM, "%s: no memory for frame %u's %u bytes", bfs__zst_reader_name(zr->r), k,
                                    ds);
            }
            const int rc = bfs__zst_decode_frame(zr->r, d, k, *fbuf, NULL, NULL);
            if (rc < 0)
                return rc;
            bfs_zr_copy c = {.zr = zr, .p = p, .end = end, .pos = doff};
            bfs__zr_sink(&c, *fbuf, ds);
            at = *fbuf;
        }
    }
    if (!bfs__turn_wait(&zr->turns, k))
        return 1;
    if (ds > 0)
        bfs__xxh128_update(zr->st, at, ds);
    bfs__turn_pass(&zr->turns);
    return 0;
}

static void *bfs__zr_worker(void *arg)
{
    bfs_zr *zr = arg;
    bfs_zst_dec d;
    uint8_t *fbuf = NULL; /* hashing: a frame not inside one range */
    size_t fcap = 0;
    int rc = bfs__zst_dec_init(&d);
    while (rc == 0 && !atomic_load(&zr->failed)) {
        const size_t j = atomic_fetch_add(&zr->next, 1);
        if (j >= zr->njobs)
            break;
        rc = zr->st != NULL ? bfs__zrh_job(zr, &d, (uint32_t)j, &fbuf, &fcap) : bfs__zr_job(zr, &d, j);
    }
    if (rc < 0) {
        bfs__errslot_put(&zr->err, rc);
        atomic_store(&zr->failed, 1);
        bfs__turns_fail(&zr->turns);
    }
    free(fbuf);
    bfs__zst_dec_free(&d);
    return NULL;
}

/* every range checked, and the (frame, range) pairs they need, grouped into jobs by frame */
static int bfs__zr_plan(bfs_zr *zr, const char *path, const bfs_range *ranges, size_t n)
{
    const bfs_zst_reader *r = zr->r;
    const uint64_t total = bfs__zst_reader_size(r);
    size_t np = 0;
    for (size_t i = 0; i < n; i++) {
        const bfs_range *g = &ranges[i];
        const int rc = bfs__range_check(path, i, g);
        if (rc < 0)
            return rc;
        if (g->length == 0)
            continue;
        if (g->offset + g->length > total)
            return bfs__err(BFS_EINPUT, "%s: decompresses to %llu bytes, which end inside the %llu bytes asked for at "
                            "offset %llu (truncated?)", path, (unsigned long long)total,
                            (unsigned long long)g->length, (unsigned long long)g->offset);
        const uint64_t f0 = bfs__zst_frame_at(r, g->offset), f1 = bfs__zst_frame_at(r, g->offset + g->length - 1);
        if (f1 - f0 + 1 > SIZE_MAX / sizeof *zr->pairs - np)
            return bfs__err(BFS_ENOMEM, "%s: too many ranges and frames (at range %zu)", path, i);
        np += (size_t)(f1 - f0 + 1); /* an upper bound: frames of 0 bytes among them are left out */
    }
    zr->pairs = malloc((np ? np : 1) * sizeof *zr->pairs);
    zr->job = malloc((np + 1) * sizeof *zr->job);
    if (!zr->pairs || !zr->job)
        return bfs__err(BFS_ENOMEM, "%s: no memory for %zu (frame, range) pairs", path, np);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const bfs_range *g = &ranges[i];
        if (g->length == 0)
            continue;
        for (uint32_t k = bfs__zst_frame_at(r, g->offset); k < bfs__zst_reader_frames(r); k++) {
            uint64_t doff, coff;
            uint32_t ds;
            bfs__zst_frame_span(r, k, &doff, &ds, &coff);
            if (doff >= g->offset + g->length)
                break;
            if (ds > 0)
                zr->pairs[m++] = (bfs_zr_pair){.k = k, .i = i, .off = g->offset};
        }
    }
    qsort(zr->pairs, m, sizeof *zr->pairs, bfs__zr_cmp);
    for (size_t a = 0; a < m; a++)
        if (a == 0 || zr->pairs[a].k != zr->pairs[a - 1].k)
            zr->job[zr->njobs++] = a;
    zr->job[zr->njobs] = m;
    if (zr->st != NULL) { /* hashing: every frame a job */
        const uint32_t nf = bfs__zst_reader_frames(r);
        zr->fjob = malloc(((size_t)nf + 1) * sizeof *zr->fjob);
        if (zr->fjob == NULL)
            return bfs__err(BFS_ENOMEM, "%s: no memory for %u frames", path, nf);
        size_t a = 0;
        for (uint32_t k = 0; k <= nf; k++) {
            while (a < m && zr->pairs[a].k < k)
                a++;
            zr->fjob[k] = a;
        }
        zr->njobs = nf;
    }
    return 0;
}

/* bfs_read_ranges_zst, and with hex not NULL bfs_read_ranges_zst_xxh128 (size decompressed bytes) */
static int bfs__zr_run(const char *path, const bfs_range *ranges, size_t n, int threads, uint64_t size, char *hex)
{
    int rc = 0;
    bfs_zst_reader *r = NULL;
    pthread_t tid[BFS_READER_MAX_THREADS];
    int started = 0;
    bfs_zr zr = {.ranges = ranges};
    bfs__err_clear();
    bfs__cancel_reset(); /* a new read starts uncancelled, as bfs_read_ranges does */
    bfs__errslot_init(&zr.err);
    bfs__turns_init(&zr.turns);
    if (path == NULL)
        BFS_FAIL(BFS_EUSAGE, "bfs_read_ranges_zst: no path");
    if (n > 0 && ranges == NULL)
        BFS_FAIL(BFS_EUSAGE, "%s: %zu ranges, no array of them", path, n);
    if (hex != NULL) {
        BFS_TRY(bfs__ranges_in_order(path, ranges, n));
        zr.st = XXH3_createState();
        if (zr.st == NULL)
            BFS_FAIL(BFS_ENOMEM, "%s: no memory for a hash state", path);
        XXH3_128bits_reset(zr.st);
    }
    BFS_TRY(bfs__zst_reader_open(path, &r));
    zr.r = r;
    if (hex != NULL && bfs__zst_reader_size(r) != size)
        BFS_FAIL(BFS_EINPUT, "%s: decompresses to %llu bytes, %llu expected (%s)", path,
                 (unsigned long long)bfs__zst_reader_size(r), (unsigned long long)size,
                 bfs__zst_reader_size(r) < size ? "truncated" : "changed");
    BFS_TRY(bfs__zr_plan(&zr, path, ranges, n));
    threads = bfs__reader_threads(threads, zr.njobs);
    /* the calling thread is one of them; a thread that cannot start leaves its share to the others */
    while (started < threads - 1 && pthread_create(&tid[started], NULL, bfs__zr_worker, &zr) == 0)
        started++;
    bfs__zr_worker(&zr);
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    rc = bfs__errslot_get(&zr.err);
    if (rc == 0 && hex != NULL)
        bfs__hash_hex(XXH3_128bits_digest(zr.st), hex);

cleanup:
    free(zr.pairs);
    free(zr.job);
    free(zr.fjob);
    if (zr.st != NULL)
        XXH3_freeState(zr.st);
    bfs__turns_free(&zr.turns);
    bfs__zst_reader_free(r);
    return rc;
}

int bfs_read_ranges_zst(const char *path, const bfs_range *ranges, size_t n, int threads)
{
    return bfs__zr_run(path, ranges, n, threads, 0, NULL);
}

int bfs_read_ranges_zst_xxh128(const char *path, const bfs_range *ranges, size_t n, int threads, uint64_t size,
                               char xxh3_128[33])
{
    if (xxh3_128 == NULL) {
        bfs__err_clear();
        return bfs__err(BFS_EUSAGE, "%s: bfs_read_ranges_zst_xxh128: nowhere to put the hash",
                        path ? path : "(no path)");
    }
    xxh3_128[0] = '\0';
    return bfs__zr_run(path, ranges, n, threads, size, xxh3_128);
}

int bfs_zst_uncompressed_size(const char *path, uint64_t *size)
{
    bfs_zst_reader *r = NULL;
    bfs__err_clear();
    if (path == NULL || size == NULL)
        return bfs__err(BFS_EUSAGE, "bfs_zst_uncompressed_size: no path or no size");
    const int rc = bfs__zst_reader_open(path, &r);
    if (rc < 0)
        return rc;
    *size = bfs__zst_reader_size(r);
    bfs__zst_reader_free(r);
    return 0;
}
