/*
 * Stand-ins for the few library functions the CUDA backend calls (bfs__err
 * and friends, bfs__dtype_size), so dev/cuda builds link without the rest of
 * libbfshard. Same contracts as src/bfs_internal.h: the first error wins until
 * bfs__err_clear(); one message per thread.
 */
#include "bfs_internal.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char msg[1024];
static _Thread_local bool set;

int bfs__err(int code, const char *fmt, ...)
{
    if (!set) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        set = true;
    }
    return code;
}

int bfs__errno(int code, int errnum, const char *fmt, ...)
{
    if (!set) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        size_t n = strlen(msg);
        snprintf(msg + n, sizeof msg - n, ": %s", strerror(errnum));
        set = true;
    }
    return code;
}

void bfs__err_clear(void)
{
    set = false;
    msg[0] = '\0';
}

bool bfs__err_is_set(void) { return set; }

const char *bfs_last_error(void) { return msg; }

size_t bfs__dtype_size(bfs_dtype d)
{
    static const size_t sz[BFS_DT_COUNT] = {
        [BFS_DT_BOOL] = 1, [BFS_DT_U8] = 1,  [BFS_DT_I8] = 1,  [BFS_DT_U16] = 2, [BFS_DT_I16] = 2,
        [BFS_DT_F16] = 2,  [BFS_DT_BF16] = 2, [BFS_DT_U32] = 4, [BFS_DT_I32] = 4, [BFS_DT_F32] = 4,
        [BFS_DT_U64] = 8,  [BFS_DT_I64] = 8, [BFS_DT_F64] = 8, [BFS_DT_F8_E4M3] = 1, [BFS_DT_F8_E5M2] = 1};
    return (unsigned)d < BFS_DT_COUNT ? sz[d] : 0;
}
