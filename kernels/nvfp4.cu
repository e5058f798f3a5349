/*
 * NVFP4 -> BF16 on the GPU (docs/FORMATS.md section 6), both conventions:
 * compressed-tensors (modelopt = 0: block scale f32(s) / global_scale, code 8 = -0.0) and
 * ModelOpt (modelopt = 1: f32(s) * weight_scale_2, code 8 = +0.0).
 *
 * Values as the CPU reference bfs_nvfp4_elem (ref_formats.h), through its primitives
 * bfs_nvfp4_block_scale and bfs_nvfp4_value. The block scales (a float32 divide for
 * compressed-tensors) come from a 256-entry table the host makes with the reference's own
 * bfs_nvfp4_block_scale, once per unit (backend_cuda_pipe.c), as the AVX2 kernel does: the
 * kernel has no divide, so its SASS has no FFMA and no .FTZ at all (dev/cuda/exactness.sh
 * checks it). Low nibble = even column.
 *
 * One thread makes 8 consecutive elements (one 16-byte store); the chunk may start on an
 * odd element (the high nibble of its first byte) and inside a 16-element block.
 * One phase, no shared memory.
 */
#include "common.cuh"
#include "ref_formats.h"

BFS_HD void nvfp4_eight(const bfs_cu_nvfp4_args &a, size_t k0)
{
    const uint64_t half = a.cols / 2, nblk = a.cols / 16;
    bfs_cu_rows8(a.out, a.e0, a.cols, a.n, k0, [&](uint64_t r, uint64_t c, size_t) {
        const uint8_t b = a.packed[r * half + c / 2 - a.b0];
        const unsigned code = (c & 1) ? (unsigned)(b >> 4) : (unsigned)(b & 0x0Fu);
        const float bs = a.bs[a.scale[r * nblk + c / 16 - a.s0]];
        return bfs_nvfp4_value(code, bs, a.modelopt);
    });
}

BFS_CU_ELEMWISE(bfs_cu_nvfp4_args, nvfp4_eight, nvfp4_phase, bfs_nvfp4_kernel, nvfp4_emu)

extern "C" int bfs__cu_nvfp4(const bfs_cu_nvfp4_args *a, cudaStream_t stream)
{
    if (!a->bs || ((uintptr_t)a->packed | (uintptr_t)a->scale | (uintptr_t)a->out) % BFS_CU_PTR_ALIGN != 0)
        return bfs__err(BFS_EINTERNAL, "bfs__cu_nvfp4: unaligned device pointer");
    if (a->cols == 0 || a->cols % 16 != 0 || (a->modelopt != 0 && a->modelopt != 1) ||
        a->b0 != (a->e0 / a->cols) * (a->cols / 2) + (a->e0 % a->cols) / 2 ||
        a->s0 != (a->e0 / a->cols) * (a->cols / 16) + (a->e0 % a->cols) / 16)
        return bfs__err(BFS_EINTERNAL, "bfs__cu_nvfp4: inconsistent arguments");
    if (a->n == 0)
        return 0;
    BFS_CU_PRELAUNCH();
    BFS_CU_LAUNCH(bfs_nvfp4_kernel, nvfp4_emu, 1, bfs_cu_nosmem, bfs_cu_grid(a->n, BFS_CU_PER_THREAD), 1, 1, stream, *a);
    BFS_CU_LAUNCHED("bfs_nvfp4_kernel");
    return 0;
}
