/*
 * compressed-tensors: which config group quantizes a module (docs/FORMATS.md 7.5), as
 * compressed-tensors 0.20 decides it in apply_quantization_config:
 *   - the targets of all groups, in file order, into one map target -> group; a target
 *     listed by two groups belongs to the later one (target_to_scheme[target] = scheme);
 *   - a module is quantized when a target matches it (match_name: "re:" + Python re.match,
 *     else the exact name; or _match_class: a class in the module's MRO) and no ignore entry
 *     does (the same test);
 *   - of the targets that match, match_targets orders the name matches (targets sorted by
 *     ("re:" in target, target)) before the class matches; the first one's group wins.
 * A checkpoint does not say a module's class: a module whose weight is quantized is taken as
 * an nn.Linear (MRO Linear, Module), what the compressors quantize. When a module matches no
 * name or regex target and the choice then depends on a class bfshard cannot see (another
 * class-name target of another group), it is refused rather than guessed.
 *
 * Python patterns run through POSIX extended regexes (regcomp), translated so that the
 * language is the same (ct_translate); a construct without an equivalent is refused.
 * Used by the compressed-tensors rows (fp8.c, int4.c, nvfp4.c, ctmx.c) and by claim.c, which
 * also owns the matcher's lifetime (bfs__ctmatch_new / _free). Uses common.c only.
 */
#include "format.h"

#include <jansson.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ct_pat {
    const char *text; /* as written in config.json (owned by the parsed config) */
    int is_re;        /* starts with "re:" (match_name) */
    int re_sort;      /* "re:" anywhere in it (match_targets' sort key) */
    int compiled;
    regex_t re;
    size_t group; /* targets: the last config group that lists it */
    int name;     /* not "re:": some module of the input has this name (else: a class name) */
} ct_pat;

struct bfs_ctmatch {
    ct_pat *tg, *ig;
    size_t ntg, nig, ngroups;
};

/* ---- Python re -> POSIX ERE ------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_putc(sbuf *b, char ch)
{
    if (b->n + 1 < b->cap)
        b->p[b->n++] = ch;
    b->p[b->n] = '\0';
}

static void sb_puts(sbuf *b, const char *s)
{
    for (; *s; s++)
        sb_putc(b, *s);
}

static const char *const ct_ws = " \t\n\r\f\v";

/* The byte of a single-character escape \e inside or outside a class (punctuation and the
 * control-character letters); -1 when e is none of those. */
static int ct_esc_char(unsigned char e)
{
    switch (e) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    default: break;
    }
    if (e == 0 || (e >= '0' && e <= '9') || (e >= 'A' && e <= 'Z') || (e >= 'a' && e <= 'z') || e == '_')
        return -1;
    return e;
}

/* Add the class \e (d, w, s) to set; 0 when e is not one. */
static int ct_class(unsigned char e, unsigned char set[256])
{
    if (e == 'd') {
        for (int ch = '0'; ch <= '9'; ch++)
            set[ch] = 1;
    } else if (e == 'w') {
        for (int ch = 0; ch < 256; ch++)
            set[ch] |= (ch >= '0' && ch <= '9') || (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || ch == '_';
    } else if (e == 's') {
        for (const char *w = ct_ws; *w; w++)
            set[(unsigned char)*w] = 1;
    } else {
        return 0;
    }
    return 1;
}

/* 1 digit, 2 upper case, 3 lower case letter, 0 anything else (ranges are written only
 * within one of these, where every locale orders them as ASCII does) */
static int ct_kind(int ch)
{
    return ch >= '0' && ch <= '9' ? 1 : ch >= 'A' && ch <= 'Z' ? 2 : ch >= 'a' && ch <= 'z' ? 3 : 0;
}

/* A byte set as a POSIX bracket expression (neg: its complement): ']' first, '^' not first,
 * '[' and '-' last, letters and digits as ranges. -1 when it cannot be written. */
static int ct_emit_set(sbuf *b, const unsigned char set[256], int neg)
{
    size_t count = 0;
    for (int ch = 1; ch < 256; ch++)
        count += set[ch];
    if (count == 0 || (count == 1 + (size_t)set['-'] && set['^'] && !neg))
        return -1; /* empty, or only '^' (and '-'): no bracket spells it */
    sb_putc(b, '[');
    if (neg)
        sb_putc(b, '^');
    if (set[']'])
        sb_putc(b, ']');
    int first = !set[']'];
    for (int ch = 1; ch < 256; ch++) {
        if (!set[ch] || ch == ']' || ch == '-' || ch == '^' || ch == '[')
            continue;
        int end = ch;
        while (ct_kind(ch) && end + 1 < 256 && set[end + 1] && ct_kind(end + 1) == ct_kind(ch))
            end++; /* a run of digits, upper or lower case letters: one range */
        sb_putc(b, (char)ch);
        if (end > ch + 1) {
            sb_putc(b, '-');
            sb_putc(b, (char)end);
        } else if (end == ch + 1) {
            sb_putc(b, (char)end);
        }
        ch = end;
        first = 0;
    }
    if (set['^']) {
        if (first && !neg)
            return -1; /* '^' first would negate */
        sb_putc(b, '^');
    }
    if (set['['])
        sb_putc(b, '[');
    if (set['-'])
        sb_putc(b, '-');
    sb_putc(b, ']');
    return 0;
}

/* A Python character class at p (just past '['): its POSIX bracket to b; returns the
 * characters consumed (through ']'), or -1. */
static long ct_bracket(const char *p, sbuf *b)
{
    unsigned char set[256] = {0};
    size_t i = 0;
    const int neg = p[0] == '^';
    i += (size_t)neg;
    for (int first = 1; p[i] && (p[i] != ']' || first); first = 0) {
        int lo;
        if (p[i] == '\\') {
            const unsigned char e = (unsigned char)p[i + 1];
            if (ct_class(e, set)) {
                i += 2;
                continue;
            }
            if ((lo = ct_esc_char(e)) < 0)
                return -1;
            i += 2;
        } else {
            lo = (unsigned char)p[i++];
        }
        if (p[i] == '-' && p[i + 1] && p[i + 1] != ']') { /* a range lo-hi */
            int hi;
            if (p[i + 1] == '\\') {
                if ((hi = ct_esc_char((unsigned char)p[i + 2])) < 0)
                    return -1;
                i += 3;
            } else {
                hi = (unsigned char)p[i + 1];
                i += 2;
            }
            if (hi < lo)
                return -1;
            for (int ch = lo; ch <= hi; ch++)
                set[ch] = 1;
        } else {
            set[lo] = 1;
        }
    }
    if (p[i] != ']' || ct_emit_set(b, set, neg) < 0)
        return -1;
    return (long)i + 1;
}

/* A Python repetition {m}, {m,}, {,n}, {m,n}, {,} at p (at '{'): its ERE bound to b and the
 * characters consumed; 0 when p is a literal '{' there (sre_parse's rule); -1 for a bound
 * past POSIX's RE_DUP_MAX (more than 4 digits). */
static long ct_bound(const char *p, sbuf *b)
{
    size_t i = 1, lo0, lo1, hi0, hi1;
    if (p[1] == '}')
        return 0;
    for (lo0 = i; p[i] >= '0' && p[i] <= '9'; i++)
        ;
    lo1 = i;
    hi0 = hi1 = 0;
    int comma = 0;
    if (p[i] == ',') {
        comma = 1;
        for (hi0 = ++i; p[i] >= '0' && p[i] <= '9'; i++)
            ;
        hi1 = i;
    }
    if (p[i] != '}')
        return 0;
    if (lo1 - lo0 > 4 || hi1 - hi0 > 4) /* POSIX bounds stop at RE_DUP_MAX */
        return -1;
    sb_putc(b, '{');
    if (lo1 == lo0)
        sb_putc(b, '0');
    for (size_t k = lo0; k < lo1; k++)
        sb_putc(b, p[k]);
    if (comma) {
        sb_putc(b, ',');
        for (size_t k = hi0; k < hi1; k++)
            sb_putc(b, p[k]);
    }
    sb_putc(b, '}');
    return (long)i + 1;
}

/* The copies regcomp makes of the atom before the quantifier at p: 2 for * + ?, else the
 * bound's largest count ({m} m, {m,n} n, {m,} m + 1). */
static uint64_t ct_copies(const char *p)
{
    if (*p != '{')
        return 2;
    char *end = NULL;
    const uint64_t lo = strtoull(p + 1, &end, 10), hi = *end == ',' ? strtoull(end + 1, NULL, 10) : 0;
    const uint64_t n = *end != ',' ? lo : end[1] == '}' ? lo + 1 : hi;
    return n ? n : 1;
}

/* regcomp expands repetitions by copying their atoms, nested ones multiplied, and a
 * quantifier of a quantifier ("a++++", which Python refuses: "multiple repeat") by copying
 * the tree again each time: memory exponential in the pattern. Refused beyond this size. */
#define CT_MAX_NODES 10000
#define CT_MAX_DEPTH 64

/* Python pattern py -> "^(" ERE ")" in out (cap bytes); 0, or -1 with why. */
static int ct_translate(const char *py, char *out, size_t cap, const char **why)
{
    sbuf b = {out, 0, cap};
    uint64_t size[CT_MAX_DEPTH + 1] = {0}, last = 0; /* each open group's size so far; the last atom's */
    int depth = 0, prev_quant = 0;
    out[0] = '\0';
    sb_puts(&b, "^(");
    for (size_t i = 0; py[i];) {
        const char ch = py[i], *at = py + i;
        int quant = 0, atom = 1;
        if (ch == '\\') {
            const unsigned char e = (unsigned char)py[i + 1];
            unsigned char set[256] = {0};
            int esc;
            if (ct_class((unsigned char)(e | 0x20), set) && (e == 'd' || e == 'w' || e == 's' || e == 'D' || e == 'W' || e == 'S')) {
                if (ct_emit_set(&b, set, e < 'a') < 0)
                    return *why = "a class", -1;
            } else if ((esc = ct_esc_char(e)) >= 0) {
                if (strchr(".[]()*+?{}|^$\\", esc))
                    sb_putc(&b, '\\');
                sb_putc(&b, (char)esc);
            } else {
                return *why = "an escape (\\b, \\A, \\Z, a backreference, ...) with no POSIX equivalent", -1;
            }
            i += 2;
        } else if (ch == '[') {
            const long k = ct_bracket(py + i + 1, &b);
            if (k < 0)
                return *why = "a character class", -1;
            i += 1 + (size_t)k;
        } else if (ch == '(') {
            if (py[i + 1] == '?') {
                if (py[i + 2] == ':') {
                    i += 3;
                } else if (py[i + 2] == 'P' && py[i + 3] == '<') {
                    const char *gt = strchr(py + i, '>');
                    if (!gt)
                        return *why = "a named group", -1;
                    i = (size_t)(gt - py) + 1;
                } else {
                    return *why = "a (?...) construct (lookaround, flags, backreference)", -1;
                }
            } else {
                i++;
            }
            sb_putc(&b, '(');
            if (depth == CT_MAX_DEPTH)
                return *why = "groups nested deeper than 64", -1;
            size[++depth] = 0;
            atom = 0;
        } else if (ch == ')' && depth > 0) {
            sb_putc(&b, ch);
            i++;
            last = size[depth--];
            size[depth] += last;
            atom = 0;
        } else if (ch == '{') {
            const long k = ct_bound(py + i, &b);
            if (k < 0)
                return *why = "a repetition bound over 9999", -1;
            if (k == 0) {
                sb_puts(&b, "\\{");
                i++;
            } else {
                i += (size_t)k;
                quant = 1;
            }
        } else if (ch == '}') {
            sb_puts(&b, "\\}");
            i++;
        } else {
            sb_putc(&b, ch);
            quant = ch == '*' || ch == '+' || ch == '?';
            atom = ch != '|';
            last = ch == '|' ? 0 : last;
            i++;
        }
        if (quant && prev_quant)
            return *why = "a quantifier of a quantifier (Python: multiple repeat)", -1;
        if (quant) {
            const uint64_t n = ct_copies(at);
            size[depth] += last * (n - 1);
            last *= n;
        } else if (atom) {
            size[depth]++;
            last = 1;
        }
        if (size[depth] > CT_MAX_NODES || last > CT_MAX_NODES)
            return *why = "a pattern larger than 10000 atoms once its repetitions are expanded", -1;
        prev_quant = quant;
        if (quant && (py[i] == '?' || py[i] == '+'))
            i++; /* lazy or possessive: whether a match exists does not depend on it */
    }
    sb_putc(&b, ')');
    if (b.n + 1 >= cap)
        return *why = "its length", -1;
    return 0;
}

/* ---- the matcher ----------------------------------------------------------------------- */

static int ct_compile(ct_pat *t, const char *qsource)
{
    if (!t->is_re)
        return 0;
    const char *py = t->text + 3, *why = NULL;
    const size_t cap = 64 * strlen(py) + 64; /* a class can grow ~10x; too long is refused, never cut */
    char *ere = malloc(cap);
    if (!ere)
        return bfs__err(BFS_ENOMEM, "out of memory");
    int rc = ct_translate(py, ere, cap, &why);
    if (rc == 0 && regcomp(&t->re, ere, REG_EXTENDED | REG_NOSUB) != 0) {
        rc = -1;
        why = "a pattern POSIX regcomp does not take";
    }
    free(ere);
    if (rc < 0)
        return bfs__err(BFS_EINPUT, "%s: quantization_config target or ignore \"%s\": %s is not supported in a compressed-tensors \"re:\" pattern",
                        qsource, t->text, why);
    t->compiled = 1;
    return 0;
}

void bfs__ctmatch_free(bfs_ctmatch *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->ntg; i++)
        if (m->tg[i].compiled)
            regfree(&m->tg[i].re);
    for (size_t i = 0; i < m->nig; i++)
        if (m->ig[i].compiled)
            regfree(&m->ig[i].re);
    free(m->tg);
    free(m->ig);
    free(m);
}

/* match_targets' order: by ("re:" in target, target). */
static int ct_cmp(const void *a, const void *b)
{
    const ct_pat *x = a, *y = b;
    return x->re_sort != y->re_sort ? x->re_sort - y->re_sort : strcmp(x->text, y->text);
}

/* Some tensor of the input is in module `name` (name is a prefix of it up to a dot). */
static int ct_is_module(const bfs_input *in, const char *name)
{
    const size_t n = strlen(name);
    for (size_t i = 0; i < in->nraw; i++)
        if (strncmp(in->raw[i].st->name, name, n) == 0 && in->raw[i].st->name[n] == '.')
            return 1;
    return 0;
}

static ct_pat ct_pat_of(const char *text)
{
    return (ct_pat){.text = text, .is_re = strncmp(text, "re:", 3) == 0, .re_sort = strstr(text, "re:") != NULL};
}

/* The group targets and the ignore list of the claim (compressed-tensors), compiled. */
int bfs__ctmatch_new(const bfs_fctx *c, bfs_ctmatch **out)
{
    int rc = 0;
    bfs_ctmatch *m = calloc(1, sizeof *m);
    *out = NULL;
    if (!m)
        return bfs__err(BFS_ENOMEM, "out of memory");
    const json_t *groups = json_object_get(c->qconfig, "config_groups"), *ign = json_object_get(c->qconfig, "ignore");
    size_t cap = 0;
    const char *key;
    json_t *g;
    json_object_foreach((json_t *)groups, key, g)
    {
        const json_t *tg = json_object_get(g, "targets");
        cap += json_is_array(tg) ? json_array_size(tg) : 0;
    }
    m->tg = calloc(cap ? cap : 1, sizeof *m->tg);
    m->ig = calloc(json_is_array(ign) && json_array_size(ign) ? json_array_size(ign) : 1, sizeof *m->ig);
    if (!m->tg || !m->ig)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    json_object_foreach((json_t *)groups, key, g)
    {
        const json_t *tg = json_object_get(g, "targets");
        for (size_t i = 0; json_is_array(tg) && i < json_array_size(tg); i++) {
            const char *t = json_string_value(json_array_get(tg, i));
            if (!t)
                BFS_FAIL(BFS_EINPUT, "%s: quantization_config config group \"%s\": a target that is not a string", c->qsource, key);
            size_t k = 0;
            while (k < m->ntg && strcmp(m->tg[k].text, t) != 0)
                k++;
            if (k == m->ntg)
                m->tg[m->ntg++] = ct_pat_of(t);
            m->tg[k].group = m->ngroups; /* the later group wins the target */
        }
        m->ngroups++;
    }
    for (size_t i = 0; json_is_array(ign) && i < json_array_size(ign); i++) {
        const char *t = json_string_value(json_array_get(ign, i));
        if (!t)
            BFS_FAIL(BFS_EINPUT, "%s: quantization_config.ignore holds something that is not a string", c->qsource);
        m->ig[m->nig++] = ct_pat_of(t);
    }
    qsort(m->tg, m->ntg, sizeof *m->tg, ct_cmp);
    for (size_t i = 0; i < m->ntg; i++) {
        BFS_TRY(ct_compile(&m->tg[i], c->qsource));
        m->tg[i].name = !m->tg[i].is_re && ct_is_module(c->in, m->tg[i].text);
    }
    for (size_t i = 0; i < m->nig; i++)
        BFS_TRY(ct_compile(&m->ig[i], c->qsource));
    *out = m;
    m = NULL;
cleanup:
    bfs__ctmatch_free(m);
    return rc;
}

/* match_name */
static int ct_name_match(const ct_pat *t, const char *name)
{
    return t->is_re ? regexec(&t->re, name, 0, NULL, 0) == 0 : strcmp(t->text, name) == 0;
}

/* _match_class for a module taken as an nn.Linear */
static int ct_linear(const ct_pat *t) { return !t->is_re && (strcmp(t->text, "Linear") == 0 || strcmp(t->text, "Module") == 0); }

int bfs__ct_module_group(const bfs_fctx *c, const bfs_raw *r, const char *module, size_t *k)
{
    const bfs_ctmatch *m = c->ctm;
    const char *at = bfs__raw_path(c->in, r);
    if (!m)
        return bfs__err(BFS_EINTERNAL, "compressed-tensors matcher missing");
    for (size_t i = 0; i < m->nig; i++)
        if (ct_name_match(&m->ig[i], module) || ct_linear(&m->ig[i]))
            return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): module \"%s\" is quantized, but %s quantization_config.ignore lists it (\"%s\"); refusing a checkpoint that contradicts its config",
                            at, r->st->name, (unsigned long long)r->file_offset, module, c->qsource, m->ig[i].text);
    for (size_t i = 0; i < m->ntg; i++) /* name and regex matches first, in match_targets' order */
        if (ct_name_match(&m->tg[i], module)) {
            *k = m->tg[i].group;
            return 0;
        }
    const ct_pat *win = NULL, *other = NULL;
    for (size_t i = 0; i < m->ntg; i++) {
        const ct_pat *t = &m->tg[i];
        if (ct_linear(t) && !win)
            win = t;
        else if (!t->is_re && !t->name && !ct_linear(t) && !other)
            other = t; /* a class name bfshard cannot test */
    }
    if (other && (!win || other->group != win->group))
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): module \"%s\" is matched by no name or regex target of %s quantization_config, and which config group quantizes it depends on its class (target \"%s\"), which a checkpoint does not record",
                        at, r->st->name, (unsigned long long)r->file_offset, module, c->qsource, other->text);
    if (!win)
        return bfs__err(BFS_EINPUT, "%s: tensor \"%s\" (offset %llu): module \"%s\" is quantized, but no config group of %s quantization_config targets it",
                        at, r->st->name, (unsigned long long)r->file_offset, module, c->qsource);
    *k = win->group;
    return 0;
}

int bfs__ct_target_matches(const char *target, const char *name)
{
    ct_pat t = ct_pat_of(target);
    if (ct_compile(&t, "(test)") < 0)
        return -1;
    const int m = ct_name_match(&t, name);
    if (t.compiled)
        regfree(&t.re);
    return m;
}

int bfs__ct_group_of(const bfs_fctx *c, const bfs_raw *r, size_t *k)
{
    const char *nm = r->st->name, *dot = strrchr(nm, '.');
    char *module = bfs__str_ndup(nm, dot ? (size_t)(dot - nm) : 0);
    if (!module)
        return bfs__err(BFS_ENOMEM, "out of memory");
    const int rc = bfs__ct_module_group(c, r, module, k);
    free(module);
    return rc;
}

/* Whether some module of the input (a prefix of a tensor name ending before a dot) matches t. */
static int ct_matches_some_module(const bfs_input *in, const ct_pat *t, char *buf, size_t cap)
{
    if (!t->is_re)
        return 1; /* exact names and class names: checked by the caller / not testable */
    for (size_t i = 0; i < in->nraw; i++) {
        const char *nm = in->raw[i].st->name;
        for (const char *d = strchr(nm, '.'); d; d = strchr(d + 1, '.')) {
            const size_t n = (size_t)(d - nm);
            if (n + 1 > cap)
                break;
            memcpy(buf, nm, n);
            buf[n] = '\0';
            if (regexec(&t->re, buf, 0, NULL, 0) == 0)
                return 1;
        }
    }
    return 0;
}

int bfs__ct_groups_used(const bfs_fctx *c)
{
    const bfs_ctmatch *m = c->ctm;
    int rc = 0;
    if (!m)
        return 0;
    size_t maxlen = 1;
    for (size_t i = 0; i < c->in->nraw; i++) {
        const size_t n = strlen(c->in->raw[i].st->name);
        maxlen = n > maxlen ? n : maxlen;
    }
    char *buf = malloc(maxlen + 1);
    unsigned char *used = calloc(m->ngroups ? m->ngroups : 1, 1);
    if (!buf || !used)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (size_t i = 0; i < m->ntg; i++) {
        const ct_pat *t = &m->tg[i];
        if (used[t->group])
            continue;
        if (t->is_re ? ct_matches_some_module(c->in, t, buf, maxlen + 1) : (t->name || !strchr(t->text, '.')))
            used[t->group] = 1;
    }
    size_t k = 0;
    const char *key;
    json_t *g;
    json_object_foreach((json_t *)json_object_get(c->qconfig, "config_groups"), key, g)
    {
        const json_t *tg = json_object_get(g, "targets");
        if (!used[k] && json_is_array(tg) && json_array_size(tg) > 0) {
            char *txt = json_dumps(tg, JSON_COMPACT);
            rc = bfs__err(BFS_EINPUT, "%s: quantization_config config group \"%s\" (targets %s) matches no module of the checkpoint; refusing a config that disagrees with its tensors",
                          c->qsource, key, txt ? txt : "?");
            free(txt);
            goto cleanup;
        }
        k++;
    }
cleanup:
    free(buf);
    free(used);
    return rc;
}
