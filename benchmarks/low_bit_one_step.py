"""One step of an adversarially scaled model through a low-bit ring all-reduce.

The case of issue 24: a 4-layer MLP whose layers' gradients have scales
1e-8, 1e-4, 1 and 1e4 (each layer's gradient is multiplied by its scale, the
forward pass unchanged), one step's gradient on 8 emulated devices (32
examples each), summed over the devices by the ring all-reduce of
`date_optax.parallel.all_reduce` with the payload in int8, fp8, int4 or fp4
and each of the scalings:

  aps       the per-layer power-of-two shift from one `pmax` (Han, Demmel and
            You 2020, https://arxiv.org/abs/2003.00119), fixed for all hops
  measured  `measured_shift=True`: one shift per layer piece, measured on the
            partial sum at every hop
  block32   `block_size=32`: MX-style block scales, measured at every hop
  block16   `block_size=16`

against the float32 ring all-reduce of the same gradients. Reported per
layer: `||g_low - g_32|| / ||g_32||` in percent, and the worst elementwise
error in units of the layer's `N · M` (N replicas, M the largest
per-replica value), the quantity the documented bounds control
(docs/algorithms.md, "Block scaling and the measured shift").

Usage:
  python benchmarks/low_bit_one_step.py            # the table (~1 min on CPU)
  python benchmarks/low_bit_one_step.py --seeds 3  # worst over 3 seeds
"""

from __future__ import annotations

import argparse
import os
import sys

N = 8
SCALES = (1e-8, 1e-4, 1.0, 1e4)
SIZES = (64, 128, 128, 128, 16)  # input, three hidden, output
FORMATS = ("int8", "float8_e4m3fn", "int4", "float4_e2m1fn")
MODES = {
    "aps": dict(aps=True),
    "measured": dict(measured_shift=True),
    "block32": dict(block_size=32),
    "block16": dict(block_size=16),
}


def local_gradients(seed: int = 0):
  """Per-replica gradients, (N, ...) per leaf, already divided by N (the mean)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  rng = np.random.default_rng(seed)
  params = {
      f"layer{i}": {
          "w": (rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32),
          "b": np.zeros(b, np.float32),
      }
      for i, (a, b) in enumerate(zip(SIZES[:-1], SIZES[1:], strict=True))
  }
  x = rng.normal(size=(N, 32, SIZES[0])).astype(np.float32)
  y = rng.normal(size=(N, 32, SIZES[-1])).astype(np.float32)

  def scaled(p, s):  # forward value p, gradient s · dL/dp
    return jax.lax.stop_gradient(p) * (1 - s) + s * p

  def loss(p, xb, yb):
    h = xb
    for i, s in enumerate(SCALES):
      layer = jax.tree.map(lambda v, s=s: scaled(v, s), p[f"layer{i}"])
      h = h @ layer["w"] + layer["b"]
      if i < len(SCALES) - 1:
        h = jnp.tanh(h)
    return jnp.mean((h - yb) ** 2)

  grads = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, x, y)
  return jax.tree.map(lambda g: np.asarray(g) / N, grads)


def ring_sum(tree, **kw):
  """The ring all-reduce over 8 devices of (N, ...) rows; device 0's result."""
  import jax
  import numpy as np
  from jax.sharding import PartitionSpec as P

  import date_optax.parallel as dp

  mesh = dp.data_mesh()
  fn = jax.jit(jax.shard_map(
      lambda t: jax.tree.map(lambda v: v[None], dp.all_reduce(
          jax.tree.map(lambda v: v[0], t), "data", algorithm="ring", **kw)),
      mesh=mesh, in_specs=P("data"), out_specs=P("data"), check_vma=False))
  return jax.tree.map(lambda v: np.asarray(v)[0], fn(tree))


def layer_errors(seed: int = 0, formats=FORMATS, modes=tuple(MODES)) -> dict:
  """{(fmt, mode): {layer: (relative L2 error %, max error / (N · M))}}."""
  import jax
  import numpy as np

  grads = local_gradients(seed)
  exact = ring_sum(grads)
  out = {}
  for fmt in formats:
    for mode in modes:
      got = ring_sum(grads, comm_dtype=fmt, **MODES[mode])
      row = {}
      for i in range(len(SCALES)):
        name = f"layer{i}"
        e = np.concatenate([np.ravel(v) for v in jax.tree.leaves(exact[name])])
        g = np.concatenate([np.ravel(v) for v in jax.tree.leaves(got[name])])
        local = np.concatenate([np.reshape(v, (N, -1)) for v in
                                jax.tree.leaves(grads[name])], axis=1)
        nm = N * np.abs(local).max()
        row[name] = (100 * float(np.linalg.norm(g - e) / np.linalg.norm(e)),
                     float(np.abs(g - e).max() / nm))
      out[(fmt, mode)] = row
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, default=1)
  args = parser.parse_args(argv)
  import platform

  import jax

  worst: dict = {}
  for seed in range(args.seeds):
    for key, row in layer_errors(seed).items():
      prev = worst.get(key, {})
      worst[key] = {k: tuple(max(a, b) for a, b in zip(v, prev.get(k, (0, 0)),
                                                       strict=True))
                    for k, v in row.items()}
  print(f"# {jax.device_count()} {jax.devices()[0].platform} devices, "
        f"{platform.processor() or platform.machine()}, seeds {args.seeds} (worst)\n")
  print("Per-layer ||g - g32|| / ||g32|| (%), gradient scales "
        + ", ".join(f"{s:g}" for s in SCALES) + "\n")
  names = [f"layer{i} ({s:g})" for i, s in enumerate(SCALES)]
  print("| payload | scaling | " + " | ".join(names) + " | max err / (N·M) |")
  print("|---|---|" + "---:|" * (len(names) + 1))
  for (fmt, mode), row in worst.items():
    cells = " | ".join(f"{row[f'layer{i}'][0]:.2f}" for i in range(len(SCALES)))
    nm = max(v[1] for v in row.values())
    print(f"| {fmt} | {mode} | {cells} | {nm:.4f} |")
  return 0


if __name__ == "__main__":
  os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  sys.exit(main())
