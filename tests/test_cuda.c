/*
 * CUDA backend: every output bit against the unit-level reference bfs__ref_unit (the
 * scalar CPU kernels over kernels/ref.h, the one every backend is held to), by memcmp;
 * chunking under small budgets; the device-memory bound; errors.
 *
 * Without a CUDA device (or without CUDA in the build) it prints
 * "SKIP: no CUDA device", checks that creating the backend fails cleanly with
 * BFS_EDEVICE, and passes.
 *
 * Knobs (environment): BFS_TEST_GPTOSS_ITEMS (experts in the gpt-oss-20b-shaped
 * test, default 32 as in the real model); BFS_TEST_CUDA_QUICK=1 skips the
 * largest budgets. Built against dev/cuda/emu's fake runtime with
 * -DBFS_CUDA_EMULATE, the same tests run the kernels' host emulation.
 */
#include "testutil.h"

#include "bfs_internal.h"
#include "../kernels/ref.h"
#include "../kernels/ref_woq.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef BFS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef BFS_CUDA_EMULATE
void bfs__emu_fail_at(long n);
void bfs__emu_set(const char *key, int dev, long long value);
long long bfs__emu_get(const char *key, int dev);
long long bfs__emu_log(long i, int field);
#endif
#ifdef BFS_HAVE_CUDA
#include "../kernels/common.cuh"
#endif

#define MiB ((uint64_t)1 << 20)

/* ---- data ------------------------------------------------------------------------------- */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545F4914F6CDD1Dull;
}
static void fill_random(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(rnd() >> 56);
}
static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}
static double env_num(const char *name, double dflt)
{
    const char *s = getenv(name);
    return s && *s ? atof(s) : dflt;
}

/* ---- the reference: bfs__ref_unit (the scalar CPU kernels), as for every backend ---------- */
static void ref_unit(const bfs_ltensor *t, uint64_t row0, uint64_t row1, void *out)
{
    const bfs_unit u = {t, row0, row1, out};
    bfs__ref_unit(&u);
}

/* ---- tensors built by hand ------------------------------------------------------------------ */
static bfs_ltensor mk_mx(const char *name, const uint8_t *blocks, const uint8_t *scales, size_t E, size_t R,
                         size_t G, int transpose, int items)
{
    bfs_ltensor t;
    memset(&t, 0, sizeof t);
    t.name = (char *)name;
    t.kind = BFS_K_MXFP4;
    t.out_dtype = BFS_DT_BF16;
    const size_t C = G * 32;
    if (items) {
        t.ndim = 3;
        t.shape[0] = E;
        t.shape[1] = transpose ? C : R;
        t.shape[2] = transpose ? R : C;
        t.d0 = E;
        t.row_elems = R * C;
    } else {
        t.ndim = 2;
        t.shape[0] = R;
        t.shape[1] = C;
        t.d0 = R;
        t.row_elems = C;
    }
    t.mx.blocks = blocks;
    t.mx.scales = scales;
    t.mx.R = R;
    t.mx.G = G;
    t.mx.transpose = transpose;
    t.mx_items = items;
    t.transform = transpose ? "mxfp4->bf16 transpose(1,2)" : "mxfp4->bf16";
    return t;
}

/* A 2-d BF16-output tensor [rows, cols], rows = units; the format's fields left zero. */
static bfs_ltensor mk_2d(const char *name, bfs_kind kind, size_t rows, size_t cols)
{
    bfs_ltensor t;
    memset(&t, 0, sizeof t);
    t.name = (char *)name;
    t.kind = kind;
    t.out_dtype = BFS_DT_BF16;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.d0 = rows;
    t.row_elems = cols;
    return t;
}

/* nblk MXFP4 blocks (16 bytes) and their scales (one byte each), random. */
static void mx_random(size_t nblk, uint8_t **blocks, uint8_t **scales)
{
    *blocks = xmalloc(nblk * 16);
    *scales = xmalloc(nblk);
    fill_random(*blocks, nblk * 16);
    fill_random(*scales, nblk);
}

static const float nf4_table[16] = BFS_NF4_TABLE_INIT;
static const float fp4_table[16] = BFS_FP4_TABLE_INIT;

/* ---- running units --------------------------------------------------------------------------- */
static int g_ndev;

static bfs_backend *make_backend(const char *spec, uint64_t gpu_mem, uint64_t max_unit)
{
    bfs_backend *b = NULL;
    bfs__err_clear();
    const int rc = bfs__backend_cuda_create(spec, gpu_mem, max_unit, &b);
    if (rc != 0)
        fail_msg("bfs__backend_cuda_create(%s, %" PRIu64 ", %" PRIu64 ") = %d: %s", spec, gpu_mem, max_unit, rc,
                 bfs_last_error());
    assert_non_null(b);
    assert_true(b->device_bytes <= (gpu_mem ? gpu_mem : 256 * MiB) * (uint64_t)(g_ndev ? g_ndev : 1));
    return b;
}

static size_t out_es(const bfs_ltensor *t) { return t->kind == BFS_K_PASS && t->out_dtype == BFS_DT_I32 ? 4 : 2; }

static void compare(const char *what, const uint16_t *got, const uint16_t *want, size_t n)
{
    if (memcmp(got, want, n * 2) == 0)
        return;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            fail_msg("%s: element %zu of %zu is 0x%04x, want 0x%04x", what, i, n, got[i], want[i]);
}

/* Run rows [row0, row1) and compare with want (or the reference when NULL); 64 guard bytes after. */
static void check_unit(bfs_backend *b, const bfs_ltensor *t, uint64_t row0, uint64_t row1, const void *want)
{
    const size_t bytes = (size_t)((row1 - row0) * t->row_elems * out_es(t));
    uint8_t *got = xmalloc(bytes + 64);
    void *ref = NULL;
    memset(got, 0x5A, bytes + 64);
    if (!want) {
        ref = xmalloc(bytes);
        ref_unit(t, row0, row1, ref);
        want = ref;
    }
    const bfs_unit u = {t, row0, row1, got};
    bfs__err_clear();
    const int rc = b->run(b, &u);
    if (rc != 0)
        fail_msg("%s rows [%" PRIu64 ", %" PRIu64 ") on %s: rc %d: %s", t->name, row0, row1, b->name, rc,
                 bfs_last_error());
    char what[256];
    snprintf(what, sizeof what, "%s rows [%" PRIu64 ", %" PRIu64 ") on %s", t->name, row0, row1, b->name);
    compare(what, (const uint16_t *)got, want, bytes / 2);
    for (size_t i = 0; i < 64; i++)
        if (got[bytes + i] != 0x5A)
            fail_msg("%s: wrote past the end of the unit", what);
    free(got);
    free(ref);
}

/* "... at least N bytes ..." -> N */
static uint64_t number_after(const char *msg, const char *key)
{
    const char *p = strstr(msg, key);
    if (!p)
        fail_msg("no '%s' in: %s", key, msg);
    return strtoull(p + strlen(key), NULL, 10);
}

/* ---- tests ------------------------------------------------------------------------------------ */

/* Always runs: without a device (or without CUDA) creation fails cleanly. */
static void test_no_device(void **state)
{
    (void)state;
    if (g_ndev > 0)
        skip();
    bfs_backend *b = (bfs_backend *)0x1;
    bfs__err_clear();
    const int rc = bfs__backend_cuda_create("cuda", 64 * MiB, MiB, &b);
    assert_int_equal(rc, BFS_EDEVICE);
    assert_null(b);
    assert_true(strlen(bfs_last_error()) > 10);
    printf("  create(\"cuda\") without a device: %s\n", bfs_last_error());
}

/* The reference itself, on values worked out by hand from FORMATS.md. */
static void test_reference_spot_values(void **state)
{
    (void)state;
    /* MXFP4: byte 0x71 = low nibble 1 (+0.5, element 0), high nibble 7 (+6, element 1) */
    uint8_t blocks[16] = {0x71, 0xF8}, scales[1] = {128}; /* scale 2 */
    const bfs_ltensor t = mk_mx("spot", blocks, scales, 1, 1, 1, 0, 1);
    uint16_t out[32];
    ref_unit(&t, 0, 1, out);
    assert_int_equal(out[0], 0x3F80); /* 0.5 * 2 = 1 */
    assert_int_equal(out[1], 0x4140); /* 6 * 2 = 12 */
    assert_int_equal(out[2], 0x8000); /* code 8: -0 */
    assert_int_equal(out[3], 0xC140); /* code 15: -6 * 2 */
    scales[0] = 255; /* 2^128, a true ldexp (ref.h, transformers >= 5): never NaN */
    ref_unit(&t, 0, 1, out);
    assert_int_equal(out[0], 0x7F00); /* 0.5 * 2^128 = 2^127, finite */
    assert_int_equal(out[1], 0x7F80); /* 6 * 2^128 overflows: +inf */
    assert_int_equal(out[2], 0x8000); /* -0 */
    assert_int_equal(out[3], 0xFF80); /* -inf */
    assert_int_equal(out[4], 0x0000); /* 0 * 2^128 = 0 */
    scales[0] = 0; /* 2^-127 (float32 0x00400000): subnormal products, kept (no FTZ) */
    ref_unit(&t, 0, 1, out);
    assert_int_equal(out[0], 0x0020); /* 0.5 * 2^-127 = 2^-128 = float32 0x00200000 */
    assert_int_equal(out[1], 0x0140); /* 6 * 2^-127 = 1.5 * 2^-125 = float32 0x01400000 */
    /* bnb: element 0 = high nibble */
    uint8_t codes[1] = {0xF0};
    float absmax[1] = {2.0f};
    bfs_ltensor q;
    memset(&q, 0, sizeof q);
    q.kind = BFS_K_BNB4;
    q.out_dtype = BFS_DT_BF16;
    q.d0 = 2;
    q.row_elems = 1;
    q.bnb.codes = codes;
    q.bnb.table = nf4_table;
    q.bnb.blocksize = 64;
    q.bnb.absmax_f32 = absmax;
    ref_unit(&q, 0, 2, out);
    assert_int_equal(out[0], 0x4000); /* nf4[15] = 1.0 * 2 */
    assert_int_equal(out[1], 0xC000); /* nf4[0] = -1.0 * 2 */
}

/* Every scale byte with every code byte, both layouts, tiles cut at odd places. */
static void mx_all_codes(size_t E, size_t R, size_t G)
{
    const size_t nblk = E * R * G;
    uint8_t *blocks = xmalloc(nblk * 16), *scales = xmalloc(nblk);
    for (size_t i = 0; i < nblk; i++) {
        scales[i] = (uint8_t)(i * 7 + i / 256); /* all 256 values, in varying places */
        for (size_t k = 0; k < 16; k++)
            blocks[i * 16 + k] = (uint8_t)(i * 16 + k + i / 16); /* all 256 bytes under each scale */
    }
    const uint64_t budgets[] = {0, 2 * MiB, 64 * 1024};
    for (int tr = 0; tr < 2; tr++) {
        const bfs_ltensor t = mk_mx(tr ? "all_codes.T" : "all_codes", blocks, scales, E, R, G, tr, 1);
        for (size_t bi = 0; bi < sizeof budgets / sizeof *budgets; bi++) {
            bfs_backend *b = make_backend("cuda", budgets[bi], E * t.row_elems * 2);
            check_unit(b, &t, 0, E, NULL);
            for (size_t e = 0; e < E; e++)
                check_unit(b, &t, e, e + 1, NULL);
            if (E > 2)
                check_unit(b, &t, 1, E - 1, NULL);
            b->destroy(b);
        }
    }
    /* 3-d: dim 0 is the rows */
    const bfs_ltensor t3 = mk_mx("all_codes.3d", blocks, scales, 1, R, G, 0, 0);
    for (size_t bi = 0; bi < sizeof budgets / sizeof *budgets; bi++) {
        bfs_backend *b = make_backend("cuda", budgets[bi], t3.d0 * t3.row_elems * 2);
        check_unit(b, &t3, 0, R, NULL);
        if (R >= 8) {
            check_unit(b, &t3, 1, 2, NULL);
            check_unit(b, &t3, 3, R - 5, NULL);
        }
        b->destroy(b);
    }
    free(blocks);
    free(scales);
}

static void test_mxfp4_all_codes(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    mx_all_codes(3, 261, 3);  /* R % 8 != 0: element stores; partial r and group tiles */
    mx_all_codes(2, 128, 5);  /* R % 8 == 0: 16-byte stores; partial group tile */
    mx_all_codes(1, 64, 4);   /* exactly one tile */
    mx_all_codes(2, 1, 1);    /* degenerate */
}

/* gpt-oss-20b's mlp.experts.gate_up_proj: blocks [32, 5760, 90, 16], scales [32, 5760, 90]. */
static void test_mxfp4_gptoss_layer(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    const size_t E = (size_t)env_num("BFS_TEST_GPTOSS_ITEMS", 32), R = 5760, G = 90, C = G * 32;
    const size_t nblk = E * R * G;
    uint8_t *blocks = xmalloc(nblk * 16), *scales = xmalloc(nblk);
    fill_random(blocks, nblk * 16);
    for (size_t i = 0; i < nblk; i++) /* trained-weight-like scales, and now and then anything */
        scales[i] = (i % 97 == 0) ? (uint8_t)(rnd() >> 56) : (uint8_t)(112 + (rnd() >> 60));
    uint16_t *want = xmalloc(E * R * C * 2);
    for (int tr = 1; tr >= 0; tr--) {
        const bfs_ltensor t = mk_mx(tr ? "model.layers.0.mlp.experts.gate_up_proj"
                                       : "model.layers.0.mlp.experts.gate_up_proj(openai)",
                                    blocks, scales, E, R, G, tr, 1);
        ref_unit(&t, 0, E, want);
        /* default budget, whole layer; then a rank's rows for W = 8 and W = 3 under a 24 MiB budget */
        bfs_backend *b = make_backend("cuda", 0, E * t.row_elems * 2);
        check_unit(b, &t, 0, E, want);
        b->destroy(b);
        b = make_backend("cuda", 24 * MiB, E * t.row_elems * 2);
        const uint64_t worlds[] = {8, 3};
        for (size_t wi = 0; wi < 2; wi++)
            for (uint64_t r = 0; r < worlds[wi]; r++) {
                uint64_t r0, r1;
                bfs__chunk_rows(E, worlds[wi], r, &r0, &r1);
                if (r1 > r0)
                    check_unit(b, &t, r0, r1, want + r0 * t.row_elems);
            }
        b->destroy(b);
    }
    free(want);
    free(blocks);
    free(scales);
}

/* bnb 4-bit: [333, 301] (odd element count, odd row length: units start on odd elements). */
static void bnb_case(const char *qt, int dq, size_t bs, const uint64_t *budgets, size_t nbudgets)
{
    const size_t rows = 333, cols = 301, n = rows * cols, nb = (n + bs - 1) / bs, nbs = 256;
    const size_t nnb = (nb + nbs - 1) / nbs;
    uint8_t *codes = xmalloc((n + 1) / 2), *absmax_u8 = xmalloc(nb);
    float *absmax = xmalloc(nb * 4), *ncode = xmalloc(256 * 4), *nabs = xmalloc(nnb * 4);
    fill_random(codes, (n + 1) / 2);
    fill_random(absmax_u8, nb);
    for (size_t i = 0; i < nb; i++)
        absmax[i] = (float)(rnd() >> 40) / (float)(1 << 24) * 0.25f;
    absmax[0] = 0.0f; /* and a few values that must come out as the reference's */
    if (nb > 4) {
        absmax[1] = 1e-40f;
        absmax[2] = -3.5f;
        memcpy(&absmax[3], &(uint32_t){0x7F800000u}, 4);
        memcpy(&absmax[4], &(uint32_t){0x7FC00001u}, 4);
    }
    for (size_t i = 0; i < 256; i++)
        ncode[i] = ((float)(rnd() >> 40) / (float)(1 << 24)) * 2.0f - 1.0f;
    for (size_t i = 0; i < nnb; i++)
        nabs[i] = (float)(rnd() >> 40) / (float)(1 << 24) * 0.1f;
    char name[64];
    snprintf(name, sizeof name, "bnb.%s%s.bs%zu.weight", qt, dq ? ".dq" : "", bs);
    bfs_ltensor t = mk_2d(name, BFS_K_BNB4, rows, cols);
    snprintf(t.quant_type, sizeof t.quant_type, "%s", qt);
    t.double_quant = dq;
    t.src_dtype = BFS_DT_F16;
    t.bnb.codes = codes;
    t.bnb.table = strcmp(qt, "fp4") == 0 ? fp4_table : nf4_table;
    t.bnb.blocksize = bs;
    if (dq) {
        t.bnb.absmax_u8 = absmax_u8;
        t.bnb.nested_code = ncode;
        t.bnb.nested_absmax = nabs;
        t.bnb.nested_blocksize = nbs;
        t.bnb.offset = 0.0135f;
    } else {
        t.bnb.absmax_f32 = absmax;
    }
    for (size_t bi = 0; bi < nbudgets; bi++) {
        bfs_backend *b = make_backend("cuda", budgets[bi], n * 2);
        check_unit(b, &t, 0, rows, NULL);
        check_unit(b, &t, 0, 1, NULL);
        check_unit(b, &t, 1, 8, NULL);    /* starts on element 301: odd, mid-byte, mid-block */
        check_unit(b, &t, 8, 100, NULL);
        check_unit(b, &t, 101, 333, NULL);
        check_unit(b, &t, 332, 333, NULL);
        b->destroy(b);
    }
    free(codes);
    free(absmax_u8);
    free(absmax);
    free(ncode);
    free(nabs);
}

static void test_bnb4(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    const uint64_t budgets[] = {0, 16 * 1024, 40 * 1024 + 512};
    const size_t bss[] = {64, 4096, 32, 100 /* not a power of two: the general division path */};
    for (int q = 0; q < 2; q++)
        for (int dq = 0; dq < 2; dq++)
            for (size_t i = 0; i < sizeof bss / sizeof *bss; i++)
                bnb_case(q ? "fp4" : "nf4", dq, bss[i], budgets, 3);
}

static void cast_case(bfs_dtype dt, size_t n, const uint64_t *budgets, size_t nbudgets)
{
    const size_t es = dt == BFS_DT_F64 ? 8 : dt == BFS_DT_F32 ? 4 : 2;
    uint8_t *buf = xmalloc(n * es + 1), *data = buf + 1; /* unaligned, as in a safetensors file */
    fill_random(data, n * es);
    if (dt == BFS_DT_F16) {
        for (size_t i = 0; i < n; i++) /* every half, then random */
            if (i < 65536)
                memcpy(data + i * 2, &(uint16_t){(uint16_t)i}, 2);
    } else if (dt == BFS_DT_F32) {
        const uint32_t special[] = {0, 0x80000000u, 1, 0x807FFFFFu, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
                                    0xFFFFFFFFu, 0x7F7FFFFFu, 0x3F808000u /* tie to even */,
                                    0x3F818000u /* tie to odd */, 0x7F7F8000u /* rounds to inf */};
        for (size_t i = 0; i < sizeof special / sizeof *special && i < n; i++)
            memcpy(data + i * 4, &special[i], 4);
    } else {
        const double special[] = {0.0, -0.0, 1e-310, 1.0 + 0x1p-24 + 0x1p-60, /* double rounding */
                                  3.4028235677973366e38, 1e300, -1e300, 1.401298464324817e-45 * 0.75};
        for (size_t i = 0; i < sizeof special / sizeof *special && i < n; i++)
            memcpy(data + i * 8, &special[i], 8);
    }
    bfs_raw raw;
    memset(&raw, 0, sizeof raw);
    raw.data = data;
    raw.nbytes = n * es;
    bfs_ltensor t;
    memset(&t, 0, sizeof t);
    char name[64];
    snprintf(name, sizeof name, "cast.%s.%zu", dt == BFS_DT_F64 ? "f64" : dt == BFS_DT_F32 ? "f32" : "f16", n);
    t.name = name;
    t.kind = BFS_K_CAST;
    t.out_dtype = BFS_DT_BF16;
    t.src_dtype = dt;
    t.ndim = 1;
    t.shape[0] = n;
    t.d0 = n;
    t.row_elems = 1;
    t.src[0] = &raw;
    t.nsrc = 1;
    for (size_t bi = 0; bi < nbudgets; bi++) {
        bfs_backend *b = make_backend("cuda", budgets[bi], n * 2);
        check_unit(b, &t, 0, n, NULL);
        check_unit(b, &t, 1, n / 2 + 1, NULL);
        check_unit(b, &t, n - 3, n, NULL);
        b->destroy(b);
    }
    free(buf);
}

static void test_casts(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    const uint64_t budgets[] = {0, 16 * 1024};
    cast_case(BFS_DT_F16, 65536 + 8 * 1000 + 3, budgets, 2);
    cast_case(BFS_DT_F32, 100003, budgets, 2);
    cast_case(BFS_DT_F64, 50001, budgets, 2);
    cast_case(BFS_DT_F32, 5, budgets, 2);
}

/* ---- FP8 scaled, INT4 pack-quantized, NVFP4 (both conventions) ------------------------------ */
static void put_f32(uint8_t *p, size_t i, uint32_t bits) { memcpy(p + 4 * i, &bits, 4); }
static void put_bf16(uint8_t *p, size_t i, uint16_t bits) { memcpy(p + 2 * i, &bits, 2); }

/* A scale array of n values, F32 or BF16, random in [2^-20, 2^4) with both signs, then the
 * values that must come out as the reference's: 0, -0, +-inf, NaN, a subnormal, the largest. */
static uint8_t *mk_scales(size_t n, int bf16)
{
    uint8_t *p = xmalloc(n * (bf16 ? 2 : 4) + 1);
    for (size_t i = 0; i < n; i++) {
        const uint32_t f = (uint32_t)(((rnd() >> 40) % (24u << 23)) + (107u << 23)) | (uint32_t)(rnd() >> 63 << 31);
        if (bf16)
            put_bf16(p, i, (uint16_t)(f >> 16));
        else
            put_f32(p, i, f);
    }
    const uint32_t special[] = {0, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x00000401u, 0x7F7FFFFFu};
    for (size_t i = 0; i < sizeof special / sizeof *special && 3 * i + 1 < n; i++) {
        if (bf16)
            put_bf16(p, 3 * i + 1, (uint16_t)(special[i] >> 16 | (special[i] == 0x00000401u ? 1u : 0u)));
        else
            put_f32(p, 3 * i + 1, special[i]);
    }
    return p;
}

/* Whole tensor, single rows, units starting on odd rows and inside blocks, the last row;
 * each under every budget (16 KiB: a few elements per chunk, many chunks). */
static void check_all_units(const bfs_ltensor *t, size_t rows, const uint64_t *budgets, size_t nbudgets)
{
    for (size_t bi = 0; bi < nbudgets; bi++) {
        bfs_backend *b = make_backend("cuda", budgets[bi], rows * t->row_elems * 2);
        check_unit(b, t, 0, rows, NULL);
        check_unit(b, t, 0, 1, NULL);
        check_unit(b, t, 1, rows < 8 ? rows : 8, NULL);
        if (rows > 130) {
            check_unit(b, t, 127, 130, NULL); /* across a 128-row block edge */
            check_unit(b, t, 3, rows - 5, NULL);
        }
        check_unit(b, t, rows - 1, rows, NULL);
        b->destroy(b);
    }
}

/* bf16: a bfs_scale_type (F32, BF16; E8M0 as U8 or F8_E8M0: DeepSeek-V4, every byte) */
static void fp8_case(size_t rows, size_t cols, size_t bh, size_t bw, int bf16)
{
    const size_t gr = (rows + bh - 1) / bh, gc = (cols + bw - 1) / bw;
    uint8_t *w = xmalloc(rows * cols);
    fill_random(w, rows * cols);
    for (size_t i = 0; i < 256 && i < rows * cols; i++) /* every E4M3 code: NaN 0x7F/0xFF, subnormals */
        w[i] = (uint8_t)i;
    uint8_t *scale;
    if (bf16 >= BFS_SCALE_E8M0) {
        scale = xmalloc(gr * gc);
        for (size_t i = 0; i < gr * gc; i++)
            scale[i] = (uint8_t)(i % 2 ? 255 - i / 2 : i / 2);
    } else {
        scale = mk_scales(gr * gc, bf16);
    }
    char name[96];
    snprintf(name, sizeof name, "fp8.%zux%zu.b%zux%zu.s%d.weight", rows, cols, bh, bw, bf16);
    bfs_ltensor t = mk_2d(name, BFS_K_FP8, rows, cols);
    t.fp8 = (bfs_fp8_desc){.w = w, .scale = scale, .scale_type = bf16, .cols = cols, .bh = bh, .bw = bw};
    const uint64_t budgets[] = {0, 16 * 1024, 40 * 1024 + 512};
    check_all_units(&t, rows, budgets, 3);
    free(w);
    free(scale);
}

static void test_fp8(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    fp8_case(300, 333, 128, 128, 0); /* DeepSeek-V3 blocks, partial edge blocks both ways */
    fp8_case(257, 130, 128, 128, 1); /* a BF16 block scale */
    fp8_case(64, 200, 64, 200, 0);   /* per tensor (bh = rows, bw = cols) */
    fp8_case(37, 96, 1, 96, 1);      /* per channel, BF16 */
    fp8_case(3, 8, 1, 8, 0);         /* tiny */
    fp8_case(19, 1, 2, 1, 0);        /* one column */
    fp8_case(5, 5001, 128, 128, 0);  /* rows wider than a 16 KiB budget's chunk: chunks start mid-row */
    fp8_case(300, 333, 128, 128, BFS_SCALE_E8M0);     /* DeepSeek-V4: U8 E8M0 block scales, 255 = +inf */
    fp8_case(300, 333, 128, 128, BFS_SCALE_E8M0_NAN); /* F8_E8M0 block scales, 255 = NaN */
    fp8_case(40, 700, 2, 3, BFS_SCALE_E8M0_NAN);      /* every E8M0 byte (7 x 234 blocks) */
}

/* 4-bit fields of int32 words, random. */
static void int4_case(size_t rows, size_t cols, size_t group_size, int asym, int bf16)
{
    const size_t wpr = (cols + 7) / 8, ng = cols / group_size, zr = (rows + 7) / 8;
    uint8_t *packed = xmalloc(rows * wpr * 4), *zp = xmalloc(zr * ng * 4);
    fill_random(packed, rows * wpr * 4);
    fill_random(zp, zr * ng * 4);
    uint8_t *scale = mk_scales(rows * ng, bf16);
    char name[96];
    snprintf(name, sizeof name, "int4.%zux%zu.g%zu%s%s.weight", rows, cols, group_size, asym ? ".asym" : "",
             bf16 ? ".bf16" : "");
    bfs_ltensor t = mk_2d(name, BFS_K_INT4, rows, cols);
    t.int4 = (bfs_int4_desc){.packed = packed, .scale = scale, .zp = asym ? zp : NULL, .scale_bf16 = bf16,
                             .cols = cols, .wpr = wpr, .ngroups = ng, .group_size = group_size};
    const uint64_t budgets[] = {0, 16 * 1024, 40 * 1024 + 512};
    check_all_units(&t, rows, budgets, 3);
    free(packed);
    free(zp);
    free(scale);
}

static void test_int4(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    int4_case(300, 256, 128, 0, 0); /* W4A16 group 128 */
    int4_case(301, 256, 32, 1, 1);  /* asymmetric: 301 rows, the last zero-point word partial */
    int4_case(37, 36, 12, 1, 0);    /* groups of 12: not a divisor of 8, rows not of 8, a half word */
    int4_case(45, 100, 100, 0, 1);  /* per channel (one group), a half word per row */
    int4_case(9, 20, 20, 1, 0);     /* per channel asymmetric */
    int4_case(11, 5000, 40, 1, 1);  /* rows wider than a chunk: chunks start mid-row, mid-word, mid-group */
}

/* ---- GPTQ (2/3/4/8 bits, v1 / v2, act-order), AWQ GEMM, bitsandbytes 8-bit ------------------- */
/* F16 scales: random, and the edges (0, -0, inf, NaN, subnormal, the largest, products that
 * overflow fp16). */
static uint8_t *mk_f16_scales(size_t n)
{
    uint8_t *p = xmalloc(2 * n + 1);
    for (size_t i = 0; i < n; i++) {
        const uint16_t h = (uint16_t)((rnd() >> 40) & 0xFFFFu);
        memcpy(p + 2 * i, &h, 2);
    }
    const uint16_t special[] = {0, 0x8000, 0x7C00, 0x7E00, 0x0001, 0x7BFF, 0x7000, 0x3C00};
    for (size_t i = 0; i < sizeof special / sizeof *special && 2 * i < n; i++)
        memcpy(p + 4 * i, &special[i], 2);
    return p;
}

/* layout BFS_WOQ_*; act: a permuted g_idx (GPTQ) */
static void woq_case(int layout, int bits, int v1, int act, size_t rows, size_t cols, size_t G)
{
    const size_t ng = layout == BFS_WOQ_BNB8 ? 1 : (cols + G - 1) / G;
    const int gemv = layout == BFS_WOQ_GEMV; /* qzeros [rows][zw] padded, scales [rows][zw * 8] */
    const size_t zw = gemv ? (ng + 7) / 8 + 1 : layout == BFS_WOQ_AWQ ? (rows + 7) / 8 : bits == 3 ? (rows + 31) / 32 * 3 : (rows * (size_t)bits + 31) / 32;
    bfs_woq_desc d = {.layout = layout, .bits = bits, .v1 = v1, .scale_type = BFS_WOQ_F16, .rows = rows, .cols = cols,
                      .group_size = layout == BFS_WOQ_BNB8 ? cols : G, .ngroups = ng, .zw = layout == BFS_WOQ_BNB8 ? 0 : zw};
    const size_t qwb = layout == BFS_WOQ_GPTQ ? bfs_gptq_kw(&d) * rows * 4 : layout == BFS_WOQ_AWQ ? cols * zw * 4 : gemv ? rows * cols / 2 : rows * cols;
    const size_t qzb = (gemv ? rows : ng) * zw * 4 + 4;
    uint8_t *qw = xmalloc(qwb), *qz = xmalloc(qzb), *sc, *gi = xmalloc(cols * 4);
    fill_random(qw, qwb);
    fill_random(qz, qzb);
    if (layout == BFS_WOQ_BNB8) {
        sc = xmalloc(rows * 4);
        for (size_t r = 0; r < rows; r++) {
            const uint32_t f = (uint32_t)(rnd() >> 32);
            memcpy(sc + 4 * r, &f, 4);
        }
    } else {
        sc = mk_f16_scales((gemv ? zw * 8 : ng) * rows);
    }
    for (size_t c = 0; c < cols; c++) {
        const int32_t g = (int32_t)(act ? rnd() % ng : G ? c / G : 0);
        memcpy(gi + 4 * c, &g, 4);
    }
    d.qweight = qw;
    d.qzeros = layout == BFS_WOQ_BNB8 ? NULL : qz;
    d.scale = sc;
    d.g_idx = layout == BFS_WOQ_GPTQ && act ? gi : NULL;
    char name[96];
    snprintf(name, sizeof name, "woq.l%d.b%d.v%d.a%d.%zux%zu.g%zu.weight", layout, bits, v1, act, rows, cols, G);
    bfs_ltensor t = mk_2d(name, BFS_K_WOQ, rows, cols);
    t.woq = d;
    const uint64_t budgets[] = {0, 16 * 1024, 40 * 1024 + 512};
    check_all_units(&t, rows, budgets, 3);
    free(qw);
    free(qz);
    free(sc);
    free(gi);
}

static void test_woq(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    woq_case(BFS_WOQ_GPTQ, 4, 1, 1, 300, 256, 128); /* act-order, v1 */
    woq_case(BFS_WOQ_GPTQ, 4, 0, 0, 37, 96, 64);    /* v2, a partial group, rows not of 8 */
    woq_case(BFS_WOQ_GPTQ, 8, 1, 1, 45, 100, 32);   /* 8-bit, 100 columns: a half word */
    woq_case(BFS_WOQ_GPTQ, 3, 1, 1, 96, 64, 32);    /* 3-bit: codes straddling words */
    woq_case(BFS_WOQ_GPTQ, 3, 0, 0, 64, 320, 96);
    woq_case(BFS_WOQ_GPTQ, 2, 1, 0, 33, 48, 16);    /* 2-bit v1 */
    woq_case(BFS_WOQ_GPTQ, 4, 1, 0, 9, 1500, 40);   /* a row near the 16 KiB budget: one row per chunk */
    woq_case(BFS_WOQ_AWQ, 4, 0, 0, 300, 256, 128);
    woq_case(BFS_WOQ_AWQ, 4, 0, 0, 37, 96, 32);     /* 37 rows: a partial word per row */
    woq_case(BFS_WOQ_GEMV, 4, 0, 0, 300, 256, 64);  /* AWQ GEMV: row-major, padded zero points and scales */
    woq_case(BFS_WOQ_GEMV, 4, 0, 0, 9, 1504, 32);   /* a row near the 16 KiB budget */
    woq_case(BFS_WOQ_BNB8, 8, 0, 0, 300, 333, 0);
    woq_case(BFS_WOQ_BNB8, 8, 0, 0, 3, 1200, 0);
}

static void nvfp4_case(size_t rows, size_t cols, uint32_t global_bits, int modelopt)
{
    uint8_t *packed = xmalloc(rows * cols / 2), *scale = xmalloc(rows * cols / 16);
    fill_random(packed, rows * cols / 2);
    fill_random(scale, rows * cols / 16);
    for (size_t i = 0; i < 256 && i < rows * cols / 16; i++) /* every E4M3 scale byte, NaN included */
        scale[i] = (uint8_t)i;
    for (size_t i = 0; i < 8 && i < rows * cols / 2; i++)
        packed[i] = (uint8_t)(0x88u ^ (i << 4) ^ i); /* code 8 (the sign of zero) and its neighbours */
    float gs;
    memcpy(&gs, &global_bits, 4);
    char name[96];
    snprintf(name, sizeof name, "nvfp4.%s.%zux%zu.g%08x.weight", modelopt ? "modelopt" : "ct", rows, cols,
             global_bits);
    bfs_ltensor t = mk_2d(name, BFS_K_NVFP4, rows, cols);
    t.nv = (bfs_nvfp4_desc){.packed = packed, .scale = scale, .global_scale = gs, .modelopt = modelopt, .cols = cols};
    const uint64_t budgets[] = {0, 16 * 1024, 40 * 1024 + 512};
    check_all_units(&t, rows, budgets, 3);
    free(packed);
    free(scale);
}

static void test_nvfp4(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    const uint32_t globals[] = {0x44C00000u /* 1536 */, 0x3A83126Fu /* 0.001 */, 0, 0x80000000u, 0x7F800000u,
                                0x7FC00000u, 0x00000003u /* subnormal */};
    for (int mo = 0; mo < 2; mo++)
        for (size_t i = 0; i < sizeof globals / sizeof *globals; i++)
            nvfp4_case(i == 0 ? 260 : 33, i == 0 ? 272 : 48, globals[i], mo);
    nvfp4_case(5, 16, 0x3F800000u, 0);
    nvfp4_case(5, 16, 0x3F800000u, 1);
    nvfp4_case(3, 8000, 0x44C00000u, 0); /* rows wider than a chunk: chunks start mid-row */
    nvfp4_case(3, 8000, 0x44C00000u, 1);
}

/* ---- compressed-tensors MX: MXFP8, MXFP4, MXFP6 (elem BFS_CTMX_E4M3, _E2M1, _E2M3) ------------- */
static void ctmx_case(size_t rows, size_t cols, int elem, int nan255)
{
    static const char *const names[3] = {"mxfp8", "mxfp4", "mxfp6"};
    const size_t n = rows * cols, ns = n / 32;
    const size_t wb = elem == BFS_CTMX_E4M3 ? n : elem == BFS_CTMX_E2M1 ? n / 2 : n / 4 * 3;
    uint8_t *w = xmalloc(wb), *scale = xmalloc(ns);
    fill_random(w, wb);
    fill_random(scale, ns);
    for (size_t i = 0; i < 256 && i < ns; i++) /* every E8M0 byte: 0 (2^-127), 254, 255 (+inf) */
        scale[i] = (uint8_t)i;
    for (size_t i = 0; i < 256 && i < wb; i++) /* every E4M3 code / pair of E2M1 codes / E2M3 code */
        w[i] = (uint8_t)(i * 7);
    char name[96];
    snprintf(name, sizeof name, "ctmx.%s%s.%zux%zu.weight", names[elem], nan255 ? ".nan255" : "", rows, cols);
    bfs_ltensor t = mk_2d(name, BFS_K_CTMX, rows, cols);
    t.ctmx = (bfs_ctmx_desc){.w = w, .scale = scale, .elem = elem, .cols = cols, .nan255 = nan255};
    const uint64_t budgets[] = {0, 16 * 1024, 40 * 1024 + 512};
    check_all_units(&t, rows, budgets, 3);
    free(w);
    free(scale);
}

static void test_ctmx(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    for (int el = 0; el < 3; el++) {
        ctmx_case(260, 288, el, 0); /* 9 groups a row, every scale byte in rows 0..28 */
        ctmx_case(33, 32, el, 0);   /* one group a row */
        ctmx_case(3, 8000, el, 0);  /* rows wider than a chunk: chunks start mid-row, mid-group, mid-byte (word) */
        ctmx_case(260, 288, el, 1); /* DeepSeek-V4 F8_E8M0 scales: byte 255 is NaN */
    }
}

/* The two NVFP4 conventions differ on the same bytes: the CUDA path must not confuse them. */
static void test_nvfp4_conventions_differ(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    uint8_t packed[8] = {0x88, 0x21, 0x43, 0x65, 0x87, 0xA9, 0xCB, 0xED}, scale[1] = {0x38 /* 1.0 */};
    uint16_t out[2][16];
    bfs_backend *b = make_backend("cuda", 0, 64);
    for (int mo = 0; mo < 2; mo++) {
        bfs_ltensor t = mk_2d(mo ? "nvfp4.modelopt" : "nvfp4.ct", BFS_K_NVFP4, 1, 16);
        t.nv = (bfs_nvfp4_desc){.packed = packed, .scale = scale, .global_scale = 2.0f, .modelopt = mo, .cols = 16};
        const bfs_unit u = {&t, 0, 1, out[mo]};
        assert_int_equal(b->run(b, &u), 0);
        check_unit(b, &t, 0, 1, NULL);
    }
    b->destroy(b);
    assert_int_equal(out[0][0], 0x8000); /* compressed-tensors: code 8 = -0.0 */
    assert_int_equal(out[1][0], 0x0000); /* ModelOpt: +0.0 */
    assert_int_equal(out[0][2], 0x3E80); /* 1 * (1 / 2) * 0.5 = 0.25 */
    assert_int_equal(out[1][2], 0x3F80); /* 1 * (1 * 2) * 0.5 = 1.0 */
}

/* One FP8 tensor split over two devices (a unit large enough to be shared). */
static void test_fp8_multi_gpu(void **state)
{
    (void)state;
    if (g_ndev < 2)
        skip();
    const size_t rows = 1030, cols = 4100;
    uint8_t *w = xmalloc(rows * cols);
    fill_random(w, rows * cols);
    uint8_t *scale = mk_scales(((rows + 127) / 128) * ((cols + 127) / 128), 0);
    bfs_ltensor t = mk_2d("fp8.multi.weight", BFS_K_FP8, rows, cols);
    t.fp8 = (bfs_fp8_desc){.w = w, .scale = scale, .scale_type = 0, .cols = cols, .bh = 128, .bw = 128};
    bfs_backend *b = make_backend("cuda:0,1", 16 * MiB, rows * cols * 2);
    check_unit(b, &t, 0, rows, NULL);
    check_unit(b, &t, 5, rows - 1, NULL);
    b->destroy(b);
    free(w);
    free(scale);
}

static void test_passthrough(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    const size_t rows = 17, cols = 9;
    uint8_t *data = xmalloc(rows * cols * 4);
    fill_random(data, rows * cols * 4);
    bfs_raw raw;
    memset(&raw, 0, sizeof raw);
    raw.data = data;
    bfs_ltensor t = mk_2d("pass.i32", BFS_K_PASS, rows, cols);
    t.out_dtype = t.src_dtype = BFS_DT_I32;
    t.src[0] = &raw;
    t.nsrc = 1;
    bfs_backend *b = make_backend("cuda", 0, 0);
    check_unit(b, &t, 0, rows, NULL);
    check_unit(b, &t, 3, 4, NULL);
    check_unit(b, &t, 5, 5, NULL);
    b->destroy(b);
    free(data);
}

#ifdef BFS_HAVE_CUDA
/* ---- the memory bound ----------------------------------------------------------------------- */
typedef struct mem_poll {
    int dev;
    atomic_int stop;
    size_t min_free;
    unsigned samples;
} mem_poll;

static void *mem_poll_main(void *p)
{
    mem_poll *m = p;
    if (cudaSetDevice(m->dev) != cudaSuccess)
        return NULL;
    while (!atomic_load(&m->stop)) {
        size_t f = 0, tot = 0;
        if (cudaMemGetInfo(&f, &tot) == cudaSuccess && f < m->min_free)
            m->min_free = f;
        m->samples++;
        usleep(200);
    }
    return NULL;
}

static size_t free_now(void)
{
    size_t f = 0, tot = 0;
    assert_int_equal(cudaMemGetInfo(&f, &tot), cudaSuccess);
    return f;
}

/* Used device memory never exceeds the budget, plus an allowance for what the
 * driver takes besides our one cudaMalloc: the CUDA context exists before the
 * first sample (cudaFree(0)) and our kernels' module is loaded by a warm-up
 * run, so what remains is the allocation's rounding to the driver's 2 MiB
 * pages and the three streams' and six events' bookkeeping, a few MiB at most.
 * 16 MiB is well under the 1 GiB+ a per-unit allocation of this layer would show. */
#define CTX_ALLOWANCE (16 * MiB)

static void test_memory_bound(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    const size_t E = 8, R = 2880, G = 90; /* down_proj-shaped, 8 experts: 133 MB out, 40 MB in */
    const size_t nblk = E * R * G;
    uint8_t *blocks = xmalloc(nblk * 16), *scales = xmalloc(nblk);
    fill_random(blocks, nblk * 16);
    for (size_t i = 0; i < nblk; i++)
        scales[i] = (uint8_t)(118 + (rnd() >> 61));
    const bfs_ltensor t = mk_mx("mlp.experts.down_proj", blocks, scales, E, R, G, 1, 1);
    const bfs_ltensor tn = mk_mx("mlp.experts.down_proj(openai)", blocks, scales, E, R, G, 0, 1);
    const uint64_t unit = E * t.row_elems * 2;

    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaFree(0), cudaSuccess); /* the context, before the first sample */
    {                                           /* warm-up: load every kernel once */
        bfs_backend *w = make_backend("cuda:0", 4 * MiB, unit);
        check_unit(w, &t, 0, 1, NULL);
        check_unit(w, &tn, 0, 1, NULL);
        w->destroy(w);
    }
    const uint64_t budgets[] = {24 * MiB, 64 * MiB, 5 * MiB};
    for (size_t bi = 0; bi < 3; bi++) {
        const uint64_t B = budgets[bi];
        const size_t free0 = free_now();
        mem_poll m = {.dev = 0, .min_free = free0};
        atomic_init(&m.stop, 0);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, mem_poll_main, &m), 0);
        bfs_backend *b = make_backend("cuda:0", B, unit);
        const size_t free1 = free_now();
        check_unit(b, &t, 0, E, NULL);
        check_unit(b, &tn, 0, E, NULL);
        check_unit(b, &t, 3, 7, NULL);
        const size_t free2 = free_now();
        atomic_store(&m.stop, 1);
        pthread_join(th, NULL);
        const uint64_t dev_bytes = b->device_bytes;
        b->destroy(b);
        const size_t free3 = free_now();
        size_t lo = m.min_free < free1 ? m.min_free : free1;
        lo = lo < free2 ? lo : free2;
        const uint64_t peak = free0 > lo ? free0 - lo : 0;
        printf("  budget %" PRIu64 " MiB: device_bytes %" PRIu64 ", peak used delta %" PRIu64
               " bytes over %u samples (unit %" PRIu64 " MiB), after destroy %+" PRId64 "\n",
               B / MiB, dev_bytes, peak, m.samples, unit / MiB, (int64_t)free0 - (int64_t)free3);
        assert_true(dev_bytes <= B);
        if (peak > B + CTX_ALLOWANCE)
            fail_msg("device memory used %" PRIu64 " > budget %" PRIu64 " + %" PRIu64, peak, B, CTX_ALLOWANCE);
        if (free0 > free3 && free0 - free3 > CTX_ALLOWANCE) /* destroy gave it back */
            fail_msg("%" PRIu64 " bytes of device memory not returned by destroy", (uint64_t)(free0 - free3));
    }
    free(blocks);
    free(scales);
}
#endif

/* ---- budgets and errors ------------------------------------------------------------------------ */
static void test_budget_errors(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    bfs_backend *b = NULL;
    /* a budget below the backend's minimum: create says what works, and that does */
    bfs__err_clear();
    assert_int_equal(bfs__backend_cuda_create("cuda", 1000, MiB, &b), BFS_ENOMEM);
    assert_null(b);
    const uint64_t min_create = number_after(bfs_last_error(), "at least ");
    printf("  %s\n", bfs_last_error());
    b = make_backend("cuda", min_create, MiB);
    b->destroy(b);

    /* a budget that cannot hold one 32-column group of a 5760-row item */
    const size_t R = 5760, G = 2;
    uint8_t *blocks, *scales;
    mx_random(R * G, &blocks, &scales);
    const bfs_ltensor t = mk_mx("too_big.T", blocks, scales, 1, R, G, 1, 1);
    uint16_t *out = xmalloc(t.row_elems * 2);
    b = make_backend("cuda", 256 * 1024, t.row_elems * 2);
    const bfs_unit u = {&t, 0, 1, out};
    bfs__err_clear();
    assert_int_equal(b->run(b, &u), BFS_ENOMEM);
    printf("  %s\n", bfs_last_error());
    const uint64_t need = number_after(bfs_last_error(), "at least ");
    assert_true(strstr(bfs_last_error(), "too_big.T") != NULL);
    b->destroy(b);
    b = make_backend("cuda", need, t.row_elems * 2); /* the number it gave works */
    check_unit(b, &t, 0, 1, NULL);
    b->destroy(b);
    free(out);
    free(blocks);
    free(scales);
}

static void test_spec_errors(void **state)
{
    (void)state;
    if (!bfs__cuda_built())
        skip();
    const char *bad[] = {"cuda:x", "cuda:", "cuda:0,", "cuda:0,0", "gpu", "cudax", "cuda:-1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        bfs_backend *b = NULL;
        bfs__err_clear();
        const int rc = bfs__backend_cuda_create(bad[i], 64 * MiB, MiB, &b);
        if (rc != BFS_EUSAGE)
            fail_msg("spec '%s': %d (%s), want BFS_EUSAGE", bad[i], rc, bfs_last_error());
        assert_null(b);
    }
    if (g_ndev > 0) {
        bfs_backend *b = NULL;
        bfs__err_clear();
        assert_int_equal(bfs__backend_cuda_create("cuda:99", 64 * MiB, MiB, &b), BFS_EDEVICE);
        assert_null(b);
        printf("  %s\n", bfs_last_error());
    }
}

/* ---- concurrency and several devices ------------------------------------------------------------ */
typedef struct par_arg {
    bfs_backend *b;
    const bfs_ltensor *t;
    int id;
    int failed;
} par_arg;

static void *par_main(void *p)
{
    par_arg *a = p;
    const bfs_ltensor *t = a->t;
    uint16_t *got = malloc(t->row_elems * 2), *want = malloc(t->row_elems * 2);
    if (!got || !want) {
        a->failed = 1;
        goto out;
    }
    for (int k = 0; k < 6; k++) {
        const uint64_t e = (uint64_t)(a->id + k) % t->d0;
        const bfs_unit u = {t, e, e + 1, got};
        ref_unit(t, e, e + 1, want);
        if (a->b->run(a->b, &u) != 0 || memcmp(got, want, t->row_elems * 2) != 0)
            a->failed = 1;
    }
out:
    free(got);
    free(want);
    return NULL;
}

static void run_parallel(const char *spec, uint64_t budget)
{
    const size_t E = 6, R = 200, G = 7;
    uint8_t *blocks = xmalloc(E * R * G * 16), *scales = xmalloc(E * R * G);
    fill_random(blocks, E * R * G * 16);
    for (size_t i = 0; i < E * R * G; i++)
        scales[i] = (uint8_t)(100 + (rnd() >> 58));
    const bfs_ltensor t = mk_mx("parallel.T", blocks, scales, E, R, G, 1, 1);
    bfs_backend *b = make_backend(spec, budget, t.row_elems * 2);
    par_arg a[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (par_arg){b, &t, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, par_main, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].failed, 0);
    }
    b->destroy(b);
    free(blocks);
    free(scales);
}

static void test_concurrent_runs(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    run_parallel("cuda", 96 * 1024);
}

static void test_multi_gpu(void **state)
{
    (void)state;
    if (g_ndev < 2)
        skip();
    bfs_backend *b = make_backend("cuda:1,0", 8 * MiB, MiB);
    assert_string_equal(b->name, "cuda:1,0");
    b->destroy(b);
    run_parallel("cuda:0,1", 96 * 1024);

    /* units large enough to be split across the two devices */
    const size_t E = 5, R = 1024, G = 90, nblk = E * R * G;
    uint8_t *blocks, *scales;
    mx_random(nblk, &blocks, &scales);
    const bfs_ltensor t = mk_mx("split.T", blocks, scales, E, R, G, 1, 1);
    const bfs_ltensor tn = mk_mx("split", blocks, scales, E, R, G, 0, 1);
    b = make_backend("cuda:0,1", 16 * MiB, E * t.row_elems * 2);
    check_unit(b, &t, 0, E, NULL);
    check_unit(b, &t, 1, E, NULL);
    check_unit(b, &tn, 0, E, NULL);
#ifdef BFS_CUDA_EMULATE
    { /* a fault on one device's share: the caller gets its message */
        uint16_t *out = xmalloc(E * t.row_elems * 2);
        const bfs_unit u = {&t, 0, E, out};
        bfs__emu_fail_at(9);
        bfs__err_clear();
        assert_int_equal(b->run(b, &u), BFS_EDEVICE);
        assert_non_null(strstr(bfs_last_error(), "cudaErrorIllegalAddress"));
        assert_non_null(strstr(bfs_last_error(), "split.T"));
        bfs__emu_fail_at(0);
        free(out);
    }
#endif
    b->destroy(b);
    free(blocks);
    free(scales);
}

#ifdef BFS_HAVE_CUDA
/* Launches past grid y and z = 65535 (the launcher batches them), against the reference. */
static void test_grid_limits(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    struct { size_t E, R, G; } cases[] = {{65535 + 70, 1, 1}, {1, 1, 4 * 65535 + 9}};
    cudaStream_t s = NULL;
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    for (size_t ci = 0; ci < 2; ci++) {
        const size_t E = cases[ci].E, R = cases[ci].R, G = cases[ci].G, nblk = E * R * G, nout = nblk * 32;
        uint8_t *blocks = xmalloc(nblk * 16), *scales = xmalloc(nblk), *d_in = NULL;
        uint16_t *want = xmalloc(nout * 2), *got = xmalloc(nout * 2), *d_out = NULL;
        uint8_t *h = NULL;
        fill_random(blocks, nblk * 16);
        for (size_t i = 0; i < nblk; i++)
            scales[i] = (uint8_t)(110 + (rnd() >> 59));
        const size_t sc_off = (nblk * 16 + 255) / 256 * 256, in_bytes = sc_off + nblk;
        assert_int_equal(cudaMalloc((void **)&d_in, in_bytes), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&d_out, nout * 2), cudaSuccess);
        assert_int_equal(cudaHostAlloc((void **)&h, in_bytes > nout * 2 ? in_bytes : nout * 2, 0), cudaSuccess);
        memcpy(h, blocks, nblk * 16);
        memcpy(h + sc_off, scales, nblk);
        assert_int_equal(cudaMemcpyAsync(d_in, h, in_bytes, cudaMemcpyHostToDevice, s), cudaSuccess);
        bfs__err_clear();
        if (bfs__cu_mxfp4(d_in, d_in + sc_off, E, R, G, 1, d_out, s) != 0)
            fail_msg("launch E=%zu G=%zu: %s", E, G, bfs_last_error());
        assert_int_equal(cudaMemcpyAsync(h, d_out, nout * 2, cudaMemcpyDeviceToHost, s), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        memcpy(got, h, nout * 2);
        const bfs_ltensor t = mk_mx("grid", blocks, scales, E, R, G, 1, 1);
        ref_unit(&t, 0, E, want);
        compare(ci ? "grid y > 65535" : "grid z > 65535", got, want, nout);
        assert_int_equal(cudaFree(d_in), cudaSuccess);
        assert_int_equal(cudaFree(d_out), cudaSuccess);
        assert_int_equal(cudaFreeHost(h), cudaSuccess);
        free(blocks), free(scales), free(want), free(got);
    }
#ifdef BFS_CUDA_EMULATE
    /* and the fake enforces the limit a real launch has */
    assert_int_equal(bfs__emu_launch(s, 1, 65536, 1, 256, 0, 1, NULL, "", 1), cudaErrorInvalidConfiguration);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    assert_int_equal(bfs__emu_launch(s, 1, 1, 65536, 256, 0, 1, NULL, "", 1), cudaErrorInvalidConfiguration);
    (void)cudaGetLastError();
#endif
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
}

/* Two backends on one GPU at once (two bfshard processes): each gets its own buffers. */
static void *two_main(void *p)
{
    run_parallel("cuda:0", (uint64_t)(uintptr_t)p);
    return NULL;
}
static void test_two_backends_one_gpu(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, two_main, (void *)(uintptr_t)(64 * 1024)), 0);
    run_parallel("cuda:0", 200 * 1024);
    pthread_join(th, NULL);
}

/* Unit buffers from host_alloc (pinned): the D2H lands in place; same bytes. */
static void test_pinned_unit_buffers(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    const size_t E = 3, R = 300, G = 7, nblk = E * R * G;
    uint8_t *blocks = xmalloc(nblk * 16), *scales = xmalloc(nblk);
    fill_random(blocks, nblk * 16);
    for (size_t i = 0; i < nblk; i++)
        scales[i] = (uint8_t)(100 + (rnd() >> 58));
    for (int tr = 0; tr < 2; tr++) {
        const bfs_ltensor t = mk_mx(tr ? "pinned.T" : "pinned", blocks, scales, E, R, G, tr, 1);
        bfs_backend *b = make_backend("cuda", 64 * 1024, E * t.row_elems * 2);
        assert_non_null(b->host_alloc);
        uint16_t *out = b->host_alloc(b, E * t.row_elems * 2), *want = xmalloc(E * t.row_elems * 2);
        assert_non_null(out);
        ref_unit(&t, 0, E, want);
        const bfs_unit u = {&t, 0, E, out};
        assert_int_equal(b->run(b, &u), 0);
        compare("pinned unit buffer", out, want, E * t.row_elems);
        const bfs_unit u1 = {&t, 1, 2, out + 5}; /* inside the buffer, not at its start */
        memset(out, 0, E * t.row_elems * 2);
        assert_int_equal(b->run(b, &u1), 0);
        compare("pinned unit buffer, offset", out + 5, want + t.row_elems, t.row_elems);
        b->host_free(b, out);
        b->destroy(b);
        free(want);
    }
    free(blocks);
    free(scales);
}

/* An F32 tensor of n elements (a cast) over data (n * 4 bytes). */
static bfs_ltensor mk_cast_f32(const char *name, bfs_raw *raw, uint8_t *data, size_t n)
{
    memset(raw, 0, sizeof *raw);
    raw->data = data;
    raw->nbytes = n * 4;
    bfs_ltensor t;
    memset(&t, 0, sizeof t);
    t.name = (char *)name;
    t.kind = BFS_K_CAST;
    t.out_dtype = BFS_DT_BF16;
    t.src_dtype = BFS_DT_F32;
    t.ndim = 1;
    t.shape[0] = n;
    t.d0 = n;
    t.row_elems = 1;
    t.src[0] = raw;
    t.nsrc = 1;
    return t;
}

/* run_batch on units of every kind, mixed (NVFP4 with two global scales and bnb: their
 * constant tables change between units of one batch), into one buffer as convert's batches
 * are (pinned, and malloc'ed): the same bytes as the reference, under a tiny budget and the
 * default. */
static void test_run_batch_mixed(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    const size_t rows = 33, cols = 48, nn = rows * cols;
    uint8_t *p1 = xmalloc(nn / 2), *s1 = xmalloc(nn / 16), *p2 = xmalloc(nn / 2), *s2 = xmalloc(nn / 16);
    fill_random(p1, nn / 2);
    fill_random(s1, nn / 16);
    fill_random(p2, nn / 2);
    fill_random(s2, nn / 16);
    bfs_ltensor nv1 = mk_2d("batch.nvfp4.a", BFS_K_NVFP4, rows, cols), nv2 = mk_2d("batch.nvfp4.b", BFS_K_NVFP4, rows, cols);
    nv1.nv = (bfs_nvfp4_desc){.packed = p1, .scale = s1, .global_scale = 1536.0f, .modelopt = 0, .cols = cols};
    nv2.nv = (bfs_nvfp4_desc){.packed = p2, .scale = s2, .global_scale = 0.001f, .modelopt = 1, .cols = cols};
    const size_t fr = 37, fc = 96;
    uint8_t *w = xmalloc(fr * fc), *fs = mk_scales(fr, 1);
    fill_random(w, fr * fc);
    bfs_ltensor f8 = mk_2d("batch.fp8", BFS_K_FP8, fr, fc);
    f8.fp8 = (bfs_fp8_desc){.w = w, .scale = fs, .scale_type = 1, .cols = fc, .bh = 1, .bw = fc};
    uint8_t *blocks, *scales;
    mx_random(3 * 20 * 2, &blocks, &scales);
    const bfs_ltensor mx = mk_mx("batch.mx", blocks, scales, 3, 20, 2, 1, 1);
    const size_t cn = 3001;
    uint8_t *cd = xmalloc(cn * 4);
    fill_random(cd, cn * 4);
    bfs_raw craw;
    const bfs_ltensor ct = mk_cast_f32("batch.cast", &craw, cd, cn);
    const bfs_ltensor *order[] = {&nv1, &f8, &nv2, &mx, &ct, &nv1, &nv2};
    const size_t nu = sizeof order / sizeof *order;
    bfs_unit us[7];
    size_t total = 0;
    for (size_t i = 0; i < nu; i++)
        total += order[i]->d0 * order[i]->row_elems;
    uint16_t *want = xmalloc(total * 2);
    const uint64_t budgets[] = {0, 16 * 1024};
    for (size_t bi = 0; bi < 2; bi++) {
        bfs_backend *b = make_backend("cuda", budgets[bi], total * 2);
        for (int pinned = 0; pinned < 2; pinned++) {
            uint16_t *out = pinned ? b->host_alloc(b, total * 2) : xmalloc(total * 2);
            memset(out, 0x5A, total * 2);
            size_t off = 0;
            for (size_t i = 0; i < nu; i++) {
                const uint64_t r0 = i == 5 ? 1 : 0; /* one unit not from row 0 */
                us[i] = (bfs_unit){order[i], r0, order[i]->d0, out + off};
                ref_unit(order[i], r0, order[i]->d0, want + off);
                off += (order[i]->d0 - r0) * order[i]->row_elems;
            }
            bfs__err_clear();
            if (b->run_batch(b, us, (int)nu) != 0)
                fail_msg("run_batch: %s", bfs_last_error());
            compare(pinned ? "mixed batch, pinned" : "mixed batch", out, want, off);
            if (pinned)
                b->host_free(b, out);
            else
                free(out);
        }
        b->destroy(b);
    }
    free(want);
    free(cd);
    free(blocks);
    free(scales);
    free(w);
    free(fs);
    free(p1);
    free(s1);
    free(p2);
    free(s2);
}
#endif /* BFS_HAVE_CUDA */

#ifdef BFS_CUDA_EMULATE
/* A fault in the middle of a unit: BFS_EDEVICE naming the tensor and saying the context is
 * lost; later runs on that device fail at once; the backend still destroys. */
static void test_injected_fault(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    const size_t E = 4, R = 64, G = 4;
    uint8_t *blocks, *scales;
    mx_random(E * R * G, &blocks, &scales);
    const bfs_ltensor t = mk_mx("fault.T", blocks, scales, E, R, G, 1, 1);
    uint16_t *out = xmalloc(E * t.row_elems * 2);
    for (long at = 1; at <= 7; at += 3) {
        bfs_backend *b = make_backend("cuda", 64 * 1024, E * t.row_elems * 2);
        bfs__emu_fail_at(at);
        const bfs_unit u = {&t, 0, E, out};
        bfs__err_clear();
        assert_int_equal(b->run(b, &u), BFS_EDEVICE);
        const char *m = bfs_last_error();
        if (!strstr(m, "cudaErrorIllegalAddress") || !strstr(m, "tensor fault.T") || !strstr(m, "context") ||
            !strstr(m, "--device cpu") || !strstr(m, "chunk"))
            fail_msg("fault at op %ld: message: %s", at, m);
        if (at == 1)
            printf("  %s\n", m);
        bfs__err_clear();
        assert_int_equal(b->run(b, &u), BFS_EDEVICE); /* sticky: at once, with the cause */
        if (!strstr(bfs_last_error(), "lost by an earlier fault") || !strstr(bfs_last_error(), "fault.T"))
            fail_msg("second run: %s", bfs_last_error());
        b->destroy(b);
        bfs__emu_fail_at(0);
    }
    /* in a batch (its units one pipeline): the same error, naming a tensor of the batch; the
     * pinned buffer is not written after run_batch returns */
    for (long at = 2; at <= 12; at += 5) { /* 4 chunks: 12 copies and kernels */
        bfs_backend *b = make_backend("cuda:0", 64 * 1024, E * t.row_elems * 2);
        uint16_t *pin = b->host_alloc(b, E * t.row_elems * 2);
        const bfs_unit us[3] = {{&t, 0, 1, pin}, {&t, 1, 3, pin + t.row_elems}, {&t, 3, 4, pin + 3 * t.row_elems}};
        bfs__emu_fail_at(at);
        bfs__err_clear();
        assert_int_equal(b->run_batch(b, us, 3), BFS_EDEVICE);
        const char *m = bfs_last_error();
        if (!strstr(m, "cudaErrorIllegalAddress") || !strstr(m, "tensor fault.T") || !strstr(m, "context"))
            fail_msg("batch, fault at op %ld: message: %s", at, m);
        memset(pin, 0x33, E * t.row_elems * 2);
        usleep(2000);
        for (size_t i = 0; i < E * t.row_elems; i++)
            assert_int_equal(pin[i], 0x3333);
        b->host_free(b, pin);
        b->destroy(b);
        bfs__emu_fail_at(0);
    }
    free(out);
    free(blocks);
    free(scales);
}

static void *dev1_main(void *p)
{
    (void)p;
    const size_t E = 3, R = 100, G = 5;
    uint8_t *blocks, *scales;
    mx_random(E * R * G, &blocks, &scales);
    const bfs_ltensor t = mk_mx("dev1.T", blocks, scales, E, R, G, 1, 1);
    bfs_backend *b = make_backend("cuda:1", 64 * 1024, E * t.row_elems * 2);
    check_unit(b, &t, 0, E, NULL);
    b->destroy(b);
    b = make_backend("cuda:1,2", 4 * MiB, E * t.row_elems * 2);
    check_unit(b, &t, 0, E, NULL);
    b->destroy(b);
    free(blocks);
    free(scales);
    return NULL;
}

/* cuda:N with N > 0 from a fresh thread (and the multi-GPU part threads): no context is
 * ever created on device 0, and a busy GPU 0 does not fail cuda:1. */
static void test_no_context_on_gpu0(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    bfs__emu_set("devices", 0, 3);
    for (int busy = 0; busy < 2; busy++) {
        bfs__emu_set("reset", 0, 0);
        bfs__emu_set("busy", 0, busy); /* GPU 0 in exclusive mode, taken by someone else */
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, dev1_main, NULL), 0);
        pthread_join(th, NULL);
        dev1_main(NULL); /* and on this thread, whose current device is 0 */
        printf("  busy GPU 0: %d; contexts created on GPU 0, 1, 2: %lld %lld %lld\n", busy,
               bfs__emu_get("contexts", 0), bfs__emu_get("contexts", 1), bfs__emu_get("contexts", 2));
        assert_int_equal(bfs__emu_get("contexts", 0), 0);
        assert_int_equal(bfs__emu_get("contexts", 1), 1);
    }
    /* GPU 0 busy, "cuda" alone: the message says so */
    bfs_backend *b = NULL;
    bfs__err_clear();
    assert_int_equal(bfs__backend_cuda_create("cuda:0", 64 * 1024, MiB, &b), BFS_EDEVICE);
    assert_non_null(strstr(bfs_last_error(), "busy or unavailable"));
    printf("  %s\n", bfs_last_error());
    /* a fault on one device leaves the other usable (sticky errors are per device) */
    bfs__emu_set("busy", 0, 0);
    {
        const size_t E = 2, R = 64, G = 4;
        uint8_t *blocks = xmalloc(E * R * G * 16), *scales = xmalloc(E * R * G);
        fill_random(blocks, E * R * G * 16);
        fill_random(scales, E * R * G);
        const bfs_ltensor t = mk_mx("perdev.T", blocks, scales, E, R, G, 1, 1);
        uint16_t *out = xmalloc(E * t.row_elems * 2);
        bfs_backend *b0 = make_backend("cuda:0", 64 * 1024, E * t.row_elems * 2);
        bfs_backend *b1 = make_backend("cuda:1", 64 * 1024, E * t.row_elems * 2);
        bfs__emu_fail_at(2);
        const bfs_unit u = {&t, 0, E, out};
        assert_int_equal(b0->run(b0, &u), BFS_EDEVICE);
        check_unit(b1, &t, 0, E, NULL);
        b0->destroy(b0);
        b1->destroy(b1);
        bfs__emu_fail_at(0);
        free(out), free(blocks), free(scales);
    }
    bfs__emu_set("reset", 0, 0);
    bfs__emu_set("devices", 0, g_ndev);
}

/* The driver: none, or too old for this build; the reason is said, and --device auto gets it. */
static void test_driver_messages(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    char why[512];
    bfs_backend *b = NULL;
    bfs__emu_set("driver", 0, 0);
    assert_int_equal(bfs__cuda_probe(why, sizeof why), 0);
    assert_non_null(strstr(why, "no NVIDIA driver"));
    bfs__err_clear();
    assert_int_equal(bfs__backend_cuda_create("cuda", 64 * 1024, MiB, &b), BFS_EDEVICE);
    assert_non_null(strstr(bfs_last_error(), "no NVIDIA driver"));
    printf("  %s\n", bfs_last_error());
    bfs__emu_set("driver", 0, 12040);
    assert_int_equal(bfs__cuda_probe(why, sizeof why), 0);
    bfs__err_clear();
    assert_int_equal(bfs__backend_cuda_create("cuda:0", 64 * 1024, MiB, &b), BFS_EDEVICE);
    char want[128];
    snprintf(want, sizeof want, "driver supports CUDA 12.4, this build needs CUDA %d.%d", CUDART_VERSION / 1000,
             CUDART_VERSION % 1000 / 10);
    if (!strstr(why, want) || !strstr(bfs_last_error(), want))
        fail_msg("want '%s' in: %s / %s", want, why, bfs_last_error());
    printf("  %s\n", bfs_last_error());
    bfs__emu_set("driver", 0, CUDART_VERSION);
    /* compute capability: 7.5 (T4) runs, 7.0 is refused with the reason */
    bfs__emu_set("cc", 0, 75);
    b = make_backend("cuda", 64 * 1024, MiB);
    b->destroy(b);
    bfs__emu_set("cc", 0, 70);
    assert_int_equal(bfs__cuda_probe(why, sizeof why), 0);
    assert_non_null(strstr(why, "7.5 or newer (found 7.0)"));
    bfs__err_clear();
    assert_int_equal(bfs__backend_cuda_create("cuda:0", 64 * 1024, MiB, &b), BFS_EDEVICE);
    bfs__emu_set("cc", 0, 90);
}

/* A device whose kernels flush subnormals (a build with -ftz=true): refused at creation. */
static void test_selftest_refuses_ftz(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    bfs_backend *b = NULL;
    bfs__emu_set("ftz", 0, 1);
    bfs__err_clear();
    const int rc = bfs__backend_cuda_create("cuda", 64 * 1024, MiB, &b);
    bfs__emu_set("ftz", 0, 0);
    assert_int_equal(rc, BFS_EDEVICE);
    assert_null(b);
    if (!strstr(bfs_last_error(), "self-test failed") || !strstr(bfs_last_error(), "0x0020"))
        fail_msg("self-test message: %s", bfs_last_error());
    printf("  %s\n", bfs_last_error());
    b = make_backend("cuda", 64 * 1024, MiB);
    b->destroy(b);
}

/* A GPU another process has nearly filled: a clear ENOMEM that names free memory. */
static void test_full_gpu(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    bfs_backend *b = NULL;
    size_t f = 0, tot = 0;
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaMemGetInfo(&f, &tot), cudaSuccess);
    bfs__emu_set("steal", 0, (long long)(f - 8 * MiB));
    bfs__err_clear();
    assert_int_equal(bfs__backend_cuda_create("cuda", 64 * MiB, 64 * MiB, &b), BFS_ENOMEM);
    assert_null(b);
    assert_non_null(strstr(bfs_last_error(), "free memory"));
    printf("  %s\n", bfs_last_error());
    b = make_backend("cuda", 4 * MiB, 64 * MiB); /* a budget that fits runs */
    b->destroy(b);
    bfs__emu_set("steal", 0, 0);
}

/* The fake runs threads between two barriers in a shuffled order: a kernel that reads what
 * another thread wrote without a barrier between gives wrong output there. */
typedef struct race_arg {
    uint32_t *out;
} race_arg;
static void race_phase(const void *a, void *smem, const bfs_cu_idx *ix, int ph, int barrier)
{
    uint32_t *s = smem;
    const race_arg *r = a;
    if (ph == 0)
        s[ix->tid] = ix->tid + 1;
    if (ph == (barrier ? 1 : 0))
        r->out[ix->bx * ix->nt + ix->tid] = s[(ix->tid + 1) % ix->nt];
}
static void race_1(const void *a, void *s, const bfs_cu_idx *ix, int ph) { race_phase(a, s, ix, ph, 0); }
static void race_2(const void *a, void *s, const bfs_cu_idx *ix, int ph) { race_phase(a, s, ix, ph, 1); }

static void test_emu_catches_races(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    cudaStream_t s = NULL;
    uint32_t *d = NULL;
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&d, 4 * 256 * 4), cudaSuccess);
    for (int barrier = 0; barrier < 2; barrier++) {
        const race_arg a = {d};
        assert_int_equal(bfs__emu_launch(s, 4, 1, 1, 256, 1024, barrier ? 2 : 1, barrier ? race_2 : race_1, &a,
                                         sizeof a), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        int wrong = 0;
        for (unsigned i = 0; i < 4 * 256; i++)
            wrong += d[i] != (i % 256 + 1) % 256 + 1;
        printf("  %s: %d of 1024 values wrong\n", barrier ? "with the barrier" : "without it", wrong);
        if (barrier)
            assert_int_equal(wrong, 0);
        else
            assert_true(wrong > 0);
    }
    assert_int_equal(cudaFree(d), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
}

/* ---- the pipeline's stages overlap (the emulator's operation log) ----------------------------- */
/* the log's codes (dev/cuda/emu/fake_cudart.c) */
enum { L_ENQ = 1, L_START, L_END, L_HOST_WAIT, L_HOST_DONE };
enum { L_H2D = 1, L_D2H, L_D2D, L_KERNEL };
enum { L_T, L_WHAT, L_KIND, L_WHO, L_ID, L_BYTES };
#define MAXOPS 256
typedef struct oplog {
    int n[5];                       /* per kind: operations, in the order they were enqueued */
    long id[5][MAXOPS];
    long long enq[5][MAXOPS], start[5][MAXOPS], end[5][MAXOPS];
} oplog;

static void read_log(oplog *L)
{
    memset(L, 0, sizeof *L);
    const long n = (long)bfs__emu_log(-1, 0);
    for (long i = 0; i < n; i++) {
        const int what = (int)bfs__emu_log(i, L_WHAT), kind = (int)bfs__emu_log(i, L_KIND);
        if (kind < L_H2D || kind > L_KERNEL || kind == L_D2D)
            continue;
        const long id = (long)bfs__emu_log(i, L_ID);
        const long long t = bfs__emu_log(i, L_T);
        if (what == L_ENQ) {
            assert_true(L->n[kind] < MAXOPS);
            L->id[kind][L->n[kind]] = id;
            L->enq[kind][L->n[kind]++] = t;
            continue;
        }
        for (int k = L->n[kind] - 1; k >= 0; k--)
            if (L->id[kind][k] == id) {
                if (what == L_START)
                    L->start[kind][k] = t;
                else if (what == L_END)
                    L->end[kind][k] = t;
                break;
            }
    }
}

/* Chunk c's H2D, kernel, D2H (no table uploads: casts): each stage after the one before
 * (the events), and the next chunk's H2D enqueued and run while this chunk's kernel runs. */
static void assert_overlap(const oplog *L, const char *what)
{
    const int n = L->n[L_KERNEL];
    assert_int_equal(L->n[L_H2D], n);
    assert_int_equal(L->n[L_D2H], n);
    for (int c = 0; c < n; c++) {
        assert_true(L->start[L_KERNEL][c] >= L->end[L_H2D][c]);
        assert_true(L->start[L_D2H][c] >= L->end[L_KERNEL][c]);
        if (c + 1 < n) {
            if (!(L->enq[L_H2D][c + 1] < L->end[L_KERNEL][c] && L->start[L_H2D][c + 1] < L->end[L_KERNEL][c]))
                fail_msg("%s: the H2D of chunk %d (enqueued at +%lld us, ran at +%lld us) did not overlap the "
                         "kernel of chunk %d (ran +%lld..+%lld us)", what, c + 1,
                         (L->enq[L_H2D][c + 1] - L->enq[L_H2D][0]) / 1000,
                         (L->start[L_H2D][c + 1] - L->enq[L_H2D][0]) / 1000, c,
                         (L->start[L_KERNEL][c] - L->enq[L_H2D][0]) / 1000,
                         (L->end[L_KERNEL][c] - L->enq[L_H2D][0]) / 1000);
            /* ... and the chunk before's D2H still overlaps the next kernel's slot: only two in flight */
            assert_true(c < 1 || L->start[L_KERNEL][c + 1] >= L->end[L_D2H][c - 1]);
        }
    }
    printf("  %s: %d chunks, each next H2D ran during the kernel before\n", what, n);
}

/* One unit of many chunks on a slow "device" (every kernel 20 ms): chunk c+1's input is
 * gathered and its H2D runs while chunk c's kernel runs, into a malloc'ed buffer (drained
 * from the staging) and into a pinned one (the D2H in place); same bytes as the reference. */
static void test_pipeline_overlaps(void **state)
{
    (void)state;
    if (g_ndev == 0)
        skip();
    const size_t n = 40000;
    uint8_t *data = xmalloc(n * 4);
    fill_random(data, n * 4);
    bfs_raw raw;
    const bfs_ltensor t = mk_cast_f32("overlap.f32", &raw, data, n);
    uint16_t *want = xmalloc(n * 2);
    ref_unit(&t, 0, n, want);
    bfs_backend *b = make_backend("cuda:0", 64 * 1024, n * 2);
    oplog *L = xmalloc(sizeof *L);
    for (int pinned = 0; pinned < 2; pinned++) {
        uint16_t *out = pinned ? b->host_alloc(b, n * 2) : xmalloc(n * 2);
        assert_non_null(out);
        memset(out, 0x5A, n * 2);
        bfs__emu_set("kernel_us", 0, 20000);
        bfs__emu_set("log", 0, 1);
        const bfs_unit u = {&t, 0, n, out};
        assert_int_equal(b->run(b, &u), 0);
        bfs__emu_set("log", 0, 0);
        bfs__emu_set("kernel_us", 0, 0);
        compare("overlap", out, want, n);
        read_log(L);
        assert_true(L->n[L_KERNEL] >= 4);
        assert_overlap(L, pinned ? "one unit, pinned buffer" : "one unit, malloc'ed buffer");
        /* in place, nothing is drained: chunk c+1 is gathered and enqueued as soon as chunk c-1's
         * H2D has read the staging, before chunk c-1's output is even down */
        for (int c = 1; pinned && c + 1 < L->n[L_KERNEL]; c++)
            assert_true(L->enq[L_H2D][c + 1] < L->end[L_D2H][c - 1]);
        if (pinned)
            b->host_free(b, out);
        else
            free(out);
    }
    /* a batch of units of one chunk each (over half a slot: not two in one): one after the
     * other with no pause, the next unit's H2D during the unit before's kernel */
    const size_t m = 3000, nu = 6;
    uint16_t *bout = b->host_alloc(b, nu * m * 2), *bwant = xmalloc(nu * m * 2);
    bfs_ltensor ts[6];
    bfs_raw raws[6];
    bfs_unit us[6];
    for (size_t i = 0; i < nu; i++) {
        ts[i] = mk_cast_f32("overlap.batch", &raws[i], data + i * m * 4, m);
        us[i] = (bfs_unit){&ts[i], 0, m, bout + i * m};
        ref_unit(&ts[i], 0, m, bwant + i * m);
    }
    assert_non_null(b->run_batch);
    bfs__emu_set("kernel_us", 0, 20000);
    bfs__emu_set("log", 0, 1);
    assert_int_equal(b->run_batch(b, us, (int)nu), 0);
    bfs__emu_set("log", 0, 0);
    bfs__emu_set("kernel_us", 0, 0);
    compare("batch", bout, bwant, nu * m);
    read_log(L);
    assert_int_equal(L->n[L_KERNEL], (int)nu);
    assert_overlap(L, "a batch of 6 units");
    /* the control: the same units through run() one by one do not overlap (each run()
     * returns once its unit is down), so the check above can fail */
    bfs__emu_set("kernel_us", 0, 20000);
    bfs__emu_set("log", 0, 1);
    for (size_t i = 0; i < nu; i++)
        assert_int_equal(b->run(b, &us[i]), 0);
    bfs__emu_set("log", 0, 0);
    bfs__emu_set("kernel_us", 0, 0);
    read_log(L);
    assert_int_equal(L->n[L_KERNEL], (int)nu);
    for (size_t i = 0; i + 1 < nu; i++)
        assert_true(L->start[L_H2D][i + 1] > L->end[L_D2H][i]);
    /* tiny units (convert's batches of norms and biases) share a slot: 20 units of 100
     * elements, at most 16 a slot: 2 H2D, 20 kernels, 2 D2H; the same bytes */
    const size_t tn = 100, tu = 20;
    bfs_ltensor tt[20];
    bfs_raw traw[20];
    bfs_unit tus[20];
    for (size_t i = 0; i < tu; i++) {
        tt[i] = mk_cast_f32("overlap.tiny", &traw[i], data + i * tn * 4, tn);
        tus[i] = (bfs_unit){&tt[i], 0, tn, bout + i * tn};
        ref_unit(&tt[i], 0, tn, bwant + i * tn);
    }
    bfs__emu_set("log", 0, 1);
    assert_int_equal(b->run_batch(b, tus, (int)tu), 0);
    bfs__emu_set("log", 0, 0);
    compare("tiny batch", bout, bwant, tu * tn);
    read_log(L);
    printf("  20 tiny units: %d H2D, %d kernels, %d D2H\n", L->n[L_H2D], L->n[L_KERNEL], L->n[L_D2H]);
    assert_int_equal(L->n[L_KERNEL], (int)tu);
    assert_int_equal(L->n[L_H2D], 2);
    assert_int_equal(L->n[L_D2H], 2);
    b->host_free(b, bout);
    b->destroy(b);
    free(L);
    free(bwant);
    free(want);
    free(data);
}

#endif

int main(void)
{
    g_ndev = bfs__cuda_device_count();
    printf("test_cuda: CUDA built: %s, usable devices: %d%s\n", bfs__cuda_built() ? "yes" : "no", g_ndev,
#ifdef BFS_CUDA_EMULATE
           " (fake runtime: kernels emulated on the host)"
#else
           ""
#endif
    );
    if (g_ndev == 0)
        printf("SKIP: no CUDA device: only the no-device checks run\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_device),
        cmocka_unit_test(test_reference_spot_values),
        cmocka_unit_test(test_spec_errors),
        cmocka_unit_test(test_mxfp4_all_codes),
        cmocka_unit_test(test_bnb4),
        cmocka_unit_test(test_casts),
        cmocka_unit_test(test_fp8),
        cmocka_unit_test(test_int4),
        cmocka_unit_test(test_woq),
        cmocka_unit_test(test_nvfp4),
        cmocka_unit_test(test_nvfp4_conventions_differ),
        cmocka_unit_test(test_ctmx),
        cmocka_unit_test(test_fp8_multi_gpu),
        cmocka_unit_test(test_passthrough),
        cmocka_unit_test(test_budget_errors),
        cmocka_unit_test(test_concurrent_runs),
        cmocka_unit_test(test_multi_gpu),
#ifdef BFS_HAVE_CUDA
        cmocka_unit_test(test_memory_bound),
        cmocka_unit_test(test_grid_limits),
        cmocka_unit_test(test_two_backends_one_gpu),
        cmocka_unit_test(test_pinned_unit_buffers),
        cmocka_unit_test(test_run_batch_mixed),
#endif
#ifdef BFS_CUDA_EMULATE
        cmocka_unit_test(test_injected_fault),
        cmocka_unit_test(test_no_context_on_gpu0),
        cmocka_unit_test(test_driver_messages),
        cmocka_unit_test(test_selftest_refuses_ftz),
        cmocka_unit_test(test_full_gpu),
        cmocka_unit_test(test_pipeline_overlaps),
        cmocka_unit_test(test_emu_catches_races),
#endif
        cmocka_unit_test(test_mxfp4_gptoss_layer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
