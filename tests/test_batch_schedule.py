"""BatchSchedule: decisions against references written from the math, the
growing step (programs, exact resume) and the errors of bad input."""

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import date_optax
import date_optax.parallel as dp
from date_optax import BatchSchedule
from date_optax.checkpoint import CheckpointManager

# ---------------------------------------------------------------------------
# References from the math (SPEC §11), not from the implementation.


def ramp_reference(start, increment, ramp_examples, max_batch, consumed):
  """Megatron-LM: start + floor(consumed / per_increment) * increment, capped,
  with per_increment = ramp_examples / ((max_batch - start) / increment)."""
  per_increment = Fraction(ramp_examples) / Fraction(max_batch - start, increment)
  steps = int(Fraction(consumed) / per_increment)  # floor: both are >= 0
  return min(start + steps * increment, max_batch)


def adaptive_reference(noise_scales, *, start, max_batch, factor, threshold,
                       min_steps, lag, calibration, hold_examples=0,
                       guard_margin=np.inf, losses=None, skipped=None, decay=0.9):
  """The batch of every step of the adaptive rule. The trigger holds on a
  step when a finite calibration * B_simple >= threshold * B (an infinite or
  NaN measurement never triggers), the step was not skipped and the loss's
  recent average (half-life hold_examples) is at most its long average
  (decay per `start` examples) plus guard_margin times its size. The batch grows by
  `factor` when the trigger has held on consecutive steps whose batches add
  up to hold_examples or more, one change pending at a time, each change
  `lag` steps after the step that decided it and at least `min_steps`
  steps, skipped ones not counted, after the previous change; never above
  max_batch. A growth starts the stretch again at the step the batch
  changes: the lag steps between a decision and its change, still at the
  old batch, count towards nothing."""
  n = len(noise_scales)
  losses = np.ones(n) if losses is None else losses
  skipped = np.zeros(n, bool) if skipped is None else skipped
  batch, last_change, pending, out = start, 0, None, []
  held, recent, long_ = 0, np.nan, np.nan
  for t, ns in enumerate(noise_scales):
    if pending is not None and pending[1] == t:
      if pending[0] != batch:
        last_change = t
      batch, pending = pending[0], None
    out.append(batch)
    if skipped[t]:
      last_change += 1
    elif np.isfinite(losses[t]):
      dr = 0.5 ** (batch / hold_examples) if hold_examples else 0.0
      recent = losses[t] if np.isnan(recent) else dr * recent + (1 - dr) * losses[t]
      d = decay ** (batch / start)
      long_ = losses[t] if np.isnan(long_) else d * long_ + (1 - d) * losses[t]
    calm = guard_margin == np.inf or recent - long_ <= guard_margin * abs(long_)
    trigger = (np.isfinite(ns) and calibration * ns >= threshold * batch
               and not skipped[t] and calm)
    held = held + batch if trigger and pending is None else 0
    effect = t + 1 + lag
    if (pending is None and batch < max_batch and trigger and held >= hold_examples
        and effect - last_change >= min_steps):
      pending = (min(factor * batch, max_batch), effect)
      held = 0
  return out


@pytest.mark.parametrize("start,increment,ramp_examples,max_batch", [
    (16, 16, 480, 64), (32, 32, 1000, 128), (8, 24, 7777, 80), (4, 4, 5, 64),
])
def test_ramp_matches_megatron(start, increment, ramp_examples, max_batch):
  s = BatchSchedule.ramp(start, increment, ramp_examples, max_batch=max_batch)
  for consumed in list(range(0, 2 * ramp_examples, 7)) + [ramp_examples, 10**9]:
    assert s.batch_size_at(consumed) == ramp_reference(
        start, increment, ramp_examples, max_batch, consumed)


def doubling_reference(start, ramp_examples, max_batch, factor, consumed):
  """The batch doubles (x factor) at each of m equal shares of ramp_examples,
  m = log_factor(max_batch / start); max_batch from ramp_examples on."""
  m = round(np.log(max_batch / start) / np.log(factor))
  share = Fraction(ramp_examples, m)
  return min(start * factor ** int(Fraction(consumed) / share), max_batch)


@pytest.mark.parametrize("start,ramp_examples,max_batch,factor", [
    (16, 480, 1024, 2), (8, 1000, 8 * 27, 3), (4, 7, 64, 2), (32, 999, 64, 2),
])
def test_doubling_matches_reference(start, ramp_examples, max_batch, factor):
  s = BatchSchedule.doubling(start, ramp_examples, max_batch=max_batch, factor=factor)
  for consumed in list(range(0, 2 * ramp_examples, 3)) + [ramp_examples, 10**9]:
    assert s.batch_size_at(consumed) == doubling_reference(
        start, ramp_examples, max_batch, factor, consumed), consumed
  assert BatchSchedule.from_spec(s.init().spec) == s


def test_fixed_and_sizes():
  assert BatchSchedule.fixed(48).batch_size_at(10**6) == 48
  assert BatchSchedule.ramp(16, 16, 480, max_batch=64).batch_sizes == (16, 32, 48, 64)
  assert BatchSchedule.adaptive(8, max_batch=8 * 3**3, factor=3).batch_sizes == (
      8, 24, 72, 216)


def _simulate_device(schedule, noise_scales, losses=None, skipped=None, decay=0.9):
  """Runs `schedule.update` under jit with the host tracker's lagged reads."""
  update = jax.jit(schedule.update, static_argnums=2, static_argnames="decay")
  n = len(noise_scales)
  losses = np.ones(n, np.float32) if losses is None else losses
  skipped = np.zeros(n, bool) if skipped is None else skipped
  state, batches, decisions = schedule.init(), [], []
  batch, nb, ns = schedule.start, schedule.start, 0
  for t, noise in enumerate(noise_scales):
    # What the host knows at step t: decisions of steps <= t - 1 - lag.
    seen = [d for s, d in decisions if s <= t - 1 - schedule.lag]
    if seen:
      nb, ns = seen[-1]
    batch = nb if t >= ns else batch
    batches.append(batch)
    state = update(state, jnp.int32(t), batch, jnp.float32(noise),
                   loss=jnp.float32(losses[t]), skipped=jnp.asarray(skipped[t]),
                   decay=decay ** (batch / schedule.start))
    decisions.append((t, (int(state.next_batch), int(state.next_step))))
  return batches, state


@pytest.mark.parametrize("seed", range(6))
def test_adaptive_matches_reference(seed):
  rng = np.random.default_rng(seed)
  kw = dict(start=8, max_batch=8 * 2**int(rng.integers(1, 5)), factor=2,
            threshold=float(rng.choice([1.0, 2.0, 3.0])),
            min_steps=int(rng.integers(3, 8)), lag=int(rng.integers(1, 3)),
            calibration=float(rng.choice([1.0, 10.0])), hold_examples=0,
            guard_margin=np.inf)
  kw["min_steps"] = max(kw["min_steps"], kw["lag"] + 1)
  # A noise scale that grows during training, with noise (and inf/NaN).
  ns = np.exp(np.linspace(1, 7, 80) + rng.normal(0, 0.5, 80)).astype(np.float32)
  ns[5], ns[9] = np.inf, np.nan
  schedule = BatchSchedule.adaptive(**kw)
  batches, state = _simulate_device(schedule, ns)
  want = adaptive_reference(ns.astype(np.float64), **kw)
  assert batches == want
  assert state.num_examples() == sum(want)
  assert sorted(set(want)) == [b for b in schedule.batch_sizes if b <= max(want)]
  assert all(b2 >= b1 for b1, b2 in zip(want, want[1:]))  # never shrinks


@pytest.mark.parametrize("seed", range(6))
def test_adaptive_stretch_guard_and_skips_match_reference(seed):
  # The stretch (hold_examples), the runaway guard on a noisy loss with
  # bursts, and skipped steps, against the reference written from the rule.
  rng = np.random.default_rng(100 + seed)
  kw = dict(start=8, max_batch=8 * 2**int(rng.integers(2, 5)), factor=2,
            threshold=float(rng.choice([1.0, 2.0])), min_steps=int(rng.integers(2, 6)),
            lag=1, calibration=1.0, hold_examples=int(rng.choice([0, 8, 24, 40])),
            guard_margin=float(rng.choice([0.05, 0.2])))
  n = 120
  ns = np.exp(np.linspace(2, 8, n) + rng.normal(0, 0.3, n)).astype(np.float32)
  losses = (2.0 * np.exp(-np.arange(n) / 60) * (1 + rng.normal(0, 0.05, n)))
  burst = int(rng.integers(20, 70))
  losses[burst:burst + 15] *= np.linspace(1.5, 3.0, 15)  # an instability
  losses = losses.astype(np.float32)
  skipped = rng.random(n) < 0.08
  losses[skipped] = np.nan
  schedule = BatchSchedule.adaptive(**kw)
  batches, state = _simulate_device(schedule, ns, losses, skipped, decay=0.9)
  want = adaptive_reference(ns.astype(np.float64), losses=losses.astype(np.float64),
                            skipped=skipped, decay=0.9, **kw)
  assert batches == want
  assert state.num_examples() == sum(want)
  skipped_examples = sum(b for b, s in zip(want, skipped) if s)
  assert list(np.asarray(state.skipped)) == [0, skipped_examples]


def test_stretch_counts_only_steps_at_the_new_batch():
  # Issue 56: adaptive(8, max 64, hold 32, lag 2, min_steps 3) with the
  # trigger on at every step. After the decision to grow from 8, two steps
  # still run at 8; they must not count towards the growth from 16, which
  # needs 32 examples (two steps) at 16 before it is decided.
  sched = BatchSchedule.adaptive(8, max_batch=64, hold_examples=32, lag=2, min_steps=3)
  batches, _ = _simulate_device(sched, np.full(40, 1e9, np.float32))
  assert batches[-1] == 64
  for new in (16, 32, 64):
    first = batches.index(new)
    decision = first - 1 - sched.lag
    old = batches[decision]
    stretch = [b for b in batches[:decision + 1] if b == old]
    assert sum(stretch) >= 32, (new, batches)
  # 8 x 4 steps, decided at step 3; 16 from step 6, decided at step 7 (its
  # second step at 16); 32 from step 10.
  assert batches[:11] == [8] * 6 + [16] * 4 + [32]


def test_guard_holds_growth_while_the_loss_runs_away():
  # The trigger holds at every step (a huge noise scale); the loss climbs
  # over steps 30-45: no growth is decided there, and growth resumes once
  # the recent average is back under the long one.
  n, ns = 120, np.full(120, 1e9, np.float32)
  losses = np.ones(n, np.float32)
  losses[30:45] = np.linspace(1.2, 4.0, 15)
  kw = dict(max_batch=8 * 2**8, min_steps=6, lag=1, hold_examples=8)
  batches, _ = _simulate_device(BatchSchedule.adaptive(8, **kw), ns, losses, decay=0.999)
  assert batches[33] < batches[-1]
  frozen = batches[33:47]
  assert len(set(frozen)) == 1, frozen
  off = BatchSchedule.adaptive(8, guard_margin=math.inf, **kw)
  # Up to step 47 only (the run is causal): fewer batch sizes, fewer programs.
  unguarded, _ = _simulate_device(off, ns[:47], losses[:47], decay=0.999)
  assert len(set(unguarded[33:47])) > 1


@pytest.mark.parametrize("make,match", [
    (lambda: BatchSchedule.ramp(16, 10, 100, max_batch=64), "multiple of increment"),
    (lambda: BatchSchedule.ramp(16, 16, 0, max_batch=64), "ramp_examples"),
    (lambda: BatchSchedule.adaptive(16, max_batch=48), "power of factor"),
    (lambda: BatchSchedule.adaptive(16, max_batch=64, lag=3, min_steps=2), "min_steps"),
    (lambda: BatchSchedule.adaptive(16, max_batch=64, threshold=0), "threshold"),
    (lambda: BatchSchedule.adaptive(16, max_batch=8), "max_batch"),
    (lambda: BatchSchedule.fixed(0), "start"),
    (lambda: BatchSchedule.doubling(16, 100, max_batch=96), "power of factor"),
    (lambda: BatchSchedule.doubling(16, 0, max_batch=64), "ramp_examples"),
])
def test_bad_schedules(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_bad_types():
  with pytest.raises(TypeError, match="factor"):
    BatchSchedule.adaptive(16, max_batch=64, factor=2.0)
  with pytest.raises(TypeError, match="batch_schedule"):
    dp.make_train_step(_loss, optax.sgd(0.1), dp.data_mesh(), batch_schedule=64)


def test_ramp_longer_than_run():
  s = BatchSchedule.ramp(16, 16, 5000, max_batch=64)
  with pytest.raises(ValueError, match="longer than the run"):
    s.check_run(4000)
  s.check_run(5000)
  d = BatchSchedule.doubling(16, 5000, max_batch=64)
  with pytest.raises(ValueError, match="longer than the run"):
    d.check_run(4999)


# ---------------------------------------------------------------------------
# The growing step.


def _loss(params, batch):
  return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)


def _batch(step_index, size):
  rng = np.random.default_rng(step_index)
  x = rng.normal(size=(size, 3)).astype(np.float32)
  y = x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + rng.normal(
      0, 0.5, (size, 1)).astype(np.float32)
  return {"x": x, "y": y}


def _run(step, state, steps, start=0):
  sizes, losses = [], []
  for i in range(start, start + steps):
    b = step.next_batch_size(state)
    state, metrics = step(state, _batch(i, b))
    sizes.append(int(metrics["batch_size"]))
    losses.append(float(metrics["loss"]))
  return state, sizes, losses


def test_bad_step_inputs():
  mesh = dp.data_mesh()
  # Rows first: the rule guarantees a split, the microbatch shape is not fixed.
  with pytest.raises(ValueError, match="max_batch=100 must be a multiple of the 8 data "
                     r"replicas x 2 microbatch rows \(= 16\), the first batch's rows per "
                     "device and microbatch: .* within max_rows_per_device .* rows first"):
    dp.make_train_step(_loss, optax.sgd(0.1), mesh,
                       batch_schedule=BatchSchedule.ramp(16, 12, 100, max_batch=100))
  with pytest.raises(ValueError, match="grad_stats=True"):
    dp.make_train_step(_loss, optax.sgd(0.1), mesh,
                       batch_schedule=BatchSchedule.adaptive(16, max_batch=64))
  with pytest.raises(ValueError, match="start=12 must split over the 8"):
    dp.make_train_step(_loss, optax.sgd(0.1), mesh,
                       batch_schedule=BatchSchedule.fixed(12))


def test_ramp_step_sizes_programs_and_wrong_batch():
  sched = BatchSchedule.ramp(16, 16, 240, max_batch=64)
  step = dp.make_train_step(_loss, optax.sgd(0.05), dp.data_mesh(), batch_schedule=sched)
  state = step.init({"w": np.zeros((3, 1), np.float32)})
  state, sizes, _ = _run(step, state, 12)
  consumed = np.concatenate([[0], np.cumsum(sizes)[:-1]])
  assert sizes == [ramp_reference(16, 16, 240, 64, int(c)) for c in consumed]
  assert step.traces == len(sched.batch_sizes) == 4  # one program per batch size
  assert state.batch_schedule.num_examples() == sum(sizes)
  assert int(state.batch_schedule.last_change) == sizes.index(64)
  with pytest.raises(ValueError, match="asks for a global batch of 64"):
    step(state, _batch(0, 32))


def _rows_first_reference(batch, replicas, min_microbatches, cap):
  """The microbatches rows-first gives: the fewest >= the minimum that divide
  a device's rows into pieces of at most `cap` (None: no cap)."""
  rows = batch // replicas
  cap = rows if cap is None else cap
  return min(m for m in range(min_microbatches, rows + 1) if rows % m == 0 and rows // m <= cap)


@pytest.mark.parametrize("cap", [None, 2, 1])
def test_growing_step_equals_fixed_step_at_each_size(cap):
  """Rows first: the step at batch B runs each device's B/8 rows in the fewest
  microbatches of at most `cap` rows, and equals the plain step with them."""
  sched = BatchSchedule.ramp(8, 8, 16, max_batch=32)
  params = {"w": np.ones((3, 1), np.float32)}
  grow = dp.make_train_step(_loss, optax.sgd(0.05), dp.data_mesh(), batch_schedule=sched,
                            donate=False, max_rows_per_device=cap)
  state = grow.init(params)
  seen = set()
  for i in range(4):
    b = grow.next_batch_size(state)
    k = _rows_first_reference(b, 8, 1, cap)
    assert grow.microbatches_for(b) == k
    seen.add((b, k))
    plain = dp.make_train_step(_loss, optax.sgd(0.05), dp.data_mesh(), donate=False,
                               microbatches=k)
    ref = plain.init(jax.device_get(state.params))
    ref, m_ref = plain(ref, _batch(i, b))
    state, m = grow(state, _batch(i, b))
    np.testing.assert_array_equal(np.asarray(state.params["w"]), np.asarray(ref.params["w"]))
    assert float(m["loss"]) == float(m_ref["loss"])
  # No cap: one microbatch at every size (each core's rows grow); cap 1: one
  # row per microbatch, accumulated (the layout before rows first).
  expected = {None: {(8, 1), (16, 1), (24, 1)}, 2: {(8, 1), (16, 1), (24, 2)},
              1: {(8, 1), (16, 2), (24, 3)}}[cap]
  assert seen <= expected | {(32, _rows_first_reference(32, 8, 1, cap))} and len(seen) >= 3


def test_rows_first_keeps_the_minimum_microbatches_and_refuses_a_small_cap():
  sched = BatchSchedule.doubling(32, 64, max_batch=128)
  step = dp.make_train_step(_loss, optax.sgd(0.05), dp.data_mesh(), batch_schedule=sched,
                            microbatches=2, max_rows_per_device=4)
  # 32 rows: 4 per device in 2 microbatches of 2; 64: 8 per device in 2 of 4;
  # 128: 16 per device, 4 of 4.
  assert [step.microbatches_for(b) for b in (32, 64, 128)] == [2, 2, 4]
  with pytest.raises(ValueError, match=r"max_rows_per_device must be an integer in \[2, inf\]"):
    dp.make_train_step(_loss, optax.sgd(0.05), dp.data_mesh(), batch_schedule=sched,
                       microbatches=2, max_rows_per_device=1)
  with pytest.raises(ValueError, match="max_rows_per_device caps.*needs a batch_schedule"):
    dp.make_train_step(_loss, optax.sgd(0.05), dp.data_mesh(), max_rows_per_device=4)


# [doubling] is in `make test-all`: a precomputed schedule's resume, as
# [ramp]'s (its sizes: test_doubling_matches_reference).
@pytest.mark.parametrize("kind", [
    "ramp", pytest.param("doubling", marks=pytest.mark.slow), "adaptive"])
def test_resume_is_exact(tmp_path, kind):
  if kind == "ramp":
    sched, stats = BatchSchedule.ramp(16, 16, 300, max_batch=64), False
  elif kind == "doubling":
    sched, stats = BatchSchedule.doubling(16, 300, max_batch=128), False
  else:
    sched = BatchSchedule.adaptive(16, max_batch=128, min_steps=3, lag=2, threshold=0.05,
                                   hold_examples=32)
    stats = True
  build = lambda s=sched: dp.make_train_step(_loss, optax.sgd(0.05), dp.data_mesh(),
                                             batch_schedule=s, grad_stats=stats)
  params = {"w": np.zeros((3, 1), np.float32)}
  step = build()
  full, sizes_full, losses_full = _run(step, step.init(params), 14)
  assert len(set(sizes_full)) >= 3  # it grew, twice or more

  state, sizes_a, _ = _run(step, step.init(params), 6)
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(6, state)
    fresh = build()
    restored, _ = mngr.restore(fresh.init(params))
    # A checkpoint restored under a different schedule is refused.
    other = BatchSchedule.ramp(16, 16, 600, max_batch=64)
    wrong = dp.make_train_step(_loss, optax.sgd(0.05), dp.data_mesh(),
                               batch_schedule=other, grad_stats=stats)
    elsewhere, _ = mngr.restore(wrong.init(params))
    with pytest.raises(ValueError, match="checkpoint's\\) batch schedule is BatchSchedule"):
      wrong.next_batch_size(elsewhere)
  resumed, sizes_b, losses_b = _run(fresh, restored, 8, start=6)
  assert sizes_a + sizes_b == sizes_full
  assert losses_b == losses_full[6:]
  for a, b in zip(jax.tree.leaves(jax.device_get(resumed)),
                  jax.tree.leaves(jax.device_get(full)), strict=True):
    np.testing.assert_array_equal(a, b)



def test_adaptive_step_follows_reference():
  sched = BatchSchedule.adaptive(16, max_batch=128, min_steps=4, lag=2, threshold=0.05)
  step = dp.make_train_step(_loss, optax.sgd(0.05), dp.data_mesh(), batch_schedule=sched,
                            grad_stats=True)
  state = step.init({"w": np.zeros((3, 1), np.float32)})
  sizes, noise, losses = [], [], []
  for i in range(16):
    state, m = step(state, _batch(i, step.next_batch_size(state)))
    sizes.append(int(m["batch_size"]))
    noise.append(float(m["grad_noise_scale"]))
    losses.append(float(m["loss"]))
  want = adaptive_reference(noise, start=16, max_batch=128, factor=2, threshold=0.05,
                            min_steps=4, lag=2, calibration=1.0, hold_examples=512,
                            guard_margin=0.1, losses=np.asarray(losses), decay=0.99)
  assert sizes == want
  assert step.traces == len(set(sizes)) <= len(sched.batch_sizes)
  assert len(sched.batch_sizes) == int(np.log2(128 / 16)) + 1


# ---------------------------------------------------------------------------
# date(..., batch_schedule=...): the schedule in examples, the rule per step.

BASE = date_optax.Baseline(batch_size=16, learning_rate=0.05, warmup_epochs=1,
                           epochs=6, num_examples=512, optimizer="momentum",
                           optimizer_options={"momentum": 0.9})


def _linear_params():
  return {"w": np.zeros((3, 1), np.float32), "b": np.zeros((1,), np.float32)}


def _affine_loss(params, batch):
  return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2)


# [linear-1.0] is in `make test-all`: the growing clock is [sqrt-0.5]'s, the
# linear rule test_fixed_schedule_honours_the_scaling_rules[kw0]'s.
@pytest.mark.parametrize("rule,power", [
    ("sqrt", 0.5), pytest.param("linear", 1.0, marks=pytest.mark.slow)])
def test_date_growing_learning_rate(rule, power):
  sched = BatchSchedule.ramp(16, 16, 256, max_batch=64)
  tx = date_optax.date(BASE, 64, batch_schedule=sched, lr_scaling=rule)
  step = dp.make_train_step(_affine_loss, tx, dp.data_mesh(), batch_schedule=sched)
  state = step.init(_linear_params())
  # The baseline's own schedule, one entry per baseline iteration.
  base_lr = np.asarray(date_optax.date_recipe(BASE, 16).learning_rates(), np.float64)
  examples = 0
  for i in range(14):
    b = step.next_batch_size(state)
    state, m = step(state, _batch(i, b))
    want = base_lr[examples // 16] * (b / 16) ** power
    np.testing.assert_allclose(float(m["learning_rate"]), want, rtol=1e-6)
    assert int(m["batch_size"]) == b
    examples += b
  assert examples > 256  # the ramp reached the top within the test


def test_date_growing_errors():
  sched = BatchSchedule.ramp(16, 16, 1024, max_batch=64)
  with pytest.raises(ValueError, match="max_batch=64"):
    date_optax.date(BASE, 128, batch_schedule=sched)
  with pytest.raises(ValueError, match="longer than the run"):
    date_optax.date(BASE, 64, batch_schedule=BatchSchedule.ramp(16, 16, 4000,
                                                                 max_batch=64))
  with pytest.raises(ValueError, match="gain_clock"):
    date_optax.date(BASE, 64, batch_schedule=sched, gain_clock="gain")
  tx = date_optax.date(BASE, 64, batch_schedule=sched)
  params = _linear_params()
  with pytest.raises(ValueError, match="batch_progress"):
    tx.update(params, tx.init(params), params)


def test_date_growing_at_b0_is_baseline():
  """A fixed schedule at B0 with the examples clock is the baseline's solver."""
  sched = BatchSchedule.fixed(16)
  tx = date_optax.date(BASE, 16, batch_schedule=sched)
  step = dp.make_train_step(_affine_loss, tx, dp.data_mesh(), batch_schedule=sched)
  ref_step = dp.make_train_step(_affine_loss, date_optax.date(BASE, 16), dp.data_mesh())
  state, ref = step.init(_linear_params()), ref_step.init(_linear_params())
  for i in range(5):
    state, m = step(state, _batch(i, 16))
    ref, m_ref = ref_step(ref, _batch(i, 16))
    np.testing.assert_allclose(float(m["learning_rate"]), float(m_ref["learning_rate"]),
                               rtol=1e-6)
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------
# Data: exactly the examples each step needs, and the same after a resume.


def _loader_batches(schedule, seed=0):
  src = dp.ArraySource(_batch(123, 2048))
  loader = dp.data_loader(src, schedule.chunk_size, seed=seed)
  return dp.GrowingBatches(iter(loader), schedule.chunk_size)


def _run_loader(step, state, batches, steps):
  seen = []
  for _ in range(steps):
    b = step.next_batch_size(state)
    batch = batches.take(b)
    seen.append(np.asarray(batch["x"]).copy())
    state, _ = step(state, batch)
  return state, seen


def test_growing_batches_join_device_chunks_on_each_device():
  # Chunks prefetched onto the devices: each device joins its own rows of
  # them (no copy between devices), the step takes the result as laid out,
  # and the step's loss and update are those of the host-joined batch.
  sched = BatchSchedule.ramp(16, 16, 200, max_batch=64)
  step = dp.make_train_step(_loss, optax.sgd(0.05), dp.data_mesh(),
                            batch_schedule=BatchSchedule.fixed(48))
  host = _loader_batches(sched).take(48)
  src = dp.ArraySource(_batch(123, 2048))
  on_device = dp.GrowingBatches(
      dp.prefetch_to_device(iter(dp.data_loader(src, 16, seed=0)), step.batch_sharding),
      16).take(48)
  x = on_device["x"]
  assert isinstance(x, jax.Array) and x.sharding == step.batch_sharding
  n = len(jax.devices())
  chunks = np.asarray(host["x"]).reshape(3, n, 16 // n, 3)  # (chunk, device, rows)
  for shard in x.addressable_shards:
    d = shard.index[0].start // (48 // n)
    np.testing.assert_array_equal(np.asarray(shard.data), chunks[:, d].reshape(-1, 3))
  params = {"w": np.ones((3, 1), np.float32)}
  s_host, m_host = step(step.init(params), host)
  s_dev, m_dev = step(step.init(params), on_device)
  np.testing.assert_allclose(float(m_dev["loss"]), float(m_host["loss"]), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(s_dev.params["w"]), np.asarray(s_host.params["w"]),
                             rtol=1e-6)


def test_growing_batches_resume_is_exact(tmp_path):
  sched = BatchSchedule.ramp(16, 16, 200, max_batch=64)
  assert sched.chunk_size == 16
  build = lambda: dp.make_train_step(_loss, optax.sgd(0.05), dp.data_mesh(),
                                     batch_schedule=sched)
  params = {"w": np.zeros((3, 1), np.float32)}
  step = build()
  full, seen_full = _run_loader(step, step.init(params), _loader_batches(sched), 9)
  # Every step got exactly its batch, in the loader's order, without gaps.
  sizes = [len(x) for x in seen_full]
  consumed = np.concatenate([[0], np.cumsum(sizes)[:-1]])
  assert sizes == [sched.batch_size_at(int(c)) for c in consumed]
  chunks = _loader_batches(sched)
  order = np.concatenate([chunks.take(16)["x"] for _ in range(sum(sizes) // 16)])
  np.testing.assert_array_equal(np.concatenate(seen_full), order)

  step = build()
  batches = _loader_batches(sched)
  state, seen_a = _run_loader(step, step.init(params), batches, 4)
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(4, state, metadata={"data": dp.iterator_state(batches)})
    fresh = build()
    restored, meta = mngr.restore(fresh.init(params))
  batches = _loader_batches(sched)
  dp.restore_iterator(batches, meta["data"])
  resumed, seen_b = _run_loader(fresh, restored, batches, 5)
  for a, b in zip(seen_a + seen_b, seen_full, strict=True):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(np.asarray(resumed.params["w"]), np.asarray(full.params["w"]))
  with pytest.raises(ValueError, match="chunks of 16"):
    batches.take(24)


def test_date_growing_needs_no_legw_recipe_at_the_top():
  """The fixed recipe at 64·B0 leaves no iteration after its warmup; the growing
  batch runs the baseline's schedule in examples, so only its bounds are used."""
  with pytest.raises(ValueError, match="warmup"):
    date_optax.date(BASE, 1024)
  sched = BatchSchedule.adaptive(16, max_batch=1024)
  for rule, lower in (("sqrt", 1 / 8), ("linear", 1 / 64)):
    tx = date_optax.date(BASE, 1024, batch_schedule=sched, lr_scaling=rule)
    bounds = date_optax.trust_ratio_bounds(tx.init(_linear_params()))
    np.testing.assert_allclose([float(b) for b in bounds], [lower, 1.0])


def test_sharded_step_grows_too():
  """The GSPMD step of sharded parameters takes the same schedule."""
  from jax.sharding import PartitionSpec as P

  mesh = jax.make_mesh((4, 2), ("data", "model"))
  sched = BatchSchedule.adaptive(8, max_batch=32, min_steps=2, lag=1, threshold=1e-6,
                                  hold_examples=0)
  step = dp.make_train_step(_loss, optax.sgd(0.05), mesh, batch_schedule=sched,
                            grad_stats=True, param_sharding=[("w", P("model", None))])
  state = step.init({"w": np.zeros((4, 1), np.float32)})
  sizes = []
  for i in range(6):
    b = step.next_batch_size(state)
    x = np.random.default_rng(i).normal(size=(b, 4)).astype(np.float32)
    state, m = step(state, {"x": x, "y": x.sum(1, keepdims=True)})
    sizes.append(int(m["batch_size"]))
  assert sizes == [8, 8, 16, 16, 32, 32]
  assert step.traces == 3


# ---------------------------------------------------------------------------
# A schedule proposed from the critical batch measured at B0 (issue 35).


@pytest.mark.parametrize("critical,start", [
    (5.0, 16), (16.0, 16), (31.9, 16), (32.0, 32), (100.0, 64), (1023.9, 512),
])
def test_proposal_starts_at_the_largest_doubling_of_b0_within_the_critical_batch(
    critical, start):
  from date_optax.diagnostics import propose_batch_schedule

  s = propose_batch_schedule(critical, base_batch_size=16, max_batch=1024)
  assert s == BatchSchedule.adaptive(start, max_batch=1024)
  assert s.batch_sizes == tuple(start * 2**j for j in range(int(np.log2(1024 // start)) + 1))
  assert (s.threshold, s.min_steps, s.lag, s.calibration) == (3.0, 10, 2, 1.0)


@pytest.mark.parametrize("critical", [1024.0, 5000.0, float("inf")])
def test_proposal_is_fixed_when_the_critical_batch_reaches_the_top(critical):
  from date_optax.diagnostics import propose_batch_schedule

  for kind in ("adaptive", "ramp"):
    s = propose_batch_schedule(critical, base_batch_size=16, max_batch=1024,
                               total_examples=4096, kind=kind)
    assert s == BatchSchedule.fixed(1024)
  # Nothing to grow at B0 itself, whatever the critical batch.
  assert propose_batch_schedule(3.0, base_batch_size=16, max_batch=16) == BatchSchedule.fixed(16)


@pytest.mark.parametrize("b0,top,unit,critical,total,fraction,want", [
    # The measured study's ramp (docs/RESULTS.md): 16 -> 1024 in 7 increments
    # of 9·16 = 144 over 25 % of 20·16384 examples.
    (16, 1024, 1, 20.0, 327680, 0.25, (16, 144, 81920)),
    (16, 1024, 16, 20.0, 327680, 0.25, (16, 144, 81920)),
    # 1024 - 64 = 960 = 6·160 (7 does not divide 960).
    (16, 1024, 1, 100.0, 327680, 0.25, (64, 160, 81920)),
    # 896 = 14 units of 64, 7 increments of 2 units.
    (64, 1024, 64, 150.0, 10000, 0.1, (128, 128, 1000)),
    # 864 = 9 units of 96: 3 increments (7, 6, 5, 4 do not divide 9).
    (96, 960, 96, 10.0, 1000, 0.5, (96, 288, 500)),
    # A run too short for a quarter of an example still ramps over one.
    # (48 = 6·8; every increment then falls on the first example.)
    (16, 64, 1, 1.0, 3, 0.25, (16, 8, 1)),
])
def test_proposed_ramp_by_hand(b0, top, unit, critical, total, fraction, want):
  from date_optax._src.critical_batch import ramp_changes
  from date_optax.diagnostics import propose_batch_schedule

  s = propose_batch_schedule(critical, base_batch_size=b0, max_batch=top, unit=unit,
                             total_examples=total, kind="ramp", ramp_fraction=fraction)
  start, increment, ramp_examples = want
  assert s == BatchSchedule.ramp(start, increment, ramp_examples, max_batch=top)
  assert all(b % unit == 0 for b in s.batch_sizes)
  s.check_run(total)
  # The examples at each change: the batch is the new one from there, the old
  # one just before (Megatron's rule, written from the math above).
  m = (top - start) // increment
  e = np.arange(ramp_examples + 2)
  batch = start + increment * np.minimum(m, e * m // ramp_examples)
  at = np.flatnonzero(np.diff(batch)) + 1
  assert ramp_changes(s) == [(int(i), int(batch[i])) for i in at]
  assert ramp_changes(s)[-1] == (ramp_examples, top)
  for i in at:
    assert ramp_reference(start, increment, ramp_examples, top, i) == batch[i]


def test_proposal_reads_measurements_and_calibrates():
  from date_optax.diagnostics import propose_batch_schedule

  kw = dict(base_batch_size=16, max_batch=1024)
  # The first half is discarded; the median of 90, 100, 110 is 100.
  assert propose_batch_schedule([1e4, 1e4, 90.0, 100.0, 110.0], **kw).start == 64
  assert propose_batch_schedule(
      [{"grad_noise_scale": v} for v in (1.0, 1.0, 90.0, 110.0)], **kw).start == 64
  stats = date_optax.GradStats(sq_norm=0.5, trace_cov=50.0, batch_size=16.0)
  assert propose_batch_schedule(stats, **kw).start == 64  # 50 / 0.5 = 100
  assert propose_batch_schedule(np.float32(100.0), **kw).start == 64
  assert propose_batch_schedule(jnp.asarray(100.0), **kw).start == 64
  # calibration 4: the critical batch is 400, and the adaptive run keeps it.
  s = propose_batch_schedule(stats, calibration=4, **kw)
  assert s == BatchSchedule.adaptive(256, max_batch=1024, calibration=4.0)


def test_recipe_proposes_the_schedule_date_runs():
  from date_optax.diagnostics import propose_batch_schedule

  r = date_optax.scale_recipe(BASE, 64, critical_batch=40.0)
  assert r.critical_batch == 40.0
  assert date_optax.scale_recipe(BASE, 64).critical_batch is None
  assert date_optax.date_recipe(BASE, 64, critical_batch=40.0).critical_batch == 40.0
  # B0 = 16, 6 epochs of 512 examples: 3072 examples; 32 <= 40 < 64.
  assert r.propose_batch_schedule() == BatchSchedule.adaptive(32, max_batch=64)
  ramp = r.propose_batch_schedule(kind="ramp")
  assert ramp == propose_batch_schedule(40.0, base_batch_size=16, max_batch=64,
                                        total_examples=3072, kind="ramp")
  assert ramp == BatchSchedule.ramp(32, 8, 768, max_batch=64)  # 32 = 4 increments of 8
  assert r.propose_batch_schedule(kind="ramp", ramp_fraction=1.0).ramp_examples == 3072
  assert r.propose_batch_schedule(kind="ramp", unit=16) == BatchSchedule.ramp(
      32, 16, 768, max_batch=64)
  for s in (r.propose_batch_schedule(), ramp):
    tx = date_optax.date(BASE, 64, batch_schedule=s)
    assert tx.init(_linear_params()) is not None
  with pytest.raises(ValueError, match=r"no critical batch.*scale_recipe\(\.\.\., critical_batch"):
    date_optax.scale_recipe(BASE, 64).propose_batch_schedule()
  with pytest.raises(TypeError, match="takes max_batch from the recipe"):
    r.propose_batch_schedule(max_batch=128)
  with pytest.raises(TypeError, match="unexpected keyword"):
    r.propose_batch_schedule(discard=0.5)


# ---------------------------------------------------------------------------
# A clock for any run length (issue 48, item 5): the examples count is exact
# past 2**31 without jax_enable_x64, and so is the learning rate's clock.

# 5e9 examples: 1e9 per epoch, B0 = 16. The ramp 16 -> 64 over 4.5e9 + 150
# examples changes from 32 to 48 at 3e9 + 100 examples (2/3 of the ramp).
LONG = date_optax.Baseline(batch_size=16, learning_rate=0.05, warmup_epochs=0.5,
                           epochs=5, num_examples=10**9, optimizer="momentum",
                           optimizer_options={"momentum": 0.9})
LONG_RAMP = (16, 16, 4_500_000_150, 64)


def long_lr_reference(examples, batch):
  """DATE's schedule at B0 in baseline iterations i = E // B0 + 1 (SPEC §5, §6):
  gradual warmup over W = round(w0·n/B0) iterations, then the roller coaster
  max(peak·(T − i)/(T − W), 1e-6) with T = ceil(E_total/B0); times sqrt(B/B0)."""
  b0, peak = 16, 0.05
  w = int(Fraction(1, 2) * 10**9 / b0 + Fraction(1, 2))
  t = -(-5 * 10**9 // b0)
  i = examples // b0 + 1
  lr = peak * i / w if i <= w else max(peak * (t - i) / (t - w), 1e-6)
  return lr * np.sqrt(batch / b0)


def _long_run(step, state, steps):
  out = []
  for i in range(steps):
    b = step.next_batch_size(state)
    state, m = step(state, _batch(i, b))
    out.append((int(m["batch_size"]), float(m["learning_rate"])))
  return state, out


def test_examples_words_add_and_divide_exactly():
  from date_optax._src import batch_schedule as bs

  rng = np.random.default_rng(0)
  counts = [0, 1, 2**31 - 1, 2**31, 3 * 10**9, 2**62 - 2**31, bs.MAX_EXAMPLES - 1]
  counts += [int(x) for x in rng.integers(0, 2**62 - 2**31, 20, dtype=np.int64)]
  divisors = [1, 3, 16, 1000, 2**16 + 1, 2**31 - 1]
  add = jax.jit(bs.add_examples)
  for e in counts:
    words = jnp.asarray(bs.examples_words(e))
    assert int(words[0]) * 2**31 + int(words[1]) == e
    for b in (1, 48, 2**31 - 1):
      if e + b <= bs.MAX_EXAMPLES:
        assert bs.examples_int(add(words, jnp.int32(b))) == e + b
    for d in divisors:
      q_high, q_low, r = jax.jit(bs.divmod_examples, static_argnums=1)(words, d)
      assert (int(q_high) * 2**31 + int(q_low), int(r)) == divmod(e, d)
  assert jnp.asarray(bs.examples_words(0)).dtype == jnp.int32


def test_clock_and_batches_are_exact_at_3e9_examples_and_resume(tmp_path):
  start, inc, ramp_examples, top = LONG_RAMP
  sched = BatchSchedule.ramp(start, inc, ramp_examples, max_batch=top)
  assert BatchSchedule.from_spec(sched.spec()) == sched  # ramp_examples > 2**31
  tx = date_optax.date(LONG, top, batch_schedule=sched)
  build = lambda: dp.make_train_step(_affine_loss, tx, dp.data_mesh(),
                                     batch_schedule=sched, donate=False)
  from date_optax._src.batch_schedule import examples_words

  step = build()
  state = step.init(_linear_params())
  e0 = 3 * 10**9
  bs_state = state.batch_schedule
  words = jax.device_put(examples_words(e0), bs_state.examples.sharding)
  state = state.replace(batch_schedule=bs_state.replace(examples=words))
  assert state.batch_schedule.num_examples() == e0

  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(1, state)
    restored, _ = mngr.restore(build().init(_linear_params()))
  assert restored.batch_schedule.num_examples() == e0

  full_step = build()
  _, full = _long_run(full_step, state, 8)
  step = build()
  end, got = _long_run(step, restored, 8)
  assert got == full  # resumed from the checkpoint = uninterrupted
  examples, want_sizes = e0, []
  for batch, lr in got:
    want = ramp_reference(start, inc, ramp_examples, top, examples)
    want_sizes.append(want)
    assert batch == want
    np.testing.assert_allclose(lr, long_lr_reference(examples, batch), rtol=1e-6)
    assert lr > 0
    examples += batch
  assert want_sizes[0] == 32 and want_sizes[-1] == 48  # a change at 3e9 + 100
  assert end.batch_schedule.num_examples() == examples == e0 + sum(want_sizes)
  assert step.next_batch_size(end) == ramp_reference(start, inc, ramp_examples, top,
                                                     examples)


def _legacy(state, generation=1):
  """`state` in an older layout: generation 2 has no stretch, loss averages
  or skipped count and an 11-entry spec; generation 1 also counts in an
  int32 scalar and has a 10-entry spec (ramp_examples in one word)."""
  bs = state.batch_schedule
  e = bs.num_examples()
  assert e < 2**31
  spec = np.asarray(bs.spec)
  assert spec[10] == 0
  bs = bs.replace(held=None, loss_avg=None, skipped=None, spec=jnp.asarray(spec[:11]))
  if generation == 1:
    bs = bs.replace(examples=jnp.int32(e), spec=jnp.asarray(spec[:10]))
  return state.replace(batch_schedule=bs)


@pytest.mark.parametrize("generation", [1, 2])
def test_a_checkpoint_of_an_older_layout_restores(tmp_path, generation):
  from flax import serialization

  sched = BatchSchedule.ramp(16, 16, 300, max_batch=64)
  build = lambda: dp.make_train_step(_loss, optax.sgd(0.05), dp.data_mesh(),
                                     batch_schedule=sched, donate=False)
  params = {"w": np.zeros((3, 1), np.float32)}
  step = build()
  state, sizes_a, _ = _run(step, step.init(params), 5)
  _, sizes_b, losses_b = _run(build(), state, 4, start=5)
  old = _legacy(jax.device_get(state), generation)
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(5, old)
    fresh = build()
    restored, _ = mngr.restore(fresh.init(params))
  assert restored.batch_schedule.examples.shape == (2,)
  assert restored.batch_schedule.num_examples() == sum(sizes_a)
  assert BatchSchedule.from_spec(restored.batch_schedule.spec) == sched
  assert int(restored.batch_schedule.held) == 0
  assert restored.batch_schedule.skipped.tolist() == [0, 0]
  _, sizes_c, losses_c = _run(fresh, restored, 4, start=5)
  assert (sizes_c, losses_c) == (sizes_b, losses_b)
  # flax's msgpack reads the old layout too.
  back = serialization.from_bytes(build().init(params), serialization.to_bytes(old))
  assert back.batch_schedule.num_examples() == sum(sizes_a)
  assert np.asarray(back.batch_schedule.spec).shape == (13,)
  assert np.isnan(np.asarray(back.batch_schedule.loss_avg)).all()


def test_a_run_longer_than_the_count_is_refused():
  from date_optax._src.batch_schedule import MAX_EXAMPLES

  assert MAX_EXAMPLES == 2**62 - 1
  huge = date_optax.Baseline(batch_size=2**20, learning_rate=0.05, warmup_epochs=0.5,
                             epochs=2**23, num_examples=2**40)
  with pytest.raises(ValueError, match=r"epochs x baseline.num_examples = 9223372036854775808"
                     r", must be at most MAX_EXAMPLES = 4611686018427387903"):
    date_optax.date(huge, 2**21, batch_schedule=BatchSchedule.fixed(2**21))
  # B0 = 1: 3e9 baseline iterations do not fit the int32 clock.
  tiny_b0 = date_optax.Baseline(batch_size=1, learning_rate=0.05, warmup_epochs=0.01,
                                epochs=3, num_examples=10**9)
  with pytest.raises(ValueError, match=r"iterations of 1 examples.*at most 2147483646"):
    date_optax.date(tiny_b0, 1, batch_schedule=BatchSchedule.fixed(1))
  # Starting at 64, the clock counts iterations of 64: it fits.
  date_optax.date(tiny_b0, 64, batch_schedule=BatchSchedule.fixed(64))
  with pytest.raises(ValueError, match=r"total_examples must be an integer in \[1, "
                     r"4611686018427387903\]"):
    BatchSchedule.fixed(16).check_run(2**62)
  with pytest.raises(ValueError, match=r"ramp_examples must be an integer in \[1, "
                     r"4611686018427387903\]"):
    BatchSchedule.ramp(16, 16, 2**62, max_batch=64)
  with pytest.raises(ValueError, match=r"max_batch must be an integer in \[16, 2147483647\]"):
    BatchSchedule.adaptive(16, max_batch=2**31)
  # Long runs below the limits build, ramps over more than 2**31 examples too.
  date_optax.date(LONG, 64, batch_schedule=BatchSchedule.ramp(*LONG_RAMP[:3], max_batch=64))


# ---------------------------------------------------------------------------
# LEGW with a schedule (issue 48, item 6): a schedule starting above B0 runs
# LEGW's recipe for its first batch, so a fixed schedule at B is date(base, B).

LEGW_BASE = date_optax.Baseline(batch_size=16, learning_rate=0.05, warmup_epochs=0.05,
                                epochs=8, num_examples=16384, optimizer="momentum",
                                optimizer_options={"momentum": 0.9})


def legw_reference(step, batch, *, lr_scaling="sqrt", warmup_scaling="linear"):
  """LEGW + DATE's roller coaster at B = k·B0 (SPEC §5, §6), iteration i = step + 1:
  peak η0·sqrt(k) (or η0·k), warmup epochs w0·k (or w0·sqrt(k), w0), so
  W = round(w·n/B); T = ceil(E·n/B); warmup peak·i/W, then
  max(peak·(T − i)/(T − W), 1e-6)."""
  b0, n, eta0, w0, epochs = 16, 16384, 0.05, Fraction(1, 20), 8
  k = Fraction(batch, b0)
  peak = eta0 * {"sqrt": float(k) ** 0.5, "linear": float(k)}[lr_scaling]
  w = w0 * {"linear": k, "sqrt": Fraction(float(k) ** 0.5), "none": 1}[warmup_scaling]
  warm = int(w * n / batch + Fraction(1, 2))
  total = -(-epochs * n // batch)
  i = step + 1
  if i <= warm:
    return peak * i / warm
  return max(peak * (total - i) / (total - warm), 1e-6)


def _affine_batch(i, size):
  rng = np.random.default_rng(1000 + i)
  x = rng.normal(size=(size, 3)).astype(np.float32)
  y = x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.3 + rng.normal(
      0, 0.5, (size, 1)).astype(np.float32)
  return {"x": x, "y": y}


def _compare_with_plain(batch, steps, **kw):
  """date(base, B, batch_schedule=fixed(B)) against date(base, B), step by step."""
  sched = BatchSchedule.fixed(batch)
  stats = kw.get("lr_scaling") == "gain"
  # The same smoothing on both (a schedule's default is per example seen).
  decay = 0.9 if stats else None
  grow = dp.make_train_step(
      _affine_loss, date_optax.date(LEGW_BASE, batch, batch_schedule=sched, **kw),
      dp.data_mesh(), batch_schedule=sched, grad_stats=stats, grad_stats_decay=decay)
  plain = dp.make_train_step(_affine_loss, date_optax.date(LEGW_BASE, batch, **kw),
                             dp.data_mesh(), grad_stats=stats, grad_stats_decay=decay)
  state, ref = grow.init(_linear_params()), plain.init(_linear_params())
  lrs, lrs_ref = [], []
  for i in range(steps):
    state, m = grow(state, _affine_batch(i, batch))
    ref, m_ref = plain(ref, _affine_batch(i, batch))
    lrs.append(float(m["learning_rate"]))
    lrs_ref.append(float(m_ref["learning_rate"]))
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref.params), strict=True):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6,
                                 err_msg=f"step {i}")
  np.testing.assert_allclose(lrs, lrs_ref, rtol=1e-6)
  return np.asarray(lrs)


# [64] is in `make test-all`: the code of [8] at another batch.
@pytest.mark.parametrize("k", [8, pytest.param(64, marks=pytest.mark.slow)])
def test_fixed_schedule_above_b0_is_date_at_that_batch(k):
  batch, steps = 16 * k, 60  # warmup W = 51 iterations, then the decay
  lrs = _compare_with_plain(batch, steps)
  want = [legw_reference(t, batch) for t in range(steps)]
  np.testing.assert_allclose(lrs, want, rtol=1e-6)


@pytest.mark.parametrize("kw", [
    {"lr_scaling": "linear"}, {"warmup_scaling": "sqrt"}, {"warmup_scaling": "none"},
])
def test_fixed_schedule_honours_the_scaling_rules(kw):
  batch, steps = 128, 56
  lrs = _compare_with_plain(batch, steps, **kw)
  want = [legw_reference(t, batch, **kw) for t in range(steps)]
  np.testing.assert_allclose(lrs, want, rtol=1e-6)


def test_fixed_schedule_with_the_gain_is_date_with_the_gain():
  _compare_with_plain(128, 12, lr_scaling="gain")


def test_ramp_from_above_b0_runs_legw_at_its_start_in_examples():
  """From S = 128 = 8·B0: LEGW's recipe at S on the clock ⌊E/S⌋, times
  sqrt(B/S) at each step's batch B."""
  sched = BatchSchedule.ramp(128, 128, 128 * 60, max_batch=512)
  tx = date_optax.date(LEGW_BASE, 512, batch_schedule=sched)
  step = dp.make_train_step(_affine_loss, tx, dp.data_mesh(), batch_schedule=sched)
  state = step.init(_linear_params())
  examples = 0
  for i in range(50):
    b = step.next_batch_size(state)
    assert b == ramp_reference(128, 128, 128 * 60, 512, examples)
    state, m = step(state, _affine_batch(i, b))
    want = legw_reference(examples // 128, 128) * np.sqrt(b / 128)
    np.testing.assert_allclose(float(m["learning_rate"]), want, rtol=1e-6)
    examples += b
  assert b == 512 and examples // 128 > 51  # past the top and the warmup


def test_growing_start_options_are_checked():
  sched = BatchSchedule.fixed(128)
  with pytest.warns(UserWarning, match=r"schedule's start: batch_size=128 is 16x the "
                    r"critical batch 8"):
    date_optax.date(LEGW_BASE, 128, batch_schedule=sched, critical_batch=8.0)
  with pytest.raises(ValueError, match="critical_batch"):
    date_optax.date(LEGW_BASE, 128, batch_schedule=sched, critical_batch=-1.0)
  with pytest.raises(ValueError, match="warmup_scaling"):
    date_optax.date(LEGW_BASE, 128, batch_schedule=sched, warmup_scaling="cube")
  # LEGW's warmup at 16384 = 1024·B0 is 51.2 epochs of an 8-epoch run.
  with pytest.raises(ValueError, match=r"batch_schedule's start=16384: a growing run "
                     r"takes LEGW's warmup for its first batch.*largest batch size"):
    date_optax.date(LEGW_BASE, 16384, batch_schedule=BatchSchedule.fixed(16384))
  # A schedule from B0 runs the baseline's own schedule: nothing to refuse.
  date_optax.date(LEGW_BASE, 16384,
                  batch_schedule=BatchSchedule.doubling(16, 10**5, max_batch=16384))


def test_precompile_compiles_every_program_once_and_the_calls_use_them():
  sched = BatchSchedule.ramp(8, 8, 48, max_batch=32)
  params = {"w": np.ones((3, 1), np.float32)}
  build = lambda: dp.make_train_step(_loss, optax.sgd(0.05), dp.data_mesh(),  # noqa: E731
                                     batch_schedule=sched)
  step, plain = build(), build()
  state = step.init(params)
  times = step.precompile(state, _batch(0, 8))
  assert list(times) == list(sched.batch_sizes) == [8, 16, 24, 32]
  assert all(t > 0 for t in times.values()) and step.traces == 4
  ref = plain.init(params)
  for i in range(8):
    state, m = step(state, _batch(i, step.next_batch_size(state)))
    ref, m_ref = plain(ref, _batch(i, plain.next_batch_size(ref)))
    assert int(m["batch_size"]) == int(m_ref["batch_size"])
  assert step.traces == 4  # nothing compiled during the run
  np.testing.assert_array_equal(np.asarray(state.params["w"]), np.asarray(ref.params["w"]))
  # In the background: a Future of the same table.
  other = build()
  future = other.precompile(other.init(params), _batch(0, 8), background=True)
  assert sorted(future.result(timeout=300)) == [8, 16, 24, 32]
  # precompile(state), as the issue writes it: the shapes of a batch it has run.
  third = build()
  with pytest.raises(ValueError, match=r"precompile\(state, batch\)"):
    third.precompile(third.init(params))
  s3, _ = third(third.init(params), _batch(0, 8))
  assert list(third.precompile(s3)) == [8, 16, 24, 32]


def test_a_schedule_of_many_sizes_warns_with_their_number():
  sched = BatchSchedule.ramp(8, 8, 1000, max_batch=8 * 20)  # Megatron-style, 20 sizes
  with pytest.warns(UserWarning, match="20 batch sizes.*step.precompile"):
    dp.make_train_step(_loss, optax.sgd(0.05), dp.data_mesh(), batch_schedule=sched)


def _mean_loss(params, batch):
  """Half the squared distance to the examples: G = w − μ, tr Σ = d·σ²."""
  return 0.5 * jnp.mean(jnp.sum((params["w"] - batch["x"]) ** 2, axis=-1))


def _growth_steps(microbatches, steps=110):
  """The steps at which an adaptive run on the 8 devices changes its batch,
  with the same global batches split into 8 x `microbatches` gradients.
  B_simple = d·σ²/|w − μ|² grows as (1 − η)^(−2t) until the noise floor.
  The smoothing (0.95 per start batch) and the stretch (4 start batches)
  are shorter than the defaults, so that a short run grows several times."""
  sched = BatchSchedule.adaptive(64, max_batch=64 * 16, min_steps=4, lag=1,
                                 hold_examples=4 * 64)
  step = dp.make_train_step(_mean_loss, optax.sgd(0.1), dp.data_mesh(),
                            microbatches=microbatches, batch_schedule=sched,
                            grad_stats=True, grad_stats_decay=0.95)
  state, sizes = step.init({"w": np.zeros((256,), np.float32)}), []
  for i in range(steps):
    b = step.next_batch_size(state)
    x = 1.0 + np.random.default_rng(i).normal(size=(b, 256)).astype(np.float32)
    state, m = step(state, {"x": x})
    sizes.append(int(m["batch_size"]))
  return [i for i in range(1, steps) if sizes[i] != sizes[i - 1]], sizes


def test_growth_does_not_depend_on_the_number_of_partial_gradients():
  # The smoothing is per example and the trigger must hold over a stretch:
  # 8 and 64 partial gradients of the same batches grow at the same steps
  # (within one min_steps).
  eight, sizes8 = _growth_steps(1)
  sixty_four, sizes64 = _growth_steps(8)
  assert len(eight) >= 3, sizes8
  assert len(eight) == len(sixty_four), (sizes8, sizes64)
  assert max(abs(a - b) for a, b in zip(eight, sixty_four)) <= 4, (eight, sixty_four)


def test_a_skipped_step_moves_neither_the_clock_nor_the_decision():
  # A NaN batch at step 3: its examples are read (the data order goes on)
  # but the learning rate's clock, min_steps and the stretch do not count it.
  sched = BatchSchedule.fixed(16)
  tx = date_optax.date(LEGW_BASE, 16, batch_schedule=sched)
  step = dp.make_train_step(_affine_loss, tx, dp.data_mesh(), batch_schedule=sched)
  state, lrs = step.init(_linear_params()), []
  for i in range(6):
    batch = _affine_batch(i, 16)
    if i == 3:
      batch["y"][0] = np.nan
    state, m = step(state, batch)
    lrs.append(float(m["learning_rate"]))
  assert bool(m["skipped"]) is False and int(state.total_skips) == 1
  assert state.batch_schedule.num_examples() == 6 * 16
  assert state.batch_schedule.skipped.tolist() == [0, 16]
  # The steps after the skip run at the iterations 4 and 5 of LEGW's clock.
  want = [legw_reference(s, 16) for s in (0, 1, 2, 3, 3, 4)]
  np.testing.assert_allclose(lrs[:3] + lrs[4:], want[:3] + want[4:], rtol=1e-6)
