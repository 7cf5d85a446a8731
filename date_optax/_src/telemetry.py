"""Trust-ratio telemetry computed inside the step: summaries and per-layer names.

Host-side output lives beside it: the CSV/TensorBoard writer in
`metric_writer.py` and the heatmap in `plots.py` (matplotlib).

The ratios come from `date_optax.trust_ratios(opt_state)`: a pytree shaped like
the parameters whose leaves are float32 arrays of shape `()` (one layer) or
`(L,)` (a stacked leaf holding L layers); the functions also take the state's
own record, a `date_optax.LayerRatios` (one vector for all layers).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from date_optax._src import layer_ratios as layer_ratios_lib
from date_optax._src import masks as masks_lib
from date_optax._src import validation
from date_optax._src.types import PyTree

_F32 = jnp.float32
# A ratio counts as "at a bound" within a few float32 ulps of it: a bound that
# is a schedule value may be rounded differently from the clip that produced
# the ratio.
BOUND_RTOL = 4 * float(np.finfo(np.float32).eps)


def _check_ratios(ratios: Any) -> list[jax.Array]:
  if ratios is None:
    raise ValueError(
        "ratios is None: the optimizer keeps no trust ratios "
        "(date_optax.trust_ratios(opt_state) returned None)."
    )
  leaves = jax.tree.leaves(ratios)
  if not leaves:
    raise ValueError("ratios has no leaves: there is no layer to summarise.")
  return leaves


def _check_bound(name: str, value: Any) -> None:
  # Traced bounds (e.g. a schedule evaluated inside a jitted step) are accepted
  # as is; concrete ones are validated.
  if value is None or isinstance(value, jax.core.Tracer):
    return
  if name == "upper" and np.ndim(value) == 0 and float(value) == float("inf"):
    return  # no upper bound, as `trust_ratio_bounds` reports an unbounded one
  validation.check_nonnegative(name, value)


def trust_ratio_summary(
    ratios: PyTree,
    lower: float | jax.Array | None = None,
    upper: float | jax.Array | None = None,
    *,
    prefix: str = "",
) -> dict[str, jax.Array]:
  """Summarises per-layer trust ratios over all layers, for step metrics.

  Every layer counts once: a leaf of shape `()` is one layer, a stacked leaf
  of shape `(L,)` is L layers. Layers that a trust-ratio mask excludes carry a
  ratio of 1 in the optimizer state and are counted like the others. A ratio
  is *at* a bound when it is within 4 float32 ulps of it (a bound given as a
  schedule value may round differently from the clip that produced the
  ratio). Without a bound, the fraction at it is 0.

  The function is jit-able (`prefix` must be static) and returns float32
  scalars, so it can run inside a train step.

  Args:
    ratios: the per-layer ratios, e.g. `date_optax.trust_ratios(opt_state)`,
      or a `date_optax.LayerRatios` record (the train step's
      `metrics["trust_ratios"]`).
    lower: the lower bound in force at this step (a float or a scalar array),
      or None.
    upper: the upper bound in force at this step (+inf: none), or None.
    prefix: prepended to every key, e.g. `"trust_ratio/"`.

  Returns:
    A dict with keys `min`, `median`, `max`, `frac_at_lower`, `frac_at_upper`
    (each preceded by `prefix`) mapping to float32 scalars.

  Raises:
    ValueError: if `ratios` is None or has no leaves, or a bound is negative.

  Examples:
    >>> import jax.numpy as jnp
    >>> from date_optax.diagnostics import trust_ratio_summary
    >>> ratios = {'a': jnp.float32(0.01), 'b': jnp.float32(2.0),
    ...           'c': jnp.array([10.0, 10.0], jnp.float32)}
    >>> s = trust_ratio_summary(ratios, lower=0.01, upper=10.0)
    >>> [round(float(s[k]), 3) for k in ('min', 'median', 'max')]
    [0.01, 6.0, 10.0]
    >>> float(s['frac_at_lower']), float(s['frac_at_upper'])
    (0.25, 0.5)

  References:
    You, Li, Reddi, Hseu, Kumar, Bhojanapalli, Song, Demmel, Keutzer, Hsieh,
    "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes",
    ICLR 2020 (the LAMB trust ratio).
  """
  leaves = _check_ratios(ratios)
  _check_bound("lower", lower)
  _check_bound("upper", upper)
  if not isinstance(prefix, str):
    raise TypeError(f"prefix must be a str, got {prefix!r}.")
  r = jnp.concatenate([jnp.ravel(jnp.asarray(x, _F32)) for x in leaves])

  def frac_at(bound, below):
    if bound is None:
      return jnp.zeros((), _F32)
    b = jnp.asarray(bound, _F32)
    tol = BOUND_RTOL * jnp.abs(b)
    hit = r <= b + tol if below else r >= b - tol
    return jnp.mean(hit.astype(_F32))

  out = {
      "min": jnp.min(r),
      "median": jnp.median(r),
      "max": jnp.max(r),
      "frac_at_lower": frac_at(lower, True),
      "frac_at_upper": frac_at(upper, False),
  }
  return {prefix + k: v.astype(_F32) for k, v in out.items()}


def _path_name(path: tuple[Any, ...]) -> str:
  return masks_lib.path_string(path) or "ratio"


def per_layer_ratios(ratios: PyTree) -> dict[str, jax.Array]:
  """Names every layer's trust ratio: `{"Dense_0/kernel": r, ...}`.

  A leaf of shape `()` gives one entry named by its path in the tree (keys
  joined by `/`); a stacked leaf of shape `(L,)` gives `L` entries suffixed
  `[0]` ... `[L-1]` (several layer axes give `[i,j]`). Useful to log every
  layer with `MetricWriter` or to build the history for
  `plot_trust_ratio_heatmap`. Jit-able.

  Args:
    ratios: the per-layer ratios, e.g. `date_optax.trust_ratios(opt_state)`
      or the train step's `metrics["trust_ratios"]` (a `date_optax.LayerRatios`
      record, unpacked here), or a dict that this function returned (names
      are kept).

  Returns:
    An insertion-ordered dict from layer name to a float32 scalar.

  Examples:
    >>> import jax.numpy as jnp
    >>> from date_optax.diagnostics import per_layer_ratios
    >>> r = per_layer_ratios({'dense': {'kernel': jnp.float32(0.5)},
    ...                       'blocks': jnp.array([1.0, 2.0])})
    >>> {k: float(v) for k, v in r.items()}
    {'blocks[0]': 1.0, 'blocks[1]': 2.0, 'dense/kernel': 0.5}

  References:
    You, Gitman, Ginsburg, "Large Batch Training of Convolutional Networks",
    2017 (LARS: one ratio per layer).
  """
  ratios = layer_ratios_lib.as_tree(ratios)
  _check_ratios(ratios)
  out: dict[str, jax.Array] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(ratios)[0]:
    name = _path_name(path)
    x = jnp.asarray(leaf, _F32)
    if x.ndim == 0:
      out[name] = x
    else:
      for idx in np.ndindex(*x.shape):
        out[f"{name}[{','.join(map(str, idx))}]"] = x[idx]
  return out
