/*
 * The manifest's format (see manifest.h): bfshard.manifest.json is built here from a
 * finished conversion, its head whole and its tensors[] one tensor at a time, and
 * written through the streamed writer (manifest_write.c), which seals it. Reading is
 * manifest_read.c, merging and compress's rewrite manifest_write.c, xxh128sums.txt's
 * check and narrowing manifest_check.c, the shared entries manifest_common.c.
 */
#include "output/manifest_int.h"
#include "output/parts.h"
#include "output/slices.h"
#include "input/srchash.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ---- building ---------------------------------------------------------------------------- */
/* a hash, or null where another part of the conversion knows it */
static json_t *bfs__hash_val(const char *hex, bool known) { return known ? json_string(hex) : json_null(); }

/* NULL when out of memory (never a short shape) */
static json_t *bfs__shape_json(const uint64_t *s, int n)
{
    json_t *a = json_array();
    for (int d = 0; a && d < n; d++)
        if (json_array_append_new(a, json_integer((json_int_t)s[d])) != 0) {
            json_decref(a);
            a = NULL;
        }
    return a;
}

/* NULL when out of memory: jansson drops a NULL value silently, so every key is checked */
static json_t *bfs__manifest_head(const bfs_manifest_in *mi)
{
    const bfs_convert_opts *o = mi->o;
    json_t *m = json_object();
    bool ok = m != NULL;
    ok = ok && json_object_set_new(m, "tool", json_string("bfshard")) == 0;
    ok = ok && json_object_set_new(m, "version", json_string(BFS_VERSION_STRING)) == 0;
    ok = ok && json_object_set_new(m, "revision", json_string(bfs_build_revision())) == 0; /* git describe of the build */
    ok = ok && json_object_set_new(m, "manifest_version", json_integer(BFS_MF_VERSION)) == 0;
    ok = ok && json_object_set_new(m, "hash", json_string("XXH3-128 (canonical big-endian hex, as xxh128sum)")) == 0;
    ok = ok && json_object_set_new(m, "plan_fingerprint", json_string(mi->fingerprint)) == 0;
    ok = ok && json_object_set_new(m, "options",
                                   json_pack("{s:i, s:s, s:s, s:b, s:I, s:s}", "world_size", o->world_size, "layout",
                                             mi->plan->layout == BFS_LAYOUT_DCP ? "dcp" : "hf", "mxfp4_layout",
                                             o->mxfp4_layout == BFS_MXFP4_HF ? "hf" : "openai", "keep_dtype",
                                             o->keep_dtype, "max_shard_size", (json_int_t)o->max_shard_size, "names",
                                             mi->plan->names_family   ? "transformers"
                                             : mi->plan->names_target ? mi->plan->names_target
                                                                      : "checkpoint")) == 0;
    /* the target-name table's row applied, and per-expert tensors left under checkpoint names */
    if (ok && mi->plan->names_family)
        ok = json_object_set_new(m, "names", json_pack("{s:s, s:s}", "table", mi->plan->names_family, "doc",
                                                       "docs/NAMES.md")) == 0;
    if (ok && mi->plan->names_unmapped)
        ok = json_object_set_new(m, "names", json_pack("{s:s, s:I}", "warning",
                                                       "per-expert tensors under checkpoint names: transformers 5 packs experts on load, so DCP will not load them into its model",
                                                       "per_expert_tensors", (json_int_t)mi->plan->names_unmapped)) == 0;
    /* source.files[].content_xxh3_128: XXH3-128 of the file's header plus those of its
     * blocks, seeded with their offsets, from the bytes the kernels read (srchash.c); a
     * part's terms' sum as content_xxh3_128_part, which merge adds up */
    json_t *src = json_array();
    for (int i = 0; ok && src && i < mi->in->nfiles; i++) {
        json_t *e = json_pack("{s:s, s:I, s:o}", "name", mi->in->files[i].name, "size", (json_int_t)mi->in->files[i].size,
                              BFS_MF_SRC_HASH, bfs__hash_val(mi->src_hex[i], !mi->part));
        if (e && mi->part && json_object_set_new(e, BFS_MF_SRC_PART, json_string(mi->src_hex[i])) != 0) {
            json_decref(e);
            e = NULL;
        }
        ok = json_array_append_new(src, e) == 0;
    }
    if (!ok || !src || json_array_size(src) != (size_t)mi->in->nfiles) {
        json_decref(src);
        json_decref(m);
        return NULL;
    }
    json_t *sobj = json_pack("{s:s, s:o}", BFS_MF_SRC_SCHEME, BFS_SRC_HASH_SCHEME, "files", src);
    ok = json_object_set_new(m, "source", sobj) == 0;
    if (ok && mi->in->config_json) {
        json_error_t jerr;
        json_t *cfg = json_loads(mi->in->config_json, 0, &jerr);
        json_t *qc = cfg ? json_object_get(cfg, "quantization_config") : NULL;
        if (!cfg && json_error_code(&jerr) == json_error_out_of_memory)
            ok = false;
        if (qc && json_object_set(sobj, "quantization_config", qc) != 0)
            ok = false;
        json_decref(cfg);
    }
    if (!ok) {
        json_decref(m);
        return NULL;
    }
    return m;
}

/* files[] entry of file f (weights, or with ix its slice index), NULL when out of memory */
static json_t *bfs__manifest_file_entry(const bfs_manifest_in *mi, int f, bool ix)
{
    const bfs_plan *p = mi->plan;
    const bool known = !mi->mine || mi->mine[f];
    char sname[NAME_MAX + 1];
    if (ix && bfs__slices_name(p->files[f].name, sname, sizeof sname) < 0)
        return NULL;
    const char *name = ix ? sname : p->files[f].name, *hex = ix ? mi->slices_hex[f] : mi->file_hex[f];
    const char *sha = !mi->file_sha ? NULL : ix ? mi->slices_sha[f] : mi->file_sha[f];
    const uint64_t size = ix ? bfs__slices_size(p->files[f].npieces) : p->files[f].size;
    json_t *e = sha ? json_pack("{s:s, s:I, s:o, s:o, s:s}", "name", name, "size", (json_int_t)size, BFS_MF_HASH,
                                bfs__hash_val(hex, known), BFS_MF_SHA256, bfs__hash_val(sha, known), "kind",
                                ix ? "slices" : "weights")
                    : json_pack("{s:s, s:I, s:o, s:s}", "name", name, "size", (json_int_t)size, BFS_MF_HASH,
                                bfs__hash_val(hex, known), "kind", ix ? "slices" : "weights");
    bool ok = e != NULL;
    if (ok && ix)
        ok = json_object_set_new(e, "of", json_string(p->files[f].name)) == 0;
    if (ok && !ix && p->layout == BFS_LAYOUT_DCP)
        ok = json_object_set_new(e, "rank", json_integer(f)) == 0;
    if (ok && !ix && mi->zst && mi->zst[f])
        ok = json_object_set(e, "zst", mi->zst[f]) == 0;
    if (!ok) {
        json_decref(e); /* one file short: the caller counts them */
        e = NULL;
    }
    return e;
}

/* the weights files, their slice indexes (manifest v2), the small files */
static json_t *bfs__manifest_files(const bfs_manifest_in *mi)
{
    json_t *files = json_array();
    for (int f = 0; f < mi->plan->nfiles; f++)
        json_array_append_new(files, bfs__manifest_file_entry(mi, f, false));
    for (int f = 0; f < mi->plan->nfiles; f++)
        json_array_append_new(files, bfs__manifest_file_entry(mi, f, true));
    for (size_t i = 0; i < json_array_size(mi->aux); i++)
        json_array_append(files, json_array_get(mi->aux, i));
    return files;
}

/* tensors[i] (manifest v2: what it is, not where each rank's rows are; those follow from
 * the sharding rule, and their hashes are in the slice indexes), or NULL when out of memory */
static json_t *bfs__manifest_tensor(const bfs_manifest_in *mi, size_t i)
{
    const bfs_plan *p = mi->plan;
    const bfs_ltensor *t = &p->t[i];
    json_t *srcs = json_array(), *e = NULL;
    bool whole = srcs != NULL;
    const char *format = bfs__kind_name(t);
    for (size_t m = 0; whole && m < bfs__nparts(t); m++) { /* a packed tensor: its members', in order */
        const bfs_ltensor *pt = bfs__part(t, m);
        for (int k = 0; whole && k < pt->nsrc; k++)
            whole = json_array_append_new(srcs, json_string(pt->src[k]->st->name)) == 0;
        if (strcmp(bfs__kind_name(pt), format) != 0)
            format = "mixed"; /* members of other formats (a mixed-precision checkpoint) */
    }
    if (!whole) {
        json_decref(srcs);
        return NULL;
    }
    e = json_pack("{s:s, s:s, s:o, s:s, s:s, s:o}", "name", t->name, "dtype", bfs__dtype_name(t->out_dtype), "shape",
                  bfs__shape_json(t->shape, t->ndim), "format", format, "transform", t->transform, "sources", srcs);
    whole = e && json_object_set_new(e, "action", json_string(bfs__kind_action(t))) == 0;
    if (whole && t->rule) /* the target-name rule that made its name (and a pack, its shape) */
        whole = json_object_set_new(e, "rule", json_string(t->rule)) == 0;
    if (whole && t->keep_fp32) /* written as stored: the model keeps it in float32 (src/plan/fp32.c) */
        whole = json_object_set_new(e, "dtype_rule", json_pack("{s:s, s:s}", "keeps_float32", t->fp32_why, "pattern",
                                                               t->fp32_pat)) == 0;
    if (whole && t->whole && !t->whole_why) /* a model buffer: whole on rank 0 (docs/NAMES.md) */
        whole = json_object_set_new(e, "placement", json_string("whole on rank 0 (a buffer of the model)")) == 0;
    if (whole && t->whole && t->whole_why) /* a whole expert on its owner's rank (--names torchtitan) */
        whole = json_object_set_new(e, "placement", json_sprintf("whole on rank %u (%s)", t->whole_rank, t->whole_why)) == 0;
    if (whole &&
        (t->kind == BFS_K_BNB4 || t->kind == BFS_K_CAST || (t->kind == BFS_K_PASS && t->out_dtype != t->src_dtype)))
        whole = json_object_set_new(e, "source_dtype", json_string(bfs__dtype_name(t->src_dtype))) == 0;
    if (whole)
        return e;
    json_decref(e);
    return NULL;
}

int bfs__manifest_build_head(const bfs_manifest_in *mi, json_t **out)
{
    json_t *m = bfs__manifest_head(mi);
    *out = NULL;
    if (!m)
        return bfs__err(BFS_ENOMEM, "out of memory building the manifest");
    json_t *files = bfs__manifest_files(mi);
    /* jansson answers an allocation failure with NULL, which json_*_append_new() drops
     * silently: count what was built, so that a short manifest is never written */
    bool whole = files && json_array_size(files) == 2 * (size_t)mi->plan->nfiles + json_array_size(mi->aux);
    if (json_object_set_new(m, "files", files) != 0 ||
        json_object_set_new(m, "tensors", json_string(BFS_MF_TENSORS_HOLE)) != 0) /* bfs__manifest_write_conv */
        whole = false;
    if (mi->plan->ndropped) { /* input tensors with no output (docs/FORMATS.md 6.0) */
        json_t *d = json_array();
        for (size_t i = 0; d && i < mi->plan->ndropped; i++)
            if (json_array_append_new(d, json_string(mi->plan->dropped[i])) != 0)
                whole = false;
        if (json_object_set_new(m, "dropped", d) != 0)
            whole = false;
    }
    if (json_array_size(mi->skipped) && json_object_set(m, "skipped", (json_t *)mi->skipped) != 0)
        whole = false; /* the input folder's files not copied beside the weights, and why */
    if (mi->part && json_object_set_new(m, "part", json_pack("{s:s, s:i, s:I}", "ranks", mi->part, "world_size",
                                                             mi->o->world_size, BFS_MF_PART_TENSORS,
                                                             (json_int_t)mi->plan->nt)) != 0)
        whole = false;
    if (json_object_set_new(m, BFS_MF_SEAL, json_string(BFS_MF_ZERO_SEAL)) != 0 || !whole) { /* sealed on write */
        json_decref(m);
        return bfs__err(BFS_ENOMEM, "out of memory building the manifest");
    }
    *out = m;
    return 0;
}

/* ---- a conversion's manifest, streamed (manifest_write.c writes and seals it) ----------------- */
/* convert's tensors[]: built from the plan one tensor at a time, one line each; a part's
 * holds its ranks' share (bfs__part_share), which merge puts together in rank order */
static int bfs__mf_emit_conv(bfs_mf_out *w, void *user)
{
    const bfs_manifest_in *mi = user;
    const int W = mi->part ? mi->o->world_size : 1;
    size_t k = 0;
    for (int r = 0; r < W; r++) {
        uint64_t lo = 0;
        const uint64_t n = bfs__part_share(mi->plan->nt, W, r, &lo);
        if (mi->part && !mi->mine[r])
            continue;
        for (size_t i = (size_t)lo; i < lo + n; i++, k++) {
            json_t *e = bfs__manifest_tensor(mi, i);
            if (!e)
                return bfs__err(BFS_ENOMEM, "out of memory building the manifest");
            const int rc = bfs__mf_put_line(w, e, k == 0);
            json_decref(e);
            BFS_MF_RET(rc);
        }
    }
    bfs__mf_put_end(w, k);
    return w->rc;
}

int bfs__manifest_write_conv(int dirfd, const char *outdir, const char *name, const bfs_manifest_in *mi,
                             const json_t *head)
{
    return bfs__mf_write_streamed(dirfd, outdir, name, head, bfs__mf_emit_conv, (void *)mi, NULL, NULL);
}
