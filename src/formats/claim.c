/*
 * Know what you read, before any tensor is planned: the input's quantization
 * claim and the verdict on it, the check that the tensors match the claim, and the list
 * of what bfshard converts that every refusal ends with (bfs__supported_list: the planner
 * puts it in bfs_fctx.supported, so that the table's rows need not call back here). Every
 * refusal is BFS_EINPUT (exit 3), one line naming the file and the method or tensor.
 * Uses the table (table.c); no row of the table calls this file.
 *
 * The claim (bfs__quant_claim): config.json's "quantization_config" (absent or
 * JSON null: no claim); without one, a quantize_config.json beside the weights
 * (AutoGPTQ) is the claim. Its quant_method (ASCII case ignored; "bitsandbytes"
 * when absent and load_in_4bit/load_in_8bit is true, as transformers reads it;
 * "gptq" for a quantize_config.json without one) must be listed in the .methods of
 * a format of the table, else it is refused; that format's detect() then checks
 * the claim's fields (bnb4: load_in_4bit, not load_in_8bit).
 *
 * The groups (bfs__quant_check_groups, after pass 1): the claimed format took at
 * least one tensor; no other quantized format took one; with no claim, only a
 * format whose tensors identify it alone (.claim_optional: MXFP4 pairs,
 * bitsandbytes quant_state blobs) may take any; under compressed-tensors, every config group
 * matches some module (ctmatch.c, which this file also sets up: bfs_fctx.ctm).
 */
#include "format.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define BFS_QCFG_NAME "quantize_config.json"
#define BFS_QCFG_MAX (1u << 20)

void bfs__supported_list(char *buf, size_t cap)
{
    size_t k = 0;
    buf[0] = '\0';
    for (const bfs_format *const *f = bfs__formats; *f && k < cap; f++)
        if ((*f)->supports)
            k += (size_t)snprintf(buf + k, cap - k, "%s%s", k ? ", " : "", (*f)->supports);
    if (k < cap)
        snprintf(buf + k, cap - k, "%sunquantized checkpoints", k ? " and " : "");
}

static bool bfs__json_true(const json_t *o, const char *key) { return json_is_true(json_object_get(o, key)); }

/* quantize_config.json beside the weights: *out parsed (an object) or NULL when absent. */
static int bfs__qcfg_read(const char *path, json_t **out)
{
    int rc = 0;
    char *text = NULL;
    size_t len = 0;
    json_error_t jerr;
    *out = NULL;
    if (access(path, F_OK) != 0 && errno != ELOOP)
        return 0;
    BFS_TRY(bfs__read_small_file(path, BFS_QCFG_MAX, &text, &len));
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!*out)
        BFS_FAIL(BFS_EINPUT, "%s: not valid JSON at line %d column %d (%s), and a quantize_config.json says the checkpoint is quantized",
                 path, jerr.line, jerr.column, jerr.text);
cleanup:
    free(text);
    return rc;
}

void bfs__qclaim_free(bfs_qclaim *own)
{
    json_decref(own->file);
    free(own->source);
    bfs__ctmatch_free(own->ctm);
    own->file = NULL;
    own->source = NULL;
    own->ctm = NULL;
}

int bfs__quant_claim(bfs_fctx *c, bfs_qclaim *own)
{
    int rc = 0;
    char sup[1024], m[72]; /* the method, escaped and cut (bfs__esc) */
    const json_t *q = c->config ? json_object_get(c->config, "quantization_config") : NULL;
    const char *what = "quantization_config";
    own->file = NULL;
    own->source = NULL;
    own->ctm = NULL;
    c->ctm = NULL;
    c->qconfig = NULL;
    c->qsource = NULL;
    c->method = NULL;
    c->claim = NULL;
    bfs__supported_list(sup, sizeof sup);
    if (json_is_null(q))
        q = NULL; /* "quantization_config": null claims nothing: the tensors decide */
    own->source = bfs__path_join(c->in->root, q ? "config.json" : BFS_QCFG_NAME);
    if (!own->source)
        return bfs__err(BFS_ENOMEM, "out of memory");
    if (!q) {
        BFS_TRY(bfs__qcfg_read(own->source, &own->file));
        q = own->file;
        what = "quantize_config.json";
    }
    if (!q)
        return 0;
    c->qsource = own->source;
    if (!json_is_object(q))
        BFS_FAIL(BFS_EINPUT, "%s: %s is not a JSON object, so what the checkpoint is quantized with is unknown (bfshard converts: %s)",
                 c->qsource, what, sup);
    c->qconfig = q;
    const json_t *jm = json_object_get(q, "quant_method");
    if (!jm && (bfs__json_true(q, "load_in_4bit") || bfs__json_true(q, "load_in_8bit")))
        c->method = "bitsandbytes"; /* transformers' reading of a config from before quant_method */
    else if (!jm && own->file)
        c->method = "gptq"; /* AutoGPTQ's quantize_config.json names no method */
    else if (!jm)
        BFS_FAIL(BFS_EINPUT, "%s: %s has no quant_method, so what the checkpoint is quantized with is unknown (bfshard converts: %s)",
                 c->qsource, what, sup);
    else if (!json_is_string(jm))
        BFS_FAIL(BFS_EINPUT, "%s: %s.quant_method is not a string (bfshard converts: %s)", c->qsource, what, sup);
    else
        c->method = json_string_value(jm);
    for (const bfs_format *const *f = bfs__formats; *f && !c->claim; f++)
        for (const char *const *k = (*f)->methods; k && *k && !c->claim; k++)
            if (strcasecmp(*k, c->method) == 0)
                c->claim = *f;
    bfs__esc(c->method, m, sizeof m);
    if (!c->claim)
        BFS_FAIL(BFS_EINPUT, "%s: %s \"%s\"%s is not supported (bfshard converts: %s)", c->qsource,
                 own->file ? "quant_method" : "quantization_config.quant_method", m,
                 !jm && own->file ? " (no quant_method: AutoGPTQ's quantize_config.json)" : "", sup);
    if (strcasecmp(c->method, "compressed-tensors") == 0) { /* which group quantizes which module */
        BFS_TRY(bfs__ctmatch_new(c, &own->ctm));
        c->ctm = own->ctm;
    }
cleanup:
    return rc;
}

/* f lists method m (ASCII case ignored): a method may have several formats, one per
 * tensor layout it writes (compressed-tensors: fp8, int4, nvfp4; modelopt: fp8, nvfp4);
 * c->claim is the first of them in the table. */
static bool bfs__lists(const bfs_format *f, const char *m)
{
    for (const char *const *k = f->methods; m && k && *k; k++)
        if (strcasecmp(*k, m) == 0)
            return true;
    return false;
}

int bfs__quant_check_groups(const bfs_fctx *c, const bfs_ltensor *t, size_t nt)
{
    char sup[1024], m[72]; /* the method, escaped and cut (bfs__esc) */
    size_t took = 0;
    bfs__supported_list(sup, sizeof sup);
    bfs__esc(c->method ? c->method : "", m, sizeof m);
    for (size_t i = 0; i < nt; i++) {
        const bfs_format *f = t[i].by ? t[i].by : bfs__format_of(t[i].kind);
        if (!f || !f->methods)
            continue; /* passthrough */
        if (f == c->claim || (c->claim && bfs__lists(f, c->method))) {
            took++;
            continue;
        }
        const bfs_raw *r = t[i].src[0];
        if (c->claim)
            return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): in %s layout, but %s claims quant_method \"%s\"; refusing a checkpoint that contradicts its config",
                            bfs__raw_path(c->in, r), r->st->name, (unsigned long long)r->file_offset, f->methods[0],
                            c->qsource, m);
        if (!f->claim_optional)
            return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): in %s layout, but no quantization_config in config.json says so; refusing to guess (bfshard converts: %s)",
                            bfs__raw_path(c->in, r), r->st->name, (unsigned long long)r->file_offset, f->methods[0], sup);
    }
    if (c->claim && took == 0) {
        char lay[512];
        size_t k = 0;
        lay[0] = '\0';
        for (const bfs_format *const *f = bfs__formats; *f && k < sizeof lay; f++)
            if (bfs__lists(*f, c->method))
                k += (size_t)snprintf(lay + k, sizeof lay - k, "%s%s", k ? "; or " : "", (*f)->layout ? (*f)->layout : (*f)->name);
        return bfs__err(BFS_EINPUT, "%s: quant_method \"%s\", but no tensor is in its layout (%s); refusing to pass the tensors through as if unquantized",
                        c->qsource, m, lay);
    }
    return bfs__ct_groups_used(c); /* compressed-tensors: no config group without a module */
}
