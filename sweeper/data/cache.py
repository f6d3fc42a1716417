"""The panel cache: a panel's arrays built once per host, mapped read-only by every process.

An entry is a folder ``<root>/<key>/`` holding ``X.npy``, ``y.npy``, ``y_raw.npy``, ``mask.npy``
(memory-mappable NumPy files), ``dates.npy`` and ``meta.json`` (assets, features, splits, normalisation
statistics, oracle IC, the leak guard's figures). The key is a sha256 of the data fingerprint (file content
and column selection) and of the ``data`` keys that shape the arrays (normalisations, split, the pinned
widths, and the lookback when ``robust_zscore`` fits over it), so a study that tunes ``data.lookback`` with a
cross-sectional normalisation shares one entry between its trials.

- **Once per host**: the first process builds under an exclusive ``flock`` on
  ``<root>/.locks/<key>.lock``; the others wait on it and then map what it wrote.
- **Never half an entry**: the arrays are written into ``<root>/.tmp-<key>-...`` (as file-backed maps,
  so the build holds no second copy), flushed, ``meta.json`` last, and the folder is renamed into
  place in one step. A crash leaves a ``.tmp-`` folder that is never read and is removed by the next
  eviction; an entry that fails to open (damaged by hand, a truncated file) is removed and rebuilt.
- **Read-only maps**: ``np.load(mmap_mode="r")``; the pages are the page cache's, shared
  by every process that maps them, so a host holds one copy however many workers train.
- **Eviction**: after a build, the entries least recently used are removed until the
  cache holds at most ``data.cache_max_gb`` (10^9 bytes), the entry just built excepted.
  An entry another process is opening (shared lock held) is skipped; one already mapped
  is safe to remove, its maps stay valid until they are closed."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sweeper.atomic import unwritable, write_text
from sweeper.config import DataConfig
from sweeper.errors import ConfigError

# the builder imports torch and the split rule pandas; the driver only asks where the cache is
# (cache_root): both load where an entry is keyed, read or written
if TYPE_CHECKING:
    from sweeper.data.build import Alloc, Built

CACHE_VERSION = 2  # 2: time-zone-aware dates at their wall time (1: in UTC)
ENV_DIR = "SWEEPER_CACHE_DIR"
GB = 10**9
_TMP, _TRASH, _LOCKS = ".tmp-", ".trash-", ".locks"
_STALE_TMP_S = 3600.0  # a .tmp- folder whose builder holds no lock and is older than this is debris

def cache_root(cfg: DataConfig) -> Path:
    """``data.cache_dir``, else ``$SWEEPER_CACHE_DIR``, else ``sweeper/panels`` in ``$XDG_CACHE_HOME``."""
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"  # unset or empty: the XDG rule's default
    return Path(cfg.cache_dir or os.environ.get(ENV_DIR) or Path(xdg) / "sweeper" / "panels").expanduser()


def entry_key(fingerprint: str, cfg: DataConfig) -> str:
    """sha256 of the data fingerprint and the config keys that shape the arrays."""
    from sweeper.data.split import split_widths

    shape = {"version": CACHE_VERSION, "data": fingerprint, "feature_norm": cfg.feature_norm,
             "label_norm": cfg.label_norm, "split": cfg.split.model_dump(mode="json"),
             "widths": list(split_widths(cfg)),
             # only robust_zscore's fit depends on the lookback (the dates train windows can see)
             "fit_lookback": cfg.lookback if cfg.feature_norm == "robust_zscore" else None}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:32]


def cached(cfg: DataConfig, fingerprint: str, make: Callable[[Alloc], Built]) -> tuple[Built, Path]:
    """The entry of ``(fingerprint, cfg)``, mapped read-only; built with ``make`` if missing."""
    root = cache_root(cfg)
    try:
        (root / _LOCKS).mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # e.g. a service user's read-only home (the probe says why, off the usual path)
        why = unwritable(root / _LOCKS) or exc.strerror
        raise ConfigError(f"data.cache_dir: the panel cache {root} cannot be made or written ({why}); set "
                          f"data.cache_dir or ${ENV_DIR} to a writable folder, or data.cache: false") from exc
    key = entry_key(fingerprint, cfg)
    entry = root / key
    with _locked(root, key, fcntl.LOCK_SH):
        built = open_entry(entry)
    if built is None:
        with _locked(root, key, fcntl.LOCK_EX):
            if (built := open_entry(entry)) is None:  # another process may have built it while we waited
                if entry.exists():  # incomplete: out of the way of the rebuild
                    _trash(entry)
                _write(entry, make)
                built = open_entry(entry)
                assert built is not None, f"{entry}: the entry just written does not open"
        evict(root, cfg.cache_max_gb * GB, keep=key)
    with contextlib.suppress(OSError):
        os.utime(entry)  # last use: eviction removes the least recently used first
    return built, entry


def open_entry(entry: Path) -> Built | None:
    """The entry's arrays as read-only maps, or None when it is missing or incomplete."""
    from sweeper.data.build import ARRAYS, Built

    try:
        if (meta := json.loads((entry / "meta.json").read_text())).get("version") != CACHE_VERSION:
            return None
        arrays = {name: np.load(entry / f"{name}.npy", mmap_mode="r") for name in ARRAYS}
        if any(list(arrays[n].shape) != meta["shapes"][n] for n in ARRAYS):
            return None
        return Built(**arrays, dates=np.load(entry / "dates.npy"),
                     assets=np.asarray(meta["assets"], dtype=object), features=meta["features"],
                     splits={k: tuple(v) for k, v in meta["splits"].items()}, norm_stats=meta["norm_stats"],
                     oracle_ic=meta["oracle_ic"], leak_corr=meta["leak_corr"], leak_rows=meta["leak_rows"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing, truncated or foreign: never used, rebuilt under the lock


def _write(entry: Path, make: Callable[[Alloc], Built]) -> None:
    from sweeper.data.build import ARRAYS

    tmp = entry.parent / f"{_TMP}{entry.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        def alloc(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
            return np.lib.format.open_memmap(tmp / f"{name}.npy", mode="w+", dtype=dtype, shape=shape)

        built = make(alloc)
        for name in ARRAYS:
            getattr(built, name).flush()  # on disk before the entry can be seen
        np.save(tmp / "dates.npy", built.dates)
        meta = {"version": CACHE_VERSION, "shapes": {n: list(getattr(built, n).shape) for n in ARRAYS},
                "assets": [str(a) for a in built.assets], "features": list(built.features),
                "splits": {k: list(v) for k, v in built.splits.items()}, "norm_stats": built.norm_stats,
                "oracle_ic": built.oracle_ic, "leak_corr": built.leak_corr, "leak_rows": built.leak_rows,
                "created": time.time()}
        write_text(tmp / "meta.json", json.dumps(meta))
        del built
        # the whole folder appears at once: an entry is complete or absent
        os.rename(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def evict(root: Path, max_bytes: float, keep: str = "") -> list[str]:
    """Remove the least recently used entries until the cache holds at most ``max_bytes``
    (``keep`` excepted), and the debris of crashed builds. Returns the removed keys."""
    entries = []
    for path in root.iterdir():
        if path.name.startswith(_TMP):  # a build's: debris once its builder holds no lock and it is old
            with contextlib.suppress(BlockingIOError, OSError):
                if time.time() - path.stat().st_mtime > _STALE_TMP_S:
                    with _locked(root, path.name[len(_TMP):].split("-")[0], fcntl.LOCK_EX | fcntl.LOCK_NB):
                        shutil.rmtree(path, ignore_errors=True)
        elif path.name.startswith(_TRASH):
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_dir() and not path.name.startswith("."):
            size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
            entries.append((path.stat().st_mtime, size, path))
    total = sum(size for _t, size, _p in entries)
    removed = []
    for _used, size, path in sorted(entries, key=lambda e: e[0]):
        if total <= max_bytes:
            break
        if path.name == keep:
            continue
        try:
            with _locked(root, path.name, fcntl.LOCK_EX | fcntl.LOCK_NB):
                _trash(path)
        except (BlockingIOError, OSError):
            continue  # being opened or built right now: next time
        total -= size
        removed.append(path.name)
    return removed


def _trash(entry: Path) -> None:
    """Remove an entry (under its exclusive lock): gone in one step, its files after."""
    trash = entry.parent / f"{_TRASH}{entry.name}-{uuid.uuid4().hex[:8]}"
    os.rename(entry, trash)
    shutil.rmtree(trash, ignore_errors=True)


@contextlib.contextmanager
def _locked(root: Path, key: str, how: int) -> Iterator[None]:
    with open(root / _LOCKS / f"{key}.lock", "a+") as fh:
        fcntl.flock(fh, how)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
