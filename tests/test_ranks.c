/*
 * A conversion in parts (ISSUE 13), through the CLI with controlled environments:
 *
 *   parts given as --ranks lists, in any order, merged -> every file of OUTDIR (manifest
 *       and xxh128sums.txt included) byte-identical to one run; each part read only its
 *       rows of the input (plus headers) and the sources are hashed once in all;
 *   --ranks auto under Slurm, PMI, Open MPI, torchrun and Kubernetes variables -> the
 *       right block of ranks, the variables named in the log, threads divided by the
 *       local process count; merged -> identical;
 *   wrong combinations (a rank outside 0..W-1, P > W, no launcher, --parts without
 *       JOB_COMPLETION_INDEX, --layout hf, parts of other options or overlapping ranks in
 *       one OUTDIR, a missing part or foreign parts at merge) -> one line, distinct exit
 *       codes (2, 10, 11), no final manifest;
 *   verify of a node-local OUTDIR holding some parts -> checks them, names the rest;
 *   a part killed with SIGKILL when its first .partial appears, rerun, merged -> identical;
 *   parts and the OUTDIR lock (ISSUE 11): a part runs beside another part (the lock is
 *       shared), a whole run, merge and compress are refused while a part runs (exit 8,
 *       naming the pid), the same part twice is refused, a part never removes the user's
 *       file nor one where its output goes (--force included), nor another conversion's
 *       part that is being written; a killed part's tagged temporary is ours (merge
 *       removes it); merged -> identical, no lock file left.
 */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* every launcher variable unset: each test sets only its own */
#define CLEAN_ENV                                                                                                   \
    "env -u RANK -u WORLD_SIZE -u LOCAL_WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE "                \
    "-u OMPI_COMM_WORLD_LOCAL_SIZE -u PMI_RANK -u PMI_SIZE -u SLURM_PROCID -u SLURM_NTASKS "                        \
    "-u SLURM_NTASKS_PER_NODE -u JOB_COMPLETION_INDEX "

#define FX "fixtures/mxfp4-tiny" /* two input files */

static char *g_tmp;
static char g_out[4096], g_err[4096];

/* bfshard ARGS with environment ENV ("" for none); stdout to g_out, stderr to g_err. */
static int cli(const char *env, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cli(const char *env, const char *fmt, ...)
{
    char args[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return tu_sh(CLEAN_ENV "%s %s %s > '%s' 2> '%s'", env, tu_bfshard(), args, g_out, g_err);
}

/* the --json summary of the last command */
static json_t *last_json(void)
{
    char *s = tu_slurp(g_out);
    json_t *j = json_loads(s, 0, NULL);
    if (!j)
        fail_msg("not JSON on stdout: %s (stderr: %s)", s, tu_slurp(g_err));
    free(s);
    return j;
}

static uint64_t jint(const json_t *j, const char *k) { return (uint64_t)json_integer_value(json_object_get(j, k)); }

/* stderr of the last command is exactly one "bfshard: error: ..." line */
static void assert_one_line_error(const char *what)
{
    char *s = tu_slurp(g_err);
    int lines = 0;
    for (char *p = s; *p; p++)
        lines += *p == '\n';
    if (lines != 1 || strncmp(s, "bfshard: error: ", 16) != 0)
        fail_msg("%s: expected one error line, got: %s", what, s);
    free(s);
}

static bool exists(const char *dir, const char *name)
{
    char p[8192];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

static void assert_same_tree(const char *a, const char *b, const char *what)
{
    if (tu_sh("diff -r '%s' '%s' > /dev/null", a, b) != 0)
        fail_msg("%s: %s differs from the single run %s", what, b, a);
}

/* bytes of the headers (8 + header length) of every .safetensors file in dir */
static uint64_t header_bytes(const char *dir)
{
    uint64_t h = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    assert_non_null(d);
    while ((e = readdir(d)) != NULL) {
        const size_t n = strlen(e->d_name);
        if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors") != 0)
            continue;
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        const int fd = open(p, O_RDONLY);
        uint8_t b[8];
        assert_int_equal(read(fd, b, 8), 8);
        close(fd);
        uint64_t hl = 0;
        for (int i = 0; i < 8; i++)
            hl |= (uint64_t)b[i] << (8 * i);
        h += 8 + hl;
    }
    closedir(d);
    return h;
}

static uint64_t input_size(const char *dir)
{
    char cmd[8192], f[8192];
    snprintf(f, sizeof f, "%s/insize", g_tmp);
    snprintf(cmd, sizeof cmd, "cat '%s'/*.safetensors | wc -c > '%s'", dir, f);
    assert_int_equal(tu_sh("%s", cmd), 0);
    char *s = tu_slurp(f);
    const uint64_t v = strtoull(s, NULL, 10);
    free(s);
    return v;
}

static void whole_run(const char *fx, int W, const char *outdir)
{
    assert_int_equal(cli("", "convert %s '%s' --world-size %d --quiet --json", fx, outdir, W), 0);
}

/* ---- parts as lists ------------------------------------------------------------------------ */
static void lists_merge_identical(void **s)
{
    (void)s;
    char whole[4096], out[4096];
    snprintf(whole, sizeof whole, "%s/lists-whole", g_tmp);
    snprintf(out, sizeof out, "%s/lists-parts", g_tmp);
    whole_run(FX, 8, whole);
    json_t *jw = last_json();
    const uint64_t H = header_bytes(FX), whole_read = jint(jw, "input_bytes_read");
    assert_int_equal(jint(jw, "source_bytes_hashed"), input_size(FX));
    json_decref(jw);

    static const char *const parts[] = {"4-7", "0", "1-3"}; /* any order */
    uint64_t sum_read = 0, sum_hashed = 0;
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(cli("", "convert %s '%s' --world-size 8 --ranks %s --quiet --json", FX, out, parts[i]), 0);
        json_t *j = last_json();
        assert_string_equal(json_string_value(json_object_get(j, "ranks")), parts[i]);
        const uint64_t rd = jint(j, "input_bytes_read");
        const uint64_t hashed = jint(j, "source_bytes_hashed");
        json_decref(j);
        /* inspect --ranks tells the same bytes before the run */
        assert_int_equal(cli("", "inspect %s --world-size 8 --ranks %s --json", FX, parts[i]), 0);
        j = last_json();
        const json_t *jp = json_object_get(j, "part");
        assert_int_equal(jint(jp, "bytes_to_read"), rd);
        assert_int_equal(jint(jp, "source_bytes_to_hash"), hashed);
        assert_int_equal(json_array_size(json_object_get(j, "outputs")), i == 0 ? 4 : i == 1 ? 1 : 3);
        /* a part reads its rows of the input and the headers, never more than the whole run */
        assert_true(rd >= H && rd < whole_read);
        sum_read += rd - H;
        sum_hashed += hashed;
        json_decref(j);
        assert_false(exists(out, "bfshard.manifest.json"));
    }
    /* the parts' rows add up to the whole run's: nothing read twice */
    assert_int_equal(sum_read, whole_read - H);
    /* each source file hashed by one part */
    assert_int_equal(sum_hashed, input_size(FX));

    assert_int_equal(cli("", "merge '%s'", out), 0);
    assert_false(exists(out, "bfshard.part-0.json"));
    assert_same_tree(whole, out, "three parts merged");
    assert_int_equal(cli("", "verify '%s' --quiet", out), 0);
    /* merge again: nothing to do */
    assert_int_equal(cli("", "merge '%s'", out), 0);
    assert_same_tree(whole, out, "merged twice");
}

/* ---- --ranks auto under each launcher ----------------------------------------------------------- */
static void auto_launchers(void **s)
{
    (void)s;
    char whole[4096], out[4096], env[512];
    snprintf(whole, sizeof whole, "%s/auto-whole", g_tmp);
    whole_run(FX, 8, whole);
    static const struct {
        const char *name, *fmt, *extra;
    } L[] = {
        {"slurm", "SLURM_PROCID=%d SLURM_NTASKS=4", ""},
        {"pmi", "PMI_RANK=%d PMI_SIZE=4", ""},
        {"ompi", "OMPI_COMM_WORLD_RANK=%d OMPI_COMM_WORLD_SIZE=4", ""},
        {"torchrun", "RANK=%d WORLD_SIZE=4", ""},
        {"k8s", "JOB_COMPLETION_INDEX=%d", "--parts 4"},
    };
    static const char *const want[] = {"0-1", "2-3", "4-5", "6-7"};
    for (size_t l = 0; l < sizeof L / sizeof *L; l++) {
        snprintf(out, sizeof out, "%s/auto-%s", g_tmp, L[l].name);
        for (int p = 3; p >= 0; p--) {
            snprintf(env, sizeof env, L[l].fmt, p);
            assert_int_equal(cli(env, "convert %s '%s' --world-size 8 --ranks auto %s --json", FX, out, L[l].extra), 0);
            json_t *j = last_json();
            if (strcmp(json_string_value(json_object_get(j, "ranks")), want[p]) != 0)
                fail_msg("%s, process %d of 4: ranks %s, want %s", L[l].name, p,
                         json_string_value(json_object_get(j, "ranks")), want[p]);
            json_decref(j);
            /* the log names the variables it used */
            char *e = tu_slurp(g_err), first[64];
            snprintf(first, sizeof first, "%.*s", (int)strcspn(env, " "), env);
            if (!strstr(e, first))
                fail_msg("%s: the log does not name %s: %s", L[l].name, first, e);
            free(e);
        }
        assert_int_equal(cli("", "merge '%s' --quiet", out), 0);
        assert_same_tree(whole, out, L[l].name);
    }

    /* torchrun inside a Slurm allocation: torchrun's RANK wins */
    snprintf(out, sizeof out, "%s/auto-nested", g_tmp);
    assert_int_equal(cli("SLURM_PROCID=0 SLURM_NTASKS=1 RANK=3 WORLD_SIZE=4",
                         "convert %s '%s' --world-size 8 --ranks auto --quiet --json", FX, out), 0);
    json_t *j = last_json();
    assert_string_equal(json_string_value(json_object_get(j, "ranks")), "6-7");
    json_decref(j);

    /* several processes per node: the default threads divide the node's CPUs */
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN), want_threads = ncpu / 2 > 1 ? ncpu / 2 : 1;
    snprintf(out, sizeof out, "%s/auto-local", g_tmp);
    assert_int_equal(cli("RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2", "convert %s '%s' --world-size 8 --ranks auto", FX, out), 0);
    char *e = tu_slurp(g_err), t[64];
    snprintf(t, sizeof t, "threads %ld;", want_threads);
    if (!strstr(e, t))
        fail_msg("LOCAL_WORLD_SIZE=2 on %ld CPUs: expected \"%s\" in the log: %s", ncpu, t, e);
    free(e);
}

/* ---- wrong combinations ---------------------------------------------------------------------------- */
static void expect_fail(int rc, int want, const char *outdir, const char *what)
{
    if (rc != want)
        fail_msg("%s: exit %d, want %d (%s)", what, rc, want, tu_slurp(g_err));
    assert_one_line_error(what);
    assert_false(exists(outdir, "bfshard.manifest.json"));
}

static void wrong_combinations(void **s)
{
    (void)s;
    char out[4096], other[4096];
    snprintf(out, sizeof out, "%s/bad", g_tmp);
    static const struct {
        const char *env, *args, *what;
    } usage[] = {
        {"", "--ranks 8", "a rank outside 0..W-1"},
        {"", "--ranks 3-1", "a reversed range"},
        {"", "--ranks 0,0", "a rank twice"},
        {"", "--ranks x", "not a list"},
        {"SLURM_PROCID=0 SLURM_NTASKS=16", "--ranks auto", "P > W"},
        {"SLURM_PROCID=4 SLURM_NTASKS=4", "--ranks auto", "p outside 0..P-1"},
        {"SLURM_PROCID=1", "--ranks auto", "SLURM_NTASKS missing"},
        {"PMI_RANK=x PMI_SIZE=2", "--ranks auto", "PMI_RANK not a number"},
        {"", "--ranks auto", "no launcher"},
        {"JOB_COMPLETION_INDEX=1", "--ranks auto", "JOB_COMPLETION_INDEX without --parts"},
        {"", "--ranks auto --parts 4", "--parts without JOB_COMPLETION_INDEX"},
        {"JOB_COMPLETION_INDEX=4", "--ranks auto --parts 4", "index outside --parts"},
        {"JOB_COMPLETION_INDEX=0", "--ranks auto --parts 9", "--parts > W"},
        {"", "--ranks 0-1 --parts 2", "--parts with a list"},
    };
    for (size_t i = 0; i < sizeof usage / sizeof *usage; i++)
        expect_fail(cli(usage[i].env, "convert %s '%s' --world-size 8 %s --quiet", FX, out, usage[i].args), 2, out,
                    usage[i].what);
    expect_fail(cli("", "convert %s '%s' --layout hf --ranks 0 --quiet", FX, out), 2, out, "--layout hf");

    /* parts of different options in one OUTDIR */
    assert_int_equal(cli("", "convert %s '%s' --world-size 8 --ranks 0-3 --quiet", FX, out), 0);
    expect_fail(cli("", "convert %s '%s' --world-size 8 --ranks 4-7 --keep-dtype --quiet", FX, out), 10, out,
                "other options in one OUTDIR");
    expect_fail(cli("", "convert %s '%s' --world-size 4 --ranks 0-1 --quiet", FX, out), 10, out,
                "other world size in one OUTDIR");
    /* overlapping ranks */
    expect_fail(cli("", "convert %s '%s' --world-size 8 --ranks 2-5 --quiet", FX, out), 10, out, "overlapping parts");
    /* a missing part at merge */
    expect_fail(cli("", "merge '%s'", out), 11, out, "a missing part");
    /* parts of another input at merge (copied in by hand) */
    snprintf(other, sizeof other, "%s/bad-other", g_tmp);
    assert_int_equal(cli("", "convert fixtures/bnb-nf4 '%s' --world-size 8 --ranks 4-7 --quiet", other), 0);
    assert_int_equal(tu_sh("cp '%s/bfshard.part-4-7.json' '%s/'", other, out), 0);
    expect_fail(cli("", "merge '%s'", out), 10, out, "parts of different inputs at merge");
    /* a rank in two parts at merge */
    assert_int_equal(tu_sh("rm '%s/bfshard.part-4-7.json'", out), 0);
    tu_rmrf(other);
    assert_int_equal(cli("", "convert %s '%s' --world-size 8 --ranks 3-7 --quiet", FX, other), 0);
    assert_int_equal(tu_sh("cp '%s/bfshard.part-3-7.json' '%s/'", other, out), 0);
    expect_fail(cli("", "merge '%s'", out), 10, out, "a rank in two parts at merge");
    /* a rank file gone after its part finished */
    assert_int_equal(tu_sh("rm '%s/bfshard.part-3-7.json'", out), 0);
    assert_int_equal(cli("", "convert %s '%s' --world-size 8 --ranks 4-7 --quiet", FX, out), 0);
    assert_int_equal(tu_sh("rm '%s/shard-00006-model-00001-of-00001.safetensors'", out), 0);
    expect_fail(cli("", "merge '%s'", out), 11, out, "a rank file gone");
    /* a whole run's OUTDIR is not a part's */
    tu_rmrf(other);
    whole_run(FX, 8, other);
    expect_fail(cli("", "convert %s '%s' --world-size 8 --ranks 0-3 --keep-dtype --quiet", FX, other), 10, g_tmp,
                "a part into another conversion's OUTDIR");
}

/* ---- node-local OUTDIRs: partial verify, idempotent parts ------------------------------------------- */
static void node_local_verify(void **s)
{
    (void)s;
    char whole[4096], a[4096], b[4096];
    snprintf(whole, sizeof whole, "%s/node-whole", g_tmp);
    snprintf(a, sizeof a, "%s/node-a", g_tmp);
    snprintf(b, sizeof b, "%s/node-b", g_tmp);
    whole_run(FX, 8, whole);
    assert_int_equal(cli("", "convert %s '%s' --world-size 8 --ranks 0-3 --quiet", FX, a), 0);
    assert_int_equal(cli("", "convert %s '%s' --world-size 8 --ranks 4-7 --quiet", FX, b), 0);
    assert_int_equal(cli("", "verify '%s'", a), 0);
    char *e = tu_slurp(g_err);
    if (!strstr(e, "ranks 4-7 are elsewhere"))
        fail_msg("partial verify does not name the ranks elsewhere: %s", e);
    free(e);
    assert_int_equal(cli("", "verify '%s' --quiet", b), 0);
    /* the same part again: nothing to do */
    assert_int_equal(cli("", "convert %s '%s' --world-size 8 --ranks 0-3 --quiet --json", FX, a), 0);
    json_t *j = last_json();
    assert_int_equal(jint(j, "files_written"), 0);
    json_decref(j);
    /* a flipped byte in a present rank file: exit 7 */
    assert_int_equal(tu_sh("cp -r '%s' '%s-bad' && printf 'X' | dd of='%s-bad/shard-00002-model-00001-of-00001.safetensors' "
                           "bs=1 seek=4000 conv=notrunc 2>/dev/null", a, a, a), 0);
    char bad[4200];
    snprintf(bad, sizeof bad, "%s-bad", a);
    assert_int_equal(cli("", "verify '%s'", bad), 7);
    /* gather the node-local parts on one file system, merge */
    assert_int_equal(tu_sh("cp '%s'/shard-0000[5-8]-* '%s'/bfshard.part-4-7.json '%s'/", b, b, a), 0);
    assert_int_equal(cli("", "merge '%s' --quiet", a), 0);
    assert_same_tree(whole, a, "two node-local OUTDIRs gathered and merged");
}

/* ---- SIGKILL a part; rerun; merge -------------------------------------------------------------------- */
/* Run `bfshard convert IN OUT --world-size 4 --ranks RANKS`; SIGKILL it when `name` is
 * created in OUT. True when the kill landed before it finished. */
static bool kill_part_on_create(const char *in, const char *out, const char *ranks, const char *name)
{
    mkdir(out, 0755);
    const int ifd = tu_watch(out, IN_CREATE);
    char *argv[] = {"bfshard", "convert", (char *)in, (char *)out, "--world-size", "4", "--ranks", (char *)ranks,
                    "--device", "cpu", "--threads", "1", "--mem", "4M", "--quiet", NULL};
    int rc;
    const bool killed = tu_kill_on_event(ifd, tu_spawn(argv, NULL), name, IN_CREATE, 120, &rc);
    close(ifd);
    return killed && rc == 1000 + SIGKILL;
}

static void sigkill_part_resume(void **s)
{
    (void)s;
    char in[4096], whole[4096], out[4096];
    snprintf(in, sizeof in, "%s/kill-in", g_tmp);
    snprintf(whole, sizeof whole, "%s/kill-whole", g_tmp);
    snprintf(out, sizeof out, "%s/kill-out", g_tmp);
    assert_int_equal(mkdir(in, 0755), 0);
    tu_gen_mxfp4(in, 8, 4, false); /* 4 layers of experts [8, 256, 90, 16] (~3 MB each) */
    assert_int_equal(cli("", "convert '%s' '%s' --world-size 4 --quiet", in, whole), 0);

    /* the other part runs first, to the end */
    assert_int_equal(cli("", "convert '%s' '%s' --world-size 4 --ranks 0-1 --quiet", in, out), 0);
    /* part 2-3: killed when its first .partial appears, then when its second rank's does */
    assert_true(kill_part_on_create(in, out, "2-3", ".shard-00003-model-00001-of-00001.safetensors.partial"));
    assert_false(exists(out, "bfshard.part-2-3.json"));
    assert_true(kill_part_on_create(in, out, "2-3", ".shard-00004-model-00001-of-00001.safetensors.partial"));
    assert_true(exists(out, "shard-00003-model-00001-of-00001.safetensors"));
    /* merge now: rank 2-3's part is unfinished */
    expect_fail(cli("", "merge '%s'", out), 11, out, "merge with a killed part");
    /* rerun: rank 2's file is reused */
    assert_int_equal(cli("", "convert '%s' '%s' --world-size 4 --ranks 2-3 --quiet --json", in, out), 0);
    json_t *j = last_json();
    assert_int_equal(jint(j, "files_reused"), 1);
    assert_int_equal(jint(j, "files_written"), 1);
    json_decref(j);
    assert_int_equal(cli("", "merge '%s' --quiet", out), 0);
    assert_same_tree(whole, out, "a part killed twice, rerun, merged");
}

/* ---- parts and the OUTDIR lock, ownership (ISSUE 11 x ISSUE 13) ---------------------------------- */
/* Pretend to be a running bfshard: hold dir/name locked (op) with our made-up pid in it. */
static int hold_lock(const char *dir, const char *name, int op, const char *pid)
{
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    const int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, op | LOCK_NB), 0);
    assert_int_equal(ftruncate(fd, 0), 0);
    assert_int_equal(pwrite(fd, pid, strlen(pid), 0), (ssize_t)strlen(pid));
    return fd;
}

static void expect_err(int rc, int want, const char *needle, const char *what)
{
    char *e = tu_slurp(g_err);
    if (rc != want || !strstr(e, needle))
        fail_msg("%s: exit %d, want %d naming \"%s\": %s", what, rc, want, needle, e);
    free(e);
}

#define R3 "shard-00003-model-00001-of-00001.safetensors" /* rank 2 of --world-size 4 */

static void parts_and_the_lock(void **s)
{
    (void)s;
    char whole[4096], out[4096], out2[4096];
    snprintf(whole, sizeof whole, "%s/lk-whole", g_tmp);
    snprintf(out, sizeof out, "%s/lk", g_tmp);
    snprintf(out2, sizeof out2, "%s/lk2", g_tmp);
    assert_int_equal(cli("", "convert %s '%s' --world-size 4 --quiet", FX, whole), 0);
    assert_int_equal(mkdir(out, 0755), 0);

    /* another part is running (it holds the OUTDIR lock shared): this part runs beside it */
    const int sh = hold_lock(out, ".bfshard.lock", LOCK_SH, "515151\n");
    assert_int_equal(cli("", "convert %s '%s' --world-size 4 --ranks 0-1 --quiet", FX, out), 0);
    /* while a part runs: no whole run, no merge, no compress OUTDIR */
    expect_err(cli("", "convert %s '%s' --world-size 4 --force --quiet", FX, out), 8, "pid 515151",
               "a whole run beside a running part");
    expect_err(cli("", "merge '%s' --quiet", out), 8, "pid 515151", "merge beside a running part");
    assert_true(exists(out, "bfshard.part-0-1.json"));
    /* the same part twice at once */
    int pl = hold_lock(out, ".bfshard.lock-2-3", LOCK_EX, "616161\n");
    expect_err(cli("", "convert %s '%s' --world-size 4 --ranks 2-3 --quiet", FX, out), 8, "pid 616161",
               "the same part twice");
    close(pl);
    /* the user's file beside the parts: refused without --force; --force writes beside it */
    assert_int_equal(tu_sh("echo precious > '%s/notes.txt'", out), 0);
    expect_err(cli("", "convert %s '%s' --world-size 4 --ranks 2-3 --quiet", FX, out), 8, "notes.txt",
               "a part beside the user's file");
    /* a killed part's temporary of a file parts share (tagged with its pid): ours */
    assert_int_equal(tu_sh("echo junk > '%s/.config.json.99999.partial'", out), 0);
    assert_int_equal(cli("", "convert %s '%s' --world-size 4 --ranks 2-3 --force --quiet", FX, out), 0);
    assert_int_equal(tu_sh("grep -qx precious '%s/notes.txt'", out), 0);
    assert_true(exists(out, "bfshard.part-0-1.json")); /* the other part's files stay */
    assert_false(exists(out, ".bfshard.lock-2-3"));
    assert_true(exists(out, ".bfshard.lock")); /* still held (shared) by the "other part" */
    close(sh);
    assert_int_equal(tu_sh("rm '%s/notes.txt'", out), 0);
    assert_int_equal(cli("", "merge '%s' --quiet", out), 0);
    assert_same_tree(whole, out, "parts beside a running part, merged"); /* no lock, no temporary left */

    /* a file bfshard did not write where a part's output goes: refused, --force or not */
    assert_int_equal(mkdir(out2, 0755), 0);
    assert_int_equal(tu_sh("echo precious > '%s/" R3 "'", out2), 0);
    expect_err(cli("", "convert %s '%s' --world-size 4 --ranks 2-3 --force --quiet", FX, out2), 8, R3,
               "a part over the user's file");
    assert_int_equal(tu_sh("grep -qx precious '%s/" R3 "'", out2), 0);
    assert_int_equal(tu_sh("rm '%s/" R3 "'", out2), 0);
    /* another conversion's part, being written now: --force does not remove it */
    assert_int_equal(cli("", "convert %s '%s' --world-size 4 --ranks 0-1 --keep-dtype --quiet", FX, out2), 0);
    pl = hold_lock(out2, ".bfshard.lock-0-1", LOCK_EX, "717171\n");
    expect_err(cli("", "convert %s '%s' --world-size 4 --ranks 2-3 --force --quiet", FX, out2), 8,
               "bfshard.part-0-1.json", "--force over a part being written");
    assert_true(exists(out2, "bfshard.part-0-1.json"));
    close(pl);
    /* finished (its lock free): --force replaces that conversion's part */
    assert_int_equal(cli("", "convert %s '%s' --world-size 4 --ranks 2-3 --force --quiet", FX, out2), 0);
    assert_false(exists(out2, "bfshard.part-0-1.json"));
}

/* Two overlapping parts started at the same moment: each scans OUTDIR before the other's
 * journal is there. Part 1-2 is stopped (SIGSTOP from the library's test hook) between its
 * scan and its journal; part 0-1 runs from start to end meanwhile; then 1-2 goes on: it must
 * see 0-1 after publishing its own journal, stop with exit 10, and leave nothing behind. */
static void parts_started_together(void **s)
{
    (void)s;
    char whole[4096], out[4096], errb[4096], r2[8192], r2w[8192];
    snprintf(whole, sizeof whole, "%s/lk-whole", g_tmp); /* parts_and_the_lock made it */
    snprintf(out, sizeof out, "%s/together", g_tmp);
    snprintf(errb, sizeof errb, "%s/together.err", g_tmp);
    const pid_t b = fork();
    assert_true(b >= 0);
    if (b == 0) {
        const int fd = open(errb, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, 2) < 0)
            _exit(127);
        setenv("BFSHARD_TEST_SIGNAL", "part-scan:19", 1); /* SIGSTOP */
        execl(tu_bfshard(), "bfshard", "convert", FX, out, "--world-size", "4", "--ranks", "1-2", "--quiet",
              (char *)NULL);
        _exit(127);
    }
    int st = 0;
    for (int i = 0; i < 2000; i++) { /* until it stops itself */
        if (waitpid(b, &st, WUNTRACED) == b && WIFSTOPPED(st))
            break;
        if (WIFEXITED(st))
            fail_msg("part 1-2 exited %d before its journal: %s", WEXITSTATUS(st), tu_slurp(errb));
    }
    assert_true(WIFSTOPPED(st));
    assert_int_equal(cli("", "convert %s '%s' --world-size 4 --ranks 0-1 --quiet", FX, out), 0);
    assert_int_equal(kill(b, SIGCONT), 0);
    assert_int_equal(waitpid(b, &st, 0), b);
    assert_true(WIFEXITED(st));
    char *e = tu_slurp(errb);
    if (WEXITSTATUS(st) != 10 || !strstr(e, "bfshard.part-0-1.json") || !strstr(e, "include rank 1"))
        fail_msg("part 1-2 after 0-1 finished beside it: exit %d: %s", WEXITSTATUS(st), e);
    free(e);
    /* nothing of 1-2 is left: no journal, no part manifest, no rank-2 file; 0-1's are whole */
    assert_false(exists(out, ".bfshard-inprogress-1-2"));
    assert_false(exists(out, "bfshard.part-1-2.json"));
    assert_false(exists(out, R3));
    snprintf(r2, sizeof r2, "%s/shard-00002-model-00001-of-00001.safetensors", out);
    snprintf(r2w, sizeof r2w, "%s/shard-00002-model-00001-of-00001.safetensors", whole);
    assert_int_equal(tu_sh("cmp -s '%s' '%s'", r2, r2w), 0);
    /* and part 0-1's later runs are not refused by debris of 1-2: 2-3 completes it */
    assert_int_equal(cli("", "convert %s '%s' --world-size 4 --ranks 2-3 --quiet", FX, out), 0);
    assert_int_equal(cli("", "merge '%s' --quiet", out), 0);
}

int main(void)
{
    g_tmp = tu_tmpdir("ranks");
    snprintf(g_out, sizeof g_out, "%s/stdout", g_tmp);
    snprintf(g_err, sizeof g_err, "%s/stderr", g_tmp);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(lists_merge_identical), cmocka_unit_test(auto_launchers),
        cmocka_unit_test(wrong_combinations),    cmocka_unit_test(node_local_verify),
        cmocka_unit_test(sigkill_part_resume),   cmocka_unit_test(parts_and_the_lock),
        cmocka_unit_test(parts_started_together),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (rc == 0)
        tu_rmrf(g_tmp);
    free(g_tmp);
    return rc;
}
