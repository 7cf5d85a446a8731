"""Layer-wise adaptive transforms against the NumPy references and optax."""

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference as ref
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st
from trees import assert_close, grads_at, keyed, make_params, run, run_ref

import date_optax

jax.config.update("jax_default_matmul_precision", "highest")


def flat(tree):
  return {k: np.asarray(v).astype(np.float64) for k, v in keyed(tree).items()}


def strip_bounds(state):
  has = lambda x: hasattr(x, "bounds") and hasattr(x, "_replace")
  return jax.tree.map(lambda x: x._replace(bounds=None) if has(x) else x,
                      state, is_leaf=has)


# --------------------------------------------------------------------------
# Against the NumPy references (docs/algorithms.md).


@pytest.mark.parametrize("wd", [0.0, 1e-2])
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("denominator", ["sum_of_norms", "norm_of_sum"])
def test_lars_matches_reference(wd, nesterov, denominator):
  params = make_params()
  opt = date_optax.lars(0.5, weight_decay=wd, momentum=0.8, nesterov=nesterov,
                        trust_coefficient=0.02, eps=1e-9, denominator=denominator)
  got, _ = run(opt, params)
  want = run_ref(ref.Lars(0.5, wd=wd, beta=0.8, c=0.02, eps=1e-9,
                          nesterov=nesterov,
                          sum_of_norms=denominator == "sum_of_norms"), params)
  assert_close(got, want)


def test_lars_sum_of_norms_differs_from_norm_of_sum():
  # Guards the test above against both modes silently computing one thing.
  params = make_params()
  a, _ = run(date_optax.lars(0.5, weight_decay=0.1, trust_coefficient=0.02), params)
  b, _ = run(date_optax.lars(0.5, weight_decay=0.1, trust_coefficient=0.02,
                             denominator="norm_of_sum"), params)
  assert not np.allclose(flat(a)["['conv']"], flat(b)["['conv']"])


def test_lars_skip_list_semantics():
  params = make_params()
  mask = date_optax.exclude_bias_and_norm(params)
  opt = date_optax.lars(0.3, weight_decay=0.05, trust_coefficient=0.01,
                        trust_ratio_mask=date_optax.exclude_bias_and_norm)
  got, state = run(opt, params)
  fm = {jax.tree_util.keystr(k): v
        for k, v in jax.tree_util.tree_flatten_with_path(mask)[0]}
  want = run_ref(ref.Lars(0.3, wd=0.05, c=0.01, trust=fm), params)
  assert_close(got, want)
  ratios = date_optax.trust_ratios(state)
  assert float(ratios["dense"]["bias"]) == 1.0 and float(ratios["scale"]) == 1.0
  assert float(ratios["conv"]) != 1.0


def test_lars_separate_masks():
  params = make_params()
  trust = {"dense": {"kernel": True, "bias": False}, "conv": True, "scale": False}
  decay = {"dense": {"kernel": True, "bias": True}, "conv": False, "scale": True}
  opt = date_optax.lars(0.3, weight_decay=0.05, trust_coefficient=0.01,
                        trust_ratio_mask=trust, weight_decay_mask=decay)
  got, _ = run(opt, params)
  fl = lambda m: {jax.tree_util.keystr(k): v for k, v in
                  jax.tree_util.tree_flatten_with_path(m)[0]}
  want = run_ref(ref.Lars(0.3, wd=0.05, c=0.01, trust=fl(trust), decay=fl(decay)),
                 params)
  assert_close(got, want)


@pytest.mark.parametrize(
    "kw",
    [dict(), dict(weight_decay=0.01), dict(bias_correction=False),
     dict(normalize_grads=True), dict(lower=0.5, upper=2.0),
     dict(weight_decay=0.01, b1=0.8, b2=0.95, eps=1e-4)],
    ids=["default", "wd", "nobias", "nvlamb", "bounds", "wd-betas"],
)
def test_lamb_matches_reference(kw):
  params = make_params()
  got, _ = run(date_optax.lamb(0.05, **kw), params)
  rk = dict(wd=kw.get("weight_decay", 0.0), b1=kw.get("b1", 0.9),
            b2=kw.get("b2", 0.999), eps=kw.get("eps", 1e-6),
            bias_correction=kw.get("bias_correction", True),
            normalize=kw.get("normalize_grads", False),
            lower=kw.get("lower"), upper=kw.get("upper"))
  assert_close(got, run_ref(ref.Lamb(0.05, **rk), params))


def test_lamb_nvlamb_normalisation_is_active():
  params = jax.tree.map(lambda p: 10 * p, make_params())
  a, _ = run(date_optax.lamb(0.05, normalize_grads=True, bias_correction=False,
                             b2=0.5), params)
  b, _ = run(date_optax.lamb(0.05, bias_correction=False, b2=0.5), params)
  assert not np.allclose(flat(a)["['conv']"], flat(b)["['conv']"])


def test_lamb_trust_mask_defaults_to_weight_decay_mask():
  params = make_params()
  mask = date_optax.exclude_bias_and_norm
  _, state = run(date_optax.lamb(0.05, weight_decay=0.01, weight_decay_mask=mask), params)
  ratios = date_optax.trust_ratios(state)
  assert float(ratios["dense"]["bias"]) == 1.0
  assert float(ratios["dense"]["kernel"]) != 1.0
  got, _ = run(date_optax.lamb(0.05, weight_decay=0.01, weight_decay_mask=mask), params)
  fm = {jax.tree_util.keystr(k): v
        for k, v in jax.tree_util.tree_flatten_with_path(mask(params))[0]}
  want = run_ref(ref.Lamb(0.05, wd=0.01, decay=fm), params)
  assert_close(got, want)


@pytest.mark.parametrize("base", ["sgd", "momentum", "nesterov", "adagrad",
                                  "rmsprop", "adam"])
@pytest.mark.parametrize("source", ["gradient", "update"])
def test_bounded_lars_matches_reference(base, source):
  params = make_params()
  opts = {"momentum": 0.7} if base in ("momentum", "nesterov") else None
  opt = date_optax.bounded_lars(0.05, base=base, lower=0.05, upper=3.0,
                                ratio_source=source, base_options=opts)
  got, _ = run(opt, params)
  want = run_ref(ref.BoundedLars(0.05, base, lower=0.05, upper=3.0,
                                 source=source, beta=0.7), params)
  assert_close(got, want, rtol=5e-5)


@given(
    w=st.lists(st.floats(-10, 10, width=32), min_size=1, max_size=6),
    g=st.lists(st.floats(-10, 10, width=32), min_size=1, max_size=6),
    lower=st.floats(0.0, 2.0), width=st.floats(0.0, 20.0),
    lr=st.floats(1e-4, 1.0),
)
def test_bounded_lars_sgd_contract(w, g, lower, width, lr):
  """-lr * clip(‖w‖/‖g‖, lower, upper) * g, ratio clip(1) on a zero norm."""
  n = min(len(w), len(g))
  w = np.array(w[:n], np.float32)
  g = np.array(g[:n], np.float32)
  upper = lower + width + 1e-3
  opt = date_optax.bounded_lars(lr, base="sgd", lower=lower, upper=upper)
  params = {"w": jnp.asarray(w)}
  upd, _ = opt.update({"w": jnp.asarray(g)}, opt.init(params), params)
  wn, gn = np.linalg.norm(w.astype(np.float64)), np.linalg.norm(g.astype(np.float64))
  r = 1.0 if wn == 0 or gn == 0 else wn / gn
  want = -lr * np.clip(r, lower, upper) * g
  np.testing.assert_allclose(np.asarray(upd["w"]), want, rtol=1e-5, atol=1e-6)
  assert np.all(np.isfinite(np.asarray(upd["w"])))


def test_bounded_lars_scales_output_not_input_for_adam():
  # Pre-scaling Adam's input would be cancelled by its normalisation: the
  # ratio must change the step size. Compare bounds [2, 2] with [1, 1].
  params = make_params()
  a, _ = run(date_optax.bounded_lars(0.01, base="adam", lower=2.0, upper=2.0), params, 1)
  b, _ = run(date_optax.bounded_lars(0.01, base="adam", lower=1.0, upper=1.0), params, 1)
  p0 = flat(params)
  da = flat(a)["['conv']"] - p0["['conv']"]
  db = flat(b)["['conv']"] - p0["['conv']"]
  np.testing.assert_allclose(da, 2 * db, rtol=1e-5, atol=1e-7)


def test_bounded_lars_weight_decay_outside_ratio():
  params = make_params()
  opt = date_optax.bounded_lars(0.1, base="sgd", lower=0.0, upper=100.0,
                                weight_decay=0.1)
  upd, _ = opt.update(grads_at(params, 0), opt.init(params), params)
  w = np.asarray(params["conv"], np.float64)
  g = np.asarray(grads_at(params, 0)["conv"], np.float64)
  r = ref.ratio(ref.norm(w), ref.norm(g), lower=0.0, upper=100.0)
  np.testing.assert_allclose(np.asarray(upd["conv"]), -0.1 * r * (g + 0.1 * w),
                             rtol=1e-5, atol=1e-7)


def test_bounded_lars_custom_base_transformation():
  params = make_params()
  mine = date_optax.bounded_lars(0.05, base=optax.scale_by_adam(), lower=0.05,
                                 upper=3.0)
  named = date_optax.bounded_lars(0.05, base="adam", lower=0.05, upper=3.0)
  a, _ = run(mine, params)
  b, _ = run(named, params)
  chex.assert_trees_all_close(a, b, rtol=1e-6)


def test_bound_schedules():
  params = make_params()
  lower = optax.linear_schedule(0.0, 1.0, 3)
  opt = date_optax.scale_by_trust_ratio(lower=lower, upper=5.0)
  state = opt.init(params)
  g = jax.tree.map(lambda p: 100.0 * jnp.ones_like(p), params)  # tiny ratios
  for t in range(4):
    _, state = opt.update(g, state, params)
    r = date_optax.trust_ratios(state)
    w = np.asarray(params["conv"], np.float64)
    raw = ref.norm(w) / ref.norm(np.asarray(g["conv"]))
    np.testing.assert_allclose(float(r["conv"]), max(raw, min(t / 3, 1.0)),
                               rtol=1e-5)


# --------------------------------------------------------------------------
# Equal to optax where docs/algorithms.md says so; fused equals the chain.


@pytest.mark.parametrize("kw", [dict(), dict(nesterov=True, momentum=0.5),
                                dict(trust_coefficient=0.05, eps=1e-3),
                                dict(trust_ratio_mask=date_optax.exclude_bias_and_norm)])
def test_lars_equals_optax_without_weight_decay(kw):
  params = make_params()
  a, _ = run(date_optax.lars(0.2, **kw), params)
  b, _ = run(optax.lars(0.2, **kw), params)
  chex.assert_trees_all_close(a, b, rtol=1e-6, atol=1e-7)


def test_lars_norm_of_sum_equals_optax_with_weight_decay():
  params = make_params()
  a, _ = run(date_optax.lars(0.2, weight_decay=0.1, denominator="norm_of_sum",
                             trust_coefficient=0.01), params)
  b, _ = run(optax.lars(0.2, weight_decay=0.1, trust_coefficient=0.01), params)
  chex.assert_trees_all_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kw", [dict(), dict(weight_decay=0.05),
                                dict(weight_decay=0.05, mask=lambda p: jax.tree.map(
                                    lambda x: x.ndim > 1, p))])
def test_lamb_equals_optax(kw):
  params = make_params()
  # optax.lamb's `mask` is the weight-decay mask.
  ours = {("weight_decay_mask" if k == "mask" else k): v for k, v in kw.items()}
  a, _ = run(date_optax.lamb(0.01, **ours), params, steps=5)
  if "mask" in kw:
    ours = dict(ours, trust_ratio_mask=True)  # optax.lamb ratios every layer
    a, _ = run(date_optax.lamb(0.01, **ours), params, steps=5)
  b, _ = run(optax.lamb(0.01, **kw), params, steps=5)
  chex.assert_trees_all_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("wd,denominator", [(0.0, "sum_of_norms"),
                                            (0.05, "sum_of_norms"),
                                            (0.05, "norm_of_sum")])
def test_fused_lars_equals_chain_of_primitives(wd, denominator):
  params = make_params()
  mask = date_optax.exclude_bias_and_norm
  fused = date_optax.lars(0.2, weight_decay=wd, trust_coefficient=0.01,
                          denominator=denominator, trust_ratio_mask=mask)
  chain = optax.chain(
      date_optax.scale_by_trust_ratio(0.01, weight_decay=wd,
                                      denominator=denominator, trust_ratio_mask=mask),
      optax.scale_by_learning_rate(0.2),
      optax.trace(0.9),
  )
  a, _ = run(fused, params)
  b, _ = run(chain, params)
  chex.assert_trees_all_close(a, b, rtol=1e-6, atol=1e-7)


def test_fused_lamb_equals_chain_of_primitives():
  params = make_params()
  fused = date_optax.lamb(0.01, weight_decay=0.05, lower=0.1, upper=3.0)
  chain = optax.chain(
      optax.scale_by_adam(eps=1e-6),
      optax.add_decayed_weights(0.05),
      date_optax.scale_by_trust_ratio(lower=0.1, upper=3.0),
      optax.scale_by_learning_rate(0.01),
  )
  a, sa = run(fused, params)
  b, sb = run(chain, params)
  chex.assert_trees_all_close(a, b, rtol=1e-6, atol=1e-7)
  chex.assert_trees_all_close(date_optax.trust_ratios(sa),
                              date_optax.trust_ratios(sb), rtol=1e-6)


# --------------------------------------------------------------------------
# scale_by_trust_ratio details.


def test_trust_ratio_source_gradient_with_inner():
  params = make_params()
  g = grads_at(params, 1)
  tx = date_optax.scale_by_trust_ratio(inner=optax.scale(3.0), ratio_source="gradient",
                                       lower=0.0, upper=1e9)
  out, state = tx.update(g, tx.init(params), params)
  w, gg = np.asarray(params["conv"]), np.asarray(g["conv"])
  r = ref.norm(w) / ref.norm(gg)
  np.testing.assert_allclose(np.asarray(out["conv"]), r * 3.0 * gg, rtol=1e-5)
  # With ratio_source='update' the factor 3 cancels.
  tx2 = date_optax.scale_by_trust_ratio(inner=optax.scale(3.0), ratio_source="update")
  out2, _ = tx2.update(g, tx2.init(params), params)
  np.testing.assert_allclose(np.asarray(out2["conv"]), r * gg, rtol=1e-5)


def test_stacked_layers_get_one_ratio_each():
  k = jax.random.split(jax.random.key(3), 2)
  stacked = jax.random.normal(k[0], (4, 6, 5)) * jnp.arange(1, 5)[:, None, None]
  g = jax.random.normal(k[1], (4, 6, 5))
  params = {"layers": {"kernel": stacked}, "head": jnp.ones((5, 2))}
  grads = {"layers": {"kernel": g}, "head": jnp.ones((5, 2)) * 0.5}
  tx = date_optax.scale_by_trust_ratio(
      layer_axes={"layers": {"kernel": 0}, "head": None})
  out, state = tx.update(grads, tx.init(params), params)
  ratios = date_optax.trust_ratios(state)
  assert ratios["layers"]["kernel"].shape == (4,)
  for i in range(4):
    r = ref.norm(stacked[i]) / ref.norm(g[i])
    np.testing.assert_allclose(float(ratios["layers"]["kernel"][i]), r, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(out["layers"]["kernel"][i]),
                               r * np.asarray(g[i]), rtol=1e-5)
  # Same through lamb and lars with a callable spec.
  spec = lambda p: {"layers": {"kernel": (0,)}, "head": None}
  for opt in (date_optax.lamb(0.1, layer_axes=spec),
              date_optax.lars(0.1, layer_axes=spec)):
    st_ = opt.init(params)
    _, st_ = opt.update(grads, st_, params)
    assert date_optax.trust_ratios(st_)["layers"]["kernel"].shape == (4,)


def test_stacked_lamb_equals_unstacked():
  k = jax.random.split(jax.random.key(5), 3)
  layers = [jax.random.normal(k[i], (3, 4)) * (i + 1) for i in range(3)]
  stacked = {"k": jnp.stack(layers)}
  separate = {f"k{i}": layer for i, layer in enumerate(layers)}
  opt_s = date_optax.lamb(0.1, weight_decay=0.01, layer_axes=0)
  opt_u = date_optax.lamb(0.1, weight_decay=0.01)
  a, _ = run(opt_s, stacked)
  b, _ = run(opt_u, separate)
  for i in range(3):
    np.testing.assert_allclose(np.asarray(a["k"][i]), np.asarray(b[f"k{i}"]),
                               rtol=1e-6, atol=1e-7)


def test_layer_axes_out_of_range():
  params = {"w": jnp.ones((2, 3))}
  tx = date_optax.scale_by_trust_ratio(layer_axes=2)
  with pytest.raises(ValueError, match="layer_axes"):
    tx.init(params)


# --------------------------------------------------------------------------
# Zero norms, empty trees, dtypes.

ALL_OPTS = {
    "lars": lambda: date_optax.lars(0.1, weight_decay=1e-4),
    "lamb": lambda: date_optax.lamb(1e-2, weight_decay=1e-2),
    "bounded_lars_momentum": lambda: date_optax.bounded_lars(0.1),
    "bounded_lars_adam": lambda: date_optax.bounded_lars(1e-2, base="adam"),
    "trust_ratio": lambda: optax.chain(date_optax.scale_by_trust_ratio(
        0.1, lower=0.0, upper=10.0), optax.sgd(0.1)),
}


@pytest.mark.parametrize("name", list(ALL_OPTS))
def test_zero_params_and_zero_grads_never_nan(name):
  opt = ALL_OPTS[name]()
  params = {"zero": jnp.zeros((3, 4)), "w": jnp.ones((4,)),
            "both": jnp.zeros((2,))}
  grads = {"zero": jnp.ones((3, 4)), "w": jnp.zeros((4,)), "both": jnp.zeros((2,))}
  state = opt.init(params)
  for _ in range(3):
    upd, state = jax.jit(opt.update)(grads, state, params)
    params = optax.apply_updates(params, upd)
    # The recorded upper bound of an unbounded optimizer is +inf by design.
    for leaf in jax.tree.leaves((params, strip_bounds(state))):
      if jnp.issubdtype(leaf.dtype, jnp.floating):
        assert np.all(np.isfinite(np.asarray(leaf))), name
  # Zero-gradient layers with zero weight decay stay put; the all-zero layer
  # moves off zero (ratio 1) instead of staying stuck or becoming NaN.
  assert float(jnp.abs(params["zero"]).sum()) > 0


@pytest.mark.parametrize("name", list(ALL_OPTS))
def test_empty_tree(name):
  opt = ALL_OPTS[name]()
  state = opt.init({})
  upd, state = opt.update({}, state, {})
  assert upd == {}


@pytest.mark.parametrize("name", list(ALL_OPTS))
def test_bf16_params_keep_dtype(name):
  opt = ALL_OPTS[name]()
  params = make_params(dtype=jnp.bfloat16)
  p32 = jax.tree.map(lambda p: p.astype(jnp.float32), params)
  got, state = run(opt, params, steps=3)
  want, _ = run(ALL_OPTS[name](), p32, steps=3)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert a.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b), rtol=0.05,
                               atol=0.05)
  r = date_optax.trust_ratios(state)
  if r is not None:
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(r))


def test_norms_accumulate_in_float32():
  # A bf16 sum of 2**16 ones saturates; a float32 sum does not.
  n = 2**16
  params = {"w": jnp.ones((n,), jnp.bfloat16)}
  grads = {"w": jnp.full((n,), 0.5, jnp.bfloat16)}
  tx = date_optax.scale_by_trust_ratio()
  _, state = tx.update(grads, tx.init(params), params)
  np.testing.assert_allclose(float(date_optax.trust_ratios(state)["w"]), 2.0,
                             rtol=1e-3)


def test_nan_gradients_are_skipped_with_apply_if_finite():
  params = make_params()
  opt = optax.apply_if_finite(date_optax.lamb(0.1), max_consecutive_errors=5)
  state = opt.init(params)
  bad = jax.tree.map(lambda p: jnp.full_like(p, jnp.nan), params)
  upd, state = opt.update(bad, state, params)
  new = optax.apply_updates(params, upd)
  chex.assert_trees_all_equal(new, params)


# --------------------------------------------------------------------------
# The optax battery: jit, inject_hyperparams, MultiSteps, retracing,
# ShapeDtypeStruct, sharding, convergence.


@pytest.mark.parametrize("name", list(ALL_OPTS))
def test_jit_equals_eager(name):
  params = make_params()
  a, _ = run(ALL_OPTS[name](), params, jit=True)
  b, _ = run(ALL_OPTS[name](), params, jit=False)
  chex.assert_trees_all_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("factory,kw", [
    (date_optax.lars, dict(learning_rate=0.1, weight_decay=1e-3, momentum=0.9)),
    (date_optax.lamb, dict(learning_rate=0.01, weight_decay=1e-3, b1=0.9)),
    (date_optax.bounded_lars, dict(learning_rate=0.1, lower=0.01, upper=1.0)),
])
def test_inject_hyperparams(factory, kw):
  params = make_params()
  injected = optax.inject_hyperparams(factory)(**kw)
  a, state = run(injected, params)
  b, _ = run(factory(**kw), params)
  chex.assert_trees_all_close(a, b, rtol=1e-6, atol=1e-7)
  # The learning rate is state: set to 0 on a fresh state, the step is 0.
  state = injected.init(params)
  state.hyperparams["learning_rate"] = jnp.asarray(0.0)
  upd, _ = jax.jit(injected.update)(grads_at(params, 0), state, params)
  assert all(float(jnp.abs(u).max()) == 0.0 for u in jax.tree.leaves(upd))


@pytest.mark.parametrize("name", ["lars", "lamb", "bounded_lars_adam"])
def test_multisteps_accumulates(name):
  params = make_params()
  k = 3
  ms = optax.MultiSteps(ALL_OPTS[name](), every_k_schedule=k)
  state = ms.init(params)
  plain = ALL_OPTS[name]()
  pstate = plain.init(params)
  p_ms = p_plain = params
  for outer in range(2):
    gs = [grads_at(params, 3 * outer + i) for i in range(k)]
    for g in gs:
      upd, state = jax.jit(ms.update)(g, state, p_ms)
      p_ms = optax.apply_updates(p_ms, upd)
    mean = jax.tree.map(lambda *x: sum(x) / k, *gs)
    upd, pstate = plain.update(mean, pstate, p_plain)
    p_plain = optax.apply_updates(p_plain, upd)
  chex.assert_trees_all_close(p_ms, p_plain, rtol=1e-5, atol=1e-6)
  assert date_optax.trust_ratios(state) is not None


@pytest.mark.parametrize("name", list(ALL_OPTS))
def test_no_retracing(name):
  opt = ALL_OPTS[name]()
  traces = []

  @jax.jit
  def step(params, state, t):
    traces.append(1)
    upd, state = opt.update(grads_at(params, t), state, params)
    return optax.apply_updates(params, upd), state

  params = make_params()
  state = opt.init(params)
  for t in range(4):
    params, state = step(params, state, jnp.float32(t))
  assert len(traces) == 1


@pytest.mark.parametrize("name", list(ALL_OPTS))
def test_init_on_shape_dtype_struct(name):
  params = make_params()
  abstract = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
  opt = ALL_OPTS[name]()
  shapes = jax.eval_shape(opt.init, abstract)
  real = opt.init(params)
  chex.assert_trees_all_equal_shapes_and_dtypes(shapes, real)


@pytest.mark.parametrize("name", list(ALL_OPTS))
def test_state_sharding_type_stable(name):
  devices = np.array(jax.devices()[:8])
  assert devices.size == 8, "tests expect 8 emulated CPU devices"
  mesh = jax.sharding.Mesh(devices.reshape(4, 2), ("data", "model"))
  P = jax.sharding.PartitionSpec
  params = {"w": jnp.ones((8, 4)), "b": jnp.zeros((4,))}
  shardings = {"w": jax.sharding.NamedSharding(mesh, P("data", "model")),
               "b": jax.sharding.NamedSharding(mesh, P())}
  params = jax.device_put(params, shardings)
  opt = ALL_OPTS[name]()
  state = jax.jit(opt.init)(params)

  @jax.jit
  def step(params, state):
    upd, state = opt.update(jax.tree.map(lambda p: 0.1 * p + 0.01, params),
                            state, params)
    return optax.apply_updates(params, upd), state

  p1, s1 = step(params, state)
  p2, s2 = step(p1, s1)
  spec = lambda t: jax.tree.map(lambda x: (x.sharding, x.dtype, x.shape), t)
  assert spec(s1) == spec(s2)
  assert spec(p1) == spec(p2)
  assert spec(p2)["w"][0].spec == P("data", "model")


@pytest.mark.parametrize("name", list(ALL_OPTS))
def test_converges_on_quadratic(name):
  # f(w) = ½ Σ a_i (w_i - 1)^2 per layer; minimum at 1. The path from the
  # start never crosses 0: a trust ratio ‖w‖/‖u‖ shrinks the step near ‖w‖ = 0.
  a = {"x": jnp.linspace(0.5, 2.0, 8).reshape(2, 4), "y": jnp.array([1.0, 3.0])}
  loss = lambda p: sum(0.5 * jnp.sum(a[k] * (p[k] - 1.0) ** 2) for k in p)
  opt = {
      "lars": date_optax.lars(optax.cosine_decay_schedule(5.0, 300), momentum=0.5,
                              trust_coefficient=0.01),
      "lamb": date_optax.lamb(optax.cosine_decay_schedule(0.05, 300)),
      "bounded_lars_momentum": date_optax.bounded_lars(
          optax.cosine_decay_schedule(0.05, 300), lower=0.01, upper=1.0),
      "bounded_lars_adam": date_optax.bounded_lars(
          optax.cosine_decay_schedule(0.1, 300), base="adam", upper=1.0),
      "trust_ratio": optax.chain(date_optax.scale_by_trust_ratio(
          lower=0.0, upper=1.0), optax.sgd(optax.cosine_decay_schedule(0.5, 300))),
  }[name]
  params = {"x": jnp.full((2, 4), 3.0), "y": jnp.full((2,), 4.0)}
  state = opt.init(params)

  @jax.jit
  def step(p, s):
    upd, s = opt.update(jax.grad(loss)(p), s, p)
    return optax.apply_updates(p, upd), s

  start = float(loss(params))
  for _ in range(300):
    params, state = step(params, state)
  assert float(loss(params)) < 1e-3 * start, (name, float(loss(params)))


# --------------------------------------------------------------------------
# Masks on linen and nnx trees.


class _LinenNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(8)(x)
    x = nn.LayerNorm()(x)
    x = nn.BatchNorm(use_running_average=True)(x)
    return nn.Dense(2)(x)


class _NnxNet(nnx.Module):
  def __init__(self, rngs):
    self.fc1 = nnx.Linear(3, 8, rngs=rngs)
    self.norm = nnx.LayerNorm(8, rngs=rngs)
    self.fc2 = nnx.Linear(8, 2, rngs=rngs)

  def __call__(self, x):
    return self.fc2(self.norm(self.fc1(x)))


def _mask_by_name(mask):
  return {jax.tree_util.keystr(k): v
          for k, v in jax.tree_util.tree_flatten_with_path(mask)[0]}


def test_exclude_bias_and_norm_linen_frozendict_nnx():
  variables = _LinenNet().init(jax.random.key(0), jnp.ones((1, 3)))
  params = variables["params"]
  m = _mask_by_name(date_optax.exclude_bias_and_norm(params))
  assert m == {
      "['BatchNorm_0']['bias']": False, "['BatchNorm_0']['scale']": False,
      "['Dense_0']['bias']": False, "['Dense_0']['kernel']": True,
      "['Dense_1']['bias']": False, "['Dense_1']['kernel']": True,
      "['LayerNorm_0']['bias']": False, "['LayerNorm_0']['scale']": False,
  }
  from flax.core import freeze
  fm = date_optax.exclude_bias_and_norm(freeze(params))
  assert _mask_by_name(fm) == m

  model = _NnxNet(nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  nm = _mask_by_name(date_optax.exclude_bias_and_norm(state))
  kernels = {k: v for k, v in nm.items() if "kernel" in k}
  others = {k: v for k, v in nm.items() if "kernel" not in k}
  assert len(kernels) == 2 and all(kernels.values())
  assert len(others) == 4 and not any(others.values())


def test_stacked_scan_bias_excluded_by_name():
  params = {"layers": {"bias": jnp.zeros((4, 8)), "kernel": jnp.ones((4, 8, 8))}}
  m = date_optax.exclude_bias_and_norm(params)
  assert m == {"layers": {"bias": False, "kernel": True}}


@pytest.mark.parametrize("opt_name", ["lars", "lamb", "bounded"])
def test_optimizers_train_nnx_model_with_mask(opt_name):
  model = _NnxNet(nnx.Rngs(0))
  mask = date_optax.exclude_bias_and_norm
  tx = {
      "lars": date_optax.lars(0.5, weight_decay=1e-4, trust_ratio_mask=mask,
                              trust_coefficient=0.01),
      "lamb": date_optax.lamb(0.01, weight_decay=1e-4, weight_decay_mask=mask),
      "bounded": date_optax.bounded_lars(0.05, trust_ratio_mask=mask, upper=1.0),
  }[opt_name]
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  x = jax.random.normal(jax.random.key(1), (32, 3))
  y = jnp.stack([x[:, 0] - x[:, 1], x[:, 2]], axis=1)

  @nnx.jit
  def train_step(model, optimizer):
    loss_fn = lambda m: jnp.mean((m(x) - y) ** 2)
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  first = float(train_step(model, optimizer))
  for _ in range(60):
    last = float(train_step(model, optimizer))
  assert last < 0.5 * first, (opt_name, first, last)
  ratios = date_optax.trust_ratios(optimizer.opt_state)
  rm = _mask_by_name(ratios)
  assert all(float(v) == 1.0 for k, v in rm.items() if "bias" in k)


# --------------------------------------------------------------------------
# Bad input.

BAD = [
    (functools.partial(date_optax.lars, 0.1, momentum=1.0), ValueError, "momentum"),
    (functools.partial(date_optax.lars, 0.1, momentum=-0.1), ValueError, "momentum"),
    (functools.partial(date_optax.lars, 0.1, trust_coefficient=-1.0), ValueError,
     "trust_coefficient"),
    (functools.partial(date_optax.lars, 0.1, eps=-1e-3), ValueError, "eps"),
    (functools.partial(date_optax.lars, -0.1), ValueError, "learning_rate"),
    (functools.partial(date_optax.lars, float("nan")), ValueError, "learning_rate"),
    (functools.partial(date_optax.lars, 0.1, weight_decay=-1.0), ValueError,
     "weight_decay"),
    (functools.partial(date_optax.lars, 0.1, denominator="both"), ValueError,
     "denominator"),
    (functools.partial(date_optax.lars, 0.1, nesterov="yes"), TypeError, "nesterov"),
    (functools.partial(date_optax.lars, 0.1, lower=2.0, upper=1.0), ValueError,
     "lower"),
    (functools.partial(date_optax.bounded_lars, 0.1, base="lion"), ValueError, "base"),
    (functools.partial(date_optax.bounded_lars, 0.1, base=3), TypeError, "base"),
    (functools.partial(date_optax.bounded_lars, 0.1, lower=5.0, upper=1.0),
     ValueError, "lower"),
    (functools.partial(date_optax.bounded_lars, 0.1, lower=-1.0), ValueError, "lower"),
    (functools.partial(date_optax.bounded_lars, 0.1, upper=0.0), ValueError, "upper"),
    (functools.partial(date_optax.bounded_lars, 0.1, base_options={"momentum": 1.5}),
     ValueError, "momentum"),
    (functools.partial(date_optax.bounded_lars, 0.1, base="adam",
                       base_options={"b2": 1.0}), ValueError, "b2"),
    (functools.partial(date_optax.bounded_lars, 0.1, ratio_source="weights"),
     ValueError, "ratio_source"),
    (functools.partial(date_optax.lamb, 0.1, b1=1.0), ValueError, "b1"),
    (functools.partial(date_optax.lamb, 0.1, eps=-1.0), ValueError, "eps"),
    (functools.partial(date_optax.lamb, 0.1, lower=3.0, upper=2.0), ValueError,
     "lower"),
    (functools.partial(date_optax.lamb, "0.1"), TypeError, "learning_rate"),
    (functools.partial(date_optax.scale_by_trust_ratio, source="weights"),
     ValueError, "source"),
    (functools.partial(date_optax.scale_by_trust_ratio, inner="adam"), TypeError,
     "inner"),
    (functools.partial(date_optax.scale_by_trust_ratio, mask=3), TypeError, "mask"),
    (functools.partial(date_optax.scale_by_trust_ratio, -1.0), ValueError,
     "trust_coefficient"),
]


@pytest.mark.parametrize("fn,exc,name", BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_input_raises_at_construction(fn, exc, name):
  with pytest.raises(exc, match=name):
    fn()


def test_update_without_params_raises():
  opt = date_optax.lamb(0.1)
  params = make_params()
  with pytest.raises(ValueError, match="params"):
    opt.update(params, opt.init(params))


# --------------------------------------------------------------------------
# Small leaves of one shape are reduced together (one stacked reduction per
# shape); the ratios must still be each layer's own.


def repeated_params():
  """Three blocks of same-shaped small leaves, a zero bias, a bf16 twin, two large leaves."""
  k = iter(jax.random.split(jax.random.key(3), 12))
  blocks = {f"block{i}": {"kernel": jax.random.normal(next(k), (4, 3)) * (i + 1),
                          "bias": 0.1 * jax.random.normal(next(k), (3,))}
            for i in range(3)}
  return {**blocks, "zero_bias": jnp.zeros((3,)),
          "bf16_kernel": jax.random.normal(next(k), (4, 3)).astype(jnp.bfloat16),
          "large": 0.1 * jax.random.normal(next(k), (130, 130)),
          "large2": 0.3 * jax.random.normal(next(k), (140, 130))}


def by_path(tree):
  return {jax.tree_util.keystr(k): v for k, v in
          jax.tree_util.tree_flatten_with_path(tree)[0]}


REPEATED_TRUST = {**{f"block{i}": {"kernel": True, "bias": i != 1} for i in range(3)},
                  "zero_bias": True, "bf16_kernel": True, "large": True, "large2": True}
REPEATED_DECAY = {**{f"block{i}": {"kernel": i != 2, "bias": False} for i in range(3)},
                  "zero_bias": True, "bf16_kernel": True, "large": True, "large2": False}


@pytest.mark.parametrize("denominator", ["sum_of_norms", "norm_of_sum"])
def test_lars_on_repeated_small_leaves_matches_reference(denominator):
  params = repeated_params()
  opt = date_optax.lars(0.3, weight_decay=0.05, trust_coefficient=0.01,
                        denominator=denominator, trust_ratio_mask=REPEATED_TRUST,
                        weight_decay_mask=REPEATED_DECAY)
  got, state = run(opt, params)
  want = run_ref(ref.Lars(0.3, wd=0.05, c=0.01, trust=by_path(REPEATED_TRUST),
                          decay=by_path(REPEATED_DECAY),
                          sum_of_norms=denominator == "sum_of_norms"), params)
  # Parameters of size up to 3 after 4 steps: a few float32 roundings.
  assert_close({k: v for k, v in got.items() if k != "bf16_kernel"},
               {k: v for k, v in want.items() if "bf16" not in k}, atol=1e-5)
  np.testing.assert_allclose(np.asarray(got["bf16_kernel"], np.float64),
                             want["['bf16_kernel']"], rtol=2e-2, atol=1e-2)
  ratios = date_optax.trust_ratios(state)
  assert float(ratios["block1"]["bias"]) == 1.0  # outside the trust mask
  # Same-shaped layers reduced together keep their own ratios.
  kernels = [float(ratios[f"block{i}"]["kernel"]) for i in range(3)]
  assert len(set(kernels)) == 3
  # A zero layer in a group gets ratio 1 at the first step, its neighbours not.
  first = date_optax.trust_ratios(run(opt, params, steps=1)[1])
  assert float(first["zero_bias"]) == 1.0 and float(first["block0"]["bias"]) != 1.0


@pytest.mark.parametrize("decoupled,nvlamb", [(False, False), (True, False), (False, True)])
def test_lamb_on_repeated_small_leaves_matches_reference(decoupled, nvlamb):
  # The two large layers' directions are made one after the other (the
  # second waits for the first's ratio); the small ones are grouped.
  params = {k: v for k, v in repeated_params().items() if k != "bf16_kernel"}
  trust = {k: v for k, v in REPEATED_TRUST.items() if k != "bf16_kernel"}
  decay = {k: v for k, v in REPEATED_DECAY.items() if k != "bf16_kernel"}
  opt = date_optax.lamb(0.05, weight_decay=0.01, decoupled_weight_decay=decoupled,
                        trust_ratio_mask=trust, weight_decay_mask=decay,
                        lower=0.0, upper=5.0, normalize_grads=nvlamb)
  got, _ = run(opt, params)
  want = run_ref(ref.Lamb(0.05, wd=0.01, trust=by_path(trust), decay=by_path(decay),
                          decoupled=decoupled, lower=0.0, upper=5.0, normalize=nvlamb),
                 params)
  assert_close(got, want, atol=1e-5)


@pytest.mark.parametrize("source", ["gradient", "update"])
def test_bounded_lars_on_repeated_small_leaves_matches_reference(source):
  params = {k: v for k, v in repeated_params().items() if k != "bf16_kernel"}
  opt = date_optax.bounded_lars(0.05, base="adam", lower=0.05, upper=3.0,
                                ratio_source=source, weight_decay=1e-3)
  got, _ = run(opt, params)
  want = run_ref(ref.BoundedLars(0.05, "adam", lower=0.05, upper=3.0,
                                 source=source, wd=1e-3), params)
  assert_close(got, want, rtol=5e-5, atol=1e-5)


def test_grouped_scalars_and_empty_leaves_keep_their_own_ratios():
  # Scalars and empty leaves group too: c‖w‖/(‖g‖ + λ‖w‖) per leaf, 1 when empty.
  params = {"a": np.ones(3, np.float32), "b": np.full(3, 2.0, np.float32),
            "s": np.float32(3.0), "t": np.float32(4.0),
            "e": np.zeros(0, np.float32), "e2": np.zeros(0, np.float32)}
  grads = {k: np.full(np.shape(v), 0.5, np.float32) for k, v in params.items()}
  tx = date_optax.scale_by_trust_ratio(weight_decay=0.1)
  updates, state = jax.jit(tx.update)(grads, tx.init(params), params)
  ratios = date_optax.trust_ratios(state)
  want = {"a": 1 / 0.6, "b": 2 / 0.7, "s": 3 / 0.8, "t": 4 / 0.9, "e": 1.0, "e2": 1.0}
  for k, r in want.items():
    np.testing.assert_allclose(float(ratios[k]), r, rtol=1e-6, err_msg=k)
  np.testing.assert_allclose(np.asarray(updates["s"]), 3.75 * (0.5 + 0.1 * 3.0), rtol=1e-6)
  assert updates["e"].shape == (0,)
