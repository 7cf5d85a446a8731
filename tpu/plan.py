#!/usr/bin/env python3
"""Print the batch layout and DATE/LEGW ResNet-50 recipe for TPU slices.

Runs nothing in the cloud; it computes the tables of tpu/README.md from the
formulas (a test checks that the README shows exactly this output):

  slice layout   TensorCores, chips, JAX devices and hosts per accelerator type
  global batch   TensorCores x --batch-per-core (128: seed 001's ratio)
  BN layout      per-device batch / --bn-batch (64) ghost groups per device;
                 when a device holds fewer than 64, a distributed-BN group of
                 64 / per-device-batch devices instead
  LEGW recipe    k = B / 1024; peak LR 2^2.5 * sqrt(k); warmup 0.3125 * k
                 epochs; 90 epochs of ImageNet (1,281,167 images); poly power 2

  python3 tpu/plan.py                                   # the README tables
  python3 tpu/plan.py --accelerator-type=v4-128 --batch-per-core=64
"""

from __future__ import annotations

import argparse
import sys

import _tpu

README_SLICES = ("v2-32", "v3-32", "v4-32")
# Seed 002 Table 1 batch sizes.
TABLE1_BATCHES = tuple(1024 * 2**j for j in range(6))
_HBM = {
  "v2": "8 GiB per TensorCore",
  "v3": "16 GiB per TensorCore",
  "v4": "32 GiB per chip",
}


def _bn(b: _tpu.BatchLayout) -> str:
  if b.bn_replica_group > 1:
    return f"distributed BN over {b.bn_replica_group} devices"
  if b.ghost_groups_per_device > 1:
    return f"{b.ghost_groups_per_device} ghost groups per device"
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
    lay = _tpu.parse_accelerator_type(a)
    b = _tpu.batch_layout(lay, lay.cores * per_core, bn_batch)
    rows.append(
      f"| {a} | {lay.chips} | {lay.cores} | {lay.devices} | {lay.hosts} | "
      f"{_HBM.get(lay.generation, '-')} | {b.global_batch} | {_num(b.per_device)} | "
      f"{_bn(b)} |"
    )
  return "\n".join(rows)


def recipe_table(batches, per_core: int) -> str:
  rows = [
    "| B | k = B/1024 | peak LR | warmup epochs | steps/epoch | total steps "
    f"| warmup steps | TensorCores at {per_core}/core | slices of that size |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for batch in batches:
    r = _tpu.legw_recipe(batch)
    cores = batch / per_core
    names = []
    if cores == int(cores):
      for gen in ("v2", "v3", "v4"):
        g = _tpu.GENERATIONS[gen]
        if int(cores) in g.sizes:
          names.append(f"{gen}-{int(cores)}")
    rows.append(
      f"| {batch} | {_num(batch / 1024)} | 2^{r.log2_peak_lr:.1f} = {r.peak_lr:.3f} | "
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
      lay = _tpu.parse_accelerator_type(a)
      b = _tpu.batch_layout(lay, batch, bn_batch)
      cells.append(f"{_num(b.per_core)}/core, {_num(b.per_device)}/device, {_bn(b)}")
    rows.append(f"| {batch} | " + " | ".join(cells) + " |")
  return "\n".join(rows)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument(
    "--accelerator-type",
    action="append",
    type=_tpu._checked(_tpu.parse_accelerator_type),
    help="Slice(s) to describe (repeatable); default v2-32, v3-32, v4-32.",
  )
  p.add_argument("--batch-per-core", type=int, default=_tpu.BATCH_PER_CORE)
  p.add_argument("--bn-batch", type=int, default=_tpu.BN_BATCH)
  args = p.parse_args(argv)
  if args.batch_per_core <= 0:
    p.error("argument --batch-per-core: must be a positive integer")
  if args.bn_batch <= 0:
    p.error("argument --bn-batch: must be a positive integer")
  accels = [a.accelerator_type for a in args.accelerator_type or []]
  accels = accels or list(README_SLICES)
  batches = sorted(
    set(TABLE1_BATCHES)
    | {_tpu.parse_accelerator_type(a).cores * args.batch_per_core for a in accels}
  )
  print("### Slices\n")
  print(slice_table(accels, args.batch_per_core, args.bn_batch))
  print("\n### LEGW recipe (ResNet-50, 90 epochs, poly power 2)\n")
  print(recipe_table(batches, args.batch_per_core))
  print("\n### Every recipe batch on these slices\n")
  print(on_slice_table(accels, batches, args.bn_batch))
  return 0


if __name__ == "__main__":
  sys.exit(main())
