/* src/input/ -- what bfshard reads: the safetensors reader (safetensors.c), the input set
 * mmapped and checked (input.c), a model named in the Hugging Face cache (hfcache.c), and
 * the source hashes of exactly the bytes the kernels read (srchash.c, srchash.h). Uses
 * src/base only. */
#ifndef BFS_INPUT_H
#define BFS_INPUT_H

#include "base/base.h"
#include "input/safetensors.h"

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
    bool one_file;      /* the input was one weights file: its folder need not be a checkpoint's */
    int nfiles;
    bfs_infile *files;
    size_t nraw;
    bfs_raw *raw;       /* sorted by name */
    char *config_json;  /* contents of config.json, or NULL */
    uint32_t *by_hash;  /* open addressing over raw[] by name: pairs (1 + index, 0 empty; the
                         * name's hash); NULL: lookups by binary search */
    size_t hcap;        /* a power of two, at least twice nraw */
} bfs_input;

int bfs__input_open(const char *path, bfs_input **out);
void bfs__input_free(bfs_input *in);
const bfs_raw *bfs__input_find(const bfs_input *in, const char *name);
/* BFS_EINPUT when input file `file` (every file when < 0) changed since it was opened:
 * its identity (device, inode, size, mtime, ctime) differs, or it was truncated under
 * its mapping (input.c: the SIGBUS handler). Any write(2) to the file changes its
 * ctime, which no user can set back. */
int bfs__input_check(const bfs_input *in, int file);
/* Every map advised MADV_RANDOM: a fault reads its page and no readahead. For a part, whose
 * rows of a weight are a thin band: readahead ran into the other ranks' bands (at W = 64 the
 * storage delivered 25x the part's bytes); it reads ahead by hand (bfs__prefetch_pieces). */
void bfs__input_random(const bfs_input *in);

/* Input bytes one unit reads: [off, off + len) of raw tensor r's data (the formats say
 * which: bfs__unit_sources; the source hashes take them). */
typedef struct {
    const bfs_raw *r;
    uint64_t off, len; /* relative to r->data */
} bfs_srange;

/* ---- the side files (sidefiles.c) ------------------------------------------------------
 * Every top-level entry of the input folder that is not read as input (its weights files,
 * config.json, model.safetensors.index.json), sorted by name: to be copied unchanged beside
 * the weights (why NULL), or skipped, why says why (a static string). A side file is a
 * regular file of at most BFS_MAX_SIDE bytes with a plain name, opened with O_NOFOLLOW;
 * a link is read only in a Hugging Face cache snapshot, to a file of the cache's blobs/. */
#define BFS_MAX_SIDE (64u << 20)
typedef struct bfs_side {
    char *name;      /* in the input folder, and in OUTDIR */
    const char *why; /* NULL: copied */
    char *blob;      /* a cache snapshot's link: its target's name in blobs/ */
    uint64_t size;
    uint64_t id[5];  /* st_dev, st_ino, size, mtime s/ns of the file read, when listed */
} bfs_side;
typedef struct bfs_sides {
    bfs_side *v;
    size_t n;
    int dfd, bfd;              /* the input folder; the cache's blobs/ (-1: not a cache snapshot) */
    char blobs[4096];          /* its real path */
} bfs_sides;
int bfs__sides_list(const bfs_input *in, bfs_sides *out);
void bfs__sides_free(bfs_sides *s);
/* A copied side file's bytes (malloc'ed, NUL after them): BFS_EINPUT when it is not the file listed. */
int bfs__side_read(const bfs_sides *ss, const bfs_side *s, const char *root, char **data, size_t *len);

/* ---- the Hugging Face cache (hfcache.c) ------------------------------------------------
 * INPUT as bfs_hf_resolve() finds it, into a new string (free it). */
int bfs__hf_resolve_dup(const char *input, const char *revision, char **out);

#endif
