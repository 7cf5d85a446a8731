"""Ghost and distributed batch normalisation: shared maths and the linen module.

The statistics of one normalisation *group* are computed over

* a ghost sub-batch of ``ghost_batch_size`` consecutive examples of one
  replica's batch (Hoffer et al., 2017), and
* the same ghost sub-batch of ``group_size`` consecutive replicas (the
  distributed batch norm of the TPU pod recipes, Ying et al., 2018; You et al.,
  2020 §4.1),

so a group holds ``ghost_batch_size * group_size`` examples (the *effective BN
batch*). The leading axis of the input is the batch axis.

Three ways to say where the replicas are:

* ``axis_name`` (``jax.pmap``, ``jax.shard_map``, ``jax.vmap``): each call sees
  one replica's batch; the group sum is one collective over ``axis_name``.
* ``num_replicas`` (plain ``jax.jit`` over a batch sharded along its leading
  axis): the call sees the global batch, read as ``num_replicas`` consecutive
  blocks; groups are formed by a reshape, and XLA turns the reduction over a
  group into a collective among the devices that hold it.
* neither: one device; only ``ghost_batch_size`` applies.

The flax.nnx module lives in ``batch_norm_nnx.py`` and shares
:func:`_group_moments` and :func:`_running_update` with the linen module here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from date_optax._src import validation

Array = jax.Array
AxisName = str | tuple[str, ...] | None
Initializer = Callable[..., Array]

# --------------------------------------------------------------------------
# Configuration checks shared by the linen and nnx modules.
# --------------------------------------------------------------------------


def _check_optional_size(name: str, value: Any) -> int | None:
  if value is None:
    return None
  return validation.check_int(name, value, low=1)


def _check_axis(axis: Any) -> tuple[int, ...]:
  axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)
  if not axes:
    raise ValueError("axis must name at least one feature axis, got ().")
  for a in axes:
    validation.check_int("axis", a)
  if 0 in axes:
    raise ValueError(
        "axis must not include 0: the leading axis is the batch axis that "
        f"ghost and group statistics split, got axis={axis!r}."
    )
  return axes


def _validate_config(
    *,
    ghost_batch_size: Any,
    group_size: Any,
    num_replicas: Any,
    axis_name: Any,
    axis: Any,
    momentum: Any,
    epsilon: Any,
    use_running_average: Any,
    use_bias: Any,
    use_scale: Any,
    use_fast_variance: Any,
) -> None:
  """Raises ValueError/TypeError naming the first bad constructor argument."""
  _check_optional_size("ghost_batch_size", ghost_batch_size)
  _check_optional_size("group_size", group_size)
  _check_optional_size("num_replicas", num_replicas)
  _check_axis(axis)
  validation.check_real("momentum", momentum, low=0.0, high=1.0)
  # epsilon = 0 turns a constant feature into 0 * inf = NaN.
  validation.check_positive("epsilon", epsilon)
  if use_running_average is not None:
    validation.check_bool("use_running_average", use_running_average)
  validation.check_bool("use_bias", use_bias)
  validation.check_bool("use_scale", use_scale)
  validation.check_bool("use_fast_variance", use_fast_variance)
  if axis_name is not None and not isinstance(axis_name, (str, tuple)):
    raise TypeError(
        f"axis_name must be None, a str or a tuple of str, got {axis_name!r}."
    )
  if num_replicas is not None and axis_name is not None:
    raise ValueError(
        "num_replicas must be None when axis_name is given: with axis_name each "
        "call sees one replica and the replicas are the devices along the axis; "
        "num_replicas describes a global batch under plain jit. Got "
        f"num_replicas={num_replicas!r}, axis_name={axis_name!r}."
    )
  if group_size is not None and group_size > 1:
    if axis_name is None and num_replicas is None:
      raise ValueError(
          f"group_size={group_size!r} needs replicas to group: pass axis_name "
          "(pmap/shard_map/vmap) or num_replicas (global batch under jit)."
      )
    if num_replicas is not None and num_replicas % group_size:
      raise ValueError(
          f"group_size must divide num_replicas, got group_size={group_size!r} "
          f"and num_replicas={num_replicas!r}."
      )


# --------------------------------------------------------------------------
# Statistics.
# --------------------------------------------------------------------------


def _canonical_feature_axes(ndim: int, axis: Any) -> tuple[int, ...]:
  axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)
  if ndim < 2:
    raise ValueError(
        f"GhostBatchNorm needs inputs of rank >= 2 (batch, ..., features), got "
        f"rank {ndim}."
    )
  out = []
  for a in axes:
    if not -ndim <= a < ndim:
      raise ValueError(f"axis {a} is out of range for an input of rank {ndim}.")
    out.append(a % ndim)
  if 0 in out:
    raise ValueError(
        f"axis must not resolve to the batch axis 0, got axis={axis!r} for an "
        f"input of rank {ndim}."
    )
  return tuple(sorted(set(out)))


def _axis_size(axis_name: str | tuple[str, ...]) -> int:
  if hasattr(lax, "axis_size"):
    return int(lax.axis_size(axis_name))
  return int(lax.psum(1, axis_name))  # older JAX: a static int for a constant


def _group_sum(
    value: Array, axis_name: AxisName, group_size: int | None
) -> tuple[Array, int]:
  """Sums `value` over groups of `group_size` consecutive replicas.

  Returns the sum and the number of replicas summed. One collective at most.
  """
  if axis_name is None:
    return value, 1
  size = _axis_size(axis_name)
  k = size if group_size is None else group_size
  if size % k:
    raise ValueError(
        f"group_size must divide the number of replicas along axis_name "
        f"{axis_name!r} ({size}), got group_size={group_size!r}."
    )
  if k == 1:
    return value, 1
  if k == size:
    return lax.psum(value, axis_name), k
  groups = [list(range(s, s + k)) for s in range(0, size, k)]
  try:
    # pmap and shard_map(check_vma=False) reduce inside each group natively.
    return lax.psum(value, axis_name, axis_index_groups=groups), k
  except NotImplementedError:
    # shard_map with its replication checker, and vmap, refuse
    # axis_index_groups. Gather every replica's moments (still one collective)
    # and add up this replica's group. A mesh sub-axis of size k passed as
    # axis_name with group_size=None moves less data; see the module docs.
    gathered = lax.all_gather(value, axis_name)
    start = (lax.axis_index(axis_name) // k) * k
    return lax.dynamic_slice_in_dim(gathered, start, k, axis=0).sum(axis=0), k


@dataclasses.dataclass(frozen=True)
class _Moments:
  """Group statistics laid out as (G, 1, J, 1, *rest) with size-1 reduced axes.

  `count` is the (count-weighted) number of examples per group statistic, or
  None when no mask is given (then every group holds the same number).
  """

  mean: Array
  var: Array
  count: Array | None
  layout_shape: tuple[int, ...]


def _layout(
    batch: int,
    *,
    ghost_batch_size: int | None,
    group_size: int | None,
    num_replicas: int | None,
) -> tuple[int, int, int, int]:
  """(G, K, J, g): groups, replicas per group, ghosts per replica, ghost size."""
  if num_replicas is not None:
    if batch % num_replicas:
      raise ValueError(
          f"The batch ({batch}) must be divisible by num_replicas "
          f"({num_replicas})."
      )
    per_replica = batch // num_replicas
    k = num_replicas if group_size is None else group_size
    groups = num_replicas // k
  else:
    per_replica, k, groups = batch, 1, 1
  g = per_replica if ghost_batch_size is None else ghost_batch_size
  if per_replica % g:
    raise ValueError(
        f"The per-replica batch ({per_replica}) must be divisible by "
        f"ghost_batch_size ({g})."
    )
  return groups, k, per_replica // g, g


def _group_moments(
    x: Array,
    mask: Array | None,
    *,
    feature_axes: tuple[int, ...],
    ghost_batch_size: int | None,
    group_size: int | None,
    num_replicas: int | None,
    axis_name: AxisName,
    use_fast_variance: bool,
) -> _Moments:
  """Mean and biased variance of every (group, ghost) in float32 or wider."""
  stat_dtype = jnp.promote_types(x.dtype, jnp.float32)
  G, K, J, g = _layout(
      x.shape[0],
      ghost_batch_size=ghost_batch_size,
      group_size=group_size,
      num_replicas=num_replicas,
  )
  layout_shape = (G, K, J, g) + tuple(x.shape[1:])
  xr = x.astype(stat_dtype).reshape(layout_shape)
  red = (1, 3) + tuple(i + 3 for i in range(1, x.ndim) if i not in feature_axes)

  if mask is None:
    # Equal counts everywhere: a mean over the group is the mean of the
    # replicas' means, so the collective carries means (well scaled in f32).
    def group_mean(*local):
      stacked = jnp.stack(local)
      total, k = _group_sum(stacked, axis_name, group_size)
      return tuple(total / k)

    if use_fast_variance:
      mean, mean_sq = group_mean(
          xr.mean(red, keepdims=True), jnp.square(xr).mean(red, keepdims=True)
      )
      var = jnp.maximum(mean_sq - jnp.square(mean), 0.0)
    else:
      (mean,) = group_mean(xr.mean(red, keepdims=True))
      (var,) = group_mean(jnp.square(xr - mean).mean(red, keepdims=True))
    return _Moments(mean, var, None, layout_shape)

  # With a mask, replicas hold different numbers of valid examples: sum values
  # and counts in one collective and divide afterwards (count-weighted).
  # Binary mask as in flax: any nonzero entry counts once.
  w = jnp.broadcast_to(jnp.asarray(mask, bool), x.shape).reshape(layout_shape)
  w = w.astype(stat_dtype)
  if use_fast_variance:
    s1, s2, n = _group_sum(
        jnp.stack([
            (w * xr).sum(red, keepdims=True),
            (w * jnp.square(xr)).sum(red, keepdims=True),
            w.sum(red, keepdims=True),
        ]),
        axis_name,
        group_size,
    )[0]
    safe_n = jnp.where(n > 0, n, 1.0)
    mean = s1 / safe_n
    var = jnp.maximum(s2 / safe_n - jnp.square(mean), 0.0)
  else:
    s1, n = _group_sum(
        jnp.stack([(w * xr).sum(red, keepdims=True), w.sum(red, keepdims=True)]),
        axis_name,
        group_size,
    )[0]
    safe_n = jnp.where(n > 0, n, 1.0)
    mean = s1 / safe_n
    s2, _ = _group_sum(
        (w * jnp.square(xr - mean)).sum(red, keepdims=True), axis_name, group_size
    )
    var = s2 / safe_n
  return _Moments(mean, var, n, layout_shape)


def _normalize(
    x: Array,
    mean: Array,
    var: Array,
    scale: Array | None,
    bias: Array | None,
    *,
    feature_axes: tuple[int, ...],
    epsilon: float,
    dtype: Any,
    layout_shape: tuple[int, ...] | None = None,
) -> Array:
  """scale * (x - mean) / sqrt(var + eps) + bias, in the statistics dtype.

  With `layout_shape` (training) the statistics are per group in that layout;
  without it (evaluation) they are per feature. The scale is folded into the
  per-group multiplier so each element costs one subtract and one FMA, as in
  flax; multiplying after reshaping back was measurably slower.
  """
  stat_dtype = jnp.promote_types(x.dtype, jnp.float32)
  out_dtype = _output_dtype(x.dtype, scale, bias, dtype)
  if layout_shape is None:
    layout_shape = tuple(x.shape)
    param_shape = _feature_broadcast_shape(x.shape, feature_axes)
    mean = jnp.asarray(mean, stat_dtype).reshape(param_shape)
    var = jnp.asarray(var, stat_dtype).reshape(param_shape)
  else:
    # Layout (G, K, J, g, *x.shape[1:]): input axis i >= 1 sits at i + 3.
    lead = len(layout_shape) - x.ndim + 1
    param_shape = (1,) * lead + tuple(
        d if i in feature_axes else 1 for i, d in enumerate(x.shape) if i > 0
    )
  mul = lax.rsqrt(var + epsilon)
  if scale is not None:
    mul = mul * jnp.asarray(scale).reshape(param_shape)
  y = (x.astype(stat_dtype).reshape(layout_shape) - mean) * mul
  if bias is not None:
    y = y + jnp.asarray(bias).reshape(param_shape)
  return y.reshape(x.shape).astype(out_dtype)


def _output_dtype(
    x_dtype: Any, scale: Array | None, bias: Array | None, dtype: Any
) -> Any:
  if dtype is not None:
    return dtype
  # Same rule as flax: infer from the input and the parameters.
  out = jnp.result_type(x_dtype, *(p.dtype for p in (scale, bias) if p is not None))
  return out if jnp.issubdtype(out, jnp.inexact) else jnp.float32


def _feature_broadcast_shape(
    shape: Sequence[int], feature_axes: tuple[int, ...]
) -> tuple[int, ...]:
  return tuple(d if i in feature_axes else 1 for i, d in enumerate(shape))


def _batch_moments_for_running_average(
    moments: _Moments, feature_shape: tuple[int, ...]
) -> tuple[Array, Array, Array | None]:
  """Averages the group statistics over groups and ghosts for the EMA.

  Every (group, ghost) statistic is weighted by its number of valid examples,
  so with equal counts this is the plain average of the statistics the layer
  normalised with (as tf.keras does for virtual batches). Returns the mean,
  the variance and, with a mask, whether any example was valid.
  """
  if moments.count is None:
    mean = moments.mean.mean((0, 2))
    var = moments.var.mean((0, 2))
    return mean.reshape(feature_shape), var.reshape(feature_shape), None
  n = moments.count
  total = n.sum((0, 2))
  safe = jnp.where(total > 0, total, 1.0)
  mean = (n * moments.mean).sum((0, 2)) / safe
  var = (n * moments.var).sum((0, 2)) / safe
  has_data = (total > 0).reshape(feature_shape)
  return mean.reshape(feature_shape), var.reshape(feature_shape), has_data


def _running_update(
    ra_mean: Array,
    ra_var: Array,
    moments: _Moments,
    momentum: float,
    feature_shape: tuple[int, ...],
) -> tuple[Array, Array]:
  """ra <- momentum * ra + (1 - momentum) * batch statistic (flax convention).

  Features with no valid example in the whole (masked) batch keep their
  running statistics.
  """
  mean, var, has_data = _batch_moments_for_running_average(moments, feature_shape)
  mean = lax.stop_gradient(mean)
  var = lax.stop_gradient(var)
  new_mean = momentum * ra_mean + (1.0 - momentum) * mean.astype(ra_mean.dtype)
  new_var = momentum * ra_var + (1.0 - momentum) * var.astype(ra_var.dtype)
  if has_data is not None:
    new_mean = jnp.where(has_data, new_mean, ra_mean)
    new_var = jnp.where(has_data, new_var, ra_var)
  return new_mean, new_var


def _layer_output(
    layer: Any,
    x: Array,
    mask: Array | None,
    ra_mean: Array,
    ra_var: Array,
    scale: Array | None,
    bias: Array | None,
    *,
    feature_axes: tuple[int, ...],
    use_running_average: bool,
    grouped: bool = True,
) -> tuple[Array, tuple[Array, Array] | None]:
  """A ghost batch norm layer's output and its new running averages.

  `layer` is the linen or the nnx `GhostBatchNorm`, read for its options;
  `ra_mean` and `ra_var` have the feature shape. With `use_running_average`
  the input is normalised with them and no new averages are returned (None);
  otherwise with its group statistics, which also update the averages.
  `grouped=False` (linen's `init`) takes whole-batch statistics without
  collectives and returns no new averages: `init` keeps the initial ones.
  """
  norm = dict(feature_axes=feature_axes, epsilon=layer.epsilon, dtype=layer.dtype)
  if use_running_average:
    return _normalize(x, ra_mean, ra_var, scale, bias, **norm), None
  moments = _group_moments(
      x,
      mask,
      feature_axes=feature_axes,
      ghost_batch_size=layer.ghost_batch_size if grouped else None,
      group_size=layer.group_size if grouped else None,
      num_replicas=layer.num_replicas if grouped else None,
      axis_name=layer.axis_name if grouped else None,
      use_fast_variance=layer.use_fast_variance,
  )
  running = None
  if grouped:
    feature_shape = tuple(x.shape[a] for a in feature_axes)
    running = _running_update(ra_mean, ra_var, moments, layer.momentum, feature_shape)
  y = _normalize(
      x, moments.mean, moments.var, scale, bias, layout_shape=moments.layout_shape,
      **norm,
  )
  return y, running


# --------------------------------------------------------------------------
# flax.linen module.
# --------------------------------------------------------------------------


class GhostBatchNorm(nn.Module):
  """Batch norm over ghost sub-batches and groups of replicas (flax.linen).

  A drop-in for :class:`flax.linen.BatchNorm` (same argument names, parameters
  ``scale``/``bias`` and ``batch_stats`` ``mean``/``var``) whose training
  statistics come from groups of ``ghost_batch_size * group_size`` examples:
  the ghost sub-batch ``j`` of each of ``group_size`` consecutive replicas.
  For every group :math:`S`, feature :math:`c` and mask weights :math:`w`

  .. math::

    \\mu_c = \\frac{\\sum_{i \\in S} w_i x_{ic}}{\\sum_{i \\in S} w_i}, \\quad
    \\sigma^2_c = \\max\\Big(0, \\frac{\\sum_{i \\in S} w_i x_{ic}^2}
    {\\sum_{i \\in S} w_i} - \\mu_c^2\\Big), \\quad
    y_{ic} = \\gamma_c \\frac{x_{ic} - \\mu_c}{\\sqrt{\\sigma^2_c + \\epsilon}}
    + \\beta_c,

  where :math:`i` runs over the batch and every non-feature axis. Statistics
  are computed in float32 (or wider), and the sums of :math:`x`,
  :math:`x^2` (and :math:`w` with a mask) travel in one stacked collective, so
  a mask weights every replica by its number of valid examples.

  The running averages follow flax: ``ra = momentum * ra + (1 - momentum) *
  stat``, with ``stat`` the count-weighted average over this call's groups and
  ghosts of the statistics used for normalising (biased variance). With ghosts
  the running variance is thus the mean within-ghost variance, the scale the
  layer was trained with (tf.keras does the same for virtual batches).
  Features with no valid example in a masked call keep their running
  averages. Evaluation (``use_running_average=True``) normalises with the
  running averages and accepts any batch size.

  Where the replicas are:

  * ``axis_name`` set (``jax.pmap``, ``jax.shard_map``, ``jax.vmap``): each
    call sees one replica. ``group_size=None`` reduces over the whole axis
    (synchronised BN); ``group_size=k`` uses ``axis_index_groups`` where JAX
    supports it (pmap); under ``shard_map`` (which refuses
    ``axis_index_groups``) it all-gathers the stacked moments along the axis
    and sums this replica's group slice. When the mesh can be built with a
    sub-axis for the group, e.g. axes ``("groups", "bn")`` of shape
    ``(R // k, k)``, pass ``axis_name="bn"`` and ``group_size=None`` instead:
    that is one psum of exactly the group's data. Replicas in different
    groups keep different running averages; average them (e.g.
    ``jax.lax.pmean(batch_stats, axis_name)``) before evaluating or saving.
  * ``num_replicas`` set (plain ``jax.jit`` on a batch sharded along its
    leading axis): the call sees the global batch, read as ``num_replicas``
    consecutive blocks (replica ``r`` holds rows ``r*b .. r*b+b-1``). Groups
    are formed by reshaping to ``(R // k, k, b // g, g, ...)`` and reducing, so
    the result equals the pmap path; the running averages are averaged over
    all groups (one replicated copy).
  * neither: one device; only ``ghost_batch_size`` applies.

  While ``init`` runs, the statistics are taken over the whole local batch
  without collectives or ghosts (as flax does), so any dummy batch works.
  The constructor arguments are dataclass fields, as in flax.linen.BatchNorm.

  Args:
    use_running_average: if True, normalise with the running averages.
    axis: feature axis or axes (not 0, which is the batch axis).
    momentum: EMA decay of the running averages, in [0, 1].
    epsilon: positive constant added to the variance.
    dtype: dtype of the result (default: inferred from input and params).
    param_dtype: dtype of ``scale`` and ``bias``.
    use_bias: learn a bias (beta).
    use_scale: learn a scale (gamma).
    bias_init: initialiser of the bias.
    scale_init: initialiser of the scale.
    axis_name: named axis (or tuple) over which replicas reduce; None (the
      default) means no collectives.
    use_fast_variance: E[x^2] - E[x]^2 with one collective (default); False
      uses E[(x - E[x])^2], more accurate, with a second collective.
    ghost_batch_size: examples per ghost sub-batch of one replica's batch;
      None uses the whole per-replica batch. Must divide it.
    group_size: consecutive replicas reduced together; None means all of them.
      Needs ``axis_name`` or ``num_replicas`` when greater than 1.
    num_replicas: replica blocks in the global batch under plain jit; must be
      None when ``axis_name`` is set.

  Examples:
    Ghost batches of 4 inside a batch of 8, on one device:

    >>> import jax, jax.numpy as jnp
    >>> from date_optax.nn import GhostBatchNorm
    >>> bn = GhostBatchNorm(use_running_average=False, ghost_batch_size=4)
    >>> x = jax.random.normal(jax.random.key(0), (8, 3))
    >>> variables = bn.init(jax.random.key(1), x)
    >>> y, updates = bn.apply(variables, x, mutable=["batch_stats"])
    >>> bool(jnp.allclose(y[:4].mean(0), 0.0, atol=1e-5))  # per ghost
    True

    Four replicas emulated with ``vmap``, statistics shared by pairs:

    >>> bn = GhostBatchNorm(use_running_average=False, axis_name="r", group_size=2)
    >>> xs = jax.random.normal(jax.random.key(2), (4, 8, 3))  # (replica, batch, C)
    >>> ys, _ = jax.vmap(
    ...     lambda x: bn.apply(variables, x, mutable=["batch_stats"]),
    ...     axis_name="r")(xs)
    >>> bool(jnp.allclose(ys[:2].mean((0, 1)), 0.0, atol=1e-5))  # group 0
    True

  References:
    Ioffe, Szegedy, 2015, "Batch normalization".
    Hoffer, Hubara, Soudry, 2017, "Train longer, generalize better".
    Ying et al., 2018, "Image classification at supercomputer scale".
    You et al., 2020, "The limit of the batch size", §4.1.
  """

  use_running_average: bool | None = None
  axis: int | tuple[int, ...] = -1
  momentum: float = 0.99
  epsilon: float = 1e-5
  dtype: Any = None
  param_dtype: Any = jnp.float32
  use_bias: bool = True
  use_scale: bool = True
  bias_init: Initializer = nn.initializers.zeros
  scale_init: Initializer = nn.initializers.ones
  axis_name: AxisName = None
  use_fast_variance: bool = True
  ghost_batch_size: int | None = None
  group_size: int | None = None
  num_replicas: int | None = None

  def __post_init__(self):
    _validate_config(
        ghost_batch_size=self.ghost_batch_size,
        group_size=self.group_size,
        num_replicas=self.num_replicas,
        axis_name=self.axis_name,
        axis=self.axis,
        momentum=self.momentum,
        epsilon=self.epsilon,
        use_running_average=self.use_running_average,
        use_bias=self.use_bias,
        use_scale=self.use_scale,
        use_fast_variance=self.use_fast_variance,
    )
    super().__post_init__()

  @nn.compact
  def __call__(
      self,
      x: jax.typing.ArrayLike,
      use_running_average: bool | None = None,
      *,
      mask: jax.typing.ArrayLike | None = None,
  ) -> Array:
    """Normalises `x` with group statistics (train) or running averages (eval).

    Args:
      x: input whose leading axis is the batch.
      use_running_average: overrides the attribute of the same name.
      mask: optional array broadcastable to ``x``; only positions where it is
        nonzero enter the statistics (all positions are normalised).

    Returns:
      The normalised input, same shape as ``x``.
    """
    use_running_average = nn.merge_param(
        "use_running_average", self.use_running_average, use_running_average
    )
    x = jnp.asarray(x)
    feature_axes = _canonical_feature_axes(x.ndim, self.axis)
    feature_shape = tuple(x.shape[a] for a in feature_axes)
    ra_mean = self.variable(
        "batch_stats", "mean", lambda s: jnp.zeros(s, jnp.float32), feature_shape
    )
    ra_var = self.variable(
        "batch_stats", "var", lambda s: jnp.ones(s, jnp.float32), feature_shape
    )
    scale = (
        self.param("scale", self.scale_init, feature_shape, self.param_dtype)
        if self.use_scale
        else None
    )
    bias = (
        self.param("bias", self.bias_init, feature_shape, self.param_dtype)
        if self.use_bias
        else None
    )

    y, running = _layer_output(
        self, x, mask, ra_mean.value, ra_var.value, scale, bias,
        feature_axes=feature_axes, use_running_average=use_running_average,
        grouped=not self.is_initializing(),
    )
    if running is not None:
      ra_mean.value, ra_var.value = running
    return y
