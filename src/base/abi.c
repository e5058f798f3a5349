/*
 * The public structs' sizes (include/bfshard.h "ABI"): every options and result struct
 * begins with `size`. This file owns reading a caller's options struct into the
 * library's own full-size copy (defaults for what lies past the caller's size; unknown
 * nonzero bytes from a newer caller refused) and writing a result back within the
 * caller's size, and the *_result_init functions.
 */
#include "base/base.h"

#include <string.h>

/* dst (dst_size bytes) already holds the defaults; copy the caller's src over it. */
int bfs__struct_in(void *dst, size_t dst_size, const void *src, const char *what)
{
    if (!src)
        return 0;
    size_t n;
    memcpy(&n, src, sizeof n);
    if (n < sizeof n)
        return bfs__err(BFS_EUSAGE, "%s.size is %zu: initialize the struct with its _init function first", what, n);
    if (n > dst_size) {
        /* a newer caller: what this library does not know must be unset */
        const unsigned char *p = (const unsigned char *)src;
        for (size_t i = dst_size; i < n; i++)
            if (p[i])
                return bfs__err(BFS_EUSAGE,
                                "%s: an option at byte %zu is set that this library (bfshard %s, %zu-byte struct) does not know: upgrade libbfshard",
                                what, i, BFS_VERSION_STRING, dst_size);
        n = dst_size;
    }
    memcpy((char *)dst + sizeof n, (const char *)src + sizeof n, n - sizeof n);
    memcpy(dst, &dst_size, sizeof dst_size);
    return 0;
}

int bfs__struct_out_check(const void *dst, const char *what)
{
    size_t n;
    if (!dst)
        return 0;
    memcpy(&n, dst, sizeof n);
    if (n < sizeof n)
        return bfs__err(BFS_EUSAGE, "%s.size is %zu: initialize the struct with its _init function first", what, n);
    return 0;
}

void bfs__struct_out(void *dst, const void *src, size_t src_size)
{
    size_t n;
    if (!dst)
        return;
    memcpy(&n, dst, sizeof n);
    if (n < sizeof n)
        return;
    if (n > src_size)
        n = src_size;
    memcpy((char *)dst + sizeof n, (const char *)src + sizeof n, n - sizeof n);
}

void bfs_convert_result_init(bfs_convert_result *r)
{
    memset(r, 0, sizeof *r);
    r->size = sizeof *r;
}

void bfs_compress_result_init(bfs_compress_result *r)
{
    memset(r, 0, sizeof *r);
    r->size = sizeof *r;
}

void bfs_convert_opts_init(bfs_convert_opts *o)
{
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    o->world_size = 1;
    o->layout = BFS_LAYOUT_DCP;
    o->device = "auto";
    o->mxfp4_layout = BFS_MXFP4_HF;
    o->cpu_level = -1;
}

void bfs_pack_opts_init(bfs_pack_opts *o)
{
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
}

void bfs_pack_result_init(bfs_pack_result *r)
{
    memset(r, 0, sizeof *r);
    r->size = sizeof *r;
}
