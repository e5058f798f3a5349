/*
 * A rank or model file's safetensors header (see plan.h): its text, built straight into a
 * buffer without a JSON tree, byte for byte what jansson's compact dump of the same object
 * would be; the layout counts each file's header length with the same emitter
 * (bfs__plan_header_len) and convert builds the text when it writes the file
 * (bfs__plan_header_into). Split from plan.c, which groups the tensors and lays out files.
 */
#include "plan/plan.h"
#include "formats/format.h"
#include "input/safetensors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the header text, written directly (jansson for 200k tensors x ranks costs seconds):
 * byte for byte what bfs__json_dump(JSON_COMPACT) makes of the same object, keys in insertion
 * order; a string holding a control character is escaped by jansson itself.
 * The plan keeps no header text: the layout runs the same emitter in counting mode for
 * each file's header length (its data offsets follow from it), and bfs__plan_header
 * builds one file's text when convert writes that file, checking that the length is the
 * one counted. (All W headers held at once were 270 MB of 700 at W = 8, 200k tensors.) */
typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
    bool count; /* count the bytes only (p stays NULL) */
    bool esc;   /* inside a JSON string: '"' and '\\' escaped (DCP_SHARDING_INFO) */
    bool fixed; /* p is the caller's: never regrown (out of room: oom) */
} bfs_sbuf;

static void bfs__sb_raw(bfs_sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->count) {
        b->n += n;
        return;
    }
    if (b->cap - b->n <= n) {
        if (b->fixed) {
            b->oom = true;
            return;
        }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->n <= n)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

/* s, escaped as a JSON string's content when b->esc: the text never holds a control
 * character there (every name in it went through bfs__sb_json_str), so '"' and '\\'
 * are all jansson escapes in it */
/* s (n bytes) through emit, each '"' and '\\' preceded by a backslash */
static void bfs__sb_escape(bfs_sbuf *b, const char *s, size_t n, void (*emit)(bfs_sbuf *, const char *, size_t))
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '"' || s[i] == '\\') {
            emit(b, s + k, i - k);
            emit(b, s[i] == '"' ? "\\\"" : "\\\\", 2);
            k = i + 1;
        }
    emit(b, s + k, n - k);
}

static void bfs__sb_put(bfs_sbuf *b, const char *s, size_t n)
{
    if (b->esc)
        bfs__sb_escape(b, s, n, bfs__sb_raw);
    else
        bfs__sb_raw(b, s, n);
}

static void bfs__sb_str(bfs_sbuf *b, const char *s) { bfs__sb_put(b, s, strlen(s)); }

static char *bfs__u64_put(char *o, uint64_t v)
{
    char t[20];
    size_t k = sizeof t;
    do {
        t[--k] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    memcpy(o, t + k, sizeof t - k);
    return o + (sizeof t - k);
}

static void bfs__sb_u64(bfs_sbuf *b, uint64_t v)
{
    char t[20];
    bfs__sb_raw(b, t, (size_t)(bfs__u64_put(t, v) - t)); /* digits need no escape */
}

/* s (n bytes, valid UTF-8) as a JSON string, quoted */
static void bfs__sb_json_str(bfs_sbuf *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20) { /* \n, \u001f...: jansson's own escapes */
            json_t *j = json_stringn(s, n);
            char *t = j ? bfs__json_dump(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
            if (t)
                bfs__sb_str(b, t);
            else
                b->oom = true;
            free(t);
            json_decref(j);
            return;
        }
    bfs__sb_put(b, "\"", 1);
    bfs__sb_escape(b, s, n, bfs__sb_put); /* escaped again where the whole is inside a string */
    bfs__sb_put(b, "\"", 1);
}

static void bfs__sb_shape(bfs_sbuf *b, const uint64_t *shape, int ndim)
{
    bfs__sb_raw(b, "[", 1);
    for (int d = 0; d < ndim; d++) {
        if (d)
            bfs__sb_raw(b, ",", 1);
        bfs__sb_u64(b, shape[d]);
    }
    bfs__sb_raw(b, "]", 1);
}

/* tensor i's name as a JSON string, from the plan's cache of each name's JSON length
 * (outside [0] and inside [1] a string) when there is one (without it every file's header
 * counted and built escaped W x tensors names over and over): counted from it, or copied
 * as it is where it says there is nothing to escape */
static void bfs__sb_name(bfs_sbuf *b, const bfs_plan *p, int i)
{
    const uint32_t *jl = p->name_jlen;
    if (b->count && jl && !b->oom) {
        b->n += jl[2 * (size_t)i + b->esc];
    } else if (jl && jl[2 * (size_t)i + 1] - jl[2 * (size_t)i] == 2) {
        /* nothing to escape (quoted: 2 bytes more; inside a string: 4), copied as it is */
        const size_t n = jl[2 * (size_t)i] - 2;
        bfs__sb_raw(b, b->esc ? "\\\"" : "\"", b->esc ? 2 : 1);
        bfs__sb_raw(b, p->t[i].name, n);
        bfs__sb_raw(b, b->esc ? "\\\"" : "\"", b->esc ? 2 : 1);
    } else {
        bfs__sb_json_str(b, p->t[i].name, strlen(p->t[i].name));
    }
}

/* ---- the header's entries, the fast way (at W = 64 every rank file's header lists
 * all 92k tensors of DeepSeek-V3, 600 MB of text; through bfs__sb_raw a piece at a time
 * that was 10-15% of a run). Where the plan's cache says a name needs no escape, an
 * entry is counted by arithmetic and written straight into the buffer, which has room
 * for its longest form; every other entry (and a plan without the cache) goes the
 * general way above. The bytes are the same: tests/group_identical.sh and every test
 * that compares outputs with a whole run's or the upstream writer's. */
static size_t bfs__u64_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}


/* "[a,b,c]" */
static size_t bfs__dims_len(const uint64_t *s, int ndim)
{
    size_t n = 2 + (ndim > 1 ? (size_t)ndim - 1 : 0);
    for (int d = 0; d < ndim; d++)
        n += bfs__u64_len(s[d]);
    return n;
}

static char *bfs__dims_put(char *o, const uint64_t *s, int ndim)
{
    *o++ = '[';
    for (int d = 0; d < ndim; d++) {
        if (d)
            *o++ = ',';
        o = bfs__u64_put(o, s[d]);
    }
    *o++ = ']';
    return o;
}

/* tensor ti's name as it goes in (quotes and all: b->esc's form) when the fast way takes it:
 * its bytes (no escape needed) in *name, their count in *nl; 0 when it does not */
static size_t bfs__fast_name(const bfs_sbuf *b, const bfs_plan *p, size_t ti, const char **name, size_t *nl)
{
    const uint32_t *jl = p->name_jlen;
    if (!jl || b->oom || jl[2 * ti + 1] - jl[2 * ti] != 2)
        return 0;
    *name = p->t[ti].name;
    *nl = jl[2 * ti] - 2;
    return jl[2 * ti + b->esc];
}

/* room to write an entry of a name of nl bytes and ndim dims straight in, or false */
static bool bfs__fast_room(const bfs_sbuf *b, size_t nl, int ndim)
{
    return !b->count && b->cap - b->n > nl + 160 + 21 * (size_t)ndim;
}

static const char bfs__so_key[] = ":{\\\"saved_offsets\\\":"; /* escaped: inside the string */
static const char bfs__k_dtype[] = ":{\"dtype\":\"", bfs__k_shape[] = "\",\"shape\":", bfs__k_off[] = ",\"data_offsets\":[";
#define BFS_PUT(o, lit) (memcpy((o), (lit), sizeof(lit) - 1), (o) += sizeof(lit) - 1)

/* DCP_SHARDING_INFO's entry of piece i (after ',' unless the first): 1 done, 0 not taken */
static int bfs__fast_so(bfs_sbuf *b, const bfs_plan *p, size_t i, const bfs_piece *pc, const uint64_t *so)
{
    const bfs_ltensor *t = &p->t[pc->tensor];
    const char *name;
    size_t nl = 0;
    const size_t jn = bfs__fast_name(b, p, pc->tensor, &name, &nl);
    if (!jn)
        return 0;
    if (b->count) {
        b->n += (i ? 1 : 0) + jn + sizeof bfs__so_key - 1 + bfs__dims_len(so, t->ndim) + 1;
        return 1;
    }
    if (!bfs__fast_room(b, nl, t->ndim))
        return 0;
    char *o = b->p + b->n;
    if (i)
        *o++ = ',';
    BFS_PUT(o, "\\\"");
    memcpy(o, name, nl);
    o += nl;
    BFS_PUT(o, "\\\"");
    BFS_PUT(o, bfs__so_key);
    o = bfs__dims_put(o, so, t->ndim);
    *o++ = '}';
    b->n = (size_t)(o - b->p);
    return 1;
}

/* the entry of a piece of shape[] at data offsets [pos, end) (after ','): 1 done, 0 not taken */
static int bfs__fast_entry(bfs_sbuf *b, const bfs_plan *p, const bfs_piece *pc, const uint64_t *shape, uint64_t pos,
                           uint64_t end)
{
    const bfs_ltensor *t = &p->t[pc->tensor];
    const char *name, *dt = bfs__dtype_name(t->out_dtype);
    size_t nl = 0;
    const size_t jn = bfs__fast_name(b, p, pc->tensor, &name, &nl), dl = strlen(dt);
    if (!jn || dl > 16)
        return 0;
    if (b->count) {
        b->n += 1 + jn + sizeof bfs__k_dtype - 1 + dl + sizeof bfs__k_shape - 1 + bfs__dims_len(shape, t->ndim) +
                sizeof bfs__k_off - 1 + bfs__u64_len(pos) + 1 + bfs__u64_len(end) + 2;
        return 1;
    }
    if (!bfs__fast_room(b, nl, t->ndim))
        return 0;
    char *o = b->p + b->n;
    *o++ = ',';
    *o++ = '"';
    memcpy(o, name, nl);
    o += nl;
    *o++ = '"';
    BFS_PUT(o, bfs__k_dtype);
    memcpy(o, dt, dl);
    o += dl;
    BFS_PUT(o, bfs__k_shape);
    o = bfs__dims_put(o, shape, t->ndim);
    BFS_PUT(o, bfs__k_off);
    o = bfs__u64_put(o, pos);
    *o++ = ',';
    o = bfs__u64_put(o, end);
    BFS_PUT(o, "]}");
    b->n = (size_t)(o - b->p);
    return 1;
}

/* File f's header up to its closing '}' (the pieces' nbytes set; their offsets counted
 * from the data section here). */
static void bfs__emit_header(const bfs_plan *p, const bfs_outfile *f, bfs_sbuf *b)
{
    const bool dcp = p->layout == BFS_LAYOUT_DCP;
    bfs__sb_str(b, "{\"__metadata__\":{");
    if (dcp) { /* a JSON text as a JSON string: {"name":{"saved_offsets":[r0,0..]},...} */
        bfs__sb_str(b, "\"DCP_SHARDING_INFO\":\"");
        b->esc = true;
        bfs__sb_put(b, "{", 1);
        for (size_t i = 0; i < f->npieces; i++) {
            const bfs_piece *pc = &f->pieces[i];
            const bfs_ltensor *t = &p->t[pc->tensor];
            uint64_t so[BFS_MAX_DIMS] = {0};
            so[0] = pc->row0;
            if (bfs__fast_so(b, p, i, pc, so))
                continue;
            if (i)
                bfs__sb_raw(b, ",", 1);
            bfs__sb_name(b, p, pc->tensor);
            bfs__sb_raw(b, bfs__so_key, sizeof bfs__so_key - 1);
            bfs__sb_shape(b, so, t->ndim);
            bfs__sb_raw(b, "}", 1);
        }
        bfs__sb_put(b, "}", 1);
        b->esc = false;
        bfs__sb_str(b, "\",\"DCP_VERSION\":\"1.0\",");
    }
    bfs__sb_str(b, "\"format\":\"pt\"}");
    uint64_t pos = 0;
    for (size_t i = 0; i < f->npieces; i++) {
        const bfs_piece *pc = &f->pieces[i];
        const bfs_ltensor *t = &p->t[pc->tensor];
        uint64_t shape[BFS_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (t->ndim > 0)
            shape[0] = pc->row1 - pc->row0;
        if (bfs__fast_entry(b, p, pc, shape, pos, pos + pc->nbytes)) {
            pos += pc->nbytes;
            continue;
        }
        const char *dt = bfs__dtype_name(t->out_dtype);
        bfs__sb_raw(b, ",", 1);
        bfs__sb_name(b, p, pc->tensor);
        bfs__sb_raw(b, bfs__k_dtype, sizeof bfs__k_dtype - 1);
        bfs__sb_raw(b, dt, strlen(dt));
        bfs__sb_raw(b, bfs__k_shape, sizeof bfs__k_shape - 1);
        bfs__sb_shape(b, shape, t->ndim);
        bfs__sb_raw(b, bfs__k_off, sizeof bfs__k_off - 1);
        bfs__sb_u64(b, pos);
        bfs__sb_raw(b, ",", 1);
        bfs__sb_u64(b, pos + pc->nbytes); /* bounded by the layout */
        bfs__sb_raw(b, "]}", 2);
        pos += pc->nbytes;
    }
    bfs__sb_put(b, "}", 1);
}

/* space padded: the data section starts on a 64-byte boundary */
static uint64_t bfs__padded_len(uint64_t n) { return ((8 + n + 63) / 64) * 64 - 8; }

/* f's header text into b (room for hl + 1 bytes), padded with spaces to hl, NUL after */
static int bfs__header_text(const bfs_plan *p, const bfs_outfile *f, bfs_sbuf *b)
{
    const uint64_t hl = f->data_start - 8;
    bfs__emit_header(p, f, b);
    if (b->oom)
        return bfs__err(BFS_ENOMEM, "%s: out of memory building its %llu-byte header", f->name, (unsigned long long)hl);
    if (bfs__padded_len(b->n) != hl || b->cap <= hl)
        return bfs__err(BFS_EINTERNAL, "%s: header of %zu bytes, the plan counted %llu", f->name, b->n,
                        (unsigned long long)hl);
    memset(b->p + b->n, ' ', (size_t)hl - b->n);
    b->p[hl] = '\0';
    return 0;
}

int bfs__plan_header(const bfs_plan *p, const bfs_outfile *f, char **out)
{
    const uint64_t hl = f->data_start - 8;
    *out = NULL;
    if (hl >= SIZE_MAX)
        return bfs__err(BFS_ENOMEM, "%s: out of memory building its %llu-byte header", f->name, (unsigned long long)hl);
    bfs_sbuf b = {.p = malloc((size_t)hl + 1), .cap = (size_t)hl + 1, .fixed = true}; /* the length counted */
    if (!b.p)
        return bfs__err(BFS_ENOMEM, "%s: out of memory building its %llu-byte header", f->name, (unsigned long long)hl);
    const int rc = bfs__header_text(p, f, &b);
    if (rc < 0) {
        free(b.p);
        return rc;
    }
    *out = b.p;
    return 0;
}

int bfs__plan_header_into(const bfs_plan *p, const bfs_outfile *f, char *buf, size_t cap)
{
    const uint64_t hl = f->data_start - 8;
    if (cap <= f->data_start)
        return bfs__err(BFS_EINTERNAL, "%s: a %zu-byte buffer for its %llu-byte header", f->name, cap,
                        (unsigned long long)f->data_start);
    bfs__st_put_len((uint8_t *)buf, hl); /* safetensors: the header's length, u64 little-endian */
    bfs_sbuf b = {.p = buf + 8, .cap = cap - 8, .fixed = true};
    return bfs__header_text(p, f, &b);
}

/* f's header length (space padded: the data starts on a 64-byte boundary) into *hl,
 * counted; the plan's name cache made on the first call */
int bfs__plan_header_len(bfs_plan *p, const bfs_outfile *f, uint64_t *hl)
{
    if (!p->name_jlen && !p->name_jlen_failed) { /* once a plan: each name's JSON length, both ways */
        p->name_jlen = malloc((p->nt + 1) * 2 * sizeof *p->name_jlen);
        for (size_t i = 0; p->name_jlen && i < p->nt; i++)
            for (int e = 0; e < 2 && p->name_jlen; e++) {
                bfs_sbuf c = {.count = true, .esc = e != 0};
                bfs__sb_json_str(&c, p->t[i].name, strlen(p->t[i].name));
                if (c.oom || c.n > UINT32_MAX) {
                    free(p->name_jlen);
                    p->name_jlen = NULL;
                } else {
                    p->name_jlen[2 * i + (size_t)e] = (uint32_t)c.n;
                }
            }
        p->name_jlen_failed = !p->name_jlen;
    }
    bfs_sbuf b = {.count = true}; /* no name cache (out of memory): every name counted */
    bfs__emit_header(p, f, &b);
    if (b.oom)
        return bfs__err(BFS_ENOMEM, "out of memory");
    *hl = bfs__padded_len(b.n);
    if (*hl > BFS_ST_MAX_HEADER)
        return bfs__err(BFS_EINPUT, "%s: its header (%zu tensors) would be %llu bytes, over the %llu-byte limit of safetensors readers; use a larger --world-size or fewer tensors per file",
                        f->name, f->npieces, (unsigned long long)*hl, BFS_ST_MAX_HEADER);
    return 0;
}
