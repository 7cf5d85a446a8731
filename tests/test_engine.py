"""Baseline, scale_recipe, multi-stage recipes and date() (docs/algorithms.md; LEGW Table 1)."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import strategies as st

import date_optax
from date_optax import schedules
from date_optax._src import date_optimizer

IMAGENET = 1281167


def legw_baseline(**kw):
  """LEGW Table 1's baseline: ResNet-50, B0 = 1K, poly power 2, 90 epochs."""
  args = dict(batch_size=1024, learning_rate=2**2.5, warmup_epochs=0.3125,
              epochs=90, num_examples=IMAGENET, decay=schedules.Poly(power=2))
  args.update(kw)
  return date_optax.Baseline(**args)


def date_baseline(**kw):
  """DATE's worked example (You et al., SC 2019, §3.6): B0 = 1024, 1755 iterations."""
  args = dict(batch_size=1024, learning_rate=1.25e-3, warmup_epochs=2, epochs=30,
              num_examples=59904)
  args.update(kw)
  return date_optax.Baseline(**args)


def ceil_div(a: int, b: int) -> int:
  return -(-a // b)


# ---------------------------------------------------------------------------
# The papers' tables (LEGW Table 1; DATE's worked example).


@pytest.mark.parametrize("j", range(6))
def test_legw_table_1(j):
  base = legw_baseline()
  B = 1024 * 2**j
  r = date_optax.scale_recipe(base, B)
  np.testing.assert_allclose(r.peak_learning_rate, 2 ** (2.5 + 0.5 * j), rtol=1e-14)
  assert r.warmup_epochs == [0.3125, 0.625, 1.25, 2.5, 5, 10][j]
  # Warmup iterations are the same for every batch: round(0.3125·n/1024).
  assert r.warmup_steps == 391 == math.floor(Fraction("0.3125") * IMAGENET / 1024 + 0.5)
  assert r.total_steps == ceil_div(90 * IMAGENET, B)
  assert r.steps_per_epoch == IMAGENET / B
  assert r.scale == 2**j
  assert r.decay == schedules.Poly(2)


def test_legw_table_1_schedule_is_unshifted_poly():
  r = date_optax.scale_recipe(legw_baseline(), 32768)
  T, W, peak = r.total_steps, r.warmup_steps, 2.0**5
  assert T == 3519
  i = np.arange(1, T + 1, dtype=np.float64)
  want = np.where(i <= W, peak * i / W, peak * (1 - i / T) ** 2)
  np.testing.assert_allclose(r.learning_rates(), want, rtol=3e-6, atol=1e-9)


def test_date_worked_example():
  base = date_baseline()
  assert base.total_steps == 1755
  assert (base.warmup_steps, base.steps_per_epoch) == (117, 58.5)
  r = date_optax.date_recipe(base, 8192)
  assert r.warmup_epochs == 16.0
  assert r.warmup_steps == 117
  assert r.total_steps == 220
  peak = 1.25e-3 * math.sqrt(8)
  np.testing.assert_allclose(r.peak_learning_rate, peak, rtol=1e-15)
  assert r.decay == schedules.RollerCoaster(power=1.0, floor=1e-6)
  lr = r.learning_rates()
  assert lr.shape == (220,)
  i = np.arange(1, 221)
  # Iterations 1..117 warm up linearly to the peak, 118..220 roll down.
  want = np.where(i <= 117, peak * i / 117,
                  np.maximum(peak * (1 - (i - 117) / (220 - 117)), 1e-6))
  np.testing.assert_allclose(lr, want, rtol=2e-6)
  np.testing.assert_allclose(lr[116], peak, rtol=1e-6)  # iteration 117
  np.testing.assert_allclose(lr[117], peak * 102 / 103, rtol=1e-6)  # 118
  np.testing.assert_allclose(lr[219], 1e-6, rtol=1e-6)  # 220: the floor


@pytest.mark.parametrize("j", range(7))
def test_lamb_imagenet_table(j):
  base = date_optax.Baseline(batch_size=512, learning_rate=4 / (2**3.0 * 100),
                             warmup_epochs=0.3125, epochs=90, num_examples=IMAGENET)
  r = date_optax.scale_recipe(base, 512 * 2**j)
  np.testing.assert_allclose(r.peak_learning_rate, 4 / (2 ** (3.0 - 0.5 * j) * 100),
                             rtol=1e-14)
  assert r.warmup_epochs == 0.3125 * 2**j
  assert r.warmup_steps == math.floor(Fraction("0.3125") * IMAGENET / 512 + 0.5) == 782


@pytest.mark.parametrize("j", range(7))
def test_lamb_bert_table_with_warmup_ratio(j):
  # n chosen so that T0 = 204800 iterations at B0 = 512: warmup 640 = T0/320.
  n = 512 * 204800
  base = date_optax.Baseline(batch_size=512, learning_rate=5 / (2**3.0 * 10**3),
                             warmup_ratio=1 / 320, epochs=1, num_examples=n,
                             optimizer="adam")
  B = 512 * 2**j
  r = date_optax.scale_recipe(base, B)
  np.testing.assert_allclose(r.peak_learning_rate, 5 / (2 ** (3.0 - 0.5 * j) * 10**3),
                             rtol=1e-14)
  assert r.warmup_ratio == 2**j / 320  # 1/320 .. 1/5
  assert r.total_steps == 204800 // 2**j
  assert r.warmup_steps == 640
  assert Fraction(r.warmup_steps, r.total_steps) == Fraction(2**j, 320)


# ---------------------------------------------------------------------------
# Scaling properties.

_baselines = st.builds(
    lambda B0, n_mult, E, w_frac: (B0, B0 * n_mult, E, w_frac),
    st.sampled_from([32, 100, 128, 256, 1000, 1024]),
    st.integers(2, 500),
    st.sampled_from([1, 3, 10, 30, 90, 0.5, 2.5]),
    st.floats(0.0, 0.2),
)


@given(_baselines, st.floats(-4, 4), st.sampled_from(["gradual", "constant"]))
def test_scaling_properties(bl, log2k, warmup):
  B0, n, E, w_frac = bl
  w0 = round(w_frac * E, 4)
  kw = dict(batch_size=B0, learning_rate=0.1, warmup_epochs=w0, epochs=E,
            num_examples=n, warmup=warmup)
  if w0 > 0 and math.floor(Fraction(repr(float(w0))) * n / B0 + Fraction(1, 2)) == 0:
    # A non-zero warmup that rounds to 0 iterations is refused, not dropped.
    with pytest.raises(ValueError, match="warmup_epochs=.*smallest warmup_epochs"):
      date_optax.Baseline(**kw)
    return
  base = date_optax.Baseline(**kw)
  B = max(1, int(round(B0 * 2.0**log2k)))
  k = Fraction(B, B0)
  e, w = Fraction(repr(float(E))), Fraction(repr(float(w0)))
  W0 = math.floor(w * n / B0 + Fraction(1, 2))
  T = math.ceil(e * n / B)
  if w * k >= e or (W0 and W0 >= T):
    with pytest.raises(ValueError, match="largest batch size"):
      date_optax.scale_recipe(base, B)
    return
  r = date_optax.scale_recipe(base, B)
  # Total steps exact; warmup steps constant across batch sizes.
  assert r.total_steps == T
  assert T - 1 < float(e * n / B) <= T
  assert r.warmup_steps == W0 == base.warmup_steps
  assert abs(r.warmup_steps - r.warmup_epochs * r.steps_per_epoch) <= 0.5 + 1e-9
  np.testing.assert_allclose(r.warmup_epochs, float(w * k), rtol=1e-15)
  np.testing.assert_allclose(r.peak_learning_rate, 0.1 * math.sqrt(B / B0), rtol=1e-14)
  W = r.warmup_steps
  if W >= 2 and warmup == "gradual":
    # Peak reached at the end of the warmup (iteration W), not before.
    lr = np.asarray(r.schedule(jnp.array([0, W - 2, W - 1])))
    np.testing.assert_allclose(lr, r.peak_learning_rate * np.array([1, W - 1, W]) / W,
                               rtol=1e-6)


@given(st.sampled_from(["linear", "sqrt", "none"]),
       st.sampled_from(["linear", "sqrt", "none"]), st.integers(0, 5))
def test_scaling_rule_choices(lr_rule, warmup_rule, j):
  base = date_baseline()
  B = 256 * 2**j
  r = date_optax.scale_recipe(base, B, lr_scaling=lr_rule, warmup_scaling=warmup_rule)
  k = B / 1024
  factor = {"linear": k, "sqrt": math.sqrt(k), "none": 1.0}
  np.testing.assert_allclose(r.peak_learning_rate, 1.25e-3 * factor[lr_rule],
                             rtol=1e-14)
  np.testing.assert_allclose(r.warmup_epochs, 2 * factor[warmup_rule], rtol=1e-14)
  assert r.warmup_steps == math.floor(r.warmup_epochs * 59904 / B + 0.5)


def test_scaling_down():
  # Tuned at 8K, scaled down to the DATE baseline's 1K: k = 1/8.
  big = date_baseline(batch_size=8192, learning_rate=1.25e-3 * math.sqrt(8),
                      warmup_epochs=16)
  r = date_optax.scale_recipe(big, 1024)
  np.testing.assert_allclose(r.peak_learning_rate, 1.25e-3, rtol=1e-15)
  assert (r.warmup_epochs, r.warmup_steps, r.total_steps) == (2.0, 117, 1755)
  assert r.scale == 0.125


def test_k_equal_one_gives_the_baseline_back():
  base = legw_baseline()
  r = date_optax.scale_recipe(base, 1024)
  assert r.peak_learning_rate == base.learning_rate
  assert r.warmup_epochs == base.warmup_epochs
  assert (r.warmup_steps, r.total_steps) == (base.warmup_steps, base.total_steps)
  assert r == base.recipe()


def test_warmup_reaching_end_of_training_is_refused():
  base = date_baseline()  # w0 = 2 of 30 epochs: k < 15, B < 15360
  date_optax.scale_recipe(base, 15359)
  with pytest.raises(ValueError, match=r"largest batch size .* is 15359"):
    date_optax.scale_recipe(base, 15360)
  with pytest.raises(ValueError, match="15359"):
    date_optax.date(base, 32768)
  # docs/algorithms.md, LEGW: at 64x a 30-epoch run needs w0 < 0.47 epochs.
  ok = date_baseline(warmup_epochs=0.46)
  assert date_optax.scale_recipe(ok, 64 * 1024).warmup_epochs == pytest.approx(29.44)
  with pytest.raises(ValueError, match="warmup"):
    date_optax.scale_recipe(date_baseline(warmup_epochs=0.47), 64 * 1024)
  # With no warmup scaling it never reaches the end.
  r = date_optax.scale_recipe(base, 32768, warmup_scaling="none")
  assert r.warmup_epochs == 2.0 and r.warmup_steps == 4 and r.total_steps == 55


def test_recipe_options_override_the_baseline():
  base = legw_baseline(warmup="constant", warmup_factor=0.5)
  r = date_optax.scale_recipe(base, 2048)
  assert r.warmup == "constant"
  np.testing.assert_allclose(float(r.schedule(0)), 0.5 * 2**3, rtol=1e-6)
  r = date_optax.scale_recipe(base, 2048, decay="cosine", warmup="gradual")
  assert r.decay == schedules.Cosine() and r.warmup == "gradual"
  np.testing.assert_allclose(float(r.schedule(0)), 2**3 / 391, rtol=1e-6)
  r = date_optax.scale_recipe(
      base, 2048, decay=schedules.MultiStep(epochs=(30, 60, 80)))
  lr = r.learning_rates()
  spe = IMAGENET / 2048
  i_end30 = math.floor(30 * spe)  # last iteration of epoch 30
  np.testing.assert_allclose(lr[[i_end30 - 1, i_end30]], [8.0, 0.8], rtol=1e-6)


def test_multi_stage_bert_two_stages():
  # BERT pre-training: 90% of the steps at sequence length 128, then 512,
  # each phase with its own batch and a fresh warmup (LAMB, 64K/32K).
  phase1 = date_optax.Baseline(batch_size=512, learning_rate=5e-3 / 2**3,
                               warmup_ratio=1 / 320, epochs=1,
                               num_examples=512 * 7037 * 128)
  phase2 = date_optax.Baseline(batch_size=512, learning_rate=5e-3 / 2**3,
                               warmup_ratio=1 / 320, epochs=1,
                               num_examples=512 * 1563 * 64)
  r1 = date_optax.scale_recipe(phase1, 65536)
  r2 = date_optax.scale_recipe(phase2, 32768)
  assert (r1.total_steps, r2.total_steps) == (7037, 1563)
  ms = date_optax.multi_stage([r1, r2])
  assert ms.boundaries == (0, 7037) and ms.total_steps == 8600
  lr = np.asarray(ms.schedule(jnp.arange(ms.total_steps)))
  want = np.concatenate([r1.learning_rates(), r2.learning_rates()])
  np.testing.assert_allclose(lr, want, rtol=1e-6)
  # Re-warms from 0 at the boundary instead of continuing to decay.
  assert lr[7036] == pytest.approx(1e-6)
  np.testing.assert_allclose(lr[7037], r2.peak_learning_rate / r2.warmup_steps,
                             rtol=1e-6)
  assert ms.stage_of(7036) == 0 and ms.stage_of(7037) == 1
  with pytest.raises(ValueError, match="stages"):
    date_optax.multi_stage([])
  with pytest.raises(TypeError, match="Recipe"):
    date_optax.multi_stage([r1.schedule])


def test_multi_stage_refuses_a_stage_without_warmup():
  with_w = date_optax.Baseline(batch_size=512, learning_rate=1e-3,
                               warmup_ratio=0.1, epochs=1, num_examples=5120)
  no_w = date_optax.Baseline(batch_size=512, learning_rate=1e-3,
                             epochs=1, num_examples=2048)
  ok = date_optax.multi_stage([date_optax.scale_recipe(with_w, 1024)] * 2)
  assert ok.total_steps == 10
  for stages, idx in (([with_w, no_w], 1), ([no_w, with_w], 0)):
    recipes = [date_optax.scale_recipe(b, 512) for b in stages]
    with pytest.raises(ValueError, match=f"stage {idx} .*warmup_steps=0"):
      date_optax.multi_stage(recipes)


@pytest.mark.parametrize("field,value,smallest", [
    # round(w·n/B0) = round(w·58.5) >= 1  <=>  w >= 1/117 = 0.008547...
    ("warmup_epochs", 0.008, 0.008548),
    ("warmup_ratio", 0.0002, 0.0002850),  # (1/117) / 30 epochs
])
def test_warmup_that_rounds_to_zero_iterations_is_refused(field, value, smallest):
  def base(w):
    return date_baseline(**{"warmup_epochs": None, field: w})
  with pytest.raises(ValueError, match=f"{field}={value}.* {smallest:g};"):
    base(value)
  # The value the message gives is enough for one iteration; just below is not.
  assert base(smallest).warmup_steps == 1
  with pytest.raises(ValueError, match=field):
    base(smallest * 0.999)
  # Zero stays "no warmup".
  assert date_baseline(warmup_epochs=0).warmup_steps == 0


def test_warmup_that_vanishes_at_the_target_batch_is_refused():
  # With a constant warmup in epochs the iterations shrink as B grows:
  # 0.1 epoch is 5.85 iterations at B0 = 1024, 0.73 at 8K, 0.37 at 16K.
  base = date_baseline(warmup_epochs=0.1)
  assert date_optax.scale_recipe(base, 8192, warmup_scaling="none").warmup_steps == 1
  with pytest.raises(ValueError, match=r"warmup_epochs=0.1 .*batch_size=16384.* 0.1368;"):
    date_optax.scale_recipe(base, 16384, warmup_scaling="none")
  # LEGW's linear warmup scaling keeps the iterations: never refused.
  assert date_optax.scale_recipe(base, 65536).warmup_steps == 6


def test_baseline_and_recipe_are_frozen_and_hashable():
  base = date_baseline(optimizer_options={"momentum": 0.8})
  with pytest.raises(dataclasses.FrozenInstanceError):
    base.batch_size = 2  # type: ignore[misc]
  with pytest.raises(TypeError):
    base.optimizer_options["momentum"] = 0.5  # type: ignore[index]
  assert hash(base) == hash(dataclasses.replace(base))
  assert dataclasses.replace(base, batch_size=2048).batch_size == 2048
  assert base.decay == schedules.RollerCoaster()  # names become Decay objects
  assert hash(date_optax.scale_recipe(base, 2048)) is not None


# ---------------------------------------------------------------------------
# Bad input.


@pytest.mark.parametrize(
    "kw,arg",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=-8), "batch_size"),
        (dict(epochs=0), "epochs"),
        (dict(epochs=-1.0), "epochs"),
        (dict(num_examples=0), "num_examples"),
        (dict(learning_rate=0.0), "learning_rate"),
        (dict(warmup_epochs=30), "warmup_epochs"),
        (dict(warmup_epochs=31), "warmup_epochs"),
        (dict(warmup_epochs=-1), "warmup_epochs"),
        (dict(warmup_epochs=None, warmup_ratio=1.0), "warmup_ratio"),
        (dict(warmup_ratio=0.1), "warmup_ratio"),
        (dict(decay="step"), "decay"),
        (dict(decay="roller_coaster", warmup="linear"), "warmup"),
        (dict(warmup_factor=0.0), "warmup_factor"),
        (dict(optimizer="lbfgs"), "optimizer"),
        (dict(ratio_bounds=(1.0, 0.5)), "lower"),
        (dict(ratio_bounds=(0.1,)), "ratio_bounds"),
    ],
)
def test_bad_baseline(kw, arg):
  with pytest.raises(ValueError, match=arg):
    date_baseline(**kw)


@pytest.mark.parametrize(
    "kw,arg",
    [
        (dict(lr_scaling="cube"), "lr_scaling"),
        (dict(warmup_scaling="quadratic"), "warmup_scaling"),
        (dict(decay="exp"), "decay"),
        (dict(decay=schedules.RollerCoaster(floor=1.0)), "floor"),
        (dict(warmup="slow"), "warmup"),
    ],
)
def test_bad_scale_recipe_arguments(kw, arg):
  with pytest.raises(ValueError, match=arg):
    date_optax.scale_recipe(date_baseline(), 2048, **kw)


@given(st.integers(-10**6, 0))
def test_non_positive_batch_size_rejected(b):
  with pytest.raises(ValueError, match="batch_size"):
    date_optax.scale_recipe(date_baseline(), b)
  with pytest.raises(ValueError, match="batch_size"):
    date_baseline(batch_size=b)


def test_bad_types():
  with pytest.raises(TypeError, match="batch_size"):
    date_optax.scale_recipe(date_baseline(), 2048.0)
  with pytest.raises(TypeError, match="Baseline"):
    date_optax.scale_recipe({"batch_size": 1024}, 2048)
  with pytest.raises(TypeError, match="optimizer"):
    date_baseline(optimizer=optax.adam)  # a factory, not a transform
  with pytest.raises(TypeError, match="optimizer_options"):
    date_baseline(optimizer_options=[("momentum", 0.9)])


# ---------------------------------------------------------------------------
# date(): the optimizer.


def _mlp_problem(seed=0, n=1024, d=16, h=32, c=4):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)).astype(np.float32)
  y = np.argmax(x @ rng.normal(size=(d, c)) + 0.5 * rng.normal(size=(n, c)), -1)
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  params = {
      "l1": {"w": jax.random.normal(k1, (d, h)) / np.sqrt(d), "b": jnp.zeros(h)},
      "l2": {"w": jax.random.normal(k2, (h, c)) / np.sqrt(h), "b": jnp.zeros(c)},
  }

  def loss_fn(p, xb, yb):
    hid = jnp.tanh(xb @ p["l1"]["w"] + p["l1"]["b"])
    logits = hid @ p["l2"]["w"] + p["l2"]["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

  return jnp.asarray(x), jnp.asarray(y), params, loss_fn


def _train(tx, batch_size, epochs, seed=0):
  """Trains the MLP under jit; returns final params, full-data loss, ratios."""
  x, y, params, loss_fn = _mlp_problem(seed)
  n = x.shape[0]
  steps = math.ceil(epochs * n / batch_size)
  rng = np.random.default_rng(1)
  epochs_needed = steps * batch_size // n + 1
  order = np.concatenate([rng.permutation(n) for _ in range(epochs_needed)])
  batches = jnp.asarray(order[: steps * batch_size].reshape(steps, batch_size))

  @jax.jit
  def run(params, state):
    def step(carry, b):
      p, s = carry
      g = jax.grad(loss_fn)(p, x[b], y[b])
      u, s = tx.update(g, s, p)
      ratios = date_optax.trust_ratios(s)
      return (optax.apply_updates(p, u), s), ratios if ratios is not None else 0.0
    (p, _), ratios = jax.lax.scan(step, (params, state), batches)
    return p, ratios

  p, ratios = run(params, tx.init(params))
  return p, float(loss_fn(p, x, y)), ratios, float(loss_fn(params, x, y))


def _small_baseline(**kw):
  args = dict(batch_size=32, learning_rate=0.05, warmup_epochs=0.5, epochs=10,
              num_examples=1024, optimizer="momentum",
              optimizer_options={"momentum": 0.9})
  args.update(kw)
  return date_optax.Baseline(**args)


def test_baseline_solver_is_plain_momentum():
  base = _small_baseline(optimizer_options={"momentum": 0.9, "weight_decay": 1e-3})
  ref = optax.chain(optax.add_decayed_weights(1e-3),
                    optax.sgd(base.recipe().schedule, momentum=0.9))
  p_a, loss_a, _, _ = _train(base.solver(), 32, 2)
  p_b, loss_b, _, _ = _train(ref, 32, 2)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               p_a, p_b)


def _steps(tx, steps, batch_size=32, seed=0):
  """Params after each of `steps` updates of the MLP (eager, one per step)."""
  x, y, params, loss_fn = _mlp_problem(seed)
  rng = np.random.default_rng(1)
  state = tx.init(params)
  update = jax.jit(tx.update)
  grad = jax.jit(jax.grad(loss_fn))
  out = []
  for _ in range(steps):
    b = rng.choice(x.shape[0], batch_size, replace=False)
    u, state = update(grad(params, x[b], y[b]), state, params)
    params = optax.apply_updates(params, u)
    out.append(params)
  return out, state


@pytest.mark.parametrize(
    "optimizer,lr,options",
    [
        ("momentum", 0.05, {"momentum": 0.9}),
        ("momentum", 0.05, {"momentum": 0.9, "weight_decay": 1e-3}),
        ("sgd", 0.1, {}),
        ("adam", 2e-3, {}),
        ("adam", 2e-3, {"weight_decay": 1e-2,
                        "weight_decay_mask": date_optax.exclude_bias_and_norm}),
        ("rmsprop", 5e-3, {}),
    ],
)
def test_date_at_b0_is_the_baseline_solver_step_by_step(optimizer, lr, options):
  # Every leaf, zero-initialised biases included, follows baseline.solver()
  # at every step: the bounds are [1, 1] at k = 1 and the biases are masked.
  base = _small_baseline(optimizer=optimizer, learning_rate=lr,
                         optimizer_options=options)
  ref, _ = _steps(base.solver(), 40)
  got, state = _steps(date_optax.date(base, 32), 40)
  for t, (a, b) in enumerate(zip(got, ref)):
    jax.tree.map(lambda u, v, t=t: np.testing.assert_allclose(
        u, v, rtol=2e-6, atol=1e-7, err_msg=f"step {t + 1}"), a, b)
  for r in jax.tree.leaves(date_optax.trust_ratios(state)):
    np.testing.assert_array_equal(np.asarray(r), 1.0)


def test_the_old_fixed_bounds_were_not_the_baseline_on_biases():
  # The defect the defaults fix: with every leaf under the ratio and bounds
  # [0.01, 1], a zero-initialised bias gets r = 1 at step 1, then
  # ‖b‖/‖g_b‖ < 1, and leaves the baseline after one step.
  base = _small_baseline()
  ref, _ = _steps(base.solver(), 3)
  old = date_optax.date(base, 32, bounds="fixed", trust_ratio_mask=None)
  got, state = _steps(old, 3)
  np.testing.assert_allclose(got[0]["l1"]["b"], ref[0]["l1"]["b"], rtol=1e-6)
  assert float(date_optax.trust_ratios(state)["l1"]["b"]) < 0.5
  assert not np.allclose(got[2]["l1"]["b"], ref[2]["l1"]["b"], rtol=1e-3)


def test_date_at_k_equal_one_trains_like_the_baseline():
  base = _small_baseline()
  baseline_solver = optax.sgd(base.recipe().schedule, momentum=0.9)
  _, loss_base, _, loss0 = _train(baseline_solver, 32, 10)
  p_date, loss_date, ratios, _ = _train(date_optax.date(base, 32), 32, 10)
  assert loss_base < 0.5 * loss0  # the baseline itself learns
  for name in ("l1", "l2"):
    np.testing.assert_array_equal(np.asarray(ratios[name]["w"]), 1.0)
    np.testing.assert_array_equal(np.asarray(ratios[name]["b"]), 1.0)
  np.testing.assert_allclose(loss_date, loss_base, rtol=1e-4)
  # A fixed upper bound of 10 multiplies most layers' step.
  _, loss_up10, ratios10, _ = _train(date_optax.date(base, 32, upper=10.0), 32, 10)
  assert np.asarray(ratios10["l1"]["w"]).max() > 5.0
  assert abs(loss_up10 - loss_base) > 0.2 * loss_base


@pytest.mark.parametrize("rule,k,want", [
    ("baseline_to_recipe", 1, (1.0, 1.0)),
    ("baseline_to_recipe", 16, (0.25, 1.0)),
    ("baseline_to_recipe", 64, (0.125, 1.0)),
    ("baseline_to_linear", 1, (1.0, 1.0)),
    ("baseline_to_linear", 16, (0.25, 4.0)),
    ("baseline_to_linear", 64, (0.125, 8.0)),
    ("fixed", 64, (0.01, 1.0)),
])
def test_layer_lr_bounds(rule, k, want):
  base = _small_baseline(batch_size=16, warmup_epochs=0.1, epochs=30,
                         num_examples=32768)
  r = date_optax.date_recipe(base, 16 * k)
  got = date_optax.layer_lr_bounds(r, rule)
  np.testing.assert_allclose(got, want, rtol=1e-12)
  # In learning rates: every layer between η0 and the rule's ceiling.
  lo, hi = got
  if rule != "fixed":
    assert r.peak_learning_rate * lo == pytest.approx(base.learning_rate)
  # Scaling down (k < 1): the bounds flip sides of 1 and still hold η0.
  down = date_optax.layer_lr_bounds(date_optax.date_recipe(base, 8), rule)
  assert down[0] <= down[1]
  with pytest.raises(ValueError, match="bounds"):
    date_optax.layer_lr_bounds(r, "loose")


def test_date_masks_biases_and_bounds_kernels_at_large_batch():
  base = _small_baseline()
  _, _, ratios, _ = _train(date_optax.date(base, 512), 512, 10)  # k = 16
  for name in ("l1", "l2"):
    np.testing.assert_array_equal(np.asarray(ratios[name]["b"]), 1.0)
    w = np.asarray(ratios[name]["w"])
    assert np.all((w >= 0.25 - 1e-7) & (w <= 1.0 + 1e-7))


@pytest.mark.parametrize("optimizer,lr", [("momentum", 0.05), ("adam", 2e-3),
                                          ("nesterov", 0.05), ("rmsprop", 5e-3)])
def test_date_optimizers_train_under_jit_at_large_batch(optimizer, lr):
  base = _small_baseline(optimizer=optimizer, learning_rate=lr, optimizer_options={})
  tx = date_optax.date(base, 256)  # k = 8: 40 iterations
  assert date_optax.date_recipe(base, 256).total_steps == 40
  _, loss, ratios, loss0 = _train(tx, 256, 10)
  assert loss < 0.6 * loss0
  lower = 1 / math.sqrt(8)  # bounds [1/sqrt(k), 1]
  for r in jax.tree.leaves(ratios):
    assert np.all((np.asarray(r) >= lower - 1e-6) & (np.asarray(r) <= 1.0 + 1e-7))


def test_date_follows_the_spec_example_schedule():
  # DATE example at 8192 with an sgd base: ‖w‖/‖g‖ ≫ 1 is clipped to 1, so
  # each update is exactly -η_i·g and the schedule can be read off it.
  base = date_baseline(optimizer="sgd")
  tx = date_optax.date(base, 8192)
  params = {"w": jnp.full((4, 3), 100.0)}
  g = {"w": jnp.full((4, 3), 1e-2)}

  @jax.jit
  def run(state):
    def step(s, _):
      u, s = tx.update(g, s, params)
      return s, -u["w"][0, 0] / g["w"][0, 0]
    return jax.lax.scan(step, state, None, 230)[1]

  lr = np.asarray(run(tx.init(params)))
  peak = 1.25e-3 * math.sqrt(8)
  i = np.arange(1, 231)
  want = np.where(i <= 117, peak * i / 117,
                  np.maximum(peak * (1 - np.minimum(i - 117, 103) / 103), 1e-6))
  np.testing.assert_allclose(lr, want, rtol=1e-5)


def test_date_bounds_defaults_and_overrides():
  params = {"w": jnp.full((3, 1), 10.0)}
  g = {"w": jnp.full((3, 1), 1e-3)}  # ratio ‖w‖/‖g‖ = 1e4
  def ratio_after_one_step(tx, g=g):
    _, s = tx.update(g, tx.init(params), params)
    return float(date_optax.trust_ratios(s)["w"])
  base = date_baseline(optimizer="sgd")
  assert ratio_after_one_step(date_optax.date(base, 4096)) == 1.0
  assert ratio_after_one_step(
      date_optax.date(base, 4096, bounds="baseline_to_linear")) == 2.0
  assert ratio_after_one_step(date_optax.date(base, 4096, upper=10.0)) == 10.0
  tuned = date_baseline(optimizer="sgd", ratio_bounds=(0.1, 3.0))
  assert ratio_after_one_step(date_optax.date(tuned, 4096)) == 3.0
  assert date_optimizer.DEFAULT_BOUNDS == (0.01, 1.0)
  # Large gradients are damped, down to the lower bound: 1/sqrt(k) by
  # default (the layer keeps the baseline's η0), 0.01 with fixed bounds.
  g_big = {"w": jnp.full((3, 1), 1e6)}
  assert ratio_after_one_step(date_optax.date(base, 4096), g_big) == 0.5
  assert ratio_after_one_step(
      date_optax.date(base, 4096, bounds="fixed"), g_big) == pytest.approx(0.01)
  assert ratio_after_one_step(
      date_optax.date(base, 4096, lower=0.2), g_big) == pytest.approx(0.2)
  with pytest.raises(ValueError, match="lower"):
    date_optax.date(base, 2048, lower=2.0)
  with pytest.raises(ValueError, match="bounds"):
    date_optax.date(base, 2048, bounds="tight")


def test_date_trust_ratio_mask_override():
  # trust_ratio_mask=None puts the 1-D bias under the ratio again.
  params = {"w": jnp.full((3, 1), 10.0), "b": jnp.zeros(3)}
  g = {"w": jnp.full((3, 1), 1e6), "b": jnp.full((3,), 1e6)}
  base = date_baseline(optimizer="sgd")
  for mask, want_b in ((date_optax.exclude_bias_and_norm, 1.0), (None, 1.0)):
    tx = date_optax.date(base, 4096, trust_ratio_mask=mask)
    p = params
    s = tx.init(p)
    u, s = tx.update(g, s, p)  # b = 0: ratio 1 either way
    assert float(date_optax.trust_ratios(s)["b"]) == want_b
    p = optax.apply_updates(p, u)
    _, s = tx.update(g, s, p)
    r_b = float(date_optax.trust_ratios(s)["b"])
    if mask is None:
      assert r_b < 1.0  # ‖b‖ is now small relative to ‖g_b‖
    else:
      assert r_b == 1.0


def test_date_overrides():
  base = _small_baseline(optimizer_options={"momentum": 0.9})
  params = {"w": jnp.ones((2, 2))}
  g = {"w": jnp.full((2, 2), 0.1)}
  # A different LR decay, and a learning-rate override (e.g. multi-stage).
  r = date_optax.date_recipe(base, 64, decay="cosine")
  assert r.decay == schedules.Cosine()
  tx = date_optax.date(base, 64, learning_rate=0.5, momentum=0.0)
  u, _ = tx.update(g, tx.init(params), params)
  np.testing.assert_allclose(u["w"], -0.5 * 0.1, rtol=1e-6)
  with pytest.raises(TypeError):
    date_optax.date(base, 64, not_an_option=1)
  # A baseline already on roller coaster keeps its power and floor.
  rc = _small_baseline(decay=schedules.RollerCoaster(power=2.0, floor=1e-5))
  assert date_optax.date_recipe(rc, 64).decay == schedules.RollerCoaster(2.0, 1e-5)
  # A multistep baseline gets DATE's roller coaster.
  ms = _small_baseline(decay=schedules.MultiStep(epochs=(5,)))
  assert date_optax.date_recipe(ms, 64).decay == schedules.RollerCoaster()
  # ... unless asked to keep the baseline's own decay.
  kept = date_optax.date_recipe(ms, 64, decay="baseline")
  assert kept.decay == schedules.MultiStep(epochs=(5,))
  assert date_optax.scale_recipe(ms, 64).decay == schedules.MultiStep(epochs=(5,))


def test_date_accepts_a_transform_as_base():
  base = _small_baseline(optimizer=optax.scale_by_adam(), learning_rate=2e-3,
                         optimizer_options={})
  _, loss, _, loss0 = _train(date_optax.date(base, 128), 128, 10)
  assert loss < 0.6 * loss0


def test_date_under_inject_hyperparams_and_jit():
  base = _small_baseline()
  r = date_optax.date_recipe(base, 128)
  tx = optax.inject_hyperparams(
      lambda learning_rate: date_optax.date(base, 128, learning_rate=learning_rate)
  )(learning_rate=r.schedule)
  params = {"w": jnp.ones((2, 2))}
  s = tx.init(params)
  update = jax.jit(tx.update)
  for c in range(3):
    # inject_hyperparams records the value used by update `c`.
    _, s = update({"w": jnp.ones((2, 2))}, s, params)
    np.testing.assert_allclose(s.hyperparams["learning_rate"], r.schedule(c), rtol=1e-6)
