/* Internal interfaces of libbfshard. Prefix bfs__ for everything here. */
#ifndef BFS_INTERNAL_H
#define BFS_INTERNAL_H

#include "bfshard.h"
#include "../kernels/bfs_kernels.h"

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
int bfs__errno(int code, int errnum, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void bfs__err_clear(void);
bool bfs__err_is_set(void);
/* bfs_cancel() was called (a signal): every long loop and every commit checks it. */
bool bfs__cancelled(void);

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

/* ---- the public structs' sizes (abi.c) ---------------------------------------------
 * bfs__struct_in: dst (dst_size bytes, holding the defaults) gets the fields of the
 * caller's struct src that lie within src's `size` (src NULL: nothing); BFS_EUSAGE when
 * src's size is 0 or src sets bytes past dst_size. bfs__struct_out_check: BFS_EUSAGE
 * when a result struct dst (may be NULL) has no size. bfs__struct_out: copies src into dst
 * within dst's size (never its size field). */
int bfs__struct_in(void *dst, size_t dst_size, const void *src, const char *what);
int bfs__struct_out_check(const void *dst, const char *what);
void bfs__struct_out(void *dst, const void *src, size_t src_size);

/* ---- the Hugging Face cache (hfcache.c) ------------------------------------------------
 * INPUT as bfs_hf_resolve() finds it, into a new string (free it). */
int bfs__hf_resolve_dup(const char *input, const char *revision, char **out);

/* ---- inspect of what bfshard writes (inspect_out.c) --------------------------------------- */
bool bfs__inspect_is_outdir(const char *path); /* a directory holding bfshard.manifest.json */
bool bfs__inspect_is_zst(const char *path);    /* a regular file named *.zst or *.bfz */
int bfs__inspect_outdir(const char *dir, int as_json, FILE *out);
int bfs__inspect_zst(const char *path, int as_json, FILE *out);

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
    BFS_DT_F8_E4M3, BFS_DT_F8_E5M2, BFS_DT_COUNT
} bfs_dtype;

int bfs__dtype_parse(const char *s, bfs_dtype *out); /* 0, or -1 when unknown */
const char *bfs__dtype_name(bfs_dtype d);
size_t bfs__dtype_size(bfs_dtype d);

#define BFS_MAX_DIMS 8

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

/* ---- input set --------------------------------------------------------------- */
typedef struct bfs_infile {
    char *path;      /* as given/resolved, for messages */
    char *name;      /* base name */
    int fd;
    uint64_t size;
    const uint8_t *map; /* mmap of the whole file, read-only */
    bfs_st_header h;
    uint64_t id[6];  /* identity at open: st_dev, st_ino, mtime s/ns, ctime s/ns (with size) */
} bfs_infile;

typedef struct bfs_raw {
    const bfs_st_tensor *st; /* in its file's header */
    int file;                /* index into files */
    const uint8_t *data;     /* mmapped bytes */
    uint64_t file_offset;    /* absolute offset of data in the file */
    uint64_t nbytes;
    int used;                /* claimed by a logical tensor */
} bfs_raw;

typedef struct bfs_input {
    char *root;         /* directory holding the files (for config.json etc.) */
    int nfiles;
    bfs_infile *files;
    size_t nraw;
    bfs_raw *raw;       /* sorted by name */
    char *config_json;  /* contents of config.json, or NULL */
} bfs_input;

int bfs__input_open(const char *path, bfs_input **out);
void bfs__input_free(bfs_input *in);
const bfs_raw *bfs__input_find(const bfs_input *in, const char *name);
/* BFS_EINPUT when input file `file` (every file when < 0) changed since it was opened:
 * its identity (device, inode, size, mtime, ctime) differs, or it was truncated under
 * its mapping (input.c: the SIGBUS handler). Any write(2) to the file changes its
 * ctime, which no user can set back. */
int bfs__input_check(const bfs_input *in, int file);

/* ---- plan ---------------------------------------------------------------------- */
typedef enum bfs_kind {
    BFS_K_PASS = 0, BFS_K_CAST, BFS_K_MXFP4, BFS_K_BNB4,
    BFS_K_FP8,   /* FP8 E4M3 + scale grid (src/formats/fp8.c) */
    BFS_K_INT4,  /* compressed-tensors pack-quantized INT4 (src/formats/int4.c) */
    BFS_K_NVFP4, /* NVFP4, compressed-tensors or ModelOpt (src/formats/nvfp4.c) */
} bfs_kind;

typedef struct bfs_ltensor {
    char *name;        /* output name */
    bfs_kind kind;
    bfs_dtype out_dtype;
    int ndim;
    int nsrc;
    uint64_t shape[BFS_MAX_DIMS];
    uint64_t row_elems; /* product of shape[1..] (1 for 0-d and 1-d) */
    uint64_t d0;        /* shape[0], or 1 for 0-d */
    const bfs_raw *src[6]; /* source tensors; see nsrc */
    const char *transform; /* "mxfp4->bf16 transpose(1,2)", "nf4->bf16", "cast f32->bf16", "copy" */
    bfs_dtype src_dtype;  /* PASS/CAST: input dtype; BNB4: the blob's dtype */
    const char *qname;    /* FP8/INT4/NVFP4: the name inspect and the manifest give it (static) */
    /* kind-specific: one kind's members only (a plan holds one of these per tensor; the
     * plan zeroes the entry before each format's claim) */
    union {
        struct {
            bfs_mxfp4_desc mx;  /* MXFP4: blocks/scales pointers, R, G, transpose */
            int mx_items;       /* 1: dim 0 is items (4-d blocks); 0: dim 0 is rows R (3-d blocks) */
        };
        struct {
            bfs_bnb4_desc bnb;  /* BNB4 */
            char quant_type[8]; /* "nf4" / "fp4" */
            bool double_quant;
        };
        bfs_fp8_desc fp8;     /* FP8 */
        bfs_int4_desc int4;   /* INT4 */
        bfs_nvfp4_desc nv;    /* NVFP4 */
    };
} bfs_ltensor;

/* A tensor's piece in one output file. */
typedef struct bfs_piece {
    int tensor;         /* index into plan->t */
    uint64_t row0, row1;/* dim-0 rows [row0, row1) of the global tensor */
    uint64_t offset;    /* absolute file offset of the data */
    uint64_t nbytes;
} bfs_piece;

typedef struct bfs_outfile {
    char *name;         /* "shard-00001-model-00001-of-00001.safetensors" */
    uint64_t size;
    uint64_t data_start; /* 8 + the header's length (counted by the layout; the text: bfs__plan_header) */
    size_t npieces;
    bfs_piece *pieces;  /* in file order */
} bfs_outfile;

typedef struct bfs_plan {
    int world_size;
    int layout;
    size_t nt;
    bfs_ltensor *t;     /* sorted by output name */
    int nfiles;
    bfs_outfile *files;
    uint64_t total_bytes; /* tensor bytes over all files */
    uint64_t max_row_bytes; /* largest single dim-0 row (smallest indivisible unit) */
    size_t ndropped;
    const char **dropped; /* input tensors dropped (activation / KV-cache scales), by name
                           * (pointers into the input's headers), sorted */
} bfs_plan;

/* Group raw tensors into logical ones and validate them (quantization metadata). */
int bfs__plan_tensors(const bfs_input *in, const bfs_convert_opts *o, bfs_plan **out);
/* Lay out the output files for o->world_size / o->layout (headers, offsets). */
int bfs__plan_layout(bfs_plan *p, const bfs_convert_opts *o);
void bfs__plan_free(bfs_plan *p);
/* File f's complete header bytes (length f->data_start - 8, space padded, NUL-terminated)
 * into *out (free it): built when needed, so that the plan holds no file's header text. */
int bfs__plan_header(const bfs_plan *p, const bfs_outfile *f, char **out);
const char *bfs__kind_name(const bfs_ltensor *t); /* "mxfp4", "bnb-nf4", "bnb-nf4-dq", "passthrough" */
/* What convert does to t: "dequantized", "cast" or "copied" (inspect, the manifest);
 * an input tensor in plan->dropped is "dropped". */
const char *bfs__kind_action(const bfs_ltensor *t);

/* FSDP2 Shard(0) / torch.chunk rule: rows of rank r out of d0 for W ranks. */
static inline void bfs__chunk_rows(uint64_t d0, uint64_t W, uint64_t r, uint64_t *row0, uint64_t *row1)
{
    const uint64_t chunk = d0 == 0 ? 0 : (d0 + W - 1) / W;
    uint64_t a = r * chunk, b = (r + 1) * chunk;
    *row0 = a < d0 ? a : d0;
    *row1 = b < d0 ? b : d0;
}

/* ---- backends ------------------------------------------------------------------- */
/* A unit: rows [row0, row1) of logical tensor t, to be written as out_dtype
 * bytes into out (row-major, (row1-row0) * row_elems elements). */
typedef struct bfs_unit {
    const bfs_ltensor *t;
    uint64_t row0, row1;
    void *out;
} bfs_unit;

typedef struct bfs_backend bfs_backend;
struct bfs_backend {
    char name[64];
    /* Fill u->out. Synchronous: when it returns, u->out is complete. */
    int (*run)(bfs_backend *b, const bfs_unit *u);
    void (*destroy)(bfs_backend *b);
    uint64_t device_bytes; /* allocated on the device at creation (0 for cpu) */
    /* Optional (NULL: use malloc): host memory for unit buffers that run() fills fastest
     * (CUDA: pinned, the D2H lands in it directly). Free with host_free before destroy. */
    void *(*host_alloc)(bfs_backend *b, size_t n);
    void (*host_free)(bfs_backend *b, void *p);
};

/* CPU backend: level < 0 best; threads 0 = online CPUs. */
int bfs__backend_cpu_create(int level, int threads, bfs_backend **out);
/* CUDA backend over devices (spec "cuda", "cuda:N", "cuda:N,M"); allocates all of
 * its buffers once from gpu_mem; max_unit_bytes is the largest unit the pipeline will pass. */
int bfs__backend_cuda_create(const char *spec, uint64_t gpu_mem, uint64_t max_unit_bytes,
                             bfs_backend **out);
int bfs__cuda_device_count(void);
/* Usable CUDA devices; when none, why (no driver, driver too old for this build, no GPU,
 * too old a GPU, built without CUDA) in why[n] (may be NULL). Creates no CUDA context. */
int bfs__cuda_probe(char *why, size_t n);
int bfs__cuda_built(void);

/* Run one unit with the CPU kernels k on this thread: rows [row0,row1) -> out
 * (the CPU backend's unthreaded path; the fuzzers). */
void bfs__unit_cpu(const bfs_kernel_ops *k, const bfs_unit *u);
/* THE unit-level reference: bfs__unit_cpu with the scalar kernels. Every backend's
 * output is compared with it by memcmp (tests/test_kernels.c, tests/test_cuda.c). */
void bfs__ref_unit(const bfs_unit *u);
/* The kernels' cast source of a CAST tensor's dtype (F32, F16; anything else is F64). */
static inline bfs_cast_src bfs__cast_src(bfs_dtype d)
{
    return d == BFS_DT_F32 ? BFS_CAST_F32 : d == BFS_DT_F16 ? BFS_CAST_F16 : BFS_CAST_F64;
}

/* ---- hashing ---------------------------------------------------------------------- */
/* XXH3-128 in canonical big-endian hex: 32 chars + NUL */
typedef struct { char hex[33]; } bfs_hash_hex;

/* ---- misc utilities ----------------------------------------------------------------- */
char *bfs__strdup(const char *s);
/* One line of a verify report on out (nothing when out is NULL). */
void bfs__report(FILE *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
char *bfs__path_join(const char *a, const char *b);
/* A name read from a file, printable on one line: control bytes, '"', '\\' and DEL
 * escaped as JSON does (\n, \u001b, ...); cut with "..." to fit cap. Returns buf. */
const char *bfs__esc(const char *s, char *buf, size_t cap);
#define BFS_ESC_MAX 1024
/* json_dumps(j, flags) plus a final newline; *len excludes the NUL. NULL when out of memory. */
struct json_t;
char *bfs__json_text(const struct json_t *j, size_t flags, size_t *len);
/* json_dumps(j, flags) that fails instead of dropping a character when out of memory */
char *bfs__json_dump(const struct json_t *j, size_t flags);
int bfs__read_small_file(const char *path, size_t max, char **out, size_t *len);


/* ---- compressed artifacts: seekable zstd (src/zst.c; ISSUE 7) ------------------------------ */
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
/* For convert: the manifest's files[].zst object of a finished writer (new reference). */
struct json_t *bfs__zst_manifest_entry(const bfs_zst_writer *w, const char *zname);
/* For convert's reused rank files: compress the .safetensors at in_path into ofd (finished). */
int bfs__zst_compress_into(const char *in_path, int ofd, int level, int threads, int mode, bfs_zst_writer **wout);
/* ---- end of compressed artifacts ---- */

#endif
