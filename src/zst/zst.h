/*
 * Compressed artifacts: what the zst files share beyond bfs_internal.h. The format
 * is in zst_format.h; the writer in zst_write.c, the reader in zst_read.c, the file
 * commands (compress, decompress, extract) in zst_file.c, and the OUTDIR commands
 * (compress a bfshard output directory, verify a compressed copy) in zst.c.
 */
#ifndef BFS_ZST_H
#define BFS_ZST_H

#include "bfs_internal.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <xxhash.h>

/* ---- the writer's state ----------------------------------------------------------
 * Owned by zst_write.c; zst.c reads out_off, frame_max, level, mode and nent of a
 * finished writer for the manifest. Nothing outside zst_write.c writes a field. */
struct bfs_zst_slot;
struct bfs_zst_worker;
struct bfs_zst_writer {
    int fd;
    int level, mode, nthreads;
    size_t frame_max, out_cap;
    uint64_t out_off;   /* bytes written to fd */
    uint64_t in_total;  /* uncompressed bytes accepted */
    struct bfs_zst_slot *slots;
    int nslots, head, count, fill;
    bool cur_bf16;
    struct bfs_zst_worker *workers;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    bool sync_ok, stop;
    uint8_t *ent;       /* nent packed bfs_zst_seek_entry, ready for the seek table */
    uint8_t *map;       /* byte-group bits, BYTEGROUP mode */
    size_t nent, cap;
    XXH3_state_t *hash; /* of the compressed bytes written */
    XXH3_state_t *ihash;/* of the uncompressed bytes accepted */
    int rc;             /* sticky: the first failure; err holds its message */
    bfs_errslot err;
    bool finished;
};

/* ---- a source of compressed bytes for the reader ---------------------------------- */
typedef struct bfs_src {
    /* Read exactly len bytes at off, or return a BFS_E* code with a message naming `what`. */
    int (*pread)(const struct bfs_src *s, void *buf, size_t len, uint64_t off);
    void (*close)(struct bfs_src *s); /* NULL: nothing to release */
    uint64_t size;    /* bytes in the source */
    const char *what; /* names the source in messages; must outlive the source */
    int fd;           /* file source */
    const uint8_t *data; /* memory source */
} bfs_src;

/* A regular file, opened read-only (messages as bfs__zst_reader_open's). */
int bfs__src_file(bfs_src *s, const char *path);
/* len bytes at data (not copied: they must outlive the reader). */
void bfs__src_mem(bfs_src *s, const void *data, size_t len, const char *what);
/* Open a reader over src; the reader owns src from then on (closes it when freed, or
 * at once when opening fails) and names it by a copy of src->what. */
int bfs__zst_reader_open_src(const bfs_src *src, bfs_zst_reader **out);

typedef int (*bfs_zst_sink)(void *user, const uint8_t *p, size_t n);

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
