/*
 * CPU dequant kernels: check every level against the scalar reference, then
 * time it (one thread) and print GB/s of BF16 output beside a memcpy of the
 * same number of output bytes. llm.c style: no framework, one file.
 *
 * Shapes: one gpt-oss-20b gate_up expert (R=5760, G=90 -> 5760 x 2880, both
 * layouts); a bitsandbytes 4096 x 14336 NF4 weight with double quant
 * (blocksize 64, nested blocksize 256); casts of 32 Mi elements (64 MiB of BF16);
 * FP8 E4M3 7168 x 2048 (DeepSeek-V3 block 128x128 with float32
 * scales; compressed-tensors per-channel with bf16 scales, per-tensor float32), INT4
 * pack-quantized 4096 x 14336 group 128 (symmetric; asymmetric with zero points), bf16
 * scales, and NVFP4 4096 x 14336 (compressed-tensors, ModelOpt). Codes are random bytes
 * (for E4M3 that includes the NaN codes 0x7F / 0xFF and the subnormals), scales in
 * realistic ranges.
 *
 * Build and run from the repository root (kernel objects only, no src/):
 *   mkdir -p build/bench
 *   F="-std=c11 -O2 -ffp-contract=off -fno-fast-math -D_GNU_SOURCE -Iinclude -pthread"
 *   gcc $F -mavx2 -mf16c -mbmi2 -c kernels/cpu_avx2.c -o build/bench/cpu_avx2.o
 *   gcc $F -mavx2 -mf16c -mbmi2 -c kernels/cpu_avx2_mxfp4.c -o build/bench/cpu_avx2_mxfp4.o
 *   gcc $F -mavx2 -mf16c -mbmi2 -c kernels/cpu_avx2_ctmx.c -o build/bench/cpu_avx2_ctmx.o
 *   gcc $F -mavx2 -mf16c -mbmi2 -c kernels/cpu_avx2_woq.c -o build/bench/cpu_avx2_woq.o
 *   gcc $F -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mf16c -mbmi2 \
 *       -c kernels/cpu_avx512.c -o build/bench/cpu_avx512.o
 *   gcc $F -o build/bench/kernels_bench bench/kernels_bench.c kernels/cpu_scalar.c \
 *       kernels/cpu_dispatch.c build/bench/cpu_avx2_woq.o build/bench/cpu_avx2.o build/bench/cpu_avx2_mxfp4.o build/bench/cpu_avx2_ctmx.o \
 *       build/bench/cpu_avx512.o
 *   build/bench/kernels_bench [repetitions, default 5]
 * or `make -f Makefile -f bench/Makefile.inc kernels-bench` (bench/Makefile.inc).
 * BFSHARD_CPU_LEVEL does not apply: every level the CPU runs is measured.
 */
#include "../kernels/bfs_kernels.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Buffers as convert allocates its unit buffers: 2 MiB-aligned and advised for
 * transparent huge pages (src/commands/convert.c), so the kernels see the TLB they see there. */
static void *xmalloc(size_t n)
{
    const size_t huge = (size_t)2 << 20, len = (n + huge - 1) / huge * huge;
    void *p = aligned_alloc(huge, len);
    if (p)
        (void)madvise(p, len, MADV_HUGEPAGE);
    if (!p) {
        fprintf(stderr, "kernels_bench: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    memset(p, 0, n); /* fault the pages in before timing */
    return p;
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd32(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545F4914F6CDD1Dull) >> 32);
}

static void rnd_fill(void *p, size_t n)
{
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)rnd32();
}

/* One operation as the bench sees it: run(ops, out) converts the whole input. */
typedef struct bench_op {
    const char *name;
    size_t out_elems;
    void (*run)(const bfs_kernel_ops *k, const void *ctx, uint16_t *out);
    const void *ctx;
    size_t shift; /* output at out + shift elements: convert writes each unit at its file
                   * offset mod 4096 (O_DIRECT), so a unit rarely starts 32-byte aligned */
} bench_op;

typedef struct mx_ctx {
    bfs_mxfp4_desc d;
    size_t rows;
} mx_ctx;

static void run_mx(const bfs_kernel_ops *k, const void *ctx, uint16_t *out)
{
    const mx_ctx *c = ctx;
    k->mxfp4(&c->d, 0, 0, c->rows, out);
}

typedef struct bnb_ctx {
    bfs_bnb4_desc d;
    size_t n;
} bnb_ctx;

static void run_bnb(const bfs_kernel_ops *k, const void *ctx, uint16_t *out)
{
    const bnb_ctx *c = ctx;
    k->bnb4(&c->d, 0, c->n, out);
}

typedef struct cast_ctx {
    const void *in;
    size_t n;
    bfs_cast_src src;
} cast_ctx;

static void run_cast(const bfs_kernel_ops *k, const void *ctx, uint16_t *out)
{
    const cast_ctx *c = ctx;
    bfs_kernels_cast(k, c->src)(c->in, c->n, out);
}

typedef struct q12_ctx {
    int op; /* 0 fp8, 1 int4, 2 nvfp4, 3 compressed-tensors MX, 4 GPTQ / AWQ / bnb 8-bit */
    const void *d;
    size_t n;
} q12_ctx;

static void run_q12(const bfs_kernel_ops *k, const void *ctx, uint16_t *out)
{
    const q12_ctx *c = ctx;
    if (c->op == 0)
        k->fp8(c->d, 0, c->n, out);
    else if (c->op == 1)
        k->int4(c->d, 0, c->n, out);
    else if (c->op == 2)
        k->nvfp4(c->d, 0, c->n, out);
    else if (c->op == 3)
        k->ctmx(c->d, 0, c->n, out);
    else
        k->woq(c->d, 0, c->n, out);
}

/* A positive scale in [lo, hi) (log-uniform), as float32 bytes or bf16 bytes. */
static float rnd_scale(float lo, float hi)
{
    float f = lo;
    const float step = 1.0f + (float)(rnd32() % 1024) / 1024.0f; /* 1 .. 2 */
    while (f * 2.0f < hi && (rnd32() & 1))
        f *= 2.0f;
    return f * step < hi ? f * step : f;
}

static uint8_t *scales_fill(size_t n, int bf16, float lo, float hi)
{
    uint8_t *p = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        const float f = rnd_scale(lo, hi);
        uint32_t u;
        memcpy(&u, &f, 4);
        if (bf16) {
            const uint16_t h = (uint16_t)(u >> 16);
            memcpy(p + 2 * i, &h, 2);
        } else {
            memcpy(p + 4 * i, &u, 4);
        }
    }
    return p;
}

/* n float16 scales in [lo, hi) (normal halves: the float's bits, rebiased, truncated). */
static uint8_t *scales_fill_f16(size_t n, float lo, float hi)
{
    uint8_t *p = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        const float f = rnd_scale(lo, hi);
        uint32_t u;
        memcpy(&u, &f, 4);
        const uint16_t h = (uint16_t)((((u >> 23) & 0xFF) - 112) << 10 | ((u >> 13) & 0x3FF));
        memcpy(p + 2 * i, &h, 2);
    }
    return p;
}

static double best_time(void (*fn)(const void *, void *), const void *a, void *b, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = now_s();
        fn(a, b);
        const double t = now_s() - t0;
        best = t < best ? t : best;
    }
    return best;
}

typedef struct memcpy_args {
    void *dst;
    const void *src;
    size_t n;
} memcpy_args;

static void do_memcpy(const void *a, void *unused)
{
    const memcpy_args *m = a;
    (void)unused;
    memcpy(m->dst, m->src, m->n);
}

static const char *const level_names[BFS_CPU_NLEVELS] = {"scalar", "avx2", "avx512"};

typedef struct op_args {
    const bench_op *op;
    const bfs_kernel_ops *k;
} op_args;

static void do_op(const void *a, void *out)
{
    const op_args *o = a;
    o->op->run(o->k, o->op->ctx, (uint16_t *)out + o->op->shift);
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 5;
    const char *only = argc > 2 ? argv[2] : NULL; /* run the ops whose name contains this */
    if (reps < 1) {
        fprintf(stderr, "usage: kernels_bench [repetitions >= 1] [name substring]\n");
        return 2;
    }

    /* gpt-oss-20b: mlp.experts.gate_up_proj_blocks [32, 5760, 90, 16], one expert */
    const size_t R = 5760, G = 90;
    uint8_t *blocks = xmalloc(R * G * 16), *scales = xmalloc(R * G);
    rnd_fill(blocks, R * G * 16);
    for (size_t i = 0; i < R * G; i++)
        scales[i] = (uint8_t)(116 + rnd32() % 10); /* typical exponents */
    const mx_ctx mx0 = {{blocks, scales, R, G, 0}, R};
    const mx_ctx mx1 = {{blocks, scales, R, G, 1}, G * 32};

    /* bitsandbytes NF4 4096 x 14336, double quant */
    static const float nf4[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f,
                                  -0.39491748809814453f, -0.28444138169288635f,
                                  -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                                  0.07958029955625534f, 0.16093020141124725f,
                                  0.24611230194568634f, 0.33791524171829224f,
                                  0.44070982933044434f, 0.5626170039176941f,
                                  0.7229568362236023f, 1.0f};
    const size_t nb_elems = (size_t)4096 * 14336, bs = 64, nblocks = nb_elems / bs;
    uint8_t *codes = xmalloc(nb_elems / 2), *absmax_u8 = xmalloc(nblocks);
    float *nested_absmax = xmalloc((nblocks / 256 + 1) * sizeof(float));
    static float nested_code[256];
    rnd_fill(codes, nb_elems / 2);
    rnd_fill(absmax_u8, nblocks);
    for (int q = 0; q < 256; q++)
        nested_code[q] = (float)(q - 128) / 128.0f;
    for (size_t b = 0; b <= nblocks / 256; b++)
        nested_absmax[b] = 0.01f + (float)(rnd32() % 1000) * 1e-5f;
    const bnb_ctx bnb = {{codes, nf4, bs, NULL, absmax_u8, nested_code, nested_absmax, 256, 0.03f},
                         nb_elems};

    /* casts: 32 Mi elements each */
    const size_t nc = (size_t)32 << 20;
    uint32_t *f32 = xmalloc(nc * 4);
    uint16_t *f16 = xmalloc(nc * 2);
    double *f64 = xmalloc(nc * 8);
    for (size_t i = 0; i < nc; i++) { /* finite values of every magnitude, some specials */
        f32[i] = (rnd32() & 0x80000000u) | ((rnd32() % 0xFE) << 23) | (rnd32() & 0x7FFFFF);
        f16[i] = (uint16_t)rnd32();
        f64[i] = (double)(int32_t)rnd32() * 1e-6;
    }
    const cast_ctx c32 = {f32, nc, BFS_CAST_F32}, c16 = {f16, nc, BFS_CAST_F16}, c64 = {f64, nc, BFS_CAST_F64};

    /* FP8 E4M3 7168 x 2048 (DeepSeek-V3 e.g. q_b_proj-like): block 128x128 float32
     * weight_scale_inv; compressed-tensors channel (bf16 [rows][1]) and tensor (float32) */
    const size_t FR = 7168, FC = 2048, fn = FR * FC;
    uint8_t *f8 = xmalloc(fn);
    rnd_fill(f8, fn);
    uint8_t *f8_blk = scales_fill((FR / 128) * (FC / 128), 0, 1e-5f, 1e-3f);
    uint8_t *f8_ch = scales_fill(FR, 1, 1e-4f, 1e-2f), *f8_t = scales_fill(1, 0, 1e-4f, 1e-2f);
    const bfs_fp8_desc fd_blk = {f8, f8_blk, 0, FC, 128, 128};
    const bfs_fp8_desc fd_ch = {f8, f8_ch, 1, FC, 1, FC};
    const bfs_fp8_desc fd_t = {f8, f8_t, 0, FC, FR, FC};
    const q12_ctx q_fblk = {0, &fd_blk, fn}, q_fch = {0, &fd_ch, fn}, q_ft = {0, &fd_t, fn};

    /* INT4 pack-quantized 4096 x 14336, group 128, bf16 scales; zero points [rows/8][groups] */
    const size_t IR = 4096, IC = 14336, in_ = IR * IC, ngr = IC / 128;
    uint8_t *i4 = xmalloc(in_ / 2), *i4_zp = xmalloc((IR / 8) * ngr * 4);
    rnd_fill(i4, in_ / 2);
    rnd_fill(i4_zp, (IR / 8) * ngr * 4);
    uint8_t *i4_sc = scales_fill(IR * ngr, 1, 1e-3f, 3e-2f);
    const bfs_int4_desc id_sym = {i4, i4_sc, NULL, 1, IC, IC / 8, ngr, 128};
    const bfs_int4_desc id_asym = {i4, i4_sc, i4_zp, 1, IC, IC / 8, ngr, 128};
    const q12_ctx q_isym = {1, &id_sym, in_}, q_iasym = {1, &id_asym, in_};

    /* NVFP4 4096 x 14336: E4M3 block scales in [2^-3, 448) as quantizers make them, a
     * global scale (ct: a divisor ~ 448*6/amax; ModelOpt: amax/(448*6)) */
    uint8_t *nv = xmalloc(in_ / 2), *nv_sc = xmalloc(in_ / 16);
    rnd_fill(nv, in_ / 2);
    for (size_t i = 0; i < in_ / 16; i++)
        nv_sc[i] = (uint8_t)(0x20 + rnd32() % (0x7E - 0x20 + 1)); /* e4m3, no NaN */
    const bfs_nvfp4_desc nd_ct = {nv, nv_sc, 2688.0f / 0.37f, 0, IC};
    const bfs_nvfp4_desc nd_mo = {nv, nv_sc, 0.37f / 2688.0f, 1, IC};
    const q12_ctx q_nct = {2, &nd_ct, in_}, q_nmo = {2, &nd_mo, in_};

    /* compressed-tensors MX 4096 x 14336: E8M0 scale bytes 107..127 (2^-20 .. 2^0,
     * as quantizers make them); MXFP8 on its own E4M3 bytes, MXFP4 on nv's packed bytes */
    uint8_t *mx8 = xmalloc(in_), *mx_sc = xmalloc(in_ / 32);
    rnd_fill(mx8, in_);
    for (size_t i = 0; i < in_ / 32; i++)
        mx_sc[i] = (uint8_t)(107 + rnd32() % 21);
    const bfs_ctmx_desc md8 = {mx8, mx_sc, 0, IC, 0}, md4 = {nv, mx_sc, 1, IC, 0};
    const q12_ctx q_m8 = {3, &md8, in_}, q_m4 = {3, &md4, in_};

    /* the kinds the 2026 checkpoints dispatch to (docs/FORMATS.md 7, 8):
     * DeepSeek-V4 FP8 7168 x 2048 with E8M0 128 x 128 block scales, stored U8 (255 = +inf)
     * and F8_E8M0 (255 = NaN); DeepSeek-V4.1 block 32 x 32 on the wide side (2048 x 7168:
     * 224 column blocks a row, more than the AVX2 kernel's table cache holds), E8M0 and
     * scale_fmt "float" (F32); per-tensor FP8 with a BF16 scalar (Quark, transformers);
     * V4's FP4 experts (I8 pairs, F8_E8M0 per 32: the MX kernel with nan255) on nv's bytes;
     * compressed-tensors MXFP6 E2M3 (3 bytes per 4 codes). E8M0 bytes 107..127 as above. */
    uint8_t *e8_blk = xmalloc((FR / 128) * (FC / 128)), *e8_32 = xmalloc((FR / 32) * (FC / 32));
    for (size_t i = 0; i < (FR / 128) * (FC / 128); i++)
        e8_blk[i] = (uint8_t)(107 + rnd32() % 21);
    for (size_t i = 0; i < (FR / 32) * (FC / 32); i++)
        e8_32[i] = (uint8_t)(107 + rnd32() % 21);
    uint8_t *f8_32 = scales_fill((FR / 32) * (FC / 32), 0, 1e-5f, 1e-3f), *f8_tb = scales_fill(1, 1, 1e-4f, 1e-2f);
    const bfs_fp8_desc fd_e8 = {f8, e8_blk, BFS_SCALE_E8M0, FC, 128, 128};
    const bfs_fp8_desc fd_e8n = {f8, e8_blk, BFS_SCALE_E8M0_NAN, FC, 128, 128};
    const bfs_fp8_desc fd_e32 = {f8, e8_32, BFS_SCALE_E8M0_NAN, FR, 32, 32}; /* 2048 x 7168 */
    const bfs_fp8_desc fd_f32 = {f8, f8_32, BFS_SCALE_F32, FR, 32, 32};
    const bfs_fp8_desc fd_tb = {f8, f8_tb, BFS_SCALE_BF16, FC, FR, FC};
    const q12_ctx q_fe8 = {0, &fd_e8, fn}, q_fe8n = {0, &fd_e8n, fn}, q_fe32 = {0, &fd_e32, fn};
    const q12_ctx q_ff32 = {0, &fd_f32, fn}, q_ftb = {0, &fd_tb, fn};
    uint8_t *mx6 = xmalloc(in_ / 4 * 3);
    rnd_fill(mx6, in_ / 4 * 3);
    const bfs_ctmx_desc md4n = {nv, mx_sc, BFS_CTMX_E2M1, IC, 1}, md6 = {mx6, mx_sc, BFS_CTMX_E2M3, IC, 0};
    const q12_ctx q_m4n = {3, &md4n, in_}, q_m6 = {3, &md6, in_};

    /* GPTQ / AWQ / bitsandbytes 8-bit, an nn.Linear 14336 -> 4096 (Llama-3-8B down_proj-like):
     * rows = 4096 out, cols = 14336 in, group 128, F16 scales. GPTQ qweight [in * bits / 32][out];
     * act-order: g_idx a random permutation of c / 128 (as desc_act's sorted columns); AWQ
     * qweight [in][out / 8], GEMV [out][in / 8]; bnb 8-bit I8 [out][in] with F32 SCB. */
    const size_t WR = 4096, WC = 14336, wn = WR * WC, wg = WC / 128;
    uint8_t *wq = xmalloc(wn), *wz = xmalloc(wg * WR), *wgi = xmalloc(WC * 4);
    rnd_fill(wq, wn);
    rnd_fill(wz, wg * WR);
    uint8_t *wsc = scales_fill_f16(wg * WR, 1e-3f, 3e-2f), *wscb = scales_fill(WR, 0, 1e-2f, 1.0f);
    for (size_t c = 0; c < WC; c++) {
        const uint32_t g = (uint32_t)(c / 128);
        memcpy(wgi + 4 * c, &g, 4);
    }
    for (size_t c = WC - 1; c > 0; c--) { /* Fisher-Yates */
        const size_t j = rnd32() % (c + 1);
        uint32_t a, b;
        memcpy(&a, wgi + 4 * c, 4), memcpy(&b, wgi + 4 * j, 4);
        memcpy(wgi + 4 * c, &b, 4), memcpy(wgi + 4 * j, &a, 4);
    }
    const bfs_woq_desc wd_g4a = {.qweight = wq, .qzeros = wz, .scale = wsc, .g_idx = wgi, .layout = BFS_WOQ_GPTQ, .bits = 4,
                                 .v1 = 1, .scale_type = BFS_WOQ_F16, .rows = WR, .cols = WC, .group_size = 128,
                                 .ngroups = wg, .zw = WR * 4 / 32};
    bfs_woq_desc wd_g4 = wd_g4a, wd_g8 = wd_g4a, wd_g3 = wd_g4a, wd_g2 = wd_g4a, wd_awq = wd_g4a, wd_b8 = wd_g4a, wd_gv = wd_g4a;
    wd_g4.g_idx = NULL, wd_g4.v1 = 0;
    wd_g8.bits = 8, wd_g8.zw = WR * 8 / 32;
    wd_g3.bits = 3, wd_g3.zw = WR / 32 * 3;
    wd_g2.bits = 2, wd_g2.zw = WR * 2 / 32;
    wd_awq.layout = BFS_WOQ_AWQ, wd_awq.g_idx = NULL, wd_awq.v1 = 0, wd_awq.zw = WR / 8;
    wd_gv.layout = BFS_WOQ_GEMV, wd_gv.g_idx = NULL, wd_gv.v1 = 0, wd_gv.zw = (wg + 7) / 8; /* [out][in / 8], zw 14 */
    wd_b8 = (bfs_woq_desc){.qweight = wq, .scale = wscb, .layout = BFS_WOQ_BNB8, .bits = 8, .scale_type = BFS_WOQ_F32,
                           .rows = WR, .cols = WC, .group_size = WC, .ngroups = 1};
    const q12_ctx q_g4a = {4, &wd_g4a, wn}, q_g4 = {4, &wd_g4, wn}, q_g8 = {4, &wd_g8, wn}, q_g3 = {4, &wd_g3, wn};
    const q12_ctx q_g2 = {4, &wd_g2, wn}, q_awq = {4, &wd_awq, wn}, q_b8 = {4, &wd_b8, wn}, q_gv = {4, &wd_gv, wn};

    const bench_op ops[] = {
        {"mxfp4 5760x2880 (gpt-oss layout)", R * G * 32, run_mx, &mx0, 0},
        {"mxfp4 5760x2880 transposed (HF)", R * G * 32, run_mx, &mx1, 0},
        {"mxfp4 transposed, out at +16 bytes", R * G * 32, run_mx, &mx1, 8},
        {"bnb nf4 dq 4096x14336 bs64", nb_elems, run_bnb, &bnb, 0},
        {"fp8 7168x2048 block128 f32 scale", fn, run_q12, &q_fblk, 0},
        {"fp8 7168x2048 channel bf16 scale", fn, run_q12, &q_fch, 0},
        {"fp8 7168x2048 tensor f32 scale", fn, run_q12, &q_ft, 0},
        {"int4 4096x14336 g128 sym", in_, run_q12, &q_isym, 0},
        {"int4 4096x14336 g128 asym (zp)", in_, run_q12, &q_iasym, 0},
        {"nvfp4 4096x14336 compressed-t.", in_, run_q12, &q_nct, 0},
        {"nvfp4 4096x14336 modelopt", in_, run_q12, &q_nmo, 0},
        {"ct-mxfp8 4096x14336 e8m0/32", in_, run_q12, &q_m8, 0},
        {"ct-mxfp4 4096x14336 e8m0/32", in_, run_q12, &q_m4, 0},
        {"dsv4 fp8 7168x2048 block128 u8 e8m0", fn, run_q12, &q_fe8, 0},
        {"dsv4 fp8 7168x2048 block128 f8_e8m0", fn, run_q12, &q_fe8n, 0},
        {"dsv4.1 fp8 2048x7168 block32 e8m0", fn, run_q12, &q_fe32, 0},
        {"dsv4.1 fp8 2048x7168 block32 f32", fn, run_q12, &q_ff32, 0},
        {"fp8 7168x2048 tensor bf16 scale", fn, run_q12, &q_ftb, 0},
        {"dsv4 fp4 4096x14336 i8 f8_e8m0/32", in_, run_q12, &q_m4n, 0},
        {"ct-mxfp6 4096x14336 e2m3 e8m0/32", in_, run_q12, &q_m6, 0},
        {"gptq int4 4096x14336 g128 act-order", wn, run_q12, &q_g4a, 0},
        {"gptq int4 4096x14336 g128", wn, run_q12, &q_g4, 0},
        {"gptq int8 4096x14336 g128", wn, run_q12, &q_g8, 0},
        {"gptq int3 4096x14336 g128", wn, run_q12, &q_g3, 0},
        {"gptq int2 4096x14336 g128", wn, run_q12, &q_g2, 0},
        {"awq gemm 4096x14336 g128", wn, run_q12, &q_awq, 0},
        {"awq gemv 4096x14336 g128", wn, run_q12, &q_gv, 0},
        {"bnb int8 4096x14336", wn, run_q12, &q_b8, 0},
        {"cast f32->bf16 32Mi", nc, run_cast, &c32, 0},
        {"cast f16->bf16 32Mi", nc, run_cast, &c16, 0},
        {"cast f64->bf16 32Mi", nc, run_cast, &c64, 0},
    };
    size_t max_out = 0;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        max_out = ops[i].out_elems > max_out ? ops[i].out_elems : max_out;
    uint16_t *ref = xmalloc(max_out * 2), *out = xmalloc(max_out * 2 + 64), *src = xmalloc(max_out * 2);
    rnd_fill(src, max_out * 2);

    printf("bfshard CPU kernels, one thread, best of %d; GB/s of BF16 output (1e9 bytes/s)\n",
           reps);
    printf("best level here: %s\n", bfs_kernels_cpu(-1)->name);
    int bad = 0;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        const bench_op *op = &ops[i];
        if (only && !strstr(op->name, only))
            continue;
        const size_t bytes = op->out_elems * 2;
        const memcpy_args m = {out, src, bytes};
        printf("\n%-34s %8.1f MB out\n", op->name, (double)bytes / 1e6);
        op->run(bfs_kernels_cpu(BFS_CPU_SCALAR), op->ctx, ref);
        const bfs_kernel_ops *levels[BFS_CPU_NLEVELS];
        double best[BFS_CPU_NLEVELS], best_memcpy = 1e30;
        for (int l = 0; l < BFS_CPU_NLEVELS; l++) {
            levels[l] = bfs_kernels_cpu(l);
            best[l] = 1e30;
            if (!levels[l])
                continue;
            memset(out, 0xA5, bytes + 64);
            op->run(levels[l], op->ctx, out + op->shift);
            const int same = memcmp(ref, out + op->shift, bytes) == 0;
            bad |= !same;
            if (!same)
                printf("  %-8s DIFFERS FROM SCALAR\n", levels[l]->name);
        }
        /* interleaved, so that memcpy and the kernels see the same machine */
        for (int r = 0; r < reps; r++) {
            const double tm = best_time(do_memcpy, &m, NULL, 1);
            best_memcpy = tm < best_memcpy ? tm : best_memcpy;
            for (int l = 0; l < BFS_CPU_NLEVELS; l++) {
                if (!levels[l] || (l == BFS_CPU_SCALAR && r >= 2)) /* the reference is slow */
                    continue;
                const op_args a = {op, levels[l]};
                const double t = best_time(do_op, &a, out, 1);
                best[l] = t < best[l] ? t : best[l];
            }
        }
        printf("  %-8s %7.2f GB/s\n", "memcpy", (double)bytes / best_memcpy / 1e9);
        for (int l = 0; l < BFS_CPU_NLEVELS; l++) {
            if (!levels[l]) {
                printf("  %-8s not supported by this CPU: skipped\n", level_names[l]);
                continue;
            }
            printf("  %-8s %7.2f GB/s  %5.2fx memcpy\n", levels[l]->name,
                   (double)bytes / best[l] / 1e9, best_memcpy / best[l]);
        }
    }
    printf("\n%s\n", bad ? "SOME LEVEL DIFFERS FROM THE SCALAR REFERENCE" : "all levels match the scalar reference");
    free(blocks), free(scales), free(codes), free(absmax_u8), free(nested_absmax);
    free(f32), free(f16), free(f64), free(ref), free(out), free(src);
    free(f8), free(f8_blk), free(f8_ch), free(f8_t), free(i4), free(i4_zp), free(i4_sc);
    free(nv), free(nv_sc), free(mx8), free(mx_sc);
    free(e8_blk), free(e8_32), free(f8_32), free(f8_tb), free(mx6);
    free(wq), free(wz), free(wgi), free(wsc), free(wscb);
    return bad ? 1 : 0;
}
