/*
 * One file's range hashed in order while several threads read it (hashfile.h).
 *
 * The range is cut into chunks of BFS_HASHFILE_CHUNK; chunk i is read into slot i % nslots
 * of a ring of 2 chunks a thread. Every thread, the caller's among them, runs the same loop
 * under one mutex: when the next chunk in file order is read and nobody is hashing, it
 * hashes it (so the hash states are only ever touched by one thread at a time, handed over
 * through the mutex); else, when a slot is free, it reads the next chunk not yet read; else
 * it waits. A slot is free again once its chunk is hashed, so memory is the ring whatever
 * the file's size. The first failure (a read error, a short read: the file shrank under us,
 * a cancel) stops every thread; its message is carried to the caller (bfs_errslot).
 */
#include "output/hashfile.h"
#include "base/base.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct {
    int fd;
    uint64_t off, len;
    const char *what;
    XXH3_state_t *xst;
    bfs_sha256 *sha;
    uint8_t *ring;
    size_t nslots;
    uint64_t nchunks;
    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t next_read;  /* chunks handed to a reader */
    uint64_t hashed;     /* chunks hashed, in order */
    uint64_t *filled;    /* per slot: chunk index + 1 once read into it, 0 while not */
    bool hashing;        /* a thread is hashing chunk `hashed` */
    bool failed;
    bfs_errslot err;
} bfs_hf;

static size_t bfs__hf_bytes(const bfs_hf *h, uint64_t i)
{
    const uint64_t at = i * BFS_HASHFILE_CHUNK;
    return h->len - at < BFS_HASHFILE_CHUNK ? (size_t)(h->len - at) : BFS_HASHFILE_CHUNK;
}

static void *bfs__hf_loop(void *p)
{
    bfs_hf *const h = p;
    pthread_mutex_lock(&h->mu);
    while (!h->failed && h->hashed < h->nchunks) {
        const size_t hs = (size_t)(h->hashed % h->nslots);
        if (!h->hashing && h->filled[hs] == h->hashed + 1) {
            const uint64_t i = h->hashed;
            h->hashing = true;
            pthread_mutex_unlock(&h->mu);
            const uint8_t *b = h->ring + hs * BFS_HASHFILE_CHUNK;
            const size_t n = bfs__hf_bytes(h, i);
            if (h->xst)
                bfs__xxh128_update(h->xst, b, n);
            if (h->sha)
                bfs__sha256_update(h->sha, b, n);
            pthread_mutex_lock(&h->mu);
            h->filled[hs] = 0;
            h->hashed = i + 1;
            h->hashing = false;
            pthread_cond_broadcast(&h->cv);
            continue;
        }
        if (h->next_read < h->nchunks && h->next_read < h->hashed + h->nslots) {
            const uint64_t i = h->next_read++;
            const size_t rs = (size_t)(i % h->nslots);
            pthread_mutex_unlock(&h->mu);
            bfs__err_clear();
            int rc = bfs__cancelled() ? bfs__err(BFS_EINTR, "interrupted while reading %s", h->what) : 0;
            if (rc == 0)
                rc = bfs__pread_all(h->fd, h->ring + rs * BFS_HASHFILE_CHUNK, bfs__hf_bytes(h, i),
                                    h->off + i * BFS_HASHFILE_CHUNK, h->what);
            if (rc < 0)
                bfs__errslot_put(&h->err, rc);
            pthread_mutex_lock(&h->mu);
            if (rc < 0)
                h->failed = true;
            else
                h->filled[rs] = i + 1;
            pthread_cond_broadcast(&h->cv);
            continue;
        }
        pthread_cond_wait(&h->cv, &h->mu);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* the caller's loop alone, through one chunk (bfs__hash_range2): no ring, no thread */
static int bfs__hash_file_one(int fd, uint64_t off, uint64_t len, const char *what, XXH3_state_t *xst,
                              bfs_sha256 *sha)
{
    const size_t bs = len < BFS_HASHFILE_CHUNK ? (size_t)len + 1 : BFS_HASHFILE_CHUNK;
    uint8_t *buf = malloc(bs);
    if (!buf)
        return bfs__err(BFS_ENOMEM, "%s: out of memory for its hash", what);
    const int rc = bfs__hash_range2(fd, off, len, buf, bs, what, xst, sha);
    free(buf);
    return rc;
}

int bfs__hash_file(int fd, uint64_t off, uint64_t len, const char *what, int threads, XXH3_state_t *xst,
                   bfs_sha256 *sha)
{
    if (threads > BFS_HASHFILE_THREADS)
        threads = BFS_HASHFILE_THREADS;
    const uint64_t nchunks = len / BFS_HASHFILE_CHUNK + (len % BFS_HASHFILE_CHUNK != 0);
    if (threads > 1 && (uint64_t)threads > nchunks / 2)
        threads = (int)(nchunks / 2); /* a thread for fewer than 2 chunks brings nothing */
    if (threads <= 1)
        return bfs__hash_file_one(fd, off, len, what, xst, sha);
    int rc = 0, started = 0;
    pthread_t tid[BFS_HASHFILE_THREADS];
    bfs_hf h = {.fd = fd, .off = off, .len = len, .what = what, .xst = xst, .sha = sha,
                .nslots = 2 * (size_t)threads, .nchunks = nchunks};
    bfs__errslot_init(&h.err);
    h.ring = malloc(h.nslots * BFS_HASHFILE_CHUNK);
    h.filled = calloc(h.nslots, sizeof *h.filled);
    if (!h.ring || !h.filled) {
        free(h.ring);
        free(h.filled);
        return bfs__hash_file_one(fd, off, len, what, xst, sha); /* the ring is a speed-up only */
    }
    pthread_mutex_init(&h.mu, NULL);
    pthread_cond_init(&h.cv, NULL);
    while (started < threads - 1 && pthread_create(&tid[started], NULL, bfs__hf_loop, &h) == 0)
        started++; /* fewer threads than asked: the same bytes, read by fewer */
    bfs__hf_loop(&h);
    for (int k = 0; k < started; k++)
        pthread_join(tid[k], NULL);
    if (h.failed) {
        bfs__err_clear(); /* the carried message is the one to report */
        rc = bfs__errslot_get(&h.err);
    }
    pthread_mutex_destroy(&h.mu);
    pthread_cond_destroy(&h.cv);
    free(h.ring);
    free(h.filled);
    return rc;
}

int bfs__hash_file_threads(size_t nfiles)
{
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const size_t c = cpus > 1 ? (size_t)cpus : 1;
    const size_t per = nfiles > 0 ? c / nfiles : c;
    return per < 1 ? 1 : per > BFS_HASHFILE_THREADS ? BFS_HASHFILE_THREADS : (int)per;
}
