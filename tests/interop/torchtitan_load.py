#!/usr/bin/env python3
"""torchtitan's own loader reads bfshard's --names torchtitan output (make interop).

Run by tests/interop/run.sh in the interop venv (torchtitan 0.3.0, tests/interop/requirements-torchtitan.txt),
on the CPU, offline. For every fixture whose model torchtitan has a state_dict adapter for, and a
BF16 Qwen3-MoE of E = 6 made here (no fixture has E divisible by 3), at W = 2, 3, 8: convert it with `bfshard convert --names torchtitan -w W`, then launch W gloo ranks
with torchrun. Each rank builds the torchtitan model of the fixture's config.json (a tiny
flavor: the model family's own layer builders with the fixture's sizes) on the meta device,
shards it with the family's parallelize function (FSDP2 over the W ranks, as torchtitan's
trainer does with data_parallel_shard_degree = W), and runs CheckpointManager.load() with
checkpoint.initial_load_path = OUTDIR and initial_load_in_hf = true: the real HF path
(state_dict_adapter.to_hf, DCP load with HuggingFaceStorageReader, from_hf). Then:
  - values: the loaded model, mapped back to the Hub's names by the same adapter, equals the
    upstream dequant of the fixture (interop.upstream_reference) bit for bit;
  - reads: each rank's DCP read requests are counted per file (the storage reader wrapped):
    a per-expert tensor is read only from the rank's own file when W <= E; every other read
    from another rank's file is listed (torchtitan's own q/k/v merge asks every rank for
    the whole q/k/v: see docs/LOADING.md).
torchtitan 0.3.0 refuses W <= E where W does not divide E (models/utils.py:164, "cannot be
evenly divided"); that case is checked to fail with that message, and bfshard's placement
for it is the FSDP2 torch.chunk one (docs/NAMES.md).

usage: torchtitan_load.py --bfshard B --fixtures DIR --work DIR [--only a,b] [--ws 2,3,8]
       (the workers: torchrun ... torchtitan_load.py --worker JOBS.json)
"""
import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
import types

HERE = os.path.dirname(os.path.abspath(__file__))
EXPERT_RE = re.compile(r"\.experts\.(\d+)\.")

# fixture -> the torchtitan model family that loads it (its adapter); the fixtures whose model
# torchtitan has an adapter for and whose checkpoint names that adapter asks for
CASES = {
    "fp8-block": "llama3",        # dense Llama, FP8 block
    "ct-fp8-block": "llama3",     # dense Llama, compressed-tensors FP8 block
    "ct-moe-mixed": "qwen3",      # Qwen3-MoE, per-expert, compressed-tensors INT4 + FP8
    "moe-dsv3-fp8": "deepseek_v3",  # DeepSeek-V3, FP8 block
    "qwen3-moe-e6": "qwen3",      # made here (MADE): Qwen3-MoE, BF16, E = 6
}
WS = (2, 3, 8)
# made here: no fixture has E divisible by 3, the one W <= E that torchtitan 0.3.0 loads at W = 3
MADE = {"qwen3-moe-e6": ("ct-moe-mixed", 6)}


def make_e6(fixtures, work, name):
    """A BF16 Qwen3-MoE checkpoint of fixture src's sizes with E experts (seeded random values,
    per-expert names as the Hub's): the W = 3 <= E case torchtitan loads (E = 6)"""
    import torch
    from safetensors.torch import save_file
    sys.path.insert(0, HERE)
    from interop import upstream_reference
    src, E = MADE[name]
    ref = upstream_reference(os.path.join(fixtures, src))
    g = torch.Generator().manual_seed(6)
    out = {}
    for k, (t, _, _) in ref.items():
        m = EXPERT_RE.search(k)
        if m and m.group(1) != "0":
            continue
        if m:  # expert 0's shape for experts 0 .. E-1
            for e in range(E):
                out[k.replace(".experts.0.", f".experts.{e}.")] = torch.randn(t.shape, generator=g).to(torch.bfloat16)
        elif k.endswith(".mlp.gate.weight"):  # the router: one row per expert
            out[k] = torch.randn((E, t.shape[1]), generator=g).to(torch.bfloat16)
        else:
            out[k] = torch.randn(t.shape, generator=g).to(torch.bfloat16)
    d = os.path.join(work, name)
    os.makedirs(d)
    save_file(out, os.path.join(d, "model.safetensors"))
    with open(os.path.join(fixtures, src, "config.json")) as fh:
        cfg = json.load(fh)
    cfg.pop("quantization_config", None)
    cfg["num_experts"] = cfg["num_local_experts"] = E
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    return d


# ---------------------------------------------------------------------------------------
# the model: a tiny torchtitan flavor of the fixture's config.json


def model_spec(family, cfg):
    """(model config, parallelize_fn, adapter class) of torchtitan's family for config.json cfg"""
    from torchtitan.models.common import Embedding, Linear
    from torchtitan.models.common.nn_modules import RMSNorm
    from torchtitan.models.common.rope import ComplexRoPE, CosSinRoPE
    V, H, L = cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]
    tie = bool(cfg.get("tie_word_embeddings", False))
    theta = float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta") or 10000.0)
    if family == "qwen3":
        from torchtitan.models import qwen3 as m
        hd = cfg.get("head_dim") or H // cfg["num_attention_heads"]
        kw = dict(fuse_qkv=True, n_layers=L, dim=H, n_heads=cfg["num_attention_heads"],
                  n_kv_heads=cfg["num_key_value_heads"], head_dim=hd, attn_backend="flex",
                  rope=CosSinRoPE.Config(dim=hd, max_seq_len=256, theta=theta))
        E = cfg.get("num_experts") or cfg.get("num_local_experts")
        if E:
            layers = m._build_qwen3_moe_layers(moe_hidden_dim=cfg["moe_intermediate_size"], num_experts=E,
                                               top_k=cfg["num_experts_per_tok"], moe_comm_backend="standard", **kw)
        else:
            layers = m._build_qwen3_layers(hidden_dim=cfg["intermediate_size"], **kw)
        mc = m.Qwen3Model.Config(vocab_size=V, dim=H, norm=m._qwen3_norm(H), enable_weight_tying=tie,
                                 tok_embeddings=Embedding.Config(num_embeddings=V, embedding_dim=H),
                                 lm_head=Linear.Config(in_features=H, out_features=V), layers=layers)
        return mc, m.parallelize_qwen3, m.Qwen3StateDictAdapter
    if family == "llama3":
        from torchtitan.models import llama3 as m
        nh = cfg["num_attention_heads"]
        layers = m._build_llama3_layers(fuse_qkv=True, n_layers=L, dim=H, n_heads=nh,
                                        n_kv_heads=cfg["num_key_value_heads"], hidden_dim=cfg["intermediate_size"],
                                        rope=ComplexRoPE.Config(dim=H // nh, max_seq_len=256, theta=theta),
                                        attn_backend="flex")
        mc = m.Llama3Model.Config(dim=H, vocab_size=V, tok_embeddings=Embedding.Config(num_embeddings=V, embedding_dim=H),
                                  norm=RMSNorm.Config(normalized_shape=H), lm_head=Linear.Config(in_features=H, out_features=V),
                                  layers=layers)
        return mc, m.parallelize_llama, m.Llama3StateDictAdapter
    if family == "deepseek_v3":
        from torchtitan.models import deepseek_v3 as m
        layers = m._build_dsv3_layers(
            n_layers=L, n_dense_layers=cfg.get("first_k_dense_replace", 0), dim=H,
            n_heads=cfg["num_attention_heads"], q_lora_rank=cfg.get("q_lora_rank") or 0,
            kv_lora_rank=cfg["kv_lora_rank"], qk_nope_head_dim=cfg["qk_nope_head_dim"],
            qk_rope_head_dim=cfg["qk_rope_head_dim"], v_head_dim=cfg["v_head_dim"], mscale=1.0,
            dense_hidden_dim=cfg["intermediate_size"], moe_hidden_dim=cfg["moe_intermediate_size"],
            num_experts=cfg["n_routed_experts"], num_shared_experts=cfg.get("n_shared_experts") or 0,
            router_top_k=cfg["num_experts_per_tok"], router_score_func="sigmoid",
            router_num_expert_groups=cfg.get("n_group"), router_num_limited_groups=cfg.get("topk_group"),
            attn_backend="flex", moe_comm_backend="standard", non_blocking_capacity_factor=None,
            rope=ComplexRoPE.Config(dim=cfg["qk_rope_head_dim"], max_seq_len=256, theta=theta))
        mc = m.DeepSeekV3Model.Config(vocab_size=V, dim=H, tok_embeddings=Embedding.Config(num_embeddings=V, embedding_dim=H),
                                      norm=RMSNorm.Config(normalized_shape=H), lm_head=Linear.Config(in_features=H, out_features=V),
                                      layers=layers)
        return mc, m.parallelize_deepseekv3, m.DeepSeekV3StateDictAdapter
    raise ValueError(family)


def counting_reader(path, log):
    """torch's HuggingFaceStorageReader, each read request recorded: (file, fqn, elements)"""
    import math
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    class CountingReader(HuggingFaceStorageReader):
        def read_data(self, plan, planner):
            for it in plan.items:
                f = os.path.basename(self.storage_data[it.storage_index].relative_path)
                log.append((f, it.storage_index.fqn, math.prod(it.lengths)))
            return super().read_data(plan, planner)

    return CountingReader(path)


def worker(jobs_path):
    import logging
    import warnings
    import torch
    import torch.distributed as dist
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    import torchtitan.distributed.parallel_dims as tt_pd
    from torchtitan.distributed.parallel_dims import ParallelDims
    # torchtitan 0.3.0 takes "cuda" when torch finds no accelerator (tools/utils.py:54) and
    # builds its meshes on it: on this CPU-only check its meshes are CPU (gloo) ones
    tt_pd.device_type = "cpu"
    from torch.distributed.tensor import DTensor

    sys.path.insert(0, HERE)
    from interop import compare, load_reference

    with open(jobs_path) as fh:
        jobs = json.load(fh)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    W, rank = dist.get_world_size(), dist.get_rank()
    par = ParallelismConfig(data_parallel_shard_degree=W)
    pd = ParallelDims.from_config(par, W)  # one per process: its meshes are cached and must be the params' own
    out = {}
    for job in jobs:
        res = out.setdefault(job["id"], {"errors": [], "reads": [], "checked": 0, "keys": [], "ref_keys": []})
        try:
            with open(os.path.join(job["dir"], "config.json")) as fh:
                cfg = json.load(fh)
            mc, parallelize, Adapter = model_spec(job["family"], cfg)
            mc.update_from_config(config=types.SimpleNamespace(parallelism=par))  # as the trainer does
            with torch.device("meta"):
                model = mc.build()
            model = parallelize(model, parallel_dims=pd, training=TrainingConfig(), parallelism=par,
                                compile_config=CompileConfig(), ac_config=None, dump_folder=job["tmp"])
            model.to_empty(device="cpu")
            with torch.no_grad():
                model.init_weights(buffer_device=None)
            adapter = Adapter(mc, None)
            log = []
            adapter.get_hf_storage_reader = lambda path, from_quantized=False: counting_reader(path, log)
            ck = CheckpointManager(
                CheckpointManager.Config(enable=True, folder="ckpt-none", initial_load_path=job["dir"],
                                         initial_load_in_hf=True, initial_load_model_only=True),
                dataloader=None, model_parts=[model], optimizers=None, lr_schedulers=None, states={},
                sd_adapter=adapter, base_folder=job["tmp"])
            ck.load()
            res["reads"] = log
            # values: the model back under the Hub's names (the same adapter), against upstream
            ref = load_reference(job["ref"])
            res["ref_keys"] = sorted(ref)
            hf = adapter.to_hf(model.state_dict())
            for k in sorted(hf):
                v = hf[k]
                v = v.full_tensor() if isinstance(v, DTensor) else v
                if k not in ref:
                    res["errors"].append(f"{k}: not in the upstream reference")
                    continue
                want, kind, code8 = ref[k]
                # torchtitan keeps float32 parameters (bf16 in compute): the checkpoint's values
                # upcast, exactly; back in the checkpoint's dtype they are compared bit for bit
                # (interop.compare: its documented NaN-payload and FP4 -0.0 tolerances only)
                ok, msg, _ = compare(v.detach().to(want.dtype).contiguous(), want, kind, code8)
                if not ok:
                    res["errors"].append(f"{k}: {msg}")
                else:
                    res["checked"] += 1
                    res["keys"].append(k)
        except Exception as e:  # noqa: BLE001
            res["errors"].append(f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-4)}")
        dist.barrier()
    with open(os.path.join(os.path.dirname(jobs_path), f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------
# the driver


def own_file(r):
    return f"shard-{r + 1:05d}-model-00001-of-00001.safetensors"


def judge(case, W, E, per_rank, names):
    """(ok, lines) for one fixture at one W from the ranks' results"""
    lines, ok = [], True
    errs = [e for r in sorted(per_rank) for e in per_rank[r]["errors"]]
    refuse = E and W <= E and E % W
    if refuse:  # torchtitan 0.3.0 itself refuses: models/utils.py:164
        want = "cannot be evenly divided"
        ok = bool(errs) and all(want in e for e in errs)
        lines.append(f"W={W} <= E={E}, W does not divide E: torchtitan itself refuses, as expected" if ok
                     else f"W={W}, E={E}: expected torchtitan's '{want}' refusal, got: {(errs or ['a load'])[0][:300]}")
        return ok, lines
    if errs:
        return False, [f"W={W}: {e[:1500]}" for e in errs[:4]]
    checked = sum(per_rank[r]["checked"] for r in per_rank)
    # every tensor of the checkpoint reached the model on some rank (the local experts of each)
    missed = set(per_rank[0]["ref_keys"]) - {k for r in per_rank for k in per_rank[r]["keys"]}
    if missed:
        ok = False
        lines.append(f"W={W}: {len(missed)} checkpoint tensors in no rank's model, e.g. {sorted(missed)[:3]}")
    foreign_experts, foreign = 0, {}
    for r in sorted(per_rank):
        for f, k, n in per_rank[r]["reads"]:
            if f == own_file(r):
                continue
            if EXPERT_RE.search(k):
                foreign_experts += n
            else:
                base = re.sub(r"layers\.\d+\.", "layers.N.", k)
                foreign[base] = foreign.get(base, 0) + n
    if E and W <= E and foreign_experts:
        ok = False
        lines.append(f"W={W} (--names {names}): {foreign_experts} expert elements read from other ranks' files")
    lines.append(f"W={W} (--names {names}): {checked} tensors x ranks equal upstream; expert elements from other "
                 f"ranks' files: {foreign_experts}" + (" (W > E: every expert's rows on every rank, torchtitan's Shard(1))"
                                                       if E and W > E and foreign_experts else "")
                 + (f"; other tensors read from other ranks' files: {', '.join(sorted(foreign))} ({sum(foreign.values())} elements)"
                    if foreign else ""))
    return ok, lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bfshard", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--ws", default=",".join(map(str, WS)))
    a = ap.parse_args()
    sys.path.insert(0, HERE)
    from interop import save_reference, upstream_reference
    t0 = time.time()
    cases = [c for c in CASES if not a.only or c in a.only.split(",")]
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    experts = {}
    src = {c: make_e6(a.fixtures, a.work, c) if c in MADE else os.path.join(a.fixtures, c) for c in cases}
    for c in cases:
        save_reference(upstream_reference(src[c]), os.path.join(a.work, c + ".ref.safetensors"))
        with open(os.path.join(src[c], "config.json")) as fh:
            cfg = json.load(fh)
        experts[c] = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0
    fails = 0
    for W in [int(x) for x in a.ws.split(",")]:
        wdir = os.path.join(a.work, f"w{W}")
        os.makedirs(wdir)
        jobs = []
        # the contrast: --names checkpoint cuts every expert by rows over all rank files
        variants = [("torchtitan", c) for c in cases] + [("checkpoint", c) for c in cases if experts[c] and W == 2]
        for names, c in variants:
            out = os.path.join(wdir, f"{c}-{names}")
            p = subprocess.run([a.bfshard, "convert", src[c], out, "-w", str(W), "--names", names,
                                "--device", "cpu", "--quiet"], capture_output=True, text=True)
            if p.returncode:
                print(f"torchtitan: {c} W={W}: bfshard convert failed ({p.returncode}): {p.stderr.strip()}")
                fails += 1
                continue
            os.makedirs(os.path.join(wdir, f"tmp-{c}-{names}"))
            jobs.append({"id": f"{c}-{names}", "case": c, "names": names, "family": CASES[c], "dir": out,
                         "ref": os.path.join(a.work, c + ".ref.safetensors"), "tmp": os.path.join(wdir, f"tmp-{c}-{names}")})
        with open(os.path.join(wdir, "jobs.json"), "w") as fh:
            json.dump(jobs, fh)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={W}",
                            os.path.abspath(__file__), "--worker", os.path.join(wdir, "jobs.json")],
                           capture_output=True, text=True, env=env, timeout=600)
        per = {}
        for r in range(W):
            f = os.path.join(wdir, f"rank{r}.json")
            if os.path.exists(f):
                with open(f) as fh:
                    per[r] = json.load(fh)
        if len(per) != W:
            print(f"torchtitan: W={W}: {len(per)} of {W} ranks finished (torchrun exit {p.returncode}):\n{p.stderr[-3000:]}")
            fails += 1
            continue
        for j in jobs:
            ok, lines = judge(j["case"], W, experts[j["case"]], {r: per[r][j["id"]] for r in per}, j["names"])
            word = "PASS" if ok else "FAIL"
            if j["names"] == "checkpoint":  # the contrast: recorded, not judged
                ok, word = True, "NOTE"
            fails += 0 if ok else 1
            for ln in lines:
                print(f"torchtitan: {word} {j['case']} ({j['family']}, E={experts[j['case']]}) {ln}")
    print(f"torchtitan: {len(cases)} fixtures x W={a.ws} in {time.time() - t0:.0f} s: {'PASS' if not fails else f'{fails} FAILED'}")
    return 1 if fails else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
