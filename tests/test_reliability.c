/*
 * Reliability: what happens to unattended runs on files from strangers.
 *
 *   kill -9 at many points of a real CLI conversion (time steps and file-system
 *       events: journal, temp files, renames, manifest) -> no incomplete file under
 *       a final name; the same command again finishes byte-identical to a clean run;
 *   a full disk (a small tmpfs, when we may mount one) and RLIMIT_FSIZE -> exit 4,
 *       one line, no temp files, the input untouched, and a rerun with room finishes;
 *   an input truncated while mapped -> BFS_EINPUT naming the file, never SIGBUS
 *       (main thread, CPU workers, a second process truncating);
 *   symlinks in OUTDIR are replaced, never followed; tensor names never become paths;
 *   FIFOs and huge indexes in the input directory fail fast instead of hanging;
 *   verify catches every single flipped bit of every output file and names it;
 *   the fuzz corpora (fuzz/corpus, fuzz/regress) replay without a report.
 *
 * $BFS_RELIABILITY_MB sets the size of the generated MXFP4 input of the kill test
 * (default 64).
 *
 * No assertion here depends on how fast this machine is: kill and truncation points
 * are defined by what the run has done (an inotify event in OUTDIR, the bytes it has
 * written so far per /proc/PID/io), never by a sleep of N ms, and what is asserted
 * is the state left behind, not how many attempts happened to land in time.
 */
#include "testutil.h"
#include "bfs_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- the fuzz targets, replayed as plain functions -------------------------------- */
#define LLVMFuzzerTestOneInput fz_st_parse_one
#include "../fuzz/fuzz_st_parse.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_plan_one
#include "../fuzz/fuzz_plan.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_input_one
#include "../fuzz/fuzz_input.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_bnb_blob_one
#define LLVMFuzzerInitialize fz_bnb_blob_init
#include "../fuzz/fuzz_bnb_blob.c"
#undef LLVMFuzzerTestOneInput
#undef LLVMFuzzerInitialize
#include "../fuzz/fuzz_common.c"

/* ---- small helpers ------------------------------------------------------------------ */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A gpt-oss-shaped MXFP4 checkpoint of about `mb` MB: experts of 4 items with a BF16 bias
 * (tu_gen_mxfp4), as many layers as make mb. */
static void gen_mxfp4(const char *dir, int mb)
{
    const size_t layer = (size_t)4 * 256 * 90 * 17 + (size_t)4 * 512 * 2;
    tu_gen_mxfp4(dir, 4, mb * 1000000 / (int)layer + 1, true);
}

/* Lines of a file (stderr of a run); its text in text. */
static int count_lines_file(const char *path, char *text, size_t cap)
{
    char *t = tu_slurp(path);
    const int lines = tu_count_lines(t);
    if (text)
        snprintf(text, cap, "%s", t);
    free(t);
    return lines;
}

/* Bytes the process has written so far (write/pwrite, any file), from /proc/PID/io;
 * -1 when it is gone. Rank files are preallocated, so their sizes say nothing. */
static long long wchar_of(pid_t pid)
{
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/io", (int)pid);
    FILE *f = fopen(p, "r");
    long long v = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "wchar: %lld", &v) == 1)
            break;
    fclose(f);
    return v;
}

/* Wait until the child has written at least `bytes` or has exited (reaped: returns
 * its wait status code via *rc, as tu_wait). Returns true while it is still running. */
static bool wait_written(pid_t pid, long long bytes, int *rc)
{
    for (;;) {
        int st;
        const pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) {
            *rc = WIFSIGNALED(st) ? 1000 + WTERMSIG(st) : WEXITSTATUS(st);
            return false;
        }
        const long long n = wchar_of(pid);
        if (n >= bytes)
            return true;
        usleep(500);
    }
}

static long long dir_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    long long n = 0;
    assert_non_null(d);
    while ((e = readdir(d)) != NULL) {
        char p[8192];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.' && stat(p, &sb) == 0 && S_ISREG(sb.st_mode))
            n += (long long)sb.st_size;
    }
    closedir(d);
    return n;
}

/* After a kill: every name in out is either bfshard's temp/journal (hidden) or a
 * final name whose content equals ref's file of that name. */
static void check_no_incomplete(const char *out, const char *ref, const char *when)
{
    DIR *d = opendir(out);
    struct dirent *e;
    if (!d)
        return; /* killed before it made OUTDIR */
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        const size_t n = strlen(nm);
        if (!strcmp(nm, ".") || !strcmp(nm, ".."))
            continue;
        if (nm[0] == '.') {
            if (strcmp(nm, ".bfshard-inprogress") != 0 && strcmp(nm, ".bfshard.lock") != 0 &&
                !(n > 8 && !strcmp(nm + n - 8, ".partial")))
                fail_msg("%s: unexpected hidden file %s/%s", when, out, nm);
            continue;
        }
        if (tu_sh("cmp -s '%s/%s' '%s/%s'", out, nm, ref, nm) != 0)
            fail_msg("%s: %s/%s is under its final name but differs from a clean run's", when, out, nm);
        /* completion is one event: no sums file stands without its manifest, or a
         * pipeline's `xxh128sum -c` would pass on an unfinished OUTDIR */
        if ((!strcmp(nm, "xxh128sums.txt") || !strcmp(nm, "sha256sums.txt")) &&
            tu_sh("test -f '%s/bfshard.manifest.json'", out) != 0)
            fail_msg("%s: %s/%s stands without bfshard.manifest.json", when, out, nm);
    }
    closedir(d);
}

/* ---- kill -9 ---------------------------------------------------------------------------- */
typedef struct {
    char in[4096], out[4096], ref[4096];
    char *argv[16];
    double t_ref;
    long long ref_bytes; /* what a clean run writes: the kill points are fractions of it */
} killctx;

static void kill_setup(killctx *k, const char *tmp)
{
    const char *mbs = getenv("BFS_RELIABILITY_MB");
    const int mb = mbs && atoi(mbs) > 0 ? atoi(mbs) : 64;
    snprintf(k->in, sizeof k->in, "%s/in", tmp);
    snprintf(k->out, sizeof k->out, "%s/out", tmp);
    snprintf(k->ref, sizeof k->ref, "%s/ref", tmp);
    assert_int_equal(mkdir(k->in, 0755), 0);
    gen_mxfp4(k->in, mb);
    static char *const tmpl[] = {NULL, "convert", NULL, NULL, "--world-size", "3", "--device", "cpu",
                                 "--threads", "2", "--mem", "8M", "--quiet", NULL};
    memcpy(k->argv, tmpl, sizeof tmpl);
    k->argv[0] = (char *)tu_bfshard();
    k->argv[2] = k->in;
    k->argv[3] = k->ref;
    const double t0 = tu_now_s();
    assert_int_equal(tu_run(k->argv, NULL), 0);
    k->t_ref = tu_now_s() - t0;
    k->argv[3] = k->out;
    k->ref_bytes = dir_bytes(k->ref);
    fprintf(stderr, "  reference conversion of a %d MB MXFP4 input: %.2f s, %lld bytes written\n", mb, k->t_ref,
            k->ref_bytes);
}

/* Rerun the same command to the end: exit 0 and byte-identical to the reference. */
static void finish_and_compare(killctx *k, const char *when)
{
    const int rc = tu_run(k->argv, NULL);
    if (rc != 0)
        fail_msg("%s: rerunning the same command exited %d", when, rc);
    if (tu_sh("diff -r '%s' '%s' >/dev/null", k->ref, k->out) != 0)
        fail_msg("%s: the finished OUTDIR differs from a clean run's", when);
}

/* SIGKILL the CLI when `name` gets event `mask` in OUTDIR. Returns true when it was
 * killed, false when it exited first. */
static bool kill_on_event(killctx *k, const char *name, uint32_t mask)
{
    const int ifd = tu_watch(k->out, IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_DELETE);
    int rc;
    const bool killed = tu_kill_on_event(ifd, tu_spawn(k->argv, NULL), name, mask, 600 /* a hang guard only */, &rc);
    close(ifd);
    if (!killed && rc != 1000 + SIGKILL) /* it exited first */
        return false;
    assert_true(rc == 1000 + SIGKILL || rc == 0);
    return rc != 0;
}

static void kill9_on_events(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("kill9ev");
    killctx k;
    kill_setup(&k, tmp);
    static const struct {
        const char *name;
        uint32_t mask;
    } evs[] = {
        {".bfshard-inprogress", IN_CREATE},
        {".bfshard-inprogress", IN_CLOSE_WRITE},
        {".shard-00001-model-00001-of-00001.safetensors.partial", IN_CREATE},
        {"shard-00001-model-00001-of-00001.safetensors", IN_MOVED_TO},
        {".shard-00002-model-00001-of-00001.safetensors.partial", IN_CREATE},
        {"shard-00003-model-00001-of-00001.safetensors", IN_MOVED_TO},
        {".config.json.partial", IN_CREATE},
        {"config.json", IN_MOVED_TO},
        {".tokenizer.json.partial", IN_CLOSE_WRITE},
        {".bfshard.manifest.json.partial", IN_CREATE},
        {".bfshard.manifest.json.partial", IN_CLOSE_WRITE},
        {"bfshard.manifest.json", IN_MOVED_TO},
        {".xxh128sums.txt.partial", IN_CREATE},
        {"xxh128sums.txt", IN_MOVED_TO},
        {".bfshard-inprogress", IN_DELETE},
    };
    int killed = 0;
    /* The first three events come before any tensor is converted: the whole conversion
     * is still ahead, so the kill lands on any machine, however loaded. Later events
     * may race the end of the run; then the run finished, and finish_and_compare
     * checks that state instead. */
    enum { MUST_LAND = 3 };
    for (size_t i = 0; i < sizeof evs / sizeof *evs; i++) {
        char when[256];
        snprintf(when, sizeof when, "kill -9 at %s %s", evs[i].name,
                 evs[i].mask == IN_CREATE ? "created" : evs[i].mask == IN_MOVED_TO ? "renamed into place"
                 : evs[i].mask == IN_DELETE ? "deleted" : "closed");
        tu_rmrf(k.out);
        assert_int_equal(mkdir(k.out, 0755), 0);
        const bool landed = kill_on_event(&k, evs[i].name, evs[i].mask);
        if (i < MUST_LAND && !landed)
            fail_msg("%s: the run ended before the kill, though it had all its work ahead", when);
        killed += landed;
        check_no_incomplete(k.out, k.ref, when);
        finish_and_compare(&k, when);
    }
    fprintf(stderr, "  %d of %zu event kills landed before the run ended\n", killed, sizeof evs / sizeof *evs);
    tu_rmrf(tmp);
    free(tmp);
}

static void kill9_stepped_and_random(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("kill9t");
    killctx k;
    kill_setup(&k, tmp);
    /* independent kills at stepped and random points of the output written so far
     * (bytes, not time: the same points on a loaded machine), each rerun to the end */
    for (int i = 0; i < 8; i++) {
        const double frac = i < 5 ? 0.05 + 0.2 * i : (double)(rng() % 1000) / 1000.0;
        char when[128];
        snprintf(when, sizeof when, "kill -9 after %.0f%% of a clean run's output was written", frac * 100);
        tu_rmrf(k.out);
        const pid_t pid = tu_spawn(k.argv, NULL);
        int rc = 0;
        if (wait_written(pid, (long long)(frac * (double)k.ref_bytes), &rc)) {
            kill(pid, SIGKILL);
            tu_wait(pid);
        } else if (rc != 0) {
            fail_msg("%s: the run exited %d before the kill", when, rc);
        }
        check_no_incomplete(k.out, k.ref, when);
        finish_and_compare(&k, when);
    }
    /* a chain: every rerun is killed again (resume of a resume, rehash of reused files) */
    tu_rmrf(k.out);
    for (int i = 0; i < 6; i++) {
        char when[128];
        snprintf(when, sizeof when, "kill -9 chain, step %d", i);
        const pid_t pid = tu_spawn(k.argv, NULL);
        int rc = 0;
        /* a rerun first re-hashes what is reused, then writes: kill at 10..50% of a
         * clean run's output, counted from this run's start */
        if (wait_written(pid, (long long)((0.1 + (double)(rng() % 400) / 1000.0) * (double)k.ref_bytes), &rc)) {
            kill(pid, SIGKILL);
            tu_wait(pid);
        } else if (rc != 0) {
            fail_msg("%s: the run exited %d before the kill", when, rc);
        }
        check_no_incomplete(k.out, k.ref, when);
    }
    finish_and_compare(&k, "kill -9 chain");
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- full disk ------------------------------------------------------------------------ */
static char *hash_tree(const char *dir)
{
    char *tmp = tu_tmpdir("hash"), f[4096];
    snprintf(f, sizeof f, "%s/h", tmp);
    tu_sh("cd '%s' && find . -type f | sort | xargs xxh128sum > '%s' 2>/dev/null", dir, f);
    size_t n;
    char *h = (char *)tu_read_file(f, &n);
    h[n] = '\0';
    tu_rmrf(tmp);
    free(tmp);
    return h;
}

/* One run that must end with exit 0, or 4 with one clear line and no temp files. */
static int full_disk_run(char *const argv[], const char *out, const char *errf, unsigned long long fsize, const char *what)
{
    const int rc = tu_run(argv, &(tu_proc){.errf = errf, .fsize = fsize});
    char err[4096];
    const int lines = count_lines_file(errf, err, sizeof err);
    if (rc != 0 && rc != 4)
        fail_msg("%s: exit %d, expected 0 or 4: %s", what, rc, err);
    if (rc == 4) {
        if (lines != 1 || strncmp(err, "bfshard: error: ", 16) != 0 ||
            !(strstr(err, "No space left") || strstr(err, "disk full") || strstr(err, "File too large")) ||
            !strstr(err, out))
            fail_msg("%s: the error is not one clear line naming the file: %s", what, err);
        if (tu_dir_has(out, ".partial"))
            fail_msg("%s: temporary files left in %s", what, out);
    }
    return rc;
}

static char mounted[4096];
static int unmount_teardown(void **s)
{
    (void)s;
    if (mounted[0])
        umount2(mounted, MNT_DETACH);
    mounted[0] = '\0';
    return 0;
}

static void enospc_tmpfs(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("enospc");
    char mnt[4096], in[4096], out[4096], ref[4096], filler[4096], errf[4096];
    snprintf(mnt, sizeof mnt, "%s/mnt", tmp);
    snprintf(in, sizeof in, "%s/in", tmp);
    snprintf(out, sizeof out, "%s/out", mnt);
    snprintf(ref, sizeof ref, "%s/ref", tmp);
    snprintf(filler, sizeof filler, "%s/filler", mnt);
    snprintf(errf, sizeof errf, "%s/err", tmp);
    assert_int_equal(mkdir(mnt, 0755), 0);
    if (mount("tmpfs", mnt, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m") != 0) {
        fprintf(stderr, "  cannot mount a tmpfs here (%s): ENOSPC sweep skipped (RLIMIT_FSIZE still runs)\n",
                strerror(errno));
        tu_rmrf(tmp);
        free(tmp);
        skip();
    }
    snprintf(mounted, sizeof mounted, "%s", mnt);
    assert_int_equal(tu_sh("cp -r fixtures/mxfp4-tiny %s", in), 0);
    char *h0 = hash_tree(in);
    char *argv[] = {(char *)tu_bfshard(), "convert", in, out, "--world-size", "2", "--device", "cpu", "--quiet", NULL};
    char *argv_ref[] = {(char *)tu_bfshard(), "convert", in, ref, "--world-size", "2", "--device", "cpu", "--quiet", NULL};
    assert_int_equal(tu_run(argv_ref, NULL), 0);
    uint64_t need = 0;
    struct stat sb;
    DIR *d = opendir(ref);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", ref, e->d_name);
        if (e->d_name[0] != '.' && stat(p, &sb) == 0)
            need += ((uint64_t)sb.st_size + 4095) / 4096 * 4096;
    }
    closedir(d);
    int fails = 0, oks = 0;
    for (uint64_t room = 0; room <= need + 16384; room += 4096) {
        char what[128];
        snprintf(what, sizeof what, "full disk with %llu bytes free", (unsigned long long)room);
        tu_rmrf(out);
        unlink(filler);
        struct statvfs v;
        assert_int_equal(statvfs(mnt, &v), 0);
        const uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize;
        /* the output directory itself takes a page */
        const uint64_t fill = avail > room + 4096 ? avail - room - 4096 : 0;
        if (fill) {
            const int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            assert_true(fd >= 0);
            assert_int_equal(posix_fallocate(fd, 0, (off_t)fill), 0);
            close(fd);
        }
        const int rc = full_disk_run(argv, out, errf, 0, what);
        fails += rc == 4;
        oks += rc == 0;
        if (rc == 4) {
            /* make room: the same command finishes, identical to a clean run */
            unlink(filler);
            if (tu_run(argv, NULL) != 0 || tu_sh("diff -r '%s' '%s' >/dev/null", ref, out) != 0)
                fail_msg("%s: after freeing space, the rerun did not finish identical to a clean run", what);
        }
    }
    fprintf(stderr, "  ENOSPC sweep: %d runs failed cleanly with exit 4, %d fit\n", fails, oks);
    assert_true(fails > 10 && oks > 0);
    char *h1 = hash_tree(in);
    assert_string_equal(h0, h1);
    free(h0);
    free(h1);
    unmount_teardown(NULL);
    tu_rmrf(tmp);
    free(tmp);
}

static void efbig_rlimit(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("efbig");
    char in[4096], out[4096], errf[4096];
    snprintf(in, sizeof in, "%s/in", tmp);
    snprintf(out, sizeof out, "%s/out", tmp);
    snprintf(errf, sizeof errf, "%s/err", tmp);
    assert_int_equal(tu_sh("cp -r fixtures/bnb-nf4-dq %s", in), 0);
    char *h0 = hash_tree(in);
    char *argv[] = {(char *)tu_bfshard(), "convert", in, out, "--world-size", "1", "--device", "cpu", "--quiet", "--force", NULL};
    static const rlim_t limits[] = {1, 20, 40, 100, 1000, 4096, 65536, 200000, 290000, 1 << 20};
    int fails = 0;
    for (size_t i = 0; i < sizeof limits / sizeof *limits; i++) {
        char what[128];
        snprintf(what, sizeof what, "RLIMIT_FSIZE %llu", (unsigned long long)limits[i]);
        fails += full_disk_run(argv, out, errf, limits[i], what) == 4;
    }
    assert_true(fails >= 7);
    char *h1 = hash_tree(in);
    assert_string_equal(h0, h1);
    free(h0);
    free(h1);
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- an input truncated while mapped ---------------------------------------------------- */
static bfs_input *bus_in;
static void *bus_touch(void *p)
{
    volatile unsigned sum = 0;
    for (size_t i = 0; i < bus_in->nraw; i++)
        for (uint64_t k = 0; k < bus_in->raw[i].nbytes; k += 1024)
            sum += bus_in->raw[i].data[k];
    return (void *)(uintptr_t)sum;
}

/* The handler, on several threads at once: reads of vanished pages complete, and
 * the input reports the truncation. */
static void sigbus_threads(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("bus");
    char f[4096];
    snprintf(f, sizeof f, "%s/m.safetensors", tmp);
    assert_int_equal(tu_sh("cp fixtures/bnb-nf4-dq/model.safetensors %s", f), 0);
    const pid_t pid = fork();
    if (pid == 0) {
        if (bfs__input_open(f, &bus_in) != 0)
            _exit(10);
        if (truncate(f, 4096) != 0)
            _exit(11);
        pthread_t t[4];
        for (int i = 0; i < 4; i++)
            pthread_create(&t[i], NULL, bus_touch, NULL);
        for (int i = 0; i < 4; i++)
            pthread_join(t[i], NULL);
        bus_touch(NULL);
        bfs__err_clear();
        const int rc = bfs__input_check(bus_in, -1);
        bfs__input_free(bus_in);
        _exit(rc == BFS_EINPUT && strstr(bfs_last_error(), "m.safetensors") ? 0 : 12);
    }
    const int rc = tu_wait(pid);
    if (rc != 0)
        fail_msg("reading a truncated mapping from 5 threads: %s %d", rc > 1000 ? "killed by signal" : "exit", rc % 1000);
    /* a fault outside our mappings is never swallowed: it still kills (a fresh process,
     * so the handler before ours is the default action, not cmocka's) */
    const pid_t p2 = fork();
    if (p2 == 0) {
        setenv("BFS_RELIABILITY_CHILD", "foreign-sigbus", 1);
        setenv("ASAN_OPTIONS", "handle_sigbus=0:detect_leaks=0", 1); /* under ASan: no report, the plain death */
        snprintf(f, sizeof f, "%s/other", tmp);
        execl("/proc/self/exe", "test_reliability", f, (char *)NULL);
        _exit(127);
    }
    const int rc2 = tu_wait(p2);
    if (rc2 != 1000 + SIGBUS)
        fail_msg("a SIGBUS outside the input mappings: %s %d, expected death by SIGBUS", rc2 > 1000 ? "signal" : "exit",
                 rc2 % 1000);
    tu_rmrf(tmp);
    free(tmp);
}

static const char *trunc_path;
static int trunc_calls;
static void truncate_cb(const bfs_progress *p, void *u)
{
    (void)p;
    (void)u;
    if (++trunc_calls == 2)
        truncate(trunc_path, 1 << 20);
}

/* The library, CPU workers on: the input shrinks after the first units. */
static void truncated_during_convert(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("trunc");
    char in[4096], out[4096], f[4096];
    snprintf(in, sizeof in, "%s/in", tmp);
    snprintf(out, sizeof out, "%s/out", tmp);
    snprintf(f, sizeof f, "%s/model.safetensors", in);
    assert_int_equal(mkdir(in, 0755), 0);
    gen_mxfp4(in, 8);
    for (int threads = 1; threads <= 4; threads += 3) {
        const pid_t pid = fork();
        if (pid == 0) {
            bfs_convert_opts o;
            bfs_convert_opts_init(&o);
            o.world_size = 2;
            o.device = "cpu";
            o.threads = threads;
            o.mem = 4 << 20;
            o.force = 1;
            o.progress = truncate_cb;
            trunc_path = f;
            const int rc = bfs_convert(in, out, &o, NULL);
            if (rc == BFS_EINPUT && strstr(bfs_last_error(), "model.safetensors") && !tu_dir_has(out, ".partial"))
                _exit(0);
            fprintf(stderr, "  rc %d: %s\n", rc, bfs_last_error());
            _exit(20);
        }
        const int rc = tu_wait(pid);
        if (rc != 0)
            fail_msg("threads=%d: input truncated during the conversion: %s %d", threads,
                     rc > 1000 ? "killed by signal" : "exit", rc % 1000);
        gen_mxfp4(in, 8);
    }
    tu_rmrf(tmp);
    free(tmp);
}

/* The CLI, and a second process truncating the input at stepped times. */
static void truncated_by_other_process(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("trunc2");
    char in[4096], out[4096], ref[4096], f[4096], errf[4096];
    snprintf(in, sizeof in, "%s/in", tmp);
    snprintf(out, sizeof out, "%s/out", tmp);
    snprintf(ref, sizeof ref, "%s/ref", tmp);
    snprintf(f, sizeof f, "%s/model.safetensors", in);
    snprintf(errf, sizeof errf, "%s/err", tmp);
    assert_int_equal(mkdir(in, 0755), 0);
    gen_mxfp4(in, 16);
    char *argv[] = {(char *)tu_bfshard(), "convert", in, ref, "--world-size", "2", "--device", "cpu",
                    "--threads", "2", "--mem", "4M", "--quiet", "--force", NULL};
    assert_int_equal(tu_run(argv, NULL), 0);
    const long long total = dir_bytes(ref);
    argv[3] = out;
    /* The converter is stopped (SIGSTOP, so nothing moves while we look) once it has
     * written a given share of a clean run's output, the input is truncated, and it
     * goes on. Stopped with at most half of its output written (two units of --mem/2
     * in flight are far less than the other half), it still has units to read: it
     * must fail with exit 3 naming the file and leave no temporary file. Stopped
     * later, it may also have read everything already: exit 0 is then correct, and
     * its output must equal a clean run's. Which of the two happened depends only on
     * how much it had done, never on how fast this machine is. */
    int strict = 0;
    for (int i = 0; i < 8; i++) {
        const double frac = 0.05 + 0.1 * i;
        char when[128];
        snprintf(when, sizeof when, "input truncated after %.0f%% of the output was written", frac * 100);
        tu_rmrf(out);
        const pid_t pid = tu_spawn(argv, &(tu_proc){.errf = errf});
        int rc = 0;
        bool must_fail = false;
        if (wait_written(pid, (long long)(frac * (double)total), &rc)) {
            int st;
            kill(pid, SIGSTOP);
            while (waitpid(pid, &st, WUNTRACED) < 0 && errno == EINTR)
                ;
            if (WIFSTOPPED(st)) {
                must_fail = wchar_of(pid) <= total / 2;
                assert_int_equal(truncate(f, (off_t)(rng() % (8u << 20))), 0);
                kill(pid, SIGCONT);
                rc = tu_wait(pid);
            } else {
                rc = WIFSIGNALED(st) ? 1000 + WTERMSIG(st) : WEXITSTATUS(st);
            }
        }
        char err[4096];
        count_lines_file(errf, err, sizeof err);
        if (rc != 0 && rc != 3)
            fail_msg("%s: %s %d: %s", when, rc > 1000 ? "killed by signal" : "exit", rc % 1000, err);
        if (must_fail && rc != 3)
            fail_msg("%s: exit %d with half of the input still to read", when, rc);
        if (rc == 3) {
            strict += must_fail;
            if (!strstr(err, "model.safetensors"))
                fail_msg("%s: the error does not name the file: %s", when, err);
            if (tu_dir_has(out, ".partial"))
                fail_msg("%s: temporary files left in %s", when, out);
        } else if (tu_sh("diff -r '%s' '%s' >/dev/null", ref, out) != 0) {
            fail_msg("%s: exit 0, but the output differs from a clean run's", when);
        }
        gen_mxfp4(in, 16);
    }
    /* the 5% point: stopped with at most a twentieth written, unless progress cannot be
     * seen at all (no /proc/PID/io) -- then the truncation never happened mid-run */
    fprintf(stderr, "  %d of 8 truncations landed with work ahead, each caught with exit 3\n", strict);
    if (strict == 0)
        fail_msg("no truncation landed while the run had work ahead: is /proc/PID/io readable here?");
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- paths -------------------------------------------------------------------------------- */
static void symlinks_in_outdir(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("links");
    char out[4096], victim[4096];
    snprintf(out, sizeof out, "%s/out", tmp);
    assert_int_equal(mkdir(out, 0755), 0);
    static const char *const names[] = {
        "shard-00001-model-00001-of-00001.safetensors", "shard-00002-model-00001-of-00001.safetensors",
        ".shard-00001-model-00001-of-00001.safetensors.partial", "config.json", "tokenizer.json",
        "bfshard.manifest.json", ".bfshard.manifest.json.partial", "xxh128sums.txt", ".bfshard-inprogress",
    };
    const size_t N = sizeof names / sizeof *names;
    char *argv[] = {(char *)tu_bfshard(), "convert", "fixtures/mxfp4-tiny", out, "--world-size", "2",
                    "--device", "cpu", "--quiet", NULL, NULL};
    /* symlinks that no manifest or journal of bfshard records: not ours, --force or not;
     * nothing is touched. Then, after a real conversion, the same names as symlinks where
     * its manifest records files: --force replaces the links, never writes their targets. */
    for (int round = 0; round < 2; round++) {
        if (round == 1) {
            argv[9] = NULL;
            tu_rmrf(out);
            assert_int_equal(tu_run(argv, NULL), 0);
            assert_int_equal(tu_sh("cd '%s' && cp bfshard.manifest.json ../m && rm -f ./* .bfshard-inprogress", out), 0);
        }
        for (size_t i = 0; i < N; i++) {
            snprintf(victim, sizeof victim, "%s/victim%zu", tmp, i);
            assert_int_equal(tu_sh("echo precious > %s && rm -f '%s/%s' && ln -s %s '%s/%s'", victim, out, names[i], victim, out, names[i]), 0);
        }
        if (round == 1) /* the manifest itself must stay a readable record: a copy, not a link */
            assert_int_equal(tu_sh("rm '%s/bfshard.manifest.json' && cp '%s/m' '%s/bfshard.manifest.json'", out, tmp, out), 0);
        argv[9] = NULL;
        assert_int_equal(tu_run(argv, NULL), 8);
        argv[9] = "--force";
        assert_int_equal(tu_run(argv, NULL), round == 0 ? 8 : 0);
        for (size_t i = 0; i < N; i++) {
            struct stat sb;
            char p[8192];
            snprintf(victim, sizeof victim, "%s/victim%zu", tmp, i);
            if (tu_sh("grep -qx precious %s && test $(wc -c < %s) -eq 9", victim, victim) != 0)
                fail_msg("%s: the target of the symlink %s was written through", victim, names[i]);
            snprintf(p, sizeof p, "%s/%s", out, names[i]);
            const bool link = lstat(p, &sb) == 0 && S_ISLNK(sb.st_mode);
            if (round == 0 && !link && strcmp(names[i], ".bfshard-inprogress") != 0 && names[i][0] != '.')
                fail_msg("%s: a symlink bfshard did not make was removed", p);
            if (round == 1 && link)
                fail_msg("%s is still a symlink after --force", p);
        }
    }
    assert_int_equal(bfs_verify(out, stderr, NULL), 0);
    tu_rmrf(tmp);
    free(tmp);
}

static void names_never_paths(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("names");
    char in[4096], out[4096], f[4096];
    snprintf(in, sizeof in, "%s/in", tmp);
    snprintf(out, sizeof out, "%s/a/b/out", tmp);
    snprintf(f, sizeof f, "%s/model.safetensors", in);
    assert_int_equal(tu_sh("mkdir -p %s %s/a/b", in, tmp), 0);
    uint8_t data[64] = {0};
    tu_write_st(f,
             "{\"../../evil\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
             "\"/tmp/bfs-abs-evil\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]},"
             "\"..\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]},"
             "\"a/../../x.safetensors\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[12,16]},"
             "\"../../evil2_blocks\":{\"dtype\":\"U8\",\"shape\":[1,2,1,16],\"data_offsets\":[16,48]},"
             "\"../../evil2_scales\":{\"dtype\":\"U8\",\"shape\":[1,2,1],\"data_offsets\":[48,50]}}",
             data, 50);
    bfs_convert_opts o;
    bfs_convert_opts_init(&o);
    o.world_size = 2;
    o.device = "cpu";
    if (bfs_convert(in, out, &o, NULL) != 0)
        fail_msg("%s", bfs_last_error());
    assert_int_equal(bfs_verify(out, stderr, NULL), 0);
    /* nothing but the planned files, nothing outside OUTDIR */
    assert_int_equal(tu_sh("test \"$(ls -A %s | tr '\\n' ' ')\" = \"bfshard.manifest.json shard-00001-model-00001-of-00001.safetensors "
                           "shard-00001-model-00001-of-00001.slices shard-00002-model-00001-of-00001.safetensors "
                           "shard-00002-model-00001-of-00001.slices xxh128sums.txt \"", out), 0);
    assert_int_equal(tu_sh("test \"$(ls -A %s/a/b)\" = out && test \"$(ls -A %s/a)\" = b", tmp, tmp), 0);
    assert_int_equal(tu_sh("test -e /tmp/bfs-abs-evil"), 1);
    /* an index naming a file outside the input directory: exit 3 */
    assert_int_equal(tu_sh("printf '{\"weight_map\":{\"x\":\"../model.safetensors\"}}' > %s/model.safetensors.index.json", in), 0);
    bfs__err_clear();
    o.force = 1;
    assert_int_equal(bfs_convert(in, out, &o, NULL), BFS_EINPUT);
    assert_non_null(strstr(bfs_last_error(), "not a plain file name"));
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- hostile input directories: no hang ---------------------------------------------------- */
static void hostile_inputs_no_hang(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("hostile");
    char d[4096], args[8192];
    /* a FIFO where a weights file or config.json should be: refused at once, not a hang */
    snprintf(d, sizeof d, "%s/fifo", tmp);
    assert_int_equal(tu_sh("mkdir -p %s && mkfifo %s/model.safetensors", d, d), 0);
    snprintf(args, sizeof args, "timeout 20 %s inspect %s 2>/dev/null >/dev/null", tu_bfshard(), d);
    assert_int_equal(tu_sh("%s", args), 3);
    snprintf(d, sizeof d, "%s/fifocfg", tmp);
    assert_int_equal(tu_sh("mkdir -p %s && cp fixtures/bnb-nf4/model.safetensors %s/ && mkfifo %s/config.json", d, d, d), 0);
    snprintf(args, sizeof args, "timeout 20 %s inspect %s 2>/dev/null >/dev/null", tu_bfshard(), d);
    assert_int_equal(tu_sh("%s", args), 3);
    /* an index naming 300000 distinct files: fails on the first missing one, quickly
     * (a quadratic de-duplication took minutes) */
    snprintf(d, sizeof d, "%s/bigindex", tmp);
    assert_int_equal(mkdir(d, 0755), 0);
    char f[4096];
    snprintf(f, sizeof f, "%s/model.safetensors.index.json", d);
    FILE *fp = fopen(f, "w");
    assert_non_null(fp);
    fputs("{\"weight_map\": {", fp);
    for (int i = 0; i < 300000; i++)
        fprintf(fp, "%s\"t%d\": \"f%07d.safetensors\"", i ? ", " : "", i, 299999 - i);
    fputs("}}", fp);
    assert_int_equal(fclose(fp), 0);
    const double t0 = tu_now_s();
    snprintf(args, sizeof args, "timeout 60 %s inspect %s 2>/dev/null >/dev/null", tu_bfshard(), d);
    assert_int_equal(tu_sh("%s", args), 3);
    /* `timeout 60` above is the bound (a quadratic de-duplication took minutes): exit 3,
     * not 124; the time is reported, not asserted */
    fprintf(stderr, "  index of 300000 file names rejected in %.2f s\n", tu_now_s() - t0);
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- verify: every single flipped bit of every file ----------------------------------------- */
static void verify_every_flipped_bit(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("bits");
    char out[4096];
    snprintf(out, sizeof out, "%s/out", tmp);
    bfs_convert_opts o;
    bfs_convert_opts_init(&o);
    o.world_size = 3;
    o.device = "cpu";
    assert_int_equal(bfs_convert("fixtures/mxfp4-tiny", out, &o, NULL), 0);
    assert_int_equal(bfs_verify(out, NULL, NULL), 0);
    DIR *d = opendir(out);
    struct dirent *e;
    int files = 0, flips = 0;
    const int N = getenv("BFS_FLIPS") ? atoi(getenv("BFS_FLIPS")) : 48;
    while ((e = readdir(d)) != NULL) {
        if (e->d_type != DT_REG)
            continue;
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", out, e->d_name);
        size_t len;
        uint8_t *b = tu_read_file(p, &len);
        assert_non_null(b);
        files++;
        for (int i = 0; i < N; i++) {
            /* the first flips hit the start and the end of the file, then anywhere */
            const uint64_t bit = i < 8 ? (i < 4 ? (uint64_t)i * 7 : (uint64_t)len * 8 - 1 - (uint64_t)(i - 4) * 5)
                                       : rng() % ((uint64_t)len * 8);
            b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            assert_int_equal(tu_write_file(p, b, len), 0);
            char *rep = NULL;
            size_t rl = 0;
            FILE *rf = open_memstream(&rep, &rl);
            bfs__err_clear();
            const int rc = bfs_verify(out, rf, NULL);
            fclose(rf);
            if (rc == 0)
                fail_msg("bit %llu of %s flipped: verify passed", (unsigned long long)bit, e->d_name);
            if (!strstr(rep, e->d_name) && !strstr(bfs_last_error(), e->d_name))
                fail_msg("bit %llu of %s flipped: verify failed without naming the file: %s / %s",
                         (unsigned long long)bit, e->d_name, rep, bfs_last_error());
            free(rep);
            b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            flips++;
        }
        assert_int_equal(tu_write_file(p, b, len), 0);
        free(b);
    }
    closedir(d);
    fprintf(stderr, "  %d single-bit flips over %d files, each caught and named\n", flips, files);
    assert_true(files >= 7);
    assert_int_equal(bfs_verify(out, NULL, NULL), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- must-fail cases found by fuzzing, by name ----------------------------------------------- */
static int plan_file(const char *header, const uint8_t *data, size_t n)
{
    char *tmp = tu_tmpdir("mf");
    char f[4096];
    snprintf(f, sizeof f, "%s/m.safetensors", tmp);
    tu_write_st(f, header, data, n);
    FILE *null = fopen("/dev/null", "w");
    bfs__err_clear();
    const int rc = bfs_inspect(f, NULL, 0, null);
    fclose(null);
    tu_rmrf(tmp);
    free(tmp);
    return rc;
}

static void fuzz_found_must_fail(void **s)
{
    (void)s;
    uint8_t z[64] = {0};
    /* "_blocks" + "_scales": the output tensor would be named "" */
    assert_int_equal(plan_file("{\"_blocks\":{\"dtype\":\"U8\",\"shape\":[1,1,1,16],\"data_offsets\":[0,16]},"
                               "\"_scales\":{\"dtype\":\"U8\",\"shape\":[1,1,1],\"data_offsets\":[16,17]}}", z, 17),
                     BFS_EINPUT);
    assert_non_null(strstr(bfs_last_error(), "\"_blocks\" (offset"));
    /* "__metadata___blocks": the output tensor would replace the header's metadata */
    assert_int_equal(plan_file("{\"__metadata___blocks\":{\"dtype\":\"U8\",\"shape\":[1,1,1,16],\"data_offsets\":[0,16]},"
                               "\"__metadata___scales\":{\"dtype\":\"U8\",\"shape\":[1,1,1],\"data_offsets\":[16,17]}}", z, 17),
                     BFS_EINPUT);
    assert_non_null(strstr(bfs_last_error(), "__metadata__"));
    /* names read from a file carry no terminal control sequences into the one-line error */
    assert_int_equal(plan_file("{\"x\\u001b[2J\\u001b]0;pwned\\u0007\\n_blocks\":{\"dtype\":\"U8\",\"shape\":[1,1,1,16],\"data_offsets\":[0,16]}}", z, 16),
                     BFS_EINPUT);
    for (const char *p = bfs_last_error(); *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            fail_msg("control character 0x%02x in the error message: %s", (unsigned char)*p, bfs_last_error());
    assert_non_null(strstr(bfs_last_error(), "[2J"));
}

/* ---- the fuzz corpora, replayed --------------------------------------------------------------- */
typedef int (*fz_fn)(const uint8_t *, size_t);

static void fuzz_corpora_replay(void **s)
{
    (void)s;
    static const struct {
        const char *name;
        fz_fn fn;
    } targets[] = {
        {"st_parse", fz_st_parse_one},
        {"plan", fz_plan_one},
        {"input", fz_input_one},
        {"bnb_blob", fz_bnb_blob_one},
    };
    int argc = 0;
    char **argv = NULL;
    fz_dir();
    fz_bnb_blob_init(&argc, &argv);
    for (size_t t = 0; t < sizeof targets / sizeof *targets; t++) {
        char d[512];
        snprintf(d, sizeof d, "fuzz/corpus/%s", targets[t].name);
        const int a = tu_replay_dir(d, targets[t].fn, false);
        snprintf(d, sizeof d, "fuzz/regress/%s", targets[t].name);
        const int b = tu_replay_dir(d, targets[t].fn, false);
        fprintf(stderr, "  fuzz_%s: %d seeds + %d regression inputs replayed\n", targets[t].name, a, b);
        assert_true(a > 5);
    }
}

/* Re-executed by sigbus_threads: our handler installed, then a truncated mapping that
 * is not an input touched. Must die of SIGBUS. */
static int foreign_sigbus(const char *path)
{
    bfs_input *in = NULL;
    if (bfs__input_open("fixtures/bnb-nf4/model.safetensors", &in) != 0)
        return 10;
    const int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, 1 << 16) != 0)
        return 11;
    volatile const uint8_t *m = mmap(NULL, 1 << 16, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED || ftruncate(fd, 0) != 0)
        return 12;
    return m[1 << 15] + 13; /* SIGBUS here */
}

int main(int argc, char **argv)
{
    if (getenv("BFS_RELIABILITY_CHILD") && argc > 1)
        return foreign_sigbus(argv[1]);
    signal(SIGXFSZ, SIG_IGN);
    if (getenv("BFS_TEST")) /* run only the tests matching this pattern */
        cmocka_set_test_filter(getenv("BFS_TEST"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fuzz_found_must_fail),
        cmocka_unit_test(fuzz_corpora_replay),
        cmocka_unit_test(verify_every_flipped_bit),
        cmocka_unit_test(symlinks_in_outdir),
        cmocka_unit_test(names_never_paths),
        cmocka_unit_test(hostile_inputs_no_hang),
        cmocka_unit_test(sigbus_threads),
        cmocka_unit_test(truncated_during_convert),
        cmocka_unit_test(truncated_by_other_process),
        cmocka_unit_test(efbig_rlimit),
        cmocka_unit_test_teardown(enospc_tmpfs, unmount_teardown),
        cmocka_unit_test(kill9_on_events),
        cmocka_unit_test(kill9_stepped_and_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
