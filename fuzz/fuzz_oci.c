/*
 * Fuzz target: the OCI image layout reader (src/oci/): `bfshard verify OCIDIR`
 * (bfs__oci_check, and bfs_verify's choice of it, bfs__oci_is_layout: oci-layout,
 * index.json, image manifests, ModelPack configs and their schema, descriptors, blob
 * names and digests, annotations, the OUTDIR manifest carried as a layer against the
 * layers), and what `bfshard pack` reads of an existing layout (bfs__oci_open: its
 * oci-layout; bfs__oci_index_set: its index.json, an entry replaced in place).
 *
 * The layout is written in a scratch directory (tmpfs where there is one) from the input:
 * the blobs of a real layout (one of fz_oci_bases[], converted from a fixture and packed
 * once per process) hard-linked in, then the input's files. So that a mutated blob still
 * has its name, blobs are named by the harness and may refer to each other by placeholder:
 * in part i, "@D<n>" becomes "sha256:<hex>" of part n, "@H<n>" that hex, "@S<n>" its size in
 * bytes, for n > i (parts are resolved from the last to the first; other text is kept).
 *
 * Input: 1 selector byte + parts separated by "\n--bfs--\n": oci-layout, index.json, then
 * blobs (written to blobs/sha256/<sha256 of the part>).
 *   bits 0-1  whose blobs are there: fz_oci_bases[k] (gen_corpus.py packs the same)
 *   bit 2     none of them (only the input's blobs)
 *   bit 3     the first blob part's last byte flipped after it was named (bytes != name)
 *   bit 4     the second check through bfs_verify (the public entry point)
 *   bit 5     then pack's reader: bfs__oci_open and bfs__oci_index_set of a tag
 *   bit 6     an empty oci-layout or index.json part: no such file (else an empty file)
 *   bit 7     the last blob part a symbolic link to its bytes (never followed: MISSING)
 * Properties (abort when broken):
 *   - a refusal is BFS_EINPUT (exit 3: not a layout, no bfshard artifact) or BFS_EVERIFY
 *     (exit 7: problems found), one line saying why (fz_check_error); nothing else can
 *     happen to a layout on tmpfs;
 *   - the report is lines escaped by the one rule (fz_check_report), each beginning with
 *     "OCIDIR: "; none when accepted or BFS_EINPUT; with BFS_EVERIFY as many as the
 *     message's "N problem(s)";
 *   - checking twice gives the same verdict, message, report and bytes checked;
 *   - an accepted layout is one whose every manifest the index names, and every config and
 *     layer of a bfshard artifact among them, is a blob of its descriptor's size that
 *     hashes to its digest (checked here with OpenSSL, independently), and whose layers'
 *     org.bfshard.rank are as pack writes them ("%d" of 0..999999);
 *   - index_set keeps every other entry and key of the index as they were, puts its entry
 *     at the first of its tag (else appends it), and leaves index.json as it was when it
 *     refuses.
 */
#include "fuzz_common.h"
#include "base/bfs_io.h"
#include "oci/oci.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FZ_SEP "\n--bfs--\n"
#define FZO_MAXPARTS 48
#define FZO_NBASES 4
#define FZO_MAXBLOBS 64

/* the layouts whose blobs are under the input's (gen_corpus.py OCI_BASES: the same) */
typedef struct fzo_base {
    const char *fixture;
    int world_size, layout, sha256, compress_level;
    uint64_t max_shard_size;
} fzo_base;
static const fzo_base fz_oci_bases[FZO_NBASES] = {
    {"ct-fp8-block", 1, BFS_LAYOUT_DCP, 1, 0, 0},
    {"ct-int4-group", 2, BFS_LAYOUT_DCP, 0, 0, 0},
    {"bnb-fp4-dq", 1, BFS_LAYOUT_HF, 1, 0, 40000},
    {"modelopt-nvfp4", 8, BFS_LAYOUT_DCP, 1, 3, 0},
};
static char fzo_base_dir[FZO_NBASES][512];
static char *fzo_base_blob[FZO_NBASES][FZO_MAXBLOBS];
static char fzo_dir[512], fzo_spare[512];
int fz_oci_last_rc = 1; /* the verdict of the last input (tests/test_fuzz_readers.c reads it) */

static void fzo_make_base(int k)
{
    const fzo_base *b = &fz_oci_bases[k];
    char in[PATH_MAX], out[600];
    fz_fixture(b->fixture, in, sizeof in);
    snprintf(out, sizeof out, "%s/ociod%d", fz_dir(), k);
    snprintf(fzo_base_dir[k], sizeof fzo_base_dir[k], "%s/oci%d", fz_dir(), k);
    fz_rmrf(out);
    fz_rmrf(fzo_base_dir[k]);
    bfs_convert_opts o;
    bfs_convert_opts_init(&o);
    o.world_size = b->world_size;
    o.layout = b->layout;
    o.device = "cpu";
    o.threads = 1;
    o.sha256 = b->sha256;
    o.compress_level = b->compress_level;
    o.compress_mode = BFS_ZST_PLAIN;
    o.max_shard_size = b->max_shard_size;
    bfs_pack_opts po;
    bfs_pack_opts_init(&po);
    bfs__err_clear();
    if (bfs_convert(in, out, &o, NULL) != 0 || bfs_pack(out, fzo_base_dir[k], &po, NULL) != 0) {
        fprintf(stderr, "fuzz: cannot make OCI layout %d from %s: %s\n", k, in, bfs_last_error());
        abort();
    }
    char bd[700];
    snprintf(bd, sizeof bd, "%s/blobs/sha256", fzo_base_dir[k]);
    DIR *d = opendir(bd);
    struct dirent *e;
    int n = 0;
    if (!d)
        abort();
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.' && n < FZO_MAXBLOBS)
            fzo_base_blob[k][n++] = strdup(e->d_name);
    closedir(d);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    for (int k = 0; k < FZO_NBASES; k++)
        fzo_make_base(k);
    snprintf(fzo_dir, sizeof fzo_dir, "%s/ocidir", fz_dir());
    snprintf(fzo_spare, sizeof fzo_spare, "%s/ocispare", fz_dir());
    return 0;
}

/* ---- the input's parts -------------------------------------------------------------------- */
typedef struct {
    const uint8_t *raw;
    size_t rawlen;
    char *text; /* placeholders resolved */
    size_t len;
    char hex[65];
} fzo_part;

static void fzo_sha256(const void *p, size_t n, char hex[65])
{
    unsigned char md[32];
    unsigned int ml = 0;
    if (!EVP_Digest(p, n, md, &ml, EVP_sha256(), NULL) || ml != 32)
        abort();
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

static void fzo_resolve(fzo_part *P, size_t np, size_t i)
{
    const char *s = (const char *)P[i].raw;
    const size_t n = P[i].rawlen;
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f)
        abort();
    for (size_t j = 0; j < n;) {
        size_t ref = 0, d = j + 2;
        while (d < n && d < j + 4 && s[d] >= '0' && s[d] <= '9')
            ref = ref * 10 + (size_t)(s[d++] - '0');
        if (s[j] == '@' && j + 2 < n && strchr("DHS", s[j + 1]) && d > j + 2 && ref > i && ref < np) {
            if (s[j + 1] == 'D')
                fprintf(f, "sha256:%s", P[ref].hex);
            else if (s[j + 1] == 'H')
                fputs(P[ref].hex, f);
            else
                fprintf(f, "%zu", P[ref].len);
            j = d;
        } else {
            fputc(s[j++], f);
        }
    }
    if (fclose(f) != 0)
        abort();
    P[i].text = out;
    P[i].len = len;
    fzo_sha256(out, len, P[i].hex);
}

static size_t fzo_split(const uint8_t *data, size_t size, fzo_part *P)
{
    size_t np = 0;
    const char *s = (const char *)data, *end = s + size;
    while (np < FZO_MAXPARTS) {
        const char *sep = memmem(s, (size_t)(end - s), FZ_SEP, strlen(FZ_SEP));
        P[np].raw = (const uint8_t *)s;
        P[np++].rawlen = sep ? (size_t)(sep - s) : (size_t)(end - s);
        if (!sep)
            break;
        s = sep + strlen(FZ_SEP);
    }
    for (size_t i = np; i-- > 0;)
        fzo_resolve(P, np, i);
    return np;
}

/* ---- the layout ------------------------------------------------------------------------------ */
static void fzo_build(uint8_t sel, const fzo_part *P, size_t np)
{
    char p[PATH_MAX], from[PATH_MAX];
    fz_rmrf(fzo_dir);
    fz_rmrf(fzo_spare);
    if (mkdir(fzo_dir, 0755) != 0 || mkdir(fzo_spare, 0755) != 0)
        abort();
    static const char *const top[2] = {BFS_OCI_LAYOUT_FILE, BFS_OCI_INDEX_FILE};
    for (size_t i = 0; i < 2 && i < np; i++) {
        snprintf(p, sizeof p, "%s/%s", fzo_dir, top[i]);
        if (P[i].len || !(sel & 64))
            fz_write(p, P[i].text, P[i].len);
    }
    snprintf(p, sizeof p, "%s/blobs", fzo_dir);
    if (mkdir(p, 0755) != 0)
        abort();
    snprintf(p, sizeof p, "%s/blobs/sha256", fzo_dir);
    if (mkdir(p, 0755) != 0)
        abort();
    const int k = sel & 3;
    for (int b = 0; !(sel & 4) && b < FZO_MAXBLOBS && fzo_base_blob[k][b]; b++) {
        snprintf(from, sizeof from, "%s/blobs/sha256/%s", fzo_base_dir[k], fzo_base_blob[k][b]);
        snprintf(p, sizeof p, "%s/blobs/sha256/%s", fzo_dir, fzo_base_blob[k][b]);
        if (link(from, p) != 0)
            abort();
    }
    for (size_t i = 2; i < np; i++) {
        snprintf(p, sizeof p, "%s/blobs/sha256/%s", fzo_dir, P[i].hex);
        unlink(p); /* a base blob's link: never written through */
        if ((sel & 128) && i == np - 1) {
            snprintf(from, sizeof from, "%s/%s", fzo_spare, P[i].hex);
            fz_write(from, P[i].text, P[i].len);
            if (symlink(from, p) != 0)
                abort();
            continue;
        }
        if ((sel & 8) && i == 2) {
            char *c = malloc(P[i].len + 1);
            if (!c)
                abort();
            memcpy(c, P[i].text, P[i].len);
            if (P[i].len)
                c[P[i].len - 1] ^= 1;
            else
                c[0] = 'x';
            fz_write(p, c, P[i].len ? P[i].len : 1);
            free(c);
            continue;
        }
        fz_write(p, P[i].text, P[i].len);
    }
}

/* ---- the properties -------------------------------------------------------------------------- */
typedef struct {
    int rc;
    char *msg, *report;
    size_t len;
    uint64_t bytes;
} fzo_verdict;

static fzo_verdict fzo_run(bool public_entry)
{
    fzo_verdict v = {0};
    FILE *rep = open_memstream(&v.report, &v.len);
    if (!rep)
        abort();
    bfs__err_clear();
    v.rc = public_entry ? bfs_verify(fzo_dir, rep, &v.bytes) : bfs__oci_check(fzo_dir, rep, &v.bytes);
    fclose(rep);
    v.msg = strdup(bfs_last_error());
    return v;
}

static void fzo_check_verdict(const fzo_verdict *v)
{
    if (v->rc != 0 && v->rc != BFS_EINPUT && v->rc != BFS_EVERIFY) {
        fprintf(stderr, "fuzz: verify OCIDIR failed with %d (%s): %s\n", v->rc, bfs_err_name(v->rc), v->msg);
        abort();
    }
    if (v->rc != 0)
        fz_check_error(v->rc, "verify OCIDIR");
    const size_t lines = fz_check_report(v->report, v->len, "verify OCIDIR");
    const size_t pl = strlen(fzo_dir);
    for (const char *l = v->report; l < v->report + v->len; l = strchr(l, '\n') + 1)
        if (strncmp(l, fzo_dir, pl) || strncmp(l + pl, ": ", 2)) {
            fprintf(stderr, "fuzz: a report line that does not begin with OCIDIR: %.*s\n", (int)v->len, v->report);
            abort();
        }
    const char *pm = strstr(v->msg, ": ");
    unsigned long want = 0;
    while (pm && strstr(pm + 2, ": "))
        pm = strstr(pm + 2, ": ");
    if (v->rc == BFS_EVERIFY && (!pm || sscanf(pm, ": %lu problem(s) found", &want) != 1))
        want = (unsigned long)-1;
    if (lines != want) {
        fprintf(stderr, "fuzz: rc %d with \"%s\" and %zu report lines:\n%.*s\n", v->rc, v->msg, lines, (int)v->len,
                v->report);
        abort();
    }
}

static void fzo_same(const fzo_verdict *a, const fzo_verdict *b)
{
    if (a->rc != b->rc || strcmp(a->msg, b->msg) || a->len != b->len || memcmp(a->report, b->report, a->len) ||
        a->bytes != b->bytes) {
        fprintf(stderr, "fuzz: two checks of one layout differ: %d \"%s\" (%llu bytes) then %d \"%s\" (%llu bytes)\n"
                "%.*s--\n%.*s", a->rc, a->msg, (unsigned long long)a->bytes, b->rc, b->msg,
                (unsigned long long)b->bytes, (int)a->len, a->report, (int)b->len, b->report);
        abort();
    }
}

static void fzo_free(fzo_verdict *v)
{
    free(v->msg);
    free(v->report);
}

static json_t *fzo_load(const char *path)
{
    char *text = NULL;
    size_t len = 0;
    json_t *j = NULL;
    if (bfs__read_small_file(path, 64u << 20, &text, &len) == 0)
        j = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL);
    free(text);
    bfs__err_clear();
    return j;
}

/* the blob of descriptor d is its size and hashes to its digest; *j: it parsed, when asked */
static bool fzo_blob_good(const json_t *d, json_t **j)
{
    const char *dg = json_string_value(json_object_get(d, "digest"));
    const json_t *sz = json_object_get(d, "size");
    char p[PATH_MAX], hex[65];
    if (!dg || strncmp(dg, "sha256:", 7) || strlen(dg) != 71 || strchr(dg + 7, '/') || !json_is_integer(sz))
        return false;
    snprintf(p, sizeof p, "%s/blobs/sha256/%s", fzo_dir, dg + 7);
    struct stat sb;
    char *text = NULL;
    size_t len = 0;
    bool ok = lstat(p, &sb) == 0 && S_ISREG(sb.st_mode) && bfs__read_small_file(p, 64u << 20, &text, &len) == 0;
    bfs__err_clear();
    if (ok) {
        fzo_sha256(text, len, hex);
        ok = !strcmp(hex, dg + 7) && (json_int_t)len == json_integer_value(sz);
    }
    if (ok && j)
        *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL);
    free(text);
    return ok;
}

/* an org.bfshard.rank as pack writes it ("%d", 0..999999), or none */
static bool fzo_rank_ok(const json_t *r)
{
    const char *s = json_string_value(r);
    char buf[16];
    if (!r)
        return true;
    if (!s || strlen(s) > 6)
        return false;
    snprintf(buf, sizeof buf, "%d", atoi(s));
    return !strcmp(buf, s) && s[0] != '-';
}

/* an accepted layout, checked independently: every blob its bfshard artifacts name is good */
static void fzo_oracle(void)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", fzo_dir, BFS_OCI_INDEX_FILE);
    json_t *idx = fzo_load(p);
    const json_t *ms = json_object_get(idx, "manifests");
    int ours = 0;
    for (size_t i = 0; i < json_array_size(ms); i++) {
        const json_t *d = json_array_get(ms, i);
        const char *mt = json_string_value(json_object_get(d, "mediaType"));
        json_t *man = NULL;
        if (mt && strcmp(mt, BFS_OCI_MT_MANIFEST))
            continue;
        bool ok = fzo_blob_good(d, &man);
        if (ok && json_object_get(json_object_get(man, "annotations"), BFS_OCI_ANN_MANIFEST)) {
            ours++;
            const json_t *ls = json_object_get(man, "layers");
            ok = fzo_blob_good(json_object_get(man, "config"), NULL) && json_array_size(ls) > 0;
            for (size_t l = 0; ok && l < json_array_size(ls); l++) {
                const json_t *ann = json_object_get(json_array_get(ls, l), "annotations");
                ok = fzo_blob_good(json_array_get(ls, l), NULL) && fzo_rank_ok(json_object_get(ann, BFS_OCI_ANN_RANK));
            }
        }
        json_decref(man);
        if (!ok) {
            fprintf(stderr, "fuzz: verify accepted a layout with a bad blob or rank annotation (manifests[%zu], its config or layers)\n", i);
            abort();
        }
    }
    json_decref(idx);
    if (ours == 0) {
        fprintf(stderr, "fuzz: verify accepted a layout without a bfshard artifact\n");
        abort();
    }
}

/* pack's reader of an existing layout: index.json's entry of a tag replaced, the rest kept */
static void fzo_index_set(const fzo_part *P, size_t np)
{
    char p[PATH_MAX], *before = NULL, *after = NULL;
    size_t bl = 0, al = 0;
    snprintf(p, sizeof p, "%s/%s", fzo_dir, BFS_OCI_INDEX_FILE);
    const bool had = bfs__read_small_file(p, 64u << 20, &before, &bl) == 0;
    json_t *old = had ? json_loadb(before, bl, JSON_REJECT_DUPLICATES, NULL) : NULL;
    const json_t *m0 = json_object_get(old, "manifests");
    const char *t0 = json_string_value(json_object_get(json_object_get(json_array_get(m0, 0), "annotations"),
                                                       BFS_OCI_ANN_REF));
    const char *tag = t0 && bfs__oci_tag_ok(t0) ? t0 : BFS_OCI_DEFAULT_TAG;
    char sha[65];
    snprintf(sha, sizeof sha, "%s", np > 2 ? P[2].hex : "0000000000000000000000000000000000000000000000000000000000000000");
    const size_t len = np > 2 ? P[2].len : 0;
    bfs_oci_dir d;
    bfs__err_clear();
    int rc = bfs__oci_open(fzo_dir, &d);
    if (rc == 0)
        rc = bfs__oci_index_set(&d, tag, sha, len);
    bfs__oci_close(&d, rc != 0);
    if (rc != 0) {
        fz_check_error(rc, "bfs__oci_index_set");
        const bool has = bfs__read_small_file(p, 64u << 20, &after, &al) == 0;
        if (has != had || (had && (al != bl || memcmp(after, before, bl)))) {
            fprintf(stderr, "fuzz: a refused index_set changed index.json\n");
            abort();
        }
    } else {
        json_t *now = fzo_load(p);
        const json_t *m = json_object_get(now, "manifests");
        size_t at = json_array_size(m0);
        for (size_t i = 0; i < json_array_size(m0) && at == json_array_size(m0); i++) {
            const char *t = json_string_value(json_object_get(json_object_get(json_array_get(m0, i), "annotations"),
                                                              BFS_OCI_ANN_REF));
            if (t && !strcmp(t, tag))
                at = i;
        }
        bool ok = json_is_object(now) && json_array_size(m) == json_array_size(m0) + (at == json_array_size(m0));
        for (size_t i = 0; ok && i < json_array_size(m); i++) {
            const json_t *e = json_array_get(m, i);
            const char *dg = json_string_value(json_object_get(e, "digest"));
            ok = i == at ? dg && strlen(dg) == 71 && !strcmp(dg + 7, sha) && json_integer_value(json_object_get(e, "size")) == (json_int_t)len
                         : json_equal(e, json_array_get(m0, i));
        }
        const char *key;
        json_t *v;
        json_object_foreach(old, key, v) ok = ok && (!strcmp(key, "manifests") || json_equal(v, json_object_get(now, key)));
        if (!ok) {
            fprintf(stderr, "fuzz: index_set of tag %s did not keep the index:\n%.*s\n", tag, (int)bl, before);
            abort();
        }
        json_decref(now);
    }
    json_decref(old);
    free(before);
    free(after);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (!fzo_dir[0]) {
        int argc = 0;
        char **argv = NULL;
        LLVMFuzzerInitialize(&argc, &argv);
    }
    const uint8_t sel = data[0];
    fzo_part P[FZO_MAXPARTS];
    memset(P, 0, sizeof P);
    const size_t np = fzo_split(data + 1, size - 1, P);
    fzo_build(sel, P, np);
    fzo_verdict a = fzo_run(false);
    fzo_check_verdict(&a);
    fzo_verdict b = fzo_run((sel & 16) != 0);
    if (!(sel & 16) || bfs__oci_is_layout(fzo_dir)) {
        fzo_same(&a, &b);
    } else if (b.rc != 0) {
        fz_check_error(b.rc, "bfs_verify");
    }
    if (a.rc == 0)
        fzo_oracle();
    fz_oci_last_rc = a.rc;
    if (getenv("FZ_OCI_VERBOSE")) /* what verify said, when reproducing an input */
        fprintf(stderr, "fuzz_oci: %d (%s) %s\n%.*s", a.rc, bfs_err_name(a.rc), a.msg, (int)a.len, a.report);
    fzo_free(&a);
    fzo_free(&b);
    if (sel & 32)
        fzo_index_set(P, np);
    for (size_t i = 0; i < np; i++)
        free(P[i].text);
    return 0;
}
