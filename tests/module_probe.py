"""A model that records which ``sweeper`` modules its worker process has loaded.

Used by ``model.name: module_probe:Recorder``. Inside a worker (``python -m
sweeper.worker.main``) it writes the loaded module names when the model is
built and again at every evaluation pass (the last one is the final scoring, after
which the worker only records results), to ``$SWEEPER_TEST_MODULES/<pid>-*.json``.
At exit would be later still, but the driver SIGKILLs an idle worker at shutdown.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn


def _in_worker() -> bool:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == "sweeper.worker.main"


def _record(tag: str) -> None:
    names = sorted(m for m in sys.modules if m == "sweeper" or m.startswith("sweeper."))
    out = Path(os.environ["SWEEPER_TEST_MODULES"]) / f"{os.getpid()}-{tag}.json"
    out.write_text(json.dumps(names))


class Recorder(nn.Module):
    def __init__(self, n_features: int, lookback: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n_features, 1)
        self.recording = _in_worker() and bool(os.environ.get("SWEEPER_TEST_MODULES"))
        if self.recording:
            _record("built")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recording and not self.training:
            _record("eval")
        return self.linear(x[:, -1]).squeeze(-1)
