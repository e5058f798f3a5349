/* The format table (src/formats/): its invariants, kind names and unit source ranges. */
#include "testutil.h"
#include "formats/format.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static void table_invariants(void **s)
{
    (void)s;
    const bfs_kind kinds[] = {BFS_K_PASS, BFS_K_CAST, BFS_K_MXFP4, BFS_K_BNB4,
                              BFS_K_FP8,  BFS_K_INT4, BFS_K_NVFP4, BFS_K_CTMX, BFS_K_WOQ};
    size_t n = 0;
    while (bfs__formats[n])
        n++;
    assert_true(n >= 1);
    assert_non_null(bfs__formats[n - 1]->leftover); /* the last row takes every leftover */
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        int owners = 0;
        for (size_t i = 0; i < n; i++)
            owners += (bfs__formats[i]->kinds & BFS_KIND_BIT(kinds[k])) != 0;
        assert_int_equal(owners, 1);
        assert_non_null(bfs__format_of(kinds[k]));
    }
    for (size_t i = 0; i < n; i++) {
        assert_non_null(bfs__formats[i]->name);
        if (bfs__formats[i]->kinds) {
            assert_non_null(bfs__formats[i]->sources);
            assert_non_null(bfs__formats[i]->kind_name);
        }
        /* a format a config can claim says what it converts and what its tensors look
         * like, and plans at least one kind; a method with several owners (one per
         * tensor layout: compressed-tensors, modelopt) is owned only by formats whose
         * tensors need the claim, and a format lists a method once */
        for (const char *const *m = bfs__formats[i]->methods; m && *m; m++) {
            assert_non_null(bfs__formats[i]->supports);
            assert_non_null(bfs__formats[i]->layout);
            assert_true((bfs__formats[i]->kinds | bfs__formats[i]->borrows) != 0);
            /* what it borrows, another row owns */
            for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++)
                if (bfs__formats[i]->borrows & BFS_KIND_BIT(kinds[k]))
                    assert_true(bfs__format_of(kinds[k]) != bfs__formats[i] && bfs__format_of(kinds[k]) != NULL);
            for (size_t j = 0; j < n; j++)
                for (const char *const *o = bfs__formats[j]->methods; o && *o; o++)
                    if (o != m && strcasecmp(*o, *m) == 0) {
                        assert_true(j != i);
                        /* at most one of them identifies its tensors alone: "bitsandbytes" is
                         * bnb4's self-describing quant_state blobs and bnb8's int8 + SCB, which
                         * need the claim (load_in_8bit) */
                        assert_false(bfs__formats[i]->claim_optional && bfs__formats[j]->claim_optional);
                    }
        }
    }
    /* the refuse row sees every leftover before passthrough takes it */
    assert_true(n >= 2);
    assert_string_equal(bfs__formats[n - 2]->name, "refuse");
    char sup[1024];
    bfs__supported_list(sup, sizeof sup);
    assert_true(strlen(sup) + 1 < sizeof sup); /* the whole list fits bfs_fctx.supported */
    assert_non_null(strstr(sup, "mxfp4"));
    assert_non_null(strstr(sup, "bitsandbytes 4-bit"));
    assert_non_null(strstr(sup, "unquantized"));
}

static void kind_names(void **s)
{
    (void)s;
    bfs_ltensor t;
    memset(&t, 0, sizeof t);
    t.kind = BFS_K_PASS;
    assert_string_equal(bfs__kind_name(&t), "passthrough");
    t.kind = BFS_K_CAST;
    assert_string_equal(bfs__kind_name(&t), "cast");
    t.kind = BFS_K_MXFP4;
    assert_string_equal(bfs__kind_name(&t), "mxfp4");
    t.kind = BFS_K_BNB4;
    strcpy(t.quant_type, "nf4");
    assert_string_equal(bfs__kind_name(&t), "bnb-nf4");
    t.double_quant = true;
    assert_string_equal(bfs__kind_name(&t), "bnb-nf4-dq");
    strcpy(t.quant_type, "fp4");
    assert_string_equal(bfs__kind_name(&t), "bnb-fp4-dq");
    t.double_quant = false;
    assert_string_equal(bfs__kind_name(&t), "bnb-fp4");
}

static void unit_sources(void **s)
{
    (void)s;
    bfs_raw a, b;
    bfs_ltensor t;
    bfs_srange r[BFS_UNIT_MAX_SRC];
    memset(&t, 0, sizeof t);
    t.src[0] = &a;
    t.src[1] = &b;
    const bfs_unit u = {.t = &t, .row0 = 1, .row1 = 3};

    t.kind = BFS_K_MXFP4; /* 4-d blocks: per item R * G scale bytes, 16 block bytes each */
    t.mx_items = 1;
    t.mx.R = 3;
    t.mx.G = 2;
    assert_int_equal(bfs__unit_sources(&u, r), 2);
    assert_ptr_equal(r[0].r, &a);
    assert_int_equal(r[0].off, 1 * 6 * 16);
    assert_int_equal(r[0].len, 2 * 6 * 16);
    assert_ptr_equal(r[1].r, &b);
    assert_int_equal(r[1].off, 6);
    assert_int_equal(r[1].len, 12);
    t.mx_items = 0; /* 3-d blocks: a row is G scale bytes */
    assert_int_equal(bfs__unit_sources(&u, r), 2);
    assert_int_equal(r[0].off, 2 * 16);
    assert_int_equal(r[1].len, 4);

    t.kind = BFS_K_BNB4; /* two codes a byte, rows of an odd element count */
    t.row_elems = 5;
    t.bnb.blocksize = 4;
    bfs_raw am, nam, nqm;
    t.src[3] = &am;
    t.src[4] = &nam;
    t.src[5] = &nqm;
    assert_int_equal(bfs__unit_sources(&u, r), 2);
    assert_int_equal(r[0].off, 2);  /* element 5 is in byte 2 */
    assert_int_equal(r[0].len, 6);  /* up to element 14, byte 7 */
    assert_ptr_equal(r[1].r, &am);  /* elements [5, 15): blocks [1, 4) of float32 absmax */
    assert_int_equal(r[1].off, 4);
    assert_int_equal(r[1].len, 12);
    t.double_quant = true; /* U8 absmax, nested blocks of 2 absmax, the 256-entry code */
    t.bnb.nested_blocksize = 2;
    assert_int_equal(bfs__unit_sources(&u, r), 4);
    assert_int_equal(r[1].off, 1);
    assert_int_equal(r[1].len, 3);
    assert_ptr_equal(r[2].r, &nam); /* nested blocks [0, 2) */
    assert_int_equal(r[2].off, 0);
    assert_int_equal(r[2].len, 8);
    assert_ptr_equal(r[3].r, &nqm);
    assert_int_equal(r[3].len, 1024);
    t.double_quant = false;

    t.kind = BFS_K_CAST;
    t.src_dtype = BFS_DT_F16;
    t.row_elems = 4;
    assert_int_equal(bfs__unit_sources(&u, r), 1);
    assert_int_equal(r[0].off, 8);
    assert_int_equal(r[0].len, 16);

    t.kind = BFS_K_CTMX; /* rows of 64 elements: 64 E4M3 bytes, 32 E2M1 or 48 E2M3 bytes, 2 scale bytes */
    t.row_elems = 64;
    t.ctmx.cols = 64;
    t.ctmx.elem = BFS_CTMX_E4M3;
    assert_int_equal(bfs__unit_sources(&u, r), 2);
    assert_ptr_equal(r[0].r, &a);
    assert_int_equal(r[0].off, 64);
    assert_int_equal(r[0].len, 128);
    assert_ptr_equal(r[1].r, &b);
    assert_int_equal(r[1].off, 2);
    assert_int_equal(r[1].len, 4);
    t.ctmx.elem = BFS_CTMX_E2M1;
    assert_int_equal(bfs__unit_sources(&u, r), 2);
    assert_int_equal(r[0].off, 32);
    assert_int_equal(r[0].len, 64);
    assert_int_equal(r[1].off, 2);
    t.ctmx.elem = BFS_CTMX_E2M3; /* four 6-bit codes per 3 bytes */
    assert_int_equal(bfs__unit_sources(&u, r), 2);
    assert_int_equal(r[0].off, 48);
    assert_int_equal(r[0].len, 96);
    assert_int_equal(r[1].off, 2);
    assert_int_equal(r[1].len, 4);
}

/* compressed-tensors' target matching (src/formats/ctmatch.c): Python re.match patterns run
 * as POSIX regexes must give compressed-tensors' own answers (fixtures/ct-match-vectors.json,
 * made by fixtures/gen_mx_fixtures.py with compressed_tensors.utils.match.match_name); and
 * what cannot be translated is refused, not guessed. */
static void ct_target_matching(void **s)
{
    (void)s;
    json_error_t e;
    json_t *v = json_load_file("fixtures/ct-match-vectors.json", 0, &e);
    if (!v)
        fail_msg("fixtures/ct-match-vectors.json: %s", e.text);
    const json_t *vec = json_object_get(v, "vectors");
    assert_true(json_array_size(vec) > 100);
    for (size_t i = 0; i < json_array_size(vec); i++) {
        const json_t *x = json_array_get(vec, i);
        const char *t = json_string_value(json_object_get(x, "target")), *n = json_string_value(json_object_get(x, "name"));
        const int want = json_is_true(json_object_get(x, "match")), got = bfs__ct_target_matches(t, n);
        if (got != want)
            fail_msg("target \"%s\", module \"%s\": %d, compressed-tensors says %d (%s)", t, n, got,
                     want, got < 0 ? bfs_last_error() : "");
    }
    json_decref(v);
    static const char *const refused[] = {"re:.*\\bproj", "re:(?=x).*", "re:(?i)LM_HEAD", "re:(a)\\1",
                                          "re:.*\\Aproj", "re:.*x{1,99999}",
                                          /* regcomp's memory is exponential in these (fuzz_claim's OOM) */
                                          "re:.*proj++++++++++++++++++++++++++++++++$", "re:a{2}{3}", "re:x*??",
                                          "re:(((a{99}){99}){99})", "re:((((((((((((((a+)+)+)+)+)+)+)+)+)+)+)+)+)+)+"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        assert_int_equal(bfs__ct_target_matches(refused[i], "model.x"), -1);
        assert_non_null(strstr(bfs_last_error(), "not supported"));
    }
    /* one lazy or possessive mark is no second quantifier; a group's may follow its atom's */
    assert_int_equal(bfs__ct_target_matches("re:.*proj++$", "model.proj"), 1);
    assert_int_equal(bfs__ct_target_matches("re:.*(pro+?j)+$", "model.proj"), 1);
    assert_int_equal(bfs__ct_target_matches("re:.*\\.(\\d{1,4})\\.x", "m.12.x"), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(table_invariants),
        cmocka_unit_test(kind_names),
        cmocka_unit_test(unit_sources),
        cmocka_unit_test(ct_target_matching),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
