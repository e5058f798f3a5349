/*
 * The side files of the input folder (src/input/sidefiles.c, src/commands/convert_side.c):
 * a folder laid out like Kimi-K2's repo (fixtures/kimi-k2-tiny) reaches the output byte for
 * byte, every copy hashed in the manifest and checked by verify; parts + merge and a resumed
 * run cover them; pack puts the license and card in doc layers and the code in code layers;
 * a hostile folder (links out, a FIFO, a huge file, control characters in a name, other
 * weights) is skipped with one line each and never read through a link; a Hugging Face
 * cache snapshot's links into its own blobs/ are read.
 */
#include "testutil.h"

#include <signal.h>
#include <stdio.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#define KIMI "fixtures/kimi-k2-tiny"
static const char *const kimi_side[] = {"LICENSE", "README.md", "configuration_deepseek.py", "modeling_deepseek.py",
                                        "tokenization_kimi.py", "tiktoken.model", "tokenizer_config.json",
                                        "generation_config.json"};
#define NSIDE (sizeof kimi_side / sizeof *kimi_side)

/* every side file of the fixture is in out, byte for byte, and a "copy" in its manifest */
static void assert_copied(const char *out)
{
    char mf[4096];
    snprintf(mf, sizeof mf, "%s/bfshard.manifest.json", out);
    char *m = tu_slurp(mf);
    assert_non_null(m);
    for (size_t i = 0; i < NSIDE; i++) {
        char needle[256];
        assert_int_equal(tu_sh("cmp -s '" KIMI "/%s' '%s/%s'", kimi_side[i], out, kimi_side[i]), 0);
        snprintf(needle, sizeof needle, "\"name\": \"%s\"", kimi_side[i]);
        const char *e = strstr(m, needle);
        assert_non_null(e);
        assert_non_null(strstr(e, "\"kind\": \"copy\""));
        /* the sums file lists it too */
        assert_int_equal(tu_sh("grep -q '  %s$' '%s/xxh128sums.txt'", kimi_side[i], out), 0);
    }
    free(m);
}

static void kimi_copied_hashed_verified(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("side");
    char args[8192], err[8192];
    snprintf(args, sizeof args, "convert " KIMI " %s/dcp -w 2 --device cpu", tmp);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 0);
    assert_non_null(strstr(err, "side files: 8 copied beside the weights, 0 skipped"));
    snprintf(args, sizeof args, "%s/dcp", tmp);
    assert_copied(args);
    snprintf(args, sizeof args, "verify %s/dcp", tmp);
    assert_int_equal(tu_cli(NULL, args, NULL, 0), 0);
    /* verify catches a changed copy */
    assert_int_equal(tu_sh("printf x >> '%s/dcp/LICENSE'", tmp), 0);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 7);
    assert_non_null(strstr(err, "LICENSE"));
    /* --layout hf: the same side files, with the index bfshard writes */
    snprintf(args, sizeof args, "convert " KIMI " %s/hf --layout hf --device cpu --sha256", tmp);
    assert_int_equal(tu_cli(NULL, args, NULL, 0), 0);
    snprintf(args, sizeof args, "%s/hf", tmp);
    assert_copied(args);
    assert_int_equal(tu_sh("cd '%s/hf' && sha256sum -c --quiet sha256sums.txt", tmp), 0);
    /* pack: license and card as doc layers, the code as code layers; the OCIDIR verifies */
    snprintf(args, sizeof args, "pack %s/hf %s/oci --tag t", tmp, tmp);
    assert_int_equal(tu_cli(NULL, args, NULL, 0), 0);
    snprintf(args, sizeof args, "verify %s/oci", tmp);
    assert_int_equal(tu_cli(NULL, args, NULL, 0), 0);
    static const char *const doc[] = {"LICENSE", "README.md"};
    static const char *const code[] = {"configuration_deepseek.py", "modeling_deepseek.py", "tokenization_kimi.py"};
    for (size_t i = 0; i < 2; i++)
        assert_int_equal(tu_sh("grep -rlq 'model.doc.v1.raw\",\"digest\":\"sha256:[0-9a-f]*\",\"size\":[0-9]*,"
                               "\"annotations\":{\"org.cncf.model.filepath\":\"%s\"' '%s/oci/blobs/sha256'",
                               doc[i], tmp), 0);
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(tu_sh("grep -rlq 'model.code.v1.raw\",\"digest\":\"sha256:[0-9a-f]*\",\"size\":[0-9]*,"
                               "\"annotations\":{\"org.cncf.model.filepath\":\"%s\"' '%s/oci/blobs/sha256'",
                               code[i], tmp), 0);
    assert_int_equal(tu_sh("grep -rlq 'weight.config.v1.raw\",\"digest\":\"sha256:[0-9a-f]*\",\"size\":[0-9]*,"
                           "\"annotations\":{\"org.cncf.model.filepath\":\"tiktoken.model\"' '%s/oci/blobs/sha256'",
                           tmp), 0);
    tu_rmrf(tmp);
    free(tmp);
}

static void parts_merge_and_resume_cover_them(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("side");
    char args[8192];
    for (int p = 0; p < 2; p++) {
        snprintf(args, sizeof args, "convert " KIMI " %s/p -w 2 --ranks %d --device cpu", tmp, p);
        assert_int_equal(tu_cli(NULL, args, NULL, 0), 0);
    }
    snprintf(args, sizeof args, "merge %s/p", tmp);
    assert_int_equal(tu_cli(NULL, args, NULL, 0), 0);
    snprintf(args, sizeof args, "%s/p", tmp);
    assert_copied(args);
    snprintf(args, sizeof args, "verify %s/p", tmp);
    assert_int_equal(tu_cli(NULL, args, NULL, 0), 0);
    /* a run killed as it copies the side files resumes: rank files reused, side files copied */
    char out[4096];
    snprintf(out, sizeof out, "%s/k", tmp);
    assert_int_equal(mkdir(out, 0755), 0);
    char *argv[] = {(char *)tu_bfshard(), "convert", KIMI, out, "-w", "2", "--device", "cpu", "--quiet", NULL};
    const int ifd = tu_watch(out, IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_DELETE);
    int rc = 0;
    const bool killed = tu_kill_on_event(ifd, tu_spawn(argv, NULL), ".LICENSE.partial", IN_CREATE, 600, &rc);
    close(ifd);
    if (killed)
        assert_int_equal(tu_sh("test -f '%s/.bfshard-inprogress' && test ! -f '%s/bfshard.manifest.json'", out, out), 0);
    assert_int_equal(tu_run(argv, NULL), 0);
    assert_copied(out);
    snprintf(args, sizeof args, "verify %s", out);
    assert_int_equal(tu_cli(NULL, args, NULL, 0), 0);
    /* a changed side file is a changed input: the rerun is not "nothing to do" but a new
     * conversion, refused on the finished OUTDIR without --force */
    assert_int_equal(tu_sh("cp -r " KIMI " '%s/in' && printf 'more\\n' >> '%s/in/LICENSE'", tmp, tmp), 0);
    snprintf(args, sizeof args, "convert %s/in %s/q -w 2 --device cpu", tmp, tmp);
    assert_int_equal(tu_cli(NULL, args, NULL, 0), 0);
    char err[8192];
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 0);
    assert_non_null(strstr(err, "nothing to do"));
    assert_int_equal(tu_sh("printf 'again\\n' >> '%s/in/LICENSE'", tmp), 0);
    assert_int_equal(tu_cli(NULL, args, NULL, 0), 8);
    snprintf(args, sizeof args, "convert %s/in %s/q -w 2 --device cpu --force", tmp, tmp);
    assert_int_equal(tu_cli(NULL, args, NULL, 0), 0);
    assert_int_equal(tu_sh("cmp -s '%s/in/LICENSE' '%s/q/LICENSE'", tmp, tmp), 0);
    tu_rmrf(tmp);
    free(tmp);
}

static void hostile_folder_skipped(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("side");
    char args[8192], err[16384];
    assert_int_equal(tu_sh("cp -r " KIMI " '%s/in' && cd '%s/in' && echo secret > ../secret && "
                           "ln -s ../secret NOTICE && ln -s /dev/zero zero.txt && ln -s ../in/LICENSE LICENSE-link && "
                           "mkfifo pipe && truncate -s 67108865 huge.txt && truncate -s 67108864 edge.txt && "
                           "touch \"$(printf 'bad\\033[31mname')\" && mkdir original && echo w > original/x && "
                           "touch pytorch_model.bin consolidated.safetensors.index.json quantize_config.json "
                           "weights.tar.gz .gitattributes", tmp, tmp), 0);
    snprintf(args, sizeof args, "convert %s/in %s/out -w 1 --device cpu", tmp, tmp);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 0);
    static const char *const lines[] = {
        "NOTICE: not copied: a symbolic link: never followed",
        "zero.txt: not copied: a symbolic link: never followed",
        "LICENSE-link: not copied: a symbolic link: never followed",
        "pipe: not copied: not a regular file",
        "warning: huge.txt: not copied: larger than the 64 MiB limit",
        "bad\\u001b[31mname: not copied: a name with control characters",
        "original: not copied: a folder",
        "pytorch_model.bin: not copied: weights",
        "consolidated.safetensors.index.json: not copied: an index",
        "quantize_config.json: not copied: the input's quantization config",
        "weights.tar.gz: not copied: an archive",
        ".gitattributes: not copied: a hidden name",
        "side files: 9 copied beside the weights, 12 skipped",
    };
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++)
        if (!strstr(err, lines[i]))
            fail_msg("no line \"%s\" in:\n%s", lines[i], err);
    assert_int_equal(tu_sh("cd '%s/out' && ! ls -A | grep -q -e NOTICE -e zero -e pipe -e huge -e bad -e original "
                           "-e pytorch -e consolidated -e quantize -e weights.tar -e LICENSE-link -e gitattributes", tmp),
                     0);
    assert_int_equal(tu_sh("cmp -s '%s/in/edge.txt' '%s/out/edge.txt'", tmp, tmp), 0); /* at the limit: copied */
    /* the manifest says what was skipped and why, the bad name escaped */
    assert_int_equal(tu_sh("python3 -c \"import json,sys; m=json.load(open('%s/out/bfshard.manifest.json')); "
                           "k={e['name']: e['why'] for e in m['skipped']}; "
                           "sys.exit(not (len(k)==12 and 'bad\\\\\\\\u001b[31mname' in k and 'NOTICE' in k))\"", tmp), 0);
    snprintf(args, sizeof args, "verify %s/out", tmp);
    assert_int_equal(tu_cli(NULL, args, NULL, 0), 0);
    tu_rmrf(tmp);
    free(tmp);
}

static void auto_map_file_missing_warned(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("side");
    char args[8192], err[8192];
    assert_int_equal(tu_sh("cp -r " KIMI " '%s/in' && cd '%s/in' && rm tokenization_kimi.py modeling_deepseek.py && "
                           "ln -s /dev/null modeling_deepseek.py", tmp, tmp), 0);
    snprintf(args, sizeof args, "convert %s/in %s/out --device cpu", tmp, tmp);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 0);
    assert_non_null(strstr(err, "warning: tokenizer_config.json: auto_map.AutoTokenizer names tokenization_kimi.py, "
                                "which is not in the input folder"));
    assert_non_null(strstr(err, "warning: config.json: auto_map.AutoModel names modeling_deepseek.py, which is "
                                "skipped"));
    tu_rmrf(tmp);
    free(tmp);
}

/* an input given as one weights file: of its folder (which may be ~/Downloads) only a model's
 * own files are copied; anything else is skipped, said in the log and the manifest */
static void one_file_input_copies_model_files_only(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("side");
    char args[8192], err[8192];
    assert_int_equal(tu_sh("cp -r " KIMI " '%s/in' && cd '%s/in' && echo private > notes.txt && echo x > invoice.csv",
                           tmp, tmp), 0);
    snprintf(args, sizeof args, "convert %s/in/model.safetensors %s/out --device cpu", tmp, tmp);
    assert_int_equal(tu_cli(NULL, args, err, sizeof err), 0);
    for (size_t i = 0; i < sizeof kimi_side / sizeof *kimi_side && kimi_side[i]; i++)
        assert_int_equal(tu_sh("cmp -s '%s/in/%s' '%s/out/%s'", tmp, kimi_side[i], tmp, kimi_side[i]), 0);
    assert_int_not_equal(tu_sh("test -e '%s/out/notes.txt' || test -e '%s/out/invoice.csv'", tmp, tmp), 0);
    assert_non_null(strstr(err, "notes.txt: not copied: the input is one weights file"));
    assert_int_equal(tu_sh("grep -q '\"invoice.csv\"' '%s/out/bfshard.manifest.json'", tmp), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* a Hugging Face cache snapshot: its files are links into the repo's blobs/; links out of
 * them (elsewhere, another repo's blobs) are not followed */
static void hf_cache_links_into_blobs(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("side");
    char args[8192], err[8192], pre[4200];
    assert_int_equal(tu_sh("R='%s/hub/models--org--kimi'; mkdir -p \"$R/blobs\" \"$R/snapshots/c0ffee\" \"$R/refs\" "
                           "'%s/hub/models--x--y/blobs' && printf c0ffee > \"$R/refs/main\" && "
                           "for f in " KIMI "/*; do h=$(sha256sum \"$f\" | cut -c1-40); cp \"$f\" \"$R/blobs/$h\"; "
                           "ln -s \"../../blobs/$h\" \"$R/snapshots/c0ffee/$(basename \"$f\")\"; done && "
                           "echo other > '%s/hub/models--x--y/blobs/o' && "
                           "ln -s ../../../models--x--y/blobs/o \"$R/snapshots/c0ffee/NOTICE\" && "
                           "ln -s /etc/hostname \"$R/snapshots/c0ffee/USE_POLICY\"", tmp, tmp, tmp), 0);
    snprintf(pre, sizeof pre, "HF_HUB_CACHE='%s/hub'", tmp);
    snprintf(args, sizeof args, "convert org/kimi -o %s/out -w 2 --device cpu", tmp);
    assert_int_equal(tu_cli(pre, args, err, sizeof err), 0);
    assert_non_null(strstr(err, "side files: 8 copied beside the weights, 2 skipped (a Hugging Face cache snapshot"));
    assert_non_null(strstr(err, "NOTICE: not copied: a symbolic link that does not resolve to a file of the cache's blobs/"));
    assert_non_null(strstr(err, "USE_POLICY: not copied: a symbolic link"));
    snprintf(args, sizeof args, "%s/out", tmp);
    assert_copied(args);
    assert_int_equal(tu_sh("test ! -L '%s/out/LICENSE'", tmp), 0);
    tu_rmrf(tmp);
    free(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kimi_copied_hashed_verified),
        cmocka_unit_test(parts_merge_and_resume_cover_them),
        cmocka_unit_test(hostile_folder_skipped),
        cmocka_unit_test(auto_map_file_missing_warned),
        cmocka_unit_test(hf_cache_links_into_blobs),
        cmocka_unit_test(one_file_input_copies_model_files_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
