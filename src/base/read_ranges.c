/* bfs_read_ranges: byte ranges of one file straight into memory by pread(2) from several
 * threads (what bfshard.torch.load() reads a rank file with). The ranges are laid end to end
 * as one stream of bytes, cut into pieces of BFS_RR_PIECE; each thread takes the next piece
 * from an atomic counter, so large tensors are read by every thread at once and a piece
 * holding many small tensors is one thread's run of preads. Ranges laid end to end both in
 * the file and in memory (small tensors of one buffer, in file order) are read by one pread.
 * bfs_cancel() stops every thread before its next pread (BFS_EINTR).
 * bfs_read_ranges_xxh128 reads the same way and hashes the whole file (XXH3-128) in file
 * order as it goes: the file is cut into pieces of BFS_RR_HASH_PIECE, each thread reads its
 * piece (the ranges' parts into their destinations, the bytes no range covers into its own
 * window), then, once every piece before it is hashed (bfs_turns), hashes the piece from
 * where its bytes landed while they are still in the cache. The turns of bfs__turn_* are
 * here too, shared with bfs_read_ranges_zst_xxh128 (zst/zst_ranges.c). */
#include "base/base.h"
#include "base/bfs_io.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define BFS_RR_PIECE ((uint64_t)16 << 20) /* large enough for full-speed reads, small enough to spread */
#define BFS_RR_AUTO_THREADS 16            /* threads: 0 takes at most this many */
#define BFS_RR_MAX_PREAD ((size_t)1 << 30) /* Linux reads at most ~2 GiB in one call */
#define BFS_RR_HASH_PIECE ((uint64_t)4 << 20) /* hashing: a piece a thread reads, then hashes while it is cached */

typedef struct bfs_rr {
    const char *path;
    int fd;
    const bfs_range *ranges;
    size_t n;
    const uint64_t *start; /* start[i]: the bytes of ranges[0..i); start[n]: all of them */
    _Atomic uint64_t next; /* the next piece's first byte in that stream */
    _Atomic int failed;
    bfs_errslot err;
    /* hashing the whole file in file order (bfs_read_ranges_xxh128); order NULL: not hashing */
    const size_t *order; /* the ranges with bytes, by offset, none overlapping another */
    size_t norder;
    uint64_t size;       /* the file's bytes, every one hashed */
    XXH3_state_t *st;    /* written only by the thread whose turn it is */
    bfs_turns turns;     /* job k: the piece at k * BFS_RR_HASH_PIECE */
} bfs_rr;

/* r's bytes follow q's both in the file and in memory: one pread reads the two */
static bool bfs__rr_adjacent(const bfs_range *q, const bfs_range *r)
{
    return r->length > 0 && q->length > 0 && q->offset + q->length == r->offset &&
           (const uint8_t *)q->dest + q->length == (const uint8_t *)r->dest;
}

/* len bytes at off into p: 0; 1 when the file ends first (*end: where); or a BFS_E* code */
static int bfs__rr_pread(const bfs_rr *rr, uint8_t *p, uint64_t len, uint64_t off, uint64_t *end)
{
    while (len > 0) {
        if (bfs__cancelled())
            return bfs__err(BFS_EINTR, "%s: interrupted (cancelled) at offset %llu", rr->path,
                            (unsigned long long)off);
        const size_t want = len > BFS_RR_MAX_PREAD ? BFS_RR_MAX_PREAD : (size_t)len;
        const ssize_t got = pread(rr->fd, p, want, (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return bfs__errno(BFS_EIO, errno, "%s: read of %zu bytes at offset %llu failed", rr->path, want,
                              (unsigned long long)off);
        if (got == 0) {
            *end = off;
            return 1;
        }
        p += got;
        off += (uint64_t)got;
        len -= (uint64_t)got;
    }
    return 0;
}

/* len bytes from skip bytes into range i, running on into the ranges adjacent to it */
static int bfs__rr_read(const bfs_rr *rr, size_t i, uint64_t skip, uint64_t len)
{
    const bfs_range *r = &rr->ranges[i];
    uint64_t off;
    const int rc = bfs__rr_pread(rr, (uint8_t *)r->dest + skip, len, r->offset + skip, &off);
    if (rc != 1)
        return rc;
    while (r->offset + r->length <= off) /* the range of the run the file ends in */
        r++;
    return bfs__err(BFS_EINPUT, "%s: the file ends at offset %llu, inside the %llu bytes asked for at offset "
                    "%llu (truncated?)", rr->path, (unsigned long long)off,
                    (unsigned long long)r->length, (unsigned long long)r->offset);
}

/* bytes [a, b) of the stream */
static int bfs__rr_piece(const bfs_rr *rr, uint64_t a, uint64_t b)
{
    size_t lo = 0, hi = rr->n; /* the first range that ends after a */
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (rr->start[mid + 1] <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t i = lo; a < b && i < rr->n; i++) {
        uint64_t end = rr->start[i + 1] < b ? rr->start[i + 1] : b;
        if (end <= a)
            continue; /* a zero-length range */
        const size_t first = i; /* the run: ranges first..i, each adjacent to the one before */
        while (end == rr->start[i + 1] && end < b && i + 1 < rr->n && bfs__rr_adjacent(&rr->ranges[i], &rr->ranges[i + 1])) {
            i++;
            end = rr->start[i + 1] < b ? rr->start[i + 1] : b;
        }
        const int rc = bfs__rr_read(rr, first, a - rr->start[first], end - a);
        if (rc < 0)
            return rc;
        a = end;
    }
    return 0;
}

static void *bfs__rr_worker(void *arg)
{
    bfs_rr *rr = arg;
    const uint64_t total = rr->start[rr->n];
    while (!atomic_load(&rr->failed)) {
        const uint64_t a = atomic_fetch_add(&rr->next, BFS_RR_PIECE);
        if (a >= total)
            break;
        const int rc = bfs__rr_piece(rr, a, total - a > BFS_RR_PIECE ? a + BFS_RR_PIECE : total);
        if (rc < 0) {
            bfs__errslot_put(&rr->err, rc);
            atomic_store(&rr->failed, 1);
        }
    }
    return NULL;
}

void bfs__turns_init(bfs_turns *t)
{
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->next = 0;
    t->failed = false;
}

void bfs__turns_free(bfs_turns *t)
{
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
}

bool bfs__turn_wait(bfs_turns *t, uint64_t job)
{
    pthread_mutex_lock(&t->mu);
    while (!t->failed && t->next != job)
        pthread_cond_wait(&t->cv, &t->mu);
    const bool ok = !t->failed;
    pthread_mutex_unlock(&t->mu);
    return ok;
}

void bfs__turn_pass(bfs_turns *t)
{
    pthread_mutex_lock(&t->mu);
    t->next++;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

void bfs__turns_fail(bfs_turns *t)
{
    pthread_mutex_lock(&t->mu);
    t->failed = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* Bytes [a, b) of the file as the ranges and the gaps between them cut them: for each
 * part, range r (NULL: a gap) and where it starts. read: into the destinations and
 * window (the piece's bytes no range covers, at their place in the piece); else hash
 * them from there, in order. */
static int bfs__rrh_walk(bfs_rr *rr, uint64_t a, uint64_t b, uint8_t *window, bool read)
{
    size_t lo = 0, hi = rr->norder; /* the first range that ends after a */
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        const bfs_range *r = &rr->ranges[rr->order[mid]];
        if (r->offset + r->length <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint64_t pos = a, end;
    for (size_t j = lo; pos < b; j++) {
        const bfs_range *r = j < rr->norder ? &rr->ranges[rr->order[j]] : NULL;
        const uint64_t gap_end = r == NULL || r->offset > b ? b : r->offset;
        if (pos < gap_end) { /* bytes no range covers */
            uint8_t *p = window + (pos - a);
            if (!read) {
                bfs__xxh128_update(rr->st, p, (size_t)(gap_end - pos));
            } else {
                const int rc = bfs__rr_pread(rr, p, gap_end - pos, pos, &end);
                if (rc == 1)
                    return bfs__err(BFS_EINPUT, "%s: the file ends at offset %llu, before the %llu bytes it had when "
                                    "opened (truncated while read?)", rr->path, (unsigned long long)end,
                                    (unsigned long long)rr->size);
                if (rc < 0)
                    return rc;
            }
            pos = gap_end;
        }
        if (r == NULL || pos >= b)
            break;
        /* the range's part in [pos, b), running on into ranges adjacent in the file and in memory */
        const size_t first = j;
        uint64_t stop = r->offset + r->length < b ? r->offset + r->length : b;
        while (read && stop == r->offset + r->length && stop < b && j + 1 < rr->norder &&
               bfs__rr_adjacent(&rr->ranges[rr->order[j]], &rr->ranges[rr->order[j + 1]])) {
            j++;
            r = &rr->ranges[rr->order[j]];
            stop = r->offset + r->length < b ? r->offset + r->length : b;
        }
        const bfs_range *f = &rr->ranges[rr->order[first]];
        uint8_t *p = (uint8_t *)f->dest + (pos - f->offset);
        if (!read) {
            bfs__xxh128_update(rr->st, p, (size_t)(stop - pos));
        } else {
            const int rc = bfs__rr_pread(rr, p, stop - pos, pos, &end);
            for (size_t k = first; rc == 1 && k <= j; k++)
                if (rr->ranges[rr->order[k]].offset + rr->ranges[rr->order[k]].length > end) {
                    r = &rr->ranges[rr->order[k]]; /* the range of the run the file ends in */
                    break;
                }
            if (rc == 1)
                return bfs__err(BFS_EINPUT, "%s: the file ends at offset %llu, inside the %llu bytes asked for at "
                                "offset %llu (truncated while read?)", rr->path, (unsigned long long)end,
                                (unsigned long long)r->length, (unsigned long long)r->offset);
            if (rc < 0)
                return rc;
        }
        pos = stop;
    }
    return 0;
}

static void *bfs__rrh_worker(void *arg)
{
    bfs_rr *rr = arg;
    uint8_t *window = NULL; /* at its first piece; only the pages a gap lands in are touched */
    int rc = 0;
    while (rc == 0 && !atomic_load(&rr->failed)) {
        const uint64_t a = atomic_fetch_add(&rr->next, BFS_RR_HASH_PIECE);
        if (a >= rr->size)
            break;
        const uint64_t b = rr->size - a > BFS_RR_HASH_PIECE ? a + BFS_RR_HASH_PIECE : rr->size;
        if (window == NULL && (window = malloc((size_t)BFS_RR_HASH_PIECE)) == NULL) {
            rc = bfs__err(BFS_ENOMEM, "%s: no memory for a %llu-byte read window", rr->path,
                          (unsigned long long)BFS_RR_HASH_PIECE);
            break;
        }
        rc = bfs__rrh_walk(rr, a, b, window, true);
        if (rc == 0 && !bfs__turn_wait(&rr->turns, a / BFS_RR_HASH_PIECE))
            break; /* another thread failed */
        if (rc == 0) {
            bfs__rrh_walk(rr, a, b, window, false);
            bfs__turn_pass(&rr->turns);
        }
    }
    if (rc < 0) {
        bfs__errslot_put(&rr->err, rc);
        atomic_store(&rr->failed, 1);
        bfs__turns_fail(&rr->turns);
    }
    free(window);
    return NULL;
}

int bfs__ranges_in_order(const char *path, const bfs_range *ranges, size_t n)
{
    const bfs_range *prev = NULL;
    size_t iprev = 0;
    for (size_t i = 0; i < n; i++) {
        const bfs_range *r = &ranges[i];
        if (r->length == 0)
            continue;
        if (prev != NULL && prev->offset + prev->length > r->offset)
            return bfs__err(BFS_EUSAGE, "%s: range %zu (offset %llu) starts before range %zu (offset %llu) ends: "
                            "hashing in file order takes ranges sorted by offset, none overlapping another",
                            path, i, (unsigned long long)r->offset, iprev, (unsigned long long)prev->offset);
        prev = r;
        iprev = i;
    }
    return 0;
}

/* hashing: the ranges with bytes in file order, each inside the file's size bytes; 0,
 * BFS_EUSAGE (out of order, overlapping) or BFS_EINPUT (past the end) */
static int bfs__rrh_order(bfs_rr *rr, size_t *order)
{
    const int rc = bfs__ranges_in_order(rr->path, rr->ranges, rr->n);
    if (rc < 0)
        return rc;
    size_t m = 0;
    for (size_t i = 0; i < rr->n; i++) {
        const bfs_range *r = &rr->ranges[i];
        if (r->length == 0)
            continue;
        if (r->offset + r->length > rr->size)
            return bfs__err(BFS_EINPUT, "%s: the file ends at offset %llu, inside the %llu bytes asked for at offset "
                            "%llu (truncated?)", rr->path, (unsigned long long)rr->size,
                            (unsigned long long)r->length, (unsigned long long)r->offset);
        order[m++] = i;
    }
    rr->order = order;
    rr->norder = m;
    return 0;
}

int bfs__range_check(const char *path, size_t i, const bfs_range *r)
{
    if (r->length > 0 && r->dest == NULL)
        return bfs__err(BFS_EUSAGE, "%s: range %zu (%llu bytes at offset %llu) has no destination", path, i,
                        (unsigned long long)r->length, (unsigned long long)r->offset);
    if (r->offset > (uint64_t)INT64_MAX || r->length > (uint64_t)INT64_MAX - r->offset)
        return bfs__err(BFS_EUSAGE, "%s: range %zu: %llu bytes at offset %llu end past the largest file offset", path,
                        i, (unsigned long long)r->length, (unsigned long long)r->offset);
    return 0;
}

int bfs__reader_threads(int threads, uint64_t jobs)
{
    if (threads <= 0) {
        const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cpus < 1 ? 1 : cpus > BFS_RR_AUTO_THREADS ? BFS_RR_AUTO_THREADS : (int)cpus;
    }
    if (threads > BFS_READER_MAX_THREADS)
        threads = BFS_READER_MAX_THREADS;
    if ((uint64_t)threads > jobs)
        threads = jobs > 0 ? (int)jobs : 1;
    return threads;
}

/* the stream's start offsets, every range checked: 0 or BFS_EUSAGE */
static int bfs__rr_starts(const char *path, const bfs_range *ranges, size_t n, uint64_t *start)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const bfs_range *r = &ranges[i];
        const int rc = bfs__range_check(path, i, r);
        if (rc < 0)
            return rc;
        if (r->length > (uint64_t)INT64_MAX - total)
            return bfs__err(BFS_EUSAGE, "%s: the ranges add up to more than %lld bytes (at range %zu)", path,
                            (long long)INT64_MAX, i);
        start[i] = total;
        total += r->length;
    }
    start[n] = total;
    return 0;
}

/* bfs_read_ranges, and with hex not NULL bfs_read_ranges_xxh128 (the file must have size bytes) */
static int bfs__rr_run(const char *path, const bfs_range *ranges, size_t n, int threads, uint64_t size, char *hex)
{
    int rc = 0;
    uint64_t *start = NULL;
    size_t *order = NULL;
    pthread_t tid[BFS_READER_MAX_THREADS];
    int started = 0;
    bfs_rr rr = {.path = path, .fd = -1, .ranges = ranges, .n = n, .size = size};
    bfs__err_clear();
    bfs__cancel_reset(); /* a new read starts uncancelled, as a conversion does */
    bfs__errslot_init(&rr.err);
    bfs__turns_init(&rr.turns);
    if (path == NULL)
        BFS_FAIL(BFS_EUSAGE, "bfs_read_ranges: no path");
    if (n > 0 && ranges == NULL)
        BFS_FAIL(BFS_EUSAGE, "%s: %zu ranges, no array of them", path, n);
    if (n > SIZE_MAX / sizeof *start - 1)
        BFS_FAIL(BFS_EUSAGE, "%s: %zu ranges: too many", path, n);
    if (hex != NULL && size > (uint64_t)INT64_MAX)
        BFS_FAIL(BFS_EUSAGE, "%s: a size of %llu bytes is past the largest file offset", path, (unsigned long long)size);
    start = malloc((n + 1) * sizeof *start);
    order = hex != NULL ? malloc((n + 1) * sizeof *order) : NULL;
    if (start == NULL || (hex != NULL && order == NULL))
        BFS_FAIL(BFS_ENOMEM, "%s: no memory for %zu ranges", path, n);
    BFS_TRY(bfs__rr_starts(path, ranges, n, start));
    rr.start = start;
    if (hex != NULL) {
        BFS_TRY(bfs__rrh_order(&rr, order));
        rr.st = XXH3_createState();
        if (rr.st == NULL)
            BFS_FAIL(BFS_ENOMEM, "%s: no memory for a hash state", path);
        XXH3_128bits_reset(rr.st);
    }
    rr.fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not hang us */
    if (rr.fd < 0) {
        rc = bfs__errno(BFS_EIO, errno, "%s: cannot open", path);
        goto cleanup;
    }
    struct stat st;
    if (fstat(rr.fd, &st) != 0) {
        rc = bfs__errno(BFS_EIO, errno, "%s: cannot stat", path);
        goto cleanup;
    }
    if (!S_ISREG(st.st_mode))
        BFS_FAIL(BFS_EINPUT, "%s: not a regular file", path);
    if (hex != NULL && (uint64_t)st.st_size != size)
        BFS_FAIL(BFS_EINPUT, "%s: %llu bytes, %llu expected (%s)", path, (unsigned long long)st.st_size,
                 (unsigned long long)size, (uint64_t)st.st_size < size ? "truncated" : "changed");
    const uint64_t total = hex != NULL ? size : start[n];
    const uint64_t piece = hex != NULL ? BFS_RR_HASH_PIECE : BFS_RR_PIECE;
    threads = bfs__reader_threads(threads, total / piece + (total % piece != 0));
    void *(*worker)(void *) = hex != NULL ? bfs__rrh_worker : bfs__rr_worker;
    /* the calling thread is one of them; a thread that cannot start leaves its share to the others */
    while (started < threads - 1 && pthread_create(&tid[started], NULL, worker, &rr) == 0)
        started++;
    worker(&rr);
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    rc = bfs__errslot_get(&rr.err);
    if (rc == 0 && hex != NULL) {
        if (fstat(rr.fd, &st) != 0) {
            rc = bfs__errno(BFS_EIO, errno, "%s: cannot stat", path);
            goto cleanup;
        }
        if ((uint64_t)st.st_size != size)
            BFS_FAIL(BFS_EINPUT, "%s: %llu bytes when opened, %llu once read (changed while read)", path,
                     (unsigned long long)size, (unsigned long long)st.st_size);
        bfs__hash_hex(XXH3_128bits_digest(rr.st), hex);
    }

cleanup:
    if (rr.fd >= 0)
        close(rr.fd);
    if (rr.st != NULL)
        XXH3_freeState(rr.st);
    bfs__turns_free(&rr.turns);
    free(order);
    free(start);
    return rc;
}

int bfs_read_ranges(const char *path, const bfs_range *ranges, size_t n, int threads)
{
    return bfs__rr_run(path, ranges, n, threads, 0, NULL);
}

int bfs_read_ranges_xxh128(const char *path, const bfs_range *ranges, size_t n, int threads, uint64_t size,
                           char xxh3_128[33])
{
    if (xxh3_128 == NULL) {
        bfs__err_clear();
        return bfs__err(BFS_EUSAGE, "%s: bfs_read_ranges_xxh128: nowhere to put the hash", path ? path : "(no path)");
    }
    xxh3_128[0] = '\0';
    return bfs__rr_run(path, ranges, n, threads, size, xxh3_128);
}
