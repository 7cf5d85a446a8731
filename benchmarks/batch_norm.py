"""Cost of GhostBatchNorm against flax.linen.BatchNorm on one device.

Times a jitted training step of one normalisation layer (forward, backward,
running-average update) on a ResNet-50-like activation, for flax's BatchNorm
and for GhostBatchNorm with the whole batch and with ghost sub-batches.
Reports milliseconds and the ratio to flax measured in the same run
(layers interleaved round by round).

  python benchmarks/batch_norm.py                       # CPU-sized default
  python benchmarks/batch_norm.py --batch 256 --hw 56 --channels 256 --dtype bfloat16
  python benchmarks/batch_norm.py --collectives   # 8 emulated CPU devices

`--collectives` instead lists the collectives XLA emits for one layer in each
replica layout (pmap, shard_map, jit on a sharded global batch).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import time

if "--collectives" in sys.argv:  # entry point: emulate 8 devices before JAX
  os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  )

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
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


_COLLECTIVE = re.compile(
    r"= (\S+|\(.*?\)) (all-reduce|all-gather|reduce-scatter|collective-permute|"
    r"all-to-all)\(.*?replica_groups=(.*?), [a-z_]+="
)


def list_collectives(group_size=2, ghost=4, per_device=8):
  """Prints the collectives of one training step of one layer, per layout."""
  n = jax.device_count()
  mesh = Mesh(np.array(jax.devices()), ("batch",))
  x = jax.random.normal(jax.random.key(0), (n * per_device, 4, 4, 16))
  kw = dict(use_running_average=False, group_size=group_size, ghost_batch_size=ghost)
  per_dev = GhostBatchNorm(axis_name="batch", **kw)
  glob = GhostBatchNorm(num_replicas=n, **kw)
  variables = glob.init(jax.random.key(1), x[:per_device])

  def fwd(module):
    return lambda x: module.apply(variables, x, mutable=["batch_stats"])

  xs = x.reshape(n, per_device, *x.shape[1:])
  sharded = jax.device_put(x, NamedSharding(mesh, P("batch")))
  programs = {
      "pmap (axis_index_groups)": jax.pmap(fwd(per_dev), axis_name="batch").lower(xs),
      "shard_map (all-gather fallback)": jax.jit(jax.shard_map(
          lambda x: fwd(per_dev)(x)[0], mesh=mesh, in_specs=P("batch"),
          out_specs=P("batch"),
      )).lower(sharded),
      "jit, num_replicas (reshape)": jax.jit(fwd(glob)).lower(sharded),
  }
  print(f"{n} devices, group_size={group_size}, ghost_batch_size={ghost}, "
        f"per-device batch {per_device}, input {x.shape}")
  for name, lowered in programs.items():
    found = _COLLECTIVE.findall(lowered.compile().as_text())
    ops = [f"{op} of {re.sub(r'{[^}]*}', '', t)} over {g}" for t, op, g in found]
    print(f"- {name}: " + "; ".join(ops))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--hw", type=int, default=28)
  parser.add_argument("--channels", type=int, default=128)
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--ghosts", default="64,32,16", help="ghost sizes to time")
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--collectives", action="store_true",
                      help="list the collectives per replica layout and exit")
  args = parser.parse_args()
  if args.collectives:
    list_collectives()
    return

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
