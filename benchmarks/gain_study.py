"""Measured gain against fixed rules and a widened retuned oracle (issue 21).

Extends the oracle study of `benchmarks/oracle.py` (its tasks, baselines,
grid and log). New rows, trained through
`date_optax.parallel.make_train_step(..., grad_stats=True)` on 8 (emulated)
devices, so that the step measures the gradient-noise statistics:

  date_gain   ``date(baseline, B, lr_scaling="gain")`` (its default
              ``gain_clock="steps"``): the LEGW recipe at B, one iteration
              per step, times the gain
  date_gain_clock  ``date(baseline, B, lr_scaling="gain", gain_clock="gain")``:
              the baseline's DATE schedule at B0 on AdaScale's clock
  adascale    ``adascale(baseline.solver(learning_rate=1.0), k,
              learning_rate=baseline.recipe().schedule)``: AdaScale over the
              baseline's own solver and schedule, the schedule on the
              scale-invariant clock, cut at the epoch budget

The rows ``date`` (defaults), ``linear`` and ``legw`` and the oracle grid
are read from the oracle study's log (`--oracle-log`, default
docs/studies/oracle/oracle.jsonl: the same data order, initialisation and arithmetic, run
by the in-memory trainer of `benchmarks/tasks`). The oracle grid is
widened where its best point sits on an edge: peak learning rate x8 and
x16 (or x1/8) of DATE's ``η0·sqrt(k)``, at the best point's warmup, seed 0
first and the other seeds when the new point wins on seed 0.

Each run of the new rows also records the measured simple noise scale
``B_simple`` (metric ``grad_noise_scale``) and the gain at the end of every
epoch. Every finished run is appended to ``<out>.jsonl`` and reused.

  python benchmarks/gain_study.py            # the study (resumable)
  python benchmarks/gain_study.py --quick    # tiny pipeline check
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

os.environ.setdefault(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=8"
)  # 8 emulated devices on CPU (before jax is imported)

import jax  # noqa: E402
import numpy as np  # noqa: E402

import date_optax  # noqa: E402
import date_optax.parallel as dp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _paths  # noqa: E402
import _runlog  # noqa: E402
import oracle  # noqa: E402

NEW_METHODS = ("date_gain", "adascale", "date_gain_clock")
OLD_METHODS = ("date", "linear", "legw")
LABELS = {
    "date": "DATE, defaults (sqrt k)",
    "date_gain": "DATE, lr_scaling='gain'",
    "adascale": "AdaScale over the baseline's solver",
    "date_gain_clock": "DATE, gain, gain_clock='gain'",
    "linear": "linear LR + 5-epoch warmup",
    "legw": "LEGW",
}
WIDE_UP = (8.0, 16.0)
WIDE_DOWN = (0.125,)

QUICK = dict(oracle.QUICK, scales=(4,), seeds=1, tasks=("mnist1d_lstm_momentum",))


def optimizer_for(method: str, base: date_optax.Baseline, batch: int):
  k = batch // base.batch_size
  if method == "date_gain":
    return date_optax.date(base, batch, lr_scaling="gain", gain_clock="steps")
  if method == "date_gain_clock":
    return date_optax.date(base, batch, lr_scaling="gain", gain_clock="gain")
  if method == "adascale":
    return date_optax.adascale(base.solver(learning_rate=1.0), k,
                               learning_rate=base.recipe().schedule)
  raise ValueError(f"unknown method {method!r}")


def train_with_step(task, data: dict, tx, batch: int, seed: int) -> dict:
  """Trains through make_train_step(grad_stats=True) on every device."""
  x_train, y_train = data["x_train"], data["y_train"]
  start = time.perf_counter()
  model, params, bstats = oracle.init_classifier(task, x_train, seed)
  loss_fn = oracle.classifier_loss(model)
  devices = jax.device_count()
  if "cnn" in task.name:  # ghost batch norm: B0 examples per ghost batch
    while devices > 2 and (batch // devices) % task.batch_size:
      devices //= 2
  mesh = dp.data_mesh(devices)
  step = dp.make_train_step(loss_fn, tx, mesh, grad_stats=True)
  state = step.init(params, model_state=bstats)
  n = len(x_train)
  spe = n // batch
  rng = np.random.default_rng(seed)
  curve = []
  loss = float("nan")
  for epoch in range(1, data["epochs"] + 1):
    order = rng.permutation(n)[: spe * batch]
    for i in range(spe):
      idx = order[i * batch:(i + 1) * batch]
      state, m = step(state, {"x": x_train[idx], "y": y_train[idx]})
    loss = float(m["loss"])
    curve.append(dict(epoch=epoch, loss=loss, gain=float(m["gain"]),
                      noise_scale=float(m["grad_noise_scale"]),
                      lr=float(m.get("learning_rate", np.nan))))

  acc, diverged = oracle.step_accuracy(model, state, data, loss)
  return dict(accuracy=acc, loss=loss, steps=spe * data["epochs"], devices=devices,
              wall=time.perf_counter() - start, diverged=bool(diverged), curve=curve)


def run_study(args) -> int:
  cfg = oracle.study_config(args, QUICK if args.quick else oracle.FULL)
  names = args.tasks.split(",") if args.tasks else cfg.get("tasks")
  tasks = [t for t in oracle.TASKS if not names or t.name in names]
  log_path = args.out + ".jsonl"
  done = _runlog.load_runs(log_path)
  old = _runlog.load_runs(args.oracle_log) if args.oracle_log else {}
  datasets: dict[str, dict] = {}
  counter = {"new": 0, "t0": time.perf_counter()}

  def data_of(task):
    if task.data not in datasets:
      datasets[task.data] = oracle.load_data(task.data, cfg)
    return datasets[task.data]

  def lr_of(task):
    if task.learning_rate is not None:
      return task.learning_rate
    recs = [r for r in old.values() if r["key"]["task"] == task.name
            and r["key"]["method"] == "baseline"]
    return max(recs, key=lambda r: r["accuracy"])["key"]["lr"] if recs else 0.1

  def run(task, method, k, seed, lr_factor=None, wf=None):
    data = data_of(task)
    key, ident = oracle.run_key(task, lr_of(task), method, k, seed, data, lr_factor, wf)
    if ident in done:
      return done[ident]
    if ident in old:
      return old[ident]
    if args.report_only:
      return None
    rec = _runlog.run_and_log(
        log_path, done, ident, key,
        lambda: _train(task, data, method, key, k, seed, lr_factor, wf),
        f"{task.name} k={k} seed={seed} {method}")
    if rec is None:
      return None
    counter["new"] += 1
    el = (time.perf_counter() - counter["t0"]) / 60
    extra = ""
    if "curve" in rec:
      extra = (f" B_simple {rec['curve'][-1]['noise_scale']:.0f}, gain "
               f"{rec['curve'][-1]['gain']:.2f}")
    print(f"[{el:5.1f} min, run {counter['new']}] {task.name} k={k} seed={seed} "
          f"{method} {lr_factor or ''}/{wf or ''}: {rec['accuracy']:.2f} "
          f"({rec['wall']:.0f} s){extra}", flush=True)
    return rec

  def _train(task, data, method, key, k, seed, lr_factor, wf):
    base = oracle.baseline_of(task, key["lr"], data)
    batch = task.batch_size * k
    if method == "grid":
      tx = oracle.optimizer_for("grid", base, batch, lr_factor, wf)
      rec = oracle.train(task.model(task.batch_size), data, tx, batch, seed,
                         task.steps_per_call)
    elif method in NEW_METHODS:
      rec = train_with_step(task, data, optimizer_for(method, base, batch), batch, seed)
    else:
      tx = oracle.optimizer_for(method, base, batch)
      rec = oracle.train(task.model(task.batch_size), data, tx, batch, seed,
                         task.steps_per_call)
    return rec

  head = [k for k in cfg["scales"] if k >= 16] or list(cfg["scales"])
  all_recs = lambda: {**old, **done}  # noqa: E731

  def widen(t, k, seed):
    """Edge points of the grid: x8, x16 above a best 4x, x1/8 below 0.25x."""
    recs = oracle._records(all_recs(), t.name, k, "grid", seed=0)
    if not recs:
      for f, w in ((f, w) for w in cfg["warmup_fractions"] for f in cfg["lr_factors"]):
        run(t, "grid", k, 0, f, w)
    for _ in range(3):  # step out until the best point is interior
      best = oracle._ranked_points(all_recs(), t.name, k, seeds=(0,))[0]
      factors = sorted({p[0] for p in oracle._grid_scores(all_recs(), t.name, k)})
      f, w = best
      if f == factors[-1]:
        new = [x for x in (*WIDE_UP, 32.0, 64.0) if x > f][:2]
      elif f == factors[0]:
        new = [x for x in (*WIDE_DOWN, 1 / 16, 1 / 32) if x < f][:1]
      else:
        break
      for x in new:
        run(t, "grid", k, seed, x, w)

  for k in head:  # 1. seed 0 at the headline batches
    for t in tasks:
      for m in NEW_METHODS:
        run(t, m, k, 0)
      widen(t, k, 0)
  for seed in range(1, cfg["seeds"]):  # 2. more seeds
    for k in head:
      for t in tasks:
        for m in NEW_METHODS:
          run(t, m, k, seed)
        for p in oracle._ranked_points(all_recs(), t.name, k, seeds=(0,))[:2]:
          run(t, "grid", k, seed, *p)
  for k in cfg["scales"]:  # 3. other scales, seed 0
    if k not in head:
      for t in tasks:
        for m in NEW_METHODS:
          run(t, m, k, 0)
        widen(t, k, 0)
  if args.quick:  # the quick mode also runs the old rows itself
    for t in tasks:
      for k in cfg["scales"]:
        for m in OLD_METHODS:
          run(t, m, k, 0)

  md = markdown(all_recs(), tasks, cfg, args)
  with open(args.out + ".md", "w") as f:
    f.write(md)
  plot(all_recs(), tasks, cfg, args.out + ".png")
  print(md)
  print(f"wrote {args.out}.md, {args.out}.png, {log_path}")
  return 0


def _mean(recs):
  return float(np.mean([r["accuracy"] for r in recs])) if recs else float("nan")


def gaps(done, t, k):
  """(oracle point, oracle accuracy, n, {method: (gap, n)})."""
  if not oracle._records(done, t.name, k, "grid", seed=0):
    return None
  (f, w), acc, seeds = oracle._oracle(done, t.name, k)
  out = {}
  for m in OLD_METHODS + NEW_METHODS:
    recs = oracle._records(done, t.name, k, m)
    out[m] = (_mean(recs) - acc, len(recs)) if recs else (float("nan"), 0)
  return (f, w), acc, len(seeds), out


def noise_scale(done, t, k):
  """B_simple (median over the epochs' ends) and the gain at the end of the
  date_gain runs, mean over seeds."""
  recs = [r for r in oracle._records(done, t.name, k, "date_gain") if "curve" in r]
  if not recs:
    return None
  return float(np.mean([np.median([c["noise_scale"] for c in r["curve"]])
                        for r in recs])), float(
      np.mean([r["curve"][-1]["gain"] for r in recs]))


def markdown(done, tasks, cfg, args) -> str:
  cmd = _runlog.command("gain_study.py")
  lines = [
      f"### Measured gain against a widened oracle ({'quick' if args.quick else 'full'})",
      "",
      f"`{cmd}` on {platform.machine()} ({os.cpu_count()} CPU cores, shared), jax "
      f"{jax.__version__}. Tasks, data and baselines of `benchmarks/oracle.py` "
      "(B0 = 16). Cells: accuracy minus the oracle's (points, mean over n "
      "seeds). The oracle is the retuning grid's best (oracle.py's rule) "
      "after widening the grid at its edge (x8, x16 / x1/8). DATE defaults, "
      "linear, LEGW and the first grid come from the oracle study's log; "
      "DATE-gain and AdaScale ran through make_train_step(grad_stats=True) "
      f"on {jax.device_count()} devices.",
      "",
      "| task | k | oracle (lr x, warmup; n) | " + " | ".join(
          LABELS[m] for m in OLD_METHODS + NEW_METHODS) + " | B_simple (median), gain (end) |",
      "|---|---:|---|" + "---:|" * (len(OLD_METHODS + NEW_METHODS) + 1),
  ]
  for t in tasks:
    for k in sorted(cfg["scales"]):
      g = gaps(done, t, k)
      if g is None:
        continue
      (f, w), acc, n, cells = g
      row = [t.label, str(k), f"{acc:.2f} ({f:g}x, {w:g}; n={n})"]
      for m in OLD_METHODS + NEW_METHODS:
        gap, n_m = cells[m]
        row.append("—" if n_m == 0 else f"{gap:+.2f} (n={n_m})")
      ns = noise_scale(done, t, k)
      row.append("—" if ns is None else f"{ns[0]:.0f}, {ns[1]:.2f}")
      lines.append("| " + " | ".join(row) + " |")
  lines += ["", "Averages over the tasks (gap, points):"]
  for k in sorted(cfg["scales"]):
    rows = [gaps(done, t, k) for t in tasks]
    rows = [r for r in rows if r is not None]
    if not rows:
      continue
    vals = {m: [r[3][m][0] for r in rows if r[3][m][1]] for m in OLD_METHODS + NEW_METHODS}
    lines.append(f"- k={k}: " + ", ".join(
        f"{LABELS[m]} {np.mean(v):+.2f} ({len(v)} tasks)" for m, v in vals.items() if v))
  return "\n".join(lines) + "\n"


def plot(done, tasks, cfg, path):
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  ncol = min(len(tasks), 2)
  nrow = -(-len(tasks) // ncol)
  fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 3.4 * nrow + 0.8),
                           squeeze=False)
  lo = -12.0
  for ax, t in zip(axes.flat, tasks):
    ks = [k for k in sorted(cfg["scales"]) if gaps(done, t, k) is not None]
    if not ks:
      ax.set_axis_off()
      continue
    for m in OLD_METHODS + NEW_METHODS:
      vals = [gaps(done, t, k)[3][m][0] for k in ks]
      ax.plot(ks, np.clip(vals, lo, None), marker="o", label=LABELS[m],
              lw=2.4 if m == "date_gain" else 1.2)
    goal = [(k, -0.5 if k <= 16 else -1.0) for k in ks if k >= 16]
    if goal:
      ax.plot(*zip(*goal), ls=":", color="0.4", marker="_", ms=14, label="goal")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set(xlabel="k = B / B0", ylabel="gap to widened oracle (points)",
           ylim=(lo - 0.5, 6.0))
    ax.set_title(t.label[:60], fontsize=9)
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(tasks):]:
    ax.set_axis_off()
  handles, labels = axes.flat[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
  fig.tight_layout(rect=(0, 0.1, 1, 1))
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  oracle.add_follow_up_flags(p)
  p.add_argument("--scales", default=None)
  args = p.parse_args(argv)
  if args.out is None:
    args.out = _paths.study("gain_study", "gain_study_quick" if args.quick else "gain_study")
  if args.oracle_log is None and not args.quick:
    args.oracle_log = _paths.study("oracle") + ".jsonl"
  return run_study(args)


if __name__ == "__main__":
  sys.exit(main())
