"""Stopping a training loop cleanly when the machine is preempted.

Cloud TPU VMs get SIGTERM and a short grace period before a preemption or a
maintenance event. The loop should finish the step it is in, save, and exit
0, so that rerunning the same command resumes. On a multi-host slice every
host must save *the same* step, or the checkpoint is torn; JAX's preemption
sync point (part of `jax.distributed`) gives every process the same answer at
the same step, whichever host got the signal.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Sequence
from typing import Any

import jax

from date_optax._src import validation


def _distributed_client_running() -> bool:
  try:
    from jax._src import distributed  # noqa: PLC0415 - no public query

    return distributed.global_state.client is not None
  except (ImportError, AttributeError):  # pragma: no cover - other JAX versions
    return jax.process_count() > 1


class PreemptionGuard:
  """Turns SIGTERM/SIGINT into "stop after this step", on every host alike.

  Call :meth:`should_stop` once per step, with the step number, on every
  process. It returns False until a signal arrives; then it returns True at
  one step, the same step on every process, and the loop saves a checkpoint
  there and returns (exit status 0). Rerunning the same command resumes from
  that checkpoint.

  * **One process**: the guard installs Python handlers for `signals`
    (SIGTERM and SIGINT by default) that only set a flag; a second SIGINT
    while the flag is set raises `KeyboardInterrupt` as usual, for a user
    who does not want to wait.
  * **Several processes** (after `jax.distributed.initialize`): JAX's
    preemption service catches SIGTERM on whichever host gets it and
    `jax.experimental.multihost_utils.reached_preemption_sync_point` makes
    every process stop at the same step. SIGINT is forwarded to it as
    SIGTERM. Create the guard after the distributed runtime started.

  A dead host (killed, not signalled) cannot take part in any of this: the
  other processes notice it through `jax.distributed`'s heartbeats and
  terminate with an error after `heartbeat_timeout_seconds` (an argument of
  `date_optax.parallel.initialize`), so they never block forever.

  Signal handlers can only be installed from the main thread; the previous
  handlers come back on :meth:`close` (or at the end of a `with` block).

  Args:
    signals: the signals that request a stop (numbers or names such as
      "SIGTERM"); at least one.

  Examples:
    >>> import os, signal
    >>> from date_optax.checkpoint import PreemptionGuard
    >>> with PreemptionGuard() as guard:
    ...   stopped_at = None
    ...   for step in range(1, 100):
    ...     if step == 3:
    ...       os.kill(os.getpid(), signal.SIGTERM)  # the preemption notice
    ...     if guard.should_stop(step):
    ...       stopped_at = step  # save the checkpoint here, then return
    ...       break
    >>> stopped_at, guard.received
    (3, 'SIGTERM')

  References:
    JAX, `jax.experimental.multihost_utils.reached_preemption_sync_point`;
    Google Cloud, "Preemptible/Spot TPUs" (SIGTERM before preemption).
  """

  def __init__(self, signals: Sequence[Any] = ("SIGTERM", "SIGINT")):
    if isinstance(signals, (str, int)) or not isinstance(signals, Sequence):
      raise TypeError(f"signals must be a sequence of signals, got {signals!r}.")
    parsed = []
    for s in signals:
      try:
        parsed.append(signal.Signals[s] if isinstance(s, str) else signal.Signals(s))
      except (KeyError, ValueError):
        raise ValueError(
            f"signals: {s!r} is not a signal name or number (e.g. 'SIGTERM')."
        ) from None
    if not parsed:
      raise ValueError("signals must name at least one signal.")
    if threading.current_thread() is not threading.main_thread():
      raise ValueError("PreemptionGuard must be created in the main thread.")
    self._signals = tuple(dict.fromkeys(parsed))
    self._received: str | None = None
    self._multi = jax.process_count() > 1 and _distributed_client_running()
    self._saved: dict[signal.Signals, Any] = {}
    for s in self._signals:
      if self._multi and s == signal.SIGTERM:
        continue  # JAX's preemption notifier owns SIGTERM.
      self._saved[s] = signal.signal(s, self._handle)

  def _handle(self, signum: int, frame: Any) -> None:
    sig = signal.Signals(signum)
    if self._multi:
      # Hand it to JAX's preemption service, which tells the other hosts.
      self._received = sig.name
      os.kill(os.getpid(), signal.SIGTERM)
      return
    if self._received is not None and sig == signal.SIGINT:
      raise KeyboardInterrupt
    self._received = sig.name

  @property
  def received(self) -> str | None:
    """Name of the signal this process received ("SIGTERM", ...), or None."""
    return self._received

  def should_stop(self, step: int) -> bool:
    """Whether to save and stop after `step` (the same answer on every host).

    Args:
      step: the step just completed; must increase from call to call, and
        every process must call with the same steps.

    Returns:
      True once a stop was requested (on any host, in multi-process runs).
    """
    if isinstance(step, jax.Array) and step.ndim == 0:
      step = int(step)
    step = validation.check_int("step", step, low=0)
    if not self._multi:
      return self._received is not None
    from jax.experimental import multihost_utils  # noqa: PLC0415

    stop = bool(multihost_utils.reached_preemption_sync_point(step))
    if stop and self._received is None:
      self._received = "SIGTERM"  # on this host or another one
    return stop

  def close(self) -> None:
    """Restores the signal handlers that were there before."""
    for s, handler in self._saved.items():
      signal.signal(s, handler)
    self._saved = {}

  def __enter__(self) -> PreemptionGuard:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()
