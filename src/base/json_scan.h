/* A strict pull scanner over one JSON text in memory (json_scan.c): for the readers of
 * large JSON files (the safetensors header, the index), which take what they need
 * token by token instead of building a tree. It accepts exactly what jansson 2.14's
 * json_loadb(JSON_REJECT_DUPLICATES) accepts, and nothing else. */
#ifndef BFS_JSON_SCAN_H
#define BFS_JSON_SCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* jansson's JSON_PARSER_MAX_DEPTH: a value inside N open containers has depth N + 1 */
#define BFS_JS_MAX_DEPTH 2048

typedef enum bfs_jtok {
    BFS_JT_END,     /* the text ended after its value (and whitespace only) */
    BFS_JT_OBJ,     /* '{' */
    BFS_JT_OBJ_END, /* '}' */
    BFS_JT_ARR,     /* '[' */
    BFS_JT_ARR_END, /* ']' */
    BFS_JT_KEY,     /* an object's key: bfs__js_str */
    BFS_JT_STR,     /* a string value: bfs__js_str */
    BFS_JT_INT,     /* an integer that fits an int64: .ival */
    BFS_JT_REAL,    /* a number with a fraction or an exponent, finite as a double */
    BFS_JT_TRUE,
    BFS_JT_FALSE,
    BFS_JT_NULL,
} bfs_jtok;

typedef struct bfs_jkeys bfs_jkeys; /* one open object's keys (json_scan.c) */

typedef struct bfs_jscan {
    const char *p;   /* the text, len bytes (at most UINT32_MAX - 1) */
    size_t len, pos; /* pos: the next byte to read */
    int depth;       /* open containers */
    int state;
    unsigned char stack[BFS_JS_MAX_DEPTH]; /* '{' or '[' per open container */
    size_t at;       /* the last token's first byte */
    size_t s_off;    /* a string token's first byte after its opening quote */
    size_t s_raw;    /* its bytes up to the closing quote */
    bool s_esc;      /* it holds escapes: its decoded bytes differ from the raw ones */
    long long ival;  /* BFS_JT_INT */
    char *buf;       /* scratch: a decoded string, a number's text */
    size_t cap;
    bfs_jkeys *keys; /* per depth: the keys of the open object there (duplicates refused) */
    int nkeys;
    const char *why; /* the syntax error: what, at byte why_at */
    size_t why_at;
    char why_buf[64];
} bfs_jscan;

/* Scan the len bytes at p (kept, not copied). 0, or BFS_EINPUT when len is too large. */
int bfs__js_init(bfs_jscan *s, const char *p, size_t len);
/* The next token: 0; BFS_EINPUT on a syntax error (s->why at s->why_at), BFS_ENOMEM. */
int bfs__js_next(bfs_jscan *s, bfs_jtok *tok);
/* Skip the rest of the value that began with tok (its tokens up to its close). */
int bfs__js_skip(bfs_jscan *s, bfs_jtok tok);
/* The last BFS_JT_KEY / BFS_JT_STR decoded, NUL-terminated (a string holds no NUL):
 * NULL when out of memory. Valid until the next call on s. bfs__js_str_at: the string
 * whose raw bytes begin at off (an earlier token's s_off), the same way. */
const char *bfs__js_str(bfs_jscan *s, size_t *len);
const char *bfs__js_str_at(bfs_jscan *s, size_t off, size_t *len);
/* Two strings by their s_off, compared decoded (memcmp order, the shorter first). */
int bfs__js_strcmp(const bfs_jscan *s, size_t off, size_t off2);
/* The string at s_off off written as jansson's json_dumps writes it (no
 * JSON_ENSURE_ASCII), quotes included, to out, which has room for its raw length + 2
 * bytes: the count written. */
size_t bfs__js_dump_str(const bfs_jscan *s, size_t off, char *out);
void bfs__js_free(bfs_jscan *s);

#endif
