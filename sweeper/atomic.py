"""Atomic file writes: the one way sweeper replaces a file.

A reader (a retry adopting a checkpoint, the dashboard, a user's notebook) sees either the old file or the
new one, never half of one: the content goes to a temporary file in the same folder (same file system, so
the rename is atomic), renamed over the target once complete. A failed write removes its temporary file and
leaves the old file as it was. The file takes the mode a plain ``open()`` would give it (0666 less the
umask), not mkstemp's 0600: on shared storage a colleague must be able to read a report.

A write that finds no space (ENOSPC) or no quota (EDQUOT) raises
:class:`~sweeper.errors.DiskFull` naming the file; :func:`disk_full` and :func:`as_disk_full`
are the same rule for writes that are not atomic (logs, CSVs)."""

import contextlib
import csv
import errno
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from sweeper.errors import DiskFull

NO_SPACE = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}
# torch.save(state, path) writes through C++ streams: on a full disk it raises a bare
# RuntimeError ("unexpected pos ...") with no errno anywhere. Such an error while the
# folder's file system has less than this free is taken for a full disk.
LOW_SPACE_BYTES = 1 << 20
_umask_lock = threading.Lock()


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yields a temporary path beside ``path``; on a clean exit it replaces ``path``.

    >>> with atomic_path("weights.pt") as tmp:   # doctest: +SKIP
    ...     torch.save(state, tmp)"""
    path = Path(path)
    if path.exists() and not (path.is_file() or path.is_dir()):  # a device or a FIFO (-o /dev/null, a pipe):
        yield path  # written in place; a rename would put a plain file where it was (in /dev, as root)
        return
    path = path.resolve() if path.is_symlink() else path  # the link's target is replaced, not the link
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a leading dot keeps half-written files out of globs such as *.parquet
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, 0o666 & ~current_umask())
        finally:
            os.close(fd)
    except OSError as exc:
        if (full := as_disk_full(exc, path)) is None:
            raise
        raise full from exc
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        # judged before the temporary file goes: its bytes are part of what filled the disk
        full = as_disk_full(exc, path) if isinstance(exc, Exception) else None
        Path(tmp).unlink(missing_ok=True)
        if full is None or full is exc:
            raise
        raise full from exc


def unwritable(folder: Path) -> str | None:
    """Why ``folder`` cannot be made or written (None: it can), tried by making and removing a folder in its
    nearest existing parent (``os.access`` says yes to root on a read-only mount): a check before the work."""
    parent = nearest_existing(folder)
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".sweeper-check-", dir=parent))
    except OSError as exc:  # a file where a folder should be, too
        return f"{parent}: {exc.strerror}"
    return None


def write_text(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def append_csv(path: Path, rows: Sequence[Mapping[str, object]]) -> None:
    """Append ``rows`` to the CSV at ``path`` (not atomically), with the header first in a new file."""
    with path.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        if fh.tell() == 0:  # a new (or empty) file
            writer.writeheader()
        writer.writerows(rows)


def disk_full(exc: BaseException, path: str | Path | None = None) -> bool:
    """Whether ``exc`` means the disk (or the quota) is full: a DiskFull, an ENOSPC or EDQUOT on
    its cause/context chain, or, given the ``path`` written, a RuntimeError while that file
    system has (almost) no space left."""
    return isinstance(exc, DiskFull) or _no_space_errno(exc, path) is not None


def as_disk_full(exc: BaseException, path: str | Path) -> DiskFull | None:
    """``exc`` as a DiskFull naming ``path`` ("no space left on device writing <path>
    (ENOSPC)"), ``exc`` itself when it is one, or None when it is no full disk."""
    if isinstance(exc, DiskFull):
        return exc
    if (code := _no_space_errno(exc, path)) is None:
        return None
    full = DiskFull(f"{NO_SPACE[code]} writing {path} ({errno.errorcode[code]})")
    full.errno = code
    full.__cause__ = exc  # a logged traceback still shows the write that failed
    return full


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says (another thread creating a
    file meanwhile would otherwise get a 0o077 umask); else set and reset."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    with _umask_lock:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def _no_space_errno(exc: BaseException, path: str | Path | None) -> int | None:
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, OSError) and link.errno in NO_SPACE:
            return link.errno
        link = link.__cause__ or link.__context__
    if path is None or not isinstance(exc, RuntimeError):
        return None
    try:  # bytes free to this user on the file system the file was written to
        free = shutil.disk_usage(nearest_existing(path)).free
    except OSError:
        return None  # cannot tell: not taken for a full disk
    return errno.ENOSPC if free < LOW_SPACE_BYTES else None


def nearest_existing(path: str | Path) -> Path:
    """``path``, or the nearest of its folders that exists (the file system a file will be on)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe
