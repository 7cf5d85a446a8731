"""Hypothesis-generated bad arguments raise ValueError/TypeError naming the
argument, at construction: never a JAX tracing error, never a silent NaN."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import date_optax
from date_optax._src import validation

negative = st.floats(max_value=-1e-12, allow_nan=False, allow_infinity=False)
non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
not_a_number = st.one_of(st.text(max_size=3), st.none(), st.lists(st.floats(), max_size=2))
at_least_one = st.floats(min_value=1.0, allow_nan=False, allow_infinity=False)


def _raises_naming(fn, name, exc=(ValueError, TypeError)):
  with pytest.raises(exc) as info:
    fn()
  assert name in str(info.value), f"message does not name {name!r}: {info.value}"


CONSTRUCTORS = {
    "lars": lambda **kw: date_optax.lars(kw.pop("learning_rate", 0.1), **kw),
    "lamb": lambda **kw: date_optax.lamb(kw.pop("learning_rate", 0.1), **kw),
    "bounded_lars": lambda **kw: date_optax.bounded_lars(
        kw.pop("learning_rate", 0.1), **kw),
    "scale_by_trust_ratio": lambda **kw: date_optax.scale_by_trust_ratio(**kw),
    # The base solvers' settings of bounded_lars, in base_options.
    "bounded_lars(momentum)": lambda **kw: date_optax.bounded_lars(0.1, base_options=kw),
    "bounded_lars(adam)": lambda **kw: date_optax.bounded_lars(
        0.1, base="adam", base_options=kw),
}

NONNEGATIVE = [
    ("lars", "learning_rate"), ("lars", "weight_decay"), ("lars", "eps"),
    ("lamb", "learning_rate"), ("lamb", "weight_decay"), ("lamb", "eps"),
    ("lamb", "eps_root"), ("bounded_lars", "learning_rate"),
    ("bounded_lars", "weight_decay"), ("bounded_lars", "lower"),
    ("scale_by_trust_ratio", "trust_coefficient"), ("scale_by_trust_ratio", "eps"),
    ("scale_by_trust_ratio", "weight_decay"),
]
UNIT = [("lars", "momentum"), ("lamb", "b1"), ("lamb", "b2"),
        ("bounded_lars(momentum)", "momentum"), ("bounded_lars(adam)", "b1"),
        ("bounded_lars(adam)", "b2")]


@pytest.mark.parametrize("ctor,arg", NONNEGATIVE)
@given(value=st.one_of(negative, non_finite))
def test_nonnegative_arguments(ctor, arg, value):
  _raises_naming(lambda: CONSTRUCTORS[ctor](**{arg: value}), arg)


@pytest.mark.parametrize("ctor,arg", NONNEGATIVE + UNIT)
@given(value=not_a_number)
def test_non_numeric_arguments(ctor, arg, value):
  _raises_naming(lambda: CONSTRUCTORS[ctor](**{arg: value}), arg)


@pytest.mark.parametrize("ctor,arg", UNIT)
@given(value=st.one_of(negative, at_least_one, non_finite))
def test_unit_interval_arguments(ctor, arg, value):
  _raises_naming(lambda: CONSTRUCTORS[ctor](**{arg: value}), arg)


@pytest.mark.parametrize("ctor", ["lars", "lamb", "bounded_lars", "scale_by_trust_ratio"])
@given(lower=st.floats(0.0, 100.0), gap=st.floats(1e-6, 100.0))
def test_lower_above_upper(ctor, lower, gap):
  upper = lower - gap
  if upper <= 0:
    upper = None if ctor != "bounded_lars" else 0.0
  if upper is None:
    return
  _raises_naming(lambda: CONSTRUCTORS[ctor](lower=lower, upper=upper),
                 "lower" if upper > 0 else "upper")


@given(name=st.text(min_size=1, max_size=8).filter(
    lambda s: s not in ("sgd", "momentum", "nesterov", "adagrad", "rmsprop", "adam")))
def test_unknown_base(name):
  _raises_naming(lambda: date_optax.bounded_lars(0.1, base=name), "base")


def test_schedules_are_accepted_where_documented():
  sched = lambda count: 0.1
  date_optax.lars(sched, weight_decay=sched)
  date_optax.lamb(sched, weight_decay=sched, lower=sched, upper=sched)
  date_optax.bounded_lars(sched, lower=sched, upper=sched)


def test_check_real_message_names_range():
  with pytest.raises(ValueError, match=r"momentum must be in \[0.0, 1.0\)"):
    validation.check_unit_interval("momentum", 1.0)
