/* Built into the Python package's _libbfshard.so only (mk/install.mk), never into
 * libbfshard: the size, offset and size of every field of the public structs the
 * ctypes binding mirrors, as the C compiler lays them out from include/bfshard.h.
 * bfshard/_lib.py compares them with its own layout at import and refuses to load
 * on any difference, so a header change cannot become a silent memory bug. */
#include "bfshard.h"

#include <stddef.h>

typedef struct bfs_py_field {
    const char *name; /* "struct" for the whole struct, else "struct.field" */
    size_t offset;
    size_t size;
} bfs_py_field;

#define S(T) {#T, 0, sizeof(T)}
#define F(T, f) {#T "." #f, offsetof(T, f), sizeof(((T *)0)->f)}

static const bfs_py_field bfs_py_fields[] = {
    S(bfs_progress),
    F(bfs_progress, bytes_done),
    F(bfs_progress, bytes_total),
    F(bfs_progress, tensor),
    F(bfs_progress, busy_read),
    F(bfs_progress, busy_dequant),
    F(bfs_progress, busy_hash),
    F(bfs_progress, busy_write),
    F(bfs_progress, writers),
    S(bfs_convert_opts),
    F(bfs_convert_opts, size),
    F(bfs_convert_opts, world_size),
    F(bfs_convert_opts, layout),
    F(bfs_convert_opts, device),
    F(bfs_convert_opts, threads),
    F(bfs_convert_opts, mem),
    F(bfs_convert_opts, gpu_mem),
    F(bfs_convert_opts, mxfp4_layout),
    F(bfs_convert_opts, keep_dtype),
    F(bfs_convert_opts, force),
    F(bfs_convert_opts, max_shard_size),
    F(bfs_convert_opts, cpu_level),
    F(bfs_convert_opts, progress),
    F(bfs_convert_opts, progress_user),
    F(bfs_convert_opts, log),
    F(bfs_convert_opts, compress_level),
    F(bfs_convert_opts, compress_mode),
    F(bfs_convert_opts, ranks),
    F(bfs_convert_opts, parts),
    F(bfs_convert_opts, revision),
    F(bfs_convert_opts, max_rss),
    F(bfs_convert_opts, sha256),
    F(bfs_convert_opts, names),
    S(bfs_convert_result),
    F(bfs_convert_result, size),
    F(bfs_convert_result, bytes_written),
    F(bfs_convert_result, files_written),
    F(bfs_convert_result, files_reused),
    F(bfs_convert_result, tensors),
    F(bfs_convert_result, seconds),
    F(bfs_convert_result, host_buffer_bytes),
    F(bfs_convert_result, gpu_buffer_bytes),
    F(bfs_convert_result, backend),
    F(bfs_convert_result, input_bytes_read),
    F(bfs_convert_result, source_bytes_hashed),
    F(bfs_convert_result, ranks),
    F(bfs_convert_result, tensors_dequantized),
    F(bfs_convert_result, tensors_cast),
    F(bfs_convert_result, busy_read),
    F(bfs_convert_result, busy_dequant),
    F(bfs_convert_result, busy_hash),
    F(bfs_convert_result, busy_write),
    F(bfs_convert_result, writers),
    F(bfs_convert_result, tensors_copied),
    F(bfs_convert_result, tensors_dropped),
    F(bfs_convert_result, write_seconds),
    S(bfs_range),
    F(bfs_range, offset),
    F(bfs_range, length),
    F(bfs_range, dest),
    {NULL, 0, 0},
};

const bfs_py_field *bfs_py_abi_layout(void);
const char *bfs_py_version(void);

const bfs_py_field *bfs_py_abi_layout(void) { return bfs_py_fields; }
const char *bfs_py_version(void) { return BFS_VERSION_STRING; }
