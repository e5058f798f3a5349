/*
 * What every manifest file uses (see manifest.h, manifest_int.h): verify's report lines
 * (bfs__report: every report line names a manifest entry), a files[] or zst entry's hash,
 * building the files[] entry of an aux file and the "zst" entry of a compressed copy, and
 * reading one files[] entry. The lowest of the manifest files: it calls none of them.
 */
#include "output/manifest_int.h"

#include <stdlib.h>
#include <string.h>

void bfs__report(FILE *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    bfs__vline(out, NULL, fmt, ap); /* escaped: the values it quotes come from files */
    va_end(ap);
}

const char *bfs__manifest_hash(const json_t *entry) { return json_string_value(json_object_get(entry, BFS_MF_HASH)); }
const char *bfs__manifest_sha256(const json_t *entry)
{
    return json_string_value(json_object_get(entry, BFS_MF_SHA256));
}

bool bfs__manifest_has_sha256(const json_t *files)
{
    for (size_t i = 0; i < json_array_size(files); i++)
        if (json_object_get(json_array_get(files, i), BFS_MF_SHA256))
            return true;
    return false;
}
bool bfs__manifest_hash_elsewhere(const json_t *entry) { return json_is_null(json_object_get(entry, BFS_MF_HASH)); }

json_t *bfs__manifest_aux_entry(const char *name, uint64_t size, const char *hex, const char *sha, const char *kind)
{
    if (sha)
        return json_pack("{s:s, s:I, s:s, s:s, s:s}", "name", name, "size", (json_int_t)size, BFS_MF_HASH, hex,
                         BFS_MF_SHA256, sha, "kind", kind);
    return json_pack("{s:s, s:I, s:s, s:s}", "name", name, "size", (json_int_t)size, BFS_MF_HASH, hex, "kind", kind);
}

json_t *bfs__manifest_zst_entry(const char *zname, uint64_t size, const char *hex, const char *format, int level,
                                uint64_t frame_bytes, uint64_t frames)
{
    return json_pack("{s:s, s:I, s:s, s:s, s:i, s:I, s:I}", "name", zname, "size", (json_int_t)size, BFS_MF_HASH, hex,
                     "format", format, "level", level, "frame_bytes", (json_int_t)frame_bytes, "frames",
                     (json_int_t)frames);
}

/* ---- reading ------------------------------------------------------------------------------- */
bool bfs__manifest_file_get(const json_t *files, size_t i, bfs_manifest_file *out)
{
    json_t *f = json_array_get(files, i);
    const json_t *jsz = json_object_get(f, "size");
    memset(out, 0, sizeof *out);
    out->name = json_string_value(json_object_get(f, "name"));
    out->hash = bfs__manifest_hash(f);
    out->kind = json_string_value(json_object_get(f, "kind"));
    out->zst = json_object_get(f, "zst");
    const json_t *js = json_object_get(f, BFS_MF_SHA256);
    out->sha256 = json_string_value(js);
    if (!out->name || !out->hash || !json_is_integer(jsz) || strchr(out->name, '/') || out->name[0] == '.')
        return false;
    if (js && (!out->sha256 || !bfs__is_sha256_hex(out->sha256))) /* present: 64 hex (null: another part's) */
        return false;
    const json_t *jr = json_object_get(f, "rank");
    out->rank = json_is_integer(jr) && json_integer_value(jr) >= 0 && json_integer_value(jr) < 1000000
                    ? (int)json_integer_value(jr) : -1;
    if (jr && out->rank < 0)
        return false;
    out->size = (uint64_t)json_integer_value(jsz);
    return true;
}
