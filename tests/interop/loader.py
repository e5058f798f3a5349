#!/usr/bin/env python3
"""bfshard.torch against torch's own reader: `make interop`'s second step.

    python tests/interop/loader.py --bfshard build/bfshard --fixtures fixtures --work /tmp/x

The bfshard Python package is taken from this checkout (python/bfshard) with the native
library of BUILD (`make python-native`, run here: BUILD is the folder of --bfshard), staged in
WORK/pypkg, so what is tested is this tree's code, not an installed copy.

  1. rank_state_dict: every rank file of every output, tensor for tensor and bit for bit, equals
     what `safetensors.safe_open` reads (mxfp4-tiny, bnb-nf4, fp8-block, a 0-d checkpoint; W = 2,
     3, 8; a conversion in parts not merged; tests/data's version 1 manifests), and a .zst and a
     .bfz copy (`bfshard compress --rm`) give the same; `import bfshard` works with
     torch unimportable, and `import bfshard.torch` then says it needs torch.
  2. In W gloo processes (W = 2, 3, 8; HSDP: 4 processes on a 2 x 2 mesh): the transformers model
     (the plain module of the names for the 0-d checkpoint) is built on meta from OUT/config.json,
     fully_shard per layer and root, to_empty; `bfshard.torch.load` gives the same local shards,
     bit for bit, as `dcp.load(model.state_dict(), storage_reader=HuggingFaceStorageReader(OUT))`,
     reading only its own rank file (and rank 0's for 0-d tensors).
  3. The errors, each one line naming what is wrong, raised before any tensor is written (the
     model keeps its sentinel): a wrong W, a replicated placement, a tensor in the model and not
     in the checkpoint, a rank file without one of its tensors, a tensor in the checkpoint and
     not in the model (strict; strict=False loads), a truncated rank file; verify=True (the file
     hashed as it is read) passes on a good output at every W, with parts, .zst and .bfz copies
     and 0-d tensors, names the header of a rewritten rank file (before anything is written), and
     after the read a flipped byte in a tensor, in the header's padding, in a tensor the model does
     not take (strict=False) and in a .zst's decompressed bytes: a VerifyError naming the file,
     both hashes and what the slice index narrows it to; a rank file truncated after
     the checks, as the reads begin, is one line naming it and the offset where it ends; a .zst
     cut short (before any write) and one with a corrupt frame (found as it is read), one line
     naming the file (and the frame's offsets).
     The comparisons also check that the bytes came through the pread path (LoadResult.bytes_read),
     and for the .zst / .bfz-only outputs that they came through the seekable reader with nothing
     decompressed whole and nothing written to TMPDIR.
Prints PASS/FAIL lines; exits 1 when any check fails.
"""
import argparse
import datetime
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = ["mxfp4-tiny", "bnb-nf4", "fp8-block", "moe-glm4-fp8", "moe-dsv4-fp8"]  # packed experts, buffers on rank 0
WORLDS = [2, 3, 8]
SENTINEL_DCP, SENTINEL_BFS = -1234.5, 777.0

results = []


def record(name, ok, msg=""):
    results.append((name, ok))
    print(("PASS " if ok else "FAIL ") + name + ("" if ok or not msg else ": " + msg.replace("\n", "\n     ")),
          flush=True)


def info(msg):
    print("     " + msg, flush=True)


# ---- the package under test --------------------------------------------------------------------

def stage_package(build, work):
    """WORK/pypkg/bfshard: python/bfshard/*.py of this checkout + BUILD/python's native files."""
    log = os.path.join(work, "python-native.log")
    with open(log, "w") as fh:
        r = subprocess.run(["make", "-C", ROOT, "BUILD=" + build, "python-native"], stdout=fh, stderr=fh)
    if r.returncode != 0:
        with open(log) as fh:
            raise RuntimeError("make python-native failed (%s): %s" % (log, fh.read()[-1500:]))
    pkg = os.path.join(work, "pypkg", "bfshard")
    shutil.rmtree(os.path.dirname(pkg), ignore_errors=True)
    os.makedirs(os.path.join(pkg, "bin"))
    src = os.path.join(ROOT, "python", "bfshard")
    for f in os.listdir(src):
        if f.endswith(".py"):
            os.symlink(os.path.join(src, f), os.path.join(pkg, f))
    native = os.path.join(build, "python")
    with open(os.path.join(native, "bundle.txt")) as fh:
        for f in fh.read().split():
            os.symlink(os.path.join(native, f), os.path.join(pkg, f))
    os.symlink(os.path.join(native, "bfshard"), os.path.join(pkg, "bin", "bfshard"))
    return os.path.dirname(pkg)


# ---- inputs and outputs --------------------------------------------------------------------------

def make_scalar_input(path):
    """0-d tensors (F32 and BF16) beside ordinary ones: a plain module's names."""
    import torch
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(1)
    save_file({"w": torch.randn(5, 3, generator=g),
               "sub.b": torch.randn(5, generator=g).to(torch.bfloat16),
               "temperature": torch.tensor(0.7071067690849304),
               "logit_scale": torch.tensor(3.25, dtype=torch.bfloat16)}, path, metadata={"format": "pt"})


def convert(bfshard, src, out, W):
    shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run([bfshard, "convert", src, out, "--world-size", str(W), "--quiet"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("bfshard convert %s --world-size %d: exit %d: %s" % (src, W, r.returncode, r.stderr[-800:]))
    return out


def manifest_tensors(out):
    with open(os.path.join(out, "bfshard.manifest.json")) as fh:
        return {t["name"]: (t["dtype"], t["shape"]) for t in json.load(fh)["tensors"]}


def rank_file(out, r):
    return os.path.join(out, "shard-%05d-model-00001-of-00001.safetensors" % (r + 1))


def drop_entry(path, name):
    """Rewrite a rank file's header without `name` (and its DCP_SHARDING_INFO), padded with spaces
    to the same length, so offsets, data and the file's size stay as they were."""
    with open(path, "r+b") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        hdr = json.loads(fh.read(n))
        del hdr[name]
        info_ = json.loads(hdr["__metadata__"]["DCP_SHARDING_INFO"])
        info_.pop(name, None)
        hdr["__metadata__"]["DCP_SHARDING_INFO"] = json.dumps(info_, separators=(",", ":"))
        new = json.dumps(hdr, separators=(",", ":")).encode()
        assert len(new) <= n
        fh.seek(8)
        fh.write(new + b" " * (n - len(new)))


def flip_byte(path, name=None):
    """Flip one bit of a rank file: in the middle of tensor `name`'s bytes, or (None) of the
    header's last padding byte, a space made a tab (the JSON still parses, the header checks pass)."""
    with open(path, "r+b") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        hdr = json.loads(fh.read(n))
        if name is None:
            at = 8 + n - 1
            fh.seek(at)
            assert fh.read(1) == b" "
            new = b"\t"
        else:
            b, e = hdr[name]["data_offsets"]
            at = 8 + n + (b + e) // 2
            fh.seek(at)
            new = bytes([fh.read(1)[0] ^ 1])
        fh.seek(at)
        fh.write(new)


def bits(t):
    import torch
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)


def same_bits(a, b):
    import torch
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and torch.equal(bits(a), bits(b))


# ---- in the W processes ------------------------------------------------------------------------

def _build(job, mesh):
    import torch
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    if job["model"] == "transformers":
        from transformers import AutoConfig, AutoModelForCausalLM
        cfg = AutoConfig.from_pretrained(job["config_dir"])
        with torch.device("meta"):  # "float32": every tensor a cast (copy_ from the bytes read)
            m = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, job.get("dtype", "bfloat16")))
        layers = list(m.model.layers)
    else:  # a plain module of the checkpoint's names: >= 1-d parameters, 0-d persistent buffers
        m, layers = nn.Module(), []
        with torch.device("meta"):
            for k, (dt, shape) in sorted(job["tensors"].items()):
                *path, leaf = k.split(".")
                sub = m
                for p in path:
                    if not hasattr(sub, p):
                        sub.add_module(p, nn.Module())
                    sub = getattr(sub, p)
                t = torch.empty(shape, dtype={"BF16": torch.bfloat16, "F32": torch.float32}[dt])
                if shape:
                    sub.register_parameter(leaf, nn.Parameter(t))
                else:
                    sub.register_buffer(leaf, t)
    v = job.get("variant")
    if v == "extra":  # a parameter the checkpoint does not have
        m.model.norm.register_parameter("bfs_extra", nn.Parameter(torch.zeros(6, 4, dtype=torch.bfloat16,
                                                                              device="meta")))
    if v == "fewer":  # the checkpoint has a tensor the model does not
        del m.model.norm._parameters["weight"]
    for b in layers:
        fully_shard(b, mesh=mesh)
    fully_shard(m, mesh=mesh)
    m.to_empty(device="cpu")
    if v == "replicated":
        from torch.distributed.tensor import DTensor, Replicate
        w = m.model.norm.weight
        m.model.norm.weight = nn.Parameter(DTensor.from_local(torch.zeros(w.shape, dtype=w.dtype), w.device_mesh,
                                                              [Replicate()] * w.device_mesh.ndim, run_check=False))
    return m


def _locals(m):
    from torch.distributed.tensor import DTensor
    return {k: (v.to_local() if isinstance(v, DTensor) else v) for k, v in m.state_dict().items()}


def _fill(m, x):
    import torch
    with torch.no_grad():
        for v in _locals(m).values():
            if v.is_floating_point():
                v.fill_(x)


def _untouched(m, x):
    return all(bool((v == x).all()) for v in _locals(m).values() if v.is_floating_point() and v.numel())


def _no_spill_begin():
    """TMPDIR pointed at a fresh empty folder, and every way load() could decompress a rank file
    whole (bfshard.torch._RankFile._decompress, tempfile.mkdtemp) recorded instead of run."""
    import tempfile
    import bfshard.torch as bt
    d = tempfile.mkdtemp(prefix="bfshard-nospill-")
    st = {"dir": d, "calls": [], "env": os.environ.get("TMPDIR"), "tempdir": tempfile.tempdir,
          "mkdtemp": tempfile.mkdtemp, "decompress": bt._RankFile.__dict__["_decompress"]}

    def mkdtemp(*a, **k):
        st["calls"].append("tempfile.mkdtemp")
        raise OSError("tempfile.mkdtemp called while loading a .zst-only output")

    def decompress(zpath):
        st["calls"].append("_decompress(%s)" % os.path.basename(zpath))
        raise bt.LoadError("%s: decompressed whole (not allowed here)" % zpath)
    os.environ["TMPDIR"] = d
    tempfile.tempdir = d
    tempfile.mkdtemp = mkdtemp
    bt._RankFile._decompress = staticmethod(decompress)
    return st


def _no_spill_end(st):
    """Undo _no_spill_begin; what was called or left in the TMPDIR folder, or None."""
    import tempfile
    import bfshard.torch as bt
    tempfile.mkdtemp = st["mkdtemp"]
    tempfile.tempdir = st["tempdir"]
    bt._RankFile._decompress = st["decompress"]
    if st["env"] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = st["env"]
    left = os.listdir(st["dir"])
    shutil.rmtree(st["dir"], ignore_errors=True)
    problems = st["calls"] + (["TMPDIR holds %s" % left] if left else [])
    return "; ".join(problems) or None


def _run_job(job, mesh, rank, shard_rank):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    import bfshard
    import bfshard.torch as bt
    res = {"ok": False, "msg": ""}
    if job["kind"] == "compare":
        ma = _build(job, mesh)
        _fill(ma, SENTINEL_DCP)
        t0 = time.time()
        dcp.load(ma.state_dict(), storage_reader=HuggingFaceStorageReader(job["ref_dir"]))
        res["dcp_s"] = time.time() - t0
        mb = _build(job, mesh)
        _fill(mb, SENTINEL_BFS)
        spill = _no_spill_begin() if job.get("zst_only") else None
        read_ranges, hashed_first = bt._read_ranges, []
        def counted(path, ranges, threads, **kw):  # the file hashed with nothing written
            if not ranges and kw.get("size") is not None:
                hashed_first.append(path)
            return read_ranges(path, ranges, threads, **kw)
        bt._read_ranges = counted
        try:
            lr = bt.load(mb, job["dir"], verify=job.get("verify", False),
                         max_host_bytes=job.get("max_host_bytes", 256 << 20))
        finally:
            bt._read_ranges = read_ranges
            spilled = _no_spill_end(spill) if spill else None
        if "hash_first" in job and bool(hashed_first) != job["hash_first"]:
            res["msg"] = "the file was %shashed before the reads" % ("not " if job["hash_first"] else "")
            return res
        if spilled:
            res["msg"] = "a .zst-only output was not read through the seekable reader: " + spilled
            return res
        res["bfs_s"] = lr.seconds
        a, b = _locals(ma), _locals(mb)
        if set(a) != set(b):
            res["msg"] = "state_dict keys differ"
            return res
        bad = [k for k in a if not same_bits(a[k], b[k])]
        if bad:
            res["msg"] = "%d local shards differ from dcp.load's, first %s" % (len(bad), bad[0])
            return res
        # LoadResult.files names the files read: a .zst-only output's compressed copies
        opened = sorted(os.path.basename(f) for f in lr.files)
        ext = ".zst" if job.get("zst_only") and os.path.exists(rank_file(job["dir"], shard_rank) + ".zst") else \
            ".bfz" if job.get("zst_only") else ""
        allowed = {os.path.basename(rank_file(job["dir"], shard_rank)) + ext,
                   os.path.basename(rank_file(job["dir"], 0)) + ext}
        if not set(opened) <= allowed or os.path.basename(rank_file(job["dir"], shard_rank)) + ext not in opened:
            res["msg"] = "opened %s (rank %d)" % (opened, shard_rank)
            return res
        if lr.rank != shard_rank or lr.tensors == 0:
            res["msg"] = "LoadResult %r" % (lr,)
            return res
        # the read path: a model built in bfloat16 on the CPU takes its bytes by pread (bytes_read)
        # but for the casts and 0-d tensors; a .zst-only output the same, decoded from its frames;
        # verify=True the same, hashing as it reads
        if job["model"] == "transformers" and job.get("dtype", "bfloat16") == "bfloat16" and \
                not (0.5 * lr.bytes < lr.bytes_read <= lr.bytes):
            res["msg"] = "bytes_read %d of %d bytes: not the %s path" % (
                lr.bytes_read, lr.bytes, "seekable reader's" if job.get("zst_only") else "pread")
            return res
        res.update(ok=True, msg="%d tensors, %d bytes (%d by %s), files %s" % (
            lr.tensors, lr.bytes, lr.bytes_read, "the seekable reader" if job.get("zst_only") else "pread", opened))
        return res
    # an error case: the expected message for this rank, or a clean load
    want = job["expect"].get(str(shard_rank), job["expect"].get("*"))
    m = _build(job, mesh)
    _fill(m, SENTINEL_BFS)
    read_ranges = bt._read_ranges
    if job.get("truncate_at_read"):
        # the rank file loses its second half after every check passed, as the reads begin
        def cut(path, ranges, threads, **kw):
            if os.path.basename(path) == job["truncate_at_read"]:
                os.truncate(path, sorted(o for o, _, _ in ranges)[len(ranges) // 2] + 1)
            return read_ranges(path, ranges, threads, **kw)
        bt._read_ranges = cut
    try:
        lr = bt.load(m, job["dir"], verify=job.get("verify", False), strict=job.get("strict", True),
                     max_host_bytes=job.get("max_host_bytes", 256 << 20))
    except bfshard.Error as e:
        msg = e.message
        res["msg"] = msg
        if want is None:
            res["msg"] = "unexpected error: " + msg
        elif "\n" in msg or not all(s in msg for s in want["has"]):
            res["msg"] = "message %r lacks %r (or is not one line)" % (msg, want["has"])
        elif want.get("type") and type(e).__name__ != want["type"]:
            res["msg"] = "%s, not %s: %s" % (type(e).__name__, want["type"], msg)
        elif not job.get("truncate_at_read") and not job.get("partial") and not _untouched(m, SENTINEL_BFS):
            res["msg"] = "the model was written before the error: " + msg
        else:
            res["ok"] = True
        return res
    finally:
        bt._read_ranges = read_ranges
    if want is not None:
        res["msg"] = "no error (wanted one with %r)" % (want["has"],)
        return res
    if job.get("unexpected") and job["unexpected"] not in lr.unexpected:
        res["msg"] = "LoadResult.unexpected %r lacks %r" % (lr.unexpected, job["unexpected"])
        return res
    if _untouched(m, SENTINEL_BFS):
        res["msg"] = "loaded nothing"
        return res
    res.update(ok=True, msg="loaded %d tensors" % lr.tensors)
    return res


def _dist_worker(rank, nproc, mesh_shape, port, jobs, resdir):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    import logging
    warnings.filterwarnings("ignore")
    logging.getLogger("torch.distributed").setLevel(logging.ERROR)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(nproc), RANK=str(rank),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc))
    dist.init_process_group("gloo", rank=rank, world_size=nproc, timeout=datetime.timedelta(seconds=180))
    if len(mesh_shape) == 1:
        mesh = init_device_mesh("cpu", tuple(mesh_shape))
        shard_rank = mesh.get_local_rank()
    else:
        mesh = init_device_mesh("cpu", tuple(mesh_shape), mesh_dim_names=("replicate", "shard"))
        shard_rank = mesh.get_local_rank(1)
    out = {}
    for job in jobs:
        try:
            out[job["id"]] = _run_job(job, mesh, rank, shard_rank)
        except Exception as e:  # noqa: BLE001
            out[job["id"]] = {"ok": False, "msg": "%s: %s | %s" % (
                type(e).__name__, str(e)[:600], traceback.format_exc(limit=5).replace("\n", " | ")[-1500:])}
        dist.barrier()
    path = os.path.join(resdir, "rank%d.json" % rank)
    with open(path + ".tmp", "w") as fh:
        json.dump(out, fh)
    os.replace(path + ".tmp", path)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_dist(label, mesh_shape, jobs, work, timeout_s):
    import torch.multiprocessing as mp
    nproc = 1
    for d in mesh_shape:
        nproc *= d
    resdir = os.path.join(work, "dist-" + label)
    shutil.rmtree(resdir, ignore_errors=True)
    os.makedirs(resdir)
    t0 = time.time()
    ctx = mp.start_processes(_dist_worker, args=(nproc, list(mesh_shape), free_port(), jobs, resdir),
                             nprocs=nproc, join=False, start_method="spawn")
    err = None
    try:
        while not ctx.join(timeout=2):
            if time.time() - t0 > timeout_s:
                err = "timed out after %d s" % timeout_s
                break
    except Exception as e:  # noqa: BLE001  (a rank died)
        err = "%s: %s" % (type(e).__name__, str(e)[-1500:])
    if err:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
    per_rank = {}
    for r in range(nproc):
        p = os.path.join(resdir, "rank%d.json" % r)
        if os.path.exists(p):
            with open(p) as fh:
                per_rank[r] = json.load(fh)
    return per_rank, err, time.time() - t0


def report_dist(label, nproc, jobs, per_rank, err, secs):
    if len(per_rank) != nproc:
        record("%s: %d gloo processes" % (label, nproc), False, err or "only ranks %s reported" % sorted(per_rank))
        return
    info("%s: %d processes, %.1f s" % (label, nproc, secs))
    for job in jobs:
        rs = [per_rank[r].get(job["id"], {"ok": False, "msg": "no result"}) for r in range(nproc)]
        bad = [(r, x["msg"]) for r, x in enumerate(rs) if not x["ok"]]
        detail = ""
        if not bad:
            if job["kind"] == "compare":
                detail = "dcp.load %.2f s, bfshard.torch.load %.3f s (slowest rank)" % (
                    max(x.get("dcp_s", 0) for x in rs), max(x.get("bfs_s", 0) for x in rs))
            else:
                msgs = sorted({x["msg"] for x in rs})
                detail = " / ".join(msgs)[:400]
        record("%s %s: %s" % (label, job["id"], job["what"]), not bad,
               "; ".join("rank %d: %s" % b for b in bad[:3]) if bad else "")
        if detail and not bad:
            info(detail)


# ---- in this process ---------------------------------------------------------------------------

def check_rank_state_dicts(outs, refs):
    from safetensors import safe_open
    import bfshard.torch as bt
    for label, (out, W) in sorted(outs.items()):
        bad, n = [], 0
        for r in range(W):
            sd = bt.rank_state_dict(out, r, world_size=W)
            with safe_open(rank_file(refs.get(label, out), r), "pt") as f:
                keys = set(f.keys())
                if keys != set(sd):
                    bad.append("rank %d: names differ" % r)
                    continue
                for k in keys:
                    n += 1
                    if not same_bits(f.get_tensor(k), sd[k]):
                        bad.append("rank %d: %s differs" % (r, k))
            zero_d = [k for k, v in sd.items() if v.dim() == 0]
            if zero_d and r != 0:
                bad.append("rank %d holds 0-d %s" % (r, zero_d[0]))
        record("rank_state_dict(%s, r) == safe_open of rank r's file%s, r < %d (%d tensors)" % (
            label, " (of the uncompressed output)" if label in refs else "", W, n), not bad, "; ".join(bad[:3]))


def check_api_errors(out2, bfshard_bin, work):
    import bfshard
    import bfshard.torch as bt

    def expect(what, fn, *has):
        try:
            fn()
        except bfshard.Error as e:
            ok = all(h in e.message for h in has) and "\n" not in e.message
            record("rank_state_dict: %s -> one-line error" % what, ok, "" if ok else "got %r" % e.message)
            if ok:
                info(e.message)
            return
        record("rank_state_dict: %s -> one-line error" % what, False, "no error")

    expect("world_size=3 on a W=2 output", lambda: bt.rank_state_dict(out2, 0, world_size=3), "world_size=2", "3")
    expect("rank 2 of a W=2 output", lambda: bt.rank_state_dict(out2, 2), "rank 2", "world_size=2")
    trunc = os.path.join(work, "api-truncated")
    shutil.rmtree(trunc, ignore_errors=True)
    shutil.copytree(out2, trunc)
    p = rank_file(trunc, 1)
    os.truncate(p, os.path.getsize(p) - 100)
    expect("a truncated rank file", lambda: bt.rank_state_dict(trunc, 1), "truncated", os.path.basename(p))
    bt.rank_state_dict(trunc, 0)  # rank 0's own file is whole: not its business
    flip = os.path.join(work, "api-flipped")
    shutil.rmtree(flip, ignore_errors=True)
    shutil.copytree(out2, flip)
    p = rank_file(flip, 0)
    with open(p, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([b[0] ^ 1]))
    try:
        bt.rank_state_dict(flip, 0, verify=True)
        record("rank_state_dict(verify=True): a flipped byte -> VerifyError naming the tensor", False, "no error")
    except bfshard.VerifyError as e:
        ok = "BAD tensor" in e.message and "\n" not in e.message
        record("rank_state_dict(verify=True): a flipped byte -> VerifyError naming the tensor", ok, e.message)
        if ok:
            info(e.message)
    bt.rank_state_dict(flip, 1, verify=True)  # rank 1's file is fine
    bt.rank_state_dict(flip, 0)  # without verify: not checked (mmapped, nothing read)


def check_read_split():
    """load()'s split of its copies: pread straight into contiguous CPU shards of the file's dtype;
    copy_ for a cast, a strided or 0-d shard, the second name of a tied weight (its first is read),
    and shards whose memory partly overlaps (all of them, in the model's order)."""
    import torch
    import bfshard.torch as bt

    class F:
        from_zst, zst, data_start, path = None, None, 1000, "rank.safetensors"
        entries = {}
    f = F()
    buf, f32, sq = torch.zeros(100, dtype=torch.bfloat16), torch.zeros(10), torch.zeros(10, 10, dtype=torch.bfloat16)
    cases = [("A", buf[0:10], "BF16"), ("B", buf[0:10], "BF16"), ("C", buf[20:30], "BF16"), ("D", buf[25:35], "BF16"),
             ("E", f32, "BF16"), ("F", sq.t(), "BF16"), ("G", torch.zeros((), dtype=torch.bfloat16), "BF16"),
             ("H", buf[40:50], "BF16")]
    plan = []
    for i, (k, local, dt) in enumerate(cases):
        f.entries[k] = (dt, tuple(local.shape), 64 * i, 64 * i + local.numel() * 2)
        src = torch.zeros(local.shape, dtype=torch.bfloat16)
        plan.append((k, local, src, f))
    fast, dev, slow = bt._direct(plan)
    want_fast = [(1000, 20, buf[0:10].data_ptr()), (1000 + 64 * 7, 20, buf[40:50].data_ptr())]
    got_fast = fast[0][1] if len(fast) == 1 else None
    ok = got_fast == want_fast and not dev and [p[0] for p in slow] == ["B", "C", "D", "E", "F", "G"]
    record("load()'s split: pread for contiguous CPU shards of the file's dtype, copy_ for the rest", ok,
           "fast %r, slow %r" % (got_fast, [p[0] for p in slow]))


def check_device_glue(work):
    """load()'s path into CUDA shards (bfshard.torch._to_device) with torch.cuda replaced by a
    stand-in that copies at once (streams, events) and CPU tensors in place of the device's: the
    ring's buffers (pinned: here plain) filled by bfs_read_ranges land in every shard, bit for bit,
    for budgets below, at and above a shard's size, and the same filled by bfs_read_ranges_zst from
    a .zst copy of those bytes; a file cut short, or a copy failing, is one line naming the file."""
    import contextlib
    import torch
    import bfshard.torch as bt

    class Ev:
        def record(self, stream=None):
            pass

        def query(self):
            return True

        def synchronize(self):
            pass

    class Stream:
        def __init__(self, device=None):
            pass

        def wait_stream(self, other):
            pass

    path = os.path.join(work, "device-glue.bin")
    data = torch.randint(0, 256, (3 << 20,), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    with open(path, "wb") as f:
        f.write(data.numpy().tobytes())
    # the same bytes as the one tensor of a safetensors file, compressed (.zst, 64 KiB frames)
    import ctypes
    import bfshard
    hdr = json.dumps({"x": {"dtype": "U8", "shape": [data.numel()], "data_offsets": [0, data.numel()]}}).encode()
    st_path, zpath = path + ".safetensors", path + ".safetensors.zst"
    with open(st_path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + data.numpy().tobytes())
    lib = bfshard._c
    lib.bfs_compress_file.restype, lib.bfs_compress_file.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p,
                                                                                  ctypes.c_int, ctypes.c_int]
    if os.path.exists(zpath):  # a work folder used before
        os.unlink(zpath)
    if lib.bfs_compress_file(os.fsencode(st_path), os.fsencode(zpath), 1, 2) != 0:
        record("load()'s path into CUDA shards: compress %s" % st_path, False, lib.bfs_last_error().decode())
        return
    ds = 8 + len(hdr)
    shapes = [(1000, 513), (7,), (300, 17), (2048, 64), (1, 1)]
    saved = (torch.cuda.current_stream, torch.cuda.Stream, torch.cuda.Event, torch.cuda.stream, torch.empty)
    real_empty = torch.empty
    torch.cuda.current_stream = lambda device=None: Stream()
    torch.cuda.Stream, torch.cuda.Event = Stream, Ev
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.empty = lambda *a, pin_memory=False, **k: real_empty(*a, **k)
    ok, why = True, ""
    try:
        for budget in (4096, 100000, 1 << 20, 64 << 20):
            items, off = [], 17
            for sh in shapes:
                t = torch.zeros(sh, dtype=torch.bfloat16)
                n = t.numel() * 2
                items.append((off, n, t))
                off += n + (0 if len(items) % 2 else 64)
            moved = bt._to_device(path, items, 2, budget)
            bad = [o for o, n, t in items if not torch.equal(t.view(-1).view(torch.uint8), data[o:o + n])]
            if moved != sum(n for _, n, _ in items) or bad:
                ok, why = False, "budget %d: moved %d, wrong bytes at offsets %s" % (budget, moved, bad)
                break
            for t in [t for _, _, t in items]:
                t.zero_()
            moved = bt._to_device(zpath, [(o + ds, n, t) for o, n, t in items], 2, budget, zst=True)
            bad = [o for o, n, t in items if not torch.equal(t.view(-1).view(torch.uint8), data[o:o + n])]
            if moved != sum(n for _, n, _ in items) or bad:
                ok, why = False, ".zst, budget %d: moved %d, wrong bytes at offsets %s" % (budget, moved, bad)
                break
        if ok:
            with open(path, "r+b") as f:
                f.truncate(1 << 20)
            try:
                bt._to_device(path, items, 2, 100000)
                ok, why = False, "no error for a file cut short"
            except bt.LoadError as e:
                ok = path in e.message and "the file ends at offset 1048576" in e.message and "\n" not in e.message
                why = e.message
        if ok:  # a failing copy (a CUDA error): one line naming the file
            def bad_record(self, stream=None):
                raise RuntimeError("CUDA error: an illegal memory access was encountered\nCompile with ...")
            Ev.record = bad_record
            try:
                bt._to_device(path, items[:1], 2, 100000)
                ok, why = False, "no error for a failed copy"
            except bt.LoadError as e:
                ok = path in e.message and "illegal memory access" in e.message and "\n" not in e.message
                why = e.message
    finally:
        (torch.cuda.current_stream, torch.cuda.Stream, torch.cuda.Event, torch.cuda.stream, torch.empty) = saved
    record("load()'s path into CUDA shards, its torch glue on a stand-in device: every byte through the pinned ring",
           ok, why)


def check_no_torch(pypath):
    code = ("import sys; sys.modules['torch'] = None\n"
            "import bfshard\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
            "try:\n import bfshard.torch\nexcept ImportError as e:\n print('ImportError:', e)\n"
            "else:\n raise SystemExit('bfshard.torch imported without torch')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=pypath))
    ok = r.returncode == 0 and "needs PyTorch" in r.stdout
    record("import bfshard without torch works; import bfshard.torch says it needs torch", ok,
           (r.stdout + r.stderr)[-600:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bfshard", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--only", default="", help="comma-separated fixtures (default: %s)" % ",".join(FIXTURES))
    ap.add_argument("--worlds", default=",".join(map(str, WORLDS)))
    ap.add_argument("--dist-timeout", type=int, default=480)
    args = ap.parse_args()
    t_start = time.time()
    bfshard_bin = os.path.abspath(args.bfshard)
    build = os.path.dirname(bfshard_bin)
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    fixtures = [f for f in args.only.split(",") if f] or FIXTURES
    worlds = [int(w) for w in args.worlds.split(",") if w]
    warnings.filterwarnings("ignore")

    try:
        pypath = stage_package(build, work)
    except Exception as e:  # noqa: BLE001
        record("the bfshard package of this checkout (make python-native)", False, str(e))
        return 1
    sys.path.insert(0, pypath)
    os.environ["PYTHONPATH"] = pypath + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    import bfshard.torch  # noqa: F401
    info("bfshard %s from %s" % (bfshard.__version__, os.path.dirname(bfshard.__file__)))

    # ---- convert
    outs, t0 = {}, time.time()
    scalar_in = os.path.join(work, "scalar0d-input")
    os.makedirs(scalar_in, exist_ok=True)
    make_scalar_input(os.path.join(scalar_in, "model.safetensors"))
    inputs = {f: os.path.join(os.path.abspath(args.fixtures), f) for f in fixtures}
    inputs["scalar0d"] = scalar_in
    for f, src in inputs.items():
        for W in worlds:
            try:
                outs["%s.w%d" % (f, W)] = (convert(bfshard_bin, src, os.path.join(work, "%s.w%d" % (f, W)), W), W)
            except Exception as e:  # noqa: BLE001
                record("convert %s W=%d" % (f, W), False, str(e))
    info("converted %d outputs in %.1f s" % (len(outs), time.time() - t0))
    base = fixtures[0]
    out2 = outs.get("%s.w2" % base, (None,))[0]
    zst, bfz, zst_ref = None, None, {}

    def compressed(tag, *opts, f=base):
        src = outs.get("%s.w2" % f, (None,))[0]
        if src is None:
            return None
        d = os.path.join(work, "%s.w2-%s" % (f, tag))
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        r = subprocess.run([bfshard_bin, "compress", d, "--rm"] + list(opts), capture_output=True, text=True)
        if r.returncode != 0 or any(n.endswith(".safetensors") for n in os.listdir(d)):
            record("bfshard compress --rm %s %s" % (" ".join(opts), d), False, r.stderr[-500:])
            return None
        outs["%s.w2-%s" % (f, tag)] = (d, 2)
        zst_ref["%s.w2-%s" % (f, tag)] = src
        return d
    if out2:
        zst = compressed("zst")
        # byte-grouped, and frames small enough that tensors span several
        bfz = compressed("bfz", "--bytegroup", "--frame-size", "65536")
    zst0d = compressed("zst", f="scalar0d")  # 0-d tensors: copy_ from a temporary read through the reader

    # a conversion in parts, not merged (part manifests only), and version 1 manifests (tests/data)
    parts = None
    if out2:
        parts = os.path.join(work, "%s.w2-parts" % base)
        shutil.rmtree(parts, ignore_errors=True)
        for rr in ("0", "1"):
            r = subprocess.run([bfshard_bin, "convert", inputs[base], parts, "--world-size", "2", "--ranks", rr,
                                "--quiet"], capture_output=True, text=True)
            if r.returncode != 0:
                record("bfshard convert --ranks %s" % rr, False, r.stderr[-500:])
                parts = None
                break
        if parts:
            outs["%s.w2-parts" % base] = (parts, 2)
    for v1 in ("whole", "parts"):
        d = os.path.join(ROOT, "tests", "data", "manifest-v1", v1)
        if os.path.isdir(d):
            outs["manifest-v1/" + v1] = (d, 2)

    # ---- 1. in this process
    check_no_torch(pypath)
    check_read_split()
    check_device_glue(work)
    check_rank_state_dicts(outs, zst_ref)
    if out2:
        check_api_errors(out2, bfshard_bin, work)

    # ---- 2 + 3. in W processes
    def cmp_job(f, W, **kw):
        if "%s.w%d" % (f, W) not in outs:
            return None
        d = outs["%s.w%d" % (f, W)][0]
        j = {"id": "%s.w%d" % (f, W), "kind": "compare", "dir": d, "ref_dir": d, "config_dir": d,
             "what": "bfshard.torch.load == dcp.load, bit for bit, own file only",
             "model": "plain" if f == "scalar0d" else "transformers"}
        if f == "scalar0d":
            j["tensors"] = manifest_tensors(d)
        j.update(kw)
        return j

    plans = []
    for W in worlds:
        jobs = [cmp_job(f, W) for f in list(fixtures) + ["scalar0d"]]
        jobs.append(cmp_job(base, W, id="%s.w%d verify" % (base, W), verify=True,
                            what="verify=True: own file hashed as it is read, == dcp.load"))
        if W == worlds[0]:
            jobs.append(cmp_job("scalar0d", W, id="scalar0d.w%d verify" % W, verify=True,
                                what="verify=True: own file, and rank 0's 0-d slices through its slice index"))
            # a model built in float32: every tensor a cast, copied from the bytes read and hashed
            # (one temporary), or, past max_host_bytes, the file hashed first and then read
            jobs.append(cmp_job(base, W, id="%s.w%d verify f32" % (base, W), verify=True, dtype="float32",
                                hash_first=False, what="verify=True into a float32 model: casts from the bytes hashed, == dcp.load"))
            jobs.append(cmp_job(base, W, id="%s.w%d verify f32 4K" % (base, W), verify=True, dtype="float32",
                                max_host_bytes=4096, hash_first=True,
                                what="verify=True into a float32 model, max_host_bytes 4 KiB: hashed first (nothing "
                                     "written), then read, == dcp.load"))
        plans.append(("W=%d" % W, (W,), [j for j in jobs if j]))
    # error cases (and the .zst copy) in a W=2 and a W=3 run
    if out2:
        d2 = out2
        cfg = {"model": "transformers", "config_dir": d2, "kind": "error"}
        trunc = os.path.join(work, "%s.w2-truncated" % base)
        shutil.rmtree(trunc, ignore_errors=True)
        shutil.copytree(d2, trunc)
        os.truncate(rank_file(trunc, 1), os.path.getsize(rank_file(trunc, 1)) - 64)
        trunc_read = os.path.join(work, "%s.w2-truncated-at-read" % base)
        shutil.rmtree(trunc_read, ignore_errors=True)
        shutil.copytree(d2, trunc_read)
        dropped = os.path.join(work, "%s.w2-dropped" % base)
        shutil.rmtree(dropped, ignore_errors=True)
        shutil.copytree(d2, dropped)
        drop_entry(rank_file(dropped, 0), "model.norm.weight")
        ej = [
            dict(cfg, id="replicated", dir=d2, variant="replicated", what="a replicated parameter -> one-line error",
                 expect={"*": {"has": ["model.norm.weight", "Replicate"]}}),
            dict(cfg, id="extra-param", dir=d2, variant="extra", what="a parameter not in the checkpoint -> one-line error",
                 expect={"*": {"has": ["model.norm.bfs_extra", "not in the checkpoint"]}}),
            dict(cfg, id="dropped-entry", dir=dropped, what="rank 0's file without model.norm.weight -> rank 0: one-line error",
                 expect={"0": {"has": ["model.norm.weight", "rank 0", "no entry"]}}),
            dict(cfg, id="dropped-entry verify", dir=dropped, verify=True,
                 what="verify=True on the rewritten rank file -> rank 0: VerifyError naming its header",
                 expect={"0": {"has": ["BAD header"], "type": "VerifyError"}}),
            dict(cfg, id="fewer-params strict", dir=d2, variant="fewer",
                 what="a checkpoint tensor not in the model (strict) -> one-line error",
                 expect={"*": {"has": ["model.norm.weight", "not in the model"]}}),
            dict(cfg, id="fewer-params strict=False", dir=d2, variant="fewer", strict=False, expect={},
                 unexpected="model.norm.weight", what="the same with strict=False -> loads, LoadResult.unexpected"),
            dict(cfg, id="truncated", dir=trunc, what="rank 1's file truncated -> rank 1: one-line error",
                 expect={"1": {"has": ["truncated", os.path.basename(rank_file(trunc, 1))]}}),
            dict(cfg, id="truncated at read", dir=trunc_read, truncate_at_read=os.path.basename(rank_file(trunc_read, 1)),
                 what="rank 1's file truncated after the checks, as the reads begin -> rank 1: one-line error",
                 expect={"1": {"has": ["truncated", "the file ends at offset",
                                       os.path.basename(rank_file(trunc_read, 1))]}}),
        ]
        # verify=True on damaged copies: the damage found as the file is read, the model holding
        # the bytes read (partial); the header's damage found before anything is written
        vbad = {}
        for tag, files_names in (("tensor", [(1, "model.embed_tokens.weight")]), ("header", [(1, None)]),
                                 ("untaken", [(0, "model.norm.weight"), (1, "model.norm.weight")]), ("cut", [])):
            vbad[tag] = os.path.join(work, "%s.w2-verify-%s" % (base, tag))
            shutil.rmtree(vbad[tag], ignore_errors=True)
            shutil.copytree(d2, vbad[tag])
            for r, name in files_names:
                flip_byte(rank_file(vbad[tag], r), name)
        ej += [
            dict(cfg, id="verify: a flipped byte in a tensor", dir=vbad["tensor"], verify=True, partial=True,
                 what="verify=True, a bit of rank 1's model.embed_tokens.weight flipped -> rank 1: VerifyError "
                      "naming the file, both hashes, the tensor; the model holds the bytes read",
                 expect={"1": {"has": [os.path.basename(rank_file(vbad["tensor"], 1)), "XXH3-128", "manifest says",
                                       'BAD tensor "model.embed_tokens.weight"', "unverified"],
                               "type": "VerifyError"}}),
            dict(cfg, id="verify f32 4K: a flipped byte in a tensor", dir=vbad["tensor"], verify=True, dtype="float32",
                 max_host_bytes=4096,
                 what="verify=True into a float32 model, max_host_bytes 4 KiB (hashed first), a bit of rank 1's "
                      "model.embed_tokens.weight flipped -> rank 1: VerifyError, nothing loaded, the model untouched",
                 expect={"1": {"has": [os.path.basename(rank_file(vbad["tensor"], 1)), "XXH3-128",
                                       'BAD tensor "model.embed_tokens.weight"', "nothing was loaded"],
                               "type": "VerifyError"}}),
            dict(cfg, id="verify: a changed byte in the header", dir=vbad["header"], verify=True, partial=True,
                 what="verify=True, a padding byte of rank 1's header changed (still valid JSON) -> rank 1: "
                      "VerifyError naming its header",
                 expect={"1": {"has": [os.path.basename(rank_file(vbad["header"], 1)), "BAD header"],
                               "type": "VerifyError"}}),
            dict(cfg, id="verify strict=False: a flipped byte in a tensor the model does not take",
                 dir=vbad["untaken"], variant="fewer", strict=False, verify=True, partial=True,
                 what="verify=True, strict=False, a bit of model.norm.weight (not in the model) flipped -> "
                      "VerifyError naming it",
                 expect={"*": {"has": ['BAD tensor "model.norm.weight"', "XXH3-128"], "type": "VerifyError"}}),
            dict(cfg, id="verify: truncated", dir=trunc, verify=True,
                 what="verify=True, rank 1's file truncated -> rank 1: one-line LoadError",
                 expect={"1": {"has": ["truncated", os.path.basename(rank_file(trunc, 1))], "type": "LoadError"}}),
            dict(cfg, id="verify: truncated at read", dir=vbad["cut"], verify=True,
                 truncate_at_read=os.path.basename(rank_file(vbad["cut"], 1)),
                 what="verify=True, rank 1's file truncated after the checks, as the reads begin -> rank 1: "
                      "one-line LoadError",
                 expect={"1": {"has": ["truncated", os.path.basename(rank_file(vbad["cut"], 1))],
                               "type": "LoadError"}}),
        ]
        if parts:
            ej.append(dict(cmp_job(base, 2), id="%s.w2 parts" % base, dir=parts,
                           what="a conversion in 2 parts, not merged == dcp.load of the whole run"))
            ej.append(dict(cmp_job(base, 2), id="%s.w2 parts verify" % base, dir=parts, verify=True,
                           what="the same with verify=True (each part's manifest hashes its own ranks)"))
        if zst:
            # rank 1's compressed copy cut short (no seek table: refused before any write), and
            # one with a byte of its largest frame flipped (the checks pass; the read refuses it)
            zcut, zflip = os.path.join(work, "%s.w2-zst-cut" % base), os.path.join(work, "%s.w2-zst-flip" % base)
            for d in (zcut, zflip):
                shutil.rmtree(d, ignore_errors=True)
                shutil.copytree(zst, d)
            z1 = rank_file(zcut, 1) + ".zst"
            os.truncate(z1, os.path.getsize(z1) // 2)
            z1 = rank_file(zflip, 1) + ".zst"
            with open(z1, "r+b") as fh:
                fh.seek(os.path.getsize(z1) // 2)
                b = fh.read(1)
                fh.seek(-1, 1)
                fh.write(bytes([b[0] ^ 0xFF]))
            ej.append(dict(cfg, id=".zst cut short", dir=zcut, zst_only=True,
                           what="rank 1's .zst truncated -> rank 1: one-line error naming it, nothing written",
                           expect={"1": {"has": ["truncated", os.path.basename(z1)]}}))
            ej.append(dict(cfg, id=".zst corrupt frame", dir=zflip, zst_only=True, partial=True,
                           what="a byte of rank 1's .zst flipped -> rank 1: one-line error naming it and the frame",
                           expect={"1": {"has": ["frame", "compressed", "uncompressed offset", os.path.basename(z1)]}}))
            ej.append(dict(cmp_job(base, 2), id="%s.w2 .zst only" % base, dir=zst, zst_only=True,
                           what=".zst copies only (compress --rm), read through the seekable reader, "
                                "nothing in TMPDIR == dcp.load of the rank files"))
            if zst0d:
                ej.append(dict(cmp_job("scalar0d", 2), id="scalar0d.w2 .zst only", dir=zst0d, zst_only=True,
                               what=".zst copies only, 0-d tensors from rank 0's .zst == dcp.load"))
            ej.append(dict(cmp_job(base, 2), id="%s.w2 .zst only verify" % base, dir=zst, zst_only=True, verify=True,
                           what=".zst copies only, verify=True (hashed as read through the seekable reader, nothing in TMPDIR) == dcp.load"))
            if zst0d:
                ej.append(dict(cmp_job("scalar0d", 2), id="scalar0d.w2 .zst only verify", dir=zst0d, zst_only=True,
                               verify=True, what=".zst copies only, verify=True, 0-d tensors from rank 0's .zst == dcp.load"))
            # rank 1's .zst replaced by a sound compressed copy of a rank file with a flipped bit
            zbad = os.path.join(work, "%s.w2-zst-verify-tensor" % base)
            shutil.rmtree(zbad, ignore_errors=True)
            shutil.copytree(zst, zbad)
            plain = os.path.join(work, "flipped.safetensors")
            shutil.copyfile(rank_file(d2, 1), plain)
            flip_byte(plain, "model.embed_tokens.weight")
            r = subprocess.run([bfshard_bin, "compress", plain, "-o", rank_file(zbad, 1) + ".zst", "--force", "--quiet"],
                               capture_output=True, text=True)
            os.remove(plain)
            if r.returncode != 0:
                record("bfshard compress of a flipped rank file", False, r.stderr[-500:])
            else:
                ej.append(dict(cfg, id=".zst verify: a flipped byte in a tensor", dir=zbad, zst_only=True, verify=True,
                               partial=True,
                               what="verify=True, .zst only, a bit of rank 1's decompressed model.embed_tokens.weight "
                                    "flipped -> rank 1: VerifyError naming the .zst and the tensor",
                               expect={"1": {"has": [os.path.basename(rank_file(zbad, 1)) + ".zst", "XXH3-128",
                                                     'BAD tensor "model.embed_tokens.weight"', "unverified"],
                                             "type": "VerifyError"}}))
        if bfz:
            ej.append(dict(cmp_job(base, 2), id="%s.w2 .bfz only" % base, dir=bfz, zst_only=True,
                           what=".bfz copies only (--bytegroup, 64 KiB frames), the same"))
            ej.append(dict(cmp_job(base, 2), id="%s.w2 .bfz only verify" % base, dir=bfz, zst_only=True, verify=True,
                           what=".bfz copies only, verify=True, the same"))
        wrong_w = dict(cfg, id="wrong W", dir=d2, what="a W=2 output into a W=3 mesh -> one-line error",
                       expect={"*": {"has": ["world_size=2", "3 ranks"]}})
        # in the same processes as the comparisons (a gloo start is ~5-10 s)
        for label, shape, jobs in plans:
            if shape == (2,):
                jobs.extend(ej)
            elif shape == (3,):
                jobs.append(wrong_w)
        if 2 not in worlds:
            plans.append(("W=2", (2,), ej))
        if 3 not in worlds:
            plans.append(("W=3", (3,), [wrong_w]))
        # HSDP: 4 processes, mesh (replicate 2, shard 2), the W=2 output
        plans.append(("HSDP 2x2", (2, 2), [dict(cmp_job(base, 2), id="%s.w2 HSDP" % base,
                                                what="HSDP (Replicate, Shard(0)) == dcp.load, bit for bit")]))
    for label, shape, jobs in plans:
        if not jobs:
            continue
        per_rank, err, secs = run_dist(label.replace(" ", "-").replace("=", ""), shape, jobs, work, args.dist_timeout)
        nproc = 1
        for d in shape:
            nproc *= d
        report_dist(label, nproc, jobs, per_rank, err, secs)

    failed = [n for n, ok in results if not ok]
    print("loader: %d checks, %d failed, %.1f s" % (len(results), len(failed), time.time() - t_start), flush=True)
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
