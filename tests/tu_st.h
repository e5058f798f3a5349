/* A safetensors file read whole and parsed with the library's own parser, the source content
 * hashes by their definition (test_planmem, test_trust_bytes), and the bf16
 * compare, for the tests that compare output tensors (test_e2e, test_formats_e2e,
 * test_zstd). Header-only: only the tests that include it need the library's internal
 * header. */
#ifndef BFS_TU_ST_H
#define BFS_TU_ST_H

#include "bfs_internal.h"
#include "formats/format.h"
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
/* The manifest's source hashes (scheme "blocks-1": src/input/srchash.c, docs/MANIFEST.md)
 * of INPUT converted with o, recomputed another way, into hex[file]: every byte of the
 * input goes to the lowest rank whose pieces' source ranges (bfs__unit_sources of each whole
 * piece, over the plan's files) hold it, a byte no rank reads to the rank of the byte
 * before it (a tensor's first byte: rank 0); a block is a run of one rank's bytes within a
 * tensor; content hash = XXH3-128 of the header + XXH3-128 (seed: the block's offset in the
 * file) of every block, added mod 2^128. Small inputs only: an int per input byte. */
static inline void st_source_hashes(const char *input, const bfs_convert_opts *o, char (*hex)[33])
{
    bfs_input *in = NULL;
    bfs_plan *p = NULL;
    if (bfs__input_open(input, &in) != 0 || bfs__plan_tensors(in, o, &p) != 0 || bfs__plan_layout(p, o) != 0)
        fail_msg("%s: %s", input, bfs_last_error());
    int **own = calloc((size_t)in->nfiles, sizeof *own);
    for (int f = 0; f < in->nfiles; f++) {
        own[f] = malloc((size_t)in->files[f].size * sizeof **own + 1);
        for (uint64_t x = 0; x < in->files[f].size; x++)
            own[f][x] = -1;
    }
    for (int f = 0; f < p->nfiles; f++) {
        const int rank = p->layout == BFS_LAYOUT_DCP ? f : 0;
        for (size_t k = 0; k < p->files[f].npieces; k++) {
            const bfs_piece *pc = &p->files[f].pieces[k];
            bfs_ucur cur = bfs__ucur(&p->t[pc->tensor], pc->row0, pc->row1);
            bfs_unit u;
            uint64_t ua, ub;
            while (bfs__ucur_next(&cur, UINT64_MAX, &u, &ua, &ub)) { /* the piece; a packed one's members */
                bfs_srange s[BFS_UNIT_MAX_SRC];
                const int n = bfs__unit_sources(&u, s);
                for (int i = 0; i < n; i++)
                    for (uint64_t x = s[i].r->file_offset + s[i].off; x < s[i].r->file_offset + s[i].off + s[i].len; x++)
                        if (own[s[i].r->file][x] < 0 || own[s[i].r->file][x] > rank)
                            own[s[i].r->file][x] = rank;
            }
        }
    }
    for (int f = 0; f < in->nfiles; f++) {
        const bfs_infile *fl = &in->files[f];
        XXH128_hash_t d = XXH3_128bits(fl->map, (size_t)fl->h.data_start), sum = d;
        for (size_t i = 0; i < in->nraw; i++) {
            const bfs_raw *r = &in->raw[i];
            if (r->file != f)
                continue;
            int prev = 0;
            for (uint64_t a = 0, b; a < r->nbytes; a = b) {
                const int o0 = own[f][r->file_offset + a] >= 0 ? own[f][r->file_offset + a] : prev;
                for (b = a + 1; b < r->nbytes; b++) {
                    const int ob = own[f][r->file_offset + b];
                    if ((ob >= 0 ? ob : o0) != o0)
                        break;
                }
                prev = o0;
                d = XXH3_128bits_withSeed(fl->map + r->file_offset + a, (size_t)(b - a), r->file_offset + a);
                sum.low64 += d.low64;
                sum.high64 += d.high64 + (sum.low64 < d.low64);
            }
        }
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, sum);
        for (int i = 0; i < 16; i++)
            snprintf(hex[f] + 2 * i, 3, "%02x", c.digest[i]);
        free(own[f]);
    }
    free(own);
    bfs__plan_free(p);
    bfs__input_free(in);
}

#endif
