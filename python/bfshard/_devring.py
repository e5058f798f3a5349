"""Reading a rank file into device memory through a bounded ring of host buffers.

bfshard.torch.load() uses it for local shards on a CUDA device: the file's ranges are read
(pread, bfs_read_ranges) into one of a few pinned host buffers while the buffers filled before
are copied to the device asynchronously on more than one stream; a buffer is filled again only
once the event recorded after its copies has completed. Host memory: the buffers, never more
than `max_host_bytes` together. It knows nothing of torch or CUDA: the caller passes callables
(alloc, read_into, copy_async; events with query() and synchronize()), so that its ordering,
its budget and its handling of errors are tested with a fake device (python/tests).
"""
from typing import Any, Callable, List, Optional, Sequence, Tuple

# the largest buffer: big enough for full-speed reads and copies, small enough that several fit
BUF_MAX = 64 << 20
MIN_BUFS = 2  # one being read while another is copied: the overlap


def plan_buffers(max_host_bytes: int, total: int) -> Tuple[int, int]:
    """(buffers, bytes each) for a budget of max_host_bytes and `total` bytes to move: at least
    two buffers where the budget allows (overlap), each at most BUF_MAX, all within the budget."""
    if max_host_bytes < 1:
        raise ValueError("max_host_bytes must be at least 1, not %r" % (max_host_bytes,))
    if total <= 0:
        return 0, 0
    size = min(BUF_MAX, max(1, max_host_bytes // MIN_BUFS), total)
    n = min(max_host_bytes // size, -(-total // size), 8)
    return max(1, n), size


def batches(items: Sequence[Tuple[int, int, Any, int]], size: int) -> List[List[Tuple[int, int, int, Any, int]]]:
    """items (file offset, length, destination, offset in it) packed into buffer fills of at most
    `size` bytes, in the order given: [(file offset, length, offset in the buffer, destination,
    offset in it)] each; an item larger than what is left of a fill is cut at the fill's end."""
    out: List[List[Tuple[int, int, int, Any, int]]] = []
    cur: List[Tuple[int, int, int, Any, int]] = []
    used = 0
    for off, n, dst, doff in items:
        while n > 0:
            if used == size:
                out.append(cur)
                cur, used = [], 0
            k = min(n, size - used)
            cur.append((off, k, used, dst, doff))
            used += k
            off, n, doff = off + k, n - k, doff + k
    if cur:
        out.append(cur)
    return out


def run(items: Sequence[Tuple[int, int, Any, int]], *, max_host_bytes: int, streams: Sequence[Any],
        alloc: Callable[[int], Any], read_into: Callable[[Any, List[Tuple[int, int, int]]], None],
        copy_async: Callable[[Any, int, int, Any, int, Any], Any]) -> int:
    """Move items (file offset, length, destination, offset in it) from the file to the device.

    alloc(nbytes) -> a host buffer; read_into(buf, [(file offset, length, offset in buf)]) fills
    it (raises on a failed read); copy_async(buf, buf_offset, length, dst, dst_offset, stream)
    queues one copy and returns an event that completes after it (query() -> bool,
    synchronize()). Fill k goes to streams[k % len(streams)]; a buffer is refilled once its
    last event has completed. Returns the bytes moved. On an error (a read, a copy, an event)
    every copy already queued is waited for (no buffer is given back while the device may
    still read it) and the first error is raised, once; the destinations then hold part of
    their bytes."""
    if not streams:
        raise ValueError("no streams")
    total = sum(n for _, n, _, _ in items)
    nbufs, size = plan_buffers(max_host_bytes, total)
    if total == 0:
        return 0
    free: List[Any] = []
    busy: List[Tuple[Any, Any]] = []  # (buffer, its last copy's event), oldest first
    made = 0
    moved = 0
    err: Optional[BaseException] = None
    try:
        for k, fill in enumerate(batches(items, size)):
            # a buffer: a free one, a new one within the budget, or the oldest once its copies are done
            i = next((j for j, (_, ev) in enumerate(busy) if ev.query()), None)
            if i is not None:
                free.append(busy.pop(i)[0])
            if not free:
                if made < nbufs:
                    free.append(alloc(size))
                    made += 1
                else:
                    buf, ev = busy.pop(0)
                    ev.synchronize()
                    free.append(buf)
            buf = free.pop()
            read_into(buf, [(off, n, boff) for off, n, boff, _, _ in fill])
            stream = streams[k % len(streams)]
            ev = None
            try:
                for _, n, boff, dst, doff in fill:
                    ev = copy_async(buf, boff, n, dst, doff, stream)
            finally:
                if ev is not None:  # copies queued from it: not free until they are done
                    busy.append((buf, ev))
                else:
                    free.append(buf)
            moved += sum(n for _, n, _, _, _ in fill)
    except BaseException as e:  # noqa: B902 - raised again below, once the device is done with the buffers
        err = e
    for _, ev in busy:
        try:
            ev.synchronize()
        except BaseException as e:  # noqa: B902 - the first error wins
            err = err or e
    if err is not None:
        raise err
    return moved
