"""Cost of GhostBatchNorm against flax.linen.BatchNorm on one device.

Times a jitted training step of one normalisation layer (forward, backward,
running-average update) on a ResNet-50-like activation, for flax's BatchNorm
and for GhostBatchNorm with the whole batch and with ghost sub-batches.
Reports milliseconds and the ratio to flax measured in the same run
(layers interleaved round by round).

  python benchmarks/batch_norm.py                       # CPU-sized default
  python benchmarks/batch_norm.py --batch 256 --hw 56 --channels 256 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
from tqdm import tqdm

from date_optax.nn import GhostBatchNorm


def step_fn(module):
  def loss(params, batch_stats, x):
    y, upd = module.apply(
        {"params": params, "batch_stats": batch_stats}, x, mutable=["batch_stats"]
    )
    return jnp.sum(jnp.square(y.astype(jnp.float32))), upd["batch_stats"]

  @jax.jit
  def step(params, batch_stats, x):
    (value, new_stats), grads = jax.value_and_grad(loss, argnums=(0, 2), has_aux=True)(
        params, batch_stats, x
    )
    return value, new_stats, grads

  return step


def prepare(module, x):
  variables = module.init(jax.random.key(0), x)
  step = step_fn(module)
  args = (variables["params"], variables["batch_stats"], x)
  jax.block_until_ready(step(*args))  # compile
  return step, args


def time_interleaved(prepared, repeats):
  """Runs every layer once per round, so load from other processes hits all.

  Returns per-layer (min, median) milliseconds; the minimum is the robust
  number on a shared machine.
  """
  times = {name: [] for name in prepared}
  for _ in tqdm(range(repeats), desc="rounds"):
    for name, (step, args) in prepared.items():
      t0 = time.perf_counter()
      jax.block_until_ready(step(*args))
      times[name].append(1e3 * (time.perf_counter() - t0))
  return {n: (min(t), statistics.median(t)) for n, t in times.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--hw", type=int, default=28)
  parser.add_argument("--channels", type=int, default=128)
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--ghosts", default="64,32,16", help="ghost sizes to time")
  parser.add_argument("--repeats", type=int, default=20)
  args = parser.parse_args()

  shape = (args.batch, args.hw, args.hw, args.channels)
  x = jax.random.normal(jax.random.key(1), shape, jnp.dtype(args.dtype))
  kw = dict(use_running_average=False, momentum=0.9)
  configs = [("flax.linen.BatchNorm", nn.BatchNorm(**kw))]
  configs.append(("GhostBatchNorm (whole batch)", GhostBatchNorm(**kw)))
  for g in (int(v) for v in args.ghosts.split(",") if v):
    module = GhostBatchNorm(ghost_batch_size=g, **kw)
    configs.append((f"GhostBatchNorm ghost={g}", module))

  prepared = {name: prepare(module, x) for name, module in configs}
  results = time_interleaved(prepared, args.repeats)

  dev = jax.devices()[0]
  print(f"\ndevice: {dev.platform} {dev.device_kind} x{jax.device_count()}; "
        f"host {platform.machine()}; jax {jax.__version__}")
  print(f"input {shape} {args.dtype}; {args.repeats} interleaved rounds "
        "(forward + backward + running-average update)\n")
  base_min, base_med = results[configs[0][0]]
  print("| layer | min ms | median ms | ratio to flax (min) | ratio (median) |")
  print("|---|---|---|---|---|")
  for name, (mn, med) in results.items():
    ratios = f"{mn / base_min:.2f} | {med / base_med:.2f}"
    print(f"| {name} | {mn:.2f} | {med:.2f} | {ratios} |")

if __name__ == "__main__":
  main()
