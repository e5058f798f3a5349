/*
 * Tensors the model keeps in float32: transformers 5 loads a model in bf16 but keeps the
 * modules named by its class's `_keep_in_fp32_modules_strict` in float32 (modeling_utils.py
 * _get_dtype_plan), so a released checkpoint's F32 router bias, DeepSeek-V4's hyper-connection
 * parameters, sinks and norms reach the model unrounded. bfshard writes such a tensor as it is
 * stored (an F32 one stays F32, never rounded to BF16); every other float tensor is cast to
 * BF16 as before (`--keep-dtype` keeps them all).
 *
 * The table below is data: per model type, upstream's patterns verbatim, with the class and
 * file:line they come from (transformers 5.23; docs/NAMES.md lists every model type bfshard
 * recognises and what each keeps; `make interop` compares each row with the installed
 * transformers, dev/names_table.py fp32). Upstream matches them as core_model_loading.py does
 * (build_glob_alternation + .search): against the model's own name of the tensor (after its
 * checkpoint conversion mapping: bfs__nkeys_get), anywhere in it, `.` matching any character
 * and `*` any run. Whatever --names writes, the rule is decided on the model's name.
 */
#include "plan/plan.h"
#include "formats/format.h"

#include <stdlib.h>
#include <string.h>

typedef struct bfs_f32row {
    const char *const *types;  /* config.json model_type values */
    const char *why;           /* the class and where upstream says it (for the log, inspect, the manifest) */
    const char *const *pats;   /* _keep_in_fp32_modules_strict, verbatim */
} bfs_f32row;

static const char *const bfs__p_router[] = {"e_score_correction_bias", NULL};
static const char *const bfs__p_beam[] = {"e_score_correction_bias", "mlp.gate.weight", NULL};
static const char *const bfs__p_ernie[] = {"gate.weight", "moe_statics", NULL};
static const char *const bfs__p_dsv4[] = {"attn_hc", "ffn_hc", "hc_head", "sinks", "position_bias",
                                          "e_score_correction_bias", "q_a_norm", "kv_norm",
                                          "input_layernorm", "post_attention_layernorm", "norm", NULL};

#define BFS_T(...) (const char *const[]){__VA_ARGS__, NULL}
static const bfs_f32row bfs__f32rows[] = {
    {BFS_T("deepseek_v3"), "DeepseekV3PreTrainedModel (models/deepseek_v3/modeling_deepseek_v3.py:550)", bfs__p_router},
    /* Kimi-K2 ships model_type kimi_k2 with architectures DeepseekV3ForCausalLM and DeepSeek-V3's
     * layout; transformers 5.23 has no kimi_k2 class: the DeepSeek-V3 class's rule */
    {BFS_T("kimi_k2"), "DeepseekV3PreTrainedModel (models/deepseek_v3/modeling_deepseek_v3.py:550; Kimi-K2 is DeepseekV3ForCausalLM)", bfs__p_router},
    {BFS_T("deepseek_v32"), "DeepseekV32PreTrainedModel (models/deepseek_v32/modeling_deepseek_v32.py:662)", bfs__p_router},
    {BFS_T("glm4_moe"), "Glm4MoePreTrainedModel (models/glm4_moe/modeling_glm4_moe.py:459)", bfs__p_router},
    {BFS_T("glm4_moe_lite"), "Glm4MoeLitePreTrainedModel (models/glm4_moe_lite/modeling_glm4_moe_lite.py:561)", bfs__p_router},
    {BFS_T("glm_moe_dsa"), "GlmMoeDsaPreTrainedModel (models/glm_moe_dsa/modeling_glm_moe_dsa.py:636)", bfs__p_router},
    {BFS_T("glm4v_moe"), "Glm4vMoePreTrainedModel (models/glm4v_moe/modeling_glm4v_moe.py:473)", bfs__p_router},
    {BFS_T("dots1"), "Dots1PreTrainedModel (models/dots1/modeling_dots1.py:441)", bfs__p_router},
    {BFS_T("solar_open"), "SolarOpenPreTrainedModel (models/solar_open/modeling_solar_open.py:381)", bfs__p_router},
    {BFS_T("exaone_moe"), "ExaoneMoePreTrainedModel (models/exaone_moe/modeling_exaone_moe.py:394)", bfs__p_router},
    {BFS_T("hy_v3"), "HYV3PreTrainedModel (models/hy_v3/modeling_hy_v3.py:429)", bfs__p_router},
    {BFS_T("mimo_v2_flash"), "MiMoV2FlashPreTrainedModel (models/mimo_v2_flash/modeling_mimo_v2_flash.py:469)", bfs__p_router},
    {BFS_T("beam"), "BeamPreTrainedModel (models/beam/modeling_beam.py:469)", bfs__p_beam},
    {BFS_T("ernie4_5_moe"), "Ernie4_5_MoePreTrainedModel (models/ernie4_5_moe/modeling_ernie4_5_moe.py:460)", bfs__p_ernie},
    {BFS_T("deepseek_v4"), "DeepseekV4PreTrainedModel (models/deepseek_v4/modeling_deepseek_v4.py:1242)", bfs__p_dsv4},
    {NULL, NULL, NULL},
};

static const bfs_f32row *bfs__f32row_of(const char *model_type)
{
    for (const bfs_f32row *r = bfs__f32rows; model_type && r->types; r++)
        for (const char *const *t = r->types; *t; t++)
            if (strcmp(*t, model_type) == 0)
                return r;
    return NULL;
}

/* pat (upstream's glob: `.` any character, `*` any run, the rest literal) matches s from i */
static bool bfs__glob_at(const char *pat, const char *s)
{
    for (; *pat; pat++, s++) {
        if (*pat == '*') {
            for (const char *t = s + strlen(s);; t--) { /* longest first, as `.*` */
                if (bfs__glob_at(pat + 1, t))
                    return true;
                if (t == s)
                    return false;
            }
        }
        if (!*s || (*pat != '.' && *pat != *s))
            return false;
    }
    return true;
}

/* re.search(pat, s) for the patterns of the table */
static bool bfs__glob_search(const char *pat, const char *s)
{
    for (const char *p = s;; p++) {
        if (bfs__glob_at(pat, p))
            return true;
        if (!*p)
            return false;
    }
}

/* Every pattern of the table within the subset bfs__glob_at reads (`.` `*` and word characters) */
static int bfs__f32_table_ok(void)
{
    for (const bfs_f32row *r = bfs__f32rows; r->types; r++)
        for (const char *const *p = r->pats; *p; p++)
            for (const char *c = *p; *c; c++)
                if (!(*c == '.' || *c == '*' || *c == '_' || (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                      (*c >= '0' && *c <= '9')))
                    return bfs__err(BFS_EINTERNAL, "float32 rule \"%s\": '%c' is outside the patterns bfshard reads", *p, *c);
    return 0;
}

/* row r's first pattern found in the model's name of checkpoint key `key`: 1 (*why, *pat set), 0,
 * or a negative error */
static int bfs__f32_match(const bfs_f32row *r, const bfs_nkeys *names, const char *key, const char **why,
                          const char **pat)
{
    char *name = NULL;
    uint64_t e;
    int member;
    const int rc = bfs__nkeys_get(names, key, &name, &e, &member);
    *why = *pat = NULL;
    if (rc < 0)
        return rc;
    for (const char *const *p = r->pats; *p && !*pat; p++)
        if (bfs__glob_search(*p, name)) {
            *why = r->why;
            *pat = *p;
        }
    free(name);
    return *pat != NULL;
}

int bfs__fp32_key(const char *model_type, const char *key, const char **why, const char **pat)
{
    const bfs_f32row *r = bfs__f32row_of(model_type);
    *why = *pat = NULL;
    if (!r)
        return 0;
    bfs_nkeys *names = NULL;
    int rc = bfs__f32_table_ok();
    if (rc == 0)
        rc = bfs__nkeys_open(model_type, &names);
    if (rc == 0)
        rc = bfs__f32_match(r, names, key, why, pat);
    bfs__nkeys_free(names);
    return rc;
}

int bfs__plan_fp32(bfs_plan *p, const char *model_type, bool keep_dtype)
{
    const bfs_f32row *r = bfs__f32row_of(model_type);
    bfs_nkeys *names = NULL; /* the model's name rules, compiled once for the plan */
    if (!r)
        return 0;
    int rc = bfs__f32_table_ok();
    if (rc == 0)
        rc = bfs__nkeys_open(model_type, &names);
    for (size_t i = 0; rc == 0 && i < p->nt; i++) {
        bfs_ltensor *t = &p->t[i];
        /* only a float tensor no format dequantizes: a quantized one is dequantized to BF16 as
         * upstream's loader makes it */
        if (t->kind != BFS_K_CAST && t->kind != BFS_K_PASS)
            continue;
        if (t->src_dtype != BFS_DT_F32 && t->src_dtype != BFS_DT_F16 && t->src_dtype != BFS_DT_F64 &&
            t->src_dtype != BFS_DT_BF16)
            continue;
        const char *why, *pat;
        const int hit = bfs__f32_match(r, names, t->name, &why, &pat);
        if (hit <= 0) {
            rc = hit;
            continue;
        }
        t->keep_fp32 = true;
        t->fp32_why = why;
        t->fp32_pat = pat;
        if (t->kind == BFS_K_CAST) { /* as stored: the model casts an F16/F64 one itself, exactly as from this file */
            t->kind = BFS_K_PASS;
            t->out_dtype = t->src_dtype;
        }
        t->transform = keep_dtype ? "copy (the model keeps it in float32; --keep-dtype)"
                                  : "copy (the model keeps it in float32)";
    }
    bfs__nkeys_free(names);
    return rc;
}

size_t bfs__fp32_summary(const bfs_plan *p, char *buf, size_t cap)
{
    size_t n = 0, n32 = 0, k = 0;
    const char *why = NULL, *pats[16];
    size_t np = 0;
    for (size_t i = 0; i < p->nt; i++) {
        const bfs_ltensor *t = &p->t[i];
        if (!t->keep_fp32)
            continue;
        n++;
        n32 += t->out_dtype == BFS_DT_F32;
        why = t->fp32_why;
        size_t j = 0;
        while (j < np && strcmp(pats[j], t->fp32_pat) != 0)
            j++;
        if (j == np && np < sizeof pats / sizeof *pats)
            pats[np++] = t->fp32_pat;
    }
    if (!n || !cap)
        return n;
    k = (size_t)snprintf(buf, cap, "%zu tensor(s) written as stored (%zu F32), not rounded to BF16: the model keeps them in float32 "
                         "(%s, _keep_in_fp32_modules_strict:", n, n32, why);
    for (size_t j = 0; j < np && k < cap; j++)
        k += (size_t)snprintf(buf + k, cap - k, "%s \"%s\"", j ? "," : "", pats[j]);
    if (k < cap)
        snprintf(buf + k, cap - k, ")");
    return n;
}
