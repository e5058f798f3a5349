/*
 * What a bfshard artifact says (see oci.h, docs/OCI.md): the media type of each OUTDIR
 * file, the facts of the model taken from its manifest, the CNCF ModelPack config
 * (application/vnd.cncf.model.config.v1+json: descriptor, config, modelfs, and nothing
 * the spec's schema does not know) and the OCI image manifest (artifactType ModelPack,
 * one raw layer per file, bfshard's facts as org.bfshard.* annotations). Everything here
 * is a function of its inputs: no clock, no host, no path, so two packs of one OUTDIR
 * write the same bytes (a creation time only when asked: bfs__oci_created).
 */
#include "oci/oci.h"
#include "output/manifest.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* ---- media types ------------------------------------------------------------------------ */
/* name begins with word (any case), then the end or a '.', '-' or '_' */
static bool bfs__doc_name(const char *name, const char *word)
{
    const size_t n = strlen(word);
    return !strncasecmp(name, word, n) && (name[n] == '\0' || name[n] == '.' || name[n] == '-' || name[n] == '_');
}

const char *bfs__oci_media_type(const char *name, const char *kind)
{
    if (kind && !strcmp(kind, "weights"))
        return BFS_MP_MT_WEIGHT;
    if (bfs__doc_name(name, "README") || bfs__doc_name(name, "LICENSE") || bfs__doc_name(name, "LICENCE") ||
        bfs__doc_name(name, "NOTICE") || bfs__doc_name(name, "USE_POLICY"))
        return BFS_MP_MT_DOC;
    const size_t n = strlen(name);
    if (n > 3 && !strcmp(name + n - 3, ".py")) /* remote code: a config's or tokenizer's auto_map names it */
        return BFS_MP_MT_CODE;
    return BFS_MP_MT_WCONFIG;
}

/* ---- the facts ------------------------------------------------------------------------------ */
/* ModelPack's precision names, in the order they are listed */
static const struct {
    bfs_dtype dt;
    const char *name;
} bfs__precisions[] = {
    {BFS_DT_BF16, "bfloat16"},      {BFS_DT_F32, "float32"},        {BFS_DT_F16, "float16"},
    {BFS_DT_F64, "float64"},        {BFS_DT_F8_E4M3, "float8_e4m3"}, {BFS_DT_F8_E5M2, "float8_e5m2"},
    {BFS_DT_I8, "int8"},            {BFS_DT_I16, "int16"},          {BFS_DT_I32, "int32"},
    {BFS_DT_I64, "int64"},          {BFS_DT_U8, "uint8"},           {BFS_DT_U16, "uint16"},
    {BFS_DT_U32, "uint32"},         {BFS_DT_U64, "uint64"},         {BFS_DT_BOOL, "bool"},
};

/* ModelPack's paramSize: a count with at most one decimal and a scale letter ("20.9b") */
static void bfs__param_size(uint64_t n, char *out, size_t cap)
{
    static const struct {
        double scale;
        char letter;
    } s[] = {{1e15, 'q'}, {1e12, 't'}, {1e9, 'b'}, {1e6, 'm'}, {1e3, 'k'}};
    out[0] = '\0';
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        if ((double)n < s[i].scale)
            continue;
        char num[32];
        snprintf(num, sizeof num, "%.1f", (double)n / s[i].scale);
        const size_t k = strlen(num);
        if (k > 2 && !strcmp(num + k - 2, ".0"))
            num[k - 2] = '\0';
        snprintf(out, cap, "%s%c", num, s[i].letter);
        return;
    }
}

static void bfs__copy(char *dst, size_t cap, const char *src) { snprintf(dst, cap, "%s", src ? src : ""); }

void bfs__oci_facts_from(const bfs_manifest_summary *s, bfs_oci_facts *f)
{
    f->precision[0] = '\0';
    for (size_t i = 0; i < sizeof bfs__precisions / sizeof bfs__precisions[0]; i++)
        if (s->dtypes & (1u << bfs__precisions[i].dt))
            snprintf(f->precision + strlen(f->precision), sizeof f->precision - strlen(f->precision), "%s%s",
                     f->precision[0] ? "," : "", bfs__precisions[i].name);
    bfs__copy(f->quantization, sizeof f->quantization, s->formats[0] ? s->formats : s->quant_method);
    bfs__param_size(s->params == UINT64_MAX ? 0 : s->params, f->param_size, sizeof f->param_size);
    bfs__copy(f->version, sizeof f->version, s->version);
    bfs__copy(f->layout, sizeof f->layout, s->layout);
    bfs__copy(f->seal, sizeof f->seal, s->seal);
    bfs__copy(f->fingerprint, sizeof f->fingerprint, s->fingerprint);
    f->world_size = s->world_size;
}

/* ---- JSON ---------------------------------------------------------------------------------- */
/* every set checked: jansson answers out of memory with NULL, which set_new drops silently */
static bool bfs__set(json_t *o, const char *k, json_t *v) { return o && v && json_object_set_new(o, k, v) == 0; }
static bool bfs__set_str(json_t *o, const char *k, const char *v) { return bfs__set(o, k, json_string(v)); }

static int bfs__dump(json_t *root, bool ok, char **text, size_t *len)
{
    *text = ok ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!*text)
        return bfs__err(BFS_ENOMEM, "out of memory building the OCI artifact");
    *len = strlen(*text);
    return 0;
}

static json_t *bfs__digest(const char *sha)
{
    char d[80];
    snprintf(d, sizeof d, "sha256:%s", sha);
    return json_string(d);
}

int bfs__oci_config_json(const bfs_oci_facts *f, const bfs_oci_layer *l, size_t n, char **text, size_t *len)
{
    json_t *root = json_object(), *desc = json_object(), *cfg = json_object(), *fs = json_object();
    json_t *ids = json_array();
    bool ok = root && desc && cfg && fs && ids;
    /* descriptor: the keys in the spec's order; a creation time only when asked */
    if (ok && f->created)
        ok = bfs__set_str(desc, "createdAt", f->created);
    ok = ok && bfs__set_str(desc, "name", f->name);
    if (ok && f->revision)
        ok = bfs__set_str(desc, "revision", f->revision);
    ok = ok && bfs__set_str(cfg, "format", "safetensors");
    if (ok && f->param_size[0])
        ok = bfs__set_str(cfg, "paramSize", f->param_size);
    if (ok && f->precision[0])
        ok = bfs__set_str(cfg, "precision", f->precision);
    if (ok && f->quantization[0]) /* provenance: what the weights were converted from */
        ok = bfs__set_str(cfg, "quantization", f->quantization);
    ok = ok && bfs__set_str(fs, "type", "layers");
    for (size_t i = 0; ok && i < n; i++) /* raw layers: a layer's DiffID is its digest */
        ok = json_array_append_new(ids, bfs__digest(l[i].sha256)) == 0;
    ok = ok && json_array_size(ids) == n && json_object_set(fs, "diffIds", ids) == 0;
    ok = ok && json_object_set(root, "descriptor", desc) == 0 && json_object_set(root, "config", cfg) == 0 &&
         json_object_set(root, "modelfs", fs) == 0;
    json_decref(desc);
    json_decref(cfg);
    json_decref(fs);
    json_decref(ids);
    return bfs__dump(root, ok, text, len);
}

static json_t *bfs__layer_json(const bfs_oci_layer *l)
{
    json_t *e = json_object(), *ann = json_object();
    bool ok = bfs__set_str(e, "mediaType", l->media_type) && bfs__set(e, "digest", bfs__digest(l->sha256)) &&
              bfs__set(e, "size", json_integer((json_int_t)l->size));
    ok = ok && bfs__set_str(ann, BFS_MP_ANN_FILEPATH, l->name);
    if (ok && l->rank >= 0) {
        char r[16];
        snprintf(r, sizeof r, "%d", l->rank);
        ok = bfs__set_str(ann, BFS_OCI_ANN_RANK, r);
    }
    if (ok && l->xxh3[0])
        ok = bfs__set_str(ann, BFS_OCI_ANN_XXH3, l->xxh3);
    ok = ok && json_object_set(e, "annotations", ann) == 0;
    json_decref(ann);
    if (!ok) {
        json_decref(e);
        return NULL;
    }
    return e;
}

int bfs__oci_manifest_json(const bfs_oci_facts *f, const char *config_sha, size_t config_len,
                           const bfs_oci_layer *l, size_t n, char **text, size_t *len)
{
    json_t *root = json_object(), *cfg = json_object(), *layers = json_array(), *ann = json_object();
    char ws[16];
    bool ok = root && cfg && layers && ann;
    ok = ok && bfs__set(root, "schemaVersion", json_integer(2)) && bfs__set_str(root, "mediaType", BFS_OCI_MT_MANIFEST) &&
         bfs__set_str(root, "artifactType", BFS_MP_ARTIFACT);
    ok = ok && bfs__set_str(cfg, "mediaType", BFS_MP_MT_CONFIG) && bfs__set(cfg, "digest", bfs__digest(config_sha)) &&
         bfs__set(cfg, "size", json_integer((json_int_t)config_len));
    for (size_t i = 0; ok && i < n; i++)
        ok = json_array_append_new(layers, bfs__layer_json(&l[i])) == 0;
    ok = ok && json_array_size(layers) == n;
    snprintf(ws, sizeof ws, "%d", f->world_size);
    if (ok && f->created)
        ok = bfs__set_str(ann, BFS_OCI_ANN_CREATED, f->created);
    ok = ok && bfs__set_str(ann, BFS_OCI_ANN_MANIFEST, BFS_MANIFEST_NAME) && bfs__set_str(ann, BFS_OCI_ANN_SEAL, f->seal) &&
         bfs__set_str(ann, BFS_OCI_ANN_FINGERPRINT, f->fingerprint) && bfs__set_str(ann, BFS_OCI_ANN_VERSION, f->version) &&
         bfs__set_str(ann, BFS_OCI_ANN_WORLD, ws) && bfs__set_str(ann, BFS_OCI_ANN_LAYOUT, f->layout);
    ok = ok && json_object_set(root, "config", cfg) == 0 && json_object_set(root, "layers", layers) == 0 &&
         json_object_set(root, "annotations", ann) == 0;
    json_decref(cfg);
    json_decref(layers);
    json_decref(ann);
    return bfs__dump(root, ok, text, len);
}

/* ---- arguments ---------------------------------------------------------------------------------- */
/* RFC 3339 date-time: YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM) */
static bool bfs__rfc3339(const char *s)
{
    static const char pat[] = "dddd-dd-ddTdd:dd:dd";
    for (size_t i = 0; i < sizeof pat - 1; i++)
        if (pat[i] == 'd' ? !(s[i] >= '0' && s[i] <= '9') : s[i] != pat[i])
            return false;
    const char *p = s + sizeof pat - 1;
    if (*p == '.') {
        const size_t k = strspn(p + 1, "0123456789");
        if (k == 0)
            return false;
        p += 1 + k;
    }
    if (*p == 'Z')
        return p[1] == '\0';
    return (*p == '+' || *p == '-') && strlen(p) == 6 && p[3] == ':' && strspn(p + 1, "0123456789") == 2 &&
           strspn(p + 4, "0123456789") == 2;
}

int bfs__oci_created(const char *arg, char out[40])
{
    if (!strcmp(arg, "now")) {
        const time_t t = time(NULL);
        struct tm tm;
        if (!gmtime_r(&t, &tm) || strftime(out, 40, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
            return bfs__err(BFS_EINTERNAL, "cannot format the current time");
        return 0;
    }
    if (strlen(arg) >= 40 || !bfs__rfc3339(arg))
        return bfs__err(BFS_EUSAGE, "--created %s: expected `now` or an RFC 3339 date-time like 2025-01-01T00:00:00Z",
                        arg);
    snprintf(out, 40, "%s", arg);
    return 0;
}

bool bfs__oci_tag_ok(const char *tag)
{
    const size_t n = strlen(tag);
    if (n == 0 || n > 128 || tag[0] == '.' || tag[0] == '-')
        return false;
    return strspn(tag, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == n;
}
