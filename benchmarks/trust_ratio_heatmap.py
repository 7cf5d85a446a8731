"""Trust-ratio telemetry on a real short run: LAMB on an MLP, MNIST-1D.

Trains a 4-layer MLP with `date_optax.lamb` (bounded ratios, weight decay
off biases), puts `trust_ratio_summary` in the step metrics, logs them with
`MetricWriter` (CSV + TensorBoard) and draws the per-layer heatmap with
`plot_trust_ratio_heatmap`.

  python benchmarks/trust_ratio_heatmap.py [--steps 300] [--workdir DIR]

Writes docs/images/trust_ratio_heatmap.png; about 30 s on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import trange

import date_optax
from date_optax.diagnostics import (
    MetricWriter,
    per_layer_ratios,
    plot_trust_ratio_heatmap,
    trust_ratio_summary,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import _paths  # noqa: E402

LOWER, UPPER = 0.01, 10.0


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    for width in (128, 128, 128):
      x = nn.relu(nn.Dense(width)(x))
    return nn.Dense(10)(x)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--batch-size", type=int, default=512)
  p.add_argument("--lr", type=float, default=2e-2)
  p.add_argument("--workdir", default=None, help="metrics dir (default: a temp dir)")
  p.add_argument("--out", default=_paths.image("trust_ratio_heatmap.png"))
  a = p.parse_args(argv)

  from mnist1d.data import get_dataset_args, make_dataset

  args = get_dataset_args()
  args.num_samples = 10000
  d = make_dataset(args)  # generated locally, no download
  x, y = d["x"].astype(np.float32), d["y"].astype(np.int32)
  xt, yt = d["x_test"].astype(np.float32), d["y_test"].astype(np.int32)

  model = MLP()
  params = model.init(jax.random.key(0), x[:1])["params"]
  schedule = optax.warmup_cosine_decay_schedule(0.0, a.lr, a.steps // 10, a.steps)
  opt = date_optax.lamb(
      # Weight decay off biases, but every layer (biases too) gets its own
      # bounded ratio, as optax.lamb does without masks.
      schedule, weight_decay=1e-3, mask=date_optax.exclude_bias_and_norm,
      trust_ratio_mask=True, lower=LOWER, upper=UPPER,
  )
  opt_state = opt.init(params)

  def loss_fn(params, xb, yb):
    logits = model.apply({"params": params}, xb)
    return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

  @jax.jit
  def train_step(params, opt_state, xb, yb):
    loss, grads = jax.value_and_grad(loss_fn)(params, xb, yb)
    updates, opt_state = opt.update(grads, opt_state, params)
    ratios = date_optax.trust_ratios(opt_state)
    metrics = {"loss": loss, "lr": schedule(opt_state.count - 1),
               **trust_ratio_summary(ratios, LOWER, UPPER, prefix="trust_ratio/")}
    return optax.apply_updates(params, updates), opt_state, metrics, ratios

  @jax.jit
  def accuracy(params):
    return jnp.mean(jnp.argmax(model.apply({"params": params}, xt), -1) == yt)

  workdir = a.workdir or tempfile.mkdtemp(prefix="trust_ratio_")
  rng = np.random.default_rng(0)
  history, t0 = [], time.time()
  with MetricWriter(workdir) as writer:
    for step in trange(1, a.steps + 1, desc="LAMB on MNIST-1D"):
      idx = rng.choice(len(x), a.batch_size, replace=False)
      params, opt_state, metrics, ratios = train_step(params, opt_state, x[idx], y[idx])
      history.append(ratios)
      writer.write_scalars(step, metrics)
      writer.write_scalars(step, {f"trust_ratio_layer/{k}": v
                                  for k, v in per_layer_ratios(ratios).items()})
    acc = float(accuracy(params))
    writer.write_scalars(a.steps, {"test_accuracy": acc})
  elapsed = time.time() - t0

  plot_trust_ratio_heatmap(
      history, a.out, steps=list(range(1, a.steps + 1)), lower=LOWER, upper=UPPER,
      title=f"LAMB trust ratio per layer, MLP on MNIST-1D (B={a.batch_size}, "
            f"bounds [{LOWER}, {UPPER}])",
  )
  print(f"{a.steps} steps in {elapsed:.1f} s, test accuracy {acc:.3f}; "
        f"metrics (CSV, TensorBoard) in {workdir}; wrote {a.out}")
  print("| step | min | median | max | at lower | at upper |")
  print("|---|---|---|---|---|---|")
  for step in sorted({1, 2, 5, a.steps // 10, a.steps // 2, a.steps}):
    s = jax.device_get(trust_ratio_summary(history[step - 1], LOWER, UPPER))
    print(f"| {step} | {s['min']:.3g} | {s['median']:.3g} | {s['max']:.3g} | "
          f"{s['frac_at_lower']:.2f} | {s['frac_at_upper']:.2f} |")


if __name__ == "__main__":
  main()
