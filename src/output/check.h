/* The hash check of an OUTDIR (check.c), below the public bfs_verify so that resume can use
 * it: every file re-hashed against the manifest(s), a bad one narrowed to its tensors. */
#ifndef BFS_CHECK_H
#define BFS_CHECK_H

#include "plan/plan.h"

#include <stdint.h>
#include <stdio.h>

/* What bfs_verify does, without clearing the error first: 0, BFS_EVERIFY (the report names
 * each problem), or another code when it cannot check. */
int bfs__check_outdir(const char *outdir, FILE *report, uint64_t *bytes_checked);
/* Re-hash the files a part manifest `pname` in OUTDIR holds (0, BFS_EVERIFY, or another
 * code when it cannot check). */
int bfs__check_part(const char *outdir, const char *pname, FILE *report, uint64_t *bytes_checked);

#endif
