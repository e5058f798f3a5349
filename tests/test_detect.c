/*
 * Know what you read: the edge cases of the quantization
 * verdict (src/formats/refuse.c and the formats' .methods / detect()), run through
 * bfs_inspect on small checkpoints written here: quantization_config null or not an
 * object, quant_method missing, of another type or in other case, bitsandbytes with
 * load_in_8bit or without load_in_4bit, quantize_config.json, a claim the tensors
 * contradict, and the tensor rules (FP8, quantizer names, integer + scale, integer
 * weights) beside plain integer and float tensors that must pass; config_groups in
 * time linear in their number.
 * The real-layout corpus is tests/test_refuse.c.
 */
#include "testutil.h"
#include "bfshard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *tmp;

static int setup(void **s)
{
    (void)s;
    tmp = tu_tmpdir("detect");
    return tmp ? 0 : -1;
}

static int teardown(void **s)
{
    (void)s;
    tu_rmrf(tmp);
    free(tmp);
    return 0;
}

static size_t dt_size(const char *dt)
{
    if (!strcmp(dt, "BOOL") || !strcmp(dt, "U8") || !strcmp(dt, "I8") || !strncmp(dt, "F8_", 3))
        return 1;
    if (!strcmp(dt, "U16") || !strcmp(dt, "I16") || !strcmp(dt, "F16") || !strcmp(dt, "BF16"))
        return 2;
    if (!strcmp(dt, "U32") || !strcmp(dt, "I32") || !strcmp(dt, "F32"))
        return 4;
    return 8;
}

/* A fresh input directory tmp/NAME: model.safetensors holding the tensors "name DTYPE
 * d0xd1..." (zero bytes; NULL-terminated list) and, unless NULL, config.json = config. */
static const char *mk(const char *name, const char *const *tensors, const char *config)
{
    static char dir[4096];
    char path[4096 + 64], hdr[8192];
    size_t k = 0;
    uint64_t pos = 0;
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    assert_int_equal(tu_sh("rm -rf '%s' && mkdir -p '%s'", dir, dir), 0);
    k += (size_t)snprintf(hdr + k, sizeof hdr - k, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (const char *const *t = tensors; *t; t++) {
        char nm[256], dt[16], dims[64];
        assert_int_equal(sscanf(*t, "%255s %15s %63s", nm, dt, dims), 3);
        uint64_t n = 1;
        char shape[128] = "";
        size_t sk = 0;
        for (char *save = NULL, *d = strtok_r(dims, "x", &save); d; d = strtok_r(NULL, "x", &save)) {
            if (!strcmp(d, "-"))
                break; /* a scalar */
            n *= strtoull(d, NULL, 10);
            sk += (size_t)snprintf(shape + sk, sizeof shape - sk, "%s%s", sk ? "," : "", d);
        }
        const uint64_t nb = n * dt_size(dt);
        k += (size_t)snprintf(hdr + k, sizeof hdr - k, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}",
                              nm, dt, shape, (unsigned long long)pos, (unsigned long long)(pos + nb));
        pos += nb;
    }
    k += (size_t)snprintf(hdr + k, sizeof hdr - k, "}");
    while (k % 8)
        hdr[k++] = ' ';
    const size_t total = 8 + k + (size_t)pos;
    uint8_t *buf = calloc(1, total);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)k >> (8 * i));
    memcpy(buf + 8, hdr, k);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(tu_write_file(path, buf, total), 0);
    free(buf);
    if (config) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        assert_int_equal(tu_write_file(path, config, strlen(config)), 0);
    }
    return dir;
}

/* A copy of fixture fx's weights as tmp/NAME with config.json = config. */
static const char *mk_fixture(const char *name, const char *fx, const char *config)
{
    static char dir[4096];
    char path[4096 + 64];
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    assert_int_equal(tu_sh("rm -rf '%s' && mkdir -p '%s' && cp fixtures/%s/*.safetensors* '%s/'", dir, dir, fx, dir), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(tu_write_file(path, config, strlen(config)), 0);
    return dir;
}

/* bfs_inspect(dir): expect rc; on failure the message names every '|'-separated word
 * and is one line. */
static void expect(const char *dir, int rc, const char *words)
{
    FILE *devnull = fopen("/dev/null", "w");
    assert_non_null(devnull);
    const int got = bfs_inspect(dir, NULL, 0, devnull);
    fclose(devnull);
    const char *msg = bfs_last_error();
    if (got != rc)
        fail_msg("%s: bfs_inspect returned %d, expected %d: %s", dir, got, rc, msg);
    if (rc == 0)
        return;
    assert_null(strchr(msg, '\n'));
    char buf[512], *save = NULL;
    snprintf(buf, sizeof buf, "%s", words);
    for (char *w = strtok_r(buf, "|", &save); w; w = strtok_r(NULL, "|", &save))
        if (!strstr(msg, w))
            fail_msg("%s: the message does not name \"%s\": %s", dir, w, msg);
}

static const char *const plain[] = {"model.embed_tokens.weight BF16 8x4", "model.norm.weight F32 4", NULL};

static void qconfig_null_is_no_claim(void **s)
{
    (void)s;
    expect(mk("null", plain, "{\"quantization_config\": null}"), 0, NULL);
    /* null claims nothing, so the tensors decide */
    const char *const q[] = {"a.qweight I32 4x2", "a.scales F16 1x8", "b.weight BF16 2x2", NULL};
    expect(mk("null-qweight", q, "{\"quantization_config\": null}"), BFS_EINPUT, "a.qweight|GPTQ/AWQ|bfshard converts: ");
}

static void qconfig_malformed(void **s)
{
    (void)s;
    expect(mk("str", plain, "{\"quantization_config\": \"bnb\"}"), BFS_EINPUT, "config.json|not a JSON object");
    expect(mk("arr", plain, "{\"quantization_config\": []}"), BFS_EINPUT, "not a JSON object");
    expect(mk("nomethod", plain, "{\"quantization_config\": {\"bits\": 4}}"), BFS_EINPUT, "no quant_method");
    expect(mk("empty", plain, "{\"quantization_config\": {}}"), BFS_EINPUT, "no quant_method");
    expect(mk("num", plain, "{\"quantization_config\": {\"quant_method\": 4}}"), BFS_EINPUT, "not a string");
    expect(mk("nullm", plain, "{\"quantization_config\": {\"quant_method\": null}}"), BFS_EINPUT, "not a string");
    /* a method read from a file is printed escaped, on one line */
    expect(mk("esc", plain, "{\"quantization_config\": {\"quant_method\": \"a\\nb\\\"c\"}}"), BFS_EINPUT,
           "\"a\\nb\\\"c\"|not supported|mxfp4 (gpt-oss)|bitsandbytes 4-bit");
}

static void method_case(void **s)
{
    (void)s;
    expect(mk_fixture("MXFP4", "mxfp4-tiny", "{\"quantization_config\": {\"quant_method\": \"MXFP4\"}}"), 0, NULL);
    expect(mk_fixture("BnB", "bnb-nf4", "{\"quantization_config\": {\"quant_method\": \"BitsAndBytes\", \"load_in_4bit\": true}}"),
           0, NULL);
    expect(mk("AWQ", plain, "{\"quantization_config\": {\"quant_method\": \"AWQ\"}}"), BFS_EINPUT, "\"AWQ\"|no tensor");
    /* GPTQ and AWQ GEMM convert; these are still refused, each named */
    expect(mk("hqq", plain, "{\"quantization_config\": {\"quant_method\": \"hqq\"}}"), BFS_EINPUT, "\"hqq\"|not supported");
    expect(mk("eetq", plain, "{\"quantization_config\": {\"quant_method\": \"eetq\"}}"), BFS_EINPUT, "\"eetq\"|not supported");
    expect(mk("exl2", plain, "{\"quantization_config\": {\"quant_method\": \"exl2\"}}"), BFS_EINPUT, "\"exl2\"|not supported");
    expect(mk("gguf", plain, "{\"quantization_config\": {\"quant_method\": \"gguf\"}}"), BFS_EINPUT, "\"gguf\"|not supported");
    expect(mk("marlin", plain, "{\"quantization_config\": {\"quant_method\": \"gptq\", \"checkpoint_format\": \"marlin\"}}"), BFS_EINPUT,
           "Marlin|checkpoint_format \"marlin\"");
    expect(mk("marlin2", plain, "{\"quantization_config\": {\"quant_method\": \"gptq\", \"is_marlin_format\": true}}"), BFS_EINPUT,
           "Marlin|is_marlin_format");
    expect(mk("gptq_p", plain, "{\"quantization_config\": {\"quant_method\": \"gptq\", \"format\": \"gptq_p\"}}"), BFS_EINPUT,
           "\"gptq_p\"|not supported");
    expect(mk("gemv_fast", plain, "{\"quantization_config\": {\"quant_method\": \"awq\", \"version\": \"gemv_fast\"}}"), BFS_EINPUT,
           "\"gemv_fast\"|not supported|interleaved int16");
    expect(mk("awq8", plain, "{\"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 8}}"), BFS_EINPUT, "bits 8");
    expect(mk("gptq5", plain, "{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 5}}"), BFS_EINPUT, "bits 5");
    /* not a prefix, not a near miss */
    expect(mk("mx", plain, "{\"quantization_config\": {\"quant_method\": \"mxfp4 \"}}"), BFS_EINPUT, "not supported");
    expect(mk("bnb8", plain, "{\"quantization_config\": {\"quant_method\": \"bitsandbytes_8bit\"}}"), BFS_EINPUT,
           "bitsandbytes_8bit");
}

static void bnb_fields(void **s)
{
    (void)s;
    /* the tensors are valid NF4; the config says they mean something else */
    expect(mk_fixture("int8", "bnb-nf4",
                      "{\"quantization_config\": {\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true, \"load_in_8bit\": true}}"),
           BFS_EINPUT, "load_in_8bit|config.json");
    expect(mk_fixture("int8p", "bnb-nf4",
                      "{\"quantization_config\": {\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true, \"_load_in_8bit\": true}}"),
           BFS_EINPUT, "load_in_8bit");
    expect(mk_fixture("no4", "bnb-nf4", "{\"quantization_config\": {\"quant_method\": \"bitsandbytes\"}}"), BFS_EINPUT,
           "load_in_4bit");
    expect(mk_fixture("str4", "bnb-nf4", "{\"quantization_config\": {\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": \"true\"}}"),
           BFS_EINPUT, "load_in_4bit");
    expect(mk_fixture("qt", "bnb-nf4",
                      "{\"quantization_config\": {\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true, \"bnb_4bit_quant_type\": \"int4\"}}"),
           BFS_EINPUT, "bnb_4bit_quant_type");
    /* from before quant_method: transformers reads load_in_4bit as bitsandbytes */
    expect(mk_fixture("legacy4", "bnb-nf4", "{\"quantization_config\": {\"load_in_4bit\": true}}"), 0, NULL);
    expect(mk_fixture("legacy8", "bnb-nf4", "{\"quantization_config\": {\"load_in_8bit\": true}}"), BFS_EINPUT,
           "load_in_8bit");
    expect(mk_fixture("ok", "bnb-nf4",
                      "{\"quantization_config\": {\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true, \"load_in_8bit\": false, \"bnb_4bit_quant_type\": \"nf4\"}}"),
           0, NULL);
}

static void claim_contradicted(void **s)
{
    (void)s;
    /* config mxfp4, tensors bitsandbytes 4-bit: one of them is wrong */
    expect(mk_fixture("mx-bnb", "bnb-nf4", "{\"quantization_config\": {\"quant_method\": \"mxfp4\"}}"), BFS_EINPUT,
           "bitsandbytes layout|mxfp4");
    expect(mk_fixture("bnb-mx", "mxfp4-tiny", "{\"quantization_config\": {\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true}}"),
           BFS_EINPUT, "mxfp4 layout|bitsandbytes");
    expect(mk("mx-plain", plain, "{\"quantization_config\": {\"quant_method\": \"mxfp4\"}}"), BFS_EINPUT, "no tensor|_blocks");
    /* no claim: the self-describing formats still convert */
    expect(mk_fixture("bnb-none", "bnb-nf4", "{}"), 0, NULL);
    expect(mk_fixture("mx-none", "mxfp4-tiny", "{\"model_type\": \"gpt_oss\"}"), 0, NULL);
}

static void quantize_config_json(void **s)
{
    (void)s;
    char p[4096 + 64];
    const char *d = mk("qcfg", plain, "{\"model_type\": \"llama\"}");
    snprintf(p, sizeof p, "%s/quantize_config.json", d);
    assert_int_equal(tu_write_file(p, "{\"bits\": 4, \"group_size\": 128}", 30), 0);
    expect(d, BFS_EINPUT, "quantize_config.json|\"gptq\"|no tensor");
    assert_int_equal(tu_write_file(p, "{\"bits\": 4, \"quant_method\": \"awq\"}", 34), 0);
    expect(d, BFS_EINPUT, "quantize_config.json|\"awq\"");
    assert_int_equal(tu_write_file(p, "{\"bits\": 4,", 11), 0);
    expect(d, BFS_EINPUT, "quantize_config.json|not valid JSON");
    /* config.json's quantization_config is what transformers reads: it wins */
    d = mk_fixture("qcfg-bnb", "bnb-nf4", "{\"quantization_config\": {\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true}}");
    snprintf(p, sizeof p, "%s/quantize_config.json", d);
    assert_int_equal(tu_write_file(p, "{\"bits\": 4}", 11), 0);
    expect(d, 0, NULL);
    /* without config.json at all, and a single file given as INPUT */
    d = mk("qcfg-only", plain, NULL);
    snprintf(p, sizeof p, "%s/quantize_config.json", d);
    assert_int_equal(tu_write_file(p, "{\"bits\": 4}", 11), 0);
    expect(d, BFS_EINPUT, "quantize_config.json");
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    expect(p, BFS_EINPUT, "quantize_config.json");
}

static void tensor_rules(void **s)
{
    (void)s;
    const char *const ok[] = {"position_ids I64 1x16", "token_type_ids I32 1x16", "mask U8 4x4", "causal BOOL 4x4",
                              "logit_scale F32 -", "layer.scale BF16 4", "vision.layer_scale1.lambda1 F32 4",
                              "conv.parametrizations.weight.original0 F32 1x1x4",
                              "conv.parametrizations.weight.original1 F32 4x1x4", "lm_head.weight BF16 8x4",
                              "num_batches_tracked I64 -", "bn.weight F32 4", "bn.num_batches_tracked I64 -", NULL};
    expect(mk("ok", ok, "{}"), 0, NULL);
    expect(mk("ok-noconfig", ok, NULL), 0, NULL);

    const char *const f8[] = {"a.bias F8_E5M2 4", "a.weight BF16 4x4", NULL};
    expect(mk("f8", f8, "{}"), BFS_EINPUT, "a.bias|F8_E5M2|bfshard converts: ");
    const char *const i8w[] = {"a.weight I8 4x4", NULL};
    expect(mk("i8w", i8w, "{}"), BFS_EINPUT, "a.weight|integer (I8) weight");
    const char *const scaled[] = {"a.codes I32 4x4", "a.scales F16 4", NULL};
    expect(mk("scaled", scaled, "{}"), BFS_EINPUT, "a.codes|beside the scale/zero tensor \"a.scales\"");
    const char *const wscale[] = {"q.w U8 4x4", "q.w_scale F32 1", NULL};
    expect(mk("wscale", wscale, "{}"), BFS_EINPUT, "q.w|\"q.w_scale\"");
    const char *const zp[] = {"top I16 4", "top_zero_point I16 1", NULL};
    expect(mk("zp", zp, "{}"), BFS_EINPUT, "\"top_zero_point\"");
    const char *const piece[] = {"a.weight.bitmask U8 4x1", "a.weight.compressed BF16 8", NULL};
    expect(mk("piece", piece, "{}"), BFS_EINPUT, "a.weight.bitmask|integer");
    const char *const wq[] = {"m.W_q U8 2x4", "m.meta F32 2", NULL};
    expect(mk("wq", wq, "{}"), BFS_EINPUT, "m.W_q|HQQ");
    const char *const inv[] = {"m.weight BF16 4x4", "m.weight_scale_inv F32 1x1", NULL};
    expect(mk("inv", inv, "{}"), BFS_EINPUT, "m.weight_scale_inv|block-FP8");
    /* float companions of a float weight are no evidence: a plain "scale" passes */
    const char *const fl[] = {"m.weight BF16 4x4", "m.weight_scale F32 1", "m.scales F32 4", NULL};
    expect(mk("fl", fl, "{}"), 0, NULL);
}

static void config_before_tensors(void **s)
{
    (void)s;
    /* the method is named even when tensors would be refused too (quant_method "fp8" without
     * weight_block_size is per-tensor FP8, docs/FORMATS.md 7.1; E8M0 block scales are not converted) */
    const char *const f8[] = {"a.weight F8_E4M3 4x4", "a.weight_scale F32 1", NULL};
    expect(mk("cfg-first", f8, "{\"quantization_config\": {\"quant_method\": \"fp8\", \"scale_fmt\": \"ue8m0\"}}"),
           BFS_EINPUT, "\"fp8\"|not supported");
}

/* config_groups are walked in order, not each found again from the first: 200000 groups
 * (a 7 MB config.json, well under the 64 MiB limit) before a weight's real group took
 * about 40 minutes when they were (found by writing fuzz_claim); now about a
 * second. `timeout 60` is the bound; the time is not asserted. */
static void many_config_groups_linear(void **s)
{
    (void)s;
    char dir[4096], f[4200];
    snprintf(dir, sizeof dir, "%s/groups", tmp);
    assert_int_equal(tu_sh("mkdir -p '%s' && cp fixtures/ct-int4-group/model.safetensors '%s/'", dir, dir), 0);
    snprintf(f, sizeof f, "%s/config.json", dir);
    FILE *fp = fopen(f, "w");
    assert_non_null(fp);
    fputs("{\"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", "
          "\"config_groups\": {", fp);
    for (int i = 0; i < 200000; i++)
        fprintf(fp, "\"pad%d\": {\"format\": \"x\", \"weights\": {}}, ", i);
    fputs("\"group_0\": {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"int\", \"strategy\": \"group\", "
          "\"group_size\": 12, \"symmetric\": true}}}}}", fp);
    assert_int_equal(fclose(fp), 0);
    const double t0 = tu_now_s();
    assert_int_equal(tu_sh("timeout 60 %s inspect '%s' >/dev/null", tu_bfshard(), dir), 0);
    fprintf(stderr, "  200000 config groups planned in %.2f s\n", tu_now_s() - t0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(qconfig_null_is_no_claim),
        cmocka_unit_test(qconfig_malformed),
        cmocka_unit_test(method_case),
        cmocka_unit_test(bnb_fields),
        cmocka_unit_test(claim_contradicted),
        cmocka_unit_test(quantize_config_json),
        cmocka_unit_test(tensor_rules),
        cmocka_unit_test(config_before_tensors),
        cmocka_unit_test(many_config_groups_linear),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
