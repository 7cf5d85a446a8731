"""One command for the accelerator: optimizer-step and train-step ratios.

Runs the two speed benchmarks on whatever JAX finds (GPU, TPU; on a CPU, on
``--cpu-devices`` emulated devices) and writes ``DIR/bench_device.json`` and
``DIR/bench_device.md``: the device (kind, platform, count), the JAX, jaxlib,
optax and flax versions, and each ratio as the median [min-max] over repeats,
next to its goal.

- Optimizer step (``benchmarks/optimizer_step.py``'s ``run_tree``): one jitted
  ``update`` + ``apply_updates`` on ResNet-50-, BERT-base- and many-small-leaf
  trees ("small<N>": 400 leaves by default, ``--trees ...,small1000`` for
  1,000), the optimizers' steps called in turn (``time_alternating``), each
  waited for with ``jax.block_until_ready``. Ratios: date_optax.lars /
  optax.lars and date_optax.lamb / optax.lamb (goal <= 1.0: the same math
  no slower than optax), LARS / momentum SGD (<= 1.3) and LAMB / AdamW
  (<= 1.5), issue 11's goals for the base optimizers' cost. The parameters
  after the steps are compared with optax's (``max_abs_diff``).
- Train step (``benchmarks/train_step.py``'s ``step_runners``): the library's
  ``make_train_step`` (LAMB, an MLP) with ``grad_stats`` off and on against a
  plain ``jax.jit`` step, and the library's compiled program called without
  its Python wrapper (the device's share of the cost), called in turn; goal
  <= 1.05; and the compiled steps' kernel counts. Meshes: the
  data mesh over all devices and, where the count is even, (n/2, 2) with FSDP
  rules (one device: the 1-device data mesh only).

Sizes default per platform (an accelerator gets a bigger MLP); ``--budget-s``
(default 240 s, compilation included) is shared out over the trees and
meshes, and a repeat that would end after its share is not started.

Usage (from the repository root):
  PYTHONPATH=. python3 benchmarks/bench_device.py --out DIR   # or: make bench-device
  python3 benchmarks/bench_device.py --quick --out /tmp/bd    # smoke test, ~10 s on a CPU
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import math
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (section, numerator, denominator, goal)
OPT_RATIOS = [
    ("date_optax.lars / optax.lars", "date_optax.lars", "optax.lars", 1.0),
    ("date_optax.lamb / optax.lamb", "date_optax.lamb", "optax.lamb", 1.0),
    ("LARS / momentum SGD", "date_optax.lars", "optax.sgd(momentum)", 1.3),
    ("LAMB / AdamW", "date_optax.lamb", "optax.adamw", 1.5),
]
OPTIMIZERS = ("optax.sgd(momentum)", "optax.adamw", "optax.lars", "optax.lamb",
              "date_optax.lars", "date_optax.lamb")
STEP_RATIOS = [
    ("library step / plain jit step", "lib", 1.05),
    ("library step (grad_stats) / plain jit step", "lib+grad_stats", 1.05),
    # The compiled program alone (no Python wrapper): the device's share.
    ("library program, no wrapper / plain jit step", "lib program", 1.05),
]

# Per platform: optimizer trees, steps per run, runs; MLP and calls per run.
# "small<N>" is N small leaves: 400, not 1,000, by default, because compiling
# the six optimizers on 1,000 leaves took 170 s on an H200 (jax 0.11.2), more
# than the budget leaves for it; `--trees small1000 --budget-s 400` runs it.
DEFAULTS = {
    "accelerator": dict(trees="resnet50,bert_base,small400", steps=30, repeats=5,
                        batch=2048, width=2048, depth=8, d_in=1024, reps=30),
    # The CPU leaves BERT-base out: all six optimizers' states are alive at once.
    "cpu": dict(trees="resnet50,small400", steps=10, repeats=3,
                batch=256, width=512, depth=4, d_in=256, reps=20),
    "quick": dict(trees="small64", steps=10, repeats=2,
                  batch=64, width=64, depth=2, d_in=32, reps=5),
}


def parse_args(argv=None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="tmp/bench_device",
                  help="directory for bench_device.json and bench_device.md")
  ap.add_argument("--quick", action="store_true",
                  help="smoke test: a 64-leaf tree, a tiny MLP, 2 repeats")
  ap.add_argument("--budget-s", type=float, default=240.0,
                  help="time for the whole run, compilation included; trims repeats")
  ap.add_argument("--cpu-devices", type=int, default=8,
                  help="emulated devices when JAX runs on the CPU (no accelerator)")
  ap.add_argument("--trees", default=None,
                  help="optimizer trees (optimizer_step.TREES keys, comma-separated)")
  ap.add_argument("--steps", type=int, default=None, help="optimizer steps per run")
  ap.add_argument("--repeats", type=int, default=None,
                  help="runs of each benchmark (ratios: median [min-max] over them)")
  ap.add_argument("--batch", type=int, default=None, help="train step: global batch")
  ap.add_argument("--width", type=int, default=None, help="train step: MLP width")
  ap.add_argument("--depth", type=int, default=None, help="train step: MLP layers")
  ap.add_argument("--d-in", type=int, default=None, help="train step: input features")
  ap.add_argument("--reps", type=int, default=None, help="train step: calls per run")
  ap.add_argument("--skip", default="", choices=["", "optimizer", "train"],
                  help="leave out one of the two benchmarks")
  return ap.parse_args(argv)


def _versions() -> dict:
  out = {"python": platform.python_version()}
  for pkg in ("jax", "jaxlib", "optax", "flax", "numpy", "jax-cuda13-plugin",
              "jax-cuda12-plugin", "libtpu"):
    try:
      out[pkg] = importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
      pass
  return out


def _git(*cmd: str) -> str:
  try:
    return subprocess.run(["git", *cmd], cwd=ROOT, text=True, capture_output=True,
                          timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return ""


def _commit() -> str | None:
  """HEAD, with "+changes" when the library or benchmarks differ from it."""
  head = _git("rev-parse", "--short", "HEAD")
  if not head:
    return None
  changed = _git("status", "--porcelain", "--", "date_optax", "benchmarks")
  return head + ("+changes" if changed else "")


def _source_digest() -> str:
  """The first 12 hex digits of a SHA-256 over the library's source files.

  Names the code that ran even where the git metadata does not (a copy of a
  working tree on another machine, an unpacked archive).
  """
  h = hashlib.sha256()
  for path in sorted(pathlib.Path(ROOT, "date_optax").rglob("*.py")):
    h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
  return h.hexdigest()[:12]


def _ratio(name, section, case, runs, goal, num_ms, den_ms) -> dict:
  med = statistics.median(runs)
  return dict(name=name, section=section, case=case, median=med, min=min(runs),
              max=max(runs), runs=runs, goal=goal, meets_goal=med <= goal,
              num_ms=num_ms, den_ms=den_ms)


def run(args) -> dict:
  """Runs both benchmarks and returns the results (also written under args.out)."""
  if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # Only the host (CPU) platform reads this; an accelerator is unaffected.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.cpu_devices}")
  sys.path.insert(0, ROOT)
  import jax  # noqa: PLC0415 - after the device count is set

  from benchmarks import optimizer_step, train_step  # noqa: PLC0415

  t_start = time.perf_counter()
  dev = jax.devices()[0]
  device = dict(kind=dev.device_kind, platform=dev.platform, count=jax.device_count())
  mode = "quick" if args.quick else ("cpu" if dev.platform == "cpu" else "accelerator")
  cfg = dict(DEFAULTS[mode])
  for k in cfg:
    if getattr(args, k) is not None:
      cfg[k] = getattr(args, k)
  n = device["count"]
  cfg["batch"] = -(-cfg["batch"] // n) * n  # a multiple of the data axis
  versions = _versions()
  print(f"bench_device: {device['kind']} ({device['platform']} x{n}), "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + f"; {mode} settings {cfg}; budget {args.budget_s:.0f} s", flush=True)
  results = dict(device=device, versions=versions, mode=mode, settings=cfg,
                 budget_s=args.budget_s, commit=_commit(), source_digest=_source_digest(),
                 command=" ".join(["benchmarks/bench_device.py", *args.argv]),
                 ratios=[], optimizer_step={}, train_step={})
  trees = [] if args.skip == "optimizer" else cfg["trees"].split(",")
  mesh_names = [] if args.skip == "train" else list(train_step.meshes())
  # Many-leaf trees last: their compilation is the longest (on an H200, 170 s
  # for the six optimizers on small1000), and the budget may run out there.
  many = [t for t in trees if t.startswith("small")]
  items = ([("optimizer", t) for t in trees if t not in many]
           + [("train", m) for m in mesh_names] + [("optimizer", t) for t in many])
  if mesh_names:
    ns = argparse.Namespace(**{k: cfg[k] for k in ("batch", "width", "depth", "d_in")})
    results["train_step"]["mlp"] = (f"{cfg['d_in']}->{cfg['width']}x{cfg['depth']}->8, "
                                     f"LAMB, global batch {cfg['batch']}")

  def log(msg):
    print(f"[{time.perf_counter() - t_start:6.1f} s] {msg}", flush=True)

  def optimizer_item(tree, end):
    r = optimizer_step.run_tree(tree, cfg["steps"], cfg["repeats"], check=True,
                                names=OPTIMIZERS, alternate=True, deadline=end)
    rows = r["rows"]
    results["optimizer_step"][tree] = r
    for name, num, den, goal in OPT_RATIOS:
      runs = [a / b for a, b in zip(rows[num]["ms_runs"], rows[den]["ms_runs"])]
      results["ratios"].append(_ratio(name, "optimizer step", f"{tree} ({r['leaves']} leaves)",
                                      runs, goal, rows[num]["ms"], rows[den]["ms"]))

  def train_item(mesh, end):
    programs = {}
    runs = train_step.step_runners(mesh, ns, grad_stats=(False, True), programs=programs)
    kernels = {k: optimizer_step.hlo_stats(c) for k, c in programs.items()}
    times = {k: [] for k in runs}
    for rep in range(cfg["repeats"]):
      t_rep = time.perf_counter()
      for k, t in train_step.time_round_robin(runs, cfg["reps"], warmup=2 - min(rep, 1)).items():
        times[k].append(1e3 * t)
      now = time.perf_counter()
      if rep + 1 < cfg["repeats"] and now + (now - t_rep) > end:
        log(f"  stopping after {rep + 1} of {cfg['repeats']} repeats: time budget")
        break
    ms = {k: statistics.median(v) for k, v in times.items()}
    log("  " + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()))
    log("  compiled: " + ", ".join(f"{k} {v['fusions']} fusions, {v['kernels']} kernels"
                                   for k, v in kernels.items()))
    results["train_step"][mesh] = dict(ms_runs=times, ms=ms, compiled=kernels)
    for name, key, goal in STEP_RATIOS:
      if key == "lib+grad_stats" and train_step.meshes()[mesh][0] == 1:
        name = name.replace("(grad_stats)", "(grad_stats, 2 microbatches)")  # step_runners
      r = [a / b for a, b in zip(times[key], times["plain"])]
      results["ratios"].append(_ratio(name, "train step", mesh, r, goal, ms[key], ms["plain"]))

  results["skipped"] = []
  for i, (kind, name) in enumerate(items):
    now = time.perf_counter()
    left = args.budget_s - (now - t_start)
    if left <= 0:
      log(f"skipping the {kind} step on {name}: the {args.budget_s:.0f} s budget is spent")
      results["skipped"].append(f"{kind} step: {name}")
      continue
    end = now + left / (len(items) - i)  # an equal share of the time left
    log(f"{kind} step, {name} ({end - now:.0f} s for it)")
    (optimizer_item if kind == "optimizer" else train_item)(name, end)
    write(results, args.out, t_start)  # after every item: a cut-off run keeps its results
  md = write(results, args.out, t_start)
  print("\n" + md, flush=True)
  log(f"wrote {args.out}/bench_device.json and bench_device.md")
  return results


def write(results: dict, out: str, t_start: float) -> str:
  """Writes bench_device.json and bench_device.md to `out`; returns the Markdown."""
  results["elapsed_s"] = time.perf_counter() - t_start
  results["over_budget"] = results["elapsed_s"] > results["budget_s"]
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "bench_device.json"), "w") as f:
    json.dump(results, f, indent=2)
  md = markdown(results)
  with open(os.path.join(out, "bench_device.md"), "w") as f:
    f.write(md)
  return md


def markdown(results: dict) -> str:
  """The results as a Markdown section: the device, the versions, one table."""
  d, v = results["device"], results["versions"]
  lines = [
      f"### bench_device: {d['kind']} ({d['platform']} x{d['count']})", "",
      "Versions: " + ", ".join(f"{k} {x}" for k, x in v.items()) + ".",
      f"Command: `{results['command']}` ({results['mode']} settings, commit "
      f"{results['commit'] or 'unknown'}, library source "
      f"{results.get('source_digest') or 'unknown'}); {results['elapsed_s']:.0f} s of a "
      f"{results['budget_s']:.0f} s budget"
      + (" (over budget)" if results["over_budget"] else "") + ".",
  ]
  if results["train_step"]:
    lines.append(f"Train step: MLP {results['train_step']['mlp']}.")
  lines += [
      "Each ratio is the median [min-max] over runs (repeats); a run's time is the "
      "median of alternating calls, each waited for with `jax.block_until_ready`.", "",
      "| benchmark | case | ratio | median | [min-max] | runs | goal | meets | ms (num / den) |",
      "|---|---|---|---:|---|---:|---:|---|---|",
  ]
  for r in results["ratios"]:
    lines.append(
        f"| {r['section']} | {r['case']} | {r['name']} | {r['median']:.3f} | "
        f"[{r['min']:.3f}-{r['max']:.3f}] | {len(r['runs'])} | <= {r['goal']:.2f} | "
        f"{'yes' if r['meets_goal'] else 'no'} | {r['num_ms']:.3f} / {r['den_ms']:.3f} |")
  if results["skipped"]:
    lines += ["", "Not run (time budget spent): " + "; ".join(results["skipped"]) + "."]
  diffs = [f"{tree} {name} {row['max_abs_diff_vs_ref']:.1e}"
           for tree, t in results["optimizer_step"].items()
           for name, row in t["rows"].items() if "max_abs_diff_vs_ref" in row]
  if diffs:
    lines += ["", "Largest |date_optax - optax| parameter difference after the steps: "
              + "; ".join(diffs) + "."]
  counts = [f"{mesh}: " + ", ".join(f"{k} {v['fusions']} fusions ({v['kernels']} kernels)"
                                    for k, v in t["compiled"].items())
            for mesh, t in results["train_step"].items()
            if isinstance(t, dict) and "compiled" in t]
  if counts:
    lines += ["", "Compiled train steps: " + "; ".join(counts) + "."]
  return "\n".join(lines) + "\n"


def main(argv=None) -> int:
  args = parse_args(argv)
  args.argv = sys.argv[1:] if argv is None else list(argv)
  sys.stdout.reconfigure(line_buffering=True)
  results = run(args)
  bad = [r["name"] for r in results["ratios"] if not math.isfinite(r["median"])]
  if bad:
    print(f"non-finite ratios: {bad}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
