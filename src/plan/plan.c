/*
 * Plan: group raw tensors into logical output tensors by trying the format
 * table (src/formats/table.c) over them, then lay out every output file
 * (complete header, offsets, size) before any data moves.
 *
 * First the input's quantization claim (config.json, quantize_config.json) is
 * resolved and judged (src/formats/refuse.c) and every format's detect() sees it.
 * Grouping (shared/FORMATS.md), two passes over the raw tensors in name order:
 *   1. every format's claim(): a tensor that anchors a group of that format
 *      (MXFP4 X_blocks, a bitsandbytes quant_state blob) becomes one output
 *      tensor and marks its sources used;
 *   2. every tensor left unused goes through the formats' leftover() in table
 *      order: one that looks like a stray piece of a format is an error, an
 *      activation / KV-cache scale of a quantized checkpoint is dropped (listed
 *      in plan->dropped), the rest passes through (cast to BF16 or copied, the
 *      last row).
 * Between the passes the groups are checked against the claim (refuse.c).
 * Output names must be unique; the plan is sorted by output name.
 */
#include "plan/plan.h"
#include "formats/format.h"
#include "input/safetensors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bfs__cmp_lt(const void *a, const void *b)
{
    const bfs_ltensor *x = a, *y = b;
    return strcmp(x->name, y->name);
}

void bfs__plan_free(bfs_plan *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->nt; i++)
        free(p->t[i].name);
    free(p->t);
    for (size_t i = 0; i < p->nmembers; i++)
        free(p->members[i].name);
    free(p->members);
    for (int f = 0; f < p->nfiles; f++) {
        free(p->files[f].name);
        free(p->files[f].pieces);
    }
    free(p->files);
    free(p->dropped);
    free(p->name_jlen);
    free(p->dcp_n);
    free(p->dcp_order);
    free(p);
}

/* The formats' view of the input: config.json parsed once (validated by input.c). */
static int bfs__fctx_open(const bfs_input *in, const bfs_convert_opts *o, bfs_fctx *c, json_t **cfg)
{
    *cfg = NULL;
    *c = (bfs_fctx){.in = in, .o = o};
    bfs__supported_list(c->supported, sizeof c->supported);
    if (!in->config_json)
        return 0;
    *cfg = json_loads(in->config_json, 0, NULL);
    if (!*cfg)
        return bfs__err(BFS_ENOMEM, "out of memory");
    c->config = *cfg;
    return 0;
}

int bfs__plan_tensors(const bfs_input *in, const bfs_convert_opts *o, bfs_plan **out)
{
    int rc = 0;
    bfs_fctx c;
    bfs_qclaim own = {NULL, NULL, NULL};
    json_t *cfg = NULL;
    bfs_plan *p = calloc(1, sizeof *p);
    *out = NULL;
    if (!p)
        return bfs__err(BFS_ENOMEM, "out of memory");
    p->t = calloc(in->nraw ? in->nraw : 1, sizeof *p->t);
    p->dropped = calloc(in->nraw ? in->nraw : 1, sizeof *p->dropped);
    if (!p->t || !p->dropped)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__fctx_open(in, o, &c, &cfg));
    BFS_TRY(bfs__quant_claim(&c, &own));
    for (const bfs_format *const *f = bfs__formats; *f; f++)
        if ((*f)->detect)
            BFS_TRY((*f)->detect(&c));
    for (size_t i = 0; i < in->nraw; i++)
        ((bfs_raw *)&in->raw[i])->used = 0;

    /* pass 1: groups anchored by one of their tensors; the claimed format tries first,
     * so of two formats that share a tensor layout the one the config names takes it */
    for (size_t i = 0; i < in->nraw; i++) {
        bfs_raw *r = (bfs_raw *)&in->raw[i];
        for (int k = -1; k < 0 || bfs__formats[k]; k++) { /* -1: the claimed format */
            const bfs_format *fmt = k < 0 ? c.claim : bfs__formats[k];
            if (!fmt || !fmt->claim || (k >= 0 && fmt == c.claim))
                continue;
            memset(&p->t[p->nt], 0, sizeof p->t[p->nt]); /* nothing of a claim that did not take it */
            BFS_TRY(fmt->claim(&c, r, &p->t[p->nt]));
            if (rc > 0) {
                p->t[p->nt].by = fmt;
                p->nt++;
                break;
            }
        }
    }
    BFS_TRY(bfs__quant_check_groups(&c, p->t, p->nt));
    /* pass 2: leftovers; the last format takes whatever the others do not refuse */
    for (size_t i = 0; i < in->nraw; i++) {
        bfs_raw *r = (bfs_raw *)&in->raw[i];
        if (r->used)
            continue;
        rc = 0;
        for (const bfs_format *const *f = bfs__formats; *f && rc == 0; f++)
            if ((*f)->leftover) {
                memset(&p->t[p->nt], 0, sizeof p->t[p->nt]);
                BFS_TRY((*f)->leftover(&c, r, &p->t[p->nt]));
            }
        if (rc == 0)
            BFS_FAIL(BFS_EINTERNAL, "tensor \"%s\": no format took it", r->st->name);
        if (rc == 2) /* dropped: no output tensor (raw names are sorted, so is the list) */
            p->dropped[p->ndropped++] = r->st->name;
        else
            p->nt++;
    }
    rc = 0;
    if (p->nt < in->nraw) { /* a quantized input: fewer output tensors than input ones */
        bfs_ltensor *q = realloc(p->t, (p->nt ? p->nt : 1) * sizeof *p->t);
        if (q)
            p->t = q;
    }
    /* Every output shape, before it can reach a header: each dimension and the product of the
     * non-zero ones in output bytes fit an int64 (a zero-element tensor, say E = 0 MXFP4
     * experts, has no bytes to bound its other dimensions). */
    for (size_t i = 0; i < p->nt; i++) {
        const bfs_ltensor *t = &p->t[i];
        if (!bfs__shape_ok(t->shape, t->ndim, bfs__dtype_size(t->out_dtype))) {
            char shp[256];
            bfs__shape_str(t->shape, t->ndim, shp, sizeof shp);
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): output tensor \"%s\" of shape %s (%s) is too large: its size overflows",
                     bfs__raw_path(in, t->src[0]), t->src[0]->st->name, (unsigned long long)t->src[0]->file_offset,
                     t->name, shp, bfs__dtype_name(t->out_dtype));
        }
    }
    {
        const json_t *mt = cfg ? json_object_get(cfg, "model_type") : NULL;
        const char *mts = json_is_string(mt) ? json_string_value(mt) : NULL;
        BFS_TRY(bfs__plan_fp32(p, mts, o->keep_dtype != 0)); /* on checkpoint names, before the names pass */
        BFS_TRY(bfs__plan_names(p, mts, o->names, o->layout));
        if (o->names == BFS_NAMES_TORCHTITAN)
            BFS_TRY(bfs__plan_torchtitan(p, mts, o->layout == BFS_LAYOUT_DCP ? o->world_size : 1));
    }
    qsort(p->t, p->nt, sizeof *p->t, bfs__cmp_lt);
    for (size_t i = 1; i < p->nt; i++)
        if (strcmp(p->t[i - 1].name, p->t[i].name) == 0)
            BFS_FAIL(BFS_EINPUT, "two input groups produce the output tensor \"%s\" (e.g. both \"%s\" and \"%s\")",
                     p->t[i].name, p->t[i - 1].src[0]->st->name, p->t[i].src[0]->st->name);
    for (size_t i = 0; i < p->nt; i++) {
        const bfs_ltensor *t = &p->t[i];
        const uint64_t rb = bfs__sub_row_bytes(t); /* a unit's row: a packed tensor's member's */
        if (t->d0 > 0 && rb > p->max_row_bytes) /* a zero-element tensor needs no buffer */
            p->max_row_bytes = rb;
    }
    *out = p;
    p = NULL;
cleanup:
    bfs__qclaim_free(&own);
    json_decref(cfg);
    bfs__plan_free(p);
    return rc;
}

/* ---- layout ------------------------------------------------------------------------- */
static size_t bfs__align_of(bfs_dtype d) { return bfs__dtype_size(d); }

static int bfs__cmp_file_order(const void *a, const void *b, void *arg)
{
    const bfs_plan *p = arg;
    const bfs_piece *x = a, *y = b;
    const bfs_ltensor *tx = &p->t[x->tensor], *ty = &p->t[y->tensor];
    const size_t ax = bfs__align_of(tx->out_dtype), ay = bfs__align_of(ty->out_dtype);
    if (ax != ay)
        return ax > ay ? -1 : 1; /* as the upstream writer: alignment desc, then name */
    return strcmp(tx->name, ty->name);
}

/* The pieces' bytes and offsets from `at` (their file order); *end: where the data ends;
 * f's largest piece and row. */
static int bfs__place_pieces(const bfs_plan *p, bfs_outfile *f, uint64_t at, uint64_t *end)
{
    uint64_t pos = at;
    f->max_piece = f->max_row = 0;
    for (size_t i = 0; i < f->npieces; i++) {
        bfs_piece *pc = &f->pieces[i];
        const bfs_ltensor *t = &p->t[pc->tensor];
        const uint64_t rb = t->row_elems * bfs__dtype_size(t->out_dtype);
        pc->nbytes = (pc->row1 - pc->row0) * rb;
        pc->offset = pos;
        if (!bfs__add_ok(pos, pc->nbytes, &pos) || pos > BFS_MAX_EXTENT)
            return bfs__err(BFS_EINPUT, "%s: tensor \"%s\": the file's data would exceed %llu bytes", f->name, t->name,
                            (unsigned long long)BFS_MAX_EXTENT);
        f->max_piece = pc->nbytes > f->max_piece ? pc->nbytes : f->max_piece;
        if (pc->row1 > pc->row0 && bfs__sub_row_bytes(t) > f->max_row) /* a unit's smallest */
            f->max_row = bfs__sub_row_bytes(t);
    }
    *end = pos;
    return 0;
}

/* One file's offsets and size from its pieces (already in file order); its header is
 * counted, not kept. */
static int bfs__finish_file(bfs_plan *p, bfs_outfile *f)
{
    uint64_t pos = 0;
    const int prc = bfs__place_pieces(p, f, 0, &pos); /* relative for now */
    if (prc < 0)
        return prc;
    uint64_t hl = 0;
    const int hrc = bfs__plan_header_len(p, f, &hl); /* counted, not kept */
    if (hrc < 0)
        return hrc;
    f->data_start = 8 + hl;
    for (size_t i = 0; i < f->npieces; i++)
        f->pieces[i].offset += f->data_start;
    if (!bfs__add_ok(f->data_start, pos, &f->size) || f->size > BFS_MAX_EXTENT ||
        !bfs__add_ok(p->total_bytes, pos, &p->total_bytes) || p->total_bytes > BFS_MAX_EXTENT)
        return bfs__err(BFS_EINPUT, "%s: the output would exceed %llu bytes", f->name, (unsigned long long)BFS_MAX_EXTENT);
    return 0;
}

/* Pieces in file order, as the upstream writer: alignment (dtype size) descending, then
 * name. The plan's tensors are sorted by name and a file's pieces are added in tensor
 * order, one per tensor, so a stable pass per alignment is that order (no name compared). */
static int bfs__file_order(const bfs_plan *p, bfs_outfile *f)
{
    static const size_t aligns[] = {8, 4, 2, 1};
    bfs_piece *o = malloc((f->npieces + 1) * sizeof *o);
    size_t n = 0;
    if (!o)
        return bfs__err(BFS_ENOMEM, "out of memory");
    for (size_t a = 0; a < sizeof aligns / sizeof *aligns; a++)
        for (size_t i = 0; i < f->npieces; i++)
            if (bfs__align_of(p->t[f->pieces[i].tensor].out_dtype) == aligns[a])
                o[n++] = f->pieces[i];
    if (n != f->npieces) { /* a dtype size outside {1, 2, 4, 8}: the comparison sort */
        free(o);
        qsort_r(f->pieces, f->npieces, sizeof *f->pieces, bfs__cmp_file_order, (void *)p);
        return 0;
    }
    memcpy(f->pieces, o, n * sizeof *o);
    free(o);
    return 0;
}

/* The rank files' pieces: tensor i has rows on ranks [0, n) (torch.chunk), so walking the
 * tensors once and each tensor's ranks costs the number of pieces, never ranks x tensors. */
static uint64_t bfs__dcp_ranks(const bfs_ltensor *t, uint64_t W)
{
    if (t->ndim == 0 || t->d0 == 0 || t->whole) /* a 0-d tensor cannot be chunked; an empty one is recorded */
        return 1;          /* once; a whole one: on one rank (bfs__dcp_rank0) */
    const uint64_t chunk = (t->d0 + W - 1) / W;
    return (t->d0 + chunk - 1) / chunk;
}

/* The first rank holding rows of tensor t: a tensor written whole on whole_rank (a 0-d one
 * on rank 0); every other one's n ranks (bfs__dcp_ranks) are [0, n). */
static uint64_t bfs__dcp_rank0(const bfs_ltensor *t)
{
    return t->whole && t->ndim > 0 ? t->whole_rank : 0;
}

/* File r's pieces (f->npieces of them, the layout's count): one per tensor with rows on
 * rank r (p->dcp_n: each tensor's ranks), in file order; a rank with no rows of any tensor
 * still gets one entry, zero rows at offset d0 (what torch's HuggingFaceStorageWriter
 * writes for an empty shard): torch's consolidate_safetensors_files rejects a file whose
 * DCP_SHARDING_INFO is {}. */
static int bfs__dcp_file(bfs_plan *p, uint64_t W, uint64_t r, bfs_outfile *f)
{
    const size_t want = f->npieces, first_nd = p->dcp_first_nd; /* for ranks without rows */
    if (!(f->pieces = malloc((want + 1) * sizeof *f->pieces)))
        return bfs__err(BFS_ENOMEM, "%s: out of memory for its %zu pieces", f->name, want);
    f->npieces = 0;
    for (size_t k = 0; k < p->nt; k++) { /* in file order (p->dcp_order) */
        const size_t i = p->dcp_order[k];
        const bfs_ltensor *t = &p->t[i];
        if (r < bfs__dcp_rank0(t) || r >= bfs__dcp_rank0(t) + p->dcp_n[i])
            continue;
        if (f->npieces == want)
            return bfs__err(BFS_EINTERNAL, "%s: more pieces than the layout counted (%zu)", f->name, want);
        uint64_t a = 0, b = 0;
        bfs__rank_rows(t, W, r, &a, &b);
        f->pieces[f->npieces++] = (bfs_piece){.tensor = (int)i, .row0 = a, .row1 = b};
    }
    if (f->npieces == 0 && first_nd < p->nt && want > 0)
        f->pieces[f->npieces++] = (bfs_piece){.tensor = (int)first_nd, .row0 = p->t[first_nd].d0, .row1 = p->t[first_nd].d0};
    if (f->npieces != want)
        return bfs__err(BFS_EINTERNAL, "%s: %zu pieces, the layout counted %zu", f->name, f->npieces, want);
    return 0;
}

/* Every rank file's order, once for all of them: bfs__file_order over one piece of each of
 * the plan's tensors. Its order (alignment descending, then name) is one of tensors, so a
 * file's pieces, one per tensor, are a subsequence of it. */
static int bfs__dcp_order(bfs_plan *p)
{
    int rc = 0;
    bfs_outfile all = {.npieces = p->nt};
    free(p->dcp_order);
    p->dcp_order = malloc((p->nt + 1) * sizeof *p->dcp_order);
    all.pieces = malloc((p->nt + 1) * sizeof *all.pieces);
    if (!p->dcp_order || !all.pieces)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (size_t i = 0; i < p->nt; i++)
        all.pieces[i] = (bfs_piece){.tensor = (int)i};
    BFS_TRY(bfs__file_order(p, &all));
    for (size_t i = 0; i < p->nt; i++)
        p->dcp_order[i] = (size_t)all.pieces[i].tensor;
cleanup:
    free(all.pieces);
    return rc;
}

static int bfs__layout_dcp(bfs_plan *p, uint64_t W, const bool *only)
{
    int rc = 0;
    char name[128];
    size_t *count = calloc(W, sizeof *count);
    /* a part (only): the files it does not write get no pieces (their tensors x ranks of
     * plan were most of its layout and memory), their data bytes only, for the plan's total */
    uint64_t *bytes = only ? calloc(W, sizeof *bytes) : NULL;
    p->files = calloc(W, sizeof *p->files);
    free(p->dcp_n);
    p->dcp_n = malloc((p->nt + 1) * sizeof *p->dcp_n);
    if (!count || !p->files || (only && !bytes) || !p->dcp_n)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__dcp_order(p));
    p->dcp_first_nd = p->nt;
    for (size_t i = 0; i < p->nt; i++) {
        const bfs_ltensor *t = &p->t[i];
        const uint64_t rb = t->row_elems * bfs__dtype_size(t->out_dtype), n = bfs__dcp_ranks(t, W);
        p->dcp_n[i] = n; /* <= W */
        if (p->dcp_first_nd == p->nt && t->ndim > 0)
            p->dcp_first_nd = i;
        for (uint64_t r = bfs__dcp_rank0(t); r < bfs__dcp_rank0(t) + n; r++) {
            count[r]++;
            if (only && !only[r]) {
                uint64_t a = 0, b = 0;
                bfs__rank_rows(t, W, r, &a, &b);
                bytes[r] += (b - a) * rb; /* bounded: the tensor's bytes were checked by the plan */
            }
        }
    }
    for (uint64_t r = 0; r < W; r++) {
        bfs_outfile *f = &p->files[r];
        p->nfiles = (int)r + 1;
        snprintf(name, sizeof name, "shard-%05llu-model-00001-of-00001.safetensors", (unsigned long long)r + 1);
        if (!(f->name = bfs__strdup(name)))
            BFS_FAIL(BFS_ENOMEM, "out of memory");
    }
    for (uint64_t r = 0; r < W; r++) {
        bfs_outfile *f = &p->files[r];
        if (only && !only[r]) { /* another part's: no pieces, no header, size 0; its data counted */
            if (!bfs__add_ok(p->total_bytes, bytes[r], &p->total_bytes) || p->total_bytes > BFS_MAX_EXTENT)
                BFS_FAIL(BFS_EINPUT, "%s: the output would exceed %llu bytes", f->name, (unsigned long long)BFS_MAX_EXTENT);
            continue;
        }
        f->npieces = count[r] ? count[r] : p->dcp_first_nd < p->nt ? 1 : 0; /* a rank without rows: its empty entry */
        BFS_TRY(bfs__dcp_file(p, W, r, f));
        BFS_TRY(bfs__finish_file(p, f));
        bfs__plan_pieces_drop(p, (int)r); /* a lazy plan: made again when the file is written */
    }
cleanup:
    free(count);
    free(bytes);
    return rc;
}

int bfs__plan_pieces(bfs_plan *p, int f)
{
    bfs_outfile *of = &p->files[f];
    if (of->pieces || p->layout != BFS_LAYOUT_DCP)
        return 0;
    if (!of->data_start || !p->dcp_n)
        return bfs__err(BFS_EINTERNAL, "%s: its pieces asked for, but the layout did not lay it out", of->name);
    const uint64_t size = of->size, mp = of->max_piece, mr = of->max_row;
    uint64_t end = 0;
    int rc = bfs__dcp_file(p, (uint64_t)p->world_size, (uint64_t)f, of);
    if (rc == 0)
        rc = bfs__place_pieces(p, of, of->data_start, &end);
    if (rc == 0 && (end != size || of->max_piece != mp || of->max_row != mr))
        rc = bfs__err(BFS_EINTERNAL, "%s: its pieces made again end at %llu, the layout's at %llu", of->name,
                      (unsigned long long)end, (unsigned long long)size);
    if (rc < 0) {
        free(of->pieces);
        of->pieces = NULL;
    }
    return rc;
}

void bfs__plan_pieces_drop(bfs_plan *p, int f)
{
    if (!p->lazy || p->layout != BFS_LAYOUT_DCP)
        return;
    free(p->files[f].pieces);
    p->files[f].pieces = NULL;
}

/* greedy split in name order, as transformers' save_pretrained */
static int bfs__layout_hf(bfs_plan *p, uint64_t max)
{
    int rc = 0, nf = 0;
    char name[128];
    uint64_t cur = 0;
    int *which = calloc(p->nt ? p->nt : 1, sizeof *which);
    size_t *count = calloc(p->nt + 1, sizeof *count);
    if (!which || !count)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (size_t i = 0; i < p->nt; i++) {
        const uint64_t nb = p->t[i].d0 * p->t[i].row_elems * bfs__dtype_size(p->t[i].out_dtype);
        if (nf == 0 || (cur > 0 && (cur + nb > max || cur + nb < cur))) {
            nf++;
            cur = 0;
        }
        cur += nb;
        which[i] = nf - 1;
        count[nf - 1]++;
    }
    if (nf == 0)
        nf = 1;
    p->files = calloc((size_t)nf, sizeof *p->files);
    if (!p->files)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (int k = 0; k < nf; k++) {
        bfs_outfile *f = &p->files[k];
        p->nfiles = k + 1;
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, nf);
        f->name = bfs__strdup(name);
        f->pieces = calloc(count[k] + 1, sizeof *f->pieces);
        if (!f->name || !f->pieces)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < p->nt; i++) {
        bfs_outfile *f = &p->files[which[i]];
        f->pieces[f->npieces++] = (bfs_piece){.tensor = (int)i, .row0 = 0, .row1 = p->t[i].d0};
    }
    for (int k = 0; k < nf; k++) {
        bfs_outfile *f = &p->files[k];
        BFS_TRY(bfs__file_order(p, f));
        BFS_TRY(bfs__finish_file(p, f));
    }
cleanup:
    free(which);
    free(count);
    return rc;
}

int bfs__plan_layout(bfs_plan *p, const bfs_convert_opts *o) { return bfs__plan_layout_for(p, o, NULL); }

int bfs__plan_layout_for(bfs_plan *p, const bfs_convert_opts *o, const bool *only)
{
    p->world_size = o->world_size;
    p->layout = o->layout;
    p->total_bytes = 0;
    if (o->layout == BFS_LAYOUT_DCP)
        return bfs__layout_dcp(p, (uint64_t)o->world_size, only);
    return bfs__layout_hf(p, o->max_shard_size ? o->max_shard_size : 5000000000ull);
}
