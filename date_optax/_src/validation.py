"""Argument checks shared by every public constructor.

Each check raises at construction time, names the argument and states the
allowed range, and never clips. Schedules (callables) are accepted where a
hyperparameter may vary with the step; they are validated by the schedule
constructors themselves.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np


def _is_schedule(value: Any) -> bool:
  return callable(value)


def _is_tracer(value: Any) -> bool:
  import jax  # local: validation is imported before anything touches JAX

  return isinstance(value, jax.core.Tracer)


def _as_float(name: str, value: Any) -> float | None:
  """The value as a float; None for a traced value (checked when concrete)."""
  if _is_tracer(value):
    # optax.inject_hyperparams rebuilds the optimizer from traced
    # hyperparameters inside jit; they were validated when first built.
    return None
  if isinstance(value, bool) or value is None:
    raise TypeError(f"{name} must be a real number, got {value!r}.")
  if isinstance(value, numbers.Real):
    return float(value)
  # 0-d numpy / jax arrays that are concrete.
  try:
    arr = np.asarray(value)
  except Exception as e:  # noqa: BLE001 - tracer or exotic object
    raise TypeError(
        f"{name} must be a concrete real number, got {type(value).__name__}."
    ) from e
  if arr.shape != () or arr.dtype.kind not in "fiu":
    raise TypeError(f"{name} must be a real scalar, got {value!r}.")
  return float(arr)


def check_real(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
    allow_schedule: bool = False,
) -> Any:
  """Checks that `value` is a finite real in the given interval.

  Returns `value` unchanged (a schedule is returned as is when allowed).
  """
  if allow_schedule and _is_schedule(value):
    return value
  if _is_schedule(value):
    raise TypeError(f"{name} must be a number, not a schedule (got {value!r}).")
  x = _as_float(name, value)
  if x is None:
    return value
  lo = "[" if low_inclusive else "("
  hi = "]" if high_inclusive else ")"
  rng = f"{lo}{'-inf' if low is None else low}, {'inf' if high is None else high}{hi}"
  if not math.isfinite(x):
    raise ValueError(f"{name} must be finite and in {rng}, got {value!r}.")
  bad = (
      (low is not None and (x < low or (x == low and not low_inclusive)))
      or (high is not None and (x > high or (x == high and not high_inclusive)))
  )
  if bad:
    raise ValueError(f"{name} must be in {rng}, got {value!r}.")
  return value


def check_nonnegative(name: str, value: Any, *, allow_schedule: bool = False) -> Any:
  """`value >= 0` (finite)."""
  return check_real(name, value, low=0.0, allow_schedule=allow_schedule)


def check_positive(name: str, value: Any, *, allow_schedule: bool = False) -> Any:
  """`value > 0` (finite)."""
  return check_real(
      name, value, low=0.0, low_inclusive=False, allow_schedule=allow_schedule
  )


def check_unit_interval(
    name: str, value: Any, *, include_one: bool = False, allow_schedule: bool = False
) -> Any:
  """`0 <= value < 1` (or `<= 1` with `include_one`)."""
  return check_real(
      name,
      value,
      low=0.0,
      high=1.0,
      high_inclusive=include_one,
      allow_schedule=allow_schedule,
  )


def check_int(
    name: str, value: Any, *, low: int | None = None, high: int | None = None
) -> int:
  """An integer (not bool) in `[low, high]`."""
  if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
    raise TypeError(f"{name} must be an integer, got {value!r}.")
  v = int(value)
  if (low is not None and v < low) or (high is not None and v > high):
    rng = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
    raise ValueError(f"{name} must be an integer in {rng}, got {value!r}.")
  return v


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
  """One of a fixed set of strings."""
  choices = tuple(choices)
  if not isinstance(value, str):
    raise TypeError(f"{name} must be one of {choices}, got {value!r}.")
  if value not in choices:
    raise ValueError(f"{name} must be one of {choices}, got {value!r}.")
  return value


def check_bool(name: str, value: Any) -> bool:
  if _is_tracer(value):
    return value
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be a bool, got {value!r}.")
  return bool(value)


def check_bounds(lower: Any, upper: Any) -> None:
  """Validates optional ratio bounds: non-negative, and `lower <= upper`."""
  if lower is not None:
    check_nonnegative("lower", lower, allow_schedule=True)
  if upper is not None:
    check_positive("upper", upper, allow_schedule=True)
  if (
      lower is not None
      and upper is not None
      and not _is_schedule(lower)
      and not _is_schedule(upper)
      and not _is_tracer(lower)
      and not _is_tracer(upper)
      and float(lower) > float(upper)
  ):
    raise ValueError(
        f"lower must be <= upper, got lower={lower!r} > upper={upper!r}."
    )


def check_trust_coefficient(value: Any) -> Any:
  """The trust coefficient ``c`` of every trust-ratio transform: finite and > 0.

  One rule for every transform that takes it (:func:`date_optax.lars`,
  :func:`date_optax.bounded_lars`, :func:`date_optax.scale_by_trust_ratio`,
  hence :func:`date_optax.date`): ``c`` multiplies every layer's ratio, so
  ``c = 0`` would zero the update of every layer with nonzero norms (only
  the zero-norm rule's ratio 1 or a lower bound would be left) and ``c < 0``
  would reverse it.
  """
  try:
    return check_positive("trust_coefficient", value)
  except ValueError:
    raise ValueError(
        "trust_coefficient must be finite and > 0 (it multiplies every layer's "
        f"trust ratio: 0 would zero the updates), got {value!r}."
    ) from None


def warn_at_caller(message: str, category: type[Warning] = UserWarning) -> None:
  """Warns at the first frame outside date_optax (the user's call), however
  deep in the library the warning is raised (a dataclass's generated
  `__init__` and `dataclasses.replace` count as the library's)."""
  import dataclasses  # noqa: PLC0415
  import os  # noqa: PLC0415
  import sys  # noqa: PLC0415

  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
  frame, level = sys._getframe(1), 1
  while frame is not None and (
      frame.f_code.co_filename.startswith(package)
      or frame.f_code.co_filename == dataclasses.__file__
      or (frame.f_code.co_filename == "<string>" and frame.f_code.co_name == "__init__")):
    frame, level = frame.f_back, level + 1
  warnings.warn(message, category, stacklevel=level + 1)


def warn_deprecated_keyword(fn: str, old: str, new: str, *, stacklevel: int = 3) -> None:
  """A ``DeprecationWarning`` for ``fn(old=...)``, renamed ``new``.

  The default ``stacklevel`` points at the caller of the public function
  that calls this helper directly.
  """
  warnings.warn(
      f"{fn}({old}=...) is deprecated and will be removed in the next release: "
      f"pass {new}=... (same meaning).",
      DeprecationWarning,
      stacklevel=stacklevel,
  )


def deprecated_keyword(
    fn: str, new: str, value: Any, old: str, old_value: Any, *, default: Any = None,
    stacklevel: int = 4,
) -> Any:
  """The value of keyword ``new``, or of its deprecated former name ``old``.

  ``old_value`` is ``None`` when the old name was not given; otherwise it
  warns (``DeprecationWarning``) and is used, unless ``new`` was given a
  different value too (``value`` not ``default``), which is an error naming
  both.
  """
  if old_value is None:
    return value
  warn_deprecated_keyword(fn, old, new, stacklevel=stacklevel)
  # Strings compare by value (a choice such as ratio_source); anything else
  # (a mask) counts as given when it is not the default object.
  given = not (value is default or (isinstance(value, str) and value == default))
  if given and not (isinstance(value, str) and value == old_value):
    raise ValueError(
        f"{old} is the deprecated name of {new}: give one of them, not both "
        f"(got {new}={value!r} and {old}={old_value!r})."
    )
  return old_value


def check_mask(name: str, value: Any) -> Any:
  """A mask is None, a bool, a pytree of bools, or a callable on params."""
  if value is None or isinstance(value, (bool, np.bool_)) or callable(value):
    return value
  if isinstance(value, (numbers.Number, str)):
    raise TypeError(
        f"{name} must be a bool pytree or a callable params -> bool pytree, "
        f"got {value!r}."
    )
  return value


# ---------------------------------------------------------------------------
# Checks of the trust-ratio transforms: the structure of masks, layer axes and
# updates, at construction or trace time, never inside the jitted computation.


def _keystr(path: Any) -> str:
  import jax

  return jax.tree_util.keystr(tuple(path)) or "(root)"


def _is_layer_axes_leaf(x: Any) -> bool:
  if x is None or (isinstance(x, (numbers.Integral, np.integer)) and not isinstance(x, bool)):
    return True
  return isinstance(x, tuple) and all(
      isinstance(i, (numbers.Integral, np.integer)) and not isinstance(i, bool) for i in x)


def check_layer_axes(name: str, value: Any) -> Any:
  """``None``, an int, a tuple of ints, a pytree of those, or a callable."""
  import jax

  if callable(value) or _is_layer_axes_leaf(value):
    return value
  allowed = ("None, an int, a tuple of ints, a pytree of those like the "
             "parameters, or a callable params -> such a pytree")
  if isinstance(value, (str, bytes, float, bool, numbers.Number)) or hasattr(value, "dtype"):
    raise TypeError(f"{name} must be {allowed}; got {value!r}.")
  leaves = jax.tree_util.tree_flatten_with_path(
      value, is_leaf=lambda x: x is None or _is_layer_axes_leaf(x))[0]
  for path, leaf in leaves:
    if not _is_layer_axes_leaf(leaf):
      raise TypeError(f"{name}{_keystr(path)} must be None, an int or a tuple of ints "
                      f"({name} must be {allowed}); got {leaf!r}.")
  return value


def check_layer_options(trust_ratio_mask: Any, weight_decay_mask: Any, layer_axes: Any,
                        mask: Any = None) -> None:
  """The per-layer options every trust-ratio transform takes, checked when built.

  Its two masks (:func:`check_mask`), ``layer_axes``
  (:func:`check_layer_axes`) and, where the transform still takes it, the
  deprecated ``mask``.
  """
  check_mask("mask", mask)
  check_mask("trust_ratio_mask", trust_ratio_mask)
  check_mask("weight_decay_mask", weight_decay_mask)
  check_layer_axes("layer_axes", layer_axes)


def check_float_dtype(name: str, value: Any) -> Any:
  """``None`` or a floating-point dtype (a moment stored as int is always 0)."""
  if value is None:
    return value
  import jax.numpy as jnp

  try:
    dt = jnp.dtype(value)
  except Exception as e:  # noqa: BLE001 - any unparsable dtype
    raise TypeError(f"{name} must be None or a floating dtype such as "
                    f"jnp.float32 or jnp.bfloat16, got {value!r}.") from e
  if not jnp.issubdtype(dt, jnp.floating):
    raise TypeError(f"{name} must be None or a floating dtype such as "
                    f"jnp.float32 or jnp.bfloat16, got {dt}.")
  return value


def _is_bool_scalar(x: Any) -> bool:
  if isinstance(x, (bool, np.bool_)):
    return True
  return (hasattr(x, "dtype") and hasattr(x, "shape") and tuple(x.shape) == ()
          and np.dtype(x.dtype) == np.bool_ and not _is_tracer(x))


def check_mask_leaves(name: str, mask: Any, none_paths: frozenset = frozenset()) -> Any:
  """A mask pytree's leaves are Python bools or bool scalars (not strings,
  ``None``, numbers or per-element arrays). Callables are checked on their
  result by :func:`check_mask_against`, where ``None`` is taken at the
  paths ``none_paths`` (those where the parameters hold ``None``, an empty
  subtree, as a callable that maps the parameters' tree returns it)."""
  import jax

  if mask is None or callable(mask):
    return mask
  leaves = jax.tree_util.tree_flatten_with_path(
      mask, is_leaf=lambda x: x is None or _is_bool_scalar(x))[0]
  for path, leaf in leaves:
    if leaf is None and jax.tree_util.keystr(tuple(path)) in none_paths:
      continue
    if not _is_bool_scalar(leaf):
      shape = getattr(leaf, "shape", None)
      what = (f"an array of shape {tuple(shape)}" if shape not in (None, ())
              else repr(leaf))
      raise TypeError(
          f"{name}{_keystr(path) if path else ''} must be a Python bool or a bool "
          f"scalar (True = apply), got {what}; masks hold one bool per parameter "
          "leaf (or per subtree), or are a callable params -> such a pytree.")
  return mask


def check_mask_against(name: str, mask: Any, params: Any) -> Any:
  """The mask (or the callable's result on ``params``) as a checked bool pytree.

  Its leaves must be bools and its tree the parameters' tree or a prefix of
  it; otherwise the error names the mask and the first path that differs.
  """
  import jax

  if mask is None:
    return None
  where = f"{name} (returned by {getattr(mask, '__name__', 'the callable')})" if callable(
      mask) else name
  if callable(mask):
    try:
      value = mask(params)
    except (TypeError, ValueError) as e:
      raise type(e)(f"{name}: calling the mask callable on the parameters failed "
                    f"({e}); a callable mask takes params and returns a bool pytree.") from e
    if callable(value):
      raise TypeError(f"{where} must be a bool pytree, got the callable {value!r}; a "
                      "callable mask takes params and returns a bool pytree.")
  else:
    value = mask
  nones = frozenset(jax.tree_util.keystr(tuple(p)) for p, x in jax.tree_util.tree_flatten_with_path(
      params, is_leaf=lambda x: x is None)[0] if x is None)
  check_mask_leaves(where, value, nones if callable(mask) else frozenset())
  if _is_bool_scalar(value):
    return value
  mask_paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(
      value, is_leaf=_is_bool_scalar)[0]]
  param_paths = [tuple(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  mask_set = set(mask_paths)
  prefixes = set()
  for p in param_paths:
    prefix_strs = [jax.tree_util.keystr(p[:i]) for i in range(len(p) + 1)]
    prefixes.update(prefix_strs)
    if not mask_set.intersection(prefix_strs):
      raise ValueError(
          f"{where} does not match the parameters' tree: it has no entry for the "
          f"parameter {_keystr(p)}; give a bool pytree with the structure of the "
          "parameters (or a prefix of it).")
  for mp in mask_paths:
    if mp not in prefixes:
      raise ValueError(
          f"{where} does not match the parameters' tree: its entry {mp or '(root)'} "
          "is not a parameter path (nor a prefix of one).")
  return value


def check_updates_like_params(updates: Any, params: Any, name: str = "updates") -> None:
  """Updates (gradients) have the parameters' tree and shapes, else the path is named."""
  import jax

  u_leaves = jax.tree_util.tree_flatten_with_path(updates)[0]
  p_leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  u_paths = {jax.tree_util.keystr(p): x for p, x in u_leaves}
  p_paths = {jax.tree_util.keystr(p): x for p, x in p_leaves}
  if jax.tree.structure(updates) != jax.tree.structure(params):
    missing = [p or "(root)" for p in p_paths if p not in u_paths]
    extra = [p or "(root)" for p in u_paths if p not in p_paths]
    if missing or extra:
      parts = []
      if missing:
        parts.append(f"parameter(s) {', '.join(missing)} have no entry in {name}")
      if extra:
        parts.append(f"{name} entries {', '.join(extra)} are not parameters")
      raise ValueError(f"{name} do not match params: " + "; ".join(parts) + ".")
    raise ValueError(f"{name} do not have the parameters' tree structure: "
                     f"{jax.tree.structure(updates)} vs {jax.tree.structure(params)}.")
  for path, p in p_paths.items():
    u = u_paths[path]
    if np.shape(u) != np.shape(p):
      raise ValueError(
          f"{name}{path} has shape {tuple(np.shape(u))} but the parameter {path or '(root)'} "
          f"has shape {tuple(np.shape(p))}; {name} must have the parameters' shapes.")


def check_schedules_at_init(**values: Any) -> None:
  """Schedules evaluated at step 0 obey the rule their float would.

  Keywords: ``learning_rate`` and ``weight_decay`` (>= 0), ``lower`` (>= 0),
  ``upper`` (> 0), with ``lower <= upper``. Floats were checked at
  construction; a traced value (init under jit) is left alone.
  """
  at0 = {}
  for name, value in values.items():
    if value is None:
      continue
    v = value(0) if _is_schedule(value) else value
    if _is_tracer(v):
      continue
    label = f"{name} (a schedule, at step 0)" if _is_schedule(value) else name
    try:
      x = _as_float(label, v)
    except TypeError as e:
      raise TypeError(f"{label} must give a real scalar, got {v!r}.") from e
    if x is None:
      continue
    if name == "upper":
      check_positive(label, x)
    else:
      check_nonnegative(label, x)
    at0[name] = (label, x)
  if "lower" in at0 and "upper" in at0 and at0["lower"][1] > at0["upper"][1]:
    raise ValueError(
        f"lower must be <= upper, got {at0['lower'][0]} = {at0['lower'][1]:g} > "
        f"{at0['upper'][0]} = {at0['upper'][1]:g}.")


def _differs(value: Any, default: Any) -> bool:
  if value is default:
    return False
  try:
    return not bool(value == default)
  except (TypeError, ValueError):
    return True


def config_from(
    config: Any, cls: type, flat: dict[str, tuple[str, Any, Any]]
) -> Any:
  """A builder's config argument, or the config its flat keywords spell.

  `flat` maps each flat keyword to `(field, value, default)`. A keyword that
  differs from its default, given together with `config`, is refused, as is
  a `config` of another type; the name of the argument is `cls`'s in
  snake case (`grad_sync`, `step_config`).
  """
  name = "".join("_" + c.lower() if c.isupper() else c for c in cls.__name__)[1:]
  if config is None:
    return cls(**{field: value for field, value, _ in flat.values()})
  if not isinstance(config, cls):
    raise TypeError(f"{name} must be a date_optax.parallel.{cls.__name__}, got {config!r}.")
  given = [k for k, (_, value, default) in flat.items() if _differs(value, default)]
  if given:
    raise ValueError(
        f"pass {name}= or the flat keywords {', '.join(given)}, not both: "
        f"{name}={config!r} already holds them."
    )
  return config


# ---------------------------------------------------------------------------
# The leaves an optimizer is given: every kind a user's pytree can hold is
# either taken as optax takes it or named, with its path, before any work.


def _leaf_dtype(x: Any) -> Any:
  """The dtype of an array-like leaf; None for anything else (str, object)."""
  if isinstance(x, (bool, int, float, complex)):
    return np.result_type(type(x))
  dtype = getattr(x, "dtype", None)
  if dtype is None or not hasattr(x, "shape"):
    return None
  try:
    return np.dtype(dtype)
  except TypeError:  # extended dtypes (typed PRNG keys) are not NumPy's
    return dtype


def _describe_leaf(x: Any) -> str:
  """A leaf in a few words: 'int32 array of shape (3,)', 'Python int 3'."""
  if isinstance(x, (bool, int, float, complex)):
    return f"Python {type(x).__name__} {x!r}"
  dtype = _leaf_dtype(x)
  if dtype is None:
    return f"{type(x).__name__} {x!r:.40}"
  if isinstance(x, np.generic):
    return f"NumPy {dtype} scalar {x}"
  return f"{dtype} array of shape {tuple(x.shape)}"


def _is_float_dtype(dtype: Any) -> bool:
  import jax.numpy as jnp

  return dtype is not None and (jnp.issubdtype(dtype, jnp.floating)
                                or jnp.issubdtype(dtype, jnp.complexfloating))


def _is_number_dtype(dtype: Any) -> bool:
  import jax.numpy as jnp

  return dtype is not None and (_is_float_dtype(dtype) or jnp.issubdtype(dtype, jnp.integer)
                                or jnp.issubdtype(dtype, jnp.bool_))


def _as_array(x: Any) -> Any:
  import jax
  import jax.numpy as jnp

  if isinstance(x, (jax.Array, jax.core.Tracer, jax.ShapeDtypeStruct)):
    return x
  return jnp.asarray(x)


def float_leaves(params: Any, who: str, name: str = "params") -> Any:
  """``params`` with every leaf a JAX array, or a TypeError naming a leaf
  that is not floating-point or complex.

  Taken (as optax takes them): JAX and NumPy arrays of a floating or complex
  dtype, empty ones included, NumPy float scalars and Python floats and
  complex numbers (made 0-d arrays, as ``jnp.asarray`` makes them); ``None``
  is an empty subtree, as in optax. Refused, naming the path, the leaf and
  ``who``: integer and boolean arrays and scalars (a trust ratio of integers
  is meaningless, and ``optax.apply_updates`` would round the update back to
  the integer), typed PRNG keys, strings and other objects.
  """
  import jax

  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  for path, x in leaves:
    if not _is_float_dtype(_leaf_dtype(x)):
      raise TypeError(
          f"{name}{jax.tree_util.keystr(path)}: {_describe_leaf(x)}; {who} needs "
          "floating-point (or complex) leaves: cast it (jnp.asarray(x, jnp.float32)) "
          "or keep it out of what the optimizer updates (optax.masked).")
  return treedef.unflatten([_as_array(x) for _, x in leaves])


def number_leaves(updates: Any, who: str, name: str = "updates") -> Any:
  """``updates`` with every leaf a JAX array, or a TypeError naming a leaf
  that is not a number (a string, an object, a typed PRNG key).

  Integer and boolean gradients are taken, as optax takes them: the update
  has the dtype ``jnp.promote_types(param, grad)``.
  """
  import jax

  leaves, treedef = jax.tree_util.tree_flatten_with_path(updates)
  for path, x in leaves:
    if not _is_number_dtype(_leaf_dtype(x)):
      raise TypeError(
          f"{name}{jax.tree_util.keystr(path)}: {_describe_leaf(x)}; {who} needs "
          "numeric leaves (arrays or numbers), like the gradients of the parameters.")
  return treedef.unflatten([_as_array(x) for _, x in leaves])
