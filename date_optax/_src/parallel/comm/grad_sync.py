"""Gradient synchronisation: the one reduction of every data-parallel step.

Every data-parallel step combines the replicas' gradients here, exactly once
(`replica_step.replica_step` calls `sync_gradients`), for an all-reduce mean
or, with weight-update sharding, a reduce-scatter mean. The options travel as
one frozen `GradSync` (`sync_config`), validated when it is built: the
algorithm, the torus layout, the payload format, APS, the rounding, the
scales measured at every hop and error feedback (every rounding's residual,
carried in the state).

The algorithms live in `collectives`, `two_shot` and `hierarchical`, the
formats and APS in `low_precision`; this module wires them together once.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from date_optax._src.parallel import compat
from date_optax._src.parallel.comm import collectives, hierarchical, low_bit_sum
from date_optax._src.parallel.comm import error_feedback as ef
from date_optax._src.parallel.comm import low_precision as lp
from date_optax._src.parallel.comm import two_shot as ts
from date_optax._src.parallel.comm import update_sharding as us
from date_optax._src.parallel.comm.collectives import acc_dtype
from date_optax._src.parallel.comm.sync_config import GradSync
from date_optax._src.types import PyTree


def _check_key(sync: GradSync, key: Any) -> None:
  if sync.rounding == "stochastic" and key is None:
    raise ValueError('rounding="stochastic" needs a PRNG key: pass key=.')
  if sync.rounding == "nearest" and key is not None:
    raise ValueError('key is only used with rounding="stochastic"; pass key=None.')


# ---------------------------------------------------------------------------
# The one reduction. Leaves split by weight-update sharding are reduce-scattered
# (row k of a leaf's (n, rest) blocks lands on replica k, the row-major order in
# which PartitionSpec(axes) places shards); the others are all-reduced.
# ---------------------------------------------------------------------------


def _exact_sum(xs: list[jax.Array], axes: Any, sync: GradSync) -> list[jax.Array]:
  """Exact all-reduce of whole leaves: one psum each, or packed for a ring/torus."""
  if sync.algorithm == "psum":
    return collectives.psum_all_reduce(xs, axes)
  if sync.algorithm in ("ring", "two_shot"):  # two_shot: an all-to-all, an all-gather
    return collectives._reduce_tree(xs, collectives.blockwise_all_reduce(sync.algorithm, axes))
  return collectives.torus_all_reduce(xs, axes, grid=sync.grid)


def _sum(
    xs: list[jax.Array], dims: list[int | None], axes: Any, sync: GradSync, n: int,
    fmt: Any, hop: list[jax.Array] | None = None,
) -> tuple[list[jax.Array], list[jax.Array] | None]:
  """Sums over the replicas: whole leaves all-reduced, split ones scattered.

  With a format `fmt` (already carrying the device's rounding key) the
  payload travels in it; `xs` are then float32 and already APS-shifted, and
  `hop` (arrays like `xs`, or None) this device's hop residuals in the same
  units. Returns the sums and the new hop residuals (None without).
  """
  out: list[Any] = [None] * len(xs)
  new_hop: list[Any] | None = None if hop is None else [None] * len(xs)
  whole = [i for i, d in enumerate(dims) if d is None]
  if whole:
    parts = [xs[i] for i in whole]
    fb = None
    if fmt is None:
      reduced = _exact_sum(parts, axes, sync)
    else:
      reduced = low_bit_sum.low_precision_sum(
          parts, axes, sync.algorithm, sync.grid, fmt,
          block_size=sync.block_size, measured_shift=sync.measured_shift,
          feedback=None if hop is None else [hop[i] for i in whole],
      )
      if hop is not None:
        reduced, fb = reduced
    for j, i in enumerate(whole):
      out[i] = reduced[j]
      if fb is not None:
        new_hop[i] = fb[j]
  groups: dict[Any, list[int]] = {}
  for i, d in enumerate(dims):
    if d is not None:
      groups.setdefault(xs[i].dtype, []).append(i)
  for idxs in groups.values():
    blocks = [us.to_blocks(xs[i], dims[i], n) for i in idxs]
    fb = None
    if fmt is None:
      chunk = collectives.reduce_scatter_blocks(
          jnp.concatenate(blocks, axis=1), axes, sync.algorithm, grid=sync.grid
      )
      widths = np.cumsum([0] + [b.shape[1] for b in blocks])
      chunks = [chunk[a:b] for a, b in zip(widths[:-1], widths[1:], strict=True)]
    else:  # the shards are final sums: rounded as they would travel
      chunks = low_bit_sum.low_precision_reduce_scatter(
          blocks, axes, sync.algorithm, sync.grid, fmt,
          block_size=sync.block_size, measured_shift=sync.measured_shift,
          feedback=None if hop is None else [us.to_blocks(hop[i], dims[i], n) for i in idxs],
      )
      if hop is not None:
        chunks, fb = chunks
    for j, i in enumerate(idxs):
      out[i] = us.shard_from_chunk(chunks[j], xs[i].shape, dims[i], n)
      if fb is not None:
        new_hop[i] = us.from_blocks(fb[j], xs[i].shape, dims[i])
  return out, new_hop


def _reduce(
    tree: PyTree, axes: Any, sync: GradSync, key: Any, scatter: bool, residual: Any = None,
    hop: Any = None,
) -> tuple[PyTree, Any, Any]:
  """Sum of `tree` over `axes` with `sync`'s algorithm and payload.

  With `residual` (the worker residual, a pytree like `tree`, float32) each
  low-precision leaf sends `C(x + e)` instead of `x`; with `hop` (like
  `tree`, float32) every message rounded on a ring/torus hop or in the
  gather carries its residual too (`ErrorFeedbackState`). Returns the sum
  and the new residuals (the others' unchanged; None where not given).
  "hierarchical" keeps its residuals on this device's shard instead.
  """
  if sync.algorithm == "hierarchical":
    return hierarchical.hierarchical_reduce(tree, axes, sync, key, scatter, residual, hop)
  res_leaves = None if residual is None else jax.tree.leaves(residual)
  hop_leaves = None if hop is None else jax.tree.leaves(hop)
  leaves, treedef = jax.tree.flatten(tree)
  leaves = [jnp.asarray(x) for x in leaves]
  n = compat.axis_size(axes)
  dims = [us.update_shard_axis(x.shape, n) if scatter else None for x in leaves]
  fmt = sync.format
  low, exact = lp.split_floats(leaves) if fmt is not None else ([], list(range(len(leaves))))
  out: list[Any] = list(leaves)
  if exact:
    reduced, _ = _sum([leaves[i] for i in exact], [dims[i] for i in exact], axes, sync, n,
                      None)
    for i, r in zip(exact, reduced, strict=True):
      out[i] = r
  new_res = None if res_leaves is None else list(res_leaves)
  new_hop = None if hop_leaves is None else list(hop_leaves)
  if low:
    xs = [leaves[i].astype(jnp.float32) for i in low]
    if res_leaves is not None:  # p = x + e: the residual rides with the contribution
      xs = [x + res_leaves[i].astype(jnp.float32) for x, i in zip(xs, low, strict=True)]
    scaling = None
    # Scales measured at every hop need no pmax (a non-finite group travels
    # as its NaN code); APS beside them shifts first.
    if sync.uses_aps or not sync.measures_scales:
      xs, scaling = lp.prepare(xs, compat.as_tuple(axes), n, fmt, sync.uses_aps)
    # The residuals are kept in the gradient's units: shifted with it here,
    # back after.
    shift = lambda d, j, sign: d if scaling is None else jnp.ldexp(
        d, sign * scaling.exponents[j])
    dev_fmt, two = lp.device_format(fmt, axes, key), sync.algorithm == "two_shot"
    sent = None  # C(p) sent, p - C(p) kept (two_shot compresses as it sends)
    if new_res is not None and not two:
      sent = [ef.compress(x, dev_fmt, sync) for x in xs]
    hops = None if new_hop is None else [
        shift(hop_leaves[i].astype(jnp.float32), j, 1) for j, i in enumerate(low)]
    if two:
      reduced, hops, sent = ts.two_shot_sum(xs, [dims[i] for i in low], axes, sync, n,
                                            dev_fmt, hops)
    else:
      reduced, hops = _sum(sent or xs, [dims[i] for i in low], axes, sync, n, dev_fmt, hops)
    for j, i in enumerate(low if new_res is not None else ()):
      new_res[i] = shift(xs[j] - sent[j], j, -1).astype(res_leaves[i].dtype)
    for j, i in enumerate(low):
      r = reduced[j] if scaling is None else scaling.undo(j, reduced[j])
      out[i] = r.astype(leaves[i].dtype)
      if hops is not None:
        new_hop[i] = shift(hops[j], j, -1).astype(hop_leaves[i].dtype)
  unflatten = lambda like, new: None if new is None else jax.tree.unflatten(
      jax.tree.structure(like), new)
  return (jax.tree.unflatten(treedef, out), unflatten(residual, new_res),
          unflatten(hop, new_hop))


def sync_gradients(
    grads: PyTree,
    axis_name: Any,
    grad_sync: GradSync | None = None,
    *,
    key: Any = None,
    scatter: bool = False,
    residual: PyTree | None = None,
) -> PyTree | tuple[PyTree, PyTree]:
  """The mean of a gradient pytree over the replicas: the steps' one reduction.

  Call it inside `shard_map` or `pmap`, where `axis_name` is bound, as
  flax's `train_step` calls `lax.pmean(grads, "batch")`. Each gradient is
  divided by the number of replicas N in its accumulation dtype (float32 or
  wider, so the mean never overflows a low-precision gradient), summed with
  `grad_sync`'s algorithm and payload format, and cast back to its dtype.

  With `scatter=True` (weight-update sharding) every leaf that N divides
  along some axis (`update_shard_axis`; "hierarchical": M, below) comes back
  as this replica's shard of
  the mean, split along that axis (a reduce-scatter); the other leaves come
  back whole. With a low-precision `comm_dtype` the float leaves travel in
  the format, APS shifts from one `pmax` over all of them, whole and split.

  *Error feedback* (`grad_sync.error_feedback`), in two stages
  (`ErrorFeedbackState` has the rule and the memory it takes). The worker
  stage (EF-SGD, Karimireddy et al. 2019): this replica's share `x = g / N`
  (float32) is sent as `C(x + e)` and `e' = x + e - C(x + e)` is kept, `C`
  its quantisation (after the APS shift from `max|x + e|`, undone on `e'`;
  or with scales measured on its blocks / leaf, in "two_shot"'s chunk
  layout for "two_shot"). The hop stage (1-bit Adam's server error, Tang
  et al. 2021): every partial sum `p` a "ring"/"torus" device forwards and
  the chunk it gathers (or rounds as its shard with `scatter`), or the sum
  a "two_shot" owner sends, goes as `C(p + f)`, `f' = p + f - C(p + f)`
  kept. With both (float32), the sum over steps of the means plus the
  residuals left is the exact sum: nothing is lost, only delayed.

  *Hierarchical* (`GradSync("hierarchical")`, Cloud TPU Multislice):
  `axis_name` is two axes, the slices' (crossing the data-center network)
  then the in-slice one. Each slice reduce-scatters its shares exactly in
  float32, each device's 1/M shard (M devices per slice) is reduced across
  the slices in the payload format by `grad_sync.dcn_algorithm`, and the
  slice all-gathers the shards (`hierarchical.hierarchical_reduce`); with
  `scatter` a leaf that M divides along an axis comes back as this device's
  in-slice shard (block i of M, the same on every slice: weight-update
  sharding inside the slice, so no parameter crosses the slices). Its
  residuals live on the shard: `ErrorFeedbackState.zeros(grads, grad_sync,
  chunks=N, slices=S)`, one flat `(ceil(size / M),)` worker residual per
  leaf and the cross-slice algorithm's hop residual.
  `residual` is an `ErrorFeedbackState` (zeros at the start:
  `ErrorFeedbackState.zeros(grads, grad_sync)`); a bare pytree is the worker
  residual alone (the one-stage rule: the hops' roundings are not fed back)
  and comes back bare. Leaves that do not travel in the format keep their
  residuals; a contribution already on the grid leaves `e' = 0`.

  Args:
    grads: a pytree of gradients (the local gradient of this replica).
    axis_name: the data axis name, or a tuple of names (two for a torus
      without `grid`; `(slices, in-slice)` for "hierarchical").
    grad_sync: a `GradSync` (None: `GradSync()`, an exact `lax.psum`).
    key: the PRNG key for `rounding="stochastic"` (the same on every
      replica: the device index is folded in); None otherwise.
    scatter: reduce-scatter the leaves that split over the replicas.
    residual: with `grad_sync.error_feedback`, this device's residuals, an
      `ErrorFeedbackState` (or a bare float32 pytree shaped like `grads`:
      the worker residual alone); None otherwise.

  Returns:
    The mean gradient (or, with `scatter`, its shards), each leaf in its
    own dtype; with error feedback, `(mean, new_residual)`, the residual
    of the kind given.

  Raises:
    ValueError: a stochastic rounding without a key, or a key without it;
      error feedback without a `residual`, or a `residual` without it;
      "hierarchical" over other than two axes, or with residuals of
      another shape.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> import date_optax.parallel as dp
    >>> mesh = dp.data_mesh()
    >>> sync = dp.GradSync("ring", comm_dtype="bfloat16")
    >>> f = jax.jit(jax.shard_map(lambda g: dp.sync_gradients(g, "data", sync), mesh=mesh,
    ...                   in_specs=P("data"), out_specs=P("data"), check_vma=False))
    >>> g = jnp.arange(mesh.size, dtype=jnp.float32)
    >>> bool(jnp.allclose(f(g), g.mean()))
    True

    Error feedback: a share of 0.25 per replica rounds to 0 in int8 without
    APS, so without feedback the mean is 0 at every step; with it the
    residuals grow until the contributions round up, and over 8 steps the
    means average to the true mean, 2.

    >>> ef = dp.GradSync("ring", comm_dtype="int8", aps=False, error_feedback=True)
    >>> h = jax.jit(jax.shard_map(
    ...     lambda g, e: dp.sync_gradients(g, "data", ef, residual=e),
    ...     mesh=mesh, in_specs=P("data"), out_specs=(P(), P("data")),
    ...     check_vma=False))
    >>> g = jnp.full(mesh.size, 2.0)  # each replica's share: 2 / 8 = 0.25
    >>> e, means = dp.ErrorFeedbackState.zeros(g, ef), []  # split like g
    >>> for _ in range(8):
    ...   m, e = h(g, e)
    ...   means.append(float(m[0]))
    >>> means, float(e.worker[0]), float(e.hop[0])
    ([0.0, 0.0, 8.0, 0.0, 0.0, 0.0, 8.0, 0.0], 0.0, 0.0)

    Hierarchical over 2 slices of 4 devices (Multislice), int4 across the
    slices with error feedback: one step's mean is off by up to a grid step,
    the mean of 8 steps' means by 1/8 of that. The residuals are flat
    shards, 1/4 of the gradient per device (one copy per device here).

    >>> import numpy as np
    >>> from jax.sharding import Mesh
    >>> devices = np.array(jax.devices())
    >>> two = Mesh(devices.reshape(2 if devices.size % 2 == 0 else 1, -1), ("dcn", "ici"))
    >>> multi = dp.GradSync("hierarchical", comm_dtype="int4", error_feedback=True)
    >>> s = jax.jit(jax.shard_map(
    ...     lambda g, e: dp.sync_gradients(g, ("dcn", "ici"), multi, residual=e),
    ...     mesh=two, in_specs=P(("dcn", "ici")), out_specs=(P(), P(("dcn", "ici"))),
    ...     check_vma=False))
    >>> g = jnp.linspace(-1.0, 1.0, 64)  # every replica's gradient
    >>> e = dp.ErrorFeedbackState.zeros(g, multi, chunks=two.size, slices=two.shape["dcn"])
    >>> e.worker.shape == (64 // two.shape["ici"],)
    True
    >>> e = jax.tree.map(lambda r: jnp.tile(r, two.size), e)  # one per device
    >>> total = 0.0
    >>> for _ in range(8):
    ...   m, e = s(jnp.tile(g, two.size), e)
    ...   total = total + m
    >>> bool(jnp.abs(total / 8 - g).max() < 0.02)
    True

  References:
    Goyal et al., "Accurate, Large Minibatch SGD", 2017; Xu et al.,
    "Automatic Cross-Replica Sharding of Weight Update in Data-Parallel
    Training", 2020, https://arxiv.org/abs/2004.13336; Google Cloud, "Cloud
    TPU Multislice overview",
    https://cloud.google.com/tpu/docs/multislice-introduction; Han, Demmel and You,
    "Auto-Precision Scaling for Distributed Deep Learning", 2020; Karimireddy
    et al., "Error Feedback Fixes SignSGD and other Gradient Compression
    Schemes", ICML 2019, https://arxiv.org/abs/1901.09847; Tang et al.,
    "1-bit Adam: Communication Efficient Large-Scale Training with Adam's
    Convergence Speed", ICML 2021, https://arxiv.org/abs/2102.02888; Li et
    al., "1-bit LAMB", 2021, https://arxiv.org/abs/2104.06069.
  """
  sync = GradSync() if grad_sync is None else grad_sync
  _check_key(sync, key)
  if sync.error_feedback and residual is None:
    raise ValueError(
        "grad_sync.error_feedback=True needs this replica's residual: pass "
        "residual= (ErrorFeedbackState.zeros(grads, grad_sync) at the start)."
    )
  if residual is not None and not sync.error_feedback:
    raise ValueError("residual is only used with error_feedback=True; pass residual=None.")
  worker, hop, two_stage = ef.split_residual(residual)
  if two_stage and (hop is None) != (sync.algorithm not in ef.HOP_ALGORITHMS):
    raise ValueError(
        f"residual.hop must be None exactly for algorithm 'psum' (no hops), got "
        f"{'None' if hop is None else 'residuals'} with {sync.algorithm!r}; build it "
        "with ErrorFeedbackState.zeros(grads, grad_sync)."
    )
  n = compat.axis_size(axis_name)
  scaled = jax.tree.map(lambda g: g.astype(acc_dtype(g.dtype)) / n, grads)
  total, worker, hop = _reduce(scaled, axis_name, sync, key, scatter, worker, hop)
  mean = jax.tree.map(lambda t, g: t.astype(g.dtype), total, grads)
  if residual is None:
    return mean
  return mean, (ef.ErrorFeedbackState(worker, hop) if two_stage else worker)


def all_reduce(
    tree: PyTree,
    axis_name: Any,
    *,
    algorithm: str = "psum",
    grid: tuple[int, int] | None = None,
    comm_dtype: Any = None,
    aps: bool | None = None,
    rounding: str = "nearest",
    key: Any = None,
    block_size: int | None = None,
    measured_shift: bool = False,
) -> PyTree:
  """Sums a pytree over named axes with the chosen algorithm and payload format.

  With `comm_dtype` the float leaves travel in a low-precision format
  (bfloat16, float8_e4m3fn, float8_e5m2, int8, int4 or float4_e2m1fn):
  they are summed in float32, rounded to the format, and for "ring" and
  "torus" every partial sum is rounded to the format again before it is sent
  to the next device, as hardware adding in the format would; the final sum
  is rounded once more and gathered in the format, so all devices agree;
  "two_shot" rounds twice (each chunk as sent, each owner's sum). "psum"
  calls `lax.psum` on the format (XLA on CPU accumulates it wider and
  rounds once). Integers round to nearest and saturate at ±qmax.

  With `aps` (Auto-Precision Scaling, default on for formats of 8 bits or
  fewer) each leaf is multiplied before the cast by `2^k`,
  `k = floor(log2(fmt_max / (N · M)))` with `M` the leaf's max-abs over all
  N replicas, so the sum cannot overflow and small layers use the whole
  range; `M` comes from one extra `pmax` of a vector of two floats per leaf,
  issued before the payload. A leaf that is NaN/Inf on any replica comes out
  NaN everywhere (integer and 4-bit float formats cannot carry a NaN).

  With `rounding="stochastic"` every rounding (each device's first cast,
  each partial sum it sends, the final sum) goes to one of the two
  neighbouring values of the format, the upper with probability equal to
  the distance from the lower in grid steps: unbiased, `E[round(x)] = x`
  inside the range (Gupta et al. 2015). Each rounding draws from
  `fold_in(fold_in(key, d), i)`, `d` the device's row-major index over
  `axis_name` and `i` the rounding's rank in the program, so `key` may be
  the same on every device; pass a new key per step. One rounding errs by
  less than one grid step (nearest: half), so the per-layer bound doubles.
  The rules and the error bounds are in `docs/algorithms.md`.

  With `block_size` (MX-style block scaling) or `measured_shift` ("ring"
  and "torus" only) the scales are measured on what is sent instead of
  fixed by APS: every message (each partial sum a device sends on, and the
  final sum it gathers) carries, per group, the power of two
  `2^e = min{2^e : m · 2^-e <= fmt_max}` of the group's current max-abs
  `m` beside the payload `round(x · 2^-e)`, one 8-bit exponent per group
  packed into the same message. Groups are blocks of `block_size`
  consecutive elements of one layer (layers are zero-padded to whole
  blocks), or with `measured_shift=True` each layer's piece of the message.
  The receiver decodes to float32, adds its own float32 row and measures
  again, so early hops and sums that cancel use the whole range, where APS
  pays for the worst case `N · M` at every hop; one rounding errs by at
  most `eps_fmt · m`. No `pmax` is issued (APS defaults to off; `aps=True`
  beside them changes no value): a group holding a NaN or Inf arrives as
  NaN on every device, other groups are unaffected.

  The options are those of `GradSync` (validated there); `sync_gradients`
  is the same reduction as a mean, for gradients.

  Args:
    tree: a pytree of arrays.
    axis_name: an axis name or a tuple of names (two for "torus" and
      "hierarchical").
    algorithm: "psum", "ring", "torus", "two_shot" or "hierarchical", as
      for `GradSync` ("hierarchical" crosses the slices by "two_shot").
    grid: for "torus" over a single axis, its `(X, Y)` layout.
    comm_dtype: None or "float32" (exact, float32 accumulation), or one of
      "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "int4",
      "float4_e2m1fn" (names or dtypes).
    aps: scale each leaf by a power of two before the cast. None: the
      default scaling of `GradSync` (block scales of 32 but over "psum",
      which gets APS, for formats of at most 8 bits; neither for bfloat16).
    rounding: "nearest" (default) or "stochastic" (needs a low-precision
      `comm_dtype` and a `key`).
    key: a PRNG key (`jax.random.key` or a raw `PRNGKey`) for
      `rounding="stochastic"`; not used otherwise.
    block_size: None (the default scaling, as for `aps`) or the elements per
      block scale, an integer in [1, 65536] (MX uses 32); needs a
      low-precision `comm_dtype` and not "psum".
    measured_shift: one scale per layer piece of every message, measured at
      every hop (needs a low-precision `comm_dtype` and not "psum";
      excludes `block_size`, whose blocks are measured already).

  Returns:
    The sum over all devices of the named axes, each leaf in its own dtype.

  Raises:
    ValueError: for an unknown algorithm, `comm_dtype` or `rounding`,
      `aps=True` or `rounding="stochastic"` without a low-precision
      `comm_dtype`, `grid` without "torus", a stochastic rounding without
      `key`, or a `key` with `rounding="nearest"`; `block_size` outside
      [1, 65536], `block_size` or `measured_shift=True` without a
      low-precision `comm_dtype` or with "psum", or both at once.
    TypeError: `block_size` not an integer, `measured_shift` not a bool.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> import date_optax.parallel as dp
    >>> mesh = dp.data_mesh()
    >>> f = jax.jit(jax.shard_map(
    ...     lambda t: dp.all_reduce(t, "data", algorithm="ring"), mesh=mesh,
    ...     in_specs=P("data"), out_specs=P("data"), check_vma=False))
    >>> bool((f(jnp.ones(mesh.size)) == mesh.size).all())
    True
    >>> g = jax.jit(jax.shard_map(
    ...     lambda t: dp.all_reduce(t, "data", algorithm="ring",
    ...                             comm_dtype="int8"),
    ...     mesh=mesh, in_specs=P("data"), out_specs=P("data"), check_vma=False))
    >>> out = g(jnp.full(mesh.size, 1e-6))  # plain int8 rounding would give 0
    >>> bool(jnp.allclose(out, mesh.size * 1e-6, rtol=0.1))
    True

    Stochastic rounding: 0.3 on every device rounds to 0 in int4 without
    APS, but stochastically to 1 with probability 0.3, so the mean over keys
    of the sum approaches 0.3 per device.

    >>> h = jax.jit(jax.shard_map(
    ...     lambda t, k: dp.all_reduce(t, "data", algorithm="ring",
    ...                                comm_dtype="int4", aps=False,
    ...                                rounding="stochastic", key=k),
    ...     mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"),
    ...     check_vma=False))
    >>> x = jnp.full(mesh.size, 0.3)
    >>> sums = jnp.stack([h(x, jax.random.key(i))[0] for i in range(200)])
    >>> bool(abs(float(sums.mean()) / mesh.size - 0.3) < 0.05)
    True

    Block scales: a block of small values beside a block of large ones in
    the same layer keeps its precision (APS would scale both by the large
    one's worst case).

    >>> b = jax.jit(jax.shard_map(
    ...     lambda t: dp.all_reduce(t, "data", algorithm="ring",
    ...                             comm_dtype="int8", block_size=32),
    ...     mesh=mesh, in_specs=P("data"), out_specs=P("data"), check_vma=False))
    >>> v = jnp.tile(jnp.concatenate([jnp.full(32, 1e-3), jnp.full(32, 1e3)]),
    ...              mesh.size)
    >>> out = b(v).reshape(mesh.size, 64)[0]
    >>> bool(jnp.allclose(out[:32], mesh.size * 1e-3, rtol=0.02))
    True

  References:
    Ying et al., "Image Classification at Supercomputer Scale", 2018;
    Han, Demmel and You, "Auto-Precision Scaling for Distributed Deep
    Learning", 2020, https://arxiv.org/abs/2003.00119; Gupta et al., "Deep
    Learning with Limited Numerical Precision", ICML 2015,
    https://arxiv.org/abs/1502.02551; Open Compute Project, "OCP
    Microscaling Formats (MX) Specification v1.0", 2023 (block scales).
  """
  sync = GradSync(algorithm, grid, comm_dtype, aps, rounding, block_size, measured_shift)
  _check_key(sync, key)
  return _reduce(tree, axis_name, sync, key, scatter=False)[0]
