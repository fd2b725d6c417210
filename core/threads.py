"""One forward pass on every core the BLAS may use: each step cut into pieces that a small team of threads shares,
and the memory of its big arrays kept for the next pass.

NumPy hands a matrix product to the BLAS, which runs it on all of its threads; every other step (layer
norm, GELU, the mask, the softmax, the residual adds) runs on one thread, and the many small products
of blocked attention gain little from a second one. So while the BLAS is allowed n > 1 threads,
`team_for(rows)` lends a long pass a Team of n threads instead and has the BLAS use one meanwhile: a
step is cut into pieces (row ranges of a [pos, ...] array, a product's column ranges, attention's query
blocks by head group), which the team's threads take one after another, each piece a single-threaded
BLAS call or ufunc (NumPy lets go of the GIL in both). Independent pieces also slow down gently on a
loaded machine, where the BLAS's own threads spin while they wait for a descheduled partner.

The pieces write disjoint parts of arrays allocated beforehand, so the same code runs with SERIAL, the
team of one, as a plain loop over one piece. A piece's numbers are those of the whole step: the rows of
a product do not depend on the other rows. Only the BLAS may round differently: its kernels choose their
blocking by the matrix sizes, so a product of 256 rows can differ in the last bit from the same rows
inside a product of 1,024 (OpenBLAS's Haswell kernel does, and so does a product run on two BLAS threads
rather than one): float32 rounding, as between any two machines.

A team also lends a pass memory (Slabs): the arrays that outlive their step (the activations a pass
keeps, the KV cache, the logits) come from memory that earlier passes' arrays held and nobody holds
any more, instead of fresh pages the kernel must fault in and zero first: a full capture of GPT-2 small
at 1,024 tokens holds about 1.9 GiB, and on fresh pages it spent 2.3-3.1 s in the kernel per pass here
(37,000 page faults) against 0.03-0.09 s on reused memory. The memory kept is bounded (MEMORY: at most
2 GiB, each slab at most KEEP_S seconds unused), and only a pass on a team keeps any: a process that
gives the BLAS several threads (a notebook, a benchmark). A server worker runs one BLAS thread, passes
with SERIAL, and allocates as it always did.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

import numpy as np

ROWS = 64  # the smallest piece of rows: a product of fewer rows runs well below the BLAS's rate
MAX_WIDTH = 8  # beyond this many threads the BLAS's own threading is left as it is (not measured here)


class Slabs:
    """Memory for big arrays, kept a short while once nobody holds them, for the next arrays of about their size.

    An array handed out keeps a lease on its slab (the array's base); when the last view of it goes,
    the slab returns here. Sizes are rounded up to eighths of their power of two (at most 12.5% more),
    so that a text a few tokens longer finds the last one's memory; slabs start on a 2 MiB boundary,
    where the kernel backs them with huge pages. Bounded twice: at most `limit` bytes wait here (a slab
    that would pass it goes back to the system at once), and a slab that has waited `keep_s` seconds
    unused goes back then (a daemon timer), so an idle process holds no more than its live arrays."""

    SMALLEST = 4 << 20  # below this, malloc reuses freed memory well enough
    ALIGN = 2 << 20

    def __init__(self, limit: int, keep_s: float):
        self.limit, self.keep_s = limit, keep_s
        self._free: dict[int, list[tuple[float, np.ndarray]]] = {}  # size -> [(when it came back, slab)]
        self._waiting = 0  # bytes in _free
        self._lock = threading.RLock()  # a lease may end (and come back here) in the middle of empty()
        self._timer: tuple[int, threading.Timer] | None = None  # (pid, timer): a forked child's is not running

    @staticmethod
    def size(nbytes: int) -> int:
        step = max(Slabs.ALIGN, 1 << max(0, nbytes.bit_length() - 4))
        return -(-nbytes // step) * step

    @property
    def waiting(self) -> int:
        """Bytes kept for the next arrays (held by no array)."""
        return self._waiting

    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """np.empty(shape, dtype), in kept memory when it is big."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.SMALLEST:
            return np.empty(shape, dtype)
        size = self.size(nbytes)
        with self._lock:
            waiting = self._free.get(size)
            slab = waiting.pop()[1] if waiting else None  # the most recent: the likeliest still in the cache
            if slab is not None:
                self._waiting -= size
        if slab is None:
            raw = np.empty(size + self.ALIGN, np.uint8)
            start = -raw.ctypes.data % self.ALIGN
            slab = raw[start : start + size]
        return np.asarray(_Lease(slab, self))[:nbytes].view(dtype).reshape(shape)

    def _back(self, slab: np.ndarray) -> None:
        if sys.is_finalizing():
            # the interpreter's teardown: nobody will ask again, and a timer armed now could never start
            # (Thread.start would wait for it forever, and the process never exit)
            return
        with self._lock:
            if self._waiting + slab.size > self.limit:
                return  # full: this one goes back to the system
            self._free.setdefault(slab.size, []).append((time.monotonic(), slab))
            self._waiting += slab.size
            self._arm(self.keep_s)

    def _arm(self, delay: float) -> None:
        """A timer that gives back what has waited too long, unless one is already set in this process."""
        if self._timer is not None and self._timer[0] == os.getpid():
            return
        timer = threading.Timer(max(0.0, delay), self._expire)
        timer.daemon = True  # never keeps the interpreter from exiting
        self._timer = (os.getpid(), timer)
        timer.start()

    def _expire(self) -> None:
        with self._lock:
            self._timer = None
            now = time.monotonic()
            for size, slabs in list(self._free.items()):
                kept = [(t, slab) for t, slab in slabs if now - t < self.keep_s]
                self._waiting -= size * (len(slabs) - len(kept))
                if kept:
                    self._free[size] = kept
                else:
                    del self._free[size]
            if self._free:  # the next one to expire
                self._arm(min(t for slabs in self._free.values() for t, _ in slabs) + self.keep_s - now)

    def release(self) -> int:
        """Give every waiting slab back to the system now; returns how many bytes that was."""
        with self._lock:
            freed, self._free, self._waiting = self._waiting, {}, 0
        return freed


class _Lease:
    """The base of an array handed out by Slabs: exposes the slab to NumPy, and gives it back when the
    array's last view goes."""

    def __init__(self, slab: np.ndarray, slabs: Slabs):
        self.slab, self.slabs = slab, slabs
        self.__array_interface__ = slab.__array_interface__

    def __del__(self):
        try:
            self.slabs._back(self.slab)
        except Exception:  # the interpreter shutting down
            pass


# A full capture of GPT-2 small at 1,024 tokens holds about 1.9 GiB: the next one, if it comes within
# KEEP_S seconds, reuses all of it; then the memory goes back to the system.
KEEP_S = 20.0
MEMORY = Slabs(limit=2 << 30, keep_s=KEEP_S)


Piece = TypeVar("Piece")  # what a team shares out: row ranges, (rows, layer, head), ...


class Team:
    """`width` threads, the caller's among them, that share out the pieces of one step, and the memory
    a pass's big arrays come from (MEMORY; for SERIAL, np.empty)."""

    def __init__(self, width: int, pool: ThreadPoolExecutor | None = None, memory: Slabs | None = None):
        self.width = width
        self._pool = pool
        self.memory = memory

    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """Memory for an array of the pass that may outlive its step (np.empty's contract)."""
        return np.empty(shape, dtype) if self.memory is None else self.memory.empty(shape, dtype)

    def each(self, fn: Callable[[Piece], object], pieces: Sequence[Piece]) -> None:
        """fn(piece) for every piece, on the team's threads, in the order the threads come free (what fn
        returns is dropped); returns when all are done (and raises the first error)."""
        if self.width == 1 or len(pieces) == 1 or self._pool is None:
            for piece in pieces:
                fn(piece)
            return
        queue = iter(pieces)  # one iterator, shared: next() on it is atomic under the GIL

        def work() -> None:
            for piece in queue:
                fn(piece)

        pool = self._pool
        helpers = [pool.submit(work) for _ in range(min(self.width, len(pieces)) - 1)]
        try:
            work()
        finally:  # every piece written before anyone reads the arrays, even after an error
            errors = [f.exception() for f in helpers]
        for e in errors:
            if e is not None:
                raise e

    def ranges(self, n: int, smallest: int = ROWS) -> list[slice]:
        """[0, n) cut into about two pieces per thread of at least `smallest` (a multiple of it, but for the
        last), so that a thread that finishes early takes another; one piece for SERIAL."""
        count = max(1, min(2 * self.width, n // smallest)) if self.width > 1 else 1
        edges = [n * i // count // smallest * smallest for i in range(count)] + [n]
        return [slice(a, b) for a, b in zip(edges[:-1], edges[1:])]

    def rows(self, fn: Callable[[slice], object], n: int) -> None:
        """fn(rows) for row ranges covering [0, n)."""
        self.each(fn, self.ranges(n))


SERIAL = Team(1)

_lock = threading.Lock()  # one team at a time: the BLAS's thread count is the whole process's
_pool: ThreadPoolExecutor | None = None
_pool_owner = (0, 0)  # (pid, workers): a forked child's copy of the pool has no threads behind it
_blas = None  # threadpoolctl's controller of NumPy's BLAS, found once; False where there is none


def _numpy_blas():
    global _blas
    if _blas is None:
        try:
            from threadpoolctl import ThreadpoolController

            found = [
                c
                for c in ThreadpoolController().select(user_api="blas").lib_controllers
                if "numpy" in (c.filepath or "")
            ]
            _blas = ThreadpoolController().select(filepath=found[0].filepath) if found else False
        except Exception:  # no threadpoolctl, or a BLAS it cannot see (Accelerate): the BLAS's own threads
            _blas = False
    return _blas or None


def blas_threads() -> int:
    """How many threads NumPy's BLAS may use now (1 where that cannot be read)."""
    blas = _numpy_blas()
    if blas is None:
        return 1
    return max(1, blas.lib_controllers[0].get_num_threads() or 1)


def _helpers(width: int) -> ThreadPoolExecutor:
    """The team's other width - 1 threads, made once per process and width."""
    global _pool, _pool_owner
    if _pool_owner != (os.getpid(), width - 1):
        if _pool is not None and _pool_owner[0] == os.getpid():
            _pool.shutdown(wait=False)  # idle: its threads end
        _pool = ThreadPoolExecutor(width - 1, thread_name_prefix="core-team")
        _pool_owner = (os.getpid(), width - 1)
    assert _pool is not None  # made above for this process and width
    return _pool


# Threads lent to the passes of this context while the BLAS has one (see lend()); 1: none.
_LENT: ContextVar[int] = ContextVar("core_threads_lent", default=1)


@contextmanager
def lend(width: int) -> Iterator[None]:
    """Within it (this thread, or a task and the threads it hands work to), a long pass may take a team `width`
    wide although the BLAS has one thread. The app lends a compute request the machine's cores while no other
    request is computing (app/http/security.py), and keeps its workers at one BLAS thread for when several are.
    A lent team's big arrays are not kept between passes (Slabs): a server worker allocates as before."""
    token = _LENT.set(max(1, width))
    try:
        yield
    finally:
        _LENT.reset(token)


@contextmanager
def team_for(rows: int) -> Iterator[Team]:
    """The team for one pass over `rows` positions: as wide as the BLAS's threads (or as lend() lends, while the
    BLAS has one), with the BLAS kept to one thread until the pass ends, or SERIAL (the BLAS as it is) when the
    pass has fewer than two pieces of rows, the width is one or more than MAX_WIDTH, or another pass holds the
    team."""
    width = blas_threads()
    lent = width == 1 and _LENT.get() > 1
    if lent:
        width = _LENT.get()
    if not (1 < width <= MAX_WIDTH and rows >= 2 * ROWS) or not _lock.acquire(blocking=False):
        yield SERIAL
        return
    try:
        with _numpy_blas().limit(limits=1):
            if blas_threads() != 1:  # another thread controls the BLAS's threads (threadpoolctl ignored us)
                yield SERIAL
            else:
                yield Team(width, _helpers(width), None if lent else MEMORY)
    finally:
        _lock.release()
