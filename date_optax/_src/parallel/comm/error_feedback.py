"""Two-stage error feedback: the residuals of every rounding a reduction makes.

A low-precision reduction rounds in two kinds of places. Each replica
rounds its own contribution (the *worker* residual of EF-SGD, Karimireddy
et al. 2019), and a ring or torus rounds again every partial sum it
forwards and, when the gather is compressed, the final sum it sends (the
*hop* residuals, DeepSpeed 1-bit Adam/LAMB's "server error", Tang et al.
2021, Li et al. 2021). `ErrorFeedbackState` holds both; `grad_sync` feeds
them through the reduction and `collectives.send_with_feedback` is the rule
applied at each hop.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from date_optax._src import validation
from date_optax._src.parallel.comm import low_precision as lp
from date_optax._src.types import PyTree

#: The algorithms with a second rounding stage to feed back (`hop` not None):
#: the hops of "ring"/"torus", the owner's rounding of "two_shot", those of
#: the cross-slice sum of "hierarchical".
HOP_ALGORITHMS = ("ring", "torus", "two_shot", "hierarchical")
#: The dtypes the residuals may be stored in (`GradSync.residual_dtype`).
RESIDUAL_DTYPES = ("float32", "bfloat16")


def check_residual_dtype(sync: Any) -> str:
  """`sync.residual_dtype` as a name of `RESIDUAL_DTYPES`; refused without EF."""
  try:
    name = jnp.dtype(sync.residual_dtype).name
  except (TypeError, ValueError):
    name = None
  if name not in RESIDUAL_DTYPES:
    raise ValueError(
        f"residual_dtype must be one of {RESIDUAL_DTYPES} (a name or the dtype), got "
        f"{sync.residual_dtype!r}."
    )
  if name != "float32" and not sync.error_feedback:
    raise ValueError(
        f"residual_dtype={name!r} is the storage of error-feedback residuals: it "
        "needs error_feedback=True; pass error_feedback=True or leave residual_dtype."
    )
  return name


class ErrorFeedbackState(NamedTuple):
  """This device's error-feedback residuals: its contribution's and its hops'.

  What `TrainState.grad_residual` holds for a step built with
  `error_feedback=True`, and what `sync_gradients(..., residual=)` takes
  and returns. With `x = g / N` this replica's share of the mean and `C`
  the payload format's rounding:

  .. math::

    s = C(x + e_w), \\quad e_w' = x + e_w - s

  for its own contribution (the *worker* residual), and at every place
  where a "ring" or "torus" rounds a message this device sends (each
  partial sum `p` of chunk position j it forwards in the reduce-scatter,
  and its own reduced chunk when it sends it in the all-gather, or rounds
  it as its shard under `shard_update`)

  .. math::

    \\text{sent} = C(p + f_j), \\quad f_j' = p + f_j - C(p + f_j).

  Each element position of the packed gradient is rounded by a given
  device at exactly one place per step (a device forwards the N - 1
  chunks that are not its own, once each, and sends its own chunk in the
  gather; on the torus each of the two phases forwards a disjoint part),
  so one buffer shaped like the gradients holds all of a device's `f_j`.
  With every rounding fed back, what the optimizer received over T steps
  is the exact sum minus the residuals left at step T.

  Memory: two float32 copies of the gradient per device, 8 bytes per
  gradient element (2 bytes per byte of a float32 gradient, 4 per byte of
  a bfloat16 one); with "psum" (no hops to feed back: `hop` is None) one
  copy, 4 bytes per element. `GradSync(residual_dtype="bfloat16")` stores
  them in bfloat16 and halves that (4 bytes per element, 2 with "psum");
  the arithmetic stays float32, but each step's rounding of a residual to
  bfloat16 (at most 2^-9 of it) is not fed back: it is lost. After 24
  constant int4 steps that lost 9e-5 of the exact sum ("ring"; 9e-5 with
  "two_shot"), against 4e-8 (float32 additions) with float32 residuals,
  and moved the result 1.57 % from float32 instead of 1.55 % (0.81 %
  instead of 0.80 %). Padding of the packed buffer is never
  stored. Both are kept in the units of the gradient (APS shifts and block
  scales are undone), so they survive a change of scale between steps.

  "two_shot" (1-bit Adam's reduce-scatter, `two_shot.two_shot_sum`) rounds
  each element twice: the worker rule above on each chunk it sends, and
  the owner's rule on the float32 sum of its chunk, `f` then the owner's
  *server* residual, one flat `(ceil(size / N),)` chunk per leaf (chunk k
  of the leaf flattened and zero-padded to a multiple of N, or under
  `shard_update` replica k's shard): `1 + 1/N` gradients per device.

  "hierarchical" over S slices of M devices (`hierarchical_reduce`) sums
  each slice exactly first and rounds only across the slices, on this
  device's shard of the slice's sum: `worker` is one flat
  `(ceil(size / M),)` shard per leaf, `hop` the cross-slice algorithm's
  on that shard, `(ceil(ceil(size / M) / S),)` for "two_shot" (its server
  residual) and `(ceil(size / M),)` for "ring": `(1 + 1/S) / M` and
  `2 / M` gradients per device.

  Attributes:
    worker: the residual of this replica's own compressed contribution,
      float32 (or `residual_dtype`), shaped like the gradients.
    hop: the residuals of the messages this device rounds on the way,
      like `worker`; this device's chunks for "two_shot"; None for "psum".

  Examples:
    >>> import jax.numpy as jnp
    >>> import date_optax.parallel as dp
    >>> sync = dp.GradSync("ring", comm_dtype="int8", error_feedback=True)
    >>> state = dp.ErrorFeedbackState.zeros({"w": jnp.ones((2, 3))}, sync)
    >>> state.worker["w"].shape, state.hop["w"].dtype
    ((2, 3), dtype('float32'))
    >>> dp.ErrorFeedbackState.zeros({"w": jnp.ones(3)}, dp.GradSync(
    ...     "psum", comm_dtype="int8", error_feedback=True)).hop is None
    True
    >>> two = dp.GradSync("two_shot", comm_dtype="int4", error_feedback=True)
    >>> dp.ErrorFeedbackState.zeros({"w": jnp.ones((2, 3))}, two, chunks=4).hop["w"].shape
    (2,)
    >>> multi = dp.GradSync("hierarchical", comm_dtype="int8", error_feedback=True)
    >>> e = dp.ErrorFeedbackState.zeros({"w": jnp.ones((16, 8))}, multi, chunks=8, slices=2)
    >>> e.worker["w"].shape, e.hop["w"].shape  # 128 / 4 in-slice, then / 2 slices
    ((32,), (16,))

  References:
    Karimireddy et al., "Error Feedback Fixes SignSGD and other Gradient
    Compression Schemes", ICML 2019, https://arxiv.org/abs/1901.09847;
    Tang et al., "1-bit Adam: Communication Efficient Large-Scale Training
    with Adam's Convergence Speed", ICML 2021,
    https://arxiv.org/abs/2102.02888; Li et al., "1-bit LAMB:
    Communication Efficient Large-Scale Large-Batch Training with LAMB's
    Convergence Speed", 2021, https://arxiv.org/abs/2104.06069.
  """

  worker: PyTree
  hop: PyTree = None

  @classmethod
  def zeros(
      cls, tree: PyTree, grad_sync: Any, replicas: int | None = None, *,
      chunks: int | None = None, slices: int | None = None,
  ) -> ErrorFeedbackState:
    """Fresh residuals for gradients shaped like `tree` under `grad_sync`.

    Args:
      tree: the parameters (or gradients), or their `jax.ShapeDtypeStruct`.
      grad_sync: the `GradSync`; its algorithm decides whether there are
        hop residuals.
      replicas: with a number, every leaf gets a leading replica axis of
        that length (the layout of a step over a mesh).
      chunks: the number N of replicas the reduction runs over (default:
        `replicas`), an integer >= 1; "two_shot" and "hierarchical" need it
        (their residuals hold flat chunks of each leaf), the others ignore it.
      slices: "hierarchical" only (others ignore it): the number S of
        slices, the first of its two data axes, an integer >= 1 that
        divides N; the in-slice axis has `M = N / S` devices.

    Returns:
      Zeros of `grad_sync.residual_dtype` (float32 by default): `worker`
      shaped like `tree` (one `(ceil(size / M),)` shard per leaf for
      "hierarchical"); `hop` shaped like it ("ring", "torus"), one
      `(ceil(size / N),)` chunk per leaf ("two_shot"), those of the class
      docstring ("hierarchical"), or None ("psum").

    Raises:
      ValueError: "two_shot" or "hierarchical" with neither `chunks` nor
        `replicas`, "hierarchical" without `slices` or with `slices` that
        does not divide N, or `chunks` or `slices` below 1.
    """
    lead = () if replicas is None else (replicas,)
    dtype = jnp.dtype(getattr(grad_sync, "residual_dtype", "float32"))
    zeros = lambda shape: jax.tree.map(lambda x: jnp.zeros(lead + shape(x), dtype), tree)
    chunks = replicas if chunks is None else validation.check_int("chunks", chunks, low=1)
    ceil = lambda x, n: -(-math.prod(jnp.shape(x)) // n)
    if grad_sync.algorithm == "hierarchical":
      in_slice = _in_slice(chunks, slices)
      shard = lambda x: (ceil(x, in_slice),)
      if grad_sync.dcn_algorithm == "ring":
        return cls(zeros(shard), zeros(shard))
      return cls(zeros(shard), zeros(lambda x: (-(-shard(x)[0] // slices),)))
    if grad_sync.algorithm == "two_shot":
      if chunks is None:
        raise ValueError(
            "two_shot's server residual is 1/N of each gradient: pass chunks=N (the "
            "number of replicas) or replicas=N."
        )
      return cls(zeros(jnp.shape), zeros(lambda x: (ceil(x, chunks),)))
    return cls(zeros(jnp.shape), zeros(jnp.shape) if grad_sync.algorithm in HOP_ALGORITHMS
               else None)


def _in_slice(chunks: int | None, slices: Any) -> int:
  """M = N / S, the devices of one slice, for "hierarchical"'s residuals."""
  if chunks is None or slices is None:
    raise ValueError(
        "hierarchical's residuals are shards of 1/M of each gradient, M the devices "
        "of one slice: pass chunks=N (or replicas=N, all replicas) and slices=S "
        f"(the slices, the first data axis); got chunks={chunks!r}, slices={slices!r}."
    )
  slices = validation.check_int("slices", slices, low=1)
  if chunks % slices:
    raise ValueError(
        f"slices={slices} must divide the number of replicas, chunks={chunks}: the "
        "hierarchical sync runs over S slices of N / S devices each."
    )
  return chunks // slices


def compress(x: jax.Array, fmt: Any, sync: Any) -> jax.Array:
  """C(x): one replica's own contribution as the payload format carries it.

  `x` is float32 and already APS-shifted. Without measured scales C rounds
  every element to `fmt` (the first rounding the reduction applies to each
  replica's rows anyway, so a contribution already on the grid travels
  unchanged); with `block_size` B it is `ScaledFormat`'s rounding of the
  leaf, flattened row-major and zero-padded to whole blocks, one scale per
  block measured on this replica's values; with `measured_shift` one scale
  for the whole leaf.
  """
  if not sync.measures_scales:
    return fmt.round(x)
  flat = x.reshape(-1)
  if sync.block_size is not None:
    pad = (-flat.size) % sync.block_size
    codec = lp.ScaledFormat(fmt, block_size=sync.block_size)
    return codec.round(jnp.pad(flat, (0, pad)))[: flat.size].reshape(x.shape)
  codec = lp.ScaledFormat(fmt, groups=1)
  return codec.round(flat, jnp.zeros(flat.size, jnp.int32)).reshape(x.shape)


def split_residual(residual: Any) -> tuple[Any, Any, bool]:
  """`(worker, hop, two_stage)` of `sync_gradients`'s `residual=`.

  An `ErrorFeedbackState` gives both; a bare pytree is the worker residual
  of the one-stage rule (no hop residuals).
  """
  if isinstance(residual, ErrorFeedbackState):
    return residual.worker, residual.hop, True
  return residual, None, False
