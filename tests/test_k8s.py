"""The Kubernetes recipe in deploy/k8s/: parse every manifest and check the
invariants the scale-out design depends on."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import torch
import yaml

from sweeper.config import validate_config
from sweeper.store import PG_MAX_OVERFLOW, PG_POOL_SIZE, normalize_url

ROOT = Path(__file__).parent.parent
K8S = ROOT / "deploy" / "k8s"


def _docs() -> list[dict]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


DOCS = _docs()


def _one(kind: str, name: str) -> dict:
    found = [d for d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}"
    return found[0]


def _container(workload: dict, name: str) -> dict:
    return next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def _mounts(container: dict) -> dict[str, dict]:
    return {m["name"]: m for m in container.get("volumeMounts", [])}


def _volumes(workload: dict) -> dict[str, dict]:
    return {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}


def _storage_arg(container: dict) -> str:
    cmd = container["command"]
    return cmd[cmd.index("--storage") + 1]


DRIVER = _one("Job", "sweeper-driver")
INIT = _one("Job", "sweeper-db-init")
PG = _one("StatefulSet", "sweeper-postgres")
STUDY = validate_config(yaml.safe_load(_one("ConfigMap", "sweeper-study")["data"]["study.yaml"]), "k8s study")


def test_every_manifest_is_named_and_the_kustomization_lists_them_all():
    assert all(d.get("apiVersion") and d["metadata"].get("name") for d in DOCS if d["kind"] != "Kustomization")
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def test_postgres_statefulset_keeps_its_data_on_a_pvc_behind_a_service():
    spec = PG["spec"]
    claim = spec["volumeClaimTemplates"][0]
    pg = spec["template"]["spec"]["containers"][0]
    assert pg["image"].startswith("postgres:")
    assert claim["metadata"]["name"] in _mounts(pg) and claim["spec"]["resources"]["requests"]["storage"]
    assert _env(pg)["PGDATA"]["value"].startswith(_mounts(pg)[claim["metadata"]["name"]]["mountPath"] + "/")
    service = _one("Service", spec["serviceName"])
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["port"] == 5432
    assert "secretKeyRef" in _env(pg)["POSTGRES_PASSWORD"]["valueFrom"]


def test_init_job_runs_db_init_against_the_same_storage_as_the_drivers():
    init = _container(INIT, "db-init")
    assert init["command"][:3] == ["sweeper", "db", "init"]
    driver = _container(DRIVER, "driver")
    assert driver["command"][:2] == ["sweeper", "run"]
    assert init["command"][3] == driver["command"][2]  # the same study file
    url = _storage_arg(driver)
    assert _storage_arg(init) == url == STUDY.study.storage
    assert normalize_url(url).startswith("postgresql+psycopg://")
    host_port = url.split("@", 1)[1].split("/", 1)[0]
    assert host_port == f"{PG['spec']['serviceName']}:5432"
    assert ":" not in url.split("://", 1)[1].split("@", 1)[0], "no password in the URL: PGPASSWORD from a Secret"
    for c in (init, driver):
        assert "secretKeyRef" in _env(c)["PGPASSWORD"]["valueFrom"]


def test_one_driver_pod_per_gpu_node():
    spec = DRIVER["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] >= 2
    pod = spec["template"]["spec"]
    gpus = int(_container(DRIVER, "driver")["resources"]["limits"]["nvidia.com/gpu"])
    assert gpus >= 1
    term = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert pod["restartPolicy"] == "Never"


def test_host_id_is_the_pod_name():
    env = _env(_container(DRIVER, "driver"))
    assert env["SWEEPER_HOST_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_data_is_shared_read_only_and_runs_read_write_at_the_paths_the_study_names():
    driver = _container(DRIVER, "driver")
    mounts, volumes = _mounts(driver), _volumes(DRIVER)
    data = mounts["data"]
    assert data["readOnly"] is True and volumes["data"]["persistentVolumeClaim"]["readOnly"] is True
    assert STUDY.data.path.startswith(data["mountPath"] + "/")
    runs = mounts["runs"]
    assert not runs.get("readOnly") and STUDY.study.artifacts.startswith(runs["mountPath"] + "/")
    claims = {d["metadata"]["name"]: d for d in DOCS if d["kind"] == "PersistentVolumeClaim"}
    assert claims[volumes["data"]["persistentVolumeClaim"]["claimName"]]["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert claims[volumes["runs"]["persistentVolumeClaim"]["claimName"]]["spec"]["accessModes"] == ["ReadWriteMany"]
    init = _container(INIT, "db-init")
    assert _mounts(init)["data"]["mountPath"] == data["mountPath"] and _mounts(init)["data"]["readOnly"] is True


def test_grace_period_leaves_time_to_checkpoint_and_heartbeats_outlast_hiccups():
    assert DRIVER["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 300
    # a host is declared dead after grace_period without a heartbeat: several beats, never one
    assert STUDY.study.grace_period >= 5 * STUDY.study.heartbeat_interval


def test_max_connections_covers_every_process_of_every_host():
    """drivers x (1 driver + one worker per GPU slot) x (pool + overflow), plus
    the init Job, a dashboard and the server's superuser reserve."""
    args = _container(PG, "postgres")["args"]
    max_conn = int(next(a.split("=", 1)[1] for a in args if a.startswith("max_connections=")))
    gpus = int(_container(DRIVER, "driver")["resources"]["limits"]["nvidia.com/gpu"])
    processes = DRIVER["spec"]["parallelism"] * (1 + gpus * STUDY.devices.trials_per_gpu)
    per_process = PG_POOL_SIZE + PG_MAX_OVERFLOW
    assert processes * per_process + 2 * per_process + 3 <= max_conn


def test_no_password_is_written_in_a_manifest():
    assert not [d for d in DOCS if d["kind"] == "Secret"]
    for workload in (DRIVER, INIT, PG):
        for c in workload["spec"]["template"]["spec"]["containers"]:
            for name, var in _env(c).items():
                if "PASSWORD" in name:
                    assert "value" not in var and "secretKeyRef" in var["valueFrom"], name


# ------------------------------------------------------------------ the image


def _dockerfile() -> tuple[list[str], dict[str, str]]:
    """The Dockerfile's instructions (continuation lines joined) and its ARG defaults."""
    text = (K8S / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    args = dict(ln.split(None, 1)[1].split("=", 1) for ln in lines if ln.startswith("ARG ") and "=" in ln)
    return lines, args


def test_image_runs_the_torch_the_tests_run_and_pyproject_claims_no_older_one():
    lines, args = _dockerfile()
    tested = torch.__version__.split("+")[0]  # "2.13.0+cpu": the CPU wheel of the same release
    assert args["TORCH_VERSION"] == tested
    # torch comes from one pinned install, not from a base image that bundles another version
    assert lines[0].startswith("FROM python:") and "torch" not in lines[0]
    installs = [ln for ln in lines if ln.startswith("RUN ") and "pip install" in ln]
    assert installs and all('"torch==${TORCH_VERSION}"' in ln for ln in installs)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bound = [re.fullmatch(r"torch>=(\d+)\.(\d+)", d.replace(" ", "")) for d in project["dependencies"]
             if re.match(r"torch\b", d)]
    assert len(bound) == 1 and bound[0], project["dependencies"]
    assert (int(bound[0][1]), int(bound[0][2])) == tuple(int(p) for p in tested.split(".")[:2])
    # and the image's Python is one pyproject allows
    image_python = tuple(int(p) for p in re.match(r"FROM python:(\d+)\.(\d+)", lines[0]).groups())
    assert image_python >= tuple(int(p) for p in re.fullmatch(r">=(\d+)\.(\d+)", project["requires-python"]).groups())


def test_image_gets_the_driver_libraries_sweeper_needs_and_its_own_source():
    lines, _ = _dockerfile()
    env = " ".join(ln for ln in lines if ln.startswith("ENV "))
    caps = re.search(r"NVIDIA_DRIVER_CAPABILITIES=(\S+)", env)[1].split(",")
    assert {"compute", "utility"} <= set(caps)  # libcuda for the workers, libnvidia-ml for NVML slot planning
    copied = {part for ln in lines if ln.startswith("COPY ") for part in ln.split()[1:-1]}
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["readme"]
    assert {"pyproject.toml", readme, "sweeper"} <= copied  # what `pip install .` builds from
