"""A batch that grows: fixed, ramped and adaptive batches at equal examples (issue 35).

Every row sees the same training examples (the baseline's epochs) and is
trained through `date_optax.parallel.make_train_step(..., batch_schedule=...)`
on 8 (emulated) devices, its data through `data_loader` + `GrowingBatches`:

  ramp_<f>    Megatron-LM's linear ramp from B0 to 64·B0 (7 increments of
              9·B0) over the first fraction f of the examples
  adaptive    ``BatchSchedule.adaptive(B0, max_batch=64·B0)`` with its
              defaults: double when the smoothed B_simple reaches twice the
              batch, at most every 10 steps

with ``date(baseline, 64·B0, batch_schedule=...)``: the baseline's DATE
schedule counted in examples, times the batch scale (linear for momentum,
sqrt for Adam). The rows ``baseline`` (B0) and ``date`` (fixed 64·B0, DATE's
defaults) are read from the oracle study's log (`--oracle-log`, default
docs/studies/oracle/oracle.jsonl; the quick mode trains them). The GhostBatchNorm CNN is
left out: its ghost batch (B0) does not fit a 2-row microbatch per device.

  python benchmarks/batch_growth.py            # the study (resumable)
  python benchmarks/batch_growth.py --quick    # tiny pipeline check
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=8"
)  # 8 emulated devices on CPU (before jax is imported)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import date_optax  # noqa: E402
import date_optax.parallel as dp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _paths  # noqa: E402
import _runlog  # noqa: E402
import oracle  # noqa: E402

#: The largest batch, in units of B0, and the ramp's number of increments.
SCALE = 64
RAMP_INCREMENTS = 7
RAMP_FRACTIONS = (0.1, 0.25, 0.5)
NEW_METHODS = ("adaptive", *(f"ramp_{f}" for f in RAMP_FRACTIONS))
OLD_METHODS = ("baseline", "date")
LABELS = {
    "baseline": "B0 baseline",
    "date": "fixed k·B0, DATE defaults",
    "adaptive": "adaptive (BatchSchedule.adaptive defaults)",
    **{f"ramp_{f}": f"linear ramp over {f:.0%} of the examples" for f in RAMP_FRACTIONS},
}
GROWING_TASKS = ("mnist1d_lstm_momentum", "mnist1d_lstm_adam", "mnist_lstm_momentum")
FULL = dict(oracle.FULL, scale=SCALE, increments=RAMP_INCREMENTS)
QUICK = dict(oracle.QUICK, seeds=1, tasks=("mnist1d_lstm_momentum",), scale=4,
             increments=3)


def schedule_for(method: str, b0: int, total_examples: int,
                 cfg: dict) -> date_optax.BatchSchedule:
  top = cfg["scale"] * b0
  if method == "adaptive":
    return date_optax.BatchSchedule.adaptive(b0, max_batch=top)
  frac = float(method.split("_", 1)[1])
  return date_optax.BatchSchedule.ramp(b0, (top - b0) // cfg["increments"],
                                       max(1, int(frac * total_examples)), max_batch=top)


def lr_rule(base: date_optax.Baseline) -> str:
  return "linear" if base.optimizer in ("sgd", "momentum", "nesterov") else "sqrt"


def train_growing(task, data: dict, base: date_optax.Baseline, sched, seed: int) -> dict:
  """Trains `epochs · n` examples through the growing step; the curve per step."""
  tx = date_optax.date(base, sched.max_batch, batch_schedule=sched, lr_scaling=lr_rule(base))
  model = task.model(task.batch_size)
  x_train, y_train = data["x_train"], data["y_train"]
  start = time.perf_counter()
  params = model.init(jax.random.key(seed), jnp.asarray(x_train[:2]), train=True)["params"]

  def loss_fn(p, b):
    logits = model.apply({"params": p}, b["x"], train=True)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), b["y"]).mean()

  step = dp.make_train_step(loss_fn, tx, dp.data_mesh(), grad_stats=True,
                            batch_schedule=sched)
  state = step.init(params)
  src = dp.ArraySource({"x": x_train, "y": y_train.astype(np.int32)})
  batches = dp.GrowingBatches(iter(dp.data_loader(src, sched.chunk_size, seed=seed)),
                              sched.chunk_size)
  total = data["epochs"] * len(x_train)
  examples, curve, m = 0, [], None
  while True:
    b = step.next_batch_size(state)
    if examples + b > total:
      break
    state, m = step(state, batches.take(b))
    examples += b
    curve.append(m)
  curve = [dict(batch=int(c["batch_size"]), lr=float(c["learning_rate"]),
                loss=float(c["loss"]), noise_scale=float(c["grad_noise_scale"]))
           for c in jax.device_get(curve)]
  wall = time.perf_counter() - start

  @jax.jit
  def predict(p, x):
    return jnp.argmax(model.apply({"params": p}, x, train=False), axis=-1)

  params = jax.device_get(state.params)
  correct = 0
  for i in range(0, len(data["x_test"]), 2048):
    pred = predict(params, data["x_test"][i:i + 2048])
    correct += int(np.sum(np.asarray(pred) == data["y_test"][i:i + 2048]))
  acc = 100.0 * correct / len(data["x_test"])
  loss = curve[-1]["loss"]
  diverged = not np.isfinite(loss) or int(state.total_skips) > 0
  if diverged:
    acc = min(acc, 100.0 * np.mean(data["y_test"] == 0))
  stride = max(1, len(curve) // 200)
  return dict(accuracy=acc, loss=loss, steps=len(curve), examples=examples, wall=wall,
              diverged=bool(diverged), programs=step.traces,
              curve=[dict(step=i, **c) for i, c in enumerate(curve)][::stride])


def run_study(args) -> int:
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  cfg = dict(QUICK if args.quick else FULL)
  if args.seeds is not None:
    cfg["seeds"] = args.seeds
  names = args.tasks.split(",") if args.tasks else cfg.get("tasks", GROWING_TASKS)
  tasks = [t for t in oracle.TASKS if t.name in names]
  log_path = args.out + ".jsonl"
  done = _runlog.load_runs(log_path)
  old = _runlog.load_runs(args.oracle_log) if args.oracle_log else {}
  datasets: dict[str, dict] = {}
  t0 = time.perf_counter()

  def data_of(task):
    if task.data not in datasets:
      datasets[task.data] = oracle.load_data(task.data, cfg)
    return datasets[task.data]

  def run(task, method, seed):
    data = data_of(task)
    k = 1 if method == "baseline" else cfg["scale"]
    key = dict(task=task.name, lr=task.learning_rate, method=method, k=k, seed=seed,
               epochs=data["epochs"], n=len(data["x_train"]))
    ident = json.dumps(key, sort_keys=True)
    if ident in done:
      return done[ident]
    if ident in old:
      return old[ident]
    if args.report_only:
      return None
    base = oracle.baseline_of(task, task.learning_rate, data)
    try:
      if method in OLD_METHODS:
        tx = oracle.optimizer_for(method, base, task.batch_size * k)
        rec = oracle.train(task.model(task.batch_size), data, tx, task.batch_size * k,
                           seed, task.steps_per_call)
      else:
        sched = schedule_for(method, task.batch_size, data["epochs"] * len(data["x_train"]),
                             cfg)
        rec = train_growing(task, data, base, sched, seed)
    except Exception as e:  # noqa: BLE001 - a failed cell must not end the study
      print(f"FAILED {task.name} seed={seed} {method}: {e!r}", flush=True)
      return None
    rec = dict(key=key, **rec)
    done[ident] = rec
    with open(log_path, "a") as f:
      f.write(json.dumps(dict(ident=ident, **rec)) + "\n")
    print(f"[{(time.perf_counter() - t0) / 60:5.1f} min] {task.name} seed={seed} "
          f"{method}: {rec['accuracy']:.2f} in {rec['steps']} steps ({rec['wall']:.0f} s)",
          flush=True)
    return rec

  for seed in range(cfg["seeds"]):
    for t in tasks:
      for m in (*OLD_METHODS, *NEW_METHODS):
        run(t, m, seed)
  recs = {**old, **done}
  md = markdown(recs, tasks, cfg)
  with open(args.out + ".md", "w") as f:
    f.write(md)
  plot(recs, tasks, cfg, args.out + ".png")
  print(md)
  print(f"wrote {args.out}.md, {args.out}.png, {log_path}")
  return 0


def _records(recs, task, method, cfg, seeds=None):
  k = 1 if method == "baseline" else cfg["scale"]
  seeds = cfg["seeds"] if seeds is None else seeds
  return [r for r in recs.values() if r["key"]["task"] == task.name
          and r["key"]["method"] == method and r["key"]["k"] == k
          and r["key"]["seed"] < seeds and r["key"].get("lr") == task.learning_rate]


def markdown(recs, tasks, cfg) -> str:
  lines = [
      "# A batch that grows: fixed, ramped and adaptive batches at equal examples",
      "",
      f"Written by `benchmarks/batch_growth.py`; {cfg['seeds']} seed(s); every row "
      f"sees the baseline's epochs of examples; the largest batch is "
      f"{cfg['scale']}·B0. Accuracy is "
      "the mean test accuracy over seeds (a diverged run counts as chance); Δ is "
      "against the B0 baseline; steps are optimizer steps; wall is the mean "
      "training time in seconds on 8 emulated CPU devices (the baseline and "
      "fixed rows come from the oracle study's in-memory trainer, not the step).",
      "",
      "| task | row | steps | accuracy | Δ vs B0 | wall (s) |",
      "|---|---|---:|---:|---:|---:|",
  ]
  for t in tasks:
    base = _records(recs, t, "baseline", cfg)
    b0 = float(np.mean([r["accuracy"] for r in base])) if base else float("nan")
    for m in (*OLD_METHODS, *NEW_METHODS):
      rs = _records(recs, t, m, cfg)
      if not rs:
        continue
      acc = float(np.mean([r["accuracy"] for r in rs]))
      steps = int(np.mean([r["steps"] for r in rs]))
      wall = float(np.mean([r["wall"] for r in rs]))
      lines.append(f"| {t.label} | {LABELS[m]} | {steps} | {acc:.2f} | {acc - b0:+.2f} "
                   f"| {wall:.0f} |")
  return "\n".join(lines) + "\n"


def plot(recs, tasks, cfg, path: str) -> None:
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  fig, axes = plt.subplots(2, len(tasks), figsize=(5 * len(tasks), 7), squeeze=False)
  for j, t in enumerate(tasks):
    for m in NEW_METHODS:
      rs = _records(recs, t, m, cfg, 1)
      if not rs or "curve" not in rs[0]:
        continue
      c = rs[0]["curve"]
      steps = [p["step"] for p in c]
      axes[0, j].plot(steps, [p["batch"] for p in c],
                      label=f"{LABELS[m]} ({rs[0]['accuracy']:.1f}%)")
      axes[1, j].plot(steps, [p["lr"] for p in c], label=LABELS[m])
    axes[0, j].set_yscale("log", base=2)
    axes[0, j].set_title(t.label, fontsize=9)
    axes[0, j].set_ylabel("global batch")
    axes[1, j].set_ylabel("learning rate")
    axes[1, j].set_xlabel("optimizer step")
    axes[0, j].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)


def step_cost(steps: int = 10, rounds: int = 15, batch: int = 256) -> dict:
  """Seconds per step at `batch`: the growing step (adaptive, grown to
  `batch`) against the plain step with the same microbatches and statistics."""
  task = oracle.TASKS[0]
  model = task.model(task.batch_size)
  x = np.random.default_rng(0).normal(size=(batch, 40)).astype(np.float32)
  data = {"x": x, "y": (np.arange(batch) % 10).astype(np.int32)}
  params = model.init(jax.random.key(0), jnp.asarray(x[:2]), train=True)["params"]

  def loss_fn(p, b):
    logits = model.apply({"params": p}, b["x"], train=True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, b["y"]).mean()

  base = date_optax.Baseline(batch_size=16, learning_rate=0.05, warmup_epochs=1,
                             epochs=100, num_examples=16384, optimizer="momentum",
                             optimizer_options={"momentum": 0.9})
  grow = date_optax.BatchSchedule.adaptive(16, max_batch=batch, threshold=1e-9,
                                           min_steps=3)
  mesh = dp.data_mesh()
  k = batch // 16
  plain = dp.make_train_step(loss_fn, date_optax.date(base, batch), mesh, grad_stats=True,
                             microbatches=k)
  growing = dp.make_train_step(loss_fn, date_optax.date(base, batch, batch_schedule=grow),
                               mesh, grad_stats=True, batch_schedule=grow)
  states = {}
  for name, step in (("plain", plain), ("growing", growing)):
    state = step.init(params)
    if name == "growing":
      while step.next_batch_size(state) < batch:  # grow to `batch` first
        b = step.next_batch_size(state)
        state, _ = step(state, {key: v[:b] for key, v in data.items()})
    for _ in range(3):
      state, m = step(state, data)
    jax.block_until_ready(m)
    states[name] = state
  # Interleaved rounds, the fastest round of each: the machine is shared.
  out = {"plain": float("inf"), "growing": float("inf")}
  for _ in range(rounds):
    for name, step in (("plain", plain), ("growing", growing)):
      state = states[name]
      t = time.perf_counter()
      for _ in range(steps):
        state, m = step(state, data)
      jax.block_until_ready(m)
      out[name] = min(out[name], (time.perf_counter() - t) / steps)
      states[name] = state
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true")
  p.add_argument("--tasks", default=None)
  p.add_argument("--seeds", type=int, default=None)
  p.add_argument("--out", default=None)
  p.add_argument("--oracle-log", default=None,
                 help="the oracle study's log (default "
                 "docs/studies/oracle/oracle.jsonl; none in --quick)")
  p.add_argument("--report-only", action="store_true")
  p.add_argument("--step-cost", action="store_true",
                 help="only time the growing step against the plain step")
  args = p.parse_args(argv)
  if args.step_cost:
    for i in range(2):
      cost = step_cost()
      print(f"try {i}: plain {cost['plain'] * 1e3:.2f} ms/step, growing "
            f"{cost['growing'] * 1e3:.2f} ms/step "
            f"({cost['growing'] / cost['plain'] - 1:+.1%})", flush=True)
    return 0
  if args.out is None:
    args.out = _paths.study("batch_growth",
                            "batch_growth_quick" if args.quick else "batch_growth")
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  if args.oracle_log is None and not args.quick:
    args.oracle_log = _paths.study("oracle") + ".jsonl"
  return run_study(args)


if __name__ == "__main__":
  sys.exit(main())
