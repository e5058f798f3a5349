/*
 * CUDA backend, the pipeline of one unit on one device (bfs__cu_pipeline): chunks through
 * the two slots, gathered into pinned memory, H2D, kernel, D2H on three streams ordered by
 * events, drained into the unit's buffer (backend_cuda.c's opening comment describes it),
 * and a failed pipeline's error rewritten when the device's context is lost. Uses
 * backend_cuda_q.c (job, layout, launch) and backend_cuda_dev.c (devices); run() and the
 * start-up self-test call it.
 */
#include "backend/backend_cuda.h"
#include "../../kernels/ref_formats.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static uint8_t *cu_slot_h(const cu_dev *d, const cu_backend *b, int k)
{
    return d->h_arena + CU_CONST_BYTES + (uint64_t)k * b->slot;
}
static uint8_t *cu_slot_d(const cu_dev *d, const cu_backend *b, int k)
{
    return d->d_arena + CU_CONST_BYTES + (uint64_t)k * b->slot;
}

static void cu_gather_in(const cu_chunk *ch, uint8_t *h)
{
    for (int i = 0; i < ch->ngather; i++) {
        const cu_gather *g = &ch->g[i];
        if (g->nrows == 1 || g->stride == g->row_bytes) {
            memcpy(h + g->off, g->src, g->row_bytes * g->nrows);
        } else {
            for (uint64_t r = 0; r < g->nrows; r++)
                memcpy(h + g->off + r * g->row_bytes, g->src + r * g->stride, g->row_bytes);
        }
    }
}

static int cu_drain(const cu_backend *b, const cu_dev *d, const cu_job *j, int k, const cu_chunk *ch)
{
    CUDA_CHECK_RET(cudaEventSynchronize(d->ev_down[k]));
    if (!j->in_place)
        memcpy(ch->dst, cu_slot_h(d, b, k) + ch->out_off, ch->out_bytes);
    return 0;
}

const float bfs__cu_nf4[16] = BFS_NF4_TABLE_INIT;
static const float cu_fp4[16] = BFS_FP4_TABLE_INIT;

/* The error of a failed pipeline on d, rewritten when the device's context is lost:
 * which tensor, which chunks were in flight, what it means, what to do. */
static int cu_fault(cu_dev *d, const cu_job *j, int rc, int chunks, int drained, uint64_t pos0, uint64_t pos1)
{
    if (rc != BFS_EDEVICE || !bfs__cu_check_lost(d))
        return rc;
    char first[512];
    snprintf(first, sizeof first, "%s", bfs_last_error());
    bfs__err_clear(); /* the first error wins: replace it with the full story */
    snprintf(d->lost_msg, sizeof d->lost_msg, "%s (%s) in tensor %s", cudaGetErrorName(d->lost),
             cudaGetErrorString(d->lost), j->t->name);
    return bfs__err(BFS_EDEVICE,
                    "cuda:%d: the GPU faulted while converting tensor %s: %s (%s), found at chunk %d of this "
                    "unit (chunks %d-%d in flight: %ss [%" PRIu64 ", %" PRIu64 ")); the CUDA context of this device "
                    "is lost, nothing more can run on it in this process; rerun with --device cpu "
                    "(and please report it with this message) [first error: %s]",
                    d->id, j->t->name, cudaGetErrorName(d->lost), cudaGetErrorString(d->lost), drained + 1,
                    drained + 1, chunks, bfs__cu_what(j), pos0, pos1, first);
}

int bfs__cu_pipeline(const cu_backend *b, cu_dev *d, cu_job *j, uint64_t cap)
{
    int rc = 0, prev = -1, c = 0, prev_dev = -1, drained = 0;
    uint64_t done_pos = j->pos; /* granules before it are in unit->out */
    cu_chunk ch[2];
    if (d->lost != cudaSuccess)
        return bfs__err(BFS_EDEVICE,
                        "cuda:%d: cannot convert tensor %s: this device's CUDA context was lost by an earlier fault "
                        "(%s); rerun with --device cpu",
                        d->id, j->t->name, d->lost_msg);
    BFS_TRY(bfs__cu_enter(d->id, &prev_dev));
    if (j->mode == J_BNB) { /* the code tables, once per unit (the last run has finished with them) */
        const float *table = j->t->bnb.table;
        if (!table)
            table = strcmp(j->t->quant_type, "fp4") == 0 ? cu_fp4 : bfs__cu_nf4;
        memcpy(d->h_arena, table, 16 * sizeof(float));
        uint64_t bytes = 16 * sizeof(float);
        if (j->dq) {
            memcpy(d->h_arena + CU_NCODE_OFF, j->t->bnb.nested_code, 256 * sizeof(float));
            bytes = CU_NCODE_OFF + 256 * sizeof(float);
        }
        CUDA_CHECK(cudaMemcpyAsync(d->d_arena, d->h_arena, bytes, cudaMemcpyHostToDevice, d->s_up));
    } else if (j->mode == J_NVFP4) { /* the block scale of every E4M3 byte, by the reference */
        float *bs = (float *)d->h_arena;
        for (unsigned s = 0; s < 256; s++)
            bs[s] = bfs_nvfp4_block_scale((uint8_t)s, j->t->nv.global_scale, j->t->nv.modelopt);
        CUDA_CHECK(cudaMemcpyAsync(d->d_arena, d->h_arena, 256 * sizeof(float), cudaMemcpyHostToDevice, d->s_up));
    }
    while (j->pos < j->end) {
        const int k = c & 1;
        uint64_t n = 0;
        BFS_TRY(bfs__cu_choose(b, j, j->pos, cap, &n));
        bfs__cu_layout(j, j->pos, n, &ch[k]);
        uint8_t *hs = cu_slot_h(d, b, k), *ds = cu_slot_d(d, b, k);
        /* slot k is free: chunk c-2, its last user, was drained in the previous round */
        cu_gather_in(&ch[k], hs);
        CUDA_CHECK(cudaStreamWaitEvent(d->s_up, d->ev_comp[k], 0));
        CUDA_CHECK(cudaMemcpyAsync(ds, hs, ch[k].in_bytes, cudaMemcpyHostToDevice, d->s_up));
        CUDA_CHECK(cudaEventRecord(d->ev_up[k], d->s_up));
        CUDA_CHECK(cudaStreamWaitEvent(d->s_comp, d->ev_up[k], 0));
        CUDA_CHECK(cudaStreamWaitEvent(d->s_comp, d->ev_down[k], 0));
        BFS_TRY(bfs__cu_launch(j, &ch[k], d, ds));
        CUDA_CHECK(cudaEventRecord(d->ev_comp[k], d->s_comp));
        CUDA_CHECK(cudaStreamWaitEvent(d->s_down, d->ev_comp[k], 0));
        CUDA_CHECK(cudaMemcpyAsync(j->in_place ? ch[k].dst : hs + ch[k].out_off, ds + ch[k].out_off,
                                   ch[k].out_bytes, cudaMemcpyDeviceToHost, d->s_down));
        CUDA_CHECK(cudaEventRecord(d->ev_down[k], d->s_down));
        j->pos += n;
        c++;
        if (prev >= 0) {
            BFS_TRY(cu_drain(b, d, j, prev, &ch[prev]));
            drained++;
            done_pos = ch[prev].pos + ch[prev].n;
        }
        prev = k;
    }
    if (prev >= 0) {
        const int last = prev;
        prev = -1;
        BFS_TRY(cu_drain(b, d, j, last, &ch[last]));
        drained++;
    }
cleanup:
    if (rc < 0) { /* nothing may still be copying into or out of the staging when we return */
        cu_sync_streams(d);
        rc = cu_fault(d, j, rc, c, drained, done_pos, j->pos);
    }
    bfs__cu_leave(prev_dev);
    return rc;
}
