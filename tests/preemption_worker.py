"""One process of the multi-host fault tests (not collected by pytest).

    python tests/preemption_worker.py --port P --process-id I --workdir DIR

Trains LAMB on the small parallel model over 2 processes x 4 CPU devices,
checkpointing every --save-every steps into DIR/ckpt, and stops cleanly
(saves, exits 0) when any process gets SIGTERM, through
`date_optax.checkpoint.PreemptionGuard`. Rerunning the same command resumes.
The batch of step s is a function of s alone, so a resumed run sees the data
the uninterrupted run saw. At the end each process writes DIR/out<I>.npz
with the final parameters and the losses of the steps it ran.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
from workers import use_the_runs_compile_cache  # noqa: E402

use_the_runs_compile_cache()

import numpy as np  # noqa: E402
import parallel_model as pm  # noqa: E402

import date_optax  # noqa: E402
import date_optax.parallel as dp  # noqa: E402
from date_optax.checkpoint import CheckpointManager, PreemptionGuard  # noqa: E402

NUM_PROCESSES = 2
GLOBAL_BATCH = 32


def _local(x) -> np.ndarray:
  """A replicated global array's value, from this process's own copy."""
  return np.asarray(x.addressable_shards[0].data)


def main() -> int:
  p = argparse.ArgumentParser()
  p.add_argument("--port", type=int, required=True)
  p.add_argument("--process-id", type=int, required=True)
  p.add_argument("--workdir", required=True)
  p.add_argument("--steps", type=int, default=16)
  p.add_argument("--save-every", type=int, default=4)
  p.add_argument("--step-sleep", type=float, default=0.0)
  p.add_argument("--heartbeat-timeout", type=int, default=10)
  args = p.parse_args()
  dp.initialize(f"127.0.0.1:{args.port}", NUM_PROCESSES, args.process_id,
                initialization_timeout=60,
                heartbeat_timeout_seconds=args.heartbeat_timeout)
  pid = jax.process_index()
  mesh = dp.data_mesh()
  step_fn = dp.make_train_step(pm.loss_fn, date_optax.lamb(1e-2, weight_decay=1e-2), mesh)
  state = step_fn.init(pm.init_params())
  rows = GLOBAL_BATCH // NUM_PROCESSES
  losses = []
  with CheckpointManager(os.path.join(args.workdir, "ckpt"), async_save=False,
                         max_to_keep=None) as ckpt, PreemptionGuard() as guard:
    start = 0
    if ckpt.latest_step() is not None:
      state, meta = ckpt.restore(state)
      start = meta["next_step"]
      print(f"process {pid}: resumed at step {start}", flush=True)
    for s in range(start, args.steps):
      data = pm.make_data(GLOBAL_BATCH, seed=1000 + s)
      local = jax.tree.map(lambda x: x[pid * rows:(pid + 1) * rows], data)
      state, metrics = step_fn(state, step_fn.shard_batch(local))
      losses.append(float(_local(metrics["loss"])))
      print(f"process {pid}: step {s + 1}", flush=True)
      done = s + 1
      if guard.should_stop(done):
        ckpt.save(done, state, metadata={"next_step": done}, force=True)
        ckpt.wait_until_finished()
        print(f"process {pid}: {guard.received} -> saved step {done}, exiting",
              flush=True)
        jax.distributed.shutdown()
        return 0
      if done % args.save_every == 0:
        ckpt.save(done, state, metadata={"next_step": done}, force=True)
      time.sleep(args.step_sleep)
  flat = {"/".join(str(k.key) for k in path): _local(v)
          for path, v in jax.tree_util.tree_flatten_with_path(state.params)[0]}
  np.savez(os.path.join(args.workdir, f"out{pid}.npz"), losses=np.array(losses),
           start=start, **flat)
  print(f"process {pid}: finished", flush=True)
  jax.distributed.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main())
