"""Sweep errors: :class:`SweepInterrupted` and the one-line text of an exception."""

from __future__ import annotations

import os

import pandas as pd

__all__ = ["SweepInterrupted", "one_line", "failed_reason"]


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep; ``table`` holds the rows finished so far (already written to ``output``).

    Attributes
    ----------
    table : pandas.DataFrame
        The finished rows, ranked as :func:`simulator.sweeps.sweep` returns them.
    output : path or None
        The file the rows were written to, if any.
    """

    def __init__(self, table: pd.DataFrame, output: str | os.PathLike | None) -> None:
        super().__init__(f"sweep interrupted after {len(table)} points")
        self.table = table
        self.output = output


def one_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type name when the message is empty).

    Parameters
    ----------
    exc : BaseException
        Any exception.

    Returns
    -------
    str
        Text without newlines, for a table cell or an error message.
    """
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def failed_reason(exc: BaseException) -> str:
    """The ``reason`` of a ``failed`` row: ``"<Type>: <first line>"``, e.g. ``"RuntimeError: boom"``.

    Parameters
    ----------
    exc : BaseException
        The unexpected error (a simulator bug, a deadlock, a lost worker).

    Returns
    -------
    str
        One line.
    """
    return f"{type(exc).__name__}: {one_line(exc)}"
