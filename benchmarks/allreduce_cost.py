"""All-reduce cost model on TPU-pod shapes, and the algorithms timed on CPU.

Part 1 (model, no devices needed): for pod slices 4x4 ... 32x32 and the
gradient sizes of ResNet-50 and BERT, the alpha-beta cost
(`date_optax.parallel.allreduce_cost`) of one ring over all chips against the
2-D torus algorithm of Ying et al. (2018): latency steps, bytes on the busiest
link, and time. Alpha and beta are inputs, not measurements: the defaults
(5 us per neighbour exchange, 100 GB/s per link and direction) only set the
scale; the step counts and byte counts do not depend on them.

The second table adds the payload dtype (`comm_dtype` of
`allreduce_cost`): the same all-reduces with the gradients sent as float32,
bfloat16, 8-bit (float8 or int8) and 4-bit (int4 or float4_e2m1fn) values;
the bandwidth term shrinks with the bits, the latency term does not.

The third table prices the scales of an int8 payload: the APS `pmax` (one
more all-reduce of 8 bytes per layer before the payload), block scales of 32
elements (8.25 bits per element) and the measured per-layer shift (one
exponent byte per layer on every message); layers are the parameter leaves
of the usual implementations.

Part 2 (--measure, 8 emulated CPU devices): psum, the ppermute ring and the
ppermute torus summing the same buffer on a 2x4 mesh, as ratios to psum
measured in the same run, with the rounds of neighbour exchanges on the
critical path of each compiled program and its number of
collective-permutes. Emulated devices share the host's cores and memory, so
this shows the overhead of the explicit algorithms, not pod behaviour.

Usage:
  python benchmarks/allreduce_cost.py                 # the model table
  python benchmarks/allreduce_cost.py --measure       # + CPU timings
  python benchmarks/allreduce_cost.py --plot docs/images/allreduce_cost.png
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

GRADIENTS = {
    # name: parameters (float32 gradients, 4 bytes each)
    "ResNet-50": 25_557_032,
    "BERT-base": 109_482_240,
    "BERT-large": 335_141_888,
}
LAYERS = {"ResNet-50": 161, "BERT-base": 199, "BERT-large": 391}  # parameter leaves
PODS = [(4, 4), (8, 8), (16, 16), (32, 32)]
SCALINGS = (("int8", {}), ("+ APS pmax", {"aps": True}), ("blocks 32", {"block_size": 32}),
            ("measured shift", {"measured_shift": True}))
PAYLOADS = (("fp32", None), ("bf16", "bfloat16"), ("8-bit", "float8_e4m3fn"),
            ("4-bit", "float4_e2m1fn"))


def model_table(alpha: float, beta: float) -> list[dict]:
  from date_optax.parallel import allreduce_cost

  rows = []
  for name, params in GRADIENTS.items():
    nbytes = 4 * params
    for x, y in PODS:
      ring = allreduce_cost("ring", (x, y), nbytes, alpha=alpha, beta=beta)
      torus = allreduce_cost("torus", (x, y), nbytes, alpha=alpha, beta=beta)
      rows.append(dict(model=name, mb=nbytes / 1e6, pod=f"{x}x{y}", chips=x * y,
                       ring=ring, torus=torus))
  return rows


def print_table(rows: list[dict], alpha: float, beta: float) -> None:
  print(f"alpha = {alpha * 1e6:g} us, beta = {beta:g} s/B "
        f"({1 / beta / 1e9:g} GB/s per link)\n")
  print("| gradients | MB | pod | chips | ring steps | torus steps | ring MB/link "
        "| torus MB/link | ring ms | torus ms | torus / ring |")
  print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
  for r in rows:
    ring, torus = r["ring"], r["torus"]
    print(f"| {r['model']} | {r['mb']:.0f} | {r['pod']} | {r['chips']} "
          f"| {ring.latency_steps} | {torus.latency_steps} "
          f"| {ring.bytes_per_link / 1e6:.1f} | {torus.bytes_per_link / 1e6:.1f} "
          f"| {ring.seconds * 1e3:.2f} | {torus.seconds * 1e3:.2f} "
          f"| {torus.seconds / ring.seconds:.2f} |")


def payload_rows(alpha: float, beta: float) -> list[dict]:
  from date_optax.parallel import allreduce_cost

  rows = []
  for name, params in GRADIENTS.items():
    for x, y in PODS:
      for alg in ("ring", "torus"):
        cost = {label: allreduce_cost(alg, (x, y), 4 * params, alpha=alpha, beta=beta,
                                      comm_dtype=dt)
                for label, dt in PAYLOADS}
        rows.append(dict(model=name, pod=f"{x}x{y}", alg=alg, cost=cost))
  return rows


def print_payload_table(rows: list[dict]) -> None:
  labels = [label for label, _ in PAYLOADS]
  print("\nPayload dtype (time in ms; MB/link for the busiest link of float32):\n")
  print("| gradients | pod | algorithm | steps | fp32 MB/link | "
        + " | ".join(f"{lb} ms" for lb in labels) + " | fp32 / 4-bit |")
  print("|---|---|---|---:|---:|" + "---:|" * len(labels) + "---:|")
  for r in rows:
    c = r["cost"]
    print(f"| {r['model']} | {r['pod']} | {r['alg']} | {c['fp32'].latency_steps} "
          f"| {c['fp32'].bytes_per_link / 1e6:.1f} | "
          + " | ".join(f"{c[lb].seconds * 1e3:.2f}" for lb in labels)
          + f" | {c['fp32'].seconds / c['4-bit'].seconds:.2f} |")


def print_scaling_table(alpha: float, beta: float) -> None:
  from date_optax.parallel import allreduce_cost

  labels = [label for label, _ in SCALINGS]
  print("\nScales of an int8 payload (time in ms, latency steps):\n")
  print("| gradients | pod | algorithm | " + " | ".join(labels) + " |")
  print("|---|---|---|" + "---:|" * len(labels))
  for name, params in GRADIENTS.items():
    for x, y in PODS[2:]:
      for alg in ("ring", "torus"):
        cells = []
        for _, kw in SCALINGS:
          layers = LAYERS[name] if kw.get("aps") or kw.get("measured_shift") else None
          c = allreduce_cost(alg, (x, y), 4 * params, alpha=alpha, beta=beta,
                             comm_dtype="int8", layers=layers, **kw)
          cells.append(f"{c.seconds * 1e3:.3f} ({c.latency_steps})")
        print(f"| {name} | {x}x{y} | {alg} | " + " | ".join(cells) + " |")


def plot(rows: list[dict], path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 4))
  for name in GRADIENTS:
    sel = [r for r in rows if r["model"] == name]
    chips = [r["chips"] for r in sel]
    line, = ax.plot(chips, [r["ring"].seconds * 1e3 for r in sel], "o--",
                    label=f"{name}, one ring")
    ax.plot(chips, [r["torus"].seconds * 1e3 for r in sel], "s-",
            color=line.get_color(), label=f"{name}, 2-D torus")
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  ax.set_xlabel("chips (square torus)")
  ax.set_ylabel("all-reduce time, model (ms)")
  ax.set_title("Alpha-beta model: ring vs 2-D torus all-reduce")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print(f"\nwrote {path}")


def measure(mparams: float, reps: int) -> None:
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  flag = "--xla_force_host_platform_device_count=8"
  if flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P
  from tqdm import tqdm

  import date_optax.parallel as dp

  mesh = dp.torus_mesh(2, 4)
  n = int(mparams * 1e6)
  x = jax.device_put(jnp.ones((8, n), jnp.float32), NamedSharding(mesh, P(("x", "y"))))
  print(f"\nCPU, 8 emulated devices on a 2x4 mesh, {n * 4 / 1e6:.1f} MB per device, "
        f"median of {reps}; jax {jax.__version__}, {platform.processor() or 'cpu'}, "
        f"{os.cpu_count()} cores\n")
  times, rounds = {}, {}
  for alg in tqdm(("psum", "ring", "torus"), desc="algorithms"):
    fn = jax.jit(jax.shard_map(
        lambda t, alg=alg: dp.all_reduce(t[0], ("x", "y"), algorithm=alg)[None],
        mesh=mesh, in_specs=P(("x", "y")), out_specs=P(("x", "y")), check_vma=False))
    permutes = dp.collective_permute_rounds(fn.lower(x).compile().as_text())
    rounds[alg] = (max((r for r, _ in permutes), default=0), len(permutes))
    fn(x).block_until_ready()
    samples = []
    for _ in range(reps):
      t0 = time.perf_counter()
      fn(x).block_until_ready()
      samples.append(time.perf_counter() - t0)
    times[alg] = statistics.median(samples)
  print("| algorithm | ms | x psum | ppermute rounds | collective-permutes |")
  print("|---|---:|---:|---:|---:|")
  for alg, t in times.items():
    print(f"| {alg} | {t * 1e3:.1f} | {t / times['psum']:.2f} "
          f"| {rounds[alg][0]} | {rounds[alg][1]} |")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--alpha", type=float, default=5e-6, help="seconds per message")
  parser.add_argument("--beta", type=float, default=1e-11, help="seconds per byte")
  parser.add_argument("--plot", default=None, help="write a PNG here")
  parser.add_argument("--measure", action="store_true", help="time on 8 CPU devices")
  parser.add_argument("--mparams", type=float, default=1.6,
                      help="millions of float32 per device for --measure")
  parser.add_argument("--reps", type=int, default=5)
  args = parser.parse_args(argv)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  rows = model_table(args.alpha, args.beta)
  print_table(rows, args.alpha, args.beta)
  print_payload_table(payload_rows(args.alpha, args.beta))
  print_scaling_table(args.alpha, args.beta)
  if args.plot:
    plot(rows, args.plot)
  if args.measure:
    measure(args.mparams, args.reps)


if __name__ == "__main__":
  main()
