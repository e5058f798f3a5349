/*
 * compressed-tensors MX -> BF16 on the GPU (docs/FORMATS.md 7.2, 7.3, 7.6): mxfp8-quantized
 * (E4M3 elements), mxfp4-pack-quantized (E2M1 pairs, low nibble = even element) and
 * mxfp6-pack-quantized (four E2M3 codes per 3 bytes), one E8M0 scale byte per 32 elements.
 *
 * Values as the CPU reference bfs_ctmx_elem (ref_formats.h), through its primitives
 * bfs_ctmx_code_value (bfs_e4m3_to_f32 / bfs_e2m1_ct_to_f32 / bfs_e2m3_to_f32), bfs_e8m0_scale (the E8M0 byte as float32, +inf
 * for 255, or NaN with nan255: DeepSeek-V4's F8_E8M0 scales) and bfs_scaled_value (one
 * float32 multiply, mul.rn with --fmad=false, no FTZ: the 2^-127 scale and subnormal
 * products stay exact).
 *
 * One thread makes 8 consecutive elements (one 16-byte store); the chunk may start on an
 * odd element (the high nibble of its first byte), inside a 3-byte FP6 word and inside a
 * 32-element group.
 * One phase, no shared memory.
 */
#include "common.cuh"
#include "ref_formats.h"

BFS_HD void ctmx_eight(const bfs_cu_ctmx_args &a, size_t k0)
{
    bfs_cu_rows8(a.out, a.e0, a.cols, a.n, k0, [&](uint64_t r, uint64_t c, size_t) {
        const uint64_t i = r * a.cols + c; /* element of the whole tensor */
        const float v = bfs_ctmx_code_value(a.w, a.elem, i, a.e0);
        return bfs_scaled_value(v, bfs_e8m0_scale(a.scale[i / 32 - a.s0], a.nan255));
    });
}

BFS_CU_ELEMWISE(bfs_cu_ctmx_args, ctmx_eight, ctmx_phase, bfs_ctmx_kernel, ctmx_emu)

extern "C" int bfs__cu_ctmx(const bfs_cu_ctmx_args *a, cudaStream_t stream)
{
    if (((uintptr_t)a->w | (uintptr_t)a->scale | (uintptr_t)a->out) % BFS_CU_PTR_ALIGN != 0)
        return bfs__err(BFS_EINTERNAL, "bfs__cu_ctmx: unaligned device pointer");
    if (a->cols == 0 || a->cols % 32 != 0 ||
        (a->elem != BFS_CTMX_E4M3 && a->elem != BFS_CTMX_E2M1 && a->elem != BFS_CTMX_E2M3) ||
        a->b0 != bfs_ctmx_byte(a->elem, a->e0) || a->s0 != a->e0 / 32)
        return bfs__err(BFS_EINTERNAL, "bfs__cu_ctmx: inconsistent arguments");
    if (a->n == 0)
        return 0;
    BFS_CU_PRELAUNCH();
    BFS_CU_LAUNCH(bfs_ctmx_kernel, ctmx_emu, 1, bfs_cu_nosmem, bfs_cu_grid(a->n, BFS_CU_PER_THREAD), 1, 1, stream, *a);
    BFS_CU_LAUNCHED("bfs_ctmx_kernel");
    return 0;
}
