/*
 * bfs_read_ranges_xxh128 and bfs_read_ranges_zst_xxh128: ranges read as bfs_read_ranges and
 * bfs_read_ranges_zst read them, and the whole file's XXH3-128 (of the decompressed file for
 * a .zst / byte-grouped .bfz copy) from the same pass. Every byte lands in its destination
 * and nothing around it is written (guard bytes), and the hash equals XXH3-128 of the file,
 * for ranges across the 4 MiB pieces and the frames, inside one frame, covering whole
 * frames, many small ones, zero-length ones anywhere, ranges end to end in the file and in
 * memory, none at all (the hash alone), every thread count; ranges out of order or
 * overlapping are refused (BFS_EUSAGE), and so are a missing hash buffer, a file of another
 * size than the one given, a range past it (BFS_EINPUT, one line naming the file); a file
 * that changes size while it is read is refused, never hashed short; bfs_cancel() stops a
 * read (BFS_EINTR), and the next one hashes it whole again.
 */
#include "testutil.h"

#include "bfshard.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define FRAME (64u << 10)
#define NT 8

static char *dir;
static char st_path[4096], zst_path[4096], bfz_path[4096];
static uint8_t *file; /* the (decompressed) file's bytes */
static size_t file_len;
static char want_hex[33]; /* XXH3-128 of file */

static void hex_of(const void *p, size_t n, char out[33])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", c.digest[i]);
}

static int setup(void **state)
{
    (void)state;
    static const size_t sizes[NT] = {2, (5u << 20) + 6, 64, (3u << 20) + 2, 4096, 2 * FRAME, 10, 4u << 20};
    dir = tu_tmpdir("read_ranges_hash");
    snprintf(st_path, sizeof st_path, "%s/rank.safetensors", dir);
    snprintf(zst_path, sizeof zst_path, "%s/rank.safetensors.zst", dir);
    snprintf(bfz_path, sizeof bfz_path, "%s/rank.safetensors.bfz", dir);
    tu_write_st_bf16(st_path, sizes, NT);
    file = tu_read_file(st_path, &file_len);
    if (!file)
        return -1;
    hex_of(file, file_len, want_hex);
    tu_compress(st_path, zst_path, 3, BFS_ZST_PLAIN, FRAME, 2);
    tu_compress(st_path, bfz_path, 3, BFS_ZST_BYTEGROUP, FRAME, 2);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmrf(dir);
    free(dir);
    free(file);
    return 0;
}

/* the two readers as tu_check_ranges calls them: each read's hash must be the file's */
static int read_plain(const char *p, const bfs_range *r, size_t n, int threads)
{
    char hex[33] = "x";
    const int rc = bfs_read_ranges_xxh128(p, r, n, threads, file_len, hex);
    if (rc == 0)
        assert_string_equal(hex, want_hex);
    else
        assert_string_equal(hex, "");
    return rc;
}

static int read_zst(const char *p, const bfs_range *r, size_t n, int threads)
{
    char hex[33] = "x";
    const int rc = bfs_read_ranges_zst_xxh128(p, r, n, threads, file_len, hex);
    if (rc == 0)
        assert_string_equal(hex, want_hex);
    else
        assert_string_equal(hex, "");
    return rc;
}

/* the ranges through all three copies, with `threads` */
static void check_all(const uint64_t (*ol)[2], size_t n, int threads)
{
    tu_check_ranges(read_plain, st_path, file, ol, n, threads);
    tu_check_ranges(read_zst, zst_path, file, ol, n, threads);
    tu_check_ranges(read_zst, bfz_path, file, ol, n, threads);
}

static void ranges_land_and_hash(void **state)
{
    (void)state;
    const uint64_t ol[][2] = {
        {0, 8},                        /* the header's length */
        {8, 0},                        /* nothing */
        {100, (4u << 20) + 12345},     /* across a piece's and frames' borders */
        {(4u << 20) + 12445, 3},       /* small ones after a gap, in the same piece and frame */
        {(4u << 20) + 12448, 4093},
        {5u << 20, 3 * FRAME},         /* whole frames, maybe */
        {(5u << 20) + 3 * FRAME, 7},   /* right after it in the file (not in memory) */
        {1, 0},                        /* nothing, out of order: not checked */
        {file_len - (6u << 20) - 1, (6u << 20) + 1}, /* up to the last byte */
    };
    const size_t n = sizeof ol / sizeof ol[0];
    for (int t = 0; t <= 5; t++)
        check_all(ol, n, t);
    check_all(ol, n, 1000); /* more threads than the most it takes */
    const uint64_t whole[][2] = {{0, file_len}};
    check_all(whole, 1, 3);
}

static void hash_alone(void **state)
{
    (void)state;
    for (int t = 0; t <= 4; t++) {
        assert_int_equal(read_plain(st_path, NULL, 0, t), 0);
        assert_int_equal(read_zst(zst_path, NULL, 0, t), 0);
        assert_int_equal(read_zst(bfz_path, NULL, 0, t), 0);
    }
    bfs_range z[2] = {{.offset = 5, .length = 0, .dest = NULL}, {.offset = file_len + 9, .length = 0, .dest = NULL}};
    assert_int_equal(read_plain(st_path, z, 2, 2), 0); /* nothing asked for, even past the end */
    assert_int_equal(read_zst(zst_path, z, 2, 2), 0);
}

static void many_small_ranges(void **state)
{
    (void)state;
    enum { N = 5000 };
    static uint64_t ol[N][2];
    uint64_t off = 0;
    for (size_t i = 0; i < N; i++) {
        ol[i][0] = off;
        ol[i][1] = i % 1024;
        off += ol[i][1] + i % 3 * 517; /* some end to end, some with a gap */
    }
    assert_true(off < file_len);
    check_all(ol, N, 16);
    check_all(ol, N, 1);
}

/* n ranges end to end in the file and in one buffer (runs read by one pread), cut in the
 * file every 7th and in memory every 11th; bytes, guards and hash checked */
static void adjacent_runs(int threads)
{
    enum { N = 9000 };
    bfs_range *r = calloc(N, sizeof *r);
    uint64_t *mem = calloc(N, sizeof *mem), off = 3, at = 0;
    for (size_t i = 0; i < N; i++) {
        if (i % 7 == 6)
            off += 13;
        if (i % 11 == 10)
            at += 5;
        r[i].offset = off;
        r[i].length = 1 + i * 37 % 2049;
        mem[i] = at;
        off += r[i].length;
        at += r[i].length;
    }
    assert_true(off < file_len);
    const size_t guard = 64;
    uint8_t *buf = malloc(at + 2 * guard);
    memset(buf, 0xA5, at + 2 * guard);
    for (size_t i = 0; i < N; i++)
        r[i].dest = buf + guard + mem[i];
    assert_int_equal(read_plain(st_path, r, N, threads), 0);
    for (size_t i = 0; i < N; i++)
        assert_memory_equal(buf + guard + mem[i], file + r[i].offset, r[i].length);
    for (size_t g = 0; g < guard; g++) {
        assert_int_equal(buf[g], 0xA5);
        assert_int_equal(buf[guard + at + g], 0xA5);
    }
    free(buf);
    free(mem);
    free(r);
}

static void adjacent_ranges(void **state)
{
    (void)state;
    for (int t = 1; t <= 4; t++)
        adjacent_runs(t);
}

static void refused(void **state)
{
    (void)state;
    uint8_t b[64];
    char hex[33];
    const char *paths[3] = {st_path, zst_path, bfz_path};
    for (int m = 0; m < 3; m++) {
        int (*fn)(const char *, const bfs_range *, size_t, int, uint64_t, char *) =
            m == 0 ? bfs_read_ranges_xxh128 : bfs_read_ranges_zst_xxh128;
        bfs_range two[2] = {{.offset = 100, .length = 10, .dest = b}, {.offset = 50, .length = 10, .dest = b + 10}};
        assert_int_equal(fn(paths[m], two, 2, 2, file_len, hex), BFS_EUSAGE); /* out of order */
        assert_non_null(strstr(bfs_last_error(), "sorted by offset"));
        assert_non_null(strstr(bfs_last_error(), paths[m]));
        assert_string_equal(hex, "");
        two[1].offset = 105; /* overlapping */
        assert_int_equal(fn(paths[m], two, 2, 2, file_len, hex), BFS_EUSAGE);
        assert_non_null(strstr(bfs_last_error(), "overlapping"));
        two[1].offset = 110; /* end to end: fine */
        assert_int_equal(fn(paths[m], two, 2, 2, file_len, hex), 0);
        assert_string_equal(hex, want_hex);
        assert_int_equal(fn(paths[m], two, 2, 2, file_len, NULL), BFS_EUSAGE);
        assert_int_equal(fn(NULL, two, 2, 2, file_len, hex), BFS_EUSAGE);
        assert_int_equal(fn(paths[m], NULL, 2, 2, file_len, hex), BFS_EUSAGE);
        /* another size than the file's: truncated, or changed */
        assert_int_equal(fn(paths[m], two, 2, 2, file_len + 1, hex), BFS_EINPUT);
        assert_non_null(strstr(bfs_last_error(), "truncated"));
        assert_non_null(strstr(bfs_last_error(), paths[m]));
        assert_null(strchr(bfs_last_error(), '\n'));
        assert_int_equal(fn(paths[m], two, 2, 2, file_len - 1, hex), BFS_EINPUT);
        assert_non_null(strstr(bfs_last_error(), "changed"));
        /* a range past the end */
        bfs_range past = {.offset = file_len - 4, .length = 8, .dest = b};
        assert_int_equal(fn(paths[m], &past, 1, 2, file_len, hex), BFS_EINPUT);
        assert_non_null(strstr(bfs_last_error(), paths[m]));
        assert_string_equal(hex, "");
    }
}

/* a thread growing the file by a page and back, every 100 us, until stopped */
typedef struct {
    pthread_t t;
    atomic_int stop;
    const char *path;
} grower;

static void *grow_loop(void *arg)
{
    grower *g = arg;
    const int fd = open(g->path, O_WRONLY);
    assert_true(fd >= 0);
    while (!atomic_load(&g->stop)) {
        assert_int_equal(ftruncate(fd, (off_t)file_len + 4096), 0);
        usleep(100);
        assert_int_equal(ftruncate(fd, (off_t)file_len), 0);
        usleep(100);
    }
    close(fd);
    return NULL;
}

static void file_changes_size(void **state)
{
    /* a copy of the file, grown and shrunk back while it is read: each read either hashes it
     * right (the size the same at the start and the end) or is refused as changed -- never a
     * hash of other bytes than the file's */
    (void)state;
    char p[4200];
    snprintf(p, sizeof p, "%s/changing.safetensors", dir);
    assert_int_equal(tu_write_file(p, file, file_len), 0);
    uint8_t *buf = malloc(file_len);
    bfs_range r = {.offset = 0, .length = file_len, .dest = buf};
    grower g = {.path = p};
    atomic_store(&g.stop, 0);
    assert_int_equal(pthread_create(&g.t, NULL, grow_loop, &g), 0);
    int during = 0, at_open = 0;
    for (int k = 0; k < 3000 && !during; k++) {
        char hex[33];
        const int rc = bfs_read_ranges_xxh128(p, k % 2 ? &r : NULL, k % 2, 1 + k % 3, file_len, hex);
        if (rc == 0) {
            assert_string_equal(hex, want_hex);
            continue;
        }
        assert_int_equal(rc, BFS_EINPUT);
        assert_non_null(strstr(bfs_last_error(), p));
        assert_null(strchr(bfs_last_error(), '\n'));
        if (strstr(bfs_last_error(), "changed while read"))
            during = 1;
        else
            at_open += strstr(bfs_last_error(), "expected (changed)") != NULL;
    }
    atomic_store(&g.stop, 1);
    pthread_join(g.t, NULL);
    assert_true(during);
    (void)at_open;
    char hex[33];
    assert_int_equal(bfs_read_ranges_xxh128(p, &r, 1, 2, file_len, hex), 0);
    assert_string_equal(hex, want_hex);
    assert_memory_equal(buf, file, file_len);
    free(buf);
}

static void cancelled(void **state)
{
    /* many small ranges (a pread or a frame each): a cancel from another thread, repeated,
     * stops one of the reads with BFS_EINTR and one line naming the file; a read that
     * finished first hashed the file right; the next read after a pending cancel reads all */
    (void)state;
    enum { N = 3000 };
    bfs_range *r = calloc(N, sizeof *r);
    uint8_t *buf = malloc((size_t)N * 2048);
    for (size_t i = 0; i < N; i++)
        r[i] = (bfs_range){.offset = (uint64_t)i * 4000, .length = 1000, .dest = buf + i * 2048};
    const char *paths[2] = {st_path, zst_path};
    for (int m = 0; m < 2; m++) {
        int (*fn)(const char *, const bfs_range *, size_t, int) = m == 0 ? read_plain : read_zst;
        tu_canceller c;
        tu_canceller_start(&c);
        int interrupted = 0;
        for (int k = 0; k < 2000 && !interrupted; k++) {
            const int rc = fn(paths[m], r, N, 1 + k % 3);
            if (rc == BFS_EINTR) {
                interrupted = 1;
                assert_non_null(strstr(bfs_last_error(), paths[m]));
                assert_non_null(strstr(bfs_last_error(), "interrupted"));
                assert_null(strchr(bfs_last_error(), '\n'));
            } else {
                assert_int_equal(rc, 0);
            }
        }
        tu_canceller_stop(&c);
        assert_true(interrupted);
        bfs_cancel();
        assert_int_equal(fn(paths[m], r, N, 2), 0);
        for (size_t i = 0; i < N; i++)
            assert_memory_equal(buf + i * 2048, file + i * 4000, 1000);
    }
    free(buf);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ranges_land_and_hash),
        cmocka_unit_test(hash_alone),
        cmocka_unit_test(many_small_ranges),
        cmocka_unit_test(adjacent_ranges),
        cmocka_unit_test(refused),
        cmocka_unit_test(file_changes_size),
        cmocka_unit_test(cancelled),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
