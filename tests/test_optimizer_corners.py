"""Issue 11: exact numerics in every corner, one masking rule, peer options.

Each test here failed on the code before the fix it covers.
"""

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference as ref
from flax import nnx
from trees import assert_close, grads_at, keyed, make_params, run, run_ref

import date_optax
from date_optax._src import lars as lars_lib

jax.config.update("jax_default_matmul_precision", "highest")


# --------------------------------------------------------------------------
# 1. ‖g + λw‖ without cancellation error, the same on both paths.


def cancelling(rel, n=4096, lam=1e-4, seed=0):
  rng = np.random.default_rng(seed)
  w = rng.standard_normal(n).astype(np.float32)
  delta = rng.standard_normal(n)
  g64 = -np.float64(np.float32(lam)) * w.astype(np.float64)
  delta *= rel * np.linalg.norm(g64) / np.linalg.norm(delta)
  g = (g64 + delta).astype(np.float32)
  # The exact ‖g + λw‖ of the float32 inputs (λ as float32).
  den = np.linalg.norm(g.astype(np.float64)
                       + np.float64(np.float32(lam)) * w.astype(np.float64))
  return w, g, den


@pytest.mark.parametrize("rel", [0.9, 1e-2, 1e-4, 1e-5, 1e-6])
def test_norm_of_sum_is_exact_under_cancellation(rel):
  lam = 1e-4
  w, g, den = cancelling(rel, lam=lam)
  want = np.linalg.norm(w.astype(np.float64)) / den  # c = 1
  params, grads = {"w": jnp.asarray(w)}, {"w": jnp.asarray(g)}
  lars = date_optax.lars(0.1, weight_decay=lam, trust_coefficient=1.0,
                         denominator="norm_of_sum")
  _, s1 = jax.jit(lars.update)(grads, lars.init(params), params)
  tx = date_optax.scale_by_trust_ratio(weight_decay=lam, denominator="norm_of_sum")
  u2, s2 = jax.jit(tx.update)(grads, tx.init(params), params)
  r1 = float(date_optax.trust_ratios(s1)["w"])
  r2 = float(date_optax.trust_ratios(s2)["w"])
  np.testing.assert_allclose(r1, want, rtol=1e-5)
  np.testing.assert_allclose(r2, want, rtol=1e-5)
  # The update itself, r (g + λw), is as accurate.
  v = g.astype(np.float64) + np.float64(np.float32(lam)) * w.astype(np.float64)
  np.testing.assert_allclose(np.asarray(u2["w"]), want * v, rtol=1e-4,
                             atol=1e-6 * np.abs(want * v).max())


def test_norm_of_sum_exact_per_layer_of_a_stacked_leaf():
  # Layer 0 cancels (exact path), layer 1 does not (expanded path).
  lam = 1e-4
  w0, g0, den0 = cancelling(1e-5, n=512, lam=lam, seed=1)
  w1, g1, den1 = cancelling(0.9, n=512, lam=lam, seed=2)
  params = {"w": jnp.asarray(np.stack([w0, w1]))}
  grads = {"w": jnp.asarray(np.stack([g0, g1]))}
  opt = date_optax.lars(0.1, weight_decay=lam, trust_coefficient=1.0,
                        denominator="norm_of_sum", layer_axes=0)
  _, state = jax.jit(opt.update)(grads, opt.init(params), params)
  want = [np.linalg.norm(w0.astype(np.float64)) / den0,
          np.linalg.norm(w1.astype(np.float64)) / den1]
  np.testing.assert_allclose(np.asarray(date_optax.trust_ratios(state)["w"]),
                             want, rtol=1e-5)


# --------------------------------------------------------------------------
# 2. Sum-of-norms LARS: ratio 1 when ‖g‖ = 0 (MLPerf, timm).


def test_sum_of_norms_zero_gradient_gives_ratio_one():
  params = {"w": jnp.ones((3, 4)), "z": jnp.zeros((2, 2))}
  grads = {"w": jnp.zeros((3, 4)), "z": jnp.ones((2, 2))}
  for opt in (date_optax.lars(0.1, weight_decay=0.1, trust_coefficient=0.01),
              date_optax.scale_by_trust_ratio(0.01, weight_decay=0.1)):
    _, state = opt.update(grads, opt.init(params), params)
    r = date_optax.trust_ratios(state)
    assert float(r["w"]) == 1.0  # not c/λ = 0.1
    assert float(r["z"]) == 1.0
  # norm_of_sum keeps optax's rule: ‖g + λw‖ = λ‖w‖ > 0, ratio c/λ.
  opt = date_optax.lars(0.1, weight_decay=0.1, trust_coefficient=0.01,
                        denominator="norm_of_sum")
  _, state = opt.update(grads, opt.init(params), params)
  np.testing.assert_allclose(float(date_optax.trust_ratios(state)["w"]), 0.1,
                             rtol=1e-6)
  a, _ = run(opt, params, 2, grads=lambda p, t: grads)
  b, _ = run(optax.lars(0.1, weight_decay=0.1, trust_coefficient=0.01), params, 2,
             grads=lambda p, t: grads)
  chex.assert_trees_all_close(a, b, rtol=1e-6)


def test_sum_of_norms_reference_with_a_zero_gradient_layer():
  params = make_params()
  zero_conv = lambda p, t: dict(grads_at(p, t), conv=jnp.zeros_like(p["conv"]))  # noqa: E731
  got, _ = run(date_optax.lars(0.3, weight_decay=0.05, trust_coefficient=0.01),
               params, grads=zero_conv)
  want = run_ref(ref.Lars(0.3, wd=0.05, c=0.01), params, grads=zero_conv)
  assert_close(got, want)


# --------------------------------------------------------------------------
# 3. Updates in promote_types(param, grad), as optax.


def bf16_grads(p, t):
  return jax.tree.map(lambda x: x.astype(jnp.bfloat16), grads_at(p, t))


@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_float32_params_bfloat16_grads_promote_like_optax(name):
  params = make_params()
  if name == "lars":
    ours = date_optax.lars(0.2, weight_decay=0.01, trust_coefficient=0.02,
                           denominator="norm_of_sum")
    theirs = optax.lars(0.2, weight_decay=0.01, trust_coefficient=0.02)
  else:
    ours = date_optax.lamb(0.01, weight_decay=0.01)
    theirs = optax.lamb(0.01, weight_decay=0.01)
  g = bf16_grads(params, 0)
  upd, _ = ours.update(g, ours.init(params), params)
  optax_dtypes, _ = theirs.update(g, theirs.init(params), params)
  # The values: the exact bf16 gradients, upcast (optax.lamb rounds
  # (1-b1)·g to bf16 inside scale_by_adam, so it is compared upcast).
  g32 = jax.tree.map(lambda x: x.astype(jnp.float32), g)
  want, _ = theirs.update(g32, theirs.init(params), params)
  for a, b, c in zip(jax.tree.leaves(upd), jax.tree.leaves(want),
                     jax.tree.leaves(optax_dtypes)):
    assert a.dtype == c.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("make", [
    lambda: date_optax.lars(0.1, weight_decay=0.01),
    lambda: date_optax.lamb(0.1, weight_decay=0.01),
    lambda: date_optax.bounded_lars(0.1, base="adam", weight_decay=0.01),
    lambda: date_optax.scale_by_trust_ratio(weight_decay=0.01),
], ids=["lars", "lamb", "bounded_lars", "trust_ratio"])
def test_update_dtype_is_promoted(make):
  p32 = make_params()
  opt = make()
  upd, _ = opt.update(bf16_grads(p32, 0), opt.init(p32), p32)
  assert all(u.dtype == jnp.float32 for u in jax.tree.leaves(upd))
  p16 = make_params(dtype=jnp.bfloat16)
  upd, _ = opt.update(bf16_grads(p16, 0), opt.init(p16), p16)
  assert all(u.dtype == jnp.bfloat16 for u in jax.tree.leaves(upd))


# --------------------------------------------------------------------------
# 4. One masking rule.

TRUST = {"dense": {"kernel": True, "bias": False}, "conv": True, "scale": False}
DECAY = {"dense": {"kernel": True, "bias": True}, "conv": False, "scale": True}
CASES = {"neither": (None, None), "trust_only": (TRUST, None),
         "decay_only": (None, DECAY), "both": (TRUST, DECAY)}


def kd(m):
  return None if m is None else keyed(m)


@pytest.mark.parametrize("case", list(CASES))
def test_mask_rule_lars(case):
  trust, decay = CASES[case]
  params = make_params()
  got, _ = run(date_optax.lars(0.3, weight_decay=0.05, trust_coefficient=0.01,
                               trust_ratio_mask=trust, weight_decay_mask=decay),
               params)
  assert_close(got, run_ref(ref.Lars(0.3, wd=0.05, c=0.01, trust=kd(trust),
                                     decay=kd(decay)), params))


@pytest.mark.parametrize("case", list(CASES))
def test_mask_rule_lamb(case):
  trust, decay = CASES[case]
  params = make_params()
  got, _ = run(date_optax.lamb(0.02, weight_decay=0.05, trust_ratio_mask=trust,
                               weight_decay_mask=decay), params)
  assert_close(got, run_ref(ref.Lamb(0.02, wd=0.05, trust=kd(trust),
                                     decay=kd(decay)), params))


@pytest.mark.parametrize("case", list(CASES))
def test_mask_rule_bounded_lars(case):
  trust, decay = CASES[case]
  params = make_params()
  got, _ = run(date_optax.bounded_lars(0.05, base="momentum", weight_decay=0.05,
                                       lower=0.05, upper=3.0,
                                       trust_ratio_mask=trust,
                                       weight_decay_mask=decay), params)
  assert_close(got, run_ref(ref.BoundedLars(0.05, "momentum", wd=0.05,
                                            lower=0.05, upper=3.0,
                                            trust=kd(trust), decay=kd(decay)),
                            params))


@pytest.mark.parametrize("case", list(CASES))
def test_mask_rule_scale_by_trust_ratio(case):
  trust, decay = CASES[case]
  params = make_params()
  opt = optax.chain(
      date_optax.scale_by_trust_ratio(0.01, weight_decay=0.05,
                                      trust_ratio_mask=trust,
                                      weight_decay_mask=decay),
      optax.scale_by_learning_rate(0.3), optax.trace(0.9))
  got, _ = run(opt, params)
  assert_close(got, run_ref(ref.Lars(0.3, wd=0.05, c=0.01, trust=kd(trust),
                                     decay=kd(decay)), params))


def test_lars_equals_optax_lars_with_both_masks():
  params = make_params()
  a, _ = run(date_optax.lars(0.2, weight_decay=0.1, denominator="norm_of_sum",
                             trust_ratio_mask=TRUST, weight_decay_mask=DECAY),
             params)
  b, _ = run(optax.lars(0.2, weight_decay=0.1, trust_ratio_mask=TRUST,
                        weight_decay_mask=DECAY), params)
  chex.assert_trees_all_close(a, b, rtol=1e-6, atol=1e-7)
  # optax's default for the mask not given is True: say it explicitly here.
  a, _ = run(date_optax.lars(0.2, weight_decay=0.1, denominator="norm_of_sum",
                             trust_ratio_mask=TRUST, weight_decay_mask=True),
             params)
  b, _ = run(optax.lars(0.2, weight_decay=0.1, trust_ratio_mask=TRUST), params)
  chex.assert_trees_all_close(a, b, rtol=1e-6, atol=1e-7)


def test_lamb_with_a_mask_differs_from_optax_unless_trust_given():
  params = make_params()
  a, _ = run(date_optax.lamb(0.01, weight_decay=0.05, weight_decay_mask=DECAY), params)
  b, _ = run(optax.lamb(0.01, weight_decay=0.05, mask=DECAY), params)
  assert not np.allclose(keyed(a)["['conv']"], keyed(b)["['conv']"])
  c, _ = run(date_optax.lamb(0.01, weight_decay=0.05, weight_decay_mask=DECAY,
                             trust_ratio_mask=True), params)
  chex.assert_trees_all_close(c, b, rtol=1e-6, atol=1e-7)


def test_mask_aliases_are_exclusive():
  with pytest.raises(ValueError, match="mask"):
    date_optax.lamb(0.1, mask=DECAY, weight_decay_mask=DECAY)
  with pytest.raises(ValueError, match="mask"):
    date_optax.scale_by_trust_ratio(mask=TRUST, trust_ratio_mask=TRUST)


# --------------------------------------------------------------------------
# 5. RMSProp's initial second moment.


@pytest.mark.parametrize("init", [0.0, 1.0])
def test_bounded_lars_rmsprop_initial_scale(init):
  params = make_params()
  got, _ = run(date_optax.bounded_lars(0.05, base="rmsprop",
                                       base_options={"initial_scale": init}),
               params)
  want = run_ref(ref.BoundedLars(0.05, "rmsprop", init_scale=init), params)
  assert_close(got, want)


def test_bounded_lars_rmsprop_initial_scale_validated():
  with pytest.raises(ValueError, match="initial_scale"):
    date_optax.bounded_lars(0.1, base="rmsprop", base_options={"initial_scale": -1.0})


# --------------------------------------------------------------------------
# 5b. bounded_lars's base_options and the keywords it replaces.

_OLD_FORM = [
    ("momentum", {"momentum": 0.7}),
    ("nesterov", {"momentum": 0.5}),
    ("adagrad", {"initial_accumulator_value": 0.2, "eps": 1e-6}),
    ("rmsprop", {"initial_scale": 1.0, "eps": 1e-6}),
    ("adam", {"b1": 0.8, "b2": 0.99, "eps": 1e-6}),
]


@pytest.mark.parametrize("base,options", _OLD_FORM)
def test_bounded_lars_deprecated_keywords_warn_and_match_base_options(base, options):
  params = make_params()
  new, _ = run(date_optax.bounded_lars(0.05, base=base, base_options=options), params)
  with pytest.warns(DeprecationWarning, match="base_options="):
    old_opt = date_optax.bounded_lars(0.05, base=base, **options)
  old, _ = run(old_opt, params)
  jax.tree.map(np.testing.assert_array_equal, old, new)
  # ... and the options are used: the defaults give another update.
  default, _ = run(date_optax.bounded_lars(0.05, base=base), params)
  assert not np.allclose(default["dense"]["kernel"], new["dense"]["kernel"])


def test_bounded_lars_rmsprop_decay_in_base_options():
  params = make_params()
  got, _ = run(date_optax.bounded_lars(0.05, base="rmsprop",
                                       base_options={"decay": 0.5}), params)
  ref_opt = ref.BoundedLars(0.05, "rmsprop")
  ref_opt.base.decay = 0.5  # the reference's `decay=` is the weight-decay mask
  want = run_ref(ref_opt, params)
  assert_close(got, want)


def test_bounded_lars_decay_keyword_refused():
  with pytest.raises(TypeError, match=r"base_options=\{'decay': \.\.\.\}"):
    date_optax.bounded_lars(0.1, base="rmsprop", decay=0.9)


def test_date_number_decay_is_not_rmsprop_decay():
  baseline = date_optax.Baseline(batch_size=32, learning_rate=0.1, warmup_epochs=1,
                                 epochs=10, num_examples=1024, optimizer="rmsprop")
  with pytest.raises(TypeError, match="learning-rate decay.*base_options"):
    date_optax.date(baseline, 64, decay=0.95)


@pytest.mark.parametrize("base,bad", [("adam", "momentum"), ("momentum", "b1"),
                                      ("sgd", "eps"), ("rmsprop", "typo")])
def test_bounded_lars_base_options_bad_key(base, bad):
  allowed = sorted(lars_lib.BASE_OPTIONS[base])
  with pytest.raises(ValueError, match=rf"'{bad}'.*allowed: ") as err:
    date_optax.bounded_lars(0.1, base=base, base_options={bad: 0.9})
  for key in allowed:
    assert repr(key) in str(err.value)


def test_bounded_lars_transformation_base_takes_no_options():
  with pytest.raises(ValueError, match="takes none"):
    date_optax.bounded_lars(0.1, base=optax.identity(), base_options={"eps": 1.0})


def test_bounded_lars_unknown_keyword_is_a_type_error():
  with pytest.raises(TypeError, match="unexpected keyword"):
    date_optax.bounded_lars(0.1, lowr=0.1)


def test_baseline_routes_base_options():
  # optimizer_options keys of the base go to base_options, the rest to
  # bounded_lars; a key of another base is an error naming it.
  kw = dict(batch_size=32, learning_rate=0.1, warmup_epochs=1, epochs=10,
            num_examples=1024)
  params = make_params()
  base = date_optax.Baseline(optimizer="rmsprop",
                             optimizer_options={"decay": 0.5, "weight_decay": 0.0},
                             **kw)
  got, _ = run(base.solver(learning_rate=0.05), params)
  direct = optax.chain(optax.scale_by_rms(decay=0.5), optax.scale_by_learning_rate(0.05))
  want, _ = run(direct, params)
  jax.tree.map(np.testing.assert_array_equal, got, want)
  with pytest.raises(ValueError, match="'b1'.*allowed"):
    date_optax.date(date_optax.Baseline(optimizer="momentum",
                                        optimizer_options={"b1": 0.9}, **kw), 64)


# --------------------------------------------------------------------------
# 6. Complex parameters.


def complex_params():
  p = make_params()
  q = make_params(seed=1)
  return jax.tree.map(lambda a, b: (a + 0.5j * b).astype(jnp.complex64), p, q)


def complex_grads(p, t):
  return jax.tree.map(lambda x: (jnp.sin(3.0 * x + t) + 0.05 * t).astype(x.dtype), p)


@pytest.mark.parametrize("kw", [dict(), dict(weight_decay=0.05)])
def test_lamb_complex_equals_optax(kw):
  params = complex_params()
  a, _ = run(date_optax.lamb(0.01, **kw), params, grads=complex_grads)
  b, _ = run(optax.lamb(0.01, **kw), params, grads=complex_grads)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == jnp.complex64
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("denominator", ["sum_of_norms", "norm_of_sum"])
def test_lars_complex_matches_reference(denominator):
  params = complex_params()
  got, _ = run(date_optax.lars(0.3, weight_decay=0.05, trust_coefficient=0.01,
                               denominator=denominator), params,
               grads=complex_grads)
  want = run_ref(ref.Lars(0.3, wd=0.05, c=0.01,
                          sum_of_norms=denominator == "sum_of_norms"),
                 params, grads=complex_grads)
  assert_close(got, want)


@pytest.mark.parametrize("base", ["sgd", "momentum", "adam"])
def test_bounded_lars_complex_matches_reference(base):
  params = complex_params()
  got, _ = run(date_optax.bounded_lars(0.05, base=base, weight_decay=0.01),
               params, grads=complex_grads)
  want = run_ref(ref.BoundedLars(0.05, base, wd=0.01), params, grads=complex_grads)
  assert_close(got, want)


def test_integer_leaf_raises_type_error_naming_it():
  params = {"w": jnp.ones((2, 2)), "steps": jnp.zeros((2,), jnp.int32)}
  for opt in (date_optax.lars(0.1), date_optax.lamb(0.1),
              date_optax.bounded_lars(0.1, base="sgd"),
              date_optax.scale_by_trust_ratio()):
    with pytest.raises(TypeError, match=r"\['steps'\]"):
      opt.update(params, opt.init(params), params)


# --------------------------------------------------------------------------
# 7. LAMB with decoupled weight decay.


@pytest.mark.parametrize("masked", [False, True])
def test_lamb_decoupled_weight_decay_matches_reference(masked):
  params = make_params()
  decay = DECAY if masked else None
  got, _ = run(date_optax.lamb(0.02, weight_decay=0.1, decoupled_weight_decay=True,
                               weight_decay_mask=decay), params)
  want = run_ref(ref.Lamb(0.02, wd=0.1, decoupled=True, decay=kd(decay)), params)
  assert_close(got, want)
  coupled = run_ref(ref.Lamb(0.02, wd=0.1, decay=kd(decay)), params)
  key = "['dense']['kernel']"
  assert not np.allclose(want[key], coupled[key])


# --------------------------------------------------------------------------
# 8. Masks from parameter paths.


def test_path_mask_dicts_frozendict_and_stacked():
  params = {"encoder": {"layers": {"mlp": {"kernel": jnp.ones((4, 3, 3)),
                                           "bias": jnp.ones((4, 3))},
                                   "layer_norm": {"weight": jnp.ones((4, 3))}}},
            "head": [jnp.ones((3, 2)), jnp.ones((2,))]}
  mask = date_optax.path_mask(exclude=(r"bias$", r"norm"))
  want = {"encoder": {"layers": {"mlp": {"kernel": True, "bias": False},
                                 "layer_norm": {"weight": False}}},
          "head": [True, True]}
  assert mask(params) == want
  assert mask(flax.core.freeze(params)) == flax.core.freeze(want)
  inc = date_optax.path_mask(include=r"^encoder/", exclude=r"layer_norm")
  assert inc(params)["head"] == [False, False]
  assert inc(params)["encoder"]["layers"]["mlp"]["kernel"] is True
  assert date_optax.path_mask(include=r"^head/1$")(params)["head"] == [False, True]
  # Usable wherever a mask is: the stacked norm 'weight' gets no ratio/decay.
  opt = date_optax.lars(0.1, weight_decay=0.1, trust_ratio_mask=mask)
  _, state = opt.update(params, opt.init(params), params)
  r = date_optax.trust_ratios(state)
  assert float(r["encoder"]["layers"]["layer_norm"]["weight"]) == 1.0
  assert float(r["encoder"]["layers"]["mlp"]["kernel"]) != 1.0
  masked = optax.masked(optax.add_decayed_weights(1.0), mask)
  upd, _ = masked.update(params, masked.init(params), params)
  assert float(upd["encoder"]["layers"]["layer_norm"]["weight"][0, 0]) == 1.0


def test_path_mask_nnx_state():
  class Block(nnx.Module):
    def __init__(self, rngs):
      self.dense = nnx.Linear(3, 3, rngs=rngs)
      self.norm = nnx.LayerNorm(3, rngs=rngs)

  state = nnx.state(Block(nnx.Rngs(0)), nnx.Param)
  mask = date_optax.path_mask(exclude=(r"^norm/",))(state)
  flat = {"/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path): v
          for path, v in jax.tree_util.tree_flatten_with_path(mask)[0]}
  assert flat and all(v == k.startswith("dense/") for k, v in flat.items()), flat
  assert sum(flat.values()) == 2


def test_path_mask_bad_input():
  with pytest.raises(ValueError, match="exclude"):
    date_optax.path_mask(exclude=("[",))
  with pytest.raises(TypeError, match="include"):
    date_optax.path_mask(include=3)
