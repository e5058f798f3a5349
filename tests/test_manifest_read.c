/*
 * The manifest is read with memory that does not grow with its tensors (manifest.h:
 * bfs__mf_open): a strict scanner finds tensors[]'s elements, jansson parses
 * each alone and the head without them. Malformed JSON is a one-line error naming the
 * file and the byte (missing and trailing commas, unterminated strings, truncation at
 * every byte, an element that is not an object, duplicate keys, bad escapes, control
 * characters, nesting too deep, data after the object); escapes and nested arrays read as
 * jansson reads them; an empty tensors array is fine. On the committed fixtures the head
 * and every tensor equal jansson's whole tree, the seal verdict agrees, and a rewrite that
 * copies tensors[] through is byte for byte what the whole tree dumps, and a rewrite of any
 * head the reader accepts is read back and sealed (the seal put last). Narrowing a bad file
 * down reports its tensors in manifest order from the compact index (hashes that are not
 * hex reported as written, shards without one skipped). A manifest of 1e5
 * tensors is read in a child whose peak RSS grows by less than 16 MiB.
 */
#include "testutil.h"
#include "bfs_internal.h"
#include "bfshard.h"
#include "output/manifest.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ASan's quarantine keeps freed memory resident (256 MiB): the bound is not measurable there */
#if defined(__SANITIZE_ADDRESS__)
#define TU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TU_ASAN 1
#endif
#endif
#ifndef TU_ASAN
#define TU_ASAN 0
#endif

#define ZSEAL "\"manifest_xxh3_128\": \"00000000000000000000000000000000\""

static char *g_dir;

static int setup(void **s)
{
    (void)s;
    g_dir = tu_tmpdir("mfread");
    return g_dir ? 0 : -1;
}

static int teardown(void **s)
{
    (void)s;
    tu_rmrf(g_dir);
    free(g_dir);
    return 0;
}

static void put(const char *name, const char *text, size_t n)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    assert_int_equal(tu_write_file(p, text, n), 0);
}

/* open `text` as a manifest: the rc; on BFS_EINPUT the message names the file and the byte */
static int open_text(const char *text, bfs_mf **out, long want_byte)
{
    put("m.json", text, strlen(text));
    bfs__err_clear();
    bfs_mf *r = NULL;
    const int rc = bfs__mf_open(g_dir, "m.json", 0, NULL, NULL, &r);
    if (rc == BFS_EINPUT) {
        const char *e = bfs_last_error();
        assert_non_null(strstr(e, "m.json"));
        assert_null(strchr(e, '\n'));
        if (want_byte >= 0) {
            char b[64];
            snprintf(b, sizeof b, "byte %ld:", want_byte);
            if (!strstr(e, b))
                fail_msg("wanted \"%s\" in: %s", b, e);
        }
    }
    if (out)
        *out = r;
    else
        bfs__mf_free(r);
    return rc;
}

static void bad(const char *text, long byte, const char *what)
{
    assert_int_equal(open_text(text, NULL, byte), BFS_EINPUT);
    if (what && !strstr(bfs_last_error(), what))
        fail_msg("wanted \"%s\" in: %s", what, bfs_last_error());
}

static void malformed_structure(void **s)
{
    (void)s;
    /* missing comma between two tensors: at the second '{' */
    const char *t1 = "{\"files\": [], \"tensors\": [{\"name\": \"a\"} {\"name\": \"b\"}], " ZSEAL "}";
    bad(t1, (long)(strstr(t1, "} {") - t1) + 2, "expected ',' or ']'");
    /* missing comma between head members */
    const char *t2 = "{\"files\": [] \"tensors\": []}";
    bad(t2, (long)(strstr(t2, "\"tensors") - t2), "expected ',' or '}'");
    /* trailing commas: in tensors[], in an element, in the head */
    const char *t3 = "{\"files\": [], \"tensors\": [{\"name\": \"a\"},], " ZSEAL "}";
    bad(t3, (long)(strstr(t3, ",]") - t3) + 1, "expected a value");
    const char *t5 = "{\"files\": [], \"tensors\": [{\"name\": \"a\",}]}";
    bad(t5, (long)(strstr(t5, ",}") - t5) + 1, "expected a key after ','");
    bad("{\"files\": [], \"tensors\": [],}", 28, "expected a key after ','");
    /* missing colon, a lone value, mismatched brackets */
    bad("{\"files\" [], \"tensors\": []}", 9, "expected ':'");
    bad("{\"files\": [}, \"tensors\": []}", 11, "'}' closes no object");
    bad("{\"files\": [], \"tensors\": [{\"a\": 1]]}", 33, "']' closes no array");
    /* unterminated string, at the end of the file */
    const char *t4 = "{\"files\": [], \"tensors\": [{\"name\": \"abc";
    bad(t4, (long)strlen(t4), "ends inside");
    /* bad escapes and raw control characters in strings */
    bad("{\"files\": [], \"tensors\": [{\"name\": \"a\\x\"}]}", 38, "bad escape");
    bad("{\"files\": [], \"tensors\": [{\"name\": \"a\\u12g4\"}]}", 41, "\\u escape");
    bad("{\"files\": [], \"tensors\": [{\"name\": \"a\tb\"}]}", 37, "control character");
    /* not an object; data after it; empty file; nesting too deep */
    bad("[1, 2]", 0, "not a JSON object");
    bad("{\"files\": [], \"tensors\": []} x", 29, "more after");
    bad("", 0, "ends inside");
    char deep[400] = "{\"files\": [], \"tensors\": [{\"x\": ";
    const long d0 = (long)strlen(deep);
    for (int i = 0; i < 80; i++)
        strcat(deep, "[");
    bad(deep, d0 + 64 - 3, "too deep"); /* 3 deep already: the 62nd '[' is the 65th level */
    /* scalars are jansson's to check (inside an element: its byte) */
    bad("{\"files\": [], \"tensors\": [{\"name\": tru}]}", -1, "tensors[0]");
    bad("{\"files\": [], \"tensors\": [{\"n\": 01}], " ZSEAL "}", -1, "tensors[0]");
    bad("{\"files\": nul, \"tensors\": []}", -1, NULL);
}

static void elements_must_be_objects(void **s)
{
    (void)s;
    bad("{\"files\": [], \"tensors\": [1]}", 26, "tensors[0] is not an object");
    bad("{\"files\": [], \"tensors\": [{\"name\": \"a\"}, \"x\"]}", 41, "tensors[1] is not an object");
    bad("{\"files\": [], \"tensors\": [{}, {}, []]}", 34, "tensors[2] is not an object");
    bad("{\"files\": [], \"tensors\": {}}", 25, "\"tensors\" is not an array");
    bad("{\"files\": [], \"tensors\": null}", 25, "\"tensors\" is not an array");
}

static void duplicate_keys(void **s)
{
    (void)s;
    /* in an element: jansson's JSON_REJECT_DUPLICATES, at that element */
    bad("{\"files\": [], \"tensors\": [{\"name\": \"a\"}, {\"name\": \"a\", \"name\": \"b\"}]}", -1, "tensors[1]");
    /* "tensors" twice; another head key twice */
    bad("{\"tensors\": [], \"files\": [], \"tensors\": []}", 37, "a second \"tensors\"");
    bad("{\"files\": [], \"tensors\": [], \"files\": []}", -1, "duplicate");
}

static void escapes_and_nesting(void **s)
{
    (void)s;
    /* names with escaped quotes and backslashes (and one that looks like the seal key), nested arrays */
    const char *t = "{\"files\": [{\"name\": \"x\\\"]}\"}], \"tensors\": [\n"
                    " {\"name\": \"q\\\"uo\\\\te\\\\\\\"x\", \"shards\": [[1, [2, [3]]], {\"x\": [[], [{}]]}]},\n"
                    " {\"name\": \"\\\"manifest_xxh3_128\\\": \\\"\", \"s\": \"]}\\\\\"},\n"
                    " {\"name\": \"\\u00e9\\/\\b\\f\\n\\r\\t\\uD83D\\uDE00\"}\n"
                    "], \"dropped\": [\"a\"], " ZSEAL "}";
    bfs_mf *r = NULL;
    assert_int_equal(open_text(t, &r, -1), 0);
    json_t *whole = json_loads(t, JSON_REJECT_DUPLICATES, NULL), *wt = json_object_get(whole, "tensors");
    assert_non_null(wt);
    assert_int_equal(bfs__mf_ntensors(r), 3);
    assert_true(bfs__mf_has_tensors(r));
    json_t *e;
    size_t i = 0;
    int got;
    while ((got = bfs__mf_next(r, &e)) > 0) {
        assert_true(json_equal(e, json_array_get(wt, i)));
        json_decref(e);
        i++;
    }
    assert_int_equal(got, 0);
    assert_int_equal(i, 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(wt, 0), "name")), "q\"uo\\te\\\"x");
    /* the head: all but tensors, which is the placeholder */
    json_t *head = json_deep_copy(bfs__mf_head(r));
    assert_true(json_is_string(json_object_get(head, "tensors")));
    json_object_del(head, "tensors");
    json_object_del(whole, "tensors");
    assert_true(json_equal(head, whole));
    json_decref(head);
    json_decref(whole);
    /* again from the start */
    assert_int_equal(bfs__mf_rewind(r), 0);
    assert_int_equal(bfs__mf_next(r, &e), 1);
    assert_string_equal(json_string_value(json_object_get(e, "name")), "q\"uo\\te\\\"x");
    json_decref(e);
    bfs__mf_free(r);
}

static void empty_tensors(void **s)
{
    (void)s;
    bfs_mf *r = NULL;
    json_t *e = (json_t *)1;
    assert_int_equal(open_text("{\"files\": [], \"tensors\": [], " ZSEAL "}", &r, -1), 0);
    assert_int_equal(bfs__mf_ntensors(r), 0);
    assert_int_equal(bfs__mf_next(r, &e), 0);
    assert_null(e);
    assert_int_equal(bfs__mf_next(r, &e), 0);
    bfs__mf_free(r);
    assert_int_equal(open_text("{\"files\": [], \"tensors\": [ \n ], " ZSEAL "}", &r, -1), 0);
    assert_int_equal(bfs__mf_ntensors(r), 0);
    bfs__mf_free(r);
    /* no tensors at all: read, and said so */
    assert_int_equal(open_text("{\"files\": []}", &r, -1), 0);
    assert_false(bfs__mf_has_tensors(r));
    assert_int_equal(bfs__mf_next(r, &e), BFS_EINPUT);
    bfs__mf_free(r);
}

/* ---- compress's rewrite of a head read from a file (found by fuzz_manifest) ------------------ */
/* the rewrite of `text`: read back, sealed, the same tensors */
static void rewrite_reads_back(const char *text)
{
    bfs_mf *r = NULL, *c = NULL;
    assert_int_equal(open_text(text, &r, -1), 0);
    bfs__err_clear();
    const int rc = bfs__mf_write_copy(-1, g_dir, "copy.json", bfs__mf_head(r), r);
    if (rc != 0)
        fail_msg("rewrite of %s: %s", text, bfs_last_error());
    assert_int_equal(bfs__mf_open(g_dir, "copy.json", 0, NULL, NULL, &c), 0);
    assert_int_equal(bfs__mf_check_seal(c, NULL), 0);
    assert_int_equal(bfs__mf_ntensors(c), bfs__mf_ntensors(r));
    /* the seal is the last member, the only one of its name at the top */
    const char *k, *last = "";
    json_t *v;
    json_object_foreach(bfs__mf_head(c), k, v)
        last = k;
    assert_string_equal(last, "manifest_xxh3_128");
    bfs__mf_free(c);
    bfs__mf_free(r);
}

static void rewrite_any_seal(void **s)
{
    (void)s;
    /* no seal: was BFS_EINTERNAL ("manifest head without ... its seal"), compress exit 1 */
    rewrite_reads_back("{\"files\": [], \"tensors\": [{\"name\": \"t\"}]}");
    /* the seal before "tensors": the same */
    rewrite_reads_back("{" ZSEAL ", \"files\": [], \"tensors\": [{\"name\": \"t\"}]}");
    /* a seal of 31 characters and an escaped quote: 32 '0's were written over the backslash,
     * and compress left a manifest no command could read */
    rewrite_reads_back("{\"files\": [], \"tensors\": [], \"manifest_xxh3_128\": \"0000000000000000000000000000000\\\"\"}");
    /* a shorter one, and one that is not a string */
    rewrite_reads_back("{\"files\": [], \"tensors\": [], \"manifest_xxh3_128\": \"abc\"}");
    rewrite_reads_back("{\"files\": [], \"tensors\": [], \"manifest_xxh3_128\": [1]}");
    /* a nested "manifest_xxh3_128" after the seal: it was sealed instead, and verify found the
     * rewritten manifest's seal wrong */
    rewrite_reads_back("{\"files\": [], \"tensors\": [], " ZSEAL ", \"source\": {" ZSEAL "}}");
}

/* ---- narrowing a bad file down: the index (40 B per shard, grouped by file) --------------- */
static int fake_hash(void *user, uint64_t off, uint64_t nb, char hex[33])
{
    (void)user;
    if (off == 77)
        return bfs__err(BFS_EIO, "cannot read at 77");
    snprintf(hex, 33, "%016llx%016llx", (unsigned long long)off, (unsigned long long)nb);
    return 0;
}

static void narrow_index(void **s)
{
    (void)s;
    /* hashes are "%016x%016x" of (offset, nbytes) where they match */
    const char *t =
        "{\"files\": [{\"name\": \"a\"}, {\"name\": \"b\"}, {\"name\": \"c\"}], \"tensors\": [\n"
        " {\"name\": \"t0\", \"shards\": [{\"file\": \"b\", \"offset\": 16, \"nbytes\": 4, \"xxh3_128\": \"00000000000000100000000000000004\"},"
        "                      {\"file\": \"a\", \"offset\": 40, \"nbytes\": 8, \"xxh3_128\": \"ffffffffffffffffffffffffffffffff\"}]},\n"
        " {\"name\": \"t\\\"1\", \"shards\": [{\"file\": \"a\", \"offset\": 8, \"nbytes\": 8, \"xxh3_128\": \"NOT A HASH\"},"
        "                      {\"file\": \"zzz\", \"offset\": 0, \"nbytes\": 1, \"xxh3_128\": \"x\"},"
        "                      {\"file\": \"a\", \"offset\": 4, \"nbytes\": 2}]},\n"
        " {\"name\": \"t2\", \"shards\": [{\"file\": \"a\", \"offset\": 77, \"nbytes\": 1, \"xxh3_128\": \"00000000000000000000000000000000\"},"
        "                      {\"file\": \"a\", \"offset\": 60, \"nbytes\": 500, \"xxh3_128\": \"00000000000000000000000000000000\"},"
        "                      {\"file\": \"b\", \"offset\": 24, \"nbytes\": 4, \"xxh3_128\": \"00000000000000180000000000000004\"}]}\n"
        "], " ZSEAL "}";
    bfs_mf *r = NULL;
    assert_int_equal(open_text(t, &r, -1), 0);
    bfs_shard_index *ix = NULL;
    assert_int_equal(bfs__manifest_shard_index(r, json_object_get(bfs__mf_head(r), "files"), &ix), 0);
    char *buf = NULL;
    size_t blen = 0;
    FILE *rep = open_memstream(&buf, &blen);
    uint64_t first = 0;
    /* a: t0 (bad hash), t"1 (not a hash: reported as it is), its shard without a hash skipped,
     * t2's unreadable shard reported as such, the one past the end skipped; in manifest order */
    assert_int_equal(bfs__manifest_narrow(ix, "a", 200, "P/a", rep, fake_hash, NULL, true, &first), 2);
    fflush(rep);
    assert_string_equal(buf, "P/a: BAD tensor \"t0\" bytes [40, 48) (hash 00000000000000280000000000000008, manifest ffffffffffffffffffffffffffffffff)\n"
                             "P/a: BAD tensor \"t\\\"1\" bytes [8, 16) (hash 00000000000000080000000000000008, manifest NOT A HASH)\n"
                             "P/a: BAD tensor \"t2\" bytes [77, 78): cannot read at 77\n");
    assert_int_equal(first, 4);
    /* b: all match; c: no shards; an unknown name: nothing */
    assert_int_equal(bfs__manifest_narrow(ix, "b", 64, "P/b", rep, fake_hash, NULL, true, &first), 0);
    assert_int_equal(first, 16);
    assert_int_equal(bfs__manifest_narrow(ix, "c", 64, "P/c", rep, fake_hash, NULL, true, &first), 0);
    assert_int_equal(first, 64);
    assert_int_equal(bfs__manifest_narrow(ix, "zzz", 64, "P/z", rep, fake_hash, NULL, true, &first), 0);
    fclose(rep);
    free(buf);
    bfs__manifest_shard_index_free(ix);
    bfs__mf_free(r);
}

/* ---- the committed fixtures: the streamed reading equals the whole tree ------------------- */
static void check_outdir(const char *out, const char *name)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", out, name);
    size_t len = 0;
    char *text = (char *)tu_read_file(p, &len);
    assert_non_null(text);
    json_t *whole = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL), *wt = json_object_get(whole, "tensors");
    assert_true(json_is_array(wt));
    bfs_mf *r = NULL;
    assert_int_equal(bfs__mf_open(out, name, 0, NULL, NULL, &r), 0);
    assert_int_equal(bfs__mf_check_seal(r, NULL), 0);
    assert_int_equal(bfs__mf_ntensors(r), json_array_size(wt));
    json_t *e;
    size_t i = 0;
    int got;
    while ((got = bfs__mf_next(r, &e)) > 0) {
        assert_true(json_equal(e, json_array_get(wt, i++)));
        json_decref(e);
    }
    assert_int_equal(got, 0);
    assert_int_equal(i, json_array_size(wt));
    /* a rewrite that copies tensors[] through: the bytes of the whole tree, dumped and sealed */
    int dfd = open(out, O_RDONLY | O_DIRECTORY);
    assert_true(dfd >= 0);
    assert_int_equal(bfs__mf_write_copy(dfd, out, "copy.json", bfs__mf_head(r), r), 0);
    close(dfd);
    snprintf(p, sizeof p, "%s/copy.json", out);
    size_t clen = 0;
    char *copy = (char *)tu_read_file(p, &clen);
    assert_non_null(copy);
    assert_int_equal(clen, len);
    assert_memory_equal(copy, text, len);
    free(copy);
    unlink(p);
    /* one changed byte inside tensors[]: the seal says so */
    char *q = strstr(text, "\"sources\"");
    assert_non_null(q);
    q[1] = 'S';
    snprintf(p, sizeof p, "%s/edited.json", out);
    assert_int_equal(tu_write_file(p, text, len), 0);
    bfs__mf_free(r);
    assert_int_equal(bfs__mf_open(out, "edited.json", 0, NULL, NULL, &r), 0);
    assert_int_equal(bfs__mf_check_seal(r, NULL), 1);
    unlink(p);
    /* truncated anywhere: never read as a manifest */
    for (size_t cut = 0; cut < len; cut += len / 97 + 1) {
        assert_int_equal(tu_write_file(p, text, cut), 0);
        bfs_mf *t = NULL;
        assert_int_equal(bfs__mf_open(out, "edited.json", 0, NULL, NULL, &t), BFS_EINPUT);
        bfs__mf_free(t);
    }
    unlink(p);
    bfs__mf_free(r);
    json_decref(whole);
    free(text);
}

static void fixtures_equal_whole_tree(void **s)
{
    (void)s;
    static const char *fx[] = {"mxfp4-tiny", "bnb-nf4", "bnb-fp4"};
    for (size_t k = 0; k < sizeof fx / sizeof fx[0]; k++)
        for (int w = 1; w <= 3; w += 2) {
            char out[4096];
            snprintf(out, sizeof out, "%s/%s-w%d", g_dir, fx[k], w);
            assert_int_equal(tu_sh("'%s' convert fixtures/%s '%s' --world-size %d --device cpu --quiet", tu_bfshard(),
                                   fx[k], out, w), 0);
            check_outdir(out, "bfshard.manifest.json");
        }
    /* a compressed outdir (files[].zst), and a part's manifest */
    char out[4096];
    snprintf(out, sizeof out, "%s/mxfp4-tiny-w3", g_dir);
    assert_int_equal(tu_sh("'%s' compress '%s' --quiet", tu_bfshard(), out), 0);
    check_outdir(out, "bfshard.manifest.json");
    snprintf(out, sizeof out, "%s/part", g_dir);
    assert_int_equal(tu_sh("'%s' convert fixtures/mxfp4-tiny '%s' --world-size 4 --ranks 1-2 --device cpu --quiet",
                           tu_bfshard(), out), 0);
    check_outdir(out, "bfshard.part-1-2.json");
}

/* ---- memory does not grow with the tensors ------------------------------------------------ */
static long status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key)))
            v = atol(line + strlen(key) + 1);
    if (f)
        fclose(f);
    return v;
}

static void reader_memory_bounded(void **s)
{
    (void)s;
    enum { N = 100000 };
    char p[4096];
    snprintf(p, sizeof p, "%s/big.json", g_dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "{\n \"tool\": \"bfshard\",\n \"files\": [],\n \"tensors\": [\n");
    for (int i = 0; i < N; i++)
        fprintf(f, "  {\n   \"name\": \"model.layers.%d.mlp.experts.gate_up_proj\",\n   \"dtype\": \"BF16\",\n"
                   "   \"shape\": [%d, 2880],\n   \"shards\": [\n    {\n     \"file\": \"shard-00001.safetensors\",\n"
                   "     \"offset\": %d,\n     \"nbytes\": 5760,\n     \"xxh3_128\": \"0123456789abcdef0123456789abcdef\"\n"
                   "    }\n   ]\n  }%s\n",
                i, i % 97 + 1, i * 5760, i + 1 < N ? "," : "");
    fprintf(f, " ],\n " ZSEAL "\n}\n");
    assert_int_equal(fclose(f), 0);
    fflush(NULL);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* the peak from here on (clear_refs 5 resets VmHWM to the current RSS) */
        FILE *c = fopen("/proc/self/clear_refs", "w");
        if (!c || fputs("5", c) < 0 || fclose(c) != 0)
            _exit(3);
        const long rss0 = status_kb("VmHWM:");
        bfs_mf *r = NULL;
        size_t n = 0;
        json_t *e;
        if (bfs__mf_open(g_dir, "big.json", 0, NULL, NULL, &r) != 0 || bfs__mf_ntensors(r) != N)
            _exit(4);
        while (bfs__mf_next(r, &e) > 0) {
            n++;
            json_decref(e);
        }
        const long grew = status_kb("VmHWM:") - rss0;
        bfs__mf_free(r);
        fprintf(stderr, "reader: %d tensors, peak RSS grew %ld KiB\n", N, grew);
        _exit(n == N && (grew < 16 * 1024 || TU_ASAN) ? 0 : 5);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 3)
        skip(); /* no clear_refs here */
    assert_int_equal(WEXITSTATUS(st), 0);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_true(sb.st_size > 25 * 1000 * 1000); /* a whole tree of it would be far more than 16 MiB */
    unlink(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(malformed_structure),      cmocka_unit_test(elements_must_be_objects),
        cmocka_unit_test(duplicate_keys),           cmocka_unit_test(escapes_and_nesting),
        cmocka_unit_test(empty_tensors),            cmocka_unit_test(narrow_index),
        cmocka_unit_test(rewrite_any_seal),
        cmocka_unit_test(fixtures_equal_whole_tree),
        cmocka_unit_test(reader_memory_bounded),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
