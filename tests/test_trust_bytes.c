/*
 * Wrong bytes are never final: shapes that overflow are
 * refused before a header; an input rewritten in place during a run fails it; the
 * manifest's source hashes are of the bytes that were read; a seek table that calls a
 * frame empty is checked; every --json is one parseable object with an error object;
 * unaligned float32 side tensors convert; a NUL in a dtype, a symlink loop, an oversized
 * tokenizer (refused) or other side file (skipped), a zero-element tensor and an allocation failure each get the right answer;
 * names from files are escaped, by one rule (escape_rule), a hostile manifest's strings
 * too in inspect and verify; verify is linear in files x shards.
 *
 * large_manifest_verify_linear is sized so that the quadratic verify it replaces
 * (every bad file scanned every shard of the manifest; every directory entry scanned
 * files[]) runs for well over ten minutes and so times the suite out, while the linear
 * one takes seconds. It asserts nothing about time.
 */
#include "testutil.h"
#include "tu_st.h"
#include "bfs_internal.h"
#include "base/bfs_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------------- */
/* A safetensors file from a header object (data_offsets given) and its data section;
 * the header is space padded to `pad` bytes past a multiple of 8 (0: none). */
static void write_st_json(const char *path, json_t *hdr, const uint8_t *data, size_t len, size_t pad)
{
    char *text = json_dumps(hdr, JSON_COMPACT | JSON_SORT_KEYS);
    assert_non_null(text);
    const size_t n = strlen(text), hl = (n + 7) / 8 * 8 + pad;
    char *padded = malloc(hl + 1);
    assert_non_null(padded);
    memcpy(padded, text, n);
    memset(padded + n, ' ', hl - n);
    padded[hl] = '\0';
    tu_write_st(path, padded, data, len);
    free(padded);
    free(text);
}

static json_t *entry(const char *dtype, json_t *shape, uint64_t b, uint64_t e)
{
    return json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtype, "shape", shape, "data_offsets", (json_int_t)b,
                     (json_int_t)e);
}

static bool dir_has(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    bool found = false;
    if (!d)
        return false;
    while ((e = readdir(d)) != NULL) {
        const size_t n = strlen(e->d_name), m = strlen(suffix);
        found = found || (n >= m && strcmp(e->d_name + n - m, suffix) == 0);
    }
    closedir(d);
    return found;
}

static int run(const char *fmt, const char *a, const char *b)
{
    return tu_sh(fmt, tu_bfshard(), a, b);
}

static bfs_convert_opts cpu_opts(int world)
{
    bfs_convert_opts o;
    bfs_convert_opts_init(&o);
    o.world_size = world;
    o.device = "cpu";
    return o;
}

/* ---- 3: shapes and products that overflow never reach a header --------------------------- */
static void overflowing_shapes_refused(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("ovf");
    char in[4096], out[4096];
    snprintf(in, sizeof in, "%s/in", tmp);
    mkdir(in, 0755);
    snprintf(in, sizeof in, "%s/in/model.safetensors", tmp);
    snprintf(out, sizeof out, "%s/out", tmp);
    /* E = 0 experts of 2^58 groups: no bytes, but an output dim of 2^63 */
    const json_int_t G = (json_int_t)1 << 58;
    json_t *h = json_object();
    json_object_set_new(h, "experts.w_blocks", entry("U8", json_pack("[i, i, I, i]", 0, 1, G, 16), 0, 0));
    json_object_set_new(h, "experts.w_scales", entry("U8", json_pack("[i, i, I]", 0, 1, G), 0, 0));
    write_st_json(in, h, NULL, 0, 0);
    json_decref(h);
    bfs_convert_opts o = cpu_opts(1);
    assert_int_equal(bfs_convert(in, out, &o, NULL), BFS_EINPUT);
    assert_non_null(strstr(bfs_last_error(), "experts.w"));
    assert_false(dir_has(out, ".safetensors"));
    assert_int_equal(run("%s convert %s %s/cli --quiet 2>/dev/null", in, tmp), 3);
    assert_int_equal(run("%s inspect %s%s >/dev/null 2>&1", in, ""), 3);

    /* a zero dimension does not excuse the others: [0, 2^62, 4] F32 */
    h = json_object();
    json_object_set_new(h, "t", entry("F32", json_pack("[i, I, i]", 0, (json_int_t)1 << 62, 4), 0, 0));
    write_st_json(in, h, NULL, 0, 0);
    json_decref(h);
    assert_int_equal(bfs_convert(in, out, &o, NULL), BFS_EINPUT);
    assert_non_null(strstr(bfs_last_error(), "\"t\""));
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- 3: an input rewritten in place during a run -------------------------------------- */
static char rw_paths[2][4096];
static int rw_calls;
static void rewrite_cb(const bfs_progress *p, void *u)
{
    (void)p;
    (void)u;
    if (++rw_calls != 1)
        return;
    for (int i = 0; i < 2; i++) { /* same size, new data: every byte after the header */
        size_t n = 0;
        uint8_t *b = tu_read_file(rw_paths[i], &n);
        assert_non_null(b);
        const uint64_t hl = (uint64_t)b[0] | (uint64_t)b[1] << 8 | (uint64_t)b[2] << 16;
        for (size_t k = 8 + hl; k < n; k++)
            b[k] ^= 0x5a;
        const int fd = open(rw_paths[i], O_WRONLY);
        assert_true(fd >= 0);
        assert_int_equal(pwrite(fd, b + 8 + hl, n - 8 - hl, (off_t)(8 + hl)), (ssize_t)(n - 8 - hl));
        close(fd);
        free(b);
    }
}

static void input_rewritten_in_place(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("rw");
    char in[4096], out[4096];
    snprintf(in, sizeof in, "%s/in", tmp);
    snprintf(out, sizeof out, "%s/out", tmp);
    assert_int_equal(tu_sh("cp -r fixtures/mxfp4-tiny '%s'", in), 0);
    snprintf(rw_paths[0], sizeof rw_paths[0], "%s/model-00001-of-00002.safetensors", in);
    snprintf(rw_paths[1], sizeof rw_paths[1], "%s/model-00002-of-00002.safetensors", in);
    /* files as they come from a download: modified long before the run (a rewrite then
     * changes the mtime whatever the clock's granularity) */
    assert_int_equal(tu_sh("touch -d 2001-01-01 '%s' '%s'", rw_paths[0], rw_paths[1]), 0);
    for (int world = 1; world <= 2; world++) {
        bfs_convert_opts o = cpu_opts(world);
        o.mem = 64 << 10; /* many units: the rewrite lands between two of them */
        o.progress = rewrite_cb;
        o.force = 1;
        rw_calls = 0;
        const int rc = bfs_convert(in, out, &o, NULL);
        if (rc != BFS_EINPUT)
            fail_msg("W=%d: rc %d (%s): an input rewritten in place must fail the run", world, rc, bfs_last_error());
        assert_non_null(strstr(bfs_last_error(), "changed while being read"));
        assert_int_equal(tu_sh("test -e '%s/bfshard.manifest.json'", out), 1);
        assert_false(dir_has(out, ".partial"));
        assert_int_equal(tu_sh("cp fixtures/mxfp4-tiny/*.safetensors '%s' && touch -d 2001-01-01 '%s'/*.safetensors",
                               in, in), 0);
    }
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- 3: the manifest's source hashes, recomputed from the input files --------------------- */

/* Every source file in OUTDIR's manifest has the content hash of that file of input,
 * converted with o (its blocks follow the world size). */
static void assert_source_hashes(const char *input, const bfs_convert_opts *o, const char *outdir)
{
    char mp[4096], want[8][33];
    snprintf(mp, sizeof mp, "%s/bfshard.manifest.json", outdir);
    json_t *m = json_load_file(mp, 0, NULL);
    const json_t *files = json_object_get(json_object_get(m, "source"), "files");
    assert_true(json_array_size(files) >= 1 && json_array_size(files) <= 8);
    st_source_hashes(input, o, want); /* in the input's order, as the manifest lists them */
    for (size_t i = 0; i < json_array_size(files); i++)
        assert_string_equal(json_string_value(json_object_get(json_array_get(files, i), "content_xxh3_128")), want[i]);
    assert_string_equal(json_string_value(json_object_get(json_object_get(m, "source"), "content_xxh3_128_scheme")),
                        "blocks-1");
    json_decref(m);
}

static void source_hashes_of_read_bytes(void **s)
{
    (void)s;
    /* the FP8, INT4 and NVFP4 formats too: their sources() ranges (scales, zero points) are what is hashed */
    static const char *const fx[] = {"fixtures/mxfp4-tiny", "fixtures/bnb-nf4-dq", "fixtures/bnb-fp4",
                                     "fixtures/fp8-block-split", "fixtures/ct-fp8-channel", "fixtures/ct-int4-asym",
                                     "fixtures/ct-nvfp4", "fixtures/modelopt-nvfp4", "fixtures/ct-moe-mixed"};
    char *tmp = tu_tmpdir("srch");
    for (size_t k = 0; k < sizeof fx / sizeof *fx; k++) {
        for (int world = 1; world <= 3; world += 2) {
            char out[4096];
            snprintf(out, sizeof out, "%s/o%zu-%d", tmp, k, world);
            bfs_convert_opts o = cpu_opts(world);
            o.mem = 64 << 10;
            assert_int_equal(bfs_convert(fx[k], out, &o, NULL), 0);
            assert_source_hashes(fx[k], &o, out);
        }
    }
    tu_rmrf(tmp);
    free(tmp);
}

/* Parts (convert --ranks): each part adds its ranks' blocks of every source file, from the
 * rows it reads; merged, the source hashes are the files' content hashes. */
static void source_hashes_of_parts(void **s)
{
    (void)s;
    static const char *const fx[] = {"fixtures/mxfp4-tiny", "fixtures/fp8-block-split", "fixtures/ct-int4-asym"};
    static const char *const parts[] = {"2", "0", "1"};
    char *tmp = tu_tmpdir("srchp");
    for (size_t k = 0; k < sizeof fx / sizeof *fx; k++) {
        char out[4096];
        snprintf(out, sizeof out, "%s/o%zu", tmp, k);
        for (size_t q = 0; q < sizeof parts / sizeof *parts; q++) {
            bfs_convert_opts o = cpu_opts(3);
            o.layout = BFS_LAYOUT_DCP;
            o.mem = 64 << 10; /* many units: a part starts reading a tensor in its middle */
            o.ranks = parts[q];
            if (bfs_convert(fx[k], out, &o, NULL) != 0)
                fail_msg("%s --ranks %s: %s", fx[k], parts[q], bfs_last_error());
        }
        assert_int_equal(bfs_merge(out, NULL), 0);
        bfs_convert_opts o = cpu_opts(3);
        assert_source_hashes(fx[k], &o, out);
        assert_int_equal(bfs_verify(out, NULL, NULL), 0);
    }
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- 3: a seek table entry that calls a frame empty -------------------------------------- */
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static void decompress_empty_frame_checked(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("zempty");
    char out[4096], rf[4096], z[4096], bad[4096], res[4096];
    snprintf(out, sizeof out, "%s/o", tmp);
    bfs_convert_opts o = cpu_opts(1);
    assert_int_equal(bfs_convert("fixtures/bnb-nf4", out, &o, NULL), 0);
    snprintf(rf, sizeof rf, "%s/shard-00001-model-00001-of-00001.safetensors", out);
    snprintf(z, sizeof z, "%s/good.zst", tmp);
    bfs_compress_opts co;
    bfs_compress_opts_init(&co);
    co.frame_bytes = 8192;
    bfs_compress_result cr;
    bfs_compress_result_init(&cr);
    assert_int_equal(bfs_compress_file_opts(rf, z, &co, &cr), 0);
    size_t n = 0;
    uint8_t *b = tu_read_file(z, &n);
    assert_non_null(b);
    const uint32_t nf = get32(b + n - 9);
    const size_t ts = n - (8 + 12 * (size_t)nf + 9);
    assert_true(nf > 3);
    /* frame 1 holds data; its table entry now says it decodes to 0 bytes */
    memset(b + ts + 8 + 12 * 1 + 4, 0, 4);
    snprintf(bad, sizeof bad, "%s/bad.zst", tmp);
    snprintf(res, sizeof res, "%s/bad.out", tmp);
    assert_int_equal(tu_write_file(bad, b, n), 0);
    assert_int_equal(bfs_decompress_file(bad, res), BFS_EINPUT);
    assert_non_null(strstr(bfs_last_error(), "frame 1"));
    assert_int_not_equal(access(res, F_OK), 0);
    assert_int_equal(run("%s decompress %s -o %s 2>/dev/null", bad, res), 3);
    free(b);
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- 5: --json from every command ------------------------------------------------------ */
/* Runs `bfshard ARGS --json`, parses its stdout: one object with the schema, the exit code
 * it returned, and an error object exactly when it failed. */
static json_t *json_run(const char *args, int want_rc)
{
    char cmd[8192], outf[4096];
    char *tmp = tu_tmpdir("js");
    snprintf(outf, sizeof outf, "%s/stdout", tmp);
    snprintf(cmd, sizeof cmd, "%s %s --json > '%s' 2>/dev/null", tu_bfshard(), args, outf);
    const int rc = tu_sh("%s", cmd);
    json_error_t e;
    json_t *j = json_load_file(outf, 0, &e);
    if (!j)
        fail_msg("%s: stdout is not one JSON object: %s", args, e.text);
    if (rc != want_rc)
        fail_msg("bfshard %s: exit %d, expected %d", args, rc, want_rc);
    assert_int_equal(json_integer_value(json_object_get(j, "schema")), 1);
    assert_int_equal(json_integer_value(json_object_get(j, "exit_code")), want_rc);
    assert_true(json_is_boolean(json_object_get(j, "ok")));
    const json_t *err = json_object_get(j, "error");
    if (want_rc == 0) {
        assert_null(err);
    } else {
        assert_true(json_is_object(err));
        assert_int_equal(json_integer_value(json_object_get(err, "code")), want_rc);
        assert_non_null(strstr(json_string_value(json_object_get(err, "name")), "BFS_E"));
        assert_true(strlen(json_string_value(json_object_get(err, "message"))) > 5);
    }
    tu_rmrf(tmp);
    free(tmp);
    return j;
}

static void json_from_every_command(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("json");
    char out[4096], a[8192], rf[4096];
    /* a path that needs escaping: a quote, a backslash, a newline */
    snprintf(out, sizeof out, "%s/o\"\\\nx", tmp);
    snprintf(a, sizeof a, "convert fixtures/mxfp4-tiny '%s' --world-size 2 --quiet", out);
    json_t *j = json_run(a, 0);
    assert_string_equal(json_string_value(json_object_get(j, "output")), out);
    json_decref(j);
    json_decref(json_run("convert fixtures/nonexistent /tmp/x --quiet", 3));
    json_decref(json_run("convert --bogus-option", 2));
    json_decref(json_run("inspect fixtures/bnb-nf4", 0));
    json_decref(json_run("inspect fixtures/nonexistent", 3));
    snprintf(a, sizeof a, "inspect '%s'", out); /* an OUTDIR */
    j = json_run(a, 0);
    assert_string_equal(json_string_value(json_object_get(j, "kind")), "bfshard-outdir");
    json_decref(j);
    { /* parts, then merge */
        char po[4096];
        snprintf(po, sizeof po, "%s/parts", tmp);
        snprintf(a, sizeof a, "convert fixtures/mxfp4-tiny '%s' --world-size 2 --ranks 1 --quiet", po);
        j = json_run(a, 0);
        assert_string_equal(json_string_value(json_object_get(j, "ranks")), "1");
        assert_true(json_is_integer(json_object_get(j, "source_bytes_hashed")));
        assert_true(json_is_integer(json_object_get(j, "tensors_dequantized")));
        json_decref(j);
        snprintf(a, sizeof a, "merge '%s'", po);
        json_decref(json_run(a, 11 /* BFS_EINCOMPLETE: rank 0 missing */));
        snprintf(a, sizeof a, "convert fixtures/mxfp4-tiny '%s' --world-size 2 --ranks 0 --quiet", po);
        json_decref(json_run(a, 0));
        snprintf(a, sizeof a, "merge '%s' --quiet", po);
        json_decref(json_run(a, 0));
    }
    snprintf(a, sizeof a, "verify '%s'", out);
    j = json_run(a, 0);
    assert_int_equal(json_array_size(json_object_get(j, "problems")), 0);
    json_decref(j);
    /* two damaged rank files: each problem listed */
    snprintf(rf, sizeof rf, "%s/shard-00001-model-00001-of-00001.safetensors", out);
    assert_int_equal(tu_sh("printf x | dd of='%s' bs=1 seek=9000 conv=notrunc 2>/dev/null", rf), 0);
    snprintf(rf, sizeof rf, "%s/shard-00002-model-00001-of-00001.safetensors", out);
    assert_int_equal(tu_sh("printf x >> '%s'", rf), 0);
    snprintf(a, sizeof a, "verify '%s' --quiet", out);
    j = json_run(a, 7);
    assert_true(json_array_size(json_object_get(j, "problems")) >= 2);
    json_decref(j);
    json_decref(json_run("verify /nonexistent-outdir", 3));
    snprintf(a, sizeof a, "compress fixtures/bnb-nf4/model.safetensors -o '%s/r.zst' --quiet", tmp);
    json_decref(json_run(a, 0));
    json_decref(json_run("compress /nonexistent.safetensors", 3));
    snprintf(a, sizeof a, "decompress '%s/r.zst' -o '%s/r.st'", tmp, tmp);
    json_decref(json_run(a, 0));
    json_decref(json_run("decompress /nonexistent.zst", 3));
    snprintf(a, sizeof a, "inspect '%s/r.zst'", tmp); /* a .zst */
    json_decref(json_run(a, 0));
    snprintf(a, sizeof a, "extract '%s/r.zst' lm_head.weight -o '%s/t.st'", tmp, tmp);
    json_decref(json_run(a, 0));
    snprintf(a, sizeof a, "extract '%s/r.zst' no.such.tensor -o '%s/t2.st'", tmp, tmp);
    json_decref(json_run(a, 3));
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- 6: float32 side tensors at any alignment ----------------------------------------------- */
/* A copy of a bitsandbytes fixture with a 1-byte tensor first in the data section, so
 * every other tensor moves by one byte: no float32 is 4-byte aligned in the file. */
static void shift_tensors(const char *src, const char *dst)
{
    size_t n = 0;
    uint8_t *b = tu_read_file(src, &n);
    assert_non_null(b);
    const uint64_t hl = (uint64_t)b[0] | (uint64_t)b[1] << 8 | (uint64_t)b[2] << 16 | (uint64_t)b[3] << 24;
    json_t *h = json_loadb((const char *)b + 8, (size_t)hl, 0, NULL);
    assert_non_null(h);
    const char *k;
    json_t *v;
    json_object_foreach(h, k, v) {
        json_t *off = json_object_get(v, "data_offsets");
        if (!off)
            continue;
        json_array_set_new(off, 0, json_integer(json_integer_value(json_array_get(off, 0)) + 1));
        json_array_set_new(off, 1, json_integer(json_integer_value(json_array_get(off, 1)) + 1));
    }
    json_object_set_new(h, "aaa.shift", entry("U8", json_pack("[i]", 1), 0, 1));
    const size_t dl = n - 8 - (size_t)hl;
    uint8_t *d = malloc(dl + 1);
    d[0] = 7;
    memcpy(d + 1, b + 8 + hl, dl);
    write_st_json(dst, h, d, dl + 1, 0);
    json_decref(h);
    free(d);
    free(b);
}

static void unaligned_float32_tensors(void **s)
{
    (void)s;
    /* and the FP8 / INT4 / NVFP4 formats' F32 scales (fp8, int4, the NVFP4 global scale) */
    static const char *const fx[] = {"fixtures/bnb-nf4",     "fixtures/bnb-fp4-dq",   "fixtures/bnb-nf4-dq-bs128",
                                     "fixtures/fp8-block",   "fixtures/ct-fp8-channel", "fixtures/ct-int4-asym",
                                     "fixtures/ct-nvfp4",    "fixtures/modelopt-nvfp4"};
    char *tmp = tu_tmpdir("align");
    for (size_t k = 0; k < sizeof fx / sizeof *fx; k++) {
        char src[4096], in[4096], ref[4096], out[4096];
        snprintf(src, sizeof src, "%s/model.safetensors", fx[k]);
        snprintf(in, sizeof in, "%s/in%zu", tmp, k);
        mkdir(in, 0755);
        /* the quantization config beside it (the bnb fixtures carry theirs in the file) */
        assert_int_equal(tu_sh("cp %s/*config.json '%s'/ 2>/dev/null; true", fx[k], in), 0);
        if (k < 3)
            snprintf(in, sizeof in, "%s/in%zu/shifted.safetensors", tmp, k);
        else
            snprintf(in, sizeof in, "%s/in%zu/model.safetensors", tmp, k);
        snprintf(ref, sizeof ref, "%s/ref%zu", tmp, k);
        snprintf(out, sizeof out, "%s/out%zu", tmp, k);
        shift_tensors(src, in);
        for (int level = 0; level <= 1; level++) { /* scalar and avx2 kernels */
            if (level > bfs_cpu_best_level())
                continue;
            bfs_convert_opts o = cpu_opts(2);
            o.cpu_level = level;
            o.force = 1;
            assert_int_equal(bfs_convert(k < 3 ? src : fx[k], ref, &o, NULL), 0);
            char indir[4096];
            snprintf(indir, sizeof indir, "%s/in%zu", tmp, k);
            const int rc = bfs_convert(k < 3 ? in : indir, out, &o, NULL);
            if (rc != 0)
                fail_msg("%s shifted by one byte: %s", fx[k], bfs_last_error());
            /* the same tensors, byte for byte: compare each tensor's shard hashes */
            char a[4096], b[4096];
            snprintf(a, sizeof a, "%s/bfshard.manifest.json", ref);
            snprintf(b, sizeof b, "%s/bfshard.manifest.json", out);
            json_t *ma = json_load_file(a, 0, NULL), *mb = json_load_file(b, 0, NULL);
            const json_t *ta = json_object_get(ma, "tensors"), *tb = json_object_get(mb, "tensors");
            size_t matched = 0;
            for (size_t i = 0; i < json_array_size(ta); i++) {
                const json_t *x = json_array_get(ta, i);
                for (size_t j = 0; j < json_array_size(tb); j++) {
                    const json_t *y = json_array_get(tb, j);
                    if (strcmp(json_string_value(json_object_get(x, "name")), json_string_value(json_object_get(y, "name"))))
                        continue;
                    const json_t *sa = json_object_get(x, "shards"), *sb = json_object_get(y, "shards");
                    assert_int_equal(json_array_size(sa), json_array_size(sb));
                    for (size_t q = 0; q < json_array_size(sa); q++)
                        assert_string_equal(json_string_value(json_object_get(json_array_get(sa, q), "xxh3_128")),
                                            json_string_value(json_object_get(json_array_get(sb, q), "xxh3_128")));
                    matched++;
                }
            }
            assert_int_equal(matched, json_array_size(ta));
            json_decref(ma);
            json_decref(mb);
        }
    }
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- 7: the rest ------------------------------------------------------------------------ */
static void nul_in_dtype_refused(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("nul");
    char in[4096];
    snprintf(in, sizeof in, "%s/m.safetensors", tmp);
    const char *hdr = "{\"t\":{\"dtype\":\"F32\\u0000x\",\"shape\":[1],\"data_offsets\":[0,4]}}    ";
    const size_t hl = strlen(hdr);
    uint8_t buf[256] = {0};
    buf[0] = (uint8_t)hl;
    memcpy(buf + 8, hdr, hl);
    assert_int_equal(tu_write_file(in, buf, 8 + hl + 4), 0);
    bfs_st_header h;
    assert_int_equal(bfs__st_parse(buf, 8 + hl + 4, in, &h), BFS_EINPUT);
    assert_int_equal(run("%s inspect %s%s >/dev/null 2>&1", in, ""), 3);
    tu_rmrf(tmp);
    free(tmp);
}

static void symlink_loop_is_bad_input(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("loop");
    assert_int_equal(tu_sh("cp fixtures/mxfp4-tiny/*.safetensors '%s' && ln -s model.safetensors.index.json "
                           "'%s/model.safetensors.index.json'", tmp, tmp), 0);
    assert_int_equal(run("%s inspect %s%s >/dev/null 2>&1", tmp, ""), 3);
    assert_int_equal(run("%s convert %s %s/out --quiet 2>/dev/null", tmp, tmp), 3);
    /* an index naming a file that is a loop */
    assert_int_equal(tu_sh("rm '%s/model.safetensors.index.json' && cp fixtures/mxfp4-tiny/model.safetensors.index.json '%s'",
                           tmp, tmp), 0);
    assert_int_equal(tu_sh("cd '%s' && rm model-00002-of-00002.safetensors && ln -s model-00002-of-00002.safetensors model-00002-of-00002.safetensors", tmp), 0);
    assert_int_equal(run("%s inspect %s%s >/dev/null 2>&1", tmp, ""), 3);
    tu_rmrf(tmp);
    free(tmp);
}

static void oversized_side_files(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("aux");
    char in[4096], out[4096], tok[4096], card[4096], path[4200];
    snprintf(in, sizeof in, "%s/in", tmp);
    snprintf(out, sizeof out, "%s/out", tmp);
    assert_int_equal(tu_sh("cp -r fixtures/bnb-nf4 '%s'", in), 0);
    snprintf(tok, sizeof tok, "%s/tokenizer.json", in);
    snprintf(card, sizeof card, "%s/README.md", in);
    snprintf(path, sizeof path, "%s/README.md", out);
    /* a file the model needs over the limit: refused, before any rank file */
    assert_int_equal(truncate(tok, (64 << 20) + 1), 0); /* sparse: no disk used */
    bfs_convert_opts o = cpu_opts(2);
    assert_int_equal(bfs_convert(in, out, &o, NULL), BFS_EINPUT);
    assert_non_null(strstr(bfs_last_error(), "tokenizer.json"));
    assert_false(dir_has(out, ".safetensors"));
    assert_int_equal(truncate(tok, 64 << 20), 0); /* at the cap: copied */
    /* any other side file over the limit: skipped (never read), said in the log and the manifest */
    assert_int_equal(tu_sh("truncate -s %d '%s'", (64 << 20) + 1, card), 0);
    o.force = 1;
    assert_int_equal(bfs_convert(in, out, &o, NULL), 0);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(tu_sh("grep -q '\"README.md\"' '%s/bfshard.manifest.json'", out), 0);
    tu_rmrf(tmp);
    free(tmp);
}

static void zero_element_tensor_needs_no_memory(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("zero");
    char in[4096], out[4096];
    snprintf(in, sizeof in, "%s/in", tmp);
    mkdir(in, 0755);
    snprintf(in, sizeof in, "%s/in/m.safetensors", tmp);
    snprintf(out, sizeof out, "%s/out", tmp);
    json_t *h = json_object();
    json_object_set_new(h, "empty", entry("F32", json_pack("[i, I]", 0, (json_int_t)1 << 40), 0, 0));
    json_object_set_new(h, "w", entry("F32", json_pack("[i, i]", 2, 2), 0, 16));
    const uint8_t d[16] = {0};
    write_st_json(in, h, d, sizeof d, 0);
    json_decref(h);
    bfs_convert_opts o = cpu_opts(2);
    o.mem = 4096;
    const int rc = bfs_convert(in, out, &o, NULL);
    if (rc != 0)
        fail_msg("a zero-element tensor asked for memory: %s", bfs_last_error());
    assert_int_equal(run("%s verify %s%s 2>/dev/null", out, ""), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* Under `ulimit -v`, at every limit in a range: success (0) or out of memory (5), never
 * "internal" (1) -- libzstd's own allocation failures included (before: compress at
 * level 19 exited 1 at 64-65 MiB, convert --compress at 82 MiB, on the machine this was
 * written on; the ranges cover where every allocation of these runs happens). */
#if defined(__SANITIZE_ADDRESS__)
#define BFS_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BFS_TEST_ASAN 1
#endif
#endif
static void allocation_failure_is_exit_5(void **s)
{
    (void)s;
#ifdef BFS_TEST_ASAN /* ASan reserves terabytes of shadow memory: it cannot start under ulimit -v */
    skip();
#endif
    char *tmp = tu_tmpdir("oom");
    static const struct {
        const char *args;
        int lo, hi, step; /* MiB */
    } runs[] = {
        {"compress fixtures/bnb-nf4/model.safetensors -o '%s/z.zst' --force --level 19 --threads 2 --quiet", 32, 128, 1},
        {"convert fixtures/bnb-nf4 '%s/c' --force --quiet --threads 2 --compress zstd:19", 16, 128, 2},
    };
    for (size_t c = 0; c < sizeof runs / sizeof *runs; c++) {
        char args[8192];
        snprintf(args, sizeof args, runs[c].args, tmp);
        for (int mb = runs[c].lo; mb <= runs[c].hi; mb += runs[c].step) {
            const int rc = tu_sh("ulimit -v %d && exec %s %s 2>/dev/null", mb << 10, tu_bfshard(), args);
            if (rc != 0 && rc != 5)
                fail_msg("ulimit -v %d MiB: exit %d from `bfshard %s`", mb, rc, args);
        }
    }
    tu_rmrf(tmp);
    free(tmp);
}

static void names_escaped(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("esc");
    char in[4096], out[4096], rf[4096], rep[4096];
    snprintf(in, sizeof in, "%s/in", tmp);
    mkdir(in, 0755);
    snprintf(in, sizeof in, "%s/in/m.safetensors", tmp);
    snprintf(out, sizeof out, "%s/out", tmp);
    json_t *h = json_object();
    json_object_set_new(h, "evil\x1b[31m\nname", entry("BF16", json_pack("[i]", 4096), 0, 8192));
    uint8_t *d = calloc(1, 8192);
    write_st_json(in, h, d, 8192, 0);
    free(d);
    json_decref(h);
    snprintf(rep, sizeof rep, "%s/report", tmp);
    assert_int_equal(tu_sh("%s inspect '%s' > '%s'", tu_bfshard(), in, rep), 0);
    assert_int_equal(tu_sh("grep -q 'evil\\\\u001b\\[31m\\\\nname' '%s'", rep), 0);
    assert_int_equal(tu_sh("grep -q \"$(printf '\\033')\" '%s'", rep), 1);
    bfs_convert_opts o = cpu_opts(1);
    assert_int_equal(bfs_convert(in, out, &o, NULL), 0);
    snprintf(rf, sizeof rf, "%s/shard-00001-model-00001-of-00001.safetensors", out);
    assert_int_equal(tu_sh("printf x | dd of='%s' bs=1 seek=4000 conv=notrunc 2>/dev/null", rf), 0);
    assert_int_equal(tu_sh("%s verify '%s' 2> '%s'", tu_bfshard(), out, rep), 7);
    assert_int_equal(tu_sh("grep -q 'BAD tensor \"evil\\\\u001b\\[31m\\\\nname\"' '%s'", rep), 0);
    assert_int_equal(tu_sh("grep -q \"$(printf '\\033')\" '%s'", rep), 1);
    tu_rmrf(tmp);
    free(tmp);
}

/* ---- the escaping rule (src/base/escape.c): one rule for text from a file --------------- */
static void escape_rule(void **s)
{
    (void)s;
    char b[BFS_ESC_MAX];
    static const struct {
        const char *in, *name, *text;
    } v[] = {
        {"plain", "plain", "plain"},
        {"a\nb\tc", "a\\nb\\tc", "a\\nb\\tc"},
        {"q\"b\\", "q\\\"b\\\\", "q\"b\\"},            /* a name's quotes; a line's own */
        {"\x1b[31m\x01\x7f", "\\u001b[31m\\u0001\\u007f", "\\u001b[31m\\u0001\\u007f"},
        {"\xc2\x9b" "31m\xc2\x85", "\\u009b31m\\u0085", "\\u009b31m\\u0085"}, /* C1: CSI, NEL */
        {"\xc2\xa0\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", "\xc2\xa0\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80",
         "\xc2\xa0\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"}, /* NBSP, e acute, euro, an emoji: as they are */
        {"\x9b\xff\xfe", "\\x9b\\xff\\xfe", "\\x9b\\xff\\xfe"},  /* bytes of no UTF-8 sequence */
        {"\xc0\xaf\xe0\x80\xaf", "\\xc0\\xaf\\xe0\\x80\\xaf", "\\xc0\\xaf\\xe0\\x80\\xaf"}, /* overlong '/' */
        {"\xed\xa0\x80", "\\xed\\xa0\\x80", "\\xed\\xa0\\x80"},         /* a surrogate */
        {"\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80", "\\xf4\\x90\\x80\\x80"}, /* above U+10FFFF */
        {"\xe2\x82", "\\xe2\\x82", "\\xe2\\x82"},                         /* cut short */
        {"\xe2\x82x", "\\xe2\\x82x", "\\xe2\\x82x"},
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        assert_string_equal(bfs__esc(v[i].in, b, sizeof b), v[i].name);
        assert_string_equal(bfs__esc_text(v[i].in, b, sizeof b), v[i].text);
        assert_string_equal(bfs__esc_text(v[i].text, b, sizeof b), v[i].text); /* escaped stays escaped */
    }
    /* cut to fit, never inside an escape or a UTF-8 sequence */
    assert_string_equal(bfs__esc("abcdefghij", b, 10), "abcdef...");
    assert_string_equal(bfs__esc("ab\x1b" "cdefgh", b, 10), "ab...");
    assert_string_equal(bfs__esc("ab\xe2\x82\xac" "cdefgh", b, 10), "ab\xe2\x82\xac" "c...");
    /* a line: prefix and text escaped, one '\n' */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    bfs__line(f, "%s: BAD (%s)", "out\x1b", "09feb43\x1b" "bc\n\x7f\xff");
    fclose(f);
    assert_string_equal(text, "out\\u001b: BAD (09feb43\\u001bbc\\n\\u007f\\xff)\n");
    free(text);
    /* JSON for a reader: DEL and C1 as \u escapes, the same value */
    json_t *j = json_pack("{s:s}", "fp8-bl\x7f" "ck", "\xc2\x9b" "x\x1b");
    char *js = bfs__json_show(j, JSON_COMPACT);
    assert_string_equal(js, "{\"fp8-bl\\u007fck\":\"\\u009bx\\u001B\"}"); /* jansson's C0: upper case */
    json_t *back = json_loads(js, 0, NULL);
    assert_true(json_equal(j, back));
    json_decref(back);
    json_decref(j);
    free(js);
}

/* The first byte of the file at path that the escaping rule never lets out: a C0 control
 * but '\n', DEL, a C1 control in UTF-8; -1 when none. */
static long raw_control_at(const char *path)
{
    size_t n;
    uint8_t *b = tu_read_file(path, &n);
    assert_non_null(b);
    long at = -1;
    for (size_t i = 0; i < n && at < 0; i++)
        if ((b[i] < 0x20 && b[i] != '\n') || b[i] == 0x7f || (b[i] == 0xc2 && i + 1 < n && b[i + 1] >= 0x80 && b[i + 1] <= 0x9f))
            at = (long)i;
    free(b);
    return at;
}

/* s with its first `old` after `from` replaced by `rep` (aborting the test when none) */
static char *replace_after(char *s, const char *from, const char *old, const char *rep)
{
    char *f = strstr(s, from);
    assert_non_null(f);
    char *p = strstr(f, old);
    assert_non_null(p);
    const size_t a = (size_t)(p - s), lo = strlen(old), lr = strlen(rep), n = strlen(s);
    char *t = malloc(n - lo + lr + 1);
    assert_non_null(t);
    memcpy(t, s, a);
    memcpy(t + a, rep, lr);
    memcpy(t + a + lr, p + lo, n - a - lo + 1);
    free(s);
    return t;
}

/* A hostile manifest, sealed as bfshard seals one (so that verify reads on): a tensor's
 * format with DEL (the fuzzer's "fp8-bl<DEL>ck"), another's with the C1 CSI, the
 * quant_method with ESC, and a weights file's hash with ESC (the fuzzer's "09feb43<ESC>bc..."),
 * over a compressed OUTDIR. inspect (text and --json) and verify print every one escaped. */
static void hostile_manifest_strings_escaped(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("hostile");
    char out[4096], mp[4096], rep[4096], *m;
    snprintf(out, sizeof out, "%s/out", tmp);
    snprintf(mp, sizeof mp, "%s/bfshard.manifest.json", out);
    snprintf(rep, sizeof rep, "%s/report", tmp);
    assert_int_equal(tu_sh("%s convert fixtures/fp8-block '%s' -w 2 -q --device cpu && %s compress '%s' -q", tu_bfshard(),
                           out, tu_bfshard(), out), 0);
    assert_non_null(m = tu_slurp(mp));
    m = replace_after(m, "\"tensors\"", "\"format\": \"fp8-block\"", "\"format\": \"fp8-bl\x7f" "ck\"");
    m = replace_after(m, "\"tensors\"", "\"format\": \"fp8-block\"", "\"format\": \"fp8-\\u009b2Jblock\"");
    m = replace_after(m, "\"quantization_config\"", "\"quant_method\": \"fp8\"", "\"quant_method\": \"fp\\u001b[2J8\"");
    char *h = strstr(strstr(m, "\"name\": \"shard-00002-model-00001-of-00001.safetensors\""), "\"xxh3_128\": \"");
    assert_non_null(h);
    char want[40], old[40]; /* the hash with its 8th digit an ESC (as JSON escapes it), and its closing '"' */
    snprintf(old, sizeof old, "%.33s", h + 13);
    snprintf(want, sizeof want, "%.7s\\u001b%.25s", h + 13, h + 21);
    m = replace_after(m, "\"name\": \"shard-00002-model-00001-of-00001.safetensors\"", old, want);
    want[strlen(want) - 1] = '\0'; /* what verify prints: the rule writes ESC as JSON did */
    char *seal = strstr(m, "\"manifest_xxh3_128\": \"");
    assert_non_null(seal);
    seal += strlen("\"manifest_xxh3_128\": \"");
    memset(seal, '0', 32);
    char hex[33];
    bfs__hash_hex(XXH3_128bits(m, strlen(m)), hex);
    memcpy(seal, hex, 32);
    assert_int_equal(tu_write_file(mp, m, strlen(m)), 0);
    free(m);

    assert_int_equal(tu_sh("%s inspect '%s' > '%s'", tu_bfshard(), out, rep), 0);
    assert_int_equal(raw_control_at(rep), -1);
    assert_int_equal(tu_sh("grep -qF 'fp8-bl\\u007fck 1' '%s' && grep -qF 'fp8-\\u009b2Jblock 1' '%s' && "
                           "grep -qF 'quantization fp\\u001b[2J8' '%s' && grep -qF 'manifest seal ok' '%s'",
                           rep, rep, rep, rep), 0);
    assert_int_equal(tu_sh("%s inspect '%s' --json > '%s'", tu_bfshard(), out, rep), 0);
    assert_int_equal(raw_control_at(rep), -1);
    json_t *j = json_load_file(rep, 0, NULL); /* the same JSON values, raw bytes and all */
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "formats"), "fp8-bl\x7f" "ck")), 1);
    json_decref(j);
    assert_int_equal(tu_sh("%s verify '%s' 2> '%s'", tu_bfshard(), out, rep), 7);
    assert_int_equal(raw_control_at(rep), -1);
    char *r = tu_slurp(rep);
    assert_non_null(r);
    assert_non_null(strstr(r, "shard-00002-model-00001-of-00001.safetensors.zst: BAD: decompressed hash "));
    assert_non_null(strstr(r, want)); /* the manifest's hash, escaped as the rule says */
    free(r);
    tu_rmrf(tmp);
    free(tmp);
}

/* A synthetic OUTDIR of NF files, every one of the right size and the wrong bytes, and
 * a manifest of NT tensors with a shard in each file: verify reports every file, each
 * narrowed to its shards. Linear: seconds. Quadratic (the old narrowing scanned all
 * NF x NT shards for each of the NF files: 7e9 lookups; the old extra-file check NF x NF):
 * far past any suite timeout. */
#define NF 30000
#define NT 8
static void large_manifest_verify_linear(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("big");
    char p[4096];
    json_t *m = json_object(), *files = json_array(), *tensors = json_array();
    static const char zero[] = "00000000000000000000000000000000";
    for (int f = 0; f < NF; f++) {
        char name[64];
        snprintf(name, sizeof name, "shard-%05d.safetensors", f);
        snprintf(p, sizeof p, "%s/%s", tmp, name);
        assert_int_equal(tu_write_file(p, "0123456789abcdef", 16), 0);
        json_array_append_new(files, json_pack("{s:s, s:i, s:s, s:s}", "name", name, "size", 16, "xxh3_128", zero,
                                               "kind", "weights"));
    }
    for (int t = 0; t < NT; t++) {
        json_t *shards = json_array();
        for (int f = 0; f < NF; f++) {
            char name[64];
            snprintf(name, sizeof name, "shard-%05d.safetensors", f);
            json_array_append_new(shards, json_pack("{s:s, s:i, s:i, s:s}", "file", name, "offset", 8 + t, "nbytes", 1,
                                                    "xxh3_128", zero));
        }
        char tn[32];
        snprintf(tn, sizeof tn, "t%d", t);
        json_array_append_new(tensors, json_pack("{s:s, s:o}", "name", tn, "shards", shards));
    }
    json_object_set_new(m, "files", files);
    json_object_set_new(m, "tensors", tensors);
    snprintf(p, sizeof p, "%s/bfshard.manifest.json", tmp);
    assert_int_equal(json_dump_file(m, p, JSON_COMPACT), 0);
    json_decref(m);
    uint64_t checked = 0;
    snprintf(p, sizeof p, "%s/report", tmp);
    FILE *rep = fopen(p, "w");
    assert_int_equal(bfs_verify(tmp, rep, &checked), BFS_EVERIFY);
    fclose(rep);
    assert_int_equal(checked, (uint64_t)NF * 16);
    /* every file's every shard reported: NF x NT "BAD tensor" lines */
    assert_int_equal(tu_sh("test $(grep -c 'BAD tensor' '%s') -eq %d", p, NF * NT), 0);
    tu_rmrf(tmp);
    free(tmp);
}

/* A manifest that lists one file twice (a red-team case at scale: 3,000 copies of one
 * files[] entry, verified once each) is refused before anything is hashed: exit 3, one
 * line naming the manifest and the file. */
static void duplicate_files_refused(void **s)
{
    (void)s;
    char *tmp = tu_tmpdir("dupfiles");
    char p[4096];
    static const char zero[] = "00000000000000000000000000000000";
    snprintf(p, sizeof p, "%s/shard-00001.safetensors", tmp);
    assert_int_equal(tu_write_file(p, "0123456789abcdef", 16), 0);
    json_t *files = json_array();
    for (int i = 0; i < 3000; i++)
        json_array_append_new(files, json_pack("{s:s, s:i, s:s, s:s}", "name", "shard-00001.safetensors", "size", 16,
                                               "xxh3_128", zero, "kind", "weights"));
    json_t *m = json_pack("{s:o, s:[]}", "files", files, "tensors");
    snprintf(p, sizeof p, "%s/bfshard.manifest.json", tmp);
    assert_int_equal(json_dump_file(m, p, JSON_COMPACT), 0);
    json_decref(m);
    uint64_t checked = 0;
    assert_int_equal(bfs_verify(tmp, NULL, &checked), BFS_EINPUT);
    assert_int_equal(checked, 0);
    assert_non_null(strstr(bfs_last_error(), "lists \"shard-00001.safetensors\" more than once"));
    assert_null(strchr(bfs_last_error(), '\n'));
    tu_rmrf(tmp);
    free(tmp);
}

int main(int argc, char **argv)
{
    if (argc > 1) /* one test by name (a glob), for a quick rerun */
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(overflowing_shapes_refused),
        cmocka_unit_test(input_rewritten_in_place),
        cmocka_unit_test(source_hashes_of_read_bytes),
        cmocka_unit_test(source_hashes_of_parts),
        cmocka_unit_test(decompress_empty_frame_checked),
        cmocka_unit_test(json_from_every_command),
        cmocka_unit_test(unaligned_float32_tensors),
        cmocka_unit_test(nul_in_dtype_refused),
        cmocka_unit_test(symlink_loop_is_bad_input),
        cmocka_unit_test(oversized_side_files),
        cmocka_unit_test(zero_element_tensor_needs_no_memory),
        cmocka_unit_test(allocation_failure_is_exit_5),
        cmocka_unit_test(names_escaped),
        cmocka_unit_test(escape_rule),
        cmocka_unit_test(hostile_manifest_strings_escaped),
        cmocka_unit_test(large_manifest_verify_linear),
        cmocka_unit_test(duplicate_files_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
