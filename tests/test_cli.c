/*
 * The command line's option parser (src/cli/opts.c): "--opt=value" means "--opt value",
 * "--" ends the options (paths that begin with '-'), and usage errors keep their texts:
 * one "bfshard: error: ..." line, a blank line, the command's usage, exit code 2.
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Runs `bfshard ARGS` in dir; returns its exit code, its first stderr line in err. */
static int cli_in(const char *dir, const char *args, char *err, size_t cap)
{
    char cd[4200];
    snprintf(cd, sizeof cd, "cd '%s' &&", dir);
    const int rc = tu_cli(cd, args, err, cap);
    err[strcspn(err, "\n")] = '\0';
    return rc;
}

static int cli(const char *args, char *err, size_t cap)
{
    return cli_in(".", args, err, cap);
}

static void test_opt_equals_value(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("cliequals");
    char args[8192], err[4096];
    snprintf(args, sizeof args, "convert fixtures/mxfp4-tiny '%s/a' --world-size 2 --mxfp4-layout openai --device cpu --quiet", tmp);
    assert_int_equal(cli(args, err, sizeof err), 0);
    snprintf(args, sizeof args, "convert fixtures/mxfp4-tiny '%s/b' --world-size=2 --mxfp4-layout=openai --device=cpu --quiet", tmp);
    assert_int_equal(cli(args, err, sizeof err), 0);
    assert_int_equal(tu_sh("diff -r '%s/a' '%s/b' >/dev/null", tmp, tmp), 0);

    /* compress: --level=, --frame-size=, --output= (the long name of -o) */
    snprintf(args, sizeof args, "compress '%s/a/shard-00001-model-00001-of-00001.safetensors' --level 5 --frame-size 64K -o '%s/a.zst' -q", tmp, tmp);
    assert_int_equal(cli(args, err, sizeof err), 0);
    snprintf(args, sizeof args, "compress '%s/a/shard-00001-model-00001-of-00001.safetensors' --level=5 --frame-size=64K --output='%s/b.zst' -q", tmp, tmp);
    assert_int_equal(cli(args, err, sizeof err), 0);
    assert_int_equal(tu_sh("cmp -s '%s/a.zst' '%s/b.zst'", tmp, tmp), 0);

    /* a bad value names itself as before; a flag takes no value */
    assert_int_equal(cli("convert a b --world-size=0", err, sizeof err), 2);
    assert_string_equal(err, "bfshard: error: --world-size needs an integer from 1 to 1000000, got '0'");
    assert_int_equal(cli("convert a b --mem=12Q", err, sizeof err), 2);
    assert_string_equal(err, "bfshard: error: --mem needs a size like 512M or 2G");
    assert_int_equal(cli("convert a b --compress=zstd:0", err, sizeof err), 2);
    assert_string_equal(err, "bfshard: error: --compress: LEVEL must be a zstd level from -7 to 22 (not 0), got '0'");
    assert_int_equal(cli("convert a b --json=1", err, sizeof err), 2);
    assert_string_equal(err, "bfshard: error: unknown option '--json=1'");
    assert_int_equal(cli("compress a --levels=3", err, sizeof err), 2);
    assert_string_equal(err, "bfshard: error: unknown option '--levels=3'");
    tu_rmrf(tmp);
    free(tmp);
}

static void test_double_dash_ends_options(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("clidash");
    char err[4096];
    assert_int_equal(tu_sh("cp -r fixtures/bnb-nf4 '%s/-in'", tmp), 0);
    assert_int_equal(cli_in(tmp, "convert --quiet --world-size 2 -- -in -out", err, sizeof err), 0);
    assert_int_equal(cli_in(tmp, "verify -q -- -out", err, sizeof err), 0);
    assert_int_equal(tu_sh("test -s '%s/-out/bfshard.manifest.json'", tmp), 0);
    /* without "--" the same words are options */
    assert_int_equal(cli_in(tmp, "verify -q -out", err, sizeof err), 2);
    assert_string_equal(err, "bfshard: error: unknown option '-out'");
    /* after "--" everything is positional, --help too */
    assert_int_equal(cli_in(tmp, "verify -- -out --help", err, sizeof err), 2);
    assert_string_equal(err, "bfshard: error: unexpected argument '--help'");
    assert_int_equal(cli_in(tmp, "inspect -- --help", err, sizeof err), 3);
    tu_rmrf(tmp);
    free(tmp);
}

/* The texts of the usage errors, one per kind of option and of positional count. */
static void test_usage_errors(void **s)
{
    (void)s;
    static const char *const cases[][2] = {
        {"convert a", "needs INPUT and OUTDIR"},
        {"convert a b c", "unexpected argument 'c'"},
        {"convert a b --bogus", "unknown option '--bogus'"},
        {"convert a b -w x", "--world-size needs an integer from 1 to 1000000, got 'x'"},
        {"convert a b --threads", "--threads needs an integer, got ''"},
        {"convert a b --gpu-mem 0", "--gpu-mem needs a size like 512M or 2G"},
        {"convert a b --layout foo", "--layout must be dcp or hf, got 'foo'"},
        {"convert a b --mxfp4-layout", "--mxfp4-layout must be hf or openai, got ''"},
        {"convert a b --cpu-level avx", "--cpu-level must be scalar, avx2 or avx512, got 'avx'"},
        {"convert a b --device", "--device needs a value"},
        {"convert a b --compress lz4", "--compress must be zstd[:LEVEL] or zstd-bytegroup[:LEVEL], got 'lz4'"},
        {"convert a b -f", "unknown option '-f'"},
        {"verify", "needs a path"},
        {"compress a --threads 257", "--threads needs an integer from 0 to 256, got '257'"},
        {"compress a --frame-size 1023", "--frame-size needs a size of at least 1K, like 4M, got '1023'"},
        {"compress a --raw", "unknown option '--raw'"},
        {"decompress a -o", "-o needs a path"},
        {"decompress a --output", "--output needs a path"},
        {"decompress a --rm", "unknown option '--rm'"},
        {"extract a", "needs a file and a tensor name"},
        {"extract a b --bytegroup", "unknown option '--bytegroup'"},
    };
    char err[4096], want[4096];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(cli(cases[i][0], err, sizeof err), 2);
        snprintf(want, sizeof want, "bfshard: error: %s", cases[i][1]);
        assert_string_equal(err, want);
    }
    /* the usage follows the error after a blank line */
    assert_int_equal(tu_sh("%s extract a 2>&1 | sed -n 2,3p | grep -qx 'usage: bfshard extract.*'", tu_bfshard()), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opt_equals_value),
        cmocka_unit_test(test_double_dash_ends_options),
        cmocka_unit_test(test_usage_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
