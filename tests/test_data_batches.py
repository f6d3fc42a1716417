"""Batcher: gathered windows equal a slow reference, both batch orders (as training draws them), placement."""
from __future__ import annotations

import pytest
import torch

from sweeper.config import DataConfig, SyntheticConfig
from sweeper.core.schedule import dates_per_batch, epoch_rows
from sweeper.data import Batcher, load_panel, placement
from sweeper.data.placement import free_device_bytes


@pytest.fixture(scope="module")
def panel():
    # a z-scored label differs from the raw one, so the checks tell y and y_raw apart
    return load_panel(DataConfig(synthetic=SyntheticConfig(assets=17, dates=90, features=3, seed=5),
                                 lookback=6, horizon=2, label_norm="cs_zscore"))


def reference(panel, t: int, i: int):
    """The slow, obvious window: what a per-sample Dataset would return."""
    L = panel.lookback
    return panel.X[t - L + 1:t + 1, i, :], panel.y[t, i], panel.y_raw[t, i]


def seen(batches) -> list[tuple[int, int]]:
    return [(int(t), int(i)) for b in batches for t, i in zip(b.t, b.i)]


def random_batches(b: Batcher, batch_size: int, generator: torch.Generator, limit: int | None = None):
    """An epoch in random order, gathered as the training step gathers it."""
    return (b.gather(rows.idx) for rows in epoch_rows(b, "random", batch_size, generator, limit))


def cross_section_batches(b: Batcher, dates: int, generator: torch.Generator, limit: int | None = None):
    """An epoch of whole dates, ``dates`` per batch (the batch size that gives them), gathered."""
    batch_size = round(dates * b.n_samples / b.n_dates)
    assert dates_per_batch(b, batch_size) == dates
    for rows in epoch_rows(b, "cross_section", batch_size, generator, limit):
        batch = b.gather(rows.idx)
        assert rows.date_counts == torch.unique_consecutive(batch.t, return_counts=True)[1].tolist()
        yield batch


def test_gather_equals_the_slow_reference(panel):
    index = panel.sample_index("train")
    picks = index[[0, 1, 57, 300, len(index) - 1]]
    batch = Batcher(panel, "train", "cpu").gather(picks)
    assert batch.x.shape == (5, 6, 3) and batch.x.dtype == torch.float32
    for k, (t, i) in enumerate(picks.tolist()):
        x, y, y_raw = reference(panel, t, i)
        assert torch.equal(batch.x[k], x)
        assert batch.y[k] == y and batch.y_raw[k] == y_raw
        assert batch.t[k] == t and batch.i[k] == i
    assert not torch.equal(batch.x[0], batch.x[1])  # different windows really differ


def test_first_target_window_starts_at_date_zero(panel):
    t0 = panel.splits["train"][0]
    assert t0 == panel.lookback - 1
    i = int(panel.sample_index("train")[0, 1])
    batch = Batcher(panel, "train", "cpu").gather(torch.tensor([[t0, i]]))
    assert torch.equal(batch.x[0], panel.X[0:panel.lookback, i])


def test_random_batches_cover_every_sample_once_and_are_deterministic(panel):
    b = Batcher(panel, "train", "cpu")
    first = seen(random_batches(b, 64, torch.Generator().manual_seed(3)))
    again = seen(random_batches(b, 64, torch.Generator().manual_seed(3)))
    other = seen(random_batches(b, 64, torch.Generator().manual_seed(4)))
    assert first == again and first != other
    assert sorted(first) == [tuple(p) for p in panel.sample_index("train").tolist()]
    assert first != sorted(first)  # really shuffled
    sizes = [len(x.y) for x in random_batches(b, 64, torch.Generator().manual_seed(3))]
    assert sizes[:-1] == [64] * (len(sizes) - 1) and sum(sizes) == b.n_samples


def test_random_batches_limit(panel):
    b = Batcher(panel, "train", "cpu")
    got = seen(random_batches(b, 50, torch.Generator().manual_seed(0), limit=120))
    assert len(got) == 120 and len(set(got)) == 120
    full = seen(random_batches(b, 50, torch.Generator().manual_seed(0)))
    assert got == full[:120]  # the limit takes a prefix of the epoch's permutation
    assert len(seen(random_batches(b, 50, torch.Generator(), limit=10**9))) == b.n_samples


def test_random_batch_contents(panel):
    b = Batcher(panel, "valid", "cpu")
    batch = next(random_batches(b, 8, torch.Generator().manual_seed(1)))
    for k in range(8):
        x, y, y_raw = reference(panel, int(batch.t[k]), int(batch.i[k]))
        assert torch.equal(batch.x[k], x) and batch.y[k] == y and batch.y_raw[k] == y_raw


def test_cross_section_batches_hold_exactly_the_valid_assets_of_each_date(panel):
    b = Batcher(panel, "train", "cpu")
    a, z = panel.splits["train"]
    dates = []
    for batch in cross_section_batches(b, 3, torch.Generator().manual_seed(2)):
        ts = batch.t.tolist()
        groups = list(dict.fromkeys(ts))
        assert len(groups) <= 3
        assert ts == sorted(ts, key=groups.index)  # rows grouped by date
        for t in groups:
            rows = batch.t == t
            expected = (panel.mask[t] & torch.isfinite(panel.y[t])).nonzero()[:, 0]
            assert torch.equal(batch.i[rows], expected)
            for k in rows.nonzero()[:, 0][:2].tolist():
                assert torch.equal(batch.x[k], reference(panel, t, int(batch.i[k]))[0])
        dates += groups
    assert sorted(dates) == list(range(a, z)) and dates != sorted(dates)
    assert b.n_dates == z - a


def test_cross_section_batches_deterministic_and_limited(panel):
    b = Batcher(panel, "train", "cpu")
    one = seen(cross_section_batches(b, 2, torch.Generator().manual_seed(9)))
    assert one == seen(cross_section_batches(b, 2, torch.Generator().manual_seed(9)))
    per_date = len(one) / b.n_dates
    limited = seen(cross_section_batches(b, 2, torch.Generator().manual_seed(9), limit=100))
    assert len(limited) <= 100 and len(limited) > 100 - 2 * per_date
    assert limited == one[:len(limited)]  # whole dates, in the same order
    tiny = list(cross_section_batches(b, 2, torch.Generator().manual_seed(9), limit=1))
    assert len(tiny) == 1 and len(set(tiny[0].t.tolist())) == 1  # at least one date


def test_placement_rule():
    assert placement(100, 1000, 0.1) == "device"
    assert placement(101, 1000, 0.1) == "pinned_host"
    assert placement(10**12, None, 0.5) == "host"


def test_to_cpu_is_a_no_op_and_queries_no_cuda(panel, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("mem_get_info must not be called for a CPU device")

    monkeypatch.setattr(torch.cuda, "mem_get_info", boom)
    assert panel.to("cpu", 0.5) is panel
    assert panel.to(torch.device("cpu"), 0.01) is panel
    assert free_device_bytes(torch.device("cpu")) is None


def test_nbytes_counts_tensors_and_samples(panel):
    T, N, F = panel.X.shape
    samples = int((panel.mask & torch.isfinite(panel.y)).sum())
    assert panel.nbytes == T * N * F * 4 + 2 * T * N * 4 + T * N + samples * 16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("share", [0.9, 1e-12])
def test_cuda_batches_match_cpu(panel, share):
    moved = panel.to("cuda", share)
    assert (moved.X.device.type == "cuda") == (share == 0.9)
    assert share == 0.9 or moved.X.is_pinned()
    gpu = random_batches(Batcher(moved, "train", "cuda"), 64, torch.Generator().manual_seed(0))
    cpu = random_batches(Batcher(panel, "train", "cpu"), 64, torch.Generator().manual_seed(0))
    for g, c in zip(gpu, cpu):
        assert g.x.device.type == "cuda"
        assert torch.equal(g.x.cpu(), c.x) and torch.equal(g.t.cpu(), c.t)


def test_gather_refuses_pairs_without_a_full_window(panel):
    b = Batcher(panel, "train", "cpu")
    T, N = panel.mask.shape
    for bad in ([[panel.lookback - 2, 0]], [[T, 0]], [[30, N]], [[30, -1]]):
        with pytest.raises(IndexError, match="lookback-1 <= t < T"):
            b.gather(torch.tensor(bad))
