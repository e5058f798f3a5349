/*
 * The side files of the input folder (see input.h): every top-level entry that is not a
 * weights file bfshard reads, sorted by name, each either to be copied beside the weights
 * unchanged (the license and notice files, the model card, every tokenizer file, remote
 * code, small configs) or skipped with the reason why. Nothing is ever read through a
 * link, except in a Hugging Face cache snapshot, whose files are links into the repo's
 * own blobs/: there a link is read when it resolves to a regular file directly in that
 * blobs/ folder, opened in it with O_NOFOLLOW. Every file is opened with O_NOFOLLOW and
 * O_NONBLOCK, fstat'ed and must be a regular file of at most BFS_MAX_SIDE bytes; when it
 * is read (bfs__side_read) it must still be the file that was listed.
 */
#include "input/input.h"
#include "base/bfs_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* the reasons a file is skipped (the manifest's skipped[].why) */
#define BFS_WHY_NAME "a name with control characters, a backslash or bytes that are not UTF-8"
#define BFS_WHY_HIDDEN "a hidden name"
#define BFS_WHY_DIR "a folder: only the folder's top-level files are copied"
#define BFS_WHY_LINK "a symbolic link: never followed"
#define BFS_WHY_CACHELINK "a symbolic link that does not resolve to a file of the cache's blobs/: never followed"
#define BFS_WHY_SPECIAL "not a regular file (a FIFO, a device or a socket)"
#define BFS_WHY_BIG "larger than the 64 MiB limit for side files"
#define BFS_WHY_OURS "a name bfshard writes"
#define BFS_WHY_QCFG "the input's quantization config: the output is not quantized"
#define BFS_WHY_WEIGHTS "weights in a format bfshard does not write, or not read by this conversion"
#define BFS_WHY_ARCHIVE "an archive"
#define BFS_WHY_INDEX "an index of weights files bfshard does not write"
#define BFS_WHY_NOTMODEL "the input is one weights file: of its folder only a model's own files are copied (tokenizer, generation config, chat template, license, model card, remote code)"

static bool bfs__ends_ci(const char *s, const char *sfx)
{
    const size_t n = strlen(s), k = strlen(sfx);
    return n >= k && !strcasecmp(s + n - k, sfx);
}

/* bytes a name in a manifest, a sums line and a log line can carry as they are */
static bool bfs__name_ok(const char *name)
{
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (*p < 0x20 || *p == 0x7f || *p == '\\')
            return false;
    json_t *j = json_string(name); /* NULL: not UTF-8 */
    json_decref(j);
    return j != NULL;
}

/* why a regular file (by its name) is not copied, or NULL */
/* Whether name is one of a model repository's own files: what is copied from the folder of an
 * input given as one weights file (a folder such as ~/Downloads holds other people's files too) */
static bool bfs__model_file(const char *name)
{
    static const char *const prefix[] = {"tokenizer", "tokenization_", "special_tokens_map", "added_tokens",
                                         "vocab.", "merges.txt", "generation_config", "chat_template",
                                         "preprocessor_config", "processor_config", "spiece.model", "tiktoken.",
                                         "configuration_", "modeling_", "LICENSE", "LICENCE", "NOTICE", "README",
                                         "USE_POLICY", "COPYING"};
    for (size_t i = 0; i < sizeof prefix / sizeof *prefix; i++)
        if (strncasecmp(name, prefix[i], strlen(prefix[i])) == 0)
            return true;
    return bfs__ends_ci(name, ".tiktoken");
}

static const char *bfs__why_name(const char *name)
{
    static const char *const weights[] = {".safetensors", ".bin", ".pth", ".pt", ".ckpt", ".gguf", ".ggml", ".h5",
                                          ".msgpack", ".onnx", ".onnx_data", ".tflite", ".ot", ".pb", ".npz", ".npy",
                                          ".pkl", ".pickle", ".mlmodel", ".nemo", ".zst", ".bfz", ".slices", ".arrow",
                                          ".parquet", ".distcp"};
    static const char *const archives[] = {".tar", ".tgz", ".gz", ".xz", ".bz2", ".zip", ".7z", ".zstd", ".lz4", ".rar"};
    static const char *const qcfg[] = {"quantize_config.json", "quant_config.json", "hf_quant_config.json"};
    if (!strcmp(name, BFS_MANIFEST_NAME) || !strcmp(name, BFS_SUMS_NAME) || !strcmp(name, BFS_SHA256SUMS_NAME) ||
        !strncmp(name, "bfshard.", 8))
        return BFS_WHY_OURS;
    for (size_t i = 0; i < sizeof qcfg / sizeof *qcfg; i++)
        if (!strcmp(name, qcfg[i]))
            return BFS_WHY_QCFG;
    if (bfs__ends_ci(name, ".index.json")) /* model.safetensors.index.json, pytorch_model.bin.index.json */
        return BFS_WHY_INDEX;
    for (size_t i = 0; i < sizeof weights / sizeof *weights; i++)
        if (bfs__ends_ci(name, weights[i]))
            return BFS_WHY_WEIGHTS;
    for (size_t i = 0; i < sizeof archives / sizeof *archives; i++)
        if (bfs__ends_ci(name, archives[i]))
            return BFS_WHY_ARCHIVE;
    return NULL;
}

/* The cache's blobs/ when root is a Hugging Face cache snapshot (.../snapshots/COMMIT with a
 * blobs/ beside snapshots/): its fd (-1 when not) and its real path into blobs (cap PATH_MAX). */
static int bfs__cache_blobs(const char *root, char *blobs)
{
    char real[PATH_MAX];
    if (!realpath(root, real))
        return -1;
    char *slash = strrchr(real, '/');
    if (!slash || slash == real)
        return -1;
    *slash = '\0'; /* .../snapshots */
    char *up = strrchr(real, '/');
    if (!up || strcmp(up + 1, "snapshots") != 0)
        return -1;
    *up = '\0';
    if (strlen(real) + sizeof "/blobs" > PATH_MAX)
        return -1;
    snprintf(blobs, PATH_MAX, "%s/blobs", real);
    return open(blobs, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

/* a link of a cache snapshot: the name of its target in blobs/ (into base), or false */
static bool bfs__cache_target(int dfd, const char *root, const char *name, const char *blobs, char *base, size_t cap)
{
    char *p = bfs__path_join(root, name), real[PATH_MAX];
    const bool ok = p && realpath(p, real);
    free(p);
    (void)dfd;
    const size_t n = strlen(blobs);
    if (!ok || strncmp(real, blobs, n) != 0 || real[n] != '/' || strchr(real + n + 1, '/') || !real[n + 1] ||
        strlen(real + n + 1) >= cap)
        return false;
    snprintf(base, cap, "%s", real + n + 1);
    return true;
}

/* fd of a side file (opened with O_NOFOLLOW in its folder, or a cache link's in blobs/) */
static int bfs__side_open(int dfd, int bfd, const char *name, const char *blob)
{
    return blob ? openat(bfd, blob, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
                : openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
}

static void bfs__side_id(const struct stat *st, uint64_t id[5])
{
    id[0] = (uint64_t)st->st_dev;
    id[1] = (uint64_t)st->st_ino;
    id[2] = (uint64_t)st->st_size;
    id[3] = (uint64_t)st->st_mtim.tv_sec;
    id[4] = (uint64_t)st->st_mtim.tv_nsec;
}

static bool bfs__is_input(const bfs_input *in, const char *name)
{
    if (!strcmp(name, "config.json") || !strcmp(name, "model.safetensors.index.json"))
        return true; /* read by bfshard: config.json rewritten, the index replaced */
    for (int i = 0; i < in->nfiles; i++)
        if (!strcmp(in->files[i].name, name))
            return true;
    return false;
}

/* classify one entry of the folder into s (s->name set) */
static void bfs__side_classify(int dfd, int bfd, const bfs_input *in, const char *blobs, bfs_side *s)
{
    struct stat st;
    const char *name = s->name;
    char blob[NAME_MAX + 1];
    if (!bfs__name_ok(name)) {
        s->why = BFS_WHY_NAME;
        return;
    }
    if (name[0] == '.') {
        s->why = BFS_WHY_HIDDEN;
        return;
    }
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        s->why = "vanished while listed";
        return;
    }
    if (S_ISDIR(st.st_mode)) {
        s->why = BFS_WHY_DIR;
        return;
    }
    if ((s->why = bfs__why_name(name)) != NULL)
        return;
    if (in->one_file && !bfs__model_file(name)) {
        s->why = BFS_WHY_NOTMODEL;
        return;
    }
    if (S_ISLNK(st.st_mode)) {
        if (bfd < 0) {
            s->why = BFS_WHY_LINK;
            return;
        }
        if (!bfs__cache_target(dfd, in->root, name, blobs, blob, sizeof blob)) {
            s->why = BFS_WHY_CACHELINK;
            return;
        }
        s->blob = bfs__strdup(blob);
        if (!s->blob) {
            s->why = "out of memory";
            return;
        }
    } else if (!S_ISREG(st.st_mode)) {
        s->why = BFS_WHY_SPECIAL;
        return;
    }
    const int fd = bfs__side_open(dfd, bfd, name, s->blob);
    if (fd < 0) {
        s->why = errno == ELOOP ? BFS_WHY_LINK : "cannot be opened";
        return;
    }
    const bool got = fstat(fd, &st) == 0;
    close(fd);
    if (!got || !S_ISREG(st.st_mode)) {
        s->why = got ? BFS_WHY_SPECIAL : "cannot be opened";
        return;
    }
    bfs__side_id(&st, s->id);
    s->size = (uint64_t)st.st_size;
    if (s->size > BFS_MAX_SIDE)
        s->why = BFS_WHY_BIG;
}

static int bfs__cmp_side(const void *a, const void *b)
{
    return strcmp(((const bfs_side *)a)->name, ((const bfs_side *)b)->name);
}

int bfs__sides_list(const bfs_input *in, bfs_sides *out)
{
    int rc = 0;
    DIR *d = NULL;
    size_t cap = 0;
    memset(out, 0, sizeof *out);
    out->dfd = out->bfd = -1;
    out->dfd = open(in->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (out->dfd < 0)
        return bfs__errno(BFS_EINPUT, errno, "%s: cannot open directory", in->root);
    out->bfd = bfs__cache_blobs(in->root, out->blobs);
    const int lfd = openat(out->dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* its own read position */
    if (lfd < 0 || !(d = fdopendir(lfd))) {
        const int en = errno;
        if (lfd >= 0)
            close(lfd);
        rc = bfs__errno(BFS_EINPUT, en, "%s: cannot list directory", in->root);
        goto cleanup;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || bfs__is_input(in, e->d_name))
            continue;
        if (bfs__grow((void **)&out->v, &cap, out->n + 1, sizeof *out->v) < 0)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        bfs_side *s = &out->v[out->n];
        memset(s, 0, sizeof *s);
        if (!(s->name = bfs__strdup(e->d_name)))
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        out->n++;
        bfs__side_classify(out->dfd, out->bfd, in, out->blobs, s);
    }
    if (out->n)
        qsort(out->v, out->n, sizeof *out->v, bfs__cmp_side);
cleanup:
    if (d)
        closedir(d);
    if (rc < 0)
        bfs__sides_free(out);
    return rc;
}

void bfs__sides_free(bfs_sides *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->v[i].name);
        free(s->v[i].blob);
    }
    free(s->v);
    if (s->dfd >= 0)
        close(s->dfd);
    if (s->bfd >= 0)
        close(s->bfd);
    memset(s, 0, sizeof *s);
    s->dfd = s->bfd = -1;
}

int bfs__side_read(const bfs_sides *ss, const bfs_side *s, const char *root, char **data, size_t *len)
{
    int rc = 0;
    struct stat st;
    uint64_t id[5];
    char *buf = NULL;
    *data = NULL;
    *len = 0;
    const int fd = bfs__side_open(ss->dfd, ss->bfd, s->name, s->blob);
    if (fd < 0)
        return bfs__errno(BFS_EINPUT, errno, "%s/%s: cannot open", root, s->name);
    if (fstat(fd, &st) != 0) {
        rc = bfs__errno(BFS_EIO, errno, "%s/%s: cannot stat", root, s->name);
        goto cleanup;
    }
    bfs__side_id(&st, id);
    if (!S_ISREG(st.st_mode) || memcmp(id, s->id, sizeof id) != 0)
        BFS_FAIL(BFS_EINPUT, "%s/%s: changed since the run began (rerun the conversion)", root, s->name);
    if (!(buf = malloc(s->size + 1)))
        BFS_FAIL(BFS_ENOMEM, "%s/%s: out of memory", root, s->name);
    if (s->size)
        BFS_TRY(bfs__pread_all(fd, buf, (size_t)s->size, 0, s->name));
    buf[s->size] = '\0';
    *data = buf;
    *len = (size_t)s->size;
    buf = NULL;
cleanup:
    free(buf);
    close(fd);
    return rc;
}
