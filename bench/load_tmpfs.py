#!/usr/bin/env python3
"""The load case of the benchmark: bfshard.torch.load against the loaders people pick, W ranks
on one host, and against dd from a cold page cache.

    python bench/load_tmpfs.py OUTDIR [--rounds 2] [--cold DISKDIR] [--json FILE]
                               [--readers floor,safetensors,fastsafetensors,runai,bfshard[,bfshard-verify]]
                               [--pkg ROOT[:BUILD]]... [--threads N]

OUTDIR is a bfshard --layout dcp output with a config.json (bench/gen_synth.py gpt-oss,
converted with --world-size 2 onto /dev/shm; `make bench` and `make bench-load` do that). Each
round runs every reader on the same W rank files, one after another; each reader is W processes
started together, one per rank file, each timing only its read; GB/s = the rank files' bytes
over the slowest process's seconds, CPU s/GB = the processes' CPU seconds (every thread) over
those bytes. Best of the rounds. Readers:

  floor            each file `readinto` one fresh `torch.empty` buffer of its size (first
                   touch + one copy): one pass over the bytes into fresh memory
  safetensors      safetensors `safe_open(path, "pt")`, `get_tensor(k).clone()` for every tensor
  fastsafetensors  `fastsafe_open(path, device="cpu", nogds=True)` (its CPU path), every tensor
  runai            runai-model-streamer's `SafetensorsStreamer`, defaults, every tensor
  bfshard          W gloo ranks, each building the model on meta from OUTDIR/config.json in
                   bfloat16, fully_shard each decoder layer and the root, to_empty(device="cpu")
                   (fresh pages, as a job's start has them), timing only
                   `bfshard.torch.load(model, OUTDIR)` (--pkg: whose package)
  bfshard-verify   the same with verify=True (each rank's file hashed against the manifest);
                   only when named in --readers

A reader whose package does not import is reported as not run (its error), not as a failure.
--cold DISKDIR: the same output converted onto a disk; each round drops the rank files from the
page cache (fdatasync + posix_fadvise DONTNEED on each: no root needed, other jobs' cache kept;
mincore(2) counts what stayed), runs W concurrent `dd if=RANKFILE of=/dev/null bs=8M`, drops them
again, and runs the bfshard reader there.
The bars (bench/bench.py's TARGETS): bfshard >= 0.9x the floor, faster than every peer that ran,
and cold >= 0.9x dd. The load average is printed beside every figure.
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

READERS = ("floor", "safetensors", "fastsafetensors", "runai", "bfshard")
EXTRA = ("bfshard-verify",)  # run only when asked for
PEERS = ("safetensors", "fastsafetensors", "runai")
DESC = {"floor": "floor: readinto one fresh torch.empty",
        "safetensors": "safetensors safe_open + get_tensor().clone()",
        "fastsafetensors": "fastsafetensors, CPU path (nogds=True)",
        "runai": "runai-model-streamer, defaults",
        "bfshard": "bfshard.torch.load",
        "bfshard-verify": "bfshard.torch.load(verify=True)"}


def load_avg():
    return os.getloadavg()[0]


def rank_files(outdir):
    with open(os.path.join(outdir, "bfshard.manifest.json"), "rb") as f:
        W = json.load(f)["options"]["world_size"]
    return W, [os.path.join(outdir, "shard-%05d-model-00001-of-00001.safetensors" % (r + 1)) for r in range(W)]


# ---- children: each prints one JSON line ----------------------------------------------------------

def child_load(rank, W, port, outdir, threads, verify=False):
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
    if verify:
        kw["verify"] = True
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


def child_peer(kind, path):
    """one peer reading every tensor of path into memory it keeps; the imports are not timed"""
    import torch  # noqa: F401
    if kind == "safetensors":
        from safetensors import safe_open

        def read():
            with safe_open(path, "pt") as f:
                return [f.get_tensor(k).clone() for k in f.keys()]
    elif kind == "fastsafetensors":
        from fastsafetensors import fastsafe_open

        def read():
            with fastsafe_open(path, device="cpu", nogds=True) as f:
                return [f.get_tensor(k) for k in f.keys()]  # they keep the loader's buffer alive
    elif kind == "runai":
        from runai_model_streamer import SafetensorsStreamer

        def read():
            with SafetensorsStreamer() as s:
                s.stream_file(path)
                return [t for _, t in s.get_tensors()]  # owned=True (the default): the caller's
    else:
        raise SystemExit("unknown reader %r" % kind)
    c0, t0 = time.process_time(), time.perf_counter()
    kept = read()
    c1, t1 = time.process_time(), time.perf_counter()
    nbytes = sum(t.numel() * t.element_size() for t in kept)
    return {"bytes": os.path.getsize(path), "tensor_bytes": nbytes, "s": t1 - t0, "cpu_s": c1 - c0}


# ---- parent --------------------------------------------------------------------------------------

def spawn(python, args, pypath=None):
    env = dict(os.environ)
    if pypath:
        env["PYTHONPATH"] = pypath
    return subprocess.Popen([python, os.path.abspath(__file__), "--child"] + [str(a) for a in args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def collect(procs):
    """the children's JSON lines; the first failure as {"error": its last stderr line}"""
    out, err = [], None
    for p in procs:
        so, se = p.communicate(timeout=900)
        if p.returncode != 0:
            lines = [ln for ln in se.strip().splitlines() if ln.strip()]
            err = err or "exit %d: %s" % (p.returncode, lines[-1] if lines else "")
            continue
        out.append(json.loads(so.strip().splitlines()[-1]))
    return {"error": err} if err else out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def drop_cache(files):
    """evict these files' pages from the page cache (written back first), and only theirs: no
    root needed, and other jobs on the machine keep their cache. Returns the bytes still cached."""
    left = 0
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            left += cached_bytes(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
    return left


def cached_bytes(fd, size):
    """bytes of the file in the page cache: mincore(2) over a mapping of it (None: unknown)"""
    import ctypes
    import mmap
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        return None
    try:
        n = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * n)()
        if libc.mincore(addr, size, vec) != 0:
            return None
        return sum(v & 1 for v in vec) * mmap.PAGESIZE
    finally:
        libc.munmap(addr, size)


def dd(files):
    """W concurrent dd readers, one a file: seconds from the first start to the last end"""
    t0 = time.perf_counter()
    ps = [subprocess.Popen(["dd", "if=" + f, "of=/dev/null", "bs=8M"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE) for f in files]
    for p in ps:
        p.wait()
    s = time.perf_counter() - t0
    bad = [p for p in ps if p.returncode != 0]
    return {"error": "dd exit %d" % bad[0].returncode} if bad else {"s": s}


def one(python, kind, outdir, files, W, pypath, threads):
    """one round of one reader: {gbps, s, cpu_s_per_gb, load, ...} or {error, load}"""
    la = load_avg()
    if kind in ("bfshard", "bfshard-verify"):
        port = free_port()
        rs = collect([spawn(python, ["load", r, W, port, outdir, threads, int(kind == "bfshard-verify")], pypath)
                      for r in range(W)])
    elif kind == "floor":
        rs = collect([spawn(python, ["floor", f]) for f in files])
    else:
        rs = collect([spawn(python, ["peer", kind, f]) for f in files])
    if isinstance(rs, dict):
        return dict(rs, load=la)
    nbytes = sum(os.path.getsize(f) for f in files)
    slow = max(r["s"] for r in rs)
    out = {"gbps": nbytes / 1e9 / slow, "s": slow, "cpu_s_per_gb": sum(r["cpu_s"] for r in rs) / (nbytes / 1e9),
           "load": la}
    if kind in ("bfshard", "bfshard-verify"):
        out["bytes_read"] = sum(r["bytes_read"] or 0 for r in rs)
        out["bytes"] = sum(r["bytes"] for r in rs)
    return out


def best(rounds):
    ok = [r for r in rounds if "gbps" in r]
    return max(ok, key=lambda r: r["gbps"]) if ok else None


def run(outdir, python=sys.executable, rounds=2, cold=None, readers=READERS, pypath=None, threads=0, log=None):
    """Every reader's rounds, the cold rounds and the ratios the bars take, as one dict."""
    log = log or (lambda s: print(s, flush=True))
    W, files = rank_files(outdir)
    nbytes = sum(os.path.getsize(f) for f in files)
    res = {"outdir": outdir, "world": W, "bytes": nbytes, "rounds": rounds, "nproc": os.cpu_count(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "loadavg_start": round(load_avg(), 2),
           "readers": {k: {"desc": DESC[k], "rounds": []} for k in readers}}
    log("load: %s: W=%d, %.2f GB of rank files on %s, %d CPUs" % (outdir, W, nbytes / 1e9, outdir, os.cpu_count()))
    for rnd in range(rounds):
        for k in readers:
            r = one(python, k, outdir, files, W, pypath if k in ("bfshard", "bfshard-verify") else None, threads)
            res["readers"][k]["rounds"].append(r)
            if "error" in r:
                log("load: round %d  %-46s not run: %s (load %.2f)" % (rnd + 1, DESC[k], r["error"], r["load"]))
            else:
                log("load: round %d  %-46s %5.2f GB/s  (%.2f s, CPU %.2f s/GB%s; load %.2f)" % (
                    rnd + 1, DESC[k], r["gbps"], r["s"], r["cpu_s_per_gb"],
                    ", %.2f GB by pread" % (r["bytes_read"] / 1e9) if "bytes_read" in r else "", r["load"]))
    for k, v in res["readers"].items():
        b = best(v["rounds"])
        if b:
            v.update(gbps=b["gbps"], cpu_s_per_gb=b["cpu_s_per_gb"], load=b["load"])
        else:
            v["error"] = next((r["error"] for r in v["rounds"] if "error" in r), "no round ran")
    if cold:
        Wc, cfiles = rank_files(cold)
        c = {"outdir": cold, "bytes": sum(os.path.getsize(f) for f in cfiles), "dd": [], "bfshard": []}
        for rnd in range(rounds):
            c["left_cached"] = drop_cache(cfiles)
            la = load_avg()
            d = dd(cfiles)
            d.update(load=la)
            if "s" in d:
                d["gbps"] = c["bytes"] / 1e9 / d["s"]
            c["dd"].append(d)
            c["left_cached"] = max(c["left_cached"] or 0, drop_cache(cfiles) or 0)
            r = one(python, "bfshard", cold, cfiles, Wc, pypath, threads)
            c["bfshard"].append(r)
            log("load: cold round %d (%d MB of them still cached): dd %s; bfshard.torch.load %s" % (
                rnd + 1, (c["left_cached"] or 0) >> 20, "%.2f GB/s (load %.2f)" % (d["gbps"], la) if "gbps" in d else d["error"],
                "%.2f GB/s (CPU %.2f s/GB, load %.2f)" % (r["gbps"], r["cpu_s_per_gb"], r["load"]) if "gbps" in r
                else r["error"]))
        res["cold"] = c
    res["ratios"] = ratios(res)
    res["loadavg_end"] = round(load_avg(), 2)
    return res


def ratios(res):
    rd = res["readers"]
    out = {}
    me = rd.get("bfshard", {}).get("gbps")
    if me and rd.get("floor", {}).get("gbps"):
        out["vs_floor"] = me / rd["floor"]["gbps"]
    ran = [k for k in PEERS if rd.get(k, {}).get("gbps")]
    if me and ran:
        top = max(ran, key=lambda k: rd[k]["gbps"])
        out["vs_best_peer"], out["best_peer"] = me / rd[top]["gbps"], top
    c = res.get("cold")
    if c:
        d, b = best(c["dd"]), best(c["bfshard"])
        if d and b:
            out["cold_vs_dd"] = b["gbps"] / d["gbps"]
    return out


def table(res):
    """the case's report: one line a reader, then the cold rows and the ratios"""
    L = ["load: gpt-oss-shaped output, W=%d, %.2f GB of rank files on tmpfs; each reader one process a rank file, "
         "best of %d rounds (bench/load_tmpfs.py, %s)" % (res["world"], res["bytes"] / 1e9, res["rounds"], res["date"])]
    for k, v in res["readers"].items():
        if "gbps" in v:
            L.append("    %-46s %5.2f GB/s  CPU %.2f s/GB  (load average %.2f)" % (v["desc"], v["gbps"],
                                                                                   v["cpu_s_per_gb"], v["load"]))
        else:
            L.append("    %-46s not run: %s" % (v["desc"], v.get("error")))
    c = res.get("cold")
    if c:
        d, b = best(c["dd"]), best(c["bfshard"])
        L.append("    cold (rank files on disk, %.2f GB, dropped from the page cache): dd bs=8M %s; bfshard.torch.load %s" % (
            c["bytes"] / 1e9, "%.2f GB/s (load %.2f)" % (d["gbps"], d["load"]) if d else "-",
            "%.2f GB/s, CPU %.2f s/GB (load %.2f)" % (b["gbps"], b["cpu_s_per_gb"], b["load"]) if b else "-"))
    r = res.get("ratios") or {}
    L.append("    bfshard.torch.load: %s the floor, %s the fastest peer (%s)%s" % (
        "%.2fx" % r["vs_floor"] if "vs_floor" in r else "-", "%.2fx" % r["vs_best_peer"] if "vs_best_peer" in r else "-",
        r.get("best_peer", "none ran"), ", cold %.2fx dd" % r["cold_vs_dd"] if "cold_vs_dd" in r else ""))
    return "\n".join(L)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind = sys.argv[2]
        if kind == "load":
            r = child_load(int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], int(sys.argv[7]),
                           len(sys.argv) > 8 and sys.argv[8] == "1")
        elif kind == "floor":
            r = child_floor(sys.argv[3])
        else:
            r = child_peer(sys.argv[3], sys.argv[4])
        print(json.dumps(r))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--readers", default=",".join(READERS), help="a comma list of: " + ", ".join(READERS))
    ap.add_argument("--cold", default="", help="the same output on a disk: the cold rounds against dd")
    ap.add_argument("--pkg", default="", help="ROOT[:BUILD] of the checkout whose bfshard package loads")
    ap.add_argument("--threads", type=int, default=0, help="load(threads=N)")
    ap.add_argument("--json", default="", help="write the results here too")
    a = ap.parse_args()
    readers = [x for x in a.readers.split(",") if x]
    bad = [x for x in readers if x not in READERS + EXTRA]
    if bad:
        ap.error("unknown reader %s" % bad[0])
    root, _, build = (a.pkg or os.path.dirname(HERE)).partition(":")
    pypath = stage(os.path.abspath(build or os.path.join(root, "build")), os.path.abspath(root)) \
        if "bfshard" in readers or "bfshard-verify" in readers else None
    try:
        res = run(os.path.abspath(a.outdir), rounds=a.rounds, cold=os.path.abspath(a.cold) if a.cold else None,
                  readers=readers, pypath=pypath, threads=a.threads)
    finally:
        if pypath:
            shutil.rmtree(pypath, ignore_errors=True)
    print(table(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
