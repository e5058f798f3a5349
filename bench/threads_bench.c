/*
 * Thread scaling of the in-memory dequant rate: the kernels of one level
 * (default: the best here) run on 1..N threads over a tensor split into
 * contiguous pieces of output, as the CPU backend splits a unit, beside a
 * memcpy of the same output bytes on as many threads. GB/s of BF16 output.
 *
 * Shapes (real ones): 4 experts of gpt-oss-20b's gate_up_proj (blocks
 * [4, 5760, 90, 16] -> [4, 2880, 5760] transposed, the default HF layout),
 * and one bitsandbytes NF4 4096 x 14336 weight with double quant.
 * Outputs are 133 MB and 117 MB: far larger than any cache, so this is the
 * rate a streaming conversion can sustain.
 *
 *   build/bench/threads_bench [--threads-max N] [--reps R] [--level L] [--json]
 *
 * Links build/libbfshard.a (for the kernels, kernels/bfs_kernels.h).
 */
#include "bfs_kernels.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* as convert allocates its unit buffers: on 2 MiB, advised for transparent huge pages */
static void *xalloc(size_t n)
{
    void *p = NULL;
    const size_t huge = (size_t)2 << 20, len = ((n ? n : 1) + huge - 1) / huge * huge;
    if (posix_memalign(&p, huge, len) == 0)
        (void)madvise(p, len, MADV_HUGEPAGE);
    else {
        fprintf(stderr, "threads_bench: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    memset(p, 0, n); /* fault the pages in before timing */
    return p;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static void rnd_fill(void *p, size_t n)
{
    uint8_t *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
        const uint64_t v = rng * 0x2545F4914F6CDD1Dull;
        memcpy(b + i, &v, 8);
    }
    for (; i < n; i++)
        b[i] = (uint8_t)(rng >> (i & 7));
}

enum { OP_MXFP4, OP_BNB4, OP_MEMCPY };

typedef struct job {
    int op;
    const bfs_kernel_ops *k;
    bfs_mxfp4_desc mx;
    size_t mx_items, mx_rows;   /* output rows per item, and each row's length */
    size_t mx_rowlen;
    bfs_bnb4_desc bnb;
    size_t bnb_n;
    const uint8_t *src;         /* memcpy */
    size_t bytes;               /* output bytes */
    uint16_t *out;
} job;

/* Work items: MXFP4 output rows over all items; bnb elements; memcpy bytes. */
static size_t job_work(const job *j)
{
    return j->op == OP_MXFP4 ? j->mx_items * j->mx_rows : j->op == OP_BNB4 ? j->bnb_n : j->bytes;
}

static void job_part(const job *j, size_t lo, size_t hi)
{
    if (lo >= hi)
        return;
    switch (j->op) {
    case OP_MXFP4:
        for (size_t w = lo; w < hi;) {
            const size_t item = w / j->mx_rows, o0 = w % j->mx_rows;
            const size_t o1 = hi - item * j->mx_rows < j->mx_rows ? hi - item * j->mx_rows : j->mx_rows;
            j->k->mxfp4(&j->mx, item, o0, o1, j->out + w * j->mx_rowlen);
            w = item * j->mx_rows + o1;
        }
        break;
    case OP_BNB4:
        j->k->bnb4(&j->bnb, lo, hi, j->out + lo);
        break;
    case OP_MEMCPY:
        memcpy((uint8_t *)j->out + lo, j->src + lo, hi - lo);
        break;
    }
}

typedef struct pool {
    int nthreads;
    pthread_barrier_t start, done;
    const job *j;
    int stop;
} pool;

typedef struct worker {
    pool *p;
    int idx;
} worker;

static void slice(const pool *p, int idx, size_t *lo, size_t *hi)
{
    const size_t n = job_work(p->j), T = (size_t)p->nthreads;
    size_t per = (n + T - 1) / T;
    per = (per + 4095) & ~(size_t)4095; /* whole cache lines, whole bnb blocks */
    *lo = per * idx < n ? per * idx : n;
    *hi = per * (idx + 1) < n ? per * (idx + 1) : n;
}

static void *worker_main(void *a)
{
    worker *w = a;
    pool *p = w->p;
    for (;;) {
        pthread_barrier_wait(&p->start);
        if (p->stop)
            break;
        size_t lo, hi;
        slice(p, w->idx, &lo, &hi);
        job_part(p->j, lo, hi);
        pthread_barrier_wait(&p->done);
    }
    return NULL;
}

/* Seconds of one run of j on the pool (the calling thread is worker 0). */
static double pool_run(pool *p, const job *j)
{
    p->j = j;
    const double t0 = now_s();
    pthread_barrier_wait(&p->start);
    size_t lo, hi;
    slice(p, 0, &lo, &hi);
    job_part(j, lo, hi);
    pthread_barrier_wait(&p->done);
    return now_s() - t0;
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int tmax = ncpu > 0 ? (int)ncpu : 1, reps = 5, level = -1, json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads-max") && i + 1 < argc)
            tmax = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--level") && i + 1 < argc) {
            const char *l = argv[++i];
            level = !strcmp(l, "scalar") ? BFS_CPU_SCALAR : !strcmp(l, "avx2") ? BFS_CPU_AVX2
                  : !strcmp(l, "avx512") ? BFS_CPU_AVX512 : atoi(l);
        } else if (!strcmp(argv[i], "--json"))
            json = 1;
        else {
            fprintf(stderr, "usage: threads_bench [--threads-max N] [--reps R] [--level scalar|avx2|avx512] [--json]\n");
            return 2;
        }
    }
    if (tmax < 1 || reps < 1 || tmax > 1024)
        return 2;
    const bfs_kernel_ops *k = bfs_kernels_cpu(level);
    if (!k) {
        fprintf(stderr, "threads_bench: level %d not supported here\n", level);
        return 2;
    }

    /* gpt-oss-20b gate_up_proj_blocks, 4 of its 32 experts */
    const size_t E = 4, R = 5760, G = 90;
    uint8_t *blocks = xalloc(E * R * G * 16), *scales = xalloc(E * R * G);
    rnd_fill(blocks, E * R * G * 16);
    for (size_t i = 0; i < E * R * G; i++)
        scales[i] = (uint8_t)(118 + blocks[i] % 13);
    /* bitsandbytes NF4 4096 x 14336, double quant, blocksize 64 */
    static const float nf4[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                                  -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                                  0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f,
                                  0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
                                  0.7229568362236023f, 1.0f};
    static float nested_code[256];
    const size_t nb = (size_t)4096 * 14336, nblocks = nb / 64;
    uint8_t *codes = xalloc(nb / 2), *absmax = xalloc(nblocks);
    float *nabs = xalloc((nblocks / 256 + 1) * sizeof(float));
    rnd_fill(codes, nb / 2);
    rnd_fill(absmax, nblocks);
    for (int q = 0; q < 256; q++)
        nested_code[q] = (float)(q - 128) / 128.0f;
    for (size_t b = 0; b <= nblocks / 256; b++)
        nabs[b] = 0.03f + (float)(b % 100) * 1e-4f;

    const size_t mx_bytes = E * R * G * 32 * 2, bnb_bytes = nb * 2;
    const size_t max_bytes = mx_bytes > bnb_bytes ? mx_bytes : bnb_bytes;
    uint16_t *out = xalloc(max_bytes);
    uint8_t *src = xalloc(max_bytes);
    rnd_fill(src, max_bytes);

    job jobs[3];
    memset(jobs, 0, sizeof jobs);
    jobs[0] = (job){.op = OP_MXFP4, .k = k, .mx = {blocks, scales, R, G, 1}, .mx_items = E, .mx_rows = G * 32,
                    .mx_rowlen = R, .bytes = mx_bytes, .out = out};
    jobs[1] = (job){.op = OP_BNB4, .k = k, .bnb = {codes, nf4, 64, NULL, absmax, nested_code, nabs, 256, 0.12f},
                    .bnb_n = nb, .bytes = bnb_bytes, .out = out};
    jobs[2] = (job){.op = OP_MEMCPY, .src = src, .bytes = mx_bytes, .out = out};
    const char *names[3] = {"mxfp4 gate_up 4x5760x2880 (HF, transposed)", "bnb nf4 dq 4096x14336", "memcpy (same bytes as mxfp4)"};
    const char *keys[3] = {"mxfp4", "bnb_nf4_dq", "memcpy"};

    if (!json)
        printf("threads_bench: level %s, best of %d; GB/s of BF16 output (1e9 B/s), median in ()\n", k->name, reps);
    else
        printf("{\"level\": \"%s\", \"reps\": %d, \"ncpu\": %ld, \"results\": [", k->name, reps, ncpu);
    int first = 1;
    for (int T = 1; T <= tmax; T++) {
        pool p = {.nthreads = T};
        pthread_barrier_init(&p.start, NULL, (unsigned)T);
        pthread_barrier_init(&p.done, NULL, (unsigned)T);
        pthread_t *tid = calloc((size_t)T, sizeof *tid);
        worker *ws = calloc((size_t)T, sizeof *ws);
        for (int i = 1; i < T; i++) {
            ws[i] = (worker){&p, i};
            pthread_create(&tid[i], NULL, worker_main, &ws[i]);
        }
        for (int o = 0; o < 3; o++) {
            double *t = calloc((size_t)reps, sizeof *t);
            pool_run(&p, &jobs[o]); /* warm-up */
            for (int r = 0; r < reps; r++)
                t[r] = pool_run(&p, &jobs[o]);
            qsort(t, (size_t)reps, sizeof *t, cmp_d);
            const double best = (double)jobs[o].bytes / t[0] / 1e9, med = (double)jobs[o].bytes / t[reps / 2] / 1e9;
            if (json)
                printf("%s\n {\"op\": \"%s\", \"threads\": %d, \"bytes\": %zu, \"best_gbs\": %.3f, \"median_gbs\": %.3f}",
                       first ? "" : ",", keys[o], T, jobs[o].bytes, best, med);
            else
                printf("  %d thread%s  %-44s %7.2f GB/s (%6.2f)\n", T, T > 1 ? "s" : " ", names[o], best, med);
            first = 0;
            free(t);
        }
        p.stop = 1;
        pthread_barrier_wait(&p.start);
        for (int i = 1; i < T; i++)
            pthread_join(tid[i], NULL);
        pthread_barrier_destroy(&p.start);
        pthread_barrier_destroy(&p.done);
        free(tid);
        free(ws);
    }
    if (json)
        printf("\n]}\n");
    free(blocks), free(scales), free(codes), free(absmax), free(nabs), free(out), free(src);
    return 0;
}
