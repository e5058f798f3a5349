/*
 * Manifest v2 (docs/MANIFEST.md): the manifest holds what each tensor is, not a
 * record per (tensor, rank); each weights file's slice hashes are in its own slice index
 * (NAME.slices) written by the process that writes the file. Tested here: the manifest's
 * size does not grow with W but by a files[] entry a rank; each index has its size; a bad
 * byte is still narrowed to its tensor (plain and compressed), a bad header to the header,
 * a bad or malformed index to the file alone (no crash, exit 7); a manifest naming two
 * indexes for one file is refused; a part writes only its own indexes and merge's output
 * is byte for byte a whole run's; a part's manifest lists its ranks' share of tensors[]. And v1 outputs from the wild (tests/data/manifest-v1,
 * written by bfshard 119853f, built from `git archive`: revision "unknown") still verify, narrow, inspect, compress and merge.
 */
#include "testutil.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#define FIX "fixtures/mxfp4-tiny"
#define R2 "shard-00002-model-00001-of-00001"
#define V1 "tests/data/manifest-v1"

/* the binary and the fixtures by absolute path: some tests run from a temporary directory */
static const char *bin(void)
{
    static char p[4096];
    if (!p[0] && !realpath(tu_bfshard(), p))
        snprintf(p, sizeof p, "%s", tu_bfshard());
    return p;
}

static const char *here(void)
{
    static char p[4096];
    if (!p[0] && !getcwd(p, sizeof p))
        snprintf(p, sizeof p, ".");
    return p;
}

static long fsize(const char *dir, const char *name)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fclose(f);
    return n;
}

/* rewrite OUTDIR's manifest through a python expression on `m` (the seal then no longer matches) */
static int edit_manifest(const char *dir, const char *py)
{
    return tu_sh("python3 -c 'import json,sys; p=sys.argv[1]+\"/bfshard.manifest.json\"; m=json.load(open(p)); %s; "
                 "json.dump(m, open(p, \"w\"), indent=1)' '%s'",
                 py, dir);
}

static void size_does_not_grow_with_w(void **s)
{
    (void)s;
    char *t = tu_tmpdir("mv2size");
    assert_int_equal(tu_sh("cd '%s' && B='%s' && for w in 1 8; do $B convert '%s/" FIX "' w$w -w $w -q --device cpu || exit 1; done",
                           t, bin(), here()), 0);
    char w1[4096], w8[4096];
    snprintf(w1, sizeof w1, "%s/w1", t);
    snprintf(w8, sizeof w8, "%s/w8", t);
    const long m1 = fsize(w1, "bfshard.manifest.json"), m8 = fsize(w8, "bfshard.manifest.json");
    /* 7 more ranks: 7 weights entries and 7 slice index entries, ~200 bytes each */
    assert_true(m8 > m1 && m8 - m1 < 7 * 2 * 260);
    assert_int_equal(tu_sh("! grep -q '\"shards\"' '%s/bfshard.manifest.json' && grep -q '\"manifest_version\": 2' "
                           "'%s/bfshard.manifest.json'", w8, w8), 0);
    /* one index a weights file, 48 + 16 bytes a slice: rank 1 of 8 holds a slice of each of the 37 tensors but 0-d ones */
    assert_int_equal(tu_sh("test $(ls '%s'/*.slices | wc -l) -eq 8 && test $(ls '%s'/*.safetensors | wc -l) -eq 8", w8, w8), 0);
    assert_int_equal(tu_sh("python3 -c 'import json,sys,os; d=sys.argv[1]; m=json.load(open(d+\"/bfshard.manifest.json\")); "
                           "sl=[f for f in m[\"files\"] if f[\"kind\"]==\"slices\"]; assert len(sl)==8; "
                           "[os.path.getsize(d+\"/\"+f[\"name\"])==f[\"size\"] and (f[\"size\"]-48)%%16==0 or sys.exit(1) for f in sl]; "
                           "assert all(\"rank\" not in f for f in sl)' '%s'", w8), 0);
    tu_rmrf(t);
    free(t);
}

static void narrowing(void **s)
{
    (void)s;
    char *t = tu_tmpdir("mv2narrow");
    char o[4096], c[4096];
    snprintf(o, sizeof o, "%s/o", t);
    snprintf(c, sizeof c, "%s/c", t);
    assert_int_equal(tu_sh("'%s' convert " FIX " '%s' -w 3 -q --device cpu", bin(), o), 0);
    /* a data byte: its tensor */
    assert_int_equal(tu_sh("cp -r '%s' '%s' && printf U | dd of='%s/" R2 ".safetensors' bs=1 seek=100000 conv=notrunc 2>/dev/null",
                           o, c, c), 0);
    assert_int_equal(tu_sh("'%s' verify '%s' 2>'%s/rep'", bin(), c, t), 7);
    assert_int_equal(tu_sh("grep -q 'BAD tensor \"model.layers.1.mlp.experts.down_proj\" bytes \\[87184, 103568)' '%s/rep' && "
                           "test $(wc -l < '%s/rep') -eq 2", t, t), 0);
    /* a header byte: the header, not a tensor */
    assert_int_equal(tu_sh("rm -rf '%s' && cp -r '%s' '%s' && printf X | dd of='%s/" R2 ".safetensors' bs=1 seek=50 conv=notrunc "
                           "2>/dev/null", c, o, c, c), 0);
    assert_int_equal(tu_sh("'%s' verify '%s' 2>'%s/rep'", bin(), c, t), 7);
    assert_int_equal(tu_sh("grep -q 'BAD header or metadata bytes \\[0, 6272)' '%s/rep' && ! grep -q 'BAD tensor' '%s/rep'", t, t), 0);
    /* a bad index beside a bad weights file: both named, nothing narrowed, no crash */
    assert_int_equal(tu_sh("rm -rf '%s' && cp -r '%s' '%s' && printf X | dd of='%s/" R2 ".slices' bs=1 seek=60 conv=notrunc "
                           "2>/dev/null && printf U | dd of='%s/" R2 ".safetensors' bs=1 seek=100000 conv=notrunc 2>/dev/null",
                           c, o, c, c, c), 0);
    assert_int_equal(tu_sh("'%s' verify '%s' 2>'%s/rep'", bin(), c, t), 7);
    assert_int_equal(tu_sh("grep -q 'its slice index " R2 ".slices does not match the manifest' '%s/rep' && "
                           "grep -q '" R2 ".slices: BAD' '%s/rep' && ! grep -q 'BAD tensor' '%s/rep'", t, t, t), 0);
    /* a malformed index the (edited) manifest vouches for: not narrowed, said so */
    assert_int_equal(tu_sh("rm -rf '%s' && cp -r '%s' '%s' && printf U | dd of='%s/" R2 ".safetensors' bs=1 seek=100000 "
                           "conv=notrunc 2>/dev/null && head -c 100 '%s/" R2 ".slices' > '%s/x' && mv '%s/x' '%s/" R2 ".slices'",
                           c, o, c, c, c, c, c, c), 0);
    assert_int_equal(edit_manifest(c, "import subprocess; f=[f for f in m[\"files\"] if f[\"name\"]==\"" R2 ".slices\"][0]; "
                                      "f[\"size\"]=100; f[\"xxh3_128\"]=subprocess.check_output([\"xxh128sum\", sys.argv[1]+"
                                      "\"/" R2 ".slices\"]).split()[0].decode()"), 0);
    assert_int_equal(tu_sh("'%s' verify '%s' 2>'%s/rep'", bin(), c, t), 7);
    assert_int_equal(tu_sh("grep -q 'not narrowed to tensors: " R2 ".slices: malformed slice index' '%s/rep'", t), 0);
    /* two indexes for one weights file: not a manifest bfshard wrote */
    assert_int_equal(tu_sh("rm -rf '%s' && cp -r '%s' '%s'", c, o, c), 0);
    assert_int_equal(edit_manifest(c, "f=[f for f in m[\"files\"] if f[\"kind\"]==\"slices\"]; g=dict(f[0]); "
                                      "g[\"name\"]=\"other.slices\"; m[\"files\"].append(g)"), 0);
    assert_int_equal(tu_sh("'%s' verify '%s' 2>'%s/rep'", bin(), c, t), 3);
    assert_int_equal(tu_sh("grep -q 'lists two slice indexes for' '%s/rep'", t), 0);
    /* a compressed copy, the original removed: narrowed through the decompressor */
    assert_int_equal(tu_sh("rm -rf '%s' && cp -r '%s' '%s' && '%s' compress '%s' -q --rm", c, o, c, bin(), c), 0);
    assert_int_equal(tu_sh("cd '%s' && python3 -c 'import sys; p=sys.argv[1]; b=bytearray(open(p,\"rb\").read()); "
                           "b[len(b)//2]^=1; open(p,\"wb\").write(b)' " R2 ".safetensors.zst", c), 0);
    assert_int_equal(tu_sh("'%s' verify '%s' 2>'%s/rep'", bin(), c, t), 7);
    assert_int_equal(tu_sh("grep -q 'BAD compressed file' '%s/rep'", t), 0);
    tu_rmrf(t);
    free(t);
}

static void parts_write_their_own_indexes(void **s)
{
    (void)s;
    char *t = tu_tmpdir("mv2parts");
    assert_int_equal(tu_sh("cd '%s' && B='%s' && F='%s/" FIX "' && $B convert $F whole -w 4 -q --device cpu && "
                           "$B convert $F p -w 4 --ranks 0-2 -q --device cpu && ls p/*.slices | wc -l | grep -qx 3 && "
                           "$B verify p -q && $B convert $F p -w 4 --ranks 3 -q --device cpu",
                           t, bin(), here()), 0);
    /* each part's manifest hashes only its own ranks' indexes */
    assert_int_equal(tu_sh("cd '%s' && python3 -c 'import json; m=json.load(open(\"p/bfshard.part-3.json\")); "
                           "h=[f[\"xxh3_128\"] is not None for f in m[\"files\"] if f[\"kind\"]==\"slices\"]; "
                           "assert h==[False,False,False,True], h'", t), 0);
    assert_int_equal(tu_sh("cd '%s' && '%s' merge p -q && for f in whole/*; do cmp \"$f\" p/$(basename \"$f\") || exit 1; done && "
                           "test $(ls p | wc -l) -eq $(ls whole | wc -l) && '%s' verify p -q", t, bin(), bin()), 0);
    tu_rmrf(t);
    free(t);
}

/* A part's manifest lists its ranks' share of tensors[] (docs/MANIFEST.md): the parts'
 * shares, in any order, cover it once and merge puts them together byte for byte; a part
 * from a bfshard before shares (every tensor) merges beside them; a part short of a tensor
 * is refused (exit 10) and nothing is written. */
static void parts_hold_their_share_of_tensors(void **s)
{
    (void)s;
    char *t = tu_tmpdir("mv2share");
    const char *B = bin();
    assert_int_equal(tu_sh("cd '%s' && F='%s/" FIX "' && '%s' convert $F whole -w 8 -q --device cpu && "
                           "for r in 4-7 0 1-3; do '%s' convert $F p -w 8 --ranks $r -q --device cpu || exit 1; done && "
                           "python3 '%s/tests/part_tensors.py' check whole/bfshard.manifest.json 8 p/bfshard.part-4-7.json "
                           "p/bfshard.part-0.json p/bfshard.part-1-3.json && cp -r p old && cp -r p short",
                           t, here(), B, B, here()), 0);
    assert_int_equal(tu_sh("cd '%s' && python3 '%s/tests/part_tensors.py' oldstyle old/bfshard.part-1-3.json "
                           "whole/bfshard.manifest.json && '%s' merge old -q && cmp old/bfshard.manifest.json "
                           "whole/bfshard.manifest.json", t, here(), B), 0);
    assert_int_equal(tu_sh("cd '%s' && python3 '%s/tests/part_tensors.py' drop short/bfshard.part-4-7.json && "
                           "'%s' merge short 2>rep", t, here(), B), 10);
    assert_int_equal(tu_sh("cd '%s' && grep -q 'bfshard.part-4-7.json lists .* tensors where its ranks hold' rep && "
                           "test $(wc -l <rep) -eq 1 && test ! -e short/bfshard.manifest.json", t), 0);
    assert_int_equal(tu_sh("cd '%s' && '%s' merge p -q && for f in whole/*; do cmp \"$f\" p/$(basename \"$f\") || exit 1; done "
                           "&& '%s' verify p -q", t, B, B), 0);
    tu_rmrf(t);
    free(t);
}

static void v1_outputs_still_work(void **s)
{
    (void)s;
    char *t = tu_tmpdir("mv2v1");
    const char *B = bin();
    assert_int_equal(tu_sh("cp -r " V1 "/whole " V1 "/parts '%s'/ && cd '%s' && grep -q '\"manifest_version\": 1' whole/bfshard.manifest.json",
                           t, t), 0);
    assert_int_equal(tu_sh("cd '%s' && '%s' verify whole -q && '%s' inspect whole | grep -q 'of 24 shard(s)' && '%s' verify parts -q",
                           t, B, B, B), 0);
    /* narrowing from v1's per-shard hashes */
    assert_int_equal(tu_sh("cd '%s' && cp -r whole bad && printf U | dd of=bad/shard-00001-model-00001-of-00001.safetensors bs=1 "
                           "seek=20000 conv=notrunc 2>/dev/null", t), 0);
    assert_int_equal(tu_sh("cd '%s' && '%s' verify bad 2>rep", t, B), 7);
    assert_int_equal(tu_sh("cd '%s' && grep -q 'BAD tensor' rep", t), 0);
    /* merge of v1 parts: a v1 manifest, the one the whole v1 run wrote */
    assert_int_equal(tu_sh("cd '%s' && '%s' merge parts -q && cmp parts/bfshard.manifest.json whole/bfshard.manifest.json && "
                           "cmp parts/xxh128sums.txt whole/xxh128sums.txt && '%s' verify parts -q", t, B, B), 0);
    /* compress keeps it v1 and verifiable */
    assert_int_equal(tu_sh("cd '%s' && '%s' compress whole -q --rm && grep -q '\"manifest_version\": 1' whole/bfshard.manifest.json && "
                           "'%s' verify whole -q", t, B, B), 0);
    tu_rmrf(t);
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(size_does_not_grow_with_w),
        cmocka_unit_test(narrowing),
        cmocka_unit_test(parts_write_their_own_indexes),
        cmocka_unit_test(parts_hold_their_share_of_tensors),
        cmocka_unit_test(v1_outputs_still_work),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
