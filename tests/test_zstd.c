/*
 * Compressed artifacts (seekable zstd, src/zst/): byte-exact round trips of every
 * fixture's converted output (bfshard and stock `zstd -d`), both modes; extraction of
 * one tensor reading only its frames; hostile seek tables; verify of a compressed
 * OUTDIR (with and without the rank files) and of a flipped byte; the CLI.
 */
#include "testutil.h"
#include "tu_st.h"
#include "bfs_internal.h"
#include "base/bfs_io.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const fixtures[] = {
    "fixtures/mxfp4-tiny", "fixtures/bnb-nf4", "fixtures/bnb-nf4-dq", "fixtures/bnb-nf4-dq-bs128",
    "fixtures/bnb-fp4", "fixtures/bnb-fp4-dq",
};
#define NFIX (sizeof fixtures / sizeof *fixtures)

static void convert_ok(const char *in, const char *out, int W)
{
    bfs_convert_opts o;
    bfs_convert_opts_init(&o);
    o.world_size = W;
    o.device = "cpu";
    bfs_convert_result res;
    bfs_convert_result_init(&res);
    const int rc = bfs_convert(in, out, &o, &res);
    if (rc != 0)
        fprintf(stderr, "convert %s: %s\n", in, bfs_last_error());
    assert_int_equal(rc, 0);
}

static void rank_path(char *buf, size_t n, const char *dir, int rank, int W)
{
    snprintf(buf, n, "%s/shard-%05d-model-00001-of-00001.safetensors", dir, rank + 1);
    (void)W;
}

static void assert_same_file(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    uint8_t *x = tu_read_file(a, &na), *y = tu_read_file(b, &nb);
    assert_non_null(x);
    assert_non_null(y);
    assert_int_equal(na, nb);
    assert_memory_equal(x, y, na);
    free(x);
    free(y);
}

/* every fixture, W = 1 and 3, both modes, several frame sizes and thread counts */
static void test_roundtrip_fixtures(void **state)
{
    (void)state;
    char *tmp = tu_tmpdir("zrt");
    char out[4096], rf[4096], z[4096], d[4096];
    for (size_t fi = 0; fi < NFIX; fi++) {
        for (int W = 1; W <= 3; W += 2) {
            snprintf(out, sizeof out, "%s/o%zu-%d", tmp, fi, W);
            convert_ok(fixtures[fi], out, W);
            for (int rank = 0; rank < W; rank++) {
                rank_path(rf, sizeof rf, out, rank, W);
                for (int mode = 0; mode < 2; mode++) {
                    const uint64_t frame = rank == 0 ? 0 : 4096;
                    snprintf(z, sizeof z, "%s.%d.z", rf, mode);
                    tu_compress(rf, z, mode ? 1 : 3, mode, frame, rank + 1);
                    snprintf(d, sizeof d, "%s.%d.d", rf, mode);
                    unlink(d);
                    const int rc = bfs_decompress_file(z, d);
                    if (rc)
                        fprintf(stderr, "%s\n", bfs_last_error());
                    assert_int_equal(rc, 0);
                    assert_same_file(rf, d);
                    if (mode == BFS_ZST_PLAIN) /* stock zstd restores the exact bytes */
                        assert_int_equal(tu_sh("zstd -d -q -c '%s' | cmp -s - '%s'", z, rf), 0);
                    else /* and refuses the byte-grouped format instead of writing wrong bytes */
                        assert_int_not_equal(tu_sh("zstd -d -q -c '%s' > /dev/null 2>&1", z), 0);
                }
            }
        }
    }
    tu_rmrf(tmp);
    free(tmp);
}

/* The writer used directly, as convert's writer thread would: random piece sizes,
 * odd lengths, empty pieces; frames never straddle a tensor boundary. */
static void test_writer_stream(void **state)
{
    (void)state;
    char *tmp = tu_tmpdir("zw");
    char path[4096];
    const size_t np = 40;
    size_t len[40];
    uint64_t total = 0;
    srand(7);
    for (size_t i = 0; i < np; i++) {
        len[i] = i % 7 == 3 ? 0 : (size_t)(rand() % 20000) * (i % 5 == 1 ? 1 : 2) + (i % 5 == 1);
        total += len[i];
    }
    uint8_t *src = malloc(total + 1);
    assert_non_null(src);
    for (uint64_t k = 0; k < total; k++) /* bf16-like: smooth high bytes, noisy low bytes */
        src[k] = k % 2 ? (uint8_t)(0x3c + (k / 64) % 3) : (uint8_t)(rand() & 0xff);
    for (int mode = 0; mode < 2; mode++) {
        for (int threads = 1; threads <= 4; threads += 3) {
            snprintf(path, sizeof path, "%s/w%d%d.z", tmp, mode, threads);
            const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            assert_true(fd >= 0);
            bfs_zst_writer *w = NULL;
            assert_int_equal(bfs__zst_writer_create(fd, 1, threads, 4096, mode, &w), 0);
            uint64_t off = 0, zsize = 0;
            for (size_t i = 0; i < np; i++) {
                assert_int_equal(bfs__zst_cut_tensor(w, i % 5 == 1 ? BFS_DT_U8 : BFS_DT_BF16), 0);
                /* in two calls, as a piece arrives in units */
                assert_int_equal(bfs__zst_write(w, src + off, len[i] / 3), 0);
                assert_int_equal(bfs__zst_write(w, src + off + len[i] / 3, len[i] - len[i] / 3), 0);
                off += len[i];
            }
            assert_int_equal(bfs__zst_finish(w, &zsize), 0);
            char hz[33], hu[33], want[33];
            bfs__zst_writer_hashes(w, hz, hu);
            bfs__hash_hex(XXH3_128bits(src, total), want);
            assert_string_equal(hu, want);
            bfs__zst_writer_free(w);
            close(fd);
            struct stat sb;
            assert_int_equal(stat(path, &sb), 0);
            assert_int_equal((uint64_t)sb.st_size, zsize);

            bfs_zst_reader *r = NULL;
            assert_int_equal(bfs__zst_reader_open(path, &r), 0);
            assert_int_equal(bfs__zst_reader_size(r), total);
            assert_int_equal(bfs__zst_reader_mode(r), mode);
            uint8_t *back = malloc(total + 1);
            assert_int_equal(bfs__zst_pread_range(r, back, total, 0), 0);
            assert_memory_equal(back, src, total);
            /* no frame is shared by two pieces: spans add up */
            off = 0;
            for (size_t i = 0; i + 1 < np; i++) {
                const uint64_t a = bfs__zst_span(r, off, len[i]), b = bfs__zst_span(r, off + len[i], len[i + 1]);
                assert_int_equal(a + b, bfs__zst_span(r, off, len[i] + len[i + 1]));
                off += len[i];
            }
            /* arbitrary ranges */
            for (int k = 0; k < 50; k++) {
                const uint64_t a = (uint64_t)rand() % total, n = (uint64_t)rand() % (total - a + 1);
                memset(back, 0, total);
                assert_int_equal(bfs__zst_pread_range(r, back, n, a), 0);
                assert_memory_equal(back, src + a, n);
            }
            assert_int_equal(bfs__zst_pread_range(r, back, 2, total - 1), BFS_EINPUT);
            free(back);
            bfs__zst_reader_free(r);
        }
    }
    /* stock zstd on the plain stream */
    snprintf(path, sizeof path, "%s/ref", tmp);
    assert_int_equal(tu_write_file(path, src, total), 0);
    assert_int_equal(tu_sh("zstd -d -q -c '%s/w01.z' | cmp -s - '%s/ref'", tmp, tmp), 0);
    free(src);
    tu_rmrf(tmp);
    free(tmp);
}

/* A file of many frames: each tensor is read by decoding only the frames that hold it. */
static void test_extract_reads_only_its_frames(void **state)
{
    (void)state;
    char *tmp = tu_tmpdir("zx");
    char out[4096], rf[4096], z[4096], x[4096];
    snprintf(out, sizeof out, "%s/o", tmp);
    convert_ok("fixtures/mxfp4-tiny", out, 1);
    rank_path(rf, sizeof rf, out, 0, 1);
    stfile src;
    assert_int_equal(st_load(rf, &src), 0);
    for (int mode = 0; mode < 2; mode++) {
        snprintf(z, sizeof z, "%s/m%d.z", tmp, mode);
        tu_compress(rf, z, 3, mode, 1024, 2);
        bfs_zst_reader *r = NULL;
        assert_int_equal(bfs__zst_reader_open(z, &r), 0);
        assert_true(bfs__zst_reader_frames(r) > 100);
        struct stat sb;
        assert_int_equal(stat(z, &sb), 0);
        size_t checked = 0;
        for (size_t i = 0; i < src.h.n; i++) {
            const bfs_st_tensor *t = &src.h.t[i];
            const uint64_t off = src.h.data_start + t->begin, n = t->end - t->begin;
            uint8_t *got = malloc(n + 1);
            bfs__zst_reader_reset_stats(r);
            assert_int_equal(bfs__zst_pread_range(r, got, n, off), 0);
            assert_memory_equal(got, src.buf + off, n);
            uint64_t rd = 0, fr = 0;
            bfs__zst_reader_stats(r, &rd, &fr);
            const uint64_t span = bfs__zst_span(r, off, n);
            assert_true(rd <= span);
            assert_int_equal(rd, span); /* whole frames, no more */
            if (n > 0 && span * 4 < (uint64_t)sb.st_size)
                checked++;
            free(got);
        }
        assert_true(checked > 10);
        bfs__zst_reader_free(r);

        /* the public entry point: a standalone safetensors holding just the tensor */
        const bfs_st_tensor *t = &src.h.t[src.h.n / 2];
        snprintf(x, sizeof x, "%s/x%d.safetensors", tmp, mode);
        assert_int_equal(bfs_extract(z, t->name, x, 0), 0);
        stfile one;
        assert_int_equal(st_load(x, &one), 0);
        assert_int_equal(one.h.n, 1);
        assert_string_equal(one.h.t[0].name, t->name);
        assert_int_equal(one.h.t[0].dtype, t->dtype);
        assert_int_equal(one.h.t[0].ndim, t->ndim);
        assert_memory_equal(one.h.t[0].shape, t->shape, sizeof t->shape);
        assert_int_equal(one.h.data_start % 8, 0);
        assert_int_equal(one.h.data_size, t->end - t->begin);
        assert_memory_equal(one.buf + one.h.data_start, src.buf + src.h.data_start + t->begin, t->end - t->begin);
        st_free(&one);
        /* an existing output is not replaced */
        assert_int_equal(bfs_extract(z, t->name, x, 0), BFS_EEXIST);
        /* raw bytes */
        snprintf(x, sizeof x, "%s/x%d.bin", tmp, mode);
        assert_int_equal(bfs_extract(z, t->name, x, 1), 0);
        size_t rn = 0;
        uint8_t *raw = tu_read_file(x, &rn);
        assert_int_equal(rn, t->end - t->begin);
        assert_memory_equal(raw, src.buf + src.h.data_start + t->begin, rn);
        free(raw);
        /* an unknown tensor: bad input, one line */
        snprintf(x, sizeof x, "%s/none", tmp);
        assert_int_equal(bfs_extract(z, "no.such.tensor", x, 0), BFS_EINPUT);
        assert_non_null(strstr(bfs_last_error(), "no.such.tensor"));
        assert_null(strchr(bfs_last_error(), '\n'));
        assert_int_not_equal(access(x, F_OK), 0);
    }
    st_free(&src);
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- hostile seek tables ---------------------------------------------------------- */
static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static int discard(void *user, const uint8_t *p, size_t n)
{
    (void)user;
    (void)p;
    (void)n;
    return 0;
}

static void expect_bad(const char *dir, const char *tag, const uint8_t *buf, size_t len)
{
    char p[4096], o[4096];
    snprintf(p, sizeof p, "%s/bad-%s.zst", dir, tag);
    snprintf(o, sizeof o, "%s/bad-%s.out", dir, tag);
    assert_int_equal(tu_write_file(p, buf, len), 0);
    const int rc = bfs_decompress_file(p, o);
    const char *m = bfs_last_error();
    if (rc != BFS_EINPUT)
        fprintf(stderr, "%s: rc %d (%s)\n", tag, rc, m);
    assert_int_equal(rc, BFS_EINPUT);
    if (getenv("BFS_TEST_VERBOSE"))
        fprintf(stderr, "  %-18s %s\n", tag, m);
    assert_true(strlen(m) > 10);
    assert_null(strchr(m, '\n'));
    assert_non_null(strstr(m, p));           /* names the file */
    assert_int_not_equal(access(o, F_OK), 0); /* and leaves no output behind */
    bfs_zst_reader *r = NULL;
    if (bfs__zst_reader_open(p, &r) == 0) { /* table fine, frames not: reading it all must fail too */
        assert_int_equal(bfs__zst_read_range(r, 0, bfs__zst_reader_size(r), discard, NULL), BFS_EINPUT);
        bfs__zst_reader_free(r);
    }
}

static void test_hostile_seek_tables(void **state)
{
    (void)state;
    char *tmp = tu_tmpdir("zh");
    char out[4096], rf[4096], z[4096];
    snprintf(out, sizeof out, "%s/o", tmp);
    convert_ok("fixtures/bnb-nf4", out, 1);
    rank_path(rf, sizeof rf, out, 0, 1);
    snprintf(z, sizeof z, "%s/good.zst", tmp);
    tu_compress(rf, z, 3, BFS_ZST_PLAIN, 8192, 1);
    size_t n = 0;
    uint8_t *good = tu_read_file(z, &n);
    assert_non_null(good);
    uint8_t *b = malloc(n + 64);
    const uint32_t nf = get32(good + n - 9);
    const size_t ts = n - (8 + 12 * (size_t)nf + 9); /* seek table start */
    assert_int_equal(get32(good + ts), 0x184D2A5Eu);
    assert_true(nf > 4);

#define FRESH() memcpy(b, good, n)
    FRESH();
    expect_bad(tmp, "empty", b, 0);
    expect_bad(tmp, "tiny", b, 12);
    expect_bad(tmp, "truncated-1", b, n - 1);
    expect_bad(tmp, "truncated-half", b, n / 2);
    expect_bad(tmp, "no-table", b, ts); /* frames only: what `zstd` without the table would make */
    FRESH();
    b[n - 1] ^= 0x40;
    expect_bad(tmp, "seekable-magic", b, n);
    FRESH();
    put32(b + ts, 0x184D2A50u);
    expect_bad(tmp, "skippable-magic", b, n);
    FRESH();
    b[n - 5] |= 0x04;
    expect_bad(tmp, "reserved-bits", b, n);
    FRESH();
    put32(b + n - 9, 0xFFFFFFFFu);
    expect_bad(tmp, "frames-huge", b, n);
    FRESH();
    put32(b + n - 9, 0x7FFFFFFu);
    expect_bad(tmp, "frames-past-file", b, n);
    FRESH();
    put32(b + n - 9, nf - 1);
    expect_bad(tmp, "frames-one-less", b, n);
    FRESH();
    put32(b + ts + 4, get32(b + ts + 4) + 12);
    expect_bad(tmp, "frame-size-field", b, n);
    FRESH();
    put32(b + ts + 8 + 12 * 1, 0xFFFFFFFFu);
    expect_bad(tmp, "csize-overflow", b, n);
    FRESH();
    put32(b + ts + 8 + 12 * 2, 0);
    expect_bad(tmp, "csize-zero", b, n);
    FRESH();
    put32(b + ts + 8 + 12 * 1, get32(b + ts + 8 + 12 * 1) + 1);
    put32(b + ts + 8 + 12 * 2, get32(b + ts + 8 + 12 * 2) - 1);
    expect_bad(tmp, "csize-shifted", b, n); /* sums still right, frames are not */
    FRESH();
    put32(b + ts + 8 + 12 * 1 + 4, 0xFFFFFFF0u);
    expect_bad(tmp, "dsize-overflow", b, n);
    FRESH();
    put32(b + ts + 8 + 12 * 1 + 4, 0x40000000u);
    expect_bad(tmp, "dsize-1GiB", b, n); /* allowed by the format, but not what the frame holds */
    FRESH();
    put32(b + ts + 8 + 12 * 1 + 4, get32(b + ts + 8 + 12 * 1 + 4) - 1);
    expect_bad(tmp, "dsize-short", b, n);
    FRESH();
    put32(b + ts + 8 + 12 * 3 + 8, get32(b + ts + 8 + 12 * 3 + 8) ^ 1);
    expect_bad(tmp, "checksum", b, n);
    FRESH();
    b[ts / 2] ^= 0x10; /* a flipped byte inside a frame */
    expect_bad(tmp, "frame-byte", b, n);
    FRESH();
    b[0] ^= 0xFF; /* frame 0's zstd magic */
    expect_bad(tmp, "frame-magic", b, n);
    free(good);

    /* byte-grouped files: header version, map */
    snprintf(z, sizeof z, "%s/good.bfz", tmp);
    tu_compress(rf, z, 3, BFS_ZST_BYTEGROUP, 8192, 1);
    good = tu_read_file(z, &n);
    b = realloc(b, n + 64);
    const uint32_t gf = get32(good + n - 9);
    const size_t gts = n - (8 + 12 * (size_t)gf + 9);
    const size_t map = gts - get32(good + gts + 8 + 12 * (gf - 1));
    assert_int_equal(get32(good + map), 0x184D2A5Bu);
    FRESH();
    put32(b + 8, 2);
    expect_bad(tmp, "bg-version", b, n);
    FRESH();
    b[map + 16] |= 1; /* frame 0, the header, marked grouped */
    expect_bad(tmp, "bg-map-header", b, n);
    FRESH();
    b[map + 8] ^= 1;
    expect_bad(tmp, "bg-map-tag", b, n);
    FRESH();
    for (size_t k = map + 16; k < gts; k++) /* every frame grouped: odd-sized or header ones refuse */
        b[k] = 0xFF;
    expect_bad(tmp, "bg-map-all", b, n);
    FRESH();
    for (size_t k = map + 16; k < gts; k++) /* no frame grouped: checksums catch the grouped bytes */
        b[k] = 0;
    expect_bad(tmp, "bg-map-none", b, n);
#undef FRESH
    free(good);
    free(b);
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- verify ---------------------------------------------------------------------------- */
static int verify_report(const char *dir, char *rep, size_t cap)
{
    FILE *f = fmemopen(rep, cap, "w");
    const int rc = bfs_verify(dir, f, NULL);
    fclose(f);
    return rc;
}

static void test_verify_compressed_outdir(void **state)
{
    (void)state;
    char *tmp = tu_tmpdir("zv");
    char out[4096], rf[4096], z[4096], rep[16384];
    for (int mode = 0; mode < 2; mode++) {
        snprintf(out, sizeof out, "%s/o%d", tmp, mode);
        convert_ok("fixtures/mxfp4-tiny", out, 2);
        bfs_compress_opts o;
        bfs_compress_opts_init(&o);
        o.mode = mode;
        o.frame_bytes = 16384;
        bfs_compress_result res;
        bfs_compress_result_init(&res);
        assert_int_equal(bfs_compress_outdir(out, &o, &res), 0);
        assert_int_equal(res.files, 2);
        assert_true(res.bytes_out < res.bytes_in);
        assert_int_equal(verify_report(out, rep, sizeof rep), 0);
        /* the manifest records both hashes, the sums file both files */
        size_t ml = 0;
        snprintf(z, sizeof z, "%s/%s", out, BFS_MANIFEST_NAME);
        char *man = (char *)tu_read_file(z, &ml);
        assert_non_null(man);
        man[ml] = '\0';
        assert_non_null(strstr(man, "\"zst\""));
        assert_non_null(strstr(man, mode ? "zstd-seekable-bf16-bytegroup-v1" : "\"zstd-seekable\""));
        free(man);
        assert_int_equal(tu_sh("cd '%s' && xxh128sum -c --quiet xxh128sums.txt", out), 0);
        /* again: exists, so refused; with force, replaced */
        assert_int_equal(bfs_compress_outdir(out, &o, &res), BFS_EEXIST);
        o.force = 1;
        assert_int_equal(bfs_compress_outdir(out, &o, &res), 0);
        /* only the compressed copies kept */
        o.remove = 1;
        assert_int_equal(bfs_compress_outdir(out, &o, &res), 0);
        rank_path(rf, sizeof rf, out, 0, 2);
        assert_int_not_equal(access(rf, F_OK), 0);
        assert_int_equal(verify_report(out, rep, sizeof rep), 0);
        assert_int_equal(tu_sh("cd '%s' && xxh128sum -c --quiet xxh128sums.txt", out), 0);
        /* a flipped byte in a .zst: named, down to the tensor */
        snprintf(z, sizeof z, "%s%s", rf, mode ? ".bfz" : ".zst");
        size_t zn = 0;
        uint8_t *zb = tu_read_file(z, &zn);
        assert_non_null(zb);
        zb[zn / 2] ^= 0x01;
        assert_int_equal(tu_write_file(z, zb, zn), 0);
        memset(rep, 0, sizeof rep);
        assert_int_equal(verify_report(out, rep, sizeof rep), BFS_EVERIFY);
        assert_non_null(strstr(rep, "BAD compressed file"));
        assert_non_null(strstr(rep, "BAD tensor"));
        assert_non_null(strstr(bfs_last_error(), "1 problem"));
        zb[zn / 2] ^= 0x01;
        /* truncated */
        assert_int_equal(tu_write_file(z, zb, zn - 3), 0);
        memset(rep, 0, sizeof rep);
        assert_int_equal(verify_report(out, rep, sizeof rep), BFS_EVERIFY);
        assert_non_null(strstr(rep, "BAD SIZE"));
        /* missing */
        unlink(z);
        memset(rep, 0, sizeof rep);
        assert_int_equal(verify_report(out, rep, sizeof rep), BFS_EVERIFY);
        assert_non_null(strstr(rep, "MISSING"));
        free(zb);
    }
    /* a rank file that does not match its manifest is not compressed */
    snprintf(out, sizeof out, "%s/o9", tmp);
    convert_ok("fixtures/bnb-nf4", out, 1);
    rank_path(rf, sizeof rf, out, 0, 1);
    size_t n = 0;
    uint8_t *b = tu_read_file(rf, &n);
    b[n - 10] ^= 0x80;
    assert_int_equal(tu_write_file(rf, b, n), 0);
    free(b);
    assert_int_equal(bfs_compress_outdir(out, NULL, NULL), BFS_EVERIFY);
    snprintf(z, sizeof z, "%s.zst", rf);
    assert_int_not_equal(access(z, F_OK), 0);
    assert_int_equal(tu_sh("ls -a '%s' | grep -q partial", out), 1);
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- convert --compress: the writer thread feeds the compressed copy ----------------- */
static int cancel_after;
static void cancel_cb(const bfs_progress *p, void *u)
{
    (void)u;
    if (p->bytes_done > (uint64_t)cancel_after)
        bfs_cancel();
}

static void test_convert_compress(void **state)
{
    (void)state;
    char *tmp = tu_tmpdir("zc");
    char out[4096], rf[4096], z[4096], ref[4096], rep[16384];
    for (int mode = 0; mode < 2; mode++) {
        snprintf(out, sizeof out, "%s/o%d", tmp, mode);
        bfs_convert_opts o;
        bfs_convert_opts_init(&o);
        o.world_size = 3;
        o.device = "cpu";
        o.compress_level = 5;
        o.compress_mode = mode;
        o.threads = 2;
        bfs_convert_result res;
        bfs_convert_result_init(&res);
        assert_int_equal(bfs_convert("fixtures/mxfp4-tiny", out, &o, &res), 0);
        assert_int_equal(verify_report(out, rep, sizeof rep), 0);
        for (int rank = 0; rank < 3; rank++) {
            rank_path(rf, sizeof rf, out, rank, 3);
            snprintf(z, sizeof z, "%s%s", rf, mode ? ".bfz" : ".zst");
            snprintf(ref, sizeof ref, "%s/ref%d%d", tmp, mode, rank);
            /* the same bytes as compressing the finished file */
            tu_compress(rf, ref, 5, mode, 0, 1);
            assert_same_file(ref, z);
        }
        /* interrupted after the first rank file, then resumed: the reused file is compressed from disk */
        snprintf(out, sizeof out, "%s/r%d", tmp, mode);
        o.progress = cancel_cb;
        cancel_after = 150000;
        assert_int_equal(bfs_convert("fixtures/mxfp4-tiny", out, &o, &res), BFS_EINTR);
        assert_int_equal(tu_sh("ls -a '%s' | grep -q partial", out), 1);
        o.progress = NULL;
        assert_int_equal(bfs_convert("fixtures/mxfp4-tiny", out, &o, &res), 0);
        assert_true(res.files_reused >= 1);
        assert_int_equal(verify_report(out, rep, sizeof rep), 0);
        for (int rank = 0; rank < 3; rank++) {
            rank_path(rf, sizeof rf, out, rank, 3);
            snprintf(z, sizeof z, "%s%s", rf, mode ? ".bfz" : ".zst");
            snprintf(ref, sizeof ref, "%s/ref%d%d", tmp, mode, rank);
            assert_same_file(ref, z);
        }
    }
    /* out of range */
    bfs_convert_opts o;
    bfs_convert_opts_init(&o);
    o.compress_level = 40;
    snprintf(out, sizeof out, "%s/bad", tmp);
    assert_int_equal(bfs_convert("fixtures/bnb-nf4", out, &o, NULL), BFS_EUSAGE);
    assert_int_equal(tu_sh("%s convert fixtures/bnb-nf4 '%s' --compress lz4 2>/dev/null", tu_bfshard(), out), 2);
    assert_int_equal(tu_sh("%s convert fixtures/bnb-nf4 '%s' --compress zstd:19 --quiet && zstd -d -q -c '%s/shard-00001-model-00001-of-00001.safetensors.zst' | cmp -s - '%s/shard-00001-model-00001-of-00001.safetensors'",
                           tu_bfshard(), out, out, out), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- the CLI --------------------------------------------------------------------------- */
static void test_cli(void **state)
{
    (void)state;
    char *tmp = tu_tmpdir("zcli");
    const char *B = tu_bfshard();
    char out[4096], rf[4096];
    snprintf(out, sizeof out, "%s/o", tmp);
    convert_ok("fixtures/bnb-fp4", out, 2);
    rank_path(rf, sizeof rf, out, 1, 2);
    assert_int_equal(tu_sh("%s compress --help | grep -q 'usage: bfshard compress'", B), 0);
    assert_int_equal(tu_sh("%s decompress --help | grep -q 'usage: bfshard decompress'", B), 0);
    assert_int_equal(tu_sh("%s extract --help | grep -q 'usage: bfshard extract'", B), 0);
    assert_int_equal(tu_sh("%s --help | grep -q 'extract FILE.zst TENSOR'", B), 0);
    assert_int_equal(tu_sh("%s compress '%s' --level 19 --threads 2 -q", B, rf), 0);
    assert_int_equal(tu_sh("%s compress '%s' -q 2>/dev/null", B, rf), 8); /* exists */
    assert_int_equal(tu_sh("%s compress '%s' --level 99 2>/dev/null", B, rf), 2);
    assert_int_equal(tu_sh("%s decompress '%s.zst' -o '%s/back' && cmp -s '%s/back' '%s'", B, rf, tmp, tmp, rf), 0);
    assert_int_equal(tu_sh("%s decompress '%s.zst' -o - | cmp -s - '%s'", B, rf, rf), 0);
    char abs[4096];
    assert_non_null(realpath(B, abs));
    assert_int_equal(tu_sh("cd '%s' && '%s' extract '%s.zst' model.layers.0.self_attn.q_proj.weight && test -s model.layers.0.self_attn.q_proj.weight.safetensors",
                           tmp, abs, rf), 0);
    assert_int_equal(tu_sh("%s extract '%s.zst' no.such -o '%s/x' 2>'%s/err'", B, rf, tmp, tmp), 3);
    assert_int_equal(tu_sh("grep -c . '%s/err' | grep -qx 1 && grep -q 'no tensor named' '%s/err'", tmp, tmp), 0);
    assert_int_equal(tu_sh("head -c 1000 '%s.zst' > '%s/t.zst' && %s decompress '%s/t.zst' 2>/dev/null", rf, tmp, B, tmp), 3);
    assert_int_equal(tu_sh("%s decompress '%s' 2>/dev/null", B, rf), 2); /* no .zst suffix, no -o */
    /* OUTDIR, byte-grouped, only compressed copies kept; verify via the CLI */
    assert_int_equal(tu_sh("%s compress '%s' --bytegroup --rm -q --json | grep -q '\"ok\": true'", B, out), 0);
    assert_int_equal(tu_sh("%s verify '%s' -q", B, out), 0);
    assert_int_equal(tu_sh("ls '%s' | grep -c 'safetensors.bfz$' | grep -qx 2", out), 0);
    tu_rmrf(tmp);
    free(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writer_stream),
        cmocka_unit_test(test_roundtrip_fixtures),
        cmocka_unit_test(test_extract_reads_only_its_frames),
        cmocka_unit_test(test_hostile_seek_tables),
        cmocka_unit_test(test_verify_compressed_outdir),
        cmocka_unit_test(test_convert_compress),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
