/*
 * Fuzz target: verify's check of xxh128sums.txt against the manifest
 * (bfs__manifest_check_sums, src/output/manifest_check.c), and the file
 * bfs__manifest_write_sums writes for the same files[] checked again.
 *
 * Input: 1 selector byte + xxh128sums.txt [+ "\n--bfs--\n" + files[] as JSON].
 *   bits 0-2  whose files[]: the manifest of OUTDIR k (fz_outdirs[]), unless the input
 *             gives its own after the separator
 *   bit 3     no xxh128sums.txt at all
 * Properties (abort when broken):
 *   - the count returned is the number of report lines, each a line without control
 *     characters (names escaped);
 *   - it is the number of lines that are not "HASH  NAME\n" (32 lowercase hex digits, two
 *     spaces, a name) of a files[] entry or its compressed copy, as counted here
 *     independently (1 when the file is missing);
 *   - what bfs__manifest_write_sums writes for files[] (its names present as empty
 *     files) checks clean, when every entry it writes has a 32-hex hash and a name
 *     without a line end.
 */
#include "fuzz_common.h"
#include "base/bfs_io.h"
#include "output/manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FZ_SEP "\n--bfs--\n"

static json_t *fz_files[FZ_NOUTDIRS];
static char fz_sdir[512], fz_wdir[512];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    for (int k = 0; k < FZ_NOUTDIRS; k++) {
        const char *mname;
        const char *od = fz_outdir_get(k, &mname);
        bfs_mf *r = NULL;
        if (bfs__mf_open(od, mname, BFS_MF_HEAD_ONLY, NULL, NULL, &r) != 0)
            abort();
        fz_files[k] = json_incref(json_object_get(bfs__mf_head(r), "files"));
        bfs__mf_free(r);
    }
    snprintf(fz_sdir, sizeof fz_sdir, "%s/sums", fz_dir());
    snprintf(fz_wdir, sizeof fz_wdir, "%s/sums-w", fz_dir());
    if (mkdir(fz_sdir, 0755) != 0 && errno != EEXIST)
        abort();
    return 0;
}

static bool fz_hex32(const char *s) /* 32 lowercase hex digits (then anything) */
{
    for (int i = 0; i < 32; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

/* the line l (ll bytes, no line end) names entry e with its hash */
static bool fz_names(const json_t *e, const char *l, size_t ll)
{
    const char *n = json_string_value(json_object_get(e, "name")), *h = bfs__manifest_hash(e);
    return n && h && strlen(n) == ll - 34 && !memcmp(n, l + 34, ll - 34) && strlen(h) == 32 && !strncmp(h, l, 32);
}

/* the bad lines of text, counted here */
static int fz_model(const char *text, size_t len, const json_t *files)
{
    int bad = 0;
    for (size_t pos = 0; pos < len;) {
        const char *l = text + pos, *nl = memchr(l, '\n', len - pos);
        const size_t ll = nl ? (size_t)(nl - l) : len - pos;
        bool ok = nl && ll > 34 && l[32] == ' ' && l[33] == ' ' && fz_hex32(l), found = false;
        for (size_t i = 0; ok && !found && i < json_array_size(files); i++) {
            const json_t *f = json_array_get(files, i);
            found = fz_names(f, l, ll) || fz_names(json_object_get(f, "zst"), l, ll);
        }
        bad += !found;
        pos += ll + 1;
    }
    return bad;
}

static int fz_check(const char *dir, const json_t *files, const char *what)
{
    char *text = NULL;
    size_t len = 0;
    FILE *rep = open_memstream(&text, &len);
    bfs__err_clear();
    const int bad = bfs__manifest_check_sums(dir, files, rep);
    fclose(rep);
    if (bad < 0 || fz_check_report(text, len, what) != (size_t)bad) {
        fprintf(stderr, "fuzz: %s: %d bad lines counted, report:\n%.*s\n", what, bad, (int)len, text);
        abort();
    }
    free(text);
    return bad;
}

/* an entry bfs__manifest_write_sums writes reads back as one good line */
static bool fz_writes_clean(const json_t *e)
{
    const char *n = json_string_value(json_object_get(e, "name")), *h = bfs__manifest_hash(e);
    return !n || !h || (strlen(h) == 32 && fz_hex32(h) && n[0] && !strchr(n, '\n'));
}

static void fz_touch(const char *name)
{
    char p[1024];
    if (!name || !name[0] || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..") || strlen(name) > 200)
        return;
    snprintf(p, sizeof p, "%s/%s", fz_wdir, name);
    const int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0)
        close(fd);
}

static void fz_roundtrip(const json_t *files)
{
    bool clean = true;
    fz_rmrf(fz_wdir);
    if (mkdir(fz_wdir, 0755) != 0)
        abort();
    for (size_t i = 0; i < json_array_size(files) && i < 256; i++) {
        const json_t *f = json_array_get(files, i), *z = json_object_get(f, "zst");
        fz_touch(json_string_value(json_object_get(f, "name")));
        fz_touch(json_string_value(json_object_get(z, "name")));
        clean = clean && fz_writes_clean(f) && fz_writes_clean(z);
    }
    if (json_array_size(files) > 256)
        return;
    const int dirfd = open(fz_wdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        abort();
    bfs__err_clear();
    const int rc = bfs__manifest_write_sums(dirfd, fz_wdir, files);
    close(dirfd);
    if (rc != 0) {
        fz_check_error(rc, "bfs__manifest_write_sums");
        return;
    }
    const int bad = fz_check(fz_wdir, files, "the sums written, checked");
    if (clean && bad != 0) {
        fprintf(stderr, "fuzz: the sums file written for files[] has %d bad lines\n", bad);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (!fz_sdir[0]) {
        int argc = 0;
        char **argv = NULL;
        LLVMFuzzerInitialize(&argc, &argv);
    }
    const uint8_t sel = data[0];
    const char *text = (const char *)data + 1, *end = (const char *)data + size;
    const char *s = memmem(text, (size_t)(end - text), FZ_SEP, strlen(FZ_SEP));
    const size_t tl = s ? (size_t)(s - text) : (size_t)(end - text);
    json_t *own = s ? json_loadb(s + strlen(FZ_SEP), (size_t)(end - s) - strlen(FZ_SEP), 0, NULL) : NULL;
    const json_t *files = s ? own : fz_files[sel & 7];
    char p[600];
    snprintf(p, sizeof p, "%s/%s", fz_sdir, BFS_SUMS_NAME);
    unlink(p);
    if (!(sel & 8))
        fz_write(p, text, tl);
    const int bad = fz_check(fz_sdir, files, "xxh128sums.txt");
    const int want = (sel & 8) ? 1 : fz_model(text, tl, files);
    if (bad != want) {
        fprintf(stderr, "fuzz: %d bad lines counted, %d here\n", bad, want);
        abort();
    }
    fz_roundtrip(files);
    json_decref(own);
    return 0;
}
