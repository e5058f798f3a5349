/*
 * FP8 E4M3 with a scale grid -> BF16 on the GPU (docs/FORMATS.md section 6): DeepSeek-V3
 * 128x128 blocks (weight_scale_inv), compressed-tensors / ModelOpt tensor, channel and
 * block scales (weight_scale, F32 or BF16).
 *
 * Values: bfs_scaled_value(bfs_e4m3_to_f32(w), bfs_scale_at(scale, ...)) from
 * ref_formats.h, called as is, the same primitives in the same order as the CPU reference
 * bfs_fp8_elem (one float32 multiply, mul.rn with --fmad=false, no FTZ: E4M3 subnormals
 * and subnormal products stay exact).
 *
 * One thread makes 8 consecutive elements (one 16-byte store); the chunk may start
 * anywhere in a row and a block. One phase, no shared memory (common.cuh).
 */
#include "common.cuh"
#include "ref_formats.h"

BFS_HD void fp8_eight(const bfs_cu_fp8_args &a, size_t k0)
{
    const size_t gcols = (a.cols + a.bw - 1) / a.bw;
    bfs_cu_rows8(a.out, a.e0, a.cols, a.n, k0, [&](uint64_t r, uint64_t c, size_t k) {
        const float s = bfs_scale_at(a.scale, (r / a.bh - a.g0) * gcols + c / a.bw, a.scale_type);
        return bfs_scaled_value(bfs_e4m3_to_f32(a.w[k]), s);
    });
}

BFS_CU_ELEMWISE(bfs_cu_fp8_args, fp8_eight, fp8_phase, bfs_fp8_kernel, fp8_emu)

extern "C" int bfs__cu_fp8(const bfs_cu_fp8_args *a, cudaStream_t stream)
{
    if (((uintptr_t)a->w | (uintptr_t)a->scale | (uintptr_t)a->out) % BFS_CU_PTR_ALIGN != 0)
        return bfs__err(BFS_EINTERNAL, "bfs__cu_fp8: unaligned device pointer");
    if (a->cols == 0 || a->bh == 0 || a->bw == 0 || a->g0 != (a->e0 / a->cols) / a->bh)
        return bfs__err(BFS_EINTERNAL, "bfs__cu_fp8: inconsistent arguments");
    if (a->n == 0)
        return 0;
    BFS_CU_PRELAUNCH();
    BFS_CU_LAUNCH(bfs_fp8_kernel, fp8_emu, 1, bfs_cu_nosmem, bfs_cu_grid(a->n, BFS_CU_PER_THREAD), 1, 1, stream, *a);
    BFS_CU_LAUNCHED("bfs_fp8_kernel");
    return 0;
}
