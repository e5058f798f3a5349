#!/usr/bin/env python3
"""Loading one rank of a bfshard dcp output: bfshard.torch against torch's reader.

    python bench/loader_bench.py OUTDIR RANK [--cold] [--verify] [--timeout 900] [--json FILE] [--build build]

Each figure comes from a fresh subprocess (time, and peak RSS: VmHWM of /proc/self/status, above
what the process held once torch and bfshard were imported and, for load, the model's local
tensors were allocated and zeroed):

  rank_state_dict   bfshard.torch.rank_state_dict(OUTDIR, RANK): header parsed, tensors mapped
                    (nothing read); then every tensor copied into fresh memory (`copy`)
  load              bfshard.torch.load(state_dict, OUTDIR) into W-rank DTensors (Shard(0)) of the
                    manifest's shapes, in one process through torch's fake process group (rank
                    RANK of W; no other process needed): all of load's checks and copies; with
                    --verify, then again with verify=True (the rank file hashed as it is read)
  read_metadata     torch.distributed.checkpoint.HuggingFaceStorageReader(OUTDIR).read_metadata(),
                    what dcp.load runs on the coordinator before any rank reads a byte (parses all W
                    rank files' headers); killed after --timeout seconds, and reported as such

--cold drops the page cache of OUTDIR's files (posix_fadvise DONTNEED) before each one.
Inputs: bench/gen_synth.py dsv3-names (DeepSeek-V3's tensor count, tiny matrices), converted with
`bfshard convert IN OUTDIR --world-size W`. The bfshard package is this checkout's python/bfshard
with BUILD/python's library (`make python-native`) unless `import bfshard` works already.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def hwm_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def stage(build, root=ROOT):
    """A bfshard package dir for sys.path: root's python/bfshard (this checkout's by default) +
    BUILD/python."""
    native = os.path.join(build, "python")
    # always through make: a library built before the sources changed would be used stale
    subprocess.run(["make", "-C", root, "BUILD=" + build, "python-native"], check=True,
                   stdout=subprocess.DEVNULL)
    top = tempfile.mkdtemp(prefix="bfshard-bench-pkg-")
    pkg = os.path.join(top, "bfshard")
    os.makedirs(os.path.join(pkg, "bin"))
    src = os.path.join(root, "python", "bfshard")
    for f in os.listdir(src):
        if f.endswith(".py"):
            os.symlink(os.path.join(src, f), os.path.join(pkg, f))
    with open(os.path.join(native, "bundle.txt")) as fh:
        for f in fh.read().split():
            os.symlink(os.path.join(native, f), os.path.join(pkg, f))
    return top


# ---- a rank's model -------------------------------------------------------------------------------

def build_model(man, rank, device, mesh, fill):
    """{name: tensor} of the manifest's shapes and dtypes on `device`, every byte `fill`: plain
    tensors for W=1, DTensors (Shard(0), torch.chunk's rows of `rank`) over `mesh` otherwise."""
    import torch
    import bfshard.torch as bt
    W = man["options"]["world_size"]
    sd = {}
    for t in man["tensors"]:
        shape, dt = t["shape"], bt._DTYPES[t["dtype"]]
        whole = mesh is None or not shape or t.get("placement", "").startswith("whole on rank 0")
        c = -(-shape[0] // W) if shape else 0
        local_shape = shape if whole else [max(0, min(c, shape[0] - rank * c))] + shape[1:]
        local = torch.empty(local_shape, dtype=dt, device=device)
        local.reshape(-1).view(torch.uint8).fill_(fill)
        if whole:
            sd[t["name"]] = local
            continue
        from torch.distributed.tensor import DTensor, Shard
        stride = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            stride[i] = stride[i + 1] * shape[i + 1]
        sd[t["name"]] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape),
                                           stride=tuple(stride))
    return sd


# ---- children ------------------------------------------------------------------------------------

def child_rsd(outdir, rank):
    import torch
    import bfshard.torch as bt
    base = hwm_mb()
    t0 = time.perf_counter()
    sd = bt.rank_state_dict(outdir, rank)
    t1 = time.perf_counter()
    peak_map = hwm_mb()
    nbytes = sum(v.numel() * v.element_size() for v in sd.values())
    copies = {k: v.clone() for k, v in sd.items()}
    t2 = time.perf_counter()
    return {"tensors": len(sd), "bytes": nbytes, "rsd_s": t1 - t0, "copy_s": t2 - t1, "base_mb": base,
            "rsd_peak_mb": peak_map - base, "copy_peak_mb": hwm_mb() - base, "copies": len(copies),
            "torch": torch.__version__}


def child_load(outdir, rank, verify=False):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.distributed.device_mesh import init_device_mesh
    import bfshard.torch as bt
    with open(os.path.join(outdir, "bfshard.manifest.json")) as f:
        man = json.load(f)
    W = man["options"]["world_size"]
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=W)
    mesh = init_device_mesh("cpu", (W,))
    sd = build_model(man, rank, "cpu", mesh, 0)
    del man
    base = hwm_mb()
    c0, t0 = time.process_time(), time.perf_counter()
    r = bt.load(sd, outdir, verify=verify)
    t1, c1 = time.perf_counter(), time.process_time()
    return {"tensors": r.tensors, "bytes": r.bytes, "load_s": t1 - t0, "cpu_s": c1 - c0, "base_mb": base,
            "load_peak_mb": hwm_mb() - base, "files": [os.path.basename(f) for f in r.files]}


def child_torch(outdir, rank):
    import torch
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    base = hwm_mb()
    t0 = time.perf_counter()
    md = HuggingFaceStorageReader(outdir).read_metadata()
    t1 = time.perf_counter()
    chunks = sum(len(v.chunks) for v in md.state_dict_metadata.values() if hasattr(v, "chunks"))
    return {"read_metadata_s": t1 - t0, "base_mb": base, "read_metadata_peak_mb": hwm_mb() - base,
            "tensors": len(md.state_dict_metadata), "chunks": chunks, "torch": torch.__version__}


CHILDREN = {"rsd": child_rsd, "load": child_load, "load-verify": lambda o, r: child_load(o, r, verify=True),
            "torch": child_torch}


# ---- parent --------------------------------------------------------------------------------------

def drop_cache(outdir):
    for f in os.listdir(outdir):
        p = os.path.join(outdir, f)
        if os.path.isfile(p):
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def run_child(kind, outdir, rank, timeout, pypath, cold):
    if cold:
        drop_cache(outdir)
    env = dict(os.environ)
    if pypath:
        env["PYTHONPATH"] = pypath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.time()
    try:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind, outdir, str(rank)],
                           capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"timeout_s": timeout, "error": "killed after %d s (--timeout)" % timeout}
    if r.returncode != 0:
        return {"error": "exit %d: %s" % (r.returncode, r.stderr.strip()[-800:]), "wall_s": time.time() - t0}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["wall_s"] = time.time() - t0
    return out


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, outdir, rank = sys.argv[2], sys.argv[3], int(sys.argv[4])
        import warnings
        warnings.filterwarnings("ignore")
        print(json.dumps(CHILDREN[kind](outdir, rank)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("rank", type=int)
    ap.add_argument("--timeout", type=int, default=900, help="seconds for torch's read_metadata (default 900)")
    ap.add_argument("--cold", action="store_true", help="drop OUTDIR's page cache before each measurement")
    ap.add_argument("--skip-torch", action="store_true", help="no read_metadata")
    ap.add_argument("--verify", action="store_true", help="load once more with verify=True")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()
    outdir = os.path.abspath(a.outdir)
    pypath = None
    try:
        import bfshard  # noqa: F401
        import bfshard.torch  # noqa: F401
    except ImportError:
        pypath = stage(os.path.abspath(a.build))
    with open(os.path.join(outdir, "bfshard.manifest.json"), "rb") as f:
        head = f.read(1 << 16)
    W = int(re.search(rb'"world_size":\s*(\d+)', head).group(1))
    res = {"outdir": outdir, "world_size": W, "rank": a.rank, "cold": a.cold}
    print("%s: W=%d, rank %d%s" % (outdir, W, a.rank, ", page cache dropped before each" if a.cold else ""), flush=True)
    r = run_child("rsd", outdir, a.rank, a.timeout, pypath, a.cold)
    res["rank_state_dict"] = r
    if "error" in r:
        print("  rank_state_dict: " + r["error"])
    else:
        print("  bfshard.torch.rank_state_dict: %6.2f s  peak RSS +%5.0f MB  (%d tensors, %.1f MB of its own, mapped "
              "not read; after imports %.0f MB)" % (r["rsd_s"], r["rsd_peak_mb"], r["tensors"], r["bytes"] / 1e6,
                                                    r["base_mb"]), flush=True)
        print("    + every tensor copied:      %6.2f s  peak RSS +%5.0f MB  (its own bytes twice: the mapped file's "
              "pages and the copies)" % (r["copy_s"], r["copy_peak_mb"]), flush=True)
    for kind in ("load", "load-verify") if a.verify else ("load",):
        r = run_child(kind, outdir, a.rank, a.timeout, pypath, a.cold)
        res[kind.replace("-", "_")] = r
        if "error" in r:
            print("  %s: %s" % (kind, r["error"]))
        else:
            print("  bfshard.torch.load%s %6.2f s  CPU %5.2f s  peak RSS +%5.0f MB  (%d tensors, %.1f MB copied into "
                  "W=%d DTensors; files %s)" % ("(verify=True):" if kind == "load-verify" else ":            ",
                                                r["load_s"], r["cpu_s"], r["load_peak_mb"], r["tensors"],
                                                r["bytes"] / 1e6, W, ", ".join(r["files"])), flush=True)
    if not a.skip_torch:
        r = run_child("torch", outdir, a.rank, a.timeout, pypath, a.cold)
        res["read_metadata"] = r
        if "error" in r:
            print("  torch HuggingFaceStorageReader.read_metadata(): " + r["error"])
        else:
            print("  torch HuggingFaceStorageReader.read_metadata(): %6.2f s  peak RSS +%5.0f MB  (%d tensors, %d "
                  "chunks; torch %s)" % (r["read_metadata_s"], r["read_metadata_peak_mb"], r["tensors"], r["chunks"],
                                         r["torch"]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
