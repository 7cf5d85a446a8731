"""The options of a gradient synchronisation, in one frozen config: `GradSync`.

Every data-parallel step reduces its gradients once (`grad_sync.sync_gradients`)
with the options held here: the algorithm, the torus layout, the cross-slice
algorithm of the hierarchical sync, the payload format, APS, the rounding, the
scales measured at every hop and error feedback. They are validated when the
config is built, so the reduction itself never checks an option.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Any

import jax
import numpy as np

from date_optax._src import validation
from date_optax._src.parallel.comm import error_feedback as ef
from date_optax._src.parallel.comm import hierarchical as hi
from date_optax._src.parallel.comm import low_precision as lp
from date_optax._src.parallel.comm.collectives import ALGORITHMS
from date_optax._src.parallel.comm.low_precision import CommFormat

#: The values of `GradSync.algorithm` (the steps' `grad_reduce`): the
#: all-reduces of `collectives`, and the two-level sync of Multislice.
SYNC_ALGORITHMS = ALGORITHMS + ("hierarchical",)


@dataclasses.dataclass(frozen=True)
class GradSync:
  """How a data-parallel step reduces its gradients over the replicas.

  A frozen, hashable config, validated once here: every option that
  excludes another is refused when the config is built, with a message that
  names both. The steps (`make_train_step`, `make_replicated_train_step`,
  `make_pmap_train_step`) and `sync_gradients` take it as `grad_sync=`.

  Args:
    algorithm: "psum" (`lax.psum`, XLA picks the schedule), "ring" (one ring
      over all replicas, `ring_all_reduce`), "torus" (two-phase 2-D torus,
      `torus_all_reduce`) or "two_shot" (1-bit Adam's compressed
      reduce-scatter: one `all_to_all`, a float32 sum at each chunk's owner,
      one `all_gather`; two roundings per element) or "hierarchical" (for
      Cloud TPU Multislice, over two data axes `(slices, in-slice)`: XLA's
      float32 reduce-scatter inside each slice, each device's 1/N_ici shard
      reduced across the slices in the payload format by `dcn_algorithm`,
      XLA's all-gather inside the slice; `hierarchical.hierarchical_reduce`).
      The steps' flat keyword is `grad_reduce`.
    grid: for "torus" over a single axis (a `pmap` axis, or one data axis of
      a mesh), its `(X, Y)` layout, row-major; None with two data axes (a
      `torus_mesh`). Only with `algorithm="torus"`.
    comm_dtype: the gradient payload format: None or "float32" (exact,
      float32 accumulation; stored as None), "bfloat16", "float8_e4m3fn",
      "float8_e5m2", "int8", "int4" or "float4_e2m1fn" (names or dtypes;
      stored as the name).
    aps: Auto-Precision Scaling of each layer by a power of two before the
      cast. None (with `block_size` and `measured_shift` unset) picks the
      default scaling of a format of at most 8 bits: block scales of 32
      over "ring", "torus", "two_shot" and "hierarchical", APS over "psum";
      bfloat16 none.
      `aps=True` or `aps=False` given turns the default blocks off. `aps=True`
      needs a low-precision `comm_dtype`.
    rounding: "nearest" or "stochastic" (unbiased; needs a low-precision
      `comm_dtype`). The steps draw the key of step s as
      `fold_in(fold_in(rng, 0x5352), s)` (`low_precision.rounding_key`).
    block_size: None (the default above), or the elements per scale of
      MX-style block scaling, an integer in [1, 65536] (MX uses 32): every
      message carries one power-of-two scale per block of one layer,
      measured on what is sent at every hop. Needs a low-precision
      `comm_dtype` and not "psum"; APS then defaults to off. Stored
      resolved: `GradSync("ring", comm_dtype="int8").block_size == 32`.
      A block is `block_size` consecutive elements of the flattened layer,
      except over "two_shot" rounded to nearest, where a layer of two or
      more dimensions whose rows split among the replicas in whole blocks
      takes `block_size` consecutive rows of one column (its last
      dimension's; the layout a TPU's tiles keep in place).
    measured_shift: one power-of-two scale per layer piece of every
      message, measured at every hop instead of APS's worst case `N · M`.
      Needs a low-precision `comm_dtype`, not "psum"; excludes `block_size`.
    error_feedback: keep the residual of every rounding and add it the next
      time the same place is sent: each replica's contribution (EF-SGD,
      Karimireddy et al. 2019) and, over "ring"/"torus", every hop's partial
      sum and the gather's payload, over "two_shot" the owner's sum (1-bit
      Adam's server error, 1/N of the gradient), over "hierarchical" those
      of the cross-slice sum of this device's shard, as
      `sync_gradients(..., residual=)` describes; the steps carry an
      `ErrorFeedbackState` in `TrainState.grad_residual`. Needs a
      low-precision `comm_dtype`.
    residual_dtype: how the residuals are stored, "float32" (default) or
      "bfloat16" (half the memory; the arithmetic stays float32, the
      residual's own rounding to bfloat16 is lost). Only with error feedback.
    dcn_algorithm: how "hierarchical" reduces each device's shard across
      the slices: "two_shot" (the default: two roundings per element, two
      cross-slice collectives) or "ring" (a ring over the S slices, a
      rounding at each of its hops). Stored resolved ("two_shot" when
      unset); only with `algorithm="hierarchical"` (None otherwise).

  An integer payload ("int8", "int4") with no scaling at all (`aps=False`,
  no `block_size`, no `measured_shift`), rounded to nearest and without
  error feedback, warns: it rounds every share of a gradient below 0.5 to 0.

  Returns:
    The config (a frozen dataclass; `dataclasses.replace` gives variants).

  Raises:
    ValueError: an unknown algorithm, format or rounding; `grid` without
      "torus" or not two positive integers; `aps=True` or
      `rounding="stochastic"` without a low-precision `comm_dtype`;
      `block_size` outside [1, 65536]; `block_size` or `measured_shift`
      without a low-precision `comm_dtype`, with "psum", or both at once;
      `error_feedback=True` without a low-precision `comm_dtype`; another
      `residual_dtype`, or one without error feedback; `dcn_algorithm` not
      one of `hierarchical.DCN_ALGORITHMS`, or given without
      "hierarchical".
    TypeError: `aps` not None or a bool, `block_size` not an integer,
      `measured_shift` or `error_feedback` not a bool.

  Examples:
    >>> import date_optax.parallel as dp
    >>> sync = dp.GradSync("ring", comm_dtype="int8", rounding="stochastic")
    >>> sync.comm_dtype, sync.block_size, sync.uses_aps
    ('int8', 32, False)
    >>> dp.GradSync("psum", comm_dtype="int8").uses_aps
    True
    >>> try:
    ...   dp.GradSync("psum", rounding="stochastic")
    ... except ValueError as e:
    ...   print(str(e)[:54])
    rounding="stochastic" needs a low-precision comm_dtype
    >>> dp.GradSync("ring", comm_dtype="int8", block_size=32).uses_aps
    False
    >>> dp.GradSync("ring", comm_dtype="int4", error_feedback=True).error_feedback
    True
    >>> dp.GradSync("two_shot", comm_dtype="int4", error_feedback=True).block_size
    32
    >>> multi = dp.GradSync("hierarchical", comm_dtype="int8", error_feedback=True)
    >>> multi.dcn_algorithm, multi.block_size
    ('two_shot', 32)

  References:
    Ying et al., "Image Classification at Supercomputer Scale", 2018; Han,
    Demmel and You, "Auto-Precision Scaling for Distributed Deep Learning",
    2020, https://arxiv.org/abs/2003.00119; Gupta et al., "Deep Learning
    with Limited Numerical Precision", ICML 2015,
    https://arxiv.org/abs/1502.02551; Open Compute Project, "OCP
    Microscaling Formats (MX) Specification v1.0", 2023 (block scales);
    Karimireddy et al., "Error Feedback Fixes SignSGD and other Gradient
    Compression Schemes", ICML 2019, https://arxiv.org/abs/1901.09847;
    Tang et al., "1-bit Adam", ICML 2021, https://arxiv.org/abs/2102.02888;
    Google Cloud, "Cloud TPU Multislice overview",
    https://cloud.google.com/tpu/docs/multislice-introduction.
  """

  algorithm: str = "psum"
  grid: tuple[int, int] | None = None
  comm_dtype: Any = None
  aps: bool | None = None
  rounding: str = "nearest"
  block_size: int | None = None
  measured_shift: bool = False
  error_feedback: bool = False
  residual_dtype: Any = "float32"
  dcn_algorithm: str | None = None

  def __post_init__(self) -> None:
    if not isinstance(self.algorithm, str) or self.algorithm not in SYNC_ALGORITHMS:
      raise ValueError(
          f"GradSync.algorithm (the step's grad_reduce) must be one of {SYNC_ALGORITHMS}, "
          f"got {self.algorithm!r}."
      )
    object.__setattr__(self, "dcn_algorithm",
                       hi.check_dcn_algorithm(self.algorithm, self.dcn_algorithm))
    if self.grid is not None:
      if self.algorithm != "torus":
        raise ValueError(
            f"grid={self.grid!r} is the layout of the torus: it needs "
            f'algorithm="torus" (grad_reduce="torus"), got algorithm='
            f"{self.algorithm!r}; pass grid=None."
        )
      grid = tuple(self.grid) if isinstance(self.grid, (tuple, list)) else None
      if grid is None or len(grid) != 2:
        raise ValueError(f"grid must be (X, Y), two positive integers, got {self.grid!r}.")
      grid = tuple(validation.check_int(f"grid[{i}]", d, low=1) for i, d in enumerate(grid))
      object.__setattr__(self, "grid", grid)
    fmt = lp.comm_format(self.comm_dtype)
    object.__setattr__(self, "comm_dtype", None if fmt is None else fmt.name)
    # aps=True without a format or not a bool; block_size/measured_shift out
    # of range, without a format, with "psum" or both at once.
    aps, block_size, measured_shift = lp.resolve_scaling(
        fmt, self.aps, self.block_size, self.measured_shift, self.algorithm
    )
    object.__setattr__(self, "block_size", block_size)
    object.__setattr__(self, "measured_shift", measured_shift)
    lp.resolve_rounding(fmt, self.rounding)  # unknown, or stochastic without a format
    error_feedback = validation.check_bool("error_feedback", self.error_feedback)
    if error_feedback and fmt is None:
      raise ValueError(
          "error_feedback=True needs a low-precision comm_dtype: with "
          f"comm_dtype={self.comm_dtype!r} (float32) the reduction is exact and there "
          "is no compression residual to feed back; pass comm_dtype (e.g. \"int8\") "
          "or error_feedback=False."
      )
    object.__setattr__(self, "error_feedback", error_feedback)
    object.__setattr__(self, "residual_dtype", ef.check_residual_dtype(self))
    if (fmt is not None and fmt.integer and not aps and block_size is None
        and not measured_shift and self.rounding == "nearest" and not error_feedback):
      # Legitimate in studies of the unscaled grid (so not refused), but in
      # training every gradient entry below half a unit (g/N < 0.5: nearly
      # all of them) is sent as 0 and the step sees grad_norm 0.
      validation.warn_at_caller(
          f"GradSync(comm_dtype={fmt.name!r}, aps=False): an integer payload "
          "without scaling rounds every share of a gradient below 0.5 in "
          "magnitude (g / replicas) to 0, so training sees (nearly) zero "
          "gradients. Leave aps unset for the default scaling (block scales "
          'of 32 over "ring"/"torus", APS over "psum"), or pass aps=True, '
          'block_size, measured_shift=True, rounding="stochastic" or '
          "error_feedback=True."
      )

  @property
  def format(self) -> CommFormat | None:
    """The payload's `CommFormat`, or None for the exact float32 path."""
    return lp.comm_format(self.comm_dtype)

  @property
  def uses_aps(self) -> bool:
    """Whether Auto-Precision Scaling is applied (the `aps=None` default resolved)."""
    return lp.resolve_scaling(
        self.format, self.aps, self.block_size, self.measured_shift, self.algorithm
    )[0]

  @property
  def measures_scales(self) -> bool:
    """Whether every message carries scales measured on it (blocks or layers)."""
    return self.block_size is not None or self.measured_shift

  def rounding_key(self, rng: Any, step: jax.Array) -> Any:
    """The step's stochastic-rounding key, or None for round-to-nearest."""
    return lp.rounding_key(rng, step) if self.rounding == "stochastic" else None

  def check_replicas(
      self, axes: Sequence[Hashable], num_replicas: int, *, grid_name: str = "grid"
  ) -> None:
    """Refuses a torus or a hierarchical sync that does not fit the replicas' axes.

    Without `grid` the torus needs two axes; with one, `X·Y` must equal the
    number of replicas. `grid_name` is the keyword the caller used.
    "hierarchical" needs two axes, the slices and the devices of one slice.
    """
    if self.algorithm == "hierarchical":
      hi.check_axes(axes)
    if self.algorithm != "torus":
      return
    if self.grid is None:
      if len(tuple(axes)) != 2:
        raise ValueError(
            f'grad_reduce="torus" needs two data axes (a torus_mesh), or '
            f"{grid_name}=(X, Y) for one axis; got data axes {tuple(axes)}."
        )
      return
    if int(np.prod(self.grid)) != num_replicas:
      raise ValueError(
          f"{grid_name} {self.grid} must multiply to the number of devices, "
          f"{num_replicas}."
      )


def grad_sync_from(
    grad_sync: GradSync | None,
    *,
    grad_reduce: Any = "psum",
    grid: Any = None,
    comm_dtype: Any = None,
    aps: Any = None,
    rounding: Any = "nearest",
    block_size: Any = None,
    measured_shift: Any = False,
    error_feedback: Any = False,
) -> GradSync:
  """The builders' `grad_sync=`, or the config their flat keywords spell."""
  return validation.config_from(grad_sync, GradSync, {
      "grad_reduce": ("algorithm", grad_reduce, "psum"),
      "grid": ("grid", grid, None),
      "comm_dtype": ("comm_dtype", comm_dtype, None),
      "aps": ("aps", aps, None),
      "rounding": ("rounding", rounding, "nearest"),
      "block_size": ("block_size", block_size, None),
      "measured_shift": ("measured_shift", measured_shift, False),
      "error_feedback": ("error_feedback", error_feedback, False),
  })
