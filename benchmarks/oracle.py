"""DATE with no retuning against a retuned oracle (`batch_scaling.py --oracle`).

For each task (model, data, solver and a baseline tuned at B0) and target
batch ``B = k·B0``, the *oracle* is the best run of a retuning grid at ``B``
with the baseline's own solver (no trust ratio), the baseline's roller-coaster
decay and the same epochs: peak learning rate ``{1/4, 1/2, 1, 2, 4} x`` the
DATE recipe's ``η0·sqrt(k)`` and warmup ``{0.05, 0.2}`` of the run's
iterations. Every scaling method is then reported as its gap to that oracle
(test accuracy points, negative = behind the oracle):

  date          ``date_optax.date(baseline, B)`` with its defaults
  date_fixed    the engine before issue 12: every leaf under the ratio,
                bounds [0.01, 1] (``bounds="fixed", trust_ratio_mask=None``)
  date_linear   ``date(baseline, B, bounds="baseline_to_linear")``: layer
                learning rates between ``η0`` and ``η0·k``
  linear        plain solver, peak ``η0·k``, 5-epoch warmup (Goyal et al.)
  legw          plain solver, peak ``η0·sqrt(k)``, warmup epochs x k, poly-2

and, at the headline batches (16·B0 and 64·B0) only, two variants of the
engine that keep its learning rate and bounds:

  date_update   ``ratio_source="update"``: the ratio ``‖w‖/‖base(g)‖`` of
                the solver's update (LAMB's choice) instead of the gradient's
  date_rc05     roller coaster with power 0.5 instead of 1 (the learning rate
                stays higher for longer after the warmup)

Tasks: the MNIST-1D LSTM of ``examples/mnist1d_lstm`` with a momentum
and an Adam baseline, the real-digit MNIST LSTM of ``examples/mnist_lstm``,
and a small 1-D CNN with ``date_optax.nn.GhostBatchNorm`` on MNIST-1D.

Run order (so that an interrupted run still leaves the headline cells):
seed 0 at 64·B0 and 16·B0 (grid and methods), then seeds 1 and 2 at those
cells for the methods and the two grid points that scored best on seed 0,
then 4·B0, then each baseline at B0. The oracle is the better of those two
points by its mean over the seeds (a retuner keeps the runner-up when the
winner diverges on another seed). Every finished run is appended to the
``.jsonl`` log and reused on the next call; independent processes may share
one log (``--tasks`` split between them).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import date_optax
from date_optax import schedules

# The sibling module shared by the studies (this folder is not a package) and
# the tasks package: MNIST-1D data, model and in-memory trainer.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _paths  # noqa: E402
import _runlog  # noqa: E402

from benchmarks.tasks import data as input_pipeline  # noqa: E402
from benchmarks.tasks import models  # noqa: E402
from benchmarks.tasks import trainer as lstm_train  # noqa: E402

LR_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
WARMUP_FRACTIONS = (0.05, 0.2)
METHODS = ("date", "date_fixed", "date_linear", "linear", "legw")
VARIANTS = ("date_update", "date_rc05")  # headline batches only
LABELS = {
    "date": "DATE, defaults (no retuning)",
    "date_fixed": "DATE, engine before issue 12 (all leaves, [0.01, 1])",
    "date_linear": "DATE, bounds='baseline_to_linear'",
    "linear": "linear LR + 5-epoch warmup (Goyal)",
    "legw": "LEGW (sqrt LR, warmup x k, poly-2)",
    "date_update": "DATE, ratio of the update (ratio_source='update')",
    "date_rc05": "DATE, roller coaster power 0.5",
}
ORACLE_POINTS = 2  # seed 0's best grid points re-run on the other seeds

FULL = dict(scales=(64, 16, 4), seeds=3, num_train=16384, num_test=4096,
            epochs=20, mnist_train=4096, mnist_epochs=30,
            lr_factors=LR_FACTORS, warmup_fractions=WARMUP_FRACTIONS,
            cnn_grid=(0.025, 0.05, 0.1, 0.2))
QUICK = dict(scales=(4,), seeds=1, num_train=1024, num_test=512, epochs=2,
             mnist_train=512, mnist_epochs=2, lr_factors=(0.5, 1.0, 2.0),
             warmup_fractions=(0.2,), cnn_grid=())


# ---------------------------------------------------------------------------
# Models.


class GhostBNCNN(nn.Module):
  """Two 1-D convolutions with ghost batch norm (ghost size B0), mean pool."""

  ghost_batch_size: int = 16

  @nn.compact
  def __call__(self, x, train: bool = False):
    from date_optax.nn import GhostBatchNorm  # noqa: PLC0415

    x = x.reshape(x.shape[0], -1, 1)
    for feats, stride in ((32, 1), (64, 2)):
      x = nn.Conv(feats, (5,), strides=(stride,), use_bias=False)(x)
      x = GhostBatchNorm(
          use_running_average=not train,
          ghost_batch_size=self.ghost_batch_size if train else None,
          momentum=0.9,
      )(x)
      x = nn.relu(x)
    return nn.Dense(10)(jnp.mean(x, axis=1))


# ---------------------------------------------------------------------------
# Tasks.


@dataclasses.dataclass(frozen=True)
class Task:
  """One model, data set and baseline tuned at ``B0``."""

  name: str
  label: str
  data: str  # "mnist1d" or "mnist"
  model: Callable[[int], nn.Module]  # B0 -> module
  solver: str
  batch_size: int
  learning_rate: float | None  # None: tuned on cnn_grid at B0 (seed 0)
  warmup_epochs: float = 0.1
  # Jitted calls of this many unrolled steps instead of one scanned epoch:
  # XLA's CPU backend runs convolutions inside a loop body ~20x slower.
  steps_per_call: int | None = None


TASKS = (
    Task("mnist1d_lstm_momentum", "MNIST-1D LSTM, momentum 0.9", "mnist1d",
         lambda b0: models.LSTMClassifier(chunk=4), "momentum", 16, 0.05),
    Task("mnist1d_lstm_adam", "MNIST-1D LSTM, Adam", "mnist1d",
         lambda b0: models.LSTMClassifier(chunk=4), "adam", 16, 8e-3),
    Task("mnist_lstm_momentum", "real-digit MNIST LSTM (examples/mnist_lstm), "
         "momentum 0.9", "mnist", lambda b0: models.LSTMClassifier(chunk=28), "momentum", 16, 0.2),
    Task("mnist1d_cnn_gbn_momentum", "MNIST-1D CNN + GhostBatchNorm (ghost 16), "
         "momentum 0.9", "mnist1d", lambda b0: GhostBNCNN(b0), "momentum", 16, None,
         steps_per_call=16),
)


def init_classifier(task: Task, x_train: np.ndarray, seed: int) -> tuple:
  """`(model, params, batch_stats)`: the task's model at its B0, initialised
  from `seed` on two rows of `x_train`; `batch_stats` None without batch norm."""
  model = task.model(task.batch_size)
  variables = model.init(jax.random.key(seed), jnp.asarray(x_train[:2]), train=True)
  return model, variables["params"], variables.get("batch_stats")


def classifier_loss(model: nn.Module) -> Callable:
  """`loss_fn(params, batch, model_state=None)` for the data-parallel step:
  softmax cross-entropy of `model` on `batch["x"]`, `batch["y"]`; with
  `model_state` (batch norm's statistics) it returns `(loss, new_state)`."""

  def loss_fn(p, b, model_state=None):
    if model_state is None:
      logits, new = model.apply({"params": p}, b["x"], train=True), None
    else:
      logits, upd = model.apply({"params": p, "batch_stats": model_state}, b["x"],
                                train=True, mutable=["batch_stats"])
      new = upd["batch_stats"]
    loss = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), b["y"]).mean()
    return loss if model_state is None else (loss, new)

  return loss_fn


def step_accuracy(model: nn.Module, state, data: dict, loss: float) -> tuple[float, bool]:
  """(test accuracy in %, diverged) of a data-parallel step's final `state`.

  A run whose last loss is not finite or that skipped a step counts as
  diverged, and its accuracy as at most chance (the share of label 0).
  """

  @jax.jit
  def predict(p, st, x):
    v = {"params": p} if st is None else {"params": p, "batch_stats": st}
    return jnp.argmax(model.apply(v, x, train=False), axis=-1)

  params = jax.device_get(state.params)
  st = None if state.model_state is None else jax.device_get(state.model_state)
  correct = 0
  for i in range(0, len(data["x_test"]), 2048):
    pred = predict(params, st, data["x_test"][i:i + 2048])
    correct += int(np.sum(np.asarray(pred) == data["y_test"][i:i + 2048]))
  acc = 100.0 * correct / len(data["x_test"])
  diverged = not np.isfinite(loss) or int(state.total_skips) > 0
  if diverged:
    acc = min(acc, 100.0 * np.mean(data["y_test"] == 0))
  return acc, bool(diverged)


def load_data(kind: str, cfg: dict) -> dict[str, np.ndarray]:
  if kind == "mnist1d":
    d = input_pipeline.load_mnist1d(
        cfg["num_train"], cfg["num_test"], seed=0,
        cache_dir=_paths.MNIST1D_CACHE)
    return dict(x_train=d.x_train, y_train=d.y_train, x_test=d.x_test,
                y_test=d.y_test, epochs=cfg["epochs"])
  d = input_pipeline.load_digits(num_train=cfg["mnist_train"])
  return dict(x_train=d.x_train.reshape(len(d.x_train), -1), y_train=d.y_train,
              x_test=d.x_test.reshape(len(d.x_test), -1), y_test=d.y_test,
              epochs=cfg["mnist_epochs"])


def baseline_of(task: Task, lr: float, data: dict) -> date_optax.Baseline:
  return date_optax.Baseline(
      batch_size=task.batch_size, learning_rate=lr,
      warmup_epochs=task.warmup_epochs, epochs=data["epochs"],
      num_examples=len(data["x_train"]), optimizer=task.solver,
      optimizer_options={"momentum": 0.9} if task.solver == "momentum" else {})


def optimizer_for(method: str, base: date_optax.Baseline, batch: int,
                  lr_factor: float = 1.0, warmup_fraction: float = 0.05):
  """The transformation of `method` (or of one oracle grid point, "grid")."""
  if method == "grid":
    r = date_optax.date_recipe(base, batch)
    warmup = max(1, round(warmup_fraction * r.total_steps))
    sched = schedules.warmup_decay_schedule(
        r.peak_learning_rate * lr_factor, warmup, r.total_steps,
        decay=r.decay, steps_per_epoch=r.steps_per_epoch)
    return base.solver(sched)
  if method == "date":
    return date_optax.date(base, batch)
  if method == "date_fixed":
    return date_optax.date(base, batch, bounds="fixed", trust_ratio_mask=None)
  if method == "date_linear":
    return date_optax.date(base, batch, bounds="baseline_to_linear")
  if method == "date_update":
    return date_optax.date(base, batch, ratio_source="update")
  if method == "date_rc05":
    return date_optax.date(base, batch, decay=schedules.RollerCoaster(power=0.5))
  if method == "linear":
    five = dataclasses.replace(base, warmup_epochs=min(5.0, base.epochs / 4))
    r = date_optax.scale_recipe(five, batch, lr_scaling="linear",
                                warmup_scaling="none")
    return base.solver(r.schedule)
  if method == "legw":
    r = date_optax.scale_recipe(base, batch, decay=schedules.Poly(power=2))
    return base.solver(r.schedule)
  if method == "baseline":
    return base.solver()
  raise ValueError(f"unknown method {method!r}")


# ---------------------------------------------------------------------------
# Training.


def train(model: nn.Module, data: dict, tx, batch: int, seed: int,
          steps_per_call: int | None = None) -> dict:
  """Trains for data['epochs'] epochs; returns final test accuracy and loss."""
  r = lstm_train.train(
      input_pipeline.Dataset(data["x_train"], data["y_train"], data["x_test"],
                             data["y_test"]),
      optimizer=tx, batch_size=batch, epochs=data["epochs"], model=model,
      seed=seed, eval_every_epoch=False, eval_batch_size=2048,
      steps_per_call=steps_per_call)
  acc = r.final_accuracy
  if r.diverged:  # count a diverged run as chance, whatever it predicts
    acc = min(acc, 100.0 * np.mean(data["y_test"] == 0))
  return dict(accuracy=acc, loss=r.train_loss[-1], steps=r.steps, wall=r.wall_time,
              diverged=r.diverged)


# ---------------------------------------------------------------------------
# The study.


def add_follow_up_flags(p) -> None:
  """Adds the flags of a study over this one's tasks that reads its log.

  ``--quick``, ``--tasks``, ``--seeds``, ``--out``, ``--oracle-log`` and
  ``--report-only``, as gain_study.py and batch_growth.py take them.
  """
  p.add_argument("--quick", action="store_true")
  p.add_argument("--tasks", default=None)
  p.add_argument("--seeds", type=int, default=None)
  p.add_argument("--out", default=None)
  p.add_argument("--oracle-log", default=None,
                 help="the oracle study's log (default docs/studies/oracle/oracle.jsonl; "
                      "none in --quick)")
  p.add_argument("--report-only", action="store_true")


def study_config(args, base: dict) -> dict:
  """A copy of `base` with the --seeds and --scales flags applied."""
  cfg = dict(base)
  if args.seeds is not None:
    cfg["seeds"] = args.seeds
  if args.scales:
    cfg["scales"] = tuple(int(k) for k in args.scales.split(","))
  return cfg


def run_key(task: Task, lr: float, method: str, k: int, seed: int, data: dict,
            lr_factor: float | None, wf: float | None) -> tuple[dict, str]:
  """A run's key (grid runs add their LR factor and warmup) and its log ident."""
  key = dict(task=task.name, lr=lr, method=method, k=k, seed=seed,
             epochs=data["epochs"], n=len(data["x_train"]))
  if method == "grid":
    key.update(lr_factor=lr_factor, warmup_fraction=wf)
  return key, json.dumps(key, sort_keys=True)


def run_study(args, out: str) -> int:
  cfg = study_config(args, QUICK if args.quick else FULL)
  tasks = [t for t in TASKS if not args.tasks or t.name in args.tasks.split(",")]
  log_path = out + ".jsonl"
  done = _runlog.load_runs(log_path)
  datasets: dict[str, dict] = {}
  counter = {"new": 0, "t0": time.perf_counter()}

  def data_of(task):
    if task.data not in datasets:
      datasets[task.data] = load_data(task.data, cfg)
    return datasets[task.data]

  def run(task, lr, method, k, seed, lr_factor=1.0, wf=0.05) -> dict:
    data = data_of(task)
    key, ident = run_key(task, lr, method, k, seed, data, lr_factor, wf)
    if ident in done:
      return done[ident]
    if args.report_only:
      return None
    base = baseline_of(task, lr, data)
    tx = optimizer_for(method, base, task.batch_size * k, lr_factor, wf)
    rec = dict(key=key, **train(task.model(task.batch_size), data, tx,
                                task.batch_size * k, seed, task.steps_per_call))
    _runlog.log_run(log_path, done, ident, rec)
    counter["new"] += 1
    el = (time.perf_counter() - counter["t0"]) / 60
    print(f"[{el:5.1f} min, run {counter['new']}] {task.name} k={k} seed={seed} "
          f"{method} {lr_factor:g}/{wf:g}: {rec['accuracy']:.2f} "
          f"({rec['wall']:.0f} s)", flush=True)
    return rec

  # 0. Baselines that still need their B0 learning rate (seed 0).
  lrs = {}
  for t in tasks:
    if t.learning_rate is not None:
      lrs[t.name] = t.learning_rate
    elif cfg["cnn_grid"]:
      recs = [(lr, run(t, lr, "baseline", 1, 0)) for lr in cfg["cnn_grid"]]
      accs = [(lr, r["accuracy"]) for lr, r in recs if r is not None]
      lrs[t.name] = max(accs, key=lambda a: a[1])[0]
    else:
      lrs[t.name] = 0.1

  grid = [(f, w) for w in cfg["warmup_fractions"] for f in cfg["lr_factors"]]

  head = [k for k in cfg["scales"] if k >= 16] or list(cfg["scales"])

  def cell(t, k, seed, grid_points):
    for f, w in grid_points:
      run(t, lrs[t.name], "grid", k, seed, f, w)
    for m in METHODS + (VARIANTS if k in head else ()):
      run(t, lrs[t.name], m, k, seed)

  # 1. Seed 0, headline scales: full grid and every method.
  for k in head:
    for t in tasks:
      cell(t, k, 0, grid)
  # 2. More seeds at the headline scales: seed 0's best grid points, methods.
  for seed in range(1, cfg["seeds"]):
    for k in head:
      for t in tasks:
        if _records(done, t.name, k, "grid", seed=0):
          cell(t, k, seed, _ranked_points(done, t.name, k, seeds=(0,))[:ORACLE_POINTS])
  # 3. The other scales, seed 0.
  for k in cfg["scales"]:
    if k not in head:
      for t in tasks:
        cell(t, k, 0, grid)
  # 4. Each baseline at B0 (context), seed 0.
  if not args.quick:
    for t in tasks:
      run(t, lrs[t.name], "baseline", 1, 0)

  md = markdown(done, tasks, lrs, cfg, args)
  with open(out + ".md", "w") as f:
    f.write(md)
  plot(done, tasks, cfg, out + ".png")
  print(md)
  print(f"wrote {out}.md, {out}.png, {log_path}")
  return 0


def _records(done, task, k, method, **match):
  out = []
  for rec in done.values():
    key = rec["key"]
    if key["task"] == task and key["k"] == k and key["method"] == method and all(
        key.get(a) == b for a, b in match.items()):
      out.append(rec)
  return out


def _grid_scores(done, task, k, seeds=None):
  """{(lr_factor, warmup_fraction): {seed: accuracy}} of the grid runs."""
  scores = {}
  for rec in _records(done, task, k, "grid"):
    key = rec["key"]
    if seeds is not None and key["seed"] not in seeds:
      continue
    scores.setdefault((key["lr_factor"], key["warmup_fraction"]), {})[
        key["seed"]] = rec["accuracy"]
  return scores


def _ranked_points(done, task, k, seeds=None):
  """Grid points, best mean accuracy over `seeds` (or all seeds) first; a
  tie goes to the learning rate nearer the recipe's."""
  scores = _grid_scores(done, task, k, seeds)
  return sorted(scores, key=lambda p: (-np.mean(list(scores[p].values())),
                                       abs(math.log(p[0]))))


def _oracle(done, task, k):
  """(point, mean accuracy, seeds) of the oracle.

  Seed 0 runs the whole grid and ranks it; its best `ORACLE_POINTS` points
  run on the other seeds. The oracle is the best of the points that ran on
  the most seeds, by the mean over those seeds; with one seed it is seed 0's
  best point.
  """
  scores = _grid_scores(done, task, k)
  most = max(len(v) for v in scores.values())
  full = {p: v for p, v in scores.items() if len(v) == most}
  point = min(full, key=lambda p: (-np.mean(list(full[p].values())),
                                   abs(math.log(p[0]))))
  return point, float(np.mean(list(full[point].values()))), sorted(full[point])


def markdown(done, tasks, lrs, cfg, args) -> str:
  cmd = _runlog.command("batch_scaling.py")
  lines = [
      f"### DATE against a retuned oracle ({'quick' if args.quick else 'full'} mode)",
      "",
      f"`{cmd}` on {platform.machine()} ({os.cpu_count()} CPU cores, shared "
      f"with other jobs), jax {jax.__version__}. MNIST-1D: {cfg['num_train']} "
      f"train / {cfg['num_test']} test, {cfg['epochs']} epochs; real MNIST "
      f"digits: {cfg['mnist_train']} train / {5000 - cfg['mnist_train']} test, "
      f"{cfg['mnist_epochs']} epochs. B0 = 16 for every task.",
      "",
      "Oracle: best of the retuning grid at the target batch (baseline solver, "
      "no ratio, roller coaster; peak LR x {" + ", ".join(
          f"{f:g}" for f in cfg["lr_factors"]) + "} of η0·sqrt(k), warmup "
      "{" + ", ".join(f"{w:g}" for w in cfg["warmup_fractions"]) + "} of the "
      "iterations): seed 0 runs the grid, its best " + str(ORACLE_POINTS) +
      " points run on the other seeds, and the oracle is the better of those "
      "by the mean over seeds. Cells: accuracy of the method (mean over "
      "seeds) minus the oracle's, in points; n = seeds; the two DATE variants "
      "on the right ran at 16·B0 and 64·B0 only.",
      "",
      "Baselines at B0: " + "; ".join(
          f"{t.label}: lr {lrs[t.name]:g}" for t in tasks) + ".",
      "",
      "| task | k | oracle (lr x, warmup) | " + " | ".join(
          LABELS[m] for m in METHODS + VARIANTS) + " |",
      "|---|---:|---|" + "---:|" * len(METHODS + VARIANTS),
  ]
  for t in tasks:
    for k in sorted(cfg["scales"]):
      if not _records(done, t.name, k, "grid", seed=0):
        continue
      (f, w), acc, seeds = _oracle(done, t.name, k)
      row = [t.label, str(k), f"{acc:.2f} ({f:g}x, {w:g}; n={len(seeds)})"]
      for m in METHODS + VARIANTS:
        recs = _records(done, t.name, k, m)
        if not recs:
          row.append("—")
          continue
        mean = np.mean([r["accuracy"] for r in recs])
        row.append(f"{mean - acc:+.2f} (n={len(recs)})")
      lines.append("| " + " | ".join(row) + " |")
  b0 = [(t, _records(done, t.name, 1, "baseline", lr=lrs[t.name], seed=0))
        for t in tasks]
  b0 = [(t, r) for t, r in b0 if r]
  if b0:
    lines += ["", "Baselines at B0 (seed 0; `date(baseline, B0)` is the same "
              "solver step by step): " + "; ".join(
                  f"{t.label} {r[0]['accuracy']:.2f}" for t, r in b0) + "."]
  cnn = [rec for rec in done.values() if rec["key"]["method"] == "baseline"
         and rec["key"]["k"] == 1 and rec["key"]["task"].startswith("mnist1d_cnn")]
  if len(cnn) > 1:
    lines += ["", "CNN learning-rate grid at B0 (seed 0): " + ", ".join(
        f"{r['key']['lr']:g}: {r['accuracy']:.2f}"
        for r in sorted(cnn, key=lambda r: r["key"]["lr"])) + "."]
  total = sum(r["wall"] for r in done.values())
  lines += ["", f"{len(done)} runs in the log, {total / 60:.1f} min of training."]
  return "\n".join(lines) + "\n"


def plot(done, tasks, cfg, path):
  import textwrap  # noqa: PLC0415

  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  ncol = 2 if len(tasks) == 4 else len(tasks)
  nrow = -(-len(tasks) // ncol)
  fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 3.4 * nrow + 0.6),
                           squeeze=False)
  lo, hi = -12.0, 3.0
  for ax, t in zip(axes.flat, tasks):
    ks = [k for k in sorted(cfg["scales"])
          if _records(done, t.name, k, "grid", seed=0)]
    if not ks:
      ax.set_axis_off()
      continue
    # The goal: within 0.5 points at 16·B0 and 1.0 at 64·B0.
    goal = [(k, -0.5 if k <= 16 else -1.0) for k in ks if k >= 16]
    if goal:
      gk, gv = zip(*goal)
      ax.plot(gk, gv, ls=":", color="0.4", marker="_", ms=14, label="goal")
    for m in METHODS + VARIANTS:
      gaps = []
      for k in ks:
        recs = _records(done, t.name, k, m)
        gaps.append(np.mean([r["accuracy"] for r in recs]) - _oracle(done, t.name, k)[1]
                    if recs else np.nan)
      main = m == "date"
      line, = ax.plot(ks, np.clip(gaps, lo, None), marker="o", label=LABELS[m],
                      lw=2.6 if main else 1.2, ls="--" if m in VARIANTS else "-",
                      zorder=3 if main else 2, ms=6 if main else 4)
      for k, g in zip(ks, gaps):
        if np.isfinite(g) and g < lo:  # off the axis: print the value
          ax.annotate(f"{g:.0f}", (k, lo), textcoords="offset points",
                      xytext=(3, 4), fontsize=7, color=line.get_color())
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlim(min(ks) / 1.5, max(ks) * 1.5)
    ax.set(xlabel="k = B / B0", ylabel="gap to oracle (points)", ylim=(lo - 0.5, hi))
    ax.set_title("\n".join(textwrap.wrap(t.label, 48)), fontsize=9)
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(tasks):]:
    ax.set_axis_off()
  handles, labels = axes.flat[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
  fig.tight_layout(rect=(0, 0.08 if nrow > 1 else 0.2, 1, 1))
  fig.savefig(path, dpi=100)
  plt.close(fig)
