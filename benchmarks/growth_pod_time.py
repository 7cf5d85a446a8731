"""Time to train on a pod, growing against B0: the study's runs priced per step.

Issue 48's pod goal: the growing run's time to train at most a third of
B0's at the same examples, estimated on the TPU compiler. This script joins
two logs written by other scripts:

* the batch sizes every adaptive run of `benchmarks/batch_growth.py` took,
  step by step (its curve keeps every step where the batch changes and the
  one before, so the steps at each batch are exact), and
* the TPU compiler's estimated step time of each program of the MNIST-1D
  example's schedule on a v3-128 (`benchmarks/tpu_compile.py`, row
  ``growth/v3-128``: B0 = 256, two rows per core, rows first, up to 64·B0).

A run's batches are read in units of its B0 (k = B/B0) and priced at the
v3-128 program of 256·k; B0's run is its steps at 256. Only the LSTM tasks
are priced (the programs are the LSTM's; the CNN's and BERT's are not
compiled here). Every number is the
compiler's estimate (`optimal_seconds`), and the LSTM's time loop is
costed once per program (XLA counts a loop body once), so only ratios mean
something. The study ran on CPU devices with its own B0; the pod B0 of 256
is the smallest batch that puts rows on all 128 cores.

  python benchmarks/growth_pod_time.py   # prints the table, writes pod_time.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _paths  # noqa: E402
import _runlog  # noqa: E402

POD_B0 = 256


def program_seconds(compile_log: str, ident: str = "growth/v3-128") -> dict[int, float]:
  """Estimated seconds per step of each batch's program (by batch size)."""
  with open(compile_log) as f:
    for line in f:
      rec = json.loads(line)
      if rec.get("ident") == ident:
        return {p["global_batch"]: p["estimated_seconds"] for p in rec["programs"]}
  raise SystemExit(f"no {ident!r} row in {compile_log}: run benchmarks/tpu_compile.py")


def steps_per_ratio(curve: list[dict], steps: int, b0: int) -> dict[int, int]:
  """Steps taken at each k = B/B0, from a curve that keeps every change."""
  out: dict[int, int] = {}
  for p, q in zip(curve, curve[1:] + [{"step": steps}]):
    k = p["batch"] // b0
    out[k] = out.get(k, 0) + q["step"] - p["step"]
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--growth-log", default=_paths.study("batch_growth") + ".jsonl")
  p.add_argument("--compile-log", default=_paths.study("tpu_compile") + ".jsonl")
  p.add_argument("--method", default="adaptive_t3,adaptive,adaptive_linear_t3",
                 help="the study's rows to price, comma-separated (adaptive_t3: "
                      "BatchSchedule.adaptive's defaults; adaptive: threshold 2)")
  p.add_argument("--out", default=os.path.join(
      os.path.dirname(_paths.study("batch_growth")), "pod_time.md"))
  args = p.parse_args(argv)
  est = program_seconds(args.compile_log)
  methods = args.method.split(",")
  runs, base = [], {}
  for rec in _runlog.load_runs(args.growth_log).values():  # the log and its shards
    key = rec["key"]
    if key["method"] == "baseline":
      base[key["task"]] = rec["steps"]
    elif key["method"] in methods and rec.get("curve") and "lstm" in key["task"]:
      runs.append(rec)
  lines = [
      "| task | row | seed | steps (B0's) | batches reached (k) | est. time, growing / B0 |",
      "|---|---|---:|---:|---|---:|",
  ]
  ratios = []
  for rec in sorted(runs, key=lambda r: (r["key"]["task"], methods.index(r["key"]["method"]),
                                         r["key"]["seed"])):
    curve, b0 = rec["curve"], rec["curve"][0]["batch"]
    per_k = steps_per_ratio(curve, rec["steps"], b0)
    missing = [k for k in per_k if POD_B0 * k not in est]
    if missing:
      print(f"skip {rec['key']['task']} seed {rec['key']['seed']}: no program at k={missing}")
      continue
    growing = sum(n * est[POD_B0 * k] for k, n in per_k.items())
    b0_steps = base.get(rec["key"]["task"], rec["examples"] // b0)
    ratio = growing / (b0_steps * est[POD_B0])
    ratios.append((rec["key"]["method"], ratio))
    lines.append(f"| {rec['key']['task']} | {rec['key']['method']} | {rec['key']['seed']} "
                 f"| {rec['steps']} "
                 f"({b0_steps}) | {', '.join(f'{k}: {n}' for k, n in sorted(per_k.items()))} "
                 f"| {ratio:.3f} |")
  if ratios:
    worst = "; ".join(f"{m} {max(r for n, r in ratios if n == m):.3f}"
                      for m in methods if any(n == m for n, _ in ratios))
    lines.append(f"\nLargest ratio per row: {worst} (goal: at most 1/3 = 0.333); "
                 f"{len(ratios)} runs. Estimates of the TPU compiler (v3-128), not "
                 "measured.")
  md = "\n".join(lines) + "\n"
  with open(args.out, "w") as f:
    f.write("# Time to train on a v3-128, growing against B0 (estimates)\n\n"
            "Written by `benchmarks/growth_pod_time.py`: each adaptive run's steps per "
            "batch (k = B/B0) priced at the TPU compiler's estimated step time of the "
            "MNIST-1D program of 256·k on a v3-128 (rows first); B0's run at 256.\n\n" + md)
  print(md)
  return 0


if __name__ == "__main__":
  sys.exit(main())
