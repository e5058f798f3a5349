/*
 * What the FP8, INT4 and NVFP4 formats leave over (docs/FORMATS.md 6.0), after fp8, int4 and nvfp4
 * had their turn in the table, before refuse.c:
 *   - activation and KV-cache scales (P.input_scale, P.input_global_scale,
 *     P.input_zero_point, P.output_scale, P.k_scale, P.v_scale) of a checkpoint whose
 *     quant_method is "fp8", "compressed-tensors" or "modelopt": no meaning in a BF16
 *     model, dropped
 *     (the plan lists them; the manifest and inspect show them as dropped); and under
 *     quant_method "fp8" also P.activation_scale (transformers' static per-tensor FP8:
 *     FP8Linear.activation_scale, consumed by Fp8Dequantize, docs/FORMATS.md 7.1) and
 *     P.X_proj_activation_scale (FP8Experts' static [E] scales of its fused X_proj, 7.8);
 *   - under such a claim, a P.weight_scale that no weight used: an error naming it
 *     (the other stray pieces -- weight_scale_inv, weight_packed, weight_scale_2, ... --
 *     are refused by the next row, refuse.c).
 * Plans no kind of its own.
 */
#include "format.h"

#include <string.h>

static const char *const bfs__dropped_suffixes[] = {
    ".input_scale", ".input_global_scale", ".input_zero_point", ".output_scale", ".k_scale", ".v_scale",
};

static int bfs__qextra_leftover(const bfs_fctx *c, bfs_raw *r, bfs_ltensor *t)
{
    const char *nm = r->st->name;
    if (!bfs__qc_is_scaled(c))
        return 0; /* no claim of ours: refuse.c judges what looks quantized */
    if (bfs__str_ends(nm, ".weight_scale"))
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): a weight scale that no quantized weight uses (its weight is missing or not quantized), under %s quant_method \"%s\"",
                        bfs__raw_path(c->in, r), nm, (unsigned long long)r->file_offset, c->qsource, c->method);
    for (size_t k = 0; k < sizeof bfs__dropped_suffixes / sizeof *bfs__dropped_suffixes; k++)
        if (bfs__str_ends(nm, bfs__dropped_suffixes[k])) {
            r->used = 1;
            return 2;
        }
    if (bfs__qc_is(c, "fp8") && (bfs__str_ends(nm, ".activation_scale") || bfs__str_ends(nm, "_proj_activation_scale"))) {
        r->used = 1;
        return 2;
    }
    return 0;
}

const bfs_format bfs__format_qextra = {
    .name = "qextra",
    .kinds = 0,
    .detect = NULL,
    .claim = NULL,
    .leftover = bfs__qextra_leftover,
    .sources = NULL,
    .kind_name = NULL,
};
