"""The language-model study: the tiny decoder at equal tokens, B0 against 64·B0.

Every row trains `examples/gpt_lm`'s tiny config (4 × 128, 1.07 M
parameters, 614,400 training tokens of the CPython-docstring corpus) on the
same tokens, from the AdamW baseline tuned at B0 = 8 sequences of 64
tokens:

* ``b0``: the baseline itself (AdamW at B0, 1,200 steps);
* ``adamw64_sqrt``, ``adamw64_linear``: AdamW at a fixed 64·B0 = 512 (19
  steps), the recipe scaled by √k or k (`date_optax.scale_recipe`);
* ``adamw8x_sqrt``: AdamW at a fixed 8·B0 = 64 (150 steps, √k), a batch
  near the measured critical batch, for scale;
* ``lamb64``, ``date64``: `date_optax.lamb` and `date_optax.date` of the
  baseline at 64·B0 (`configs/lamb.py`, `configs/date.py`);
* ``grow``: `configs/adaptive.py` as shipped: `BatchSchedule.adaptive` with
  the library's defaults from B0 to 64·B0, the learning rate linear in the
  batch; this task was not used to choose those defaults;
* ``grow_sqrt_t6``, ``grow_sqrt_t12``: the same with the rate √ in the batch
  and the trigger's threshold at 6 and 12 (grow when the measured critical
  batch holds at 6 or 12 times the batch; the default is 3);
* ``lcb_z0``, ``lcb_z1.645``, ``branch_tol0.5``, ``branch_tol1``: ``grow``
  with another trigger, decided on the host by
  `benchmarks/gpt_lm_branched.py`: a lower confidence bound on B_simple
  (z standard errors below it) or Merrill et al.'s branched check (grow
  when a segment trained at 2B ends within the tolerance of the same
  segment at B, on held-out windows).

Each run is a child process (`python -m examples.gpt_lm.main`, 2 emulated
CPU devices) logging every step; the study keeps its final eval loss, the
eval curve, and for growing rows the batch and the measured critical batch
(the step's smoothed B_simple, in sequences) at every step. Finished runs
are logged to ``docs/studies/gpt_lm/gpt_lm.jsonl`` and skipped on a rerun;
the table (``gpt_lm.md``) and the plot (``gpt_lm.png``) are rewritten after
each run.

    python benchmarks/gpt_lm_study.py                 # every row, seeds 0-2
    python benchmarks/gpt_lm_study.py --only grow --seeds 0
    python benchmarks/gpt_lm_study.py --report-only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import _runlog  # noqa: E402

_CONFIGS = "examples/gpt_lm/configs"
#: name -> (config file, overrides, label).
ROWS = {
    "b0": ("default.py", (), "AdamW at B0 = 8 (the baseline)"),
    "adamw64_sqrt": ("default.py", ("batch_size=512", "lr_scaling=sqrt", "eval_every_steps=4"),
                     "AdamW at 64·B0, √k rate"),
    "adamw64_linear": ("default.py", ("batch_size=512", "lr_scaling=linear",
                                      "eval_every_steps=4"), "AdamW at 64·B0, k rate"),
    "adamw8x_sqrt": ("default.py", ("batch_size=64", "lr_scaling=sqrt", "eval_every_steps=25"),
                     "AdamW at 8·B0, √k rate"),
    "lamb64": ("lamb.py", ("eval_every_steps=4",), "LAMB at 64·B0 (configs/lamb.py)"),
    "date64": ("date.py", ("eval_every_steps=4",), "date() at 64·B0 (configs/date.py)"),
    "grow": ("adaptive.py", (), "growing B0→64·B0, defaults, k rate (configs/adaptive.py)"),
    "grow_sqrt_t6": ("adaptive.py", ("lr_scaling=sqrt", "growth.threshold=6.0"),
                     "growing, threshold 6, √k rate"),
    "grow_sqrt_t12": ("adaptive.py", ("lr_scaling=sqrt", "growth.threshold=12.0"),
                      "growing, threshold 12, √k rate"),
    # Triggers decided on the host (benchmarks/gpt_lm_branched.py), same config
    # as "grow": the library's defaults but for the trigger.
    "lcb_z0": ("@lcb", ("--z", "0"), "growing, host trigger on B_simple (z = 0, no lag)"),
    "lcb_z1.645": ("@lcb", ("--z", "1.645"),
                   "growing, host trigger on a 95 % lower bound of B_simple (z = 1.645)"),
    "branch_tol0.5": ("@branched", ("--tolerance", "0.005"),
                      "growing, branched check: 2B within 0.5 % of B on a probe"),
    "branch_tol1": ("@branched", ("--tolerance", "0.01"),
                    "growing, branched check: 2B within 1 % of B on a probe"),
}
SEQ_LEN = 64
B0_STEPS = 1200


def run_host_trigger(row: str, seed: int) -> dict:
  """A row of `benchmarks/gpt_lm_branched.py` (a trigger decided on the host)."""
  trigger, flags, _ = ROWS[row]
  with tempfile.TemporaryDirectory(prefix="gpt_lm_study_") as tmp:
    out = os.path.join(tmp, "record.json")
    cmd = [sys.executable, os.path.join("benchmarks", "gpt_lm_branched.py"),
           f"--trigger={trigger[1:]}", f"--seed={seed}", *flags, f"--out={out}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode:
      raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    with open(out) as f:
      rec = json.load(f)
  keep = ("steps", "tokens", "eval_loss", "eval_unigram_entropy", "eval_curve", "path",
          "batch_changes", "branch_steps_discarded", "checks")
  return dict(row=row, seed=seed, **{k: rec[k] for k in keep if k in rec},
              wall_s=round(time.perf_counter() - start, 1))


def run(row: str, seed: int) -> dict:
  """Trains one row at one seed in a child process; returns its record."""
  config, overrides, _ = ROWS[row]
  if config.startswith("@"):
    return run_host_trigger(row, seed)
  with tempfile.TemporaryDirectory(prefix="gpt_lm_study_") as workdir:
    cmd = [sys.executable, "-m", "examples.gpt_lm.main", f"--config={_CONFIGS}/{config}",
           f"--workdir={workdir}", f"--config.seed={seed}", "--config.progress_bar=False",
           "--config.save_checkpoints=False", "--config.log_every_steps=1",
           *(f"--config.{o}" for o in overrides)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode:
      raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    with open(os.path.join(workdir, "results.json")) as f:
      result = json.load(f)
    metrics = _runlog.read_metrics(workdir)
  batch = metrics["batch_size"] if "batch_size" in metrics else None
  steps = int(result["steps"])
  sizes = ([int(batch[s]) for s in range(1, steps + 1)] if batch is not None
           else [int(result["batch_size"])] * steps)
  tokens = np.cumsum(sizes) * SEQ_LEN  # after each step
  curve = [[int(tokens[s - 1]), round(v, 5)] for s, v in sorted(metrics["eval_loss"].items())]
  rec = dict(row=row, seed=seed, steps=steps, tokens=int(tokens[-1]),
             eval_loss=result["eval_loss"], eval_accuracy=result["eval_accuracy"],
             eval_unigram_entropy=result["eval_unigram_entropy"],
             peak_learning_rate=result["peak_learning_rate"],
             wall_s=round(time.perf_counter() - start, 1), eval_curve=curve)
  if "grad_noise_scale" in metrics and batch is not None:
    noise = metrics["grad_noise_scale"]
    rec["batch_changes"] = result.get("batch_changes")
    rec["path"] = [[int(tokens[s - 1]), sizes[s - 1], round(noise.get(s, float("nan")), 1)]
                   for s in range(1, steps + 1)]
  return rec


def summarize(done: dict[str, dict]) -> list[dict]:
  """One line per row: the mean and spread of the seeds' eval losses, the
  gap to B0's mean, the steps and their fraction of B0's."""
  by_row: dict[str, list[dict]] = {}
  for rec in done.values():
    by_row.setdefault(rec["row"], []).append(rec)
  base = np.mean([r["eval_loss"] for r in by_row.get("b0", [])]) if "b0" in by_row else None
  lines = []
  for row in ROWS:
    recs = sorted(by_row.get(row, []), key=lambda r: r["seed"])
    if not recs:
      continue
    loss = np.array([r["eval_loss"] for r in recs])
    steps = np.array([r["steps"] for r in recs])
    lines.append(dict(
        row=row, label=ROWS[row][2], seeds=len(recs), eval_loss=float(loss.mean()),
        eval_loss_sd=float(loss.std(ddof=1)) if len(recs) > 1 else 0.0,
        worst=float(loss.max()), gap_pct=None if base is None else 100 * (loss.mean() / base - 1),
        steps=float(steps.mean()), step_fraction=float(steps.mean() / B0_STEPS),
        tokens=int(np.mean([r["tokens"] for r in recs])),
        diverged=int(sum(not np.isfinite(x) or x > recs[0]["eval_unigram_entropy"]
                         for x in loss)),
        wall_s=float(np.mean([r["wall_s"] for r in recs]))))
  return lines


def report(done: dict[str, dict], out: str, argv: list[str]) -> str:
  """Writes ``<out>.md`` (the table) and ``<out>.png``; returns the table."""
  lines = summarize(done)
  entropy = next(iter(done.values()))["eval_unigram_entropy"] if done else float("nan")
  table = [
      "| row | seeds | eval loss (mean ± sd) | worst seed | vs B0 | steps | of B0's steps | "
      "above the unigram entropy | wall per run |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for ln in lines:
    gap = "" if ln["gap_pct"] is None else f"{ln['gap_pct']:+.2f} %"
    table.append(
        f"| {ln['label']} | {ln['seeds']} | {ln['eval_loss']:.4f} ± {ln['eval_loss_sd']:.4f} | "
        f"{ln['worst']:.4f} | {gap} | {ln['steps']:.0f} | 1/{1 / ln['step_fraction']:.1f} | "
        f"{ln['diverged']} | {ln['wall_s']:.0f} s |")
  text = "\n".join([
      "# The language-model study: the tiny decoder at equal tokens",
      "",
      f"Command: `{_runlog.command('gpt_lm_study.py', argv)}`. Every run trains on "
      "614,400 tokens (1,200 steps at B0 = 8 × 64 tokens); eval loss in nats per "
      f"token over every held-out window (unigram entropy {entropy:.3f}). Written by "
      "`benchmarks/gpt_lm_study.py` from `gpt_lm.jsonl`.",
      "", *table, ""])
  with open(out + ".md", "w") as f:
    f.write(text)
  plot(done, out + ".png")
  return text


def plot(done: dict[str, dict], path: str) -> None:
  """Eval loss against tokens for every row (seed 0), and the growing rows'
  batch and measured critical batch against tokens."""
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
  seed0 = {}  # each row's run of its lowest seed
  for r in sorted(done.values(), key=lambda r: r["seed"]):
    seed0.setdefault(r["row"], r)
  for row in ROWS:
    if row not in seed0:
      continue
    c = np.array(seed0[row]["eval_curve"])
    ax.plot(c[:, 0], c[:, 1], marker=".", label=f"{row} ({seed0[row]['steps']} steps)")
    if "path" in seed0[row]:
      p = np.array(seed0[row]["path"], dtype=float)
      (line,) = bx.step(p[:, 0], p[:, 1], where="post", label=f"{row}: batch")
      bx.plot(p[:, 0], p[:, 2], alpha=0.4, color=line.get_color(),
              label=f"{row}: measured B_simple")
  ax.set(xlabel="training tokens", ylabel="eval loss (nats/token)", ylim=(3.9, 6.0),
         title="held-out loss, seed 0")
  ax.legend(fontsize=7)
  bx.set(xlabel="training tokens", ylabel="sequences", yscale="log",
         title="growing batch and the critical batch it measured")
  bx.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--only", default="", help="rows whose name starts with this")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--report-only", action="store_true")
  parser.add_argument("--out", default="docs/studies/gpt_lm/gpt_lm")
  args = parser.parse_args(argv)
  os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
  log = args.out + ".jsonl"
  done = _runlog.load_runs(log)
  todo = [(row, s) for s in args.seeds for row in ROWS
          if row.startswith(args.only) and f"{row}/seed{s}" not in done]
  for i, (row, seed) in enumerate(todo):
    print(f"[{i + 1}/{len(todo)}] {row} seed {seed} ...", flush=True)
    rec = _runlog.run_and_log(log, done, f"{row}/seed{seed}", dict(row=row, seed=seed),
                              lambda row=row, seed=seed: run(row, seed), f"{row} seed {seed}")
    if rec is not None:
      print(f"    eval loss {rec['eval_loss']:.4f} in {rec['steps']} steps ({rec['wall_s']:.0f} s)",
            flush=True)
      report(done, args.out, sys.argv[1:] if argv is None else argv)
  print(report(done, args.out, sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
  main()
