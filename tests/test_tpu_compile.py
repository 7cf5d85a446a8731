"""Train steps compiled by the real TPU compiler (libtpu), no TPU needed.

`tpu_slice` gives a Cloud TPU slice's devices as compile targets; the steps
are lowered with abstract states and batches on meshes of them and compiled.
Each check reads the TPU compiler's own output: `memory_analysis`,
`cost_analysis` and the optimized HLO's collectives. Small models on v2-8
and v3-8 keep this file to about a minute.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import date_optax
import date_optax.parallel as dp
from date_optax._src.parallel.layout import tpu_slice as ts

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                       reason="libtpu (pip install 'jax[tpu]') is not installed"),
    pytest.mark.xdist_group("libtpu"),
]

D_IN, D_HID, D_OUT = 128, 512, 128
SDS = jax.ShapeDtypeStruct


def _params():
  f32 = jnp.float32
  return {"dense1": {"kernel": SDS((D_IN, D_HID), f32), "bias": SDS((D_HID,), f32)},
          "dense2": {"kernel": SDS((D_HID, D_OUT), f32), "bias": SDS((D_OUT,), f32)}}


PARAM_BYTES = 4 * (D_IN * D_HID + D_HID + D_HID * D_OUT + D_OUT)


def _loss(p, b):
  h = jnp.tanh(b["x"] @ p["dense1"]["kernel"] + p["dense1"]["bias"])
  return jnp.mean((h @ p["dense2"]["kernel"] + p["dense2"]["bias"] - b["y"]) ** 2)


def _batch(rows):
  return {"x": SDS((rows, D_IN), jnp.float32), "y": SDS((rows, D_OUT), jnp.float32)}


def _report(step, rows=256, tpu=None):
  state = step.abstract_state(_params())
  return dp.compile_report(step, state, _batch(rows), tpu=tpu)


# -- slices ------------------------------------------------------------------


@pytest.mark.parametrize("name,topology,chips,devices,hbm_gib", [
    ("v2-8", "v2:2x2", 4, 8, 8), ("v2-32", "v2:4x4", 16, 32, 8),
    ("v2-512", "v2:16x16", 256, 512, 8), ("v3-32", "v3:4x4", 16, 32, 16),
    ("v3-512", "v3:16x16", 256, 512, 16), ("v3-2048", "v3:32x32", 1024, 2048, 16),
    ("v4-128", "v4:4x4x4", 64, 64, 32), ("v5litepod-256", "v5e:16x16", 256, 256, 16),
])
def test_tpu_slice_names_a_cloud_slice(name, topology, chips, devices, hbm_gib):
  s = dp.tpu_slice(name)
  assert (s.topology, s.chips, s.num_devices) == (topology, chips, devices)
  assert s.hbm_per_device == hbm_gib * 2**30
  assert len({d.id for d in s.devices}) == devices
  assert {d.platform for d in s.devices} == {"tpu"}
  mesh = s.data_mesh()
  assert dict(mesh.shape) == {"data": devices}


def test_tpu_slice_peak_rates_are_the_public_chip_numbers():
  # bf16 TFLOP/s per chip: v2 45, v3 123, v4 275, v5e 197 (Google's pages).
  for name, per_chip in (("v2-8", 45e12), ("v3-8", 123e12), ("v4-8", 275e12),
                         ("v5litepod-8", 197e12)):
    s = dp.tpu_slice(name)
    np.testing.assert_allclose(s.peak_flops_per_device * s.devices_per_chip, per_chip)


def test_unknown_slices_and_meshes_are_refused_with_the_valid_names():
  with pytest.raises(ValueError, match=r"unknown accelerator_type 'v3-48'.*v3-32, v3-64"):
    dp.tpu_slice("v3-48")
  with pytest.raises(ValueError, match="v5litepod-256"):
    dp.tpu_slice("tpu-v3")
  with pytest.raises(TypeError, match="accelerator_type"):
    dp.tpu_slice(512)
  with pytest.raises(ValueError, match=r"model must be a divisor of the 8 devices.*\[1, 2, 4, 8\]"):
    dp.tpu_slice("v3-8").mesh(model=3)


def test_slice_sizes_agree_with_the_tpu_scripts():
  spec = importlib.util.spec_from_file_location("_slices", ROOT / "tpu" / "_slices.py")
  slices = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(slices)
  scripts = {f"{g}-{n}" for g, gen in slices.GENERATIONS.items() for n in gen.sizes}
  assert set(dp.accelerator_types()) == scripts
  for name in ("v2-32", "v3-512", "v5litepod-16"):
    layout = slices.parse_accelerator_type(name)
    s = dp.tpu_slice(name)
    assert (layout.chips, layout.cores) == (s.chips, s.cores)


def test_missing_libtpu_says_how_to_install_it(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "libtpu" else real(name, *a))
  with pytest.raises(ImportError, match=r"pip install 'jax\[tpu\]'"):
    ts.check_libtpu()


# -- the steps compile for the TPU -----------------------------------------------


# Each accelerator with each builder and each optimizer, and every builder with
# every optimizer; the other four combinations with make test-all.
_SLICE_CASES = [("v2-8", "replicated", "lars"), ("v3-8", "replicated", "lamb"),
                ("v2-8", "sharded", "lamb"), ("v3-8", "sharded", "lars")]


@pytest.mark.parametrize("accelerator,builder,opt", [
    c if c in _SLICE_CASES else pytest.param(*c, marks=pytest.mark.slow)
    for c in ((a, b, o) for a in ("v2-8", "v3-8") for b in ("replicated", "sharded")
              for o in ("lars", "lamb"))])
def test_steps_compile_for_tpu_slices(accelerator, builder, opt):
  tpu = dp.tpu_slice(accelerator)
  tx = date_optax.lars(0.1) if opt == "lars" else date_optax.lamb(1e-3)
  if builder == "replicated":
    step = dp.make_train_step(_loss, tx, tpu.data_mesh())
  else:
    step = dp.make_sharded_train_step(_loss, tx, tpu.mesh(model=2),
                                      param_sharding=[(r".*kernel", P(None, "model"))])
  r = _report(step, tpu=tpu)
  assert r.device_kind == f"TPU {accelerator[:2]}" and r.num_devices == 8
  assert r.fits and r.estimated_seconds > 0 and r.flops > 0
  # Parameters and the optimizer's moments (1 for LARS, 2 for LAMB), per
  # device: all of them replicated, half of each kernel model-sharded.
  moments = 1 if opt == "lars" else 2
  kernels = 4 * (D_IN * D_HID + D_HID * D_OUT)
  per_device = PARAM_BYTES - (kernels / 2 if builder == "sharded" else 0)
  rows = 256 // (8 if builder == "replicated" else 4)
  batch_bytes = rows * (D_IN + D_OUT) * 4
  expected = (1 + moments) * per_device + batch_bytes
  # TPU tiles pad small arrays (a 1-D f32 leaf to 1,024 elements): 16 KiB slack.
  assert expected <= r.argument_bytes <= expected + 16384, (r.argument_bytes, expected)
  if builder == "replicated":
    # One gradient all-reduce over the 8 replicas carries every parameter.
    grads = [c for c in r.collectives if c["kind"] == "all-reduce" and c["group_size"] == 8]
    assert sum(c["bytes"] for c in grads) >= PARAM_BYTES


@pytest.mark.parametrize("options", [
    dict(grad_stats=True, microbatches=2),
    dict(grad_sync=dp.GradSync("ring", comm_dtype="int8", error_feedback=True)),
    dict(shard_update=True),
])
def test_step_options_compile_for_tpu(options):
  tpu = dp.tpu_slice("v3-8")
  step = dp.make_train_step(_loss, date_optax.lamb(1e-3), tpu.data_mesh(), **options)
  r = _report(step, tpu=tpu)
  assert r.fits and r.estimated_seconds > 0
  if options.get("microbatches"):
    assert r.loops >= 1  # the accumulation loop, which the cost counts once
  if "grad_sync" in options:  # worker and hop residuals: 2 gradients per device
    assert r.argument_bytes >= 5 * PARAM_BYTES
  if options.get("shard_update"):  # moments split over the 8 replicas
    assert r.argument_bytes < 2 * PARAM_BYTES


def test_sharded_low_bit_step_compiles_for_tpu():
  """The sharded builder's low-bit reduce-scatter with error feedback, (4, 2) mesh."""
  tpu = dp.tpu_slice("v3-8")
  step = dp.make_sharded_train_step(
      _loss, date_optax.lamb(1e-3), tpu.mesh(model=2),
      param_sharding=[(r".*kernel", P(None, "model"))],
      grad_sync=dp.GradSync("ring", comm_dtype="int8", block_size=32, error_feedback=True))
  r = _report(step, tpu=tpu)
  assert r.fits and r.estimated_seconds > 0
  hops = [c for c in r.collectives if c["kind"] == "collective-permute"]
  assert hops and {d for c in hops for d in c["dtypes"]} <= {"s8", "f32", "bf16", "u8", "s32"}
  assert any("s8" in c["dtypes"] for c in hops)


def test_every_program_of_a_batch_schedule_compiles():
  tpu = dp.tpu_slice("v3-8")
  schedule = date_optax.BatchSchedule.adaptive(64, max_batch=256)
  step = dp.make_train_step(_loss, optax.sgd(0.1), tpu.data_mesh(), grad_stats=True,
                            batch_schedule=schedule)
  state = step.abstract_state(_params())
  reports = [dp.compile_report(step, state, step.abstract_batch(_batch(b)), tpu=tpu)
             for b in schedule.batch_sizes]
  assert [r.global_batch for r in reports] == [64, 128, 256]
  assert step.traces == 3 and all(r.fits for r in reports)


def test_abstract_arguments_without_shardings_get_the_steps():
  tpu = dp.tpu_slice("v2-8")
  step = dp.make_train_step(_loss, optax.sgd(0.1), tpu.data_mesh())
  state = jax.tree.map(lambda x: SDS(x.shape, x.dtype), step.abstract_state(_params()))
  compiled = step.compile(state, _batch(64))
  assert compiled.input_shardings[0][1]["x"] == step.batch_sharding
  with pytest.raises(ValueError, match="divisible"):
    step.lower(state, _batch(12))


# -- what the TPU compiler emits ----------------------------------------------


def _mesh_coords(mesh):
  """Mesh coordinates of each SPMD partition id (the ids HLO's pairs name:
  positions in the mesh's flattened device order)."""
  return dict(enumerate(np.ndindex(mesh.devices.shape)))


def test_torus_all_reduce_is_collective_permutes_along_the_two_axes():
  tpu = dp.tpu_slice("v3-8")
  mesh = tpu.torus_mesh()
  x, y = mesh.devices.shape
  step = dp.make_train_step(_loss, optax.sgd(0.1), mesh, grad_sync=dp.GradSync("torus"))
  text = step.compile(step.abstract_state(_params()), _batch(64)).as_text()
  rounds = dp.collective_permute_rounds(text)
  # Reduce-scatter and all-gather along each axis: 2(X - 1) + 2(Y - 1) rounds.
  assert max(r for r, _ in rounds) == 2 * (x - 1) + 2 * (y - 1)
  coords = _mesh_coords(mesh)
  axes_used = set()
  for _, pairs in rounds:
    for src, dst in pairs:
      differ = [i for i in range(2) if coords[src][i] != coords[dst][i]]
      assert len(differ) == 1, (src, dst)  # a neighbour along one mesh axis
      axes_used.add(differ[0])
  assert axes_used == {0, 1}
  assert [c["kind"] for c in dp.collectives(text)].count("all-reduce") <= 1  # the loss


def test_rounds_are_read_from_async_tpu_collective_permutes():
  # v5e's program sends with collective-permute-start, whose result is a
  # tuple with spaces inside its type.
  mesh = dp.tpu_slice("v5e-4").data_mesh()
  f = jax.jit(jax.shard_map(lambda x: dp.ring_all_reduce(x, "data"), mesh=mesh,
                            in_specs=P("data"), out_specs=P("data"), check_vma=False))
  x = SDS((4 * 1024,), jnp.float32, sharding=NamedSharding(mesh, P("data")))
  text = f.lower(x).compile().as_text()
  assert "collective-permute-start" in text
  rounds = dp.collective_permute_rounds(text)
  assert [r for r, _ in rounds] == list(range(1, 7))  # 2(P - 1) rounds, one after another
  assert {pairs for _, pairs in rounds} == {frozenset({(0, 1), (1, 2), (2, 3), (3, 0)})}


@pytest.mark.parametrize("comm_dtype,wire", [("int8", "s8"), ("int4", "s4")])
def test_low_bit_payloads_travel_in_their_type(comm_dtype, wire):
  tpu = dp.tpu_slice("v3-8")
  step = dp.make_train_step(_loss, optax.sgd(0.1), tpu.data_mesh(),
                            grad_sync=dp.GradSync("ring", comm_dtype=comm_dtype))
  r = _report(step, rows=64)
  hops = [c for c in r.collectives if c["kind"] == "collective-permute"]
  assert len(hops) == 2 * (8 - 1)  # the ring's reduce-scatter and all-gather
  assert {d for c in hops for d in c["dtypes"]} == {wire}
  # Each hop carries one chunk: the gradient (and MX block scales) over 8.
  for c in hops:
    assert PARAM_BYTES / 4 / 8 <= c["elements"] <= 1.1 * PARAM_BYTES / 4 / 8
    # TPU v3 stores a 4-bit element in a byte, as an 8-bit one: no packing.
    assert c["bytes"] == c["elements"]


def test_two_shot_block_scales_encode_leaves_where_they_lie():
  """two_shot int8 with blocks of 32 on a v3-8, on leaves whose rows split
  into whole blocks per replica (column blocks): the encode and decode work
  on each leaf as it lies in HBM, no relayout of the gradient. Measured
  23.5× the gradient's bytes accessed and 1.31× in temporaries; the flat
  layout, 32 consecutive elements per scale on 128 lanes, took 82× and 10×.
  The payload travels as int8 in one all-to-all and one all-gather per last
  dimension."""
  tpu = dp.tpu_slice("v3-8")
  mesh = tpu.data_mesh()
  axes, n = mesh.axis_names, 8
  shapes = {"a": (1, 1, 256, 512), "b": (2048, 256), "c": (3, 3, 128, 128)}
  sync = dp.GradSync("two_shot", comm_dtype="int8", block_size=32)
  grads = {k: SDS((n, *v), jnp.float32, sharding=NamedSharding(mesh, P(axes)))
           for k, v in shapes.items()}
  f = jax.jit(jax.shard_map(
      lambda g: jax.tree.map(lambda x: x[None], dp.sync_gradients(
          jax.tree.map(lambda x: x[0], g), axes, sync)),
      mesh=mesh, in_specs=P(axes), out_specs=P(axes), check_vma=False))
  compiled = f.lower(grads).compile()
  grad = sum(4 * math.prod(v) for v in shapes.values())
  assert compiled.memory_analysis().temp_size_in_bytes <= 1.5 * grad
  assert compiled.cost_analysis()["bytes accessed"] <= 30 * grad
  kinds = {}
  for c in dp.collectives(compiled.as_text()):
    kinds.setdefault(c["kind"], set()).update(c["dtypes"])
  assert kinds == {"all-to-all": {"s8"}, "all-gather": {"s8"}}


@pytest.mark.parametrize("accelerator,four_bit", [
    ("v2-8", 1.0), ("v3-8", 1.0), ("v4-8", 0.5), ("v5litepod-8", 0.5)])
def test_which_tpus_pack_4_bit_arrays(accelerator, four_bit):
  """Bytes per element the TPU compiler allots, read from memory_analysis:
  v2 and v3 keep a 4-bit element in a byte, v4 and v5e pack two."""
  devices = dp.tpu_slice(accelerator).devices[:2]
  mesh = jax.sharding.Mesh(np.array(devices), ("d",))
  n = 1 << 16
  stored = {}
  for dtype in (jnp.float32, jnp.bfloat16, jnp.int8, jnp.int4):
    f = jax.jit(jax.shard_map(lambda v: jax.lax.ppermute(v, "d", [(0, 1), (1, 0)]),
                              mesh=mesh, in_specs=P("d"), out_specs=P("d")))
    x = SDS((2 * n,), dtype, sharding=NamedSharding(mesh, P("d")))
    compiled = f.lower(x).compile()
    stored[jnp.dtype(dtype).name] = compiled.memory_analysis().argument_size_in_bytes / n
    # The collectives' reader counts the bytes the layout gives, the same.
    (hop,) = dp.collectives(compiled.as_text())
    assert hop["bytes"] == stored[jnp.dtype(dtype).name] * hop["elements"]
  assert stored == {"float32": 4.0, "bfloat16": 2.0, "int8": 1.0, "int4": four_bit}


def test_fsdp_argument_bytes_fall_with_the_model_axis():
  tpu = dp.tpu_slice("v3-8")
  rules = [(r".*kernel", P(None, "model"))]
  kernel_bytes = 4 * (D_IN * D_HID + D_HID * D_OUT)
  sizes = {}
  for model in (1, 2, 4):
    step = dp.make_sharded_train_step(_loss, optax.sgd(0.1, momentum=0.9), tpu.mesh(model=model),
                                      param_sharding=rules)
    r = _report(step, rows=64)
    rows = 64 // (8 // model)
    sizes[model] = r.argument_bytes - rows * (D_IN + D_OUT) * 4
  for model in (1, 2, 4):  # kernels and their momentum split over "model"
    expected = 2 * (kernel_bytes / model + 4 * (D_HID + D_OUT))
    assert expected <= sizes[model] <= expected + 16384, (model, sizes)


def test_lamb_norm_of_a_model_sharded_layer_is_a_scalar_all_reduce():
  tpu = dp.tpu_slice("v3-8")
  mesh = tpu.mesh(model=2)
  tx = date_optax.lamb(1e-3, weight_decay=0.01)
  kernel = NamedSharding(mesh, P(None, "model"))
  params = {"a": SDS((1024, 1024), jnp.float32, sharding=kernel),
            "b": SDS((1024, 512), jnp.float32, sharding=kernel)}
  state = jax.tree.map(lambda x: SDS(x.shape, x.dtype, sharding=x.sharding if x.ndim == 2
                                     and x.shape in ((1024, 1024), (1024, 512)) else
                                     NamedSharding(mesh, P())),
                       jax.eval_shape(tx.init, params))
  text = jax.jit(tx.update).lower(params, state, params).compile().as_text()
  found = dp.collectives(text)
  assert found and all(c["kind"] == "all-reduce" for c in found), found
  # The squared norms of the weights and of the direction, one scalar (or a
  # few stacked scalars) per layer: never a layer's elements.
  assert all(c["elements"] <= 8 and c["group_size"] == 2 for c in found), found


# -- the command -----------------------------------------------------------------


@pytest.fixture
def run_compile(run_cli):
  """`date-optax compile ARGS` in this process: (exit code, stdout, stderr)."""
  return functools.partial(run_cli, "compile")


def test_compile_command_reports_every_program_of_an_example(run_compile):
  code, stdout, stderr = run_compile(
      "--example", "mnist1d_lstm", "--accelerator-type", "v3-8", "--config",
      "examples/mnist1d_lstm/configs/adaptive_smoke.py", "--json")
  assert code == 0, stderr[-2000:]
  result = json.loads(stdout)
  from examples.mnist1d_lstm import train  # noqa: PLC0415
  from examples.mnist1d_lstm.configs import adaptive_smoke  # noqa: PLC0415

  sizes = train.make_batch_schedule(adaptive_smoke.get_config()).batch_sizes
  assert [p["global_batch"] for p in result["programs"]] == list(sizes)
  assert result["slice"]["topology"] == "v3:2x2"
  for p in result["programs"]:
    assert p["fits"] and p["estimated_seconds"] > 0 and p["hbm_bytes"] == 16 * 2**30
    assert p["collective_counts"]["all-reduce"] >= 1
    np.testing.assert_allclose(p["examples_per_second"], p["global_batch"] / p["estimated_seconds"])
    np.testing.assert_allclose(
        p["mfu"], p["executed_flops"] / (p["estimated_seconds"] * 123e12 / 2))
    assert p["executed_flops"] >= p["flops"]


@pytest.mark.slow  # 30 s: the TPU part of the default run stays about a minute
@pytest.mark.parametrize("example,config,programs", [
    ("resnet50_imagenet", "examples/resnet50_imagenet/configs/smoke.py", 1),
    ("bert_lamb", "examples/bert_lamb/configs/smoke.py", 2),  # two stages
])
def test_compile_command_builds_the_examples_own_steps(example, config, programs, run_compile):
  code, stdout, stderr = run_compile(
      "--example", example, "--accelerator-type", "v3-8", "--config", config, "--json")
  assert code == 0, stderr[-2000:]
  result = json.loads(stdout)["programs"]
  assert len(result) == programs and all(p["fits"] for p in result)
  if example == "bert_lamb":  # (4 data, 2 model): the smoke config's layout
    assert [p["global_batch"] for p in result] == [64, 32]
    groups = {g for p in result for g in p["collective_counts"]}
    assert "all-reduce" in groups


def test_compile_command_prints_a_readable_summary(run_compile):
  code, stdout, stderr = run_compile(
      "--example", "mnist_lstm", "--accelerator-type", "v2-8",
      "--config", "examples/mnist_lstm/configs/smoke.py")
  assert code == 0, stderr[-2000:]
  assert "8 GiB HBM" in stdout and "fits" in stdout
  assert "estimated step time" in stdout and "all-reduce:" in stdout


@pytest.mark.parametrize("args,message", [
    (("--accelerator-type", "v3-48"), "unknown accelerator_type 'v3-48'"),
    (("--accelerator-type", "v3-8", "--set", "batch_size=12"), "divisible"),
    (("--accelerator-type", "v3-8", "--set", "no_such_field=1"), "no field 'no_such_field'"),
    (("--accelerator-type", "v3-8", "--config", "nowhere.py"), "'nowhere.py' not found"),
])
def test_compile_command_refuses_bad_input(args, message, run_compile):
  # An exception instead of the one-line error fails the test.
  code, _, err = run_compile("--example", "mnist1d_lstm", *args)
  assert code == 2 and message in err, err[-2000:]


def test_collectives_read_replica_groups_and_async_pairs():
  text = "\n".join([
      "%ar = f32[256]{0:T(256)} all-reduce(%x), channel_id=1,"
      " replica_groups={{0,1},{2,3}}, to_apply=%add",
      "%ags = (bf16[64]{0}, bf16[256]{0}) all-gather-start(%y),"
      " replica_groups=[2,4]<=[8], dimensions={0}",
      "%agd = bf16[256]{0} all-gather-done(%ags)",
      "%rs = s8[32]{0:T(1024)(128)(4,1)} reduce-scatter(%z),"
      " replica_groups=mesh['x'=2,'y'=4] {'y'}, dimensions={0}",
      "%cp = s4[100]{0:T(1024)(128)(4,1)} collective-permute(%w),"
      " source_target_pairs={{0,1},{1,0}}",
  ])
  found = [(c["kind"], c["elements"], c["bytes"], c["group_size"], c["dtypes"])
           for c in dp.collectives(text)]
  assert found == [("all-reduce", 256, 1024, 2, ["f32"]),
                   ("all-gather", 256, 512, 4, ["bf16"]),
                   ("reduce-scatter", 32 * 4, 32 * 4, 4, ["s8"]),
                   ("collective-permute", 100, 100, 2, ["s4"])]
  # Without a TPU tile, a 4-bit element counts half a byte.
  assert dp.collectives("%c = s4[100]{0} collective-permute(%w), "
                        "source_target_pairs={{0,1}}")[0]["bytes"] == 50


# -- the study's tables ------------------------------------------------------


def _program(batch, devices, seconds, **extra):
  return {"name": f"batch {batch}", "global_batch": batch, "num_devices": devices,
          "compile_seconds": 1.0, "total_bytes": 2**30, "hbm_bytes": 16 * 2**30, "fits": True,
          "flops": 1e12, "estimated_seconds": seconds, "examples_per_second": batch / seconds,
          "mfu": 0.5, "fusions": 10, "loops": 0, "collective_counts": {"all-reduce": 1},
          "collective_bytes": {"all-reduce": 4e6}, **extra}


def test_study_rows_and_time_to_train(tmp_path, monkeypatch):
  monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
  import tpu_compile  # noqa: PLC0415

  names = tpu_compile.rows()
  for s in ("v2-32", "v2-512", "v3-32", "v3-128", "v3-512", "v3-2048", "v4-128",
            "v5litepod-256"):
    assert f"r50/{s}" in names
  assert {"r50-32k/v2-512", "r50-32k/v3-2048", "bert-large/v3-2048"} <= set(names)
  log = tmp_path / "t.jsonl"
  runs = {
      "r50-32k/v2-512": {"programs": [_program(32768, 512, 0.1)]},
      "bert-large/v3-2048": {"programs": [_program(65536, 2048, 0.2),
                                          _program(32768, 2048, 0.3)]},
      "step-update/resnet50/momentum": {
          "programs": [_program(1, 1, 0.002, bytes_per_param=20.5, floor_bytes_per_param=20)],
          "leaves": 10},
      "step-update/resnet50/lars": {
          "programs": [_program(1, 1, 0.003, bytes_per_param=28.25, floor_bytes_per_param=28)],
          "leaves": 10},
      "sync/v3-8/two_shot/int8": {
          "programs": [_program(8, 8, 0.004, bytes_accessed=1.5e9, temp_bytes=75e6)],
          "gradient_bytes": 100e6},
      "sync/v3-128/psum/float32": {"programs": [_program(128, 128, 0.001)]},
      "bert-base/v3-8/psum": {"programs": [_program(
          256, 8, 0.05, temp_bytes=4.5 * 2**30, bytes_accessed=10e9)]},
      "bert-base/v3-8/two_shot-int8": {"programs": [_program(
          256, 8, 0.06, temp_bytes=4.25 * 2**30, bytes_accessed=15e9)]},
  }
  log.write_text("".join(json.dumps({"ident": k, **v}) + "\n" for k, v in runs.items()))
  tpu_compile.report(str(log), str(tmp_path / "t.md"), None)
  text = (tmp_path / "t.md").read_text()
  # 90 epochs of ImageNet at 32K: ceil(90 * 1281167 / 32768) = 3519 steps.
  r50 = 3519 * 0.1 / 60
  assert f"| r50-32k/v2-512 | 3519 | 0.1000 | {r50:.2f} |" in text
  assert f"| {r50 / 7.0:.2f} |" in text
  # LAMB's BERT: 9/10 of 512M sequences at 64K, 1/10 at 32K.
  steps = (math.ceil(512e6 * 9 / 10 / 65536), math.ceil(512e6 / 10 / 32768))
  bert = (steps[0] * 0.2 + steps[1] * 0.3) / 60
  assert f"| bert-large/v3-2048 | {steps[0]} + {steps[1]} | 0.2000 / 0.3000 | {bert:.2f} |" in text
  # LARS over momentum: 3 / 2 ms; floors 7 / 5 passes; fusions 10 over 10 leaves.
  assert "| resnet50 | lars | 3.000 | 1.50 | 28.25 | 28 | 1.40 | 1.00 |" in text
  # The sync rows by slice size, bytes and temporaries in gradients (none
  # where the record predates them).
  v3_8 = text.index("| v3-8 | two_shot | int8 | 4.000 | {'all-reduce': 1} | 4,000,000.0 | 15.00× "
                    "| 0.75× | 1.0 |")
  assert text.index("| v3-128 | psum | float32 | 1.000 | {'all-reduce': 1} | 4,000,000.0 "
                    "|  |  |") > v3_8
  # The BERT-base step with each sync: temporaries GiB, bytes GB, est. ms.
  assert "| psum | 4.50 | 10.00 | 50.0 |\n| two_shot-int8 | 4.25 | 15.00 | 60.0 |" in text


def test_a_program_that_does_not_fit_says_by_how_much():
  tpu = dp.tpu_slice("v2-8")  # 8 GiB per device
  wide = 1 << 16
  params = {"w": SDS((wide, wide // 4), jnp.float32)}  # 4 GiB, and Adam's moments
  step = dp.make_train_step(lambda p, b: jnp.mean((b @ p["w"]) ** 2), optax.adam(1e-3),
                            tpu.data_mesh(), donate=False)
  with pytest.raises(ValueError, match=r"does not fit: .* GiB of HBM available \(over by") as e:
    dp.compile_report(step, step.abstract_state(params), SDS((8, wide), jnp.float32), tpu=tpu)
  assert e.value.required_bytes > e.value.available_bytes > 7 * 2**30


def test_compile_command_says_by_how_much_a_program_does_not_fit(run_compile):
  code, stdout, stderr = run_compile(
      "--example", "mnist1d_lstm", "--accelerator-type", "v2-8", "--config",
      "examples/mnist1d_lstm/configs/smoke.py", "--set", "hidden_size=32768", "--json")
  assert code == 1, stderr[-2000:]
  (program,) = json.loads(stdout)["programs"]
  assert program["fits"] is False and "over by" in program["error"]
  assert program["required_bytes"] > program["hbm_bytes"]


@pytest.mark.parametrize(("name", "shard_update", "warned"), [
    ("v5litepod-16", True, True),  # the TPU compiler: the reduce-scatter is an all-reduce
    ("v5litepod-16", False, False),
    (None, True, False),  # 8 CPU devices: a reduce-scatter runs
])
def test_compile_report_warns_when_shard_update_gets_no_reduce_scatter(name, shard_update,
                                                                        warned):
  tpu = None if name is None else dp.tpu_slice(name)
  mesh = dp.data_mesh(8) if tpu is None else tpu.data_mesh()
  step = dp.make_train_step(lambda p, b: ((b @ p) ** 2).mean(), optax.adam(1e-3), mesh,
                            shard_update=shard_update)
  state = step.abstract_state(jax.ShapeDtypeStruct((256, 256), jnp.float32))
  r = dp.compile_report(step, state, jax.ShapeDtypeStruct((64, 256), jnp.float32), tpu=tpu)
  counts = r.collective_counts()
  assert bool(r.warnings) == warned, (counts, r.warnings)
  assert list(r.as_dict()["warnings"]) == list(r.warnings)
  if warned:
    assert "reduce-scatter" not in counts and counts["all-reduce"] >= 2
    assert "shard_update=True" in r.warnings[0] and "warning: shard_update" in r.summary()
  elif shard_update:
    assert counts["reduce-scatter"] >= 1
