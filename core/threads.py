"""One forward pass on every core the BLAS may use: each step cut into pieces that a small team of threads shares.

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
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

ROWS = 64  # the smallest piece of rows: a product of fewer rows runs well below the BLAS's rate
MAX_WIDTH = 8  # beyond this many threads the BLAS's own threading is left as it is (not measured here)


class Team:
    """`width` threads, the caller's among them, that share out the pieces of one step."""

    def __init__(self, width: int, pool: ThreadPoolExecutor | None = None):
        self.width = width
        self._pool = pool

    def each(self, fn: Callable[[object], None], pieces: Sequence) -> None:
        """fn(piece) for every piece, on the team's threads, in the order the threads come free;
        returns when all are done (and raises the first error)."""
        if self.width == 1 or len(pieces) == 1:
            for piece in pieces:
                fn(piece)
            return
        queue = iter(pieces)  # one iterator, shared: next() on it is atomic under the GIL

        def work() -> None:
            for piece in queue:
                fn(piece)

        helpers = [self._pool.submit(work) for _ in range(min(self.width, len(pieces)) - 1)]
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

    def rows(self, fn: Callable[[slice], None], n: int) -> None:
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

            found = [c for c in ThreadpoolController().select(user_api="blas").lib_controllers
                     if "numpy" in (c.filepath or "")]
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
    return _pool


@contextmanager
def team_for(rows: int) -> Iterator[Team]:
    """The team for one pass over `rows` positions: as wide as the BLAS's threads, with the BLAS kept to one
    thread until the pass ends, or SERIAL (the BLAS as it is) when the pass has fewer than two pieces of
    rows, the BLAS has one thread (the app's workers) or more than MAX_WIDTH, or another pass holds the team."""
    width = blas_threads()
    if not (1 < width <= MAX_WIDTH and rows >= 2 * ROWS) or not _lock.acquire(blocking=False):
        yield SERIAL
        return
    try:
        with _numpy_blas().limit(limits=1):
            if blas_threads() != 1:  # another thread controls the BLAS's threads (threadpoolctl ignored us)
                yield SERIAL
            else:
                yield Team(width, _helpers(width))
    finally:
        _lock.release()
