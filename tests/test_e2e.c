/*
 * End to end: convert every fixture for W = 1, 2, 3, 8 and compare each rank
 * file with the upstream dequant (fixtures/expected), sliced by the chunk rule;
 * verify; tamper detection; interrupt and resume; the CLI's errors and exit codes.
 */
#include "testutil.h"
#include "tu_st.h"
#include "bfs_internal.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void check_outdir(const char *outdir, const char *expected, int W, bool fp4)
{
    stfile ex;
    char path[4096];
    size_t allowed = 0;
    assert_int_equal(st_load(expected, &ex), 0);
    stfile *rk = calloc((size_t)W, sizeof *rk);
    for (int r = 0; r < W; r++) {
        snprintf(path, sizeof path, "%s/shard-%05d-model-00001-of-00001.safetensors", outdir, r + 1);
        if (st_load(path, &rk[r]) != 0)
            fail_msg("%s: missing or invalid", path);
        assert_non_null(rk[r].h.metadata_json);
        assert_non_null(strstr(rk[r].h.metadata_json, "DCP_SHARDING_INFO"));
        assert_int_equal(rk[r].h.data_start % 64, 0);
    }
    size_t seen = 0;
    for (size_t i = 0; i < ex.h.n; i++) {
        const bfs_st_tensor *e = &ex.h.t[i];
        const uint64_t d0 = e->ndim ? e->shape[0] : 1;
        uint64_t row_bytes = bfs__dtype_size(e->dtype);
        for (int d = 1; d < e->ndim; d++)
            row_bytes *= e->shape[d];
        for (int r = 0; r < W; r++) {
            uint64_t a, b;
            if (e->ndim == 0) {
                a = 0;
                b = r == 0;
            } else {
                bfs__chunk_rows(d0, (uint64_t)W, (uint64_t)r, &a, &b);
            }
            const bfs_st_tensor *g = st_find(&rk[r], e->name);
            if (a == b && !(d0 == 0 && r == 0)) {
                if (g)
                    fail_msg("W=%d rank %d: \"%s\" has no rows but is present", W, r, e->name);
                continue;
            }
            if (!g)
                fail_msg("W=%d rank %d: \"%s\" missing", W, r, e->name);
            seen++;
            assert_int_equal(g->dtype, e->dtype);
            assert_int_equal(g->ndim, e->ndim);
            if (e->ndim)
                assert_int_equal(g->shape[0], b - a);
            for (int d = 1; d < e->ndim; d++)
                assert_int_equal(g->shape[d], e->shape[d]);
            const size_t bad = st_cmp_bf16(st_data(&rk[r], g), st_data(&ex, e) + a * row_bytes, (size_t)((b - a) * row_bytes),
                                        fp4, &allowed);
            if (bad)
                fail_msg("W=%d rank %d: \"%s\": %zu elements differ from upstream", W, r, e->name, bad);
        }
    }
    size_t total = 0;
    for (int r = 0; r < W; r++)
        total += rk[r].h.n;
    assert_int_equal(total, seen); /* nothing extra */
    if (allowed)
        fprintf(stderr, "  (%s W=%d: %zu documented +-0 / NaN-payload differences)\n", expected, W, allowed);
    for (int r = 0; r < W; r++)
        st_free(&rk[r]);
    free(rk);
    st_free(&ex);
}

static void convert_ok(const char *in, const char *out, int W, int mx_layout, int level)
{
    bfs_convert_opts o;
    bfs_convert_opts_init(&o);
    o.world_size = W;
    o.device = "cpu";
    o.mxfp4_layout = mx_layout;
    o.force = 1;
    o.cpu_level = level;
    o.mem = 64 << 10; /* small: many units per tensor */
    bfs_convert_result res;
    bfs_convert_result_init(&res);
    const int rc = bfs_convert(in, out, &o, &res);
    if (rc != 0)
        fail_msg("convert %s W=%d: %s", in, W, bfs_last_error());
    assert_int_equal(bfs_verify(out, stderr, NULL), 0);
}

static const struct {
    const char *dir, *expected;
    int mx;
    bool fp4;
} fixtures[] = {
    {"fixtures/mxfp4-tiny", "fixtures/expected/mxfp4-tiny.hf.safetensors", BFS_MXFP4_HF, false},
    {"fixtures/mxfp4-tiny", "fixtures/expected/mxfp4-tiny.openai.safetensors", BFS_MXFP4_OPENAI, false},
    {"fixtures/bnb-nf4", "fixtures/expected/bnb-nf4.safetensors", 0, false},
    {"fixtures/bnb-nf4-dq", "fixtures/expected/bnb-nf4-dq.safetensors", 0, false},
    {"fixtures/bnb-nf4-dq-bs128", "fixtures/expected/bnb-nf4-dq-bs128.safetensors", 0, false},
    {"fixtures/bnb-fp4", "fixtures/expected/bnb-fp4.safetensors", 0, true},
    {"fixtures/bnb-fp4-dq", "fixtures/expected/bnb-fp4-dq.safetensors", 0, true},
};

static void fixtures_all_world_sizes(void **s)
{
    (void)s;
    static const int Ws[] = {1, 2, 3, 8};
    char *tmp = tu_tmpdir("e2e");
    char out[4096];
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++)
        for (size_t w = 0; w < 4; w++) {
            snprintf(out, sizeof out, "%s/out", tmp);
            convert_ok(fixtures[f].dir, out, Ws[w], fixtures[f].mx, -1);
            check_outdir(out, fixtures[f].expected, Ws[w], fixtures[f].fp4);
        }
    tu_rmrf(tmp);
    free(tmp);
}

/* Every CPU kernel level gives the same bytes end to end. */
static void levels_identical(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("lvl");
    char a[4096], b[4096];
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        snprintf(a, sizeof a, "%s/scalar", tmp);
        convert_ok(fixtures[f].dir, a, 3, fixtures[f].mx, 0);
        for (int lvl = 1; lvl < BFS_CPU_NLEVELS; lvl++) {
            if (!bfs_kernels_cpu(lvl)) {
                fprintf(stderr, "  SKIP level %s: not supported on this CPU\n", bfs_cpu_level_name(lvl));
                continue;
            }
            snprintf(b, sizeof b, "%s/l%d", tmp, lvl);
            convert_ok(fixtures[f].dir, b, 3, fixtures[f].mx, lvl);
            assert_int_equal(tu_sh("cmp -s %s/shard-00002-model-00001-of-00001.safetensors %s/shard-00002-model-00001-of-00001.safetensors && "
                                   "cmp -s %s/bfshard.manifest.json %s/bfshard.manifest.json", a, b, a, b), 0);
        }
    }
    tu_rmrf(tmp);
    free(tmp);
}

/* A script that runs bfshard over every fixture two ways and compares the outputs, in a
 * temporary directory of its own: exit 0 or the test fails. */
static void script_ok(const char *script, const char *tag)
{
    char *tmp = tu_tmpdir(tag);
    assert_int_equal(tu_sh("%s %s %s", script, tu_bfshard(), tmp), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* Rank files written in groups (units.h) give the bytes of one at a time (the script
 * runs every fixture both ways and fails unless some runs grouped). */
static void groups_identical(void **s)
{
    (void)s;
    script_ok("tests/group_identical.sh", "grp");
}

/* The ring's buffers give the same bytes with the writer slowed (units wait in the ring for
 * their file, their buffers held): every fixture both ways, and fails unless some waited. */
static void ring_identical(void **s)
{
    (void)s;
    script_ok("tests/ring_identical.sh", "ring");
}

/* A group's large pieces cut unit by unit in turn (convert_inter.c: several units a piece,
 * each rank file's source block kept open meanwhile, srchash.c), written buffered to tmpfs
 * (/dev/shm where there is one) and with O_DIRECT where the filesystem takes it: the same
 * files, manifest and input counts as one rank file at a time. */
static void group_units_interleaved(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("ginter");
    char in[4096], out[4096];
    snprintf(in, sizeof in, "%s/in", tmp);
    snprintf(out, sizeof out, "/dev/shm/bfs-test-ginter-%d", (int)getpid());
    const bool shm = tu_sh("mkdir %s 2>/dev/null", out) == 0;
    if (!shm)
        snprintf(out, sizeof out, "%s", tmp);
    assert_int_equal(tu_sh("mkdir -p %s", in), 0);
    tu_gen_mxfp4(in, 16, 2, true); /* experts of 1.5 MB: a rank's 8 are 3 units at --mem 8M */
    const char *runs[][2] = {{"one", "BFSHARD_GROUP=1"},
                             {"buffered", "BFSHARD_DIRECT=0 BFSHARD_WRITERS=2"},
                             {"direct", "BFSHARD_WRITERS=2"}};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(tu_sh("%s BFSHARD_STAGES=1 %s convert %s %s/%s --world-size 2 --mem 8M --device cpu -q "
                               "--json >%s/%s.json 2>%s/%s.stages",
                               runs[i][1], tu_bfshard(), in, out, runs[i][0], tmp, runs[i][0], tmp, runs[i][0]),
                         0);
        if (i == 0)
            continue;
        assert_int_equal(tu_sh("diff -r %s/one %s/%s", out, out, runs[i][0]), 0);
        assert_int_equal(tu_sh("grep -q '\"units_interleaved\": [1-9]' %s/%s.stages", tmp, runs[i][0]), 0);
        assert_int_equal(tu_sh("test \"$(grep -o '\"\\(input_bytes_read\\|source_bytes_hashed\\)\": [0-9]*' %s/one.json)\" = "
                               "\"$(grep -o '\"\\(input_bytes_read\\|source_bytes_hashed\\)\": [0-9]*' %s/%s.json)\"",
                               tmp, tmp, runs[i][0]),
                         0);
    }
    assert_int_equal(tu_sh("grep -q '\"buffered_bytes\": [1-9][0-9]\\{6\\}' %s/buffered.stages", tmp), 0);
    if (shm)
        tu_rmrf(out);
    tu_rmrf(tmp);
    free(tmp);
}

static void outputs_and_sums(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("sums");
    char out[4096];
    snprintf(out, sizeof out, "%s/out", tmp);
    convert_ok("fixtures/mxfp4-tiny", out, 4, BFS_MXFP4_HF, -1);
    /* xxh128sum -c accepts our sums file */
    assert_int_equal(tu_sh("cd %s && xxh128sum -c --quiet xxh128sums.txt", out), 0);
    /* config.json: no quantization_config, bfloat16 */
    assert_int_equal(tu_sh("grep -q quantization_config %s/config.json", out), 1);
    assert_int_equal(tu_sh("grep -q '\"torch_dtype\": \"bfloat16\"' %s/config.json", out), 0);
    /* tokenizer and generation files copied unchanged */
    assert_int_equal(tu_sh("cmp -s fixtures/mxfp4-tiny/tokenizer.json %s/tokenizer.json", out), 0);
    assert_int_equal(tu_sh("cmp -s fixtures/mxfp4-tiny/generation_config.json %s/generation_config.json", out), 0);
    /* no leftovers */
    assert_int_equal(tu_sh("ls -A %s | grep -q partial", out), 1);
    assert_int_equal(tu_sh("test -e %s/.bfshard-inprogress", out), 1);
    tu_rmrf(tmp);
    free(tmp);
}

static void verify_names_flipped_byte(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("flip");
    char out[4096], rf[4096];
    snprintf(out, sizeof out, "%s/out", tmp);
    convert_ok("fixtures/bnb-nf4-dq", out, 2, 0, -1);
    snprintf(rf, sizeof rf, "%s/shard-00002-model-00001-of-00001.safetensors", out);
    size_t len;
    uint8_t *b = tu_read_file(rf, &len);
    assert_non_null(b);
    /* flip one bit in the middle of the data section, then one in the header */
    const size_t pos = len - 1000;
    b[pos] ^= 0x10;
    assert_int_equal(tu_write_file(rf, b, len), 0);
    FILE *rep = tmpfile();
    assert_int_equal(bfs_verify(out, rep, NULL), BFS_EVERIFY);
    rewind(rep);
    char line[2048] = {0};
    assert_non_null(fgets(line, sizeof line, rep));
    fclose(rep);
    assert_non_null(strstr(line, "shard-00002"));
    assert_non_null(strstr(line, "BAD tensor"));
    /* the CLI says the same and exits 7 */
    assert_int_equal(tu_sh("%s verify %s 2>/dev/null", tu_bfshard(), out), 7);
    b[pos] ^= 0x10;
    b[20] ^= 0x01; /* inside the header JSON */
    assert_int_equal(tu_write_file(rf, b, len), 0);
    rep = tmpfile();
    assert_int_equal(bfs_verify(out, rep, NULL), BFS_EVERIFY);
    rewind(rep);
    assert_non_null(fgets(line, sizeof line, rep));
    fclose(rep);
    assert_non_null(strstr(line, "header"));
    free(b);
    tu_rmrf(tmp);
    free(tmp);
}

/* Interrupt a run after the first rank file; the rerun reuses it and the result
 * is byte-identical to an uninterrupted run. */
static int cancel_after_bytes;
static void cancel_cb(const bfs_progress *p, void *u)
{
    (void)u;
    if (p->bytes_done > (uint64_t)cancel_after_bytes)
        bfs_cancel();
}

static void interrupt_and_resume(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("resume");
    char ref[4096], out[4096];
    snprintf(ref, sizeof ref, "%s/ref", tmp);
    snprintf(out, sizeof out, "%s/out", tmp);
    convert_ok("fixtures/mxfp4-tiny", ref, 3, BFS_MXFP4_HF, -1);

    bfs_convert_opts o;
    bfs_convert_opts_init(&o);
    o.world_size = 3;
    o.device = "cpu";
    o.mem = 64 << 10;
    o.progress = cancel_cb;
    cancel_after_bytes = 150000; /* past the first rank file (~100 KB of tensors) */
    bfs_convert_result res;
    bfs_convert_result_init(&res);
    assert_int_equal(bfs_convert("fixtures/mxfp4-tiny", out, &o, &res), BFS_EINTR);
    /* no temp files, no manifest, only complete rank files under final names */
    assert_int_equal(tu_sh("ls -A %s | grep -q partial", out), 1);
    assert_int_equal(tu_sh("test -e %s/bfshard.manifest.json", out), 1);
    assert_int_equal(tu_sh("cmp -s %s/shard-00001-model-00001-of-00001.safetensors %s/shard-00001-model-00001-of-00001.safetensors", ref, out), 0);
    assert_int_equal(tu_sh("test -e %s/shard-00003-model-00001-of-00001.safetensors", out), 1);
    /* a different command must not reuse it */
    bfs_convert_opts o2;
    bfs_convert_opts_init(&o2);
    o2.world_size = 2;
    o2.device = "cpu";
    assert_int_equal(bfs_convert("fixtures/mxfp4-tiny", out, &o2, &res), BFS_EEXIST);
    /* same command again: finishes, reusing rank 1 */
    o.progress = NULL;
    assert_int_equal(bfs_convert("fixtures/mxfp4-tiny", out, &o, &res), 0);
    assert_true(res.files_reused >= 1);
    assert_int_equal(tu_sh("diff -r %s %s", ref, out), 0);
    /* and once more: a finished, verifying output is left alone */
    assert_int_equal(bfs_convert("fixtures/mxfp4-tiny", out, &o, &res), 0);
    assert_int_equal(res.files_reused, 3);
    assert_int_equal(res.files_written, 0);
    assert_int_equal(tu_sh("diff -r %s %s", ref, out), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- CLI errors: one line, naming the place, a distinct exit code ---------------------- */
static void cli_errors(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("clierr");
    char args[8192], err[8192], p[4096];

    assert_int_equal(tu_cli(NULL, "--version", NULL, 0), 0);
    assert_int_equal(tu_cli(NULL, "convert --help", NULL, 0), 0);
    assert_int_equal(tu_cli(NULL, "frobnicate", NULL, 0), 2);
    snprintf(args, sizeof args, "convert fixtures/bnb-nf4 %s/o --world-size 0", tmp);
    assert_int_equal(tu_cli(NULL, args, NULL, 0), 2);
    snprintf(args, sizeof args, "convert fixtures/bnb-nf4 %s/o --mem 12Q", tmp);
    assert_int_equal(tu_cli(NULL, args, NULL, 0), 2);

    /* truncated input: one line naming the file, exit 3 */
    snprintf(p, sizeof p, "%s/trunc", tmp);
    tu_sh("mkdir -p %s && head -c 50000 fixtures/bnb-nf4/model.safetensors > %s/model.safetensors", p, p);
    snprintf(args, sizeof args, "convert %s %s/o1 --quiet", p, tmp);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 3);
    assert_int_equal(tu_count_lines(err), 1);
    assert_non_null(strstr(err, "model.safetensors"));

    /* MXFP4 blocks without scales */
    snprintf(p, sizeof p, "%s/noscales", tmp);
    tu_sh("mkdir -p %s", p);
    char f[4096];
    snprintf(f, sizeof f, "%s/model.safetensors", p);
    tu_write_st(f, "{\"m.experts.down_proj_blocks\":{\"dtype\":\"U8\",\"shape\":[1,2,1,16],\"data_offsets\":[0,32]}}", NULL, 32);
    snprintf(args, sizeof args, "convert %s %s/o2 --quiet", p, tmp);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 3);
    assert_int_equal(tu_count_lines(err), 1);
    assert_non_null(strstr(err, "m.experts.down_proj_blocks"));
    assert_non_null(strstr(err, "offset"));

    /* blocks/scales shape mismatch */
    tu_write_st(f, "{\"x_blocks\":{\"dtype\":\"U8\",\"shape\":[1,2,1,16],\"data_offsets\":[0,32]},"
                "\"x_scales\":{\"dtype\":\"U8\",\"shape\":[1,3,1],\"data_offsets\":[32,35]}}", NULL, 35);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 3);
    assert_non_null(strstr(err, "x_scales"));

    /* orphan scales */
    tu_write_st(f, "{\"x_scales\":{\"dtype\":\"U8\",\"shape\":[1,3,1],\"data_offsets\":[0,3]}}", NULL, 3);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 3);

    /* index naming a missing file */
    snprintf(p, sizeof p, "%s/badindex", tmp);
    tu_sh("mkdir -p %s && cp fixtures/mxfp4-tiny/* %s/ && rm %s/model-00002-of-00002.safetensors", p, p, p);
    snprintf(args, sizeof args, "convert %s %s/o3 --quiet", p, tmp);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 3);
    assert_non_null(strstr(err, "model-00002-of-00002.safetensors"));

    /* symlink loop in the input directory */
    snprintf(p, sizeof p, "%s/loop", tmp);
    tu_sh("mkdir -p %s && ln -s loop.safetensors %s/loop.safetensors", p, p);
    snprintf(args, sizeof args, "convert %s %s/o4 --quiet", p, tmp);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 3);

    /* output inside the input */
    snprintf(args, sizeof args, "convert fixtures/bnb-nf4 fixtures/bnb-nf4/out --quiet");
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 2);
    assert_int_equal(tu_sh("test -e fixtures/bnb-nf4/out"), 1);

    /* non-empty OUTDIR without --force */
    snprintf(p, sizeof p, "%s/full", tmp);
    tu_sh("mkdir -p %s && echo keep > %s/notes.txt", p, p);
    snprintf(args, sizeof args, "convert fixtures/bnb-nf4 %s --quiet", p);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 8);
    /* --force replaces our files but leaves the user's */
    snprintf(args, sizeof args, "convert fixtures/bnb-nf4 %s --quiet --force", p);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 0);
    assert_int_equal(tu_sh("test -e %s/notes.txt", p), 0);

    /* a budget too small for one row: exit 5 with the number that works */
    snprintf(args, sizeof args, "convert fixtures/mxfp4-tiny %s/o5 --mem 1K --quiet", tmp);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 5);
    assert_non_null(strstr(err, "--mem"));

    /* --device cuda without a GPU: exit 6 */
    if (bfs_cuda_device_count() == 0) {
        snprintf(args, sizeof args, "convert fixtures/bnb-nf4 %s/o6 --device cuda --quiet", tmp);
        assert_int_equal(tu_cli(NULL, args, err, sizeof err), 6);
        assert_int_equal(tu_count_lines(err), 1);
    }

    /* a world size larger than dim 0 works (ranks without rows get no entry) */
    snprintf(args, sizeof args, "convert fixtures/mxfp4-tiny %s/o7 --world-size 64 --quiet", tmp);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 0);
    snprintf(args, sizeof args, "verify %s/o7 --quiet", tmp);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 0);

    /* inspect, both forms */
    assert_int_equal(tu_cli(NULL, "inspect fixtures/mxfp4-tiny --world-size 4", NULL, 0), 0);
    assert_int_equal(tu_sh("%s inspect fixtures/bnb-nf4-dq --json | grep -q bnb-nf4-dq", tu_bfshard()), 0);

    /* a full disk: RLIMIT_FSIZE stands in; clear error, exit 4, no temp files */
    snprintf(args, sizeof args, "sh -c 'ulimit -f 64; exec %s convert fixtures/mxfp4-tiny %s/o8 --quiet' 2>%s/err8",
             tu_bfshard(), tmp, tmp);
    assert_int_equal(tu_sh("%s", args), 4);
    assert_int_equal(tu_sh("ls -A %s/o8 | grep -q partial", tmp), 1);

    tu_rmrf(tmp);
    free(tmp);
}

int main(void)
{
    signal(SIGXFSZ, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fixtures_all_world_sizes),
        cmocka_unit_test(levels_identical),
        cmocka_unit_test(groups_identical),
        cmocka_unit_test(ring_identical),
        cmocka_unit_test(group_units_interleaved),
        cmocka_unit_test(outputs_and_sums),
        cmocka_unit_test(verify_names_flipped_byte),
        cmocka_unit_test(interrupt_and_resume),
        cmocka_unit_test(cli_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
