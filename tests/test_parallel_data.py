"""Input pipeline, distributed evaluation and multi-host set-up helpers."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
import parallel_model as pm
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import date_optax.parallel as dp

# The hand-written order is deprecated (data_loader replaces it); its tests stay.
pytestmark = pytest.mark.filterwarnings(
    "ignore:date_optax.parallel.epoch_.* is deprecated:DeprecationWarning")

# --------------------------------------------------------------------------
# Input pipeline.
# --------------------------------------------------------------------------


@given(n=st.integers(1, 200), seed=st.integers(0, 2**31), epoch=st.integers(0, 1000))
def test_epoch_permutation_depends_only_on_seed_and_epoch(n, seed, epoch):
  p = dp.epoch_permutation(n, seed=seed, epoch=epoch)
  np.testing.assert_array_equal(np.sort(p), np.arange(n))
  np.testing.assert_array_equal(p, dp.epoch_permutation(n, seed=seed, epoch=epoch))


def test_epochs_and_seeds_change_the_order():
  a = dp.epoch_permutation(100, seed=0, epoch=0)
  assert not np.array_equal(a, dp.epoch_permutation(100, seed=0, epoch=1))
  assert not np.array_equal(a, dp.epoch_permutation(100, seed=1, epoch=0))


@pytest.mark.parametrize("process_count", [1, 2, 4])
def test_host_batches_assemble_the_same_global_batches(process_count):
  n, b = 103, 16
  data = {"x": np.arange(n) * 10, "y": np.arange(n, dtype=np.float32)[:, None]}
  order = dp.epoch_permutation(n, seed=3, epoch=2)
  per_host = [
      list(dp.epoch_batches(data, b, seed=3, epoch=2, process_index=p,
                            process_count=process_count))
      for p in range(process_count)
  ]
  assert all(len(h) == n // b for h in per_host)  # the last partial batch is dropped
  for j in range(n // b):
    x = np.concatenate([h[j]["x"] for h in per_host])
    y = np.concatenate([h[j]["y"] for h in per_host])
    np.testing.assert_array_equal(x, order[j * b:(j + 1) * b] * 10)
    np.testing.assert_array_equal(y[:, 0], order[j * b:(j + 1) * b])


class _RecordingArray:
  """An array-like that records which rows were read (like a memmap)."""

  def __init__(self, n):
    self.shape, self.ndim, self.rows = (n,), 1, []

  def __getitem__(self, idx):
    self.rows.extend(np.asarray(idx).tolist())
    return np.asarray(idx)


def test_a_host_reads_only_its_rows():
  data = _RecordingArray(64)
  batches = list(dp.epoch_batches(data, 16, seed=0, epoch=0, process_index=1,
                                  process_count=4))
  order = dp.epoch_permutation(64, seed=0, epoch=0)
  mine = np.concatenate([order[j * 16 + 4:j * 16 + 8] for j in range(4)])
  assert sorted(data.rows) == sorted(mine.tolist())
  np.testing.assert_array_equal(np.concatenate(batches), mine)


def test_no_shuffle_keeps_dataset_order():
  batches = list(dp.epoch_batches({"x": np.arange(8)}, 4, seed=0, epoch=5,
                                  shuffle=False, process_index=0, process_count=1))
  np.testing.assert_array_equal(batches[1]["x"], [4, 5, 6, 7])


def test_epoch_batches_validation():
  data = {"x": np.arange(10)}
  with pytest.raises(ValueError, match="divisible"):
    next(dp.epoch_batches(data, 5, seed=0, epoch=0, process_index=0, process_count=2))
  with pytest.raises(ValueError, match="process_index"):
    next(dp.epoch_batches(data, 4, seed=0, epoch=0, process_index=2, process_count=2))
  with pytest.raises(ValueError, match="leading"):
    next(dp.epoch_batches({"x": np.arange(10), "y": np.arange(9)}, 2, seed=0, epoch=0))
  with pytest.raises(ValueError, match="seed"):
    dp.epoch_permutation(10, seed=-1, epoch=0)
  # Fewer rows than one global batch: refused, naming both numbers.
  with pytest.raises(ValueError, match=r"has 10 rows.*global_batch_size=16"):
    next(dp.epoch_batches(data, 16, seed=0, epoch=0, process_index=0, process_count=1))


def test_epoch_helpers_are_deprecated():
  with pytest.warns(DeprecationWarning, match="data_loader"):
    dp.epoch_permutation(4, seed=0, epoch=0)
  with pytest.warns(DeprecationWarning, match="data_loader"):
    next(dp.epoch_batches({"x": np.arange(4)}, 2, seed=0, epoch=0, process_count=1,
                          process_index=0))


def _loader(n=40, batch=8, seed=3, p=0, count=1, ops=()):
  src = dp.ArraySource({"x": np.arange(n), "y": np.arange(n) * 10})
  return dp.data_loader(src, batch, seed=seed, process_index=p, process_count=count,
                        operations=ops)


def test_data_loader_shards_are_disjoint_and_cover_each_epoch():
  n, batch, count = 40, 8, 2
  per_epoch = (n // count) // (batch // count)  # 5 local batches per epoch
  seen = {}
  for p in range(count):
    it = iter(_loader(n, batch, p=p, count=count))
    epochs = [np.concatenate([next(it)["x"] for _ in range(per_epoch)]) for _ in range(2)]
    # Shard p is the p-th contiguous half (grain's even split), every record
    # once per epoch, in a new order each epoch.
    for e in epochs:
      np.testing.assert_array_equal(np.sort(e), np.arange(p * n // 2, (p + 1) * n // 2))
    assert not np.array_equal(epochs[0], epochs[1])
    seen[p] = epochs[0]
  assert not set(seen[0]) & set(seen[1])
  np.testing.assert_array_equal(np.sort(np.concatenate(list(seen.values()))), np.arange(n))
  # The rows stay together: y is 10 x.
  b = next(iter(_loader(n, batch)))
  np.testing.assert_array_equal(b["y"], 10 * b["x"])


class _Jitter:
  """A random augmentation: x + a draw from the record's generator."""

  def __new__(cls):
    import grain

    class Jitter(grain.transforms.RandomMap):
      def random_map(self, element, rng):
        return {**element, "noise": rng.standard_normal(3).astype(np.float32)}

    return Jitter()


def test_data_loader_resumes_exactly_with_augmentation_and_prefetch():
  ops = (_Jitter(),)
  reference = iter(_loader(ops=ops))
  want = [next(reference) for _ in range(9)]  # crosses the epoch boundary (5)
  mesh = dp.data_mesh()
  sharding = NamedSharding(mesh, P("data"))
  first = dp.prefetch_to_device(iter(_loader(ops=ops)), sharding, size=3)
  for j in range(4):
    np.testing.assert_array_equal(next(first)["noise"], want[j]["noise"])
  # The saved position is after the 4 returned batches, not the ones in flight.
  saved = dp.iterator_state(first)
  assert saved["process_count"] == 1 and len(saved["states"]) == 1
  resumed = dp.prefetch_to_device(iter(_loader(ops=ops)), sharding, size=3)
  dp.restore_iterator(resumed, saved)
  for j in range(4, 9):
    b = next(resumed)
    np.testing.assert_array_equal(b["x"], want[j]["x"])
    np.testing.assert_array_equal(b["noise"], want[j]["noise"])  # bit-exact
  # The augmentation differs between records and with the seed.
  assert not np.array_equal(want[0]["noise"][0], want[0]["noise"][1])
  other = next(iter(_loader(seed=4, ops=ops)))
  assert not np.array_equal(other["noise"], want[0]["noise"])


def test_data_loader_refuses_bad_input_and_foreign_states():
  with pytest.raises(ValueError, match=r"global_batch_size=9 does not divide over the 2"):
    _loader(batch=9, count=2)
  with pytest.raises(ValueError, match=r"has 10 records.*local batch of 8.*=16"):
    _loader(n=10, batch=16, count=2)
  with pytest.raises(ValueError, match="seed"):
    _loader(seed=-1)
  it = iter(_loader())
  next(it)
  saved = dp.iterator_state(it)
  with pytest.raises(ValueError, match=r"sampler.*seed=3.*seed=4.*different seed"):
    dp.restore_iterator(iter(_loader(seed=4)), saved)
  with pytest.raises(ValueError, match="saved by 2 processes.*this run has 1"):
    dp.restore_iterator(iter(_loader()), {**saved, "process_count": 2,
                                          "states": saved["states"] * 2})
  with pytest.raises(ValueError, match=r"shard_count=1.*shard_count=2"):
    dp.restore_iterator(iter(_loader(p=0, count=2)), saved)
  with pytest.raises(ValueError, match="missing or malformed"):
    dp.restore_iterator(iter(_loader()), {"epoch": 1})


def test_prefetch_keeps_batches_in_flight():
  mesh = dp.data_mesh()
  sharding = NamedSharding(mesh, P("data"))
  pulled = []

  def source():
    for i in range(5):
      pulled.append(i)
      yield {"x": np.full((8, 2), i, np.float32)}

  it = dp.prefetch_to_device(source(), sharding, size=3)
  first = next(it)
  assert len(pulled) == 3  # batches 1 and 2 are already on their way
  np.testing.assert_array_equal(first["x"], 0)
  assert first["x"].sharding.is_equivalent_to(sharding, 2)
  rest = list(it)
  assert [int(b["x"][0, 0]) for b in rest] == [1, 2, 3, 4]
  with pytest.raises(ValueError, match="size"):
    next(dp.prefetch_to_device(source(), sharding, size=0))


# --------------------------------------------------------------------------
# Distributed evaluation.
# --------------------------------------------------------------------------


def test_pad_batch():
  padded, mask = dp.pad_batch({"x": np.arange(6).reshape(3, 2)}, 4)
  np.testing.assert_array_equal(padded["x"], [[0, 1], [2, 3], [4, 5], [4, 5]])
  np.testing.assert_array_equal(mask, [True, True, True, False])
  with pytest.raises(ValueError, match="batch_size"):
    dp.pad_batch({"x": np.arange(3)}, 2)


@pytest.mark.parametrize("mesh_name, n", [("data", 37), ("torus", 37), ("data", 5),
                                          ("torus", 48)])
def test_evaluation_is_exact_for_any_set_size(mesh_name, n):
  mesh = dp.data_mesh() if mesh_name == "data" else dp.torus_mesh(2, 4)
  params = pm.init_params()
  data = pm.make_data(n, seed=4)
  got = dp.evaluate(pm.metric_fn, params, data, mesh, batch_size=16)
  # Single device, every example once, float64 mean.
  per_example = jax.tree.map(np.asarray, pm.metric_fn(params, data))
  assert set(got) == {"loss", "agree"}
  for name, values in per_example.items():
    np.testing.assert_allclose(got[name], np.mean(values.astype(np.float64)), rtol=1e-6)


def test_evaluation_validation():
  mesh = dp.data_mesh()
  data = pm.make_data(10)
  with pytest.raises(ValueError, match="divisible"):
    dp.evaluate(pm.metric_fn, pm.init_params(), data, mesh, batch_size=12)
  with pytest.raises(ValueError, match="one value per example"):
    dp.evaluate(lambda p, b: {"m": b["x"]}, pm.init_params(), data, mesh, batch_size=8)
  with pytest.raises(TypeError, match="dict"):
    dp.evaluate(lambda p, b: b["x"][:, 0], pm.init_params(), data, mesh, batch_size=8)


# --------------------------------------------------------------------------
# Multi-host helpers (the two-process run is in test_parallel_multihost.py).
# --------------------------------------------------------------------------


def test_initialize_single_process_is_a_no_op():
  assert dp.initialize(num_processes=1) is False
  assert jax.process_count() == 1
  with pytest.raises(ValueError, match="num_processes"):
    dp.initialize(num_processes=0)
  with pytest.raises(ValueError, match="process_id"):
    dp.initialize("127.0.0.1:1", num_processes=2, process_id=2)


def test_initialize_without_arguments_and_no_cluster_is_a_no_op():
  # A fresh process: jax.distributed.initialize must run before any JAX call.
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("SLURM_", "OMPI_", "TPU_", "MEGASCALE_", "JAX_COORD"))}
  code = ("import jax, date_optax.parallel as dp; "
          "print(dp.initialize(), jax.process_count())")
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, timeout=120, check=True)
  assert out.stdout.split()[-2:] == ["False", "1"]


def test_host_local_to_global_single_process():
  mesh = dp.torus_mesh(2, 4)
  sharding = NamedSharding(mesh, P(("x", "y")))
  x = np.arange(16.0).reshape(8, 2)
  g = dp.host_local_to_global({"x": x}, sharding)["x"]
  assert g.sharding.is_equivalent_to(sharding, 2)
  np.testing.assert_array_equal(g, x)
  # Shard k holds row k, in the mesh's row-major device order.
  for shard in g.addressable_shards:
    k = list(mesh.devices.flat).index(shard.device)
    np.testing.assert_array_equal(shard.data, x[k:k + 1])


def test_read_options_follow_the_source_and_are_checked():
  import grain

  src = dp.ArraySource({"x": np.arange(16)})
  assert dp.data_loader(src, 4, seed=0)._read_options.num_threads == 0

  class Rows:  # a source that does not say its records are in memory
    def __len__(self):
      return 16

    def __getitem__(self, i):
      return {"x": np.int64(i)}

  assert dp.data_loader(Rows(), 4, seed=0)._read_options == grain.ReadOptions()
  given = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)
  assert dp.data_loader(src, 4, seed=0, read_options=given)._read_options == given
  # The same batches with or without reader threads.
  ref = [b["x"].tolist() for _, b in zip(range(4), dp.data_loader(src, 4, seed=3))]
  got = [b["x"].tolist() for _, b in
         zip(range(4), dp.data_loader(src, 4, seed=3, read_options=given))]
  assert got == ref
  with pytest.raises(TypeError, match="read_options must be a grain.ReadOptions"):
    dp.data_loader(src, 4, seed=0, read_options={"num_threads": 0})
