/*
 * The format table: every format the planner knows, in the order it tries
 * them (refuse second to last: it turns away leftovers that look quantized;
 * passthrough last: it takes whatever no other format claimed), and the
 * per-tensor dispatch to a tensor's format (unit source ranges, kind names), and the
 * source-hash blocks that follow from the source ranges (src/input/srchash.c).
 * A new format adds its extern line and its row here, nothing else.
 */
#include "format.h"

extern const bfs_format bfs__format_mxfp4;
extern const bfs_format bfs__format_bnb4;
extern const bfs_format bfs__format_quark;
extern const bfs_format bfs__format_ctmx;
extern const bfs_format bfs__format_dsv4;
extern const bfs_format bfs__format_fp8;
extern const bfs_format bfs__format_int4;
extern const bfs_format bfs__format_nvfp4;
extern const bfs_format bfs__format_gptq;
extern const bfs_format bfs__format_awq;
extern const bfs_format bfs__format_bnb8;
extern const bfs_format bfs__format_qextra;
extern const bfs_format bfs__format_refuse;
extern const bfs_format bfs__format_passthrough;

const bfs_format *const bfs__formats[] = {
    &bfs__format_mxfp4,
    &bfs__format_bnb4,
    &bfs__format_quark,       /* before ctmx and fp8: quant_method quark's U8 / F8_E4M3 weights (quark.c) */
    &bfs__format_ctmx,        /* before fp8 and nvfp4: U8 (E8M0) scales are its (ctmx.c) */
    &bfs__format_fp8,         /* the claim of quant_method fp8: it tries every tensor first */
    &bfs__format_dsv4,        /* after fp8: P.weight + P.scale, which fp8.c leaves to it (dsv4.c) */
    &bfs__format_int4,
    &bfs__format_nvfp4,
    &bfs__format_gptq,        /* owns BFS_K_WOQ (sources: woq.c); awq and bnb8 borrow it */
    &bfs__format_awq,
    &bfs__format_bnb8,        /* after bnb4: quant_method bitsandbytes with load_in_8bit (bnb4.c leaves it) */
    &bfs__format_qextra,      /* after the quantized formats: drops activation scales */
    &bfs__format_refuse,      /* second to last: leftovers that look quantized (refuse.c) */
    &bfs__format_passthrough, /* last */
    NULL,
};

const bfs_format *bfs__format_of(bfs_kind k)
{
    for (const bfs_format *const *f = bfs__formats; *f; f++)
        if ((*f)->kinds & BFS_KIND_BIT(k))
            return *f;
    return NULL;
}

int bfs__unit_sources(const bfs_unit *u, bfs_srange out[BFS_UNIT_MAX_SRC])
{
    if (u->t->members) /* units are its members' (bfs__ucur_next): a caller that forgot */
        return bfs__err(BFS_EINTERNAL, "tensor \"%s\": a unit of a packed tensor, not of one of its members", u->t->name);
    const bfs_format *f = bfs__format_of(u->t->kind);
    return f && f->sources ? f->sources(u, out) : 0;
}

/* The end of source range i of rows [0, a) of t: where the bytes of the ranks before a end */
static int bfs__prefix_end(const bfs_unit *u, uint64_t a, const bfs_srange *s, int n, uint64_t *end)
{
    bfs_srange p[BFS_UNIT_MAX_SRC];
    const bfs_unit pu = {.t = u->t, .row0 = 0, .row1 = a};
    if (bfs__unit_sources(&pu, p) != n)
        return bfs__err(BFS_EINTERNAL, "tensor \"%s\": rows [0, %llu) read %d source ranges, not %d", u->t->name,
                        (unsigned long long)a, bfs__unit_sources(&pu, p), n);
    for (int i = 0; i < n; i++) {
        if (p[i].r != s[i].r)
            return bfs__err(BFS_EINTERNAL, "tensor \"%s\": source %d differs between units", u->t->name, i);
        end[i] = p[i].off + p[i].len;
    }
    return 0;
}

int bfs__unit_hash_blocks(const bfs_unit *u, uint64_t a, uint64_t b, bfs_srange s[BFS_UNIT_MAX_SRC],
                          bfs_srange blk[BFS_UNIT_MAX_SRC])
{
    const int n = bfs__unit_sources(u, s);
    uint64_t lo[BFS_UNIT_MAX_SRC] = {0}, hi[BFS_UNIT_MAX_SRC] = {0};
    int rc = a > 0 ? bfs__prefix_end(u, a, s, n, lo) : 0;
    if (rc == 0 && b < u->t->d0)
        rc = bfs__prefix_end(u, b, s, n, hi);
    for (int i = 0; rc == 0 && i < n; i++) {
        if (b >= u->t->d0)
            hi[i] = s[i].r->nbytes; /* the last rank with rows: to the tensor's end */
        if (a >= b)
            hi[i] = lo[i]; /* no rows: no block */
        if (lo[i] > hi[i] || hi[i] > s[i].r->nbytes)
            rc = bfs__err(BFS_EINTERNAL, "tensor \"%s\": source \"%s\": rows [%llu, %llu) give the block [%llu, %llu) of %llu bytes",
                          u->t->name, s[i].r->st->name, (unsigned long long)a, (unsigned long long)b,
                          (unsigned long long)lo[i], (unsigned long long)hi[i], (unsigned long long)s[i].r->nbytes);
        blk[i] = (bfs_srange){s[i].r, lo[i], hi[i] - lo[i]};
    }
    return rc < 0 ? rc : n;
}

void bfs__sources_read(const bfs_ltensor *t, size_t nt, const bfs_raw *raw0, bool *read)
{
    for (size_t k = 0; k < nt; k++) {
        if (t[k].members) { /* a packed tensor's kernels read its members' */
            bfs__sources_read(t[k].members, bfs__nparts(&t[k]), raw0, read);
            continue;
        }
        bfs_srange s[BFS_UNIT_MAX_SRC];
        const bfs_unit u = {.t = &t[k], .row0 = 0, .row1 = t[k].d0};
        const int n = t[k].d0 > 0 ? bfs__unit_sources(&u, s) : 0;
        for (int i = 0; i < n; i++)
            read[s[i].r - raw0] = true;
    }
}

const char *bfs__kind_name(const bfs_ltensor *t)
{
    const bfs_format *f = bfs__format_of(t->kind);
    return f ? f->kind_name(t) : "passthrough";
}

const char *bfs__kind_action(const bfs_ltensor *t)
{
    return t->kind == BFS_K_PASS ? "copied" : t->kind == BFS_K_CAST ? "cast" : "dequantized";
}
