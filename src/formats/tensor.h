/* The logical tensor: what a format makes of one or more input tensors (its kind, output
 * shape and dtype, its sources and the kernel descriptor), and a unit (rows of one), as the
 * formats (src/formats/), the planner, the backends and the writer all see them. The
 * dispatch on a tensor's format (bfs__kind_name, bfs__kind_action, bfs__unit_sources) is
 * src/formats/table.c's. Uses src/input, src/base and the kernels' descriptors. */
#ifndef BFS_TENSOR_H
#define BFS_TENSOR_H

#include "input/input.h"
#include "../../kernels/bfs_kernels.h"

typedef enum bfs_kind {
    BFS_K_PASS = 0, BFS_K_CAST, BFS_K_MXFP4, BFS_K_BNB4,
    BFS_K_FP8,   /* FP8 E4M3 + scale grid (src/formats/fp8.c) */
    BFS_K_INT4,  /* compressed-tensors pack-quantized INT4 (src/formats/int4.c) */
    BFS_K_NVFP4, /* NVFP4, compressed-tensors or ModelOpt (src/formats/nvfp4.c) */
    BFS_K_CTMX,  /* compressed-tensors MXFP8 / MXFP4, E8M0 scales (src/formats/ctmx.c) */
    BFS_K_WOQ,   /* GPTQ, AWQ, bitsandbytes 8-bit (src/formats/gptq.c, awq.c, bnb8.c) */
} bfs_kind;

typedef struct bfs_ltensor {
    char *name;        /* output name */
    bfs_kind kind;
    bfs_dtype out_dtype;
    int ndim;
    int nsrc;
    uint64_t shape[BFS_MAX_DIMS];
    uint64_t row_elems; /* product of shape[1..] (1 for 0-d and 1-d) */
    uint64_t d0;        /* shape[0], or 1 for 0-d */
    const bfs_raw *src[6]; /* source tensors; see nsrc */
    const char *transform; /* "mxfp4->bf16 transpose(1,2)", "nf4->bf16", "cast f32->bf16", "copy" */
    bfs_dtype src_dtype;  /* PASS/CAST: input dtype; BNB4: the blob's dtype */
    const char *qname;    /* FP8/INT4/NVFP4/CTMX/WOQ: the name inspect and the manifest give it (static) */
    const struct bfs_format *by; /* the format whose claim made it (pass 1; NULL for leftovers) */
    /* the model keeps it in float32 (src/plan/fp32.c): written as stored, never rounded;
     * fp32_why: the class and upstream file:line, fp32_pat: its pattern that matched (static) */
    bool keep_fp32;
    const char *fp32_why, *fp32_pat;
    /* A packed tensor (transformers 5's fused experts, src/plan/names.c): dim 0 is E experts,
     * and expert e's rows are those of members[e * npack + j], j = 0 .. npack-1, one after
     * the other (gate then up). Each member is a logical tensor of its own format, all of one
     * shape; a unit is always one member's rows, dequantized straight into its place
     * (bfs__ucur_next), so no kernel sees the packed tensor itself. NULL: not packed. */
    const struct bfs_ltensor *members;
    uint32_t npack;
    const char *rule;     /* the naming rule that made the name, for the manifest (static); NULL: none */
    bool whole;           /* written whole to one rank's file (whole_rank), like a 0-d tensor to rank 0:
                           * a buffer of the model, which FSDP2 does not shard (rank 0), or a
                           * whole expert on the rank that owns it (--names torchtitan); src/plan/names.c */
    uint32_t whole_rank;
    const char *whole_why; /* the manifest's reason (static); NULL: a buffer of the model */
    /* kind-specific: one kind's members only (a plan holds one of these per tensor; the
     * plan zeroes the entry before each format's claim) */
    union {
        struct {
            bfs_mxfp4_desc mx;  /* MXFP4: blocks/scales pointers, R, G, transpose */
            int mx_items;       /* 1: dim 0 is items (4-d blocks); 0: dim 0 is rows R (3-d blocks) */
        };
        struct {
            bfs_bnb4_desc bnb;  /* BNB4 */
            char quant_type[8]; /* "nf4" / "fp4" */
            bool double_quant;
        };
        bfs_fp8_desc fp8;     /* FP8 */
        bfs_int4_desc int4;   /* INT4 */
        bfs_nvfp4_desc nv;    /* NVFP4 */
        bfs_ctmx_desc ctmx;   /* CTMX */
        bfs_woq_desc woq;     /* WOQ */
    };
} bfs_ltensor;


const char *bfs__kind_name(const bfs_ltensor *t); /* "mxfp4", "bnb-nf4", "bnb-nf4-dq", "passthrough" */
/* What convert does to t: "dequantized", "cast" or "copied" (inspect, the manifest);
 * an input tensor in plan->dropped is "dropped". */
const char *bfs__kind_action(const bfs_ltensor *t);


/* A unit: rows [row0, row1) of logical tensor t, to be written as out_dtype
 * bytes into out (row-major, (row1-row0) * row_elems elements). */
typedef struct bfs_unit {
    const bfs_ltensor *t;
    uint64_t row0, row1;
    void *out;
} bfs_unit;


/* ---- units of a piece: one member of a packed tensor at a time ---------------------------- */
/* The rows units are cut in per dim-0 row of t: 1, or a packed tensor's members' rows. */
static inline uint64_t bfs__sub_rows(const bfs_ltensor *t)
{
    return t->members ? (uint64_t)t->npack * t->members[0].d0 : 1;
}

/* The bytes of one such row: what a unit's size and the ring's smallest buffer count in. */
static inline uint64_t bfs__sub_row_bytes(const bfs_ltensor *t)
{
    const bfs_ltensor *m = t->members ? &t->members[0] : t;
    return m->row_elems * bfs__dtype_size(m->out_dtype);
}

/* A cursor over rows [row0, row1) of t, cut into units (bfs__ucur_next). */
typedef struct bfs_ucur {
    const bfs_ltensor *t;
    uint64_t row0, row1; /* the piece, in t's rows */
    uint64_t pos, end;   /* sub-rows left: [pos, end) */
} bfs_ucur;

static inline bfs_ucur bfs__ucur(const bfs_ltensor *t, uint64_t row0, uint64_t row1)
{
    const uint64_t k = bfs__sub_rows(t);
    return (bfs_ucur){.t = t, .row0 = row0, .row1 = row1, .pos = row0 * k, .end = row1 * k};
}

/* The next unit of at most max rows of the tensor its kernel reads (t, or one member of a
 * packed t: a unit never spans two members); false when none is left. *a, *b: the piece's
 * rows in that tensor's own rows, for bfs__unit_hash_blocks (a member lies whole in one
 * piece: rank pieces of a packed tensor are whole experts). */
static inline bool bfs__ucur_next(bfs_ucur *c, uint64_t max, bfs_unit *u, uint64_t *a, uint64_t *b)
{
    if (c->pos >= c->end || max == 0)
        return false;
    uint64_t n = c->end - c->pos < max ? c->end - c->pos : max;
    if (!c->t->members) {
        *u = (bfs_unit){.t = c->t, .row0 = c->pos, .row1 = c->pos + n};
        *a = c->row0;
        *b = c->row1;
    } else {
        const uint64_t md = c->t->members[0].d0, m = c->pos / md, r = c->pos % md;
        n = n < md - r ? n : md - r;
        *u = (bfs_unit){.t = &c->t->members[m], .row0 = r, .row1 = r + n};
        *a = 0;
        *b = md;
    }
    c->pos += n;
    return true;
}

/* The next span of c, at most max of its sub-rows (one buffer's worth; a packed tensor's
 * span may hold several members' units), as a cursor of its own; false when none is left. */
static inline bool bfs__ucur_span(bfs_ucur *c, uint64_t max, bfs_ucur *span)
{
    if (c->pos >= c->end || max == 0)
        return false;
    *span = *c;
    span->end = c->end - c->pos < max ? c->end : c->pos + max;
    c->pos = span->end;
    return true;
}

/* The logical tensors whose sources t reads: t itself, or a packed tensor's members
 * (part i of bfs__nparts(t)). */
static inline size_t bfs__nparts(const bfs_ltensor *t) { return t->members ? (size_t)t->d0 * t->npack : 1; }
static inline const bfs_ltensor *bfs__part(const bfs_ltensor *t, size_t i) { return t->members ? &t->members[i] : t; }

/* The kernels' cast source of a CAST tensor's dtype (F32, F16; anything else is F64). */
static inline bfs_cast_src bfs__cast_src(bfs_dtype d)
{
    return d == BFS_DT_F32 ? BFS_CAST_F32 : d == BFS_DT_F16 ? BFS_CAST_F16 : BFS_CAST_F64;
}

#endif
