"""The click shell: every command has --help; domain errors exit 2 with one line."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import click
import optuna
import pytest
from click.testing import CliRunner

from conftest import TINY, merge, real_env, swept_study
from sweeper.cli import main


def _commands(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        yield prefix + (name,)
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, prefix + (name,))


ALL = list(_commands(main))


def test_every_command_is_listed():
    assert {c[0] for c in ALL} >= {"run", "resume", "validate", "train", "status", "best", "dashboard", "doctor", "data"}
    assert ("data", "synth") in ALL and ("db", "init") in ALL


@pytest.mark.parametrize("cmd", ALL, ids=[" ".join(c) for c in ALL])
def test_every_command_has_help(cmd):
    result = CliRunner().invoke(main, [*cmd, "--help"], catch_exceptions=False)
    assert result.exit_code == 0
    assert "Usage:" in result.output


def test_top_level_help_and_version():
    result = CliRunner().invoke(main, ["--help"], catch_exceptions=False)
    assert result.exit_code == 0 and "run" in result.output
    result = CliRunner().invoke(main, ["--version"], catch_exceptions=False)
    assert result.exit_code == 0 and "sweeper" in result.output


def test_bad_study_file_exits_2_without_traceback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\ntrain:\n  epocs: 3\n")
    result = CliRunner().invoke(main, ["run", str(bad)], catch_exceptions=False)
    assert result.exit_code == 2
    assert result.output.strip() == f"Error: {bad}: unknown key 'train.epocs'; did you mean 'train.epochs'?"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", ["export", "report", "predict"])
def test_an_output_that_cannot_be_written_exits_2_before_the_work(tmp_path, monkeypatch, command):
    # /proc takes no files, even from root (whom a permission check lets write anywhere); it was a
    # traceback after the work (predict's whole scoring), from the atomic write
    monkeypatch.chdir(tmp_path)
    good = tmp_path / "s.yaml"
    good.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n")
    result = CliRunner().invoke(main, [command, str(good), "-o", "/proc/sweeper-out/t.parquet"],
                                catch_exceptions=False)
    assert result.exit_code == 2
    assert result.output.strip() == ("Error: -o /proc/sweeper-out/t.parquet: cannot be written "
                                     "(/proc: No such file or directory)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]  # nothing read, nothing written


@pytest.mark.parametrize("command", ["export", "predict"])
def test_a_table_name_of_no_known_format_exits_2_before_the_work(tmp_path, monkeypatch, command):
    """``predict -o preds.txt`` was refused only after the whole scoring."""
    monkeypatch.chdir(tmp_path)
    good = tmp_path / "s.yaml"
    good.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n")
    result = CliRunner().invoke(main, [command, str(good), "-o", "t.txt"], catch_exceptions=False)
    assert result.exit_code == 2
    assert result.output.strip() == "Error: t.txt: expected a .parquet or .csv file name"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]  # nothing read, nothing written


@pytest.mark.parametrize("command, out, name", [
    ("report", "s.yaml", "the study file"), ("export", "panel.parquet", "data.path"),
    ("predict", "./panel.parquet", "data.path"), ("predict", "new.csv", "--data"),
    ("report", "runs/sweep/study.db", "the study's database"),
    ("export", "hard.parquet", "data.path")])  # a hard link to the panel: the same file by another name
def test_an_output_that_is_a_file_the_command_reads_exits_2_before_the_work(tmp_path, monkeypatch, command,
                                                                           out, name):
    # predict -o panel.parquet replaced the study's own panel with its predictions, exit 0; report -o
    # s.yaml replaced the study file with HTML
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text("data: {path: panel.parquet}\n")
    for kept in ("panel.parquet", "new.csv"):
        (tmp_path / kept).write_text("kept")
    os.link(tmp_path / "panel.parquet", tmp_path / "hard.parquet")
    more = ["--data", "new.csv"] if out == "new.csv" else []
    result = CliRunner().invoke(main, [command, "s.yaml", *more, "-o", out], catch_exceptions=False)
    assert result.exit_code == 2
    assert result.output.strip() == f"Error: -o {Path(out)}: that is {name}, which this command reads; write to another file"
    assert [(tmp_path / f).read_text() for f in ("panel.parquet", "new.csv")] == ["kept", "kept"]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command, out", [
    ("predict", "runs/sweep/trials/7/predictions_valid.parquet"), ("export", "runs/sweep/trials/7/x.parquet"),
    ("report", "runs/sweep/trials/0/config.yaml"), ("report", "runs/sweep/baseline/model.txt"),
    ("report", "runs/sweep/owner.json")])
def test_an_output_among_the_studys_files_in_its_run_folder_exits_2_before_the_work(tmp_path, monkeypatch, command,
                                                                                  out):
    # predict -o into a trial's predictions changed what best says of it; report -o a trial's config.yaml
    # made best, predict and refit tracebacks; a report beside them (runs/sweep/report.html) is fine
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text("data: {path: panel.parquet}\n")
    (tmp_path / "panel.parquet").write_text("kept")
    result = CliRunner().invoke(main, [command, "s.yaml", "-o", out], catch_exceptions=False)
    assert (result.exit_code, result.output.strip()) == (
        2, f"Error: -o {out}: that is among the study's files in runs/sweep; write to another file")
    beside = CliRunner().invoke(main, ["report", "s.yaml", "-o", "runs/sweep/report.html"])
    assert "among the study's files" not in beside.output and "no such database file" in beside.output


@pytest.mark.slow
def test_an_output_that_is_a_fifo_or_a_link_is_written_through_not_replaced(tmp_path):
    # the atomic write renamed a plain file over either: as root, `-o /dev/null` replaced the device itself
    (tmp_path / "s.yaml").write_text("study: {name: s, storage: 'sqlite:///s.db'}\n"
                                     "data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n")
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db")
    study.add_trial(optuna.trial.create_trial(
        params={"x": 1.0}, distributions={"x": optuna.distributions.FloatDistribution(0, 2)}, value=0.5))
    os.mkfifo(tmp_path / "pipe.csv")
    (tmp_path / "out").mkdir()
    (tmp_path / "link.csv").symlink_to("out/real.csv")  # its target does not exist yet
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append((tmp_path / "pipe.csv").read_text()), daemon=True)
    reader.start()
    for out in ("pipe.csv", "link.csv"):
        done = subprocess.run([sys.executable, "-m", "sweeper.cli", "export", "s.yaml", "-o", out],
                              cwd=tmp_path, env=real_env(), capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout) == (0, f"wrote {out}: 1 trials, 7 columns\n"), done.stderr
    reader.join(timeout=30)
    assert stat.S_ISFIFO((tmp_path / "pipe.csv").lstat().st_mode)
    assert (tmp_path / "link.csv").is_symlink() and os.readlink(tmp_path / "link.csv") == "out/real.csv"
    assert got == [(tmp_path / "out" / "real.csv").read_text()]
    assert got[0].splitlines()[0] == "number,state,value,datetime_start,datetime_complete,duration_s,params.x"
    assert got[0].splitlines()[1].startswith("0,COMPLETE,0.5,") and len(got[0].splitlines()) == 2
    assert sorted(p.name for p in tmp_path.glob(".*")) == []  # no temporary file left beside either


@pytest.mark.slow
def test_a_device_torch_cannot_use_exits_2_before_the_work(tmp_path):
    # it was torch's traceback (exit 1), after the study and the data were loaded
    import torch

    swept_study(tmp_path, merge(TINY, {"study": {"n_trials": 1}}))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "study.db" not in p.name)
    with pytest.raises(RuntimeError) as typo:
        torch.device("gpu0")
    for command, out in (("predict", ["-o", "p.parquet"]), ("refit", [])):
        args = [sys.executable, "-m", "sweeper.cli", command, "study.yaml", "--device", "gpu0", *out]
        done = subprocess.run(args, cwd=tmp_path, env=real_env(), capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == f"Error: --device gpu0: {str(typo.value).splitlines()[0]}\n"
    meta = [sys.executable, "-m", "sweeper.cli", "predict", "study.yaml", "--device", "meta",
            "-o", "p.parquet"]  # a device whose tensors hold no data: it failed only in the scoring
    done = subprocess.run(meta, cwd=tmp_path, env=real_env(), capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (2, "Error: --device meta: Cannot copy out of meta tensor; "
                                                 "no data!\n")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "study.db" not in p.name) == before


def test_a_panel_cache_that_cannot_be_made_exits_2(tmp_path, monkeypatch):
    # a service user's read-only home holds the default cache: one line that says what to set
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SWEEPER_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", "/proc/sweeper-home")
    good = tmp_path / "s.yaml"
    good.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n")
    result = CliRunner().invoke(main, ["validate", str(good)], catch_exceptions=False)
    assert result.exit_code == 2
    assert result.output.strip() == (
        "Error: data.cache_dir: the panel cache /proc/sweeper-home/.cache/sweeper/panels cannot be made or "
        "written (/proc: No such file or directory); set data.cache_dir or $SWEEPER_CACHE_DIR to a writable "
        "folder, or data.cache: false")


def test_a_cache_or_database_whose_folder_is_a_file_exits_2(tmp_path, monkeypatch):
    """A Parquet panel's cache and a SQLite storage under a file: validate passed the storage and crashed
    on the cache (the file's fingerprint memo was written first); run crashed on the storage's folder."""
    from sweeper.errors import StorageError
    from sweeper.store import open_storage

    monkeypatch.chdir(tmp_path)
    CliRunner().invoke(main, ["data", "synth", "p.parquet", "--assets", "20", "--dates", "60", "--features", "2"])
    Path("s.yaml").write_text("data: {path: p.parquet}\n")
    for key, value, line in [
        ("--set", f"data.cache_dir={tmp_path}/p.parquet/c", f"data.cache_dir: the panel cache {tmp_path}/p.parquet/c "
         f"cannot be made or written ({tmp_path}/p.parquet: Not a directory); set data.cache_dir or "
         "$SWEEPER_CACHE_DIR to a writable folder, or data.cache: false"),
        ("--storage", f"sqlite:///{tmp_path}/p.parquet/x.db", f"storage sqlite:///{tmp_path}/p.parquet/x.db: cannot "
         f"create {tmp_path}/p.parquet/x.db ({tmp_path}/p.parquet: Not a directory)")]:
        result = CliRunner().invoke(main, ["validate", "s.yaml", key, value], catch_exceptions=False)
        assert (result.exit_code, result.output.strip().splitlines()[-1]) == (2, f"Error: {line}")
    with pytest.raises(StorageError) as err:  # run's own open, past a pre-flight check
        open_storage(f"sqlite:///{tmp_path}/p.parquet/x.db")
    assert str(err.value) == (f"storage sqlite:///{tmp_path}/p.parquet/x.db: cannot make the database "
                              f"{tmp_path}/p.parquet/x.db ([Errno 17] File exists: '{tmp_path}/p.parquet')")


def test_a_dashboard_port_in_use_exits_2(tmp_path, monkeypatch):
    import socket

    monkeypatch.chdir(tmp_path)
    good = tmp_path / "s.yaml"
    good.write_text("study: {name: s, storage: 'sqlite:///s.db'}\n"
                    "data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n")
    import optuna

    optuna.create_study(study_name="s", storage="sqlite:///s.db")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["dashboard", str(good), "--port", str(port)], catch_exceptions=False)
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        f"Error: --host 127.0.0.1 --port {port}: cannot serve there (Address already in use)")
    # no such port: it was an OverflowError's traceback
    result = CliRunner().invoke(main, ["dashboard", str(good), "--port", "70000"], catch_exceptions=False)
    assert (result.exit_code, result.output.strip().splitlines()[-1]) == (
        2, "Error: Invalid value for '--port': 70000 is not in the range 0<=x<=65535.")


def test_set_type_error_exits_2(tmp_path):
    good = tmp_path / "s.yaml"
    good.write_text("data:\n  synthetic: {assets: 20, dates: 200, features: 4}\n")
    result = CliRunner().invoke(main, ["train", str(good), "--set", "train.epochs=two"], catch_exceptions=False)
    assert result.exit_code == 2
    assert "train.epochs: Input should be a valid integer" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_library_imports_without_click_or_cuda():
    code = ("import sys; import sweeper, sweeper.config, sweeper.dispatch.run, sweeper.data, sweeper.core, "
            "sweeper.quant.ic, sweeper.devices; import torch; "
            "assert 'click' not in sys.modules, 'click imported'; "
            "assert not torch.cuda.is_initialized(); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_data_synth_writes_panel_and_prints_oracle(tmp_path):
    out = tmp_path / "p.parquet"
    result = CliRunner().invoke(main, ["data", "synth", str(out), "--assets", "30", "--dates", "200",
                                       "--features", "4", "--seed", "1"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert out.exists()
    assert "oracle IC:" in result.output and "test" in result.output


def test_data_synth_dates_start_where_every_split_has_an_oracle(tmp_path):
    """--dates took 10 to 26 and then refused the panel it had generated (the default study's lookback needs
    27), and 27 to 35 printed a test oracle of nan: the least is 36, the first with a test oracle."""
    synth = ["data", "synth", str(tmp_path / "p.parquet"), "--assets", "30", "--features", "2", "--dates"]
    short = CliRunner().invoke(main, [*synth, "35"])
    assert short.exit_code == 2 and "'--dates': 35 is not in the range x>=36" in short.output
    least = CliRunner().invoke(main, [*synth, "36"], catch_exceptions=False)
    assert least.exit_code == 0, least.output
    oracle = dict(zip(*[iter(least.output.splitlines()[-1].split()[2:])] * 2))
    assert set(oracle) == {"train", "valid", "test"} and "nan" not in oracle.values()


def test_data_synth_replaces_a_panel_but_never_another_file(tmp_path):
    study, panel = tmp_path / "s.yaml", tmp_path / "p.parquet"
    study.write_text("study: {name: mine}\n")
    synth = ["data", "synth", "--assets", "10", "--dates", "60", "--features", "2"]
    refused = CliRunner().invoke(main, [*synth, str(study)])
    assert refused.exit_code == 2
    assert refused.output.strip().splitlines()[-1] == (
        f"Error: {study}: exists and is not a Parquet file; write the panel to another file")
    assert study.read_text() == "study: {name: mine}\n"
    for seed in ("1", "2"):  # the second run replaces the first panel
        assert CliRunner().invoke(main, [*synth, str(panel), "--seed", seed]).exit_code == 0
    negative = CliRunner().invoke(main, [*synth, str(panel), "--seed", "-3"])
    assert negative.exit_code == 2 and "'--seed': -3 is not in the range x>=0" in negative.output


def test_doctor_runs_without_gpu(monkeypatch):
    monkeypatch.delenv("SWEEPER_FAKE_GPUS", raising=False)
    result = CliRunner().invoke(main, ["doctor"], catch_exceptions=False)
    assert result.exit_code == 0
    assert result.output.strip().splitlines()[-1] == "no GPU: CPU slots will be used"


def test_db_init_creates_the_study_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "s.yaml"
    path.write_text("study: {name: shared}\ndata:\n  synthetic: {assets: 20, dates: 200, features: 4}\n"
                    "model: {name: mlp, hidden_size: 8}\n")
    url = f"sqlite:///{tmp_path}/shared.db"
    first = CliRunner().invoke(main, ["db", "init", str(path), "--storage", url], catch_exceptions=False)
    assert first.exit_code == 0, first.output
    assert first.output.strip() == f"study 'shared' in {url}: created"
    again = CliRunner().invoke(main, ["db", "init", str(path), "--storage", url], catch_exceptions=False)
    assert again.output.strip() == f"study 'shared' in {url}: already there (0 trials)"
    import optuna

    study = optuna.load_study(study_name="shared", storage=url)
    assert study.user_attrs["config"]["model"]["name"] == "mlp" and study.user_attrs["data_fingerprint"]


def test_a_command_freezes_the_heap_at_exit_once(monkeypatch, tmp_path):
    """The interpreter's last collections would walk torch's and Optuna's objects (seconds on a
    loaded box between a Ctrl-C's last line and the exit): a command registers gc.freeze, once."""
    import atexit
    import gc

    from sweeper import cli

    registered: list[object] = []
    cli._freeze_at_exit.cache_clear()  # as a fresh process
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        result = CliRunner().invoke(main, ["status", "missing.yaml"])
        assert result.exit_code == 2
    assert registered == [gc.freeze]
