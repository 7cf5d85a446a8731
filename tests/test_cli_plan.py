"""``date-optax plan``: candidates compiled for TPU targets, priced, cached."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

import date_optax.parallel as dp
from date_optax._src import cli, cli_plan

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                       reason="libtpu (pip install 'jax[tpu]') is not installed"),
    pytest.mark.xdist_group("libtpu"),
]
SMOKE = "examples/mnist1d_lstm/configs/smoke.py"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch):
  monkeypatch.chdir(ROOT)


@pytest.fixture
def plan(run_cli):
  """`date-optax plan` of the MNIST-1D smoke config: (exit code, stdout, stderr)."""
  return functools.partial(run_cli, "plan", "--example", "mnist1d_lstm", "--config", SMOKE)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("plan_cache")


def test_plan_prices_every_candidate_and_marks_the_best(plan, cache_dir):
  code, out, err = plan("--accelerator-type", "v5e-8,v6e-8", "--num-slices", "1,2",
                        "--global-batch", "64", "--price-per-chip-hour", "v5e=1.5",
                        "--cache-dir", str(cache_dir), "--json")
  assert code == 0, err
  rows = json.loads(out)["candidates"]
  assert [r["candidate"] for r in rows] == [
      "v5litepod-8, batch 64", "2 x v5litepod-8, batch 64",
      "v6e-8, batch 64", "2 x v6e-8, batch 64"]
  from examples.mnist1d_lstm import train  # noqa: PLC0415

  config = cli_plan.cli_compile.load_config(SMOKE, "mnist1d_lstm", [])
  config.batch_size = 64
  steps = train.train_steps(config)
  for r in rows:
    assert r["fits"] and r["error"] is None and not r["cached"]
    (p,) = r["programs"]
    assert p["train_steps"] == steps[0] and p["estimated_seconds"] > 0
    assert 0 < p["roofline_overlap_seconds"] <= p["roofline_seconds"]
    assert (p["dcn_bytes"] > 0) == (r["num_slices"] > 1)
    # Candidates are compared on the roofline with no overlap, on every target.
    seconds = p["roofline_seconds"] * p["train_steps"]
    np.testing.assert_allclose(r["time_to_train_overlap_hours"],
                               p["roofline_overlap_seconds"] * p["train_steps"] / 3600)
    price = 1.5 if r["accelerator_type"].startswith("v5litepod") else 2.70
    np.testing.assert_allclose(r["time_to_train_hours"], seconds / 3600)
    np.testing.assert_allclose(r["chip_hours"], seconds / 3600 * r["chips"])
    np.testing.assert_allclose(r["cost_usd"], seconds / 3600 * r["chips"] * price)
  assert [r["chips"] for r in rows] == [8, 16, 8, 16]
  fastest = min(rows, key=lambda r: r["time_to_train_hours"])
  cheapest = min(rows, key=lambda r: r["cost_usd"])
  assert fastest["fastest"] and sum(r["fastest"] for r in rows) == 1
  assert cheapest["cheapest"] and sum(r["cheapest"] for r in rows) == 1
  assert "v5litepod-8, batch 64 ... compiled" in err

  # The second plan over the same candidates reads every compile from the cache.
  code, out, err = plan("--accelerator-type", "v5e-8,v6e-8", "--num-slices", "1,2",
                        "--global-batch", "64", "--price-per-chip-hour", "v5e=1.5",
                        "--cache-dir", str(cache_dir), "--json")
  again = json.loads(out)["candidates"]
  assert code == 0 and all(r["cached"] for r in again)
  assert [r["cost_usd"] for r in again] == [r["cost_usd"] for r in rows]


def test_plan_prints_a_table_and_a_plot(plan, cache_dir, tmp_path):
  plot = tmp_path / "plan.png"
  code, out, _ = plan("--accelerator-type", "v5e-8", "--num-slices", "1,2",
                      "--global-batch", "64", "--cache-dir", str(cache_dir),
                      "--plot", str(plot))
  assert code == 0
  assert "not measurements" in out and "FASTEST" in out and "CHEAPEST" in out
  assert "2 x v5litepod-8, batch 64" in out
  assert plot.stat().st_size > 10_000


@pytest.mark.parametrize("args,lines", [
    (("--accelerator-type", "v3-48"), ["unknown accelerator_type 'v3-48'"]),
    (("--accelerator-type", "v3-8,v5e-8", "--num-slices", "2"),
     ["num_slices=2: TPU v3 slices cannot be joined"]),
    (("--accelerator-type", "v5e-8", "--global-batch", "100,12"),
     ["global batch 100 does not split over the 8 devices",
      "global batch 12 does not split over the 8 devices"]),
    (("--accelerator-type", "v5e-8", "--num-slices", "0"), ["--num-slices: '0' is not valid"]),
    (("--accelerator-type", "v5e-8", "--price-per-chip-hour", "-1"),
     ["--price-per-chip-hour must be a positive number"]),
    (("--accelerator-type", "v5e-8", "--price-per-chip-hour", "v9=1"),
     ["unknown TPU generation 'v9'"]),
])
def test_plan_names_each_bad_input_in_one_line(plan, args, lines):
  code, out, err = plan(*args)
  assert code == 2 and out == ""
  errors = err.strip().splitlines()
  assert len(errors) == len(lines), err
  for line, message in zip(errors, lines, strict=True):
    assert line.startswith("date-optax plan: error: ") and message in line
  assert "Traceback" not in err


def test_plan_without_libtpu_says_how_to_install_it(plan, monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "libtpu" else real(name, *a))
  code, _, err = plan("--accelerator-type", "v5e-8")
  assert code == 2 and "pip install 'jax[tpu]'" in err


def test_a_candidate_that_fails_to_compile_does_not_hide_the_others(plan, tmp_path,
                                                                     monkeypatch):
  from examples.mnist1d_lstm import train  # noqa: PLC0415

  real = train.compile_target

  def target(config, tpu):
    if tpu.generation == "v6e":
      raise RuntimeError("INTERNAL: a compiler error\nwith a long trace")
    return real(config, tpu)

  monkeypatch.setattr(train, "compile_target", target)
  code, out, _ = plan("--accelerator-type", "v6e-8,v5e-8", "--global-batch", "64",
                      "--cache-dir", str(tmp_path), "--json")
  assert code == 1
  failed, ok = json.loads(out)["candidates"]
  assert failed["error"] == "RuntimeError: INTERNAL: a compiler error" and not failed["fastest"]
  assert ok["fits"] and ok["cost_usd"] > 0 and ok["fastest"] and ok["cheapest"]


def test_compile_command_keeps_finished_programs_when_one_fails(capsys, monkeypatch):
  from examples.mnist1d_lstm import train  # noqa: PLC0415

  real = train.compile_target

  def target(config, tpu):
    (name, step, state, batch), = real(config, tpu)
    broken = step.abstract_batch({"x": batch["x"]})  # no labels: the loss raises
    return [(name, step, state, batch), ("broken", step, state, broken)]

  monkeypatch.setattr(train, "compile_target", target)
  code = cli.main(["compile", "--example", "mnist1d_lstm", "--config", SMOKE,
                   "--accelerator-type", "v5e-8", "--json"])
  result = json.loads(capsys.readouterr().out)
  assert code == 1
  first, broken = result["programs"]
  assert first["fits"] and first["estimated_seconds"] > 0
  assert broken["fits"] is None and broken["failed"].startswith("KeyError")
  assert dp.tpu_slice("v5e-8").num_devices == result["slice"]["num_devices"]
  assert os.getcwd() == str(ROOT)


def test_a_growing_batch_takes_its_steps_from_a_study_log(tmp_path):
  log = tmp_path / "growth.jsonl"
  run = lambda seed, curve, steps: json.dumps({  # noqa: E731
      "key": {"task": "lstm", "method": "adaptive", "seed": seed}, "steps": steps,
      "curve": curve})
  # Seed 0: 10 steps at B0 = 16, 20 at 32, 5 at 64; seed 1: 30 at B0 then 10 at 64.
  log.write_text("\n".join([
      run(0, [{"step": 0, "batch": 16}, {"step": 9, "batch": 16}, {"step": 10, "batch": 32},
              {"step": 30, "batch": 64}], 35),
      run(1, [{"step": 0, "batch": 16}, {"step": 30, "batch": 64}], 40),
      json.dumps({"key": {"task": "lstm", "method": "baseline"}, "steps": 99}),
  ]) + "\n")
  # A second shard of the same log is read too.
  (tmp_path / "growth.2.jsonl").write_text(
      run(2, [{"step": 0, "batch": 8}, {"step": 4, "batch": 16}], 6) + "\n")
  steps = cli_plan.growth_steps(str(log), "lstm:adaptive")
  assert steps == {1.0: (10 + 30 + 4) / 3, 2.0: (20 + 0 + 2) / 3, 4.0: (5 + 10) / 3}
  programs = [{"global_batch": 256}, {"global_batch": 512}, {"global_batch": 1024},
              {"global_batch": 2048}]
  cli_plan.steps_from_growth(programs, 256, steps)
  assert [p["train_steps"] for p in programs] == [15, 7, 5, 0]
  with pytest.raises(ValueError, match="holds no run 'lstm:ramp'"):
    cli_plan.growth_steps(str(log), "lstm:ramp")
  with pytest.raises(ValueError, match="TASK:METHOD"):
    cli_plan.growth_steps(str(log), "lstm")
  with pytest.raises(ValueError, match="is not a file"):
    cli_plan.growth_steps(str(tmp_path / "none.jsonl"), "lstm:adaptive")


def test_growth_log_and_run_go_together(plan):
  code, _, err = plan("--accelerator-type", "v5e-8", "--growth-log", "x.jsonl")
  assert code == 2 and "--growth-log and --growth-run go together" in err


def test_the_cache_key_follows_the_source_not_only_the_version(tmp_path, monkeypatch):
  # An editable checkout keeps its version while its code changes: the key
  # holds a digest of the files, their paths and their bytes.
  import hashlib  # noqa: PLC0415
  import types  # noqa: PLC0415

  import ml_collections  # noqa: PLC0415

  pkg = tmp_path / "plan_fake_pkg"
  (pkg / "sub").mkdir(parents=True)
  (pkg / "__init__.py").write_text("x = 1\n")
  (pkg / "sub" / "m.py").write_text("y = 2\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  first = cli_plan.source_digest("plan_fake_pkg")
  assert cli_plan.source_digest("plan_fake_pkg") == first
  (pkg / "sub" / "m.py").write_text("y = 3\n")
  edited = cli_plan.source_digest("plan_fake_pkg")
  (pkg / "sub" / "m.py").rename(pkg / "sub" / "n.py")
  moved = cli_plan.source_digest("plan_fake_pkg")
  assert len({first, edited, moved}) == 3
  assert cli_plan.source_digest("plan_no_such_package") == hashlib.sha256().hexdigest()[:24]

  config = ml_collections.ConfigDict({"batch_size": 64})
  cand = types.SimpleNamespace(accelerator_type="v5litepod-8", num_slices=1)
  keys = []
  for digest in ("a", "a", "b"):
    monkeypatch.setattr(cli_plan, "source_digest", lambda *names, d=digest: d)
    keys.append(cli_plan.cache_key("mnist1d_lstm", config, cand))
  assert keys[0] == keys[1] != keys[2]
