/*
 * Compressed artifacts: the file commands. bfshard compress FILE (a .safetensors
 * into a seekable .zst/.bfz, frames cut at its tensors), decompress, and extract one
 * tensor; compress_fd is also the OUTDIR command's and convert's way to compress a
 * rank file. Outputs are written durably (durable.h); "-" is standard output.
 */
#include "commands/commands.h"
#include "backend/backend.h"
#include "plan/plan.h"
#include "base/bfs_io.h"
#include "output/durable.h"
#include "input/safetensors.h"
#include "zst/zst.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

/* ==== output: a durable temporary beside the path, or standard output ============ */
typedef struct bfs_zst_dest {
    bfs_tmpfile t;
    int fd;       /* t.fd, or 1 for standard output; -1 when not open */
    bool pipe;    /* standard output */
    char what[PATH_MAX + NAME_MAX + 32]; /* names what is written in messages */
} bfs_zst_dest;

static void bfs__zst_dest_init(bfs_zst_dest *d)
{
    memset(d, 0, sizeof *d);
    d->t.fd = d->t.dirfd = -1;
    d->fd = -1;
}

/* Start writing OUT under a temporary name beside it ("-": standard output). OUT may not
 * be the input (same device and inode, whatever the names); an existing OUT needs force
 * and is replaced only by the commit, never removed before. */
static int bfs__zst_dest_open(bfs_zst_dest *d, const char *out, const char *in, bool force)
{
    struct stat sb, si;
    bfs__zst_dest_init(d);
    if (!strcmp(out, "-")) {
        d->fd = 1;
        d->pipe = true;
        snprintf(d->what, sizeof d->what, "%s", out);
        return 0;
    }
    if (stat(out, &sb) == 0 && stat(in, &si) == 0 && sb.st_dev == si.st_dev && sb.st_ino == si.st_ino)
        return bfs__err(BFS_EUSAGE, "%s: is the input file %s itself; choose another output", out, in);
    if (lstat(out, &sb) == 0) {
        if (!force)
            return bfs__err(BFS_EEXIST, "%s: already exists (remove it first, or --force)", out);
        if (S_ISDIR(sb.st_mode))
            return bfs__err(BFS_EUSAGE, "%s: is a directory", out);
    }
    errno = 0;
    const int rc = bfs__tmp_open_path(&d->t, out);
    if (rc < 0) {
        /* a failed open: name the output the user gave, and call a path that cannot be
         * created theirs to fix (errno is still the failed open's) */
        const int e = errno;
        if (e == 0)
            return rc;
        bfs__err_clear();
        return bfs__errno(e == ENOSPC || e == EROFS ? BFS_EIO : BFS_EUSAGE, e, "%s: cannot create", out);
    }
    d->fd = d->t.fd;
    const char *slash = strrchr(out, '/');
    if (slash)
        snprintf(d->what, sizeof d->what, "%.*s/%s", (int)(slash - out), out, d->t.tmp);
    else
        snprintf(d->what, sizeof d->what, "%s", d->t.tmp);
    return 0;
}

static int bfs__zst_dest_commit(bfs_zst_dest *d)
{
    const int rc = d->pipe ? 0 : bfs__tmp_commit(&d->t);
    d->fd = -1;
    return rc;
}

/* Remove the temporary of an uncommitted output (nothing for standard output). */
static void bfs__zst_dest_abort(bfs_zst_dest *d)
{
    if (!d->pipe)
        bfs__tmp_abort(&d->t);
    d->fd = -1;
}

typedef struct {
    int fd;      /* -1: discard */
    bool pipe;   /* standard output: write(), no offsets */
    uint64_t off;
    const char *what;
    XXH3_state_t *st;
} bfs_zst_fdsink;

static int bfs__zst_sink_fd(void *user, const uint8_t *p, size_t n)
{
    bfs_zst_fdsink *s = user;
    if (s->st)
        XXH3_128bits_update(s->st, p, n);
    if (s->fd < 0)
        return 0;
    int rc;
    if (s->pipe) {
        /* a pipe or socket nobody reads must not hold a signalled process: wait for room
         * with poll (checking for a cancel between waits), then write at most a page,
         * which a pipe that polled writable takes without blocking */
        struct stat sb;
        const bool fifo = fstat(1, &sb) == 0 && (S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode));
        size_t done = 0;
        while (done < n) {
            if (bfs__cancelled())
                return bfs__err(BFS_EINTR, "interrupted while writing to standard output");
            size_t chunk = n - done;
            if (fifo) {
                struct pollfd pf = {.fd = 1, .events = POLLOUT};
                const int pr = poll(&pf, 1, 100);
                if (pr == 0 || (pr < 0 && errno == EINTR))
                    continue;
                if (chunk > 4096)
                    chunk = 4096;
            }
            const ssize_t k = write(1, p + done, chunk);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                return bfs__errno(BFS_EIO, errno, "standard output: write failed");
            done += (size_t)k;
        }
        rc = 0;
    } else {
        rc = bfs__pwrite_all(s->fd, p, n, s->off, s->what);
    }
    s->off += n;
    return rc;
}

void bfs_compress_opts_init(bfs_compress_opts *o)
{
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    o->level = ZSTD_CLEVEL_DEFAULT;
    o->mode = BFS_ZST_PLAIN;
}

/* Compress the safetensors file `in` into the open fd: header, then every tensor
 * in file order, a frame boundary before each. Hashes go to the writer. */
int bfs__zst_compress_fd(const char *in, int ofd, const bfs_compress_opts *o, bfs_zst_writer **wout,
                                uint64_t *in_size)
{
    int rc = 0, ifd = -1;
    uint8_t *hb = NULL, *buf = NULL;
    bfs_st_header h;
    bfs_zst_writer *w = NULL;
    struct stat sb;
    const size_t bs = 8u << 20;
    memset(&h, 0, sizeof h);
    *wout = NULL;
    ifd = open(in, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block us: refused below */
    if (ifd < 0)
        return bfs__errno(errno == ENOENT ? BFS_EINPUT : BFS_EIO, errno, "%s: cannot open", in);
    if (fstat(ifd, &sb) != 0 || !S_ISREG(sb.st_mode))
        BFS_FAIL(BFS_EINPUT, "%s: not a regular file", in);
    const uint64_t fs = (uint64_t)sb.st_size;
    *in_size = fs;
    uint8_t lb[8];
    uint64_t n = 0;
    if (fs < 8)
        BFS_FAIL(BFS_EINPUT, "%s: %llu bytes, too short for a safetensors file", in, (unsigned long long)fs);
    BFS_TRY(bfs__pread_all(ifd, lb, 8, 0, in));
    BFS_TRY(bfs__st_header_len(lb, fs, in, &n));
    hb = malloc((size_t)n + 8);
    buf = malloc(bs);
    if (!hb || !buf)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__pread_all(ifd, hb, (size_t)n + 8, 0, in));
    BFS_TRY(bfs__st_parse(hb, fs, in, &h));
    BFS_TRY(bfs__zst_writer_create(ofd, o->level, o->threads, (size_t)o->frame_bytes, o->mode, &w));
    BFS_TRY(bfs__zst_write(w, hb, (size_t)h.data_start));
    for (size_t i = 0; i < h.n; i++) {
        const bfs_st_tensor *t = &h.t[i];
        BFS_TRY(bfs__zst_cut_tensor(w, t->dtype));
        for (uint64_t off = t->begin; off < t->end;) {
            const size_t k = t->end - off < bs ? (size_t)(t->end - off) : bs;
            if (bfs__cancelled())
                BFS_FAIL(BFS_EINTR, "interrupted while compressing %s", in);
            BFS_TRY(bfs__pread_all(ifd, buf, k, h.data_start + off, in));
            BFS_TRY(bfs__zst_write(w, buf, k));
            off += k;
        }
        posix_fadvise(ifd, (off_t)(h.data_start + t->begin), (off_t)(t->end - t->begin), POSIX_FADV_DONTNEED);
    }
    BFS_TRY(bfs__zst_finish(w, NULL));
    *wout = w;
    w = NULL;
cleanup:
    bfs__zst_writer_free(w);
    bfs__st_header_free(&h);
    free(hb);
    free(buf);
    close(ifd);
    return rc;
}

/* For convert's reused rank files: compress in_path into the open ofd; *wout is finished. */
int bfs__zst_compress_into(const char *in_path, int ofd, int level, int threads, int mode, bfs_zst_writer **wout)
{
    bfs_compress_opts o;
    uint64_t isz = 0;
    bfs_compress_opts_init(&o);
    o.level = level;
    o.threads = threads;
    o.mode = mode;
    return bfs__zst_compress_fd(in_path, ofd, &o, wout, &isz);
}

int bfs__zst_run_begin(const bfs_compress_opts *o_arg, bfs_compress_opts *o, const bfs_compress_result *res_arg,
                       bfs_compress_result *res, struct timespec *t0)
{
    bfs__err_clear();
    clock_gettime(CLOCK_MONOTONIC, t0);
    bfs_compress_opts_init(o);
    bfs_compress_result_init(res);
    const int rc = bfs__struct_out_check(res_arg, "bfs_compress_result");
    return rc < 0 ? rc : bfs__struct_in(o, sizeof *o, o_arg, "bfs_compress_opts");
}

void bfs__zst_run_end(bfs_compress_result *res_arg, bfs_compress_result *res, const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    res->seconds = (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) * 1e-9;
    bfs__struct_out(res_arg, res, sizeof *res);
}

static int bfs__zst_compress_file(const char *in_path, const char *out_path, const bfs_compress_opts *o,
                                  bfs_compress_result *res)
{
    int rc = 0;
    bfs_zst_dest dst;
    bfs_zst_writer *w = NULL;
    uint64_t isz = 0;
    bfs__zst_dest_init(&dst);
    if (!in_path || !out_path)
        return bfs__err(BFS_EUSAGE, "compress needs an input and an output path");
    if (!strcmp(out_path, "-"))
        return bfs__err(BFS_EUSAGE, "compress writes a file, not standard output");
    BFS_TRY(bfs__zst_dest_open(&dst, out_path, in_path, o->force));
    BFS_TRY(bfs__zst_compress_fd(in_path, dst.fd, o, &w, &isz));
    BFS_TRY(bfs__zst_dest_commit(&dst));
    if (res) {
        res->bytes_in = isz;
        res->bytes_out = w->out_off;
        res->files = 1;
        res->frames = w->nent;
        bfs__zst_writer_hashes(w, res->xxh3_128, res->uncompressed_xxh3_128);
    }
cleanup:
    if (rc < 0)
        bfs__zst_dest_abort(&dst);
    bfs__zst_writer_free(w);
    return rc;
}

int bfs_compress_file_opts(const char *in_path, const char *out_path, const bfs_compress_opts *o_arg,
                           bfs_compress_result *res_arg)
{
    bfs_compress_opts o;
    bfs_compress_result res;
    struct timespec t0;
    int rc = bfs__zst_run_begin(o_arg, &o, res_arg, &res, &t0);
    if (rc == 0)
        rc = bfs__zst_compress_file(in_path, out_path, &o, &res);
    bfs__zst_run_end(res_arg, &res, &t0);
    return rc;
}

int bfs_compress_file(const char *in_path, const char *out_path, int level, int threads)
{
    bfs_compress_opts o;
    bfs_compress_opts_init(&o);
    o.level = level;
    o.threads = threads;
    return bfs_compress_file_opts(in_path, out_path, &o, NULL);
}

int bfs_decompress_file(const char *in_path, const char *out_path)
{
    return bfs_decompress_file_opts(in_path, out_path, NULL);
}

int bfs_decompress_file_opts(const char *in_path, const char *out_path, const bfs_compress_opts *o)
{
    int rc = 0;
    bfs_zst_dest dst;
    bfs_zst_reader *r = NULL;
    bfs__zst_dest_init(&dst);
    bfs__err_clear();
    if (!in_path || !out_path)
        return bfs__err(BFS_EUSAGE, "decompress needs an input and an output path");
    BFS_TRY(bfs__zst_reader_open(in_path, &r));
    BFS_TRY(bfs__zst_dest_open(&dst, out_path, in_path, o && o->force));
    /* no preallocation: the size comes from the (untrusted) seek table */
    const uint64_t total = bfs__zst_reader_size(r);
    bfs_zst_fdsink s = {.fd = dst.fd, .pipe = dst.pipe, .what = dst.what};
    BFS_TRY(bfs__zst_read_range(r, 0, total, bfs__zst_sink_fd, &s));
    BFS_TRY(bfs__zst_check_empty_frames(r)); /* a frame the table calls empty must be */
    BFS_TRY(bfs__zst_dest_commit(&dst));
cleanup:
    if (rc < 0)
        bfs__zst_dest_abort(&dst);
    bfs__zst_reader_free(r);
    return rc;
}

int bfs_extract(const char *zst_path, const char *tensor, const char *out_path, int raw)
{
    return bfs_extract_opts(zst_path, tensor, out_path, raw, NULL);
}

int bfs_extract_opts(const char *zst_path, const char *tensor, const char *out_path, int raw, const bfs_compress_opts *o)
{
    int rc = 0;
    bfs_zst_dest dst;
    bfs_zst_reader *r = NULL;
    uint8_t *hb = NULL;
    char *hdr = NULL;
    json_t *root = NULL;
    bfs_st_header h;
    memset(&h, 0, sizeof h);
    bfs__zst_dest_init(&dst);
    bfs__err_clear();
    if (!zst_path || !tensor || !out_path)
        return bfs__err(BFS_EUSAGE, "extract needs a file, a tensor name and an output path");
    BFS_TRY(bfs__zst_reader_open(zst_path, &r));
    BFS_TRY(bfs__zst_read_header(r, &hb, &h));
    const bfs_st_tensor *t = NULL;
    for (size_t i = 0; i < h.n && !t; i++)
        if (!strcmp(h.t[i].name, tensor))
            t = &h.t[i];
    if (!t)
        BFS_FAIL(BFS_EINPUT, "%s: no tensor named \"%s\" (it holds %zu tensor(s)%s%s%s)", zst_path, tensor, h.n,
                 h.n ? ", e.g. \"" : "", h.n ? h.t[0].name : "", h.n ? "\"" : "");
    BFS_TRY(bfs__zst_dest_open(&dst, out_path, zst_path, o && o->force));
    bfs_zst_fdsink s = {.fd = dst.fd, .pipe = dst.pipe, .what = dst.what};
    if (!raw) {
        /* a standalone safetensors file: the tensor alone, data at offset 0 */
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
        root = json_pack("{s:{s:s}, s:{s:s, s:o, s:[I, I]}}", "__metadata__", "format", "pt", t->name, "dtype",
                         bfs__dtype_name(t->dtype), "shape", shape, "data_offsets", (json_int_t)0,
                         (json_int_t)(t->end - t->begin));
        size_t hl = 0;
        hdr = root ? bfs__st_header_text(root, 8, &hl) : NULL;
        if (!hdr)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        uint8_t lb[8];
        bfs__st_put_len(lb, hl);
        BFS_TRY(bfs__zst_sink_fd(&s, lb, 8));
        BFS_TRY(bfs__zst_sink_fd(&s, (const uint8_t *)hdr, hl));
    }
    BFS_TRY(bfs__zst_read_range(r, h.data_start + t->begin, t->end - t->begin, bfs__zst_sink_fd, &s));
    BFS_TRY(bfs__zst_dest_commit(&dst));
cleanup:
    if (rc < 0)
        bfs__zst_dest_abort(&dst);
    json_decref(root);
    free(hdr);
    free(hb);
    bfs__st_header_free(&h);
    bfs__zst_reader_free(r);
    return rc;
}
