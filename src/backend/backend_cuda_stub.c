/* CUDA backend for builds without nvcc: says so, and counts no device. */
#include "backend/backend.h"

int bfs__backend_cuda_create(const char *spec, uint64_t gpu_mem, uint64_t max_unit_bytes,
                             bfs_backend **out)
{
    (void)gpu_mem;
    (void)max_unit_bytes;
    if (out)
        *out = NULL;
    return bfs__err(BFS_EDEVICE,
                    "device '%s': bfshard was built without CUDA support (no nvcc at build time); "
                    "use the CPU backend",
                    spec ? spec : "cuda");
}

int bfs__cuda_device_count(void) { return 0; }

int bfs__cuda_probe(char *why, size_t n)
{
    if (why && n)
        snprintf(why, n, "bfshard was built without CUDA support (no nvcc at build time)");
    return 0;
}

int bfs__cuda_built(void) { return 0; }
