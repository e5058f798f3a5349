/* The safetensors byte rules (format: safetensors.c), for the code that reads or
 * writes the 8-byte length prefix and the header itself: the parser, the plan's
 * output headers, the compressed-file commands. */
#ifndef BFS_SAFETENSORS_H
#define BFS_SAFETENSORS_H

#include "base/base.h"

#include <stddef.h>
#include <stdint.h>

#define BFS_ST_MAX_HEADER 100000000ull /* the reference implementation's limit */

struct json_t;

/* The header length N of a file of file_size (>= 8) bytes from its first 8 bytes:
 * BFS_EINPUT, naming `what`, when N exceeds the limit or runs past the file. */
int bfs__st_header_len(const uint8_t prefix[8], uint64_t file_size, const char *what, uint64_t *n);
/* Encode the header length N as the 8-byte little-endian prefix. */
void bfs__st_put_len(uint8_t prefix[8], uint64_t n);
/* hdr as compact JSON, space padded so that the data section (8 + *len) starts on a
 * multiple of align; NUL-terminated, *len excludes the NUL. NULL when out of memory. */
char *bfs__st_header_text(const struct json_t *hdr, size_t align, size_t *len);

/* ---- safetensors ------------------------------------------------------------ */
typedef struct bfs_st_tensor {
    char *name;
    bfs_dtype dtype;
    int ndim;
    uint64_t shape[BFS_MAX_DIMS];
    uint64_t begin, end; /* relative to the data section */
} bfs_st_tensor;

typedef struct bfs_st_header {
    uint64_t header_len;  /* N */
    uint64_t data_start;  /* 8 + N */
    uint64_t data_size;   /* file size - data_start */
    size_t n;
    bfs_st_tensor *t;     /* sorted by begin */
    char *metadata_json;  /* the __metadata__ object serialised, or NULL */
} bfs_st_header;

/* Parse and validate a safetensors file image of file_size bytes (at least the
 * first 8 + N bytes must be readable at buf). `what` names the file in errors. */
int bfs__st_parse(const uint8_t *buf, uint64_t file_size, const char *what, bfs_st_header *h);
void bfs__st_header_free(bfs_st_header *h);

#endif
