"""`make_train_step`: the one entry with flat keywords for a step over a mesh.

It builds a `GradSync` and a `StepConfig` from its keywords and picks one of
the two builders, each with one program:

* `make_replicated_train_step` (`replicated_step`): parameters replicated;
  `shard_map` over the data axes with the per-replica body the `pmap` step
  runs too, whose one reduction is `grad_sync.sync_gradients` ("psum",
  "ring", "torus", any payload) and, with `shard_update=True`, a
  reduce-scatter / all-gather.
* `make_sharded_train_step` (`sharded_step`): parameters sharded over
  mesh axes by `(regex, PartitionSpec)` rules (tensor parallelism, FSDP); one GSPMD program whose
  reductions the compiler places, or, with any other `GradSync`, whose
  gradients `sync_gradients` reduces over the data axes in a `shard_map`
  island (`sharded_sync`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import jax
import optax

from date_optax._src.batch_schedule import BatchSchedule
from date_optax._src.parallel.comm.sync_config import GradSync, grad_sync_from
from date_optax._src.parallel.step.replicated_step import (
  ReplicatedTrainStep,
  make_replicated_train_step,
)
from date_optax._src.parallel.step.sharded_step import ShardedTrainStep, make_sharded_train_step
from date_optax._src.parallel.step.step_base import TrainStep
from date_optax._src.parallel.step.step_config import StepConfig, step_config_from
from date_optax._src.types import LossFn

__all__ = [
    "ReplicatedTrainStep",
    "ShardedTrainStep",
    "TrainStep",
    "make_replicated_train_step",
    "make_sharded_train_step",
    "make_train_step",
]


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    *,
    grad_reduce: str = "psum",
    shard_update: bool = False,
    compute_dtype: Any = None,
    donate: bool = True,
    has_aux: bool = False,
    data_axes: Sequence[Hashable] | None = None,
    max_consecutive_skips: int | None = None,
    microbatches: int = 1,
    param_sharding: Any = None,
    comm_dtype: Any = None,
    aps: bool | None = None,
    rounding: str = "nearest",
    block_size: int | None = None,
    measured_shift: bool = False,
    error_feedback: bool = False,
    grad_stats: bool = False,
    grad_stats_decay: float | None = None,
    grad_sync: GradSync | None = None,
    step_config: StepConfig | None = None,
    batch_schedule: BatchSchedule | None = None,
    max_rows_per_device: int | None = None,
) -> TrainStep:
  """Builds a synchronous data-parallel train step, `jit`-compiled over a mesh.

  Every device of `data_axes` holds a slice of the global batch; the step
  computes each slice's gradient, averages the gradients over the replicas
  once, and applies `optimizer`. The step is skipped (parameters, optimizer
  and model state unchanged, `consecutive_skips`/`total_skips` counted) when
  the loss or a gradient is NaN/Inf (`apply_gradients` says why the update
  itself is not checked).

  *Model state and keys.* Give `step.init` a `model_state` (flax's
  `batch_stats`) and the step calls `loss_fn(params, batch,
  model_state=...)`, which returns `(loss, new_model_state)`; float leaves
  of the new state are averaged over the replicas (so it stays replicated,
  as with cross-replica batch norm), integer leaves are taken from replica
  0. Give it an `rng` and the step also passes `rng=key`, with
  `key = fold_in(fold_in(fold_in(rng, step), replica), microbatch)`: no two
  replicas or microbatches share a dropout mask, and a resumed run draws
  the same keys.

  *Gradient accumulation.* With `microbatches=k` each replica splits its
  slice into k contiguous microbatches run one after the other under
  `lax.scan`; gradients accumulate in float32, the model state passes from
  one microbatch to the next, and the optimizer is applied once: one step
  per global batch, as the LEGW/DATE recipes count steps. Peak activation
  memory falls with k.

  *Sharded parameters.* `param_sharding` lays parameters (and the optimizer
  state that mirrors them) out over mesh axes (tensor parallelism over axes
  that carry no data; FSDP over the data axes themselves, with the
  compiler's psum), as a pytree of `PartitionSpec` or a list of
  `(regex, PartitionSpec)` rules matched (`re.fullmatch`) against
  '/'-joined parameter paths, first match wins, unmatched replicated. The
  step is then one GSPMD program (`jax.jit` with the state's shardings as
  in/out shardings): the replicas are a `vmap` over the data axes, and the
  compiler inserts the reductions, so trust-ratio norms over sharded layers
  are exact. Any other reduction (`grad_reduce`, `comm_dtype`, error
  feedback, ...) applies there too: each device reduces its replica's
  gradient of its own model shard over the data axes in that payload
  (`make_sharded_train_step`).

  *Low-precision gradient communication.* With `comm_dtype` the gradient
  payload of the all-reduce travels in bfloat16, float8_e4m3fn, float8_e5m2,
  int8, int4 or float4_e2m1fn: for "ring" and "torus" every partial sum is
  rounded to the format before it is sent (as hardware adding in the format
  would), for "psum" the payload is cast, summed by `lax.psum` on the format
  and cast back. A format of 8 bits or fewer is scaled by default: over
  "ring" and "torus" with block scales of 32 elements (`block_size`,
  MX-style, measured at every hop and carried beside the payload), over
  "psum" with APS; bfloat16 is not scaled. With `aps` (Auto-Precision
  Scaling, Han, Demmel and You 2020) each layer is first multiplied by a
  power of two chosen from its max-abs over the replicas so the sum fills
  the format's range without overflowing, and divided by it after the
  reduction; the max-abs values travel in one extra small `pmax` before the
  payload. Giving `aps` (True or False) turns the default blocks off; an
  integer format with no scaling at all rounds most gradients to zero and
  warns. A layer that is NaN/Inf on any replica arrives as NaN, so the
  non-finite skip still sees it. With `shard_update=True` the
  reduce-scatter carries the format and the all-gather of the new
  parameters stays float32. Rules and error bounds: `docs/algorithms.md`.

  *Gradient-noise statistics.* With `grad_stats=True` the step splits the
  global batch B into n = replicas × microbatches units of b = B/n examples
  and, from the units' squared gradient norms (mean S_b) and that of their
  average (S_B), estimates without bias the true gradient's squared norm
  |G|² = (n·S_B − S_b)/(n − 1) and the per-example covariance trace
  tr Σ = b·n·(S_b − S_B)/(n − 1) (McCandlish et al. 2018, appendix A). The
  per-replica scalar travels in the all-reduce that already averages the
  loss, so the statistics add no collective. Under a low-precision
  `grad_sync` S_B is not read from the compressed mean: each replica adds a
  random-sign sketch of its uncompressed gradient (one float per last-axis
  entry of each leaf) to that all-reduce, whose mean's squared norm
  estimates S_B without bias. Both are smoothed in the train
  state (`state.grad_stats`, a debiased moving average with factor
  `grad_stats_decay` per step, checkpointed with the state) and passed to
  the optimizer as `optimizer.update(..., grad_stats=date_optax.GradStats)`
  (optax's extra-args convention; plain transformations ignore them), which
  is what `date_optax.adascale` and `date(..., lr_scaling="gain")` read.
  Metrics gain "grad_noise_scale" (B_simple = tr Σ / |G|², of the smoothed
  values) and "gain" (the AdaScale gain r the optimizer computed if it
  applies one, `adascale` or `date(..., lr_scaling="gain")`, which for an
  adaptive base applies sqrt(r); else AdaScale's gain of B over one unit,
  S = n); "learning_rate" then includes the applied multiplier. A skipped step leaves the
  statistics unchanged. Needs n >= 2.

  *Growing batch.* With `batch_schedule` (`date_optax.BatchSchedule`:
  fixed, Megatron's ramp, or adaptive) rows come first: a global batch B
  gives each device B / replicas rows, run as the fewest microbatches (at
  least `microbatches`) that divide them and hold at most
  `max_rows_per_device` rows each, so a larger batch keeps every core
  busier and accumulates only above the cap: one compiled program per
  distinct batch size (`schedule.batch_sizes`; log2(max/start) + 1 for the
  adaptive doubling), each with a static `lax.scan` over its microbatches,
  and the optimizer applied once per step. The noise statistics count each
  program's own microbatches.
  `step.next_batch_size(state)` says how many examples the next call takes
  (a call with another number raises); it never waits for the steps in
  flight: an adaptive schedule decides on the device and its decision of
  step t applies from step t + 1 + lag, read on the host `lag` steps late.
  The schedule's progress is `state.batch_schedule`, checkpointed with the
  state (a restored state of a different schedule is refused). The
  optimizer gets `update(..., batch_progress=BatchProgress(batch_size,
  examples))`, the examples exact in two int32 words (what `date(...,
  batch_schedule=...)` counts its schedule in),
  and metrics gain "batch_size". Adaptive needs `grad_stats=True`.

  *Weight-update sharding.* With `shard_update=True` the gradients are
  reduce-scattered over the data axes instead: the optimizer state lives
  split over the replicas (on top of `param_sharding`), each replica updates
  its slice, and the new parameters are all-gathered. Norms that the
  optimizer takes over a layer span all the slices, so the result equals the
  unsharded step. The split axis of each array is its largest axis that the
  replicas divide; arrays without one stay whole.

  Args:
    loss_fn: `loss_fn(params, batch, *, model_state=..., rng=...)`, the *mean*
      loss over the batch it is given (one microbatch of one replica's slice
      of the global batch). The keywords are passed only when the state has
      a model state / key. Returns `loss`, or `(loss, aux)` with
      `has_aux=True`; with a model state `(loss, new_model_state)` or
      `(loss, (new_model_state, aux))`.
    optimizer: an optax gradient transformation.
    mesh: the device mesh (`data_mesh`, `torus_mesh`, or e.g.
      `jax.make_mesh((4, 2), ("data", "model"))`). The step uses its axes as
      auto (GSPMD) axes.
    grad_reduce: the all-reduce algorithm, "psum", "ring" (one ring over all
      data-parallel devices), "torus" (needs two data axes), "two_shot" or
      "hierarchical" (Cloud TPU Multislice: `data_axes=("dcn", "ici")`, the
      slices first; `GradSync` has the list).
    shard_update: split the optimizer state and update over the replicas.
    compute_dtype: e.g. `jnp.bfloat16` to run `loss_fn` on bfloat16 copies of
      the float parameters and batch leaves; the parameters, optimizer state,
      model state, loss and gradient reductions stay float32. `None` computes
      as stored.
    donate: donate the input state's buffers to the output.
    has_aux: `loss_fn` returns aux too; `metrics["aux"]` holds it with float
      leaves averaged and integer leaves summed over microbatches and
      replicas.
    data_axes: the mesh axes that carry replicas (default: all mesh axes, or
      with `param_sharding` the axes its specs do not name).
    max_consecutive_skips: when set, each call reads
      `metrics["consecutive_skips"]` on the host (waiting for the step) and
      raises `NonFiniteError` once it exceeds this number.
    microbatches: k >= 1 microbatches per replica (gradient accumulation);
      the global batch must divide by replicas × k.
    param_sharding: None (parameters replicated), a pytree of
      `PartitionSpec` shaped like the parameters, or a list of
      `(regex, PartitionSpec)` rules. Specs may name data axes only with
      the default float32 psum (FSDP; see `make_sharded_train_step`); a
      rule that matches no parameter warns at `init`.
    comm_dtype: the gradient payload format: None or "float32" (exact,
      float32 accumulation), "bfloat16", "float8_e4m3fn", "float8_e5m2",
      "int8", "int4" or "float4_e2m1fn" (names or dtypes). With
      `param_sharding` each device sends its model shard in the format.
    aps: Auto-Precision Scaling of each layer before the cast. None (with
      `block_size` and `measured_shift` unset) gives a format of at most 8
      bits its default scaling: block scales of 32 over "ring" and "torus"
      (the most accurate measured, see `GradSync`), APS over "psum";
      bfloat16 gets neither. Needs a low-precision `comm_dtype`.
    rounding: how the payload is rounded to `comm_dtype` at every hop:
      "nearest" (default) or "stochastic" (unbiased; needs a low-precision
      `comm_dtype`). The key of step s is `fold_in(fold_in(rng, 0x5352), s)`
      with the state's `rng`, or with `jax.random.PRNGKey(0)` when the state
      has none; the all-reduce folds in the replica index, so the keys
      depend on (step, replica) only, whatever the process layout.
    block_size: None (the default, as for `aps`), or MX-style block
      scaling: one power-of-two scale per block of this many elements of a
      layer (an integer in [1, 65536]; MX uses 32), measured at every hop
      and carried beside the payload.
      Needs a low-precision `comm_dtype` and "ring" or "torus" (see
      `GradSync` and `docs/algorithms.md`).
    measured_shift: one scale per layer piece of every message, measured at
      every hop (allows for cancellation, unlike APS's worst case). Needs a
      low-precision `comm_dtype` and "ring" or "torus"; excludes
      `block_size`.
    error_feedback: two-stage error feedback (EF-SGD, Karimireddy et al.
      2019; the worker and server error compensation of 1-bit Adam, Tang et
      al. 2021): each replica adds the residual of its last compression to
      its next gradient before compressing, and over "ring"/"torus" each
      device adds the residual of every partial sum it forwarded, and of
      its gathered payload, the next time it sends the same place, so what
      the payload format drops is delivered later instead of lost. The
      residuals live in `state.grad_residual`, an `ErrorFeedbackState`
      (`worker` and `hop`, float32, each one copy of the parameters per
      replica with a leading replica axis split over the data axes; `hop`
      is None for "psum", 1/N of it for "two_shot"; "hierarchical" keeps
      shards of 1/M of each, M the devices of one slice; bfloat16, whose own
      rounding is lost, with `GradSync(residual_dtype="bfloat16")`), are
      checkpointed with the state and kept unchanged by a skipped step; a
      state without them (`grad_residual=None`, e.g. to resume on another
      replica count) starts from zeros. Needs a low-precision `comm_dtype`.
      See `sync_gradients`.
    grad_stats: measure gradient-noise statistics (see above); needs more
      than one replica or `microbatches >= 2`.
    grad_stats_decay: the moving-average factor, in [0, 1): per step for a
      fixed batch, where None means fairscale AdaScale's default for n
      units, `max(1 - n/1000, 0) ** n` (0.938 for 8 units); with a
      `batch_schedule` per `start` examples (a step of batch B applies
      `decay ** (B / start)`: smoothing per example seen, the same for any
      number of devices), where None means 0.99.
    grad_sync: a `GradSync` holding `grad_reduce`, `comm_dtype`, `aps`,
      `rounding`, `block_size`, `measured_shift` and `error_feedback` (and a
      torus `grid`); give it or those flat keywords.
    step_config: a `StepConfig` holding `microbatches`, `compute_dtype`,
      `donate`, `has_aux` and `max_consecutive_skips`; give it or those
      flat keywords.
    batch_schedule: a `date_optax.BatchSchedule` to grow the global batch
      (see *Growing batch*), or None.
    max_rows_per_device: with a `batch_schedule`, the most rows one
      microbatch of one device may hold (at least the first batch's); a
      larger batch accumulates microbatches above it. None: no cap, every
      batch runs in `microbatches` microbatches per device (the fewest that
      divide its rows). Measure what fits with `date_optax.parallel.
      compile_report` (per batch size: `schedule.batch_sizes`).

  Returns:
    A `TrainStep` (a `ReplicatedTrainStep`, or a `ShardedTrainStep` with
    `param_sharding`): `state, metrics = step(state, batch)`, with
    `step.init(params, model_state=None, rng=None)` to build the state.
    `batch` is a pytree whose leaves have the global batch as leading
    dimension (NumPy arrays are this host's rows of it). `metrics` holds
    "loss" (float32 mean over the global batch), "grad_norm" (global L2 norm
    of the mean gradient), "skipped", "consecutive_skips", "total_skips",
    and, when the optimizer keeps per-layer trust ratios, "trust_ratios"
    (the state's `date_optax.LayerRatios` record, one array for all layers:
    `.unpack()` or `date_optax.diagnostics.per_layer_ratios` name them
    by layer) with their summary "trust_ratio/min",
    "/median", "/max", "/frac_at_lower" and "/frac_at_upper" (see
    `date_optax.diagnostics.trust_ratio_summary`; the bounds are those the
    optimizer recorded, `date_optax.trust_ratio_bounds`), and
    "learning_rate" where the optimizer state records it
    (`date_optax.current_learning_rate`: date_optax's optimizers, `date()`,
    `optax.inject_hyperparams`).

  Raises:
    ValueError: for arguments out of range, `grad_sync` or `step_config`
      given with the flat keywords they hold, a spec that names a data axis or
      an unknown axis, or (at the call, before the step runs) a batch that
      does not divide over replicas × microbatches or has 0 rows, or a state
      whose `grad_residual` (error feedback) or `grad_stats` does not fit
      the step.
    TypeError: for arguments of the wrong kind, or (at `init`) a parameter
      that is not a float array, or (at the call) a state that is not a
      `TrainState`, a batch leaf that is not numeric, a `loss_fn` that does
      not take the `rng=`/`model_state=` the state makes the step pass, or
      whose return does not match the state it was given.

  Examples:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> import date_optax
    >>> import date_optax.parallel as dp
    >>> mesh = dp.data_mesh()
    >>> def loss_fn(params, batch):
    ...   return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)
    >>> step = dp.make_train_step(loss_fn, date_optax.lamb(1e-2), mesh,
    ...                           microbatches=2)
    >>> state = step.init({"w": np.zeros((3, 1), np.float32)})
    >>> batch = {"x": np.ones((16, 3), np.float32), "y": np.ones((16, 1), np.float32)}
    >>> state, metrics = step(state, batch)
    >>> int(state.step), float(metrics["loss"])
    (1, 1.0)

    The same step with an int8 payload, stochastically rounded:

    >>> step = dp.make_train_step(loss_fn, date_optax.lamb(1e-2), mesh,
    ...                           grad_reduce="ring", comm_dtype="int8",
    ...                           rounding="stochastic")
    >>> state, metrics = step(step.init({"w": np.zeros((3, 1), np.float32)}), batch)
    >>> int(state.step), float(metrics["loss"])
    (1, 1.0)

    The same options as configs, the form the two builders take:

    >>> sync = dp.GradSync("ring", comm_dtype="int8", rounding="stochastic")
    >>> step = dp.make_train_step(loss_fn, date_optax.lamb(1e-2), mesh,
    ...                           grad_sync=sync)
    >>> state, metrics = step(step.init({"w": np.zeros((3, 1), np.float32)}), batch)
    >>> int(state.step), float(metrics["loss"])
    (1, 1.0)

    A 4-bit payload with block scales and error feedback; the state holds
    each replica's residuals, its contribution's and its hops':

    >>> step = dp.make_train_step(loss_fn, date_optax.lamb(1e-2), mesh,
    ...                           grad_reduce="ring", comm_dtype="int4",
    ...                           block_size=32, error_feedback=True)
    >>> state, metrics = step(step.init({"w": np.zeros((3, 1), np.float32)}), batch)
    >>> residual = state.grad_residual
    >>> residual.worker["w"].shape == residual.hop["w"].shape == (mesh.size, 3, 1)
    True

  References:
    Goyal et al., "Accurate, Large Minibatch SGD", 2017; Ying et al., "Image
    Classification at Supercomputer Scale", 2018; Xu et al., "Automatic
    Cross-Replica Sharding of Weight Update in Data-Parallel Training", 2020;
    Xu et al., "GSPMD: General and Scalable Parallelization for ML Computation
    Graphs", 2021; Ioffe and Szegedy, "Batch Normalization", 2015; Han,
    Demmel and You, "Auto-Precision Scaling for Distributed Deep Learning",
    2020, https://arxiv.org/abs/2003.00119; Gupta et al., "Deep Learning
    with Limited Numerical Precision", ICML 2015,
    https://arxiv.org/abs/1502.02551; Karimireddy et al., "Error Feedback
    Fixes SignSGD and other Gradient Compression Schemes", ICML 2019,
    https://arxiv.org/abs/1901.09847; Tang et al., "1-bit Adam", ICML 2021,
    https://arxiv.org/abs/2102.02888.
  """
  sync = grad_sync_from(
      grad_sync, grad_reduce=grad_reduce, comm_dtype=comm_dtype, aps=aps, rounding=rounding,
      block_size=block_size, measured_shift=measured_shift,
      error_feedback=error_feedback,
  )
  config = step_config_from(
      step_config, microbatches=microbatches, compute_dtype=compute_dtype,
      donate=donate, has_aux=has_aux, max_consecutive_skips=max_consecutive_skips,
  )
  options = dict(step_config=config, shard_update=shard_update, data_axes=data_axes,
                 grad_stats=grad_stats, grad_stats_decay=grad_stats_decay,
                 batch_schedule=batch_schedule, max_rows_per_device=max_rows_per_device)
  if param_sharding is None:
    return make_replicated_train_step(loss_fn, optimizer, mesh, grad_sync=sync, **options)
  return make_sharded_train_step(
      loss_fn, optimizer, mesh, param_sharding=param_sharding, grad_sync=sync, **options
  )
