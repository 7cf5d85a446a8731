"""What a pod of today costs: ResNet-50 and BERT-large on v4/v5e/v5p/v6e (issue 57, item 6).

Every row is one candidate of ``date-optax plan`` (its ``--json`` output:
its candidates, compile cache, compile and summary are used as they are),
run in a subprocess and logged as it finishes. The example's own train step
is compiled by the TPU compiler (libtpu) on this machine for the target,
Multislice targets included; nothing runs on a TPU. Every step time, time to
train and cost here is an estimate (the compiler's cost model where it
answers, else the roofline of the program's flops, bytes and collectives on
the generation's public rates), not a measurement.

Rows (in the order they run; a rerun skips the logged ones):
  r50-32k/4xv5litepod-256/<sync>  ResNet-50 (LARS, 90 epochs) at 32,768 on
                     4 x v5litepod-256 (1,024 chips, 32 images per chip):
                     psum, hierarchical float32, hierarchical int8 and int4
                     with error feedback
  r50-32k/<slice>/psum  the same at 32,768 on one slice of about 256 chips
                     of each generation of today, and on 2 x v5litepod-256
  bert-large/4xv5litepod-256/<sync>  BERT-large, LAMB's two stages (65,536 x
                     128, then 32,768 x 512), 8 microbatches per replica
  cal/...            calibration rows: programs where libtpu's cost model
                     answers, for the roofline beside it
  lm-1b/<slice>/fsdp, lm-8b/<slice>/fsdp  the language-model example's 1.1 B
                     and 8 B configs (FSDP x data, AdamW, 20 tokens per
                     parameter) on v6e-256, v5litepod-256 and a v5p slice
  */2xv5p-2048/*     every example (ResNet-50, BERT-large, the LSTMs, the 8 B
                     model) on two v5p slices of 1,024 chips (2,048 devices)

Usage:
  python benchmarks/pods_today.py                 # every row, resumable
  python benchmarks/pods_today.py --only r50-32k/ # rows whose name starts so
  python benchmarks/pods_today.py --report-only   # page and plot from the log
  python benchmarks/pods_today.py --retry --timeout 900  # rows that failed, again
Outputs: docs/studies/pods_today/pods_today.{jsonl,md,png}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _paths  # noqa: E402
import _runlog  # noqa: E402

ROOT = _paths.ROOT
#: Ghost BN batches of 32: the 32 images per chip of 4 x v5litepod-256, and the
#: same statistics on every row so that the rows differ only by their target.
R50 = ["dataset='fake'", "ghost_batch_size=32"]
BERT_CONFIG = "examples/bert_lamb/configs/lamb_bert.py:32768"
#: LAMB's stage 2 (32 x 512 tokens per chip on 1,024 chips) needs
#: microbatches on 16 GiB chips; 8 keeps 4 sequences of 512 per microbatch.
BERT_MICROBATCHES = 8
BERT = ["batch_size=65536", "vocab_size=30522", f"microbatches={BERT_MICROBATCHES}"]
SYNCS = {
    "psum": [],
    "hier-f32": ["grad_sync.algorithm='hierarchical'"],
    "hier-int8-ef": ["grad_sync.algorithm='hierarchical'", "grad_sync.comm_dtype='int8'",
                     "grad_sync.error_feedback=True"],
    "hier-int4-ef": ["grad_sync.algorithm='hierarchical'", "grad_sync.comm_dtype='int4'",
                     "grad_sync.error_feedback=True"],
}
POD = "4xv5litepod-256"
#: The language model's compile configs and the slices each is priced on.
LM = {"1b": ["v6e-256", "v5litepod-256"], "8b": ["v5p-256"]}
SINGLE = ["v5litepod-256", "v4-512", "v5p-512", "v6e-256"]
#: A published measured run to set the roofline beside, and the row that
#: compiles the same per-chip work: MLPerf Training v2.0 (closed, 2022),
#: Google, system tpu-v4-8192 (4,096 TPU v4 chips), ResNet-50 at a global
#: batch of 32,768 (mlcommons/training_results_v2.0,
#: Google/results/cloud-tpu-v4-8192-TF/resnet/result_0.txt: run_start to
#: run_stop 11.77 s, 60 epochs; its 4-epoch blocks of 156 steps take 0.65-0.71 s,
#: about 4.3 ms a step), at 8 images per chip.
MLPERF = ("MLPerf Training v2.0, Google tpu-v4-8192 (4,096 v4 chips), ResNet-50 at 32,768: "
          "11.8 s run_start to run_stop, 60 epochs", 4.3)
MLPERF_ROW = "cal/r50-8perchip/v4-4096"
#: Published wall times (minutes) of the seeds' runs, from benchmarks/tpu_compile.py,
#: and the estimate that study made for the same system (its log, cost model).
SEEDS = {"r50-32k/v3-2048": "ResNet-50 at 32K on a TPU-v3 pod (2,048 cores)",
         "bert-large/v3-2048/mb4": "BERT-large, LAMB, on 1,024 TPU v3 chips"}


def _spec(example: str, accelerator: str, slices: int, batch: int, sets: list[str],
          config: str | None = None) -> dict:
  return {"example": example, "config": config, "sets": sets,
          "accelerator_type": accelerator, "num_slices": slices, "global_batch": batch}


def rows() -> dict[str, dict]:
  """Every row, in the order they run."""
  out = {}
  for sync, sets in SYNCS.items():
    out[f"r50-32k/{POD}/{sync}"] = _spec("resnet50_imagenet", "v5litepod-256", 4, 32768,
                                         R50 + sets)
  for s in SINGLE:
    out[f"r50-32k/{s}/psum"] = _spec("resnet50_imagenet", s, 1, 32768, R50)
  # Weight-update sharding against psum on the same slice (issue 55, item 4).
  # Over more than 4 devices the compiler writes the gradient's reduce-scatter
  # as an all-reduce and a slice on every generation, and here the parameters'
  # all-gather as an all-reduce too (benchmarks/tpu_lowering.py).
  for s in ("v5p-512", "v6e-256"):
    out[f"r50-32k/{s}/shard_update"] = _spec("resnet50_imagenet", s, 1, 32768,
                                             R50 + ["shard_update=True"])
  out["r50-32k/2xv5litepod-256/psum"] = _spec("resnet50_imagenet", "v5litepod-256", 2, 32768,
                                              R50)
  for sync in SYNCS:
    out[f"bert-large/{POD}/{sync}"] = _spec("bert_lamb", "v5litepod-256", 4, 65536,
                                            BERT + SYNCS[sync], BERT_CONFIG)
  # A cheap v3 program, where the cost model is known to answer (128 per core).
  out["cal/r50/v3-32"] = _spec("resnet50_imagenet", "v3-32", 1, 4096,
                               ["dataset='fake'", "ghost_batch_size=32"])
  out["bert-large/v5p-512/psum"] = _spec("bert_lamb", "v5p-512", 1, 65536, BERT, BERT_CONFIG)
  # MLPerf's ResNet-50 per-chip work (8 images a chip) on the largest v4 slice named.
  out[MLPERF_ROW] = _spec("resnet50_imagenet", "v4-4096", 1, 16384,
                          ["dataset='fake'", "ghost_batch_size=8"])
  for model, slices in LM.items():
    for s in slices:
      out[f"lm-{model}/{s}/fsdp"] = _spec("gpt_lm", s, 1, 1024, [],
                                          f"examples/gpt_lm/configs/llama_{model}.py")
  # Two v5p slices of 1,024 chips each (2,048 devices): ResNet-50 at 16 images
  # per chip (ghost batches of 16), BERT-large, and the 8 B model at 2,048
  # sequences of 4,096 tokens, one per device.
  out["r50-32k/2xv5p-2048/psum"] = _spec("resnet50_imagenet", "v5p-2048", 2, 32768,
                                         ["dataset='fake'", "ghost_batch_size=16"])
  out["bert-large/2xv5p-2048/psum"] = _spec("bert_lamb", "v5p-2048", 2, 65536, BERT,
                                            BERT_CONFIG)
  for example in ("mnist1d_lstm", "mnist_lstm"):  # two rows per device
    out[f"{example}/2xv5p-2048/psum"] = _spec(example, "v5p-2048", 2, 4096,
                                              ["batch_size=4096"])
  out["lm-8b/2xv5p-2048/fsdp"] = _spec("gpt_lm", "v5p-2048", 2, 2048,
                                       ["microbatches=1", "batch_size=2048",
                                        "base_batch_size=2048"],
                                       "examples/gpt_lm/configs/llama_8b.py")
  return out


# -- one row, in a subprocess --------------------------------------------------


#: What the log keeps of each program (the compile report's fields).
_KEEP = ("name", "train_steps", "global_batch", "num_devices", "compile_seconds", "fits",
         "total_bytes", "hbm_bytes", "argument_bytes", "temp_bytes", "flops",
         "bytes_accessed", "loops", "executed_flops", "executed_bytes_accessed", "peak_flops",
         "loops_counted", "estimated_seconds", "estimate_source", "estimate_note",
         "cost_model_seconds", "roofline_seconds", "roofline_overlap_seconds",
         "roofline_compute_seconds", "roofline_memory_seconds", "roofline_ici_seconds",
         "roofline_dcn_seconds", "ici_bytes", "dcn_bytes", "collective_counts",
         "collective_bytes", "error", "required_bytes")


def plan_row(name: str, cache_dir: str | None) -> dict:
  """One row: `date-optax plan --json` of the row's one candidate (compiled or
  read from plan's cache), its summary and programs."""
  spec = rows()[name]
  cli = os.path.join(os.path.dirname(sys.executable), "date-optax")
  cmd = [cli, "plan", "--example", spec["example"], "--accelerator-type",
         spec["accelerator_type"], "--num-slices", str(spec["num_slices"]),
         "--global-batch", str(spec["global_batch"]), "--json"]
  if spec["config"]:
    cmd += ["--config", spec["config"]]
  for item in spec["sets"]:
    cmd += ["--set", item]
  if cache_dir:
    cmd += ["--cache-dir", cache_dir]
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
  if out.returncode == 2 or not out.stdout.strip():
    return {"error": (out.stderr.strip() or f"exit {out.returncode}")[-1500:]}
  summary = json.loads(out.stdout)["candidates"][0]
  programs = [{k: p.get(k) for k in _KEEP} for p in summary.pop("programs")]
  sets = dict(item.split("=", 1) for item in spec["sets"])
  return {"spec": spec, "summary": summary, "programs": programs,
          "microbatches": int(sets.get("microbatches", 1)),
          **({"error": summary["error"]} if summary.get("error") else {})}


# -- the driver -------------------------------------------------------------------


def run(names: list[str], log: str, timeout: float, cache_dir: str | None,
        retry: bool = False, redo: bool = False) -> None:
  done = _runlog.load_runs(log)
  todo = [n for n in names if redo or n not in done or (retry and "error" in done[n])]
  print(f"{len(todo)} rows to compile ({len(names) - len(todo)} logged)", flush=True)
  for i, name in enumerate(todo):
    start = time.perf_counter()
    print(f"[{i + 1}/{len(todo)}] {name} ...", flush=True)
    cmd = [sys.executable, os.path.abspath(__file__), "--row", name]
    if cache_dir:
      cmd += ["--cache-dir", cache_dir]
    # Its own process group: a row over the limit is stopped with the
    # `date-optax plan` and compiles it started, not only the row's process.
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": ROOT},
                            start_new_session=True)
    try:
      stdout, stderr = proc.communicate(timeout=timeout)
      lines = stdout.strip().splitlines()
      result = json.loads(lines[-1]) if proc.returncode == 0 and lines else {
          "error": (stderr.strip() or f"exit {proc.returncode}")[-1500:]}
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.communicate()
      result = {"error": f"compile exceeded the {timeout:.0f} s limit", "timed_out": True}
    result["wall_seconds"] = round(time.perf_counter() - start, 1)
    _runlog.log_run(log, done, name, result)
    status = "error" if "error" in result else "ok"
    print(f"    {status} in {result['wall_seconds']} s", flush=True)


# -- the page ----------------------------------------------------------------------


def times(rec: dict) -> list[tuple[float, float] | None]:
  """Each program's roofline step time (no overlap, full overlap), seconds.

  The roofline counts every loop iteration (`CompileReport.executed_flops`).
  Rows logged before it did (no ``executed_flops``): XLA's cost analysis
  counted a loop's body once, so a program that loops over k microbatches
  has its compute and memory terms taken k times (an upper bound: the
  optimizer's update is in the body's count once, not k times).
  """
  k = rec.get("microbatches", 1)
  out = []
  for p in rec.get("programs", []):
    if p.get("roofline_seconds") is None or p.get("fits") is False:
      out.append(None)
      continue
    scale = k if p.get("loops") and k > 1 and p.get("executed_flops") is None else 1
    comp, mem = scale * p["roofline_compute_seconds"], scale * p["roofline_memory_seconds"]
    comm = p["roofline_ici_seconds"] + p["roofline_dcn_seconds"]
    out.append((max(comp, mem) + comm, max(comp, mem, comm)))
  return out


def to_train(rec: dict) -> dict | None:
  """Hours, chip-hours and USD to train by the roofline (no overlap, full overlap)."""
  s = rec.get("summary") or {}
  ts = times(rec)
  if not ts or any(t is None for t in ts) or "error" in rec:
    return None
  steps = [p["train_steps"] for p in rec["programs"]]
  secs = [sum(n * t[i] for n, t in zip(steps, ts, strict=True)) for i in (0, 1)]
  hours = [x / 3600 for x in secs]
  return {"hours": hours[0], "hours_overlap": hours[1],
          "usd": hours[0] * s["chips"] * s["price_per_chip_hour"],
          "usd_overlap": hours[1] * s["chips"] * s["price_per_chip_hour"],
          "chip_hours": hours[0] * s["chips"], "steps": steps}


def _ok(done: dict, name: str) -> dict | None:
  rec = done.get(name)
  return rec if rec and "error" not in rec and rec.get("programs") else None


def _ms(x) -> str:
  return "–" if x is None else f"{x * 1e3:.3g}"


def _gib(b) -> str:
  return "–" if b is None else f"{b / 2**30:.2f}"


def _mb(b) -> str:
  return "–" if b is None else f"{b / 1e6:.3g}"


def _dur(hours) -> str:
  if hours is None:
    return "–"
  m = hours * 60
  return f"{m:.3g} min" if m < 120 else f"{hours:.3g} h"


def _compile_s(rec: dict) -> float:
  """Seconds the row's programs took to compile (lower + compile), summed."""
  return sum(p.get("compile_seconds") or 0 for p in rec["programs"])


def one_slice(done: dict) -> tuple[dict | None, str]:
  """The one-slice reference of the compile-time goal: this study's
  v5litepod-256 row, else the tpu_compile study's (same slice and batch,
  ghost BN 64)."""
  rec = _ok(done, "r50-32k/v5litepod-256/psum")
  if rec:
    return rec, "r50-32k/v5litepod-256/psum"
  log = _paths.study("tpu_compile") + ".jsonl"
  other = _runlog.load_runs(log).get("r50/v5litepod-256") if os.path.exists(log) else None
  if other and "error" not in other and other["programs"][0].get("global_batch") == 32768:
    return other, "tpu_compile's r50/v5litepod-256 (batch 32,768, ghost BN 64)"
  return None, ""


def loop_factor(p: dict) -> float:
  """A program's executed over counted flops: how much its loops add to what
  XLA's cost analysis (and the TPU cost model) count; a record from before
  the report counted them, with loops, reads as infinite (unknown)."""
  if p.get("executed_flops") is None:
    return math.inf if p.get("loops") else 1.0
  return p["executed_flops"] / p["flops"] if p.get("flops") else 1.0


def goals(done: dict) -> list[tuple[str, str, str]]:
  """Each goal of the issue: (goal, met / missed / not run, the numbers)."""
  out = []
  pod = _ok(done, f"r50-32k/{POD}/psum")
  one, which = one_slice(done)
  failed = done.get(f"r50-32k/{POD}/psum")
  if pod and one:
    ratio = _compile_s(pod) / _compile_s(one)
    out.append(("Multislice compiles for 4 x v5litepod-256; compile time of 4 slices at most "
                "2x one slice's", "met" if ratio <= 2 else "missed",
                f"4 slices {_compile_s(pod):.0f} s, 1 slice {_compile_s(one):.0f} s "
                f"({which}): {ratio:.2f}x (ResNet-50, batch 32,768, psum)"))
  elif failed and "error" in failed:
    out.append(("Multislice compiles for 4 x v5litepod-256", "missed",
                failed["error"].strip().splitlines()[-1][:200]))
  else:
    out.append(("Multislice compiles for 4 x v5litepod-256, at most 2x one slice's compile "
                "time", "not run", ""))
  v5p = {n: _ok(done, n) for n in rows() if "/2xv5p-2048/" in n}
  compiled = [n for n, rec in v5p.items() if rec and all(p.get("fits") for p in rec["programs"])]
  out.append(("Multislice compiles for 2 x a v5p slice of 1,024 or more chips, every example",
              "met" if compiled and len(compiled) == len(v5p) else
              "partly met" if compiled else "not run",
              f"compiled and fit on 2 x v5p-2048 (2,048 devices): {', '.join(compiled) or '–'}"
              + "".join(f"; {n}: not done" for n in v5p if n not in compiled)))
  for model in ("r50-32k", "bert-large"):
    f32 = _ok(done, f"{model}/{POD}/hier-f32") or _ok(done, f"{model}/{POD}/psum")
    for fmt, limit in (("int8", 3.5), ("int4", 7)):
      rec = _ok(done, f"{model}/{POD}/hier-{fmt}-ef")
      goal = f"{model}: hierarchical {fmt} sends at most 1/{limit:g} of float32's DCN bytes"
      if not (f32 and rec):
        errs = [f"{n}: {done[n]['error'].strip().splitlines()[-1][:120]}"
                for n in (f"{model}/{POD}/hier-{fmt}-ef", f"{model}/{POD}/psum")
                if n in done and "error" in done[n]]
        out.append((goal, "not done" if errs else "not run", "; ".join(errs)))
        continue
      a = sum(p["dcn_bytes"] or 0 for p in rec["programs"])
      b = sum(p["dcn_bytes"] or 0 for p in f32["programs"])
      ref = "hierarchical float32" if _ok(done, f"{model}/{POD}/hier-f32") else "psum"
      out.append((goal, "met" if b and a <= b / limit else "missed",
                  f"{_mb(a)} MB against {_mb(b)} MB per device ({ref}): 1/{b / a:.2f}"
                  if a else "no DCN bytes"))
  pairs = [(n, p) for n, rec in sorted(done.items()) if _ok(done, n)
           for p in rec["programs"]
           if p.get("cost_model_seconds") and p.get("roofline_seconds")]
  looped = [(n, p) for n, p in pairs if loop_factor(p) > 1.05]
  pairs = [(n, p) for n, p in pairs if loop_factor(p) <= 1.05]
  if pairs:
    ratios = [p["roofline_seconds"] / p["cost_model_seconds"] for _, p in pairs]
    inside = [r for r in ratios if 0.75 <= r <= 1.25]
    explained = "; ".join(
        f"{n} {p['name'].split(' (')[0]}: {p['roofline_seconds'] / p['cost_model_seconds']:.2f}"
        f" (explained: its loops run {loop_factor(p):.3g}x the flops the cost model counts)"
        for n, p in looped)
    out.append(("the roofline (no overlap) within ±25 % of the cost model where both exist, "
                "or the difference explained",
                "met" if len(inside) == len(ratios) else "missed",
                ", ".join(f"{n} {p['name'].split(' (')[0]}: {r:.2f}"
                          for (n, p), r in zip(pairs, ratios, strict=True))
                + (f"; {explained}" if explained else "")))
  else:
    out.append(("the roofline within ±25 % of the cost model", "not run",
                "no program with both"))
  return out


def report(log: str, md: str, png: str | None) -> str:
  """The page (markdown) and plot from the log; returns the page."""
  done = _runlog.load_runs(log)
  lines = [
      "# What a pod of today costs (issue 57, item 6): the compiler's estimates",
      "",
      f"Command: `{_runlog.command('pods_today.py')}`. Each row is one candidate of "
      "`date-optax plan`: the example's own train step compiled by libtpu on this "
      f"machine ({platform.machine()}, {os.cpu_count()} CPUs, no TPU) for the target, "
      "and priced. **Every time, cost and rate on this page is an estimate — the "
      "roofline of the compiled program on the generation's public rates (or libtpu's "
      "cost model where named) — not a measurement; nothing here ran on a TPU.** "
      "Memory is the compiler's per-device account. Roofline: no overlap = max(compute, "
      "memory) + ICI + DCN; full overlap = the largest of the three. Time to train and "
      "cost use the no-overlap roofline (full overlap in brackets), the example's "
      "`train_steps` and the public on-demand price per chip-hour.", "",
      "| row | chips | fits | GiB/device (HBM) | step ms, no overlap (overlap) | compute ms "
      "| memory ms | ICI ms | DCN ms | DCN MB/device | compile s | steps | time to train | "
      "USD |",
      "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for name in [n for n in rows() if n in done] + [n for n in done if n not in rows()]:
    rec = done[name]
    if "error" in rec and not rec.get("programs"):
      last = (rec["error"].strip().splitlines() or ["(no message)"])[-1]
      lines.append(f"| {name} | not done: {last[:180]} (wall {rec.get('wall_seconds')} s) |"
                   + " |" * 12)
      continue
    s, tt = rec["summary"], to_train(rec)
    k = rec.get("microbatches", 1)
    for i, (p, t) in enumerate(zip(rec["programs"], times(rec), strict=True)):
      label = name if len(rec["programs"]) == 1 else f"{name} {p['name'].split(' (')[0]}"
      looped = " ×k" if p.get("loops") and k > 1 and p.get("executed_flops") is None else ""
      fits = {True: "yes", False: "**no**", None: "–"}[p.get("fits")]
      mem = _gib(p.get("total_bytes") if p.get("fits") is not False else p.get("required_bytes"))
      step = "–" if t is None else f"{_ms(t[0])} ({_ms(t[1])}){looped}"
      last = i == len(rec["programs"]) - 1
      lines.append(
          f"| {label} | {s['chips']:,} | {fits} | {mem} ({_gib(p.get('hbm_bytes'))}) | "
          f"{step} | {_ms(p.get('roofline_compute_seconds'))} | "
          f"{_ms(p.get('roofline_memory_seconds'))} | {_ms(p.get('roofline_ici_seconds'))} | "
          f"{_ms(p.get('roofline_dcn_seconds'))} | {_mb(p.get('dcn_bytes'))} | "
          f"{p.get('compile_seconds') or 0:.0f} | {p.get('train_steps') or '–'} | "
          + (f"{_dur(tt['hours'])} ({_dur(tt['hours_overlap'])}) | "
             f"{tt['usd']:,.0f} ({tt['usd_overlap']:,.0f}) |" if last and tt else " | |"))
  lines += ["", "Compute and memory count every iteration of a program's loops "
            "(microbatches, scanned layers: the compile report's executed flops and bytes). "
            "Rows marked ×k were logged before the report counted them: they loop over k = "
            f"{BERT_MICROBATCHES} microbatches, XLA's cost analysis counted the loop body "
            "once, so their compute and memory terms (shown per microbatch) are taken k "
            "times in the step time (an upper bound; the gradient sync runs once).", ""]
  # Compression across slices.
  lines += ["## When compression pays across slices (4 x v5litepod-256)", "",
            "| model | sync | step ms, no overlap | vs psum | full overlap | vs psum | "
            "DCN ms | DCN MB/device | DCN bytes vs hierarchical float32 |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
  for model in ("r50-32k", "bert-large"):
    base = _ok(done, f"{model}/{POD}/psum")
    f32 = _ok(done, f"{model}/{POD}/hier-f32")
    for sync in SYNCS:
      rec = _ok(done, f"{model}/{POD}/{sync}")
      if not rec:
        continue
      t = [x for x in times(rec) if x]
      tb = [x for x in times(base) if x] if base else []
      step = [sum(x[i] for x in t) for i in (0, 1)] if t else None
      bstep = [sum(x[i] for x in tb) for i in (0, 1)] if tb else None
      dcn = sum(p["dcn_bytes"] or 0 for p in rec["programs"])
      dcn_s = sum(p["roofline_dcn_seconds"] or 0 for p in rec["programs"])
      ref = f32 or base  # hierarchical float32, else psum's float32 (marked *)
      fdcn = sum(p["dcn_bytes"] or 0 for p in ref["programs"]) if ref else 0
      rel = lambda i, step=step, bstep=bstep: (  # noqa: E731
          "–" if not (step and bstep) else f"{step[i] / bstep[i]:.2f}")
      lines.append(
          f"| {model} | {sync} | {_ms(step and step[0])} | {rel(0)} | {_ms(step and step[1])} "
          f"| {rel(1)} | {_ms(dcn_s)} | {_mb(dcn)} | "
          f"{'–' if not (fdcn and dcn) or rec is ref else f'1/{fdcn / dcn:.2f}'}"
          f"{'*' if ref is base and rec is not ref and fdcn and dcn else ''} |")
  lines += ["", "(BERT: both stages' step times summed, ×k as above. *: against psum's "
            "float32 DCN bytes, the hierarchical float32 row of that model not done.)", ""]
  # Compile time.
  lines += ["## Compile time on this machine: slices against one slice", "",
            "| row | devices | compile s (lower + compile) | row wall s | vs 1 slice |",
            "|---|---:|---:|---:|---:|"]
  one, which = one_slice(done)
  for name in (which, "r50-32k/2xv5litepod-256/psum", *(f"r50-32k/{POD}/{s}" for s in SYNCS)):
    rec = one if name == which else _ok(done, name)
    if rec:
      ratio = "–" if not one else f"{_compile_s(rec) / _compile_s(one):.2f}"
      lines.append(f"| {name} | {rec['programs'][0]['num_devices']:,} | "
                   f"{_compile_s(rec):.0f} | {rec.get('wall_seconds')} | {ratio} |")
  timed_out = [n for n, r in done.items() if r.get("timed_out")]
  lines += ["", "On a 2-CPU VM shared with other jobs (load average 4-6 while these rows "
            "ran): compile times are this machine's under that load, not a TPU host's."
            + (f" Rows stopped at the per-row limit: {', '.join(timed_out)}." if timed_out
               else ""), ""]
  # Calibration.
  lines += ["## Calibration: the roofline beside libtpu's cost model", "",
            "Where the cost model gives a time (it gives none for Multislice programs and "
            "for some v4/v5e/v6e programs), program by program:", "",
            "| row | program | cost model ms | roofline ms, no overlap | ratio | full overlap "
            "| ratio | bound | loops run × the counted flops |",
            "|---|---|---:|---:|---:|---:|---:|---|---:|"]
  for name, rec in done.items():
    if not _ok(done, name):
      continue
    for p in rec["programs"]:
      cm, r = p.get("cost_model_seconds"), p.get("roofline_seconds")
      if cm and r:
        terms = {"compute": p["roofline_compute_seconds"],
                 "memory": p["roofline_memory_seconds"], "ICI": p["roofline_ici_seconds"],
                 "DCN": p["roofline_dcn_seconds"]}
        lines.append(f"| {name} | {p['name']} | {_ms(cm)} | {_ms(r)} | {r / cm:.2f} | "
                     f"{_ms(p['roofline_overlap_seconds'])} | "
                     f"{p['roofline_overlap_seconds'] / cm:.2f} | "
                     f"{max(terms, key=terms.get)} | {loop_factor(p):.3g} |")
  lines += ["", "A program whose loops (microbatches, scanned layers) run more than the "
            "cost model counts (last column over 1) cannot match it: the cost model, like "
            "XLA's cost analysis, counts a loop's body once; the roofline counts every "
            "iteration.", "", "### Estimated time to train beside published runs", "",
            "| estimate | est. minutes | published run | published minutes | "
            "estimate / published |", "|---|---:|---|---:|---:|"]
  lines += _published_lines()
  rec = _ok(done, MLPERF_ROW)
  if rec:
    p, what, ms = rec["programs"][0], MLPERF[0], MLPERF[1]
    t, t_over = times(rec)[0] or (None, None)
    if t:
      lines += ["", "Per step at the same 8 images per chip (the MLPerf system has 4,096 chips, "
                "`v4-4096` is the largest v4 slice named here: 2,048):", "",
                "| estimate | est. ms a step (full overlap) | published run | published ms a "
                "step | estimate / published |", "|---|---:|---|---:|---:|",
                f"| {MLPERF_ROW} (roofline) | {_ms(t)} ({_ms(t_over)}) | {what} | {ms} | "
                f"{t * 1e3 / ms:.2f} ({t_over * 1e3 / ms:.2f}) |", "",
                "The gap, term by term: compute "
                f"{_ms(p['roofline_compute_seconds'])} ms, memory "
                f"{_ms(p['roofline_memory_seconds'])} ms, ICI "
                f"{_ms(p['roofline_ici_seconds'])} ms. Most of the ICI term is the roofline's "
                "latency model: each all-reduce pays one hop latency per step of a ring over "
                "every device (4,094 µs at 2,048), where a torus reduces along its axes in "
                "tens of hops; the memory term counts XLA's bytes at the HBM rate, where "
                "the submission's own kernels reuse data on chip."]
  lines += lm_lines(done)
  lines += ["", "## Goals of the issue", "", "| goal | status | numbers |", "|---|---|---|"]
  lines += [f"| {g} | {s} | {n} |" for g, s, n in goals(done)]
  missing = [n for n in rows() if n not in done]
  failed = [n for n in rows() if n in done and not _ok(done, n)]
  if missing or failed:
    lines += ["", "## Not done", ""]
    lines += [f"- {n}: not run yet" for n in missing]
    lines += [f"- {n}: {(done[n].get('error') or 'no programs').strip().splitlines()[-1][:200]}"
              for n in failed]
  text = "\n".join(lines) + "\n"
  with open(md, "w") as f:
    f.write(text)
  if png:
    _plot(done, png)
  return text


def model_flops_per_token(config_path: str) -> tuple[float, float, int]:
  """``(6 N + 12 L T d, N, T)`` of a gpt_lm config: the training flops per
  token that MFU counts (Chowdhery et al., "PaLM", 2022, appendix B: N the
  parameters that multiply, the embedding lookup excluded; attention's
  two products over the context T at width d in each of L layers)."""
  import importlib.util  # noqa: PLC0415

  spec = importlib.util.spec_from_file_location("lm_config", os.path.join(ROOT, config_path))
  module = importlib.util.module_from_spec(spec)
  sys.path.insert(0, ROOT)
  spec.loader.exec_module(module)
  c = module.get_config()
  m = c.model
  d, layers, heads = m.d_model, m.num_layers, m.num_heads
  kv, hd = (m.num_kv_heads or heads), d // heads
  n = layers * (2 * d * heads * hd + 2 * d * kv * hd + 3 * d * m.mlp_dim) + d * c.vocab_size
  return 6 * n + 12 * layers * c.seq_len * d, n, c.seq_len


def lm_lines(done: dict) -> list[str]:
  """The language model's rows: tokens per second, MFU, time and cost to train."""
  out = ["", "## The language model on today's slices (issue 56): FSDP x data, AdamW", "",
         "Model FLOP utilisation (MFU) counts 6 N + 12 L T d flops per token (PaLM's "
         "formula: no rematerialisation, no optimizer) over the no-overlap step time at "
         "the chips' bf16 peak; the program's own executed flops per device, remat "
         "included, are beside it. 20 tokens per parameter (Hoffmann et al., 2022).", "",
         "| row | chips | fits | GiB/device (HBM) | step ms, no overlap (overlap) | bound | "
         "tokens/s | MFU (overlap) | executed TFLOP/device | time to train | USD |",
         "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|"]
  for name, rec in done.items():
    if not name.startswith("lm-") or not _ok(done, name):
      continue
    p, (t, t_over) = rec["programs"][0], times(rec)[0] or (None, None)
    per_token, _, length = model_flops_per_token(rec["spec"]["config"])
    tokens = p["global_batch"] * length
    peak = p.get("peak_flops")
    terms = {k: p.get(f"roofline_{k}_seconds") or 0 for k in ("compute", "memory", "ici", "dcn")}
    mfu = "–"
    if t and peak:
      mfu = (f"{per_token * tokens / p['num_devices'] / (t * peak):.1%} "
             f"({per_token * tokens / p['num_devices'] / (t_over * peak):.1%})")
    tt = to_train(rec)
    out.append(
        f"| {name} | {rec['summary']['chips']:,} | {'yes' if p.get('fits') else '**no**'} | "
        f"{_gib(p.get('total_bytes'))} ({_gib(p.get('hbm_bytes'))}) | "
        f"{_ms(t)} ({_ms(t_over)}) | {max(terms, key=terms.get)} | "
        f"{'–' if not t else f'{tokens / t:,.0f}'} | {mfu} | "
        f"{(p.get('executed_flops') or 0) / 1e12:.1f} | "
        + (f"{_dur(tt['hours'])} ({_dur(tt['hours_overlap'])}) | {tt['usd']:,.0f} |" if tt
           else "– | – |"))
  return out


def _published_lines() -> list[str]:
  """The seeds' runs: their published minutes beside the tpu_compile study's estimate."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import tpu_compile  # noqa: PLC0415

  log = _paths.study("tpu_compile") + ".jsonl"
  done = _runlog.load_runs(log) if os.path.exists(log) else {}
  out = []
  for name in SEEDS:
    rec = done.get(name)
    what, minutes = tpu_compile.PUBLISHED[name]
    if not rec or "error" in rec or any(p.get("error") for p in rec["programs"]):
      continue
    progs = rec["programs"]
    if name.startswith("r50"):
      steps = [math.ceil(tpu_compile.R50_EPOCHS * tpu_compile.IMAGENET /
                         progs[0]["global_batch"])]
    else:
      steps = [math.ceil(tpu_compile.BERT_SEQUENCES * 9 // 10 / progs[0]["global_batch"]),
               math.ceil(tpu_compile.BERT_SEQUENCES // 10 / progs[1]["global_batch"])]
    scale = tpu_compile.loop_scale(name, rec)
    est = scale * sum(n * p["estimated_seconds"] for n, p in zip(steps, progs)) / 60
    source = progs[0].get("estimate_source", "cost_model").replace("_", " ")
    out.append(f"| tpu_compile {name} ({source}) | {est:.3g} | {what} | {minutes:g} | "
               f"{est / minutes:.2f} |")
  return out


def _plot(done: dict, png: str) -> None:
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  fig, axes = plt.subplots(1, 2, figsize=(12, 5))
  names, parts = [], []
  for name in rows():
    rec = _ok(done, name)
    if not rec or not name.startswith("r50-32k/"):
      continue
    p = rec["programs"][0]
    if p.get("roofline_seconds") is None:
      continue
    names.append(name.removeprefix("r50-32k/"))
    parts.append([max(p["roofline_compute_seconds"], p["roofline_memory_seconds"]) * 1e3,
                  p["roofline_ici_seconds"] * 1e3, p["roofline_dcn_seconds"] * 1e3])
  y = list(range(len(names)))
  left = [0.0] * len(names)
  for i, (label, color) in enumerate((("max(compute, memory)", "tab:blue"),
                                      ("ICI", "tab:orange"), ("DCN", "tab:red"))):
    vals = [q[i] for q in parts]
    axes[0].barh(y, vals, left=left, color=color, label=label)
    left = [a + b for a, b in zip(left, vals, strict=True)]
  axes[0].set_yticks(y, names, fontsize=7)
  axes[0].invert_yaxis()
  axes[0].set_xlabel("ResNet-50 at 32,768: roofline step ms, no overlap (estimate)")
  axes[0].legend(fontsize=7)
  for name in rows():
    rec = _ok(done, name)
    tt = rec and to_train(rec)
    if not tt:
      continue
    axes[1].scatter(tt["usd"], tt["hours"] * 60,
                    color="tab:green" if name.startswith("bert") else "tab:blue")
    axes[1].annotate(name, (tt["usd"], tt["hours"] * 60), fontsize=6, xytext=(3, 3),
                     textcoords="offset points")
  axes[1].set_xscale("log")
  axes[1].set_yscale("log")
  axes[1].set_xlabel("estimated cost, USD on demand (roofline, no overlap)")
  axes[1].set_ylabel("estimated minutes to train")
  axes[1].grid(alpha=0.3)
  fig.suptitle("Pods of today, compiled by libtpu on a CPU: estimates, not measurements",
               fontsize=10)
  _paths.save_figure(fig, png, dpi=120)


def main(argv=None) -> int:
  parser = _runlog.rows_parser(__doc__.split("\n")[0], timeout=420.0)
  parser.add_argument("--cache-dir", default=None,
                      help="date-optax plan's compile cache (default its own)")
  parser.add_argument("--retry", action="store_true",
                      help="run again the rows logged with an error (a compile over --timeout)")
  parser.add_argument("--redo", action="store_true",
                      help="run again the rows --only selects, logged or not (the last "
                           "record of a row is the one read)")
  parser.add_argument("--row", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.row:
    print(json.dumps(plan_row(args.row, args.cache_dir)))
    return 0
  prefix = _paths.study_out("pods_today", False, args.out)
  log = prefix + ".jsonl"
  if not args.report_only:
    names = [n for n in rows() if n.startswith(args.only)]
    run(names, log, args.timeout, args.cache_dir, args.retry, args.redo)
  print(report(log, prefix + ".md", prefix + ".png"))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
