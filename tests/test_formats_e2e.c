/*
 * End to end for the docs/FORMATS.md section 6 formats (FP8 block / tensor / channel, INT4
 * pack-quantized, NVFP4 compressed-tensors and ModelOpt, the mixed MoE checkpoint) and section 7's
 * (per-tensor FP8 as transformers loads it, compressed-tensors MXFP8 / MXFP4, mixed-precision
 * groups matched as compressed-tensors does): every fixture of fixtures/gen_quant_fixtures.py
 * and fixtures/gen_mx_fixtures.py converts for W = 1, 2, 3, 8 (dcp) and W = 1 (hf) to the
 * bytes of the upstream dequant (fixtures/expected; NaN payloads apart), at every CPU
 * level; activation / KV scales are dropped and listed; quantization_config and
 * hf_quant_config.json do not reach the output; and every refusal (missing, mis-shaped,
 * wrong-dtype scale, config/tensor disagreement) is one EINPUT line naming both.
 */
#include "testutil.h"
#include "tu_st.h"
#include "bfs_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const fixtures[] = {
    "fp8-block", "fp8-block-split", "ct-fp8-tensor", "ct-fp8-channel", "ct-fp8-block",
    "ct-int4-group", "ct-int4-asym", "ct-nvfp4", "modelopt-nvfp4", "ct-moe-mixed",
    /* per-tensor FP8, compressed-tensors MX (fixtures/gen_mx_fixtures.py) */
    "fp8-tensor", "ct-mxfp8", "ct-mxfp4", "ct-mx-mixed",
    "ct-mxfp6", "ct-mx6-mixed", /* fixtures/gen_mxfp6_fixtures.py */
    "dsv4-tiny", /* DeepSeek-V4 (fixtures/gen_dsv4_fixtures.py) */
    "dsv41-tiny", "dsv4-float", /* V4.1: weight_block_size [32, 32]; scale_fmt "float" (F32 P.scale) */
    "quark-mxfp4", "quark-fp8", /* AMD Quark 0.13 exports (fixtures/gen_quark_fixtures.py) */
    "fp8-fused", /* transformers' fused FP8 experts [E, out, in] (fixtures/gen_fused_fixtures.py) */
    "fp8-fused-tensor", /* the same, weight_block_size null: [E, 1, 1], gate_up [E, 2, 1], up_proj */
    /* GPTQ, AWQ GEMM / GEMV, bitsandbytes 8-bit (fixtures/gen_gptq_fixtures.py) */
    "gptq-int4-actorder", "gptq-int4-asym", "gptq-int8", "gptq-int3", "gptq-int2-v2", "awq-gemm", "bnb-int8", "awq-gemv",
    /* transformers' own MoE classes, FP8 (fixtures/gen_moe_fixtures.py): non-zero F32 router
     * biases (and V4's hc_*, sinks, norms) the model keeps in float32, expected as stored */
    "moe-dsv3-fp8", "moe-glm4-fp8", "moe-dsv4-fp8", "moe-mixtral-fp8", "moe-minimax-m2-fp8",
};
#define NFIX (sizeof fixtures / sizeof *fixtures)

/* The output files (W rank files, or the one hf file) against the expected tensors. */
static void check_out(const char *outdir, const char *expected, int W, bool hf)
{
    stfile ex, *rk = calloc((size_t)W, sizeof *rk);
    char path[4096];
    if (st_load(expected, &ex) != 0)
        fail_msg("%s: missing or invalid", expected);
    for (int r = 0; r < W; r++) {
        if (hf)
            snprintf(path, sizeof path, "%s/model-00001-of-00001.safetensors", outdir);
        else
            snprintf(path, sizeof path, "%s/shard-%05d-model-00001-of-00001.safetensors", outdir, r + 1);
        if (st_load(path, &rk[r]) != 0)
            fail_msg("%s: missing or invalid", path);
    }
    size_t seen = 0;
    for (size_t i = 0; i < ex.h.n; i++) {
        const bfs_st_tensor *e = &ex.h.t[i];
        const uint64_t d0 = e->ndim ? e->shape[0] : 1;
        uint64_t row_bytes = bfs__dtype_size(e->dtype);
        for (int d = 1; d < e->ndim; d++)
            row_bytes *= e->shape[d];
        for (int r = 0; r < W; r++) {
            uint64_t a = 0, b = d0;
            if (!hf && e->ndim)
                bfs__chunk_rows(d0, (uint64_t)W, (uint64_t)r, &a, &b);
            const bfs_st_tensor *g = st_find(&rk[r], e->name);
            if (a == b) {
                assert_null(g);
                continue;
            }
            if (!g)
                fail_msg("%s W=%d rank %d: \"%s\" missing", outdir, W, r, e->name);
            seen++;
            /* BF16, or as stored: a tensor the model keeps in float32 (src/plan/fp32.c), an
             * integer one (the expected file holds the stored tensor) */
            assert_int_equal(g->dtype, e->dtype);
            assert_int_equal(g->ndim, e->ndim);
            for (int d = 0; d < e->ndim; d++)
                assert_int_equal(g->shape[d], d ? e->shape[d] : b - a);
            /* NaN payloads aside, equal (ours 0x7FC0, upstream's 0xFFFF); the rest: every bit */
            const size_t bad =
                e->dtype != BFS_DT_BF16
                    ? (memcmp(st_data(&rk[r], g), st_data(&ex, e) + a * row_bytes, (size_t)((b - a) * row_bytes)) != 0)
                    : st_cmp_bf16(st_data(&rk[r], g), st_data(&ex, e) + a * row_bytes, (size_t)((b - a) * row_bytes), 0,
                                  NULL);
            if (bad)
                fail_msg("%s W=%d rank %d: \"%s\": %zu elements differ from upstream", expected, W, r, e->name, bad);
        }
    }
    size_t total = 0;
    for (int r = 0; r < W; r++)
        total += rk[r].h.n;
    assert_int_equal(total, seen); /* nothing extra: scales, shapes, activation scales gone */
    for (int r = 0; r < W; r++)
        st_free(&rk[r]);
    free(rk);
    st_free(&ex);
}

static int convert(const char *in, const char *out, int W, int layout, int level)
{
    bfs_convert_opts o;
    bfs_convert_opts_init(&o);
    o.world_size = W;
    o.layout = layout;
    o.device = "cpu";
    o.force = 1;
    o.cpu_level = level;
    o.names = BFS_NAMES_CHECKPOINT; /* compared with upstream's per-tensor dequant by name
                                      * (target names and packing: test_names.c) */
    o.mem = 16 << 10; /* small: many units per tensor, units cut inside scale blocks */
    bfs_convert_result res;
    bfs_convert_result_init(&res);
    return bfs_convert(in, out, &o, &res);
}

static void convert_ok(const char *in, const char *out, int W, int layout, int level)
{
    if (convert(in, out, W, layout, level) != 0)
        fail_msg("convert %s W=%d: %s", in, W, bfs_last_error());
    assert_int_equal(bfs_verify(out, stderr, NULL), 0);
}

static void formats_all_world_sizes(void **s)
{
    (void)s;
    static const int Ws[] = {1, 2, 3, 8};
    char *tmp = tu_tmpdir("fmt");
    char in[512], ex[512], out[4096];
    for (size_t f = 0; f < NFIX; f++) {
        snprintf(in, sizeof in, "fixtures/%s", fixtures[f]);
        snprintf(ex, sizeof ex, "fixtures/expected/%s.safetensors", fixtures[f]);
        snprintf(out, sizeof out, "%s/%s", tmp, fixtures[f]);
        for (size_t w = 0; w < 4; w++) {
            convert_ok(in, out, Ws[w], BFS_LAYOUT_DCP, -1);
            check_out(out, ex, Ws[w], false);
        }
        convert_ok(in, out, 1, BFS_LAYOUT_HF, -1);
        check_out(out, ex, 1, true);
        /* the output config is a BF16 model's; ModelOpt's side file is not copied */
        assert_int_equal(tu_sh("grep -q quantization_config %s/config.json", out), 1);
        assert_int_equal(tu_sh("test -e %s/hf_quant_config.json", out), 1);
    }
    tu_rmrf(tmp);
    free(tmp);
}

/* Every CPU kernel level gives the bytes of the scalar one. */
static void formats_levels_identical(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("fmtlvl");
    char in[512], a[4096], b[4096];
    for (size_t f = 0; f < NFIX; f++) {
        snprintf(in, sizeof in, "fixtures/%s", fixtures[f]);
        snprintf(a, sizeof a, "%s/scalar", tmp);
        convert_ok(in, a, 3, BFS_LAYOUT_DCP, 0);
        for (int lvl = 1; lvl < BFS_CPU_NLEVELS; lvl++) {
            if (!bfs_kernels_cpu(lvl))
                continue;
            snprintf(b, sizeof b, "%s/l%d", tmp, lvl);
            convert_ok(in, b, 3, BFS_LAYOUT_DCP, lvl);
            for (int r = 1; r <= 3; r++)
                assert_int_equal(tu_sh("cmp -s %s/shard-%05d-model-00001-of-00001.safetensors %s/shard-%05d-model-00001-of-00001.safetensors",
                                       a, r, b, r), 0);
        }
    }
    tu_rmrf(tmp);
    free(tmp);
}

/* Activation and KV-cache scales: dropped, listed in the manifest and by inspect. */
/* The closing summary counts every format's tensors as dequantized (it once knew only
 * MXFP4 and bnb, and called FP8/INT4/NVFP4 weights "copied"). */
static void formats_summary_counts(void **s)
{
    (void)s;
    static const struct { const char *fx; uint64_t deq; } cases[] = {
        {"fixtures/fp8-block", 7}, {"fixtures/ct-int4-asym", 0}, {"fixtures/modelopt-nvfp4", 0}};
    char *tmp = tu_tmpdir("fsum");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[4096], cmd[8192];
        snprintf(out, sizeof out, "%s/o%zu", tmp, i);
        bfs_convert_opts o;
        bfs_convert_opts_init(&o);
        o.world_size = 2;
        o.device = "cpu";
        bfs_convert_result res;
        bfs_convert_result_init(&res);
        assert_int_equal(bfs_convert(cases[i].fx, out, &o, &res), 0);
        /* as many as inspect calls "dequantized" */
        snprintf(cmd, sizeof cmd, "test \"$(build/bfshard inspect %s | grep -c ' dequantized ')\" = %llu", cases[i].fx,
                 (unsigned long long)res.tensors_dequantized);
        assert_int_equal(tu_sh("%s", cmd), 0);
        assert_true(res.tensors_dequantized > 0);
        if (cases[i].deq)
            assert_int_equal(res.tensors_dequantized, cases[i].deq);
        assert_int_equal(res.tensors, res.tensors_dequantized + res.tensors_cast + res.tensors_copied);
    }
    tu_rmrf(tmp);
    free(tmp);
}

static void formats_dropped_listed(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("fmtdrop");
    char out[4096];
    snprintf(out, sizeof out, "%s/o", tmp);
    convert_ok("fixtures/modelopt-nvfp4", out, 2, BFS_LAYOUT_DCP, -1);
    json_t *m = json_load_file(strcat(out, "/bfshard.manifest.json"), 0, NULL);
    assert_non_null(m);
    const json_t *d = json_object_get(m, "dropped");
    assert_true(json_is_array(d));
    bool k = false, v = false, inp = false;
    for (size_t i = 0; i < json_array_size(d); i++) {
        const char *n = json_string_value(json_array_get(d, i));
        k = k || strcmp(n, "model.layers.0.self_attn.k_proj.k_scale") == 0;
        v = v || strcmp(n, "model.layers.0.self_attn.v_proj.v_scale") == 0;
        inp = inp || strcmp(n, "model.layers.0.mlp.down_proj.input_scale") == 0;
    }
    assert_true(k && v && inp);
    /* every tensor says what happened to it */
    const json_t *ts = json_object_get(m, "tensors");
    for (size_t i = 0; i < json_array_size(ts); i++) {
        const json_t *t = json_array_get(ts, i);
        const char *fmt = json_string_value(json_object_get(t, "format")), *act = json_string_value(json_object_get(t, "action"));
        assert_non_null(act);
        if (strcmp(fmt, "modelopt-nvfp4") == 0)
            assert_string_equal(act, "dequantized");
    }
    json_decref(m);
    assert_int_equal(tu_sh("%s inspect fixtures/modelopt-nvfp4 | grep -q 'v_proj.v_scale .* dropped'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect --names checkpoint fixtures/ct-moe-mixed | grep -q 'experts.3.down_proj.weight .*ct-int4 .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect fixtures/ct-moe-mixed | grep -q 'norm.weight .*cast .*cast'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect fixtures/fp8-block --json | grep -q '\"fp8-block\"'", tu_bfshard()), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- refusals ------------------------------------------------------------------------------ */

/* One edit of a safetensors header: rename a tensor, or give it another dtype / shape
 * (the byte count must stay: the data section is kept as it is). */
typedef struct {
    const char *name, *rename, *dtype;
    int ndim; /* > 0: new shape */
    int64_t shape[3];
} st_edit;

static void st_rewrite(const char *src, const char *dst, const st_edit *e)
{
    size_t len;
    uint8_t *b = tu_read_file(src, &len);
    assert_non_null(b);
    uint64_t hl;
    memcpy(&hl, b, 8);
    json_t *h = json_loadb((const char *)b + 8, (size_t)hl, 0, NULL);
    assert_non_null(h);
    for (; e && e->name; e++) {
        json_t *t = json_object_get(h, e->name);
        assert_non_null(t);
        json_incref(t);
        if (e->dtype)
            json_object_set_new(t, "dtype", json_string(e->dtype));
        if (e->ndim > 0) {
            json_t *a = json_array();
            for (int d = 0; d < e->ndim; d++)
                json_array_append_new(a, json_integer(e->shape[d]));
            json_object_set_new(t, "shape", a);
        }
        if (e->rename) {
            json_object_del(h, e->name);
            json_object_set(h, e->rename, t);
        }
        json_decref(t);
    }
    char *text = json_dumps(h, JSON_COMPACT);
    const size_t tl = strlen(text), nl = (tl + 7) / 8 * 8;
    const uint64_t nhl = nl;
    FILE *f = fopen(dst, "wb");
    assert_non_null(f);
    fwrite(&nhl, 8, 1, f);
    fwrite(text, 1, tl, f);
    for (size_t i = tl; i < nl; i++)
        fputc(' ', f);
    fwrite(b + 8 + hl, 1, len - 8 - hl, f);
    fclose(f);
    free(text);
    json_decref(h);
    free(b);
}

/* Copy fixture fx to tmp/in with its model edited and quantization_config members set
 * (qset: "key=json" pairs, NULL-terminated; "key=" deletes; "-" drops the whole
 * quantization_config), convert to tmp/out (W = 2, dcp) and return the result. */
static int convert_edited(const char *tmp, const char *fx, const st_edit *edits, const char *const *qset)
{
    char path[4096], src[512];
    snprintf(src, sizeof src, "fixtures/%s/model.safetensors", fx);
    snprintf(path, sizeof path, "%s/in", tmp);
    assert_int_equal(tu_sh("mkdir -p %s && cp fixtures/%s/config.json %s/", path, fx, path), 0);
    snprintf(path, sizeof path, "%s/in/model.safetensors", tmp);
    st_rewrite(src, path, edits);
    snprintf(path, sizeof path, "%s/in/config.json", tmp);
    json_t *cfg = json_load_file(path, 0, NULL);
    assert_non_null(cfg);
    json_t *qc = json_object_get(cfg, "quantization_config");
    for (; qset && *qset; qset++) {
        if (strcmp(*qset, "-") == 0) {
            json_object_del(cfg, "quantization_config");
            continue;
        }
        const char *eq = strchr(*qset, '=');
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)(eq - *qset), *qset);
        if (!eq[1])
            json_object_del(qc, key);
        else
            json_object_set_new(qc, key, json_loads(eq + 1, JSON_DECODE_ANY, NULL));
    }
    assert_int_equal(json_dump_file(cfg, path, 0), 0);
    json_decref(cfg);
    char in[4096], out[4096];
    snprintf(in, sizeof in, "%s/in", tmp);
    snprintf(out, sizeof out, "%s/out", tmp);
    return convert(in, out, 2, BFS_LAYOUT_DCP, -1);
}

/* convert_edited, expecting EINPUT with every needle in the message and nothing written. */
static void refuse(const char *fx, const st_edit *edits, const char *const *qset, const char *const *needles)
{
    char *tmp = tu_tmpdir("fmtneg");
    const int rc = convert_edited(tmp, fx, edits, qset);
    const char *msg = bfs_last_error();
    if (rc != BFS_EINPUT)
        fail_msg("%s: expected BFS_EINPUT, got %d (%s)", fx, rc, msg);
    assert_null(strchr(msg, '\n'));
    for (; needles && *needles; needles++)
        if (!strstr(msg, *needles))
            fail_msg("%s: error \"%s\" does not name \"%s\"", fx, msg, *needles);
    assert_int_equal(tu_sh("test -e %s/out/config.json", tmp), 1);
    assert_int_equal(tu_sh("ls %s/out/*.safetensors >/dev/null 2>&1", tmp), 2);
    /* nothing at all under a final name (manifest, sums, slices, ...): OUT is not even made */
    assert_int_equal(tu_sh("test -z \"$(ls -A %s/out 2>/dev/null)\"", tmp), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* convert_edited, expecting success and the bytes of fixtures/expected/<fx> (W = 2). */
static void accept(const char *fx, const st_edit *edits, const char *const *qset)
{
    char *tmp = tu_tmpdir("fmtpos");
    char out[4096], ex[512];
    if (convert_edited(tmp, fx, edits, qset) != 0)
        fail_msg("%s (edited): %s", fx, bfs_last_error());
    snprintf(out, sizeof out, "%s/out", tmp);
    snprintf(ex, sizeof ex, "fixtures/expected/%s.safetensors", fx);
    check_out(out, ex, 2, false);
    tu_rmrf(tmp);
    free(tmp);
}

#define Q "model.layers.0.self_attn.q_proj."
#define K "model.layers.0.self_attn.k_proj."
#define V "model.layers.0.self_attn.v_proj."
#define E(...) ((const st_edit[]){__VA_ARGS__, {0}})
#define S(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The checkpoints of the must-refuse corpus packed by AutoGPTQ 0.7.1, AutoAWQ 0.2.9
 * and transformers + bitsandbytes (fixtures/refuse/gen_refuse.py) now convert, to the bytes of
 * the upstream dequant (expected/refuse-<case>, fixtures/gen_gptq_fixtures.py); inspect names
 * each kind; the claims the formats refuse name what they refuse. */
static void woq_other_writers(void **s)
{
    (void)s;
    static const char *const cases[] = {"gptq", "awq", "bnb-int8"};
    char *tmp = tu_tmpdir("woq");
    char in[512], ex[512], out[4096];
    for (size_t i = 0; i < 3; i++) {
        snprintf(in, sizeof in, "fixtures/refuse/%s", cases[i]);
        snprintf(ex, sizeof ex, "fixtures/expected/refuse-%s.safetensors", cases[i]);
        snprintf(out, sizeof out, "%s/%s", tmp, cases[i]);
        for (int W = 1; W <= 3; W++) {
            convert_ok(in, out, W, BFS_LAYOUT_DCP, -1);
            check_out(out, ex, W, false);
        }
    }
    assert_int_equal(tu_sh("%s inspect --names checkpoint fixtures/gptq-int3 | grep -q 'q_proj.weight .*gptq-int3 .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect --names checkpoint fixtures/gptq-int2-v2 | grep -q 'down_proj.weight .*gptq-int2-v2 .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect --names checkpoint fixtures/awq-gemm | grep -q 'up_proj.weight .*awq-gemm .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect --names checkpoint fixtures/awq-gemv | grep -q 'down_proj.weight .*awq-gemv .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect --names checkpoint fixtures/bnb-int8 | grep -q 'o_proj.weight .*bnb-int8 .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect --names checkpoint fixtures/gptq-int8 | grep -q 'q_proj.bias .*cast'", tu_bfshard()), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* GPTQ / AWQ / bitsandbytes 8-bit refusals: each one line naming the tensor or the field. */
static void refuse_woq(void **s)
{
    (void)s;
#define GQ "model.layers.0.self_attn.q_proj."
    refuse("gptq-int4-asym", E({GQ "qzeros", "zz.qz", NULL, 0, {0}}), NULL, S(GQ "qweight", "qzeros"));
    refuse("gptq-int4-asym", E({GQ "scales", NULL, "BF16", 0, {0}}), NULL, S(GQ "scales", "F16"));
    refuse("gptq-int4-asym", E({GQ "scales", NULL, NULL, 2, {2, 32}}), NULL, S(GQ "scales", "[2, 32]"));
    refuse("gptq-int4-actorder", E({GQ "g_idx", NULL, "F32", 0, {0}}), NULL, S(GQ "g_idx", "I32"));
    refuse("gptq-int4-actorder", NULL, S("bits=8"), S("qweight\" (offset", "GPTQ 8-bit qweight", "expected [24, out]"));
    refuse("awq-gemm", E({GQ "qzeros", "zz.qz", NULL, 0, {0}}), NULL, S(GQ "qweight", "zero_point"));
    refuse("awq-gemm", NULL, S("group_size=64"), S("down_proj.qweight\"", "do not fit group_size 64"));
    refuse("awq-gemm", NULL, S("version=\"gemv_fast\""), S("gemv_fast", "interleaved int16"));
    /* GEMV: a GEMM checkpoint called GEMV; a group size whose padded zero points do not match
     * (group 32: calculate_zeros_width 4 words a row, the file has 2); one it has no width for */
    refuse("awq-gemm", NULL, S("version=\"gemv\""), S("qweight\"", "AWQ GEMV", "do not fit group_size 32"));
    refuse("awq-gemv", NULL, S("group_size=32"), S("proj.qweight\"", "do not fit group_size 32", "[64, 32]"));
    refuse("awq-gemv", NULL, S("group_size=48"), S("proj.qweight\"", "group_size 48", "calculate_zeros_width"));
    refuse("awq-gemv", NULL, S("group_size=128"), S("proj.qweight\"", "do not fit group_size 128", "in % 128 == 0"));
    refuse("awq-gemv", E({GQ "qzeros", NULL, "I16", 2, {64, 4}}), NULL, S(GQ "qzeros", "I16 [64, 4]", "expected I32 [64, 2]"));
    refuse("awq-gemv", E({GQ "scales", NULL, NULL, 2, {128, 8}}), NULL, S(GQ "qweight\"", "scales [128, 8]", "expected scales [64, 16]"));
    refuse("awq-gemv", E({GQ "qzeros", "zz.qz", NULL, 0, {0}}), NULL, S(GQ "qweight", "zero_point"));
    refuse("bnb-int8", E({GQ "SCB", NULL, "I32", 0, {0}}), NULL, S(GQ "SCB", "expected F32"));
    refuse("bnb-int8", NULL, S("load_in_4bit=true"), S("load_in_4bit", "load_in_8bit"));
#undef GQ
}

/* transformers' fused FP8 experts (FP8Experts: X [E, out, in] + X_scale_inv [E, out/bh, in/bw]) */
#define GU "model.layers.0.mlp.experts.gate_up_proj"
static void fp8_fused_rules(void **s)
{
    (void)s;
    /* the grid transposed, E wrong, a 2-D grid for a 3-D weight: [3, 4, 2] holds 24 floats */
    refuse("fp8-fused", E({GU "_scale_inv", NULL, NULL, 3, {3, 2, 4}}), NULL, S(GU "_scale_inv", "[3, 2, 4]", "expected [3, 4, 2]"));
    refuse("fp8-fused", E({GU "_scale_inv", NULL, NULL, 3, {4, 3, 2}}), NULL, S(GU "_scale_inv", "[4, 3, 2]", "expected [3, 4, 2]"));
    refuse("fp8-fused", E({GU "_scale_inv", NULL, NULL, 2, {12, 2}}), NULL, S(GU "_scale_inv", "[12, 2]", "[E, out/bh, in/bw]"));
    refuse("fp8-fused", E({GU "_scale_inv", NULL, "I32", 0, {0}}), NULL, S(GU "_scale_inv", "I32", GU "\""));
    /* a block that does not divide out (or in): upstream's block would be shape / grid */
    refuse("fp8-fused", NULL, S("weight_block_size=[24, 16]"), S("experts.down_proj\"", "out 32", "[24, 16]"));
    refuse("fp8-fused", NULL, S("weight_block_size=[16, 24]"), S("experts.down_proj\"", "in 32", "[16, 24]"));
    /* a block grid under weight_block_size null, DeepSeek-V4's keys, the scale gone */
    refuse("fp8-fused", NULL, S("weight_block_size="), S("_scale_inv\"", "expected [3, 1, 1]", "weight_block_size null"));
    refuse("fp8-fused", NULL, S("scale_fmt=\"ue8m0\""), S("ue8m0"));
    refuse("fp8-fused", E({GU "_scale_inv", "zz.unrelated", NULL, 0, {0}}), NULL, S(GU "\""));
    /* a 3-D P.weight + P.weight_scale_inv (Fp8Quantize's names for a key ending in .weight) */
    char *tmp = tu_tmpdir("fmtfused");
    if (convert_edited(tmp, "fp8-fused", E({GU, "m.gu.weight", NULL, 0, {0}}, {GU "_scale_inv", "m.gu.weight_scale_inv", NULL, 0, {0}}), NULL) != 0)
        fail_msg("fp8-fused, P.weight names: %s", bfs_last_error());
    assert_int_equal(tu_sh("%s inspect %s/in | grep -q 'm.gu.weight  *fp8-experts  *dequantized'", tu_bfshard(), tmp), 0);
    tu_rmrf(tmp);
    free(tmp);
    /* FP8Experts' static activation scales (P.gate_up_proj_activation_scale, [E]): dropped, listed */
    tmp = tu_tmpdir("fmtfusedact");
    if (convert_edited(tmp, "fp8-fused", E({"model.layers.0.mlp.gate.weight", GU "_activation_scale", NULL, 1, {96}}), NULL) != 0)
        fail_msg("fp8-fused, activation scale: %s", bfs_last_error());
    assert_int_equal(tu_sh("%s convert %s/in %s/o -q --device cpu 2>/dev/null; grep -q '\"" GU "_activation_scale\"' %s/o/bfshard.manifest.json && "
                           "! grep -q '\"name\": \"" GU "_activation_scale\"' %s/o/bfshard.manifest.json",
                           tu_bfshard(), tmp, tmp, tmp, tmp), 0);
    tu_rmrf(tmp);
    free(tmp);
    assert_int_equal(tu_sh("%s inspect fixtures/fp8-fused | grep -q 'experts.gate_up_proj  *fp8-experts  *dequantized  *BF16  *\\[3, 64, 32\\]'", tu_bfshard()), 0);
}

/* weight_block_size null (fixture fp8-fused-tensor): one F32 scale per expert, [E, 1, 1]
 * (Fp8Quantize), gate_up_proj's [E, 2, 1] (FP8Experts: a scale per half), the gate-less
 * P.up_proj. Another grid, E, rank or dtype, [E, 2, 1] on another projection, or these
 * scales under a block config are refused. */
#define X1 "model.layers.1.mlp.experts."
static void fp8_fused_tensor_rules(void **s)
{
    (void)s;
    refuse("fp8-fused-tensor", E({GU "_scale_inv", NULL, NULL, 3, {1, 3, 1}}), NULL,
           S(GU "_scale_inv", "[1, 3, 1]", "expected [3, 1, 1] or [E, 2, 1]", "weight_block_size null"));
    refuse("fp8-fused-tensor", E({GU "_scale_inv", NULL, NULL, 2, {3, 1}}), NULL, S(GU "_scale_inv", "[3, 1]"));
    refuse("fp8-fused-tensor", E({X1 "gate_up_proj_scale_inv", NULL, NULL, 3, {3, 1, 2}}), NULL, S("[3, 1, 2]", "weight_block_size null"));
    refuse("fp8-fused-tensor", E({X1 "gate_up_proj", X1 "up_proj", NULL, 0, {0}}, {X1 "gate_up_proj_scale_inv", X1 "up_proj_scale_inv", NULL, 0, {0}}),
           NULL, S(X1 "up_proj_scale_inv", "[3, 2, 1]", "expected [3, 1, 1] for"));
    refuse("fp8-fused-tensor", E({GU "_scale_inv", NULL, "I32", 0, {0}}), NULL, S(GU "_scale_inv", "I32"));
    refuse("fp8-fused-tensor", NULL, S("weight_block_size=[16, 16]"), S("weight_block_size [16, 16]"));
    refuse("fp8-fused-tensor", E({"model.layers.2.mlp.experts.up_proj_scale_inv", "zz.unrelated", NULL, 0, {0}}), NULL, S("layers.2.mlp.experts.up_proj\""));
    /* a compressed-tensors style scale on a fused expert tensor beside its _scale_inv */
    refuse("fp8-fused-tensor", E({"model.layers.0.input_layernorm.weight", GU ".weight_scale", NULL, 0, {0}}), NULL,
           S(GU ".weight_scale\"", "no quantized weight uses"));
    assert_int_equal(tu_sh("%s inspect fixtures/fp8-fused-tensor | grep -q 'layers.2.mlp.experts.up_proj  *fp8-experts  *dequantized  *BF16  *\\[3, 32, 32\\]'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect fixtures/fp8-fused-tensor | grep -q 'layers.1.mlp.experts.gate_up_proj  *fp8-experts  *dequantized'", tu_bfshard()), 0);
}

static void refuse_fp8_block(void **s)
{
    (void)s;
    /* scale missing (renamed to an unrelated name) */
    refuse("fp8-block", E({Q "weight_scale_inv", "zz.unrelated", NULL, 0, {0}}), NULL, S(Q "weight", "without its scale"));
    /* mis-shaped: [2, 2] -> [4, 1] */
    refuse("fp8-block", E({Q "weight_scale_inv", NULL, NULL, 2, {4, 1}}), NULL,
           S(Q "weight_scale_inv", "[4, 1]", "[2, 2]", Q "weight", "weight_block_size"));
    /* wrong dtype (the bytes stay: F32 -> I32) */
    refuse("fp8-block", E({Q "weight_scale_inv", NULL, "I32", 0, {0}}), NULL, S(Q "weight_scale_inv", "I32", Q "weight"));
    /* config says compressed-tensors, tensors say DeepSeek */
    refuse("fp8-block", NULL, S("quant_method=\"compressed-tensors\""), S(".weight_scale_inv\"", "compressed-tensors", "\"fp8\""));
    /* no block size in the config */
    refuse("fp8-block", NULL, S("weight_block_size="), S("weight_block_size"));
    /* scale present, config gone */
    refuse("fp8-block", NULL, S("-"), S(".weight\"", ".weight_scale_inv\"", "no quantization_config"));
    /* a scale whose weight is gone (renamed) */
    refuse("fp8-block", E({Q "weight", "zz.other", NULL, 0, {0}}), NULL, S(Q "weight_scale_inv", "without the tensors"));
}

static void refuse_ct_fp8(void **s)
{
    (void)s;
    refuse("ct-fp8-channel", E({Q "weight_scale", NULL, "F16", 0, {0}}), NULL, S(Q "weight_scale", "F16", Q "weight"));
    refuse("ct-fp8-channel", E({Q "weight_scale", NULL, NULL, 2, {1, 80}}), NULL,
           S(Q "weight_scale", "[1, 80]", "config group"));
    refuse("ct-fp8-channel", NULL, S("quant_method=\"fp8\"", "weight_block_size=[128, 128]"),
           S(".weight\"", "\"fp8\"", "weight_scale_inv"));
    refuse("ct-fp8-channel", E({Q "weight_scale", NULL, NULL, 2, {40, 2}}), NULL, S(Q "weight_scale", "[40, 2]"));
}

static void refuse_int4(void **s)
{
    (void)s;
    refuse("ct-int4-asym", E({Q "weight_zero_point", "zz.zp", NULL, 0, {0}}), NULL, S(Q "weight_packed", "symmetric: false", "has no"));
    refuse("ct-int4-group", E({Q "weight_scale", NULL, NULL, 2, {5, 60}}), NULL, S(Q "weight_scale", "[5, 60]", "[60, 60]"));
    refuse("ct-int4-group", E({Q "weight_shape", "zz.shape", NULL, 0, {0}}), NULL, S(Q "weight_packed", "weight_shape"));
    refuse("ct-int4-group", E({Q "weight_scale", NULL, "F16", 0, {0}}), NULL, S(Q "weight_scale", "F16"));
    /* 3-D (fused experts): no upstream writes it (docs/FORMATS.md 7.8) */
    refuse("ct-int4-group", E({Q "weight_packed", NULL, NULL, 3, {2, 30, 8}}), NULL, S(Q "weight_packed", "3-D packed INT4", "no upstream"));
    refuse("ct-int4-group", NULL, S("quant_method=\"fp8\"", "weight_block_size=[128, 128]"), S(".weight_packed\"", "\"fp8\""));
}

static void refuse_nvfp4(void **s)
{
    (void)s;
    /* the two conventions: tensors of one, config of the other */
    refuse("ct-nvfp4", NULL, S("quant_method=\"modelopt\"", "quant_algo=\"NVFP4\""),
           S(".weight_packed\"", "\"modelopt\"", "compressed-tensors"));
    refuse("modelopt-nvfp4", NULL, S("quant_method=\"compressed-tensors\"", "format=\"nvfp4-pack-quantized\""),
           S(".weight_scale_2\"", "compressed-tensors", "modelopt"));
    /* ModelOpt tensors, compressed-tensors global scale name */
    refuse("modelopt-nvfp4", E({Q "weight_scale_2", Q "weight_global_scale", NULL, 0, {0}}), NULL,
           S(Q "weight", "weight_global_scale"));
    refuse("ct-nvfp4", E({Q "weight_global_scale", "zz.g", NULL, 0, {0}}), NULL, S(Q "weight_packed", "global_scale"));
    refuse("ct-nvfp4", E({Q "weight_scale", NULL, "U8", 0, {0}}), NULL, S(Q "weight_scale", "U8", Q "weight"));
    refuse("modelopt-nvfp4", E({Q "weight_scale", NULL, NULL, 2, {40, 10}}), NULL, S(Q "weight_scale", "[40, 10]", "[80, 5]"));
    refuse("modelopt-nvfp4", E({Q "weight_scale_2", "zz.s2", NULL, 0, {0}}), NULL, S(Q "weight", "weight_scale_2"));
    refuse("modelopt-nvfp4", NULL, S("quant_algo=\"W4A8_AWQ\""), S("quant_algo", "W4A8_AWQ"));
}

/* ---- per-tensor FP8, compressed-tensors MX, AMD Quark, mixed-precision (docs/FORMATS.md 7) ---- */

/* Per-tensor FP8 (transformers, quant_method "fp8", weight_block_size null): the fixture's
 * scales are F32 [] (q_proj), BF16 [] (k_proj), F32 [1, 1] (v_proj), BF16 [1, 1] (o_proj). */
static void fp8_tensor_rules(void **s)
{
    (void)s;
    /* weight_block_size absent (transformers reads the scalar scale as one block all the same) */
    accept("fp8-tensor", NULL, S("weight_block_size="));
    /* a scale of one element shaped [1] is the same scale */
    accept("fp8-tensor", E({Q "weight_scale_inv", NULL, NULL, 1, {1}}), NULL);
    /* wrong dtype: F32 -> I32, BF16 -> F16 (the bytes stay) */
    refuse("fp8-tensor", E({Q "weight_scale_inv", NULL, "I32", 0, {0}}), NULL,
           S(Q "weight_scale_inv", "I32", Q "weight", "F32 or BF16"));
    refuse("fp8-tensor", E({K "weight_scale_inv", NULL, "F16", 0, {0}}), NULL, S(K "weight_scale_inv", "F16"));
    /* wrong shape: F32 [1, 1] -> BF16 [1, 2] (two values for one tensor) */
    refuse("fp8-tensor", E({V "weight_scale_inv", NULL, "BF16", 2, {1, 2}}), NULL,
           S(V "weight_scale_inv", "[1, 2]", "weight_block_size", V "weight"));
    /* the config disagrees: block size given, the scales are scalars of 80 x 80 weights */
    refuse("fp8-tensor", NULL, S("weight_block_size=[64, 64]"), S(".weight_scale_inv\"", "scale shape []", "weight_block_size [64, 64]"));
    refuse("fp8-tensor", NULL, S("quant_method=\"compressed-tensors\""), S(".weight_scale_inv\"", "compressed-tensors", "\"fp8\""));
    /* E8M0 block scales (DeepSeek-V4, MXFP8 under quant_method fp8) and FP4 experts: not this format */
    refuse("fp8-tensor", NULL, S("scale_fmt=\"ue8m0\""), S("scale_fmt", "ue8m0"));
    refuse("fp8-tensor", NULL, S("expert_dtype=\"fp4\""), S("expert_dtype", "fp4"));
    refuse("fp8-tensor", NULL, S("weight_block_size=[128]"), S("weight_block_size"));
    /* scale missing */
    refuse("fp8-tensor", E({Q "weight_scale_inv", "zz.unrelated", NULL, 0, {0}}), NULL, S(Q "weight", "without its scale"));
    /* two formats on one weight: a compressed-tensors weight_scale beside weight_scale_inv; a zero point */
    refuse("fp8-tensor", E({"model.layers.0.mlp.down_proj.activation_scale", Q "weight_scale", NULL, 0, {0}}), NULL,
           S(Q "weight\"", "both", Q "weight_scale_inv\"", Q "weight_scale\""));
    refuse("fp8-tensor", E({"model.layers.0.input_layernorm.weight", Q "weight_zero_point", NULL, 0, {0}}), NULL,
           S(Q "weight_zero_point\"", "zero points"));
}

/* activation_scale (static activations) is dropped under quant_method "fp8", and listed */
static void fp8_tensor_dropped(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("fp8tdrop");
    char out[4096], man[4200];
    snprintf(out, sizeof out, "%s/o", tmp);
    convert_ok("fixtures/fp8-tensor", out, 3, BFS_LAYOUT_DCP, -1);
    snprintf(man, sizeof man, "%s/bfshard.manifest.json", out);
    json_t *m = json_load_file(man, 0, NULL);
    assert_non_null(m);
    const json_t *d = json_object_get(m, "dropped");
    size_t act = 0;
    for (size_t i = 0; i < json_array_size(d); i++) {
        const char *n = json_string_value(json_array_get(d, i));
        act += strlen(n) > 17 && strcmp(n + strlen(n) - 17, ".activation_scale") == 0;
    }
    assert_int_equal(act, 7);
    json_decref(m);
    assert_int_equal(tu_sh("%s inspect fixtures/fp8-tensor | grep -q 'q_proj.activation_scale .* dropped'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect fixtures/fp8-tensor | grep -q 'q_proj.weight .*fp8-tensor .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("grep -q quantization_config %s/config.json", out), 1);
    tu_rmrf(tmp);
    free(tmp);
}

/* compressed-tensors MX: scales of the wrong dtype, shape or count, a config that disagrees
 * with the tensors, variants that are not converted (MXFP6, asymmetric, other group sizes). */
static void refuse_ctmx(void **s)
{
    (void)s;
    static const char *const mx8_g16 = "config_groups={\"group_0\": {\"targets\": [\"Linear\"], \"weights\": "
                                       "{\"type\": \"float\", \"num_bits\": 8, \"group_size\": 16, \"strategy\": \"group\", "
                                       "\"symmetric\": true, \"scale_dtype\": \"torch.uint8\"}}}";
    static const char *const mx4_f8e8 = "config_groups={\"group_0\": {\"targets\": [\"Linear\"], \"weights\": "
                                        "{\"type\": \"float\", \"num_bits\": 4, \"group_size\": 32, \"strategy\": \"group\", "
                                        "\"symmetric\": true, \"scale_dtype\": \"torch.float8_e8m0fnu\"}}}";
    /* wrong scale dtype (the bytes stay): I8 is not E8M0 */
    refuse("ct-mxfp8", E({Q "weight_scale", NULL, "I8", 0, {0}}), NULL, S(Q "weight_scale", "I8", "U8", Q "weight"));
    refuse("ct-mxfp4", E({Q "weight_scale", NULL, "I8", 0, {0}}), NULL, S(Q "weight_scale", "I8", "U8"));
    /* wrong shape or count: [128, 4] -> [64, 8]; a packed weight [128, 64] -> [256, 32] */
    refuse("ct-mxfp8", E({Q "weight_scale", NULL, NULL, 2, {64, 8}}), NULL, S(Q "weight_scale", "[64, 8]", "[128, 4]"));
    refuse("ct-mxfp4", E({Q "weight_packed", NULL, NULL, 2, {256, 32}}), NULL, S(Q "weight_scale", "[128, 4]", "[256, 2]"));
    refuse("ct-mxfp8", E({Q "weight", NULL, NULL, 2, {1024, 16}}), NULL, S(Q "weight", "[1024, 16]", "% 32"));
    /* the config disagrees: another format, another group size, E8M0 as a float8 dtype */
    refuse("ct-mxfp8", NULL, S("format=\"float-quantized\""), S(".weight\"", "mxfp8-quantized"));
    refuse("ct-mxfp4", NULL, S("format=\"nvfp4-pack-quantized\""), S(".weight_packed\"", "mxfp4-pack-quantized"));
    refuse("ct-mxfp8", NULL, S("format=\"mxfp8-quantized\"", mx8_g16), S("group_size 32"));
    refuse("ct-mxfp4", NULL, S(mx4_f8e8), S("scale_dtype", "float8_e8m0fnu"));
    refuse("ct-mxfp8", NULL, S("quant_method=\"fp8\"", "weight_block_size=[128, 128]"), S(".weight\"", "\"fp8\"", "weight_scale_inv"));
    refuse("ct-mxfp4", NULL, S("-"), S(".weight_packed\"", "compressed-tensors"));
    /* MXFP4 tensors under an MXFP6 config (num_bits 4 there); not converted: asymmetric (a zero point) */
    refuse("ct-mxfp4", NULL, S("format=\"mxfp6-pack-quantized\""), S("mxfp6-pack-quantized", "num_bits 6", "not supported"));
    refuse("ct-mxfp4", E({"model.layers.0.input_layernorm.weight", Q "weight_zero_point", NULL, 0, {0}}), NULL,
           S(Q "weight_packed", "zero point"));
    /* mixed formats in one tensor: an MXFP4 weight with an NVFP4 global scale */
    refuse("ct-mxfp4", E({"model.layers.0.input_layernorm.weight", Q "weight_global_scale", NULL, 0, {0}}), NULL,
           S(Q "weight"));
    /* the scale gone */
    refuse("ct-mxfp8", E({Q "weight_scale", "zz.s", NULL, 0, {0}}), NULL, S(Q "weight"));
}

/* compressed-tensors MXFP6 (fixtures ct-mxfp6, ct-mx6-mixed; docs/FORMATS.md 7.6): the same
 * tensor names and dtypes as MXFP4, the config group decides; the tensors must agree. */
static void refuse_ctmx6(void **s)
{
    (void)s;
    static const char *const mx6_b4 = "config_groups={\"group_0\": {\"targets\": [\"Linear\"], \"weights\": "
                                      "{\"type\": \"float\", \"num_bits\": 4, \"group_size\": 32, \"strategy\": \"group\", "
                                      "\"symmetric\": true, \"scale_dtype\": \"torch.uint8\"}}}";
    static const char *const mx6_g16 = "config_groups={\"group_0\": {\"targets\": [\"Linear\"], \"weights\": "
                                       "{\"type\": \"float\", \"num_bits\": 6, \"group_size\": 16, \"strategy\": \"group\", "
                                       "\"symmetric\": true, \"scale_dtype\": \"torch.uint8\"}}}";
    static const char *const mx6_f8e8 = "config_groups={\"group_0\": {\"targets\": [\"Linear\"], \"weights\": "
                                        "{\"type\": \"float\", \"num_bits\": 6, \"group_size\": 32, \"strategy\": \"group\", "
                                        "\"symmetric\": true, \"scale_dtype\": \"torch.float8_e8m0fnu\"}}}";
    /* scale of the wrong dtype, shape or count (q_proj: packed [128, 96], scale [128, 4]) */
    refuse("ct-mxfp6", E({Q "weight_scale", NULL, "I8", 0, {0}}), NULL, S(Q "weight_scale", "I8", "U8", Q "weight_packed"));
    refuse("ct-mxfp6", E({Q "weight_scale", NULL, NULL, 2, {64, 8}}), NULL, S(Q "weight_scale", "MXFP6", "[64, 8]", "[128, 4]"));
    refuse("ct-mxfp6", E({Q "weight_packed", NULL, NULL, 2, {256, 48}}), NULL, S(Q "weight_scale", "[128, 4]", "[256, 2]"));
    /* a packed row that is not whole 3-byte words of whole groups */
    refuse("ct-mxfp6", E({Q "weight_packed", NULL, NULL, 2, {96, 128}}), NULL, S(Q "weight_packed", "MXFP6 packed", "[96, 128]", "% 32"));
    /* the config disagrees: MXFP6 tensors read as MXFP4 (the scale count gives it away), another
     * num_bits or group size, E8M0 as a float8 dtype, no compressed-tensors */
    refuse("ct-mxfp6", NULL, S("format=\"mxfp4-pack-quantized\""), S("mxfp4-pack-quantized", "num_bits 4"));
    refuse("ct-mxfp6", NULL, S(mx6_b4), S("mxfp6-pack-quantized", "num_bits 6"));
    refuse("ct-mxfp6", NULL, S(mx6_g16), S("mxfp6-pack-quantized", "group_size 32"));
    refuse("ct-mxfp6", NULL, S(mx6_f8e8), S("scale_dtype", "float8_e8m0fnu"));
    refuse("ct-mxfp6", NULL, S("format=\"nvfp4-pack-quantized\""), S(".weight_packed\"", "mxfp6-pack-quantized"));
    refuse("ct-mxfp6", NULL, S("-"), S(".weight_packed\"", "MXFP4/MXFP6", "compressed-tensors"));
    refuse("ct-mxfp6", E({"model.layers.0.input_layernorm.weight", Q "weight_zero_point", NULL, 0, {0}}), NULL,
           S(Q "weight_packed", "zero point"));
    refuse("ct-mxfp6", E({Q "weight_scale", "zz.s", NULL, 0, {0}}), NULL, S(Q "weight_packed"));
    /* mixed-precision: the experts' MXFP6 group named MXFP4 -> their tensors disagree; the
     * exact-name MXFP4 group gone -> layer-1 o_proj falls to the MXFP8 regex */
    refuse("ct-mx6-mixed", NULL,
           S("config_groups={\"group_0\": {\"format\": \"mxfp4-pack-quantized\", \"targets\": [\"re:.*mlp\\\\.experts\\\\.\\\\d+\\\\.(gate|up|down)_proj$\"], "
             "\"weights\": {\"type\": \"float\", \"num_bits\": 4, \"group_size\": 32, \"strategy\": \"group\", \"symmetric\": true}}, "
             "\"group_1\": {\"format\": \"mxfp8-quantized\", \"targets\": [\"re:.*self_attn\\\\.(q|k|v|o)_proj$\"], "
             "\"weights\": {\"type\": \"float\", \"num_bits\": 8, \"group_size\": 32, \"strategy\": \"group\", \"symmetric\": true}}, "
             "\"group_2\": {\"format\": \"mxfp4-pack-quantized\", \"targets\": [\"model.layers.1.self_attn.o_proj\"], "
             "\"weights\": {\"type\": \"float\", \"num_bits\": 4, \"group_size\": 32, \"strategy\": \"group\", \"symmetric\": true}}}"),
           S(".mlp.experts.", "MXFP4 scale shape"));
    refuse("ct-mx6-mixed", NULL,
           S("config_groups={\"group_0\": {\"format\": \"mxfp6-pack-quantized\", \"targets\": [\"re:.*mlp\\\\.experts\\\\.\\\\d+\\\\.(gate|up|down)_proj$\"], "
             "\"weights\": {\"type\": \"float\", \"num_bits\": 6, \"group_size\": 32, \"strategy\": \"group\", \"symmetric\": true}}, "
             "\"group_1\": {\"format\": \"mxfp8-quantized\", \"targets\": [\"re:.*self_attn\\\\.(q|k|v|o)_proj$\"], "
             "\"weights\": {\"type\": \"float\", \"num_bits\": 8, \"group_size\": 32, \"strategy\": \"group\", \"symmetric\": true}}}"),
           S("model.layers.1.self_attn.o_proj.weight_packed\"", "config group 1", "mxfp8-quantized"));
    /* compressed-tensors tensors and config under quant_method "quark" (no Quark export keys) */
    refuse("ct-mxfp6", NULL, S("quant_method=\"quark\""), S("config.json", "export.weight_format", "not supported"));
    /* inspect names each tensor's format, as matched */
    assert_int_equal(tu_sh("%s inspect fixtures/ct-mx6-mixed | grep -q 'layers.1.self_attn.o_proj.weight .*ct-mxfp4 .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect fixtures/ct-mx6-mixed | grep -q 'layers.0.self_attn.o_proj.weight .*ct-mxfp8 .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect --names checkpoint fixtures/ct-mx6-mixed | grep -q 'experts.1.down_proj.weight .*ct-mxfp6 .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect fixtures/ct-mxfp6 --json | grep -q '\"ct-mxfp6\"'", tu_bfshard()), 0);
}

/* AMD Quark (quant_method "quark", fixtures quark-mxfp4 and quark-fp8; docs/FORMATS.md 7.7): MXFP4
 * and per-tensor FP8 weights converted; every other Quark scheme, a config that disagrees with the
 * tensors and mis-shaped or mistyped scales refused, one line naming the file and the tensor. */
#define QW_MX4 "{\"bias\": null, \"input_tensors\": null, \"output_tensors\": null, \"weight\": {\"dtype\": \"fp4\", \"qscheme\": \"per_group\", \"group_size\": 32, \"ch_axis\": -1, \"scale_format\": \"e8m0\", \"block_size\": null, \"mx_element_dtype\": null, \"is_scale_quant\": false}}"
#define QW_F8 "{\"bias\": null, \"input_tensors\": null, \"output_tensors\": null, \"weight\": {\"dtype\": \"fp8_e4m3\", \"qscheme\": \"per_tensor\", \"group_size\": null, \"ch_axis\": null, \"scale_format\": null, \"block_size\": null, \"mx_element_dtype\": null, \"is_scale_quant\": false}}"
#define QW_INT4 "{\"bias\": null, \"weight\": {\"dtype\": \"int4\", \"qscheme\": \"per_group\", \"group_size\": 128, \"ch_axis\": -1, \"scale_format\": null}}"
#define QW_FP6 "{\"bias\": null, \"weight\": {\"dtype\": \"fp6_e2m3\", \"qscheme\": \"per_group\", \"group_size\": 32, \"ch_axis\": -1, \"scale_format\": \"e8m0\"}}"
#define QW_NONE "{\"bias\": null, \"weight\": null}"
#define QM "model.layers.0.mlp.gate_proj."
static void quark_rules(void **s)
{
    (void)s;
    /* the same config written out by hand converts; layer_quant_config by fnmatch and exact name */
    accept("quark-mxfp4", NULL, S("global_quant_config=" QW_MX4));
    accept("quark-mxfp4", NULL, S("layer_quant_config={\"*self_attn.?_proj\": " QW_MX4 ", \"model.layers.0.mlp.up_proj\": " QW_MX4 "}"));
    accept("quark-fp8", NULL, S("export={\"weight_format\": \"real_quantized\", \"pack_method\": \"order\", \"weight_merge_groups\": null}"));
    /* layer_type_quant_config decides by class, which the checkpoint does not name: any scheme it
     * or the global config names is accepted, another refused */
    accept("quark-mxfp4", NULL, S("layer_type_quant_config={\"Linear\": " QW_MX4 "}"));
    refuse("quark-mxfp4", NULL, S("global_quant_config=" QW_NONE, "layer_type_quant_config={\"Linear\": " QW_F8 "}"),
           S(".weight\"", "layer_type_quant_config", "per-tensor FP8"));
    /* other Quark schemes: refused naming the key */
    refuse("quark-mxfp4", NULL, S("global_quant_config=" QW_INT4), S("config.json", "global_quant_config.weight", "int4", "not supported"));
    refuse("quark-mxfp4", NULL, S("global_quant_config=" QW_FP6), S("global_quant_config.weight", "fp6_e2m3"));
    refuse("quark-fp8", NULL, S("layer_quant_config={\"*q_proj\": " QW_INT4 "}"), S("layer_quant_config[\"*q_proj\"]", "int4"));
    refuse("quark-mxfp4", NULL, S("layer_quant_config={\"*q_proj\": {\"bias\": {\"dtype\": \"int8\"}, \"weight\": null}}"), S("bias", "not supported"));
    /* config and tensors disagree: FP8 config over MXFP4 tensors; a module the config excludes or
     * leaves unquantized stored quantized */
    refuse("quark-mxfp4", NULL, S("global_quant_config=" QW_F8), S("model.layers.0.mlp.down_proj.weight\"", "MXFP4", "global_quant_config", "per-tensor FP8"));
    refuse("quark-fp8", NULL, S("layer_quant_config={\"*q_proj\": " QW_MX4 "}"), S(Q "weight\"", "FP8", "layer_quant_config", "MXFP4"));
    refuse("quark-mxfp4", NULL, S("exclude=[\"lm_head\", \"*gate_proj\"]"), S(QM "weight\"", "exclude", "no weight quantization"));
    refuse("quark-fp8", NULL, S("layer_quant_config={\"*k_proj\": " QW_NONE "}"), S(K "weight\"", "no weight quantization"));
    /* export variants and algorithms not measured */
    refuse("quark-fp8", NULL, S("export={\"weight_format\": \"fake_quantized\"}"), S("config.json", "weight_format", "fake_quantized"));
    refuse("quark-fp8", NULL, S("export="), S("config.json", "weight_format"));
    refuse("quark-mxfp4", NULL, S("export={\"weight_format\": \"real_quantized\", \"weight_merge_groups\": [[\"*q_proj\", \"*k_proj\"]]}"), S("weight_merge_groups"));
    refuse("quark-mxfp4", NULL, S("algo_config=[{\"name\": \"awq\"}]"), S("config.json", "algo_config"));
    refuse("quark-mxfp4", NULL, S("global_quant_config="), S("global_quant_config"));
    /* scales: dtype, shape */
    refuse("quark-mxfp4", E({Q "weight_scale", NULL, "I8", 0, {0}}), NULL, S(Q "weight_scale\"", "I8", "U8"));
    refuse("quark-mxfp4", E({Q "weight_scale", NULL, NULL, 2, {128, 16}}), NULL, S(Q "weight_scale\"", "[128, 16]", "[256, 8]"));
    refuse("quark-mxfp4", E({Q "weight", NULL, NULL, 2, {512, 64}}), NULL, S(Q "weight_scale\"", "[256, 8]", "[512, 4]"));
    refuse("quark-fp8", E({K "weight_scale", NULL, "F16", 0, {0}}), NULL, S(K "weight_scale\"", "F16", "BF16 or F32"));
    refuse("quark-fp8", E({K "weight_scale", NULL, NULL, 1, {1}}), NULL, S(K "weight_scale\"", "[1]"));
    /* a zero point (asymmetric), a stray scale, a weight without its scale */
    refuse("quark-mxfp4", E({"model.layers.0.input_layernorm.weight", Q "weight_zero_point", NULL, 0, {0}}), NULL,
           S(Q "weight\"", "zero point"));
    refuse("quark-fp8", E({Q "weight", "zz.w", NULL, 0, {0}}), NULL, S(Q "weight_scale\"", "no quantized weight"));
    refuse("quark-mxfp4", E({Q "weight_scale", "zz.s", NULL, 0, {0}}), NULL, S(Q "weight\"", "U8"));
    /* Quark's U8 weights without the config: refused, never copied */
    refuse("quark-mxfp4", NULL, S("-"), S(".weight\"", "looks quantized"));
    refuse("quark-fp8", NULL, S("-"), S(".weight\"", "no quantization_config"));
    /* inspect names the format; activation scales dropped */
    assert_int_equal(tu_sh("%s inspect fixtures/quark-mxfp4 | grep -q 'gate_proj.weight .*quark-mxfp4 .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect fixtures/quark-fp8 | grep -q 'q_proj.weight .*quark-fp8 .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect fixtures/quark-fp8 | grep -q 'k_proj.output_scale .* dropped'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect fixtures/quark-fp8 | grep -q 'down_proj.input_scale .* dropped'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect fixtures/quark-fp8 --json | grep -q '\"quark-fp8\"'", tu_bfshard()), 0);
    /* the manifest lists the activation scales as dropped */
    char *tmp = tu_tmpdir("quarkdrop");
    char out[4096];
    snprintf(out, sizeof out, "%s/o", tmp);
    convert_ok("fixtures/quark-fp8", out, 2, BFS_LAYOUT_DCP, -1);
    strcat(out, "/bfshard.manifest.json");
    json_t *m = json_load_file(out, 0, NULL);
    assert_non_null(m);
    const json_t *d = json_object_get(m, "dropped");
    size_t nd = 0;
    for (size_t i = 0; i < json_array_size(d); i++) {
        const char *n = json_string_value(json_array_get(d, i));
        const size_t L = strlen(n);
        nd += (L > 12 && strcmp(n + L - 12, ".input_scale") == 0) || (L > 13 && strcmp(n + L - 13, ".output_scale") == 0);
    }
    assert_int_equal(nd, 9); /* 7 input_scale, k_proj and v_proj output_scale */
    json_decref(m);
    tu_rmrf(tmp);
    free(tmp);
}

/* mixed-precision: each module's config group as compressed-tensors matches it
 * (src/formats/ctmatch.c; fixture ct-mx-mixed: MXFP4 experts by regex, MXFP8 attention by
 * regex, FP8 channel layer-1 o_proj by exact name, ignore by name and regex). */
#define G_MX4 "{\"format\": \"mxfp4-pack-quantized\", \"targets\": [%s], \"weights\": {\"type\": \"float\", \"num_bits\": 4, \"group_size\": 32, \"strategy\": \"group\", \"symmetric\": true}}"
#define G_MX8 "{\"format\": \"mxfp8-quantized\", \"targets\": [%s], \"weights\": {\"type\": \"float\", \"num_bits\": 8, \"group_size\": 32, \"strategy\": \"group\", \"symmetric\": true}}"
#define G_F8 "{\"format\": \"float-quantized\", \"targets\": [%s], \"weights\": {\"type\": \"float\", \"num_bits\": 8, \"strategy\": \"channel\", \"symmetric\": true}}"
#define T_EXP "\"re:.*mlp\\\\.experts\\\\.\\\\d+\\\\.(gate|up|down)_proj$\""
#define T_ATT "\"re:.*self_attn\\\\.(q|k|v|o)_proj$\""
#define T_O1 "\"model.layers.1.self_attn.o_proj\""

/* "config_groups={...}" of three groups, each "FORMAT" with its targets */
static const char *groups3(char *buf, size_t cap, const char *t0, const char *t1, const char *t2)
{
    char g0[512], g1[512], g2[512];
    snprintf(g0, sizeof g0, G_MX4, t0);
    snprintf(g1, sizeof g1, G_MX8, t1);
    snprintf(g2, sizeof g2, G_F8, t2);
    snprintf(buf, cap, "config_groups={\"group_0\": %s, \"group_1\": %s, \"group_2\": %s}", g0, g1, g2);
    return buf;
}

static void ct_mixed_matching(void **s)
{
    (void)s;
    char b[2048];
    /* the groups as written: converts (the fixture itself, compressed again from these strings) */
    accept("ct-mx-mixed", NULL, S(groups3(b, sizeof b, T_EXP, T_ATT, T_O1)));
    /* a regex that sorts after the attention regex changes nothing ("re:.*zz|..." > "re:.*se...") */
    accept("ct-mx-mixed", NULL, S(groups3(b, sizeof b, T_EXP, T_ATT, T_O1 ", \"re:.*zz|.*q_proj$\"")));
    /* ... one that sorts before it takes q_proj to the FP8 group: its MXFP8 tensors disagree */
    refuse("ct-mx-mixed", NULL, S(groups3(b, sizeof b, T_EXP, T_ATT, T_O1 ", \"re:.*q_proj$\"")),
           S(".q_proj.weight\"", "config group 2"));
    /* the exact name gone: layer-1 o_proj falls to the MXFP8 regex, its FP8-channel tensors disagree */
    refuse("ct-mx-mixed", NULL, S(groups3(b, sizeof b, T_EXP, T_ATT, "\"model.layers.9.o_proj\"")),
           S("model.layers.1.self_attn.o_proj.weight_scale\"", "config group 1", "mxfp8-quantized"));
    /* a target listed by two groups belongs to the later one: the experts' regex in group 2 too */
    refuse("ct-mx-mixed", NULL, S(groups3(b, sizeof b, T_EXP, T_ATT, T_O1 ", " T_EXP)),
           S(".mlp.experts.", "config group 2", "float-quantized"));
    /* a group that matches no module (a fourth group; compressed-tensors itself only warns) */
    groups3(b, sizeof b, T_EXP, T_ATT, T_O1);
    char g3[512];
    snprintf(g3, sizeof g3, ", \"group_3\": " G_F8 "}", "\"re:.*nonexistent_proj$\", \"model.layers.7.mlp\"");
    strcpy(b + strlen(b) - 1, g3);
    refuse("ct-mx-mixed", NULL, S(b), S("group_3", "nonexistent_proj", "matches no module"));
    /* ignore names a quantized module */
    refuse("ct-mx-mixed", NULL,
           S("ignore=[\"lm_head\", \"re:.*mlp\\\\.gate$\", \"model.layers.0.self_attn.v_proj\", \"re:.*layers\\\\.1\\\\.self_attn\\\\.k_proj\"]"),
           S("model.layers.1.self_attn.k_proj", "ignore", "k_proj"));
    /* the ignore list emptied: the BF16 ignored modules are just unquantized weights (upstream
     * would have quantized layer-0 v_proj, but the checkpoint is what it is): still converts */
    accept("ct-mx-mixed", NULL, S("ignore=[]"));
    /* class targets: "Linear" for the experts is the same answer; a second class target of
     * another group makes the experts' group depend on their class: refused */
    accept("ct-mx-mixed", NULL, S(groups3(b, sizeof b, "\"Linear\"", T_ATT, T_O1)));
    refuse("ct-mx-mixed", NULL, S(groups3(b, sizeof b, "\"Linear\"", T_ATT ", \"Embedding\"", T_O1)),
           S(".mlp.experts.", "class", "Embedding"));
    /* inspect and the manifest name each tensor's format, as matched */
    assert_int_equal(tu_sh("%s inspect fixtures/ct-mx-mixed | grep -q 'layers.1.self_attn.o_proj.weight .*ct-fp8-channel .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect fixtures/ct-mx-mixed | grep -q 'layers.0.self_attn.o_proj.weight .*ct-mxfp8 .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect --names checkpoint fixtures/ct-mx-mixed | grep -q 'experts.3.down_proj.weight .*ct-mxfp4 .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect fixtures/ct-mx-mixed | grep -q 'layers.0.self_attn.v_proj.weight .*passthrough .*copied'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect fixtures/ct-mxfp4 --json | grep -q '\"ct-mxfp4\"'", tu_bfshard()), 0);
    /* a pattern without a POSIX equivalent */
    refuse("ct-mx-mixed", NULL, S(groups3(b, sizeof b, "\"re:.*\\\\bexperts.*\"", T_ATT, T_O1)),
           S("re:.*\\bexperts", "not supported"));
}

/* ---- DeepSeek-V4 (src/formats/dsv4.c, fixture dsv4-tiny: layer 0 F8_E8M0 scales, layer 1 U8) ---- */
#define A0 "layers.0.attn."
#define X0 "layers.0.ffn.experts.0."
static void dsv4_rules(void **s)
{
    (void)s;
    /* the same E8M0 bytes stored U8 instead of F8_E8M0 (no byte 255 in this scale): same output */
    accept("dsv4-tiny", E({A0 "wo_a.scale", NULL, "U8", 0, {0}}), NULL);
    /* expert_dtype where V4.1 puts it, in quantization_config, as well as at the top */
    accept("dsv4-tiny", NULL, S("expert_dtype=\"fp4\""));
    /* scale of the wrong dtype, shape or count */
    refuse("dsv4-tiny", E({A0 "wkv.scale", NULL, "I8", 0, {0}}), NULL, S(A0 "wkv.scale", "I8", "F8_E8M0 or U8", A0 "wkv.weight"));
    refuse("dsv4-tiny", E({A0 "wkv.scale", NULL, "F8_E4M3", 0, {0}}), NULL, S(A0 "wkv.scale", "F8_E4M3"));
    refuse("dsv4-tiny", E({A0 "wq_a.scale", NULL, NULL, 2, {4, 1}}), NULL, S(A0 "wq_a.scale", "[4, 1]", "[2, 2]", "weight_block_size"));
    refuse("dsv4-tiny", E({X0 "w1.scale", NULL, NULL, 2, {128, 4}}), NULL, S(X0 "w1.scale", "[128, 4]", "[64, 8]"));
    refuse("dsv4-tiny", E({X0 "w1.scale", NULL, "I8", 0, {0}}), NULL, S(X0 "w1.scale", "I8", "F8_E8M0 or U8"));
    refuse("dsv4-tiny", E({A0 "wkv.scale", "zz.unrelated", NULL, 0, {0}}), NULL, S(A0 "wkv.weight", "without its scale"));
    refuse("dsv4-tiny", E({X0 "w1.scale", "zz.unrelated", NULL, 0, {0}}), NULL, S(X0 "w1.weight", "I8"));
    /* V3's scale name under V4's keys */
    refuse("dsv4-tiny", E({A0 "wkv.scale", A0 "wkv.weight_scale_inv", NULL, 0, {0}}), NULL,
           S(A0 "wkv.weight_scale_inv", "scale_fmt \"ue8m0\"", "not supported"));
    /* I8 outside the routed experts; FP8 routed experts under expert_dtype fp4 */
    refuse("dsv4-tiny", E({A0 "wo_a.weight", NULL, "I8", 0, {0}}), NULL, S(A0 "wo_a.weight", "outside the routed experts"));
    refuse("dsv4-tiny", E({X0 "w1.weight", NULL, "F8_E4M3", 0, {0}}), NULL, S(X0 "w1.weight", "expert_dtype is \"fp4\""));
    /* the config disagrees with the tensors */
    refuse("dsv4-tiny", NULL, S("scale_fmt=\"float\""), S(".scale\"", "F8_E8M0", "expected F32", "scale_fmt \"float\""));
    refuse("dsv4-tiny", NULL, S("scale_fmt="), S(".scale\"", "expected F32"));
    refuse("dsv4-tiny", NULL, S("scale_fmt=\"mx\""), S("scale_fmt \"mx\"", "not supported"));
    refuse("dsv4-tiny", NULL, S("expert_dtype=\"fp8\""), S("expert_dtype", "\"fp4\"", "\"fp8\"", "disagrees"));
    refuse("dsv4-tiny", NULL, S("weight_block_size=[64, 64]"), S(".scale\"", "weight_block_size [64, 64]"));
    refuse("dsv4-tiny", NULL, S("weight_block_size="), S(".scale\"", "weight_block_size"));
    refuse("dsv4-tiny", NULL, S("-"), S(".weight\"", ".scale\"", "expected \"fp8\""));
    /* inspect and the manifest name the format and the action; the tensors the model keeps in
     * float32 are written as stored, said so, with the rule; the config drops V4's quantization keys */
    assert_int_equal(tu_sh("%s inspect --names checkpoint fixtures/dsv4-tiny | grep -q 'layers.0.attn.wq_a.weight .*dsv4-fp8-ue8m0 .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect --names checkpoint fixtures/dsv4-tiny | grep -q 'experts.1.w2.weight .*dsv4-fp4-ue8m0 .*dequantized'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect fixtures/dsv4-tiny | grep -q '^note: 32 tensor(s) written as stored (32 F32), not rounded to BF16: the model keeps them in float32 (DeepseekV4PreTrainedModel (models/deepseek_v4/modeling_deepseek_v4.py:1242)'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect --names checkpoint fixtures/dsv4-tiny | grep -q 'layers.1.hc_ffn_fn .*copied .*F32'", tu_bfshard()), 0);
    assert_int_equal(tu_sh("%s inspect --names checkpoint fixtures/dsv4-tiny --keep-dtype | grep -q 'layers.1.hc_ffn_fn .*F32'", tu_bfshard()), 0);
    char *tmp = tu_tmpdir("dsv4");
    char out[4096];
    snprintf(out, sizeof out, "%s/o", tmp);
    convert_ok("fixtures/dsv4-tiny", out, 2, BFS_LAYOUT_DCP, -1);
    assert_int_equal(tu_sh("grep -q -e quantization_config -e expert_dtype -e scale_fmt %s/config.json", out), 1);
    assert_int_equal(tu_sh("grep -q '\"dsv4-fp4-ue8m0\"' %s/bfshard.manifest.json", out), 0);
    assert_int_equal(tu_sh("grep -q '\"keeps_float32\": \"DeepseekV4PreTrainedModel' %s/bfshard.manifest.json", out), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- DeepSeek-V4.1 (dsv41-tiny: weight_block_size [32, 32], expert_dtype in quantization_config)
 * and scale_fmt "float" (dsv4-float: F32 P.scale, E8M0 FP4 expert scales): the same refusals on
 * their own layouts; each edit keeps the tensor's byte count */
#define SX0 "layers.0.ffn.shared_experts."
static void dsv41_float_rules(void **s)
{
    (void)s;
    /* a scale of the wrong dtype */
    refuse("dsv41-tiny", E({A0 "wo_a.scale", NULL, "I8", 0, {0}}), NULL, S(A0 "wo_a.scale", "I8", "F8_E8M0 or U8"));
    refuse("dsv4-float", E({A0 "wq_a.scale", NULL, "I32", 0, {0}}), NULL, S(A0 "wq_a.scale", "I32", "F32"));
    refuse("dsv4-float", E({SX0 "w1.scale", NULL, "F8_E8M0", 1, {4}}), NULL, S(SX0 "w1.scale", "F8_E8M0"));
    refuse("dsv4-float", E({X0 "w1.scale", NULL, "F32", 2, {64, 2}}), NULL, S(X0 "w1.scale", "F32"));
    /* a scale of the wrong shape or count (the grid of the config's block) */
    refuse("dsv41-tiny", E({A0 "wq_a.scale", NULL, NULL, 2, {8, 7}}), NULL, S(A0 "wq_a.scale", "[8, 7]", "[7, 8]"));
    refuse("dsv41-tiny", E({A0 "wq_b.scale", NULL, NULL, 1, {35}}), NULL, S(A0 "wq_b.scale", "[35]"));
    refuse("dsv4-float", E({A0 "wq_b.scale", NULL, NULL, 2, {4, 1}}), NULL, S(A0 "wq_b.scale", "[4, 1]", "[2, 2]"));
    refuse("dsv41-tiny", E({X0 "w2.scale", NULL, NULL, 2, {128, 4}}), NULL, S(X0 "w2.scale", "[128, 4]", "[256, 2]"));
    /* the config disagrees with the tensors */
    refuse("dsv41-tiny", NULL, S("weight_block_size=[128, 128]"), S(".scale\"", "weight_block_size [128, 128]"));
    refuse("dsv41-tiny", NULL, S("expert_dtype=\"fp8\""), S("expert_dtype"));
    refuse("dsv41-tiny", NULL, S("scale_fmt=\"float\""), S(".scale\"", "expected F32"));
    refuse("dsv4-float", NULL, S("scale_fmt=\"ue8m0\""), S(".scale\"", "F32"));
    refuse("dsv4-float", NULL, S("weight_block_size=[32, 32]"), S(".scale\"", "weight_block_size [32, 32]"));
    /* two formats' scales on one weight: V3's weight_scale_inv (an F32 tensor renamed) beside V4's scale */
    refuse("dsv41-tiny", E({"layers.0.attn.attn_sink", A0 "wq_a.weight_scale_inv", NULL, 0, {0}}), NULL,
           S(A0 "wq_a.weight_scale_inv"));
    refuse("dsv4-float", E({"layers.0.attn.attn_sink", SX0 "w1.weight_scale_inv", NULL, 0, {0}}), NULL,
           S(SX0 "w1.weight_scale_inv"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(formats_all_world_sizes),
        cmocka_unit_test(formats_levels_identical),
        cmocka_unit_test(formats_dropped_listed),
        cmocka_unit_test(formats_summary_counts),
        cmocka_unit_test(refuse_fp8_block),
        cmocka_unit_test(fp8_fused_rules),
        cmocka_unit_test(fp8_fused_tensor_rules),
        cmocka_unit_test(refuse_ct_fp8),
        cmocka_unit_test(refuse_int4),
        cmocka_unit_test(refuse_nvfp4),
        cmocka_unit_test(fp8_tensor_rules),
        cmocka_unit_test(fp8_tensor_dropped),
        cmocka_unit_test(refuse_ctmx),
        cmocka_unit_test(refuse_ctmx6),
        cmocka_unit_test(ct_mixed_matching),
        cmocka_unit_test(dsv4_rules),
        cmocka_unit_test(dsv41_float_rules),
        cmocka_unit_test(quark_rules),
        cmocka_unit_test(woq_other_writers),
        cmocka_unit_test(refuse_woq),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
