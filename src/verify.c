/*
 * bfs_verify: re-hash every file of OUTDIR against bfshard.manifest.json.
 * A file whose hash differs is narrowed down to the tensors (and byte ranges)
 * that differ, or to its header when all tensors match.
 */
#include "bfs_internal.h"
#include "bfs_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void bfs__report(FILE *out, const char *fmt, ...)
{
    if (!out)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fputc('\n', out);
}

/* ---- the manifest's and the sums file's own integrity ---------------------------------
 * bfshard.manifest.json carries "manifest_xxh3_128": the XXH3-128 of the whole file as
 * written with that value set to 32 '0's. Any changed byte of the manifest shows:
 * its hash no longer matches, or the seal is gone. Whoever writes or rewrites a
 * manifest calls bfs__manifest_seal() on its final bytes.
 * xxh128sums.txt may hold only lines "HASH  NAME\n" that agree with the manifest. */
#define BFS_SEAL_KEY "\"manifest_xxh3_128\": \""

static char *bfs__seal_find(char *text, size_t len)
{
    const size_t kl = strlen(BFS_SEAL_KEY);
    char *hit = NULL;
    for (char *p = text; (p = memmem(p, len - (size_t)(p - text), BFS_SEAL_KEY, kl)) != NULL; p += kl)
        hit = p + kl;
    if (!hit || (size_t)(hit - text) + 33 > len || hit[32] != '"')
        return NULL;
    return hit;
}

int bfs__manifest_seal(char *text, size_t len)
{
    char *v = bfs__seal_find(text, len), hex[33];
    if (!v)
        return bfs__err(BFS_EINTERNAL, "manifest without a \"manifest_xxh3_128\" field to seal");
    memset(v, '0', 32);
    bfs__hash_hex(XXH3_128bits(text, len), hex);
    memcpy(v, hex, 32);
    return 0;
}

/* 1 when the seal is missing or wrong (reported), else 0 */
static int bfs__verify_seal(const char *mpath, const char *text, size_t len, const json_t *m, FILE *report)
{
    char *copy = malloc(len + 1), got[33] = "", want[33] = "";
    char *v = copy ? bfs__seal_find(memcpy(copy, text, len), len) : NULL;
    const char *jv = json_string_value(json_object_get(m, "manifest_xxh3_128"));
    if (v) {
        memcpy(want, v, 32);
        memset(v, '0', 32);
        bfs__hash_hex(XXH3_128bits(copy, len), got);
    }
    free(copy);
    if (v && jv && strcmp(jv, want) == 0 && strcmp(got, want) == 0)
        return 0;
    if (!v || !jv)
        bfs__report(report, "%s: BAD manifest: no \"manifest_xxh3_128\" seal", mpath);
    else
        bfs__report(report, "%s: BAD manifest: its bytes hash to %s, its seal says %s", mpath, got, want);
    return 1;
}

static bool bfs__sums_entry(const json_t *files, const char *name, size_t nlen, const char *hash)
{
    for (size_t i = 0; i < json_array_size(files); i++) {
        const json_t *f = json_array_get(files, i), *z = json_object_get(f, "zst");
        const char *n1 = json_string_value(json_object_get(f, "name")), *h1 = json_string_value(json_object_get(f, "xxh3_128"));
        const char *n2 = json_string_value(json_object_get(z, "name")), *h2 = json_string_value(json_object_get(z, "xxh3_128"));
        if (n1 && h1 && strlen(n1) == nlen && !memcmp(n1, name, nlen) && !strncmp(h1, hash, 32) && strlen(h1) == 32)
            return true;
        if (n2 && h2 && strlen(n2) == nlen && !memcmp(n2, name, nlen) && !strncmp(h2, hash, 32) && strlen(h2) == 32)
            return true;
    }
    return false;
}

/* number of bad lines of xxh128sums.txt (1 when it is missing) */
static int bfs__verify_sums(const char *outdir, const json_t *files, FILE *report)
{
    char *path = bfs__path_join(outdir, BFS_SUMS_NAME), *text = NULL;
    size_t len = 0, pos = 0;
    int bad = 0, line = 0;
    if (!path)
        return 1;
    if (bfs__read_small_file(path, 1u << 30, &text, &len) != 0) {
        bfs__report(report, "%s: MISSING or unreadable (%s)", path, bfs_last_error());
        bfs__err_clear();
        free(path);
        return 1;
    }
    while (pos < len) {
        const char *l = text + pos, *nl = memchr(l, '\n', len - pos);
        const size_t ll = nl ? (size_t)(nl - l) : len - pos;
        bool ok = nl && ll > 34 && l[32] == ' ' && l[33] == ' ';
        for (int i = 0; ok && i < 32; i++)
            ok = (l[i] >= '0' && l[i] <= '9') || (l[i] >= 'a' && l[i] <= 'f');
        line++;
        if (!ok || !bfs__sums_entry(files, l + 34, ll - 34, l)) {
            bfs__report(report, "%s: BAD line %d: not \"HASH  NAME\" of a file in the manifest", path, line);
            bad++;
        }
        pos += ll + 1;
    }
    free(text);
    free(path);
    return bad;
}

int bfs_verify(const char *outdir, FILE *report, uint64_t *bytes_checked)
{
    int rc = 0, bad = 0;
    char *mpath = NULL, *text = NULL;
    json_t *m = NULL;
    uint8_t *buf = NULL;
    XXH3_state_t *st = XXH3_createState(), *st2 = XXH3_createState();
    const size_t bs = 8u << 20;
    uint64_t checked = 0;
    json_error_t jerr;
    DIR *d = NULL;
    bfs__err_clear();

    if (!st || !st2 || !(buf = malloc(bs)))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    mpath = bfs__path_join(outdir, BFS_MANIFEST_NAME);
    if (!mpath)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    size_t tlen = 0;
    BFS_TRY(bfs__read_small_file(mpath, 1u << 30, &text, &tlen));
    m = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!m || !json_is_object(m) || !json_is_array(json_object_get(m, "files")) ||
        !json_is_array(json_object_get(m, "tensors")))
        BFS_FAIL(BFS_EINPUT, "%s: not a bfshard manifest (%s)", mpath, m ? "missing files/tensors" : jerr.text);
    json_t *files = json_object_get(m, "files"), *tensors = json_object_get(m, "tensors");
    bad += bfs__verify_seal(mpath, text, tlen, m, report); /* bfshard compress re-seals what it rewrites */
    bad += bfs__verify_sums(outdir, files, report);

    for (size_t i = 0; i < json_array_size(files); i++) {
        json_t *f = json_array_get(files, i);
        const char *name = json_string_value(json_object_get(f, "name"));
        const char *want = json_string_value(json_object_get(f, "xxh3_128"));
        const json_t *jsz = json_object_get(f, "size");
        if (!name || !want || !json_is_integer(jsz) || strchr(name, '/') || name[0] == '.')
            BFS_FAIL(BFS_EINPUT, "%s: files[%zu] is malformed", mpath, i);
        const uint64_t size = (uint64_t)json_integer_value(jsz);
        char *path = bfs__path_join(outdir, name);
        if (!path)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        /* ISSUE 7: a compressed copy (files[].zst) is checked by streaming decompression */
        const json_t *zst = json_object_get(f, "zst");
        if (zst) {
            const int zb = bfs__zst_verify_entry(outdir, f, tensors, report, &checked);
            if (zb < 0) {
                free(path);
                BFS_FAIL(zb, "%s", bfs_last_error());
            }
            bad += zb;
        }
        const int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        struct stat sb;
        if (fd < 0 && zst && errno == ENOENT) { /* only the compressed copy is kept */
            free(path);
            continue;
        }
        if (fd < 0) {
            bfs__report(report, "%s: MISSING (%s)", path, strerror(errno));
            bad++;
            free(path);
            continue;
        }
        if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != size) {
            bfs__report(report, "%s: BAD SIZE: %lld bytes, manifest says %llu", path, (long long)sb.st_size,
                        (unsigned long long)size);
            bad++;
            close(fd);
            free(path);
            continue;
        }
        XXH3_128bits_reset(st);
        rc = bfs__hash_range(fd, 0, size, buf, bs, path, st, NULL);
        if (rc < 0) {
            close(fd);
            free(path);
            goto cleanup;
        }
        checked += size;
        char got[33];
        bfs__hash_hex(XXH3_128bits_digest(st), got);
        if (strcmp(got, want) == 0) {
            close(fd);
            free(path);
            continue;
        }
        bad++;
        /* narrow it down to tensors */
        int bad_t = 0;
        uint64_t first_data = size;
        for (size_t t = 0; t < json_array_size(tensors); t++) {
            json_t *te = json_array_get(tensors, t);
            json_t *shards = json_object_get(te, "shards");
            for (size_t s = 0; s < json_array_size(shards); s++) {
                json_t *sh = json_array_get(shards, s);
                const char *sf = json_string_value(json_object_get(sh, "file"));
                if (!sf || strcmp(sf, name) != 0)
                    continue;
                const uint64_t off = (uint64_t)json_integer_value(json_object_get(sh, "offset"));
                const uint64_t nb = (uint64_t)json_integer_value(json_object_get(sh, "nbytes"));
                const char *sw = json_string_value(json_object_get(sh, "xxh3_128"));
                if (off < first_data)
                    first_data = off;
                if (off > size || nb > size - off || !sw)
                    continue;
                XXH3_128bits_reset(st2);
                if (bfs__hash_range(fd, off, nb, buf, bs, path, st2, NULL) < 0)
                    continue;
                char g2[33];
                bfs__hash_hex(XXH3_128bits_digest(st2), g2);
                if (strcmp(g2, sw) != 0) {
                    bfs__report(report, "%s: BAD tensor \"%s\" bytes [%llu, %llu) (hash %s, manifest %s)", path,
                                json_string_value(json_object_get(te, "name")), (unsigned long long)off,
                                (unsigned long long)(off + nb), g2, sw);
                    bad_t++;
                }
            }
        }
        if (bad_t == 0)
            bfs__report(report, "%s: BAD header or metadata bytes [0, %llu) (file hash %s, manifest %s)", path,
                        (unsigned long long)(first_data < size ? first_data : size), got, want);
        close(fd);
        free(path);
    }

    /* stray weight files confuse loaders that glob *.safetensors */
    d = opendir(outdir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            const size_t n = strlen(e->d_name);
            if (n <= 12 || strcmp(e->d_name + n - 12, ".safetensors") != 0)
                continue;
            bool listed = false;
            for (size_t i = 0; i < json_array_size(files) && !listed; i++) {
                const char *nm = json_string_value(json_object_get(json_array_get(files, i), "name"));
                listed = nm && strcmp(nm, e->d_name) == 0;
            }
            if (!listed) {
                bfs__report(report, "%s/%s: EXTRA .safetensors file not in the manifest", outdir, e->d_name);
                bad++;
            }
        }
    }
    if (bad)
        rc = bfs__err(BFS_EVERIFY, "%s: %d problem(s) found", outdir, bad);
cleanup:
    if (d)
        closedir(d);
    if (bytes_checked)
        *bytes_checked = checked;
    XXH3_freeState(st);
    XXH3_freeState(st2);
    free(buf);
    free(text);
    free(mpath);
    json_decref(m);
    return rc;
}
