"""The demo (``make demo``): constant accuracy from B0 to 64·B0 without retuning.

Trains an LSTM on MNIST-1D (generated locally by the ``mnist1d`` package) on
the CPU, three times with the same number of epochs:

1. the baseline, tuned once at batch ``B0``;
2. DATE (``date_optax.date``) at ``64·B0``, from the baseline with no
   retuning: 64x fewer iterations;
3. for contrast, the usual recipe at ``64·B0``: the learning rate scaled
   linearly with the batch and a 5-epoch gradual warmup (Goyal et al.).

The large-batch runs are data-parallel over emulated CPU devices (the
``--devices`` flag, set through ``XLA_FLAGS`` before JAX starts its backend).
It prints a table (test accuracy, iterations, wall time) and writes
``demo.png`` (accuracy and learning rate against the epoch), ``results.md``
and ``results.json`` into ``--workdir``.

Run from the repository root: ``python -m benchmarks.demo --help``
(``make demo`` runs it with the defaults). The data, model, scaling methods
and in-memory training loop are ``benchmarks/tasks``' (`data`, `models`,
`methods`, `trainer.train`), shared with the other studies in ``benchmarks/``;
the model is that of ``examples/mnist1d_lstm``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

#: Peak learning rates tuned at B0 = 16 (0.1-epoch warmup, roller-coaster
#: decay): the best of benchmarks/batch_scaling.py's grids (seed 0;
#: docs/RESULTS.md).
TUNED_LEARNING_RATES = {"adam": 8e-3, "momentum": 0.05}

#: The demo's baseline: Adam with its tuned learning rate.
DEFAULTS = dict(
    base_batch=16,
    scale=64,
    epochs=30,
    num_train=32768,
    num_test=8192,
    solver="adam",
    learning_rate=None,
    warmup_epochs=0.1,
    devices=8,
    seed=0,
)


def build_parser() -> argparse.ArgumentParser:
  """The demo's flags."""
  p = argparse.ArgumentParser(
      prog="python -m benchmarks.demo",
      description=__doc__.split("\n\n", 1)[1],
      formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  d = DEFAULTS
  p.add_argument("--workdir", default="demo_out",
                 help="where results.md/json, demo.png and the data cache go "
                 "(default: %(default)s)")
  p.add_argument("--base-batch", type=int, default=d["base_batch"],
                 help="B0, the batch the baseline was tuned at (default: %(default)s)")
  p.add_argument("--scale", type=int, default=d["scale"],
                 help="k: the large batch is k*B0 (default: %(default)s)")
  p.add_argument("--epochs", type=int, default=d["epochs"],
                 help="epochs, the same for every run (default: %(default)s)")
  p.add_argument("--num-train", type=int, default=d["num_train"],
                 help="MNIST-1D training examples (default: %(default)s)")
  p.add_argument("--num-test", type=int, default=d["num_test"],
                 help="MNIST-1D test examples (default: %(default)s)")
  p.add_argument("--solver", choices=("adam", "momentum"), default=d["solver"],
                 help="the baseline's solver (default: %(default)s)")
  p.add_argument("--learning-rate", type=float, default=d["learning_rate"],
                 help="the baseline's peak learning rate at B0 (default: the "
                 "value tuned at B0 = 16 for the solver, "
                 f"{TUNED_LEARNING_RATES})")
  p.add_argument("--warmup-epochs", type=float, default=d["warmup_epochs"],
                 help="the baseline's warmup at B0 (default: %(default)s)")
  p.add_argument("--devices", type=int, default=d["devices"],
                 help="emulated CPU devices for the data-parallel runs "
                 "(default: %(default)s)")
  p.add_argument("--seed", type=int, default=d["seed"],
                 help="initialisation and data-order seed (default: %(default)s)")
  p.add_argument("--seeds", default=None,
                 help="comma-separated seeds (e.g. 0,1,2): the demo runs once per "
                 "seed, each into workdir/seed<N>/, and writes the mean and range "
                 "over the seeds (results.md/json, demo.png) into workdir")
  p.add_argument("--quick", action="store_true",
                 help="a smoke run of a few seconds: 2048 examples, 6 epochs, "
                 "scale 8 (the accuracies mean nothing)")
  p.add_argument("--no-progress", action="store_true", help="no progress bars")
  return p


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the demo with `argv` (default: ``sys.argv[1:]``); returns the exit code."""
  return run(build_parser().parse_args(argv))


def set_host_device_count(n: int) -> None:
  """Asks XLA for `n` CPU devices; only effective before JAX's backend starts."""
  flag = f"--xla_force_host_platform_device_count={n}"
  flags = [
      f for f in os.environ.get("XLA_FLAGS", "").split()
      if not f.startswith("--xla_force_host_platform_device_count=")
  ]
  os.environ["XLA_FLAGS"] = " ".join([*flags, flag])


def run(args: argparse.Namespace) -> int:
  """Runs the demo; returns the exit code."""
  if args.quick:
    args.num_train, args.num_test, args.epochs, args.scale = 2048, 512, 6, 8
  for name in ("base_batch", "scale", "epochs", "num_train", "num_test", "devices"):
    if getattr(args, name) < 1:
      print(f"demo: --{name.replace('_', '-')} must be >= 1, "
            f"got {getattr(args, name)}", file=sys.stderr)
      return 2
  if args.learning_rate is None:
    args.learning_rate = TUNED_LEARNING_RATES[args.solver]
  elif args.learning_rate <= 0:
    print(f"demo: --learning-rate must be > 0, got {args.learning_rate}",
          file=sys.stderr)
    return 2
  big = args.base_batch * args.scale
  if big > args.num_train:
    print(f"demo: --base-batch * --scale = {big} exceeds --num-train="
          f"{args.num_train}", file=sys.stderr)
    return 2
  if big % args.devices:
    print(f"demo: the large batch {big} must divide evenly over "
          f"--devices={args.devices}", file=sys.stderr)
    return 2
  seeds = None
  if args.seeds is not None:
    try:
      seeds = [int(x) for x in str(args.seeds).split(",") if x.strip()]
    except ValueError:
      seeds = []
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
      print(f"demo: --seeds must be distinct non-negative integers separated by "
            f"commas, got {args.seeds!r}", file=sys.stderr)
      return 2
  set_host_device_count(args.devices)
  # The demo is a CPU job: with jax[tpu] installed (the test extras) JAX
  # would otherwise probe for a TPU first and libtpu print start-up errors.
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  if seeds is not None:
    return _run_seeds(args, seeds)
  _run_one(args)
  print(CPU_NOTE)
  return 0


#: Printed after every run: the last digits depend on the processor.
CPU_NOTE = (
    "\nNote: other CPUs print other last digits. XLA's float32 reductions run "
    "in another order with other vector widths (AVX2, AVX-512), and 30 epochs "
    "amplify the difference; docs/guide/examples.md (\"The demo\") gives the mean "
    "and range over 3 seeds (python -m benchmarks.demo --seeds 0,1,2) with the CPU "
    "it ran on."
)


def _run_one(args: argparse.Namespace) -> list:
  """The three runs at `args.seed`; writes their outputs into `args.workdir`."""
  import jax  # noqa: PLC0415  (after XLA_FLAGS)

  import date_optax.parallel as dp  # noqa: PLC0415
  from benchmarks.tasks import data as input_pipeline  # noqa: PLC0415
  from benchmarks.tasks import methods, trainer  # noqa: PLC0415

  if jax.device_count() < args.devices:
    print(f"note: JAX had already started with {jax.device_count()} device(s); "
          f"running on those instead of {args.devices}.", file=sys.stderr)
  os.makedirs(args.workdir, exist_ok=True)
  t0 = time.perf_counter()
  print(f"Generating MNIST-1D ({args.num_train} train / {args.num_test} test) ...",
        flush=True)
  data = input_pipeline.load_mnist1d(
      args.num_train, args.num_test, seed=args.seed,
      cache_dir=os.path.join(args.workdir, "data"))
  tuned = methods.make_baseline(
      args.solver, batch_size=args.base_batch,
      learning_rate=args.learning_rate, warmup_epochs=args.warmup_epochs,
      epochs=args.epochs, num_examples=args.num_train,
  )
  mesh = dp.data_mesh(min(args.devices, jax.device_count()))
  big = args.base_batch * args.scale
  runs = [
      ("baseline", "baseline", f"baseline ({args.solver}, tuned at B0)",
       args.base_batch, None),
      ("date", "DATE", "DATE (date_optax.date), no retuning", big, mesh),
      ("linear", "linear+warmup", "linear LR scaling + 5-epoch warmup", big, mesh),
  ]
  results = []
  for method, short, label, batch, run_mesh in runs:
    tx, schedule = methods.scaled_run(method, tuned, batch)
    results.append(_train_with_progress(
        trainer.train, data, tx, schedule, batch, args, run_mesh, label, short))
  out = _write_outputs(results, args, tuned, time.perf_counter() - t0)
  print(out["table"])
  print(f"\nWrote {out['png']}, {out['md']} and {out['json']}.")
  return results


def _run_seeds(args: argparse.Namespace, seeds: list[int]) -> int:
  """The demo at every seed, then the mean and range over the seeds."""
  import copy  # noqa: PLC0415
  import platform  # noqa: PLC0415

  import numpy as np  # noqa: PLC0415

  os.makedirs(args.workdir, exist_ok=True)
  per_seed = []
  for seed in seeds:
    one = copy.copy(args)
    one.seed, one.workdir = seed, os.path.join(args.workdir, f"seed{seed}")
    print(f"\n=== seed {seed} ===", flush=True)
    per_seed.append(_run_one(one))
  rows = []
  for i, first in enumerate(per_seed[0]):
    accs = [runs[i].final_accuracy for runs in per_seed]
    times = [runs[i].wall_time for runs in per_seed]
    rows.append(dict(method=first.name, batch_size=first.batch_size,
                     iterations=first.steps, test_accuracy=accs,
                     mean=float(np.mean(accs)), min=float(np.min(accs)),
                     max=float(np.max(accs)), wall_time=float(np.mean(times))))
  cpu = _cpu_name()
  lines = [f"Over seeds {', '.join(map(str, seeds))} on {cpu} "
           f"({platform.machine()}, {os.cpu_count()} cores):", "",
           "| method | batch | iterations | test accuracy (%), mean | range | "
           "wall time (s), mean |", "|---|---:|---:|---:|---|---:|"]
  for r in rows:
    lines.append(f"| {r['method']} | {r['batch_size']} | {r['iterations']} | "
                 f"{r['mean']:.2f} | {r['min']:.2f}–{r['max']:.2f} | {r['wall_time']:.1f} |")
  table = "\n".join(lines)
  with open(os.path.join(args.workdir, "results.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(args.workdir, "results.json"), "w") as f:
    json.dump(dict(settings=vars(args), seeds=seeds, cpu=cpu, summary=rows), f, indent=1)
  _plot_seeds(per_seed, args, os.path.join(args.workdir, "demo.png"))
  print("\n" + table)
  print(CPU_NOTE)
  return 0


def _cpu_name() -> str:
  """The processor's model name (from /proc/cpuinfo where there is one)."""
  import platform  # noqa: PLC0415

  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


def _plot_seeds(per_seed, args, png) -> None:
  """Mean test accuracy against the epoch, the seeds' range shaded."""
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from benchmarks import _paths  # noqa: PLC0415

  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  for i, first in enumerate(per_seed[0]):
    curves = np.array([runs[i].test_accuracy for runs in per_seed])
    label = f"{first.name} (B={first.batch_size}, {first.steps} it.)"
    line, = ax.plot(first.epochs, curves.mean(0), marker="o", ms=3, label=label)
    ax.fill_between(first.epochs, curves.min(0), curves.max(0),
                    color=line.get_color(), alpha=0.2)
  ax.set(xlabel="epoch", ylabel="test accuracy (%)", ylim=(0, 100),
         title=f"LSTM on MNIST-1D, mean and range over {len(per_seed)} seeds")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, loc="lower right")
  _paths.save_figure(fig, png, dpi=110)


def _train_with_progress(train_fn, data, tx, schedule, batch, args, mesh, label,
                         short):
  bar = None
  if not args.no_progress:
    from tqdm.auto import tqdm  # noqa: PLC0415

    bar = tqdm(total=args.epochs, desc=f"{short:13s} B={batch:<5d}",
               unit="ep", file=sys.stderr, leave=True)

  def progress(epoch, acc):
    if bar is not None:
      bar.set_postfix_str(f"test acc {acc:5.2f}%")
      bar.update(1)

  try:
    return train_fn(
        data, optimizer=tx, batch_size=batch, epochs=args.epochs,
        learning_rate=schedule, seed=args.seed, mesh=mesh, name=label,
        progress=progress,
    )
  finally:
    if bar is not None:
      bar.close()


def format_table(results) -> str:
  """A markdown table: method, batch, iterations, test accuracy, wall time."""
  lines = [
      "| method | batch | iterations | test accuracy (%) | wall time (s) |",
      "|---|---:|---:|---:|---:|",
  ]
  for r in results:
    acc = "diverged" if r.diverged else f"{r.final_accuracy:.2f}"
    lines.append(f"| {r.name} | {r.batch_size} | {r.steps} | {acc} | {r.wall_time:.1f} |")
  return "\n".join(lines)


def _write_outputs(results, args, tuned, total_time) -> dict[str, str]:
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from benchmarks import _paths  # noqa: PLC0415

  table = format_table(results)
  fig, (ax_acc, ax_lr) = plt.subplots(1, 2, figsize=(11, 4.2))
  for r in results:
    label = f"{r.name} (B={r.batch_size}, {r.steps} it.)"
    ax_acc.plot(r.epochs, r.test_accuracy, marker="o", ms=3, label=label)
    steps = np.arange(1, r.steps + 1)
    ax_lr.plot(steps * args.epochs / r.steps, r.step_learning_rate, label=label)
  ax_acc.set(xlabel="epoch", ylabel="test accuracy (%)", ylim=(0, 100),
             title="LSTM on MNIST-1D: same epochs, 64x fewer iterations")
  ax_acc.grid(alpha=0.3)
  ax_acc.legend(fontsize=8, loc="lower right")
  ax_lr.set(xlabel="epoch", ylabel="learning rate", yscale="log",
            title="learning-rate schedules")
  ax_lr.grid(alpha=0.3)
  png = os.path.join(args.workdir, "demo.png")
  _paths.save_figure(fig, png, dpi=110)

  header = (
      f"LSTM (64 units) on MNIST-1D, {args.num_train} train / {args.num_test} "
      f"test examples, {args.epochs} epochs; baseline {args.solver} "
      f"lr {tuned.learning_rate:g} with {tuned.warmup_epochs:g}-epoch warmup at "
      f"B0={tuned.batch_size}; large batch {args.base_batch * args.scale} on "
      f"{args.devices} emulated CPU devices; total {total_time:.0f} s."
  )
  md = os.path.join(args.workdir, "results.md")
  with open(md, "w") as f:
    f.write(header + "\n\n" + table + "\n")
  js = os.path.join(args.workdir, "results.json")
  with open(js, "w") as f:
    json.dump(
        dict(
            settings=vars(args),
            runs=[
                dict(method=r.name, batch_size=r.batch_size, iterations=r.steps,
                     test_accuracy=r.test_accuracy, train_loss=r.train_loss,
                     learning_rate=r.learning_rate, wall_time=r.wall_time)
                for r in results
            ],
        ),
        f, indent=1,
    )
  return dict(table=header + "\n\n" + table, png=png, md=md, json=js)


if __name__ == "__main__":
  raise SystemExit(main())
