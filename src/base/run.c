/* The run's leaves (base.h "the run"): cancellation (bfs_cancel, from a signal handler),
 * the monotonic clock, and one progress report to the caller's callback. Here, at the
 * bottom, so that the writer, durable commits and the readers check cancellation and
 * read the clock without calling up into the command that runs them. */
#include "base/base.h"

#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

/* lock-free atomic: safe from a signal handler and read by the worker threads */
static _Atomic int bfs__cancel_flag;
void bfs_cancel(void) { bfs__cancel_flag = 1; }
bool bfs__cancelled(void) { return bfs__cancel_flag != 0; }
void bfs__cancel_reset(void) { bfs__cancel_flag = 0; }

double bfs__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t bfs__device_read_bytes(void)
{
    FILE *f = fopen("/proc/self/io", "r");
    char line[128];
    unsigned long long v = UINT64_MAX;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "read_bytes: %llu", &v) == 1)
            break;
    if (f)
        fclose(f);
    return (uint64_t)v;
}

void bfs__progress_report(const bfs_convert_opts *o, bfs_progress *p)
{
    if (!o->progress)
        return;
    char et[BFS_ESC_MAX]; /* a name from the input, on its way to a terminal: escaped */
    p->bytes_done = p->bytes_done < p->bytes_total ? p->bytes_done : p->bytes_total;
    p->tensor = p->tensor ? bfs__esc(p->tensor, et, sizeof et) : NULL;
    o->progress(p, o->progress_user);
}
