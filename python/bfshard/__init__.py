"""bfshard: quantized Hugging Face checkpoints (MXFP4 as in gpt-oss, bitsandbytes NF4/FP4,
FP8, compressed-tensors INT4, NVFP4) to BF16 checkpoints pre-sharded for every FSDP rank,
with integrity hashes.

    res = bfshard.convert("/models/gpt-oss-20b", "/ckpt/w8", world_size=8)
    plan = bfshard.inspect("/models/gpt-oss-20b", world_size=8)
    bfshard.verify("/ckpt/w8")            # raises bfshard.VerifyError on any mismatch

Every failure raises bfshard.Error (or its subclass VerifyError) carrying the C error
code (.code, a negative BFS_E* number; the CLI exits with -code), its name (.name,
"BFS_EINPUT") and the library's one-line message (.message).
"""
import ctypes
import json
import os
import threading
from ctypes import byref, c_uint64, cast, c_void_p
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Union

from . import _lib

__all__ = [
    "convert", "inspect", "verify", "resolve", "Error", "VerifyError", "Progress", "ConvertResult",
    "VerifyResult", "cpu_level", "cuda_built", "cuda_device_count", "__version__",
]

_c = _lib.load()
_lib.check_layout(_c)

__version__ = _c.bfs_py_version().decode()
__revision__ = _c.bfs_build_revision().decode()  # git describe of the build, "unknown" outside git

# error codes, as in bfshard.h
OK, EINTERNAL, EUSAGE, EINPUT, EIO, ENOMEM, EDEVICE, EVERIFY, EEXIST, EINTR = (
    _lib.OK, _lib.EINTERNAL, _lib.EUSAGE, _lib.EINPUT, _lib.EIO, _lib.ENOMEM, _lib.EDEVICE,
    _lib.EVERIFY, _lib.EEXIST, _lib.EINTR)


class Error(Exception):
    """A bfshard failure: .code (negative BFS_E* code), .name ("BFS_EINPUT"), .message."""

    def __init__(self, code: int, message: str = ""):
        self.code = code
        self.name = _c.bfs_err_name(code).decode()
        self.message = message or _c.bfs_strerror(code).decode()
        super().__init__(self.message)

    @property
    def exit_code(self) -> int:
        """What the bfshard command exits with for this error."""
        return -self.code

    def __repr__(self):
        return "%s(%s, %r)" % (type(self).__name__, self.name, self.message)


class VerifyError(Error):
    """The output does not match its manifest. .problems: one line per bad file or tensor."""

    def __init__(self, code: int, message: str = "", problems: Optional[List[str]] = None):
        super().__init__(code, message)
        self.problems = list(problems or [])


def _error(code: int, problems: Optional[List[str]] = None) -> Error:
    msg = (_c.bfs_last_error() or b"").decode(errors="replace")
    if code == EVERIFY:
        return VerifyError(code, msg, problems)
    return Error(code, msg)


class Progress(NamedTuple):
    bytes_done: int   # BF16 bytes written so far
    bytes_total: int  # BF16 bytes the run writes
    tensor: str       # the output tensor being worked on


@dataclass(frozen=True)
class ConvertResult:
    bytes_written: int      # BF16 bytes of tensor data written
    files_written: int      # rank files written
    files_reused: int       # rank files from an earlier run reused (resume)
    tensors: int            # output tensors
    seconds: float
    host_buffer_bytes: int
    gpu_buffer_bytes: int
    backend: str            # "cpu/avx2 x8", "cuda:0"
    tensors_dequantized: int = 0  # MXFP4 / bitsandbytes 4-bit -> BF16
    tensors_cast: int = 0         # F32/F16/F64 -> BF16
    tensors_copied: int = 0       # passed through unchanged
    tensors_dropped: int = 0      # input tensors folded into a dequantized one (scales, quant state)
    # each stage's busy fraction over the rank files ("read", "dequant", "hash", "write"): the
    # one near 1 bounds the run; and the writer threads
    busy: Optional[Dict[str, float]] = None
    writers: int = 1


@dataclass(frozen=True)
class VerifyResult:
    bytes_checked: int


_SUFFIX = {"k": 1, "m": 2, "g": 3, "t": 4}


def _size(name: str, v: Union[int, str, None]) -> int:
    """An int, or a string as the CLI takes it: 512M, 2G (x1024), 5GB (x1000), 4MiB."""
    if v is None:
        return 0
    if isinstance(v, bool):
        raise TypeError("%s: a size, not a bool" % name)
    if isinstance(v, int):
        if v < 0:
            raise ValueError("%s must be >= 0, got %d" % (name, v))
        return v
    if not isinstance(v, str):
        raise TypeError("%s: an int or a string like '512M', got %r" % (name, v))
    s = v.strip()
    i = len(s)
    while i and not s[i - 1].isdigit():
        i -= 1
    num, unit = s[:i], s[i:].lower()
    if not num.isdigit():
        raise ValueError("%s: a size like 512M or 2G, got %r" % (name, v))
    if not unit:
        return int(num)
    base = 1000 if unit[1:] == "b" else 1024
    if unit[0] not in _SUFFIX or unit[1:] not in ("", "b", "ib"):
        raise ValueError("%s: a size like 512M or 2G, got %r" % (name, v))
    return int(num) * base ** _SUFFIX[unit[0]]


def _choice(name: str, v: Any, table: Dict[Any, int]) -> int:
    if v not in table:
        raise ValueError("%s must be one of %s, got %r" % (
            name, ", ".join(repr(k) for k in table if k is not None), v))
    return table[v]


_OPTIONS = ("layout", "device", "threads", "mem", "gpu_mem", "mxfp4_layout", "keep_dtype", "force",
            "max_shard_size", "cpu_level", "compress", "log", "ranks", "parts", "revision", "max_rss",
            "sha256", "names")


def _opts(world_size: int, options: Dict[str, Any], keep: List[Any]) -> "_lib.ConvertOpts":
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError("unknown option(s): %s (known: %s)" % (", ".join(unknown), ", ".join(_OPTIONS)))
    o = _lib.ConvertOpts()
    _c.bfs_convert_opts_init(byref(o))
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError("world_size must be an int >= 1, got %r" % (world_size,))
    o.world_size = world_size
    if "layout" in options:
        o.layout = _choice("layout", options["layout"], _lib.LAYOUT)
    if options.get("device") is not None:
        dev = str(options["device"]).encode()
        keep.append(dev)
        o.device = dev
    if options.get("threads") is not None:
        o.threads = int(options["threads"])
    o.mem = _size("mem", options.get("mem"))
    o.gpu_mem = _size("gpu_mem", options.get("gpu_mem"))
    o.max_rss = _size("max_rss", options.get("max_rss"))
    o.max_shard_size = _size("max_shard_size", options.get("max_shard_size"))
    if "mxfp4_layout" in options:
        o.mxfp4_layout = _choice("mxfp4_layout", options["mxfp4_layout"], _lib.MXFP4_LAYOUT)
    if "names" in options:
        o.names = _choice("names", options["names"], _lib.NAMES)
    o.keep_dtype = 1 if options.get("keep_dtype") else 0
    o.force = 1 if options.get("force") else 0
    o.sha256 = 1 if options.get("sha256") else 0
    if "cpu_level" in options:
        o.cpu_level = _choice("cpu_level", options["cpu_level"], _lib.CPU_LEVEL)
    comp = options.get("compress")
    if comp:
        kind, _, level = str(comp).partition(":")
        o.compress_mode = _choice("compress", kind, _lib.ZST_MODE)
        o.compress_level = int(level) if level else 3
        if o.compress_level == 0 or not -7 <= o.compress_level <= 22:
            raise ValueError("compress: LEVEL must be a zstd level from -7 to 22 (not 0), got %r" % comp)
    if options.get("log"):
        o.log = _lib.c_stderr()
    if options.get("ranks") is not None:
        ranks = str(options["ranks"]).encode()
        keep.append(ranks)
        o.ranks = ranks
    if options.get("parts") is not None:
        o.parts = int(options["parts"])
    if options.get("revision") is not None:
        rev = str(options["revision"]).encode()
        keep.append(rev)
        o.revision = rev
    return o


def convert(input: Union[str, os.PathLike], outdir: Union[str, os.PathLike], world_size: int = 1, *,
            progress: Optional[Callable[[Progress], Any]] = None, **options: Any) -> ConvertResult:
    """Convert INPUT into OUTDIR for world_size ranks. INPUT is a .safetensors file, a
    directory, or a model in the local Hugging Face cache ("org/name", or its
    models--org--name folder; revision="branch, tag or commit"): see resolve().

    options (as the CLI's, see `bfshard convert --help`): layout ("dcp", "hf"), names
    ("transformers", "checkpoint", "torchtitan", "auto"; docs/NAMES.md), device
    ("auto", "cpu", "cuda", "cuda:N[,M]"), threads, mem, max_rss, gpu_mem, max_shard_size (ints or
    "512M"-style strings), mxfp4_layout ("hf", "openai"), keep_dtype, force, sha256, cpu_level
    (None, "scalar", "avx2", "avx512"), compress (None, "zstd[:LEVEL]",
    "zstd-bytegroup[:LEVEL]"), log (True: the library's log lines on stderr), ranks
    ("0-3", "auto": convert only these ranks, finished by `bfshard merge`), parts.

    progress(Progress) is called as the conversion goes. An exception it raises
    (KeyboardInterrupt included: Ctrl-C is noticed there) stops the conversion at the
    next unit, its temporary files removed, and is raised again here.
    """
    keep: List[Any] = []
    o = _opts(world_size, options, keep)
    raised: List[BaseException] = []

    def on_progress(p, _user):
        if raised:
            return
        try:
            if progress is not None:
                c = p.contents
                progress(Progress(c.bytes_done, c.bytes_total, (c.tensor or b"").decode(errors="replace")))
        except BaseException as e:  # noqa: B902 — carried to the caller, conversion cancelled
            raised.append(e)
            _c.bfs_cancel()

    # Always installed: besides the user's callback it is where a pending Ctrl-C
    # (KeyboardInterrupt) surfaces while the C code runs, when called on the main thread.
    cb = _lib.PROGRESS_FN(on_progress)
    o.progress = cb
    res = _lib.ConvertResult()
    _c.bfs_convert_result_init(byref(res))
    rc = _c.bfs_convert(os.fsencode(input), os.fsencode(outdir), byref(o), byref(res))
    if raised:
        raise raised[0]
    if rc < 0:
        raise _error(rc)
    return ConvertResult(res.bytes_written, res.files_written, res.files_reused, res.tensors, res.seconds,
                         res.host_buffer_bytes, res.gpu_buffer_bytes, res.backend.decode(errors="replace"),
                         res.tensors_dequantized, res.tensors_cast, res.tensors_copied, res.tensors_dropped,
                         {"read": res.busy_read, "dequant": res.busy_dequant, "hash": res.busy_hash,
                          "write": res.busy_write}, res.writers)


def inspect(input: Union[str, os.PathLike], world_size: int = 1, **options: Any) -> Dict[str, Any]:
    """The tensors of INPUT, their formats and the plan for world_size ranks (the JSON of
    `bfshard inspect --json`) as a dict. Takes convert's options (layout, mem, ...)."""
    keep: List[Any] = []
    o = _opts(world_size, options, keep)
    ms = _lib.MemStream()
    try:
        rc = _c.bfs_inspect(os.fsencode(input), byref(o), 1, ms.file)
    finally:
        text = ms.close()
    if rc < 0:
        raise _error(rc)
    return json.loads(text.decode())


def verify(outdir: Union[str, os.PathLike]) -> VerifyResult:
    """Re-hash every file of OUTDIR against its manifest. Raises VerifyError (with one
    line per problem in .problems) when anything differs, Error when it cannot check."""
    ms = _lib.MemStream()
    checked = c_uint64(0)
    try:
        rc = _c.bfs_verify(os.fsencode(outdir), ms.file, byref(checked))
    finally:
        report = ms.close()
    if rc < 0:
        raise _error(rc, [ln for ln in report.decode(errors="replace").splitlines() if ln])
    return VerifyResult(checked.value)


def resolve(input: Union[str, os.PathLike], revision: Optional[str] = None) -> str:
    """The path bfshard reads for INPUT: a path as it is, or a Hugging Face repo id
    ("org/name") or models--org--name cache folder resolved offline to its snapshot
    for revision (default "main"), as huggingface_hub does ($HF_HUB_CACHE, $HF_HOME/hub,
    ~/.cache/huggingface/hub). Raises Error (code EINPUT) when it is not cached."""
    buf = ctypes.create_string_buffer(8192)
    rc = _c.bfs_hf_resolve(os.fsencode(input), None if revision is None else str(revision).encode(), buf,
                           len(buf))
    if rc < 0:
        raise _error(rc)
    return os.fsdecode(buf.value)


def cpu_level() -> str:
    """The best CPU kernel level here: "avx512", "avx2" or "scalar"."""
    return _c.bfs_cpu_level_name(_c.bfs_cpu_best_level()).decode()


def cuda_built() -> bool:
    return bool(_c.bfs_cuda_built())


def cuda_device_count() -> int:
    return _c.bfs_cuda_device_count()
