/*
 * bfshard — quantized Hugging Face checkpoints (MXFP4, bitsandbytes NF4/FP4)
 * to BF16 checkpoints pre-sharded for every FSDP rank, with integrity hashes.
 *
 * Public API. Every function returns 0 or a negative BFS_E* code; results go
 * through out-parameters. After a failure, bfs_last_error() holds a one-line
 * message naming the file, the tensor and the byte offset where they apply.
 */
#ifndef BFSHARD_H
#define BFSHARD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BFS_VERSION_MAJOR 0
#define BFS_VERSION_MINOR 1
#define BFS_VERSION_PATCH 0
#define BFS_VERSION_STRING "0.1.0"

/* Error codes: frozen. The CLI exits with -code (so BFS_EINPUT exits 3). */
enum {
    BFS_OK = 0,
    BFS_EINTERNAL = -1, /* a bug in bfshard */
    BFS_EUSAGE = -2,    /* bad arguments or options */
    BFS_EINPUT = -3,    /* malformed, inconsistent or unsupported input */
    BFS_EIO = -4,       /* a read or write failed (ENOSPC, EIO, permissions) */
    BFS_ENOMEM = -5,    /* out of memory, or a unit does not fit the budget */
    BFS_EDEVICE = -6,   /* no usable GPU, or a CUDA call failed */
    BFS_EVERIFY = -7,   /* output does not match its manifest */
    BFS_EEXIST = -8,    /* OUTDIR exists and is not empty (use --force) */
    BFS_EINTR = -9,     /* interrupted by a signal */
    BFS_EPARTS = -10,   /* parts of one OUTDIR disagree: other input or options, overlapping ranks */
    BFS_EINCOMPLETE = -11 /* merge: a rank is missing (its part not run, not finished, or its file gone) */
};

const char *bfs_strerror(int code);   /* "bad input", ... */
const char *bfs_err_name(int code);   /* "BFS_EINPUT", ... */
const char *bfs_last_error(void);     /* this thread's last message, "" if none */

enum { BFS_LAYOUT_DCP = 0, BFS_LAYOUT_HF = 1 };
enum { BFS_MXFP4_HF = 0, BFS_MXFP4_OPENAI = 1 };
/* Output tensor names: AUTO = TRANSFORMERS for --layout dcp when the model type is in the
 * table (docs/NAMES.md), else CHECKPOINT; CHECKPOINT = the input's names (after dequant);
 * TRANSFORMERS = the names and shapes of transformers 5's state_dict (experts packed 3-D);
 * TORCHTITAN = checkpoint names, each per-expert tensor in the file of the rank torchtitan's
 * FSDP gives its expert (whole when W <= E). */
enum { BFS_NAMES_AUTO = 0, BFS_NAMES_CHECKPOINT = 1, BFS_NAMES_TRANSFORMERS = 2, BFS_NAMES_TORCHTITAN = 3 };

typedef struct bfs_progress {
    uint64_t bytes_done;  /* BF16 bytes written so far */
    uint64_t bytes_total; /* BF16 bytes the run writes */
    const char *tensor;   /* the output tensor being worked on (escaped: docs/ROBUSTNESS.md) */
    /* each stage's busy fraction so far (0..1): its seconds at work over the seconds since the
     * rank files began, per thread of the stage, so that the one near 1 bounds the run. read:
     * the input's identity checks, source hashes, read-ahead and page release (faults the
     * kernels take count as dequant); dequant: the backend's kernels; hash: the writers' hash
     * threads (XXH3, and SHA-256 with sha256); write: the writer threads (write(2), the
     * compressed copy, the last blocks). */
    double busy_read, busy_dequant, busy_hash, busy_write;
    int writers;          /* the writer threads (lanes) of the run */
} bfs_progress;

typedef void (*bfs_progress_fn)(const bfs_progress *p, void *user);

/* ABI: every options and result struct begins with `size`, its size as the caller was
 * compiled (set by its *_init function; call it first). The library reads and writes only
 * the fields that lie within `size`: options beyond it take their defaults, so a program
 * built against an older header keeps working with a newer library; options a newer
 * program sets that this library does not know (nonzero bytes past its struct) are refused
 * with BFS_EUSAGE. size 0 (not initialized) is BFS_EUSAGE. New fields go at the end. */
typedef struct bfs_convert_opts {
    size_t size;             /* sizeof(bfs_convert_opts), set by bfs_convert_opts_init */
    int world_size;          /* >= 1 */
    int layout;              /* BFS_LAYOUT_* */
    const char *device;      /* "auto", "cpu", "cuda", "cuda:N[,M...]" */
    int threads;             /* 0 = one per online CPU */
    uint64_t mem;            /* host buffer budget in bytes, 0 = default */
    uint64_t gpu_mem;        /* device buffer budget in bytes, 0 = default */
    int mxfp4_layout;        /* BFS_MXFP4_* */
    int keep_dtype;          /* keep F32/F16/F64 passthrough tensors as they are */
    int force;               /* replace an existing non-empty OUTDIR */
    uint64_t max_shard_size; /* for BFS_LAYOUT_HF, 0 = 5 GB */
    int cpu_level;           /* -1 = best; else force 0 scalar, 1 avx2, 2 avx512 */
    bfs_progress_fn progress;
    void *progress_user;
    FILE *log;               /* plain log lines, NULL for none */
    int compress_level;      /* 0 = off; else also write each rank file as seekable zstd at this
                                level, NAME.safetensors.zst, recorded in the manifest */
    int compress_mode;       /* BFS_ZST_PLAIN, or BFS_ZST_BYTEGROUP (NAME.safetensors.bfz) */
    /* one part of a conversion across processes or machines (--layout dcp). */
    const char *ranks;       /* NULL: every rank. "0-3,8": only these ranks' files, and a partial
                                manifest bfshard.part-RANKS.json (bfs_merge() finishes). "auto":
                                this process's block of ranks from the launcher's environment
                                (RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, PMI_*, SLURM_PROCID/NTASKS,
                                or JOB_COMPLETION_INDEX with parts) */
    int parts;               /* "auto" with Kubernetes' JOB_COMPLETION_INDEX: the number of parts */
    const char *revision;    /* INPUT given as a Hugging Face repo id or models--org--name cache
                                folder: the branch, tag or commit hash to use (NULL = "main") */
    uint64_t max_rss;        /* 0 = none; else the largest mem up to the default whose predicted
                                peak RSS (bfs_inspect's) fits; not with mem */
    int sha256;              /* also the SHA-256 of every file, in the same pass as XXH3
                                (a thread beside the writer): files[].sha256 in the manifest and
                                sha256sums.txt (`sha256sum -c`) beside xxh128sums.txt */
    int names;               /* BFS_NAMES_*: the output tensors' names (default AUTO) */
} bfs_convert_opts;

void bfs_convert_opts_init(bfs_convert_opts *o);

typedef struct bfs_convert_result {
    size_t size;             /* sizeof(bfs_convert_result), set by bfs_convert_result_init */
    uint64_t bytes_written;  /* BF16 bytes of tensor data written */
    uint64_t files_written;  /* rank files written */
    uint64_t files_reused;   /* rank files from an earlier run reused (resume) */
    uint64_t tensors;        /* output tensors */
    double seconds;
    uint64_t host_buffer_bytes; /* buffers allocated for the run */
    uint64_t gpu_buffer_bytes;
    char backend[64];        /* "cpu/avx2 x8", "cuda:0" */
    uint64_t input_bytes_read;    /* input bytes read: every header, the union of the units' source
                                   * ranges, and bytes read only to be hashed (docs/MANIFEST.md) */
    uint64_t source_bytes_hashed; /* input bytes this run's terms of the source hashes cover (a
                                   * whole run: the input's size; a part: its ranks' blocks) */
    char ranks[128];              /* the ranks converted, "0-3" ("..." when longer); "" for all */
    /* output tensors by what was done to them (their sum is `tensors`) ... */
    uint64_t tensors_dequantized; /* MXFP4 or bitsandbytes 4-bit -> BF16 */
    uint64_t tensors_cast;        /* F32/F16/F64 -> BF16 */
    uint64_t tensors_copied;      /* passed through unchanged */
    uint64_t tensors_dropped;     /* input tensors with no output of their own: the scales and
                                     quantization state folded into a dequantized tensor */
    double write_seconds;         /* the writer threads' time in write(2) and the page-cache bound,
                                     summed over them */
    /* each stage's busy fraction over the run's rank files (as bfs_progress's) */
    double busy_read, busy_dequant, busy_hash, busy_write;
    int writers;                  /* the writer threads (lanes) of the run */
} bfs_convert_result;

void bfs_convert_result_init(bfs_convert_result *r);

/* Convert INPUT into OUTDIR. INPUT is a .safetensors file, a directory, or a model in the
 * local Hugging Face cache (see bfs_hf_resolve). res may be NULL. */
int bfs_convert(const char *input, const char *outdir, const bfs_convert_opts *o,
                bfs_convert_result *res);

/* Ask a running command (convert, verify, compress, decompress, extract; bfs_read_ranges) to stop at its
 * next unit, frame or block (async-signal-safe). It then removes its temporary files and
 * returns BFS_EINTR; no file is committed after it. bfs_convert clears it when it starts. */
void bfs_cancel(void);

/* Describe INPUT and the plan for o->world_size ranks on out: text, or JSON when json != 0.
 * INPUT may also be what bfshard writes: a bfshard OUTDIR (its manifest summarised) or a
 * .zst/.bfz file (its frames, tensors and ratio). */
int bfs_inspect(const char *input, const bfs_convert_opts *o, int json, FILE *out);

/* A model in the local Hugging Face cache, offline, as huggingface_hub finds it. `input`:
 *  - an existing path: returned as it is, unless it is a cache folder models--ORG--NAME
 *    (then its snapshot for `revision`);
 *  - otherwise a repo id "ORG/NAME" (or "NAME"): the folder models--ORG--NAME in the hub
 *    cache, $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
 *    ~/.cache/huggingface/hub.
 * revision (NULL = "main"): a branch or tag (refs/REVISION holds its commit) or a full
 * 40-hex commit hash; the result is snapshots/COMMIT. Writes the path (NUL-terminated) to
 * out. BFS_EINPUT, naming what is missing and how to download it, when the model or the
 * revision is not cached; BFS_EUSAGE for a revision with a path that is not a cache
 * folder. Never uses the network. */
int bfs_hf_resolve(const char *input, const char *revision, char *out, size_t cap);

/* The source revision bfshard was built from (`git describe`), "unknown" outside git. */
const char *bfs_build_revision(void);

/* Re-hash every file and shard of OUTDIR against its manifest. Writes one line
 * per problem to report (may be NULL). Returns 0 when everything matches,
 * BFS_EVERIFY when something does not, another code when it cannot check.
 * A directory holding an `oci-layout` file is an OCIDIR (bfs_pack): every blob's sha256
 * and size, and each bfshard artifact's config and manifest against the OUTDIR manifest
 * it carries as a layer (names, sizes, XXH3-128, media types, ranks). */
int bfs_verify(const char *outdir, FILE *report, uint64_t *bytes_checked);

/* ---- OCI artifacts -------------------------------------------------------------
 * bfs_pack: a verified OUTDIR as an OCI image layout (OCIDIR/oci-layout, index.json,
 * blobs/sha256/) holding a CNCF ModelPack artifact: one raw layer per file (rank files
 * application/vnd.cncf.model.weight.v1.raw, the rest ...weight.config.v1.raw or
 * ...doc.v1.raw), sorted by path, each annotated org.cncf.model.filepath; the config
 * application/vnd.cncf.model.config.v1+json; bfshard's facts as org.bfshard.* annotations
 * (docs/OCI.md). Blobs are hard links to the OUTDIR's files where OCIDIR is on the same file
 * system (else, or with copy, copies hashed as written). Reproducible: the same OUTDIR and
 * options give the same bytes. Crash-safe: blobs first, index.json last, each durably; a
 * rerun goes on. Never removes a file it did not write. */
typedef struct bfs_pack_opts {
    size_t size;          /* sizeof(bfs_pack_opts), set by bfs_pack_opts_init */
    const char *tag;      /* index.json's org.opencontainers.image.ref.name; NULL = "latest" */
    int copy;             /* copy every blob, even where a hard link is possible */
    int verify;           /* re-hash every file, even those whose SHA-256 convert --sha256 recorded
                             and that did not change since (mtime) */
    const char *name;     /* config descriptor.name; NULL = OUTDIR's directory name */
    const char *revision; /* config descriptor.revision (e.g. the source's commit); NULL = none */
    const char *created;  /* descriptor.createdAt: "now" or RFC 3339; NULL = none (reproducible) */
    FILE *log;            /* one line per step, NULL for none */
} bfs_pack_opts;

void bfs_pack_opts_init(bfs_pack_opts *o);

typedef struct bfs_pack_result {
    size_t size;                /* sizeof(bfs_pack_result), set by bfs_pack_result_init */
    char manifest_digest[72];   /* "sha256:<hex>" of the OCI manifest */
    uint64_t layers, bytes;     /* layers, and the bytes of their files */
    uint64_t linked, copied, kept; /* blobs hard-linked, copied, found already there */
    uint64_t bytes_hashed;      /* bytes read to hash (files whose SHA-256 was not recorded, or --verify) */
    double seconds;
} bfs_pack_result;

void bfs_pack_result_init(bfs_pack_result *r);

/* Pack OUTDIR (a finished, merged conversion that verifies: else BFS_EVERIFY, and nothing is
 * tagged) into OCIDIR (new, empty, or an OCI image layout; not OUTDIR nor inside it, nor
 * OUTDIR inside it: BFS_EUSAGE). res may be NULL. */
int bfs_pack(const char *outdir, const char *ocidir, const bfs_pack_opts *o, bfs_pack_result *res);

/* Finish a conversion done in parts (bfs_convert_opts.ranks) in one OUTDIR: check that its
 * bfshard.part-*.json come from the same input and options (else BFS_EPARTS) and hold every
 * rank exactly once with its file present (else BFS_EINCOMPLETE), then write
 * bfshard.manifest.json and xxh128sums.txt, byte-identical to a single run's, and remove the
 * parts' files. One line per part to log (may be NULL). */
int bfs_merge(const char *outdir, FILE *log);

/* "cpu/avx512", "cpu/avx2", "cpu/scalar" for the best level here; and whether CUDA was built. */
const char *bfs_cpu_level_name(int level);
int bfs_cpu_best_level(void);
int bfs_cuda_built(void);
/* Number of usable CUDA devices, 0 when none or no driver (never fails). */
int bfs_cuda_device_count(void);

/* ---- reading byte ranges of a file into memory ----------------------------------
 * What bfshard.torch.load() reads a rank file with: each range's bytes of the file go
 * straight into its destination (one copy, each destination page touched once), by pread(2)
 * from several threads, without a mapping of the file. */
typedef struct bfs_range {
    uint64_t offset; /* in the file */
    uint64_t length; /* bytes; 0 reads nothing (dest may then be NULL) */
    void *dest;      /* length writable bytes, not overlapping another range's */
} bfs_range;

/* Read ranges[0..n) of the file at path into their destinations. The ranges are cut into
 * pieces of up to 16 MiB that `threads` threads (0: one per online CPU, at most 16; never
 * more than there are pieces) take in the array's order (pass them sorted by offset to read
 * the file front to back); EINTR and short reads are retried. A range that follows the one
 * before it both in the file and in memory is read with it, in the same pread.
 * BFS_EUSAGE: path NULL, ranges NULL with n > 0, a NULL dest with a length, or a range past
 * the largest file offset (offset + length overflows). BFS_EIO: the file cannot be opened or
 * a read fails; BFS_EINPUT: the file ends before a range does (truncated). The one-line
 * message names the file and the offset. bfs_cancel() stops it before its next pread:
 * BFS_EINTR (it clears a cancel pending when it starts, as bfs_convert does). On failure
 * the destinations hold an unspecified part of their bytes. */
int bfs_read_ranges(const char *path, const bfs_range *ranges, size_t n, int threads);

/* bfs_read_ranges, and the XXH3-128 of the whole file (size bytes) written to xxh3_128 as 32
 * lowercase hex digits and a NUL (the manifest's files[].xxh3_128), in one pass: the file is
 * cut into pieces of 4 MiB, each read by one of `threads` threads (its ranges' parts into
 * their destinations, the bytes no range covers -- header, padding, tensors not asked for --
 * into a 4 MiB window of that thread's), then hashed from there by that thread once every
 * piece before it is hashed, while its bytes are still in the cache: the storage and the
 * destinations are each gone over once. The ranges with a length must be sorted by offset,
 * none overlapping another (BFS_EUSAGE otherwise). BFS_EINPUT besides bfs_read_ranges':
 * the file does not have size bytes when opened or once read (truncated, changed), or a
 * range ends past size. `threads`, the messages and bfs_cancel() (BFS_EINTR) as for
 * bfs_read_ranges. On failure xxh3_128 is "" and the destinations hold an unspecified part
 * of their bytes; on success they hold the bytes hashed (compare the hash before trusting
 * them). Memory: a 4 MiB window a thread, of which only the bytes no range covers are
 * touched. */
int bfs_read_ranges_xxh128(const char *path, const bfs_range *ranges, size_t n, int threads, uint64_t size,
                           char xxh3_128[33]);

/* The same out of a seekable zstd copy of a file (a .zst or .bfz of bfshard compress, below):
 * offset and length are those of the file it decompresses to. Only the frames holding a
 * range are decoded, each once, by `threads` threads (0: one per online CPU, at most 16;
 * never more than there are frames to decode); a frame inside one range is decoded straight
 * into its destination. Every decoded frame's size and checksum is checked. Besides the
 * ranges, a thread holds about 1.2 MiB of buffers and at most three frames' worth (the
 * compressed bytes of a frame decoded whole, the decoder's window for a frame decoded in
 * pieces, a byte-grouped frame's bytes): with the default 4 MiB frames, about 13 MiB a
 * thread at most. BFS_EUSAGE as bfs_read_ranges; BFS_EINPUT: no such file, no seek table
 * (not seekable zstd, or truncated), a corrupt or truncated frame, a checksum that differs,
 * or a range past the decompressed end; BFS_EIO: the file cannot be opened or read. The
 * one-line message names the file, and the frame with its compressed and uncompressed
 * offsets. bfs_cancel() stops it before its next frame: BFS_EINTR (cleared when it starts). */
int bfs_read_ranges_zst(const char *path, const bfs_range *ranges, size_t n, int threads);
/* bfs_read_ranges_zst, and the XXH3-128 of the whole file the copy decompresses to (size
 * bytes: BFS_EINPUT when its seek table says otherwise), as bfs_read_ranges_xxh128 gives it:
 * every frame is decoded, once, by one of `threads` threads (straight into a range's
 * destination when it lies inside one, else into that thread's buffer of one frame and
 * copied from there), then hashed from where it landed by that thread once every frame
 * before it is hashed. Ranges as bfs_read_ranges_xxh128 takes them; a thread holds one
 * frame more than bfs_read_ranges_zst's. */
int bfs_read_ranges_zst_xxh128(const char *path, const bfs_range *ranges, size_t n, int threads, uint64_t size,
                               char xxh3_128[33]);
/* The size of the file a seekable zstd copy decompresses to, from its seek table (checked
 * as bfs_read_ranges_zst checks it; no frame is decoded). */
int bfs_zst_uncompressed_size(const char *path, uint64_t *size);

/* ---- compressed artifacts (seekable zstd) ------------------------------------
 * A rank file compressed as seekable zstd: independent zstd frames cut at every tensor
 * boundary and after at most frame_bytes, then a seek table, so one tensor can be read
 * without decompressing the file. BFS_ZST_PLAIN (".zst") is restored byte for byte by
 * stock `zstd -d`. BFS_ZST_BYTEGROUP (".bfz", bfshard only) stores the high bytes of
 * each BF16 tensor's elements before their low bytes (smaller); stock zstd refuses it. */
enum { BFS_ZST_PLAIN = 0, BFS_ZST_BYTEGROUP = 1 };

typedef struct bfs_compress_opts {
    size_t size;          /* sizeof(bfs_compress_opts), set by bfs_compress_opts_init */
    int level;            /* zstd level (1..19, up to 22), 0 = 3 */
    int threads;          /* compression threads, 0 = one per online CPU */
    int mode;             /* BFS_ZST_* */
    uint64_t frame_bytes; /* largest frame (uncompressed bytes), 0 = 4 MiB */
    int force;            /* replace an existing output */
    int remove;           /* OUTDIR: delete each rank file once its compressed copy is recorded */
    FILE *log;            /* one line per file, NULL for none */
} bfs_compress_opts;

void bfs_compress_opts_init(bfs_compress_opts *o);

typedef struct bfs_compress_result {
    size_t size;                  /* sizeof(bfs_compress_result), set by bfs_compress_result_init */
    uint64_t bytes_in, bytes_out; /* uncompressed and compressed bytes */
    uint64_t files, frames;
    double seconds;
    char xxh3_128[33];            /* single file: hash of the compressed file */
    char uncompressed_xxh3_128[33];
} bfs_compress_result;

void bfs_compress_result_init(bfs_compress_result *r);

/* Compress an existing .safetensors file (frames cut at its tensor boundaries) as
 * BFS_ZST_PLAIN. out_path must not exist (o->force: replaced after success). Every file
 * command writes a temporary beside out_path and renames it only after success, and
 * refuses an out_path that is the input file (same device and inode). */
int bfs_compress_file(const char *in_path, const char *out_path, int level, int threads);
int bfs_compress_file_opts(const char *in_path, const char *out_path, const bfs_compress_opts *o,
                           bfs_compress_result *res);
/* Compress every rank file of a bfshard OUTDIR to NAME.safetensors.zst (.bfz) and record
 * each in the manifest (files[].zst = {name, size, xxh3_128, format, level, ...}); a rank
 * file whose bytes differ from its manifest hash is refused (BFS_EVERIFY). */
int bfs_compress_outdir(const char *outdir, const bfs_compress_opts *o, bfs_compress_result *res);
/* Decompress a .zst or .bfz made by bfshard (any seekable zstd file) to out_path
 * ("-": standard output). Every frame's size and checksum is checked. */
int bfs_decompress_file(const char *in_path, const char *out_path);
/* The same; o->force replaces an existing out_path (only after success; never the input). */
int bfs_decompress_file_opts(const char *in_path, const char *out_path, const bfs_compress_opts *o);
/* Write one tensor of a compressed safetensors file to out_path ("-": standard output),
 * decoding only the frames that hold it: a standalone .safetensors holding just that
 * tensor, or its raw little-endian bytes when raw != 0. */
int bfs_extract(const char *zst_path, const char *tensor_name, const char *out_path, int raw);
int bfs_extract_opts(const char *zst_path, const char *tensor_name, const char *out_path, int raw,
                     const bfs_compress_opts *o);
/* ---- end of compressed artifacts ---- */

#ifdef __cplusplus
}
#endif
#endif
