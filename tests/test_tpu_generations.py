"""Today's TPU generations as a VM lists them, Multislice targets, and a quiet libtpu."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import date_optax
import date_optax.parallel as dp
from date_optax._src.parallel.layout import tpu_generations as tg

ROOT = Path(__file__).resolve().parents[1]
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu (pip install 'jax[tpu]') is not installed")
GiB = 2**30


# What `jax.devices()` lists on a VM of each type, and each device's HBM
# (Google Cloud's system-architecture pages: v2/v3 list each TensorCore with
# half the chip's HBM; v4 and v5p one megacore device per chip; v5e and v6e
# one device per chip).
@needs_libtpu
@pytest.mark.xdist_group("libtpu")
@pytest.mark.parametrize("name,devices,hbm_gib", [
    ("v2-8", 8, 8), ("v3-8", 8, 16), ("v4-8", 4, 32), ("v4-32", 16, 32),
    ("v5p-8", 4, 95), ("v5litepod-4", 4, 16), ("v5litepod-8", 8, 16), ("v6e-8", 8, 32),
])
def test_a_slice_has_the_devices_its_vm_lists(name, devices, hbm_gib):
  s = dp.tpu_slice(name)
  assert s.num_devices == devices
  assert s.hbm_per_device == hbm_gib * GiB
  assert len({d.id for d in s.devices}) == devices
  # One device's peak and bandwidth are its chip's share.
  np.testing.assert_allclose(s.peak_flops_per_device * devices, s.peak_flops_per_chip * s.chips)
  np.testing.assert_allclose(s.hbm_bandwidth_per_device * devices,
                             s.facts.hbm_bandwidth_per_chip * s.chips)


def test_every_generation_has_its_public_facts():
  assert {g.name for g in tg.GENERATIONS.values()} == {"v2", "v3", "v4", "v5p", "v5e", "v6e"}
  for g in tg.GENERATIONS.values():
    for field in ("hbm_per_chip", "hbm_bandwidth_per_chip", "peak_flops_per_chip",
                  "ici_bandwidth_per_link", "dcn_bandwidth_per_host", "price_per_chip_hour"):
      assert getattr(g, field) > 0, (g.name, field)
    assert g.ici_links_per_chip == 2 * g.dims  # a torus: two links per axis
    assert g.sources
  # Two sources agree: Google's v5e page gives 6.4 Tbit/s of DCN per 256-chip
  # pod (25 Gbit/s per chip); the scaling book 2.5e10 bytes/s per 8-chip host.
  np.testing.assert_allclose(dp.tpu_generation("v5e").dcn_bandwidth_per_chip,
                             6.4e12 / 8 / 256)


def test_generation_names_people_type():
  assert dp.tpu_generation("v5e") is dp.tpu_generation("v5litepod")
  assert dp.tpu_slice("v5e-8") == dp.tpu_slice("v5litepod-8")
  assert dp.tpu_slice("v5e-8").accelerator_type == "v5litepod-8"
  with pytest.raises(ValueError, match=r"unknown TPU generation 'v7'.*v5e"):
    dp.tpu_generation("v7")
  with pytest.raises(TypeError, match="name"):
    dp.tpu_generation(5)
  with pytest.raises(ValueError, match=r"v5e-N is v5litepod-N"):
    dp.tpu_slice("v5e-12")


def test_multislice_targets_are_refused_where_slices_cannot_join():
  with pytest.raises(ValueError, match=r"num_slices=2: TPU v3 slices cannot be joined.*v5e"):
    dp.tpu_slice("v3-32", num_slices=2)
  with pytest.raises(ValueError, match=r"num_slices must be an integer in \[1, 64\]"):
    dp.tpu_slice("v5e-16", num_slices=0)
  with pytest.raises(TypeError, match="num_slices"):
    dp.tpu_slice("v5e-16", num_slices=2.0)
  s = dp.tpu_slice("v5litepod-256", num_slices=4)
  assert (s.name, s.total_chips, s.hosts) == ("4 x v5litepod-256", 1024, 128)


@needs_libtpu
@pytest.mark.xdist_group("libtpu")
@pytest.mark.parametrize("name,num_slices", [("v5e-16", 2), ("v4-16", 2), ("v6e-8", 4)])
def test_multislice_meshes_put_the_slice_axis_outermost(name, num_slices):
  s = dp.tpu_slice(name, num_slices=num_slices)
  per = s.num_devices // num_slices
  assert s.num_devices == dp.tpu_slice(name).num_devices * num_slices
  mesh = s.data_mesh()
  assert dict(mesh.shape) == {"slice": num_slices, "data": per}
  for i in range(num_slices):  # each row of the outer axis is one whole slice
    assert {d.slice_index for d in mesh.devices[i]} == {i}
  mesh = s.mesh(model=2)
  assert dict(mesh.shape) == {"slice": num_slices, "data": per // 2, "model": 2}
  assert all({d.slice_index for d in mesh.devices[i].flat} == {i} for i in range(num_slices))
  with pytest.raises(ValueError, match="model must be a divisor of the .* devices of one slice"):
    s.mesh(model=3)
  with pytest.raises(ValueError, match="torus_mesh is one slice's torus"):
    s.torus_mesh()


def test_multislice_mesh_over_emulated_devices():
  mesh = dp.multislice_mesh((2, 2), ("data", "model"), num_slices=2)
  assert dict(mesh.shape) == {"slice": 2, "data": 2, "model": 2}
  assert sorted(d.id for d in mesh.devices[0].flat) == [d.id for d in jax.devices()[:4]]
  with pytest.raises(ValueError, match=r"needs 12 devices, got 8"):
    dp.multislice_mesh((6,), ("data",), num_slices=2)
  with pytest.raises(ValueError, match="slice_axis 'data' must differ"):
    dp.multislice_mesh((4,), ("data",), num_slices=2, slice_axis="data")


@needs_libtpu
def test_a_compile_only_process_prints_no_libtpu_start_up_noise():
  env = {k: v for k, v in os.environ.items()
         if k not in tg_env_keys() and k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  env["PYTHONPATH"] = str(ROOT)
  code = ("import date_optax.parallel as dp\n"
          "print(len(dp.tpu_slice('v6e-8').devices))\n")
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120, check=True)
  assert out.stdout.strip() == "8"
  for noise in ("Failed to find host bounds", "E0000", "INVALID_ARGUMENT", "libtpu_init_utils"):
    assert noise not in out.stderr, out.stderr


def tg_env_keys() -> set[str]:
  return set(dp.TpuSlice.compile_only_env())


# -- every builder over (slices x data) axes ----------------------------------


def _loss(p, b):
  return jnp.mean((jnp.tanh(b["x"] @ p["w1"]) @ p["w2"] - b["y"]) ** 2)


def _problem():
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  params = {"w1": 0.3 * jax.random.normal(k1, (8, 16)), "w2": 0.3 * jax.random.normal(k2, (16, 4))}
  x = jax.random.normal(k3, (32, 8))
  return params, {"x": x, "y": jnp.sin(x[:, :4])}


@pytest.mark.parametrize("builder", ["replicated", "sharded", "shard_update"])
def test_builders_run_over_slices_and_data_as_over_one_axis(builder):
  params, batch = _problem()
  tx = date_optax.lamb(1e-2)
  if builder == "sharded":  # (slice, data, model): a model group never crosses slices
    mesh = dp.multislice_mesh((2, 2), ("data", "model"), num_slices=2)
    flat = jax.sharding.Mesh(mesh.devices.reshape(4, 2), ("data", "model"))
    rules = [("w1", P(None, "model")), ("w2", P("model"))]
    make = lambda m: dp.make_train_step(_loss, tx, m, param_sharding=rules)  # noqa: E731
  else:
    mesh = dp.multislice_mesh((4,), ("data",), num_slices=2)
    flat = dp.data_mesh(devices=list(mesh.devices.flat))
    make = lambda m: dp.make_train_step(  # noqa: E731
        _loss, tx, m, shard_update=builder == "shard_update")
  out = []
  for m in (mesh, flat):
    step = make(m)
    state = step.init(params)
    for _ in range(2):
      state, metrics = step(state, batch)
    out.append((jax.device_get(state.params), float(metrics["loss"])))
  (p_multi, l_multi), (p_flat, l_flat) = out
  np.testing.assert_allclose(l_multi, l_flat, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(p_multi), jax.tree.leaves(p_flat), strict=True):
    np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)


@needs_libtpu
@pytest.mark.xdist_group("libtpu")
def test_a_step_over_two_slices_reduces_inside_each_and_across_by_dcn():
  tpu = dp.tpu_slice("v5e-4", num_slices=2)
  f32 = jnp.float32
  params = {"w1": jax.ShapeDtypeStruct((8, 16), f32), "w2": jax.ShapeDtypeStruct((16, 4), f32)}
  batch = {"x": jax.ShapeDtypeStruct((64, 8), f32), "y": jax.ShapeDtypeStruct((64, 4), f32)}
  step = dp.make_train_step(_loss, date_optax.lamb(1e-2), tpu.data_mesh())
  state, batch = step.abstract_state(params), step.abstract_batch(batch)
  report = dp.compile_report(step, state, batch, tpu=tpu)
  assert report.num_devices == 8 and report.fits
  # The compiled program is one slice's: its collectives stay inside the
  # slice (groups of 4), and what crosses slices is a transfer the Multislice
  # runtime makes over DCN (host-transfer send/recv pairs).
  assert {c["group_size"] for c in report.collectives if c["kind"] == "all-reduce"} == {4}
  text = step.compile(state, batch).as_text()
  assert '_xla_megascale_transfer_type="ALL_REDUCE"' in text


# -- the hierarchical sync on the TPU compiler ---------------------------------


def _dcn_payload_types(text):
  """The element types of what a program sends across slices (DCN transfers)."""
  sends = [line for line in text.splitlines()
           if " send(" in line and "_xla_megascale_transfer_type" in line]
  return {m for line in sends for m in re.findall(r"= \(([a-z0-9]+)\[", line)}


@needs_libtpu
@pytest.mark.xdist_group("libtpu")
@pytest.mark.parametrize("name,formats", [("v5e-4", ("int8", "int4")), ("v4-8", ("int4",))])
def test_hierarchical_sync_compresses_only_what_crosses_slices(name, formats):
  tpu = dp.tpu_slice(name, num_slices=2)
  f32 = jnp.float32
  # 2 x 64k parameters: the TPU compile of the low-bit programs grows with
  # the leaves (4x these: 3x the seconds), and the bounds below hold here.
  params = {"w1": jax.ShapeDtypeStruct((128, 512), f32),
            "w2": jax.ShapeDtypeStruct((512, 128), f32)}
  batch = {"x": jax.ShapeDtypeStruct((64, 128), f32), "y": jax.ShapeDtypeStruct((64, 128), f32)}
  out = {}
  for fmt in (None, *formats):
    sync = dp.GradSync("hierarchical", comm_dtype=fmt, error_feedback=fmt is not None)
    step = dp.make_train_step(_loss, optax.sgd(0.1), tpu.data_mesh(), grad_sync=sync)
    state, abstract = step.abstract_state(params), step.abstract_batch(batch)
    report = dp.compile_report(step, state, abstract, tpu=tpu)
    # Inside the slice every collective is XLA's, in float32.
    assert {d for c in report.collectives for d in c["dtypes"]} == {"f32"}, fmt
    out[fmt] = report.dcn_bytes, _dcn_payload_types(step.compile(state, abstract).as_text())
  f32_bytes, f32_types = out[None]
  assert f32_types == {"f32"}
  # Across slices the payload travels in its format: at most 1/3.5 of
  # float32's bytes for int8 and 1/7 for int4 (two 4-bit values per byte on
  # v4 and v5e; block scales of 32 included).
  for fmt, (limit, wire) in {"int8": (1 / 3.5, "s8"), "int4": (1 / 7, "s4")}.items():
    if fmt in out:
      dcn_bytes, types = out[fmt]
      assert wire in types, types
      assert dcn_bytes <= limit * f32_bytes, (fmt, dcn_bytes, f32_bytes)


def test_the_examples_put_num_slices_on_a_slice_axis():
  from examples.bert_lamb import train as bert  # noqa: PLC0415
  from examples.bert_lamb.configs import default as bert_default  # noqa: PLC0415
  from examples.resnet50_imagenet import train as resnet  # noqa: PLC0415
  from examples.resnet50_imagenet.configs import default as resnet_default  # noqa: PLC0415

  config = bert_default.get_config()
  config.num_slices = 2
  assert dict(bert.make_mesh(config).shape) == {"slice": 2, "data": 2, "model": 2}
  config = resnet_default.get_config()
  assert dict(resnet.make_mesh(config).shape) == {"data": 8}
  config.num_slices = 2
  mesh = resnet.make_mesh(config)
  assert dict(mesh.shape) == {"slice": 2, "data": 4}
  assert [d.id for d in mesh.devices.flat] == [d.id for d in jax.devices()]
