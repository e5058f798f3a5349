/*
 * Fuzz target: the plan over a whole fuzzed file -- bfs__input_open +
 * bfs__plan_tensors + bfs__plan_layout, then the output headers re-read by
 * bfs__st_parse and every piece dequantized from exact-size copies of its
 * sources (fuzz_common.c).
 *
 * Input: one options byte (fz_opts_from_byte: world size 1..16, layouts,
 * keep dtype, kernel level) + a .safetensors file.
 */
#include "fuzz_common.h"

#include <stdio.h>
#include <stdlib.h>

static FILE *fz_null;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const fz_opts o = fz_opts_from_byte(data[0]);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", fz_dir());
    fz_write(path, data + 1, size - 1);
    fz_open_and_exercise(path, &o);
    /* and the inspect report over the same file, both forms */
    if (!fz_null && !(fz_null = fopen("/dev/null", "w")))
        abort();
    bfs_convert_opts co;
    bfs_convert_opts_init(&co);
    co.world_size = o.world_size;
    co.layout = o.layout;
    co.mxfp4_layout = o.mxfp4_layout;
    co.keep_dtype = o.keep_dtype;
    co.max_shard_size = o.max_shard_size;
    bfs_inspect(path, &co, data[0] & 1, fz_null);
    return 0;
}
