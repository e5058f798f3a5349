/* The manifest (bfshard.manifest.json) and its companion xxh128sums.txt: this header and
 * manifest*.c own their format — building, sealing, loading, reading a files[] entry,
 * the "zst" entry of a compressed copy, writing both files durably, and walking the
 * tensors' shards of one file to narrow a bad file down to tensors. Nothing else in
 * src/ spells a manifest key. Which file owns what (manifest_int.h: what they share):
 *   manifest.c         building a finished conversion's manifest (head, tensors[]) and writing it
 *   manifest_write.c   the streamed, sealed writer; compress's rewrite; xxh128sums.txt; merging parts
 *   manifest_read.c    the windowed reader: strict scanner, seal hash, per-element parse, the seal check
 *   manifest_check.c   xxh128sums.txt's check; the shard index and narrowing a bad file
 *   manifest_common.c  bfs__report, an entry's hash, aux/zst entries, reading a files[] entry
 *   manifest_summary.c what it says about the model as a whole (bfshard pack, OCI verify)
 * Calls go one way: manifest.c -> _write -> _read -> _common; _check -> _read -> _common;
 * _summary -> _read -> _common. */
#ifndef BFS_MANIFEST_H
#define BFS_MANIFEST_H

#include "plan/plan.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* One line of a verify report on out (nothing when out is NULL). */
void bfs__report(FILE *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* What convert knows when the run is done; the manifest is built from it. */
typedef struct bfs_manifest_in {
    const bfs_convert_opts *o;
    const bfs_input *in;
    const bfs_plan *plan;
    const char *fingerprint;       /* plan fingerprint, 32 hex */
    const char (*src_hex)[33];     /* per input file: content hash (a part: its terms' sum, srchash.c) */
    const char (*file_hex)[33];    /* per output file */
    const char (*file_sha)[65];    /* per output file: SHA-256 (convert --sha256), or NULL */
    const char (*slices_hex)[33];  /* per output file: its slice index's XXH3-128 */
    const char (*slices_sha)[65];  /* per output file: its SHA-256 (convert --sha256), or NULL */
    json_t *const *zst;            /* per output file: files[].zst entry or NULL (may be NULL) */
    const json_t *aux;             /* extra files written, bfs__manifest_aux_entry()s */
    const json_t *skipped;         /* the input folder's files not copied: [{name, why}], or NULL */
    /* A part: NULL for a whole run. Hashes of output files not mine[] are null,
     * each source's content hash too, its terms' sum beside it (content_xxh3_128_part);
     * "part": {"ranks": part, "world_size": W}. */
    const bool *mine;              /* per output file */
    const char *part;              /* canonical rank list */
} bfs_manifest_in;

/* A files[] entry, read and checked (pointers into the JSON). */
typedef struct bfs_manifest_file {
    const char *name;   /* a plain file name: no '/', no leading '.' */
    const char *hash;   /* 32 hex expected (not checked for form) */
    const char *sha256; /* 64 lowercase hex (checked), or NULL when not recorded */
    const char *kind;   /* "weights", "config", ... or NULL */
    int rank;           /* a dcp rank file's rank, else -1 */
    uint64_t size;
    json_t *zst;        /* the compressed copy's entry, or NULL */
} bfs_manifest_file;

/* The manifest of a finished conversion but its tensors (new reference): "tensors" is a
 * placeholder, for bfs__manifest_write_conv(). "files" is whole (xxh128sums.txt). */
int bfs__manifest_build_head(const bfs_manifest_in *mi, json_t **out);
/* Write it as OUTDIR's `name`, durably and sealed, with the tensors array streamed in the
 * placeholder's place, one tensor at a time: memory does not grow with the tensors, and
 * the bytes are those of bfs__manifest_write_as() of the whole tree. */
int bfs__manifest_write_conv(int dirfd, const char *outdir, const char *name, const bfs_manifest_in *mi,
                             const json_t *head);
/* files[] entry of a small file we wrote beside the weights (new reference, NULL when out of
 * memory); sha: its SHA-256 hex, or NULL (not recorded). */
json_t *bfs__manifest_aux_entry(const char *name, uint64_t size, const char *hex, const char *sha, const char *kind);
/* files[].zst entry of a compressed copy (new reference, NULL when out of memory). */
json_t *bfs__manifest_zst_entry(const char *zname, uint64_t size, const char *hex, const char *format, int level,
                                uint64_t frame_bytes, uint64_t frames);
/* The "xxh3_128" (hash) of a files[] or zst entry, or NULL. */
const char *bfs__manifest_hash(const json_t *entry);
/* The "sha256" of a files[] entry, or NULL (not recorded, or another part's). */
const char *bfs__manifest_sha256(const json_t *entry);
/* Some files[] entry records a SHA-256: sha256sums.txt belongs with the manifest. */
bool bfs__manifest_has_sha256(const json_t *files);
/* A part's entry whose hash another part holds (null). */
bool bfs__manifest_hash_elsewhere(const json_t *entry);

/* Reading a manifest-format file (OUTDIR's bfshard.manifest.json, or a part's) with memory
 * that does not grow with its tensors: it is read through a 1 MiB window, never whole.
 * bfs__mf_open() makes one pass over the bytes: a strict scanner checks the JSON's
 * structure (strings and escapes, nesting, colons, commas), the bytes are hashed for the
 * seal, and every element of the top object's "tensors" array is cut out and parsed alone
 * by jansson (JSON_REJECT_DUPLICATES; it must be an object) and handed to each() (may be
 * NULL); with BFS_MF_HEAD_ONLY the elements are only scanned. Then jansson parses the
 * head: every member but "tensors", which is there the placeholder string that
 * bfs__manifest_write_conv() and bfs__mf_write_copy() write the array in the place of.
 * Malformed: BFS_EINPUT "PATH: not a bfshard manifest (malformed JSON at byte N: ...)".
 * Memory: the window, the head, one tensor. */
typedef struct bfs_mf bfs_mf;
typedef int (*bfs_mf_each_fn)(void *user, size_t i, const json_t *tensor);
#define BFS_MF_HEAD_ONLY 1
int bfs__mf_open(const char *outdir, const char *name, int flags, bfs_mf_each_fn each, void *user, bfs_mf **out);
/* the same for `name` opened at dirfd, never through a symbolic link */
int bfs__mf_openat(int dirfd, const char *outdir, const char *name, int flags, bfs_mf_each_fn each, void *user,
                   bfs_mf **out);
void bfs__mf_free(bfs_mf *r); /* accepts NULL */
const char *bfs__mf_path(const bfs_mf *r);
json_t *bfs__mf_head(const bfs_mf *r); /* owned by r; may be changed (compress records its copies there) */
size_t bfs__mf_ntensors(const bfs_mf *r);
bool bfs__mf_has_tensors(const bfs_mf *r); /* a "tensors" array was there */
/* tensors[] again, one at a time: 1 and *tensor (new reference), 0 after the last, < 0 on
 * an error; the first call after open starts at tensors[0], and so does one after rewind. */
int bfs__mf_rewind(bfs_mf *r);
int bfs__mf_next(bfs_mf *r, json_t **tensor);
/* Verify's check of the manifest's own integrity: 1 (reported) when the seal is missing or
 * does not match the bytes, else 0. */
int bfs__mf_check_seal(const bfs_mf *r, FILE *report);
/* Write head (its "tensors" the placeholder) as OUTDIR's `name`, durably and sealed, with
 * src's tensors array copied in byte for byte. */
int bfs__mf_write_copy(int dirfd, const char *outdir, const char *name, const json_t *head, bfs_mf *src);

/* files[i] checked: false when malformed (the caller names it). */
bool bfs__manifest_file_get(const json_t *files, size_t i, bfs_manifest_file *out);

/* What a finished conversion's manifest (not a part's: BFS_EINPUT) says about the model,
 * from one windowed read of `name` in dir (opened at dirfd when >= 0, never through a
 * symbolic link): for bfshard pack's ModelPack config and the OCI check. */
typedef struct bfs_manifest_summary {
    uint32_t dtypes;        /* a bit (1 << bfs_dtype) per dtype of tensors[] */
    uint64_t params;        /* elements of every tensor (UINT64_MAX when that overflows) */
    char formats[1088];     /* the dequantized tensors' formats, sorted, ',' between; "" when none */
    char quant_method[64];  /* source.quantization_config.quant_method, or "" */
    char version[64], layout[8], seal[33], fingerprint[33];
    int world_size;
    bool seal_ok;           /* the seal matches the bytes */
    json_t *files;          /* files[] (new reference: json_decref) */
} bfs_manifest_summary;
int bfs__manifest_summary(int dirfd, const char *dir, const char *name, bfs_manifest_summary *s);

/* A part's manifest head: its "part" entry's rank list and world size, its fingerprint; false when malformed. */
bool bfs__manifest_part_info(const json_t *m, const char **ranks, int *world_size, const char **fingerprint);
/* Write the manifest a single run writes (OUTDIR's bfshard.manifest.json) from the n parts
 * read (names[] for messages), tensors[] merged in lockstep one tensor at a time:
 * BFS_EPARTS when their fingerprints or options differ or a rank is in two parts,
 * BFS_EINCOMPLETE when a rank or a source hash is in none. pre_commit(pre_user, head) (may
 * be NULL) runs when the manifest's temporary is complete, before its commit; on any error
 * no manifest is written. */
typedef int (*bfs_manifest_pre_commit_fn)(void *user, const json_t *head);
int bfs__manifest_merge(int dirfd, bfs_mf *const *parts, const char *const *names, int n, const char *outdir,
                        bfs_manifest_pre_commit_fn pre_commit, void *pre_user);
/* xxh128sums.txt: "HASH  NAME" of every files[] entry and its compressed copy that
 * exist in OUTDIR, in manifest order; and when the entries record SHA-256,
 * sha256sums.txt the same way (`sha256sum -c`; compressed copies carry XXH3 only).
 * Each written durably, before the manifest that vouches for them. */
int bfs__manifest_write_sums(int dirfd, const char *outdir, const json_t *files);

/* Verify's check of xxh128sums.txt (and of sha256sums.txt when the entries record SHA-256):
 * the number of bad lines (1 when missing); each reported. */
int bfs__manifest_check_sums(const char *outdir, const json_t *files, FILE *report);

/* Narrow a file that does not match down to tensors: for every shard stored in the
 * file `name` (uncompressed size `size`), hash(user, off, nbytes, hex) hashes its bytes
 * (< 0: cannot read them; with report_read_errors that is reported, and the error
 * cleared) and a mismatch is reported as "PATH: BAD tensor ...". Returns the number of
 * tensors reported; *first_data (may be NULL) gets the smallest data offset.
 * The shards are looked up in an index built once per manifest (two passes over r's
 * tensors, one tensor in memory at a time): 40 bytes per shard of a files[] entry and
 * each tensor's name, grouped by file, so narrowing every file costs its shards, not
 * files x shards. files: the head's files[]. */
typedef struct bfs_shard_index bfs_shard_index;
int bfs__manifest_shard_index(bfs_mf *r, const json_t *files, bfs_shard_index **out);
void bfs__manifest_shard_index_free(bfs_shard_index *ix); /* accepts NULL */
typedef int (*bfs_manifest_hash_fn)(void *user, uint64_t off, uint64_t nbytes, char hex[33]);
int bfs__manifest_narrow(const bfs_shard_index *ix, const char *name, uint64_t size, const char *path, FILE *report,
                         bfs_manifest_hash_fn hash, void *user, bool report_read_errors, uint64_t *first_data);

#endif
