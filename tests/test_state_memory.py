"""Optimizer-state bytes equal optax's for the same optimizer (issue 22).

What is counted: the bytes of every array leaf of the state with at least one
dimension (moments, momentum), on the 161-leaf ResNet-50-shaped tree of
``test_update_structure``. Scalars (step counts, the applied bounds and
learning rate) are not counted, and neither are the per-layer trust ratios,
which are telemetry: one float32 per layer (per leaf, or per slice along
``layer_axes``), 644 bytes on ResNet-50's 161 leaves against its 102 MB of
momentum; their size is checked separately below.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_update_structure import SHAPES

import date_optax
from date_optax._src import state_readers

# The registered state types that keep per-layer ratios.
RATIO_STATES = tuple(cls for cls, fields in state_readers.STATE_FIELDS.items()
                     if fields.ratios is not None)

PARAMS = {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in SHAPES.items()}


def without_ratios(state):
  return jax.tree.map(lambda x: x._replace(ratios=None) if isinstance(x, RATIO_STATES)
                      else x, state, is_leaf=lambda x: isinstance(x, RATIO_STATES))


def state_bytes(state) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(without_ratios(state))
             if x.ndim >= 1)


def shapes_of(opt):
  return jax.eval_shape(opt.init, PARAMS)


PAIRS = {
    "lars/optax.lars": (lambda: date_optax.lars(0.1, weight_decay=1e-4,
                                                denominator="norm_of_sum"),
                        lambda: optax.lars(0.1, weight_decay=1e-4)),
    "lars(sum_of_norms)/optax.lars": (lambda: date_optax.lars(0.1, weight_decay=1e-4),
                                      lambda: optax.lars(0.1, weight_decay=1e-4)),
    "lamb/optax.lamb": (lambda: date_optax.lamb(1e-3, weight_decay=1e-2),
                        lambda: optax.lamb(1e-3, weight_decay=1e-2)),
    "bounded_lars(momentum)/optax.sgd": (lambda: date_optax.bounded_lars(0.1),
                                         lambda: optax.sgd(0.1, momentum=0.9)),
    "bounded_lars(adam)/optax.adam": (lambda: date_optax.bounded_lars(1e-3, base="adam"),
                                      lambda: optax.adam(1e-3)),
    "scale_by_trust_ratio(adam)/optax.scale_by_adam": (
        lambda: date_optax.scale_by_trust_ratio(inner=optax.scale_by_adam()),
        optax.scale_by_adam),
}


@pytest.mark.parametrize("name", list(PAIRS))
def test_state_bytes_equal_optax(name):
  ours, theirs = PAIRS[name]
  a, b = state_bytes(shapes_of(ours())), state_bytes(shapes_of(theirs()))
  n = sum(int(np.prod(s)) for s in SHAPES.values())
  assert b in (4 * n, 8 * n)  # the count sees optax's momentum / moments
  assert a == b, f"{name}: {a} bytes vs optax's {b}"


def test_ratio_telemetry_is_one_float_per_layer():
  state = shapes_of(date_optax.lars(0.1))
  ratios = jax.tree.leaves(date_optax.trust_ratios(state))
  assert sum(x.size * x.dtype.itemsize for x in ratios) == 4 * len(SHAPES)
  stacked = {"w": jax.ShapeDtypeStruct((6, 3, 4), jnp.float32)}
  state = jax.eval_shape(date_optax.lamb(1e-3, layer_axes=0).init, stacked)
  assert date_optax.trust_ratios(state)["w"].shape == (6,)
