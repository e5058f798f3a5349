/*
 * A fake CUDA runtime for machines without a GPU: just the calls the CUDA
 * backend and tests/test_cuda.c make, with the semantics they rely on, and
 * stricter than a real GPU where a real GPU would hide a bug only now and then.
 *
 * - Devices: BFS_EMU_DEVICES (default 1), BFS_EMU_MEM (bytes per device, default
 *   8 GiB), BFS_EMU_CC (compute capability: 9 = 9.0, 75 = 7.5; default 90),
 *   BFS_EMU_DRIVER (the CUDA version the "driver" supports, 13000 = 13.0; 0 = no
 *   driver; default: this toolkit's), BFS_EMU_BUSY (a bit mask of devices whose
 *   context cannot be created: exclusive mode or busy), BFS_EMU_FTZ=1 (kernels run
 *   with the FPU flushing subnormals, as a build with -ftz=true would), BFS_EMU_SEED.
 *   Tests change them at run time with bfs__emu_set (common.cuh).
 * - Contexts: the first call that needs one on a device creates it (cudaSetDevice
 *   does, as in CUDA 12+; cudaGetDevice, cudaGetDeviceCount and attributes do not);
 *   each creation is counted (bfs__emu_get("contexts", dev)). On a busy device the
 *   creation fails with cudaErrorDevicesUnavailable.
 * - Errors: the last error is per thread (cudaGetLastError); a kernel fault is
 *   sticky per device: every later call on that device fails with it.
 * - Device memory is host memory (256-byte aligned), counted per device;
 *   cudaMemGetInfo reports total - used - "stolen" (another process), used
 *   rounded up to 2 MiB per allocation as the real driver does.
 * - Each stream belongs to the device current when it was created; enqueueing
 *   on it, or recording an event of another device, while another device is
 *   current fails (cudaErrorInvalidResourceHandle). Each stream has a worker
 *   thread executing its operations in order, after a random delay
 *   (BFS_EMU_JITTER_US, default 200; 0 for none), so a missing dependency
 *   between streams, or the host touching a staging buffer too early, shows up
 *   as wrong output.
 * - Events count records: cudaStreamWaitEvent and cudaEventSynchronize wait
 *   for the record that was last enqueued when they were called (an event never
 *   recorded is complete), as in CUDA.
 * - Every copy must lie inside one allocation of the right kind (device of the
 *   stream's device / pinned host / other host memory); otherwise the call fails
 *   with cudaErrorInvalidValue and prints why.
 * - Kernels (bfs__emu_launch): the grid is checked against CUDA's limits (x <
 *   2^31, y and z <= 65535, <= 1024 threads, <= 48 KiB static shared memory;
 *   cudaErrorInvalidConfiguration through cudaGetLastError, as a real launch);
 *   blocks run in a shuffled order, each with its shared memory filled with
 *   garbage, and between two barriers the block's threads run one after the
 *   other in a shuffled order: a read of what another thread writes in the same
 *   barrier interval (a missing __syncthreads), or of another block's output,
 *   gives wrong output.
 * - bfs__emu_fail_at(n) makes the n-th copy or kernel enqueued from now fail as
 *   a kernel fault would (cudaErrorIllegalAddress, sticky on its device).
 * - The operation log (bfs__emu_set("log", 0, 1) clears and starts it, 0 stops it;
 *   bfs__emu_log(i, field) reads entry i, bfs__emu_log(-1, 0) the count): each copy, kernel,
 *   event record and stream wait when enqueued (EMU_LOG_ENQ), when its stream's worker
 *   starts it (EMU_LOG_START: a stream wait has then begun waiting) and finishes it
 *   (EMU_LOG_END), and each host wait (cudaEventSynchronize, cudaStreamSynchronize) when it
 *   begins and returns, with a monotonic time in ns, the stream (or event) number and the
 *   operation's number and bytes: so a test can see which stages overlapped.
 *   bfs__emu_set("kernel_us", 0, us) makes every kernel last at least us microseconds (a
 *   slow device): overlap then shows in the times regardless of the host's speed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define EMU_HAVE_MXCSR 1
#endif

#include "../../../kernels/common.cuh"

#define EMU_MAX_DEV 16
#define EMU_GRAN ((size_t)2 << 20)

/* ---- configuration, errors --------------------------------------------------------- */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_ndev = -1, g_cc = 90, g_driver = CUDART_VERSION, g_ftz;
static unsigned g_busy, g_seed = 12345;
static size_t g_mem = (size_t)8 << 30;
static long g_jitter = 200;
static size_t g_used[EMU_MAX_DEV], g_stolen[EMU_MAX_DEV];
static int g_ctx[EMU_MAX_DEV];                      /* a context exists */
static long g_ctx_count[EMU_MAX_DEV];               /* contexts created */
static cudaError_t g_sticky[EMU_MAX_DEV];           /* a "kernel fault" poisons the device's context */
static long g_fail_at = -1;                         /* operations left before an injected fault */
static long g_kernel_us;                           /* each kernel lasts at least this long */
static _Thread_local int t_dev;
static _Thread_local cudaError_t t_last = cudaSuccess;

static void emu_init(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_ndev < 0) {
        const char *s;
        g_ndev = (s = getenv("BFS_EMU_DEVICES")) ? atoi(s) : 1;
        if (g_ndev > EMU_MAX_DEV)
            g_ndev = EMU_MAX_DEV;
        if ((s = getenv("BFS_EMU_MEM")))
            g_mem = (size_t)strtoull(s, NULL, 0);
        if ((s = getenv("BFS_EMU_CC")))
            g_cc = atoi(s) < 10 ? atoi(s) * 10 : atoi(s);
        if ((s = getenv("BFS_EMU_JITTER_US")))
            g_jitter = atol(s);
        if ((s = getenv("BFS_EMU_DRIVER")))
            g_driver = atoi(s);
        if ((s = getenv("BFS_EMU_BUSY")))
            g_busy = (unsigned)strtoul(s, NULL, 0);
        if ((s = getenv("BFS_EMU_FTZ")))
            g_ftz = atoi(s);
        if ((s = getenv("BFS_EMU_SEED")))
            g_seed = (unsigned)strtoul(s, NULL, 0);
    }
    pthread_mutex_unlock(&g_lock);
}

static cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess)
        t_last = e;
    return e;
}

/* No driver, or one too old for this runtime: what cudaGetDeviceCount and friends say. */
static cudaError_t emu_driver_error(void)
{
    return g_driver < CUDART_VERSION / 1000 * 1000 ? cudaErrorInsufficientDriver : cudaSuccess;
}

/* The context of dev, created on first use. Under g_lock. */
static cudaError_t ctx_use_locked(int dev)
{
    if (dev < 0 || dev >= g_ndev)
        return cudaErrorInvalidDevice;
    if (!g_ctx[dev]) {
        if (g_busy & (1u << dev))
            return cudaErrorDevicesUnavailable;
        g_ctx[dev] = 1;
        g_ctx_count[dev]++;
    }
    return g_sticky[dev];
}

static cudaError_t ctx_use(int dev)
{
    emu_init();
    const cudaError_t d = emu_driver_error();
    if (d != cudaSuccess)
        return ret(d);
    if (g_ndev <= 0)
        return ret(cudaErrorNoDevice);
    pthread_mutex_lock(&g_lock);
    const cudaError_t e = ctx_use_locked(dev);
    pthread_mutex_unlock(&g_lock);
    return ret(e);
}

/* ---- the operation log -------------------------------------------------------------------- */
enum { EMU_LOG_ENQ = 1, EMU_LOG_START, EMU_LOG_END, EMU_LOG_HOST_WAIT, EMU_LOG_HOST_DONE };
enum { EMU_OP_H2D = 1, EMU_OP_D2H, EMU_OP_D2D, EMU_OP_KERNEL, EMU_OP_RECORD, EMU_OP_WAIT, EMU_OP_EVENT_SYNC,
       EMU_OP_STREAM_SYNC };
typedef struct logent {
    long long t, bytes;
    int what, kind, who; /* who: the stream's number (the event's for EMU_OP_EVENT_SYNC) */
    long id;
} logent;
#define EMU_LOG_MAX 200000
static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;
static logent *g_log;
static long g_nlog, g_next_id, g_next_obj;
static int g_logging;

static void emu_log(int what, int kind, int who, long id, size_t bytes)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    pthread_mutex_lock(&g_log_lock);
    if (g_logging && g_log && g_nlog < EMU_LOG_MAX)
        g_log[g_nlog++] = (logent){(long long)ts.tv_sec * 1000000000LL + ts.tv_nsec, (long long)bytes, what, kind,
                                   who, id};
    pthread_mutex_unlock(&g_log_lock);
}

static void emu_log_set(int on)
{
    pthread_mutex_lock(&g_log_lock);
    if (on && !g_log)
        g_log = malloc(EMU_LOG_MAX * sizeof *g_log);
    if (on)
        g_nlog = 0; /* started afresh; stopped, it keeps what it holds for bfs__emu_log */
    g_logging = on && g_log;
    pthread_mutex_unlock(&g_log_lock);
}

/* entry i's field (0 time ns, 1 what, 2 kind, 3 stream/event, 4 operation, 5 bytes); i < 0: the count */
long long bfs__emu_log(long i, int field)
{
    long long v = -1;
    pthread_mutex_lock(&g_log_lock);
    if (i < 0) {
        v = g_nlog;
    } else if (i < g_nlog) {
        const logent *e = &g_log[i];
        const long long f[6] = {e->t, e->what, e->kind, e->who, e->id, e->bytes};
        v = field >= 0 && field < 6 ? f[field] : -1;
    }
    pthread_mutex_unlock(&g_log_lock);
    return v;
}

static long emu_new_id(long *counter)
{
    pthread_mutex_lock(&g_log_lock);
    const long id = ++*counter;
    pthread_mutex_unlock(&g_log_lock);
    return id;
}

void bfs__emu_fail_at(long n)
{
    pthread_mutex_lock(&g_lock);
    g_fail_at = n;
    for (int i = 0; i < EMU_MAX_DEV; i++)
        g_sticky[i] = cudaSuccess;
    pthread_mutex_unlock(&g_lock);
}

void bfs__emu_set(const char *key, int dev, long long v)
{
    emu_init();
    pthread_mutex_lock(&g_lock);
    if (!strcmp(key, "devices"))
        g_ndev = (int)v;
    else if (!strcmp(key, "driver"))
        g_driver = (int)v;
    else if (!strcmp(key, "busy"))
        g_busy = (unsigned)v;
    else if (!strcmp(key, "cc"))
        g_cc = (int)v;
    else if (!strcmp(key, "ftz"))
        g_ftz = (int)v;
    else if (!strcmp(key, "mem"))
        g_mem = (size_t)v;
    else if (!strcmp(key, "kernel_us"))
        g_kernel_us = (long)v;
    else if (!strcmp(key, "log"))
        emu_log_set((int)v); /* takes g_log_lock only: no order issue with g_lock */
    else if (!strcmp(key, "steal") && dev >= 0 && dev < EMU_MAX_DEV)
        g_stolen[dev] = (size_t)v;
    else if (!strcmp(key, "reset")) /* forget every context (as if the process restarted) */
        for (int i = 0; i < EMU_MAX_DEV; i++)
            g_ctx[i] = 0, g_ctx_count[i] = 0, g_sticky[i] = cudaSuccess;
    else {
        fprintf(stderr, "fake cudart: bfs__emu_set: unknown key %s\n", key);
        abort();
    }
    pthread_mutex_unlock(&g_lock);
}

long long bfs__emu_get(const char *key, int dev)
{
    emu_init();
    long long v = -1;
    pthread_mutex_lock(&g_lock);
    if (!strcmp(key, "contexts") && dev >= 0 && dev < EMU_MAX_DEV)
        v = g_ctx_count[dev];
    else if (!strcmp(key, "used") && dev >= 0 && dev < EMU_MAX_DEV)
        v = (long long)g_used[dev];
    pthread_mutex_unlock(&g_lock);
    return v;
}

/* ---- allocations ---------------------------------------------------------------------- */
typedef struct alloc {
    uint8_t *p;
    size_t n;
    int dev;      /* -1: pinned host */
    struct alloc *next;
} alloc;
static alloc *g_allocs;

static void *emu_alloc(size_t n, int dev)
{
    const size_t rounded = (n + 255) / 256 * 256;
    void *p = aligned_alloc(256, rounded ? rounded : 256);
    alloc *a = malloc(sizeof *a);
    if (!p || !a) {
        free(p);
        free(a);
        return NULL;
    }
    memset(p, 0xCD, rounded ? rounded : 256); /* neither device nor pinned memory starts zeroed */
    *a = (alloc){p, n, dev, NULL};
    pthread_mutex_lock(&g_lock);
    a->next = g_allocs;
    g_allocs = a;
    if (dev >= 0)
        g_used[dev] += (n + EMU_GRAN - 1) / EMU_GRAN * EMU_GRAN;
    pthread_mutex_unlock(&g_lock);
    return p;
}

static int emu_free(void *p, int want_dev)
{
    pthread_mutex_lock(&g_lock);
    for (alloc **pp = &g_allocs; *pp; pp = &(*pp)->next) {
        alloc *a = *pp;
        if (a->p == p && ((want_dev < 0) == (a->dev < 0))) {
            *pp = a->next;
            if (a->dev >= 0)
                g_used[a->dev] -= (a->n + EMU_GRAN - 1) / EMU_GRAN * EMU_GRAN;
            pthread_mutex_unlock(&g_lock);
            free(a->p);
            free(a);
            return 0;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return -1;
}

/* [p, p+n): 1 inside a device allocation (its device in *dev), 0 inside pinned host
 * memory, -1 neither (other host memory), -2 straddles */
static int emu_kind(const void *p, size_t n, int *dev)
{
    const uint8_t *q = p;
    int k = -1;
    pthread_mutex_lock(&g_lock);
    for (alloc *a = g_allocs; a; a = a->next) {
        if (q >= a->p && q < a->p + (a->n ? a->n : 1)) {
            k = q + n <= a->p + a->n ? (a->dev >= 0 ? 1 : 0) : -2;
            *dev = a->dev;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return k;
}

/* ---- streams and events ------------------------------------------------------------------ */
struct CUevent_st {
    int dev, no;
    pthread_mutex_t m;
    pthread_cond_t c;
    uint64_t recorded, completed;
};

enum { OP_COPY, OP_LAUNCH, OP_RECORD, OP_WAIT };
typedef struct op {
    int kind;
    void *dst;
    const void *src;
    size_t n;
    bfs_emu_phase_fn fn;
    void *arg;
    unsigned gx, gy, gz, nt, nphases;
    size_t smem;
    cudaEvent_t ev;
    uint64_t gen;
    int fail;
    int lkind; /* EMU_OP_* */
    long id;
    struct op *next;
} op;

struct CUstream_st {
    int dev, no;
    pthread_t th;
    pthread_mutex_t m;
    pthread_cond_t c;
    op *head, *tail;
    uint64_t enq, done;
    int stop;
    uint64_t rng;
};

static uint32_t emu_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return (uint32_t)((x * 0x2545F4914F6CDD1Dull) >> 32);
}

static void emu_shuffle(uint32_t *p, size_t n, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint32_t)i;
    for (size_t i = n; i > 1; i--) {
        const size_t j = emu_rand(rng) % i;
        const uint32_t t = p[i - 1];
        p[i - 1] = p[j];
        p[j] = t;
    }
}

static void emu_sleep(uint64_t *rng)
{
    if (g_jitter > 0) {
        const long us = (long)(emu_rand(rng) % (unsigned)(g_jitter + 1));
        if (us > 0) {
            struct timespec ts = {0, us * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

static void run_launch(const op *o, uint64_t *rng)
{
    const size_t nb = (size_t)o->gx * o->gy * o->gz;
    uint32_t *perm = malloc(nb * sizeof *perm), tperm[1024];
    uint8_t *smem = malloc(o->smem ? o->smem : 1);
    if (!perm || !smem)
        abort();
#ifdef EMU_HAVE_MXCSR
    const unsigned csr = _mm_getcsr();
    if (g_ftz) /* FTZ (flush results) + DAZ (flush inputs): what -ftz=true does on the GPU */
        _mm_setcsr(csr | 0x8040u);
#endif
    emu_shuffle(perm, nb, rng);
    bfs_cu_idx ix = {0, 0, 0, o->gx, o->gy, o->gz, 0, o->nt};
    for (size_t i = 0; i < nb; i++) {
        const size_t b = perm[i];
        ix.bx = (unsigned)(b % o->gx);
        ix.by = (unsigned)(b / o->gx % o->gy);
        ix.bz = (unsigned)(b / ((size_t)o->gx * o->gy));
        memset(smem, (int)(emu_rand(rng) & 0xFF), o->smem ? o->smem : 1); /* never zeroed on a GPU */
        for (unsigned ph = 0; ph < o->nphases; ph++) {
            emu_shuffle(tperm, o->nt, rng);
            for (unsigned t = 0; t < o->nt; t++) {
                ix.tid = tperm[t];
                o->fn(o->arg, smem, &ix, (int)ph);
            }
        }
    }
#ifdef EMU_HAVE_MXCSR
    _mm_setcsr(csr);
#endif
    free(perm);
    free(smem);
}

static void *stream_main(void *p)
{
    struct CUstream_st *s = p;
    for (;;) {
        pthread_mutex_lock(&s->m);
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->c, &s->m);
        if (!s->head) {
            pthread_mutex_unlock(&s->m);
            return NULL;
        }
        op *o = s->head;
        pthread_mutex_unlock(&s->m);

        emu_sleep(&s->rng);
        emu_log(EMU_LOG_START, o->lkind, s->no, o->id, o->n);
        pthread_mutex_lock(&g_lock);
        const int poisoned = g_sticky[s->dev] != cudaSuccess;
        if (o->fail)
            g_sticky[s->dev] = cudaErrorIllegalAddress;
        pthread_mutex_unlock(&g_lock);
        switch (o->kind) {
        case OP_COPY:
            if (!poisoned && !o->fail)
                memcpy(o->dst, o->src, o->n);
            break;
        case OP_LAUNCH:
            if (!poisoned && !o->fail) {
                run_launch(o, &s->rng);
                if (g_kernel_us > 0) { /* a slow device */
                    struct timespec ts = {g_kernel_us / 1000000, g_kernel_us % 1000000 * 1000};
                    nanosleep(&ts, NULL);
                }
            }
            break;
        case OP_RECORD:
            pthread_mutex_lock(&o->ev->m);
            if (o->gen > o->ev->completed)
                o->ev->completed = o->gen;
            pthread_cond_broadcast(&o->ev->c);
            pthread_mutex_unlock(&o->ev->m);
            break;
        case OP_WAIT:
            pthread_mutex_lock(&o->ev->m);
            while (o->ev->completed < o->gen)
                pthread_cond_wait(&o->ev->c, &o->ev->m);
            pthread_mutex_unlock(&o->ev->m);
            break;
        }
        emu_log(EMU_LOG_END, o->lkind, s->no, o->id, o->n);
        pthread_mutex_lock(&s->m);
        s->head = o->next;
        if (!s->head)
            s->tail = NULL;
        s->done++;
        pthread_cond_broadcast(&s->c);
        pthread_mutex_unlock(&s->m);
        free(o->arg);
        free(o);
    }
}

static cudaError_t enqueue(cudaStream_t s, op *o)
{
    cudaError_t e = cudaSuccess;
    if (!s)
        e = cudaErrorInvalidResourceHandle; /* the backend never uses the legacy stream */
    else if (s->dev != t_dev)
        e = cudaErrorInvalidResourceHandle; /* a stream of another device than the current one */
    if (e == cudaSuccess) {
        pthread_mutex_lock(&g_lock);
        if (o->kind == OP_COPY || o->kind == OP_LAUNCH) {
            if (g_fail_at > 0 && --g_fail_at == 0)
                o->fail = 1;
        }
        e = g_sticky[s->dev];
        pthread_mutex_unlock(&g_lock);
    }
    if (e != cudaSuccess) {
        free(o->arg);
        free(o);
        return ret(e);
    }
    o->id = emu_new_id(&g_next_id);
    emu_log(EMU_LOG_ENQ, o->lkind, s->no, o->id, o->n);
    pthread_mutex_lock(&s->m);
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    s->enq++;
    pthread_cond_broadcast(&s->c);
    pthread_mutex_unlock(&s->m);
    return cudaSuccess;
}

cudaError_t bfs__emu_launch(cudaStream_t stream, unsigned gx, unsigned gy, unsigned gz, unsigned nthreads,
                            size_t smem, int nphases, bfs_emu_phase_fn fn, const void *arg, size_t size)
{
    if (gx == 0 || gy == 0 || gz == 0 || gx > 0x7FFFFFFFu || gy > 65535u || gz > 65535u || nthreads == 0 ||
        nthreads > 1024 || smem > 48 * 1024 || nphases < 1) {
        fprintf(stderr, "fake cudart: launch of grid (%u, %u, %u) x %u threads, %zu bytes of shared memory: "
                "invalid configuration\n", gx, gy, gz, nthreads, smem);
        return ret(cudaErrorInvalidConfiguration);
    }
    op *o = calloc(1, sizeof *o);
    void *copy = malloc(size);
    if (!o || !copy)
        abort();
    memcpy(copy, arg, size);
    o->kind = OP_LAUNCH;
    o->lkind = EMU_OP_KERNEL;
    o->fn = fn;
    o->arg = copy;
    o->gx = gx, o->gy = gy, o->gz = gz, o->nt = nthreads, o->smem = smem, o->nphases = (unsigned)nphases;
    return enqueue(stream, o);
}

/* ---- the API --------------------------------------------------------------------------------- */
cudaError_t cudaDriverGetVersion(int *v)
{
    emu_init();
    *v = g_driver;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    emu_init();
    *count = 0;
    const cudaError_t d = emu_driver_error();
    if (d != cudaSuccess)
        return ret(d);
    if (g_ndev <= 0)
        return ret(cudaErrorNoDevice);
    *count = g_ndev;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    emu_init();
    if (emu_driver_error() != cudaSuccess)
        return ret(emu_driver_error());
    if (device < 0 || device >= g_ndev)
        return ret(cudaErrorInvalidDevice);
    if (attr == cudaDevAttrComputeCapabilityMajor)
        *value = g_cc / 10;
    else if (attr == cudaDevAttrComputeCapabilityMinor)
        *value = g_cc % 10;
    else
        return ret(cudaErrorInvalidValue);
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    emu_init();
    if (device < 0 || device >= g_ndev)
        return ret(cudaErrorInvalidDevice);
    t_dev = device;
    const cudaError_t e = ctx_use(device); /* CUDA 12+: the primary context, now */
    return e == cudaErrorDevicesUnavailable || e == cudaErrorInsufficientDriver ? e : cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    emu_init();
    if (emu_driver_error() != cudaSuccess)
        return ret(emu_driver_error());
    if (g_ndev <= 0)
        return ret(cudaErrorNoDevice);
    *device = t_dev;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total)
{
    const cudaError_t e = ctx_use(t_dev);
    if (e != cudaSuccess)
        return e;
    pthread_mutex_lock(&g_lock);
    *total = g_mem;
    const size_t taken = g_used[t_dev] + g_stolen[t_dev];
    *free_b = g_mem > taken ? g_mem - taken : 0;
    pthread_mutex_unlock(&g_lock);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    const cudaError_t e = ctx_use(t_dev);
    if (e != cudaSuccess)
        return e;
    pthread_mutex_lock(&g_lock);
    const int fits = g_used[t_dev] + g_stolen[t_dev] + n <= g_mem;
    pthread_mutex_unlock(&g_lock);
    if (!fits || !(*p = emu_alloc(n, t_dev)))
        return ret(cudaErrorMemoryAllocation);
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    const cudaError_t e = ctx_use(t_dev);
    if (!p || e != cudaSuccess)
        return e; /* cudaFree(0): initialise the context */
    return emu_free(p, 0) == 0 ? cudaSuccess : ret(cudaErrorInvalidValue);
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
    (void)flags;
    const cudaError_t e = ctx_use(t_dev);
    if (e != cudaSuccess)
        return e;
    return (*p = emu_alloc(n, -1)) ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void *p)
{
    return emu_free(p, -1) == 0 ? cudaSuccess : ret(cudaErrorInvalidValue);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ps, unsigned int flags)
{
    (void)flags;
    const cudaError_t e = ctx_use(t_dev);
    if (e != cudaSuccess)
        return e;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s)
        return ret(cudaErrorMemoryAllocation);
    s->dev = t_dev;
    s->no = (int)emu_new_id(&g_next_obj);
    pthread_mutex_lock(&g_lock);
    s->rng = ((uint64_t)g_seed << 32 | 0x9E3779B9u) ^ (uint64_t)(uintptr_t)s;
    pthread_mutex_unlock(&g_lock);
    if (!s->rng)
        s->rng = 1;
    pthread_mutex_init(&s->m, NULL);
    pthread_cond_init(&s->c, NULL);
    if (pthread_create(&s->th, NULL, stream_main, s) != 0) {
        free(s);
        return ret(cudaErrorMemoryAllocation);
    }
    *ps = s;
    return cudaSuccess;
}

static cudaError_t dev_sticky(int dev)
{
    pthread_mutex_lock(&g_lock);
    const cudaError_t e = g_sticky[dev];
    pthread_mutex_unlock(&g_lock);
    return ret(e);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (!s)
        return ret(cudaErrorInvalidResourceHandle);
    emu_log(EMU_LOG_HOST_WAIT, EMU_OP_STREAM_SYNC, s->no, 0, 0);
    pthread_mutex_lock(&s->m);
    const uint64_t target = s->enq;
    while (s->done < target)
        pthread_cond_wait(&s->c, &s->m);
    pthread_mutex_unlock(&s->m);
    emu_log(EMU_LOG_HOST_DONE, EMU_OP_STREAM_SYNC, s->no, 0, 0);
    return dev_sticky(s->dev);
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s)
        return ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&s->m);
    s->stop = 1; /* the worker finishes what is queued first, as CUDA does */
    pthread_cond_broadcast(&s->c);
    pthread_mutex_unlock(&s->m);
    pthread_join(s->th, NULL);
    pthread_mutex_destroy(&s->m);
    pthread_cond_destroy(&s->c);
    free(s);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *pe, unsigned int flags)
{
    (void)flags;
    const cudaError_t err = ctx_use(t_dev);
    if (err != cudaSuccess)
        return err;
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e)
        return ret(cudaErrorMemoryAllocation);
    e->dev = t_dev;
    e->no = (int)emu_new_id(&g_next_obj);
    pthread_mutex_init(&e->m, NULL);
    pthread_cond_init(&e->c, NULL);
    *pe = e;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    if (!e)
        return ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_destroy(&e->m);
    pthread_cond_destroy(&e->c);
    free(e);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (!e || !s || e->dev != s->dev)
        return ret(cudaErrorInvalidResourceHandle);
    op *o = calloc(1, sizeof *o);
    if (!o)
        abort();
    o->kind = OP_RECORD;
    o->lkind = EMU_OP_RECORD;
    o->n = (size_t)e->no; /* the log's bytes field: which event */
    o->ev = e;
    pthread_mutex_lock(&e->m);
    o->gen = ++e->recorded;
    pthread_mutex_unlock(&e->m);
    return enqueue(s, o);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    (void)flags;
    if (!e)
        return ret(cudaErrorInvalidResourceHandle);
    op *o = calloc(1, sizeof *o);
    if (!o)
        abort();
    o->kind = OP_WAIT;
    o->lkind = EMU_OP_WAIT;
    o->n = (size_t)e->no;
    o->ev = e;
    pthread_mutex_lock(&e->m);
    o->gen = e->recorded;
    pthread_mutex_unlock(&e->m);
    return enqueue(s, o);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    if (!e)
        return ret(cudaErrorInvalidResourceHandle);
    emu_log(EMU_LOG_HOST_WAIT, EMU_OP_EVENT_SYNC, e->no, 0, 0);
    pthread_mutex_lock(&e->m);
    const uint64_t target = e->recorded;
    while (e->completed < target)
        pthread_cond_wait(&e->c, &e->m);
    pthread_mutex_unlock(&e->m);
    emu_log(EMU_LOG_HOST_DONE, EMU_OP_EVENT_SYNC, e->no, 0, 0);
    return dev_sticky(e->dev);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s)
{
    int dd = -1, sd = -1;
    const int kd = emu_kind(dst, n, &dd), ks = emu_kind(src, n, &sd);
    const int want_d = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const int want_s = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kd == -2 || ks == -2 || (kd == 1) != want_d || (ks == 1) != want_s || (!want_d && kd != 0) ||
        (!want_s && ks != 0) || (s && ((kd == 1 && dd != s->dev) || (ks == 1 && sd != s->dev)))) {
        fprintf(stderr, "fake cudart: cudaMemcpyAsync(dst %p [%d], src %p [%d], %zu bytes, kind %d): "
                "outside its allocations, not pinned, or on another device than the stream's\n",
                dst, kd, src, ks, n, (int)kind);
        return ret(cudaErrorInvalidValue);
    }
    op *o = calloc(1, sizeof *o);
    if (!o)
        abort();
    o->kind = OP_COPY;
    o->lkind = kind == cudaMemcpyHostToDevice ? EMU_OP_H2D : kind == cudaMemcpyDeviceToHost ? EMU_OP_D2H : EMU_OP_D2D;
    o->dst = dst;
    o->src = src;
    o->n = n;
    return enqueue(s, o);
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    if (e == cudaSuccess && t_dev >= 0 && t_dev < EMU_MAX_DEV) { /* a sticky error is never cleared */
        pthread_mutex_lock(&g_lock);
        e = g_sticky[t_dev];
        pthread_mutex_unlock(&g_lock);
    }
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last; }

/* The driver API entry points the backend asks for (primary context state). */
static CUresult CUDAAPI emu_cuDeviceGet(CUdevice *d, int ordinal)
{
    if (ordinal < 0 || ordinal >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

static CUresult CUDAAPI emu_cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active)
{
    if (d < 0 || d >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    *flags = 0;
    *active = g_ctx[d];
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status)
{
    (void)version, (void)flags;
    emu_init();
    *fn = NULL;
    if (!strcmp(symbol, "cuDeviceGet"))
        *fn = (void *)emu_cuDeviceGet;
    else if (!strcmp(symbol, "cuDevicePrimaryCtxGetState"))
        *fn = (void *)emu_cuDevicePrimaryCtxGetState;
    if (status)
        *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorDevicesUnavailable: return "cudaErrorDevicesUnavailable";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (fake runtime)";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered (injected by the fake runtime)";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorDevicesUnavailable: return "CUDA-capable device(s) is/are busy or unavailable";
    default: return "error (fake runtime)";
    }
}

/* ---- what nvcc's host stubs reference (never used: launches are emulated) ------------------- */
void **__cudaRegisterFatBinary(void *fatCubin)
{
    static void *handle;
    (void)fatCubin;
    return &handle;
}
void __cudaRegisterFatBinaryEnd(void **h) { (void)h; }
void __cudaUnregisterFatBinary(void **h) { (void)h; }
void __cudaRegisterFunction(void **h, const char *hf, char *df, const char *dn, int tl, void *tid,
                            void *bid, void *bd, void *gd, int *ws)
{
    (void)h, (void)hf, (void)df, (void)dn, (void)tl, (void)tid, (void)bid, (void)bd, (void)gd, (void)ws;
}
cudaError_t __cudaPopCallConfiguration(void *g, void *b, size_t *sm, void *s)
{
    (void)g, (void)b, (void)sm, (void)s;
    abort();
}
cudaError_t __cudaLaunchKernel(void)
{
    abort();
}
cudaError_t __cudaGetKernel(void)
{
    abort();
}
