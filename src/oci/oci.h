/*
 * src/oci/ -- a bfshard OUTDIR as an OCI image layout holding a CNCF ModelPack artifact
 * (docs/OCI.md is the format). What the artifact says (oci_model.c: the media
 * type of each file, the ModelPack config from the OUTDIR manifest, the OCI manifest),
 * writing the layout crash-safely (oci_write.c: oci-layout, blobs hard-linked or copied,
 * index.json last), and checking one (oci_check.c: every blob's sha256, the config and
 * the manifest against the OUTDIR manifest carried as a layer). Uses output/ (the
 * manifest reader, durable commits, the hash check) and base/. bfs_pack and the
 * OCIDIR branch of bfs_verify (src/commands/) sit above it.
 */
#ifndef BFS_OCI_H
#define BFS_OCI_H

#include "base/base.h"
#include "base/bfs_io.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/* ---- the formats (OCI image-spec v1.1, CNCF ModelPack model-spec v1) ------------------------ */
#define BFS_OCI_LAYOUT_FILE "oci-layout"
#define BFS_OCI_LAYOUT_VERSION "1.0.0"
#define BFS_OCI_INDEX_FILE "index.json"
#define BFS_OCI_MT_INDEX "application/vnd.oci.image.index.v1+json"
#define BFS_OCI_MT_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define BFS_OCI_ANN_REF "org.opencontainers.image.ref.name"
#define BFS_OCI_ANN_CREATED "org.opencontainers.image.created"
#define BFS_MP_ARTIFACT "application/vnd.cncf.model.manifest.v1+json"
#define BFS_MP_MT_CONFIG "application/vnd.cncf.model.config.v1+json"
#define BFS_MP_MT_WEIGHT "application/vnd.cncf.model.weight.v1.raw"
#define BFS_MP_MT_WCONFIG "application/vnd.cncf.model.weight.config.v1.raw"
#define BFS_MP_MT_DOC "application/vnd.cncf.model.doc.v1.raw"
#define BFS_MP_MT_CODE "application/vnd.cncf.model.code.v1.raw"
#define BFS_MP_ANN_FILEPATH "org.cncf.model.filepath"
/* bfshard's own facts, reverse-domain as OCI annotations must be */
#define BFS_OCI_ANN "org.bfshard."
#define BFS_OCI_ANN_MANIFEST BFS_OCI_ANN "manifest"           /* the layer holding bfshard.manifest.json */
#define BFS_OCI_ANN_SEAL BFS_OCI_ANN "manifest.xxh3_128"      /* its seal */
#define BFS_OCI_ANN_FINGERPRINT BFS_OCI_ANN "plan_fingerprint"
#define BFS_OCI_ANN_VERSION BFS_OCI_ANN "version"             /* the bfshard that converted */
#define BFS_OCI_ANN_WORLD BFS_OCI_ANN "world_size"
#define BFS_OCI_ANN_LAYOUT BFS_OCI_ANN "layout"               /* dcp | hf */
#define BFS_OCI_ANN_RANK BFS_OCI_ANN "rank"                   /* a layer: the FSDP rank of its file */
#define BFS_OCI_ANN_XXH3 BFS_OCI_ANN "xxh3_128"               /* a layer: its file's XXH3-128 */
#define BFS_OCI_DEFAULT_TAG "latest"

/* One file of the OUTDIR as one layer: its blob is the file's bytes, unchanged. */
typedef struct bfs_oci_layer {
    char name[256];         /* org.cncf.model.filepath: the file's name in OUTDIR */
    const char *media_type; /* BFS_MP_MT_* (bfs__oci_media_type) */
    uint64_t size;
    char sha256[65];
    char xxh3[33];          /* "" for the files the OUTDIR manifest does not list (itself, the sums) */
    char recorded[65];      /* pack: the SHA-256 the OUTDIR manifest records (convert --sha256), or "" */
    int rank;               /* the FSDP rank of a dcp rank file, else -1 */
    /* pack: the OUTDIR file it comes from (fstat'ed, checked before it is linked or copied) */
    dev_t dev;
    ino_t ino;
} bfs_oci_layer;

/* The media type of an OUTDIR file: weights for a manifest "weights" entry, doc for
 * README / LICENSE / NOTICE files, weight config for the rest (config, tokenizer, index,
 * bfshard's manifest and sums). kind: the manifest's files[].kind, or NULL. */
const char *bfs__oci_media_type(const char *name, const char *kind);

/* ---- what the artifact says (oci_model.c) ------------------------------------------------ */
/* What the artifact says about the model: from the OUTDIR manifest's summary
 * (bfs__oci_facts_from), and what the caller names it. */
typedef struct bfs_oci_facts {
    /* descriptor: given by the caller (name required; revision and created may be NULL) */
    const char *name, *revision, *created;
    /* config, from the manifest */
    char precision[256];     /* the tensors' dtypes as ModelPack names them, "bfloat16[,...]" */
    char quantization[1088]; /* the source's: formats of the dequantized tensors, else quant_method */
    char param_size[32];     /* "20.9b"; "" when under a thousand */
    /* annotations, from the manifest head */
    char version[64], layout[8], seal[33], fingerprint[33];
    int world_size;
} bfs_oci_facts;

struct bfs_manifest_summary;
void bfs__oci_facts_from(const struct bfs_manifest_summary *s, bfs_oci_facts *f);
/* The ModelPack config (application/vnd.cncf.model.config.v1+json) of these layers, in
 * order: compact JSON, keys in the spec's order, nothing the schema does not know.
 * *text is malloc'ed, *len its bytes (no NUL counted). */
int bfs__oci_config_json(const bfs_oci_facts *f, const bfs_oci_layer *l, size_t n, char **text, size_t *len);
/* The OCI image manifest: artifactType ModelPack, the config's descriptor, one layer per
 * file in the given (sorted) order, bfshard's facts as annotations. */
int bfs__oci_manifest_json(const bfs_oci_facts *f, const char *config_sha, size_t config_len,
                           const bfs_oci_layer *l, size_t n, char **text, size_t *len);
/* "now" becomes the current UTC time; an RFC 3339 date-time is kept; else BFS_EUSAGE. */
int bfs__oci_created(const char *arg, char out[40]);
/* OCI/Docker tag grammar: [A-Za-z0-9_][A-Za-z0-9._-]{0,127} */
bool bfs__oci_tag_ok(const char *tag);

/* ---- writing a layout (oci_write.c) -------------------------------------------------------- */
typedef struct bfs_oci_dir {
    const char *path;
    int dirfd;      /* OCIDIR, flock'ed: one writer */
    int blobfd;     /* OCIDIR/blobs/sha256 */
    char blobdir[4096];
    bool created;   /* this run made OCIDIR */
} bfs_oci_dir;

/* OCIDIR and OUTDIR must not be the same directory nor one inside the other (BFS_EUSAGE). */
int bfs__oci_check_paths(const char *outdir, const char *ocidir);
/* Open OCIDIR for writing (created when absent; its parent must exist): empty, or an OCI
 * image layout (oci-layout of version 1.0.0), else BFS_EEXIST. Another writer: BFS_EEXIST.
 * oci-layout and blobs/sha256/ made durably where missing; our temporaries left by a killed
 * run (".HEX.partial" in blobs/sha256, ".index.json.partial") removed; nothing else touched. */
int bfs__oci_open(const char *ocidir, bfs_oci_dir *d);
void bfs__oci_close(bfs_oci_dir *d, bool failed);
/* The layer's blob: already there (the same inode, or bytes that hash to its name: kept),
 * else a hard link to OUTDIR's file (srcfd: the file open, checked to be l->dev/l->ino)
 * when on the same file system and !copy, else a copy whose bytes are hashed as written
 * (BFS_EVERIFY when they do not hash to l->sha256). *how: 0 kept, 1 linked, 2 copied. */
int bfs__oci_put_file(bfs_oci_dir *d, int srcdirfd, int srcfd, const bfs_oci_layer *l, bool copy, uint8_t *buf,
                      size_t bufsize, int *how);
/* A blob of these bytes (the config, the manifest): kept when there, else written durably. */
int bfs__oci_put_bytes(bfs_oci_dir *d, const void *data, size_t len, char sha[65]);
/* index.json: the descriptor of the manifest (sha, len) tagged `tag`, replacing the entry
 * of that tag in place, every other entry kept; written durably, last: the commit point. */
int bfs__oci_index_set(bfs_oci_dir *d, const char *tag, const char *sha, size_t len);

/* ---- checking a layout (oci_check.c) ------------------------------------------------------- */
/* A directory holding an `oci-layout` file (and no bfshard.manifest.json: an OUTDIR stays one). */
bool bfs__oci_is_layout(const char *path);
/* bfs_verify of an OCIDIR: every manifest of index.json that is a ModelPack artifact made by
 * bfshard (the others are named and skipped): its manifest and config blobs, every layer
 * blob's sha256 and size, the config's schema and diffIds, and each layer against the
 * OUTDIR manifest it carries (names, sizes, XXH3-128 and sha256, media types, ranks). One
 * line per problem to report; 0, BFS_EVERIFY, or another code when it cannot check. */
int bfs__oci_check(const char *ocidir, FILE *report, uint64_t *bytes_checked);

#endif
