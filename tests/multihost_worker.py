"""Entry point for one process of the multi-host test (not collected by pytest).

    python tests/multihost_worker.py --port P --process-id I --out FILE

Like any entry point it sets the device count and the CPU collectives itself;
library code never does.
"""

from __future__ import annotations

import argparse
import os

if __name__ == "__main__":  # the test also imports this file for its model
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
  os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

if __name__ == "__main__":
  jax.config.update("jax_cpu_collectives_implementation", "gloo")

import numpy as np  # noqa: E402
import parallel_model as pm  # noqa: E402

import date_optax  # noqa: E402
import date_optax.parallel as dp  # noqa: E402
from date_optax._src.parallel.distributed import fetch_replicated  # noqa: E402

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


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--port", type=int, required=True)
  parser.add_argument("--process-id", type=int, required=True)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  dp.initialize(f"127.0.0.1:{args.port}", NUM_PROCESSES, args.process_id,
                initialization_timeout=60)
  assert jax.process_count() == NUM_PROCESSES and jax.device_count() == 8
  params, losses, evals = train_and_evaluate(dp.torus_mesh(2, 4))
  flat = {"/".join(str(k.key) for k in path): v
          for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  np.savez(args.out, losses=losses, eval_loss=evals["loss"], eval_agree=evals["agree"],
           **flat)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
