"""Ghost and distributed batch normalisation for flax.nnx.

Same statistics as the linen module in ``batch_norm.py`` (shared code), with
the constructor of :class:`flax.nnx.BatchNorm`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from date_optax._src import batch_norm as bn_lib
from date_optax._src import validation

_ZEROS = nnx.initializers.zeros_init()
_ONES = nnx.initializers.ones_init()


def _optional_param(use: bool, init: Any, rngs: nnx.Rngs, shape: tuple[int, ...],
                    dtype: Any, metadata: Mapping[str, Any]) -> Any:
  """``nnx.Param(init(key, shape, dtype), **metadata)``; ``nnx.data(None)`` if not `use`."""
  if not use:
    return nnx.data(None)
  return nnx.Param(init(rngs.params(), shape, dtype), **metadata)


class GhostBatchNorm(nnx.Module):
  """Batch norm over ghost sub-batches and groups of replicas (flax.nnx).

  The flax.nnx twin of :class:`date_optax.nn.GhostBatchNorm`: the same
  statistics, running averages, mask handling and replica layouts (read that
  class for the maths and for ``axis_name`` / ``group_size`` /
  ``num_replicas``), with the constructor of :class:`flax.nnx.BatchNorm`.
  Variables are ``mean`` and ``var`` (:class:`flax.nnx.BatchStat`) and
  ``scale`` and ``bias`` (:class:`flax.nnx.Param`), as in flax, so
  ``model.train()``, ``model.eval()`` and ``nnx.view(model,
  use_running_average=...)`` work as they do for :class:`flax.nnx.BatchNorm`.

  Args:
    num_features: size of the feature axis (the product of the sizes when
      ``axis`` names several axes).
    ghost_batch_size: examples per ghost sub-batch of one replica's batch;
      None uses the whole per-replica batch. Must divide it.
    group_size: consecutive replicas reduced together; None means all of them.
      Needs ``axis_name`` or ``num_replicas`` when greater than 1.
    num_replicas: replica blocks in the global batch under plain jit; must be
      None when ``axis_name`` is set.
    use_running_average: if True, normalise with the running averages.
    axis: feature axis or axes (not 0, which is the batch axis).
    momentum: EMA decay of the running averages, in [0, 1]:
      ``ra = momentum * ra + (1 - momentum) * stat``.
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
      uses E[(x - E[x])^2] with a second collective.
    rngs: random number generators for the initialisers.
    bias_metadata: metadata for the bias :class:`flax.nnx.Param`.
    scale_metadata: metadata for the scale :class:`flax.nnx.Param`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from flax import nnx
    >>> from date_optax.nn import nnx as dnnx
    >>> bn = dnnx.GhostBatchNorm(3, ghost_batch_size=4, rngs=nnx.Rngs(0))
    >>> x = jax.random.normal(jax.random.key(0), (8, 3))
    >>> y = bn(x)  # training mode: statistics per ghost of 4
    >>> bool(jnp.allclose(y[4:].mean(0), 0.0, atol=1e-5))
    True
    >>> bn.eval()  # running averages from now on, any batch size
    >>> bn(x[:1]).shape
    (1, 3)

  References:
    Hoffer, Hubara, Soudry, 2017, "Train longer, generalize better".
    Ying et al., 2018, "Image classification at supercomputer scale".
    You et al., 2020, "The limit of the batch size", §4.1.
  """

  def __init__(
      self,
      num_features: int,
      *,
      ghost_batch_size: int | None = None,
      group_size: int | None = None,
      num_replicas: int | None = None,
      use_running_average: bool | None = False,
      axis: int | tuple[int, ...] = -1,
      momentum: float = 0.99,
      epsilon: float = 1e-5,
      dtype: Any = None,
      param_dtype: Any = jnp.float32,
      use_bias: bool = True,
      use_scale: bool = True,
      bias_init: bn_lib.Initializer = _ZEROS,
      scale_init: bn_lib.Initializer = _ONES,
      axis_name: bn_lib.AxisName = None,
      use_fast_variance: bool = True,
      rngs: nnx.Rngs,
      bias_metadata: Mapping[str, Any] = MappingProxyType({}),
      scale_metadata: Mapping[str, Any] = MappingProxyType({}),
  ):
    validation.check_int("num_features", num_features, low=1)
    bn_lib._validate_config(
        ghost_batch_size=ghost_batch_size,
        group_size=group_size,
        num_replicas=num_replicas,
        axis_name=axis_name,
        axis=axis,
        momentum=momentum,
        epsilon=epsilon,
        use_running_average=use_running_average,
        use_bias=use_bias,
        use_scale=use_scale,
        use_fast_variance=use_fast_variance,
    )
    feature_shape = (num_features,)
    self.mean = nnx.BatchStat(jnp.zeros(feature_shape, jnp.float32))
    self.var = nnx.BatchStat(jnp.ones(feature_shape, jnp.float32))
    self.scale: nnx.Param | None = _optional_param(
        use_scale, scale_init, rngs, feature_shape, param_dtype, scale_metadata)
    self.bias: nnx.Param | None = _optional_param(
        use_bias, bias_init, rngs, feature_shape, param_dtype, bias_metadata)

    self.num_features = num_features
    self.ghost_batch_size = ghost_batch_size
    self.group_size = group_size
    self.num_replicas = num_replicas
    self.use_running_average = use_running_average
    self.axis = axis
    self.momentum = momentum
    self.epsilon = epsilon
    self.dtype = dtype
    self.param_dtype = param_dtype
    self.use_bias = use_bias
    self.use_scale = use_scale
    self.axis_name = axis_name
    self.use_fast_variance = use_fast_variance

  def __call__(
      self,
      x: jax.typing.ArrayLike,
      use_running_average: bool | None = None,
      *,
      mask: jax.typing.ArrayLike | None = None,
  ) -> jax.Array:
    """Normalises `x` with group statistics (train) or running averages (eval).

    Args:
      x: input whose leading axis is the batch.
      use_running_average: overrides the attribute of the same name.
      mask: optional array broadcastable to ``x``; only positions where it is
        nonzero enter the statistics (all positions are normalised).

    Returns:
      The normalised input, same shape as ``x``.
    """
    if use_running_average is None:
      use_running_average = self.use_running_average
    if use_running_average is None:
      raise ValueError(
          "use_running_average is None: pass it to the constructor or the call, "
          "or use model.train() / model.eval()."
      )
    x = jnp.asarray(x)
    feature_axes = bn_lib._canonical_feature_axes(x.ndim, self.axis)
    feature_shape = tuple(x.shape[a] for a in feature_axes)
    if math.prod(feature_shape) != self.num_features:
      raise ValueError(
          f"num_features={self.num_features} does not match the input's feature "
          f"axes {feature_axes} of sizes {feature_shape}."
      )
    scale = self.scale[...] if self.scale is not None else None
    bias = self.bias[...] if self.bias is not None else None
    y, running = bn_lib._layer_output(
        self, x, mask, self.mean[...].reshape(feature_shape),
        self.var[...].reshape(feature_shape), scale, bias,
        feature_axes=feature_axes, use_running_average=use_running_average,
    )
    if running is not None:
      self.mean[...] = running[0].reshape(self.mean[...].shape)
      self.var[...] = running[1].reshape(self.var[...].shape)
    return y

  def set_view(self, use_running_average: bool | None = None):
    """Used by ``nnx.view``: sets ``use_running_average`` when given.

    Args:
      use_running_average: if True, normalise with the running averages.
    """
    if use_running_average is not None:
      self.use_running_average = use_running_average
