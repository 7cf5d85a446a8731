"""Batch scaling without retuning: B0, 4·B0, 16·B0, 64·B0 on MNIST-1D (LSTM).

A baseline is tuned once at B0 (a learning-rate grid, one seed); every
method then scales it to the larger batches with no further tuning, and all
runs train for the same number of epochs (so 64·B0 takes 64x fewer
iterations):

  (a) linear   momentum SGD, LR x k, 5-epoch gradual warmup (Goyal et al.)
  (b) adam     Adam at a constant LR tuned by its own grid at B0, x sqrt(k)
  (c) legw     momentum SGD, LR x sqrt(k), warmup epochs x k, poly-2 decay
  (d) date     date_optax.date of the momentum baseline (sqrt LR, LEGW
               warmup, roller-coaster decay, bounded layer-wise ratios)
  (d') date_adam  date_optax.date of an Adam baseline (its own grid at B0)

and, for seed 0, DATE at 64·B0 from every momentum learning rate of the B0
grid: how much the choice among near-equal baselines matters at 64x.

The model, data, scaling methods and training loop are `benchmarks/tasks`'
(shared with `make demo`; the model of `examples/mnist1d_lstm`): one 64-unit
LSTM layer reading the 40-sample signal in 10 steps of 4, MNIST-1D generated
locally.

Usage:
  python benchmarks/batch_scaling.py --quick          # < 3 min, 1 seed, small data
  python benchmarks/batch_scaling.py                  # full: grids + 3 seeds
  python benchmarks/batch_scaling.py --seeds 2        # a reduced full mode
  python benchmarks/batch_scaling.py --oracle         # gaps to a retuned oracle
  python benchmarks/batch_scaling.py --oracle --quick # its pipeline check

``--oracle`` runs the study of `benchmarks/oracle.py` (four tasks, a
retuning grid at every target batch, DATE and the other rules as gaps to the
grid's best) and writes docs/oracle[_quick].{md,png,jsonl}; ``--tasks`` and
``--scales`` restrict it.

Writes docs/batch_scaling[_quick].{md,png} and keeps every finished run in
docs/batch_scaling[_quick].jsonl, so an interrupted run resumes where it
stopped (delete the .jsonl to start over).
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
from tqdm.auto import tqdm  # noqa: E402

import date_optax  # noqa: E402

# The sibling module shared by the studies (this folder is not a package) and
# the tasks package: MNIST-1D data, model, methods and in-memory trainer.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _paths  # noqa: E402
import _runlog  # noqa: E402

from benchmarks.tasks import data as input_pipeline  # noqa: E402
from benchmarks.tasks import methods  # noqa: E402
from benchmarks.tasks import trainer as lstm_train  # noqa: E402

METHODS = ("linear", "adam", "legw", "date", "date_adam")
LABELS = {
    "linear": "(a) linear LR + 5-epoch warmup, momentum",
    "adam": "(b) Adam, LR tuned at B0, sqrt-scaled",
    "legw": "(c) LEGW, momentum",
    "date": "(d) DATE (date_optax.date), momentum",
    "date_adam": "(d') DATE (date_optax.date), Adam",
}
MOMENTUM_GRID = (0.05, 0.1, 0.2, 0.4)
ADAM_GRID = (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)

FULL = dict(num_train=32768, num_test=8192, epochs=30, base_batch=16, seeds=3)
# Quick mode has no grid: it reuses the full mode's tuned learning rates.
QUICK = dict(num_train=4096, num_test=2048, epochs=10, base_batch=16, seeds=1,
             momentum_lr=0.05, adam_lr=4e-3, adam_rc_lr=8e-3)
SCALES = (1, 4, 16, 64)
WARMUP_EPOCHS = 0.1


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true", help="< 3 minutes, 1 seed, no grid")
  p.add_argument("--oracle", action="store_true",
                 help="gaps to a retuned oracle on four tasks (benchmarks/oracle.py)")
  p.add_argument("--tasks", default=None, help="--oracle: comma-separated task names")
  p.add_argument("--scales", default=None, help="--oracle: comma-separated k values")
  p.add_argument("--report-only", action="store_true",
                 help="--oracle: write the table from the log, train nothing")
  p.add_argument("--seeds", type=int, default=None, help="seeds per cell")
  p.add_argument("--epochs", type=int, default=None)
  p.add_argument("--num-train", type=int, default=None)
  p.add_argument("--out", default=None, help="output prefix (default docs/batch_scaling)")
  p.add_argument("--momentum-lr", type=float, default=None, help="skip the momentum grid")
  p.add_argument("--adam-lr", type=float, default=None, help="skip the Adam grid")
  p.add_argument("--adam-rc-lr", type=float, default=None,
                 help="skip the grid of the Adam baseline that DATE (d') scales")
  return p.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.oracle:
    return _oracle_main(args)
  cfg = dict(QUICK if args.quick else FULL)
  for key in ("seeds", "epochs", "num_train", "momentum_lr", "adam_lr", "adam_rc_lr"):
    if getattr(args, key) is not None:
      cfg[key] = getattr(args, key)
  out = _paths.study_out("batch_scaling", args.quick, args.out)
  log_path = out + ".jsonl"
  done = _runlog.load_runs(log_path)

  data = input_pipeline.load_mnist1d(cfg["num_train"], cfg["num_test"], seed=0,
                                     cache_dir=_paths.MNIST1D_CACHE)
  b0 = cfg["base_batch"]
  used: dict[str, dict] = {}  # runs that enter the tables, by identity

  def run(key: dict, tx, schedule, batch: int, seed: int) -> dict:
    """Trains once, or returns the logged result of an identical run."""
    key = dict(key, batch=batch, seed=seed, epochs=cfg["epochs"],
               num_train=cfg["num_train"])
    ident = json.dumps(key, sort_keys=True)
    if ident in done:
      used[ident] = done[ident]
      return done[ident]
    r = lstm_train.train(data, optimizer=tx, batch_size=batch, epochs=cfg["epochs"],
                        learning_rate=schedule, seed=seed)
    rec = dict(key=key, accuracy=r.final_accuracy, curve=r.test_accuracy,
               loss=r.train_loss, steps=r.steps, wall=r.wall_time,
               diverged=r.diverged)
    used[ident] = rec
    _runlog.log_run(log_path, done, ident, rec)
    return rec

  def tuned(solver: str, lr: float) -> date_optax.Baseline:
    return methods.make_baseline(
        solver, batch_size=b0, learning_rate=lr, warmup_epochs=WARMUP_EPOCHS,
        epochs=cfg["epochs"], num_examples=cfg["num_train"])

  # 1. Tune at B0 (seed 0): the momentum and Adam baselines on their
  #    warmup/roller-coaster schedule, and Adam at a constant learning rate.
  grids = {}
  todo_grid = []
  if "momentum_lr" not in cfg:
    todo_grid += [("momentum", lr) for lr in MOMENTUM_GRID]
  if "adam_lr" not in cfg:
    todo_grid += [("adam", lr) for lr in ADAM_GRID]
  if "adam_rc_lr" not in cfg:
    todo_grid += [("adam_rc", lr) for lr in ADAM_GRID]
  for solver, lr in tqdm(todo_grid, desc="grid at B0", unit="run"):
    if solver == "adam":
      tx, sched = methods.scaled_run("adam", tuned("adam", lr), b0)
      key = dict(kind="grid", solver=solver, lr=lr)
    else:
      base = tuned("adam" if solver == "adam_rc" else "momentum", lr)
      tx, sched = methods.scaled_run("baseline", base, b0)
      key = dict(kind="grid", solver=solver, lr=lr)
    rec = run(key, tx, sched, b0, 0)
    grids.setdefault(solver, []).append((lr, rec["accuracy"]))
  for solver, key in (("momentum", "momentum_lr"), ("adam", "adam_lr"),
                      ("adam_rc", "adam_rc_lr")):
    if key not in cfg:
      cfg[key] = max(grids[solver], key=lambda t: t[1])[0]

  # 2. Every method at every scale and seed, with no retuning.
  cells = [(m, k, s) for s in range(cfg["seeds"]) for k in SCALES for m in METHODS]
  results = {}
  bar = tqdm(cells, desc="methods x batch x seed", unit="run")
  for method, k, seed in bar:
    bar.set_postfix_str(f"{method} B={b0 * k} seed {seed}")
    if method == "adam":
      base = tuned("adam", cfg["adam_lr"])
    elif method == "date_adam":
      base = tuned("adam", cfg["adam_rc_lr"])
    else:
      base = tuned("momentum", cfg["momentum_lr"])
    tx, sched = methods.scaled_run(
        "date" if method == "date_adam" else method, base, b0 * k)
    rec = run(dict(kind="cell", method=method, lr=base.learning_rate), tx, sched,
              b0 * k, seed)
    results.setdefault((method, k), []).append(rec)

  # 3. Seed 0: DATE at 64x from each momentum baseline of the B0 grid.
  sensitivity = []
  if "momentum" in grids:
    for lr, acc_b0 in tqdm(grids["momentum"], desc="DATE at 64x per B0 lr", unit="run"):
      tx, sched = methods.scaled_run("date", tuned("momentum", lr), 64 * b0)
      rec = run(dict(kind="cell", method="date", lr=lr), tx, sched, 64 * b0, 0)
      sensitivity.append((lr, acc_b0, rec["accuracy"]))
  # Training time of every run in the tables (runs reused from the log
  # count with the time they took when they ran).
  elapsed = sum(r["wall"] for r in used.values())

  md = _markdown(cfg, grids, results, elapsed, args, sensitivity, len(used))
  with open(out + ".md", "w") as f:
    f.write(md)
  _plot(cfg, results, out + ".png")
  print(md)
  print(f"wrote {out}.md, {out}.png, {log_path}")
  return 0


def _oracle_module():
  import oracle  # noqa: PLC0415

  return oracle


def _oracle_main(args) -> int:
  return _oracle_module().run_study(args, _paths.study_out("oracle", args.quick, args.out))


def _acc(recs) -> tuple[float, float]:
  accs = np.array([r["accuracy"] for r in recs])
  return float(accs.mean()), float(accs.std(ddof=1)) if len(accs) > 1 else 0.0


def _markdown(cfg, grids, results, elapsed, args, sensitivity=(), num_runs=0) -> str:
  b0 = cfg["base_batch"]
  mode = "quick" if args.quick else "full"
  cmd = "python benchmarks/batch_scaling.py" + "".join(
      f" {a}" for a in sys.argv[1:])
  lines = [
      f"### Batch scaling on MNIST-1D ({mode} mode)",
      "",
      f"`{cmd}` on {platform.machine()} ({os.cpu_count()} CPU cores, "
      f"shared), jax {jax.__version__}; {num_runs} runs, {elapsed / 60:.1f} "
      "min of training in all.",
      "",
      f"LSTM (64 units, 10 steps of 4 samples) on MNIST-1D, "
      f"{cfg['num_train']} train / {cfg['num_test']} test examples, "
      f"{cfg['epochs']} epochs for every batch size; B0 = {b0}; "
      f"{cfg['seeds']} seed(s) per cell (initialisation and data order), "
      "test accuracy (%) at the end, mean ± sample std over seeds.",
      "",
      f"Baselines tuned at B0 ({WARMUP_EPOCHS:g}-epoch warmup and "
      f"roller-coaster decay): momentum SGD (0.9) lr {cfg['momentum_lr']:g}, "
      f"Adam lr {cfg['adam_rc_lr']:g}; Adam at a constant lr "
      f"{cfg['adam_lr']:g}.",
  ]
  for solver, grid in grids.items():
    cells = ", ".join(f"{lr:g}: {acc:.2f}" for lr, acc in grid)
    name = {"momentum": "momentum", "adam": "Adam (constant lr)",
            "adam_rc": "Adam (warmup + roller coaster)"}[solver]
    lines += ["", f"Grid at B0 (seed 0), {name}: {cells}."]
  lines += ["", "| method | " + " | ".join(
      f"B={b0 * k} ({k}x)" for k in SCALES) + " | 64x − 1x |",
      "|---|" + "---:|" * (len(SCALES) + 1)]
  for m in METHODS:
    row = [LABELS[m]]
    for k in SCALES:
      recs = results.get((m, k), [])
      if not recs:
        row.append("—")
        continue
      mean, std = _acc(recs)
      div = sum(r["diverged"] for r in recs)
      cell = f"{mean:.2f} ± {std:.2f}" if len(recs) > 1 else f"{mean:.2f}"
      if div:
        cell += f" ({div} diverged)"
      row.append(cell)
    if (m, 1) in results and (m, 64) in results:
      row.append(f"{_acc(results[(m, 64)])[0] - _acc(results[(m, 1)])[0]:+.2f}")
    else:
      row.append("—")
    lines.append("| " + " | ".join(row) + " |")
  steps = [results[(METHODS[0], k)][0]["steps"] for k in SCALES
           if (METHODS[0], k) in results]
  lines.append("| iterations | " + " | ".join(str(s) for s in steps) + " | |")
  walls = [np.mean([r["wall"] for m in METHODS for r in results.get((m, k), [])])
           for k in SCALES]
  lines.append("| wall time per run (s) | " + " | ".join(
      f"{w:.0f}" for w in walls) + " | |")
  for m in ("date", "date_adam"):
    if (m, 1) in results and (m, 64) in results:
      gap = _acc(results[(m, 64)])[0] - _acc(results[(m, 1)])[0]
      verdict = "meets" if gap >= -1.0 else "misses"
      lines += ["", f"{LABELS[m]} at 64·B0 vs B0: {gap:+.2f} points — {verdict} "
                "the goal of staying within 1.0 point with no retuning."]
  if sensitivity:
    lines += ["", "DATE (momentum) at 64·B0 from each baseline of the B0 grid "
              "(seed 0):", "", "| baseline lr at B0 | B0 accuracy | "
              "DATE at 64·B0 | difference |", "|---:|---:|---:|---:|"]
    for lr, a0, a64 in sensitivity:
      lines.append(f"| {lr:g} | {a0:.2f} | {a64:.2f} | {a64 - a0:+.2f} |")
  return "\n".join(lines) + "\n"


def _plot(cfg, results, path):
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  b0 = cfg["base_batch"]
  fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
  for m in METHODS:
    ks = [k for k in SCALES if (m, k) in results]
    means = [_acc(results[(m, k)])[0] for k in ks]
    stds = [_acc(results[(m, k)])[1] for k in ks]
    ax.errorbar([b0 * k for k in ks], means, yerr=stds, marker="o", capsize=3,
                label=LABELS[m])
    if (m, 64) in results:
      curve = np.mean([r["curve"] for r in results[(m, 64)]], axis=0)
      ax2.plot(np.arange(1, len(curve) + 1), curve, label=LABELS[m])
  ax.set_xscale("log", base=2)
  ax.set(xlabel="batch size", ylabel="test accuracy (%)",
         title=f"same {cfg['epochs']} epochs at every batch size")
  lo = min((_acc(v)[0] for v in results.values()), default=0)
  ax.set_ylim(max(0, min(lo - 2, 90)), 100)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc="lower left")
  ax2.set(xlabel="epoch", ylabel="test accuracy (%)", ylim=(0, 100),
          title=f"B = {64 * b0} (64x B0), mean over seeds")
  ax2.grid(alpha=0.3)
  ax2.legend(fontsize=7, loc="lower right")
  _paths.save_figure(fig, path, dpi=110)


if __name__ == "__main__":
  raise SystemExit(main())
