/*
 * The plan's memory: the plan keeps no output header text (each
 * file's header is counted at layout and built when convert writes that file), its
 * per-tensor and per-piece state is compact, and small source tensors are hashed whole
 * at their first unit (no XXH3 state per tensor held from the first rank file to the
 * last). What must not change with it: every header byte for byte what jansson makes of
 * the same object (names that need escaping, mixed alignments, dcp and hf layouts), and
 * the source hashes the manifest records.
 */
#include "testutil.h"
#include "tu_st.h"
#include "bfs_internal.h"
#include "bfshard.h"
#include "formats/format.h"
#include "output/writer.h"

#include <jansson.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* DIR/model.safetensors of nt tensors named names (sorted here), dtype and rows by index;
 * data bytes i * 7 + k */
static void write_input(const char *dir, char **names, size_t nt, const char *(*dtype_of)(size_t),
                        size_t (*rows_of)(size_t), size_t cols)
{
    qsort(names, nt, sizeof *names, cmp_str);
    json_t *h = json_object();
    size_t off = 0;
    for (size_t i = 0; i < nt; i++) {
        const char *dt = dtype_of(i);
        const size_t es = !strcmp(dt, "F32") ? 4 : !strcmp(dt, "I64") ? 8 : !strcmp(dt, "U8") ? 1 : 2;
        const size_t rows = rows_of(i), nb = rows * cols * es;
        json_object_set_new(h, names[i], json_pack("{s:s, s:[I, I], s:[I, I]}", "dtype", dt, "shape", (json_int_t)rows,
                                                   (json_int_t)cols, "data_offsets", (json_int_t)off,
                                                   (json_int_t)(off + nb)));
        off += nb;
    }
    char *text = json_dumps(h, JSON_COMPACT);
    assert_non_null(text);
    const size_t n = strlen(text), hl = (n + 7) / 8 * 8;
    uint8_t *buf = malloc(8 + hl + off);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, text, n);
    memset(buf + 8 + n, ' ', hl - n);
    for (size_t k = 0; k < off; k++)
        buf[8 + hl + k] = (uint8_t)(k * 7 + k / 251);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(tu_write_file(path, buf, 8 + hl + off), 0);
    free(buf);
    free(text);
    json_decref(h);
}

/* nt names from fmt (one %zu: the index) */
static char **numbered_names(size_t nt, const char *fmt)
{
    char **names = calloc(nt, sizeof *names);
    assert_non_null(names);
    for (size_t i = 0; i < nt; i++) {
        char b[128];
        snprintf(b, sizeof b, fmt, i);
        names[i] = strdup(b);
    }
    return names;
}

/* a case's names and scratch folder, gone */
static void case_free(char *tmp, char **names, size_t nt)
{
    for (size_t i = 0; i < nt; i++)
        free(names[i]);
    free(names);
    tu_rmrf(tmp);
    free(tmp);
}

/* the plan of dir's input at world size W, laid out */
static bfs_plan *plan_of(const char *dir, int world, bfs_input **in)
{
    bfs_convert_opts o;
    bfs_convert_opts_init(&o);
    o.world_size = world;
    bfs_plan *p = NULL;
    assert_int_equal(bfs__input_open(dir, in), 0);
    assert_int_equal(bfs__plan_tensors(*in, &o, &p), 0);
    assert_int_equal(bfs__plan_layout(p, &o), 0);
    return p;
}

static const char *mixed_dtype(size_t i)
{
    static const char *const d[] = {"BF16", "F32", "I64", "U8", "F16"};
    return d[i % 5];
}
static size_t mixed_rows(size_t i) { return i % 11; } /* 0: a zero-element tensor; fewer rows than ranks */

/* The header jansson makes of the plan's file: pieces in the upstream writer's order
 * (alignment descending, then name), computed here independently of plan.c. */
typedef struct {
    const bfs_plan *p;
    const bfs_piece *pc;
} piece_ref;

static int cmp_upstream(const void *a, const void *b)
{
    const piece_ref *x = a, *y = b;
    const bfs_ltensor *tx = &x->p->t[x->pc->tensor], *ty = &y->p->t[y->pc->tensor];
    const size_t ax = bfs__dtype_size(tx->out_dtype), ay = bfs__dtype_size(ty->out_dtype);
    if (ax != ay)
        return ax > ay ? -1 : 1;
    return strcmp(tx->name, ty->name);
}

static json_t *shape_json(const uint64_t *s, int n)
{
    json_t *a = json_array();
    for (int d = 0; d < n; d++)
        json_array_append_new(a, json_integer((json_int_t)s[d]));
    return a;
}

static char *expected_header(const bfs_plan *p, const bfs_outfile *f)
{
    piece_ref *v = calloc(f->npieces + 1, sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < f->npieces; i++)
        v[i] = (piece_ref){p, &f->pieces[i]};
    qsort(v, f->npieces, sizeof *v, cmp_upstream);
    for (size_t i = 0; i < f->npieces; i++) /* the plan's order is the upstream one */
        assert_ptr_equal(v[i].pc, &f->pieces[i]);
    json_t *root = json_object(), *meta = json_object(), *info = json_object();
    json_object_set_new(root, "__metadata__", meta);
    uint64_t pos = 0;
    for (size_t i = 0; i < f->npieces; i++) {
        const bfs_piece *pc = v[i].pc;
        const bfs_ltensor *t = &p->t[pc->tensor];
        uint64_t shape[BFS_MAX_DIMS], so[BFS_MAX_DIMS] = {0};
        memcpy(shape, t->shape, sizeof shape);
        if (t->ndim > 0)
            shape[0] = pc->row1 - pc->row0;
        so[0] = pc->row0;
        json_object_set_new(info, t->name, json_pack("{s:o}", "saved_offsets", shape_json(so, t->ndim)));
        json_object_set_new(root, t->name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", bfs__dtype_name(t->out_dtype),
                                                     "shape", shape_json(shape, t->ndim), "data_offsets",
                                                     (json_int_t)pos, (json_int_t)(pos + pc->nbytes)));
        assert_int_equal(pc->offset, f->data_start + pos);
        pos += pc->nbytes;
    }
    if (p->layout == BFS_LAYOUT_DCP) {
        char *it = json_dumps(info, JSON_COMPACT);
        json_object_set_new(meta, "DCP_SHARDING_INFO", json_string(it));
        json_object_set_new(meta, "DCP_VERSION", json_string("1.0"));
        free(it);
    }
    json_decref(info);
    json_object_set_new(meta, "format", json_string("pt"));
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    free(v);
    assert_non_null(text);
    const size_t n = strlen(text), hl = ((8 + n + 63) / 64) * 64 - 8;
    char *out = malloc(hl + 1);
    memcpy(out, text, n);
    memset(out + n, ' ', hl - n);
    out[hl] = '\0';
    free(text);
    assert_int_equal(f->size, f->data_start + pos);
    return out;
}

/* 1: every file's header, built on demand, is jansson's, and as long as the layout counted */
static void header_built_on_demand_is_jansson(void **s)
{
    (void)s;
    static const char *odd[] = {"q\"uote\"", "back\\slash\\", "ctl\x01\x02\t\n\r\x1f\x7f", "caf\xc3\xa9.\xe6\x97\xa5",
                                "emoji\xf0\x9f\x98\x80", "\\\"both\\\"", "slash/and space", "{\"json\":[1]}"};
    const size_t nodd = sizeof odd / sizeof *odd, nt = 300;
    char *tmp = tu_tmpdir("plhdr");
    char **names = calloc(nt, sizeof *names);
    for (size_t i = 0; i < nt; i++) {
        char b[128];
        if (i < nodd)
            snprintf(b, sizeof b, "%s", odd[i]);
        else
            snprintf(b, sizeof b, "model.layers.%zu.w%s%zu", i / 3, i % 2 ? "\"q" : "\\b", i);
        names[i] = strdup(b);
    }
    write_input(tmp, names, nt, mixed_dtype, mixed_rows, 3);
    bfs_input *in = NULL;
    assert_int_equal(bfs__input_open(tmp, &in), 0);
    static const struct {
        int world, layout, keep;
        uint64_t shard;
    } cases[] = {{1, BFS_LAYOUT_DCP, 1, 0}, {3, BFS_LAYOUT_DCP, 1, 0}, {8, BFS_LAYOUT_DCP, 1, 0},
                 {8, BFS_LAYOUT_DCP, 0, 0}, {1, BFS_LAYOUT_HF, 1, 0}, {1, BFS_LAYOUT_HF, 1, 2000}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        bfs_convert_opts o;
        bfs_convert_opts_init(&o);
        o.world_size = cases[c].world;
        o.layout = cases[c].layout;
        o.keep_dtype = cases[c].keep;
        o.max_shard_size = cases[c].shard;
        bfs_plan *p = NULL;
        assert_int_equal(bfs__plan_tensors(in, &o, &p), 0);
        assert_int_equal(bfs__plan_layout(p, &o), 0);
        if (cases[c].shard)
            assert_true(p->nfiles > 1);
        for (int f = 0; f < p->nfiles; f++) {
            char *got = NULL, *want = expected_header(p, &p->files[f]);
            assert_int_equal(bfs__plan_header(p, &p->files[f], &got), 0);
            assert_int_equal(strlen(got), p->files[f].data_start - 8);
            if (strcmp(got, want) != 0)
                fail_msg("case %zu file %d: header differs from jansson's:\n%.300s\n%.300s", c, f, got, want);
            free(got);
            free(want);
        }
        bfs__plan_free(p);
    }
    bfs__input_free(in);
    case_free(tmp, names, nt);
}

/* 2: the plan's heap after layout: no header text, compact tensors and pieces. Before
 * this change the plan of 20000 tensors at W = 8 held ~180 bytes of header text per
 * piece and 456 bytes per tensor entry. */
static const char *bf16(size_t i) { return (void)i, "BF16"; }
static size_t eight_rows(size_t i) { return (void)i, 8; }

static void plan_heap_per_piece(void **s)
{
    (void)s;
    const size_t nt = 20000;
    char *tmp = tu_tmpdir("plmem");
    char **names = calloc(nt, sizeof *names);
    for (size_t i = 0; i < nt; i++) {
        char b[128];
        snprintf(b, sizeof b, "model.layers.%zu.mlp.experts.%zu.weight", i / 100, i % 100);
        names[i] = strdup(b);
    }
    write_input(tmp, names, nt, bf16, eight_rows, 4);
    bfs_input *in = NULL;
    assert_int_equal(bfs__input_open(tmp, &in), 0);
    bfs_convert_opts o;
    bfs_convert_opts_init(&o);
    o.world_size = 8;
    bfs_plan *p = NULL;
    malloc_trim(0);
    const size_t before = mallinfo2().uordblks;
    assert_int_equal(bfs__plan_tensors(in, &o, &p), 0);
    assert_int_equal(bfs__plan_layout(p, &o), 0);
    const size_t held = mallinfo2().uordblks - before;
    size_t pieces = 0;
    for (int f = 0; f < p->nfiles; f++)
        pieces += p->files[f].npieces;
    assert_int_equal(pieces, 8 * nt);
    print_message("plan of %zu tensors, %zu pieces: %zu bytes (%.1f per piece)\n", nt, pieces, held,
                  (double)held / (double)pieces);
    /* per tensor: the entry (264) + its name; per piece: 40 */
    if (held > nt * 360 + pieces * 48)
        fail_msg("the plan holds %zu bytes for %zu tensors and %zu pieces: more than 360 per tensor + 48 per piece",
                 held, nt, pieces);
    bfs__plan_free(p);
    bfs__input_free(in);
    case_free(tmp, names, nt);
}

/* 2b: the pages a batch drops from the page cache (inward) are read by no piece of any
 * other rank file; outward, they would be (small slices share pages across ranks) */
typedef struct {
    int file;
    uint64_t a, b;
} src_rng;

/* A lazy plan (convert's, inspect's: plan.h) holds no rank file's pieces after its layout;
 * made again, each file's are the eager layout's exactly, with the same size, header length,
 * largest piece and row; dropped, none is held. Parts (an `only` mask) too: their other
 * files never get any. Mixed dtypes, fewer rows than ranks, zero-element tensors. */
static void lazy_pieces_are_the_layouts(void **s)
{
    (void)s;
    const size_t nt = 300;
    char *tmp = tu_tmpdir("pllazy");
    char **names = numbered_names(nt, "model.layers.%zu.w");
    write_input(tmp, names, nt, mixed_dtype, mixed_rows, 8);
    static const int worlds[] = {1, 3, 8, 64};
    for (size_t k = 0; k < sizeof worlds / sizeof *worlds; k++)
        for (int part = 0; part < 2; part++) {
            const int W = worlds[k];
            bfs_convert_opts o;
            bfs_convert_opts_init(&o);
            o.world_size = W;
            bool *only = calloc((size_t)W, sizeof *only);
            for (int r = 0; r < W; r++)
                only[r] = !part || r % 3 == 1;
            bfs_input *in = NULL;
            bfs_plan *e = plan_of(tmp, W, &in), *l = NULL;
            assert_int_equal(bfs__plan_tensors(in, &o, &l), 0);
            l->lazy = true;
            assert_int_equal(bfs__plan_layout_for(l, &o, part ? only : NULL), 0);
            assert_int_equal(l->nfiles, e->nfiles);
            assert_int_equal(l->total_bytes, e->total_bytes);
            for (int f = 0; f < l->nfiles; f++) {
                bfs_outfile *lf = &l->files[f];
                const bfs_outfile *ef = &e->files[f];
                assert_null(lf->pieces);
                if (!only[f]) { /* another part's: never laid out */
                    assert_int_equal(lf->npieces, 0);
                    assert_int_not_equal(bfs__plan_pieces(l, f), 0);
                    bfs__err_clear();
                    continue;
                }
                assert_int_equal(lf->size, ef->size);
                assert_int_equal(lf->data_start, ef->data_start);
                assert_int_equal(lf->max_piece, ef->max_piece);
                assert_int_equal(lf->max_row, ef->max_row);
                assert_int_equal(bfs__plan_pieces(l, f), 0);
                assert_int_equal(lf->npieces, ef->npieces);
                for (size_t i = 0; i < ef->npieces; i++) { /* field by field: not the padding */
                    const bfs_piece *a = &lf->pieces[i], *b = &ef->pieces[i];
                    assert_int_equal(a->tensor, b->tensor);
                    assert_int_equal(a->row0, b->row0);
                    assert_int_equal(a->row1, b->row1);
                    assert_int_equal(a->offset, b->offset);
                    assert_int_equal(a->nbytes, b->nbytes);
                }
                bfs__plan_pieces_drop(l, f);
                assert_null(lf->pieces);
            }
            bfs__plan_free(e);
            bfs__plan_free(l);
            bfs__input_free(in);
            free(only);
        }
    case_free(tmp, names, nt);
}

static void dropped_pages_are_read_once(void **s)
{
    (void)s;
    const size_t nt = 600;
    char *tmp = tu_tmpdir("pldrop");
    char **names = numbered_names(nt, "t.%04zu");
    write_input(tmp, names, nt, mixed_dtype, mixed_rows, 300); /* rows of 300..2400 bytes */
    bfs_input *in = NULL;
    bfs_plan *p = plan_of(tmp, 3, &in);
    size_t cap = 0, n = 0;
    for (int f = 0; f < p->nfiles; f++)
        cap += p->files[f].npieces * BFS_UNIT_MAX_SRC;
    src_rng *all = calloc(cap + 1, sizeof *all);
    bfs_prange *pr = calloc(cap + 1, sizeof *pr);
    int *owner = calloc(cap + 1, sizeof *owner);
    for (int f = 0; f < p->nfiles; f++) /* every source byte range each rank file reads */
        for (size_t k = 0; k < p->files[f].npieces; k++) {
            const bfs_piece *pc = &p->files[f].pieces[k];
            if (pc->row0 == pc->row1)
                continue;
            bfs_srange sr[BFS_UNIT_MAX_SRC];
            const bfs_unit u = {.t = &p->t[pc->tensor], .row0 = pc->row0, .row1 = pc->row1};
            for (int i = 0, ns = bfs__unit_sources(&u, sr); i < ns; i++)
                if (sr[i].len) {
                    all[n] = (src_rng){sr[i].r->file, sr[i].r->file_offset + sr[i].off,
                                       sr[i].r->file_offset + sr[i].off + sr[i].len};
                    owner[n++] = f;
                }
        }
    size_t dropped = 0, shared_outward = 0;
    for (int f = 0; f < p->nfiles; f++)
        for (int inward = 0; inward < 2; inward++) {
            const size_t m = bfs__batch_pages(p, &p->files[f], 0, p->files[f].npieces, 4096, inward, pr);
            for (size_t i = 0; i < m; i++)
                for (size_t j = 0; j < n; j++)
                    if (owner[j] != f && all[j].file == pr[i].file && all[j].a < pr[i].b && pr[i].a < all[j].b) {
                        if (inward)
                            fail_msg("rank file %d drops [%llu, %llu), which rank file %d reads", f,
                                     (unsigned long long)pr[i].a, (unsigned long long)pr[i].b, owner[j]);
                        shared_outward++;
                    }
            if (inward)
                dropped += m;
        }
    assert_true(dropped > 0);        /* large slices still leave the cache */
    assert_true(shared_outward > 0); /* the case the inward rounding is for */
    free(all), free(pr), free(owner);
    bfs__plan_free(p);
    bfs__input_free(in);
    case_free(tmp, names, nt);
}

/* 3: source hashes of small tensors (a block hashed in one call) and of large ones (blocks
 * streamed over several units), at W = 1 and 3, as the definition gives them */
static const char *f32(size_t i) { return (void)i, "F32"; }
static size_t small_and_large(size_t i) { return i % 4 == 0 ? 3000 : 1 + i % 9; } /* 3000 x 8 x 4 = 96000 bytes */


static void source_hash_small_whole_large_streamed(void **s)
{
    (void)s;
    const size_t nt = 40;
    char *tmp = tu_tmpdir("plsrc");
    char in[4096], out[4096], mp[4096], want[1][33];
    snprintf(in, sizeof in, "%s/in", tmp);
    assert_int_equal(tu_sh("mkdir -p '%s'", in), 0);
    char **names = numbered_names(nt, "t.%03zu");
    write_input(in, names, nt, f32, small_and_large, 8);
    for (int world = 1; world <= 3; world += 2) {
        for (int m = 0; m < 2; m++) {
            bfs_convert_opts o;
            bfs_convert_opts_init(&o);
            o.world_size = world;
            o.device = "cpu";
            st_source_hashes(in, &o, want);
            o.mem = m ? 64 << 10 : 0; /* small: the large tensors in several units per rank */
            snprintf(out, sizeof out, "%s/o%d-%d", tmp, world, m);
            if (bfs_convert(in, out, &o, NULL) != 0)
                fail_msg("W=%d: %s", world, bfs_last_error());
            snprintf(mp, sizeof mp, "%s/bfshard.manifest.json", out);
            json_t *mf = json_load_file(mp, 0, NULL);
            const json_t *files = json_object_get(json_object_get(mf, "source"), "files");
            assert_int_equal(json_array_size(files), 1);
            assert_string_equal(json_string_value(json_object_get(json_array_get(files, 0), "content_xxh3_128")), want[0]);
            json_decref(mf);
            assert_int_equal(bfs_verify(out, NULL, NULL), 0);
        }
    }
    case_free(tmp, names, nt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(header_built_on_demand_is_jansson),
        cmocka_unit_test(plan_heap_per_piece),
        cmocka_unit_test(lazy_pieces_are_the_layouts),
        cmocka_unit_test(dropped_pages_are_read_once),
        cmocka_unit_test(source_hash_small_whole_large_streamed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
