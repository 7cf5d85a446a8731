"""Readers of what an optimizer state records: trust ratios, bounds, learning rate.

The readers search the state of any composition (``optax.chain``,
``optax.inject_hyperparams``, ``optax.MultiSteps``, ``optax.masked``, ...)
for the first state whose type is in one table, :data:`STATE_FIELDS`, which
says where each state type keeps each value. That table is the whole
registry: a reader understands a state type if and only if the table lists
it, and adding a type is one line there (or one :func:`register_state` call
for a state defined outside this package).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from date_optax._src import layer_ratios as layer_ratios_lib
from date_optax._src.lamb import LambState
from date_optax._src.lars import BoundedLarsState, LarsState
from date_optax._src.trust_ratio import TrustRatioState
from date_optax._src.types import PyTree

#: A function ``state -> value`` (``None`` when the state holds no value).
Getter = Callable[[Any], Any]


class StateFields(NamedTuple):
  """Where one optimizer-state type keeps what the readers return.

  Attributes:
    ratios: ``state -> per-layer trust ratios``, read by :func:`trust_ratios`;
      ``None`` when the type keeps none.
    bounds: ``state -> (lower, upper)``, read by :func:`trust_ratio_bounds`.
    learning_rate: ``state -> learning rate`` (or ``None``), read by
      :func:`current_learning_rate`.
    inner: the attribute of a wrapper state to search when it holds no value
      for a reader (``'inner_state'`` of ``optax.inject_hyperparams``);
      ``None``: the search stops at this state.
  """

  ratios: Getter | None = None
  bounds: Getter | None = None
  learning_rate: Getter | None = None
  inner: str | None = None


def _injected_learning_rate(state: optax.InjectStatefulHyperparamsState) -> Any:
  """``hyperparams['learning_rate']`` of an ``optax.inject_hyperparams`` state."""
  hyperparams = state.hyperparams
  lr = hyperparams.get("learning_rate") if isinstance(hyperparams, dict) else None
  return None if lr is None else jnp.asarray(lr, jnp.float32)


_RATIOS = operator.attrgetter("ratios")
_BOUNDS = operator.attrgetter("bounds")
_LEARNING_RATE = operator.attrgetter("learning_rate")

#: The registry: every optimizer-state type the readers understand, and where
#: it keeps the trust ratios, the bounds and the learning rate of its last
#: step. ``TrustRatioState`` (:func:`date_optax.scale_by_trust_ratio`) records
#: no learning rate: the rate is applied by another piece of the chain.
STATE_FIELDS: dict[type, StateFields] = {
    TrustRatioState: StateFields(ratios=_RATIOS, bounds=_BOUNDS),
    LarsState: StateFields(ratios=_RATIOS, bounds=_BOUNDS, learning_rate=_LEARNING_RATE),
    LambState: StateFields(ratios=_RATIOS, bounds=_BOUNDS, learning_rate=_LEARNING_RATE),
    BoundedLarsState: StateFields(ratios=_RATIOS, bounds=_BOUNDS,
                                  learning_rate=_LEARNING_RATE),
    optax.InjectStatefulHyperparamsState: StateFields(
        learning_rate=_injected_learning_rate, inner="inner_state"),
}


def register_state(cls: type, fields: StateFields) -> type:
  """Adds ``cls`` to :data:`STATE_FIELDS` (for a state defined elsewhere)."""
  if not isinstance(fields, StateFields):
    raise TypeError(f"fields must be a StateFields, got {fields!r}.")
  STATE_FIELDS[cls] = fields
  return cls


def fields_of(x: Any) -> StateFields | None:
  """The table's entry for ``x``'s type (or a base class of it), else None."""
  for cls in type(x).__mro__:
    fields = STATE_FIELDS.get(cls)
    if fields is not None:
      return fields
  return None


def registered_types() -> tuple[type, ...]:
  """The state types in :data:`STATE_FIELDS`, for ``isinstance``."""
  return tuple(STATE_FIELDS)


def find(opt_state: Any, field: str) -> Any:
  """The first value a registered state holds for ``field`` ('ratios', ...).

  States are visited in the order of ``jax.tree.leaves``; a registered state
  without the value ends the search on its branch unless its entry names an
  ``inner`` state to search.
  """
  is_node = lambda x: fields_of(x) is not None  # noqa: E731
  for x in jax.tree.leaves(opt_state, is_leaf=is_node):
    fields = fields_of(x)
    if fields is None:
      continue
    getter = getattr(fields, field)
    value = None if getter is None else getter(x)
    if value is None and fields.inner is not None:
      value = find(getattr(x, fields.inner), field)
    if value is not None:
      return value
  return None


def trust_ratios(opt_state: PyTree) -> PyTree | None:
  """The last step's per-layer trust ratios kept in an optimizer state.

  Searches the state of any composition (``optax.chain``,
  ``optax.inject_hyperparams``, ``optax.MultiSteps``, ``optax.masked``, ...)
  for the first date_optax state that keeps ratios (the state types listed
  in ``date_optax._src.state_readers.STATE_FIELDS``). The state keeps them
  as one vector (:class:`date_optax.LayerRatios`); this reader unpacks it.

  Args:
    opt_state: an optimizer state.

  Returns:
    A pytree with the parameters' structure and float32 ratio leaves (shape
    ``()`` per leaf, or the shape of the leaf's layer axes), or ``None`` when
    the optimizer keeps no ratios.

  Examples:
    >>> import jax.numpy as jnp
    >>> import date_optax
    >>> params = {'w': jnp.array([3.0, 4.0])}
    >>> opt = date_optax.lamb(1e-3)
    >>> state = opt.init(params)
    >>> _, state = opt.update({'w': jnp.array([1.0, 0.0])}, state, params)
    >>> print(f"{date_optax.trust_ratios(state)['w']:.4f}")  # ||w|| / ||u||
    5.0000

  References:
    You et al., `Large Batch Optimization for Deep Learning: Training BERT in
    76 minutes <https://arxiv.org/abs/1904.00962>`_, 2020.
  """
  return layer_ratios_lib.as_tree(find(opt_state, "ratios"))


def recorded_ratios(opt_state: PyTree) -> Any:
  """The ratios as the state keeps them (a `LayerRatios` record), or None.

  What :func:`trust_ratios` unpacks; a jitted step returns this record (one
  array) rather than one array per layer.
  """
  return find(opt_state, "ratios")


def trust_ratio_bounds(opt_state: PyTree) -> tuple[jax.Array, jax.Array] | None:
  """The `(lower, upper)` ratio bounds the last step applied, from the state.

  Every date_optax state that keeps ratios also records the bounds it clipped
  them to, evaluated at that step (schedules included). An unbounded
  optimizer records ``lower = 0`` and ``upper = +inf``; before the first
  step the state holds the bounds at step 0. Compositions are searched as by
  :func:`trust_ratios`.

  Args:
    opt_state: an optimizer state.

  Returns:
    ``(lower, upper)``, two float32 scalars, or ``None`` when the optimizer
    keeps no ratios.

  Examples:
    >>> import jax.numpy as jnp
    >>> import date_optax
    >>> params = {'w': jnp.array([3.0, 4.0])}
    >>> opt = date_optax.bounded_lars(0.1, lower=0.01, upper=10.0)
    >>> _, state = opt.update({'w': jnp.ones(2)}, opt.init(params), params)
    >>> [f"{float(b):g}" for b in date_optax.trust_ratio_bounds(state)]
    ['0.01', '10']
    >>> lars_state = date_optax.lars(0.1).init(params)
    >>> [float(b) for b in date_optax.trust_ratio_bounds(lars_state)]
    [0.0, inf]

  References:
    You et al., `Large-Batch Training for LSTM and Beyond
    <https://arxiv.org/abs/1901.08256>`_, SC 2019 (bounded ratios, Algorithm 1).
  """
  return find(opt_state, "bounds")


def current_learning_rate(opt_state: PyTree) -> jax.Array | None:
  """The learning rate the optimizer applied at its last step, from its state.

  Found in the state of the optimizers (:func:`date_optax.lars`,
  :func:`date_optax.lamb`, :func:`date_optax.bounded_lars`, hence
  :func:`date_optax.date`), which record it each step (the schedule's value
  at that step; at step 0 before the first update), or as
  ``hyperparams['learning_rate']`` of an :func:`optax.inject_hyperparams`
  state. Compositions are searched as by :func:`trust_ratios`; the first
  match wins. This reader was called ``date_optax.learning_rate``, a name
  that also means the hyperparameter; that name still works for one release
  with a ``DeprecationWarning``.

  Args:
    opt_state: an optimizer state.

  Returns:
    A float32 scalar, or ``None`` when the state does not expose it.

  Examples:
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import date_optax
    >>> params = {'w': jnp.array([3.0, 4.0])}
    >>> opt = date_optax.lars(optax.linear_schedule(0.0, 1.0, 10))
    >>> state = opt.init(params)
    >>> for _ in range(3):
    ...   _, state = opt.update({'w': jnp.ones(2)}, state, params)
    >>> print(f"{date_optax.current_learning_rate(state):.2f}")  # applied at step 2
    0.20
    >>> sgd = optax.inject_hyperparams(optax.sgd)(learning_rate=0.5)
    >>> float(date_optax.current_learning_rate(sgd.init(params)))
    0.5

  References:
    You et al., `Large-Batch Training for LSTM and Beyond
    <https://arxiv.org/abs/1901.08256>`_, SC 2019 (the learning rate DATE
    follows, Algorithm 1).
  """
  return find(opt_state, "learning_rate")
