/*
 * src/zst/ -- compressed artifacts, the seekable zstd format: its byte layout
 * (zst_format.h), the writer (zst_write.c) and the reader (zst_read.c). Uses src/input
 * (the safetensors header of a compressed file) and src/base. The commands that use it
 * (compress, decompress, extract: src/commands/zst_file.c; an OUTDIR:
 * src/commands/zst_outdir.c) and verify's check of a copy sit above it.
 */
#ifndef BFS_ZST_H
#define BFS_ZST_H

#include "base/base.h"
#include "input/safetensors.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <xxhash.h>

/* ---- compressed artifacts: seekable zstd (src/zst/) ------------------------------ */
#define BFS_ZST_DEFAULT_FRAME (4u << 20)
typedef struct bfs_zst_writer bfs_zst_writer;
typedef struct bfs_zst_reader bfs_zst_reader;
struct json_t;

/* Writer: compresses the bytes it is given, in order, to fd from offset 0. Frames are
 * compressed by nthreads workers (0 = online CPUs) and written in order. mode BFS_ZST_*.
 * Usable from convert's writer thread: write() the header, then for every piece
 * cut_tensor() (a frame boundary; what follows is tensor data of that dtype) and
 * write() its bytes; finish() writes the seek table. Errors are sticky. */
int bfs__zst_writer_create(int fd, int level, int nthreads, size_t max_frame_bytes, int mode, bfs_zst_writer **out);
int bfs__zst_write(bfs_zst_writer *w, const void *buf, size_t len);
int bfs__zst_cut(bfs_zst_writer *w);
int bfs__zst_cut_tensor(bfs_zst_writer *w, bfs_dtype dtype);
int bfs__zst_finish(bfs_zst_writer *w, uint64_t *compressed_size);
/* XXH3-128 of the compressed bytes written and of the uncompressed bytes given (either may be NULL). */
void bfs__zst_writer_hashes(const bfs_zst_writer *w, char compressed_hex[33], char uncompressed_hex[33]);
uint64_t bfs__zst_writer_frames(const bfs_zst_writer *w);
void bfs__zst_writer_free(bfs_zst_writer *w); /* accepts NULL; also aborts an unfinished writer */
const char *bfs__zst_mode_name(int mode);

/* Reader: validates the seek table on open; decodes only the frames a range needs. */
int bfs__zst_reader_open(const char *path, bfs_zst_reader **out);
void bfs__zst_reader_free(bfs_zst_reader *r);
uint64_t bfs__zst_reader_size(const bfs_zst_reader *r);     /* uncompressed bytes */
int bfs__zst_reader_mode(const bfs_zst_reader *r);          /* BFS_ZST_* */
uint32_t bfs__zst_reader_frames(const bfs_zst_reader *r);   /* seek table entries */
int bfs__zst_read_range(bfs_zst_reader *r, uint64_t off, uint64_t len,
                        int (*sink)(void *user, const uint8_t *p, size_t n), void *user);
int bfs__zst_pread_range(bfs_zst_reader *r, void *buf, size_t len, uint64_t off);
/* Decode every frame the seek table says holds 0 bytes (read_range skips them): each must
 * be a frame of exactly 0 bytes, or a skippable frame. For whole-file reads. */
int bfs__zst_check_empty_frames(bfs_zst_reader *r);
/* The safetensors header in the first frames, parsed (*hbuf holds its bytes; free both). */
int bfs__zst_read_header(bfs_zst_reader *r, uint8_t **hbuf, bfs_st_header *h);
/* Compressed bytes read from frames and frames decoded since open or the last reset. */
void bfs__zst_reader_stats(const bfs_zst_reader *r, uint64_t *compressed_bytes_read, uint64_t *frames_decoded);
void bfs__zst_reader_reset_stats(bfs_zst_reader *r);
/* Sum of the compressed sizes of the frames overlapping uncompressed [off, off + len). */
uint64_t bfs__zst_span(const bfs_zst_reader *r, uint64_t off, uint64_t len);

/* Decoding from several threads at once (zst_ranges.c): the reader's seek table is only
 * read; each thread decodes with its own bfs_zst_dec. decode_frame decodes frame k, checks
 * its size and checksum, and delivers its original bytes to sink, or writes them straight
 * into direct (dsize bytes) when direct is not NULL. */
typedef struct bfs_zst_dec { /* owned by zst_read.c */
    struct ZSTD_DCtx_s *dctx;
    uint8_t *inbuf, *outbuf;
    size_t outcap;
    uint8_t *gbuf, *gtmp; /* a byte-grouped frame's bytes, and a piece of them restored */
    size_t gcap;
    uint8_t *cbuf;        /* a frame's compressed bytes, read whole (decode_whole) */
    size_t ccap;
    uint64_t bytes_read, frames_decoded;
} bfs_zst_dec;
typedef int (*bfs_zst_sink)(void *user, const uint8_t *p, size_t n);
int bfs__zst_dec_init(bfs_zst_dec *d);
void bfs__zst_dec_free(bfs_zst_dec *d);
int bfs__zst_decode_frame(const bfs_zst_reader *r, bfs_zst_dec *d, uint32_t k, uint8_t *direct, bfs_zst_sink sink,
                          void *user);
const char *bfs__zst_reader_name(const bfs_zst_reader *r);
void bfs__zst_frame_span(const bfs_zst_reader *r, uint32_t k, uint64_t *doff, uint32_t *dsize, uint64_t *coff);
uint32_t bfs__zst_frame_at(const bfs_zst_reader *r, uint64_t off); /* first frame ending past off; frames() if none */

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

#endif
