"""Schedules of date_optax.schedules against numpy references from
docs/algorithms.md, "Learning-rate scaling and LEGW"."""

from __future__ import annotations

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from date_optax import schedules

# ---------------------------------------------------------------------------
# numpy reference, written from the formulas of docs/algorithms.md with i = count + 1.


def ref_lr(count, peak, W, T=None, decay=("constant",), spe=None,
           warmup="gradual", warmup_factor=0.1):
  """float64 learning rate of update `count` (zero-based)."""
  i = count + 1
  if i <= W:
    return peak * i / W if warmup == "gradual" else peak * warmup_factor
  kind = decay[0]
  if kind == "constant":
    return peak
  if kind == "poly":
    (p,) = decay[1:]
    return peak * max(1.0 - i / T, 0.0) ** p
  if kind == "roller_coaster":
    p, floor = decay[1:]
    prog = min((i - W) / (T - W), 1.0)
    return max(peak * (1.0 - prog) ** p, floor)
  if kind == "cosine":
    prog = min((i - W) / (T - W), 1.0)
    return peak * 0.5 * (1.0 + math.cos(math.pi * prog))
  if kind == "multistep":
    epochs, factors = decay[1:]
    out = peak
    for e, f in zip(epochs, factors, strict=True):
      # Iteration i covers epochs ((i-1)/s, i/s]; past e when i/s > e.
      if Fraction(i) / Fraction(spe) > Fraction(e):
        out *= f
    return out
  if kind == "exponential":
    e0, f = decay[1:]
    epoch_number = math.ceil(Fraction(i) / Fraction(spe))  # 1-based epoch of i
    return peak * f ** max(epoch_number - e0, 0)
  raise AssertionError(kind)


def ref_curve(n, *args, **kwargs):
  return np.array([ref_lr(c, *args, **kwargs) for c in range(n)])


_N = 1024  # one evaluation length, so eager ops are not recompiled per shape


def values(sched, n):
  """The schedule at counts 0..n-1."""
  return np.asarray(sched(jnp.arange(max(n, _N))))[:n]


# ---------------------------------------------------------------------------
# Values against the reference.


@pytest.mark.parametrize("warmup", ["gradual", "constant"])
@pytest.mark.parametrize("W,T", [(0, 50), (1, 7), (10, 40), (117, 220)])
def test_roller_coaster_matches_reference(W, T, warmup):
  for p, floor in [(1.0, 1e-6), (2.0, 0.01), (0.5, 0.0)]:
    sched = schedules.roller_coaster(
        0.7, W, T, power=p, floor=floor, warmup=warmup, warmup_factor=0.25
    )
    n = T + 5  # past the end too: stays at the floor
    want = ref_curve(n, 0.7, W, T, ("roller_coaster", p, floor), warmup=warmup,
                     warmup_factor=0.25)
    np.testing.assert_allclose(values(sched, n), want, rtol=2e-6, atol=1e-9)


@pytest.mark.parametrize("W,T", [(0, 30), (5, 30), (391, 3519)])
def test_poly_matches_reference(W, T):
  for p in (0.0, 0.5, 1.0, 2.0):
    sched = schedules.poly(3.0, W, T, power=p)
    n = T + 3
    want = ref_curve(n, 3.0, W, T, ("poly", p))
    np.testing.assert_allclose(values(sched, n), want, rtol=2e-6, atol=1e-7)


def test_poly_is_unshifted():
  # LEGW's poly decay counts from iteration 0: right after the warmup the
  # rate is peak·(1 − (W+1)/T)^p, not the peak.
  sched = schedules.poly(1.0, 10, 20, power=1.0)
  np.testing.assert_allclose(float(sched(9)), 1.0, rtol=1e-6)
  np.testing.assert_allclose(float(sched(10)), 1.0 - 11 / 20, rtol=1e-6)


@pytest.mark.parametrize("W,T", [(0, 25), (4, 25)])
def test_cosine_matches_reference(W, T):
  sched = schedules.cosine(0.2, W, T)
  want = ref_curve(T + 3, 0.2, W, T, ("cosine",))
  np.testing.assert_allclose(values(sched, T + 3), want, rtol=2e-6, atol=1e-8)


def test_constant_and_warmups_match_reference():
  np.testing.assert_allclose(
      values(schedules.constant(0.3, 6), 12), ref_curve(12, 0.3, 6), rtol=1e-6
  )
  np.testing.assert_allclose(
      values(schedules.gradual_warmup(0.3, 6), 12), ref_curve(12, 0.3, 6), rtol=1e-6
  )
  np.testing.assert_allclose(
      values(schedules.constant_warmup(0.3, 6, factor=0.2), 12),
      ref_curve(12, 0.3, 6, warmup="constant", warmup_factor=0.2),
      rtol=1e-6,
  )
  # No warmup: the first update already has the peak.
  np.testing.assert_allclose(values(schedules.constant(0.3), 3), [0.3] * 3, rtol=1e-6)


@pytest.mark.parametrize(
    "spe", [Fraction(117, 2), 58.5, Fraction(7), 7.3125, Fraction(1000, 3)]
)
def test_multistep_matches_reference(spe):
  # The DATE baseline (You et al., SC 2019, §3.6): ×0.1 at epochs 10, 20 and 27, 58.5 it/epoch.
  epochs, factors = (10, 20, 27), (0.1, 0.1, 0.1)
  W = 117 if float(spe) == 58.5 else 3
  sched = schedules.multistep(1.25e-3, W, spe, epochs=epochs, factors=0.1)
  n = int(math.ceil(30 * float(spe))) + 2
  exact_spe = spe if isinstance(spe, Fraction) else Fraction(repr(spe))
  want = ref_curve(n, 1.25e-3, W, None, ("multistep", epochs, factors), spe=exact_spe)
  np.testing.assert_allclose(values(sched, n), want, rtol=2e-6)


def test_multistep_boundaries_of_the_date_baseline():
  # 58.5 iterations per epoch: epoch 10 ends exactly at iteration 585.
  sched = schedules.multistep(1.0, 117, 58.5, epochs=[10, 20, 27], factors=0.1)
  lr = lambda i: float(sched(i - 1))  # noqa: E731 - iteration i is count i-1
  np.testing.assert_allclose([lr(117), lr(118), lr(585), lr(586)],
                             [1.0, 1.0, 1.0, 0.1], rtol=1e-6)
  np.testing.assert_allclose([lr(1170), lr(1171), lr(1579), lr(1580)],
                             [0.1, 0.01, 0.01, 0.001], rtol=1e-5)


def test_multistep_per_boundary_factors():
  sched = schedules.multistep(2.0, 0, 4, epochs=[1, 3], factors=[0.5, 0.2])
  want = ref_curve(16, 2.0, 0, None, ("multistep", (1, 3), (0.5, 0.2)), spe=4)
  np.testing.assert_allclose(values(sched, 16), want, rtol=1e-6)


@pytest.mark.parametrize("spe", [Fraction(13), Fraction(5, 2), 2.5])
def test_exponential_matches_reference(spe):
  # PTB (Zaremba et al.): lr 1 for 4 epochs, then halved every epoch.
  sched = schedules.exponential(1.0, 2, spe, start_epoch=4, factor=0.5)
  n = int(math.ceil(12 * float(spe)))
  want = ref_curve(n, 1.0, 2, None, ("exponential", 4, 0.5), spe=Fraction(spe))
  np.testing.assert_allclose(values(sched, n), want, rtol=1e-6)


def test_exponential_equals_multistep_with_unit_boundaries():
  a = schedules.exponential(1.0, 3, 5, start_epoch=2, factor=0.7)
  b = schedules.multistep(1.0, 3, 5, epochs=list(range(2, 12)), factors=0.7)
  np.testing.assert_allclose(values(a, 55), values(b, 55), rtol=1e-6)


def test_warmup_decay_schedule_accepts_names_and_decays():
  a = schedules.warmup_decay_schedule(1.0, 5, 20, decay="roller_coaster")
  b = schedules.RollerCoaster().schedule(1.0, 5, 20)
  c = schedules.roller_coaster(1.0, 5, 20)
  np.testing.assert_array_equal(values(a, 25), values(b, 25))
  np.testing.assert_array_equal(values(a, 25), values(c, 25))


def test_decay_from_name():
  assert schedules.decay_from_name("poly", power=3) == schedules.Poly(3)
  rc = schedules.decay_from_name("roller_coaster")
  assert rc == schedules.RollerCoaster(1.0, 1e-6)
  d = schedules.MultiStep(epochs=(30, 60))
  assert schedules.decay_from_name(d) is d
  assert sorted(schedules.DECAYS) == sorted(
      ["constant", "poly", "roller_coaster", "multistep", "exponential", "cosine"]
  )
  with pytest.raises(ValueError, match="decay"):
    schedules.decay_from_name("step")
  with pytest.raises(TypeError, match="floor"):
    schedules.decay_from_name("poly", floor=0.1)


# ---------------------------------------------------------------------------
# jit, dtype, shapes.


@pytest.mark.parametrize(
    "make",
    [
        lambda: schedules.roller_coaster(0.5, 10, 100),
        lambda: schedules.poly(0.5, 10, 100, power=2),
        lambda: schedules.cosine(0.5, 10, 100),
        lambda: schedules.multistep(0.5, 10, 7.5, epochs=[3, 6], factors=0.1),
        lambda: schedules.exponential(0.5, 10, 7.5, start_epoch=3, factor=0.5),
        lambda: schedules.constant_warmup(0.5, 10, 0.1),
    ],
)
def test_jit_matches_eager_and_is_float32(make):
  sched = make()
  counts = jnp.arange(120)
  eager = np.array([float(sched(c)) for c in range(120)])
  jitted = jax.jit(sched)(counts)
  assert jitted.dtype == jnp.float32
  # XLA may fuse differently under jit: equal up to float32 rounding.
  np.testing.assert_allclose(np.asarray(jitted), eager, rtol=1e-6)
  # Inside a scan, fed optax's int32 count.
  _, scanned = jax.lax.scan(lambda c, _: (c + 1, sched(c)), jnp.int32(0), None, 120)
  np.testing.assert_allclose(np.asarray(scanned), eager, rtol=1e-6)


def test_multi_stage_schedule_rewarms_from_zero():
  a = schedules.roller_coaster(1.0, 4, 10, floor=0.0)
  b = schedules.roller_coaster(0.5, 2, 6, floor=0.0)
  sched = schedules.multi_stage_schedule([a, b], [10, 6])
  got = values(sched, 16)
  want = np.concatenate([ref_curve(10, 1.0, 4, 10, ("roller_coaster", 1.0, 0.0)),
                         ref_curve(6, 0.5, 2, 6, ("roller_coaster", 1.0, 0.0))])
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
  assert got[9] == 0.0 and got[10] == pytest.approx(0.25)  # re-warm, not decay
  with pytest.raises(ValueError, match="stage_steps"):
    schedules.multi_stage_schedule([a, b], [10])
  with pytest.raises(ValueError, match="stage_steps"):
    schedules.multi_stage_schedule([a, b], [10, 0])


# ---------------------------------------------------------------------------
# Scaling rules.


def test_scaling_rules():
  assert schedules.linear_scaling(0.1, 8192, 256) == pytest.approx(3.2)
  assert schedules.sqrt_scaling(0.1, 8192, 128) == pytest.approx(0.8)
  assert schedules.sqrt_scaling(1.0, 256, 1024) == pytest.approx(0.5)  # k < 1
  assert schedules.scale_by_rule("none", 0.1, 8192, 256) == 0.1
  assert schedules.scale_by_rule("linear", 2.0, 512, 1024) == 1.0
  with pytest.raises(ValueError, match="rule"):
    schedules.scale_by_rule("cube", 1.0, 2, 1)
  with pytest.raises(ValueError, match="batch_size"):
    schedules.sqrt_scaling(1.0, 0, 1)
  with pytest.raises(ValueError, match="base_batch_size"):
    schedules.linear_scaling(1.0, 2, -1)


# ---------------------------------------------------------------------------
# Hypothesis properties.

_warm_run = st.integers(1, 300).flatmap(
    lambda W: st.tuples(st.just(W), st.integers(W + 1, W + 400))
)
_peaks = st.floats(1e-4, 10.0)


@given(_warm_run, _peaks, st.sampled_from(list(schedules.DECAYS)))
def test_peak_reached_at_end_of_warmup(wt, peak, name):
  W, T = wt
  decay = {
      "multistep": schedules.MultiStep(epochs=(1.0, 2.0)),
      "exponential": schedules.Exponential(start_epoch=1.0, factor=0.5),
  }.get(name, name)
  sched = schedules.warmup_decay_schedule(
      peak, W, T, decay=decay, steps_per_epoch=T / 3
  )
  v = values(sched, W)
  np.testing.assert_allclose(v[-1], peak, rtol=1e-6)  # iteration W
  np.testing.assert_allclose(v[0], peak / W, rtol=1e-6)  # iteration 1 > 0
  assert np.all(np.diff(v) > 0)


@given(_warm_run, _peaks, st.floats(0.0, 4.0), st.floats(0.0, 1.0))
def test_roller_coaster_properties(wt, peak, power, floor_frac):
  W, T = wt
  floor = peak * floor_frac * 1e-3
  sched = schedules.roller_coaster(peak, W, T, power=power, floor=floor)
  v = values(sched, T + 10).astype(np.float64)
  after = v[W - 1:]  # iteration W onwards
  # Continuous at the end of warmup: the first decayed step moves by at most
  # one step's worth of decay.
  assert abs(after[1] - peak) <= peak * max(power, 1.0) / (T - W) * (1 + 1e-5) + 1e-7
  # Non-increasing after the warmup, never below the floor, floor at T.
  assert np.all(np.diff(after) <= peak * 1e-6)
  assert np.all(after >= np.float32(floor) * (1 - 1e-6))
  # The exponent is a float32 in the schedule: one that underflows there is 0,
  # and (1 - t)**0 stays at the peak.
  if np.float32(power) > 0:
    np.testing.assert_allclose(v[T - 1], np.float32(floor), rtol=1e-6, atol=1e-12)


@given(
    st.integers(0, 50),
    st.integers(1, 200),
    _peaks,
    st.sampled_from(["constant", "poly", "roller_coaster", "cosine"]),
)
def test_schedules_match_reference_property(W, extra, peak, name):
  T = W + extra
  decay = {"poly": ("poly", 2.0), "roller_coaster": ("roller_coaster", 1.0, 1e-6),
           "cosine": ("cosine",), "constant": ("constant",)}[name]
  floor_ok = name != "roller_coaster" or peak >= 1e-6
  if not floor_ok:
    return
  sched = schedules.warmup_decay_schedule(peak, W, T, decay=name)
  want = ref_curve(T + 2, peak, W, T, decay)
  np.testing.assert_allclose(values(sched, T + 2), want, rtol=3e-6, atol=1e-9)


# ---------------------------------------------------------------------------
# Argument validation.


@pytest.mark.parametrize(
    "build,arg",
    [
        (lambda: schedules.RollerCoaster(power=-1.0), "power"),
        (lambda: schedules.RollerCoaster(floor=-1e-6), "floor"),
        (lambda: schedules.Poly(power=-0.5), "power"),
        (lambda: schedules.roller_coaster(1e-7, 2, 10), "floor"),
        (lambda: schedules.roller_coaster(0.0, 2, 10), "peak_value"),
        (lambda: schedules.roller_coaster(1.0, 10, 10), "total_steps"),
        (lambda: schedules.roller_coaster(1.0, -1, 10), "warmup_steps"),
        (lambda: schedules.poly(1.0, 0, 0), "total_steps"),
        (lambda: schedules.warmup_decay_schedule(1.0, 2, None, decay="cosine"),
         "total_steps"),
        (lambda: schedules.warmup_decay_schedule(
            1.0, 2, 10, decay=schedules.MultiStep(epochs=(1,))), "steps_per_epoch"),
        (lambda: schedules.warmup_decay_schedule(1.0, 2, 10, warmup="linear"),
         "warmup"),
        (lambda: schedules.constant_warmup(1.0, 2, factor=0.0), "warmup_factor"),
        (lambda: schedules.constant_warmup(1.0, 2, factor=1.5), "warmup_factor"),
        (lambda: schedules.MultiStep(epochs=(20, 10)), "increasing"),
        (lambda: schedules.MultiStep(epochs=()), "epochs"),
        (lambda: schedules.MultiStep(epochs=(0, 10)), "epochs"),
        (lambda: schedules.MultiStep(epochs=(1, 2), factors=(0.1,)), "factors"),
        (lambda: schedules.MultiStep(epochs=(1,), factors=-0.1), "factors"),
        (lambda: schedules.Exponential(start_epoch=-1, factor=0.5), "start_epoch"),
        (lambda: schedules.Exponential(start_epoch=1, factor=0.0), "factor"),
        (lambda: schedules.Exponential(start_epoch=1, factor=1.5), "factor"),
        (lambda: schedules.multistep(1.0, 0, 0.0, epochs=[1]), "steps_per_epoch"),
        (lambda: schedules.warmup_decay_schedule(1.0, 2, 10, decay="linear"), "decay"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(build, arg):
  with pytest.raises(ValueError, match=arg):
    build()


@given(st.floats(-1e3, -1e-9))
def test_negative_power_or_floor_always_rejected(x):
  with pytest.raises(ValueError, match="power"):
    schedules.RollerCoaster(power=x)
  with pytest.raises(ValueError, match="floor"):
    schedules.RollerCoaster(floor=x)
  with pytest.raises(ValueError, match="power"):
    schedules.Poly(power=x)


def test_non_integer_steps_rejected():
  with pytest.raises(TypeError, match="warmup_steps"):
    schedules.roller_coaster(1.0, 2.5, 10)
  with pytest.raises(TypeError, match="total_steps"):
    schedules.roller_coaster(1.0, 2, 10.0)
