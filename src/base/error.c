/* Error codes, names and the per-thread last-error message. */
#include "base/base.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char bfs__msg[1024];
static _Thread_local bool bfs__msg_set;

const char *bfs_strerror(int code)
{
    switch (code) {
    case BFS_OK: return "success";
    case BFS_EINTERNAL: return "internal error";
    case BFS_EUSAGE: return "usage error";
    case BFS_EINPUT: return "bad input";
    case BFS_EIO: return "I/O error";
    case BFS_ENOMEM: return "out of memory or budget";
    case BFS_EDEVICE: return "device error";
    case BFS_EVERIFY: return "verification failed";
    case BFS_EEXIST: return "output exists";
    case BFS_EINTR: return "interrupted";
    case BFS_EPARTS: return "parts disagree";
    case BFS_EINCOMPLETE: return "parts incomplete";
    default: return "unknown error";
    }
}

const char *bfs_err_name(int code)
{
    switch (code) {
    case BFS_OK: return "BFS_OK";
    case BFS_EINTERNAL: return "BFS_EINTERNAL";
    case BFS_EUSAGE: return "BFS_EUSAGE";
    case BFS_EINPUT: return "BFS_EINPUT";
    case BFS_EIO: return "BFS_EIO";
    case BFS_ENOMEM: return "BFS_ENOMEM";
    case BFS_EDEVICE: return "BFS_EDEVICE";
    case BFS_EVERIFY: return "BFS_EVERIFY";
    case BFS_EEXIST: return "BFS_EEXIST";
    case BFS_EINTR: return "BFS_EINTR";
    case BFS_EPARTS: return "BFS_EPARTS";
    case BFS_EINCOMPLETE: return "BFS_EINCOMPLETE";
    default: return "BFS_E?";
    }
}

const char *bfs_last_error(void) { return bfs__msg; }

void bfs__err_clear(void)
{
    bfs__msg[0] = '\0';
    bfs__msg_set = false;
}

bool bfs__err_is_set(void) { return bfs__msg_set; }

static void bfs__vset(const char *fmt, va_list ap, const char *suffix)
{
    char raw[sizeof bfs__msg];
    if (bfs__msg_set)
        return;
    int n = vsnprintf(raw, sizeof raw, fmt, ap);
    if (n < 0)
        n = 0;
    if (suffix && (size_t)n < sizeof raw)
        snprintf(raw + n, sizeof raw - (size_t)n, ": %s", suffix);
    /* one line, always, and no byte a terminal acts on from a name read in a file: the
     * rule of escape.c, like every report line */
    bfs__esc_text(raw, bfs__msg, sizeof bfs__msg);
    bfs__msg_set = true;
}

int bfs__err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    bfs__vset(fmt, ap, NULL);
    va_end(ap);
    return code;
}

int bfs__errno(int code, int errnum, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    bfs__vset(fmt, ap, strerror(errnum));
    va_end(ap);
    return errnum == ENOMEM ? BFS_ENOMEM : code; /* out of memory is exit 5, whichever call saw it */
}

void bfs__errslot_init(bfs_errslot *s)
{
    s->code = 0;
    s->lock = 0;
    s->msg[0] = '\0';
}

int bfs__errslot_put(bfs_errslot *s, int code)
{
    if (code >= 0)
        return code;
    if (__atomic_exchange_n(&s->lock, 1, __ATOMIC_ACQ_REL) == 0) { /* the first put */
        snprintf(s->msg, sizeof s->msg, "%s", bfs__msg_set ? bfs__msg : bfs_strerror(code));
        __atomic_store_n(&s->code, code, __ATOMIC_RELEASE); /* msg is complete before code is seen */
    }
    return code;
}

int bfs__errslot_get(bfs_errslot *s)
{
    const int code = __atomic_load_n(&s->code, __ATOMIC_ACQUIRE);
    if (code < 0)
        bfs__err(code, "%s", s->msg);
    return code;
}
