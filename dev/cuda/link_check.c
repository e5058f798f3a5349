/*
 * Links the real CUDA backend (backend_cuda.o + the kernels' .cu.o + static
 * cudart) and checks that, on a machine without a driver or a GPU, it counts
 * 0 devices and refuses to create a backend with BFS_EDEVICE, without crashing.
 * Build and run: dev/cuda/build.sh link
 */
#include "bfs_internal.h"

#include <stdio.h>
#include <string.h>

int main(void)
{
    const int n = bfs__cuda_device_count();
    printf("bfs__cuda_built() = %d, bfs__cuda_device_count() = %d\n", bfs__cuda_built(), n);
    bfs_backend *b = NULL;
    const int rc = bfs__backend_cuda_create("cuda", 64 << 20, 1 << 20, &b);
    printf("create(\"cuda\") = %d (%s)\n", rc, rc < 0 ? bfs_last_error() : "ok");
    if (b) {
        printf("backend %s, %llu device bytes\n", b->name, (unsigned long long)b->device_bytes);
        b->destroy(b);
    }
    bfs__err_clear();
    const int rc2 = bfs__backend_cuda_create("cuda:x", 64 << 20, 1 << 20, &b);
    printf("create(\"cuda:x\") = %d (%s)\n", rc2, bfs_last_error());
    if (n == 0 && (rc != BFS_EDEVICE || b != NULL || rc2 != BFS_EUSAGE)) {
        printf("FAIL\n");
        return 1;
    }
    printf("OK\n");
    return 0;
}
