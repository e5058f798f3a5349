/*
 * Compressed artifacts: the seekable zstd writer (format: zst_format.h). The bytes
 * it is given are cut into frames (at tensor boundaries and every frame_max bytes),
 * compressed by a pool of worker threads in a ring of slots, and written in order;
 * finish() appends the byte-group map (BYTEGROUP) and the seek table. Errors are
 * sticky: a worker's failure reaches the writer's owner through bfs_errslot.
 */
#include "zst/zst.h"
#include "base/bfs_io.h"
#include "zst/zst.h"
#include "zst/zst_format.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>
#include <zstd_errors.h>

static int bfs__online_cpus(void)
{
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

const char *bfs__zst_mode_name(int mode)
{
    return mode == BFS_ZST_BYTEGROUP ? "zstd-seekable-bf16-bytegroup-v1" : "zstd-seekable";
}

enum { BFS_SLOT_FREE = 0, BFS_SLOT_FILLING, BFS_SLOT_QUEUED, BFS_SLOT_BUSY, BFS_SLOT_DONE };

typedef struct bfs_zst_slot {
    uint8_t *in, *out;
    size_t in_len, out_len;
    bool bf16;    /* the bytes are elements of one BF16 tensor */
    bool grouped; /* decided at submission */
    int state;
    int rc;
    uint32_t xxh;
    bfs_errslot err; /* the worker's message when rc < 0 */
} bfs_zst_slot;

typedef struct bfs_zst_worker {
    struct bfs_zst_writer *w;
    pthread_t tid;
    bool started;
    ZSTD_CCtx *cctx;
    uint8_t *scratch, *out2; /* BYTEGROUP: the grouped bytes; the ungrouped attempt */
} bfs_zst_worker;

static void *bfs__zst_worker_main(void *p)
{
    bfs_zst_worker *wk = p;
    bfs_zst_writer *w = wk->w;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        bfs_zst_slot *s = NULL;
        for (int i = 0; i < w->count && !s; i++) {
            bfs_zst_slot *c = &w->slots[(w->head + i) % w->nslots];
            if (c->state == BFS_SLOT_QUEUED)
                s = c;
        }
        if (!s) {
            if (w->stop)
                break;
            pthread_cond_wait(&w->cv_work, &w->mu);
            continue;
        }
        s->state = BFS_SLOT_BUSY;
        pthread_mutex_unlock(&w->mu);

        s->rc = 0;
        bfs__err_clear(); /* this thread's message, for the slot's error */
        bfs__errslot_init(&s->err);
        s->xxh = (uint32_t)XXH64(s->in, s->in_len, 0);
        const uint8_t *src = s->in;
        if (s->grouped) {
            bfs__group(wk->scratch, s->in, s->in_len);
            src = wk->scratch;
        }
        size_t r = ZSTD_compress2(wk->cctx, s->out, w->out_cap, src, s->in_len);
        if (s->grouped && !ZSTD_isError(r)) {
            /* grouping loses on some data (dequantized 4-bit values): keep the smaller */
            const size_t r2 = ZSTD_compress2(wk->cctx, wk->out2, w->out_cap, s->in, s->in_len);
            if (!ZSTD_isError(r2) && r2 <= r) {
                memcpy(s->out, wk->out2, r2);
                r = r2;
                s->grouped = false;
            }
        }
        if (ZSTD_isError(r)) {
            /* libzstd allocates inside compress2: its allocation failure is ours (exit 5) */
            const int code = ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation ? BFS_ENOMEM : BFS_EINTERNAL;
            s->rc = bfs__errslot_put(&s->err, bfs__err(code, "zstd compression of a %zu-byte frame failed: %s",
                                                       s->in_len, ZSTD_getErrorName(r)));
        } else {
            s->out_len = r;
        }

        pthread_mutex_lock(&w->mu);
        s->state = BFS_SLOT_DONE;
        pthread_cond_broadcast(&w->cv_done);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Record the owner's failure rc (with its message) as the writer's sticky error. */
static int bfs__zst_fail(bfs_zst_writer *w, int rc)
{
    if (w->rc == 0) {
        w->rc = rc;
        bfs__errslot_put(&w->err, rc);
    }
    return rc;
}

/* The sticky error again, as the caller's error: its code, its first message. */
static int bfs__zst_sticky(bfs_zst_writer *w)
{
    bfs__errslot_get(&w->err);
    return w->rc;
}

/* Append one seek table entry. */
static int bfs__zst_entry(bfs_zst_writer *w, uint32_t csize, uint32_t dsize, uint32_t xxh, bool grouped)
{
    if (w->nent >= BFS_ZST_MAX_FRAMES)
        return bfs__zst_fail(w, bfs__err(BFS_EINPUT, "more than %u frames: use a larger frame size", BFS_ZST_MAX_FRAMES));
    if (w->nent == w->cap) {
        const size_t nc = w->cap ? 2 * w->cap : 1024;
        uint8_t *e = realloc(w->ent, nc * sizeof(bfs_zst_seek_entry));
        if (!e)
            return bfs__zst_fail(w, bfs__err(BFS_ENOMEM, "out of memory for the seek table"));
        w->ent = e;
        if (w->mode == BFS_ZST_BYTEGROUP) {
            uint8_t *m = realloc(w->map, nc / 8);
            if (!m)
                return bfs__zst_fail(w, bfs__err(BFS_ENOMEM, "out of memory for the seek table"));
            memset(m + w->cap / 8, 0, (nc - w->cap) / 8);
            w->map = m;
        }
        w->cap = nc;
    }
    bfs_zst_seek_entry *e = (bfs_zst_seek_entry *)w->ent + w->nent;
    bfs__le32(e->csize, csize);
    bfs__le32(e->dsize, dsize);
    bfs__le32(e->xxh, xxh);
    if (grouped)
        w->map[w->nent / 8] |= (uint8_t)(1u << (w->nent % 8));
    w->nent++;
    return 0;
}

static int bfs__zst_out(bfs_zst_writer *w, const void *p, size_t n)
{
    const int rc = bfs__pwrite_all(w->fd, p, n, w->out_off, "compressed output");
    if (rc < 0)
        return bfs__zst_fail(w, rc);
    bfs__xxh128_update(w->hash, p, n);
    w->out_off += n;
    return 0;
}

/* Wait for the oldest frame in flight, write it, free its slot. Called with mu held. */
static int bfs__zst_retire_head(bfs_zst_writer *w)
{
    bfs_zst_slot *s = &w->slots[w->head];
    while (s->state != BFS_SLOT_DONE)
        pthread_cond_wait(&w->cv_done, &w->mu);
    /* only this thread touches a DONE slot, the ring indices and the output: write unlocked */
    pthread_mutex_unlock(&w->mu);
    int rc = 0;
    if (s->rc < 0 && w->rc == 0) {
        rc = bfs__errslot_get(&s->err);
        bfs__zst_fail(w, rc);
    } else if (w->rc == 0) {
        rc = bfs__zst_out(w, s->out, s->out_len);
        if (rc == 0)
            rc = bfs__zst_entry(w, (uint32_t)s->out_len, (uint32_t)s->in_len, s->xxh, s->grouped);
    }
    pthread_mutex_lock(&w->mu);
    s->state = BFS_SLOT_FREE;
    w->head = (w->head + 1) % w->nslots;
    w->count--;
    return rc < 0 ? rc : w->rc;
}

/* End the frame being filled (if any bytes) and write whatever is finished. */
static int bfs__zst_submit(bfs_zst_writer *w)
{
    int rc = 0;
    pthread_mutex_lock(&w->mu);
    if (w->fill >= 0) {
        bfs_zst_slot *s = &w->slots[w->fill];
        if (s->in_len == 0) {
            s->state = BFS_SLOT_FREE;
            w->count--; /* it is the newest slot of the ring */
        } else {
            s->grouped = w->mode == BFS_ZST_BYTEGROUP && s->bf16 && s->in_len >= 2 && s->in_len % 2 == 0;
            s->state = BFS_SLOT_QUEUED;
            pthread_cond_signal(&w->cv_work);
        }
        w->fill = -1;
    }
    while (rc == 0 && w->count > 0 && w->slots[w->head].state == BFS_SLOT_DONE)
        rc = bfs__zst_retire_head(w);
    pthread_mutex_unlock(&w->mu);
    return rc < 0 ? rc : w->rc;
}

static int bfs__zst_fill_slot(bfs_zst_writer *w, bfs_zst_slot **out)
{
    int rc = 0;
    pthread_mutex_lock(&w->mu);
    if (w->fill < 0) {
        while (rc == 0 && w->count == w->nslots)
            rc = bfs__zst_retire_head(w);
        if (rc == 0) {
            w->fill = (w->head + w->count) % w->nslots;
            w->count++;
            bfs_zst_slot *s = &w->slots[w->fill];
            s->state = BFS_SLOT_FILLING;
            s->in_len = 0;
            s->bf16 = w->cur_bf16;
        }
    }
    if (rc == 0)
        *out = &w->slots[w->fill];
    pthread_mutex_unlock(&w->mu);
    return rc;
}

int bfs__zst_writer_create(int fd, int level, int nthreads, size_t max_frame_bytes, int mode, bfs_zst_writer **out)
{
    int rc = 0;
    *out = NULL;
    if (mode != BFS_ZST_PLAIN && mode != BFS_ZST_BYTEGROUP)
        return bfs__err(BFS_EUSAGE, "unknown compression mode %d", mode);
    if (level == 0)
        level = ZSTD_CLEVEL_DEFAULT;
    if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel())
        return bfs__err(BFS_EUSAGE, "zstd level %d is out of range (%d to %d)", level, ZSTD_minCLevel(), ZSTD_maxCLevel());
    if (max_frame_bytes == 0)
        max_frame_bytes = BFS_ZST_DEFAULT_FRAME;
    const size_t fmax = mode == BFS_ZST_BYTEGROUP ? BFS_ZST_MAX_GROUPED : BFS_ZST_MAX_DSIZE;
    if (max_frame_bytes < BFS_ZST_MIN_FRAME || max_frame_bytes > fmax)
        return bfs__err(BFS_EUSAGE, "frame size %zu is out of range (%u to %zu bytes)", max_frame_bytes,
                        BFS_ZST_MIN_FRAME, fmax);
    max_frame_bytes &= ~(size_t)63; /* even: a BF16 run's frames stay element-aligned */
    if (nthreads <= 0)
        nthreads = bfs__online_cpus();
    if (nthreads > 256)
        nthreads = 256;

    bfs_zst_writer *w = calloc(1, sizeof *w);
    if (!w)
        return bfs__err(BFS_ENOMEM, "out of memory");
    w->fd = fd;
    w->level = level;
    w->mode = mode;
    w->nthreads = nthreads;
    w->frame_max = max_frame_bytes;
    w->out_cap = ZSTD_compressBound(max_frame_bytes);
    w->nslots = nthreads + 2;
    w->fill = -1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv_work, NULL);
    pthread_cond_init(&w->cv_done, NULL);
    bfs__errslot_init(&w->err);
    w->sync_ok = true;
    w->hash = XXH3_createState();
    w->ihash = XXH3_createState();
    w->slots = calloc((size_t)w->nslots, sizeof *w->slots);
    w->workers = calloc((size_t)nthreads, sizeof *w->workers);
    if (!w->hash || !w->ihash || !w->slots || !w->workers)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    XXH3_128bits_reset(w->hash);
    XXH3_128bits_reset(w->ihash);
    for (int i = 0; i < w->nslots; i++) {
        w->slots[i].in = malloc(max_frame_bytes);
        w->slots[i].out = malloc(w->out_cap);
        if (!w->slots[i].in || !w->slots[i].out)
            BFS_FAIL(BFS_ENOMEM, "out of memory for %d compression buffers of %zu bytes (use fewer threads)", w->nslots,
                     max_frame_bytes + w->out_cap);
    }
    for (int i = 0; i < nthreads; i++) {
        bfs_zst_worker *wk = &w->workers[i];
        wk->w = w;
        wk->cctx = ZSTD_createCCtx();
        if (!wk->cctx)
            BFS_FAIL(BFS_ENOMEM, "out of memory for a zstd context");
        if (ZSTD_isError(ZSTD_CCtx_setParameter(wk->cctx, ZSTD_c_compressionLevel, level)) ||
            ZSTD_isError(ZSTD_CCtx_setParameter(wk->cctx, ZSTD_c_checksumFlag, 1)) ||
            ZSTD_isError(ZSTD_CCtx_setParameter(wk->cctx, ZSTD_c_contentSizeFlag, 1)))
            BFS_FAIL(BFS_EINTERNAL, "cannot set zstd parameters (level %d)", level);
        if (mode == BFS_ZST_BYTEGROUP &&
            (!(wk->scratch = malloc(max_frame_bytes)) || !(wk->out2 = malloc(w->out_cap))))
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        if (pthread_create(&wk->tid, NULL, bfs__zst_worker_main, wk) != 0)
            BFS_FAIL(BFS_ENOMEM, "cannot start a compression thread");
        wk->started = true;
    }
    if (mode == BFS_ZST_BYTEGROUP) {
        bfs_zst_bg_header hdr;
        memcpy(hdr.magic, BFS_ZST_BG_MAGIC, sizeof hdr.magic);
        bfs__le32(hdr.version, BFS_ZST_BG_VERSION);
        bfs__le32(hdr.transform, BFS_ZST_BG_TRANSFORM);
        BFS_TRY(bfs__zst_out(w, &hdr, sizeof hdr));
        BFS_TRY(bfs__zst_entry(w, BFS_ZST_BG_HEADER, 0, 0, false));
    }
    *out = w;
    return 0;
cleanup:
    bfs__zst_writer_free(w);
    return rc;
}

int bfs__zst_write(bfs_zst_writer *w, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    if (w->rc < 0)
        return bfs__zst_sticky(w);
    if (w->finished)
        return bfs__err(BFS_EINTERNAL, "bfs__zst_write after bfs__zst_finish");
    bfs__xxh128_update(w->ihash, buf, len);
    while (len > 0) {
        bfs_zst_slot *s = NULL;
        int rc = bfs__zst_fill_slot(w, &s);
        if (rc < 0)
            return bfs__zst_sticky(w);
        const size_t n = len < w->frame_max - s->in_len ? len : w->frame_max - s->in_len;
        memcpy(s->in + s->in_len, p, n);
        s->in_len += n;
        p += n;
        len -= n;
        w->in_total += n;
        if (s->in_len == w->frame_max && (rc = bfs__zst_submit(w)) < 0)
            return bfs__zst_sticky(w);
    }
    return 0;
}

int bfs__zst_cut(bfs_zst_writer *w)
{
    if (w->rc < 0)
        return bfs__zst_sticky(w);
    const int rc = bfs__zst_submit(w);
    w->cur_bf16 = false;
    return rc < 0 ? bfs__zst_sticky(w) : 0;
}

int bfs__zst_cut_tensor(bfs_zst_writer *w, bfs_dtype dtype)
{
    const int rc = bfs__zst_cut(w);
    w->cur_bf16 = dtype == BFS_DT_BF16;
    return rc;
}

/* BYTEGROUP: the map frame, one bit per seek table entry (its own included), and its entry. */
static int bfs__zst_write_map(bfs_zst_writer *w)
{
    const size_t nbits = w->nent + 1, mb = (nbits + 7) / 8, fsz = sizeof(bfs_zst_map_hdr) + mb;
    uint8_t *m = calloc(1, fsz);
    if (!m)
        return bfs__zst_fail(w, bfs__err(BFS_ENOMEM, "out of memory"));
    bfs_zst_map_hdr *mh = (bfs_zst_map_hdr *)m;
    bfs__le32(mh->skip.magic, BFS_ZST_MAP_MAGIC);
    bfs__le32(mh->skip.size, (uint32_t)(fsz - sizeof mh->skip));
    memcpy(mh->tag, BFS_ZST_MAP_TAG, sizeof mh->tag);
    memcpy(m + sizeof *mh, w->map, (w->nent + 7) / 8);
    int rc = bfs__zst_out(w, m, fsz);
    free(m);
    if (rc == 0)
        rc = bfs__zst_entry(w, (uint32_t)fsz, 0, 0, false);
    return rc;
}

/* The seek table: skippable frame header, the packed entries, the footer. */
static int bfs__zst_write_table(bfs_zst_writer *w)
{
    bfs_zst_skip_hdr sh;
    bfs_zst_seek_footer ft;
    const size_t es = w->nent * sizeof(bfs_zst_seek_entry);
    bfs__le32(sh.magic, BFS_ZST_SKIP_MAGIC);
    bfs__le32(sh.size, (uint32_t)(es + sizeof ft));
    bfs__le32(ft.nframes, (uint32_t)w->nent);
    ft.desc = BFS_ZST_SEEK_CHECKSUMS;
    bfs__le32(ft.magic, BFS_ZST_SEEK_MAGIC);
    int rc = bfs__zst_out(w, &sh, sizeof sh);
    if (rc == 0)
        rc = bfs__zst_out(w, w->ent, es);
    if (rc == 0)
        rc = bfs__zst_out(w, &ft, sizeof ft);
    return rc;
}

int bfs__zst_finish(bfs_zst_writer *w, uint64_t *compressed_size)
{
    int rc = bfs__zst_cut(w);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&w->mu);
    while (rc == 0 && w->count > 0)
        rc = bfs__zst_retire_head(w);
    pthread_mutex_unlock(&w->mu);
    if (rc < 0)
        return bfs__zst_sticky(w);
    if (w->mode == BFS_ZST_BYTEGROUP && (rc = bfs__zst_write_map(w)) < 0)
        return rc;
    if ((rc = bfs__zst_write_table(w)) < 0)
        return rc;
    w->finished = true;
    if (compressed_size)
        *compressed_size = w->out_off;
    return 0;
}

void bfs__zst_writer_hashes(const bfs_zst_writer *w, char compressed_hex[33], char uncompressed_hex[33])
{
    if (compressed_hex)
        bfs__hash_hex(XXH3_128bits_digest(w->hash), compressed_hex);
    if (uncompressed_hex)
        bfs__hash_hex(XXH3_128bits_digest(w->ihash), uncompressed_hex);
}

uint64_t bfs__zst_writer_frames(const bfs_zst_writer *w) { return w->nent; }

void bfs__zst_writer_free(bfs_zst_writer *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_broadcast(&w->cv_work);
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; w->workers && i < w->nthreads; i++) {
        if (w->workers[i].started)
            pthread_join(w->workers[i].tid, NULL);
        ZSTD_freeCCtx(w->workers[i].cctx);
        free(w->workers[i].scratch);
        free(w->workers[i].out2);
    }
    for (int i = 0; w->slots && i < w->nslots; i++) {
        free(w->slots[i].in);
        free(w->slots[i].out);
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv_work);
    pthread_cond_destroy(&w->cv_done);
    XXH3_freeState(w->hash);
    XXH3_freeState(w->ihash);
    free(w->workers);
    free(w->slots);
    free(w->ent);
    free(w->map);
    free(w);
}
