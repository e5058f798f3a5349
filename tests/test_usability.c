/*
 * Using bfshard as its users do: a model named as in the Hugging Face cache
 * (a cache laid out exactly as huggingface_hub lays it out: blobs/, snapshots/COMMIT/
 * symlinks into ../../blobs, refs/main), the CLI's conventions (-V, -T, -o, -q, -v,
 * --progress[=json], the bar fitting the terminal and ending at 100%, the closing
 * summary), `inspect` of an OUTDIR and of a .zst, the manifest naming what made it, and
 * the public structs' size field (older and newer callers).
 */
#include "testutil.h"

#include "bfshard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COMMIT1 "1111111111111111111111111111111111111111"
#define COMMIT2 "2222222222222222222222222222222222222222"

/* hub/models--org--tiny as huggingface_hub writes it: revision main = COMMIT1 holds
 * fixtures/mxfp4-tiny, tag v2 = COMMIT2 holds fixtures/bnb-nf4. Blobs keep the
 * fixtures' mtimes (cp -p), which are part of the plan fingerprint (the weights'; side files
 * count by content); a blob both share (a tokenizer file) is written once, by the first, as
 * huggingface_hub downloads it once. */
static void make_cache(const char *hub)
{
    assert_int_equal(tu_sh("set -e; hub='%s'; r=\"$hub/models--org--tiny\"\n"
                           "mk() { mkdir -p \"$r/blobs\" \"$r/snapshots/$1\" \"$r/refs\"\n"
                           "  for f in \"$2\"/*; do b=$(sha256sum \"$f\" | cut -c1-64)\n"
                           "    [ -e \"$r/blobs/$b\" ] || cp -p \"$f\" \"$r/blobs/$b\"; ln -sf \"../../blobs/$b\" \"$r/snapshots/$1/$(basename \"$f\")\"\n"
                           "  done; printf %%s \"$1\" > \"$r/refs/$3\"; }\n"
                           "mk " COMMIT1 " fixtures/mxfp4-tiny main\n"
                           "mk " COMMIT2 " fixtures/bnb-nf4 v2\n"
                           "test -L \"$r/snapshots/" COMMIT1 "/config.json\"",
                           hub),
                     0);
}

static void test_hf_cache_input(void **s)
{
    (void)s;
    char *t = tu_tmpdir("hfcache");
    char env[4096], args[8192], err[8192];
    make_cache(t);
    snprintf(env, sizeof env, "HF_HUB_CACHE='%s' HF_HOME=/nonexistent", t);
    /* the repo id, the snapshot folder, the fixture itself: the same bytes, manifest included */
    snprintf(args, sizeof args, "convert org/tiny '%s/by-id' -w 2 --device cpu -q", t);
    assert_int_equal(tu_cli(env, args, err, sizeof err), 0);
    snprintf(args, sizeof args, "convert '%s/models--org--tiny/snapshots/" COMMIT1 "' '%s/by-snap' -w 2 --device cpu -q", t, t);
    assert_int_equal(tu_cli(env, args, err, sizeof err), 0);
    snprintf(args, sizeof args, "convert fixtures/mxfp4-tiny '%s/by-path' -w 2 --device cpu -q", t);
    assert_int_equal(tu_cli(env, args, err, sizeof err), 0);
    assert_int_equal(tu_sh("diff -r '%s/by-id' '%s/by-snap' >/dev/null && diff -r '%s/by-id' '%s/by-path' >/dev/null", t, t, t, t), 0);
    /* HF_HOME/hub, the models--org--tiny folder, --revision main and the commit hash */
    assert_int_equal(tu_sh("mkdir -p '%s/home' && ln -s .. '%s/home/hub'", t, t), 0);
    snprintf(env, sizeof env, "HF_HOME='%s/home'", t);
    snprintf(args, sizeof args, "convert org/tiny '%s/by-home' -w 2 --device cpu -q --revision=main", t);
    assert_int_equal(tu_cli(env, args, err, sizeof err), 0);
    snprintf(args, sizeof args, "convert '%s/models--org--tiny/' '%s/by-folder' -w 2 --device cpu -q", t, t);
    assert_int_equal(tu_cli("", args, err, sizeof err), 0);
    snprintf(args, sizeof args, "convert org/tiny '%s/by-commit' -w 2 --device cpu -q --revision " COMMIT1, t);
    assert_int_equal(tu_cli(env, args, err, sizeof err), 0);
    assert_int_equal(tu_sh("for d in by-home by-folder by-commit; do diff -r '%s/by-id' \"%s/$d\" >/dev/null || exit 1; done", t, t), 0);
    /* a tag: the other snapshot (the bnb-nf4 fixture) */
    snprintf(args, sizeof args, "convert org/tiny '%s/v2' --device cpu -q --revision v2", t);
    assert_int_equal(tu_cli(env, args, err, sizeof err), 0);
    snprintf(args, sizeof args, "convert fixtures/bnb-nf4 '%s/v2-path' --device cpu -q", t);
    assert_int_equal(tu_cli(env, args, err, sizeof err), 0);
    assert_int_equal(tu_sh("diff -r '%s/v2' '%s/v2-path' >/dev/null", t, t), 0);
    /* inspect takes the same names */
    assert_int_equal(tu_cli(env, "inspect org/tiny --revision v2", err, sizeof err), 0);

    /* not cached: exit 3, saying how to download it; nothing written */
    snprintf(args, sizeof args, "convert org/missing '%s/none' -q", t);
    assert_int_equal(tu_cli(env, args, err, sizeof err), 3);
    assert_non_null(strstr(err, "not in the Hugging Face cache"));
    assert_non_null(strstr(err, "hf download org/missing"));
    assert_int_not_equal(tu_sh("test -e '%s/none'", t), 0);
    /* a revision that is not cached: exit 3, naming what is */
    snprintf(args, sizeof args, "convert org/tiny '%s/none' -q --revision v9", t);
    assert_int_equal(tu_cli(env, args, err, sizeof err), 3);
    assert_non_null(strstr(err, "revision 'v9'"));
    assert_non_null(strstr(err, "refs: main, v2") ? strstr(err, "refs: main, v2") : strstr(err, "refs: v2, main"));
    /* --revision with a plain path is a usage error; a hostile revision too */
    snprintf(args, sizeof args, "convert fixtures/mxfp4-tiny '%s/none' -q --revision main", t);
    assert_int_equal(tu_cli(env, args, err, sizeof err), 2);
    snprintf(args, sizeof args, "convert org/tiny '%s/none' -q --revision ../../x", t);
    assert_int_equal(tu_cli(env, args, err, sizeof err), 2);

    /* the library call, as Python uses it */
    char out[4096];
    setenv("HF_HUB_CACHE", t, 1);
    assert_int_equal(bfs_hf_resolve("org/tiny", NULL, out, sizeof out), 0);
    assert_non_null(strstr(out, "/models--org--tiny/snapshots/" COMMIT1));
    assert_int_equal(bfs_hf_resolve("org/tiny", "v2", out, sizeof out), 0);
    assert_non_null(strstr(out, "/snapshots/" COMMIT2));
    assert_int_equal(bfs_hf_resolve("fixtures/bnb-nf4", NULL, out, sizeof out), 0);
    assert_string_equal(out, "fixtures/bnb-nf4");
    assert_int_equal(bfs_hf_resolve("org/nope", NULL, out, sizeof out), BFS_EINPUT);
    assert_int_equal(bfs_hf_resolve("org/tiny", NULL, out, 8), BFS_EUSAGE);
    unsetenv("HF_HUB_CACHE");
    tu_rmrf(t);
    free(t);
}

static void test_cli_conventions(void **s)
{
    (void)s;
    char *t = tu_tmpdir("cliconv");
    char args[8192], err[8192];
    /* -V: version and source revision, as the manifest records it */
    assert_int_equal(tu_sh("'%s' -V | grep -q '^bfshard %s (%s;'", tu_bfshard(), BFS_VERSION_STRING, bfs_build_revision()), 0);
    /* -o OUTDIR, -T N and -TN, --threads=N: the same bytes */
    snprintf(args, sizeof args, "convert fixtures/bnb-nf4 -o '%s/a' -w 2 -T 2 --device cpu -q", t);
    assert_int_equal(tu_cli("", args, err, sizeof err), 0);
    snprintf(args, sizeof args, "convert -T1 fixtures/bnb-nf4 '%s/b' -w 2 --device cpu -q", t);
    assert_int_equal(tu_cli("", args, err, sizeof err), 0);
    assert_int_equal(tu_sh("diff -r '%s/a' '%s/b' >/dev/null", t, t), 0);
    assert_int_equal(tu_sh("grep -q '\"revision\": \"%s\"' '%s/a/bfshard.manifest.json'", bfs_build_revision(), t), 0);
    snprintf(args, sizeof args, "convert fixtures/bnb-nf4 '%s/c' -o '%s/c'", t, t);
    assert_int_equal(tu_cli("", args, err, sizeof err), 2);
    assert_non_null(strstr(err, "given twice"));
    assert_int_equal(tu_cli("", "convert fixtures/bnb-nf4 x --progress=yes", err, sizeof err), 2);
    assert_int_equal(tu_cli("", "convert fixtures/bnb-nf4 x -T", err, sizeof err), 2);
    /* -q: nothing on stderr; default: the summary with the tensor counts */
    snprintf(args, sizeof args, "convert fixtures/mxfp4-tiny '%s/q' -w 2 --device cpu -q", t);
    assert_int_equal(tu_cli("", args, err, sizeof err), 0);
    assert_string_equal(err, "");
    snprintf(args, sizeof args, "convert fixtures/mxfp4-tiny '%s/d' -w 2 --device cpu --no-progress", t);
    assert_int_equal(tu_cli("", args, err, sizeof err), 0);
    assert_null(strstr(err, "%"));
    assert_non_null(strstr(err, "bfshard: 37 tensors: 4 dequantized, 1 cast, 32 copied, 4 dropped"));
    /* --json carries the counts */
    assert_int_equal(tu_sh("'%s' convert fixtures/mxfp4-tiny '%s/j' --device cpu -q --json | grep -q '\"tensors_dequantized\": 4, \"tensors_cast\": 1, \"tensors_copied\": 32, \"tensors_dropped\": 4'",
                           tu_bfshard(), t),
                     0);
    tu_rmrf(t);
    free(t);
}

/* --progress=json: one object per line, bytes only growing, the last at 100%. The bar
 * (forced with --progress; stderr is a file, so COLUMNS gives the width): every redraw
 * fits the width, a \r redraw on one line, 100% and a newline at the end. */
static void test_progress(void **s)
{
    (void)s;
    char *t = tu_tmpdir("progress");
    char args[8192];
    assert_int_equal(tu_sh("'%s' convert fixtures/mxfp4-tiny '%s/a' -w 3 --device cpu --mem 64K --progress=json 2>'%s/err'",
                           tu_bfshard(), t, t),
                     0);
    assert_int_equal(tu_sh("grep '^{\"progress\"' '%s/err' > '%s/p' && test $(wc -l < '%s/p') -ge 2 && "
                           "tail -1 '%s/p' | grep -q '\"percent\": 100.0' && "
                           "awk -F'\"bytes_done\": ' '{split($2, a, \",\"); if (a[1] + 0 < last) exit 1; last = a[1] + 0}' '%s/p' && "
                           "tail -1 '%s/p' | sed 's/.*\"bytes_done\": \\([0-9]*\\), \"bytes_total\": \\([0-9]*\\).*/\\1 \\2/' | "
                           "awk '{ exit !($1 == $2 && $1 > 0) }'",
                           t, t, t, t, t, t),
                     0);
    for (int cols = 80; cols >= 30; cols -= 50) {
        snprintf(args, sizeof args, "COLUMNS=%d '%s' convert fixtures/mxfp4-tiny '%s/b%d' -w 2 --device cpu --mem 64K --progress -v 2>'%s/bar%d'",
                 cols, tu_bfshard(), t, cols, t, cols);
        assert_int_equal(tu_sh("%s", args), 0);
        /* the bar's line: between the two log lines (side files, the plan) and the summary;
         * split at \r, strip ESC[K */
        assert_int_equal(tu_sh("f='%s/bar%d'; grep -c '^bfshard:' \"$f\" | grep -qx 3 && "
                               "sed -n '3p' \"$f\" | tr '\\r' '\\n' | sed 's/\\x1b\\[K$//' | "
                               "awk -v w=%d 'NF { n++; if (length($0) > w - 1) exit 1; last = $0 } END { exit !(n >= 2 && last ~ /100\\.0%%/) }'",
                               t, cols, cols),
                         0);
    }
    tu_rmrf(t);
    free(t);
}

static void test_inspect_outputs(void **s)
{
    (void)s;
    char *t = tu_tmpdir("inspectout");
    assert_int_equal(tu_sh("'%s' convert fixtures/mxfp4-tiny '%s/o' -w 2 --device cpu -q --compress zstd", tu_bfshard(), t), 0);
    assert_int_equal(tu_sh("'%s' inspect '%s/o' > '%s/txt' && grep -q 'bfshard output, made by bfshard %s (%s)' '%s/txt' && "
                           "grep -q '^tensors: 37 ' '%s/txt' && grep -q '^compressed: yes (2 file' '%s/txt' && "
                           "grep -q 'manifest seal ok' '%s/txt'",
                           tu_bfshard(), t, t, BFS_VERSION_STRING, bfs_build_revision(), t, t, t, t),
                     0);
    assert_int_equal(tu_sh("'%s' inspect '%s/o' --json | python3 -c 'import json,sys; d=json.load(sys.stdin); "
                           "assert d[\"kind\"] == \"bfshard-outdir\" and d[\"weights_files\"] == 2 and "
                           "d[\"formats\"][\"mxfp4\"] == 4 and d[\"compressed\"][\"state\"] == \"yes\" and d[\"hashes\"][\"shards\"] > 0, d'",
                           tu_bfshard(), t),
                     0);
    assert_int_equal(tu_sh("'%s' inspect '%s/o/shard-00001-model-00001-of-00001.safetensors.zst' > '%s/z' && "
                           "grep -q 'seekable zstd' '%s/z' && grep -q '^37 tensor(s)' '%s/z' && grep -q '^lm_head.weight ' '%s/z'",
                           tu_bfshard(), t, t, t, t, t),
                     0);
    assert_int_equal(tu_sh("'%s' inspect '%s/o/shard-00001-model-00001-of-00001.safetensors.zst' --json | python3 -c "
                           "'import json,sys; d=json.load(sys.stdin); assert d[\"frames\"] > 37 and len(d[\"tensors\"]) == 37 and d[\"ratio\"] > 1, d'",
                           tu_bfshard(), t),
                     0);
    tu_rmrf(t);
    free(t);
}

typedef struct {
    int calls;
    uint64_t last_done, last_total, max_done;
} prog_seen;

static void on_prog(const bfs_progress *p, void *user)
{
    prog_seen *ps = user;
    ps->calls++;
    assert_true(p->bytes_done >= ps->max_done && p->bytes_done <= p->bytes_total);
    ps->max_done = p->bytes_done;
    ps->last_done = p->bytes_done;
    ps->last_total = p->bytes_total;
}

/* The public structs' size: a caller built against an older header (a shorter struct)
 * gets the defaults for the rest and its result written only within its size; options
 * from a newer caller are taken when zero past our struct, refused when set. */
static void test_struct_sizes(void **s)
{
    (void)s;
    char *t = tu_tmpdir("abi");
    char out[4096];
    bfs_convert_opts o;
    bfs_convert_result r;
    prog_seen ps = {0};
    bfs_convert_opts_init(&o);
    assert_int_equal(o.size, sizeof o);
    o.device = "cpu";
    o.world_size = 2;
    o.mem = 64 << 10;
    o.progress = on_prog;
    o.progress_user = &ps;
    bfs_convert_result_init(&r);
    snprintf(out, sizeof out, "%s/a", t);
    assert_int_equal(bfs_convert("fixtures/mxfp4-tiny", out, &o, &r), 0);
    /* the library's last progress report: everything written */
    assert_true(ps.calls >= 2);
    assert_int_equal(ps.last_done, ps.last_total);
    assert_int_equal(ps.last_done, r.bytes_written);
    assert_int_equal(r.tensors, r.tensors_dequantized + r.tensors_cast + r.tensors_copied);
    assert_int_equal(r.tensors_dequantized, 4);

    /* size 0: not initialized */
    bfs_convert_opts z;
    memset(&z, 0, sizeof z);
    snprintf(out, sizeof out, "%s/z", t);
    assert_int_equal(bfs_convert("fixtures/mxfp4-tiny", out, &z, NULL), BFS_EUSAGE);
    bfs_convert_result rz;
    memset(&rz, 0, sizeof rz);
    assert_int_equal(bfs_convert("fixtures/mxfp4-tiny", out, &o, &rz), BFS_EUSAGE);

    /* an older caller: only up to world_size (the rest default: 1 rank... no, its 3 ranks,
     * device auto -> whatever; mem default) and a result that ends before `tensors` */
    bfs_convert_opts old;
    memset(&old, 0xff, sizeof old); /* garbage past its size must not be read */
    old.size = offsetof(bfs_convert_opts, world_size) + sizeof old.world_size;
    old.world_size = 3;
    unsigned char rbuf[sizeof(bfs_convert_result)];
    memset(rbuf, 0xee, sizeof rbuf);
    const size_t rsize = offsetof(bfs_convert_result, files_written);
    memcpy(rbuf, &rsize, sizeof rsize);
    snprintf(out, sizeof out, "%s/old", t);
    assert_int_equal(bfs_convert("fixtures/mxfp4-tiny", out, &old, (bfs_convert_result *)rbuf), 0);
    assert_int_equal(tu_sh("test -f '%s/old/shard-00003-model-00001-of-00001.safetensors'", t), 0);
    bfs_convert_result got;
    memcpy(&got, rbuf, sizeof got);
    assert_int_equal(got.bytes_written, r.bytes_written);
    for (size_t i = rsize; i < sizeof rbuf; i++)
        assert_int_equal(rbuf[i], 0xee);

    /* a newer caller: a bigger struct, zero past ours is fine, a set byte is refused */
    struct {
        bfs_convert_opts o;
        uint64_t future;
    } big;
    memset(&big, 0, sizeof big);
    bfs_convert_opts_init(&big.o);
    big.o.size = sizeof big;
    big.o.device = "cpu";
    snprintf(out, sizeof out, "%s/big", t);
    assert_int_equal(bfs_convert("fixtures/bnb-nf4", out, &big.o, NULL), 0);
    big.future = 1;
    big.o.force = 1;
    assert_int_equal(bfs_convert("fixtures/bnb-nf4", out, &big.o, NULL), BFS_EUSAGE);
    assert_non_null(strstr(bfs_last_error(), "does not know"));

    /* the compress structs likewise */
    bfs_compress_opts co;
    bfs_compress_result cr;
    bfs_compress_opts_init(&co);
    assert_int_equal(co.size, sizeof co);
    bfs_compress_result_init(&cr);
    snprintf(out, sizeof out, "%s/a", t);
    assert_int_equal(bfs_compress_outdir(out, &co, &cr), 0);
    assert_int_equal(cr.files, 2);
    co.size = 0;
    assert_int_equal(bfs_compress_outdir(out, &co, &cr), BFS_EUSAGE);
    tu_rmrf(t);
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hf_cache_input),   cmocka_unit_test(test_cli_conventions),
        cmocka_unit_test(test_progress),         cmocka_unit_test(test_inspect_outputs),
        cmocka_unit_test(test_struct_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
