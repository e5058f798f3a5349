/*
 * Trust: bfshard only ever deletes or replaces what it wrote,
 * and every command stops cleanly on a signal.
 *
 *   --force and resume leave files no manifest or journal of bfshard records; a foreign
 *       file where an output goes is an error naming it, and nothing is deleted;
 *   compress/decompress/extract: -o equal to the input (by any name) is refused, an
 *       existing destination survives a failed run;
 *   one writer per OUTDIR (a lock naming the holder's pid); compress OUTDIR resumes
 *       after kill -9;
 *   SIGINT/SIGTERM/SIGHUP stop every command with exit 9 and no temporary left (raised
 *       at a known point by the library's test hook, $BFSHARD_TEST_SIGNAL, or sent from
 *       here to a process blocked on a pipe we never read); a closed stdout is exit 4;
 *   a FIFO named like a rank file or an input never blocks a command (alarm() guard).
 */
#include "testutil.h"
#include "bfs_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define RANK1 "shard-00001-model-00001-of-00001.safetensors"
#define RANK2 "shard-00002-model-00001-of-00001.safetensors"
#define RANK3 "shard-00003-model-00001-of-00001.safetensors"

/* ---- running the CLI ---------------------------------------------------------------- */
static void convert_to(const char *out, const char *world, const char *extra)
{
    char *argv[] = {"bfshard", "convert", "fixtures/mxfp4-tiny", (char *)out, "--world-size", (char *)world,
                    "--device", "cpu", "--quiet", (char *)extra, NULL};
    assert_int_equal(tu_run(argv, NULL), 0);
}

static void alarm_guard(int s) { (void)s; fail_msg("a command blocked: the alarm() guard fired"); }

/* ---- --force, resume and foreign files ------------------------------------------------- */
static void force_leaves_foreign_files(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("tforce");
    char out[4096];
    snprintf(out, sizeof out, "%s/out", tmp);
    convert_to(out, "2", NULL);
    assert_int_equal(tu_sh("echo mine > '%s/notes.txt' && echo mine > '%s/other.safetensors' && "
                           "echo mine > '%s/.hidden.partial' && echo mine > '%s/my.model.partial'",
                           out, out, out, out), 0);
    /* another world size: bfshard's old files go (rank 2 of W=2 is not among W=1's outputs) */
    convert_to(out, "1", "--force");
    assert_int_equal(tu_sh("cd '%s' && grep -qx mine notes.txt && grep -qx mine other.safetensors && "
                           "grep -qx mine .hidden.partial && grep -qx mine my.model.partial", out), 0);
    assert_int_equal(tu_sh("test -e '%s/" RANK2 "'", out), 1);
    assert_int_equal(tu_sh("test -s '%s/" RANK1 "'", out), 0);
    tu_rmrf(tmp);
    free(tmp);
}

static int cancel_cb_bytes;
static void cancel_cb(const bfs_progress *p, void *u)
{
    (void)u;
    if (p->bytes_done >= (uint64_t)cancel_cb_bytes)
        bfs_cancel();
}

static void resume_leaves_foreign_files(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("tresume");
    char out[4096], ref[4096];
    snprintf(out, sizeof out, "%s/out", tmp);
    snprintf(ref, sizeof ref, "%s/ref", tmp);
    convert_to(ref, "3", NULL);
    /* interrupted after its first rank file (a clean stop leaves what kill -9 leaves, less
     * the temporaries), then the user drops files in; the same command resumes */
    bfs_convert_opts o;
    bfs_convert_opts_init(&o);
    o.world_size = 3;
    o.device = "cpu";
    o.mem = 64 << 10;
    o.progress = cancel_cb;
    cancel_cb_bytes = 150000;
    assert_int_equal(bfs_convert("fixtures/mxfp4-tiny", out, &o, NULL), BFS_EINTR);
    assert_int_equal(tu_sh("test -e '%s/.bfshard-inprogress'", out), 0);
    assert_int_equal(tu_sh("echo mine > '%s/notes.txt' && echo mine > '%s/weights.bin' && echo mine > '%s/x.safetensors.zst'",
                           out, out, out), 0);
    o.progress = NULL;
    bfs_convert_result res;
    bfs_convert_result_init(&res);
    assert_int_equal(bfs_convert("fixtures/mxfp4-tiny", out, &o, &res), 0);
    assert_true(res.files_reused >= 1);
    assert_int_equal(tu_sh("cd '%s' && grep -qx mine notes.txt && grep -qx mine weights.bin && grep -qx mine x.safetensors.zst", out), 0);
    for (const char *const *n = (const char *const[]){RANK1, RANK2, RANK3, "bfshard.manifest.json", NULL}; *n; n++)
        assert_int_equal(tu_sh("cmp -s '%s/%s' '%s/%s'", ref, *n, out, *n), 0);

    /* kill -9 (raised by the library right after the second temporary exists), files
     * dropped in, the same command: resumes, the files stay. One rank file at a time, the
     * first is committed by then; written as a group (units.h), none is yet. */
    for (int grouped = 0; grouped < 2; grouped++) {
        tu_rmrf(out);
        if (grouped)
            unsetenv("BFSHARD_GROUP");
        else
            setenv("BFSHARD_GROUP", "1", 1);
        char *argv[] = {"bfshard", "convert", "fixtures/mxfp4-tiny", out, "--world-size", "3", "--device", "cpu",
                        "--quiet", NULL};
        assert_int_equal(tu_run(argv, &(tu_proc){.env = "BFSHARD_TEST_SIGNAL=tmp:9:2"}), 1000 + SIGKILL);
        assert_int_equal(tu_sh("test -e '%s/.bfshard-inprogress'", out), 0);
        assert_int_equal(tu_sh("test -e '%s/" RANK1 "'", out), grouped);
        assert_int_equal(tu_sh("echo mine > '%s/notes.txt' && echo mine > '%s/README.md'", out, out), 0);
        assert_int_equal(tu_run(argv, NULL), 0);
        assert_int_equal(tu_sh("cd '%s' && grep -qx mine notes.txt && grep -qx mine README.md", out), 0);
        for (const char *const *n = (const char *const[]){RANK1, RANK2, RANK3, NULL}; *n; n++)
            assert_int_equal(tu_sh("cmp -s '%s/%s' '%s/%s'", ref, *n, out, *n), 0);
        assert_int_equal(tu_sh("test -e '%s/.bfshard.lock'", out), 1);
    }
    unsetenv("BFSHARD_GROUP");
    tu_rmrf(tmp);
    free(tmp);
}

static void foreign_file_where_an_output_goes(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("tforeign");
    char out[4096], err[4096];
    snprintf(out, sizeof out, "%s/out", tmp);
    snprintf(err, sizeof err, "%s/err", tmp);
    char *argv[] = {"bfshard", "convert", "fixtures/mxfp4-tiny", out, "--world-size", "3", "--device", "cpu",
                    "--quiet", "--force", NULL};
    /* the user's own config.json in a directory bfshard never wrote to */
    assert_int_equal(tu_sh("mkdir -p '%s' && echo '{\"mine\": 1}' > '%s/config.json' && echo mine > '%s/notes.txt'", out, out, out), 0);
    assert_int_equal(tu_run(argv, &(tu_proc){.errf = err}), 8);
    char *e = tu_slurp(err);
    if (!strstr(e, "config.json") || !strstr(e, "not written by bfshard"))
        fail_msg("the error does not name the foreign file: %s", e);
    free(e);
    assert_int_equal(tu_sh("test \"$(ls -A '%s' | tr '\\n' ' ')\" = 'config.json notes.txt ' && grep -q mine '%s/config.json'", out, out), 0);

    /* a rank file name no manifest records, beside a real W=2 output: nothing deleted */
    tu_rmrf(out);
    convert_to(out, "2", NULL);
    assert_int_equal(tu_sh("echo mine > '%s/" RANK3 "' && cd '%s' && ls -A | sort > ../before && md5sum * > ../sums", out, out), 0);
    assert_int_equal(tu_run(argv, &(tu_proc){.errf = err}), 8);
    e = tu_slurp(err);
    if (!strstr(e, RANK3))
        fail_msg("the error does not name %s: %s", RANK3, e);
    free(e);
    assert_int_equal(tu_sh("cd '%s' && ls -A | sort | cmp -s - ../before && md5sum -c --quiet ../sums", out), 0);
    assert_int_equal(bfs_verify(out, NULL, NULL), BFS_EVERIFY); /* the stray rank file is reported */
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- file commands: never the input, never the old destination before success --------- */
static void output_is_never_the_input(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("tsame");
    char out[4096];
    snprintf(out, sizeof out, "%s/o", tmp);
    convert_to(out, "1", NULL);
    const char *B = tu_bfshard();
    char abs[4096];
    assert_non_null(realpath(B, abs));
    assert_int_equal(tu_sh("cd '%s' && cp o/" RANK1 " m.safetensors && cp m.safetensors orig && ln -s m.safetensors link && "
                           "ln m.safetensors hard && '%s' compress m.safetensors -q && cp m.safetensors.zst z.orig",
                           tmp, abs), 0);
    static const char *const cmds[] = {
        "compress m.safetensors -o ./m.safetensors --force",
        "compress m.safetensors -o m.safetensors --force",
        "compress m.safetensors -o link --force",
        "compress m.safetensors -o hard --force",
        "compress ./m.safetensors -o \"$PWD/m.safetensors\" --force",
        "decompress m.safetensors.zst -o ./m.safetensors.zst --force",
        "extract m.safetensors.zst lm_head.weight -o ./m.safetensors.zst --force",
        "extract m.safetensors.zst lm_head.weight --raw -o m.safetensors.zst --force",
    };
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        const int rc = tu_sh("cd '%s' && '%s' %s -q 2>err", tmp, abs, cmds[i]);
        if (rc != 2)
            fail_msg("`bfshard %s`: exit %d, expected 2", cmds[i], rc);
        if (tu_sh("cd '%s' && grep -q 'is the input file' err && cmp -s m.safetensors orig && cmp -s m.safetensors.zst z.orig && "
                  "test -L link && ! ls -A | grep -q partial", tmp) != 0)
            fail_msg("`bfshard %s`: the input was touched, or the error does not say why", cmds[i]);
    }
    tu_rmrf(tmp);
    free(tmp);
}

static void failed_command_keeps_destination(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("tkeep");
    char out[4096], abs[4096];
    snprintf(out, sizeof out, "%s/o", tmp);
    convert_to(out, "1", NULL);
    assert_non_null(realpath(tu_bfshard(), abs));
    /* bad.zst: a frame's bytes flipped in the middle (its checksum fails) */
    assert_int_equal(tu_sh("cd '%s' && '%s' compress o/" RANK1 " -o good.zst -q && cp good.zst bad.zst && "
                           "printf '\\377\\377\\377\\377' | dd of=bad.zst bs=1 seek=$(( $(stat -c %%s bad.zst) / 2 )) conv=notrunc 2>/dev/null && "
                           "echo precious > dest && echo precious > dest2",
                           tmp, abs), 0);
    static const char *const cmds[] = {
        "extract bad.zst model.layers.0.mlp.experts.gate_up_proj -o dest --force",
        "extract good.zst no.such.tensor -o dest --force",
        "extract bad.zst model.layers.0.mlp.experts.gate_up_proj --raw -o dest --force",
        "decompress bad.zst -o dest --force",
        "compress dest2 -o dest --force", /* not a safetensors file */
    };
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        const int rc = tu_sh("cd '%s' && '%s' %s -q 2>/dev/null", tmp, abs, cmds[i]);
        if (rc != 3)
            fail_msg("`bfshard %s`: exit %d, expected 3", cmds[i], rc);
        if (tu_sh("cd '%s' && grep -qx precious dest && ! ls -A | grep -q partial", tmp) != 0)
            fail_msg("`bfshard %s` failed and did not leave the old destination alone", cmds[i]);
    }
    /* and a successful --force replaces it */
    assert_int_equal(tu_sh("cd '%s' && '%s' decompress good.zst -o dest --force && cmp -s dest o/" RANK1, tmp, abs), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- one writer per OUTDIR --------------------------------------------------------------- */
static void second_writer_is_refused(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("tlock");
    char out[4096], lock[4096], err[4096];
    snprintf(out, sizeof out, "%s/out", tmp);
    snprintf(lock, sizeof lock, "%s/.bfshard.lock", out);
    snprintf(err, sizeof err, "%s/err", tmp);
    convert_to(out, "2", NULL);
    /* we are the running bfshard: the lock held, our (made-up) pid in it */
    const int fd = open(lock, O_RDWR | O_CREAT, 0644);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
    assert_int_equal(write(fd, "424242\n", 7), 7);
    char *conv[] = {"bfshard", "convert", "fixtures/mxfp4-tiny", out, "--world-size", "3", "--device", "cpu",
                    "--quiet", "--force", NULL};
    char *comp[] = {"bfshard", "compress", out, "-q", NULL};
    char *const *cmds[] = {conv, comp};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(tu_run(cmds[i], &(tu_proc){.errf = err}), 8);
        char *e = tu_slurp(err);
        if (!strstr(e, "pid 424242"))
            fail_msg("%s: the error does not name the holder's pid: %s", cmds[i][1], e);
        free(e);
    }
    assert_int_equal(tu_sh("test -e '%s/" RANK2 "' && ! ls '%s' | grep -q zst", out, out), 0);
    assert_int_equal(bfs_verify(out, NULL, NULL), 0);
    /* released: both run */
    close(fd);
    assert_int_equal(tu_run(conv, &(tu_proc){.errf = err}), 0);
    assert_int_equal(tu_run(comp, &(tu_proc){.errf = err}), 0);
    assert_int_equal(tu_sh("test -e '%s'", lock), 1);
    tu_rmrf(tmp);
    free(tmp);
}

static void compress_outdir_resumes_after_kill9(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("tzresume");
    char out[4096], ref[4096], err[4096];
    snprintf(ref, sizeof ref, "%s/ref", tmp);
    snprintf(err, sizeof err, "%s/err", tmp);
    convert_to(ref, "3", NULL);
    char *zref[] = {"bfshard", "compress", ref, "-q", "--frame-size", "16K", NULL};
    assert_int_equal(tu_run(zref, NULL), 0);
    /* temporaries in order: rank 1's copy, the manifest recording it, rank 2's copy, ...
     * kill -9 right after each is created */
    for (int nth = 1; nth <= 5; nth++) {
        char env[64];
        snprintf(out, sizeof out, "%s/out%d", tmp, nth);
        convert_to(out, "3", NULL);
        char *z[] = {"bfshard", "compress", out, "--frame-size", "16K", NULL};
        snprintf(env, sizeof env, "BFSHARD_TEST_SIGNAL=tmp:9:%d", nth);
        assert_int_equal(tu_run(z, &(tu_proc){.env = env}), 1000 + SIGKILL);
        assert_int_equal(tu_run(z, &(tu_proc){.errf = err}), 0);
        if (nth >= 3) {
            char *e = tu_slurp(err);
            if (!strstr(e, "kept from the interrupted run"))
                fail_msg("kill -9 at temporary %d: the rerun did not keep rank 1's copy: %s", nth, e);
            free(e);
        }
        assert_int_equal(bfs_verify(out, NULL, NULL), 0);
        assert_int_equal(tu_sh("cd '%s' && ls -A | grep -v '^.bfshard' | sort > ../a && cd '%s' && ls -A | sort > ../b && cmp -s ../a ../b", out, ref), 0);
        for (const char *const *n = (const char *const[]){RANK1 ".zst", RANK2 ".zst", RANK3 ".zst", NULL}; *n; n++)
            assert_int_equal(tu_sh("cmp -s '%s/%s' '%s/%s'", ref, *n, out, *n), 0);
        assert_int_equal(tu_sh("cd '%s' && xxh128sum -c --quiet xxh128sums.txt && ! ls -A | grep -q 'inprogress\\|partial\\|lock'", out), 0);
    }
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- signals --------------------------------------------------------------------------------- */
static void every_command_stops_on_signals(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("tsig");
    char out[4096], z[4096], d[4096], e[4096], run_out[4096], err[4096];
    snprintf(out, sizeof out, "%s/o", tmp);
    snprintf(z, sizeof z, "%s/o/" RANK1 ".zst", tmp);
    snprintf(d, sizeof d, "%s/d.safetensors", tmp);
    snprintf(e, sizeof e, "%s/e.safetensors", tmp);
    snprintf(run_out, sizeof run_out, "%s/run", tmp);
    snprintf(err, sizeof err, "%s/err", tmp);
    convert_to(out, "1", NULL);
    char rank[4096];
    snprintf(rank, sizeof rank, "%s/" RANK1, out);
    char zsingle[4096];
    snprintf(zsingle, sizeof zsingle, "%s/single.zst", tmp);
    char *mk[] = {"bfshard", "compress", rank, "-o", zsingle, "-q", NULL};
    assert_int_equal(tu_run(mk, NULL), 0);
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (int si = 0; si < 3; si++) {
        char env[64], envh[64];
        snprintf(env, sizeof env, "BFSHARD_TEST_SIGNAL=tmp:%d", sigs[si]);
        snprintf(envh, sizeof envh, "BFSHARD_TEST_SIGNAL=hash:%d", sigs[si]);
        char *conv[] = {"bfshard", "convert", "fixtures/mxfp4-tiny", run_out, "--device", "cpu", "--quiet", NULL};
        char *compf[] = {"bfshard", "compress", rank, "-o", d, "-q", NULL};
        char *compd[] = {"bfshard", "compress", out, "-q", NULL};
        char *dec[] = {"bfshard", "decompress", zsingle, "-o", d, NULL};
        char *ext[] = {"bfshard", "extract", zsingle, "model.layers.0.mlp.experts.gate_up_proj", "-o", e, NULL};
        char *ver[] = {"bfshard", "verify", out, "-q", NULL};
        struct {
            char **argv;
            const char *env;
        } cmds[] = {{conv, env}, {compf, env}, {compd, env}, {dec, env}, {ext, env}, {ver, envh}};
        for (size_t c = 0; c < sizeof cmds / sizeof *cmds; c++) {
            tu_rmrf(run_out);
            const int rc = tu_run(cmds[c].argv, &(tu_proc){.env = cmds[c].env, .errf = err});
            char *msg = tu_slurp(err);
            if (rc != 9)
                fail_msg("%s, signal %d: exit %d, expected 9: %s", cmds[c].argv[1], sigs[si], rc, msg);
            if (!strstr(msg, "interrupted"))
                fail_msg("%s, signal %d: the error does not say interrupted: %s", cmds[c].argv[1], sigs[si], msg);
            free(msg);
            if (tu_dir_has(tmp, "partial") || tu_dir_has(out, "partial") || tu_dir_has(run_out, "partial"))
                fail_msg("%s, signal %d: a temporary file was left", cmds[c].argv[1], sigs[si]);
            if (tu_sh("test -e '%s' || test -e '%s' || test -e '%s' || test -e '%s/bfshard.manifest.json'", d, e, z, run_out) != 1)
                fail_msg("%s, signal %d: an output was committed after the signal", cmds[c].argv[1], sigs[si]);
            if (tu_sh("test -e '%s/.bfshard.lock' || test -e '%s/.bfshard.lock'", out, run_out) != 1)
                fail_msg("%s, signal %d: the lock file was left", cmds[c].argv[1], sigs[si]);
        }
    }
    /* the OUTDIR that was interrupted in compress still verifies */
    assert_int_equal(bfs_verify(out, NULL, NULL), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* A real signal from outside, to a process blocked writing to a pipe we never read: it
 * cannot finish before the signal, so no timing is involved. */
static void signal_while_blocked_on_stdout(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("tsigpipe");
    char out[4096], rank[4096], zf[4096], err[4096];
    snprintf(out, sizeof out, "%s/o", tmp);
    snprintf(rank, sizeof rank, "%s/" RANK1, out);
    snprintf(zf, sizeof zf, "%s/r.zst", tmp);
    snprintf(err, sizeof err, "%s/err", tmp);
    convert_to(out, "1", NULL);
    char *mk[] = {"bfshard", "compress", rank, "-o", zf, "-q", NULL};
    assert_int_equal(tu_run(mk, NULL), 0);
    struct stat sb;
    assert_int_equal(stat(rank, &sb), 0);
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (int si = 0; si < 3; si++) {
        for (int raw = 0; raw < 2; raw++) {
            int p[2];
            assert_int_equal(pipe(p), 0);
            fcntl(p[1], F_SETPIPE_SZ, 4096);
            const int cap = fcntl(p[1], F_GETPIPE_SZ);
            assert_true(cap > 0 && cap < 65536 / 2); /* the tensor is 64 KiB, the file more */
            char *dec[] = {"bfshard", "decompress", zf, "-o", "-", NULL};
            char *ext[] = {"bfshard", "extract", zf, "model.layers.0.mlp.experts.gate_up_proj", "--raw", "-o", "-", NULL};
            const pid_t pid = tu_spawn(raw ? ext : dec, &(tu_proc){.out_fd = p[1], .errf = err});
            close(p[1]);
            struct pollfd pf = {.fd = p[0], .events = POLLIN};
            assert_int_equal(poll(&pf, 1, 60000), 1); /* it runs (its handlers are installed) */
            kill(pid, sigs[si]);
            const int rc = tu_wait(pid);
            close(p[0]);
            if (rc != 9)
                fail_msg("%s to a full pipe, signal %d: exit %d, expected 9", raw ? "extract" : "decompress", sigs[si], rc);
        }
    }
    tu_rmrf(tmp);
    free(tmp);
}

static void closed_stdout_is_an_error(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("tepipe");
    char out[4096], err[4096], zf[4096], rank[4096];
    snprintf(out, sizeof out, "%s/o", tmp);
    snprintf(err, sizeof err, "%s/err", tmp);
    snprintf(zf, sizeof zf, "%s/r.zst", tmp);
    snprintf(rank, sizeof rank, "%s/" RANK1, out);
    convert_to(out, "1", NULL);
    char *mk[] = {"bfshard", "compress", rank, "-o", zf, "-q", NULL};
    assert_int_equal(tu_run(mk, NULL), 0);
    char *insp[] = {"bfshard", "inspect", "fixtures/mxfp4-tiny", NULL};
    char *inspj[] = {"bfshard", "inspect", "fixtures/bnb-nf4", "--json", NULL};
    char *ver[] = {"bfshard", "verify", out, "--json", "-q", NULL};
    char *dec[] = {"bfshard", "decompress", zf, "-o", "-", NULL};
    char *ext[] = {"bfshard", "extract", zf, "lm_head.weight", "-o", "-", NULL};
    char **cmds[] = {insp, inspj, ver, dec, ext};
    for (size_t c = 0; c < sizeof cmds / sizeof *cmds; c++) {
        int p[2];
        assert_int_equal(pipe(p), 0);
        close(p[0]); /* `| head -c0`, already gone */
        const int rc = tu_wait(tu_spawn(cmds[c], &(tu_proc){.out_fd = p[1], .errf = err}));
        close(p[1]);
        char *e = tu_slurp(err);
        if (rc != 4 || !strstr(e, "bfshard: error: ") || !strstr(e, "standard output") ||
            tu_sh("test $(grep -c . '%s') -eq 1", err) != 0)
            fail_msg("%s to a closed pipe: exit %d, expected 4 and one error line: %s", cmds[c][1], rc, e);
        free(e);
    }
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- FIFOs never block ------------------------------------------------------------------------- */
static void fifo_never_blocks(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("tfifo");
    char out[4096], rep[4096], err[4096];
    snprintf(out, sizeof out, "%s/o", tmp);
    snprintf(err, sizeof err, "%s/err", tmp);
    snprintf(rep, sizeof rep, "%s/rep", tmp);
    convert_to(out, "2", NULL);
    assert_int_equal(tu_sh("rm '%s/" RANK2 "' && mkfifo '%s/" RANK2 "'", out, out), 0);
    signal(SIGALRM, alarm_guard);
    alarm(120);
    /* verify: reported, exit 7 (in the library too) */
    FILE *r = fopen(rep, "w");
    assert_int_equal(bfs_verify(out, r, NULL), BFS_EVERIFY);
    fclose(r);
    char *t = tu_slurp(rep);
    if (!strstr(t, RANK2) || !strstr(t, "NOT A REGULAR FILE"))
        fail_msg("verify does not name the FIFO: %s", t);
    free(t);
    char *ver[] = {"bfshard", "verify", out, "-q", NULL};
    assert_int_equal(tu_run(ver, NULL), 7);
    /* compress OUTDIR and compress FILE: bad input, exit 3 */
    char *comp[] = {"bfshard", "compress", out, "-q", NULL};
    assert_int_equal(tu_run(comp, &(tu_proc){.errf = err}), 3);
    char f2[4096];
    snprintf(f2, sizeof f2, "%s/" RANK2, out);
    char *compf[] = {"bfshard", "compress", f2, "-o", "x.zst", "-q", NULL};
    assert_int_equal(tu_run(compf, NULL), 3);
    assert_int_equal(tu_sh("mkfifo '%s/f.zst'", tmp), 0);
    char fz[4096];
    snprintf(fz, sizeof fz, "%s/f.zst", tmp);
    char *dec[] = {"bfshard", "decompress", fz, "-o", "-", NULL};
    assert_int_equal(tu_run(dec, NULL), 3);
    /* a convert rerun: the same command finds the output changed (exit 8, needs --force);
     * --force replaces the FIFO, which its manifest records */
    char *conv[] = {"bfshard", "convert", "fixtures/mxfp4-tiny", out, "--world-size", "2", "--device", "cpu",
                    "--quiet", NULL, NULL};
    assert_int_equal(tu_run(conv, NULL), 8);
    conv[9] = "--force";
    assert_int_equal(tu_run(conv, NULL), 0);
    assert_int_equal(bfs_verify(out, NULL, NULL), 0);
    /* resuming an interrupted run whose rank file became a FIFO: rewritten */
    tu_rmrf(out);
    conv[9] = NULL;
    /* the 5th temporary: after both rank files and their slice indexes */
    assert_int_equal(tu_run(conv, &(tu_proc){.env = "BFSHARD_TEST_SIGNAL=tmp:9:5"}), 1000 + SIGKILL);
    assert_int_equal(tu_sh("test -f '%s/" RANK2 "' && rm '%s/" RANK2 "' && mkfifo '%s/" RANK2 "'", out, out, out), 0);
    assert_int_equal(tu_run(conv, NULL), 0);
    assert_int_equal(bfs_verify(out, NULL, NULL), 0);
    /* a FIFO under a temporary's name of ours: removed, never opened */
    tu_rmrf(out);
    assert_int_equal(tu_sh("mkdir '%s' && mkfifo '%s/." RANK1 ".partial'", out, out), 0);
    assert_int_equal(tu_run(conv, NULL), 0);
    assert_int_equal(bfs_verify(out, NULL, NULL), 0);
    alarm(0);
    signal(SIGALRM, SIG_DFL);
    tu_rmrf(tmp);
    free(tmp);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(force_leaves_foreign_files),
        cmocka_unit_test(resume_leaves_foreign_files),
        cmocka_unit_test(foreign_file_where_an_output_goes),
        cmocka_unit_test(output_is_never_the_input),
        cmocka_unit_test(failed_command_keeps_destination),
        cmocka_unit_test(second_writer_is_refused),
        cmocka_unit_test(compress_outdir_resumes_after_kill9),
        cmocka_unit_test(every_command_stops_on_signals),
        cmocka_unit_test(signal_while_blocked_on_stdout),
        cmocka_unit_test(closed_stdout_is_an_error),
        cmocka_unit_test(fifo_never_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
