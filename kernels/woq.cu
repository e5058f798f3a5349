/*
 * GPTQ, AWQ GEMM / GEMV and bitsandbytes 8-bit -> BF16 on the GPU (docs/FORMATS.md section 9).
 * A chunk is a range of output rows; the host gathers, per chunk, the columns of the
 * transposed GPTQ / AWQ GEMM arrays those rows need (the rows of GEMV's and 8-bit's)
 * (bfs_cu_woq_args, common.cuh), so the kernel reads compact arrays. Values as the CPU
 * reference bfs_woq_elem (ref_woq.h), through its primitives: bfs_woq_code, bfs_gptq_zero_at,
 * bfs_awq_field, bfs_woq_value, bfs_awqv_value, bfs_bnb8_value.
 * One thread makes 8 consecutive elements of the output (one 16-byte store). One phase.
 */
#include "common.cuh"
#include "ref_woq.h"

BFS_HD void woq_eight(const bfs_cu_woq_args &a, size_t k0)
{
    bfs_cu_rows8(a.out, 0, a.cols, a.n, k0, [&](uint64_t rl, uint64_t c, size_t) -> uint16_t {
        if (a.layout == BFS_WOQ_BNB8) {
            float scb;
            memcpy(&scb, a.scale + 4 * rl, 4);
            return bfs_bnb8_value((int)(int8_t)a.qweight[rl * a.cols + c], scb);
        }
        const uint64_t r = a.r0 + rl;
        const size_t g = a.g_idx ? (size_t)bfs_woq_word(a.g_idx, c) : c / a.group_size;
        if (a.layout == BFS_WOQ_GEMV)
            return bfs_awqv_value(a.qweight, a.qzeros, a.scale, rl, a.cols, a.zc, c, g, a.scale_type);
        const uint8_t *zrow = a.qzeros + g * a.zc * 4;
        int q, z;
        if (a.layout == BFS_WOQ_GPTQ) {
            q = (int)bfs_woq_code(a.qweight + 4 * rl, a.nrows, c, (unsigned)a.bits);
            z = bfs_gptq_zero_at(zrow, r - a.zr0, (unsigned)a.bits, a.v1);
        } else {
            q = (int)bfs_awq_field(a.qweight + c * a.zc * 4, r - a.zr0);
            z = (int)bfs_awq_field(zrow, r - a.zr0);
        }
        return bfs_woq_value(a.scale, g * a.nrows + rl, a.scale_type, q - z);
    });
}

BFS_CU_ELEMWISE(bfs_cu_woq_args, woq_eight, woq_phase, bfs_woq_kernel, woq_emu)

extern "C" int bfs__cu_woq(const bfs_cu_woq_args *a, cudaStream_t stream)
{
    if (((uintptr_t)a->qweight | (uintptr_t)a->scale | (uintptr_t)a->qzeros | (uintptr_t)a->g_idx | (uintptr_t)a->out) %
            BFS_CU_PTR_ALIGN != 0)
        return bfs__err(BFS_EINTERNAL, "bfs__cu_woq: unaligned device pointer");
    if (a->cols == 0 || a->n != a->nrows * a->cols || (a->layout != BFS_WOQ_BNB8 && (!a->qzeros || a->zc == 0 || a->group_size == 0 || a->zr0 > a->r0)) ||
        (a->layout == BFS_WOQ_GPTQ && a->bits != 2 && a->bits != 3 && a->bits != 4 && a->bits != 8) ||
        ((a->layout == BFS_WOQ_AWQ || a->layout == BFS_WOQ_GEMV) && a->bits != 4) ||
        (a->layout == BFS_WOQ_GEMV && a->cols % 8 != 0) || a->layout < 0 || a->layout > BFS_WOQ_GEMV)
        return bfs__err(BFS_EINTERNAL, "bfs__cu_woq: inconsistent arguments");
    if (a->nrows == 0)
        return 0;
    BFS_CU_PRELAUNCH();
    BFS_CU_LAUNCH(bfs_woq_kernel, woq_emu, 1, bfs_cu_nosmem, bfs_cu_grid(a->n, BFS_CU_PER_THREAD), 1, 1,
                  stream, *a);
    BFS_CU_LAUNCHED("bfs_woq_kernel");
    return 0;
}
