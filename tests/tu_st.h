/* A safetensors file read whole and parsed with the library's own parser, the source content
 * hash by its definition (test_planmem, test_trust_bytes), and the bf16
 * compare, for the tests that compare output tensors (test_e2e, test_formats_e2e,
 * test_zstd). Header-only: only the tests that include it need the library's internal
 * header. */
#ifndef BFS_TU_ST_H
#define BFS_TU_ST_H

#include "bfs_internal.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct {
    uint8_t *buf;
    size_t len;
    bfs_st_header h;
} stfile;

/* 0, or -1 when the file is missing or not valid safetensors (f is then empty). */
static inline int st_load(const char *path, stfile *f)
{
    memset(f, 0, sizeof *f);
    f->buf = tu_read_file(path, &f->len);
    if (!f->buf)
        return -1;
    if (bfs__st_parse(f->buf, f->len, path, &f->h) != 0) {
        free(f->buf);
        f->buf = NULL;
        return -1;
    }
    return 0;
}

static inline void st_free(stfile *f)
{
    bfs__st_header_free(&f->h);
    free(f->buf);
}

static inline const bfs_st_tensor *st_find(const stfile *f, const char *name)
{
    for (size_t i = 0; i < f->h.n; i++)
        if (strcmp(f->h.t[i].name, name) == 0)
            return &f->h.t[i];
    return NULL;
}

/* The bytes of tensor t of f. */
static inline const uint8_t *st_data(const stfile *f, const bfs_st_tensor *t) { return f->buf + f->h.data_start + t->begin; }

static inline int st_is_nan16(uint16_t v) { return (v & 0x7F80) == 0x7F80 && (v & 0x7F) != 0; }

/* Compare bf16 bytes; the only differences allowed are documented upstream
 * inconsistencies: NaN payloads of a cast (torch's vectorised cast writes 0xFFFF,
 * its scalar one 0x7FC0: we write 0x7FC0) and, when fp4, the sign of the zero of bnb
 * FP4's code 8 (bitsandbytes' Python path gives +0.0, its C++/CUDA kernels -0.0, as we
 * do). Counts those in *allowed (when not NULL), prints the first 5 others to stderr;
 * returns the number of others. */
static inline size_t st_cmp_bf16(const uint8_t *got, const uint8_t *want, size_t nbytes, int fp4, size_t *allowed)
{
    size_t bad = 0;
    if (memcmp(got, want, nbytes) == 0)
        return 0;
    for (size_t i = 0; i + 1 < nbytes; i += 2) {
        uint16_t g, w;
        memcpy(&g, got + i, 2);
        memcpy(&w, want + i, 2);
        if (g == w)
            continue;
        if ((st_is_nan16(g) && st_is_nan16(w)) || (fp4 && w == 0x0000 && g == 0x8000)) {
            if (allowed)
                (*allowed)++;
        } else if (bad++ < 5) {
            fprintf(stderr, "  element %zu: got 0x%04x want 0x%04x\n", i / 2, g, w);
        }
    }
    return bad;
}

/* The definition of a source file's content hash (the manifest's content_xxh3_128):
 * XXH3-128 over the canonical XXH3-128 of the header bytes, then of each tensor's data
 * in file order; hex into hex[33]. */
static inline void st_content_hash(const char *path, char hex[33])
{
    stfile f;
    if (st_load(path, &f) != 0)
        fail_msg("%s: not readable safetensors", path);
    XXH3_state_t *st = XXH3_createState();
    XXH3_128bits_reset(st);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(f.buf, (size_t)f.h.data_start));
    XXH3_128bits_update(st, &c, sizeof c);
    for (size_t i = 0; i < f.h.n; i++) { /* sorted by begin: file order */
        XXH128_canonicalFromHash(&c, XXH3_128bits(f.buf + f.h.data_start + f.h.t[i].begin,
                                                  (size_t)(f.h.t[i].end - f.h.t[i].begin)));
        XXH3_128bits_update(st, &c, sizeof c);
    }
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", c.digest[i]);
    XXH3_freeState(st);
    st_free(&f);
}

#endif
