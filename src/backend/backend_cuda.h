/*
 * The CUDA backend's private header: its constants, the per-device and backend state, the
 * work of one unit (cu_job, cu_chunk), and what its files call in each other, one way
 * (each calls only those listed below it):
 *   backend_cuda.c           run() over the devices, pinned unit buffers, creation, teardown
 *   backend_cuda_selftest.c  the start-up self-test that refuses an inexact build
 *   backend_cuda_pipe.c      one unit's chunks through one device (the pipeline)
 *   backend_cuda_q.c         per-format job setup, chunk layout and kernel launch
 *   backend_cuda_dev.c       devices: contexts, probing, driver messages, spec
 * Included only by those files (built only with CUDA or its emulated runtime).
 */
#ifndef BFS_BACKEND_CUDA_H
#define BFS_BACKEND_CUDA_H

#include "backend/backend.h"

#include "../../kernels/common.cuh"
#include "../../kernels/ref.h"
#include "../../kernels/ref_formats.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define CU_ALIGN ((uint64_t)BFS_CU_PTR_ALIGN)
#define CU_CONST_BYTES ((uint64_t)4096)           /* bnb table (16 f32) at 0, nested code (256 f32) at 256; NVFP4 block scales (256 f32) at 0 */
#define CU_NCODE_OFF ((uint64_t)256)
#define CU_SLOT_CAP ((uint64_t)64 << 20)
#define CU_SLOT_MIN ((uint64_t)4 << 10)
#define CU_DEFAULT_BUDGET (CU_CONST_BYTES + 2 * CU_SLOT_CAP)
#define CU_SPLIT 4                                 /* a large unit becomes at least 4 chunks */
#define CU_CHUNK_MIN ((uint64_t)4 << 20)           /* ... of at least 4 MiB */
#define CU_MAX_DEV 16
#define CU_MIN_CC 75                               /* 7.5 (T4): the kernels need nothing newer */
#ifndef BFS_CUDA_ARCHS
#define BFS_CUDA_ARCHS "unknown"                   /* the Makefile passes the -gencode list */
#endif

typedef struct cu_dev {
    int id;
    bool lock_init;
    pthread_mutex_t lock;
    cudaStream_t s_up, s_comp, s_down;
    cudaEvent_t ev_up[2], ev_comp[2], ev_down[2];
    uint8_t *d_arena; /* device */
    uint8_t *h_arena; /* pinned host */
    cudaError_t lost; /* a sticky error: the context is gone, nothing more runs here */
    char lost_msg[160];
    /* the gather helper: copies the next chunk's input into its pinned slot while this
     * thread enqueues the current one and drains the one before (backend_cuda_pipe.c) */
    bool g_run;                 /* its thread exists */
    pthread_t g_th;
    pthread_mutex_t g_m;
    pthread_cond_t g_c;
    const struct cu_group *g_work; /* posted, not yet gathered */
    uint8_t *g_dst;
    bool g_stop;
} cu_dev;

typedef struct cu_pinned { /* a unit buffer from host_alloc */
    uint8_t *p;
    size_t n;
    struct cu_pinned *next;
} cu_pinned;

typedef struct cu_backend {
    bfs_backend base; /* first: a bfs_backend * is a cu_backend * */
    int ndev;
    cu_dev dev[CU_MAX_DEV];
    uint64_t budget;      /* per device, bytes */
    uint64_t slot;        /* S */
    uint64_t slot_budget; /* S the budget alone would allow (before the caps) */
    uint64_t arena;       /* CU_CONST_BYTES + 2 S */
    atomic_uint next;     /* round robin over devices */
    pthread_mutex_t pin_lock;
    cu_pinned *pinned;    /* host_alloc's buffers */
} cu_backend;

/* ---- the work of one unit ------------------------------------------------------------ */
enum { J_MX_FLAT, J_MX_ITEMS, J_MX_GROUPS, J_BNB, J_CAST, J_FP8, J_INT4, J_NVFP4, J_CTMX, J_WOQ };

typedef struct cu_job {
    int mode;
    bool in_place;      /* out is pinned: D2H straight into it */
    const bfs_ltensor *t;
    uint8_t *out;
    /* position in granules: flat rows (item*R + r), items, item-groups ((item-row0)*G + g), elements,
     * output rows (J_WOQ) */
    uint64_t pos, end, first;
    uint64_t R, G;      /* MXFP4 */
    uint64_t bs, nbs;   /* bnb */
    bool dq;
    uint64_t prefer;    /* bnb: chunk ends on multiples of this when possible (no byte or block sent twice) */
    size_t es;          /* cast: input element size */
    bfs_cast_src cast;  /* cast: source type */
    uint64_t cap;       /* chunks of at most this many slot bytes (bfs__cu_prepare) */
} cu_job;

typedef struct cu_gather { /* nrows rows of row_bytes, stride apart in the source, packed at off */
    const uint8_t *src;
    uint64_t row_bytes, nrows, stride, off;
} cu_gather;

typedef struct cu_chunk {
    uint64_t pos, n;
    uint64_t base;      /* where in the slot its layout starts (several small jobs share one) */
    int job;            /* which of the pipeline's jobs */
    bool first;         /* the job's first chunk (its constant tables go up before it) */
    int ngather;
    cu_gather g[4];     /* GPTQ: qweight, scales, qzeros, g_idx */
    uint64_t in_bytes;  /* H2D [0, in_bytes) of the slot */
    uint64_t out_off, out_bytes;
    uint8_t *dst;       /* where the output goes in unit->out */
} cu_chunk;

/* What one slot holds at once: one chunk, or several small jobs whole (a batch's tiny pieces:
 * one H2D, their kernels, one D2H). */
#define CU_GROUP_MAX 16
typedef struct cu_group {
    cu_chunk ch[CU_GROUP_MAX];
    int n;
    uint64_t in_end;         /* H2D [0, in_end) of the slot */
    uint64_t out_lo, out_hi; /* the outputs lie in [out_lo, out_hi) of the slot */
    bool staged;             /* D2H into the staging, then copied out (not in place) */
} cu_group;

static inline uint64_t cu_al(uint64_t x) { return (x + CU_ALIGN - 1) / CU_ALIGN * CU_ALIGN; }

/* backend_cuda_q.c: the work of one unit, per format */
int bfs__cu_job_init(const cu_backend *b, const bfs_unit *u, cu_job *j);
uint64_t bfs__cu_layout(const cu_job *j, uint64_t pos, uint64_t n, cu_chunk *ch);
uint64_t bfs__cu_fp(const cu_job *j, uint64_t pos, uint64_t n);
int bfs__cu_choose(const cu_backend *b, const cu_job *j, uint64_t pos, uint64_t cap, uint64_t *n);
int bfs__cu_launch(const cu_job *j, const cu_chunk *ch, const cu_dev *d, uint8_t *ds);
const char *bfs__cu_what(const cu_job *j);

/* backend_cuda_dev.c: devices, contexts, probing */
int bfs__cu_enter(int id, int *prev);
void bfs__cu_leave(int prev);
bool bfs__cu_check_lost(cu_dev *d);
int bfs__cu_cc(int dev);
cudaError_t bfs__cu_why(cudaError_t e, char *why, size_t n);
int bfs__cu_parse_spec(const char *spec, int *ids, int *n);

/* backend_cuda_pipe.c: one unit's chunks (or a batch's, one job after the other, without a
 * pause between them) through one device; its gather helper thread */
int bfs__cu_pipeline(const cu_backend *b, cu_dev *d, cu_job *j, uint64_t cap);
int bfs__cu_pipeline_n(const cu_backend *b, cu_dev *d, cu_job *jobs, int nj);
int bfs__cu_gather_start(cu_dev *d);
void bfs__cu_gather_stop(cu_dev *d);
extern const float bfs__cu_nf4[16];

/* backend_cuda_selftest.c: the start-up self-test */
int bfs__cu_selftest(const cu_backend *b, cu_dev *d);
int bfs__cu_selftest_failed(const cu_dev *d, int rc);

/* Waits for every stream of d that exists (errors ignored: cleanup paths). */
static inline void cu_sync_streams(const cu_dev *d)
{
    const cudaStream_t s[3] = {d->s_up, d->s_comp, d->s_down};
    for (int i = 0; i < 3; i++)
        if (s[i])
            (void)cudaStreamSynchronize(s[i]);
}


#endif
