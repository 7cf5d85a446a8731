"""One name per meaning: ratio_source, masks named by what they mask, one rule
for trust_coefficient, the state readers' table, and the deprecated former
names (each still works for one release and warns)."""

import inspect
import math
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import date_optax
from date_optax._src import state_readers

PARAMS = {"w": jnp.array([[3.0, 4.0], [0.0, 12.0]]), "b": jnp.array([0.5, -0.5])}
GRADS = {"w": jnp.array([[0.1, -0.2], [0.3, 0.4]]), "b": jnp.array([0.02, 0.01])}
WD = {"w": True, "b": False}


def one_update(tx, params=PARAMS, grads=GRADS):
  updates, state = tx.update(grads, tx.init(params), params)
  return updates, state


def assert_trees_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture
def no_warnings():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    yield


# ---------------------------------------------------------------------------
# ratio_source.


def test_scale_by_trust_ratio_takes_ratio_source(no_warnings):
  inner = optax.scale(3.0)
  w, g = np.asarray(PARAMS["w"], np.float64), np.asarray(GRADS["w"], np.float64)
  r = np.linalg.norm(w) / np.linalg.norm(g)
  got, _ = one_update(date_optax.scale_by_trust_ratio(inner=inner, ratio_source="gradient"))
  np.testing.assert_allclose(np.asarray(got["w"]), r * 3.0 * g, rtol=1e-6)
  # The default is unchanged: the ratio is measured on the inner update, so
  # the factor 3 cancels.
  got, _ = one_update(date_optax.scale_by_trust_ratio(inner=inner))
  np.testing.assert_allclose(np.asarray(got["w"]), r * g, rtol=1e-6)
  assert inspect.signature(date_optax.scale_by_trust_ratio).parameters[
      "ratio_source"].default == "update"
  assert inspect.signature(date_optax.bounded_lars).parameters[
      "ratio_source"].default == "gradient"
  assert inspect.signature(date_optax.date).parameters[
      "ratio_source"].default == "gradient"


@pytest.mark.parametrize("value", ["gradient", "update"])
def test_source_is_deprecated_and_means_ratio_source(value):
  inner = optax.scale(3.0)
  want, _ = one_update(date_optax.scale_by_trust_ratio(inner=inner, ratio_source=value))
  with pytest.warns(DeprecationWarning, match=r"scale_by_trust_ratio\(source=.*ratio_source"):
    tx = date_optax.scale_by_trust_ratio(inner=inner, source=value)
  got, _ = one_update(tx)
  assert_trees_equal(got, want)
  # Both names with the same value is allowed; different values are refused.
  with pytest.warns(DeprecationWarning):
    date_optax.scale_by_trust_ratio(ratio_source=value, source=value)
  other = "update" if value == "gradient" else "gradient"
  if other != "update":  # "update" is the default: indistinguishable from not given
    with pytest.warns(DeprecationWarning), pytest.raises(
        ValueError, match="source.*ratio_source|ratio_source.*source"):
      date_optax.scale_by_trust_ratio(ratio_source=other, source=value)


def test_deprecated_source_is_still_validated():
  with pytest.raises(ValueError, match="source"):
    date_optax.scale_by_trust_ratio(source="weights")
  with pytest.raises(ValueError, match="ratio_source"):
    date_optax.scale_by_trust_ratio(ratio_source="weights")


# ---------------------------------------------------------------------------
# Masks named by what they mask.

# Public (function, keyword) pairs whose keyword is a former name, and its new name.
DEPRECATED_KEYWORDS = {
    ("scale_by_trust_ratio", "source"): "ratio_source",
    ("scale_by_trust_ratio", "mask"): "trust_ratio_mask",
    ("lamb", "mask"): "weight_decay_mask",
}


def _public_functions():
  for name in date_optax.__all__:
    obj = getattr(date_optax, name)
    if inspect.isfunction(obj):
      yield name, obj


def test_no_public_transform_has_an_ambiguous_keyword_except_deprecated_ones():
  found = {(name, p) for name, fn in _public_functions()
           for p in inspect.signature(fn).parameters if p in ("mask", "source")}
  assert found == set(DEPRECATED_KEYWORDS)
  for (name, old), new in DEPRECATED_KEYWORDS.items():
    params = inspect.signature(getattr(date_optax, name)).parameters
    assert new in params
    assert params[old].default is None  # None = not given


def test_lamb_mask_is_deprecated_and_means_weight_decay_mask():
  kw = dict(weight_decay=0.1, lower=0.0, upper=100.0)
  want, want_state = one_update(date_optax.lamb(0.1, weight_decay_mask=WD, **kw))
  with pytest.warns(DeprecationWarning, match=r"lamb\(mask=.*weight_decay_mask"):
    tx = date_optax.lamb(0.1, mask=WD, **kw)
  got, got_state = one_update(tx)
  assert_trees_equal(got, want)
  # The one mask rule: the weight-decay mask alone is also the trust mask,
  # so the excluded bias records ratio 1 and takes the plain Adam step.
  assert float(date_optax.trust_ratios(got_state)["b"]) == 1.0
  g = np.asarray(GRADS["b"], np.float64)
  np.testing.assert_allclose(np.asarray(got["b"]), -0.1 * g / (np.abs(g) + 1e-6), rtol=1e-4)
  # Without any mask the bias gets decay and a ratio: a different update.
  plain, _ = one_update(date_optax.lamb(0.1, **kw))
  assert not np.allclose(np.asarray(plain["b"]), np.asarray(got["b"]))
  with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="mask"):
    date_optax.lamb(0.1, mask=WD, weight_decay_mask=WD)


def test_scale_by_trust_ratio_mask_is_deprecated_and_means_trust_ratio_mask():
  want, _ = one_update(date_optax.scale_by_trust_ratio(trust_ratio_mask=WD))
  with pytest.warns(DeprecationWarning,
                    match=r"scale_by_trust_ratio\(mask=.*trust_ratio_mask"):
    tx = date_optax.scale_by_trust_ratio(mask=WD)
  got, state = one_update(tx)
  assert_trees_equal(got, want)
  np.testing.assert_array_equal(np.asarray(got["b"]), np.asarray(GRADS["b"]))  # ratio 1
  assert float(date_optax.trust_ratios(state)["w"]) != 1.0


def test_errors_name_the_keyword_given():
  bad = {"w": True, "c": False}
  for tx, name in (
      (date_optax.lamb(0.1, weight_decay_mask=bad), "weight_decay_mask"),
      (date_optax.scale_by_trust_ratio(trust_ratio_mask=bad), "trust_ratio_mask"),
  ):
    with pytest.raises(ValueError, match=name):
      tx.init(PARAMS)
  with pytest.warns(DeprecationWarning):
    tx = date_optax.lamb(0.1, mask=bad)
  with pytest.raises(ValueError, match=r"^mask"):
    tx.init(PARAMS)


def test_new_names_do_not_warn(no_warnings):
  one_update(date_optax.lamb(0.1, weight_decay=0.1, weight_decay_mask=WD,
                             trust_ratio_mask=True))
  one_update(date_optax.scale_by_trust_ratio(ratio_source="gradient", trust_ratio_mask=WD,
                                             weight_decay_mask=True, weight_decay=0.1))
  _, state = one_update(date_optax.lars(0.1))
  date_optax.current_learning_rate(state)
  date_optax.trust_ratios(state)
  date_optax.trust_ratio_bounds(state)


def test_deprecated_keywords_work_under_inject_hyperparams():
  with pytest.warns(DeprecationWarning):
    tx = optax.inject_hyperparams(date_optax.lamb)(learning_rate=0.1, weight_decay=0.1,
                                                   mask=WD)
    got, _ = one_update(tx)
  want, _ = one_update(optax.inject_hyperparams(date_optax.lamb)(
      learning_rate=0.1, weight_decay=0.1, weight_decay_mask=WD))
  assert_trees_equal(got, want)
  plain, _ = one_update(optax.inject_hyperparams(date_optax.lamb)(
      learning_rate=0.1, weight_decay=0.1))
  assert not np.allclose(np.asarray(plain["b"]), np.asarray(got["b"]))


# ---------------------------------------------------------------------------
# trust_coefficient: finite and > 0 in every transform that takes it.

TAKES_TRUST_COEFFICIENT = {
    "lars": lambda c: date_optax.lars(0.1, trust_coefficient=c),
    "bounded_lars": lambda c: date_optax.bounded_lars(0.1, trust_coefficient=c),
    "scale_by_trust_ratio": lambda c: date_optax.scale_by_trust_ratio(trust_coefficient=c),
    "date": lambda c: date_optax.date(
        date_optax.Baseline(batch_size=64, learning_rate=0.1, warmup_epochs=1, epochs=4,
                            num_examples=256), 128, trust_coefficient=c),
    "Baseline": lambda c: date_optax.Baseline(
        batch_size=64, learning_rate=0.1, warmup_epochs=1, epochs=4, num_examples=256,
        optimizer_options={"trust_coefficient": c}),
}


def test_every_public_trust_coefficient_is_covered():
  takes = {name for name, fn in _public_functions()
           if "trust_coefficient" in inspect.signature(fn).parameters}
  assert takes == {"lars", "bounded_lars", "scale_by_trust_ratio"}
  assert takes <= set(TAKES_TRUST_COEFFICIENT)


@pytest.mark.parametrize("ctor", list(TAKES_TRUST_COEFFICIENT))
@pytest.mark.parametrize("value", [0.0, -0.0, -1e-3, math.nan, math.inf, -math.inf])
def test_trust_coefficient_must_be_finite_and_positive(ctor, value):
  with pytest.raises(ValueError, match=r"trust_coefficient must be finite and > 0"):
    TAKES_TRUST_COEFFICIENT[ctor](value)


@pytest.mark.parametrize("ctor", ["lars", "bounded_lars", "scale_by_trust_ratio"])
def test_a_small_positive_trust_coefficient_scales_the_ratio(ctor):
  # The ratio is linear in c (no bounds reached): c = 1e-3 gives 1e-3 x the
  # ratio of c = 1 on the one layer with nonzero norms that the bounds leave alone.
  def ratio(c):
    tx = TAKES_TRUST_COEFFICIENT[ctor](c)
    if ctor == "bounded_lars":
      tx = date_optax.bounded_lars(0.1, trust_coefficient=c, lower=0.0, upper=1e9)
    _, state = one_update(tx)
    return float(date_optax.trust_ratios(state)["w"])

  w, g = np.asarray(PARAMS["w"], np.float64), np.asarray(GRADS["w"], np.float64)
  want = np.linalg.norm(w) / np.linalg.norm(g)
  np.testing.assert_allclose(ratio(1.0), want, rtol=1e-6)
  np.testing.assert_allclose(ratio(1e-3), 1e-3 * want, rtol=1e-6)


# ---------------------------------------------------------------------------
# State readers.


def test_the_table_lists_every_state_that_keeps_ratios():
  states = {getattr(date_optax, n) for n in date_optax.__all__ if n.endswith("State")}
  with_ratios = {s for s in states if "ratios" in getattr(s, "_fields", ())}
  assert with_ratios == {date_optax.TrustRatioState, date_optax.LarsState,
                         date_optax.LambState, date_optax.BoundedLarsState}
  assert with_ratios <= set(state_readers.STATE_FIELDS)
  for s in with_ratios:
    fields = state_readers.STATE_FIELDS[s]
    assert fields.ratios is not None and fields.bounds is not None
    assert (fields.learning_rate is not None) == ("learning_rate" in s._fields)


def test_readers_on_each_optimizer():
  sched = optax.linear_schedule(0.0, 1.0, 10)  # 0.1 per step
  for make in (date_optax.lars, date_optax.lamb, date_optax.bounded_lars):
    tx = make(sched)
    state = tx.init(PARAMS)
    for _ in range(3):
      _, state = tx.update(GRADS, state, PARAMS)
    np.testing.assert_allclose(float(date_optax.current_learning_rate(state)), 0.2,
                               rtol=1e-6)
    assert set(date_optax.trust_ratios(state)) == {"w", "b"}
    assert len(date_optax.trust_ratio_bounds(state)) == 2


def test_register_state_makes_a_new_state_readable():
  class MyState(NamedTuple):
    step_size: Any
    per_layer: Any

  state = (optax.EmptyState(), MyState(jnp.float32(0.5), {"w": jnp.float32(2.0)}))
  assert date_optax.trust_ratios(state) is None
  assert date_optax.current_learning_rate(state) is None
  state_readers.register_state(MyState, state_readers.StateFields(
      ratios=lambda s: s.per_layer, learning_rate=lambda s: s.step_size))
  try:
    assert float(date_optax.trust_ratios(state)["w"]) == 2.0
    assert float(date_optax.current_learning_rate(state)) == 0.5
    assert date_optax.trust_ratio_bounds(state) is None
  finally:
    del state_readers.STATE_FIELDS[MyState]
  with pytest.raises(TypeError, match="fields"):
    state_readers.register_state(MyState, {"ratios": "per_layer"})


def test_inject_hyperparams_learning_rate_wins_over_the_state_inside():
  tx = optax.inject_hyperparams(date_optax.lars)(learning_rate=0.3)
  _, state = one_update(tx)
  assert float(date_optax.current_learning_rate(state)) == pytest.approx(0.3)
  # Ratios are found inside the inject_hyperparams state.
  assert set(date_optax.trust_ratios(state)) == {"w", "b"}


def test_learning_rate_reader_is_deprecated():
  with pytest.warns(DeprecationWarning, match=r"date_optax\.learning_rate.*current_learning_rate"):
    reader = date_optax.learning_rate
  assert reader is date_optax.current_learning_rate
  with pytest.warns(DeprecationWarning):
    from date_optax import learning_rate  # noqa: F401, PLC0415
  assert "learning_rate" not in date_optax.__all__
  assert "current_learning_rate" in date_optax.__all__
  _, state = one_update(date_optax.lars(0.25))
  with pytest.warns(DeprecationWarning):
    assert float(date_optax.learning_rate(state)) == 0.25
  with pytest.raises(AttributeError):
    date_optax.no_such_name  # noqa: B018
