/*
 * The manifest of a conversion is streamed: tensors[] goes out one tensor at
 * a time, never a tree of every tensor in memory. Its bytes must stay exactly jansson's
 * JSON_INDENT(1) | JSON_PRESERVE_ORDER of the head with each tensors[] element on one line
 * (JSON_INDENT(0), manifest v2: docs/MANIFEST.md; the format every other writer of a
 * manifest, merge and compress, keeps), for many tensors, with names
 * that need escaping (quotes, backslashes, control characters) or are not ASCII, zero-
 * element and scalar tensors, tensors with fewer rows than ranks, at W = 1 and W = 3; the
 * seal holds and verify passes. A write that fails half way through the manifest (a full
 * disk: RLIMIT_FSIZE) leaves no manifest and no temporary, and a rerun finishes.
 */
#include "testutil.h"
#include "bfshard.h"

#include <stdatomic.h>

#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NT 3000

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* DIR/model.safetensors: nt BF16 tensors, rows 0..6 of 2 columns, a scalar, odd names */
static void write_input_n(const char *dir, size_t nt)
{
    static const char *odd[] = {"q\"uote\"", "back\\slash\\", "ctl\x01\x02\t\n\r\x1f\x7f", "caf\xc3\xa9.\xe6\x97\xa5\xe6\x9c\xac",
                                "emoji\xf0\x9f\x98\x80", "slash/and space", "\\u0041 not an escape", "manifest_xxh3_128",
                                "tensors", "\": \"tensors\": \""};
    const size_t nodd = sizeof odd / sizeof odd[0];
    char **names = calloc(nt, sizeof *names);
    assert_non_null(names);
    for (size_t i = 0; i < nt; i++) {
        char b[128];
        if (i < nodd)
            snprintf(b, sizeof b, "%s", odd[i]);
        else
            snprintf(b, sizeof b, "model.layers.%zu.w\"%zu\\", i / 7, i);
        names[i] = strdup(b);
    }
    qsort(names, nt, sizeof *names, cmp_str); /* data in the header's (sorted) order */
    json_t *h = json_object();
    size_t off = 0;
    for (size_t i = 0; i < nt; i++) {
        const size_t rows = i % 7; /* 0: a zero-element tensor */
        json_t *shape = i == 5 ? json_array() : json_pack("[I, i]", (json_int_t)rows, 2);
        const size_t nb = i == 5 ? 2 : rows * 4;
        json_object_set_new(h, names[i], json_pack("{s:s, s:o, s:[I, I]}", "dtype", "BF16", "shape", shape,
                                                   "data_offsets", (json_int_t)off, (json_int_t)(off + nb)));
        off += nb;
    }
    char *text = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    assert_non_null(text);
    const size_t n = strlen(text), hl = (n + 7) / 8 * 8;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < 8; i++)
        fputc((int)(((uint64_t)hl >> (8 * i)) & 0xff), f);
    assert_int_equal(fwrite(text, 1, n, f), n);
    for (size_t i = n; i < hl; i++)
        fputc(' ', f);
    for (size_t i = 0; i < off; i++)
        fputc((int)((i * 131 + 7) & 0x3f), f);
    assert_int_equal(fclose(f), 0);
    free(text);
    json_decref(h);
    for (size_t i = 0; i < nt; i++)
        free(names[i]);
    free(names);
}

static void write_input(const char *dir) { write_input_n(dir, NT); }

/* the file is jansson's dump of itself, plus '\n'; returns its tensors[] length */
static size_t check_jansson_format(const char *path)
{
    size_t len = 0;
    char *text = (char *)tu_read_file(path, &len);
    assert_non_null(text);
    json_error_t e;
    json_t *m = json_loadb(text, len, JSON_REJECT_DUPLICATES, &e);
    if (!m)
        fail_msg("%s: not JSON: %s (line %d)", path, e.text, e.line);
    /* the head dumped whole, the array in its placeholder's place, one line a tensor */
    json_t *ts = json_incref(json_object_get(m, "tensors")), *h = json_copy(m);
    assert_int_equal(json_object_set_new(h, "tensors", json_string("@TENSORS@")), 0);
    char *head = json_dumps(h, JSON_INDENT(1) | JSON_PRESERVE_ORDER), *hole = strstr(head, "\"@TENSORS@\"");
    assert_non_null(hole);
    size_t cap = strlen(head) + 16, k = 0;
    char *again = malloc(cap);
    assert_non_null(again);
#define APPEND(str)                                                                                                    \
    do {                                                                                                               \
        const size_t l_ = strlen(str);                                                                                 \
        if (k + l_ + 1 > cap) {                                                                                        \
            cap = (k + l_ + 1) * 2;                                                                                    \
            again = realloc(again, cap);                                                                               \
            assert_non_null(again);                                                                                    \
        }                                                                                                              \
        memcpy(again + k, str, l_ + 1);                                                                                \
        k += l_;                                                                                                       \
    } while (0)
    *hole = '\0';
    APPEND(head);
    APPEND(json_array_size(ts) ? "[\n  " : "[]");
    for (size_t i = 0; i < json_array_size(ts); i++) {
        char *one = json_dumps(json_array_get(ts, i), JSON_INDENT(0) | JSON_PRESERVE_ORDER);
        assert_non_null(one);
        assert_null(strchr(one, '\n'));
        if (i)
            APPEND(",\n  ");
        APPEND(one);
        free(one);
    }
    if (json_array_size(ts))
        APPEND("\n ]");
    APPEND(hole + strlen("\"@TENSORS@\""));
#undef APPEND
    free(head);
    json_decref(h);
    json_decref(ts);
    const size_t n = strlen(again);
    assert_int_equal(len, n + 1);
    assert_int_equal(text[n], '\n');
    if (memcmp(text, again, n) != 0) {
        size_t i = 0;
        while (text[i] == again[i])
            i++;
        fail_msg("%s: differs from jansson's dump at byte %zu", path, i);
    }
    const size_t nt = json_array_size(json_object_get(m, "tensors"));
    free(again);
    free(text);
    json_decref(m);
    return nt;
}

static void many_tensors_exact_format(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("mfs");
    char in[4096], out[4096];
    snprintf(in, sizeof in, "%s/in", tmp);
    assert_int_equal(mkdir(in, 0755), 0);
    write_input(in);
    const int ws[] = {1, 3};
    for (size_t k = 0; k < 2; k++) {
        snprintf(out, sizeof out, "%s/out%d", tmp, ws[k]);
        assert_int_equal(tu_sh("%s convert '%s' '%s' -w %d --quiet", tu_bfshard(), in, out, ws[k]), 0);
        snprintf(out, sizeof out, "%s/out%d/bfshard.manifest.json", tmp, ws[k]);
        assert_int_equal(check_jansson_format(out), NT);
        /* the odd names are there, escaped as jansson escapes them */
        assert_int_equal(tu_sh("grep -qF '\"name\": \"ctl\\u0001\\u0002\\t\\n\\r\\u001F\x7f\"' '%s'", out), 0);
        assert_int_equal(tu_sh("grep -qF '\"name\": \"q\\\"uote\\\"\"' '%s'", out), 0);
        assert_int_equal(tu_sh("grep -qF '\"name\": \"caf\xc3\xa9.\xe6\x97\xa5\xe6\x9c\xac\"' '%s'", out), 0);
        snprintf(out, sizeof out, "%s/out%d", tmp, ws[k]);
        assert_int_equal(tu_sh("%s verify '%s' --quiet", tu_bfshard(), out), 0);
    }
    /* a part's manifest is streamed the same way */
    snprintf(out, sizeof out, "%s/parts", tmp);
    assert_int_equal(tu_sh("%s convert '%s' '%s' -w 3 --ranks 0,2 --quiet", tu_bfshard(), in, out), 0);
    assert_int_equal(tu_sh("%s convert '%s' '%s' -w 3 --ranks 1 --quiet", tu_bfshard(), in, out), 0);
    snprintf(out, sizeof out, "%s/parts/bfshard.part-0,2.json", tmp);
    /* its ranks' share of tensors[] (docs/MANIFEST.md): rank 1 of 3 owns [NT/3, 2*NT/3) */
    assert_int_equal(check_jansson_format(out), NT - (2 * NT / 3 - NT / 3));
    snprintf(out, sizeof out, "%s/parts", tmp);
    assert_int_equal(tu_sh("%s merge '%s' --quiet && %s verify '%s' --quiet", tu_bfshard(), out, tu_bfshard(), out), 0);
    /* merge's manifest (a whole tree, dumped at once) is byte for byte the streamed one,
     * but for the build's revision and the seal */
    assert_int_equal(tu_sh("cd '%s' && cmp -s parts/bfshard.manifest.json out3/bfshard.manifest.json", tmp), 0);
    tu_rmrf(tmp);
    free(tmp);
}

static void failed_write_leaves_no_manifest(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("mff");
    char in[4096], out[4096];
    snprintf(in, sizeof in, "%s/in", tmp);
    assert_int_equal(mkdir(in, 0755), 0);
    write_input_n(in, 3 * NT); /* v2's manifest is a line a tensor: more of them to outgrow the weights */
    snprintf(out, sizeof out, "%s/out", tmp);
    /* the weights file (~1.5 MB) fits, the manifest (~1.7 MB) does not: the limit halfway */
    assert_int_equal(tu_sh("%s convert '%s' '%s/big' --quiet && test $(stat -c %%s '%s/big/bfshard.manifest.json') -gt "
                           "$(( $(stat -c %%s '%s'/big/shard-*.safetensors) + 100000 ))",
                           tu_bfshard(), in, tmp, tmp, tmp), 0);
    assert_int_equal(tu_sh("L=$(( ($(stat -c %%s '%s/big/bfshard.manifest.json') + $(stat -c %%s '%s'/big/shard-*.safetensors)) "
                           "/ 2048 )); bash -c \"ulimit -f $L; exec %s convert '%s' '%s' --quiet\" 2>'%s/err'",
                           tmp, tmp, tu_bfshard(), in, out, tmp), 4);
    assert_int_equal(tu_sh("grep -q 'bfshard.manifest.json' '%s/err'", tmp), 0);
    assert_int_equal(tu_sh("test -e '%s/bfshard.manifest.json'", out), 1);
    assert_int_equal(tu_sh("ls -A '%s' | grep -q partial", out), 1);
    /* the rerun (resume) finishes and verifies */
    assert_int_equal(tu_sh("%s convert '%s' '%s' --quiet && %s verify '%s' --quiet", tu_bfshard(), in, out,
                           tu_bfshard(), out), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* Every jansson allocation of a conversion failing in turn (a sample of 150; all of them
 * with MF_OOM_ALL=1, a few minutes): the run fails (no manifest, no temporary) or its
 * manifest is, byte for byte, the one of a run without failures. Found: unchecked keys
 * of the head ("revision" dropped) and of entries ("rank"), and json_dumps() itself
 * (a dropped '"', bfs__json_text). */
static _Atomic long jn_left = -1; /* the allocation that fails: jn_left reaches 0 */
static void *jn_malloc(size_t n) { return atomic_fetch_sub(&jn_left, 1) == 0 ? NULL : malloc(n); }

static void jansson_failures_never_short(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("mfo");
    char in[4096], out[4096], mf[4096];
    snprintf(in, sizeof in, "%s/in", tmp);
    assert_int_equal(mkdir(in, 0755), 0);
    write_input_n(in, 40);
    bfs_convert_opts o;
    bfs_convert_opts_init(&o);
    o.world_size = 3;
    o.device = "cpu";
    o.threads = 1;
    snprintf(out, sizeof out, "%s/ref", tmp);
    json_set_alloc_funcs(jn_malloc, free);
    jn_left = LONG_MAX;
    assert_int_equal(bfs_convert(in, out, &o, NULL), 0);
    const long total = LONG_MAX - jn_left;
    jn_left = -1;
    snprintf(mf, sizeof mf, "%s/bfshard.manifest.json", out);
    size_t rlen = 0;
    uint8_t *ref = tu_read_file(mf, &rlen);
    assert_non_null(ref);
    assert_true(total > 100);
    int failed = 0, died = 0;
    for (long k = 0; k < total; k += getenv("MF_OOM_ALL") ? 1 : 1 + total / 150) {
        snprintf(out, sizeof out, "%s/o", tmp);
        tu_rmrf(out);
        /* in a child: jansson 2.14's parser itself may abort on an allocation failure
         * (load.c lex_scan_string: assert(0)) -- a crash, never a short manifest */
        const pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            jn_left = k;
            const int rc = bfs_convert(in, out, &o, NULL);
            _exit(rc < 0 ? -rc : rc);
        }
        int st = 0;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        snprintf(mf, sizeof mf, "%s/o/bfshard.manifest.json", tmp);
        size_t len = 0;
        uint8_t *got = tu_read_file(mf, &len);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            assert_non_null(got);
            if (len != rlen || memcmp(got, ref, len) != 0)
                fail_msg("allocation %ld of %ld failed: exit 0 with another manifest", k, total);
        } else {
            failed++;
            died += !WIFEXITED(st);
            if (got)
                fail_msg("allocation %ld of %ld failed: status %#x, and a manifest", k, total, st);
            if (WIFEXITED(st))
                assert_int_equal(tu_sh("ls -A '%s' 2>/dev/null | grep -q partial", out), 1);
        }
        free(got);
    }
    if (died)
        fprintf(stderr, "  %d runs died in jansson's parser (an allocation failure it asserts on)\n", died);
    json_set_alloc_funcs(malloc, free);
    assert_true(failed > 0);
    free(ref);
    tu_rmrf(tmp);
    free(tmp);
}

int main(void)
{
    signal(SIGXFSZ, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(many_tensors_exact_format),
        cmocka_unit_test(failed_write_leaves_no_manifest),
        cmocka_unit_test(jansson_failures_never_short),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
