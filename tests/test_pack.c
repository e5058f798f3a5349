/*
 * SHA-256 beside XXH3, `bfshard pack` (an OCI image layout holding a CNCF
 * ModelPack artifact) and `bfshard verify OCIDIR`.
 *
 *   convert --sha256: files[].sha256 and sha256sums.txt (`sha256sum -c` passes), also after
 *       a resume, a merge of parts and compress; a manifest without them still verifies;
 *   pack of a fixture: the layout, the manifest, the config (only ModelPack's keys), layers
 *       sorted with their media types and paths, blobs hard-linked, verify OCIDIR passes;
 *   reproducible: two packs (linked or copied) are byte-identical; digests with and without
 *       --sha256 agree;
 *   hostile: OCIDIR inside OUTDIR and OUTDIR inside OCIDIR (exit 2), a foreign OCIDIR
 *       (exit 8) and foreign blobs and index entries (kept), a file under a blob's name
 *       with other bytes (exit 8, untouched), a blob changed after pack (verify exit 7), a
 *       symlinked or changed rank file (exit 7, nothing tagged), parts not merged and
 *       rank files only compressed (exit 3), a full disk (exit 4), kill -9 and rerun.
 */
#include "testutil.h"
#include "bfshard.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RANK1 "shard-00001-model-00001-of-00001.safetensors"
#define RANK2 "shard-00002-model-00001-of-00001.safetensors"

/* ---- helpers ------------------------------------------------------------------------------ */
static void convert(const char *fx, const char *out, const char *extra)
{
    char args[8192], err[8192];
    snprintf(args, sizeof args, "convert %s '%s' --device cpu -q %s", fx, out, extra ? extra : "");
    const int rc = tu_cli(NULL, args, err, sizeof err);
    if (rc != 0)
        fail_msg("%s: exit %d: %s", args, rc, err);
}

/* `bfshard pack OUTDIR OCIDIR EXTRA`: its exit code; stderr in err */
static int pack(const char *out, const char *oci, const char *extra, char *err, size_t cap)
{
    char args[8192];
    snprintf(args, sizeof args, "pack '%s' '%s' -q %s", out, oci, extra ? extra : "");
    return tu_cli(NULL, args, err, cap);
}

static int verify(const char *dir, char *err, size_t cap)
{
    char args[4096];
    snprintf(args, sizeof args, "verify '%s'", dir); /* the report lines into err */
    return tu_cli(NULL, args, err, cap);
}

static json_t *load_json(const char *path)
{
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        fail_msg("%s: %s", path, je.text);
    return j;
}

/* blobs/sha256/<hex of "sha256:hex"> */
static json_t *load_blob(const char *oci, const char *digest)
{
    char p[4096];
    assert_int_equal(strncmp(digest, "sha256:", 7), 0);
    snprintf(p, sizeof p, "%s/blobs/sha256/%s", oci, digest + 7);
    return load_json(p);
}

/* the manifest index.json tags `tag` (new reference) */
static json_t *tagged_manifest(const char *oci, const char *tag, char digest[80])
{
    char p[4096];
    snprintf(p, sizeof p, "%s/index.json", oci);
    json_t *idx = load_json(p), *m = json_object_get(idx, "manifests"), *man = NULL;
    for (size_t i = 0; i < json_array_size(m) && !man; i++) {
        const json_t *d = json_array_get(m, i);
        const char *t = json_string_value(json_object_get(json_object_get(d, "annotations"),
                                                          "org.opencontainers.image.ref.name"));
        if (t && !strcmp(t, tag)) {
            snprintf(digest, 80, "%s", json_string_value(json_object_get(d, "digest")));
            man = load_blob(oci, digest);
        }
    }
    json_decref(idx);
    if (!man)
        fail_msg("%s: no manifest tagged %s", oci, tag);
    return man;
}

static bool same_inode(const char *a, const char *b)
{
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* ---- convert --sha256 -------------------------------------------------------------------------- */
static void sha256_beside_xxh3(void **s)
{
    (void)s;
    char *t = tu_tmpdir("psha");
    char out[4096], err[8192], args[8192];
    snprintf(out, sizeof out, "%s/out", t);
    convert("fixtures/mxfp4-tiny", out, "-w 3 --sha256");
    assert_int_equal(tu_sh("cd '%s' && sha256sum --quiet -c sha256sums.txt && xxh128sum --quiet -c xxh128sums.txt", out), 0);
    /* every file of the manifest is in both sums files; the rank files are those of a run without --sha256 */
    assert_int_equal(tu_sh("cd '%s' && test $(wc -l < sha256sums.txt) -eq $(wc -l < xxh128sums.txt) && "
                           "test $(grep -c '\"sha256\"' bfshard.manifest.json) -eq $(wc -l < sha256sums.txt)", out), 0);
    snprintf(args, sizeof args, "%s/plain", t);
    convert("fixtures/mxfp4-tiny", args, "-w 3");
    assert_int_equal(tu_sh("cd '%s' && for f in shard-*; do cmp -s \"$f\" '%s/plain/'\"$f\" || exit 1; done && "
                           "test ! -e '%s/plain/sha256sums.txt'", out, t, t), 0);
    assert_int_equal(verify(out, err, sizeof err), 0);
    assert_int_equal(verify(args, err, sizeof err), 0); /* a manifest without sha256 (v1) verifies */
    /* a bad line in sha256sums.txt fails verify */
    assert_int_equal(tu_sh("cd '%s' && cp sha256sums.txt x && { printf '%%064d  config.json\n' 0; tail -n +2 x; } > sha256sums.txt",
                           out), 0);
    assert_int_equal(verify(out, err, sizeof err), 7);
    assert_non_null(strstr(err, "sha256sums.txt: BAD line 1"));
    assert_int_equal(tu_sh("cd '%s' && mv x sha256sums.txt", out), 0);

    /* kill -9 after the first rank file, rerun: resumed, the reused file's sha256 right */
    tu_rmrf(out);
    char *argv[] = {"bfshard", "convert", "fixtures/mxfp4-tiny", out, "-w", "3", "--device", "cpu", "-q", "--sha256",
                    NULL};
    assert_int_equal(tu_run(argv, &(tu_proc){.env = "BFSHARD_TEST_SIGNAL=tmp:9:2"}), 1000 + SIGKILL);
    assert_int_equal(tu_run(argv, NULL), 0);
    assert_int_equal(tu_sh("cd '%s' && sha256sum --quiet -c sha256sums.txt", out), 0);

    /* parts, merged: sha256sums.txt as one run writes it */
    char parts[4096];
    snprintf(parts, sizeof parts, "%s/parts", t);
    convert("fixtures/mxfp4-tiny", parts, "-w 3 --sha256 --ranks 0-1");
    convert("fixtures/mxfp4-tiny", parts, "-w 3 --sha256 --ranks 2");
    snprintf(args, sizeof args, "merge '%s' -q", parts);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 0);
    assert_int_equal(tu_sh("cmp -s '%s/sha256sums.txt' '%s/sha256sums.txt' && cmp -s '%s/bfshard.manifest.json' "
                           "'%s/bfshard.manifest.json'", parts, out, parts, out), 0);
    /* compress keeps the sha256 entries and rewrites both sums files */
    snprintf(args, sizeof args, "compress '%s' -q --rm", parts);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 0);
    assert_int_equal(verify(parts, err, sizeof err), 0);
    assert_int_equal(tu_sh("cd '%s' && sha256sum --quiet -c sha256sums.txt && ! grep -q 'shard-.*safetensors$' sha256sums.txt", parts), 0);

    /* a user's sha256sums.txt beside a manifest without sha256 is not bfshard's: --force keeps it */
    assert_int_equal(tu_sh("echo mine > '%s/plain/sha256sums.txt'", t), 0);
    snprintf(args, sizeof args, "%s/plain", t);
    convert("fixtures/mxfp4-tiny", args, "-w 2 --force");
    assert_int_equal(tu_sh("grep -qx mine '%s/sha256sums.txt'", args), 0);
    /* and where convert --sha256 would write one: exit 8, naming it */
    snprintf(args, sizeof args, "convert fixtures/mxfp4-tiny '%s/plain' --device cpu -q -w 2 --sha256 --force", t);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 8);
    assert_non_null(strstr(err, "sha256sums.txt"));
    tu_rmrf(t);
    free(t);
}

/* ---- pack ---------------------------------------------------------------------------------------- */
static void pack_fixture(void **s)
{
    (void)s;
    char *t = tu_tmpdir("pack");
    char out[4096], oci[4096], err[8192], dg[80], p[8192];
    snprintf(out, sizeof out, "%s/out", t);
    snprintf(oci, sizeof oci, "%s/oci", t);
    convert("fixtures/mxfp4-tiny", out, "-w 3 --sha256");
    assert_int_equal(pack(out, oci, "--tag v1", err, sizeof err), 0);
    char *layout = NULL;
    snprintf(p, sizeof p, "%s/oci-layout", oci);
    layout = tu_slurp(p);
    assert_string_equal(layout, "{\"imageLayoutVersion\":\"1.0.0\"}");
    free(layout);
    json_t *man = tagged_manifest(oci, "v1", dg);
    assert_string_equal(json_string_value(json_object_get(man, "artifactType")), "application/vnd.cncf.model.manifest.v1+json");
    assert_string_equal(json_string_value(json_object_get(man, "mediaType")), "application/vnd.oci.image.manifest.v1+json");
    const json_t *cd = json_object_get(man, "config"), *layers = json_object_get(man, "layers");
    assert_string_equal(json_string_value(json_object_get(cd, "mediaType")), "application/vnd.cncf.model.config.v1+json");
    json_t *cfg = load_blob(oci, json_string_value(json_object_get(cd, "digest")));
    /* only the schema's keys; no time stamp unless asked */
    assert_int_equal(json_object_size(cfg), 3);
    assert_null(json_object_get(json_object_get(cfg, "descriptor"), "createdAt"));
    assert_string_equal(json_string_value(json_object_get(json_object_get(cfg, "descriptor"), "name")), "out");
    const json_t *c = json_object_get(cfg, "config");
    assert_string_equal(json_string_value(json_object_get(c, "format")), "safetensors");
    assert_string_equal(json_string_value(json_object_get(c, "precision")), "bfloat16");
    assert_string_equal(json_string_value(json_object_get(c, "quantization")), "mxfp4");
    const json_t *ids = json_object_get(json_object_get(cfg, "modelfs"), "diffIds");
    assert_string_equal(json_string_value(json_object_get(json_object_get(cfg, "modelfs"), "type")), "layers");
    /* 3 rank files and their slice indexes, config, generation_config, 2 tokenizer files, the
     * manifest and both sums files */
    assert_int_equal(json_array_size(layers), 13);
    assert_int_equal(json_array_size(ids), 13);
    const char *prev = "";
    int weights = 0;
    for (size_t i = 0; i < json_array_size(layers); i++) {
        const json_t *l = json_array_get(layers, i);
        const char *path = json_string_value(json_object_get(json_object_get(l, "annotations"), "org.cncf.model.filepath"));
        const char *mt = json_string_value(json_object_get(l, "mediaType"));
        const char *d = json_string_value(json_object_get(l, "digest"));
        assert_non_null(path);
        assert_true(strcmp(prev, path) < 0); /* sorted, unique */
        prev = path;
        assert_string_equal(json_string_value(json_array_get(ids, i)), d);
        const size_t pl = strlen(path);
        const bool w = !strncmp(path, "shard-", 6) && pl > 12 && !strcmp(path + pl - 12, ".safetensors");
        weights += w;
        assert_string_equal(mt, w ? "application/vnd.cncf.model.weight.v1.raw" : "application/vnd.cncf.model.weight.config.v1.raw");
        /* the blob is the OUTDIR file itself (a hard link), its name its sha256 */
        char a[8192], b[8192];
        snprintf(a, sizeof a, "%s/%s", out, path);
        snprintf(b, sizeof b, "%s/blobs/sha256/%s", oci, d + 7);
        assert_true(same_inode(a, b));
        assert_int_equal(tu_sh("test \"$(sha256sum < '%s' | cut -c1-64)\" = '%s'", a, d + 7), 0);
    }
    assert_int_equal(weights, 3);
    assert_string_equal(json_string_value(json_object_get(json_object_get(man, "annotations"), "org.bfshard.world_size")), "3");
    json_decref(cfg);
    json_decref(man);
    assert_int_equal(verify(oci, err, sizeof err), 0);
    assert_int_equal(tu_sh("cd '%s' && sha256sum --quiet -c sha256sums.txt", out), 0);
    /* the library: nothing re-read when convert recorded the digests but the manifest and sums */
    bfs_pack_opts o;
    bfs_pack_opts_init(&o);
    o.tag = "v2";
    o.created = "2025-01-01T00:00:00Z";
    o.revision = "0123abc";
    bfs_pack_result r;
    bfs_pack_result_init(&r);
    assert_int_equal(bfs_pack(out, oci, &o, &r), 0);
    assert_int_equal(r.layers, 13);
    assert_int_equal(r.kept, 13);
    struct stat sb;
    snprintf(p, sizeof p, "%s/" RANK1, out);
    assert_int_equal(stat(p, &sb), 0);
    assert_true(r.bytes_hashed > 0 && r.bytes_hashed < (uint64_t)sb.st_size); /* the manifest and the sums only */
    man = tagged_manifest(oci, "v2", dg);
    assert_string_equal(json_string_value(json_object_get(json_object_get(man, "annotations"),
                                                          "org.opencontainers.image.created")), "2025-01-01T00:00:00Z");
    cfg = load_blob(oci, json_string_value(json_object_get(json_object_get(man, "config"), "digest")));
    assert_string_equal(json_string_value(json_object_get(json_object_get(cfg, "descriptor"), "revision")), "0123abc");
    json_decref(cfg);
    json_decref(man);
    json_decref(tagged_manifest(oci, "v1", dg)); /* both tags */
    assert_int_equal(verify(oci, err, sizeof err), 0);
    /* usage errors: exit 2, nothing written */
    snprintf(p, sizeof p, "%s/none", t);
    assert_int_equal(pack(out, p, "--tag ../x", err, sizeof err), 2);
    assert_int_equal(pack(out, p, "--created yesterday", err, sizeof err), 2);
    assert_int_equal(tu_sh("test ! -e '%s/none'", t), 0);
    o.size = 0;
    assert_int_equal(bfs_pack(out, p, &o, NULL), BFS_EUSAGE);
    tu_rmrf(t);
    free(t);
}

static void pack_is_reproducible(void **s)
{
    (void)s;
    char *t = tu_tmpdir("prepro");
    char out[4096], plain[4096], a[4096], b[4096], c[4096], d[4096], err[8192], da[80], dd[80];
    snprintf(out, sizeof out, "%s/out", t);
    snprintf(plain, sizeof plain, "%s/plain", t);
    snprintf(a, sizeof a, "%s/a", t);
    snprintf(b, sizeof b, "%s/b", t);
    snprintf(c, sizeof c, "%s/c", t);
    snprintf(d, sizeof d, "%s/d", t);
    convert("fixtures/bnb-nf4", out, "-w 2 --sha256");
    convert("fixtures/bnb-nf4", plain, "-w 2");
    assert_int_equal(pack(out, a, NULL, err, sizeof err), 0);
    assert_int_equal(pack(out, b, NULL, err, sizeof err), 0);
    assert_int_equal(pack(out, c, "--copy --verify", err, sizeof err), 0);
    assert_int_equal(tu_sh("diff -r '%s' '%s' && diff -r '%s' '%s'", a, b, a, c), 0);
    /* a and b hard-linked the rank file, c copied it */
    assert_int_equal(tu_sh("test $(stat -c %%h '%s/" RANK1 "') -eq 3", out), 0);
    /* without --sha256 pack hashes the files itself: the same digests for the same rank files */
    bfs_pack_result r;
    bfs_pack_result_init(&r);
    assert_int_equal(bfs_pack(plain, d, NULL, &r), 0);
    assert_true(r.bytes_hashed == r.bytes);
    json_t *ma = tagged_manifest(a, "latest", da), *md = tagged_manifest(d, "latest", dd);
    const json_t *la = json_object_get(ma, "layers"), *ld = json_object_get(md, "layers");
    int same = 0;
    for (size_t i = 0; i < json_array_size(la); i++)
        for (size_t k = 0; k < json_array_size(ld); k++)
            if (!strncmp(json_string_value(json_object_get(json_object_get(json_array_get(la, i), "annotations"),
                                                           "org.cncf.model.filepath")), "shard-", 6) &&
                json_equal(json_array_get(la, i), json_array_get(ld, k)))
                same++;
    assert_int_equal(same, 4); /* the 2 rank files and their 2 slice indexes */
    json_decref(ma);
    json_decref(md);
    assert_int_equal(verify(d, err, sizeof err), 0);
    tu_rmrf(t);
    free(t);
}

/* ---- hostile ------------------------------------------------------------------------------------ */
static void nested_directories_refused(void **s)
{
    (void)s;
    char *t = tu_tmpdir("pnest");
    char out[4096], p[4096], err[8192];
    snprintf(out, sizeof out, "%s/out", t);
    convert("fixtures/mxfp4-tiny", out, "-w 2");
    snprintf(p, sizeof p, "%s/oci", out);
    assert_int_equal(pack(out, p, NULL, err, sizeof err), 2);
    assert_non_null(strstr(err, "inside OUTDIR"));
    assert_int_equal(pack(out, out, NULL, err, sizeof err), 2);
    snprintf(p, sizeof p, "%s/./oci/", out);
    assert_int_equal(pack(out, p, NULL, err, sizeof err), 2);
    /* OUTDIR inside OCIDIR, and through a symlink */
    snprintf(p, sizeof p, "%s/out/..", t);
    assert_int_equal(pack(out, p, NULL, err, sizeof err), 2);
    assert_non_null(strstr(err, "inside OCIDIR"));
    assert_int_equal(tu_sh("ln -s '%s' '%s/link'", out, t), 0);
    snprintf(p, sizeof p, "%s/link/sub", t);
    assert_int_equal(pack(out, p, NULL, err, sizeof err), 2);
    assert_int_equal(tu_sh("test ! -e '%s/oci' && test ! -e '%s/sub' && test ! -e '%s/oci-layout'", out, out, t), 0);
    assert_int_equal(verify(out, err, sizeof err), 0);
    tu_rmrf(t);
    free(t);
}

static void foreign_files_kept(void **s)
{
    (void)s;
    char *t = tu_tmpdir("pforeign");
    char out[4096], oci[4096], err[8192], dg[80];
    snprintf(out, sizeof out, "%s/out", t);
    snprintf(oci, sizeof oci, "%s/oci", t);
    convert("fixtures/mxfp4-tiny", out, "-w 2");
    /* a directory that is not an OCI layout: exit 8, untouched */
    assert_int_equal(tu_sh("mkdir '%s' && echo mine > '%s/notes.txt'", oci, oci), 0);
    assert_int_equal(pack(out, oci, NULL, err, sizeof err), 8);
    assert_non_null(strstr(err, "not an OCI image layout"));
    assert_int_equal(tu_sh("test \"$(ls -A '%s')\" = notes.txt", oci), 0);
    /* an OCI layout of someone else's: its blobs, index entries and other files stay */
    assert_int_equal(tu_sh("cd '%s' && mkdir -p blobs/sha256 && printf '{\"imageLayoutVersion\":\"1.0.0\"}' > oci-layout && "
                           "echo foreign > blobs/sha256/0000000000000000000000000000000000000000000000000000000000000000 && "
                           "echo junk > blobs/sha256/.abc.partial && "
                           "printf '{\"schemaVersion\":2,\"manifests\":[{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\","
                           "\"digest\":\"sha256:0000000000000000000000000000000000000000000000000000000000000000\",\"size\":8,"
                           "\"annotations\":{\"org.opencontainers.image.ref.name\":\"theirs\"}}],\"x-extra\":1}' > index.json", oci), 0);
    assert_int_equal(pack(out, oci, "--tag ours", err, sizeof err), 0);
    assert_int_equal(pack(out, oci, "--tag ours", err, sizeof err), 0); /* again: the entry replaced in place */
    assert_int_equal(tu_sh("cd '%s' && grep -qx mine notes.txt && grep -qx foreign blobs/sha256/0000000000000000000000000000000000000000000000000000000000000000 && "
                           "grep -qx junk blobs/sha256/.abc.partial && grep -q '\"theirs\"' index.json && grep -q x-extra index.json && "
                           "test $(grep -o '\"ours\"' index.json | wc -l) -eq 1", oci), 0);
    json_decref(tagged_manifest(oci, "ours", dg));
    /* verify checks ours (theirs is not a bfshard artifact; its blob is not even a manifest) */
    assert_int_equal(verify(oci, err, sizeof err), 7); /* the foreign descriptor's blob does not hash to its name */
    assert_non_null(strstr(err, "theirs"));
    /* a file under one of our blobs' names with other bytes: never replaced, exit 8 */
    char oci2[4096];
    snprintf(oci2, sizeof oci2, "%s/oci2", t);
    assert_int_equal(tu_sh("mkdir -p '%s/blobs/sha256' && printf '{\"imageLayoutVersion\":\"1.0.0\"}' > '%s/oci-layout' && "
                           "sha256sum '%s/" RANK1 "' | cut -c1-64 > '%s/h' && echo other > \"%s/blobs/sha256/$(cat '%s/h')\"",
                           oci2, oci2, out, t, oci2, t), 0);
    assert_int_equal(pack(out, oci2, NULL, err, sizeof err), 8);
    assert_non_null(strstr(err, "not bfshard's to replace"));
    assert_int_equal(tu_sh("grep -qx other \"%s/blobs/sha256/$(cat '%s/h')\" && test ! -e '%s/index.json'", oci2, t, oci2), 0);
    tu_rmrf(t);
    free(t);
}

static void changed_blob_fails_verify(void **s)
{
    (void)s;
    char *t = tu_tmpdir("pchanged");
    char out[4096], oci[4096], err[8192], dg[80];
    snprintf(out, sizeof out, "%s/out", t);
    snprintf(oci, sizeof oci, "%s/oci", t);
    convert("fixtures/mxfp4-tiny", out, "-w 2 --sha256");
    assert_int_equal(pack(out, oci, "--copy", err, sizeof err), 0);
    json_t *man = tagged_manifest(oci, "latest", dg);
    const json_t *layers = json_object_get(man, "layers");
    char rank_blob[4096] = "", cfg_blob[4096];
    for (size_t i = 0; i < json_array_size(layers); i++) {
        const json_t *l = json_array_get(layers, i);
        if (!strcmp(json_string_value(json_object_get(json_object_get(l, "annotations"), "org.cncf.model.filepath")), RANK2))
            snprintf(rank_blob, sizeof rank_blob, "%s/blobs/sha256/%s", oci, json_string_value(json_object_get(l, "digest")) + 7);
    }
    snprintf(cfg_blob, sizeof cfg_blob, "%s/blobs/sha256/%s", oci,
             json_string_value(json_object_get(json_object_get(man, "config"), "digest")) + 7);
    json_decref(man);
    assert_int_equal(verify(oci, err, sizeof err), 0);
    /* one byte of a rank file's blob (same size) */
    assert_int_equal(tu_sh("cp '%s' '%s/keep' && printf 'X' | dd of='%s' bs=1 seek=4000 conv=notrunc status=none", rank_blob, t, rank_blob), 0);
    assert_int_equal(verify(oci, err, sizeof err), 7);
    assert_non_null(strstr(err, "BAD: its bytes hash to"));
    assert_non_null(strstr(err, RANK2));
    assert_int_equal(tu_sh("cp '%s/keep' '%s'", t, rank_blob), 0);
    /* the config blob edited (and its descriptor left as it was) */
    assert_int_equal(tu_sh("sed -i 's/bfloat16/float32/' '%s'", cfg_blob), 0);
    assert_int_equal(verify(oci, err, sizeof err), 7);
    /* a blob gone */
    assert_int_equal(tu_sh("rm '%s'", cfg_blob), 0);
    assert_int_equal(verify(oci, err, sizeof err), 7);
    assert_non_null(strstr(err, "MISSING"));
    /* repacked: the config blob is back, verify passes */
    assert_int_equal(pack(out, oci, "--copy", err, sizeof err), 0);
    assert_int_equal(verify(oci, err, sizeof err), 0);
    tu_rmrf(t);
    free(t);
}

/* A hostile manifest naming one blob 2000 times: verify reads each blob once (bytes_checked
 * is at most the blobs' total, not 2000 x the rank file), and reports the manifest bad */
static void one_blob_named_many_times(void **s)
{
    (void)s;
    char *t = tu_tmpdir("pmany");
    char out[4096], oci[4096], err[8192];
    snprintf(out, sizeof out, "%s/out", t);
    snprintf(oci, sizeof oci, "%s/oci", t);
    convert("fixtures/mxfp4-tiny", out, "-w 2");
    assert_int_equal(pack(out, oci, NULL, err, sizeof err), 0);
    assert_int_equal(tu_sh("cd '%s' && python3 -c '\n"
                           "import json, hashlib, os\n"
                           "ix = json.load(open(\"index.json\"))\n"
                           "d = ix[\"manifests\"][0]\n"
                           "m = json.load(open(\"blobs/sha256/\" + d[\"digest\"][7:]))\n"
                           "big = max(m[\"layers\"], key=lambda l: l[\"size\"])\n"
                           "m[\"layers\"] += [big] * 2000\n"
                           "b = json.dumps(m).encode()\n"
                           "h = hashlib.sha256(b).hexdigest()\n"
                           "open(\"blobs/sha256/\" + h, \"wb\").write(b)\n"
                           "d[\"digest\"], d[\"size\"] = \"sha256:\" + h, len(b)\n"
                           "json.dump(ix, open(\"index.json\", \"w\"))\n"
                           "'", oci), 0);
    assert_int_equal(tu_sh("'%s' verify '%s' --json > '%s/v.json'", tu_bfshard(), oci, t), 7);
    assert_int_equal(tu_sh("cd '%s' && test $(python3 -c 'import json; print(json.load(open(\"v.json\"))[\"bytes_checked\"])') "
                           "-le $(cat oci/blobs/sha256/* | wc -c)", t), 0);
    tu_rmrf(t);
    free(t);
}

static void outdir_that_does_not_verify(void **s)
{
    (void)s;
    char *t = tu_tmpdir("pbad");
    char out[4096], oci[4096], err[8192], args[8192];
    snprintf(out, sizeof out, "%s/out", t);
    snprintf(oci, sizeof oci, "%s/oci", t);
    convert("fixtures/mxfp4-tiny", out, "-w 2 --sha256");
    /* a symlinked rank file: refused, nothing tagged */
    assert_int_equal(tu_sh("cd '%s' && mv " RANK1 " ../r1 && ln -s ../r1 " RANK1, out), 0);
    assert_int_equal(pack(out, oci, NULL, err, sizeof err), 7);
    assert_non_null(strstr(err, "symbolic link"));
    assert_int_equal(tu_sh("test ! -e '%s/index.json'", oci), 0);
    assert_int_equal(tu_sh("cd '%s' && rm " RANK1 " && mv ../r1 " RANK1, out), 0);
    /* a rank file changed after convert (same size, later mtime): re-hashed, refused */
    assert_int_equal(tu_sh("cp '%s/" RANK2 "' '%s/keep' && printf 'X' | dd of='%s/" RANK2 "' bs=1 seek=5000 conv=notrunc status=none",
                           out, t, out), 0);
    assert_int_equal(pack(out, oci, NULL, err, sizeof err), 7);
    assert_non_null(strstr(err, "does not verify"));
    assert_int_equal(tu_sh("test ! -e '%s/index.json'", oci), 0);
    /* the same with its old mtime: trusted by default, caught by --verify */
    assert_int_equal(tu_sh("touch -d '2000-01-01' '%s/" RANK2 "'", out), 0);
    assert_int_equal(pack(out, oci, "--verify --copy", err, sizeof err), 7);
    assert_int_equal(tu_sh("test ! -e '%s/index.json'", oci), 0);
    assert_int_equal(tu_sh("cp '%s/keep' '%s/" RANK2 "'", t, out), 0);
    /* the manifest edited: its seal */
    assert_int_equal(tu_sh("cd '%s' && cp bfshard.manifest.json ../m && sed -i 's/\"keep_dtype\": false/\"keep_dtype\": true/' bfshard.manifest.json", out), 0);
    assert_int_equal(pack(out, oci, NULL, err, sizeof err), 7);
    assert_non_null(strstr(err, "seal"));
    assert_int_equal(tu_sh("cd '%s' && mv ../m bfshard.manifest.json", out), 0);
    assert_int_equal(pack(out, oci, NULL, err, sizeof err), 0);
    assert_int_equal(verify(oci, err, sizeof err), 0);
    /* rank files kept only compressed: exit 3, naming decompress */
    snprintf(args, sizeof args, "compress '%s' -q --rm", out);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 0);
    snprintf(args, sizeof args, "%s/oci2", t);
    assert_int_equal(pack(out, args, NULL, err, sizeof err), 3);
    assert_non_null(strstr(err, "decompress"));
    /* parts not merged: exit 3, naming merge */
    char parts[4096];
    snprintf(parts, sizeof parts, "%s/parts", t);
    convert("fixtures/mxfp4-tiny", parts, "-w 2 --ranks 0");
    assert_int_equal(pack(parts, args, NULL, err, sizeof err), 3);
    assert_non_null(strstr(err, "merge"));
    tu_rmrf(t);
    free(t);
}

static void crash_and_full_disk(void **s)
{
    (void)s;
    char *t = tu_tmpdir("pcrash");
    char out[4096], oci[4096], ref[4096], errf[4096], err[8192];
    snprintf(out, sizeof out, "%s/out", t);
    snprintf(oci, sizeof oci, "%s/oci", t);
    snprintf(ref, sizeof ref, "%s/ref", t);
    snprintf(errf, sizeof errf, "%s/err", t);
    convert("fixtures/mxfp4-tiny", out, "-w 3");
    assert_int_equal(pack(out, ref, "--copy", err, sizeof err), 0);
    /* kill -9 after the 4th blob, then mid-copy of a blob: the reruns finish, byte-identical */
    char *argv[] = {"bfshard", "pack", out, oci, "--copy", "-q", NULL};
    assert_int_equal(tu_run(argv, &(tu_proc){.env = "BFSHARD_TEST_SIGNAL=pack:9:4"}), 1000 + SIGKILL);
    assert_int_equal(tu_sh("test ! -e '%s/index.json' && test $(ls '%s/blobs/sha256' | wc -l) -eq 4", oci, oci), 0);
    assert_int_equal(tu_run(argv, &(tu_proc){.env = "BFSHARD_TEST_SIGNAL=tmp:9:3"}), 1000 + SIGKILL);
    assert_int_equal(tu_run(argv, NULL), 0);
    assert_int_equal(tu_sh("diff -r '%s' '%s'", ref, oci), 0);
    assert_int_equal(verify(oci, err, sizeof err), 0);
    /* SIGTERM: exit 9, nothing tagged */
    tu_rmrf(oci);
    assert_int_equal(tu_run(argv, &(tu_proc){.env = "BFSHARD_TEST_SIGNAL=pack:15:2"}), 9);
    assert_int_equal(tu_sh("test ! -e '%s/index.json' && ! ls -A '%s/blobs/sha256' | grep -q partial", oci, oci), 0);
    /* a full disk (a file-size limit) while copying: exit 4, one line naming the blob, nothing tagged */
    tu_rmrf(oci);
    assert_int_equal(tu_run(argv, &(tu_proc){.errf = errf, .fsize = 60000}), 4);
    char *e = tu_slurp(errf);
    assert_int_equal(tu_count_lines(e), 1);
    assert_non_null(strstr(e, "blobs/sha256"));
    free(e);
    assert_int_equal(tu_sh("test ! -e '%s/index.json' && ! ls -A '%s/blobs/sha256' | grep -q partial", oci, oci), 0);
    assert_int_equal(tu_run(argv, NULL), 0);
    assert_int_equal(tu_sh("diff -r '%s' '%s'", ref, oci), 0);
    /* a second pack of the same OCIDIR meanwhile is refused (flock), the first not disturbed */
    assert_int_equal(tu_sh("flock -n '%s' -c \"'%s' pack '%s' '%s' -q 2>/dev/null\"; test $? -eq 8", oci, tu_bfshard(), out, oci), 0);
    tu_rmrf(t);
    free(t);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sha256_beside_xxh3),
        cmocka_unit_test(pack_fixture),
        cmocka_unit_test(pack_is_reproducible),
        cmocka_unit_test(nested_directories_refused),
        cmocka_unit_test(foreign_files_kept),
        cmocka_unit_test(changed_blob_fails_verify),
        cmocka_unit_test(one_blob_named_many_times),
        cmocka_unit_test(outdir_that_does_not_verify),
        cmocka_unit_test(crash_and_full_disk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
