/* The safetensors byte rules (format: safetensors.c), for the code that reads or
 * writes the 8-byte length prefix and the header itself: the parser, the plan's
 * output headers, the compressed-file commands. */
#ifndef BFS_SAFETENSORS_H
#define BFS_SAFETENSORS_H

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

#endif
