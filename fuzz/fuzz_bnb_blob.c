/*
 * Fuzz target: the bitsandbytes quant_state blob (the JSON in a
 * P.weight.quant_state.bitsandbytes__{nf4,fp4} U8 tensor), planned and
 * dequantized inside an otherwise valid bnb checkpoint.
 *
 * The checkpoints are the fixtures (fixtures/bnb-nf4-dq first), read once;
 * $BFS_FUZZ_FIXTURES may name the fixtures directory (default: ./fixtures,
 * then ../../fixtures relative to build/fuzz/).
 * Input: byte 0 options (fz_opts_from_byte), byte 1 picks the checkpoint
 * (bits 6-7) and the blob to replace (bits 0-5, modulo their number),
 * the rest is the blob. The file is rebuilt around it with consistent offsets.
 */
#include "fuzz_common.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const fz_fixtures[] = {"bnb-nf4-dq", "bnb-nf4", "bnb-fp4-dq", "bnb-fp4"};
#define FZ_NFIX (sizeof fz_fixtures / sizeof *fz_fixtures)

typedef struct {
    uint8_t *buf;
    size_t len;
    bfs_st_header h;
    json_t *meta;     /* __metadata__ or NULL */
    size_t nblob;
    size_t *blob;     /* indices into h.t of the quant_state tensors */
} fz_ckpt;

static fz_ckpt fz_ck[FZ_NFIX];
static size_t fz_nck;

static uint8_t *fz_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n)
        abort();
    fclose(f);
    *len = (size_t)n;
    return b;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *env = getenv("BFS_FUZZ_FIXTURES");
    const char *roots[] = {env ? env : "fixtures", "fixtures", "../../fixtures"};
    for (size_t i = 0; i < FZ_NFIX; i++) {
        fz_ckpt *c = &fz_ck[fz_nck];
        char path[1024];
        for (size_t r = 0; r < 3 && !c->buf; r++) {
            snprintf(path, sizeof path, "%s/%s/model.safetensors", roots[r], fz_fixtures[i]);
            c->buf = fz_slurp(path, &c->len);
        }
        if (!c->buf)
            continue;
        if (bfs__st_parse(c->buf, c->len, path, &c->h) != 0) {
            fprintf(stderr, "fuzz: %s\n", bfs_last_error());
            abort();
        }
        json_t *root = json_loadb((const char *)c->buf + 8, (size_t)c->h.header_len, 0, NULL);
        c->meta = root ? json_incref(json_object_get(root, "__metadata__")) : NULL;
        json_decref(root);
        c->blob = calloc(c->h.n, sizeof *c->blob);
        for (size_t k = 0; k < c->h.n; k++)
            if (strstr(c->h.t[k].name, ".quant_state.bitsandbytes__"))
                c->blob[c->nblob++] = k;
        if (c->nblob)
            fz_nck++;
    }
    if (fz_nck == 0) {
        fprintf(stderr, "fuzz: no bitsandbytes fixture found (run from the repository root or set BFS_FUZZ_FIXTURES)\n");
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    fz_opts o = fz_opts_from_byte(data[0]);
    const fz_ckpt *c = &fz_ck[(data[1] >> 6) % fz_nck];
    const size_t which = c->blob[(data[1] & 63) % c->nblob];
    char only[1024]; /* the other layers are valid and dequantized elsewhere: only this one */
    const char *marker = strstr(c->h.t[which].name, ".quant_state.");
    snprintf(only, sizeof only, "%.*s", (int)(marker - c->h.t[which].name), c->h.t[which].name);
    o.only = only;
    const uint8_t *blob = data + 2;
    const size_t blen = size - 2;

    /* the header: every tensor where it was, the blob resized, offsets shifted */
    json_t *root = json_object();
    if (c->meta)
        json_object_set(root, "__metadata__", c->meta);
    uint64_t pos = 0;
    for (size_t k = 0; k < c->h.n; k++) {
        const bfs_st_tensor *t = &c->h.t[k];
        const uint64_t n = k == which ? blen : t->end - t->begin;
        json_t *shape = json_array();
        if (k == which)
            json_array_append_new(shape, json_integer((json_int_t)blen));
        else
            for (int d = 0; d < t->ndim; d++)
                json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
        json_object_set_new(root, t->name,
                            json_pack("{s:s, s:o, s:[I,I]}", "dtype", bfs__dtype_name(t->dtype), "shape", shape,
                                      "data_offsets", (json_int_t)pos, (json_int_t)(pos + n)));
        pos += n;
    }
    char *hdr = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    size_t hl = strlen(hdr);
    const size_t padded = (hl + 7) / 8 * 8; /* keeps the F32 tensors 4-byte aligned, as upstream */
    uint8_t *file = malloc(8 + padded + pos);
    if (!file)
        abort();
    for (int i = 0; i < 8; i++)
        file[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(file + 8, hdr, hl);
    memset(file + 8 + hl, ' ', padded - hl);
    uint8_t *d = file + 8 + padded;
    for (size_t k = 0; k < c->h.n; k++) {
        const bfs_st_tensor *t = &c->h.t[k];
        if (k == which) {
            memcpy(d, blob, blen);
            d += blen;
        } else {
            memcpy(d, c->buf + c->h.data_start + t->begin, (size_t)(t->end - t->begin));
            d += t->end - t->begin;
        }
    }
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", fz_dir());
    fz_write(path, file, 8 + padded + pos);
    free(file);
    free(hdr);
    fz_open_and_exercise(path, &o);
    return 0;
}
