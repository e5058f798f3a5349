/*
 * The "refuse" row of the format table, which turns away tensors that look quantized
 * and that no format claimed (the claim itself is claim.c's). Every refusal is
 * BFS_EINPUT (exit 3), one line naming the file and the tensor, ending with what bfshard
 * converts (bfs_fctx.supported).
 *
 * The leftovers (this row, second to last, before passthrough), refused in name order:
 *   R1 FP8 data (F8_E4M3, F8_E5M2) or E8M0 scales (F8_E8M0): no format of the table left
 *      it unconverted;
 *   R2 a name only quantizers write (the last component): qweight, qzeros, g_idx,
 *      SCB, weight_format, W_q, weight_packed, weight_zero_point, weight_shape,
 *      weight_g_idx, weight_scale_inv, weight_global_scale, input_global_scale,
 *      weight_scale_2;
 *   R3 an integer tensor P.L beside a scale or zero companion: P.scales, P.scale,
 *      P.zeros, P.zero, P.qzeros, P.SCB, P.input_scale, P.L_scale, P.L_scales,
 *      P.L_scale_inv, P.L_zero_point, P.L_zero, P.L.scale, P.L.scales, P.L.absmax;
 *   R4 an integer "weight" (an nn.Linear or nn.Embedding weight is never integer
 *      unquantized) or an integer piece of one (P.weight.bitmask, P.weight.shape).
 * Every other integer tensor (position ids, masks, token type ids) passes through.
 */
#include "format.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* ---- the "refuse" row: leftovers that look quantized ------------------------------- */
static bool bfs__dt_int(bfs_dtype d)
{
    return d == BFS_DT_U8 || d == BFS_DT_I8 || d == BFS_DT_U16 || d == BFS_DT_I16 || d == BFS_DT_U32 ||
           d == BFS_DT_I32 || d == BFS_DT_U64 || d == BFS_DT_I64;
}

static bool bfs__dt_f8(bfs_dtype d) { return d == BFS_DT_F8_E4M3 || d == BFS_DT_F8_E5M2 || d == BFS_DT_F8_E8M0; }

/* R2: names only quantizers write, and whose. */
static const struct {
    const char *leaf, *what;
    bool convertible; /* a piece of a format of the table (issues 12, 38): stray here, not unknown */
} bfs__quant_leaves[] = {
    {"qweight", "GPTQ/AWQ packed weights", true},
    {"qzeros", "GPTQ/AWQ packed zero points", true},
    {"g_idx", "GPTQ group index", true},
    {"SCB", "bitsandbytes LLM.int8() scales", true},
    {"weight_format", "bitsandbytes LLM.int8() layout tag", true},
    {"W_q", "HQQ packed weights", false},
    {"weight_packed", "compressed-tensors packed weights", true},
    {"weight_zero_point", "compressed-tensors zero points", true},
    {"weight_shape", "compressed-tensors packed weight shape", true},
    {"weight_g_idx", "compressed-tensors act-order group index", false},
    {"weight_scale_inv", "block-FP8 scales", true},
    {"weight_global_scale", "NVFP4 global scale", true},
    {"input_global_scale", "NVFP4 activation global scale", true},
    {"weight_scale_2", "ModelOpt NVFP4 second-level scale", true},
};
/* R3: companions of an integer tensor P.L: "%P" is P + ".", "%L" is P.L. */
static const char *const bfs__companions[] = {
    "%Pscales", "%Pscale", "%Pzeros", "%Pzero", "%Pqzeros", "%PSCB", "%Pinput_scale", "%L_scale", "%L_scales",
    "%L_scale_inv", "%L_zero_point", "%L_zero", "%L.scale", "%L.scales", "%L.absmax",
};

/* The first companion of name (whose last '.' is at dot, or none) present in the input. */
static int bfs__companion(const bfs_input *in, const char *name, const char *dot, const bfs_raw **out)
{
    const size_t np = dot ? (size_t)(dot - name) + 1 : 0, nl = strlen(name);
    *out = NULL;
    for (size_t k = 0; k < sizeof bfs__companions / sizeof *bfs__companions && !*out; k++) {
        const char *pat = bfs__companions[k];
        const size_t head = pat[1] == 'P' ? np : nl, tail = strlen(pat + 2);
        char *cand = malloc(head + tail + 1);
        if (!cand)
            return bfs__err(BFS_ENOMEM, "out of memory");
        memcpy(cand, name, head);
        memcpy(cand + head, pat + 2, tail + 1);
        *out = bfs__input_find(in, cand);
        free(cand);
    }
    return 0;
}

static int bfs__refuse_leftover(const bfs_fctx *c, bfs_raw *r, bfs_ltensor *t)
{
    (void)t;
    const char *nm = r->st->name;
    const bfs_dtype dt = r->st->dtype;
    const char *dot = strrchr(nm, '.'), *leaf = dot ? dot + 1 : nm;
    const bfs_raw *comp = NULL;
    char why[256];
    why[0] = '\0';
    if (bfs__dt_f8(dt))
        snprintf(why, sizeof why, "%s data (FP8-quantized, or FP8 scales) that no supported format claims; it would not come out BF16",
                 bfs__dtype_name(dt));
    for (size_t k = 0; !why[0] && k < sizeof bfs__quant_leaves / sizeof *bfs__quant_leaves; k++)
        if (strcmp(leaf, bfs__quant_leaves[k].leaf) == 0)
            snprintf(why, sizeof why,
                     bfs__quant_leaves[k].convertible
                         ? "\"%s\" is %s without the tensors or the quantization_config claim it belongs with"
                         : "\"%s\" is %s, a quantization format bfshard does not support",
                     leaf, bfs__quant_leaves[k].what);
    if (!why[0] && bfs__dt_int(dt)) {
        const int rc = bfs__companion(c->in, nm, dot, &comp);
        if (rc < 0)
            return rc;
        if (comp)
            snprintf(why, sizeof why, "%s data beside the scale/zero tensor \"%s\" looks quantized, in a format bfshard does not support",
                     bfs__dtype_name(dt), comp->st->name);
        else if (strcmp(leaf, "weight") == 0 || strstr(nm, ".weight.") || strncmp(nm, "weight.", 7) == 0)
            snprintf(why, sizeof why, "an integer (%s) weight looks quantized, in a format bfshard does not support",
                     bfs__dtype_name(dt));
    }
    if (!why[0])
        return 0;
    return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): %s (bfshard converts: %s)", bfs__raw_path(c->in, r), nm,
                    (unsigned long long)r->file_offset, why, c->supported);
}

const bfs_format bfs__format_refuse = {
    .name = "refuse",
    .kinds = 0,
    .leftover = bfs__refuse_leftover,
};
