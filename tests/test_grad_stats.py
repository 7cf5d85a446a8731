"""Gradient-noise statistics in the train steps, the AdaScale gain, adascale
and date(..., lr_scaling="gain").

References are written from the math: McCandlish et al. 2018 (appendix A)
for the estimators, closed forms of linear regression with Gaussian inputs
for their expectations, and fairscale's published AdaScale algorithm
(Johnson et al. 2020) for `adascale`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import date_optax
import date_optax.parallel as dp
from date_optax.checkpoint import CheckpointManager

D = 6


def _lsq(params, batch):
  r = batch["x"] @ params["w"] - batch["y"]
  return 0.5 * jnp.mean(r**2)


def _raw(state):
  """(|G|², tr Σ) of the last step when the step's decay is 0."""
  gs = state.grad_stats
  return float(gs.sq_norm / gs.weight), float(gs.trace_cov / gs.weight)


def test_estimators_unbiased_on_linear_regression():
  """Mean over many independent batches matches the closed forms.

  x ~ N(0, I_d), y = x·w* + ε, ε ~ N(0, s²), loss ½(x·w − y)². At w with
  δ = w − w*, one example's gradient is x(x·δ − ε): G = δ and
  E‖g‖² = (d + 2)‖δ‖² + d·s², so tr Σ = (d + 1)‖δ‖² + d·s².
  """
  rng = np.random.default_rng(0)
  w_star = rng.normal(size=(D,)).astype(np.float32)
  delta = 0.3 * rng.normal(size=(D,)).astype(np.float32)
  s = 1.5
  g2_true = float(delta @ delta)
  tr_true = (D + 1) * g2_true + D * s**2
  batch_size = 32
  step = dp.make_train_step(_lsq, optax.set_to_zero(), dp.data_mesh(),
                            grad_stats=True, grad_stats_decay=0.0)
  state = step.init({"w": w_star + delta})
  g2s, trs, naive = [], [], []
  for _ in range(400):
    x = rng.normal(size=(batch_size, D)).astype(np.float32)
    y = x @ w_star + s * rng.normal(size=batch_size).astype(np.float32)
    state, m = step(state, {"x": x, "y": y})
    g2, tr = _raw(state)
    g2s.append(g2)
    trs.append(tr)
    naive.append(float(m["grad_norm"]) ** 2)
  for est, truth in ((g2s, g2_true), (trs, tr_true)):
    mean, se = np.mean(est), np.std(est) / np.sqrt(len(est))
    assert abs(mean - truth) < 4 * se, (mean, truth, se)
  # The test has the power to see a bias of tr Σ / B: the naive ‖ḡ‖² fails it.
  se = np.std(naive) / np.sqrt(len(naive))
  assert abs(np.mean(naive) - g2_true) > 4 * se
  np.testing.assert_allclose(np.mean(naive), g2_true + tr_true / batch_size, rtol=0.1)


def _numpy_estimates(unit_grads, batch_size):
  """McCandlish et al. appendix A from the units' gradients."""
  n = len(unit_grads)
  b = batch_size / n
  s_b = np.mean([g @ g for g in unit_grads])
  mean = np.mean(unit_grads, axis=0)
  s_big = mean @ mean
  g2 = (batch_size * s_big - b * s_b) / (batch_size - b)
  tr = (s_b - s_big) / (1 / b - 1 / batch_size)
  return g2, tr


@pytest.mark.parametrize("replicas,microbatches", [(8, 1), (4, 2), (2, 4), (1, 8)])
def test_regrouping_replicas_and_microbatches_is_exact(replicas, microbatches):
  rng = np.random.default_rng(1)
  x = rng.normal(size=(64, D)).astype(np.float32)
  y = rng.normal(size=(64,)).astype(np.float32)
  w = rng.normal(size=(D,)).astype(np.float32)
  step = dp.make_train_step(_lsq, optax.set_to_zero(), dp.data_mesh(replicas),
                            microbatches=microbatches, grad_stats=True,
                            grad_stats_decay=0.0)
  state, _ = step(step.init({"w": w}), {"x": x, "y": y})
  # The same 8 units of 8 contiguous rows whatever the grouping.
  units = [xi.T @ (xi @ w - yi) / len(yi)
           for xi, yi in zip(np.split(x.astype(np.float64), 8), np.split(y, 8))]
  np.testing.assert_allclose(_raw(state), _numpy_estimates(units, 64), rtol=2e-4)


def test_pmap_and_gspmd_steps_measure_the_same():
  rng = np.random.default_rng(2)
  x = rng.normal(size=(32, D)).astype(np.float32)
  y = rng.normal(size=(32,)).astype(np.float32)
  w = np.zeros((D,), np.float32)
  base = date_optax.Baseline(batch_size=4, learning_rate=0.05, warmup_epochs=0.125,
                             epochs=8, num_examples=256)
  tx = date_optax.date(base, 32, lr_scaling="gain")
  jit_step = dp.make_train_step(_lsq, tx, dp.data_mesh(4), grad_stats=True)
  pmap_step = dp.make_pmap_train_step(_lsq, tx, devices=jax.devices()[:4],
                                      grad_stats=True)
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  gspmd_step = dp.make_train_step(_lsq, tx, mesh, grad_stats=True,
                                  param_sharding={"w": P("model")})
  states = [s.init({"w": w}) for s in (jit_step, pmap_step, gspmd_step)]
  for _ in range(3):
    outs = [s(st, {"x": x, "y": y}) for s, st in zip((jit_step, pmap_step, gspmd_step),
                                                     states)]
    states = [o[0] for o in outs]
    ref = outs[0][1]
    assert float(ref["gain"]) > 1.0
    for _, m in outs[1:]:
      for k in ("loss", "grad_noise_scale", "gain", "learning_rate"):
        np.testing.assert_allclose(float(m[k]), float(ref[k]), rtol=1e-5)
  pmap_w = np.asarray(states[1].params["w"][0])
  np.testing.assert_allclose(pmap_w, np.asarray(states[0].params["w"]), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(states[2].params["w"]),
                             np.asarray(states[0].params["w"]), rtol=1e-5)


def test_zero_gradient_stays_finite():
  step = dp.make_train_step(lambda p, b: 0.0 * jnp.sum(p["w"]) + jnp.mean(b),
                            date_optax.adascale(optax.sgd(0.1), 4), dp.data_mesh(),
                            grad_stats=True)
  state = step.init({"w": np.ones(3, np.float32)})
  for _ in range(2):
    state, m = step(state, np.ones(16, np.float32))
  assert float(m["grad_noise_scale"]) == 0.0 and float(m["gain"]) == 1.0
  assert not bool(m["skipped"])
  np.testing.assert_array_equal(state.params["w"], np.ones(3))


def test_one_unit_is_refused_and_options_checked():
  with pytest.raises(ValueError, match="microbatches=2"):
    dp.make_train_step(_lsq, optax.sgd(0.1), dp.data_mesh(1), grad_stats=True)
  with pytest.raises(ValueError, match="microbatches=2"):
    dp.make_pmap_train_step(_lsq, optax.sgd(0.1), devices=jax.devices()[:1],
                            grad_stats=True)
  with pytest.raises(ValueError, match="grad_stats_decay"):
    dp.make_train_step(_lsq, optax.sgd(0.1), dp.data_mesh(), grad_stats=True,
                       grad_stats_decay=1.0)
  with pytest.raises(ValueError, match="grad_stats_decay"):
    dp.make_train_step(_lsq, optax.sgd(0.1), dp.data_mesh(), grad_stats_decay=0.5)
  # One device with two microbatches measures.
  step = dp.make_train_step(_lsq, optax.sgd(0.1), dp.data_mesh(1), microbatches=2,
                            grad_stats=True)
  rng = np.random.default_rng(7)
  _, m = step(step.init({"w": np.ones(D, np.float32)}),
              {"x": rng.normal(size=(8, D)).astype(np.float32),
               "y": np.zeros(8, np.float32)})
  assert np.isfinite(float(m["grad_noise_scale"])) and float(m["gain"]) >= 1.0


def test_smoothed_statistics_survive_checkpoint(tmp_path):
  step = dp.make_train_step(_lsq, optax.sgd(0.01), dp.data_mesh(), grad_stats=True)
  rng = np.random.default_rng(3)
  batch = {"x": rng.normal(size=(16, D)).astype(np.float32),
           "y": rng.normal(size=(16,)).astype(np.float32)}
  state = step.init({"w": np.zeros(D, np.float32)})
  for _ in range(3):
    state, _ = step(state, batch)
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(3, state)
    restored, _ = mngr.restore(step.init({"w": np.zeros(D, np.float32)}))
  assert int(restored.grad_stats.count) == 3
  for a, b in zip(jax.tree.leaves(restored.grad_stats), jax.tree.leaves(state.grad_stats),
                  strict=True):
    np.testing.assert_array_equal(a, b)
  _, m1 = step(restored, batch)
  _, m2 = step(state, batch)
  assert float(m1["grad_noise_scale"]) == float(m2["grad_noise_scale"])


def test_debiased_moving_average_matches_numpy():
  decay = 0.9
  step = dp.make_train_step(_lsq, optax.set_to_zero(), dp.data_mesh(4),
                            grad_stats=True, grad_stats_decay=decay)
  raw = dp.make_train_step(_lsq, optax.set_to_zero(), dp.data_mesh(4),
                           grad_stats=True, grad_stats_decay=0.0)
  rng = np.random.default_rng(4)
  w = rng.normal(size=(D,)).astype(np.float32)
  s1, s0 = step.init({"w": w}), raw.init({"w": w})
  ema, weight = np.zeros(2), 0.0
  for _ in range(4):
    batch = {"x": rng.normal(size=(16, D)).astype(np.float32),
             "y": rng.normal(size=(16,)).astype(np.float32)}
    s1, m = step(s1, batch)
    s0, _ = raw(s0, batch)
    ema = decay * ema + (1 - decay) * np.array(_raw(s0))
    weight = decay * weight + (1 - decay)
  np.testing.assert_allclose(_raw(s1), ema / weight, rtol=1e-5)
  g2, tr = ema / weight
  np.testing.assert_allclose(float(m["grad_noise_scale"]), tr / g2, rtol=1e-5)
  # Default metric gain: AdaScale's gain of B over one unit (S = 4 units).
  np.testing.assert_allclose(float(m["gain"]),
                             (tr / 4 + g2) / (tr / 16 + g2), rtol=1e-5)


# ---------------------------------------------------------------------------
# The gain and adascale.


def test_gain_formula_bounds_and_identity_at_scale_one():
  stats = date_optax.GradStats(sq_norm=2.0, trace_cov=300.0, batch_size=64.0)
  b_simple = 150.0
  for s in (1.0, 2.0, 4.0, 16.0):
    b0 = 64.0 / s
    want = (1 + b_simple / b0) / (1 + b_simple / 64.0)
    np.testing.assert_allclose(float(date_optax.adascale_gain(stats, s)), want, rtol=1e-6)
  assert float(date_optax.adascale_gain(stats, 1)) == 1.0
  noisy = date_optax.GradStats(sq_norm=-1.0, trace_cov=5.0, batch_size=64.0)
  assert float(date_optax.adascale_gain(noisy, 8)) == 8.0
  assert float(date_optax.noise_scale(noisy)) == np.inf
  clean = date_optax.GradStats(sq_norm=1.0, trace_cov=-5.0, batch_size=64.0)
  assert float(date_optax.adascale_gain(clean, 8)) == 1.0
  with pytest.raises(ValueError, match="scale"):
    date_optax.adascale(optax.sgd(0.1), 0.5)


def _fairscale_reference(grads, scale, smoothing, lr_fn, momentum):
  """fairscale.optim.AdaScale (debias_ewma=True) over torch.optim.SGD, in NumPy.

  grads[t][i] is the gradient of worker i at step t; the parameters' update
  is SGD with PyTorch momentum (buf = μ·buf + ḡ; p -= lr·buf).
  """
  n = grads.shape[1]
  theta = smoothing**scale
  avg = {"sqr": [0.0, 0.0], "var": [0.0, 0.0]}  # (biased, unbias)
  p = np.zeros(grads.shape[2])
  buf = np.zeros_like(p)
  tau, out = 0.0, []
  for t in range(len(grads)):
    local = np.sum([g @ g for g in grads[t]])
    mean = grads[t].mean(axis=0)
    total = mean @ mean
    var = local * (scale / n) / (n - 1) - total * scale / (n - 1)
    sqr = total - var / scale
    var, sqr = max(var, 1e-6), max(sqr, 0.0)
    for name, v in (("sqr", sqr), ("var", var)):
      biased, unbias = avg[name]
      avg[name] = [theta * biased + (1 - theta) * v, theta * unbias + (1 - theta)]
    v = avg["var"][0] / avg["var"][1]
    s = avg["sqr"][0] / avg["sqr"][1]
    gain = (v + s) / (v / scale + s)
    lr = gain * lr_fn(tau)
    buf = momentum * buf + mean
    p = p - lr * buf
    tau += gain
    out.append((p.copy(), gain, tau))
  return out


@pytest.mark.parametrize("scale", [4.0, 2.0])
def test_adascale_matches_fairscale_reference(scale):
  rng = np.random.default_rng(5)
  workers, steps = 4, 6
  signal = rng.normal(size=(steps, 1, D))
  grads = signal + 0.7 * rng.normal(size=(steps, workers, D))
  lr_fn = lambda tau: 0.1 / (1.0 + 0.05 * tau)  # noqa: E731
  smoothing = 1 - workers / 1000

  # Each worker's slice is 2 identical rows g; loss mean(x·w) has gradient g.
  def loss_fn(params, batch):
    return jnp.mean(batch @ params["w"])

  tx = date_optax.adascale(optax.sgd(1.0, momentum=0.9), scale,
                           learning_rate=lambda tau: 0.1 / (1.0 + 0.05 * tau))
  step = dp.make_train_step(loss_fn, tx, dp.data_mesh(workers), grad_stats=True,
                            grad_stats_decay=smoothing**scale)
  state = step.init({"w": np.zeros(D, np.float32)})
  ref = _fairscale_reference(grads, scale, smoothing, lr_fn, 0.9)
  for t in range(steps):
    batch = np.repeat(grads[t], 2, axis=0).astype(np.float32)
    state, m = step(state, batch)
    p, gain, tau = ref[t]
    np.testing.assert_allclose(float(m["gain"]), gain, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(state.params["w"]), p, rtol=1e-4, atol=1e-6)
    adastate = date_optax.AdaScaleState(*state.opt_state)
    np.testing.assert_allclose(float(adastate.clock), tau, rtol=1e-5)


def test_adascale_without_statistics_names_grad_stats():
  tx = date_optax.adascale(optax.sgd(0.1), 4)
  params = {"w": jnp.ones(2)}
  with pytest.raises(ValueError, match="grad_stats"):
    tx.update({"w": jnp.ones(2)}, tx.init(params), params)


# ---------------------------------------------------------------------------
# date(..., lr_scaling="gain").


def _baseline(optimizer="momentum", **kw):
  opts = {"momentum": 0.9} if optimizer == "momentum" else {}
  return date_optax.Baseline(batch_size=16, learning_rate=0.05, warmup_epochs=0.05,
                             epochs=4, num_examples=4096, optimizer=optimizer,
                             optimizer_options=opts, **kw)


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_date_gain_at_scale_one_is_the_baseline_step_by_step(optimizer):
  base = _baseline(optimizer)
  tx = date_optax.date(base, 16, lr_scaling="gain")
  ref = base.solver()
  rng = np.random.default_rng(6)
  params = {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
            "b": jnp.zeros(4)}
  p1, p2 = params, params
  s1, s2 = tx.init(params), ref.init(params)
  stats = date_optax.GradStats(sq_norm=1.0, trace_cov=500.0, batch_size=16.0)
  for _ in range(5):
    g = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32),
                     params)
    u1, s1 = tx.update(g, s1, p1, grad_stats=stats)
    u2, s2 = ref.update(g, s2, p2)
    p1, p2 = optax.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2), strict=True):
      np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("optimizer,power", [("momentum", 1.0), ("adam", 0.5)])
def test_date_gain_multiplies_the_recipe_by_the_gain(optimizer, power):
  """Against date(lr_scaling="none") with the same bounds, times r**power."""
  base = _baseline(optimizer)
  k = 16
  m = k**power
  tx = date_optax.date(base, 16 * k, lr_scaling="gain", gain_clock="steps")
  ref = date_optax.date(base, 16 * k, lr_scaling="none", lower=1 / m, upper=1.0)
  stats = date_optax.GradStats(sq_norm=1.0, trace_cov=64.0, batch_size=256.0)
  r = (1 + 64 / 16) / (1 + 64 / 256)
  params = {"w": jnp.ones((3, 4)), "b": jnp.zeros(4)}
  g = {"w": jnp.full((3, 4), 0.5), "b": jnp.ones(4)}
  s1, s2 = tx.init(params), ref.init(params)
  for _ in range(3):
    u1, s1 = tx.update(g, s1, params, grad_stats=stats)
    u2, s2 = ref.update(g, s2, params)
    for a, b in zip(jax.tree.leaves(u1), jax.tree.leaves(u2), strict=True):
      np.testing.assert_allclose(a, b * r**power, rtol=1e-6)
  assert float(s1.gain) == pytest.approx(r)


def test_date_gain_needs_statistics_and_a_larger_batch():
  base = _baseline()
  tx = date_optax.date(base, 64, lr_scaling="gain")
  params = {"w": jnp.ones((2, 2))}
  with pytest.raises(ValueError, match="grad_stats"):
    tx.update({"w": jnp.ones((2, 2))}, tx.init(params), params)
  with pytest.raises(ValueError, match="batch_size"):
    date_optax.date(base, 8, lr_scaling="gain")


# ---------------------------------------------------------------------------
# The critical batch.


def test_critical_batch_from_state_stats_and_metrics():
  from date_optax.diagnostics import FAR_FACTOR, critical_batch

  assert critical_batch([1.0, 2.0, 100.0, 200.0, 300.0]) == 200.0
  assert critical_batch([{"grad_noise_scale": v} for v in (5.0, 7.0, 9.0, 11.0)]) == 10.0
  assert critical_batch([1.0, float("nan"), 40.0, float("inf")], discard=0.25) == np.inf
  stats = date_optax.GradStats(sq_norm=0.25, trace_cov=20.0, batch_size=16.0)
  assert critical_batch(stats) == 80.0
  step = dp.make_train_step(_lsq, optax.set_to_zero(), dp.data_mesh(), grad_stats=True)
  rng = np.random.default_rng(8)
  state = step.init({"w": np.ones(D, np.float32)})
  values = []
  for _ in range(5):
    state, m = step(state, {"x": rng.normal(size=(16, D)).astype(np.float32),
                            "y": rng.normal(size=(16,)).astype(np.float32)})
    values.append(float(m["grad_noise_scale"]))
  np.testing.assert_allclose(critical_batch(state.grad_stats), values[-1], rtol=1e-5)
  with pytest.raises(ValueError, match="grad_noise_scale"):
    critical_batch([])
  with pytest.raises(TypeError, match="measurements"):
    critical_batch("300")
  assert FAR_FACTOR == 8.0


def test_recipe_and_date_warn_far_beyond_the_critical_batch():
  base = _baseline()
  with pytest.warns(UserWarning, match="critical batch 20"):
    date_optax.scale_recipe(base, 256, critical_batch=20.0)
  with pytest.warns(UserWarning, match="critical batch 20"):
    date_optax.date(base, 256, critical_batch=20.0)
  import warnings

  with warnings.catch_warnings():
    warnings.simplefilter("error")
    date_optax.scale_recipe(base, 160, critical_batch=20.0)  # 8x: not beyond
    date_optax.date(base, 256, critical_batch=float("inf"))
  with pytest.raises(ValueError, match="critical_batch"):
    date_optax.scale_recipe(base, 256, critical_batch=-1.0)


def test_recipe_cli_prints_the_critical_batch(capsys):
  from date_optax._src import cli

  assert cli.main(["recipe", "--preset", "date-example", "--critical-batch", "500"]) == 0
  out = capsys.readouterr().out
  assert "critical batch 500" in out and "far beyond it: 8192" in out


def test_date_gain_clock_runs_the_baseline_schedule_on_the_gain_clock():
  """lr_t = r·η_B0(τ_t), τ_{t+1} = τ_t + r, over the unit-rate DATE solver."""
  base = _baseline()
  k = 16
  tx = date_optax.date(base, 16 * k, lr_scaling="gain", gain_clock="gain")
  ref = date_optax.date(base, 16 * k, lr_scaling="none", lower=1 / k, upper=1.0,
                        learning_rate=1.0)
  sched = date_optax.date_recipe(base, 16).schedule  # the baseline's, in B0 steps
  stats = date_optax.GradStats(sq_norm=1.0, trace_cov=64.0, batch_size=256.0)
  r = (1 + 64 / 16) / (1 + 64 / 256)
  params = {"w": jnp.ones((3, 4)), "b": jnp.zeros(4)}
  g = {"w": jnp.full((3, 4), 0.5), "b": jnp.ones(4)}
  s1, s2 = tx.init(params), ref.init(params)
  tau = 0.0
  for _ in range(4):
    u1, s1 = tx.update(g, s1, params, grad_stats=stats)
    u2, s2 = ref.update(g, s2, params)
    lr = r * float(sched(tau))
    for a, b in zip(jax.tree.leaves(u1), jax.tree.leaves(u2), strict=True):
      np.testing.assert_allclose(a, b * lr, rtol=1e-5)
    tau += r
    np.testing.assert_allclose(float(s1.clock), tau, rtol=1e-6)
  with pytest.raises(ValueError, match="gain_clock"):
    date_optax.date(base, 64, lr_scaling="gain", gain_clock="epochs")


@pytest.mark.parametrize("options", [
    {"shard_update": True}, {"grad_reduce": "ring"}, {"comm_dtype": "bfloat16"},
    {"comm_dtype": "int8"}, {"grad_reduce": "ring", "comm_dtype": "int4",
                             "error_feedback": True},
    {"grad_reduce": "two_shot", "comm_dtype": "int4", "shard_update": True}])
def test_statistics_agree_across_step_options(options):
  # The parameter is one vector, whose random-sign sketch has the vector's
  # own norm: under a lossy payload the statistics are then exactly those
  # of the uncompressed gradients (before, the compressed mean's rounding
  # entered S_B).
  rng = np.random.default_rng(9)
  x = rng.normal(size=(64, D)).astype(np.float32)
  y = (x @ np.ones(D) + rng.normal(size=64)).astype(np.float32)
  ms = []
  for kw in ({}, options):
    step = dp.make_train_step(_lsq, optax.sgd(0.1), dp.data_mesh(), grad_stats=True, **kw)
    _, m = step(step.init({"w": np.zeros(D, np.float32)}), {"x": x, "y": y})
    ms.append(m)
  for k in ("grad_noise_scale", "gain"):
    np.testing.assert_allclose(float(ms[1][k]), float(ms[0][k]), rtol=1e-5)


def test_sketch_is_linear_and_its_squared_norm_unbiased():
  from date_optax._src.parallel.step import grad_stats as gs_lib  # noqa: PLC0415

  rng = np.random.default_rng(3)
  shapes = {"k": (5, 7), "conv": (3, 2, 4), "bias": (6,), "scale": ()}
  a = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
  b = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
  exact = sum(float(np.sum(v.astype(np.float64) ** 2)) for v in a.values())
  sk = jax.jit(jax.vmap(gs_lib.sketch, in_axes=(None, 0)))
  steps = jnp.arange(4000)
  est = np.sum(np.square(np.asarray(sk(a, steps), np.float64)), axis=1)
  assert sk(a, steps).shape == (4000, 6 + 4 + 7 + 1)
  mean, se = est.mean(), est.std() / np.sqrt(len(est))
  assert abs(mean - exact) < 4 * se and se < 0.02 * exact, (mean, exact, se)
  # Leaves of one axis and scalars are kept whole: their part is exact
  # (leaves in key order: bias 6, conv 4, k 7, scale 1).
  one = np.asarray(gs_lib.sketch(a, jnp.int32(7)))
  np.testing.assert_allclose(np.abs(one[:6]), np.abs(a["bias"]), rtol=1e-6)
  np.testing.assert_allclose(one[17], a["scale"], rtol=1e-6)
  # The same signs for the same step: the sketch of a mean is the mean of sketches.
  mean_tree = jax.tree.map(lambda u, v: (u + v) / 2, a, b)
  np.testing.assert_allclose(
      gs_lib.sketch(mean_tree, jnp.int32(5)),
      (gs_lib.sketch(a, jnp.int32(5)) + gs_lib.sketch(b, jnp.int32(5))) / 2,
      rtol=1e-5, atol=1e-6)
  assert not np.allclose(gs_lib.sketch(a, jnp.int32(5)), gs_lib.sketch(a, jnp.int32(6)))


def test_sketch_signs_are_balanced_uncorrelated_and_need_no_buffer():
  """The hashed signs: half of them negative, two entries' signs (adjacent,
  or a row apart) uncorrelated over steps, and no leaf-sized buffer of
  random bits (an RNG's uint32 bits took 3.9 times the gradient's bytes
  of temporary memory on the CPU compiler)."""
  from date_optax._src.parallel.step import grad_stats as gs_lib  # noqa: PLC0415

  # The sketch of a one-hot leaf reads the sign of that entry.
  def signs(step, shape=(64, 3)):
    eye = jnp.eye(shape[0] * shape[1], dtype=jnp.float32).reshape(-1, *shape)
    return jax.vmap(lambda e: gs_lib.sketch({"w": e}, step))(eye)  # [entries, 3]

  per_step = np.asarray(jax.jit(jax.vmap(signs))(jnp.arange(300))).sum(axis=2)
  assert set(np.unique(per_step)) == {-1.0, 1.0}
  assert abs(per_step.mean()) < 0.02  # 57,600 signs: 4 standard errors
  corr = (per_step.T @ per_step) / len(per_step)  # entries x entries
  off = corr[~np.eye(len(corr), dtype=bool)]
  # 300 steps: each correlation has a standard error of 1/sqrt(300) = 0.058.
  assert abs(off.mean()) < 0.005 and np.abs(off).max() < 6 / np.sqrt(300)
  assert abs(np.mean(np.diag(corr, 1))) < 0.03 and abs(np.mean(np.diag(corr, 3))) < 0.03
  leaf = jax.ShapeDtypeStruct((2048, 2048), jnp.float32)
  compiled = jax.jit(gs_lib.sketch).lower({"w": leaf}, jnp.int32(0)).compile()
  assert compiled.memory_analysis().temp_size_in_bytes < 1.5 * 2048 * 2048 * 4


@pytest.mark.parametrize("builder", [
    "mesh", "sharded",
    # ~30 s; test_pmap_and_gspmd_steps_measure_the_same ties pmap to the mesh.
    pytest.param("pmap", marks=pytest.mark.slow)])
def test_statistics_under_a_low_bit_sync_read_the_uncompressed_mean(builder):
  """S_B under a 4-bit sync with error feedback: measured on the replicas'
  uncompressed gradients (a random-sign sketch), not on the compressed mean.
  (The int4 psum with APS: the step reads the sketch whenever the sync is
  lossy, whatever its algorithm, and the ring's unrolled hops would take most
  of the test's time to compile.)

  The same batch every step and no update: the float32 step's S_B is the
  exact ‖ḡ‖². The low-bit step's per-step S_B (= |G|² + tr Σ / B from its
  raw estimates) must average to it, while the compressed mean's squared
  norm, which S_B was before, sits many standard errors above it.
  """
  params, batch = _mlp_problem(16, 64, 4)
  low = {"grad_reduce": "psum", "comm_dtype": "int4", "error_feedback": True}

  def build(**kw):
    opts = dict(grad_stats=True, grad_stats_decay=0.0, **kw)
    if builder == "pmap":
      return dp.make_pmap_train_step(_mlp, optax.set_to_zero(), **opts)
    if builder == "sharded":
      mesh = jax.make_mesh((4, 2), ("data", "model"),
                           axis_types=(jax.sharding.AxisType.Auto,) * 2)
      return dp.make_train_step(_mlp, optax.set_to_zero(), mesh, **opts,
                                param_sharding=[(".*/kernel", P(None, "model"))])
    return dp.make_train_step(_mlp, optax.set_to_zero(), dp.data_mesh(), **opts)

  def s_big(state):  # a pmap state carries a device axis
    gs = jax.tree.map(lambda x: np.asarray(x).reshape(-1)[0], state.grad_stats)
    return float((gs.sq_norm + gs.trace_cov / 64) / gs.weight)

  def place(step):  # the pmap step splits the global batch itself
    return batch if builder == "pmap" else step.shard_batch(batch)

  exact_step = build()
  state, m = exact_step(exact_step.init(params), place(exact_step))
  exact = s_big(state)
  np.testing.assert_allclose(exact, float(m["grad_norm"]) ** 2, rtol=1e-5)
  step = build(**low)
  state = step.init(params)
  shaped = place(step)
  est, compressed = [], []
  for _ in range(150):
    state, m = step(state, shaped)
    est.append(s_big(state))
    compressed.append(float(m["grad_norm"]) ** 2)
  se = np.std(est) / np.sqrt(len(est))
  assert abs(np.mean(est) - exact) < 4 * se, (np.mean(est), exact, se)
  assert np.mean(compressed) - exact > 6 * se, (np.mean(compressed), exact, se)


def _mlp_problem(d_in, width, d_out, rows=64):
  """`_mlp`'s parameters (scaled normal kernels, zero biases) and a normal batch."""
  rng = np.random.default_rng(0)
  dims = {"layer0": (d_in, width), "layer1": (width, width), "head": (width, d_out)}
  params = {k: {"kernel": rng.normal(size=s).astype(np.float32) / np.sqrt(s[0]),
                "bias": np.zeros(s[1], np.float32)} for k, s in dims.items()}
  batch = {"x": rng.normal(size=(rows, d_in)).astype(np.float32),
           "y": rng.normal(size=(rows, d_out)).astype(np.float32)}
  return params, batch


def _mlp(params, batch):
  h = batch["x"]
  for name in ("layer0", "layer1"):
    h = jax.nn.gelu(h @ params[name]["kernel"] + params[name]["bias"])
  return jnp.mean((h @ params["head"]["kernel"] - batch["y"]) ** 2)


def test_statistics_on_the_sharded_mesh_cost_little_memory_traffic():
  # On a (4, 2) mesh with model-sharded kernels the replicas' gradients are
  # laid out as their parameters behind the replica axis, so GSPMD keeps
  # them sharded through the mean; left to propagation it gathered
  # activations over "model" instead (1.19x the bytes of the step without
  # statistics, 1.07x with the layout).
  params, batch = _mlp_problem(64, 256, 8)
  mesh = jax.make_mesh((4, 2), ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  nbytes = {}
  for on in (False, True):
    step = dp.make_train_step(_mlp, date_optax.lamb(1e-3), mesh, grad_stats=on,
                              param_sharding=[(".*/kernel", P("model", None))])
    compiled = step.lower(step.init(params), step.shard_batch(batch)).compile()
    cost = compiled.cost_analysis()
    nbytes[on] = (cost[0] if isinstance(cost, list) else cost)["bytes accessed"]
  assert nbytes[True] <= 1.12 * nbytes[False], nbytes
