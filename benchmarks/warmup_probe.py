"""Warmup probe: the local curvature L(x, g) over the first iterations.

LEGW (You et al. 2019, §4) explains warmup by the curvature of the loss along
the update direction, L(x, g) = gᵀ∇²f g / ‖g‖², which peaks in the first
iterations, with the peak moving to later iterations as the batch grows. This
script trains a small model on MNIST-1D (generated locally with
`mnist1d.data.make_dataset`, no download) with plain momentum SGD at several
batch sizes — no warmup, peak learning rate scaled by sqrt(B / B0) as LEGW
does — and measures L with `date_optax.diagnostics.lipschitz_estimate` on a
fixed probe batch at every iteration.

  python benchmarks/warmup_probe.py            # quick: < 2 min on 2 CPU cores
  python benchmarks/warmup_probe.py --full     # more iterations and data

Writes docs/images/warmup_probe.png and prints a Markdown table for docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from date_optax.diagnostics import lipschitz_estimate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import _paths  # noqa: E402


def mnist1d_data(num_samples: int, seed: int):
  """MNIST-1D generated from its templates (mnist1d's own generator)."""
  from mnist1d.data import get_dataset_args, make_dataset

  args = get_dataset_args()
  args.num_samples = num_samples
  args.seed = seed
  d = make_dataset(args)  # generates; `get_dataset` would try to download
  return (d["x"].astype(np.float32), d["y"].astype(np.int32))


class MLP(nn.Module):
  hidden: int = 128

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(self.hidden)(x))
    x = nn.relu(nn.Dense(self.hidden)(x))
    return nn.Dense(10)(x)


class LSTM(nn.Module):
  hidden: int = 32

  @nn.compact
  def __call__(self, x):
    h = nn.RNN(nn.OptimizedLSTMCell(self.hidden))(x[..., None])
    return nn.Dense(10)(h[:, -1])


def make_loss(model):
  def loss_fn(params, batch):
    x, y = batch
    logits = model.apply({"params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  return loss_fn


def run(model, data, batch_size, lr, iters, probe, seed):
  """Trains `iters` steps; returns L(x_t, g_t) for t = 0 .. iters-1."""
  x, y = data
  params = model.init(jax.random.key(seed), x[:1])["params"]
  loss_fn = make_loss(model)
  opt = optax.sgd(lr, momentum=0.9)
  opt_state = opt.init(params)

  @jax.jit
  def step(params, opt_state, batch):
    grads = jax.grad(loss_fn)(params, batch)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  probe_fn = jax.jit(functools.partial(lipschitz_estimate, loss_fn))
  rng = np.random.default_rng(seed)
  perm, pos, values = rng.permutation(len(x)), 0, []
  for _ in range(iters):
    # L at the current iterate, along the probe batch's gradient.
    # The paper plots |gᵀHg| / ‖g‖²; the probe returns the signed value.
    values.append(abs(float(probe_fn(params, probe))))
    if pos + batch_size > len(x):
      perm, pos = rng.permutation(len(x)), 0
    idx = perm[pos:pos + batch_size]
    pos += batch_size
    params, opt_state = step(params, opt_state, (x[idx], y[idx]))
  return np.array(values)


def smooth(v: np.ndarray, window: int) -> np.ndarray:
  """Centred moving average (edges use the available neighbours)."""
  kernel = np.ones(window)
  num = np.convolve(v, kernel, mode="same")
  den = np.convolve(np.ones_like(v), kernel, mode="same")
  return num / den


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--full", action="store_true", help="longer run, more data")
  p.add_argument("--model", choices=("mlp", "lstm"), default="mlp")
  p.add_argument("--batch-sizes", type=int, nargs="+", default=None)
  p.add_argument("--iters", type=int, default=None)
  p.add_argument("--base-batch", type=int, default=32)
  p.add_argument("--base-lr", type=float, default=0.1)
  p.add_argument("--probe-size", type=int, default=1024)
  p.add_argument("--seeds", type=int, default=None, help="runs per batch size")
  p.add_argument("--out", default=_paths.image("warmup_probe.png"))
  a = p.parse_args(argv)

  batch_sizes = a.batch_sizes or [32, 128, 512, 2048]
  iters = a.iters or (400 if a.full else 200)
  n_seeds = a.seeds or (8 if a.full else 3)
  num_samples = 40000 if a.full else 10000
  window = max(5, iters // 20) | 1  # odd, about 5% of the run

  t0 = time.time()
  x, y = mnist1d_data(num_samples, seed=42)
  split = int(0.8 * len(x))
  train = (x[:split], y[:split])
  probe = (jnp.asarray(x[split:split + a.probe_size]),
           jnp.asarray(y[split:split + a.probe_size]))
  model = MLP() if a.model == "mlp" else LSTM()

  curves = {}
  with tqdm(total=len(batch_sizes) * n_seeds, desc="warmup probe") as bar:
    for b in batch_sizes:
      lr = a.base_lr * np.sqrt(b / a.base_batch)  # LEGW's sqrt scaling
      runs = []
      for s in range(n_seeds):
        runs.append(run(model, train, b, lr, iters, probe, seed=s))
        bar.update()
      curves[b] = (lr, np.median(runs, axis=0))
  elapsed = time.time() - t0

  rows = []
  for b, (lr, v) in curves.items():
    sm = smooth(v, window)
    peak = int(np.argmax(sm))
    rows.append((b, lr, peak, sm[peak], v[0], sm[-1], peak * b / split))

  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (ax, ax_ep) = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
  for (b, (lr, v)), row in zip(curves.items(), rows, strict=True):
    sm = smooth(v, window)
    line, = ax.plot(np.arange(iters), sm,
                    label=f"B={b} (lr {lr:.3g}), peak at iteration {row[2]}")
    ax.plot(np.arange(iters), v, color=line.get_color(), alpha=0.25, linewidth=0.8)
    ax.axvline(row[2], color=line.get_color(), linestyle="--", linewidth=0.8)
    # The same curve against epochs: LEGW scales warmup *epochs* with B.
    # Point t is the iterate after t updates, i.e. t·B examples (log axis: t >= 1).
    epochs = np.arange(iters) * b / split
    ax_ep.plot(epochs[1:], sm[1:], color=line.get_color(), label=f"B={b}")
    if row[2] > 0:
      ax_ep.axvline(row[6], color=line.get_color(), linestyle="--", linewidth=0.8)
  ax.set_xlabel("iteration (updates done)")
  ax.set_ylabel("L(x, g) = |gᵀHg| / ‖g‖²")
  ax.set_yscale("log")
  ax.legend(fontsize=8)
  ax_ep.set_xscale("log")
  ax_ep.set_xlabel("epoch (log scale)")
  ax_ep.legend(fontsize=8)
  fig.suptitle(f"MNIST-1D {a.model.upper()}, momentum SGD (no warmup, lr ∝ sqrt(B)); "
               f"median of {n_seeds} seeds, moving average {window}", fontsize=10)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
  fig.savefig(a.out, dpi=120)

  print(f"\nMachine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, jax {jax.__version__} ({jax.default_backend()})")
  print(f"Command: python benchmarks/warmup_probe.py {' '.join(argv or sys.argv[1:])}")
  print(f"MNIST-1D {split} train examples, {a.model}, probe batch {a.probe_size}, "
        f"{iters} iterations, {n_seeds} seeds, moving average {window}; "
        f"{elapsed:.0f} s\n")
  print("| B | lr | peak iteration | peak L | L at start | L at end | peak (epochs) |")
  print("|---|---|---|---|---|---|---|")
  for b, lr, peak, lpk, l0, lend, ep in rows:
    print(f"| {b} | {lr:.3g} | {peak} | {lpk:.3g} | {l0:.3g} | {lend:.3g} | {ep:.3f} |")
  print(f"\nwrote {a.out}")


if __name__ == "__main__":
  main()
