/* What the manifest's files (manifest*.c, see manifest.h) share and nothing else in src/
 * includes: the keys and marks of the format, the windowed reader's state (the writer
 * copies tensors[] out of it), and the streamed writer's sink and entry point (convert's
 * manifest and merge write through it). Calls between those files go one way:
 * manifest.c -> manifest_write.c -> manifest_read.c -> manifest_common.c, and
 * manifest_check.c -> manifest_read.c -> manifest_common.c. */
#ifndef BFS_MANIFEST_INT_H
#define BFS_MANIFEST_INT_H

#include "output/manifest.h"
#include "base/bfs_io.h"

/* 2 (docs/MANIFEST.md): tensors[] without per-rank records, one line each; each
 * weights file's slice hashes in its slice index (slices.h). Readers take 1 and 2. */
#define BFS_MF_VERSION 2
#define BFS_MF_HASH "xxh3_128"
#define BFS_MF_SHA256 "sha256" /* files[]: only when convert --sha256; v1 readers ignore it */
#define BFS_MF_SRC_HASH "content_xxh3_128" /* source.files[]: srchash.c */
#define BFS_MF_SRC_PART "content_xxh3_128_part" /* a part's source.files[]: its terms' sum (srchash.c) */
#define BFS_MF_PART_TENSORS "tensors_total" /* a part's "part": tensors[] holds its ranks' share of these */
#define BFS_MF_SRC_SCHEME "content_xxh3_128_scheme" /* source: how content_xxh3_128 is made (absent: v2's) */
#define BFS_MF_SEAL "manifest_xxh3_128"
#define BFS_MF_ZERO_SEAL "00000000000000000000000000000000"
/* the head's "tensors" until bfs__manifest_write_conv() writes the array in its place */
#define BFS_MF_TENSORS_HOLE "bfshard: the tensors array goes here"

/* ---- the seal ------------------------------------------------------------------------------
 * bfshard.manifest.json carries "manifest_xxh3_128": the XXH3-128 of the whole file as
 * written with that value set to 32 '0's. Any changed byte of the manifest shows:
 * its hash no longer matches, or the seal is gone. Whoever writes or rewrites a
 * manifest goes through bfs__mf_write_streamed() (manifest_write.c), which seals its final bytes.
 * xxh128sums.txt may hold only lines "HASH  NAME\n" that agree with the manifest. */
#define BFS_SEAL_KEY "\"" BFS_MF_SEAL "\": \""

/* the windowed reader (manifest_read.c); the fuzz build (make fuzz) makes the window a few
 * bytes, so that every case of a token, an element or the seal across its border is reached */
#ifndef BFS_MF_WIN
#define BFS_MF_WIN ((size_t)1 << 20)
#endif
_Static_assert(BFS_MF_WIN >= sizeof BFS_SEAL_KEY, "the seal's key fits in the window");
#define BFS_MF_MAXDEPTH 64 /* a manifest nests 5 deep */
#define BFS_MF_RET(expr)                                                                   \
    do {                                                                                   \
        const int rc_ = (expr);                                                            \
        if (rc_ < 0)                                                                       \
            return rc_;                                                                    \
    } while (0)

struct bfs_mf {
    char *path;
    int fd;
    uint64_t len;
    int flags;
    /* the window: bytes [woff, woff + wlen) of the file; the scanner is at wpos */
    char *win;
    uint64_t woff;
    size_t wlen, wpos;
    /* the scanner */
    int state, depth, uhex;
    bool str_key, key_tensors, want_tensors, in_tensors, seen_tensors, stop_at_array_end;
    unsigned char stack[BFS_MF_MAXDEPTH];
    char key[8];
    size_t keylen;
    uint64_t arr_lo, arr_hi; /* the tensors array: text[arr_lo] '[' .. text[arr_hi - 1] ']' */
    /* the element being cut out */
    bool in_el;
    uint64_t el_off;
    size_t el_seg, el_n, el_cap, nel, ntensors;
    char *el;
    /* the seal: its digits' offset (UINT64_MAX: none), what they say, what the bytes hash to */
    XXH3_state_t *st;
    uint64_t seal_at;
    char seal_want[33], seal_got[33];
    json_t *head;
};

/* the streamed writer (manifest_write.c) */
typedef struct {
    int fd;
    const char *what; /* the temporary's path, for messages */
    char *buf;
    size_t n;         /* bytes in buf */
    uint64_t off;     /* bytes written before them */
    XXH3_state_t *st; /* of every byte handed over */
    int rc;           /* the first error; then nothing more is written */
} bfs_mf_out;

/* one tensor of tensors[], at depth 2, after "[\n  " (the first) or ",\n  " */
int bfs__mf_put_elem(bfs_mf_out *w, const json_t *e, bool first);
/* the same on one line (manifest v2's tensors[]) */
int bfs__mf_put_line(bfs_mf_out *w, const json_t *e, bool first);
/* the end of tensors[] of n elements */
void bfs__mf_put_end(bfs_mf_out *w, size_t n);

/* writes tensors[]'s bytes; then, the manifest's temporary complete and sealed, pre_commit
 * (may be NULL) runs before the commit: an error there leaves no manifest */
typedef int (*bfs_mf_emit_fn)(bfs_mf_out *w, void *user);
typedef int (*bfs_mf_pre_commit_fn)(void *user); /* before the commit */

/* The next element of tensors[] as its bytes (*el valid until the next call), scanned
 * (structure checked), not parsed: 1, 0 at the array's end, < 0 on an error. */
int bfs__mf_next_raw(bfs_mf *r, const char **el, size_t *n);

int bfs__mf_write_streamed(int dirfd, const char *outdir, const char *name, const json_t *head, bfs_mf_emit_fn emit,
                           void *user, bfs_mf_pre_commit_fn pre_commit, void *pre_user);

#endif
