"""Type aliases of date_optax's signatures, declared once.

They document intent: JAX pytrees and masks cannot be typed precisely, so
most aliases are ``Any`` underneath, as in optax (``optax.Params``,
``optax.MaskOrFn``). Not re-exported: :data:`optax.ScalarOrSchedule` and
:data:`optax.Schedule` are public already, and an alias cannot carry a
docstring of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax

#: A pytree of arrays (parameters, gradients, optimizer or model state).
PyTree = Any

#: A float, a scalar array, or a schedule of the step (optax's alias).
ScalarOrSchedule = optax.ScalarOrSchedule

#: A function of the step returning a value (optax's alias).
Schedule = optax.Schedule

#: Which leaves a transform applies to: ``None`` (not given), a bool, a pytree
#: (or prefix) of bools like the parameters, or a callable ``params -> mask``.
MaskOrFn = None | bool | PyTree | Callable[[PyTree], PyTree]

#: Axes of a leaf that index separate layers (stacked ``nn.scan`` leaves):
#: ``None``, an int, a tuple of ints, a pytree of those like the parameters,
#: or a callable ``params -> that pytree``.
LayerAxes = None | int | tuple[int, ...] | PyTree | Callable[[PyTree], PyTree]

#: A dtype or ``None`` (keep the input's dtype).
DType = jax.typing.DTypeLike | None

#: A loss function ``loss_fn(params, batch, ...) -> loss`` or
#: ``(loss, aux)``; the train steps document the exact arguments they pass.
LossFn = Callable[..., Any]
