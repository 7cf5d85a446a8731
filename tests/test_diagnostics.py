"""Tests for the curvature probe `date_optax.diagnostics.lipschitz_estimate`."""

from __future__ import annotations

import doctest
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from date_optax._src import diagnostics as diagnostics_src
from date_optax.diagnostics import lipschitz_estimate


def _quadratic(n1: int, n2: int, seed: int):
  """f(x) = ½ xᵀ A x + bᵀ x over a two-leaf pytree x = {'a': (n1,), 'b': (n2,)}."""
  rng = np.random.default_rng(seed)
  n = n1 + n2
  m = rng.normal(size=(n, n))
  a = (m @ m.T / n + np.diag(rng.uniform(0.1, 2.0, size=n))).astype(np.float32)
  b = rng.normal(size=n).astype(np.float32)
  x0 = rng.normal(size=n).astype(np.float32)

  def flat(p):
    return jnp.concatenate([p["a"], p["b"]])

  def loss(p, batch):
    del batch
    x = flat(p)
    return 0.5 * x @ jnp.asarray(a) @ x + jnp.asarray(b) @ x

  params = {"a": jnp.asarray(x0[:n1]), "b": jnp.asarray(x0[n1:])}
  return loss, params, a.astype(np.float64), b.astype(np.float64), x0


def _quadratic_loss(p, batch):
  """½ xᵀ A x + bᵀ x with A and b read from the batch."""
  x = jnp.concatenate([p["a"], p["b"]])
  return 0.5 * x @ batch["a"] @ x + batch["b"] @ x


_QUADRATIC_PROBE = jax.jit(functools.partial(lipschitz_estimate, _quadratic_loss))


def _reference_l(a: np.ndarray, g: np.ndarray) -> float:
  """L(x, g) = gᵀ A g / gᵀ g, from the definition, in float64."""
  return float(g @ a @ g / (g @ g))


@given(
    # A few fixed shapes keep JAX's per-shape compilation cache warm.
    shape=st.sampled_from([(1, 1), (2, 5), (6, 3)]),
    seed=st.integers(0, 2**16),
)
def test_quadratic_matches_exact_value_for_the_gradient_direction(shape, seed):
  _, params, a, b, x0 = _quadratic(*shape, seed)
  g = a @ x0.astype(np.float64) + b  # ∇f(x) = A x + b
  # A and b as the batch: one compiled probe per shape serves every example.
  got = _QUADRATIC_PROBE(params, {"a": jnp.asarray(a, jnp.float32),
                                  "b": jnp.asarray(b, jnp.float32)})
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(float(got), _reference_l(a, g), rtol=2e-3)


def test_quadratic_matches_exact_value_for_a_given_direction():
  loss, params, a, _, _ = _quadratic(3, 4, seed=1)
  rng = np.random.default_rng(7)
  d = rng.normal(size=7)
  # Scaling the direction must not change L (it is a Rayleigh quotient).
  for scale in (1e-3, 1.0, 1e3):
    direction = {"a": jnp.asarray(scale * d[:3], jnp.float32),
                 "b": jnp.asarray(scale * d[3:], jnp.float32)}
    got = lipschitz_estimate(loss, params, None, direction)
    np.testing.assert_allclose(float(got), _reference_l(a, d), rtol=2e-3)


def test_quadratic_eigenvector_gives_its_eigenvalue():
  # Along an eigenvector of A the estimate is exactly that eigenvalue: the
  # smallest and largest bound every other direction.
  loss, params, a, _, _ = _quadratic(2, 3, seed=3)
  w, v = np.linalg.eigh(a)
  for i in (0, len(w) - 1):
    d = {"a": jnp.asarray(v[:2, i], jnp.float32),
         "b": jnp.asarray(v[2:, i], jnp.float32)}
    got = lipschitz_estimate(loss, params, None, d)
    np.testing.assert_allclose(float(got), w[i], rtol=2e-3)


def _mlp():
  k1, k2, k3, k4 = jax.random.split(jax.random.key(0), 4)
  params = {
      "dense0": {"kernel": 0.5 * jax.random.normal(k1, (5, 8)), "bias": jnp.zeros(8)},
      "dense1": {"kernel": 0.5 * jax.random.normal(k2, (8, 3)), "bias": jnp.zeros(3)},
  }
  x = jax.random.normal(k3, (16, 5))
  y = jax.random.randint(k4, (16,), 0, 3)

  def loss(p, batch):
    xb, yb = batch
    h = jnp.tanh(xb @ p["dense0"]["kernel"] + p["dense0"]["bias"])
    logits = h @ p["dense1"]["kernel"] + p["dense1"]["bias"]
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, yb[:, None], axis=1))

  return loss, params, (x, y)


@functools.cache
def _rayleigh(loss):
  """gᵀ H g / ‖g‖² of `loss`, compiled once per loss."""

  @jax.jit
  def rayleigh(params, batch, g):
    grad = jax.grad(lambda p: loss(p, batch))
    _, hvp = jax.jvp(grad, (params,), (g,))
    num = sum(jnp.vdot(a, b)
              for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(hvp), strict=True))
    den = sum(jnp.vdot(a, a) for a in jax.tree.leaves(g))
    return num / den

  return rayleigh


def _exact_l(loss, params, batch, g):
  """gᵀ H g / ‖g‖² with the exact HVP: forward-over-reverse (jvp of grad)."""
  return float(_rayleigh(loss)(params, batch, g))


def test_nonlinear_model_matches_exact_hvp():
  loss, params, batch = _mlp()
  probe = jax.jit(functools.partial(lipschitz_estimate, loss))
  g = jax.jit(jax.grad(loss))(params, batch)
  exact = _exact_l(loss, params, batch, g)
  got = float(probe(params, batch))
  np.testing.assert_allclose(got, exact, rtol=1e-2)
  # A random direction with a different scale, too.
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  d = treedef.unflatten(
      [3.0 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)])
  np.testing.assert_allclose(
      float(probe(params, batch, d)),
      _exact_l(loss, params, batch, d),
      rtol=1e-2,
  )


def test_truncation_error_is_second_order_in_h():
  # f(x) = Σ x⁴: the central difference of gradients along u has error
  # h²·Σ u⁴·(4) — halving h must cut the error about 4×.
  def loss(p, batch):
    del batch
    return jnp.sum(p["x"] ** 4)

  params = {"x": jnp.array([1.0, -2.0, 0.5])}
  g = 4 * np.array([1.0, -2.0, 0.5]) ** 3
  u = g / np.linalg.norm(g)
  exact = float(np.sum(12 * np.array([1.0, -2.0, 0.5]) ** 2 * u**2))
  err = [abs(float(lipschitz_estimate(loss, params, None, h=h,
                                      method="finite_difference")) - exact)
         for h in (0.1, 0.05)]
  assert err[0] > 1e-3
  np.testing.assert_allclose(err[0] / err[1], 4.0, rtol=0.1)


def test_jit_and_has_aux_and_bf16_params():
  loss, params, batch = _mlp()
  ref = float(lipschitz_estimate(loss, params, batch))
  jitted = jax.jit(functools.partial(lipschitz_estimate, loss))
  # jit fuses differently; float32 cancellation in the difference is ~1e-4.
  np.testing.assert_allclose(float(jitted(params, batch)), ref, rtol=1e-3)

  aux_loss = lambda p, b: (loss(p, b), {"unused": 1.0})
  np.testing.assert_allclose(
      float(lipschitz_estimate(aux_loss, params, batch, has_aux=True)), ref, rtol=1e-5
  )
  # bf16 parameters are probed in float32 at their (rounded) values.
  p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  p16_as_32 = jax.tree.map(lambda x: x.astype(jnp.float32), p16)
  got = lipschitz_estimate(loss, p16, batch)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(
      float(got), float(lipschitz_estimate(loss, p16_as_32, batch)), rtol=1e-5
  )


def test_zero_direction_is_nan_not_a_crash():
  loss, params, batch = _mlp()
  zeros = jax.tree.map(jnp.zeros_like, params)
  assert np.isnan(float(lipschitz_estimate(loss, params, batch, zeros)))


@pytest.mark.parametrize("h", [0.0, -1e-3, float("nan"), float("inf")])
def test_bad_h_raises_value_error(h):
  loss, params, batch = _mlp()
  with pytest.raises(ValueError, match="h"):
    lipschitz_estimate(loss, params, batch, h=h)


@pytest.mark.parametrize("h", ["1e-3", None, True])
def test_non_numeric_h_raises_type_error(h):
  loss, params, batch = _mlp()
  with pytest.raises(TypeError, match="h"):
    lipschitz_estimate(loss, params, batch, h=h)


def test_bad_loss_fn_and_direction_raise():
  _, params, batch = _mlp()
  with pytest.raises(TypeError, match="loss_fn"):
    lipschitz_estimate("not callable", params, batch)
  loss, params, batch = _mlp()
  with pytest.raises(ValueError, match="direction"):
    lipschitz_estimate(loss, params, batch, {"dense0": params["dense0"]})


def test_docstring_examples_run():
  result = doctest.testmod(diagnostics_src, optionflags=doctest.ELLIPSIS)
  assert result.attempted > 0 and result.failed == 0


def test_jvp_is_exact_where_the_finite_difference_is_not():
  # f(x) = Σ exp(3x): gᵀ∇²f g / ‖g‖² = Σ 9 e^{3x} u², analytic. The central
  # difference (the previous default) is off by ~1e-4 (float32 cancellation
  # over 2h); forward-over-reverse is exact to float32 rounding.
  def loss(p, batch):
    del batch
    return jnp.sum(jnp.exp(3.0 * p["x"]))

  x = np.array([0.3, -0.7, 0.1, 0.5], np.float32)
  params = {"x": jnp.asarray(x)}
  x64 = x.astype(np.float64)
  g = 3 * np.exp(3 * x64)
  u = g / np.linalg.norm(g)
  exact = float(np.sum(9 * np.exp(3 * x64) * u**2))
  np.testing.assert_allclose(float(lipschitz_estimate(loss, params, None)),
                             exact, rtol=2e-6)
  fd = float(lipschitz_estimate(loss, params, None, method="finite_difference"))
  assert abs(fd - exact) / exact > 2e-6
  with pytest.raises(ValueError, match="method"):
    lipschitz_estimate(loss, params, None, method="newton")
