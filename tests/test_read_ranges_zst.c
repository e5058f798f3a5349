/*
 * bfs_read_ranges_zst: ranges of the file a seekable zstd copy (.zst, and byte-grouped
 * .bfz) decompresses to, read into memory from several threads. Every byte lands in its
 * destination and nothing around it is written (guard bytes), for ranges across frame
 * borders, inside one frame, covering whole frames (decoded straight into the destination),
 * many small ones, overlapping sources, zero-length and out of order; only the frames a
 * read needs are decoded (a bad checksum elsewhere is not seen); a frame whose checksum
 * differs, a corrupt frame, and a seek table that lies about where a frame ends or what it
 * decodes to are refused naming the file and the frame's offsets; a
 * truncated copy (no seek table), a plain file and a range past the decompressed end are
 * refused; bfs_cancel() stops a read (BFS_EINTR) and is cleared by the next one;
 * bfs_zst_uncompressed_size gives the decompressed size.
 */
#include "testutil.h"

#include "bfshard.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FRAME (64u << 10)
#define NT 7

static char *dir;
static char st_path[4096], zst_path[4096], bfz_path[4096];
static uint8_t *file; /* the uncompressed file's bytes */
static size_t file_len;
static const char *const modes[2] = {zst_path, bfz_path};

static int setup(void **state)
{
    (void)state;
    static const size_t sizes[NT] = {2, (1u << 20) + 6, 64, (3u << 20) + 2, 4096, 2 * FRAME, 10};
    dir = tu_tmpdir("read_ranges_zst");
    snprintf(st_path, sizeof st_path, "%s/rank.safetensors", dir);
    snprintf(zst_path, sizeof zst_path, "%s/rank.safetensors.zst", dir);
    snprintf(bfz_path, sizeof bfz_path, "%s/rank.safetensors.bfz", dir);
    tu_write_st_bf16(st_path, sizes, NT);
    file = tu_read_file(st_path, &file_len);
    tu_compress(st_path, zst_path, 3, BFS_ZST_PLAIN, FRAME, 2);
    tu_compress(st_path, bfz_path, 3, BFS_ZST_BYTEGROUP, FRAME, 2);
    return file ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmrf(dir);
    free(dir);
    free(file);
    return 0;
}

/* the ranges (offset, length) of zpath read with `threads` into one buffer each, guarded */
static void check_ranges(const char *zpath, const uint64_t (*ol)[2], size_t n, int threads)
{
    tu_check_ranges(bfs_read_ranges_zst, zpath, file, ol, n, threads);
}

static void ranges_land_in_place(void **state)
{
    (void)state;
    const uint64_t ol[][2] = {
        {0, 8},                           /* the header's length */
        {0, 8 + 300},                     /* and the header */
        {8, 0},                           /* nothing */
        {100, 3 * FRAME + 12345},         /* across frame borders */
        {FRAME - 7, 14},                  /* a small one across a border */
        {2 * FRAME, FRAME},               /* maybe whole frames */
        {file_len - 5 * FRAME - 3, 5 * FRAME + 3}, /* up to the last byte */
        {7, 1},                           /* out of order, overlapping another's source */
        {0, file_len},                    /* the whole file */
    };
    const size_t n = sizeof ol / sizeof ol[0];
    uint64_t size = 0;
    for (int m = 0; m < 2; m++) {
        assert_int_equal(bfs_zst_uncompressed_size(modes[m], &size), 0);
        assert_int_equal(size, file_len);
        for (int t = 0; t <= 5; t++)
            check_ranges(modes[m], ol, n, t);
        check_ranges(modes[m], ol, n, 1000); /* more threads than the most it takes */
    }
}

/* what load() asks for: every tensor whole (each a frame or more of its own), in file order */
static void whole_tensors(void **state)
{
    (void)state;
    uint64_t hl = 0;
    memcpy(&hl, file, 8); /* little-endian host (the library checks this at build) */
    uint64_t ol[NT + 1][2];
    size_t n = 0;
    const char *p = (const char *)file + 8;
    for (int t = 0; t < NT; t++) {
        char key[32];
        snprintf(key, sizeof key, "\"t%d\"", t);
        const char *k = strstr(p, key);
        assert_non_null(k);
        unsigned long long b = 0, e = 0;
        assert_int_equal(sscanf(strstr(k, "data_offsets") + 15, "%llu,%llu", &b, &e), 2);
        ol[n][0] = 8 + hl + b;
        ol[n++][1] = e - b;
    }
    for (int m = 0; m < 2; m++)
        check_ranges(modes[m], (const uint64_t(*)[2])ol, n, 3);
}

static void many_small_ranges(void **state)
{
    (void)state;
    enum { N = 5000 };
    static uint64_t ol[N][2];
    for (size_t i = 0; i < N; i++) {
        ol[i][0] = (uint64_t)i * 997 % (file_len - 4096);
        ol[i][1] = i % 300;
    }
    for (int m = 0; m < 2; m++) {
        check_ranges(modes[m], ol, N, 4);
        check_ranges(modes[m], ol, N, 0);
    }
}

static char *copy_of(const char *src, const char *name, size_t keep, long flip_from_end, uint8_t xor)
{
    size_t n = 0;
    uint8_t *b = tu_read_file(src, &n);
    assert_non_null(b);
    if (flip_from_end > 0)
        b[n - (size_t)flip_from_end] ^= xor;
    char *p = malloc(4200);
    snprintf(p, 4200, "%s/%s", dir, name);
    assert_int_equal(tu_write_file(p, b, keep && keep < n ? keep : n), 0);
    free(b);
    return p;
}

static void refused(void **state)
{
    (void)state;
    uint8_t b[64];
    bfs_range r = {.offset = 0, .length = 16, .dest = b};
    assert_int_equal(bfs_read_ranges_zst(NULL, &r, 1, 1), BFS_EUSAGE);
    assert_int_equal(bfs_read_ranges_zst(zst_path, NULL, 1, 1), BFS_EUSAGE);
    r.dest = NULL;
    assert_int_equal(bfs_read_ranges_zst(zst_path, &r, 1, 1), BFS_EUSAGE);
    assert_non_null(strstr(bfs_last_error(), "no destination"));
    r.dest = b;
    r.offset = UINT64_MAX - 4;
    assert_int_equal(bfs_read_ranges_zst(zst_path, &r, 1, 1), BFS_EUSAGE);
    assert_non_null(strstr(bfs_last_error(), "largest file offset"));
    /* past the decompressed end */
    r.offset = file_len - 8;
    assert_int_equal(bfs_read_ranges_zst(zst_path, &r, 1, 1), BFS_EINPUT);
    assert_non_null(strstr(bfs_last_error(), zst_path));
    assert_non_null(strstr(bfs_last_error(), "truncated?"));
    /* not seekable zstd: the plain file */
    r.offset = 0;
    assert_int_equal(bfs_read_ranges_zst(st_path, &r, 1, 1), BFS_EINPUT);
    assert_non_null(strstr(bfs_last_error(), "seek"));
    uint64_t size = 0;
    assert_int_equal(bfs_zst_uncompressed_size(st_path, &size), BFS_EINPUT);
    /* missing */
    char p[4200];
    snprintf(p, sizeof p, "%s/absent.zst", dir);
    assert_true(bfs_read_ranges_zst(p, &r, 1, 1) < 0);
    assert_non_null(strstr(bfs_last_error(), p));
    assert_null(strchr(bfs_last_error(), '\n'));
}

static void truncated_copy(void **state)
{
    (void)state;
    for (int m = 0; m < 2; m++) {
        size_t n = 0;
        free(tu_read_file(modes[m], &n));
        char *p = copy_of(modes[m], m ? "cut.bfz" : "cut.zst", n / 2, 0, 0);
        uint8_t b[64];
        bfs_range r = {.offset = 0, .length = 64, .dest = b};
        assert_int_equal(bfs_read_ranges_zst(p, &r, 1, 2), BFS_EINPUT);
        assert_non_null(strstr(bfs_last_error(), p));
        assert_non_null(strstr(bfs_last_error(), "truncated"));
        assert_null(strchr(bfs_last_error(), '\n'));
        free(p);
    }
}

/* the seek table's last entry is frame n-1's {csize, dsize, xxh}, then the 9-byte footer */
static void bad_checksum_and_corrupt_frame(void **state)
{
    (void)state;
    uint8_t *buf = malloc(file_len);
    for (int m = 0; m < 2; m++) {
        /* the last data frame's checksum (BYTEGROUP: the map is the last frame, so one before) */
        const long at = 9 + 4 + (m ? 12 : 0);
        char *p = copy_of(modes[m], m ? "sum.bfz" : "sum.zst", 0, at, 0x40);
        bfs_range r = {.offset = 0, .length = file_len, .dest = buf};
        assert_int_equal(bfs_read_ranges_zst(p, &r, 1, 3), BFS_EINPUT);
        assert_non_null(strstr(bfs_last_error(), p));
        assert_non_null(strstr(bfs_last_error(), "checksum"));
        assert_non_null(strstr(bfs_last_error(), "uncompressed offset"));
        assert_null(strchr(bfs_last_error(), '\n'));
        /* a read that needs only the other frames does not decode that one */
        r.length = file_len - 2 * FRAME;
        assert_int_equal(bfs_read_ranges_zst(p, &r, 1, 3), 0);
        assert_memory_equal(buf, file, (size_t)r.length);
        free(p);
    }
    /* a byte of compressed data flipped: a zstd error or a checksum, naming the frame */
    size_t n = 0;
    free(tu_read_file(zst_path, &n));
    char *p = copy_of(zst_path, "flip.zst", 0, (long)(n / 2), 0xFF);
    bfs_range r = {.offset = 0, .length = file_len, .dest = buf};
    assert_int_equal(bfs_read_ranges_zst(p, &r, 1, 2), BFS_EINPUT);
    assert_non_null(strstr(bfs_last_error(), p));
    assert_non_null(strstr(bfs_last_error(), "frame"));
    assert_null(strchr(bfs_last_error(), '\n'));
    free(p);
    free(buf);
}

static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* a seek table that lies about two neighbouring frames but still adds up (so it opens): a
 * compressed size moved from frame k to k + 1 (the frame's bytes end elsewhere), and a
 * decompressed size moved likewise (the frame decodes to another size); both refused when read,
 * naming the frame and its offsets, whichever way a frame is decoded (whole, or in pieces) */
static void seek_table_lies(void **state)
{
    (void)state;
    uint8_t *buf = malloc(file_len);
    for (int field = 0; field < 2; field++) {
        size_t n = 0;
        uint8_t *b = tu_read_file(zst_path, &n);
        assert_non_null(b);
        const uint32_t nf = rd32(b + n - 9);
        const uint32_t k = nf / 2;
        uint8_t *e = b + n - 9 - 12 * (size_t)(nf - k); /* entry k; entry k + 1 follows */
        wr32(e + 4 * field, rd32(e + 4 * field) - 2);
        wr32(e + 12 + 4 * field, rd32(e + 12 + 4 * field) + 2);
        char p[4200];
        snprintf(p, sizeof p, "%s/lie%d.zst", dir, field);
        assert_int_equal(tu_write_file(p, b, n), 0);
        free(b);
        for (int whole = 0; whole < 2; whole++) {
            /* the whole file (frames decoded straight into it), or every byte but the first of
             * each 4 KiB (every frame only partly asked for: decoded in pieces) */
            enum { STEP = 4096 };
            const size_t nr = whole ? 1 : file_len / STEP;
            bfs_range *r = calloc(nr, sizeof *r);
            for (size_t i = 0; i < nr; i++)
                r[i] = whole ? (bfs_range){.offset = 0, .length = file_len, .dest = buf}
                             : (bfs_range){.offset = i * STEP + 1, .length = STEP - 1, .dest = buf + i * STEP + 1};
            assert_int_equal(bfs_read_ranges_zst(p, r, nr, 2), BFS_EINPUT);
            assert_non_null(strstr(bfs_last_error(), p));
            assert_non_null(strstr(bfs_last_error(), "frame"));
            assert_non_null(strstr(bfs_last_error(), "uncompressed offset"));
            assert_null(strchr(bfs_last_error(), '\n'));
            free(r);
        }
    }
    free(buf);
}

static void cancelled_mid_read(void **state)
{
    (void)state;
    uint8_t *buf = malloc(file_len);
    bfs_range r = {.offset = 0, .length = file_len, .dest = buf};
    tu_canceller c;
    tu_canceller_start(&c);
    int interrupted = 0;
    for (int k = 0; k < 2000 && !interrupted; k++) {
        const int rc = bfs_read_ranges_zst(modes[k % 2], &r, 1, 1 + k % 3);
        if (rc == BFS_EINTR) {
            interrupted = 1;
            assert_non_null(strstr(bfs_last_error(), modes[k % 2]));
            assert_non_null(strstr(bfs_last_error(), "interrupted"));
            assert_null(strchr(bfs_last_error(), '\n'));
        } else {
            assert_int_equal(rc, 0);
            assert_memory_equal(buf, file, file_len);
        }
    }
    tu_canceller_stop(&c);
    assert_true(interrupted);
    /* the cancel left pending is cleared by the next read, which reads everything */
    bfs_cancel();
    memset(buf, 0, file_len);
    assert_int_equal(bfs_read_ranges_zst(bfz_path, &r, 1, 2), 0);
    assert_memory_equal(buf, file, file_len);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ranges_land_in_place),
        cmocka_unit_test(whole_tensors),
        cmocka_unit_test(many_small_ranges),
        cmocka_unit_test(refused),
        cmocka_unit_test(truncated_copy),
        cmocka_unit_test(bad_checksum_and_corrupt_frame),
        cmocka_unit_test(seek_table_lies),
        cmocka_unit_test(cancelled_mid_read),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
