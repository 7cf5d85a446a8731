"""What one data-parallel replica computes: its loss, gradient and model state.

Every train step (jit with `shard_map`, jit with GSPMD, `pmap`) calls
`replica_grads` once per replica on that replica's slice of the global batch
and then combines the results over the replicas exactly once. Keeping this in
one place is what makes the steps compute the same thing.

Conventions (documented on `make_train_step`):

* `loss_fn(params, batch, **extra)` is called with `model_state=` when the
  train state has one and with `rng=` when it has a key; it then returns
  `(loss, new_model_state)`, or `(loss, (new_model_state, aux))` with
  `has_aux=True`; without a model state it returns `loss` or `(loss, aux)`.
* Gradient accumulation: the replica's slice is split into `microbatches`
  contiguous pieces that run one after the other under `lax.scan`; gradients
  accumulate in float32, the model state is threaded through the pieces.
* The key of microbatch `j` on replica `r` at step `s` is
  `fold_in(fold_in(fold_in(rng, s), r), j)`: no two replicas or microbatches
  share dropout masks, and a resumed run (same `rng`, same step) draws the
  same keys.
"""

from __future__ import annotations

import inspect
from collections.abc import Hashable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from date_optax._src.parallel.comm.collectives import acc_dtype
from date_optax._src.types import LossFn, PyTree


class GradsConfig(Protocol):
  """What the gradient functions here read of the step's `StepConfig`."""

  has_aux: bool
  compute_dtype: Any
  microbatches: int


def is_float(x: Any) -> bool:
  return jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)


def cast_floats(tree: PyTree, dtype: Any) -> PyTree:
  """Casts the float leaves of `tree` to `dtype` (None: unchanged)."""
  if dtype is None:
    return tree

  def cast(x):
    x = jnp.asarray(x)
    return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

  return jax.tree.map(cast, tree)


def step_key(rng: Any, step: jax.Array, replica: jax.Array, microbatch: Any) -> Any:
  """The key of one microbatch on one replica at one step."""
  key = jax.random.fold_in(rng, step)
  key = jax.random.fold_in(key, replica)
  return jax.random.fold_in(key, microbatch)


#: What the step passes each keyword for, and how the state gets it.
_KEYWORDS = {
    "rng": "the state has a key (step.init(..., rng=...))",
    "model_state": "the state has a model state (step.init(params, model_state=...))",
}


def check_loss_signature(loss_fn: Any, keywords: tuple[str, ...]) -> None:
  """`loss_fn(params, batch, **keywords)` binds; else a TypeError that says
  which keyword the state makes the step pass (or not pass), at trace time,
  before the step runs."""
  try:
    sig = inspect.signature(loss_fn)
  except (TypeError, ValueError):  # a builtin or C callable: nothing to read
    return
  try:
    sig.bind(None, None, **dict.fromkeys(keywords))
  except TypeError as e:
    accepts = lambda k: any(
        p.kind == p.VAR_KEYWORD
        or (p.name == k and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        for p in sig.parameters.values())
    needs = lambda k: k in sig.parameters and sig.parameters[k].default is sig.empty
    hints = [f"the step passes {k}= because {why}: add {k}=None to loss_fn's "
             f"parameters, or build the state without it"
             for k, why in _KEYWORDS.items() if k in keywords and not accepts(k)]
    hints += [f"loss_fn requires {k}, which the step passes only when {why}"
              for k, why in _KEYWORDS.items() if k not in keywords and needs(k)]
    call = ", ".join(["params", "batch", *(f"{k}=..." for k in keywords)])
    raise TypeError(
        f"loss_fn{sig} cannot be called as loss_fn({call}) ({e})"
        + ("; " + "; ".join(hints) if hints else "") + "."
    ) from None


def _split_output(out: Any, has_aux: bool, with_state: bool) -> tuple[Any, Any, Any]:
  """(loss, aux, new_model_state) from what loss_fn returned."""
  pair = isinstance(out, (tuple, list)) and len(out) == 2
  if with_state:
    want = "(loss, (new_model_state, aux))" if has_aux else "(loss, new_model_state)"
    if not pair or (
        has_aux and not (isinstance(out[1], (tuple, list)) and len(out[1]) == 2)
    ):
      raise TypeError(
          f"loss_fn was given model_state=, so it must return {want}, got "
          f"{type(out).__name__}."
      )
    loss, rest = out
    new_state, aux = rest if has_aux else (rest, None)
    return loss, aux, new_state
  if has_aux:
    if not pair:
      raise TypeError(
          "with has_aux=True, loss_fn must return (loss, aux), got "
          f"{type(out).__name__}."
      )
    return out[0], out[1], None
  return out, None, None


def _match_state(new: Any, old: Any) -> Any:
  """Checks that loss_fn returned a model state shaped like the one it got."""
  old_def, new_def = jax.tree.structure(old), jax.tree.structure(new)
  if old_def != new_def:
    raise ValueError(
        "loss_fn must return a new model_state with the structure of the one "
        f"it was given; got {new_def}, expected {old_def}."
    )
  paths = jax.tree_util.tree_flatten_with_path(old)[0]
  out = []
  for (path, o), n in zip(paths, jax.tree.leaves(new), strict=True):
    n = jnp.asarray(n)
    if n.shape != np.shape(o):
      raise ValueError(
          f"loss_fn returned model_state{jax.tree_util.keystr(path)} of shape "
          f"{n.shape}, expected {np.shape(o)} (the shape it was given)."
      )
    out.append(n.astype(jnp.asarray(o).dtype))
  return jax.tree.unflatten(old_def, out)


def _forward(
    loss_fn: LossFn,
    has_aux: bool,
    compute_dtype: Any,
    params: PyTree,
    batch: PyTree,
    model_state: Any = None,
    rng: Any = None,
) -> tuple[jax.Array, tuple[Any, Any]]:
  """`loss_fn` on one (micro)batch: `(loss in float32, (aux, new model state))`.

  Under mixed precision the float32 parameters are cast here, inside the
  function that is differentiated, so gradients come back in the parameters'
  dtype. The model state is passed as it is (batch-norm statistics stay
  float32).
  """
  with_state = model_state is not None
  extra = {}
  if with_state:
    extra["model_state"] = model_state
  if rng is not None:
    extra["rng"] = rng
  check_loss_signature(loss_fn, tuple(extra))
  out = loss_fn(cast_floats(params, compute_dtype), cast_floats(batch, compute_dtype), **extra)
  loss, aux, new_state = _split_output(out, has_aux, with_state)
  if isinstance(loss, (tuple, list)):
    raise ValueError(
        f"loss_fn must return a scalar loss, got a {type(loss).__name__} (for "
        "(loss, aux) pass has_aux=True, or a model_state to step.init)."
    )
  dtype = getattr(loss, "dtype", None)
  if dtype is None and isinstance(loss, (int, float)) and not isinstance(loss, bool):
    dtype = np.result_type(float)  # a Python number: a constant loss
  if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(
        "loss_fn must return a real floating scalar loss (the mean over its "
        "batch), got "
        + (f"an array of dtype {np.dtype(dtype).name}" if dtype is not None
           else type(loss).__name__)
        + " (gradients need a float loss; for (loss, aux) pass has_aux=True)."
    )
  loss = jnp.asarray(loss)
  if loss.shape != ():
    raise ValueError(
        "loss_fn must return a scalar loss (the mean over its batch), got shape "
        f"{loss.shape}."
    )
  if with_state:
    new_state = _match_state(new_state, model_state)
  return loss.astype(jnp.float32), (aux, new_state)


def loss_and_grads(
    loss_fn: LossFn,
    has_aux: bool,
    compute_dtype: Any,
    params: PyTree,
    batch: PyTree,
    model_state: Any = None,
    rng: Any = None,
) -> tuple[jax.Array, Any, PyTree, Any]:
  """Loss (float32), aux, gradient and new model state of one (micro)batch."""
  check_params(params)
  f = lambda p: _forward(loss_fn, has_aux, compute_dtype, p, batch, model_state, rng)
  (loss, (aux, new_state)), grads = jax.value_and_grad(f, has_aux=True)(params)
  return loss, aux, grads, new_state


def _reduce_leading(tree: Any) -> Any:
  """Over a leading (microbatch) axis: float leaves averaged, others summed."""

  def red(x):
    if is_float(x):
      return jnp.mean(x.astype(acc_dtype(x.dtype)), axis=0).astype(x.dtype)
    return jnp.sum(x, axis=0).astype(x.dtype)

  return jax.tree.map(red, tree)


def replica_grads(
    loss_fn: LossFn,
    config: GradsConfig,
    *,
    params: PyTree,
    batch: PyTree,
    model_state: Any,
    rng: Any,
    step: jax.Array,
    replica: jax.Array,
    with_sq_norms: bool = False,
) -> tuple[Any, ...]:
  """Loss, aux, gradient and model state of one replica's slice of the batch.

  `config` is the step's `StepConfig` (its `has_aux`, `compute_dtype` and
  `microbatches` are read). With `microbatches=k > 1` the slice runs as k
  contiguous microbatches under `lax.scan`: the loss and gradient are their
  means (gradients accumulated in float32), aux float leaves are averaged and
  integer leaves summed, and the model state passes from one microbatch to
  the next.

  With `with_sq_norms=True` a fifth output is the sum over the microbatches
  of their gradients' squared norms (float32), for the noise statistics.
  """
  has_aux, compute_dtype = config.has_aux, config.compute_dtype

  def key(j):
    return None if rng is None else step_key(rng, step, replica, j)

  def sq(grads):
    leaves = jax.tree.leaves(grads)
    return sum((jnp.sum(jnp.square(g.astype(jnp.float32))) for g in leaves),
               jnp.zeros((), jnp.float32))

  if config.microbatches == 1:
    out = loss_and_grads(
        loss_fn, has_aux, compute_dtype, params, batch, model_state, key(0)
    )
    return (*out, sq(out[2])) if with_sq_norms else out
  k = config.microbatches
  pieces = jax.tree.map(lambda x: x.reshape((k, x.shape[0] // k) + x.shape[1:]), batch)

  def micro(piece, state, j):
    return loss_and_grads(loss_fn, has_aux, compute_dtype, params, piece, state, key(j))

  loss, aux, grads, model_state, sq_sum = scan_microbatches(
      micro, pieces, k, params, model_state, sq=sq if with_sq_norms else None
  )
  out = (loss, aux, grads, model_state)
  return (*out, sq_sum) if with_sq_norms else out


def scan_microbatches(
    micro: Any, pieces: PyTree, k: int, params: PyTree, state: Any, *, sq: Any = None
) -> tuple[jax.Array, Any, PyTree, Any, jax.Array]:
  """Runs `micro(piece, state, j)` over `k` microbatches under `lax.scan`.

  `micro` returns `(loss, aux, grads, state)` for one piece of `pieces`
  (leading axis `k`); gradients are accumulated in float32 (or wider), the
  model state passes from one microbatch to the next, and `sq`, if given,
  sums a function of each microbatch's gradient (its squared norm).

  Returns:
    `(loss, aux, grads, state, sq_sum)`: the mean loss and gradient (in the
    parameters' dtypes), aux reduced over the microbatches (float leaves
    averaged, integer leaves summed), the last model state and the sum of
    `sq` (zero without it).
  """
  zeros = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), acc_dtype(p.dtype)), params)

  def body(carry, xs):
    acc, loss_sum, sq_sum, state = carry
    piece, j = xs
    loss, aux, grads, state = micro(piece, state, j)
    acc = jax.tree.map(lambda a, g: a + g.astype(a.dtype), acc, grads)
    if sq is not None:
      sq_sum = sq_sum + sq(grads)
    return (acc, loss_sum + loss, sq_sum, state), aux

  zero = jnp.zeros((), jnp.float32)
  (acc, loss_sum, sq_sum, state), auxs = lax.scan(
      body, (zeros, zero, zero, state), (pieces, jnp.arange(k, dtype=jnp.int32))
  )
  grads = jax.tree.map(lambda a, p: (a / k).astype(p.dtype), acc, params)
  aux = None if auxs is None else _reduce_leading(auxs)
  return loss_sum / k, aux, grads, state, sq_sum


def stacked_replica_grads(
    loss_fn: LossFn,
    config: GradsConfig,
    *,
    params: PyTree,
    batch: PyTree,
    model_state: Any,
    rng: Any,
    step: jax.Array,
    replicas: jax.Array,
    split: Any,
    vmap_axes: dict[str, Any],
) -> tuple[jax.Array, Any, PyTree, Any]:
  """What `replica_grads` computes on every replica, combined over replicas.

  For the GSPMD step: `batch` holds the replicas' slices stacked on a leading
  axis laid out over the data axes (`split`), `replicas` their indices. Each
  replica runs its own forward pass on its own slice (a `vmap` over the
  replicas, so batch statistics and keys stay per replica, as under
  `shard_map`), and the gradient is that of the *mean* of the replicas'
  losses: the sum over replicas happens inside the backward pass, where the
  compiler reduces each gradient as it is produced, instead of stacking one
  gradient per replica and averaging the stack (which cost about a fifth of a
  small FSDP step on 8 CPU devices). The result equals the mean of the
  replicas' gradients up to float32 rounding. With parameters or
  `compute_dtype` below float32 the stack is kept and averaged in float32,
  so that no gradient is summed in a low-precision dtype.

  Returns:
    `(loss, aux, grads, model_state)`: the mean loss over the global batch,
    aux (float leaves averaged, integer leaves summed over microbatches and
    replicas), the mean gradient, and the model state with float leaves
    averaged over the replicas and other leaves taken from replica 0.
  """
  n, k = replicas.shape[0], config.microbatches
  has_aux, compute_dtype = config.has_aux, config.compute_dtype
  if model_state is not None:
    model_state = jax.tree.map(
        lambda x: jnp.broadcast_to(x, (n,) + jnp.shape(x)), model_state
    )

  def key(replica, j):
    return None if rng is None else step_key(rng, step, replica, j)

  # The sum over replicas inside the backward pass runs in the dtype the
  # parameters enter the forward pass with; the step promises float32
  # gradient reductions, so low-precision parameters or compute keep one
  # gradient per replica and average the stack in float32.
  fused = all(
      jnp.promote_types(jnp.result_type(p), jnp.float32) == jnp.result_type(p)
      for p in jax.tree.leaves(params) if is_float(p)
  ) and (compute_dtype is None
         or jnp.promote_types(compute_dtype, jnp.float32) == jnp.dtype(compute_dtype))

  def micro(piece, states, j):
    if fused:
      def total(p):
        one = lambda b, st, r: _forward(
            loss_fn, has_aux, compute_dtype, p, b, st, key(r, j)
        )
        losses, out = jax.vmap(one, **vmap_axes)(piece, states, replicas)
        return jnp.mean(losses), out

      (loss, (aux, states)), grads = jax.value_and_grad(total, has_aux=True)(params)
      return loss, aux, grads, states

    def one(b, st, r):
      f = lambda p: _forward(loss_fn, has_aux, compute_dtype, p, b, st, key(r, j))
      (loss, (aux, st)), grads = jax.value_and_grad(f, has_aux=True)(params)
      return loss, aux, grads, st

    losses, aux, grads, states = jax.vmap(one, **vmap_axes)(piece, states, replicas)
    grads = jax.tree.map(lambda g: jnp.mean(g.astype(acc_dtype(g.dtype)), axis=0), grads)
    return jnp.mean(losses), aux, grads, states

  if k == 1:
    loss, aux, grads, model_state = micro(batch, model_state, 0)
    grads = jax.tree.map(lambda g, p: g.astype(jnp.result_type(p)), grads, params)
    return (loss, mean_stacked_aux(aux), grads,
            replicate_stacked_model_state(model_state))
  # (replicas, rows) -> (microbatches, replicas, rows / microbatches)
  pieces = jax.tree.map(
      lambda x: jnp.swapaxes(
          x.reshape((n, k, x.shape[1] // k) + x.shape[2:]), 0, 1), batch
  )
  def constrained(piece, states, j):
    piece = jax.tree.map(lambda x: lax.with_sharding_constraint(x, split), piece)
    return micro(piece, states, j)

  loss, aux, grads, model_state, _ = scan_microbatches(
      constrained, pieces, k, params, model_state
  )
  aux = None if aux is None else mean_stacked_aux(aux)
  return (loss, aux, grads, replicate_stacked_model_state(model_state))


# ---------------------------------------------------------------------------
# Combining over replicas inside shard_map / pmap (named axes).
# ---------------------------------------------------------------------------


def mean_aux(aux: Any, axes: Any) -> Any:
  """Float leaves averaged (in float32 or wider), integer leaves summed."""
  if aux is None:
    return None

  def red(x):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
      return lax.pmean(x.astype(acc_dtype(x.dtype)), axes)
    return lax.psum(x, axes)

  return jax.tree.map(red, aux)


def replicate_model_state(state: Any, axes: Any, replica: jax.Array,
                          mean: Any = None) -> Any:
  """Float leaves averaged over replicas; other leaves taken from replica 0.

  The averaged state is the same on every replica, as a replicated model
  state (flax's cross-replica batch-norm statistics) must be. `mean`, if
  given, averages the tree of float leaves at once in their accumulation
  dtype (Multislice: the hierarchical float32 mean, so only 1/M of the
  statistics crosses the slices); default `lax.pmean` over `axes`.
  """
  if state is None:
    return None
  leaves, treedef = jax.tree.flatten(state)
  floats = [i for i, x in enumerate(leaves) if is_float(x)]
  if mean is not None and floats:
    means = mean([leaves[i].astype(acc_dtype(leaves[i].dtype)) for i in floats])
    averaged = {i: m.astype(leaves[i].dtype) for i, m in zip(floats, means, strict=True)}
  else:
    averaged = {i: lax.pmean(leaves[i].astype(acc_dtype(leaves[i].dtype)), axes).astype(
        leaves[i].dtype) for i in floats}

  def first(x):
    return lax.psum(jnp.where(replica == 0, x.astype(jnp.int32), 0), axes).astype(x.dtype)

  return jax.tree.unflatten(treedef, [averaged[i] if i in averaged else first(x)
                                      for i, x in enumerate(leaves)])


def replicate_stacked_model_state(state: Any) -> Any:
  """As `replicate_model_state`, for states stacked along a replica axis 0."""
  if state is None:
    return None

  def red(x):
    if is_float(x):
      return jnp.mean(x.astype(acc_dtype(x.dtype)), axis=0).astype(x.dtype)
    return x[0]

  return jax.tree.map(red, state)


def mean_stacked_aux(aux: Any) -> Any:
  """As `mean_aux`, for aux stacked along a replica axis 0."""
  if aux is None:
    return None

  def red(x):
    if jnp.issubdtype(x.dtype, jnp.inexact):
      return jnp.mean(x.astype(acc_dtype(x.dtype)), axis=0)
    return jnp.sum(x, axis=0)

  return jax.tree.map(red, aux)


# ---------------------------------------------------------------------------
# Validation shared by the steps.
# ---------------------------------------------------------------------------


#: Floating dtypes a step computes in (``compute_dtype``), by name.
FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")


def check_float_dtype(name: str, dtype: Any) -> None:
  """`dtype` is None or a floating dtype; otherwise the error names `name`."""
  if dtype is None:
    return
  allowed = f"None or a floating dtype ({', '.join(FLOAT_DTYPES)})"
  try:
    dt = jnp.dtype(dtype)
  except (TypeError, ValueError) as e:
    raise TypeError(f"{name} must be {allowed}, got {dtype!r}.") from e
  if not jnp.issubdtype(dt, jnp.floating):
    raise TypeError(f"{name} must be {allowed}, got {dtype!r} ({dt.name}).")


def check_axes(name: str, axes: Any) -> tuple[Hashable, ...]:
  """A sequence of mesh axis names as a tuple; anything else names `name`."""
  if isinstance(axes, (str, bytes)) or not isinstance(axes, (tuple, list)):
    raise TypeError(
        f"{name} must be a tuple or list of mesh axis names, got {axes!r}."
    )
  return tuple(axes)


def check_params(params: PyTree) -> None:
  """Every parameter leaf is floating or complex (gradients need it).

  Static (dtype) only, so it runs once at trace time; names the first
  offending leaf by its path.
  """
  for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
    dtype = getattr(x, "dtype", None)
    if dtype is None:
      try:
        dtype = np.asarray(x).dtype
      except Exception:  # noqa: BLE001 - an object NumPy cannot read
        dtype = np.dtype(object)
    if np.dtype(dtype).kind in "OSU":  # strings, objects: not arrays at all
      raise TypeError(
          f"every parameter must be a float (or complex) array, got "
          f"params{jax.tree_util.keystr(path)} = {x!r} ({type(x).__name__}); "
          "keep names, configs and other non-array values out of the "
          "parameters (e.g. in a closure of loss_fn)."[:400]
      )
    if not jnp.issubdtype(dtype, jnp.inexact):
      raise TypeError(
          f"every parameter must be a float (or complex) array to be "
          f"differentiated, got params{jax.tree_util.keystr(path)} of dtype "
          f"{np.dtype(dtype).name}; keep integer or bool values (counters, "
          "masks) in model_state or the batch, or cast them to float."
      )


def check_batch(batch: PyTree, replicas: int, microbatches: int = 1) -> None:
  """Every leaf's leading dimension must split over replicas × microbatches,
  and every leaf must have the same number of rows."""
  n = replicas * microbatches
  flat = jax.tree_util.tree_flatten_with_path(batch)[0]
  if not flat:
    raise ValueError(
        f"batch must be a pytree with at least one array leaf (rows on axis 0), "
        f"got {batch!r}."[:300]
    )
  rows: dict[int, list[str]] = {}
  for path, x in flat:
    try:
      shape = np.shape(x)
    except Exception:  # noqa: BLE001 - e.g. a ragged list NumPy cannot shape
      shape = ()
    try:
      kind = (x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype).kind
    except Exception:  # noqa: BLE001 - an object NumPy cannot read
      kind = "O"
    if kind in "OSU":  # strings and objects (bfloat16 and keys are "V")
      raise TypeError(
          f"every batch leaf must be a numeric array, got "
          f"batch{jax.tree_util.keystr(path)} = {x!r} ({type(x).__name__})."[:300]
      )
    if shape and shape[0] == 0:
      raise ValueError(
          f"batch{jax.tree_util.keystr(path)} has 0 rows (shape {shape}): a batch "
          f"needs at least one row per replica x microbatch (the loss of an "
          f"empty batch is NaN)."
      )
    if shape:
      rows.setdefault(shape[0], []).append(f"batch{jax.tree_util.keystr(path)}")
  if len(rows) > 1:
    listed = "; ".join(
        f"{r} rows: {', '.join(names[:4])}{', ...' if len(names) > 4 else ''}"
        for r, names in sorted(rows.items())
    )
    raise ValueError(
        "every batch leaf must have the same number of rows (leading "
        f"dimension), got {listed}."
    )
  for path, x in flat:
    shape = np.shape(x)
    if not shape:
      raise ValueError(
          f"every batch leaf needs the batch along a leading axis, got "
          f"batch{jax.tree_util.keystr(path)} = {x!r:.40}, a scalar (constants "
          "belong in loss_fn's closure, or in the model state)."
      )
    if shape[0] % n:
      split = (
          f"{replicas} data-parallel replicas x {microbatches} microbatches"
          if microbatches > 1
          else f"{replicas} data-parallel replicas"
      )
      raise ValueError(
          f"every batch leaf needs a leading (batch) dimension divisible by the "
          f"{split} (= {n}), got batch{jax.tree_util.keystr(path)} of shape "
          f"{shape}."
      )


def as_key(rng: Any) -> Any:
  """An int seed becomes a raw uint32 key (checkpoints as a plain array)."""
  if rng is None:
    return None
  allowed = "an int seed, a key from jax.random.key or a raw uint32 jax.random.PRNGKey"
  if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
    return jax.random.key_data(jax.random.key(int(rng)))
  if isinstance(rng, (bool, float, str, bytes)):
    raise TypeError(f"rng must be {allowed}, got {rng!r}.")
  if not isinstance(rng, jax.Array):
    try:
      rng = jnp.asarray(rng)
    except (TypeError, ValueError) as e:
      raise TypeError(f"rng must be {allowed}, got {type(rng).__name__}.") from e
  typed = jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
  if not typed and rng.dtype != jnp.uint32:
    raise TypeError(f"rng must be {allowed}, got an array of dtype {rng.dtype}.")
  if not typed and not isinstance(rng, jax.core.Tracer):
    try:
      jax.random.wrap_key_data(rng)
    except (TypeError, ValueError) as e:
      raise TypeError(
          f"rng must be {allowed}, got a uint32 array of shape {rng.shape} ({e})."
      ) from None
  return rng


def replica_index(axes: tuple[Hashable, ...]) -> jax.Array:
  """Row-major index of this replica over the data axes (shard_map/pmap)."""
  return lax.axis_index(axes if len(axes) > 1 else axes[0])
