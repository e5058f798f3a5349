/* src/backend/ -- the backends: fill one unit's buffer with its output bytes. The CPU
 * backend and THE unit-level reference (backend_cpu.c), the CUDA backend
 * (backend_cuda*.c, backend_cuda.h) or its stub without nvcc (backend_cuda_stub.c).
 * Uses the kernels, src/formats/tensor.h (units), src/base. */
#ifndef BFS_BACKEND_H
#define BFS_BACKEND_H

#include "formats/tensor.h"

typedef struct bfs_backend bfs_backend;
struct bfs_backend {
    char name[64];
    /* Fill u->out. Synchronous: when it returns, u->out is complete. */
    int (*run)(bfs_backend *b, const bfs_unit *u);
    /* Optional (NULL: run() for each): fill u[0..n)->out, the same bytes as run() on each in
     * turn, which may overlap one unit's work with the next. Synchronous as run(). */
    int (*run_batch)(bfs_backend *b, const bfs_unit *u, int n);
    void (*destroy)(bfs_backend *b);
    uint64_t device_bytes; /* allocated on the device at creation (0 for cpu) */
    /* Optional (NULL: use malloc): host memory for unit buffers that run() fills fastest
     * (CUDA: pinned, the D2H lands in it directly). Free with host_free before destroy. */
    void *(*host_alloc)(bfs_backend *b, size_t n);
    void (*host_free)(bfs_backend *b, void *p);
};

/* CPU backend: level < 0 best; threads 0 = online CPUs. */
int bfs__backend_cpu_create(int level, int threads, bfs_backend **out);
/* CUDA backend over devices (spec "cuda", "cuda:N", "cuda:N,M"); allocates all of
 * its buffers once from gpu_mem; max_unit_bytes is the largest unit the pipeline will pass. */
int bfs__backend_cuda_create(const char *spec, uint64_t gpu_mem, uint64_t max_unit_bytes,
                             bfs_backend **out);
int bfs__cuda_device_count(void);
/* Usable CUDA devices; when none, why (no driver, driver too old for this build, no GPU,
 * too old a GPU, built without CUDA) in why[n] (may be NULL). Creates no CUDA context. */
int bfs__cuda_probe(char *why, size_t n);
int bfs__cuda_built(void);

/* Run one unit with the CPU kernels k on this thread: rows [row0,row1) -> out
 * (the CPU backend's unthreaded path; the fuzzers). */
void bfs__unit_cpu(const bfs_kernel_ops *k, const bfs_unit *u);
/* THE unit-level reference: bfs__unit_cpu with the scalar kernels. Every backend's
 * output is compared with it by memcmp (tests/test_kernels.c, tests/test_cuda.c). */
void bfs__ref_unit(const bfs_unit *u);

#endif
