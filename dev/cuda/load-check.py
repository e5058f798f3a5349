#!/usr/bin/env python3
"""bfshard.torch.load into CUDA shards on a real GPU: bit for bit, GB/s, host memory (gpu-check.sh step 11).

    python3 dev/cuda/load-check.py [--build build] [--work DIR] [--dry-run]

1. Bit for bit: fixtures converted by BUILD/bfshard (W=1: a plain state_dict; W=2: each rank's
   DTensors through torch's fake process group, one process) loaded into shards on cuda:0 and
   into CPU shards; every tensor's dtype and bytes compared (the device shards start as 0xFF
   bytes, the CPU ones as zeros, so a byte not written shows); the same from a `.zst`-only copy
   (`bfshard compress --rm`) and with a tiny max_host_bytes (many turns of the pinned ring).
   PASS/FAIL lines; the exit status is 1 when any FAILs.
2. Rate: a gpt-oss-shaped 1-layer checkpoint (bench/gen_synth.py, needs numpy) converted W=1 to
   WORK (default /dev/shm), loaded into cuda:0 (best of 3), beside a pinned host-to-device copy
   of as many bytes, safetensors' safe_open(device="cuda:0") of every tensor of the same file,
   and a plain readinto of the file; the ratio to min(H2D, read) against the bar 0.8x is a
   bench figure (PASS/FAIL printed, not counted in the exit status). fastsafetensors is not on
   the GPU machine (no network; its wheel could be carried) and is not compared.
3. Host memory: peak RSS (VmHWM) of a fresh process above what it held once CUDA was up and the
   model's shards allocated, for the load into cuda:0 (the ring's pinned buffers are resident
   pages of the process: they count), against max_host_bytes + MEM_SLACK; a figure, as in 2.
Without CUDA (or with --dry-run) the same flow runs with CPU tensors standing in for the device
(the ring is then not used: it checks the script, not the GPU path). Lines starting "SUMMARY "
are what gpu-check.sh's summary collects. Needs torch and safetensors; the bfshard package is
this checkout's python/bfshard with BUILD/python's library (`make python-native`).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = ("mxfp4-tiny", "moe-dsv3-fp8", "fp8-block")
BAR = 0.8
# host memory allowed above the ring: reading threads' stacks, the header's mapping, the
# ranges' list, torch's and Python's own allocations while loading
MEM_SLACK = 64 << 20
RANK_FILE = "shard-00001-model-00001-of-00001.safetensors"

sys.path.insert(0, os.path.join(ROOT, "bench"))
# the package staged as the benchmarks stage it; VmHWM as they read it
from loader_bench import build_model, hwm_mb, stage  # noqa: E402

FAILS = []


def check(ok, what):
    print("%s: %s" % ("PASS" if ok else "FAIL", what), flush=True)
    if not ok:
        FAILS.append(what)


def one_line(e):
    return "%s: %s" % (type(e).__name__, (str(e).strip().splitlines() or [""])[0])


def sh(*cmd):
    subprocess.run([str(c) for c in cmd], check=True, stdout=subprocess.DEVNULL)


# ---- comparing two loads (the models: loader_bench.build_model) --------------------------------

def compare(got, want, what):
    """every tensor's dtype and bytes (NaNs included: compared as bytes, not values)"""
    import torch
    bad = []
    for k, w in want.items():
        g = got[k]
        g = g.to_local() if hasattr(g, "to_local") else g
        w = w.to_local() if hasattr(w, "to_local") else w
        gb = g.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        wb = w.detach().contiguous().reshape(-1).view(torch.uint8)
        if g.dtype != w.dtype or tuple(g.shape) != tuple(w.shape) or not torch.equal(gb, wb):
            bad.append(k)
    check(not bad, "%s: %d tensors equal%s"
          % (what, len(want) - len(bad), "; differ: %s" % ", ".join(bad[:5]) if bad else ""))


def manifest(outdir):
    with open(os.path.join(outdir, "bfshard.manifest.json")) as f:
        return json.load(f)


def sync(dev):
    import torch
    if dev != "cpu":
        torch.cuda.synchronize(dev)


# ---- 1. bit for bit ----------------------------------------------------------------------------

def bit_for_bit(bfshard, work, dev):
    import torch
    import torch.distributed as dist
    import bfshard.torch as bt
    for fx in FIXTURES:
        for W in (1, 2):
            out = os.path.join(work, "%s-w%d" % (fx, W))
            zst = out + "-zst"
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(zst, ignore_errors=True)
            sh(bfshard, "convert", os.path.join(ROOT, "fixtures", fx), out, "--world-size", W, "--quiet")
            shutil.copytree(out, zst)
            sh(bfshard, "compress", zst, "--rm", "--quiet")
            man = manifest(out)
            for rank in range(W):
                mesh = cmesh = None
                try:
                    if W > 1:
                        from torch.testing._internal.distributed.fake_pg import FakeStore
                        from torch.distributed.device_mesh import init_device_mesh
                        if dist.is_initialized():
                            dist.destroy_process_group()
                        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=W)
                        cmesh = init_device_mesh("cpu", (W,))
                        mesh = init_device_mesh("cuda", (W,)) if dev != "cpu" else cmesh
                except Exception as e:
                    check(False, "%s W=%d rank %d: the process group or device mesh: %s" % (fx, W, rank, one_line(e)))
                    continue
                try:
                    ref = build_model(man, rank, "cpu", cmesh, 0)
                    bt.load(ref, out)
                    tag = "%s W=%d rank %d" % (fx, W, rank)
                    for name, src, mhb in (("", out, 256 << 20), (" from .zst only", zst, 256 << 20),
                                           (" max_host_bytes=4096", out, 4096)):
                        try:
                            sd = build_model(man, rank, dev, mesh, 0xFF)
                            r = bt.load(sd, src, max_host_bytes=mhb)
                            sync(dev)
                        except Exception as e:  # one FAIL line; the other checks still run
                            check(False, "%s into %s%s: %s" % (tag, dev, name, one_line(e)))
                            continue
                        compare(sd, ref, "%s into %s%s (%d of %d bytes through the %s)"
                                % (tag, dev, name, r.bytes_read, r.bytes, "ring" if dev != "cpu" else "pread path"))
                finally:
                    if W > 1:
                        dist.destroy_process_group()
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(zst, ignore_errors=True)


# ---- 2. rate -----------------------------------------------------------------------------------

def best(fn, n, times=None):
    ts = times if times is not None else []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def rate(bfshard, work, dev, args):
    import torch
    import bfshard.torch as bt
    from bfshard import _devring
    from safetensors import safe_open
    src, out = os.path.join(work, "synth-in"), os.path.join(work, "synth-w1")
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    sh(sys.executable, os.path.join(ROOT, "bench", "gen_synth.py"), "gpt-oss", src, "--layers", args.layers,
       "--vocab", args.vocab)
    sh(bfshard, "convert", src, out, "--world-size", 1, "--quiet")
    shutil.rmtree(src)
    path = os.path.join(out, RANK_FILE)
    size = os.path.getsize(path)
    man = manifest(out)

    sd = build_model(man, 0, dev, None, 0xFF)
    res = []

    def go():
        res.append(bt.load(sd, out, max_host_bytes=args.max_host_bytes))
        sync(dev)
    times = []
    t_load = best(go, args.repeat, times)
    nbytes = res[-1].bytes
    ref = build_model(man, 0, "cpu", None, 0)
    bt.load(ref, out)
    compare(sd, ref, "synthetic gpt-oss (%.2f GB) into %s" % (nbytes / 1e9, dev))
    sd = build_model(man, 0, dev, None, 0xFF)
    bt.load(sd, out, max_host_bytes=1 << 20)
    sync(dev)
    compare(sd, ref, "synthetic gpt-oss into %s, max_host_bytes=1 MiB" % dev)
    del sd, ref

    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=dev != "cpu")
    host.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)

    def h2d():
        dst.copy_(host, non_blocking=True)
        sync(dev)
    t_h2d = best(h2d, args.repeat)
    del host, dst

    def st():
        with safe_open(path, framework="pt", device=dev) as f:
            got = [f.get_tensor(k) for k in f.keys()]
        sync(dev)
        del got
    t_st = best(st, args.repeat)

    buf = bytearray(64 << 20)

    def readinto():
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    t_read = best(readinto, args.repeat)

    g = lambda n, t: n / t / 1e9  # noqa: E731
    load_gbs, h2d_gbs, st_gbs, read_gbs = g(nbytes, t_load), g(nbytes, t_h2d), g(size, t_st), g(size, t_read)
    floor = min(h2d_gbs, read_gbs)
    nb, bs = _devring.plan_buffers(args.max_host_bytes, nbytes)
    print("load into %s: %.2f GB in %.3f s = %.2f GB/s (best of %d; the first run, which pins the ring on a GPU, %.3f s; "
          "max_host_bytes %d MiB: %d x %d MiB buffers; %d of %d bytes through the %s)"
          % (dev, nbytes / 1e9, t_load, load_gbs, args.repeat, times[0], args.max_host_bytes >> 20, nb, bs >> 20,
             res[-1].bytes_read, nbytes, "ring" if dev != "cpu" else "pread path"))
    print("pinned host-to-device copy of as many bytes: %.2f GB/s%s"
          % (h2d_gbs, "" if dev != "cpu" else " (dry run: a CPU copy)"))
    print("safetensors safe_open(device=%r), every tensor: %.2f GB/s (%.2f GB file)%s"
          % (dev, st_gbs, size / 1e9, "" if dev != "cpu" else " (dry run: mapped, not read)"))
    print("plain readinto of the file (64 MiB, one thread, page cache / tmpfs): %.2f GB/s" % read_gbs)
    ratio = load_gbs / floor
    print("%s (bench): load at %.2fx min(H2D, read) = %.2f GB/s; bar %.1fx; %.2fx safetensors"
          % ("PASS" if ratio >= BAR else "FAIL", ratio, floor, BAR, load_gbs / st_gbs))
    print("SUMMARY load: %.2f GB/s into %s, %.2fx min(H2D %.2f, read %.2f GB/s) (bar %.1fx), safetensors %.2f GB/s"
          % (load_gbs, dev, ratio, h2d_gbs, read_gbs, BAR, st_gbs))
    return out


# ---- 3. host memory ----------------------------------------------------------------------------

def mem_child(outdir, dev, mhb):
    """run in a fresh process: VmHWM above CUDA's start-up and the model's shards, for one load"""
    import torch
    import bfshard.torch as bt
    from bfshard import _devring
    if dev != "cpu":
        torch.zeros(1, device=dev)
        torch.empty(1, pin_memory=True)  # the pinned allocator up; its buffers then count
    sd = build_model(manifest(outdir), 0, dev, None, 0xFF)
    sync(dev)
    base = hwm_mb()
    r = bt.load(sd, outdir, max_host_bytes=mhb)
    sync(dev)
    print(json.dumps({"base_mb": base, "peak_mb": hwm_mb() - base, "bytes": r.bytes,
                      "ring_mb": (lambda n, b: n * b / 2**20)(*_devring.plan_buffers(mhb, r.bytes))}))


def memory(outdir, dev, pkg, args):
    for mhb in (args.max_host_bytes, 64 << 20):
        env = dict(os.environ, PYTHONPATH=pkg + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--mem-child", outdir, dev, str(mhb)],
                           env=env, stdout=subprocess.PIPE, text=True)
        if p.returncode != 0:
            check(False, "host memory child (max_host_bytes %d MiB) exited %d" % (mhb >> 20, p.returncode))
            continue
        m = json.loads(p.stdout.strip().splitlines()[-1])
        lim = (mhb + MEM_SLACK) / 2**20
        print("%s (bench): peak host memory of a load into %s above the model: %.0f MiB, max_host_bytes %d MiB "
              "+ %d MiB slack = %.0f MiB (the ring's buffers: %.0f MiB%s; process held %.0f MiB before)"
              % ("PASS" if m["peak_mb"] <= lim else "FAIL", dev, m["peak_mb"], mhb >> 20, MEM_SLACK >> 20, lim,
                 m["ring_mb"], ", not used on the CPU" if dev == "cpu" else "", m["base_mb"]))
        print("SUMMARY load host memory: +%.0f MiB at max_host_bytes %d MiB (limit %.0f MiB)"
              % (m["peak_mb"], mhb >> 20, lim))


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--mem-child":
        return mem_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", help="scratch directory (default: a new one in /dev/shm, else TMPDIR)")
    ap.add_argument("--dry-run", action="store_true", help="CPU tensors stand in for the device")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-host-bytes", type=int, default=256 << 20)
    ap.add_argument("--skip-rate", action="store_true", help="only the bit-for-bit checks")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    pkg = stage(build, ROOT)
    sys.path.insert(0, pkg)
    import torch
    dev = "cuda:0"
    if args.dry_run or not torch.cuda.is_available():
        print("DRY RUN: %s; CPU tensors stand in for cuda:0 (the pinned ring is not exercised)"
              % ("--dry-run" if args.dry_run else "torch.cuda.is_available() is False"))
        dev = "cpu"
    else:
        torch.cuda.set_device(0)
        print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name(0)))
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    work = args.work or tempfile.mkdtemp(prefix="bfshard-load-check.", dir=base)
    os.makedirs(work, exist_ok=True)
    bfshard = os.path.join(build, "bfshard")
    try:
        bit_for_bit(bfshard, work, dev)
        if not args.skip_rate:
            try:
                out = rate(bfshard, work, dev, args)
                memory(out, dev, pkg, args)
            except Exception as e:  # one FAIL line (the traceback above it), the summary still printed
                traceback.print_exc()
                check(False, "the rate / host memory part: %s" % one_line(e))
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(pkg, ignore_errors=True)
    print("load-check: %s" % ("%d FAIL(s): %s" % (len(FAILS), "; ".join(FAILS)) if FAILS
                              else "all bit-for-bit checks passed"))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
