/* Shared helpers of the libFuzzer targets: see fuzz_common.h. */
#include "fuzz_common.h"
#include "base/bfs_io.h"
#include "output/parts.h"

#include <dirent.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FZ_MAX_OUT_BYTES (8u << 20) /* dequant at most this much per input */

static char fz__dir[256];

static void fz__rmdir(void) { fz_rmrf(fz__dir); }

const char *fz_dir(void)
{
    if (!fz__dir[0]) {
        struct stat sb;
        const char *base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) && access("/dev/shm", W_OK) == 0
                               ? "/dev/shm"
                               : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        snprintf(fz__dir, sizeof fz__dir, "%s/bfs-fuzz-XXXXXX", base);
        if (!mkdtemp(fz__dir)) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(fz__rmdir);
    }
    return fz__dir;
}

void fz_clean(void)
{
    DIR *d = opendir(fz_dir());
    struct dirent *e;
    char p[512];
    if (!d)
        return;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%s", fz__dir, e->d_name);
        unlink(p);
    }
    closedir(d);
}

void fz_write(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

/* ---- isolation: one heap block per raw tensor ----------------------------------- */
static const uint8_t **fz__orig;
static size_t fz__norig;

void fz_isolate(bfs_input *in)
{
    fz__orig = calloc(in->nraw ? in->nraw : 1, sizeof *fz__orig);
    if (!fz__orig)
        abort();
    fz__norig = in->nraw;
    for (size_t i = 0; i < in->nraw; i++) {
        bfs_raw *r = &in->raw[i];
        uint8_t *copy = malloc(r->nbytes ? (size_t)r->nbytes : 1);
        if (!copy)
            abort();
        memcpy(copy, r->data, (size_t)r->nbytes);
        fz__orig[i] = r->data;
        r->data = copy;
    }
}

void fz_release(bfs_input *in)
{
    if (!in || !fz__orig)
        return;
    for (size_t i = 0; i < fz__norig && i < in->nraw; i++) {
        free((void *)in->raw[i].data);
        in->raw[i].data = fz__orig[i];
    }
    free(fz__orig);
    fz__orig = NULL;
    fz__norig = 0;
}

fz_opts fz_opts_from_byte(uint8_t b)
{
    fz_opts o;
    memset(&o, 0, sizeof o);
    o.world_size = 1 + (b & 15);
    o.mxfp4_layout = (b & 16) ? BFS_MXFP4_OPENAI : BFS_MXFP4_HF;
    o.keep_dtype = (b & 32) != 0;
    if (b & 64) {
        o.layout = BFS_LAYOUT_HF;
        o.world_size = 1;
        o.max_shard_size = 1 + (uint64_t)(b & 15) * 4096; /* small: several files */
    }
    o.cpu_level = (b & 128) ? -1 : BFS_CPU_SCALAR;
    return o;
}

/* Every output header must be one our own reader accepts, with the planned offsets. */
static void fz__check_outfile(const bfs_plan *p, const bfs_outfile *f)
{
    const uint64_t hl = f->data_start - 8;
    char *text = NULL;
    if (bfs__plan_header(p, f, &text) != 0) {
        fprintf(stderr, "fuzz: %s: no header: %s\n", f->name, bfs_last_error());
        abort();
    }
    if (f->data_start % 64 != 0 || f->data_start < 8 || strlen(text) != hl) {
        fprintf(stderr, "fuzz: %s: data_start %llu is not 64-aligned or the header length is wrong\n", f->name,
                (unsigned long long)f->data_start);
        abort();
    }
    uint8_t *buf = malloc((size_t)f->data_start);
    if (!buf)
        abort();
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(hl >> (8 * i));
    memcpy(buf + 8, text, (size_t)hl);
    free(text);
    bfs_st_header h;
    bfs__err_clear();
    if (bfs__st_parse(buf, f->size, f->name, &h) != 0) {
        fprintf(stderr, "fuzz: planned output header rejected by our own reader: %s\n", bfs_last_error());
        abort();
    }
    if (h.n != f->npieces) {
        fprintf(stderr, "fuzz: %s: %zu tensors in the header, %zu pieces planned\n", f->name, h.n, f->npieces);
        abort();
    }
    for (size_t i = 0; i < f->npieces; i++) {
        const bfs_piece *pc = &f->pieces[i];
        const bfs_ltensor *t = &p->t[pc->tensor];
        const bfs_st_tensor *ht = NULL;
        for (size_t k = 0; k < h.n && !ht; k++)
            if (!strcmp(h.t[k].name, t->name))
                ht = &h.t[k];
        if (!ht || h.data_start + ht->begin != pc->offset || ht->end - ht->begin != pc->nbytes ||
            ht->dtype != t->out_dtype) {
            fprintf(stderr, "fuzz: %s: tensor \"%s\" is not where the plan puts it\n", f->name, t->name);
            abort();
        }
    }
    bfs__st_header_free(&h);
    free(buf);
}

void fz_exercise(bfs_input *in, const fz_opts *fo)
{
    bfs_convert_opts o;
    bfs_plan *p = NULL;
    bfs_convert_opts_init(&o);
    o.world_size = fo->world_size;
    o.layout = fo->layout;
    o.mxfp4_layout = fo->mxfp4_layout;
    o.keep_dtype = fo->keep_dtype;
    o.max_shard_size = fo->max_shard_size;
    if (bfs__plan_tensors(in, &o, &p) != 0) {
        if (!bfs__err_is_set())
            abort(); /* every failure must say why */
        return;
    }
    if (bfs__plan_layout(p, &o) != 0) {
        if (!bfs__err_is_set())
            abort();
        bfs__plan_free(p);
        return;
    }
    /* every tensor's rows are covered exactly once over the files */
    uint64_t *rows = calloc(p->nt ? p->nt : 1, sizeof *rows);
    if (!rows)
        abort();
    for (int f = 0; f < p->nfiles; f++) {
        fz__check_outfile(p, &p->files[f]);
        for (size_t i = 0; i < p->files[f].npieces; i++)
            rows[p->files[f].pieces[i].tensor] += p->files[f].pieces[i].row1 - p->files[f].pieces[i].row0;
    }
    for (size_t i = 0; i < p->nt; i++)
        if (rows[i] != p->t[i].d0) {
            fprintf(stderr, "fuzz: tensor \"%s\": %llu rows planned, %llu in the tensor\n", p->t[i].name,
                    (unsigned long long)rows[i], (unsigned long long)p->t[i].d0);
            abort();
        }
    free(rows);

    /* dequant every piece into an exact-size buffer (bounded work per input) */
    const bfs_kernel_ops *k = bfs_kernels_cpu(fo->cpu_level);
    if (!k)
        k = bfs_kernels_cpu(BFS_CPU_SCALAR);
    uint64_t budget = FZ_MAX_OUT_BYTES;
    for (int f = 0; f < p->nfiles; f++)
        for (size_t i = 0; i < p->files[f].npieces; i++) {
            const bfs_piece *pc = &p->files[f].pieces[i];
            if (pc->nbytes > budget || pc->row0 == pc->row1 || (fo->only && strcmp(fo->only, p->t[pc->tensor].name)))
                continue;
            budget -= pc->nbytes;
            void *out = malloc(pc->nbytes ? (size_t)pc->nbytes : 1);
            if (!out)
                abort();
            /* the piece's units as convert cuts them: a packed tensor's, one member at a time */
            bfs_ucur cur = bfs__ucur(&p->t[pc->tensor], pc->row0, pc->row1);
            bfs_unit u;
            uint64_t ua, ub, at = 0;
            while (bfs__ucur_next(&cur, UINT64_MAX, &u, &ua, &ub)) {
                const uint64_t nb = (u.row1 - u.row0) * bfs__sub_row_bytes(u.t);
                if (at + nb > pc->nbytes)
                    abort(); /* the members' rows must add up to the piece */
                u.out = (uint8_t *)out + at;
                bfs__unit_cpu(k, &u);
                at += nb;
            }
            if (at != pc->nbytes)
                abort();
            free(out);
        }
    bfs__plan_free(p);
}

void fz_open_and_exercise(const char *path, const fz_opts *o)
{
    bfs_input *in = NULL;
    bfs__err_clear();
    if (bfs__input_open(path, &in) != 0) {
        if (!bfs__err_is_set() || in)
            abort();
        return;
    }
    fz_isolate(in);
    fz_exercise(in, o);
    fz_release(in);
    bfs__input_free(in);
}

/* ---- the readers of what bfshard writes ----------------------------------------------------- */
void fz_fixture(const char *name, char *out, size_t cap)
{
    const char *env = getenv("BFS_FUZZ_FIXTURES");
    const char *roots[] = {env ? env : "fixtures", "fixtures", "../../fixtures"};
    char p[PATH_MAX], abs[PATH_MAX];
    for (size_t r = 0; r < 3; r++) {
        snprintf(p, sizeof p, "%s/%s", roots[r], name);
        if (realpath(p, abs) && strlen(abs) < cap) {
            snprintf(out, cap, "%s", abs);
            return;
        }
    }
    fprintf(stderr, "fuzz: fixture %s not found (run from the repository root or set BFS_FUZZ_FIXTURES)\n", name);
    abort();
}

/* The first byte of text (len bytes) that the escaping rule (src/base/base.h, escape.c)
 * never lets through: a C0 control but '\n' where nl is allowed, DEL, a C1 control
 * (U+0080..U+009F) or a byte of no well-formed UTF-8 sequence; len when there is none.
 * Decodes code points itself, so that it does not share a mistake with the rule's code. */
static size_t fz_unescaped(const char *text, size_t len, bool nl)
{
    const unsigned char *t = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        const unsigned c = t[i];
        if (c < 0x80) {
            if ((c < 0x20 && !(nl && c == '\n')) || c == 0x7f)
                return i;
            i++;
            continue;
        }
        const size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
        if (n == 0 || c >= 0xf8 || i + n > len)
            return i;
        unsigned cp = c & (0x7fu >> n);
        for (size_t k = 1; k < n; k++) {
            if ((t[i + k] & 0xc0) != 0x80)
                return i;
            cp = cp << 6 | (t[i + k] & 0x3fu);
        }
        const unsigned least = n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
        if (cp < least || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || cp <= 0x9f)
            return i;
        i += n;
    }
    return len;
}

void fz_check_error(int rc, const char *what)
{
    const char *e = bfs_last_error();
    if (rc < BFS_EINCOMPLETE || rc > BFS_EINTERNAL || !bfs__err_is_set() || !e[0]) {
        fprintf(stderr, "fuzz: %s failed with %d (%s) and the message \"%s\"\n", what, rc, bfs_err_name(rc), e);
        abort();
    }
    const size_t at = fz_unescaped(e, strlen(e), false);
    if (at < strlen(e)) {
        fprintf(stderr, "fuzz: %s: %s 0x%02x in the error message: %s\n", what,
                (unsigned char)e[at] < 0x80 ? "control character" : "unescaped byte", (unsigned char)e[at], e);
        abort();
    }
}

size_t fz_check_report(const char *text, size_t len, const char *what)
{
    size_t lines = 0;
    const size_t at = fz_unescaped(text, len, true);
    if (at < len) {
        fprintf(stderr, "fuzz: %s: %s 0x%02x in the report:\n%.*s\n", what,
                (unsigned char)text[at] < 0x80 ? "control character" : "unescaped byte", (unsigned char)text[at],
                (int)len, text);
        abort();
    }
    for (size_t i = 0; i < len; i++)
        lines += text[i] == '\n';
    if (len && text[len - 1] != '\n') {
        fprintf(stderr, "fuzz: %s: the report does not end with a line end:\n%.*s\n", what, (int)len, text);
        abort();
    }
    return lines;
}

static int fz__rm1(const char *p, const struct stat *sb, int type, struct FTW *f)
{
    (void)sb;
    (void)f;
    if (type == FTW_DP)
        rmdir(p);
    else
        unlink(p);
    return 0;
}

void fz_rmrf(const char *path) { nftw(path, fz__rm1, 16, FTW_DEPTH | FTW_PHYS); }

/* every kind of manifest bfshard writes, over the fixtures (the seeds of fuzz_manifest
 * and fuzz_sums name the OUTDIR they were made with: gen_corpus.py keeps the same table) */
const fz_outdir fz_outdirs[FZ_NOUTDIRS] = {
    {"ct-fp8-block", 1, BFS_LAYOUT_DCP, 0, 0, 0, {NULL, NULL}},
    {"ct-moe-mixed", 3, BFS_LAYOUT_DCP, 0, 0, 0, {NULL, NULL}},
    {"fp8-block-split", 8, BFS_LAYOUT_DCP, 0, 0, 0, {NULL, NULL}},
    {"mxfp4-tiny", 1, BFS_LAYOUT_HF, 0, 0, 0, {NULL, NULL}},
    {"bnb-nf4", 3, BFS_LAYOUT_DCP, 3, BFS_ZST_PLAIN, 0, {NULL, NULL}},
    {"ct-int4-asym", 3, BFS_LAYOUT_DCP, 0, 0, 0, {"0", "1-2"}},
    {"modelopt-nvfp4", 8, BFS_LAYOUT_DCP, 1, BFS_ZST_BYTEGROUP, 0, {NULL, NULL}},
    {"bnb-fp4-dq", 1, BFS_LAYOUT_HF, 0, 0, 40000, {NULL, NULL}},
};

static bool fz__od_ready[FZ_NOUTDIRS];

const char *fz_outdir_get(int k, const char **manifest)
{
    static char path[FZ_NOUTDIRS][512];
    const fz_outdir *d = &fz_outdirs[k];
    *manifest = d->ranks[0] ? BFS_PART_PREFIX "0" BFS_PART_SUFFIX : BFS_MANIFEST_NAME;
    snprintf(path[k], sizeof path[k], "%s/od%d", fz_dir(), k);
    if (fz__od_ready[k])
        return path[k];
    char in[PATH_MAX];
    fz_fixture(d->fixture, in, sizeof in);
    fz_rmrf(path[k]);
    for (int part = 0; part < (d->ranks[0] ? 2 : 1); part++) {
        bfs_convert_opts o;
        bfs_convert_opts_init(&o);
        o.world_size = d->world_size;
        o.layout = d->layout;
        o.device = "cpu";
        o.threads = 1;
        o.compress_level = d->compress_level;
        o.compress_mode = d->compress_mode;
        o.max_shard_size = d->max_shard_size;
        o.ranks = d->ranks[part];
        bfs__err_clear();
        const int rc = bfs_convert(in, path[k], &o, NULL);
        if (rc != 0) {
            fprintf(stderr, "fuzz: cannot make OUTDIR %d from %s: %s\n", k, in, bfs_last_error());
            abort();
        }
    }
    fz__od_ready[k] = true;
    return path[k];
}
