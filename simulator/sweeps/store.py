"""Sweep output files: CSV/Parquet read and atomic write, and the rows a resumed sweep reuses."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None  # type: ignore[assignment]

import pandas as pd

from .columns import KEY_COLUMN, RANK_COLUMNS, is_result_column

__all__ = ["OUTPUT_FORMATS", "REUSABLE", "output_format", "read_table", "write_table", "previous_rows",
           "output_lock"]

OUTPUT_FORMATS = (".csv", ".parquet")
"""Suffixes of the files a sweep can write."""
REUSABLE = frozenset({"ok", "invalid", "oom"})
"""Statuses a resumed sweep keeps (deterministic outcomes); ``failed`` points are retried."""


def output_format(path: str | os.PathLike) -> str:
    """The format of an output file, by its suffix.

    Parameters
    ----------
    path : path
        The output file.

    Returns
    -------
    str
        ``".csv"`` or ``".parquet"``.

    Raises
    ------
    ValueError
        One line, for any other suffix, or for Parquet without pyarrow.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"output: must be a file path ending in {' or '.join(OUTPUT_FORMATS)}, got {path!r:.60}")
    suffix = Path(path).suffix.lower()
    if suffix not in OUTPUT_FORMATS:
        raise ValueError(f"output: {os.fspath(path)!r} must end in {' or '.join(OUTPUT_FORMATS)}")
    if suffix == ".parquet" and importlib.util.find_spec("pyarrow") is None:
        raise ValueError("output: .parquet needs pyarrow: pip install '.[parquet]' in the checkout, or pyarrow "
                         "(or write .csv)")
    return suffix


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    """Read a sweep table written by :func:`write_table`.

    Parameters
    ----------
    path : path
        A ``.csv`` or ``.parquet`` file.

    Returns
    -------
    pandas.DataFrame
        In CSV, empty cells are missing values and every other cell is read as written.
    """
    if output_format(path) == ".parquet":
        return pd.read_parquet(path)
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


def _parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Object columns that mix types (e.g. ints and strings) become strings, which Arrow can store."""
    df = df.copy()
    for col in df.columns:
        values = df[col].dropna()
        if pd.api.types.is_object_dtype(df[col].dtype) and not values.map(lambda v: isinstance(v, str)).all():
            df[col] = df[col].map(lambda v: v if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
    return df


def write_table(df: pd.DataFrame, path: str | os.PathLike) -> None:
    """Write ``df`` atomically: a temporary file next to ``path``, then a rename.

    Parameters
    ----------
    df : pandas.DataFrame
        A sweep table.
    path : path
        A ``.csv`` or ``.parquet`` file (format by suffix); replaced if it exists. A symbolic link is
        followed: the file it names is replaced and the link kept (a rename onto the link replaced the link).
    """
    fmt = output_format(path)
    path = Path(os.path.realpath(path))
    # A temporary name of this process's own: two writers never share (and clobber) one temporary file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        if fmt == ".parquet":
            _parquet_safe(df).to_parquet(tmp, index=False)
        else:
            df.to_csv(tmp, index=False)
        os.replace(tmp, path)
    except OSError as exc:  # (a full disk, found at a checkpoint: named, not a bare errno)
        raise ValueError(f"output: cannot write {os.fspath(path)!r}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


@contextlib.contextmanager
def output_lock(path: str | os.PathLike | None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` for a sweep's whole run (a ``.lock`` file beside it).

    A second sweep writing the same output fails at once, naming the file,
    instead of racing the first one and silently losing its rows. POSIX
    ``flock``; released when the sweep ends or its process dies.
    """
    if path is None or fcntl is None:
        yield
        return
    path = Path(path)
    lock = path.with_name(f".{path.name}.lock")
    fh = open(lock, "a+")  # noqa: SIM115 - held for the with-block
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ValueError(f"output: {os.fspath(path)!r} is being written by another sweep; wait for it or "
                             f"choose another file") from None
        yield
    finally:
        fh.close()


def _isna(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def previous_rows(output: str | os.PathLike | None, keys: set[str]) -> tuple[dict[str, dict], pd.DataFrame]:
    """What a resumed sweep takes from an existing output file.

    Parameters
    ----------
    output : path or None
        The output file; ``None`` or a missing file means nothing to resume.
    keys : set of str
        The point keys of this sweep.

    Returns
    -------
    rows : dict
        Point key -> row (missing cells dropped, no ranks nor ``screen_*`` columns) for this
        sweep's points whose status is :data:`REUSABLE`.
    foreign : pandas.DataFrame
        The rows of other sweeps, kept after this sweep's rows.

    Raises
    ------
    ValueError
        When ``output`` exists but is not a sweep table.
    """
    if output is None or not Path(output).exists():
        return {}, pd.DataFrame()
    if not Path(output).is_file():  # (a device or a pipe: /dev/zero read on until memory ran out, a FIFO hung)
        raise ValueError(f"output: {os.fspath(output)!r} exists but is not a regular file (a device, a pipe or a "
                         f"folder); choose another file")
    try:
        old = read_table(output)
    except Exception as exc:  # noqa: BLE001 - a corrupt file of any kind
        raise ValueError(f"output: {os.fspath(output)!r} exists but cannot be read as a sweep table "
                         f"({type(exc).__name__}); move it away or choose another file") from None
    if KEY_COLUMN not in old.columns or "status" not in old.columns:
        raise ValueError(f"output: {os.fspath(output)!r} exists but is not a sweep table; choose another file")
    # A row is only reused when it is whole: a key, a known status and, for ok rows, a step time. A line
    # cut short by a killed writer (an old, non-atomic file) is simulated again rather than trusted.
    whole = old[KEY_COLUMN].notna() & old["status"].isin(REUSABLE)
    if "step_time_s" in old.columns:
        whole &= (old["status"] != "ok") | pd.to_numeric(old["step_time_s"], errors="coerce").notna()
    # Results are numbers: a cell edited to text is not trusted (its row is simulated again), and one such
    # cell does not turn the column's other rows into text (CSV reads a mixed column as strings).
    for column in [c for c in old.columns if is_result_column(c)]:
        numbers = pd.to_numeric(old[column], errors="coerce")
        whole &= numbers.notna() | old[column].isna()
        old[column] = numbers
    mine = old[KEY_COLUMN].isin(keys)
    # (what ranked or screened a row belongs to the sweep that did: a plain sweep reusing a refined row showed the
    # screen's rank beside its own; a screened sweep sets its own again)
    reuse = old[mine & whole].drop(columns=[c for c in old.columns if c in RANK_COLUMNS or c.startswith("screen_")])
    rows = {r[KEY_COLUMN]: {k: v for k, v in r.items() if not _isna(v)} for r in reuse.to_dict("records")}
    return rows, old[~mine & old[KEY_COLUMN].notna()]
