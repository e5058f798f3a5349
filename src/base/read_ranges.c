/* bfs_read_ranges: byte ranges of one file straight into memory by pread(2) from several
 * threads (what bfshard.torch.load() reads a rank file with). The ranges are laid end to end
 * as one stream of bytes, cut into pieces of BFS_RR_PIECE; each thread takes the next piece
 * from an atomic counter, so large tensors are read by every thread at once and a piece
 * holding many small tensors is one thread's run of preads. Ranges laid end to end both in
 * the file and in memory (small tensors of one buffer, in file order) are read by one pread.
 * bfs_cancel() stops every thread before its next pread (BFS_EINTR). */
#include "base/base.h"

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

typedef struct bfs_rr {
    const char *path;
    int fd;
    const bfs_range *ranges;
    size_t n;
    const uint64_t *start; /* start[i]: the bytes of ranges[0..i); start[n]: all of them */
    _Atomic uint64_t next; /* the next piece's first byte in that stream */
    _Atomic int failed;
    bfs_errslot err;
} bfs_rr;

/* r's bytes follow q's both in the file and in memory: one pread reads the two */
static bool bfs__rr_adjacent(const bfs_range *q, const bfs_range *r)
{
    return r->length > 0 && q->length > 0 && q->offset + q->length == r->offset &&
           (const uint8_t *)q->dest + q->length == (const uint8_t *)r->dest;
}

/* len bytes from skip bytes into range i, running on into the ranges adjacent to it */
static int bfs__rr_read(const bfs_rr *rr, size_t i, uint64_t skip, uint64_t len)
{
    const bfs_range *r = &rr->ranges[i];
    uint8_t *p = (uint8_t *)r->dest + skip;
    uint64_t off = r->offset + skip;
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
            while (r->offset + r->length <= off) /* the range of the run the file ends in */
                r++;
            return bfs__err(BFS_EINPUT, "%s: the file ends at offset %llu, inside the %llu bytes asked for at offset "
                            "%llu (truncated?)", rr->path, (unsigned long long)off,
                            (unsigned long long)r->length, (unsigned long long)r->offset);
        }
        p += got;
        off += (uint64_t)got;
        len -= (uint64_t)got;
    }
    return 0;
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

int bfs_read_ranges(const char *path, const bfs_range *ranges, size_t n, int threads)
{
    int rc = 0;
    uint64_t *start = NULL;
    pthread_t tid[BFS_READER_MAX_THREADS];
    int started = 0;
    bfs_rr rr = {.path = path, .fd = -1, .ranges = ranges, .n = n};
    bfs__err_clear();
    bfs__cancel_reset(); /* a new read starts uncancelled, as a conversion does */
    bfs__errslot_init(&rr.err);
    if (path == NULL)
        return bfs__err(BFS_EUSAGE, "bfs_read_ranges: no path");
    if (n > 0 && ranges == NULL)
        return bfs__err(BFS_EUSAGE, "%s: %zu ranges, no array of them", path, n);
    if (n > SIZE_MAX / sizeof *start - 1)
        return bfs__err(BFS_EUSAGE, "%s: %zu ranges: too many", path, n);
    start = malloc((n + 1) * sizeof *start);
    if (start == NULL)
        BFS_FAIL(BFS_ENOMEM, "%s: no memory for %zu ranges", path, n);
    BFS_TRY(bfs__rr_starts(path, ranges, n, start));
    rr.start = start;
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
    const uint64_t pieces = start[n] / BFS_RR_PIECE + (start[n] % BFS_RR_PIECE != 0);
    threads = bfs__reader_threads(threads, pieces);
    /* the calling thread is one of them; a thread that cannot start leaves its share to the others */
    while (started < threads - 1 && pthread_create(&tid[started], NULL, bfs__rr_worker, &rr) == 0)
        started++;
    bfs__rr_worker(&rr);
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    rc = bfs__errslot_get(&rr.err);

cleanup:
    if (rr.fd >= 0)
        close(rr.fd);
    free(start);
    return rc;
}
