/*
 * CUDA backend, the devices: making a device current and putting the caller's back
 * (driver entry points through the runtime), telling a lost context, compute capability,
 * why no device can be used (driver messages), bfs__cuda_probe / _built / _device_count,
 * parsing "cuda:N,M", and the start-up self-test that refuses an inexact build.
 */
#include "backend/backend_cuda.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- devices and contexts -------------------------------------------------------------- */
/* The driver's cuDeviceGet / cuDevicePrimaryCtxGetState, through the runtime (no link with
 * libcuda: a missing driver stays a run-time error). NULL when the driver lacks them. */
typedef int (*cu_dev_get_fn)(int *dev, int ordinal);
typedef int (*cu_ctx_state_fn)(int dev, unsigned *flags, int *active);
static pthread_once_t cu_drv_once = PTHREAD_ONCE_INIT;
static cu_dev_get_fn cu_drv_dev_get;
static cu_ctx_state_fn cu_drv_ctx_state;

static void cu_drv_resolve(void)
{
    void *a = NULL, *b = NULL;
#if CUDART_VERSION >= 12050
    if (cudaGetDriverEntryPointByVersion("cuDeviceGet", &a, 12000, cudaEnableDefault, NULL) != cudaSuccess)
        a = NULL;
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &b, 12000, cudaEnableDefault, NULL) !=
        cudaSuccess)
        b = NULL;
#else
    if (cudaGetDriverEntryPoint("cuDeviceGet", &a, cudaEnableDefault, NULL) != cudaSuccess)
        a = NULL;
    if (cudaGetDriverEntryPoint("cuDevicePrimaryCtxGetState", &b, cudaEnableDefault, NULL) != cudaSuccess)
        b = NULL;
#endif
    (void)cudaGetLastError();
    cu_drv_dev_get = (cu_dev_get_fn)a;
    cu_drv_ctx_state = (cu_ctx_state_fn)b;
}

/* 1: device `ordinal` has an active primary context (setting it current costs nothing);
 * 0: it has none, or we cannot tell. */
static int cu_ctx_active(int ordinal)
{
    pthread_once(&cu_drv_once, cu_drv_resolve);
    int dev = 0, active = 0;
    unsigned flags = 0;
    if (!cu_drv_dev_get || !cu_drv_ctx_state || cu_drv_dev_get(&dev, ordinal) != 0 ||
        cu_drv_ctx_state(dev, &flags, &active) != 0)
        return 0;
    return active != 0;
}

/* Make device id current on this thread; *prev: the device to put back (-1: none). */
int bfs__cu_enter(int id, int *prev)
{
    int cur = -1;
    *prev = -1;
    if (cudaGetDevice(&cur) != cudaSuccess) { /* does not create a context */
        (void)cudaGetLastError();
        cur = -1;
    }
    if (cur == id)
        return 0;
    CUDA_CHECK_RET(cudaSetDevice(id));
    *prev = cur;
    return 0;
}

/* Put back the device bfs__cu_enter found, when that costs no new context. */
void bfs__cu_leave(int prev)
{
    if (prev >= 0 && cu_ctx_active(prev) && cudaSetDevice(prev) != cudaSuccess)
        (void)cudaGetLastError();
}

/* After a failed CUDA call on d: is its context gone (a sticky error)? Then remember it. */
bool bfs__cu_check_lost(cu_dev *d)
{
    const cudaError_t e1 = cudaGetLastError(), e2 = cudaGetLastError();
    if (e1 == cudaSuccess || e2 != e1) /* a sticky error comes back on every call */
        return false;
    d->lost = e1;
    return true;
}

/* Compute capability as 10 * major + minor (0 when unknown). */
int bfs__cu_cc(int dev)
{
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return 10 * major + minor;
}

int bfs__cuda_built(void) { return 1; }

/* Why no device can be used: no driver, a driver too old for this build, or what the
 * runtime says. Fills why; returns the runtime's error. Calls nothing that creates a context. */
cudaError_t bfs__cu_why(cudaError_t e, char *why, size_t n)
{
    int drv = 0, rt = CUDART_VERSION;
    if (cudaDriverGetVersion(&drv) != cudaSuccess)
        drv = 0;
    (void)cudaRuntimeGetVersion(&rt);
    (void)cudaGetLastError();
    /* the first driver branch of each CUDA major version */
    const int need = rt >= 13000 ? 580 : rt >= 12000 ? 525 : rt >= 11000 ? 450 : 0;
    if (drv == 0)
        snprintf(why, n,
                 "no NVIDIA driver is loaded (libcuda.so.1 not found, or no GPU driver on this machine: "
                 "nvidia-smi should list the GPUs) [%s]", cudaGetErrorName(e));
    else if (e == cudaErrorInsufficientDriver || drv < rt / 1000 * 1000)
        snprintf(why, n,
                 "the NVIDIA driver supports CUDA %d.%d, this build needs CUDA %d.%d (a driver of branch %d or "
                 "newer): update the driver, or rebuild bfshard with a CUDA toolkit no newer than %d.%d "
                 "(make clean all NVCC=/usr/local/cuda-%d.%d/bin/nvcc) [%s]",
                 drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10, need, drv / 1000, drv % 1000 / 10,
                 drv / 1000, drv % 1000 / 10, cudaGetErrorName(e));
    else if (e == cudaErrorNoDevice)
        snprintf(why, n, "the NVIDIA driver (CUDA %d.%d) finds no GPU (check CUDA_VISIBLE_DEVICES and nvidia-smi) [%s]",
                 drv / 1000, drv % 1000 / 10, cudaGetErrorName(e));
    else
        snprintf(why, n, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    return e;
}

int bfs__cuda_probe(char *why, size_t n)
{
    int count = 0, usable = 0, oldest = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (why && n)
        why[0] = '\0';
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (why && n)
            bfs__cu_why(e, why, n);
        return 0;
    }
    for (int i = 0; i < count; i++) {
        const int cc = bfs__cu_cc(i);
        usable += cc >= CU_MIN_CC;
        if (cc < CU_MIN_CC && (oldest == 0 || cc < oldest))
            oldest = cc;
    }
    if (usable == 0 && why && n) {
        if (count == 0)
            snprintf(why, n, "no CUDA device");
        else
            snprintf(why, n, "%d CUDA device%s, none of compute capability %d.%d or newer (found %d.%d)", count,
                     count == 1 ? "" : "s", CU_MIN_CC / 10, CU_MIN_CC % 10, oldest / 10, oldest % 10);
    }
    return usable;
}

int bfs__cuda_device_count(void) { return bfs__cuda_probe(NULL, 0); }

/* "cuda" -> no ids (first usable device); "cuda:N[,M...]" -> ids. */
int bfs__cu_parse_spec(const char *spec, int *ids, int *n)
{
    *n = 0;
    if (!spec || strncmp(spec, "cuda", 4) != 0 || (spec[4] != '\0' && spec[4] != ':'))
        goto bad;
    if (spec[4] == '\0')
        return 0;
    const char *p = spec + 5;
    for (;;) {
        if (*p < '0' || *p > '9')
            goto bad;
        long v = 0;
        while (*p >= '0' && *p <= '9') {
            v = v * 10 + (*p++ - '0');
            if (v > 1000000)
                goto bad;
        }
        for (int i = 0; i < *n; i++)
            if (ids[i] == (int)v)
                return bfs__err(BFS_EUSAGE, "device '%s': cuda:%ld is named twice", spec, v);
        if (*n == CU_MAX_DEV)
            return bfs__err(BFS_EUSAGE, "device '%s': at most %d CUDA devices", spec, CU_MAX_DEV);
        ids[(*n)++] = (int)v;
        if (*p == '\0')
            return 0;
        if (*p++ != ',')
            goto bad;
    }
bad:
    return bfs__err(BFS_EUSAGE, "device '%s': expected cuda, cuda:N or cuda:N,M,...", spec ? spec : "(null)");
}

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
