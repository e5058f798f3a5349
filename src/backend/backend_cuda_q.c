/*
 * CUDA backend, the work of one unit per format (MXFP4, bnb 4-bit, casts, FP8, INT4,
 * NVFP4, compressed-tensors MX): checking a unit's descriptor into a cu_job (cu_job_init), laying out the
 * input arrays and output of one chunk in a slot (cu_layout), choosing chunk sizes,
 * and the kernel launch of a chunk (cu_launch); GPTQ / AWQ / bitsandbytes 8-bit (J_WOQ) by output
 * rows, gathering the columns of their transposed arrays. The pipeline is backend_cuda.c's.
 */
#include "backend/backend_cuda.h"
#include "../../kernels/ref_woq.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>


static void cu_add(cu_chunk *ch, const uint8_t *src, uint64_t row_bytes, uint64_t nrows, uint64_t stride)
{
    const uint64_t off = ch->ngather ? cu_al(ch->in_bytes) : 0;
    ch->g[ch->ngather++] = (cu_gather){src, row_bytes, nrows, stride, off};
    ch->in_bytes = off + row_bytes * nrows;
}

/* The packed words of output rows [r0, r0 + n) of a GPTQ / AWQ weight: [*w0, *w1) of each
 * row of qzeros (and of AWQ's qweight), whose first field is zero-point code *zr0. */
static void cu_woq_words(const bfs_woq_desc *d, uint64_t r0, uint64_t n, uint64_t *w0, uint64_t *w1, uint64_t *zr0)
{
    const uint64_t per = d->layout == BFS_WOQ_AWQ ? 8 : d->bits == 3 ? 32 : 32 / (uint64_t)d->bits;
    const uint64_t wpb = d->layout == BFS_WOQ_GPTQ && d->bits == 3 ? 3 : 1;
    *w0 = r0 / per * wpb;
    *w1 = ((r0 + n - 1) / per + 1) * wpb;
    *zr0 = r0 / per * per;
}

/* J_WOQ: output rows [pos, pos + n). */
static void bfs__cu_woq_layout(const cu_job *j, uint64_t pos, uint64_t n, cu_chunk *ch)
{
    const bfs_woq_desc *d = &j->t->woq;
    const uint64_t K = d->cols;
    if (d->layout == BFS_WOQ_BNB8) {
        cu_add(ch, d->qweight + pos * K, n * K, 1, 0);
        cu_add(ch, d->scale + pos * 4, n * 4, 1, 0);
    } else if (d->layout == BFS_WOQ_GEMV) { /* row-major: the chunk's rows of each array */
        const uint64_t ss = d->scale_type == BFS_WOQ_F32 ? 4 : 2;
        cu_add(ch, d->qweight + pos * (K / 8) * 4, n * (K / 8) * 4, 1, 0);
        cu_add(ch, d->scale + pos * d->zw * 8 * ss, n * d->zw * 8 * ss, 1, 0);
        cu_add(ch, d->qzeros + pos * d->zw * 4, n * d->zw * 4, 1, 0);
    } else {
        const uint64_t ss = d->scale_type == BFS_WOQ_F32 ? 4 : 2;
        uint64_t w0, w1, zr0;
        cu_woq_words(d, pos, n, &w0, &w1, &zr0);
        if (d->layout == BFS_WOQ_GPTQ)
            cu_add(ch, d->qweight + pos * 4, n * 4, bfs_gptq_kw(d), d->rows * 4);
        else
            cu_add(ch, d->qweight + w0 * 4, (w1 - w0) * 4, K, d->zw * 4);
        cu_add(ch, d->scale + pos * ss, n * ss, d->ngroups, d->rows * ss);
        cu_add(ch, d->qzeros + w0 * 4, (w1 - w0) * 4, d->ngroups, d->zw * 4);
        if (d->g_idx)
            cu_add(ch, d->g_idx, K * 4, 1, 0);
    }
    ch->out_bytes = n * K * 2;
    ch->dst = j->out + (pos - j->first) * K * 2;
}

/* Lay out chunk [pos, pos + n) of j; returns the slot bytes it needs. Shapes
 * were checked in bfs__cu_job_init: none of these products overflows. */
uint64_t bfs__cu_layout(const cu_job *j, uint64_t pos, uint64_t n, cu_chunk *ch)
{
    const bfs_ltensor *t = j->t;
    memset(ch, 0, sizeof *ch);
    ch->pos = pos;
    ch->n = n;
    switch (j->mode) {
    case J_MX_FLAT: /* flat rows [pos, pos + n) */
        cu_add(ch, t->mx.blocks + pos * j->G * 16, n * j->G * 16, 1, 0);
        cu_add(ch, t->mx.scales + pos * j->G, n * j->G, 1, 0);
        ch->out_bytes = n * j->G * 64;
        ch->dst = j->out + (pos - j->first) * j->G * 64;
        break;
    case J_MX_ITEMS: { /* items [pos, pos + n) */
        const uint64_t rg = j->R * j->G;
        cu_add(ch, t->mx.blocks + pos * rg * 16, n * rg * 16, 1, 0);
        cu_add(ch, t->mx.scales + pos * rg, n * rg, 1, 0);
        ch->out_bytes = n * rg * 64;
        ch->dst = j->out + (pos - j->first) * rg * 64;
        break;
    }
    case J_MX_GROUPS: { /* groups [g0, g0 + n) of one item: output rows c in [32 g0, 32 (g0 + n)) */
        const uint64_t e = j->first + pos / j->G, g0 = pos % j->G, rg = j->R * j->G;
        cu_add(ch, t->mx.blocks + (e * rg + g0) * 16, n * 16, j->R, j->G * 16);
        cu_add(ch, t->mx.scales + e * rg + g0, n, j->R, j->G);
        ch->out_bytes = n * 64 * j->R;
        ch->dst = j->out + ((e - j->first) * rg * 64 + g0 * 64 * j->R);
        break;
    }
    case J_BNB: { /* elements [pos, pos + n) */
        const uint64_t last = pos + n - 1, b0 = pos / j->bs, b1 = last / j->bs;
        cu_add(ch, t->bnb.codes + pos / 2, last / 2 - pos / 2 + 1, 1, 0);
        if (j->dq) {
            cu_add(ch, t->bnb.absmax_u8 + b0, b1 - b0 + 1, 1, 0);
            cu_add(ch, (const uint8_t *)(t->bnb.nested_absmax + b0 / j->nbs),
                   (b1 / j->nbs - b0 / j->nbs + 1) * sizeof(float), 1, 0);
        } else {
            cu_add(ch, (const uint8_t *)(t->bnb.absmax_f32 + b0), (b1 - b0 + 1) * sizeof(float), 1, 0);
        }
        ch->out_bytes = n * 2;
        ch->dst = j->out + (pos - j->first) * 2;
        break;
    }
    case J_CAST:
        cu_add(ch, t->src[0]->data + pos * j->es, n * j->es, 1, 0);
        ch->out_bytes = n * 2;
        ch->dst = j->out + (pos - j->first) * 2;
        break;
    case J_FP8: { /* elements [pos, pos + n); grid rows of their rows */
        const bfs_fp8_desc *d = &t->fp8;
        const uint64_t ra = pos / d->cols, rb = (pos + n - 1) / d->cols, gcols = (d->cols + d->bw - 1) / d->bw;
        const uint64_t ss = bfs_scale_size(d->scale_type), g0 = ra / d->bh, g1 = rb / d->bh;
        cu_add(ch, d->w + pos, n, 1, 0);
        cu_add(ch, d->scale + g0 * gcols * ss, (g1 - g0 + 1) * gcols * ss, 1, 0);
        ch->out_bytes = n * 2;
        ch->dst = j->out + (pos - j->first) * 2;
        break;
    }
    case J_INT4: { /* the words, scale rows and zero-point rows of elements [pos, pos + n) */
        const bfs_int4_desc *d = &t->int4;
        const uint64_t last = pos + n - 1, ra = pos / d->cols, rb = last / d->cols;
        const uint64_t w0 = ra * d->wpr + (pos % d->cols) / 8, w1 = rb * d->wpr + (last % d->cols) / 8;
        const uint64_t ss = d->scale_bf16 ? 2 : 4;
        cu_add(ch, d->packed + w0 * 4, (w1 - w0 + 1) * 4, 1, 0);
        cu_add(ch, d->scale + ra * d->ngroups * ss, (rb - ra + 1) * d->ngroups * ss, 1, 0);
        if (d->zp)
            cu_add(ch, d->zp + (ra / 8) * d->ngroups * 4, (rb / 8 - ra / 8 + 1) * d->ngroups * 4, 1, 0);
        ch->out_bytes = n * 2;
        ch->dst = j->out + (pos - j->first) * 2;
        break;
    }
    case J_NVFP4: { /* the code bytes and E4M3 scales of elements [pos, pos + n) */
        const bfs_nvfp4_desc *d = &t->nv;
        const uint64_t last = pos + n - 1, half = d->cols / 2, nblk = d->cols / 16;
        const uint64_t b0 = (pos / d->cols) * half + (pos % d->cols) / 2;
        const uint64_t b1 = (last / d->cols) * half + (last % d->cols) / 2;
        const uint64_t s0 = (pos / d->cols) * nblk + (pos % d->cols) / 16;
        const uint64_t s1 = (last / d->cols) * nblk + (last % d->cols) / 16;
        cu_add(ch, d->packed + b0, b1 - b0 + 1, 1, 0);
        cu_add(ch, d->scale + s0, s1 - s0 + 1, 1, 0);
        ch->out_bytes = n * 2;
        ch->dst = j->out + (pos - j->first) * 2;
        break;
    }
    case J_CTMX: { /* the element bytes and E8M0 scales of elements [pos, pos + n) */
        const bfs_ctmx_desc *d = &t->ctmx;
        const uint64_t last = pos + n - 1;
        const uint64_t b0 = bfs_ctmx_byte(d->elem, pos), b1 = bfs_ctmx_byte(d->elem, last) + (d->elem == BFS_CTMX_E2M3 ? 2 : 0);
        cu_add(ch, d->w + b0, b1 - b0 + 1, 1, 0);
        cu_add(ch, d->scale + pos / 32, last / 32 - pos / 32 + 1, 1, 0);
        ch->out_bytes = n * 2;
        ch->dst = j->out + (pos - j->first) * 2;
        break;
    }
    case J_WOQ:
        bfs__cu_woq_layout(j, pos, n, ch);
        break;
    }
    ch->out_off = cu_al(ch->in_bytes);
    return ch->out_off + cu_al(ch->out_bytes);
}

uint64_t bfs__cu_fp(const cu_job *j, uint64_t pos, uint64_t n)
{
    cu_chunk ch;
    return bfs__cu_layout(j, pos, n, &ch);
}

/* Granules a chunk may take from pos. */
static uint64_t cu_room(const cu_job *j, uint64_t pos)
{
    const uint64_t left = j->end - pos;
    if (j->mode == J_MX_GROUPS) {
        const uint64_t in_item = j->G - pos % j->G;
        return left < in_item ? left : in_item;
    }
    return left;
}

const char *bfs__cu_what(const cu_job *j)
{
    switch (j->mode) {
    case J_MX_FLAT: return "MXFP4 row";
    case J_MX_ITEMS: return "MXFP4 item";
    case J_MX_GROUPS: return "MXFP4 32-column group";
    case J_BNB: return "bnb 4-bit element";
    case J_FP8: return "FP8 element";
    case J_INT4: return "INT4 element";
    case J_NVFP4: return "NVFP4 element";
    case J_CTMX: return "MX element";
    case J_WOQ: return "GPTQ / AWQ / 8-bit output row";
    default: return "element";
    }
}

/* The minimal chunk (one granule) does not fit a slot: say what would. */
static int cu_too_small(const cu_backend *b, const cu_job *j, uint64_t need)
{
    if (b->slot < b->slot_budget)
        return bfs__err(BFS_EINPUT,
                        "tensor %s: one %s needs %" PRIu64 " bytes of device buffer, more than the "
                        "CUDA backend stages at once (%" PRIu64 " bytes); convert it with the CPU backend",
                        j->t->name, bfs__cu_what(j), need, b->slot);
    return bfs__err(BFS_ENOMEM,
                    "tensor %s: the CUDA buffer budget of %" PRIu64 " bytes (--gpu-mem) is too small for "
                    "one %s (%" PRIu64 " bytes, double buffered); a budget of at least %" PRIu64
                    " bytes works",
                    j->t->name, b->budget, bfs__cu_what(j), need, CU_CONST_BYTES + 2 * cu_al(need));
}

/* Granules for the chunk at pos: as many as fit cap (at least one, which must fit a slot). */
int bfs__cu_choose(const cu_backend *b, const cu_job *j, uint64_t pos, uint64_t cap, uint64_t *n)
{
    const uint64_t room = cu_room(j, pos);
    const uint64_t one = bfs__cu_fp(j, pos, 1);
    if (one > b->slot)
        return cu_too_small(b, j, one);
    uint64_t lo = 1, hi = room;
    if (bfs__cu_fp(j, pos, hi) <= cap) {
        lo = hi;
    } else {
        while (hi - lo > 1) { /* bfs__cu_fp(lo) <= cap (or lo == 1), bfs__cu_fp(hi) > cap */
            const uint64_t mid = lo + (hi - lo) / 2;
            if (bfs__cu_fp(j, pos, mid) <= cap)
                lo = mid;
            else
                hi = mid;
        }
    }
    if (j->prefer > 1 && lo < room) {
        const uint64_t e = (pos + lo) / j->prefer * j->prefer;
        if (e > pos)
            lo = e - pos;
    }
    *n = lo;
    return 0;
}

int bfs__cu_job_init(const cu_backend *b, const bfs_unit *u, cu_job *j)
{
    const bfs_ltensor *t = u->t;
    uint64_t e0, e1, x;
    memset(j, 0, sizeof *j);
    j->t = t;
    j->out = (uint8_t *)u->out;
    if (!bfs__mul_ok(u->row0, t->row_elems, &e0) || !bfs__mul_ok(u->row1, t->row_elems, &e1) ||
        !bfs__mul_ok(e1, 8, &x))
        return bfs__err(BFS_EINTERNAL, "tensor %s: unit size overflows", t->name);
    if (t->out_dtype != BFS_DT_BF16)
        return bfs__err(BFS_EINTERNAL, "tensor %s: the CUDA backend writes BF16 only", t->name);
    switch (t->kind) {
    case BFS_K_MXFP4: {
        const bfs_mxfp4_desc *m = &t->mx;
        j->R = m->R;
        j->G = m->G;
        if (!m->blocks || !m->scales || m->R == 0 || m->G == 0 || !bfs__mul_ok(m->R, m->G, &x) ||
            !bfs__mul_ok(x, 64, &x) || (m->transpose != 0 && m->transpose != 1))
            return bfs__err(BFS_EINTERNAL, "tensor %s: bad MXFP4 descriptor", t->name);
        if (t->mx_items) {
            if (t->row_elems != m->R * m->G * 32)
                return bfs__err(BFS_EINTERNAL, "tensor %s: MXFP4 item of %" PRIu64 " elements, not R*G*32",
                                t->name, t->row_elems);
            if (m->transpose) {
                j->mode = J_MX_ITEMS; /* may become J_MX_GROUPS in cu_run */
                j->pos = j->first = u->row0;
                j->end = u->row1;
            } else {
                j->mode = J_MX_FLAT;
                j->pos = j->first = u->row0 * m->R;
                j->end = u->row1 * m->R;
            }
        } else {
            if (m->transpose || t->row_elems != m->G * 32 || t->d0 != m->R)
                return bfs__err(BFS_EINTERNAL, "tensor %s: bad 3-d MXFP4 descriptor", t->name);
            j->mode = J_MX_FLAT;
            j->pos = j->first = u->row0;
            j->end = u->row1;
        }
        return 0;
    }
    case BFS_K_BNB4: {
        const bfs_bnb4_desc *q = &t->bnb;
        j->mode = J_BNB;
        j->dq = q->absmax_u8 != NULL;
        j->bs = q->blocksize;
        j->nbs = q->nested_blocksize;
        if (!q->codes || q->blocksize == 0 || (!j->dq && !q->absmax_f32) ||
            (j->dq && (!q->nested_code || !q->nested_absmax || q->nested_blocksize == 0)))
            return bfs__err(BFS_EINTERNAL, "tensor %s: bad bnb 4-bit descriptor", t->name);
        j->pos = j->first = e0;
        j->end = e1;
        /* chunks end where no code byte, absmax or nested absmax is shared with the next */
        j->prefer = j->dq ? j->bs * j->nbs : j->bs;
        if (j->prefer % 2)
            j->prefer *= 2;
        if (j->prefer > ((uint64_t)1 << 40))
            j->prefer = 2;
        return 0;
    }
    case BFS_K_CAST:
        j->mode = J_CAST;
        j->es = t->src_dtype == BFS_DT_F32 ? 4 : t->src_dtype == BFS_DT_F16 ? 2 : t->src_dtype == BFS_DT_F64 ? 8 : 0;
        if (!j->es || t->nsrc < 1 || !t->src[0] || !t->src[0]->data)
            return bfs__err(BFS_EINTERNAL, "tensor %s: bad cast (dtype %d)", t->name, (int)t->src_dtype);
        j->cast = bfs__cast_src(t->src_dtype);
        j->pos = j->first = e0;
        j->end = e1;
        return 0;
    case BFS_K_FP8: {
        const bfs_fp8_desc *d = &t->fp8;
        j->mode = J_FP8;
        /* a logical row is one kernel row, or `out` of them (fused experts [E, out, in]) */
        if (!d->w || !d->scale || d->cols == 0 || d->bh == 0 || d->bw == 0 || t->row_elems % d->cols != 0)
            return bfs__err(BFS_EINTERNAL, "tensor %s: bad FP8 descriptor", t->name);
        break;
    }
    case BFS_K_INT4: {
        const bfs_int4_desc *d = &t->int4;
        j->mode = J_INT4;
        if (!d->packed || !d->scale || d->cols == 0 || d->group_size == 0 || d->ngroups == 0 ||
            d->wpr != (d->cols + 7) / 8 || t->row_elems != d->cols)
            return bfs__err(BFS_EINTERNAL, "tensor %s: bad INT4 descriptor", t->name);
        break;
    }
    case BFS_K_NVFP4: {
        const bfs_nvfp4_desc *d = &t->nv;
        j->mode = J_NVFP4;
        if (!d->packed || !d->scale || d->cols == 0 || d->cols % 16 != 0 || t->row_elems != d->cols)
            return bfs__err(BFS_EINTERNAL, "tensor %s: bad NVFP4 descriptor", t->name);
        break;
    }
    case BFS_K_CTMX: {
        const bfs_ctmx_desc *d = &t->ctmx;
        j->mode = J_CTMX;
        if (!d->w || !d->scale || d->cols == 0 || d->cols % 32 != 0 || (d->elem != BFS_CTMX_E4M3 && d->elem != BFS_CTMX_E2M1 && d->elem != BFS_CTMX_E2M3) ||
            t->row_elems != d->cols)
            return bfs__err(BFS_EINTERNAL, "tensor %s: bad MX descriptor", t->name);
        break;
    }
    case BFS_K_WOQ: {
        const bfs_woq_desc *d = &t->woq;
        j->mode = J_WOQ;
        if (!d->qweight || !d->scale || d->cols == 0 || d->rows == 0 || t->row_elems != d->cols || t->d0 != d->rows ||
            (d->layout != BFS_WOQ_BNB8 && (!d->qzeros || d->zw == 0 || d->ngroups == 0 || d->group_size == 0)))
            return bfs__err(BFS_EINTERNAL, "tensor %s: bad GPTQ / AWQ / 8-bit descriptor", t->name);
        j->pos = j->first = u->row0; /* granules: output rows */
        j->end = u->row1;
        j->prefer = 1;
        return 0;
    }
    default:
        return bfs__err(BFS_EINTERNAL, "tensor %s: kind %d on the CUDA backend", t->name, (int)t->kind);
    }
    /* FP8 / INT4 / NVFP4 / MX: element ranges; chunks end on row ends when they can (no packed
     * word, scale or zero-point row sent twice but the block grid's) */
    j->pos = j->first = e0;
    j->end = e1;
    j->prefer = t->row_elems <= ((uint64_t)1 << 40) ? t->row_elems : 2;
    return 0;
}


int bfs__cu_launch(const cu_job *j, const cu_chunk *ch, const cu_dev *d, uint8_t *ds)
{
    const bfs_ltensor *t = j->t;
    uint16_t *out = (uint16_t *)(ds + ch->out_off);
    switch (j->mode) {
    case J_MX_FLAT:
        return bfs__cu_mxfp4(ds + ch->g[0].off, ds + ch->g[1].off, 1, ch->n, j->G, 0, out, d->s_comp);
    case J_MX_ITEMS:
        return bfs__cu_mxfp4(ds + ch->g[0].off, ds + ch->g[1].off, ch->n, j->R, j->G, 1, out, d->s_comp);
    case J_MX_GROUPS:
        return bfs__cu_mxfp4(ds + ch->g[0].off, ds + ch->g[1].off, 1, j->R, ch->n, 1, out, d->s_comp);
    case J_BNB: {
        const uint64_t b0 = ch->pos / j->bs;
        bfs_cu_bnb4_args a;
        memset(&a, 0, sizeof a);
        a.codes = ds + ch->g[0].off;
        a.parity = (unsigned)(ch->pos & 1);
        a.n = ch->n;
        a.block_off = ch->pos - b0 * j->bs;
        a.blocksize = j->bs;
        if (j->dq) {
            a.absmax_u8 = ds + ch->g[1].off;
            a.nested_absmax = (const float *)(ds + ch->g[2].off);
            a.nested_off = b0 % j->nbs;
            a.nested_blocksize = j->nbs;
            a.offset = t->bnb.offset;
            a.nested_code = (const float *)(d->d_arena + CU_NCODE_OFF);
        } else {
            a.absmax_f32 = (const float *)(ds + ch->g[1].off);
        }
        a.table = (const float *)d->d_arena;
        a.out = out;
        return bfs__cu_bnb4(&a, d->s_comp);
    }
    case J_FP8: {
        const bfs_fp8_desc *q = &t->fp8;
        bfs_cu_fp8_args a;
        memset(&a, 0, sizeof a);
        a.w = ds + ch->g[0].off;
        a.scale = ds + ch->g[1].off;
        a.scale_type = q->scale_type;
        a.e0 = ch->pos;
        a.g0 = (ch->pos / q->cols) / q->bh;
        a.n = ch->n;
        a.cols = q->cols;
        a.bh = q->bh;
        a.bw = q->bw;
        a.out = out;
        return bfs__cu_fp8(&a, d->s_comp);
    }
    case J_INT4: {
        const bfs_int4_desc *q = &t->int4;
        bfs_cu_int4_args a;
        memset(&a, 0, sizeof a);
        a.packed = ds + ch->g[0].off;
        a.scale = ds + ch->g[1].off;
        a.zp = q->zp ? ds + ch->g[2].off : NULL;
        a.scale_bf16 = q->scale_bf16;
        a.e0 = ch->pos;
        a.r0 = ch->pos / q->cols;
        a.w0 = a.r0 * q->wpr + (ch->pos % q->cols) / 8;
        a.z0 = a.r0 / 8;
        a.n = ch->n;
        a.cols = q->cols;
        a.wpr = q->wpr;
        a.ngroups = q->ngroups;
        a.group_size = q->group_size;
        a.out = out;
        return bfs__cu_int4(&a, d->s_comp);
    }
    case J_NVFP4: {
        const bfs_nvfp4_desc *q = &t->nv;
        bfs_cu_nvfp4_args a;
        memset(&a, 0, sizeof a);
        a.packed = ds + ch->g[0].off;
        a.scale = ds + ch->g[1].off;
        a.bs = (const float *)d->d_arena; /* the block scales (backend_cuda_pipe.c) */
        a.modelopt = q->modelopt;
        a.e0 = ch->pos;
        a.b0 = (ch->pos / q->cols) * (q->cols / 2) + (ch->pos % q->cols) / 2;
        a.s0 = (ch->pos / q->cols) * (q->cols / 16) + (ch->pos % q->cols) / 16;
        a.n = ch->n;
        a.cols = q->cols;
        a.out = out;
        return bfs__cu_nvfp4(&a, d->s_comp);
    }
    case J_CTMX: {
        const bfs_ctmx_desc *q = &t->ctmx;
        bfs_cu_ctmx_args a;
        memset(&a, 0, sizeof a);
        a.w = ds + ch->g[0].off;
        a.scale = ds + ch->g[1].off;
        a.elem = q->elem;
        a.nan255 = q->nan255;
        a.e0 = ch->pos;
        a.b0 = bfs_ctmx_byte(q->elem, ch->pos);
        a.s0 = ch->pos / 32;
        a.n = ch->n;
        a.cols = q->cols;
        a.out = out;
        return bfs__cu_ctmx(&a, d->s_comp);
    }
    case J_WOQ: {
        const bfs_woq_desc *q = &t->woq;
        bfs_cu_woq_args a;
        memset(&a, 0, sizeof a);
        a.qweight = ds + ch->g[0].off;
        a.scale = ds + ch->g[1].off;
        a.layout = q->layout;
        a.bits = q->bits;
        a.v1 = q->v1;
        a.scale_type = q->scale_type;
        a.r0 = ch->pos;
        a.nrows = ch->n;
        a.cols = q->cols;
        a.n = ch->n * q->cols;
        a.group_size = q->group_size;
        a.out = out;
        if (q->layout == BFS_WOQ_GEMV) {
            a.qzeros = ds + ch->g[2].off;
            a.zc = q->zw;
            a.zr0 = ch->pos;
        } else if (q->layout != BFS_WOQ_BNB8) {
            uint64_t w0, w1, zr0;
            cu_woq_words(q, ch->pos, ch->n, &w0, &w1, &zr0);
            a.qzeros = ds + ch->g[2].off;
            a.g_idx = q->g_idx ? ds + ch->g[3].off : NULL;
            a.zc = (size_t)(w1 - w0);
            a.zr0 = zr0;
        }
        return bfs__cu_woq(&a, d->s_comp);
    }
    default:
        return bfs__cu_cast(ds + ch->g[0].off, j->cast, ch->n, out, d->s_comp);
    }
}
