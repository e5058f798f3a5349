/*
 * Fuzz target: the manifest reader (src/output/manifest_read.c: the windowed structural
 * scanner, the seal, the head and the per-element parse; manifest_check.c: the shard
 * index and narrowing) and what reads a manifest from an OUTDIR: bfs__mf_open (whole and
 * head only), tensors[] walked again (bfs__mf_rewind, bfs__mf_next), the seal check,
 * files[] entries, a part's info, compress's rewrite (bfs__mf_write_copy), the ownership
 * of OUTDIR's files, merging a part (bfs__manifest_merge), bfs_verify and bfs_inspect.
 * The bytes replace the manifest of an OUTDIR made from a fixture (fz_outdirs[]).
 *
 * Input: 1 selector byte + the manifest.
 *   bits 0-2  the OUTDIR (fz_outdirs[]; 5 is a conversion in two parts, not merged: the
 *             bytes are its first part's manifest, merged with the real second part)
 *   bit 3     re-seal: the harness writes the bytes' own seal where the reader looks for
 *             it (as bfshard would), so that a changed manifest gets past the seal check
 *   bit 4     inspect --json (else text)
 *   bit 5     narrowing's hash fails on every other shard; bit 6: those failures are reported
 * Properties (abort when broken):
 *   - a rejected manifest: a BFS_E* code and one line saying why (fz_check_error);
 *   - accepted whole => accepted head only, with the same head and number of tensors;
 *   - tensors[] walked again (after open, after a rewind, after a rewrite) gives exactly
 *     the elements that each() saw while opening;
 *   - the seal check reports as many lines as it counts; verify's, narrowing's and
 *     inspect's output is lines escaped by the one rule (no C0, DEL or C1 control, well-
 *     formed UTF-8: fz_check_report), text and --json alike;
 *   - narrowing reports at most one line per shard of the file;
 *   - compress's rewrite of an accepted manifest is never an internal error; what it
 *     writes is accepted, sealed, has the same head (but the seal) and the same tensors,
 *     and rewriting that again gives the same bytes; a manifest as bfshard sealed it (not
 *     re-sealed here) comes out byte for byte as it went in;
 *   - a merge of an accepted, sealed part either fails cleanly or writes a manifest
 *     that is accepted and sealed.
 * Memory and time are bounded by the libFuzzer options in fuzz/manifest.options.
 */
#include "fuzz_common.h"
#include "base/bfs_io.h"
#include "output/manifest.h"
#include "output/outdir.h"
#include "output/parts.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FZ_SEAL_KEY "\"manifest_xxh3_128\": \""

static char fz_rt[512];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *m;
    for (int k = 0; k < FZ_NOUTDIRS; k++)
        fz_outdir_get(k, &m);
    snprintf(fz_rt, sizeof fz_rt, "%s/rt", fz_dir());
    if (mkdir(fz_rt, 0755) != 0 && errno != EEXIST)
        abort();
    return 0;
}

static uint8_t *fzm_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0, k;
    uint8_t *b = malloc(cap);
    while (b && (k = fread(b + n, 1, cap - n, f)) > 0)
        if ((n += k) == cap && !(b = realloc(b, cap *= 2)))
            abort();
    fclose(f);
    if (!b)
        abort();
    *len = n;
    return b;
}

/* the seal bfshard would write: the last "manifest_xxh3_128": " followed by 32 bytes and
 * a '"' (the reader's rule) gets the XXH3-128 of the bytes with those 32 as '0's */
static void fz_reseal(uint8_t *b, size_t n)
{
    const size_t kl = strlen(FZ_SEAL_KEY);
    uint8_t *hit = NULL;
    for (uint8_t *p = b; n >= kl && (p = memmem(p, n - (size_t)(p - b), FZ_SEAL_KEY, kl)) != NULL; p++)
        hit = p + kl;
    if (!hit || (size_t)(hit - b) + 33 > n || hit[32] != '"')
        return;
    char hex[33];
    memset(hit, '0', 32);
    bfs__hash_hex(XXH3_128bits(b, n), hex);
    memcpy(hit, hex, 32);
}

/* ---- what each() saw, and tensors[] walked again ----------------------------------------- */
typedef struct {
    XXH3_state_t *st;
    size_t n;
    json_t *shards; /* file name -> how many shards name it */
} fz_tally;

static void fz_tally_init(fz_tally *y)
{
    y->st = XXH3_createState();
    y->shards = json_object();
    y->n = 0;
    if (!y->st || !y->shards || XXH3_128bits_reset(y->st) != XXH_OK)
        abort();
}

static void fz_tally_free(fz_tally *y)
{
    XXH3_freeState(y->st);
    json_decref(y->shards);
}

static void fz_tally_add(fz_tally *y, const json_t *t)
{
    char *s = json_dumps(t, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!json_is_object(t) || !s) {
        fprintf(stderr, "fuzz: tensors[%zu] handed over is not an object\n", y->n);
        abort();
    }
    XXH3_128bits_update(y->st, s, strlen(s) + 1);
    free(s);
    const json_t *sh = json_object_get(t, "shards");
    for (size_t k = 0; k < json_array_size(sh); k++) {
        const char *f = json_string_value(json_object_get(json_array_get(sh, k), "file"));
        if (f)
            json_object_set_new(y->shards, f, json_integer(json_integer_value(json_object_get(y->shards, f)) + 1));
    }
    y->n++;
}

static int fz_each(void *user, size_t i, const json_t *t)
{
    fz_tally *y = user;
    if (i != y->n) {
        fprintf(stderr, "fuzz: each() got tensors[%zu] after %zu\n", i, y->n);
        abort();
    }
    fz_tally_add(y, t);
    return 0;
}

static bool fz_tally_same(const fz_tally *a, const fz_tally *b)
{
    const XXH128_hash_t x = XXH3_128bits_digest(a->st), z = XXH3_128bits_digest(b->st);
    return a->n == b->n && XXH128_isEqual(x, z);
}

/* tensors[] with bfs__mf_next (rewound first when rewind): the same elements as want */
static void fz_walk(bfs_mf *r, bool rewind, const fz_tally *want, const char *when)
{
    fz_tally y;
    json_t *t;
    int got;
    fz_tally_init(&y);
    bfs__err_clear();
    if (rewind && bfs__mf_rewind(r) != 0) {
        fprintf(stderr, "fuzz: %s: rewind failed: %s\n", when, bfs_last_error());
        abort();
    }
    while ((got = bfs__mf_next(r, &t)) > 0) {
        fz_tally_add(&y, t);
        json_decref(t);
    }
    if (got < 0 || !fz_tally_same(&y, want)) {
        fprintf(stderr, "fuzz: %s: tensors[] walked again gives %zu elements (of %zu), or others: %s\n", when, y.n,
                want->n, got < 0 ? bfs_last_error() : "");
        abort();
    }
    fz_tally_free(&y);
}

/* ---- narrowing ------------------------------------------------------------------------------ */
typedef struct {
    unsigned calls;
    bool fail_odd;
} fz_hasher;

static int fz_hash(void *user, uint64_t off, uint64_t nb, char hex[33])
{
    fz_hasher *h = user;
    (void)off;
    (void)nb;
    const unsigned n = h->calls++;
    snprintf(hex, 33, "%032x", n);
    return h->fail_odd && (n & 1) ? bfs__err(BFS_EIO, "fuzz: shard bytes unreadable") : 0;
}

static void fz_narrow_all(bfs_mf *r, const json_t *files, const fz_tally *y, uint8_t sel)
{
    bfs_shard_index *ix = NULL;
    bfs__err_clear();
    const int rc = bfs__manifest_shard_index(r, files, &ix);
    if (rc != 0) {
        fz_check_error(rc, "bfs__manifest_shard_index");
        return;
    }
    for (size_t i = 0; i < json_array_size(files); i++) {
        const json_t *f = json_array_get(files, i);
        const char *name = json_string_value(json_object_get(f, "name"));
        if (!name)
            continue;
        const uint64_t size = (uint64_t)json_integer_value(json_object_get(f, "size"));
        const json_int_t nsh = json_integer_value(json_object_get(y->shards, name));
        char *text = NULL;
        size_t len = 0;
        FILE *rep = open_memstream(&text, &len);
        fz_hasher h = {0, (sel & 32) != 0};
        uint64_t first = 0;
        bfs__err_clear();
        const int bad = bfs__manifest_narrow(ix, name, size, "f", rep, fz_hash, &h, (sel & 64) != 0, &first);
        fclose(rep);
        const size_t lines = fz_check_report(text, len, "narrowing");
        if (bad < 0 || (json_int_t)bad > nsh || (json_int_t)h.calls > nsh || lines > (size_t)nsh || (size_t)bad > lines ||
            first > size) {
            fprintf(stderr, "fuzz: narrowing %s: %d reported, %u hashed, %zu lines, of %lld shards\n", name, bad,
                    h.calls, lines, (long long)nsh);
            abort();
        }
        free(text);
    }
    bfs__manifest_shard_index_free(ix);
}

/* ---- compress's rewrite ---------------------------------------------------------------------- */
static json_t *fz_head_unsealed(const bfs_mf *r)
{
    json_t *h = json_deep_copy(bfs__mf_head(r));
    if (!h)
        abort();
    json_object_del(h, "manifest_xxh3_128");
    return h;
}

static void fz_rewrite(bfs_mf *r, const fz_tally *y, const uint8_t *in, size_t n, bool sealed_by_bfshard)
{
    char p1[600], p2[600];
    snprintf(p1, sizeof p1, "%s/m1.json", fz_rt);
    snprintf(p2, sizeof p2, "%s/m2.json", fz_rt);
    bfs__err_clear();
    int rc = bfs__mf_write_copy(-1, fz_rt, "m1.json", bfs__mf_head(r), r);
    if (rc != 0) {
        fz_check_error(rc, "bfs__mf_write_copy");
        if (rc == BFS_EINTERNAL) {
            fprintf(stderr, "fuzz: compress's rewrite of an accepted manifest: %s\n", bfs_last_error());
            abort();
        }
        return;
    }
    fz_walk(r, false, y, "after the rewrite"); /* the rewrite used the reader's window */
    bfs_mf *r1 = NULL;
    fz_tally y1;
    fz_tally_init(&y1);
    bfs__err_clear();
    if ((rc = bfs__mf_open(fz_rt, "m1.json", 0, fz_each, &y1, &r1)) != 0 || !fz_tally_same(&y1, y) ||
        bfs__mf_check_seal(r1, NULL) != 0) {
        fprintf(stderr, "fuzz: the rewritten manifest is %s\n", rc ? bfs_last_error() : "unsealed or has other tensors");
        abort();
    }
    json_t *h0 = fz_head_unsealed(r), *h1 = fz_head_unsealed(r1);
    if (!json_equal(h0, h1)) {
        fprintf(stderr, "fuzz: the rewritten manifest's head differs\n");
        abort();
    }
    json_decref(h0);
    json_decref(h1);
    if ((rc = bfs__mf_write_copy(-1, fz_rt, "m2.json", bfs__mf_head(r1), r1)) != 0) {
        fprintf(stderr, "fuzz: rewriting the rewritten manifest: %s\n", bfs_last_error());
        abort();
    }
    size_t n1, n2;
    uint8_t *b1 = fzm_slurp(p1, &n1), *b2 = fzm_slurp(p2, &n2);
    if (!b1 || !b2 || n1 != n2 || memcmp(b1, b2, n1) != 0) {
        fprintf(stderr, "fuzz: a rewrite is not a fixed point: %zu bytes, then %zu\n", n1, n2);
        abort();
    }
    if (sealed_by_bfshard && (n1 != n || memcmp(b1, in, n) != 0)) {
        fprintf(stderr, "fuzz: a manifest bfshard sealed is not rewritten byte for byte (%zu bytes, then %zu)\n", n, n1);
        abort();
    }
    free(b1);
    free(b2);
    bfs__mf_free(r1);
    fz_tally_free(&y1);
}

/* ---- a part merged with the real other part ------------------------------------------------ */
static void fz_merge(const char *od, bfs_mf *mine)
{
    bfs_mf *other = NULL, *out = NULL;
    char oname[64];
    snprintf(oname, sizeof oname, BFS_PART_PREFIX "%s" BFS_PART_SUFFIX, fz_outdirs[5].ranks[1]);
    bfs__err_clear();
    if (bfs__mf_open(od, oname, 0, NULL, NULL, &other) != 0)
        abort();
    bfs_mf *parts[2] = {mine, other};
    const char *names[2] = {BFS_PART_PREFIX "0" BFS_PART_SUFFIX, oname};
    const int dirfd = open(fz_rt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        abort();
    bfs__err_clear();
    int rc = bfs__manifest_merge(dirfd, parts, names, 2, fz_rt, NULL, NULL);
    if (rc != 0) {
        fz_check_error(rc, "bfs__manifest_merge");
        if (rc == BFS_EINTERNAL)
            abort();
    } else if ((rc = bfs__mf_open(fz_rt, BFS_MANIFEST_NAME, 0, NULL, NULL, &out)) != 0 ||
               bfs__mf_check_seal(out, NULL) != 0) {
        fprintf(stderr, "fuzz: the merged manifest is %s\n", rc ? bfs_last_error() : "unsealed");
        abort();
    }
    bfs__mf_free(out);
    bfs__mf_free(other);
    close(dirfd);
}

/* ---- the commands over the OUTDIR ------------------------------------------------------------- */
static void fz_commands(const char *od, int k, uint8_t sel)
{
    char *text = NULL;
    size_t len = 0;
    FILE *rep = open_memstream(&text, &len);
    uint64_t checked = 0;
    bfs__err_clear();
    int rc = bfs_verify(od, rep, &checked);
    fclose(rep);
    fz_check_report(text, len, "verify");
    if (rc != 0)
        fz_check_error(rc, "bfs_verify");
    free(text);

    const int dirfd = open(od, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    bfs_owned own = {0};
    bfs__err_clear();
    if (dirfd < 0)
        abort();
    if ((rc = bfs__owned_load(dirfd, od, &own)) != 0)
        fz_check_error(rc, "bfs__owned_load");
    bfs__owned_free(&own);
    close(dirfd);

    if (fz_outdirs[k].ranks[0])
        return; /* no manifest: inspect would plan the rank files as an input */
    bfs_convert_opts co;
    bfs_convert_opts_init(&co);
    text = NULL;
    rep = open_memstream(&text, &len);
    bfs__err_clear();
    rc = bfs_inspect(od, &co, (sel & 16) != 0, rep);
    fclose(rep);
    if (rc != 0)
        fz_check_error(rc, "bfs_inspect");
    if (!(sel & 16))
        for (size_t i = 0; i < len; i++)
            if (text[i] == '\t')
                text[i] = ' '; /* a table may use tabs */
    fz_check_report(text, len, "inspect");
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t sel = data[0];
    const int k = sel & 7;
    const char *mname;
    const char *od = fz_outdir_get(k, &mname);
    if (!fz_rt[0]) {
        int argc = 0;
        char **argv = NULL;
        LLVMFuzzerInitialize(&argc, &argv);
    }
    const size_t n = size - 1;
    uint8_t *m = malloc(n ? n : 1);
    if (!m)
        abort();
    memcpy(m, data + 1, n);
    if (sel & 8)
        fz_reseal(m, n);
    char path[700];
    snprintf(path, sizeof path, "%s/%s", od, mname);
    fz_write(path, m, n);

    bfs_mf *r = NULL, *rh = NULL;
    fz_tally y;
    fz_tally_init(&y);
    bfs__err_clear();
    const int rc = bfs__mf_open(od, mname, 0, fz_each, &y, &r);
    if (rc != 0)
        fz_check_error(rc, "bfs__mf_open");
    bfs__err_clear();
    const int rch = bfs__mf_open(od, mname, BFS_MF_HEAD_ONLY, NULL, NULL, &rh);
    if (rch != 0)
        fz_check_error(rch, "bfs__mf_open (head only)");
    if (rc == 0 && (rch != 0 || bfs__mf_ntensors(rh) != bfs__mf_ntensors(r) || bfs__mf_ntensors(r) != y.n ||
                    bfs__mf_has_tensors(rh) != bfs__mf_has_tensors(r) || !json_equal(bfs__mf_head(r), bfs__mf_head(rh)))) {
        fprintf(stderr, "fuzz: read whole and head only disagree: %s\n", rch ? bfs_last_error() : "");
        abort();
    }
    if (rc == 0) {
        const json_t *head = bfs__mf_head(r), *files = json_object_get(head, "files");
        if (bfs__mf_has_tensors(r)) {
            fz_walk(r, false, &y, "after open");
            fz_walk(r, true, &y, "after a rewind");
        }
        char *text = NULL;
        size_t len = 0;
        FILE *rep = open_memstream(&text, &len);
        const int sbad = bfs__mf_check_seal(r, rep);
        fclose(rep);
        if ((sbad != 0 && sbad != 1) || fz_check_report(text, len, "the seal check") != (size_t)sbad)
            abort();
        free(text);
        for (size_t i = 0; i < json_array_size(files); i++) {
            bfs_manifest_file mf;
            if (bfs__manifest_file_get(files, i, &mf) && (!mf.name || !mf.hash || strchr(mf.name, '/') || mf.name[0] == '.'))
                abort();
        }
        const char *ranks, *fp;
        int W;
        if (bfs__manifest_part_info(head, &ranks, &W, &fp) && (W < 1 || !ranks || !fp))
            abort();
        if (bfs__mf_has_tensors(r)) {
            if (json_is_array(files))
                fz_narrow_all(r, files, &y, sel);
            fz_rewrite(r, &y, m, n, !(sel & 8) && sbad == 0);
            if (fz_outdirs[k].ranks[0] && sbad == 0)
                fz_merge(od, r);
        }
    }
    bfs__mf_free(r);
    bfs__mf_free(rh);
    fz_tally_free(&y);
    fz_commands(od, k, sel);
    free(m);
    return 0;
}
