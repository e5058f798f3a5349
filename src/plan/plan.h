/* src/plan/ -- the planner (plan.c): output tensors grouped from the input by the format
 * table, then every output file laid out (header, offsets, size) before any data moves.
 * Uses src/formats, src/input, src/base. */
#ifndef BFS_PLAN_H
#define BFS_PLAN_H

#include "formats/tensor.h"

/* A tensor's piece in one output file. */
typedef struct bfs_piece {
    int tensor;         /* index into plan->t */
    uint64_t row0, row1;/* dim-0 rows [row0, row1) of the global tensor */
    uint64_t offset;    /* absolute file offset of the data */
    uint64_t nbytes;
} bfs_piece;

typedef struct bfs_outfile {
    char *name;         /* "shard-00001-model-00001-of-00001.safetensors" */
    uint64_t size;
    uint64_t data_start; /* 8 + the header's length (counted by the layout; the text: bfs__plan_header) */
    size_t npieces;
    bfs_piece *pieces;  /* in file order; NULL while a lazy plan holds none (bfs__plan_pieces) */
    uint64_t max_piece; /* its largest piece's bytes */
    uint64_t max_row;   /* the largest dim-0 row's bytes of a piece with rows */
} bfs_outfile;

typedef struct bfs_plan {
    int world_size;
    int layout;
    size_t nt;
    bfs_ltensor *t;     /* sorted by output name */
    int nfiles;
    bfs_outfile *files;
    uint64_t total_bytes; /* tensor bytes over all files */
    uint64_t max_row_bytes; /* largest single dim-0 row (smallest indivisible unit) */
    size_t ndropped;
    uint32_t *name_jlen;  /* the layout's cache: tensor i's name as JSON, [2i] bytes outside, [2i+1]
                           * inside a JSON string (DCP_SHARDING_INFO) */
    bool name_jlen_failed; /* no cache (out of memory): the layout counts each name */
    bool lazy;            /* set before the layout (convert, inspect): in the DCP layout a file's
                           * pieces are made when it is used and dropped after (bfs__plan_pieces),
                           * so that tensors x ranks of them are never held at once */
    uint64_t *dcp_n;      /* DCP: per tensor, the ranks holding rows of it (torch.chunk) */
    size_t *dcp_order;    /* DCP: the tensors in every rank file's order (bfs__file_order's) */
    size_t dcp_first_nd;  /* DCP: the first tensor (by name) with a dim 0 (nt: none) */
    bfs_ltensor *members; /* packed tensors' members (names.c), nmembers of them */
    size_t nmembers;
    const char *names_family; /* the target-name table's row applied (names.c), NULL: checkpoint names */
    size_t names_unmapped;    /* per-expert tensors left under checkpoint names (DCP will not
                               * load them into a transformers 5 model) */
    const char *names_target; /* "torchtitan" (--names torchtitan: checkpoint names), else NULL */
    uint64_t tt_E;            /* torchtitan: the experts of a layer (0: none per-expert) */
    size_t tt_experts;        /* torchtitan: per-expert tensors written whole on their owner's rank */
    const char **dropped; /* input tensors dropped (activation / KV-cache scales), by name
                           * (pointers into the input's headers), sorted */
} bfs_plan;


/* Group raw tensors into logical ones and validate them (quantization metadata). */
int bfs__plan_tensors(const bfs_input *in, const bfs_convert_opts *o, bfs_plan **out);
/* Target names (names.c): with mode BFS_NAMES_TRANSFORMERS, or BFS_NAMES_AUTO and the DCP
 * layout, and a model type in the table, rename p's tensors and pack per-expert ones as
 * transformers 5's state_dict has them; else count the per-expert tensors left
 * (p->names_unmapped). Before the plan sorts its tensors. */
int bfs__plan_names(bfs_plan *p, const char *model_type, int mode, int layout);
/* For tests: key as model_type's row of the table names it, into *out (malloc'd): renamed,
 * or the packed tensor's name when a pack takes it (*expert, *member: its place; *member
 * -1 when none does). The input unchanged for a model type not in the table. */
int bfs__names_key(const char *model_type, const char *key, char **out, uint64_t *expert, int *member);
/* The same with model_type's rules compiled once (bfs__nkeys_open), for a caller naming many
 * keys (the float32 rule over a plan's tensors). */
typedef struct bfs_nkeys bfs_nkeys;
int bfs__nkeys_open(const char *model_type, bfs_nkeys **out);
int bfs__nkeys_get(const bfs_nkeys *k, const char *key, char **out, uint64_t *expert, int *member);
void bfs__nkeys_free(bfs_nkeys *k);
/* --names torchtitan (names.c): checkpoint names; in the DCP layout with W <= E, each per-expert
 * tensor of model_type's torchtitan row written whole to its expert's owner (whole,
 * whole_rank); p->names_target, p->tt_E, p->tt_experts set. After bfs__plan_names. */
int bfs__plan_torchtitan(bfs_plan *p, const char *model_type, int world_size);
/* The rank that owns expert e of E under torchtitan's FSDP over W ranks (torch.chunk of dim 0),
 * or UINT64_MAX when W > E (every rank holds rows of every expert). */
uint64_t bfs__torchtitan_owner(uint64_t e, uint64_t E, uint64_t W);
/* For tests: 1 when key is a per-expert name of model_type's torchtitan row (*expert: its
 * number), else 0. */
int bfs__torchtitan_key(const char *model_type, const char *key, uint64_t *expert);
/* The table's row for a model type ("qwen2_moe" for deepseek_v3), or NULL. */
const char *bfs__names_family(const char *model_type);
/* Float tensors the model keeps in float32 (fp32.c): before bfs__plan_names, each cast or
 * copied tensor whose model name matches model_type's rule is written as stored (keep_fp32,
 * fp32_why, fp32_pat set). */
int bfs__plan_fp32(bfs_plan *p, const char *model_type, bool keep_dtype);
/* Whether model_type's model keeps checkpoint tensor `key` in float32: 1 (*why: the class and
 * file:line, *pat: the pattern), 0, or a negative error. */
int bfs__fp32_key(const char *model_type, const char *key, const char **why, const char **pat);
/* The plan's tensors written as stored for the model's float32 rule: their number, and one
 * line saying so and why into buf (the log, inspect). */
size_t bfs__fp32_summary(const bfs_plan *p, char *buf, size_t cap);
/* Lay out the output files for o->world_size / o->layout (headers, offsets). */
int bfs__plan_layout(bfs_plan *p, const bfs_convert_opts *o);
/* The same, for a part (DCP layout): only[r] rank files laid out in full; every other
 * file gets its name and no pieces, header, size or data_start (0; its data bytes are in
 * the plan's total): a part never reads them, and their pieces and headers counted were
 * most of its layout at scale (docs/SCALE-OUT.md). only NULL: all. */
int bfs__plan_layout_for(bfs_plan *p, const bfs_convert_opts *o, const bool *only);
void bfs__plan_free(bfs_plan *p);
/* File f's pieces, made again where a lazy plan dropped them: in the DCP layout every rank
 * file holds a slice of every tensor, so all files' pieces were tensors x W (DeepSeek-V3's
 * 46k output tensors at W = 256: 470 MB; W = 1024: 1.9 GB). The layout counts each file's
 * sizes and keeps none; convert makes a file's pieces when it writes (or re-hashes) it and
 * drops them with its slice index, inspect's walks one file at a time. 0 or BFS_ENOMEM;
 * BFS_EINTERNAL when they disagree with the layout's count. */
int bfs__plan_pieces(bfs_plan *p, int f);
/* A lazy plan's file f's pieces freed (npieces kept); nothing for other plans. */
void bfs__plan_pieces_drop(bfs_plan *p, int f);
/* File f's header length, counted (header.c; the layout's): 0, BFS_ENOMEM, or BFS_EINPUT
 * when it would pass safetensors readers' limit. */
int bfs__plan_header_len(bfs_plan *p, const bfs_outfile *f, uint64_t *hl);
/* File f's complete header bytes (length f->data_start - 8, space padded, NUL-terminated)
 * into *out (free it): built when needed, so that the plan holds no file's header text. */
int bfs__plan_header(const bfs_plan *p, const bfs_outfile *f, char **out);
/* The same text after its 8-byte length, i.e. the file's bytes [0, data_start) and a NUL,
 * into buf (cap > data_start), which the caller keeps (convert reuses one per file in flight). */
int bfs__plan_header_into(const bfs_plan *p, const bfs_outfile *f, char *buf, size_t cap);

/* Rows [*row0, *row1) of tensor t in rank r's file of W: FSDP2's Shard(0) / torch.chunk rule
 * (bfs__chunk_rows); a 0-d tensor on rank 0, one written whole (t->whole) on t->whole_rank. */
#define bfs__rank_rows(t, W, r, row0, row1)                                                        \
    do {                                                                                           \
        if ((t)->ndim == 0 || (t)->whole) {                                                        \
            *(row0) = 0;                                                                           \
            *(row1) = (uint64_t)(r) == ((t)->ndim == 0 ? 0 : (t)->whole_rank) ? ((t)->ndim == 0 ? 1 : (t)->d0) : 0; \
        } else {                                                                                   \
            bfs__chunk_rows((t)->d0, (W), (r), (row0), (row1));                                     \
        }                                                                                          \
    } while (0)

/* FSDP2 Shard(0) / torch.chunk rule: rows of rank r out of d0 for W ranks. */
static inline void bfs__chunk_rows(uint64_t d0, uint64_t W, uint64_t r, uint64_t *row0, uint64_t *row1)
{
    const uint64_t chunk = d0 == 0 ? 0 : (d0 + W - 1) / W;
    uint64_t a = r * chunk, b = (r + 1) * chunk;
    *row0 = a < d0 ? a : d0;
    *row1 = b < d0 ? b : d0;
}

#endif
