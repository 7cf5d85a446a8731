"""Every bad input is named at the earliest point where it can be seen (issue 26).

Each test here failed before the fix: a wrong argument was taken silently, or
failed with a message from inside JAX/orbax that names nothing the user wrote.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import date_optax

BASE = dict(batch_size=64, learning_rate=0.1, warmup_epochs=1, epochs=4, num_examples=256)


# ---------------------------------------------------------------------------
# Engine.


def test_baseline_refuses_a_misspelt_solver_option_when_built():
  with pytest.raises(ValueError,
                     match=r"optimizer_options has 'momentun'.*allowed: \['momentum'\]"):
    date_optax.Baseline(**BASE, optimizer_options={"momentun": 0.5})
  # A key of another base, from the same table bounded_lars uses.
  with pytest.raises(ValueError, match=r"'momentum'.*allowed: \['b1', 'b2', 'eps'\]"):
    date_optax.Baseline(**BASE, optimizer="adam", optimizer_options={"momentum": 0.9})
  # Keys that Baseline and date() set themselves are not solver options.
  for key in ("lower", "ratio_source", "learning_rate", "base"):
    with pytest.raises(ValueError, match=f"optimizer_options has '{key}'"):
      date_optax.Baseline(**BASE, optimizer_options={key: 0.5})
  with pytest.raises(TypeError, match="optimizer_options keys must be strings"):
    date_optax.Baseline(**BASE, optimizer_options={1: 0.5})


def test_baseline_checks_solver_option_values_when_built():
  with pytest.raises(ValueError, match=r"optimizer_options: momentum must be in \[0.0, 1.0\)"):
    date_optax.Baseline(**BASE, optimizer_options={"momentum": 2.0})
  with pytest.raises(ValueError, match="optimizer_options: weight_decay"):
    date_optax.Baseline(**BASE, optimizer_options={"weight_decay": -1e-3})
  with pytest.raises(ValueError, match="optimizer_options: b2"):
    date_optax.Baseline(**BASE, optimizer="adam", optimizer_options={"b2": float("nan")})
  with pytest.raises(TypeError, match="optimizer_options: .*mask"):
    date_optax.Baseline(**BASE, optimizer_options={"weight_decay_mask": "no"})
  # Valid options still build and route as before.
  for opts in ({"momentum": 0.5, "weight_decay": 1e-4},
               {"base_options": {"momentum": 0.5}},
               {"trust_ratio_mask": date_optax.exclude_bias_and_norm, "layer_axes": 0}):
    date_optax.Baseline(**BASE, optimizer_options=opts).solver()


def test_date_names_its_own_arguments():
  with pytest.raises(TypeError, match="baseline must be a date_optax.Baseline.*'x'"):
    date_optax.date("x", 8192)
  with pytest.raises(TypeError, match="baseline must be"):
    date_optax.date_recipe(None, 8192)
  with pytest.raises(TypeError, match="recipe must be a date_optax.Recipe"):
    date_optax.layer_lr_bounds("r")
  base = date_optax.Baseline(**BASE)
  # The options of date() are checked against the same table, and named as
  # date's, not as an internal bounded_lars call.
  with pytest.raises(TypeError, match="solver_options has 'momentun'"):
    date_optax.date(base, 128, momentun=0.5)
  with pytest.raises(ValueError, match="solver_options: momentum"):
    date_optax.date(base, 128, momentum=1.5)


def test_engine_container_arguments():
  with pytest.raises(TypeError, match="ratio_bounds must be a pair"):
    date_optax.Baseline(**BASE, ratio_bounds=3)
  with pytest.raises(TypeError, match="ratio_bounds must be a pair"):
    date_optax.Baseline(**BASE, ratio_bounds="ab")
  with pytest.raises(TypeError, match="stages must be a sequence of Recipes"):
    date_optax.multi_stage(3)
  with pytest.raises(TypeError, match="stages must be a sequence of Recipes"):
    date_optax.multi_stage(date_optax.Baseline(**BASE).recipe())


def test_schedule_and_solver_containers_are_named():
  from date_optax import schedules  # noqa: PLC0415

  with pytest.raises(TypeError, match="schedules must be a sequence"):
    schedules.multi_stage_schedule(0, [5])
  with pytest.raises(TypeError, match="stage_steps must be a sequence"):
    schedules.multi_stage_schedule([schedules.constant(0.1)], 5)
  with pytest.raises(TypeError, match="schedules must be callables"):
    schedules.multi_stage_schedule((0.1, 0.2), [5])
  with pytest.raises(TypeError, match=r"optimizer_options\['base_options'\] must be a mapping"):
    date_optax.Baseline(**BASE, optimizer_options={"base_options": "x"})


def test_schedules_never_overflow_silently():
  from date_optax import schedules  # noqa: PLC0415

  # A multistep "decay" that multiplies by 1e30 at each boundary was inf.
  with pytest.raises(ValueError, match=r"factors must be in \(0.0, 1.0\]"):
    schedules.MultiStep(epochs=(1, 2), factors=1e30)
  with pytest.raises(ValueError, match=r"factors must be in \(0.0, 1.0\]"):
    schedules.multistep(0.1, 0, 4, epochs=(1, 2), factors=(0.5, 2.0))
  with pytest.raises(ValueError, match="peak_value must be in"):
    schedules.constant(1e39)
  with pytest.raises(ValueError, match="base_batch_size=5e-324.*overflows"):
    schedules.linear_scaling(0.5, 64, 5e-324)


def test_baseline_builds_its_own_schedule_when_built():
  # A roller-coaster floor above the learning rate was found only by recipe().
  with pytest.raises(ValueError, match=r"floor must be <= peak_value.*learning_rate=1e-30"):
    date_optax.Baseline(**dict(BASE, learning_rate=1e-30))
  with pytest.raises(ValueError, match="rounds to 0 warmup iterations .*num_examples=2"):
    date_optax.Baseline(**dict(BASE, num_examples=2))


def test_scale_recipe_explains_peak_value_only_where_the_error_is_about_it():
  base = date_optax.Baseline(**BASE)
  # warmup_factor is an argument of this call: its error is passed on as is.
  with pytest.raises(ValueError, match=r"warmup_factor must be in \(0.0, 1.0\]") as info:
    date_optax.scale_recipe(base, 128, warmup="constant", warmup_factor=-1.0)
  assert "peak_value" not in str(info.value)
  assert "lr_scaling" not in str(info.value)
  # The schedule's peak_value is no argument: its error says where it comes from.
  huge = date_optax.Baseline(**dict(BASE, learning_rate=3e38))
  with pytest.raises(ValueError, match=r"peak_value must be in.*learning_rate=3e\+38 "
                     r"scaled by lr_scaling='linear' to batch_size=128"):
    date_optax.scale_recipe(huge, 128, lr_scaling="linear")


# ---------------------------------------------------------------------------
# path_mask.


PARAMS = {"dense": {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros(2)},
          "norm": {"scale": jnp.ones(2)}}


def test_path_mask_pattern_that_matches_nothing_warns():
  mask = date_optax.path_mask(include="kernl")
  with pytest.warns(UserWarning, match=r"path_mask: include pattern 'kernl' matches no parameter"):
    flags = mask(PARAMS)
  assert not any(jax.tree.leaves(flags))
  with pytest.warns(UserWarning, match=r"exclude pattern 'bais\$'.*dense/bias"):
    date_optax.path_mask(exclude=("bias$", "bais$"))(PARAMS)
  # Inside an optimizer: the typo is reported where it bites.
  tx = date_optax.lars(0.1, trust_ratio_mask=date_optax.path_mask(include="kernl"))
  with pytest.warns(UserWarning, match="'kernl' matches no parameter"):
    tx.update(PARAMS, tx.init(PARAMS), PARAMS)
  # Patterns that match stay silent.
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    date_optax.path_mask(include="kernel", exclude=("bias$", "norm"))(PARAMS)


# ---------------------------------------------------------------------------
# The train steps.


def _steps():
  import parallel_model as pm  # noqa: PLC0415 - tests/ is on sys.path

  from date_optax import parallel as dp  # noqa: PLC0415

  mesh = dp.data_mesh()
  return pm, {
      "jit": lambda loss_fn, **kw: dp.make_train_step(loss_fn, optax.sgd(0.1), mesh, **kw),
      "pmap": lambda loss_fn, **kw: dp.make_pmap_train_step(loss_fn, optax.sgd(0.1), **kw),
  }


@pytest.mark.parametrize("kind", ["jit", "pmap"])
def test_step_refuses_batch_leaves_with_different_row_counts(kind):
  pm, make = _steps()
  step = make[kind](pm.loss_fn)
  state = step.init(pm.init_params())
  data = pm.make_data(16)
  # 16 rows of x and 8 of y broadcast inside the loss and returned a loss.
  with pytest.raises(ValueError, match=r"same number of rows.*8 rows: batch\['y'\]; "
                                       r"16 rows: batch\['x'\]"):
    step(state, {"x": data["x"], "y": data["y"][:8]})
  with pytest.raises(ValueError, match=r"16 rows: batch\['x'\]; 24 rows: batch\['y'\]"):
    step(state, {"x": data["x"], "y": np.concatenate([data["y"], data["y"][:8]])})
  step(state, data)  # the same rows everywhere still trains


@pytest.mark.parametrize("kind", ["jit", "pmap"])
@pytest.mark.parametrize("leaf", [np.int32(3), np.array([True, False])])
def test_step_names_an_int_or_bool_parameter(kind, leaf):
  pm, make = _steps()

  def loss_fn(params, batch):
    return pm.loss_fn(params, batch) + 0.0 * jnp.sum(params["extra"]["count"])

  step = make[kind](loss_fn)
  params = dict(pm.init_params(), extra={"count": leaf})
  dtype = np.asarray(leaf).dtype.name
  with pytest.raises(TypeError, match=rf"params\['extra'\]\['count'\] of dtype {dtype}"):
    step.init(params)


def test_step_axes_and_comm_dtype_containers_are_named():
  pm, make = _steps()
  with pytest.raises(TypeError, match="data_axes must be a tuple or list"):
    make["jit"](pm.loss_fn, data_axes=0)
  with pytest.raises(ValueError, match="comm_dtype must be None or one of"):
    make["pmap"](pm.loss_fn, comm_dtype={"dense": True})


@pytest.mark.parametrize("kind", ["jit", "pmap"])
@pytest.mark.parametrize("dtype", ["float99", "int32", jnp.int8, "bool", 3])
def test_step_compute_dtype_must_be_floating(kind, dtype):
  pm, make = _steps()
  with pytest.raises(TypeError, match=r"compute_dtype must be None or a floating dtype "
                                      r"\(float32, bfloat16, float16, float64\)"):
    make[kind](pm.loss_fn, compute_dtype=dtype)


# ---------------------------------------------------------------------------
# Checkpoints.


def _ckpt_state(value: float = 1.0):
  return {"params": {"w": jnp.full((4, 3), value), "b": jnp.zeros(3)},
          "step": jnp.int32(3), "rng": jax.random.key(7)}


def _saved(tmp_path):
  from date_optax.checkpoint import CheckpointManager  # noqa: PLC0415

  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(1, _ckpt_state(1.0))
    mngr.save(2, _ckpt_state(2.0))


MISFITS = [
    ("shape", {"w": jnp.zeros((5, 3)), "b": jnp.zeros(3)},
     r"leaf \['params'\]\['w'\] was saved with shape \(4, 3\) and dtype float32; the "
     r"target asks for shape \(5, 3\) and dtype float32"),
    ("dtype", {"w": jnp.zeros((4, 3), jnp.bfloat16), "b": jnp.zeros(3)},
     r"leaf \['params'\]\['w'\] was saved with shape \(4, 3\) and dtype float32; the "
     r"target asks for shape \(4, 3\) and dtype bfloat16"),
    ("missing", {"w": jnp.zeros((4, 3))},
     r"the checkpoint has leaves the target lacks: \['params'\]\['b'\]"),
    ("extra", {"w": jnp.zeros((4, 3)), "b": jnp.zeros(3), "c": jnp.zeros(2)},
     r"the target has leaves the checkpoint lacks: \['params'\]\['c'\]"),
]


@pytest.mark.parametrize("step", [None, 2, 1])
@pytest.mark.parametrize("what,params,message", MISFITS, ids=[m[0] for m in MISFITS])
def test_restore_into_another_structure_shape_or_dtype(tmp_path, capfd, what, params, message,
                                                       step):
  from date_optax.checkpoint import (  # noqa: PLC0415
      CheckpointManager,
      CheckpointMismatchError,
      CorruptCheckpointError,
  )

  _saved(tmp_path)
  capfd.readouterr()
  target = dict(_ckpt_state(0.0), params=params)
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    with warnings.catch_warnings():
      warnings.simplefilter("error")  # no fallback to an older step, no warning
      with pytest.raises(CheckpointMismatchError, match=message) as info:
        mngr.restore(target, step=step)
  assert not isinstance(info.value, CorruptCheckpointError)
  assert isinstance(info.value, ValueError)
  assert f"step {step or 2}" in str(info.value)
  err = capfd.readouterr().err
  assert "Traceback" not in err and "Exception ignored" not in err, err[:2000]


def test_failed_restore_of_a_damaged_checkpoint_prints_no_tracebacks(tmp_path, capfd):
  from date_optax.checkpoint import CheckpointManager, CorruptCheckpointError  # noqa: PLC0415

  _saved(tmp_path)
  for step in (1, 2):
    for p in (tmp_path / str(step)).rglob("*"):
      if p.is_file() and p.parent.name == "d":
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
  capfd.readouterr()
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    with pytest.raises(CorruptCheckpointError, match="step 2"):
      mngr.restore(_ckpt_state(0.0))
    with pytest.raises(CorruptCheckpointError, match="step 1"):
      mngr.restore(_ckpt_state(0.0), step=1)
  import gc  # noqa: PLC0415

  gc.collect()
  err = capfd.readouterr().err
  assert "Traceback" not in err and "Exception ignored" not in err, err[:2000]


def test_checkpoint_directory_that_is_a_file_is_refused(tmp_path):
  from date_optax.checkpoint import CheckpointManager  # noqa: PLC0415

  path = tmp_path / "ckpt"
  path.write_text("not a directory")
  with pytest.raises(ValueError, match=f"{path} is an existing file"):
    CheckpointManager(path)
  with pytest.raises(ValueError, match=f"{path}/sub is under {path}, an existing file"):
    CheckpointManager(str(path / "sub"))


@pytest.mark.parametrize("leaf", ["hello", np.array(["a", "b"]), object()])
def test_a_leaf_that_cannot_be_saved_is_named_before_writing(tmp_path, leaf):
  from date_optax.checkpoint import CheckpointManager  # noqa: PLC0415

  with CheckpointManager(tmp_path, async_save=False) as mngr:
    with pytest.raises(TypeError, match=r"state leaf \['opt'\]\['name'\] cannot be saved"):
      mngr.save(1, {"w": jnp.ones(2), "opt": {"name": leaf}})
    assert mngr.all_steps() == ()
  assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------------------
# The optimizer transforms: the cases, written here; the checks
# themselves (masks, schedules evaluated at init, dtypes, layer_axes, gradient
# trees) are made on another branch. Each case must raise ValueError/TypeError
# naming the argument (or the parameter path) at construction, init or the
# first update, whichever sees it first.

P2 = {"weights": jnp.ones((3, 2)), "offsets": jnp.ones(2)}
G2 = {"weights": jnp.full((3, 2), 0.1), "offsets": jnp.full(2, 0.1)}
TRANSFORM_CASES = {
    "lamb state_dtype int32": (lambda: date_optax.lamb(1e-3, state_dtype=jnp.int32),
                               None, "state_dtype"),
    "lars accumulator_dtype float99": (
        lambda: date_optax.lars(0.1, accumulator_dtype="float99"), None, "accumulator_dtype"),
    "lars accumulator_dtype int8": (
        lambda: date_optax.lars(0.1, accumulator_dtype=jnp.int8), None, "accumulator_dtype"),
    "mask leaves are strings": (
        lambda: date_optax.lars(0.1, weight_decay=1e-4,
                                weight_decay_mask={"weights": "no", "offsets": "no"}),
        None, "weight_decay_mask"),
    "mask leaves are None": (
        lambda: date_optax.lamb(1e-3, weight_decay_mask={"weights": None, "offsets": None}), None,
        "weight_decay_mask"),
    "mask of another tree": (
        lambda: date_optax.lars(0.1, trust_ratio_mask={"weights": True, "extra": False}), None,
        "trust_ratio_mask"),
    "per-element bool mask": (
        lambda: date_optax.lars(
            0.1, trust_ratio_mask={"weights": np.ones((3, 2), bool), "offsets": True}),
        None, "trust_ratio_mask"),
    "schedule bounds lower > upper": (
        lambda: date_optax.lars(0.1, lower=lambda c: 2.0, upper=1.0), None, "lower"),
    "negative learning-rate schedule": (
        lambda: date_optax.lars(lambda c: -0.1), None, "learning_rate"),
    "NaN weight-decay schedule": (
        lambda: date_optax.lamb(1e-3, weight_decay=lambda c: float("nan")), None,
        "weight_decay"),
    "NaN bound schedule in date()": (
        lambda: date_optax.date(date_optax.Baseline(**BASE), 128, lower=lambda c: jnp.nan),
        None, "lower"),
    "layer_axes 'x'": (lambda: date_optax.lars(0.1, layer_axes="x"), None, "layer_axes"),
    "layer_axes 1.5": (lambda: date_optax.lamb(1e-3, layer_axes=1.5), None, "layer_axes"),
    "gradients of another tree": (
        lambda: date_optax.lars(0.1), {"weights": G2["weights"], "extra": G2["offsets"]},
        lambda m: "offsets" in m and "extra" in m and ("grad" in m or "update" in m)),
    "gradient of another shape": (
        lambda: date_optax.lamb(1e-3), {"weights": G2["weights"], "offsets": jnp.ones(3)},
        lambda m: "offsets" in m and "(3,)" in m and "(2,)" in m),
}


@pytest.mark.parametrize("case", sorted(TRANSFORM_CASES))
def test_transform_bad_input_is_named(case):
  build, grads, name = TRANSFORM_CASES[case]
  with pytest.raises((ValueError, TypeError)) as info:
    tx = build()
    state = tx.init(P2)
    tx.update(G2 if grads is None else grads, state, P2)
  message = str(info.value)
  assert (name(message) if callable(name) else name in message), message


# ---------------------------------------------------------------------------
# Issue 33: the step, the gain, the loader, checkpoints and the CLI. Each test
# failed before the fix: a wrong call was taken silently, or failed inside
# JAX, grain, orbax or json with a message that names nothing the user wrote.


def test_date_lr_scaling_message_lists_gain_and_gain_clock_needs_gain():
  base = date_optax.Baseline(**BASE)
  for call in (lambda: date_optax.date(base, 64, lr_scaling="Gain"),
               lambda: date_optax.date_recipe(base, 64, lr_scaling="Gain")):
    with pytest.raises(ValueError, match=r"lr_scaling must be one of \('linear', 'sqrt', "
                                         r"'none', 'gain'\), got 'Gain'"):
      call()
  # The option only works with the measured gain; with sqrt it was ignored.
  with pytest.raises(ValueError, match=r'gain_clock="gain".*needs lr_scaling="gain", got '
                                       r"lr_scaling='sqrt'"):
    date_optax.date(base, 64, gain_clock="gain")
  date_optax.date(base, 128, lr_scaling="gain", gain_clock="gain")
  date_optax.date(base, 128, gain_clock="steps")


def test_scale_recipe_says_why_it_refuses_gain():
  base = date_optax.Baseline(**BASE)
  with pytest.raises(ValueError, match=r'lr_scaling="gain" is a rule of date\(\) and '
                                       r"date_recipe\(\).*measured.*date_recipe\(baseline"):
    date_optax.scale_recipe(base, 128, lr_scaling="gain")
  assert "``\"gain\"`` is refused here" in date_optax.scale_recipe.__doc__
  r = date_optax.date_recipe(base, 128, lr_scaling="gain")
  assert r.peak_learning_rate == base.learning_rate  # η0; the gain multiplies it


@pytest.mark.parametrize("measurements,error,message", [
    ([-5.0, -3.0, -4.0], ValueError, r"measurements\[0\] must be a noise scale >= 0, *"),
    (["100", "200"], TypeError, r"measurements\[0\] must be a real number, got '100'"),
    ([True, 3.0], TypeError, r"measurements\[0\] must be a real number, got True"),
    ([{"loss": 1.0}], ValueError,
     r"measurements\[0\] is a metrics dict without 'grad_noise_scale' \(keys \['loss'\]\)"),
    (np.ones((2, 2)), ValueError, r"measurements must be one-dimensional.*shape \(2, 2\)"),
    (date_optax.GradStats("a", 1.0, 2.0), TypeError, r"measurements.sq_norm must be a real"),
    (date_optax.GradStats(1.0, float("inf"), 2.0), ValueError,
     r"measurements.trace_cov must be finite"),
])
def test_critical_batch_names_bad_measurements(measurements, error, message):
  from date_optax.diagnostics import critical_batch  # noqa: PLC0415

  with pytest.raises(error, match=message.replace(", *", "")):
    critical_batch(measurements)


@pytest.mark.parametrize("arg,kw,error,message", [
    (100.0, dict(base_batch_size=0), ValueError,
     r"base_batch_size must be an integer in \[1, inf\], got 0"),
    (100.0, dict(base_batch_size=16.0), TypeError, "base_batch_size must be an integer"),
    (100.0, dict(max_batch=8), ValueError, r"max_batch must be an integer in \[16, inf\]"),
    (100.0, dict(max_batch=1000), ValueError,
     r"max_batch=1000 must be base_batch_size=16 times a power of 2 .*512 or 1024"),
    (100.0, dict(unit=0), ValueError, r"unit must be an integer in \[1, inf\]"),
    (100.0, dict(unit=3), ValueError, "base_batch_size=16 must be a multiple of unit=3"),
    (100.0, dict(max_batch=1000, unit=16, kind="ramp", total_examples=10**6), ValueError,
     "max_batch=1000 must be a multiple of unit=16"),
    (100.0, dict(kind="linear"), ValueError, r"kind must be one of \('adaptive', 'ramp'\)"),
    (100.0, dict(kind="ramp"), ValueError, 'kind="ramp" needs total_examples'),
    (100.0, dict(total_examples=0), ValueError,
     r"total_examples must be an integer in \[1, inf\]"),
    (100.0, dict(kind="ramp", total_examples=10**6, ramp_fraction=0.0), ValueError,
     r"ramp_fraction must be in \(0, 1\], got 0.0"),
    (100.0, dict(kind="ramp", total_examples=10**6, ramp_fraction=1.5), ValueError,
     r"ramp_fraction must be in \(0, 1\]"),
    (100.0, dict(kind="ramp", total_examples=10**6, ramp_fraction="1/4"), TypeError,
     "ramp_fraction must be a real number"),
    (100.0, dict(kind="ramp", total_examples=2**64), ValueError,
     r"ramp_examples must be an integer in \[1, 4611686018427387903\]"),
    (100.0, dict(calibration=0), ValueError, "calibration must be a finite number > 0"),
    (100.0, dict(calibration=float("inf")), ValueError, "calibration must be a finite"),
    (-3.0, {}, ValueError, r"measurements, given as a number, is the critical batch: it "
     r"must be > 0 \(or inf"),
    (float("nan"), {}, ValueError, "measurements, given as a number"),
    (True, {}, TypeError, "measurements must be a real number, got True"),
    ("300", {}, TypeError, "measurements must be state.grad_stats"),
    ([], {}, ValueError, "holds no grad_noise_scale value"),
])
def test_propose_batch_schedule_names_bad_arguments(arg, kw, error, message):
  from date_optax.diagnostics import propose_batch_schedule  # noqa: PLC0415

  kw = {"base_batch_size": 16, "max_batch": 1024, **kw}
  with pytest.raises(error, match=message):
    propose_batch_schedule(arg, **kw)


def test_critical_batch_reads_a_jax_array_like_a_numpy_array():
  from date_optax.diagnostics import critical_batch  # noqa: PLC0415

  values = [10.0, 900.0, 300.0, 310.0, 320.0, float("inf")]
  assert critical_batch(jnp.asarray(values)) == critical_batch(np.asarray(values)) == 320.0
  assert critical_batch([jnp.float32(v) for v in values]) == 320.0


def test_adascale_gain_names_bad_statistics_instead_of_nan():
  with pytest.raises(ValueError, match=r"grad_stats.batch_size must be finite and > 0.*0.0"):
    date_optax.adascale_gain(date_optax.GradStats(1.0, 64.0, 0.0), 4.0)
  with pytest.raises(TypeError, match=r"grad_stats must be a date_optax.GradStats.*tuple"):
    date_optax.adascale_gain((1, 64, 256), 4.0)
  # Traced (inside the step), a batch_size <= 0 carries no noise: gain 1, not NaN.
  gain = jax.jit(lambda b: date_optax.adascale_gain(date_optax.GradStats(1.0, 64.0, b), 4.0))
  assert float(gain(0.0)) == 1.0
  tx = date_optax.adascale(optax.sgd(0.1), 4)
  params = {"w": jnp.ones(2)}
  with pytest.raises(TypeError, match=r"adascale: grad_stats must be a "
                                      r"date_optax.GradStats\(sq_norm, trace_cov, batch_size\)"
                                      r".*got tuple \(1, 64, 256\)"):
    tx.update(params, tx.init(params), params, grad_stats=(1, 64, 256))
  gtx = date_optax.date(date_optax.Baseline(**BASE), 128, lr_scaling="gain")
  with pytest.raises(TypeError, match=r'date\(..., lr_scaling="gain"\): grad_stats must be'):
    gtx.update(params, gtx.init(params), params, grad_stats={"sq_norm": 1.0})


def test_an_unscaled_integer_payload_warns_that_gradients_round_to_zero():
  from date_optax import parallel as dp  # noqa: PLC0415

  with pytest.warns(UserWarning, match=r"GradSync\(comm_dtype='int8', aps=False\): an integer "
                                       r"payload without scaling rounds .* to 0") as record:
    dp.GradSync("ring", comm_dtype="int8", aps=False)
  assert record[0].filename == __file__  # at the user's line, not inside the library
  with pytest.warns(UserWarning, match="comm_dtype='int4', aps=False"):
    dp.make_pmap_train_step(lambda p, b: jnp.mean(p["w"] * b["x"]), optax.sgd(0.1),
                            grad_reduce="psum", comm_dtype="int4", aps=False)
  # Scaled, unbiased, fed back or a float format: legitimate, no warning.
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    for kw in ({}, {"aps": True}, {"block_size": 8}, {"measured_shift": True},
               {"aps": False, "rounding": "stochastic"},
               {"aps": False, "error_feedback": True}):
      dp.GradSync("ring", comm_dtype="int8", **kw)
    dp.GradSync("ring", comm_dtype="float8_e4m3fn", aps=False)


# -- The train steps: one jit and one pmap step of a linear model, shared.


def _linear_loss(params, batch):
  return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)


LINEAR_PARAMS = {"w": np.zeros((3, 1), np.float32)}
LINEAR_BATCH = {"x": np.ones((8, 3), np.float32), "y": np.ones((8, 1), np.float32)}


@pytest.fixture(scope="module")
def linear_steps():
  from date_optax import parallel as dp  # noqa: PLC0415

  return {"jit": dp.make_train_step(_linear_loss, optax.sgd(0.1), dp.data_mesh()),
          "pmap": dp.make_pmap_train_step(_linear_loss, optax.sgd(0.1))}


@pytest.mark.parametrize("kind", ["jit", "pmap"])
def test_a_batch_of_zero_rows_is_refused_not_nan(linear_steps, kind):
  step = linear_steps[kind]
  state = step.init(LINEAR_PARAMS)
  empty = {"x": np.ones((0, 3), np.float32), "y": np.ones((0, 1), np.float32)}
  with pytest.raises(ValueError, match=r"batch\['x'\] has 0 rows \(shape \(0, 3\)\)"):
    step(state, empty)
  if kind == "jit":  # global arrays are checked when the step is traced
    with pytest.raises(ValueError, match=r"has 0 rows"):
      step(state, jax.device_put(empty, step.batch_sharding))


@pytest.mark.parametrize("kind", ["jit", "pmap"])
def test_a_string_leaf_in_params_or_batch_is_named(linear_steps, kind):
  step = linear_steps[kind]
  with pytest.raises(TypeError, match=r"params\['name'\] = 'mlp' \(str\)"):
    step.init(dict(LINEAR_PARAMS, name="mlp"))
  state = step.init(LINEAR_PARAMS)
  with pytest.raises(TypeError, match=r"batch\['tag'\] = 'train' \(str\)"):
    step(state, dict(LINEAR_BATCH, tag="train"))


@pytest.mark.parametrize("kind", ["jit", "pmap"])
def test_a_loss_fn_without_the_keyword_the_state_makes_the_step_pass(kind):
  from date_optax import parallel as dp  # noqa: PLC0415

  make = (lambda f: dp.make_train_step(f, optax.sgd(0.1), dp.data_mesh())) if kind == "jit" \
      else (lambda f: dp.make_pmap_train_step(f, optax.sgd(0.1)))
  step = make(_linear_loss)
  with pytest.raises(TypeError, match=r"loss_fn\(params, batch\) cannot be called as "
                                      r"loss_fn\(params, batch, rng=...\).*add rng=None"):
    step(step.init(LINEAR_PARAMS, rng=0), LINEAR_BATCH)
  # A loss_fn that requires rng, given a state without one.
  needs = make(lambda params, batch, *, rng: _linear_loss(params, batch))
  with pytest.raises(TypeError, match=r"loss_fn requires rng, which the step passes only "
                                      r"when the state has a key"):
    needs(needs.init(LINEAR_PARAMS), LINEAR_BATCH)


@pytest.mark.parametrize("kind", ["jit", "pmap"])
def test_error_feedback_residuals_fed_to_a_step_without_it(linear_steps, kind):
  step = linear_steps[kind]
  state = step.init(LINEAR_PARAMS)
  lead = (step.num_replicas,)
  residual = {"w": jnp.zeros(lead + (3, 1), jnp.float32)}
  with pytest.raises(ValueError, match=r"state.grad_residual holds error-feedback residuals, "
                                       r"but this step was built without error_feedback.*"
                                       r"state.replace\(grad_residual=None\)"):
    step(state.replace(grad_residual=residual), LINEAR_BATCH)
  with pytest.raises(TypeError, match=r"state must be the date_optax.parallel.TrainState of "
                                      r"step.init\(params\).*got dict"):
    step(LINEAR_PARAMS, LINEAR_BATCH)


def test_step_init_under_eval_shape(linear_steps):
  from jax.sharding import PartitionSpec as P  # noqa: PLC0415

  from date_optax import parallel as dp  # noqa: PLC0415

  step = linear_steps["jit"]
  # Arrays made inside the traced function have no sharding to read.
  abstract = jax.eval_shape(lambda: step.init({"w": jnp.zeros((3, 1))}, rng=0))
  assert abstract.params["w"].shape == (3, 1) and abstract.rng.dtype == jnp.uint32
  shardings = step.state_sharding(abstract)
  assert shardings.params["w"].spec == P()
  sharded = dp.make_train_step(_linear_loss, optax.adam(0.1),
                               jax.make_mesh((4, 2), ("data", "model")),
                               param_sharding=[("w", P("model"))])
  out = jax.eval_shape(sharded.init, {"w": jax.ShapeDtypeStruct((4, 1), jnp.float32)})
  assert out.opt_state[0].mu["w"].shape == (4, 1)


def test_a_loss_that_is_not_a_float_scalar_is_named(linear_steps):
  from date_optax import parallel as dp  # noqa: PLC0415

  for out, message in ((lambda loss: {"loss": loss}, "got dict"),
                       (lambda loss: (loss > 0), "of dtype bool"),
                       (lambda loss: None, "got NoneType")):
    step = dp.make_pmap_train_step(lambda p, b, out=out: out(_linear_loss(p, b)),
                                   optax.sgd(0.1))
    with pytest.raises(TypeError, match=f"loss_fn must return a real floating scalar loss.*"
                                        f"{message}"):
      step(step.init(LINEAR_PARAMS), LINEAR_BATCH)


# -- The input pipeline.


def test_data_loader_and_array_source_name_what_they_were_given():
  from date_optax import parallel as dp  # noqa: PLC0415

  with pytest.raises(TypeError, match=r"source must be a grain random-access data source.*"
                                      r"got dict: wrap a dict of arrays as dp.ArraySource"):
    dp.data_loader({"x": np.arange(8), "y": np.arange(8)}, 2, seed=0)
  with pytest.raises(TypeError, match=r"operations\[0\] must be a grain transform"):
    dp.data_loader(dp.ArraySource({"x": np.arange(8)}), 2, seed=0, operations=[3])
  with pytest.raises(ValueError, match=r"got data = np.float32\(3.0\), a scalar"):
    dp.ArraySource(np.float32(3))
  with pytest.raises(ValueError, match=r"data\['x'\]\[0\] = 1, a scalar; lists and tuples are "
                                       r"pytree nodes.*np.asarray"):
    dp.ArraySource({"x": [1, 2, 3]})
  with pytest.raises(ValueError, match=r"3 rows: data\['x'\]; 4 rows: data\['y'\]"):
    dp.ArraySource({"x": np.arange(3), "y": np.arange(4)})


def _saved_after_one_batch(source, batch=2, **kw):
  from date_optax import parallel as dp  # noqa: PLC0415

  it = iter(dp.data_loader(source, batch, seed=0, **kw))
  next(it)
  return dp.iterator_state(it)


def _replicated():
  from jax.sharding import NamedSharding  # noqa: PLC0415
  from jax.sharding import PartitionSpec as P  # noqa: PLC0415

  from date_optax import parallel as dp  # noqa: PLC0415

  return NamedSharding(dp.data_mesh(), P())


def test_restore_iterator_refuses_another_batch_operations_or_data():
  import grain  # noqa: PLC0415

  from date_optax import parallel as dp  # noqa: PLC0415

  class Plus(grain.transforms.Map):
    def map(self, x):
      return {"x": x["x"] + 1}

  src = dp.ArraySource({"x": np.arange(8)})
  saved = _saved_after_one_batch(src)
  assert saved["pipeline"]["global_batch_size"] == 2
  for loader, message in (
      (dp.data_loader(src, 4, seed=0), r"its global_batch_size is 2, the pipeline's is 4"),
      (dp.data_loader(src, 2, seed=0, operations=[Plus()]),
       r"its operations is \[\], the pipeline's is \['.*Plus'\] \(other operations\)"),
      (dp.data_loader(dp.ArraySource({"x": np.arange(8) * 10}), 2, seed=0),
       r"its source_digest is .*other data of the same row count and shapes"),
  ):
    with pytest.raises(ValueError, match=message):
      dp.restore_iterator(iter(loader), saved)
  # The same pipeline (also behind prefetch_to_device) restores, and a state
  # saved before the pipeline was recorded is checked for the rest only.
  uninterrupted = iter(dp.data_loader(src, 2, seed=0))
  next(uninterrupted)
  want = next(uninterrupted)["x"]
  for wrap in (lambda it: it, lambda it: dp.prefetch_to_device(it, _replicated())):
    it = wrap(iter(dp.data_loader(src, 2, seed=0)))
    dp.restore_iterator(it, saved)
    np.testing.assert_array_equal(np.asarray(next(it)["x"]), want)
  old = {k: v for k, v in saved.items() if k != "pipeline"}
  it = iter(dp.data_loader(src, 4, seed=0))
  dp.restore_iterator(it, old)  # the batch size is not recorded there


def test_iterator_state_names_a_loader_and_a_garbage_state():
  from date_optax import parallel as dp  # noqa: PLC0415

  loader = dp.data_loader(dp.ArraySource({"x": np.arange(8)}), 2, seed=0)
  for call in (lambda: dp.iterator_state(loader),
               lambda: dp.restore_iterator(loader, {"process_count": 1, "states": ["{}"]})):
    with pytest.raises(TypeError, match=r"iterator must be the loader's iterator, it = "
                                        r"iter\(loader\).*not the grain DataLoader itself"):
      call()
  with pytest.raises(TypeError, match=r"iterator must be a checkpointable data iterator"):
    dp.iterator_state([1, 2])
  it = iter(loader)
  for saved, message in (
      ({"process_count": 1, "states": ["garbage"]},
       r"saved\['states'\]\[0\] is not a data-iterator state \(not JSON"),
      ({"process_count": 1, "states": [b"{}"]}, r"saved\['states'\] a list of JSON strings"),
      ({"process_count": "1", "states": ["{}"]}, r"saved\['process_count'\] must be an int"),
      ({"process_count": 1, "states": ["[1, 2]"]},
       r"saved\['states'\]\[0\] is not a state of this iterator"),
      ({"process_count": 1, "states": ["{}"]},
       r"saved\['states'\]\[0\] could not be applied to this iterator"),
  ):
    with pytest.raises(ValueError, match=message):
      dp.restore_iterator(it, saved)


def test_prefetch_to_device_names_a_batch_its_sharding_cannot_split():
  from jax.sharding import NamedSharding  # noqa: PLC0415
  from jax.sharding import PartitionSpec as P  # noqa: PLC0415

  from date_optax import parallel as dp  # noqa: PLC0415

  sharding = NamedSharding(dp.data_mesh(), P("data"))
  with pytest.raises(ValueError, match=r"batch\['x'\] has 10 rows on this process; sharding "
                                       r"splits axis 0 over 8 devices"):
    next(dp.prefetch_to_device(iter([{"x": np.ones((10,))}]), sharding))
  with pytest.raises(ValueError, match=r"has 0 rows"):
    next(dp.prefetch_to_device(iter([{"x": np.ones((0, 2))}]), sharding))
  with pytest.raises(TypeError, match=r"sharding must be a jax.sharding.Sharding"):
    dp.prefetch_to_device(iter([]), P("data"))
  with pytest.raises(TypeError, match=r"batches must be an iterable.*\[batch\]"):
    dp.prefetch_to_device({"x": np.ones(8)}, sharding)


# -- Checkpoints and metrics.


def test_saving_an_existing_or_older_step_warns_and_writes_nothing(tmp_path):
  from date_optax.checkpoint import CheckpointManager  # noqa: PLC0415

  with CheckpointManager(tmp_path, async_save=False) as mngr:
    assert mngr.save(2, {"w": jnp.ones(2)})
    for force in (False, True):  # force=True raised orbax's StepAlreadyExistsError
      with pytest.warns(UserWarning, match=r"checkpoint step 2 already exists.*never "
                                           r"overwritten, so nothing was saved"):
        assert mngr.save(2, {"w": jnp.zeros(2)}, force=force) is False
    with pytest.warns(UserWarning, match=r"step 1 is older than the latest checkpoint, "
                                         r"step 2.*force=True"):
      assert mngr.save(1, {"w": jnp.zeros(2)}) is False
    assert mngr.all_steps() == (2,)
    restored, _ = mngr.restore({"w": jnp.zeros(2)})
  np.testing.assert_array_equal(restored["w"], np.ones(2))


def test_metric_writer_without_tensorboardx_warns_once(tmp_path, monkeypatch):
  import sys  # noqa: PLC0415

  from date_optax._src import metric_writer  # noqa: PLC0415
  from date_optax.diagnostics import MetricWriter  # noqa: PLC0415

  monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import fails
  monkeypatch.setattr(metric_writer, "_WARNED_NO_TENSORBOARD", False)
  with pytest.warns(UserWarning, match=r"tensorboardX is not installed, so only the CSV"):
    with MetricWriter(tmp_path / "a") as writer:
      writer.write_scalars(1, {"loss": 1.0})
  assert not writer.tensorboard
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    MetricWriter(tmp_path / "b").close()  # once per process
    MetricWriter(tmp_path / "c", tensorboard=False).close()


# -- The recipe CLI.


def _recipe(capsys, *flags):
  from date_optax._src import cli  # noqa: PLC0415

  rc = cli.main(["recipe", "--preset", "date-example", *flags])
  out, err = capsys.readouterr()
  return rc, out, err


def test_recipe_cli_flags_far_batches_in_every_format(capsys):
  import csv  # noqa: PLC0415
  import io  # noqa: PLC0415
  import json  # noqa: PLC0415

  rc, out, _ = _recipe(capsys, "--critical-batch", "200", "--format", "csv")
  rows = list(csv.DictReader(io.StringIO(out)))
  assert rc == 0 and [r["far_beyond_critical"] for r in rows] == ["False", "True"]
  rc, out, _ = _recipe(capsys, "--critical-batch", "200", "--format", "json")
  data = json.loads(out)
  assert data["critical_batch"] == 200.0
  assert [r["far_beyond_critical"] for r in data["recipes"]] == [False, True]
  # inf: what critical_batch returns when it measured no noise.
  rc, out, _ = _recipe(capsys, "--critical-batch", "inf")
  assert rc == 0 and "critical batch inf" in out and "no batch is far beyond it" in out
  rc, out, _ = _recipe(capsys, "--critical-batch", "inf", "--format", "json")
  assert rc == 0 and json.loads(out)["critical_batch"] is None
  with pytest.raises(SystemExit) as e:
    _recipe(capsys, "--critical-batch", "-5")
  assert e.value.code == 2
  assert "argument --critical-batch: must be a critical batch > 0" in capsys.readouterr().err


def test_recipe_cli_plot_path_is_checked_before_any_work(capsys, tmp_path):
  missing = tmp_path / "missing" / "dir" / "a.png"
  rc, out, err = _recipe(capsys, "--plot", str(missing))
  assert rc == 2 and out == ""
  assert f"--plot '{missing}': the directory '{missing.parent}' does not exist" in err
  assert not (tmp_path / "missing").exists()  # nothing created
  for name, what in (("out.txt", "the extension '.txt'"), ("out", "no extension")):
    rc, out, err = _recipe(capsys, "--plot", str(tmp_path / name))
    assert rc == 2 and out == "" and "must name an image file matplotlib writes" in err
    assert what in err and "Traceback" not in err
  assert not any(tmp_path.iterdir())


# -- The four documentation points.


def test_docs_agree_with_the_code():
  import pathlib  # noqa: PLC0415

  from date_optax import parallel as dp  # noqa: PLC0415

  doc = " ".join(dp.make_train_step.__doc__.split())
  assert "on by default for formats of 8 bits" not in doc
  assert 'over "ring" and "torus" with block scales of 32 elements' in doc
  assert "``\"gain\"`` is refused here" in date_optax.scale_recipe.__doc__
  page = (pathlib.Path(__file__).parent.parent / "docs" / "guide"
          / "schedules_and_date.md").read_text()
  assert "What `gain` means depends on the optimizer" in page
  assert "*one unit*" in page
  from date_optax.diagnostics import MetricWriter  # noqa: PLC0415

  assert "warns\n  once per process" in MetricWriter.__doc__
