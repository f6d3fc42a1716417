"""GPU check of the training core (run it by hand on a CUDA machine; about 3 minutes on an H200).

1. throughput: each model trains a few hundred steps in fp32, bf16 and fp16 -> samples/s, peak memory
2. probe: the micro-batch probe against an exhaustive scan of micro-batch throughput, under a
   memory ceiling made by a blocker tensor (so the sizes are realistic)
3. oom: an OOM forced mid-training with torch.cuda.set_per_process_memory_fraction; the loop must
   halve the micro-batch, accumulate, and finish

The last line of output is one JSON summary. Without CUDA it says so, prints {"cuda": false} and
exits 0. ``--cpu-smoke`` runs a tiny version of section 1 on the CPU (to test the script itself).

    python benchmarks/gpu_check.py [--budget-s 270]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from typing import Any, Callable

import torch

from sweeper.core.batch_size import CudaMemory, find_micro_batch, is_oom, release_memory
from sweeper.config import validate_config
from sweeper.data import Batcher, load_panel
from sweeper.models import build_model
from sweeper.core import train
from sweeper.core.precision import resolve_precision
from sweeper.core.probe import preserved, probe_step
from sweeper.core.schedule import make_optimizer

MODELS = {
    "transformer": {"name": "transformer", "d_model": 64, "nhead": 4, "num_layers": 2, "dim_feedforward": 128},
    "lstm": {"name": "lstm", "hidden_size": 64, "num_layers": 2},
    "gru": {"name": "gru", "hidden_size": 64, "num_layers": 2},
    "mlp": {"name": "mlp", "hidden_size": 256, "num_layers": 2},
}
PRECISIONS = ("fp32", "bf16", "fp16")
GiB = 2**30


def config(model: dict, synthetic: dict, **train: Any):
    base = {"epochs": 2, "batch_size": 1024, "lr": 1e-3, "patience": 100, "eval_batch_size": 16384}
    return validate_config({"data": {"synthetic": synthetic, "lookback": 20}, "model": model,
                            "train": base | train}, "gpu_check")


def throughput(panel, synthetic: dict, device: str, precisions, models, batch: int, deadline: float) -> list[dict]:
    """Two epochs (a few hundred steps) per model and precision; the second epoch is the steady one."""
    rows = []
    for name, model in models.items():
        for precision in precisions:
            if time.monotonic() > deadline:
                rows.append({"model": name, "precision": precision, "skipped": "time budget"})
                continue
            cfg = config(model, synthetic, precision=precision, batch_size=batch)
            result = train(cfg, panel, device=device)
            last = result.history[-1]
            row = {"model": name, "precision": result.metrics["precision"],
                   "samples_per_s": round(last["samples_per_s"]), "peak_mem_mb": round(last["peak_mem_mb"], 1),
                   "steps": 2 * math.ceil(Batcher(panel, "train", "cpu").n_samples / batch),
                   "val_ic": round(result.metrics["val_ic"], 4), "duration_s": round(result.metrics["duration_s"], 1)}
            print(f"  {name:12s} {row['precision']:5s} {row['samples_per_s']:>10,} samples/s "
                  f"{row['peak_mem_mb']:>9.1f} MiB peak  val_ic {row['val_ic']:.4f}  {row['duration_s']}s", flush=True)
            rows.append(row)
    return rows


def timed_steps(step: Callable[[int], None], size: int, steps: int) -> float:
    """Samples/s of ``steps`` steps at ``size`` after one warm-up step."""
    step(size)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step(size)
    torch.cuda.synchronize()
    return steps * size / (time.perf_counter() - start)


def probe_vs_scan(panel, synthetic: dict, leave_gib: float, deadline: float) -> dict:
    """The probe's choice under a ceiling of ``leave_gib`` free GiB, against a scan of every
    power-of-two micro-batch (and the choice itself): does it fit, and how fast is it?"""
    device = torch.device("cuda")
    cfg = config({"name": "transformer", "d_model": 256, "nhead": 8, "num_layers": 4, "dim_feedforward": 1024},
                 synthetic, precision="bf16")
    torch.manual_seed(0)
    model = build_model(cfg.model, len(panel.features), panel.lookback).to(device)
    optimizer = make_optimizer(model, 1e-4, 0.01)
    batcher = Batcher(panel.to(device, 0.5), "train", device)
    step = probe_step(model, optimizer, resolve_precision("bf16", device), batcher, "mse", 0)
    free = torch.cuda.mem_get_info()[0]
    blocker = torch.empty(max(0, free - int(leave_gib * GiB)), dtype=torch.uint8, device=device)
    try:
        t0 = time.perf_counter()
        with preserved(model, optimizer):
            probe = find_micro_batch(step, CudaMemory(device), start=512, cap=batcher.n_samples, margin=0.1, steps=3)
        probe_s = time.perf_counter() - t0
        print(f"  probe: micro-batch {probe.micro_batch} after {len(probe.tried)} sizes in {probe_s:.1f}s "
              f"(budget {probe.budget_bytes / GiB:.2f} GiB of {probe.free_bytes / GiB:.2f} GiB free)", flush=True)
        scan = scan_sizes(step, model, optimizer, probe.micro_batch, batcher.n_samples, deadline)
    finally:
        del blocker
        release_memory()
    ran = [s for s in scan if s.get("samples_per_s")]
    best = max(ran, key=lambda s: s["samples_per_s"]) if ran else None
    chosen = next((s for s in scan if s["size"] == probe.micro_batch), None)
    largest_fit = max((s["size"] for s in ran), default=None)
    return {"leave_gib": leave_gib, "micro_batch": probe.micro_batch, "tried": probe.tried, "probe_s": round(probe_s, 1),
            "budget_gib": round(probe.budget_bytes / GiB, 3), "scan": scan, "largest_fit_in_scan": largest_fit,
            "best_size": best and best["size"],
            "chosen_vs_best_throughput": (round(chosen["samples_per_s"] / best["samples_per_s"], 3)
                                          if chosen and best and chosen.get("samples_per_s") else None)}


def scan_sizes(step, model, optimizer, chosen: int, cap: int, deadline: float) -> list[dict]:
    sizes = sorted({min(cap, 2**k) for k in range(6, 30) if 2**k <= 2 * chosen} | {chosen})
    rows = []
    for size in sizes:
        if time.monotonic() > deadline:
            rows.append({"size": size, "skipped": "time budget"})
            continue
        oom = False
        with preserved(model, optimizer):
            torch.cuda.reset_peak_memory_stats()
            try:
                rate = timed_steps(step, size, 5)
            except Exception as exc:
                if not is_oom(exc):
                    raise
                oom = True
        if oom:
            release_memory()
            rows.append({"size": size, "oom": True})
            print(f"  scan {size:>7}: OOM", flush=True)
            continue
        peak = torch.cuda.max_memory_allocated() / GiB
        rows.append({"size": size, "samples_per_s": round(rate), "peak_gib": round(peak, 3)})
        print(f"  scan {size:>7}: {rate:>12,.0f} samples/s  peak {peak:.2f} GiB", flush=True)
    return rows


class Squeeze:
    """Hook that, a few steps in, caps this process at ``share`` of the memory the step peaked at:
    the next step at the probed micro-batch then runs out of memory."""

    def __init__(self, at_poll: int, share: float) -> None:
        self.at_poll, self.share, self.polls, self.cap_gib = at_poll, share, 0, None

    def on_epoch(self, epoch: int, metrics: dict) -> bool:
        return False

    def should_stop(self) -> bool:
        self.polls += 1
        if self.polls == self.at_poll:
            total = torch.cuda.mem_get_info()[1]
            cap = self.share * torch.cuda.max_memory_allocated()
            torch.cuda.set_per_process_memory_fraction(cap / total)
            torch.cuda.empty_cache()  # cached blocks would otherwise serve the next step
            self.cap_gib = cap / GiB
        return False


def oom_recovery(panel, synthetic: dict) -> dict:
    batch = 16384
    cfg = config({"name": "transformer", "d_model": 128, "nhead": 4, "num_layers": 2, "dim_feedforward": 512},
                 synthetic, precision="bf16", batch_size=batch, epochs=1, samples_per_epoch=batch * 12)
    hook = Squeeze(at_poll=4, share=0.7)
    try:
        result = train(cfg, panel, device="cuda", hook=hook, log=lambda line: print("   ", line, flush=True))
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        release_memory()
    m = result.metrics
    out = {"batch_size": m["batch_size"], "micro_batch_size": m["micro_batch_size"], "accum_steps": m["accum_steps"],
           "cap_gib": hook.cap_gib and round(hook.cap_gib, 3), "val_ic": round(m["val_ic"], 4),
           "recovered": m["micro_batch_size"] < batch and math.isfinite(m["val_ic"])}
    print(f"  OOM recovery: micro-batch {batch} -> {m['micro_batch_size']} (accum {m['accum_steps']}), "
          f"val_ic {m['val_ic']:.4f}", flush=True)
    return out


def section(summary: dict, name: str, fn: Callable[[], Any]) -> None:
    print(f"== {name}", flush=True)
    start = time.monotonic()
    try:
        summary[name] = fn()
    except Exception as exc:  # report every section, even after one fails
        traceback.print_exc()
        summary[name] = {"error": f"{type(exc).__name__}: {exc}"}
    summary.setdefault("seconds", {})[name] = round(time.monotonic() - start, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=270.0, help="stop starting new runs after this")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny CPU run of the throughput section")
    args = parser.parse_args(argv)
    start = time.monotonic()
    deadline = start + args.budget_s
    if args.cpu_smoke:
        synthetic = {"assets": 40, "dates": 120, "features": 4, "seed": 0}
        panel = load_panel(config(MODELS["mlp"], synthetic).data)
        rows = throughput(panel, synthetic, "cpu", ("fp32", "bf16"), {"mlp": MODELS["mlp"], "lstm": MODELS["lstm"]},
                          256, deadline)
        print(json.dumps({"cuda": False, "cpu_smoke": rows}))
        return 0
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to check (run it on a GPU machine)")
        print(json.dumps({"cuda": False}))
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 in this table
    synthetic = {"assets": 500, "dates": 600, "features": 16, "seed": 0}
    panel = load_panel(config(MODELS["mlp"], synthetic).data)
    summary: dict[str, Any] = {"cuda": True, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "bf16_supported": torch.cuda.is_bf16_supported(),
                               "total_gib": round(torch.cuda.mem_get_info()[1] / GiB, 1),
                               "panel": {**synthetic, "train_samples": Batcher(panel, "train", "cpu").n_samples}}
    section(summary, "throughput", lambda: throughput(panel, synthetic, "cuda", PRECISIONS, MODELS, 1024,
                                                      start + 0.5 * args.budget_s))
    section(summary, "probe", lambda: probe_vs_scan(panel, synthetic, leave_gib=4.0, deadline=start + 0.8 * args.budget_s))
    section(summary, "oom", lambda: oom_recovery(panel, synthetic))
    summary["total_s"] = round(time.monotonic() - start, 1)
    summary["ok"] = all("error" not in (summary[k] if isinstance(summary[k], dict) else {})
                        for k in ("throughput", "probe", "oom"))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
