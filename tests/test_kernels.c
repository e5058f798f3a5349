/*
 * CPU dequant kernels (kernels/): the scalar reference against values derived
 * by hand from shared/FORMATS.md, then every SIMD level this CPU runs against
 * the scalar reference, byte for byte (memcmp), with guard zones around every
 * output; then the CPU backend at every level x every op (MXFP4 both layouts and
 * 3-d, bnb plain and double quant, every cast, passthrough) against the unit-level
 * reference bfs__ref_unit, as tests/test_cuda.c holds the CUDA backend to it.
 * A level the CPU cannot run is reported and skipped, never passed.
 *
 * Optional, for CPUs without AVX-512: the logic of kernels/cpu_avx512.c run
 * through SIMDe's emulation of the intrinsics (Debian package libsimde-dev):
 *   F="-std=c11 -O2 -ffp-contract=off -fno-fast-math -D_GNU_SOURCE -Iinclude -pthread"
 *   gcc $F -Wno-psabi -mavx2 -mf16c -mbmi2 -DBFS_AVX512_SIMDE -c kernels/cpu_avx512.c \
 *       -o build/avx512_emu.o
 *   gcc $F -Isrc -DBFS_TEST_AVX512_EMU -o build/tests/test_kernels_emu tests/test_kernels.c \
 *       tests/testutil.c build/avx512_emu.o build/libbfshard.a -lcmocka -lm
 *   build/tests/test_kernels_emu      (adds the tests named .../avx512-simde)
 */
#include "testutil.h"

#include "bfs_internal.h"
#include "../kernels/ref.h"
#include "../kernels/ref_formats.h"
#include "../kernels/ref_woq.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------ */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void) /* xorshift64* */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

static size_t rnd_below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static void rnd_fill(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(rnd() >> 56);
}

static float f32_of(uint32_t u) { return bfs_bits_f32(u); }

static double f64_of(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* Output buffers with guard zones on both sides, so overruns are caught. */
enum { GUARD = 64 }; /* words: with shift 0 the output is 64-byte aligned */
static const uint16_t GUARD_WORD = 0xA55A;

typedef struct outbuf {
    uint16_t *base;
    uint16_t *p; /* base + GUARD + shift */
    size_t n, shift;
} outbuf;

static outbuf out_new(size_t n, size_t shift)
{
    const size_t bytes = (n + 2 * GUARD + shift) * sizeof(uint16_t);
    outbuf o = {aligned_alloc(64, (bytes + 63) / 64 * 64), NULL, n, shift};
    assert_non_null(o.base);
    for (size_t i = 0; i < n + 2 * GUARD + shift; i++)
        o.base[i] = GUARD_WORD;
    o.p = o.base + GUARD + shift;
    return o;
}

static void out_check(const outbuf *o, const char *what)
{
    for (size_t i = 0; i < GUARD + o->shift; i++)
        if (o->base[i] != GUARD_WORD)
            fail_msg("%s: write before the output (word %zd)", what,
                     (ptrdiff_t)i - (ptrdiff_t)(GUARD + o->shift));
    for (size_t i = 0; i < GUARD; i++)
        if (o->p[o->n + i] != GUARD_WORD)
            fail_msg("%s: write past the output end (word n+%zu)", what, i);
}

static void out_free(outbuf *o)
{
    free(o->base);
    o->base = o->p = NULL;
}

/* memcmp, and on a difference the first few elements that differ. */
static void expect_same(const uint16_t *want, const uint16_t *got, size_t n, const char *what)
{
    if (n == 0 || memcmp(want, got, n * sizeof *want) == 0)
        return;
    size_t shown = 0, bad = 0;
    for (size_t i = 0; i < n; i++)
        if (want[i] != got[i]) {
            if (shown++ < 8)
                print_error("  %s: element %zu: want 0x%04x, got 0x%04x\n", what, i, want[i],
                            got[i]);
            bad++;
        }
    fail_msg("%s: %zu of %zu elements differ", what, bad, n);
}

static const bfs_kernel_ops *ref_ops(void)
{
    const bfs_kernel_ops *k = bfs_kernels_cpu(BFS_CPU_SCALAR);
    assert_non_null(k);
    return k;
}

static const char *const level_names[BFS_CPU_NLEVELS] = {"scalar", "avx2", "avx512"};

#if defined(BFS_TEST_AVX512_EMU)
extern const bfs_kernel_ops bfs__cpu_avx512_emu_ops;
#endif
enum { LEVEL_AVX512_EMU = BFS_CPU_NLEVELS }; /* state value: kernels/cpu_avx512.c on SIMDe */

/* The ops of the level in *state, or skip() with the reason printed. */
static const bfs_kernel_ops *level_ops(void **state)
{
    int level = *(const int *)*state;
    const bfs_kernel_ops *k = NULL;
#if defined(BFS_TEST_AVX512_EMU)
    if (level == LEVEL_AVX512_EMU) {
        k = &bfs__cpu_avx512_emu_ops;
        level = BFS_CPU_AVX512;
    }
#endif
    if (!k)
        k = bfs_kernels_cpu(level);
    if (!k) {
        print_message("[  SKIPPED ] level %s: this CPU does not support it; its kernels "
                      "were compiled but NOT run (the top of this file says how to run\n"
                      "             their logic under SIMDe emulation)\n",
                      level_names[level]);
        skip();
    }
    assert_int_equal(k->level, level);
    assert_string_equal(k->name, level_names[level]);
    return k;
}

static const float NF4[16] = BFS_NF4_TABLE_INIT;
static const float FP4[16] = BFS_FP4_TABLE_INIT;

/* ---- the scalar reference against hand-derived values -------------------------- */

static void test_ref_bf16_rounding(void **state)
{
    (void)state;
    static const uint32_t cases[][2] = {
        {0x3F800000, 0x3F80}, /* 1.0 */
        {0x3F808000, 0x3F80}, /* tie, even stays */
        {0x3F818000, 0x3F82}, /* tie, odd goes up */
        {0x3F808001, 0x3F81}, /* above the tie */
        {0x3F807FFF, 0x3F80}, /* below the tie */
        {0xBF818000, 0xBF82}, /* negative tie */
        {0x80000000, 0x8000}, /* -0 */
        {0x00000001, 0x0000}, /* smallest subnormal */
        {0x00008000, 0x0000}, /* subnormal tie to even 0 */
        {0x00018000, 0x0002}, /* subnormal tie to even 2 */
        {0x007FFFFF, 0x0080}, /* largest subnormal rounds to the smallest normal */
        {0x7F7FFFFF, 0x7F80}, /* max finite rounds up to +inf */
        {0x7F7F7FFF, 0x7F7F}, /* stays finite */
        {0x7F7F8000, 0x7F80}, /* tie, odd: up to +inf */
        {0xFF7F8000, 0xFF80}, /* to -inf */
        {0x7F800000, 0x7F80}, /* +inf */
        {0xFF800000, 0xFF80}, /* -inf */
        {0x7FC00000, 0x7FC0}, /* NaN */
        {0xFFC00000, 0x7FC0}, /* negative NaN */
        {0x7F800001, 0x7FC0}, /* signalling NaN, low payload */
        {0xFFFFFFFF, 0x7FC0}, /* all ones */
        {0x7FBFFFFF, 0x7FC0}, /* signalling NaN, would round into inf's neighbour */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint16_t got = bfs_bf16_from_f32(f32_of(cases[i][0]));
        if (got != cases[i][1])
            fail_msg("bf16(0x%08x): want 0x%04x, got 0x%04x", cases[i][0], cases[i][1], got);
    }
}

static void test_ref_e8m0_e2m1(void **state)
{
    (void)state;
    assert_int_equal(bfs_f32_bits(bfs_e8m0_to_f32(0)), 0x00400000); /* 2^-127, subnormal */
    assert_int_equal(bfs_f32_bits(bfs_e8m0_to_f32(1)), 0x00800000); /* 2^-126 */
    assert_int_equal(bfs_f32_bits(bfs_e8m0_to_f32(127)), 0x3F800000);
    assert_int_equal(bfs_f32_bits(bfs_e8m0_to_f32(254)), 0x7F000000); /* 2^127 */
    assert_int_equal(bfs_f32_bits(bfs_e8m0_to_f32(255)), 0x7F800000); /* 2^128 as +inf */
    static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (unsigned c = 0; c < 16; c++)
        assert_int_equal(bfs_f32_bits(bfs_e2m1_to_f32(c)), bfs_f32_bits(e2m1[c]));
    assert_int_equal(bfs_f32_bits(bfs_e2m1_to_f32(8)), 0x80000000); /* -0 */

    const float one = bfs_e8m0_to_f32(127), inf = bfs_e8m0_to_f32(255), tiny = bfs_e8m0_to_f32(0);
    static const uint16_t at_one[16] = {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040,
                                        0x4080, 0x40C0, 0x8000, 0xBF00, 0xBF80, 0xBFC0,
                                        0xC000, 0xC040, 0xC080, 0xC0C0};
    for (unsigned c = 0; c < 16; c++)
        assert_int_equal(bfs_mxfp4_value(c, one), at_one[c]);
    /* s=255 is 2^128 (true ldexp, as transformers 5 does): no NaN, and 0.5 * 2^128 is finite */
    assert_int_equal(bfs_f32_bits(inf), 0x7F800000);
    assert_int_equal(bfs_mxfp4_value(0, inf), 0x0000);
    assert_int_equal(bfs_mxfp4_value(8, inf), 0x8000);
    assert_int_equal(bfs_mxfp4_value(1, inf), 0x7F00); /* 2^127 */
    assert_int_equal(bfs_mxfp4_value(9, inf), 0xFF00);
    assert_int_equal(bfs_mxfp4_value(2, inf), 0x7F80); /* 2^128 overflows */
    assert_int_equal(bfs_mxfp4_value(15, inf), 0xFF80);
    assert_int_equal(bfs_mxfp4_value(7, bfs_e8m0_to_f32(254)), 0x7F80); /* 6*2^127 -> inf */
    assert_int_equal(bfs_mxfp4_value(15, bfs_e8m0_to_f32(254)), 0xFF80);
    assert_int_equal(bfs_mxfp4_value(3, bfs_e8m0_to_f32(254)), 0x7F40); /* 1.5*2^127 finite */
    assert_int_equal(bfs_mxfp4_value(4, bfs_e8m0_to_f32(254)), 0x7F80); /* 2*2^127 = 2^128 */
    assert_int_equal(bfs_mxfp4_value(1, tiny), 0x0020);  /* 2^-128: f32 0x00200000 */
    assert_int_equal(bfs_mxfp4_value(3, tiny), 0x0060);  /* 1.5*2^-127: 0x00600000 */
    assert_int_equal(bfs_mxfp4_value(7, tiny), 0x0140);  /* 6*2^-127 = 1.5*2^-125, normal */
    assert_int_equal(bfs_mxfp4_value(9, tiny), 0x8020);
    assert_int_equal(bfs_mxfp4_value(1, bfs_e8m0_to_f32(1)), 0x0040); /* 2^-127 */
}

static void test_ref_bnb_tables(void **state)
{
    (void)state;
    static const uint32_t nf4_bits[16] = {
        0xbf800000, 0xbf3239b1, 0xbf066b30, 0xbeca32a0, 0xbe91a24d, 0xbe3d353f,
        0xbdba7871, 0x00000000, 0x3da2faff, 0x3e24cae3, 0x3e7c04dd, 0x3ead033a,
        0x3ee1a4b8, 0x3f1007ab, 0x3f3913b3, 0x3f800000};
    static const uint16_t nf4_bf16[16] = {0xbf80, 0xbf32, 0xbf06, 0xbeca, 0xbe92, 0xbe3d,
                                          0xbdba, 0x0000, 0x3da3, 0x3e25, 0x3e7c, 0x3ead,
                                          0x3ee2, 0x3f10, 0x3f39, 0x3f80};
    static const uint32_t fp4_bits[16] = {
        0x00000000, 0x3baaaaab, 0x3f2aaaab, 0x3f800000, 0x3eaaaaab, 0x3f000000,
        0x3e2aaaab, 0x3e800000, 0x80000000, 0xbbaaaaab, 0xbf2aaaab, 0xbf800000,
        0xbeaaaaab, 0xbf000000, 0xbe2aaaab, 0xbe800000};
    static const uint16_t fp4_bf16[16] = {0x0000, 0x3bab, 0x3f2b, 0x3f80, 0x3eab, 0x3f00,
                                          0x3e2b, 0x3e80, 0x8000, 0xbbab, 0xbf2b, 0xbf80,
                                          0xbeab, 0xbf00, 0xbe2b, 0xbe80};
    for (int c = 0; c < 16; c++) {
        assert_int_equal(bfs_f32_bits(NF4[c]), nf4_bits[c]);
        assert_int_equal(bfs_f32_bits(FP4[c]), fp4_bits[c]);
        assert_int_equal(bfs_bnb4_value(NF4[c], 1.0f), nf4_bf16[c]);
        assert_int_equal(bfs_bnb4_value(FP4[c], 1.0f), fp4_bf16[c]);
    }
    assert_int_equal(bfs_bnb4_value(FP4[8], 3.0f), 0x8000); /* -0 * 3 = -0 */
    assert_int_equal(bfs_bnb4_value(NF4[7], INFINITY), 0x7FC0); /* 0 * inf */
    assert_int_equal(bfs_bnb4_value(NF4[15], -2.0f), 0xC000);
    /* element 2k = high nibble of byte k */
    static const uint8_t codes[2] = {0x7F, 0x18};
    assert_int_equal(bfs_bnb4_code(codes, 0), 7);
    assert_int_equal(bfs_bnb4_code(codes, 1), 15);
    assert_int_equal(bfs_bnb4_code(codes, 2), 1);
    assert_int_equal(bfs_bnb4_code(codes, 3), 8);
}

/* Cases where fma(a, b, c) differs from the two roundings of a*b+c, with
 * a = 1 + 2^-12: a*a = 1 + 2^-11 + 2^-24 is a tie that rounds to 1 + 2^-11.
 *  - c = -1: 2^-11 (0x3A000000); fused, 2^-11 + 2^-24 (0x3A000400).
 *  - c = -(1 + 2^-11): exactly 0; fused, 2^-24, which survives into bf16 (0x3380). */
static const uint32_t DQ_A = 0x3F800800, DQ_C = 0xBF801000;

/* Double quant through a kernel: element 0 is code 15 (1.0) times the scale
 * a*a+c = 0, element 1 is code 0 (-1.0) times it. */
static void dq_no_fma_check(const bfs_kernel_ops *k)
{
    static float nested_code[256];
    nested_code[3] = f32_of(DQ_A);
    const float nested_absmax[1] = {f32_of(DQ_A)};
    const uint8_t absmax_u8[1] = {3};
    const uint8_t codes[1] = {0xF0};
    const bfs_bnb4_desc d = {.codes = codes, .table = NF4, .blocksize = 64,
                             .absmax_u8 = absmax_u8, .nested_code = nested_code,
                             .nested_absmax = nested_absmax, .nested_blocksize = 256,
                             .offset = f32_of(DQ_C)};
    uint16_t out[2];
    k->bnb4(&d, 0, 2, out);
    assert_int_equal(out[0], 0x0000); /* fused: 0x3380 */
    assert_int_equal(out[1], 0x8000); /* -1 * +0 */
}

static void test_ref_dq_two_roundings(void **state)
{
    (void)state;
    const float a = f32_of(DQ_A);
    assert_int_equal(bfs_f32_bits(bfs_bnb4_dq_scale(a, a, -1.0f)), 0x3A000000);
    assert_int_equal(bfs_f32_bits(bfs_bnb4_dq_scale(a, a, f32_of(DQ_C))), 0x00000000);
    volatile float va = a, vc1 = -1.0f, vc2 = f32_of(DQ_C); /* no constant folding */
    assert_int_equal(bfs_f32_bits(fmaf(va, va, vc1)), 0x3A000400);
    assert_int_equal(bfs_f32_bits(fmaf(va, va, vc2)), 0x33800000);
    dq_no_fma_check(ref_ops());
}

static void test_ref_scalar_kernels(void **state)
{
    (void)state;
    const bfs_kernel_ops *k = ref_ops();
    /* MXFP4, R=2, G=1: row 0 scale 1.0 with codes 0..15 at even and 15-j at odd
     * elements, row 1 scale 2^-127 */
    uint8_t blocks[2][16], scales[2] = {127, 0};
    for (int j = 0; j < 16; j++)
        blocks[0][j] = blocks[1][j] = (uint8_t)(j | ((15 - j) << 4));
    static const uint16_t at_one[16] = {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040,
                                        0x4080, 0x40C0, 0x8000, 0xBF00, 0xBF80, 0xBFC0,
                                        0xC000, 0xC040, 0xC080, 0xC0C0};
    static const uint16_t at_tiny[16] = {0x0000, 0x0020, 0x0040, 0x0060, 0x0080, 0x00C0,
                                         0x0100, 0x0140, 0x8000, 0x8020, 0x8040, 0x8060,
                                         0x8080, 0x80C0, 0x8100, 0x8140};
    bfs_mxfp4_desc d = {.blocks = &blocks[0][0], .scales = scales, .R = 2, .G = 1};
    uint16_t out[64];
    k->mxfp4(&d, 0, 0, 2, out);
    for (int j = 0; j < 16; j++) {
        assert_int_equal(out[2 * j], at_one[j]);
        assert_int_equal(out[2 * j + 1], at_one[15 - j]);
        assert_int_equal(out[32 + 2 * j], at_tiny[j]);
        assert_int_equal(out[32 + 2 * j + 1], at_tiny[15 - j]);
    }
    d.transpose = 1; /* [32][2]: out row c = column c; rows [3, 6) only */
    k->mxfp4(&d, 0, 3, 6, out);
    assert_int_equal(out[0], at_one[14]); /* c=3: odd, byte 1, high nibble 14 */
    assert_int_equal(out[1], at_tiny[14]);
    assert_int_equal(out[2], at_one[2]); /* c=4: even, byte 2, low nibble 2 */
    assert_int_equal(out[3], at_tiny[2]);
    assert_int_equal(out[4], at_one[13]);
    assert_int_equal(out[5], at_tiny[13]);

    /* second item: its blocks and scales follow the first item's */
    uint8_t blocks2[2][16] = {{0}}, scales2[2] = {127, 128};
    blocks2[1][0] = 0x27; /* item 1: element 0 = 6 * 2, element 1 = 1 * 2 */
    d = (bfs_mxfp4_desc){.blocks = &blocks2[0][0], .scales = scales2, .R = 1, .G = 1};
    k->mxfp4(&d, 1, 0, 1, out);
    assert_int_equal(out[0], 0x4140);
    assert_int_equal(out[1], 0x4000);
    assert_int_equal(out[2], 0x0000);

    /* bnb: bytes 0x7F 0x18 0xF0, blocksize 2, absmax {2, -0.5}; elements [1, 5) */
    const uint8_t codes[3] = {0x7F, 0x18, 0xF0};
    const float absmax[3] = {2.0f, -0.5f, 4.0f};
    const bfs_bnb4_desc b = {.codes = codes, .table = NF4, .blocksize = 2, .absmax_f32 = absmax};
    k->bnb4(&b, 1, 5, out);
    assert_int_equal(out[0], 0x4000); /* element 1: code 15 (1.0) * 2 */
    assert_int_equal(out[1], 0x3EB2); /* element 2: code 1 (-0.6961928) * -0.5 */
    assert_int_equal(out[2], 0xBD23); /* element 3: code 8 (0.0795803) * -0.5, rounds up */
    assert_int_equal(out[3], 0x4080); /* element 4: code 15 * 4 */
}

/* ---- dispatch ------------------------------------------------------------------- */

static void test_dispatch(void **state)
{
    (void)state;
    const int best = bfs_kernels_best_level();
    assert_true(best >= BFS_CPU_SCALAR && best < BFS_CPU_NLEVELS);
    assert_ptr_equal(bfs_kernels_cpu(-1), bfs_kernels_cpu(best));
    assert_null(bfs_kernels_cpu(BFS_CPU_NLEVELS));
    for (int l = 0; l < BFS_CPU_NLEVELS; l++) {
        const bfs_kernel_ops *k = bfs_kernels_cpu(l);
        print_message("level %-6s: %s\n", level_names[l],
                      k ? "supported" : "not supported by this CPU (tests of it are skipped)");
        if (l <= best)
            assert_non_null(k);
        if (k) {
            assert_int_equal(k->level, l);
            assert_string_equal(k->name, level_names[l]);
            assert_non_null(k->mxfp4);
            assert_non_null(k->bnb4);
            assert_non_null(k->f32_to_bf16);
            assert_non_null(k->f16_to_bf16);
            assert_non_null(k->f64_to_bf16);
        }
    }
    const char *old = getenv("BFSHARD_CPU_LEVEL");
    char *saved = old ? strdup(old) : NULL;
    setenv("BFSHARD_CPU_LEVEL", "scalar", 1);
    assert_int_equal(bfs_kernels_best_level(), BFS_CPU_SCALAR);
    assert_string_equal(bfs_kernels_cpu(-1)->name, "scalar");
    /* an explicit level is served whatever the cap */
    if (best >= BFS_CPU_AVX2)
        assert_non_null(bfs_kernels_cpu(BFS_CPU_AVX2));
    setenv("BFSHARD_CPU_LEVEL", "avx2", 1);
    assert_int_equal(bfs_kernels_best_level(), best < BFS_CPU_AVX2 ? best : BFS_CPU_AVX2);
    unsetenv("BFSHARD_CPU_LEVEL");
    const int uncapped = bfs_kernels_best_level();
    setenv("BFSHARD_CPU_LEVEL", "avx512", 1);
    assert_int_equal(bfs_kernels_best_level(), uncapped);
    setenv("BFSHARD_CPU_LEVEL", "no-such-level", 1);
    assert_int_equal(bfs_kernels_best_level(), uncapped);
    if (saved)
        setenv("BFSHARD_CPU_LEVEL", saved, 1);
    else
        unsetenv("BFSHARD_CPU_LEVEL");
    free(saved);
}

/* ---- MXFP4: each level against the reference ------------------------------------- */

typedef struct mx_case {
    bfs_mxfp4_desc d;
    size_t items;
} mx_case;

/* Runs item/range on both, compares, checks the guards; out shifted by `shift` words. */
static void mx_compare(const bfs_kernel_ops *k, const bfs_mxfp4_desc *d, size_t item, size_t o0,
                       size_t o1, size_t shift)
{
    const size_t row = d->transpose ? d->R : d->G * 32;
    const size_t n = (o1 - o0) * row;
    outbuf want = out_new(n, 0), got = out_new(n, shift);
    ref_ops()->mxfp4(d, item, o0, o1, want.p);
    k->mxfp4(d, item, o0, o1, got.p);
    char what[160];
    snprintf(what, sizeof what, "%s mxfp4 R=%zu G=%zu transpose=%d item=%zu rows [%zu,%zu)",
             k->name, d->R, d->G, d->transpose, item, o0, o1);
    out_check(&got, what);
    expect_same(want.p, got.p, n, what);
    out_free(&want);
    out_free(&got);
}

/* Every scale byte 0..255 with every code, at even and odd elements. */
static void test_mxfp4_exhaustive(void **state)
{
    const bfs_kernel_ops *k = level_ops(state);
    enum { R = 300, G = 3 };
    uint8_t *blocks = xmalloc(R * G * 16), *scales = xmalloc(R * G);
    for (size_t r = 0; r < R; r++)
        for (size_t g = 0; g < G; g++) {
            scales[r * G + g] = (uint8_t)(r + 85 * g);
            for (size_t j = 0; j < 16; j++)
                blocks[(r * G + g) * 16 + j] = (uint8_t)(j | (((j * 7 + r + g) & 15) << 4));
        }
    for (int t = 0; t < 2; t++) {
        const bfs_mxfp4_desc d = {.blocks = blocks, .scales = scales, .R = R, .G = G, .transpose = t};
        mx_compare(k, &d, 0, 0, t ? G * 32 : R, 0);
    }
    free(blocks);
    free(scales);
}

static void test_mxfp4_shapes(void **state)
{
    const bfs_kernel_ops *k = level_ops(state);
    static const size_t shapes[][3] = {/* items, R, G */
                                       {1, 1, 1},  {2, 17, 2}, {3, 65, 3},  {1, 129, 5},
                                       {2, 70, 90}, {1, 64, 2}, {1, 200, 1}, {2, 16, 4},
                                       {1, 130, 90}, {2, 3, 7}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const size_t items = shapes[s][0], R = shapes[s][1], G = shapes[s][2], C = G * 32;
        /* bases at odd addresses: blocks and scales are bytes, never aligned */
        uint8_t *bbuf = xmalloc(items * R * G * 16 + 1), *sbuf = xmalloc(items * R * G + 1);
        uint8_t *blocks = bbuf + 1, *scales = sbuf + 1;
        rnd_fill(blocks, items * R * G * 16);
        for (size_t i = 0; i < items * R * G; i++) /* half realistic, half anything */
            scales[i] = (s & 1) ? (uint8_t)(rnd() >> 56) : (uint8_t)(112 + rnd_below(24));
        for (int t = 0; t < 2; t++) {
            const bfs_mxfp4_desc d = {.blocks = blocks, .scales = scales, .R = R, .G = G,
                                      .transpose = t};
            const size_t rows = t ? C : R;
            for (size_t item = 0; item < items; item++)
                mx_compare(k, &d, item, 0, rows, item & 1);
            const size_t item = items - 1;
            mx_compare(k, &d, item, 0, 1, 0);
            mx_compare(k, &d, item, rows - 1, rows, 1);
            mx_compare(k, &d, item, rows / 2, rows / 2, 0); /* empty */
            for (int trial = 0; trial < 6; trial++) {
                size_t a = rnd_below(rows + 1), b = rnd_below(rows + 1);
                if (a > b) {
                    const size_t tmp = a;
                    a = b;
                    b = tmp;
                }
                mx_compare(k, &d, item, a, b, (size_t)trial & 1);
            }
        }
        free(bbuf);
        free(sbuf);
    }
}

/* The transposed layout's streamed path: R a multiple of 32 (every output row aligned
 * alike), several 256-row blocks, outputs at every 64-byte phase the kernel plans for
 * (a head of 0..31 rows), ranges that cut groups, and tiles with scales outside [2, 252]
 * (0, 1, 253..255: the table path) among ordinary ones. */
static void test_mxfp4_transposed_stream(void **state)
{
    const bfs_kernel_ops *k = level_ops(state);
    enum { R = 608, G = 9, C = G * 32 };
    uint8_t *blocks = xmalloc(2 * R * G * 16), *scales = xmalloc(2 * R * G);
    rnd_fill(blocks, 2 * R * G * 16);
    static const uint8_t odd[] = {0, 1, 2, 252, 253, 254, 255};
    for (size_t i = 0; i < 2 * R * G; i++)
        scales[i] = (i % 211 == 5) ? odd[(i / 211) % 7] : (uint8_t)(100 + rnd_below(40));
    const bfs_mxfp4_desc d = {.blocks = blocks, .scales = scales, .R = R, .G = G, .transpose = 1};
    static const size_t shifts[] = {0, 1, 8, 24, 31, 32, 40};
    for (size_t i = 0; i < sizeof shifts / sizeof shifts[0]; i++) {
        mx_compare(k, &d, 1, 0, C, shifts[i]);
        mx_compare(k, &d, 0, 5, C - 70, shifts[i]);
        mx_compare(k, &d, 1, 33, 64, shifts[i]);
    }
    free(blocks);
    free(scales);
}

/* ---- bitsandbytes 4-bit ------------------------------------------------------------- */

static const uint32_t special_f32[] = {
    0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x00400000, 0x007FFFFF, /* zeros, subnormals */
    0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, /* inf, NaN */
    0xFFFFFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x3F808000, /* max, ties */
    0x3F818000, 0xBF818000, 0x00008000, 0x00018000, 0x3F800000, 0x7E967699, /* 1e38 */
};
enum { N_SPECIAL_F32 = sizeof special_f32 / sizeof special_f32[0] };

/* Mostly ordinary scales, now and then a special one. */
static float rnd_scale(void)
{
    const uint64_t r = rnd();
    if ((r & 7) == 0)
        return f32_of(special_f32[(r >> 8) % N_SPECIAL_F32]);
    return (float)((double)(r >> 40) / (double)(1u << 24) * 0.25 + 1e-3);
}

static void bnb_compare(const bfs_kernel_ops *k, const bfs_bnb4_desc *d, size_t i0, size_t i1,
                        size_t shift, const char *tag)
{
    const size_t n = i1 - i0;
    outbuf want = out_new(n, 0), got = out_new(n, shift);
    ref_ops()->bnb4(d, i0, i1, want.p);
    k->bnb4(d, i0, i1, got.p);
    char what[200];
    snprintf(what, sizeof what, "%s bnb4 %s bs=%zu%s [%zu,%zu)", k->name, tag, d->blocksize,
             d->absmax_u8 ? " dq" : "", i0, i1);
    out_check(&got, what);
    expect_same(want.p, got.p, n, what);
    out_free(&want);
    out_free(&got);
}

static void test_bnb4(void **state)
{
    const bfs_kernel_ops *k = level_ops(state);
    static const size_t blocksizes[] = {64, 128, 256, 4096, 1, 2, 3, 32, 50, 96};
    float nested_code[256];
    dq_no_fma_check(k);
    for (int t = 0; t < 2; t++)
        for (size_t bi = 0; bi < sizeof blocksizes / sizeof blocksizes[0]; bi++)
            for (int dq = 0; dq < 2; dq++) {
                const size_t bs = blocksizes[bi];
                const size_t n = 3 * bs + 77 + (bs & 1); /* odd whenever bs is even */
                const size_t nblocks = (n + bs - 1) / bs;
                const size_t nested_bs = (bi & 1) ? 256 : 3;
                const size_t nnested = (nblocks + nested_bs - 1) / nested_bs;
                uint8_t *cbuf = xmalloc((n + 1) / 2 + 1), *codes = cbuf + 1;
                float *absmax = xmalloc(nblocks * sizeof(float));
                uint8_t *absmax_u8 = xmalloc(nblocks);
                float *nested_absmax = xmalloc(nnested * sizeof(float));
                rnd_fill(codes, (n + 1) / 2);
                for (size_t b = 0; b < nblocks; b++) {
                    absmax[b] = rnd_scale();
                    absmax_u8[b] = (uint8_t)(rnd() >> 56);
                }
                for (size_t b = 0; b < N_SPECIAL_F32 && b < nblocks; b++)
                    absmax[b] = f32_of(special_f32[(b + bi) % N_SPECIAL_F32]);
                for (int q = 0; q < 256; q++)
                    nested_code[q] = (float)((int)q - 127) / 127.0f;
                nested_code[0] = f32_of(0x7FC00000);
                nested_code[1] = INFINITY;
                nested_code[2] = f32_of(0x00000003);
                for (size_t b = 0; b < nnested; b++)
                    nested_absmax[b] = rnd_scale();
                const bfs_bnb4_desc d = {
                    .codes = codes, .table = t ? FP4 : NF4, .blocksize = bs,
                    .absmax_f32 = dq ? NULL : absmax, .absmax_u8 = dq ? absmax_u8 : NULL,
                    .nested_code = dq ? nested_code : NULL,
                    .nested_absmax = dq ? nested_absmax : NULL,
                    .nested_blocksize = dq ? nested_bs : 0, .offset = dq ? 0.0625f : 0.0f};
                const char *tag = t ? "fp4" : "nf4";
                bnb_compare(k, &d, 0, n, 0, tag);
                bnb_compare(k, &d, 1, n, 1, tag);
                bnb_compare(k, &d, 0, n - 1, 0, tag);
                bnb_compare(k, &d, n - 1, n, 0, tag);
                bnb_compare(k, &d, bs, bs, 0, tag);
                bnb_compare(k, &d, bs - 1, 2 * bs + 1, 1, tag);
                if (bs >= 2)
                    bnb_compare(k, &d, bs + 1, 2 * bs - 1, 0, tag);
                for (int trial = 0; trial < 12; trial++) {
                    size_t a = rnd_below(n + 1), b = rnd_below(n + 1);
                    if (a > b) {
                        const size_t tmp = a;
                        a = b;
                        b = tmp;
                    }
                    bnb_compare(k, &d, a, b, (size_t)trial & 1, tag);
                }
                free(cbuf);
                free(absmax);
                free(absmax_u8);
                free(nested_absmax);
            }
}

/* ---- casts ---------------------------------------------------------------------------- */


static const char *const cast_names[] = {"f32_to_bf16", "f16_to_bf16", "f64_to_bf16"};
static const size_t cast_size[] = {4, 2, 8};

/* Converts n elements taken from src (elements, packed) placed at byte offset off of an
 * input buffer, into an output shifted by shift words; compares with the reference. */
static void cast_compare(const bfs_kernel_ops *k, bfs_cast_src c, const uint8_t *src, size_t n,
                         size_t off, size_t shift)
{
    const size_t es = cast_size[c];
    uint8_t *inbuf = xmalloc(n * es + off);
    memcpy(inbuf + off, src, n * es);
    outbuf want = out_new(n, 0), got = out_new(n, shift);
    bfs_kernels_cast(ref_ops(), c)(inbuf + off, n, want.p);
    bfs_kernels_cast(k, c)(inbuf + off, n, got.p);
    char what[120];
    snprintf(what, sizeof what, "%s %s n=%zu input+%zu output+%zu", k->name, cast_names[c], n,
             off, shift);
    out_check(&got, what);
    expect_same(want.p, got.p, n, what);
    free(inbuf);
    out_free(&want);
    out_free(&got);
}

/* Every length 0..67 at every input misalignment, then one long run. */
static void cast_sweep(const bfs_kernel_ops *k, bfs_cast_src c, const uint8_t *src, size_t n)
{
    for (size_t len = 0; len <= 67 && len <= n; len++)
        for (size_t off = 0; off < cast_size[c]; off++)
            cast_compare(k, c, src + (len % 5) * cast_size[c] * (n > 80), len, off + (len & 1),
                         len % 3);
    cast_compare(k, c, src, n, 3, 1);
}

static void test_cast_f32(void **state)
{
    const bfs_kernel_ops *k = level_ops(state);
    const size_t n = 10007;
    uint32_t *v = xmalloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) {
        const uint64_t r = rnd();
        v[i] = (uint32_t)r;
        if ((r >> 32) % 3 == 0) /* near special values and ties */
            v[i] = special_f32[(r >> 40) % N_SPECIAL_F32] + (uint32_t)((r >> 48) % 5) - 2;
    }
    for (size_t i = 0; i < N_SPECIAL_F32; i++) /* all of them in the first 68 */
        v[i] = special_f32[i];
    for (uint32_t i = 0; i < 44; i++) /* ties at every low-bit pattern */
        v[N_SPECIAL_F32 + i] = 0x3F800000u + (i << 16) + 0x8000u;
    cast_sweep(k, BFS_CAST_F32, (const uint8_t *)v, n);
    free(v);
}

/* Every half value. */
static void test_cast_f16(void **state)
{
    const bfs_kernel_ops *k = level_ops(state);
    const size_t n = 65536 + 3;
    uint16_t *v = xmalloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = (uint16_t)(i * 40503u); /* odd multiplier: a permutation of 0..65535 */
    static const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0200,
                                       0x7C00, 0xFC00, 0x7C01, 0x7E00, 0xFFFF, 0x7BFF,
                                       0xFBFF, 0x3C00, 0x3C01, 0x0400};
    memcpy(v, special, sizeof special);
    cast_sweep(k, BFS_CAST_F16, (const uint8_t *)v, n);
    for (uint32_t h = 0; h < 65536; h++) /* in order, too */
        v[h] = (uint16_t)h;
    cast_compare(k, BFS_CAST_F16, (const uint8_t *)v, 65536, 0, 0);
    free(v);
}

static void test_cast_f64(void **state)
{
    const bfs_kernel_ops *k = level_ops(state);
    static const uint64_t special[] = {
        0x0000000000000000ull, 0x8000000000000000ull, 0x0000000000000001ull, /* zeros, denormal */
        0x000FFFFFFFFFFFFFull, 0x7FF0000000000000ull, 0xFFF0000000000000ull, /* inf */
        0x7FF8000000000000ull, 0xFFF8000000000001ull, 0x7FF0000000000001ull, /* NaN payloads */
        0x7FF0000020000000ull, 0x7FFFFFFFFFFFFFFFull, 0x47EFFFFFE0000000ull, /* FLT_MAX */
        0x47EFFFFFF0000000ull, /* FLT_MAX + half ulp: tie to even, inf */
        0x47EFFFFFEFFFFFFFull, /* just under: FLT_MAX */
        0x3FF0000010000000ull, /* 1 + 2^-24: float tie, stays 1 */
        0x3FF0000030000000ull, /* 1 + 3*2^-24: float tie, up */
        0x3FF0100000000000ull, /* 1 + 2^-8: a bf16 tie after the float rounding */
        0x3FF0100000000001ull, /* a hair above it: the float rounding drops the hair */
        0x36A0000000000000ull, /* 2^-149: smallest float subnormal */
        0x3690000000000000ull, /* 2^-150: tie to 0 */
        0x3698000000000000ull, /* 1.5 * 2^-150: rounds to 2^-149 */
        0x380FFFFFF0000000ull, /* just under 2^-126 */
        0xC7EFFFFFF0000000ull, 0x3FF0000000000000ull, 0xBFF8000000000000ull, 0x4415AF1D78B58C40ull};
    const size_t n = 5003, ns = sizeof special / sizeof special[0];
    uint64_t *v = xmalloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) {
        const uint64_t r = rnd();
        if (i % 2) /* within float range: exponents 1023-160 .. 1023+130 */
            v[i] = (r & 0x800FFFFFFFFFFFFFull) | ((uint64_t)(863 + (r >> 52) % 291) << 52);
        else if (i % 5 == 0)
            v[i] = special[(r >> 20) % ns] + (r >> 62) - 1;
        else
            v[i] = r;
    }
    memcpy(v, special, sizeof special);
    cast_sweep(k, BFS_CAST_F64, (const uint8_t *)v, n);
    free(v);
}

/* The cast rules, hand-derived, on the reference (and so on every level). */
static void test_ref_casts(void **state)
{
    (void)state;
    const bfs_kernel_ops *k = ref_ops();
    const uint16_t h[6] = {0x3C00, 0x0001, 0x7C01, 0xFC00, 0x8000, 0x3C01};
    uint16_t out[6];
    k->f16_to_bf16(h, 6, out);
    assert_int_equal(out[0], 0x3F80);
    assert_int_equal(out[1], 0x3380); /* 2^-24 */
    assert_int_equal(out[2], 0x7FC0); /* signalling NaN */
    assert_int_equal(out[3], 0xFF80);
    assert_int_equal(out[4], 0x8000);
    assert_int_equal(out[5], 0x3F80); /* 1 + 2^-10 rounds to 1 */
    const double dv[4] = {f64_of(0x3FF0100000000000ull), f64_of(0x3FF0100000000001ull),
                          f64_of(0x3FF0300000000000ull), f64_of(0x47EFFFFFF0000000ull)};
    k->f64_to_bf16(dv, 4, out);
    assert_int_equal(out[0], 0x3F80); /* tie at bf16, even stays */
    assert_int_equal(out[1], 0x3F80); /* the hair is lost in the float rounding first */
    assert_int_equal(out[2], 0x3F82); /* tie, odd goes up */
    assert_int_equal(out[3], 0x7F80);
    const float fv[3] = {FLT_MAX, -FLT_TRUE_MIN, f32_of(0x7F800001)};
    k->f32_to_bf16(fv, 3, out);
    assert_int_equal(out[0], 0x7F80);
    assert_int_equal(out[1], 0x8000);
    assert_int_equal(out[2], 0x7FC0);
}


/* ---- FP8 scaled, INT4 pack-quantized, NVFP4 ---------------------------------------------- */

/* Random scales, some special (0, NaN, inf, subnormal), F32 or BF16 bytes. */
static uint8_t *q12_scales(size_t n, int bf16)
{
    uint8_t *p = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        const float f = rnd_scale();
        if (bf16) {
            const uint16_t h = (uint16_t)(bfs_f32_bits(f) >> 16);
            memcpy(p + 2 * i, &h, 2);
        } else {
            memcpy(p + 4 * i, &f, 4);
        }
    }
    return p;
}

typedef struct {
    int op; /* 0 fp8, 1 int4, 2 nvfp4, 3 compressed-tensors MX */
    const void *d;
    size_t n;
} q12_case;

static void q12_run(const bfs_kernel_ops *k, const q12_case *c, size_t i0, size_t i1, uint16_t *out)
{
    if (c->op == 0)
        k->fp8(c->d, i0, i1, out);
    else if (c->op == 1)
        k->int4(c->d, i0, i1, out);
    else if (c->op == 2)
        k->nvfp4(c->d, i0, i1, out);
    else
        k->ctmx(c->d, i0, i1, out);
}

static void q12_compare(const bfs_kernel_ops *k, const q12_case *c, size_t i0, size_t i1, size_t shift, const char *tag)
{
    const size_t n = i1 - i0;
    outbuf want = out_new(n, 0), got = out_new(n, shift);
    q12_run(ref_ops(), c, i0, i1, want.p);
    q12_run(k, c, i0, i1, got.p);
    char what[200];
    snprintf(what, sizeof what, "%s %s [%zu,%zu)", k->name, tag, i0, i1);
    out_check(&got, what);
    expect_same(want.p, got.p, n, what);
    out_free(&want);
    out_free(&got);
}

static void q12_sweep(const bfs_kernel_ops *k, const q12_case *c, size_t cols, const char *tag)
{
    q12_compare(k, c, 0, c->n, 0, tag);
    q12_compare(k, c, 1, c->n, 1, tag);
    q12_compare(k, c, cols - 1, 2 * cols + 3, 3, tag);
    q12_compare(k, c, c->n - 1, c->n, 0, tag);
    for (int trial = 0; trial < 16; trial++) {
        size_t a = rnd_below(c->n + 1), b = rnd_below(c->n + 1);
        if (a > b) {
            const size_t tmp = a;
            a = b;
            b = tmp;
        }
        q12_compare(k, c, a, b, (size_t)trial % 3, tag);
    }
}

static void test_q12_ops(void **state)
{
    const bfs_kernel_ops *k = level_ops(state);
    static const size_t shapes[][2] = {{200, 300}, {7, 9}, {130, 256}, {3, 1000}, {64, 48}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const size_t rows = shapes[si][0], cols = shapes[si][1], n = rows * cols;
        uint8_t *w = xmalloc(n);
        rnd_fill(w, n);
        /* FP8: block 128x128, channel, tensor, odd blocks; F32 and BF16 scales */
        static const size_t blocks[][2] = {{128, 128}, {1, 0}, {0, 0}, {5, 7}};
        for (size_t bi = 0; bi < 4; bi++)
            for (int bf = 0; bf < 2; bf++) {
                const size_t bh = blocks[bi][0] ? blocks[bi][0] : rows, bw = blocks[bi][1] ? blocks[bi][1] : cols;
                uint8_t *sc = q12_scales(((rows + bh - 1) / bh) * ((cols + bw - 1) / bw), bf);
                const bfs_fp8_desc d = {w, sc, bf, cols, bh, bw};
                const q12_case c = {0, &d, n};
                q12_sweep(k, &c, cols, bf ? "fp8 bf16 scale" : "fp8 f32 scale");
                free(sc);
            }
        /* DeepSeek-V4: E8M0 block scales, U8 (255 = +inf) and F8_E8M0 (255 = NaN); every byte
         * over the grids of the odd blocks, 0 and 255 in the 128 x 128 grid; DeepSeek-V4.1's
         * 32 x 32 and a 1 x 64 (whole blocks of 32 columns: the AVX2 kernel's block loop) */
        static const size_t e8blocks[][2] = {{128, 128}, {5, 7}, {32, 32}, {1, 64}};
        for (size_t bi = 0; bi < 4; bi++)
            for (int st = BFS_SCALE_E8M0; st <= BFS_SCALE_E8M0_NAN; st++) {
                const size_t bh = e8blocks[bi][0], bw = e8blocks[bi][1], ns = ((rows + bh - 1) / bh) * ((cols + bw - 1) / bw);
                uint8_t *sc = xmalloc(ns);
                for (size_t j = 0; j < ns; j++)
                    sc[j] = (uint8_t)(j % 4 == 0 ? 255 : j % 4 == 1 ? 0 : (j * 37 + si) % 256);
                const bfs_fp8_desc d = {w, sc, st, cols, bh, bw};
                const q12_case c = {0, &d, n};
                q12_sweep(k, &c, cols, st == BFS_SCALE_E8M0 ? "fp8 e8m0 u8 scale" : "fp8 e8m0 f8 scale");
                free(sc);
            }
        /* INT4: group sizes dividing cols, symmetric and asymmetric */
        const size_t wpr = (cols + 7) / 8;
        uint8_t *packed = xmalloc(rows * wpr * 4);
        rnd_fill(packed, rows * wpr * 4);
        static const size_t gdiv[] = {1, 3, 4};
        for (size_t gi = 0; gi < 3; gi++) {
            if (cols % gdiv[gi])
                continue;
            const size_t ng = gdiv[gi], gs = cols / ng;
            for (int asym = 0; asym < 2; asym++) {
                uint8_t *sc = q12_scales(rows * ng, asym), *zp = xmalloc(((rows + 7) / 8) * ng * 4);
                rnd_fill(zp, ((rows + 7) / 8) * ng * 4);
                const bfs_int4_desc d = {packed, sc, asym ? zp : NULL, asym, cols, wpr, ng, gs};
                const q12_case c = {1, &d, n};
                q12_sweep(k, &c, cols, asym ? "int4 asym" : "int4");
                free(sc);
                free(zp);
            }
        }
        free(packed);
        /* NVFP4: both conventions, every E4M3 scale byte (NaN 0x7F / 0xFF included) */
        if (cols % 16 == 0) {
            uint8_t *p = xmalloc(n / 2), *sc = xmalloc(n / 16);
            rnd_fill(p, n / 2);
            for (size_t i = 0; i < n / 16; i++)
                sc[i] = (uint8_t)(i * 37 + si);
            static const float gsv[] = {448.0f * 6.0f / 3.0f, 1.0f / 3.0f, 0.0f, 1e-30f};
            for (int mo = 0; mo < 2; mo++)
                for (size_t gi = 0; gi < 4; gi++) {
                    const bfs_nvfp4_desc d = {p, sc, gsv[gi], mo, cols};
                    const q12_case c = {2, &d, n};
                    q12_sweep(k, &c, cols, mo ? "nvfp4 modelopt" : "nvfp4 ct");
                }
            free(p);
            free(sc);
        }
        free(w);
    }
}

/* Every start in [0, span) with a short range from it, the output shifted by 0..2 words. */
static void q12_starts(const bfs_kernel_ops *k, const q12_case *c, size_t span, size_t len, const char *tag)
{
    for (size_t a = 0; a < span && a < c->n; a++) {
        const size_t b = a + len < c->n ? a + len : c->n;
        q12_compare(k, c, a, b, a % 3, tag);
    }
}

/* The fast paths' edges (kernels/cpu_avx2.c, FP8 / INT4 / NVFP4 section): every special float32 as a
 * scale, scales around 2^120 (where the FP8 path's s * 2^8 stops being finite), every E4M3
 * code, ranges that start and end inside a scale block, unaligned output; INT4 zero points
 * 0 and 15 (and all between), groups of 2..256; NVFP4 every scale byte and runs of four
 * finite blocks (the 64-element step), global scales tiny, subnormal, huge, zero, inf, NaN,
 * negative. */
static void test_q12_edges(void **state)
{
    const bfs_kernel_ops *k = level_ops(state);
    enum { NS = N_SPECIAL_F32 + 5 };
    float sv[NS];
    for (size_t j = 0; j < N_SPECIAL_F32; j++)
        sv[j] = f32_of(special_f32[j]);
    sv[N_SPECIAL_F32] = f32_of(0x7B7FFFFF);     /* the largest s with s * 2^8 finite */
    sv[N_SPECIAL_F32 + 1] = f32_of(0x7B800000); /* 2^120: s * 2^8 overflows */
    sv[N_SPECIAL_F32 + 2] = f32_of(0xFB7FFFFF);
    sv[N_SPECIAL_F32 + 3] = 3.7e-4f;
    sv[N_SPECIAL_F32 + 4] = -1.0f / 3.0f;

    /* FP8: NS rows x 288 columns (every code in each row, rotated), blocks 1 x 96 */
    {
        const size_t rows = NS, cols = 288, bw = 96, n = rows * cols;
        uint8_t *w = xmalloc(n), *sc = xmalloc(rows * 3 * 4);
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < cols; c++)
                w[r * cols + c] = (uint8_t)(c + 7 * r);
        for (int bf = 0; bf < 2; bf++) {
            for (size_t j = 0; j < rows * 3; j++) {
                const float f = sv[(j * 5) % NS];
                if (bf) {
                    const uint16_t h = (uint16_t)(bfs_f32_bits(f) >> 16);
                    memcpy(sc + 2 * j, &h, 2);
                } else {
                    memcpy(sc + 4 * j, &f, 4);
                }
            }
            const bfs_fp8_desc d = {w, sc, bf, cols, 1, bw};
            const q12_case c = {0, &d, n};
            q12_sweep(k, &c, cols, "fp8 edges");
            q12_starts(k, &c, 2 * bw + 3, 41, "fp8 edges");
            q12_compare(k, &c, 17, n - 9, 1, "fp8 edges");
            /* one scale for the whole tensor, every special in turn */
            for (size_t j = 0; j < NS; j++) {
                const bfs_fp8_desc dt = {w, (const uint8_t *)&sv[j], 0, cols, rows, cols};
                const q12_case ct = {0, &dt, n};
                q12_compare(k, &ct, 0, n, 0, "fp8 tensor edges");
                q12_compare(k, &ct, 3, cols + 50, 1, "fp8 tensor edges");
            }
        }
        free(w);
        free(sc);
    }

    /* INT4: 24 rows x 256 columns, groups of 2..256, zero points cycling through 0..15 */
    {
        const size_t rows = 24, cols = 256, wpr = cols / 8, n = rows * cols;
        uint8_t *packed = xmalloc(rows * wpr * 4);
        rnd_fill(packed, rows * wpr * 4);
        static const size_t gss[] = {2, 8, 32, 64, 128, 256};
        for (size_t gi = 0; gi < sizeof gss / sizeof *gss; gi++) {
            const size_t gs = gss[gi], ng = cols / gs;
            uint8_t *zp = xmalloc(((rows + 7) / 8) * ng * 4), *sc = xmalloc(rows * ng * 4);
            for (size_t rb = 0; rb < (rows + 7) / 8; rb++)
                for (size_t g = 0; g < ng; g++) {
                    uint32_t word = 0;
                    for (unsigned f = 0; f < 8; f++) /* 0, 15 and all between */
                        word |= (uint32_t)((rb * 8 + f + 3 * g) % 16 == 0 ? 0 : (rb * 8 + f + 3 * g) % 2 ? 15 : (rb + f + g) % 16) << (4 * f);
                    memcpy(zp + (rb * ng + g) * 4, &word, 4);
                }
            for (int bf = 0; bf < 2; bf++) {
                for (size_t j = 0; j < rows * ng; j++) {
                    const float f = sv[(j * 7 + gi) % NS];
                    if (bf) {
                        const uint16_t h = (uint16_t)(bfs_f32_bits(f) >> 16);
                        memcpy(sc + 2 * j, &h, 2);
                    } else {
                        memcpy(sc + 4 * j, &f, 4);
                    }
                }
                for (int asym = 0; asym < 2; asym++) {
                    const bfs_int4_desc d = {packed, sc, asym ? zp : NULL, bf, cols, wpr, ng, gs};
                    const q12_case c = {1, &d, n};
                    q12_sweep(k, &c, cols, asym ? "int4 edges asym" : "int4 edges");
                    q12_starts(k, &c, gs + 5 < 140 ? gs + 5 : 140, 2 * gs + 7, asym ? "int4 edges asym" : "int4 edges");
                }
            }
            free(zp);
            free(sc);
        }
        free(packed);
    }

    /* NVFP4: 64 rows x 128 columns: blocks 0..255 take every scale byte, the rest runs of
     * finite bytes (zero, subnormal, smallest/largest normal, both signs) */
    {
        const size_t rows = 64, cols = 128, n = rows * cols;
        uint8_t *p = xmalloc(n / 2), *sc = xmalloc(n / 16);
        rnd_fill(p, n / 2);
        static const uint8_t fin[] = {0x00, 0x01, 0x07, 0x08, 0x38, 0x7E, 0xFE, 0x80, 0x81, 0x3F, 0x40};
        for (size_t b = 0; b < n / 16; b++)
            sc[b] = b < 256 ? (uint8_t)b : fin[(b * 3) % sizeof fin];
        static const uint32_t gsv[] = {0x3F800000, 0x00800000, 0x00000001, 0x7E967699, 0x7F7FFFFF,
                                       0x00200000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x00000000,
                                       0x80000000, 0xC0200000, 0x45E31A9B, 0x3A1B4D90};
        for (int mo = 0; mo < 2; mo++)
            for (size_t gi = 0; gi < sizeof gsv / sizeof *gsv; gi++) {
                const bfs_nvfp4_desc d = {p, sc, f32_of(gsv[gi]), mo, cols};
                const q12_case c = {2, &d, n};
                const char *tag = mo ? "nvfp4 edges modelopt" : "nvfp4 edges ct";
                q12_sweep(k, &c, cols, tag);
                q12_compare(k, &c, 256 * 16, n, 0, tag);
                q12_compare(k, &c, 256 * 16 + 5, n - 3, 1, tag);
                q12_starts(k, &c, 70, 150, tag);
            }
        free(p);
        free(sc);
    }
}

/* ---- every CPU backend x every op, against bfs__ref_unit (test-backend-ops) ---------- */

/* Runs rows [row0, row1) of t on b and on the reference; memcmp, guards checked. */
static void unit_compare(bfs_backend *b, const bfs_ltensor *t, uint64_t row0, uint64_t row1, size_t es)
{
    const size_t n = (size_t)((row1 - row0) * t->row_elems) * es / 2; /* in 16-bit words */
    outbuf want = out_new(n, 0), got = out_new(n, 0);
    const bfs_unit uw = {t, row0, row1, want.p}, ug = {t, row0, row1, got.p};
    bfs__ref_unit(&uw);
    assert_int_equal(b->run(b, &ug), 0);
    char what[200];
    snprintf(what, sizeof what, "%s on %s rows [%llu,%llu)", t->transform, b->name, (unsigned long long)row0,
             (unsigned long long)row1);
    out_check(&got, what);
    expect_same(want.p, got.p, n, what);
    out_free(&want);
    out_free(&got);
}

/* All rows, the first, the last, and a range from an odd row, one thread and several. */
static void unit_sweep(int level, const bfs_ltensor *t, size_t es)
{
    static const int threads[] = {1, 3};
    for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
        bfs_backend *b = NULL;
        assert_int_equal(bfs__backend_cpu_create(level, threads[ti], &b), 0);
        unit_compare(b, t, 0, t->d0, es);
        unit_compare(b, t, 0, 1, es);
        unit_compare(b, t, t->d0 - 1, t->d0, es);
        unit_compare(b, t, 1, t->d0 - 1, es);
        b->destroy(b);
    }
}

static bfs_ltensor unit_tensor(bfs_kind kind, const char *transform, uint64_t d0, uint64_t row_elems)
{
    bfs_ltensor t;
    memset(&t, 0, sizeof t);
    t.name = (char *)transform;
    t.transform = transform;
    t.kind = kind;
    t.out_dtype = BFS_DT_BF16;
    t.d0 = d0;
    t.row_elems = row_elems;
    return t;
}

static void test_backend_ops(void **state)
{
    const int level = level_ops(state)->level;
    /* MXFP4: items in both layouts (E x R x G), then 3-d (rows R) */
    enum { E = 3, R = 70, G = 30 };
    uint8_t *blocks = xmalloc(E * R * G * 16), *scales = xmalloc(E * R * G);
    rnd_fill(blocks, E * R * G * 16);
    for (size_t i = 0; i < E * R * G; i++)
        scales[i] = (uint8_t)(i % 5 ? 112 + rnd_below(24) : rnd() >> 56);
    for (int tr = 0; tr < 2; tr++) {
        bfs_ltensor t = unit_tensor(BFS_K_MXFP4, tr ? "mxfp4 items transposed" : "mxfp4 items", E, R * G * 32);
        t.mx = (bfs_mxfp4_desc){blocks, scales, R, G, tr};
        t.mx_items = 1;
        unit_sweep(level, &t, 2);
    }
    bfs_ltensor t3 = unit_tensor(BFS_K_MXFP4, "mxfp4 3-d", E * R, G * 32);
    t3.mx = (bfs_mxfp4_desc){blocks, scales, E * R, G, 0};
    unit_sweep(level, &t3, 2);

    /* bnb: rows of 301 elements (odd: rows start on either nibble), plain and double quant */
    enum { ROWS = 400, COLS = 301, BS = 64, NB = (ROWS * COLS + BS - 1) / BS };
    uint8_t *codes = xmalloc(ROWS * COLS / 2 + 1), *q8 = xmalloc(NB);
    float *absmax = xmalloc(NB * sizeof(float)), ncode[256], nabs[NB / 256 + 1];
    rnd_fill(codes, ROWS * COLS / 2 + 1);
    rnd_fill(q8, NB);
    for (size_t i = 0; i < NB; i++)
        absmax[i] = rnd_scale();
    for (size_t i = 0; i < 256; i++)
        ncode[i] = (float)((int)i - 127) / 127.0f;
    for (size_t i = 0; i < NB / 256 + 1; i++)
        nabs[i] = rnd_scale();
    for (int dq = 0; dq < 2; dq++) {
        bfs_ltensor t = unit_tensor(BFS_K_BNB4, dq ? "fp4 dq" : "nf4", ROWS, COLS);
        t.bnb = dq ? (bfs_bnb4_desc){codes, FP4, BS, NULL, q8, ncode, nabs, 256, 0.0625f}
                   : (bfs_bnb4_desc){codes, NF4, BS, absmax, NULL, NULL, NULL, 0, 0.0f};
        unit_sweep(level, &t, 2);
    }

    /* casts from every source type, and a passthrough of 4-byte elements */
    uint8_t *data = xmalloc(ROWS * COLS * 8);
    rnd_fill(data, ROWS * COLS * 8);
    bfs_raw raw;
    memset(&raw, 0, sizeof raw);
    raw.data = data;
    static const bfs_dtype src[] = {BFS_DT_F32, BFS_DT_F16, BFS_DT_F64};
    static const char *const names[] = {"cast f32", "cast f16", "cast f64"};
    for (size_t i = 0; i < 3; i++) {
        bfs_ltensor t = unit_tensor(BFS_K_CAST, names[i], ROWS, COLS);
        t.src_dtype = src[i];
        t.src[0] = &raw;
        t.nsrc = 1;
        unit_sweep(level, &t, 2);
    }
    /* FP8 block (partial blocks), INT4 asym, NVFP4 both conventions */
    {
        enum { QR = 300, QC = 272 };
        uint8_t *w = xmalloc(QR * QC), *sc = q12_scales(3 * 3, 0), *bsc = q12_scales(QR * 4, 1);
        uint8_t *zp = xmalloc(((QR + 7) / 8) * 4 * 4), *e4 = xmalloc(QR * QC / 16);
        rnd_fill(w, QR * QC);
        rnd_fill(zp, ((QR + 7) / 8) * 4 * 4);
        rnd_fill(e4, QR * QC / 16);
        bfs_ltensor tf = unit_tensor(BFS_K_FP8, "fp8 block", QR, QC);
        tf.fp8 = (bfs_fp8_desc){w, sc, 0, QC, 128, 128};
        unit_sweep(level, &tf, 2);
        bfs_ltensor ti = unit_tensor(BFS_K_INT4, "int4 asym", QR, QC);
        ti.int4 = (bfs_int4_desc){w, bsc, zp, 1, QC, QC / 8, 4, QC / 4}; /* w as 300 x 34 words */
        unit_sweep(level, &ti, 2);
        for (int mo = 0; mo < 2; mo++) {
            bfs_ltensor tn = unit_tensor(BFS_K_NVFP4, mo ? "nvfp4 modelopt" : "nvfp4 ct", QR, QC);
            tn.nv = (bfs_nvfp4_desc){w, e4, 0.37f, mo, QC};
            unit_sweep(level, &tn, 2);
        }
        for (int el = 0; el < 3; el++) { /* compressed-tensors MX, E8M0 scales e4 */
            static const char *const tags[3] = {"ctmx mxfp8", "ctmx mxfp4", "ctmx mxfp6"};
            bfs_ltensor tm = unit_tensor(BFS_K_CTMX, tags[el], QR, 256);
            tm.ctmx = (bfs_ctmx_desc){w, e4, el, 256, 0};
            unit_sweep(level, &tm, 2);
        }
        free(w);
        free(sc);
        free(bsc);
        free(zp);
        free(e4);
    }
    bfs_ltensor tp = unit_tensor(BFS_K_PASS, "copy", ROWS, COLS);
    tp.out_dtype = tp.src_dtype = BFS_DT_I32;
    tp.src[0] = &raw;
    tp.nsrc = 1;
    unit_sweep(level, &tp, 4);

    free(blocks);
    free(scales);
    free(codes);
    free(q8);
    free(absmax);
    free(data);
}

/* ---- runner ------------------------------------------------------------------------------ */

static int L_SCALAR = BFS_CPU_SCALAR, L_AVX2 = BFS_CPU_AVX2, L_AVX512 = BFS_CPU_AVX512;
#if defined(BFS_TEST_AVX512_EMU)
static int L_AVX512_EMU = LEVEL_AVX512_EMU;
#endif

/* The FP8 table path (kernels/cpu_avx2.c, "FP8 by table"): a scale takes it when every
 * product of a normal code is a normal float32 (|s| >= 2^-119) and the largest ones
 * (e = 14, 15) agree bit for bit with the shifted table; else the multiply path. Scales on
 * both sides of both edges: powers of two 2^-126..2^-112 and 2^112..2^127 and their
 * neighbours, the s where 448 * s rounds to bf16 inf and where it overflows float32 (and
 * 240 * s, 480 * s), float32 subnormals, +-0, both signs, as float32 and as bf16; one
 * scale for all codes, then blocks of 5..256 columns (runs that start and end inside a
 * block, shorter than 32 and not a multiple of it), over 64 column blocks a row (the table
 * cache's slots collide), row bands of 3 sharing a block's tables. */
static void test_q12_fp8_table(void **state)
{
    const bfs_kernel_ops *k = level_ops(state);
    enum { MAXS = 1024 };
    float *sv = xmalloc(MAXS * sizeof(float));
    size_t ns = 0;
#define SV_ADD(f)                                                                  \
    do {                                                                           \
        const float f_ = (f);                                                      \
        assert_true(ns + 2 <= MAXS);                                               \
        sv[ns++] = f_;                                                             \
        sv[ns++] = -f_;                                                            \
    } while (0)
    for (int e = -126; e <= 127; e++) {
        if (e > -112 && e < 112 && (e < 95 || e > 99)) /* 2^97: where the AVX2 build stops checking */
            continue;
        const uint32_t p = (uint32_t)(e + 127) << 23;
        SV_ADD(f32_of(p));
        SV_ADD(f32_of(p - 1));
        SV_ADD(f32_of(p + 1));
        SV_ADD(f32_of(p + 0x600000u)); /* 1.75 * 2^e */
    }
    /* 448 * s (e = 15, m = 6) at bf16's overflow midpoint and float32's; 240 and 480 too */
    static const double tops[] = {448.0, 240.0, 480.0, 416.0};
    for (size_t t = 0; t < sizeof tops / sizeof *tops; t++) {
        const float edges[] = {(float)((2.0 - 0x1p-8) * 0x1p127 / tops[t]), (float)((2.0 - 0x1p-24) * 0x1p127 / tops[t])};
        for (size_t j = 0; j < 2; j++)
            for (int d = -6; d <= 6; d++)
                SV_ADD(f32_of(bfs_f32_bits(edges[j]) + (uint32_t)d));
    }
    SV_ADD(0.0f);
    SV_ADD(f32_of(1));          /* the smallest subnormal */
    SV_ADD(f32_of(0x007FFFFF)); /* the largest */
    SV_ADD(f32_of(0x00800000));
    SV_ADD(3.7e-4f);
    SV_ADD(1.0f / 3.0f);
#undef SV_ADD
    uint8_t *sb = xmalloc(ns * 2); /* the same scales as bf16 */
    for (size_t j = 0; j < ns; j++) {
        const uint16_t h = (uint16_t)(bfs_f32_bits(sv[j]) >> 16);
        memcpy(sb + 2 * j, &h, 2);
    }

    /* one scale for all 256 codes (twice each, in two orders, 3 rows of 200) */
    {
        const size_t rows = 3, cols = 200, n = rows * cols;
        uint8_t *w = xmalloc(n);
        for (size_t i = 0; i < n; i++)
            w[i] = (uint8_t)(i < 256 ? i : (i * 7) % 256);
        for (size_t j = 0; j < ns; j++)
            for (int bf = 0; bf < 2; bf++) {
                const bfs_fp8_desc d = {w, bf ? sb + 2 * j : (const uint8_t *)&sv[j], bf, cols, rows, cols};
                const q12_case c = {0, &d, n};
                q12_compare(k, &c, 0, n, 0, "fp8 table tensor");
                q12_compare(k, &c, 37, 37 + 23, 1, "fp8 table tensor");
            }
        free(w);
    }

    /* blocks: bh x bw, scales cycling through the list */
    {
        static const size_t bws[][2] = {{1, 5}, {1, 31}, {1, 32}, {3, 33}, {1, 100}, {3, 128}, {2, 256}, {32, 32}};
        for (size_t bi = 0; bi < sizeof bws / sizeof *bws; bi++) {
            const size_t bh = bws[bi][0], bw = bws[bi][1], cols = bw * 70 + 11;
            const size_t gcols = (cols + bw - 1) / bw, grows = (ns + gcols - 1) / gcols + 1;
            const size_t rows = grows * bh, n = rows * cols;
            uint8_t *w = xmalloc(n), *sc = xmalloc(grows * gcols * 4);
            for (size_t i = 0; i < n; i++)
                w[i] = (uint8_t)(i * 131 + i / 251);
            for (int bf = 0; bf < 2; bf++) {
                for (size_t j = 0; j < grows * gcols; j++) {
                    const size_t q = (j * 17) % ns;
                    if (bf)
                        memcpy(sc + 2 * j, sb + 2 * q, 2);
                    else
                        memcpy(sc + 4 * j, &sv[q], 4);
                }
                const bfs_fp8_desc d = {w, sc, bf, cols, bh, bw};
                const q12_case c = {0, &d, n};
                q12_compare(k, &c, 0, n, (size_t)bf, "fp8 table blocks");
                q12_compare(k, &c, bw / 2, n - bw / 3 - 1, 2, "fp8 table blocks");
                for (size_t a = 0; a < 40; a++) /* starts and ends inside blocks */
                    q12_compare(k, &c, a * (bw + 3) + a % 7, a * (bw + 3) + a % 7 + 1 + (a * 29) % (2 * bw + 40), a % 3,
                                "fp8 table blocks");
            }
            free(w);
            free(sc);
        }
    }
    free(sv);
    free(sb);
}

/* ---- compressed-tensors MX (kernels/cpu_avx2_ctmx.c) -------------------------------------------
 * Every E8M0 scale byte (0: the subnormal 2^-127; 1..9 and 247..254: subnormal or overflowing
 * products, the reference's path; 10..246: the exponent add; 255: +inf, 0 * inf = NaN) with
 * every E4M3 code and every pair of E2M1 codes; ranges starting and ending inside groups and
 * bytes, unaligned output, whole groups in ones and twos (the MXFP4 pair step), shapes of
 * one group a row and many. */
/* DeepSeek-V4's E8M0 scale decoding (ref_formats.h bfs_e8m0_scale, bfs_scale_at): bytes 0..254
 * are 2^(s-127) in both storages; 255 is +inf stored U8, NaN stored F8_E8M0 (as torch decodes
 * them: transformers' exp2(255 - 127.0), float8_e8m0fnu -> float32). */
static void test_ref_dsv4_e8m0(void **state)
{
    (void)state;
    for (unsigned s = 0; s < 255; s++) {
        const uint8_t b = (uint8_t)s;
        assert_int_equal(bfs_f32_bits(bfs_scale_at(&b, 0, BFS_SCALE_E8M0)), bfs_f32_bits(bfs_e8m0_to_f32(b)));
        assert_int_equal(bfs_f32_bits(bfs_scale_at(&b, 0, BFS_SCALE_E8M0_NAN)), bfs_f32_bits(bfs_e8m0_to_f32(b)));
    }
    const uint8_t ff[2] = {0xFF, 0x38}; /* scale byte 255; E4M3 1.0 */
    assert_int_equal(bfs_f32_bits(bfs_scale_at(ff, 0, BFS_SCALE_E8M0)), 0x7F800000);
    assert_true(isnan(bfs_scale_at(ff, 0, BFS_SCALE_E8M0_NAN)));
    assert_int_equal(bfs_scale_size(BFS_SCALE_E8M0), 1);
    assert_int_equal(bfs_scale_size(BFS_SCALE_E8M0_NAN), 1);
    const uint8_t w[2] = {0x00, 0x38}; /* +0, 1.0 */
    bfs_fp8_desc d = {w, ff, BFS_SCALE_E8M0, 2, 1, 2};
    assert_int_equal(bfs_fp8_elem(&d, 0, 0), 0x7FC0); /* 0 * inf */
    assert_int_equal(bfs_fp8_elem(&d, 0, 1), 0x7F80);
    d.scale_type = BFS_SCALE_E8M0_NAN;
    assert_int_equal(bfs_fp8_elem(&d, 0, 0), 0x7FC0);
    assert_int_equal(bfs_fp8_elem(&d, 0, 1), 0x7FC0);
    /* FP4 experts: code 8 (high nibble of 0x80) is -0.0 under a normal scale, NaN under F8_E8M0's 255 */
    uint8_t pk[16] = {0x80}, sc[1] = {127};
    bfs_ctmx_desc x = {pk, sc, 1, 32, 1};
    assert_int_equal(bfs_ctmx_elem(&x, 1), 0x8000);
    sc[0] = 255;
    assert_int_equal(bfs_ctmx_elem(&x, 0), 0x7FC0);
    x.nan255 = 0;
    assert_int_equal(bfs_ctmx_elem(&x, 0), 0x7FC0); /* 0 * inf */
    pk[0] = 0x12;
    assert_int_equal(bfs_ctmx_elem(&x, 0), 0x7F80); /* 1.0 * inf */
}

static void test_ctmx_ops(void **state)
{
    const bfs_kernel_ops *k = level_ops(state);
    static const size_t shapes[][2] = {{256, 256}, {9, 32}, {3, 1000 / 32 * 32}, {40, 96}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const size_t rows = shapes[si][0], cols = shapes[si][1], n = rows * cols, ng = n / 32;
        uint8_t *w = xmalloc(n), *sc = xmalloc(ng);
        for (size_t i = 0; i < n; i++) /* every code in every group (rotated by group) */
            w[i] = (uint8_t)(i % 32 * 8 + i / 32 * 7 + (i / 256));
        for (size_t g = 0; g < ng; g++)
            sc[g] = (uint8_t)(g * (si == 0 ? 1 : 37) + si);
        for (int v = 0; v < 6; v++) { /* element type v % 3; v >= 3: nan255 (DeepSeek-V4's F8_E8M0 scales) */
            static const char *const tags[6] = {"ctmx mxfp8", "ctmx mxfp4", "ctmx mxfp6",
                                                "mxfp8 f8_e8m0", "dsv4 fp4 f8_e8m0", "mxfp6 f8_e8m0"};
            const bfs_ctmx_desc d = {w, sc, v % 3, cols, v / 3};
            const q12_case c = {3, &d, n};
            const char *tag = tags[v];
            q12_sweep(k, &c, cols, tag);
            q12_starts(k, &c, 70, 131, tag);
            q12_compare(k, &c, 33, n - 31, 1, tag);
        }
        free(w);
        free(sc);
    }
    /* the rule itself, every scale byte x every E4M3 code: the exact product 2^(s-127) * v
     * rounded once to bf16 (in double, then float32: both exact here), +inf scale for 255 */
    for (unsigned s = 0; s < 256; s++)
        for (unsigned b = 0; b < 256; b++) {
            const float v = bfs_e4m3_to_f32((uint8_t)b);
            uint16_t want;
            if (s == 255)
                want = bfs_bf16_from_f32(v == 0.0f || v != v ? NAN : v > 0 ? INFINITY : -INFINITY);
            else
                want = bfs_bf16_from_f32((float)ldexp((double)v, (int)s - 127));
            const uint16_t got = bfs_ctmx_value(v, (uint8_t)s);
            if (got != want && !((got & 0x7FFF) > 0x7F80 && (want & 0x7FFF) > 0x7F80))
                fail_msg("bfs_ctmx_value(e4m3 0x%02x, scale %u) = 0x%04x, want 0x%04x", b, s, got, want);
        }
}

/* MXFP6 (compressed-tensors mxfp6-pack-quantized, docs/FORMATS.md 7.6): the E2M3 values are
 * compressed-tensors' kE2M3ToFloat (compressors/mxfp6/helpers.py), code 32 is -0.0; four codes
 * per 3 bytes, code j of word k in bits 6j.. of b0 | b1 << 8 | b2 << 16; every code under every
 * scale byte is the exact product rounded once (+inf for byte 255: 0 * inf = NaN). */
static void test_ref_mxfp6(void **state)
{
    (void)state;
    static const float mag[32] = {0, 0.125f, 0.25f, 0.375f, 0.5f, 0.625f, 0.75f, 0.875f, 1, 1.125f, 1.25f,
                                  1.375f, 1.5f, 1.625f, 1.75f, 1.875f, 2, 2.25f, 2.5f, 2.75f, 3, 3.25f, 3.5f,
                                  3.75f, 4, 4.5f, 5, 5.5f, 6, 6.5f, 7, 7.5f};
    for (unsigned code = 0; code < 64; code++) {
        const float want = code & 32 ? -mag[code & 31] : mag[code & 31];
        assert_int_equal(bfs_f32_bits(bfs_e2m3_to_f32(code)), bfs_f32_bits(want));
    }
    /* codes 1, 2, 3, 4: word 0x103081 (bytes 0x81 0x30 0x10), then 63, 32, 0, 5 */
    const uint8_t pk[6] = {0x81, 0x30, 0x10, 0x3F, 0x08, 0x14};
    assert_int_equal(bfs_fp6_code(pk, 0), 1);
    assert_int_equal(bfs_fp6_code(pk, 1), 2);
    assert_int_equal(bfs_fp6_code(pk, 2), 3);
    assert_int_equal(bfs_fp6_code(pk, 3), 4);
    assert_int_equal(bfs_fp6_code(pk + 3, 0), 63);
    assert_int_equal(bfs_fp6_code(pk + 3, 1), 32);
    assert_int_equal(bfs_fp6_code(pk + 3, 2), 0);
    assert_int_equal(bfs_fp6_code(pk + 3, 3), 5);
    uint8_t w[24] = {0}, sc[1] = {127};
    memcpy(w, pk, sizeof pk);
    const bfs_ctmx_desc d = {w, sc, BFS_CTMX_E2M3, 32, 0};
    assert_int_equal(bfs_ctmx_elem(&d, 3), 0x3F00);  /* code 4: 0.5 */
    assert_int_equal(bfs_ctmx_elem(&d, 4), 0xC0F0);  /* -7.5 */
    assert_int_equal(bfs_ctmx_elem(&d, 5), 0x8000);  /* -0.0 */
    for (unsigned s = 0; s < 256; s++)
        for (unsigned code = 0; code < 64; code++) {
            const float v = bfs_e2m3_to_f32(code);
            uint16_t want;
            if (s == 255)
                want = bfs_bf16_from_f32(v == 0.0f ? NAN : v > 0 ? INFINITY : -INFINITY);
            else
                want = bfs_bf16_from_f32((float)ldexp((double)v, (int)s - 127));
            const uint16_t got = bfs_ctmx_value(v, (uint8_t)s);
            if (got != want && !((got & 0x7FFF) > 0x7F80 && (want & 0x7FFF) > 0x7F80))
                fail_msg("bfs_ctmx_value(e2m3 %u, scale %u) = 0x%04x, want 0x%04x", code, s, got, want);
        }
}

/* ---- GPTQ (2/3/4/8 bits, v1 / v2, act-order), AWQ GEMM, bitsandbytes 8-bit ----------------- */
/* The level's woq op against the scalar reference, on whole tensors and on ranges that start
 * and end mid-row, mid-word and mid-group (the CPU backend's thread slices). The shapes take
 * every path of the SIMD kernel: 16-row tiles whole and cut, bands of 8 AWQ tiles, the tables of
 * plain groups (GPTQ 4-bit, AWQ), AWQ GEMV's runs of 32 and 16 columns and its groups of other
 * sizes, and, for outputs of 4 MiB and more at an aligned address, non-temporal stores (the
 * 512 x 4096 cases, F16 scales only: the reference is slow). */
static void test_woq_ops(void **state)
{
    const bfs_kernel_ops *k = level_ops(state);
    static const struct { int layout, bits, v1, act; size_t rows, cols, G; } cs[] = {
        {BFS_WOQ_GPTQ, 4, 1, 1, 40, 256, 32}, {BFS_WOQ_GPTQ, 4, 0, 0, 37, 96, 64}, {BFS_WOQ_GPTQ, 8, 1, 1, 45, 100, 32},
        {BFS_WOQ_GPTQ, 3, 1, 1, 64, 96, 32},  {BFS_WOQ_GPTQ, 3, 0, 0, 32, 320, 96}, {BFS_WOQ_GPTQ, 2, 1, 0, 33, 48, 16},
        {BFS_WOQ_GPTQ, 2, 0, 1, 16, 64, 8},   {BFS_WOQ_AWQ, 4, 0, 0, 37, 96, 32},  {BFS_WOQ_AWQ, 4, 0, 0, 64, 256, 128},
        {BFS_WOQ_BNB8, 8, 0, 0, 30, 333, 333},   {BFS_WOQ_GPTQ, 4, 1, 0, 48, 256, 32}, {BFS_WOQ_AWQ, 4, 0, 0, 200, 128, 32},
        {BFS_WOQ_GPTQ, 4, 0, 0, 512, 4096, 128}, {BFS_WOQ_GPTQ, 4, 1, 1, 512, 4096, 128}, {BFS_WOQ_AWQ, 4, 0, 0, 512, 4096, 128},
        {BFS_WOQ_GPTQ, 8, 1, 0, 512, 4096, 128}, {BFS_WOQ_GEMV, 4, 0, 0, 37, 96, 32}, {BFS_WOQ_GEMV, 4, 0, 0, 33, 48, 16},
        {BFS_WOQ_GEMV, 4, 0, 0, 20, 200, 40},    {BFS_WOQ_GEMV, 4, 0, 0, 64, 256, 128}, {BFS_WOQ_GEMV, 4, 0, 0, 512, 4096, 128},
    };
    for (size_t ci = 0; ci < sizeof cs / sizeof *cs; ci++) {
        const size_t rows = cs[ci].rows, cols = cs[ci].cols, G = cs[ci].G, bits = (size_t)cs[ci].bits;
        const int L = cs[ci].layout;
        const size_t ng = (cols + G - 1) / G;
        /* GEMV: qzeros rows padded past ceil(ngroups / 8) words, scale rows 8 entries a word */
        const size_t zw = L == BFS_WOQ_GEMV ? (ng + 7) / 8 + 1 : L == BFS_WOQ_AWQ ? (rows + 7) / 8 : bits == 3 ? (rows + 31) / 32 * 3 : (rows * bits + 31) / 32;
        bfs_woq_desc d = {.layout = L, .bits = (int)bits, .v1 = cs[ci].v1, .scale_type = BFS_WOQ_F16, .rows = rows,
                          .cols = cols, .group_size = G, .ngroups = L == BFS_WOQ_BNB8 ? 1 : ng, .zw = L == BFS_WOQ_BNB8 ? 0 : zw};
        const size_t qwb = L == BFS_WOQ_GPTQ ? bfs_gptq_kw(&d) * rows * 4 : L == BFS_WOQ_AWQ ? cols * zw * 4 : L == BFS_WOQ_GEMV ? rows * cols / 2 : rows * cols;
        const size_t qzb = (L == BFS_WOQ_GEMV ? rows : ng) * zw * 4 + 4, scb = (L == BFS_WOQ_GEMV ? zw * 8 : ng) * rows * 4 + 4;
        uint8_t *qw = xmalloc(qwb), *qz = xmalloc(qzb), *sc = xmalloc(scb), *gi = xmalloc(cols * 4);
        rnd_fill(qw, qwb);
        rnd_fill(qz, qzb);
        rnd_fill(sc, scb);
        for (size_t c = 0; c < cols; c++) {
            const int32_t g = (int32_t)(cs[ci].act ? rnd_below(ng) : c / G);
            memcpy(gi + 4 * c, &g, 4);
        }
        if (L == BFS_WOQ_BNB8)
            d.scale_type = BFS_WOQ_F32;
        d.qweight = qw;
        d.qzeros = L == BFS_WOQ_BNB8 ? NULL : qz;
        d.scale = sc;
        d.g_idx = cs[ci].act ? gi : NULL;
        for (int st = 0; st < 3; st++) { /* every scale type through the same walk */
            const size_t n = rows * cols;
            if (L != BFS_WOQ_BNB8 && (st == 0 || n < ((size_t)1 << 20)))
                d.scale_type = st;
            else if (st)
                break;
            uint16_t *want = xmalloc(n * 2), *got = aligned_alloc(64, (n * 2 + 2 + 63) / 64 * 64);
            assert_non_null(got);
            bfs__woq_scalar(&d, 0, n, want);
            for (int t = 0; t < 40; t++) {
                const size_t i0 = t == 0 ? 0 : rnd_below(n), i1 = t == 0 ? n : i0 + rnd_below(n - i0 + 1);
                memset(got, 0x5A, (i1 - i0) * 2 + 2);
                k->woq(&d, i0, i1, got);
                if (memcmp(got, want + i0, (i1 - i0) * 2) != 0 || got[i1 - i0] != 0x5A5A)
                    fail_msg("woq case %zu scale type %d, elements [%zu, %zu): %s differs from the scalar reference", ci, st, i0, i1, k->name);
            }
            /* the scalar op is bfs_woq_elem element by element */
            for (size_t i = 0; i < n; i += 7)
                assert_int_equal(want[i], bfs_woq_elem(&d, i / cols, i % cols));
            free(want);
            free(got);
        }
        free(qw);
        free(qz);
        free(sc);
        free(gi);
    }
}

/* The v1 zero-point rule on known words: a zero point of 0 stored as -1 borrows from the next
 * field; the whole-word add restores both (GPTQModel utils/model.py:824). 3-bit: per field. */
static void test_ref_gptq_v1(void **state)
{
    (void)state;
    /* v2 zeros 0, 5, 0, 15, 8, 0, 1, 2 (fields 0..7) -> v1 word = v2 word - 0x11111111 */
    uint32_t v2w = 0;
    const unsigned z[8] = {0, 5, 0, 15, 8, 0, 1, 2};
    for (int i = 0; i < 8; i++)
        v2w |= (uint32_t)z[i] << (4 * i);
    const uint32_t v1w = v2w - 0x11111111u;
    for (unsigned i = 0; i < 8; i++) {
        assert_int_equal(bfs_gptq_zero_at((const uint8_t *)&v1w, i, 4, 1), (int)z[i]);
        assert_int_equal(bfs_gptq_zero_at((const uint8_t *)&v2w, i, 4, 0), (int)z[i]);
    }
    /* 3-bit: stored 7 is zero point 0 */
    const uint32_t w3[3] = {7u, 0, 0};
    assert_int_equal(bfs_gptq_zero_at((const uint8_t *)w3, 0, 3, 1), 0);
    assert_int_equal(bfs_gptq_zero_at((const uint8_t *)w3, 1, 3, 1), 1);
    /* fp16 rounding: 60000 * 2 overflows to inf; 2^-24 * 1 stays the smallest subnormal */
    const uint16_t big = 0x7B53, tiny = 0x0001; /* 60000, 2^-24 */
    assert_int_equal(bfs_woq_value((const uint8_t *)&big, 0, BFS_WOQ_F16, 2), 0x7F80);
    assert_int_equal(bfs_woq_value((const uint8_t *)&tiny, 0, BFS_WOQ_F16, 1), 0x3380);
    assert_int_equal(bfs_f16_from_f32(65519.0f), 0x7BFF);
    assert_int_equal(bfs_f16_from_f32(65520.0f), 0x7C00);
    assert_int_equal(bfs_f16_from_f32(0x1p-25f), 0x0000);
    assert_int_equal(bfs_f16_from_f32(0x1.8p-25f), 0x0001);
}

#define LEVEL_TESTS(tag, lv)                                                      \
    {"mxfp4_exhaustive/" tag, test_mxfp4_exhaustive, NULL, NULL, &(lv)},          \
        {"mxfp4_shapes/" tag, test_mxfp4_shapes, NULL, NULL, &(lv)},              \
        {"mxfp4_transposed_stream/" tag, test_mxfp4_transposed_stream, NULL, NULL, &(lv)}, \
        {"bnb4/" tag, test_bnb4, NULL, NULL, &(lv)},                              \
        {"cast_f32/" tag, test_cast_f32, NULL, NULL, &(lv)},                      \
        {"cast_f16/" tag, test_cast_f16, NULL, NULL, &(lv)},                      \
        {"cast_f64/" tag, test_cast_f64, NULL, NULL, &(lv)},                      \
        {"q12_ops/" tag, test_q12_ops, NULL, NULL, &(lv)},                        \
        {"q12_edges/" tag, test_q12_edges, NULL, NULL, &(lv)},                    \
        {"q12_fp8_table/" tag, test_q12_fp8_table, NULL, NULL, &(lv)},            \
        {"ctmx_ops/" tag, test_ctmx_ops, NULL, NULL, &(lv)},                      \
        {"woq_ops/" tag, test_woq_ops, NULL, NULL, &(lv)}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_bf16_rounding),
        cmocka_unit_test(test_ref_mxfp6),
        cmocka_unit_test(test_ref_gptq_v1),
        cmocka_unit_test(test_ref_e8m0_e2m1),
        cmocka_unit_test(test_ref_dsv4_e8m0),
        cmocka_unit_test(test_ref_bnb_tables),
        cmocka_unit_test(test_ref_dq_two_roundings),
        cmocka_unit_test(test_ref_scalar_kernels),
        cmocka_unit_test(test_ref_casts),
        cmocka_unit_test(test_dispatch),
        LEVEL_TESTS("avx2", L_AVX2),
        LEVEL_TESTS("avx512", L_AVX512),
        {"backend_ops/scalar", test_backend_ops, NULL, NULL, &L_SCALAR},
        {"backend_ops/avx2", test_backend_ops, NULL, NULL, &L_AVX2},
        {"backend_ops/avx512", test_backend_ops, NULL, NULL, &L_AVX512},
#if defined(BFS_TEST_AVX512_EMU)
        LEVEL_TESTS("avx512-simde", L_AVX512_EMU),
#endif
    };
    return cmocka_run_group_tests_name("kernels", tests, NULL, NULL);
}
