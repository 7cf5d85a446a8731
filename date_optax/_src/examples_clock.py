"""An exact count of examples in two int32 words: the growing batch's clock.

JAX is 32-bit by default (no ``jax_enable_x64``), and an int32 count of
examples wraps after 2**31 (4.4T tokens at 2,048-token sequences). The
count is kept as ``E = high·2**31 + low`` with ``0 <= low < 2**31``:
:func:`add_examples` adds a batch with the carry and
:func:`divmod_examples` divides exactly in 32-bit arithmetic (the learning
rate's clock in iterations of a batch size).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from date_optax._src import validation

#: Largest number of examples the state counts exactly: two int32 words of
#: 31 bits each, ``E = high·2**31 + low`` (before the two-word count, 2**31 − 1).
MAX_EXAMPLES = 2**62 - 1

#: Largest batch (``start``, ``max_batch``, ``increment``): an int32.
MAX_BATCH = 2**31 - 1

# The base of the two-word count.
_WORD_BITS = 31
_WORD = 1 << _WORD_BITS
_LOW_MASK = _WORD - 1


def host_value(x: Any) -> np.ndarray:
  """A replicated array's value on this host (its first local copy)."""
  if isinstance(x, jax.Array):
    return np.asarray(x.addressable_data(0))
  return np.asarray(x)


def examples_words(examples: int) -> np.ndarray:
  """An exact count of examples as two int32 words ``[high, low]`` (host).

  ``examples = high·2**31 + low`` with ``0 <= low < 2**31``.

  Args:
    examples: a count in ``[0, MAX_EXAMPLES]``.

  Returns:
    A NumPy int32 array of shape ``(2,)``.

  Examples:
    >>> from date_optax._src.examples_clock import examples_words
    >>> examples_words(3 * 10**9).tolist()
    [1, 852516352]
  """
  e = validation.check_int("examples", examples, low=0, high=MAX_EXAMPLES)
  return np.asarray([e >> _WORD_BITS, e & _LOW_MASK], np.int32)


def examples_int(words: Any) -> int:
  """The Python int a two-word count (or a legacy int32 scalar) holds."""
  w = np.asarray(host_value(words)).astype(np.int64).reshape(-1)
  if w.size == 1:  # a count saved before the two-word layout
    return int(w[0])
  return (int(w[0]) << _WORD_BITS) + int(w[1])


def as_examples_words(examples: Any) -> jax.Array:
  """A count as int32 words ``[high, low]``: a scalar (< 2**31) is the low word.

  Scalars are what a checkpoint written before the two-word count holds, and
  what a hand-made :class:`BatchProgress` may give.
  """
  x = jnp.asarray(examples)
  if x.shape == (2,):
    return x.astype(jnp.int32)
  if x.shape != ():
    raise ValueError(
        f"examples must be a count: a scalar below 2**31 or int32 words "
        f"[high, low] of shape (2,), got shape {x.shape}."
    )
  return jnp.stack([jnp.zeros((), jnp.int32), x.astype(jnp.int32)])


def add_examples(words: jax.Array, batch_size: Any) -> jax.Array:
  """``words + batch_size`` with the carry (exact; `batch_size` < 2**31)."""
  words = as_examples_words(words)
  low = words[1].astype(jnp.uint32) + jnp.asarray(batch_size).astype(jnp.uint32)
  carry = (low >> _WORD_BITS).astype(jnp.int32)
  low = (low & jnp.uint32(_LOW_MASK)).astype(jnp.int32)
  return jnp.stack([words[0] + carry, low])


def divmod_examples(words: Any, divisor: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Exact ``divmod(E, divisor)`` of a two-word count, in 32-bit arithmetic.

  Long division of ``E = high·2**31 + low`` by a constant: ``high`` first,
  then its remainder followed by the bits of ``low``, a few bits at a time
  (as many as keep ``remainder·2**bits`` below ``2**32``).

  Args:
    words: int32 ``[high, low]`` (or a scalar count below 2**31).
    divisor: a Python int in ``[1, 2**31 − 1]``.

  Returns:
    ``(q_high, q_low, r)`` int32 with ``E = (q_high·2**31 + q_low)·divisor + r``,
    ``0 <= q_low < 2**31`` and ``0 <= r < divisor``.
  """
  d = validation.check_int("divisor", divisor, low=1, high=MAX_BATCH)
  words = as_examples_words(words)
  q_high, r = words[0] // d, (words[0] % d).astype(jnp.uint32)
  low = words[1].astype(jnp.uint32)
  width = 32 - d.bit_length()  # r < d, so r·2**width + digit < 2**32
  ud = jnp.uint32(d)
  q, pos = jnp.zeros((), jnp.uint32), _WORD_BITS
  while pos > 0:
    c = min(width, pos)
    pos -= c
    r = (r << c) | ((low >> pos) & jnp.uint32((1 << c) - 1))
    q = (q << c) | (r // ud)
    r = r % ud
  return q_high, q.astype(jnp.int32), r.astype(jnp.int32)


def sub_examples(words: Any, other: Any) -> jax.Array:
  """``words − other`` of two two-word counts (exact; ``other <= words``)."""
  words, other = as_examples_words(words), as_examples_words(other)
  low = words[1] - other[1]
  borrow = low < 0
  low = jnp.where(borrow, (low.astype(jnp.uint32) + jnp.uint32(_WORD)).astype(jnp.int32), low)
  return jnp.stack([words[0] - other[0] - borrow.astype(jnp.int32), low])
