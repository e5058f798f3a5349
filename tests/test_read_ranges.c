/*
 * bfs_read_ranges: ranges of a file into memory from several threads. Every byte lands in
 * its destination and nothing around it is written (guard bytes), for ranges that are
 * large (cut into pieces across threads), small and many (one piece holds several),
 * zero-length, out of file order and crossing the pieces' borders; refused arguments
 * (BFS_EUSAGE), a missing or non-regular file (BFS_EIO, BFS_EINPUT), and a file shorter
 * than a range (BFS_EINPUT, one line naming the file and the offset); ranges laid end to end
 * in the file and in memory (read together) land as the others do, and a file ending inside
 * such a run names the range it ends in; bfs_cancel() stops a read (BFS_EINTR) and is cleared
 * by the next one.
 */
#include "testutil.h"

#include "bfshard.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILE_BYTES ((size_t)40 << 20) /* more than two 16 MiB pieces */
#define GUARD 64

static char *dir;
static char path[4096];
static uint8_t *file; /* the file's bytes */

static uint8_t byte_at(size_t i) { return (uint8_t)(i * 2654435761u >> 13); }

static int setup(void **state)
{
    dir = tu_tmpdir("read_ranges");
    snprintf(path, sizeof path, "%s/data.bin", dir);
    file = malloc(FILE_BYTES);
    for (size_t i = 0; i < FILE_BYTES; i++)
        file[i] = byte_at(i);
    return tu_write_file(path, file, FILE_BYTES);
}

static int teardown(void **state)
{
    tu_rmrf(dir);
    free(dir);
    free(file);
    return 0;
}

/* the ranges (offset, length) read with `threads` into one buffer each, guarded both sides */
static void check_ranges(const uint64_t (*ol)[2], size_t n, int threads)
{
    tu_check_ranges(bfs_read_ranges, path, file, ol, n, threads);
}

static void ranges_land_in_place(void **state)
{
    static const uint64_t ol[][2] = {
        {0, 8},                          /* a header's length */
        {8, 0},                          /* nothing */
        {100, (16u << 20) + 12345},      /* across a piece's border */
        {(16u << 20) + 12445, 3},        /* small ones right after it, in the same piece */
        {(16u << 20) + 12448, 4093},
        {(30u << 20) + 1, (10u << 20) - 1}, /* up to the file's last byte */
        {7, 1},                          /* out of file order, overlapping another's source */
    };
    const size_t n = sizeof ol / sizeof ol[0];
    for (int t = 0; t <= 5; t++)
        check_ranges(ol, n, t);
    check_ranges(ol, n, 1000); /* more threads than the most it takes */
}

static void many_small_ranges_many_threads(void **state)
{
    enum { N = 5000 };
    static uint64_t ol[N][2];
    for (size_t i = 0; i < N; i++) {
        ol[i][0] = (uint64_t)i * 8191 % (FILE_BYTES - 4096);
        ol[i][1] = i % 4096;
    }
    check_ranges(ol, N, 16);
    check_ranges(ol, N, 0);
}

static void zero_ranges_and_lengths(void **state)
{
    assert_int_equal(bfs_read_ranges(path, NULL, 0, 4), 0);
    bfs_range r[2] = {{.offset = 5, .length = 0, .dest = NULL}, {.offset = FILE_BYTES + 9, .length = 0, .dest = NULL}};
    assert_int_equal(bfs_read_ranges(path, r, 2, 0), 0); /* nothing asked for, even past the end */
}

static void refused_arguments(void **state)
{
    uint8_t b[16];
    bfs_range r = {.offset = 0, .length = 16, .dest = b};
    assert_int_equal(bfs_read_ranges(NULL, &r, 1, 1), BFS_EUSAGE);
    assert_int_equal(bfs_read_ranges(path, NULL, 1, 1), BFS_EUSAGE);
    r.dest = NULL;
    assert_int_equal(bfs_read_ranges(path, &r, 1, 1), BFS_EUSAGE);
    assert_non_null(strstr(bfs_last_error(), "no destination"));
    r.dest = b;
    r.offset = UINT64_MAX - 4;
    assert_int_equal(bfs_read_ranges(path, &r, 1, 1), BFS_EUSAGE);
    assert_non_null(strstr(bfs_last_error(), "largest file offset"));
    r.offset = (uint64_t)INT64_MAX - 8;
    assert_int_equal(bfs_read_ranges(path, &r, 1, 1), BFS_EUSAGE);
    bfs_range two[2] = {{.offset = 0, .length = (uint64_t)1 << 62, .dest = b}, {.offset = 0, .length = (uint64_t)1 << 62, .dest = b}};
    assert_int_equal(bfs_read_ranges(path, two, 2, 1), BFS_EUSAGE);
    assert_non_null(strstr(bfs_last_error(), "add up"));
    assert_int_equal(bfs_read_ranges(path, &r, SIZE_MAX, 1), BFS_EUSAGE);
}

static void missing_and_odd_files(void **state)
{
    char p[4200];
    uint8_t b[16];
    bfs_range r = {.offset = 0, .length = 16, .dest = b};
    snprintf(p, sizeof p, "%s/absent.bin", dir);
    assert_int_equal(bfs_read_ranges(p, &r, 1, 2), BFS_EIO);
    assert_non_null(strstr(bfs_last_error(), p));
    assert_null(strchr(bfs_last_error(), '\n'));
    assert_int_equal(bfs_read_ranges(dir, &r, 1, 2), BFS_EINPUT); /* a directory */
    assert_non_null(strstr(bfs_last_error(), "not a regular file"));
    snprintf(p, sizeof p, "%s/fifo", dir);
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_equal(bfs_read_ranges(p, &r, 1, 2), BFS_EINPUT); /* opened, not hung on */
}

static void short_file(void **state)
{
    const size_t size = (20u << 20) + 77; /* ends inside the second piece */
    char p[4200];
    snprintf(p, sizeof p, "%s/short.bin", dir);
    assert_int_equal(tu_write_file(p, file, size), 0);
    uint8_t *b = malloc(FILE_BYTES);
    for (int t = 1; t <= 4; t++) {
        bfs_range r = {.offset = 0, .length = FILE_BYTES, .dest = b};
        assert_int_equal(bfs_read_ranges(p, &r, 1, t), BFS_EINPUT);
        const char *e = bfs_last_error();
        assert_non_null(strstr(e, p));
        /* one thread meets the end first; with more, a later piece may find it first */
        assert_non_null(strstr(e, t == 1 ? "the file ends at offset 20971597" : "the file ends at offset "));
        assert_null(strchr(e, '\n'));
        bfs_range after = {.offset = size + 1, .length = 1, .dest = b}; /* wholly past the end */
        assert_int_equal(bfs_read_ranges(p, &after, 1, t), BFS_EINPUT);
        assert_non_null(strstr(bfs_last_error(), "at offset 20971598"));
    }
    /* the ranges inside the file still read */
    bfs_range in = {.offset = 5, .length = size - 5, .dest = b};
    assert_int_equal(bfs_read_ranges(p, &in, 1, 3), 0);
    assert_memory_equal(b, file + 5, size - 5);
    free(b);
}

/* n ranges of the file from `from`, lengths 1..4097 bytes, end to end in the file and in one
 * buffer (runs read by one pread), but for a gap in the file every 7th and in memory every
 * 11th (runs cut); the buffer's bytes are checked against the file, its guards untouched */
static void adjacent_runs(size_t n, uint64_t from, int threads)
{
    bfs_range *r = calloc(n, sizeof *r);
    uint64_t *mem = calloc(n, sizeof *mem), off = from, at = 0;
    for (size_t i = 0; i < n; i++) {
        if (i % 7 == 6)
            off += 13; /* not file-adjacent to the one before */
        if (i % 11 == 10)
            at += 5; /* not memory-adjacent */
        r[i].offset = off;
        r[i].length = 1 + i * 37 % 4097;
        mem[i] = at;
        off += r[i].length;
        at += r[i].length;
    }
    uint8_t *buf = malloc(at + 2 * GUARD);
    memset(buf, 0xA5, at + 2 * GUARD);
    for (size_t i = 0; i < n; i++)
        r[i].dest = buf + GUARD + mem[i];
    assert_int_equal(bfs_read_ranges(path, r, n, threads), 0);
    for (size_t i = 0; i < n; i++) {
        assert_memory_equal(buf + GUARD + mem[i], file + r[i].offset, r[i].length);
        if (i + 1 < n) /* a memory gap keeps its filler */
            for (uint64_t g = mem[i] + r[i].length; g < mem[i + 1]; g++)
                assert_int_equal(buf[GUARD + g], 0xA5);
    }
    for (size_t g = 0; g < GUARD; g++) {
        assert_int_equal(buf[g], 0xA5);
        assert_int_equal(buf[GUARD + at + g], 0xA5);
    }
    free(buf);
    free(mem);
    free(r);
}

static void adjacent_ranges_read_together(void **state)
{
    for (int t = 1; t <= 4; t++) {
        adjacent_runs(19000, 0, t);                  /* ~39 MB: runs across the pieces' borders */
        adjacent_runs(300, (16u << 20) - 100000, t); /* one run through a border */
    }
}

static void short_file_inside_a_run(void **state)
{
    /* three ranges end to end in the file and in memory, read as one run; the file ends in the second */
    char p[4200];
    snprintf(p, sizeof p, "%s/short-run.bin", dir);
    assert_int_equal(tu_write_file(p, file, 1000), 0);
    uint8_t b[1500];
    bfs_range r[3] = {{.offset = 100, .length = 500, .dest = b},
                      {.offset = 600, .length = 600, .dest = b + 500},
                      {.offset = 1200, .length = 300, .dest = b + 1100}};
    assert_int_equal(bfs_read_ranges(p, r, 3, 1), BFS_EINPUT);
    assert_non_null(strstr(bfs_last_error(), "the file ends at offset 1000, inside the 600 bytes asked for at offset 600"));
}

static void cancelled_mid_read(void **state)
{
    /* many small ranges that are not adjacent (a pread each): a cancel from another thread,
     * repeated, stops one of the reads with BFS_EINTR and one line naming the file; a read
     * that finished first returns 0 with every byte in place */
    enum { N = 20000 };
    bfs_range *r = calloc(N, sizeof *r);
    uint8_t *buf = malloc((size_t)N * 2048);
    for (size_t i = 0; i < N; i++)
        r[i] = (bfs_range){.offset = (uint64_t)i * 2000, .length = 1000, .dest = buf + i * 2048};
    tu_canceller c;
    tu_canceller_start(&c);
    int interrupted = 0;
    for (int k = 0; k < 2000 && !interrupted; k++) {
        const int rc = bfs_read_ranges(path, r, N, 1 + k % 3);
        if (rc == BFS_EINTR) {
            interrupted = 1;
            assert_non_null(strstr(bfs_last_error(), path));
            assert_non_null(strstr(bfs_last_error(), "interrupted"));
            assert_null(strchr(bfs_last_error(), '\n'));
        } else {
            assert_int_equal(rc, 0);
            for (size_t i = 0; i < N; i += 97)
                assert_memory_equal(buf + i * 2048, file + i * 2000, 1000);
        }
    }
    tu_canceller_stop(&c);
    assert_true(interrupted);
    /* the cancel left pending is cleared by the next read, which reads everything */
    bfs_cancel();
    assert_int_equal(bfs_read_ranges(path, r, N, 2), 0);
    for (size_t i = 0; i < N; i++)
        assert_memory_equal(buf + i * 2048, file + i * 2000, 1000);
    free(buf);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ranges_land_in_place),
        cmocka_unit_test(many_small_ranges_many_threads),
        cmocka_unit_test(zero_ranges_and_lengths),
        cmocka_unit_test(refused_arguments),
        cmocka_unit_test(missing_and_odd_files),
        cmocka_unit_test(short_file),
        cmocka_unit_test(adjacent_ranges_read_together),
        cmocka_unit_test(short_file_inside_a_run),
        cmocka_unit_test(cancelled_mid_read),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
