"""BERT-style MLM at B0, 4·B0, 16·B0, 64·B0 on the same training tokens: LAMB vs AdamW.

The model and data are examples/bert_lamb's (a small pre-LN encoder on the
UTF-8 bytes of standard-library docstrings, 15 % masking, exact eval MLM loss
and masked-token accuracy over the held-out modules), trained by its
`train_and_evaluate` (`date_optax.parallel.make_train_step`) with one stage.
Every run sees the same number of training tokens, so 64·B0 takes 64x fewer
iterations. Three ways to scale a baseline tuned at B0 (a learning-rate grid
at B0, seed 0):

  (a) lamb         LAMB, the LAMB paper's BERT rule: LR x sqrt(k), warmup
                   ratio x k (from 1/320 at B0), no retuning
  (b) adamw_linear AdamW, LR tuned at B0, x k, fixed warmup ratio
  (c) adamw_sqrt   AdamW, LR tuned at B0, x sqrt(k), the same fixed ratio

All decay linearly to 0 (BERT's schedule); weight decay 0.01 off biases and
norms; no dropout (each run makes less than one pass over the text).

Usage:
  python benchmarks/bert_scaling.py --quick   # pipeline check, ~3 minutes
  python benchmarks/bert_scaling.py           # full: grids + 2 seeds

Writes docs/bert_scaling[_quick].{md,png} and keeps every finished run in
docs/bert_scaling[_quick].jsonl, so an interrupted study resumes where it
stopped (delete the .jsonl to start over).

References: You et al., "Large Batch Optimization for Deep Learning: Training
BERT in 76 minutes", ICLR 2020, https://arxiv.org/abs/1904.00962; Goyal et
al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", 2017,
https://arxiv.org/abs/1706.02677; Loshchilov and Hutter, "Decoupled Weight
Decay Regularization", ICLR 2019, https://arxiv.org/abs/1711.05101.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import tempfile
import time

_DEVICES = "--xla_force_host_platform_device_count=1"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _DEVICES).strip()

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _runlog  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from examples.bert_lamb import train  # noqa: E402
from examples.bert_lamb.configs import default  # noqa: E402

METHODS = ("lamb", "adamw_linear", "adamw_sqrt")
LABELS = {
    "lamb": "(a) LAMB, sqrt LR, warmup ratio x k (paper's rule)",
    "adamw_linear": "(b) AdamW, linear LR, fixed warmup ratio",
    "adamw_sqrt": "(c) AdamW, sqrt LR, fixed warmup ratio",
}
SCALES = (1, 4, 16, 64)
LAMB_WARMUP_RATIO = 1 / 320  # LAMB's BERT table at its base batch
ADAMW_WARMUP_RATIO = 1 / 20  # fixed: 1/320 would round to no warmup at 16x

FULL = dict(base_batch=4, seq_len=32, base_steps=7200, seeds=2,
            lamb_grid=(2.5e-3, 5e-3, 1e-2), adamw_grid=(1e-3, 2e-3, 4e-3))
# Quick mode has no grid: one learning rate each, 4x fewer tokens.
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
  return p.parse_args(argv)


def study_config(method: str, lr: float, batch: int, seed: int, cfg: dict):
  """examples/bert_lamb's default config, one stage, sized for the study."""
  c = default.get_config()
  c.tokenizer = "bytes"  # the study's recorded numbers are per masked byte
  c.model.update(MODEL)
  c.two_stage = False
  c.seq_len = cfg["seq_len"]
  c.batch_size = batch
  c.num_train_tokens = cfg["base_steps"] * cfg["base_batch"] * cfg["seq_len"]
  c.base_batch_size = cfg["base_batch"]
  c.base_learning_rate = lr
  c.optimizer = "lamb" if method == "lamb" else "adamw"
  c.base_warmup_ratio = LAMB_WARMUP_RATIO if method == "lamb" else ADAMW_WARMUP_RATIO
  c.lr_scaling = "linear" if method == "adamw_linear" else "sqrt"
  c.warmup_scaling = "linear" if method == "lamb" else "none"
  c.weight_decay = 0.01
  # One CPU device: no model axis, no update sharding, float32 (this CPU has
  # no bfloat16 matrix units; bf16 only slows it down).
  c.model_parallel = 1
  c.param_sharding = ()
  c.shard_update = False
  c.microbatches = 1
  c.half_precision = False
  c.cpu_devices = 0
  c.save_checkpoints = False
  c.progress_bar = False
  total = cfg["base_steps"] * cfg["base_batch"] // batch
  c.log_every_steps = max(1, total // 200)
  c.eval_every_steps = total  # once, at the end
  c.eval_batch_size = 256
  c.seed = seed
  return c


def _curves(workdir: str) -> dict[str, list]:
  out: dict[str, dict[int, float]] = {}
  with open(os.path.join(workdir, "metrics.csv")) as f:
    for row in csv.DictReader(f):
      out.setdefault(row["name"], {})[int(row["step"])] = float(row["value"])
  tokens = out.get("tokens", {})
  return {name: [[tokens[s], out[name][s]] for s in sorted(out[name]) if s in tokens]
          for name in ("loss", "eval_loss", "learning_rate", "trust_ratio/median")
          if name in out}


def main(argv=None) -> int:
  args = parse_args(argv)
  cfg = dict(QUICK if args.quick else FULL)
  if args.seeds is not None:
    cfg["seeds"] = args.seeds
  if args.base_steps is not None:
    cfg["base_steps"] = args.base_steps
  out = args.out or os.path.join(ROOT, "docs", "bert_scaling_quick" if args.quick
                                 else "bert_scaling")
  os.makedirs(os.path.dirname(out), exist_ok=True)
  log_path = out + ".jsonl"
  done = _runlog.load_runs(log_path)
  b0 = cfg["base_batch"]
  used: dict[str, dict] = {}

  def run(method: str, lr: float, batch: int, seed: int) -> dict:
    key = dict(method=method, lr=lr, batch=batch, seed=seed, base_batch=b0,
               base_steps=cfg["base_steps"], seq_len=cfg["seq_len"])
    # AdamW at B0 is the same run under both scaling rules.
    if method.startswith("adamw") and batch == b0:
      key["method"] = "adamw"
    ident = json.dumps(key, sort_keys=True)
    if ident not in done:
      if args.report_only:
        return None
      config = study_config(method, lr, batch, seed, cfg)
      with tempfile.TemporaryDirectory() as workdir:
        t = time.perf_counter()
        r = train.train_and_evaluate(config, workdir)
        curves = _curves(workdir)
      rec = dict(key=key, eval_loss=r["eval_loss"], eval_accuracy=r["eval_accuracy"],
                 train_loss=r["loss"], steps=r["steps"], tokens=r["tokens"],
                 peak_lr=float(train.make_recipe(config).stages[0].peak_learning_rate),
                 warmup_steps=train.make_recipe(config).stages[0].warmup_steps,
                 wall=time.perf_counter() - t, curves=curves,
                 corpus_sha256=r["corpus_sha256"])
      done[ident] = rec
      with open(log_path, "a") as f:
        f.write(json.dumps(dict(ident=ident, **rec)) + "\n")
      print(f"{method} lr={lr:g} B={batch} seed={seed}: eval loss "
            f"{rec['eval_loss']:.4f} acc {rec['eval_accuracy']:.4f} "
            f"({rec['steps']} steps, {rec['wall']:.0f} s)", flush=True)
    used[ident] = done[ident]
    return done[ident]

  # 1. The baselines at B0: a learning-rate grid, seed 0, best eval loss.
  best = {}
  grids = {"lamb": cfg["lamb_grid"], "adamw": cfg["adamw_grid"]}
  for solver, grid in grids.items():
    method = "lamb" if solver == "lamb" else "adamw_linear"
    res = [(run(method, lr, b0, 0), lr) for lr in grid]
    res = [(r, lr) for r, lr in res if r is not None]
    if res:
      best[solver] = min(res, key=lambda x: x[0]["eval_loss"])[1]
  # 2. Every method at every scale and seed, from its B0 baseline (seed by
  # seed, so an interrupted study has whole seeds).
  table = {}
  for seed in range(cfg["seeds"]):
    for method in METHODS:
      lr = best.get("lamb" if method == "lamb" else "adamw")
      if lr is None:
        continue
      for k in SCALES:
        r = run(method, lr, k * b0, seed)
        if r is not None:
          table.setdefault((method, k), []).append(r)
  command = " ".join(["python benchmarks/bert_scaling.py", *(argv or sys.argv[1:])])
  _report(out, cfg, best, table, grids, done, args.quick, command)
  return 0


def _report(out, cfg, best, table, grids, done, quick, command):
  b0 = cfg["base_batch"]
  tokens = cfg["base_steps"] * b0 * cfg["seq_len"]
  lines = [
      f"# BERT-style MLM batch scaling ({'quick' if quick else 'full'} mode)", "",
      f"Machine: {platform.machine()} CPU, {os.cpu_count()} cores (shared), "
      f"{len(jax.devices())} JAX device, jax {jax.__version__}, Python "
      f"{platform.python_version()}.",
      f"Command: `{command}`.",
      f"Model: {MODEL['num_layers']} pre-LN layers, width {MODEL['d_model']}, "
      f"{MODEL['num_heads']} heads, MLP {MODEL['mlp_dim']}, byte vocabulary; sequences of "
      f"{cfg['seq_len']} bytes; {tokens:,} training tokens per run; B0 = {b0} sequences; "
      f"{cfg['seeds']} seed(s) per cell (mean ± half-range).", "",
      "## Baseline grids at B0 (seed 0, eval MLM loss)", "",
      "| optimizer | learning rate | eval loss | eval accuracy |", "|---|---:|---:|---:|",
  ]
  for solver, grid in grids.items():
    method = "lamb" if solver == "lamb" else "adamw"
    for lr in grid:
      for rec in done.values():
        key = rec["key"]
        if (key["method"] == method and key["lr"] == lr and key["batch"] == b0
            and key["seed"] == 0 and key["base_steps"] == cfg["base_steps"]):
          mark = " (chosen)" if best.get(solver) == lr else ""
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
      summary[(method, k)] = (loss.mean(), acc.mean())
      half = (loss.max() - loss.min()) / 2
      cells.append(f"{loss.mean():.4f} ± {half:.4f} ({acc.mean():.4f})")
    lines.append(f"| {LABELS[method]} | " + " | ".join(cells) + " |")
  lines += ["", "| iterations | " + " | ".join(
      str(table[("lamb", k)][0]["steps"]) if ("lamb", k) in table else "—"
      for k in SCALES) + " |", "", "## Goals", ""]
  if ("lamb", 1) in summary and ("lamb", 64) in summary:
    b, l64 = summary[("lamb", 1)][0], summary[("lamb", 64)][0]
    lines.append(f"- LAMB at 64·B0 vs B0: {l64:.4f} vs {b:.4f}, "
                 f"{100 * (l64 / b - 1):+.2f} % (goal: within 2 %): "
                 f"{'met' if abs(l64 / b - 1) <= 0.02 else 'not met'}.")
  for k in (16, 64):
    if all((m, k) in summary for m in METHODS):
      lamb = summary[("lamb", k)][0]
      others = {m: summary[(m, k)][0] for m in METHODS[1:]}
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

  fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
  colors = {1: "C0", 4: "C1", 16: "C2", 64: "C3"}
  for ax, method in zip(axes[:3], METHODS):
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
  ax = axes[3]
  for method in METHODS:
    ks = [k for k in SCALES if (method, k) in table]
    means = [np.mean([r["eval_loss"] for r in table[(method, k)]]) for k in ks]
    ax.plot(ks, means, "o-", label=LABELS[method].split(",")[0])
  ax.set_xscale("log", base=2)
  ax.set_xlabel("batch / B0")
  ax.set_ylabel("final eval MLM loss")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out + ".png", dpi=110)
  plt.close(fig)


if __name__ == "__main__":
  sys.exit(main())
