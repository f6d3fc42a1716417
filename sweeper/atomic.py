"""Atomic file writes: the one way sweeper replaces a file.

A reader (a retry adopting a checkpoint, the dashboard, a user's notebook) sees
either the old file or the new one, never half of one: the content goes to a
temporary file in the same folder (same file system, so the rename is atomic)
and is renamed over the target only once it is complete. A failed write
removes its temporary file and leaves the old file as it was.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yields a temporary path beside ``path``; on a clean exit it replaces ``path``.

    >>> with atomic_path("weights.pt") as tmp:   # doctest: +SKIP
    ...     torch.save(state, tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a leading dot keeps half-written files out of globs such as *.parquet
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
