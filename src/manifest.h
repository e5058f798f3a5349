/* The manifest (bfshard.manifest.json) and its companion xxh128sums.txt: this header and
 * manifest.c own their format — building, sealing, loading, reading a files[] entry,
 * the "zst" entry of a compressed copy, writing both files durably, and walking the
 * tensors' shards of one file to narrow a bad file down to tensors. Nothing else in
 * src/ spells a manifest key. */
#ifndef BFS_MANIFEST_H
#define BFS_MANIFEST_H

#include "bfs_internal.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* What convert knows when the run is done; the manifest is built from it. */
typedef struct bfs_manifest_in {
    const bfs_convert_opts *o;
    const bfs_input *in;
    const bfs_plan *plan;
    const char *fingerprint;       /* plan fingerprint, 32 hex */
    const char (*src_hex)[33];     /* per input file */
    const char (*file_hex)[33];    /* per output file */
    char (*const *piece_hex)[33];  /* per output file, per piece */
    json_t *const *zst;            /* per output file: files[].zst entry or NULL (may be NULL) */
    const json_t *aux;             /* extra files written, bfs__manifest_aux_entry()s */
    /* A part (ISSUE 13): NULL for a whole run. Hashes of output files not mine[] and of
     * sources not src_mine[] are null; "part": {"ranks": part, "world_size": W}. */
    const bool *mine;              /* per output file */
    const bool *src_mine;          /* per input file */
    const char *part;              /* canonical rank list */
} bfs_manifest_in;

/* A files[] entry, read and checked (pointers into the JSON). */
typedef struct bfs_manifest_file {
    const char *name;   /* a plain file name: no '/', no leading '.' */
    const char *hash;   /* 32 hex expected (not checked for form) */
    const char *kind;   /* "weights", "config", ... or NULL */
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
/* files[] entry of a small file we wrote beside the weights (new reference, NULL when out of memory). */
json_t *bfs__manifest_aux_entry(const char *name, uint64_t size, const char *hex, const char *kind);
/* files[].zst entry of a compressed copy (new reference, NULL when out of memory). */
json_t *bfs__manifest_zst_entry(const char *zname, uint64_t size, const char *hex, const char *format, int level,
                                uint64_t frame_bytes, uint64_t frames);
/* The "xxh3_128" (hash) of a files[] or zst entry, or NULL. */
const char *bfs__manifest_hash(const json_t *entry);
/* A part's entry whose hash another part holds (null). */
bool bfs__manifest_hash_elsewhere(const json_t *entry);

/* Read OUTDIR's manifest: *m (JSON_REJECT_DUPLICATES; NULL with *jerr when not JSON),
 * *text and *len its bytes, *mpath its path. Fails only when it cannot be read. */
int bfs__manifest_load(const char *outdir, char **mpath, char **text, size_t *len, json_t **m, json_error_t *jerr);
/* The same for the manifest-format file `name` in OUTDIR (a part's manifest). */
int bfs__manifest_load_as(const char *outdir, const char *name, char **mpath, char **text, size_t *len, json_t **m,
                          json_error_t *jerr);
/* files[i] checked: false when malformed (the caller names it). */
bool bfs__manifest_file_get(const json_t *files, size_t i, bfs_manifest_file *out);

/* Serialise m, seal it and write it as OUTDIR's manifest, durably. */
int bfs__manifest_write(int dirfd, const char *outdir, json_t *m);
int bfs__manifest_write_as(int dirfd, const char *outdir, const char *name, json_t *m);
/* A part's manifest: its "part" entry's rank list and world size, its fingerprint; false when malformed. */
bool bfs__manifest_part_info(const json_t *m, const char **ranks, int *world_size, const char **fingerprint);
/* The manifest a single run writes, from the n parts' manifests (names[] for messages):
 * BFS_EPARTS when their fingerprints or options differ or a rank is in two parts,
 * BFS_EINCOMPLETE when a rank or a source hash is in none. *out unsealed (new reference). */
int bfs__manifest_merge(json_t *const *parts, const char *const *names, int n, const char *outdir, json_t **out);
/* xxh128sums.txt: "HASH  NAME" of every files[] entry and its compressed copy that
 * exist in OUTDIR, in manifest order; written durably. */
int bfs__manifest_write_sums(int dirfd, const char *outdir, const json_t *files);
/* Set the "manifest_xxh3_128" field of a manifest's final bytes. */
int bfs__manifest_seal(char *text, size_t len);

/* Verify's checks of the manifest's own integrity: 1 when the seal is missing or wrong,
 * the number of bad lines of xxh128sums.txt (1 when missing); each reported. */
int bfs__manifest_check_seal(const char *mpath, const char *text, size_t len, const json_t *m, FILE *report);
int bfs__manifest_check_sums(const char *outdir, const json_t *files, FILE *report);

/* Narrow a file that does not match down to tensors: for every shard stored in the
 * file `name` (uncompressed size `size`), hash(user, off, nbytes, hex) hashes its bytes
 * (< 0: cannot read them; with report_read_errors that is reported, and the error
 * cleared) and a mismatch is reported as "PATH: BAD tensor ...". Returns the number of
 * tensors reported; *first_data (may be NULL) gets the smallest data offset.
 * The shards are looked up in an index built once per manifest (sorted by file), so
 * narrowing every file of a manifest costs its shards, not files x shards. */
typedef struct bfs_shard_index bfs_shard_index;
int bfs__manifest_shard_index(const json_t *tensors, bfs_shard_index **out);
void bfs__manifest_shard_index_free(bfs_shard_index *ix); /* accepts NULL */
typedef int (*bfs_manifest_hash_fn)(void *user, uint64_t off, uint64_t nbytes, char hex[33]);
int bfs__manifest_narrow(const bfs_shard_index *ix, const char *name, uint64_t size, const char *path, FILE *report,
                         bfs_manifest_hash_fn hash, void *user, bool report_read_errors, uint64_t *first_data);

#endif
