#!/usr/bin/env python3
"""bfshard.torch.load against the fresh-buffer floor, W ranks on one host: the loading table.

    python bench/load_tmpfs.py OUTDIR [--rounds 2] [--pkg ROOT[:BUILD]]... [--floor]

OUTDIR is a bfshard --layout dcp output with a config.json (e.g. bench/gen_synth.py gpt-oss,
converted with --world-size 2 onto /dev/shm). For each --pkg (the checkout ROOT's python/bfshard
with BUILD's `make python-native` library, BUILD defaulting to ROOT/build; several to compare
two trees in the same run) and each round, W processes (gloo, CPU) each build the model on
meta from OUTDIR/config.json in bfloat16, fully_shard each decoder layer and the root,
to_empty(device="cpu") (fresh, untouched pages, as a job's start has them), and time only
`bfshard.torch.load(model, OUTDIR)`. GB/s: the ranks' bytes over the slowest rank's seconds.

--floor: the same files, one process per file started together, each `readinto` one fresh
`torch.empty` buffer of the file's size (first touch + one copy): what one pass over the
bytes into fresh memory costs here. The load average (os.getloadavg) is printed beside every
figure: on a shared machine the figures move with it.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from loader_bench import stage  # noqa: E402


def load_avg():
    return "load %.2f" % os.getloadavg()[0]


# ---- children ------------------------------------------------------------------------------------

def child_load(rank, W, port, outdir, threads):
    import datetime
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM
    import bfshard.torch as bt
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=W, timeout=datetime.timedelta(seconds=600))
    mesh = init_device_mesh("cpu", (W,))
    cfg = AutoConfig.from_pretrained(outdir)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    for b in m.model.layers:
        fully_shard(b, mesh=mesh)
    fully_shard(m, mesh=mesh)
    m.to_empty(device="cpu")
    dist.barrier()
    import inspect
    kw = {"threads": threads} if threads and "threads" in inspect.signature(bt.load).parameters else {}
    c0, t0 = time.process_time(), time.perf_counter()
    r = bt.load(m, outdir, **kw)
    c1, t1 = time.process_time(), time.perf_counter()
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "bytes": r.bytes, "bytes_read": getattr(r, "bytes_read", None), "s": t1 - t0,
            "cpu_s": c1 - c0}


def child_floor(path):
    import torch
    n = os.path.getsize(path)
    c0, t0 = time.process_time(), time.perf_counter()
    buf = torch.empty(n, dtype=torch.uint8)
    mv, got = memoryview(buf.numpy()), 0
    with open(path, "rb", buffering=0) as f:
        while got < n:  # one read(2) returns at most ~2 GiB
            k = f.readinto(mv[got:])
            assert k, "%s: ends at %d of %d bytes" % (path, got, n)
            got += k
    c1, t1 = time.process_time(), time.perf_counter()
    return {"bytes": n, "s": t1 - t0, "cpu_s": c1 - c0}


# ---- parent --------------------------------------------------------------------------------------

def spawn(args, pypath):
    env = dict(os.environ)
    if pypath:
        env["PYTHONPATH"] = pypath
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child"] + [str(a) for a in args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def collect(procs):
    out = []
    for p in procs:
        so, se = p.communicate(timeout=900)
        if p.returncode != 0:
            raise RuntimeError("child exit %d: %s" % (p.returncode, se.strip()[-1500:]))
        out.append(json.loads(so.strip().splitlines()[-1]))
    return out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind = sys.argv[2]
        if kind == "load":
            r = child_load(int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], int(sys.argv[7]))
        else:
            r = child_floor(sys.argv[3])
        print(json.dumps(r))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pkg", action="append", default=[], help="ROOT[:BUILD] of a checkout to load with")
    ap.add_argument("--floor", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="load(threads=N) (a tree whose load() takes it)")
    a = ap.parse_args()
    outdir = os.path.abspath(a.outdir)
    with open(os.path.join(outdir, "bfshard.manifest.json"), "rb") as f:
        head = json.load(f)
    W = head["options"]["world_size"]
    files = [os.path.join(outdir, "shard-%05d-model-00001-of-00001.safetensors" % (r + 1)) for r in range(W)]
    total = sum(os.path.getsize(f) for f in files)
    print("%s: W=%d, %.2f GB of rank files, %d CPUs" % (outdir, W, total / 1e9, os.cpu_count()), flush=True)
    staged = []
    for spec in a.pkg or [os.path.dirname(HERE)]:
        root, _, build = spec.partition(":")
        staged.append((root, stage(os.path.abspath(build or os.path.join(root, "build")), os.path.abspath(root))))
    for rnd in range(a.rounds):
        if a.floor:
            before = load_avg()
            rs = collect([spawn(["floor", f], None) for f in files])
            gb = sum(r["bytes"] for r in rs) / 1e9
            print("round %d  floor (readinto a fresh torch.empty, one process per file): %5.2f GB/s  (%.2f s; "
                  "CPU %.2f s/GB; %s)" % (rnd + 1, gb / max(r["s"] for r in rs), max(r["s"] for r in rs),
                                         sum(r["cpu_s"] for r in rs) / gb, before), flush=True)
        for root, pypath in staged:
            before = load_avg()
            port = free_port()
            rs = collect([spawn(["load", r, W, port, outdir, a.threads], pypath) for r in range(W)])
            gb = sum(r["bytes"] for r in rs) / 1e9
            slow = max(r["s"] for r in rs)
            print("round %d  bfshard.torch.load (%s): %5.2f GB/s  (%.2f GB in %.2f s, slowest rank; CPU %.2f s/GB; "
                  "by pread %s; %s)" % (rnd + 1, root, gb / slow, gb, slow, sum(r["cpu_s"] for r in rs) / gb,
                     "%.2f GB" % (sum(r["bytes_read"] for r in rs) / 1e9) if rs[0]["bytes_read"] is not None else "-",
                     before), flush=True)
    for _, pypath in staged:
        shutil.rmtree(pypath, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
