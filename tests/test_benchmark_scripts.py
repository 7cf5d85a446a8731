"""The accuracy benchmarks run end to end on tiny settings (slow: ~1 min each)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from run_outputs import load_benchmark, study_outputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_quick(script: str, out, **env) -> None:
  """`python benchmarks/<script> --quick --out <out>` on the CPU; it must succeed."""
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "benchmarks", script), "--quick", "--out", str(out)],
      cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, **env),
      capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def _main_quick(tmp_path, name: str, *flags: str):
  """Loads `benchmarks/<name>.py` and runs its `main` once with `flags`, --quick
  and --out under `tmp_path`; returns the module, the output prefix and the
  argv (to run it again)."""
  bench = load_benchmark(name)
  out = str(tmp_path / name)
  argv = [*flags, "--quick", "--out", out]
  assert bench.main(argv) == 0
  return bench, out, argv


@pytest.mark.slow
def test_bench_device_quick_writes_every_ratio(tmp_path):
  """`bench_device.py --quick` on 8 CPU devices (~30 s): both files, finite ratios."""
  _run_quick("bench_device.py", tmp_path)
  res = json.load(open(tmp_path / "bench_device.json"))
  assert res["device"] == {"kind": res["device"]["kind"], "platform": "cpu", "count": 8}
  for pkg in ("jax", "jaxlib", "optax"):
    assert res["versions"][pkg]
  names = {(r["name"], r["case"]) for r in res["ratios"]}
  for name in ("date_optax.lars / optax.lars", "date_optax.lamb / optax.lamb",
               "LARS / momentum SGD", "LAMB / AdamW"):
    assert (name, "small64 (64 leaves)") in names
  for mesh in ("data (8,)", "data x model (4, 2), FSDP rules"):
    assert ("library step / plain jit step", mesh) in names
    assert ("library step (grad_stats) / plain jit step", mesh) in names
    assert ("library program, no wrapper / plain jit step", mesh) in names
    compiled = res["train_step"][mesh]["compiled"]  # kernel counts of both steps
    assert compiled["lib"]["fusions"] >= compiled["plain"]["fusions"] > 0
  assert len(res["ratios"]) == 10 and not res["skipped"]
  for r in res["ratios"]:
    assert len(r["runs"]) >= 1 and r["min"] <= r["median"] <= r["max"]
    assert all(math.isfinite(x) and x > 0 for x in (r["median"], r["min"], r["max"]))
    assert r["goal"] in (1.0, 1.05, 1.3, 1.5)
  for row in ("date_optax.lars", "date_optax.lamb"):  # same math as optax's
    assert res["optimizer_step"]["small64"]["rows"][row]["max_abs_diff_vs_ref"] < 1e-5
  md = open(tmp_path / "bench_device.md").read()
  assert f"({res['device']['platform']} x8)" in md and "| date_optax.lars / optax.lars |" in md
  assert md.count("| optimizer step |") == 4 and md.count("| train step |") == 6
  assert "Compiled train steps: data (8,): lib " in md
  # The library's source named by content, for runs on copies without git.
  digest = hashlib.sha256()
  pkg = pathlib.Path(ROOT, "date_optax")
  for path in sorted(pkg.rglob("*.py")):
    digest.update(f"date_optax/{path.relative_to(pkg).as_posix()}".encode() + b"\0"
                  + path.read_bytes())
  assert res["source_digest"] == digest.hexdigest()[:12]
  assert f"library source {res['source_digest']}" in md


@pytest.mark.slow
def test_growth_device_time_quick_compares_the_two_programs(tmp_path):
  """`growth_device_time.py --quick` (~15 s, one CPU device): rows first runs one
  microbatch of every batch, accumulation B/B0 of B0 rows, and both train alike."""
  _run_quick("growth_device_time.py", tmp_path, XLA_FLAGS="")
  res = json.load(open(tmp_path / "growth_device_time.json"))
  assert res["device"]["devices"] == 1
  first, acc = res["rows"]
  assert (first["mode"], acc["mode"]) == ("rows first", "accumulation only")
  for rows_first, accumulated in zip(first["programs"], acc["programs"], strict=True):
    size = rows_first["global_batch"]
    assert size == accumulated["global_batch"]
    assert (rows_first["microbatches"], rows_first["rows_per_microbatch"]) == (1, size)
    assert (accumulated["microbatches"], accumulated["rows_per_microbatch"]) == (size // 8, 8)
    # The same batches and the same mean gradient: the two runs train alike.
    np.testing.assert_allclose(rows_first["loss"], accumulated["loss"], rtol=1e-4)
    assert rows_first["timed_steps"] >= 5 and rows_first["us_per_example"] > 0
  assert [p["global_batch"] for p in first["programs"]] == [8, 32, 128]
  md = open(tmp_path / "growth_device_time.md").read()
  assert md.count("\n| 8 | ") == 1 and "| 128 | " in md


@pytest.mark.slow
def test_growth_device_time_compile_only_records_every_program(tmp_path):
  """`--compile-only` (~9 s) compiles each mode's programs (one per batch), reports
  their compile seconds and microbatches, and times no step."""
  bench = load_benchmark("growth_device_time")
  assert bench.main(["--quick", "--compile-only", "--out", str(tmp_path)]) == 0
  res = json.load(open(tmp_path / "growth_device_time.json"))
  first, acc = res["rows"]
  b0 = 8 * res["device"]["devices"]
  for row, micro in ((first, lambda size: 1), (acc, lambda size: size // b0)):
    assert [p["global_batch"] for p in row["programs"]] == [b0, 4 * b0, 16 * b0]
    for program in row["programs"]:
      assert program["microbatches"] == micro(program["global_batch"])
      assert program["compile_seconds"] > 0 and "ms_per_step" not in program
  md = open(tmp_path / "growth_device_time.md").read()
  assert f"| {16 * b0} | not timed (1) | not timed (16) | – |" in md


@pytest.mark.slow
def test_batch_scaling_quick_tiny_and_resume(tmp_path):
  bench, out, argv = _main_quick(tmp_path, "batch_scaling", "--epochs", "8",
                                 "--num-train", "1024")
  md, lines = study_outputs(out, bench.LABELS.values())
  # 4 scales x 5 methods, iterations 8 * 1024 / B.
  assert "| iterations | 512 | 128 | 32 | 8 |" in md
  assert len(lines) == 20
  # A second call trains nothing new: every run comes from the log.
  assert bench.main(argv) == 0
  assert len(open(out + ".jsonl").read().splitlines()) == 20
  assert {json.loads(line)["steps"] for line in lines} == {512, 128, 32, 8}


@pytest.mark.slow
def test_batch_scaling_oracle_quick_and_resume(tmp_path):
  bench, out, argv = _main_quick(tmp_path, "batch_scaling", "--oracle")
  oracle = bench._oracle_module()
  md, lines = study_outputs(out, oracle.LABELS.values())
  for task in oracle.TASKS:
    assert f"| {task.label} | 4 |" in md
  # 4 tasks x (3 grid points + 5 methods + 2 variants) at k = 4 (the only
  # scale, so the headline one), one seed.
  assert len(lines) == 40
  recs = [json.loads(line) for line in lines]
  assert {r["key"]["method"] for r in recs} == {
      "grid", *oracle.METHODS, *oracle.VARIANTS}
  assert all(0.0 <= r["accuracy"] <= 100.0 for r in recs)
  # A second call trains nothing new, and --report-only rewrites the table.
  assert bench.main(argv + ["--report-only"]) == 0
  assert len(open(out + ".jsonl").read().splitlines()) == 40
  assert open(out + ".md").read().count("| MNIST-1D") == md.count("| MNIST-1D")


@pytest.mark.slow
def test_gain_study_quick_and_resume(tmp_path):
  bench, out, argv = _main_quick(tmp_path, "gain_study")
  _, lines = study_outputs(out, bench.LABELS.values())
  recs = [json.loads(line) for line in lines]
  assert {r["key"]["method"] for r in recs} == {
      "grid", *bench.OLD_METHODS, *bench.NEW_METHODS}
  gain_runs = [r for r in recs if r["key"]["method"] in bench.NEW_METHODS]
  assert len(gain_runs) == len(bench.NEW_METHODS)
  for r in gain_runs:  # measured through make_train_step(grad_stats=True)
    assert len(r["curve"]) == 2
    assert all(1.0 <= c["gain"] <= 4.0 for c in r["curve"])
    assert all(c["noise_scale"] > 0 for c in r["curve"])
  # The widened grid went past the original edge (x2) until the best was interior.
  factors = {r["key"]["lr_factor"] for r in recs if r["key"]["method"] == "grid"}
  assert max(factors) > 2.0
  n = len(recs)
  assert bench.main(argv + ["--report-only"]) == 0
  assert len(open(out + ".jsonl").read().splitlines()) == n


def test_oracle_grid_points_and_methods_are_what_they_say():
  oracle = load_benchmark("batch_scaling")._oracle_module()
  import date_optax
  task = oracle.TASKS[0]
  data = dict(x_train=np.zeros((16384, 40), np.float32), epochs=20)
  base = oracle.baseline_of(task, 0.05, data)
  r = date_optax.date_recipe(base, 16 * 64)
  assert r.total_steps == 320 and r.peak_learning_rate == pytest.approx(0.4)
  for name in oracle.METHODS + oracle.VARIANTS + ("grid",):
    assert oracle.optimizer_for(name, base, 1024) is not None
  with pytest.raises(ValueError, match="unknown"):
    oracle.optimizer_for("sgd", base, 1024)


@pytest.mark.slow
def test_solver_ladder_quick(tmp_path):
  ladder = load_benchmark("solver_ladder")
  out = str(tmp_path / "sl")
  ladder.QUICK.update(num_train=512, num_test=256, epochs=2, batch=256)
  ladder.GRIDS.clear()
  ladder._RATIO_GRID = (1e-2,)
  for solver in ladder.SOLVERS:
    ladder.GRIDS[(solver, "plain")] = (1e-2,)
  assert ladder.main(["--quick", "--out", out]) == 0
  md = open(out + ".md").read()
  for name in ladder.SOLVER_LABELS.values():
    assert f"| {name} |" in md
  assert len(open(out + ".jsonl").read().splitlines()) == 12


@pytest.mark.slow
def test_low_precision_quick_and_resume(tmp_path):
  """The study trains through make_train_step with int8 payloads, then resumes."""
  study = load_benchmark("low_precision")
  out = str(tmp_path / "lp")
  assert study.main(["--quick", "--out", out, "--tasks", "lstm_date,cnn_gbn"]) == 0
  log = os.path.join(out, "low_precision.jsonl")
  recs = [json.loads(line) for line in open(log)]
  # 2 tasks x (fp32, int8 with APS, int8 without, int8 block 32 + error feedback)
  assert len(recs) == 8
  assert {(r["fmt"], r["aps"], r.get("block_size"), r.get("error_feedback", False))
          for r in recs} == {("float32", False, None, False), ("int8", True, None, False),
                             ("int8", False, None, False), ("int8", False, 32, True)}
  assert len({r["ident"] for r in recs}) == 8
  for r in recs:
    assert 0.0 <= r["accuracy"] <= 100.0 and r["steps"] == 8
  md = open(os.path.join(out, "low_precision_quick.md")).read()
  assert "| int8 | on |" in md and "| int8 | off |" in md
  assert "| int8 | off | 32 | worker + hop |" in md
  assert os.path.exists(os.path.join(out, "low_precision_quick.png"))
  # A second call finds every run in the log and trains nothing.
  assert study.main(["--quick", "--out", out, "--tasks", "lstm_date,cnn_gbn"]) == 0
  assert len(open(log).read().splitlines()) == 8


@pytest.mark.slow
def test_low_precision_bert_task_quick(tmp_path):
  """The BERT task trains through the example's command line on 8 devices."""
  study = load_benchmark("low_precision")
  out = str(tmp_path / "lp")
  assert study.main(["--quick", "--out", out, "--tasks", "bert_lamb"]) == 0
  recs = [json.loads(line) for line in open(os.path.join(out, "low_precision.jsonl"))]
  assert len(recs) == 4 and all(r["steps"] == 8 and r["skipped"] == 0 for r in recs)
  acc = {(r["fmt"], r["aps"], r.get("block_size")): r["accuracy"] for r in recs}
  # int8 with neither APS nor blocks rounds every gradient share to 0: nothing trains.
  assert acc[("int8", False, None)] < 0.5 * acc[("float32", False, None)]
  assert abs(acc[("int8", False, 32)] - acc[("float32", False, None)]) < 1.0


def test_low_precision_tables_the_bert_task_with_its_eval_loss(tmp_path):
  """--no-train tables logged runs: accuracy, Δ to float32 and (BERT) the MLM loss."""
  study = load_benchmark("low_precision")
  out = str(tmp_path / "lp")
  os.makedirs(out)
  cfg = dict(study.QUICK)
  rows = [("float32", False, None, False, 30.0, 2.90), ("int8", True, None, False, 29.5, 2.95),
          ("int8", False, None, False, 10.0, 4.00), ("int8", False, 32, True, 30.2, 2.89)]
  with open(os.path.join(out, "low_precision.jsonl"), "w") as f:
    for fmt, aps, block, ef, acc, loss in rows:
      ident = study._ident("bert_lamb", fmt, aps, "nearest", block, ef, 0, cfg)
      rec = dict(task="bert_lamb", fmt=fmt, aps=aps, seed=0, accuracy=acc, eval_loss=loss,
                 final_loss=loss, skipped=0, steps=8, wall=1.0, finite=True,
                 **({"block_size": block} if block else {}),
                 **({"error_feedback": True, "ef_stages": 2} if ef else {}))
      f.write(json.dumps(dict(ident=ident, **rec)) + "\n")
  assert study.main(["--quick", "--no-train", "--tasks", "bert_lamb", "--out", out]) == 0
  md = open(os.path.join(out, "low_precision_quick.md")).read()
  assert "| payload | APS | block | EF | rounding | accuracy | Δ vs fp32 | eval loss | skip |" in md
  assert "| int8 | on | off | off | nearest | 29.50 (29.50) | -0.50 | 2.9500 (+1.72 %) | 0 |" in md
  assert ("| int8 | off | 32 | worker + hop | nearest | 30.20 (30.20) | +0.20 | 2.8900 (-0.34 %) "
          "| 0 |" in md)
  assert "masked-byte accuracy" in md
  assert os.path.exists(os.path.join(out, "low_precision_quick.png"))


def test_low_precision_bert_runs_pass_the_payload_options_to_the_example(monkeypatch):
  """The BERT task's command line: the ring, the payload and its scaling."""
  study = load_benchmark("low_precision")
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  import bert_scaling

  calls = []

  def fake(flags, devices):
    calls.append((flags, devices))
    return {"eval_accuracy": 0.25, "eval_loss": 3.0, "loss": 3.1, "total_skips": 0,
            "steps": 512}

  monkeypatch.setattr(bert_scaling, "run_example", fake)
  cfg = dict(study.LONG)
  rec = study.train_bert("int4", False, "nearest", 32, True, 1, cfg)
  assert rec["accuracy"] == 25.0 and rec["eval_loss"] == 3.0 and rec["skipped"] == 0
  flags, devices = calls[0]
  assert devices == 8
  for flag in ("--config.grad_sync.algorithm=ring", "--config.grad_sync.comm_dtype=int4",
               "--config.grad_sync.aps=off", "--config.grad_sync.block_size=32",
               "--config.grad_sync.error_feedback=True", "--config.batch_size=128",
               "--config.base_batch_size=2", "--config.seed=1",
               f"--config.num_train_tokens={512 * 128 * 32}"):
    assert flag in flags, flag
  study.train_bert("float32", False, "nearest", None, False, 0, cfg)
  assert "--config.grad_sync.aps=auto" in calls[1][0]
  assert "--config.grad_sync.block_size=0" in calls[1][0]


@pytest.mark.slow
def test_batch_growth_quick_and_resume(tmp_path):
  bench, out, argv = _main_quick(tmp_path, "batch_growth")
  recs = [json.loads(line) for line in open(out + ".jsonl").read().splitlines()]
  task = bench.QUICK["tasks"][0]  # the variants run on the tasks they inform
  rows = {*bench.OLD_METHODS, *bench.NEW_METHODS} - {
      m for m, tasks in bench.VARIANTS.items() if task not in tasks}
  assert {r["key"]["method"] for r in recs} == rows
  assert "date_gain" not in bench.OLD_METHODS + bench.NEW_METHODS  # read, never trained
  total = recs[0]["key"]["epochs"] * recs[0]["key"]["n"]
  for r in recs:
    if r["key"]["method"] in bench.NEW_METHODS:
      # Equal examples (to within the last batch), fewer steps than B0, and at
      # most one program per batch size.
      assert total - 16 * bench.QUICK["scale"] < r["examples"] <= total
      assert r["programs"] <= 8
      sizes = [c["batch"] for c in r["curve"]]
      assert sizes == sorted(sizes) and sizes[0] == 16
  md = open(out + ".md").read()
  for m in rows:
    assert bench.LABELS[m] in md
  assert os.path.getsize(out + ".png") > 10_000
  assert bench.main(argv + ["--report-only"]) == 0
  assert len(open(out + ".jsonl").read().splitlines()) == len(recs)


def test_low_precision_delta_is_paired_by_seed_with_its_standard_error(tmp_path):
  """Δ compares each seed with float32's same seed; a row logged on fewer
  seeds (the earlier error-feedback rule) is compared on those seeds only."""
  study = load_benchmark("low_precision")
  out = str(tmp_path / "lp")
  os.makedirs(out)
  cfg = dict(study.QUICK)
  # (fmt, aps, block, ef, seed, accuracy); "worker": logged before ef_stages.
  rows = [("float32", False, None, False, 0, 30.0), ("float32", False, None, False, 1, 31.0),
          ("float32", False, None, False, 2, 40.0),
          ("int8", True, None, False, 0, 29.5), ("int8", True, None, False, 1, 30.1),
          ("int8", False, 32, "worker", 0, 29.0)]
  with open(os.path.join(out, "low_precision.jsonl"), "w") as f:
    for fmt, aps, block, ef, seed, acc in rows:
      ident = study._ident("lstm_date", fmt, aps, "nearest", block, ef, seed, cfg)
      rec = dict(task="lstm_date", fmt=fmt, aps=aps, seed=seed, accuracy=acc,
                 final_loss=1.0, skipped=0, steps=8, wall=1.0, finite=True,
                 **({"block_size": block} if block else {}),
                 **({"error_feedback": True} if ef else {}))
      f.write(json.dumps(dict(ident=ident, **rec)) + "\n")
  cfg_rows = ["--quick", "--no-train", "--tasks", "lstm_date", "--out", out, "--seeds", "0,1,2"]
  assert study.main(cfg_rows) == 0
  md = open(os.path.join(out, "low_precision_quick.md")).read()
  # Differences -0.5 and -0.9: mean -0.70, standard error 0.2828 / sqrt(2) = 0.20.
  assert "| int8 | on | off | off | nearest | 29.80 (29.50, 30.10) | -0.70 ± 0.20 | 0 |" in md
  assert "| fp32 | — | — | — | — | 33.67 (30.00, 31.00, 40.00) | +0.00 | 0 |" in md
  rec = {"error_feedback": True}
  assert study._ef(rec) == "worker" and study._ef({**rec, "ef_stages": 2}) is True
  assert study._ef({}) is False


def test_growth_pod_time_prices_each_batch_at_its_program(tmp_path):
  """Steps at each k = B/B0 (a curve keeping every change) times the
  program's estimated seconds, over B0's steps at the smallest program."""
  pod = load_benchmark("growth_pod_time")
  growth, compiled = tmp_path / "g.jsonl", tmp_path / "c.jsonl"
  curve = [{"step": 0, "batch": 16}, {"step": 10, "batch": 32}, {"step": 25, "batch": 64}]
  runs = [dict(key=dict(task="mnist1d_lstm_adam", method="baseline", seed=0), steps=400),
          dict(key=dict(task="mnist1d_lstm_adam", method="adaptive_t3", seed=0), steps=40,
               examples=6400, curve=curve),
          dict(key=dict(task="mnist1d_lstm_adam", method="adaptive_d0.9_h4", seed=0),
               steps=30, examples=6400, curve=curve)]
  growth.write_text("".join(json.dumps(dict(ident=str(i), **r)) + "\n"
                           for i, r in enumerate(runs)))
  programs = [dict(global_batch=256 * k, estimated_seconds=s)
              for k, s in ((1, 1.0), (2, 1.5), (4, 2.0))]
  compiled.write_text(json.dumps(dict(ident="growth/v3-128", programs=programs)) + "\n")
  assert pod.steps_per_ratio(curve, 40, 16) == {1: 10, 2: 15, 4: 15}
  out = tmp_path / "pod.md"
  assert pod.main(["--growth-log", str(growth), "--compile-log", str(compiled),
                   "--out", str(out)]) == 0
  md = out.read_text()
  # (10·1.0 + 15·1.5 + 15·2.0) / (400·1.0) = 62.5 / 400.
  assert "| mnist1d_lstm_adam | adaptive_t3 | 0 | 40 (400) | 1: 10, 2: 15, 4: 15 | 0.156 |" in md
  assert "adaptive_t3 0.156" in md and "adaptive_d0.9" not in md


def test_run_log_continues_in_shards_read_as_one_log(tmp_path, monkeypatch):
  """A study's log starts a new shard once the last one holds SHARD_BYTES;
  loading reads every shard, a later record of the same run winning."""
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  import _runlog  # noqa: PLC0415

  monkeypatch.setattr(_runlog, "SHARD_BYTES", 200)
  path, done = str(tmp_path / "study.jsonl"), {}
  for i in range(6):
    _runlog.log_run(path, done, f"run{i}", {"accuracy": float(i), "pad": "x" * 60})
  _runlog.log_run(path, done, "run0", {"accuracy": 9.0, "pad": ""})
  parts = _runlog.shards(path)
  assert parts == [path, *(str(tmp_path / f"study.{i}.jsonl") for i in range(2, len(parts) + 1))]
  assert len(parts) >= 3 and all(os.path.getsize(p) < 200 + 120 for p in parts)
  loaded = _runlog.load_runs(path)
  assert sorted(loaded) == [f"run{i}" for i in range(6)] and loaded == done
  assert loaded["run0"]["accuracy"] == 9.0 and loaded["run5"]["accuracy"] == 5.0


def test_pods_today_scales_looped_programs_and_judges_the_goals(tmp_path):
  """pods_today: a program looping over k microbatches has its compute and
  memory terms taken k times (the sync once); the goals read the log's
  compile times, DCN bytes and cost-model ratios."""
  pods = load_benchmark("pods_today")

  def rec(compile_s, dcn, cost_model=None, loops=0, k=1, steps=100):
    p = dict(name="train (batch 8)", train_steps=steps, compile_seconds=compile_s, fits=True,
             num_devices=4, total_bytes=2**30, hbm_bytes=2**34, loops=loops,
             roofline_compute_seconds=2e-3, roofline_memory_seconds=1e-3,
             roofline_ici_seconds=1e-3, roofline_dcn_seconds=dcn / 1e9, dcn_bytes=dcn,
             roofline_seconds=3e-3 + dcn / 1e9, roofline_overlap_seconds=2e-3,
             cost_model_seconds=cost_model)
    return dict(summary=dict(chips=4, price_per_chip_hour=2.0), programs=[p], microbatches=k)

  looped = rec(1.0, 0.0, loops=1, k=4, steps=3600)
  assert pods.times(looped) == [(4 * 2e-3 + 1e-3, 4 * 2e-3)]
  tt = pods.to_train(looped)
  assert math.isclose(tt["hours"], 9e-3) and math.isclose(tt["usd"], 9e-3 * 4 * 2.0)
  # A record whose report counted every iteration is taken as it is.
  counted = rec(1.0, 0.0, loops=1, k=4)
  counted["programs"][0].update(flops=1e9, executed_flops=4e9)
  assert pods.times(counted) == [(3e-3, 2e-3)] and pods.loop_factor(counted["programs"][0]) == 4
  assert pods.loop_factor(looped["programs"][0]) == math.inf
  pod = f"r50-32k/{pods.POD}"
  log = tmp_path / "p.jsonl"
  records = {f"{pod}/psum": rec(150.0, 8e6), "r50-32k/v5litepod-256/psum": rec(100.0, 0.0,
                                                                               3.5e-3),
             f"{pod}/hier-f32": rec(150.0, 8e6), f"{pod}/hier-int8-ef": rec(150.0, 2e6),
             f"{pod}/hier-int4-ef": rec(150.0, 1.6e6)}
  log.write_text("".join(json.dumps(dict(ident=n, **r)) + "\n" for n, r in records.items()))
  goals = {g: s for g, s, _ in pods.goals(pods._runlog.load_runs(str(log)))}
  assert [s for g, s in goals.items() if g.startswith("Multislice")] == ["met", "not run"]
  assert goals["r50-32k: hierarchical int8 sends at most 1/3.5 of float32's DCN bytes"] == "met"
  # 8 MB / 1.6 MB = 5 < 7.
  assert goals["r50-32k: hierarchical int4 sends at most 1/7 of float32's DCN bytes"] == "missed"
  # Roofline 3 ms against the cost model's 3.5 ms: inside ±25 %; a program
  # whose loops run 4x what the cost model counts is explained, not judged.
  assert [s for g, s in goals.items() if g.startswith("the roofline")] == ["met"]
  records["bert-large/v5p-512/psum"] = rec(10.0, 0.0, 1e-4, loops=1)
  records["bert-large/v5p-512/psum"]["programs"][0].update(flops=1e9, executed_flops=4e9)
  log.write_text("".join(json.dumps(dict(ident=n, **r)) + "\n" for n, r in records.items()))
  goals = {g: (s, n) for g, s, n in pods.goals(pods._runlog.load_runs(str(log)))}
  status, numbers = next(v for g, v in goals.items() if g.startswith("the roofline"))
  assert status == "met" and "30.00 (explained: its loops run 4x" in numbers
  md = pods.report(str(log), str(tmp_path / "p.md"), None)
  assert "| r50-32k | hier-int8-ef |" in md and "not an estimate" not in md


def test_pods_today_counts_the_language_models_flops_per_token():
  """PaLM's 6 N + 12 L T d for the 1.1 B config: N the kernels that multiply
  (22 blocks of q, o 2,048 x 2,048, k, v 2,048 x 256, SwiGLU 3 x 2,048 x
  5,632, and the 2,048 x 32,000 output layer; not the embedding lookup)."""
  pods = load_benchmark("pods_today")
  per_token, n, length = pods.model_flops_per_token("examples/gpt_lm/configs/llama_1b.py")
  blocks = 22 * (2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 5632)
  assert (n, length) == (blocks + 2048 * 32000, 2048)
  assert per_token == 6 * n + 12 * 22 * 2048 * 2048


def test_gpt_lm_study_summarizes_seeds_against_b0_and_writes_its_table(tmp_path):
  """The language-model study's table: the mean and sample sd over seeds, the
  gap to B0's mean in percent, the steps as a fraction of B0's 1,200, runs
  above the unigram entropy counted; the plot written beside it."""
  study = load_benchmark("gpt_lm_study")

  def rec(row, seed, loss, steps, path=None):
    r = dict(row=row, seed=seed, eval_loss=loss, steps=steps, tokens=614_400, wall_s=10.0,
             eval_unigram_entropy=5.5, eval_curve=[[307_200, loss + 0.5], [614_400, loss]])
    return r if path is None else dict(r, path=path)

  done = {"b0/0": rec("b0", 0, 4.0, 1200), "b0/1": rec("b0", 1, 4.2, 1200),
          "grow/0": rec("grow", 0, 4.1, 100, [[512, 8, 300.0], [614_400, 16, 400.0]]),
          "grow/1": rec("grow", 1, 4.3, 140, [[512, 8, 250.0], [614_400, 32, 900.0]]),
          "lamb64/0": rec("lamb64", 0, 5.8, 19)}
  lines = {ln["row"]: ln for ln in study.summarize(done)}
  assert list(lines) == ["b0", "lamb64", "grow"]  # the study's order
  np.testing.assert_allclose(lines["b0"]["eval_loss_sd"], np.std([4.0, 4.2], ddof=1))
  np.testing.assert_allclose(lines["grow"]["gap_pct"], 100 * (4.2 / 4.1 - 1))
  np.testing.assert_allclose(lines["grow"]["step_fraction"], 120 / 1200)
  assert lines["grow"]["worst"] == 4.3 and lines["lamb64"]["eval_loss_sd"] == 0.0
  assert (lines["lamb64"]["diverged"], lines["grow"]["diverged"]) == (1, 0)
  text = study.report(done, str(tmp_path / "gpt_lm"), ["--seeds", "0", "1"])
  assert "| growing B0→64·B0, defaults, k rate (configs/adaptive.py) | 2 | 4.2000 ± 0.1414 " \
         "| 4.3000 | +2.44 % | 120 | 1/10.0 | 0 |" in text
  assert "`python benchmarks/gpt_lm_study.py --seeds 0 1`" in text
  assert (tmp_path / "gpt_lm.md").read_text() == text
  assert (tmp_path / "gpt_lm.png").stat().st_size > 10_000


def test_noise_scale_bound_matches_the_spread_of_smoothed_noise_scales():
  """The host trigger's bound: B = Σw·t / Σw·g of exponentially weighted
  per-step estimates, and its delta-method standard error, against the
  spread of B over 4,000 independent runs of noisy, correlated estimates
  (the standard error must match the measured spread within 10 %, and the
  95 % bound must hold about 95 % of the time)."""
  bench = load_benchmark("gpt_lm_branched")
  rng = np.random.default_rng(0)
  runs, steps, d = 4000, 300, 0.98
  g = 2.0 + 1.5 * rng.standard_normal((runs, steps))
  t = 400.0 + 150.0 * rng.standard_normal((runs, steps)) + 40.0 * (g - 2.0)
  w = (1 - d) * d ** np.arange(steps - 1, -1, -1)  # the weight of each step at the end
  b = (t @ w) / (g @ w)
  bounds = []
  for i in range(200):
    mom = dict(w=w.sum(), w2=(w**2).sum(), g=g[i] @ w, t=t[i] @ w, gg=(g[i] ** 2) @ w,
               tt=(t[i] ** 2) @ w, gt=(g[i] * t[i]) @ w)
    point, low = bench.noise_scale_bound(mom, 1.0)
    np.testing.assert_allclose(point, b[i], rtol=1e-12)
    bounds.append(point - low)
  np.testing.assert_allclose(np.mean(bounds), b.std(), rtol=0.1)
  truth = 400.0 / 2.0
  covered = np.mean([bench.noise_scale_bound(dict(
      w=w.sum(), w2=(w**2).sum(), g=g[i] @ w, t=t[i] @ w, gg=(g[i] ** 2) @ w,
      tt=(t[i] ** 2) @ w, gt=(g[i] * t[i]) @ w), 1.645)[1] <= truth for i in range(1000)])
  assert 0.92 <= covered <= 0.98, covered
  # Nothing measured yet (Σw·g <= 0): no bound, so nothing grows on it.
  assert bench.noise_scale_bound(dict(w=1, w2=1, g=-1, t=5, gg=1, tt=25, gt=-5), 0)[1] == -math.inf


def test_gpt_lm_host_triggers_grow_as_their_rule_says():
  """The branched check on the smoke config: with a tolerance no loss can
  miss it grows at every check (16 → 32 → 64, each check's B branch
  discarded), with -1 (2B must reach a loss <= 0) never; both train every
  sequence of the budget. The noise-scale trigger at z = 0 grows, and at
  z = 1e6 (a bound far below zero) never."""
  import jax  # noqa: PLC0415

  from examples.gpt_lm.configs import smoke  # noqa: PLC0415

  if jax.device_count() % 2:
    pytest.skip("needs an even number of devices")
  bench = load_benchmark("gpt_lm_branched")
  config = smoke.get_config()
  config.optimizer, config.batch_schedule, config.batch_size = "date", "adaptive", 64
  config.num_train_tokens = 16 * 32 * 24
  always = bench.run_branched(config, branch_steps=4, tolerance=1.0, probe_sequences=64,
                              verbose=False)
  assert always["batch_changes"] == [[0, 16], [2, 32], [4, 64]]
  assert always["branch_steps_discarded"] == 8 and always["tokens"] == 16 * 32 * 24
  assert [c[4] for c in always["checks"]] == [True, True]
  assert always["steps"] == 2 + 2 + (24 * 16 - 3 * 64) // 64
  assert [p[1] for p in always["path"]][:5] == [32, 32, 64, 64, 64]
  never = bench.run_branched(config, branch_steps=4, tolerance=-1.0, probe_sequences=64,
                             verbose=False)
  assert never["batch_changes"] == [[0, 16]] and never["steps"] == 24
  assert never["branch_steps_discarded"] == 2 * 6 and np.isfinite(never["eval_loss"])
  config.growth.hold_examples, config.growth.min_steps = 32, 3
  grows = bench.run_lcb(config, z=0.0, eval_every=12, verbose=False)
  assert len(grows["batch_changes"]) > 1 and grows["tokens"] <= 16 * 32 * 24
  held = bench.run_lcb(config, z=1e6, eval_every=12, verbose=False)
  assert held["batch_changes"] == [[0, 16]] and held["steps"] == 24
  assert len(held["path"]) == 24 and held["eval_curve"][-1][0] == 16 * 32 * 24
