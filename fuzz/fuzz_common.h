/*
 * Shared helpers of the libFuzzer targets (fuzz/fuzz_*.c).
 *
 * The oracle of every target is: no crash, no sanitizer report, and for any
 * input the library accepts, a plan whose output headers our own reader
 * accepts and whose kernels stay inside their source tensors. To make the last
 * one checkable, fz_isolate() gives every raw tensor its own malloc'd copy of
 * exactly its bytes, so ASan reports a kernel that reads one byte past it.
 */
#ifndef BFS_FUZZ_COMMON_H
#define BFS_FUZZ_COMMON_H

#include "../tests/bfs_internal.h"

#include <stddef.h>
#include <stdint.h>

/* A private scratch directory for this process (tmpfs when there is one). */
const char *fz_dir(void);
/* Write a file (abort on failure: the harness, not the library, failed). */
void fz_write(const char *path, const void *data, size_t len);
/* Empty fz_dir() of the files a previous input left there. */
void fz_clean(void);

/* Give every raw tensor its own exact-size heap copy; fz_release undoes it
 * (call before bfs__input_free). */
void fz_isolate(bfs_input *in);
void fz_release(bfs_input *in);

typedef struct fz_opts {
    int world_size;     /* >= 1 */
    int layout;         /* BFS_LAYOUT_* */
    int mxfp4_layout;
    int keep_dtype;
    uint64_t max_shard_size;
    int cpu_level;      /* kernels used for the dequant check */
    const char *only;   /* when set, dequantize only this output tensor */
} fz_opts;

/* Options from one selector byte: bits 0-3 world size - 1, bit 4 openai MXFP4
 * layout, bit 5 keep dtype, bit 6 hf layout (world size 1), bit 7 the best CPU
 * kernel level instead of scalar. */
fz_opts fz_opts_from_byte(uint8_t b);

/* Plan in (tensors + layout) with o; when that succeeds, check every output
 * header with bfs__st_parse and run the dequant of every piece (bounded). */
void fz_exercise(bfs_input *in, const fz_opts *o);

/* Open the input at path, isolate it and exercise it. */
void fz_open_and_exercise(const char *path, const fz_opts *o);

/* ---- the readers of what bfshard writes (fuzz_manifest.c, fuzz_sums.c, fuzz_claim.c) ---- */
/* The absolute path of fixtures/NAME ($BFS_FUZZ_FIXTURES, ./fixtures, ../../fixtures), or
 * abort: the harness needs it. */
void fz_fixture(const char *name, char *out, size_t cap);
/* A failure of the library: rc a BFS_E* code and bfs_last_error() one non-empty line that
 * the escaping rule (src/base/base.h) let through: no C0 control, DEL or C1 control, well-
 * formed UTF-8; else abort naming what failed. */
void fz_check_error(int rc, const char *what);
/* A report (verify's, a check's) printed into memory: every line ends with '\n' and holds
 * nothing else the escaping rule escapes (names read from files are escaped: no C0, DEL or
 * C1 control, well-formed UTF-8); the number of lines. */
size_t fz_check_report(const char *text, size_t len, const char *what);
/* Remove a directory tree (never following a symbolic link). */
void fz_rmrf(const char *path);

/* OUTDIRs made once per process from the fixtures by bfs_convert, under fz_dir(): a
 * fixture at W = 1, 3 or 8, dcp or hf, compressed (zstd, bytegroup), in parts. */
#define FZ_NOUTDIRS 8
typedef struct fz_outdir {
    const char *fixture;
    int world_size, layout, compress_level, compress_mode;
    uint64_t max_shard_size;
    const char *ranks[2]; /* a conversion in two parts, not merged: ranks[0]'s manifest is the fuzzed one */
} fz_outdir;
extern const fz_outdir fz_outdirs[FZ_NOUTDIRS];
/* OUTDIR k (made on the first call); *manifest: the name of the manifest the target
 * replaces (bfshard.manifest.json, or the first part's). */
const char *fz_outdir_get(int k, const char **manifest);

#endif
