/*
 * Reading a manifest-format file (see manifest.h): the windowed reader, its strict
 * structural scanner and the seal's hash over the bytes, the per-element parse of
 * tensors[], the head parsed with a placeholder in the array's place, walking tensors[]
 * again (bfs__mf_rewind, bfs__mf_next), and verify's check of the seal.
 */
#include "output/manifest_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- reading, streamed --------------------------------------------------------------------
 * A manifest is read through a window of BFS_MF_WIN bytes, never whole (467 MB for 200k
 * tensors at W = 8; a tree of it took 3.4 GB). One pass over the bytes checks the JSON's
 * structure with a strict scanner (strings and their escapes, nesting, colons, commas,
 * whitespace; scalars are runs of [A-Za-z0-9+-.], jansson checks them), hashes them for
 * the seal (the seal's 32 hex digits taken as '0's), finds the top object's "tensors"
 * array and cuts every element out of it: jansson parses each alone
 * (JSON_REJECT_DUPLICATES) and it must be an object. jansson then parses everything but
 * the array (the head), read again from the file with a placeholder string in the
 * array's place. The tensors are read again, one at a time, by bfs__mf_next(). */
enum { MS_VALUE, MS_VALUE_OR_END, MS_KEY_OR_END, MS_KEY, MS_COLON, MS_COMMA_OR_END, MS_STR, MS_ESC, MS_UHEX, MS_SCALAR,
       MS_DONE };

static int bfs__mf_bad(const bfs_mf *r, uint64_t at, const char *what)
{
    return bfs__err(BFS_EINPUT, "%s: not a bfshard manifest (malformed JSON at byte %llu: %s)", r->path,
                    (unsigned long long)at, what);
}

/* hash [off, off + n) with the seal's digits as '0's */
static void bfs__mf_hash(bfs_mf *r, const char *p, size_t n, uint64_t off)
{
    static const char zeros[32] = "00000000000000000000000000000000";
    const uint64_t s = r->seal_at, e = s == UINT64_MAX ? s : s + 32;
    if (s == UINT64_MAX || off + n <= s || off >= e) {
        XXH3_128bits_update(r->st, p, n);
        return;
    }
    const size_t a = s > off ? (size_t)(s - off) : 0, b = e < off + n ? (size_t)(e - off) : n;
    XXH3_128bits_update(r->st, p, a);
    XXH3_128bits_update(r->st, zeros + (a ? 0 : (size_t)(off - s)), b - a);
    XXH3_128bits_update(r->st, p + b, n - b);
}

/* The seal's digits: after the last "manifest_xxh3_128": " in the file, 32 of them and a
 * '"' (bfs__seal_find's rule), found from the end backwards. */
static int bfs__mf_find_seal(bfs_mf *r)
{
    const size_t kl = strlen(BFS_SEAL_KEY);
    uint64_t hi = r->len;
    r->seal_at = UINT64_MAX;
    while (hi >= kl) {
        const uint64_t lo = hi > BFS_MF_WIN ? hi - BFS_MF_WIN : 0;
        const size_t n = (size_t)(hi - lo);
        BFS_MF_RET(bfs__pread_all(r->fd, r->win, n, lo, r->path));
        char *hit = NULL;
        for (char *p = r->win; (p = memmem(p, n - (size_t)(p - r->win), BFS_SEAL_KEY, kl)) != NULL; p++)
            hit = p + kl;
        if (hit) {
            const uint64_t at = lo + (uint64_t)(hit - r->win);
            char d[33];
            if (at + 33 <= r->len) {
                BFS_MF_RET(bfs__pread_all(r->fd, d, 33, at, r->path));
                if (d[32] == '"') {
                    r->seal_at = at;
                    memcpy(r->seal_want, d, 32);
                    r->seal_want[32] = '\0';
                }
            }
            return 0;
        }
        if (lo == 0)
            break;
        hi = lo + kl - 1; /* an occurrence across the windows' border */
    }
    return 0;
}

static int bfs__mf_el_append(bfs_mf *r, const char *p, size_t n)
{
    if (r->el_n + n > r->el_cap) {
        const size_t nc = (r->el_n + n) * 2;
        char *ne = realloc(r->el, nc);
        if (!ne)
            return bfs__err(BFS_ENOMEM, "%s: out of memory reading tensors[%zu]", r->path, r->nel);
        r->el = ne;
        r->el_cap = nc;
    }
    memcpy(r->el + r->el_n, p, n);
    r->el_n += n;
    return 0;
}

/* A value begins with c at byte `at` (window index i). */
static int bfs__mf_value(bfs_mf *r, char c, uint64_t at, size_t i)
{
    const bool tens = r->want_tensors;
    r->want_tensors = false;
    if (r->depth == 0 && c != '{')
        return bfs__mf_bad(r, at, "not a JSON object");
    if (c == ']' || c == '}')
        return bfs__mf_bad(r, at, "expected a value");
    if (r->in_tensors && r->depth == 2) { /* an element of tensors[] */
        if (c != '{') {
            char m[64];
            snprintf(m, sizeof m, "tensors[%zu] is not an object", r->nel);
            return bfs__mf_bad(r, at, m);
        }
        r->in_el = true;
        r->el_off = at;
        r->el_seg = i;
        r->el_n = 0;
    }
    if (tens && c != '[')
        return bfs__mf_bad(r, at, "\"tensors\" is not an array");
    if (c == '{' || c == '[') {
        if (r->depth == BFS_MF_MAXDEPTH)
            return bfs__mf_bad(r, at, "nested too deep");
        r->stack[r->depth++] = (unsigned char)c;
        r->state = c == '{' ? MS_KEY_OR_END : MS_VALUE_OR_END;
        if (tens) {
            r->in_tensors = r->seen_tensors = true;
            r->arr_lo = at;
        }
    } else if (c == '"') {
        r->state = MS_STR;
        r->str_key = false;
    } else if (c == '-' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')) {
        r->state = MS_SCALAR;
    } else {
        return bfs__mf_bad(r, at, "expected a value");
    }
    return 0;
}

/* A value ended at window index i; 1 when it was an element of tensors[] (cut out). */
static int bfs__mf_value_end(bfs_mf *r, size_t i)
{
    r->state = r->depth == 0 ? MS_DONE : MS_COMMA_OR_END;
    if (!(r->in_el && r->depth == 2))
        return 0;
    r->in_el = false;
    BFS_MF_RET(bfs__mf_el_append(r, r->win + r->el_seg, i + 1 - r->el_seg));
    return 1;
}

/* '}' or ']' at byte at: *done when it closed tensors[] and the reader stops there */
static int bfs__mf_closer(bfs_mf *r, char c, uint64_t at, size_t i, bool *done)
{
    if (r->depth == 0 || r->stack[r->depth - 1] != (c == '}' ? '{' : '['))
        return bfs__mf_bad(r, at, c == '}' ? "'}' closes no object" : "']' closes no array");
    r->depth--;
    if (r->in_tensors && r->depth == 1) {
        r->in_tensors = false;
        r->arr_hi = at + 1;
        *done = r->stop_at_array_end;
    }
    return bfs__mf_value_end(r, i);
}

/* Scan on: 1 when an element of tensors[] is cut out (r->el, r->el_n), 0 at the end of
 * the file (or of tensors[] when stop_at_array_end), < 0 on an error. */
static int bfs__mf_scan(bfs_mf *r)
{
    for (;;) {
        if (r->wpos == r->wlen) {
            if (r->in_el && r->wlen > r->el_seg)
                BFS_MF_RET(bfs__mf_el_append(r, r->win + r->el_seg, r->wlen - r->el_seg));
            r->el_seg = 0;
            r->woff += r->wlen;
            r->wpos = r->wlen = 0;
            if (r->woff >= r->len) {
                if (r->state == MS_SCALAR && r->depth == 0)
                    r->state = MS_DONE;
                if (r->state != MS_DONE || r->stop_at_array_end)
                    return bfs__mf_bad(r, r->len, "the file ends inside the JSON (truncated?)");
                return 0;
            }
            r->wlen = r->len - r->woff < BFS_MF_WIN ? (size_t)(r->len - r->woff) : BFS_MF_WIN;
            BFS_MF_RET(bfs__pread_all(r->fd, r->win, r->wlen, r->woff, r->path));
            if (r->st)
                bfs__mf_hash(r, r->win, r->wlen, r->woff);
        }
        const char *w = r->win;
        const size_t n = r->wlen;
        size_t i = r->wpos;
        while (i < n) {
            const char c = w[i];
            const uint64_t at = r->woff + i;
            int got = 0;
            bool done = false;
            switch (r->state) {
            case MS_STR: {
                size_t j = i;
                while (j < n && w[j] != '"' && w[j] != '\\' && (unsigned char)w[j] >= 0x20)
                    j++;
                if (r->str_key && r->depth == 1) { /* a key of the top object: is it "tensors"? */
                    for (size_t k = i; k < j && r->keylen < sizeof r->key; k++)
                        r->key[r->keylen++] = w[k];
                }
                i = j;
                if (i == n)
                    continue;
                const uint64_t sat = r->woff + i;
                if (w[i] == '\\') {
                    if (r->str_key && r->depth == 1)
                        r->keylen = sizeof r->key + 1; /* an escaped key is not the plain "tensors" */
                    r->state = MS_ESC;
                } else if (w[i] == '"') {
                    if (r->str_key) {
                        r->state = MS_COLON;
                        r->key_tensors = r->depth == 1 && r->keylen == 7 && !memcmp(r->key, "tensors", 7);
                        if (r->key_tensors && r->seen_tensors)
                            return bfs__mf_bad(r, sat, "a second \"tensors\" key");
                    } else {
                        got = bfs__mf_value_end(r, i);
                    }
                } else {
                    return bfs__mf_bad(r, sat, "a control character inside a string");
                }
                break;
            }
            case MS_ESC:
                if (c == 'u') {
                    r->uhex = 4;
                    r->state = MS_UHEX;
                } else if (strchr("\"\\/bfnrt", c) && c) {
                    r->state = MS_STR;
                } else {
                    return bfs__mf_bad(r, at, "a bad escape inside a string");
                }
                break;
            case MS_UHEX:
                if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
                    return bfs__mf_bad(r, at, "a bad \\u escape inside a string");
                if (--r->uhex == 0)
                    r->state = MS_STR;
                break;
            case MS_SCALAR:
                if (c == '-' || c == '+' || c == '.' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                    (c >= 'A' && c <= 'Z'))
                    break;
                got = bfs__mf_value_end(r, i - 1); /* never an element: elements are objects */
                continue;                          /* c again, after the scalar */
            default:
                if (c == ' ' || c == '\n' || c == '\t' || c == '\r')
                    break;
                switch (r->state) {
                case MS_VALUE:
                    BFS_MF_RET(bfs__mf_value(r, c, at, i));
                    break;
                case MS_VALUE_OR_END:
                    if (c == ']' || c == '}')
                        got = bfs__mf_closer(r, c, at, i, &done);
                    else
                        BFS_MF_RET(bfs__mf_value(r, c, at, i));
                    break;
                case MS_KEY_OR_END:
                case MS_KEY:
                    if (c == '}' && r->state == MS_KEY_OR_END) {
                        got = bfs__mf_closer(r, c, at, i, &done);
                    } else if (c == '"') {
                        r->state = MS_STR;
                        r->str_key = true;
                        r->keylen = 0;
                    } else {
                        return bfs__mf_bad(r, at, r->state == MS_KEY ? "expected a key after ','" : "expected a key or '}'");
                    }
                    break;
                case MS_COLON:
                    if (c != ':')
                        return bfs__mf_bad(r, at, "expected ':' after a key");
                    r->state = MS_VALUE;
                    r->want_tensors = r->key_tensors;
                    r->key_tensors = false;
                    break;
                case MS_COMMA_OR_END:
                    if (c == ',')
                        r->state = r->stack[r->depth - 1] == '{' ? MS_KEY : MS_VALUE;
                    else if (c == '}' || c == ']')
                        got = bfs__mf_closer(r, c, at, i, &done);
                    else
                        return bfs__mf_bad(r, at, r->stack[r->depth - 1] == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
                    break;
                case MS_DONE:
                    return bfs__mf_bad(r, at, "more after the JSON object");
                }
            }
            if (got < 0)
                return got;
            i++;
            if (got || done) {
                r->wpos = i;
                return done ? 0 : 1;
            }
        }
        r->wpos = i;
    }
}

/* Parse the element cut out: *out an object (new reference). */
static int bfs__mf_parse_el(bfs_mf *r, json_t **out)
{
    json_error_t jerr;
    *out = json_loadb(r->el, r->el_n, JSON_REJECT_DUPLICATES, &jerr);
    if (*out)
        return 0;
    if (json_error_code(&jerr) == json_error_out_of_memory)
        return bfs__err(BFS_ENOMEM, "%s: out of memory reading tensors[%zu]", r->path, r->nel);
    char m[256];
    snprintf(m, sizeof m, "tensors[%zu]: %s", r->nel, jerr.text);
    return bfs__mf_bad(r, r->el_off + (uint64_t)(jerr.position > 0 ? jerr.position : 0), m);
}

/* json_load_callback's source: the file, with a placeholder in tensors[]'s place */
typedef struct {
    const bfs_mf *r;
    uint64_t pos; /* in the virtual text */
    int rc;
} bfs_mf_headsrc;

#define BFS_MF_HOLE_TEXT "\"" BFS_MF_TENSORS_HOLE "\""

static size_t bfs__mf_head_read(void *buf, size_t cap, void *data)
{
    bfs_mf_headsrc *h = data;
    const bfs_mf *r = h->r;
    const uint64_t hl = r->seen_tensors ? strlen(BFS_MF_HOLE_TEXT) : 0;
    const uint64_t a = r->seen_tensors ? r->arr_lo : r->len, b = r->seen_tensors ? r->arr_hi : r->len;
    const uint64_t vlen = a + hl + (r->len - b);
    if (h->pos >= vlen || h->rc)
        return 0;
    size_t n;
    if (h->pos < a) {
        n = a - h->pos < cap ? (size_t)(a - h->pos) : cap;
        if ((h->rc = bfs__pread_all(r->fd, buf, n, h->pos, r->path)) < 0)
            return (size_t)-1;
    } else if (h->pos < a + hl) {
        n = a + hl - h->pos < cap ? (size_t)(a + hl - h->pos) : cap;
        memcpy(buf, &BFS_MF_HOLE_TEXT[h->pos - a], n);
    } else {
        const uint64_t fo = b + (h->pos - a - hl);
        n = r->len - fo < cap ? (size_t)(r->len - fo) : cap;
        if ((h->rc = bfs__pread_all(r->fd, buf, n, fo, r->path)) < 0)
            return (size_t)-1;
    }
    h->pos += n;
    return n;
}

int bfs__mf_open(const char *outdir, const char *name, int flags, bfs_mf_each_fn each, void *user, bfs_mf **out)
{
    return bfs__mf_openat(-1, outdir, name, flags, each, user, out);
}

int bfs__mf_openat(int dirfd, const char *outdir, const char *name, int flags, bfs_mf_each_fn each, void *user,
                   bfs_mf **out)
{
    int rc = 0;
    struct stat sb;
    json_t *t = NULL;
    bfs_mf *r = calloc(1, sizeof *r);
    *out = NULL;
    if (r)
        r->fd = -1;
    if (!r || !(r->path = bfs__path_join(outdir, name)) || !(r->win = malloc(BFS_MF_WIN))) {
        rc = bfs__err(BFS_ENOMEM, "out of memory");
        goto cleanup;
    }
    r->flags = flags;
    /* a FIFO must not block us: it is rejected below */
    r->fd = dirfd < 0 ? open(r->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
                      : openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (r->fd < 0)
        BFS_FAIL(errno == ENOENT || errno == ELOOP || errno == ENOTDIR ? BFS_EINPUT : errno == ENOMEM ? BFS_ENOMEM : BFS_EIO,
                 "%s: cannot open: %s", r->path, strerror(errno));
    if (fstat(r->fd, &sb) != 0)
        BFS_FAIL(BFS_EIO, "%s: cannot stat: %s", r->path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        BFS_FAIL(BFS_EINPUT, "%s: not a regular file", r->path);
    r->len = (uint64_t)sb.st_size;
    BFS_TRY(bfs__mf_find_seal(r));
    if (!(r->st = XXH3_createState()) || XXH3_128bits_reset(r->st) != XXH_OK)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    int got;
    while ((got = bfs__mf_scan(r)) > 0) {
        if (!(flags & BFS_MF_HEAD_ONLY)) {
            BFS_TRY(bfs__mf_parse_el(r, &t));
            if (each)
                BFS_TRY(each(user, r->nel, t));
            json_decref(t);
            t = NULL;
        }
        r->nel++;
    }
    BFS_TRY(got);
    r->ntensors = r->nel;
    bfs__hash_hex(XXH3_128bits_digest(r->st), r->seal_got);
    XXH3_freeState(r->st);
    r->st = NULL;
    {
        bfs_mf_headsrc hs = {r, 0, 0};
        json_error_t jerr;
        r->head = json_load_callback(bfs__mf_head_read, &hs, JSON_REJECT_DUPLICATES, &jerr);
        BFS_TRY(hs.rc);
        if (!r->head && json_error_code(&jerr) == json_error_out_of_memory)
            BFS_FAIL(BFS_ENOMEM, "%s: out of memory", r->path);
        if (!r->head) {
            uint64_t at = (uint64_t)(jerr.position > 0 ? jerr.position : 0);
            const uint64_t hl = strlen(BFS_MF_HOLE_TEXT);
            if (r->seen_tensors && at > r->arr_lo)
                at = at < r->arr_lo + hl ? r->arr_lo : at - r->arr_lo - hl + r->arr_hi;
            rc = bfs__mf_bad(r, at, jerr.text);
            goto cleanup;
        }
    }
    *out = r;
    r = NULL;
cleanup:
    json_decref(t);
    bfs__mf_free(r);
    return rc;
}

void bfs__mf_free(bfs_mf *r)
{
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    XXH3_freeState(r->st);
    json_decref(r->head);
    free(r->el);
    free(r->win);
    free(r->path);
    free(r);
}

const char *bfs__mf_path(const bfs_mf *r) { return r->path; }
json_t *bfs__mf_head(const bfs_mf *r) { return r->head; }
size_t bfs__mf_ntensors(const bfs_mf *r) { return r->ntensors; }
bool bfs__mf_has_tensors(const bfs_mf *r) { return r->seen_tensors; }

int bfs__mf_rewind(bfs_mf *r)
{
    if (!r->seen_tensors)
        return bfs__err(BFS_EINPUT, "%s: not a bfshard manifest (no tensors array)", r->path);
    r->woff = r->arr_lo + 1; /* just after '[' */
    r->wlen = r->wpos = r->el_seg = 0;
    r->state = MS_VALUE_OR_END;
    r->depth = 2;
    r->stack[0] = '{';
    r->stack[1] = '[';
    r->in_tensors = r->stop_at_array_end = true;
    r->in_el = r->want_tensors = r->key_tensors = false;
    r->nel = 0;
    return 0;
}

/* the next element of tensors[] cut out (r->el, r->el_n): 1, 0 at the array's end, < 0 */
static int bfs__mf_step(bfs_mf *r)
{
    if (!r->stop_at_array_end)
        BFS_MF_RET(bfs__mf_rewind(r));
    return r->in_tensors ? bfs__mf_scan(r) : 0;
}

int bfs__mf_next(bfs_mf *r, json_t **tensor)
{
    *tensor = NULL;
    const int got = bfs__mf_step(r);
    if (got <= 0)
        return got;
    BFS_MF_RET(bfs__mf_parse_el(r, tensor));
    r->nel++;
    return 1;
}

int bfs__mf_next_raw(bfs_mf *r, const char **el, size_t *n)
{
    *el = NULL;
    *n = 0;
    const int got = bfs__mf_step(r);
    if (got <= 0)
        return got;
    *el = r->el;
    *n = r->el_n;
    r->nel++;
    return 1;
}

int bfs__mf_check_seal(const bfs_mf *r, FILE *report)
{
    const char *jv = json_string_value(json_object_get(r->head, BFS_MF_SEAL));
    const bool v = r->seal_at != UINT64_MAX;
    if (v && jv && strcmp(jv, r->seal_want) == 0 && strcmp(r->seal_got, r->seal_want) == 0)
        return 0;
    char ep[BFS_ESC_MAX], es[BFS_ESC_MAX]; /* the seal: 32 bytes of the file, not checked as hex */
    if (!v || !jv)
        bfs__report(report, "%s: BAD manifest: no \"manifest_xxh3_128\" seal", bfs__esc(r->path, ep, sizeof ep));
    else
        bfs__report(report, "%s: BAD manifest: its bytes hash to %s, its seal says %s", bfs__esc(r->path, ep, sizeof ep),
                    r->seal_got, bfs__esc(r->seal_want, es, sizeof es));
    return 1;
}
