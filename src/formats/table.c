/*
 * The format table: every format the planner knows, in the order it tries
 * them (refuse second to last: it turns away leftovers that look quantized;
 * passthrough last: it takes whatever no other format claimed), and the
 * per-tensor dispatch to a tensor's format (unit source ranges, kind names).
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
    const bfs_format *f = bfs__format_of(u->t->kind);
    return f && f->sources ? f->sources(u, out) : 0;
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
