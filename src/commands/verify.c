/*
 * bfs_verify: re-hash every file of OUTDIR against bfshard.manifest.json (or its parts'
 * manifests). The check itself is src/output/check.c's, where resume uses it too; this is
 * the public entry point. A directory holding an `oci-layout` file is an OCI image layout
 * (bfshard pack): src/oci/oci_check.c checks it.
 */
#include "commands/commands.h"
#include "oci/oci.h"
#include "output/check.h"

int bfs_verify(const char *outdir, FILE *report, uint64_t *bytes_checked)
{
    bfs__err_clear();
    if (outdir && bfs__oci_is_layout(outdir))
        return bfs__oci_check(outdir, report, bytes_checked);
    return bfs__check_outdir(outdir, report, bytes_checked);
}
