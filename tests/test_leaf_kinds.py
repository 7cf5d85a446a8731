"""Every leaf a user's pytree can hold, given to every public optimizer and
transform, on `init` and on `update` (issue 58, item 7).

Each leaf kind is either taken, and then the update is what optax computes
(`optax.lars`/`optax.lamb`/`optax.sgd` on the same tree with its leaves as
JAX arrays; optax itself fails on a Python float there) or, for the
transforms without an optax twin, what the transform computes on that
array tree; or it is refused by one TypeError that names the leaf's path,
what the leaf is, the public function and what it needs.

Taken: floating-point and complex arrays (JAX or NumPy, empty ones too),
NumPy float scalars, Python floats and complex numbers, and None (an empty
subtree, as in optax). Refused by the trust-ratio optimizers: integer and
boolean arrays and scalars (a trust ratio of integers is meaningless, and
`optax.apply_updates` would round the update back to the integer), typed
PRNG keys, strings and other objects. `adascale` passes every numeric leaf
to the optimizer it wraps (optax.sgd takes integers) and refuses the rest.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import date_optax

BASELINE = date_optax.Baseline(batch_size=32, learning_rate=0.1, epochs=2,
                               num_examples=1024, warmup_epochs=0.5)
STATS = date_optax.GradStats(sq_norm=1.0, trace_cov=64.0, batch_size=256.0)

# The optimizers: (build, reference, what each needs). The reference maps
# (params as JAX arrays, gradients as JAX arrays, the raw trees) to the
# updates of two steps; None: the optimizer itself on the array trees.
OPTIMIZERS = {
    "lars": (lambda: date_optax.lars(0.1, weight_decay=1e-3, denominator="norm_of_sum"),
             lambda: optax.lars(0.1, weight_decay=1e-3), "float"),
    "lamb": (lambda: date_optax.lamb(1e-2, weight_decay=1e-3),
             lambda: optax.lamb(1e-2, weight_decay=1e-3), "float"),
    "bounded_lars": (lambda: date_optax.bounded_lars(0.1, base="adam"), None, "float"),
    "bounded_lars momentum": (
        lambda: date_optax.bounded_lars(0.1, weight_decay=1e-3,
                                        trust_ratio_mask=date_optax.exclude_bias_and_norm),
        None, "float"),
    "scale_by_trust_ratio": (
        lambda: date_optax.scale_by_trust_ratio(lower=0.01, upper=10.0, weight_decay=1e-3),
        None, "float"),
    "date": (lambda: date_optax.date(BASELINE, 64), None, "float"),
    "adascale": (lambda: date_optax.adascale(optax.sgd(0.1, momentum=0.9), 4.0),
                 lambda: optax.sgd(0.1 * 1.6, momentum=0.9), "number"),
}
NAMES = {"lars": "date_optax.lars", "lamb": "date_optax.lamb",
         "bounded_lars": "date_optax.bounded_lars",
         "bounded_lars momentum": "date_optax.bounded_lars",
         "scale_by_trust_ratio": "date_optax.scale_by_trust_ratio",
         "date": "date_optax.date", "adascale": "date_optax.adascale"}

# Leaves every optimizer takes (arrays of one shape, so that the eager steps
# compile few kernels).
TAKEN = {
    "Python float": 1.5,
    "Python complex": 1.5 - 0.5j,
    "NumPy float32 scalar": np.float32(-0.75),
    "NumPy float64 scalar": np.float64(2.0),
    "float32 array": jnp.asarray([0.5, -1.0]),
    "float64 NumPy array": np.asarray([2.0, 0.25]),
    "complex64 array": jnp.asarray([1 + 1j, 2 - 1j]),
    "empty array": jnp.zeros((0,)),
    "empty NumPy array": np.zeros((0,), np.float64),
    "None": None,
}
# Leaves the trust-ratio optimizers refuse; adascale takes the numeric ones.
REFUSED = {
    "Python int": 2,
    "Python bool": True,
    "NumPy int32 scalar": np.int32(3),
    "NumPy bool scalar": np.bool_(True),
    "int32 array": np.arange(2, dtype=np.int32),
    "uint8 array": jnp.arange(2, dtype=jnp.uint8),
    "bool array": np.asarray([True, False]),
    "empty int32 array": np.zeros((0,), np.int32),
    "PRNG key": jax.random.key(0),
    "string": "kernel",
    "object": object(),
}
NOT_NUMBERS = ("PRNG key", "string", "object")
# How the error describes each refused leaf.
DESCRIBED = {
    "Python int": "Python int 2", "Python bool": "Python bool True",
    "NumPy int32 scalar": "NumPy int32 scalar 3", "NumPy bool scalar": "NumPy bool scalar True",
    "int32 array": "int32 array of shape (2,)", "uint8 array": "uint8 array of shape (2,)",
    "bool array": "bool array of shape (2,)", "empty int32 array": "int32 array of shape (0,)",
    "PRNG key": "key<fry> array of shape ()", "string": "str 'kernel'",
    "object": "object <object object at",
}


def _extra(name):
  return {"grad_stats": STATS} if name == "adascale" else {}


def _grad(x, step):
  """A gradient leaf of the same kind as the parameter `x` (None for None)."""
  if x is None:
    return None
  if isinstance(x, (bool, int)):
    return type(x)(step % 2 == 0) if isinstance(x, bool) else x + step + 1
  if isinstance(x, (float, complex)):
    return x * 0.5 - 0.25 * (step + 1)
  if isinstance(x, np.generic):
    return type(x)(x * 0.5 + (0 if x.dtype == bool else step + 1))
  if not hasattr(x, "dtype") or jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    return 0.0
  if x.dtype == bool:
    return np.logical_not(x)
  return (x * 0.5 - 0.25 * (step + 1)).astype(x.dtype)


def _arrays(tree):
  return jax.tree.map(jnp.asarray, tree)


def _updates(opt, params, extra, steps=2):
  state = opt.init(params)
  out = []
  for step in range(steps):
    grads = jax.tree.map(lambda x, s=step: _grad(x, s), params)
    updates, state = opt.update(grads, state, params, **extra)
    out.append(updates)
  return out


def _reference(name, params):
  """Two steps of the reference on `params`: optax's twin on the leaves as
  JAX arrays (gradients made from the raw leaves, then as arrays), or the
  optimizer itself on those array trees."""
  build, twin, _ = OPTIMIZERS[name]
  opt = (twin or build)()
  state = opt.init(_arrays(params))
  out = []
  for step in range(2):
    grads = _arrays(jax.tree.map(lambda x, s=step: _grad(x, s), params))
    extra = _extra(name) if twin is None else {}
    updates, state = opt.update(grads, state, _arrays(params), **extra)
    out.append(updates)
  return out


def _assert_matches(name, params, kinds):
  got = _updates(OPTIMIZERS[name][0](), params, _extra(name))
  want = _reference(name, params)
  for g, w in zip(got, want, strict=True):
    assert jax.tree.structure(g) == jax.tree.structure(params), name
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(g)[0], jax.tree.leaves(w),
                            strict=True):
      key = jax.tree_util.keystr(path)
      kind = kinds.get(key, key)
      assert isinstance(a, jax.Array), (name, kind, type(a))
      assert a.dtype == b.dtype, (name, kind, a.dtype, b.dtype)
      a64, b64 = (np.asarray(v, np.complex128 if np.iscomplexobj(v) else np.float64)
                  for v in (a, b))
      assert np.isfinite(a64).all(), (name, kind, a64)
      np.testing.assert_allclose(a64, b64, rtol=2e-5, atol=1e-7, err_msg=f"{name}: {kind}")


def _refused_message(name, path, kind):
  need = "numeric leaves" if OPTIMIZERS[name][2] == "number" else "floating-point"
  return [f"params{path}", NAMES[name], need, DESCRIBED[kind]]


def _is_refused(name, kind):
  return kind in (NOT_NUMBERS if OPTIMIZERS[name][2] == "number" else REFUSED)


# -- Every kind, named -------------------------------------------------------


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_taken_leaf_computes_what_optax_computes(name):
  """One tree with every taken kind (and, for adascale, the integers too):
  two updates, leaf by leaf equal to the reference's, JAX arrays of the
  dtype optax gives, None kept where the parameters hold None."""
  leaves = dict(TAKEN)
  if OPTIMIZERS[name][2] == "number":
    leaves.update({k: v for k, v in REFUSED.items() if k not in NOT_NUMBERS})
  params = {"kinds": {f"k{i}": v for i, v in enumerate(leaves.values())}}
  kinds = {f"['kinds']['k{i}']": k for i, k in enumerate(leaves)}
  _assert_matches(name, params, kinds)


@pytest.mark.parametrize("kind", sorted(REFUSED))
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_refused_leaf_is_named_on_init_and_update(name, kind):
  """init, and update with a state made from a float tree, raise one
  TypeError naming the path, the leaf, the optimizer and what it needs."""
  if not _is_refused(name, kind):
    pytest.skip(f"{NAMES[name]} takes a {kind} (its optax optimizer does)")
  leaf = REFUSED[kind]
  params = {"dense": {"kernel": jnp.ones(2), "odd": leaf}}
  opt = OPTIMIZERS[name][0]()
  words = _refused_message(name, "['dense']['odd']", kind)
  with pytest.raises(TypeError) as init_error:
    opt.init(params)
  for w in words:
    assert w in str(init_error.value), (w, str(init_error.value))
  floats = {"dense": {"kernel": jnp.ones(2), "odd": jnp.zeros(np.shape(leaf))
                      if hasattr(leaf, "shape") else 0.0}}
  state = opt.init(floats)
  grads = {"dense": {"kernel": jnp.ones(2), "odd": floats["dense"]["odd"]}}
  with pytest.raises(TypeError) as update_error:
    opt.update(grads, state, params, **_extra(name))
  for w in words:
    assert w in str(update_error.value), (w, str(update_error.value))
  # A gradient that is not a number is named as the update's leaf.
  if kind in NOT_NUMBERS:
    bad = {"dense": {"kernel": jnp.ones(2), "odd": leaf}}
    with pytest.raises(TypeError, match=r"updates\['dense'\]\['odd'\]"):
      opt.update(bad, state, floats, **_extra(name))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_gradient_of_none_where_a_parameter_is_an_array(name):
  """The trust-ratio optimizers name the path (optax.lars and optax.lamb
  fail there too, without naming it); adascale over optax.sgd gives what
  optax.sgd gives, no update for that leaf."""
  opt = OPTIMIZERS[name][0]()
  params = {"w": jnp.ones(2), "b": jnp.zeros(2)}
  grads = {"w": jnp.ones(2), "b": None}
  if OPTIMIZERS[name][2] == "float":
    with pytest.raises(ValueError, match=r"parameter\(s\) \['b'\] have no entry in updates"):
      opt.update(grads, opt.init(params), params, **_extra(name))
    return
  got, _ = opt.update(grads, opt.init(params), params, **_extra(name))
  twin = OPTIMIZERS[name][1]()
  want, _ = twin.update(grads, twin.init(params), params)
  assert got["b"] is None and want["b"] is None
  np.testing.assert_allclose(got["w"], want["w"], rtol=1e-6)


def test_integer_gradients_of_float_parameters_are_taken_as_optax_takes_them():
  params = {"w": jnp.asarray([1.0, 2.0])}
  for grads in ({"w": np.asarray([1, -2], np.int32)}, {"w": np.asarray([True, False])}):
    got, _ = date_optax.lars(0.1).update(grads, date_optax.lars(0.1).init(params), params)
    want, _ = optax.lars(0.1).update(grads, optax.lars(0.1).init(params), params)
    np.testing.assert_allclose(got["w"], want["w"], rtol=1e-6)
    assert got["w"].dtype == want["w"].dtype == jnp.float32


# -- The property -------------------------------------------------------------

KINDS = st.sampled_from(sorted(TAKEN) * 2 + sorted(REFUSED))
KEYS = st.sampled_from(["kernel", "bias", "scale", "embedding", "w"])
TREES = st.dictionaries(
    KEYS, st.one_of(KINDS, st.dictionaries(KEYS, KINDS, min_size=1, max_size=2)),
    min_size=1, max_size=3)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(tree=TREES)
def test_leaf_kinds_property(name, tree):
  """A drawn tree of leaf kinds: the updates are the reference's, or init
  raises one TypeError naming the first refused leaf in tree order."""
  params = jax.tree.map(lambda k: TAKEN.get(k, REFUSED.get(k)), tree,
                        is_leaf=lambda x: isinstance(x, str))
  kinds = {jax.tree_util.keystr(p): k for p, k in jax.tree_util.tree_flatten_with_path(tree)[0]}
  refused = [(p, k) for p, k in kinds.items() if k in REFUSED and _is_refused(name, k)]
  if not refused:
    _assert_matches(name, params, kinds)
    return
  path, kind = refused[0]
  with pytest.raises(TypeError) as error:
    OPTIMIZERS[name][0]().init(params)
  for w in _refused_message(name, path, kind):
    assert w in str(error.value), (w, str(error.value))
