/* What made this build: the source revision, from `git describe` at build time (the
 * Makefile passes it as BFS_BUILD_REVISION to this file only, and rebuilds it when it
 * changes). Recorded in every manifest and printed by `bfshard --version`. */
#include "base/base.h"

#ifndef BFS_BUILD_REVISION
#define BFS_BUILD_REVISION "unknown"
#endif

const char *bfs_build_revision(void) { return BFS_BUILD_REVISION[0] ? BFS_BUILD_REVISION : "unknown"; }
