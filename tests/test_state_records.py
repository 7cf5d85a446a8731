"""The optimizer state records the bounds and learning rate it applied."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import date_optax

PARAMS = {"w": jnp.array([[3.0, 4.0], [1.0, 2.0]]), "b": jnp.array([0.5, -0.5])}
GRADS = jax.tree.map(lambda p: 0.1 * p + 0.01, PARAMS)
SCHED = optax.linear_schedule(0.0, 1.0, 10)  # 0.1 per step
LOW = lambda t: 0.01 * (t + 1)  # noqa: E731
HIGH = lambda t: 5.0 + t  # noqa: E731

FACTORIES = {
    "lars": lambda: date_optax.lars(SCHED, lower=LOW, upper=HIGH),
    "lamb": lambda: date_optax.lamb(SCHED, lower=LOW, upper=HIGH),
    "bounded_lars": lambda: date_optax.bounded_lars(SCHED, lower=LOW, upper=HIGH),
    "date": lambda: date_optax.date(
        date_optax.Baseline(optimizer="momentum", batch_size=32,
                            learning_rate=0.1, warmup_epochs=1.0,
                            epochs=10, num_examples=1024), 64,
        learning_rate=SCHED, lower=LOW, upper=HIGH),
}


def steps(opt, n):
  state = opt.init(PARAMS)
  update = jax.jit(opt.update)
  for _ in range(n):
    _, state = update(GRADS, state, PARAMS)
  return state


@pytest.mark.parametrize("name", list(FACTORIES))
def test_fused_states_record_bounds_and_learning_rate(name):
  opt = FACTORIES[name]()
  state = opt.init(PARAMS)
  lo, hi = date_optax.trust_ratio_bounds(state)
  assert (float(lo), float(hi)) == pytest.approx((0.01, 5.0))  # step 0
  for n in (1, 3):
    state = steps(opt, n)
    lo, hi = date_optax.trust_ratio_bounds(state)
    assert lo.dtype == hi.dtype == jnp.float32 and lo.shape == ()
    # Applied at the last step, count n - 1.
    np.testing.assert_allclose([float(lo), float(hi)], [0.01 * n, 5.0 + n - 1],
                               rtol=1e-6)
    np.testing.assert_allclose(float(date_optax.current_learning_rate(state)),
                               0.1 * (n - 1), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("opt", [
    date_optax.lars(0.1), date_optax.lamb(0.1),
    date_optax.scale_by_trust_ratio(),
], ids=["lars", "lamb", "trust_ratio"])
def test_unbounded_records_zero_and_inf(opt):
  state = steps(opt, 2)
  lo, hi = date_optax.trust_ratio_bounds(state)
  assert float(lo) == 0.0 and float(hi) == np.inf


def test_scale_by_trust_ratio_records_bounds_not_learning_rate():
  opt = optax.chain(date_optax.scale_by_trust_ratio(lower=LOW, upper=2.0),
                    optax.sgd(0.1))
  state = steps(opt, 2)
  np.testing.assert_allclose([float(b) for b in
                              date_optax.trust_ratio_bounds(state)], [0.02, 2.0])
  assert date_optax.current_learning_rate(state) is None


def test_learning_rate_from_inject_hyperparams_and_compositions():
  inj = optax.inject_hyperparams(optax.adam)(learning_rate=0.25)
  assert float(date_optax.current_learning_rate(inj.init(PARAMS))) == 0.25
  ms = optax.MultiSteps(date_optax.lamb(SCHED), every_k_schedule=2)
  state = ms.init(PARAMS)
  for _ in range(4):  # two inner steps: counts 0 and 1
    _, state = jax.jit(ms.update)(GRADS, state, PARAMS)
  np.testing.assert_allclose(float(date_optax.current_learning_rate(state)), 0.1, rtol=1e-6)
  chained = optax.chain(optax.clip_by_global_norm(1.0),
                        optax.inject_hyperparams(date_optax.lars)(
                            learning_rate=0.3, upper=4.0))
  state = steps(chained, 1)
  assert float(date_optax.current_learning_rate(state)) == pytest.approx(0.3)
  assert float(date_optax.trust_ratio_bounds(state)[1]) == 4.0
  masked = optax.masked(date_optax.bounded_lars(0.2), {"w": True, "b": False})
  state = steps(masked, 1)
  assert float(date_optax.current_learning_rate(state)) == pytest.approx(0.2)
  assert date_optax.trust_ratio_bounds(optax.sgd(0.1).init(PARAMS)) is None
  assert date_optax.current_learning_rate(optax.sgd(0.1).init(PARAMS)) is None
