/* Shared helpers for the C tests (testutil.h says what each does). */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- files and directories -------------------------------------------------------------- */
uint8_t *tu_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    long n;
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        goto fail;
    buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n)
        goto fail;
    fclose(f);
    buf[n] = 0; /* text files are strings to their readers (strstr): never past the end */
    *len = (size_t)n;
    return buf;
fail:
    free(buf);
    fclose(f);
    return NULL;
}

char *tu_slurp(const char *path)
{
    size_t n = 0;
    char *t = (char *)tu_read_file(path, &n);
    if (!t) {
        t = calloc(1, 1);
        assert_non_null(t);
        return t;
    }
    t[n] = '\0'; /* tu_read_file leaves a spare byte */
    return t;
}

int tu_write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    const int ok = fwrite(buf, 1, len, f) == len;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

char *tu_tmpdir(const char *tag)
{
    const char *base = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/bfs-%s-XXXXXX", base && *base ? base : "/tmp", tag);
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

void tu_rmrf(const char *path)
{
    if (path && *path && strcmp(path, "/") != 0)
        tu_sh("rm -rf '%s'", path);
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

char **tu_dir_names(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    size_t n = 0, cap = 16;
    char **v = malloc(cap * sizeof *v);
    assert_non_null(v);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (n + 1 >= cap) {
            cap *= 2;
            v = realloc(v, cap * sizeof *v);
            assert_non_null(v);
        }
        v[n] = strdup(e->d_name);
        assert_non_null(v[n]);
        n++;
    }
    closedir(d);
    qsort(v, n, sizeof *v, cmp_name);
    v[n] = NULL;
    return v;
}

void tu_names_free(char **names)
{
    for (size_t i = 0; names && names[i]; i++)
        free(names[i]);
    free(names);
}

bool tu_dir_has(const char *dir, const char *suffix)
{
    char **v = tu_dir_names(dir);
    const size_t m = strlen(suffix);
    bool found = false;
    for (size_t i = 0; v && v[i] && !found; i++) {
        const size_t n = strlen(v[i]);
        found = n >= m && strcmp(v[i] + n - m, suffix) == 0;
    }
    tu_names_free(v);
    return found;
}

int tu_count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

double tu_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- synthetic inputs -------------------------------------------------------------------- */
void tu_write_st(const char *path, const char *header, const void *data, size_t data_len)
{
    const size_t hl = strlen(header);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    assert_int_equal(fwrite(len, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, hl, f), hl);
    void *zeros = data ? NULL : calloc(1, data_len ? data_len : 1);
    assert_true(data || zeros);
    assert_int_equal(fwrite(data ? data : zeros, 1, data_len, f), data_len);
    free(zeros);
    assert_int_equal(fclose(f), 0);
}

void tu_gen_mxfp4(const char *dir, int E, int layers, bool bias)
{
    enum { R = 256, G = 90 };
    const size_t nb = (size_t)E * R * G * 16, ns = (size_t)E * R * G, nbias = bias ? (size_t)E * 512 * 2 : 0;
    const int L = layers;
    size_t cap = (size_t)L * 600 + 64, k = 0;
    char *hdr = malloc(cap), path[4096];
    assert_non_null(hdr);
    uint64_t pos = 0;
    k += (size_t)snprintf(hdr + k, cap - k, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int l = 0; l < L; l++) {
        k += (size_t)snprintf(hdr + k, cap - k,
                              ",\"model.layers.%d.mlp.experts.gate_up_proj_blocks\":{\"dtype\":\"U8\",\"shape\":[%d,%d,%d,16],\"data_offsets\":[%llu,%llu]}"
                              ",\"model.layers.%d.mlp.experts.gate_up_proj_scales\":{\"dtype\":\"U8\",\"shape\":[%d,%d,%d],\"data_offsets\":[%llu,%llu]}",
                              l, E, R, G, (unsigned long long)pos, (unsigned long long)(pos + nb), l, E, R, G,
                              (unsigned long long)(pos + nb), (unsigned long long)(pos + nb + ns));
        if (bias)
            k += (size_t)snprintf(hdr + k, cap - k,
                                  ",\"model.layers.%d.mlp.experts.gate_up_proj_bias\":{\"dtype\":\"BF16\",\"shape\":[%d,512],\"data_offsets\":[%llu,%llu]}",
                                  l, E, (unsigned long long)(pos + nb + ns), (unsigned long long)(pos + nb + ns + nbias));
        pos += nb + ns + nbias;
    }
    k += (size_t)snprintf(hdr + k, cap - k, "}");
    while (k % 8)
        hdr[k++] = ' ';
    hdr[k] = '\0';
    uint8_t *data = malloc((size_t)pos);
    assert_non_null(data);
    uint64_t x = 12345;
    for (uint64_t i = 0; i < pos; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        data[i] = (uint8_t)(x >> 56);
    }
    for (int l = 0; l < L; l++) { /* scales in a sane range */
        uint8_t *sc = data + (uint64_t)l * (nb + ns + nbias) + nb;
        for (size_t i = 0; i < ns; i++)
            sc[i] = (uint8_t)(100 + sc[i] % 40);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    tu_write_st(path, hdr, data, (size_t)pos);
    free(data);
    free(hdr);
    assert_int_equal(tu_sh("cp fixtures/mxfp4-tiny/config.json fixtures/mxfp4-tiny/tokenizer.json '%s'/", dir), 0);
}

/* ---- running commands --------------------------------------------------------------------- */
int tu_sh(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    const int st = system(cmd);
    if (st == -1 || !WIFEXITED(st))
        return -1;
    /* 127: the shell found no such command. A tool the suite needs (zstd, xxh128sum,
     * cmp, ...) is missing: that is a broken test machine, never a passing check
     * (`assert_int_not_equal(tu_sh("zstd -d ..."), 0)` would pass without zstd). */
    if (WEXITSTATUS(st) == 127)
        fail_msg("a command the test runs was not found (exit 127; scripts/install-deps.sh installs the "
                 "suite's tools): %s", cmd);
    return WEXITSTATUS(st);
}

const char *tu_bfshard(void)
{
    const char *p = getenv("BFSHARD");
    return p && *p ? p : "build/bfshard";
}

int tu_cli(const char *prefix, const char *args, char *err, size_t cap)
{
    char *tmp = tu_tmpdir("cli");
    char ef[4096], abs[PATH_MAX];
    assert_non_null(tmp);
    snprintf(ef, sizeof ef, "%s/err", tmp);
    const char *exe = realpath(tu_bfshard(), abs) ? abs : tu_bfshard();
    const int rc = tu_sh("%s '%s' %s 2>'%s' >/dev/null </dev/null", prefix ? prefix : "", exe, args, ef);
    if (err && cap) {
        char *e = tu_slurp(ef);
        snprintf(err, cap, "%s", e);
        free(e);
    }
    tu_rmrf(tmp);
    free(tmp);
    return rc;
}

static pid_t cat_pid; /* the `cat` writing an fsize run's stderr, reaped by tu_run */

pid_t tu_spawn(char *const argv[], const tu_proc *p)
{
    static const tu_proc none;
    int pfd[2] = {-1, -1};
    if (!p)
        p = &none;
    if (p->fsize && p->errf) {
        assert_int_equal(pipe(pfd), 0);
        cat_pid = fork();
        assert_true(cat_pid >= 0);
        if (cat_pid == 0) {
            const int fd = open(p->errf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            dup2(pfd[0], 0);
            dup2(fd, 1);
            close(pfd[0]);
            close(pfd[1]);
            execlp("cat", "cat", (char *)NULL);
            _exit(127);
        }
    }
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        const int dn = open("/dev/null", O_RDWR);
        const int ef = pfd[1] >= 0 ? pfd[1] : p->errf ? open(p->errf, O_WRONLY | O_CREAT | O_TRUNC, 0644) : dn;
        dup2(p->out_fd > 0 ? p->out_fd : dn, 1);
        dup2(ef, 2);
        if (pfd[0] >= 0)
            close(pfd[0]);
        if (p->env)
            putenv((char *)p->env);
        else
            unsetenv("BFSHARD_TEST_SIGNAL");
        signal(SIGPIPE, SIG_DFL);
        signal(SIGXFSZ, SIG_IGN);
        if (p->fsize) {
            const struct rlimit rl = {(rlim_t)p->fsize, (rlim_t)p->fsize};
            setrlimit(RLIMIT_FSIZE, &rl);
        }
        execv(tu_bfshard(), argv);
        _exit(127);
    }
    if (pfd[0] >= 0) {
        close(pfd[0]);
        close(pfd[1]);
    }
    return pid;
}

int tu_wait(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0)
        assert_int_equal(errno, EINTR);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1000 + WTERMSIG(st);
}

int tu_run(char *const argv[], const tu_proc *p)
{
    const int rc = tu_wait(tu_spawn(argv, p));
    if (cat_pid > 0)
        tu_wait(cat_pid);
    cat_pid = 0;
    return rc;
}

int tu_watch(const char *dir, uint32_t mask)
{
    const int ifd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    assert_true(ifd >= 0);
    assert_true(inotify_add_watch(ifd, dir, mask) >= 0);
    return ifd;
}

bool tu_kill_on_event(int ifd, pid_t pid, const char *name, uint32_t mask, double timeout_s, int *rc)
{
    bool killed = false;
    char buf[65536] __attribute__((aligned(8)));
    const double deadline = tu_now_s() + timeout_s;
    while (!killed && tu_now_s() < deadline) {
        struct pollfd p = {.fd = ifd, .events = POLLIN};
        if (poll(&p, 1, 20) > 0) {
            const ssize_t n = read(ifd, buf, sizeof buf);
            for (ssize_t off = 0; n > 0 && off < n && !killed;) {
                const struct inotify_event *ev = (const struct inotify_event *)(buf + off);
                if ((ev->mask & mask) && ev->len && !strcmp(ev->name, name)) {
                    kill(pid, SIGKILL);
                    killed = true;
                }
                off += (ssize_t)(sizeof *ev + ev->len);
            }
        }
        int st;
        if (!killed && waitpid(pid, &st, WNOHANG) == pid) { /* it exited first */
            *rc = WIFEXITED(st) ? WEXITSTATUS(st) : 1000 + WTERMSIG(st);
            return false;
        }
    }
    if (!killed)
        kill(pid, SIGKILL);
    *rc = tu_wait(pid);
    return killed;
}

/* under ASan, a child checks for leaks before it leaves (_exit runs no leak check) */
#if defined(__SANITIZE_ADDRESS__)
#define TU_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TU_LSAN 1
#endif
#endif
#ifdef TU_LSAN
#include <sanitizer/lsan_interface.h>
#define TU_LEAKED() __lsan_do_recoverable_leak_check()
#else
#define TU_LEAKED() 0
#endif

int tu_replay_dir(const char *dir, int (*fn)(const uint8_t *, size_t), bool leak_check)
{
    char **names = tu_dir_names(dir);
    int n = 0;
    for (size_t i = 0; names && names[i]; i++) {
        if (names[i][0] == '.')
            continue;
        char p[8192];
        size_t len;
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        uint8_t *b = tu_read_file(p, &len);
        if (!b)
            continue;
        fflush(NULL);
        const pid_t pid = fork();
        if (pid == 0) {
            fn(b, len);
            _exit(leak_check && TU_LEAKED() ? 3 : 0);
        }
        const int rc = tu_wait(pid);
        if (rc != 0)
            fail_msg("fuzz input %s: %s %d", p, rc > 1000 ? "killed by signal" : "exit", rc % 1000);
        free(b);
        n++;
    }
    tu_names_free(names);
    return n;
}

/* ---- reads of byte ranges ---------------------------------------------------------------- */
#define TU_GUARD 64

void tu_check_ranges(tu_read_ranges_fn read, const char *path, const uint8_t *want, const uint64_t (*ol)[2],
                     size_t n, int threads)
{
    bfs_range *r = calloc(n ? n : 1, sizeof *r);
    uint8_t **buf = calloc(n ? n : 1, sizeof *buf);
    assert_non_null(r);
    assert_non_null(buf);
    for (size_t i = 0; i < n; i++) {
        buf[i] = malloc(ol[i][1] + 2 * TU_GUARD);
        assert_non_null(buf[i]);
        memset(buf[i], 0xA5, ol[i][1] + 2 * TU_GUARD);
        r[i] = (bfs_range){.offset = ol[i][0], .length = ol[i][1], .dest = buf[i] + TU_GUARD};
    }
    const int rc = read(path, r, n, threads);
    if (rc != 0)
        fprintf(stderr, "%s\n", bfs_last_error());
    assert_int_equal(rc, 0);
    for (size_t i = 0; i < n; i++) {
        assert_memory_equal(buf[i] + TU_GUARD, want + ol[i][0], ol[i][1]);
        for (size_t g = 0; g < TU_GUARD; g++) {
            assert_int_equal(buf[i][g], 0xA5);
            assert_int_equal(buf[i][TU_GUARD + ol[i][1] + g], 0xA5);
        }
        free(buf[i]);
    }
    free(buf);
    free(r);
}

static void *tu__cancel_loop(void *arg)
{
    tu_canceller *c = arg;
    while (!atomic_load(&c->stop)) {
        bfs_cancel();
        usleep(200);
    }
    return NULL;
}

void tu_canceller_start(tu_canceller *c)
{
    atomic_store(&c->stop, 0);
    assert_int_equal(pthread_create(&c->t, NULL, tu__cancel_loop, c), 0);
}

void tu_canceller_stop(tu_canceller *c)
{
    atomic_store(&c->stop, 1);
    pthread_join(c->t, NULL);
}

uint64_t tu_compress(const char *in, const char *out, int level, int mode, uint64_t frame, int threads)
{
    bfs_compress_opts o;
    bfs_compress_opts_init(&o);
    o.level = level;
    o.mode = mode;
    o.frame_bytes = frame;
    o.threads = threads;
    o.force = 1;
    bfs_compress_result res;
    bfs_compress_result_init(&res);
    const int rc = bfs_compress_file_opts(in, out, &o, &res);
    if (rc != 0)
        fprintf(stderr, "compress %s: %s\n", in, bfs_last_error());
    assert_int_equal(rc, 0);
    assert_true(res.frames > 0);
    return res.frames;
}

uint8_t tu_bf16_byte_at(size_t i) { return (i & 1) ? (uint8_t)(0x3c + (i >> 9) % 5) : (uint8_t)(i * 2654435761u >> 13); }

void tu_write_st_bf16(const char *path, const size_t *sizes, int n)
{
    char hdr[8192];
    size_t k = 0, off = 0;
    k += (size_t)snprintf(hdr + k, sizeof hdr - k, "{");
    for (int t = 0; t < n && k < sizeof hdr; t++) {
        k += (size_t)snprintf(hdr + k, sizeof hdr - k, "%s\"t%d\":{\"dtype\":\"BF16\",\"shape\":[%zu],\"data_offsets\":[%zu,%zu]}",
                              t ? "," : "", t, sizes[t] / 2, off, off + sizes[t]);
        off += sizes[t];
    }
    assert_true(k < sizeof hdr - 2);
    snprintf(hdr + k, sizeof hdr - k, "}");
    uint8_t *data = malloc(off);
    assert_non_null(data);
    for (size_t i = 0; i < off; i++)
        data[i] = tu_bf16_byte_at(i);
    tu_write_st(path, hdr, data, off);
    free(data);
}
