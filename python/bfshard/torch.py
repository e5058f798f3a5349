"""Load bfshard's pre-sharded `--layout dcp` output into PyTorch: each rank reads its own file.

    import bfshard.torch
    bfshard.torch.load(model, "/ckpt/w8")          # model sharded with FSDP2 fully_shard
    sd = bfshard.torch.rank_state_dict("/ckpt/w8", rank)   # {name: tensor}, mmapped, no copy

bfshard wrote rank r's rows of every tensor into its own file
(`shard-{r+1:05d}-model-00001-of-00001.safetensors`) with FSDP2's `Shard(0)` / `torch.chunk`
rule (chunk = ceil(d0 / W); 0-d tensors, and the model's buffers under target names, whole on
rank 0), so a rank needs nothing but that file (and rank 0's for those):
no coordinator, no collective, no other rank file's header (torch's
`HuggingFaceStorageReader.read_metadata()`, which `dcp.load` runs first, parses all W of them).
Time and memory grow with the rank's own tensors, not with W.

load() checks everything before it copies a byte and raises bfshard.torch.LoadError (a
bfshard.Error, code EINPUT) with one line naming the tensor: the mesh's shard dimension against
the manifest's `options.world_size`; the placement (`Shard(0)`, over a 1-D mesh or HSDP's 2-D
mesh; `Replicate` only for a 0-d tensor); each local shard's shape against `torch.chunk` and
against the file's entry, and its dtype (no casts but BF16 into a float32 tensor, exact, and F32 into a bfloat16 one, rounded as
dcp.load's copy_ rounds it, with a warning); names in the model and not in the checkpoint
(always an error, as for `dcp.load`) and the reverse (an error when strict); a rank file shorter
than its header says (truncated). verify=True also hashes this rank's file (XXH3-128) as it
reads it, in the same pass (bfs_read_ranges_xxh128), and raises bfshard.VerifyError when the
hash is not the manifest's (one line: the file, both hashes, the tensor or header its slice
index narrows it to); the model then holds the bytes read, unverified (`bfshard verify` first
leaves a model untouched by a damaged file). Non-persistent buffers (rotary `inv_freq`) are not
in `state_dict()` and are left alone, as `dcp.load` leaves them.

Once the checks pass, each local shard that is a contiguous CPU tensor of the file's dtype gets
its bytes read from the rank file straight into it (pread(2), several threads, one call into the
C library: bfs_read_ranges); such a shard on a CUDA device is read into a ring of pinned host
buffers (at most max_host_bytes together) and copied to it asynchronously (bfshard._devring);
casts, 0-d tensors and other shards are copied from the mapping (docs/LOADING.md).

The tensor names are matched as they are: whatever names the output has (packed MoE experts
included) must be the model's state_dict names. Outputs with a version 1 manifest, and a
conversion in parts not merged yet (bfshard.part-*.json only), load the same way; with a merged
version 2 manifest, load() also checks every name, global shape and dtype against its tensor
list, so every rank reaches the same verdict. A rank file that is only present as its
compressed copy (`bfshard compress --rm`: NAME.zst or NAME.bfz) is read by load() through the
seekable reader (bfs_read_ranges_zst: only the frames holding the shards decoded, by several
threads, straight into them; casts and 0-d tensors from bounded temporaries), never copied to
disk, verify=True included (bfs_read_ranges_zst_xxh128 decodes every frame then, hashing the
decompressed file); for rank_state_dict it is decompressed whole into a temporary file (TMPDIR:
on tmpfs that is memory), mapped and unlinked. rank_state_dict(verify=True), and the slices of
rank 0's 0-d tensors another rank reads, hash with the `xxhash` package when importable, else
the system's libxxhash through ctypes.

Needs torch; `import bfshard` does not import this module (nor torch).
"""
import ctypes
import ctypes.util
import json
import math
import mmap
import os
import re
import shutil
import stat
import struct
import tempfile
import threading
import time
import warnings
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple, Union

try:
    import torch
except ImportError as _e:  # pragma: no cover - the message is the point
    raise ImportError("bfshard.torch needs PyTorch (pip install torch); `import bfshard` alone does not") from _e

import bfshard as _bfs
from bfshard import _devring

__all__ = ["load", "rank_state_dict", "rank_file_name", "LoadError", "LoadResult"]

MANIFEST = "bfshard.manifest.json"
PathLike = Union[str, "os.PathLike[str]"]

# safetensors dtype -> torch dtype (those this torch has)
_DTYPES: Dict[str, "torch.dtype"] = {}
for _k, _v in (("BF16", "bfloat16"), ("F16", "float16"), ("F32", "float32"), ("F64", "float64"),
               ("I8", "int8"), ("I16", "int16"), ("I32", "int32"), ("I64", "int64"), ("U8", "uint8"),
               ("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64"), ("BOOL", "bool"),
               ("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"), ("F8_E8M0", "float8_e8m0fnu"),
               ("C64", "complex64")):
    if hasattr(torch, _v):
        _DTYPES[_k] = getattr(torch, _v)
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}


class LoadError(_bfs.Error):
    """The checkpoint does not fit the model (or is damaged). .message is one line naming the
    tensor; .problems lists every problem found (the message names the first and counts the rest)."""

    def __init__(self, message: str, problems: Optional[List[str]] = None):
        super().__init__(_bfs.EINPUT, message)
        self.problems = list(problems or [message])


class LoadResult(NamedTuple):
    rank: int                # the rank file read (the shard-dimension coordinate of the mesh)
    world_size: int
    tensors: int             # tensors copied into the model
    bytes: int               # bytes copied
    files: List[str]         # rank files read: this rank's, and rank 0's for 0-d tensors (NAME.zst / NAME.bfz
                             # for one read through its compressed copy)
    unexpected: List[str]    # checkpoint tensors not in the model (only with strict=False)
    seconds: float
    bytes_read: int = 0      # of `bytes`, those read from the file straight into the model (pread, threads;
                             # or decoded from a compressed copy's frames: uncompressed bytes)


def _fail(problems: List[str]) -> "LoadError":
    msg = problems[0]
    if len(problems) > 1:
        msg += " (and %d more problem%s)" % (len(problems) - 1, "s" if len(problems) > 2 else "")
    return LoadError(msg.replace("\n", " "), problems)


def rank_file_name(rank: int) -> str:
    """The dcp rank file of `rank` (0-based)."""
    return "shard-%05d-model-00001-of-00001.safetensors" % (rank + 1)


# ---- the manifest ------------------------------------------------------------------------------

def _parse_ranks(s: str) -> List[int]:
    out: List[int] = []
    for part in str(s).split(","):
        a, _, b = part.strip().partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def _read_head(path: str) -> Dict[str, Any]:
    """The manifest's members before `tensors` (options, files, ...), without parsing the tensor
    list (bfshard writes the head first: docs/MANIFEST.md); the whole file when that fails."""
    marker = b'\n "tensors": ['
    with open(path, "rb") as f:
        buf = b""
        while True:
            chunk = f.read(1 << 20)
            buf += chunk
            i = buf.find(marker)
            if i >= 0:
                head = buf[:i].rstrip()
                if head.endswith(b","):
                    try:
                        return json.loads(head[:-1] + b"\n}")
                    except ValueError:
                        pass
                break
            if not chunk:
                break
    with open(path, "rb") as f:
        return json.load(f)


def _part_tail(path: str) -> Dict[str, Any]:
    with open(path, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - 65536))
        tail = f.read()
    m = re.search(rb'\n "part": (\{[^{}]*\})', tail)
    try:
        return json.loads(m.group(1)) if m else {}
    except ValueError:
        return {}


class _Manifest:
    def __init__(self, outdir: str, rank: Optional[int]):
        self.outdir = outdir
        path = os.path.join(outdir, MANIFEST)
        self.part = False
        if not os.path.isfile(path):
            # a conversion in parts not merged yet: the part manifest holding this rank
            parts = sorted(f for f in os.listdir(outdir) if f.startswith("bfshard.part-") and f.endswith(".json"))
            if not parts:
                raise LoadError("%s: no %s (not a bfshard output, or one still being written)" % (outdir, MANIFEST))
            path = None
            for p in parts:
                h = _read_head(os.path.join(outdir, p))
                if "part" not in h:  # version 1 parts write it after the tensor list: the file's tail
                    h["part"] = _part_tail(os.path.join(outdir, p))
                if rank is None or rank in _parse_ranks((h.get("part") or {}).get("ranks", "")):
                    path = os.path.join(outdir, p)
                    head = h
                    break
            if path is None:
                raise LoadError("%s: no %s, and no part manifest holds rank %d (%s)"
                                % (outdir, MANIFEST, rank, ", ".join(parts)))
            self.part = True
        else:
            head = _read_head(path)
        self.path = path
        self.head = head
        opts = head.get("options") or {}
        ws = opts.get("world_size", (head.get("part") or {}).get("world_size"))
        if not isinstance(ws, int) or ws < 1:
            raise LoadError("%s: no options.world_size" % path)
        self.world_size = ws
        self.layout = opts.get("layout", "dcp")
        if self.layout != "dcp":
            raise LoadError("%s: layout %r: bfshard.torch loads --layout dcp outputs (an hf output loads with "
                            "from_pretrained)" % (outdir, self.layout))
        self.files = {f.get("name"): f for f in head.get("files") or [] if isinstance(f, dict)}

    def weights_entry(self, rank: int) -> Optional[Dict[str, Any]]:
        for f in self.files.values():
            if f.get("kind") == "weights" and f.get("rank") == rank:
                return f
        return self.files.get(rank_file_name(rank))

    def slices_entry(self, weights_name: str) -> Tuple[str, Optional[Dict[str, Any]]]:
        for f in self.files.values():
            if f.get("kind") == "slices" and f.get("of") == weights_name:
                return f["name"], f
        base = weights_name[:-len(".safetensors")] if weights_name.endswith(".safetensors") else weights_name
        return base + ".slices", self.files.get(base + ".slices")

    _LINE = re.compile(rb'^  \{"name": ("(?:[^"\\]|\\.)*"), "dtype": "([A-Za-z0-9_]+)", "shape": \[([0-9, ]*)\]',
                       re.M)

    def tensors(self) -> Optional[Dict[str, Tuple[str, Tuple[int, ...]]]]:
        """{name: (dtype, global shape)} of every output tensor, from a merged manifest's one-line
        tensor records (regex, not a JSON tree); None for a part's manifest (its share only)."""
        if self.part or not isinstance(self.head.get("manifest_version"), int) or self.head["manifest_version"] < 2:
            return None  # a version 1 manifest lists (tensor, rank) records, up to GBs: the rank files say enough
        with open(self.path, "rb") as f:
            text = f.read()
        i = text.find(b'\n "tensors": [')
        if i < 0:
            return None
        out: Dict[str, Tuple[str, Tuple[int, ...]]] = {}
        for m in self._LINE.finditer(text, i):
            raw = m.group(1)
            name = json.loads(raw) if b"\\" in raw else raw[1:-1].decode()
            shape = tuple(int(x) for x in m.group(3).split(b",") if x.strip())
            out[name] = (m.group(2).decode(), shape)
        # records this scan did not read (another layout): the JSON tree, once
        if len(out) != text.count(b'\n  {"name": ', i) or not out and not re.match(rb'\n "tensors": \[\s*\]', text[i:]):
            try:
                full = json.loads(text)
                out = {t["name"]: (t["dtype"], tuple(t["shape"])) for t in full.get("tensors", [])
                       if isinstance(t, dict) and "name" in t and "shape" in t and "dtype" in t}
            except (ValueError, KeyError, TypeError):
                return None
        return out


# ---- XXH3-128 (verify=True) --------------------------------------------------------------------

class _XXH128(ctypes.Structure):
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]


_HASHER = None


def _hasher():
    """hash(address, length) -> canonical hex: the `xxhash` package when importable, else the
    system's libxxhash through ctypes (bfshard's own copy is linked in hidden)."""
    global _HASHER
    if _HASHER is not None:
        return _HASHER
    try:
        import xxhash  # type: ignore

        def h(addr, n):
            return xxhash.xxh3_128_hexdigest((ctypes.c_char * n).from_address(addr) if n else b"")
        _HASHER = h
        return h
    except ImportError:
        pass
    for name in (ctypes.util.find_library("xxhash"), "libxxhash.so.0", "libxxhash.so"):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            f = lib.XXH3_128bits
        except (OSError, AttributeError):
            continue
        f.restype = _XXH128
        f.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

        def h(addr, n, f=f):
            r = f(addr, n)
            return "%016x%016x" % (r.high64, r.low64)
        _HASHER = h
        return h
    raise LoadError("verify=True needs XXH3-128: pip install xxhash (or install libxxhash); "
                    "or run `bfshard verify OUTDIR` (every file)")


def _hash_bytes(data: bytes) -> str:
    buf = ctypes.create_string_buffer(data, len(data)) if data else None
    return _hasher()(ctypes.addressof(buf) if buf is not None else 0, len(data))


# ---- one rank file -----------------------------------------------------------------------------

class _RankFile:
    """A rank file mapped copy-on-write (MAP_PRIVATE: tensors are writable, the file is never
    changed), or only its compressed copy opened for the seekable reader (stream); its header
    parsed and checked against the file's size."""

    def __init__(self, outdir: str, name: str, entry: Optional[Dict[str, Any]], stream: bool = False):
        """stream=True: a rank file only present as its compressed copy is read through the
        seekable reader (self.zst; no mapping, tensor() gives meta tensors); else it is
        decompressed whole into TMPDIR and mapped, as rank_state_dict needs."""
        self.name = name
        self.path = os.path.join(outdir, name)
        self.entry = entry
        self.from_zst = None  # the compressed copy the bytes come from
        self.zst = None       # ... when read through it (stream), not decompressed whole
        self.mm = None
        path = self.path
        if not os.path.exists(path):
            z = (entry or {}).get("zst") or {}
            cands = [z.get("name")] if z.get("name") else []
            cands += [name + ".zst", name + ".bfz"]
            zpath = next((os.path.join(outdir, c) for c in cands if os.path.isfile(os.path.join(outdir, c))), None)
            if zpath is None:
                raise LoadError("%s: no such file (nor a compressed copy)" % self.path)
            self.from_zst = zpath
            if stream:
                self.zst = zpath
            else:
                path = self._decompress(zpath)
        self.rpath = self.zst or self.path  # the file read (by pread or the seekable reader)
        if self.zst:
            head = self._zst_open()
        else:
            head = self._map(path)
        n = struct.unpack_from("<Q", head, 0)[0]
        if n > self.size - 8:
            raise LoadError("%s: truncated: its header says %d bytes of JSON, the file has %d bytes"
                            % (self.path, n, self.size))
        self.data_start = 8 + n
        if self.zst:
            head = self._zst_read(0, 8 + n)
        try:
            hdr = json.loads(head[8:8 + n])
        except ValueError as e:
            raise LoadError("%s: bad safetensors header: %s" % (self.path, e)) from None
        if not isinstance(hdr, dict):
            raise LoadError("%s: bad safetensors header: not a JSON object" % self.path)
        meta = hdr.pop("__metadata__", None) or {}
        self.metadata = meta
        self.entries: Dict[str, Tuple[str, Tuple[int, ...], int, int]] = {}
        end_max, end_name = 0, None
        for k, v in hdr.items():
            try:
                dt, shape, (b, e) = v["dtype"], tuple(v["shape"]), v["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise LoadError("%s: tensor %r: bad header entry %r" % (self.path, k, v)) from None
            tdt = _DTYPES.get(dt)
            if tdt is None:
                raise LoadError("%s: tensor %r: dtype %s is not one this torch knows" % (self.path, k, dt))
            numel = math.prod(shape)
            if not (isinstance(b, int) and isinstance(e, int) and 0 <= b <= e) or \
                    e - b != numel * tdt.itemsize or any(not isinstance(d, int) or d < 0 for d in shape):
                raise LoadError("%s: tensor %r: data_offsets %r do not hold %s %s"
                                % (self.path, k, [b, e], dt, list(shape)))
            self.entries[k] = (dt, shape, b, e)
            if e > end_max:
                end_max, end_name = e, k
        if self.data_start + end_max > self.size:
            raise LoadError("%s: truncated: tensor %s ends at byte %d, the file has %d bytes"
                            % (self.path, json.dumps(end_name), self.data_start + end_max, self.size))
        want = (entry or {}).get("size")
        # a part's manifest lists another part's files unhashed, their size unknown (0)
        known = entry is not None and not (entry.get("xxh3_128") is None and "xxh3_128" in entry)
        if known and isinstance(want, int) and want != self.size:
            raise LoadError("%s: %d bytes, the manifest says %d (%s)" % (
                self.path, self.size, want, "truncated" if self.size < want else "changed"))
        self._offsets = None
        self.buf = torch.frombuffer(self.mm, dtype=torch.uint8) if self.mm is not None else None

    def _map(self, path: str) -> Any:
        """Map the rank file (or its whole decompressed copy, unlinked once mapped); its mapping."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not hang us
        except OSError as e:
            raise LoadError("%s: %s" % (self.path, e.strerror)) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise LoadError("%s: not a regular file" % self.path)
            self.size = st.st_size
            self.ident = (st.st_dev, st.st_ino)  # the file checked: the one read by path later
            if self.from_zst:
                os.unlink(path)  # the mapping keeps the bytes
                os.rmdir(os.path.dirname(path))
            if self.size < 8:
                raise LoadError("%s: truncated: %d bytes, not even a safetensors header length" % (self.path, self.size))
            self.mm = mmap.mmap(fd, self.size, access=mmap.ACCESS_COPY)
        finally:
            os.close(fd)
        return self.mm

    def _zst_open(self) -> bytes:
        """The compressed copy's decompressed size (from its seek table) and first 8 bytes."""
        try:
            st = os.stat(self.zst)
        except OSError as e:
            raise LoadError("%s: %s" % (self.zst, e.strerror)) from None
        self.ident = (st.st_dev, st.st_ino)
        c = _bfs._c
        size = ctypes.c_uint64(0)
        if c.bfs_zst_uncompressed_size(os.fsencode(self.zst), ctypes.byref(size)) < 0:
            raise LoadError((c.bfs_last_error() or b"").decode(errors="replace").replace("\n", " ")
                            or "%s: not a readable compressed copy" % self.zst)
        self.size = size.value
        if self.size < 8:
            raise LoadError("%s: truncated: %d bytes, not even a safetensors header length" % (self.zst, self.size))
        return self._zst_read(0, 8)

    def _zst_read(self, off: int, n: int) -> bytes:
        buf = ctypes.create_string_buffer(max(n, 1))
        _read_ranges(self.zst, [(off, n, ctypes.addressof(buf))], 1, zst=True)
        return buf.raw[:n]

    @staticmethod
    def _decompress(zpath: str) -> str:
        c = _bfs._c
        fn = c.bfs_decompress_file
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p]
        d = tempfile.mkdtemp(prefix="bfshard-rank-")
        out = os.path.join(d, "rank.safetensors")
        rc = fn(os.fsencode(zpath), os.fsencode(out))
        if rc < 0:
            shutil.rmtree(d, ignore_errors=True)
            raise LoadError("%s: cannot decompress: %s" % (zpath, (c.bfs_last_error() or b"").decode(errors="replace")))
        return out

    def offsets(self, name: str) -> Optional[List[int]]:
        if self._offsets is None:
            try:
                info = json.loads(self.metadata.get("DCP_SHARDING_INFO") or "{}")
            except ValueError:
                raise LoadError("%s: DCP_SHARDING_INFO is not JSON" % self.path) from None
            self._offsets = info if isinstance(info, dict) else {}
        o = self._offsets.get(name)
        return o.get("saved_offsets") if isinstance(o, dict) else None

    def tensor(self, name: str) -> "torch.Tensor":
        """The tensor over the mapping; read through the compressed copy (no mapping): a meta
        tensor of its dtype and shape (load() reads its bytes)."""
        dt, shape, b, e = self.entries[name]
        if self.buf is None:
            return torch.empty(shape, dtype=_DTYPES[dt], device="meta")
        raw = self.buf[self.data_start + b:self.data_start + e]
        tdt = _DTYPES[dt]
        try:
            return raw.view(tdt).view(shape)
        except RuntimeError:  # data not aligned to its element size (not bfshard's output): copy
            return raw.clone().view(tdt).view(shape)

    # -- verify --
    def _addr(self, a: int) -> int:
        return self.buf.data_ptr() + a

    def _hash_span(self, a: int, n: int) -> str:
        """XXH3-128 of the file's bytes [a, a + n): from the mapping, or read through the
        compressed copy (a file read through it has no mapping)"""
        if self.buf is not None:
            return _hasher()(self._addr(a), n)
        return _hash_bytes(self._zst_read(a, n) if n else b"")

    def verify(self, names: Optional[List[str]] = None) -> None:
        """The whole file against its manifest hash (names None), or only the header and the
        slices of `names` against the slice index (rank 0's 0-d tensors read by another rank)."""
        e = self.entry or {}
        problems: List[str] = []
        if names is None:
            want = e.get("xxh3_128")
            if not want:
                raise _bfs.VerifyError(_bfs.EVERIFY, "%s: the manifest has no hash for it" % self.path,
                                       ["%s: no hash in the manifest" % self.path])
            got = _hasher()(self._addr(0), self.size)
            if got == want:
                return
            problems = self._narrow(None) or ["%s: BAD (hash %s, manifest %s)" % (self.path, got, want)]
        else:
            problems = self._narrow(names, strict_index=True)
            if not problems:
                return
        raise _bfs.VerifyError(_bfs.EVERIFY, problems[0] + (
            " (and %d more)" % (len(problems) - 1) if len(problems) > 1 else ""), problems)

    def _narrow(self, names: Optional[List[str]], strict_index: bool = False) -> List[str]:
        outdir = os.path.dirname(self.path)
        man = getattr(self, "manifest", None)
        sname, sentry = man.slices_entry(self.name) if man else (self.name[:-12] + ".slices", None)
        spath = os.path.join(outdir, sname)
        why = None
        try:
            with open(spath, "rb") as f:
                idx = f.read()
        except OSError as ex:
            idx, why = None, "slice index %s: %s" % (sname, ex.strerror)
        if idx is not None:
            if sentry and sentry.get("xxh3_128") and _hash_bytes(idx) != sentry["xxh3_128"]:
                why = "slice index %s does not match the manifest" % sname
            elif len(idx) < 48 or idx[:8] != b"BFSLICES" or struct.unpack_from("<I", idx, 8)[0] != 1 or \
                    len(idx) != 48 + 16 * struct.unpack_from("<Q", idx, 40)[0]:
                why = "slice index %s is not one (format 1)" % sname
        if why:
            return ["%s: BAD, not narrowed to tensors: %s" % (self.path, why)]
        ds, = struct.unpack_from("<Q", idx, 16)
        count, = struct.unpack_from("<Q", idx, 40)
        if ds != self.data_start or self._hash_span(0, ds) != idx[24:40].hex():
            return ["%s: BAD header or metadata bytes [0, %d)" % (self.path, self.data_start)]
        if count != len(self.entries):  # the header matches the index: cannot happen unless the index lies
            return ["%s: BAD, not narrowed to tensors: slice index %s lists %d slices, the header %d"
                    % (self.path, sname, count, len(self.entries))]
        order = sorted(self.entries.items(), key=lambda kv: (kv[1][2], kv[1][3]))
        want = set(names) if names is not None else None
        out = []
        for i, (k, (_, _, b, e)) in enumerate(order):
            if want is not None and k not in want:
                continue
            got = self._hash_span(self.data_start + b, e - b)
            ref = idx[48 + 16 * i:64 + 16 * i].hex()
            if got != ref:
                out.append("%s: BAD tensor %s bytes [%d, %d) (hash %s, manifest %s)" % (
                    self.path, json.dumps(k), self.data_start + b, self.data_start + e, got, ref))
        if not out and names is None:
            out.append("%s: BAD: every tensor and the header match its slice index; the bytes between "
                       "them (padding) differ" % self.path)
        return out


def _open_rank(man: _Manifest, rank: int, stream: bool = False) -> _RankFile:
    entry = man.weights_entry(rank)
    name = entry["name"] if entry and entry.get("name") else rank_file_name(rank)
    rf = _RankFile(man.outdir, name, entry, stream)
    rf.manifest = man
    return rf


def _manifest_for(outdir: PathLike, rank: int, world_size: Optional[int]) -> _Manifest:
    outdir = os.fspath(outdir)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise LoadError("rank must be an int >= 0, got %r" % (rank,))
    man = _Manifest(outdir, rank)
    if world_size is not None and world_size != man.world_size:
        raise LoadError("world_size: %d asked for, %s was converted for world_size=%d (%s)"
                        % (world_size, outdir, man.world_size, os.path.basename(man.path)))
    if rank >= man.world_size:
        raise LoadError("rank %d: %s was converted for world_size=%d (ranks 0..%d)"
                        % (rank, outdir, man.world_size, man.world_size - 1))
    return man


def rank_state_dict(outdir: PathLike, rank: int, *, world_size: Optional[int] = None,
                    verify: bool = False) -> Dict[str, "torch.Tensor"]:
    """{name: tensor} of rank `rank`'s rows, from its own rank file only: CPU tensors over a
    copy-on-write mapping of the file (nothing is read until used; writing to one never changes
    the file). 0-d tensors are in rank 0's file, so in rank 0's dict only. world_size, when
    given, must match the manifest's; verify=True re-hashes the file against the manifest first
    (bfshard.VerifyError when it differs, naming the tensor)."""
    man = _manifest_for(outdir, rank, world_size)
    rf = _open_rank(man, rank)
    if verify:
        rf.verify()
    return {k: rf.tensor(k) for k in rf.entries}


# ---- load into a model -------------------------------------------------------------------------

def _placement(v, name: str, cache: Dict[Any, Any], problems: List[str]) -> Optional[Tuple[int, int]]:
    """(shard-dimension coordinate, its size) of a DTensor, or None when it is not Shard(0) on one
    mesh dimension (with Replicate on the others); a 0-d tensor may be replicated: (-1, 0).
    Cached per (mesh, placements): a model has one or two of those and tens of thousands of tensors."""
    mesh, pls = v.device_mesh, tuple(v.placements)
    key = (id(mesh), pls, v.dim() == 0)
    hit = cache.get(key)
    if hit is not None and hit[0] is mesh:
        return hit[1]
    res = _placement1(v, name, problems)
    if res is not None:
        cache[key] = (mesh, res)
    return res


def _placement1(v, name: str, problems: List[str]) -> Optional[Tuple[int, int]]:
    from torch.distributed.tensor import Replicate, Shard
    pls = tuple(v.placements)
    shard = [i for i, p in enumerate(pls) if isinstance(p, Shard)]
    other = [p for p in pls if not isinstance(p, (Shard, Replicate))]
    if v.dim() == 0 and not shard and not other:
        return (-1, 0)
    if len(shard) != 1 or other or pls[shard[0]].dim != 0 or type(pls[shard[0]]).__name__ != "Shard":
        problems.append("%s: placement %s on a %d-D mesh: bfshard's files hold each rank's rows of dim 0 "
                        "(FSDP2 fully_shard: Shard(0), or HSDP (Replicate(), Shard(0)))%s" % (
                            name, list(pls), v.device_mesh.ndim,
                            "; a replicated tensor is read whole by dcp.load" if not shard else ""))
        return None
    i = shard[0]
    mesh = v.device_mesh
    return mesh.get_local_rank(i), mesh.size(i)


def _upcast(file_dtype: str, dtype: "torch.dtype") -> bool:
    """The two casts load() makes, both as dcp.load's `copy_` makes them: BF16 in the file into a
    float32 tensor (exact: a module the model keeps in float32, from a checkpoint cast to BF16),
    and F32 in the file into a bfloat16 tensor (rounded to nearest even: a tensor the model keeps
    in float32, which bfshard writes as stored, loaded into a model built all in bfloat16;
    load() warns, naming it: keep those modules in float32, README's recipe)."""
    return (file_dtype == "BF16" and dtype == torch.float32) or (file_dtype == "F32" and dtype == torch.bfloat16)


def _read_ranges(path: str, ranges: List[Tuple[int, int, int]], threads: int, zst: bool = False,
                 size: Optional[int] = None) -> Optional[str]:
    """(file offset, length, destination address) of path, read by bfs_read_ranges (pread(2) from
    `threads` threads, the GIL released), or, zst=True, of the file the seekable zstd copy at path
    decompresses to, by bfs_read_ranges_zst (only the frames holding them decoded, by `threads`
    threads); LoadError with its one line on failure. size given: the same in one pass with the
    whole file's XXH3-128 (bfs_read_ranges_xxh128 / bfs_read_ranges_zst_xxh128: the file must have
    size bytes, the ranges sorted by offset, none overlapping), returned as hex. On the main thread
    the call runs on a helper thread, so that Ctrl-C (KeyboardInterrupt) is noticed: it cancels the
    read (bfs_cancel) and is raised again once the reading threads have stopped."""
    lib = _bfs._c
    arr = (_bfs._lib.Range * len(ranges))(*[_bfs._lib.Range(o, n, d) for o, n, d in ranges])
    out: List[Tuple[int, bytes]] = []
    hexbuf = ctypes.create_string_buffer(33) if size is not None else None

    def work() -> None:
        if size is None:
            fn = lib.bfs_read_ranges_zst if zst else lib.bfs_read_ranges
            rc = fn(os.fsencode(path), arr, len(ranges), threads)
        else:
            fn = lib.bfs_read_ranges_zst_xxh128 if zst else lib.bfs_read_ranges_xxh128
            rc = fn(os.fsencode(path), arr, len(ranges), threads, size, ctypes.addressof(hexbuf))
        out.append((rc, (lib.bfs_last_error() or b"") if rc < 0 else b""))  # the message is per thread

    if threading.current_thread() is not threading.main_thread():
        work()
    else:
        t = threading.Thread(target=work, name="bfshard-read", daemon=True)
        t.start()
        try:
            while t.is_alive():
                t.join(0.1)
        except BaseException:
            lib.bfs_cancel()
            t.join()
            raise
    rc, msg = out[0]
    if rc < 0:
        raise LoadError(msg.decode(errors="replace").replace("\n", " ")
                        or "%s: read failed (%s)" % (path, lib.bfs_err_name(rc).decode()))
    return hexbuf.value.decode() if hexbuf is not None else None


def _direct(plan: List[Tuple[str, "torch.Tensor", "torch.Tensor", "_RankFile"]]) -> Tuple[list, list, list]:
    """Split the plan into what is read from the file straight into the model's host memory,
    [(file, [(offset, length, address)], [tensor])] by offset; what is read into CUDA shards
    through the pinned ring, [(file, [(offset, length, tensor)])] by offset, one entry a file and
    device; and what is copied with copy_ (a cast, a destination neither a contiguous CPU nor a
    contiguous CUDA tensor, a 0-d tensor, a destination overlapping another's: those keep copy_'s
    order; from the mapping, or from a temporary read through a compressed copy: _copy_slow).
    A file read through its compressed copy (f.zst) is split the same way. The ranges of a file
    are sorted by offset, its tensors (written) in the same order."""
    cand, slow = [], []
    for i, (k, local, src, f) in enumerate(plan):
        if ((f.from_zst is None or f.zst is not None) and local.device.type in ("cpu", "cuda") and local.dtype == src.dtype
                and local.dim() > 0 and local.is_contiguous() and local.numel() > 0):
            cand.append(i)
        else:
            slow.append(i)
    # destinations that overlap: the first in plan order of identical ones (a tied weight under two
    # names) is read, the others copied after it; partly overlapping ones are all copied, in order
    spans = sorted((str(plan[i][1].device), plan[i][1].data_ptr(), plan[i][1].numel() * plan[i][1].element_size(), i)
                   for i in cand)
    spans = [(a, n, (dev, i)) for dev, a, n, i in spans]
    demote = set()
    j = 0
    while j < len(spans):
        end, g = spans[j][0] + spans[j][1], [spans[j]]
        while j + len(g) < len(spans) and spans[j + len(g)][0] < end and spans[j + len(g)][2][0] == g[0][2][0]:
            end = max(end, spans[j + len(g)][0] + spans[j + len(g)][1])
            g.append(spans[j + len(g)])
        if len(g) > 1:
            if all(s[:2] == g[0][:2] for s in g):
                first = min(s[2][1] for s in g)
                demote.update(s[2][1] for s in g if s[2][1] != first)
            else:
                demote.update(s[2][1] for s in g)
        j += len(g)
    fast: Dict[str, Tuple["_RankFile", List[Tuple[int, int, int]], List["torch.Tensor"]]] = {}
    dev: Dict[Tuple[str, str], Tuple["_RankFile", List[Tuple[int, int, "torch.Tensor"]]]] = {}
    for i in cand:
        if i in demote:
            continue
        k, local, src, f = plan[i]
        _, _, b, e = f.entries[k]
        if local.is_cuda:
            dev.setdefault((f.path, str(local.device)), (f, []))[1].append((f.data_start + b, e - b, local))
            continue
        got = fast.setdefault(f.path, (f, [], []))
        got[1].append((f.data_start + b, e - b, local.data_ptr()))
        got[2].append(local)
    slow = sorted(set(slow) | demote)
    for got in fast.values():  # the file front to back; neighbours in the file and in memory are read together
        order = sorted(range(len(got[1])), key=got[1].__getitem__)
        got[1][:] = [got[1][i] for i in order]
        got[2][:] = [got[2][i] for i in order]  # written[i]: the tensor ranges[i] lands in
    for _, items in dev.values():
        items.sort(key=lambda x: x[0])
    return list(fast.values()), list(dev.values()), [plan[i] for i in slow]


def _to_device(path: str, items: List[Tuple[int, int, "torch.Tensor"]], threads: int, max_host_bytes: int,
               zst: bool = False) -> int:
    """items (file offset, length, contiguous CUDA tensor of one device) read from path (zst: a
    seekable zstd copy, offsets in the file it decompresses to) through _devring's ring of pinned
    host buffers (at most max_host_bytes together): bfs_read_ranges (_zst) into a buffer while
    the buffers filled before are copied to the device on two streams."""
    device = items[0][2].device
    now = torch.cuda.current_stream(device)
    streams = [torch.cuda.Stream(device=device) for _ in range(2)]
    for s in streams:
        s.wait_stream(now)  # whatever the model's stream still has queued on these shards goes first

    def alloc(n: int) -> "torch.Tensor":
        return torch.empty(n, dtype=torch.uint8, pin_memory=True)

    def read_into(buf: "torch.Tensor", ranges: List[Tuple[int, int, int]]) -> None:
        _read_ranges(path, [(o, n, buf.data_ptr() + b) for o, n, b in ranges], threads, zst=zst)

    def copy_async(buf: "torch.Tensor", boff: int, n: int, dst: "torch.Tensor", doff: int, stream: Any) -> Any:
        with torch.cuda.stream(stream):
            dst[doff:doff + n].copy_(buf[boff:boff + n], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(stream)
        return ev

    try:
        with torch.no_grad():
            moved = _devring.run([(o, n, t.view(-1).view(torch.uint8), 0) for o, n, t in items],
                                 max_host_bytes=max_host_bytes, streams=streams, alloc=alloc, read_into=read_into,
                                 copy_async=copy_async)
    except RuntimeError as e:  # pinning or a copy failed (CUDA): one line, as a failed read is
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise LoadError("%s: loading into %s failed: %s" % (path, device, first)) from e
    for s in streams:
        now.wait_stream(s)
    return moved


def _same_file(f: "_RankFile") -> None:
    """LoadError when the path read no longer names the file that was checked (renamed over while read)"""
    try:
        st = os.stat(f.rpath)
    except OSError as e:
        raise LoadError("%s: %s, after it was read" % (f.rpath, e.strerror)) from None
    if (st.st_dev, st.st_ino) != f.ident:
        raise LoadError("%s: replaced by another file while it was being loaded; load again" % f.rpath)


def _copy_slow(slow: List[Tuple[str, "torch.Tensor", "torch.Tensor", "_RankFile"]], threads: int,
               max_host_bytes: int) -> None:
    """copy_ into each destination, in order: from the file's mapping, or, for a file read through
    its compressed copy, from a host temporary that bfs_read_ranges_zst fills, a run of that
    file's tensors at a time of at most max_host_bytes together (or one tensor, when it alone is
    larger)."""
    i = 0
    while i < len(slow):
        k, local, src, f = slow[i]
        if f.zst is None:
            local.copy_(src)
            i += 1
            continue
        batch, total = [], 0
        while i < len(slow) and slow[i][3] is f:
            _, _, b, e = f.entries[slow[i][0]]
            at = (total + 15) // 16 * 16  # each tensor's bytes where a view as its dtype may start
            if batch and at + (e - b) > max_host_bytes:
                break
            batch.append((slow[i], at, f.data_start + b, e - b))
            total = at + (e - b)
            i += 1
        tmp = torch.empty(total, dtype=torch.uint8)
        _read_ranges(f.zst, [(o, n, tmp.data_ptr() + at) for _, at, o, n in batch if n], threads, zst=True)
        for (_, dst, s, _), at, _, n in batch:
            dst.copy_(tmp[at:at + n].view(s.dtype).view(s.shape))
        del tmp


def _want_hash(f: "_RankFile") -> str:
    """The manifest's XXH3-128 of rank file f (of the file a compressed copy decompresses to);
    VerifyError when it has none."""
    want = (f.entry or {}).get("xxh3_128")
    if not want:
        raise _bfs.VerifyError(_bfs.EVERIFY, "%s: the manifest has no hash for it" % f.path,
                               ["%s: no hash in the manifest" % f.path])
    return want


def _verify_error(f: "_RankFile", got: str, want: str, state: str) -> "_bfs.VerifyError":
    """rank file f hashed to `got`, not the manifest's `want`: one line naming the file, both hashes
    and the first thing the slice index narrows it to, and what the model holds (state)"""
    narrow = f._narrow(None)
    detail = [p[len(f.path) + 2:] if p.startswith(f.path + ": ") else p for p in narrow]
    msg = "%s: BAD: XXH3-128 %s, the manifest says %s%s; %s (bfshard verify before load() leaves a model " \
          "untouched)" % (f.rpath, got, want, " (%s%s)" % (detail[0], ", and %d more" % (len(detail) - 1)
                                                              if len(detail) > 1 else "") if detail else "", state)
    return _bfs.VerifyError(_bfs.EVERIFY, msg.replace("\n", " "), [msg] + narrow)


def _hash_first(f: "_RankFile", want: str, threads: int) -> None:
    """verify=True before any byte is written: rank file f hashed whole (bfs_read_ranges_xxh128
    with no ranges, or its compressed copy's), VerifyError when it differs from `want`."""
    got = _read_ranges(f.rpath, [], threads, zst=f.zst is not None, size=f.size)
    if got != want:
        raise _verify_error(f, got, want, "nothing was loaded")


def _verified_ranges(f: "_RankFile", fast: list, slow: list, limit: int) -> Tuple[list, list, Dict[str, Any]]:
    """verify=True: the reads of rank file f made one (bfs_read_ranges_xxh128 hashes the whole
    file as it reads): its ranges into the model, and the bytes of its copies (slow) into one
    temporary, each distinct range once (a tied weight's second name copies from the first's
    destination). Returns fast with f's entry first, slow without f's copies, and {file, lo, hi
    (the temporary's addresses), copies: [(destination, source over the bytes read)]}; or fast,
    slow and {} as given when that temporary would pass `limit` bytes (max_host_bytes)."""
    mine = next((x for x in fast if x[0] is f), (f, [], []))
    ranges, written = list(mine[1]), list(mine[2])
    at = {(o, n): t for (o, n, _), t in zip(ranges, written)}
    own_slow = [x for x in slow if x[3] is f]
    slots: Dict[Tuple[int, int], int] = {}
    total = 0
    for k, _, _, _ in own_slow:
        _, _, b, e = f.entries[k]
        key = (f.data_start + b, e - b)
        if e > b and key not in at and key not in slots:
            slots[key] = total
            total += -(-(e - b) // 64) * 64  # each aligned for any dtype's view
    if total > limit:
        return fast, slow, {}
    tmp = torch.empty(max(total, 64), dtype=torch.uint8)
    base = tmp.data_ptr()
    ranges += [(o, n, base + a) for (o, n), a in slots.items()]
    written += [None] * len(slots)
    order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
    ranges, written = [ranges[i] for i in order], [written[i] for i in order]
    copies = []
    for k, dst, src, _ in own_slow:
        _, _, b, e = f.entries[k]
        if e == b:
            continue
        key = (f.data_start + b, e - b)
        raw = at[key].reshape(-1).view(torch.uint8) if key in at else tmp[slots[key]:slots[key] + (e - b)]
        copies.append((dst, raw.view(src.dtype).view(src.shape)))
    rest = [x for x in fast if x[0] is not f]
    return [(f, ranges, written)] + rest, [x for x in slow if x[3] is not f], \
        {"file": f, "lo": base, "hi": base + tmp.numel(), "tmp": tmp, "copies": copies}


def _threads(threads: int) -> int:
    if threads > 0:
        return threads
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(16, n))


def load(model: Any, outdir: PathLike, *, verify: bool = False, strict: bool = True,
         threads: int = 0, max_host_bytes: int = 256 << 20) -> LoadResult:
    """Copy this rank's rows from bfshard's dcp output into a model sharded with FSDP2
    `fully_shard` (parameters: DTensor Shard(0) over a 1-D mesh of size W, or HSDP's 2-D mesh
    whose shard dimension has size W), in place (`p.to_local().copy_(...)`), no collectives.
    `model` is an nn.Module (its state_dict(): persistent buffers included, non-persistent ones
    left alone) or a state dict of such tensors. Each rank opens its own rank file, and rank 0's
    for 0-d tensors. Everything is checked before the first copy; a problem raises LoadError
    with one line naming the tensor (see the module's doc). strict=False lets checkpoint tensors
    the model lacks pass (LoadResult.unexpected); a model tensor the checkpoint lacks is always
    an error. verify=True hashes this rank's file as it is read (one pass) and raises
    bfshard.VerifyError after the read when it differs from the manifest's hash, the model then
    holding the bytes read (run `bfshard verify` first to keep a model untouched); when a check
    fails first, the file is hashed (nothing written) and a mismatch is raised instead.

    Where a local shard is a contiguous CPU tensor of the file's dtype, its bytes are read from
    the rank file straight into it with pread(2) by `threads` threads (0: one per CPU this
    process may run on, at most 16) in one call into the C library, the GIL released
    (LoadResult.bytes_read); the rest (casts, 0-d tensors, strided shards, a tied weight's second
    name) is copied from the file's mapping with copy_. A rank file only present as its compressed
    copy is read the same way through the seekable reader (bfs_read_ranges_zst, offsets in the
    decompressed file), the rest copied from host temporaries of at most max_host_bytes together
    (or one tensor). With verify=True this rank's file is read in one call that also hashes it
    (bfs_read_ranges_xxh128 / bfs_read_ranges_zst_xxh128), the bytes copied with copy_ read into
    one host temporary by that call (their total size). Local shards on a CUDA
    device (contiguous, the file's dtype) are read into a ring of pinned host buffers of at most
    `max_host_bytes` together and copied to the device asynchronously on two streams, reads and
    copies overlapping (counted in bytes_read too)."""
    t0 = time.time()
    outdir = os.fspath(outdir)
    from torch.distributed.tensor import DTensor

    sd = model if isinstance(model, Mapping) else model.state_dict()
    problems: List[str] = []

    # the mesh: every sharded tensor's shard dimension must have the manifest's W ranks
    man: Optional[_Manifest] = None
    coords = set()
    pl_cache: Dict[Any, Any] = {}
    pl_of: Dict[str, Tuple[int, int]] = {}
    for k, v in sd.items():
        if isinstance(v, DTensor) and v.dim() > 0:
            pl = _placement(v, k, pl_cache, problems)
            if pl is not None:
                coords.add(pl)
                pl_of[k] = pl
    if problems:
        raise _fail(problems)
    own = None
    if coords:
        sizes = {w for _, w in coords}
        if len(sizes) > 1:
            raise LoadError("world_size: the model's tensors are sharded over meshes of %s ranks; bfshard's "
                            "output is for one world size" % sorted(sizes))
        W = sizes.pop()
        ranks = {r for r, _ in coords}
        if len(ranks) > 1:
            raise LoadError("the model's meshes put this process at shard ranks %s; expected one" % sorted(ranks))
        own = ranks.pop()
        man = _Manifest(outdir, own)
        if W != man.world_size:
            name = next(k for k, v in sd.items() if isinstance(v, DTensor) and v.dim() > 0)
            raise LoadError("world_size: the model is sharded over %d ranks (mesh of %s), %s was converted for "
                            "world_size=%d (%s): convert with --world-size %d, or run %d ranks"
                            % (W, name, outdir, man.world_size, os.path.basename(man.path), W, man.world_size))
    else:
        man = _Manifest(outdir, 0)
        W = man.world_size
        own = 0
    files: Dict[int, _RankFile] = {}

    def rank_file(r: int) -> _RankFile:
        if r not in files:
            files[r] = _open_rank(man, r, stream=True)
        return files[r]

    mine = rank_file(own)
    want_hash = _want_hash(mine) if verify else None
    glob = man.tensors()  # every tensor's dtype and global shape (None: a part's manifest)

    plan: List[Tuple[str, "torch.Tensor", "torch.Tensor"]] = []
    used = set()
    missing: List[Tuple[str, Optional[int], "torch.Tensor"]] = []
    zero_d_rank0: List[str] = []
    for k, v in sd.items():
        if isinstance(v, DTensor):
            # to_local() is an autograd function (~15 us); under no_grad it returns this same tensor
            local = v._local_tensor if type(getattr(v, "_local_tensor", None)) is torch.Tensor else v.to_local()
            gshape = tuple(v.shape)
            if v.dim() == 0:
                r, rows, start = 0, None, 0
            else:
                r = pl_of[k][0]  # checked above
                d0 = gshape[0]
                c = -(-d0 // W)
                start = min(r * c, d0)
                rows = max(0, min(c, d0 - r * c))
                want_local = (rows,) + gshape[1:]
                if local.shape != want_local:
                    problems.append("%s: local shard %s on rank %d, torch.chunk of %s over %d ranks gives %s "
                                    "(bfshard's rule; FSDP2's Shard(0))" % (k, list(local.shape), r, list(gshape),
                                                                           W, list(want_local)))
                    continue
        elif isinstance(v, torch.Tensor):
            local, gshape = v, tuple(v.shape)
            if v.dim() == 0:
                r, rows, start = 0, None, 0
            elif W == 1:
                r, rows, start = 0, gshape[0], 0
            else:
                # a model buffer, which fully_shard leaves whole: under target names bfshard writes
                # it whole to rank 0's file (docs/NAMES.md), read from there as 0-d tensors are
                try:
                    ent0 = rank_file(0).entries.get(k)
                except LoadError as e:
                    problems.append("%s: %s" % (k, e.message))
                    continue
                if ent0 is None or tuple(ent0[1]) != gshape:
                    problems.append("%s: a plain %s tensor (not sharded by fully_shard), but the checkpoint splits it "
                                    "over %d rank files: shard it (Shard(0)), convert with --names transformers "
                                    "(the model's buffers whole on rank 0), or load it with dcp.load"
                                    % (k, list(gshape), W))
                    continue
                r, rows, start = 0, gshape[0], 0
        else:
            continue
        if glob is not None:
            g = glob.get(k)
            if g is None:
                missing.append((k, None, local))
                continue
            gdt, gs = g
            if gs != gshape:
                problems.append("%s: shape %s in the model, %s in the checkpoint" % (k, list(gshape), list(gs)))
                continue
            if _DTYPES.get(gdt) != local.dtype and not _upcast(gdt, local.dtype):
                problems.append("%s: dtype %s in the model, %s in the checkpoint (no casts: build the model in "
                                "the checkpoint's dtype)" % (k, local.dtype, gdt))
                continue
        if rows == 0:  # this rank holds no rows of it: bfshard writes no entry (torch's writer: 0 rows)
            ent = mine.entries.get(k) if r == own else None
            if ent is not None:
                used.add(k)
                if ent[1] != tuple(local.shape):
                    problems.append("%s: rank %d holds no rows of it (torch.chunk), its file has %s"
                                    % (k, r, list(ent[1])))
            continue
        try:
            f = rank_file(r)
        except LoadError as e:
            problems.append("%s: %s" % (k, e.message))
            continue
        ent = f.entries.get(k)
        if ent is None:
            missing.append((k, r, local))
            continue
        if f is mine:
            used.add(k)
        dt, shape, _, _ = ent
        if local.shape != shape:
            problems.append("%s: local shard %s on rank %d, the rank file holds %s" % (
                k, list(local.shape), r, list(shape)))
            continue
        if _DTYPES[dt] != local.dtype and not _upcast(dt, local.dtype):
            problems.append("%s: dtype %s in the model, %s in the rank file (no casts: build the model in "
                            "the checkpoint's dtype)" % (k, local.dtype, dt))
            continue
        if rows is not None:
            off = f.offsets(k)
            want_off = [start] + [0] * (len(gshape) - 1)
            if off is None and start != 0 or off is not None and list(off) != want_off:
                problems.append("%s: rank %d's rows start at %s in the file, torch.chunk puts them at %s" % (
                    k, r, off, want_off))
                continue
        if rows is None or (r == 0 and f is not mine):
            zero_d_rank0.append(k)  # read from rank 0's file: verify=True hashes its slices there
        plan.append((k, local, f.tensor(k), f))

    if missing:  # a name tied to a tensor loaded under another name (tied embeddings) is loaded
        loaded = {(t.data_ptr(), tuple(t.shape), t.dtype) for _, t, _, _ in plan if t.numel()}
        missing = [m for m in missing if (m[2].data_ptr(), tuple(m[2].shape), m[2].dtype) not in loaded]
    for k, r, _ in missing:
        if r is None:
            problems.append("%s: in the model, not in the checkpoint (%s lists no such tensor)"
                            % (k, os.path.basename(man.path)))
        elif glob is not None:
            problems.append("%s: in the checkpoint's manifest, but rank %d's file %s has no entry for it "
                            "(a damaged or foreign rank file: bfshard verify)" % (k, r, files[r].name))
        else:
            problems.append("%s: in the model, not in the checkpoint (rank %d's file %s has no entry for it)"
                            % (k, r, files[r].name))
    unexpected = sorted(set(mine.entries) - used - set(sd))
    if glob is not None:
        unexpected = sorted(set(unexpected) | (set(glob) - set(sd)))
    if unexpected and strict:
        problems.append("%s: in the checkpoint, not in the model (strict=False to skip it)%s" % (
            unexpected[0], "; %d such tensors" % len(unexpected) if len(unexpected) > 1 else ""))
    if problems:
        if want_hash is not None:  # a damaged file is the likelier cause: hashed (nothing is written) and said so
            _hash_first(mine, want_hash, _threads(threads))
        raise _fail(problems)
    if verify and zero_d_rank0 and 0 in files and files[0] is not mine:
        files[0].verify(zero_d_rank0)

    rounded = [k for k, local, src, _ in plan if src.dtype == torch.float32 and local.dtype == torch.bfloat16]
    if rounded:
        warnings.warn("bfshard.torch.load: %d float32 tensor(s) of the checkpoint (e.g. %s) go into bfloat16 tensors of "
                      "the model, rounded as dcp.load rounds them; the model keeps them in float32 upstream "
                      "(_keep_in_fp32_modules_strict): build it so (README, 'Load the dcp output')"
                      % (len(rounded), rounded[0]), stacklevel=2)
    if max_host_bytes < 1:
        raise ValueError("max_host_bytes must be at least 1, not %r" % (max_host_bytes,))
    fast, dev, slow = _direct(plan)
    nread = 0
    nthreads = _threads(threads)
    bump = getattr(getattr(torch.autograd, "graph", None), "increment_version", None)
    hashed: Dict[str, Any] = {}
    if want_hash is not None:
        # this rank's file read and hashed in one pass: its ranges into the model, the bytes of its
        # copies (casts, 0-d, strided, a tied weight's second name) into one temporary
        fast, slow, hashed = _verified_ranges(mine, fast, slow, max_host_bytes)
        if not hashed:  # its copies (a model cast from the file) would pass max_host_bytes at once:
            # hashed first, nothing written (the storage read twice), then read as without verify
            _hash_first(mine, want_hash, nthreads)
    for f, ranges, written in fast:
        verified = hashed.get("file") is f
        got = _read_ranges(f.rpath, ranges, nthreads, zst=f.zst is not None, size=f.size if verified else None)
        _same_file(f)
        if verified:
            nread += sum(n for _, n, d in ranges if not hashed["lo"] <= d < hashed["hi"])
        else:
            nread += sum(n for _, n, _ in ranges)
        if bump is not None:  # written in place behind autograd's back: as copy_ would, bump their version
            for t in written:
                if t is not None and not t.is_inference():  # those have no version counter
                    bump(t)
        if verified:
            if got != want_hash:
                raise _verify_error(f, got, want_hash, "the model now holds these bytes, unverified")
            with torch.no_grad():  # the copies, from the bytes hashed
                for dst, src in hashed["copies"]:
                    dst.copy_(src)
            hashed["copies"] = hashed["tmp"] = None  # the temporary goes before the other reads
    for f, items in dev:
        nread += _to_device(f.rpath, items, nthreads, max_host_bytes, zst=f.zst is not None)
        _same_file(f)
    with torch.no_grad():
        _copy_slow(slow, nthreads, max_host_bytes)
    nbytes = sum(src.numel() * src.element_size() for _, _, src, _ in plan)
    return LoadResult(own, W, len(plan), nbytes, [f.rpath for f in files.values()],
                      unexpected if not strict else [], time.time() - t0, nread)
