"""Does ``date(baseline, B0)`` train like the baseline? Which ratio bounds?

The engine's default upper bound (docs/algorithms.md, "The DATE engine")
must leave a baseline tuned for the plain solver unchanged at k = 1. This
script trains an MLP on MNIST-1D (16k train / 4k test, generated locally)
with

* the baseline's own solver (momentum 0.9, its own LR schedule) at B0 = 32,
* ``date(baseline, 32)`` with the default bounds [0.01, 1],
* ``date(baseline, 32, upper=10)`` (DeepSpeed's / bounded_lars' default),

then ``date(baseline, B)`` for larger B, and prints test accuracy (mean of
`--seeds` seeds). Results go in docs/RESULTS.md.

  .venv/bin/python benchmarks/date_bounds.py [--seeds 2] [--epochs 30]
"""

from __future__ import annotations

import argparse
import math
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

import date_optax


def mnist1d(num_samples=20000, seed=0):
  from mnist1d.data import get_dataset_args, make_dataset

  args = get_dataset_args()
  args.num_samples, args.seed = num_samples, seed
  data = make_dataset(args)  # generated procedurally, no download
  return (np.asarray(data["x"], np.float32), np.asarray(data["y"]),
          np.asarray(data["x_test"], np.float32), np.asarray(data["y_test"]))


def init_mlp(key, sizes=(40, 256, 256, 10)):
  params = {}
  for j, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
    key, k = jax.random.split(key)
    params[f"dense{j}"] = {"kernel": jax.random.normal(k, (a, b)) * math.sqrt(2 / a),
                           "bias": jnp.zeros(b)}
  return params


def apply_mlp(params, x):
  n = len(params)
  for j in range(n):
    x = x @ params[f"dense{j}"]["kernel"] + params[f"dense{j}"]["bias"]
    if j < n - 1:
      x = jax.nn.relu(x)
  return x


def loss_fn(params, x, y):
  logits = apply_mlp(params, x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def train(tx, data, batch_size, epochs, seed):
  x, y, xt, yt = (jnp.asarray(a) for a in data)
  n = x.shape[0]
  steps = math.ceil(epochs * n / batch_size)
  rng = np.random.default_rng(seed)
  order = np.concatenate(
      [rng.permutation(n) for _ in range(steps * batch_size // n + 1)]
  )[: steps * batch_size].reshape(steps, batch_size)
  params = init_mlp(jax.random.PRNGKey(seed))

  @jax.jit
  def run(params, state, order):
    def step(carry, idx):
      p, s = carry
      g = jax.grad(loss_fn)(p, x[idx], y[idx])
      u, s = tx.update(g, s, p)
      return (optax.apply_updates(p, u), s), None
    (p, _), _ = jax.lax.scan(step, (params, state), order)
    return p

  params = run(params, tx.init(params), jnp.asarray(order))
  acc = jnp.mean(jnp.argmax(apply_mlp(params, xt), -1) == yt)
  return 100 * float(acc), steps


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, default=2)
  ap.add_argument("--epochs", type=float, default=30)
  ap.add_argument("--batches", default="128,512,2048")
  ap.add_argument("--plot", default="docs/images/date_bounds.png",
                  help="PNG of test accuracy against batch size ('' for none)")
  args = ap.parse_args()

  data = mnist1d()
  base = date_optax.Baseline(
      batch_size=32, learning_rate=0.05, warmup_epochs=0.1, epochs=args.epochs,
      num_examples=len(data[1]), optimizer="momentum",
      optimizer_options={"momentum": 0.9},
  )
  runs = [("baseline solver (plain momentum)", 32, base.solver()),
          ("date(baseline, 32), bounds [0.01, 1] (default)", 32,
           date_optax.date(base, 32)),
          ("date(baseline, 32, upper=10), bounds [0.01, 10]", 32,
           date_optax.date(base, 32, upper=10.0))]
  for b in [int(s) for s in args.batches.split(",")]:
    runs.append((f"date(baseline, {b}), bounds [0.01, 1]", b, date_optax.date(base, b)))
    runs.append((f"date(baseline, {b}, upper=10)", b,
                 date_optax.date(base, b, upper=10.0)))
  # Goyal et al.'s recipe for contrast: linear LR scaling, same warmup epochs.
  b = max(int(s) for s in args.batches.split(","))
  goyal = date_optax.scale_recipe(base, b, lr_scaling="linear",
                                  warmup_scaling="none")
  runs.append((f"plain momentum, linear scaling, {b}", b,
               base.solver(goyal.schedule)))
  print(f"# {platform.node()} {platform.processor() or platform.machine()}, "
        f"jax {jax.__version__}, {jax.devices()[0].platform}; MNIST-1D 16k/4k, "
        f"MLP 40-256-256-10, {args.epochs:g} epochs, {args.seeds} seeds")
  print("| run | B | steps | test acc % (mean ± sd) | seconds |")
  print("|---|---|---|---|---|")
  results = []
  for name, b, tx in tqdm(runs, desc="runs"):
    t = time.perf_counter()
    accs = []
    for seed in range(args.seeds):
      acc, steps = train(tx, data, b, args.epochs, seed)
      accs.append(acc)
    dt = time.perf_counter() - t
    print(f"| {name} | {b} | {steps} | {np.mean(accs):.1f} ± {np.std(accs):.1f} "
          f"| {dt:.0f} |", flush=True)
    results.append((name, b, np.mean(accs)))
  if args.plot:
    plot(results, args.plot)


def plot(results, path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6.4, 4), dpi=120)
  base_acc = results[0][2]
  ax.axhline(base_acc, color="gray", ls="--",
             label=f"baseline solver, B=32 ({base_acc:.1f}%)")
  for label, key in (("date(), bounds [0.01, 1] (default)", "bounds [0.01, 1]"),
                     ("date(), bounds [0.01, 10]", "upper=10")):
    pts = sorted((b, a) for n, b, a in results if key in n)
    ax.plot(*zip(*pts, strict=True), "o-", label=label)
  for n, b, a in results:
    if n.startswith("plain momentum, linear"):
      ax.plot([b], [a], "k^", label=f"plain momentum, linear LR scaling ({a:.1f}%)")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("batch size (baseline tuned at 32)")
  ax.set_ylabel("test accuracy %")
  ax.set_title("MNIST-1D MLP, 30 epochs: date(baseline, B) without retuning",
               fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path)
  print(f"# wrote {path}")


if __name__ == "__main__":
  main()
