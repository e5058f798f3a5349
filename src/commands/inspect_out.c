/*
 * `inspect` of what bfshard writes (bfs_inspect hands these over): a bfshard OUTDIR,
 * summarised from its manifest (what made it, options, ranks, formats, hashes,
 * compressed copies; nothing is re-hashed: that is verify), and a seekable zstd file
 * .zst/.bfz (format, frames, tensors, ratio; only the header's frames are decoded).
 * Reads only; both in text or JSON.
 */
#include "commands/commands.h"
#include "backend/backend.h"
#include "plan/plan.h"
#include "base/bfs_io.h"
#include "output/manifest.h"
#include "zst/zst.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool bfs__exists(const char *dir, const char *name)
{
    struct stat sb;
    char *p = bfs__path_join(dir, name);
    const bool ok = p && lstat(p, &sb) == 0;
    free(p);
    return ok;
}

static int bfs__print_json(FILE *out, const json_t *root)
{
    char *s = bfs__json_show(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER); /* DEL, C1 escaped too */
    if (!s)
        return bfs__err(BFS_ENOMEM, "out of memory");
    fprintf(out, "%s\n", s);
    free(s);
    return 0;
}

static double bfs__ratio(uint64_t in, uint64_t out) { return out ? (double)in / (double)out : 0.0; }

bool bfs__inspect_is_outdir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) && bfs__exists(path, BFS_MANIFEST_NAME);
}

bool bfs__inspect_is_zst(const char *path)
{
    struct stat sb;
    const size_t n = strlen(path);
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && n > 4 &&
           (!strcmp(path + n - 4, ".zst") || !strcmp(path + n - 4, ".bfz"));
}

/* formats of the output tensors, and how many shard hashes there are: one tensor at a time */
typedef struct {
    json_t *formats;
    size_t shard_hashes, nshards;
} bfs_inspect_tally;

static int bfs__inspect_tensor(void *user, size_t i, const json_t *t)
{
    bfs_inspect_tally *y = user;
    const json_t *sh = json_object_get(t, "shards");
    const char *f = json_string_value(json_object_get(t, "format"));
    f = f ? f : "?";
    if (json_object_set_new(y->formats, f, json_integer(json_integer_value(json_object_get(y->formats, f)) + 1)) != 0)
        return bfs__err(BFS_ENOMEM, "out of memory");
    for (size_t s = 0; s < json_array_size(sh); s++) {
        y->nshards++;
        y->shard_hashes += bfs__manifest_hash(json_array_get(sh, s)) != NULL;
    }
    return 0;
}

/* "tensors: N (format count, ...)": the format names are the manifest's, escaped */
static void bfs__print_formats(FILE *out, size_t ntensors, json_t *formats)
{
    const char *k;
    json_t *v;
    int first = 1;
    char ek[BFS_ESC_MAX];
    fprintf(out, "tensors: %zu (", ntensors);
    json_object_foreach(formats, k, v) {
        fprintf(out, "%s%s %lld", first ? "" : ", ", bfs__esc(k, ek, sizeof ek), (long long)json_integer_value(v));
        first = 0;
    }
    fprintf(out, ")\n");
}

int bfs__inspect_outdir(const char *dir, int as_json, FILE *out)
{
    int rc = 0;
    bfs_mf *mr = NULL;
    json_t *root = NULL, *formats = json_object(), *jfiles = NULL;
    bfs_inspect_tally y = {formats, 0, 0};
    if (!formats)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__mf_open(dir, BFS_MANIFEST_NAME, 0, bfs__inspect_tensor, &y, &mr));
    const char *mpath = bfs__mf_path(mr);
    const json_t *m = bfs__mf_head(mr), *files = json_object_get(m, "files");
    if (!json_is_array(files) || !bfs__mf_has_tensors(mr))
        BFS_FAIL(BFS_EINPUT, "%s: not a bfshard manifest (%s)", mpath, "no files or tensors array");
    const bool seal_ok = bfs__mf_check_seal(mr, NULL) == 0;
    const size_t ntensors = bfs__mf_ntensors(mr);
    size_t shard_hashes = y.shard_hashes, nshards = y.nshards; /* v1: tensors[].shards[] */
    const json_t *opts = json_object_get(m, "options"), *src = json_object_get(m, "source");
    const json_t *srcfiles = json_object_get(src, "files"), *qc = json_object_get(src, "quantization_config");

    uint64_t src_bytes = 0;
    for (size_t i = 0; i < json_array_size(srcfiles); i++)
        src_bytes += (uint64_t)json_integer_value(json_object_get(json_array_get(srcfiles, i), "size"));
    jfiles = json_array();
    size_t nweights = 0, nzst = 0, file_hashes = 0, file_shas = 0, missing = 0;
    uint64_t wbytes = 0, zbytes = 0, zin = 0;
    for (size_t i = 0; i < json_array_size(files); i++) {
        bfs_manifest_file mf;
        if (!bfs__manifest_file_get(files, i, &mf))
            BFS_FAIL(BFS_EINPUT, "%s: files[%zu] is malformed", mpath, i);
        const json_t *e = json_array_get(files, i);
        const bool present = bfs__exists(dir, mf.name), weights = mf.kind && !strcmp(mf.kind, "weights");
        json_t *je = json_pack("{s:s, s:s, s:I, s:b, s:b}", "name", mf.name, "kind", mf.kind ? mf.kind : "?", "size",
                               (json_int_t)mf.size, "hash", mf.hash != NULL, "present", present);
        file_hashes += mf.hash != NULL;
        file_shas += mf.sha256 != NULL;
        if (json_object_get(e, "rank"))
            json_object_set(je, "rank", json_object_get(e, "rank"));
        if (mf.kind && !strcmp(mf.kind, "slices") && mf.size >= 48) { /* v2: a slice index, 16 bytes a slice */
            nshards += (size_t)((mf.size - 48) / 16);
            shard_hashes += mf.hash ? (size_t)((mf.size - 48) / 16) : 0;
        }
        if (weights) {
            nweights++;
            wbytes += mf.size;
        }
        if (mf.zst) {
            const char *zn = json_string_value(json_object_get(mf.zst, "name"));
            const uint64_t zs = (uint64_t)json_integer_value(json_object_get(mf.zst, "size"));
            const bool zp = zn && bfs__exists(dir, zn);
            nzst++;
            zbytes += zs;
            zin += mf.size;
            json_object_set_new(je, "zst", json_pack("{s:s, s:s, s:I, s:f, s:b}", "name", zn ? zn : "?", "format",
                                                     json_string_value(json_object_get(mf.zst, "format"))
                                                         ? json_string_value(json_object_get(mf.zst, "format"))
                                                         : "?",
                                                     "size", (json_int_t)zs, "ratio", bfs__ratio(mf.size, zs), "present",
                                                     zp));
            /* the original may be gone (compress --rm) when its compressed copy is there */
            missing += !zp;
            missing += !present && !zp;
        } else {
            missing += !present;
        }
        json_array_append_new(jfiles, je);
    }
    const char *compressed = nzst == 0 ? "no" : nzst == nweights ? "yes" : "partly";
    const char *made = json_string_value(json_object_get(m, "version"));
    const char *rev = json_string_value(json_object_get(m, "revision"));
    const char *qm = json_string_value(json_object_get(qc, "quant_method"));
    const char *layout = json_string_value(json_object_get(opts, "layout"));

    root = json_object();
    json_object_set_new(root, "input", json_string(dir));
    json_object_set_new(root, "kind", json_string("bfshard-outdir"));
    json_object_set_new(root, "made_by", json_pack("{s:s, s:s}", "version", made ? made : "?", "revision",
                                                   rev ? rev : "unknown"));
    json_object_set_new(root, "options", opts ? json_incref((json_t *)opts) : json_object());
    json_object_set_new(root, "source", json_pack("{s:I, s:I, s:s?}", "files", (json_int_t)json_array_size(srcfiles),
                                                  "bytes", (json_int_t)src_bytes, "quant_method", qm));
    json_object_set_new(root, "weights_files", json_integer((json_int_t)nweights));
    json_object_set_new(root, "weights_bytes", json_integer((json_int_t)wbytes));
    json_object_set_new(root, "tensors", json_integer((json_int_t)ntensors));
    json_object_set_new(root, "formats", formats);
    formats = NULL;
    json_object_set_new(root, "hashes", json_pack("{s:I, s:I, s:I, s:b, s:I}", "files", (json_int_t)file_hashes, "shards",
                                                  (json_int_t)shard_hashes, "shards_total", (json_int_t)nshards,
                                                  "xxh128sums", bfs__exists(dir, BFS_SUMS_NAME), "sha256_files",
                                                  (json_int_t)file_shas));
    json_object_set_new(root, "compressed", json_pack("{s:s, s:I, s:I, s:f}", "state", compressed, "files",
                                                      (json_int_t)nzst, "bytes", (json_int_t)zbytes, "ratio",
                                                      bfs__ratio(zin, zbytes)));
    json_object_set_new(root, "manifest_seal", json_string(seal_ok ? "ok" : "BAD"));
    json_object_set_new(root, "missing_files", json_integer((json_int_t)missing));
    json_object_set(root, "files", jfiles);
    if (as_json) {
        BFS_TRY(bfs__print_json(out, root));
        goto cleanup;
    }
    /* every string below that the manifest holds is printed escaped (base.h, escape.c) */
    const char *mx = json_string_value(json_object_get(opts, "mxfp4_layout"));
    char e1[BFS_ESC_MAX], e2[BFS_ESC_MAX], e3[BFS_ESC_MAX];
    fprintf(out, "%s: bfshard output, made by bfshard %s (%s)\n", bfs__esc_text(dir, e1, sizeof e1),
            bfs__esc(made ? made : "?", e2, sizeof e2), bfs__esc(rev ? rev : "revision unknown", e3, sizeof e3));
    fprintf(out, "options: --world-size %lld --layout %s --mxfp4-layout %s%s\n",
            (long long)json_integer_value(json_object_get(opts, "world_size")), bfs__esc(layout ? layout : "?", e1, sizeof e1),
            bfs__esc(mx ? mx : "?", e2, sizeof e2), json_is_true(json_object_get(opts, "keep_dtype")) ? " --keep-dtype" : "");
    fprintf(out, "source: %zu file(s), %.3f MB%s%s\n", json_array_size(srcfiles), (double)src_bytes / 1e6,
            qm ? ", quantization " : "", qm ? bfs__esc(qm, e1, sizeof e1) : "");
    bfs__print_formats(out, ntensors, json_object_get(root, "formats"));
    fprintf(out, "hashes: %zu file(s), %zu of %zu shard(s), xxh128sums.txt %s; manifest seal %s (`bfshard verify` re-hashes)\n",
            file_hashes, shard_hashes, nshards, bfs__exists(dir, BFS_SUMS_NAME) ? "present" : "MISSING",
            seal_ok ? "ok" : "BAD");
    if (file_shas) /* convert --sha256 */
        fprintf(out, "sha256: %zu file(s), sha256sums.txt %s\n", file_shas,
                bfs__exists(dir, BFS_SHA256SUMS_NAME) ? "present" : "MISSING");
    fprintf(out, "compressed: %s", compressed);
    if (nzst)
        fprintf(out, " (%zu file(s), %.3f MB, %.3fx)", nzst, (double)zbytes / 1e6, bfs__ratio(zin, zbytes));
    fprintf(out, "\n\n%-4s %-52s %14s  %s\n", !layout || strcmp(layout, "hf") ? "rank" : "", "file", "bytes", "");
    for (size_t i = 0; i < json_array_size(jfiles); i++) {
        const json_t *e = json_array_get(jfiles, i), *z = json_object_get(e, "zst");
        const json_t *rk = json_object_get(e, "rank");
        char rbuf[24] = "";
        if (rk)
            snprintf(rbuf, sizeof rbuf, "%lld", (long long)json_integer_value(rk));
        char en[BFS_ESC_MAX], ez[BFS_ESC_MAX], ek[BFS_ESC_MAX]; /* names read from the manifest: escaped */
        const char *nm = json_string_value(json_object_get(e, "name")), *zn = json_string_value(json_object_get(z, "name"));
        const char *kind = json_string_value(json_object_get(e, "kind"));
        fprintf(out, "%-4s %-52s %14lld  %s%s", rbuf, nm ? bfs__esc(nm, en, sizeof en) : "(null)",
                (long long)json_integer_value(json_object_get(e, "size")), kind ? bfs__esc(kind, ek, sizeof ek) : "?",
                json_is_true(json_object_get(e, "present")) ? "" : " (absent)");
        if (z)
            fprintf(out, "; %s %lld bytes (%.3fx)%s", zn ? bfs__esc(zn, ez, sizeof ez) : "(null)",
                    (long long)json_integer_value(json_object_get(z, "size")), json_real_value(json_object_get(z, "ratio")),
                    json_is_true(json_object_get(z, "present")) ? "" : " (absent)");
        fputc('\n', out);
    }
cleanup:
    json_decref(formats);
    json_decref(jfiles);
    json_decref(root);
    bfs__mf_free(mr);
    return rc;
}

int bfs__inspect_zst(const char *path, int as_json, FILE *out)
{
    int rc = 0;
    bfs_zst_reader *r = NULL;
    uint8_t *hb = NULL;
    bfs_st_header h;
    json_t *root = NULL;
    struct stat sb;
    memset(&h, 0, sizeof h);
    if (stat(path, &sb) != 0)
        return bfs__errno(BFS_EINPUT, errno, "%s: cannot stat", path);
    BFS_TRY(bfs__zst_reader_open(path, &r));
    const uint64_t usize = bfs__zst_reader_size(r), csize = (uint64_t)sb.st_size;
    const int mode = bfs__zst_reader_mode(r);
    const uint32_t frames = bfs__zst_reader_frames(r);
    const int hrc = bfs__zst_read_header(r, &hb, &h); /* any seekable zstd file: maybe not safetensors */
    if (hrc < 0 && hrc != BFS_EINPUT)
        BFS_FAIL(hrc, "%s", bfs_last_error());
    const char *why = hrc < 0 ? bfs_last_error() : NULL;
    root = json_object();
    json_t *jt = json_array();
    for (size_t i = 0; hrc == 0 && i < h.n; i++) {
        const bfs_st_tensor *t = &h.t[i];
        const uint64_t n = t->end - t->begin, span = bfs__zst_span(r, h.data_start + t->begin, n);
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
        json_array_append_new(jt, json_pack("{s:s, s:s, s:o, s:I, s:I, s:f}", "name", t->name, "dtype",
                                            bfs__dtype_name(t->dtype), "shape", shape, "bytes", (json_int_t)n,
                                            "compressed_frames_bytes", (json_int_t)span, "ratio", bfs__ratio(n, span)));
    }
    json_object_set_new(root, "input", json_string(path));
    json_object_set_new(root, "kind", json_string("seekable-zstd"));
    json_object_set_new(root, "format", json_string(bfs__zst_mode_name(mode)));
    json_object_set_new(root, "frames", json_integer(frames));
    json_object_set_new(root, "bytes", json_integer((json_int_t)csize));
    json_object_set_new(root, "uncompressed_bytes", json_integer((json_int_t)usize));
    json_object_set_new(root, "ratio", json_real(bfs__ratio(usize, csize)));
    json_object_set_new(root, "safetensors", json_boolean(hrc == 0));
    json_object_set_new(root, "tensors", jt);
    if (as_json) {
        BFS_TRY(bfs__print_json(out, root));
        goto cleanup;
    }
    fprintf(out, "%s: seekable zstd (%s), %u frame(s), %llu -> %llu bytes (%.3fx)\n", path, bfs__zst_mode_name(mode),
            frames, (unsigned long long)usize, (unsigned long long)csize, bfs__ratio(usize, csize));
    if (hrc < 0) {
        fprintf(out, "not a safetensors file inside: %s\n", why);
        bfs__err_clear();
        goto cleanup;
    }
    fprintf(out, "%zu tensor(s); `bfshard extract %s TENSOR` decodes only a tensor's frames\n\n", h.n, path);
    fprintf(out, "%-60s %-6s %14s %8s\n", "tensor", "dtype", "bytes", "ratio");
    for (size_t i = 0; i < json_array_size(jt); i++) {
        const json_t *e = json_array_get(jt, i);
        const char *nm = json_string_value(json_object_get(e, "name"));
        char en[BFS_ESC_MAX]; /* a name read from the file: escaped */
        fprintf(out, "%-60s %-6s %14lld %7.3fx\n", nm ? bfs__esc(nm, en, sizeof en) : "(null)",
                json_string_value(json_object_get(e, "dtype")), (long long)json_integer_value(json_object_get(e, "bytes")),
                json_real_value(json_object_get(e, "ratio")));
    }
cleanup:
    if (rc == 0)
        bfs__err_clear();
    json_decref(root);
    free(hb);
    bfs__st_header_free(&h);
    bfs__zst_reader_free(r);
    return rc;
}
