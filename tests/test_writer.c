/* The writer (src/output/writer.c): O_DIRECT body + block carry + buffered tail, and the
 * buffered fallback, give the same bytes and hashes as one plain write of the file;
 * convert gives the same files either way. */
#include "testutil.h"
#include "bfs_internal.h"
#include "output/writer.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint32_t rng = 12345;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

/* one file of random jobs; returns the writer's direct byte count */
static uint64_t write_one(const char *path, bool direct, const uint8_t *want, size_t size, uint32_t seed,
                          char hex[33], bfs_dig16 *piece_dig)
{
    bfs_writer w;
    memset(&w, 0, sizeof w);
    if (direct)
        unsetenv("BFSHARD_DIRECT");
    else
        setenv("BFSHARD_DIRECT", "0", 1);
    assert_int_equal(bfs__writer_start(&w), 0);
    const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    const int ws = bfs__writer_begin_file(&w, fd, path, piece_dig, NULL, NULL, NULL);
    assert_true(ws >= 0);
    /* two unit buffers with headroom, as convert allocates them */
    const size_t cap = 3u << 20;
    uint8_t *buf[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(posix_memalign((void **)&buf[i], BFS_DIO_ALIGN, cap + BFS_DIO_ALIGN), 0);
    rng = seed;
    size_t off = 0;
    int slot = 0, piece = 0;
    /* a header of random length first (sometimes over the carry), then units */
    size_t hl = 8 + rnd() % (rnd() % 4 ? 5000 : (3u << 20) / 2);
    if (hl > size)
        hl = size;
    assert_int_equal(bfs__writer_push(&w, &(bfs_wjob){.buf = want, .len = hl, .off = 0, .piece = -1}), 0);
    off = hl;
    while (off < size) {
        size_t n = rnd() % 4 == 0 ? rnd() % 5000 : rnd() % cap;
        if (n > size - off)
            n = size - off;
        assert_int_equal(bfs__writer_wait(&w, 1), 0);
        uint8_t *out = buf[slot] + off % BFS_DIO_ALIGN;
        memcpy(out, want + off, n);
        const bool end = off + n == size || rnd() % 3 == 0;
        assert_int_equal(bfs__writer_push(&w, &(bfs_wjob){.buf = out, .len = n, .off = off, .piece = piece,
                                                          .piece_end = end, .headroom = true}),
                         0);
        piece += end;
        off += n;
        slot ^= 1;
    }
    assert_int_equal(bfs__writer_end_file(&w, hex), 0);
    assert_int_equal(bfs__writer_wait_file(&w, ws), 0);
    assert_int_equal(fsync(fd), 0);
    close(fd);
    bfs_wstages st;
    bfs__writer_stages(&w, &st);
    const uint64_t d = st.direct_bytes;
    bfs__writer_stop(&w);
    free(buf[0]);
    free(buf[1]);
    unsetenv("BFSHARD_DIRECT");
    return d;
}

static void direct_and_buffered_same_bytes(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("writer");
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/direct", tmp);
    snprintf(b, sizeof b, "%s/buffered", tmp);
    uint64_t direct_total = 0;
    for (uint32_t seed = 1; seed <= 12; seed++) {
        rng = seed * 7919;
        const size_t size = seed == 1 ? 100 : seed == 2 ? 4096 * 3 : 1 + rnd() % (9u << 20);
        uint8_t *want = malloc(size);
        assert_non_null(want);
        for (size_t i = 0; i < size; i++)
            want[i] = (uint8_t)rnd();
        char ha[33], hb[33];
        bfs_dig16 *pa = calloc(size + 1, sizeof *pa), *pb = calloc(size + 1, sizeof *pb);
        direct_total += write_one(a, true, want, size, seed, ha, pa);
        assert_int_equal(write_one(b, false, want, size, seed, hb, pb), 0);
        size_t la = 0, lb = 0;
        uint8_t *ga = tu_read_file(a, &la), *gb = tu_read_file(b, &lb);
        assert_int_equal(la, size);
        assert_int_equal(lb, size);
        assert_memory_equal(ga, want, size);
        assert_memory_equal(gb, want, size);
        char hw[33];
        bfs__hash_hex(XXH3_128bits(want, size), hw);
        assert_string_equal(ha, hw);
        assert_string_equal(hb, hw);
        assert_memory_equal(pa, pb, (size + 1) * sizeof *pa);
        free(ga), free(gb), free(want), free(pa), free(pb);
    }
    /* $TMPDIR on a filesystem that takes O_DIRECT: the direct path ran */
    if (direct_total == 0)
        fprintf(stderr, "  NOTE: %s refuses O_DIRECT: only the buffered path ran\n", tmp);
    tu_rmrf(tmp);
    free(tmp);
}

/* the AVX2 update gives libxxhash's digests, for every length and split */
static void xxh128_update_same_digest(void **s)
{
    (void)s;
    const size_t n = 70000;
    uint8_t *d = malloc(n);
    for (size_t i = 0; i < n; i++)
        d[i] = (uint8_t)rnd();
    XXH3_state_t *st = XXH3_createState();
    for (size_t len = 0; len < n; len = len * 3 / 2 + 1) {
        const size_t cut = len / 3;
        XXH3_128bits_reset(st);
        bfs__xxh128_update(st, d, cut);
        bfs__xxh128_update(st, d + cut, len - cut);
        const XXH128_hash_t a = XXH3_128bits_digest(st), b = XXH3_128bits(d, len);
        assert_true(a.low64 == b.low64 && a.high64 == b.high64);
    }
    XXH3_freeState(st);
    free(d);
}

/* convert: the files are the same with O_DIRECT and without (BFSHARD_DIRECT=0) */
static void convert_direct_and_buffered(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("wconv");
    const char *fx[] = {"fixtures/mxfp4-tiny", "fixtures/bnb-nf4-dq"};
    for (size_t f = 0; f < sizeof fx / sizeof *fx; f++)
        for (int m = 0; m < 2; m++) {
            const char *mem = m ? "64K" : "256M";
            assert_int_equal(tu_sh("BFSHARD_DIRECT=0 %s convert %s %s/b --world-size 3 --device cpu --mem %s --force --quiet "
                                   "&& BFSHARD_STAGES=1 %s convert %s %s/d --world-size 3 --device cpu --mem %s --force "
                                   "--quiet 2>%s/stages && grep -q '\"direct_bytes\"' %s/stages",
                                   tu_bfshard(), fx[f], tmp, mem, tu_bfshard(), fx[f], tmp, mem, tmp, tmp),
                             0);
            for (int r = 1; r <= 3; r++)
                assert_int_equal(tu_sh("cmp -s %s/b/shard-0000%d-model-00001-of-00001.safetensors "
                                       "%s/d/shard-0000%d-model-00001-of-00001.safetensors",
                                       tmp, r, tmp, r),
                                 0);
            assert_int_equal(tu_sh("cmp -s %s/b/xxh128sums.txt %s/d/xxh128sums.txt && %s verify %s/d --quiet", tmp, tmp,
                                   tu_bfshard(), tmp),
                             0);
        }
    tu_rmrf(tmp);
    free(tmp);
}

/* --max-rss picks --mem (inspect and convert alike), refuses what cannot fit, and not with --mem */
static void max_rss_option(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("maxrss");
    const char *b = tu_bfshard();
    assert_int_equal(tu_sh("%s inspect fixtures/mxfp4-tiny --max-rss 1K >/dev/null 2>&1", b), 5);
    assert_int_equal(tu_sh("%s convert fixtures/mxfp4-tiny %s/o --max-rss 1K --device cpu --quiet 2>/dev/null", b, tmp), 5);
    assert_int_equal(tu_sh("%s inspect fixtures/mxfp4-tiny --max-rss 1G --mem 64M >/dev/null 2>&1", b), 2);
    assert_int_equal(tu_sh("%s inspect fixtures/mxfp4-tiny --max-rss 1G | grep -q -- '--max-rss 1073741824: --mem'", b), 0);
    assert_int_equal(tu_sh("%s inspect fixtures/mxfp4-tiny --json | grep -q '\"predicted\"'", b), 0);
    assert_int_equal(tu_sh("%s convert fixtures/mxfp4-tiny %s/o --max-rss 1G --device cpu --world-size 2 --quiet && %s verify %s/o --quiet",
                           b, tmp, b, tmp), 0);
    tu_rmrf(tmp);
    free(tmp);
}


/* A checkpoint of many small tensors (BF16, F32 cast, 0-d, zero-element, a few bigger
 * ones), as `bench/gen_synth.py tiny` makes them, in two files. */
static void write_many(const char *dir, int n)
{
    char path[512];
    for (int file = 0; file < 2; file++) {
        size_t cap = (size_t)n * 160 + 256, hl = 0, dl = 0;
        char *h = malloc(cap);
        uint8_t *data = malloc((size_t)n * 8192);
        assert_non_null(h);
        assert_non_null(data);
        hl += (size_t)snprintf(h + hl, cap - hl, "{\"__metadata__\":{\"format\":\"pt\"}");
        rng = 777u + (uint32_t)file;
        for (int i = file; i < n; i += 2) {
            const int kind = i % 5;
            const uint32_t el = kind == 3 ? 0 : 64 + rnd() % (i % 97 == 0 ? 2000 : 700);
            const size_t es = kind == 1 ? 4 : 2, nb = (kind == 4 ? 1 : el) * es;
            char shape[64];
            if (kind == 4)
                snprintf(shape, sizeof shape, "[]");
            else if (kind == 2 && el >= 64)
                snprintf(shape, sizeof shape, "[%u,16]", el / 16);
            else
                snprintf(shape, sizeof shape, "[%u]", el);
            const size_t nbytes = kind == 2 && el >= 64 ? (size_t)(el / 16) * 16 * es : nb;
            hl += (size_t)snprintf(h + hl, cap - hl, ",\"m.t%05d\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                                   i, es == 4 ? "F32" : "BF16", shape, dl, dl + nbytes);
            for (size_t k = 0; k < nbytes; k++)
                data[dl + k] = (uint8_t)rnd();
            dl += nbytes;
        }
        hl += (size_t)snprintf(h + hl, cap - hl, "}");
        while (hl % 8)
            h[hl++] = ' ';
        snprintf(path, sizeof path, "%s/model-%05d-of-00002.safetensors", dir, file + 1);
        h[hl] = '\0';
        tu_write_st(path, h, data, dl);
        free(h);
        free(data);
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(tu_write_file(path, "{\"model_type\": \"llama\"}\n", 24), 0);
}

/* Many small tensors go through in batches (one unit, one writer job per batch): the
 * same bytes and hashes as with units too small to batch, buffered or O_DIRECT, with a
 * compressed copy (a frame cut at every tensor of a batch), and they verify; W = 3. */
static void many_small_tensors_batched(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("many");
    const char *b = tu_bfshard();
    assert_int_equal(tu_sh("mkdir -p %s/in", tmp), 0);
    char in[512];
    snprintf(in, sizeof in, "%s/in", tmp);
    write_many(in, 3000);
    /* default: batches of up to BFS_BATCH_BYTES; --mem 8K: 4 KiB units, small batches and
     * tensors cut into rows; --mem 64M buffered; with the compressed copy */
    assert_int_equal(tu_sh("%s convert %s %s/a -w 3 --device cpu --quiet && %s verify %s/a --quiet", b, in, tmp, b, tmp), 0);
    assert_int_equal(tu_sh("%s convert %s %s/b -w 3 --device cpu --mem 8K --quiet && %s verify %s/b --quiet", b, in, tmp, b, tmp), 0);
    assert_int_equal(tu_sh("BFSHARD_DIRECT=0 %s convert %s %s/c -w 3 --device cpu --mem 64M --quiet", b, in, tmp), 0);
    assert_int_equal(tu_sh("%s convert %s %s/d -w 3 --device cpu --compress zstd:1 --quiet && %s verify %s/d --quiet", b, in, tmp, b, tmp), 0);
    for (int r = 1; r <= 3; r++)
        for (const char *o = "bcd"; *o; o++)
            assert_int_equal(tu_sh("cmp -s %s/a/shard-0000%d-model-00001-of-00001.safetensors "
                                   "%s/%c/shard-0000%d-model-00001-of-00001.safetensors",
                                   tmp, r, tmp, *o, r),
                             0);
    assert_int_equal(tu_sh("cmp -s %s/a/xxh128sums.txt %s/b/xxh128sums.txt && cmp -s %s/a/xxh128sums.txt %s/c/xxh128sums.txt "
                           "&& cmp -s %s/a/bfshard.manifest.json %s/b/bfshard.manifest.json",
                           tmp, tmp, tmp, tmp, tmp, tmp),
                     0);
    /* each rank file's tensors as stock tools see them; the frames of the .zst decode to it */
    assert_int_equal(tu_sh("cd %s/a && xxh128sum -c --quiet xxh128sums.txt", tmp), 0);
    assert_int_equal(tu_sh("zstd -dc -q %s/d/shard-00002-model-00001-of-00001.safetensors.zst | "
                           "cmp -s - %s/a/shard-00002-model-00001-of-00001.safetensors",
                           tmp, tmp),
                     0);
    tu_rmrf(tmp);
    free(tmp);
}

/* inspect --ranks predicts the memory of the files convert --ranks writes, not of all */
static void inspect_ranks_predicts_its_files(void **s)
{
    (void)s;
    const char *b = tu_bfshard();
    assert_int_equal(tu_sh("a=$(%s inspect fixtures/mxfp4-tiny -w 8 --json | grep -o '\"predicted\": [0-9]*' | tr -dc 0-9) && "
                           "r=$(%s inspect fixtures/mxfp4-tiny -w 8 --ranks 0 --json | grep -o '\"predicted\": [0-9]*' | tr -dc 0-9) && "
                           "test -n \"$a\" && test -n \"$r\" && test \"$r\" -lt \"$a\"",
                           b, b),
                     0);
}

/* The rank files' headers are written directly (plan.c): byte for byte what jansson dumps
 * of the same JSON, for names with quotes, backslashes, control characters, non-ASCII. */
static void header_text_as_jansson(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("hdr");
    static const char *names[] = {"plain.w", "q\\\"uote", "back\\\\slash", "nl\\nx", "ctl\\u0001\\u001fy", "\\u00fcml/\\u4e2d"};
    char h[2048], path[600];
    size_t hl = (size_t)snprintf(h, sizeof h, "{");
    for (int i = 0; i < 6; i++)
        hl += (size_t)snprintf(h + hl, sizeof h - hl, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[%d,%d]}",
                               i ? "," : "", names[i], 4 + i, 16 * i + i * (i - 1) * 2, 16 * (i + 1) + (i + 1) * i * 2);
    hl += (size_t)snprintf(h + hl, sizeof h - hl, "}");
    while (hl % 8)
        h[hl++] = ' ';
    const size_t dl = 16 * 6 + 6 * 5 * 2;
    uint8_t *file = calloc(1, 8 + hl + dl);
    for (int b = 0; b < 8; b++)
        file[b] = (uint8_t)((uint64_t)hl >> (8 * b));
    memcpy(file + 8, h, hl);
    snprintf(path, sizeof path, "%s/in", tmp);
    assert_int_equal(tu_sh("mkdir -p %s", path), 0);
    snprintf(path, sizeof path, "%s/in/model.safetensors", tmp);
    assert_int_equal(tu_write_file(path, file, 8 + hl + dl), 0);
    free(file);
    for (int w = 1; w <= 2; w++) {
        assert_int_equal(tu_sh("%s convert %s/in %s/o%d -w %d --device cpu --quiet", tu_bfshard(), tmp, tmp, w, w), 0);
        snprintf(path, sizeof path, "%s/o%d/shard-00001-model-00001-of-00001.safetensors", tmp, w);
        size_t len = 0;
        uint8_t *out = tu_read_file(path, &len);
        assert_non_null(out);
        uint64_t n = 0;
        for (int b = 0; b < 8; b++)
            n |= (uint64_t)out[b] << (8 * b);
        size_t tl = (size_t)n;
        while (tl > 0 && out[8 + tl - 1] == ' ')
            tl--;
        json_error_t e;
        json_t *j = json_loadb((const char *)out + 8, tl, 0, &e);
        assert_non_null(j);
        char *again = json_dumps(j, JSON_COMPACT);
        assert_non_null(again);
        assert_int_equal(strlen(again), tl);
        assert_memory_equal(again, out + 8, tl);
        free(again);
        json_decref(j);
        free(out);
    }
    tu_rmrf(tmp);
    free(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(direct_and_buffered_same_bytes),
        cmocka_unit_test(xxh128_update_same_digest),
        cmocka_unit_test(convert_direct_and_buffered),
        cmocka_unit_test(max_rss_option),
        cmocka_unit_test(many_small_tensors_batched),
        cmocka_unit_test(inspect_ranks_predicts_its_files),
        cmocka_unit_test(header_text_as_jansson),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
