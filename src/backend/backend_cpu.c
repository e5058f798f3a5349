/*
 * CPU backend: one unit is cut into nthreads contiguous pieces of output,
 * each filled by the selected kernel level. Workers are created once.
 * Also the one unit-level reference, bfs__ref_unit: the same cutting of a unit
 * into kernel calls, with the scalar kernels (kernels/cpu_scalar.c), on one thread.
 */
#include "backend/backend.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Fill the part [lo, hi) of a unit's output, in units of "work items":
 * elements for flat kinds, output rows for MXFP4. */
static uint64_t bfs__unit_work(const bfs_unit *u)
{
    const bfs_ltensor *t = u->t;
    const uint64_t rows = u->row1 - u->row0;
    if (t->kind == BFS_K_MXFP4) {
        if (!t->mx_items)
            return rows;
        const uint64_t per = t->mx.transpose ? t->mx.G * 32 : t->mx.R;
        return rows * per;
    }
    return rows * t->row_elems;
}

static void bfs__unit_part(const bfs_kernel_ops *k, const bfs_unit *u, uint64_t lo, uint64_t hi)
{
    const bfs_ltensor *t = u->t;
    const uint64_t e0 = u->row0 * t->row_elems; /* first element of the unit */
    uint16_t *out16 = u->out;
    if (lo >= hi)
        return;
    switch (t->kind) {
    case BFS_K_PASS: {
        const size_t es = bfs__dtype_size(t->out_dtype);
        memcpy((uint8_t *)u->out + lo * es, t->src[0]->data + (e0 + lo) * es, (size_t)((hi - lo) * es));
        break;
    }
    case BFS_K_CAST: {
        const size_t is = bfs__dtype_size(t->src_dtype);
        const bfs_cast_fn cast = bfs_kernels_cast(k, bfs__cast_src(t->src_dtype));
        cast(t->src[0]->data + (e0 + lo) * is, (size_t)(hi - lo), out16 + lo);
        break;
    }
    case BFS_K_BNB4:
        k->bnb4(&t->bnb, (size_t)(e0 + lo), (size_t)(e0 + hi), out16 + lo);
        break;
    case BFS_K_FP8:
        k->fp8(&t->fp8, (size_t)(e0 + lo), (size_t)(e0 + hi), out16 + lo);
        break;
    case BFS_K_INT4:
        k->int4(&t->int4, (size_t)(e0 + lo), (size_t)(e0 + hi), out16 + lo);
        break;
    case BFS_K_NVFP4:
        k->nvfp4(&t->nv, (size_t)(e0 + lo), (size_t)(e0 + hi), out16 + lo);
        break;
    case BFS_K_CTMX:
        k->ctmx(&t->ctmx, (size_t)(e0 + lo), (size_t)(e0 + hi), out16 + lo);
        break;
    case BFS_K_WOQ:
        k->woq(&t->woq, (size_t)(e0 + lo), (size_t)(e0 + hi), out16 + lo);
        break;
    case BFS_K_MXFP4:
        if (!t->mx_items) {
            const uint64_t C = t->mx.G * 32;
            k->mxfp4(&t->mx, 0, (size_t)(u->row0 + lo), (size_t)(u->row0 + hi), out16 + lo * C);
        } else {
            const uint64_t per = t->mx.transpose ? t->mx.G * 32 : t->mx.R; /* output rows per item */
            const uint64_t rowlen = t->mx.transpose ? t->mx.R : t->mx.G * 32;
            uint64_t w = lo;
            while (w < hi) {
                const uint64_t item = w / per, o0 = w % per;
                const uint64_t o1 = (hi - item * per) < per ? (hi - item * per) : per;
                k->mxfp4(&t->mx, (size_t)(u->row0 + item), (size_t)o0, (size_t)o1, out16 + w * rowlen);
                w = item * per + o1;
            }
        }
        break;
    }
}

void bfs__unit_cpu(const bfs_kernel_ops *k, const bfs_unit *u) { bfs__unit_part(k, u, 0, bfs__unit_work(u)); }

void bfs__ref_unit(const bfs_unit *u) { bfs__unit_cpu(&bfs__cpu_scalar_ops, u); }

typedef struct bfs_cpu {
    bfs_backend base;
    const bfs_kernel_ops *k;
    int nthreads;
    pthread_t *tid;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    uint64_t gen;      /* bumped for every unit */
    int pending;       /* workers still busy on this gen */
    bool stop;
    const bfs_unit *unit;
    uint64_t work;
} bfs_cpu;

typedef struct {
    bfs_cpu *c;
    int idx;
} bfs_cpu_arg;

static void bfs__cpu_slice(const bfs_cpu *c, int idx, uint64_t *lo, uint64_t *hi)
{
    const uint64_t n = c->work, T = (uint64_t)c->nthreads;
    /* multiples of 64 work items, so no two threads share an output cache line */
    uint64_t per = (n + T - 1) / T;
    per = (per + 63) & ~(uint64_t)63;
    *lo = per * (uint64_t)idx < n ? per * (uint64_t)idx : n;
    *hi = per * (uint64_t)(idx + 1) < n ? per * (uint64_t)(idx + 1) : n;
}

static void *bfs__cpu_worker(void *p)
{
    bfs_cpu_arg *a = p;
    bfs_cpu *c = a->c;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        while (!c->stop && c->gen == seen)
            pthread_cond_wait(&c->cv_start, &c->mu);
        if (c->stop) {
            pthread_mutex_unlock(&c->mu);
            break;
        }
        seen = c->gen;
        const bfs_unit *u = c->unit;
        pthread_mutex_unlock(&c->mu);
        uint64_t lo, hi;
        bfs__cpu_slice(c, a->idx, &lo, &hi);
        bfs__unit_part(c->k, u, lo, hi);
        pthread_mutex_lock(&c->mu);
        if (--c->pending == 0)
            pthread_cond_signal(&c->cv_done);
        pthread_mutex_unlock(&c->mu);
    }
    free(a);
    return NULL;
}

static int bfs__cpu_run(bfs_backend *b, const bfs_unit *u)
{
    bfs_cpu *c = (bfs_cpu *)b;
    if (u->t->members) /* a kernel reads one member of a packed tensor (bfs__ucur_next), never it */
        return bfs__err(BFS_EINTERNAL, "tensor \"%s\": a unit of a packed tensor reached the backend", u->t->name);
    const uint64_t work = bfs__unit_work(u);
    /* the threshold is in output elements: MXFP4 work items are whole output rows */
    if (c->nthreads <= 1 || (u->row1 - u->row0) * u->t->row_elems < 65536) {
        bfs__unit_cpu(c->k, u);
        return 0;
    }
    pthread_mutex_lock(&c->mu);
    c->unit = u;
    c->work = work;
    c->pending = c->nthreads - 1;
    c->gen++;
    pthread_cond_broadcast(&c->cv_start);
    pthread_mutex_unlock(&c->mu);
    uint64_t lo, hi;
    bfs__cpu_slice(c, 0, &lo, &hi);
    bfs__unit_part(c->k, u, lo, hi);
    pthread_mutex_lock(&c->mu);
    while (c->pending > 0)
        pthread_cond_wait(&c->cv_done, &c->mu);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

static void bfs__cpu_destroy(bfs_backend *b)
{
    bfs_cpu *c = (bfs_cpu *)b;
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_broadcast(&c->cv_start);
    pthread_mutex_unlock(&c->mu);
    for (int i = 1; i < c->nthreads; i++)
        if (c->tid[i])
            pthread_join(c->tid[i], NULL);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv_start);
    pthread_cond_destroy(&c->cv_done);
    free(c->tid);
    free(c);
}

int bfs__backend_cpu_create(int level, int threads, bfs_backend **out)
{
    int rc = 0;
    bfs_cpu *c = calloc(1, sizeof *c);
    *out = NULL;
    if (!c)
        return bfs__err(BFS_ENOMEM, "out of memory");
    c->k = bfs_kernels_cpu(level);
    if (!c->k) {
        free(c);
        return bfs__err(BFS_EUSAGE, "CPU kernel level %d is not supported on this CPU (best here: %s)", level,
                        bfs_cpu_level_name(bfs_kernels_best_level()));
    }
    if (threads <= 0) {
        const long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    if (threads > 256)
        threads = 256;
    c->nthreads = threads;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv_start, NULL);
    pthread_cond_init(&c->cv_done, NULL);
    c->tid = calloc((size_t)threads, sizeof *c->tid);
    if (!c->tid) {
        c->nthreads = 1;
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    }
    for (int i = 1; i < threads; i++) {
        bfs_cpu_arg *a = malloc(sizeof *a);
        if (a) {
            a->c = c;
            a->idx = i;
        }
        if (!a || pthread_create(&c->tid[i], NULL, bfs__cpu_worker, a) != 0) {
            free(a);
            c->nthreads = i;
            BFS_FAIL(BFS_ENOMEM, "cannot start CPU worker thread %d", i);
        }
    }
    snprintf(c->base.name, sizeof c->base.name, "cpu/%s x%d", c->k->name, threads);
    c->base.run = bfs__cpu_run;
    c->base.destroy = bfs__cpu_destroy;
    *out = &c->base;
    c = NULL;
cleanup:
    if (c)
        bfs__cpu_destroy(&c->base);
    return rc;
}

const char *bfs_cpu_level_name(int level)
{
    switch (level) {
    case BFS_CPU_SCALAR: return "scalar";
    case BFS_CPU_AVX2: return "avx2";
    case BFS_CPU_AVX512: return "avx512";
    default: return "?";
    }
}
int bfs_cpu_best_level(void) { return bfs_kernels_best_level(); }
int bfs_cuda_built(void) { return bfs__cuda_built(); }
int bfs_cuda_device_count(void) { return bfs__cuda_device_count(); }
