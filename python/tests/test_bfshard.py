"""Tests of the installed bfshard Python package (not the source folder).

Run by python/tests/run.sh (`make test-python`) in a fresh venv after `pip install ./python`,
and again after installing the wheel in another venv. Works under pytest or alone:
    python python/tests/test_bfshard.py
BFSHARD_FIXTURES: the fixtures folder (default: this checkout's fixtures/).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import bfshard
from bfshard import _lib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.environ.get("BFSHARD_FIXTURES") or os.path.join(ROOT, "fixtures")
TINY = os.path.join(FIXTURES, "mxfp4-tiny")
PKG = os.path.dirname(os.path.abspath(bfshard.__file__))


def tmpdir():
    return tempfile.mkdtemp(prefix="bfshard-py-")


def rank_files(outdir):
    return sorted(f for f in os.listdir(outdir) if f.endswith(".safetensors"))


def test_installed_not_source():
    assert not PKG.startswith(os.path.join(ROOT, "python") + os.sep), PKG
    assert os.path.isfile(os.path.join(PKG, "_libbfshard.so"))
    assert os.access(os.path.join(PKG, "bin", "bfshard"), os.X_OK)


def test_version_and_layout():
    with open(os.path.join(ROOT, "include", "bfshard.h")) as f:
        want = re.search(r'#define BFS_VERSION_STRING "([^"]+)"', f.read()).group(1)
    assert bfshard.__version__ == want, (bfshard.__version__, want)
    c, py = _lib.c_layout(bfshard._c), _lib.py_layout()
    assert c == py, (c, py)


def test_convert_verify_flip():
    d = tmpdir()
    try:
        out = os.path.join(d, "out")
        seen = []
        res = bfshard.convert(TINY, out, world_size=2, device="cpu", mem="64K", progress=seen.append)
        assert isinstance(res, bfshard.ConvertResult)
        assert res.files_written == 2 and res.tensors > 0 and res.bytes_written > 0, res
        assert res.backend.startswith("cpu"), res
        assert seen and all(isinstance(p, bfshard.Progress) for p in seen)
        assert all(0 <= p.bytes_done <= p.bytes_total == seen[0].bytes_total for p in seen), seen
        assert [p.bytes_done for p in seen] == sorted(p.bytes_done for p in seen)
        assert len(rank_files(out)) == 2

        ok = bfshard.verify(out)
        assert ok.bytes_checked >= res.bytes_written, ok

        # flip one byte of tensor data (the last byte of rank 0's file)
        path = os.path.join(out, rank_files(out)[0])
        with open(path, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            b = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([b[0] ^ 0x01]))
        try:
            bfshard.verify(out)
        except bfshard.VerifyError as e:
            assert isinstance(e, bfshard.Error)
            assert e.code == bfshard.EVERIFY == -7 and e.exit_code == 7 and e.name == "BFS_EVERIFY", e
            assert e.message and "\n" not in e.message, e.message
            assert len(e.problems) == 1 and rank_files(out)[0] in e.problems[0] and "BAD" in e.problems[0], e.problems
        else:
            raise AssertionError("verify passed after a flipped byte")
    finally:
        shutil.rmtree(d)


def test_same_bytes_as_cli():
    d = tmpdir()
    try:
        bfshard.convert(TINY, os.path.join(d, "py"), world_size=3, device="cpu")
        subprocess.run([_lib.CLI, "convert", TINY, os.path.join(d, "cli"), "--world-size", "3",
                        "--device", "cpu", "--quiet"], check=True)
        names = rank_files(os.path.join(d, "py"))
        assert names == rank_files(os.path.join(d, "cli")) and len(names) == 3
        for n in names:
            with open(os.path.join(d, "py", n), "rb") as a, open(os.path.join(d, "cli", n), "rb") as b:
                assert a.read() == b.read(), n
    finally:
        shutil.rmtree(d)


def test_inspect():
    plan = bfshard.inspect(TINY, world_size=3)
    assert isinstance(plan, dict)
    assert plan["world_size"] == 3, plan.keys()
    assert plan["tensors"] and all("name" in t for t in plan["tensors"])
    hf = bfshard.inspect(TINY, world_size=1, layout="hf")
    assert hf["layout"] != plan["layout"] or hf["world_size"] == 1


def test_errors():
    d = tmpdir()
    try:
        try:
            bfshard.convert(os.path.join(d, "missing"), os.path.join(d, "out"))
        except bfshard.VerifyError:
            raise AssertionError("a missing input is not a VerifyError")
        except bfshard.Error as e:
            assert e.code == bfshard.EINPUT and e.exit_code == 3 and "missing" in e.message, repr(e)
        else:
            raise AssertionError("no error for a missing input")

        out = os.path.join(d, "out")
        os.makedirs(out)
        open(os.path.join(out, "something"), "w").close()
        try:
            bfshard.convert(TINY, out)
        except bfshard.Error as e:
            assert e.code == bfshard.EEXIST, repr(e)
        else:
            raise AssertionError("no error for a non-empty OUTDIR")
        bfshard.convert(TINY, out, force=True, device="cpu")
        bfshard.verify(out)

        for bad in ({"layout": "zip"}, {"mem": "12Q"}, {"compress": "gzip"}):
            try:
                bfshard.convert(TINY, os.path.join(d, "x"), **bad)
            except ValueError:
                pass
            else:
                raise AssertionError("no ValueError for %r" % bad)
        try:
            bfshard.convert(TINY, os.path.join(d, "x"), wrld_size=2)
        except TypeError:
            pass
        else:
            raise AssertionError("no TypeError for an unknown option")
        try:
            bfshard.verify(os.path.join(d, "nothing-here"))
        except bfshard.VerifyError:
            raise AssertionError("verify of a missing OUTDIR is not a mismatch")
        except bfshard.Error:
            pass
    finally:
        shutil.rmtree(d)


def test_progress_exception_stops_the_run():
    d = tmpdir()
    try:
        class Stop(Exception):
            pass

        def progress(p):
            raise Stop()

        out = os.path.join(d, "out")
        try:
            bfshard.convert(TINY, out, world_size=2, device="cpu", mem="64K", progress=progress)
        except Stop:
            pass
        else:
            raise AssertionError("the progress callback's exception was not raised")
        # a stopped run leaves no rank file under its final name, and can be run again
        left = rank_files(out) if os.path.isdir(out) else []
        assert len(left) < 2, left
        bfshard.convert(TINY, out, world_size=2, device="cpu", force=True)
        bfshard.verify(out)
    finally:
        shutil.rmtree(d)


def test_cli():
    d = tmpdir()
    try:
        r = subprocess.run([sys.executable, "-m", "bfshard", "--version"], capture_output=True, text=True)
        assert r.returncode == 0 and bfshard.__version__ in r.stdout, r
        exe = shutil.which("bfshard", path=os.path.dirname(sys.executable))
        assert exe, "no bfshard console command beside " + sys.executable
        out = os.path.join(d, "out")
        subprocess.run([exe, "convert", TINY, out, "--world-size", "2", "--quiet"], check=True)
        subprocess.run([sys.executable, "-m", "bfshard", "verify", out, "--quiet"], check=True)
        path = os.path.join(out, rank_files(out)[1])
        with open(path, "r+b") as f:
            f.seek(-2, os.SEEK_END)
            f.write(b"\x55\xaa")
        r = subprocess.run([exe, "verify", out], capture_output=True, text=True)
        assert r.returncode == 7, r
        r = subprocess.run([exe, "frobnicate"], capture_output=True, text=True)
        assert r.returncode == 2, r
    finally:
        shutil.rmtree(d)


def test_bundled():
    """The package carries jansson, xxhash and zstd: nothing of theirs comes from the system."""
    for binary in (os.path.join(PKG, "_libbfshard.so"), os.path.join(PKG, "bin", "bfshard")):
        r = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True)
        for line in r.stdout.splitlines():
            if re.search(r"lib(jansson|xxhash|zstd)", line):
                path = line.split("=>")[-1].split()[0]
                assert os.path.realpath(path).startswith(PKG + os.sep), (binary, line)
            assert "not found" not in line, (binary, line)


def test_hf_cache():
    """A model in a Hugging Face cache laid out as huggingface_hub lays it out (blobs/,
    snapshots/COMMIT/ symlinks into ../../blobs, refs/main): by repo id, the same bytes as
    the snapshot folder; not cached: Error with the download command; result counts."""
    import hashlib
    d = tmpdir()
    commit = "3" * 40
    old = os.environ.get("HF_HUB_CACHE")
    try:
        repo = os.path.join(d, "hub", "models--org--tiny")
        snap = os.path.join(repo, "snapshots", commit)
        os.makedirs(os.path.join(repo, "blobs"))
        os.makedirs(snap)
        os.makedirs(os.path.join(repo, "refs"))
        for name in os.listdir(TINY):
            src = os.path.join(TINY, name)
            with open(src, "rb") as f:
                blob = hashlib.sha256(f.read()).hexdigest()
            shutil.copy2(src, os.path.join(repo, "blobs", blob))
            os.symlink(os.path.join("..", "..", "blobs", blob), os.path.join(snap, name))
        with open(os.path.join(repo, "refs", "main"), "w") as f:
            f.write(commit)
        os.environ["HF_HUB_CACHE"] = os.path.join(d, "hub")
        assert bfshard.resolve("org/tiny") == snap
        assert bfshard.resolve("org/tiny", revision=commit) == snap
        res = bfshard.convert("org/tiny", os.path.join(d, "a"), world_size=2, device="cpu")
        bfshard.convert(snap, os.path.join(d, "b"), world_size=2, device="cpu", revision=None)
        assert res.tensors == res.tensors_dequantized + res.tensors_cast + res.tensors_copied, res
        assert res.tensors_dequantized == 4 and res.tensors_dropped == 4, res
        for name in sorted(os.listdir(os.path.join(d, "a"))):
            with open(os.path.join(d, "a", name), "rb") as f, open(os.path.join(d, "b", name), "rb") as g:
                assert f.read() == g.read(), name
        assert bfshard.inspect("org/tiny", revision="main")["tensors"]
        try:
            bfshard.convert("org/missing", os.path.join(d, "c"))
            raise AssertionError("no error for a model that is not cached")
        except bfshard.Error as e:
            assert e.code == bfshard.EINPUT and "hf download org/missing" in e.message, e
    finally:
        if old is None:
            os.environ.pop("HF_HUB_CACHE", None)
        else:
            os.environ["HF_HUB_CACHE"] = old
        shutil.rmtree(d)


def test_torch_module():
    """bfshard.torch: `import bfshard` never imports torch; without torch, importing
    bfshard.torch says it needs it; with torch, rank_state_dict gives each rank file's tensors
    (mmapped) and refuses a wrong world size in one line. (The FSDP2 checks are `make interop`'s
    tests/interop/loader.py.)"""
    import importlib.util
    import json as _json
    import struct
    if importlib.util.find_spec("torch") is None:
        try:
            importlib.import_module("bfshard.torch")
        except ImportError as e:
            assert "needs PyTorch" in str(e), e
            return
        raise AssertionError("bfshard.torch imported without torch")
    bt = importlib.import_module("bfshard.torch")
    d = tmpdir()
    try:
        out = os.path.join(d, "out")
        bfshard.convert(TINY, out, world_size=2, device="cpu")
        for r, name in enumerate(rank_files(out)):
            assert bt.rank_file_name(r) == name
            sd = bt.rank_state_dict(out, r, world_size=2, verify=False)
            with open(os.path.join(out, name), "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                hdr = _json.loads(f.read(n))
                data = f.read()
            hdr.pop("__metadata__")
            assert set(sd) == set(hdr), (sorted(sd), sorted(hdr))
            for k, e in hdr.items():
                b, t = e["data_offsets"], sd[k]
                assert list(t.shape) == e["shape"], k
                assert t.contiguous().view(-1).view(bt.torch.uint8).numpy().tobytes() == data[b[0]:b[1]], k
        try:
            bt.rank_state_dict(out, 0, world_size=3)
            raise AssertionError("no error for world_size=3")
        except bt.LoadError as e:
            assert isinstance(e, bfshard.Error) and e.code == bfshard.EINPUT, e
            assert "world_size=2" in e.message and "\n" not in e.message, e.message
    finally:
        shutil.rmtree(d)


class _FakeDevice:
    """A device for bfshard._devring: a copy queued on a stream happens when an event after it
    completes (query() now and then, synchronize() always), reading its host buffer then, as a
    DMA does: a buffer refilled before its copies completed gives wrong bytes."""

    def __init__(self, seed, fail_copy_at=None):
        import random
        self.rng = random.Random(seed)
        self.queues = {}
        self.copies = 0
        self.fail_copy_at = fail_copy_at
        self.streams_used = set()

    def copy_async(self, buf, boff, n, dst, doff, stream):
        if self.copies == self.fail_copy_at:
            raise bfshard.Error(bfshard.EINPUT, "fake device: copy %d failed" % self.copies)
        self.copies += 1
        self.streams_used.add(stream)
        ev = _FakeEvent(self, stream)
        self.queues.setdefault(stream, []).append((buf, boff, n, dst, doff, ev))
        return ev

    def run_until(self, stream, ev):
        q = self.queues.get(stream, [])
        while not ev.done:
            buf, boff, n, dst, doff, e = q.pop(0)
            dst[doff:doff + n] = bytes(buf[boff:boff + n])
            e.done = True

    def pending(self):
        return sum(len(q) for q in self.queues.values())


class _FakeEvent:
    def __init__(self, dev, stream):
        self.dev, self.stream, self.done = dev, stream, False

    def query(self):
        if not self.done and self.dev.rng.random() < 0.3:
            self.dev.run_until(self.stream, self)
        return self.done

    def synchronize(self):
        self.dev.run_until(self.stream, self)


def test_device_ring():
    """bfshard._devring (the loader's path into GPU shards) on a fake device: every destination
    byte equals the file's through a few host buffers reused on events, the buffers never above
    max_host_bytes, fills spread over the streams and read in order; a read failing mid-way
    (a truncated file, read by bfs_read_ranges) and a failing copy are raised once, one line,
    after every queued copy was waited for."""
    import ctypes
    import random
    from bfshard import _devring
    d = tmpdir()
    try:
        path = os.path.join(d, "rank.bin")
        data = random.Random(1).randbytes(3 << 20)
        with open(path, "wb") as f:
            f.write(data)
        rng = random.Random(2)
        # tensors: (file offset, length), some adjacent, some with gaps, one larger than a buffer
        tensors, off = [], 100
        while off < len(data) - 300000:
            n = rng.choice((1, 7, 4096, 65536, 300000, 1 << 20))
            n = min(n, len(data) - off)
            tensors.append((off, n))
            off += n + rng.choice((0, 0, 64, 1000))

        def read_into(buf, ranges):
            base = ctypes.addressof(buf)
            arr = (_lib.Range * len(ranges))(*[_lib.Range(o, n, base + b) for o, n, b in ranges])
            rc = bfshard._c.bfs_read_ranges(os.fsencode(path), arr, len(ranges), 2)
            if rc < 0:
                raise bfshard.Error(rc, bfshard._c.bfs_last_error().decode())
            reads.append([o for o, _, _ in ranges])

        for budget, seed in ((1 << 20, 3), (300000, 4), (5 << 20, 5), (65536, 6), (4096, 7)):
            dsts = [bytearray(n) for _, n in tensors]
            made = []

            def alloc(n):
                made.append(n)
                assert sum(made) <= budget, (made, budget)
                return (ctypes.c_ubyte * n)()

            reads = []
            dev = _FakeDevice(seed)
            moved = _devring.run([(o, n, dsts[i], 0) for i, (o, n) in enumerate(tensors)], max_host_bytes=budget,
                                 streams=["s0", "s1"], alloc=alloc, read_into=read_into, copy_async=dev.copy_async)
            assert moved == sum(n for _, n in tensors)
            assert dev.pending() == 0
            for (o, n), dst in zip(tensors, dsts):
                assert bytes(dst) == data[o:o + n], (budget, o, n)
            flat = [o for r in reads for o in r]
            assert flat == sorted(flat), "fills not read in file order"
            if len(reads) > 1:
                assert dev.streams_used == {"s0", "s1"}, dev.streams_used

        # a read failing mid-way: the file cut after the checks
        with open(path, "r+b") as f:
            f.truncate(len(data) // 2)
        for seed in range(3):
            dsts = [bytearray(n) for _, n in tensors]
            reads = []
            dev = _FakeDevice(seed)
            try:
                _devring.run([(o, n, dsts[i], 0) for i, (o, n) in enumerate(tensors)], max_host_bytes=1 << 20,
                             streams=["s0", "s1"], alloc=lambda n: (ctypes.c_ubyte * n)(), read_into=read_into,
                             copy_async=dev.copy_async)
                raise AssertionError("no error for a truncated file")
            except bfshard.Error as e:
                assert path in e.message and "the file ends at offset %d" % (len(data) // 2) in e.message, e.message
                assert "\n" not in e.message
            assert dev.pending() == 0, "returned with copies still queued from its buffers"
        # a copy failing mid-way
        with open(path, "wb") as f:
            f.write(data)
        dev = _FakeDevice(9, fail_copy_at=5)
        reads = []
        try:
            _devring.run([(o, n, bytearray(n), 0) for o, n in tensors], max_host_bytes=1 << 20, streams=["s0", "s1"],
                         alloc=lambda n: (ctypes.c_ubyte * n)(), read_into=read_into, copy_async=dev.copy_async)
            raise AssertionError("no error for a failed copy")
        except bfshard.Error as e:
            assert "copy 5 failed" in e.message, e.message
        assert dev.pending() == 0
        # the buffers' plan: within the budget, two or more where it allows
        for budget in (1, 1000, 1 << 20, 1 << 30, 1 << 40):
            n, size = _devring.plan_buffers(budget, 10 << 30)
            assert n * size <= budget and n >= 1 and size <= _devring.BUF_MAX, (budget, n, size)
            assert budget < 2 or n >= 2, (budget, n, size)
        assert _devring.plan_buffers(1 << 30, 0) == (0, 0)
    finally:
        shutil.rmtree(d)


def main():
    tests = [(k, v) for k, v in sorted(globals().items()) if k.startswith("test_") and callable(v)]
    for name, fn in tests:
        print("==", name, flush=True)
        fn()
    print("test_bfshard: %d tests passed (%s)" % (len(tests), PKG))


if __name__ == "__main__":
    main()
