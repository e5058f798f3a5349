"""ctypes view of include/bfshard.h: the library, the structs, the function signatures.

The structs mirror the C layout field for field. At import, check_layout() compares
them with the layout the C compiler produced (bfs_py_abi_layout, python/bfshard_abi.c,
compiled into _libbfshard.so against the same header) and refuses to load on any
difference.
"""
import ctypes
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_int, c_size_t,
                    c_uint64, c_void_p)

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = os.path.join(HERE, "_libbfshard.so")
CLI = os.path.join(HERE, "bin", "bfshard")

# error codes (bfshard.h, frozen)
OK = 0
EINTERNAL, EUSAGE, EINPUT, EIO, ENOMEM, EDEVICE, EVERIFY, EEXIST, EINTR = range(-1, -10, -1)

LAYOUT = {"dcp": 0, "hf": 1}
MXFP4_LAYOUT = {"hf": 0, "openai": 1}
NAMES = {"auto": 0, "checkpoint": 1, "transformers": 2, "torchtitan": 3}
CPU_LEVEL = {None: -1, "best": -1, "scalar": 0, "avx2": 1, "avx512": 2}
ZST_MODE = {"zstd": 0, "zstd-bytegroup": 1}


class Progress(Structure):
    _fields_ = [
        ("bytes_done", c_uint64),
        ("bytes_total", c_uint64),
        ("tensor", c_char_p),
        ("busy_read", c_double),
        ("busy_dequant", c_double),
        ("busy_hash", c_double),
        ("busy_write", c_double),
        ("writers", c_int),
    ]


PROGRESS_FN = CFUNCTYPE(None, POINTER(Progress), c_void_p)


class ConvertOpts(Structure):
    _fields_ = [
        ("size", c_size_t),  # set by bfs_convert_opts_init (the ABI's struct version)
        ("world_size", c_int),
        ("layout", c_int),
        ("device", c_char_p),
        ("threads", c_int),
        ("mem", c_uint64),
        ("gpu_mem", c_uint64),
        ("mxfp4_layout", c_int),
        ("keep_dtype", c_int),
        ("force", c_int),
        ("max_shard_size", c_uint64),
        ("cpu_level", c_int),
        ("progress", PROGRESS_FN),
        ("progress_user", c_void_p),
        ("log", c_void_p),  # FILE *
        ("compress_level", c_int),
        ("compress_mode", c_int),
        ("ranks", c_char_p),
        ("parts", c_int),
        ("revision", c_char_p),
        ("max_rss", c_uint64),
        ("sha256", c_int),
        ("names", c_int),
    ]


class ConvertResult(Structure):
    _fields_ = [
        ("size", c_size_t),  # set by bfs_convert_result_init
        ("bytes_written", c_uint64),
        ("files_written", c_uint64),
        ("files_reused", c_uint64),
        ("tensors", c_uint64),
        ("seconds", c_double),
        ("host_buffer_bytes", c_uint64),
        ("gpu_buffer_bytes", c_uint64),
        ("backend", c_char * 64),
        ("input_bytes_read", c_uint64),
        ("source_bytes_hashed", c_uint64),
        ("ranks", c_char * 128),
        ("tensors_dequantized", c_uint64),
        ("tensors_cast", c_uint64),
        ("tensors_copied", c_uint64),
        ("tensors_dropped", c_uint64),
        ("write_seconds", c_double),
        ("busy_read", c_double),
        ("busy_dequant", c_double),
        ("busy_hash", c_double),
        ("busy_write", c_double),
        ("writers", c_int),
    ]


class Range(Structure):
    _fields_ = [("offset", c_uint64), ("length", c_uint64), ("dest", c_void_p)]


class _Field(Structure):
    _fields_ = [("name", c_char_p), ("offset", c_size_t), ("size", c_size_t)]


MIRRORED = {"bfs_progress": Progress, "bfs_convert_opts": ConvertOpts, "bfs_convert_result": ConvertResult,
            "bfs_range": Range}


def _sig(lib, name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


def load(path=LIBRARY):
    lib = ctypes.CDLL(path)
    _sig(lib, "bfs_strerror", c_char_p, c_int)
    _sig(lib, "bfs_err_name", c_char_p, c_int)
    _sig(lib, "bfs_last_error", c_char_p)
    _sig(lib, "bfs_convert_opts_init", None, POINTER(ConvertOpts))
    _sig(lib, "bfs_convert_result_init", None, POINTER(ConvertResult))
    _sig(lib, "bfs_hf_resolve", c_int, c_char_p, c_char_p, c_char_p, c_size_t)
    _sig(lib, "bfs_build_revision", c_char_p)
    _sig(lib, "bfs_convert", c_int, c_char_p, c_char_p, POINTER(ConvertOpts), POINTER(ConvertResult))
    _sig(lib, "bfs_cancel", None)
    _sig(lib, "bfs_inspect", c_int, c_char_p, POINTER(ConvertOpts), c_int, c_void_p)
    _sig(lib, "bfs_verify", c_int, c_char_p, c_void_p, POINTER(c_uint64))
    _sig(lib, "bfs_read_ranges", c_int, c_char_p, POINTER(Range), c_size_t, c_int)
    _sig(lib, "bfs_read_ranges_zst", c_int, c_char_p, POINTER(Range), c_size_t, c_int)
    _sig(lib, "bfs_read_ranges_xxh128", c_int, c_char_p, POINTER(Range), c_size_t, c_int, c_uint64, c_void_p)
    _sig(lib, "bfs_read_ranges_zst_xxh128", c_int, c_char_p, POINTER(Range), c_size_t, c_int, c_uint64, c_void_p)
    _sig(lib, "bfs_zst_uncompressed_size", c_int, c_char_p, POINTER(c_uint64))
    _sig(lib, "bfs_cpu_level_name", c_char_p, c_int)
    _sig(lib, "bfs_cpu_best_level", c_int)
    _sig(lib, "bfs_cuda_built", c_int)
    _sig(lib, "bfs_cuda_device_count", c_int)
    _sig(lib, "bfs_py_abi_layout", POINTER(_Field))
    _sig(lib, "bfs_py_version", c_char_p)
    return lib


def c_layout(lib):
    """{name: (offset, size)} as compiled from include/bfshard.h."""
    out = {}
    p = lib.bfs_py_abi_layout()
    i = 0
    while p[i].name is not None:
        out[p[i].name.decode()] = (p[i].offset, p[i].size)
        i += 1
    return out


def py_layout():
    """The same, from the ctypes structs above."""
    out = {}
    for cname, st in MIRRORED.items():
        out[cname] = (0, ctypes.sizeof(st))
        for fname, _ in st._fields_:
            d = getattr(st, fname)
            out[cname + "." + fname] = (d.offset, d.size)
    return out


def check_layout(lib):
    c, py = c_layout(lib), py_layout()
    diff = sorted(k for k in set(c) | set(py) if c.get(k) != py.get(k))
    if diff:
        raise ImportError(
            "bfshard: the ctypes structs in bfshard/_lib.py do not match include/bfshard.h "
            "(C vs ctypes (offset, size)): "
            + "; ".join("%s: %s vs %s" % (k, c.get(k), py.get(k)) for k in diff))


# ---- C streams for bfs_inspect / bfs_verify / opts.log --------------------------------------
libc = ctypes.CDLL(None, use_errno=True)
_sig(libc, "open_memstream", c_void_p, POINTER(c_void_p), POINTER(c_size_t))
_sig(libc, "fclose", c_int, c_void_p)
_sig(libc, "fflush", c_int, c_void_p)
_sig(libc, "free", None, c_void_p)


class MemStream:
    """A FILE * whose contents come back as bytes after close()."""

    def __init__(self):
        self._buf = c_void_p()
        self._size = c_size_t()
        self.file = libc.open_memstream(ctypes.byref(self._buf), ctypes.byref(self._size))
        if not self.file:
            raise OSError(ctypes.get_errno(), "open_memstream failed")

    def close(self):
        if self.file:
            libc.fclose(self.file)
            self.file = None
        data = ctypes.string_at(self._buf, self._size.value) if self._buf else b""
        libc.free(self._buf)
        self._buf = c_void_p()
        return data

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def c_stderr():
    return c_void_p.in_dll(libc, "stderr").value
