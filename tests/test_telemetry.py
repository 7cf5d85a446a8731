"""Tests for trust-ratio telemetry: summaries, the metric writer, the heatmap."""

from __future__ import annotations

import glob
import os
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import date_optax
from date_optax.diagnostics import (
    MetricWriter,
    per_layer_ratios,
    plot_trust_ratio_heatmap,
    read_metrics_csv,
    trust_ratio_summary,
)


def _reference_summary(values, lower, upper):
  """Summary from the definition, in float64 over the flat list of layers."""
  v = np.asarray(values, np.float64)
  f32 = lambda b: float(np.float32(b))
  return {
      "min": v.min(),
      "median": np.median(v),
      "max": v.max(),
      "frac_at_lower": 0.0 if lower is None else float(np.mean(v <= f32(lower))),
      "frac_at_upper": 0.0 if upper is None else float(np.mean(v >= f32(upper))),
  }


_ratio = st.floats(1e-4, 1e3, allow_nan=False, allow_infinity=False)


@given(
    scalars=st.lists(_ratio, min_size=1, max_size=6),
    stacked=st.lists(_ratio, min_size=0, max_size=5),
    bounds=st.sampled_from([(None, None), (0.01, 10.0), (0.5, None), (None, 2.0)]),
)
def test_summary_matches_reference(scalars, stacked, bounds):
  lower, upper = bounds
  # Ratios clipped to the bounds, as the optimizer state holds them.
  clip = lambda x: float(np.clip(np.float32(x), lower or 0.0, upper or np.inf))
  scalars = [clip(x) for x in scalars]
  stacked = [clip(x) for x in stacked]
  ratios = {f"layer{i}": jnp.float32(x) for i, x in enumerate(scalars)}
  if stacked:
    ratios["stack"] = jnp.asarray(stacked, jnp.float32)
  got = trust_ratio_summary(ratios, lower, upper)
  want = _reference_summary(scalars + stacked, lower, upper)
  assert set(got) == set(want)
  for k, v in want.items():
    assert got[k].dtype == jnp.float32 and got[k].shape == ()
    np.testing.assert_allclose(float(got[k]), v, rtol=1e-6, err_msg=k)


def test_summary_counts_bounds_exactly_on_a_known_example():
  ratios = {"a": jnp.float32(0.01), "b": jnp.float32(0.011), "c": jnp.float32(3.0),
            "d": jnp.array([10.0, 9.99, 10.0], jnp.float32)}
  s = trust_ratio_summary(ratios, lower=0.01, upper=10.0, prefix="tr/")
  assert sorted(s) == ["tr/frac_at_lower", "tr/frac_at_upper", "tr/max",
                       "tr/median", "tr/min"]
  np.testing.assert_allclose(float(s["tr/frac_at_lower"]), 1 / 6)
  np.testing.assert_allclose(float(s["tr/frac_at_upper"]), 2 / 6)
  np.testing.assert_allclose(float(s["tr/median"]), (3.0 + 9.99) / 2, rtol=1e-6)


def test_summary_is_jittable_with_traced_bounds():
  ratios = {"a": jnp.array([0.1, 1.0, 5.0]), "b": jnp.float32(5.0)}
  f = jax.jit(lambda r, lo, hi: trust_ratio_summary(r, lo, hi))
  s = f(ratios, jnp.float32(0.1), jnp.float32(5.0))
  np.testing.assert_allclose(float(s["frac_at_lower"]), 0.25)
  np.testing.assert_allclose(float(s["frac_at_upper"]), 0.5)
  np.testing.assert_allclose(float(s["median"]), 3.0)


def test_summary_of_a_real_bounded_lamb_state():
  # At the first step LAMB's direction is about sign(g), so ‖u‖ ≈ sqrt(size):
  # r(w0) ≈ 400 / 4 → upper bound, r(w1) ≈ 2e-3 / 2 → lower bound, r(w2) ≈ 1.
  params = {"w0": jnp.full((4, 4), 100.0), "w1": jnp.full((2, 2), 1e-3),
            "w2": jnp.ones((3, 2))}
  grads = {"w0": jnp.full((4, 4), 1e-3), "w1": jnp.full((2, 2), 5.0),
           "w2": jnp.full((3, 2), 0.5)}
  opt = date_optax.lamb(1e-3, lower=0.01, upper=10.0)
  _, state = opt.update(grads, opt.init(params), params)
  ratios = date_optax.trust_ratios(state)
  flat = np.array([float(x) for x in jax.tree.leaves(ratios)])
  s = trust_ratio_summary(ratios, 0.01, 10.0)
  want = _reference_summary(flat, 0.01, 10.0)
  for k, v in want.items():
    np.testing.assert_allclose(float(s[k]), v, rtol=1e-6, err_msg=k)
  # With these norms w0 hits the upper bound and w1 the lower one.
  assert float(s["frac_at_upper"]) == pytest.approx(1 / 3)
  assert float(s["frac_at_lower"]) == pytest.approx(1 / 3)


def test_summary_rejects_missing_ratios_and_bad_bounds():
  with pytest.raises(ValueError, match="ratios"):
    trust_ratio_summary(None)
  with pytest.raises(ValueError, match="ratios"):
    trust_ratio_summary({})
  with pytest.raises(ValueError, match="lower"):
    trust_ratio_summary({"a": jnp.float32(1.0)}, lower=-1.0)
  with pytest.raises(ValueError, match="upper"):
    trust_ratio_summary({"a": jnp.float32(1.0)}, upper=float("nan"))
  with pytest.raises(TypeError, match="prefix"):
    trust_ratio_summary({"a": jnp.float32(1.0)}, prefix=3)
  # An optimizer that keeps no ratios.
  import optax

  state = optax.sgd(0.1).init({"a": jnp.ones(2)})
  with pytest.raises(ValueError, match="no trust ratios"):
    trust_ratio_summary(date_optax.trust_ratios(state))


def test_per_layer_ratios_names_every_layer():
  ratios = {"enc": {"kernel": jnp.float32(0.5), "blocks": jnp.array([1.0, 2.0, 3.0])},
            "head": (jnp.float32(4.0), jnp.ones((2, 2)))}
  r = per_layer_ratios(ratios)
  assert {k: float(v) for k, v in r.items()} == {
      "enc/blocks[0]": 1.0, "enc/blocks[1]": 2.0, "enc/blocks[2]": 3.0,
      "enc/kernel": 0.5, "head/0": 4.0, "head/1[0,0]": 1.0, "head/1[0,1]": 1.0,
      "head/1[1,0]": 1.0, "head/1[1,1]": 1.0,
  }
  # A dict it returned maps to itself (names are stable).
  assert list(per_layer_ratios(r)) == list(r)


def _read_tfrecords(path):
  """Parses a TensorBoard event file (TFRecord framing) into Event protos."""
  from tensorboardX.proto import event_pb2

  events = []
  with open(path, "rb") as f:
    data = f.read()
  pos = 0
  while pos < len(data):
    (length,) = struct.unpack("<Q", data[pos:pos + 8])
    payload = data[pos + 12:pos + 12 + length]  # skip the length's crc
    pos += 12 + length + 4  # and the payload's crc
    ev = event_pb2.Event()
    ev.ParseFromString(payload)
    events.append(ev)
  return events


def test_metric_writer_csv_and_tensorboard(tmp_path):
  pytest.importorskip("tensorboardX")
  with MetricWriter(tmp_path, tensorboard=True) as w:
    assert w.tensorboard
    w.write_scalars(1, {"loss": 2.5, "tr/max": jnp.float32(3.0)})
    w.write_scalars(jnp.int32(2), {"loss": np.float64(1.25)})
  got = read_metrics_csv(tmp_path / "metrics.csv")
  assert got["loss"][0].tolist() == [1, 2]
  assert got["loss"][1].tolist() == [2.5, 1.25]
  assert got["tr/max"][1].tolist() == [3.0]

  files = glob.glob(os.path.join(tmp_path, "events.out.tfevents.*"))
  assert len(files) == 1
  scalars = [
      (ev.step, v.tag, v.simple_value)
      for ev in _read_tfrecords(files[0])
      for v in ev.summary.value
  ]
  assert sorted(scalars) == [(1, "loss", 2.5), (1, "tr/max", 3.0), (2, "loss", 1.25)]


def test_metric_writer_appends_on_resume_and_last_row_wins(tmp_path):
  with MetricWriter(tmp_path, tensorboard=False) as w:
    for step in range(1, 5):
      w.write_scalars(step, {"loss": float(step)})
  # A resumed run repeats steps 3 and 4 after its checkpoint at step 2.
  with MetricWriter(tmp_path, tensorboard=False) as w:
    for step in range(3, 6):
      w.write_scalars(step, {"loss": 10.0 * step})
  steps, values = read_metrics_csv(tmp_path / "metrics.csv")["loss"]
  assert steps.tolist() == [1, 2, 3, 4, 5]
  assert values.tolist() == [1.0, 2.0, 30.0, 40.0, 50.0]
  with open(tmp_path / "metrics.csv") as f:
    assert sum(line.startswith("step,") for line in f) == 1  # one header


def test_metric_writer_rejects_bad_input(tmp_path):
  w = MetricWriter(tmp_path, tensorboard=False)
  with pytest.raises(ValueError, match="loss"):
    w.write_scalars(0, {"loss": jnp.ones(3)})
  with pytest.raises(ValueError, match="step"):
    w.write_scalars(-1, {"loss": 1.0})
  with pytest.raises(TypeError, match="step"):
    w.write_scalars(1.5, {"loss": 1.0})
  with pytest.raises(TypeError, match="scalars"):
    w.write_scalars(1, [("loss", 1.0)])
  w.close()
  with pytest.raises(ValueError, match="closed"):
    w.write_scalars(1, {"loss": 1.0})
  with pytest.raises(TypeError, match="tensorboard"):
    MetricWriter(tmp_path, tensorboard="yes")



def test_metric_writer_resume_step_drops_rows_after_the_checkpoint(tmp_path):
  with MetricWriter(tmp_path, tensorboard=False) as w:
    for step in range(1, 5):
      w.write_scalars(step, {"loss": float(step), "lr": 0.1})
  # Killed after step 4; the last checkpoint was step 2: the resumed run
  # logs 3.. again, and the file ends with each step exactly once.
  with MetricWriter(tmp_path, tensorboard=False, resume_step=2) as w:
    for step in range(3, 6):
      w.write_scalars(step, {"loss": 10.0 * step, "lr": 0.1})
  with open(tmp_path / "metrics.csv") as f:
    rows = [line.split(",")[:2] for line in f.read().splitlines()[1:]]
  assert [r for r in rows if r[1] == "loss"] == [[str(s), "loss"] for s in range(1, 6)]
  assert len(rows) == len({tuple(r) for r in rows}) == 10
  assert read_metrics_csv(tmp_path / "metrics.csv")["loss"][1].tolist() == [
      1.0, 2.0, 30.0, 40.0, 50.0]


def test_metric_writer_drops_a_torn_last_line(tmp_path):
  with MetricWriter(tmp_path, tensorboard=False) as w:
    w.write_scalars(1, {"loss": 1.0})
  with open(tmp_path / "metrics.csv", "a") as f:
    f.write("2,loss,0.")  # killed mid-write
  with MetricWriter(tmp_path, tensorboard=False, resume_step=1) as w:
    w.write_scalars(2, {"loss": 0.5})
  assert read_metrics_csv(tmp_path / "metrics.csv")["loss"][0].tolist() == [1, 2]


def test_metric_writer_only_process_zero_writes(tmp_path):
  with MetricWriter(tmp_path / "p1", tensorboard=False, process_index=1) as w:
    assert not w.active
    w.write_scalars(1, {"loss": 1.0})
    with pytest.raises(ValueError, match="loss"):  # still validates
      w.write_scalars(1, {"loss": jnp.ones(2)})
  assert not (tmp_path / "p1").exists()
  with pytest.raises(ValueError, match="process_index"):
    MetricWriter(tmp_path, process_index=-1)


class _FakeBucket:
  """`gs://` paths served from a local folder; appending is refused, as GCS does."""

  def __init__(self, root):
    self.root = root
    self.opens = []

  def local(self, path):
    path = os.fspath(path)
    assert path.startswith("gs://"), path
    return os.path.join(self.root, path[len("gs://"):])

  def mocks(self):
    def open_(_, path, mode="r", **kw):
      if "a" in mode:
        raise OSError("Cloud Storage objects cannot be appended to")
      self.opens.append(mode)
      return open(self.local(path), mode, **kw)

    def exists(_, path):
      return os.path.exists(self.local(path))

    def makedirs(_, path, **kw):
      os.makedirs(self.local(path), exist_ok=True)

    def mkdir(_, path, **kw):
      os.makedirs(self.local(path), exist_ok=True)

    return dict(open=open_, exists=exists, makedirs=makedirs, mkdir=mkdir)


def test_metric_writer_on_an_object_store(tmp_path):
  from etils.epath import testing as epath_testing

  bucket = _FakeBucket(tmp_path)
  with epath_testing.mock_epath(**bucket.mocks()):
    uri = "gs://bucket/run1/logs"
    with MetricWriter(uri, tensorboard=None, flush_secs=3600) as w:
      assert w.csv_path == uri + "/metrics.csv" and not w.tensorboard
      writes_before = len(bucket.opens)
      for step in range(1, 4):
        w.write_scalars(step, {"loss": float(step)})
      assert len(bucket.opens) == writes_before  # buffered (flush_secs)
      w.flush()
      assert read_metrics_csv(uri + "/metrics.csv")["loss"][0].tolist() == [1, 2, 3]
      w.write_scalars(4, {"loss": 4.0})
    # close() wrote step 4; a run resumed from step 2 rewrites and goes on.
    assert read_metrics_csv(uri + "/metrics.csv")["loss"][0].tolist() == [1, 2, 3, 4]
    with MetricWriter(uri, resume_step=2, flush_secs=1e-9) as w:
      w.write_scalars(3, {"loss": 30.0})
      # flush_secs elapsed: written through without an explicit flush.
      assert read_metrics_csv(uri + "/metrics.csv")["loss"][1].tolist() == [1.0, 2.0, 30.0]
  with open(tmp_path / "bucket/run1/logs/metrics.csv") as f:
    assert f.read().splitlines()[0] == "step,name,value,wall_time"

def test_heatmap_png_shows_the_ratios(tmp_path):
  import matplotlib.image

  history = []
  for t in range(20):
    history.append({"small": jnp.float32(1e-2), "big": jnp.float32(1e2),
                    "stack": jnp.array([1.0, 1.0 + t], jnp.float32)})
  out = plot_trust_ratio_heatmap(history, tmp_path / "sub" / "heat.png",
                                 steps=list(range(100, 120)), lower=0.01, upper=100.0)
  img = matplotlib.image.imread(out)
  assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 400
  # The heat map has many distinct colours (a blank figure would not).
  colours = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
  assert len(colours) > 50


def test_heatmap_rejects_bad_history(tmp_path):
  with pytest.raises(ValueError, match="empty"):
    plot_trust_ratio_heatmap([], tmp_path / "h.png")
  with pytest.raises(ValueError, match="history\\[1\\]"):
    plot_trust_ratio_heatmap([{"a": 1.0}, {"b": 1.0}], tmp_path / "h.png")
  with pytest.raises(ValueError, match="steps"):
    plot_trust_ratio_heatmap([{"a": 1.0}], tmp_path / "h.png", steps=[1, 2])
  with pytest.raises(TypeError, match="history"):
    plot_trust_ratio_heatmap({"a": 1.0}, tmp_path / "h.png")
  with pytest.raises(ValueError, match="upper"):
    plot_trust_ratio_heatmap([{"a": 1.0}], tmp_path / "h.png", upper=0.0)
