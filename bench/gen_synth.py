#!/usr/bin/env python3
"""Synthetic checkpoints with real shapes and key names, for `make bench`.

    python bench/gen_synth.py gpt-oss  OUTDIR --layers 2 [--vocab 201088]
    python bench/gen_synth.py bnb-nf4  OUTDIR --layers 2 [--vocab 128256]
    python bench/gen_synth.py fp8-block OUTDIR --layers 1 [--experts 256] [--vocab 129280]
    python bench/gen_synth.py tiny OUTDIR --tensors 200000 [--files 4] [--quant none|mxfp4]
    python bench/gen_synth.py dsv3-names OUTDIR --layers 61 --files 163 [--dim 256]

gpt-oss: gpt-oss-20b's tensors (MXFP4 experts: gate_up_proj_blocks [32, 5760, 90, 16],
down_proj_blocks [32, 2880, 90, 16], U8 scales around 127; BF16 attention, sinks,
router, biases, norms, embeddings, lm_head), one safetensors file per layer plus
one for the rest, model.safetensors.index.json and a config.json with the
mxfp4 quantization_config.

bnb-nf4: a Llama-3-8B-shaped model (hidden 4096, MLP 14336, 32/8 heads) quantized
with bitsandbytes NF4 + double quant as transformers saves it: P.weight U8
[(n+1)//2, 1], .absmax U8, .quant_map F32[16], .nested_absmax F32,
.nested_quant_map F32[256], .quant_state.bitsandbytes__nf4 (JSON). The tables
are the real ones (NF4 from FORMATS.md; the nested map, bitsandbytes'
create_dynamic_map, is read from fixtures/bnb-nf4-dq), the codes random, the
absmax codes and nested absmax plausible, so every scale is consistent.

fp8-block: DeepSeek-V3's FP8 layout (quant_method "fp8", weight_block_size [128, 128]):
P.weight F8_E4M3 + P.weight_scale_inv F32 [ceil(out/128), ceil(in/128)]. Layer 0 is a
dense layer (DeepSeek-V3's first_k_dense_replace): gate/up [18432, 7168], down [7168, 18432];
layers 1.. are MoE layers of --experts routed experts (256 in the real model) plus the
shared expert, each gate/up [2048, 7168], down [7168, 2048], and the BF16 router. Attention
(MLA) is left out: the experts are ~97% of the model. FP8 bytes are random without the
two NaN codes, scales around 2^-13 as amax/448 gives.

tiny: per-tensor overhead. --tensors tensors of 64..4096 elements (BF16 and F32 in turn,
so half of them are cast), spread over --files safetensors files; --quant mxfp4 makes
every other one an MXFP4 pair instead (X_blocks U8 [1..4, 8, 1..2, 16] + X_scales),
with gpt-oss's quantization_config.

Only numpy is needed. The files are streamed (nothing model-sized is held in
memory); random bytes come from a 64 MiB pool read at random offsets, so
generating is bounded by the write speed.
"""

import argparse
import json
import math
import os
import struct
import sys
import time

try:
    import numpy as np
except ImportError:  # `tiny` needs no numpy
    np = None

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

NF4 = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
]

DTYPE_SIZE = {"U8": 1, "F8_E4M3": 1, "BF16": 2, "F32": 4}
POOL = 64 << 20
CHUNK = 8 << 20


class Pools:
    """Byte pools the tensors are cut from (random offsets, so no two tensors match)."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.u8 = np.frombuffer(self.rng.bytes(POOL), dtype=np.uint8)
        # bf16 weights ~ N(0, 0.02): float32 rounded to nearest even, as bf16 bits
        f = (self.rng.standard_normal(POOL // 2, dtype=np.float32) * np.float32(0.02)).view(np.uint32)
        self.bf16 = ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16).view(np.uint8)
        # MXFP4 E8M0 scales: around 127 (2^-9 .. 2^3), as in real checkpoints
        self.scale = self.rng.integers(118, 131, size=POOL, dtype=np.uint8)
        # bnb double-quant absmax codes: indices into the signed dynamic map, plausible spread
        self.absmax = self.rng.integers(0, 256, size=POOL, dtype=np.uint8)

    def stream(self, pool, nbytes):
        """yield chunks of `pool` totalling nbytes, starting at a random offset"""
        off = int(self.rng.integers(0, len(pool))) & ~1  # keep bf16 pairs aligned
        left = nbytes
        while left:
            n = min(left, CHUNK, len(pool) - off)
            yield pool[off:off + n]
            left -= n
            off = (off + n) % len(pool)


class T:
    """One tensor to write: name, dtype, shape, and where its bytes come from."""

    def __init__(self, name, dtype, shape, source):
        self.name, self.dtype, self.shape, self.source = name, dtype, list(shape), source

    @property
    def nbytes(self):
        return math.prod(self.shape) * DTYPE_SIZE[self.dtype]


def write_safetensors(path, tensors, pools):
    """safetensors, streamed: header (padded to 8 with spaces), then the data ordered as
    the upstream writer orders it (dtype size descending, then name), so every tensor is
    aligned to its element size."""
    tensors = sorted(tensors, key=lambda t: (-DTYPE_SIZE[t.dtype], t.name))
    header, off = {}, 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb", buffering=0) as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        for t in tensors:
            src = t.source
            if isinstance(src, (bytes, bytearray)):
                assert len(src) == t.nbytes, t.name
                f.write(src)
            elif np is not None and isinstance(src, np.ndarray):
                b = np.ascontiguousarray(src).tobytes()
                assert len(b) == t.nbytes, t.name
                f.write(b)
            else:
                for c in pools.stream(getattr(pools, src), t.nbytes):
                    f.write(memoryview(c))
    os.replace(tmp, path)
    return 8 + len(hb) + off


def write_model(out, shards, config, pools):
    """shards: list of tensor lists, one file each; writes the index and config.json"""
    os.makedirs(out, exist_ok=True)
    n = len(shards)
    weight_map, total = {}, 0
    for i, ts in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        write_safetensors(os.path.join(out, fname), ts, pools)
        for t in ts:
            weight_map[t.name] = fname
            total += t.nbytes
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": config.get("bos_token_id"), "eos_token_id": config.get("eos_token_id")}, f)
    return total


# ---------------------------------------------------------------------------------------
# gpt-oss-20b
# ---------------------------------------------------------------------------------------
GPTOSS = dict(hidden=2880, inter=2880, experts=32, heads=64, kv_heads=8, head_dim=64, vocab=201088)


def gen_gptoss(out, layers, vocab, pools):
    H, I, E = GPTOSS["hidden"], GPTOSS["inter"], GPTOSS["experts"]
    q, kv = GPTOSS["heads"] * GPTOSS["head_dim"], GPTOSS["kv_heads"] * GPTOSS["head_dim"]
    G = H // 32  # 90 groups of 32 values per row (both projections take hidden = inter = 2880 inputs)
    shards = []
    for L in range(layers):
        p = f"model.layers.{L}."
        ts = [
            T(p + "input_layernorm.weight", "BF16", [H], "bf16"),
            T(p + "mlp.experts.down_proj_bias", "BF16", [E, H], "bf16"),
            T(p + "mlp.experts.down_proj_blocks", "U8", [E, H, I // 32, 16], "u8"),
            T(p + "mlp.experts.down_proj_scales", "U8", [E, H, I // 32], "scale"),
            T(p + "mlp.experts.gate_up_proj_bias", "BF16", [E, 2 * I], "bf16"),
            T(p + "mlp.experts.gate_up_proj_blocks", "U8", [E, 2 * I, G, 16], "u8"),
            T(p + "mlp.experts.gate_up_proj_scales", "U8", [E, 2 * I, G], "scale"),
            T(p + "mlp.router.bias", "BF16", [E], "bf16"),
            T(p + "mlp.router.weight", "BF16", [E, H], "bf16"),
            T(p + "post_attention_layernorm.weight", "BF16", [H], "bf16"),
            T(p + "self_attn.k_proj.bias", "BF16", [kv], "bf16"),
            T(p + "self_attn.k_proj.weight", "BF16", [kv, H], "bf16"),
            T(p + "self_attn.o_proj.bias", "BF16", [H], "bf16"),
            T(p + "self_attn.o_proj.weight", "BF16", [H, q], "bf16"),
            T(p + "self_attn.q_proj.bias", "BF16", [q], "bf16"),
            T(p + "self_attn.q_proj.weight", "BF16", [q, H], "bf16"),
            T(p + "self_attn.sinks", "BF16", [GPTOSS["heads"]], "bf16"),
            T(p + "self_attn.v_proj.bias", "BF16", [kv], "bf16"),
            T(p + "self_attn.v_proj.weight", "BF16", [kv, H], "bf16"),
        ]
        shards.append(ts)
    shards.append([
        T("lm_head.weight", "BF16", [vocab, H], "bf16"),
        T("model.embed_tokens.weight", "BF16", [vocab, H], "bf16"),
        T("model.norm.weight", "BF16", [H], "bf16"),
    ])
    config = {
        "architectures": ["GptOssForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        # the real ids, or the last one a shrunk vocabulary (--vocab) has: from_config refuses
        # a pad id outside the embedding
        "eos_token_id": min(200002, vocab - 1),
        "pad_token_id": min(199999, vocab - 1),
        "experts_per_token": 4,
        "head_dim": GPTOSS["head_dim"],
        "hidden_act": "silu",
        "hidden_size": H,
        "initial_context_length": 4096,
        "initializer_range": 0.02,
        "intermediate_size": I,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        "max_position_embeddings": 131072,
        "model_type": "gpt_oss",
        "num_attention_heads": GPTOSS["heads"],
        "num_experts_per_tok": 4,
        "num_hidden_layers": layers,
        "num_key_value_heads": GPTOSS["kv_heads"],
        "num_local_experts": E,
        "output_router_logits": False,
        "quantization_config": {
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                       "model.embed_tokens", "lm_head"],
            "quant_method": "mxfp4",
        },
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
        "rope_theta": 150000,
        "router_aux_loss_coef": 0.9,
        "sliding_window": 128,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": vocab,
        "_bench_synthetic": True,
    }
    return write_model(out, shards, config, pools)


# ---------------------------------------------------------------------------------------
# bitsandbytes NF4 + double quant, Llama-3-8B shaped
# ---------------------------------------------------------------------------------------
LLAMA = dict(hidden=4096, inter=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256)


def read_fixture_tensor(path, name, dtype):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        a, b = h[name]["data_offsets"]
        f.seek(8 + n + a)
        return np.frombuffer(f.read(b - a), dtype=dtype).copy()


def nested_quant_map():
    """bitsandbytes' create_dynamic_map(signed=True), as a real checkpoint stores it"""
    fx = os.path.join(ROOT, "fixtures", "bnb-nf4-dq", "model.safetensors")
    if os.path.exists(fx):
        return read_fixture_tensor(fx, "model.layers.0.mlp.down_proj.weight.nested_quant_map", np.float32)
    # the same construction in numpy, when the fixture is absent (within 1 ulp of torch's
    # linspace; the map is stored in the file, so the checkpoint stays self-consistent)
    data = []
    for i in range(7):
        k = 2 ** i + 1
        bnd = np.linspace(0.1, 1, k, dtype=np.float32)
        means = (bnd[:-1] + bnd[1:]) / np.float32(2.0)
        data += (np.float32(10 ** (-6 + i)) * means).tolist() + (-np.float32(10 ** (-6 + i)) * means).tolist()
    data += [0.0, 1.0]
    data += [0.0] * (256 - len(data))
    return np.array(sorted(data), dtype=np.float32)


def bnb_weight(prefix, out_f, in_f, pools, nqm, rng, blocksize=64):
    n = out_f * in_f
    nblocks = (n + blocksize - 1) // blocksize
    nnested = (nblocks + 255) // 256
    nested_absmax = (rng.uniform(0.03, 0.06, size=nnested)).astype(np.float32)
    offset = float(np.float32(rng.uniform(0.10, 0.14)))
    blob = json.dumps({
        "quant_type": "nf4", "blocksize": blocksize, "dtype": "bfloat16", "shape": [out_f, in_f],
        "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": offset,
    }).encode()
    w = prefix + ".weight"
    return [
        T(w, "U8", [(n + 1) // 2, 1], "u8"),
        T(w + ".absmax", "U8", [nblocks], "absmax"),
        T(w + ".nested_absmax", "F32", [nnested], nested_absmax),
        T(w + ".nested_quant_map", "F32", [256], nqm),
        T(w + ".quant_map", "F32", [16], np.array(NF4, dtype=np.float32)),
        T(w + ".quant_state.bitsandbytes__nf4", "U8", [len(blob)], blob),
    ]


def gen_bnb(out, layers, vocab, pools):
    H, I = LLAMA["hidden"], LLAMA["inter"]
    q, kv = LLAMA["heads"] * LLAMA["head_dim"], LLAMA["kv_heads"] * LLAMA["head_dim"]
    nqm = nested_quant_map()
    rng = np.random.default_rng(7)
    shards = []
    for L in range(layers):
        p = f"model.layers.{L}."
        ts = [T(p + "input_layernorm.weight", "BF16", [H], "bf16"),
              T(p + "post_attention_layernorm.weight", "BF16", [H], "bf16")]
        for name, o, i in (("self_attn.q_proj", q, H), ("self_attn.k_proj", kv, H), ("self_attn.v_proj", kv, H),
                           ("self_attn.o_proj", H, q), ("mlp.gate_proj", I, H), ("mlp.up_proj", I, H),
                           ("mlp.down_proj", H, I)):
            ts += bnb_weight(p + name, o, i, pools, nqm, rng)
        shards.append(ts)
    shards.append([
        T("lm_head.weight", "BF16", [vocab, H], "bf16"),
        T("model.embed_tokens.weight", "BF16", [vocab, H], "bf16"),
        T("model.norm.weight", "BF16", [H], "bf16"),
    ])
    config = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": min(128000, vocab - 1),
        "eos_token_id": min(128001, vocab - 1),
        "head_dim": LLAMA["head_dim"],
        "hidden_act": "silu",
        "hidden_size": H,
        "initializer_range": 0.02,
        "intermediate_size": I,
        "max_position_embeddings": 8192,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": LLAMA["heads"],
        "num_hidden_layers": layers,
        "num_key_value_heads": LLAMA["kv_heads"],
        "pretraining_tp": 1,
        "quantization_config": {
            "_load_in_4bit": True, "_load_in_8bit": False,
            "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8",
            "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
            "llm_int8_enable_fp32_cpu_offload": False, "llm_int8_has_fp16_weight": False,
            "llm_int8_skip_modules": None, "llm_int8_threshold": 6.0,
            "load_in_4bit": True, "load_in_8bit": False, "quant_method": "bitsandbytes",
        },
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": vocab,
        "_bench_synthetic": True,
    }
    return write_model(out, shards, config, pools)


# ---------------------------------------------------------------------------------------
# DeepSeek-V3 FP8 block
# ---------------------------------------------------------------------------------------
DSV3 = dict(hidden=7168, inter=18432, moe_inter=2048, experts=256, vocab=129280)


def fp8_weight(name, out_f, in_f, rng):
    scale = (rng.uniform(0.5, 2.0, size=(-(-out_f // 128), -(-in_f // 128))) * 2.0 ** -13).astype(np.float32)
    return [T(name, "F8_E4M3", [out_f, in_f], "fp8"), T(name + "_scale_inv", "F32", list(scale.shape), scale)]


def gen_fp8_block(out, layers, vocab, pools, experts):
    H, I, MI = DSV3["hidden"], DSV3["inter"], DSV3["moe_inter"]
    pools.fp8 = pools.u8 & np.uint8(0xF7)  # no 0x7F / 0xFF (NaN)
    rng = np.random.default_rng(11)
    shards = []
    for L in range(layers):
        p = f"model.layers.{L}."
        ts = [T(p + "input_layernorm.weight", "BF16", [H], "bf16"),
              T(p + "post_attention_layernorm.weight", "BF16", [H], "bf16")]
        if L == 0:
            for n, o, i in (("gate_proj", I, H), ("up_proj", I, H), ("down_proj", H, I)):
                ts += fp8_weight(p + f"mlp.{n}.weight", o, i, rng)
        else:
            ts += [T(p + "mlp.gate.weight", "BF16", [experts, H], "bf16"),
                   T(p + "mlp.gate.e_score_correction_bias", "F32", [experts],
                     rng.standard_normal(experts).astype(np.float32))]
            for e in [f"experts.{k}" for k in range(experts)] + ["shared_experts"]:
                for n, o, i in (("gate_proj", MI, H), ("up_proj", MI, H), ("down_proj", H, MI)):
                    ts += fp8_weight(p + f"mlp.{e}.{n}.weight", o, i, rng)
        shards.append(ts)
    shards.append([T("lm_head.weight", "BF16", [vocab, H], "bf16"),
                   T("model.embed_tokens.weight", "BF16", [vocab, H], "bf16"),
                   T("model.norm.weight", "BF16", [H], "bf16")])
    config = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": H, "intermediate_size": I, "moe_intermediate_size": MI,
        "n_routed_experts": experts, "n_shared_experts": 1, "num_experts_per_tok": 8,
        "first_k_dense_replace": 1, "num_hidden_layers": layers, "vocab_size": vocab,
        "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128]},
        "_bench_synthetic": True,
    }
    return write_model(out, shards, config, pools)


# ---------------------------------------------------------------------------------------
# tiny: very many small tensors (per-tensor overhead)
# ---------------------------------------------------------------------------------------
def gen_tiny(out, ntensors, nfiles, quant, seed):
    import random
    rng = random.Random(seed)
    pool = rng.randbytes(8 << 20)
    # MXFP4 E8M0 scales around 127, as in real checkpoints
    spool = bytes(rng.randrange(118, 131) for _ in range(1 << 16))

    def cut(p, n):
        o = rng.randrange(0, len(p) - n) & ~7
        return p[o:o + n]

    shards = [[] for _ in range(max(1, nfiles))]
    for i in range(ntensors):
        ts = shards[i * len(shards) // ntensors]
        name = f"model.layers.{i // 64}.block.{i % 64}"
        n = rng.randrange(64, 4097)
        if quant == "mxfp4" and i % 2 == 1:
            e, g = 1 + i % 4, 1 + (i // 2) % 2
            ts.append(T(name + "_blocks", "U8", [e, 8, g, 16], cut(pool, e * 8 * g * 16)))
            ts.append(T(name + "_scales", "U8", [e, 8, g], cut(spool, e * 8 * g)))
        elif i % 2 == 0:
            shape = [n // 64, 64] if n >= 128 else [n]
            ts.append(T(name + ".weight", "BF16", shape, cut(pool, 2 * math.prod(shape))))
        else:
            ts.append(T(name + ".weight", "F32", [n], cut(pool, 4 * n)))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
              "bos_token_id": 1, "eos_token_id": 2}
    if quant == "mxfp4":
        config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": []}
    return write_model(out, shards, config, None)


# ---------------------------------------------------------------------------------------
# dsv3-names: DeepSeek-V3's real tensor names and count, tiny matrices (bookkeeping scale)
# ---------------------------------------------------------------------------------------
def gen_dsv3_names(out, layers, files, dim, experts):
    """DeepSeek-V3's key names and tensor count (61 layers: 3 dense, 58 MoE with 256 routed
    experts + the shared one; MLA attention; the MTP layer 61; ~92k tensors), every FP8
    weight [dim, dim] (or [dim/2, dim]) with its F32 weight_scale_inv, spread over `files`
    files in name order as the real 163-file split does. For the per-tensor and per-rank
    costs at scale: the data are small, the counts are real."""
    rng = np.random.default_rng(22)
    pool = (rng.integers(0, 256, size=1 << 20, dtype=np.uint8) & np.uint8(0xF7)).tobytes()
    spool = (rng.uniform(0.5, 2.0, size=1 << 16) * 2.0 ** -13).astype(np.float32).tobytes()
    bf = np.full(dim, 0x3F80, dtype=np.uint16).tobytes()  # 1.0 in bf16: norms
    h = dim // 2
    names = []  # (name, dtype, shape, bytes)
    cur = [0, 0]

    def cut(p, n):
        o = int(rng.integers(0, len(p) - n)) & ~3
        return p[o:o + n]

    def fp8(name, o, i):
        names.append(T(name, "F8_E4M3", [o, i], cut(pool, o * i)))
        sh = [-(-o // 128), -(-i // 128)]
        names.append(T(name + "_scale_inv", "F32", sh, cut(spool, 4 * sh[0] * sh[1])))

    def norm(name):
        names.append(T(name, "BF16", [dim], bf))

    for L in list(range(layers)) + ([61] if layers >= 61 else []):
        p = f"model.layers.{L}."
        norm(p + "input_layernorm.weight")
        norm(p + "post_attention_layernorm.weight")
        a = p + "self_attn."
        fp8(a + "q_a_proj.weight", h, dim)
        names.append(T(a + "q_a_layernorm.weight", "BF16", [h], bf[:2 * h]))
        fp8(a + "q_b_proj.weight", dim, h)
        fp8(a + "kv_a_proj_with_mqa.weight", h, dim)
        names.append(T(a + "kv_a_layernorm.weight", "BF16", [h], bf[:2 * h]))
        fp8(a + "kv_b_proj.weight", dim, h)
        fp8(a + "o_proj.weight", dim, dim)
        if L < 3:
            for n in ("gate_proj", "up_proj", "down_proj"):
                fp8(p + f"mlp.{n}.weight", dim, dim)
            continue
        names.append(T(p + "mlp.gate.weight", "BF16", [experts, dim], cut(pool, 2 * experts * dim)))
        names.append(T(p + "mlp.gate.e_score_correction_bias", "F32", [experts], cut(spool, 4 * experts)))
        for e in [f"experts.{k}" for k in range(experts)] + ["shared_experts"]:
            fp8(p + f"mlp.{e}.gate_proj.weight", h, dim)
            fp8(p + f"mlp.{e}.up_proj.weight", h, dim)
            fp8(p + f"mlp.{e}.down_proj.weight", dim, h)
        if L == 61:  # the MTP layer's own tensors
            for n in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
                norm(p + n)
            names.append(T(p + "eh_proj.weight", "BF16", [dim, 2 * dim], cut(pool, 4 * dim * dim)))
    names.append(T("model.embed_tokens.weight", "BF16", [1024, dim], cut(pool, 2 * 1024 * dim)))
    names.append(T("model.norm.weight", "BF16", [dim], bf))
    names.append(T("lm_head.weight", "BF16", [1024, dim], cut(pool, 2 * 1024 * dim)))
    names.sort(key=lambda t: t.name)
    shards = [names[i * len(names) // files:(i + 1) * len(names) // files] for i in range(files)]
    config = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": dim, "moe_intermediate_size": h, "n_routed_experts": experts, "n_shared_experts": 1,
        "first_k_dense_replace": 3, "num_hidden_layers": min(layers, 61), "num_nextn_predict_layers": 1,
        "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1, "vocab_size": 1024,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128]},
        "_bench_synthetic": True,
    }
    print(f"gen_synth: dsv3-names: {len(names)} tensors in {files} files", file=sys.stderr)
    return write_model(out, shards, config, None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=["gpt-oss", "bnb-nf4", "fp8-block", "tiny", "dsv3-names"])
    ap.add_argument("--experts", type=int, default=DSV3["experts"], help="fp8-block: routed experts per MoE layer")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=0, help="0 = the real model's (201088 / 128256)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--tensors", type=int, default=200000, help="tiny: number of tensors")
    ap.add_argument("--files", type=int, default=4, help="tiny, dsv3-names (163 = the real split): safetensors files")
    ap.add_argument("--dim", type=int, default=256, help="dsv3-names: the matrices' size")
    ap.add_argument("--quant", choices=["none", "mxfp4"], default="none", help="tiny: every other tensor MXFP4")
    a = ap.parse_args()
    vocab = a.vocab or {"gpt-oss": GPTOSS["vocab"], "bnb-nf4": LLAMA["vocab"], "fp8-block": DSV3["vocab"], "tiny": 0,
                        "dsv3-names": 0}[a.kind]
    t0 = time.monotonic()
    pools = Pools(a.seed) if a.kind not in ("tiny", "dsv3-names") else None
    tmp = a.out.rstrip("/") + ".partial"
    if os.path.exists(tmp):
        import shutil
        shutil.rmtree(tmp)
    if a.kind == "tiny":
        total = gen_tiny(tmp, a.tensors, a.files, a.quant, a.seed)
    elif a.kind == "dsv3-names":
        total = gen_dsv3_names(tmp, a.layers, a.files, a.dim, a.experts)
    elif a.kind == "fp8-block":
        total = gen_fp8_block(tmp, a.layers, vocab, pools, a.experts)
    else:
        total = (gen_gptoss if a.kind == "gpt-oss" else gen_bnb)(tmp, a.layers, vocab, pools)
    os.replace(tmp, a.out)  # a directory under its final name is complete
    dt = time.monotonic() - t0
    print(f"gen_synth: {a.kind} layers={a.layers} vocab={vocab}: {total / 1e9:.2f} GB in {dt:.1f} s -> {a.out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
