"""The panel cache (sweeper.data.cache): built once per host, mapped read-only everywhere."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pandas as pd
import pytest
import torch

from sweeper.config import DataConfig, validate_config
from sweeper.data import cache as C
from sweeper.data import load_panel, write_synthetic
from sweeper.errors import DataError

SYN = {"assets": 30, "dates": 120, "features": 4, "seed": 3}


def syn(tmp_path, **kw) -> DataConfig:
    return DataConfig(synthetic=kw.pop("synthetic", SYN), lookback=5, cache_dir=str(tmp_path / "cache"), **kw)


def entries(root) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


# Counts the entries this process builds: every finished write of one (a build that fails
# raises out of the write and is not counted). The same count runs in a subprocess's script.
COUNT_BUILDS = """
from sweeper.data import cache as _cache
builds = []
_real_write = _cache._write
def _counted_write(entry, make):
    _real_write(entry, make)
    builds.append(entry)
_cache._write = _counted_write
"""


@pytest.fixture
def builds(monkeypatch) -> list:
    """The entries this process built during the test, in order."""
    done: list = []
    real = C._write

    def counted(entry, make):
        real(entry, make)
        done.append(entry)

    monkeypatch.setattr(C, "_write", counted)
    return done


def assert_same_panel(a, b) -> None:
    for name in ("X", "y", "y_raw", "mask"):
        assert torch.equal(getattr(a, name), getattr(b, name), ) or (
            name in ("y", "y_raw") and torch.equal(getattr(a, name).isnan(), getattr(b, name).isnan())
            and torch.equal(getattr(a, name).nan_to_num(), getattr(b, name).nan_to_num())), name
    assert np.array_equal(a.dates, b.dates) and list(a.assets) == list(b.assets)
    assert (a.features, a.splits, a.norm_stats, a.fingerprint, a.source, a.lookback) == \
        (b.features, b.splits, b.norm_stats, b.fingerprint, b.source, b.lookback)
    assert json.dumps(a.oracle_ic) == json.dumps(b.oracle_ic)
    for split in a.splits:
        assert torch.equal(a.sample_index(split), b.sample_index(split))


def test_built_once_then_mapped(tmp_path, builds):
    before = len(builds)
    first = load_panel(syn(tmp_path))
    x_file = os.path.join(first.cache_entry, "X.npy")
    inode, mtime = os.stat(x_file).st_ino, os.stat(x_file).st_mtime_ns
    second = load_panel(syn(tmp_path))
    assert len(builds) == before + 1  # the second load mapped the entry
    assert second.cache_entry == first.cache_entry
    assert (os.stat(x_file).st_ino, os.stat(x_file).st_mtime_ns) == (inode, mtime)
    assert entries(tmp_path / "cache") == [os.path.basename(first.cache_entry)]
    assert_same_panel(first, second)


def test_arrays_are_read_only_shared_maps(tmp_path):
    panel = load_panel(syn(tmp_path))
    mapped = np.load(os.path.join(panel.cache_entry, "X.npy"), mmap_mode="r")
    assert isinstance(mapped, np.memmap) and not mapped.flags.writeable
    # the panel's tensors are views of the maps (no private copy): the pages are the file's
    maps = open("/proc/self/maps").read().splitlines()
    for name in ("X", "y", "y_raw", "mask"):
        path = os.path.join(panel.cache_entry, f"{name}.npy")
        lines = [ln for ln in maps if ln.endswith(path)]
        assert lines and all(ln.split()[1].startswith("r--s") for ln in lines), (name, lines)
        start, stop = (int(v, 16) for v in lines[0].split()[0].split("-"))
        assert any(start <= getattr(panel, name).data_ptr() < stop
                   for ln in lines for start, stop in [(int(v, 16) for v in ln.split()[0].split("-"))])
    assert panel.to("cpu", 0.5) is panel  # the CPU keeps the map


def test_cache_and_no_cache_give_the_same_panel_predictions_and_metrics(tmp_path):
    from sweeper.core import train

    raw = {"data": {"synthetic": SYN, "lookback": 5, "cache_dir": str(tmp_path / "cache")},
           "model": {"name": "mlp", "hidden_size": 8, "dropout": 0.0},
           "train": {"epochs": 2, "batch_size": 128, "eval_batch_size": 256, "lr": 3e-3, "seed": 0}}
    results, panels = [], []
    for cache in (True, False):
        cfg = validate_config(raw | {"data": raw["data"] | {"cache": cache}}, "cache test")
        panels.append(load_panel(cfg.data))
        results.append(train(cfg, panels[-1], device="cpu"))
    assert panels[0].cache_entry is not None and panels[1].cache_entry is None
    assert_same_panel(*panels)
    mapped, plain = results
    timing = {"peak_mem_mb", "probe_peak_mem_mb", "duration_s", "samples_per_s", "final_scoring_s"}  # of the process, not the model
    scores = {k: v for k, v in mapped.metrics.items() if k not in timing}
    assert json.dumps(scores) == json.dumps({k: v for k, v in plain.metrics.items() if k not in timing})
    assert {"val_ic", "test_ic"} <= set(scores)
    for split in ("valid", "test"):
        pd.testing.assert_frame_equal(mapped.predictions[split], plain.predictions[split])


def test_a_changed_file_or_array_shaping_key_is_a_new_entry(tmp_path):
    path = tmp_path / "p.parquet"
    write_synthetic(path, 20, 80, 3, seed=1)

    def cfg(**kw) -> DataConfig:
        # a study pins the split's widths (data.split.*) to the widest its trials sample
        return DataConfig(**{"path": str(path), "lookback": 5, "split": {"lookback": 9},
                             "cache_dir": str(tmp_path / "cache"), **kw})

    keys = [load_panel(cfg()).cache_entry]
    # keys that do not shape the arrays share the entry (trials of a study tuning lookback share one)
    for same in (cfg(device_share=0.9), cfg(max_feature_label_corr=0.9), cfg(lookback=7), cfg(cache_max_gb=9)):
        assert load_panel(same).cache_entry == keys[0]
    for other in (cfg(feature_norm="cs_rank"), cfg(label_norm="cs_zscore"), cfg(features=["f00", "f01"]),
                  cfg(feature_norm="robust_zscore"), cfg(feature_norm="robust_zscore", lookback=7),
                  cfg(embargo=2)):
        keys.append(load_panel(other).cache_entry)
    write_synthetic(path, 20, 80, 3, seed=2)  # new content, same name
    keys.append(load_panel(cfg()).cache_entry)
    assert len(set(keys)) == len(keys) == 8
    assert len(entries(tmp_path / "cache")) == 8


def test_leak_guard_judges_a_cached_entry_with_the_current_threshold(tmp_path):
    frame = pd.DataFrame({"date": np.repeat(pd.bdate_range("2021-01-04", periods=60), 30),
                          "asset": [f"S{k}" for k in range(30)] * 60})
    rng = np.random.default_rng(0)
    frame["label"] = rng.normal(size=len(frame))
    frame["f"] = rng.normal(size=len(frame))
    frame["fut"] = frame["label"] + 0.3 * rng.normal(size=len(frame))
    frame.to_parquet(tmp_path / "p.parquet", index=False)
    cfg = DataConfig(path=str(tmp_path / "p.parquet"), lookback=5, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataError, match="feature column 'fut'"):
        load_panel(cfg)
    assert entries(tmp_path / "cache") == []  # a refused panel is not kept
    load_panel(cfg.model_copy(update={"max_feature_label_corr": 1.0}))
    assert len(entries(tmp_path / "cache")) == 1
    with pytest.raises(DataError, match="feature column 'fut'"):
        load_panel(cfg)  # the cached figures, judged again


def test_eviction_removes_the_least_recently_used_past_the_size_cap(tmp_path):
    root = tmp_path / "cache"
    made = [load_panel(syn(tmp_path, synthetic=SYN | {"seed": s})).cache_entry for s in (1, 2, 3)]
    for k, entry in enumerate(made):
        os.utime(entry, (1000 + k, 1000 + k))  # seed 1 used longest ago
    size = sum(f.stat().st_size for f in os.scandir(made[0]) if f.is_file())
    removed = C.evict(root, max_bytes=2.5 * size, keep=os.path.basename(made[0]))
    assert removed == [os.path.basename(made[1])]  # the oldest but the kept one
    assert entries(root) == sorted(os.path.basename(m) for m in (made[0], made[2]))
    # through load_panel: a cap of zero keeps only the entry just built
    newest = load_panel(syn(tmp_path, synthetic=SYN | {"seed": 4}, cache_max_gb=0)).cache_entry
    assert entries(root) == [os.path.basename(newest)]


def test_a_torn_entry_is_never_used(tmp_path, builds):
    reference = load_panel(syn(tmp_path, cache=False))
    first = load_panel(syn(tmp_path))
    x_file = os.path.join(first.cache_entry, "X.npy")
    del first
    with open(x_file, "r+b") as fh:  # a crash (or a full disk) cut the file short
        fh.truncate(os.path.getsize(x_file) // 2)
    before = len(builds)
    again = load_panel(syn(tmp_path))
    assert len(builds) == before + 1 and os.path.getsize(x_file) > 0
    assert_same_panel(again, reference.__class__(**{**reference.__dict__, "cache_entry": again.cache_entry}))
    os.remove(os.path.join(again.cache_entry, "meta.json"))  # no meta: not complete
    assert load_panel(syn(tmp_path)).cache_entry == again.cache_entry and len(builds) == before + 2


@pytest.mark.slow
def test_a_builder_killed_mid_build_leaves_nothing_that_is_read(tmp_path, builds):
    cfg = syn(tmp_path)
    script = textwrap.dedent(f"""
        import os, signal
        from sweeper.config import DataConfig
        from sweeper.data import build, load_panel
        def die(*a, **k):
            os.kill(os.getpid(), signal.SIGKILL)  # after the features were written, before normalising
        build.normalize_inplace = die
        load_panel(DataConfig.model_validate({cfg.model_dump(mode="json")!r}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == -9, out.stderr
    root = tmp_path / "cache"
    debris = [p for p in root.iterdir() if p.name.startswith(".tmp-")]
    assert len(debris) == 1 and (debris[0] / "X.npy").exists() and entries(root) == []
    before = len(builds)
    panel = load_panel(cfg)
    assert len(builds) == before + 1
    assert_same_panel(panel, load_panel(cfg.model_copy(update={"cache": False})).__class__(
        **{**load_panel(cfg.model_copy(update={"cache": False})).__dict__, "cache_entry": panel.cache_entry}))
    os.utime(debris[0], (0, 0))  # old, and its builder holds no lock: eviction clears it
    C.evict(root, max_bytes=1e12)
    assert not debris[0].exists() and entries(root) == [os.path.basename(panel.cache_entry)]


@pytest.mark.slow
def test_a_sweeps_summary_child_stopped_mid_build_removes_its_build(tmp_path):
    """``sweeper run`` builds the panel in its summary's child (``python -m sweeper.study.summary``),
    which the driver stops with SIGTERM (then SIGKILL past a grace) when it is interrupted: the
    half-built entry goes with it, as it did when the driver built it and Ctrl-C unwound its build."""
    cfg = validate_config({"data": syn(tmp_path).model_dump(mode="json")}, "s.yaml")
    script = textwrap.dedent("""
        import os, signal, sys
        from sweeper import child
        from sweeper.data import build
        from sweeper.study import summary
        def stop(*a, **k):
            os.kill(os.getpid(), signal.SIGTERM)  # after the features were written, before normalising
        build.normalize_inplace = stop
        sys.exit(child.main(summary.main))  # as `python -m sweeper.study.summary` starts
    """)
    from sweeper.config import to_dict

    out = subprocess.run([sys.executable, "-c", script], input=json.dumps(to_dict(cfg)), capture_output=True,
                         text=True, timeout=120)
    assert (out.returncode, out.stdout) == (128 + 15, ""), out.stderr
    root = tmp_path / "cache"
    assert sorted(p.name for p in root.iterdir()) == [".locks"]  # no entry, and no .tmp- debris


@pytest.mark.slow
def test_concurrent_builders_make_one_entry_and_see_the_same_arrays(tmp_path):
    cfg = syn(tmp_path, synthetic={"assets": 80, "dates": 400, "features": 6, "seed": 5})
    script = COUNT_BUILDS + textwrap.dedent(f"""
        import hashlib, json
        from sweeper.config import DataConfig
        from sweeper.data import load_panel
        p = load_panel(DataConfig.model_validate({cfg.model_dump(mode="json")!r}))
        digest = hashlib.sha256(p.X.numpy().tobytes() + p.y.numpy().tobytes() + p.mask.numpy().tobytes()).hexdigest()
        print(json.dumps({{"builds": len(builds), "digest": digest, "entry": p.cache_entry}}))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [json.loads(p.communicate(timeout=180)[0].splitlines()[-1]) for p in procs]
    assert sorted(o["builds"] for o in outs) == [0, 1]
    assert outs[0]["digest"] == outs[1]["digest"] and outs[0]["entry"] == outs[1]["entry"]
    assert entries(tmp_path / "cache") == [os.path.basename(outs[0]["entry"])]


def test_building_peaks_below_twice_the_final_arrays(tmp_path):
    path = tmp_path / "p.parquet"
    write_synthetic(path, 300, 600, 48, seed=0)
    for cache in (False, True):
        cfg = DataConfig(path=str(path), lookback=5, cache=cache, cache_dir=str(tmp_path / "cache"))
        tracemalloc.start()
        panel = load_panel(cfg)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        final = sum(getattr(panel, n).nbytes for n in ("X", "y", "y_raw", "mask"))
        # numpy's allocations are traced; the cached build writes into file maps, not the heap
        assert peak <= (2.0 if not cache else 1.0) * final, (cache, peak / final)


def test_a_files_fingerprint_is_remembered_until_the_file_changes(tmp_path):
    import os

    from sweeper.data.parquet import file_fingerprint

    data = tmp_path / "panel.parquet"
    data.write_bytes(b"x" * 1000)
    memo = tmp_path / "cache"
    plain = file_fingerprint(data, {"features": ["a"]})
    assert file_fingerprint(data, {"features": ["a"]}, memo) == plain  # same value as without a memo
    [record] = (memo / ".fingerprints").iterdir()
    record.write_text("f" * 64)  # proves the next call reads the record instead of the file
    assert file_fingerprint(data, {"features": ["a"]}, memo) == "f" * 64
    assert file_fingerprint(data, {"features": ["b"]}, memo) not in (plain, "f" * 64)  # selection is part of the key
    st = data.stat()
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # touched: hashed again
    assert file_fingerprint(data, {"features": ["a"]}, memo) == plain


def test_the_default_cache_folder_follows_xdg_cache_home(tmp_path, monkeypatch):
    """$XDG_CACHE_HOME was ignored: the panels went to ~/.cache whatever it said."""
    monkeypatch.delenv("SWEEPER_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    data = DataConfig(synthetic={})
    assert C.cache_root(data) == tmp_path / "xdg" / "sweeper" / "panels"
    monkeypatch.setenv("XDG_CACHE_HOME", "")  # empty: as if unset
    assert C.cache_root(data) == tmp_path / "home" / ".cache" / "sweeper" / "panels"
    monkeypatch.setenv("SWEEPER_CACHE_DIR", str(tmp_path / "own"))
    assert C.cache_root(data) == tmp_path / "own"
