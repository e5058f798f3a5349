/* The one escaping rule for text read from a file (a manifest, a safetensors header,
 * config.json, an OCI index, a directory entry) on its way to a terminal, a log, a report
 * or an error message, so that no byte of it is one a terminal acts on: a name escaped
 * into a buffer (bfs__esc), a whole line (bfs__esc_text, bfs__vline: reports and logs).
 * JSON meant to be read goes through bfs__json_show (util.c). The rule itself is
 * docs/ROBUSTNESS.md's "Text from a file is escaped the same way everywhere". */
#include "base/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The length of the well-formed UTF-8 sequence at p (2 to 4 bytes), or 0 when the byte at p
 * begins none (RFC 3629: no overlong form, no surrogate, nothing above U+10FFFF, no
 * sequence cut short). p is NUL-terminated: a NUL is never a continuation byte, so no read
 * goes past it. */
static size_t bfs__utf8_len(const unsigned char *p)
{
    const unsigned char c = p[0];
    if (c >= 0xc2 && c <= 0xdf)
        return (p[1] & 0xc0) == 0x80 ? 2 : 0;
    if (c >= 0xe0 && c <= 0xef) {
        const unsigned char lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
        return p[1] >= lo && p[1] <= hi && (p[2] & 0xc0) == 0x80 ? 3 : 0;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        const unsigned char lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
        return p[1] >= lo && p[1] <= hi && (p[2] & 0xc0) == 0x80 && (p[3] & 0xc0) == 0x80 ? 4 : 0;
    }
    return 0;
}

/* One step of the rule at p (not at the NUL): its text in e (at most 6 characters), its
 * length returned, the bytes of the input it stands for in *used. A name (name true) also
 * has '"' and '\\' escaped, so that it can be quoted and read back without ambiguity. */
static size_t bfs__esc_step(const unsigned char *p, bool name, char e[8], size_t *used)
{
    *used = 1;
    if (name && (*p == '"' || *p == '\\')) {
        e[0] = '\\', e[1] = (char)*p;
        return 2;
    }
    if (*p == '\n' || *p == '\t') {
        e[0] = '\\', e[1] = *p == '\n' ? 'n' : 't';
        return 2;
    }
    if (*p < 0x20 || *p == 0x7f) /* C0 and DEL */
        return (size_t)snprintf(e, 8, "\\u%04x", *p);
    if (*p < 0x80) {
        e[0] = (char)*p;
        return 1;
    }
    const size_t n = bfs__utf8_len(p);
    if (n == 0) /* a byte of no well-formed sequence */
        return (size_t)snprintf(e, 8, "\\x%02x", *p);
    *used = n;
    if (n == 2 && p[0] == 0xc2 && p[1] <= 0x9f) /* C1, U+0080..U+009F */
        return (size_t)snprintf(e, 8, "\\u%04x", p[1]);
    memcpy(e, p, n);
    return n;
}

static const char *bfs__esc_into(const char *s, bool name, char *buf, size_t cap)
{
    size_t k = 0;
    if (cap < 8) {
        if (cap)
            buf[0] = '\0';
        return buf;
    }
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        char e[8];
        size_t used;
        const size_t n = bfs__esc_step(p, name, e, &used);
        if (k + n + 4 > cap) {
            memcpy(buf + k, "...", 4);
            return buf;
        }
        memcpy(buf + k, e, n);
        k += n;
        p += used;
    }
    buf[k] = '\0';
    return buf;
}

const char *bfs__esc(const char *s, char *buf, size_t cap) { return bfs__esc_into(s, true, buf, cap); }

const char *bfs__esc_text(const char *s, char *buf, size_t cap) { return bfs__esc_into(s, false, buf, cap); }

void bfs__vline(FILE *out, const char *prefix, const char *fmt, va_list ap)
{
    char *line = NULL;
    if (!out)
        return;
    const int n = vasprintf(&line, fmt, ap);
    for (int part = 0; part < 2; part++)
        for (const unsigned char *p = (const unsigned char *)(part ? (n >= 0 ? line : "(out of memory)") : prefix);
             p && *p;) {
            char e[8];
            size_t used;
            fwrite(e, 1, bfs__esc_step(p, false, e, &used), out);
            p += used;
        }
    fputc('\n', out);
    if (n >= 0)
        free(line);
}

void bfs__line(FILE *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    bfs__vline(out, NULL, fmt, ap);
    va_end(ap);
}
