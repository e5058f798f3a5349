/*
 * The fuzz_zst seed corpus (fuzz/corpus/zst, and fuzz/regress/zst
 * when present), replayed in `make test` through the public CLI only -- the zst code
 * is internal and changes; the CLI contract does not.
 *
 * Each corpus file is the fuzz target's input: one selector byte (bit 0: the file is
 * named .bfz instead of .zst) followed by the file. For every file:
 *   `bfshard decompress F -o OUT` and `bfshard extract F TENSOR -o OUT`
 * must end (timeout 60 s) with an exit code in the documented set for a file from a
 * stranger -- 0 ok, 3 bad input, 4 I/O, 5 memory/budget -- never a signal (a crash,
 * or a sanitizer abort under `make asan`), never 1 (internal error); a failure prints
 * a line on stderr; a success leaves the output file, and a failure leaves none.
 */
#include "testutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int allowed(int rc)
{
    return rc == 0 || rc == 3 || rc == 4 || rc == 5;
}

static int replay(const char *dir, const char *tmp)
{
    char **names = tu_dir_names(dir);
    int n = 0;
    for (size_t i = 0; names && names[i]; i++) {
        if (names[i][0] == '.')
            continue;
        char p[4096], f[4096], out[4096], errf[4096];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        size_t len = 0;
        uint8_t *b = tu_read_file(p, &len);
        if (!b || len < 1) {
            free(b);
            continue;
        }
        snprintf(f, sizeof f, "%s/f.safetensors.%s", tmp, (b[0] & 1) ? "bfz" : "zst");
        snprintf(out, sizeof out, "%s/out.safetensors", tmp);
        snprintf(errf, sizeof errf, "%s/err", tmp);
        tu_sh("rm -f '%s'/f.safetensors.* '%s' '%s'", tmp, out, errf);
        assert_int_equal(tu_write_file(f, b + 1, len - 1), 0);
        free(b);
        static const char *const cmds[] = {"decompress '%s' -o '%s'", "extract '%s' model.embed_tokens.weight -o '%s'"};
        for (size_t c = 0; c < sizeof cmds / sizeof *cmds; c++) {
            char args[8192], cmd[12288];
            snprintf(args, sizeof args, cmds[c], f, out);
            snprintf(cmd, sizeof cmd, "timeout -s KILL 60 %s %s --quiet >/dev/null 2>'%s' </dev/null", tu_bfshard(),
                     args, errf);
            unlink(out);
            const int rc = tu_sh("%s", cmd);
            struct stat sb;
            const int have_out = stat(out, &sb) == 0;
            size_t el = 0;
            uint8_t *err = tu_read_file(errf, &el);
            if (!allowed(rc))
                fail_msg("%s: `bfshard %s` exited %d%s: %.*s", p, args, rc,
                         rc == 137 || rc == 124 ? " (timed out or killed)" : rc > 128 ? " (signal)" : "", (int)el,
                         err ? (char *)err : "");
            if (rc != 0 && el == 0)
                fail_msg("%s: `bfshard %s` exited %d without a word on stderr", p, args, rc);
            if (rc == 0 && !have_out)
                fail_msg("%s: `bfshard %s` exited 0 but wrote no output", p, args);
            if (rc != 0 && have_out)
                fail_msg("%s: `bfshard %s` exited %d and left its output file", p, args, rc);
            free(err);
        }
        n++;
    }
    tu_names_free(names);
    return n;
}

static void zst_corpus_cli(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("zstcorpus");
    assert_non_null(tmp);
    const int a = replay("fuzz/corpus/zst", tmp);
    const int r = replay("fuzz/regress/zst", tmp);
    fprintf(stderr, "  fuzz_zst: %d seeds + %d regression inputs through decompress and extract\n", a, r);
    assert_true(a >= 10);
    tu_rmrf(tmp);
    free(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(zst_corpus_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
