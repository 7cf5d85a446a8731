"""`make demo` (benchmarks/demo.py) and the MNIST-1D code it shares with the
studies in benchmarks/tasks: data, scaling methods, in-memory training loop."""

from __future__ import annotations

import json
import math
import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks import demo  # noqa: E402
from benchmarks.tasks import data as input_pipeline  # noqa: E402
from benchmarks.tasks import methods, models  # noqa: E402
from benchmarks.tasks import trainer as lstm_train  # noqa: E402


def _momentum_baseline(b0, lr, warmup_epochs, epochs, n):
  return methods.make_baseline("momentum", batch_size=b0, learning_rate=lr,
                               warmup_epochs=warmup_epochs, epochs=epochs,
                               num_examples=n)


def _reference_lr(method, lr0, b0, warmup_epochs, epochs, n, batch):
  """docs/algorithms.md (LEGW, DATE engine) written out in numpy, iterations i = 1..T."""
  k = batch / b0
  total = epochs * (n // batch)
  i = np.arange(1, total + 1, dtype=np.float64)

  def warm_then(peak, w, decay):
    after = (peak * np.clip(1 - i / total, 0, 1) ** 2 if decay == "poly2" else
             np.maximum(peak * (1 - (i - w) / (total - w)), 1e-6))
    return np.where(i <= w, peak * i / w, after)

  if method == "adam":
    return np.full(total, lr0 * math.sqrt(k))
  if method == "linear":
    return warm_then(lr0 * k, round(5 * n / batch), "rc")
  w = round(warmup_epochs * n / b0)  # LEGW: constant warmup iterations
  return warm_then(lr0 * math.sqrt(k), w, "poly2" if method == "legw" else "rc")


@pytest.mark.parametrize("method", ["baseline", "linear", "adam", "legw", "date"])
@pytest.mark.parametrize("k", [1, 4, 64])
def test_scaled_run_schedules_follow_spec(method, k):
  tuned = _momentum_baseline(16, 0.2, 0.1, 30, 32768)
  _, schedule = methods.scaled_run(method, tuned, 16 * k)
  ref = _reference_lr(method, 0.2, 16, 0.1, 30, 32768, 16 * k)
  got = np.asarray(schedule(jnp.arange(len(ref))))
  np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-9)


def test_scaled_run_rejects_unknown_method():
  tuned = _momentum_baseline(16, 0.2, 0.1, 30, 32768)
  with pytest.raises(ValueError, match="method must be one of"):
    methods.scaled_run("sgd", tuned, 64)
  with pytest.raises(ValueError, match="method='date' only"):
    methods.scaled_run("linear", tuned, 64, lower=0.1)


@pytest.mark.parametrize("options,bounds", [({}, (0.5, 1.0)),
                                            ({"lower": 0.01, "upper": 1.0}, (0.01, 1.0))])
def test_date_run_bounds_its_ratios(options, bounds):
  # The DATE run clips every layer's ratio ||w||/||g||: by default to
  # [1/sqrt(k), 1] (k = 4 here), or to the bounds it is given.
  tuned = _momentum_baseline(4, 0.1, 0.1, 1, 64)
  data = input_pipeline.load_mnist1d(64, 16, seed=3)
  tx, _ = methods.scaled_run("date", tuned, 16, **options)
  model = models.LSTMClassifier(hidden_size=8)
  import jax

  import date_optax

  params = model.init(jax.random.key(0), jnp.zeros((1, 40)))
  state = tx.init(params)
  grads = jax.grad(lambda p: jnp.sum(model.apply(p, data.x_train[:16]) ** 2))(params)
  _, state = tx.update(grads, state, params)
  ratios = np.concatenate([np.ravel(r) for r in jax.tree.leaves(date_optax.trust_ratios(state))])
  assert ratios.min() >= bounds[0] - 1e-7 and ratios.max() <= bounds[1] + 1e-7
  assert ratios.min() < bounds[1]  # some layer is actually adapted


def test_load_mnist1d_is_deterministic_cached_and_leaves_global_rng(tmp_path):
  np.random.seed(123)
  expected_next = np.random.rand()
  np.random.seed(123)
  data = input_pipeline.load_mnist1d(100, 30, seed=1, cache_dir=str(tmp_path))
  assert np.random.rand() == expected_next  # global stream untouched
  assert data.x_train.shape == (100, 40) and data.x_test.shape == (30, 40)
  assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int32
  assert set(np.unique(data.y_train)) <= set(range(10))
  assert os.listdir(tmp_path) == ["mnist1d_100_30_seed1.npz"]
  again = input_pipeline.load_mnist1d(100, 30, seed=1, cache_dir=str(tmp_path))
  np.testing.assert_array_equal(again.x_train, data.x_train)
  fresh = input_pipeline.load_mnist1d(100, 30, seed=1)
  np.testing.assert_array_equal(fresh.x_test, data.x_test)


def test_demo_end_to_end_small(tmp_path, capsys, monkeypatch):
  # The demo sets XLA_FLAGS for its process; keep other tests' env as it was.
  monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
  argv = ["--workdir", str(tmp_path), "--num-train", "256", "--num-test",
          "128", "--epochs", "6", "--base-batch", "8", "--scale", "8",
          "--devices", "8", "--no-progress"]
  assert demo.main(argv) == 0
  out = capsys.readouterr().out
  assert "| method | batch | iterations | test accuracy (%) | wall time (s) |" in out
  results = json.load(open(tmp_path / "results.json"))
  runs = {r["method"].split(" ")[0]: r for r in results["runs"]}
  assert [r["batch_size"] for r in results["runs"]] == [8, 64, 64]
  assert [r["iterations"] for r in results["runs"]] == [6 * 32, 6 * 4, 6 * 4]
  assert all(len(r["test_accuracy"]) == 6 for r in results["runs"])
  # End-of-epoch learning rates from the tuned Adam lr 8e-3: DATE peaks at
  # 8e-3 * sqrt(8) after its round(0.1 * 256 / 8) = 3 warmup iterations, the
  # linear run at 8e-3 * 8 after 5 epochs (20 iterations).
  date_lrs = runs["DATE"]["learning_rate"]
  np.testing.assert_allclose(
      date_lrs[0], 8e-3 * math.sqrt(8) * (1 - (4 - 3) / (24 - 3)), rtol=1e-5)
  np.testing.assert_allclose(runs["linear"]["learning_rate"][4], 8e-3 * 8, rtol=1e-5)
  assert results["settings"]["learning_rate"] == demo.TUNED_LEARNING_RATES["adam"]
  assert os.path.getsize(tmp_path / "demo.png") > 10_000
  assert (tmp_path / "results.md").read_text().count("\n| ") == 4


@pytest.mark.parametrize("extra,message", [
    (["--epochs", "0"], "--epochs must be >= 1"),
    (["--base-batch", "64", "--scale", "64", "--num-train", "1024"], "exceeds --num-train"),
    (["--devices", "3"], "must divide evenly over --devices=3"),
    (["--learning-rate", "0"], "--learning-rate must be > 0"),
    (["--seeds", "0,x"], "--seeds must be distinct non-negative integers"),
    (["--seeds", "1,1"], "--seeds must be distinct non-negative integers"),
])
def test_demo_rejects_bad_arguments(tmp_path, capsys, monkeypatch, extra, message):
  monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
  assert demo.main(["--workdir", str(tmp_path), *extra]) == 2
  assert message in capsys.readouterr().err


@pytest.mark.slow  # ~20 s: two seeds of the demo; test_demo_end_to_end_small runs one
def test_demo_over_seeds_reports_mean_and_range(tmp_path, capsys, monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
  argv = ["--workdir", str(tmp_path), "--num-train", "256", "--num-test", "64",
          "--epochs", "6", "--base-batch", "8", "--scale", "8", "--devices", "8",
          "--no-progress", "--seeds", "0,1"]
  assert demo.main(argv) == 0
  out = capsys.readouterr().out
  assert "other CPUs print other last digits" in out
  summary = json.load(open(tmp_path / "results.json"))
  assert summary["seeds"] == [0, 1]
  per_seed = [json.load(open(tmp_path / f"seed{s}" / "results.json")) for s in (0, 1)]
  for i, row in enumerate(summary["summary"]):
    finals = [r["runs"][i]["test_accuracy"][-1] for r in per_seed]
    np.testing.assert_allclose(row["test_accuracy"], finals)
    np.testing.assert_allclose(row["mean"], np.mean(finals))
    assert (row["min"], row["max"]) == (min(finals), max(finals))
    assert f"{row['mean']:.2f} | {row['min']:.2f}–{row['max']:.2f}" in out
  assert os.path.getsize(tmp_path / "demo.png") > 10_000


def test_set_host_device_count_replaces_an_existing_flag(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--foo=1 --xla_force_host_platform_device_count=2")
  demo.set_host_device_count(8)
  assert os.environ["XLA_FLAGS"] == "--foo=1 --xla_force_host_platform_device_count=8"


def test_train_threads_batch_stats_and_evaluates_once_when_asked():
  # A model with batch norm: the loop trains with train=True and mutable
  # batch_stats, and evaluates with the running averages.
  import flax.linen as nn
  import optax

  class BNNet(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
      x = nn.Dense(16)(x)
      x = nn.BatchNorm(use_running_average=not train, momentum=0.5)(x)
      return nn.Dense(10)(nn.relu(x))

  data = input_pipeline.load_mnist1d(256, 64, seed=2)
  r = lstm_train.train(data, optimizer=optax.sgd(0.1), batch_size=32, epochs=3,
                       model=BNNet(), eval_every_epoch=False, learning_rate=0.1)
  assert r.steps == 3 * 8 and r.epochs == [3] and len(r.test_accuracy) == 1
  assert len(r.train_loss) == 3 and not r.diverged
  assert r.train_loss[-1] < r.train_loss[0]
  np.testing.assert_allclose(r.learning_rate, [0.1] * 3)
  # The same seed gives the same run; the LSTM default evaluates every epoch.
  again = lstm_train.train(data, optimizer=optax.sgd(0.1), batch_size=32, epochs=3,
                           model=BNNet(), eval_every_epoch=False)
  np.testing.assert_array_equal(again.train_loss, r.train_loss)
  lstm = lstm_train.train(data, optimizer=optax.adam(1e-2), batch_size=64, epochs=2,
                          model=models.LSTMClassifier(hidden_size=8))
  assert lstm.epochs == [1, 2] and len(lstm.test_accuracy) == 2
  with pytest.raises(ValueError, match="batch_size=512 exceeds"):
    lstm_train.train(data, optimizer=optax.sgd(0.1), batch_size=512, epochs=1)
  # Unrolled calls of 3 steps (8 steps an epoch: calls of 3, 3 and 2) train
  # the same run as the scanned epoch, batch statistics included.
  unrolled = lstm_train.train(data, optimizer=optax.sgd(0.1), batch_size=32,
                              epochs=3, model=BNNet(), eval_every_epoch=False,
                              steps_per_call=3)
  np.testing.assert_allclose(unrolled.train_loss, r.train_loss, rtol=1e-5)
  np.testing.assert_allclose(unrolled.test_accuracy, r.test_accuracy)
  for bad in (0, -1, 2.0, True):
    with pytest.raises(ValueError, match="steps_per_call must be None or an integer"):
      lstm_train.train(data, optimizer=optax.sgd(0.1), batch_size=32, epochs=1,
                       steps_per_call=bad)
