/* One file's range hashed in order while several threads read it (src/output/hashfile.c):
 * the XXH3-128 and SHA-256 of any range, at any thread count, are those of the bytes hashed
 * in one call; a file shorter than the range asked (it shrank under us), a read error and a
 * cancel each end it with one line naming the file (and the offset), whatever the threads. */
#include "testutil.h"
#include "bfs_internal.h"
#include "output/hashfile.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FILE_BYTES ((size_t)37 * (1u << 20) + 123)

static char path[4096];
static uint8_t *file;

static int setup(void **state)
{
    char *dir = tu_tmpdir("hashfile");
    snprintf(path, sizeof path, "%s/f.bin", dir);
    free(dir);
    file = malloc(FILE_BYTES);
    if (!file)
        return -1;
    for (size_t i = 0; i < FILE_BYTES; i++)
        file[i] = (uint8_t)((i * 2654435761u) >> 13);
    return tu_write_file(path, file, FILE_BYTES);
}

static int teardown(void **state)
{
    unlink(path);
    free(file);
    return 0;
}

static void hex_of(XXH3_state_t *st, char hex[33]) { bfs__hash_hex(XXH3_128bits_digest(st), hex); }

static void same_digests_any_range_any_threads(void **state)
{
    const uint64_t offs[] = {0, 1, 4097, (1u << 20) - 1, (1u << 20)};
    const uint64_t lens[] = {0, 1, (1u << 20) - 1, (1u << 20), (1u << 20) + 1, 5u << 20, FILE_BYTES - (1u << 20)};
    const int threads[] = {0, 1, 2, 3, 8, 16, 40};
    const int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    XXH3_state_t *st = XXH3_createState();
    bfs_sha256 *sha = bfs__sha256_new(), *want_sha = bfs__sha256_new();
    for (size_t a = 0; a < sizeof offs / sizeof *offs; a++)
        for (size_t b = 0; b < sizeof lens / sizeof *lens; b++) {
            const uint64_t off = offs[a], len = lens[b];
            if (off + len > FILE_BYTES)
                continue;
            char want[33], got[33], swant[65], sgot[65];
            bfs__hash_hex(XXH3_128bits(file + off, (size_t)len), want);
            assert_int_equal(bfs__sha256_reset(want_sha), 0);
            bfs__sha256_update(want_sha, file + off, (size_t)len);
            assert_int_equal(bfs__sha256_hex(want_sha, swant), 0);
            for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
                XXH3_128bits_reset(st);
                assert_int_equal(bfs__sha256_reset(sha), 0);
                const bool with_sha = t % 2 == 0, with_xxh = t != 4; /* t 4: SHA-256 alone */
                assert_int_equal(bfs__hash_file(fd, off, len, path, threads[t], with_xxh ? st : NULL, with_sha ? sha : NULL), 0);
                hex_of(st, got);
                if (with_xxh)
                    assert_string_equal(got, want);
                if (with_sha) {
                    assert_int_equal(bfs__sha256_hex(sha, sgot), 0);
                    assert_string_equal(sgot, swant);
                }
            }
        }
    close(fd);
    XXH3_freeState(st);
    bfs__sha256_free(sha);
    bfs__sha256_free(want_sha);
}

static void short_file_names_file_and_offset(void **state)
{
    /* asked for more than the file holds (it shrank after its size was checked): the
     * first missing chunk's offset, one line, at every thread count */
    const int fd = open(path, O_RDONLY);
    XXH3_state_t *st = XXH3_createState();
    for (int t = 1; t <= 8; t *= 2) {
        bfs__err_clear();
        XXH3_128bits_reset(st);
        const int rc = bfs__hash_file(fd, 0, FILE_BYTES + (3u << 20), path, t, st, NULL);
        assert_int_equal(rc, BFS_EINPUT);
        const char *e = bfs_last_error();
        assert_non_null(strstr(e, path));
        const char *at = strstr(e, "unexpected end of file at offset ");
        assert_non_null(at); /* where a read found the end: the file's, or a later chunk's start */
        const unsigned long long o = strtoull(at + strlen("unexpected end of file at offset "), NULL, 10);
        assert_true(o >= FILE_BYTES && o < FILE_BYTES + (3u << 20));
        assert_null(strchr(e, '\n'));
    }
    close(fd);
    XXH3_freeState(st);
}

static void read_error_names_file(void **state)
{
    const int fd = open(path, O_WRONLY); /* pread: EBADF */
    assert_true(fd >= 0);
    XXH3_state_t *st = XXH3_createState();
    for (int t = 1; t <= 4; t++) {
        bfs__err_clear();
        assert_int_equal(bfs__hash_file(fd, 0, FILE_BYTES, path, t, st, NULL), BFS_EIO);
        assert_non_null(strstr(bfs_last_error(), path));
        assert_non_null(strstr(bfs_last_error(), "at offset"));
    }
    close(fd);
    XXH3_freeState(st);
}

static void cancelled(void **state)
{
    const int fd = open(path, O_RDONLY);
    XXH3_state_t *st = XXH3_createState();
    tu_canceller c;
    tu_canceller_start(&c);
    int interrupted = 0;
    for (int k = 0; k < 200 && !interrupted; k++) {
        bfs__err_clear();
        XXH3_128bits_reset(st);
        const int rc = bfs__hash_file(fd, 0, FILE_BYTES, path, 1 + k % 4, st, NULL);
        if (rc == BFS_EINTR) {
            interrupted = 1;
            assert_non_null(strstr(bfs_last_error(), path));
            assert_non_null(strstr(bfs_last_error(), "interrupted"));
        } else {
            assert_int_equal(rc, 0);
        }
    }
    tu_canceller_stop(&c);
    bfs__cancel_reset();
    assert_true(interrupted);
    close(fd);
    XXH3_freeState(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_digests_any_range_any_threads),
        cmocka_unit_test(short_file_names_file_and_offset),
        cmocka_unit_test(read_error_names_file),
        cmocka_unit_test(cancelled),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
