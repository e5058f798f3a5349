/*
 * Target names (src/plan/names.c): the output as transformers 5's state_dict names and
 * shapes it.
 *   - the engine against transformers itself: tests/data/names-vectors.json, written by
 *     dev/names_table.py with transformers' own rename_source_key, key by key, for every
 *     model type of the table;
 *   - the layout: every fixture with per-expert tensors converted with target names at
 *     W = 1, 2, 3, 8 (dcp, units cut small) and hf equals its --names checkpoint output
 *     (itself compared with upstream's dequant by test_formats_e2e) rearranged: a packed
 *     tensor's experts stacked, gate rows before up rows, each rank holding whole experts
 *     by torch.chunk; a renamed tensor byte for byte; nothing else in the files;
 *   - what is refused (an expert missing or twice, members of two shapes) and what is said
 *     (a per-expert checkpoint left under checkpoint names: log, inspect, manifest);
 *   - --names torchtitan: each expert whole in its owner's rank file (W <= E), else as
 *     --names checkpoint, at W = 2, 3, 8 (torchtitan_placement).
 */
#include "tu_st.h"
#include "plan/plan.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

static const char *const moe_fixtures[] = {
    "fixtures/ct-moe-mixed", "fixtures/ct-mx-mixed", "fixtures/ct-mx6-mixed", "fixtures/dsv4-tiny",
    "fixtures/moe-dsv3-fp8", "fixtures/moe-glm4-fp8", "fixtures/moe-mixtral-fp8", "fixtures/moe-minimax-m2-fp8",
    "fixtures/moe-dsv4-fp8",
};

/* deepseek_v4's keys lack the base model's prefix; names.c adds it under these roots (the
 * interop load into DeepseekV4ForCausalLM checks them against the real model) */
static char *with_prefix(const char *type, const char *want)
{
    static const char *const roots[] = {"layers.", "embed_tokens.", "norm.", "hc_head."};
    if (strcmp(type, "deepseek_v4") == 0)
        for (size_t i = 0; i < sizeof roots / sizeof *roots; i++)
            if (strncmp(want, roots[i], strlen(roots[i])) == 0)
                return bfs__str_cat2("model.", want);
    return bfs__strdup(want);
}

static void engine_matches_transformers(void **s)
{
    (void)s;
    json_error_t je;
    json_t *d = json_load_file("tests/data/names-vectors.json", 0, &je);
    if (!d)
        fail_msg("tests/data/names-vectors.json: %s", je.text);
    const json_t *keys = json_object_get(d, "keys"), *groups = json_object_get(d, "groups");
    assert_true(json_array_size(keys) > 100 && json_array_size(groups) >= 5);
    size_t checked = 0, renamed = 0, packed = 0, refused = 0;
    for (size_t g = 0; g < json_array_size(groups); g++) {
        const json_t *grp = json_array_get(groups, g), *types = json_object_get(grp, "types"),
                     *changed = json_object_get(grp, "changed");
        for (size_t t = 0; t < json_array_size(types); t++) {
            const char *type = json_string_value(json_array_get(types, t));
            assert_non_null(bfs__names_family(type));
            for (size_t k = 0; k < json_array_size(keys); k++) {
                const char *key = json_string_value(json_array_get(keys, k));
                const json_t *c = json_object_get(changed, key);
                char *want = with_prefix(type, c ? json_string_value(c) : key), *got = NULL;
                uint64_t e = 0;
                int j = -1;
                const int rc = bfs__names_key(type, key, &got, &e, &j);
                if (rc == BFS_EINPUT && strstr(bfs_last_error(), "is not an expert number")) {
                    free(want); /* upstream would stack it by its name's order: refused, said so */
                    refused++;
                    continue;
                }
                if (rc != 0 || strcmp(got, want) != 0)
                    fail_msg("%s: \"%s\": bfshard names it \"%s\" (rc %d), transformers \"%s\"", type, key,
                             got ? got : "?", rc, want);
                renamed += c != NULL;
                packed += j >= 0;
                checked++;
                free(got);
                free(want);
            }
        }
    }
    assert_true(renamed > 100 && packed > 50 && refused > 0 && refused < 60);
    printf("  %zu keys over %zu groups of model types: equal to transformers' (%zu renamed, %zu packed); %zu refused "
           "(the expert wildcard took no number)\n", checked, json_array_size(groups), renamed, packed, refused);
    json_decref(d);
}

static char *model_type_of(const char *fx)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", fx);
    json_t *c = json_load_file(p, 0, NULL);
    char *t = c && json_is_string(json_object_get(c, "model_type"))
                  ? bfs__strdup(json_string_value(json_object_get(c, "model_type")))
                  : NULL;
    json_decref(c);
    assert_non_null(t);
    return t;
}

static void convert_ok(const char *in, const char *out, int W, int layout, int names, uint64_t mem)
{
    bfs_convert_opts o;
    bfs_convert_opts_init(&o);
    o.world_size = W;
    o.layout = layout;
    o.names = names;
    o.device = "cpu";
    o.force = 1;
    o.mem = mem;
    if (bfs_convert(in, out, &o, NULL) != 0)
        fail_msg("convert %s W=%d names=%d: %s", in, W, names, bfs_last_error());
    assert_int_equal(bfs_verify(out, NULL, NULL), 0);
}

/* out (target names) against ref (checkpoint names, W = 1) of one fixture */
static void check_layout(const char *type, const stfile *ref, const char *out, int W, bool hf)
{
    stfile *rk = calloc((size_t)W, sizeof *rk);
    char path[4096];
    size_t entries = 0, seen = 0;
    for (int r = 0; r < W; r++) {
        snprintf(path, sizeof path, hf ? "%s/model-00001-of-00001.safetensors" : "%s/shard-%05d-model-00001-of-00001.safetensors",
                 out, r + 1);
        if (st_load(path, &rk[r]) != 0)
            fail_msg("%s: missing or invalid", path);
        entries += rk[r].h.n;
    }
    /* each reference tensor: where its bytes must be */
    for (size_t i = 0; i < ref->h.n; i++) {
        const bfs_st_tensor *e = &ref->h.t[i];
        char *target = NULL;
        uint64_t ex = 0;
        int j = -1;
        assert_int_equal(bfs__names_key(type, e->name, &target, &ex, &j), 0);
        uint64_t row_bytes = bfs__dtype_size(e->dtype);
        for (int d = 1; d < e->ndim; d++)
            row_bytes *= e->shape[d];
        const uint64_t d0 = e->ndim ? e->shape[0] : 1, nb = d0 * row_bytes;
        for (int r = 0; r < W; r++) {
            const bfs_st_tensor *g = st_find(&rk[r], target);
            if (j < 0) { /* renamed or not: the same tensor, rank r's rows (a model buffer: whole, rank 0) */
                uint64_t a = 0, b = d0;
                const bool buffer = bfs__str_ends(target, ".e_score_correction_bias") || bfs__str_ends(target, ".tid2eid");
                if (!hf && e->ndim && buffer)
                    b = r == 0 ? d0 : 0;
                else if (!hf && e->ndim)
                    bfs__chunk_rows(d0, (uint64_t)W, (uint64_t)r, &a, &b);
                if (a == b) {
                    assert_null(g);
                    continue;
                }
                if (!g)
                    fail_msg("%s W=%d rank %d: \"%s\" (from \"%s\") missing", out, W, r, target, e->name);
                assert_int_equal(g->ndim, e->ndim);
                assert_int_equal(g->end - g->begin, (b - a) * row_bytes);
                if (memcmp(st_data(&rk[r], g), st_data(ref, e) + a * row_bytes, (size_t)((b - a) * row_bytes)) != 0)
                    fail_msg("%s W=%d rank %d: \"%s\" differs from \"%s\"", out, W, r, target, e->name);
                seen++;
                continue;
            }
            /* packed: expert ex's member j; rank r holds experts [a, b) whole */
            if (!g)
                continue; /* another rank's expert (checked below: every expert is somewhere) */
            assert_int_equal(g->ndim, e->ndim + 1);
            uint64_t lo = 0, hi = 0, Et = 0;
            /* the global E: the rank files' rows, summed (torch.chunk gives rank r rows [lo, hi)) */
            for (int q = 0; q < W; q++) {
                const bfs_st_tensor *gq = st_find(&rk[q], target);
                Et += gq ? gq->shape[0] : 0;
            }
            if (hf)
                lo = 0, hi = Et;
            else
                bfs__chunk_rows(Et, (uint64_t)W, (uint64_t)r, &lo, &hi);
            assert_int_equal(g->shape[0], hi - lo);
            if (ex < lo || ex >= hi)
                continue;
            const uint64_t J = g->shape[1] / d0;
            assert_true(J == 1 || J == 2);
            const uint64_t off = ((ex - lo) * J + (uint64_t)j) * nb;
            assert_true(g->begin + off + nb <= g->end);
            if (memcmp(st_data(&rk[r], g) + off, st_data(ref, e), (size_t)nb) != 0)
                fail_msg("%s W=%d rank %d: \"%s\" expert %llu member %d differs from \"%s\"", out, W, r, target,
                         (unsigned long long)ex, j, e->name);
            seen++;
        }
        free(target);
    }
    /* nothing else: every byte of every entry came from one reference tensor */
    uint64_t got = 0, want = 0;
    for (int r = 0; r < W; r++)
        for (size_t k = 0; k < rk[r].h.n; k++)
            got += rk[r].h.t[k].end - rk[r].h.t[k].begin;
    for (size_t i = 0; i < ref->h.n; i++)
        want += ref->h.t[i].end - ref->h.t[i].begin;
    assert_int_equal(got, want);
    assert_true(seen >= entries / 2);
    for (int r = 0; r < W; r++)
        st_free(&rk[r]);
    free(rk);
}

static void packed_equals_checkpoint(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("names");
    for (size_t f = 0; f < sizeof moe_fixtures / sizeof *moe_fixtures; f++) {
        char ref[4096], out[4096], path[4096];
        char *type = model_type_of(moe_fixtures[f]);
        snprintf(ref, sizeof ref, "%s/ref%zu", tmp, f);
        convert_ok(moe_fixtures[f], ref, 1, BFS_LAYOUT_DCP, BFS_NAMES_CHECKPOINT, 0);
        snprintf(path, sizeof path, "%s/shard-00001-model-00001-of-00001.safetensors", ref);
        stfile rf;
        if (st_load(path, &rf) != 0)
            fail_msg("%s: missing", path);
        static const int Ws[] = {1, 2, 3, 8};
        for (size_t w = 0; w < sizeof Ws / sizeof *Ws; w++) {
            snprintf(out, sizeof out, "%s/o%zu-%d", tmp, f, Ws[w]);
            convert_ok(moe_fixtures[f], out, Ws[w], BFS_LAYOUT_DCP, BFS_NAMES_AUTO, 16 << 10);
            check_layout(type, &rf, out, Ws[w], false);
        }
        snprintf(out, sizeof out, "%s/h%zu", tmp, f);
        convert_ok(moe_fixtures[f], out, 1, BFS_LAYOUT_HF, BFS_NAMES_TRANSFORMERS, 16 << 10);
        check_layout(type, &rf, out, 1, true);
        /* the manifest says which row named them, and per tensor the rule */
        assert_int_equal(tu_sh("grep -q '\"names\": *{\"table\": *\"%s\"' %s/o%zu-2/bfshard.manifest.json || "
                               "grep -q '\"table\": *\"%s\"' %s/o%zu-2/bfshard.manifest.json",
                               bfs__names_family(type), tmp, f, bfs__names_family(type), tmp, f), 0);
        assert_int_equal(tu_sh("grep -q 'MergeModulelist(dim=0)' %s/o%zu-2/bfshard.manifest.json", tmp, f), 0);
        st_free(&rf);
        free(type);
    }
    tu_rmrf(tmp);
    free(tmp);
}

/* A checkpoint of BF16 per-expert Linears, experts[0..n) of them, each [2, 4]; rows[i] != 0
 * gives expert i's up_proj that many rows instead. */
static void write_moe(const char *dir, const int *experts, size_t n, const char *model_type, const int *rows)
{
    char hdr[8192], path[4096];
    size_t k = 0, off = 0;
    k += (size_t)snprintf(hdr + k, sizeof hdr - k, "{");
    for (size_t i = 0; i < n; i++)
        for (int p = 0; p < 3; p++) {
            static const char *const proj[] = {"gate", "up", "down"};
            const int r = rows && rows[i] && p == 1 ? rows[i] : 2;
            k += (size_t)snprintf(hdr + k, sizeof hdr - k,
                                  "%s\"model.layers.0.mlp.experts.%d.%s_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[%d,4],\"data_offsets\":[%zu,%zu]}",
                                  k > 1 ? "," : "", experts[i], proj[p], r, off, off + (size_t)r * 8);
            off += (size_t)r * 8;
        }
    snprintf(hdr + k, sizeof hdr - k, "}");
    assert_int_equal(tu_sh("mkdir -p '%s'", dir), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    uint8_t *data = malloc(off + 1);
    for (size_t i = 0; i < off; i++)
        data[i] = (uint8_t)(i * 7 + 1);
    tu_write_st(path, hdr, data, off);
    free(data);
    snprintf(path, sizeof path, "%s/config.json", dir);
    char cfg[256];
    snprintf(cfg, sizeof cfg, "{\"model_type\": \"%s\"}", model_type);
    assert_int_equal(tu_write_file(path, cfg, strlen(cfg)), 0);
}

static void packs_refused_and_told(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("namesr");
    char in[4096], err[2048];
    /* expert 2 missing: refused, exit 3, naming it; no file under a final name */
    snprintf(in, sizeof in, "%s/hole", tmp);
    write_moe(in, (const int[]){0, 1, 3}, 3, "qwen3_moe", NULL);
    char args[8192];
    snprintf(args, sizeof args, "convert %s %s/o1 -w 2", in, tmp);
    assert_int_equal(tu_cli("", args, err, sizeof err), 3);
    assert_non_null(strstr(err, "expert 2"));
    assert_non_null(strstr(err, "missing"));
    assert_int_not_equal(tu_sh("ls %s/o1/*.safetensors >/dev/null 2>&1", tmp), 0);
    /* the same input under checkpoint names converts, and says DCP will not load it */
    snprintf(args, sizeof args, "convert %s %s/o2 -w 2 --names checkpoint", in, tmp);
    assert_int_equal(tu_cli("", args, err, sizeof err), 0);
    assert_int_equal(tu_sh("grep -q '\"per_expert_tensors\": *9' %s/o2/bfshard.manifest.json", tmp), 0);
    assert_int_equal(tu_sh("%s inspect %s --names checkpoint | grep -q '^warning: 9 per-expert'", tu_bfshard(), in), 0);
    /* members of two shapes cannot be stacked */
    snprintf(in, sizeof in, "%s/shapes", tmp);
    write_moe(in, (const int[]){0, 1}, 2, "qwen3_moe", (const int[]){0, 3});
    snprintf(args, sizeof args, "convert %s %s/o3", in, tmp);
    assert_int_equal(tu_cli("", args, err, sizeof err), 3);
    assert_non_null(strstr(err, "shapes or dtypes differ"));
    /* a per-expert checkpoint of a model type not in the table: checkpoint names, told */
    snprintf(in, sizeof in, "%s/unknown", tmp);
    write_moe(in, (const int[]){0, 1}, 2, "some_moe", NULL);
    snprintf(args, sizeof args, "convert %s %s/o4 -w 2", in, tmp);
    assert_int_equal(tu_cli("", args, err, sizeof err), 0);
    assert_int_equal(tu_sh("grep -q '\"per_expert_tensors\": *6' %s/o4/bfshard.manifest.json", tmp), 0);
    assert_int_equal(tu_sh("%s inspect %s -w 2 | grep -q 'model type not in the table'", tu_bfshard(), in), 0);
    /* --layout hf keeps checkpoint names by default (from_pretrained packs them itself) */
    snprintf(in, sizeof in, "%s/hole", tmp);
    write_moe(in, (const int[]){0, 1}, 2, "qwen3_moe", NULL);
    snprintf(args, sizeof args, "convert %s %s/o5 --layout hf", in, tmp);
    assert_int_equal(tu_cli("", args, err, sizeof err), 0);
    assert_int_equal(tu_sh("grep -q 'experts.1.up_proj.weight' %s/o5/model-00001-of-00001.safetensors", tmp), 0);
    assert_int_equal(tu_sh("%s inspect %s -w 4 | grep -q '^names: .*experts per rank: 1, 1, 0, 0'", tu_bfshard(), in), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* Parts + merge, and a run killed (SIGKILL) after its first rank file and run again, give the
 * bytes of one whole run under target names. */
static void parts_and_resume_identical(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("namesp");
    const char *fx = "fixtures/moe-dsv4-fp8";
    assert_int_equal(tu_sh("%s convert %s %s/whole -w 4 --device cpu -q", tu_bfshard(), fx, tmp), 0);
    static const char *const parts[] = {"3", "0-1", "2"};
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(tu_sh("%s convert %s %s/parts -w 4 --ranks %s --device cpu -q", tu_bfshard(), fx, tmp, parts[i]), 0);
    assert_int_equal(tu_sh("%s merge %s/parts -q", tu_bfshard(), tmp), 0);
    assert_int_equal(tu_sh("diff -r %s/whole %s/parts", tmp, tmp), 0);
    /* killed once rank 0's file is committed (rank 1's .partial appears), then run again */
    char out[4096];
    snprintf(out, sizeof out, "%s/killed", tmp);
    assert_int_equal(tu_sh("mkdir -p %s", out), 0);
    const int ifd = tu_watch(out, IN_CREATE);
    char *argv[] = {"bfshard", "convert", (char *)fx, out, "-w", "4", "--device", "cpu", "--mem", "64K", "-q", NULL};
    setenv("BFSHARD_TEST_WRITER_DELAY_US", "100000", 1); /* a slow disk: the kill lands mid-run */
    int rc = 0;
    const bool killed = tu_kill_on_event(ifd, tu_spawn(argv, NULL), ".shard-00002-model-00001-of-00001.safetensors.partial",
                                         IN_CREATE, 120, &rc);
    unsetenv("BFSHARD_TEST_WRITER_DELAY_US");
    close(ifd);
    assert_true(killed && rc == 1000 + SIGKILL);
    assert_int_equal(tu_sh("test -f %s/shard-00001-model-00001-of-00001.safetensors", out), 0);
    assert_int_equal(tu_sh("%s convert %s %s -w 4 --device cpu -q", tu_bfshard(), fx, out), 0);
    assert_int_equal(tu_sh("diff -r %s/whole %s", tmp, out), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* --names torchtitan: checkpoint names; with W <= E each per-expert tensor whole in the file of
 * the rank torchtitan's FSDP gives its expert (torch.chunk of E over W), with W > E every
 * expert's rows by torch.chunk as --names checkpoint writes them; all else as checkpoint.
 * E = 5 (W = 2, 3 do not divide it, 8 > E) and the DeepSeek-V3 fixture (E = 4). make interop
 * runs torchtitan's own loader on it (tests/interop/torchtitan_load.py). */
static void torchtitan_placement(void **s)
{
    (void)s;
    for (uint64_t E = 1; E <= 9; E++) /* the owner: the rank whose torch.chunk of E holds e */
        for (uint64_t W = 1; W <= 9; W++)
            for (uint64_t e = 0; e < E; e++) {
                const uint64_t o = bfs__torchtitan_owner(e, E, W);
                uint64_t a = 0, b = 0;
                if (W > E) {
                    assert_true(o == UINT64_MAX);
                    continue;
                }
                bfs__chunk_rows(E, W, o, &a, &b);
                assert_true(o < W && a <= e && e < b);
            }
    uint64_t e = 0;
    assert_int_equal(bfs__torchtitan_key("qwen3_moe", "model.layers.3.mlp.experts.17.up_proj.weight", &e), 1);
    assert_int_equal(e, 17);
    assert_int_equal(bfs__torchtitan_key("kimi_k2", "model.layers.1.mlp.experts.0.down_proj.weight", &e), 1);
    assert_int_equal(bfs__torchtitan_key("deepseek_v3", "model.layers.1.mlp.shared_experts.down_proj.weight", &e), 0);
    assert_int_equal(bfs__torchtitan_key("deepseek_v3", "model.layers.1.mlp.experts.0.down_proj.weight_scale_inv", &e), 0);
    assert_int_equal(bfs__torchtitan_key("deepseek_v3", "model.layers.1.mlp.experts.x.down_proj.weight", &e), 0);
    assert_int_equal(bfs__torchtitan_key("mixtral", "model.layers.1.mlp.experts.0.down_proj.weight", &e), 0);

    char *tmp = tu_tmpdir("namestt");
    char in5[4096], ref[4096], tt[4096], ck[4096], path[4096];
    snprintf(in5, sizeof in5, "%s/e5", tmp);
    write_moe(in5, (const int[]){0, 1, 2, 3, 4}, 5, "qwen3_moe", NULL);
    const char *const ins[] = {in5, "fixtures/moe-dsv3-fp8"};
    const uint64_t Es[] = {5, 4};
    for (size_t f = 0; f < 2; f++) {
        char *type = model_type_of(ins[f]);
        snprintf(ref, sizeof ref, "%s/ref%zu", tmp, f);
        convert_ok(ins[f], ref, 1, BFS_LAYOUT_DCP, BFS_NAMES_CHECKPOINT, 0);
        snprintf(path, sizeof path, "%s/shard-00001-model-00001-of-00001.safetensors", ref);
        stfile rf;
        if (st_load(path, &rf) != 0)
            fail_msg("%s: missing", path);
        static const int Ws[] = {2, 3, 8};
        for (size_t w = 0; w < 3; w++) {
            const int W = Ws[w];
            const uint64_t E = Es[f];
            snprintf(tt, sizeof tt, "%s/tt%zu-%d", tmp, f, W);
            snprintf(ck, sizeof ck, "%s/ck%zu-%d", tmp, f, W);
            convert_ok(ins[f], tt, W, BFS_LAYOUT_DCP, BFS_NAMES_TORCHTITAN, 16 << 10);
            convert_ok(ins[f], ck, W, BFS_LAYOUT_DCP, BFS_NAMES_CHECKPOINT, 16 << 10);
            stfile t[8], c[8];
            size_t entries = 0, want = 0, whole = 0;
            for (int r = 0; r < W; r++) {
                snprintf(path, sizeof path, "%s/shard-%05d-model-00001-of-00001.safetensors", tt, r + 1);
                assert_int_equal(st_load(path, &t[r]), 0);
                snprintf(path, sizeof path, "%s/shard-%05d-model-00001-of-00001.safetensors", ck, r + 1);
                assert_int_equal(st_load(path, &c[r]), 0);
                entries += t[r].h.n;
            }
            for (size_t i = 0; i < rf.h.n; i++) {
                const bfs_st_tensor *x = &rf.h.t[i];
                const bool expert = bfs__torchtitan_key(type, x->name, &e) == 1;
                for (int r = 0; r < W; r++) {
                    const bfs_st_tensor *a = st_find(&t[r], x->name), *b = st_find(&c[r], x->name);
                    if (expert && (uint64_t)W <= E) { /* whole, on its owner only */
                        const bool mine = bfs__torchtitan_owner(e, E, (uint64_t)W) == (uint64_t)r;
                        if (!mine) {
                            if (a)
                                fail_msg("W=%d: %s in rank %d's file, its owner is %llu", W, x->name, r,
                                         (unsigned long long)bfs__torchtitan_owner(e, E, (uint64_t)W));
                            continue;
                        }
                        assert_non_null(a);
                        assert_int_equal(a->ndim, x->ndim);
                        assert_memory_equal(a->shape, x->shape, sizeof x->shape[0] * (size_t)x->ndim);
                        assert_int_equal(a->end - a->begin, x->end - x->begin);
                        assert_memory_equal(st_data(&t[r], a), st_data(&rf, x), x->end - x->begin);
                        want++;
                        whole++;
                        continue;
                    }
                    /* everything else (and every expert when W > E): as --names checkpoint */
                    assert_true((a == NULL) == (b == NULL));
                    if (!a)
                        continue;
                    assert_int_equal(a->end - a->begin, b->end - b->begin);
                    assert_memory_equal(a->shape, b->shape, sizeof a->shape[0] * (size_t)a->ndim);
                    assert_memory_equal(st_data(&t[r], a), st_data(&c[r], b), a->end - a->begin);
                    want++;
                }
            }
            /* nothing else in the files (a rank without rows: DCP's one empty entry) */
            for (int r = 0; r < W; r++)
                if (t[r].h.n == 1 && t[r].h.t[0].end == t[r].h.t[0].begin && !st_find(&c[r], t[r].h.t[0].name))
                    want++;
            assert_int_equal(entries, want);
            assert_int_equal(whole, (uint64_t)W <= E ? (f == 0 ? 15 : 12) : 0); /* 3 per expert, 1 layer of experts */
            for (int r = 0; r < W; r++) {
                st_free(&t[r]);
                st_free(&c[r]);
            }
            assert_int_equal(tu_sh("grep -q '\"names\": *\"torchtitan\"' %s/bfshard.manifest.json", tt), 0);
            if ((uint64_t)W <= E)
                assert_int_equal(tu_sh("grep -q '\"placement\": *\"whole on rank %d (its expert.s owner under torchtitan.s FSDP, torchtitan/distributed/fsdp.py:230)\"' %s/bfshard.manifest.json",
                                       W - 1 < (int)E ? (int)bfs__torchtitan_owner(E - 1, E, (uint64_t)W) : 0, tt), 0);
            else /* W > E: the very files --names checkpoint writes */
                assert_int_equal(tu_sh("cd %s && for f in shard-*.safetensors; do cmp -s $f %s/$f || exit 1; done", tt, ck), 0);
        }
        st_free(&rf);
        free(type);
    }
    /* parts + merge give the bytes of one whole run; inspect says where the experts go */
    assert_int_equal(tu_sh("%s convert %s %s/tw -w 3 --names torchtitan --device cpu -q", tu_bfshard(), in5, tmp), 0);
    static const char *const parts[] = {"2", "0-1"};
    for (size_t i = 0; i < 2; i++)
        assert_int_equal(tu_sh("%s convert %s %s/tp -w 3 --names torchtitan --ranks %s --device cpu -q", tu_bfshard(), in5, tmp,
                               parts[i]), 0);
    assert_int_equal(tu_sh("%s merge %s/tp -q", tu_bfshard(), tmp), 0);
    assert_int_equal(tu_sh("diff -r %s/tw %s/tp", tmp, tmp), 0);
    assert_int_equal(tu_sh("%s inspect %s -w 3 --names torchtitan | grep -q '^names: .* 15 per-expert tensor(s) of 5 experts whole'",
                           tu_bfshard(), in5), 0);
    /* gpt_oss: torchtitan's load would leave its experts at their initial values: refused (2) */
    assert_int_equal(tu_sh("%s convert fixtures/mxfp4-tiny %s/tg --names torchtitan --device cpu -q 2>%s/tg.err; test $? -eq 2",
                           tu_bfshard(), tmp, tmp), 0);
    assert_int_equal(tu_sh("grep -q 'cannot load gpt_oss.s experts' %s/tg.err && test ! -e %s/tg/bfshard.manifest.json", tmp, tmp), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* The float32 rule (src/plan/fp32.c): decided on the model's name of a checkpoint key, upstream's
 * search semantics (anywhere in the name, `.` any character), per model type. */
static void fp32_rule_keys(void **s)
{
    (void)s;
    static const struct { const char *type, *key; int want; const char *pat; } cases[] = {
        {"deepseek_v3", "model.layers.3.mlp.gate.e_score_correction_bias", 1, "e_score_correction_bias"},
        {"deepseek_v3", "model.layers.3.mlp.gate.weight", 0, NULL},
        {"kimi_k2", "model.layers.3.mlp.gate.e_score_correction_bias", 1, "e_score_correction_bias"},
        {"glm4_moe", "model.layers.1.mlp.gate.e_score_correction_bias", 1, "e_score_correction_bias"},
        {"qwen3_moe", "model.layers.1.mlp.gate.e_score_correction_bias", 0, NULL}, /* its class keeps none */
        {"mixtral", "model.layers.1.block_sparse_moe.gate.weight", 0, NULL},
        {"beam", "model.layers.1.mlp.gate.weight", 1, "mlp.gate.weight"},
        {"beam", "model.layers.1.mlp_gate_weight", 1, "mlp.gate.weight"}, /* `.` is any character upstream */
        {"ernie4_5_moe", "model.layers.1.mlp.moe_statics.e_score_correction_bias", 1, "moe_statics"},
        {"ernie4_5_moe", "model.layers.1.mlp.experts.0.gate_proj.weight", 0, NULL},
        /* DeepSeek-V4's checkpoint names, decided on the model's (renamed, prefixed) names */
        {"deepseek_v4", "layers.0.hc_attn_fn", 1, "attn_hc"},
        {"deepseek_v4", "hc_head_scale", 1, "hc_head"},
        {"deepseek_v4", "layers.0.attn.attn_sink", 1, "sinks"},
        {"deepseek_v4", "layers.0.attn.compressor.ape", 1, "position_bias"},
        {"deepseek_v4", "layers.0.ffn.gate.bias", 1, "e_score_correction_bias"},
        {"deepseek_v4", "layers.0.attn_norm.weight", 1, "input_layernorm"},
        {"deepseek_v4", "layers.0.attn.wq_a.weight", 0, NULL},
        {"deepseek_v4", "embed.weight", 0, NULL},
        {"llama", "model.norm.weight", 0, NULL},
        {NULL, "model.layers.0.mlp.gate.e_score_correction_bias", 0, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *why = NULL, *pat = NULL;
        const int rc = bfs__fp32_key(cases[i].type, cases[i].key, &why, &pat);
        if (rc != cases[i].want || (pat == NULL) != (cases[i].pat == NULL) || (pat && strcmp(pat, cases[i].pat) != 0))
            fail_msg("%s %s: %d (%s), want %d (%s)", cases[i].type ? cases[i].type : "(none)", cases[i].key, rc,
                     pat ? pat : "-", cases[i].want, cases[i].pat ? cases[i].pat : "-");
        assert_true(!rc || (why && strstr(why, "PreTrainedModel (models/")));
    }
    /* the default keeps the router bias F32 under either names; --keep-dtype keeps it too, and
     * says the same; the log says which and why */
    char *tmp = tu_tmpdir("fp32");
    static const char *const opts[] = {"-w 3", "-w 3 --names checkpoint", "-w 2 --keep-dtype", "--layout hf"};
    for (size_t k = 0; k < sizeof opts / sizeof *opts; k++) {
        assert_int_equal(tu_sh("%s convert fixtures/moe-dsv3-fp8 %s/o%zu %s --force 2>%s/log%zu", tu_bfshard(), tmp, k,
                               opts[k], tmp, k), 0);
        assert_int_equal(tu_sh("grep -q '1 tensor(s) written as stored (1 F32), not rounded to BF16: the model keeps them in "
                               "float32 (DeepseekV3PreTrainedModel (models/deepseek_v3/modeling_deepseek_v3.py:550)' %s/log%zu",
                               tmp, k), 0);
        assert_int_equal(tu_sh("grep -q '\"keeps_float32\"' %s/o%zu/bfshard.manifest.json", tmp, k), 0);
    }
    tu_rmrf(tmp);
    free(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(engine_matches_transformers),
        cmocka_unit_test(packed_equals_checkpoint),
        cmocka_unit_test(packs_refused_and_told),
        cmocka_unit_test(parts_and_resume_identical),
        cmocka_unit_test(fp32_rule_keys),
        cmocka_unit_test(torchtitan_placement),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
