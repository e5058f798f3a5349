/*
 * A conversion in parts, through the CLI with controlled environments:
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
 *   parts and the OUTDIR lock: a part runs beside another part (the lock is
 *       shared), a whole run, merge and compress are refused while a part runs (exit 8,
 *       naming the pid), the same part twice is refused, a part never removes the user's
 *       file nor one where its output goes (--force included), nor another conversion's
 *       part that is being written; a killed part's tagged temporary is ours (merge
 *       removes it); merged -> identical, no lock file left;
 *   parts read their share of the input, and a source rewritten between parts (below).
 */
#include "testutil.h"
#include "bfs_internal.h"
#include "formats/format.h"

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

/* ---- parts and the OUTDIR lock, ownership ---------------------------------- */
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

/* ---- parts read their share (docs/SCALE-OUT.md "What a part reads") ----------------------
 * On a row-contiguous format (FP8 block scales, two source files) at W = 8 in 4 parts:
 *   each part's input_bytes_read = its share (the union of the source ranges its ranks'
 *       pieces read, bfs__unit_sources, counted here byte by byte) + every header; the
 *       parts' source_bytes_hashed add up to the input's size; what the parts read adds up
 *       to at most the input + 4 headers + the bytes two parts both read (the FP8 scale
 *       rows of a 128-row block that straddles two parts); the whole run reads every byte
 *       once; inspect --ranks says the same before the run; merged -> every file, manifest
 *       included, byte-identical to the whole run (the parts' --mem unlike the whole run's:
 *       the source hashes' blocks follow the plan, not the units);
 *   a source file rewritten between two parts -> the second part refuses (exit 10, the plan
 *       fingerprint holds the file's mtime), no manifest; rewritten with its mtime put back
 *       (nothing can tell) -> merged, the content hash is that of the bytes each part
 *       converted: the whole tree equals the whole run of the rewritten input, and its hash
 *       differs from the original's. */
#define FX8 "fixtures/fp8-block-split"
#define W8 8
#define NP 4

/* Per part (ranks [p*W8/NP, (p+1)*W8/NP)): share[p], the input bytes its ranks' pieces read,
 * counted byte by byte; *headers, *size of the input; *multi: bytes read by 2+ parts. */
static void shares(const char *input, uint64_t share[NP], uint64_t *headers, uint64_t *size, uint64_t *multi)
{
    bfs_input *in = NULL;
    bfs_plan *pl = NULL;
    bfs_convert_opts o;
    bfs_convert_opts_init(&o);
    o.world_size = W8;
    if (bfs__input_open(input, &in) != 0 || bfs__plan_tensors(in, &o, &pl) != 0 || bfs__plan_layout(pl, &o) != 0)
        fail_msg("%s: %s", input, bfs_last_error());
    *headers = *size = *multi = 0;
    unsigned char **mask = calloc((size_t)in->nfiles, sizeof *mask); /* bit p: part p reads the byte */
    for (int f = 0; f < in->nfiles; f++) {
        mask[f] = calloc(in->files[f].size + 1, 1);
        *headers += in->files[f].h.data_start;
        *size += in->files[f].size;
    }
    for (int f = 0; f < pl->nfiles; f++)
        for (size_t k = 0; k < pl->files[f].npieces; k++) {
            const bfs_piece *pc = &pl->files[f].pieces[k];
            const bfs_unit u = {.t = &pl->t[pc->tensor], .row0 = pc->row0, .row1 = pc->row1};
            bfs_srange s[BFS_UNIT_MAX_SRC];
            const int n = pc->row1 > pc->row0 ? bfs__unit_sources(&u, s) : 0;
            for (int i = 0; i < n; i++)
                for (uint64_t x = 0; x < s[i].len; x++)
                    mask[s[i].r->file][s[i].r->file_offset + s[i].off + x] |= (unsigned char)(1u << (f * NP / W8));
        }
    for (int p = 0; p < NP; p++)
        share[p] = 0;
    for (int f = 0; f < in->nfiles; f++) {
        for (uint64_t x = 0; x < in->files[f].size; x++) {
            int parts = 0;
            for (int p = 0; p < NP; p++)
                if (mask[f][x] >> p & 1) {
                    share[p]++;
                    parts++;
                }
            if (parts > 1)
                *multi += (uint64_t)(parts - 1);
            if (x >= in->files[f].h.data_start && parts == 0)
                fail_msg("%s: byte %llu is read by no rank", in->files[f].name, (unsigned long long)x);
        }
        free(mask[f]);
    }
    free(mask);
    bfs__plan_free(pl);
    bfs__input_free(in);
}

static void parts_read_their_share(void **s)
{
    (void)s;
    char whole[4096], out[4096];
    snprintf(whole, sizeof whole, "%s/share-whole", g_tmp);
    snprintf(out, sizeof out, "%s/share-parts", g_tmp);
    uint64_t share[NP], H, size, multi;
    shares(FX8, share, &H, &size, &multi);

    assert_int_equal(cli("", "convert %s '%s' --world-size %d --quiet --json", FX8, whole, W8), 0);
    json_t *j = last_json();
    assert_int_equal(jint(j, "input_bytes_read"), size); /* every byte once */
    assert_int_equal(jint(j, "source_bytes_hashed"), size);
    json_decref(j);

    static const char *const parts[NP] = {"0-1", "2-3", "4-5", "6-7"};
    static const int order[NP] = {2, 0, 3, 1};                       /* any order */
    static const char *const mem[NP] = {"64K", "", "128K", "1M"};    /* units unlike the whole run's */
    uint64_t sum_read = 0, sum_hashed = 0;
    for (int q = 0; q < NP; q++) {
        const int p = order[q];
        char memopt[32] = "";
        if (mem[p][0])
            snprintf(memopt, sizeof memopt, "--mem %s", mem[p]);
        assert_int_equal(cli("", "convert %s '%s' --world-size %d --ranks %s %s --quiet --json", FX8, out, W8, parts[p], memopt), 0);
        j = last_json();
        const uint64_t rd = jint(j, "input_bytes_read"), hashed = jint(j, "source_bytes_hashed");
        json_decref(j);
        fprintf(stderr, "  ranks %s: input_bytes_read %llu = share %llu + headers %llu%s; source_bytes_hashed %llu\n",
                parts[p], (unsigned long long)rd, (unsigned long long)share[p], (unsigned long long)H,
                rd == share[p] + H ? "" : " (NOT EQUAL)", (unsigned long long)hashed);
        /* its share and the headers, no more: nothing of it is read only to hash it (every
         * byte of this input is read by some rank: no tensor only the planner reads) */
        assert_true(rd <= share[p] + H);
        assert_int_equal(rd, share[p] + H);
        assert_int_equal(cli("", "inspect %s --world-size %d --ranks %s --json", FX8, W8, parts[p]), 0);
        j = last_json();
        assert_int_equal(jint(json_object_get(j, "part"), "bytes_to_read"), rd);
        assert_int_equal(jint(json_object_get(j, "part"), "source_bytes_to_hash"), hashed);
        json_decref(j);
        sum_read += rd;
        sum_hashed += hashed;
        assert_false(exists(out, "bfshard.manifest.json"));
    }
    fprintf(stderr, "  %d parts read %llu bytes in all: input %llu + %d x headers %llu + %llu read by two parts\n", NP,
            (unsigned long long)sum_read, (unsigned long long)size, NP, (unsigned long long)H, (unsigned long long)multi);
    /* every input byte in one part's terms */
    assert_int_equal(sum_hashed, size);
    /* the input once, the headers once a part, and the bytes two parts both read: FP8 scale
     * rows of a 128-row block across a part's border (a few rows of 2-3 floats), under 1% */
    assert_true(sum_read <= size + NP * H + multi);
    assert_true(multi * 100 <= size);
    assert_int_equal(cli("", "merge '%s' --quiet", out), 0);
    if (tu_sh("diff -r '%s' '%s' > /dev/null", whole, out) != 0)
        fail_msg("%d parts merged: %s differs from the whole run %s", NP, out, whole);
    assert_int_equal(cli("", "verify '%s' --quiet", out), 0);
}

/* ---- a source file rewritten between the parts ------------------------------------------ */
/* the last byte of the second file (up_proj.weight's last row: rank 7's alone) changed,
 * to another normal E4M3 value; the mtime put back to 2001-01-01 when `keep_mtime` */
static void rewrite_last_byte(const char *in, bool keep_mtime)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", in);
    const int fd = open(p, O_RDWR);
    struct stat sb;
    uint8_t b;
    assert_true(fd >= 0 && fstat(fd, &sb) == 0);
    assert_int_equal(pread(fd, &b, 1, sb.st_size - 1), 1);
    b = b == 0x10 ? 0x20 : 0x10;
    assert_int_equal(pwrite(fd, &b, 1, sb.st_size - 1), 1);
    close(fd);
    if (keep_mtime)
        assert_int_equal(tu_sh("touch -d 2001-01-01 '%s'", p), 0);
}

static void fresh_input(const char *in)
{
    assert_int_equal(tu_sh("rm -rf '%s' && mkdir -p '%s' && cp %s/* '%s' && touch -d 2001-01-01 '%s'/*", in, in, FX8, in, in), 0);
}

static const char *src_hash(const char *outdir, int i)
{
    static char h[33];
    char p[4096];
    snprintf(p, sizeof p, "%s/bfshard.manifest.json", outdir);
    json_t *m = json_load_file(p, 0, NULL);
    snprintf(h, sizeof h, "%s", json_string_value(json_object_get(json_array_get(json_object_get(json_object_get(m, "source"), "files"), (size_t)i), "content_xxh3_128")));
    json_decref(m);
    return h;
}

static void source_changed_between_parts(void **s)
{
    (void)s;
    char in[4096], out[4096], orig[4096], changed[4096], h0[33];
    snprintf(in, sizeof in, "%s/chg-in", g_tmp);
    snprintf(orig, sizeof orig, "%s/chg-whole-orig", g_tmp);
    snprintf(changed, sizeof changed, "%s/chg-whole-changed", g_tmp);

    /* rewritten: its mtime changed, so did the plan fingerprint; the second part refuses */
    snprintf(out, sizeof out, "%s/chg-parts", g_tmp);
    fresh_input(in);
    assert_int_equal(cli("", "convert '%s' '%s' --world-size %d --ranks 0-3 --quiet", in, out, W8), 0);
    rewrite_last_byte(in, false);
    assert_int_equal(cli("", "convert '%s' '%s' --world-size %d --ranks 4-7 --quiet", in, out, W8), 10);
    char *e = tu_slurp(g_err);
    assert_non_null(strstr(e, "another conversion"));
    free(e);
    assert_true(cli("", "merge '%s' --quiet", out) != 0);
    assert_false(exists(out, "bfshard.manifest.json"));

    /* rewritten with its mtime put back: nothing tells the parts apart, and the merged hash is
     * of what each part read: the rewritten bytes, which rank 7 alone reads and converted */
    fresh_input(in);
    assert_int_equal(cli("", "convert '%s' '%s' --world-size %d --quiet", in, orig, W8), 0);
    snprintf(h0, sizeof h0, "%s", src_hash(orig, 1));
    snprintf(out, sizeof out, "%s/chg-parts-same-mtime", g_tmp);
    assert_int_equal(cli("", "convert '%s' '%s' --world-size %d --ranks 0-3 --quiet", in, out, W8), 0);
    rewrite_last_byte(in, true);
    assert_int_equal(cli("", "convert '%s' '%s' --world-size %d --ranks 4-7 --quiet", in, out, W8), 0);
    assert_int_equal(cli("", "merge '%s' --quiet", out), 0);
    assert_int_equal(cli("", "convert '%s' '%s' --world-size %d --quiet", in, changed, W8), 0);
    assert_string_not_equal(src_hash(out, 1), h0);
    assert_string_equal(src_hash(out, 1), src_hash(changed, 1));
    assert_string_equal(src_hash(out, 0), src_hash(orig, 0)); /* the other file: as it was */
    if (tu_sh("diff -r '%s' '%s' > /dev/null", changed, out) != 0)
        fail_msg("parts of a rewritten input merged: %s differs from the whole run of it %s", out, changed);
}

/* a part written before "blocks-1" (no content_xxh3_128_scheme; resealed) beside one of it:
 * their source hashes do not add up, merge refuses (exit 10) and writes nothing */
static void parts_of_two_source_hash_schemes(void **s)
{
    (void)s;
    char out[4096], pm[4096];
    snprintf(out, sizeof out, "%s/schemes", g_tmp);
    assert_int_equal(cli("", "convert %s '%s' --world-size 4 --ranks 0-1 --quiet", FX, out), 0);
    assert_int_equal(cli("", "convert %s '%s' --world-size 4 --ranks 2-3 --quiet", FX, out), 0);
    snprintf(pm, sizeof pm, "%s/bfshard.part-2-3.json", out);
    assert_int_equal(tu_sh("sed -i -e '/\"content_xxh3_128_scheme\"/d' "
                           "-e 's/\\(\"manifest_xxh3_128\": \"\\)[0-9a-f]*/\\1%032d/' '%s' && "
                           "h=$(xxh128sum < '%s' | cut -d' ' -f1) && sed -i \"s/%032d/$h/\" '%s'", 0, pm, pm, 0, pm), 0);
    assert_int_equal(cli("", "merge '%s'", out), 10);
    char *e = tu_slurp(g_err);
    assert_non_null(strstr(e, "hash the sources differently"));
    free(e);
    assert_false(exists(out, "bfshard.manifest.json"));
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
        cmocka_unit_test(parts_started_together), cmocka_unit_test(parts_read_their_share),
        cmocka_unit_test(source_changed_between_parts), cmocka_unit_test(parts_of_two_source_hash_schemes),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (rc == 0)
        tu_rmrf(g_tmp);
    free(g_tmp);
    return rc;
}
