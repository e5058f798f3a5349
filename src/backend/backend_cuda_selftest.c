/*
 * CUDA backend, the start-up self-test: before a device takes any unit, a few small units
 * of every kind run through the real pipeline (backend_cuda_pipe.c) and must equal the
 * scalar reference bit for bit; a build that computes inexactly (FMA contraction, flush
 * to zero, fast math) is refused with a message that says so (bfs__cu_selftest_failed).
 * backend_cuda.c runs it at creation.
 */
#include "backend/backend_cuda.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- the start-up self-test ---------------------------------------------------------------- */
static bfs_ltensor cu_st_tensor(const char *name, bfs_kind kind, uint64_t d0, uint64_t row_elems)
{
    bfs_ltensor t;
    memset(&t, 0, sizeof t);
    t.name = (char *)name;
    t.kind = kind;
    t.out_dtype = BFS_DT_BF16;
    t.ndim = 2;
    t.shape[0] = d0;
    t.shape[1] = row_elems;
    t.d0 = d0;
    t.row_elems = row_elems;
    return t;
}

/* One case: run t's rows on d, compare with want (n bf16). */
static int cu_st_case(const cu_backend *b, cu_dev *d, const bfs_ltensor *t, const uint16_t *want, size_t n,
                      const char *what)
{
    int rc = 0;
    uint16_t got[256];
    cu_job j;
    const bfs_unit u = {t, 0, t->d0, got};
    memset(got, 0xEE, sizeof got);
    BFS_TRY(bfs__cu_job_init(b, &u, &j));
    BFS_TRY(bfs__cu_pipeline(b, d, &j, b->slot));
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            BFS_FAIL(BFS_EDEVICE,
                     "cuda:%d: start-up self-test failed: %s: element %zu is 0x%04x, must be 0x%04x. The kernels "
                     "of this build do not compute exactly (built with -ftz=true, fast math or another inexact "
                     "nvcc flag, or a faulty GPU or driver): refusing to convert. Rebuild with the Makefile "
                     "(its NVFLAGS cannot be overridden), or use --device cpu",
                     d->id, what, i, got[i], want[i]);
cleanup:
    return rc;
}

/* Known inputs through the real pipeline and kernels, checked bit for bit against ref.h
 * and a few values worked out by hand. Subnormal products (FTZ flushes them), an
 * FMA-sensitive double-quant scale, both MXFP4 layouts, a cast. Under a millisecond of GPU. */
int bfs__cu_selftest(const cu_backend *b, cu_dev *d)
{
    int rc = 0;
    /* MXFP4: 2 rows x 1 group; row 0 at scale byte 0 (2^-127), row 1 at 255 (2^128) */
    static const uint8_t mxb[32] = {0x21, 0x43, 0x65, 0x87, 0xA9, 0xCB, 0xED, 0x0F, 0x10, 0x32, 0x54,
                                    0x76, 0x98, 0xBA, 0xDC, 0xFE, 0x21, 0x43, 0x65, 0x87, 0xA9, 0xCB,
                                    0xED, 0x0F, 0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE};
    static const uint8_t mxs[2] = {0, 255};
    uint16_t want[256];
    bfs_ltensor t = cu_st_tensor("self-test.mxfp4", BFS_K_MXFP4, 2, 32);
    t.mx.blocks = mxb;
    t.mx.scales = mxs;
    t.mx.R = 2;
    t.mx.G = 1;
    for (unsigned r = 0; r < 2; r++)
        for (unsigned c = 0; c < 32; c++)
            want[r * 32 + c] = bfs_mxfp4_value(bfs_mxfp4_code(mxb + r * 16, c), bfs_e8m0_to_f32(mxs[r]));
    if (want[0] != 0x0020 || want[1] != 0x0040) /* code 1 (0.5) and 2 (1.0) at 2^-127: subnormal */
        BFS_FAIL(BFS_EINTERNAL, "self-test: the host reference is inexact (0x%04x 0x%04x): a miscompiled build",
                 want[0], want[1]);
    BFS_TRY(cu_st_case(b, d, &t, want, 64, "MXFP4 code 1 at scale 2^-127 (must be 0x0020), 2-d"));
    /* the same as one item [1, 2, 32], transposed: out [32 c][2 r] */
    bfs_ltensor ti = t;
    ti.ndim = 3;
    ti.shape[0] = 1, ti.shape[1] = 32, ti.shape[2] = 2;
    ti.d0 = 1;
    ti.row_elems = 64;
    ti.mx_items = 1;
    ti.mx.transpose = 1;
    uint16_t want_t[64];
    for (unsigned c = 0; c < 32; c++)
        for (unsigned r = 0; r < 2; r++)
            want_t[c * 2 + r] = want[r * 32 + c];
    BFS_TRY(cu_st_case(b, d, &ti, want_t, 64, "MXFP4 transposed, scales 2^-127 and 2^128"));

    /* bnb NF4 without double quant: absmax 1e-38, every code: subnormal products */
    static const uint8_t codes[32] = {0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF, 0xFE, 0xDC, 0xBA,
                                      0x98, 0x76, 0x54, 0x32, 0x10, 0x0F, 0xF0, 0x1E, 0xE1, 0x2D, 0xD2,
                                      0x3C, 0xC3, 0x4B, 0xB4, 0x5A, 0xA5, 0x69, 0x96, 0x78, 0x87};
    static const float absmax[1] = {1e-38f};
    bfs_ltensor q = cu_st_tensor("self-test.nf4", BFS_K_BNB4, 1, 64);
    snprintf(q.quant_type, sizeof q.quant_type, "nf4");
    q.bnb.codes = codes;
    q.bnb.table = bfs__cu_nf4;
    q.bnb.blocksize = 64;
    q.bnb.absmax_f32 = absmax;
    for (unsigned i = 0; i < 64; i++)
        want[i] = bfs_bnb4_value(bfs__cu_nf4[bfs_bnb4_code(codes, i)], absmax[0]);
    BFS_TRY(cu_st_case(b, d, &q, want, 64, "NF4 at absmax 1e-38 (subnormal products)"));

    /* bnb double quant: scale = (1 + 2^-12)^2 - (1 + 2^-11) is 0 with two roundings, 2^-24 fused */
    static const uint8_t aq[1] = {7};
    float ncode[256], nabs[1] = {1.0f + 0x1p-12f};
    for (unsigned i = 0; i < 256; i++)
        ncode[i] = (float)i / 256.0f;
    ncode[7] = 1.0f + 0x1p-12f;
    bfs_ltensor qd = q;
    qd.name = "self-test.nf4-dq";
    qd.bnb.absmax_f32 = NULL;
    qd.bnb.absmax_u8 = aq;
    qd.bnb.nested_code = ncode;
    qd.bnb.nested_absmax = nabs;
    qd.bnb.nested_blocksize = 256;
    qd.bnb.offset = -(1.0f + 0x1p-11f);
    const float sc = bfs_bnb4_dq_scale(ncode[7], nabs[0], qd.bnb.offset);
    if (sc != 0.0f)
        BFS_FAIL(BFS_EINTERNAL, "self-test: the host reference fused a multiply-add: a miscompiled build");
    for (unsigned i = 0; i < 64; i++)
        want[i] = bfs_bnb4_value(bfs__cu_nf4[bfs_bnb4_code(codes, i)], sc);
    BFS_TRY(cu_st_case(b, d, &qd, want, 64, "NF4 double-quant scale (no FMA: must be 0)"));

    /* F16 -> BF16: subnormal halves, inf, NaN */
    static const uint16_t h[8] = {0x0001, 0x8001, 0x03FF, 0x0400, 0x7C00, 0x7E01, 0x3C00, 0xFBFF};
    bfs_raw raw;
    memset(&raw, 0, sizeof raw);
    raw.data = (const uint8_t *)h;
    raw.nbytes = sizeof h;
    bfs_ltensor tc = cu_st_tensor("self-test.f16", BFS_K_CAST, 1, 8);
    tc.src_dtype = BFS_DT_F16;
    tc.src[0] = &raw;
    tc.nsrc = 1;
    for (unsigned i = 0; i < 8; i++)
        want[i] = bfs_bf16_from_f32(bfs_f32_from_f16(h[i]));
    BFS_TRY(cu_st_case(b, d, &tc, want, 8, "F16 to BF16"));
cleanup:
    return rc;
}

/* The self-test's error, with what to do when the GPU has no kernel image in this build. */
int bfs__cu_selftest_failed(const cu_dev *d, int rc)
{
    const int cc = bfs__cu_cc(d->id);
    char m[512];
    snprintf(m, sizeof m, "%s", bfs_last_error());
    if (rc == BFS_EDEVICE && (strstr(m, "NoKernelImage") || strstr(m, "UnsupportedPtx") ||
                              strstr(m, "InvalidPtx") || strstr(m, "InvalidSource")))
        return bfs__err_clear(), bfs__err(BFS_EDEVICE,
                        "cuda:%d (compute capability %d.%d): this build has no kernel that runs on it (built for "
                        "%s; PTX is JIT-compiled only by a driver at least as new as the toolkit); rebuild with a "
                        "CUDA toolkit that supports sm_%d, or use --device cpu [%s]",
                        d->id, cc / 10, cc % 10, BFS_CUDA_ARCHS, cc, m);
    return rc;
}
