"""One of two processes that train with error feedback and save a checkpoint
(not collected by pytest; tests/test_residual_restore.py runs it).

    python tests/residual_worker.py --port P --process-id I --dir DIR --steps K

Two processes x 4 devices run the 8-replica ring step of the test for K
steps, each feeding its own rows, then save the state at step K in DIR:
each writes its own replicas' residual shards.
"""

from __future__ import annotations

from workers import worker_start

ARGS = worker_start(4, dir=str, steps=int)

import jax  # noqa: E402
import test_residual_restore as t  # noqa: E402

from date_optax.checkpoint import CheckpointManager  # noqa: E402


def main():
  args = ARGS
  step = t.make_step(8)
  state = step.init(t.zero_params())
  half = t.ROWS // 2
  rows = slice(args.process_id * half, (args.process_id + 1) * half)
  for s in range(args.steps):
    state, _ = step(state, {k: v[rows] for k, v in t.batch(s).items()})
  # Then incompressible residuals (`t.noise`) at step K + 1, whose files show
  # how many bytes each process wrote.
  leaves, treedef = jax.tree.flatten(state.grad_residual)
  noise = treedef.unflatten([jax.make_array_from_callback(
      x.shape, x.sharding, lambda index, shape=x.shape, seed=i: t.noise(shape, seed)[index])
      for i, x in enumerate(leaves)])
  with CheckpointManager(args.dir, async_save=False) as mngr:
    mngr.save(args.steps, state)
    mngr.save(args.steps + 1, state.replace(grad_residual=noise))
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
