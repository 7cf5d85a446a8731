"""Entry point for one process of the multi-host test (not collected by pytest).

    python tests/multihost_worker.py --port P --process-id I --out FILE

Like any entry point it sets the device count and the CPU collectives itself;
library code never does.
"""

from __future__ import annotations

import argparse
import functools
import os

if __name__ == "__main__":  # the test also imports this file for its model
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
  os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

if __name__ == "__main__":
  jax.config.update("jax_cpu_collectives_implementation", "gloo")

import numpy as np  # noqa: E402
import optax  # noqa: E402
import parallel_model as pm  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import date_optax  # noqa: E402
import date_optax.parallel as dp  # noqa: E402
from date_optax._src.parallel.layout.distributed import fetch_replicated  # noqa: E402

NUM_PROCESSES = 2
GLOBAL_BATCH = 32
STEPS = 3


def train_and_evaluate(mesh):
  """3 steps of LAMB with the torus all-reduce, then a padded evaluation."""
  step = dp.make_train_step(
      pm.loss_fn, date_optax.lamb(1e-2, weight_decay=1e-2), mesh, grad_reduce="torus"
  )
  state = step.init(pm.init_params())
  losses = []
  data = pm.make_data(GLOBAL_BATCH * STEPS)
  batches = dp.epoch_batches(data, GLOBAL_BATCH, seed=0, epoch=0)
  for batch in dp.prefetch_to_device(batches, step.batch_sharding):
    state, metrics = step(state, batch)
    losses.append(float(fetch_replicated(metrics["loss"])))
  evals = dp.evaluate(pm.metric_fn, state.params, pm.make_data(37, seed=2), mesh,
                      batch_size=16)
  return fetch_replicated(state.params), np.array(losses), evals


#: The growing batch: adaptive from 16 to 32 (its chunk, 16, feeds the steps):
#: 16 for three steps, then 32, decided after step 2 and applied at step 3 (lag
#: 1), so the run saved after step 3 resumes with the growth decided, not applied.
GROW_STEPS = 6
GROW_INTERRUPT = 3


def growing_schedule():
  return date_optax.BatchSchedule.adaptive(16, max_batch=32, min_steps=3, lag=1,
                                           threshold=0.05, hold_examples=16)


def _build_growing_step(mesh):
  return dp.make_train_step(pm.loss_fn, date_optax.lamb(1e-2), mesh,
                            batch_schedule=growing_schedule(), grad_stats=True)


@functools.cache
def growing_step(mesh):
  """The growing runs' step, built once per mesh."""
  return _build_growing_step(mesh)


def train_growing(mesh, workdir=None, on_device=False):
  """An adaptive batch fed by data_loader; with `workdir`, checkpointed at step
  GROW_INTERRUPT and resumed there by a new step, loader and state; with
  `on_device`, its chunks prefetched to the devices and joined there."""
  from date_optax.checkpoint import CheckpointManager  # noqa: PLC0415

  sched = growing_schedule()
  src = dp.ArraySource(pm.make_data(1024))

  step = growing_step(mesh)  # the three runs share its programs

  def loader():
    it = iter(dp.data_loader(src, sched.chunk_size, seed=0))
    if on_device:
      it = dp.prefetch_to_device(it, step.batch_sharding)
    return dp.GrowingBatches(it, sched.chunk_size)

  batches = loader()
  state = step.init(pm.init_params())
  sizes, losses = [], []
  for i in range(GROW_STEPS):
    if workdir is not None and i == GROW_INTERRUPT:
      with CheckpointManager(workdir, async_save=False) as mngr:
        mngr.save(i, state, metadata={"data": dp.iterator_state(batches)})
        step = _build_growing_step(mesh)  # a new step resumes
        state, meta = mngr.restore(step.init(pm.init_params()))
      batches = loader()
      dp.restore_iterator(batches, meta["data"])
    state, metrics = step(state, batches.take(step.next_batch_size(state)))
    sizes.append(int(fetch_replicated(metrics["batch_size"])))
    losses.append(float(fetch_replicated(metrics["loss"])))
  return fetch_replicated(state.params), np.array(sizes), np.array(losses)


#: The low-precision payloads the two processes run (APS on, the default):
#: (grad_reduce, comm_dtype, rounding).
# (algorithm, payload, rounding, aps): aps None is the default scaling (block
# scales of 32 over ring and torus), True the per-layer APS shift (its pmax).
LOW_PRECISION = (("torus", "int8", "nearest", None), ("ring", "float8_e4m3fn", "nearest", True),
                 ("torus", "int4", "stochastic", None))


def low_precision_name(grad_reduce, comm_dtype, rounding, aps=None):
  sr = "_stochastic" if rounding == "stochastic" else ""
  return f"{grad_reduce}_{comm_dtype}{sr}" + ("_aps" if aps else "")


def train_low_precision(mesh, grad_reduce, comm_dtype, rounding="nearest", aps=None):
  """3 steps of SGD with the gradient payload in `comm_dtype` (`aps` None:
  the default block scales). SGD: what crosses the processes is the gradient
  sync, and LAMB's program (its trust ratios, checked across processes by
  `train_and_evaluate` and `train_sharded`) would double each compilation."""
  step = dp.make_train_step(
      pm.loss_fn, optax.sgd(0.1), mesh,
      grad_reduce=grad_reduce, comm_dtype=comm_dtype, aps=aps,
      rounding=rounding if comm_dtype is not None else "nearest",
  )
  state = step.init(pm.init_params())
  losses = []
  data = pm.make_data(GLOBAL_BATCH * STEPS)
  for batch in dp.epoch_batches(data, GLOBAL_BATCH, seed=0, epoch=0):
    state, metrics = step(state, step.shard_batch(batch))
    losses.append(float(fetch_replicated(metrics["loss"])))
  return fetch_replicated(state.params), np.array(losses)


# Megatron-style tensor parallelism over the "model" axis: hidden columns,
# then output rows.
TENSOR_PARALLEL = [
    (r"hidden/kernel", P(None, "model")),
    (r"hidden/bias", P("model")),
    (r"out/kernel", P("model", None)),
]


def cross_process_mesh():
  """A (4, 2) ("data", "model") mesh whose "model" pairs span the processes.

  Device (i, j) is the i-th device of process j (with one process of 8
  devices: device i + 4j), so every parameter split over "model" has one half
  in each process, and every process holds one replica of each data shard.
  """
  devices = np.array(jax.devices()).reshape(NUM_PROCESSES, 4).T
  return jax.sharding.Mesh(devices, ("data", "model"))


def train_sharded(mesh):
  """3 steps of LAMB with the parameters split over the "model" axis.

  The batches are built as global arrays from the full data, which every
  process has: under this mesh each process holds a copy of every row.
  """
  step = dp.make_train_step(pm.loss_fn, date_optax.lamb(1e-2, weight_decay=1e-2),
                            mesh, param_sharding=TENSOR_PARALLEL)
  state = step.init(pm.init_params())
  sharding = NamedSharding(mesh, P("data"))
  data = pm.make_data(GLOBAL_BATCH * STEPS)
  losses = []
  for j in range(STEPS):
    rows = {k: v[j * GLOBAL_BATCH : (j + 1) * GLOBAL_BATCH] for k, v in data.items()}
    batch = {k: jax.make_array_from_callback(v.shape, sharding, lambda i, v=v: v[i])
             for k, v in rows.items()}
    state, metrics = step(state, batch)
    losses.append(float(fetch_replicated(metrics["loss"])))
  kernel = state.params["hidden"]["kernel"]
  # The columns of the hidden kernel that this process holds.
  local_cols = sorted({c for s in kernel.addressable_shards
                       for c in range(kernel.shape[1])[s.index[1]]})
  params = jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(
      x, tiled=True)), state.params)
  return params, np.array(losses), {"spec": kernel.sharding.spec,
                                    "local_cols": np.array(local_cols)}


def _flat(params, prefix=""):
  return {prefix + "/".join(str(k.key) for k in path): v
          for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--port", type=int, required=True)
  parser.add_argument("--process-id", type=int, required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--low-precision", default=",".join(low_precision_name(*c)
                                                          for c in LOW_PRECISION),
                      help="the LOW_PRECISION runs to make, by name, comma-separated")
  args = parser.parse_args()
  wanted = set(filter(None, args.low_precision.split(",")))
  # A compilation cache: the step built again to resume the growing run reads
  # its programs back instead of compiling them (in process 0, which alone
  # writes the cache).
  cache = os.path.join(os.path.dirname(os.path.abspath(args.out)), "jax_cache")
  jax.config.update("jax_compilation_cache_dir", cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  dp.initialize(f"127.0.0.1:{args.port}", NUM_PROCESSES, args.process_id,
                initialization_timeout=60)
  assert jax.process_count() == NUM_PROCESSES and jax.device_count() == 8
  params, losses, evals = train_and_evaluate(dp.torus_mesh(2, 4))
  sharded, sharded_losses, layout = train_sharded(cross_process_mesh())
  assert layout["spec"] == P(None, "model"), layout["spec"]
  low = {}
  for alg, fmt, rounding, aps in LOW_PRECISION:
    name = low_precision_name(alg, fmt, rounding, aps)
    if name not in wanted:
      continue
    lp_params, lp_losses = train_low_precision(dp.torus_mesh(2, 4), alg, fmt, rounding, aps)
    low[f"{name}_losses"] = lp_losses
    low.update(_flat(lp_params, f"{name}/"))
  grow_params, grow_sizes, grow_losses = train_growing(dp.torus_mesh(2, 4))
  ckpt = os.path.join(os.path.dirname(os.path.abspath(args.out)), "growing_ckpt")
  res_params, res_sizes, res_losses = train_growing(dp.torus_mesh(2, 4), ckpt)
  _, dev_sizes, dev_losses = train_growing(dp.torus_mesh(2, 4), on_device=True)
  low.update(grow_sizes=grow_sizes, grow_losses=grow_losses, resumed_sizes=res_sizes,
             resumed_losses=res_losses, device_sizes=dev_sizes, device_losses=dev_losses)
  low.update(_flat(grow_params, "grow/"))
  low.update(_flat(res_params, "resumed/"))
  np.savez(args.out, **low, losses=losses, eval_loss=evals["loss"], eval_agree=evals["agree"],
           sharded_losses=sharded_losses, sharded_local_cols=layout["local_cols"],
           **_flat(params), **_flat(sharded, "sharded/"))
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
