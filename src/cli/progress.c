/* convert's progress display and closing summary (see progress.h). The library reports
 * bytes its writer has written, and always a last report at 100%; this draws it.
 * Uses only the public API (include/bfshard.h). */
#include "progress.h"

#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int cli_term_width(int fd)
{
    struct winsize ws;
    if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    const char *c = getenv("COLUMNS");
    const int n = c ? atoi(c) : 0;
    return n > 0 ? n : 80;
}

void cli_progress_start(cli_progress *p, int mode, int verbose)
{
    memset(p, 0, sizeof *p);
    p->mode = mode == CLI_PROGRESS_AUTO ? (isatty(2) ? CLI_PROGRESS_BAR : CLI_PROGRESS_LOG) : mode;
    p->verbose = verbose;
    p->t0 = now_s();
}

/* "12.3 MB", "1.2 GB" */
static void fmt_bytes(char *buf, size_t cap, double b)
{
    if (b >= 1e9)
        snprintf(buf, cap, "%.2f GB", b / 1e9);
    else
        snprintf(buf, cap, "%.1f MB", b / 1e6);
}

static void fmt_eta(char *buf, size_t cap, double s)
{
    if (s >= 3600)
        snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else if (s >= 60)
        snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else
        snprintf(buf, cap, "%ds", (int)(s + 0.5));
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* One bar line that fits `cols` columns (never the last one: no autowrap). */
static void draw_bar(const cli_progress *p, const bfs_progress *bp, double frac, double rate, double eta, int done)
{
    char done_s[32], total_s[32], eta_s[32], tail[160];
    const int cols = cli_term_width(2) - 1;
    fmt_bytes(done_s, sizeof done_s, (double)bp->bytes_done);
    fmt_bytes(total_s, sizeof total_s, (double)bp->bytes_total);
    fmt_eta(eta_s, sizeof eta_s, done ? (now_s() - p->t0) : eta);
    int n = snprintf(tail, sizeof tail, " %5.1f%% %s/%s %.1f MB/s %s %s busy r%.0f d%.0f h%.0f w%.0f%%", frac * 100,
                     done_s, total_s, rate / 1e6, done ? "in" : "ETA", eta_s, bp->busy_read * 100,
                     bp->busy_dequant * 100, bp->busy_hash * 100, bp->busy_write * 100);
    if (n >= cols) /* narrower: without the stages' busy fractions */
        n = snprintf(tail, sizeof tail, " %5.1f%% %s/%s %.1f MB/s %s %s", frac * 100, done_s, total_s, rate / 1e6,
                     done ? "in" : "ETA", eta_s);
    if (n >= cols) /* a narrow terminal: the numbers alone, cut */
        n = snprintf(tail, sizeof tail, " %5.1f%%", frac * 100);
    int barw = cols - n - 2;
    const char *tensor = p->verbose && !done && bp->tensor ? bp->tensor : "";
    int tl = (int)strlen(tensor);
    if (barw > 60)
        barw = 60;
    fputs("\r", stderr);
    if (barw >= 10) {
        const int fill = (int)(frac * barw);
        fputc('[', stderr);
        for (int i = 0; i < barw; i++)
            fputc(i < fill ? '#' : '.', stderr);
        fputc(']', stderr);
    } else {
        barw = -2;
    }
    fputs(tail, stderr);
    const int room = cols - (barw + 2) - n - 1;
    if (tl && room > 8) {
        if (tl > room)
            fprintf(stderr, " ...%s", tensor + tl - (room - 4));
        else
            fprintf(stderr, " %s", tensor);
    }
    fputs("\033[K", stderr); /* clear what a longer previous line left */
}

void cli_progress_fn(const bfs_progress *bp, void *user)
{
    cli_progress *p = user;
    if (p->mode == CLI_PROGRESS_NONE || p->finished)
        return;
    const double t = now_s(), el = t - p->t0;
    const int done = bp->bytes_done >= bp->bytes_total;
    const double every = p->mode == CLI_PROGRESS_BAR ? 0.1 : p->mode == CLI_PROGRESS_JSON ? 1.0 : p->verbose ? 0 : 10.0;
    if (!done && t - p->last < every)
        return;
    p->last = t;
    p->finished = done;
    const double rate = el > 0 ? (double)bp->bytes_done / el : 0;
    const double frac = bp->bytes_total ? (double)bp->bytes_done / (double)bp->bytes_total : 1;
    const double eta = rate > 0 ? (double)(bp->bytes_total - bp->bytes_done) / rate : 0;
    switch (p->mode) {
    case CLI_PROGRESS_BAR:
        draw_bar(p, bp, frac, rate, eta, done);
        p->drawn = !done;
        if (done)
            fputc('\n', stderr);
        break;
    case CLI_PROGRESS_JSON:
        fprintf(stderr,
                "{\"progress\": {\"bytes_done\": %llu, \"bytes_total\": %llu, \"percent\": %.1f, \"seconds\": %.3f, "
                "\"bytes_per_s\": %.0f, \"eta_s\": %.1f, \"busy\": {\"read\": %.3f, \"dequant\": %.3f, \"hash\": %.3f, "
                "\"write\": %.3f}, \"writers\": %d, \"tensor\": ",
                (unsigned long long)bp->bytes_done, (unsigned long long)bp->bytes_total, frac * 100, el, rate, eta,
                bp->busy_read, bp->busy_dequant, bp->busy_hash, bp->busy_write, bp->writers);
        json_str(stderr, bp->tensor);
        fputs("}}\n", stderr);
        break;
    default:
        fprintf(stderr, "bfshard: %.1f%% %.1f/%.1f MB %.1f MB/s %s %.0fs, busy: read %.0f%% dequant %.0f%% hash %.0f%% "
                "write %.0f%% (%d writer%s)%s%s%s\n", frac * 100,
                (double)bp->bytes_done / 1e6, (double)bp->bytes_total / 1e6, rate / 1e6, done ? "in" : "ETA",
                done ? el : eta, bp->busy_read * 100, bp->busy_dequant * 100, bp->busy_hash * 100,
                bp->busy_write * 100, bp->writers, bp->writers == 1 ? "" : "s", bp->tensor && *bp->tensor ? " (" : "",
                bp->tensor ? bp->tensor : "", bp->tensor && *bp->tensor ? ")" : "");
        break;
    }
    fflush(stderr);
}

void cli_progress_end(cli_progress *p)
{
    if (p->drawn) {
        fputc('\n', stderr);
        p->drawn = 0;
    }
}

void cli_convert_summary(FILE *out, const bfs_convert_result *r, const char *outdir)
{
    const double gbs = r->seconds > 0 ? (double)r->bytes_written / r->seconds / 1e9 : 0.0;
    fprintf(out,
            "bfshard: %llu tensors: %llu dequantized, %llu cast, %llu copied, %llu dropped (scales, quant state); "
            "%llu bytes in %llu file(s)%s%s%s to %s in %.2f s (%.2f GB/s, %s)\n",
            (unsigned long long)r->tensors, (unsigned long long)r->tensors_dequantized,
            (unsigned long long)r->tensors_cast, (unsigned long long)r->tensors_copied,
            (unsigned long long)r->tensors_dropped, (unsigned long long)r->bytes_written,
            (unsigned long long)r->files_written, r->files_reused ? " (others reused)" : "", r->ranks[0] ? ", ranks " : "",
            r->ranks, outdir, r->seconds, gbs,
            r->backend);
}
