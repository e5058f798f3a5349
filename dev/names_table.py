#!/usr/bin/env python3
"""The target-name table (src/plan/names.c) against transformers' own conversion mapping.

Run with the interop venv's python (transformers 5.23, tests/interop/requirements.txt):

  python dev/names_table.py check     every model type of the table: its renames and packs
                                      equal get_checkpoint_conversion_mapping(type), pattern
                                      for pattern, in order (exit 1 naming the first that differs)
  python dev/names_table.py fp32      the float32 table (src/plan/fp32.c): for every model type it
                                      lists, of the names table, gpt_oss and the dense fixtures', its
                                      patterns and file:line equal the class's
                                      _keep_in_fp32_modules_strict (check runs it too)
  python dev/names_table.py torchtitan  the torchtitan rule (src/plan/names.c bfs__tt_rows, --names
                                      torchtitan): per row, the per-expert keys equal its adapter's
                                      from_hf_map ones, in order, at the file:line given; the FSDP
                                      and split lines say what the rule reads there; each refused
                                      model type (bfs__tt_refused) still loses expert parameters
                                      in its adapter's to_hf (check runs it too, when torchtitan
                                      is installed)
  python dev/names_table.py vectors   tests/data/names-vectors.json: for every model type of
                                      the table, each test key and the name transformers'
                                      rename_source_key gives it (test_names.c checks the C
                                      engine against them)

The keys are every tensor name of fixtures/*/ plus keys made to hit each rule's edges
(name boundaries, anchors, expert numbers, keys no rule takes).
"""
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES_C = os.path.join(ROOT, "src", "plan", "names.c")
OUT = os.path.join(ROOT, "tests", "data", "names-vectors.json")


def c_string(lit):
    """A C string literal's value (the escapes names.c uses: \\\\ and \\")."""
    return re.sub(r'\\(.)', r'\1', lit)


def read_table():
    """{model_type: [(op, sources, target, ops)]} from names.c, in its order."""
    src = open(NAMES_C).read()
    lists = {}
    for m in re.finditer(r'static const bfs_nrule (bfs__nr_\w+)\[\] = \{(.*?)\n\};', src, re.S):
        rows = []
        for r in re.finditer(r'BFS_(REN|PACK1|PACK2)\(((?:\s*"(?:[^"\\]|\\.)*"\s*,?)+)\)', m.group(2)):
            args = [c_string(a) for a in re.findall(r'"((?:[^"\\]|\\.)*)"', r.group(2))]
            if r.group(1) == "REN":
                rows.append(("rename", tuple(args[:1]), args[1], ()))
            elif r.group(1) == "PACK1":
                rows.append(("pack", tuple(args[:1]), args[1], ("MergeModulelist(dim=0)",)))
            else:
                rows.append(("pack", tuple(args[:2]), args[2], ("MergeModulelist(dim=0)", "Concatenate(dim=1)")))
        lists[m.group(1)] = rows
    types = {}
    for m in re.finditer(r'static const char \*const (bfs__t_\w+)\[\] = \{(.*?)\};', src, re.S):
        types[m.group(1)] = re.findall(r'"([^"]+)"', m.group(2))
    table = {}
    for m in re.finditer(r'\{"(\w+)", (bfs__t_\w+), \{(bfs__nr_\w+), (NULL|bfs__nr_\w+)\}', src):
        rows = list(lists[m.group(3)]) + (list(lists[m.group(4)]) if m.group(4) != "NULL" else [])
        for t in types[m.group(2)]:
            table[t] = rows
    return table


def upstream(model_type):
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming
    rows = []
    for x in get_checkpoint_conversion_mapping(model_type) or []:
        if type(x) is WeightRenaming:
            rows.append(("rename", tuple(x._original_source_patterns), x._original_target_patterns[0], ()))
        elif type(x) is WeightConverter:
            ops = tuple(f"{type(o).__name__}(dim={o.dim})" for o in x.operations)
            rows.append(("pack", tuple(x._original_source_patterns), x._original_target_patterns[0], ops))
        else:
            rows.append((type(x).__name__, tuple(x._original_source_patterns), "", ()))
    return rows


FP32_C = os.path.join(ROOT, "src", "plan", "fp32.c")


def read_fp32():
    """{model_type: (patterns, "Class (file:line ...)")} from fp32.c's table"""
    src = open(FP32_C).read()
    pats = {m.group(1): re.findall(r'"([^"]+)"', m.group(2))
            for m in re.finditer(r'static const char \*const (bfs__p_\w+)\[\] = \{(.*?)\};', src, re.S)}
    out = {}
    for m in re.finditer(r'\{BFS_T\(((?:"\w+",?\s*)+)\), "([^"]+)", (bfs__p_\w+)\}', src):
        for t in re.findall(r'"(\w+)"', m.group(1)):
            out[t] = (pats[m.group(3)], m.group(2))
    return out


def upstream_fp32(model_type):
    """(patterns, class name, "file:line") of the class transformers builds for model_type; the
    DeepSeek-V3 class for kimi_k2 (its checkpoints are DeepseekV3ForCausalLM; transformers has no
    kimi_k2 class); None when transformers has no causal-LM class for it"""
    import importlib
    import inspect
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as M
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES as B
    mt = "deepseek_v3" if model_type == "kimi_k2" else model_type
    cn = M.get(mt) or B.get(mt)
    if cn is None:
        return None
    cls = getattr(importlib.import_module(f"transformers.models.{mt}.modeling_{mt}"), cn if isinstance(cn, str) else cn[0])
    for c in cls.__mro__:
        if "_keep_in_fp32_modules_strict" in c.__dict__:
            v = c.__dict__["_keep_in_fp32_modules_strict"]
            if c.__module__.startswith("transformers.modeling_utils"):
                return [], c.__name__, ""
            lines, l0 = inspect.getsourcelines(c)
            ln = next(l0 + i for i, x in enumerate(lines) if "_keep_in_fp32_modules_strict" in x)
            f = inspect.getsourcefile(c).split("transformers/", 1)[1]
            return list(v or []), c.__name__, f"{f}:{ln}"
    return [], cls.__name__, ""


def check_fp32():
    table = read_fp32()
    names = read_table()
    dense = set()
    for c in glob.glob(os.path.join(ROOT, "fixtures", "*", "config.json")):
        mt = json.load(open(c)).get("model_type")
        if mt:
            dense.add(mt)
    bad = 0
    types = sorted(set(table) | set(names) | dense | {"gpt_oss"})
    for t in types:
        up = upstream_fp32(t)
        mine = table.get(t)
        if up is None:
            if mine:
                bad += 1
                print(f"fp32 table: {t}: a row, but transformers has no class for it")
            continue
        pats, cls, where = up
        if not pats and not mine:
            continue
        if not mine or mine[0] != pats or f"{cls} ({where}" not in mine[1]:
            bad += 1
            print(f"fp32 table: {t}: {mine} != transformers' {cls} ({where}): {pats}")
    print(f"fp32 table: {len(types)} model types checked ({len(table)} rows), "
          f"{'all equal to' if not bad else f'{bad} differ from'} transformers' _keep_in_fp32_modules_strict")
    return 1 if bad else 0


def read_torchtitan():
    """[(model types, adapter "file:line", per-expert keys, shard "file:line", split "file:line")]
    from names.c's torchtitan rows"""
    src = open(NAMES_C).read()
    defs = dict(re.findall(r'#define (BFS_TT_\w+) "([^"]+)"', src))
    types = {m.group(1): re.findall(r'"([^"]+)"', m.group(2))
             for m in re.finditer(r'static const char \*const (bfs__tt_\w+)\[\] = \{(.*?)\};', src, re.S)}
    rows = []
    for m in re.finditer(r'\{(bfs__tt_\w+), "([^"]+)",\s*\{(.*?)NULL\},\s*(BFS_TT_\w+), (BFS_TT_\w+)\}', src, re.S):
        rows.append((types[m.group(1)], m.group(2), re.findall(r'"([^"]+)"', m.group(3)), defs[m.group(4)], defs[m.group(5)]))
    return rows


# what the rule reads at each line it cites (torchtitan 0.3.0)
TT_LINES = {"shard": "if efsdp_ep_size > num_experts:", "split": "block_size = dim_size // shard_degree"}
# the torchtitan model family whose adapter a model type's checkpoints load with
TT_FAMILY = {"qwen3_moe": "qwen3", "deepseek_v3": "deepseek_v3", "kimi_k2": "deepseek_v3"}
TT_FLAVOR = {"qwen3": "debugmodel_moe", "deepseek_v3": "debugmodel"}  # a flavor with experts, to build the adapter


def check_torchtitan():
    try:
        import torchtitan
    except ImportError:
        print("torchtitan rule: torchtitan not installed (tests/interop/requirements-torchtitan.txt): not checked")
        return 0
    import importlib
    import inspect
    base = os.path.dirname(os.path.dirname(os.path.abspath(torchtitan.__file__)))
    rows, bad = read_torchtitan(), 0

    def line_of(where):
        f, n = where.rsplit(":", 1)
        with open(os.path.join(base, f)) as fh:
            return fh.read().splitlines()[int(n) - 1]

    for types, adapter, keys, shard, split in rows:
        for what, where in (("shard", shard), ("split", split)):
            if TT_LINES[what] not in line_of(where):
                bad += 1
                print(f"torchtitan rule: {where}: {line_of(where).strip()!r}, not {TT_LINES[what]!r}")
        for t in types:
            fam = TT_FAMILY.get(t)
            mod = importlib.import_module(f"torchtitan.models.{fam}.state_dict_adapter")
            cls = next(c for n, c in vars(mod).items() if n.endswith("StateDictAdapter") and c.__module__ == mod.__name__)
            cfg = importlib.import_module(f"torchtitan.models.{fam}").model_registry(TT_FLAVOR[fam]).model
            theirs = [k for k in cls(cfg, None).from_hf_map if ".experts.{}." in k]
            src = inspect.getsourcefile(cls)
            f = os.path.relpath(src, base)
            with open(src) as fh:
                n = next(i + 1 for i, ln in enumerate(fh) if theirs and f'"{theirs[0]}"' in ln)
            if theirs != keys or adapter != f"{f}:{n}":
                bad += 1
                print(f"torchtitan rule: {t}: {adapter} {keys} != torchtitan {torchtitan.__version__}'s {f}:{n} {theirs}")
    # the refused model types: the cited lines still say what names.c says, and the adapter's
    # to_hf of the model's own state_dict still leaves out expert parameters (else the refusal
    # is out of date)
    src = open(NAMES_C).read()
    refused = re.findall(r'\{"(\w+)", "(torchtitan/[^"]+)", "(torchtitan/[^"]+)"\}', src)
    for t, adapter, model in refused:
        if "inner_experts.mlp1_weight\"" not in line_of(adapter) or "mlp1_weight_EGD" not in line_of(model):
            bad += 1
            print(f"torchtitan rule: refused {t}: {adapter} or {model} no longer reads as names.c says")
            continue
        import torch
        fam = importlib.import_module(f"torchtitan.models.{t}")
        spec = fam.model_registry("debugmodel")
        with torch.device("meta"):
            sd = spec.model.build().state_dict()
        kept = spec.state_dict_adapter(spec.model, None).to_hf(sd)
        lost = sorted({re.sub(r"\d+", "N", k, count=1) for k in sd if "experts" in k} -
                      {re.sub(r"\d+", "N", k, count=1) for k in spec.state_dict_adapter(spec.model, None).from_hf(kept)})
        if not lost:
            bad += 1
            print(f"torchtitan rule: refused {t}: torchtitan {torchtitan.__version__}'s adapter now maps every expert "
                  f"parameter: the refusal in names.c is out of date")
        else:
            print(f"torchtitan rule: refused {t}: its to_hf leaves out {', '.join(lost)} (as names.c says)")
    print(f"torchtitan rule: {len(rows)} rows ({sum(len(r[0]) for r in rows)} model types), {len(refused)} refused, "
          f"{'all equal to' if not bad else f'{bad} differ from'} torchtitan {torchtitan.__version__}'s adapters and FSDP")
    return 1 if bad else 0


def check():
    return check_names() | check_fp32() | check_torchtitan()


def check_names():
    table = read_table()
    bad = 0
    for t, rows in sorted(table.items()):
        up = upstream(t)
        # transformers applies every rename, then one converter: the table's order within each kind is
        # what matters, and upstream's list may interleave them
        mine = [r for r in rows if r[0] == "rename"], [r for r in rows if r[0] == "pack"]
        theirs = [r for r in up if r[0] == "rename"], [r for r in up if r[0] != "rename"]
        if mine != theirs:
            bad += 1
            print(f"names table: {t}: differs from transformers' mapping\n  table:    {rows}\n  upstream: {up}")
    print(f"names table: {len(table)} model types, {len(table) - bad} equal to transformers' mapping")
    return 1 if bad else 0


EDGE_KEYS = [
    "model.layers.0.mlp.experts.0.gate_proj.weight", "model.layers.0.mlp.experts.17.up_proj.weight",
    "model.layers.10.mlp.experts.255.down_proj.weight", "model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv",
    "model.layers.0.mlp.shared_experts.gate_proj.weight", "model.layers.0.mlp.shared_expert.up_proj.weight",
    "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.gate.weight", "model.layers.3.mlp.gate.bias",
    "model.layers.1.block_sparse_moe.experts.3.w1.weight", "model.layers.1.block_sparse_moe.experts.3.w3.weight",
    "model.layers.1.block_sparse_moe.experts.12.w2.weight", "model.layers.1.block_sparse_moe.gate.weight",
    "model.layers.1.block_sparse_moe.e_score_correction_bias", "model.layers.1.mlp.e_score_correction_bias",
    "model.layers.1.mlp.moe_statics.e_score_correction_bias", "model.layers.1.xblock_sparse_moex.gate.weight",
    "layers.0.ffn.experts.5.w1.weight", "layers.0.ffn.experts.5.w3.weight", "layers.0.ffn.experts.5.w2.weight",
    "layers.0.ffn.shared_experts.w1.weight", "layers.2.attn.compressor.ape", "layers.2.attn.compressor.apex",
    "layers.2.attn.indexer.compressor.wkv.weight", "layers.2.attn.indexer.weights_proj.weight",
    "layers.2.attn.indexer.wq_b.weight", "layers.2.attn.wq_b.weight", "layers.2.attn.norm.weight",
    "layers.2.ffn.gate.bias", "layers.2.ffn.gate.bias_extra", "layers.2.hc_attn_fn", "layers.2.hc_attn_fnx",
    "embed.weight", "xembed.weight", "head.weight", "lm_head.weight", "hc_head_fn", "norm.weight",
    "mtp.0.attn.wq_a.weight", "layers.1.attn.attn_sink", "layers.1.attn.q_norm.weight",
    "model.layers.0.mlp.experts.x.gate_proj.weight", "a.experts.1.b.experts.2.w1.weight",
]


def vectors():
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    keys = set(EDGE_KEYS)
    from safetensors import safe_open
    for f in glob.glob(os.path.join(ROOT, "fixtures", "*", "*.safetensors")):
        with safe_open(f, "pt") as h:
            keys.update(h.keys())
    keys = sorted(keys)
    groups = {}
    for t in sorted(read_table()):
        conv = get_checkpoint_conversion_mapping(t)
        ren = [x for x in conv if isinstance(x, WeightRenaming)]
        cvt = [x for x in conv if isinstance(x, WeightConverter)]
        changed = {}
        for k in keys:
            nk, _ = rename_source_key(k, ren, cvt)
            if nk != k:
                changed[k] = nk
        groups.setdefault(json.dumps(changed, sort_keys=True), []).append(t)
    out = [{"types": ts, "changed": json.loads(c)} for c, ts in sorted(groups.items(), key=lambda x: x[1])]
    import transformers
    doc = {"generator": "dev/names_table.py vectors", "transformers": transformers.__version__,
           "note": "rename_source_key(key, renamings, converters) per model type, without the base-model "
                   "prefix step (a model's meta state_dict decides it; names.c's roots do for deepseek_v4); "
                   "a key not in a group's changed map keeps its name",
           "keys": keys, "groups": out}
    with open(OUT, "w") as fh:
        json.dump(doc, fh, indent=0, sort_keys=True)
        fh.write("\n")
    print(f"{OUT}: {len(out)} groups of model types x {len(keys)} keys")
    return 0


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "check"
    sys.exit(check() if mode == "check" else check_fp32() if mode == "fp32" else check_torchtitan() if mode == "torchtitan"
             else vectors() if mode == "vectors" else 2)
