"""BERT-style MLM at B0, 4·B0, 16·B0, 64·B0 on the same training tokens: LAMB, AdamW, measured gain.

The model and data are examples/bert_lamb's (a small pre-LN encoder on the
UTF-8 bytes of standard-library docstrings, 15 % masking, exact eval MLM loss
and masked-token accuracy over the held-out modules), trained by the example
itself: each run is `python -m examples.bert_lamb.main
--config=examples/bert_lamb/configs/scaling.py --workdir=...` with
`--config.<field>=` overrides, in a subprocess with 2 emulated CPU devices
(XLA_FLAGS), and the study reads `workdir/results.json` and
`workdir/metrics.csv` (nothing here imports from examples/). The step is
`date_optax.parallel.make_train_step(..., grad_stats=True)` on a 2-replica
data mesh, so every run measures the gradient-noise scale B_simple.
Every run sees the same number of training tokens, so 64·B0 takes 64x fewer
iterations. Five ways to scale a baseline tuned at B0 (a learning-rate grid
at B0, seed 0):

  (a) lamb         LAMB, the LAMB paper's BERT rule: LR x sqrt(k), warmup
                   ratio x k (from 1/320 at B0), no retuning
  (b) date_gain    DATE over the LAMB baseline with lr_scaling="gain": the
                   baseline's peak LR times sqrt(r), r the measured AdaScale
                   gain in [1, k] (date_optax.date), warmup ratio x k
  (c) adascale     AdaScale (date_optax.adascale) over the baseline's LAMB
                   and its schedule at B0, on the scale-invariant clock
  (d) adamw_linear AdamW, LR tuned at B0, x k, fixed warmup ratio
  (e) adamw_sqrt   AdamW, LR tuned at B0, x sqrt(k), the same fixed ratio

At B0 the gain is exactly 1, so (b) and (c) are the LAMB run there, as
AdamW's two rules share one run. All decay linearly to 0 (BERT's schedule);
weight decay 0.01 off biases and norms; no dropout (each run makes less than
one pass over the text).

Usage:
  python benchmarks/bert_scaling.py --quick   # pipeline check, a few minutes
  python benchmarks/bert_scaling.py           # full: grids + 2 seeds

Writes docs/bert_scaling[_quick].{md,png} and keeps every finished run in
docs/bert_scaling[_quick].jsonl, so an interrupted study resumes where it
stopped (delete the .jsonl to start over). The full study runs its cells in
order of importance (the B0 grids, then 64·B0, 16·B0, a second seed of the
LAMB family, 4·B0, the rest of the second seed), so a partial log already
answers the main question.

References: You et al., "Large Batch Optimization for Deep Learning: Training
BERT in 76 minutes", ICLR 2020, https://arxiv.org/abs/1904.00962; Goyal et
al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", 2017,
https://arxiv.org/abs/1706.02677; Loshchilov and Hutter, "Decoupled Weight
Decay Regularization", ICLR 2019, https://arxiv.org/abs/1711.05101; Johnson
et al., "AdaScale SGD", ICML 2020, https://arxiv.org/abs/2007.05105; Qiao et
al., "Pollux", OSDI 2021, https://arxiv.org/abs/2008.12260.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib import metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _paths  # noqa: E402
import _runlog  # noqa: E402
import numpy as np  # noqa: E402

METHODS = ("lamb", "date_gain", "adascale", "adamw_linear", "adamw_sqrt")
LAMB_FAMILY = ("lamb", "date_gain", "adascale")
LABELS = {
    "lamb": "(a) LAMB, sqrt LR, warmup ratio x k (paper's rule)",
    "date_gain": "(b) DATE over LAMB, lr_scaling='gain' (sqrt of measured gain)",
    "adascale": "(c) AdaScale over LAMB, B0 schedule on the gain clock",
    "adamw_linear": "(d) AdamW, linear LR, fixed warmup ratio",
    "adamw_sqrt": "(e) AdamW, sqrt LR, fixed warmup ratio",
}
SCALES = (1, 4, 16, 64)
LAMB_WARMUP_RATIO = 1 / 320  # LAMB's BERT table at its base batch
ADAMW_WARMUP_RATIO = 1 / 20  # fixed: 1/320 would round to no warmup at 16x
DEVICES = 2  # emulated CPU devices: 2 replicas measure the gradient noise
CONFIG = "examples/bert_lamb/configs/scaling.py"

# 32000 iterations at B0 = 2 sequences of 32 bytes: 500 at 64·B0 (2.05M tokens).
# One learning rate per solver, the best of the earlier B0 grids (B0 = 4,
# 7200 iterations: LAMB {2.5e-3, 5e-3, 1e-2}, AdamW {1e-3, 2e-3, 4e-3}); a
# B0 run of 32000 iterations is the study's most expensive cell on a CPU.
FULL = dict(base_batch=2, seq_len=32, base_steps=32000, seeds=2,
            lamb_grid=(2.5e-3,), adamw_grid=(2e-3,))
# Quick mode has no grid: one learning rate each, B0 = 4, 640 iterations at B0.
QUICK = dict(base_batch=4, seq_len=32, base_steps=640, seeds=1,
             lamb_grid=(1e-2,), adamw_grid=(2e-3,))
MODEL = dict(d_model=64, num_layers=2, num_heads=4, mlp_dim=256, dropout_rate=0.0)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true", help="one seed, no grid, 4x fewer tokens")
  p.add_argument("--seeds", type=int, default=None, help="seeds per cell")
  p.add_argument("--base-steps", type=int, default=None,
                 help="iterations at B0 (sets the training tokens)")
  p.add_argument("--out", default=None, help="output prefix (default docs/bert_scaling)")
  p.add_argument("--report-only", action="store_true", help="tables and plot from the log")
  p.add_argument("--methods", default=",".join(METHODS),
                 help="comma-separated rows to run (two studies with disjoint rows may "
                      "share one log; `--report-only` then tables every row)")
  p.add_argument("--lamb-grid", default=None,
                 help="comma-separated LAMB learning rates at B0 (default: the mode's)")
  p.add_argument("--scales", default=",".join(map(str, SCALES)),
                 help="comma-separated k = B/B0 to run (with one learning rate per "
                      "solver the larger batches need not wait for B0)")
  return p.parse_args(argv)


def overrides(method: str, lr: float, batch: int, seed: int, cfg: dict) -> list[str]:
  """The `--config.<field>=` flags of one run over configs/scaling.py."""
  total = cfg["base_steps"] * cfg["base_batch"] // batch
  lamb = method in LAMB_FAMILY
  fields = dict(
      seq_len=cfg["seq_len"], batch_size=batch, base_batch_size=cfg["base_batch"],
      num_train_tokens=cfg["base_steps"] * cfg["base_batch"] * cfg["seq_len"],
      base_learning_rate=lr, optimizer="lamb" if lamb else "adamw",
      base_warmup_ratio=LAMB_WARMUP_RATIO if lamb else ADAMW_WARMUP_RATIO,
      lr_scaling={"adamw_linear": "linear", "date_gain": "gain"}.get(method, "sqrt"),
      warmup_scaling="linear" if lamb else "none",
      adascale=method == "adascale", seed=seed, cpu_devices=DEVICES,
      log_every_steps=max(1, total // 200))
  return [f"--config.{k}={v}" for k, v in fields.items()]


def nominal_recipe(method: str, lr: float, batch: int, cfg: dict):
  """The run's schedule before any measured gain (peak LR and warmup)."""
  import date_optax  # noqa: PLC0415

  lamb = method in LAMB_FAMILY
  base = date_optax.Baseline(
      batch_size=cfg["base_batch"], learning_rate=lr,
      warmup_ratio=LAMB_WARMUP_RATIO if lamb else ADAMW_WARMUP_RATIO, epochs=1,
      num_examples=cfg["base_steps"] * cfg["base_batch"],
      decay=date_optax.schedules.Poly(power=1.0))
  rule = {"adamw_linear": "linear", "date_gain": "none", "adascale": "none"}.get(method, "sqrt")
  return date_optax.scale_recipe(base, batch, lr_scaling=rule,
                                 warmup_scaling="linear" if lamb else "none")


def train_cli(method: str, lr: float, batch: int, seed: int, cfg: dict) -> dict:
  """One run of the example's command line; its results.json and curves."""
  return run_example(overrides(method, lr, batch, seed, cfg), DEVICES)


def run_example(flags: list[str], devices: int) -> dict:
  """`python -m examples.bert_lamb.main --config=configs/scaling.py` with `flags`.

  Runs in a subprocess on `devices` emulated CPU devices, in a temporary
  workdir; returns its results.json with the logged curves under "curves".
  Raises RuntimeError (with the run's stderr) when it fails.
  """
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
             PYTHONPATH=os.pathsep.join(
                 [ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))
  with tempfile.TemporaryDirectory() as workdir:
    cmd = [sys.executable, "-m", "examples.bert_lamb.main", f"--config={CONFIG}",
           f"--workdir={workdir}", f"--config.cpu_devices={devices}", *flags]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not os.path.exists(os.path.join(workdir, "results.json")):
      # (a preempted run, SIGTERM, exits 0 without results)
      raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    with open(os.path.join(workdir, "results.json")) as f:
      result = json.load(f)
    result["curves"] = _curves(workdir)
  return result


def _curves(workdir: str) -> dict[str, list]:
  out = _runlog.read_metrics(workdir)
  tokens = out.get("tokens", {})
  return {name: [[tokens[s], out[name][s]] for s in sorted(out[name]) if s in tokens]
          for name in ("loss", "eval_loss", "learning_rate", "trust_ratio/median",
                       "grad_noise_scale", "gain")
          if name in out}


def main(argv=None) -> int:
  args = parse_args(argv)
  cfg = dict(QUICK if args.quick else FULL)
  if args.seeds is not None:
    cfg["seeds"] = args.seeds
  if args.base_steps is not None:
    cfg["base_steps"] = args.base_steps
  if args.lamb_grid:
    cfg["lamb_grid"] = tuple(float(x) for x in args.lamb_grid.split(","))
  out = _paths.study_out("bert_scaling", args.quick, args.out)
  log_path = out + ".jsonl"
  done = _runlog.load_runs(log_path)
  b0 = cfg["base_batch"]
  t_start = time.perf_counter()

  def run(method: str, lr: float, batch: int, seed: int, dry: bool = False) -> dict | None:
    """The logged run, or a new one (none when `dry` or --report-only)."""
    key = dict(method=method, lr=lr, batch=batch, seed=seed, base_batch=b0,
               base_steps=cfg["base_steps"], seq_len=cfg["seq_len"], devices=DEVICES)
    # At B0 AdamW's two rules are one run, and the gain rows are LAMB's run
    # (the gain is exactly 1 there).
    if batch == b0:
      key["method"] = "adamw" if method.startswith("adamw") else "lamb"
    ident = json.dumps(key, sort_keys=True)
    if ident not in done and not (args.report_only or dry):
      done.update(_runlog.load_runs(log_path))  # another study may have run it
    if ident not in done:
      if args.report_only or dry or not _claim(log_path, ident):
        return None
      t = time.perf_counter()
      try:
        r = train_cli(key["method"] if batch == b0 else method, lr, batch, seed, cfg)
      except RuntimeError as e:  # a failed cell must not end the study
        print(f"FAILED {method} lr={lr:g} B={batch} seed={seed}: {e}", flush=True)
        return None
      recipe = nominal_recipe(method, lr, batch, cfg)
      rec = dict(key=key, eval_loss=r["eval_loss"], eval_accuracy=r["eval_accuracy"],
                 train_loss=r["loss"], steps=r["steps"], tokens=r["tokens"],
                 peak_lr=float(recipe.peak_learning_rate), warmup_steps=recipe.warmup_steps,
                 final_gain=r.get("gain"), wall=time.perf_counter() - t,
                 curves=r["curves"], corpus_sha256=r["corpus_sha256"])
      _runlog.log_run(log_path, done, ident, rec)
      el = (time.perf_counter() - t_start) / 60
      print(f"[{el:5.1f} min] {method} lr={lr:g} B={batch} seed={seed}: eval loss "
            f"{rec['eval_loss']:.4f} acc {rec['eval_accuracy']:.4f} "
            f"({rec['steps']} steps, {rec['wall']:.0f} s, B_simple "
            f"{b_simple(rec):.0f}, gain {rec['final_gain'] or float('nan'):.2f})",
            flush=True)
    return done[ident]

  methods = METHODS if args.report_only else tuple(
      m for m in METHODS if m in args.methods.split(","))
  scales = SCALES if args.report_only else tuple(int(k) for k in args.scales.split(","))
  # 1. The baselines at B0: a learning-rate grid, seed 0, best eval loss.
  grids = {"lamb": cfg["lamb_grid"], "adamw": cfg["adamw_grid"]}
  best = {}
  for solver, grid in grids.items():
    method = "lamb" if solver == "lamb" else "adamw_linear"
    dry = 1 not in scales or not any((m in LAMB_FAMILY) == (solver == "lamb")
                                     for m in methods)
    res = [(run(method, lr, b0, 0, dry), lr) for lr in grid]
    res = [(r, lr) for r, lr in res if r is not None]
    if res:
      best[solver] = min(res, key=lambda x: x[0]["eval_loss"])[1]
    elif len(grid) == 1:  # nothing to choose: the other scales need not wait
      best[solver] = grid[0]

  def cell(method, k, seed, dry):
    lr = best.get("lamb" if method in LAMB_FAMILY else "adamw")
    return None if lr is None else run(method, lr, k * b0, seed, dry)

  # 2. Every method at every scale and seed, from its B0 baseline, the cells
  # that matter most first: 64·B0, 16·B0, the LAMB family's second seed at
  # B0 and 64·B0, 4·B0, then the rest of the other seeds.
  # (Quick mode runs the gain rows at 64·B0 only.)
  order = [(m, 64, 0) for m in METHODS] + [(m, 16, 0) for m in METHODS]
  for seed in range(1, cfg["seeds"]):
    order += [("lamb", 1, seed)] + [(m, 64, seed) for m in LAMB_FAMILY]
  order += [(m, 4, 0) for m in METHODS]
  for seed in range(1, cfg["seeds"]):
    order += [(m, k, seed) for k in (1, 64, 16, 4) for m in METHODS]
  order += [(m, 1, 0) for m in METHODS]  # the shared B0 runs (already done)
  table: dict[tuple[str, int], list] = {}
  seen = set()
  for method, k, seed in order:
    if (method, k, seed) in seen:
      continue
    seen.add((method, k, seed))
    dry = method not in methods or k not in scales or (
        args.quick and method in ("date_gain", "adascale") and k not in (1, 64))
    r = cell(method, k, seed, dry)
    if r is not None:
      table.setdefault((method, k), []).append(r)
  command = _runlog.command("bert_scaling.py", argv)
  _report(out, cfg, best, table, grids, done, args.quick, command)
  return 0


def _claim(log_path: str, ident: str) -> bool:
  """Marks a run as taken by this process; False while another live one has it."""
  import hashlib  # noqa: PLC0415

  folder = log_path + ".claims"
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, hashlib.sha1(ident.encode()).hexdigest())
  try:
    with open(path) as f:
      pid = int(f.read() or 0)
    if pid != os.getpid():
      os.kill(pid, 0)  # raises if that process is gone
      return False
  except (FileNotFoundError, ProcessLookupError, ValueError):
    pass
  with open(path, "w") as f:
    f.write(str(os.getpid()))
  return True


def b_simple(rec: dict) -> float:
  """The run's measured B_simple: the median over its logged steps."""
  vals = [v for _, v in rec.get("curves", {}).get("grad_noise_scale", [])]
  return float(np.median(vals)) if vals else float("nan")


def _report(out, cfg, best, table, grids, done, quick, command):
  b0 = cfg["base_batch"]
  tokens = cfg["base_steps"] * b0 * cfg["seq_len"]
  walls = [r["wall"] for r in done.values() if r["key"].get("base_steps") == cfg["base_steps"]
           and r["key"].get("base_batch") == b0 and r["key"].get("devices") == DEVICES]
  lines = [
      f"# BERT-style MLM batch scaling ({'quick' if quick else 'full'} mode)", "",
      f"Machine: {platform.machine()} CPU, {os.cpu_count()} cores (shared), "
      f"{DEVICES} emulated JAX devices (2 replicas), jax {metadata.version('jax')}, Python "
      f"{platform.python_version()}.",
      f"Command: `{command}` (each run: `python -m examples.bert_lamb.main "
      f"--config={CONFIG}` with overrides); {len(walls)} runs, "
      f"{sum(walls) / 60:.0f} min of run wall time (summed over parallel studies).",
      f"Model: {MODEL['num_layers']} pre-LN layers, width {MODEL['d_model']}, "
      f"{MODEL['num_heads']} heads, MLP {MODEL['mlp_dim']}, byte vocabulary; sequences of "
      f"{cfg['seq_len']} bytes; {tokens:,} training tokens per run; B0 = {b0} sequences; "
      f"up to {cfg['seeds']} seed(s) per cell (mean ± half-range, n = seeds). The step is "
      "`make_train_step(..., grad_stats=True)`; B_simple is the median of the measured "
      "noise scale over a run's logged steps (inf where the |G|² estimate is not positive).",
      "",
      "## Baseline grids at B0 (seed 0, eval MLM loss)", "",
      "| optimizer | learning rate | eval loss | eval accuracy |", "|---|---:|---:|---:|",
  ]
  b0_runs = {}  # every B0 run of seed 0 in the log, also grid points run apart
  for rec in done.values():
    key = rec["key"]
    if (key["batch"] == b0 and key["seed"] == 0 and key["base_steps"] == cfg["base_steps"]
        and key["base_batch"] == b0 and key.get("devices") == DEVICES
        and key["seq_len"] == cfg["seq_len"]):
      b0_runs[(key["method"], key["lr"])] = rec
  for (solver, lr), rec in sorted(b0_runs.items()):
    mark = " (used)" if best.get(solver) == lr else ""
    lines.append(f"| {solver} | {lr:g}{mark} | {rec['eval_loss']:.4f} | "
                 f"{rec['eval_accuracy']:.4f} |")
  lines += ["", "## Final eval MLM loss (masked-token accuracy)", "",
            "| method | " + " | ".join(f"{k}·B0 = {k * b0}" for k in SCALES) + " |",
            "|---|" + "---:|" * len(SCALES)]
  summary = {}
  for method in METHODS:
    cells = []
    for k in SCALES:
      recs = table.get((method, k), [])
      if not recs:
        cells.append("—")
        continue
      loss = np.array([r["eval_loss"] for r in recs])
      acc = np.array([r["eval_accuracy"] for r in recs])
      summary[(method, k)] = (loss.mean(), acc.mean(), len(recs))
      half = (loss.max() - loss.min()) / 2
      cells.append(f"{loss.mean():.4f} ± {half:.4f} ({acc.mean():.4f}; n={len(recs)})")
    lines.append(f"| {LABELS[method]} | " + " | ".join(cells) + " |")
  lines += ["", "| iterations | " + " | ".join(
      str(table[("lamb", k)][0]["steps"]) if ("lamb", k) in table else "—"
      for k in SCALES) + " |", ""]
  lines += ["## Eval loss relative to B0, measured B_simple and gain", "",
            "Relative to the same solver's B0 run (LAMB's for rows a–c, AdamW's for "
            "d–e), mean over the seeds that ran; B_simple median over the run, gain at "
            "the run's end (the applied r for rows b and c; the others report "
            "AdaScale's r of the batch over one replica's half).", "",
            "| method | " + " | ".join(f"{k}·B0" for k in SCALES) + " |",
            "|---|" + "---:|" * len(SCALES)]
  for method in METHODS:
    ref = summary.get(("lamb" if method in LAMB_FAMILY else "adamw_linear", 1))
    cells = []
    for k in SCALES:
      recs = table.get((method, k), [])
      if not recs or ref is None:
        cells.append("—")
        continue
      rel = 100 * (summary[(method, k)][0] / ref[0] - 1)
      bs = np.median([b_simple(r) for r in recs])
      gain = np.mean([r["final_gain"] if r.get("final_gain") is not None else np.nan
                      for r in recs])
      cells.append(f"{rel:+.2f} % (B_simple {bs:.0f}, gain {gain:.2f})")
    lines.append(f"| {LABELS[method]} | " + " | ".join(cells) + " |")
  lines += ["", "## Goals", ""]
  for method in LAMB_FAMILY:
    if ("lamb", 1) in summary and (method, 64) in summary:
      b, (l64, _, n) = summary[("lamb", 1)][0], summary[(method, 64)]
      lines.append(f"- {LABELS[method].split(' (')[0][4:]} at 64·B0 vs LAMB at B0: "
                   f"{l64:.4f} vs {b:.4f}, {100 * (l64 / b - 1):+.2f} % (n={n}; goal: "
                   f"within 2 %): {'met' if abs(l64 / b - 1) <= 0.02 else 'not met'}.")
  lamb_b0 = [r["eval_loss"] for (m, _), r in b0_runs.items() if m == "lamb"]
  if ("lamb", 1) in summary and min(lamb_b0, default=np.inf) < summary[("lamb", 1)][0]:
    lo = min(lamb_b0)
    lines.append(f"- Against the best LAMB run at B0 in the log ({lo:.4f}, another "
                 "learning rate, seed 0): " + ", ".join(
                     f"{m} {100 * (summary[(m, 64)][0] / lo - 1):+.2f} %"
                     for m in LAMB_FAMILY if (m, 64) in summary) + " at 64·B0.")
  for k in (16, 64):
    if all((m, k) in summary for m in ("lamb", "adamw_linear", "adamw_sqrt")):
      lamb = summary[("lamb", k)][0]
      others = {m: summary[(m, k)][0] for m in ("adamw_linear", "adamw_sqrt")}
      ok = all(lamb < v for v in others.values())
      lines.append(f"- {k}·B0: LAMB {lamb:.4f} vs " + ", ".join(
          f"{m} {v:.4f}" for m, v in others.items())
          + f" (goal: LAMB below both): {'met' if ok else 'not met'}.")
  lines.append("")
  with open(out + ".md", "w") as f:
    f.write("\n".join(lines))
  print("\n".join(lines))
  _plot(out, table, b0)


def _binned(curve: np.ndarray, bins: int = 20) -> np.ndarray:
  """The mean (tokens, loss) in each of `bins` equal token ranges (less noise)."""
  if len(curve) <= bins:
    return curve
  edges = np.linspace(0, curve[-1, 0], bins + 1)
  idx = np.clip(np.searchsorted(edges, curve[:, 0], side="left") - 1, 0, bins - 1)
  return np.array([curve[idx == i].mean(0) for i in range(bins) if np.any(idx == i)])


def _plot(out, table, b0):
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  fig, axes = plt.subplots(2, 3, figsize=(16, 8.4))
  colors = {1: "C0", 4: "C1", 16: "C2", 64: "C3"}
  for ax, method in zip(axes.flat[:5], METHODS):
    for k in SCALES:
      for i, rec in enumerate(table.get((method, k), [])):
        curve = _binned(np.array(rec["curves"].get("loss", [])))
        if len(curve):
          ax.plot(curve[:, 0] / 1e3, curve[:, 1], color=colors[k], alpha=0.8,
                  label=f"{k}·B0" if i == 0 else None)
    ax.set_title(LABELS[method], fontsize=9)
    ax.set_xlabel("training tokens (thousands)")
    ax.set_ylabel("train MLM loss")
    ax.set_ylim(top=5.6)
    ax.legend(fontsize=8)
  ax = axes.flat[5]
  for method in METHODS:
    ks = [k for k in SCALES if (method, k) in table]
    means = [np.mean([r["eval_loss"] for r in table[(method, k)]]) for k in ks]
    ax.plot(ks, means, "o-", label=LABELS[method].split(",")[0])
  if ("lamb", 1) in table:
    ref = np.mean([r["eval_loss"] for r in table[("lamb", 1)]])
    ax.axhline(1.02 * ref, color="0.4", ls=":", label="goal: LAMB B0 + 2 %")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("batch / B0")
  ax.set_ylabel("final eval MLM loss")
  ax.legend(fontsize=8)
  _paths.save_figure(fig, out + ".png", dpi=100)


if __name__ == "__main__":
  sys.exit(main())
