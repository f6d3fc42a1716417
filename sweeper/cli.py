"""The ``sweeper`` command line: a thin click shell over the library.

Domain errors (``SweeperError``) become one message and exit code 2 at a
single boundary, :class:`SweeperGroup`. Nothing else here holds logic."""

import atexit
import functools
import gc
import json
import shlex
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import click

from sweeper import __version__
from sweeper.errors import DiskFull, StopRequested, StorageOutage, SweeperError, TrialFailure
from sweeper.interrupt import unheard


class UserError(click.ClickException):
    exit_code = 2


INTERRUPTED_HINT = "sweeper.interrupted"  # ctx.meta: what an interrupted command says (the resume line)


class SweeperGroup(click.Group):
    """The one boundary where errors become exit codes, each with one line and no traceback:
    a domain error, from any command, exits 2; a store that stayed away past study.storage_outage_s, a
    full disk, or `train`'s run failing (TrialFailure) exits 1; Ctrl-C exits 130 and SIGTERM 143 (with the
    resume line for a sweep). A sweep that ran its loop carries its own code (SweepResult.exit_code)."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        with unheard():  # a reader that left (`| head`) leaves the command to run on unheard, to its own code
            return super().main(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        _freeze_at_exit()
        # SIGTERM ends a command the way Ctrl-C does; a sweep takes both over while it runs
        previous = signal.signal(signal.SIGTERM, _terminated)
        try:
            return super().invoke(ctx)
        except SweeperError as exc:
            raise UserError(str(exc)) from None
        except (StorageOutage, DiskFull, TrialFailure) as exc:  # also `train`'s run failing (a diverging lr)
            again = "; free space and run the command again" if isinstance(exc, DiskFull) else ""
            click.echo(f"Error: {exc}{again}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt as exc:  # Ctrl-C or a StopRequested (click prints "Aborted!", exits 1)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # it only exits now: a 2nd Ctrl-C is no "Aborted!"
            click.echo(ctx.meta.get(INTERRUPTED_HINT, "interrupted"), err=True)
            ctx.exit(128 + getattr(exc, "signum", signal.SIGINT))
        finally:
            signal.signal(signal.SIGTERM, previous)


@functools.cache  # once per process, however many commands it runs
def _freeze_at_exit() -> None:
    """Freeze the heap at exit, before the interpreter's last collections: with torch, Optuna
    and SQLAlchemy loaded they walk every object, about 0.5 s of CPU (measured: 4.37 s against
    3.87 s for import-and-exit), which on a loaded box is seconds between a Ctrl-C's last line
    and the exit. Finalizers and atexit handlers still run; only the walks are skipped."""
    atexit.register(gc.freeze)


def _terminated(signum: int, _frame: FrameType | None) -> None:
    raise StopRequested(signum)


study_file = click.argument("study", type=click.Path(dir_okay=False, path_type=Path))
storage_option = click.option("--storage", default=None, metavar="URL",
                              help="SQLAlchemy URL overriding study.storage.")
sets_option = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                           help="Override a config key by dotted name (repeatable), e.g. train.lr=3e-4.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
SETS = "sweeper.sets"  # ctx.meta: a read command's --set, which _load applies


def study_options(command: Any) -> Any:
    """STUDY, --set and --storage for the commands that run or change a study."""
    return study_file(sets_option(storage_option(command)))


def read_options(command: Any) -> Any:
    """STUDY, --storage and --set for the commands that read a study: a study run with ``--set
    study.name=...`` is read with the same --set (``_load`` applies it; the signatures do not carry it)."""
    def keep(ctx: click.Context, _param: click.Parameter, sets: tuple[str, ...]) -> None:
        ctx.meta[SETS] = sets

    sets = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", expose_value=False,
                        callback=keep, help="Override a config key by dotted name (repeatable), as run.")
    return study_file(storage_option(sets(command)))


def _as_given(study: Path, storage: str | None, sets: tuple[str, ...] | None = None) -> str:
    """The study as this command was given it: the lines to paste name it by its --set and --storage (a
    read command's --set from ctx.meta; the password hidden), or they would address another study."""
    from sweeper.config.anchor import redact
    sets = click.get_current_context().meta.get(SETS, ()) if sets is None else sets
    return shlex.join([str(study), *(word for s in sets for word in ("--set", s)),
                       *(("--storage", redact(storage)) if storage else ())])


def _writable(_ctx: click.Context, _param: click.Parameter, path: Path) -> Path:
    from sweeper.atomic import unwritable
    # before the command's work, not after it; a device or a FIFO is written in place (click refuses a folder)
    if (path.is_file() or not path.exists()) and (why := unwritable(path.resolve().parent)) is not None:
        raise UserError(f"-o {path}: cannot be written ({why})")
    return path


def _device(_ctx: click.Context, _param: click.Parameter, name: str | None) -> str | None:
    """A --device that torch cannot use here: one line with torch's reason, before the command's work,
    not torch's traceback after the study and its data are loaded (torch is imported only then)."""
    if name is not None:
        import torch
        try:
            torch.zeros(1, device=name).tolist()  # read back: meta makes tensors that hold no data
        except (RuntimeError, AssertionError, NotImplementedError) as exc:  # a typo, a GPU past the last
            raise UserError(f"--device {name}: {str(exc).splitlines()[0]}") from None
    return name


def output_option(what: str, table: bool = False) -> Any:
    def check(ctx: click.Context, param: click.Parameter, path: Path) -> Path:
        if table:  # a table's name says its format: asked before the work too
            from sweeper.inspect.export import table_format
            table_format(path)
        return _writable(ctx, param, path)
    return click.option("-o", "--output", "out", required=True, callback=check, help=what,
                        type=click.Path(dir_okay=False, path_type=Path))


def _echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str, allow_nan=False))


def _load(path: Path, sets: tuple[str, ...] = ()) -> Any:
    from sweeper.config import load_config
    from sweeper.models.paths import model_search_path
    ctx = click.get_current_context(silent=True)
    cfg = load_config(path, sets or (ctx.meta.get(SETS, ()) if ctx is not None else ()))
    # model.name module:Class is found beside the study file, here and in every worker,
    # for as long as the command runs
    if ctx is not None:
        ctx.with_resource(model_search_path(path))
    if ctx is not None and (out := ctx.params.get("out")) is not None:  # before the work, as an unwritable -o
        from sweeper.store.layout import not_an_input
        not_an_input(out, cfg, path, ctx.params.get("data"), ctx.params.get("storage"))
    return cfg


def _load_existing(path: Path, storage: str | None, sets: tuple[str, ...] = ()) -> tuple[Any, Any]:
    """The config at ``path`` and its stored study, which must exist (the read commands)."""
    from sweeper.store.studies import load_existing
    from sweeper.study.open import as_run
    found = load_existing(cfg := _load(path, sets), storage)
    return as_run(cfg, found), found


@click.group(cls=SweeperGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sweeper")
def main() -> None:
    """Hyperparameter sweeps for deep-learning alpha models.

    One YAML study file -> an Optuna study in SQLite (or any SQLAlchemy URL),
    trials on GPU-pinned worker processes, per-epoch IC for pruning."""


# ---------------------------------------------------------------- sweeps
def sweep_command(name: str, must_exist: bool, doc: str) -> None:
    """``run`` and ``resume``: the same options and the same sweep, but for ``must_exist``."""

    def command(study: Path, sets: tuple[str, ...], storage: str | None, force: bool,
                enqueue: tuple[Path, ...]) -> None:
        from sweeper.dispatch.forkserver import ForkServer
        args = _as_given(study, storage, sets)
        hint = f"interrupted; run `sweeper run {args}` again to resume"
        click.get_current_context().meta[INTERRUPTED_HINT] = hint
        cfg = _load(study, sets)
        ForkServer.shared()  # its preload overlaps the driver's imports and checks; exit stops it
        from sweeper.dispatch.live import default_view
        from sweeper.dispatch.run import run
        result = run(cfg, view=default_view(), storage_url=storage, force=force, must_exist=must_exist,
                     study_file=args, enqueue=enqueue)
        if result.interrupted:  # it only exits now: a second Ctrl-C is no "Aborted!" (exit 1) or traceback
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        sys.exit(result.exit_code)

    force = click.option("--force", is_flag=True,
                         help="Resume even if the config drifted from the stored one.")
    enqueue = click.option("--enqueue", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
                           metavar="PARAMS.yaml", help="Run these parameter sets (a YAML list of "
                           "{search_space key: value}) ahead of the sampler's; repeatable.")
    for option in (enqueue, force, study_options):
        command = option(command)
    main.command(name, help=doc)(command)


sweep_command("run", False, "Run the sweep in STUDY (creates the study, or resumes it).")
sweep_command("resume", True, "Resume the sweep in STUDY; fails if the study does not exist yet.")


@main.command("validate")
@study_options
def validate_cmd(study: Path, sets: tuple[str, ...], storage: str | None) -> None:
    """Check config, data, storage and devices without training, and without touching the
    study or the run folder (with data.cache the panel cache entry is built, as a run would)."""
    from sweeper.dispatch.run import prepare
    from sweeper.inspect.printing import split_lines
    from sweeper.models.check import runs_line
    from sweeper.study.open import check_resumable
    from sweeper.study.stacking import population_line
    plan = prepare(_load(study, sets), storage)
    check_resumable(plan.cfg, plan.storage_url, plan.panel)  # what `sweeper run` would refuse
    click.echo(f"{study}: ok")
    click.echo(f"  data: {plan.panel.source} ({plan.panel.fingerprint[:12]})")
    for line in split_lines(plan.panel, plan.cfg.data):
        click.echo("  " + line)
    click.echo(f"  storage: {plan.storage_url}")
    click.echo("  slots: " + ", ".join(s.label for s in plan.slots))
    if plan.cfg.search_space:
        click.echo(f"  populations: {population_line(plan.cfg)}")
    if plan.cfg.validation.runs > 1:
        click.echo(f"  runs: {runs_line(plan.cfg, len(plan.panel.features))}")


@main.command("train")
@study_file
@sets_option
@json_option
def train_cmd(study: Path, sets: tuple[str, ...], as_json: bool) -> None:
    """Train once with the study's defaults (no sweep)."""
    from sweeper.train_command import train_once
    metrics = train_once(_load(study, sets), quiet=as_json)
    if as_json:
        _echo_json(metrics)


# ------------------------------------------------------------- inspect
@main.command("status")
@read_options
@json_option
def status_cmd(study: Path, storage: str | None, as_json: bool) -> None:
    """Counts by state, the best trial, and the running trials."""
    from sweeper.inspect.printing import print_status
    from sweeper.inspect.results import status_report
    cfg, found = _load_existing(study, storage)
    (_echo_json if as_json else print_status)(status_report(found, cfg, study_file=_as_given(study, storage)))


@main.command("best")
@read_options
@json_option
def best_cmd(study: Path, storage: str | None, as_json: bool) -> None:
    """The best trial's params, valid and test metrics, long-short view, top-3 ensemble and weight file."""
    from sweeper.inspect.printing import print_best
    from sweeper.inspect.results import best_report
    cfg, found = _load_existing(study, storage)
    if (report := best_report(found, cfg, portfolio=True, study_file=_as_given(study, storage))) is None:
        from sweeper.store.studies import no_best
        raise UserError(no_best(found))
    (_echo_json if as_json else print_best)(report)


@main.command("baseline")
@read_options
@json_option
def baseline_cmd(study: Path, storage: str | None, as_json: bool) -> None:
    """Train the LightGBM baseline on the study's train split; store its val and test IC."""
    from sweeper.baseline.job import caveats, run_command
    from sweeper.inspect.printing import fmt
    attr = run_command(*_load_existing(study, storage))
    for line in caveats(attr):
        click.echo(line, err=True)
    if as_json:
        _echo_json({k: v for k, v in attr.items() if k != "daily"})
        return
    click.echo(f"baseline LightGBM {attr['lightgbm_version']}: val ic {fmt(attr['val_ic'])}  "
               f"test ic {fmt(attr['test_ic'])}  ({attr['rows']['train']} train rows, best iteration "
               f"{attr['best_iteration']}, {attr['threads']} threads, {attr['elapsed_s']:.1f} s)")


@main.command("dashboard")
@read_options
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind; loopback by default.")
def dashboard_cmd(study: Path, storage: str | None, port: int, host: str) -> None:
    """Serve optuna-dashboard for this study's storage and artifacts."""
    from sweeper.inspect.dashboard import serve
    serve(_load(study), storage_url=storage, host=host, port=port, echo=click.echo)


@main.command("report")
@read_options
@output_option("The HTML file to write (self-contained, works offline).")
def report_cmd(study: Path, storage: str | None, out: Path) -> None:
    """One HTML page: history, importances, learning curves, devices, IC and selection bias."""
    from sweeper.inspect.report import write_report
    summary = write_report(_load(study), out, storage_url=storage)
    click.echo(f"wrote {out}: {summary['trials']} trials, {len(summary['figures'])} figures "
               f"in {summary['seconds']:.1f} s")


@main.command("predict")
@read_options
@click.option("--trial", default="best", show_default=True, metavar="N|best|topK",
              help="Trial number, best, or topK: the mean per-date z-score of the K best trials.")
@click.option("--split", default=None, type=click.Choice(["valid", "test", "train", "all"]),
              help="What to score [default: valid; all with --start/--end, or --data scored by a refit].")
@click.option("--start", default=None, metavar="DATE", help="Score only dates from DATE on (inclusive).")
@click.option("--end", default=None, metavar="DATE", help="Score only dates up to DATE (inclusive).")
@click.option("--data", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Another Parquet file with the study's columns (the label may be missing); "
                   "a trial's refit, when it has one, scores it.")
@click.option("--device", callback=_device, help="torch device (default: cuda if available, else cpu).")
@click.option("--allow-unrefit", is_flag=True,
              help="With --data: score with the best trial's own weights though another trial has a refit.")
@output_option("preds.parquet (or .csv): columns date, asset, pred, label.", table=True)
def predict_cmd(study: Path, storage: str | None, trial: str, split: str | None, start: str | None,
                end: str | None, data: Path | None, device: str | None, allow_unrefit: bool,
                out: Path) -> None:
    """Apply a trial's best weights (or the top-K ensemble) to a split, a date range or --data."""
    from sweeper.inspect.export import write_table
    from sweeper.inspect.predict import predict_trial
    result = predict_trial(*_load_existing(study, storage), trial=trial, split=split, data=data,
                           device=device, start=start, end=end, study_file=_as_given(study, storage),
                           allow_unrefit=allow_unrefit)
    write_table(result.frame, out)
    for note in [result.weights, *result.notes]:
        click.echo(f"note: {note}", err=True)
    if result.same_data is False:
        click.echo("warning: the data differs from the data the study was run on (fingerprint changed)",
                   err=True)
    click.echo(result.written(out))


@main.command("refit")
@read_options
@click.option("--trial", default="best", show_default=True, metavar="N|best",
              help="Trial number, or best: the best feasible COMPLETE trial.")
@click.option("--until", default=None, metavar="DATE",
              help="Train on the labels known by DATE [default: the data's last date].")
@click.option("--device", callback=_device, help="torch device (default: cuda if available, else cpu).")
def refit_cmd(study: Path, storage: str | None, trial: str, until: str | None, device: str | None) -> None:
    """Train a trial's config on every labelled date up to --until: the production model
    that predict --data then uses (docs/refit.md)."""
    from sweeper.refit import refit
    for line in refit(*_load_existing(study, storage), trial=trial, until=until, device=device).lines():
        click.echo(line)


@main.command("gc")
@study_options
@click.option("--dry-run", is_flag=True, help="List what study.keep would remove, with sizes; remove none.")
def gc_cmd(study: Path, sets: tuple[str, ...], storage: str | None, dry_run: bool) -> None:
    """Apply study.keep to the study's trial files now, and print what it frees."""
    from sweeper.store.run_folder import files_folder
    from sweeper.study.retention import collect
    cfg, found = _load_existing(study, storage, sets)
    freed = collect(found, cfg, files_folder(cfg, found), dry_run=dry_run,
                    warn=lambda line: click.echo(f"warning: {line}", err=True))
    for line in freed.lines():
        click.echo(line)


@main.command("export")
@read_options
@output_option("trials.parquet or trials.csv.", table=True)
def export_cmd(study: Path, storage: str | None, out: Path) -> None:
    """One row per trial: state, value, params, user attributes, times and duration."""
    from sweeper.inspect.export import trials_frame, write_table
    frame = trials_frame(_load_existing(study, storage)[1])
    write_table(frame, out)
    click.echo(f"wrote {out}: {len(frame)} trials, {frame.shape[1]} columns")


@main.command("doctor")
def doctor_cmd() -> None:
    """Report Python, torch, CUDA, GPUs (through NVML), optuna and SQLite."""
    from sweeper.inspect.doctor import doctor
    report = doctor()
    width = max(len(k) for k, _ in report.rows) if report.rows else 0
    for key, value in report.rows:
        click.echo(f"{key:<{width}}  {value}")
    click.echo(report.verdict)
    sys.exit(report.exit_code)


# ------------------------------------------------------------------ db
@main.group("db", cls=SweeperGroup)
def db_group() -> None:
    """Storage set-up for studies shared by several hosts."""


@db_group.command("init")
@study_options
def db_init_cmd(study: Path, sets: tuple[str, ...], storage: str | None) -> None:
    """Create the tables and the study once, before the hosts start (idempotent)."""
    from sweeper.dispatch.run import init_db
    result = init_db(_load(study, sets), storage)
    state = "created" if result.created else f"already there ({result.n_trials} trials)"
    click.echo(f"study {result.study!r} in {result.storage}: {state}")


# ---------------------------------------------------------------- data
@main.group("data", cls=SweeperGroup)
def data_group() -> None:
    """Data helpers."""


@data_group.command("synth")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--assets", default=300, show_default=True, type=click.IntRange(min=2))
@click.option("--dates", default=1000, show_default=True, type=click.IntRange(min=36))
@click.option("--features", default=16, show_default=True, type=click.IntRange(min=2))
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0))
def synth_cmd(out: Path, assets: int, dates: int, features: int, seed: int) -> None:
    """Write the synthetic panel (with its oracle IC) to OUT.parquet."""
    from sweeper.data import write_synthetic
    oracle = write_synthetic(out, assets=assets, dates=dates, features=features, seed=seed)
    click.echo(f"wrote {out}: {assets} assets x {dates} dates x {features} features (seed {seed})")
    click.echo("oracle IC: " + "  ".join(f"{k} {v:.4f}" for k, v in oracle.items()))


if __name__ == "__main__":  # pragma: no cover
    main()
