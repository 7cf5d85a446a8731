#!/usr/bin/env python3
"""Print the batch layout and DATE/LEGW ResNet-50 recipe for TPU slices.

Runs nothing in the cloud. The recipe comes from `date_optax.scale_recipe`
and the batch-norm layout from `date_optax.nn.bn_group_layout`, so these
tables are the library's own (a test checks that tpu/README.md shows exactly
this output):

  slice layout   TensorCores, chips, JAX devices and hosts per accelerator type
  global batch   TensorCores x --batch-per-core (128, the best ratio at 32K on
                 256 v3 cores in You et al., 2020)
  BN layout      ghost groups of --bn-batch (64) per device, or a distributed
                 BN group of 64 / per-device-batch devices; "no layout" where
                 bn_group_layout refuses (it lists the nearest that work)
  LEGW recipe    k = B / 1024; peak LR 2^2.5 * sqrt(k); warmup 0.3125 * k
                 epochs; 90 epochs of ImageNet (1,281,167 images); poly power 2
  compiled       the example's step compiled for each slice by the TPU
                 compiler (benchmarks/tpu_compile.py's log, --compiled): HBM
                 per device, estimated step time and images/s. Compiler
                 estimates, not measurements

Needs date_optax (and so JAX) importable, unlike the gcloud scripts:

  .venv/bin/python tpu/plan.py                          # the README tables
  .venv/bin/python tpu/plan.py --accelerator-type=v4-128 --batch-per-core=64
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import _flags
import _slices

# Run from a checkout without installing: the recipe and the BN layout come
# from the library itself, so this table and date_optax cannot disagree.
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from date_optax import Baseline, scale_recipe  # noqa: E402
from date_optax.nn import bn_group_layout  # noqa: E402
from date_optax.schedules import Poly  # noqa: E402

README_SLICES = ("v2-32", "v3-32", "v4-32")
# LEGW (You et al., 2019) Table 1 batch sizes.
TABLE1_BATCHES = tuple(1024 * 2**j for j in range(6))
IMAGENET_TRAIN_EXAMPLES = 1_281_167  # ILSVRC-2012 training set
BATCH_PER_CORE = 128  # You et al., 2020: best at 32K on 256 v3 cores
BN_BATCH = 64  # effective batch-norm batch (Ying et al., 2018)
_HBM = {
  "v2": "8 GiB per TensorCore",
  "v3": "16 GiB per TensorCore",
  "v4": "32 GiB per chip",
}

# The tuned ResNet-50 baseline of LEGW Table 1: B0 = 1024, peak LR 2^2.5,
# 0.3125 warmup epochs, 90 epochs, poly decay of power 2.
RESNET50 = Baseline(
  batch_size=1024,
  learning_rate=2.0**2.5,
  warmup_epochs=0.3125,
  epochs=90,
  num_examples=IMAGENET_TRAIN_EXAMPLES,
  decay=Poly(power=2),
)


def bn_cell(global_batch: int, devices: int, bn_batch: int) -> str:
  """The BN layout `date_optax.nn.bn_group_layout` gives, or why it refuses."""
  if global_batch % devices:
    return f"batch does not split over {devices} devices"
  per_device = global_batch // devices
  try:
    layout = bn_group_layout(bn_batch, per_device_batch=per_device, num_replicas=devices)
  except ValueError as e:
    near = str(e).rsplit("Nearest that work: ", 1)[-1].rstrip(".")
    return f"no layout of {bn_batch} (nearest: {near})"
  if layout.group_size > 1:
    return f"distributed BN over {layout.group_size} devices"
  if layout.ghosts_per_device > 1:
    return f"{layout.ghosts_per_device} ghost groups per device"
  return "1 group per device"


def _num(x: float) -> str:
  return f"{x:g}" if x == int(x) else f"{x:.2f}"


def slice_table(accels, per_core: int, bn_batch: int) -> str:
  rows = [
    "| slice | chips | TensorCores | JAX devices | hosts | HBM | global batch "
    f"({per_core}/TensorCore) | batch per JAX device | BN layout (batch {bn_batch}) |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for a in accels:
    lay = _slices.parse_accelerator_type(a)
    batch = lay.cores * per_core
    rows.append(
      f"| {a} | {lay.chips} | {lay.cores} | {lay.devices} | {lay.hosts} | "
      f"{_HBM.get(lay.generation, '-')} | {batch} | {_num(batch / lay.devices)} | "
      f"{bn_cell(batch, lay.devices, bn_batch)} |"
    )
  return "\n".join(rows)


def recipe_table(batches, per_core: int) -> str:
  rows = [
    "| B | k = B/1024 | peak LR | warmup epochs | steps/epoch | total steps "
    f"| warmup steps | TensorCores at {per_core}/core | slices of that size |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for batch in batches:
    r = scale_recipe(RESNET50, batch)
    log2_lr = math.log2(r.peak_learning_rate)
    cores = batch / per_core
    names = []
    if cores == int(cores):
      for gen in ("v2", "v3", "v4"):
        g = _slices.GENERATIONS[gen]
        if int(cores) in g.sizes:
          names.append(f"{gen}-{int(cores)}")
    rows.append(
      f"| {batch} | {_num(r.scale)} | 2^{log2_lr:.1f} = {r.peak_learning_rate:.3f} | "
      f"{r.warmup_epochs:g} | {r.steps_per_epoch:.2f} | {r.total_steps} | "
      f"{r.warmup_steps} | {_num(cores)} | {', '.join(names) or 'none of v2/v3/v4'} |"
    )
  return "\n".join(rows)


def on_slice_table(accels, batches, bn_batch: int) -> str:
  head = " | ".join(accels)
  rows = [
    f"| B | {head} |",
    "|---|" + "---|" * len(accels),
  ]
  for batch in batches:
    cells = []
    for a in accels:
      lay = _slices.parse_accelerator_type(a)
      cells.append(
        f"{_num(batch / lay.cores)}/core, {_num(batch / lay.devices)}/device, "
        f"{bn_cell(batch, lay.devices, bn_batch)}"
      )
    rows.append(f"| {batch} | " + " | ".join(cells) + " |")
  return "\n".join(rows)


#: The TPU-compile study's log (benchmarks/tpu_compile.py), read by --compiled.
COMPILED_LOG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "docs", "studies", "tpu_compile", "tpu_compile.jsonl")


def compiled_table(log: str) -> str:
  """The ResNet-50 step as the TPU compiler compiled it for each slice.

  Rows ``r50/<slice>`` (128 images per core) and ``r50-32k/<slice>`` (the
  seeds' 32K) of the study's log; every number is the compiler's: memory is
  its per-device account, time its cost model's estimate.
  """
  import json  # noqa: PLC0415

  runs = {}
  with open(log) as f:
    for line in f:
      rec = json.loads(line)
      runs[rec.pop("ident")] = rec
  rows = [
    "| row | JAX devices | batch per device | GiB per device (compiler) | HBM per device "
    "| fits | est. step ms | est. images/s | est. FLOP utilisation |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for name in sorted(runs, key=lambda n: (n.split("/")[0], n)):
    rec = runs[name]
    if not name.startswith(("r50/", "r50-32k/")) or name.count("/") != 1 or "error" in rec:
      continue
    p = rec["programs"][0]
    t = p["estimated_seconds"]  # None: the cost model gives no time (v4, v5e)
    timing = ("no estimate | | " if t is None else
              f"{t * 1e3:.1f} | {p['examples_per_second']:,.0f} | {p['mfu']:.0%} ")
    rows.append(
      f"| {name} | {p['num_devices']} | {_num(p['global_batch'] / p['num_devices'])} | "
      f"{p['total_bytes'] / 2**30:.2f} | {p['hbm_bytes'] / 2**30:g} GiB | "
      f"{'yes' if p['fits'] else 'no'} | {timing}|"
    )
  return "\n".join(rows)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument(
    "--accelerator-type",
    action="append",
    type=_flags.checked(_slices.parse_accelerator_type),
    help="Slice(s) to describe (repeatable); default v2-32, v3-32, v4-32.",
  )
  p.add_argument("--batch-per-core", type=int, default=BATCH_PER_CORE)
  p.add_argument("--bn-batch", type=int, default=BN_BATCH)
  p.add_argument("--compiled", default=COMPILED_LOG,
                 help="the TPU-compile study's log (benchmarks/tpu_compile.py); "
                      "'' leaves the compiled table out")
  args = p.parse_args(argv)
  if args.batch_per_core <= 0:
    p.error("argument --batch-per-core: must be a positive integer")
  if args.bn_batch <= 0:
    p.error("argument --bn-batch: must be a positive integer")
  accels = [a.accelerator_type for a in args.accelerator_type or []]
  accels = accels or list(README_SLICES)
  batches = sorted(
    set(TABLE1_BATCHES)
    | {_slices.parse_accelerator_type(a).cores * args.batch_per_core for a in accels}
  )
  print("### Slices\n")
  print(slice_table(accels, args.batch_per_core, args.bn_batch))
  print("\n### LEGW recipe (ResNet-50, 90 epochs, poly power 2)\n")
  print(recipe_table(batches, args.batch_per_core))
  print("\n### Every recipe batch on these slices\n")
  print(on_slice_table(accels, batches, args.bn_batch))
  if args.compiled and os.path.exists(args.compiled):
    print("\n### Compiled by the TPU compiler (estimates, not measurements)\n")
    print(compiled_table(args.compiled))
  return 0


if __name__ == "__main__":
  sys.exit(main())
