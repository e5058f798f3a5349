/*
 * The input set: one .safetensors file, or a directory (with or without
 * model.safetensors.index.json, read by the JSON scanner into a weight map). Every file
 * is mmapped read-only and its header validated before anything is planned or written.
 */
#include "input/input.h"
#include "base/json_scan.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define BFS_INDEX_NAME "model.safetensors.index.json"
#define BFS_MAX_JSON_FILE (256u << 20) /* the index: 200k tensor names fit */
#define BFS_MAX_CONFIG (64u << 20)     /* config.json, refused before any work when larger */

static int bfs__cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int bfs__cmp_raw(const void *a, const void *b)
{
    const bfs_raw *x = a, *y = b;
    return strcmp(x->st->name, y->st->name);
}

static bool bfs__ends_with(const char *s, const char *suffix)
{
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* FNV-1a of a name (the tensor table's and the index's file names') */
static uint32_t bfs__name_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* Both of this file's name tables: open addressing over pairs (1 + an index, the name's
 * hash), 0 an empty slot, cap a power of two at least twice the entries */
static void bfs__pair_put(uint32_t *tab, size_t cap, uint32_t idx, uint32_t h)
{
    size_t j = h & (cap - 1);
    while (tab[2 * j])
        j = (j + 1) & (cap - 1);
    tab[2 * j] = idx + 1;
    tab[2 * j + 1] = h;
}

/* raw[] by name in a hash table (the formats look up each weight's scales: 92k tensors'
 * binary searches over long common prefixes were most of a DeepSeek-V3 plan); past 2^30
 * tensors the lookups go by binary search */
static int bfs__input_hash(bfs_input *in)
{
    size_t cap = 64;
    while (cap < 2 * in->nraw + 2)
        cap *= 2;
    if (in->nraw >= ((size_t)1 << 30))
        return 0;
    if (!(in->by_hash = calloc(2 * cap, sizeof *in->by_hash)))
        return bfs__err(BFS_ENOMEM, "out of memory indexing %zu tensors", in->nraw);
    in->hcap = cap;
    for (size_t i = 0; i < in->nraw; i++)
        bfs__pair_put(in->by_hash, cap, (uint32_t)i, bfs__name_hash(in->raw[i].st->name));
    return 0;
}

const bfs_raw *bfs__input_find(const bfs_input *in, const char *name)
{
    if (in->by_hash) {
        const uint32_t h = bfs__name_hash(name), *e;
        for (size_t j = h & (in->hcap - 1); (e = &in->by_hash[2 * j])[0]; j = (j + 1) & (in->hcap - 1))
            if (e[1] == h && strcmp(in->raw[e[0] - 1].st->name, name) == 0)
                return &in->raw[e[0] - 1];
        return NULL;
    }
    size_t lo = 0, hi = in->nraw;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        const int c = strcmp(in->raw[mid].st->name, name);
        if (c == 0)
            return &in->raw[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* ---- an input truncated while mapped ------------------------------------------------
 * Reading a page of a MAP_SHARED mapping that lies past the current end of its file
 * raises SIGBUS on whichever thread touches it: the main thread, a CPU worker, a
 * thread copying to the GPU. The run must end with an error, not die. So one
 * process-wide handler, (re)installed at every open, looks the faulting address up in a
 * lock-free table of the input mappings; when it is one of ours it maps a zero page
 * over the vanished page (the faulting read then completes, with zeros) and marks
 * the mapping. bfs__input_check(), called before and after every unit, fails the
 * run with BFS_EINPUT naming the file, so the zeros never reach a finished file.
 * A fault at any other address goes to the handler that was there before us, or to
 * the default action (the crash it would have been). */
#define BFS_MAX_MAPS 4096

static struct {
    atomic_int used;          /* slot claimed */
    atomic_uintptr_t base;    /* 0 while not published */
    atomic_size_t len;
    atomic_int faulted;
} bfs__maps[BFS_MAX_MAPS];
static struct sigaction bfs__old_bus;
static uintptr_t bfs__page = 4096;
static pthread_mutex_t bfs__bus_mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int bfs__bus_depth; /* > 0 while this thread runs the chained handler */

static void bfs__on_sigbus(int sig, siginfo_t *si, void *ctx)
{
    const uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; si->si_code > 0 && i < BFS_MAX_MAPS; i++) { /* a fault, not a kill() */
        const uintptr_t b = atomic_load(&bfs__maps[i].base);
        if (b && a >= b && a - b < atomic_load(&bfs__maps[i].len)) {
            atomic_store(&bfs__maps[i].faulted, 1);
            const uintptr_t pg = a & ~(bfs__page - 1);
            if (mmap((void *)pg, (size_t)bfs__page, PROT_READ, MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS, -1, 0) !=
                MAP_FAILED)
                return;
            break;
        }
    }
    /* not ours: the handler before us, once (it may chain back to us), else the default */
    const struct sigaction old = bfs__old_bus;
    if (bfs__bus_depth++ == 0) {
        if ((old.sa_flags & SA_SIGINFO) && old.sa_sigaction) {
            old.sa_sigaction(sig, si, ctx);
            bfs__bus_depth--;
            return;
        }
        if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) {
            old.sa_handler(sig);
            bfs__bus_depth--;
            return;
        }
    }
    bfs__bus_depth = 0;
    signal(SIGBUS, SIG_DFL); /* returning re-executes the access: the default action */
}

/* (Re)install the handler when another one replaced it since (checked at every open). */
static void bfs__bus_install(void)
{
    struct sigaction sa, cur;
    pthread_mutex_lock(&bfs__bus_mu);
    const long pg = sysconf(_SC_PAGESIZE);
    if (pg > 0)
        bfs__page = (uintptr_t)pg;
    if (sigaction(SIGBUS, NULL, &cur) == 0 && !((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == bfs__on_sigbus)) {
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = bfs__on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        bfs__old_bus = cur;
        sigaction(SIGBUS, &sa, NULL);
    }
    pthread_mutex_unlock(&bfs__bus_mu);
}

static void bfs__map_register(const void *base, size_t len)
{
    for (int i = 0; i < BFS_MAX_MAPS; i++) {
        int want = 0;
        if (atomic_compare_exchange_strong(&bfs__maps[i].used, &want, 1)) {
            atomic_store(&bfs__maps[i].faulted, 0);
            atomic_store(&bfs__maps[i].len, len);
            atomic_store(&bfs__maps[i].base, (uintptr_t)base);
            return;
        }
    }
    /* table full: this mapping is not covered, a truncation of it is fatal as before */
}

static int bfs__map_slot(const void *base)
{
    for (int i = 0; i < BFS_MAX_MAPS; i++)
        if (atomic_load(&bfs__maps[i].base) == (uintptr_t)base)
            return i;
    return -1;
}

static void bfs__map_unregister(const void *base)
{
    const int i = bfs__map_slot(base);
    if (i >= 0) {
        atomic_store(&bfs__maps[i].base, 0);
        atomic_store(&bfs__maps[i].used, 0);
    }
}

/* BFS_EINPUT when input file `file` (all files when < 0) changed size or lost
 * mapped pages since it was opened. */
static void bfs__stat_id(const struct stat *st, uint64_t id[6])
{
    id[0] = (uint64_t)st->st_dev;
    id[1] = (uint64_t)st->st_ino;
    id[2] = (uint64_t)st->st_mtim.tv_sec;
    id[3] = (uint64_t)st->st_mtim.tv_nsec;
    id[4] = (uint64_t)st->st_ctim.tv_sec;
    id[5] = (uint64_t)st->st_ctim.tv_nsec;
}

void bfs__input_random(const bfs_input *in)
{
    for (int i = 0; i < in->nfiles; i++)
        if (in->files[i].map)
            (void)madvise((void *)in->files[i].map, (size_t)in->files[i].size, MADV_RANDOM);
}

int bfs__input_check(const bfs_input *in, int file)
{
    for (int i = file < 0 ? 0 : file; i < in->nfiles && (file < 0 || i == file); i++) {
        const bfs_infile *f = &in->files[i];
        struct stat st;
        const int slot = f->map ? bfs__map_slot(f->map) : -1;
        if (fstat(f->fd, &st) != 0)
            return bfs__errno(BFS_EIO, errno, "%s: cannot stat", f->path);
        if ((uint64_t)st.st_size != f->size || (slot >= 0 && atomic_load(&bfs__maps[slot].faulted)))
            return bfs__err(BFS_EINPUT, "%s: changed while being read (now %llu bytes, was %llu; truncated or rewritten by another process?)",
                            f->path, (unsigned long long)st.st_size, (unsigned long long)f->size);
        uint64_t id[6];
        bfs__stat_id(&st, id);
        if (memcmp(id, f->id, sizeof id) != 0)
            return bfs__err(BFS_EINPUT, "%s: changed while being read (same size, but its %s changed: rewritten in place or replaced by another process?)",
                            f->path, id[0] != f->id[0] || id[1] != f->id[1] ? "inode" : "modification time");
    }
    return 0;
}

static int bfs__open_one(bfs_infile *f, const char *path)
{
    int rc = 0;
    struct stat st;
    f->fd = -1;
    f->path = bfs__strdup(path);
    if (!f->path)
        return bfs__err(BFS_ENOMEM, "out of memory");
    const char *slash = strrchr(path, '/');
    f->name = bfs__strdup(slash ? slash + 1 : path);
    if (!f->name)
        return bfs__err(BFS_ENOMEM, "out of memory");
    f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block us: it is rejected below */
    if (f->fd < 0)
        return bfs__errno(errno == ENOENT || errno == ELOOP || errno == ENOTDIR ? BFS_EINPUT : BFS_EIO, errno,
                          "%s: cannot open", path);
    if (fstat(f->fd, &st) != 0)
        return bfs__errno(BFS_EIO, errno, "%s: cannot stat", path);
    if (!S_ISREG(st.st_mode))
        return bfs__err(BFS_EINPUT, "%s: not a regular file", path);
    f->size = (uint64_t)st.st_size;
    bfs__stat_id(&st, f->id);
    if (f->size < 8)
        return bfs__err(BFS_EINPUT, "%s: %llu bytes, too short for a safetensors file (needs the 8-byte header length at offset 0)",
                        path, (unsigned long long)f->size);
    void *m = mmap(NULL, (size_t)f->size, PROT_READ, MAP_SHARED, f->fd, 0);
    if (m == MAP_FAILED)
        return bfs__errno(errno == ENOMEM ? BFS_ENOMEM : BFS_EIO, errno, "%s: mmap of %llu bytes failed", path,
                          (unsigned long long)f->size);
    f->map = m;
    /* the header read alone: under MADV_SEQUENTIAL its first fault would read ahead into the
     * data (8 MiB with read_ahead_kb 8192): a part of 163 files read a GB it does not need */
    (void)madvise(m, (size_t)f->size, MADV_RANDOM);
    uint8_t len8[8];
    if (pread(f->fd, len8, 8, 0) == 8) {
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--)
            hl = hl << 8 | len8[i];
        if (hl < f->size - 8)
            (void)madvise(m, (size_t)(8 + hl), MADV_WILLNEED);
    }
    bfs__map_register(m, (size_t)f->size); /* a fault past a truncated end: an error (SIGBUS guard) */
    BFS_TRY(bfs__st_parse(f->map, f->size, path, &f->h));
    /* a whole run reads every byte once, front to back, each window's pages released after
     * it: sequential, so readahead runs ahead of the kernels and the kernel does not mark a
     * page accessed when the release unmaps it (vma_has_recency), which moved every page to
     * the active list under the LRU lock. A part switches to MADV_RANDOM and reads ahead by
     * hand (bfs__input_random). Advice only: a kernel without it reads the same bytes. */
    (void)madvise(m, (size_t)f->size, MADV_SEQUENTIAL);
cleanup:
    return rc;
}

/* ---- the input files, opened and their headers parsed two at a time -----------------------
 * A checkpoint of many files (DeepSeek-V3: 163, 92k tensors) spends most of a part's setup
 * parsing headers: a second thread takes every other file. Each file's outcome is kept and
 * the first failing one in file order is reported, the message sequential opening gives. */
typedef struct {
    bfs_input *in;
    char **names;
    int n, from, step;
    int *rc;            /* per file */
    char (*msg)[1024];  /* per file: its error message */
} bfs_open_job;

static void *bfs__open_some(void *arg)
{
    bfs_open_job *j = arg;
    for (int i = j->from; i < j->n; i += j->step) {
        char *fp = bfs__path_join(j->in->root, j->names[i]);
        j->rc[i] = fp ? bfs__open_one(&j->in->files[i], fp) : bfs__err(BFS_ENOMEM, "out of memory");
        if (j->rc[i] < 0)
            snprintf(j->msg[i], sizeof j->msg[i], "%s", bfs_last_error());
        free(fp);
    }
    return NULL;
}

static int bfs__open_all(bfs_input *in, char **names, int n)
{
    int rc = 0;
    for (int i = 0; i < n; i++)
        in->files[i].fd = -1; /* freed as opened or not (bfs__input_free) */
    in->nfiles = n;
    bfs_open_job j = {in, names, n, 0, 1, calloc((size_t)n, sizeof(int)), calloc((size_t)n, sizeof *j.msg)};
    if (!j.rc || !j.msg)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    pthread_t th;
    bfs_open_job other = j;
    const bool two = n >= 8 && sysconf(_SC_NPROCESSORS_ONLN) > 1;
    if (two) {
        other.from = 1;
        other.step = j.step = 2;
    }
    const bool started = two && pthread_create(&th, NULL, bfs__open_some, &other) == 0;
    if (two && !started)
        j.step = 1; /* no thread: this one opens them all */
    bfs__open_some(&j);
    if (started)
        pthread_join(th, NULL);
    for (int i = 0; i < n; i++)
        if (j.rc[i] < 0)
            BFS_FAIL(j.rc[i], "%s", j.msg[i]);
cleanup:
    free(j.rc);
    free(j.msg);
    return rc;
}

/* ---- model.safetensors.index.json, streamed ---------------------------------------------
 * The JSON scanner (base/json_scan.h) reads it in one pass, as jansson's json_loads did
 * (up to its first NUL byte): weight_map's entries are copied out, nothing else is kept.
 * A broken rule is kept while the rest is scanned, so that a JSON error anywhere is
 * reported first, as when the whole tree was parsed before anything was looked at. */
typedef struct {
    char *tensor, *file;
} bfs_wm_entry;

typedef struct {
    bfs_wm_entry *e;        /* in the file's order */
    size_t n, cap;
    bfs_wm_entry **by_name; /* sorted by tensor name */
    char **files;           /* the distinct file names, each entry's .file one of them */
    size_t nfiles, cfiles;
    uint32_t *fset;         /* files[] by name: pairs, as the tensor table's (bfs__pair_put) */
    size_t fcap;
} bfs_wmap;

static void bfs__wm_free(bfs_wmap *wm)
{
    for (size_t i = 0; i < wm->n; i++)
        free(wm->e[i].tensor);
    for (size_t i = 0; i < wm->nfiles; i++)
        free(wm->files[i]);
    free(wm->files);
    free(wm->fset);
    free(wm->e);
    free(wm->by_name);
    memset(wm, 0, sizeof *wm);
}

/* fn as one of wm's distinct file names (an index names a few hundred files for up to
 * millions of tensors: one copy each, not one per entry); NULL when out of memory */
static const char *bfs__wm_file(bfs_wmap *wm, const char *fn)
{
    if ((wm->nfiles + 1) * 2 > wm->fcap) {
        const size_t nc = wm->fcap ? wm->fcap * 2 : 64;
        uint32_t *ns = calloc(2 * nc, sizeof *ns);
        if (!ns)
            return NULL;
        for (size_t i = 0; i < wm->nfiles; i++)
            bfs__pair_put(ns, nc, (uint32_t)i, bfs__name_hash(wm->files[i]));
        free(wm->fset);
        wm->fset = ns;
        wm->fcap = nc;
    }
    const uint32_t h = bfs__name_hash(fn), *e;
    for (size_t j = h & (wm->fcap - 1); (e = &wm->fset[2 * j])[0]; j = (j + 1) & (wm->fcap - 1))
        if (e[1] == h && strcmp(wm->files[e[0] - 1], fn) == 0)
            return wm->files[e[0] - 1];
    char *c = bfs__strdup(fn);
    if (!c || bfs__grow((void **)&wm->files, &wm->cfiles, wm->nfiles + 1, sizeof *wm->files) != 0) {
        free(c);
        return NULL;
    }
    wm->files[wm->nfiles] = c;
    bfs__pair_put(wm->fset, wm->fcap, (uint32_t)wm->nfiles++, h);
    return c;
}

static int bfs__cmp_wm(const void *a, const void *b)
{
    return strcmp((*(bfs_wm_entry *const *)a)->tensor, (*(bfs_wm_entry *const *)b)->tensor);
}

static const bfs_wm_entry *bfs__wm_find(const bfs_wmap *wm, const char *tensor)
{
    const bfs_wm_entry key = {.tensor = (char *)tensor}, *kp = &key;
    bfs_wm_entry **hit = bsearch(&kp, wm->by_name, wm->n, sizeof *wm->by_name, bfs__cmp_wm);
    return hit ? *hit : NULL;
}

/* weight_map's value into wm: 0; 1 when it breaks a rule (the message in msg); the scanner's error */
static int bfs__index_wm(bfs_jscan *js, bfs_wmap *wm, const char *dir, const char *index_path, char *msg, size_t cap)
{
    bfs_jtok tok;
    int rc = bfs__js_next(js, &tok);
    if (rc == 0 && tok != BFS_JT_OBJ)
        return snprintf(msg, cap, "%s: no \"weight_map\" object", index_path), 1;
    while (rc == 0 && (rc = bfs__js_next(js, &tok)) == 0 && tok != BFS_JT_OBJ_END) {
        if (bfs__grow((void **)&wm->e, &wm->cap, wm->n + 1, sizeof *wm->e) != 0)
            return BFS_ENOMEM;
        const char *k = bfs__js_str(js, NULL);
        bfs_wm_entry *e = &wm->e[wm->n];
        e->file = NULL;
        if (!k || !(e->tensor = bfs__strdup(k)))
            return BFS_ENOMEM;
        wm->n++;
        if ((rc = bfs__js_next(js, &tok)) != 0)
            break;
        if (tok != BFS_JT_STR)
            return snprintf(msg, cap, "%s: weight_map entry \"%s\" is not a file name string", index_path, e->tensor), 1;
        const char *fn = bfs__js_str(js, NULL);
        if (!fn)
            return BFS_ENOMEM;
        if (!*fn || strchr(fn, '/') || strcmp(fn, ".") == 0 || strcmp(fn, "..") == 0)
            return snprintf(msg, cap, "%s: weight_map entry \"%s\" names \"%s\", not a plain file name in %s", index_path,
                            e->tensor, fn, dir),
                   1;
        if (!(e->file = (char *)bfs__wm_file(wm, fn)))
            return BFS_ENOMEM;
    }
    return rc;
}

/* The index: wm filled (and sorted by tensor for lookups), the names of the files it
 * lists into *names_out: sorted, unique. */
static int bfs__read_index(const char *dir, const char *index_path, char ***names_out, int *n_out, bfs_wmap *wm)
{
    int rc = 0, r = 0, broken = 0;
    char *text = NULL, msg[1024];
    char **names = NULL;
    size_t n = 0;
    bool seen = false;
    bfs_jscan js;
    bfs_jtok tok = BFS_JT_END;
    bfs__js_init(&js, "", 0);

    BFS_TRY(bfs__read_small_file(index_path, BFS_MAX_JSON_FILE, &text, NULL));
    BFS_TRY(bfs__js_init(&js, text, strlen(text)));
    r = bfs__js_next(&js, &tok);
    const bool top_obj = r == 0 && tok == BFS_JT_OBJ;
    while (r == 0 && !broken && (r = bfs__js_next(&js, &tok)) == 0 && js.depth > 0) {
        const char *k = top_obj ? bfs__js_str(&js, NULL) : "";
        if (!k) {
            r = BFS_ENOMEM;
        } else if (top_obj && strcmp(k, "weight_map") == 0) {
            seen = true;
            r = bfs__index_wm(&js, wm, dir, index_path, msg, sizeof msg);
            broken = r == 1;
            r = broken ? 0 : r;
        } else if (top_obj && (r = bfs__js_next(&js, &tok)) == 0) {
            r = bfs__js_skip(&js, tok);
        } else if (!top_obj) {
            r = bfs__js_skip(&js, tok);
        }
    }
    while (r == 0 && tok != BFS_JT_END) /* the rest, for a JSON error in it */
        r = bfs__js_next(&js, &tok);
    if (r == BFS_ENOMEM)
        BFS_FAIL(BFS_ENOMEM, "%s: out of memory reading it (%zu entries so far)", index_path, wm->n);
    if (r) {
        int line = 1, col = 1;
        for (size_t i = 0; i < js.why_at; i++, col++)
            if (text[i] == '\n')
                line++, col = 0;
        BFS_FAIL(BFS_EINPUT, "%s: not valid JSON at line %d column %d: %s", index_path, line, col, js.why);
    }
    if (broken)
        BFS_FAIL(BFS_EINPUT, "%s", msg);
    if (!seen)
        BFS_FAIL(BFS_EINPUT, "%s: no \"weight_map\" object", index_path);
    if (wm->n == 0)
        BFS_FAIL(BFS_EINPUT, "%s: weight_map is empty", index_path);
    names = calloc(wm->nfiles + 1, sizeof *names);
    wm->by_name = malloc(wm->n * sizeof *wm->by_name);
    if (!names || !wm->by_name)
        BFS_FAIL(BFS_ENOMEM, "%s: out of memory", index_path);
    bool sorted = true;
    for (size_t i = 0; i < wm->n; i++) {
        wm->by_name[i] = &wm->e[i];
        sorted = sorted && (i == 0 || strcmp(wm->e[i - 1].tensor, wm->e[i].tensor) < 0);
    }
    if (!sorted) /* transformers writes the index with sort_keys: usually it is */
        qsort(wm->by_name, wm->n, sizeof *wm->by_name, bfs__cmp_wm);
    /* the distinct names (owned by wm, copied below), sorted */
    n = wm->nfiles;
    memcpy(names, wm->files, n * sizeof *names);
    qsort(names, n, sizeof *names, bfs__cmp_str);
    for (size_t i = 0; i < n; i++)
        if (!(names[i] = bfs__strdup(names[i]))) {
            for (size_t j = 0; j < i; j++)
                free(names[j]);
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        }
    *names_out = names;
    *n_out = (int)n;
    names = NULL;
cleanup:
    free(names);
    bfs__js_free(&js);
    free(text);
    return rc;
}

static int bfs__list_dir(const char *dir, char ***names_out, int *n_out)
{
    int rc = 0;
    DIR *d = opendir(dir);
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    if (!d)
        return bfs__errno(BFS_EINPUT, errno, "%s: cannot open directory", dir);
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || !bfs__ends_with(e->d_name, ".safetensors"))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = realloc(names, cap * sizeof *names);
            if (!nn)
                BFS_FAIL(BFS_ENOMEM, "out of memory");
            names = nn;
        }
        if (!(names[n] = bfs__strdup(e->d_name)))
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        n++;
    }
    if (n == 0)
        BFS_FAIL(BFS_EINPUT, "%s: no .safetensors files in this directory", dir);
    qsort(names, n, sizeof *names, bfs__cmp_str);
    *names_out = names;
    *n_out = (int)n;
    names = NULL;
cleanup:
    if (names) {
        for (size_t i = 0; i < n; i++)
            free(names[i]);
        free(names);
    }
    closedir(d);
    return rc;
}

void bfs__input_free(bfs_input *in)
{
    if (!in)
        return;
    for (int i = 0; i < in->nfiles; i++) {
        bfs_infile *f = &in->files[i];
        if (f->map) {
            bfs__map_unregister(f->map);
            munmap((void *)f->map, (size_t)f->size);
        }
        if (f->fd >= 0)
            close(f->fd);
        bfs__st_header_free(&f->h);
        free(f->path);
        free(f->name);
    }
    free(in->files);
    free(in->raw);
    free(in->by_hash);
    free(in->root);
    free(in->config_json);
    free(in);
}

int bfs__input_open(const char *path, bfs_input **out)
{
    int rc = 0;
    bfs_input *in = NULL;
    char **names = NULL;
    int nnames = 0;
    bfs_wmap wm = {0};
    char *index_path = NULL, *cfg_path = NULL, *tmp = NULL;
    struct stat st;

    *out = NULL;
    bfs__bus_install();
    if (stat(path, &st) != 0)
        return bfs__errno(BFS_EINPUT, errno, "%s: cannot access input", path);
    in = calloc(1, sizeof *in);
    if (!in)
        return bfs__err(BFS_ENOMEM, "out of memory");

    if (S_ISDIR(st.st_mode)) {
        in->root = bfs__strdup(path);
        index_path = bfs__path_join(path, BFS_INDEX_NAME);
        if (!in->root || !index_path)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        if (access(index_path, F_OK) == 0 || errno == ELOOP)
            BFS_TRY(bfs__read_index(path, index_path, &names, &nnames, &wm));
        else
            BFS_TRY(bfs__list_dir(path, &names, &nnames));
    } else if (S_ISREG(st.st_mode)) {
        tmp = bfs__strdup(path);
        if (!tmp)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        in->root = bfs__strdup(dirname(tmp));
        in->one_file = true;
        free(tmp);
        tmp = bfs__strdup(path);
        names = calloc(1, sizeof *names);
        if (!in->root || !tmp || !names)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        names[0] = bfs__strdup(basename(tmp));
        nnames = 1;
        if (!names[0])
            BFS_FAIL(BFS_ENOMEM, "out of memory");
    } else {
        BFS_FAIL(BFS_EINPUT, "%s: not a file or a directory", path);
    }

    in->files = calloc((size_t)nnames, sizeof *in->files);
    if (!in->files)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__open_all(in, names, nnames));
    size_t total = 0;
    for (int i = 0; i < nnames; i++)
        total += in->files[i].h.n;

    in->raw = calloc(total ? total : 1, sizeof *in->raw);
    if (!in->raw)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    for (int i = 0; i < in->nfiles; i++) {
        const bfs_infile *f = &in->files[i];
        for (size_t k = 0; k < f->h.n; k++) {
            bfs_raw *r = &in->raw[in->nraw++];
            r->st = &f->h.t[k];
            r->file = i;
            r->file_offset = f->h.data_start + r->st->begin;
            r->nbytes = r->st->end - r->st->begin;
            r->data = f->map + r->file_offset;
        }
    }
    qsort(in->raw, in->nraw, sizeof *in->raw, bfs__cmp_raw);
    for (size_t i = 1; i < in->nraw; i++)
        if (strcmp(in->raw[i - 1].st->name, in->raw[i].st->name) == 0)
            BFS_FAIL(BFS_EINPUT, "tensor \"%s\" appears in both %s and %s", in->raw[i].st->name,
                     in->files[in->raw[i - 1].file].path, in->files[in->raw[i].file].path);
    BFS_TRY(bfs__input_hash(in));

    /* the index against the headers: both sorted by name, one pass when they agree; when
     * not, the checks below find the first disagreement and say it */
    bool agree = wm.n == in->nraw;
    for (size_t i = 0; agree && i < wm.n; i++)
        agree = strcmp(wm.by_name[i]->tensor, in->raw[i].st->name) == 0 &&
                strcmp(wm.by_name[i]->file, in->files[in->raw[i].file].name) == 0;
    for (size_t i = 0; i < wm.n && !agree; i++) {
        const char *key = wm.e[i].tensor, *file = wm.e[i].file;
        const bfs_raw *r = bfs__input_find(in, key);
        if (!r)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" is mapped to %s but that file has no such tensor", index_path, key, file);
        if (strcmp(in->files[r->file].name, file) != 0)
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" is mapped to %s but is in %s", index_path, key, file,
                     in->files[r->file].name);
    }
    for (size_t i = 0; i < in->nraw && wm.n && !agree; i++)
        if (!bfs__wm_find(&wm, in->raw[i].st->name))
            BFS_FAIL(BFS_EINPUT, "%s: tensor \"%s\" (at offset %llu) is not listed in %s", in->files[in->raw[i].file].path,
                     in->raw[i].st->name, (unsigned long long)in->raw[i].file_offset, index_path);

    cfg_path = bfs__path_join(in->root, "config.json");
    if (!cfg_path)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    if (access(cfg_path, F_OK) == 0) {
        /* validated now: it is rewritten after the weights, when failing would waste the run */
        size_t clen = 0;
        json_error_t jerr;
        BFS_TRY(bfs__read_small_file(cfg_path, BFS_MAX_CONFIG, &in->config_json, &clen));
        json_t *cfg = json_loadb(in->config_json, clen, JSON_REJECT_DUPLICATES, &jerr);
        const bool obj = json_is_object(cfg);
        json_decref(cfg);
        if (!cfg)
            BFS_FAIL(BFS_EINPUT, "%s: not valid JSON at line %d column %d: %s", cfg_path, jerr.line, jerr.column, jerr.text);
        if (!obj)
            BFS_FAIL(BFS_EINPUT, "%s: not a JSON object", cfg_path);
    }
    BFS_TRY(bfs__input_check(in, -1));

    *out = in;
    in = NULL;
cleanup:
    if (names) {
        for (int i = 0; i < nnames; i++)
            free(names[i]);
        free(names);
    }
    bfs__wm_free(&wm);
    free(index_path);
    free(cfg_path);
    free(tmp);
    bfs__input_free(in);
    return rc;
}
