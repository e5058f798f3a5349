/*
 * bfs_verify: re-hash every file of OUTDIR against bfshard.manifest.json (or its parts'
 * manifests). The check itself is src/output/check.c's, where resume uses it too; this is
 * the public entry point.
 */
#include "commands/commands.h"
#include "output/check.h"

int bfs_verify(const char *outdir, FILE *report, uint64_t *bytes_checked)
{
    bfs__err_clear();
    return bfs__check_outdir(outdir, report, bytes_checked);
}
