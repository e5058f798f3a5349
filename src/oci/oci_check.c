/*
 * Checking an OCI image layout (see oci.h): `bfshard verify OCIDIR`. For every manifest
 * index.json names that is a bfshard ModelPack artifact: the manifest and config blobs
 * against their descriptors (sha256, size), the config against ModelPack's schema (no key
 * it does not know) and its diffIds against the layers, every layer blob's sha256 and
 * size (its XXH3-128 in the same read), the layers' paths (plain, unique, sorted), and
 * every file of the OUTDIR manifest the artifact carries as a layer: a layer of its name,
 * size, XXH3-128, sha256 (when recorded), media type and rank. Every blob is treated as
 * hostile: sizes are checked before anything is read whole, JSON before it is used.
 */
#include "oci/oci.h"
#include "output/manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BFS_OCI_MAX_JSON ((uint64_t)256 << 20)
#define BFS_OCI_BUF (8u << 20)

typedef struct {
    const char *ocidir;
    char blobdir[PATH_MAX];
    int blobfd;
    FILE *report;
    uint64_t checked;
    int bad;
    uint8_t *buf;
    bfs_sha256 *sha;
    XXH3_state_t *xst;
    json_t *good; /* blobs hashed good so far: hex -> [size, XXH3-128 hex]; a blob many layers or
                   * manifests name is read once (a hostile manifest naming one blob 10^5 times) */
} bfs_oci_chk;

/* One problem, one line: the names and values it quotes come from the layout's files, so
 * the line is written escaped (bfs__line: \n, \u001b, \xff). */
static void bfs__bad(bfs_oci_chk *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bfs__bad(bfs_oci_chk *c, const char *fmt, ...)
{
    char *line = NULL;
    c->bad++;
    if (!c->report)
        return;
    va_list ap;
    va_start(ap, fmt);
    const int n = vasprintf(&line, fmt, ap);
    va_end(ap);
    bfs__line(c->report, "%s: %s", c->ocidir, n >= 0 ? line : "(out of memory)");
    if (n >= 0)
        free(line);
}

bool bfs__oci_is_layout(const char *path)
{
    struct stat sb;
    char *p = bfs__path_join(path, BFS_OCI_LAYOUT_FILE), *m = bfs__path_join(path, BFS_MANIFEST_NAME);
    /* an OUTDIR (its manifest there) stays one, whatever else lies in it */
    const bool yes = p && m && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) && lstat(p, &sb) == 0 && lstat(m, &sb) != 0;
    free(p);
    free(m);
    return yes;
}

/* "sha256:<64 hex>" -> the hex, else NULL */
static const char *bfs__digest_hex(const json_t *d)
{
    const char *s = json_string_value(d);
    return s && !strncmp(s, "sha256:", 7) && bfs__is_sha256_hex(s + 7) ? s + 7 : NULL;
}

/* ---- blobs -------------------------------------------------------------------------------------- */
/* Hash blob `hex` (expected `size` bytes): 1 and reported when it is missing, not a regular
 * file, of another size or other bytes; 0 when good (*xxh its XXH3-128 when not NULL). */
static int bfs__blob_hash(bfs_oci_chk *c, const char *hex, uint64_t size, const char *what, char xxh[33])
{
    struct stat sb;
    char got[65], path[PATH_MAX + 80], xh[33];
    int rc = 0;
    const json_t *seen = json_object_get(c->good, hex);
    if (seen && (uint64_t)json_integer_value(json_array_get(seen, 0)) == size) {
        if (xxh)
            snprintf(xxh, 33, "%s", json_string_value(json_array_get(seen, 1)));
        return 0;
    }
    snprintf(path, sizeof path, "%s/%s", c->blobdir, hex);
    const int fd = openat(c->blobfd, hex, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        bfs__bad(c, "blob %s (%s): MISSING (%s)", hex, what, strerror(errno));
        return 1;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        bfs__bad(c, "blob %s (%s): NOT A REGULAR FILE", hex, what);
        rc = 1;
    } else if ((uint64_t)sb.st_size != size) {
        bfs__bad(c, "blob %s (%s): BAD SIZE: %lld bytes, its descriptor says %llu", hex, what, (long long)sb.st_size,
                 (unsigned long long)size);
        rc = 1;
    } else {
        XXH3_128bits_reset(c->xst);
        rc = bfs__sha256_reset(c->sha);
        if (rc == 0)
            rc = bfs__hash_range2(fd, 0, size, c->buf, BFS_OCI_BUF, path, c->xst, c->sha);
        if (rc == 0)
            rc = bfs__sha256_hex(c->sha, got);
        if (rc == 0) {
            c->checked += size;
            bfs__hash_hex(XXH3_128bits_digest(c->xst), xh);
            if (xxh)
                snprintf(xxh, 33, "%s", xh);
            if (strcmp(got, hex) != 0) {
                bfs__bad(c, "blob %s (%s): BAD: its bytes hash to sha256:%s", hex, what, got);
                rc = 1;
            } else if (c->good) { /* out of memory here: it is hashed again, no harm */
                json_object_set_new(c->good, hex, json_pack("[I, s]", (json_int_t)size, xh));
            }
        }
    }
    close(fd);
    return rc;
}

/* a JSON blob of a descriptor, checked (sha256, size) and parsed: *out, or NULL when bad (reported) */
static int bfs__blob_json(bfs_oci_chk *c, const json_t *desc, const char *what, json_t **out)
{
    *out = NULL;
    const char *hex = bfs__digest_hex(json_object_get(desc, "digest"));
    const json_t *js = json_object_get(desc, "size");
    if (!hex || !json_is_integer(js) || json_integer_value(js) < 0 ||
        (uint64_t)json_integer_value(js) > BFS_OCI_MAX_JSON) {
        bfs__bad(c, "%s: BAD descriptor (digest sha256:<64 hex> and a size up to 256 MiB)", what);
        return 0;
    }
    const uint64_t size = (uint64_t)json_integer_value(js);
    const int h = bfs__blob_hash(c, hex, size, what, NULL);
    if (h != 0)
        return h < 0 ? h : 0;
    char *text = NULL, path[PATH_MAX + 80];
    size_t len = 0;
    json_error_t je;
    snprintf(path, sizeof path, "%s/%s", c->blobdir, hex);
    int rc = bfs__read_small_file(path, (size_t)size, &text, &len);
    if (rc < 0)
        return rc;
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!json_is_object(*out)) {
        bfs__bad(c, "blob %s (%s): BAD: not a JSON object (line %d: %s)", hex, what, je.line,
                 *out ? "not an object" : je.text);
        json_decref(*out);
        *out = NULL;
    }
    return 0;
}

/* ---- the config: ModelPack's schema, exactly --------------------------------------------------- */
static bool bfs__keys_in(const json_t *o, const char *const *keys)
{
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        bool known = false;
        for (const char *const *p = keys; *p && !known; p++)
            known = !strcmp(k, *p);
        if (!known)
            return false;
    }
    return true;
}

static bool bfs__strings(const json_t *a)
{
    if (!json_is_array(a))
        return false;
    for (size_t i = 0; i < json_array_size(a); i++)
        if (!json_is_string(json_array_get(a, i)))
            return false;
    return true;
}

/* every value a string, or (for the array keys) an array of strings */
static bool bfs__string_values(const json_t *o, const char *const *arrays)
{
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        bool arr = false;
        for (const char *const *p = arrays; *p && !arr; p++)
            arr = !strcmp(k, *p);
        if (arr ? !bfs__strings(v) : !json_is_string(v))
            return false;
    }
    return true;
}

static void bfs__check_schema(bfs_oci_chk *c, const json_t *cfg, const char *hex)
{
    static const char *const top[] = {"descriptor", "config", "modelfs", NULL};
    static const char *const desc[] = {"createdAt", "authors", "family", "name", "docURL", "sourceURL", "datasetsURL",
                                       "version", "revision", "vendor", "licenses", "title", "description", NULL};
    static const char *const desc_arr[] = {"authors", "datasetsURL", "licenses", NULL};
    static const char *const conf[] = {"architecture", "format", "paramSize", "precision", "quantization",
                                       "capabilities", NULL};
    static const char *const conf_arr[] = {NULL};
    static const char *const fs[] = {"type", "diffIds", NULL};
    const json_t *d = json_object_get(cfg, "descriptor"), *k = json_object_get(cfg, "config");
    const json_t *m = json_object_get(cfg, "modelfs"), *ids = json_object_get(m, "diffIds");
    const json_t *nm = json_object_get(d, "name");
    json_t *kc = json_deep_copy(k); /* capabilities: an object; the rest strings */
    if (kc)
        json_object_del(kc, "capabilities");
    const bool ok = bfs__keys_in(cfg, top) && json_is_object(d) && json_is_object(k) && json_is_object(m) &&
                    bfs__keys_in(d, desc) && bfs__string_values(d, desc_arr) &&
                    (!nm || json_string_length(nm) >= 1) && bfs__keys_in(k, conf) && kc &&
                    bfs__string_values(kc, conf_arr) &&
                    (!json_object_get(k, "capabilities") || json_is_object(json_object_get(k, "capabilities"))) &&
                    bfs__keys_in(m, fs) && json_is_string(json_object_get(m, "type")) &&
                    !strcmp(json_string_value(json_object_get(m, "type")), "layers") && bfs__strings(ids) &&
                    json_array_size(ids) >= 1;
    json_decref(kc);
    if (!ok)
        bfs__bad(c, "config %s: BAD: not a ModelPack config (descriptor, config and modelfs with only the keys and "
                 "types of its schema; modelfs.type \"layers\", diffIds strings)", hex);
}

/* config.config against what the OUTDIR manifest says */
static void bfs__check_facts(bfs_oci_chk *c, const json_t *cfg, const bfs_manifest_summary *s, const char *hex)
{
    bfs_oci_facts f;
    memset(&f, 0, sizeof f);
    bfs__oci_facts_from(s, &f);
    const json_t *k = json_object_get(cfg, "config");
    const struct {
        const char *key, *want;
    } kv[] = {{"format", "safetensors"}, {"paramSize", f.param_size}, {"precision", f.precision},
              {"quantization", f.quantization}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        const char *got = json_string_value(json_object_get(k, kv[i].key));
        if (strcmp(got ? got : "", kv[i].want) != 0)
            bfs__bad(c, "config %s: BAD config.%s \"%s\": the OUTDIR manifest says \"%s\"", hex, kv[i].key,
                     got ? got : "", kv[i].want);
    }
}

/* ---- the layers -------------------------------------------------------------------------------- */
typedef struct {
    const char *name, *hex, *mt, *xann;
    uint64_t size;
    int rank; /* its org.bfshard.rank, -1 when none */
    bool good; /* its blob is its bytes */
    char xxh[33];
} bfs_chk_layer;

static bool bfs__plain(const char *n)
{
    return n && n[0] && n[0] != '.' && !strchr(n, '/') && strlen(n) <= NAME_MAX;
}

/* layers[i] read into L (its blob hashed); false when its descriptor is bad (reported) */
static int bfs__layer_get(bfs_oci_chk *c, const json_t *e, size_t i, const char *tag, bfs_chk_layer *L)
{
    const json_t *ann = json_object_get(e, "annotations"), *js = json_object_get(e, "size");
    const char *rank = json_string_value(json_object_get(ann, BFS_OCI_ANN_RANK));
    memset(L, 0, sizeof *L);
    L->name = json_string_value(json_object_get(ann, BFS_MP_ANN_FILEPATH));
    L->hex = bfs__digest_hex(json_object_get(e, "digest"));
    L->mt = json_string_value(json_object_get(e, "mediaType"));
    L->xann = json_string_value(json_object_get(ann, BFS_OCI_ANN_XXH3));
    L->rank = -1;
    /* as pack writes it: "%d" of 0..999999 (no sign, space or leading zero: strtol took " +07") */
    const size_t rl = rank ? strspn(rank, "0123456789") : 0;
    if (json_object_get(ann, BFS_OCI_ANN_RANK) && !rank) /* annotations are strings (image-spec) */
        L->mt = NULL;
    else if (rank && (rl == 0 || rank[rl] || rl > 6 || (rank[0] == '0' && rl > 1)))
        L->mt = NULL;
    else if (rank)
        L->rank = atoi(rank);
    if (!bfs__plain(L->name) || !L->hex || !L->mt || !json_is_integer(js) || json_integer_value(js) < 0 ||
        (strcmp(L->mt, BFS_MP_MT_WEIGHT) && strcmp(L->mt, BFS_MP_MT_WCONFIG) && strcmp(L->mt, BFS_MP_MT_DOC) &&
         strcmp(L->mt, BFS_MP_MT_CODE))) {
        bfs__bad(c, "%s: layers[%zu]: BAD descriptor (a ModelPack raw media type, digest, size, a plain %s, a "
                 "decimal %s)", tag, i, BFS_MP_ANN_FILEPATH, BFS_OCI_ANN_RANK);
        return 0;
    }
    L->size = (uint64_t)json_integer_value(js);
    const int h = bfs__blob_hash(c, L->hex, L->size, L->name, L->xxh);
    if (h < 0)
        return h;
    L->good = h == 0;
    return 1;
}

/* every file of the OUTDIR manifest against its layer; every layer a file of it */
static void bfs__check_files(bfs_oci_chk *c, const char *tag, const bfs_chk_layer *L, size_t n, const json_t *byname,
                             const bfs_manifest_summary *s)
{
    bool *used = calloc(n ? n : 1, sizeof *used);
    if (!used) {
        bfs__bad(c, "%s: cannot check: out of memory", tag);
        return;
    }
    for (size_t i = 0; i < json_array_size(s->files); i++) {
        bfs_manifest_file mf;
        if (!bfs__manifest_file_get(s->files, i, &mf)) {
            bfs__bad(c, "%s: %s: files[%zu] is malformed", tag, BFS_MANIFEST_NAME, i);
            continue;
        }
        const json_t *ix = json_object_get(byname, mf.name);
        if (!ix) {
            bfs__bad(c, "%s: %s: MISSING: no layer holds this file of the OUTDIR manifest", tag, mf.name);
            continue;
        }
        const bfs_chk_layer *l = &L[json_integer_value(ix)];
        used[json_integer_value(ix)] = true;
        if (l->size != mf.size)
            bfs__bad(c, "%s: %s: BAD SIZE: the layer has %llu bytes, the OUTDIR manifest says %llu", tag, mf.name,
                     (unsigned long long)l->size, (unsigned long long)mf.size);
        else if (l->good && strcmp(l->xxh, mf.hash) != 0)
            bfs__bad(c, "%s: %s: BAD: the layer's XXH3-128 is %s, the OUTDIR manifest says %s", tag, mf.name, l->xxh,
                     mf.hash);
        if (mf.sha256 && strcmp(mf.sha256, l->hex) != 0)
            bfs__bad(c, "%s: %s: BAD: the layer is sha256:%s, the OUTDIR manifest records sha256:%s", tag, mf.name,
                     l->hex, mf.sha256);
        if (strcmp(l->mt, bfs__oci_media_type(mf.name, mf.kind)) != 0)
            bfs__bad(c, "%s: %s: BAD media type %s (expected %s)", tag, mf.name, l->mt,
                     bfs__oci_media_type(mf.name, mf.kind));
        if (l->rank != mf.rank || (l->xann && strcmp(l->xann, mf.hash) != 0))
            bfs__bad(c, "%s: %s: BAD annotations: %s %d, %s %s; the OUTDIR manifest says rank %d, %s", tag, mf.name,
                     BFS_OCI_ANN_RANK, l->rank, BFS_OCI_ANN_XXH3, l->xann ? l->xann : "(none)", mf.rank, mf.hash);
    }
    for (size_t i = 0; i < n; i++) {
        const bool ours = !strcmp(L[i].name, BFS_MANIFEST_NAME) || !strcmp(L[i].name, BFS_SUMS_NAME) ||
                          (!strcmp(L[i].name, BFS_SHA256SUMS_NAME) && bfs__manifest_has_sha256(s->files));
        if (!used[i] && !ours)
            bfs__bad(c, "%s: %s: EXTRA layer: not a file of the OUTDIR manifest", tag, L[i].name);
    }
    if (!json_object_get(byname, BFS_SUMS_NAME) ||
        (bfs__manifest_has_sha256(s->files) && !json_object_get(byname, BFS_SHA256SUMS_NAME)))
        bfs__bad(c, "%s: MISSING: no layer holds %s%s", tag, BFS_SUMS_NAME,
                 bfs__manifest_has_sha256(s->files) ? " and " BFS_SHA256SUMS_NAME : "");
    free(used);
}

/* the OUTDIR manifest the artifact carries, against the manifest's annotations, the config and the layers */
static int bfs__check_outdir_manifest(bfs_oci_chk *c, const char *tag, const json_t *man, const json_t *cfg,
                                      const char *cfg_hex, const bfs_chk_layer *L, size_t n, const json_t *byname)
{
    const json_t *ann = json_object_get(man, "annotations"), *ix = json_object_get(byname, BFS_MANIFEST_NAME);
    const bfs_chk_layer *ml = ix ? &L[json_integer_value(ix)] : NULL;
    bfs_manifest_summary s;
    char ws[16];
    if (!ml || !ml->good) {
        if (!ml)
            bfs__bad(c, "%s: MISSING: no layer holds %s", tag, BFS_MANIFEST_NAME);
        return 0;
    }
    int rc = bfs__manifest_summary(c->blobfd, c->blobdir, ml->hex, &s);
    if (rc == BFS_EINPUT) { /* its bytes are the blob's, but not a finished bfshard manifest */
        bfs__bad(c, "%s: %s: BAD: %s", tag, BFS_MANIFEST_NAME, bfs_last_error());
        bfs__err_clear();
        return 0;
    }
    if (rc < 0)
        return rc;
    snprintf(ws, sizeof ws, "%d", s.world_size);
    const struct {
        const char *key, *want;
    } kv[] = {{BFS_OCI_ANN_SEAL, s.seal}, {BFS_OCI_ANN_FINGERPRINT, s.fingerprint}, {BFS_OCI_ANN_VERSION, s.version},
              {BFS_OCI_ANN_WORLD, ws}, {BFS_OCI_ANN_LAYOUT, s.layout}, {BFS_OCI_ANN_MANIFEST, BFS_MANIFEST_NAME}};
    if (!s.seal_ok)
        bfs__bad(c, "%s: %s: BAD: its bytes do not match its seal", tag, BFS_MANIFEST_NAME);
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        const char *got = json_string_value(json_object_get(ann, kv[i].key));
        if (!got || strcmp(got, kv[i].want) != 0)
            bfs__bad(c, "%s: BAD annotation %s \"%s\": the OUTDIR manifest says \"%s\"", tag, kv[i].key,
                     got ? got : "(none)", kv[i].want);
    }
    if (cfg)
        bfs__check_facts(c, cfg, &s, cfg_hex);
    bfs__check_files(c, tag, L, n, byname, &s);
    json_decref(s.files);
    return 0;
}

/* one bfshard artifact: its manifest (already hashed and parsed), config, layers */
static int bfs__check_artifact(bfs_oci_chk *c, const char *tag, const json_t *man)
{
    int rc = 0;
    const json_t *layers = json_object_get(man, "layers"), *cd = json_object_get(man, "config");
    const json_t *sv = json_object_get(man, "schemaVersion");
    const char *mt = json_string_value(json_object_get(man, "mediaType"));
    const char *cmt = json_string_value(json_object_get(cd, "mediaType"));
    const size_t n = json_array_size(layers);
    json_t *cfg = NULL, *byname = json_object();
    bfs_chk_layer *L = calloc(n ? n : 1, sizeof *L);
    if (!L || !byname)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    if (!json_is_integer(sv) || json_integer_value(sv) != 2 || !mt || strcmp(mt, BFS_OCI_MT_MANIFEST) || !cmt ||
        strcmp(cmt, BFS_MP_MT_CONFIG) || !json_is_array(layers) || n == 0)
        bfs__bad(c, "%s: BAD manifest: schemaVersion 2, mediaType %s, a config of %s and layers expected", tag,
                 BFS_OCI_MT_MANIFEST, BFS_MP_MT_CONFIG);
    BFS_TRY(bfs__blob_json(c, cd, "config", &cfg));
    const char *cfg_hex = bfs__digest_hex(json_object_get(cd, "digest"));
    if (cfg)
        bfs__check_schema(c, cfg, cfg_hex);
    const json_t *ids = json_object_get(json_object_get(cfg, "modelfs"), "diffIds");
    size_t good = 0;
    for (size_t i = 0; i < n; i++) {
        const int g = bfs__layer_get(c, json_array_get(layers, i), i, tag, &L[good]);
        BFS_TRY(g);
        if (!g)
            continue;
        if (json_object_get(byname, L[good].name))
            bfs__bad(c, "%s: %s: BAD: two layers of this path", tag, L[good].name);
        else if (good > 0 && strcmp(L[good - 1].name, L[good].name) > 0)
            bfs__bad(c, "%s: %s: BAD: layers not sorted by path (after %s)", tag, L[good].name, L[good - 1].name);
        if (json_object_set_new(byname, L[good].name, json_integer((json_int_t)good)) != 0)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        const char *id = json_string_value(json_array_get(ids, i));
        if (cfg && (!id || strncmp(id, "sha256:", 7) || strcmp(id + 7, L[good].hex)))
            bfs__bad(c, "%s: config modelfs.diffIds[%zu] is not layers[%zu]'s digest", tag, i, i);
        good++;
    }
    if (cfg && json_array_size(ids) != n)
        bfs__bad(c, "%s: config modelfs.diffIds has %zu entries for %zu layers", tag, json_array_size(ids), n);
    if (good == n)
        BFS_TRY(bfs__check_outdir_manifest(c, tag, man, cfg, cfg_hex ? cfg_hex : "?", L, n, byname));
cleanup:
    json_decref(cfg);
    json_decref(byname);
    free(L);
    return rc;
}

/* ---- the layout ---------------------------------------------------------------------------------- */
static int bfs__read_json(const char *dir, const char *name, size_t max, json_t **out)
{
    char *p = bfs__path_join(dir, name), *text = NULL, esc[2 * JSON_ERROR_TEXT_LENGTH];
    size_t len = 0;
    json_error_t je;
    *out = NULL;
    if (!p)
        return bfs__err(BFS_ENOMEM, "out of memory");
    int rc = bfs__read_small_file(p, max, &text, &len);
    if (rc == 0 && !(*out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je)))
        rc = bfs__err(BFS_EINPUT, "%s: not JSON (line %d: %s)", p, je.line, bfs__esc(je.text, esc, sizeof esc));
    free(p);
    free(text);
    return rc;
}

int bfs__oci_check(const char *ocidir, FILE *report, uint64_t *bytes_checked)
{
    int rc = 0, ours = 0;
    json_t *lay = NULL, *idx = NULL;
    bfs_oci_chk c = {.ocidir = ocidir, .blobfd = -1, .report = report};
    snprintf(c.blobdir, sizeof c.blobdir, "%s/blobs/sha256", ocidir);
    c.buf = malloc(BFS_OCI_BUF);
    c.sha = bfs__sha256_new();
    c.xst = XXH3_createState();
    c.good = json_object();
    if (!c.buf || !c.sha || !c.xst || !c.good)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__read_json(ocidir, BFS_OCI_LAYOUT_FILE, 1u << 16, &lay));
    const char *v = json_string_value(json_object_get(lay, "imageLayoutVersion"));
    if (!v || strcmp(v, BFS_OCI_LAYOUT_VERSION) != 0)
        BFS_FAIL(BFS_EINPUT, "%s/%s: not an OCI image layout of version " BFS_OCI_LAYOUT_VERSION, ocidir,
                 BFS_OCI_LAYOUT_FILE);
    BFS_TRY(bfs__read_json(ocidir, BFS_OCI_INDEX_FILE, 64u << 20, &idx));
    const json_t *ms = json_object_get(idx, "manifests");
    if (!json_is_array(ms))
        BFS_FAIL(BFS_EINPUT, "%s/%s: not an OCI image index (no manifests array)", ocidir, BFS_OCI_INDEX_FILE);
    c.blobfd = open(c.blobdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (c.blobfd < 0)
        BFS_FAIL(BFS_EINPUT, "%s: not an OCI image layout: %s", c.blobdir, strerror(errno));
    for (size_t i = 0; i < json_array_size(ms); i++) {
        const json_t *d = json_array_get(ms, i);
        const char *mt = json_string_value(json_object_get(d, "mediaType"));
        const char *t = json_string_value(json_object_get(json_object_get(d, "annotations"), BFS_OCI_ANN_REF));
        char tag[160];
        snprintf(tag, sizeof tag, "%s", t ? t : "(untagged)");
        if (mt && strcmp(mt, BFS_OCI_MT_MANIFEST) != 0)
            continue; /* an index, or another kind: not ours */
        json_t *man = NULL;
        BFS_TRY(bfs__blob_json(&c, d, tag, &man));
        if (man && json_object_get(json_object_get(man, "annotations"), BFS_OCI_ANN_MANIFEST)) {
            const char *at = json_string_value(json_object_get(man, "artifactType"));
            ours++;
            if (!at || strcmp(at, BFS_MP_ARTIFACT) != 0)
                bfs__bad(&c, "%s: BAD manifest: artifactType %s expected", tag, BFS_MP_ARTIFACT);
            rc = bfs__check_artifact(&c, tag, man);
        }
        json_decref(man);
        BFS_TRY(rc);
    }
    if (ours == 0 && c.bad == 0)
        BFS_FAIL(BFS_EINPUT, "%s: no bfshard artifact among the %zu manifest(s) of its index.json", ocidir,
                 json_array_size(ms));
    if (c.bad)
        rc = bfs__err(BFS_EVERIFY, "%s: %d problem(s) found", ocidir, c.bad);
cleanup:
    if (bytes_checked)
        *bytes_checked = c.checked;
    if (c.blobfd >= 0)
        close(c.blobfd);
    json_decref(lay);
    json_decref(idx);
    free(c.buf);
    bfs__sha256_free(c.sha);
    XXH3_freeState(c.xst);
    json_decref(c.good);
    return rc;
}
