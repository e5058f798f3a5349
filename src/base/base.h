/* src/base/ -- the leaves every other folder stands on: errors and the per-thread message
 * (error.c), the public structs' sizes (abi.c), checked arithmetic, dtypes, strings and
 * paths (util.c), the escaping rule for text from a file (escape.c), checked positioned I/O and XXH3 (io.c, bfs_io.h), the build's revision
 * (version.c), and the run's cancellation, clock and progress reports (run.c). It uses
 * nothing of bfshard but the public header. Prefix bfs__ for everything here. */
#ifndef BFS_BASE_H
#define BFS_BASE_H

#include "bfshard.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- errors ---------------------------------------------------------------
 * bfs__err(code, fmt, ...) records a one-line message for bfs_last_error()
 * and returns code, so: `return bfs__err(BFS_EINPUT, "%s: ...", path);`.
 * The first error recorded wins until bfs__err_clear(): deeper layers name
 * the precise place, outer layers must not overwrite it. */
int bfs__err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* bfs__err with ": strerror(errnum)" appended; returns code, or BFS_ENOMEM when errnum is
 * ENOMEM (a failed allocation inside a system call is out of memory, exit 5, like ours). */
int bfs__errno(int code, int errnum, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void bfs__err_clear(void);
bool bfs__err_is_set(void);

/* Carrying an error from a worker thread to the thread that reports it: the worker
 * calls bfs__errslot_put(slot, rc) with its own last message (the first put wins);
 * the owner calls bfs__errslot_get(slot), which makes it the owner's message and
 * returns the code (0 when nothing was put). Thread-safe; one slot per pool. */
typedef struct bfs_errslot {
    int code;            /* read and written with __atomic builtins */
    int lock;            /* spin flag guarding msg while the first put writes it */
    char msg[1024];
} bfs_errslot;
void bfs__errslot_init(bfs_errslot *s);
int bfs__errslot_put(bfs_errslot *s, int code);
int bfs__errslot_get(bfs_errslot *s);

#define BFS_TRY(expr)                                                                      \
    do {                                                                                   \
        rc = (expr);                                                                       \
        if (rc < 0)                                                                        \
            goto cleanup;                                                                  \
    } while (0)
#define BFS_FAIL(...)                                                                      \
    do {                                                                                   \
        rc = bfs__err(__VA_ARGS__);                                                        \
        goto cleanup;                                                                      \
    } while (0)

/* ---- the run: cancellation, clock, progress (run.c) ----------------------------------
 * Leaves, so that the code deep in a run (the writer, durable commits, the zst reader)
 * checks cancellation and reads the clock without calling up into a command. */
/* bfs_cancel() was called (a signal): every long loop and every commit checks it. */
bool bfs__cancelled(void);
/* A new conversion starts uncancelled (bfs_convert). */
void bfs__cancel_reset(void);
/* Readers of byte ranges (read_ranges.c; bfs_read_ranges_zst in zst/): range i of path's,
 * checked: 0, or BFS_EUSAGE when it has bytes and no destination or ends past the largest
 * file offset. */
int bfs__range_check(const char *path, size_t i, const bfs_range *r);
/* The threads such a reader runs for `jobs` pieces of work: `threads`, or one a CPU (at most
 * 16) when it is <= 0; never more than BFS_READER_MAX_THREADS or than jobs, at least 1. */
#define BFS_READER_MAX_THREADS 64
int bfs__reader_threads(int threads, uint64_t jobs);
/* Turns of such a reader's threads at one hash taken in file order: jobs 0, 1, 2, ... are read
 * by any thread in any order, then each job's bytes are hashed by the thread that read it once
 * every job before it has been hashed. turn_wait blocks until job's turn (true) or a failure
 * (false); turn_pass ends the turn of the job that holds it; turns_fail wakes every waiter for
 * good. The hashing between wait and pass runs outside the lock. */
typedef struct bfs_turns {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t next; /* the job whose turn it is */
    bool failed;
} bfs_turns;
void bfs__turns_init(bfs_turns *t);
void bfs__turns_free(bfs_turns *t);
bool bfs__turn_wait(bfs_turns *t, uint64_t job);
/* Such a hashing reader's ranges: those with a length sorted by offset, none overlapping
 * another; 0 or BFS_EUSAGE naming the two. */
int bfs__ranges_in_order(const char *path, const bfs_range *ranges, size_t n);
void bfs__turn_pass(bfs_turns *t);
void bfs__turns_fail(bfs_turns *t);
/* CLOCK_MONOTONIC in seconds. */
double bfs__now(void);
/* Bytes this process has had the storage deliver (/proc/self/io read_bytes: its reads and
 * faults, readahead included, not page-cache hits); UINT64_MAX where the kernel has no count. */
uint64_t bfs__device_read_bytes(void);
/* One progress report to o->progress (nothing when it is NULL): p's bytes_done is clamped
 * to its bytes_total, its tensor name escaped (bfs__esc). */
void bfs__progress_report(const bfs_convert_opts *o, bfs_progress *p);

/* ---- the public structs' sizes (abi.c) ---------------------------------------------
 * bfs__struct_in: dst (dst_size bytes, holding the defaults) gets the fields of the
 * caller's struct src that lie within src's `size` (src NULL: nothing); BFS_EUSAGE when
 * src's size is 0 or src sets bytes past dst_size. bfs__struct_out_check: BFS_EUSAGE
 * when a result struct dst (may be NULL) has no size. bfs__struct_out: copies src into dst
 * within dst's size (never its size field). */
int bfs__struct_in(void *dst, size_t dst_size, const void *src, const char *what);
int bfs__struct_out_check(const void *dst, const char *what);
void bfs__struct_out(void *dst, const void *src, size_t src_size);

/* checked arithmetic: return false on overflow */
static inline bool bfs__mul_ok(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_mul_overflow(a, b, r); }
static inline bool bfs__add_ok(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_add_overflow(a, b, r); }
/* Largest size, offset or dimension bfshard writes: headers store them as JSON integers
 * (int64), so anything above INT64_MAX would print negative. */
#define BFS_MAX_EXTENT ((uint64_t)INT64_MAX)
/* A shape whose every dimension, and the product of its non-zero dimensions times elsize,
 * is at most BFS_MAX_EXTENT: then every partial product a planner forms (rows, row
 * bytes, piece bytes) is exact, zero-element tensors included. */
static inline bool bfs__shape_ok(const uint64_t *shape, int ndim, uint64_t elsize)
{
    uint64_t p = elsize ? elsize : 1;
    for (int d = 0; d < ndim; d++)
        if (shape[d] > BFS_MAX_EXTENT || (shape[d] && (!bfs__mul_ok(p, shape[d], &p) || p > BFS_MAX_EXTENT)))
            return false;
    return p <= BFS_MAX_EXTENT;
}

/* ---- dtypes ---------------------------------------------------------------- */
typedef enum bfs_dtype {
    BFS_DT_BOOL, BFS_DT_U8, BFS_DT_I8, BFS_DT_U16, BFS_DT_I16, BFS_DT_F16, BFS_DT_BF16,
    BFS_DT_U32, BFS_DT_I32, BFS_DT_F32, BFS_DT_U64, BFS_DT_I64, BFS_DT_F64,
    BFS_DT_F8_E4M3, BFS_DT_F8_E5M2,
    BFS_DT_F8_E8M0, /* power-of-two scale bytes (torch.float8_e8m0fnu): DeepSeek-V4 block scales */
    BFS_DT_COUNT
} bfs_dtype;

int bfs__dtype_parse(const char *s, bfs_dtype *out); /* 0, or -1 when unknown */
const char *bfs__dtype_name(bfs_dtype d);
size_t bfs__dtype_size(bfs_dtype d);

#define BFS_MAX_DIMS 8

/* ---- hashing ---------------------------------------------------------------------- */
/* XXH3-128 in canonical big-endian hex: 32 chars + NUL */
typedef struct { char hex[33]; } bfs_hash_hex;

/* ---- misc utilities ----------------------------------------------------------------- */
char *bfs__strdup(const char *s);
/* Room for at least `need` elements of `size` bytes at *p, whose room is *cap: doubled
 * (from 16) as needed. 0, or BFS_ENOMEM (no message set) with *p and *cap unchanged. */
int bfs__grow(void **p, size_t *cap, size_t need, size_t size);
char *bfs__path_join(const char *a, const char *b);
/* json_dumps(j, flags) plus a final newline; *len excludes the NUL. NULL when out of memory. */
struct json_t;
char *bfs__json_text(const struct json_t *j, size_t flags, size_t *len);
/* json_dumps(j, flags) that fails instead of dropping a character when out of memory */
char *bfs__json_dump(const struct json_t *j, size_t flags);
/* bfs__json_dump for a reader (inspect --json): DEL and C1 too, which JSON allows raw, as
 * \u escapes (the escaping rule below); the same JSON value. NULL when out of memory. */
char *bfs__json_show(const struct json_t *j, size_t flags);
int bfs__read_small_file(const char *path, size_t max, char **out, size_t *len);

/* ---- text from a file on its way to a terminal, a log or a report (escape.c) ----------- */
/* The one rule (docs/ROBUSTNESS.md): \n and \t as such, every other C0 control and DEL as
 * \u00XX, C1 (U+0080..U+009F, well-formed UTF-8) as \u0080..\u009f, each byte of no
 * well-formed UTF-8 sequence as \xXX; the rest as it is. What comes out is printable ASCII
 * and well-formed UTF-8 of U+00A0 and above, which bfs__esc_text leaves as it is. */
/* A name read from a file (the rule, and '"' and '\\' as \" and \\), cut with "..." to fit
 * cap (BFS_ESC_MAX: the buffer every caller uses). Returns buf. */
const char *bfs__esc(const char *s, char *buf, size_t cap);
#define BFS_ESC_MAX 1024
/* The same for a whole line, whose quotes are its own: '"' and '\\' as they are. */
const char *bfs__esc_text(const char *s, char *buf, size_t cap);
/* One line to out (nothing when out is NULL): prefix and the formatted text escaped by the
 * rule, then '\n'. Every report and log line goes through here. */
void bfs__vline(FILE *out, const char *prefix, const char *fmt, va_list ap);
void bfs__line(FILE *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
