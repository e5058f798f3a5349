/*
 * How a conversion's work and memory are sized (see units.h): the unit budget, the
 * buffers' page, batches of small pieces and their input pages, and the memory model
 * (convert walks the same units; inspect predicts the peak RSS from it and convert's
 * --max-rss picks --mem with it). The base of the prediction, bfs__base_rss, is fitted
 * on measured peaks; `make bench` checks the prediction against measured peaks.
 */
#include "output/units.h"
#include "formats/format.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

bool bfs__ring_budget(const bfs_plan *p, const bool *mine, uint64_t mem, bfs_ring *rg)
{
    if (!mem)
        mem = BFS_DEFAULT_MEM;
    uint64_t unit = mem / 2 < BFS_UNIT_BYTES ? mem / 2 : BFS_UNIT_BYTES, need = 64, data = 0, row = 0;
    for (int f = 0; f < p->nfiles; f++) {
        if (mine && !mine[f])
            continue;
        const uint64_t d = p->files[f].size - p->files[f].data_start;
        data = d > data ? d : data;
        need = p->files[f].max_piece > need ? p->files[f].max_piece : need; /* the layout's */
        row = p->files[f].max_row > row ? p->files[f].max_row : row;
    }
    /* room for batches of small pieces, where a file holds that many bytes */
    const uint64_t batch = data < BFS_BATCH_BYTES ? data : BFS_BATCH_BYTES;
    need = batch > need ? batch : need;
    if (unit > need)
        unit = need;
    rg->unit = (unit + 4095) & ~4095ull;
    const uint64_t slot = (rg->unit > row ? rg->unit : row + 4095) & ~4095ull;
    rg->slot = slot;
    /* the useful ring: BFS_RING_BYTES or 4 buffers; at most --mem, at least 2 buffers */
    uint64_t ring = BFS_RING_BYTES > 4 * slot ? BFS_RING_BYTES : 4 * slot;
    ring = ring < mem ? ring : mem;
    const uint64_t n = ring / slot;
    rg->n = n < 2 ? 2 : n > BFS_RING_MAX ? BFS_RING_MAX : (int)n;
    return p->max_row_bytes <= mem / 2;
}

uint64_t bfs__buf_page(void)
{
    static _Atomic uint64_t page; /* 0: not read yet */
    uint64_t v = page;
    if (v)
        return v;
    v = 4096;
    const char *env = getenv("BFSHARD_HUGEPAGES");
    FILE *f = env && strcmp(env, "0") == 0 ? NULL : fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f) {
        char line[128] = "";
        if (fgets(line, sizeof line, f) && !strstr(line, "[never]"))
            v = BFS_HUGE_PAGE;
        fclose(f);
    }
    page = v;
    return v;
}

size_t bfs__batch_end(const bfs_plan *p, const bfs_outfile *of, size_t pi, uint64_t unit_bytes)
{
    /* at most BFS_BATCH_BYTES: batching is for small pieces; a large one already makes a
     * unit worth its overheads, and filling the buffers with large ones would only make
     * the pipeline coarser and the resident set larger */
    const uint64_t cap = unit_bytes < BFS_BATCH_BYTES ? unit_bytes : BFS_BATCH_BYTES;
    uint64_t sum = 0;
    size_t e = pi, units = 0;
    while (e < of->npieces && of->pieces[e].nbytes <= cap - sum) {
        const bfs_piece *pc = &of->pieces[e];
        const bfs_ltensor *t = &p->t[pc->tensor]; /* a packed piece: a kernel unit per member */
        const size_t nu = t->members ? (size_t)(pc->row1 - pc->row0) * t->npack : 1;
        if (units + nu > BFS_BATCH_MAX)
            break;
        units += nu;
        sum += pc->nbytes;
        e++;
    }
    return e > pi + 1 ? e : pi + 1;
}

static int bfs__cmp_prange(const void *x, const void *y)
{
    const bfs_prange *a = x, *b = y;
    if (a->file != b->file)
        return a->file < b->file ? -1 : 1;
    return a->a < b->a ? -1 : a->a > b->a;
}

/* o[0..n) sorted (unless sorted already) and merged where ranges of a file touch; returns how many */
static size_t bfs__prange_merge(bfs_prange *o, size_t n, bool sorted)
{
    if (!sorted)
        qsort(o, n, sizeof *o, bfs__cmp_prange);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m > 0 && o[m - 1].file == o[i].file && o[i].a <= o[m - 1].b) {
            if (o[i].b > o[m - 1].b)
                o[m - 1].b = o[i].b;
        } else {
            o[m++] = o[i];
        }
    }
    return m;
}

/* pages [a, b) of file gathered for one MADV_WILLNEED (file < 0: none) */
typedef struct {
    int file;
    uint64_t a, b;
} bfs_pfrange;

static void bfs__pf_flush(const bfs_input *in, bfs_pfrange *g, uint64_t *dry)
{
    if (g->file >= 0) {
        const bfs_infile *fl = &in->files[g->file];
        const uint64_t e = g->b < fl->size ? g->b : fl->size;
        if (e > g->a && dry)
            *dry += e - g->a;
        else if (e > g->a)
            (void)madvise((void *)(fl->map + g->a), (size_t)(e - g->a), MADV_WILLNEED);
    }
    g->file = -1;
}

void bfs__prefetch_pieces(const bfs_input *in, const bfs_plan *p, const bfs_outfile *of, size_t p0, size_t p1,
                          uint64_t *dry)
{
    const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    bfs_pfrange g = {.file = -1};
    for (size_t k = p0; k < p1; k++) {
        const bfs_piece *pc = &of->pieces[k];
        bfs_ucur cur = bfs__ucur(&p->t[pc->tensor], pc->row0, pc->row1);
        bfs_unit u;
        uint64_t ua, ub;
        while (bfs__ucur_next(&cur, UINT64_MAX, &u, &ua, &ub)) { /* the piece; a packed one's members */
            bfs_srange s[BFS_UNIT_MAX_SRC];
            const int ns = bfs__unit_sources(&u, s);
            for (int i = 0; i < ns; i++) {
                if (s[i].len == 0)
                    continue;
                const uint64_t x = (s[i].r->file_offset + s[i].off) / pg * pg;
                const uint64_t y = (s[i].r->file_offset + s[i].off + s[i].len + pg - 1) / pg * pg;
                /* the same file and near: one request (a gap of a few pages costs less than a call) */
                if (s[i].r->file == g.file && x <= g.b + 16 * pg && y + 16 * pg >= g.a) {
                    g.a = x < g.a ? x : g.a;
                    g.b = y > g.b ? y : g.b;
                } else {
                    bfs__pf_flush(in, &g, dry);
                    g = (bfs_pfrange){s[i].r->file, x, y};
                }
            }
        }
    }
    bfs__pf_flush(in, &g, dry);
}

size_t bfs__prefetch_ahead(const bfs_input *in, const bfs_plan *p, const bfs_outfile *of, size_t pf, size_t pi)
{
    const size_t a = pf > pi ? pf : pi;
    size_t e = a;
    while (e < of->npieces && of->pieces[e].offset < of->pieces[pi].offset + BFS_PREFETCH_AHEAD)
        e++;
    if (e > a)
        bfs__prefetch_pieces(in, p, of, a, e, NULL);
    return e > pf ? e : pf;
}

/* The pages of rows [row0, row1) of t (a packed tensor: each member's units), outward or
 * inward, appended to out[*n]; *sorted cleared when one lands before the one before it. */
static void bfs__rows_pages(const bfs_ltensor *t, uint64_t row0, uint64_t row1, uint64_t pg, bool inward,
                            bfs_prange *out, size_t *n, bool *sorted)
{
    bfs_ucur cur = bfs__ucur(t, row0, row1);
    bfs_unit u;
    uint64_t ua, ub;
    while (bfs__ucur_next(&cur, UINT64_MAX, &u, &ua, &ub)) {
        bfs_srange s[BFS_UNIT_MAX_SRC];
        const int ns = bfs__unit_sources(&u, s);
        for (int i = 0; i < ns; i++) {
            if (s[i].len == 0)
                continue;
            const uint64_t a = s[i].r->file_offset + s[i].off, b = a + s[i].len;
            bfs_prange *const o = &out[*n];
            *o = inward ? (bfs_prange){.file = s[i].r->file, .a = (a + pg - 1) / pg * pg, .b = b / pg * pg}
                        : (bfs_prange){.file = s[i].r->file, .a = a / pg * pg, .b = (b + pg - 1) / pg * pg};
            if (o->a >= o->b)
                continue;
            if (*n > 0 && bfs__cmp_prange(&out[*n - 1], o) > 0)
                *sorted = false;
            (*n)++;
        }
    }
}

size_t bfs__batch_pages(const bfs_plan *p, const bfs_outfile *of, size_t p0, size_t p1, uint64_t pg, bool inward,
                        bfs_prange *out)
{
    size_t n = 0;
    bool sorted = true;
    for (size_t k = p0; k < p1; k++)
        bfs__rows_pages(&p->t[of->pieces[k].tensor], of->pieces[k].row0, of->pieces[k].row1, pg, inward, out, &n,
                        &sorted);
    return bfs__prange_merge(out, n, sorted);
}

/* ---- groups of rank files (units.h) ------------------------------------------------ */
int bfs__group_size(const bfs_plan *p, const bool *mine, const bfs_ring *rg, uint64_t mem)
{
    if (!mem)
        mem = BFS_DEFAULT_MEM;
    int n = 0;
    uint64_t header = 0;
    for (int f = 0; f < p->nfiles; f++)
        if (!mine || mine[f]) {
            n++;
            header = p->files[f].data_start > header ? p->files[f].data_start : header;
        }
    int g = n < BFS_GROUP_MAX ? n : BFS_GROUP_MAX;
    if (p->layout != BFS_LAYOUT_DCP) { /* files interleaved unit by unit: each needs buffers in flight */
        const int hg = rg->n / 2 > 2 ? rg->n / 2 : 2;
        g = g < hg ? g : hg;
    }
    const char *env = getenv("BFSHARD_GROUP");
    if (env && *env) {
        const long v = strtol(env, NULL, 10);
        g = v < 1 ? 1 : v < g ? (int)v : g;
    }
    /* two headers held at once (the writer's hash thread builds them in two buffers taking
     * turns: writer.h) and every file's carry */
    while (g > 1 && 2 * header + (uint64_t)g * BFS_CARRY_BYTES > mem / 2)
        g--;
    while (g > 1 && p->layout == BFS_LAYOUT_DCP && rg->slot < (uint64_t)g * (BFS_GROUP_MIN_SHARE + 2 * BFS_DIO_ALIGN))
        g--; /* a DCP window's shares of one buffer */
    return g < 1 ? 1 : g;
}

int bfs__writer_lanes(int group, int threads)
{
    if (threads <= 0) {
        const long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    int n = group < threads ? group : threads;
    const char *env = getenv("BFSHARD_WRITERS"); /* tests and bench: N lanes whatever the CPUs */
    if (env && *env) {
        const long v = strtol(env, NULL, 10);
        n = v < 1 ? 1 : v < group ? (int)v : group;
    }
    n = n < BFS_WRITER_LANES ? n : BFS_WRITER_LANES;
    return n < 1 ? 1 : n;
}

/* A tensor's place in every rank file's order (plan.c's bfs__file_order: alignment
 * descending, then name, which is the plan's tensor order). */
static uint64_t bfs__gkey(const bfs_plan *p, int tensor)
{
    const size_t a = bfs__dtype_size(p->t[tensor].out_dtype);
    const uint64_t cls = a >= 8 ? 0 : a >= 4 ? 1 : a >= 2 ? 2 : 3;
    return cls * (uint64_t)p->nt + (uint64_t)tensor;
}

void bfs__gwalk_init(bfs_gwalk *gw, const bfs_plan *p, const int *files, int n, const bfs_ring *rg)
{
    memset(gw, 0, sizeof *gw);
    gw->p = p;
    gw->n = n;
    for (int g = 0; g < n; g++)
        gw->f[g] = files[g];
    /* the window's buffer (ring.slot + the headroom) shared: each share with its headroom
     * and its alignment */
    uint64_t cap = (rg->slot + BFS_DIO_ALIGN) / (uint64_t)n;
    cap = cap > 2 * BFS_DIO_ALIGN ? cap - 2 * BFS_DIO_ALIGN : 1;
    gw->cap = cap < BFS_BATCH_BYTES ? cap : BFS_BATCH_BYTES;
}

bool bfs__gwalk_next(bfs_gwalk *gw, bfs_gstep *s)
{
    const bfs_plan *p = gw->p;
    memset(s, 0, sizeof *s);
    if (!gw->in_window) { /* the first file with pieces left leads: its batch is the window */
        int l = 0;
        while (l < gw->n && gw->pi[l] >= p->files[gw->f[l]].npieces)
            l++;
        if (l == gw->n)
            return false;
        const bfs_outfile *of = &p->files[gw->f[l]];
        const size_t e = bfs__batch_end(p, of, gw->pi[l], gw->cap);
        gw->kmax = bfs__gkey(p, of->pieces[e - 1].tensor);
        gw->in_window = true;
        gw->g = 0;
    }
    for (; gw->g < gw->n; gw->g++) { /* each file's pieces up to the window's last tensor */
        const bfs_outfile *of = &p->files[gw->f[gw->g]];
        const size_t pi = gw->pi[gw->g];
        if (pi >= of->npieces || bfs__gkey(p, of->pieces[pi].tensor) > gw->kmax)
            continue;
        const size_t be = bfs__batch_end(p, of, pi, gw->cap);
        size_t e = pi + 1;
        while (e < be && bfs__gkey(p, of->pieces[e].tensor) <= gw->kmax)
            e++;
        *s = (bfs_gstep){.g = gw->g, .p0 = pi, .p1 = e, .batch = of->pieces[pi].nbytes <= gw->cap};
        gw->pi[gw->g] = e; /* the same file again next: a share may not hold its whole window */
        return true;
    }
    gw->in_window = false;
    s->window_end = true;
    return true;
}

size_t bfs__window_pages(const bfs_gwalk *gw, const bfs_gstep *steps, size_t n, uint64_t pg, bool inward,
                         bfs_wscratch *ws)
{
    const bfs_plan *p = gw->p;
    if (!ws->lo) {
        ws->lo = malloc((p->nt ? p->nt : 1) * sizeof *ws->lo);
        ws->hi = malloc((p->nt ? p->nt : 1) * sizeof *ws->hi);
        if (!ws->lo || !ws->hi)
            return (size_t)-1;
        for (size_t i = 0; i < p->nt; i++) {
            ws->lo[i] = 1;
            ws->hi[i] = 0;
        }
    }
    ws->nlist = 0;
    for (size_t i = 0; i < n; i++) { /* each tensor's rows over the group's files */
        if (!steps[i].batch)
            continue;
        const bfs_outfile *of = &p->files[gw->f[steps[i].g]];
        for (size_t k = steps[i].p0; k < steps[i].p1; k++) {
            const bfs_piece *pc = &of->pieces[k];
            if (pc->row0 == pc->row1)
                continue;
            const int t = pc->tensor;
            if (ws->lo[t] > ws->hi[t]) {
                if (bfs__grow((void **)&ws->list, &ws->clist, ws->nlist + 1, sizeof *ws->list) < 0)
                    return (size_t)-1;
                ws->list[ws->nlist++] = t;
                ws->lo[t] = pc->row0;
                ws->hi[t] = pc->row1;
            } else {
                ws->lo[t] = pc->row0 < ws->lo[t] ? pc->row0 : ws->lo[t];
                ws->hi[t] = pc->row1 > ws->hi[t] ? pc->row1 : ws->hi[t];
            }
        }
    }
    size_t m = 0;
    bool sorted = true;
    size_t nparts = 0; /* the kernels' tensors: a packed tensor's members in the window's rows */
    for (size_t i = 0; i < ws->nlist; i++) {
        const int t = ws->list[i];
        nparts += (size_t)((ws->hi[t] - ws->lo[t]) * (p->t[t].members ? p->t[t].npack : 1));
    }
    if (bfs__grow((void **)&ws->pr, &ws->cpr, nparts * BFS_UNIT_MAX_SRC + 1, sizeof *ws->pr) < 0)
        return (size_t)-1;
    for (size_t i = 0; i < ws->nlist; i++) {
        const int t = ws->list[i];
        bfs__rows_pages(&p->t[t], ws->lo[t], ws->hi[t], pg, inward, ws->pr, &m, &sorted);
        ws->lo[t] = 1; /* none, for the next window */
        ws->hi[t] = 0;
    }
    return bfs__prange_merge(ws->pr, m, sorted);
}

void bfs__wscratch_free(bfs_wscratch *ws)
{
    free(ws->lo);
    free(ws->hi);
    free(ws->list);
    free(ws->pr);
    memset(ws, 0, sizeof *ws);
}

/* The model's walk: the ring's buffers' touched pages, round the ring as convert goes. */
typedef struct bfs_mwalk {
    bfs_mem_model *m;
    uint64_t touched[BFS_RING_MAX], sum;
    int slot;
    uint64_t used; /* a window's buffer: bytes carved so far (0: none) */
    bfs_prange *pr;
} bfs_mwalk;

/* [0, end) of the current buffer written; `in` input pages mapped meanwhile */
static void bfs__mw_touch(bfs_mwalk *w, uint64_t end, uint64_t in)
{
    const uint64_t bp = bfs__buf_page(); /* the buffer's pages: maybe huge */
    end = (end + bp - 1) / bp * bp;
    if (end > w->touched[w->slot]) {
        w->sum += end - w->touched[w->slot];
        w->touched[w->slot] = end;
    }
    if (w->sum + in > w->m->buffers + w->m->input) {
        w->m->buffers = w->sum;
        w->m->input = in;
    }
}

static void bfs__mw_next(bfs_mwalk *w) { w->slot = (w->slot + 1) % w->m->ring.n; }

/* a piece cut into buffers, as bfs__write_piece cuts them; each one's input pages go after it */
static void bfs__mw_piece(bfs_mwalk *w, const bfs_plan *p, const bfs_piece *pc)
{
    const uint64_t pg = 4096;
    const bfs_ltensor *t = &p->t[pc->tensor];
    const uint64_t row_bytes = bfs__sub_row_bytes(t);
    if (pc->row0 == pc->row1 || row_bytes == 0)
        return;
    const uint64_t rows_per_unit = bfs__unit_rows(&w->m->ring, row_bytes);
    uint64_t off = pc->offset;
    bfs_ucur cur = bfs__ucur(t, pc->row0, pc->row1), span;
    while (bfs__ucur_span(&cur, rows_per_unit, &span)) { /* a buffer each; a packed tensor's: its members' units */
        const uint64_t n = span.end - span.pos;
        bfs_unit u;
        uint64_t ua, ub, in = 0;
        while (bfs__ucur_next(&span, UINT64_MAX, &u, &ua, &ub)) {
            bfs_srange s[BFS_UNIT_MAX_SRC];
            const int ns = bfs__unit_sources(&u, s);
            for (int i = 0; i < ns; i++)
                if (s[i].len) { /* outward to pages, as convert releases them */
                    const uint64_t a = s[i].r->file_offset + s[i].off;
                    in += (a + s[i].len + pg - 1) / pg * pg - a / pg * pg;
                }
        }
        bfs__mw_touch(w, off % BFS_DIO_ALIGN + n * row_bytes, in);
        bfs__mw_next(w);
        off += n * row_bytes;
    }
}

/* one file at a time (group size 1), as bfs__write_file runs it */
static void bfs__mw_file(bfs_mwalk *w, const bfs_plan *p, const bfs_outfile *of)
{
    for (size_t pi = 0; pi < of->npieces;) {
        const size_t pe = bfs__batch_end(p, of, pi, w->m->ring.unit);
        if (pe > pi + 1) { /* a batch, as bfs__write_batch runs it; its pages go after it */
            const uint64_t len = bfs__pieces_bytes(of, pi, pe);
            const size_t nr = bfs__batch_pages(p, of, pi, pe, 4096, false, w->pr);
            bfs__mw_touch(w, of->pieces[pi].offset % BFS_DIO_ALIGN + len, bfs__pranges_bytes(w->pr, nr));
            bfs__mw_next(w);
            pi = pe;
            continue;
        }
        bfs__mw_piece(w, p, &of->pieces[pi++]);
    }
}

/* a group, as bfs__write_group runs it: each window's batches carved from one buffer, their
 * input pages held until the window ends */
static int bfs__mw_group(bfs_mwalk *w, const bfs_plan *p, const int *files, int n)
{
    bfs_gwalk gw;
    bfs_gstep s, *st = NULL;
    size_t nst = 0, cst = 0;
    bfs_wscratch ws = {0};
    const uint64_t bufcap = w->m->ring.slot + BFS_DIO_ALIGN;
    int rc = 0;
    bfs__gwalk_init(&gw, p, files, n, &w->m->ring);
    while (bfs__gwalk_next(&gw, &s)) {
        if (s.window_end || !s.batch) {
            if (w->used) { /* the window's buffer is done with */
                bfs__mw_next(w);
                w->used = 0;
            }
        }
        if (s.window_end) {
            const size_t k = bfs__window_pages(&gw, st, nst, 4096, false, &ws);
            if (k == (size_t)-1)
                BFS_FAIL(BFS_ENOMEM, "out of memory");
            bfs__mw_touch(w, 0, bfs__pranges_bytes(ws.pr, k)); /* no buffer, the window's pages */
            nst = 0;
            continue;
        }
        const bfs_outfile *of = &p->files[files[s.g]];
        if (!s.batch) {
            bfs__mw_piece(w, p, &of->pieces[s.p0]);
            continue;
        }
        const uint64_t len = bfs__pieces_bytes(of, s.p0, s.p1);
        uint64_t at = bfs__carve_at(w->used, of->pieces[s.p0].offset, len, bufcap);
        if (at == UINT64_MAX) { /* a share that outgrew its window: the next buffer */
            bfs__mw_next(w);
            at = bfs__carve_at(0, of->pieces[s.p0].offset, len, bufcap);
        }
        w->used = at + len > 0 ? at + len : 1;
        bfs__mw_touch(w, at + len, 0);
        if (bfs__grow((void **)&st, &cst, nst + 1, sizeof *st) < 0)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        st[nst++] = s;
    }
cleanup:
    free(st);
    bfs__wscratch_free(&ws);
    return rc;
}

/* The walk's files' pieces (a lazy plan holds none): made before it, dropped after. The
 * casts: making or dropping a file's pieces leaves the plan's layout as it is. */
static int bfs__mw_make(const bfs_plan *p, const int *files, int n)
{
    for (int i = 0; i < n; i++) {
        const int rc = bfs__plan_pieces((bfs_plan *)p, files[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static void bfs__mw_drop(const bfs_plan *p, const int *files, int n)
{
    for (int i = 0; i < n; i++)
        bfs__plan_pieces_drop((bfs_plan *)p, files[i]);
}

int bfs__mem_model(const bfs_plan *p, const bool *mine, uint64_t mem, int nthreads, bfs_mem_model *m)
{
    int rc = 0;
    memset(m, 0, sizeof *m);
    if (!bfs__ring_budget(p, mine, mem, &m->ring))
        return bfs__err(BFS_ENOMEM, "--mem %llu is too small for this plan", (unsigned long long)mem);
    m->group = bfs__group_size(p, mine, &m->ring, mem);
    uint64_t header = 0;
    bfs_mwalk w = {.m = m, .pr = malloc(BFS_BATCH_MAX * BFS_UNIT_MAX_SRC * sizeof *w.pr)};
    if (!w.pr)
        return bfs__err(BFS_ENOMEM, "out of memory");
    int grp[BFS_GROUP_MAX], ng = 0; /* convert goes round the ring over the whole run */
    for (int f = 0; f <= p->nfiles; f++) {
        if (f < p->nfiles && mine && !mine[f])
            continue; /* only the files this run writes, as convert walks them */
        if (f < p->nfiles) {
            header = p->files[f].data_start > header ? p->files[f].data_start : header;
            if (m->group < 2 || p->layout != BFS_LAYOUT_DCP) { /* interleaved: the same units */
                BFS_TRY(bfs__mw_make(p, &f, 1));
                bfs__mw_file(&w, p, &p->files[f]);
                bfs__mw_drop(p, &f, 1);
                continue;
            }
            grp[ng++] = f;
        }
        if (ng > 0 && (ng == m->group || f == p->nfiles)) {
            BFS_TRY(bfs__mw_make(p, grp, ng));
            rc = bfs__mw_group(&w, p, grp, ng);
            bfs__mw_drop(p, grp, ng);
            BFS_TRY(rc);
            ng = 0;
        }
    }
    m->unit_bytes = m->ring.slot + BFS_DIO_ALIGN;
    /* the files' carries (two: the next file's header while the last one ends; a group's
     * each), and a group's headers beside the one bfs__base_rss counts */
    const uint64_t carry = header + BFS_DIO_ALIGN < BFS_CARRY_BYTES ? header + BFS_DIO_ALIGN : BFS_CARRY_BYTES;
    const uint64_t files = m->group < 2 ? 2 : (uint64_t)m->group;
    /* two headers either way (the writer's two header buffers, writer.h); bfs__base_rss
     * counts one */
    /* stacks: + main, and each lane's writer and hash threads */
    m->fixed = files * carry + (header + 4095) / 4096 * 4096 + BFS_SRC_HASH_WINDOW +
               (uint64_t)(nthreads + 1 + 2 * bfs__writer_lanes(m->group, nthreads)) * (64u << 10);
cleanup:
    free(w.pr);
    return rc;
}

uint64_t bfs__base_rss(const bfs_input *in, const bfs_plan *p, const bool *mine)
{
    /* measured: `bfshard --version` peaks at 3.8 MB (program, libc, jansson, zstd,
     * xxhash, the static CUDA runtime's pages); a constant, so inspect's output is the
     * same every run */
    uint64_t b = 4ull << 20, header = 0, pieces = 0, held[BFS_GROUP_MAX] = {0};
    for (int i = 0; i < in->nfiles; i++) /* the input headers, read through the map */
        b += (in->files[i].h.data_start + 4095) / 4096 * 4096;
    /* per input tensor: its parsed header entry and name, its raw entry, its source-hash
     * slot; per output tensor: the plan's entry and name; per piece (every file's; a lazy
     * plan's: those of the BFS_GROUP_MAX largest files it writes, the most it holds at once,
     * a group's): the piece, its hash, the manifest's index of it. Fitted
     * on gen_synth.py tiny (200k tensors, W = 1 and 8: 226 and 315 MB measured with
     * glibc malloc). The plan keeps no header text: convert builds one file's header at a
     * time, the largest of the files this run writes counts. */
    for (int f = 0; f < p->nfiles; f++) {
        if (!p->lazy || p->layout != BFS_LAYOUT_DCP) {
            pieces += p->files[f].npieces;
        } else if (!mine || mine[f]) { /* a lazy plan: the files of a group (and one more) at most */
            uint64_t n = p->files[f].npieces;
            for (int k = 0; k < BFS_GROUP_MAX; k++)
                if (n > held[k]) {
                    const uint64_t x = held[k];
                    held[k] = n;
                    n = x;
                }
        }
        if ((!mine || mine[f]) && p->files[f].data_start > header)
            header = p->files[f].data_start;
    }
    for (int k = 0; k < BFS_GROUP_MAX; k++)
        pieces += held[k];
    return b + (uint64_t)in->nraw * 256 + (uint64_t)p->nt * 340 + pieces * 72 + header;
}

/* the predicted peak RSS of convert with this plan and --mem (see the top of this file) */
int bfs__predict_rss(const bfs_plan *p, const bool *mine, uint64_t mem, int threads, uint64_t base, bfs_mem_model *m,
                     uint64_t *peak)
{
    if (threads <= 0) {
        const long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    const int rc = bfs__mem_model(p, mine, mem, threads, m);
    *peak = rc < 0 ? 0 : base + m->buffers + m->input + m->fixed;
    return rc;
}

int bfs__pick_mem(const bfs_input *in, const bfs_plan *p, const bool *mine, const bfs_convert_opts *o, uint64_t *mem)
{
    *mem = o->mem ? o->mem : BFS_DEFAULT_MEM;
    if (!o->max_rss)
        return 0;
    if (o->mem)
        return bfs__err(BFS_EUSAGE, "--max-rss picks --mem: give one of them");
    const uint64_t step = 64u << 10, base = bfs__base_rss(in, p, mine);
    bfs_mem_model m;
    uint64_t peak = 0;
    uint64_t lo = (2 * p->max_row_bytes + step - 1) / step * step, hi = BFS_DEFAULT_MEM;
    if (lo < step)
        lo = step;
    if (lo > hi)
        hi = lo;
    int rc = bfs__predict_rss(p, mine, lo, o->threads, base, &m, &peak);
    if (rc < 0 || peak > o->max_rss)
        return bfs__err(BFS_ENOMEM, "--max-rss %llu: this conversion needs at least %llu bytes (predicted peak RSS at --mem %llu, the least it can use)",
                        (unsigned long long)o->max_rss, (unsigned long long)peak, (unsigned long long)lo);
    while (lo < hi) { /* the largest mem in [lo, hi] that fits; lo fits */
        const uint64_t mid = lo + ((hi - lo) / step + 1) / 2 * step;
        rc = bfs__predict_rss(p, mine, mid, o->threads, base, &m, &peak);
        if (rc == 0 && peak <= o->max_rss)
            lo = mid;
        else
            hi = mid - step;
    }
    *mem = lo;
    return 0;
}
