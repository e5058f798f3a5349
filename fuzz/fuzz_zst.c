/*
 * Fuzz target: the seekable zstd reader (src/zst/zst_read.c), bfs__zst_reader_open_src +
 * bfs__zst_read_range + bfs__zst_read_header over a fuzzed .zst/.bfz image, read
 * from memory (no file is written: a memory bfs_src).
 *
 * Input: 1 selector byte (bit 0: name the image .bfz instead of .zst, in messages;
 * bits 1-2: which range to read) + the image. The oracle: no crash, no sanitizer
 * report; when the image opens, a range read either fails cleanly or delivers
 * exactly the bytes asked for.
 */
#include "fuzz_common.h"
#include "zst/zst.h"

#include <stdlib.h>
#include <string.h>

static int fz_sink(void *user, const uint8_t *p, size_t n)
{
    (void)p;
    *(uint64_t *)user += n;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t sel = data[0];
    bfs_src src;
    bfs__src_mem(&src, data + 1, size - 1, (sel & 1) ? "f.safetensors.bfz" : "f.safetensors.zst");

    bfs_zst_reader *r = NULL;
    bfs__err_clear();
    if (bfs__zst_reader_open_src(&src, &r) != 0) {
        if (!bfs_last_error()[0])
            abort(); /* every failure names itself */
        return 0;
    }
    const uint64_t total = bfs__zst_reader_size(r);
    /* a range chosen by the selector: whole file, a head, a tail, the middle */
    uint64_t off = 0, len = total;
    switch ((sel >> 1) & 3) {
    case 1: len = total < 4096 ? total : 4096; break;
    case 2: off = total > 4096 ? total - 4096 : 0; len = total - off; break;
    case 3: off = total / 3; len = total / 3; break;
    default: break;
    }
    if (len > (64u << 20))
        len = 64u << 20; /* bounded work per input */
    uint64_t got = 0;
    bfs__err_clear();
    if (bfs__zst_read_range(r, off, len, fz_sink, &got) == 0 && got != len)
        abort();
    uint8_t *hbuf = NULL;
    bfs_st_header h;
    if (bfs__zst_read_header(r, &hbuf, &h) == 0)
        bfs__st_header_free(&h);
    free(hbuf);
    bfs__zst_reader_free(r);
    return 0;
}
