/* The writer's pool of lanes (src/output/writer.c): many files written at once, their jobs
 * interleaved and spread over several lanes, from a ring of shared buffers, give each file's
 * bytes, XXH3-128 and piece hashes as one plain write would, with O_DIRECT ($TMPDIR where it
 * takes it) and buffered (/dev/shm); a write that fails is one error naming the file and the
 * offset, whatever the other lanes do; a disk that fills mid-run (a file-size limit) fails
 * cleanly, every lane drained; HF shards interleaved over two lanes, killed (-9) at each of
 * their temporaries, resume to the files of a clean one-at-a-time run. */
#include "testutil.h"
#include "bfs_internal.h"
#include "output/writer.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static uint32_t rng = 777;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

#define NFILES 10
#define NBUF 6
#define CAP (1u << 20)

typedef struct pfile {
    char path[4096];
    int fd, slot;
    size_t size, off;
    uint8_t *want;
    int piece;
    char hex[33];
    bfs_dig16 *dig, *want_dig;
    XXH3_state_t *pst;
    bool ended;
} pfile;

/* Writes NFILES files of random sizes under dir over `lanes` lanes, jobs interleaved round the
 * files in random sizes from a ring of NBUF buffers; bad: the index of a file whose fd cannot
 * be written (-1: none). Returns the first failure (0: every file checked). */
static int pool_run(const char *dir, int lanes, bool direct, int bad, uint32_t seed)
{
    bfs_writer w;
    memset(&w, 0, sizeof w);
    bfs__err_clear(); /* this run's error, not one before */
    w.nlanes = lanes;
    if (direct)
        unsetenv("BFSHARD_DIRECT");
    else
        setenv("BFSHARD_DIRECT", "0", 1);
    assert_int_equal(bfs__writer_start(&w), 0);
    uint8_t *buf[NBUF];
    uint64_t bufjob[NBUF] = {0};
    for (int i = 0; i < NBUF; i++)
        assert_int_equal(posix_memalign((void **)&buf[i], BFS_DIO_ALIGN, CAP + BFS_DIO_ALIGN), 0);
    pfile *f = calloc(NFILES, sizeof *f);
    assert_non_null(f);
    rng = seed;
    for (int i = 0; i < NFILES; i++) {
        pfile *p = &f[i];
        snprintf(p->path, sizeof p->path, "%s/f%d", dir, i);
        p->size = i == 0 ? 0 : rnd() % 4 == 0 ? rnd() % 9000 : rnd() % (3u << 20);
        p->want = malloc(p->size + 1);
        for (size_t k = 0; k < p->size; k++)
            p->want[k] = (uint8_t)rnd();
        p->dig = calloc(p->size + 2, sizeof *p->dig);
        p->want_dig = calloc(p->size + 2, sizeof *p->want_dig);
        p->pst = XXH3_createState();
        XXH3_128bits_reset(p->pst);
        const int wfd = open(p->path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        assert_true(wfd >= 0);
        if (ftruncate(wfd, (off_t)p->size) != 0) /* past a file-size limit (full_disk_mid_run) */
            assert_int_equal(errno, EFBIG);   /* the writes there fail */
        if (i == bad) { /* a descriptor write(2) refuses */
            close(wfd);
            p->fd = open(p->path, O_RDONLY);
        } else {
            p->fd = wfd;
        }
        p->slot = bfs__writer_begin_file(&w, p->fd, p->path, p->dig, NULL, NULL, NULL);
        assert_true(p->slot >= 0);
    }
    int rc = 0, left = NFILES, b = 0;
    while (left > 0 && rc == 0) {
        for (int i = 0; i < NFILES && rc == 0; i++) {
            pfile *p = &f[i];
            if (p->ended)
                continue;
            rc = bfs__writer_use(&w, p->slot);
            if (rc == 0 && p->off == 0 && p->size > 0) { /* a header first, through the carry */
                const size_t hl = 1 + rnd() % (p->size < 6000 ? p->size : 6000);
                rc = bfs__writer_push(&w, &(bfs_wjob){.buf = p->want, .len = hl, .off = 0, .piece = -1});
                p->off = hl;
            } else if (rc == 0 && p->off < p->size) {
                size_t n = rnd() % 3 == 0 ? rnd() % 5000 : rnd() % CAP;
                n = n > p->size - p->off ? p->size - p->off : n;
                rc = bfs__writer_wait_job(&w, bufjob[b]); /* the ring: the buffer free again */
                uint8_t *out = buf[b] + p->off % BFS_DIO_ALIGN;
                memcpy(out, p->want + p->off, n);
                const bool end = p->off + n == p->size || rnd() % 3 == 0;
                XXH3_128bits_update(p->pst, out, n);
                if (end) {
                    bfs__dig16_of(XXH3_128bits_digest(p->pst), &p->want_dig[p->piece]);
                    XXH3_128bits_reset(p->pst);
                }
                if (rc == 0)
                    rc = bfs__writer_push(&w, &(bfs_wjob){.buf = out, .len = n, .off = p->off, .piece = p->piece,
                                                          .piece_end = end, .headroom = true});
                bufjob[b] = bfs__writer_pushed(&w);
                b = (b + 1) % NBUF;
                p->piece += end;
                p->off += n;
            } else if (rc == 0) {
                rc = bfs__writer_end_file(&w, p->hex);
                p->ended = true;
                left--;
            }
        }
    }
    for (int i = 0; i < NFILES && rc == 0; i++)
        rc = bfs__writer_wait_file(&w, f[i].slot);
    if (rc < 0)
        bfs__writer_wait(&w, 0); /* every lane drained before the buffers go */
    for (int i = 0; i < NFILES; i++) {
        pfile *p = &f[i];
        if (rc == 0) {
            assert_int_equal(fsync(p->fd), 0);
            size_t n = 0;
            uint8_t *got = tu_read_file(p->path, &n);
            assert_int_equal(n, p->size);
            if (n)
                assert_memory_equal(got, p->want, n);
            free(got);
            char hw[33];
            bfs__hash_hex(XXH3_128bits(p->want, p->size), hw);
            assert_string_equal(p->hex, hw);
            assert_memory_equal(p->dig, p->want_dig, (size_t)p->piece * sizeof *p->dig);
        }
        bfs__writer_release_file(&w, p->slot);
        close(p->fd);
        XXH3_freeState(p->pst);
        free(p->want), free(p->dig), free(p->want_dig);
    }
    free(f);
    bfs__writer_stop(&w);
    for (int i = 0; i < NBUF; i++)
        free(buf[i]);
    unsetenv("BFSHARD_DIRECT");
    return rc;
}

static void many_files_many_lanes(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("pool");
    char shm[64];
    snprintf(shm, sizeof shm, "/dev/shm/bfs-pool-%d", (int)getpid());
    const bool have_shm = mkdir(shm, 0755) == 0;
    for (uint32_t seed = 1; seed <= 6; seed++)
        for (int lanes = 1; lanes <= 4; lanes += seed % 2 ? 1 : 3) {
            assert_int_equal(pool_run(tmp, lanes, true, -1, seed * 7919), 0);
            assert_int_equal(pool_run(tmp, lanes, false, -1, seed * 7919), 0);
            if (have_shm)
                assert_int_equal(pool_run(shm, lanes, true, -1, seed * 7919), 0); /* refuses O_DIRECT */
        }
    if (have_shm)
        tu_rmrf(shm);
    tu_rmrf(tmp);
    free(tmp);
}

/* one file's writes fail: the run fails once, with that file and an offset, on every lane count */
static void write_error_names_file_and_offset(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("poolerr");
    for (int lanes = 1; lanes <= 3; lanes++) {
        const int rc = pool_run(tmp, lanes, false, 5, 4242);
        assert_int_equal(rc, BFS_EIO);
        const char *e = bfs_last_error();
        char want[4200];
        snprintf(want, sizeof want, "%s/f5: write of ", tmp);
        if (!strstr(e, want) || !strstr(e, "at offset "))
            fail_msg("the error does not name the file and the offset: %s", e);
    }
    tu_rmrf(tmp);
    free(tmp);
}

/* the disk fills mid-run (a file-size limit stands in): one clean failure, the lanes drained */
static void full_disk_mid_run(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("poolfull");
    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    int fails = 0;
    for (uint32_t seed = 1; seed <= 4; seed++) {
        struct rlimit lim = {.rlim_cur = (rlim_t)(1u << 20) * seed / 2, .rlim_max = old.rlim_max};
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
        const int rc = pool_run(tmp, 3, false, -1, seed * 31337);
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
        if (rc < 0) {
            assert_int_equal(rc, BFS_EIO);
            if (!strstr(bfs_last_error(), "File too large") || !strstr(bfs_last_error(), "at offset "))
                fail_msg("a full disk is not one clear error: %s", bfs_last_error());
            fails++;
        }
    }
    signal(SIGXFSZ, prev);
    assert_true(fails > 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* HF shards written together by two lanes, kill -9 after each temporary is created, then
 * the same command again: the OUTDIR a clean run writes one shard at a time */
static void hf_interleaved_kill9_resume(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("poolhf");
    char ref[4096], out[4096], env[128];
    snprintf(ref, sizeof ref, "%s/ref", tmp);
    char *rargv[] = {(char *)tu_bfshard(), "convert", "fixtures/mxfp4-tiny", ref, "--layout", "hf",
                     "--max-shard-size", "64K", "--device", "cpu", "--quiet", NULL};
    assert_int_equal(tu_run(rargv, &(tu_proc){.env = "BFSHARD_GROUP=1"}), 0);
    setenv("BFSHARD_WRITERS", "2", 1);
    for (int nth = 1; nth <= 7; nth++) {
        snprintf(out, sizeof out, "%s/out%d", tmp, nth);
        char *argv[] = {(char *)tu_bfshard(), "convert", "fixtures/mxfp4-tiny", out, "--layout", "hf",
                        "--max-shard-size", "64K", "--device", "cpu", "--quiet", NULL};
        snprintf(env, sizeof env, "BFSHARD_TEST_SIGNAL=tmp:9:%d", nth);
        assert_int_equal(tu_run(argv, &(tu_proc){.env = env}), 1000 + SIGKILL);
        assert_int_equal(tu_run(argv, NULL), 0);
        if (tu_sh("diff -r '%s' '%s' >/dev/null", ref, out) != 0)
            fail_msg("kill -9 at temporary %d: the resumed OUTDIR differs from a clean run", nth);
    }
    unsetenv("BFSHARD_WRITERS");
    tu_rmrf(tmp);
    free(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(many_files_many_lanes),
        cmocka_unit_test(write_error_names_file_and_offset),
        cmocka_unit_test(full_disk_mid_run),
        cmocka_unit_test(hf_interleaved_kill9_resume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
