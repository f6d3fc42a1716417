"""GPU check of the training core and of packing: one run of at most 5 minutes on one GPU.

1. throughput: each model trains two epochs in fp32, bf16 and fp16 -> samples/s, peak memory,
   and each precision's speed against fp32 (what ``precision: auto`` picks is in the summary)
2. probe: the micro-batch probe against an exhaustive scan of micro-batch throughput, under a
   memory ceiling made by a blocker tensor (so the sizes are realistic)
3. oom: an OOM forced mid-training with torch.cuda.set_per_process_memory_fraction; the loop must
   halve the micro-batch, accumulate, and finish
4. packing: one generated study run twice with ``python -m sweeper.cli run`` in a temp folder,
   ``devices.trials_per_gpu: auto`` and then ``1``, same study and same budget (study.timeout):
   trials per hour, the most trials at once (from the store), and the GPU's utilisation sampled
   from NVML every 0.5 s while each sweep runs
5. stacked: K seeds of one model trained as one stack (``sweeper.core.train_stack``, issue 29),
   K = 1, 4, 8, 16, for the MLP, the transformer and the LSTM of the main studies
   (``studies/*_ic.yaml``: their model, batch size and samples per epoch), two epochs each: the
   second epoch's samples/s (every member's rows), its ratio to K = 1's (> 1: stacking beats K
   separate runs), peak memory (``torch.cuda.max_memory_allocated``: the epochs and the final
   scoring) and the GPU's busy share (NVML, every 0.1 s over the second epoch's steps only)
6. population: the same for stacks of P = 1, 4, 16, 64 different trials of each of those models
   (issue 40; a population as ``sweeper.validation.runner.train_population`` stacks it): member i
   has its own train.lr (log-uniform in [5e-4, 5e-3]), train.weight_decay ([0, 0.1]), model.dropout
   ([0, 0.3]), all drawn once from a fixed seed, and train.seed i; member-samples/s, ``vs_p1`` =
   rate_P / rate_1 (what P trials stacked gain over P trials one at a time), peak memory, busy share.
   Both stack sections run the sizes smallest first across the models and skip a stack whose
   time, extrapolated from the model's smaller ones (a line through the last two), would pass the
   section's mark: the largest stacks are dropped first, and ``dropped`` lists them. A stack that
   runs out of memory (after the loop's own micro-batch halving) is a row with ``oom``, not a
   failure.

Time: a section starts no new work past its mark, a share of ``--budget-s`` (240 s) from the start
(throughput 0.2, probe 0.32, stacked 0.45, population 0.62); packing's two sweeps share what is
left up to the budget, and the minute past it, of the 5, absorbs the last unit of each section.
The last line of output is one JSON summary (a section that fails reports its error there).
Without CUDA it says so, prints {"cuda": false} and exits 0. ``--cpu-smoke`` runs every section's
code path on the CPU, small: throughput in fp32 and bf16; the probe with a stand-in memory
reader; the OOM from a model that refuses large batches once squeezed; stacks and populations of
1 and 4, 4 steps an epoch; packing on one fake 4000 MB GPU (SWEEPER_FAKE_GPUS=1) whose trials
report 1200 MB, with no NVML.

    python benchmarks/gpu_check.py [--budget-s 240] [--cpu-smoke]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # overlap.py: trials at once
from overlap import most_at_once
from sweeper.config import validate_config
from sweeper.core import Member, NullHook, train, train_stack
from sweeper.core.batch_search import CudaMemory, attempt, find_micro_batch, is_oom, release_memory
from sweeper.core.loop import stack_step
from sweeper.core.precision import native_bf16, resolve_precision
from sweeper.core.step import StackStep, _probe
from sweeper.data import Batcher, load_panel
from sweeper.errors import OutOfMemory

MODELS = {
    "transformer": {"name": "transformer", "d_model": 64, "nhead": 4, "num_layers": 2,
                    "dim_feedforward": 128},
    "lstm": {"name": "lstm", "hidden_size": 64, "num_layers": 2},
    "gru": {"name": "gru", "hidden_size": 64, "num_layers": 2},
    "mlp": {"name": "mlp", "hidden_size": 256, "num_layers": 2},
}
GiB = 2**30
UTIL_EVERY_S = 0.5
SQUEEZE_MODULE = """import torch
from torch import nn

LIMIT = [None]  # gpu_check --cpu-smoke: training batches above LIMIT rows run out of memory once it is set


class Squeezed(nn.Module):
    def __init__(self, n_features, lookback, hidden=32):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(n_features * lookback, hidden), nn.GELU(),
                                 nn.Linear(hidden, 1))

    def forward(self, x):
        if self.training and LIMIT[0] is not None and len(x) > LIMIT[0]:
            raise torch.OutOfMemoryError(f"out of memory (squeezed: {len(x)} rows > {LIMIT[0]})")
        return self.net(x).squeeze(-1)
"""


def config(model: dict, synthetic: dict, **train: Any):
    base = {"epochs": 2, "batch_size": 1024, "lr": 1e-3, "patience": 100, "eval_batch_size": 16384}
    return validate_config({"data": {"synthetic": synthetic, "lookback": 20}, "model": model,
                            "train": base | train}, "gpu_check")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- 1. throughput


RNNS = ("lstm", "gru")


def _cpu_bf16_rnn() -> bool:
    """oneDNN has no bf16 LSTM on CPUs without bf16 instructions (an AVX2-only EPYC, say): a
    bf16 run of an RNN there fails in the kernel, not in sweeper, so try one tiny forward."""
    lstm = torch.nn.LSTM(2, 2, batch_first=True)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lstm(torch.zeros(1, 2, 2))
    except RuntimeError:
        return False
    return True


def throughput(panel, synthetic: dict, device: torch.device, precisions, models, batch: int,
               deadline: float) -> dict:
    """Two epochs per model and precision; the second epoch is the steady one."""
    rows = []
    for name, model in models.items():
        for precision in precisions:
            if time.monotonic() > deadline:
                rows.append({"model": name, "precision": precision, "skipped": "time budget"})
                continue
            if device.type == "cpu" and precision == "bf16" and model["name"] in RNNS and not _cpu_bf16_rnn():
                rows.append({"model": name, "precision": precision,
                             "skipped": "no bf16 RNN kernel on this CPU"})
                continue
            result = train(config(model, synthetic, precision=precision, batch_size=batch), panel,
                           device=device)
            last, m = result.history[-1], result.metrics
            row = {"model": name, "precision": m["precision"], "samples_per_s": round(last["samples_per_s"]),
                   "peak_mem_mb": round(last["peak_mem_mb"], 1), "val_ic": round(m["val_ic"], 4),
                   "duration_s": round(m["duration_s"], 1)}
            print(f"  {name:12s} {row['precision']:5s} {row['samples_per_s']:>10,} samples/s "
                  f"{row['peak_mem_mb']:>9.1f} MiB peak  val_ic {row['val_ic']:.4f}  {row['duration_s']}s",
                  flush=True)
            rows.append(row)
    fp32 = {r["model"]: r["samples_per_s"] for r in rows
            if r.get("precision") == "fp32" and "samples_per_s" in r}
    for r in rows:
        if r.get("samples_per_s") and fp32.get(r["model"]):
            r["vs_fp32"] = round(r["samples_per_s"] / fp32[r["model"]], 2)
    return {"auto_precision": resolve_precision("auto", device).name, "runs": rows}


# ---------------------------------------------------------------- 2. the probe against a scan


class Ledger:
    """--cpu-smoke's stand-in memory reader: a step of ``rows`` peaks at rows x ``per_row`` bytes."""

    base_bytes = 0

    def __init__(self, free: int, per_row: int) -> None:
        self.free, self.per_row, self.peak = free, per_row, 0

    def free_bytes(self) -> int:
        return self.free

    def reset_peak(self) -> None:
        self.peak = 0

    def peak_bytes(self) -> int:
        return self.peak

    def charged(self, step: Callable[[int], None]) -> Callable[[int], None]:
        def charged_step(rows: int) -> None:
            step(rows)
            self.peak = max(self.peak, rows * self.per_row)
        return charged_step


def timed_steps(step: Callable[[int], None], size: int, steps: int, device: torch.device) -> float:
    """Samples/s of ``steps`` steps at ``size`` after one warm-up step."""
    step(size)
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step(size)
    sync(device)
    return steps * size / (time.perf_counter() - start)


def stack_of_one(cfg, panel, device: torch.device) -> StackStep:
    """The step a run of ``cfg`` trains and probes with: the stack of one that ``train`` sets up
    (``sweeper.core.loop.stack_step``), its model seeded with ``train.seed``."""
    return stack_step([Member(cfg, panel)], device)


def probe_vs_scan(panel, synthetic: dict, device: torch.device, leave_gib: float, deadline: float) -> dict:
    """The probe's choice under a ceiling of ``leave_gib`` free GiB, against a scan of every
    power-of-two micro-batch (and the choice itself): does it fit, and how fast is it?"""
    cuda = device.type == "cuda"
    model_cfg = ({"name": "transformer", "d_model": 256, "nhead": 8, "num_layers": 4, "dim_feedforward": 1024}
                 if cuda else {"name": "mlp", "hidden_size": 64})
    cfg = config(model_cfg, synthetic, precision="bf16", lr=1e-4, weight_decay=0.01, grad_clip=1.0, seed=0)
    stack_step = stack_of_one(cfg, panel.to(device, 0.5), device)
    cap = stack_step.lanes[0].batcher.n_samples
    step = _probe(stack_step, 0)  # the plan's probe: a real step of the stack on random rows
    blocker = None
    if cuda:
        mem: Any = CudaMemory(device)
        blocker = torch.empty(max(0, torch.cuda.mem_get_info()[0] - int(leave_gib * GiB)), dtype=torch.uint8,
                              device=device)
    else:
        mem = Ledger(free=1_000_000, per_row=2_000)  # 0.9 x 1 MB at 2 kB a row: 450 rows
        step = mem.charged(step)
    try:
        t0 = time.perf_counter()
        with stack_step.preserved():
            probe = find_micro_batch(step, mem, start=64 if not cuda else 512, cap=cap, margin=0.1, steps=3)
        probe_s = time.perf_counter() - t0
        print(f"  probe: micro-batch {probe.micro_batch} after {len(probe.tried)} sizes in {probe_s:.1f}s "
              f"(budget {probe.budget_bytes / GiB:.3f} GiB of {probe.free_bytes / GiB:.3f} GiB free)",
              flush=True)
        scan = scan_sizes(step, stack_step, probe.micro_batch, cap, device, deadline)
    finally:
        del blocker
        release_memory()
    ran = [s for s in scan if s.get("samples_per_s")]
    best = max(ran, key=lambda s: s["samples_per_s"]) if ran else None
    chosen = next((s for s in scan if s["size"] == probe.micro_batch), None)
    return {"leave_gib": leave_gib if cuda else None, "micro_batch": probe.micro_batch, "tried": probe.tried,
            "probe_s": round(probe_s, 1), "budget_gib": round(probe.budget_bytes / GiB, 3), "scan": scan,
            "largest_fit_in_scan": max((s["size"] for s in ran), default=None),
            "best_size": best and best["size"],
            "chosen_vs_best_throughput": (round(chosen["samples_per_s"] / best["samples_per_s"], 3)
                                          if chosen and best and chosen.get("samples_per_s") else None)}


def scan_sizes(step, stack_step: StackStep, chosen: int, cap: int, device: torch.device,
               deadline: float) -> list[dict]:
    sizes = sorted({min(cap, 2**k) for k in range(6, 30) if 2**k <= 2 * chosen} | {chosen})
    rows = []
    for size in sizes:
        if time.monotonic() > deadline:
            rows.append({"size": size, "skipped": "time budget"})
            continue
        with stack_step.preserved():
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            ok, rate = attempt(timed_steps, step, size, 5, device)
        if not ok:
            release_memory()
            rows.append({"size": size, "oom": True})
            print(f"  scan {size:>7}: OOM", flush=True)
            continue
        peak = torch.cuda.max_memory_allocated() / GiB if device.type == "cuda" else None
        rows.append({"size": size, "samples_per_s": round(rate), "peak_gib": peak and round(peak, 3)})
        print(f"  scan {size:>7}: {rate:>12,.0f} samples/s" + (f"  peak {peak:.2f} GiB" if peak else ""),
              flush=True)
    return rows


# ---------------------------------------------------------------- 3. OOM recovery


class Squeeze(NullHook):
    """Hook that, a few steps in, caps memory at ``share`` of what the step peaked at: the next
    step at the probed micro-batch then runs out of memory. On the CPU (--cpu-smoke) the cap is
    the Squeezed model's row limit at ``share`` of the batch."""

    def __init__(self, at_poll: int, share: float, batch: int) -> None:
        self.at_poll, self.share, self.batch, self.polls, self.cap_gib = at_poll, share, batch, 0, None

    def should_stop(self) -> bool:
        self.polls += 1
        if self.polls == self.at_poll:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                total = torch.cuda.mem_get_info()[1]
                cap = self.share * torch.cuda.max_memory_allocated()
                torch.cuda.set_per_process_memory_fraction(cap / total)
                torch.cuda.empty_cache()  # cached blocks would otherwise serve the next step
                self.cap_gib = cap / GiB
            else:
                sys.modules["squeeze_model"].LIMIT[0] = int(self.share * self.batch)
        return False


def oom_recovery(panel, synthetic: dict, device: torch.device, folder: Path) -> dict:
    cuda = device.type == "cuda"
    batch = 16384 if cuda else 256
    model = ({"name": "transformer", "d_model": 128, "nhead": 4, "num_layers": 2, "dim_feedforward": 512}
             if cuda else {"name": "squeeze_model:Squeezed"})
    if not cuda:  # a user model file, found the way a study's models are (SWEEPER_MODEL_PATH)
        (folder / "squeeze_model.py").write_text(SQUEEZE_MODULE)
        os.environ["SWEEPER_MODEL_PATH"] = str(folder)
    cfg = config(model, synthetic, precision="bf16" if cuda else "fp32", batch_size=batch, epochs=1,
                 samples_per_epoch=batch * 12)
    hook = Squeeze(at_poll=4, share=0.7, batch=batch)
    try:
        result = train(cfg, panel, device=device, hook=hook, log=lambda line: print("   ", line, flush=True))
    finally:
        if cuda:
            torch.cuda.set_per_process_memory_fraction(1.0)
        release_memory()
    m = result.metrics
    print(f"  OOM recovery: micro-batch {batch} -> {m['micro_batch_size']} (accum {m['accum_steps']}), "
          f"val_ic {m['val_ic']:.4f}", flush=True)
    return {"batch_size": m["batch_size"], "micro_batch_size": m["micro_batch_size"],
            "accum_steps": m["accum_steps"],
            "cap_gib": hook.cap_gib and round(hook.cap_gib, 3), "val_ic": round(m["val_ic"], 4),
            "recovered": m["micro_batch_size"] < batch and math.isfinite(m["val_ic"])}


# ---------------------------------------------------------------- 4. a packed sweep against one trial per GPU


def packing_study(per_gpu: Any, smoke: bool, timeout_s: float | None) -> dict:
    """The same study for both sweeps; only devices.trials_per_gpu differs."""
    if smoke:  # tiny trials on one fake GPU
        data = {"synthetic": {"assets": 24, "dates": 160, "features": 3, "seed": 1}, "lookback": 5}
        model = {"name": "mlp", "hidden_size": 16, "dropout": 0.0}
        train_cfg = {"epochs": 2, "batch_size": 256, "samples_per_epoch": 8192}
        study = {"n_trials": 4}
        space = {"model.hidden_size": {"type": "categorical", "choices": [8, 16]}}
        most = 3
    else:  # small alpha models: the trials that leave a GPU idle when run one at a time
        data = {"synthetic": {"assets": 300, "dates": 1000, "features": 16, "seed": 0}, "lookback": 20}
        model = {"name": "transformer", "d_model": 32, "nhead": 2, "num_layers": 1, "dim_feedforward": 64,
                 "dropout": 0.0}
        train_cfg = {"epochs": 3, "batch_size": 1024, "samples_per_epoch": 65536, "max_minutes": 0.25}
        study = {"n_trials": 400, "timeout": timeout_s}
        space = {"model.d_model": {"type": "categorical", "choices": [32, 64]},
                 "model.num_layers": {"type": "categorical", "choices": [1, 2]}}
        most = max(2, min(8, (os.cpu_count() or 2) // 2))
    space["train.lr"] = {"type": "float", "low": 5e-4, "high": 5e-3, "log": True}
    devices = {"gpus": "auto", "trials_per_gpu": per_gpu}
    if per_gpu == "auto":
        devices.update(memory_margin=0.1, max_trials_per_gpu=most)
    return {"study": {"name": "packing", "sampler": {"name": "random", "seed": 0}, "pruner": {"name": "none"},
                      **study},
            "data": data, "model": model, "train": {"patience": 5, **train_cfg}, "devices": devices,
            "search_space": space}


class UtilSampler:
    """NVML utilisation of one GPU every ``every`` seconds, on a thread, while a sweep runs (or while
    ``gate`` is set)."""

    def __init__(self, uuid: str | None, every: float = UTIL_EVERY_S,
                 gate: threading.Event | None = None) -> None:
        self.uuid, self.every, self.gate, self.samples, self.error = uuid, every, gate, [], None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> UtilSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = self._handle(pynvml)
            while not self._stop.wait(self.every):
                if self.gate is None or self.gate.is_set():  # gate: only while it is open
                    self.samples.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            pynvml.nvmlShutdown()
        except Exception as exc:  # noqa: BLE001 - no NVML (CPU, fake GPUs): no samples, said why
            self.error = f"{type(exc).__name__}: {exc}"

    def _handle(self, pynvml: Any) -> Any:
        """The GPU this process (and so the sweep) sees, by UUID: NVML numbers GPUs its own way."""
        if self.uuid:
            try:
                return pynvml.nvmlDeviceGetHandleByUUID(self.uuid)
            except Exception:  # noqa: BLE001 - an unexpected UUID form: the first GPU, as on a one-GPU machine
                pass
        return pynvml.nvmlDeviceGetHandleByIndex(0)

    def summary(self) -> dict:
        s = sorted(self.samples)
        if not s:
            return {"samples": 0, "error": self.error}
        return {"samples": len(s), "mean": round(statistics.mean(s), 1), "median": statistics.median(s),
                "p90": s[int(0.9 * (len(s) - 1))],
                "share_at_least_75": round(sum(v >= 75 for v in s) / len(s), 3)}


def one_sweep(folder: Path, study: dict, env: dict, limit_s: float, uuid: str | None) -> dict:
    import optuna

    folder.mkdir(parents=True)
    (folder / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    with UtilSampler(uuid) as util:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "sweeper.cli", "run", "study.yaml"], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=limit_s)
        wall = time.monotonic() - start
    if proc.returncode != 0:
        return {"error": f"sweeper run exited {proc.returncode}: {(proc.stdout + proc.stderr)[-600:]}"}
    storage = f"sqlite:///{folder / 'runs' / study['study']['name'] / 'study.db'}"
    trials = optuna.load_study(study_name=study["study"]["name"], storage=storage).get_trials()
    done = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    attrs = [t.user_attrs for t in done]

    def median_of(key: str) -> float | None:
        values = [a[key] for a in attrs if isinstance(a.get(key), (int, float)) and math.isfinite(a[key])]
        return round(statistics.median(values), 1) if values else None
    span = (max(t.datetime_complete for t in done) - min(t.datetime_start for t in done)).total_seconds() \
        if done else 0.0
    return {"trials_per_gpu": study["devices"]["trials_per_gpu"], "finished": len(done),
            "failed": sum(t.state.name == "FAIL" for t in trials), "wall_s": round(wall, 1),
            # with start-up and the last trial's tail; steady: from the first start to the last end
            "trials_per_hour": round(3600 * len(done) / wall, 1),
            "trials_per_hour_steady": round(3600 * len(done) / span, 1) if span else None,
            "most_at_once": most_at_once(done),
            "median_trial_s": median_of("duration_s"), "median_peak_mem_mb": median_of("peak_mem_mb"),
            "median_probe_peak_mem_mb": median_of("probe_peak_mem_mb"),
            "median_allotted_mb": median_of("gpu_mem_allotted_mb"), "gpu_util": util.summary()}


def packed_vs_one(smoke: bool, deadline: float, folder: Path, uuid: str | None) -> dict:
    env = {**os.environ}
    env.pop("SWEEPER_MODEL_PATH", None)
    # sweeper importable from the temp folder, installed or not
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    if smoke:
        env.update(SWEEPER_FAKE_GPUS="1", SWEEPER_FAKE_GPU_MEMORY_MB="4000",
                   SWEEPER_FAKE_TRIAL_MEMORY_MB="1200")
    # each sweep: the same budget, and time left for start-up and the trials still running at the timeout
    timeout_s = None if smoke else max(20.0, (deadline - time.monotonic()) / 2 - 25)
    out: dict[str, Any] = {"timeout_s": timeout_s and round(timeout_s)}
    for per_gpu in ("auto", 1):
        print(f"  sweep with devices.trials_per_gpu: {per_gpu}", flush=True)
        out[f"per_gpu_{per_gpu}"] = row = one_sweep(folder / f"per_gpu_{per_gpu}",
                                                    packing_study(per_gpu, smoke, timeout_s), env,
                                                    limit_s=240 if smoke else (timeout_s or 0) + 120,
                                                    uuid=uuid)
        print(f"    {json.dumps(row)}", flush=True)
    auto, one = out["per_gpu_auto"], out["per_gpu_1"]
    if auto.get("trials_per_hour") and one.get("trials_per_hour"):
        out["trials_per_hour_ratio"] = round(auto["trials_per_hour"] / one["trials_per_hour"], 2)
    errors = [r["error"] for r in (auto, one) if "error" in r]
    if errors:
        out["error"] = errors[0]
    return out


# ---------------------------------------------------------------- 5, 6. stacks: K seeds, P trials

STUDIES = Path(__file__).resolve().parents[1] / "studies"
STACK_MODELS = ("mlp", "transformer", "lstm")  # studies/<name>_ic.yaml
STACK_UTIL_EVERY_S = 0.1  # a timed epoch lasts seconds, not a sweep's minutes: NVML is read finer
# a population's members: trials of one shape, each its own (PER_MEMBER, model.dropout) settings,
# drawn once (member i is the same trial in every P)
POPULATION_SPACE = {"train.lr": [5e-4, 5e-3, "log"], "train.weight_decay": [0.0, 0.1],
                    "model.dropout": [0.0, 0.3], "train.seed": "member index"}


def _draw_trials(n: int, seed: int = 40) -> list[dict]:
    rng = random.Random(seed)
    return [{"lr": math.exp(rng.uniform(math.log(5e-4), math.log(5e-3))),
             "weight_decay": rng.uniform(0.0, 0.1), "dropout": rng.uniform(0.0, 0.3), "seed": i}
            for i in range(n)]


TRIALS = _draw_trials(64)


def seeds(cfg, n: int) -> list:
    """A stacked trial's runs: ``n`` seeds of ``cfg`` (``train.seed + r``), as a trial's grid makes them."""
    from sweeper.validation.grid import seeded

    return [seeded(cfg, r) for r in range(n)]


def trials(cfg, n: int) -> list:
    """A population of ``n`` trials of ``cfg``'s shape, each its drawn lr, weight decay, dropout, seed."""
    return [cfg.model_copy(update={
        "train": cfg.train.model_copy(update={k: t[k] for k in ("lr", "weight_decay", "seed")}),
        "model": cfg.model.model_copy(update={"dropout": t["dropout"]})}) for t in TRIALS[:n]]


def study_shape(name: str, smoke: bool) -> tuple[dict, dict]:
    """studies/<name>_ic.yaml's model and batch (a smoke: 4 steps an epoch)."""
    study = yaml.safe_load((STUDIES / f"{name}_ic.yaml").read_text())
    batch = {k: study["train"][k] for k in ("batch_size", "samples_per_epoch")}
    if smoke:
        batch["samples_per_epoch"] = 4 * batch["batch_size"]
    return study["model"], batch


class TimedEpoch(NullHook):
    """Holds ``gate`` open over epoch ``epoch``'s steps: from its first step to its validation's
    first batch (the loop ticks only while it validates and scores)."""

    def __init__(self, gate: threading.Event, epoch: int = 2) -> None:
        self.gate, self.epoch, self.current = gate, epoch, 1

    def should_stop(self) -> bool:
        if self.current == self.epoch:
            self.gate.set()
        return False

    def tick(self) -> None:
        self.gate.clear()

    def on_epoch(self, epoch: int, rows: list[dict | None]) -> bool:
        self.current = epoch + 1
        return False


def one_stack(cfgs: list, panel, device: torch.device, uuid: str | None) -> dict:
    """One stack of ``cfgs`` trained two epochs by ``train_stack``, a sweep's path: every member's
    rows per second in the second epoch, the peak allocated, and NVML's busy share over that epoch.
    Out of memory (after the loop's own halving) is a result, not a failure."""
    cuda, gate, began = device.type == "cuda", threading.Event(), time.monotonic()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    try:
        with UtilSampler(uuid, STACK_UTIL_EVERY_S, gate) as util:
            results = train_stack([Member(cfg, panel) for cfg in cfgs], device=device, hook=TimedEpoch(gate))
    except Exception as exc:
        if not (isinstance(exc, OutOfMemory) or is_oom(exc)):
            raise
        oom = f"{type(exc).__name__}: {exc}"[:300]
    else:
        oom = None
    seconds = round(time.monotonic() - began, 1)
    if oom:
        release_memory()
        return {"oom": True, "why": oom, "seconds": seconds}
    last = results[0].history[-1]
    # the loop resets the peak each epoch: the epochs' peaks, and (CUDA) the last one's with the scoring
    peak = max(r.metrics["peak_mem_mb"] for r in results)
    if cuda:
        peak = max(peak, torch.cuda.max_memory_allocated(device) / 2**20)
    row = {"rate": sum(r.history[-1]["samples_per_s"] for r in results), "peak_mem_mb": round(peak, 1),
           "probe_peak_mem_mb": _round(results[0].metrics.get("probe_peak_mem_mb")),
           "micro_batch": last["micro_batch_size"], "precision": results[0].metrics["precision"],
           "gpu_util": util.summary(), "seconds": seconds}
    del results
    release_memory()
    return row


def _round(value: Any, digits: int = 1) -> Any:
    return round(value, digits) if isinstance(value, float) and math.isfinite(value) else None


def _estimate(times: dict[int, float], n: int) -> float:
    """A stack of ``n``'s wall time from this model's smaller stacks: a line through the last two
    (a fixed part and a part per member), never under the last; 0 before any."""
    if not times:
        return 0.0
    (n0, t0), (n1, t1) = sorted(times.items())[-2:] if len(times) > 1 else [max(times.items())] * 2
    return t1 + (max(0.0, (t1 - t0) / (n1 - n0)) * (n - n1) if n1 > n0 else 0.0)


def stack_runs(panel, synthetic: dict, device: torch.device, sizes: tuple[int, ...], uuid: str | None,
               deadline: float, smoke: bool, members: Callable[[Any, int], list],
               keys: tuple[str, str, str]) -> dict:
    """Each study model (studies/*_ic.yaml) as stacks of each size in ``sizes`` (``members(cfg, n)``:
    their configs); ``keys``: the row's names for the size, the rate and its ratio to the smallest
    stack's (> 1: one stack of n beats n separate runs). Sizes go smallest first across the models,
    so a short budget drops the largest first; a stack whose estimated time does not fit before
    ``deadline`` is skipped, and said so."""
    size_key, rate_key, speed_key = keys
    rows: dict[tuple[str, int], dict] = {}
    times: dict[str, dict[int, float]] = {name: {} for name in STACK_MODELS}
    dropped, errors = [], []
    for n in sizes:
        for name in STACK_MODELS:
            model, batch = study_shape(name, smoke)
            need, left = _estimate(times[name], n), deadline - time.monotonic()
            head = {"model": name, size_key: n}
            if any(rows[name, m].get("oom") for m in times[name]):
                rows[name, n] = {**head, "skipped": "a smaller stack ran out of memory"}
                continue
            if need > left:
                why = f"time budget (~{need:.0f}s needed, {max(0.0, left):.0f}s left)"
                rows[name, n] = {**head, "skipped": why}
                dropped.append(f"{name} {size_key}={n}")
                print(f"  {name:12s} {size_key.upper()}={n:<3d} skipped: {why}", flush=True)
                continue
            cfg = config(model, synthetic, precision="auto", **batch)
            try:
                out = one_stack(members(cfg, n), panel, device, uuid)
            except Exception as exc:  # noqa: BLE001 - one stack's failure, reported; the others run
                traceback.print_exc()
                errors.append(f"{name} {size_key}={n}: {type(exc).__name__}: {exc}")
                rows[name, n] = {**head, "error": errors[-1]}
                continue
            times[name][n] = out["seconds"]
            rate = out.pop("rate", None)
            rows[name, n] = row = {**head, **({rate_key: round(rate)} if rate is not None else {}), **out}
            print(f"  {name:12s} {size_key.upper()}={n:<3d} " + (
                f"OOM ({out['why']})" if out.get("oom") else
                f"{row[rate_key]:>10,} member-samples/s {row['peak_mem_mb']:>9.1f} MiB peak, "
                f"micro-batch {row['micro_batch']}, busy {row['gpu_util'].get('mean')} % "
                f"({row['gpu_util']['samples']} reads), {row['seconds']}s"), flush=True)
    for name in STACK_MODELS:
        base = rows.get((name, sizes[0]), {}).get(rate_key)
        for n in sizes:
            if base and rows[name, n].get(rate_key):
                rows[name, n][speed_key] = round(rows[name, n][rate_key] / base, 2)
    out: dict[str, Any] = {"runs": [rows[name, n] for name in STACK_MODELS for n in sizes]}
    if dropped:
        out["dropped"] = dropped
        out["note"] = "time ran short: the largest stacks were dropped first (see dropped)"
    if errors:
        out["error"] = errors[0]
    return out


# ---------------------------------------------------------------- the run


def section(summary: dict, name: str, fn: Callable[[], Any]) -> None:
    print(f"== {name}", flush=True)
    start = time.monotonic()
    try:
        summary[name] = fn()
    except Exception as exc:  # noqa: BLE001 - report every section, even after one fails
        traceback.print_exc()
        summary[name] = {"error": f"{type(exc).__name__}: {exc}"}
    summary.setdefault("seconds", {})[name] = round(time.monotonic() - start, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop starting new work after this")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="every section's code path, small, on the CPU")
    args = parser.parse_args(argv)
    start = time.monotonic()
    budget = args.budget_s
    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to check (run it on a GPU machine)")
        print(json.dumps({"cuda": False}))
        return 0
    device = torch.device("cpu") if smoke else torch.device("cuda", 0)
    if smoke:
        torch.set_num_threads(1)
        synthetic, models, precisions, batch = ({"assets": 40, "dates": 120, "features": 4, "seed": 0},
                                                {"mlp": MODELS["mlp"], "lstm": MODELS["lstm"]},
                                                ("fp32", "bf16"), 256)
    else:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 in this table
        synthetic, models, precisions, batch = ({"assets": 500, "dates": 600, "features": 16, "seed": 0},
                                                MODELS, ("fp32", "bf16", "fp16"), 1024)
    panel = load_panel(config(MODELS["mlp"], synthetic).data)
    summary: dict[str, Any] = {"cuda": not smoke, "cpu_smoke": smoke, "torch": torch.__version__,
                               "panel": {**synthetic,
                                         "train_samples": Batcher(panel, "train", "cpu").n_samples}}
    if not smoke:
        summary.update(device=torch.cuda.get_device_name(),
                       total_gib=round(torch.cuda.mem_get_info()[1] / GiB, 1),
                       bf16_supported=torch.cuda.is_bf16_supported(), bf16_native=native_bf16(device))
    # NVML's name for this GPU (torch may or may not print the GPU- prefix)
    uuid = None if smoke else "GPU-" + str(
        getattr(torch.cuda.get_device_properties(device), "uuid", "")).removeprefix("GPU-")
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        folder = Path(tmp)
        # each section starts no work past its mark (of --budget-s from the start); the sweeps take
        # what is left to the budget, and the 60 s past it (of 5 minutes) absorb the overruns
        section(summary, "throughput", lambda: throughput(panel, synthetic, device, precisions, models, batch,
                                                          start + 0.2 * budget))
        section(summary, "probe", lambda: probe_vs_scan(panel, synthetic, device, 4.0, start + 0.32 * budget))
        section(summary, "oom", lambda: oom_recovery(panel, synthetic, device, folder))
        ks, ps = ((1, 4), (1, 4)) if smoke else ((1, 4, 8, 16), (1, 4, 16, 64))
        section(summary, "stacked", lambda: stack_runs(
            panel, synthetic, device, ks, uuid, start + 0.45 * budget, smoke, seeds,
            ("k", "samples_per_s", "vs_k_separate")))
        section(summary, "population", lambda: {
            "members": POPULATION_SPACE,
            **stack_runs(panel, synthetic, device, ps, uuid, start + 0.62 * budget, smoke, trials,
                         ("p", "member_samples_per_s", "vs_p1"))})
        release_memory()  # the sweeps' workers need the GPU more than this process's cache does
        section(summary, "packing", lambda: packed_vs_one(smoke, start + budget, folder, uuid))
    summary["total_s"] = round(time.monotonic() - start, 1)
    sections = ("throughput", "probe", "oom", "stacked", "population", "packing")
    summary["ok"] = all("error" not in summary[k] for k in sections)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
