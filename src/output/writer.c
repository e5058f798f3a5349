/*
 * The writer (see writer.h): a pool of lanes, each owning whole files; in a lane one thread
 * hashes and another writes, the lane's jobs in order while the backend fills the next ones.
 *
 * O_DIRECT: safetensors has no gaps between tensors, so a unit's file offset is
 * rarely block-aligned. convert puts each unit's output at buffer + off % 4096 (the
 * job's headroom); the writer copies the file's bytes before off (its carry, < 4 KiB)
 * in front of it, writes the aligned body straight from the buffer with O_DIRECT, and
 * keeps the partial tail as the next carry. Small jobs (the header) go through the
 * carry. The file's last partial block is written buffered (O_DIRECT cleared on the
 * fd). A filesystem that refuses O_DIRECT (tmpfs: EINVAL) gets the same bytes through
 * the same carry with buffered writes, whose dirty pages are pushed out every
 * BFS_FLUSH_WINDOW bytes, so the page cache does not grow with the model.
 */
#include "output/writer.h"
#include "formats/format.h"
#include "plan/plan.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BFS_FLUSH_WINDOW (32ull << 20)
#define BFS_HASH_CHUNK (256u << 10) /* both hashes read it while it is in L2 */

static double bfs__wnow(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* bound dirty pages of buffered writes: start writeback of the last window, wait for
 * and drop the one before */
static void bfs__writer_flush(bfs_wfile *f)
{
    if (f->written - f->flushed < 2 * BFS_FLUSH_WINDOW)
        return;
    const uint64_t a = f->flushed, b = f->flushed + BFS_FLUSH_WINDOW;
    sync_file_range(f->fd, (off_t)b, (off_t)(f->written - b), SYNC_FILE_RANGE_WRITE);
    sync_file_range(f->fd, (off_t)a, (off_t)(b - a),
                    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    posix_fadvise(f->fd, (off_t)a, (off_t)(b - a), POSIX_FADV_DONTNEED);
    f->flushed = b;
}

/* O_DIRECT on or off for the file; false when the filesystem refuses it */
static bool bfs__writer_set_direct(bfs_wfile *f, bool on)
{
    const int fl = fcntl(f->fd, F_GETFL);
    if (fl < 0 || fcntl(f->fd, F_SETFL, on ? fl | O_DIRECT : fl & ~O_DIRECT) != 0)
        return false;
    f->direct = on;
    return true;
}

/* Write n bytes at off: O_DIRECT when on (p, n, off aligned; a refusal, EINVAL, turns
 * it off for the rest of the file and the bytes go buffered), else buffered. */
static int bfs__writer_out(bfs_writer *w, bfs_wfile *f, const uint8_t *p, size_t n, uint64_t off)
{
    bfs_wstages *const st = &w->lanes[f->lane].wst;
    const double t0 = bfs__wnow();
    while (n > 0) {
        const size_t chunk = n > (1u << 30) ? (1u << 30) : n;
        const ssize_t k = pwrite(f->fd, p, chunk, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno == EINVAL && f->direct) {
            if (!bfs__writer_set_direct(f, false))
                return bfs__errno(BFS_EIO, errno, "%s: cannot turn O_DIRECT off", f->what);
            continue;
        }
        if (k < 0)
            return bfs__errno(BFS_EIO, errno, "%s: write of %zu bytes at offset %llu failed", f->what, chunk,
                              (unsigned long long)off);
        if (k == 0)
            return bfs__err(BFS_EIO, "%s: write at offset %llu wrote nothing (disk full?)", f->what,
                            (unsigned long long)off);
        if (f->direct)
            st->direct_bytes += (uint64_t)k;
        else
            st->buffered_bytes += (uint64_t)k;
        p += k;
        off += (uint64_t)k;
        n -= (size_t)k;
        f->written = off;
    }
    if (!f->direct)
        bfs__writer_flush(f);
    st->write += bfs__wnow() - t0;
    return 0;
}

/* the job's bytes to the file: see the top of this file */
static int bfs__writer_put(bfs_writer *w, bfs_wfile *f, const bfs_wjob *j)
{
    if (j->len == 0)
        return 0;
    if (j->off != f->carry_off + f->carry_len)
        return bfs__err(BFS_EINTERNAL, "%s: write at offset %llu after %llu bytes (the writer takes a file in order)",
                        f->what, (unsigned long long)j->off, (unsigned long long)(f->carry_off + f->carry_len));
    if (j->headroom && j->len >= BFS_DIO_ALIGN) {
        if (f->carry_len >= BFS_DIO_ALIGN) { /* after a long header: its whole blocks first */
            const size_t body = f->carry_len & ~(size_t)(BFS_DIO_ALIGN - 1);
            const int rc = bfs__writer_out(w, f, f->carry, body, f->carry_off);
            if (rc < 0)
                return rc;
            memmove(f->carry, f->carry + body, f->carry_len - body);
            f->carry_off += body;
            f->carry_len -= body;
        }
        /* now carry_len == off % BFS_DIO_ALIGN, at most the job's headroom */
        uint8_t *const base = (uint8_t *)j->buf - f->carry_len; /* aligned */
        memcpy(base, f->carry, f->carry_len);
        const size_t total = f->carry_len + j->len, body = total & ~(size_t)(BFS_DIO_ALIGN - 1);
        const int rc = bfs__writer_out(w, f, base, body, f->carry_off);
        if (rc < 0)
            return rc;
        f->carry_off += body;
        f->carry_len = total - body;
        memcpy(f->carry, base + body, f->carry_len);
        return 0;
    }
    const uint8_t *p = j->buf;
    size_t n = j->len;
    while (n > 0) {
        const size_t k = n < BFS_CARRY_BYTES - f->carry_len ? n : BFS_CARRY_BYTES - f->carry_len;
        memcpy(f->carry + f->carry_len, p, k);
        f->carry_len += k;
        p += k;
        n -= k;
        if (f->carry_len == BFS_CARRY_BYTES) {
            const int rc = bfs__writer_out(w, f, f->carry, BFS_CARRY_BYTES, f->carry_off);
            if (rc < 0)
                return rc;
            f->carry_off += BFS_CARRY_BYTES;
            f->carry_len = 0;
        }
    }
    return 0;
}

/* the end of a file: its last partial block, buffered */
static int bfs__writer_tail(bfs_writer *w, bfs_wfile *f)
{
    const double t0 = bfs__wnow();
    if (f->carry_len > 0) {
        if (f->direct && !bfs__writer_set_direct(f, false))
            return bfs__errno(BFS_EIO, errno, "%s: cannot turn O_DIRECT off", f->what);
        const int rc = bfs__writer_out(w, f, f->carry, f->carry_len, f->carry_off);
        if (rc < 0)
            return rc;
        f->carry_off += f->carry_len;
        f->carry_len = 0;
    }
    w->lanes[f->lane].wst.tail += bfs__wnow() - t0;
    return 0;
}

static void bfs__writer_hash(bfs_writer *w, const bfs_wjob *j);

/* the file's whole size reserved before its first byte (bfs_wjob.reserve) */
static int bfs__writer_reserve(bfs_writer *w, bfs_wfile *f, uint64_t size)
{
    const double t0 = bfs__wnow();
    const int fe = posix_fallocate(f->fd, 0, (off_t)size);
    w->lanes[f->lane].wst.write += bfs__wnow() - t0;
    if (fe == ENOSPC || fe == EFBIG || fe == EDQUOT)
        return bfs__err(BFS_EIO, "%s: cannot reserve %llu bytes: %s", f->what, (unsigned long long)size, strerror(fe));
    if (fe != 0 && ftruncate(f->fd, (off_t)size) != 0)
        return bfs__err(BFS_EIO, "%s: cannot size to %llu bytes: %s", f->what, (unsigned long long)size,
                        strerror(errno));
    return 0;
}

static int bfs__writer_do(bfs_writer *w, const bfs_wjob *j)
{
    int rc = 0;
    bfs_wfile *const f = &w->files[j->file];
    if (j->reserve && (rc = bfs__writer_reserve(w, f, j->reserve)) < 0)
        return rc;
    if (j->end)
        return bfs__writer_tail(w, f);
    if (f->zw) { /* a frame boundary before every piece (each piece of a batch) */
        const double t0 = bfs__wnow();
        const int last = j->piece >= 0 && j->piece_last > j->piece ? j->piece_last : j->piece;
        const uint8_t *p = j->buf;
        uint64_t o = j->off;
        for (int k = j->piece; rc == 0; k++) {
            size_t n = j->len - (size_t)(o - j->off);
            if (k >= 0 && k < last)
                n = (size_t)(f->of->pieces[k].offset + f->of->pieces[k].nbytes - o);
            if (k >= 0 && k != f->zpiece) {
                f->zpiece = k;
                rc = bfs__zst_cut_tensor(f->zw, f->zplan->t[f->of->pieces[k].tensor].out_dtype);
            }
            if (rc == 0)
                rc = bfs__zst_write(f->zw, p, n);
            p += n;
            o += n;
            if (k >= last)
                break;
        }
        w->lanes[f->lane].wst.zst += bfs__wnow() - t0;
        if (rc < 0)
            return rc;
    }
    rc = bfs__writer_put(w, f, j);
    if (rc < 0)
        return rc;
    if (j->piece >= 0)
        atomic_fetch_add(&w->total, j->len);
    return 0;
}

/* Under mu: retire the lane's jobs at its head that every thread of the lane is done with
 * (the writer wrote them, the hash thread hashed them, the sha thread too when on). A
 * file's end job retired: the file ended. */
static void bfs__writer_retire(bfs_writer *w, bfs_wlane *l)
{
    while (l->count > 0 && l->nwrite > 0 && l->nxxh > 0 && (!w->sha || l->nsha > 0)) {
        const bfs_wjob *j = &l->q[l->head];
        if (j->end)
            w->files[j->file].ended = true;
        l->head = (l->head + 1) % BFS_WQ_MAX;
        l->count--;
        l->nwrite--;
        l->nxxh--;
        if (w->sha)
            l->nsha--;
    }
    pthread_cond_broadcast(&l->cv); /* its threads: a job done (a header built) */
    pthread_cond_broadcast(&w->cv); /* the pusher and header builders: jobs retired */
}

/* Under mu: how many of the first jobs are done with, on every lane: the number of the
 * oldest job still queued on any lane (lanes queue their jobs in push order) */
static uint64_t bfs__retired_all(const bfs_writer *w)
{
    uint64_t n = w->pushed;
    for (int i = 0; i < w->nlanes; i++) {
        const bfs_wlane *l = &w->lanes[i];
        if (l->count > 0 && l->q[l->head].seq < n)
            n = l->q[l->head].seq;
    }
    return n;
}

/* Under mu: whether job `i` from the lane's head may be read by the writer or the sha
 * thread, the hash thread having built it first when it is a header to build (bfs_wjob.build) */
static bool bfs__built(const bfs_wlane *l, int i)
{
    return !l->q[(l->head + i) % BFS_WQ_MAX].build || l->nxxh > i;
}

/* Under mu: wait until the lane's job *done from head can be read (`built`: once built), or
 * until stop with none left; false then */
static bool bfs__next_job(bfs_writer *w, bfs_wlane *l, const int *done, bool built)
{
    while (*done == l->count ? !w->stop : built && !bfs__built(l, *done))
        pthread_cond_wait(&l->cv, &w->mu);
    return *done < l->count;
}

static void *bfs__writer_main(void *p)
{
    bfs_wlane *const l = p;
    bfs_writer *const w = l->w;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        if (!bfs__next_job(w, l, &l->nwrite, true))
            break;
        const bfs_wjob j = l->q[(l->head + l->nwrite) % BFS_WQ_MAX];
        const bool failed = w->rc < 0;
        pthread_mutex_unlock(&w->mu);
        int rc = 0;
        if (w->delay_us)
            usleep(w->delay_us);
        if (!failed) {
            bfs__err_clear();
            rc = bfs__errslot_put(&w->err, bfs__writer_do(w, &j));
        }
        pthread_mutex_lock(&w->mu);
        if (rc < 0 && w->rc == 0)
            w->rc = rc;
        l->nwrite++;
        l->st.write = l->wst.write; /* published for bfs__writer_stages */
        l->st.zst = l->wst.zst;
        l->st.tail = l->wst.tail;
        l->st.direct_bytes = l->wst.direct_bytes;
        l->st.buffered_bytes = l->wst.buffered_bytes;
        bfs__writer_retire(w, l);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* A job's XXH3-128s: its bytes into the file's hash and its pieces' (bfs__writer_hash);
 * a file's end, the file's digest into the job's hex; a header to build, built first
 * (its own hash into the job's hex) */
static int bfs__xxh_job(bfs_writer *w, const bfs_wjob *j)
{
    const bfs_wfile *f = &w->files[j->file];
    if (j->build) {
        if (!j->buf)
            return bfs__err(BFS_ENOMEM, "%s: out of memory for its %zu-byte header", f->what, j->len);
        const int rc = bfs__plan_header_into(f->zplan, f->of, (char *)j->buf, j->len + 1);
        if (rc < 0)
            return rc;
        if (j->hex)
            bfs__hash_hex(XXH3_128bits(j->buf, j->len), j->hex);
    }
    if (j->end)
        bfs__hash_hex(XXH3_128bits_digest(f->file_st), j->hex);
    else
        bfs__writer_hash(w, j);
    return 0;
}

/* A job's bytes into its file's SHA-256; a file's end, the digest */
static int bfs__sha_job(bfs_writer *w, const bfs_wjob *j)
{
    bfs_wfile *const f = &w->files[j->file];
    if (j->end)
        return bfs__sha256_hex(f->sha, f->sha_hex);
    bfs__sha256_update(f->sha, j->buf, j->len);
    return 0;
}

/* Under mu, a hash thread's: job i from the lane's head, a header to build, given the header
 * buffer push chose for it (the two take turns in push order) once every job up to the last
 * header built in it is done with (it waits until they are: those jobs come before it, so
 * the lanes never wait in a circle), grown to len + 1 bytes; buf stays NULL when out of memory */
static void bfs__header_buf(bfs_writer *w, bfs_wlane *l, int i)
{
    bfs_wjob *const j = &l->q[(l->head + i) % BFS_WQ_MAX];
    const int b = j->hb;
    while (bfs__retired_all(w) < j->hwait)
        pthread_cond_wait(&w->cv, &w->mu);
    if (w->hcap[b] <= j->len) {
        free(w->hbuf[b]);
        w->hbuf[b] = NULL;
        w->hcap[b] = 0;
        void *p = NULL;
        const size_t cap = j->len < SIZE_MAX - 2 * BFS_DIO_ALIGN ? (j->len + BFS_DIO_ALIGN) & ~(size_t)(BFS_DIO_ALIGN - 1) : 0;
        if (cap && posix_memalign(&p, BFS_DIO_ALIGN, cap) == 0) {
            w->hbuf[b] = p;
            w->hcap[b] = cap;
        }
    }
    j->buf = w->hbuf[b];
}

/* The hash and sha threads: the same jobs in the same order as the writer, from the unit
 * buffers, which stay untouched until every thread is done with them (the writer only
 * writes the headroom before a job's bytes). *done counts the jobs from head this thread
 * is done with; its seconds go to *secs. */
static void bfs__follow(bfs_wlane *l, int *done, int (*job)(bfs_writer *, const bfs_wjob *), double *secs)
{
    bfs_writer *const w = l->w;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        if (!bfs__next_job(w, l, done, done != &l->nxxh))
            break;
        if (done == &l->nxxh && l->q[(l->head + *done) % BFS_WQ_MAX].build)
            bfs__header_buf(w, l, *done);
        const bfs_wjob j = l->q[(l->head + *done) % BFS_WQ_MAX];
        pthread_mutex_unlock(&w->mu);
        const double t0 = bfs__wnow();
        bfs__err_clear();
        const int rc = bfs__errslot_put(&w->err, job(w, &j));
        const double dt = bfs__wnow() - t0;
        pthread_mutex_lock(&w->mu);
        *secs += dt;
        if (rc < 0 && w->rc == 0)
            w->rc = rc;
        (*done)++;
        bfs__writer_retire(w, l);
    }
    pthread_mutex_unlock(&w->mu);
}

static void *bfs__xxh_main(void *p)
{
    bfs_wlane *const l = p;
    bfs__follow(l, &l->nxxh, bfs__xxh_job, &l->st.hash);
    return NULL;
}

static void *bfs__sha_main(void *p)
{
    bfs_wlane *const l = p;
    bfs__follow(l, &l->nsha, bfs__sha_job, &l->st.sha);
    return NULL;
}

int bfs__writer_start(bfs_writer *w)
{
    w->cur = -1;
    bfs__errslot_init(&w->err);
    const char *d = getenv("BFSHARD_DIRECT");
    w->no_direct = d && !strcmp(d, "0");
    const char *dl = getenv("BFSHARD_TEST_WRITER_DELAY_US");
    w->delay_us = dl ? (unsigned)strtoul(dl, NULL, 10) % 1000000u : 0;
    bool ok = true;
    for (int i = 0; i < BFS_WRITER_FILES; i++) {
        void *c = NULL;
        w->files[i].fd = -1;
        w->files[i].ended = true;
        w->files[i].file_st = XXH3_createState();
        w->files[i].piece_st = XXH3_createState();
        ok = ok && w->files[i].file_st && w->files[i].piece_st;
        if (posix_memalign(&c, BFS_DIO_ALIGN, BFS_CARRY_BYTES) == 0)
            w->files[i].carry = c;
        ok = ok && c;
        if (w->sha)
            ok = ok && (w->files[i].sha = bfs__sha256_new()) != NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    for (int i = 0; i < BFS_WRITER_LANES; i++)
        pthread_cond_init(&w->lanes[i].cv, NULL);
    w->mu_init = true;
    if (!ok)
        return bfs__err(BFS_ENOMEM, "out of memory for the writer's files");
    w->nlanes = w->nlanes < 1 ? 1 : w->nlanes > BFS_WRITER_LANES ? BFS_WRITER_LANES : w->nlanes;
    for (int i = 0; i < w->nlanes; i++) {
        bfs_wlane *const l = &w->lanes[i];
        l->w = w;
        if (pthread_create(&l->tid, NULL, bfs__writer_main, l) != 0)
            return bfs__err(BFS_ENOMEM, "cannot start a writer thread");
        l->started = true;
        if (pthread_create(&l->xxh_tid, NULL, bfs__xxh_main, l) != 0)
            return bfs__err(BFS_ENOMEM, "cannot start a hash thread");
        l->xxh_started = true;
        if (w->sha) {
            if (pthread_create(&l->sha_tid, NULL, bfs__sha_main, l) != 0)
                return bfs__err(BFS_ENOMEM, "cannot start a SHA-256 thread");
            l->sha_started = true;
        }
    }
    return 0;
}

void bfs__writer_stages(bfs_writer *w, bfs_wstages *out)
{
    *out = w->st;
    if (w->mu_init)
        pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->nlanes; i++) {
        const bfs_wstages *s = &w->lanes[i].st;
        out->hash += s->hash;
        out->write += s->write;
        out->zst += s->zst;
        out->tail += s->tail;
        out->sha += s->sha;
        out->direct_bytes += s->direct_bytes;
        out->buffered_bytes += s->buffered_bytes;
    }
    if (w->mu_init)
        pthread_mutex_unlock(&w->mu);
}

void bfs__writer_stop(bfs_writer *w)
{
    if (w->mu_init) {
        pthread_mutex_lock(&w->mu);
        w->stop = true;
        pthread_cond_broadcast(&w->cv);
        for (int i = 0; i < BFS_WRITER_LANES; i++)
            pthread_cond_broadcast(&w->lanes[i].cv);
        pthread_mutex_unlock(&w->mu);
        for (int i = 0; i < BFS_WRITER_LANES; i++) {
            bfs_wlane *const l = &w->lanes[i];
            if (l->started)
                pthread_join(l->tid, NULL);
            if (l->xxh_started)
                pthread_join(l->xxh_tid, NULL);
            if (l->sha_started)
                pthread_join(l->sha_tid, NULL);
            l->started = l->xxh_started = l->sha_started = false;
        }
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        for (int i = 0; i < BFS_WRITER_LANES; i++)
            pthread_cond_destroy(&w->lanes[i].cv);
        w->mu_init = false;
    }
    for (int b = 0; b < 2; b++) {
        free(w->hbuf[b]);
        w->hbuf[b] = NULL;
        w->hcap[b] = 0;
    }
    for (int i = 0; i < BFS_WRITER_FILES; i++) {
        XXH3_freeState(w->files[i].file_st);
        XXH3_freeState(w->files[i].piece_st);
        w->files[i].file_st = w->files[i].piece_st = NULL;
        free(w->files[i].carry);
        w->files[i].carry = NULL;
        bfs__sha256_free(w->files[i].sha);
        w->files[i].sha = NULL;
    }
}

/* the first failure, made the caller's error */
static int bfs__writer_status(bfs_writer *w, int rc) { return rc < 0 ? bfs__errslot_get(&w->err) : 0; }

int bfs__writer_begin_file(bfs_writer *w, int fd, const char *what, bfs_dig16 *piece_dig, bfs_zst_writer *zw,
                           const bfs_plan *plan, const bfs_outfile *of)
{
    int k = 0;
    while (k < BFS_WRITER_FILES && w->files[k].claimed) /* claimed only by this thread */
        k++;
    if (k == BFS_WRITER_FILES)
        return bfs__err(BFS_EINTERNAL, "%s: begun while the writer holds %d files", what, BFS_WRITER_FILES);
    bfs_wfile *const f = &w->files[k];
    /* released only after its end ran (bfs__writer_wait_file), or after a failure */
    pthread_mutex_lock(&w->mu);
    const bool free_slot = f->ended;
    pthread_mutex_unlock(&w->mu);
    if (!free_slot)
        return bfs__err(BFS_EINTERNAL, "%s: begun in a slot whose file the writer has not ended", what);
    f->claimed = true;
    f->lane = w->next_lane;
    w->next_lane = (w->next_lane + 1) % (w->nlanes > 0 ? w->nlanes : 1);
    XXH3_128bits_reset(f->file_st);
    XXH3_128bits_reset(f->piece_st);
    f->piece_dig = piece_dig;
    f->of = of;
    w->cur = k;
    f->fd = fd;
    f->what = what;
    f->carry_off = 0;
    f->carry_len = 0;
    f->flushed = 0;
    f->written = 0;
    f->direct = false;
    f->ended = false;
    if (!w->no_direct)
        bfs__writer_set_direct(f, true); /* refused: buffered, the same bytes */
    f->zw = zw;
    f->zplan = plan;
    f->zpiece = -1;
    if (w->sha) {
        f->sha_hex[0] = '\0';
        if (bfs__sha256_reset(f->sha) < 0)
            return BFS_EINTERNAL;
    }
    return k;
}

int bfs__writer_use(bfs_writer *w, int file)
{
    if (file < 0 || file >= BFS_WRITER_FILES || !w->files[file].claimed)
        return bfs__err(BFS_EINTERNAL, "writer: jobs for slot %d, which holds no begun file", file);
    w->cur = file;
    return 0;
}

void bfs__writer_release_file(bfs_writer *w, int file)
{
    if (file >= 0 && file < BFS_WRITER_FILES)
        w->files[file].claimed = false;
}

int bfs__writer_end_file(bfs_writer *w, char hex[33])
{
    if (w->cur < 0)
        return bfs__err(BFS_EINTERNAL, "writer: a file's end before any file");
    hex[0] = '\0'; /* the hash thread's, at the end job */
    return bfs__writer_push(w, &(bfs_wjob){.buf = "", .len = 0, .piece = -1, .end = true, .hex = hex});
}

int bfs__writer_wait_file(bfs_writer *w, int file)
{
    const double t0 = bfs__wnow();
    pthread_mutex_lock(&w->mu);
    while (!w->files[file].ended && w->rc == 0)
        pthread_cond_wait(&w->cv, &w->mu);
    const int rc = w->rc;
    pthread_mutex_unlock(&w->mu);
    w->st.wait += bfs__wnow() - t0;
    return bfs__writer_status(w, rc);
}

const char *bfs__writer_file_sha256(const bfs_writer *w, int file) { return w->files[file].sha_hex; }

/* both hashes, 256 KiB at a time: the second reads it from L2 */
static void bfs__hash_both(bfs_wfile *f, const uint8_t *p, size_t len, bool piece)
{
    for (size_t o = 0; o < len;) {
        const size_t n = len - o < BFS_HASH_CHUNK ? len - o : BFS_HASH_CHUNK;
        bfs__xxh128_update(f->file_st, p + o, n);
        if (piece)
            bfs__xxh128_update(f->piece_st, p + o, n);
        o += n;
    }
}

static void bfs__piece_digest(bfs_wfile *f, int piece)
{
    bfs__dig16_of(XXH3_128bits_digest(f->piece_st), &f->piece_dig[piece]);
    XXH3_128bits_reset(f->piece_st);
}

static void bfs__writer_hash(bfs_writer *w, const bfs_wjob *j)
{
    bfs_wfile *const f = &w->files[j->file];
    if (j->piece >= 0 && j->piece_last > j->piece) { /* a batch: each piece's bytes, its hash */
        const uint8_t *p = j->buf;
        uint64_t o = j->off;
        for (int k = j->piece; k <= j->piece_last; k++) {
            const bfs_piece *pc = &f->of->pieces[k];
            const size_t n = k < j->piece_last ? (size_t)(pc->offset + pc->nbytes - o) : j->len - (size_t)(o - j->off);
            bfs__hash_both(f, p, n, true);
            if (k < j->piece_last || j->piece_end)
                bfs__piece_digest(f, k);
            p += n;
            o += n;
        }
    } else {
        bfs__hash_both(f, j->buf, j->len, j->piece >= 0);
        if (j->piece >= 0 && j->piece_end)
            bfs__piece_digest(f, j->piece);
    }
}

int bfs__writer_push(bfs_writer *w, const bfs_wjob *jin)
{
    if (w->cur < 0)
        return bfs__err(BFS_EINTERNAL, "writer: a job before any file");
    bfs_wjob j = *jin;
    j.file = w->cur;
    const bfs_outfile *of = w->files[j.file].of;
    if (j.piece >= 0 && j.piece_last > j.piece && (!of || (size_t)j.piece_last >= of->npieces))
        return bfs__err(BFS_EINTERNAL, "writer: a batch of pieces [%d, %d] without its file's pieces", j.piece,
                        j.piece_last);
    bfs_wlane *const l = &w->lanes[w->files[j.file].lane];
    const double t0 = bfs__wnow();
    pthread_mutex_lock(&w->mu);
    while (l->count == BFS_WQ_MAX)
        pthread_cond_wait(&w->cv, &w->mu);
    j.seq = w->pushed;
    if (j.build) { /* the header buffers take turns in push order (bfs__header_buf) */
        j.hb = (int)(w->hnext++ % 2);
        j.hwait = w->hjob[j.hb];
        w->hjob[j.hb] = j.seq + 1;
    }
    l->q[(l->head + l->count) % BFS_WQ_MAX] = j;
    l->count++;
    w->pushed++;
    pthread_cond_broadcast(&l->cv); /* only its lane's threads wait for a job */
    const int rc = w->rc;
    pthread_mutex_unlock(&w->mu);
    w->st.wait += bfs__wnow() - t0;
    return bfs__writer_status(w, rc);
}

int bfs__writer_wait(bfs_writer *w, int pending)
{
    const double t0 = bfs__wnow();
    pthread_mutex_lock(&w->mu);
    for (;;) {
        int count = 0;
        for (int i = 0; i < w->nlanes; i++)
            count += w->lanes[i].count;
        if (count <= pending)
            break;
        pthread_cond_wait(&w->cv, &w->mu);
    }
    const int rc = w->rc;
    pthread_mutex_unlock(&w->mu);
    w->st.wait += bfs__wnow() - t0;
    return bfs__writer_status(w, rc);
}

uint64_t bfs__writer_pushed(const bfs_writer *w) { return w->pushed; }

uint64_t bfs__writer_retired(bfs_writer *w)
{
    pthread_mutex_lock(&w->mu);
    const uint64_t n = bfs__retired_all(w);
    pthread_mutex_unlock(&w->mu);
    return n;
}

int bfs__writer_wait_job(bfs_writer *w, uint64_t n)
{
    const double t0 = bfs__wnow();
    pthread_mutex_lock(&w->mu);
    while (bfs__retired_all(w) < n)
        pthread_cond_wait(&w->cv, &w->mu);
    const int rc = w->rc;
    pthread_mutex_unlock(&w->mu);
    w->st.wait += bfs__wnow() - t0;
    return bfs__writer_status(w, rc);
}

bool bfs__writer_file_ended(bfs_writer *w, int file)
{
    pthread_mutex_lock(&w->mu);
    const bool e = w->files[file].ended;
    pthread_mutex_unlock(&w->mu);
    return e;
}
