/*
 * A strict pull scanner over one JSON text in memory (json_scan.h). It owns the JSON
 * grammar as jansson 2.14's json_loadb(JSON_REJECT_DUPLICATES) reads it, so that a
 * reader moving off a jansson tree accepts and refuses the same texts:
 *   - the top value is an object or an array, then only whitespace (' ', \t, \n, \r);
 *   - strings: valid UTF-8 (no overlong form, no surrogate, nothing above U+10FFFF), no
 *     byte below 0x20, escapes \" \\ \/ \b \f \n \r \t \uXXXX, a \u surrogate only as a
 *     pair, no \u0000 (jansson without JSON_ALLOW_NUL);
 *   - numbers: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?; an integer must fit an
 *     int64, a real must not overflow a double (underflow is fine);
 *   - true, false, null; a value nests at most BFS_JS_MAX_DEPTH deep;
 *   - one NUL byte right after a number or a literal is passed over, as jansson does (its
 *     lexer reads one character ahead and, giving back a NUL, loses it: "[1\0]" is [1]);
 *   - no object holds the same key twice, compared decoded ("a" and "\u0061" are one).
 * Memory: the open objects' key sets (8 bytes a slot, at least half full once grown;
 * keys are not copied, a slot points at the key's bytes in the text) and one scratch
 * buffer for a string decoded on request or a real's text. Every allocation failure is
 * BFS_ENOMEM; nothing here aborts.
 */
#include "base/json_scan.h"
#include "base/base.h"

#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ST_TOP, ST_VALUE, ST_VALUE_OR_END, ST_KEY_OR_END, ST_KEY, ST_COLON, ST_COMMA_OR_END, ST_DONE };

typedef struct { uint32_t off1, hash; } bfs_jslot; /* off1: the key's s_off + 1; 0: empty */
/* An object's keys. While they come without escapes and in increasing byte order (an index
 * written with sort_keys: 92k keys), each is only compared with the one before, which no
 * earlier key can equal; at the first that does not, every key so far goes into the set. */
struct bfs_jkeys {
    bfs_jslot *slot;
    size_t cap, n;
    uint32_t *run;       /* the keys in increasing order, not in the set yet: their s_off */
    size_t nrun, crun;
    uint32_t last_raw;   /* run[nrun - 1]'s raw length */
    bool hashed;         /* the set holds every key of the object */
};

static int js_bad(bfs_jscan *s, size_t at, const char *why)
{
    s->why = why;
    s->why_at = at;
    return BFS_EINPUT;
}

int bfs__js_init(bfs_jscan *s, const char *p, size_t len)
{
    memset(s, 0, sizeof *s);
    s->p = p;
    s->len = len;
    if (len >= UINT32_MAX - 1)
        return js_bad(s, 0, "text too long");
    return 0;
}

void bfs__js_free(bfs_jscan *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->nkeys; i++)
        free(s->keys[i].slot), free(s->keys[i].run);
    free(s->keys);
    free(s->buf);
    s->keys = NULL;
    s->buf = NULL;
    s->nkeys = 0;
}

static int js_hex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* the 4 hex digits at p (all present): their value, or -1 */
static long js_hex4(const char *p)
{
    long v = 0;
    for (int i = 0; i < 4; i++) {
        const int h = js_hex(p[i]);
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    return v;
}

static int js_utf8_put(uint32_t cp, unsigned char *o)
{
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The decoded bytes of the byte or escape at p[*i] of a string already validated: their
 * count (1 to 4), *i moved past it; 0 at the closing quote. */
static int js_dec(const char *p, size_t *i, unsigned char o[4])
{
    const char c = p[*i];
    if (c == '"')
        return 0;
    if (c != '\\') {
        o[0] = (unsigned char)c;
        (*i)++;
        return 1;
    }
    const char e = p[*i + 1];
    *i += 2;
    switch (e) {
    case 'b': o[0] = '\b'; return 1;
    case 'f': o[0] = '\f'; return 1;
    case 'n': o[0] = '\n'; return 1;
    case 'r': o[0] = '\r'; return 1;
    case 't': o[0] = '\t'; return 1;
    case 'u': break;
    default: o[0] = (unsigned char)e; return 1; /* " \ / */
    }
    uint32_t cp = (uint32_t)js_hex4(p + *i);
    *i += 4;
    if (cp >= 0xD800 && cp <= 0xDBFF) { /* validated: a low surrogate follows */
        cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)js_hex4(p + *i + 2) - 0xDC00);
        *i += 6;
    }
    return js_utf8_put(cp, o);
}

/* FNV-1a of the string's decoded bytes: its raw bytes when it holds no escape (raw: their count) */
static uint32_t js_hash(const char *p, size_t off, bool esc, size_t raw)
{
    uint32_t h = 2166136261u;
    unsigned char o[4];
    int k;
    if (!esc) {
        for (size_t i = 0; i < raw; i++)
            h = (h ^ (unsigned char)p[off + i]) * 16777619u;
        return h;
    }
    for (size_t i = off; (k = js_dec(p, &i, o)) > 0;)
        for (int j = 0; j < k; j++)
            h = (h ^ o[j]) * 16777619u;
    return h;
}

int bfs__js_strcmp(const bfs_jscan *s, size_t off, size_t off2)
{
    unsigned char a[4], b[4];
    int na = 0, nb = 0, ia = 0, ib = 0;
    size_t i = off, j = off2;
    for (;;) {
        if (ia == na) {
            na = js_dec(s->p, &i, a);
            ia = 0;
        }
        if (ib == nb) {
            nb = js_dec(s->p, &j, b);
            ib = 0;
        }
        if (na == 0 || nb == 0)
            return (na != 0) - (nb != 0);
        if (a[ia] != b[ib])
            return a[ia] < b[ib] ? -1 : 1;
        ia++;
        ib++;
    }
}

size_t bfs__js_dump_str(const bfs_jscan *s, size_t off, char *out)
{
    size_t n = 0, i = off;
    unsigned char o[4];
    int k;
    out[n++] = '"';
    while ((k = js_dec(s->p, &i, o)) > 0) {
        if (k > 1 || (o[0] >= 0x20 && o[0] != '"' && o[0] != '\\')) {
            memcpy(out + n, o, (size_t)k);
            n += (size_t)k;
            continue;
        }
        const char *e = NULL;
        switch (o[0]) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        }
        if (e) {
            memcpy(out + n, e, 2);
            n += 2;
        } else {
            n += (size_t)sprintf(out + n, "\\u%04X", o[0]);
        }
    }
    out[n++] = '"';
    return n;
}

/* room for n bytes in the scratch buffer; false when out of memory */
static bool js_scratch(bfs_jscan *s, size_t n)
{
    if (n <= s->cap)
        return true;
    char *nb = realloc(s->buf, n);
    if (!nb)
        return false;
    s->buf = nb;
    s->cap = n;
    return true;
}

/* the string at off decoded into the scratch buffer; raw, esc: its raw length and whether
 * it holds escapes */
static const char *js_str_dec(bfs_jscan *s, size_t off, size_t raw, bool esc, size_t *len)
{
    if (!js_scratch(s, raw + 1))
        return NULL;
    size_t n = 0;
    if (!esc) {
        memcpy(s->buf, s->p + off, raw);
        n = raw;
    } else {
        unsigned char o[4];
        int k;
        for (size_t i = off; (k = js_dec(s->p, &i, o)) > 0; n += (size_t)k)
            memcpy(s->buf + n, o, (size_t)k);
    }
    s->buf[n] = '\0';
    if (len)
        *len = n;
    return s->buf;
}

const char *bfs__js_str_at(bfs_jscan *s, size_t off, size_t *len)
{
    size_t raw = 0;
    bool esc = false;
    while (s->p[off + raw] != '"') {
        esc |= s->p[off + raw] == '\\';
        raw += s->p[off + raw] == '\\' ? 2 : 1;
    }
    return js_str_dec(s, off, raw, esc, len);
}

/* the last string token: its raw length and escapes known from the scan */
const char *bfs__js_str(bfs_jscan *s, size_t *len) { return js_str_dec(s, s->s_off, s->s_raw, s->s_esc, len); }

/* jansson's utf8_check_first / utf8_check_full: the length of the UTF-8 sequence at
 * p[0..avail), 0 when it is not a valid one */
static size_t js_utf8_len(const unsigned char *p, size_t avail)
{
    const unsigned char c = p[0];
    size_t n;
    uint32_t v;
    if (c < 0x80)
        return 1;
    if (c < 0xC2 || c > 0xF4)
        return 0;
    if (c < 0xE0) {
        n = 2;
        v = c & 0x1F;
    } else if (c < 0xF0) {
        n = 3;
        v = c & 0x0F;
    } else {
        n = 4;
        v = c & 0x07;
    }
    if (avail < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (p[i] & 0x3F);
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) || (n == 3 && v < 0x800) || (n == 4 && v < 0x10000))
        return 0;
    return n;
}

/* A \u escape at p[i] ('\\' at i): its length (6, or 12 for a surrogate pair), 0 when bad */
static size_t js_uesc(bfs_jscan *s, size_t i, bool *nul)
{
    const char *p = s->p;
    if (s->len - i < 6 || js_hex4(p + i + 2) < 0)
        return js_bad(s, i, "invalid escape"), 0;
    const long v = js_hex4(p + i + 2);
    if (v >= 0xDC00 && v <= 0xDFFF)
        return js_bad(s, i, "invalid Unicode: a lone low surrogate"), 0;
    if (v < 0xD800 || v > 0xDBFF) {
        *nul |= v == 0;
        return 6;
    }
    if (s->len - i < 12 || p[i + 6] != '\\' || p[i + 7] != 'u')
        return js_bad(s, i, "invalid Unicode: a high surrogate without its low one"), 0;
    const long w = js_hex4(p + i + 8);
    if (w < 0)
        return js_bad(s, i + 6, "invalid escape"), 0;
    if (w < 0xDC00 || w > 0xDFFF)
        return js_bad(s, i, "invalid Unicode: a high surrogate without its low one"), 0;
    return 12;
}

/* 1 for the bytes a string holds as they are, with nothing to check: 0x20-0x7F but '"' and '\\' */
static const unsigned char js_plain[256] = {
    [0x20] = 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x22 '"' */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, /* 0x5C '\\' */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
};

/* The string whose opening quote is at s->pos: validated, s->s_* set, pos past it. */
static int js_string(bfs_jscan *s, bool key)
{
    const char *p = s->p;
    const size_t start = s->pos;
    size_t i = start + 1;
    bool esc = false, nul = false;
    for (;;) {
        while (i < s->len && js_plain[(unsigned char)p[i]]) /* printable ASCII but '"' and '\\' */
            i++;
        if (i == s->len)
            return js_bad(s, start, "premature end of input inside a string");
        const unsigned char c = (unsigned char)p[i];
        if (c == '"')
            break;
        if (c < 0x20) {
            snprintf(s->why_buf, sizeof s->why_buf, "control character 0x%x in a string", c);
            return js_bad(s, i, s->why_buf);
        }
        if (c >= 0x80) {
            const size_t n = js_utf8_len((const unsigned char *)p + i, s->len - i);
            if (!n) {
                snprintf(s->why_buf, sizeof s->why_buf, "unable to decode byte 0x%x", c);
                return js_bad(s, i, s->why_buf);
            }
            i += n;
            continue;
        }
        if (c != '\\') {
            i++;
            continue;
        }
        esc = true;
        if (i + 1 == s->len)
            return js_bad(s, start, "premature end of input inside a string");
        const char e = p[i + 1];
        if (e == 'u') {
            const size_t n = js_uesc(s, i, &nul);
            if (!n)
                return BFS_EINPUT;
            i += n;
        } else if (e && strchr("\"\\/bfnrt", e)) {
            i += 2;
        } else {
            return js_bad(s, i, "invalid escape");
        }
    }
    if (nul)
        return js_bad(s, start, key ? "NUL byte in object key not supported" : "\\u0000 is not allowed");
    s->s_off = start + 1;
    s->s_raw = i - start - 1;
    s->s_esc = esc;
    s->pos = i + 1;
    return 0;
}

static bool js_digit(char c) { return c >= '0' && c <= '9'; }

/* where the next token starts after a number or literal ending at i (the NUL rule above) */
static size_t js_lost_nul(const bfs_jscan *s, size_t i) { return i < s->len && s->p[i] == '\0' ? i + 1 : i; }

static int js_number(bfs_jscan *s, bfs_jtok *tok)
{
    const char *p = s->p;
    const size_t start = s->pos, n = s->len;
    size_t i = start;
    const bool neg = p[i] == '-';
    i += neg;
    if (i == n || !js_digit(p[i]))
        return js_bad(s, start, "invalid token");
    if (p[i] == '0') {
        i++;
        if (i < n && js_digit(p[i]))
            return js_bad(s, start, "invalid token");
    } else {
        while (i < n && js_digit(p[i]))
            i++;
    }
    if (i == n || (p[i] != '.' && p[i] != 'e' && p[i] != 'E')) {
        /* as strtoll: [-2^63, 2^63 - 1] */
        const unsigned long long lim = neg ? (unsigned long long)LLONG_MAX + 1 : (unsigned long long)LLONG_MAX;
        unsigned long long v = 0;
        for (size_t k = start + neg; k < i; k++) {
            const unsigned d = (unsigned)(p[k] - '0');
            if (v > (lim - d) / 10)
                return js_bad(s, start, neg ? "too big negative integer" : "too big integer");
            v = v * 10 + d;
        }
        s->ival = neg ? (v == (unsigned long long)LLONG_MAX + 1 ? LLONG_MIN : -(long long)v) : (long long)v;
        s->pos = js_lost_nul(s, i);
        *tok = BFS_JT_INT;
        return 0;
    }
    if (p[i] == '.') {
        i++;
        if (i == n || !js_digit(p[i]))
            return js_bad(s, start, "invalid token");
        while (i < n && js_digit(p[i]))
            i++;
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        if (i < n && (p[i] == '+' || p[i] == '-'))
            i++;
        if (i == n || !js_digit(p[i]))
            return js_bad(s, start, "invalid token");
        while (i < n && js_digit(p[i]))
            i++;
    }
    /* overflow as jansson finds it: strtod of the text, '.' as the locale writes it */
    const size_t tl = i - start;
    if (!js_scratch(s, tl + 1))
        return BFS_ENOMEM;
    memcpy(s->buf, p + start, tl);
    s->buf[tl] = '\0';
    const char point = localeconv()->decimal_point[0];
    char *dot = strchr(s->buf, '.');
    if (dot && point && point != '.')
        *dot = point;
    errno = 0;
    const double d = strtod(s->buf, NULL);
    if ((d == HUGE_VAL || d == -HUGE_VAL) && errno == ERANGE)
        return js_bad(s, start, "real number overflow");
    s->pos = js_lost_nul(s, i);
    *tok = BFS_JT_REAL;
    return 0;
}

static int js_literal(bfs_jscan *s, bfs_jtok *tok)
{
    const size_t start = s->pos;
    size_t i = start;
    while (i < s->len && ((s->p[i] >= 'a' && s->p[i] <= 'z') || (s->p[i] >= 'A' && s->p[i] <= 'Z')))
        i++;
    const size_t n = i - start;
    if (n == 4 && !memcmp(s->p + start, "true", 4))
        *tok = BFS_JT_TRUE;
    else if (n == 5 && !memcmp(s->p + start, "false", 5))
        *tok = BFS_JT_FALSE;
    else if (n == 4 && !memcmp(s->p + start, "null", 4))
        *tok = BFS_JT_NULL;
    else
        return js_bad(s, start, "invalid token");
    s->pos = js_lost_nul(s, i);
    return 0;
}

static int js_set_put(bfs_jscan *s, bfs_jkeys *k, size_t off, uint32_t h);

/* the key at s->s_off into the keys of the object at depth s->depth: BFS_EINPUT when it is
 * there already */
static int js_key_add(bfs_jscan *s)
{
    if (s->depth > s->nkeys) {
        bfs_jkeys *nk = realloc(s->keys, (size_t)s->depth * 2 * sizeof *nk);
        if (!nk)
            return BFS_ENOMEM;
        memset(nk + s->nkeys, 0, ((size_t)s->depth * 2 - (size_t)s->nkeys) * sizeof *nk);
        s->keys = nk;
        s->nkeys = s->depth * 2;
    }
    bfs_jkeys *k = &s->keys[s->depth - 1];
    if (!k->hashed) {
        const char *a = s->p + (k->nrun ? k->run[k->nrun - 1] : 0), *b = s->p + s->s_off;
        const size_t la = k->last_raw, lb = s->s_raw;
        const int c = k->nrun ? memcmp(a, b, la < lb ? la : lb) : -1;
        if (!s->s_esc && (c < 0 || (c == 0 && la < lb))) { /* after every key so far */
            if (bfs__grow((void **)&k->run, &k->crun, k->nrun + 1, sizeof *k->run) != 0)
                return BFS_ENOMEM;
            k->run[k->nrun++] = (uint32_t)s->s_off;
            k->last_raw = (uint32_t)s->s_raw;
            return 0;
        }
        k->hashed = true; /* the run's keys into the set, then this one */
        for (size_t i = 0; i < k->nrun; i++) {
            const size_t off = k->run[i], raw = (size_t)((const char *)memchr(s->p + off, '"', s->len - off) - (s->p + off));
            const int rc = js_set_put(s, k, off, js_hash(s->p, off, false, raw));
            if (rc != 0)
                return rc;
        }
        k->nrun = 0;
    }
    return js_set_put(s, k, s->s_off, js_hash(s->p, s->s_off, s->s_esc, s->s_raw));
}

/* key at off (hash h) into k's set: BFS_EINPUT when it is there already */
static int js_set_put(bfs_jscan *s, bfs_jkeys *k, size_t off, uint32_t h)
{
    if ((k->n + 1) * 2 > k->cap) {
        const size_t nc = k->cap ? k->cap * 2 : 8;
        bfs_jslot *ns = calloc(nc, sizeof *ns);
        if (!ns)
            return BFS_ENOMEM;
        for (size_t i = 0; i < k->cap; i++) {
            if (!k->slot[i].off1)
                continue;
            size_t j = k->slot[i].hash & (nc - 1);
            while (ns[j].off1)
                j = (j + 1) & (nc - 1);
            ns[j] = k->slot[i];
        }
        free(k->slot);
        k->slot = ns;
        k->cap = nc;
    }
    size_t j = h & (k->cap - 1);
    for (; k->slot[j].off1; j = (j + 1) & (k->cap - 1))
        if (k->slot[j].hash == h && bfs__js_strcmp(s, k->slot[j].off1 - 1, off) == 0)
            return js_bad(s, s->at, "duplicate object key");
    k->slot[j].off1 = (uint32_t)off + 1;
    k->slot[j].hash = h;
    k->n++;
    return 0;
}

/* the object or array at the top of the stack closes: its key set emptied for the next */
static void js_close(bfs_jscan *s)
{
    s->depth--;
    if (s->depth < s->nkeys) {
        bfs_jkeys *k = &s->keys[s->depth];
        if (k->cap > 64) {
            free(k->slot);
            k->slot = NULL;
            k->cap = 0;
        } else if (k->n) {
            memset(k->slot, 0, k->cap * sizeof *k->slot);
        }
        if (k->crun > 64) {
            free(k->run);
            k->run = NULL;
            k->crun = 0;
        }
        k->n = k->nrun = 0;
        k->hashed = false;
    }
    s->state = s->depth ? ST_COMMA_OR_END : ST_DONE;
}

static int js_value(bfs_jscan *s, char c, bfs_jtok *tok)
{
    if (s->depth + 1 > BFS_JS_MAX_DEPTH)
        return js_bad(s, s->pos, "maximum parsing depth reached");
    if (c == '{' || c == '[') {
        s->stack[s->depth++] = (unsigned char)c;
        s->pos++;
        s->state = c == '{' ? ST_KEY_OR_END : ST_VALUE_OR_END;
        *tok = c == '{' ? BFS_JT_OBJ : BFS_JT_ARR;
        return 0;
    }
    int rc;
    if (c == '"') {
        rc = js_string(s, false);
        *tok = BFS_JT_STR;
    } else if (c == '-' || js_digit(c)) {
        rc = js_number(s, tok);
    } else {
        rc = js_literal(s, tok);
    }
    if (rc == 0)
        s->state = s->depth ? ST_COMMA_OR_END : ST_DONE;
    return rc;
}

int bfs__js_next(bfs_jscan *s, bfs_jtok *tok)
{
    if (s->why)
        return BFS_EINPUT;
    for (;;) {
        while (s->pos < s->len && (s->p[s->pos] == ' ' || s->p[s->pos] == '\t' || s->p[s->pos] == '\n' || s->p[s->pos] == '\r'))
            s->pos++;
        s->at = s->pos;
        if (s->pos == s->len) {
            if (s->state != ST_DONE)
                return js_bad(s, s->pos, "premature end of input");
            *tok = BFS_JT_END;
            return 0;
        }
        const char c = s->p[s->pos];
        const bool obj = s->depth && s->stack[s->depth - 1] == '{';
        switch (s->state) {
        case ST_TOP:
            if (c != '{' && c != '[')
                return js_bad(s, s->pos, "'[' or '{' expected");
            return js_value(s, c, tok);
        case ST_DONE:
            return js_bad(s, s->pos, "end of file expected");
        case ST_COLON:
            if (c != ':')
                return js_bad(s, s->pos, "':' expected");
            s->pos++;
            s->state = ST_VALUE;
            continue;
        case ST_COMMA_OR_END:
            if (c == ',') {
                s->pos++;
                s->state = obj ? ST_KEY : ST_VALUE;
                continue;
            }
            if (c != (obj ? '}' : ']'))
                return js_bad(s, s->pos, obj ? "',' or '}' expected" : "',' or ']' expected");
            s->pos++;
            js_close(s);
            *tok = obj ? BFS_JT_OBJ_END : BFS_JT_ARR_END;
            return 0;
        case ST_VALUE_OR_END:
        case ST_KEY_OR_END:
            if (c == (obj ? '}' : ']')) {
                s->pos++;
                js_close(s);
                *tok = obj ? BFS_JT_OBJ_END : BFS_JT_ARR_END;
                return 0;
            }
            if (!obj)
                return js_value(s, c, tok);
            /* a key: */
            /* fall through */
        case ST_KEY: {
            if (c != '"')
                return js_bad(s, s->pos, "string or '}' expected");
            int rc = js_string(s, true);
            if (rc == 0)
                rc = js_key_add(s);
            if (rc)
                return rc;
            s->state = ST_COLON;
            *tok = BFS_JT_KEY;
            return 0;
        }
        default:
            return js_value(s, c, tok);
        }
    }
}

int bfs__js_skip(bfs_jscan *s, bfs_jtok tok)
{
    if (tok != BFS_JT_OBJ && tok != BFS_JT_ARR)
        return 0;
    const int depth = s->depth - 1;
    while (s->depth > depth) {
        const int rc = bfs__js_next(s, &tok);
        if (rc)
            return rc;
    }
    return 0;
}
