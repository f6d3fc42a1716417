"""The Slurm recipe in deploy/slurm/.

Where a Slurm controller answers, ``sbatch --test-only`` renders both job scripts.
Everywhere else, and on a Slurm cluster too, the tests below check the invariants
that the scale-out design depends on. They do so by running the scripts themselves:
``bash -n``, the ``#SBATCH`` header as sbatch reads it, submit.sh's job wiring
(with a recording ``sbatch`` on PATH), the input checks, and the job scripts run
as Slurm would run them (its environment variables set) against a real PostgreSQL
study: db init, two array tasks, a SIGTERM, a resume."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from conftest import TINY, merge
from pg_server import pg_url  # noqa: F401 - fixture
from sweeper.config import validate_config
from sweeper.store import normalize_url, open_storage
from sweeper.store.identity import Identity

SLURM = Path(__file__).parent.parent / "deploy" / "slurm"
ARRAY = SLURM / "sweeper-array.sbatch"
INIT = SLURM / "db-init.sbatch"
SUBMIT = SLURM / "submit.sh"
SCRIPTS = (ARRAY, INIT, SUBMIT)
TESTS = Path(__file__).parent


def _header(path: Path) -> dict[str, str]:
    """The #SBATCH options as sbatch reads them: up to the first command, later ones are ignored."""
    options: dict[str, str] = {}
    for line in path.read_text().splitlines()[1:]:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if stripped.startswith("#SBATCH "):
            key, _, value = stripped.removeprefix("#SBATCH ").partition("=")
            options[key] = value
    return options


def _commands(path: Path) -> list[str]:
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.strip().startswith("#")]


def _inputs_block(path: Path) -> str:
    text = path.read_text()
    return text[text.index("# ---- inputs:"):text.index("# ---- end of inputs")].split("\n", 1)[1]


def _env_file_defaults() -> dict[str, str]:
    """What sweeper.env exports in an environment that sets none of it."""
    names = ("SWEEPER_STUDY", "SWEEPER_STORAGE", "PGPASSFILE", "SWEEPER_PYTHON", "SWEEPER_PIN_GPUS", "SWEEPER_SEGMENTS")
    out = subprocess.run(["bash", "-c", f"source {SLURM / 'sweeper.env'} && env"], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "HOME": "/home/someone"}, check=True).stdout
    exported = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return {k: exported[k] for k in names}


def _job_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment a job script sees inside an allocation, minus anything Slurm
    or sweeper would take from this test's own environment."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SWEEPER_", "PG")) and k != "CUDA_VISIBLE_DEVICES"}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
               SWEEPER_PYTHON=sys.executable)
    env.update(extra)
    return env


def _run(script: Path, env: dict[str, str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script)], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------ the scripts as files


@pytest.mark.slow
def test_every_script_is_bash_that_parses_and_can_be_run():
    for path in SCRIPTS:
        assert path.read_text().startswith("#!/bin/bash\n"), path.name
        assert path.stat().st_mode & stat.S_IXUSR, f"{path.name} is not executable"
        check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, f"{path.name}: {check.stderr}"
    assert subprocess.run(["bash", "-n", str(SLURM / "sweeper.env")]).returncode == 0


def test_array_header_one_host_per_task_with_gpus_a_warning_before_the_limit_and_requeue():
    opts = _header(ARRAY)
    assert re.fullmatch(r"\d+-\d+(%\d+)?", opts["--array"])
    assert opts["--nodes"] == "1" and opts["--ntasks"] == "1"  # one driver per task, on one node
    assert int(re.fullmatch(r"gpu:(\d+)", opts["--gres"])[1]) >= 1
    # B: signals the batch shell only (which is sweeper, after exec), not the workers,
    # early enough to finish a step and write a checkpoint
    when = re.fullmatch(r"B:TERM@(\d+)", opts["--signal"])
    assert when and int(when[1]) >= 60
    assert "--requeue" in opts and opts["--open-mode"] == "append"  # a requeued task adds to its log
    assert "%A" in opts["--output"] and "%a" in opts["--output"]  # one log per task
    assert int(opts["--cpus-per-task"]) >= int(opts["--gres"].split(":")[1])
    # every #SBATCH line is in the header: sbatch silently ignores those after the first command
    assert ARRAY.read_text().count("#SBATCH ") == len(opts)


def test_db_init_header_needs_no_gpu():
    opts = _header(INIT)
    assert not any("gpu" in key or "gpu" in value for key, value in opts.items())
    assert opts["--job-name"] != _header(ARRAY)["--job-name"]
    assert "--array" not in opts and INIT.read_text().count("#SBATCH ") == len(opts)


def test_both_job_scripts_check_their_inputs_the_same_way():
    assert _inputs_block(ARRAY) == _inputs_block(INIT)
    assert "check_inputs" in _commands(ARRAY) and "check_inputs" in _commands(INIT)


def test_the_last_command_execs_sweeper_so_it_gets_the_signal():
    init_last, array_last = _commands(INIT)[-1], _commands(ARRAY)[-1]
    assert init_last == 'exec "$PY" -m sweeper.cli db init "$SWEEPER_STUDY" --storage "$SWEEPER_STORAGE"'
    assert array_last.startswith('exec "$PY" -m sweeper.cli run "$SWEEPER_STUDY" --storage "$SWEEPER_STORAGE"')
    # a trap would never run: the shell is replaced by sweeper before the signal comes
    assert not [c for c in _commands(ARRAY) + _commands(INIT) if c.startswith("trap ")]


def test_host_id_is_the_array_task_and_is_the_variable_sweeper_reads(monkeypatch):
    exports = [c for c in _commands(ARRAY) if c.startswith("export ")]
    assert exports == ['export SWEEPER_HOST_ID="${SLURM_JOB_NAME}-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"']
    monkeypatch.setenv("SWEEPER_HOST_ID", "sweeper-1002_3")
    assert Identity.current().host == "sweeper-1002_3"


@pytest.mark.slow
def test_example_study_and_env_file_name_one_shared_postgresql_study():
    env = _env_file_defaults()
    study = validate_config(yaml.safe_load((SLURM / "study.yaml").read_text()), "slurm study")
    assert study.study.storage == env["SWEEPER_STORAGE"]
    assert normalize_url(env["SWEEPER_STORAGE"]).startswith("postgresql+psycopg://")
    assert ":" not in env["SWEEPER_STORAGE"].split("://", 1)[1].split("@", 1)[0], "no password in the URL"
    assert env["PGPASSFILE"] == "/home/someone/.pgpass" and "PGPASSWORD" not in (SLURM / "sweeper.env").read_text()
    # every node resolves these alike only if they are absolute paths on a shared filesystem
    for path in (env["SWEEPER_STUDY"], study.study.artifacts, study.data.path, env["SWEEPER_PYTHON"]):
        assert path.startswith("/shared/"), path
    assert env["SWEEPER_PIN_GPUS"] == "1" and env["SWEEPER_SEGMENTS"] == "1"
    assert study.study.grace_period >= 5 * study.study.heartbeat_interval


# ------------------------------------------------------------------ submit.sh


def _recording_sbatch(tmp_path: Path) -> Path:
    """An `sbatch` that records its arguments and answers like `sbatch --parsable`
    on a federated cluster ("jobid;cluster"), with ids 1001, 1002, ..."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "sbatch"
    script.write_text(
        "#!/usr/bin/env python3\n"
        "import json, sys\n"
        f"log = {str(tmp_path / 'sbatch.jsonl')!r}\n"
        "calls = sum(1 for _ in open(log)) if __import__('os').path.exists(log) else 0\n"
        "open(log, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "print(f'{1001 + calls};cluster1')\n")
    script.chmod(0o755)
    return bin_dir


def _submit(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    bin_dir = _recording_sbatch(tmp_path)
    study = tmp_path / "study.yaml"
    study.write_text("study: {name: x}\n")
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SWEEPER_", "PG"))}
    full.update({"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SWEEPER_STUDY": str(study), **env})
    done = subprocess.run(["bash", str(SUBMIT), *args], env=full, capture_output=True, text=True, timeout=30)
    log = tmp_path / "sbatch.jsonl"
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, calls


@pytest.mark.slow
def test_submit_runs_db_init_first_and_the_arrays_after_it(tmp_path):
    done, calls = _submit(tmp_path, "--array=0-7", "--gres=gpu:4", SWEEPER_SEGMENTS="3")
    assert done.returncode == 0, done.stderr
    assert calls == [
        ["--parsable", str(INIT)],
        ["--parsable", "--dependency=afterok:1001", "--kill-on-invalid-dep=yes", "--array=0-7", "--gres=gpu:4",
         str(ARRAY)],
        ["--parsable", "--dependency=afterany:1002", "--array=0-7", "--gres=gpu:4", str(ARRAY)],
        ["--parsable", "--dependency=afterany:1003", "--array=0-7", "--gres=gpu:4", str(ARRAY)],
    ]
    assert "db init: job 1001" in done.stdout and "array job 1004" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("env, message", [
    ({"PGPASSWORD": "hunter2"}, "PGPASSWORD is set"),
    ({"SWEEPER_SEGMENTS": "0"}, "SWEEPER_SEGMENTS=0"),
    ({"SWEEPER_STUDY": "/nonexistent/study.yaml"}, "SWEEPER_STUDY=/nonexistent/study.yaml: no such file"),
])
def test_submit_refuses_bad_input_before_submitting_anything(tmp_path, env, message):
    done, calls = _submit(tmp_path, **env)
    assert done.returncode == 2 and message in done.stderr and calls == []
    assert "hunter2" not in done.stderr


# ------------------------------------------------------------------ the job scripts' input checks


def _passfile(tmp_path: Path, mode: int) -> str:
    path = tmp_path / "pgpass"
    path.write_text("127.0.0.1:5432:*:sweeper:secret\n")
    path.chmod(mode)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("script", [ARRAY, INIT], ids=["array", "db-init"])
@pytest.mark.parametrize("case, message", [
    ("password in url", "SWEEPER_STORAGE has a password in it"),
    ("sqlite", "SWEEPER_STORAGE must be the postgresql:// URL of the shared study database (got scheme 'sqlite')"),
    ("no study", "SWEEPER_STUDY=/nonexistent.yaml: no such file"),
    ("world-readable passfile", "group or others can read it; chmod 600 it"),
])
def test_job_scripts_refuse_bad_input_with_exit_2(tmp_path, script, case, message):
    study = tmp_path / "study.yaml"
    study.write_text("study: {name: x}\n")
    env = _job_env(tmp_path, SWEEPER_STUDY=str(study), SWEEPER_STORAGE="postgresql+psycopg://sweeper@db:5432/sweeps",
                   SLURM_JOB_NAME="sweeper", SLURM_ARRAY_JOB_ID="7", SLURM_ARRAY_TASK_ID="0",
                   PGPASSFILE=_passfile(tmp_path, 0o600))
    env.update({
        "password in url": {"SWEEPER_STORAGE": "postgresql://sweeper:hunter2@db:5432/sweeps"},
        "sqlite": {"SWEEPER_STORAGE": "sqlite:///runs/x/study.db"},
        "no study": {"SWEEPER_STUDY": "/nonexistent.yaml"},
        "world-readable passfile": {"PGPASSFILE": _passfile(tmp_path, 0o644)},
    }[case])
    done = _run(script, env, tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "hunter2" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_array_script_refuses_to_run_outside_an_array(tmp_path):
    done = _run(ARRAY, _job_env(tmp_path, SLURM_JOB_NAME="sweeper", SLURM_JOB_ID="7"), tmp_path)
    assert done.returncode == 2 and "not an array task" in done.stderr


@pytest.mark.slow
def test_array_task_with_gpus_hands_sweeper_exactly_those_gpus(tmp_path):
    """Slurm's CUDA_VISIBLE_DEVICES=0 is resolved the way CUDA resolves it. Where CUDA
    finds no GPU, the task stops with one message and exit 2. Where it finds one,
    sweeper is given that GPU by UUID (and this bad study file then stops it)."""
    import torch

    study = tmp_path / "study.yaml"
    study.write_text("study: {name: x, no_such_key: 1}\n")
    env = _job_env(tmp_path, SWEEPER_STUDY=str(study), SWEEPER_STORAGE="postgresql+psycopg://sweeper@db:5432/sweeps",
                   SLURM_JOB_NAME="sweeper", SLURM_ARRAY_JOB_ID="7", SLURM_ARRAY_TASK_ID="0", CUDA_VISIBLE_DEVICES="0")
    done = _run(ARRAY, env, tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    if torch.cuda.device_count() == 0:
        assert "sweeper/slurm: CUDA_VISIBLE_DEVICES=0 but CUDA finds no GPU" in done.stderr
        assert "Traceback" not in done.stderr
    else:
        uuid = str(torch.cuda.get_device_properties(0).uuid)
        assert re.search(rf"devices\.gpus=\[(GPU-)?{re.escape(uuid)}\]", done.stdout), done.stdout


# ------------------------------------------------------------------ the job scripts at work


SLURM_STUDY = {
    "study": {"name": "slurm", "n_trials": 2, "retries": 1, "heartbeat_interval": 1, "grace_period": 4},
    "train": {"epochs": 3, "batch_size": 128, "samples_per_epoch": 512, "patience": 10},
    "devices": {"gpus": "auto", "cpu_workers": 1},
}


def _study(url: str) -> optuna.Study:
    return optuna.load_study(study_name="slurm", storage=open_storage(url, create=False))


def _task(env: dict[str, str], cwd: Path, job: str, task: int) -> subprocess.Popen:
    task_env = {**env, "SLURM_JOB_NAME": "sweeper", "SLURM_ARRAY_JOB_ID": job, "SLURM_ARRAY_TASK_ID": str(task),
                "SLURM_JOB_ID": str(int(job) + 1 + task)}
    with (cwd / f"sweeper-{job}_{task}.out").open("w") as log:
        return subprocess.Popen(["bash", str(ARRAY)], env=task_env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)


def _log(cwd: Path, job: str, task: int) -> str:
    return (cwd / f"sweeper-{job}_{task}.out").read_text()


def _wait_for_a_finished_epoch(url: str, host: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
        running = [t for t in _study(url).get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                   if t.user_attrs.get("host") == host and t.intermediate_values]
        if running:
            return
    raise AssertionError(f"no trial of {host} finished an epoch (exit {proc.poll()})")


@pytest.mark.postgres
@pytest.mark.slow
def test_db_init_then_array_tasks_share_one_study_and_resume_after_sigterm(tmp_path, pg_url):  # noqa: F811
    raw = merge(TINY, SLURM_STUDY)
    raw["model"] = {"name": "fault_models:Slow", "step_sleep": 0.2}
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(raw))
    env = _job_env(tmp_path, SWEEPER_STUDY=str(study), SWEEPER_STORAGE=pg_url, PGPASSFILE=_passfile(tmp_path, 0o600))

    init = _run(INIT, {**env, "SLURM_JOB_NAME": "sweeper-db-init", "SLURM_JOB_ID": "41"}, tmp_path)
    assert init.returncode == 0 and "'slurm' in " in init.stdout and init.stdout.rstrip().endswith(": created")

    # the time limit nears: Slurm sends SIGTERM to the batch shell, which is sweeper after exec
    first = _task(env, tmp_path, "42", 0)
    _wait_for_a_finished_epoch(pg_url, "sweeper-42_0", first)
    cmdline = Path(f"/proc/{first.pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[1:4] == [b"-m", b"sweeper.cli", b"run"], cmdline  # the shell's pid now runs the driver
    assert b"devices.gpus=none" in cmdline  # no CUDA_VISIBLE_DEVICES: this task has no GPU
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 143, _log(tmp_path, "42", 0)
    trials = _study(pg_url).get_trials(deepcopy=False)
    assert [(t.state, t.user_attrs["fail_reason"], t.user_attrs["host"]) for t in trials] == [
        (TrialState.FAIL, "interrupted", "sweeper-42_0")]

    # the next segment: two tasks resume the study and finish its budget exactly
    tasks = [_task(env, tmp_path, "43", k) for k in (0, 1)]
    for k, proc in enumerate(tasks):
        assert proc.wait(timeout=120) == 0, _log(tmp_path, "43", k)
    trials = _study(pg_url).get_trials(deepcopy=False)
    finished = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(finished) == 2 and len(trials) == 3
    assert {t.user_attrs["host"] for t in finished} <= {"sweeper-43_0", "sweeper-43_1"}
    retry = next(t for t in finished if t.user_attrs.get("retry_of") == 0)
    assert retry.user_attrs["resume_from_trial"] == 0  # from the interrupted trial's checkpoint


# ------------------------------------------------------------------ a real Slurm


def _slurm_controller() -> str | None:
    """Why no Slurm controller can render the scripts here, or None when one answers."""
    if not shutil.which("sbatch"):
        return "sbatch is not on PATH"
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    if ping.returncode != 0 or "UP" not in ping.stdout:
        return f"scontrol ping: {(ping.stdout + ping.stderr).strip()}"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("script", [INIT, ARRAY], ids=["db-init", "array"])
def test_sbatch_test_only_accepts_the_scripts(tmp_path, script):
    why = _slurm_controller()
    if why:
        pytest.skip(f"no Slurm controller answers ({why}); the invariants above are checked instead")
    env = _job_env(tmp_path, SWEEPER_STUDY=str(SLURM / "study.yaml"),
                   SWEEPER_STORAGE=_env_file_defaults()["SWEEPER_STORAGE"])
    done = subprocess.run(["sbatch", "--test-only", str(script)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "to start at" in done.stderr, done.stderr
