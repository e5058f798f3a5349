/*
 * Fuzz target: a weights file's slice index (manifest v2, src/output/slices.c) and the
 * narrowing verify does with it, bfs__slices_narrow, over a weights file image.
 *
 * Input: 2 bytes little-endian k, then k bytes of slice index (NAME.slices), then the
 * weights file (a safetensors image); fewer than 2 bytes: nothing. The seeds are real
 * pairs from `bfshard convert` (fuzz/gen_corpus.py), so the header's hash matches and the
 * per-tensor comparison is reached; mutations then break either side.
 * Properties (abort when broken):
 *   - the result is >= 0 (tensors reported) or BFS_EINPUT with its message set;
 *   - it equals the number of "BAD tensor" lines, and every report line is one line
 *     escaped as every report is (fz_check_report);
 *   - *data_start is at most the file's size;
 *   - tensors were compared only when the header's bytes hash to the index's header hash;
 *   - the index rebuilt here from the header (when the image parses as safetensors) makes
 *     narrowing report nothing: the reader's order is the documented one.
 */
#include "fuzz_common.h"
#include "base/bfs_io.h"
#include "input/safetensors.h"
#include "output/slices.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint8_t *p;
    uint64_t n;
} fz_sl_img;

static int fz_sl_read(void *user, uint64_t off, uint64_t n, void *dst)
{
    const fz_sl_img *m = user;
    if (off > m->n || n > m->n - off)
        return bfs__err(BFS_EINPUT, "fuzz.safetensors: cannot read %llu bytes at %llu", (unsigned long long)n,
                        (unsigned long long)off);
    memcpy(dst, m->p + off, (size_t)n);
    return 0;
}

static int fz_sl_hash(void *user, uint64_t off, uint64_t n, char hex[33])
{
    const fz_sl_img *m = user;
    if (off > m->n || n > m->n - off)
        return bfs__err(BFS_EINPUT, "fuzz.safetensors: cannot read %llu bytes at %llu", (unsigned long long)n,
                        (unsigned long long)off);
    bfs__hash_hex(XXH3_128bits(m->p + off, (size_t)n), hex);
    return 0;
}

/* the report: lines, each escaped (fz_check_report); the number of "BAD tensor" ones */
static int fz_sl_lines(const char *r, size_t n)
{
    int bad = 0;
    fz_check_report(r, n, "slices"); /* every line ends, nothing unescaped */
    for (size_t i = 0; i < n;) {
        const char *nl = memchr(r + i, '\n', n - i);
        bad += memmem(r + i, (size_t)(nl - (r + i)), ": BAD tensor \"", 14) != NULL;
        i = (size_t)(nl - r) + 1;
    }
    return bad;
}

static int fz_sl_narrow(const uint8_t *ix, size_t ixlen, const fz_sl_img *m, bool *compared)
{
    char *rep = NULL;
    size_t rn = 0;
    FILE *f = open_memstream(&rep, &rn);
    if (!f)
        abort();
    uint64_t ds = UINT64_MAX;
    bfs__err_clear();
    const int rc = bfs__slices_narrow(ix, ixlen, "fuzz.slices", "fuzz.safetensors", m->n, f, fz_sl_read, fz_sl_hash,
                                      (void *)m, true, &ds);
    fclose(f);
    if (rc < 0 && (rc != BFS_EINPUT || !bfs_last_error()[0] || strchr(bfs_last_error(), '\n')))
        abort();
    if (ds > m->n)
        abort();
    const int bad = fz_sl_lines(rep, rn);
    if (rc >= 0 && bad != rc)
        abort();
    *compared = rc > 0;
    free(rep);
    bfs__err_clear();
    return rc;
}

/* the index of a parsed image, as the writer lays it out (offset, end order) */
static uint8_t *fz_sl_build(const fz_sl_img *m, const bfs_st_header *h, size_t *len)
{
    *len = BFS_SLICES_HDR + 16 * h->n;
    uint8_t *b = calloc(1, *len);
    if (!b)
        abort();
    memcpy(b, BFS_SLICES_MAGIC, 8);
    b[8] = 1;
    for (int i = 0; i < 8; i++) {
        b[16 + i] = (uint8_t)(h->data_start >> (8 * i));
        b[40 + i] = (uint8_t)((uint64_t)h->n >> (8 * i));
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(m->p, (size_t)h->data_start));
    memcpy(b + 24, c.digest, 16);
    for (size_t i = 0; i < h->n; i++) { /* h->t sorted by (begin, end), as the reader sorts */
        const bfs_st_tensor *t = &h->t[i];
        XXH128_canonicalFromHash(&c, XXH3_128bits(m->p + h->data_start + t->begin, (size_t)(t->end - t->begin)));
        memcpy(b + BFS_SLICES_HDR + 16 * i, c.digest, 16);
    }
    return b;
}

static int fz_sl_cmp(const void *x, const void *y)
{
    const bfs_st_tensor *p = x, *q = y;
    if (p->begin != q->begin)
        return p->begin < q->begin ? -1 : 1;
    return p->end < q->end ? -1 : p->end > q->end;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const size_t k = (size_t)data[0] | (size_t)data[1] << 8;
    if (k > size - 2)
        return 0;
    const uint8_t *ix = data + 2;
    fz_sl_img m = {data + 2 + k, size - 2 - k};
    bool compared = false;
    fz_sl_narrow(ix, k, &m, &compared);
    if (compared) { /* the header matched the index's hash */
        uint64_t ds = 0;
        for (int i = 7; i >= 0; i--)
            ds = ds << 8 | ix[16 + i];
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits(m.p, (size_t)ds));
        if (memcmp(c.digest, ix + 24, 16) != 0)
            abort();
    }
    bfs_st_header h = {0};
    if (m.n >= 8 && bfs__st_parse(m.p, m.n, "fuzz.safetensors", &h) == 0 && h.n <= 4096) {
        qsort(h.t, h.n, sizeof *h.t, fz_sl_cmp);
        size_t len = 0;
        uint8_t *b = fz_sl_build(&m, &h, &len);
        if (fz_sl_narrow(b, len, &m, &compared) != 0) /* a true index: nothing differs */
            abort();
        free(b);
    }
    bfs__st_header_free(&h);
    bfs__err_clear();
    return 0;
}
