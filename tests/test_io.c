/*
 * A part reads its share of the input from the storage, not the other ranks' bytes beside
 * it: counted in bytes the storage delivered (BFSHARD_STAGES device_bytes_read, from
 * /proc/self/io), from a cold page cache, on real shapes where a rank's band of a weight
 * (32 of 2048 rows at W = 64) is much smaller than the readahead a fault would start.
 * inspect --ranks predicts them (device_bytes_to_read) within 10%. Not timed: bytes only.
 *
 * The input lies under build/ (a disk: tmpfs has no block reads to count); a machine whose
 * kernel counts none at all (device_bytes_read -1, or 0 for a read that was not cached)
 * fails the test saying so, rather than passing it unmeasured.
 */
#include "testutil.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ROWS 2048
#define COLS 7168
#define NW 6 /* DeepSeek-V3's expert shape, FP8 128 x 128 blocks: 6 x 14.7 MB */

static void write_input(const char *dir)
{
    char path[4096], hdr[8192];
    const size_t wb = (size_t)ROWS * COLS, sb = (size_t)(ROWS / 128) * (COLS / 128) * 4;
    size_t k = 0, off = 0;
    k += (size_t)snprintf(hdr + k, sizeof hdr - k, "{");
    for (int i = 0; i < NW; i++) {
        k += (size_t)snprintf(hdr + k, sizeof hdr - k,
                              "%s\"model.layers.%d.mlp.down_proj.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]},"
                              "\"model.layers.%d.mlp.down_proj.weight_scale_inv\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}",
                              i ? "," : "", i, ROWS, COLS, off, off + wb, i, ROWS / 128, COLS / 128, off + wb, off + wb + sb);
        off += wb + sb;
    }
    snprintf(hdr + k, sizeof hdr - k, "}");
    uint8_t *data = malloc(off);
    assert_non_null(data);
    for (size_t i = 0; i < off; i++)
        data[i] = (uint8_t)(i * 2654435761u >> 24) & 0x7E; /* no NaN byte; scales below are F32 1.0 */
    for (int i = 0; i < NW; i++) {
        float *s = (float *)(data + (size_t)i * (wb + sb) + wb);
        for (size_t j = 0; j < sb / 4; j++)
            s[j] = 1.0f;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    tu_write_st(path, hdr, data, off);
    free(data);
    snprintf(path, sizeof path, "%s/config.json", dir);
    static const char cfg[] = "{\"model_type\": \"llama\", \"quantization_config\": {\"quant_method\": \"fp8\", "
                              "\"fmt\": \"e4m3\", \"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128]}}";
    assert_int_equal(tu_write_file(path, cfg, sizeof cfg - 1), 0);
}

/* the input's pages out of the page cache (written, synced: clean, so they go) */
static void cold(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(fsync(fd), 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
}

/* one key of the BFSHARD_STAGES line in file f */
static long long stage(const char *f, const char *key)
{
    char *s = tu_slurp(f), k[128];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *p = s ? strstr(s, k) : NULL;
    const long long v = p ? strtoll(p + strlen(k), NULL, 10) : -2;
    free(s);
    return v;
}

static void part_reads_its_share(void **s)
{
    (void)s;
    char dir[4096], in[4096], st[4096];
    snprintf(dir, sizeof dir, "build/tests/io-share");
    tu_rmrf(dir);
    assert_int_equal(tu_sh("mkdir -p %s/in", dir), 0);
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(st, sizeof st, "%s/stages", dir);
    write_input(in);
    static const struct {
        int W;
        const char *ranks;
    } runs[] = {{64, "0"}, {64, "63"}, {16, "5"}, {8, "0"}};
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        long long logical = 0, dev = 0;
        /* up to 3 tries: another process evicting the page cache mid-run (a drop_caches) makes
         * the storage deliver a prefetched page twice; a part that reads past its share does
         * so every time */
        for (int attempt = 0; attempt < 3; attempt++) {
            cold(in);
            assert_int_equal(tu_sh("rm -rf %s/out && BFSHARD_STAGES=1 %s convert %s %s/out -w %d --ranks %s --device cpu -q 2> %s",
                                   dir, tu_bfshard(), in, dir, runs[i].W, runs[i].ranks, st),
                             0);
            logical = stage(st, "input_bytes_read");
            dev = stage(st, "device_bytes_read");
            printf("  W=%d --ranks %s: share %lld bytes, the storage delivered %lld (%.2fx)\n", runs[i].W, runs[i].ranks,
                   logical, dev, logical > 0 ? (double)dev / (double)logical : 0.0);
            if (dev > 0 && logical > 0 && (double)dev <= 1.5 * (double)logical)
                break;
        }
        if (dev <= 0)
            fail_msg("no block reads counted (device_bytes_read %lld): this kernel or file system does not count "
                     "them, so a part's reads cannot be measured here", dev);
        assert_true(logical > 0);
        /* within 1.5x of its share (headers and the pages at a band's ends included) */
        if ((double)dev > 1.5 * (double)logical)
            fail_msg("W=%d --ranks %s: the storage delivered %lld bytes for a share of %lld", runs[i].W, runs[i].ranks,
                     dev, logical);
        /* inspect --ranks said so before the run: its ranges in whole pages, within 10% */
        assert_int_equal(tu_sh("%s inspect %s -w %d --ranks %s --json > %s", tu_bfshard(), in, runs[i].W, runs[i].ranks, st), 0);
        const long long want = stage(st, "device_bytes_to_read");
        if (want <= 0 || (double)dev > 1.1 * (double)want || (double)dev < 0.9 * (double)want)
            fail_msg("W=%d --ranks %s: inspect predicted %lld bytes from the storage, the run read %lld", runs[i].W,
                     runs[i].ranks, want, dev);
    }
    tu_rmrf(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(part_reads_its_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
