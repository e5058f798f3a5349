/* src/commands/ -- the public entry points (include/bfshard.h): bfs_convert (convert.c,
 * its rank-file stage convert_ranks.c, its private header convert.h), bfs_verify
 * (verify.c), bfs_inspect (inspect.c, and of what bfshard wrote: inspect_out.c), the
 * compressed-file commands (zst_file.c), compress of an OUTDIR (zst_outdir.c),
 * bfs_merge (merge.c) and bfs_pack (pack.c). This header is what they share among themselves. Uses every
 * folder below it (dev/layers/order); nothing below calls up into it. */
#ifndef BFS_COMMANDS_H
#define BFS_COMMANDS_H

#include "zst/zst.h"

#include <time.h>

/* ---- inspect of what bfshard writes (inspect_out.c) ----------------------------------- */
bool bfs__inspect_is_outdir(const char *path); /* a directory holding bfshard.manifest.json */
bool bfs__inspect_is_zst(const char *path);    /* a regular file named *.zst or *.bfz */
int bfs__inspect_outdir(const char *dir, int as_json, FILE *out);
int bfs__inspect_zst(const char *path, int as_json, FILE *out);

/* For convert: the manifest's files[].zst object of a finished writer (new reference). */
struct json_t *bfs__zst_manifest_entry(const bfs_zst_writer *w, const char *zname);
/* For convert's reused rank files: compress the .safetensors at in_path into ofd (finished). */
int bfs__zst_compress_into(const char *in_path, int ofd, int level, int threads, int mode, bfs_zst_writer **wout);

/* ---- the compressed-file commands (zst_file.c), used by compress and convert -------- */
/* Compress the safetensors file `in` into the open fd ofd: the header, then every
 * tensor in file order, a frame boundary before each. *wout is the finished writer
 * (its hashes and sizes); *in_size the input's size. */
int bfs__zst_compress_fd(const char *in, int ofd, const bfs_compress_opts *o, bfs_zst_writer **wout,
                         uint64_t *in_size);

/* The single-file and OUTDIR commands' common start: clears the error, starts the
 * clock, *o = the caller's options (o_arg, may be NULL) over the defaults, *res zeroed
 * (abi.c: BFS_EUSAGE for a struct without its size). bfs__zst_run_end sets res->seconds
 * and copies *res into the caller's res_arg (may be NULL). */
int bfs__zst_run_begin(const bfs_compress_opts *o_arg, bfs_compress_opts *o, const bfs_compress_result *res_arg,
                       bfs_compress_result *res, struct timespec *t0);
void bfs__zst_run_end(bfs_compress_result *res_arg, bfs_compress_result *res, const struct timespec *t0);

#endif
