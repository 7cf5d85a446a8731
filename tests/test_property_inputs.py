"""Property: every public constructor either works or names what is wrong,
and so does every call past them (issue 33: the steps' init and call,
checkpoints, the input pipeline, critical_batch, adascale and the CLI).

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


def _named(call, names, run=None, allowed=()):
  """`call()` then `run(result)` works, or raises ValueError/TypeError (or one
  of `allowed`) whose message contains one of `names`. Returns the result,
  or None after a named error."""
  names = [n for n in names if n]
  try:
    with _time_limit(TIME_LIMIT_S), warnings.catch_warnings():
      warnings.simplefilter("ignore")
      out = call()
      if run is not None:
        run(out)
      return out
  except (ValueError, TypeError, *allowed) as e:
    msg = str(e)
    assert any(n in msg for n in names), (
        f"{type(e).__name__} names none of {names}: {msg}")
    return None


def _check(call, changed, run=None):
  """`call()` then `run(result)` works, or raises naming a changed argument
  (or a parameter path)."""
  names = set(changed) | {ALIASES[n] for n in changed if n in ALIASES}
  for v in changed.values():
    if isinstance(v, dict):  # keys of option mappings are names too
      names.update(str(k) for k in v)
  _named(call, [*sorted(names), *PATH_WORDS], run)


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
# The train steps and the checkpoint manager: their constructors (their init,
# calls, save and restore are drawn below, with one step built per kind of
# loss so that few examples compile).


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


# ---------------------------------------------------------------------------
# Past the constructors (issue 33): the steps' init and call, the checkpoint
# functions, the input pipeline, critical_batch, adascale and the recipe CLI,
# fed user objects of every wrong kind. Each call works (and then gives
# finite values, or a documented outcome such as a skipped step or a
# warning), or raises ValueError/TypeError naming what was wrong; never
# another exception, never a silent NaN.


# -- The train step: init and call. One step per kind of loss output, built
# once; only the calls that are valid compile (a few programs in all).

LOSS_OUTPUTS = {
    "scalar": lambda loss: loss,
    "nan": lambda loss: loss * jnp.nan,  # documented: the step is skipped
    "python float": lambda loss: 2.5,  # a constant loss: zero gradients
    "pair without has_aux": lambda loss: (loss, {"n": 1}),
    "vector": lambda loss: jnp.stack([loss, loss]),
    "dict": lambda loss: {"loss": loss},
    "None": lambda loss: None,
    "bool": lambda loss: loss > 0,
    "int": lambda loss: jnp.int32(1),
}
_STEPS: dict = {}


def _step_for(output):
  if output not in _STEPS:
    fn = LOSS_OUTPUTS[output]
    _STEPS[output] = date_optax.parallel.make_train_step(
        lambda p, b: fn(_loss(p, b)), optax.sgd(0.1), date_optax.parallel.data_mesh())
  return _STEPS[output]


# Each part is valid half of the time, so that most calls get past the others.
PARAM_LEAVES = st.one_of(st.just("keep"), st.sampled_from([
    "mlp", np.int32(3), np.array([True, False]), object(), b"raw", np.array(["a"]),
    np.float16(1.0),
]))
BATCHES = st.one_of(st.just("valid"), st.sampled_from([
    "zero rows", "ten rows", "rows differ", "string leaf", "scalar leaf", "empty", "None",
    "object leaf", "bytes leaf",
]))
STATES = st.one_of(st.just("fresh"), st.sampled_from(
    ["created", "params", "None", "residual", "grad_stats"]))
RNGS = st.one_of(st.just(None), st.sampled_from(
    [0, "seed", 1.5, np.float32(2.0), np.uint32(3), jax.random.key(0)]))
OUTPUTS = st.one_of(st.sampled_from(["scalar", "nan", "python float"]),
                    st.sampled_from(sorted(LOSS_OUTPUTS)))


def _batch(kind):
  x = np.ones((8, 3), np.float32)
  return {"valid": {"x": x}, "zero rows": {"x": x[:0]}, "ten rows": {"x": np.ones((10, 3))},
          "rows differ": {"x": x, "y": np.ones(4)}, "string leaf": {"x": x, "tag": "a"},
          "scalar leaf": {"x": x, "t": 1.0}, "empty": {}, "None": None,
          "object leaf": {"x": x, "o": object()}, "bytes leaf": {"x": x, "b": b"raw"}}[kind]


@settings(PROPERTY, max_examples=40)
@given(output=OUTPUTS, leaf=PARAM_LEAVES, where=st.sampled_from(
    ["kernel", "bias", "extra"]), batch=BATCHES, state_kind=STATES, rng=RNGS)
def test_train_step_init_and_call_property(output, leaf, where, batch, state_kind, rng):
  step = _step_for(output)
  params = jax.tree.map(np.asarray, PARAMS)
  if not (isinstance(leaf, str) and leaf == "keep"):
    if where == "extra":
      params = {**params, "extra": leaf}
    else:
      params = {"dense": {**params["dense"], where: leaf}}
  names = ["params", "rng", "kernel", "bias", "extra"]
  state = _named(lambda: step.init(params, rng=rng), names)
  if state is None:
    return
  residual = {"dense": jax.tree.map(lambda x: jnp.zeros((8, *np.shape(x))), PARAMS["dense"])}
  state = {"fresh": state, "created": date_optax.parallel.TrainState.create(
               jax.tree.map(jnp.asarray, params), optax.sgd(0.1)),
           "params": params, "None": None, "residual": state.replace(grad_residual=residual),
           # Statistics a step without grad_stats keeps unchanged (a run that
           # stopped measuring): documented, not refused.
           "grad_stats": state.replace(
               grad_stats=date_optax.parallel.GradStatsState.zeros())}[state_kind]

  def run(out):
    new_state, metrics = out
    loss = float(metrics["loss"])
    assert np.isfinite(loss) or int(metrics["skipped"]) == 1, metrics  # never a silent NaN
    _finite(new_state.params, "params")

  _named(lambda: step(state, _batch(batch)), ["batch", "state", "loss_fn", "rng"], run)


# -- The checkpoint functions.

CKPT_STATES = st.sampled_from([
    {"weights": np.ones(2, np.float32)}, {"weights": "hello"}, {"weights": object()},
    {"weights": jax.random.key(1)}, {"weights": 1.5}, {"weights": np.array(["a"])}, {},
    [np.zeros(3, np.float32)], {"weights": None}, "state",
])
CKPT_STEPS = st.sampled_from([0, 3, 5, -1, 1.5, True, "3", jnp.int32(4), np.int64(6), None])
CKPT_METADATA = st.sampled_from([None, {"epoch": 1}, {"x": object()}, "meta", {"a": [1, 2]},
                                 {1: "a"}, {"v": np.float32(1.0)}])
CKPT_TARGETS = st.sampled_from([
    "same", {"weights": np.zeros(3, np.float32)}, {"weights": np.zeros(2, np.int32)},
    {"weights": jax.ShapeDtypeStruct((2,), jnp.float32)}, {"other": np.zeros(2)}, "x", None,
    {"weights": "hello"},
])


@settings(PROPERTY, max_examples=15)
@given(state=CKPT_STATES, step=CKPT_STEPS, metadata=CKPT_METADATA,
       force=st.sampled_from([False, True, "yes"]), target=CKPT_TARGETS,
       restore_step=st.sampled_from([None, 3, 99, -1, "3"]))
def test_checkpoint_save_and_restore_property(tmp_path_factory, state, step, metadata, force,
                                              target, restore_step):
  from date_optax.checkpoint import CheckpointManager  # noqa: PLC0415

  root = tmp_path_factory.mktemp("ckpt")
  base = {"weights": np.ones(2, np.float32)}
  with CheckpointManager(root, async_save=False) as mngr:
    mngr.save(3, base)
    saved = _named(lambda: mngr.save(step, state, metadata=metadata, force=force),
                   ["step", "state", "metadata", "force", "weights"])
    assert saved in (None, True, False), saved
    if saved:
      assert mngr.latest_step() is not None
    goal = state if isinstance(target, str) and target == "same" else target
    which = restore_step

    def check(out):
      restored, meta = out
      assert isinstance(meta, dict)
      _finite(restored, "restored")

    _named(lambda: mngr.restore(goal, step=which),
           ["target", "step", "weights", "99", "state", "leaf", "leaves"], check,
           allowed=(FileNotFoundError,))


# -- The input pipeline.

SOURCE_DATA = st.sampled_from([
    {"x": np.arange(8)}, {"x": np.arange(8), "y": np.ones((8, 2))}, np.float32(3),
    {"x": [1, 2, 3]}, [1, 2, 3], {"x": np.arange(3), "y": np.arange(4)}, {}, None, "text",
    {"x": np.array(["a"] * 8)}, {"x": np.zeros((0, 2))},
])
SOURCES = st.sampled_from(["array source", "dict", "list", "str", "int", "ndarray", "None"])
OPERATIONS = st.sampled_from([(), [], "ab", [3], [None], {"op": 1}, 5])


def _source(kind):
  return {"array source": date_optax.parallel.ArraySource({"x": np.arange(16)}),
          "dict": {"x": np.arange(16)}, "list": list(range(16)), "str": "records",
          "int": 16, "ndarray": np.arange(16), "None": None}[kind]


@PROPERTY
@given(data=SOURCE_DATA)
def test_array_source_property(data):
  def run(src):
    assert len(src) >= 0
    if len(src):
      jax.tree.map(np.asarray, src[0])

  _named(lambda: date_optax.parallel.ArraySource(data), ["data"], run)


LOADER_ARGS = {
    "source": SOURCES,
    "global_batch_size": st.one_of(st.sampled_from([0, -2, 3.0, "4", 32, None]),
                                   st.integers(1, 20)),
    "seed": st.sampled_from([7, -1, 2**40, 1.5, "0"]),
    "operations": OPERATIONS,
    "num_epochs": st.sampled_from([1, 0, 2.5, "1"]),
    "shuffle": st.sampled_from([False, 1, "no"]),
}


@PROPERTY
@given(data=st.data())
def test_data_loader_property(data):
  """One or two arguments changed; the others are a working loader's."""
  changed = data.draw(st.lists(st.sampled_from(sorted(LOADER_ARGS)), min_size=1, max_size=2,
                               unique=True))
  kw = {"source": "array source", "global_batch_size": 4, "seed": 0,
        **{k: data.draw(LOADER_ARGS[k]) for k in changed}}
  kw["source"] = _source(kw["source"])

  def run(loader):
    it = iter(loader)
    first = next(it)
    assert jax.tree.leaves(first)

  _named(lambda: date_optax.parallel.data_loader(**kw), [*changed, "records"], run)


ITERATORS = st.sampled_from(["iterator", "loader", "prefetch", "list", "None", "generator",
                             "other batch", "other data"])
SAVED = st.sampled_from(["valid", "garbage", "None", "no states", "bytes states",
                         "str count", "json list", "empty json", "two processes", "other"])


def _iterator(kind):
  dp = date_optax.parallel
  src = dp.ArraySource({"x": np.arange(16)})
  loader = dp.data_loader(src, 2, seed=0)
  if kind == "prefetch":
    from jax.sharding import NamedSharding  # noqa: PLC0415
    from jax.sharding import PartitionSpec as P  # noqa: PLC0415

    return dp.prefetch_to_device(iter(loader), NamedSharding(dp.data_mesh(), P()))
  return {"iterator": iter(loader), "loader": loader, "list": [1, 2], "None": None,
          "generator": (b for b in [1]), "other batch": iter(dp.data_loader(src, 4, seed=0)),
          "other data": iter(dp.data_loader(dp.ArraySource({"x": -np.arange(16)}), 2,
                                            seed=0))}[kind]


def _saved(kind):
  dp = date_optax.parallel
  it = iter(dp.data_loader(dp.ArraySource({"x": np.arange(16)}), 2, seed=0))
  next(it)
  valid = dp.iterator_state(it)
  return {"valid": valid, "garbage": {"process_count": 1, "states": ["garbage"]},
          "None": None, "no states": {"process_count": 1},
          "bytes states": {"process_count": 1, "states": [b"{}"]},
          "str count": {**valid, "process_count": "1"},
          "json list": {"process_count": 1, "states": ["[1]"]},
          "empty json": {"process_count": 1, "states": ["{}"]},
          "two processes": {"process_count": 2, "states": valid["states"] * 2},
          "other": "state"}[kind]


@PROPERTY
@given(iterator=ITERATORS, saved=SAVED, save_first=st.booleans())
def test_iterator_state_and_restore_property(iterator, saved, save_first):
  dp = date_optax.parallel
  it = _iterator(iterator)
  if save_first:
    state = _named(lambda: dp.iterator_state(it), ["iterator"])
    if state is not None:
      assert state["process_count"] == 1 and isinstance(state["states"][0], str)
  _named(lambda: dp.restore_iterator(it, _saved(saved)),
         ["iterator", "saved", "states", "process", "pipeline"])


@settings(PROPERTY, max_examples=20)
@given(batches=st.sampled_from(["8 rows", "10 rows", "0 rows", "rows differ", "scalar",
                                "empty", "dict", "int", "None"]),
       sharding=st.sampled_from(["data", "replicated", "spec", "mesh", "None"]))
def test_prefetch_to_device_property(batches, sharding):
  from jax.sharding import NamedSharding  # noqa: PLC0415
  from jax.sharding import PartitionSpec as P  # noqa: PLC0415

  mesh = date_optax.parallel.data_mesh()
  one = {"8 rows": {"x": np.ones((8, 2))}, "10 rows": {"x": np.ones((10,))},
         "0 rows": {"x": np.ones((0,))}, "rows differ": {"x": np.ones(8), "y": np.ones(16)},
         "scalar": {"x": np.float32(1)}, "empty": {}}
  source = [one[batches]] * 2 if batches in one else {"dict": {"x": np.ones(8)}, "int": 3,
                                                      "None": None}[batches]
  spec = {"data": NamedSharding(mesh, P("data")), "replicated": NamedSharding(mesh, P()),
          "spec": P("data"), "mesh": mesh, "None": None}[sharding]

  def run(it):
    for batch in it:
      assert isinstance(jax.tree.leaves(batch)[0], jax.Array)

  _named(lambda: date_optax.parallel.prefetch_to_device(source, spec),
         ["batch", "sharding", "rows"], run)


# -- critical_batch and adascale.

ELEMENTS = st.one_of(NUMBERS, ODD, ARRAYS, st.sampled_from([
    {"grad_noise_scale": 12.0}, {"loss": 1.0}, {"grad_noise_scale": "x"},
    {"grad_noise_scale": -1.0}, {"grad_noise_scale": jnp.float32(3.0)}]))
MEASUREMENTS = st.one_of(
    st.lists(ELEMENTS, max_size=6),
    st.lists(st.floats(0, 1e4), min_size=1, max_size=6).map(np.asarray),
    st.lists(st.floats(0, 1e4), min_size=1, max_size=6).map(jnp.asarray),
    st.sampled_from([np.ones((2, 2)), np.float32(3.0), "300", 300.0, None, {"a": 1}]),
    st.tuples(ARRAYS | NUMBERS | ODD, ARRAYS | NUMBERS | ODD, ARRAYS | NUMBERS | ODD).map(
        lambda t: date_optax.GradStats(*t)),
)


@settings(PROPERTY, max_examples=60)
@given(measurements=MEASUREMENTS, discard=st.sampled_from([0.5, 0.0, 0.9, 1.0, -0.1, "x"]))
def test_critical_batch_property(measurements, discard):
  from date_optax.diagnostics import critical_batch  # noqa: PLC0415

  def run(value):
    assert isinstance(value, float) and (value >= 0 or math.isinf(value)), value

  _named(lambda: critical_batch(measurements, discard=discard),
         ["measurements", "discard"], run)


PROPOSAL_ARGS = ("base_batch_size", "max_batch", "total_examples", "kind", "ramp_fraction",
                 "unit", "calibration")


@settings(PROPERTY, max_examples=60)
@given(measurements=MEASUREMENTS | NUMBERS | ARRAYS,
       changes=st.dictionaries(st.sampled_from(PROPOSAL_ARGS), st.one_of(
           NUMBERS, ODD, ARRAYS, st.sampled_from(["ramp", "adaptive", 10**10, 1000, 3])),
           max_size=3))
def test_propose_batch_schedule_property(measurements, changes):
  from date_optax.diagnostics import propose_batch_schedule  # noqa: PLC0415

  kw = {"base_batch_size": 16, "max_batch": 1024, "total_examples": 4096, **changes}

  def run(s):
    assert isinstance(s, date_optax.BatchSchedule) and s.max_batch == kw["max_batch"]
    assert s.start % kw["base_batch_size"] == 0 and s.start <= s.max_batch
    assert all(b % kw.get("unit", 1) == 0 for b in s.batch_sizes)
    if s.kind == "ramp":
      assert s.ramp_examples <= kw["total_examples"] and len(s.batch_sizes) <= 8

  _named(lambda: propose_batch_schedule(measurements, **kw),
         ["measurements", "grad_noise_scale", *PROPOSAL_ARGS], run)


@settings(PROPERTY, max_examples=80)
@given(b0=st.integers(1, 96), doublings=st.integers(0, 7), extra=st.integers(0, 5),
       critical=st.floats(1e-3, 1e5) | st.just(math.inf), total=st.integers(1, 10**9),
       kind=st.sampled_from(["adaptive", "ramp"]), fraction=st.floats(1e-6, 1.0),
       unit_of=st.integers(1, 6))
def test_proposal_start_and_ramp_follow_the_rule(b0, doublings, extra, critical, total, kind,
                                                 fraction, unit_of):
  """start = the largest B0·2^j <= B_crit (>= B0); fixed once B_crit reaches the
  top; a ramp of at most 7 whole-unit increments within the run."""
  from date_optax.diagnostics import propose_batch_schedule  # noqa: PLC0415

  unit = b0 if b0 % unit_of else b0 // unit_of
  top = b0 * 2**doublings + (extra * unit if kind == "ramp" else 0)
  s = propose_batch_schedule(critical, base_batch_size=b0, max_batch=top, unit=unit,
                             total_examples=total, kind=kind, ramp_fraction=fraction)
  if critical >= top or top == b0:
    assert s == date_optax.BatchSchedule.fixed(top)
    return
  j = int(math.log2(s.start // b0))
  assert s.start == b0 * 2**j and (s.start <= critical or j == 0) and 2 * s.start > critical
  assert s.kind == kind and s.max_batch == top
  assert all(b % unit == 0 for b in s.batch_sizes)
  if kind == "ramp":
    m = (top - s.start) // s.increment
    assert 1 <= m <= 7 and s.start + m * s.increment == top
    assert s.ramp_examples == max(1, math.floor(fraction * total)) <= total
    s.check_run(total)


STATS = st.one_of(
    st.tuples(NUMBERS, NUMBERS, NUMBERS).map(lambda t: date_optax.GradStats(*t)),
    st.tuples(NUMBERS | ARRAYS | ODD, NUMBERS | ARRAYS | ODD, NUMBERS | ARRAYS | ODD).map(
        lambda t: date_optax.GradStats(*t)),
    st.sampled_from([(1, 64, 256), [1.0, 64.0, 256.0], {"sq_norm": 1.0}, None, 3.0, "stats",
                     date_optax.GradStats(1.0, 64.0, 256.0)]),
)


@settings(PROPERTY, max_examples=60)
@given(stats=STATS, scale=st.sampled_from([4.0, 1.0, 0.5, math.inf, "4"]),
       via=st.sampled_from(["adascale_gain", "adascale", "date gain"]))
def test_adascale_property(stats, scale, via):
  params = {"dense": {"kernel": jnp.ones((3, 2))}}
  if via == "adascale_gain":
    call = lambda: date_optax.adascale_gain(stats, scale)
    check = lambda r: _gain_in_range(r, float(scale))
  else:
    def call():
      if via == "adascale":
        tx = date_optax.adascale(optax.sgd(0.1), scale)
      else:
        tx = date_optax.date(date_optax.Baseline(**BASELINE), 128, lr_scaling="gain")
      return tx.update(params, tx.init(params), params, grad_stats=stats)

    check = lambda out: (_finite(out[0], "updates"), _gain_in_range(
        _gain_state(out[1]).gain, 4.0))
  _named(call, ["grad_stats", "scale"], check)


def _gain_state(opt_state):
  return next(x for x in jax.tree.leaves(
      opt_state, is_leaf=lambda x: isinstance(x, date_optax.AdaScaleState))
      if isinstance(x, date_optax.AdaScaleState))


def _gain_in_range(r, scale):
  r = float(r)
  assert 1.0 <= r <= scale or math.isclose(r, scale), r  # never NaN


# -- The recipe CLI.

CLI_VALUES = st.sampled_from(["0", "-1", "1e400", "inf", "nan", "x", "", "2**2.5", "1/0",
                              "1K", "3.5", "1,2", "1e-30", "10**10", "64", "0.5"])
CLI_FLAGS = {
    "--base-batch": ["batch_size", "base-batch"], "--lr": ["learning_rate", "lr"],
    "--warmup-epochs": ["warmup"], "--epochs": ["epochs", "warmup"],
    "--num-examples": ["num_examples", "num-examples", "warmup"],
    "--batch": ["batch", "warmup"], "--critical-batch": ["critical-batch"],
    "--power": ["power"], "--floor": ["floor"], "--warmup-factor": ["warmup_factor"],
    "--factor": ["factor"], "--noise-scales": ["noise-scales"],
    "--propose-batch-schedule": ["propose-batch-schedule"],
    "--ramp-fraction": ["ramp-fraction", "ramp_fraction"], "--unit": ["unit"],
    "--calibration": ["calibration"],
}


@settings(PROPERTY, max_examples=30)
@given(changes=st.dictionaries(st.sampled_from(sorted(CLI_FLAGS)), CLI_VALUES, min_size=1,
                               max_size=2),
       fmt=st.sampled_from(["table", "csv", "json", "xml"]),
       plot=st.sampled_from([None, None, None, "missing/a.png", "a.txt", "a", "dir.png"]))
def test_recipe_cli_property(tmp_path_factory, capsys, changes, fmt, plot):
  from date_optax._src import cli  # noqa: PLC0415

  root = tmp_path_factory.mktemp("cli")
  (root / "dir.png").mkdir()
  argv = ["recipe", "--preset", "date-example", "--format", fmt]
  for flag, value in changes.items():
    argv += [f"{flag}={value}"]
  if plot:
    argv += ["--plot", str(root / plot)]
  names = [n for flag in changes for n in (flag, *CLI_FLAGS[flag])]
  names += ["--format"] + (["--plot"] if plot else [])
  before = sorted(p.name for p in root.iterdir())
  try:
    rc = cli.main(argv)
  except SystemExit as e:  # argparse: "argument --flag: ..."
    rc = e.code
  out, err = capsys.readouterr()
  assert rc in (0, 2), (argv, rc, err)
  assert "Traceback" not in err, err
  if rc == 2:
    assert "error:" in err and any(n in err for n in names), (argv, err)
    assert sorted(p.name for p in root.iterdir()) == before  # nothing written
  else:
    assert out and "nan" not in out.lower(), out
