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
