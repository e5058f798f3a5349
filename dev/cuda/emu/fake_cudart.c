/*
 * A fake CUDA runtime for machines without a GPU: just the calls the CUDA
 * backend and tests/test_cuda.c make, with the semantics they rely on.
 *
 * - Device memory is host memory (256-byte aligned), counted per device;
 *   cudaMemGetInfo reports total - used, used rounded up to 2 MiB per
 *   allocation as the real driver does.
 * - Each stream has a worker thread executing its operations in order, after a
 *   random delay (BFS_EMU_JITTER_US, default 200; 0 for none), so a missing
 *   dependency between streams, or the host touching a staging buffer too
 *   early, shows up as wrong output.
 * - Events count records: cudaStreamWaitEvent and cudaEventSynchronize wait
 *   for the record that was last enqueued when they were called (an event never
 *   recorded is complete), as in CUDA.
 * - Every copy must lie inside one allocation of the right kind (device / pinned
 *   host / other host memory); otherwise the call fails with cudaErrorInvalidValue
 *   and prints why.
 * - Kernels are the launchers' host emulations (bfs__emu_enqueue).
 * - BFS_EMU_DEVICES (default 1), BFS_EMU_MEM (bytes per device, default 8 GiB),
 *   BFS_EMU_CC (compute capability major, default 9); bfs__emu_fail_at(n) makes
 *   the n-th enqueued operation from now fail as a kernel fault would.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EMU_MAX_DEV 16
#define EMU_GRAN ((size_t)2 << 20)

/* ---- configuration, errors --------------------------------------------------------- */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_ndev = -1, g_cc = 9;
static size_t g_mem = (size_t)8 << 30;
static long g_jitter = 200;
static size_t g_used[EMU_MAX_DEV];
static cudaError_t g_sticky = cudaSuccess; /* a "kernel fault" poisons the context */
static long g_fail_at = -1;                /* operations left before an injected fault */
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
            g_cc = atoi(s);
        if ((s = getenv("BFS_EMU_JITTER_US")))
            g_jitter = atol(s);
    }
    pthread_mutex_unlock(&g_lock);
}

static cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess)
        t_last = e;
    return e;
}

void bfs__emu_fail_at(long n)
{
    pthread_mutex_lock(&g_lock);
    g_fail_at = n;
    g_sticky = cudaSuccess;
    pthread_mutex_unlock(&g_lock);
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

/* 1: [p, p+n) inside a device allocation, 0: inside pinned host memory, -1: neither (other host memory), -2: straddles */
static int emu_kind(const void *p, size_t n)
{
    const uint8_t *q = p;
    int k = -1;
    pthread_mutex_lock(&g_lock);
    for (alloc *a = g_allocs; a; a = a->next) {
        if (q >= a->p && q < a->p + (a->n ? a->n : 1)) {
            k = q + n <= a->p + a->n ? (a->dev >= 0 ? 1 : 0) : -2;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return k;
}

/* ---- streams and events ------------------------------------------------------------------ */
struct CUevent_st {
    pthread_mutex_t m;
    pthread_cond_t c;
    uint64_t recorded, completed;
};

enum { OP_COPY, OP_FN, OP_RECORD, OP_WAIT };
typedef struct op {
    int kind;
    void *dst;
    const void *src;
    size_t n;
    void (*fn)(void *);
    void *arg;
    cudaEvent_t ev;
    uint64_t gen;
    int fail;
    struct op *next;
} op;

struct CUstream_st {
    int dev;
    pthread_t th;
    pthread_mutex_t m;
    pthread_cond_t c;
    op *head, *tail;
    uint64_t enq, done;
    int stop;
    unsigned seed;
};

static void emu_sleep(unsigned *seed)
{
    if (g_jitter > 0) {
        const long us = (long)(rand_r(seed) % (unsigned)(g_jitter + 1));
        if (us > 0) {
            struct timespec ts = {0, us * 1000};
            nanosleep(&ts, NULL);
        }
    }
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

        emu_sleep(&s->seed);
        pthread_mutex_lock(&g_lock);
        const int poisoned = g_sticky != cudaSuccess;
        if (o->fail)
            g_sticky = cudaErrorLaunchFailure;
        pthread_mutex_unlock(&g_lock);
        switch (o->kind) {
        case OP_COPY:
            if (!poisoned && !o->fail)
                memcpy(o->dst, o->src, o->n);
            break;
        case OP_FN:
            if (!poisoned && !o->fail)
                o->fn(o->arg);
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
    if (!s) {
        free(o->arg);
        free(o);
        return ret(cudaErrorInvalidResourceHandle); /* the backend never uses the legacy stream */
    }
    pthread_mutex_lock(&g_lock);
    if (o->kind == OP_COPY || o->kind == OP_FN) {
        if (g_fail_at > 0 && --g_fail_at == 0)
            o->fail = 1;
    }
    const cudaError_t sticky = g_sticky;
    pthread_mutex_unlock(&g_lock);
    if (sticky != cudaSuccess) {
        free(o->arg);
        free(o);
        return ret(sticky);
    }
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

int bfs__emu_enqueue(cudaStream_t stream, void (*fn)(void *), const void *arg, size_t size)
{
    op *o = calloc(1, sizeof *o);
    void *copy = malloc(size);
    if (!o || !copy)
        abort();
    memcpy(copy, arg, size);
    o->kind = OP_FN;
    o->fn = fn;
    o->arg = copy;
    return enqueue(stream, o) == cudaSuccess ? 0 : -6 /* BFS_EDEVICE */;
}

/* ---- the API --------------------------------------------------------------------------------- */
cudaError_t cudaGetDeviceCount(int *count)
{
    emu_init();
    if (g_ndev <= 0) {
        *count = 0;
        return ret(cudaErrorNoDevice);
    }
    *count = g_ndev;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    emu_init();
    if (device < 0 || device >= g_ndev)
        return ret(cudaErrorInvalidDevice);
    if (attr == cudaDevAttrComputeCapabilityMajor)
        *value = g_cc;
    else if (attr == cudaDevAttrComputeCapabilityMinor)
        *value = 0;
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
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    emu_init();
    if (g_ndev <= 0)
        return ret(cudaErrorNoDevice);
    *device = t_dev;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total)
{
    emu_init();
    if (g_ndev <= 0)
        return ret(cudaErrorNoDevice);
    pthread_mutex_lock(&g_lock);
    *total = g_mem;
    *free_b = g_mem - g_used[t_dev];
    pthread_mutex_unlock(&g_lock);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    emu_init();
    if (g_ndev <= 0)
        return ret(cudaErrorNoDevice);
    pthread_mutex_lock(&g_lock);
    const int fits = g_used[t_dev] + n <= g_mem;
    pthread_mutex_unlock(&g_lock);
    if (!fits || !(*p = emu_alloc(n, t_dev)))
        return ret(cudaErrorMemoryAllocation);
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    emu_init();
    if (!p)
        return g_ndev > 0 ? cudaSuccess : ret(cudaErrorNoDevice); /* cudaFree(0): initialise the context */
    return emu_free(p, 0) == 0 ? cudaSuccess : ret(cudaErrorInvalidValue);
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
    (void)flags;
    emu_init();
    if (g_ndev <= 0)
        return ret(cudaErrorNoDevice);
    return (*p = emu_alloc(n, -1)) ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void *p)
{
    return emu_free(p, -1) == 0 ? cudaSuccess : ret(cudaErrorInvalidValue);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ps, unsigned int flags)
{
    (void)flags;
    emu_init();
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s)
        return ret(cudaErrorMemoryAllocation);
    s->dev = t_dev;
    s->seed = (unsigned)(uintptr_t)s;
    pthread_mutex_init(&s->m, NULL);
    pthread_cond_init(&s->c, NULL);
    if (pthread_create(&s->th, NULL, stream_main, s) != 0) {
        free(s);
        return ret(cudaErrorMemoryAllocation);
    }
    *ps = s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (!s)
        return ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&s->m);
    const uint64_t target = s->enq;
    while (s->done < target)
        pthread_cond_wait(&s->c, &s->m);
    pthread_mutex_unlock(&s->m);
    pthread_mutex_lock(&g_lock);
    const cudaError_t e = g_sticky;
    pthread_mutex_unlock(&g_lock);
    return ret(e);
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
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e)
        return ret(cudaErrorMemoryAllocation);
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
    op *o = calloc(1, sizeof *o);
    if (!o)
        abort();
    o->kind = OP_RECORD;
    o->ev = e;
    pthread_mutex_lock(&e->m);
    o->gen = ++e->recorded;
    pthread_mutex_unlock(&e->m);
    return enqueue(s, o);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    (void)flags;
    op *o = calloc(1, sizeof *o);
    if (!o)
        abort();
    o->kind = OP_WAIT;
    o->ev = e;
    pthread_mutex_lock(&e->m);
    o->gen = e->recorded;
    pthread_mutex_unlock(&e->m);
    return enqueue(s, o);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    pthread_mutex_lock(&e->m);
    const uint64_t target = e->recorded;
    while (e->completed < target)
        pthread_cond_wait(&e->c, &e->m);
    pthread_mutex_unlock(&e->m);
    pthread_mutex_lock(&g_lock);
    const cudaError_t err = g_sticky;
    pthread_mutex_unlock(&g_lock);
    return ret(err);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s)
{
    const int kd = emu_kind(dst, n), ks = emu_kind(src, n);
    const int want_d = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const int want_s = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kd == -2 || ks == -2 || (kd == 1) != want_d || (ks == 1) != want_s ||
        (!want_d && kd != 0) || (!want_s && ks != 0)) {
        fprintf(stderr, "fake cudart: cudaMemcpyAsync(dst %p [%d], src %p [%d], %zu bytes, kind %d): "
                "outside its allocations or not pinned\n", dst, kd, src, ks, n, (int)kind);
        return ret(cudaErrorInvalidValue);
    }
    op *o = calloc(1, sizeof *o);
    if (!o)
        abort();
    o->kind = OP_COPY;
    o->dst = dst;
    o->src = src;
    o->n = n;
    return enqueue(s, o);
}

cudaError_t cudaGetLastError(void)
{
    const cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e;
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
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (fake runtime)";
    case cudaErrorLaunchFailure: return "unspecified launch failure (injected by the fake runtime)";
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
