/* bfs_inspect: what is in INPUT, what bfshard will make of it, and the memory it needs:
 * the peak RSS of `convert --device cpu` with the same options, predicted as the
 * program's own pages, the input headers and the plan (bfs__base_rss) + the unit
 * buffers' touched pages + the mapped input pages of
 * the largest unit + the writer's carry, the source-hash window and thread stacks
 * (the memory model: src/output/units.c). `make bench` checks it against measured peaks. */
#include "commands/commands.h"
#include "backend/backend.h"
#include "plan/plan.h"
#include "formats/format.h"
#include "input/srchash.h"
#include "output/parts.h"
#include "output/units.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void bfs__shape_fmt(const uint64_t *s, int n, char *buf, size_t cap)
{
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < n && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, d ? ", %llu" : "%llu", (unsigned long long)s[d]);
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
}

static json_t *bfs__shape_j(const uint64_t *s, int n)
{
    json_t *a = json_array();
    for (int d = 0; d < n; d++)
        json_array_append_new(a, json_integer((json_int_t)s[d]));
    return a;
}

/* A part's bytes: written (its rank files), read (every header, its units' source
 * ranges, what it reads only to hash) and covered by its source-hash terms: convert's own
 * count (srchash.c), its pieces fed to a source hash that hashes nothing. */
typedef struct {
    bool *mine;
    char list[128], how[192];
    uint64_t write, read, hashed;
    uint64_t device; /* what the storage delivers: the pages a part asks for (headers, its ranges) */
} bfs_part_plan;

static int bfs__inspect_part(const bfs_input *in, const bfs_plan *p, const bfs_convert_opts *o, bfs_part_plan *pp)
{
    if (p->layout != BFS_LAYOUT_DCP || p->nfiles != o->world_size)
        return bfs__err(BFS_EUSAGE, "--ranks is for --layout dcp (one file per rank)");
    if (!(pp->mine = calloc((size_t)p->nfiles, sizeof *pp->mine)))
        return bfs__err(BFS_ENOMEM, "out of memory");
    int rc = bfs__ranks_resolve(o, pp->mine, pp->how, sizeof pp->how);
    if (rc == 0)
        rc = bfs__ranks_format(pp->mine, o->world_size, pp->list, sizeof pp->list);
    if (rc < 0)
        return rc;
    bool *unit_read = calloc(in->nraw + 1, sizeof *unit_read);
    bfs_srchash *h = NULL;
    if (!unit_read)
        return bfs__err(BFS_ENOMEM, "out of memory");
    bfs__sources_read(p->t, p->nt, in->raw, unit_read);
    rc = bfs__srchash_create(in, unit_read, pp->mine[0], true, &h);
    for (int f = 0; f < p->nfiles && rc == 0; f++) {
        if (!pp->mine[f])
            continue;
        pp->write += p->files[f].size;
        rc = bfs__plan_pieces((bfs_plan *)p, f); /* a lazy plan's, made for this walk and dropped */
        if (rc == 0) /* the pages it reads ahead of its units (bfs__prefetch_ahead), counted */
            bfs__prefetch_pieces(in, p, &p->files[f], 0, p->files[f].npieces, &pp->device);
        for (size_t k = 0; k < p->files[f].npieces && rc == 0; k++) {
            const bfs_piece *pc = &p->files[f].pieces[k];
            const bfs_ltensor *t = &p->t[pc->tensor];
            bfs_ucur cur = bfs__ucur(t, pc->row0, pc->row1);
            bfs_unit u = {.t = t, .row0 = pc->row0, .row1 = pc->row1};
            uint64_t a = pc->row0, b = pc->row1;
            for (bool more = t->members ? bfs__ucur_next(&cur, UINT64_MAX, &u, &a, &b) : true; more && rc == 0;
                 more = t->members && bfs__ucur_next(&cur, UINT64_MAX, &u, &a, &b)) { /* as convert hashes */
                bfs_srange sr[BFS_UNIT_MAX_SRC], blk[BFS_UNIT_MAX_SRC];
                const int ns = bfs__unit_hash_blocks(&u, a, b, sr, blk);
                rc = ns < 0 ? ns : bfs__srchash_ranges(h, sr, blk, ns);
            }
        }
        bfs__plan_pieces_drop((bfs_plan *)p, f);
    }
    const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < in->nfiles; i++) /* each header, read alone */
        pp->device += (in->files[i].h.data_start + pg - 1) / pg * pg;
    if (rc == 0)
        rc = bfs__srchash_finish(h, NULL);
    if (rc == 0)
        bfs__srchash_bytes(h, &pp->read, &pp->hashed);
    bfs__srchash_free(h);
    free(unit_read);
    return rc;
}

/* The tensors the model keeps in float32 (src/plan/fp32.c): one note line. */
static void bfs__fp32_note(FILE *out, const bfs_plan *p)
{
    char line[1024];
    if (bfs__fp32_summary(p, line, sizeof line))
        fprintf(out, "\nnote: %s\n", line);
}

/* One tensor of inspect --json: what it is, and its sources (a packed tensor: its members'). */
static json_t *bfs__tensor_json(const bfs_input *in, const bfs_ltensor *t)
{
    json_t *src = json_array();
    for (size_t m = 0; m < bfs__nparts(t); m++) {
        const bfs_ltensor *pt = bfs__part(t, m);
        for (int k = 0; k < pt->nsrc; k++)
            json_array_append_new(src, json_pack("{s:s, s:s, s:o, s:s}", "name", pt->src[k]->st->name, "dtype",
                                                 bfs__dtype_name(pt->src[k]->st->dtype), "shape",
                                                 bfs__shape_j(pt->src[k]->st->shape, pt->src[k]->st->ndim), "file",
                                                 in->files[pt->src[k]->file].name));
    }
    json_t *e = json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o}", "name", t->name, "format", bfs__kind_name(t), "action",
                          bfs__kind_action(t), "dtype", bfs__dtype_name(t->out_dtype), "shape",
                          bfs__shape_j(t->shape, t->ndim), "transform", t->transform, "sources", src);
    if (e && t->rule)
        json_object_set_new(e, "rule", json_string(t->rule));
    if (e && t->keep_fp32) /* as the manifest says it (src/plan/fp32.c) */
        json_object_set_new(e, "dtype_rule", json_pack("{s:s, s:s}", "keeps_float32", t->fp32_why, "pattern", t->fp32_pat));
    return e;
}

/* The output names: the table's row applied and, for packed experts, how many experts each
 * rank holds (torch.chunk of dim 0: whole experts); or the warning that per-expert tensors
 * keep checkpoint names. As JSON (names) and as text (out, when not NULL). */
static json_t *bfs__names_info(const bfs_plan *p, const bfs_convert_opts *o, FILE *out)
{
    size_t npk = 0, nmem = 0;
    uint64_t E = 0;
    for (size_t i = 0; i < p->nt; i++)
        if (p->t[i].members) {
            npk++;
            nmem += bfs__nparts(&p->t[i]);
            E = p->t[i].d0 > E ? p->t[i].d0 : E;
        }
    json_t *per = json_array();
    char list[256] = "";
    size_t k = 0;
    for (int r = 0; npk && p->layout == BFS_LAYOUT_DCP && r < o->world_size; r++) {
        uint64_t a, b;
        bfs__chunk_rows(E, (uint64_t)o->world_size, (uint64_t)r, &a, &b);
        json_array_append_new(per, json_integer((json_int_t)(b - a)));
        if (k + 32 < sizeof list)
            k += (size_t)snprintf(list + k, sizeof list - k, r ? ", %llu" : "%llu", (unsigned long long)(b - a));
        else if (k + 4 < sizeof list)
            k += (size_t)snprintf(list + k, sizeof list - k, ", ...");
    }
    const char *mode = p->names_family ? "transformers" : p->names_target ? p->names_target : "checkpoint";
    json_t *j = json_pack("{s:s, s:s?, s:I, s:I, s:I, s:o}", "mode", mode,
                          "table", p->names_family, "packed_tensors", (json_int_t)npk, "from_tensors", (json_int_t)nmem,
                          "experts", (json_int_t)E, "experts_per_rank", per);
    if (j && p->names_unmapped)
        json_object_set_new(j, "per_expert_unmapped", json_integer((json_int_t)p->names_unmapped));
    if (out && p->names_family)
        fprintf(out, "\nnames: transformers 5's state_dict (the table's row \"%s\", docs/NAMES.md): %zu packed expert "
                "tensors from %zu per-expert ones%s%s%s\n", p->names_family, npk, nmem, npk && list[0] ? "; experts per rank: " : "",
                npk ? list : "", npk && E % (uint64_t)o->world_size ? " (W does not divide E: torch.chunk)" : "");
    if (j && p->names_target)
        json_object_set_new(j, "whole_experts", json_integer((json_int_t)p->tt_experts));
    if (out && p->names_target)
        fprintf(out, "\nnames: checkpoint names, for torchtitan (docs/NAMES.md): %zu per-expert tensor(s) of %llu experts whole "
                "in their owner's rank file%s\n", p->tt_experts, (unsigned long long)p->tt_E,
                p->tt_E && (uint64_t)o->world_size > p->tt_E ? " (W > E: every expert's rows on every rank)" : "");
    if (out && p->names_unmapped)
        fprintf(out, "\nwarning: %zu per-expert tensor(s) keep their checkpoint names (%s): transformers 5 packs "
                "experts on load, so DCP will not load them into its model\n", p->names_unmapped,
                o->names == BFS_NAMES_CHECKPOINT ? "--names checkpoint" : "model type not in the table, docs/NAMES.md");
    return j;
}

int bfs_inspect(const char *input_arg, const bfs_convert_opts *o_arg, int as_json, FILE *out)
{
    int rc = 0;
    bfs_input *in = NULL;
    bfs_plan *p = NULL;
    bfs_convert_opts opts, *o = &opts;
    json_t *root = NULL;
    bfs_part_plan pp = {0};
    char *input = NULL;
    bfs__err_clear();
    bfs_convert_opts_init(o);
    BFS_TRY(bfs__struct_in(o, sizeof *o, o_arg, "bfs_convert_opts"));
    if (o->world_size < 1)
        BFS_FAIL(BFS_EUSAGE, "--world-size must be at least 1");
    BFS_TRY(bfs__hf_resolve_dup(input_arg, o->revision, &input));
    if (bfs__inspect_is_outdir(input)) { /* what bfshard wrote (inspect_out.c) */
        rc = bfs__inspect_outdir(input, as_json, out);
        goto cleanup;
    }
    if (bfs__inspect_is_zst(input)) {
        rc = bfs__inspect_zst(input, as_json, out);
        goto cleanup;
    }
    BFS_TRY(bfs__input_open(input, &in));
    BFS_TRY(bfs__plan_tensors(in, o, &p));
    p->lazy = true; /* as convert's: each file's pieces made when walked (plan.h) */
    BFS_TRY(bfs__plan_layout(p, o));
    if (o->ranks)
        BFS_TRY(bfs__inspect_part(in, p, o, &pp));
    /* what convert will allocate: its rule, bfs__ring_budget */
    uint64_t mem = 0;
    BFS_TRY(bfs__pick_mem(in, p, pp.mine, o, &mem));
    bfs_ring ring;
    const bool fits = bfs__ring_budget(p, pp.mine, mem, &ring); /* --ranks: the files convert writes */
    const uint64_t peak = (uint64_t)ring.n * ring.slot;
    bfs_mem_model mm = {0};
    uint64_t rss = 0;
    if (fits)
        BFS_TRY(bfs__predict_rss(p, pp.mine, mem, o->threads, bfs__base_rss(in, p, pp.mine), &mm, &rss));
    uint64_t in_bytes = 0;
    for (int i = 0; i < in->nfiles; i++)
        in_bytes += in->files[i].size;

    root = json_object();
    json_t *jfiles = json_array(), *jt = json_array(), *jranks = json_array();
    for (int i = 0; i < in->nfiles; i++)
        json_array_append_new(jfiles, json_pack("{s:s, s:I, s:I}", "name", in->files[i].name, "size",
                                                (json_int_t)in->files[i].size, "tensors", (json_int_t)in->files[i].h.n));
    for (size_t i = 0; i < p->nt; i++)
        json_array_append_new(jt, bfs__tensor_json(in, &p->t[i]));
    json_t *jdrop = json_array();
    for (size_t i = 0; i < p->ndropped; i++)
        json_array_append_new(jdrop, json_string(p->dropped[i]));
    for (int f = 0; f < p->nfiles; f++) {
        const bfs_outfile *of = &p->files[f];
        if (pp.mine && !pp.mine[f])
            continue;
        json_array_append_new(jranks, json_pack("{s:i, s:s, s:I, s:I}", "index", f, "file", of->name, "tensors",
                                                (json_int_t)of->npieces, "bytes", (json_int_t)of->size));
    }
    json_object_set_new(root, "input", json_string(input));
    json_object_set_new(root, "files", jfiles);
    json_object_set_new(root, "tensors", jt);
    json_object_set_new(root, "dropped", jdrop);
    json_object_set_new(root, "names", bfs__names_info(p, o, NULL));
    json_object_set_new(root, "world_size", json_integer(o->world_size));
    json_object_set_new(root, "layout", json_string(o->layout == BFS_LAYOUT_HF ? "hf" : "dcp"));
    json_object_set_new(root, "outputs", jranks);
    json_object_set_new(root, "output_bytes", json_integer((json_int_t)p->total_bytes));
    if (pp.mine)
        json_object_set_new(root, "part", json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I}", "ranks", pp.list, "from",
                                                    pp.how[0] ? pp.how : "--ranks", "bytes_to_write",
                                                    (json_int_t)pp.write, "bytes_to_read", (json_int_t)pp.read,
                                                    "device_bytes_to_read", (json_int_t)pp.device,
                                                    "source_bytes_to_hash", (json_int_t)pp.hashed, "input_bytes",
                                                    (json_int_t)in_bytes));
    json_object_set_new(root, "memory", json_pack("{s:I, s:I, s:i, s:I, s:I, s:I, s:b, s:I, s:i}", "budget", (json_int_t)mem,
                                                  "host_buffers", (json_int_t)peak, "buffers", ring.n, "buffer_bytes",
                                                  (json_int_t)ring.slot, "unit_bytes", (json_int_t)ring.unit,
                                                  "smallest_unit", (json_int_t)p->max_row_bytes, "fits", fits, "min_mem",
                                                  (json_int_t)(2 * p->max_row_bytes), "group", o->compress_level ? 1 : mm.group));
    json_object_set_new(json_object_get(root, "memory"), "peak_rss",
                        json_pack("{s:I, s:I, s:I, s:I, s:I}", "predicted", (json_int_t)rss, "buffers_touched",
                                  (json_int_t)mm.buffers, "input_in_flight", (json_int_t)mm.input, "fixed",
                                  (json_int_t)mm.fixed, "process", (json_int_t)(rss ? rss - mm.buffers - mm.input - mm.fixed : 0)));

    if (as_json) {
        char *s = bfs__json_show(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER); /* DEL, C1 escaped too */
        if (!s)
            BFS_FAIL(BFS_ENOMEM, "out of memory");
        fprintf(out, "%s\n", s);
        free(s);
    } else {
        char shp[256], ei[BFS_ESC_MAX];
        fprintf(out, "input: %s (%d file%s, %.3f MB)\n", bfs__esc_text(input, ei, sizeof ei), in->nfiles, in->nfiles == 1 ? "" : "s", (double)in_bytes / 1e6);
        fprintf(out, "%-60s %-14s %-11s %-6s %s\n", "tensor", "format", "action", "dtype", "shape");
        for (size_t i = 0; i < p->nt; i++) {
            const bfs_ltensor *t = &p->t[i];
            bfs__shape_fmt(t->shape, t->ndim, shp, sizeof shp);
            char en[BFS_ESC_MAX]; /* a name read from the file: escaped, never raw control bytes */
            fprintf(out, "%-60s %-14s %-11s %-6s %s\n", bfs__esc(t->name, en, sizeof en), bfs__kind_name(t),
                    bfs__kind_action(t), bfs__dtype_name(t->out_dtype), shp);
        }
        for (size_t i = 0; i < p->ndropped; i++) {
            char en[BFS_ESC_MAX]; /* likewise */
            fprintf(out, "%-60s %-14s %-11s (activation or KV-cache scale: no meaning in BF16)\n",
                    bfs__esc(p->dropped[i], en, sizeof en), "-", "dropped");
        }
        bfs__fp32_note(out, p);
        json_decref(bfs__names_info(p, o, out));
        fprintf(out, "\nplan: --layout %s --world-size %d, %.3f MB of output\n", o->layout == BFS_LAYOUT_HF ? "hf" : "dcp",
                o->world_size, (double)p->total_bytes / 1e6);
        if (pp.mine)
            fprintf(out, "part: ranks %s (%s): writes %llu bytes; reads %llu of the %llu input bytes (every header and "
                    "its ranks' rows; ~%llu from the storage, in whole pages), of which its terms of the source hashes cover %llu\n",
                    pp.list, pp.how[0] ? pp.how : "--ranks", (unsigned long long)pp.write, (unsigned long long)pp.read,
                    (unsigned long long)in_bytes, (unsigned long long)pp.device, (unsigned long long)pp.hashed);
        for (int f = 0; f < p->nfiles; f++) {
            char en[BFS_ESC_MAX]; /* made of the input's file names: escaped */
            if (!pp.mine || pp.mine[f])
                fprintf(out, "  %s %-50s %5zu tensors %14llu bytes\n", o->layout == BFS_LAYOUT_HF ? "file" : "rank",
                        bfs__esc(p->files[f].name, en, sizeof en), p->files[f].npieces, (unsigned long long)p->files[f].size);
        }
        fprintf(out, "\nmemory: host buffers %llu bytes (a ring of %d x %llu: units of ~%llu bytes, at most --mem/2 = "
                "%llu); smallest unit %llu bytes%s\n", (unsigned long long)peak, ring.n, (unsigned long long)ring.slot,
                (unsigned long long)ring.unit, (unsigned long long)(mem / 2), (unsigned long long)p->max_row_bytes,
                fits ? "" : " -- DOES NOT FIT: raise --mem");
        if (!fits)
            fprintf(out, "        use --mem %llu or more\n", (unsigned long long)(2 * p->max_row_bytes));
        else if (o->max_rss)
            fprintf(out, "        --max-rss %llu: --mem %llu\n", (unsigned long long)o->max_rss, (unsigned long long)mem);
        if (fits)
            fprintf(out, "        peak RSS of convert --device cpu: %.1f MB predicted (buffers %.1f + mapped input %.1f + "
                    "program, plan and headers %.1f + carries, headers held, hash window, stacks %.1f); rank files written %d at a time\n",
                    (double)rss / 1e6, (double)mm.buffers / 1e6, (double)mm.input / 1e6, (double)(rss - mm.buffers - mm.input - mm.fixed) / 1e6,
                    (double)mm.fixed / 1e6, o->compress_level ? 1 : mm.group);
    }
cleanup:
    free(pp.mine);
    json_decref(root);
    bfs__plan_free(p);
    bfs__input_free(in);
    free(input);
    return rc;
}
