"""What a study records of its panel, fixed for the whole study: written to the study's
attributes by the parent, read back by the view and ``inspect``.

Making it means loading the panel, which means torch. The driver of ``sweeper run`` does not import torch
(about 2.4 s of CPU on a 2-core box, and 300 MB it would hold for the whole sweep): it asks its worker fork
server for a child that runs :func:`main` (``python -m sweeper.study.summary``: the config as JSON on stdin,
as :func:`sweeper.config.to_dict` writes it, and one JSON answer line on stdout), and only where there is no
server (``validate``, ``db init``) calls :func:`summarize_panel` itself."""
from __future__ import annotations

import dataclasses
import json
import signal
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sweeper import child, errors
from sweeper import config as C
from sweeper.config.validation import MIN_VALID_DATES

if TYPE_CHECKING:
    from sweeper.data.panel import Panel


@dataclass(frozen=True)
class PanelSummary:
    """What the study records of the panel, fixed for the whole study (``data.split.*``)."""

    source: str
    fingerprint: str
    features: list[str]
    split_dates: dict[str, list[str]]  # {split: [first, last]} target dates as ISO days
    oracle_ic: dict[str, float] | None
    # walk-forward folds' [{"train": [first, last], "valid": [first, last]}] (empty: one fold)
    folds: list[dict[str, list[str]]] = field(default_factory=list)
    # target dates per split and per fold's train and valid ({split: n}, [{"train": n, "valid": n}]): validate
    n_dates: dict[str, int] = field(default_factory=dict)
    fold_n_dates: list[dict[str, int]] = field(default_factory=list)

    @classmethod
    def of(cls, panel: Panel, cfg: C.SweeperConfig | None = None) -> PanelSummary:
        """``cfg``: the study's, whose walk-forward folds are laid out on the panel here (the
        check that they fit: a ConfigError naming the keys before anything is written)."""
        from sweeper.data.folds import fold_layout, fold_spans
        from sweeper.validation.grid import RunGrid

        layout = fold_layout(panel, cfg) if cfg is not None and RunGrid.of(cfg).folded else []
        return cls(source=panel.source, fingerprint=panel.fingerprint, features=list(panel.features),
                   split_dates=panel.split_dates(), oracle_ic=panel.oracle_ic,
                   folds=fold_spans(panel, layout),
                   n_dates={k: stop - start for k, (start, stop) in panel.splits.items()},
                   fold_n_dates=[{"train": f.train[1] - f.train[0], "valid": f.valid[1] - f.valid[0]}
                                 for f in layout])

    def thin_splits(self, walk_forward: bool) -> list[str]:
        """Warnings for a valid (holdout) or test split of fewer than ``MIN_VALID_DATES`` target dates (a
        walk-forward valid block that short is refused, sweeper.data.folds)."""
        named, least = ("valid", "test")[walk_forward:], MIN_VALID_DATES
        return [f"warning: data.split.{k} has {n} target dates: a mean IC over fewer than {least} is mostly "
                "noise" for k, n in self.n_dates.items() if k in named and n < least]


def summarize_panel(cfg: C.SweeperConfig) -> PanelSummary:
    """Load ``cfg``'s panel in this process (with ``data.cache``, building its cache entry, which
    the workers then map) and summarise it; raises DataError or ConfigError. The panel itself is
    dropped: the driver holds no dense copy while workers train."""
    from sweeper.data import load_panel

    return PanelSummary.of(load_panel(cfg.data), cfg)


def read_answer(out: str) -> PanelSummary | None:
    """The summary a :func:`main` child wrote; its domain error raised here as it was raised
    there; None when it gave no answer (it died: the caller summarises in its own process,
    where whatever killed the child shows itself with its traceback)."""
    try:  # a child killed while it wrote leaves a cut line
        answer = json.loads(out.splitlines()[-1]) if out.strip() else None
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        return None
    if "error" in answer:
        kind = getattr(errors, answer["error"]["type"], None)
        if not (isinstance(kind, type) and issubclass(kind, errors.SweeperError)):
            return None
        raise kind(answer["error"]["message"])
    return PanelSummary(**answer["summary"])


def main() -> int:
    """The child (:mod:`sweeper.child`): the study config as JSON on stdin, one answer line out."""
    signal.signal(signal.SIGTERM, _exit_on_term)  # a stopped one: its half-built cache entry is removed
    answers = child.answers()
    cfg = C.validate_config(json.load(sys.stdin), "study config")  # as a worker reads it
    try:
        answer: dict[str, Any] = {"summary": dataclasses.asdict(summarize_panel(cfg))}
    except errors.SweeperError as exc:
        answer = {"error": {"type": type(exc).__name__, "message": str(exc)}}
    answers.write(json.dumps(answer) + "\n")
    return 0


def _exit_on_term(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the panel cache's clean-up of its build


if __name__ == "__main__":
    sys.exit(child.main(main))
