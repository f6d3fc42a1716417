"""``study.keep``: which of the finished trials' files the keep policy removes, and removing
them. The one home of that rule (the policy itself is :class:`sweeper.config.KeepConfig`).

- checkpoints (``checkpoint.pt``): ``all`` keeps every one; ``none`` and ``top_k`` remove a
  trial's checkpoint unless it is *live* (:class:`~sweeper.store.trial_folder.Liveness`).
  ``top_k`` also keeps the top k trials' checkpoints. With a checkpoint go the
  ``runs/*/weights.pt`` an interrupted walk-forward trial left for its retry;
- weights (``weights.pt``) and predictions (``daily_ic_*.csv``, ``predictions_*.parquet``):
  ``top_k`` removes those of every finished (COMPLETE, PRUNED, FAIL) trial outside the top k.

The top k are the first k of :func:`sweeper.store.studies.ranked`. The list only shrinks as a study goes on
(a finished trial's value never changes, more trials only push it down), so a collector reading an older
snapshot of the study removes less, never more: several workers may collect at once. A removed file's copy
in the folder artifact store (``<run_dir>/artifacts/<id>``, uploaded for optuna-dashboard) is removed with
it; the dashboard then lists the artifact without its file."""

import json
import os
import shlex
import shutil
import stat
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from sweeper.atomic import nearest_existing
from sweeper.config import StudyConfig, SweeperConfig
from sweeper.errors import one_line
from sweeper.store.layout import TrialFiles, artifact_copy, trial_files
from sweeper.store.studies import ranked
from sweeper.store.trial_folder import Liveness, TrialFolder, remove
from sweeper.study.retry_rule import retry_plan
from sweeper.study.warm_start import held_ahead

ENDED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
ARTIFACT_PREFIX = "artifacts:"  # Optuna's system attr of an uploaded artifact (optuna.artifacts)


@dataclass
class Freed:
    """What a collection removed (or, in a dry run, would remove): each file with its size."""

    files: list[tuple[Path, int]] = field(default_factory=list)
    dry_run: bool = False

    @property
    def bytes(self) -> int:
        return sum(size for _, size in self.files)

    def summary(self) -> str:
        verb = "would free" if self.dry_run else "freed"
        return f"{verb} {human_bytes(self.bytes)} in {len(self.files)} files"

    def lines(self, limit: int = 40) -> list[str]:
        """What ``sweeper gc`` prints: in a dry run each file with its size (past ``limit``
        files, a count of the rest), then the total."""
        if not self.dry_run:
            return [self.summary()]
        shown = [f"  {path}  {human_bytes(size)}" for path, size in self.files[:limit]]
        if rest := self.files[limit:]:
            shown.append(f"  ... and {len(rest)} more files ({human_bytes(sum(s for _, s in rest))})")
        return [*shown, self.summary()]


def human_bytes(n: float) -> str:
    """``512 B``, ``5.3 KB``, ``1.2 MB``, ``3.4 GB`` (powers of 1024)."""
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit in ("KB", "MB"):
        n /= 1024
        if abs(n) < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} GB"


def top_k(trials: list[FrozenTrial], k: int, maximize: bool) -> list[FrozenTrial]:
    """The first ``k`` of :func:`~sweeper.store.studies.ranked`: the top of ``sweeper best``."""
    return ranked(trials, maximize)[:k]


def removable(trials: list[FrozenTrial], study: StudyConfig, run_dir: str | Path,
              maximize: bool) -> list[Path]:
    """The existing files ``study.keep`` removes from ``trials`` (one snapshot of the study),
    with their artifact store copies. ``run_dir``: the folder holding the study's trials now
    (its run folder, or ``previous/<uuid>/``), where liveness is judged too."""
    if (keep := study.keep).keeps_all():
        return []
    top = {t.number for t in top_k(trials, keep.k, maximize)}
    # a retrain keeps its files in the place of a top trial whose weights are gone (they tie: it ranks after)
    top |= {twin.number for t in trials if t.number in top and (twin := stand_in(t, trials, Path(run_dir)))}
    live = Liveness.of(run_dir, trials, retry_plan(trials, study, run_dir))
    out: list[Path] = []
    for t in trials:
        if t.state not in ENDED:
            continue  # never a running or waiting trial's files
        folder = TrialFolder(Path(run_dir), t.number)
        drop, runs = [], []
        kept = keep.checkpoints == "all" or (keep.checkpoints == "top_k" and t.number in top)
        if not kept and not live.keeps(folder):
            drop.append(folder.files.checkpoint)
            runs = folder.checkpoint_files()[1:]  # the runs' weights it left for its retry
        if keep.weights == "top_k" and t.number not in top:
            drop += folder.model_files()
        if keep.predictions == "top_k" and t.number not in top:
            drop += folder.prediction_files()
        out += [p for p in drop + runs if p.is_file()] + _artifact_copies(t, run_dir, {p.name for p in drop})
    return out


def _artifact_copies(trial: FrozenTrial, run_dir: str | Path, names: set[str] | None) -> list[Path]:
    """The folder artifact store's copies of ``trial``'s files named ``names`` (every one when
    None; none when the artifacts are in S3: that store is not on this disk)."""
    out = []
    for key, value in trial.system_attrs.items():
        if not key.startswith(ARTIFACT_PREFIX):
            continue
        try:
            meta = json.loads(value)
            name, artifact_id = meta.get("filename"), meta.get("artifact_id")
        except (TypeError, ValueError, AttributeError):
            continue
        if (names is None or name in names) and (path := artifact_copy(run_dir, str(artifact_id))).is_file():
            out.append(path)
    return out


def collect(study: optuna.Study, cfg: SweeperConfig, run_dir: str | Path, *, dry_run: bool = False,
            warn: Callable[[str], None] | None = None) -> Freed:
    """Apply ``cfg.study.keep`` to the study's files now (after each trial, and ``sweeper gc``).

    Safe beside other collectors: a file already gone is skipped. A file that cannot be
    removed never raises: ``warn`` gets one line for all of them, and the rest go on."""
    if cfg.study.keep.keeps_all():
        return Freed(dry_run=dry_run)
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    freed, failed = Freed(dry_run=dry_run), []
    for path in removable(study.get_trials(deepcopy=False), cfg.study, run_dir, maximize):
        try:
            size = remove(path, dry_run=dry_run)
        except OSError as exc:
            failed.append(f"{path} ({one_line(exc)})")
            continue
        if size is not None:  # None: another collector removed it first
            freed.files.append((path, size))
    if failed and warn is not None:
        more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
        warn(f"study.keep could not remove {failed[0]}{more}")
    return freed


def folder_size(path: str | Path) -> int:
    """Bytes of every file under ``path`` (their sizes, links not followed); 0 if it is absent.
    Files that vanish while it walks (a collector, a finishing trial) are skipped."""
    return sum(_size(Path(root, name), links=False) for root, _dirs, names in os.walk(path) for name in names)


def _size(path: Path, links: bool = True) -> int:
    """``path``'s size; 0 when it is gone, or (``links`` False) a link."""
    try:
        st = path.stat(follow_symlinks=links)
    except OSError:
        return 0
    return 0 if stat.S_ISLNK(st.st_mode) else st.st_size


def space_warning(run_dir: str | Path, trials: list[FrozenTrial], n_trials: int) -> str | None:
    """One warning line when the free space on the run folder's disk holds fewer trials than
    the budget has left, by the median footprint of the finished trials (as ``study.keep``
    left them); None when it holds enough, or nothing has finished to estimate from."""
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    left = n_trials - len(finished)
    # a trial's footprint on the run folder's disk: its folder and its artifact store copies
    sizes = [folder_size(trial_files(run_dir, t.number).folder)
             + sum(_size(p) for p in _artifact_copies(t, run_dir, None)) for t in finished]
    per_trial = statistics.median(sizes) if sizes else 0
    if left <= 0 or per_trial <= 0:
        return None
    free = shutil.disk_usage(nearest_existing(run_dir)).free
    if (fits := int(free // per_trial)) >= left:
        return None
    return (f"warning: {run_dir} has {human_bytes(free)} free, about {fits} trials' worth at "
            f"{human_bytes(per_trial)} a trial (the median of {len(finished)} finished), and the budget "
            f"has {left} trials left; free space, or keep less (study.keep, sweeper gc)")


def weights_removed(trial: FrozenTrial, files: TrialFiles) -> bool:
    """The trial wrote weights (it finished without a failure, its model run included) and
    they are gone: study.keep or ``sweeper gc`` removed them."""
    wrote = trial.state in (TrialState.COMPLETE, TrialState.PRUNED) and "fail_reason" not in trial.user_attrs
    return wrote and no_model(trial) is None and not files.weights.exists()


def no_model(trial: FrozenTrial) -> str | None:
    """Why a finished trial never trained its model, or None when it did: a trial of several
    folds pruned (or out of train.max_minutes) before its last fold, whose model run (the last
    fold's first seed) never ran. A COMPLETE trial ran every run."""
    if trial.state != TrialState.PRUNED:
        return None
    from sweeper.validation.contract import FOLD_DATES, FOLDS_RUN  # here: a PRUNED trial only

    folds, ran = len(trial.user_attrs.get(FOLD_DATES) or []), trial.user_attrs.get(FOLDS_RUN)
    if not isinstance(ran, int) or ran >= folds:
        return None
    why = "ran out of train.max_minutes" if trial.user_attrs.get("stop_reason") == "time" else "was pruned"
    return (f"it {why} before its last fold (after {ran} of {folds} folds), so its model run "
            f"(fold {folds}, seed 1) never finished")


def retrain_command(trial: FrozenTrial, study_file: str | None, study: optuna.Study, n_trials: int) -> str:
    """The shell command that runs ``trial``'s params again as a new trial of the study: its
    params as a one-line YAML list of one flow mapping, the file ``run --enqueue`` reads. ``study_file``: the
    study as the command was given it, shell-quoted (its --set and --storage too); a budget (``n_trials``)
    the study's trials have used is raised by one, or ``--enqueue`` refuses it (:func:`stand_in` then)."""
    params = yaml.safe_dump([dict(trial.params)], default_flow_style=True, width=10**6).strip()
    target, held = f"trial-{trial.number}.yaml", held_ahead(study)
    return (f"echo {shlex.quote(params)} > {target} && sweeper run {study_file or 'STUDY'} --enqueue {target}"
            + (f" --set study.n_trials={held + 1}" if held >= n_trials else ""))


def stand_in(trial: FrozenTrial, trials: list[FrozenTrial], run_dir: Path) -> FrozenTrial | None:
    """A retrain of ``trial``, whose weights are gone (:func:`retrain_command`; None where they are there): a
    later COMPLETE trial of the same params whose weights are there. It scores in the trial's place, and
    ``study.keep`` keeps its files as the trial's (a tie ranks the trial first)."""
    if trial_files(run_dir, trial.number).weights.exists():
        return None
    return next((t for t in trials if t.number > trial.number and t.state == TrialState.COMPLETE
                 and t.params == trial.params and trial_files(run_dir, t.number).weights.exists()), None)
