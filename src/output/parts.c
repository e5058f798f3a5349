/*
 * A conversion in parts (see parts.h): rank lists, the launcher's environment, the names
 * of a part's files and the part manifests in a directory. bfs_merge, which turns the
 * parts' manifests into the manifest a single run writes, is src/commands/merge.c's.
 *
 * A part of ranks R converts only R's rank files (convert.c), reading only their rows of
 * the input (and every header), adds R's terms of each source file's hash (src/input/
 * srchash.c: the blocks of the rows R's kernels read), and writes bfshard.part-R.json: the
 * manifest with null hashes where another part knows them, its sums of terms, and its
 * ranks' share of tensors[] (bfs__part_share).
 */
#include "output/parts.h"
#include "base/bfs_io.h"
#include "output/durable.h"
#include "output/manifest.h"
#include "output/outdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- rank lists --------------------------------------------------------------------------- */
static int bfs__parse_uint(const char **s, long *v)
{
    char *end = NULL;
    if (**s < '0' || **s > '9')
        return -1;
    errno = 0;
    *v = strtol(*s, &end, 10);
    if (errno || *v > 100000000)
        return -1;
    *s = end;
    return 0;
}

int bfs__ranks_parse(const char *spec, int W, bool *mask, const char *what)
{
    const char *s = spec;
    if (!s || !*s)
        return bfs__err(BFS_EUSAGE, "%s: empty rank list (expected e.g. 0-7, 3 or 0-3,8-11)", what);
    for (;;) {
        long a = 0, b = 0;
        if (bfs__parse_uint(&s, &a) < 0)
            return bfs__err(BFS_EUSAGE, "%s %s: not a rank list (expected e.g. 0-7, 3 or 0-3,8-11)", what, spec);
        b = a;
        if (*s == '-') {
            s++;
            if (bfs__parse_uint(&s, &b) < 0 || b < a)
                return bfs__err(BFS_EUSAGE, "%s %s: not a rank list (a range is LOW-HIGH, LOW <= HIGH)", what, spec);
        }
        if (b >= W)
            return bfs__err(BFS_EUSAGE, "%s %s: rank %ld is outside 0..%d (--world-size %d)", what, spec, b, W - 1, W);
        for (long r = a; r <= b; r++) {
            if (mask[r])
                return bfs__err(BFS_EUSAGE, "%s %s: rank %ld is listed twice", what, spec, r);
            mask[r] = true;
        }
        if (*s == '\0')
            return 0;
        if (*s++ != ',')
            return bfs__err(BFS_EUSAGE, "%s %s: not a rank list (expected e.g. 0-7, 3 or 0-3,8-11)", what, spec);
    }
}

int bfs__ranks_format(const bool *mask, int W, char *buf, size_t cap)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int r = 0; r < W; r++) {
        if (!mask[r])
            continue;
        int e = r;
        while (e + 1 < W && mask[e + 1])
            e++;
        const int n = e > r ? snprintf(buf + k, cap - k, "%s%d-%d", k ? "," : "", r, e)
                            : snprintf(buf + k, cap - k, "%s%d", k ? "," : "", r);
        if (n < 0 || (size_t)n >= cap - k)
            return bfs__err(BFS_EUSAGE, "rank list too long to name a part (more than %zu characters)", cap - 1);
        k += (size_t)n;
        r = e;
    }
    return 0;
}

/* ---- the launcher's environment ------------------------------------------------------------- */
/* A non-negative decimal integer variable: 1 when set and valid, 0 when unset, < 0 (error set) when bad. */
static int bfs__env_int(const char *name, long *v)
{
    const char *s = getenv(name);
    if (!s)
        return 0;
    const char *p = s;
    if (bfs__parse_uint(&p, v) < 0 || *p != '\0')
        return bfs__err(BFS_EUSAGE, "--ranks auto: %s=%s is not a non-negative integer", name, s);
    return 1;
}

int bfs__ranks_local_procs(void)
{
    static const char *const vars[] = {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *s = getenv(vars[i]);
        char *end = NULL;
        const long v = s ? strtol(s, &end, 10) : 0; /* Slurm may say "2(x3)": its leading count */
        if (s && end != s && v >= 1 && v <= 100000)
            return (int)v;
    }
    return 1;
}

/* p of P from the first launcher whose variables are set; *how names them. */
static int bfs__env_process(const bfs_convert_opts *o, long *p, long *P, char *how, size_t howcap)
{
    /* torchrun first: under Slurm or MPI it is the innermost launcher, its RANK the process's own */
    static const char *const pairs[][2] = {
        {"RANK", "WORLD_SIZE"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
        {"PMI_RANK", "PMI_SIZE"},
        {"SLURM_PROCID", "SLURM_NTASKS"},
    };
    long idx = 0;
    const int k8s = bfs__env_int("JOB_COMPLETION_INDEX", &idx);
    if (k8s < 0)
        return k8s;
    if (o->parts > 0) {
        if (k8s == 0)
            return bfs__err(BFS_EUSAGE, "--parts %d is for a Kubernetes indexed Job: JOB_COMPLETION_INDEX is not set", o->parts);
        if (idx >= o->parts)
            return bfs__err(BFS_EUSAGE, "--ranks auto: JOB_COMPLETION_INDEX=%ld is outside 0..%d (--parts %d)", idx,
                            o->parts - 1, o->parts);
        *p = idx;
        *P = o->parts;
        snprintf(how, howcap, "JOB_COMPLETION_INDEX=%ld, --parts %d", idx, o->parts);
        return 0;
    }
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        const int a = bfs__env_int(pairs[i][0], p), b = bfs__env_int(pairs[i][1], P);
        if (a < 0 || b < 0)
            return a < 0 ? a : b;
        if (a == 0 && b == 0)
            continue;
        if (a == 0 || b == 0)
            return bfs__err(BFS_EUSAGE, "--ranks auto: %s is set but %s is not", a ? pairs[i][0] : pairs[i][1],
                            a ? pairs[i][1] : pairs[i][0]);
        if (*P < 1 || *p >= *P)
            return bfs__err(BFS_EUSAGE, "--ranks auto: %s=%ld is outside 0..%ld (%s=%ld)", pairs[i][0], *p, *P - 1,
                            pairs[i][1], *P);
        snprintf(how, howcap, "%s=%ld %s=%ld", pairs[i][0], *p, pairs[i][1], *P);
        return 0;
    }
    if (k8s)
        return bfs__err(BFS_EUSAGE, "--ranks auto: JOB_COMPLETION_INDEX=%ld is set (Kubernetes indexed Job): give the "
                        "Job's completions as --parts P", idx);
    return bfs__err(BFS_EUSAGE, "--ranks auto: no launcher environment found (RANK/WORLD_SIZE, OMPI_COMM_WORLD_RANK/SIZE, "
                    "PMI_RANK/PMI_SIZE, SLURM_PROCID/SLURM_NTASKS, or JOB_COMPLETION_INDEX with --parts)");
}

int bfs__ranks_resolve(const bfs_convert_opts *o, bool *mask, char *how, size_t howcap)
{
    const int W = o->world_size;
    how[0] = '\0';
    if (o->parts < 0 || o->parts > 1000000)
        return bfs__err(BFS_EUSAGE, "--parts must be between 1 and 1000000 (got %d)", o->parts);
    if (strcmp(o->ranks, "auto") != 0) {
        if (o->parts)
            return bfs__err(BFS_EUSAGE, "--parts is for --ranks auto (got --ranks %s)", o->ranks);
        return bfs__ranks_parse(o->ranks, W, mask, "--ranks");
    }
    long p = 0, P = 0;
    const int rc = bfs__env_process(o, &p, &P, how, howcap);
    if (rc < 0)
        return rc;
    if (P > W)
        return bfs__err(BFS_EUSAGE, "--ranks auto: %ld processes (%s) for --world-size %d: some would have no rank; "
                        "run at most %d processes, or convert for more ranks", P, how, W, W);
    /* process p of P: the contiguous block [p*ceil(W/P), (p+1)*ceil(W/P)) */
    const long chunk = (W + P - 1) / P;
    for (long r = p * chunk; r < (p + 1) * chunk && r < W; r++)
        mask[r] = true;
    return 0;
}

/* ---- names ------------------------------------------------------------------------------------ */
int bfs__part_names(const char *canon, char *manifest, char *journal, size_t cap)
{
    const size_t n = strlen(canon);
    if (n + strlen(BFS_PART_JOURNAL_PREFIX) + strlen(BFS_TMP_SUFFIX) + 2 > NAME_MAX || n + 32 > cap)
        return bfs__err(BFS_EUSAGE, "--ranks %s: the list is too long to name its part's files; give fewer ranges", canon);
    snprintf(manifest, cap, BFS_PART_PREFIX "%s" BFS_PART_SUFFIX, canon);
    snprintf(journal, cap, BFS_PART_JOURNAL_PREFIX "%s", canon);
    return 0;
}

bool bfs__part_name_list(const char *name, char *list, size_t cap)
{
    const size_t n = strlen(name), pm = strlen(BFS_PART_PREFIX), sm = strlen(BFS_PART_SUFFIX);
    const size_t pj = strlen(BFS_PART_JOURNAL_PREFIX);
    const char *a = NULL;
    size_t len = 0;
    if (n > pm + sm && !strncmp(name, BFS_PART_PREFIX, pm) && !strcmp(name + n - sm, BFS_PART_SUFFIX)) {
        a = name + pm;
        len = n - pm - sm;
    } else if (n > pj && !strncmp(name, BFS_PART_JOURNAL_PREFIX, pj)) {
        a = name + pj;
        len = n - pj;
    }
    if (!a || len >= cap || strspn(a, "0123456789-,") < len)
        return false;
    memcpy(list, a, len);
    list[len] = '\0';
    return true;
}

/* ---- the part manifests of a directory ------------------------------------------------------------ */
static int bfs__name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int bfs__part_manifests(DIR *d, char ***names, int *n)
{
    int cap = 0;
    char list[NAME_MAX + 1];
    struct dirent *e;
    *names = NULL;
    *n = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || !bfs__part_name_list(e->d_name, list, sizeof list))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            char **nn = realloc(*names, (size_t)cap * sizeof *nn);
            if (!nn)
                return bfs__err(BFS_ENOMEM, "out of memory");
            *names = nn;
        }
        if (!((*names)[*n] = bfs__strdup(e->d_name)))
            return bfs__err(BFS_ENOMEM, "out of memory");
        (*n)++;
    }
    if (*n > 1)
        qsort(*names, (size_t)*n, sizeof **names, bfs__name_cmp);
    return 0;
}

uint64_t bfs__part_share(uint64_t T, int W, int r, uint64_t *lo)
{
    /* T < 2^40 tensors and W <= 10^6 ranks: the products fit 64 bits */
    *lo = T * (uint64_t)r / (uint64_t)W;
    return T * (uint64_t)(r + 1) / (uint64_t)W - *lo;
}
