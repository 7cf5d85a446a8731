"""Property: every public constructor either works or names what is wrong.

Hypothesis draws values over each constructor's signature (numbers of every
sign, NaN/inf, bools, None, strings, dtypes, schedules returning any of
those, arrays of other shapes, mask and axis trees). Each call must either
work, and then give finite values (updates of a small parameter tree,
schedule values, a bool mask), or raise ValueError/TypeError whose message
names one of the arguments that were changed, or a parameter path. Nothing
else: no NaN, no other exception type, no hang (each example has a time
limit).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import signal
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import date_optax
from date_optax import schedules

# A small tree with distinctive paths (a message that names a leaf names one
# of these words).
PARAMS = {"dense": {"kernel": jnp.asarray([[0.5, -1.0], [2.0, 0.25], [1.0, 1.5]]),
                    "bias": jnp.zeros(2)}}
GRADS = {"dense": {"kernel": jnp.asarray([[0.1, 0.2], [-0.3, 0.4], [0.5, -0.6]]),
                   "bias": jnp.asarray([0.1, -0.2])}}
PATH_WORDS = ("kernel", "bias", "dense")
TIME_LIMIT_S = 30

NUMBERS = st.one_of(
    st.sampled_from([0, 1, -1, 2, 0.0, -0.0, 1e-30, 1e30, -1e-3, 0.5, 0.999, 1.0, 1.5, 64,
                     math.nan, math.inf, -math.inf]),
    st.floats(-10.0, 10.0, allow_nan=False),
    st.integers(-5, 10_000),
)
ODD = st.sampled_from([
    None, True, False, "", "x", "float99", "int32", "bfloat16", "sgd", "adam", "kernel",
    "gradual", "poly", b"b", (), [], (0.1,), (0.1, 0.2), [1.0, 2.0, 3.0], {}, {"a": 1},
    jnp.int32, jnp.bfloat16, np.float16, jnp.float32, np.dtype("bool"), object(),
])
ARRAYS = st.sampled_from([
    np.float32(0.5), np.int32(2), np.array(True), np.zeros(3), np.ones((2, 2)),
    jnp.float32(0.1), jnp.array([0.1, 0.2]), np.array(math.nan), jnp.bfloat16(0.5),
])
SCHEDULES = st.one_of(NUMBERS, ODD, ARRAYS).map(lambda v: _Schedule(v))
MASKS = st.sampled_from([
    {"dense": {"kernel": True, "bias": False}},
    {"dense": {"kernel": "no", "bias": "no"}},
    {"dense": {"kernel": None, "bias": None}},
    {"dense": {"kernel": np.array([[True, False]] * 3), "bias": True}},
    {"dense": {"kernel": 1, "bias": 0}},
    {"other": True},
    {"dense": True},
    {"dense": {"kernel": True}},
    [True, False],
    date_optax.exclude_bias_and_norm,
    date_optax.path_mask(include="kernel"),
])
AXES = st.sampled_from([0, 1, -1, 2, -3, (0,), (0, 1), (5,), "x", 0.5, {"dense": 0},
                        {"other": 0}, {"dense": {"kernel": (0, 1), "bias": 0}}, [0]])
# Numbers, odd objects and arrays: what every constructor checks itself.
SCALARS = st.one_of(NUMBERS, ODD, ARRAYS)
# Plus schedules, masks and axis trees, which the optimizer transforms check
# (at init for schedules: their value at step 0 must follow the float's rule).
VALUES = st.one_of(SCALARS, SCHEDULES, MASKS, AXES)


class _Schedule:
  """A schedule that returns `value` at every step (repr shows it)."""

  def __init__(self, value):
    self.value = value

  def __call__(self, count):
    del count
    return self.value

  def __repr__(self):
    return f"schedule->{self.value!r}"


@contextlib.contextmanager
def _time_limit(seconds: int):
  def fail(*_):
    raise TimeoutError(f"no answer within {seconds} s")

  previous = signal.signal(signal.SIGALRM, fail)
  signal.alarm(seconds)
  try:
    yield
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _finite(tree, what):
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    x = np.asarray(x)
    if x.dtype.kind in "fc" or str(x.dtype) == "bfloat16":
      assert np.all(np.isfinite(x.astype(np.complex128 if x.dtype.kind == "c"
                                         else np.float64))), (
          f"{what}{jax.tree_util.keystr(path)} is not finite: {x}")


def _run_optimizer(tx):
  assert isinstance(tx, optax.GradientTransformation), tx
  state = tx.init(PARAMS)
  params = PARAMS
  for _ in range(2):
    updates, state = tx.update(GRADS, state, params)
    _finite(updates, "updates")
    params = optax.apply_updates(params, updates)
  _finite(params, "params")


# Arguments whose messages use the public name of what they hold.
ALIASES = {"name": "decay"}


def _check(call, changed, run=None):
  """`call()` then `run(result)` works, or raises naming a changed argument."""
  names = set(changed) | {ALIASES[n] for n in changed if n in ALIASES}
  for v in changed.values():
    if isinstance(v, dict):  # keys of option mappings are names too
      names.update(str(k) for k in v)
  try:
    with _time_limit(TIME_LIMIT_S), warnings.catch_warnings():
      warnings.simplefilter("ignore")
      out = call()
      if run is not None:
        run(out)
  except (ValueError, TypeError) as e:
    msg = str(e)
    assert any(n in msg for n in names) or any(w in msg for w in PATH_WORDS), (
        f"{type(e).__name__} names neither an argument of {sorted(names)} nor a "
        f"parameter path: {msg}")


def _arguments(fn, skip=()):
  return [p.name for p in inspect.signature(fn).parameters.values()
          if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in skip]


@st.composite
def _changes(draw, names, values=SCALARS):
  """A few of `names`, each with a drawn value."""
  chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))
  return {n: draw(values) for n in chosen}


PROPERTY = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))
# For the properties expected to fail until the accel branch is merged: no
# shrinking, so a known failure costs no time.
KNOWN_FAILING = settings(PROPERTY, phases=[Phase.explicit, Phase.generate])

# ---------------------------------------------------------------------------
# The engine and the schedules.

BASELINE = dict(batch_size=64, learning_rate=0.1, warmup_epochs=1, epochs=4,
                num_examples=256)


def _run_baseline(base):
  _run_optimizer(base.solver())
  _finite(base.recipe().learning_rates(), "learning_rates")


@PROPERTY
@given(changes=_changes(_arguments(date_optax.Baseline)))
def test_baseline_property(changes):
  _check(lambda: date_optax.Baseline(**{**BASELINE, **changes}), changes, _run_baseline)


SOLVER_KEYS = ["momentum", "momentun", "b1", "eps", "weight_decay", "weight_decay_mask",
               "trust_ratio_mask", "layer_axes", "trust_coefficient", "base_options",
               "lower"]
OPTIMIZERS = st.sampled_from(["momentum", "adam", "sgd", "rmsprop"])


def _baseline_options(options, optimizer):
  _check(lambda: date_optax.Baseline(**BASELINE, optimizer=optimizer,
                                     optimizer_options=options),
         {"optimizer_options": options}, _run_baseline)


@PROPERTY
@given(options=st.dictionaries(st.sampled_from(SOLVER_KEYS), SCALARS, min_size=1,
                               max_size=2), optimizer=OPTIMIZERS)
def test_baseline_options_property(options, optimizer):
  _baseline_options(options, optimizer)


DATE_ARGS = _arguments(date_optax.date, skip=("baseline",))


def _date(changes):
  kw = {"batch_size": 128, **changes}
  baseline = kw.pop("baseline", date_optax.Baseline(**BASELINE))
  _check(lambda: date_optax.date(baseline, **kw), changes, _run_optimizer)


@PROPERTY
@given(changes=_changes(DATE_ARGS + ["baseline"]))
def test_date_property(changes):
  _date(changes)


# Schedules, masks and axis trees reach the optimizer transforms, whose checks
# are being fixed on another branch (see test_transform_property).
@KNOWN_FAILING
@given(changes=_changes(DATE_ARGS + SOLVER_KEYS, values=VALUES))
def test_date_schedule_and_tree_property(changes):
  _date(changes)


@KNOWN_FAILING
@given(options=st.dictionaries(st.sampled_from(SOLVER_KEYS), VALUES, min_size=1,
                               max_size=2), optimizer=OPTIMIZERS)
def test_baseline_schedule_and_tree_options_property(options, optimizer):
  _baseline_options(options, optimizer)


@PROPERTY
@given(changes=_changes(_arguments(date_optax.scale_recipe, skip=("baseline",))))
def test_scale_recipe_property(changes):
  kw = {"batch_size": 128, **changes}
  _check(lambda: date_optax.scale_recipe(date_optax.Baseline(**BASELINE), **kw), changes,
         lambda r: _finite(r.learning_rates(), "learning_rates"))


SCHEDULE_FNS = {
    "constant": (schedules.constant, dict(peak_value=0.1)),
    "gradual_warmup": (schedules.gradual_warmup, dict(peak_value=0.1, warmup_steps=3)),
    "constant_warmup": (schedules.constant_warmup, dict(peak_value=0.1, warmup_steps=3)),
    "poly": (schedules.poly, dict(peak_value=0.1, warmup_steps=3, total_steps=20)),
    "roller_coaster": (schedules.roller_coaster,
                       dict(peak_value=0.1, warmup_steps=3, total_steps=20)),
    "cosine": (schedules.cosine, dict(peak_value=0.1, warmup_steps=3, total_steps=20)),
    "multistep": (schedules.multistep, dict(peak_value=0.1, warmup_steps=3,
                                            steps_per_epoch=4, epochs=(1, 3))),
    "exponential": (schedules.exponential, dict(peak_value=0.1, warmup_steps=3,
                                                steps_per_epoch=4, start_epoch=1,
                                                factor=0.5)),
    "warmup_decay_schedule": (schedules.warmup_decay_schedule,
                              dict(peak_value=0.1, warmup_steps=3, total_steps=20)),
    "multi_stage_schedule": (schedules.multi_stage_schedule,
                             dict(schedules=[schedules.constant(0.1)], stage_steps=[5])),
    "linear_scaling": (schedules.linear_scaling,
                       dict(value=0.1, batch_size=64, base_batch_size=32)),
    "sqrt_scaling": (schedules.sqrt_scaling,
                     dict(value=0.1, batch_size=64, base_batch_size=32)),
    "scale_by_rule": (schedules.scale_by_rule,
                      dict(rule="sqrt", value=0.1, batch_size=64, base_batch_size=32)),
    "decay_from_name": (schedules.decay_from_name, dict(name="poly")),
    "Poly": (schedules.Poly, {}),
    "RollerCoaster": (schedules.RollerCoaster, {}),
    "MultiStep": (schedules.MultiStep, dict(epochs=(1.0, 2.0))),
    "Exponential": (schedules.Exponential, {}),
}


def _run_schedule_output(out):
  if isinstance(out, schedules.Decay):
    out = schedules.warmup_decay_schedule(0.1, 3, 20, decay=out, steps_per_epoch=4)
  if callable(out):
    values = [out(jnp.int32(i)) for i in (0, 1, 3, 10, 19, 40)]
    _finite(values, "schedule values")
  else:
    _finite(out, "value")


@pytest.mark.parametrize("name", sorted(SCHEDULE_FNS))
@settings(PROPERTY, max_examples=12)
@given(data=st.data())
def test_schedule_property(name, data):
  fn, base = SCHEDULE_FNS[name]
  changes = data.draw(_changes(_arguments(fn)))
  _check(lambda: fn(**{**base, **changes}), changes, _run_schedule_output)


@PROPERTY
@given(changes=_changes(["include", "exclude"]))
def test_path_mask_property(changes):
  def run(mask_fn):
    flags = mask_fn(PARAMS)
    assert jax.tree.structure(flags) == jax.tree.structure(PARAMS)
    assert all(isinstance(f, bool) for f in jax.tree.leaves(flags)), flags

  _check(lambda: date_optax.path_mask(**changes), changes, run)


# ---------------------------------------------------------------------------
# The train steps and the checkpoint manager (constructors only: a compile per
# example would not fit the time budget; their first calls have their own
# tests in test_bad_inputs.py).


def _loss(params, batch):
  return jnp.mean((batch["x"] @ params["dense"]["kernel"] + params["dense"]["bias"]) ** 2)


@PROPERTY
@given(changes=_changes(_arguments(date_optax.parallel.make_train_step,
                                   skip=("loss_fn", "optimizer", "mesh"))))
def test_make_train_step_property(changes):
  mesh = date_optax.parallel.data_mesh()
  _check(lambda: date_optax.parallel.make_train_step(_loss, optax.sgd(0.1), mesh, **changes),
         changes)


@PROPERTY
@given(changes=_changes(_arguments(date_optax.parallel.make_pmap_train_step,
                                   skip=("loss_fn", "optimizer", "devices"))))
def test_make_pmap_train_step_property(changes):
  _check(lambda: date_optax.parallel.make_pmap_train_step(_loss, optax.sgd(0.1), **changes),
         changes)


@settings(PROPERTY, max_examples=25)
@given(changes=_changes(["directory", "max_to_keep", "save_interval_steps", "async_save"]),
       where=st.sampled_from(["new", "file", "under_file", "existing"]))
def test_checkpoint_manager_property(tmp_path_factory, changes, where):
  from date_optax.checkpoint import CheckpointManager  # noqa: PLC0415

  root = tmp_path_factory.mktemp("ckpt")
  (root / "file").write_text("x")
  (root / "existing").mkdir()
  if "directory" in changes and isinstance(changes["directory"], (str, bytes)):
    # A drawn string names a path under the temporary root, never elsewhere.
    changes["directory"] = str(root / {"new": "new", "file": "file",
                                       "under_file": "file/sub",
                                       "existing": "existing"}[where])
  kw = {"directory": str(root / "new"), **changes}

  def run(mngr):
    with mngr:
      mngr.save(0, {"w": jnp.ones(2)}, force=True)
      mngr.wait_until_finished()
      restored, _ = mngr.restore({"w": jnp.zeros(2)})
      np.testing.assert_array_equal(restored["w"], np.ones(2))

  _check(lambda: CheckpointManager(**kw), changes, run)


# ---------------------------------------------------------------------------
# The optimizer transforms. Their input checks (masks, schedules evaluated at
# init, dtypes, layer_axes, gradient trees) are being fixed on another branch;
# until it is merged the property does not hold for them everywhere.

TRANSFORMS = {
    "lars": (date_optax.lars, dict(learning_rate=0.1)),
    "lamb": (date_optax.lamb, dict(learning_rate=0.1)),
    "bounded_lars": (date_optax.bounded_lars, dict(learning_rate=0.1)),
    "scale_by_trust_ratio": (date_optax.scale_by_trust_ratio, {}),
}


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
@settings(KNOWN_FAILING, max_examples=30)
@given(data=st.data())
def test_transform_property(name, data):
  fn, base = TRANSFORMS[name]
  changes = data.draw(_changes(_arguments(fn), values=VALUES))
  _check(lambda: fn(**{**base, **changes}), changes, _run_optimizer)
