/*
 * bfs_convert: the streaming pipeline.
 *
 *   open inputs (mmap) -> plan (every header, offset, size) -> for each output
 *   file: for each piece: units of dim-0 rows that fit the buffer budget ->
 *   backend fills buffer k%2 -> writer thread pwrite()s + hashes it while the
 *   next unit is dequantized -> fdatasync, rename -> journal line.
 *   Then config.json, copied tokenizer files, manifest (last, atomically).
 *
 * Memory: two unit buffers of --mem/2 each, the writer's nothing more; input
 * pages are released (madvise + fadvise DONTNEED) after each unit and output
 * dirty pages are pushed out every BFS_FLUSH_WINDOW bytes, so neither RSS nor
 * page cache grows with the model.
 */
#include "bfs_internal.h"
#include "bfs_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define BFS_DEFAULT_MEM (256ull << 20)
#define BFS_DEFAULT_GPU_MEM (1ull << 30)
#define BFS_FLUSH_WINDOW (32ull << 20)

/* lock-free atomic: safe from a signal handler and read by the worker threads */
static _Atomic int bfs__cancel_flag;
void bfs_cancel(void) { bfs__cancel_flag = 1; }

void bfs_convert_opts_init(bfs_convert_opts *o)
{
    memset(o, 0, sizeof *o);
    o->world_size = 1;
    o->layout = BFS_LAYOUT_DCP;
    o->device = "auto";
    o->mxfp4_layout = BFS_MXFP4_HF;
    o->cpu_level = -1;
}

/* Files beside the weights that a BF16 checkpoint needs unchanged. */
static const char *const bfs__aux_files[] = {
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt", "generation_config.json",
    "chat_template.jinja", "chat_template.json", "preprocessor_config.json", "processor_config.json",
    "spiece.model", "tokenizer.tiktoken",
};
#define BFS_NAUX (sizeof bfs__aux_files / sizeof *bfs__aux_files)

/* ---- source ranges of a unit (prefetch and release) --------------------------- */
typedef struct {
    const bfs_raw *r;
    uint64_t off, len; /* relative to r->data */
} bfs_srange;

static int bfs__unit_sources(const bfs_unit *u, bfs_srange out[2])
{
    const bfs_ltensor *t = u->t;
    const uint64_t e0 = u->row0 * t->row_elems, e1 = u->row1 * t->row_elems;
    switch (t->kind) {
    case BFS_K_PASS:
    case BFS_K_CAST: {
        const uint64_t is = bfs__dtype_size(t->src_dtype);
        out[0] = (bfs_srange){t->src[0], e0 * is, (e1 - e0) * is};
        return 1;
    }
    case BFS_K_BNB4:
        out[0] = (bfs_srange){t->src[0], e0 / 2, (e1 + 1) / 2 - e0 / 2};
        return 1;
    case BFS_K_MXFP4: {
        const uint64_t per = t->mx_items ? t->mx.R * t->mx.G : t->mx.G; /* scale bytes per dim-0 row */
        out[0] = (bfs_srange){t->src[0], u->row0 * per * 16, (u->row1 - u->row0) * per * 16};
        out[1] = (bfs_srange){t->src[1], u->row0 * per, (u->row1 - u->row0) * per};
        return 2;
    }
    }
    return 0;
}

static void bfs__advise_sources(const bfs_input *in, const bfs_unit *u, bool release)
{
    bfs_srange s[2];
    const int n = bfs__unit_sources(u, s);
    const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < n; i++) {
        if (s[i].len == 0)
            continue;
        const bfs_infile *f = &in->files[s[i].r->file];
        const uint64_t a = s[i].r->file_offset + s[i].off, b = a + s[i].len;
        /* outward to pages: dropping clean shared file pages is always safe */
        const uint64_t pa = a / pg * pg, pb = (b + pg - 1) / pg * pg;
        const uint64_t pe = pb < f->size ? pb : f->size;
        if (release) {
            madvise((void *)(f->map + pa), (size_t)(pe - pa), MADV_DONTNEED);
            posix_fadvise(f->fd, (off_t)pa, (off_t)(pe - pa), POSIX_FADV_DONTNEED);
        } else {
            madvise((void *)(f->map + pa), (size_t)(pe - pa), MADV_WILLNEED);
        }
    }
}

/* ---- writer thread ------------------------------------------------------------- */
typedef struct bfs_wjob {
    const void *buf;
    size_t len;
    uint64_t off;
    int piece;     /* index in the file's pieces, -1 for the header */
    bool piece_end;
} bfs_wjob;

typedef struct bfs_writer {
    pthread_t tid;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bfs_wjob q[2];
    int head, count;   /* ring of at most 2 */
    bool stop;
    int rc;
    char msg[1024];
    /* current file */
    int fd;
    const char *what;
    XXH3_state_t *file_st, *piece_st;
    char (*piece_hex)[33];
    uint64_t flushed;  /* bytes pushed out and dropped */
    uint64_t written;  /* bytes written in this file */
    _Atomic uint64_t total; /* tensor bytes over the run */
    /* ISSUE 7: the compressed copy of the current file, fed in order; NULL when off */
    bfs_zst_writer *zw;
    const bfs_outfile *zof;
    const bfs_plan *zplan;
    int zpiece;        /* piece that zw is in, -1 for the header */
} bfs_writer;

static int bfs__writer_do(bfs_writer *w, const bfs_wjob *j)
{
    /* 1 MiB at a time: both hashes and the copy into the page cache read it while it
     * is in cache, instead of three passes over a unit-sized buffer from DRAM */
    int rc = 0;
    const uint8_t *jb = j->buf;
    for (size_t o = 0; o < j->len;) {
        const size_t n = j->len - o < (1u << 20) ? j->len - o : (1u << 20);
        XXH3_128bits_update(w->file_st, jb + o, n);
        if (j->piece >= 0)
            XXH3_128bits_update(w->piece_st, jb + o, n);
        rc = bfs__pwrite_all(w->fd, jb + o, n, j->off + o, w->what);
        if (rc < 0)
            return rc;
        o += n;
    }
    if (w->zw) { /* a frame boundary before every piece */
        if (j->piece >= 0 && j->piece != w->zpiece) {
            w->zpiece = j->piece;
            rc = bfs__zst_cut_tensor(w->zw, w->zplan->t[w->zof->pieces[j->piece].tensor].out_dtype);
        }
        if (rc == 0)
            rc = bfs__zst_write(w->zw, j->buf, j->len);
        if (rc < 0)
            return rc;
    }
    if (j->piece >= 0) {
        if (j->piece_end) {
            bfs__hash_hex(XXH3_128bits_digest(w->piece_st), w->piece_hex[j->piece]);
            XXH3_128bits_reset(w->piece_st);
        }
        atomic_fetch_add(&w->total, j->len);
    }
    w->written = j->off + j->len;
    /* bound dirty pages: start writeback of the last window, wait for and drop the one before */
    if (w->written - w->flushed >= 2 * BFS_FLUSH_WINDOW) {
        const uint64_t a = w->flushed, b = w->flushed + BFS_FLUSH_WINDOW;
        sync_file_range(w->fd, (off_t)b, (off_t)(w->written - b), SYNC_FILE_RANGE_WRITE);
        sync_file_range(w->fd, (off_t)a, (off_t)(b - a),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
        posix_fadvise(w->fd, (off_t)a, (off_t)(b - a), POSIX_FADV_DONTNEED);
        w->flushed = b;
    }
    return 0;
}

static void *bfs__writer_main(void *p)
{
    bfs_writer *w = p;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->count == 0 && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->count == 0 && w->stop)
            break;
        const bfs_wjob j = w->q[w->head];
        const bool failed = w->rc < 0;
        pthread_mutex_unlock(&w->mu);
        int rc = 0;
        if (!failed) {
            bfs__err_clear();
            rc = bfs__writer_do(w, &j);
        }
        pthread_mutex_lock(&w->mu);
        if (rc < 0 && w->rc == 0) {
            w->rc = rc;
            snprintf(w->msg, sizeof w->msg, "%s", bfs_last_error());
        }
        w->head = (w->head + 1) % 2;
        w->count--;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Queue a job; blocks while 2 are pending. The buffer must stay untouched until
 * bfs__writer_wait_slot says it is free again. */
static int bfs__writer_push(bfs_writer *w, const bfs_wjob *j)
{
    pthread_mutex_lock(&w->mu);
    while (w->count == 2)
        pthread_cond_wait(&w->cv, &w->mu);
    w->q[(w->head + w->count) % 2] = *j;
    w->count++;
    pthread_cond_broadcast(&w->cv);
    const int rc = w->rc;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

/* Wait until at most `pending` jobs remain queued or running. */
static int bfs__writer_wait(bfs_writer *w, int pending)
{
    pthread_mutex_lock(&w->mu);
    while (w->count > pending)
        pthread_cond_wait(&w->cv, &w->mu);
    const int rc = w->rc;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

/* ---- the run's state ---------------------------------------------------------------- */
typedef struct bfs_run {
    const bfs_convert_opts *o;
    const char *outdir;
    int dirfd;
    bfs_input *in;
    bfs_plan *plan;
    bfs_backend *be;
    uint8_t *buf[2];
    uint64_t unit_bytes;       /* capacity of each buffer */
    bfs_writer w;
    char (*file_hex)[33];      /* per output file */
    json_t **zst;              /* per output file: its compressed copy's manifest entry (ISSUE 7) */
    char (**piece_hex)[33];    /* per output file, per piece */
    bool *reused;
    char fingerprint[33];
    char (*src_hex)[33];       /* per input file */
    pthread_t src_tid;
    bool src_started;
    int src_rc;
    char src_msg[1024];
    char tmpname[PATH_MAX];    /* temp file being written, "" when none */
    json_t *aux;               /* extra files written: [{name,size,xxh3_128,kind}] */
    uint64_t bytes_done;
    struct timespec t0;
} bfs_run;

static double bfs__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void bfs__log(const bfs_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bfs__log(const bfs_run *r, const char *fmt, ...)
{
    if (!r->o->log)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("bfshard: ", r->o->log);
    vfprintf(r->o->log, fmt, ap);
    fputc('\n', r->o->log);
    va_end(ap);
    fflush(r->o->log);
}

/* ---- source hashing (a background thread; pread, so RSS stays small) ------------------ */
static void *bfs__src_hash_main(void *p)
{
    bfs_run *r = p;
    const size_t bs = 4u << 20;
    XXH3_state_t *st = XXH3_createState();
    int rc = 0;
    if (!st) {
        rc = bfs__err(BFS_ENOMEM, "out of memory hashing sources");
        goto done;
    }
    for (int i = 0; i < r->in->nfiles && !bfs__cancel_flag; i++) {
        const bfs_infile *f = &r->in->files[i];
        XXH3_128bits_reset(st);
        for (uint64_t off = 0; off < f->size && !bfs__cancel_flag; off += bs) {
            const size_t n = f->size - off < bs ? (size_t)(f->size - off) : bs;
            /* straight from the mapping: no copy, and the page cache keeps the pages for
             * the converter (which releases them after its unit). A file truncated under
             * us reads zeros here (input.c's SIGBUS handler); bfs__input_check after the
             * join turns that into an error. */
            XXH3_128bits_update(st, f->map + off, n);
            madvise((void *)(f->map + off), n, MADV_DONTNEED); /* drops our PTEs (RSS), not the cache */
        }
        bfs__hash_hex(XXH3_128bits_digest(st), r->src_hex[i]);
    }
done:
    if (rc < 0) {
        r->src_rc = rc;
        snprintf(r->src_msg, sizeof r->src_msg, "%s", bfs_last_error());
    }
    XXH3_freeState(st);
    return NULL;
}

/* ---- fingerprint: what determines the output bytes ------------------------------------- */
static void bfs__fingerprint(bfs_run *r)
{
    XXH3_state_t *st = XXH3_createState();
    char opt[256];
    XXH3_128bits_reset(st);
    snprintf(opt, sizeof opt, "bfshard %s w=%d layout=%d mx=%d keep=%d shard=%llu", BFS_VERSION_STRING,
             r->o->world_size, r->o->layout, r->o->mxfp4_layout, r->o->keep_dtype,
             (unsigned long long)r->o->max_shard_size);
    if (r->o->compress_level) /* ISSUE 7: only then, so other fingerprints stay as they were */
        snprintf(opt + strlen(opt), sizeof opt - strlen(opt), " zst=%d:%d", r->o->compress_level, r->o->compress_mode);
    XXH3_128bits_update(st, opt, strlen(opt));
    for (int i = 0; i < r->in->nfiles; i++) {
        const bfs_infile *f = &r->in->files[i];
        struct stat sb;
        uint64_t meta[3] = {f->size, 0, 0};
        if (fstat(f->fd, &sb) == 0) {
            meta[1] = (uint64_t)sb.st_mtim.tv_sec;
            meta[2] = (uint64_t)sb.st_mtim.tv_nsec;
        }
        XXH3_128bits_update(st, f->name, strlen(f->name) + 1);
        XXH3_128bits_update(st, meta, sizeof meta);
        XXH3_128bits_update(st, f->map, (size_t)f->h.data_start);
    }
    if (r->in->config_json)
        XXH3_128bits_update(st, r->in->config_json, strlen(r->in->config_json));
    bfs__hash_hex(XXH3_128bits_digest(st), r->fingerprint);
    XXH3_freeState(st);
}

/* ---- output directory ------------------------------------------------------------------- */
static bool bfs__is_ours(const char *name)
{
    const size_t n = strlen(name);
    if ((n > 12 && strcmp(name + n - 12, ".safetensors") == 0) || (n > 8 && strcmp(name + n - 8, ".partial") == 0))
        return true;
    if (n > 16 && (!strcmp(name + n - 16, ".safetensors.zst") || !strcmp(name + n - 16, ".safetensors.bfz")))
        return true;
    if (!strcmp(name, BFS_MANIFEST_NAME) || !strcmp(name, BFS_SUMS_NAME) || !strcmp(name, BFS_JOURNAL_NAME) ||
        !strcmp(name, "config.json") || !strcmp(name, "model.safetensors.index.json"))
        return true;
    for (size_t i = 0; i < BFS_NAUX; i++)
        if (!strcmp(name, bfs__aux_files[i]))
            return true;
    return false;
}

/* Is `child` equal to or inside `parent` (both absolute, canonical)? */
static bool bfs__path_within(const char *child, const char *parent)
{
    const size_t n = strlen(parent);
    return strncmp(child, parent, n) == 0 && (child[n] == '\0' || child[n] == '/' || (n == 1 && parent[0] == '/'));
}

/* canonical path of a directory that may not exist yet: realpath(parent)/base */
static char *bfs__canon_out(const char *outdir)
{
    char buf[PATH_MAX];
    if (realpath(outdir, buf))
        return bfs__strdup(buf);
    char *tmp = bfs__strdup(outdir);
    if (!tmp)
        return NULL;
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/')
        tmp[--n] = '\0';
    char *slash = strrchr(tmp, '/');
    const char *base = slash ? slash + 1 : tmp;
    const char *parent = slash ? (slash == tmp ? "/" : tmp) : ".";
    if (slash)
        *slash = '\0';
    char *res = NULL;
    if (realpath(parent, buf)) {
        res = malloc(strlen(buf) + strlen(base) + 2);
        if (res)
            sprintf(res, "%s/%s", strcmp(buf, "/") ? buf : "", base);
    }
    free(tmp);
    return res;
}

static int bfs__check_paths(const char *input, const char *outdir, const bfs_input *in)
{
    int rc = 0;
    char inbuf[PATH_MAX];
    char *out = bfs__canon_out(outdir);
    if (!out)
        return bfs__errno(BFS_EUSAGE, errno, "%s: cannot resolve the output directory's parent", outdir);
    if (!realpath(in->root, inbuf))
        BFS_FAIL(BFS_EINPUT, "%s: cannot resolve the input directory", input);
    if (bfs__path_within(out, inbuf))
        BFS_FAIL(BFS_EUSAGE, "output directory %s is the input directory or inside it (%s): choose another", outdir, inbuf);
    for (int i = 0; i < in->nfiles; i++) {
        char fb[PATH_MAX];
        if (realpath(in->files[i].path, fb) && bfs__path_within(fb, out))
            BFS_FAIL(BFS_EUSAGE, "input file %s lies inside the output directory %s: choose another", in->files[i].path, outdir);
    }
cleanup:
    free(out);
    return rc;
}

static int bfs__read_journal(bfs_run *r, char **text)
{
    *text = NULL;
    int fd = openat(r->dirfd, BFS_JOURNAL_NAME, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > (16 << 20)) {
        close(fd);
        return 0;
    }
    char *t = malloc((size_t)sb.st_size + 1);
    if (!t) {
        close(fd);
        return bfs__err(BFS_ENOMEM, "out of memory");
    }
    const int rc = bfs__pread_all(fd, t, (size_t)sb.st_size, 0, BFS_JOURNAL_NAME);
    close(fd);
    if (rc < 0) {
        free(t);
        return 0;
    }
    t[sb.st_size] = '\0';
    *text = t;
    return 0;
}

static int bfs__append_journal(bfs_run *r, const char *line)
{
    int fd = openat(r->dirfd, BFS_JOURNAL_NAME, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return bfs__errno(BFS_EIO, errno, "%s/%s: cannot open", r->outdir, BFS_JOURNAL_NAME);
    const size_t n = strlen(line);
    const ssize_t k = write(fd, line, n);
    const int e = errno;
    if (k != (ssize_t)n || fdatasync(fd) != 0) {
        close(fd);
        return bfs__errno(BFS_EIO, k < 0 ? e : ENOSPC, "%s/%s: cannot write", r->outdir, BFS_JOURNAL_NAME);
    }
    close(fd);
    return 0;
}

/* A finished conversion of the same input with the same options that still verifies:
 * a rerun has nothing to do (pipelines rerun commands). */
static bool bfs__already_done(bfs_run *r)
{
    char *mpath = bfs__path_join(r->outdir, BFS_MANIFEST_NAME), *text = NULL;
    bool done = false;
    if (mpath && bfs__read_small_file(mpath, 1u << 30, &text, NULL) == 0) {
        json_t *m = json_loads(text, 0, NULL);
        const char *fp = m ? json_string_value(json_object_get(m, "plan_fingerprint")) : NULL;
        if (fp && strcmp(fp, r->fingerprint) == 0)
            done = bfs_verify(r->outdir, NULL, NULL) == 0;
        json_decref(m);
    }
    bfs__err_clear();
    free(text);
    free(mpath);
    return done;
}

/* Empty (or create) OUTDIR, or work out what an interrupted earlier run left. */
static int bfs__prepare_outdir(bfs_run *r)
{
    int rc = 0;
    DIR *d = NULL;
    char *journal = NULL;
    struct stat sb;
    if (mkdir(r->outdir, 0755) != 0 && errno != EEXIST)
        return bfs__errno(errno == ENOSPC || errno == EROFS ? BFS_EIO : BFS_EUSAGE, errno, "%s: cannot create output directory", r->outdir);
    if (lstat(r->outdir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return bfs__err(BFS_EUSAGE, "%s: exists and is not a directory", r->outdir);
    r->dirfd = open(r->outdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (r->dirfd < 0)
        return bfs__errno(BFS_EIO, errno, "%s: cannot open output directory", r->outdir);

    BFS_TRY(bfs__read_journal(r, &journal));
    const bool resume = journal && strncmp(journal, r->fingerprint, 32) == 0 && !r->o->force;

    d = fdopendir(dup(r->dirfd));
    if (!d)
        BFS_FAIL(BFS_EIO, "%s: cannot list output directory", r->outdir);
    struct dirent *e;
    bool nonempty = false;
    /* a run killed while starting leaves a journal without its fingerprint line: debris */
    const bool torn = journal && !(strlen(journal) >= 33 && journal[32] == '\n');
    while ((e = readdir(d)) != NULL) {
        const size_t n = strlen(e->d_name);
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if ((e->d_name[0] == '.' && n > 8 && !strcmp(e->d_name + n - 8, ".partial")) ||
            (torn && !strcmp(e->d_name, BFS_JOURNAL_NAME)))
            continue; /* an interrupted run's temporary files are not the user's */
        nonempty = true;
    }
    if (nonempty && !resume && !r->o->force) {
        if (journal)
            BFS_FAIL(BFS_EEXIST, "%s: holds an interrupted conversion of other input or options; use --force to replace it", r->outdir);
        BFS_FAIL(BFS_EEXIST, "%s: exists and is not empty; use --force to replace its files", r->outdir);
    }
    rewinddir(d);
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, ".."))
            continue;
        if (resume) {
            /* keep rank files the journal vouches for; the hash is re-checked below */
            const size_t n = strlen(nm);
            if (!(n > 8 && !strcmp(nm + n - 8, ".partial")) && strcmp(nm, BFS_JOURNAL_NAME) != 0 &&
                !(n > 12 && !strcmp(nm + n - 12, ".safetensors")))
                unlinkat(r->dirfd, nm, 0);
            else if (n > 8 && !strcmp(nm + n - 8, ".partial"))
                unlinkat(r->dirfd, nm, 0);
            continue;
        }
        if (bfs__is_ours(nm) || (nm[0] == '.' && strlen(nm) > 8 && !strcmp(nm + strlen(nm) - 8, ".partial"))) {
            /* unlinkat removes a symlink itself, never its target */
            if (unlinkat(r->dirfd, nm, 0) != 0 && errno != ENOENT)
                BFS_FAIL(BFS_EIO, "%s/%s: cannot remove (%s)", r->outdir, nm, strerror(errno));
        }
    }
    if (resume) {
        /* journal lines after the fingerprint: "HASH  NAME" of committed rank files */
        const size_t bs = 8u << 20;
        uint8_t *buf = malloc(bs);
        XXH3_state_t *st = XXH3_createState();
        if (!buf || !st) {
            free(buf);
            XXH3_freeState(st);
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        }
        for (int f = 0; f < r->plan->nfiles; f++) {
            const bfs_outfile *of = &r->plan->files[f];
            char want[33] = {0}, key[512];
            snprintf(key, sizeof key, "  %s\n", of->name);
            const char *hit = strstr(journal, key);
            if (!hit || hit - journal < 32)
                continue;
            memcpy(want, hit - 32, 32);
            const int fd = openat(r->dirfd, of->name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
            if (fd < 0)
                continue;
            struct stat fs;
            bool ok = fstat(fd, &fs) == 0 && S_ISREG(fs.st_mode) && (uint64_t)fs.st_size == of->size;
            if (ok) {
                XXH3_128bits_reset(st);
                char got[33];
                ok = bfs__hash_range(fd, 0, of->size, buf, bs, of->name, st, NULL) == 0;
                bfs__hash_hex(XXH3_128bits_digest(st), got);
                ok = ok && strcmp(got, want) == 0;
            }
            close(fd);
            bfs__err_clear();
            if (ok) {
                r->reused[f] = true;
                memcpy(r->file_hex[f], want, 33);
            } else {
                unlinkat(r->dirfd, of->name, 0);
            }
        }
        free(buf);
        XXH3_freeState(st);
        /* the reused files' piece hashes are recomputed from disk when the manifest is built */
    } else {
        char line[64];
        snprintf(line, sizeof line, "%s\n", r->fingerprint);
        int fd = openat(r->dirfd, BFS_JOURNAL_NAME, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0)
            BFS_FAIL(BFS_EIO, "%s/%s: cannot create (%s)", r->outdir, BFS_JOURNAL_NAME, strerror(errno));
        close(fd);
        BFS_TRY(bfs__append_journal(r, line));
    }
cleanup:
    if (d)
        closedir(d);
    free(journal);
    return rc;
}

/* ---- one output file ------------------------------------------------------------------- */
static void bfs__progress(bfs_run *r, const char *tensor)
{
    if (!r->o->progress)
        return;
    const bfs_progress p = {.bytes_done = atomic_load(&r->w.total), .bytes_total = r->plan->total_bytes, .tensor = tensor};
    r->o->progress(&p, r->o->progress_user);
}

/* An input truncated or rewritten under us fails the run before a unit reads it,
 * and after it ran (input.c's SIGBUS handler gave it zeros for vanished pages). */
static int bfs__check_sources(const bfs_run *r, const bfs_ltensor *t)
{
    for (int k = 0; k < t->nsrc; k++) {
        const int rc = bfs__input_check(r->in, t->src[k]->file);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- ISSUE 7: the compressed copy beside a rank file (src/zst.c) ------------------------ */
static int bfs__zcopy_open(bfs_run *r, const bfs_outfile *of, char *zname, char *ztmp, int *zfd)
{
    snprintf(zname, 600, "%s%s", of->name, r->o->compress_mode == BFS_ZST_BYTEGROUP ? ".bfz" : ".zst");
    snprintf(ztmp, 600, ".%s.partial", zname);
    *zfd = openat(r->dirfd, ztmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (*zfd < 0) {
        ztmp[0] = '\0';
        return bfs__errno(BFS_EIO, errno, "%s/.%s.partial: cannot create", r->outdir, zname);
    }
    return 0;
}

/* finish (unless done), sync, rename, record for the manifest */
static int bfs__zcopy_commit(bfs_run *r, int fidx, bfs_zst_writer *zw, bool finished, int zfd, const char *zname,
                             char *ztmp)
{
    const int rc = finished ? 0 : bfs__zst_finish(zw, NULL);
    if (rc < 0)
        return rc;
    if (fdatasync(zfd) != 0)
        return bfs__errno(BFS_EIO, errno, "%s/%s: fdatasync failed", r->outdir, ztmp);
    if (renameat(r->dirfd, ztmp, r->dirfd, zname) != 0)
        return bfs__errno(BFS_EIO, errno, "%s/%s: cannot rename to %s", r->outdir, ztmp, zname);
    ztmp[0] = '\0';
    json_decref(r->zst[fidx]);
    r->zst[fidx] = bfs__zst_manifest_entry(zw, zname);
    return r->zst[fidx] ? 0 : bfs__err(BFS_ENOMEM, "out of memory");
}

/* a rank file reused from an interrupted run: compress it from disk */
static int bfs__zcopy_reused(bfs_run *r, int fidx)
{
    int rc = 0, zfd = -1;
    char zname[600], ztmp[600] = "";
    bfs_zst_writer *zw = NULL;
    char *in = bfs__path_join(r->outdir, r->plan->files[fidx].name);
    if (!in)
        return bfs__err(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__zcopy_open(r, &r->plan->files[fidx], zname, ztmp, &zfd));
    BFS_TRY(bfs__zst_compress_into(in, zfd, r->o->compress_level, r->o->threads, r->o->compress_mode, &zw));
    BFS_TRY(bfs__zcopy_commit(r, fidx, zw, true, zfd, zname, ztmp));
cleanup:
    bfs__zst_writer_free(zw);
    if (zfd >= 0)
        close(zfd);
    if (ztmp[0])
        unlinkat(r->dirfd, ztmp, 0);
    free(in);
    return rc;
}

static int bfs__write_file(bfs_run *r, int fidx)
{
    int zfd = -1;
    char zname[600], ztmp[600] = "";
    int rc = 0, fd = -1;
    const bfs_outfile *of = &r->plan->files[fidx];
    char what[PATH_MAX + 64];
    uint8_t lenbuf[8];
    int slot = 0;

    snprintf(r->tmpname, sizeof r->tmpname, ".%s.partial", of->name);
    snprintf(what, sizeof what, "%s/%s", r->outdir, r->tmpname);
    fd = openat(r->dirfd, r->tmpname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        r->tmpname[0] = '\0';
        return bfs__errno(BFS_EIO, errno, "%s: cannot create", what);
    }
    /* reserve the whole file now: a full disk fails here, before any work */
    const int fe = posix_fallocate(fd, 0, (off_t)of->size);
    if (fe == ENOSPC || fe == EFBIG || fe == EDQUOT)
        BFS_FAIL(BFS_EIO, "%s: cannot reserve %llu bytes: %s", what, (unsigned long long)of->size, strerror(fe));
    if (fe != 0 && ftruncate(fd, (off_t)of->size) != 0)
        BFS_FAIL(BFS_EIO, "%s: cannot size to %llu bytes: %s", what, (unsigned long long)of->size, strerror(errno));

    XXH3_128bits_reset(r->w.file_st);
    XXH3_128bits_reset(r->w.piece_st);
    r->w.fd = fd;
    r->w.what = what;
    r->w.piece_hex = r->piece_hex[fidx];
    r->w.flushed = 0;
    r->w.written = 0;
    if (r->o->compress_level) {
        BFS_TRY(bfs__zcopy_open(r, of, zname, ztmp, &zfd));
        BFS_TRY(bfs__zst_writer_create(zfd, r->o->compress_level, r->o->threads, 0, r->o->compress_mode, &r->w.zw));
        r->w.zof = of;
        r->w.zplan = r->plan;
        r->w.zpiece = -1;
    }

    const uint64_t hl = of->data_start - 8;
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (uint8_t)(hl >> (8 * i));
    BFS_TRY(bfs__writer_push(&r->w, &(bfs_wjob){.buf = lenbuf, .len = 8, .off = 0, .piece = -1}));
    BFS_TRY(bfs__writer_push(&r->w, &(bfs_wjob){.buf = of->header, .len = (size_t)hl, .off = 8, .piece = -1}));

    for (size_t pi = 0; pi < of->npieces; pi++) {
        const bfs_piece *pc = &of->pieces[pi];
        const bfs_ltensor *t = &r->plan->t[pc->tensor];
        const uint64_t row_bytes = t->row_elems * bfs__dtype_size(t->out_dtype);
        const uint64_t rows_per_unit = row_bytes ? r->unit_bytes / row_bytes : UINT64_MAX;
        uint64_t row = pc->row0, off = pc->offset;
        if (pc->row0 == pc->row1 || row_bytes == 0) { /* empty piece: hash of nothing */
            BFS_TRY(bfs__writer_push(&r->w, &(bfs_wjob){.buf = lenbuf, .len = 0, .off = off, .piece = (int)pi, .piece_end = true}));
            continue;
        }
        while (row < pc->row1) {
            if (bfs__cancel_flag)
                BFS_FAIL(BFS_EINTR, "interrupted while writing %s (tensor \"%s\")", of->name, t->name);
            const uint64_t n = pc->row1 - row < rows_per_unit ? pc->row1 - row : rows_per_unit;
            bfs_unit u = {.t = t, .row0 = row, .row1 = row + n, .out = r->buf[slot]};
            /* the buffer we are about to fill was queued two jobs ago: wait for it */
            if (bfs__writer_wait(&r->w, 1) < 0)
                BFS_FAIL(r->w.rc, "%s", r->w.msg);
            if (row + n < pc->row1) {
                const bfs_unit next = {.t = t, .row0 = row + n, .row1 = pc->row1 < row + 2 * n ? pc->row1 : row + 2 * n};
                bfs__advise_sources(r->in, &next, false);
            }
            BFS_TRY(bfs__check_sources(r, t));
            BFS_TRY(r->be->run(r->be, &u));
            BFS_TRY(bfs__check_sources(r, t));
            bfs__advise_sources(r->in, &u, true);
            const bfs_wjob j = {.buf = r->buf[slot], .len = (size_t)(n * row_bytes), .off = off, .piece = (int)pi,
                                .piece_end = row + n == pc->row1};
            if (bfs__writer_push(&r->w, &j) < 0)
                BFS_FAIL(r->w.rc, "%s", r->w.msg);
            slot ^= 1;
            row += n;
            off += n * row_bytes;
            bfs__progress(r, t->name);
        }
    }
    if (bfs__writer_wait(&r->w, 0) < 0)
        BFS_FAIL(r->w.rc, "%s", r->w.msg);
    bfs__hash_hex(XXH3_128bits_digest(r->w.file_st), r->file_hex[fidx]);
    if (r->w.zw) {
        BFS_TRY(bfs__zcopy_commit(r, fidx, r->w.zw, false, zfd, zname, ztmp));
        bfs__zst_writer_free(r->w.zw);
        r->w.zw = NULL;
    }
    if (fdatasync(fd) != 0)
        BFS_FAIL(BFS_EIO, "%s: fdatasync failed: %s", what, strerror(errno));
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (close(fd) != 0) {
        fd = -1;
        BFS_FAIL(BFS_EIO, "%s: close failed: %s", what, strerror(errno));
    }
    fd = -1;
    if (renameat(r->dirfd, r->tmpname, r->dirfd, of->name) != 0)
        BFS_FAIL(BFS_EIO, "%s: cannot rename to %s: %s", what, of->name, strerror(errno));
    r->tmpname[0] = '\0';
    if (fsync(r->dirfd) != 0)
        BFS_FAIL(BFS_EIO, "%s: fsync of the directory failed: %s", r->outdir, strerror(errno));
    char line[600];
    snprintf(line, sizeof line, "%s  %s\n", r->file_hex[fidx], of->name);
    BFS_TRY(bfs__append_journal(r, line));
cleanup:
    if (rc < 0) {
        bfs__writer_wait(&r->w, 0); /* the writer may still hold our buffers */
        if (fd >= 0)
            close(fd);
        if (r->tmpname[0])
            unlinkat(r->dirfd, r->tmpname, 0);
        r->tmpname[0] = '\0';
    }
    bfs__zst_writer_free(r->w.zw);
    r->w.zw = NULL;
    if (zfd >= 0)
        close(zfd);
    if (ztmp[0])
        unlinkat(r->dirfd, ztmp, 0);
    return rc;
}

/* Re-hash a reused file's pieces (the manifest needs them). */
static int bfs__rehash_pieces(bfs_run *r, int fidx)
{
    const bfs_outfile *of = &r->plan->files[fidx];
    int rc = 0;
    const int fd = openat(r->dirfd, of->name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return bfs__errno(BFS_EIO, errno, "%s/%s: cannot open", r->outdir, of->name);
    XXH3_state_t *st = XXH3_createState();
    for (size_t pi = 0; pi < of->npieces && rc == 0; pi++) {
        XXH3_128bits_reset(st);
        rc = bfs__hash_range(fd, of->pieces[pi].offset, of->pieces[pi].nbytes, r->buf[0], (size_t)r->unit_bytes,
                             of->name, st, NULL);
        bfs__hash_hex(XXH3_128bits_digest(st), r->piece_hex[fidx][pi]);
    }
    XXH3_freeState(st);
    close(fd);
    return rc;
}

/* ---- small files: config.json, tokenizer files, manifest ------------------------------ */
static int bfs__write_small(bfs_run *r, const char *name, const void *data, size_t len, const char *kind)
{
    int rc = 0;
    char tmp[600], hex[33];
    snprintf(tmp, sizeof tmp, ".%s.partial", name);
    const int fd = openat(r->dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return bfs__errno(BFS_EIO, errno, "%s/%s: cannot create", r->outdir, tmp);
    char what[PATH_MAX + 600];
    snprintf(what, sizeof what, "%s/%s", r->outdir, tmp);
    rc = bfs__pwrite_all(fd, data, len, 0, what);
    if (rc == 0 && fdatasync(fd) != 0)
        rc = bfs__errno(BFS_EIO, errno, "%s/%s: fdatasync failed", r->outdir, tmp);
    close(fd);
    if (rc == 0 && renameat(r->dirfd, tmp, r->dirfd, name) != 0)
        rc = bfs__errno(BFS_EIO, errno, "%s/%s: cannot rename", r->outdir, tmp);
    if (rc < 0) {
        unlinkat(r->dirfd, tmp, 0);
        return rc;
    }
    if (kind && r->aux) {
        bfs__hash_hex(XXH3_128bits(data, len), hex);
        json_t *e = json_pack("{s:s, s:I, s:s, s:s}", "name", name, "size", (json_int_t)len, "xxh3_128", hex, "kind", kind);
        json_array_append_new(r->aux, e);
    }
    return 0;
}

static int bfs__write_config(bfs_run *r)
{
    int rc = 0;
    json_error_t jerr;
    char *text = NULL;
    if (!r->in->config_json)
        return 0;
    json_t *cfg = json_loads(r->in->config_json, JSON_REJECT_DUPLICATES, &jerr);
    if (!cfg || !json_is_object(cfg))
        BFS_FAIL(BFS_EINPUT, "%s/config.json: not a JSON object (line %d: %s)", r->in->root, cfg ? 0 : jerr.line,
                 cfg ? "not an object" : jerr.text);
    json_object_del(cfg, "quantization_config");
    json_object_set_new(cfg, "torch_dtype", json_string("bfloat16"));
    if (json_object_get(cfg, "dtype"))
        json_object_set_new(cfg, "dtype", json_string("bfloat16"));
    size_t n;
    text = bfs__json_text(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER, &n);
    if (!text)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__write_small(r, "config.json", text, n, "config"));
cleanup:
    json_decref(cfg);
    free(text);
    return rc;
}

static int bfs__copy_aux(bfs_run *r)
{
    for (size_t i = 0; i < BFS_NAUX; i++) {
        char *p = bfs__path_join(r->in->root, bfs__aux_files[i]);
        char *data = NULL;
        size_t len = 0;
        struct stat sb;
        if (!p)
            return bfs__err(BFS_ENOMEM, "out of memory");
        if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            free(p);
            continue;
        }
        int rc = bfs__read_small_file(p, 1u << 30, &data, &len);
        free(p);
        if (rc == 0)
            rc = bfs__write_small(r, bfs__aux_files[i], data, len, "copy");
        free(data);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static json_t *bfs__shape_json(const uint64_t *s, int n)
{
    json_t *a = json_array();
    for (int d = 0; d < n; d++)
        json_array_append_new(a, json_integer((json_int_t)s[d]));
    return a;
}

static int bfs__write_manifest(bfs_run *r)
{
    int rc = 0;
    const bfs_plan *p = r->plan;
    char *text = NULL, *sums = NULL;
    json_t *m = json_object();
    json_object_set_new(m, "tool", json_string("bfshard"));
    json_object_set_new(m, "version", json_string(BFS_VERSION_STRING));
    json_object_set_new(m, "manifest_version", json_integer(1));
    json_object_set_new(m, "hash", json_string("XXH3-128 (canonical big-endian hex, as xxh128sum)"));
    json_object_set_new(m, "plan_fingerprint", json_string(r->fingerprint));
    json_object_set_new(m, "options",
                        json_pack("{s:i, s:s, s:s, s:b, s:I}", "world_size", r->o->world_size, "layout",
                                  p->layout == BFS_LAYOUT_DCP ? "dcp" : "hf", "mxfp4_layout",
                                  r->o->mxfp4_layout == BFS_MXFP4_HF ? "hf" : "openai", "keep_dtype", r->o->keep_dtype,
                                  "max_shard_size", (json_int_t)r->o->max_shard_size));
    json_t *src = json_array();
    for (int i = 0; i < r->in->nfiles; i++)
        json_array_append_new(src, json_pack("{s:s, s:I, s:s}", "name", r->in->files[i].name, "size",
                                             (json_int_t)r->in->files[i].size, "xxh3_128", r->src_hex[i]));
    json_object_set_new(m, "source", json_pack("{s:o}", "files", src));
    if (r->in->config_json) {
        json_t *cfg = json_loads(r->in->config_json, 0, NULL);
        json_t *qc = cfg ? json_object_get(cfg, "quantization_config") : NULL;
        if (qc)
            json_object_set(json_object_get(m, "source"), "quantization_config", qc);
        json_decref(cfg);
    }

    json_t *files = json_array();
    for (int f = 0; f < p->nfiles; f++) {
        json_t *e = json_pack("{s:s, s:I, s:s, s:s}", "name", p->files[f].name, "size", (json_int_t)p->files[f].size,
                              "xxh3_128", r->file_hex[f], "kind", "weights");
        if (p->layout == BFS_LAYOUT_DCP)
            json_object_set_new(e, "rank", json_integer(f));
        if (r->zst && r->zst[f])
            json_object_set(e, "zst", r->zst[f]);
        json_array_append_new(files, e);
    }
    for (size_t i = 0; i < json_array_size(r->aux); i++)
        json_array_append(files, json_array_get(r->aux, i));
    json_object_set_new(m, "files", files);

    json_t *tensors = json_array();
    for (size_t i = 0; i < p->nt; i++) {
        const bfs_ltensor *t = &p->t[i];
        json_t *srcs = json_array();
        for (int k = 0; k < t->nsrc; k++)
            json_array_append_new(srcs, json_string(t->src[k]->st->name));
        json_t *e = json_pack("{s:s, s:s, s:o, s:s, s:s, s:o}", "name", t->name, "dtype", bfs__dtype_name(t->out_dtype),
                              "shape", bfs__shape_json(t->shape, t->ndim), "format", bfs__kind_name(t),
                              "transform", t->transform, "sources", srcs);
        if (t->kind == BFS_K_BNB4 || t->kind == BFS_K_CAST || (t->kind == BFS_K_PASS && t->out_dtype != t->src_dtype))
            json_object_set_new(e, "source_dtype", json_string(bfs__dtype_name(t->src_dtype)));
        json_t *shards = json_array();
        for (int f = 0; f < p->nfiles; f++) {
            const bfs_outfile *of = &p->files[f];
            for (size_t pi = 0; pi < of->npieces; pi++) {
                const bfs_piece *pc = &of->pieces[pi];
                if (pc->tensor != (int)i)
                    continue;
                uint64_t shape[BFS_MAX_DIMS], so[BFS_MAX_DIMS] = {0};
                memcpy(shape, t->shape, sizeof shape);
                if (t->ndim > 0)
                    shape[0] = pc->row1 - pc->row0;
                so[0] = pc->row0;
                json_t *s = json_pack("{s:s, s:I, s:I, s:o, s:o, s:s}", "file", of->name, "offset",
                                      (json_int_t)pc->offset, "nbytes", (json_int_t)pc->nbytes, "shape",
                                      bfs__shape_json(shape, t->ndim), "saved_offsets", bfs__shape_json(so, t->ndim),
                                      "xxh3_128", r->piece_hex[f][pi]);
                if (p->layout == BFS_LAYOUT_DCP)
                    json_object_set_new(s, "rank", json_integer(f));
                json_array_append_new(shards, s);
            }
        }
        json_object_set_new(e, "shards", shards);
        json_array_append_new(tensors, e);
    }
    json_object_set_new(m, "tensors", tensors);
    json_object_set_new(m, "manifest_xxh3_128", json_string("00000000000000000000000000000000")); /* sealed below */
    size_t text_len = 0;
    text = bfs__json_text(m, JSON_INDENT(1) | JSON_PRESERVE_ORDER, &text_len);
    if (!text)
        BFS_FAIL(BFS_ENOMEM, "out of memory building the manifest");

    /* xxh128sums.txt: every file we wrote, as `xxh128sum -c` reads it */
    size_t cap = 256 * (size_t)(2 * p->nfiles + json_array_size(r->aux) + 1), k = 0;
    sums = malloc(cap);
    if (!sums)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (int f = 0; f < p->nfiles; f++) {
        k += (size_t)snprintf(sums + k, cap - k, "%s  %s\n", r->file_hex[f], p->files[f].name);
        if (r->zst && r->zst[f])
            k += (size_t)snprintf(sums + k, cap - k, "%s  %s\n", json_string_value(json_object_get(r->zst[f], "xxh3_128")),
                                  json_string_value(json_object_get(r->zst[f], "name")));
    }
    for (size_t i = 0; i < json_array_size(r->aux); i++) {
        json_t *e = json_array_get(r->aux, i);
        k += (size_t)snprintf(sums + k, cap - k, "%s  %s\n", json_string_value(json_object_get(e, "xxh3_128")),
                              json_string_value(json_object_get(e, "name")));
    }
    BFS_TRY(bfs__write_small(r, BFS_SUMS_NAME, sums, k, NULL));
    BFS_TRY(bfs__manifest_seal(text, text_len));
    BFS_TRY(bfs__write_small(r, BFS_MANIFEST_NAME, text, text_len, NULL));
    if (fsync(r->dirfd) != 0)
        BFS_FAIL(BFS_EIO, "%s: fsync of the directory failed: %s", r->outdir, strerror(errno));
cleanup:
    json_decref(m);
    free(text);
    free(sums);
    return rc;
}

static int bfs__write_hf_index(bfs_run *r)
{
    const bfs_plan *p = r->plan;
    json_t *wm = json_object();
    for (int f = 0; f < p->nfiles; f++)
        for (size_t pi = 0; pi < p->files[f].npieces; pi++)
            json_object_set_new(wm, p->t[p->files[f].pieces[pi].tensor].name, json_string(p->files[f].name));
    json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)p->total_bytes, "weight_map", wm);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    if (!text)
        return bfs__err(BFS_ENOMEM, "out of memory");
    const int rc = bfs__write_small(r, "model.safetensors.index.json", text, strlen(text), "index");
    free(text);
    return rc;
}

/* ---- the entry point ----------------------------------------------------------------------- */
static int bfs__validate_opts(const bfs_convert_opts *o)
{
    if (o->world_size < 1 || o->world_size > 1000000)
        return bfs__err(BFS_EUSAGE, "--world-size must be between 1 and 1000000 (got %d)", o->world_size);
    if (o->layout != BFS_LAYOUT_DCP && o->layout != BFS_LAYOUT_HF)
        return bfs__err(BFS_EUSAGE, "unknown layout %d", o->layout);
    if (o->layout == BFS_LAYOUT_HF && o->world_size != 1)
        return bfs__err(BFS_EUSAGE, "--layout hf writes one consolidated checkpoint: --world-size must be 1 (got %d)", o->world_size);
    if (o->mxfp4_layout != BFS_MXFP4_HF && o->mxfp4_layout != BFS_MXFP4_OPENAI)
        return bfs__err(BFS_EUSAGE, "unknown MXFP4 layout %d", o->mxfp4_layout);
    if (o->compress_level < -7 || o->compress_level > 22 ||
        (o->compress_mode != BFS_ZST_PLAIN && o->compress_mode != BFS_ZST_BYTEGROUP))
        return bfs__err(BFS_EUSAGE, "--compress: level %d or mode %d out of range (levels -7 to 22)", o->compress_level,
                        o->compress_mode);
    return 0;
}

static int bfs__make_backend(bfs_run *r, uint64_t unit_bytes)
{
    const char *dev = r->o->device ? r->o->device : "auto";
    if (!strcmp(dev, "cpu"))
        return bfs__backend_cpu_create(r->o->cpu_level, r->o->threads, &r->be);
    if (!strcmp(dev, "auto")) {
        if (bfs__cuda_device_count() > 0)
            return bfs__backend_cuda_create("cuda", r->o->gpu_mem ? r->o->gpu_mem : BFS_DEFAULT_GPU_MEM, unit_bytes, &r->be);
        return bfs__backend_cpu_create(r->o->cpu_level, r->o->threads, &r->be);
    }
    if (!strncmp(dev, "cuda", 4) && (dev[4] == '\0' || dev[4] == ':'))
        return bfs__backend_cuda_create(dev, r->o->gpu_mem ? r->o->gpu_mem : BFS_DEFAULT_GPU_MEM, unit_bytes, &r->be);
    return bfs__err(BFS_EUSAGE, "--device %s: expected auto, cpu, cuda or cuda:N[,M...]", dev);
}

int bfs_convert(const char *input, const char *outdir, const bfs_convert_opts *o, bfs_convert_result *res)
{
    int rc = 0;
    bfs_run R, *r = &R;
    bfs_convert_opts defaults;
    memset(r, 0, sizeof *r);
    r->dirfd = -1;
    r->w.fd = -1;
    bfs__err_clear();
    bfs__cancel_flag = 0;
    if (!o) {
        bfs_convert_opts_init(&defaults);
        o = &defaults;
    }
    r->o = o;
    r->outdir = outdir;
    if (res)
        memset(res, 0, sizeof *res);
    const double t0 = bfs__now();

    BFS_TRY(bfs__validate_opts(o));
    BFS_TRY(bfs__input_open(input, &r->in));
    BFS_TRY(bfs__check_paths(input, outdir, r->in));
    BFS_TRY(bfs__plan_tensors(r->in, o, &r->plan));
    BFS_TRY(bfs__plan_layout(r->plan, o));

    /* buffers: two units in flight */
    const uint64_t mem = o->mem ? o->mem : BFS_DEFAULT_MEM;
    r->unit_bytes = mem / 2;
    if (r->plan->max_row_bytes > r->unit_bytes)
        BFS_FAIL(BFS_ENOMEM, "--mem %llu is too small: the largest indivisible unit (one dim-0 row) is %llu bytes and two are in flight; use --mem %llu or more",
                 (unsigned long long)mem, (unsigned long long)r->plan->max_row_bytes,
                 (unsigned long long)(2 * r->plan->max_row_bytes));
    /* no bigger than the largest piece needs */
    uint64_t need = 64;
    for (int f = 0; f < r->plan->nfiles; f++)
        for (size_t i = 0; i < r->plan->files[f].npieces; i++)
            if (r->plan->files[f].pieces[i].nbytes > need)
                need = r->plan->files[f].pieces[i].nbytes;
    if (r->unit_bytes > need)
        r->unit_bytes = need;
    r->unit_bytes = (r->unit_bytes + 4095) & ~4095ull;

    const int nf = r->plan->nfiles;
    r->file_hex = calloc((size_t)nf, sizeof *r->file_hex);
    r->zst = calloc((size_t)nf, sizeof *r->zst);
    r->piece_hex = calloc((size_t)nf, sizeof *r->piece_hex);
    r->reused = calloc((size_t)nf, sizeof *r->reused);
    r->src_hex = calloc((size_t)r->in->nfiles, sizeof *r->src_hex);
    r->aux = json_array();
    if (!r->file_hex || !r->zst || !r->piece_hex || !r->reused || !r->src_hex || !r->aux)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (int f = 0; f < nf; f++) {
        r->piece_hex[f] = calloc(r->plan->files[f].npieces + 1, sizeof **r->piece_hex);
        if (!r->piece_hex[f])
            BFS_FAIL(BFS_ENOMEM, "out of memory");
    }
    for (int i = 0; i < 2; i++) {
        void *b = NULL;
        if (posix_memalign(&b, 4096, (size_t)r->unit_bytes) != 0)
            BFS_FAIL(BFS_ENOMEM, "cannot allocate a %llu-byte unit buffer (--mem %llu)", (unsigned long long)r->unit_bytes,
                     (unsigned long long)mem);
        r->buf[i] = b;
    }

    bfs__fingerprint(r);
    BFS_TRY(bfs__input_check(r->in, -1));
    if (!o->force && bfs__already_done(r)) {
        bfs__log(r, "%s: already holds this conversion (same input and options) and it verifies: nothing to do", outdir);
        /* a run killed between its manifest and removing its journal leaves the journal */
        char *jp = bfs__path_join(outdir, BFS_JOURNAL_NAME);
        if (jp)
            unlink(jp);
        free(jp);
        if (res) {
            res->files_reused = (uint64_t)nf;
            res->tensors = r->plan->nt;
            snprintf(res->backend, sizeof res->backend, "none (up to date)");
        }
        goto cleanup;
    }
    BFS_TRY(bfs__make_backend(r, r->unit_bytes));
    BFS_TRY(bfs__prepare_outdir(r));
    {
        /* a full disk fails here, before any work (each file is also preallocated) */
        uint64_t disk_need = 0;
        struct statvfs vfs;
        for (int f = 0; f < nf; f++)
            if (!r->reused[f])
                disk_need += r->plan->files[f].size;
        if (fstatvfs(r->dirfd, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < disk_need)
            BFS_FAIL(BFS_EIO, "%s: disk full: %llu bytes free, the rank files need %llu (No space left on device); free space or choose another OUTDIR",
                     outdir, (unsigned long long)vfs.f_bavail * vfs.f_frsize, (unsigned long long)disk_need);
    }
    bfs__log(r, "%s -> %s: %zu tensors, %d file(s), %.3f GB of output, backend %s, host buffers 2 x %llu bytes", input,
             outdir, r->plan->nt, nf, (double)r->plan->total_bytes / 1e9, r->be->name,
             (unsigned long long)r->unit_bytes);
    if (r->be->device_bytes)
        bfs__log(r, "GPU memory: %llu bytes allocated once from --gpu-mem %llu (the peak; it does not grow with the model)",
                 (unsigned long long)r->be->device_bytes,
                 (unsigned long long)(o->gpu_mem ? o->gpu_mem : BFS_DEFAULT_GPU_MEM));

    if (pthread_create(&r->src_tid, NULL, bfs__src_hash_main, r) != 0)
        BFS_FAIL(BFS_ENOMEM, "cannot start the source hashing thread");
    r->src_started = true;

    r->w.file_st = XXH3_createState();
    r->w.piece_st = XXH3_createState();
    pthread_mutex_init(&r->w.mu, NULL);
    pthread_cond_init(&r->w.cv, NULL);
    if (!r->w.file_st || !r->w.piece_st || pthread_create(&r->w.tid, NULL, bfs__writer_main, &r->w) != 0)
        BFS_FAIL(BFS_ENOMEM, "cannot start the writer thread");
    r->w.started = true;

    for (int f = 0; f < nf; f++) {
        if (r->reused[f]) {
            BFS_TRY(bfs__rehash_pieces(r, f));
            atomic_fetch_add(&r->w.total, r->plan->files[f].size - r->plan->files[f].data_start);
            bfs__log(r, "%s: reused from the interrupted run (hash verified)", r->plan->files[f].name);
            if (o->compress_level)
                BFS_TRY(bfs__zcopy_reused(r, f));
            continue;
        }
        BFS_TRY(bfs__write_file(r, f));
        if (res)
            res->files_written++;
    }

    pthread_join(r->src_tid, NULL);
    r->src_started = false;
    if (r->src_rc < 0)
        BFS_FAIL(r->src_rc, "%s", r->src_msg);
    BFS_TRY(bfs__input_check(r->in, -1)); /* the source hashes cover what was really there */
    if (bfs__cancel_flag)
        BFS_FAIL(BFS_EINTR, "interrupted");
    BFS_TRY(bfs__write_config(r));
    BFS_TRY(bfs__copy_aux(r));
    if (r->plan->layout == BFS_LAYOUT_HF)
        BFS_TRY(bfs__write_hf_index(r));
    BFS_TRY(bfs__write_manifest(r));
    unlinkat(r->dirfd, BFS_JOURNAL_NAME, 0);
    fsync(r->dirfd);

    if (res) {
        for (int f = 0; f < nf; f++)
            res->files_reused += r->reused[f];
        res->bytes_written = atomic_load(&r->w.total);
        res->tensors = r->plan->nt;
        res->host_buffer_bytes = 2 * r->unit_bytes;
        res->gpu_buffer_bytes = r->be->device_bytes;
        snprintf(res->backend, sizeof res->backend, "%s", r->be->name);
    }
cleanup:
    if (r->src_started) {
        if (rc < 0)
            bfs__cancel_flag = 1;
        pthread_join(r->src_tid, NULL);
    }
    if (r->w.started) {
        pthread_mutex_lock(&r->w.mu);
        r->w.stop = true;
        pthread_cond_broadcast(&r->w.cv);
        pthread_mutex_unlock(&r->w.mu);
        pthread_join(r->w.tid, NULL);
        pthread_mutex_destroy(&r->w.mu);
        pthread_cond_destroy(&r->w.cv);
    }
    XXH3_freeState(r->w.file_st);
    XXH3_freeState(r->w.piece_st);
    if (r->be)
        r->be->destroy(r->be);
    free(r->buf[0]);
    free(r->buf[1]);
    if (r->plan)
        for (int f = 0; f < r->plan->nfiles && r->piece_hex; f++)
            free(r->piece_hex[f]);
    free(r->piece_hex);
    free(r->file_hex);
    for (int f = 0; r->zst && r->plan && f < r->plan->nfiles; f++)
        json_decref(r->zst[f]);
    free(r->zst);
    free(r->reused);
    free(r->src_hex);
    json_decref(r->aux);
    if (r->dirfd >= 0)
        close(r->dirfd);
    bfs__plan_free(r->plan);
    bfs__input_free(r->in);
    if (res)
        res->seconds = bfs__now() - t0;
    return rc;
}
