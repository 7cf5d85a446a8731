"""Every example resumes exactly: a run stopped by a preemption and rerun ends
bit-identical (results.json: metrics and parameter checksum) to an
uninterrupted run on the same device count, and its metrics.csv has every
step once.

The default tests stop the loop deterministically through the same code path
a SIGTERM takes (`PreemptionGuard.should_stop`); the slow tests send a real
SIGTERM to `python -m examples.<name>.main` mid-run.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from date_optax.checkpoint import PreemptionGuard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOLATILE = {"wall_time"}


def _stop_at(step_to_stop: int):
  """A PreemptionGuard whose signal "arrives" during step `step_to_stop`."""

  class Guard(PreemptionGuard):
    def should_stop(self, step):
      if step == step_to_stop:
        self._received = "SIGTERM"
      return super().should_stop(step)

  return Guard


def _results(workdir) -> dict:
  with open(os.path.join(workdir, "results.json")) as f:
    return {k: v for k, v in json.load(f).items() if k not in VOLATILE}


def _rows(workdir) -> list[tuple[str, str, str]]:
  with open(os.path.join(workdir, "metrics.csv"), newline="") as f:
    return [(r["step"], r["name"], r["value"]) for r in csv.DictReader(f)]


def _assert_same(resumed_dir, reference_dir):
  assert _results(resumed_dir) == _results(reference_dir)
  rows = _rows(resumed_dir)
  keys = [(s, n) for s, n, _ in rows]
  assert len(keys) == len(set(keys)), "a step was logged twice"
  assert sorted(rows) == sorted(_rows(reference_dir))


# example -> (train module, smoke config, step the "signal" arrives at, the
# module whose PreemptionGuard the loop uses: the examples' one loop).
EXAMPLES = {
    "mnist1d_lstm": ("examples.mnist1d_lstm.train", "examples.mnist1d_lstm.configs.smoke",
                     6, "examples._loop"),
    # The adaptive batch grows at steps 11 and 21 (decided at 18, lag 2): the
    # stop at 19 resumes from a state whose growth is decided, not applied.
    "mnist1d_lstm_adaptive": ("examples.mnist1d_lstm.train",
                              "examples.mnist1d_lstm.configs.adaptive_smoke", 19,
                              "examples._loop"),
    "mnist_lstm": ("examples.mnist_lstm.train", "examples.mnist_lstm.configs.smoke",
                   3, "examples._loop"),
    "resnet50_imagenet": ("examples.resnet50_imagenet.train",
                          "examples.resnet50_imagenet.configs.smoke", 3,
                          "examples._loop"),
    "bert_lamb": ("examples.bert_lamb.train", "examples.bert_lamb.configs.smoke", 12,
                  "examples._loop"),
}
# Three smoke runs of bert_lamb take minutes (8-device compiles of two stages);
# resnet50_imagenet's and mnist_lstm's take 30-60 s, and the loop they share is
# resumed by the MNIST-1D example in the default run. The adaptive batch's
# run (~45 s) is slow too: its exact resume is tested at the step level in
# test_batch_schedule (resume_is_exact[adaptive], growing_batches_resume).
SLOW_IN_PROCESS = {"bert_lamb", "resnet50_imagenet", "mnist_lstm", "mnist1d_lstm_adaptive"}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n in SLOW_IN_PROCESS else n
    for n in sorted(EXAMPLES)])
def test_stopped_and_resumed_run_equals_the_uninterrupted_one(name, tmp_path, monkeypatch):
  import importlib

  train_module, config_module, stop, guard_home = EXAMPLES[name]
  train = importlib.import_module(train_module)
  config = importlib.import_module(config_module).get_config()
  reference = tmp_path / "reference"
  train.train_and_evaluate(config, str(reference))
  resumed = tmp_path / "resumed"
  loop = importlib.import_module(guard_home)
  with monkeypatch.context() as m:
    m.setattr(loop, "PreemptionGuard", _stop_at(stop))
    assert train.train_and_evaluate(config, str(resumed)) == {"preempted_at_step": stop}
  assert not (resumed / "results.json").exists()
  train.train_and_evaluate(config, str(resumed))
  _assert_same(resumed, reference)
  if config.get("batch_schedule"):  # a growing batch: the same batch at every step
    sizes = [sorted((int(s), float(v)) for s, n, v in _rows(d) if n == "batch_size")
             for d in (resumed, reference)]
    assert sizes[0] == sizes[1]
    assert [s for s, _ in sizes[0]] == list(range(1, _results(reference)["steps"] + 1))
    assert len({v for _, v in sizes[0]}) > 1  # it grew


def _cli(name, workdir, devices):
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
             JAX_PLATFORMS="cpu")
  extra = ["--nodistributed"] if name == "resnet50_imagenet" else []
  return [sys.executable, "-m", f"examples.{name}.main", *extra,
          f"--config=examples/{name}/configs/smoke.py", f"--workdir={workdir}"], env


@pytest.mark.slow
@pytest.mark.parametrize("name,devices", [
    ("mnist1d_lstm", 4), ("mnist_lstm", 2), ("resnet50_imagenet", 8), ("bert_lamb", 8)])
def test_sigterm_mid_run_then_rerun_equals_uninterrupted(name, devices, tmp_path):
  reference, resumed = tmp_path / "reference", tmp_path / "resumed"
  cmd, env = _cli(name, reference, devices)
  subprocess.run(cmd, env=env, cwd=ROOT, check=True, timeout=300, capture_output=True)
  cmd, env = _cli(name, resumed, devices)
  proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  try:
    deadline = time.monotonic() + 240
    # Wait until training has logged a few steps, then send the notice.
    while not (resumed / "metrics.csv").exists() or len(_rows(resumed)) < 8:
      assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
      time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == 0, out
  assert "SIGTERM: saved step" in out, out
  assert not (resumed / "results.json").exists()
  subprocess.run(cmd, env=env, cwd=ROOT, check=True, timeout=300, capture_output=True)
  _assert_same(resumed, reference)
