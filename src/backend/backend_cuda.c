/*
 * CUDA backend: dequantizes one unit at a time on the GPU through buffers
 * allocated once, at creation, from the gpu_mem budget.
 *
 * Memory, per device (everything allocated in bfs__backend_cuda_create):
 *   device arena (one cudaMalloc):  [const 4 KiB][slot 0: S bytes][slot 1: S bytes]
 *   pinned host arena (one cudaHostAlloc), the same layout, as staging.
 * const holds the bnb code tables of the unit in flight. A slot holds one
 * chunk: its input arrays (each 256-byte aligned) then its output. S is the
 * largest multiple of 256 with 4 KiB + 2 S <= gpu_mem, capped at 64 MiB
 * (larger chunks only lengthen the pipeline's fill and drain) and at what the
 * largest unit (max_unit_bytes) can use. device_bytes = sum of the device arenas.
 *
 * run(): synchronous for the caller. The unit is cut into chunks that fit a
 * slot (and into at least 4 when the unit is large, so the stages overlap):
 *   MXFP4, output [.., R, C]:          whole rows r of the flattened items
 *   MXFP4, transposed output [E, C, R]: whole items, or when one item is too
 *                                      big, a range of groups of one item (its
 *                                      output rows c are contiguous; the input
 *                                      rows are gathered on the host)
 *   bnb 4-bit, casts, FP8, INT4, NVFP4: element ranges (FP8/INT4/NVFP4: each input
 *                                      array from the first entry the range needs to the
 *                                      last: scale rows, packed words, zero-point rows)
 * Chunk k: its input gathered from the mmapped source into pinned slot k%2
 * (by this thread and the device's gather helper thread, half each, while the
 * device works on the chunk before);
 * H2D on the upload stream; kernel on the compute stream; D2H on the download
 * stream, straight into unit->out when it is pinned (host_alloc: convert's ring
 * buffers); events order them, so H2D of chunk k+1 overlaps the kernel of chunk
 * k and the D2H of chunk k-1. The host waits only for the H2D of chunk k-1
 * before gathering chunk k+1 into its slot, for chunk k-1's D2H when it must
 * copy it out of the staging (unit->out not pinned), and for the last D2H.
 *
 * run_batch(): convert's batches of small pieces, one pipeline on one device
 * (each unit's chunks right after the one before's; bnb / NVFP4 tables go up
 * after the last kernel that read the ones before), waited for once. Small
 * units share a slot whole (up to 16, 1 MiB: one H2D, a kernel each, one D2H
 * into the staging, copied out).
 *
 * Several devices ("cuda:0,1"): gpu_mem is the budget of each device. A large
 * unit is split into one contiguous share per device, each run by the same
 * pipeline on its own thread; small units go to a free device in turn. run()
 * may also be called from several threads at once (one pipeline per device at
 * a time, under the device's lock).
 */
#include "backend/backend_cuda.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- run(): one unit over the devices (the pipeline of a chunk: backend_cuda_pipe.c) ---- */
/* One device's share of a unit, run on its own thread when the unit is split. */
typedef struct cu_part {
    const cu_backend *b;
    cu_dev *d;
    cu_job j;
    uint64_t cap;
    bfs_errslot err; /* bfs__err is per thread: its code and message, carried back */
} cu_part;

static void *cu_part_main(void *p)
{
    cu_part *a = p;
    pthread_mutex_lock(&a->d->lock);
    const int rc = bfs__cu_pipeline(a->b, a->d, &a->j, a->cap);
    pthread_mutex_unlock(&a->d->lock);
    bfs__errslot_put(&a->err, rc);
    return NULL;
}

/* [p, p + n) inside one of host_alloc's pinned buffers */
static bool cu_is_pinned(cu_backend *b, const void *p, uint64_t n)
{
    bool yes = false;
    const uint8_t *q = p;
    pthread_mutex_lock(&b->pin_lock);
    for (const cu_pinned *x = b->pinned; x && !yes; x = x->next)
        yes = q >= x->p && q <= x->p + x->n && n <= (uint64_t)(x->p + x->n - q);
    pthread_mutex_unlock(&b->pin_lock);
    return yes;
}

/* A unit that needs no device (empty, or passthrough: its bytes as they are): done here,
 * *done set. Otherwise its job, in place when its buffer is pinned, with its chunk cap:
 * each device's share in at least CU_SPLIT chunks when that keeps them >= CU_CHUNK_MIN, so
 * upload, kernel and download overlap. *whole: the footprint of the whole unit. */
static int cu_prepare(cu_backend *b, const bfs_unit *u, cu_job *j, bool *done, uint64_t *whole)
{
    const bfs_ltensor *t = u ? u->t : NULL;
    *done = true;
    if (!t || t->members || u->row0 > u->row1 || u->row1 > t->d0 || (!u->out && u->row1 > u->row0))
        return bfs__err(BFS_EINTERNAL, "cuda backend: bad unit (rows [%" PRIu64 ", %" PRIu64 ") of %s)",
                        u ? u->row0 : 0, u ? u->row1 : 0, t ? t->name : "?");
    if (u->row0 == u->row1 || t->row_elems == 0)
        return 0;
    if (t->kind == BFS_K_PASS) { /* no GPU: the bytes as they are */
        const size_t es = bfs__dtype_size(t->out_dtype);
        uint64_t off, bytes;
        if (es == 0 || t->nsrc < 1 || !t->src[0] || !t->src[0]->data ||
            !bfs__mul_ok(u->row0 * t->row_elems, es, &off) ||
            !bfs__mul_ok((u->row1 - u->row0) * t->row_elems, es, &bytes))
            return bfs__err(BFS_EINTERNAL, "tensor %s: bad passthrough", t->name);
        memcpy(u->out, t->src[0]->data + off, bytes);
        return 0;
    }
    *done = false;
    const int rc = bfs__cu_job_init(b, u, j);
    if (rc < 0)
        return rc;
    j->in_place = cu_is_pinned(b, u->out, (u->row1 - u->row0) * t->row_elems * 2);
    *whole = bfs__cu_fp(j, j->pos, j->end - j->pos);
    uint64_t cap = *whole / ((uint64_t)CU_SPLIT * (uint64_t)b->ndev);
    if (cap < CU_CHUNK_MIN)
        cap = CU_CHUNK_MIN;
    if (cap > b->slot)
        cap = b->slot;
    j->cap = cap;
    if (j->mode == J_MX_ITEMS && bfs__cu_fp(j, j->pos, 1) > cap) { /* one item is too big: groups of one item */
        j->mode = J_MX_GROUPS;
        j->pos = 0;
        j->end = (u->row1 - u->row0) * j->G;
        j->first = u->row0;
    }
    return 0;
}

/* A free device, else the next in turn, waited for (callers on several threads); locked. */
static cu_dev *cu_take_dev(cu_backend *b)
{
    const unsigned start = atomic_fetch_add(&b->next, 1u) % (unsigned)b->ndev;
    for (int i = 0; i < b->ndev; i++) {
        cu_dev *c = &b->dev[(start + (unsigned)i) % (unsigned)b->ndev];
        if (pthread_mutex_trylock(&c->lock) == 0)
            return c;
    }
    pthread_mutex_lock(&b->dev[start].lock);
    return &b->dev[start];
}

/* A batch of units (convert's small pieces, together in one buffer): their jobs through one
 * device as one pipeline, one unit's chunks right after the other's, waited for once. */
#define CU_BATCH_JOBS 64
static int cu_run_batch(bfs_backend *bb, const bfs_unit *u, int n)
{
    cu_backend *b = (cu_backend *)bb;
    cu_job j[CU_BATCH_JOBS];
    for (int i = 0; i < n;) {
        int nj = 0;
        for (; i < n && nj < CU_BATCH_JOBS; i++) {
            bool done = true;
            uint64_t whole = 0;
            const int rc = cu_prepare(b, &u[i], &j[nj], &done, &whole);
            if (rc < 0)
                return rc;
            nj += !done;
        }
        if (nj == 0)
            continue;
        cu_dev *d = cu_take_dev(b);
        const int rc = bfs__cu_pipeline_n(b, d, j, nj);
        pthread_mutex_unlock(&d->lock);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int cu_run(bfs_backend *bb, const bfs_unit *u)
{
    cu_backend *b = (cu_backend *)bb;
    int rc = 0;
    bool done = true;
    uint64_t whole = 0;
    cu_job j;
    BFS_TRY(cu_prepare(b, u, &j, &done, &whole));
    if (done)
        return 0;
    const uint64_t cap = j.cap;
    const uint64_t granules = j.end - j.pos;
    const int nparts = b->ndev > 1 && whole >= 2 * CU_CHUNK_MIN
                           ? (int)(granules < (uint64_t)b->ndev ? granules : (uint64_t)b->ndev)
                           : 1;
    if (nparts == 1) {
        cu_dev *d = cu_take_dev(b);
        rc = bfs__cu_pipeline(b, d, &j, cap);
        pthread_mutex_unlock(&d->lock);
        goto cleanup;
    }
    /* several devices: each takes a contiguous share of the granules (disjoint output),
     * part 0 on this thread, the others on their own */
    {
        cu_part part[CU_MAX_DEV];
        pthread_t th[CU_MAX_DEV];
        bool started[CU_MAX_DEV] = {false};
        for (int i = 0; i < nparts; i++) {
            part[i] = (cu_part){.b = b, .d = &b->dev[i], .j = j, .cap = cap};
            bfs__errslot_init(&part[i].err);
            part[i].j.pos = j.pos + granules * (uint64_t)i / (uint64_t)nparts;
            part[i].j.end = j.pos + granules * (uint64_t)(i + 1) / (uint64_t)nparts;
        }
        for (int i = 1; i < nparts; i++)
            started[i] = pthread_create(&th[i], NULL, cu_part_main, &part[i]) == 0;
        for (int i = 1; i < nparts; i++)
            if (!started[i]) /* no thread: run it here */
                cu_part_main(&part[i]);
        cu_part_main(&part[0]);
        for (int i = 1; i < nparts; i++)
            if (started[i])
                pthread_join(th[i], NULL);
        /* the first failed part's (its message is a no-op when it is part 0, this thread's own) */
        for (int i = 0; i < nparts && rc == 0; i++)
            rc = bfs__errslot_get(&part[i].err);
    }
cleanup:
    return rc;
}

/* ---- pinned unit buffers ---------------------------------------------------------------- */
/* Pinned host memory for unit buffers (portable: every device's D2H lands in it directly). */
static void *cu_host_alloc(bfs_backend *bb, size_t n)
{
    cu_backend *b = (cu_backend *)bb;
    cu_pinned *x = calloc(1, sizeof *x);
    void *p = NULL;
    if (!x)
        return NULL;
    if (cudaHostAlloc(&p, n ? n : 1, cudaHostAllocPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        free(x);
        return NULL;
    }
    x->p = p;
    x->n = n;
    pthread_mutex_lock(&b->pin_lock);
    x->next = b->pinned;
    b->pinned = x;
    pthread_mutex_unlock(&b->pin_lock);
    return p;
}

static void cu_host_free(bfs_backend *bb, void *p)
{
    cu_backend *b = (cu_backend *)bb;
    cu_pinned *x = NULL;
    if (!p)
        return;
    pthread_mutex_lock(&b->pin_lock);
    for (cu_pinned **pp = &b->pinned; *pp; pp = &(*pp)->next)
        if ((*pp)->p == p) {
            x = *pp;
            *pp = x->next;
            break;
        }
    pthread_mutex_unlock(&b->pin_lock);
    if (x) {
        (void)cudaFreeHost(x->p);
        (void)cudaGetLastError();
        free(x);
    }
}

/* ---- creation ------------------------------------------------------------------------ */
static void cu_dev_free(cu_dev *d)
{
    const cudaStream_t s[3] = {d->s_up, d->s_comp, d->s_down};
    const cudaEvent_t *const ev[3] = {d->ev_up, d->ev_comp, d->ev_down};
    if ((s[0] || s[1] || s[2] || d->d_arena || d->h_arena) && cudaSetDevice(d->id) == cudaSuccess)
        cu_sync_streams(d);
    bfs__cu_gather_stop(d);
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++)
            if (ev[i][k])
                (void)cudaEventDestroy(ev[i][k]);
    for (int i = 0; i < 3; i++)
        if (s[i])
            (void)cudaStreamDestroy(s[i]);
    if (d->d_arena)
        (void)cudaFree(d->d_arena);
    if (d->h_arena)
        (void)cudaFreeHost(d->h_arena);
    if (d->lock_init)
        pthread_mutex_destroy(&d->lock);
    memset(d, 0, sizeof *d);
    (void)cudaGetLastError(); /* clear what the above may have left */
}

static void cu_destroy(bfs_backend *bb)
{
    if (!bb)
        return;
    cu_backend *b = (cu_backend *)bb;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess)
        prev = -1;
    for (int i = 0; i < b->ndev; i++)
        cu_dev_free(&b->dev[i]);
    while (b->pinned) { /* host_alloc's buffers the caller did not free */
        cu_pinned *x = b->pinned;
        b->pinned = x->next;
        (void)cudaFreeHost(x->p);
        free(x);
    }
    pthread_mutex_destroy(&b->pin_lock);
    bfs__cu_leave(prev);
    (void)cudaGetLastError();
    free(b);
}

/* The result e of allocation call `call` of `bytes` into *p: out of memory is BFS_ENOMEM
 * ("cuda:ID: CALL of N bytes HOW", *p cleared), another error BFS_EDEVICE. */
static int cu_alloc_result(cudaError_t e, void **p, int id, const char *call, uint64_t bytes, const char *how)
{
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        *p = NULL;
        return bfs__err(BFS_ENOMEM, "cuda:%d: %s of %" PRIu64 " bytes %s", id, call, bytes, how);
    }
    CUDA_CHECK_RET(e);
    return 0;
}

/* A device that cannot be used: its context cannot be created (busy, exclusive mode). */
static int cu_set_failed(int id, cudaError_t e)
{
    (void)cudaGetLastError();
    if (e == cudaErrorDevicesUnavailable)
        return bfs__err(BFS_EDEVICE,
                        "cuda:%d is busy or unavailable (%s: compute mode exclusive or prohibited, or taken by "
                        "another process); pick another with --device cuda:N, or use --device cpu",
                        id, cudaGetErrorName(e));
    return bfs__err(BFS_EDEVICE, "cuda:%d: cannot make it current: %s (%s); use --device cpu", id,
                    cudaGetErrorName(e), cudaGetErrorString(e));
}

static int cu_dev_init(cu_backend *b, cu_dev *d, int id)
{
    int rc = 0;
    size_t free_b = 0, total_b = 0;
    d->id = id;
    {
        const cudaError_t e = cudaSetDevice(id);
        if (e != cudaSuccess)
            BFS_TRY(cu_set_failed(id, e));
    }
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if ((uint64_t)free_b < b->arena)
        BFS_FAIL(BFS_ENOMEM,
                 "cuda:%d has %" PRIu64 " bytes of free memory (of %" PRIu64 "; other processes hold the rest); "
                 "the CUDA backend's buffers need %" PRIu64 " (--gpu-mem): lower --gpu-mem (at least %" PRIu64
                 "), free the GPU, or use --device cpu",
                 id, (uint64_t)free_b, (uint64_t)total_b, b->arena, CU_CONST_BYTES + 2 * CU_SLOT_MIN);
    BFS_TRY(cu_alloc_result(cudaMalloc((void **)&d->d_arena, b->arena), (void **)&d->d_arena, id,
                            "cudaMalloc", b->arena,
                            "failed (out of device memory: another process took it since it was free; "
                            "lower --gpu-mem or retry)"));
    BFS_TRY(cu_alloc_result(cudaHostAlloc((void **)&d->h_arena, b->arena, cudaHostAllocDefault),
                            (void **)&d->h_arena, id, "cudaHostAlloc", b->arena, "of pinned memory failed"));
    CUDA_CHECK(cudaStreamCreateWithFlags(&d->s_up, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&d->s_comp, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&d->s_down, cudaStreamNonBlocking));
    for (int k = 0; k < 2; k++) { /* the host waits on ev_up and ev_down: block rather than spin */
        CUDA_CHECK(cudaEventCreateWithFlags(&d->ev_up[k], cudaEventDisableTiming | cudaEventBlockingSync));
        CUDA_CHECK(cudaEventCreateWithFlags(&d->ev_comp[k], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&d->ev_down[k], cudaEventDisableTiming | cudaEventBlockingSync));
    }
    if (pthread_mutex_init(&d->lock, NULL) != 0)
        BFS_FAIL(BFS_EINTERNAL, "pthread_mutex_init failed");
    d->lock_init = true;
    BFS_TRY(bfs__cu_gather_start(d));
cleanup:
    return rc;
}

int bfs__backend_cuda_create(const char *spec, uint64_t gpu_mem, uint64_t max_unit_bytes, bfs_backend **out)
{
    int rc = 0, ids[CU_MAX_DEV], nids = 0, count = 0, prev_dev = -1;
    cu_backend *b = NULL;
    bool pin_lock = false;
    *out = NULL;
    BFS_TRY(bfs__cu_parse_spec(spec, ids, &nids));

    {
        const cudaError_t e = cudaGetDeviceCount(&count);
        if (e != cudaSuccess) {
            char why[512];
            (void)cudaGetLastError();
            bfs__cu_why(e, why, sizeof why);
            BFS_FAIL(BFS_EDEVICE, "no usable CUDA device for '%s': %s; or use --device cpu", spec, why);
        }
    }
    if (count <= 0)
        BFS_FAIL(BFS_EDEVICE, "no CUDA device for '%s'; use --device cpu", spec);
    if (nids == 0) { /* "cuda": the first usable device */
        for (int i = 0; i < count && nids == 0; i++)
            if (bfs__cu_cc(i) >= CU_MIN_CC)
                ids[nids++] = i;
        if (nids == 0)
            BFS_FAIL(BFS_EDEVICE, "no CUDA device of compute capability %d.%d or newer (found %d older); "
                     "use --device cpu", CU_MIN_CC / 10, CU_MIN_CC % 10, count);
    }
    for (int i = 0; i < nids; i++) {
        if (ids[i] >= count)
            BFS_FAIL(BFS_EDEVICE, "device cuda:%d does not exist (%d CUDA device%s visible; CUDA_VISIBLE_DEVICES "
                     "renumbers them from 0)", ids[i], count, count == 1 ? "" : "s");
        const int cc = bfs__cu_cc(ids[i]);
        if (cc < CU_MIN_CC)
            BFS_FAIL(BFS_EDEVICE, "cuda:%d has compute capability %d.%d; bfshard's kernels need %d.%d or "
                     "newer; use --device cpu", ids[i], cc / 10, cc % 10, CU_MIN_CC / 10, CU_MIN_CC % 10);
    }

    b = calloc(1, sizeof *b);
    if (!b)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    if (pthread_mutex_init(&b->pin_lock, NULL) != 0) {
        free(b);
        b = NULL;
        BFS_FAIL(BFS_EINTERNAL, "pthread_mutex_init failed");
    }
    pin_lock = true;
    b->budget = gpu_mem ? gpu_mem : CU_DEFAULT_BUDGET;
    if (b->budget < CU_CONST_BYTES + 2 * CU_SLOT_MIN)
        BFS_FAIL(BFS_ENOMEM, "the CUDA buffer budget of %" PRIu64 " bytes (--gpu-mem) is too small: "
                 "at least %" PRIu64 " bytes", b->budget, CU_CONST_BYTES + 2 * CU_SLOT_MIN);
    b->slot_budget = (b->budget - CU_CONST_BYTES) / 2 / CU_ALIGN * CU_ALIGN;
    b->slot = b->slot_budget;
    {
        /* no chunk of a unit of U output bytes needs more than 5 U (an F64 cast: 4 U in) + alignment */
        uint64_t cap = CU_SLOT_CAP, u5;
        if (max_unit_bytes && bfs__mul_ok(max_unit_bytes, 5, &u5) && u5 < CU_SLOT_CAP) {
            cap = cu_al(u5) + 4 * CU_ALIGN;
            if (cap < CU_SLOT_MIN)
                cap = CU_SLOT_MIN;
        }
        if (b->slot > cap)
            b->slot = cap;
    }
    b->arena = CU_CONST_BYTES + 2 * b->slot;
    atomic_init(&b->next, 0u);

    if (cudaGetDevice(&prev_dev) != cudaSuccess) { /* creates no context */
        (void)cudaGetLastError();
        prev_dev = -1;
    }
    for (int i = 0; i < nids; i++) {
        b->ndev = i + 1;
        BFS_TRY(cu_dev_init(b, &b->dev[i], ids[i]));
        b->base.device_bytes += b->arena;
    }
    for (int i = 0; i < nids; i++) {
        const int st = bfs__cu_selftest(b, &b->dev[i]);
        if (st < 0)
            BFS_FAIL(bfs__cu_selftest_failed(&b->dev[i], st), "%s", bfs_last_error());
    }

    {
        size_t len = (size_t)snprintf(b->base.name, sizeof b->base.name, "cuda:%d", ids[0]);
        for (int i = 1; i < nids && len < sizeof b->base.name; i++)
            len += (size_t)snprintf(b->base.name + len, sizeof b->base.name - len, ",%d", ids[i]);
    }
    b->base.run = cu_run;
    b->base.run_batch = cu_run_batch;
    b->base.destroy = cu_destroy;
    b->base.host_alloc = cu_host_alloc;
    b->base.host_free = cu_host_free;
    *out = &b->base;
    b = NULL;
cleanup:
    if (b && !pin_lock)
        free(b);
    else if (b)
        cu_destroy(&b->base);
    bfs__cu_leave(prev_dev);
    return rc;
}
