/*
 * The fuzz targets of the readers of what bfshard writes and of the config's claim
 * (fuzz/fuzz_manifest.c, fuzz_sums.c, fuzz_claim.c, fuzz_slices.c, fuzz_oci.c), replayed as plain
 * functions over their seed corpora (fuzz/corpus/<target>) and regression inputs
 * (fuzz/regress/<target>): every input in a child process, which must exit 0 (a broken
 * property aborts, a crash is a signal, a leak under ASan exit 3). Built without
 * sanitizers here; `make asan` runs the same with ASan + UBSan, and with the 1 MiB
 * manifest window where `make fuzz` uses a tiny one. The targets' OUTDIRs are made once, before the children fork.
 * The OCI seeds that are real packs (pack_k<k>, with bfs_verify or index_set) must verify
 * clean in the harness: its layouts are the ones gen_corpus.py packed, byte for byte.
 */
#include "testutil.h"


#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LLVMFuzzerTestOneInput fz_manifest_one
#define LLVMFuzzerInitialize fz_manifest_init
#include "../fuzz/fuzz_manifest.c"
#undef LLVMFuzzerTestOneInput
#undef LLVMFuzzerInitialize
#define LLVMFuzzerTestOneInput fz_sums_one
#define LLVMFuzzerInitialize fz_sums_init
#include "../fuzz/fuzz_sums.c"
#undef LLVMFuzzerTestOneInput
#undef LLVMFuzzerInitialize
#define LLVMFuzzerTestOneInput fz_claim_one
#define LLVMFuzzerInitialize fz_claim_init
#include "../fuzz/fuzz_claim.c"
#undef LLVMFuzzerTestOneInput
#undef LLVMFuzzerInitialize
#define LLVMFuzzerTestOneInput fz_slices_one
#define LLVMFuzzerInitialize fz_slices_init
#include "../fuzz/fuzz_slices.c"
#undef LLVMFuzzerTestOneInput
#undef LLVMFuzzerInitialize
#define LLVMFuzzerTestOneInput fz_oci_one
#define LLVMFuzzerInitialize fz_oci_init
#include "../fuzz/fuzz_oci.c"
#undef LLVMFuzzerTestOneInput
#undef LLVMFuzzerInitialize
#include "../fuzz/fuzz_common.c"

typedef int (*fz_fn)(const uint8_t *, size_t);
typedef int (*fz_init_fn)(int *, char ***);

static void replay(const char *name, fz_init_fn init, fz_fn fn)
{
    int argc = 0;
    char **argv = NULL;
    char d[512];
    init(&argc, &argv);
    snprintf(d, sizeof d, "fuzz/corpus/%s", name);
    const int a = tu_replay_dir(d, fn, true);
    snprintf(d, sizeof d, "fuzz/regress/%s", name);
    const int b = tu_replay_dir(d, fn, true);
    fprintf(stderr, "  fuzz_%s: %d seeds + %d regression inputs replayed\n", name, a, b);
    assert_true(a > 5);
}

static void manifest_corpus(void **s)
{
    (void)s;
    replay("manifest", fz_manifest_init, fz_manifest_one);
}

static void sums_corpus(void **s)
{
    (void)s;
    replay("sums", fz_sums_init, fz_sums_one);
}

static void claim_corpus(void **s)
{
    (void)s;
    replay("claim", fz_claim_init, fz_claim_one);
}

static void slices_corpus(void **s)
{
    (void)s;
    replay("slices", fz_slices_init, fz_slices_one);
}

static void oci_corpus(void **s)
{
    (void)s;
    replay("oci", fz_oci_init, fz_oci_one);
    /* the real packs verify clean (in this process: fz_oci_last_rc is the verdict) */
    static const char *const clean[] = {"pack_k0", "pack_k1", "pack_k2", "pack_k3", "pack_k0_public",
                                        "pack_k0_index_set"};
    static const char *const bad[] = {"pack_k0_corrupt_manifest", "pack_k0_symlink_last", "pack_k0_no_base_blobs"};
    for (size_t i = 0; i < 9; i++) {
        const char *n = i < 6 ? clean[i] : bad[i - 6];
        char p[256];
        size_t len = 0;
        snprintf(p, sizeof p, "fuzz/corpus/oci/%s", n);
        uint8_t *b = tu_read_file(p, &len);
        assert_non_null(b);
        fz_oci_last_rc = 1;
        fz_oci_one(b, len);
        if (fz_oci_last_rc != (i < 6 ? 0 : BFS_EVERIFY))
            fail_msg("%s: verify OCIDIR gave %d", p, fz_oci_last_rc);
        free(b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(slices_corpus),
        cmocka_unit_test(manifest_corpus),
        cmocka_unit_test(sums_corpus),
        cmocka_unit_test(claim_corpus),
        cmocka_unit_test(oci_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
