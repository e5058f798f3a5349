/*
 * The format interface: one bfs_format per way the input can store a weight
 * (MXFP4, bitsandbytes 4-bit, plain/cast, ...), one file per format in
 * src/formats/, and the table src/formats/table.c that the planner tries in
 * order. Adding a format is: its file here, its kernels, its row in the table.
 *
 * Who calls what: plan.c runs the two grouping passes over the table; convert.c
 * asks bfs__unit_sources() which input bytes a unit reads; inspect and the
 * manifest name a tensor's format with bfs__kind_name(). Nothing here calls back
 * into plan.c, convert.c or the backends.
 */
#ifndef BFS_FORMAT_H
#define BFS_FORMAT_H

#include "formats/tensor.h"

struct json_t;

struct bfs_format;
/* compressed-tensors' module -> config group matching (src/formats/ctmatch.c) */
typedef struct bfs_ctmatch bfs_ctmatch;

/* What a format may look at while it plans: the input, the options, the input's
 * config.json parsed (NULL when the input has none) and the input's quantization
 * claim (src/formats/refuse.c: config.json's "quantization_config", else
 * quantize_config.json), with the format that owns the claimed quant_method.
 * Read-only; owned by the planner. */
typedef struct bfs_fctx {
    const bfs_input *in;
    const bfs_convert_opts *o;
    const struct json_t *config;    /* config.json (an object), or NULL */
    const struct json_t *qconfig;   /* the claim (an object), or NULL when none (absent or null) */
    const char *qsource;            /* the file the claim is in, for messages; NULL when none */
    const char *method;             /* the claimed quant_method as written; NULL when none */
    const struct bfs_format *claim; /* the format whose .methods lists it; NULL when none */
    char supported[1024];           /* what bfshard converts, for refusals (bfs__supported_list) */
    const bfs_ctmatch *ctm;         /* quant_method "compressed-tensors": its targets and ignore, compiled */
} bfs_fctx;

/* Input bytes one unit reads: bfs_srange (input/input.h). */

/* The most source ranges any format returns for one unit: size the out array of
 * bfs__unit_sources() with it. */
#define BFS_UNIT_MAX_SRC 4

/* Bit of a bfs_kind in bfs_format.kinds. */
#define BFS_KIND_BIT(k) (1u << (unsigned)(k))

typedef struct bfs_format {
    const char *name;   /* short, for messages and tests: "mxfp4", "bnb4", "passthrough" */
    unsigned kinds;     /* BFS_KIND_BIT() of every bfs_kind this format plans */
    /* BFS_KIND_BIT() of kinds it also plans but another row owns (that row's sources and
     * kind_name serve them; the planner records the claimer in t->by): dsv4.c's FP8 and MX */
    unsigned borrows;
    /* The quant_method values (quantization_config.quant_method, compared ignoring
     * ASCII case) this format converts, NULL-terminated; NULL for a format that
     * no config claims (passthrough). A claimed method that no format of the table
     * lists is refused (refuse.c): adding a format adds its methods here. */
    const char *const *methods;
    /* What it converts, as a refusal's "supported:" list shows it: "bitsandbytes
     * 4-bit (nf4, fp4)". NULL: not listed. */
    const char *supports;
    /* Its tensor layout in a few words, for "config claims X but no tensor is in
     * X's layout": "X_blocks + X_scales". */
    const char *layout;
    /* true: its tensors identify it alone, so it converts them without a config
     * claim too; false: its tensors are refused unless the config claims it. */
    bool claim_optional;
    /* Before any tensor is looked at (may be NULL): called once per plan, formats
     * in table order, after the claim is resolved (c->method, c->claim). A format
     * checks the fields of a claim it owns (c->claim == itself) and refuses (< 0,
     * a message naming the method and field) a variant it cannot convert; 0
     * otherwise. */
    int (*detect)(const bfs_fctx *c);
    /* Pass 1 (may be NULL): called for every raw tensor of the input in name order
     * (also one an earlier group took as a source), formats in table order, until
     * one returns non-zero. 1: r anchors a group of this format -- t is filled
     * (name malloc'd, shape finished with bfs__finish_shape) and every source,
     * r included, is marked used; 0: not this format's, t untouched; < 0: an
     * error (message set). */
    int (*claim)(const bfs_fctx *c, bfs_raw *r, bfs_ltensor *t);
    /* Pass 2 (may be NULL): called for every raw tensor no group used, formats in
     * table order, until one returns non-zero. < 0: r looks like a piece of this
     * format that lost its group (an error naming it); 1: the format takes r alone
     * (t filled, r marked used); 2: the format drops r (no output tensor, t untouched,
     * r marked used; the plan lists it as dropped); 0: not this format's. The last
     * format of the table takes whatever is left. */
    int (*leftover)(const bfs_fctx *c, bfs_raw *r, bfs_ltensor *t);
    /* The input ranges unit u reads (u->t is of one of this format's kinds);
     * returns how many were written to out (at most BFS_UNIT_MAX_SRC). */
    int (*sources)(const bfs_unit *u, bfs_srange out[BFS_UNIT_MAX_SRC]);
    /* The name inspect and the manifest give t: "mxfp4", "bnb-nf4-dq", "cast". */
    const char *(*kind_name)(const bfs_ltensor *t);
} bfs_format;

/* The table (src/formats/table.c), NULL-terminated, tried in order; the last
 * entry takes every leftover tensor. */
extern const bfs_format *const bfs__formats[];

/* ---- what the input claims and what it looks like (src/formats/refuse.c) ---------- */
/* What bfs__quant_claim allocated for c's lifetime: free with bfs__qclaim_free. */
typedef struct bfs_qclaim {
    struct json_t *file; /* quantize_config.json parsed, or NULL */
    char *source;        /* c->qsource */
    bfs_ctmatch *ctm;    /* c->ctm */
} bfs_qclaim;
/* Resolves c->qconfig / c->qsource / c->method / c->claim from c->config and
 * quantize_config.json; < 0 (BFS_EINPUT) refuses a claim no format of the table
 * converts. own is filled even on failure. */
int bfs__quant_claim(bfs_fctx *c, bfs_qclaim *own);
void bfs__qclaim_free(bfs_qclaim *own);
/* After pass 1 (t[0..nt) the groups formats claimed): < 0 when the claimed
 * format took no tensor, or a quantized format the config does not claim took
 * one. */
int bfs__quant_check_groups(const bfs_fctx *c, const bfs_ltensor *t, size_t nt);
/* "mxfp4 (gpt-oss), bitsandbytes 4-bit (nf4, fp4)": the .supports of the table. */
void bfs__supported_list(char *buf, size_t cap);

/* The format that plans kind k (NULL for a kind no format declares). */
const bfs_format *bfs__format_of(bfs_kind k);

/* The input ranges unit u reads, for prefetch and release; returns their number. */
int bfs__unit_sources(const bfs_unit *u, bfs_srange out[BFS_UNIT_MAX_SRC]);
/* The source hashes' blocks (src/input/srchash.c): unit u of the piece of rows [a, b) of
 * its tensor (one rank's; hf: [0, d0)) reads s[] (bfs__unit_sources), and the rank hashes
 * blk[i] of s[i].r: from where the ranges of rows [0, a) end (0 for a = 0) to where those
 * of rows [0, b) end, or to the tensor's end for b = d0; empty for a = b. Returns their
 * number, or < 0 (BFS_EINTERNAL) for a format whose ranges do not grow with the rows. */
int bfs__unit_hash_blocks(const bfs_unit *u, uint64_t a, uint64_t b, bfs_srange s[BFS_UNIT_MAX_SRC],
                          bfs_srange blk[BFS_UNIT_MAX_SRC]);
/* read[r - raw0] = true for every raw tensor r that units of t[0..nt) read (tensors with
 * rows); the others (quant state, shapes, dropped scales) only the planner reads. */
void bfs__sources_read(const bfs_ltensor *t, size_t nt, const bfs_raw *raw0, bool *read);

/* ---- compressed-tensors config groups (src/formats/ctmatch.c) -------------------------- */
/* The claim's config_groups targets and ignore list, compiled (claim.c makes and frees it). */
int bfs__ctmatch_new(const bfs_fctx *c, bfs_ctmatch **out);
void bfs__ctmatch_free(bfs_ctmatch *m);
/* The config group (index in config_groups, file order) that compressed-tensors gives module
 * `module`, whose quantized weight is r; < 0 (BFS_EINPUT, naming r and the module) when the
 * ignore list names it, no group targets it, or the answer depends on a module class. */
int bfs__ct_module_group(const bfs_fctx *c, const bfs_raw *r, const char *module, size_t *k);
/* The same for the module of weight tensor r (its name up to the last dot: "P" of
 * "P.weight", "P.weight_packed"). */
int bfs__ct_group_of(const bfs_fctx *c, const bfs_raw *r, size_t *k);
/* compressed-tensors' match_name(name, target): 1 or 0; -1 (message set) for a "re:"
 * pattern bfshard cannot translate. For tests (fixtures/ct-match-vectors.json). */
int bfs__ct_target_matches(const char *target, const char *name);
/* Every config group's targets match some module of the input; < 0 naming the first that
 * matches none. */
int bfs__ct_groups_used(const bfs_fctx *c);

/* ---- helpers for format files (src/formats/common.c) ---------------------------- */
bool bfs__str_ends(const char *s, const char *suffix);
char *bfs__str_cat2(const char *a, const char *b);       /* malloc'd a + b, NULL when out of memory */
char *bfs__str_ndup(const char *s, size_t n);            /* malloc'd first n bytes of s */
const char *bfs__raw_path(const bfs_input *in, const bfs_raw *r); /* r's file, for messages */
void bfs__shape_str(const uint64_t *shape, int ndim, char *buf, size_t cap); /* "[2, 3]" */
/* t->d0 and t->row_elems from t->ndim and t->shape. */
void bfs__finish_shape(bfs_ltensor *t);

/* The claim (c->qconfig): its quant_method as written (c->method, NULL when none);
 * whether it is method (ASCII case ignored); a string or an integer member of o
 * (NULL / -1 when absent or of another type). */
const char *bfs__qc_method(const bfs_fctx *c);
bool bfs__qc_is(const bfs_fctx *c, const char *method);
const char *bfs__qc_str(const struct json_t *o, const char *key);
/* quant_method is one of the FP8 / INT4 / NVFP4 ones ("fp8", "compressed-tensors", "modelopt"). */
bool bfs__qc_is_scaled(const bfs_fctx *c);
int64_t bfs__qc_int(const struct json_t *o, const char *key);
/* compressed-tensors: the config groups in file order, one per call (start with *it NULL;
 * stop at NULL, past the last group): the group's "weights" object (json null when it has
 * none), *format its format (the group's, else the top level's, else ""). Linear in the
 * groups: a group found by its index from the first, per group, made a config.json of
 * 32000 groups take a minute per weight (found by fuzz_claim). */
const struct json_t *bfs__ct_group_next(const bfs_fctx *c, void **it, const char **format);
/* Config group k alone (bfs__ct_group_next's answer for it; NULL past the last group), for
 * a module whose group is already known (bfs__ct_group_of): linear in k, once per module. */
const struct json_t *bfs__ct_group_weights(const bfs_fctx *c, size_t k, const char **format);
/* The raw tensor named base + suffix, or NULL (*rc < 0 only when out of memory). */
bfs_raw *bfs__sibling(const bfs_input *in, const char *base, const char *suffix, int *rc);
/* The same, of raw tensor w (in in->raw) and its own name: the names that extend w's
 * follow it in raw[]'s order, so it is looked for there first. */
bfs_raw *bfs__sibling_of(const bfs_input *in, const bfs_raw *w, const char *suffix, int *rc);
uint64_t bfs__raw_nelem(const bfs_raw *r);
/* r has ndim dims, and shape[0] == d0 (ndim >= 1), shape[1] == d1 (ndim >= 2). */
bool bfs__raw_shape_is(const bfs_raw *r, int ndim, uint64_t d0, uint64_t d1);

#endif
