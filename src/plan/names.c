/*
 * Target names: the output tensors under the names and in the shapes that transformers 5's
 * model classes have in their state_dict, so that DCP (which reads names as they are) loads
 * them with no glue. transformers applies its checkpoint conversion mapping inside
 * from_pretrained (transformers/conversion_mapping.py, applied by core_model_loading.py's
 * rename_source_key): renames, then at most one converter per key. The converters used by
 * MoE models stack per-expert Linears into one 3-D parameter (MergeModulelist(dim=0)) and
 * put gate before up (Concatenate(dim=1)). Here that is a plan step: renames rewrite a
 * name; a pack makes one output tensor whose rows are its members' rows, each member still
 * one logical tensor dequantized straight into its place (tensor.h, bfs__ucur_next).
 *
 * The table below is data: per model type, upstream's own patterns copied verbatim, in
 * upstream order (docs/NAMES.md lists each with its upstream file:line; `make interop`
 * compares every row with get_checkpoint_conversion_mapping of the installed transformers).
 * The patterns are Python regular expressions, of which upstream's rows use a small part,
 * matched here with upstream's semantics (bfs__rx_*): literal characters and `\.`, `.` (any
 * character), `^`, the expert wildcard `*.` (rewritten to `.*\.` as upstream does), and the
 * name boundary `(?!\w)` upstream appends to a pattern that ends in a letter or digit.
 * A row using anything else is refused when the table is read (BFS_EINTERNAL).
 */
#include "plan/plan.h"
#include "formats/format.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the table ------------------------------------------------------------------------ */
typedef enum { BFS_NR_RENAME, BFS_NR_PACK } bfs_nr_op;

typedef struct bfs_nrule {
    bfs_nr_op op;
    const char *src[2]; /* upstream source_patterns (a pack: one per member of an expert) */
    const char *dst;    /* upstream target_patterns[0] */
    const char *ops;    /* a pack's operations, as upstream names them */
} bfs_nrule;

#define BFS_REN(s, d) {BFS_NR_RENAME, {s, NULL}, d, NULL}
#define BFS_PACK2(a, b, d) {BFS_NR_PACK, {a, b}, d, "MergeModulelist(dim=0), Concatenate(dim=1)"}
#define BFS_PACK1(a, d) {BFS_NR_PACK, {a, NULL}, d, "MergeModulelist(dim=0)"}
#define BFS_NR_END {BFS_NR_RENAME, {NULL, NULL}, NULL, NULL}

/* "qwen2_moe" (conversion_mapping.py: "qwen2_moe") */
static const bfs_nrule bfs__nr_qwen2_moe[] = {
    BFS_PACK2("mlp.experts.*.gate_proj.weight", "mlp.experts.*.up_proj.weight", "mlp.experts.gate_up_proj"),
    BFS_PACK1("mlp.experts.*.down_proj.weight", "mlp.experts.down_proj"),
    BFS_NR_END,
};
static const bfs_nrule bfs__nr_ernie[] = {
    BFS_REN("mlp.moe_statics.e_score_correction_bias", "mlp.gate.moe_statics.e_score_correction_bias"),
    BFS_NR_END,
};
static const bfs_nrule bfs__nr_exaone[] = {
    BFS_REN("mlp.e_score_correction_bias", "mlp.gate.e_score_correction_bias"),
    BFS_NR_END,
};
/* "mixtral" */
static const bfs_nrule bfs__nr_mixtral[] = {
    BFS_REN(".block_sparse_moe.", ".mlp."),
    BFS_PACK2(".experts.*.w1.weight", ".experts.*.w3.weight", ".experts.gate_up_proj"),
    BFS_PACK1(".experts.*.w2.weight", ".experts.down_proj"),
    BFS_NR_END,
};
static const bfs_nrule bfs__nr_minimax_m2[] = {
    BFS_REN(".block_sparse_moe.e_score_correction_bias", ".mlp.e_score_correction_bias"),
    BFS_NR_END,
};
/* "deepseek_v4" */
static const bfs_nrule bfs__nr_dsv4[] = {
    BFS_REN("\\.attn\\.", ".self_attn."),
    BFS_REN("\\.ffn\\.", ".mlp."),
    BFS_REN("\\.indexer\\.compressor\\.", "\\.compressor\\.indexer\\."),
    BFS_REN("^embed\\.weight", "embed_tokens.weight"),
    BFS_REN("^head\\.weight", "lm_head.weight"),
    BFS_REN("^hc_head_fn", "hc_head.hc_fn"),
    BFS_REN("^hc_head_base", "hc_head.hc_base"),
    BFS_REN("^hc_head_scale", "hc_head.hc_scale"),
    BFS_REN("\\.attn_norm\\.", ".input_layernorm."),
    BFS_REN("\\.ffn_norm\\.", ".post_attention_layernorm."),
    BFS_REN("\\.hc_attn_fn", ".attn_hc.fn"),
    BFS_REN("\\.hc_attn_base", ".attn_hc.base"),
    BFS_REN("\\.hc_attn_scale", ".attn_hc.scale"),
    BFS_REN("\\.hc_ffn_fn", ".ffn_hc.fn"),
    BFS_REN("\\.hc_ffn_base", ".ffn_hc.base"),
    BFS_REN("\\.hc_ffn_scale", ".ffn_hc.scale"),
    BFS_REN("\\.attn_sink", ".sinks"),
    BFS_REN("\\.indexer\\.weights_proj\\.", "\\.compressor\\.indexer\\.scorer\\.weights_proj\\."),
    BFS_REN("\\.indexer\\.wq_b\\.", "\\.compressor\\.indexer\\.q_b_proj\\."),
    BFS_REN("\\.norm\\.", "\\.kv_norm\\."),
    BFS_REN("\\.ape", "\\.position_bias"),
    BFS_REN("\\.wq_a\\.", ".q_a_proj."),
    BFS_REN("\\.self_attn\\.wq_b\\.", "\\.self_attn\\.q_b_proj\\."),
    BFS_REN("\\.wkv\\.", ".kv_proj."),
    BFS_REN("\\.wgate\\.", ".gate_proj."),
    BFS_REN("\\.wo_a\\.", ".o_a_proj."),
    BFS_REN("\\.wo_b\\.", ".o_b_proj."),
    BFS_REN("\\.q_norm\\.", ".q_a_norm."),
    BFS_REN("\\.gate\\.bias", ".gate.e_score_correction_bias"),
    BFS_REN("\\.shared_experts\\.w1\\.", ".shared_experts.gate_proj."),
    BFS_REN("\\.shared_experts\\.w2\\.", ".shared_experts.down_proj."),
    BFS_REN("\\.shared_experts\\.w3\\.", ".shared_experts.up_proj."),
    BFS_PACK2("\\.experts.*.w1.weight", "\\.experts.*.w3.weight", "\\.experts.gate_up_proj"),
    BFS_PACK1("\\.experts.*.w2.weight", "\\.experts.down_proj"),
    BFS_NR_END,
};

/* DeepSeek-V4's checkpoints name the base model's tensors without its prefix;
 * from_pretrained adds base_model_prefix ("model.") to a renamed key that the model has
 * only under it (core_model_loading.py rename_source_key). Here: to keys under these roots. */
static const char *const bfs__dsv4_roots[] = {"layers.", "embed_tokens.", "norm.", "hc_head.", NULL};

/* Tensors the model registers as buffers (the router's correction bias, DeepSeek-V4's hash
 * routing table), by the end of their target name: FSDP2 shards parameters only, so every
 * rank needs these whole; they go to rank 0's file whole, as 0-d tensors do, and every rank
 * reads them from there (tensor.h, bfs_ltensor.whole). `make interop` compares them with
 * the model's buffers. */
static const char *const bfs__buf_router[] = {".e_score_correction_bias", NULL};
static const char *const bfs__buf_dsv4[] = {".e_score_correction_bias", ".tid2eid", NULL};

typedef struct bfs_nfamily {
    const char *name;           /* the table's row, transformers' mapping key it follows */
    const char *const *types;   /* config.json model_type values */
    const bfs_nrule *rules[2];  /* applied as one list, in order (the second: upstream's +=) */
    const char *prefix;         /* added to names under roots[] (NULL: none) */
    const char *const *roots;
    const char *const *buffers; /* the model's buffers, by name suffix */
} bfs_nfamily;

static const char *const bfs__t_qwen2_moe[] = {
    "qwen2_moe", "qwen3_moe", "qwen3_next", "deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe",
    "glm4_moe_lite", "glm_moe_dsa", "glm4v_moe", "olmoe", "dots1", "hunyuan_v1_moe", "flex_olmo",
    "longcat_flash", "afmoe", "cohere2_moe", "solar_open", "mellum", "beam", "qwen3_omni_moe", NULL};
static const char *const bfs__t_ernie[] = {"ernie4_5_moe", NULL};
static const char *const bfs__t_exaone[] = {"exaone_moe", NULL};
static const char *const bfs__t_mixtral[] = {"mixtral", "minimax", NULL};
static const char *const bfs__t_minimax_m2[] = {"minimax_m2", NULL};
static const char *const bfs__t_dsv4[] = {"deepseek_v4", NULL};

static const bfs_nfamily bfs__nfamilies[] = {
    {"qwen2_moe", bfs__t_qwen2_moe, {bfs__nr_qwen2_moe, NULL}, NULL, NULL, bfs__buf_router},
    {"ernie4_5_moe", bfs__t_ernie, {bfs__nr_qwen2_moe, bfs__nr_ernie}, NULL, NULL, bfs__buf_router},
    {"exaone_moe", bfs__t_exaone, {bfs__nr_qwen2_moe, bfs__nr_exaone}, NULL, NULL, bfs__buf_router},
    {"mixtral", bfs__t_mixtral, {bfs__nr_mixtral, NULL}, NULL, NULL, bfs__buf_router},
    {"minimax_m2", bfs__t_minimax_m2, {bfs__nr_mixtral, bfs__nr_minimax_m2}, NULL, NULL, bfs__buf_router},
    {"deepseek_v4", bfs__t_dsv4, {bfs__nr_dsv4, NULL}, "model.", bfs__dsv4_roots, bfs__buf_dsv4},
    {NULL, NULL, {NULL, NULL}, NULL, NULL, NULL},
};

/* ---- torchtitan: checkpoint names, each expert in the file of the rank that owns it ------
 * torchtitan's CheckpointManager (checkpoint.initial_load_in_hf) asks DCP for the Hub's
 * per-expert names (its adapters' from_hf_map), one expert at a time, and packs them itself.
 * With expert parallelism off its FSDP shards the E experts of a layer over the W ranks:
 * Shard(0) (whole experts, torch.chunk: rank r owns experts [r*c, (r+1)*c), c = ceil(E/W))
 * when W <= E, Shard(1) (every expert's rows over all ranks, as --names checkpoint writes
 * them) when W > E (torchtitan 0.3.0 distributed/fsdp.py:230). Its adapter asks each rank
 * for the experts it owns (models/utils.py:164, which refuses W not dividing E: 0.3.0 loads
 * nothing then). So when W <= E each per-expert tensor is written whole to its owner's file.
 * The rows are data: per model type, the per-expert names of the adapter torchtitan uses for
 * it, verbatim ("{}": a layer or expert number); dev/names_table.py torchtitan compares them
 * with the installed torchtitan's adapters. */
typedef struct bfs_ttrow {
    const char *const *types;  /* config.json model_type values */
    const char *adapter;       /* the adapter's from_hf_map, torchtitan 0.3.0 file:line */
    const char *experts[4];    /* its per-expert keys, NULL-terminated */
    const char *shard;         /* where its FSDP picks Shard(0) or Shard(1) for the experts */
    const char *split;         /* where its adapter gives each rank its experts (W | E only) */
} bfs_ttrow;

#define BFS_TT_SHARD "torchtitan/distributed/fsdp.py:230"
#define BFS_TT_SPLIT "torchtitan/models/utils.py:164"

static const char *const bfs__tt_qwen3[] = {"qwen3_moe", NULL};
static const char *const bfs__tt_dsv3[] = {"deepseek_v3", "kimi_k2", NULL};
static const bfs_ttrow bfs__tt_rows[] = {
    {bfs__tt_qwen3, "torchtitan/models/qwen3/state_dict_adapter.py:48",
     {"model.layers.{}.mlp.experts.{}.gate_proj.weight", "model.layers.{}.mlp.experts.{}.up_proj.weight",
      "model.layers.{}.mlp.experts.{}.down_proj.weight", NULL},
     BFS_TT_SHARD, BFS_TT_SPLIT},
    {bfs__tt_dsv3, "torchtitan/models/deepseek_v3/state_dict_adapter.py:46",
     {"model.layers.{}.mlp.experts.{}.gate_proj.weight", "model.layers.{}.mlp.experts.{}.up_proj.weight",
      "model.layers.{}.mlp.experts.{}.down_proj.weight", NULL},
     BFS_TT_SHARD, BFS_TT_SPLIT},
    {NULL, NULL, {NULL}, NULL, NULL},
};

/* name against a key with "{}" for a decimal number (at most 9 digits): the second number
 * (the expert) into *expert */
static bool bfs__tt_match(const char *pat, const char *name, uint64_t *expert)
{
    int k = 0;
    while (*pat) {
        if (pat[0] == '{' && pat[1] == '}') {
            uint64_t v = 0;
            int n = 0;
            for (; *name >= '0' && *name <= '9'; name++, n++)
                v = v * 10 + (uint64_t)(*name - '0');
            if (n == 0 || n > 9)
                return false;
            if (k++ == 1)
                *expert = v;
            pat += 2;
        } else if (*pat++ != *name++) {
            return false;
        }
    }
    return *name == '\0' && k == 2;
}

static const bfs_ttrow *bfs__tt_row_of(const char *model_type)
{
    for (const bfs_ttrow *r = bfs__tt_rows; model_type && r->types; r++)
        for (const char *const *t = r->types; *t; t++)
            if (strcmp(*t, model_type) == 0)
                return r;
    return NULL;
}

static bool bfs__tt_expert(const bfs_ttrow *row, const bfs_ltensor *t, uint64_t *e)
{
    for (int j = 0; row && t->ndim > 0 && row->experts[j]; j++)
        if (bfs__tt_match(row->experts[j], t->name, e))
            return true;
    return false;
}

/* Model types whose experts torchtitan 0.3.0's HF load cannot fill: --names torchtitan refuses
 * them, since the model would start from its initial experts with no error from torchtitan.
 * gpt_oss: the adapter maps the experts to inner_experts.mlp1_weight, mlp1_bias, mlp2_weight,
 * mlp2_bias, the model's parameters are mlp1_weight_EGD, mlp1_bias_EG, mlp2_weight_EDF,
 * mlp2_bias_ED, and its to_hf passes over names it does not map. dev/names_table.py torchtitan
 * reads both lines, so a torchtitan that fixes it is noticed. */
typedef struct bfs_ttrefused {
    const char *type;    /* config.json model_type */
    const char *adapter; /* where the adapter names the experts */
    const char *model;   /* where the model names its parameters */
} bfs_ttrefused;

static const bfs_ttrefused bfs__tt_refused[] = {
    {"gpt_oss", "torchtitan/models/gpt_oss/state_dict_adapter.py:37", "torchtitan/models/gpt_oss/moe.py:90"},
    {NULL, NULL, NULL},
};

uint64_t bfs__torchtitan_owner(uint64_t e, uint64_t E, uint64_t W)
{
    const uint64_t per = (E + W - 1) / W; /* FSDP2's torch.chunk of dim 0 */
    return W > E ? UINT64_MAX : e / per;
}

int bfs__torchtitan_key(const char *model_type, const char *key, uint64_t *expert)
{
    const bfs_ttrow *row = bfs__tt_row_of(model_type);
    for (int j = 0; row && row->experts[j]; j++)
        if (bfs__tt_match(row->experts[j], key, expert))
            return 1;
    return 0;
}

int bfs__plan_torchtitan(bfs_plan *p, const char *model_type, int world_size)
{
    const bfs_ttrow *row = bfs__tt_row_of(model_type);
    const uint64_t W = world_size > 0 ? (uint64_t)world_size : 1;
    uint64_t E = 0, e = 0;
    p->names_target = "torchtitan";
    p->tt_experts = 0;
    for (const bfs_ttrefused *x = bfs__tt_refused; model_type && x->type; x++)
        if (strcmp(x->type, model_type) == 0)
            return bfs__err(BFS_EUSAGE, "--names torchtitan: torchtitan 0.3.0 cannot load %s's experts from a Hugging Face "
                            "checkpoint (its adapter, %s, maps them to parameters its model does not have, %s), so "
                            "the model would keep its initial experts; use --names checkpoint or transformers for "
                            "another loader", model_type, x->adapter, x->model);
    for (size_t i = 0; row && i < p->nt; i++)
        if (bfs__tt_expert(row, &p->t[i], &e) && e + 1 > E)
            E = e + 1;
    p->tt_E = E;
    if (E == 0 || W > E) /* Shard(1): every expert's rows by torch.chunk, as written already */
        return 0;
    for (size_t i = 0; i < p->nt; i++)
        if (bfs__tt_expert(row, &p->t[i], &e)) {
            p->t[i].whole = true;
            p->t[i].whole_rank = (uint32_t)bfs__torchtitan_owner(e, E, W);
            p->t[i].whole_why = "its expert's owner under torchtitan's FSDP, " BFS_TT_SHARD;
            p->tt_experts++;
        }
    return 0;
}

/* ---- upstream's patterns ---------------------------------------------------------------- */
#define BFS_RX_MAX 160
enum { BFS_RX_LIT, BFS_RX_ANY, BFS_RX_STAR };

typedef struct bfs_rx {
    unsigned char kind[BFS_RX_MAX];
    char lit[BFS_RX_MAX];
    int n;
    bool anchor;   /* ^ */
    bool boundary; /* (?!\w) after the match */
    size_t order;  /* its length as upstream sorts alternatives: longest first */
} bfs_rx;

static bool bfs__is_word(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* src as WeightTransform.__init__ compiles it: "*." -> ".*\.", then (?!\w) when it ends in
 * a letter or digit. 0, or BFS_EINTERNAL for a construct outside the subset. */
static int bfs__rx_compile(const char *src, bfs_rx *rx)
{
    char buf[2 * BFS_RX_MAX];
    size_t k = 0;
    memset(rx, 0, sizeof *rx);
    rx->order = strlen(src);
    for (const char *s = src; *s && k + 4 < sizeof buf; s++) {
        if (s[0] == '*' && s[1] == '.') {
            memcpy(buf + k, ".*\\.", 4);
            k += 4;
            s++;
        } else {
            buf[k++] = *s;
        }
    }
    buf[k] = '\0';
    if (k == 0 || k + 4 >= sizeof buf)
        return bfs__err(BFS_EINTERNAL, "name rule \"%s\": empty or too long", src);
    const char last = buf[k - 1];
    rx->boundary = (last >= 'a' && last <= 'z') || (last >= 'A' && last <= 'Z') || (last >= '0' && last <= '9');
    const char *s = buf;
    if (*s == '^') {
        rx->anchor = true;
        s++;
    }
    for (; *s; s++) {
        if (rx->n == BFS_RX_MAX)
            return bfs__err(BFS_EINTERNAL, "name rule \"%s\": too long", src);
        if (s[0] == '\\' && s[1] && !bfs__is_word(s[1])) {
            rx->kind[rx->n] = BFS_RX_LIT;
            rx->lit[rx->n++] = *++s;
        } else if (s[0] == '.' && s[1] == '*') {
            rx->kind[rx->n++] = BFS_RX_STAR;
            s++;
        } else if (s[0] == '.') {
            rx->kind[rx->n++] = BFS_RX_ANY;
        } else if (strchr("\\^$*+?()[]{}|", s[0])) {
            return bfs__err(BFS_EINTERNAL, "name rule \"%s\": '%c' is outside the patterns bfshard reads", src, s[0]);
        } else {
            rx->kind[rx->n] = BFS_RX_LIT;
            rx->lit[rx->n++] = *s;
        }
    }
    return 0;
}

/* rx[k..] matches s from i (backtracking, `.*` greedy): *end past the match, star[0..1] what
 * the last `.*` took */
static bool bfs__rx_at(const bfs_rx *rx, int k, const char *s, size_t i, size_t len, size_t *end, size_t star[2])
{
    for (; k < rx->n; k++) {
        if (rx->kind[k] == BFS_RX_STAR) {
            size_t j = i;
            while (j < len && s[j] != '\n')
                j++;
            for (;; j--) { /* longest first */
                if (bfs__rx_at(rx, k + 1, s, j, len, end, star)) {
                    star[0] = i;
                    star[1] = j;
                    return true;
                }
                if (j == i)
                    return false;
            }
        }
        if (i >= len || (rx->kind[k] == BFS_RX_LIT ? s[i] != rx->lit[k] : s[i] == '\n'))
            return false;
        i++;
    }
    if (rx->boundary && i < len && bfs__is_word(s[i]))
        return false;
    *end = i;
    return true;
}

/* re.search over the alternatives rx[0..n) (already in upstream's order): the leftmost start
 * where one matches, the first alternative there. Returns its index, or -1. */
static int bfs__rx_search(const bfs_rx *const *rx, int n, const char *s, size_t *m0, size_t *m1, size_t star[2])
{
    const size_t len = strlen(s);
    for (size_t i = 0; i <= len; i++)
        for (int a = 0; a < n; a++) {
            if (rx[a]->anchor && i > 0)
                continue;
            if (bfs__rx_at(rx[a], 0, s, i, len, m1, star)) {
                *m0 = i;
                return a;
            }
        }
    return -1;
}

/* The replacement text of a target pattern: process_target_pattern's "^" and "\." removed. */
static void bfs__rx_target(const char *dst, char *out, size_t cap)
{
    size_t k = 0;
    if (*dst == '^')
        dst++;
    for (; *dst && k + 1 < cap; dst++) {
        if (dst[0] == '\\' && dst[1] == '.')
            dst++;
        out[k++] = *dst;
    }
    out[k] = '\0';
}

/* key with the first occurrence of its bytes [m0, m1) replaced by rep (str.replace(.., 1)),
 * malloc'd; NULL when out of memory */
static char *bfs__replace_first(const char *key, size_t m0, size_t m1, const char *rep)
{
    const size_t n = m1 - m0, len = strlen(key), nr = strlen(rep);
    const char *at = key + m0;
    for (const char *p = key; p + n <= key + len; p++)
        if (memcmp(p, key + m0, n) == 0) {
            at = p;
            break;
        }
    char *o = malloc(len - n + nr + 1);
    if (!o)
        return NULL;
    const size_t pre = (size_t)(at - key);
    memcpy(o, key, pre);
    memcpy(o + pre, rep, nr);
    memcpy(o + pre + nr, at + n, len - pre - n + 1);
    return o;
}

/* ---- the family of a model type ---------------------------------------------------------- */
static const bfs_nfamily *bfs__nfamily_of(const char *model_type)
{
    for (const bfs_nfamily *f = bfs__nfamilies; model_type && f->name; f++)
        for (const char *const *t = f->types; *t; t++)
            if (strcmp(*t, model_type) == 0)
                return f;
    return NULL;
}

/* A family's rules compiled: renames and packs in their order. */
typedef struct bfs_ncomp {
    const bfs_nrule *r[80];
    bfs_rx rx[80][2];
    const bfs_rx *alt[80][2]; /* a pack's alternatives, longest first (upstream's order) */
    int nalt[80], n;
} bfs_ncomp;

static int bfs__ncomp(const bfs_nfamily *f, bfs_ncomp *c)
{
    c->n = 0;
    for (int l = 0; l < 2 && f->rules[l]; l++)
        for (const bfs_nrule *r = f->rules[l]; r->dst; r++) {
            if (c->n == (int)(sizeof c->r / sizeof *c->r))
                return bfs__err(BFS_EINTERNAL, "name rules of %s: too many", f->name);
            const int k = c->n++;
            c->r[k] = r;
            c->nalt[k] = r->src[1] ? 2 : 1;
            for (int j = 0; j < c->nalt[k]; j++) {
                const int rc = bfs__rx_compile(r->src[j], &c->rx[k][j]);
                if (rc < 0)
                    return rc;
            }
            const bool swap = c->nalt[k] == 2 && c->rx[k][1].order > c->rx[k][0].order; /* stable */
            c->alt[k][0] = &c->rx[k][swap ? 1 : 0];
            c->alt[k][1] = &c->rx[k][swap ? 0 : 1];
        }
    return 0;
}

/* ---- the pass ---------------------------------------------------------------------------- */
typedef struct bfs_nmatch {
    char *target;  /* the packed tensor's name */
    size_t t;      /* index into p->t */
    uint64_t e;    /* expert */
    int j;         /* member of the expert (source pattern) */
    int rule;      /* index into the compiled rules */
} bfs_nmatch;

static int bfs__cmp_nmatch(const void *a, const void *b)
{
    const bfs_nmatch *x = a, *y = b;
    const int c = strcmp(x->target, y->target);
    if (c)
        return c;
    if (x->e != y->e)
        return x->e < y->e ? -1 : 1;
    return x->j - y->j;
}

/* Rename *name by every rename in order (each at most once, as apply_renamings), then the
 * base model's prefix (*rule set when any applied); then the first pack that matches
 * records m (*matched). */
static int bfs__name_one(const bfs_nfamily *f, const bfs_ncomp *c, char **name, const char **rule, bfs_nmatch *m,
                         bool *matched)
{
    char rep[256];
    *matched = false;
    for (int k = 0; k < c->n; k++) {
        if (c->r[k]->op != BFS_NR_RENAME)
            continue;
        size_t m0, m1, star[2];
        const bfs_rx *alt[1] = {c->alt[k][0]};
        if (bfs__rx_search(alt, 1, *name, &m0, &m1, star) < 0)
            continue;
        bfs__rx_target(c->r[k]->dst, rep, sizeof rep);
        char *nn = bfs__replace_first(*name, m0, m1, rep);
        if (!nn)
            return bfs__err(BFS_ENOMEM, "out of memory");
        free(*name);
        *name = nn;
        *rule = f->name;
    }
    for (const char *const *root = f->roots; root && *root; root++)
        if (strncmp(*name, *root, strlen(*root)) == 0) {
            char *nn = bfs__str_cat2(f->prefix, *name);
            if (!nn)
                return bfs__err(BFS_ENOMEM, "out of memory");
            free(*name);
            *name = nn;
            *rule = f->name;
            break;
        }
    for (int k = 0; k < c->n; k++) { /* at most one converter (apply_converters) */
        if (c->r[k]->op != BFS_NR_PACK)
            continue;
        size_t m0, m1, star[2] = {0, 0};
        const int a = bfs__rx_search(c->alt[k], c->nalt[k], *name, &m0, &m1, star);
        if (a < 0)
            continue;
        bfs__rx_target(c->r[k]->dst, rep, sizeof rep);
        const int j = c->alt[k][a] == &c->rx[k][0] ? 0 : 1;
        uint64_t e = 0;
        bool num = star[1] > star[0] && star[1] - star[0] <= 9;
        for (size_t i = star[0]; num && i < star[1]; i++)
            num = (*name)[i] >= '0' && (*name)[i] <= '9';
        for (size_t i = star[0]; num && i < star[1]; i++)
            e = e * 10 + (uint64_t)((*name)[i] - '0');
        if (!num)
            return bfs__err(BFS_EINPUT, "tensor \"%s\": transformers packs it into \"%s\" by expert, but \"%.*s\" is not an expert number",
                            *name, rep, (int)(star[1] - star[0]), *name + star[0]);
        if (!(m->target = bfs__replace_first(*name, m0, m1, rep)))
            return bfs__err(BFS_ENOMEM, "out of memory");
        m->e = e;
        m->j = j;
        m->rule = k;
        *matched = true;
        return 0;
    }
    return 0;
}

struct bfs_nkeys {
    const bfs_nfamily *f; /* NULL: a model type not in the table (names unchanged) */
    bfs_ncomp c;
};

int bfs__nkeys_open(const char *model_type, bfs_nkeys **out)
{
    bfs_nkeys *k = malloc(sizeof *k);
    *out = NULL;
    if (!k)
        return bfs__err(BFS_ENOMEM, "out of memory");
    k->f = bfs__nfamily_of(model_type);
    const int rc = k->f ? bfs__ncomp(k->f, &k->c) : 0;
    if (rc < 0) {
        free(k);
        return rc;
    }
    *out = k;
    return 0;
}

void bfs__nkeys_free(bfs_nkeys *k)
{
    free(k);
}

int bfs__nkeys_get(const bfs_nkeys *k, const char *key, char **out, uint64_t *expert, int *member)
{
    bfs_nmatch m = {0};
    bool hit = false;
    const char *rule = NULL;
    char *name = bfs__strdup(key);
    int rc = !name ? bfs__err(BFS_ENOMEM, "out of memory") : 0;
    if (rc == 0 && k->f)
        rc = bfs__name_one(k->f, &k->c, &name, &rule, &m, &hit);
    *expert = hit ? m.e : 0;
    *member = hit ? m.j : -1;
    if (rc < 0 || hit) {
        free(name);
        name = m.target;
    }
    *out = rc < 0 ? NULL : name;
    return rc;
}

int bfs__names_key(const char *model_type, const char *key, char **out, uint64_t *expert, int *member)
{
    bfs_nkeys *k = NULL;
    int rc = bfs__nkeys_open(model_type, &k);
    *out = NULL;
    if (rc == 0)
        rc = bfs__nkeys_get(k, key, out, expert, member);
    bfs__nkeys_free(k);
    return rc;
}

/* One pack: matches g[0..n) (sorted by expert, then member) of one target become a packed
 * tensor *pt whose members are mem[0..n), moved there from p->t. */
static int bfs__pack_one(const bfs_plan *p, const bfs_ncomp *c, const bfs_nmatch *g, size_t n,
                         bfs_ltensor *mem, bfs_ltensor *pt)
{
    const int J = c->nalt[g[0].rule];
    const bfs_ltensor *m0 = &p->t[g[0].t];
    const uint64_t E = g[n - 1].e + 1;
    char shp[128], shp0[128];
    for (size_t i = 0; i < (size_t)E * (size_t)J; i++) { /* experts 0..E-1, each member once */
        const uint64_t we = i / (size_t)J;
        const int wj = (int)(i % (size_t)J);
        if (i < n && g[i].e == we && g[i].j == wj)
            continue;
        const bool twice = i < n && i > 0 && g[i].e == g[i - 1].e && g[i].j == g[i - 1].j;
        return bfs__err(BFS_EINPUT, "tensor \"%s\": transformers packs experts 0..%llu into \"%s\", but expert %llu's \"%s\" is %s",
                        p->t[g[i < n ? i : n - 1].t].name, (unsigned long long)(E - 1), g[0].target,
                        (unsigned long long)(twice ? g[i].e : we), c->r[g[0].rule]->src[twice ? g[i].j : wj],
                        twice ? "there twice" : "missing");
    }
    for (size_t i = 0; i < n; i++) {
        const bfs_ltensor *t = &p->t[g[i].t];
        if (t->ndim < 1 || t->ndim != m0->ndim || t->out_dtype != m0->out_dtype ||
            memcmp(t->shape, m0->shape, sizeof t->shape[0] * (size_t)t->ndim) != 0 || t->ndim + 1 > BFS_MAX_DIMS) {
            bfs__shape_str(t->shape, t->ndim, shp, sizeof shp);
            bfs__shape_str(m0->shape, m0->ndim, shp0, sizeof shp0);
            return bfs__err(BFS_EINPUT, "tensor \"%s\" (%s %s) cannot be packed into \"%s\" with \"%s\" (%s %s): shapes or dtypes differ",
                            t->name, bfs__dtype_name(t->out_dtype), shp, g[0].target, m0->name,
                            bfs__dtype_name(m0->out_dtype), shp0);
        }
        mem[i] = *t;
    }
    *pt = mem[0];
    pt->name = g[0].target;
    pt->ndim = mem[0].ndim + 1;
    pt->shape[0] = E;
    pt->shape[1] = (uint64_t)J * mem[0].shape[0];
    for (int d = 1; d < mem[0].ndim; d++)
        pt->shape[d + 1] = mem[0].shape[d];
    bfs__finish_shape(pt);
    pt->members = mem;
    pt->npack = (uint32_t)J;
    pt->rule = c->r[g[0].rule]->ops;
    pt->keep_fp32 = false;
    pt->nsrc = 0; /* its sources are its members' (bfs__part) */
    memset(pt->src, 0, sizeof pt->src);
    return 0;
}

const char *bfs__names_family(const char *model_type)
{
    const bfs_nfamily *f = bfs__nfamily_of(model_type);
    return f ? f->name : NULL;
}

int bfs__plan_names(bfs_plan *p, const char *model_type, int mode, int layout)
{
    int rc = 0;
    bfs_ncomp *c = NULL;
    bfs_nmatch *m = NULL;
    bool *gone = NULL;
    bfs_ltensor *out = NULL;
    size_t nm = 0, nout = 0;
    const bfs_nfamily *f = bfs__nfamily_of(model_type);
    const bool want = mode == BFS_NAMES_TRANSFORMERS || (mode == BFS_NAMES_AUTO && layout == BFS_LAYOUT_DCP);
    p->names_family = NULL;
    p->names_unmapped = 0;
    if (mode == BFS_NAMES_TORCHTITAN) /* checkpoint names, torchtitan's own (bfs__plan_torchtitan) */
        return 0;
    if (!want || !f) {
        /* per-expert tensors left under checkpoint names in the DCP layout: transformers 5
         * packs them on load, so DCP will not find them (for the log, inspect, the manifest) */
        for (size_t i = 0; layout == BFS_LAYOUT_DCP && i < p->nt; i++) {
            const char *x = strstr(p->t[i].name, ".experts.");
            if (x && x[9] >= '0' && x[9] <= '9')
                p->names_unmapped++;
        }
        return 0;
    }
    p->names_family = f->name;
    if (!(c = malloc(sizeof *c)) || !(m = calloc(p->nt + 1, sizeof *m)) || !(gone = calloc(p->nt + 1, sizeof *gone)))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__ncomp(f, c));
    for (size_t i = 0; i < p->nt; i++) {
        bool hit = false;
        BFS_TRY(bfs__name_one(f, c, &p->t[i].name, &p->t[i].rule, &m[nm], &hit));
        if (hit)
            m[nm++].t = i;
        for (const char *const *b = f->buffers; !hit && p->t[i].ndim > 0 && b && *b; b++)
            if (bfs__str_ends(p->t[i].name, *b)) {
                p->t[i].whole = true;
                p->t[i].rule = f->name;
            }
    }
    if (nm == 0)
        goto cleanup;
    qsort(m, nm, sizeof *m, bfs__cmp_nmatch);
    if (!(p->members = malloc(nm * sizeof *p->members)))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    if (!(out = malloc((p->nt + 1) * sizeof *out)))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (size_t a = 0, b; a < nm; a = b) {
        for (b = a + 1; b < nm && strcmp(m[b].target, m[a].target) == 0; b++)
            ;
        BFS_TRY(bfs__pack_one(p, c, &m[a], b - a, &p->members[a], &out[nout]));
        m[a].target = NULL; /* the packed tensor's name now */
        nout++;
        for (size_t k = a; k < b; k++)
            gone[m[k].t] = true;
    }
    /* the members' names move with them to p->members; the rest keep their order (the
     * plan sorts them) and the packed tensors follow */
    size_t kept = 0;
    for (size_t i = 0; i < p->nt; i++)
        if (!gone[i])
            p->t[kept++] = p->t[i];
    memcpy(p->t + kept, out, nout * sizeof *out);
    p->nt = kept + nout;
    p->nmembers = nm;
    nout = 0;
cleanup:
    for (size_t k = 0; k < nout; k++) /* a pack failed: the members' names are still p->t's */
        free((char *)out[k].name);
    free(out);
    for (size_t k = 0; m && k < nm; k++)
        free(m[k].target);
    free(m);
    free(c);
    free(gone);
    return rc;
}
