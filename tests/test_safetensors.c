/* safetensors validity rules (each rule has a must-fail case) and the FSDP2 chunk rule. */
#include "testutil.h"
#include "bfs_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Build a file image: 8-byte length + header + data_len bytes of data. */
static uint8_t *mk(const char *header, uint64_t hlen_override, size_t data_len, size_t *len)
{
    const size_t hl = strlen(header);
    *len = 8 + hl + data_len;
    uint8_t *b = calloc(1, *len + 1);
    const uint64_t n = hlen_override ? hlen_override : hl;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(n >> (8 * i));
    memcpy(b + 8, header, hl);
    return b;
}

static int parse(const char *header, size_t data_len)
{
    size_t len;
    uint8_t *b = mk(header, 0, data_len, &len);
    bfs_st_header h;
    bfs__err_clear();
    const int rc = bfs__st_parse(b, len, "t.safetensors", &h);
    if (rc == 0)
        bfs__st_header_free(&h);
    else
        assert_non_null(strstr(bfs_last_error(), "t.safetensors"));
    free(b);
    return rc;
}

static void valid_files(void **s)
{
    (void)s;
    assert_int_equal(parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16), 0);
    /* scalar: shape [] has one element */
    assert_int_equal(parse("{\"a\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[0,2]}}", 2), 0);
    /* zero-size tensors are legal, also at the same offset */
    assert_int_equal(parse("{\"z\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[0,0]},"
                           "\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3), 0);
    /* metadata + space padding */
    assert_int_equal(parse("{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}    ", 8), 0);
    /* empty file: no tensors, no data */
    assert_int_equal(parse("{}", 0), 0);
}

static void must_fail(void **s)
{
    (void)s;
    size_t len;
    bfs_st_header h;
    /* shorter than 8 bytes */
    uint8_t tiny[4] = {0};
    assert_int_equal(bfs__st_parse(tiny, 4, "t.safetensors", &h), BFS_EINPUT);
    /* header length past EOF */
    uint8_t *b = mk("{}", 1000, 0, &len);
    bfs__err_clear();
    assert_int_equal(bfs__st_parse(b, len, "t.safetensors", &h), BFS_EINPUT);
    assert_non_null(strstr(bfs_last_error(), "past the end"));
    free(b);
    /* header length over the 100,000,000 limit */
    b = mk("{}", 100000001, 0, &len);
    bfs__err_clear();
    assert_int_equal(bfs__st_parse(b, len, "t.safetensors", &h), BFS_EINPUT);
    free(b);
    /* refused headers: {header, data bytes after it} */
    static const struct {
        const char *header;
        size_t data_len;
    } bad[] = {
        {" {}", 0}, /* not starting with '{' */
        {"{\"a\":", 0}, /* not JSON */
        {"{\"a\":3}", 0}, /* not an object of objects */
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
         "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2}, /* duplicate key */
        {"{\"a\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1}, /* unknown / unsupported dtype */
        {"{\"a\":{\"dtype\":\"Q8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1}, /* unknown / unsupported dtype */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4}, /* size != dtype x shape */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,4]}}", 4}, /* shape product overflow */
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1}, /* negative / non-integer shape */
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1}, /* negative / non-integer shape */
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,1]}}", 2}, /* end before begin */
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2}, /* gap */
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
         "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", 3}, /* overlap */
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}", 4}, /* data past the end of the file (truncated) */
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 2}, /* trailing bytes not covered by any tensor */
        {"{\"__metadata__\":{\"k\":1}}", 0}, /* metadata values must be strings */
        {"{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1}, /* missing fields */
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1}, /* missing fields */
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1}, /* missing fields */
        {"{\"\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1}, /* invalid UTF-8 in the header */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (parse(bad[i].header, bad[i].data_len) != BFS_EINPUT)
            fail_msg("header %zu (%s) was not refused", i, bad[i].header);
}

/* An input of many files opens them two threads at a time (input.c); with two broken files
 * the error is the first one's in file order, as when they were opened one by one, and
 * every opened file is released (the test runs under valgrind and ASan in CI). */
static void many_files_first_error(void **s)
{
    (void)s;
    char *dir = tu_tmpdir("stmany");
    char path[4096];
    for (int i = 0; i < 12; i++) {
        char hdr[256];
        snprintf(hdr, sizeof hdr, "{\"t%02d\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", i);
        snprintf(path, sizeof path, "%s/model-%05d-of-00012.safetensors", dir, i + 1);
        tu_write_st(path, hdr, "abcd", i == 4 || i == 9 ? 2 : 4); /* 5 and 10: shorter than their header says */
    }
    bfs_input *in = NULL;
    for (int k = 0; k < 3; k++) { /* the same verdict each time, whichever thread finishes first */
        bfs__err_clear();
        assert_int_equal(bfs__input_open(dir, &in), BFS_EINPUT);
        assert_null(in);
        assert_non_null(strstr(bfs_last_error(), "model-00005-of-00012.safetensors"));
    }
    snprintf(path, sizeof path, "%s/model-00005-of-00012.safetensors", dir);
    tu_write_st(path, "{\"t04\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", "abcd", 4);
    bfs__err_clear(); /* the first error of a command sticks (base/error.c) */
    assert_int_equal(bfs__input_open(dir, &in), BFS_EINPUT);
    assert_non_null(strstr(bfs_last_error(), "model-00010-of-00012.safetensors"));
    snprintf(path, sizeof path, "%s/model-00010-of-00012.safetensors", dir);
    tu_write_st(path, "{\"t09\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", "abcd", 4);
    bfs__err_clear();
    assert_int_equal(bfs__input_open(dir, &in), 0);
    assert_int_equal(in->nfiles, 12);
    assert_int_equal(in->nraw, 12);
    for (size_t i = 0; i < in->nraw; i++) {
        char nm[8];
        snprintf(nm, sizeof nm, "t%02zu", i);
        assert_string_equal(in->raw[i].st->name, nm);
        assert_ptr_equal(bfs__input_find(in, nm), &in->raw[i]);
    }
    assert_null(bfs__input_find(in, "t12"));
    bfs__input_free(in);
    tu_rmrf(dir);
    free(dir);
}

static void chunk_rule(void **s)
{
    (void)s;
    uint64_t a, b;
    /* d0 = 9, W = 8 -> 2,2,2,2,1,0,0,0 */
    const uint64_t want9[8] = {2, 2, 2, 2, 1, 0, 0, 0};
    uint64_t next = 0;
    for (uint64_t r = 0; r < 8; r++) {
        bfs__chunk_rows(9, 8, r, &a, &b);
        assert_int_equal(b - a, want9[r]);
        if (b > a) {
            assert_int_equal(a, next);
            next = b;
        }
    }
    assert_int_equal(next, 9);
    /* d0 < W: 3 rows over 8 ranks -> 1,1,1,0,... */
    for (uint64_t r = 0; r < 8; r++) {
        bfs__chunk_rows(3, 8, r, &a, &b);
        assert_int_equal(b - a, r < 3 ? 1u : 0u);
    }
    /* divisible */
    bfs__chunk_rows(32, 4, 3, &a, &b);
    assert_int_equal(a, 24);
    assert_int_equal(b, 32);
    /* not divisible: 10 over 3 -> 4,4,2 */
    bfs__chunk_rows(10, 3, 2, &a, &b);
    assert_int_equal(a, 8);
    assert_int_equal(b, 10);
    /* zero rows */
    for (uint64_t r = 0; r < 3; r++) {
        bfs__chunk_rows(0, 3, r, &a, &b);
        assert_int_equal(a, 0);
        assert_int_equal(b, 0);
    }
    /* W = 1 gets everything */
    bfs__chunk_rows(7, 1, 0, &a, &b);
    assert_int_equal(a, 0);
    assert_int_equal(b, 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(valid_files),
        cmocka_unit_test(must_fail),
        cmocka_unit_test(many_files_first_error), cmocka_unit_test(chunk_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
