/*
 * Fuzz target: the safetensors header parser, bfs__st_parse.
 *
 * Input: 8 bytes V (little-endian) + a safetensors image. The parser reads
 * only the first 8 + N bytes of a file, so when the image holds them the file
 * is taken to be V (mod 2^40) bytes longer than the image: headers describing
 * large data sections are reachable without writing that data.
 * On success the result must satisfy the format's rules (sorted, contiguous,
 * in bounds, sizes = dtype x shape). And the streamed parser must agree with the one it
 * replaced, on a jansson tree (st_parse_ref.c): the same verdict, table and metadata.
 */
#include "fuzz_common.h"
#include "st_parse_ref.c"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 8)
        return 0;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | data[i];
    v &= (1ull << 40) - 1;
    const uint8_t *img = data + 8;
    const size_t len = size - 8;
    /* an exact-size copy, so ASan catches any read past the image */
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        abort();
    memcpy(buf, img, len);
    uint64_t file_size = len;
    if (len >= 8) {
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--)
            n = (n << 8) | img[i];
        if (n <= len - 8)
            file_size = len + v;
    }
    const char *differ = fz_st_differ(buf, file_size, "fuzz.safetensors");
    if (differ) {
        fprintf(stderr, "the streamed header parser and jansson's disagree: %s\n", differ);
        abort();
    }
    bfs_st_header h;
    bfs__err_clear();
    const int rc = bfs__st_parse(buf, file_size, "fuzz.safetensors", &h);
    if (rc != 0) {
        if (rc != BFS_EINPUT && rc != BFS_ENOMEM)
            abort();
        if (!strstr(bfs_last_error(), "fuzz.safetensors"))
            abort(); /* every error names the file */
        free(buf);
        return 0;
    }
    if (h.data_start != 8 + h.header_len || h.data_start + h.data_size != file_size)
        abort();
    uint64_t pos = 0;
    for (size_t i = 0; i < h.n; i++) {
        const bfs_st_tensor *t = &h.t[i];
        uint64_t n = bfs__dtype_size(t->dtype);
        if (!t->name || !t->name[0] || t->ndim < 0 || t->ndim > BFS_MAX_DIMS || t->begin != pos || t->end < t->begin)
            abort();
        for (int d = 0; d < t->ndim; d++)
            if (!bfs__mul_ok(n, t->shape[d], &n))
                abort();
        if (t->end - t->begin != n)
            abort();
        pos = t->end;
    }
    if (pos != h.data_size)
        abort();
    bfs__st_header_free(&h);
    free(buf);
    return 0;
}
