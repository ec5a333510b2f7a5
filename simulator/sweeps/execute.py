"""Sweep executors: run point documents in this process, a local process pool or a Dask cluster.

Every executor is a context manager yielding ``(index, result)`` pairs as the
points finish; a result is :func:`~simulator.sweeps.worker.run_point`'s dict,
or a ``failed`` row when the worker itself was lost.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from .errors import failed_reason, one_line
from .worker import run_point

__all__ = ["executor"]

Results = Iterator[tuple[int, dict]]
DASK_CONNECT_S = 5
"""Seconds to reach a Dask scheduler before giving up (a scheduler on the network answers in well under one)."""


def executor(docs: Sequence[Mapping], jobs: int | None,
             scheduler: str | None) -> contextlib.AbstractContextManager[Results]:
    """The context manager that runs ``docs`` and yields ``(index, result)`` pairs as they finish.

    Parameters
    ----------
    docs : sequence of Mapping
        Complete experiment documents, one per point.
    jobs : int or None
        Local worker processes (``None``: all cores); at most one per
        document, and ``<= 1`` runs in this process.
    scheduler : str or None
        Address of a Dask distributed scheduler; overrides ``jobs``.

    Returns
    -------
    context manager
        Entering it starts the work and gives an iterator of ``(index into docs, result dict)``.

    Raises
    ------
    ValueError
        On entering, when ``scheduler`` is given but dask.distributed is
        missing or the scheduler cannot be reached.
    """
    if scheduler:
        return _dask(docs, scheduler)
    jobs = min(jobs or os.cpu_count() or 1, len(docs))
    return _inline(docs) if jobs <= 1 else _process_pool(docs, jobs)


def _finished(future: Any) -> dict:
    """A finished pool or Dask future's row; an error (a crashed or killed worker) becomes a ``failed`` row."""
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 - e.g. BrokenProcessPool, a lost Dask worker
        return {"status": "failed", "reason": failed_reason(exc), "sim_wall_s": float("nan")}


@contextlib.contextmanager
def _inline(docs: Sequence[Mapping]) -> Iterator[Results]:
    yield ((i, run_point(doc)) for i, doc in enumerate(docs))


def _ignore_sigint() -> None:
    """Pool-worker initializer: Ctrl-C is handled by the parent, which writes the rows and stops the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _mp_context() -> multiprocessing.context.BaseContext:
    """``fork`` on Linux while this process has a single thread (fast; no ``__main__`` guard needed),
    ``forkserver`` on Linux otherwise (fork is unsafe with threads: Jupyter, a Dask client), ``spawn`` elsewhere.
    """
    if not sys.platform.startswith("linux"):
        return multiprocessing.get_context("spawn")
    return multiprocessing.get_context("fork" if threading.active_count() == 1 else "forkserver")


@contextlib.contextmanager
def _process_pool(docs: Sequence[Mapping], jobs: int) -> Iterator[Results]:
    pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=_mp_context(), initializer=_ignore_sigint)
    futures = {pool.submit(run_point, doc): i for i, doc in enumerate(docs)}
    finished = False
    try:
        yield ((futures[f], _finished(f)) for f in cf.as_completed(futures))
        finished = True
    finally:
        workers = list((getattr(pool, "_processes", None) or {}).values())  # shutdown() forgets them
        pool.shutdown(wait=finished, cancel_futures=True)
        if not finished:
            _terminate(workers)


def _terminate(workers: Iterable[multiprocessing.process.BaseProcess]) -> None:
    """Stop the workers of an interrupted pool now rather than after their current point."""
    for proc in workers:
        with contextlib.suppress(Exception):
            proc.terminate()
    for proc in workers:
        with contextlib.suppress(Exception):
            proc.join(timeout=5)


def _connect(client_class: type, address: str) -> Any:
    """A Dask ``Client`` of the scheduler at ``address``, or a one-line ``ValueError`` saying why not: nothing
    listens there, the address does not parse, or what answers is not a Dask scheduler. ``Client``'s own timeout
    bounds the connection only, not the handshake: a peer that accepts and says nothing (the dashboard's port,
    8787, instead of the scheduler's, 8786) held the sweep forever, and one that answers with other bytes (an
    HTTP server) ended in a traceback. So the client is made in a daemon thread waited for a bounded time."""
    made: dict[str, Any] = {}
    lock = threading.Lock()

    def connect() -> None:
        try:
            client = client_class(address, timeout=f"{DASK_CONNECT_S}s")
        except BaseException as exc:  # noqa: BLE001 - reported below, in the caller's thread
            made["error"] = exc
            return
        with lock:
            late = made.get("abandoned", False)
            if not late:
                made["client"] = client
        if late:  # (made after the caller gave up: not left open as dask's default client)
            client.close()

    thread = threading.Thread(target=connect, name="clustersim-dask-connect", daemon=True)
    thread.start()
    thread.join(3 * DASK_CONNECT_S)
    with lock:
        if "client" in made:
            return made["client"]
        made["abandoned"] = True
    exc = made.get("error")
    if thread.is_alive():
        raise ValueError(f"--scheduler: {address} accepted a connection but no Dask scheduler answered within "
                         f"{3 * DASK_CONNECT_S} s (a scheduler listens on port 8786; 8787 is its dashboard)")
    if isinstance(exc, (OSError, TimeoutError)):
        raise ValueError(f"--scheduler: cannot connect to {address} within {DASK_CONNECT_S} s: "
                         f"{one_line(exc)}") from None
    if isinstance(exc, ValueError):  # (an address dask cannot parse: 'bogus' has no port)
        raise ValueError(f"--scheduler: {address!r} is not a scheduler address (tcp://HOST:PORT): "
                         f"{one_line(exc)}") from None
    raise ValueError(f"--scheduler: what answers at {address} is not a Dask scheduler ({type(exc).__name__}: "
                     f"{one_line(exc)[:200]})") from None


@contextlib.contextmanager
def _dask(docs: Sequence[Mapping], address: str) -> Iterator[Results]:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise ValueError("--scheduler needs dask.distributed: pip install '.[dask]' in the checkout "
                         "(or dask[distributed])") from None
    client = _connect(Client, address)
    futures = client.map(run_point, list(docs), pure=False)
    index = {f.key: i for i, f in enumerate(futures)}
    finished = False
    try:
        yield ((index[f.key], _finished(f)) for f in as_completed(futures))
        finished = True
    finally:
        if not finished:
            client.cancel(futures)
        client.close()
