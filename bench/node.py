#!/usr/bin/env python3
"""The "node" case of the benchmark: does a conversion use the whole node?

    python3 bench/node.py [--build build] [--data build/bench-data] [--layers 2] [--rounds 3]

Output on tmpfs (/dev/shm), input a gpt-oss-shaped MXFP4 checkpoint (bench/gen_synth.py,
generated once into --data with a python that has numpy: --python), converted with
`--world-size 8` (the DCP layout), with `--layout hf` (one shard) and with `--layout hf` in
shards of 512 MB a layer (about 4, as a full model's output has many), beside `nproc` concurrent `dd`
writers of the same bytes (each 1/nproc of them, bs=8M): rounds interleaved (dd, W=8, hf,
then the next round), the median of the rounds' ratios dd time / bfshard time held to
>= 0.6 (the bar), each run's peak RSS (/usr/bin/time -v) and its stage seconds and busy
fractions (BFSHARD_STAGES=1) beside it, and one `dd` writer of the same bytes (the floor of
one file: `--layout hf` writes one shard here); then `verify` of each output beside `nproc`
concurrent `xxh128sum` of its files. The input is read into the page cache before each
bfshard run (bfshard drops the pages it read: every run starts from the same cache). Prints
a table and writes JSON to --out; `make bench` runs it too (bench.py --node).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench import TIME, data_dir, parse_time_v, loadavg, reread_cache, warm_cache  # noqa: E402

BAR = 0.6


def log(*a):
    print("node:", *a, file=sys.stderr, flush=True)


def run_timed(cmd, env=None):
    tpath = f"/tmp/bfs-node-{os.getpid()}.time"
    t0 = time.monotonic()
    p = subprocess.run([TIME, "-v", "-o", tpath] + cmd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    with open(tpath) as f:
        r = parse_time_v(f.read())
    os.unlink(tpath)
    r.update(wall_s=wall, rc=p.returncode)
    r["cpu_percent"] = round(100 * (r.get("user_s", 0) + r.get("sys_s", 0)) / wall) if wall > 0 else None
    for line in p.stderr.splitlines():
        if line.startswith("bfshard-stages "):
            r["stages"] = json.loads(line.split(" ", 1)[1])
    if p.returncode != 0:
        r["stderr"] = p.stderr[-2000:]
    return r


def dd_writers(outdir, total, n):
    """n concurrent dd writers, total bytes between them (8 MiB blocks), seconds from the
    first start to the last end"""
    os.makedirs(outdir, exist_ok=True)
    bs = 8 << 20
    each = (total + n - 1) // n
    cnt = max(1, (each + bs - 1) // bs)
    t0 = time.monotonic()
    ps = [subprocess.Popen(["dd", "if=/dev/zero", f"of={outdir}/dd{i}", f"bs={bs}", f"count={cnt}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(n)]
    rc = max(p.wait() for p in ps)
    wall = time.monotonic() - t0
    shutil.rmtree(outdir, ignore_errors=True)
    return {"wall_s": wall, "rc": rc, "bytes": cnt * bs * n}


def out_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".safetensors"))


def busy(st):
    """each stage's busy fraction over the rank files (BFSHARD_STAGES's busy_*: per thread of
    the stage); a binary without them: seconds / files_s"""
    if not st:
        return {}
    if "busy_write" in st:
        return {k: round(st["busy_" + k], 3) for k in ("read", "dequant", "hash", "write")}
    f = st.get("files_s") or 0
    return {k: round(st.get(k + "_s", 0.0) / f, 3) for k in ("dequant", "hash", "write")} if f else {}


def run(bfshard, data, python, layers=2, vocab=32000, rounds=3, shm=None, cases="w8,hf,hf-shards", before=None):
    """the node case; returns its results (ratio medians, PASS against BAR, busy fractions);
    before: another bfshard binary run in the same rounds, its cases named CASE-before"""
    nproc = os.cpu_count() or 1
    shm = shm or f"/dev/shm/bfshard-node-{os.getpid()}"
    inp = os.path.join(data, f"node-gptoss-L{layers}-V{vocab}")
    if not os.path.exists(os.path.join(inp, "config.json")):
        log("generating", inp)
        subprocess.run([python, os.path.join(HERE, "gen_synth.py"), "gpt-oss", inp, "--layers", str(layers),
                        "--vocab", str(vocab)], check=True)
    # hf: one shard here (the default 5 GB shards); hf-shards: shards of 512 MB a layer, about
    # 4 of them, as a full model's `--layout hf` output has many (gpt-oss-20b: 9 at 5 GB), written
    # by several lanes at once
    argv = {"w8": ["--world-size", "8"], "hf": ["--layout", "hf"],
            "hf-shards": ["--layout", "hf", "--max-shard-size", f"{512 * layers}M"]}
    want = [c for c in cases.split(",") if c in argv]
    bins = {c: bfshard for c in want}
    if before:  # the same cases with the other binary, in the same rounds
        for c in list(want):
            argv[c + "-before"] = argv[c]
            bins[c + "-before"] = before
            want.insert(want.index(c), c + "-before")
    env = dict(os.environ, BFSHARD_STAGES="1")
    reread_cache([inp])
    os.makedirs(shm, exist_ok=True)
    rows = []
    la0 = loadavg()
    for rnd in range(rounds):
        row = {}
        for c in want:
            out = os.path.join(shm, c)
            shutil.rmtree(out, ignore_errors=True)
            warm_cache([inp])
            r = run_timed([bins[c], "convert", inp, out, "--device", "cpu", "-q"] + argv[c], env=env)
            if r["rc"] != 0:
                raise RuntimeError(f"node {c}: bfshard failed: {r.get('stderr', '')}")
            r["out_bytes"] = out_bytes(out)
            if rnd == rounds - 1:  # verify of the last round's output, beside nproc xxh128sum
                v = run_timed([bins[c], "verify", out])
                files = sorted(os.path.join(out, f) for f in os.listdir(out) if not f.startswith("."))
                t0 = time.monotonic()
                ps = [subprocess.Popen(["xxh128sum"] + files[i::nproc], stdout=subprocess.DEVNULL)
                      for i in range(nproc) if files[i::nproc]]
                [p.wait() for p in ps]
                r["verify_s"], r["xxh128sum_s"] = v["wall_s"], time.monotonic() - t0
            shutil.rmtree(out, ignore_errors=True)
            d = dd_writers(os.path.join(shm, "dd"), r["out_bytes"], nproc)
            r["dd_s"] = d["wall_s"]
            r["ratio"] = d["wall_s"] / r["wall_s"]
            # one dd writer of the same bytes: the floor of one file on tmpfs (its writes
            # take the inode's lock in turn), which `--layout hf`'s one shard is
            r["dd1_s"] = dd_writers(os.path.join(shm, "dd"), r["out_bytes"], 1)["wall_s"]
            r["ratio_dd1"] = r["dd1_s"] / r["wall_s"]
            r["busy"] = busy(r.get("stages"))
            row[c] = r
            log(f"round {rnd + 1} {c}: {r['wall_s']:.2f} s, {nproc} dd {d['wall_s']:.2f} s, ratio {r['ratio']:.2f}, "
                f"1 dd {r['dd1_s']:.2f} s, ratio {r['ratio_dd1']:.2f}, "
                f"peak RSS {r.get('max_rss_kb', 0) / 1024:.0f} MB, CPU {r['cpu_percent']}%, busy {r['busy']}, "
                f"load {loadavg()}")
        rows.append(row)
    shutil.rmtree(shm, ignore_errors=True)
    res = {"nproc": nproc, "layers": layers, "rounds": rounds, "loadavg_start": la0, "loadavg_end": loadavg(),
           "bar": BAR, "cases": {}}
    for c in want:
        rs = [row[c] for row in rows]
        med = statistics.median(r["ratio"] for r in rs)
        mid = sorted(rs, key=lambda r: r["ratio"])[len(rs) // 2]
        res["cases"][c] = {"ratio_median": med, "pass": med >= BAR, "gbps_median": mid["out_bytes"] / mid["wall_s"] / 1e9,
                           "ratio_dd1_median": statistics.median(r["ratio_dd1"] for r in rs),
                           "dd1_gbps": mid["out_bytes"] / mid["dd1_s"] / 1e9,
                           "dd_gbps": mid["out_bytes"] / mid["dd_s"] / 1e9, "peak_rss_mb": mid.get("max_rss_kb", 0) / 1024,
                           "busy": mid["busy"], "cpu_percent": mid.get("cpu_percent"),
                           "writers": (mid.get("stages") or {}).get("writers", 1),
                           "verify_s": rs[-1].get("verify_s"), "xxh128sum_s": rs[-1].get("xxh128sum_s"),
                           "rounds": [{k: r.get(k) for k in ("wall_s", "dd_s", "ratio", "dd1_s", "ratio_dd1", "max_rss_kb", "cpu_percent",
                                                             "busy", "stages", "out_bytes")} for r in rs]}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--data", default=os.path.join(ROOT, "build", "bench-data"))
    ap.add_argument("--python", default=sys.executable, help="a python with numpy, to generate the input once")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shm", default=f"/dev/shm/bfshard-node-{os.getpid()}")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "node.json"))
    ap.add_argument("--cases", default="w8,hf,hf-shards")
    ap.add_argument("--before", default=None, help="another bfshard binary, run in the same rounds (before/after)")
    a = ap.parse_args()
    res = run(os.path.join(a.build, "bfshard"), data_dir(a.data), a.python, a.layers, a.vocab, a.rounds, a.shm, a.cases,
              a.before)
    nproc = res["nproc"]
    for c, x in res["cases"].items():
        print(f"node {c:3s}: {'PASS' if x['pass'] else 'FAIL'} {x['ratio_median']:.2f}x the {nproc}-writer dd floor "
              f"(bar >= {BAR}), {x['gbps_median']:.2f} GB/s vs dd {x['dd_gbps']:.2f} GB/s "
              f"(one dd writer {x['dd1_gbps']:.2f} GB/s: {x['ratio_dd1_median']:.2f}x), peak RSS "
              f"{x['peak_rss_mb']:.0f} MB, CPU {x['cpu_percent']}%, {x['writers']} writer(s), busy {x['busy']}, "
              f"verify {x['verify_s']:.2f} s vs {nproc} xxh128sum {x['xxh128sum_s']:.2f} s")
    print(f"load average {res['loadavg_start']} at the start, {res['loadavg_end']} at the end")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    sys.exit(0 if all(x["pass"] for c, x in res["cases"].items() if not c.endswith("-before")) else 3)


if __name__ == "__main__":
    main()
