/*
 * THE CPU reference (level BFS_CPU_SCALAR, bfs__cpu_scalar_ops): plain loops over
 * kernels/ref.h. Every other implementation (AVX2, AVX-512, CUDA) is checked against
 * these bytes with memcmp: per op in tests/test_kernels.c, per unit through
 * bfs__ref_unit (src/backend_cpu.c) in tests/test_kernels.c and tests/test_cuda.c.
 * The SIMD kernels also use it for their tails. Written for clarity, not speed.
 */
#include "bfs_kernels.h"
#include "ref.h"
#include "ref_formats.h"
#include "ref_woq.h"

#include <assert.h>
#include <string.h>

static void mxfp4_scalar(const bfs_mxfp4_desc *d, size_t item, size_t o0, size_t o1,
                         uint16_t *out)
{
    const size_t R = d->R, G = d->G, C = G * 32;
    const uint8_t *const blocks = d->blocks + item * R * G * 16;
    const uint8_t *const scales = d->scales + item * R * G;
    assert(o0 <= o1 && o1 <= (d->transpose ? C : R));

    if (!d->transpose) { /* out is [o1-o0][C] */
        for (size_t r = o0; r < o1; r++)
            for (size_t g = 0; g < G; g++) {
                const float scale = bfs_e8m0_to_f32(scales[r * G + g]);
                const uint8_t *const blk = blocks + (r * G + g) * 16;
                uint16_t *const o = out + (r - o0) * C + g * 32;
                for (size_t j = 0; j < 32; j++)
                    o[j] = bfs_mxfp4_value(bfs_mxfp4_code(blk, j), scale);
            }
        return;
    }
    /* transpose: out is [o1-o0][R], out row c holds column c of the item */
    for (size_t c = o0; c < o1; c++) {
        const size_t g = c / 32;
        uint16_t *const o = out + (c - o0) * R;
        for (size_t r = 0; r < R; r++)
            o[r] = bfs_mxfp4_value(bfs_mxfp4_code(blocks + (r * G + g) * 16, c % 32),
                                   bfs_e8m0_to_f32(scales[r * G + g]));
    }
}

static float bnb4_scale(const bfs_bnb4_desc *d, size_t b)
{
    if (!d->absmax_u8)
        return bfs_ld_f32(d->absmax_f32, b);
    return bfs_bnb4_dq_scale(bfs_ld_f32(d->nested_code, d->absmax_u8[b]),
                             bfs_ld_f32(d->nested_absmax, b / d->nested_blocksize), d->offset);
}

static void bnb4_scalar(const bfs_bnb4_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    assert(i0 <= i1 && d->blocksize > 0);
    assert(d->absmax_u8 ? d->nested_blocksize > 0 : d->absmax_f32 != NULL);
    for (size_t i = i0; i < i1;) {
        const size_t b = i / d->blocksize;
        const size_t end = (b + 1) * d->blocksize < i1 ? (b + 1) * d->blocksize : i1;
        const float scale = bnb4_scale(d, b);
        for (; i < end; i++)
            out[i - i0] = bfs_bnb4_value(d->table[bfs_bnb4_code(d->codes, i)], scale);
    }
}

static void f32_to_bf16_scalar(const void *in, size_t n, uint16_t *out)
{
    const unsigned char *p = in;
    for (size_t i = 0; i < n; i++) {
        float f;
        memcpy(&f, p + i * sizeof f, sizeof f);
        out[i] = bfs_bf16_from_f32(f);
    }
}

static void f16_to_bf16_scalar(const void *in, size_t n, uint16_t *out)
{
    const unsigned char *p = in;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + i * sizeof h, sizeof h);
        out[i] = bfs_bf16_from_f32(bfs_f32_from_f16(h));
    }
}

static void f64_to_bf16_scalar(const void *in, size_t n, uint16_t *out)
{
    const unsigned char *p = in;
    for (size_t i = 0; i < n; i++) {
        double v;
        memcpy(&v, p + i * sizeof v, sizeof v);
        out[i] = bfs_bf16_from_f32((float)v); /* round to float32 first, as torch does */
    }
}

/* ---- FP8, INT4, NVFP4: element by element over ref_formats.h, a row segment at a time */
void bfs__fp8_scalar(const bfs_fp8_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    assert(i0 <= i1 && d->cols > 0 && d->bh > 0 && d->bw > 0);
    for (size_t i = i0; i < i1; i++)
        out[i - i0] = bfs_fp8_elem(d, i / d->cols, i % d->cols);
}

void bfs__int4_scalar(const bfs_int4_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    assert(i0 <= i1 && d->cols > 0 && d->group_size > 0 && d->group_size * d->ngroups == d->cols);
    for (size_t i = i0; i < i1; i++)
        out[i - i0] = bfs_int4_elem(d, i / d->cols, i % d->cols);
}

void bfs__nvfp4_scalar(const bfs_nvfp4_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    assert(i0 <= i1 && d->cols > 0 && d->cols % 16 == 0);
    for (size_t i = i0; i < i1; i++)
        out[i - i0] = bfs_nvfp4_elem(d, i / d->cols, i % d->cols);
}

void bfs__ctmx_scalar(const bfs_ctmx_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    assert(i0 <= i1 && d->cols > 0 && d->cols % 32 == 0);
    for (size_t i = i0; i < i1; i++)
        out[i - i0] = bfs_ctmx_elem(d, i);
}

/* ---- GPTQ, AWQ, bitsandbytes 8-bit (ref_woq.h) ---- */
void bfs__woq_scalar(const bfs_woq_desc *d, size_t i0, size_t i1, uint16_t *out)
{
    assert(i0 <= i1 && d->cols > 0 && d->rows > 0);
    for (size_t i = i0; i < i1; i++)
        out[i - i0] = bfs_woq_elem(d, i / d->cols, i % d->cols);
}

const bfs_kernel_ops bfs__cpu_scalar_ops = {
    .name = "scalar",
    .level = BFS_CPU_SCALAR,
    .mxfp4 = mxfp4_scalar,
    .bnb4 = bnb4_scalar,
    .f32_to_bf16 = f32_to_bf16_scalar,
    .f16_to_bf16 = f16_to_bf16_scalar,
    .f64_to_bf16 = f64_to_bf16_scalar,
    .fp8 = bfs__fp8_scalar,
    .int4 = bfs__int4_scalar,
    .nvfp4 = bfs__nvfp4_scalar,
    .ctmx = bfs__ctmx_scalar,
    .woq = bfs__woq_scalar,
};
