"""Solver ladder at a large batch: Table 3 of You et al. 2020 on MNIST-1D, LSTM.

The table is from You et al., "The Limit of the Batch Size", 2020,
https://arxiv.org/abs/2006.08517.

Four base solvers (momentum SGD, AdaGrad, RMSprop, Adam), each

  plain        the solver as optax ships it;
  + layer-wise the solver's update u rescaled per layer by ||w|| / ||u||
               (date_optax.scale_by_trust_ratio(source="update"), no bounds);
  + bounds     the same ratio clipped to [0.01, 10]
               (date_optax.bounded_lars(ratio_source="update")); with Adam
               this is LAMB with bounds, the paper's "layer-wise + bound-ratio".

All at one large batch for the same number of epochs, on the schedule
"linear warmup over the first 10% of the iterations, then linear decay to 0".
Only the peak learning rate differs between cells: each cell takes the best
of a grid of 6 to 8 values ~3.16x apart, one seed; the table marks a best
value at the edge of its grid.

Usage:
  python benchmarks/solver_ladder.py           # ~10-20 min on 2 shared cores
  python benchmarks/solver_ladder.py --quick   # a smoke run of ~3 min

Writes docs/solver_ladder[_quick].{md,png,jsonl}; finished runs are kept in
the .jsonl and reused when the script is run again.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

_DEVICES = "--xla_force_host_platform_device_count=1"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _DEVICES).strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import date_optax  # noqa: E402

# The sibling module shared by the studies (this folder is not a package) and
# the tasks package: MNIST-1D data, model and in-memory trainer.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _paths  # noqa: E402
import _runlog  # noqa: E402

from benchmarks.tasks import data as input_pipeline  # noqa: E402
from benchmarks.tasks import trainer as lstm_train  # noqa: E402

SOLVERS = ("momentum", "adagrad", "rmsprop", "adam")
SOLVER_LABELS = {
    "momentum": "SGD (momentum 0.9)",
    "adagrad": "AdaGrad",
    "rmsprop": "RMSprop",
    "adam": "Adam",
}
VARIANTS = ("plain", "layerwise", "bounded")
VARIANT_LABELS = {
    "plain": "plain",
    "layerwise": "+ layer-wise ratio",
    "bounded": "+ layer-wise ratio, bounds [0.01, 10]",
}
_RATIO_GRID = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
GRIDS = {
    ("momentum", "plain"): (0.1, 0.3, 1.0, 3.0, 10.0, 30.0),
    ("adagrad", "plain"): (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0),
    ("adagrad", "bounded"): (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0),
    ("rmsprop", "plain"): (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1),
    ("adam", "plain"): (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1),
    # Under the upper bound 10, momentum's ratio ||w||/||u|| (often > 10)
    # multiplies its step by 10: a 10x smaller grid than the plain one.
    ("momentum", "bounded"): (0.01, 0.03, 0.1, 0.3, 1.0, 3.0),
}

FULL = dict(num_train=8192, num_test=4096, epochs=30, batch=1024)
QUICK = dict(num_train=2048, num_test=1024, epochs=8, batch=256)


def direction(solver: str) -> optax.GradientTransformation:
  """The solver's update without its learning rate (optax's defaults)."""
  if solver == "momentum":
    return optax.trace(decay=0.9)
  if solver == "adagrad":
    return optax.scale_by_rss(initial_accumulator_value=0.1)
  if solver == "rmsprop":
    return optax.scale_by_rms(decay=0.9, eps=1e-8)
  if solver == "adam":
    return optax.scale_by_adam()
  raise ValueError(solver)


def optimizer(solver: str, variant: str, schedule) -> optax.GradientTransformation:
  if variant == "plain":
    return optax.chain(direction(solver), optax.scale_by_learning_rate(schedule))
  if variant == "layerwise":
    return optax.chain(
        date_optax.scale_by_trust_ratio(inner=direction(solver), source="update"),
        optax.scale_by_learning_rate(schedule),
    )
  return date_optax.bounded_lars(
      schedule, base=direction(solver), lower=0.01, upper=10.0,
      ratio_source="update",
  )


def warmup_linear_decay(peak: float, total: int):
  warmup = max(1, total // 10)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, warmup),
       optax.linear_schedule(peak, 0.0, total - warmup)],
      [warmup],
  )


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true")
  p.add_argument("--out", default=None)
  args = p.parse_args(argv)
  cfg = QUICK if args.quick else FULL
  out = _paths.study_out("solver_ladder", args.quick, args.out)
  log_path = out + ".jsonl"
  done = _runlog.load_runs(log_path)
  data = input_pipeline.load_mnist1d(cfg["num_train"], cfg["num_test"], seed=0,
                                     cache_dir=_paths.MNIST1D_CACHE)
  total = cfg["epochs"] * (cfg["num_train"] // cfg["batch"])
  jobs = [(s, v, lr) for s in SOLVERS for v in VARIANTS
          for lr in GRIDS.get((s, v), _RATIO_GRID)]
  best: dict[tuple[str, str], dict] = {}
  bar = tqdm(jobs, desc="solver x variant x lr", unit="run")
  for solver, variant, lr in bar:
    bar.set_postfix_str(f"{solver} {variant} lr={lr:g}")
    ident = json.dumps(dict(solver=solver, variant=variant, lr=lr, **cfg),
                       sort_keys=True)
    if ident not in done:
      sched = warmup_linear_decay(lr, total)
      r = lstm_train.train(data, optimizer=optimizer(solver, variant, sched),
                          batch_size=cfg["batch"], epochs=cfg["epochs"],
                          learning_rate=sched, seed=0)
      _runlog.log_run(log_path, done, ident, dict(
          solver=solver, variant=variant, lr=lr, accuracy=r.final_accuracy,
          diverged=r.diverged, curve=r.test_accuracy, steps=r.steps, wall=r.wall_time))
    rec = done[ident]
    acc = -1.0 if rec["diverged"] else rec["accuracy"]
    cur = best.get((solver, variant))
    if cur is None or acc > cur["score"]:
      best[(solver, variant)] = dict(rec, score=acc)
  compute = sum(done[json.dumps(dict(solver=s, variant=v, lr=lr, **cfg), sort_keys=True)]
                ["wall"] for s, v, lr in jobs)
  md = _markdown(cfg, best, total, compute, args, len(jobs))
  with open(out + ".md", "w") as f:
    f.write(md)
  _plot(best, out + ".png", cfg)
  print(md)
  print(f"wrote {out}.md, {out}.png, {log_path}")
  return 0


def _markdown(cfg, best, total, compute, args, num_runs) -> str:
  cmd = "python benchmarks/solver_ladder.py" + "".join(f" {a}" for a in sys.argv[1:])
  lines = [
      f"### Solver ladder at batch {cfg['batch']} (You et al. 2020, Table 3 analogue)",
      "",
      f"`{cmd}` on {platform.machine()} ({os.cpu_count()} CPU cores, shared), "
      f"jax {jax.__version__}; {num_runs} runs, {compute / 60:.1f} min of "
      "training in all.",
      "",
      f"LSTM (64 units) on MNIST-1D, {cfg['num_train']} train / "
      f"{cfg['num_test']} test, batch {cfg['batch']}, {cfg['epochs']} epochs = "
      f"{total} iterations, 10% linear warmup then linear decay; best test "
      "accuracy (%) over a peak-LR grid of 6-8 values per cell, seed 0 (the best LR "
      "in brackets; * = at the edge of its grid).",
      "",
      "| solver | " + " | ".join(VARIANT_LABELS[v] for v in VARIANTS) + " |",
      "|---|" + "---:|" * len(VARIANTS),
  ]
  for s in SOLVERS:
    row = [SOLVER_LABELS[s]]
    for v in VARIANTS:
      b = best[(s, v)]
      grid = GRIDS.get((s, v), _RATIO_GRID)
      edge = "*" if b["lr"] in (grid[0], grid[-1]) else ""
      acc = "diverged" if b["diverged"] else f"{b['accuracy']:.2f}"
      row.append(f"{acc} ({b['lr']:g}{edge})")
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


def _plot(best, path, cfg):
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  fig, ax = plt.subplots(figsize=(8, 4))
  width = 0.26
  x = np.arange(len(SOLVERS))
  for j, v in enumerate(VARIANTS):
    vals = [0.0 if best[(s, v)]["diverged"] else best[(s, v)]["accuracy"]
            for s in SOLVERS]
    ax.bar(x + (j - 1) * width, vals, width, label=VARIANT_LABELS[v])
  ax.set_xticks(x, [SOLVER_LABELS[s] for s in SOLVERS])
  lo = min(0.0 if b["diverged"] else b["accuracy"] for b in best.values())
  ax.set_ylim(max(0, lo - 5), 100)
  ax.set_ylabel("test accuracy (%)")
  ax.set_title(f"LSTM on MNIST-1D, batch {cfg['batch']}, {cfg['epochs']} epochs")
  ax.legend(fontsize=8, loc="lower right")
  ax.grid(axis="y", alpha=0.3)
  _paths.save_figure(fig, path, dpi=110)


if __name__ == "__main__":
  raise SystemExit(main())
