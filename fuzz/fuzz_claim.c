/*
 * Fuzz target: what config.json and quantize_config.json claim about a real checkpoint.
 * The claim and its verdict (src/formats/claim.c: bfs__quant_claim,
 * bfs__quant_check_groups), every format's detect() and the fields its claim() reads
 * from quantization_config (block sizes, config groups, symmetry, algorithms), through
 * bfs__input_open + bfs__plan_tensors over a fixture's weights (fz_claim_fixtures[],
 * symbolic links in a scratch directory) with the fuzzed files beside them; then the
 * whole plan is exercised (fuzz_common.c: headers re-read, every piece dequantized from
 * exact-size copies of its sources, so a block size from the config that makes a kernel
 * read past a tensor is an ASan report).
 *
 * Input: 1 selector byte + config.json [+ "\n--bfs--\n" + quantize_config.json].
 *   bits 0-3  the checkpoint (fz_claim_fixtures[])
 *   bit 4     no config.json (only quantize_config.json, when given)
 *   bit 5     --world-size 3 (else 1)
 *   bit 6     also bfs_inspect the directory
 *   bit 7     the best CPU kernels (else scalar)
 * Properties (abort when broken):
 *   - a refusal: a BFS_E* code and one line saying why (fz_check_error);
 *   - an accepted plan agrees with the claim, as read here independently: with a
 *     quant_method (config.json's quantization_config, else quantize_config.json; an
 *     absent one is "bitsandbytes" when load_in_4bit/8bit is true, "gptq" in a
 *     quantize_config.json), at least one tensor is in a format that lists it and no
 *     tensor is in a quantized format that does not; with no claim, only formats whose
 *     tensors identify them alone (.claim_optional) took any.
 */
#include "fuzz_common.h"
#include "formats/format.h"

#include <dirent.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define FZ_SEP "\n--bfs--\n"

static const char *const fz_claim_fixtures[16] = {
    "bnb-nf4",         "bnb-nf4-dq",     "bnb-fp4",    "ct-fp8-block", "ct-fp8-channel",           "ct-fp8-tensor",
    "ct-int4-asym",    "ct-int4-group",  "ct-moe-mixed", "ct-nvfp4",   "fp8-block",                "fp8-block-split",
    "modelopt-nvfp4",  "mxfp4-tiny",     "refuse/gptq-noconfig",       "refuse/ok-int-tensors",
};
static char fz_cdir[16][512];
static FILE *fzc_devnull;

/* a scratch directory per checkpoint: links to its weights and index, nothing else */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    for (int k = 0; k < 16; k++) {
        char src[PATH_MAX], from[PATH_MAX + 300], to[PATH_MAX + 300];
        fz_fixture(fz_claim_fixtures[k], src, sizeof src);
        snprintf(fz_cdir[k], sizeof fz_cdir[k], "%s/claim%d", fz_dir(), k);
        fz_rmrf(fz_cdir[k]);
        if (mkdir(fz_cdir[k], 0755) != 0)
            abort();
        DIR *d = opendir(src);
        struct dirent *e;
        if (!d)
            abort();
        while ((e = readdir(d)) != NULL) {
            const size_t n = strlen(e->d_name);
            if ((n > 12 && !strcmp(e->d_name + n - 12, ".safetensors")) || !strcmp(e->d_name, "model.safetensors.index.json")) {
                snprintf(from, sizeof from, "%s/%s", src, e->d_name);
                snprintf(to, sizeof to, "%s/%s", fz_cdir[k], e->d_name);
                if (symlink(from, to) != 0)
                    abort();
            }
        }
        closedir(d);
    }
    if (!(fzc_devnull = fopen("/dev/null", "w")))
        abort();
    return 0;
}

/* ---- the claim, read here without the library ------------------------------------------ */
/* m (len bytes) is listed by f, ignoring ASCII case */
static bool fz_lists(const bfs_format *f, const char *m, size_t len)
{
    for (const char *const *k = f->methods; m && k && *k; k++)
        if (strlen(*k) == len && strncasecmp(*k, m, len) == 0)
            return true;
    return false;
}

/* the claimed method (NULL: none) and its length; *claimed: some claim is there */
static const char *fz_method(const uint8_t *cfg, size_t cl, bool have_cfg, const uint8_t *qf, size_t ql, bool have_qf,
                             size_t *len, json_t **keep)
{
    json_t *c = have_cfg ? json_loadb((const char *)cfg, cl, 0, NULL) : NULL, *q = json_object_get(c, "quantization_config");
    bool from_file = false;
    *keep = NULL;
    if (json_is_null(q))
        q = NULL;
    if (q)
        *keep = json_incref(q);
    json_decref(c);
    if (!q && have_qf) {
        *keep = q = json_loadb((const char *)qf, ql, 0, NULL);
        from_file = true;
    }
    if (!q)
        return NULL;
    const json_t *m = json_object_get(q, "quant_method");
    if (json_is_string(m)) {
        *len = json_string_length(m);
        return json_string_value(m);
    }
    if (!m && (json_is_true(json_object_get(q, "load_in_4bit")) || json_is_true(json_object_get(q, "load_in_8bit")))) {
        *len = strlen("bitsandbytes");
        return "bitsandbytes";
    }
    if (!m && from_file) {
        *len = strlen("gptq");
        return "gptq";
    }
    return NULL; /* refused by the library */
}

static void fz_check_verdict(const bfs_plan *p, const char *m, size_t len)
{
    size_t took = 0;
    for (size_t i = 0; i < p->nt; i++) {
        const bfs_format *f = bfs__format_of(p->t[i].kind);
        if (!f || !f->methods)
            continue;
        if (m ? !fz_lists(f, m, len) : !f->claim_optional) {
            fprintf(stderr, "fuzz: tensor \"%s\" planned as %s, but the config claims \"%.*s\"\n", p->t[i].name, f->name,
                    m ? (int)len : 6, m ? m : "(none)");
            abort();
        }
        took++;
    }
    if (m && took == 0) {
        fprintf(stderr, "fuzz: the config claims \"%.*s\", but no tensor is in its layout and the plan was accepted\n",
                (int)len, m);
        abort();
    }
}

static void fz_put(const char *dir, const char *name, const uint8_t *b, size_t n, bool have)
{
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    unlink(p);
    if (have)
        fz_write(p, b, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (!fzc_devnull) {
        int argc = 0;
        char **argv = NULL;
        LLVMFuzzerInitialize(&argc, &argv);
    }
    const uint8_t sel = data[0];
    const char *dir = fz_cdir[sel & 15];
    const uint8_t *cfg = data + 1, *qf = NULL, *end = data + size;
    const uint8_t *s = memmem(cfg, (size_t)(end - cfg), FZ_SEP, strlen(FZ_SEP));
    const size_t cl = s ? (size_t)(s - cfg) : (size_t)(end - cfg);
    size_t ql = 0;
    if (s) {
        qf = s + strlen(FZ_SEP);
        ql = (size_t)(end - qf);
    }
    const bool have_cfg = !(sel & 16), have_qf = qf != NULL;
    fz_put(dir, "config.json", cfg, cl, have_cfg);
    fz_put(dir, "quantize_config.json", qf, ql, have_qf);

    fz_opts o;
    memset(&o, 0, sizeof o);
    o.world_size = (sel & 32) ? 3 : 1;
    o.layout = BFS_LAYOUT_DCP;
    o.mxfp4_layout = BFS_MXFP4_HF;
    o.cpu_level = (sel & 128) ? -1 : BFS_CPU_SCALAR;

    bfs_input *in = NULL;
    bfs__err_clear();
    int rc = bfs__input_open(dir, &in);
    if (rc != 0) {
        fz_check_error(rc, "bfs__input_open");
        return 0;
    }
    fz_isolate(in);
    bfs_convert_opts co;
    bfs_convert_opts_init(&co);
    co.world_size = o.world_size;
    bfs_plan *p = NULL;
    bfs__err_clear();
    rc = bfs__plan_tensors(in, &co, &p);
    if (rc != 0) {
        fz_check_error(rc, "bfs__plan_tensors");
    } else {
        size_t len = 0;
        json_t *keep = NULL;
        const char *m = fz_method(cfg, cl, have_cfg, qf, ql, have_qf, &len, &keep);
        fz_check_verdict(p, m, len);
        json_decref(keep);
        bfs__plan_free(p);
        fz_exercise(in, &o);
    }
    fz_release(in);
    bfs__input_free(in);
    if (sel & 64) {
        bfs__err_clear();
        rc = bfs_inspect(dir, &co, 0, fzc_devnull);
        if (rc != 0)
            fz_check_error(rc, "bfs_inspect");
    }
    return 0;
}
