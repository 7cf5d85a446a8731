"""Weight-update sharding: optimizer-state bytes per device, and step time.

Part 1 (no devices needed): for ResNet-50- and BERT-shaped parameter trees,
the optimizer-state bytes each device holds with `shard_update=False` (every
replica keeps the whole state) and `shard_update=True` (each array split along
its largest axis divisible by N, the rule `make_train_step` uses), for N = 8,
32 and 256 replicas, against the ideal 1/N.

Part 2 (measured, 8 emulated CPU devices): a data-parallel LAMB step on the
chosen tree with `shard_update` False and True: optimizer-state bytes per
device read from the live arrays, and the step time as a ratio to the
unsharded step measured in the same run (the two steps alternate). The loss is synthetic
(`c * mean(batch) * sum(w^2)`), so the time is the optimizer update plus the
gradient/parameter collectives, the part that weight-update sharding changes.
Emulated devices share the host's cores, so on CPU the saving is the 8x
smaller update per device, not faster links.

Usage:
  python benchmarks/update_sharding.py                      # both parts, ResNet-50
  python benchmarks/update_sharding.py --tree bert_base --steps 3
  python benchmarks/update_sharding.py --no-measure         # part 1 only
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from optimizer_step import bert_base_shapes, bert_shapes, resnet50_shapes  # noqa: E402


def bert_large_shapes() -> dict[str, tuple[int, ...]]:
  return bert_shapes(1024, 4096, 24)


TREES = {"resnet50": resnet50_shapes, "bert_base": bert_base_shapes,
         "bert_large": bert_large_shapes}
STATES = {"lars": 1, "lamb": 2}  # float32 arrays of optimizer state per parameter


def analytic() -> None:
  from date_optax.parallel import update_shard_axis

  print("Optimizer-state MB per device (float32; LARS keeps 1 array per "
        "parameter, LAMB 2):\n")
  print("| tree | params (M) | optimizer | N | whole | shard_update | fraction "
        "| ideal 1/N |")
  print("|---|---:|---|---:|---:|---:|---:|---:|")
  for tree, fn in TREES.items():
    shapes = list(fn().values())
    total = sum(math.prod(s) for s in shapes)
    for opt, k in STATES.items():
      for n in (8, 32, 256):
        split = sum(math.prod(s) // (n if update_shard_axis(s, n) is not None else 1)
                    for s in shapes)
        print(f"| {tree} | {total / 1e6:.1f} | {opt} | {n} | {4 * k * total / 1e6:.1f} "
              f"| {4 * k * split / 1e6:.2f} | {split / total:.4f} | {1 / n:.4f} |")


def measure(tree: str, steps: int) -> None:
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  flag = "--xla_force_host_platform_device_count=8"
  if flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
  import jax
  import jax.numpy as jnp
  import numpy as np
  from tqdm import tqdm

  import date_optax
  import date_optax.parallel as dp

  shapes = TREES[tree]()
  rng = np.random.default_rng(0)
  params = {k: 0.05 * rng.standard_normal(s, dtype=np.float32)
            for k, s in shapes.items()}
  batch = np.ones((64, 1), np.float32)

  def loss_fn(p, b):
    return 1e-3 * jnp.mean(b) * sum(jnp.sum(w * w) for w in jax.tree.leaves(p))

  mesh = dp.data_mesh()
  print(f"\n{tree}: {sum(x.size for x in params.values()) / 1e6:.1f}M params, "
        f"date_optax.lamb, 8 emulated CPU devices, median of {steps} steps; "
        f"jax {jax.__version__}, {platform.python_version()}, {os.cpu_count()} cores\n")
  # Both steps are built first and then timed alternately, so that load from
  # other processes on the machine falls on both alike.
  steps_, states = {}, {}
  for shard_update in tqdm((False, True), desc="compile"):
    step = dp.make_train_step(loss_fn, date_optax.lamb(1e-3, weight_decay=1e-4), mesh,
                              shard_update=shard_update)
    state, _ = step(step.init(params), batch)
    steps_[shard_update], states[shard_update] = step, jax.block_until_ready(state)
  samples = {False: [], True: []}
  for _ in tqdm(range(steps), desc="steps"):
    for su in (False, True):
      t0 = time.perf_counter()
      states[su], _ = steps_[su](states[su], batch)
      jax.block_until_ready(states[su])
      samples[su].append(time.perf_counter() - t0)
  results = {su: (dp.bytes_per_device(states[su].opt_state),
                  dp.bytes_per_device(states[su].params),
                  statistics.median(samples[su])) for su in (False, True)}
  base = results[False]
  print("| shard_update | opt-state MB / device | x unsharded | params MB / device "
        "| step ms | x unsharded |")
  print("|---|---:|---:|---:|---:|---:|")
  for su, (ob, pb, t) in results.items():
    print(f"| {su} | {ob / 1e6:.1f} | {ob / base[0]:.3f} | {pb / 1e6:.1f} "
          f"| {t * 1e3:.0f} | {t / base[2]:.2f} |")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tree", choices=sorted(TREES), default="resnet50")
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--no-measure", action="store_true")
  args = parser.parse_args(argv)
  analytic()
  if not args.no_measure:
    measure(args.tree, args.steps)


if __name__ == "__main__":
  main()
