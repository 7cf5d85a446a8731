"""A small deterministic data-parallel training run with checkpoint/resume.

Used by tests/test_checkpoint.py as a subprocess (it is killed with SIGKILL,
restarted, run on 8 or 4 emulated devices). Every run of this script with the
same `--workdir` resumes from the latest checkpoint there.

The train state is a NamedTuple (params, opt_state, step, rng) with a typed
PRNG key; the optimizer is `date_optax.lamb` with ratio bounds, so its state
carries a count and the per-layer trust ratios. Parameters are sharded over
a 1-D "data" mesh where a dimension divides the device count, the batch is
split over it. The data of each step is a pure function of the input-pipeline
position (epoch, index): a (seed, epoch) shuffle of a fixed synthetic set.

Usage:
  python checkpoint_train_script.py --workdir DIR --devices 8 --out final.npz
      [--steps 24] [--save-every 4] [--slow-after S --delay 0.5]
      [--restore-step K] [--dump-saves] [--dump-restored PATH]
      [--crash-in-save STEP --crash-at {create,finalize}]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def _parse():
  p = argparse.ArgumentParser()
  p.add_argument("--workdir", required=True)
  p.add_argument("--devices", type=int, default=8)
  p.add_argument("--out", default=None)
  p.add_argument("--steps", type=int, default=24)
  p.add_argument("--save-every", type=int, default=4)
  p.add_argument("--slow-after", type=int, default=None)
  p.add_argument("--delay", type=float, default=0.0)
  p.add_argument("--restore-step", type=int, default=None)
  p.add_argument("--dump-saves", action="store_true")
  p.add_argument("--dump-restored", default=None)
  p.add_argument("--crash-in-save", type=int, default=None)
  p.add_argument("--crash-at", choices=("create", "finalize"), default="finalize")
  return p.parse_args()


ARGS = _parse()
# Entry point: the device count is set here, before JAX starts a backend.
os.environ["XLA_FLAGS"] = (
    f"--xla_force_host_platform_device_count={ARGS.devices}"
)
os.environ["JAX_PLATFORMS"] = "cpu"

from typing import Any, NamedTuple  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from workers import use_the_runs_compile_cache  # noqa: E402

import date_optax  # noqa: E402
from date_optax.checkpoint import CheckpointManager  # noqa: E402
from date_optax.diagnostics import MetricWriter, trust_ratio_summary  # noqa: E402

use_the_runs_compile_cache()  # the runs a test compares compile one program

N_EXAMPLES, N_FEATURES, N_CLASSES, HIDDEN, BATCH = 512, 16, 4, 32, 64
SEED = 0
LOWER, UPPER = 0.01, 10.0


class TrainState(NamedTuple):
  params: Any
  opt_state: Any
  step: jax.Array
  rng: jax.Array


def dataset():
  rng = np.random.default_rng(1234)
  x = rng.normal(size=(N_EXAMPLES, N_FEATURES)).astype(np.float32)
  teacher = rng.normal(size=(N_FEATURES, N_CLASSES))
  y = np.argmax(x @ teacher, axis=1).astype(np.int32)
  return x, y


def batch_at(data, epoch: int, index: int):
  """The batch at input-pipeline position (epoch, index): a (seed, epoch) shuffle."""
  x, y = data
  perm = np.random.default_rng([SEED, epoch]).permutation(N_EXAMPLES)
  idx = perm[index * BATCH:(index + 1) * BATCH]
  return x[idx], y[idx]


def next_position(epoch: int, index: int):
  index += 1
  if index == N_EXAMPLES // BATCH:
    return epoch + 1, 0
  return epoch, index


def init_params(key):
  k1, k2 = jax.random.split(key)
  return {
      "dense0": {"kernel": jax.random.normal(k1, (N_FEATURES, HIDDEN)) / 4.0,
                 "bias": jnp.zeros(HIDDEN)},
      "dense1": {"kernel": jax.random.normal(k2, (HIDDEN, N_CLASSES)) / 6.0,
                 "bias": jnp.zeros(N_CLASSES)},
  }


def loss_fn(params, batch, rng):
  x, y = batch
  h = jax.nn.relu(x @ params["dense0"]["kernel"] + params["dense0"]["bias"])
  keep = jax.random.bernoulli(rng, 0.9, h.shape)  # dropout: uses the state's key
  h = jnp.where(keep, h / 0.9, 0.0)
  logits = h @ params["dense1"]["kernel"] + params["dense1"]["bias"]
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


OPT = date_optax.lamb(
    optax.linear_schedule(1e-3, 2e-2, 8), weight_decay=1e-3, lower=LOWER, upper=UPPER
)


def init_state():
  params = init_params(jax.random.key(SEED))
  return TrainState(params, OPT.init(params), jnp.int32(0), jax.random.key(SEED + 1))


def train_step(state: TrainState, batch):
  rng, dropout_rng = jax.random.split(state.rng)
  loss, grads = jax.value_and_grad(loss_fn)(state.params, batch, dropout_rng)
  updates, opt_state = OPT.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {"loss": loss, **trust_ratio_summary(
      date_optax.trust_ratios(opt_state), LOWER, UPPER, prefix="trust_ratio/")}
  return TrainState(params, opt_state, state.step + 1, rng), metrics


def shardings(mesh, abstract_state):
  """Shard a leaf's last axis over "data" when it divides; replicate the rest."""
  n = mesh.shape["data"]

  def rule(x):
    if x.ndim >= 2 and x.shape[-1] % n == 0:
      return NamedSharding(mesh, P(*([None] * (x.ndim - 1)), "data"))
    return NamedSharding(mesh, P())

  return jax.tree.map(rule, abstract_state)


def flat_state(state: TrainState, extra: dict | None = None) -> dict:
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      leaf = jax.random.key_data(leaf)
    out[jax.tree_util.keystr(path)] = np.asarray(jax.device_get(leaf))
  for k, v in (extra or {}).items():
    out[k] = np.asarray(v)
  return out


def install_crash(ckpt_dir: str, step: int, where: str):
  """SIGKILLs this process inside orbax's save of `step` (deterministically).

  "create": right after orbax made the temporary directory (no data yet).
  "finalize": all data and the commit marker written, before the rename.
  """
  from orbax.checkpoint._src.path import atomicity

  cls = atomicity.AtomicRenameTemporaryPath
  original = getattr(cls, where)
  target = os.path.join(ckpt_dir, str(step))

  async def crashing(self, *a, **kw):
    result = await original(self, *a, **kw) if where == "create" else None
    if os.fspath(self.get_final()) == target:
      print(f"crashing in {where} of step {step}", flush=True)
      os.kill(os.getpid(), signal.SIGKILL)
    if where == "finalize":
      result = await original(self, *a, **kw)
    return result

  setattr(cls, where, crashing)


def main():
  mesh = Mesh(np.array(jax.devices()), ("data",))
  abstract = jax.eval_shape(init_state)
  state_sharding = shardings(mesh, abstract)
  batch_sharding = NamedSharding(mesh, P("data"))
  replicated = NamedSharding(mesh, P())
  step_fn = jax.jit(
      train_step,
      in_shardings=(state_sharding, batch_sharding),
      out_shardings=(state_sharding, replicated),
      donate_argnums=0,
  )
  target = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      abstract, state_sharding,
  )

  ckpt_dir = os.path.join(ARGS.workdir, "ckpt")
  if ARGS.crash_in_save is not None:
    install_crash(os.path.abspath(ckpt_dir), ARGS.crash_in_save, ARGS.crash_at)
  mngr = CheckpointManager(ckpt_dir, max_to_keep=3, async_save=True)
  restore_step = ARGS.restore_step if ARGS.restore_step is not None else (
      mngr.latest_step())
  if restore_step is not None:
    state, meta = mngr.restore(target, step=restore_step)
    epoch, index = meta["epoch"], meta["index"]
    assert int(state.step) == restore_step, (int(state.step), restore_step)
    print(f"resumed from {restore_step} at epoch {epoch} index {index}", flush=True)
    if ARGS.dump_restored:
      np.savez(ARGS.dump_restored,
               **flat_state(state, {"epoch": epoch, "index": index}))
  else:
    state = jax.jit(init_state, out_shardings=state_sharding)()
    epoch, index = 0, 0

  data = dataset()
  with MetricWriter(os.path.join(ARGS.workdir, "logs"), tensorboard=False) as writer:
    for step in range(int(state.step) + 1, ARGS.steps + 1):
      batch = jax.device_put(batch_at(data, epoch, index), batch_sharding)
      state, metrics = step_fn(state, batch)
      epoch, index = next_position(epoch, index)
      writer.write_scalars(step, metrics)
      if step % ARGS.save_every == 0:
        meta = {"epoch": epoch, "index": index}
        if ARGS.dump_saves:
          np.savez(os.path.join(ARGS.workdir, f"dump_{step}.npz"),
                   **flat_state(state, meta))
        mngr.save(step, state, metadata=meta)
        mngr.wait_until_finished()
        print(f"saved {step}", flush=True)
      else:
        print(f"step {step}", flush=True)
      if ARGS.slow_after is not None and step >= ARGS.slow_after:
        time.sleep(ARGS.delay)
  mngr.close()
  if ARGS.out:
    np.savez(ARGS.out, **flat_state(state, {"epoch": epoch, "index": index}))
  print("done", flush=True)


if __name__ == "__main__":
  sys.exit(main())
