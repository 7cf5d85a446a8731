"""Two real processes (gloo CPU collectives) match one process with 8 devices."""

from __future__ import annotations

import functools
import os

import jax
import numpy as np
import parallel_model as pm
import pytest
from workers import WorkerPair, once_per_run

import date_optax
import date_optax.parallel as dp

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 240


def _run_workers(tmp_path, low_precision) -> None:
  """Both processes' outputs written to `tmp_path`/out{0,1}.npz."""
  args = ["--low-precision", ",".join(low_precision)]
  pair = WorkerPair(os.path.join(HERE, "multihost_worker.py"),
                    lambda i: ["--out", str(tmp_path / f"out{i}.npz"), *args],
                    [tmp_path / f"log{i}.txt" for i in range(2)], cwd=HERE,
                    timeout=TIMEOUT_S, what="multi-host workers")
  for i, rc in enumerate(pair.wait()):
    if rc != 0:
      pytest.fail(f"worker {i} exited with {rc}:\n{pair.log(i)[-3000:]}")


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory, request):
  """The two processes' outputs; they run every training in one start-up,
  the low-precision ones only where this run selected their test, once per
  test run (xdist's workers share them)."""
  import multihost_worker as worker

  low_precision = sorted({
      worker.low_precision_name(*(item.callspec.params[k]
                                  for k in ("grad_reduce", "comm_dtype", "rounding", "aps")))
      for item in request.session.items
      if item.originalname == "test_low_precision_payload_two_processes_match_one_process"})
  folder = once_per_run(tmp_path_factory, "multihost-" + "-".join(low_precision),
                        lambda path: _run_workers(path, low_precision))
  return [dict(np.load(folder / f"out{i}.npz")) for i in range(2)]


def test_two_processes_match_one_process_with_8_devices(worker_results):
  import multihost_worker as worker  # the same training code, in this process

  assert jax.device_count() == 8 and jax.process_count() == 1
  params, losses, evals = worker.train_and_evaluate(dp.torus_mesh(2, 4))
  results = worker_results
  for res in results:  # both processes hold the same replicated result
    np.testing.assert_allclose(res["losses"], losses, rtol=1e-6)
    for layer in ("hidden", "out"):
      for name in ("kernel", "bias"):
        np.testing.assert_allclose(
            res[f"{layer}/{name}"], params[layer][name], rtol=1e-6, atol=1e-7
        )
    np.testing.assert_allclose(res["eval_loss"], evals["loss"], rtol=1e-6)
    np.testing.assert_allclose(res["eval_agree"], evals["agree"], rtol=1e-6)
  # The run trained: the parameters moved away from their initial values.
  assert not np.allclose(params["out"]["kernel"], pm.init_params()["out"]["kernel"])


def test_params_sharded_across_two_processes_match_one_process(worker_results):
  """A (4, 2) ("data", "model") mesh whose "model" axis spans the processes."""
  import multihost_worker as worker

  mesh = worker.cross_process_mesh()
  assert [d.id for d in mesh.devices[:, 1]] == [4, 5, 6, 7]  # the 2nd process's
  params, losses, layout = worker.train_sharded(mesh)
  assert layout["spec"] == jax.sharding.PartitionSpec(None, "model")
  np.testing.assert_array_equal(layout["local_cols"], np.arange(16))  # all local
  # Each process held one half of the hidden columns: the halves differ and
  # together make the whole kernel.
  cols = [res["sharded_local_cols"] for res in worker_results]
  np.testing.assert_array_equal(np.sort(np.concatenate(cols)), np.arange(16))
  assert len(cols[0]) == len(cols[1]) == 8
  for res in worker_results:
    np.testing.assert_allclose(res["sharded_losses"], losses, rtol=1e-6)
    for layer in ("hidden", "out"):
      for name in ("kernel", "bias"):
        np.testing.assert_allclose(res[f"sharded/{layer}/{name}"], params[layer][name],
                                   rtol=1e-6, atol=1e-7)
  # ... and the sharded run is plain data parallelism on one device's copy of
  # the parameters: the same steps with unsplit parameters on a data mesh.
  step = dp.make_train_step(pm.loss_fn, date_optax.lamb(1e-2, weight_decay=1e-2),
                            dp.data_mesh(), donate=False)
  state = step.init(pm.init_params())
  data = pm.make_data(worker.GLOBAL_BATCH * worker.STEPS)
  for j in range(worker.STEPS):
    rows = slice(j * worker.GLOBAL_BATCH, (j + 1) * worker.GLOBAL_BATCH)
    state, metrics = step(state, {k: v[rows] for k, v in data.items()})
    np.testing.assert_allclose(losses[j], metrics["loss"], rtol=1e-5)
  for layer in ("hidden", "out"):
    for name in ("kernel", "bias"):
      np.testing.assert_allclose(params[layer][name], state.params[layer][name],
                                 rtol=1e-5, atol=1e-6)
  assert not np.allclose(params["hidden"]["kernel"], pm.init_params()["hidden"]["kernel"])


@functools.cache
def _float32_run():
  """The float32 run in this process, once for the module (the torus: float32
  ring and torus sums differ in their rounding only)."""
  import multihost_worker as worker

  return worker.train_low_precision(dp.torus_mesh(2, 4), "torus", None)


@pytest.mark.parametrize("grad_reduce,comm_dtype,rounding,aps", [
    # The default run keeps int4 with stochastic rounding over the torus (the
    # keys that must not depend on the process; block scales); int8 and
    # float8 with APS over the ring are the same sync code with other formats
    # (test_low_precision and test_error_feedback run each in one process).
    pytest.param("torus", "int8", "nearest", None, marks=pytest.mark.slow),
    pytest.param("ring", "float8_e4m3fn", "nearest", True, marks=pytest.mark.slow),
    ("torus", "int4", "stochastic", None),
])
def test_low_precision_payload_two_processes_match_one_process(
    worker_results, grad_reduce, comm_dtype, rounding, aps
):
  """Block scales (the default), APS and the rounded hops give the same result
  when the ring spans processes; stochastic rounding's keys depend on (step,
  replica) only, not on the process."""
  import multihost_worker as worker

  assert (grad_reduce, comm_dtype, rounding, aps) in worker.LOW_PRECISION
  params, losses = worker.train_low_precision(dp.torus_mesh(2, 4), grad_reduce,
                                              comm_dtype, rounding, aps)
  exact, exact_losses = _float32_run()
  key = worker.low_precision_name(grad_reduce, comm_dtype, rounding, aps)
  for res in worker_results:
    np.testing.assert_allclose(res[f"{key}_losses"], losses, rtol=1e-6)
    for layer in ("hidden", "out"):
      for name in ("kernel", "bias"):
        np.testing.assert_allclose(
            res[f"{key}/{layer}/{name}"], params[layer][name], rtol=1e-6, atol=1e-7,
        )
  # The low-precision run trained, and differs from the float32 one only a little.
  np.testing.assert_allclose(losses, exact_losses, rtol=0.05)
  assert not np.allclose(params["out"]["kernel"], pm.init_params()["out"]["kernel"])


def test_growing_batch_two_processes_resume_exactly(worker_results):
  """An adaptive batch over two processes: both take the same sizes, and a run
  checkpointed and resumed mid-growth (new step, state and data loader) sees
  the same batches as the uninterrupted one, bit for bit."""
  import multihost_worker as worker

  sizes = [res["grow_sizes"] for res in worker_results]
  np.testing.assert_array_equal(sizes[0], sizes[1])
  # It grew across processes, at the step the resumed run starts with: the
  # checkpoint holds a growth decided and not yet applied.
  cut = worker.GROW_INTERRUPT
  assert sizes[0][cut - 1] < sizes[0][cut] == sizes[0][-1], sizes[0]
  for res in worker_results:
    np.testing.assert_array_equal(res["resumed_sizes"], res["grow_sizes"])
    np.testing.assert_array_equal(res["resumed_losses"], res["grow_losses"])
    # Chunks prefetched to each process's devices and joined there: the same
    # examples per step (rows assigned to other replicas), the same run.
    np.testing.assert_array_equal(res["device_sizes"], res["grow_sizes"])
    np.testing.assert_allclose(res["device_losses"], res["grow_losses"], rtol=1e-5)
    for layer in ("hidden", "out"):
      for name in ("kernel", "bias"):
        np.testing.assert_array_equal(res[f"resumed/{layer}/{name}"],
                                      res[f"grow/{layer}/{name}"])
