/*
 * bfs_convert: the streaming pipeline, as orchestration of its owners.
 *
 *   open inputs (mmap) -> plan (every header, offset, size; plan.c) -> OUTDIR
 *   prepared or resumed (outdir.c) -> for each output file: for each piece: units of
 *   dim-0 rows of about BFS_UNIT_BYTES -> backend fills the next buffer of the ring
 *   (units.h) at its file offset mod 4096 -> hashed right behind (writer.c, this
 *   thread) -> the writer thread writes the ring in order (O_DIRECT where it can) while
 *   the next units are dequantized, across tensors and rank files -> durable commit
 *   (durable.c) + journal line, once the writer has ended the file, while it writes the
 *   next one (bfs__rank_poll). Then config.json, the side files copied (convert_side.c), the manifest
 *   (manifest.c; last, atomically).
 *   The rank-file stage (units, commits, reuse): convert_ranks.c; the run's state: convert.h.
 *
 * Memory: the ring of unit buffers (bfs__ring_budget), the writer's carries and the
 * headers of the files in flight (two, or a group's: units.h); input pages are released
 * (madvise + fadvise DONTNEED) after each unit or a group's window (bfs__advise_sources,
 * bfs__release_window, convert_ranks.c), so RSS does not grow with the model, nor the page
 * cache, but for input slices under 64 KiB (BFS_DROP_MIN), which are left to the kernel's LRU.
 */
#include "commands/convert.h"
#include "commands/commands.h"
#include "backend/backend.h"
#include "plan/plan.h"
#include "base/bfs_io.h"
#include "output/durable.h"
#include "formats/format.h"
#include "output/manifest.h"
#include "output/outdir.h"
#include "output/parts.h"
#include "output/slices.h"
#include "input/srchash.h"
#include "output/writer.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BFS_DEFAULT_GPU_MEM (1ull << 30)

/* ---- the run's log (its state, bfs_run: convert.h) ------------------------------------- */
static void bfs__log(const bfs_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bfs__log(const bfs_run *r, const char *fmt, ...)
{
    if (!r->o->log)
        return;
    va_list ap;
    va_start(ap, fmt);
    bfs__vline(r->o->log, "bfshard: ", fmt, ap); /* escaped: names come from the input */
    va_end(ap);
    fflush(r->o->log);
}

/* ---- fingerprint: what determines the output bytes ------------------------------------- */
static int bfs__fingerprint(bfs_run *r)
{
    XXH3_state_t *st = XXH3_createState();
    char opt[256];
    if (!st)
        return bfs__err(BFS_ENOMEM, "out of memory");
    XXH3_128bits_reset(st);
    snprintf(opt, sizeof opt, "bfshard %s w=%d layout=%d mx=%d keep=%d shard=%llu", BFS_VERSION_STRING,
             r->o->world_size, r->o->layout, r->o->mxfp4_layout, r->o->keep_dtype,
             (unsigned long long)r->o->max_shard_size);
    if (r->o->compress_level) /* only then, so other fingerprints stay as they were */
        snprintf(opt + strlen(opt), sizeof opt - strlen(opt), " zst=%d:%d", r->o->compress_level, r->o->compress_mode);
    if (r->o->sha256) /* the manifest differs (files[].sha256); the rank files do not */
        snprintf(opt + strlen(opt), sizeof opt - strlen(opt), " sha256");
    if (r->plan->names_family) /* target names: other names and shapes (only then, as above) */
        snprintf(opt + strlen(opt), sizeof opt - strlen(opt), " names=%s", r->plan->names_family);
    if (r->plan->names_target) /* another placement of the experts */
        snprintf(opt + strlen(opt), sizeof opt - strlen(opt), " names=%s", r->plan->names_target);
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
    const int rc = bfs__side_fingerprint(r, st);
    bfs__hash_hex(XXH3_128bits_digest(st), r->fingerprint);
    XXH3_freeState(st);
    return rc;
}

/* ---- one output file ------------------------------------------------------------------- */
/* The result's tensor counts by what is done to each. */
static void bfs__count_kinds(const bfs_input *in, const bfs_plan *p, bfs_convert_result *res)
{
    res->tensors_dequantized = res->tensors_cast = res->tensors_copied = 0;
    for (size_t i = 0; i < p->nt; i++) {
        const bfs_kind k = p->t[i].kind;
        if (k != BFS_K_PASS && k != BFS_K_CAST) /* every format's kind: MXFP4, bnb, FP8, INT4, NVFP4 */
            res->tensors_dequantized++;
        else if (k == BFS_K_CAST || (k == BFS_K_PASS && p->t[i].out_dtype != p->t[i].src_dtype))
            res->tensors_cast++;
        else
            res->tensors_copied++;
    }
    res->tensors_dropped = in->nraw > p->nt ? in->nraw - p->nt : 0;
}

/* ---- small files: config.json, side files, index, manifest ------------------------- */
/* Written durably; kind != NULL: recorded in the manifest's files[]. */
int bfs__write_small(bfs_run *r, const char *name, const void *data, size_t len, const char *kind)
{
    char hex[33], sha[65];
    /* parts in one OUTDIR write the same small files, maybe at once */
    int rc = bfs__write_durable_shared(r->dirfd, r->outdir, name, data, len, r->mine != NULL);
    if (rc < 0)
        return rc;
    if (kind && r->aux) {
        bfs__hash_hex(XXH3_128bits(data, len), hex);
        if (r->o->sha256 && (rc = bfs__sha256_buf(data, len, sha)) < 0)
            return rc;
        json_t *e = bfs__manifest_aux_entry(name, len, hex, r->o->sha256 ? sha : NULL, kind);
        if (!e || json_array_append_new(r->aux, e) != 0) /* never a manifest short of a file */
            return bfs__err(BFS_ENOMEM, "out of memory");
    }
    return 0;
}

/* A side file, read again and checked to be the file that was listed (bfs__sides_each), written
 * as a small file of kind "copy" (hashed, journaled, in the sums). */
static int bfs__copy_side(void *ctx, const char *name, const char *data, size_t len)
{
    return bfs__write_small(ctx, name, data, len, "copy");
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
    if (json_object_get(cfg, "quantization_config")) { /* DeepSeek-V4 says its experts' format at the top too */
        json_object_del(cfg, "expert_dtype");
        json_object_del(cfg, "scale_fmt");
    }
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

/* The manifest, then the sums files (completion is one event). The manifest's
 * rename is the moment the run is complete; a sums file never stands in OUTDIR without the
 * manifest it agrees with, so a pipeline's `xxh128sum -c xxh128sums.txt` cannot pass on an
 * unfinished OUTDIR. A run stopped between the two leaves a manifest without its sums: verify
 * reports them missing, and a rerun (the journal goes only after both) resumes and writes them. */
static int bfs__write_manifest(bfs_run *r)
{
    int rc = 0;
    json_t *m = NULL;
    for (int f = 0; f < r->plan->nfiles; f++) /* each weights file's slice index (manifest v2): at its commit */
        if ((!r->mine || r->mine[f]) && !r->slices_hex[f][0])
            BFS_FAIL(BFS_EINTERNAL, "%s: no slice index written", r->plan->files[f].name);
    const bfs_manifest_in mi = {.o = r->o, .in = r->in, .plan = r->plan, .fingerprint = r->fingerprint,
                                .src_hex = (const char (*)[33])r->src_hex, .file_hex = (const char (*)[33])r->file_hex,
                                .file_sha = (const char (*)[65])r->file_sha,
                                .slices_hex = (const char (*)[33])r->slices_hex,
                                .slices_sha = (const char (*)[65])r->slices_sha, .zst = r->zst, .aux = r->aux, .skipped = r->skipped,
                                .mine = r->mine, .part = r->mine ? r->part : NULL};
    BFS_TRY(bfs__manifest_build_head(&mi, &m));
    /* a part: its manifest only; bfs_merge writes the manifest and the sums */
    BFS_TRY(bfs__manifest_write_conv(r->dirfd, r->outdir, r->mine ? r->pname : BFS_MANIFEST_NAME, &mi, m));
    if (!r->mine)
        BFS_TRY(bfs__manifest_write_sums(r->dirfd, r->outdir, json_object_get(m, "files")));
cleanup:
    json_decref(m);
    return rc;
}

static int bfs__write_hf_index(bfs_run *r)
{
    const bfs_plan *p = r->plan;
    json_t *wm = json_object();
    bool whole = wm != NULL; /* an entry jansson failed to add must not give a short index */
    for (int f = 0; f < p->nfiles; f++)
        for (size_t pi = 0; pi < p->files[f].npieces; pi++)
            if (json_object_set_new(wm, p->t[p->files[f].pieces[pi].tensor].name, json_string(p->files[f].name)) != 0)
                whole = false;
    if (!whole) {
        json_decref(wm);
        return bfs__err(BFS_ENOMEM, "out of memory building model.safetensors.index.json");
    }
    json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)p->total_bytes, "weight_map", wm);
    char *text = bfs__json_dump(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    if (!text)
        return bfs__err(BFS_ENOMEM, "out of memory");
    const int rc = bfs__write_small(r, "model.safetensors.index.json", text, strlen(text), "index");
    free(text);
    return rc;
}

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
    if (o->names != BFS_NAMES_AUTO && o->names != BFS_NAMES_CHECKPOINT && o->names != BFS_NAMES_TRANSFORMERS &&
        o->names != BFS_NAMES_TORCHTITAN)
        return bfs__err(BFS_EUSAGE, "unknown --names %d", o->names);
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
        char why[512];
        if (bfs__cuda_probe(why, sizeof why) > 0)
            return bfs__backend_cuda_create("cuda", r->o->gpu_mem ? r->o->gpu_mem : BFS_DEFAULT_GPU_MEM, unit_bytes, &r->be);
        bfs__log(r, "--device auto: using the CPU backend: %s", why);
        return bfs__backend_cpu_create(r->o->cpu_level, r->o->threads, &r->be);
    }
    if (!strncmp(dev, "cuda", 4) && (dev[4] == '\0' || dev[4] == ':'))
        return bfs__backend_cuda_create(dev, r->o->gpu_mem ? r->o->gpu_mem : BFS_DEFAULT_GPU_MEM, unit_bytes, &r->be);
    return bfs__err(BFS_EUSAGE, "--device %s: expected auto, cpu, cuda or cuda:N[,M...]", dev);
}

/* A part converts its ranks' files and adds their terms of the source hashes (srchash.c). */
static int bfs__run_part(bfs_run *r)
{
    int rc = 0;
    const bfs_convert_opts *o = r->o;
    const bfs_plan *p = r->plan;
    char how[192];
    r->part_bytes = p->total_bytes;
    if (!o->ranks)
        return 0;
    if (p->layout != BFS_LAYOUT_DCP || p->nfiles != o->world_size)
        return bfs__err(BFS_EUSAGE, "--ranks is for --layout dcp (one file per rank)");
    free(r->mine); /* resolved again, now with its message on failure (the layout's was quiet) */
    r->mine = calloc((size_t)p->nfiles, sizeof *r->mine);
    if (!r->mine)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    BFS_TRY(bfs__ranks_resolve(o, r->mine, how, sizeof how));
    BFS_TRY(bfs__ranks_format(r->mine, o->world_size, r->part, sizeof r->part));
    if (!r->part[0]) {
        bfs__log(r, "ranks: none for this process (%s, --world-size %d): nothing to do", how, o->world_size);
        return 0;
    }
    BFS_TRY(bfs__part_names(r->part, r->pname, r->jname, sizeof r->pname));
    r->part_bytes = 0;
    for (int f = 0; f < p->nfiles; f++)
        if (r->mine[f]) {
            if (p->files[f].data_start == 0) /* not laid out: the ranks resolved otherwise before */
                BFS_FAIL(BFS_EINTERNAL, "%s: a rank of this part the layout did not count", p->files[f].name);
            r->part_bytes += p->files[f].size - p->files[f].data_start;
        }
    bfs__log(r, "ranks %s of --world-size %d (%s); threads %d; part manifest %s", r->part, o->world_size,
             how[0] ? how : "--ranks", o->threads, r->pname);
cleanup:
    return rc;
}

/* A ring buffer's bytes: a unit's capacity + the O_DIRECT headroom, in whole buffer pages. */
static uint64_t bfs__buf_len(uint64_t slot)
{
    const uint64_t bp = bfs__buf_page();
    return (slot + BFS_DIO_ALIGN + bp - 1) / bp * bp;
}

/* input -> plan -> buffer budget -> the run's tables and buffers */
static int bfs__run_setup(bfs_run *r, const char *input)
{
    int rc = 0;
    const bfs_convert_opts *o = r->o;
    double t = bfs__now();
    BFS_TRY(bfs__validate_opts(o));
    BFS_TRY(bfs__input_open(input, &r->in));
    r->t_input = bfs__now() - t;
    BFS_TRY(bfs__outdir_check_paths(input, r->outdir, r->in));
    t = bfs__now();
    BFS_TRY(bfs__plan_tensors(r->in, o, &r->plan));
    r->t_plan = bfs__now() - t;
    t = bfs__now();
    if (o->ranks && o->layout == BFS_LAYOUT_DCP && o->world_size > 0) { /* a part: its files laid out in full */
        char how[192];
        if (!(r->mine = calloc((size_t)o->world_size, sizeof *r->mine)))
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        if (bfs__ranks_resolve(o, r->mine, how, sizeof how) < 0) { /* bfs__run_part says why */
            free(r->mine);
            r->mine = NULL;
            bfs__err_clear();
        }
    }
    r->plan->lazy = true; /* a file's pieces made when it is written, dropped with its slice index */
    BFS_TRY(bfs__plan_layout_for(r->plan, o, r->mine));
    r->t_layout = bfs__now() - t;
#ifdef __GLIBC__
    /* the pages of the JSON trees parsing freed (every input header, the index): their
     * chunks lie between the names and tables the run keeps, so free() returns none */
    malloc_trim(0);
#endif
    BFS_TRY(bfs__run_part(r));
    for (int f = 0; r->mine && f < o->world_size && !r->prefetch; f++)
        r->prefetch = !r->mine[f]; /* a part (not every rank): exact reads, no readahead */
    if (r->prefetch)
        bfs__input_random(r->in);
    BFS_TRY(bfs__side_plan(r)); /* before any rank file: a side file never fails a finished run */
    if (!(r->unit_read = calloc(r->in->nraw + 1, sizeof *r->unit_read)))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    bfs__sources_read(r->plan->t, r->plan->nt, r->in->raw, r->unit_read);
    BFS_TRY(bfs__srchash_create(r->in, r->unit_read, !r->mine || r->mine[0], false, &r->sh));

    /* the ring of unit buffers: at least two units in flight */
    uint64_t mem = 0;
    BFS_TRY(bfs__pick_mem(r->in, r->plan, r->mine, o, &mem)); /* --max-rss: the largest that fits */
    if (o->max_rss)
        bfs__log(r, "--max-rss %llu: --mem %llu", (unsigned long long)o->max_rss, (unsigned long long)mem);
    const bool fits = bfs__ring_budget(r->plan, r->mine, mem, &r->ring);
    r->unit_bytes = r->ring.unit;
    /* rank files written together (units.h); one at a time with a compressed copy each */
    r->group = o->compress_level ? 1 : bfs__group_size(r->plan, r->mine, &r->ring, mem);
    if (!fits)
        BFS_FAIL(BFS_ENOMEM, "--mem %llu is too small: the largest indivisible unit (one dim-0 row) is %llu bytes and two are in flight; use --mem %llu or more",
                 (unsigned long long)mem, (unsigned long long)r->plan->max_row_bytes,
                 (unsigned long long)(2 * r->plan->max_row_bytes));
    const int nf = r->plan->nfiles;
    r->file_hex = calloc((size_t)nf, sizeof *r->file_hex);
    if (o->sha256 && !(r->file_sha = calloc((size_t)nf, sizeof *r->file_sha)))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    r->zst = calloc((size_t)nf, sizeof *r->zst);
    r->piece_dig = calloc((size_t)nf, sizeof *r->piece_dig);
    r->hdr_hex = calloc((size_t)nf, sizeof *r->hdr_hex); /* NULL: each slice index builds its header again */
    r->slices_hex = calloc((size_t)nf, sizeof *r->slices_hex);
    if (o->sha256 && !(r->slices_sha = calloc((size_t)nf, sizeof *r->slices_sha)))
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    r->reused = calloc((size_t)nf, sizeof *r->reused);
    r->src_hex = calloc((size_t)r->in->nfiles, sizeof *r->src_hex);
    r->aux = json_array();
    r->pr = malloc(BFS_BATCH_MAX * BFS_UNIT_MAX_SRC * sizeof *r->pr);
    r->fstamp = calloc((size_t)r->in->nfiles + 1, sizeof *r->fstamp);
    if (!r->file_hex || !r->zst || !r->piece_dig || !r->slices_hex || !r->reused || !r->src_hex || !r->aux || !r->pr || !r->fstamp)
        BFS_FAIL(BFS_ENOMEM, "out of memory");
    /* each file's piece hashes: allocated when it is written (bfs__piece_dig_alloc), freed at
     * its commit, so that they never add up to files x tensors (W = 1024 on DeepSeek-V3's 92k
     * tensors: 3.1 GB of address space otherwise) */
    /* + the headroom before each unit's output that lets the writer use O_DIRECT; on the
     * buffers' page (writer.h: bfs__buf_page), huge pages advised where available */
    const size_t bp = (size_t)bfs__buf_page(), blen = (size_t)bfs__buf_len(r->ring.slot);
    for (int i = 0; i < r->ring.n; i++) {
        void *b = NULL;
        if (posix_memalign(&b, bp > BFS_DIO_ALIGN ? bp : BFS_DIO_ALIGN, blen) != 0)
            BFS_FAIL(BFS_ENOMEM, "cannot allocate a %llu-byte unit buffer (--mem %llu)", (unsigned long long)r->ring.slot,
                     (unsigned long long)mem);
        if (bp == BFS_HUGE_PAGE)
            (void)madvise(b, blen, MADV_HUGEPAGE); /* advice: a kernel that refuses keeps 4 KiB pages */
        r->buf[i] = b;
    }
    r->live = 1; /* buffer 0: the first one filled (bfs__slot_next) */
cleanup:
    return rc;
}

/* Every name this run may write in OUTDIR (names[i] malloc'ed; free with bfs__outputs_free). */
static void bfs__outputs_free(char **names, size_t n)
{
    for (size_t i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
}

static int bfs__outputs(const bfs_run *r, char ***out, size_t *nout)
{
    const size_t cap = 3 * (size_t)r->plan->nfiles + r->sides.n + 5;
    char **v = calloc(cap, sizeof *v);
    size_t n = 0;
    if (!v)
        return bfs__err(BFS_ENOMEM, "out of memory");
    for (int f = 0; f < r->plan->nfiles; f++) {
        const char *nm = r->plan->files[f].name;
        if (r->mine && !r->mine[f])
            continue; /* another part's */
        v[n++] = bfs__strdup(nm);
        char sn[NAME_MAX + 1];
        v[n++] = bfs__slices_name(nm, sn, sizeof sn) == 0 ? bfs__strdup(sn) : NULL;
        if (r->o->compress_level && (v[n] = malloc(strlen(nm) + 5)) != NULL)
            sprintf(v[n++], "%s%s", nm, r->o->compress_mode == BFS_ZST_BYTEGROUP ? ".bfz" : ".zst");
    }
    if (r->in->config_json)
        v[n++] = bfs__strdup("config.json");
    for (size_t i = 0; i < r->sides.n; i++)
        if (!r->sides.v[i].why)
            v[n++] = bfs__strdup(r->sides.v[i].name);
    if (r->plan->layout == BFS_LAYOUT_HF)
        v[n++] = bfs__strdup("model.safetensors.index.json");
    if (r->mine) { /* a part: its own manifest; merge writes the sums and the manifest */
        v[n++] = bfs__strdup(r->pname);
    } else {
        v[n++] = bfs__strdup(BFS_SUMS_NAME);
        if (r->o->sha256)
            v[n++] = bfs__strdup(BFS_SHA256SUMS_NAME);
        v[n++] = bfs__strdup(BFS_MANIFEST_NAME);
    }
    for (size_t i = 0; i < n; i++)
        if (!v[i]) {
            bfs__outputs_free(v, n);
            return bfs__err(BFS_ENOMEM, "out of memory");
        }
    *out = v;
    *nout = n;
    return 0;
}

/* The unit buffers from the backend's host_alloc when it has one (CUDA: pinned memory,
 * so each D2H copy lands in the buffer the writer writes, with no host memcpy). They must
 * keep the O_DIRECT alignment; when the backend cannot give that, the malloc'ed ones stay. */
static int bfs__pin_buffers(bfs_run *r)
{
    if (!r->be->host_alloc || !r->be->host_free)
        return 0;
    const size_t n = (size_t)r->ring.slot + BFS_DIO_ALIGN;
    uint8_t *p[BFS_RING_MAX] = {NULL};
    for (int i = 0; i < r->ring.n; i++) {
        p[i] = r->be->host_alloc(r->be, n);
        if (!p[i] || (uintptr_t)p[i] % BFS_DIO_ALIGN) {
            for (int k = 0; k <= i; k++)
                if (p[k])
                    r->be->host_free(r->be, p[k]);
            bfs__log(r, "unit buffers: pinned memory not available, using pageable memory");
            return 0;
        }
    }
    for (int i = 0; i < r->ring.n; i++) {
        free(r->buf[i]);
        r->buf[i] = p[i];
    }
    r->buf_pinned = true;
    return 0;
}

/* backend, OUTDIR, the two threads */
static int bfs__run_start(bfs_run *r, const char *input)
{
    int rc = 0;
    const bfs_convert_opts *o = r->o;
    char **outputs = NULL;
    size_t nout = 0;
    BFS_TRY(bfs__make_backend(r, r->ring.slot));
    BFS_TRY(bfs__pin_buffers(r));
    BFS_TRY(bfs__outputs(r, &outputs, &nout));
    if (r->mine) {
        BFS_TRY(bfs__outdir_prepare_part(r->outdir, r->fingerprint, o->force, r->plan, r->mine, r->jname, r->pname,
                                         (const char *const *)outputs, nout, &r->dirfd, r->reused, r->file_hex));
        bool *skip = calloc((size_t)r->plan->nfiles, sizeof *skip);
        if (!skip)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        for (int f = 0; f < r->plan->nfiles; f++)
            skip[f] = r->reused[f] || !r->mine[f];
        rc = bfs__outdir_check_space(r->dirfd, r->outdir, r->plan, skip);
        free(skip);
        BFS_TRY(rc);
    } else {
        BFS_TRY(bfs__outdir_prepare(r->outdir, r->fingerprint, o->force, r->plan, (const char *const *)outputs, nout,
                                    &r->dirfd, r->reused, r->file_hex));
        BFS_TRY(bfs__outdir_check_space(r->dirfd, r->outdir, r->plan, r->reused));
    }
    bfs__log(r, "%s -> %s: %zu tensors, %d file(s), %.3f GB of output, backend %s, host buffers %d x %llu bytes "
             "(units of ~%llu)", input, r->outdir, r->plan->nt, r->plan->nfiles, (double)r->plan->total_bytes / 1e9,
             r->be->name, r->ring.n, (unsigned long long)r->ring.slot, (unsigned long long)r->ring.unit);
    if (r->plan->names_family) /* docs/NAMES.md */
        bfs__log(r, "names: transformers 5's state_dict (the table's row \"%s\"): experts packed, keys renamed", r->plan->names_family);
    if (r->plan->names_target) /* docs/NAMES.md */
        bfs__log(r, "names: checkpoint names, for torchtitan; %zu per-expert tensor(s) whole in their owner's rank file (%llu experts)",
                 r->plan->tt_experts, (unsigned long long)r->plan->tt_E);
    if (r->plan->names_unmapped)
        bfs__log(r, "warning: %zu per-expert tensor(s) keep checkpoint names: DCP will not load them into a transformers 5 model", r->plan->names_unmapped);
    {
        char line[1024]; /* float32 upstream (src/plan/fp32.c) */
        if (bfs__fp32_summary(r->plan, line, sizeof line))
            bfs__log(r, "%s", line);
    }
    if (r->be->device_bytes)
        bfs__log(r, "GPU memory: %llu bytes allocated once from --gpu-mem %llu (the peak; it does not grow with the model)",
                 (unsigned long long)r->be->device_bytes,
                 (unsigned long long)(o->gpu_mem ? o->gpu_mem : BFS_DEFAULT_GPU_MEM));

    r->w.sha = o->sha256 != 0; /* SHA-256 in a thread beside each writer (writer.h) */
    r->w.nlanes = bfs__writer_lanes(r->group, o->threads); /* a group's files on several writers */
    BFS_TRY(bfs__writer_start(&r->w));
cleanup:
    bfs__outputs_free(outputs, nout);
    return rc;
}

/* the group's files so far written (one alone: as one at a time) */
static int bfs__flush_group(bfs_run *r, const int *grp, int *ng, bfs_convert_result *res)
{
    const int n = *ng;
    *ng = 0;
    if (n == 0)
        return 0;
    const int rc = n == 1                                ? bfs__write_file(r, grp[0])
                   : r->plan->layout == BFS_LAYOUT_DCP ? bfs__write_group(r, grp, n)
                                                       : bfs__write_interleaved(r, grp, n);
    if (rc == 0 && res)
        res->files_written += n;
    return rc;
}

/* every rank file: written (r->group at a time: units.h), or reused from an interrupted run */
static int bfs__run_files(bfs_run *r, bfs_convert_result *res)
{
    int rc = 0, grp[BFS_GROUP_MAX], ng = 0;
    for (int f = 0; f < r->plan->nfiles; f++) {
        if (r->mine && !r->mine[f])
            continue; /* another part's */
        if (r->reused[f]) {
            BFS_TRY(bfs__flush_group(r, grp, &ng, res));
            BFS_TRY(bfs__ranks_finish(r)); /* the writer idle: its buffer is the re-hash's */
            BFS_TRY(bfs__rehash_pieces(r, f));
            BFS_TRY(bfs__file_slices(r, f));
            BFS_TRY(bfs__hash_reused_sources(r, f));
            atomic_fetch_add(&r->w.total, r->plan->files[f].size - r->plan->files[f].data_start);
            bfs__progress(r, "");
            bfs__log(r, "%s: reused from the interrupted run (hash verified)", r->plan->files[f].name);
            if (r->o->compress_level)
                BFS_TRY(bfs__zcopy_reused(r, f));
            bfs__plan_pieces_drop(r->plan, f); /* a lazy plan's: made by bfs__rehash_pieces */
            continue;
        }
        grp[ng++] = f;
        if (ng == r->group)
            BFS_TRY(bfs__flush_group(r, grp, &ng, res));
    }
    BFS_TRY(bfs__flush_group(r, grp, &ng, res));
    BFS_TRY(bfs__ranks_finish(r));
cleanup:
    if (rc < 0)
        bfs__ranks_abort(r);
    return rc;
}

/* the source hashes, the small files, the manifest; the journal goes */
static int bfs__run_finish(bfs_run *r)
{
    int rc = 0;
    BFS_TRY(bfs__srchash_finish(r->sh, r->src_hex));
    bfs__srchash_bytes(r->sh, &r->in_read, &r->src_read);
    uint64_t insize = 0;
    for (int i = 0; i < r->in->nfiles; i++)
        insize += r->in->files[i].size;
    if (!r->mine && r->src_read != insize) /* every input byte is in one term (srchash.c) */
        BFS_FAIL(BFS_EINTERNAL, "the source hashes cover %llu of the %llu input bytes", (unsigned long long)r->src_read,
                 (unsigned long long)insize);
    BFS_TRY(bfs__input_check(r->in, -1)); /* the source hashes cover what was really there */
    if (bfs__cancelled())
        BFS_FAIL(BFS_EINTR, "interrupted");
    BFS_TRY(bfs__write_config(r));
    BFS_TRY(bfs__sides_each(r, bfs__copy_side, r));
    if (r->plan->layout == BFS_LAYOUT_HF)
        BFS_TRY(bfs__write_hf_index(r));
    const double t = bfs__now();
    BFS_TRY(bfs__write_manifest(r));
    r->t_manifest = bfs__now() - t;
    bfs__outdir_journal_remove(r->dirfd, r->mine ? r->jname : BFS_JOURNAL_NAME);
cleanup:
    return rc;
}

static void bfs__run_free(bfs_run *r, int rc)
{
    bfs__writer_stop(&r->w);
    for (int i = 0; i < 2; i++) /* after a failure: their temporaries go */
        bfs__rank_free(&r->rank[i]);
    for (int i = 0; r->grp && i < BFS_GROUP_MAX; i++)
        bfs__rank_free(&r->grp[i]);
    free(r->grp);
    free(r->wsteps);
    bfs__wscratch_free(&r->ws);
    bfs__srchash_free(r->sh);
    for (int i = 0; r->buf_pinned && i < r->ring.n; i++) { /* host_free before destroy */
        r->be->host_free(r->be, r->buf[i]);
        r->buf[i] = NULL;
    }
    if (r->be)
        r->be->destroy(r->be);
    for (int i = 0; i < BFS_RING_MAX; i++)
        free(r->buf[i]);
    if (r->plan)
        for (int f = 0; f < r->plan->nfiles && r->piece_dig; f++)
            free(r->piece_dig[f]);
    free(r->piece_dig);
    free(r->hdr_hex);
    free(r->slices_hex);
    free(r->slices_sha);
    free(r->file_hex);
    free(r->file_sha);
    for (int f = 0; r->zst && r->plan && f < r->plan->nfiles; f++)
        json_decref(r->zst[f]);
    free(r->zst);
    free(r->reused);
    free(r->src_hex);
    free(r->mine);
    free(r->unit_read);
    free(r->pr);
    free(r->fstamp);
    json_decref(r->aux);
    json_decref(r->skipped);
    bfs__sides_free(&r->sides);
    if (r->dirfd >= 0)
        close(r->dirfd);
    bfs__plan_free(r->plan);
    bfs__input_free(r->in);
}

int bfs_convert(const char *input_arg, const char *outdir, const bfs_convert_opts *o_arg, bfs_convert_result *res_arg)
{
    int rc = 0;
    bfs_run R, *r = &R;
    bfs_convert_opts opts, *o = &opts;
    bfs_convert_result result, *res = &result;
    char *input = NULL;
    memset(r, 0, sizeof *r);
    r->dirfd = -1;
    r->sides.dfd = r->sides.bfd = -1;
    r->lock.fd = r->lock.dirfd = -1;
    for (int i = 0; i < 2; i++)
        r->rank[i].t = r->rank[i].zt = (bfs_tmpfile){.fd = -1, .dirfd = -1};
    bfs__err_clear();
    bfs__cancel_reset();
    bfs_convert_opts_init(o); /* the caller's fields within its size, defaults past it (abi.c) */
    bfs_convert_result_init(res);
    r->o = o;
    r->outdir = outdir;
    const double t0 = bfs__now();
    r->dev_read0 = bfs__device_read_bytes();
    BFS_TRY(bfs__struct_out_check(res_arg, "bfs_convert_result"));
    BFS_TRY(bfs__struct_in(o, sizeof *o, o_arg, "bfs_convert_opts"));
    if (o->ranks && o->threads == 0) { /* several processes per node share its CPUs */
        const int lp = bfs__ranks_local_procs();
        const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        if (lp > 1 && ncpu > 0)
            o->threads = ncpu / lp > 1 ? (int)(ncpu / lp) : 1;
    }
    BFS_TRY(bfs__hf_resolve_dup(input_arg, o->revision, &input)); /* a Hugging Face cache name */

    BFS_TRY(bfs__run_setup(r, input));
    r->t_setup = bfs__now() - t0;
    if (r->mine && !r->part[0])
        goto cleanup; /* --ranks auto gave this process no rank */
    BFS_TRY(bfs__fingerprint(r));
    BFS_TRY(bfs__input_check(r->in, -1));
    if (res) {
        snprintf(res->ranks, sizeof res->ranks, "%s", r->part);
        if (strlen(r->part) >= sizeof res->ranks)
            memcpy(res->ranks + sizeof res->ranks - 4, "...", 4);
    }
    /* a whole run alone in OUTDIR; the parts of a conversion side by side (outdir.h) */
    BFS_TRY(r->mine ? bfs__outdir_lock_part(outdir, true, r->part, &r->lock) : bfs__outdir_lock(outdir, true, &r->lock));
    const bool done = !o->force && (r->mine ? bfs__outdir_part_done(outdir, r->fingerprint, r->pname, r->jname)
                                            : bfs__outdir_already_done(outdir, r->fingerprint));
    if (bfs__cancelled())
        BFS_FAIL(BFS_EINTR, "interrupted");
    if (done) {
        bfs__log(r, "%s: already holds this conversion (same input and options) and it verifies: nothing to do", outdir);
        if (res) {
            res->files_reused = (uint64_t)r->plan->nfiles;
            if (r->mine) {
                res->files_reused = 0;
                for (int f = 0; f < r->plan->nfiles; f++)
                    res->files_reused += r->mine[f];
            }
            res->tensors = r->plan->nt;
            snprintf(res->backend, sizeof res->backend, "none (up to date)");
        }
        goto cleanup;
    }
    BFS_TRY(bfs__run_start(r, input));
    const double tf = bfs__now();
    r->t_files0 = tf;
    BFS_TRY(bfs__run_files(r, res));
    r->t_files = bfs__now() - tf;
    BFS_TRY(bfs__run_finish(r));
    if (res) {
        for (int f = 0; f < r->plan->nfiles; f++)
            res->files_reused += r->reused[f];
        res->bytes_written = atomic_load(&r->w.total);
        res->input_bytes_read = r->in_read; /* every header included (srchash.c) */
        res->source_bytes_hashed = r->src_read;
        res->tensors = r->plan->nt;
        res->host_buffer_bytes = (uint64_t)r->ring.n * r->ring.slot;
        bfs_wstages ws;
        bfs__writer_stages(&r->w, &ws);
        res->write_seconds = ws.write;
        bfs__busy(r, r->t_files, &res->busy_read, &res->busy_dequant, &res->busy_hash, &res->busy_write);
        res->writers = r->w.nlanes;
        res->gpu_buffer_bytes = r->be->device_bytes;
        snprintf(res->backend, sizeof res->backend, "%s", r->be->name);
    }
    if (r->o->progress)
        bfs__progress_run(r, "", true); /* the last report: every byte written */
cleanup:
    if (r->plan)
        bfs__count_kinds(r->in, r->plan, res);
    if (rc == 0)
        bfs__stages_print(r, bfs__now() - t0);
    bfs__run_free(r, rc);
    bfs__outdir_unlock(&r->lock, outdir, rc < 0);
    free(input);
    res->seconds = bfs__now() - t0;
    bfs__struct_out(res_arg, res, sizeof *res);
    return rc;
}
