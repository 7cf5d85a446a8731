"""The DATE optimizer: a LEGW recipe driving bounded LARS over the base solver.

:func:`date_recipe` is :func:`scale_recipe` with DATE's choices (roller-coaster
decay); :func:`layer_lr_bounds` gives the per-layer ratio bounds; :func:`date`
builds the optimizer. The recipe arithmetic is in `recipe.py`.
"""

from __future__ import annotations

import math
import types
from typing import Any

import jax
import optax

from date_optax._src import batch_lr as batch_lr_lib
from date_optax._src import batch_schedule as bs_lib
from date_optax._src import critical_batch as critical_lib
from date_optax._src import decays as decays_lib
from date_optax._src import gain as gain_lib
from date_optax._src import lars as lars_lib
from date_optax._src import masks as masks_lib
from date_optax._src import schedules as sched_lib
from date_optax._src import validation
from date_optax._src.recipe import (
  Baseline,
  Recipe,
  check_baseline,
  check_solver_options,
  scale_recipe,
)
from date_optax._src.types import ScalarOrSchedule

#: Fixed ratio bounds, :func:`date`'s ``bounds="fixed"`` rule. The upper
#: bound 1 never raises a layer's learning rate above the recipe's; the lower
#: bound 0.01 lets layers whose gradient is large relative to their weights
#: slow down by up to 100x.
DEFAULT_BOUNDS = (0.01, 1.0)

#: Bound rules of :func:`date` (see :func:`layer_lr_bounds`).
BOUND_RULES = ("baseline_to_recipe", "baseline_to_linear", "fixed")

#: The ``lr_scaling`` rules of :func:`date` and :func:`date_recipe`: the
#: fixed rules of :func:`scale_recipe` and the measured ``"gain"``.
LR_SCALING_RULES = (*sched_lib.SCALING_RULES, "gain")

#: The power of the AdaScale gain that ``date(..., lr_scaling="gain")``
#: applies per base solver: the gain itself for the SGD family (AdaScale),
#: its square root for adaptive solvers (AdaptDL/Pollux's ``AdamScale``). A
#: custom `GradientTransformation` base gets the square root.
GAIN_POWERS = types.MappingProxyType({
    "sgd": 1.0, "momentum": 1.0, "nesterov": 1.0,
    "adagrad": 0.5, "rmsprop": 0.5, "adam": 0.5,
})


def gain_power(baseline: Baseline) -> float:
  """The power of the gain `date(baseline, B, lr_scaling="gain")` applies."""
  if isinstance(baseline.optimizer, str):
    return GAIN_POWERS.get(baseline.optimizer, 0.5)
  return 0.5


# ---------------------------------------------------------------------------
# DATE.


def date_recipe(
    baseline: Baseline,
    batch_size: int,
    *,
    lr_scaling: str = "sqrt",
    warmup_scaling: str = "linear",
    decay: decays_lib.Decay | str | None = None,
    critical_batch: float | None = None,
) -> Recipe:
  """The recipe behind ``date(baseline, batch_size, ...)``.

  It is :func:`scale_recipe` with DATE's choices: sqrt learning-rate scaling,
  linear warmup-epoch scaling and roller-coaster decay (the baseline's own
  roller coaster if it has one, so its `power` and `floor` are kept).

  Args:
    baseline: the tuned :class:`Baseline`.
    batch_size: the target batch size.
    lr_scaling: as in :func:`scale_recipe`, or ``"gain"`` (one of
      :data:`LR_SCALING_RULES`; see below).
    warmup_scaling: as in :func:`scale_recipe`.
    decay: ``None`` for DATE's roller coaster, ``"baseline"`` for the
      baseline's own decay, or another decay.
    critical_batch: as in :func:`scale_recipe` (warns far beyond it).

  ``lr_scaling="gain"`` gives the recipe behind ``date(...,
  lr_scaling="gain")``: peak ``η0`` (``"none"``), which the measured gain
  multiplies at run time.

  Returns:
    The :class:`Recipe` whose ``schedule`` :func:`date` uses.

  Examples:
    DATE's worked example (§3.6 of the paper): MNIST, 30 epochs, ``B0 = 1024``.

    >>> import date_optax
    >>> base = date_optax.Baseline(batch_size=1024, learning_rate=1.25e-3,
    ...     warmup_epochs=2, epochs=30, num_examples=59904)
    >>> r = date_optax.date_recipe(base, 8192)
    >>> r.warmup_steps, r.total_steps, r.peak_learning_rate == 1.25e-3 * 8 ** 0.5
    (117, 220, True)

  References:
    You et al., `Large-batch training for LSTM and beyond
    <https://arxiv.org/abs/1901.08256>`_, SC 2019 (Algorithm 1).
  """
  check_baseline(baseline)
  validation.check_choice("lr_scaling", lr_scaling, LR_SCALING_RULES)
  if isinstance(decay, str) and decay == "baseline":
    decay = baseline.decay
  elif decay is None:
    decay = (
        baseline.decay
        if isinstance(baseline.decay, decays_lib.RollerCoaster)
        else decays_lib.RollerCoaster()
    )
  return scale_recipe(
      baseline,
      batch_size,
      lr_scaling="none" if lr_scaling == "gain" else lr_scaling,
      warmup_scaling=warmup_scaling,
      decay=decay,
      critical_batch=critical_batch,
  )


def _every_leaf(params: Any) -> Any:
  """The mask that selects every leaf (a callable, as optax masks accept)."""
  return jax.tree.map(lambda _: True, params)


def layer_lr_bounds(
    recipe: Recipe, bounds: str = "baseline_to_recipe"
) -> tuple[float, float]:
  r"""The ratio bounds of a DATE bound rule at one batch size (dynamic bounds).

  DATE bounds each layer's trust ratio at run time with limits that depend on
  the run (dynamic bounds). Here they depend on the scale ``k = B / B0``
  through the recipe's learning-rate multiplier ``m = peak / η0``
  (``sqrt(k)`` for DATE's sqrt scaling), so that each layer's effective peak
  learning rate ``peak · r`` stays in a range fixed by two learning rates
  that are both meaningful for the baseline:

  ``"baseline_to_recipe"``
    :math:`r \in [\min(1, m)/m,\ \max(1, m)/m]`: a layer moves at least as
    fast as the baseline's tuned ``η0`` and at most at the recipe's peak
    ``η0·m``. At ``k = 1`` both bounds are 1: every layer follows the
    baseline exactly.
  ``"baseline_to_linear"``
    :math:`r \in [\min(1, k)/m,\ \max(1, k)/m]`: between ``η0`` and the
    linear-scaling rule's ``η0·k`` (Goyal et al.), so layers whose weights
    are large relative to their gradient may go beyond the sqrt rule.
  ``"fixed"``
    :data:`DEFAULT_BOUNDS` = ``(0.01, 1)`` at every ``k`` (the engine's
    bounds before the rule existed; at ``k = 1`` layers with
    ``‖w‖ < ‖g‖`` are slowed down, so it is not the baseline there).

  Args:
    recipe: the :class:`Recipe` (from :func:`date_recipe`).
    bounds: one of :data:`BOUND_RULES`.

  Returns:
    ``(lower, upper)`` as floats.

  Examples:
    >>> import date_optax
    >>> base = date_optax.Baseline(batch_size=16, learning_rate=0.05,
    ...     warmup_epochs=0.1, epochs=30, num_examples=32768)
    >>> date_optax.layer_lr_bounds(date_optax.date_recipe(base, 1024))
    (0.125, 1.0)
    >>> date_optax.layer_lr_bounds(date_optax.date_recipe(base, 1024),
    ...                            "baseline_to_linear")
    (0.125, 8.0)
    >>> date_optax.layer_lr_bounds(date_optax.date_recipe(base, 16))
    (1.0, 1.0)

  References:
    You et al., `Large-batch training for LSTM and beyond
    <https://arxiv.org/abs/1901.08256>`_, SC 2019 (§3.5, dynamic upper and
    lower limits of the LARS ratio); Goyal et al., `Accurate, Large
    Minibatch SGD <https://arxiv.org/abs/1706.02677>`_, 2017 (linear rule).
  """
  if not isinstance(recipe, Recipe):
    raise TypeError(
        f"recipe must be a date_optax.Recipe (see date_recipe), got {recipe!r}."
    )
  validation.check_choice("bounds", bounds, BOUND_RULES)
  if bounds == "fixed":
    return DEFAULT_BOUNDS
  m = recipe.peak_learning_rate / recipe.baseline.learning_rate
  target = m if bounds == "baseline_to_recipe" else recipe.scale
  lower, upper = min(1.0, target) / m, max(1.0, target) / m
  if math.isclose(lower, 1.0, rel_tol=1e-12):
    lower = 1.0
  if math.isclose(upper, 1.0, rel_tol=1e-12):
    upper = 1.0
  return (lower, upper)


def date(
    baseline: Baseline,
    batch_size: int,
    *,
    lower: ScalarOrSchedule | None = None,
    upper: ScalarOrSchedule | None = None,
    ratio_source: str = "gradient",
    lr_scaling: str = "sqrt",
    warmup_scaling: str = "linear",
    decay: decays_lib.Decay | str | None = None,
    learning_rate: ScalarOrSchedule | None = None,
    bounds: str = "baseline_to_recipe",
    critical_batch: float | None = None,
    gain_clock: str = "steps",
    batch_schedule: bs_lib.BatchSchedule | None = None,
    **solver_options: Any,
) -> optax.GradientTransformation:
  r"""DATE: the baseline's solver, scaled to `batch_size` with no retuning.

  The learning rate follows :func:`date_recipe` (sqrt scaling, LEGW warmup,
  roller-coaster decay) and drives :func:`date_optax.bounded_lars` over the
  baseline's solver, so each layer's step is

  .. math::

    w \leftarrow w - \eta_i \cdot \mathrm{clip}(\|w\| / \|g\|, l, u)
      \cdot \mathrm{base}(g).

  **Bounds.** The baseline's ``η0`` was tuned for the plain solver, whose
  per-layer ratio is 1. Raw ratios ``‖w‖/‖g‖`` are usually 10–1000, so a
  fixed upper bound well above 1 multiplies most layers' learning rate
  (docs/RESULTS.md: bounds [0.01, 10] cost 29 points at ``k = 1`` on an
  MLP). The bounds therefore follow the scale (:func:`layer_lr_bounds`); the
  default ``bounds="baseline_to_recipe"`` keeps each layer's effective peak
  learning rate between the baseline's ``η0`` and the recipe's ``η0·sqrt(k)``,
  i.e. ratio bounds ``[1/sqrt(k), 1]``, which are ``[1, 1]`` at ``k = 1``.
  A baseline tuned with bounded ratios (``Baseline.ratio_bounds``) keeps its
  own bounds; `lower`/`upper` override either.

  **Biases and normalisation parameters** keep the baseline's learning rate
  (ratio 1) by default: a zero-initialised bias has ``‖b‖/‖g_b‖ ≪ 1`` for its
  first steps and would learn up to 100× slower than the tuned learning rate
  says. The trust-ratio mask is :func:`date_optax.exclude_bias_and_norm`
  (leaves with at most one dimension, or named ``bias``, ``scale``, ...) and
  the weight-decay mask is the baseline's own, both passed explicitly to
  `bounded_lars`; ``trust_ratio_mask=None`` in `solver_options` puts every
  leaf under the ratio again.

  **At the baseline's batch size** (``k = 1``), with the defaults and a
  baseline whose decay is a roller coaster, ``date(baseline, B0)`` is
  ``baseline.solver()``: the same schedule, ratio exactly 1 on the kernels
  (bounds [1, 1]) and on the masked leaves, the same weight decay. It
  differs from a baseline with another decay, which DATE replaces by its
  roller coaster (pass ``decay="baseline"`` to keep it), and from one tuned
  with `ratio_bounds`, whose bounded ratios it keeps.

  The recipe is available as ``date_recipe(baseline, batch_size, ...)``
  with the same scaling and decay arguments.

  **Growing batch** (``batch_schedule=``, a :class:`BatchSchedule` whose
  ``max_batch`` is `batch_size`). With ``S = max(start, B0)`` (``start``
  the schedule's first batch), the learning rate runs LEGW's DATE recipe
  at ``S`` (:func:`date_recipe` with `lr_scaling`, `warmup_scaling` and
  `decay`: warmup epochs ``w0·S/B0``, i.e. the baseline's ``W0``
  iterations of ``S``, and the roller coaster) on a clock of examples,
  ``τ = ⌊E/S⌋`` iterations of ``S`` after ``E`` examples, so warmup and
  decay stay where they were in the data however the batch grows; at
  every step it is multiplied by the step's batch against ``S`` through
  `lr_scaling`: ``sqrt(B_t/S)`` (``"sqrt"``), ``B_t/S`` (``"linear"``),
  or the measured gain at ``k_t = B_t/B0`` (``"gain"``: ``r`` for the SGD
  family, ``sqrt(r)`` for adaptive solvers, on a recipe of peak ``η0``).
  So ``date(baseline, B, batch_schedule=BatchSchedule.fixed(B))`` is
  ``date(baseline, B)`` step by step, and a schedule from ``B0`` runs the
  baseline's own schedule in baseline iterations ``⌊E/B0⌋``. A start below
  ``B0`` keeps the baseline's schedule at ``B0``: LEGW scaled down would
  warm up over fewer examples than the baseline did, and the batch then
  grows past ``B0``. A `learning_rate` schedule runs on ``⌊E/B0⌋`` with
  the multiplier at ``B_t/B0``. `critical_batch` is checked against the
  schedule's start (it warns above 8 times it), the batch the measurement
  at ``B0`` speaks of; the schedule grows from there. The examples are
  counted exactly in two int32 words, so the clock never wraps: a run of
  more than ``MAX_EXAMPLES`` (``2**62 − 1``)
  examples, or of more than ``2**31 − 2`` iterations of ``S``, is refused
  with a ValueError. The ratio bounds are those of `bounds` at
  `batch_size`. Build the step with
  ``make_train_step(..., batch_schedule=<the same schedule>)``, which
  passes each step's batch and examples as ``update(...,
  batch_progress=...)``; the run ends when its examples reach
  ``epochs · num_examples``.

  **Measured gain** (``lr_scaling="gain"``). The peak learning rate is the
  baseline's ``η0`` times a gain measured every step from the gradient
  noise, instead of the fixed ``sqrt(k)``: the step passes its statistics
  as ``update(..., grad_stats=...)`` (build it with
  ``make_train_step(..., grad_stats=True)``; without them the update raises
  a ValueError naming ``grad_stats``). For the SGD family (``"sgd"``,
  ``"momentum"``, ``"nesterov"``) the multiplier is AdaScale's gain
  ``r = (1 + B_simple/B0)/(1 + B_simple/B)`` in ``[1, k]``
  (:func:`date_optax.adascale_gain`); for adaptive solvers (``"adam"``,
  ``"rmsprop"``, ``"adagrad"``, or a custom transformation) it is ``sqrt(r)``
  in ``[1, sqrt(k)]``, the rule of AdaptDL/Pollux's ``AdamScale`` (Adam's
  update is normalised by the gradient's second moment, so its noise
  reduction per step grows more slowly with the batch). LEGW warmup and the
  roller coaster are kept: by default (``gain_clock="steps"``) as the LEGW
  recipe at ``B``, one iteration per step (warmup ``W0`` steps), or with
  ``gain_clock="gain"`` as the baseline's own schedule at ``B0`` run on
  AdaScale's scale-invariant clock
  ``τ += r`` (its warmup lasts ``W0`` baseline iterations, about ``W0/r``
  steps or ``w0·k/r`` epochs: LEGW's ``w0·k`` when the gradient is noise
  free, ``r = 1``, and the baseline's ``w0`` when it is all noise,
  ``r = k``; the run stops at its epoch budget, where ``τ <= T0``).
  The ratio bounds follow the rule with
  the largest multiplier ``k**p`` (``p = 1`` or ``1/2``) in place of
  ``sqrt(k)``: ``[1/k**p, 1]`` by default. At ``k = 1`` the gain is exactly 1, so
  ``date(baseline, B0, lr_scaling="gain")`` is ``baseline.solver()`` step
  by step, as with the defaults. Needs ``batch_size >= B0``.

  Args:
    baseline: the tuned :class:`Baseline`.
    batch_size: the target batch size ``B``.
    lower: lower ratio bound, a float ``>= 0`` or a schedule; ``None``: the
      rule's (`bounds`), or ``baseline.ratio_bounds[0]`` if set.
    upper: upper ratio bound, a float ``> 0`` or a schedule; ``None``: the
      rule's, or ``baseline.ratio_bounds[1]`` if set.
    ratio_source: ``"gradient"`` (DATE) or ``"update"`` (the base's output;
      with Adam this is LAMB with bounds), see `bounded_lars`.
    lr_scaling: as in :func:`scale_recipe`, or ``"gain"``: the measured
      AdaScale gain ``r`` in place of ``sqrt(k)`` (see *Measured gain*).
    warmup_scaling: as in :func:`scale_recipe` (with a `batch_schedule`,
      the warmup's scaling to the schedule's start).
    decay: the *learning-rate* decay after the warmup: ``None`` for the
      roller coaster, ``"baseline"`` for the baseline's own decay, or another
      decay (a name or a :class:`~date_optax.schedules.Decay`). A number is
      refused: RMSProp's decay is ``base_options={"decay": ...}``.
    learning_rate: replaces the recipe's schedule, e.g. a
      :class:`MultiStageRecipe`'s ``schedule``.
    bounds: the bound rule, one of :data:`BOUND_RULES` (see
      :func:`layer_lr_bounds`).
    critical_batch: the critical batch measured at ``B0``
      (:func:`date_optax.diagnostics.critical_batch`); a `batch_size` (with
      a `batch_schedule`, its start) more than 8 times it warns (see
      :func:`scale_recipe`).
    gain_clock: with ``lr_scaling="gain"`` (and only with it: another
      rule with ``"gain"`` is refused), how the schedule advances:
      ``"steps"`` (default) runs the LEGW recipe at ``B`` one iteration
      per step; ``"gain"`` runs the baseline's own DATE recipe (that at
      ``B0``: its warmup and roller coaster in ``B0`` iterations) on
      AdaScale's scale-invariant clock, which advances by the gain ``r``
      per step, cut wherever the run's epochs end. The default is the
      more robust one measured (docs/RESULTS.md, "Measured gain"): the
      gain clock was better at 64·B0 but diverged on 2 of 3 seeds of
      real-digit MNIST at 16·B0.
    batch_schedule: a :class:`BatchSchedule` growing the batch up to
      `batch_size` (see *Growing batch*), or None for a fixed batch.
    **solver_options: override ``baseline.optimizer_options``: the base's
      settings (``momentum``, ``b1``, ..., or a ``base_options`` mapping) and
      keywords of `bounded_lars` (``weight_decay``, ``weight_decay_mask``,
      ``trust_ratio_mask``, ``layer_axes``).

  Returns:
    An optax ``GradientTransformation``.

  Examples:
    >>> import jax.numpy as jnp
    >>> import date_optax
    >>> base = date_optax.Baseline(batch_size=1024, learning_rate=1.25e-3,
    ...     warmup_epochs=2, epochs=30, num_examples=59904,
    ...     optimizer="momentum", optimizer_options={"momentum": 0.9})
    >>> tx = date_optax.date(base, 8192)
    >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    >>> state = tx.init(params)
    >>> grads = {"w": jnp.ones((3, 2)), "b": jnp.ones(2)}
    >>> updates, state = tx.update(grads, state, params)
    >>> {k: float(v) for k, v in date_optax.trust_ratios(state).items()}
    {'b': 1.0, 'w': 1.0}
    >>> date_optax.date_recipe(base, 8192).total_steps  # what tx follows
    220

    A fixed batch schedule at ``B`` is LEGW at ``B`` (its warmup included):

    >>> fixed = date_optax.BatchSchedule.fixed(8192)
    >>> tx = date_optax.date(base, 8192, batch_schedule=fixed)
    >>> progress = date_optax.BatchProgress(batch_size=8192, examples=10 * 8192)
    >>> _, s = tx.update(grads, tx.init(params), params, batch_progress=progress)
    >>> lr = date_optax.date_recipe(base, 8192).schedule(10)  # step 11
    >>> bool(abs(float(s.lr_factor) - float(lr)) <= 1e-6 * float(lr))
    True

  References:
    You et al., `Large-batch training for LSTM and beyond
    <https://arxiv.org/abs/1901.08256>`_, SC 2019 (Algorithm 1, §3.5–3.6);
    Goyal et al., `Accurate, Large Minibatch SGD
    <https://arxiv.org/abs/1706.02677>`_, 2017 (no weight decay or special
    treatment of biases and batch-norm parameters); Johnson et al.,
    `AdaScale SGD <https://arxiv.org/abs/2007.05105>`_, ICML 2020 (the
    gain); Qiao et al., `Pollux: Co-adaptive Cluster Scheduling for
    Goodput-Optimized Deep Learning <https://arxiv.org/abs/2008.12260>`_,
    OSDI 2021 (the square-root gain for adaptive solvers, AdaptDL's
    ``AdamScale``).
  """
  check_baseline(baseline)
  check_solver_options(
      baseline.optimizer, solver_options, "solver_options", unknown=TypeError
  )
  validation.check_choice("lr_scaling", lr_scaling, LR_SCALING_RULES)
  validation.check_choice("gain_clock", gain_clock, ("steps", "gain"))
  schedule = bs_lib.check_schedule(batch_schedule)
  if schedule is not None:
    _check_growing(baseline, batch_size, schedule, lr_scaling, gain_clock, learning_rate)
  gain = lr_scaling == "gain"
  if gain_clock == "gain" and not gain:
    raise ValueError(
        f'gain_clock="gain" is the clock of the measured gain: it needs '
        f'lr_scaling="gain", got lr_scaling={lr_scaling!r} (whose schedule '
        'advances one iteration per step); pass lr_scaling="gain" or leave '
        'gain_clock="steps".'
    )
  if gain and batch_size < baseline.batch_size:
    raise ValueError(
        f'lr_scaling="gain" needs batch_size >= the baseline\'s '
        f"{baseline.batch_size} (the gain lies in [1, B/B0]), got {batch_size}."
    )
  validation.check_choice("bounds", bounds, BOUND_RULES)
  power = gain_power(baseline)
  if schedule is not None:
    # The LEGW recipe at the largest batch is not run (the schedule counts
    # examples at B0), only its bounds: those of the largest multiplier the
    # rule reaches, at k = max_batch / B0.
    recipe = None
    k = batch_size / baseline.batch_size
    m = {"sqrt": math.sqrt(k), "linear": k}.get(lr_scaling, k**power)
  else:
    recipe = date_recipe(
        baseline,
        batch_size,
        lr_scaling=lr_scaling,
        warmup_scaling=warmup_scaling,
        decay=decay,
        critical_batch=critical_batch,
    )
  if baseline.ratio_bounds is not None:
    default_lower, default_upper = baseline.ratio_bounds
  elif schedule is not None:
    if bounds == "fixed":
      default_lower, default_upper = DEFAULT_BOUNDS
    else:
      target = m if bounds == "baseline_to_recipe" else k
      default_lower, default_upper = min(1.0, target) / m, max(1.0, target) / m
  elif gain and bounds != "fixed":
    # The bound rules with the largest multiplier the gain can reach, k**p,
    # in place of the recipe's sqrt(k): [1/k**p, 1] (recipe) or
    # [1/k**p, k/k**p] (linear); [1, 1] at k = 1.
    m = recipe.scale**power
    target = m if bounds == "baseline_to_recipe" else recipe.scale
    default_lower, default_upper = min(1.0, target) / m, max(1.0, target) / m
  else:
    default_lower, default_upper = layer_lr_bounds(recipe, bounds)
  lower = default_lower if lower is None else lower
  upper = default_upper if upper is None else upper
  validation.check_bounds(lower, upper)
  clock_schedule = None
  clock_batch = baseline.batch_size
  if schedule is not None:
    validation.check_choice("warmup_scaling", warmup_scaling, sched_lib.SCALING_RULES)
    # The critical batch measured at B0 speaks of the batch the run starts
    # with; the schedule grows from there as the critical batch grows.
    critical_lib.warn_if_far(schedule.start, critical_batch,
                             "date(..., batch_schedule=...) at the schedule's start")
    if learning_rate is None:
      clock_batch = max(schedule.start, baseline.batch_size)
      clock_schedule = _start_recipe(
          baseline, schedule, clock_batch, lr_scaling, warmup_scaling, decay).schedule
    else:
      clock_schedule = learning_rate
    _check_clock(baseline, clock_batch)
    learning_rate = 1.0
  elif gain and gain_clock == "gain" and recipe.scale != 1:
    clock_schedule = (
        date_recipe(baseline, baseline.batch_size, decay=decay).schedule
        if learning_rate is None else learning_rate
    )
    learning_rate = 1.0
  if learning_rate is None:
    learning_rate = recipe.schedule
  base_options, options = lars_lib.split_base_options(
      baseline.optimizer, {**baseline.optimizer_options, **solver_options}
  )
  if "trust_ratio_mask" not in options and baseline.ratio_bounds is None:
    options["trust_ratio_mask"] = masks_lib.exclude_bias_and_norm
  # Explicit, so that the decayed leaves are the baseline's whatever rule
  # bounded_lars applies to a missing mask (None there may follow the trust
  # mask): ``True`` = every leaf, as ``optax.add_decayed_weights(mask=None)``.
  if options.get("weight_decay_mask") is None:
    options["weight_decay_mask"] = _every_leaf
  tx = lars_lib.bounded_lars(
      learning_rate,
      base=baseline.optimizer,
      lower=lower,
      upper=upper,
      ratio_source=ratio_source,
      base_options=base_options,
      **options,
  )
  if schedule is not None:
    tx = batch_lr_lib.scale_by_batch(
        tx, clock_schedule, baseline.batch_size, rule=lr_scaling, power=power,
        clock_batch_size=clock_batch,
    )
  elif gain:
    tx = gain_lib.scale_by_gain(
        tx, recipe.scale, power=power, learning_rate=clock_schedule,
        name='date(..., lr_scaling="gain")',
    )
  return _checked_leaves(tx, "date_optax.date")


def _checked_leaves(
    tx: optax.GradientTransformation, who: str
) -> optax.GradientTransformationExtraArgs:
  """`tx` whose init and update name `who` with a leaf it cannot take, before
  any piece inside sees it (:func:`validation.float_leaves`)."""
  tx = optax.with_extra_args_support(tx)

  def init_fn(params):
    return tx.init(validation.float_leaves(params, who))

  def update_fn(updates, state, params=None, **extra_args):
    if params is not None:
      params = validation.float_leaves(params, who)
    return tx.update(validation.number_leaves(updates, who), state, params, **extra_args)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _check_growing(
    baseline: Baseline, batch_size: Any, schedule: bs_lib.BatchSchedule,
    lr_scaling: Any, gain_clock: Any, learning_rate: Any,
) -> None:
  """What ``date(..., batch_schedule=...)`` needs of its other arguments."""
  if batch_size != schedule.max_batch:
    raise ValueError(
        f"batch_size={batch_size!r} must be the batch schedule's max_batch="
        f"{schedule.max_batch} (the batch the recipe's bounds are set for)."
    )
  if lr_scaling not in batch_lr_lib.BATCH_LR_RULES:
    raise ValueError(
        f"with a batch_schedule, lr_scaling must be one of {batch_lr_lib.BATCH_LR_RULES} "
        f"(the multiplier of the learning rate as the batch grows), got {lr_scaling!r}."
    )
  if lr_scaling == "gain" and schedule.start < baseline.batch_size:
    raise ValueError(
        f'lr_scaling="gain" needs the schedule to start at >= the baseline\'s '
        f"batch {baseline.batch_size}, got start={schedule.start}."
    )
  if gain_clock != "steps":
    raise ValueError(
        f"gain_clock={gain_clock!r} does not apply with a batch_schedule: the "
        'schedule already runs on examples; leave gain_clock="steps".'
    )
  if learning_rate is not None and not callable(learning_rate):
    raise TypeError(
        "with a batch_schedule, learning_rate must be a schedule in baseline "
        f"iterations (τ = examples // B0), got {learning_rate!r}."
    )
  total = int(math.ceil(baseline.epochs * baseline.num_examples))
  if total > bs_lib.MAX_EXAMPLES:
    raise ValueError(
        f"with a batch_schedule the run's examples, baseline.epochs x "
        f"baseline.num_examples = {total}, must be at most MAX_EXAMPLES = "
        f"{bs_lib.MAX_EXAMPLES} (2**62 - 1, the two-word count of the train state)."
    )
  schedule.check_run(total)


def _start_recipe(
    baseline: Baseline, schedule: bs_lib.BatchSchedule, clock_batch: int,
    lr_scaling: str, warmup_scaling: str, decay: Any,
) -> Recipe:
  """LEGW's DATE recipe at `clock_batch`, the batch a growing run starts from
  (at least B0), which ``date(..., batch_schedule=...)`` runs in examples."""
  try:
    return date_recipe(baseline, clock_batch, lr_scaling=lr_scaling,
                       warmup_scaling=warmup_scaling, decay=decay)
  except ValueError as e:
    if "reaches the end of training" not in str(e) and "rounds to 0" not in str(e):
      raise
    raise ValueError(
        f"batch_schedule's start={schedule.start}: a growing run takes LEGW's "
        f"warmup for its first batch ({e}) Start the schedule at a smaller "
        "batch, or shorten the baseline's warmup."
    ) from None


def _check_clock(baseline: Baseline, clock_batch: int) -> None:
  """The schedule's clock, iterations of `clock_batch`, must fit an int32."""
  total = int(math.ceil(baseline.epochs * baseline.num_examples))
  if total // clock_batch > batch_lr_lib.MAX_CLOCK:
    raise ValueError(
        f"with a batch_schedule the learning rate runs on a clock of "
        f"iterations of {clock_batch} examples, which must stay at most "
        f"{batch_lr_lib.MAX_CLOCK} (an int32 count): baseline.epochs x "
        f"baseline.num_examples = {total} must be at most "
        f"{batch_lr_lib.MAX_CLOCK * clock_batch + clock_batch - 1}."
    )
