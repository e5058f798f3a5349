#!/usr/bin/env python3
"""Write the seed corpora of the fuzz targets into fuzz/corpus/<target>/.

Files named by a 40-hex SHA-1 there are inputs grown by fuzzing and minimised with
`fuzz_<target> -merge=1 NEW_DIR fuzz/corpus/<target> build/fuzz/corpus/<target>`;
this script keeps them and rewrites only its own, named, seeds.

Deterministic: run from the repository root (`python3 fuzz/gen_corpus.py`), it
rewrites the same files. Seeds are the fixtures' headers and small synthetic
checkpoints of every kind bfshard plans (MXFP4 3-d/4-d, bnb NF4/FP4 with and
without double quant, casts, passthrough, scalars, empty tensors), plus hand-made
edge cases. Code tables are copied from the fixtures (bitsandbytes' own bytes).
Input formats: see the comment at the top of each fuzz/fuzz_<target>.c.

The seeds of manifest, sums, claim and oci are real outputs: build/bfshard (make) converts
the fixtures into the OUTDIRs of fuzz_common.c's fz_outdirs[] (and a few more: W = 1,
3, 8, both layouts, parts, compressed); each manifest's "revision" is set to "seed" and
the manifest sealed again (xxh128sum), so they do not change with the commit. oci's are
layouts `bfshard pack` wrote of such OUTDIRs (fuzz_oci.c's fz_oci_bases[]: W = 1, 2, 8, dcp
and hf, --sha256 or not, compressed copies beside), their JSON blobs and small files as parts.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fuzz", "corpus")
SEP = b"\n--bfs--\n"
DTSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4, "I32": 4,
          "F32": 4, "U64": 8, "I64": 8, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def read_st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return b, n, json.loads(b[8:8 + n])


def tensor_bytes(path, name):
    b, n, h = read_st(path)
    s, e = h[name]["data_offsets"]
    return b[8 + n + s:8 + n + e]


def st(tensors, meta=None, pad=8):
    """tensors: list of (name, dtype, shape, bytes) in file order -> safetensors bytes."""
    hdr, pos = {}, 0
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape, data in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % pad)
    return struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors)


def nelem(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def pattern(n, seed=1):
    return bytes(((i * 37 + seed * 11) ^ (i >> 3)) & 0xFF for i in range(n))


NF4_QM = tensor_bytes(f"{ROOT}/fixtures/bnb-nf4/model.safetensors", "model.layers.0.self_attn.k_proj.weight.quant_map")
FP4_QM = tensor_bytes(f"{ROOT}/fixtures/bnb-fp4/model.safetensors", "model.layers.0.self_attn.k_proj.weight.quant_map")
NESTED_QM = tensor_bytes(f"{ROOT}/fixtures/bnb-nf4-dq/model.safetensors",
                         "model.layers.0.self_attn.k_proj.weight.nested_quant_map")


def f32s(vals):
    return b"".join(struct.pack("<f", v) for v in vals)


def bnb(prefix, qt, shape, bs=64, dq=False, nbs=256):
    """The tensors of one bitsandbytes 4-bit weight, F32 ones first (aligned)."""
    n = nelem(shape)
    nblocks = -(-n // bs)
    blob = {"quant_type": qt, "blocksize": bs, "dtype": "bfloat16", "shape": shape}
    f32, u8 = [], []
    f32.append((prefix + ".quant_map", "F32", [16], NF4_QM if qt == "nf4" else FP4_QM))
    if dq:
        nn = -(-nblocks // nbs)
        blob.update({"nested_blocksize": nbs, "nested_dtype": "float32", "nested_offset": 0.125})
        f32.append((prefix + ".nested_absmax", "F32", [nn], f32s([0.5 + i for i in range(nn)])))
        f32.append((prefix + ".nested_quant_map", "F32", [256], NESTED_QM))
        u8.append((prefix + ".absmax", "U8", [nblocks], pattern(nblocks, 3)))
    else:
        f32.append((prefix + ".absmax", "F32", [nblocks], f32s([0.25 * (i + 1) for i in range(nblocks)])))
    u8.append((prefix, "U8", [(n + 1) // 2, 1], pattern((n + 1) // 2, 5)))
    b = json.dumps(blob).encode()
    u8.append((prefix + ".quant_state.bitsandbytes__" + qt, "U8", [len(b)], b))
    return f32, u8


def mx(prefix, shape):
    """MXFP4 blocks + scales, shape = blocks' shape ([E,R,G,16] or [R,G,16])."""
    return [(prefix + "_blocks", "U8", shape, pattern(nelem(shape), 7)),
            (prefix + "_scales", "U8", shape[:-1], bytes(120 + (i % 16) for i in range(nelem(shape[:-1]))))]


def plain(name, dt, shape, seed=9):
    return (name, dt, shape, pattern(nelem(shape) * DTSIZE[dt], seed))


def synthetic_models():
    """name -> safetensors bytes, small and valid."""
    m = {}
    m["mxfp4_4d"] = st(mx("model.layers.0.mlp.experts.gate_up_proj", [2, 6, 2, 16])
                       + mx("model.layers.0.mlp.experts.down_proj", [2, 3, 1, 16])
                       + [plain("model.layers.0.mlp.experts.down_proj_bias", "BF16", [2, 3])],
                       meta={"format": "pt"})
    m["mxfp4_3d"] = st(mx("w", [5, 1, 16]) + [plain("norm.weight", "F32", [4])])
    f32, u8 = bnb("model.layers.0.mlp.down_proj.weight", "nf4", [5, 33])
    m["bnb_nf4"] = st(f32 + [plain("model.norm.weight", "BF16", [33])] + u8, meta={"format": "pt"})
    f32, u8 = bnb("model.layers.0.self_attn.q_proj.weight", "fp4", [7, 40], bs=32, dq=True, nbs=4)
    m["bnb_fp4_dq"] = st(f32 + u8)
    f32a, u8a = bnb("a.weight", "nf4", [3, 3], dq=True)
    f32b, u8b = bnb("b.weight", "fp4", [1], bs=64)
    m["bnb_mixed_odd"] = st(f32a + f32b + u8a + u8b)
    m["casts"] = st([plain("f64", "F64", [2, 3]), plain("f32", "F32", [3, 2]), plain("f16", "F16", [5]),
                     plain("bf16", "BF16", [2, 2]), plain("i64", "I64", [2]), plain("u8", "U8", [3]),
                     plain("bool", "BOOL", [2]), plain("e4m3", "F8_E4M3", [4])])
    m["scalars_empty"] = st([plain("s32", "F32", []), ("empty", "F16", [0, 4], b""), ("e2", "BF16", [3, 0], b""),
                             plain("s16", "BF16", [])])
    m["empty_file"] = st([])
    m["mixed"] = st([plain("lm_head.weight", "F32", [9, 4])] + mx("m.experts.x", [3, 9, 1, 16]))
    return m


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


FIXTURE_FILES = ["mxfp4-tiny/model-00001-of-00002.safetensors", "mxfp4-tiny/model-00002-of-00002.safetensors",
                 "bnb-nf4/model.safetensors", "bnb-nf4-dq/model.safetensors", "bnb-fp4/model.safetensors",
                 "bnb-fp4-dq/model.safetensors", "bnb-nf4-dq-bs128/model.safetensors"]


def gen_st_parse(models):
    # the fixtures' headers; V = the size of their data section
    for f in FIXTURE_FILES:
        b, n, _ = read_st(f"{ROOT}/fixtures/{f}")
        write("st_parse", "fixture_" + f.replace("/", "_").replace(".safetensors", ""),
              struct.pack("<Q", len(b) - 8 - n) + b[:8 + n])
    for k, v in models.items():
        write("st_parse", "synth_" + k, struct.pack("<Q", 0) + v)

    def hdr(h, data_len=0, hl=None):
        hb = h.encode("utf-8", "surrogatepass") if isinstance(h, str) else h
        return struct.pack("<Q", 0) + struct.pack("<Q", len(hb) if hl is None else hl) + hb + b"\0" * data_len

    edge = {
        "empty_obj": hdr("{}"),
        "padded": hdr('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}      ', 2),
        "zero_size_same_offset": hdr('{"z":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},'
                                     '"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}', 3),
        "dup_key": hdr('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', 2),
        "overlap": hdr('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}', 3),
        "gap": hdr('{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', 2),
        "overflow_shape": hdr('{"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}}', 4),
        "huge_offsets": hdr('{"a":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,0]}}'),
        "neg_shape": hdr('{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}', 1),
        "nine_dims": hdr('{"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}}', 1),
        "nul_in_name": hdr('{"a\\u0000b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a\\u0000c":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', 2),
        "metadata_nonstring": hdr('{"__metadata__":{"k":1}}'),
        "metadata_nested": hdr('{"__metadata__":{"k":"v","DCP_SHARDING_INFO":"{\\"a\\":1}"}}'),
        "bad_utf8": hdr(b'{"\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1),
        "hlen_past_eof": hdr("{}", 0, 1000),
        "hlen_over_limit": hdr("{}", 0, 100000001),
        "not_object": hdr("[1,2]"),
        "deep": hdr("{" + '"a":' * 1 + "[" * 3000 + "]" * 3000 + "}"),
        "unsupported_dtype": hdr('{"a":{"dtype":"F8_E8M0","shape":[1],"data_offsets":[0,1]}}', 1),
        "float_offset": hdr('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1.0]}}', 1),
        "big_int": hdr('{"a":{"dtype":"U8","shape":[99999999999999999999],"data_offsets":[0,1]}}', 1),
    }
    for k, v in edge.items():
        write("st_parse", "edge_" + k, v)
    # a large virtual data section behind a small header
    h = b'{"big":{"dtype":"U8","shape":[4294967296],"data_offsets":[0,4294967296]}}'
    write("st_parse", "edge_virtual_4g", struct.pack("<Q", 1 << 32) + struct.pack("<Q", len(h)) + h)


def gen_plan(models):
    for k, v in models.items():
        write("plan", "synth_" + k, bytes([0x02]) + v)            # W = 3, hf MXFP4 layout, scalar
    write("plan", "synth_mxfp4_4d_openai_w16", bytes([0x1F | 0x80]) + models["mxfp4_4d"])
    write("plan", "synth_bnb_fp4_dq_hf", bytes([0x40 | 0x03]) + models["bnb_fp4_dq"])
    write("plan", "synth_casts_keep_w2", bytes([0x21]) + models["casts"])
    # edge cases of grouping
    write("plan", "edge_blocks_without_scales", b"\x01" + st(mx("x", [1, 2, 1, 16])[:1]))
    write("plan", "edge_scales_shape", b"\x01" + st([mx("x", [1, 2, 1, 16])[0], ("x_scales", "U8", [1, 3, 1], b"abc")]))
    write("plan", "edge_bare_suffix", b"\x01" + st(mx("", [1, 1, 1, 16])))
    write("plan", "edge_metadata_name", b"\x01" + st(mx("__metadata__", [1, 1, 1, 16])))
    write("plan", "edge_name_clash", b"\x01" + st(mx("x", [1, 1, 1, 16]) + [plain("x", "BF16", [1])]))
    f32, u8 = bnb("p.weight", "nf4", [4, 4])
    write("plan", "edge_bnb_no_state", b"\x01" + st(f32 + u8[:-1]))
    write("plan", "edge_bnb_path_name", b"\x01" + st([plain("../../etc/passwd", "BF16", [2]), plain("/abs/x", "F32", [1])]))


def gen_input(models):
    cfg_mx = open(f"{ROOT}/fixtures/mxfp4-tiny/config.json", "rb").read()
    cfg_bnb = open(f"{ROOT}/fixtures/bnb-nf4-dq/config.json", "rb").read()
    a = st(mx("model.layers.0.mlp.experts.down_proj", [2, 3, 1, 16]) + [plain("model.norm.weight", "BF16", [4])])
    b = st([plain("lm_head.weight", "F32", [3, 4])] + bnb("model.layers.0.q.weight", "nf4", [3, 5])[0]
           + bnb("model.layers.0.q.weight", "nf4", [3, 5])[1])
    names_a = ["model.layers.0.mlp.experts.down_proj_blocks", "model.layers.0.mlp.experts.down_proj_scales",
               "model.norm.weight"]
    _, _, hb = read_st_bytes(b)
    wm = {n: "model-00001-of-00003.safetensors" for n in names_a}
    wm.update({n: "model-00002-of-00003.safetensors" for n in hb if n != "__metadata__"})
    index = json.dumps({"metadata": {"total_size": len(a) + len(b)}, "weight_map": wm}, indent=2).encode()

    def inp(flags, opts, parts):
        return bytes([flags, opts]) + SEP.join(parts)

    # flags: bit0 index, bit1 config, bits2-3 number of .safetensors parts, bit4 open the first file
    write("input", "index_config_2files", inp(0b1011, 0x02, [index, cfg_mx, a, b]))
    write("input", "index_config_bnb_w5", inp(0b1011, 0x04, [index, cfg_bnb, a, b]))
    write("input", "noindex_config_2files", inp(0b1010, 0x01, [b"", cfg_mx, a, b]))
    write("input", "noindex_noconfig_1file", inp(0b0100, 0x00, [b"", b"", a]))
    write("input", "single_file_with_config", inp(0b10110, 0x00, [b"", cfg_bnb, b]))
    write("input", "real_index_missing_files", inp(0b0011, 0x00,
                                                   [open(f"{ROOT}/fixtures/mxfp4-tiny/model.safetensors.index.json", "rb").read(), cfg_mx]))
    bad = {
        "index_path_escape": {"weight_map": {"model.norm.weight": "../model-00001-of-00003.safetensors"}},
        "index_abs_path": {"weight_map": {"model.norm.weight": "/etc/passwd"}},
        "index_wrong_file": dict(weight_map={**wm, "model.norm.weight": "model-00002-of-00003.safetensors"}),
        "index_unlisted": {"weight_map": {k: v for k, v in wm.items() if k != "lm_head.weight"}},
        "index_extra": dict(weight_map={**wm, "ghost": "model-00001-of-00003.safetensors"}),
        "index_not_string": {"weight_map": {"model.norm.weight": 3}},
        "index_no_map": {"metadata": {}},
        "index_empty_map": {"weight_map": {}},
    }
    for k, v in bad.items():
        write("input", k, inp(0b1011, 0x01, [json.dumps(v).encode(), cfg_mx, a, b]))
    write("input", "index_dup_keys", inp(0b1011, 0x01, [b'{"weight_map":{"a":"x","a":"y"}}', cfg_mx, a, b]))
    write("input", "config_not_object", inp(0b1010, 0x01, [b"", b"[1,2,3]", a, b]))
    write("input", "config_invalid", inp(0b1010, 0x01, [b"", b'{"quantization_config": {', a, b]))
    write("input", "config_dup", inp(0b1010, 0x01, [b"", b'{"torch_dtype":"a","torch_dtype":"b"}', a, b]))
    write("input", "config_nul", inp(0b1010, 0x01, [b"", b'{"a":"\\u0000"}\x00junk', a, b]))


def read_st_bytes(b):
    n = struct.unpack("<Q", b[:8])[0]
    return b, n, json.loads(b[8:8 + n])


def gen_bnb_blob():
    def blob(opts, sel, text):
        return bytes([opts, sel]) + (text.encode() if isinstance(text, str) else text)

    # sel bits 6-7: 0 bnb-nf4-dq, 1 bnb-nf4, 2 bnb-fp4-dq, 3 bnb-fp4; bits 0-5: which blob
    fx = ["bnb-nf4-dq", "bnb-nf4", "bnb-fp4-dq", "bnb-fp4"]
    for i, f in enumerate(fx):
        b, n, h = read_st(f"{ROOT}/fixtures/{f}/model.safetensors")
        blobs = sorted(k for k in h if "quant_state" in k)
        s, e = h[blobs[0]]["data_offsets"]
        write("bnb_blob", f"fixture_{f}", bytes([0x02, i << 6]) + b[8 + n + s:8 + n + e])
    dq = ('{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [45, 401], '
          '"nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.13110871613025665}')
    edge = {
        "blocksize_0": dq.replace('"blocksize": 64', '"blocksize": 0'),
        "blocksize_huge": dq.replace('"blocksize": 64', '"blocksize": 1048576'),
        "blocksize_neg": dq.replace('"blocksize": 64', '"blocksize": -64'),
        "nested_bs_1": dq.replace('"nested_blocksize": 256', '"nested_blocksize": 1'),
        "nested_bs_0": dq.replace('"nested_blocksize": 256', '"nested_blocksize": 0'),
        "shape_scalar": dq.replace('[45, 401]', '[]'),
        "shape_flat": dq.replace('[45, 401]', '[18045]'),
        "shape_3d": dq.replace('[45, 401]', '[5, 9, 401]'),
        "shape_zero": dq.replace('[45, 401]', '[0, 401]'),
        "shape_overflow": dq.replace('[45, 401]', '[4611686018427387904, 4]'),
        "shape_neg": dq.replace('[45, 401]', '[-45, -401]'),
        "qt_mismatch": dq.replace('"quant_type": "nf4"', '"quant_type": "fp4"'),
        "dtype_unknown": dq.replace('"bfloat16"', '"int8"'),
        "nested_dtype_f16": dq.replace('"nested_dtype": "float32"', '"nested_dtype": "float16"'),
        "offset_string": dq.replace('0.13110871613025665', '"x"'),
        "offset_inf": dq.replace('0.13110871613025665', '1e999'),
        "no_nested_offset": dq.replace(', "nested_offset": 0.13110871613025665', ''),
        "not_object": "[1, 2]",
        "truncated": dq[:40],
        "dup_key": dq.replace('{"quant_type": "nf4",', '{"quant_type": "nf4", "quant_type": "nf4",'),
        "nul": dq[:20] + "\0" + dq[21:],
        "empty": "",
    }
    for k, v in edge.items():
        write("bnb_blob", "edge_" + k, blob(0x02, 0, v))


# ---- the readers of what bfshard writes: real outputs -----------------------------------
BFSHARD = os.path.join(ROOT, "build", "bfshard")
SEAL_KEY = b'"manifest_xxh3_128": "'
# fuzz_common.c's fz_outdirs[], in order: fixture, W, layout, compress, max shard size, ranks
OUTDIRS = [("ct-fp8-block", 1, "dcp", None, None, None),
           ("ct-moe-mixed", 3, "dcp", None, None, None),
           ("fp8-block-split", 8, "dcp", None, None, None),
           ("mxfp4-tiny", 1, "hf", None, None, None),
           ("bnb-nf4", 3, "dcp", "zstd:3", None, None),
           ("ct-int4-asym", 3, "dcp", None, None, ("0", "1-2")),
           ("modelopt-nvfp4", 8, "dcp", "zstd-bytegroup:1", None, None),
           ("bnb-fp4-dq", 1, "hf", None, 40000, None)]
# fuzz_claim.c's fz_claim_fixtures[], in order
CLAIM_FIXTURES = ["bnb-nf4", "bnb-nf4-dq", "bnb-fp4", "ct-fp8-block", "ct-fp8-channel", "ct-fp8-tensor",
                  "ct-int4-asym", "ct-int4-group", "ct-moe-mixed", "ct-nvfp4", "fp8-block", "fp8-block-split",
                  "modelopt-nvfp4", "mxfp4-tiny", "refuse/gptq-noconfig", "refuse/ok-int-tensors"]


def reseal(m):
    """m with its seal recomputed, as bfshard writes it (xxh128sum of the bytes, seal zeroed)."""
    i = m.rfind(SEAL_KEY)
    if i < 0 or m[i + len(SEAL_KEY) + 32:i + len(SEAL_KEY) + 33] != b'"':
        return m
    i += len(SEAL_KEY)
    z = m[:i] + b"0" * 32 + m[i + 32:]
    with tempfile.NamedTemporaryFile() as f:
        f.write(z)
        f.flush()
        h = subprocess.run(["xxh128sum", f.name], check=True, capture_output=True).stdout.split()[0]
    return z[:i] + h + z[i + 32:]


def normalize(m):
    """the commit's revision out of a manifest bfshard wrote, sealed again"""
    return reseal(re.sub(rb'"revision": "[^"]*"', b'"revision": "seed"', m, count=1))


def convert(tmp, fixture, w, layout="dcp", compress=None, max_shard=None, ranks=None, sha256=False):
    """OUTDIR of one conversion (in parts when ranks)"""
    out = os.path.join(tmp, "%s-w%d-%s-%s-%s%s" % (fixture.replace("/", "_"), w, layout, compress, ranks and "parts",
                                                   "-sha256" if sha256 else ""))
    for r in (ranks or [None]):
        cmd = [BFSHARD, "convert", os.path.join(ROOT, "fixtures", fixture), out, "--world-size", str(w),
               "--layout", layout, "--device", "cpu", "-T", "1"]
        cmd += ["--compress", compress] if compress else []
        cmd += ["--max-shard-size", str(max_shard)] if max_shard else []
        cmd += ["--ranks", r] if r else []
        cmd += ["--sha256"] if sha256 else []
        subprocess.run(cmd, check=True, capture_output=True)
    return out


def manifest_of(out, ranks=None):
    name = "bfshard.part-%s.json" % ranks[0] if ranks else "bfshard.manifest.json"
    return normalize(open(os.path.join(out, name), "rb").read())


def gen_manifest_sums(tmp):
    """fuzz_manifest: selector (bits 0-2 OUTDIR, bit 3 re-seal) + manifest;
    fuzz_sums: selector (bits 0-2 OUTDIR) + xxh128sums.txt [+ SEP + files[]]"""
    for k, (fx, w, layout, comp, ms, ranks) in enumerate(OUTDIRS):
        out = convert(tmp, fx, w, layout, comp, ms, ranks)
        m = manifest_of(out, ranks)
        write("manifest", "od%d" % k, bytes([k]) + m)
        write("manifest", "od%d_reseal" % k, bytes([k | 8]) + m)
        sums = open(os.path.join(out, "xxh128sums.txt"), "rb").read() if not ranks else b""
        write("sums", "od%d" % k, bytes([k]) + sums)
        if k == 4:
            lines = sums.splitlines(keepends=True)
            write("sums", "od4_crlf", bytes([k]) + b"".join(l.replace(b"\n", b"\r\n") for l in lines))
            write("sums", "od4_upper", bytes([k]) + sums.upper())
            write("sums", "od4_no_last_newline", bytes([k]) + sums.rstrip(b"\n"))
            write("sums", "od4_one_space", bytes([k]) + sums.replace(b"  ", b" ", 1))
            write("sums", "od4_dup_and_blank", bytes([k]) + lines[0] + b"\n" + lines[0] + b"".join(lines[1:]))
            files = json.loads(m)["files"]
            write("sums", "od4_own_files", bytes([k]) + sums + SEP + json.dumps(files).encode())
    # other real outputs: every kind of manifest over more fixtures (their OUTDIR is not the
    # harness's: verify reports every file, the reader and the rewrite go all the way)
    more = [("bnb-nf4-dq", 8, "dcp", None, None, None), ("ct-nvfp4", 1, "hf", None, None, None),
            ("fp8-block", 3, "dcp", "zstd:3", None, None), ("mxfp4-tiny", 8, "dcp", None, None, ("0-3", "4-7")),
            ("ct-int4-group", 1, "dcp", None, None, None)]
    for fx, w, layout, comp, ms, ranks in more:
        m = manifest_of(convert(tmp, fx, w, layout, comp, ms, ranks), ranks)
        write("manifest", "%s_w%d_%s%s%s" % (fx, w, layout, "_" + comp.split(":")[0] if comp else "",
                                             "_part" if ranks else ""), bytes([8]) + m)
    z = b'"manifest_xxh3_128": "00000000000000000000000000000000"'
    edge = {
        "minimal": b'{"files": [], "tensors": [], ' + z + b"}",
        "one_tensor": b'{"files": [{"name": "a.safetensors", "size": 72, "xxh3_128": "00000000000000000000000000000000"}], '
                      b'"tensors": [{"name": "t", "shards": [{"file": "a.safetensors", "offset": 8, "nbytes": 64, '
                      b'"xxh3_128": "zz"}]}], ' + z + b"}",
        "seal_first": b"{" + z + b', "files": [], "tensors": [{"name": "t\\u0001\\n\\"x"}]}',
        "seal_escaped_quote": b'{"files": [], "tensors": [], "manifest_xxh3_128": "0000000000000000000000000000000\\""}',
        "no_seal": b'{"files": [], "tensors": [{"name": "t", "shards": []}]}',
        "nested_seal_after": b'{"files": [], "tensors": [], ' + z + b', "source": {' + z + b"}}",
        "part_minimal": b'{"part": {"ranks": "0", "world_size": 3}, "plan_fingerprint": "x", "source": {"files": []}, '
                        b'"files": [{"name": "r0", "size": 1, "xxh3_128": null, "rank": 0}], "tensors": [], ' + z + b"}",
        "deep": b'{"files": [], "tensors": [{"x": ' + b"[" * 70 + b"]" * 70 + b"}], " + z + b"}",
        "scalars": b'{"files": [1, -2.5e3, true, false, null, "s"], "tensors": [{"a": 1E+2, "b": -0.0}], ' + z + b"}",
    }
    for k, v in edge.items():
        # the seal as written (bit 3 clear) where the harness's re-seal would change what is tested
        write("manifest", "edge_" + k, bytes([5 if k.startswith("part") else 0 if k.startswith("seal") else 8]) + v)

# fuzz_oci.c's fz_oci_bases[], in order: fixture, W, layout, --sha256, compress, max shard size
OCI_BASES = [("ct-fp8-block", 1, "dcp", True, None, None),
             ("ct-int4-group", 2, "dcp", False, None, None),
             ("bnb-fp4-dq", 1, "hf", True, None, 40000),
             ("modelopt-nvfp4", 8, "dcp", True, "zstd:3", None)]
OCI_SMALL = ("bfshard.manifest.json", "xxh128sums.txt", "sha256sums.txt", "config.json")


def oci_parts(oci):
    """a layout bfshard packed as fuzz_oci's parts: oci-layout, index.json, the manifest, the
    config, then the small layers (OCI_SMALL; the OUTDIR manifest normalized), each named by
    placeholder (@D<n> its digest, @S<n> its size); the rank files stay the harness's blobs"""
    rd = lambda h: open(os.path.join(oci, "blobs", "sha256", h), "rb").read()
    idx = open(os.path.join(oci, "index.json"), "rb").read()
    md = json.loads(idx)["manifests"][0]
    man_b = rd(md["digest"][7:])
    man = json.loads(man_b)
    cfg_b = rd(man["config"]["digest"][7:])
    small = [l for l in man["layers"] if l["annotations"]["org.cncf.model.filepath"] in OCI_SMALL]
    parts = [open(os.path.join(oci, "oci-layout"), "rb").read(), idx, man_b, cfg_b]
    ref = lambda d, n: (b'"digest":"%s","size":%d' % (d["digest"].encode(), d["size"]),
                        b'"digest":"@D%d","size":@S%d' % (n, n))
    for l in small:
        n = len(parts)
        b = rd(l["digest"][7:])
        if l["annotations"]["org.cncf.model.filepath"] == "bfshard.manifest.json":
            b = normalize(b)
            seal = b[b.rfind(SEAL_KEY) + len(SEAL_KEY):][:32]
            old = man["annotations"]["org.bfshard.manifest.xxh3_128"].encode()
            parts[2] = parts[2].replace(b'"org.bfshard.manifest.xxh3_128":"%s"' % old,
                                        b'"org.bfshard.manifest.xxh3_128":"%s"' % seal)
        parts.append(b)
        parts[2] = parts[2].replace(*ref(l, n))
        parts[3] = parts[3].replace(b'"%s"' % l["digest"].encode(), b'"@D%d"' % n)
    parts[2] = parts[2].replace(*ref(man["config"], 3))
    parts[1] = parts[1].replace(*ref(md, 2))
    return parts


def gen_oci(tmp):
    """fuzz_oci: selector (bits 0-1 base layout, 2 no base blobs, 3 first blob corrupt, 4 bfs_verify,
    5 index_set, 6 empty part = no file, 7 last blob a symlink) + parts (oci-layout, index.json, blobs)"""
    seeds = {}
    for k, (fx, w, layout, sha, comp, ms) in enumerate(OCI_BASES):
        out = convert(tmp, fx, w, layout, comp, ms, None, sha)
        oci = out + ".oci"
        subprocess.run([BFSHARD, "pack", out, oci], check=True, capture_output=True)
        seeds[k] = oci_parts(oci)
        write("oci", "pack_k%d" % k, bytes([k]) + SEP.join(seeds[k]))
    p = seeds[0]
    j = lambda parts: SEP.join(parts)
    for name, sel in (("public", 16), ("index_set", 32), ("corrupt_manifest", 8), ("symlink_last", 128),
                      ("no_base_blobs", 4)):
        write("oci", "pack_k0_" + name, bytes([sel]) + j(p))
    entry = json.loads(p[1].replace(b"@S2", b'"@S2"'))["manifests"][0]
    def idx(entries, extra=None):
        d = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries}
        d.update(extra or {})
        return json.dumps(d, separators=(",", ":")).encode().replace(b'"@S2"', b"@S2")
    tagged = lambda t, **kw: dict(entry, annotations={"org.opencontainers.image.ref.name": t}, **kw)
    skopeo = {k: v for k, v in entry.items() if k != "mediaType"}
    foreign = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "@D%d" % len(p),
               "size": "@S%d" % len(p)}
    fman = b'{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":' \
           b'{"mediaType":"application/vnd.oci.empty.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[]}'
    nested = {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": "sha256:" + "0" * 64, "size": 2}
    variants = {
        "skopeo_no_media_type": [idx([skopeo])],
        "two_tags_nested_foreign": [idx([tagged("v1"), nested, dict(foreign), tagged("latest")],
                                        {"annotations": {"x": "y"}}).replace(b'"@S%d"' % len(p), b"@S%d" % len(p))],
        "tag_control_chars": [idx([tagged("a\nb\u001b[31m")])],
        "missing_manifest_blob": [idx([dict(entry, digest="sha256:" + "1" * 64)])],
    }
    for name, (ix,) in variants.items():
        parts = [p[0], ix] + p[2:] + ([fman] if b"@D%d" % len(p) in ix else [])
        write("oci", "edge_" + name, bytes([32 if "tags" in name else 0]) + j(parts))
    man = p[2]
    fp = b'"org.cncf.model.filepath":"xxh128sums.txt"'
    layer_edits = {
        "layer_name_newline": man.replace(fp, b'"org.cncf.model.filepath":"xxh128sums\\n.txt"'),
        "layer_name_dotdot": man.replace(fp, b'"org.cncf.model.filepath":"../xxh128sums.txt"'),
        "layer_rank_odd": man.replace(b'"org.bfshard.rank":"0"', b'"org.bfshard.rank":" +0"'),
        "annotation_control_chars": man.replace(b'"org.bfshard.layout":"dcp"', b'"org.bfshard.layout":"d\\u0007cp"'),
        "config_size_huge": man.replace(b'"size":@S3', b'"size":9223372036854775807'),
    }
    for name, m in layer_edits.items():
        write("oci", "edge_" + name, bytes([0]) + j([p[0], p[1], m] + p[3:]))
    cfg = json.loads(p[3])
    cfg["config"]["quantization"] = "fp8\u001b[0m"
    cfg["descriptor"]["extra"] = 1
    write("oci", "edge_config_schema", bytes([0]) + j(p[:3] + [json.dumps(cfg, separators=(",", ":")).encode()] + p[4:]))
    small = {
        "layout_version_2": [b'{"imageLayoutVersion":"2.0.0"}', p[1]],
        "layout_not_json": [b"{", p[1]],
        "layout_absent": [b"", p[1]],
        "index_not_json": [p[0], b'{"manifests":['],
        "index_no_manifests": [p[0], b'{"schemaVersion":2}'],
        "index_empty": [p[0], b'{"schemaVersion":2,"manifests":[]}'],
        "index_schema_3": [p[0], b'{"schemaVersion":3,"manifests":[]}'],
        "index_absent": [p[0], b""],
    }
    for name, parts in small.items():
        write("oci", "edge_" + name, bytes([64 | 32 if "absent" in name else 32 if "index" in name else 0]) + j(parts))


def gen_slices(tmp):
    """fuzz_slices: 2-byte LE length k + k bytes of NAME.slices + the weights file it indexes
    (manifest v2): real pairs, then a few broken on purpose"""
    def pair(ix, w):
        return struct.pack("<H", len(ix)) + ix + w
    for j, (fx, w, layout) in enumerate((("ct-int4-asym", 2, "dcp"), ("ct-int4-group", 1, "hf"), ("bnb-nf4", 8, "dcp"))):
        out = convert(tmp, fx, w, layout)
        names = sorted(f for f in os.listdir(out) if f.endswith(".slices"))
        for k, n in enumerate(names[:1]):
            ix = open(os.path.join(out, n), "rb").read()
            wt = open(os.path.join(out, n[:-len(".slices")] + ".safetensors"), "rb").read()
            if len(ix) > 0xffff:
                continue
            tag = "%s_w%d_%s_%d" % (fx, w, layout, k)
            write("slices", tag, pair(ix, wt))
            if j == 0:
                bad = bytearray(wt)
                bad[-1] ^= 1
                write("slices", tag + "_bad_tail", pair(ix, bytes(bad)))
                write("slices", tag + "_short_index", pair(ix[:-8], wt))
                write("slices", tag + "_big_count", pair(ix[:40] + struct.pack("<Q", 1 << 60) + ix[48:], wt))
                write("slices", tag + "_truncated_weights", pair(ix, wt[:len(wt) // 2]))


def gen_claim():
    """fuzz_claim: selector (bits 0-3 checkpoint, bit 4 no config.json, bit 5 W = 3, bit 6 inspect,
    bit 7 best kernels) + config.json [+ SEP + quantize_config.json]"""
    for k, fx in enumerate(CLAIM_FIXTURES):
        d = os.path.join(ROOT, "fixtures", fx)
        cfg = open(os.path.join(d, "config.json"), "rb").read() if os.path.exists(os.path.join(d, "config.json")) else b""
        q = os.path.join(d, "quantize_config.json")
        sel = k | (16 if not cfg else 0) | (32 if k % 3 == 0 else 0) | (64 if k % 5 == 0 else 0)
        write("claim", fx.replace("/", "_"), bytes([sel]) + cfg + (SEP + open(q, "rb").read() if os.path.exists(q) else b""))
    qc = lambda k: json.loads(open(os.path.join(ROOT, "fixtures", CLAIM_FIXTURES[k], "config.json")).read())
    edits = []
    c = qc(10)  # fp8 weight_block_size
    for bs in ([1, 1], [0, 128], [1000000000, 1], [128], "x", [3, 5]):
        c["quantization_config"]["weight_block_size"] = bs
        edits.append((10, "fp8_block_%s" % re.sub(r"\W", "_", json.dumps(bs)), dict(c)))
    c = qc(10)
    c["quantization_config"]["quant_method"] = "FP8"
    edits.append((10, "fp8_upper", c))
    c = qc(0)
    del c["quantization_config"]["quant_method"]
    edits.append((0, "bnb_no_method_load_in_4bit", c))
    c = qc(3)
    c["quantization_config"]["config_groups"]["group_0"]["weights"]["block_structure"] = [1, 7]
    edits.append((3, "ct_block_1x7", c))
    c = qc(7)
    c["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 3
    edits.append((7, "ct_int4_group_3", c))
    c = qc(6)
    c["quantization_config"]["config_groups"]["group_0"]["weights"]["symmetric"] = True
    edits.append((6, "ct_int4_asym_says_symmetric", c))
    c = qc(12)
    c["quantization_config"]["quant_algo"] = "FP8"
    edits.append((12, "modelopt_says_fp8", c))
    c = qc(13)
    c["quantization_config"] = None
    edits.append((13, "mxfp4_null_claim", c))
    c = qc(8)
    c["quantization_config"]["config_groups"] = {"g%d" % i: {"format": "pack-quantized", "weights": {}}
                                                 for i in range(64)}
    edits.append((8, "ct_many_groups", c))
    for k, name, c in edits:
        write("claim", "edge_" + name, bytes([k]) + json.dumps(c, indent=1).encode())
    write("claim", "edge_gptq_no_method", bytes([14 | 16]) + b"" + SEP + b'{"bits": 4, "group_size": 32}')
    write("claim", "edge_method_nul", bytes([10]) + json.dumps(qc(10)).replace('"fp8"', '"fp8\\u0000x"').encode())
    write("claim", "edge_method_not_string", bytes([10]) + b'{"quantization_config": {"quant_method": 8}}')
    write("claim", "edge_qc_not_object", bytes([10]) + b'{"quantization_config": [1]}')


def main():
    # files named by a 40-hex SHA-1 were grown by fuzzing (libFuzzer -merge=1): kept
    for t in ("st_parse", "plan", "input", "bnb_blob", "manifest", "sums", "claim", "slices", "oci"):  # zst's are not ours
        dp = os.path.join(OUT, t)
        if os.path.isdir(dp):
            for f in os.listdir(dp):
                if not (len(f) == 40 and all(c in "0123456789abcdef" for c in f)):
                    os.remove(os.path.join(dp, f))
    models = synthetic_models()
    gen_st_parse(models)
    gen_plan(models)
    gen_input(models)
    gen_bnb_blob()
    if not os.path.exists(BFSHARD) or not shutil.which("xxh128sum"):
        raise SystemExit("gen_corpus.py: the manifest, sums, claim and oci seeds need build/bfshard (make) and xxh128sum")
    tmp = tempfile.mkdtemp(prefix="bfs-corpus-")
    try:
        gen_manifest_sums(tmp)
        gen_slices(tmp)
        gen_oci(tmp)
    finally:
        shutil.rmtree(tmp)
    gen_claim()
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(OUT) for f in fs)
    print(f"fuzz/corpus: {total} bytes")


if __name__ == "__main__":
    main()
