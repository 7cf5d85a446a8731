"""Multi-host set-up: starting the distributed runtime, host-local -> global arrays."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from date_optax._src import validation


def _is_initialized() -> bool:
  fn = getattr(jax.distributed, "is_initialized", None)
  return bool(fn()) if fn is not None else False


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids: Any = None,
    initialization_timeout: int = 300,
    **kwargs: Any,
) -> bool:
  """Starts JAX's distributed runtime when there is more than one process.

  A thin wrapper of `jax.distributed.initialize` for entry points:

  * no arguments: on Cloud TPU (and Slurm, Open MPI) JAX detects the cluster
    and this initialises it; with no cluster detected it is a no-op
    (single-process run);
  * `num_processes=1` without a coordinator: a no-op;
  * otherwise the arguments are passed on.

  Calling it again after a successful start is a no-op. Like
  `jax.distributed.initialize` it must run before any JAX computation.
  Multi-process CPU runs (tests, debugging) also need CPU collectives, which
  the entry point selects before calling this, e.g.
  `jax.config.update("jax_cpu_collectives_implementation", "gloo")`.

  Args:
    coordinator_address: "host:port" of process 0.
    num_processes: number of processes, >= 1.
    process_id: this process's index in `[0, num_processes)`.
    local_device_ids: restricts this process to some local devices.
    initialization_timeout: seconds to wait for all processes to connect.
    **kwargs: passed to `jax.distributed.initialize`. The one to know for
      fault tolerance is `heartbeat_timeout_seconds` (JAX's default 100): when
      a process dies without a word (SIGKILL, a lost host), the others
      terminate with an error naming the dead task about that long after,
      instead of blocking in their next collective. The 2-process tests use
      10 s and see the survivor exit about 7 s after its peer was killed.

  Returns:
    True if the distributed runtime is running after the call, False for a
    single-process run.

  Examples:
    >>> import date_optax.parallel as dp
    >>> dp.initialize(num_processes=1)
    False

  References:
    JAX documentation, "Using JAX in multi-host and multi-process
    environments".
  """
  if _is_initialized():
    return True
  if num_processes is not None:
    num_processes = validation.check_int("num_processes", num_processes, low=1)
  if process_id is not None:
    high = None if num_processes is None else num_processes - 1
    process_id = validation.check_int("process_id", process_id, low=0, high=high)
  validation.check_int("initialization_timeout", initialization_timeout, low=1)
  if num_processes == 1 and coordinator_address is None:
    return False
  if coordinator_address is None and num_processes is None and process_id is None:
    try:
      jax.distributed.initialize(
          local_device_ids=local_device_ids,
          initialization_timeout=initialization_timeout,
          **kwargs,
      )
    except ValueError:
      # No cluster environment detected: a single-process run.
      return False
    return True
  jax.distributed.initialize(
      coordinator_address=coordinator_address,
      num_processes=num_processes,
      process_id=process_id,
      local_device_ids=local_device_ids,
      initialization_timeout=initialization_timeout,
      **kwargs,
  )
  return True


def host_local_to_global(tree: Any, sharding: NamedSharding) -> Any:
  """Assembles each host's rows of a batch into global arrays.

  Every process passes its own rows (the rows its devices hold under
  `sharding`, in process order); with one process the rows are the whole
  batch and this is `jax.device_put`.

  Args:
    tree: a pytree of host-local arrays (NumPy or JAX).
    sharding: the global `NamedSharding` of the batch, e.g.
      `NamedSharding(mesh, P("data"))`.

  Returns:
    A pytree of global `jax.Array` values whose leading dimension is
    `process_count` times the local one.

  Examples:
    >>> import numpy as np
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> import date_optax.parallel as dp
    >>> mesh = dp.data_mesh()
    >>> x = dp.host_local_to_global(np.ones((mesh.size, 2)),
    ...                             NamedSharding(mesh, P("data")))
    >>> x.shape == (mesh.size, 2), len(x.addressable_shards) == mesh.size
    (True, True)

  References:
    JAX documentation, `jax.make_array_from_process_local_data`.
  """

  def convert(x):
    if jax.process_count() == 1 and isinstance(x, jax.Array):
      return jax.device_put(x, sharding)
    return jax.make_array_from_process_local_data(sharding, np.asarray(x))

  return jax.tree.map(convert, tree)


def replicate_to_mesh(x: Any, mesh: jax.sharding.Mesh) -> jax.Array:
  """One array with the same value on every process -> replicated on `mesh`."""
  sharding = NamedSharding(mesh, P())
  if isinstance(x, jax.Array):
    if x.sharding.is_equivalent_to(sharding, x.ndim):
      return x
    if x.is_fully_addressable and jax.process_count() == 1:
      return jax.device_put(x, sharding)
  arr = np.asarray(x)
  return jax.make_array_from_callback(arr.shape, sharding, lambda idx: arr[idx])


def fetch_replicated(tree: Any) -> Any:
  """Host NumPy copies of replicated arrays, also when they span processes."""

  def get(x):
    if isinstance(x, jax.Array):
      return np.asarray(x.addressable_data(0))
    return np.asarray(x)

  return jax.tree.map(get, tree)
