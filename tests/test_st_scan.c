/*
 * The safetensors header read by the streamed JSON scanner: it accepts and
 * refuses what the jansson tree did (each edge of the grammar against the old parser,
 * fuzz/st_parse_ref.c), every allocation failing in turn is a clean BFS_ENOMEM with
 * nothing leaked (the header, and the input set read through an index), and a header of
 * 100k tensors takes memory in proportion to its table.
 * Linked with --wrap=malloc,calloc,realloc,free (Makefile): the wrappers count, and fail
 * the allocation asked for, only while `track` is set.
 */
#include "testutil.h"
#include "bfs_internal.h"
#include "../fuzz/st_parse_ref.c"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);

static bool track;
static long n_alloc, fail_at = -1, live;
static size_t cur, peak;

static void tr_add(void *p, long k)
{
    if (!p || !track)
        return;
    cur += malloc_usable_size(p);
    peak = cur > peak ? cur : peak;
    live += k;
}

static bool tr_fail(void) { return track && n_alloc++ == fail_at; }

void *__wrap_malloc(size_t n)
{
    if (tr_fail())
        return NULL;
    void *p = __real_malloc(n);
    tr_add(p, 1);
    return p;
}

void *__wrap_calloc(size_t n, size_t m)
{
    if (tr_fail())
        return NULL;
    void *p = __real_calloc(n, m);
    tr_add(p, 1);
    return p;
}

void __wrap_free(void *p)
{
    if (p && track) {
        cur -= malloc_usable_size(p);
        live--;
    }
    __real_free(p);
}

void *__wrap_realloc(void *p, size_t n)
{
    if (tr_fail())
        return NULL;
    const size_t old = p && track ? malloc_usable_size(p) : 0;
    void *q = __real_realloc(p, n);
    if (q && track) {
        cur -= old;
        tr_add(q, p ? 0 : 1);
    }
    return q;
}

/* 8-byte length + header + data_len zero bytes */
static uint8_t *mk_n(const char *header, size_t hl, size_t data_len, size_t *len)
{
    *len = 8 + hl + data_len;
    uint8_t *b = calloc(1, *len);
    assert_non_null(b);
    bfs__st_put_len(b, hl);
    memcpy(b + 8, header, hl);
    return b;
}

static uint8_t *mk(const char *header, size_t data_len, size_t *len)
{
    return mk_n(header, strlen(header), data_len, len);
}

static void agree_n(const char *header, size_t hl, size_t data_len)
{
    size_t len;
    uint8_t *b = mk_n(header, hl, data_len, &len);
    const char *why = fz_st_differ(b, len, "t.safetensors");
    if (why)
        fail_msg("header %.200s: %s", header, why);
    free(b);
}

static void agree(const char *header, size_t data_len) { agree_n(header, strlen(header), data_len); }

#define T(extra) "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]" extra "}}"

static void same_verdicts_as_jansson(void **s)
{
    (void)s;
    static const char *const one[] = {
        T(""), T(",\"x\":null"), T(",\"x\":{\"a\":[1,2.5e3,-0,true,false,null,\"s\"]}"),
        T(",\"x\":{\"a\":1,\"a\":2}"),                       /* a duplicate key deep in an ignored field */
        /* keys in increasing order are compared with the one before only, until one is not */
        T(",\"x\":{\"a\":1,\"ab\":2,\"abc\":3}"), T(",\"x\":{\"a\":1,\"b\":2,\"b\":3}"),
        T(",\"x\":{\"a\":1,\"b\":2,\"c\":3,\"a\":4}"), T(",\"x\":{\"a\":1,\"b\":2,\"\\u0061\":3}"),
        T(",\"x\":{\"ab\":1,\"a\":2,\"abc\":3,\"ab\":4}"), T(",\"x\":{\"b\":1,\"a\":2,\"c\":3}"),
        T(",\"dtype\":\"U8\""), "{\"t\":{\"dt\\u0079pe\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
        "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"\\u0074\":{}}", /* "t" twice */
        T(",\"x\":1e400"), T(",\"x\":-1e400"), T(",\"x\":1e-400"), T(",\"x\":1.7976931348623158e308"),
        T(",\"x\":1.7976931348623159e308"), T(",\"x\":9223372036854775807"), T(",\"x\":9223372036854775808"),
        T(",\"x\":-9223372036854775808"), T(",\"x\":-9223372036854775809"), T(",\"x\":01"), T(",\"x\":1."),
        T(",\"x\":.5"), T(",\"x\":1e"), T(",\"x\":+1"), T(",\"x\":-"), T(",\"x\":tru"), T(",\"x\":truex"),
        T(",\"x\":nul"), T(",\"x\":\"\\u0000\""), T(",\"\\u0000\":1"), T(",\"x\":\"\\ud800\""),
        T(",\"x\":\"\\udc00\""), T(",\"x\":\"\\ud83d\\ude00\""), T(",\"x\":\"\\ud83d\\u0041\""),
        T(",\"x\":\"\\ud83d\""), T(",\"x\":\"\\u12G4\""), T(",\"x\":\"\\q\""), T(",\"x\":\"\x01\""),
        T(",\"x\":\"\x7f\""), T(",\"x\":\"\xc3\xa9\""), T(",\"x\":\"\xed\xa0\x80\""), T(",\"x\":\"\xf4\x90\x80\x80\""),
        T(",\"x\":\"\xe0\x80\x80\""), T(",\"x\":\"\xc0\xaf\""), T(",\"x\":\"\xc3\""), T(",\"x\":\"\xf0\x9f\x98\x80\""),
        T(",\"x\":[1,]"), T(",\"x\":{\"a\":1,}"), T(",\"x\":[1 2]"), T(",\"x\":{\"a\" 1}"), T(",\"x\":{1:2}"),
        T(",}"), T("}"), T(" \t\r\n"),
        "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}   \n\t\r",
        "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}  x", "{\"t\":{\"dtype\":\"U8\"", "{",
        "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}{}",
        "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}\0",
        /* the rules on what an entry says, and which of two problems is reported */
        "{\"t\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}",
        "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"shape\":[1]}}",
        "{\"t\":{\"dtype\":\"U9\",\"shape\":[1],\"data_offsets\":[0,1]},\"u\":{\"a\":1,\"a\":1}}",
        "{\"t\":{\"dtype\":\"U9\",\"shape\":[1],\"data_offsets\":[0,1]},\"u\":[1,]}",
        "{\"t\":3,\"u\":{}}", "{\"t\":{\"dtype\":3}}", "{\"t\":{\"dtype\":[\"U8\"]}}", "{\"t\":{\"dtype\":\"U8\"}}",
        "{\"t\":{\"dtype\":\"U8\",\"shape\":{}}}", "{\"t\":{\"dtype\":\"U8\",\"shape\":[1,2,3,4,5,6,7,8,9,\"x\"]}}",
        "{\"t\":{\"dtype\":\"U8\",\"shape\":[1,[2]],\"data_offsets\":[0,1]}}",
        "{\"t\":{\"dtype\":\"U8\",\"shape\":[-0],\"data_offsets\":[0,0]}}",
        "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}",
        "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,\"1\"]}}",
        "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":{}}}",
        "{\"t\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807,2],\"data_offsets\":[0,1]}}",
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,1]}}",
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[0,4611686018427387904],\"data_offsets\":[0,0]},"
        "\"u\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
        "{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
        "{\"__metadata__\":{\"format\":\"pt\",\"b\":\"\\u001f\\n\\/\\\"\\\\\\u00e9\\ud83d\\ude00\x7f\",\"a\":\"\"},"
        "\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
        "{\"__metadata__\":{},\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
        "{\"__metadata__\":{\"k\":1},\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
        "{\"__metadata__\":{\"k\\n\":{\"x\":1}},\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
        "{\"__metadata__\":[],\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
        "{\"__metadata__\":{\"a\":\"x\",\"\\u0061\":\"y\"}}", "{\"__metadata__\":{\"b\":\"x\",\"ab\":\"y\",\"a\":\"z\"}}",
        "{\"__metadata__\":{\"\\u00e9\":\"x\",\"z\":\"y\"}}",
        "{\"\\u005f_metadata__\":{\"a\":1}}",
        "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"b\":{\"dtype\":\"U8\",\"shape\":[1],"
        "\"data_offsets\":[1,2]},\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}",
        "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},\"b\":{\"dtype\":\"U8\",\"shape\":[1],"
        "\"data_offsets\":[1,2]}}",
    };
    for (size_t i = 0; i < sizeof one / sizeof *one; i++)
        for (size_t d = 0; d < 4; d++)
            agree(one[i], d);
    /* NUL bytes: jansson passes over one right after a number or a literal, nowhere else */
#define NL(x) {x, sizeof x - 1}
    static const struct {
        const char *s;
        size_t n;
    } nul[] = {
        NL(T(",\"x\":[1\0]")), NL(T(",\"x\":[1\0\0]")), NL(T(",\"x\":[1.5\0]")), NL(T(",\"x\":[1e5\0,2]")),
        NL(T(",\"x\":[0\0]")), NL(T(",\"x\":true\0")), NL(T(",\"x\":null\0")), NL(T(",\"x\":false\0 ")),
        NL(T(",\"x\":\"s\"\0")), NL(T(",\"x\":[\0 1]")), NL(T(",\"x\":tr\0ue")), NL(T(",\"x\":-\0")),
        NL(T(",\"x\":{}\0")), NL(T(",\"x\":[1,\0 2]")), NL(T(",\"x\"\0:1")), NL(T(",\"x\":[1\0 ]")),
        NL("{\"t\":{\"dtype\":\"U8\",\"shape\":[1\0],\"data_offsets\":[0,1\0]\0}}"),
        NL("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}\0"),
    };
#undef NL
    for (size_t i = 0; i < sizeof nul / sizeof *nul; i++)
        agree_n(nul[i].s, nul[i].n, 1);
    /* a long name, at and over the 4096-byte limit; a long dtype */
    char *h = malloc(20000);
    for (size_t k = 4095; k <= 4097; k++) {
        snprintf(h, 20000, "{\"%0*d\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", (int)k, 7);
        agree(h, 1);
    }
    snprintf(h, 20000, "{\"t\":{\"dtype\":\"%01500d\",\"shape\":[1],\"data_offsets\":[0,1]}}", 0);
    agree(h, 1);
    /* nesting: a value inside N open containers has depth N + 1, at most 2048 */
    for (int depth = 2045; depth <= 2049; depth++) {
        for (int inner = 0; inner < 3; inner++) {
            size_t k = (size_t)snprintf(h, 20000, "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":");
            for (int i = 0; i < depth - 3; i++)
                h[k++] = '[';
            k += (size_t)snprintf(h + k, 20000 - k, "%s", inner == 0 ? "" : inner == 1 ? "1" : "{}");
            for (int i = 0; i < depth - 3; i++)
                h[k++] = ']';
            snprintf(h + k, 20000 - k, "}}");
            agree(h, 1);
        }
    }
    free(h);
}

static void metadata_text(void **s)
{
    (void)s;
    size_t len;
    uint8_t *b = mk("{\"__metadata__\":{\"z\":\"\\u001f\\n\\/\\u00e9\",\"a\":\"x\\\"\"},"
                    "\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}  ", 1, &len);
    bfs_st_header h;
    assert_int_equal(bfs__st_parse(b, len, "t.safetensors", &h), 0);
    assert_string_equal(h.metadata_json, "{\"a\":\"x\\\"\",\"z\":\"\\u001F\\n/\xc3\xa9\"}");
    bfs__st_header_free(&h);
    free(b);
}

/* Each allocation of one parse failing in turn: BFS_ENOMEM naming the file, no block left */
static void sweep(const char *header, size_t data_len, int want)
{
    size_t len;
    uint8_t *b = mk(header, data_len, &len);
    bfs_st_header h;
    n_alloc = 0;
    fail_at = -1;
    live = 0;
    track = true;
    int rc = bfs__st_parse(b, len, "t.safetensors", &h);
    track = false;
    assert_int_equal(rc, want);
    if (rc == 0)
        bfs__st_header_free(&h);
    const long total = n_alloc;
    assert_true(total > 0);
    for (long k = 0; k < total; k++) {
        n_alloc = 0;
        fail_at = k;
        live = 0;
        bfs__err_clear();
        track = true;
        rc = bfs__st_parse(b, len, "t.safetensors", &h);
        if (rc == 0)
            bfs__st_header_free(&h);
        track = false;
        if (rc != BFS_ENOMEM || !strstr(bfs_last_error(), "t.safetensors") || live != 0)
            fail_msg("allocation %ld of %ld failed: rc %d (%s), %ld blocks left", k, total, rc, bfs_last_error(), live);
    }
    fail_at = -1;
    free(b);
}

static void every_allocation_fails_cleanly(void **s)
{
    (void)s;
    /* 40 tensors (the table and the key set grow), metadata to sort, escapes to decode */
    char h[8192];
    size_t k = (size_t)snprintf(h, sizeof h, "{\"__metadata__\":{\"format\":\"pt\",\"b\\u00e9\":\"x\\n\",\"a\":\"y\"}");
    for (int i = 0; i < 40; i++)
        k += (size_t)snprintf(h + k, sizeof h - k,
                              ",\"layer.%d.w\\u0065ight\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[%d,%d],\"x\":[1.5]}",
                              i, 4 * i, 4 * i + 4);
    snprintf(h + k, sizeof h - k, "}   ");
    sweep(h, 160, 0);
    /* refused: an entry's rule broken, then the rest scanned for a JSON error (none, one) */
    sweep("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"b\":{\"dtype\":\"Q\"},"
          "\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
          2, BFS_EINPUT);
    sweep("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"b\":{\"dtype\":\"Q\"},\"c\":1,\"c\":2}", 1,
          BFS_EINPUT);
    sweep("{\"__metadata__\":{\"a\":\"b\",\"c\":2.5e1},\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
          BFS_EINPUT);
}

/* The input set read through model.safetensors.index.json (streamed too): each allocation
 * of bfs__input_open failing in turn is BFS_ENOMEM with nothing left; its verdicts on a few
 * indexes. */
static void index_allocation_failures(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("stscan");
    char p[4096];
    static const uint8_t z[4] = {0};
    snprintf(p, sizeof p, "%s/a.safetensors", tmp);
    tu_write_st(p, "{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                   "\"y\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}", z, 4);
    snprintf(p, sizeof p, "%s/b.safetensors", tmp);
    tu_write_st(p, "{\"z\\u00e9\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", z, 2);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", tmp);
    static const struct {
        const char *index;
        int rc;
        const char *msg;
    } cases[] = {
        {"{\"metadata\":{\"total_size\":6},\"weight_map\":{\"x\":\"a.safetensors\",\"z\\u00e9\":\"b.safetensors\","
         "\"y\":\"a.safetensors\"}}",
         0, ""},
        {"{\"weight_map\":{\"x\":\"a.safetensors\"}}", BFS_EINPUT, "\"y\" (at offset 115) is not listed in"},
        {"{\"weight_map\":{\"x\":\"b.safetensors\",\"y\":\"a.safetensors\",\"z\\u00e9\":\"b.safetensors\"}}", BFS_EINPUT,
         "\"x\" is mapped to b.safetensors but is in a.safetensors"},
        {"{\"weight_map\":{\"x\":1},\"a\":[1,]}", BFS_EINPUT, "not valid JSON at line 1 column "},
        {"{\"weight_map\":{\"x\":1}}", BFS_EINPUT, "weight_map entry \"x\" is not a file name string"},
        {"{\"weight_map\":{\"x\":\"../a\"}}", BFS_EINPUT, "not a plain file name"},
        {"{\"weight_map\":{}}", BFS_EINPUT, "weight_map is empty"},
        {"[{\"weight_map\":{}}]", BFS_EINPUT, "no \"weight_map\" object"},
        {"{\"weight_map\":{\"x\":\"a.safetensors\",\"x\":\"a.safetensors\"}}", BFS_EINPUT, "duplicate object key"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        assert_int_equal(tu_write_file(p, cases[c].index, strlen(cases[c].index)), 0);
        bfs_input *in = NULL;
        bfs__err_clear();
        n_alloc = 0;
        fail_at = -1;
        live = 0;
        track = true;
        int rc = bfs__input_open(tmp, &in);
        bfs__input_free(in);
        track = false;
        if (rc != cases[c].rc || !strstr(bfs_last_error(), cases[c].msg) || live != 0)
            fail_msg("index %zu: rc %d (%s), %ld blocks left", c, rc, bfs_last_error(), live);
        const long total = n_alloc;
        for (long k = 0; k < total && c < 2; k++) {
            in = NULL;
            n_alloc = 0;
            fail_at = k;
            live = 0;
            bfs__err_clear();
            track = true;
            rc = bfs__input_open(tmp, &in);
            bfs__input_free(in);
            track = false;
            if (rc != BFS_ENOMEM || live != 0)
                fail_msg("index %zu, allocation %ld of %ld failed: rc %d (%s), %ld blocks left", c, k, total, rc,
                         bfs_last_error(), live);
        }
        fail_at = -1;
    }
    tu_rmrf(tmp);
    free(tmp);
}

/* 100k tensors: the heap's peak during the parse, against the table and names it returns
 * (a jansson tree of this header took ~120 MB; docs/ROBUSTNESS.md) */
static void memory_follows_the_table(void **s)
{
    (void)s;
    enum { N = 100000 };
    const size_t cap = (size_t)N * 160 + 64;
    char *hdr = malloc(cap);
    assert_non_null(hdr);
    size_t k = (size_t)snprintf(hdr, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < N; i++)
        k += (size_t)snprintf(hdr + k, cap - k,
                              ",\"model.layers.%d.mlp.experts.%d.down_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[2,2],"
                              "\"data_offsets\":[%d,%d]}",
                              i / 1000, i % 1000, 8 * i, 8 * i + 8);
    snprintf(hdr + k, cap - k, "}");
    size_t len;
    uint8_t *b = mk(hdr, (size_t)N * 8, &len);
    free(hdr);
    bfs_st_header h;
    cur = peak = 0;
    live = 0;
    n_alloc = 0;
    track = true;
    const double t0 = tu_now_s();
    const int rc = bfs__st_parse(b, len, "t.safetensors", &h);
    const double dt = tu_now_s() - t0;
    track = false;
    assert_int_equal(rc, 0);
    assert_int_equal(h.n, N);
    size_t names = 0;
    for (size_t i = 0; i < h.n; i++)
        names += malloc_usable_size(h.t[i].name);
    const size_t table = h.n * sizeof *h.t + names;
    fprintf(stderr, "  %d tensors, header %zu bytes: heap peak %.1f MB, table + names %.1f MB, held after %.1f MB; %.3f s\n", N,
            len - (size_t)N * 8, peak / 1e6, table / 1e6, cur / 1e6, dt);
    /* the table doubles as it grows (1.5x its final room at the copy), the key set adds
     * 16 bytes a name at most */
    assert_true(peak < 2 * table + (size_t)N * 16 + (1u << 20));
    bfs__st_header_free(&h);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_verdicts_as_jansson),
        cmocka_unit_test(metadata_text),
        cmocka_unit_test(every_allocation_fails_cleanly),
        cmocka_unit_test(index_allocation_failures),
        cmocka_unit_test(memory_follows_the_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
