/*
 * CUDA backend, the pipeline of one unit, or of a batch of units one after the other, on one
 * device (bfs__cu_pipeline_n): chunks through the two slots, gathered into pinned memory by
 * this thread and the device's gather helper thread (half each) while the device works on
 * the chunk before, H2D, kernel, D2H on three streams ordered by events, drained into the
 * unit's buffer (backend_cuda.c's opening comment describes it), and a failed pipeline's
 * error rewritten when the device's context is lost. Uses backend_cuda_q.c (job, layout,
 * launch) and backend_cuda_dev.c (devices); run() and the start-up self-test call it.
 */
#include "backend/backend_cuda.h"
#include "../../kernels/ref_formats.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static uint8_t *cu_slot_h(const cu_dev *d, const cu_backend *b, int k)
{
    return d->h_arena + CU_CONST_BYTES + (uint64_t)k * b->slot;
}
static uint8_t *cu_slot_d(const cu_dev *d, const cu_backend *b, int k)
{
    return d->d_arena + CU_CONST_BYTES + (uint64_t)k * b->slot;
}

/* ch's input into its place in slot h: whole (part -1), or half of it (part 0 or 1: half of
 * each array's bytes, or of its rows when they are gathered row by row), so that two
 * threads gather one load together. */
static void cu_gather_in(const cu_chunk *ch, uint8_t *h, int part)
{
    h += ch->base;
    for (int i = 0; i < ch->ngather; i++) {
        const cu_gather *g = &ch->g[i];
        if (g->nrows == 1 || g->stride == g->row_bytes) {
            const uint64_t total = g->row_bytes * g->nrows;
            const uint64_t lo = part == 1 ? total / 2 : 0, hi = part == 0 ? total / 2 : total;
            memcpy(h + g->off + lo, g->src + lo, hi - lo);
        } else {
            const uint64_t r0 = part == 1 ? g->nrows / 2 : 0, r1 = part == 0 ? g->nrows / 2 : g->nrows;
            for (uint64_t r = r0; r < r1; r++)
                memcpy(h + g->off + r * g->row_bytes, g->src + r * g->stride, g->row_bytes);
        }
    }
}

static void cu_gather_group(const cu_group *g, uint8_t *h, int part)
{
    for (int i = 0; i < g->n; i++)
        cu_gather_in(&g->ch[i], h, part);
}

const float bfs__cu_nf4[16] = BFS_NF4_TABLE_INIT;
static const float cu_fp4[16] = BFS_FP4_TABLE_INIT;

/* The error of a failed pipeline on d, rewritten when the device's context is lost:
 * which tensor, which chunks were in flight, what it means, what to do. */
static int cu_fault(cu_dev *d, const cu_job *j, int rc, int chunks, int drained, uint64_t pos0, uint64_t pos1)
{
    if (rc != BFS_EDEVICE || !bfs__cu_check_lost(d))
        return rc;
    char first[512];
    snprintf(first, sizeof first, "%s", bfs_last_error());
    bfs__err_clear(); /* the first error wins: replace it with the full story */
    snprintf(d->lost_msg, sizeof d->lost_msg, "%s (%s) in tensor %s", cudaGetErrorName(d->lost),
             cudaGetErrorString(d->lost), j->t->name);
    return bfs__err(BFS_EDEVICE,
                    "cuda:%d: the GPU faulted while converting tensor %s: %s (%s), found at chunk %d of this "
                    "unit (chunks %d-%d in flight: %ss [%" PRIu64 ", %" PRIu64 ")); the CUDA context of this device "
                    "is lost, nothing more can run on it in this process; rerun with --device cpu "
                    "(and please report it with this message) [first error: %s]",
                    d->id, j->t->name, cudaGetErrorName(d->lost), cudaGetErrorString(d->lost), drained + 1,
                    drained + 1, chunks, bfs__cu_what(j), pos0, pos1, first);
}

/* ---- the gather helper: one thread per device -------------------------------------------- */
/* Below this many input bytes a chunk is gathered on the pipeline's own thread: handing it
 * over costs more than the copy. On the emulated runtime every chunk goes through the helper,
 * so that its races with the streams (which jitter there) show as wrong output. */
#ifdef BFS_CUDA_EMULATE
static const uint64_t cu_handoff = 0;
#else
static const uint64_t cu_handoff = (uint64_t)256 << 10;
#endif

static void *cu_gather_main(void *p)
{
    cu_dev *d = p;
    pthread_mutex_lock(&d->g_m);
    for (;;) {
        while (!d->g_work && !d->g_stop)
            pthread_cond_wait(&d->g_c, &d->g_m);
        if (!d->g_work)
            break;
        const cu_group *g = d->g_work;
        uint8_t *h = d->g_dst;
        pthread_mutex_unlock(&d->g_m);
        cu_gather_group(g, h, 1); /* the second half; the pipeline's thread does the first */
        pthread_mutex_lock(&d->g_m);
        d->g_work = NULL;
        pthread_cond_broadcast(&d->g_c);
    }
    pthread_mutex_unlock(&d->g_m);
    return NULL;
}

/* The helper of d (none when its thread cannot be made: chunks are gathered inline). */
int bfs__cu_gather_start(cu_dev *d)
{
    if (pthread_mutex_init(&d->g_m, NULL) != 0)
        return 0;
    if (pthread_cond_init(&d->g_c, NULL) != 0) {
        pthread_mutex_destroy(&d->g_m);
        return 0;
    }
    d->g_work = NULL;
    d->g_stop = false;
    d->g_run = pthread_create(&d->g_th, NULL, cu_gather_main, d) == 0;
    if (!d->g_run) {
        pthread_cond_destroy(&d->g_c);
        pthread_mutex_destroy(&d->g_m);
    }
    return 0;
}

void bfs__cu_gather_stop(cu_dev *d)
{
    if (!d->g_run)
        return;
    pthread_mutex_lock(&d->g_m);
    d->g_stop = true;
    pthread_cond_broadcast(&d->g_c);
    pthread_mutex_unlock(&d->g_m);
    pthread_join(d->g_th, NULL);
    pthread_cond_destroy(&d->g_c);
    pthread_mutex_destroy(&d->g_m);
    d->g_run = false;
}

/* g's input into h: when it is large enough, its second half posted to the helper (true:
 * this thread gathers the first half, then cu_gather_wait), else all of it here (false) */
static bool cu_gather_post(cu_dev *d, const cu_group *g, uint8_t *h)
{
    if (!d->g_run || g->in_end < cu_handoff) {
        cu_gather_group(g, h, -1);
        return false;
    }
    pthread_mutex_lock(&d->g_m);
    d->g_work = g;
    d->g_dst = h;
    pthread_cond_broadcast(&d->g_c);
    pthread_mutex_unlock(&d->g_m);
    return true;
}

/* the posted gather done: its slot's input is complete (and nothing writes it any more) */
static void cu_gather_wait(cu_dev *d)
{
    if (!d->g_run)
        return;
    pthread_mutex_lock(&d->g_m);
    while (d->g_work)
        pthread_cond_wait(&d->g_c, &d->g_m);
    pthread_mutex_unlock(&d->g_m);
}

/* ---- the pipeline ------------------------------------------------------------------------------ */
/* A slot holds several small jobs whole (each at its own 256-aligned base) up to this many bytes. */
#define CU_PACK_BYTES ((uint64_t)1 << 20)

static bool cu_has_tables(const cu_job *j) { return j->mode == J_BNB || j->mode == J_NVFP4; }

/* The next slot's load from jobs[*ji..nj) in *g (false in *have when none is left): the next
 * chunk; when it ends its job and is small, the next jobs whole after it while they fit
 * CU_PACK_BYTES (none with tables of its own: the const area holds one job's). */
static int cu_cut(const cu_backend *b, cu_job *jobs, int nj, int *ji, int *cut_job, cu_group *g, bool *have)
{
    while (*ji < nj && jobs[*ji].pos >= jobs[*ji].end)
        (*ji)++;
    *have = *ji < nj;
    g->n = 0;
    if (!*have)
        return 0;
    cu_job *j = &jobs[*ji];
    uint64_t n = 0;
    const int rc = bfs__cu_choose(b, j, j->pos, j->cap, &n);
    if (rc < 0)
        return rc;
    cu_chunk *c0 = &g->ch[0];
    uint64_t end = bfs__cu_layout(j, j->pos, n, c0);
    c0->job = *ji;
    c0->first = *cut_job != *ji;
    *cut_job = *ji;
    j->pos += n;
    g->n = 1;
    const uint64_t room = b->slot < CU_PACK_BYTES ? b->slot : CU_PACK_BYTES;
    while (g->n < CU_GROUP_MAX && j->pos >= j->end && end <= room) {
        int nx = *ji + 1;
        while (nx < nj && jobs[nx].pos >= jobs[nx].end)
            nx++;
        if (nx >= nj || jobs[nx].mode == J_MX_GROUPS || cu_has_tables(&jobs[nx]))
            break;
        cu_job *x = &jobs[nx];
        const uint64_t base = cu_al(end), fp = bfs__cu_fp(x, x->pos, x->end - x->pos);
        if (base + fp > room)
            break;
        cu_chunk *c = &g->ch[g->n++];
        bfs__cu_layout(x, x->pos, x->end - x->pos, c);
        c->base = base;
        c->job = nx;
        c->first = true;
        x->pos = x->end;
        *ji = *cut_job = nx;
        j = x;
        end = base + fp;
    }
    const cu_chunk *last = &g->ch[g->n - 1];
    g->in_end = last->base + last->in_bytes;
    g->out_lo = c0->base + c0->out_off;
    g->out_hi = last->base + last->out_off + last->out_bytes;
    g->staged = g->n > 1 || !jobs[c0->job].in_place;
    return 0;
}

/* The job's constant tables (bnb code tables, NVFP4 block scales) into the const area, before
 * its first chunk. The one before's: its upload (host) and kernels (device) are done with it. */
static int cu_tables(const cu_backend *b, cu_dev *d, const cu_job *j, int c)
{
    int rc = 0;
    (void)b;
    if (!cu_has_tables(j))
        return 0;
    if (c > 0) { /* load c-1 is the last one enqueued: its H2D and kernels came after any earlier table */
        CUDA_CHECK(cudaEventSynchronize(d->ev_up[(c - 1) & 1]));
        CUDA_CHECK(cudaStreamWaitEvent(d->s_up, d->ev_comp[(c - 1) & 1], 0));
    }
    if (j->mode == J_BNB) {
        const float *table = j->t->bnb.table;
        if (!table)
            table = strcmp(j->t->quant_type, "fp4") == 0 ? cu_fp4 : bfs__cu_nf4;
        memcpy(d->h_arena, table, 16 * sizeof(float));
        uint64_t bytes = 16 * sizeof(float);
        if (j->dq) {
            memcpy(d->h_arena + CU_NCODE_OFF, j->t->bnb.nested_code, 256 * sizeof(float));
            bytes = CU_NCODE_OFF + 256 * sizeof(float);
        }
        CUDA_CHECK(cudaMemcpyAsync(d->d_arena, d->h_arena, bytes, cudaMemcpyHostToDevice, d->s_up));
    } else { /* the block scale of every E4M3 byte, by the reference */
        float *bs = (float *)d->h_arena;
        for (unsigned s = 0; s < 256; s++)
            bs[s] = bfs_nvfp4_block_scale((uint8_t)s, j->t->nv.global_scale, j->t->nv.modelopt);
        CUDA_CHECK(cudaMemcpyAsync(d->d_arena, d->h_arena, 256 * sizeof(float), cudaMemcpyHostToDevice, d->s_up));
    }
cleanup:
    return rc;
}

/* Load c (gathered in slot c%2) onto the streams: one H2D, its kernels, one D2H, each after
 * what it must follow. prev: load c-2, the slot's last user (NULL for c < 2). */
static int cu_enqueue(const cu_backend *b, cu_dev *d, const cu_job *jobs, const cu_group *g, const cu_group *prev,
                      int c)
{
    int rc = 0;
    const int k = c & 1;
    uint8_t *hs = cu_slot_h(d, b, k), *ds = cu_slot_d(d, b, k);
    const cu_chunk *c0 = &g->ch[0];
    if (c0->first)
        BFS_TRY(cu_tables(b, d, &jobs[c0->job], c));
    CUDA_CHECK(cudaStreamWaitEvent(d->s_up, d->ev_comp[k], 0)); /* load c-2's kernels have read their input */
    if (prev && g->in_end > prev->out_lo) /* ... and its output, which this input overwrites, is down */
        CUDA_CHECK(cudaStreamWaitEvent(d->s_up, d->ev_down[k], 0));
    CUDA_CHECK(cudaMemcpyAsync(ds, hs, g->in_end, cudaMemcpyHostToDevice, d->s_up));
    CUDA_CHECK(cudaEventRecord(d->ev_up[k], d->s_up));
    CUDA_CHECK(cudaStreamWaitEvent(d->s_comp, d->ev_up[k], 0));
    CUDA_CHECK(cudaStreamWaitEvent(d->s_comp, d->ev_down[k], 0));
    for (int i = 0; i < g->n; i++)
        BFS_TRY(bfs__cu_launch(&jobs[g->ch[i].job], &g->ch[i], d, ds + g->ch[i].base));
    CUDA_CHECK(cudaEventRecord(d->ev_comp[k], d->s_comp));
    CUDA_CHECK(cudaStreamWaitEvent(d->s_down, d->ev_comp[k], 0));
    /* D2H straight into the unit's buffer when it is pinned (the ring's, from host_alloc) */
    if (g->staged)
        CUDA_CHECK(cudaMemcpyAsync(hs + g->out_lo, ds + g->out_lo, g->out_hi - g->out_lo, cudaMemcpyDeviceToHost,
                                   d->s_down));
    else
        CUDA_CHECK(cudaMemcpyAsync(c0->dst, ds + c0->out_off, c0->out_bytes, cudaMemcpyDeviceToHost, d->s_down));
    CUDA_CHECK(cudaEventRecord(d->ev_down[k], d->s_down));
cleanup:
    return rc;
}

/* Load c's output in its units' buffers: its D2H waited for; copied out of the staging
 * unless it landed in place. */
static int cu_drain(const cu_backend *b, const cu_dev *d, int c, const cu_group *g)
{
    CUDA_CHECK_RET(cudaEventSynchronize(d->ev_down[c & 1]));
    for (int i = 0; g->staged && i < g->n; i++) {
        const cu_chunk *ch = &g->ch[i];
        memcpy(ch->dst, cu_slot_h(d, b, c & 1) + ch->base + ch->out_off, ch->out_bytes);
    }
    return 0;
}

/*
 * The chunks of jobs[0..nj), in order, through the two slots of d, one load (a chunk, or
 * small jobs whole) a slot. Round c: load c (its input gathered in slot c%2) is enqueued;
 * load c+1 is cut and half its gather posted to the helper once the H2D of load c-1 (the
 * slot's last user) has read the staging; load c-1 is drained meanwhile (only a wait for its
 * D2H, and a copy, when it did not land in place; first when the next input would overwrite
 * its staged output); then this thread gathers the other half and waits for the helper's.
 * So the next load's input is gathered, by two threads, while the device works on this one,
 * and a batch's units follow each other with no pause: only the last load is waited for
 * before returning.
 */
int bfs__cu_pipeline_n(const cu_backend *b, cu_dev *d, cu_job *jobs, int nj)
{
    int rc = 0, c = 0, prev_dev = -1, drained = 0, ji = 0, cut_job = -1;
    cu_group grp[3]; /* load c is grp[c % 3]: c+1 is cut while c-1 is drained */
    bool have = false, pending = false;
    const cu_job *fj = jobs; /* for the fault message: the job of the last load enqueued */
    uint64_t f0 = 0, f1 = 0;
    if (d->lost != cudaSuccess)
        return bfs__err(BFS_EDEVICE,
                        "cuda:%d: cannot convert tensor %s: this device's CUDA context was lost by an earlier fault "
                        "(%s); rerun with --device cpu",
                        d->id, nj > 0 ? jobs[0].t->name : "?", d->lost_msg);
    BFS_TRY(bfs__cu_enter(d->id, &prev_dev));
    BFS_TRY(cu_cut(b, jobs, nj, &ji, &cut_job, &grp[0], &have));
    if (have)
        cu_gather_group(&grp[0], cu_slot_h(d, b, 0), -1);
    while (have) {
        const cu_group *cur = &grp[c % 3], *prev = c >= 2 ? &grp[(c + 1) % 3] : NULL; /* (c-2) % 3 */
        const cu_chunk *c0 = &cur->ch[0];
        fj = &jobs[c0->job];
        f1 = c0->pos + c0->n;
        if (c0->first || c == 0)
            f0 = c0->pos;
        BFS_TRY(cu_enqueue(b, d, jobs, cur, prev, c));
        c++;
        /* load c (the next) into slot c%2, whose last user was load c-2 */
        cu_group *next = &grp[c % 3];
        BFS_TRY(cu_cut(b, jobs, nj, &ji, &cut_job, next, &have));
        const cu_group *old = c >= 2 ? &grp[(c - 2) % 3] : NULL;
        bool old_done = old == NULL;
        if (have && old && old->staged && next->in_end > old->out_lo) {
            BFS_TRY(cu_drain(b, d, c - 2, old)); /* its staged output is in the way */
            drained++;
            old_done = true;
        }
        if (have) {
            if (c >= 2)
                CUDA_CHECK(cudaEventSynchronize(d->ev_up[c & 1])); /* load c-2's H2D has read the staging */
            pending = cu_gather_post(d, next, cu_slot_h(d, b, c & 1));
        }
        if (!old_done && old->staged)
            BFS_TRY(cu_drain(b, d, c - 2, old));
        drained += !old_done; /* in place: its D2H is waited for with the last load's */
        if (pending) { /* this thread's half, then the helper's */
            cu_gather_group(next, cu_slot_h(d, b, c & 1), 0);
            cu_gather_wait(d);
            pending = false;
        }
    }
    if (c > 0) { /* the last load: its D2H follows every earlier one on the download stream */
        BFS_TRY(cu_drain(b, d, c - 1, &grp[(c - 1) % 3]));
        drained++;
    }
cleanup:
    if (pending) /* the helper may still be writing the staging */
        cu_gather_wait(d);
    if (rc < 0) { /* nothing may still be copying into or out of the staging when we return */
        cu_sync_streams(d);
        rc = cu_fault(d, fj, rc, c, drained, f0, f1);
    }
    bfs__cu_leave(prev_dev);
    return rc;
}

/* One job's chunks of at most cap bytes. */
int bfs__cu_pipeline(const cu_backend *b, cu_dev *d, cu_job *j, uint64_t cap)
{
    j->cap = cap;
    return bfs__cu_pipeline_n(b, d, j, 1);
}
