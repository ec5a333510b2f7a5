"""Output paths checked before any work is done: a folder that does not exist or cannot be written is a
one-line error naming the option or argument, not an errno after minutes of simulation (the CLI's options
and the Python API's ``output`` arguments alike)."""

from __future__ import annotations

import os
import tempfile


def cannot_create_in(folder: str) -> str | None:
    """Why no file can be created in ``folder`` (tried with a temporary file, removed at once), or None.

    Tried rather than asked: ``os.access`` says yes to root everywhere, /proc and read-only mounts
    included, and the write then failed after the simulation with a bare errno."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def check_writable(path: str | None, flag: str) -> None:
    """Refuse an output path whose folder does not exist or cannot be written, before any work is done (None:
    not asked for). A blank name (``--trace ''``, ``--csv ' '``) is refused too: it was taken as not asked for,
    or wrote a file named by spaces into the current folder, without a word."""
    if path is None:
        return
    if not path.strip():
        raise ValueError(f"{flag}: needs a file name, got {path!r}")
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(folder):
        raise ValueError(f"{flag}: folder {folder!r} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"{flag}: {path!r} is a folder; give a file name")
    if not os.path.basename(path).strip():
        raise ValueError(f"{flag}: {path!r} names no file (its last part is blank); give a file name")
    reason = cannot_create_in(folder)
    if reason is None and os.path.exists(path) and not os.access(path, os.W_OK):
        reason = "permission denied"
    if reason is not None:
        raise ValueError(f"{flag}: cannot write {path!r} ({reason})")
