/* A weights file's slice index (manifest v2; format: docs/MANIFEST.md): the
 * XXH3-128 of its header bytes and of every tensor slice it holds, written beside it as
 * NAME.slices by the process that writes the weights file. The manifest then no longer
 * carries a record per (tensor, rank): it stays O(tensors + files), and a part writes only
 * its own ranks' indexes. slices.c owns the bytes: building, writing, checking, and
 * narrowing a weights file that does not match down to its tensors. */
#ifndef BFS_SLICES_H
#define BFS_SLICES_H

#include "plan/plan.h"
#include "base/bfs_io.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define BFS_SLICES_MAGIC "BFSLICES"
#define BFS_SLICES_VERSION 1u
#define BFS_SLICES_HDR 48u /* magic, version, reserved, data_start, header hash, count */
#define BFS_SLICES_EXT ".slices"

/* The size of the index of a file of npieces slices (overflow-checked: UINT64_MAX). */
uint64_t bfs__slices_size(uint64_t npieces);
/* "X.safetensors" -> "X.slices" (any other name: NAME.slices); BFS_EINTERNAL when it does not fit. */
int bfs__slices_name(const char *weights, char *out, size_t cap);

/* Build file f's index from its header's hash (hdr_hex, the writer's; NULL: hashed here
 * from the plan's header text) and its pieces' hashes, write it durably as OUTDIR's
 * bfs__slices_name() (shared: parts of one OUTDIR may write at once), and give its
 * XXH3-128 (hex) and, when sha is not NULL, its SHA-256. */
int bfs__slices_write(int dirfd, const char *outdir, const bfs_plan *p, int f, const bfs_dig16 *piece_dig,
                      const char *hdr_hex, bool shared, char hex[33], char *sha);

/* Reading the weights file being narrowed: n bytes at off into dst (< 0: cannot, the
 * error set); and the XXH3-128 hex of [off, off + n). */
typedef int (*bfs_slices_read_fn)(void *user, uint64_t off, uint64_t n, void *dst);
typedef int (*bfs_slices_hash_fn)(void *user, uint64_t off, uint64_t n, char hex[33]);

/* Narrow a weights file (path, size bytes uncompressed) that does not match its manifest
 * entry down to tensors, with its index (ix, ixlen bytes, already checked against its own
 * manifest entry; ixname for messages). Its header bytes are checked against the index
 * first; when they match, each tensor the header lists is hashed and each mismatch is
 * reported "PATH: BAD tensor "NAME" bytes [a, b) (hash H, manifest M)" (a read error too,
 * with report_read_errors). Returns the number of tensors reported, 0 when the header
 * itself differs or no tensor does (*data_start: where the data begins, for the caller's
 * "BAD header or metadata" line), or BFS_EINPUT when the index is malformed. */
int bfs__slices_narrow(const uint8_t *ix, size_t ixlen, const char *ixname, const char *path, uint64_t size,
                       FILE *report, bfs_slices_read_fn rd, bfs_slices_hash_fn hash, void *user,
                       bool report_read_errors, uint64_t *data_start);

#endif
