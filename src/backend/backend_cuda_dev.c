/*
 * CUDA backend, the devices: making a device current and putting the caller's back
 * (driver entry points through the runtime), telling a lost context, compute capability,
 * why no device can be used (driver messages), bfs__cuda_probe / _built / _device_count,
 * and parsing "cuda:N,M". (The start-up self-test: backend_cuda_selftest.c.)
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
