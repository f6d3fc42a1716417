"""The driver's check that each model can be built, with user models in a child process.

Importing, constructing and running a user's ``module:Class`` once is the only user code the
driver runs. A model that kills the interpreter there (``os._exit``, a segfault, an abort in C++)
must end the check with one clear error naming ``model.name``, not take the driver with it.
Built-in models are ours, cheap and safe: they are built in-process.

Parent: :func:`check_models`. Child: ``python -m sweeper.models.check``, which reads one JSON
request on stdin and writes one JSON line per job as it finishes it, so that the job it died on is
known. It starts as every child of the driver does (:mod:`sweeper.launch`; :data:`ChildRun`)."""

import json
import signal
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import sweeper.child
from sweeper.config import ModelConfig, SweeperConfig
from sweeper.errors import ConfigError
from sweeper.models import check_cache
from sweeper.models.paths import top_module

# a large model on a CPU takes a while to construct; a check that hangs must end anyway
CHECK_TIMEOUT_S = 600.0

# runs one checking child to its end: (the request, as JSON, for its stdin; the timeout) ->
# (its stdout; its exit code as subprocess spells it, or None when it ran past the timeout)
ChildRun = Callable[[str, float], tuple[str, int | None]]


def python_child(request: str, timeout: float) -> tuple[str, int | None]:
    """The checking child, fresh (:mod:`sweeper.launch`), in this process's folder: where a worker looks."""
    from sweeper.launch import run  # the parent's code: the worker, which imports this module, never loads it

    return run("check", request, timeout)


@dataclass(frozen=True)
class Job:
    """One model to check: ``model`` (a model section) is built and run once; with ``model=None``
    the class ``name`` is only imported. A failed ``fatal`` job raises ConfigError."""

    name: str
    model: dict[str, Any] | None = None
    fatal: bool = True


def check_models(jobs: list[Job], n_features: int, lookback: int, cache: Path | None = None,
                 child: ChildRun = python_child, *, builtins_in_child: bool = False) -> list[str | None]:
    """Each job's error message, or None when it built. Raises ConfigError with the first failed
    fatal job's message (jobs after it are not checked). With ``cache`` (a folder), the user
    models' answers are kept there (:mod:`sweeper.models.check_cache`): an unchanged check starts
    no child. ``child`` runs each checking child; ``builtins_in_child``: the built-in models go to
    a child too, ahead of the user models (never cached: a forked child builds them in ms)."""
    results: list[str | None] = [None] * len(jobs)
    pending, builtins = [], []
    for i, job in enumerate(jobs):
        if ":" in job.name:
            pending.append(i)
        elif job.model is not None and builtins_in_child:
            builtins.append(i)
        elif job.model is not None:
            results[i] = check_one(job, n_features, lookback)
            if results[i] and job.fatal:
                raise ConfigError(results[i])
    if builtins:
        _check_children(jobs, builtins, results, n_features, lookback, child)
    if not pending:
        return results
    key = check_cache.check_key([asdict(jobs[i]) for i in pending], n_features, lookback) if cache else None
    kept = check_cache.read(cache, key, len(pending)) if cache is not None and key else None
    if kept is not None:  # only clean checks are kept: no fatal failure, no death
        for i, answer in zip(pending, kept):
            results[i] = answer
        return results
    if _check_children(jobs, pending, results, n_features, lookback, child) and cache is not None and key:
        check_cache.write(cache, key, [results[i] for i in pending])
    return results


def _check_children(jobs: list[Job], pending: list[int], results: list[str | None],
                    n_features: int, lookback: int, child: ChildRun) -> bool:
    """The children's answers to the ``pending`` jobs into ``results``, from as many children as it
    takes; True when none killed its child. Raises ConfigError on a fatal failure."""
    clean = True
    while pending:  # a job that kills the child is reported; the rest go to a fresh child
        request = {"n_features": n_features, "lookback": lookback, "jobs": [asdict(jobs[i]) for i in pending]}
        lines, code = _ask_child(request, child)
        answers = [line["error"] for line in lines][:len(pending)]
        for i, answer in zip(pending, answers):
            results[i] = answer
            if answer and jobs[i].fatal:
                raise ConfigError(answer)
        if len(answers) == len(pending):
            break
        clean = False
        culprit = pending[len(answers)]
        death = _how(code) if code is None else f"killed the Python process ({_how(code)})"
        top = top_module(jobs[culprit].name)  # a random.py where the command runs kills Python at start-up
        hides = (f"; {top}.py hides Python's own module {top!r} from every process started here: rename it"
                 if top in sys.stdlib_module_names else "")
        results[culprit] = f"model.name {jobs[culprit].name!r}: checking it {death}{hides}"
        if jobs[culprit].fatal:
            raise ConfigError(results[culprit])
        pending = pending[len(answers) + 1:]
    return clean


def check_one(job: Job, n_features: int, lookback: int) -> str | None:
    """Import (and build and run once) one model in this process: its error message, or None."""
    from sweeper.models.build import build_model, check_trains, resolve_model_class

    try:
        if job.model is None:
            resolve_model_class(job.name)
        else:  # built and run once: does a training step reach its weights?
            model = build_model(ModelConfig.model_validate(job.model), n_features, lookback)
            check_trains(model, job.name, n_features, lookback)
    except ConfigError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - a built-in's own checks (torch's asserts) raise anything
        return f"model.name {job.name!r}: building it failed ({type(exc).__name__}: {exc})"
    return None


def _ask_child(request: dict[str, Any],
               child: ChildRun = python_child) -> tuple[list[dict[str, Any]], int | None]:
    """The checking child's JSON answer lines to ``request``, and its exit code (None: it ran
    past the timeout; its answers until then)."""
    out, code = child(json.dumps(request), CHECK_TIMEOUT_S)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")], code


def runs_line(cfg: SweeperConfig, n_features: int) -> str:
    """``sweeper validate``'s line on a trial's runs: how many, in stacks of how many, and how
    its model stacks."""
    runs, asked = cfg.validation.runs, cfg.train.max_stack
    stacks = runs if asked == "auto" else min(asked, runs)
    how = (stack_plan_line(cfg.model, n_features, cfg.data.lookback) if stacks > 1
           else "one run after another (train.max_stack: 1)" if runs > 1 else "one run")
    if asked == "auto" and runs > 1:  # the size is the device's answer, not the file's
        return (f"{runs} per trial, in stacks of a size measured on the device at the study's first trial "
                f"(train.max_stack: auto, at most {runs}): {how}")
    return f"{runs} per trial, in stacks of up to {stacks}: {how}"


def stack_plan_line(model: ModelConfig, n_features: int, lookback: int) -> str:
    """How the trial's runs of ``model`` stack (:func:`sweeper.models.stacked.build.stack_plan`); a
    user model's answer tries torch.func.vmap on two members, in a child like all user code."""
    if not model.is_custom:
        return f"model {model.name}: stacked natively"
    lines, code = _ask_child({"n_features": n_features, "lookback": lookback, "plan": model.section()})
    if lines and "plan" in lines[0]:
        return str(lines[0]["plan"])
    return f"model.name {model.name!r}: not known (the check {_how(code)})"


def _how(code: int | None) -> str:
    if code is None:
        return f"did not finish within {CHECK_TIMEOUT_S:g} s"
    if code < 0:
        try:
            return f"signal {-code}, {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def main() -> int:
    """The child (:mod:`sweeper.child`): one JSON answer line per job of the request on stdin."""
    answers = sweeper.child.answers()
    if "plan" in (request := json.load(sys.stdin)):  # stack_plan_line's question
        from sweeper.models.build import build_model
        from sweeper.models.stacked.build import stack_plan

        cfg, shape = ModelConfig.model_validate(request["plan"]), (request["n_features"], request["lookback"])
        members = [build_model(cfg, *shape) for _ in range(2)]
        answers.write(json.dumps({"plan": stack_plan(cfg, members, *shape)[1]}) + "\n")
        return 0
    for raw in request["jobs"]:
        job = Job(**raw)
        error = check_one(job, request["n_features"], request["lookback"])
        answers.write(json.dumps({"error": error}) + "\n")
        answers.flush()
        if error and job.fatal:
            break
    return 0


if __name__ == "__main__":
    sys.exit(sweeper.child.main(main))
