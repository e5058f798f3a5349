#!/usr/bin/env python3
"""bfshard interop checks: the output loads in the real consumers.

Run by tests/interop/run.sh (make interop) inside a venv with the pinned torch,
transformers, safetensors, bitsandbytes. Everything runs on the CPU, offline.

  1 safetensors   every output file opens with safe_open(framework="pt") and every
                  tensor equals the upstream dequant (computed here, live)
  2 fsdp2-dcp     W gloo processes build the model, fully_shard it, and
                  dcp.load(..., HuggingFaceStorageReader(OUTDIR)); every rank's local
                  shard equals the upstream slice and each rank read only its own file
  3 from_pretrained  the --layout hf output loads as plain BF16 and gives the logits
                  of the model made from the upstream-dequantized weights
  4 consolidate   torch's consolidate_safetensors_files(dcp output) == our hf output
  5 open questions of FORMATS.md s5: ranks with no rows (W=8), 0-d tensors; what
                  torch's own HuggingFaceStorageWriter writes for both
  6 w1024         W=1024 of a few layers of a DeepSeek-V3-named FP8 checkpoint
                  (bench/gen_synth.py dsv3-names, 163 input files); dcp.load(no_dist) with
                  HuggingFaceStorageReader over the 1024 rank files == upstream, every rank's
                  metadata checked, a sample of rank files with safe_open. --only w1024
                  (INTEROP_ONLY=w1024) runs this check alone.

Upstream = transformers convert_moe_packed_tensors (MXFP4), bitsandbytes
dequantize_4bit (NF4/FP4), tensor.to(torch.bfloat16) (casts), and for the FP8, INT4 and
NVFP4 formats (docs/FORMATS.md s6): DeepSeek-V3 inference/kernel.py weight_dequant's math in
torch (FP8 block, quant_method "fp8"), compressed-tensors' decompressors
(FloatQuantizationCompressor / PackedQuantizationCompressor / NVFP4PackedCompressor
.decompress with the config group's scheme), ModelOpt NVFP4QTensor.dequantize (NVFP4,
quant_method "modelopt"). Differences tolerated
(documented in fixtures/README.md), everything else must be bit-exact:
  - NaN from an F32->BF16 cast: torch's vectorised cast writes 0xFFFF, bfshard 0x7FC0
  - bitsandbytes FP4 code 8: bnb's python path gives +0.0, bfshard -0.0 (bnb's C++/CUDA)
"""
import argparse
import datetime
import glob
import json
import logging
import math
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
import traceback
import warnings

import numpy as np
import torch

torch.set_num_threads(1)

RESULTS = []  # (name, ok, detail)
SHARD_RE = re.compile(r"^shard-(\d{5})-model-00001-of-00001\.safetensors$")
BF16_NAN = 0x7FC0


def say(*a):
    print(*a, flush=True)


def record(name, ok, detail=""):
    if len(detail) > 600:
        detail = detail[:600] + f"... ({len(detail)} chars)"
    RESULTS.append((name, bool(ok), detail))
    say(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  -- {detail}" if detail else ""))


def info(msg):
    say(f"      {msg}")


# ---------------------------------------------------------------------------------
# comparison


def int_view(t):
    t = t.detach().contiguous().reshape(-1)
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def i16(x):
    return x - 0x10000 if x >= 0x8000 else x


def compare(out, ref, kind="exact", code8=None):
    """Bitwise comparison of out with ref. Returns (ok, message, tolerated) where
    tolerated counts the documented differences: 'nan' (cast NaN payload, bfshard
    0x7FC0), 'qnan' (the same for a NaN product of the section-6 dequants, docs/FORMATS.md
    s4 amendment) and 'fp4z' (FP4 code 8: upstream +0.0, bfshard -0.0)."""
    tol = {"nan": 0, "qnan": 0, "fp4z": 0}
    if out.dtype != ref.dtype or tuple(out.shape) != tuple(ref.shape):
        return False, f"got {out.dtype} {list(out.shape)}, want {ref.dtype} {list(ref.shape)}", tol
    if out.numel() == 0:
        return True, "", tol
    a, b = int_view(out), int_view(ref)
    diff = a != b
    if not bool(diff.any()):
        return True, "", tol
    allowed = torch.zeros_like(diff)
    if kind == "cast" and ref.dtype == torch.bfloat16:
        nan = torch.isnan(ref.detach().contiguous().reshape(-1).float()) & (a == BF16_NAN)
        tol["nan"] = int((diff & nan).sum())
        allowed |= nan
    if kind.startswith(QUANT_KIND_PREFIXES) and ref.dtype == torch.bfloat16:
        nan = torch.isnan(ref.detach().contiguous().reshape(-1).float()) & (a == BF16_NAN)
        tol["qnan"] = int((diff & nan).sum())
        allowed |= nan
    if code8 is not None and ref.dtype == torch.bfloat16:
        z = code8.reshape(-1) & (b == 0) & (a == i16(0x8000))
        tol["fp4z"] = int((diff & z).sum())
        allowed |= z
    bad = diff & ~allowed
    nbad = int(bad.sum())
    if nbad == 0:
        return True, "", tol
    i = int(torch.nonzero(bad)[0])
    idx = np.unravel_index(i, tuple(ref.shape)) if ref.dim() else ()
    return False, (f"{nbad} of {ref.numel()} elements differ; first at {tuple(int(x) for x in idx)}: "
                   f"got 0x{int(a[i]) & 0xFFFF:04X}, want 0x{int(b[i]) & 0xFFFF:04X}"), tol


def add_tol(acc, tol):
    for k, v in tol.items():
        acc[k] = acc.get(k, 0) + v


def tol_text(acc):
    parts = []
    if acc.get("nan"):
        parts.append(f"{acc['nan']} cast NaN written 0x7FC0 (torch 0xFFFF)")
    if acc.get("qnan"):
        parts.append(f"{acc['qnan']} dequant NaN written 0x7FC0 (upstream 0xFFFF)")
    if acc.get("fp4z"):
        parts.append(f"{acc['fp4z']} FP4 code-8 zeros written -0.0 (bnb python path +0.0)")
    return ("tolerated: " + ", ".join(parts)) if parts else "bit-exact"


def rows_of(d0, W, r):
    """FSDP2 Shard(0) / torch.chunk: rank r's rows [start, end)."""
    chunk = -(-d0 // W) if d0 else 0
    start = min(r * chunk, d0)
    return start, min(start + chunk, d0)


# ---------------------------------------------------------------------------------
# upstream reference (computed live)


def read_inputs(d):
    from safetensors import safe_open
    files = [d] if os.path.isfile(d) else sorted(glob.glob(os.path.join(d, "*.safetensors")))
    sd = {}
    for f in files:
        with safe_open(f, framework="pt") as fh:
            for k in fh.keys():
                sd[k] = fh.get_tensor(k)
    return sd


# activation / KV-cache scales: bfshard drops them (no meaning in a BF16 model)
DROPPED_SUFFIXES = (".input_scale", ".input_global_scale", ".k_scale", ".v_scale")
QUANT_METHODS = ("fp8", "compressed-tensors", "modelopt")
QUANT_KIND_PREFIXES = ("fp8-", "ct-", "modelopt-", "dsv4-")  # fp8-experts included  # the kinds upstream_quant gives


def quant_config(d):
    p = os.path.join(d, "config.json") if os.path.isdir(d) else None
    if not p or not os.path.exists(p):
        return {}
    with open(p) as fh:
        return json.load(fh).get("quantization_config") or {}


def deepseek_weight_dequant(x, s, bh, bw):
    """DeepSeek-V3 inference/kernel.py weight_dequant (a Triton kernel, GPU only), its math in
    torch: per (bh x bw) block y = x.to(float32) * s (float32), stored into the default dtype,
    which fp8_cast_bf16.py sets to bfloat16; partial edge blocks through the kernel's mask."""
    M, N = x.shape
    sf = s.float().repeat_interleave(bh, 0).repeat_interleave(bw, 1)[:M, :N]
    return (x.to(torch.float32) * sf).to(torch.bfloat16)


def ct_scheme_for(qcfg, prefix):
    """The compressed-tensors config group of module `prefix`, chosen by compressed-tensors' own
    code as apply_quantization_config does (quantization/lifecycle/apply.py: target_to_scheme,
    utils/match.py match_targets, _scheme_from_targets; the module an nn.Linear stand-in), and
    its compression format."""
    from collections import OrderedDict
    from compressed_tensors.utils.match import is_match, match_targets
    target_to_scheme = OrderedDict()
    for g in qcfg.config_groups.values():
        for tgt in g.targets:
            target_to_scheme[tgt] = g
    module = torch.nn.Linear(1, 1, bias=False, device="meta")
    if not is_match(prefix, module, list(target_to_scheme), qcfg.ignore or []):
        raise RuntimeError(f"{prefix}: no compressed-tensors config group targets it (or ignore names it)")
    hit = target_to_scheme[match_targets(prefix, module, target_to_scheme)[0]]
    fmt = getattr(hit, "format", None) or qcfg.format
    return hit, str(getattr(fmt, "value", fmt))


def upstream_quant(d, sd, ref, consumed):
    """FORMATS.md s6-8 (FP8, compressed-tensors, ModelOpt): ref[P.weight] from the upstream dequant of P's tensors."""
    qc = quant_config(d)
    qm = qc.get("quant_method")
    if qm not in QUANT_METHODS:
        return
    for k in sd:
        if k.endswith(DROPPED_SUFFIXES):
            consumed.add(k)
    if qm == "fp8" and qc.get("weight_block_size") is None:  # per-tensor, as transformers loads it
        from transformers.integrations.finegrained_fp8 import Fp8Dequantize
        for k in [k for k in sd if k.endswith(".activation_scale")]:
            consumed.add(k)
        # P.weight + P.weight_scale_inv, and the fused experts' P.gate_up_proj + P.gate_up_proj_scale_inv
        # ([E, 1, 1], gate_up [E, 2, 1]; docs/FORMATS.md 7.8): _dequantize_one on the tensors as they are
        for k in [k for k in sd if k.endswith("_scale_inv") and k[: -len("_scale_inv")] in sd]:
            w = k[: -len("_scale_inv")]
            x = Fp8Dequantize(None)._dequantize_one(sd[w], sd[k], output_dtype=torch.bfloat16)
            ref[w] = (x.contiguous(), "fp8-experts" if sd[w].dim() == 3 else "fp8-tensor", None)
            consumed |= {w, k}
    elif qm == "fp8" and any(k.endswith(".scale") and k[:-6] + ".weight" in sd for k in sd):  # DeepSeek-V4
        from transformers.integrations.finegrained_fp8 import Fp8Dequantize
        dq, (bh, bw) = Fp8Dequantize(None), qc["weight_block_size"]
        for k in [k for k in sd if k.endswith(".scale") and k[:-6] + ".weight" in sd]:
            w, s = sd[k[:-6] + ".weight"], sd[k]
            fp4 = w.dtype == torch.int8
            q = dq._unpack_fp4(w) if fp4 else w.to(torch.float32)
            gh, gw = (1, 32) if fp4 else (bh, bw)
            if q.shape[0] == s.shape[0] * gh and q.shape[1] == s.shape[1] * gw:
                x = dq._dequantize_one(w, s, output_dtype=torch.bfloat16)
            else:  # partial blocks: transformers derives another block from the grid (docs/FORMATS.md 8)
                sf = (s.to(torch.float32) - 127.0).exp2() if s.dtype == torch.uint8 else s.to(torch.float32)
                sf = sf.repeat_interleave(gh, 0)[: q.shape[0]].repeat_interleave(gw, 1)[:, : q.shape[1]]
                x = (q * sf).to(torch.bfloat16)
            ue = qc.get("scale_fmt") == "ue8m0"
            ref[k[:-6] + ".weight"] = (x.contiguous(), "dsv4-fp4-ue8m0" if fp4 else "dsv4-fp8-ue8m0" if ue else "dsv4-fp8", None)
            consumed |= {k[:-6] + ".weight", k}
    elif qm == "fp8":  # DeepSeek-V3 / Qwen3-FP8 block
        bh, bw = qc["weight_block_size"]
        for k in [k for k in sd if k.endswith(".weight_scale_inv")]:
            w = k[: -len("_scale_inv")]
            if sd[w].dim() == 3:
                continue  # fused experts, below
            ref[w] = (deepseek_weight_dequant(sd[w], sd[k], bh, bw).contiguous(), "fp8-block", None)
            consumed |= {w, k}
        # fused 3-D experts (transformers' FP8Experts: P.gate_up_proj + P.gate_up_proj_scale_inv,
        # [E, out, in]): transformers' own per-expert dequant (docs/FORMATS.md 7.8)
        from transformers.integrations.finegrained_fp8 import Fp8Dequantize
        for k in [k for k in sd if k.endswith("_scale_inv") and k[: -len("_scale_inv")] in sd]:
            w = k[: -len("_scale_inv")]
            if sd[w].dim() != 3:
                continue
            x = Fp8Dequantize(None)._dequantize_one(sd[w], sd[k], output_dtype=torch.bfloat16)
            ref[w] = (x.contiguous(), "fp8-experts", None)
            consumed |= {w, k}
    elif qm == "compressed-tensors":
        from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
        from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
        from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
        from compressed_tensors.quantization import QuantizationConfig
        from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
        from compressed_tensors.compressors.mxfp8.base import MXFP8QuantizationCompressor
        from compressed_tensors.compressors.mxfp6.base import MXFP6PackedCompressor
        classes = {"float-quantized": FloatQuantizationCompressor, "pack-quantized": PackedQuantizationCompressor,
                   "nvfp4-pack-quantized": NVFP4PackedCompressor, "mxfp8-quantized": MXFP8QuantizationCompressor,
                   "mxfp4-pack-quantized": MXFP4PackedCompressor, "mxfp6-pack-quantized": MXFP6PackedCompressor}
        qcfg = QuantizationConfig.model_validate(qc)
        parts = ("weight", "weight_packed", "weight_scale", "weight_zero_point", "weight_shape",
                 "weight_global_scale")
        for P in sorted({k.rsplit(".", 1)[0] for k in sd if k.endswith(".weight_scale")}):
            scheme, fmt = ct_scheme_for(qcfg, P)
            sub = {n: sd[P + "." + n] for n in parts if P + "." + n in sd}
            x = classes[fmt].decompress(dict(sub), scheme)["weight"].to(torch.bfloat16)
            ref[P + ".weight"] = (x.contiguous(), "ct-" + fmt, None)
            consumed |= {P + "." + n for n in sub}
    else:  # ModelOpt NVFP4
        from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
        if qc.get("quant_algo") != "NVFP4":
            raise RuntimeError(f"{d}: modelopt quant_algo {qc.get('quant_algo')} has no upstream reference here")
        for k in [k for k in sd if k.endswith(".weight_scale_2")]:
            P = k[: -len(".weight_scale_2")]
            w, s = sd[P + ".weight"], sd[P + ".weight_scale"]
            q = NVFP4QTensor(torch.Size([w.shape[0], w.shape[1] * 2]), torch.bfloat16, w)
            x = q.dequantize(dtype=torch.bfloat16, scale=s, double_scale=sd[k], block_sizes={-1: 16})
            ref[P + ".weight"] = (x.contiguous(), "modelopt-nvfp4", None)
            consumed |= {P + ".weight", P + ".weight_scale", k}


_BNB_CPU_CHECKED = False


def bnb_cpu_kernel_check():
    """bitsandbytes 0.50.2 dequantizes 4-bit on the CPU with its C++ kernel when the last
    dim is even, else with its device-independent implementation (backends/default/ops.py
    _dequantize_4bit_compute: code[q] * absmax[block], the math of its CUDA kernel too).
    On some CPUs the C++ kernel's AVX-512 path gives other values when a row is shorter
    than a block (seen: AMD EPYC with avx512_bf16, a [45, 48] NF4 weight, blocksize 64:
    every block after the first takes the wrong absmax; bitsandbytes itself falls back for
    blocksize >= 2048 "as AVX512 implementation has accuracy issues"). When the two upstream
    implementations disagree on a probe here, the CPU dispatch is pointed at the default
    one for this process, loudly: the reference is upstream's own definition either way."""
    global _BNB_CPU_CHECKED
    if _BNB_CPU_CHECKED:
        return
    _BNB_CPU_CHECKED = True
    import bitsandbytes.functional as bnbF
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    from bitsandbytes.backends.utils import _get_4bit_code
    g = torch.Generator().manual_seed(7)
    w = torch.randn(45, 48, generator=g).to(torch.bfloat16)
    bad = []
    for qt in ("nf4", "fp4"):
        q, st = bnbF.quantize_4bit(w, blocksize=64, quant_type=qt)
        live = bnbF.dequantize_4bit(q, st).view(torch.int16)
        A = q.view(torch.uint8).reshape(-1)
        dflt = _dequantize_4bit_compute(A, st.absmax.float(), _get_4bit_code(qt, A.device), 64,
                                        list(st.shape), st.dtype).view(torch.int16)
        if not torch.equal(live, dflt):
            bad.append(f"{qt}: {int((live != dflt).sum())} of {live.numel()} elements")
    if not bad:
        info("bitsandbytes: its CPU C++ kernel agrees with its default implementation here")
        return

    def default_impl(A, absmax, blocksize, quant_type, shape, dtype):
        if A.dtype != torch.uint8:
            A = A.view(torch.uint8)
        return _dequantize_4bit_compute(A.reshape(-1), absmax.float() if absmax.dtype != torch.float32 else absmax,
                                        _get_4bit_code(quant_type, A.device), blocksize, shape, dtype)

    torch.library.register_kernel("bitsandbytes::dequantize_4bit", "cpu", default_impl)
    info("NOTE bitsandbytes: on this CPU its C++ 4-bit dequant kernel disagrees with its own default "
         f"implementation on a [45, 48] blocksize-64 probe ({'; '.join(bad)}): an upstream bug of its AVX-512 "
         "path (rows shorter than a block); the CPU dispatch now uses the default implementation, "
         "code[q] * absmax[block] as bitsandbytes' CUDA kernel computes it")


def upstream_reference(fixture_dir, layout="hf"):
    """name -> (bf16 tensor at global shape, kind, code8 mask or None)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    import bitsandbytes.functional as bnbF
    from bitsandbytes.functional import QuantState
    bnb_cpu_kernel_check()

    sd = read_inputs(fixture_dir)
    ref, consumed = {}, set()
    upstream_quant(fixture_dir, sd, ref, consumed)
    for k, v in sd.items():
        if k.endswith("_blocks") and k[: -len("_blocks")] + "_scales" in sd:
            base = k[: -len("_blocks")]
            x = convert_moe_packed_tensors(v.clone(), sd[base + "_scales"].clone())  # [E, G*32, R]
            if layout == "openai":
                x = x.transpose(1, 2)
            ref[base] = (x.contiguous(), "mxfp4", None)
            consumed |= {k, base + "_scales"}
    qs_keys = [k for k in sd if ".weight.quant_state.bitsandbytes__" in k]
    for qk in qs_keys:
        P = qk[: qk.index(".weight.quant_state.") + 1]
        qt = qk.rsplit("__", 1)[1]
        qs_dict = {k[len(P):]: v for k, v in sd.items() if k.startswith(P + "weight.")}
        W = sd[P + "weight"]
        consumed |= {P + k for k in qs_dict} | {P + "weight"}
        qs = QuantState.from_dict(dict(qs_dict), device=torch.device("cpu"))  # as transformers loads it
        shape = list(qs.shape)
        if qs.dtype != torch.bfloat16:  # fp16 fixture: float32 dequant, then bf16 (fixtures/README.md)
            qs.dtype = torch.float32
        x = bnbF.dequantize_4bit(W, qs).to(torch.bfloat16).reshape(shape).contiguous()
        code8 = None
        if qt == "fp4":
            b = W.contiguous().view(torch.uint8).reshape(-1)
            codes = torch.stack([b >> 4, b & 15], 1).reshape(-1)[: math.prod(shape)]  # high nibble first
            code8 = (codes == 8).reshape(shape)
        ref[P + "weight"] = (x, "bnb-" + qt, code8)
    # bitsandbytes 8-bit (LLM.int8()): weight I8 + SCB F32, dequantized as transformers'
    # dequantize_bnb_weight does it (bitsandbytes int8_vectorwise_dequant, float32), then BF16
    for k in [k for k in sd if k.endswith(".SCB")]:
        P = k[: -len("SCB")]
        if sd.get(P + "weight") is not None and sd[P + "weight"].dtype == torch.int8:
            x = bnbF.int8_vectorwise_dequant(sd[P + "weight"], sd[k]).to(torch.bfloat16).contiguous()
            ref[P + "weight"] = (x, "bnb-int8", None)
            consumed |= {k, P + "weight", P + "weight_format"}
    kept = kept_fp32_of(fixture_dir, [k for k in sd if k not in consumed])
    for k, v in sd.items():
        if k in consumed:
            continue
        if k in kept:  # the model keeps it in float32: as stored, never rounded
            ref[k] = (v.contiguous(), "copy", None)
        elif v.dtype in (torch.float32, torch.float16, torch.float64):
            ref[k] = (v.to(torch.bfloat16).contiguous(), "cast", None)
        else:
            ref[k] = (v.contiguous(), "copy", None)
    return ref


def kept_fp32_of(fixture_dir, keys):
    """The keys the model of fixture_dir keeps in float32 at bfloat16 load, as transformers decides
    it (fixtures/fxlib.py kept_fp32: the class's dtype plan on each key's model name). A config
    transformers cannot build a model of (a toy checkpoint of a type it has no class for) keeps none;
    one whose model type bfshard has a float32 rule for must build."""
    fx = os.path.dirname(os.path.abspath(fixture_dir))
    if fx not in sys.path:
        sys.path.insert(0, fx)
    from fxlib import kept_fp32
    try:
        return kept_fp32(fixture_dir, keys)
    except Exception:  # noqa: BLE001
        if model_type_of(fixture_dir) in FP32_RULE_TYPES:
            raise
        return set()


# model types src/plan/fp32.c has a float32 rule for (dev/names_table.py fp32 reads the table)
FP32_RULE_TYPES = ("deepseek_v3", "kimi_k2", "deepseek_v32", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "glm4v_moe",
                   "dots1", "solar_open", "exaone_moe", "hy_v3", "mimo_v2_flash", "beam", "ernie4_5_moe", "deepseek_v4")


def expected_reference(fixtures, f):
    """fixtures/expected/<f>.safetensors as a reference (every output tensor, BF16, its name)."""
    from safetensors import safe_open
    with safe_open(os.path.join(fixtures, "expected", f + ".safetensors"), framework="pt") as fh:
        return {k: (fh.get_tensor(k).contiguous(), "woq-expected", None) for k in fh.keys()}


def save_reference(ref, path):
    from safetensors.torch import save_file
    tensors, kinds = {}, {}
    for k, (t, kind, c8) in ref.items():
        tensors[k] = t
        kinds[k] = kind
        if c8 is not None:
            tensors["__code8__." + k] = c8
    save_file(tensors, path, metadata={"kinds": json.dumps(kinds)})


def load_reference(path):
    from safetensors import safe_open
    with safe_open(path, framework="pt") as f:
        kinds = json.loads(f.metadata()["kinds"])
        all_t = {k: f.get_tensor(k) for k in f.keys()}
    return {k: (all_t[k], kinds[k], all_t.get("__code8__." + k)) for k in kinds}


def model_type_of(d):
    p = os.path.join(d, "config.json")
    if not os.path.exists(p):
        return None
    with open(p) as fh:
        return json.load(fh).get("model_type")


def model_gap(fixture_dir, tref):
    """What keeps the fixture from being a complete model of its config's class: its state_dict
    keys the fixture lacks, and the reverse ("" when none)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(fixture_dir)
    if getattr(cfg, "quantization_config", None) is not None:
        del cfg.quantization_config
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    sd = set(m.state_dict())
    miss, extra = sorted(sd - set(tref)), sorted(set(tref) - sd)
    return (f"model keys it lacks {miss[:3]}" if miss else "") + (f" keys no model has {extra[:3]}" if extra else "")


def to_target(ref, fixture_dir):
    """ref (upstream dequant under checkpoint names) under transformers 5's state_dict names and
    shapes, made by transformers' own machinery: its conversion mapping for the model type,
    rename_source_key (with the model's meta state_dict for the base-model prefix), and the
    converters' ops as core_model_loading applies them (keys in dot_natural_key order,
    MergeModulelist(dim=0) per source pattern, Concatenate(dim=1) in pattern order).
    Returns (target ref, {target: [checkpoint keys]}, the model's buffers in its state_dict) -- ref
    itself when the type has no mapping."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key, dot_natural_key
    mt = model_type_of(fixture_dir)
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    if not mt or not get_checkpoint_conversion_mapping(mt):
        return ref, {}, set()
    cfg = AutoConfig.from_pretrained(fixture_dir)
    if getattr(cfg, "quantization_config", None) is not None:
        del cfg.quantization_config
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    conv = get_model_conversion_mapping(m)
    ren = [c for c in conv if isinstance(c, WeightRenaming)]
    cvt = [c for c in conv if isinstance(c, WeightConverter)]
    sd = m.state_dict()
    out, groups, srcmap = {}, {}, {}
    for k in sorted(ref, key=dot_natural_key):
        nk, pat = rename_source_key(k, ren, cvt, m.base_model_prefix, sd)
        srcmap.setdefault(nk, []).append(k)
        if pat is None:
            out[nk] = ref[k]
        else:
            conv_of = next(c for c in cvt if pat in c.source_patterns)
            groups.setdefault(nk, (conv_of, {}))[1].setdefault(pat, []).append(ref[k])
    for nk, (c, by_pat) in groups.items():
        ops = [type(o).__name__ for o in c.operations]
        if ops not in (["MergeModulelist"], ["MergeModulelist", "Concatenate"]):
            raise RuntimeError(f"{nk}: converter ops {ops} not modelled here")
        stacks = [torch.stack([t for t, _, _ in by_pat[p]], 0) for p in c.source_patterns if p in by_pat]
        kinds = {kd for p in by_pat for _, kd, _ in by_pat[p]}
        c8s = [[c8 for _, _, c8 in by_pat[p]] for p in c.source_patterns if p in by_pat]
        c8 = None
        if any(x is not None for g in c8s for x in g):
            c8 = torch.cat([torch.stack(g, 0) for g in c8s], 1)
        out[nk] = (torch.cat(stacks, 1).contiguous(), kinds.pop() if len(kinds) == 1 else "mixed", c8)
    return out, srcmap, set(sd) - {n for n, _ in m.named_parameters()}


# ---------------------------------------------------------------------------------
# 1. every output file opens with safetensors and equals the upstream dequant


def check_dcp_files(outdir, W, ref, only_ranks=None, whole=()):
    """only_ranks: check only these ranks' files (None: every rank's). whole: the model's buffers,
    which FSDP2 does not shard: bfshard writes them whole on rank 0, as 0-d tensors."""
    def rows_k(d0, W, r, k):
        return ((0, d0) if r == 0 else (0, 0)) if k in whole else rows_of(d0, W, r)
    from safetensors import safe_open
    files = sorted(f for f in os.listdir(outdir) if f.endswith(".safetensors"))
    want = [f"shard-{r + 1:05d}-model-00001-of-00001.safetensors" for r in range(W)]
    if files != want:
        return False, f"files {files}, want {want}", {}
    seen = {k: [] for k in ref}
    tol = {}
    for r, fn in enumerate(files):
        if only_ranks is not None and r not in only_ranks:
            continue
        with safe_open(os.path.join(outdir, fn), framework="pt") as f:
            md = f.metadata() or {}
            if md.get("format") != "pt" or md.get("DCP_VERSION") != "1.0" or "DCP_SHARDING_INFO" not in md:
                return False, f"{fn}: __metadata__ {md}", tol
            info_ = json.loads(md["DCP_SHARDING_INFO"])
            keys = set(f.keys())
            if keys != set(info_):
                return False, f"{fn}: tensors without sharding info {sorted(keys ^ set(info_))}", tol
            for k in sorted(keys):
                if k not in ref:
                    return False, f"{fn}: unexpected tensor {k}", tol
                t = f.get_tensor(k)
                R, kind, c8 = ref[k]
                off = info_[k]["saved_offsets"]
                if R.dim() == 0:
                    if off != [] or r != 0:
                        return False, f"{fn}: 0-d {k} at rank {r} offsets {off} (want rank 0, [])", tol
                    sl = R
                else:
                    s, e = rows_k(R.shape[0], W, r, k)
                    if (e == s and list(t.shape) == [0] + list(R.shape[1:])
                            and off == [int(R.shape[0])] + [0] * (R.dim() - 1)):
                        continue  # torch-writer-style zero-row entry for a rank without rows: fine too
                    if off != [s] + [0] * (R.dim() - 1) or e == s:
                        return False, f"{fn}: {k} offsets {off} shape {list(t.shape)}, want rows [{s},{e})", tol
                    sl = R[s:e]
                    c8 = c8[s:e] if c8 is not None else None
                ok, msg, tl = compare(t, sl, kind, c8)
                if not ok:
                    return False, f"{fn}: {k}: {msg}", tol
                add_tol(tol, tl)
                seen[k].append(r)
    for k, ranks in seen.items():
        R = ref[k][0]
        want_r = [0] if R.dim() == 0 else [r for r in range(W) if rows_k(R.shape[0], W, r, k)[1] > rows_k(R.shape[0], W, r, k)[0]]
        if only_ranks is not None:
            want_r = [r for r in want_r if r in only_ranks]
        if ranks != want_r:
            return False, f"{k}: present on ranks {ranks}, want {want_r}", tol
    return True, "", tol


def check_hf_files(outdir, ref):
    from safetensors import safe_open
    files = sorted(f for f in os.listdir(outdir) if f.endswith(".safetensors"))
    with open(os.path.join(outdir, "model.safetensors.index.json")) as fh:
        wm = json.load(fh)["weight_map"]
    if set(wm.values()) != set(files):
        return False, f"index names {sorted(set(wm.values()))}, folder has {files}", {}
    tol, got = {}, {}
    for fn in files:
        with safe_open(os.path.join(outdir, fn), framework="pt") as f:
            if (f.metadata() or {}).get("format") != "pt":
                return False, f"{fn}: __metadata__ {f.metadata()}", tol
            for k in f.keys():
                if wm.get(k) != fn:
                    return False, f"{k} in {fn}, index says {wm.get(k)}", tol
                got[k] = f.get_tensor(k)
    if set(got) != set(ref):
        return False, f"tensor names differ: missing {sorted(set(ref) - set(got))}, extra {sorted(set(got) - set(ref))}", tol
    for k, (R, kind, c8) in ref.items():
        ok, msg, tl = compare(got[k], R, kind, c8)
        if not ok:
            return False, f"{k}: {msg}", tol
        add_tol(tol, tl)
    return True, "", tol


# ---------------------------------------------------------------------------------
# 2 + 5. FSDP2 + DCP, in W gloo processes


def _recording_reader_cls():
    import safetensors
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    class RecordingReader(HuggingFaceStorageReader):
        """Records which files each rank opens: headers (read_metadata) and data."""

        def __init__(self, path):
            super().__init__(path)
            self.meta_opens, self.data_opens, self.plan_files = [], [], {}

        def _wrap(self, sink, fn, *a, **k):
            orig = safetensors.safe_open

            def rec(filename, *aa, **kk):
                sink.append(os.path.basename(str(filename)))
                return orig(filename, *aa, **kk)

            safetensors.safe_open = rec
            try:
                return fn(*a, **k)
            finally:
                safetensors.safe_open = orig

        def read_metadata(self, *a, **k):
            return self._wrap(self.meta_opens, super().read_metadata, *a, **k)

        def read_data(self, plan, planner):
            for it in plan.items:
                p = os.path.basename(self.storage_data[it.storage_index].relative_path)
                self.plan_files.setdefault(p, set()).add(it.storage_index.fqn)
            return self._wrap(self.data_opens, super().read_data, plan, planner)

    return RecordingReader


def _build_model(job):
    from torch import nn
    if job["model"] == "transformers":
        from transformers import AutoConfig, AutoModelForCausalLM
        cfg = AutoConfig.from_pretrained(job["config_dir"])
        if getattr(cfg, "quantization_config", None) is not None:
            raise RuntimeError(f"{job['config_dir']}/config.json still has quantization_config")
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(torch.bfloat16)
        keep_fp32_like_from_pretrained(m)
        return m, list(m.model.layers)
    # plain module from the reference names (dotted: nested modules): >=1-d -> parameters, 0-d -> buffers
    ref = load_reference(job["ref"])
    m = nn.Module()
    for k, (t, _, _) in ref.items():
        *path, leaf = k.split(".")
        sub = m
        for p in path:
            if not hasattr(sub, p):
                sub.add_module(p, nn.Module())
            sub = getattr(sub, p)
        if t.dim() == 0:
            sub.register_buffer(leaf, torch.zeros_like(t))
        else:
            sub.register_parameter(leaf, nn.Parameter(torch.zeros_like(t)))
    return m, []


def keep_fp32_like_from_pretrained(m):
    """The buffers from_pretrained(dtype=bfloat16) keeps in float32 (_keep_in_fp32_modules_strict,
    searched in each name: the routers' correction bias), made float32 as the README recipe makes
    them (from_config does not). Parameters stay bfloat16: FSDP2 wants one dtype per group."""
    keep = list(m._keep_in_fp32_modules_strict or ())
    for name, t in m.named_buffers():
        if any(re.search(k, name) for k in keep):
            t.data = t.data.float()


def _sharded_state_dict(job, mesh):
    from torch.distributed.fsdp import fully_shard
    m, blocks = _build_model(job)
    for b in blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m


def _check_local(m, ref, W, rank, res, label):
    from torch.distributed.tensor import DTensor, Shard
    sd = m.state_dict()
    if set(sd) != set(ref):
        res["errors"].append(f"{label}: model keys != checkpoint keys: model-only {sorted(set(sd) - set(ref))[:4]}, "
                             f"checkpoint-only {sorted(set(ref) - set(sd))[:4]}")
        return
    tol = {}
    for k, v in sd.items():
        R, kind, c8 = ref[k]
        if isinstance(v, DTensor):
            if tuple(v.placements) != (Shard(0),) or tuple(v.shape) != tuple(R.shape):
                res["errors"].append(f"{label}: {k} is {v.placements} {list(v.shape)}")
                continue
            s, e = rows_of(R.shape[0], W, rank)
            local = v.to_local()
            R = R[s:e]
            c8 = c8[s:e] if c8 is not None else None
        else:
            local = v
        if local.dtype == torch.float32 and R.dtype == torch.bfloat16:
            # a float32-kept module of the model (from_config keeps it, e.g. the router's correction
            # bias) given bfshard's BF16: must be its exact upcast (--keep-dtype keeps float32)
            if not torch.equal(local.to(torch.bfloat16).float(), local):
                res["errors"].append(f"{label}: rank {rank} {k}: float32 is not an exact bf16 upcast")
                continue
            local = local.to(torch.bfloat16)
        elif local.dtype == torch.bfloat16 and R.dtype == torch.float32:
            # a float32 parameter of the model in a bfloat16 FSDP2 group: dcp.load rounds the
            # checkpoint's exact F32 (bfshard writes it as stored) with copy_
            R, kind = R.to(torch.bfloat16), "cast"
        ok, msg, tl = compare(local, R, kind, c8)
        if not ok:
            res["errors"].append(f"{label}: rank {rank} {k}: {msg}")
        add_tol(tol, tl)
    res.setdefault("tol", {})
    add_tol(res["tol"], tol)


def readme_block(readme):
    """The python block of README.md's 'Load the dcp output into an FSDP2 model'."""
    with open(readme) as fh:
        text = fh.read()
    i = text.find("### Load the dcp output into an FSDP2 model")
    m = re.search(r"```python\n(.*?)```", text[i:], re.S) if i >= 0 else None
    if not m:
        raise RuntimeError(f"{readme}: no python block under '### Load the dcp output into an FSDP2 model'")
    code = m.group(1)
    if len(re.findall(r"^ckpt, device = .*$", code, re.M)) != 1:
        raise RuntimeError(f"{readme}: the block must set `ckpt, device = ...` on one line")
    return code


def _run_readme(job, Reader):
    """exec the README block as a user would run it, on this checkpoint, on the CPU."""
    import torch.distributed.checkpoint as dcp_mod
    code = re.sub(r"^ckpt, device = .*$", f"ckpt, device = {job['dir']!r}, 'cpu'", job["code"], flags=re.M)
    readers = []

    class R(Reader):
        def __init__(self, path, *a, **k):
            super().__init__(path)
            readers.append(self)

    orig = dcp_mod.HuggingFaceStorageReader
    dcp_mod.HuggingFaceStorageReader = R  # to record which files each rank reads
    try:
        ns = {"__name__": "readme_block"}
        exec(compile(code, "README.md", "exec"), ns)
    finally:
        dcp_mod.HuggingFaceStorageReader = orig
    if len(readers) != 1:
        raise RuntimeError(f"README block made {len(readers)} HuggingFaceStorageReader(s)")
    return ns["model"], readers[0]


def _check_forward(m, ref, job, res):
    """Buffers and logits of the FSDP2 model == a plain model with the upstream weights."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from torch.distributed.tensor import DTensor
    torch.manual_seed(0)
    rm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(job["dir"]), dtype=torch.bfloat16)
    keep_fp32_like_from_pretrained(rm)
    rsd = rm.state_dict()
    rm.load_state_dict({k: t.to(rsd[k].dtype) for k, (t, _, _) in ref.items()}, strict=True)
    rb = dict(rm.named_buffers())
    for n, b in m.named_buffers():
        if n not in rb or not torch.equal(b, rb[n]):
            res["errors"].append(f"{job['id']}: buffer {n} differs from a freshly built model's")
    ids = torch.randint(0, rm.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    m.eval(), rm.eval()
    with torch.no_grad():
        a, b = m(input_ids=ids).logits, rm(input_ids=ids).logits
        if not (torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))):
            res["errors"].append(f"{job['id']}: FSDP2 logits != reference logits")
        # again with NaN/inf/huge weights zeroed in both (mxfp4-tiny's edge values make them NaN)
        for mm in (m, rm):
            for p in mm.parameters():
                x = p.to_local() if isinstance(p, DTensor) else p
                x.masked_fill_(~(x.abs() <= 64), 0.0)
        a, b = m(input_ids=ids).logits, rm(input_ids=ids).logits
        if not (torch.isfinite(a).all() and torch.equal(a, b)):
            res["errors"].append(f"{job['id']}: FSDP2 logits (weights sanitized) != reference or not finite")
        else:
            res["notes"].append(f"FSDP2 forward: logits {list(a.shape)} bit-identical to the unsharded model with the "
                                f"upstream weights (as loaded, NaN pattern included, and with huge/non-finite weights zeroed)")


def _check_original(m, job, W, rank, res):
    """Every parameter and buffer of the FSDP2-loaded model == from_pretrained(dtype=bfloat16) of the
    ORIGINAL quantized checkpoint (transformers dequantizes it itself, on the CPU), in value and in
    dtype: the tensors it keeps in float32 (the router's correction bias, DeepSeek-V4's hc_*, sinks,
    norms) float32 with the checkpoint's exact values. Non-persistent buffers included (named_buffers)."""
    from transformers import AutoModelForCausalLM
    from torch.distributed.tensor import DTensor
    om = AutoModelForCausalLM.from_pretrained(job["orig"], dtype=torch.bfloat16)
    want = {**dict(om.named_parameters()), **dict(om.named_buffers())}
    got = {**dict(m.named_parameters()), **dict(m.named_buffers())}
    if set(got) != set(want):
        res["errors"].append(f"{job['id']}: names differ from from_pretrained(original): "
                             f"{sorted(set(got) ^ set(want))[:4]}")
        return
    n32, nround, bad = 0, 0, []
    for k, v in got.items():
        R = want[k].detach()
        if isinstance(v, DTensor):
            s, e = rows_of(R.shape[0], W, rank)
            R, v = R[s:e], v.to_local()
        v = v.detach()
        if k in dict(om.named_parameters()) and R.dtype == torch.float32 and v.dtype == torch.bfloat16:
            # a float32 parameter upstream in a bfloat16 FSDP2 group (one dtype per group): dcp.load
            # rounds the checkpoint's exact F32 as from_pretrained's value rounds
            R, nround = R.to(torch.bfloat16), nround + 1
        if v.dtype != R.dtype or tuple(v.shape) != tuple(R.shape) or not torch.equal(int_view(v), int_view(R)):
            if not (R.is_floating_point() and v.dtype == R.dtype and torch.equal(v.isnan(), R.isnan()) and
                    torch.equal(v.nan_to_num(0.0), R.nan_to_num(0.0))):  # NaN payloads aside
                bad.append(f"{k} ({v.dtype} vs {R.dtype})")
        n32 += R.dtype == torch.float32
    if bad:
        res["errors"].append(f"{job['id']}: rank {rank}: != from_pretrained(original) for {len(bad)}: {bad[:4]}")
    else:
        res["notes"].append(f"every parameter and buffer == from_pretrained(dtype=bfloat16) of the original "
                            f"quantized checkpoint, dtypes included ({n32} float32"
                            + (f"; {nround} float32 parameters upstream in bfloat16 FSDP2 groups, == its rounding)"
                               if nround else ")"))


def _fill_sentinel(m):
    from torch.distributed.tensor import DTensor
    with torch.no_grad():
        for v in m.state_dict().values():
            (v.to_local() if isinstance(v, DTensor) else v).fill_(-1234.5)


def _dist_worker(rank, W, port, jobs, resdir):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    warnings.filterwarnings("ignore")
    logging.getLogger("torch.distributed").setLevel(logging.ERROR)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(W), RANK=str(rank),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(W))
    dist.init_process_group("gloo", rank=rank, world_size=W, timeout=datetime.timedelta(seconds=180))
    mesh = init_device_mesh("cpu", (W,))
    Reader = _recording_reader_cls()
    out = {}
    for job in jobs:
        res = {"errors": [], "notes": []}
        out[job["id"]] = res
        try:
            ref = load_reference(job["ref"])
            t0 = time.time()
            if job["model"] == "readme":
                m, rd = _run_readme(job, Reader)
            else:
                m = _sharded_state_dict(job, mesh)
                _fill_sentinel(m)
                rd = Reader(job["dir"])
                dcp.load(m.state_dict(), storage_reader=rd)
            res["load_s"] = time.time() - t0
            _check_local(m, ref, W, rank, res, job["id"])
            if job["model"] == "readme":
                _check_forward(m, ref, job, res)
            if job.get("orig"):
                _check_original(m, job, W, rank, res)
            res["meta_opens"] = sorted(set(rd.meta_opens))
            res["data_opens"] = sorted(set(rd.data_opens))
            res["plan_files"] = {f: sorted(v) for f, v in rd.plan_files.items()}
            if job.get("torch_writer"):
                # what does torch's own writer make of the same sharded state dict?
                tdir = job["torch_writer"]
                dcp.save(m.state_dict(), storage_writer=HuggingFaceStorageWriter(tdir, save_distributed=True))
                dist.barrier()
                m2 = _sharded_state_dict(job, mesh)
                _fill_sentinel(m2)
                dcp.load(m2.state_dict(), storage_reader=Reader(tdir))
                _check_local(m2, ref, W, rank, res, job["id"] + " (torch-written copy)")
            if job.get("scalar_param_probe"):
                from torch import nn
                from torch.distributed.fsdp import fully_shard
                p = nn.Module()
                p.s = nn.Parameter(torch.tensor(1.0, dtype=torch.bfloat16))
                try:
                    fully_shard(p, mesh=mesh)
                    res["notes"].append("fully_shard accepted a 0-d parameter")
                except Exception as e:  # noqa: BLE001
                    res["notes"].append(f"fully_shard(0-d nn.Parameter) raises {type(e).__name__}: {e}")
        except Exception as e:  # noqa: BLE001
            res["errors"].append(f"{job['id']}: rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}")
        dist.barrier()
    path = os.path.join(resdir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as fh:  # whole or absent: run_dist takes its presence as "done"
        json.dump(out, fh)
    os.replace(path + ".tmp", path)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_dist(W, jobs, work, timeout_s):
    import torch.multiprocessing as mp
    resdir = os.path.join(work, f"dist-w{W}")
    shutil.rmtree(resdir, ignore_errors=True)
    os.makedirs(resdir)
    t0 = time.time()
    ctx = mp.start_processes(_dist_worker, args=(W, free_port(), jobs, resdir), nprocs=W, join=False,
                             start_method="spawn")
    err = None
    try:
        while not ctx.join(timeout=2):
            if time.time() - t0 > timeout_s:
                err = f"timed out after {timeout_s} s"
                break
    except Exception as e:  # noqa: BLE001  (a rank died)
        err = f"{type(e).__name__}: {str(e)[-2000:]}"
    if err:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
    per_rank = {}
    for r in range(W):
        p = os.path.join(resdir, f"rank{r}.json")
        if os.path.exists(p):
            with open(p) as fh:
                per_rank[r] = json.load(fh)
    return per_rank, err, time.time() - t0


def inspect_torch_written(tdir, bfdir, W):
    """Compare torch's HuggingFaceStorageWriter output with bfshard's rank files."""
    from safetensors import safe_open
    notes, problems = [], []
    tfiles = sorted(f for f in os.listdir(tdir) if f.endswith(".safetensors"))
    notes.append(f"torch wrote {len(tfiles)} file(s) for {W} ranks: "
                 + ", ".join(f"rank {int(SHARD_RE.match(f).group(1)) - 1}" for f in tfiles))
    empties, zerod = [], []
    for fn in tfiles:
        r = int(SHARD_RE.match(fn).group(1)) - 1
        with safe_open(os.path.join(tdir, fn), framework="pt") as f:
            si = json.loads(f.metadata()["DCP_SHARDING_INFO"])
            bpath = os.path.join(bfdir, fn)
            with safe_open(bpath, framework="pt") as g:
                gsi = json.loads(g.metadata()["DCP_SHARDING_INFO"])
                for k in f.keys():
                    t = f.get_tensor(k)
                    if t.dim() == 0:
                        zerod.append(f"{k} on rank {r} saved_offsets {si[k]['saved_offsets']}")
                    if t.numel() == 0 and t.dim() > 0:
                        empties.append(f"{k} {list(t.shape)} saved_offsets {si[k]['saved_offsets']} (rank {r})")
                        continue
                    if k not in gsi:
                        if t.dim() == 0:
                            continue
                        problems.append(f"rank {r}: torch has {k}, bfshard's file does not")
                        continue
                    if gsi[k] != si[k] or not torch.equal(int_view(g.get_tensor(k)), int_view(t)):
                        problems.append(f"rank {r}: {k} differs: torch {si[k]}, bfshard {gsi[k]}")
    notes.append("zero-row entries torch wrote: " + ("; ".join(empties) if empties else "none"))
    if zerod:
        notes.append("0-d tensors torch wrote: " + "; ".join(zerod))
    return notes, problems


# ---------------------------------------------------------------------------------
# 3. from_pretrained on the hf output


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(f"{record.name}: {record.getMessage()}")


def check_from_pretrained(name, hfdir, ref, work):
    import transformers
    from transformers import AutoModelForCausalLM
    from safetensors.torch import save_file

    # the comparison model (below): the same classes, given the upstream-dequantized weights
    transformers.logging.set_verbosity_warning()
    cap = _Capture()
    tlog = logging.getLogger("transformers")
    tlog.addHandler(cap)
    try:
        with warnings.catch_warnings(record=True) as wlist:
            warnings.simplefilter("always")
            model, linfo = AutoModelForCausalLM.from_pretrained(hfdir, output_loading_info=True)
        msgs = cap.records + [f"{w.category.__name__}: {w.message}" for w in wlist]
        cap.records = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # built from the config and given the reference weights under the model's own names
            # (a checkpoint saved under target names is not one from_pretrained renames back)
            rmodel = AutoModelForCausalLM.from_pretrained(hfdir)  # the same classes and dtypes (fp32-kept modules)
            rsd = rmodel.state_dict()
            rmodel.load_state_dict({k: t.to(rsd[k].dtype) if k in rsd else t for k, (t, _, _) in ref.items()}, strict=True)
    finally:
        tlog.removeHandler(cap)
    problems = []
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs", "conversion_errors"):
        if linfo.get(key):
            problems.append(f"{key}: {sorted(map(str, linfo[key]))[:5]}")
    keyword = re.compile(r"missing|unexpected|not initiali|newly initiali|quantiz|mismatch|not used", re.I)
    bad_msgs = [m for m in msgs if keyword.search(m)]
    if bad_msgs:
        problems.append(f"warnings: {bad_msgs[:3]}")
    if getattr(model, "hf_quantizer", None) is not None or getattr(model.config, "quantization_config", None) is not None:
        problems.append("model is quantized (hf_quantizer / quantization_config set)")
    types = {type(p).__name__ for p in model.parameters()} | {type(mod).__name__ for mod in model.modules() if "4bit" in type(mod).__name__ or "Mxfp4" in type(mod).__name__}
    if types != {"Parameter"}:
        problems.append(f"parameter/module types {sorted(types)}")
    dtypes = {}
    for k, p in model.named_parameters():
        dtypes.setdefault(str(p.dtype).replace("torch.", ""), []).append(k)
    if "bfloat16" not in dtypes:
        problems.append(f"no bf16 parameters: {list(dtypes)}")
    # every loaded parameter equals the upstream tensor (fp32-kept modules: exact upcast)
    msd = model.state_dict()
    tol = {}
    for k, (R, kind, c8) in ref.items():
        if k not in msd:
            problems.append(f"{k} not in the model's state_dict")
            continue
        v = msd[k]
        ok, msg, tl = compare(v.to(torch.bfloat16) if v.dtype != R.dtype else v, R, kind, c8)
        if (v.dtype == torch.float32 and R.dtype == torch.bfloat16 and not torch.equal(v.to(torch.bfloat16).float(), v)
                and not torch.isnan(v).any()):
            ok, msg = False, f"fp32 parameter is not an exact bf16 upcast"
        if not ok:
            problems.append(f"{k}: {msg}")
        add_tol(tol, tl)
    # logits: as loaded, and with huge/non-finite weights zeroed in both (mxfp4-tiny has
    # inf/NaN/2^127 weights on purpose, which make the raw logits NaN)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 11), generator=g)
    model.eval(), rmodel.eval()
    with torch.no_grad():
        a = model(input_ids=ids).logits
        b = rmodel(input_ids=ids).logits
        same_raw = torch.equal(torch.nan_to_num(a, nan=7.0), torch.nan_to_num(b, nan=7.0)) and torch.equal(a.isnan(), b.isnan())
        for mm in (model, rmodel):
            for p in mm.parameters():
                p.masked_fill_(~(p.abs() <= 64), 0.0)  # NaN, inf and the 2^127-scale edge values
        a2 = model(input_ids=ids).logits
        b2 = rmodel(input_ids=ids).logits
    finite = bool(torch.isfinite(a2).all())
    if not same_raw:
        problems.append(f"logits differ (max |d| {float((a - b).abs().nan_to_num(0).max()):.3g})")
    if not (torch.equal(a2, b2) and finite):
        problems.append(f"logits with huge/non-finite weights zeroed differ or are not finite (finite={finite})")
    det = (f"{sum(map(len, dtypes.values()))} params "
           + ", ".join(f"{n} {dt}" for dt, n in ((dt, len(v)) for dt, v in dtypes.items()))
           + f"; logits {list(a.shape)} equal ({int(torch.isfinite(a).sum())} finite as loaded, all finite and equal with "
           f"non-finite and |w| > 64 weights zeroed in both); {tol_text(tol)}; warnings: {msgs if msgs else 'none'}")
    return (not problems), ("; ".join(problems) if problems else det)


# ---------------------------------------------------------------------------------
# 4. torch's consolidation of the dcp output == our hf output


def consolidate_fn():
    import torch.distributed.checkpoint._consolidate_hf_safetensors as C
    return C.consolidate_safetensors_files


def check_consolidation(dcpdir, hfdir, dst):
    from safetensors import safe_open
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    keys = set()
    for f in glob.glob(os.path.join(dcpdir, "*.safetensors")):
        with safe_open(f, framework="pt") as fh:
            keys |= set(fh.keys())
    try:
        consolidate_fn()(input_dir=dcpdir, output_dir=dst, fqn_to_index_mapping={k: 1 for k in keys})
    except TypeError as e:
        ints = []
        for f in sorted(glob.glob(os.path.join(dcpdir, "*.safetensors"))):
            with safe_open(f, framework="pt") as fh:
                ints += [k for k in fh.keys() if not fh.get_slice(k).get_dtype().startswith(("F", "BF"))]
        if "torch.finfo()" in str(e) and ints:
            # torch 2.15: _consolidate_hf_safetensors.py:137 takes every dtype's size from torch.finfo,
            # which integer dtypes do not have: no checkpoint with an integer tensor consolidates
            return True, (f"torch's consolidation cannot run on it: integer tensors {sorted(set(ints))[:3]} and "
                          f"torch.finfo() at _consolidate_hf_safetensors.py:137 (a torch 2.15 bug, not bfshard's; "
                          f"checks 1 and 2 cover these files)")
        return False, f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001
        empty = []
        for f in sorted(glob.glob(os.path.join(dcpdir, "*.safetensors"))):
            with safe_open(f, framework="pt") as fh:
                if not list(fh.keys()):
                    empty.append(os.path.basename(f))
        why = (f"; rank files with no tensor {empty} carry DCP_SHARDING_INFO '{{}}', which torch's consolidation "
               f"rejects (torch's own writer writes no file for such a rank: see the scalar0d.dcp-w8 torch-writer check)") if empty else ""
        return False, f"{type(e).__name__}: {e}{why}"

    def load_all(d):
        t = {}
        for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
            with safe_open(f, framework="pt") as fh:
                for k in fh.keys():
                    t[k] = fh.get_tensor(k)
        return t

    a, b = load_all(dst), load_all(hfdir)
    if set(a) != set(b):
        return False, f"names differ: torch-only {sorted(set(a) - set(b))}, hf-only {sorted(set(b) - set(a))}"
    zeroed = []
    for k in sorted(a):
        if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape:
            return False, f"{k}: consolidated {a[k].dtype} {list(a[k].shape)} != hf {b[k].dtype} {list(b[k].shape)}"
        if not torch.equal(int_view(a[k]), int_view(b[k])):
            # torch bug (2.15): _write_sub_tensor_to_file_optimized returns early for shape []
            # ("empty"), so every 0-d tensor is written as zero bytes -- torch's own DCP
            # checkpoints included (shown in check 5). Not bfshard's; tolerated, reported.
            if a[k].dim() == 0 and int(int_view(a[k])[0]) == 0:
                zeroed.append(k)
                continue
            return False, f"{k}: bytes differ"
    msg = f"{len(a)} tensors byte-identical"
    if zeroed:
        msg = (f"{len(a) - len(zeroed)} tensors byte-identical; 0-d {zeroed} come out ZERO: torch's consolidation "
               f"bug (writes shape [] as empty), not bfshard's")
    return True, msg


# ---------------------------------------------------------------------------------
# 6. W=1024: a few layers of the DeepSeek-V3-named checkpoint, 1024 rank files


W1024_LAYERS, W1024_FILES = 4, 163  # layers 0-2 dense, layer 3 MoE (256 routed experts + the shared one)


def check_w1024(bfshard, root, work, device, W=1024):
    """bench/gen_synth.py dsv3-names (DeepSeek-V3's names, FP8 block + weight_scale_inv, 163
    input files) -> bfshard convert --world-size 1024, then in this one process (no process
    group): dcp.load(full-size state dict, HuggingFaceStorageReader(OUT), no_dist=True) of
    every tensor == the upstream dequant bit for bit, the read metadata's chunks are exactly
    rank r's torch.chunk rows in rank r's file for every tensor and all W ranks, and a sample
    of rank files (0, 1, W/2-1, W-1, the last rank with rows of the smallest tensor) opened
    with safe_open equal the upstream rows of that rank."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    t_all = time.time()
    tag = f"dsv3-names-l{W1024_LAYERS}"
    inp = os.path.join(work, tag + "-input")
    out = os.path.join(work, "out", f"{tag}.dcp-w{W}")
    hf = os.path.join(work, "out", f"{tag}.hf")
    name = (f"6 w{W}: {tag} ({W1024_FILES} input files, FP8 block) -> bfshard --world-size {W}; "
            f"dcp.load(HuggingFaceStorageReader, no_dist) of every tensor == upstream")

    shutil.rmtree(inp, ignore_errors=True)
    p = subprocess.run([sys.executable, os.path.join(root, "bench", "gen_synth.py"), "dsv3-names", inp,
                        "--layers", str(W1024_LAYERS), "--files", str(W1024_FILES)], capture_output=True, text=True)
    if p.returncode != 0:
        record(name, False, f"gen_synth.py exit {p.returncode}: {p.stderr.strip()[-500:]}")
        return
    t_gen = time.time() - t_all
    t0 = time.time()
    for d, extra in ((out, ["--world-size", str(W)]), (hf, ["--layout", "hf", "--world-size", "1"])):
        shutil.rmtree(d, ignore_errors=True)
        cmd = [bfshard, "convert", inp, d, *extra, "--device", device, "--quiet"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            record(name, False, f"{' '.join(cmd)} -> exit {p.returncode}: {p.stderr.strip()[-500:]}")
            return
    t_conv = time.time() - t0

    t0 = time.time()
    ref = upstream_reference(inp)
    t_ref = time.time() - t0
    kinds = {}
    for _, kind, _ in ref.values():
        kinds[kind] = kinds.get(kind, 0) + 1
    if kinds.get("fp8-block", 0) == 0 or any(t.dim() == 0 for t, _, _ in ref.values()):
        record(name, False, f"unexpected reference: kinds {kinds}")
        return

    # the hf output (W=1) is the whole-tensor form of the same conversion, under checkpoint names
    ok, msg, _ = check_hf_files(hf, ref)
    if not ok:
        record(name, False, f"{tag}.hf != upstream: {msg}")
        return
    # the dcp output: under transformers' names (its 256 routed experts a layer packed 3-D)
    ref, _, whole = to_target(ref, inp)

    Base = _recording_reader_cls()

    class Reader(Base):
        def read_metadata(self, *a, **k):
            self.md = super().read_metadata(*a, **k)
            return self.md

    sd = {k: torch.zeros(t.shape, dtype=t.dtype) for k, (t, _, _) in ref.items()}
    reader = Reader(out)
    t0 = time.time()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        try:
            dcp.load(sd, storage_reader=reader, no_dist=True)
        except (Exception, CheckpointException) as e:  # noqa: BLE001 (CheckpointException is a BaseException)
            last = (str(e).strip().splitlines() or [""])[-1]  # the planner's own error, after the traceback
            record(name, False, f"dcp.load: {type(e).__name__}: {last}")
            return
    t_load = time.time() - t0

    errs, tol = [], {}
    own = [f"shard-{r + 1:05d}-model-00001-of-00001.safetensors" for r in range(W)]
    md = reader.md
    where = {(i.fqn, tuple(int(x) for x in i.offset)): os.path.basename(str(v.relative_path))
             for i, v in md.storage_data.items()}
    if set(md.state_dict_metadata) != set(ref):
        errs.append(f"metadata names differ: missing {sorted(set(ref) - set(md.state_dict_metadata))[:3]}, "
                    f"extra {sorted(set(md.state_dict_metadata) - set(ref))[:3]}")
    nchunks = 0
    for k, (R, kind, c8) in sorted(ref.items()):
        m = md.state_dict_metadata.get(k)
        if m is None:
            continue
        if tuple(m.size) != tuple(R.shape):
            errs.append(f"{k}: assembled size {list(m.size)}, want {list(R.shape)}")
            continue
        # every rank with rows, in rank order: offsets [start, 0...], sizes [rows, ...], in its own file
        want = []
        for r in range(W):
            s_, e_ = rows_of(R.shape[0], W, r) if k not in whole else (0, R.shape[0] if r == 0 else 0)
            if e_ > s_:
                want.append(((s_,) + (0,) * (R.dim() - 1), (e_ - s_,) + tuple(R.shape[1:]), own[r]))
        got = sorted((tuple(int(x) for x in c.offsets), tuple(int(x) for x in c.sizes),
                      where.get((k, tuple(int(x) for x in c.offsets)))) for c in m.chunks)
        nchunks += len(got)
        if got != want:
            diff = [g for g in got if g not in want][:2] + [("missing",) + w for w in want if w not in got][:2]
            errs.append(f"{k}: {len(got)} chunks (offsets, sizes, file), want {len(want)}; first differences {diff}")
            continue
        ok, msg, tl = compare(sd[k], R, kind, c8)
        if not ok:
            errs.append(f"{k}: {msg}")
        add_tol(tol, tl)
    if len(reader.meta_opens) != W or set(reader.meta_opens) != set(own):
        errs.append(f"read_metadata opened {len(reader.meta_opens)} files, want the {W} rank files")

    # a sample of rank files with safe_open, against the upstream rows of that rank
    small = min((k for k, (t, _, _) in ref.items()), key=lambda k: (ref[k][0].shape[0], ref[k][0].numel(), k))
    d0 = ref[small][0].shape[0]
    last_small = max(r for r in range(W) if rows_of(d0, W, r)[1] > rows_of(d0, W, r)[0])
    sample = sorted({0, 1, W // 2 - 1, W - 1, last_small})
    t0 = time.time()
    ok, msg, tl = check_dcp_files(out, W, ref, only_ranks=set(sample), whole=whole)
    t_sample = time.time() - t0
    if not ok:
        errs.append(f"rank files {sample}: {msg}")
    add_tol(tol, tl)

    total = time.time() - t_all
    record(name, not errs,
           "; ".join(errs[:4]) if errs else
           (f"{len(ref)} tensors ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}), {tol_text(tol)}; "
            f"metadata: {nchunks} chunks over all {W} ranks == torch.chunk rows, each in its rank's file; "
            f"read_data opened {len(set(reader.data_opens))} files; safe_open of ranks {sample} == upstream rows "
            f"(rank {last_small}: last with rows of the smallest, {small} [{d0}]); == {tag}.hf; "
            f"{total:.1f} s: gen {t_gen:.1f}, convert W={W} + hf {t_conv:.1f}, upstream {t_ref:.1f}, "
            f"dcp.load {t_load:.1f}, rank files {t_sample:.1f}"))


# ---------------------------------------------------------------------------------


def make_zero_row_variant(src, dst, W, ref):
    """bfshard's dcp output plus, on every rank without rows of a tensor, the zero-row
    entry torch's own writer uses (shape [0, ...], saved_offsets [d0, 0, ...])."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    added = 0
    for r in range(W):
        fn = os.path.join(dst, f"shard-{r + 1:05d}-model-00001-of-00001.safetensors")
        with safe_open(fn, framework="pt") as f:
            md = f.metadata()
            t = {k: f.get_tensor(k) for k in f.keys()}
        si = json.loads(md["DCP_SHARDING_INFO"])
        for k, (R, _, _) in ref.items():
            if R.dim() >= 1 and k not in t:
                t[k] = torch.empty((0,) + tuple(R.shape[1:]), dtype=R.dtype)
                si[k] = {"saved_offsets": [int(R.shape[0])] + [0] * (R.dim() - 1)}
                added += 1
        md["DCP_SHARDING_INFO"] = json.dumps(si)
        save_file(t, fn, metadata=md)
    return added


def make_scalar_input(path):
    """A tiny checkpoint with 0-d tensors (F32 and BF16) next to ordinary ones."""
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(1)
    t = {
        "w": torch.randn(5, 3, generator=g),                          # F32 [5,3] -> rows 2,2,1 at W=3
        "b": torch.randn(5, generator=g).to(torch.bfloat16),          # BF16 [5]
        "temperature": torch.tensor(0.7071067690849304),              # F32 0-d
        "logit_scale": torch.tensor(3.25, dtype=torch.bfloat16),      # BF16 0-d
    }
    save_file(t, path, metadata={"format": "pt"})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bfshard", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dist-timeout", type=int, default=480)
    ap.add_argument("--only", default=os.environ.get("INTEROP_ONLY", ""),
                    help="comma-separated fixtures: check only these (INTEROP_ONLY=...; default: all)")
    args = ap.parse_args()
    only = set(x for x in args.only.split(",") if x)
    t_start = time.time()
    warnings.filterwarnings("ignore", message=".*TypedStorage.*")
    for n in ("torch._dynamo", "torch.utils.cpp_extension", "torch._inductor"):
        logging.getLogger(n).setLevel(logging.ERROR)

    import safetensors
    import transformers
    transformers.utils.logging.disable_progress_bar()
    import bitsandbytes
    import accelerate
    import compressed_tensors
    import importlib.metadata
    say(f"interop: python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"safetensors {safetensors.__version__}, bitsandbytes {bitsandbytes.__version__}, numpy {np.__version__}, "
        f"accelerate {accelerate.__version__}, compressed-tensors {compressed_tensors.__version__}, "
        f"nvidia-modelopt {importlib.metadata.version('nvidia-modelopt')}; "
        f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}")
    say(f"interop: bfshard {args.bfshard} --device {args.device}; consolidation: "
        f"{consolidate_fn().__module__}.{consolidate_fn().__name__}")

    work = args.work
    # check 6 runs in a full run and when --only names w1024 (--only w1024: check 6 alone)
    run6, only6 = not only or "w1024" in only, only == {"w1024"}
    only.discard("w1024")
    if only6:
        os.makedirs(os.path.join(work, "out"), exist_ok=True)
        run_w1024(args)
        return summary(t_start)
    outs = os.path.join(work, "out")
    refs = os.path.join(work, "ref")
    os.makedirs(outs, exist_ok=True)
    os.makedirs(refs, exist_ok=True)

    fixtures = ["mxfp4-tiny"] + sorted(os.path.basename(d) for d in glob.glob(os.path.join(args.fixtures, "bnb-*")))
    # docs/FORMATS.md s6-8: every fixture whose config.json names an FP8 / compressed-tensors / ModelOpt quantization
    qfix = sorted(os.path.basename(os.path.dirname(c)) for c in glob.glob(os.path.join(args.fixtures, "*", "config.json"))
                  if quant_config(os.path.dirname(c)).get("quant_method") in QUANT_METHODS
                  and os.path.basename(os.path.dirname(c)) not in SIDE_FIXTURES)
    fixtures += qfix
    # GPTQ and AWQ: GPTQModel (what transformers hands them to) does not install in this venv, so
    # their reference is fixtures/expected/<f>.safetensors, written by fixtures/gen_gptq_fixtures.py
    # with GPTQModel's own functions (fixtures/README-gptq.md); the consumers' checks are the same
    def woq_method(d):
        q = quant_config(d)
        if not q and os.path.exists(os.path.join(d, "quantize_config.json")):
            return "gptq"
        return q.get("quant_method")
    woqfix = sorted(os.path.basename(os.path.dirname(c)) for c in glob.glob(os.path.join(args.fixtures, "*", "config.json"))
                    if woq_method(os.path.dirname(c)) in ("gptq", "awq"))
    fixtures += woqfix
    if only:
        missing = only - set(fixtures) - set(SIDE_FIXTURES)
        if missing:
            say(f"interop: --only names no such fixture: {sorted(missing)}")
            return 2
        fixtures = [f for f in fixtures if f in only]
        qfix = [f for f in qfix if f in only]
    # FSDP2 / DCP loads: one fixture per format (Llama-shaped: a transformers model is built from the output config)
    # per-expert MoE checkpoints (qwen3_moe, deepseek_v3, glm4_moe, mixtral, minimax_m2, deepseek_v4 and
    # fp8-fused's already-fused experts): the real model class, loaded under bfshard's target names
    moe = [f for f in qfix if f.startswith("moe-") or f in ("ct-moe-mixed", "fp8-fused")]
    q_dcp = [f for f in ("fp8-block", "ct-fp8-channel", "ct-int4-asym", "ct-nvfp4", "modelopt-nvfp4",
                         "fp8-tensor", "ct-mxfp8", "ct-mxfp4", "ct-mxfp6") if f in qfix] + moe
    # the checkpoints that no transformers model is built from (DeepSeek-V4's own names; fused
    # FP8 experts): loaded into a plain module of the checkpoint's names and shapes
    # ct-mx-mixed, ct-mx6-mixed: Qwen3-MoE-named format fixtures without its q_norm / k_norm (no complete
    # model): their packed experts loaded into a plain module of the target names
    q_plain = [f for f in ("fp8-fused-tensor", "dsv4-tiny", "dsv41-tiny", "dsv4-float", "ct-mx-mixed", "ct-mx6-mixed")
               if f in qfix]
    inputs = {f: os.path.join(args.fixtures, f) for f in fixtures}
    scalar_in = os.path.join(work, "scalar0d-input")
    os.makedirs(scalar_in, exist_ok=True)
    make_scalar_input(os.path.join(scalar_in, "model.safetensors"))
    inputs["scalar0d"] = scalar_in

    # ---- convert --------------------------------------------------------------------
    # (fixture, layout, W, extra)
    conv = []
    for f in fixtures:
        conv += [(f, "dcp", 2, ()), (f, "dcp", 3, ()), (f, "hf", 1, ())]
    if "mxfp4-tiny" in fixtures:
        conv += [("mxfp4-tiny", "dcp", 8, ()), ("mxfp4-tiny", "dcp", 3, ("--mxfp4-layout", "openai"))]
    # W = 8 > E = 4 experts: ranks 4..7 hold none; hf under target names, for torch's consolidation
    conv += [(f, "dcp", 8, ()) for f in moe if f.startswith("moe-")]
    # dsv4-tiny, dsv41-tiny, dsv4-float: DeepSeek-V4's names at shapes no model has (format fixtures,
    # loaded into a plain module of their own names): under checkpoint names; moe-dsv4-fp8 is the
    # real DeepseekV4ForCausalLM, under target names
    ckpt_names = {f for f in fixtures if f.startswith("dsv4")}
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(args.fixtures)), "dev"))
    import names_table
    in_table = set(names_table.read_table())
    conv += [(f, "hf", 1, ("--names", "transformers")) for f in fixtures
             if f not in ckpt_names and model_type_of(inputs[f]) in in_table]
    if not only:
        conv += [("scalar0d", "dcp", 3, ()), ("scalar0d", "dcp", 8, ()), ("scalar0d", "hf", 1, ())]
    else:
        del inputs["scalar0d"]
    outdir = {}
    t0 = time.time()
    conv_fail = []
    for f, layout, W, extra in conv:
        tag = f"{f}.{layout}" + (f"-w{W}" if layout == "dcp" else "") + ("-" + extra[-1] if extra else "")
        d = os.path.join(outs, tag)
        cmd = [args.bfshard, "convert", inputs[f], d, "--layout", layout, "--world-size", str(W),
               "--device", args.device, "--quiet", *extra, *(("--names", "checkpoint") if f in ckpt_names else ())]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            conv_fail.append(f"{' '.join(cmd)} -> exit {p.returncode}: {p.stderr.strip()[-500:]}")
            continue
        outdir[(f, layout, W, extra[-1] if extra else False)] = d
    record(f"convert: bfshard convert of every fixture ({len(fixtures)}: dcp W=2,3; hf; mxfp4 W=8, openai layout; "
           f"0-d input W=3,8, hf)",
           not conv_fail, "; ".join(conv_fail) or f"{len(conv)} outputs in {time.time() - t0:.1f} s")

    # ---- upstream reference -------------------------------------------------------------
    t0 = time.time()
    ref = {}
    tref = {}  # under transformers 5's state_dict names (the default dcp output's names)
    buffers = {}  # the model's buffers: whole on rank 0
    for f in list(inputs):
        r = expected_reference(args.fixtures, f) if f in woqfix else upstream_reference(inputs[f])
        ref[f] = r
        save_reference(r, os.path.join(refs, f + ".safetensors"))
        tref[f], srcmap, buffers[f] = to_target(r, inputs[f]) if f not in ckpt_names else (r, {}, set())
        save_reference(tref[f], os.path.join(refs, f + ".tn.safetensors"))
        if srcmap:
            packed = [k for k, v in srcmap.items() if len(v) > 1]
            info(f"{f}: transformers' names: {len(tref[f])} tensors from {len(r)}, {len(packed)} packed "
                 f"(e.g. {packed[0] if packed else '-'} from {len(srcmap[packed[0]]) if packed else 0})")
    ref_oa = None
    if "mxfp4-tiny" in fixtures:
        ref_oa = upstream_reference(inputs["mxfp4-tiny"], layout="openai")
        save_reference(ref_oa, os.path.join(refs, "mxfp4-tiny-openai.safetensors"))
    info(f"upstream reference computed in {time.time() - t0:.1f} s")
    # sanity: live upstream vs the committed expected files (same pinned versions)
    from safetensors import safe_open
    drift = []
    for f in fixtures:
        e = os.path.join(args.fixtures, "expected", f + (".hf" if f.startswith("mxfp4") else "") + ".safetensors")
        if os.path.exists(e):
            with safe_open(e, framework="pt") as fh:
                for k in fh.keys():
                    if k not in ref[f] or not torch.equal(int_view(fh.get_tensor(k)), int_view(ref[f][k][0])):
                        drift.append(f"{f}:{k}")
    info("live upstream == fixtures/expected: " + ("yes, every tensor" if not drift else f"NO for {drift[:5]} (other versions?)"))
    # the target names: bfshard's table (src/plan/names.c) == transformers' mapping, row for row;
    # and the target reference == from_pretrained's state_dict of the per-expert fixtures
    # (fixtures/expected/<f>.model.safetensors, written by fixtures/gen_moe_fixtures.py)
    p = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(args.fixtures)), "dev", "names_table.py"),
                        "check"], capture_output=True, text=True)
    record("0 names: the target-name table (src/plan/names.c) equals transformers' get_checkpoint_conversion_mapping "
           "for every model type it lists", p.returncode == 0, (p.stdout + p.stderr).strip()[-600:])
    for f in fixtures:
        e = os.path.join(args.fixtures, "expected", f + ".model.safetensors")
        if not os.path.exists(e):
            continue
        with safe_open(e, framework="pt") as fh:  # dtypes too: float32-kept modules are F32 in both
            diff = [k for k in fh.keys() if k not in tref[f] or fh.get_tensor(k).dtype != tref[f][k][0].dtype or
                    not torch.equal(int_view(fh.get_tensor(k)), int_view(tref[f][k][0]))]
            extra = sorted(set(tref[f]) - set(fh.keys()))
        record(f"0 names: {f}: the reference under transformers' names == from_pretrained's state_dict", not diff and not extra,
               f"differ {diff[:4]}, not in the model {extra[:4]}")
    if qfix:
        record(f"0 upstream: live upstream dequant of the issue-12 fixtures == fixtures/expected ({', '.join(qfix)})",
               not [x for x in drift if x.split(':')[0] in qfix],
               "; ".join(x for x in drift if x.split(':')[0] in qfix)[:600])

    # ---- 1. safetensors ---------------------------------------------------------------
    for (f, layout, W, oa), d in sorted(outdir.items(), key=lambda x: str(x[0])):
        r = ref_oa if oa == "openai" else tref[f] if (layout == "dcp" or oa == "transformers") else ref[f]
        try:
            if layout == "dcp":
                ok, msg, tol = check_dcp_files(d, W, r, whole=buffers.get(f, ()) if not oa else ())
            else:
                ok, msg, tol = check_hf_files(d, r)
        except Exception as e:  # noqa: BLE001
            ok, msg, tol = False, f"{type(e).__name__}: {e}", {}
        record(f"1 safetensors: {os.path.basename(d)} opens (safe_open, pt) and equals upstream",
               ok, msg if not ok else tol_text(tol))

    # ---- 4. torch consolidation ----------------------------------------------------------
    for (f, layout, W, oa), d in sorted(outdir.items(), key=lambda x: str(x[0])):
        hfk = (f, "hf", 1, "transformers") if (f, "hf", 1, "transformers") in outdir else (f, "hf", 1, False)
        if layout != "dcp" or oa or hfk not in outdir:
            continue
        try:
            ok, msg = check_consolidation(d, outdir[hfk], os.path.join(work, "consolidated", os.path.basename(d)))
        except Exception as e:  # noqa: BLE001
            ok, msg = False, f"{type(e).__name__}: {e}"
        record(f"4 consolidate: torch consolidate_safetensors_files({os.path.basename(d)}) == {os.path.basename(outdir[hfk])}", ok, msg)

    # ---- 3. from_pretrained ------------------------------------------------------------
    for f in fixtures:
        d = outdir.get((f, "hf", 1, False))
        if not d:
            continue
        if f.startswith("dsv4"):  # fixtures/gen_dsv4_fixtures.py: V4's names, toy shapes, not a loadable model
            info(f"3 from_pretrained: {f} skipped (a hand-written DeepSeek-V4-named checkpoint, not a loadable model)")
            continue
        gap = model_gap(inputs[f], tref[f])
        if gap:  # a format fixture under a model's names that lacks some of its modules
            info(f"3 from_pretrained: {f} skipped (not a complete model: {gap})")
            continue
        try:  # per-expert MoE: from_pretrained packs them; compared under the model's names
            ok, msg = check_from_pretrained(f, d, tref[f], work)
        except Exception as e:  # noqa: BLE001
            ok, msg = False, f"{type(e).__name__}: {e} {traceback.format_exc(limit=4)}"
        record(f"3 from_pretrained: {f}.hf loads as plain BF16, same logits as upstream weights", ok, msg)

    # ---- 2 + 5. FSDP2 / DCP --------------------------------------------------------------
    def job(f, W, **kw):
        d = outdir.get((f, "dcp", W, False))
        if d is None:
            return None
        j = {"id": f"{f}.dcp-w{W}", "dir": d, "ref": os.path.join(refs, f + ".tn.safetensors"),
             "model": "plain" if f == "scalar0d" else "transformers", "config_dir": d}
        j.update(kw)
        return j

    # Q5: the same W=8 outputs with torch-style zero-row entries added, to show which form loads
    zr = {}
    for f in ("mxfp4-tiny", "scalar0d"):
        if (f, "dcp", 8, False) in outdir:
            d = os.path.join(outs, f"{f}.dcp-w8-zero-rows")
            n = make_zero_row_variant(outdir[(f, "dcp", 8, False)], d, 8, ref[f])
            info(f"{os.path.basename(d)}: bfshard's W=8 output + {n} zero-row entries (torch writer style)")
            zr[f] = d
            try:
                ok, msg = check_consolidation(d, outdir[(f, "hf", 1, False)], os.path.join(work, "consolidated", os.path.basename(d)))
            except Exception as e:  # noqa: BLE001
                ok, msg = False, f"{type(e).__name__}: {e}"
            record(f"5 zero-rows: torch consolidate_safetensors_files({os.path.basename(d)}) == {f}.hf", ok, msg)

    def zjob(f):
        if f not in zr:
            return None
        return {"id": f"{f}.dcp-w8-zero-rows", "dir": zr[f], "ref": os.path.join(refs, f + ".tn.safetensors"),
                "model": "plain" if f == "scalar0d" else "transformers", "config_dir": zr[f]}

    readme = os.path.join(os.path.dirname(os.path.abspath(args.fixtures)), "README.md")
    try:
        code = readme_block(readme)
    except Exception as e:  # noqa: BLE001
        code = None
        record("2 README: the 'Load the dcp output into an FSDP2 model' block is there", False, str(e))

    def rjob(f, W):
        j = job(f, W, model="readme", code=code)
        if j is None or code is None:
            return None
        j["id"] += " (README recipe: meta init, to_empty)"
        if f.startswith("moe-"):  # transformers loads these quantized originals itself, on the CPU
            j["orig"] = inputs[f]
        return j

    plans = {
        2: [job(f, 2) for f in fixtures if f not in qfix or f in q_dcp] + [rjob("mxfp4-tiny", 2), rjob("bnb-nf4", 2), rjob("awq-gemv", 2)]
           + [job(f, 2, model="plain") for f in q_plain] + [rjob("moe-dsv3-fp8", 2), rjob("moe-dsv4-fp8", 2)],
        3: [job(f, 3) for f in fixtures if f not in qfix or f in q_dcp] + [job(f, 3, model="plain") for f in q_plain]
           + [rjob("mxfp4-tiny", 3), rjob("bnb-fp4-dq", 3), rjob("moe-glm4-fp8", 3), rjob("moe-minimax-m2-fp8", 3),
              rjob("gptq-int4-actorder", 3), rjob("awq-gemm", 3)]
           + [job("scalar0d", 3, scalar_param_probe=True,
                                                torch_writer=os.path.join(work, "torch-written", "scalar0d-w3"))],
        8: [job("mxfp4-tiny", 8, torch_writer=os.path.join(work, "torch-written", "mxfp4-tiny-w8")),
            job("scalar0d", 8, torch_writer=os.path.join(work, "torch-written", "scalar0d-w8")), zjob("mxfp4-tiny"), zjob("scalar0d"), rjob("mxfp4-tiny", 8)]
           + [job(f, 8) for f in moe if f.startswith("moe-")] + [rjob("moe-mixtral-fp8", 8), rjob("moe-dsv4-fp8", 8)],
    }
    for W, jobs in plans.items():
        jobs = [j for j in jobs if j]
        if not jobs:
            continue
        per_rank, err, secs = run_dist(W, jobs, work, args.dist_timeout)
        if err and len(per_rank) == W:
            # every rank wrote its results, the worker's last step before destroy_process_group:
            # the jobs ran to the end, and each result is checked below as usual. What failed is
            # torch's teardown (seen once in CI: gloo's "terminate called without an active
            # exception", SIGABRT, after every check had passed), not a load of bfshard's files.
            record(f"2 fsdp2-dcp: W={W} gloo job", True, f"every rank reported; then torch's teardown failed: {err}")
        elif err or len(per_rank) != W:
            record(f"2 fsdp2-dcp: W={W} gloo job", False, err or f"only ranks {sorted(per_rank)} reported")
        for j in jobs:
            errs, notes, tol, loads = [], [], {}, []
            reads = {}
            for r in range(W):
                res = per_rank.get(r, {}).get(j["id"])
                if res is None:
                    errs.append(f"rank {r}: no result")
                    continue
                errs += res["errors"]
                add_tol(tol, res.get("tol", {}))
                notes += [n for n in res["notes"] if n not in notes]
                loads.append(res.get("load_s", 0))
                reads[r] = (res.get("data_opens"), res.get("plan_files"), res.get("meta_opens"))
            # each rank reads data only from its own file (0-d tensors: from rank 0's)
            own = {r: f"shard-{r + 1:05d}-model-00001-of-00001.safetensors" for r in range(W)}
            foreign = {}
            for r, (opens, plan_files, _) in reads.items():
                if opens is None:
                    continue
                if set(opens) != set(plan_files or {}):
                    errs.append(f"rank {r}: opened {opens} but planned {sorted(plan_files)}")
                for fn in opens:
                    if fn != own[r]:
                        foreign.setdefault(r, {})[fn] = plan_files.get(fn, [])
            ref_j = load_reference(j["ref"])
            zero_d = {k for k, (t, _, _) in ref_j.items() if t.dim() == 0} | set(buffers.get(j["id"].split(".dcp-")[0], ()))
            for r, fm in sorted(foreign.items()):
                for fn, ks in fm.items():
                    if fn == own[0] and set(ks) <= zero_d:
                        notes.append(f"rank {r} also reads {fn} for the 0-d tensors and model buffers {ks}")
                    else:
                        errs.append(f"rank {r} reads {fn} for {ks}")
            what = {"plain": "plain nn.Module", "transformers": "transformers model", "readme": "README block"}[j["model"]]
            label = f"{j['id']} -> {what} fully_shard, dcp.load(HuggingFaceStorageReader)"
            if not errs:
                meta = next(iter(reads.values()))[2]
                notes.append(f"read_metadata opens every file's header ({len(meta)} files) on every rank")
                notes.append(f"dcp.load {max(loads):.2f} s")
            record(f"2 fsdp2-dcp: W={W} {label}: every local shard == upstream slice, own file only",
                   not errs, ("; ".join(e.strip() for e in errs[:4])) if errs else f"{tol_text(tol)}")
            for n in notes:
                info(n)
            if j.get("torch_writer") and os.path.isdir(j["torch_writer"]) and not errs:
                tnotes, tprob = inspect_torch_written(j["torch_writer"], j["dir"], W)
                for n in tnotes:
                    info("torch HuggingFaceStorageWriter(save_distributed=True): " + n)
                record(f"5 torch-writer: {j['id']}: torch's own sharded save of the same model matches bfshard's files "
                       f"(every non-empty entry same offsets and bytes) and loads back", not tprob, "; ".join(tprob[:4]))
                f = j["id"].split(".dcp-")[0]
                if (f, "hf", 1, False) in outdir:
                    try:
                        ok, msg = check_consolidation(j["torch_writer"], outdir[(f, "hf", 1, False)],
                                                      os.path.join(work, "consolidated", "torch-" + j["id"]))
                    except Exception as e:  # noqa: BLE001
                        ok, msg = False, f"{type(e).__name__}: {e}"
                    record(f"5 torch-writer: torch consolidate_safetensors_files(torch's own {j['id']} save) == {f}.hf",
                           ok, msg)
        info(f"W={W}: {secs:.1f} s (spawn of {W} processes included)")

    # ---- 7. side files: a folder laid out like Kimi-K2's repo --------------------------------
    if not only or only & set(SIDE_FIXTURES):
        for f in SIDE_FIXTURES:
            try:
                check_side_files(args, f)
            except Exception as e:  # noqa: BLE001
                record(f"7 side files: {f}: the check ran", False, f"{type(e).__name__}: {e} {traceback.format_exc(limit=4)}")

    # ---- 6. W=1024 ------------------------------------------------------------------------
    if run6:
        run_w1024(args)
    return summary(t_start)


# fixtures for the side files' check (7), not for the dequantization ones: kimi-k2-tiny
# holds moe-dsv3-fp8's weights, checked there
SIDE_FIXTURES = ("kimi-k2-tiny",)


def check_side_files(args, f):
    """The input folder's license, card, remote code and tokenizer reach the output: after a
    dcp and an hf conversion, AutoConfig and AutoTokenizer load from OUTDIR with
    trust_remote_code (the classes config.json's and tokenizer_config.json's auto_map name),
    the tokenizer encodes as it does from the input folder, and every side file is the
    input's, byte for byte."""
    from transformers import AutoConfig, AutoTokenizer
    src = os.path.join(args.fixtures, f)
    side = sorted(n for n in os.listdir(src) if n not in ("config.json", "model.safetensors"))
    ref_tok = AutoTokenizer.from_pretrained(src, trust_remote_code=True)
    text = "hello world[EOS] the ring"
    for layout, extra in (("dcp", ["-w", "2"]), ("hf", ["--layout", "hf"])):
        out = os.path.join(args.work, "out", f"{f}.side.{layout}")
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([args.bfshard, "convert", src, out, "--device", args.device, "--quiet", "--force"] + extra,
                       check=True)
        same = [n for n in side if open(os.path.join(src, n), "rb").read() == open(os.path.join(out, n), "rb").read()]
        record(f"7 side files: {f}.{layout}: {', '.join(side)} byte-identical in OUTDIR (LICENSE among them)",
               same == side and "LICENSE" in side, f"differ or missing: {sorted(set(side) - set(same))}")
        cfg = AutoConfig.from_pretrained(out, trust_remote_code=True)
        ok = type(cfg).__name__ == "DeepseekV3Config" and cfg.model_type == "kimi_k2" and \
            getattr(cfg, "quantization_config", None) is None
        record(f"7 side files: {f}.{layout}: AutoConfig.from_pretrained(OUTDIR, trust_remote_code=True) is the remote "
               f"DeepseekV3Config, without quantization_config", ok, f"{type(cfg).__name__} {cfg.model_type}")
        tok = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
        ids, rids = tok.encode(text), ref_tok.encode(text)
        ok = type(tok).__name__ == "TikTokenTokenizer" and ids == rids and tok.decode(ids) == text
        record(f"7 side files: {f}.{layout}: AutoTokenizer.from_pretrained(OUTDIR, trust_remote_code=True) is the remote "
               f"TikTokenTokenizer and encodes as from the input", ok, f"{type(tok).__name__} {ids} vs {rids}")


def run_w1024(args):
    try:
        check_w1024(args.bfshard, os.path.dirname(os.path.abspath(args.fixtures)), args.work, args.device)
    except Exception as e:  # noqa: BLE001
        record("6 w1024: the W=1024 check ran", False, f"{type(e).__name__}: {e} {traceback.format_exc(limit=4)}")


def summary(t_start):
    nfail = sum(1 for _, ok, _ in RESULTS if not ok)
    say(f"interop: {len(RESULTS) - nfail} passed, {nfail} failed, {time.time() - t_start:.1f} s")
    for n, ok, d in RESULTS:
        if not ok:
            say(f"  FAILED: {n}: {d}")
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
