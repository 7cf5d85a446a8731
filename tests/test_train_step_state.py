"""Train steps with model state, dropout keys and gradient accumulation.

The reference is a plain single-device loop written here from the documented
rules: replica r holds rows [r*B/8, (r+1)*B/8) of the global batch, splits
them into k contiguous microbatches, threads the model state through them
with key fold_in(fold_in(fold_in(rng, step), r), j); gradients are the mean
over all microbatches of all replicas; float model-state leaves are averaged
over replicas and integer leaves taken from replica 0.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import parallel_model as pm
import pytest
from jax.sharding import PartitionSpec as P

import date_optax
import date_optax.parallel as dp

B, N, STEPS = 32, 8, 3
SEED = 5
OPTIMIZERS = {
    "lars": lambda: date_optax.lars(0.5, weight_decay=1e-3),
    "lamb": lambda: date_optax.lamb(1e-2, weight_decay=1e-2),
    "bounded_lars": lambda: date_optax.bounded_lars(0.05, base="momentum"),
}
BATCHES = [
    jax.tree.map(lambda x, i=i: x[i * B:(i + 1) * B], pm.make_data(B * STEPS, seed=3))
    for i in range(STEPS)
]


def init_model_state():
  return {"mean": np.zeros((pm.IN,), np.float32), "count": np.int32(0)}


def bn_dropout_loss(params, batch, model_state, rng):
  """Centre with the batch mean (batch-norm-like state), then dropout."""
  x = batch["x"]
  mu = jnp.mean(x, axis=0)
  keep = jax.random.bernoulli(rng, 0.7, x.shape)
  h = jnp.where(keep, (x - mu) / 0.7, 0.0)
  loss = pm.loss_fn(params, {"x": h, "y": batch["y"]})
  new = {"mean": 0.9 * model_state["mean"] + 0.1 * mu,
         "count": model_state["count"] + 1}
  return loss, new


# The reference's pieces, each one jitted program (run op by op they were
# most of this file's time): a microbatch's gradient, and the update.
_grad_with_state = jax.jit(jax.value_and_grad(bn_dropout_loss, has_aux=True))
_grad = jax.jit(jax.grad(pm.loss_fn))


@functools.cache  # shared by the tests that compare with the same run
def reference(opt_name, k, steps=STEPS, with_state=True):
  opt = OPTIMIZERS[opt_name]()
  update = jax.jit(opt.update)
  params = jax.tree.map(jnp.asarray, pm.init_params())
  opt_state = opt.init(params)
  ms = jax.tree.map(jnp.asarray, init_model_state())
  base = jax.random.key_data(jax.random.key(SEED))
  keys_seen = set()
  for s, batch in enumerate(BATCHES[:steps]):
    grads, states = [], []
    for r in range(N):
      rows = jax.tree.map(lambda x, r=r: x[r * B // N:(r + 1) * B // N], batch)
      state_r = ms
      for j in range(k):
        mb = jax.tree.map(lambda x, j=j: x[j * B // N // k:(j + 1) * B // N // k], rows)
        key = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(base, s), r), j)
        keys_seen.add(tuple(np.asarray(key).tolist()))
        if with_state:
          (_, state_r), g = _grad_with_state(params, mb, state_r, key)
        else:
          g = _grad(params, mb)
        grads.append(g)
      states.append(state_r)
    g = jax.tree.map(lambda *xs: sum(np.asarray(x, np.float64) for x in xs) / len(xs),
                     *grads)
    g = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g)
    ms = {"mean": jnp.mean(jnp.stack([st["mean"] for st in states]), axis=0),
          "count": states[0]["count"]}
    updates, opt_state = update(g, opt_state, params)
    params = optax.apply_updates(params, updates)
  assert len(keys_seen) == N * k * steps  # every microbatch of every replica differs
  return params, opt_state, ms


def assert_close(a, b, rtol=2e-5, atol=1e-6):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def run_step(step, steps=STEPS):
  state = step.init(pm.init_params(), model_state=init_model_state(), rng=SEED)
  for batch in BATCHES[:steps]:
    state, metrics = step(state, batch)
  return state, metrics


@pytest.mark.parametrize("kind, opt_name, k", [
    ("jit", "lamb", 1), ("jit", "lars", 2), ("jit_shard_update", "bounded_lars", 4),
    ("pmap", "lamb", 2),
])
def test_model_state_and_keys_match_single_device_reference(kind, opt_name, k):
  opt = OPTIMIZERS[opt_name]()
  if kind == "pmap":
    step = dp.make_pmap_train_step(bn_dropout_loss, opt, microbatches=k, donate=False)
  else:
    step = dp.make_train_step(bn_dropout_loss, opt, dp.data_mesh(), microbatches=k,
                              shard_update=kind == "jit_shard_update", donate=False)
  state, metrics = run_step(step)
  if kind == "pmap":
    state = jax.tree.map(lambda x: x[0], state)
  ref_params, ref_opt, ref_ms = reference(opt_name, k)
  assert_close(state.params, ref_params)
  assert_close(state.opt_state, ref_opt)
  assert_close(state.model_state, ref_ms)
  assert int(state.model_state["count"]) == STEPS * k  # from replica 0, not summed
  assert int(state.step) == STEPS
  assert not np.allclose(state.model_state["mean"], 0.0)


@pytest.mark.parametrize("opt_name", ["lars", "lamb"])
def test_microbatches_equal_one_big_batch(opt_name):
  """Without state or dropout, accumulation over k microbatches == k=1."""
  results = []
  for k in (1, 4):
    step = dp.make_train_step(pm.loss_fn, OPTIMIZERS[opt_name](), dp.data_mesh(),
                              microbatches=k, donate=False)
    state = step.init(pm.init_params())
    for batch in BATCHES:
      state, metrics = step(state, batch)
    results.append((state, metrics))
  (s1, m1), (s4, m4) = results
  assert_close(s4.params, s1.params, rtol=1e-5, atol=1e-6)
  assert_close(s4.opt_state, s1.opt_state, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(m4["loss"], m1["loss"], rtol=1e-6)
  np.testing.assert_allclose(m4["grad_norm"], m1["grad_norm"], rtol=1e-5)
  ref_params, _, _ = reference(opt_name, 4, with_state=False)
  assert_close(s4.params, ref_params)


def test_aux_over_microbatches():
  def loss_fn(params, batch):
    loss = pm.loss_fn(params, batch)
    return loss, {"mse": loss, "rows": jnp.int32(batch["x"].shape[0])}

  step = dp.make_train_step(loss_fn, optax.sgd(0.1), dp.data_mesh(), has_aux=True,
                            microbatches=2)
  _, metrics = step(step.init(pm.init_params()), BATCHES[0])
  assert int(metrics["aux"]["rows"]) == B  # summed over microbatches and replicas
  np.testing.assert_allclose(metrics["aux"]["mse"], metrics["loss"], rtol=1e-6)


def test_resumed_run_draws_the_same_keys(tmp_path):
  from date_optax.checkpoint import CheckpointManager

  step = dp.make_train_step(bn_dropout_loss, OPTIMIZERS["lamb"](), dp.data_mesh(),
                            microbatches=2, donate=False)
  straight, _ = run_step(step)
  state = step.init(pm.init_params(), model_state=init_model_state(), rng=SEED)
  state, _ = step(state, BATCHES[0])
  with CheckpointManager(str(tmp_path)) as mgr:
    mgr.save(1, state, force=True)
    mgr.wait_until_finished()
    template = step.init(pm.init_params(), model_state=init_model_state(), rng=0)
    restored, _ = mgr.restore(template, step=1)
  for batch in BATCHES[1:]:
    restored, _ = step(restored, batch)
  jax.tree.map(np.testing.assert_array_equal, restored, straight)
  # A different seed draws different masks.
  other = step.init(pm.init_params(), model_state=init_model_state(), rng=SEED + 1)
  other, _ = step(other, BATCHES[0])
  assert not np.allclose(other.params["hidden"]["kernel"],
                         state.params["hidden"]["kernel"])


def test_typed_key_and_model_state_with_aux():
  def loss_fn(params, batch, model_state, rng):
    loss, new = bn_dropout_loss(params, batch, model_state, rng)
    return loss, (new, {"loss": loss})

  step = dp.make_train_step(loss_fn, OPTIMIZERS["lamb"](), dp.data_mesh(),
                            has_aux=True, donate=False)
  state = step.init(pm.init_params(), model_state=init_model_state(),
                    rng=jax.random.key(SEED))
  state, metrics = step(state, BATCHES[0])
  np.testing.assert_allclose(metrics["aux"]["loss"], metrics["loss"], rtol=1e-6)
  raw = dp.make_train_step(bn_dropout_loss, OPTIMIZERS["lamb"](), dp.data_mesh(),
                           donate=False)
  expected, _ = raw(raw.init(pm.init_params(), model_state=init_model_state(),
                             rng=SEED), BATCHES[0])
  assert_close(state.params, expected.params, rtol=1e-6, atol=1e-7)


def test_nonfinite_step_keeps_model_state():
  step = dp.make_train_step(bn_dropout_loss, optax.sgd(0.1), dp.data_mesh(),
                            donate=False)
  state = step.init(pm.init_params(), model_state=init_model_state(), rng=SEED)
  bad = jax.tree.map(np.array, BATCHES[0])
  bad["x"][3] = np.nan
  new, metrics = step(state, bad)
  assert bool(metrics["skipped"])
  jax.tree.map(np.testing.assert_array_equal, new.model_state, state.model_state)
  jax.tree.map(np.testing.assert_array_equal, new.params, state.params)


def test_bad_input_names_the_argument():
  mesh, opt = dp.data_mesh(), optax.sgd(0.1)
  for k in (0, -1):
    with pytest.raises(ValueError, match="microbatches"):
      dp.make_train_step(pm.loss_fn, opt, mesh, microbatches=k)
    with pytest.raises(ValueError, match="microbatches"):
      dp.make_pmap_train_step(pm.loss_fn, opt, microbatches=k)
  step = dp.make_train_step(pm.loss_fn, opt, mesh, microbatches=4)
  state = step.init(pm.init_params())
  with pytest.raises(ValueError, match=r"8 data-parallel replicas x 4 microbatches"):
    step(state, jax.tree.map(lambda x: x[:16], BATCHES[0]))
  # loss_fn returns a bare loss although it was given a model state.
  plain = lambda p, b, model_state: pm.loss_fn(p, b)
  step = dp.make_train_step(plain, opt, mesh)
  with pytest.raises(TypeError, match=r"model_state=.*\(loss, new_model_state\)"):
    step(step.init(pm.init_params(), model_state=init_model_state()), BATCHES[0])
  # ... or a state of another shape.
  wrong = lambda p, b, model_state: (pm.loss_fn(p, b), {"mean": jnp.zeros(3),
                                                       "count": model_state["count"]})
  step = dp.make_train_step(wrong, opt, mesh)
  with pytest.raises(ValueError, match=r"model_state\['mean'\] of shape \(3,\)"):
    step(step.init(pm.init_params(), model_state=init_model_state()), BATCHES[0])
  # ... or a pair without a model state.
  pair = lambda p, b: (pm.loss_fn(p, b), {})
  step = dp.make_train_step(pair, opt, mesh)
  with pytest.raises(ValueError, match="has_aux=True, or a model_state"):
    step(step.init(pm.init_params()), BATCHES[0])
  with pytest.raises(TypeError, match="rng"):
    step.init(pm.init_params(), rng=np.float32(1.0))


# --------------------------------------------------------------------------
# Sharded parameters: a (4, 2) ("data", "model") mesh, FSDP and tensor
# parallel layouts, against one device and an 8-way pure data mesh.
# --------------------------------------------------------------------------

FSDP = [(r".*kernel", P("model", None))]
TENSOR_PARALLEL = [  # Megatron-style: hidden columns, then output rows.
    (r"hidden/kernel", P(None, "model")),
    (r"hidden/bias", P("model")),
    (r"out/kernel", P("model", None)),
]


def mesh_2d():
  return jax.make_mesh((4, 2), ("data", "model"))


@functools.cache
def one_device(opt_name, steps=STEPS):
  opt = OPTIMIZERS[opt_name]()
  update = jax.jit(opt.update)
  params = jax.tree.map(jnp.asarray, pm.init_params())
  state = opt.init(params)
  for batch in BATCHES[:steps]:
    grads = _grad(params, batch)
    updates, state = update(grads, state, params)
    params = optax.apply_updates(params, updates)
  return params, state


@functools.cache
def data_parallel(opt_name):
  """The state and the last metrics of the 8-way data-parallel run."""
  data = dp.make_train_step(pm.loss_fn, OPTIMIZERS[opt_name](), dp.data_mesh(),
                            donate=False)
  expected = data.init(pm.init_params())
  for batch in BATCHES:
    expected, expected_metrics = data(expected, batch)
  return expected, expected_metrics


@pytest.mark.parametrize("opt_name, rules, shard_update", [
    ("lars", FSDP, False), ("lamb", TENSOR_PARALLEL, False),
    ("bounded_lars", FSDP, True), ("lamb", TENSOR_PARALLEL, True),
])
def test_sharded_params_equal_data_parallel_and_one_device(opt_name, rules, shard_update):
  step = dp.make_train_step(pm.loss_fn, OPTIMIZERS[opt_name](), mesh_2d(),
                            param_sharding=rules, shard_update=shard_update,
                            donate=False)
  assert step.data_axes == ("data",) and step.num_replicas == 4
  state = step.init(pm.init_params())
  for batch in BATCHES:
    state, metrics = step(state, batch)
  expected, expected_metrics = data_parallel(opt_name)
  ref_params, ref_state = one_device(opt_name)
  for other_params, other_state in ((expected.params, expected.opt_state),
                                    (ref_params, ref_state)):
    assert_close(state.params, other_params, rtol=1e-5, atol=1e-6)
    assert_close(state.opt_state, other_state, rtol=1e-5, atol=1e-6)
  assert_close(metrics["trust_ratios"].unpack(), date_optax.trust_ratios(ref_state),
               rtol=1e-5, atol=1e-6)
  assert_close(metrics["trust_ratios"].unpack(), expected_metrics["trust_ratios"].unpack(),
               rtol=1e-5, atol=1e-6)
  assert not np.allclose(np.asarray(metrics["trust_ratios"].values), 1.0)
  np.testing.assert_allclose(metrics["loss"], expected_metrics["loss"], rtol=1e-5)
  # The parameters and the optimizer state that mirrors them live sharded.
  kernel = state.params["out"]["kernel"]
  assert kernel.sharding.spec == P("model", None)
  assert kernel.addressable_shards[0].data.shape[0] == 16 // 2
  mirrored = [x for x in jax.tree.leaves(state.opt_state) if x.shape == (16, 3)]
  assert mirrored
  for x in mirrored:
    ways = 2 * (4 if shard_update else 1)
    assert x.addressable_shards[0].data.size == x.size // ways, x.sharding


@pytest.mark.parametrize("shard_update, microbatches", [(False, 1), (True, 2)])
def test_fsdp_over_a_data_axis_equals_data_parallel(shard_update, microbatches):
  """FSDP: the kernels split over "model", which also splits the batch (8
  replicas); the same numbers as the 8-way data-parallel step, the noise
  statistics included."""
  kwargs = dict(grad_stats=True, donate=False, microbatches=microbatches)
  step = dp.make_train_step(pm.loss_fn, OPTIMIZERS["lamb"](), mesh_2d(),
                            data_axes=("data", "model"), param_sharding=FSDP,
                            shard_update=shard_update, **kwargs)
  assert step.num_replicas == 8 and step.batch_spec == P(("data", "model"))
  data = dp.make_train_step(pm.loss_fn, OPTIMIZERS["lamb"](), dp.data_mesh(), **kwargs)
  state, expected = step.init(pm.init_params()), data.init(pm.init_params())
  for batch in BATCHES:
    state, metrics = step(state, batch)
    expected, expected_metrics = data(expected, batch)
  assert_close(state.params, expected.params, rtol=1e-5, atol=1e-6)
  assert_close(state.opt_state, expected.opt_state, rtol=1e-5, atol=1e-6)
  for key in ("loss", "grad_noise_scale"):
    np.testing.assert_allclose(metrics[key], expected_metrics[key], rtol=1e-4)
  kernel = state.params["out"]["kernel"]
  assert kernel.sharding.spec == P("model", None)
  assert kernel.addressable_shards[0].data.shape[0] == 16 // 2
  moments = [x for x in jax.tree.leaves(state.opt_state) if x.shape == (16, 3)]
  assert moments and all(  # with shard_update also over the batch's other axis
      x.addressable_shards[0].data.size == x.size // (8 if shard_update else 2)
      for x in moments)


def test_fsdp_over_a_data_axis_needs_the_compilers_psum():
  with pytest.raises(ValueError, match=r"names the data axes \['model'\] \(FSDP\)"):
    dp.make_train_step(pm.loss_fn, optax.sgd(0.1), mesh_2d(), data_axes=("data", "model"),
                       param_sharding=FSDP, comm_dtype="int8")


def test_sharded_params_with_model_state_keys_and_microbatches():
  step = dp.make_train_step(bn_dropout_loss, OPTIMIZERS["lamb"](),
                            dp.data_mesh(), microbatches=2, donate=False)
  expected, _ = run_step(step)
  # 8 replicas on a (8, 1) mesh with a "model" axis of one device: same keys.
  mesh = jax.make_mesh((8, 1), ("data", "model"))
  step = dp.make_train_step(bn_dropout_loss, OPTIMIZERS["lamb"](), mesh,
                            microbatches=2, param_sharding=TENSOR_PARALLEL,
                            donate=False)
  state, _ = run_step(step)
  assert_close(state.params, expected.params, rtol=1e-5, atol=1e-6)
  assert_close(state.model_state, expected.model_state, rtol=1e-5, atol=1e-6)
  ref_params, _, ref_ms = reference("lamb", 2)
  assert_close(state.params, ref_params)
  assert_close(state.model_state, ref_ms)


def test_param_sharding_as_a_spec_tree():
  specs = {"hidden": {"kernel": P(None, "model"), "bias": P("model")},
           "out": {"kernel": P("model", None), "bias": None}}
  a = dp.make_train_step(pm.loss_fn, OPTIMIZERS["lamb"](), mesh_2d(),
                         param_sharding=specs, donate=False)
  b = dp.make_train_step(pm.loss_fn, OPTIMIZERS["lamb"](), mesh_2d(),
                         param_sharding=TENSOR_PARALLEL, donate=False)
  sa, sb = a.init(pm.init_params()), b.init(pm.init_params())
  for x, y in zip(jax.tree.leaves(sa), jax.tree.leaves(sb), strict=True):
    assert x.sharding == y.sharding
  sa, _ = a(sa, BATCHES[0])
  sb, _ = b(sb, BATCHES[0])
  jax.tree.map(np.testing.assert_array_equal, sa.params, sb.params)


def test_param_sharding_bad_input():
  mesh, opt = mesh_2d(), optax.sgd(0.1)
  with pytest.raises(ValueError, match="names the data axes"):
    dp.make_train_step(pm.loss_fn, opt, mesh, data_axes=("data",),
                       param_sharding=[(".*", P("data"))], grad_reduce="ring")
  with pytest.raises(ValueError, match="'tensor', not an axis"):
    dp.make_train_step(pm.loss_fn, opt, mesh, param_sharding=[(".*", P("tensor"))])
  with pytest.raises(ValueError, match='grad_reduce="torus" needs two data axes'):
    dp.make_train_step(pm.loss_fn, opt, mesh, param_sharding=FSDP, grad_reduce="torus")
  with pytest.raises(ValueError, match="not a regex"):
    dp.make_train_step(pm.loss_fn, opt, mesh, param_sharding=[("(", P())])
  step = dp.make_train_step(pm.loss_fn, opt, mesh,
                            param_sharding=FSDP + [("encoder/.*", P("model"))])
  with pytest.warns(UserWarning, match="'encoder/.*' matches no parameter"):
    step.init(pm.init_params())
  step = dp.make_train_step(pm.loss_fn, opt, mesh,
                            param_sharding=[("out/bias", P("model"))])
  with pytest.raises(ValueError, match=r"out/bias has shape \(3,\)"):
    step.init(pm.init_params())
  step = dp.make_train_step(pm.loss_fn, opt, mesh, param_sharding={"hidden": P()})
  with pytest.raises(ValueError, match="structure of the parameters"):
    step.init(pm.init_params())


# --------------------------------------------------------------------------
# The exact skip costs no pass over the state (issue 31, item 1).
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sgd_momentum", "adamw", "lamb", "lars",
                                  "lars_norm_of_sum"])
def test_the_skip_adds_no_pass_over_parameters_or_optimizer_state(name):
  """The update runs inside one `lax.cond` on the skip's decision: the
  compiled `apply_gradients` (its branches included) writes as many
  parameter-sized arrays as the plain update (plus the gradient norm), and
  copies none. Deciding the skip after the update instead (the earlier
  rule, which also checked the update) materialised the new state and
  selected it in a second pass: 3 against 2 for momentum SGD, 7 against 4
  for AdamW."""
  import re

  from date_optax._src.parallel.step import train_state as ts

  opt = {"sgd_momentum": optax.sgd(0.1, momentum=0.9), "adamw": optax.adamw(1e-3),
         "lamb": date_optax.lamb(1e-3), "lars": date_optax.lars(0.1),
         "lars_norm_of_sum": date_optax.lars(0.1, weight_decay=1e-4,
                                             denominator="norm_of_sum")}[name]
  params = {"k": jnp.ones((256, 256))}
  state = dp.TrainState.create(params, opt)

  def library(state, g, loss):
    return ts.apply_gradients(state, g, loss, opt)[0]

  def plain(state, g, loss):
    u, s = opt.update(g, state.opt_state, state.params)
    return optax.apply_updates(state.params, u), s, ts.sum_squares_or_nan(g)

  def compiled(f):
    return jax.jit(f, donate_argnums=0).lower(state, params, jnp.float32(1.0)).compile()

  def full_size_kernels(f):
    # Every computation the step runs: the entry and the conditional's branches.
    return len(re.findall(r"= f32\[256,256\]\{1,0\} fusion\(", compiled(f).as_text()))

  assert full_size_kernels(library) == full_size_kernels(plain) > 0
  assert not re.findall(r"= f32\[256,256\]\{1,0\} copy\(", compiled(library).as_text())


def _entry(f, *args) -> str:
  return jax.jit(f).lower(*args).compile().as_text().split("ENTRY")[1]


def test_finiteness_sum_adds_leaves_of_one_shape_into_one_reduction():
  """Σ x² over 81 leaves (80 float, of two shapes, one integer) equals the
  float64 sum, whatever `keys` groups them; the compiled sum has a few
  kernels, not one (or two) per leaf; a NaN or Inf anywhere gives NaN, an
  overflow of finite squares +Inf."""
  from date_optax._src.parallel.step import train_state as ts

  rng = np.random.default_rng(0)
  tree = {f"l{i:02d}": {"kernel": rng.normal(size=(16, 16)).astype(np.float32),
                        "bias": rng.normal(size=(16,)).astype(np.float32)}
          for i in range(40)}
  tree["step"] = np.arange(3, dtype=np.int32)  # not a float: not counted
  want = sum(np.sum(np.float64(x) ** 2) for k, x in
             ((k, x) for k, x in jax.tree_util.tree_leaves_with_path(tree))
             if x.dtype == np.float32)
  keys = jax.tree.map(lambda _: "a", tree)
  for i in range(0, 40, 3):  # some kernels laid out differently
    keys[f"l{i:02d}"]["kernel"] = "b"
  for k in (None, keys):
    got = ts.sum_squares_or_nan(jax.tree.map(jnp.asarray, tree), k)
    np.testing.assert_allclose(float(got), want, rtol=2e-6)
  kernels = _entry(ts.sum_squares_or_nan, tree).count(" fusion(")
  assert kernels <= 8, f"{kernels} kernels for 80 float leaves of two shapes"
  for bad in (np.nan, np.inf, -np.inf):
    t = jax.tree.map(np.copy, tree)
    t["l17"]["kernel"][3, 4] = bad
    assert np.isnan(float(ts.sum_squares_or_nan(t, keys)))
  t = jax.tree.map(np.copy, tree)
  t["l05"]["bias"][0] = 3e38  # finite, its square is not
  assert float(ts.sum_squares_or_nan(t)) == np.inf


def test_values_in_the_state_and_the_metrics_are_not_copied():
  """The trust ratios, the skip counters and the learning rate go to the new
  state and to the metrics; the compiled step computes the metrics' values
  beside the state's instead of copying them (one copy kernel per value on a
  GPU): 17 scalar copies for 12 leaves before, at most 3 now (constants the
  update returns), the conditional's branches included."""
  import re

  from date_optax._src.parallel.step import train_state as ts

  params = {f"l{i}": {"kernel": jnp.ones((64, 64)), "bias": jnp.ones((64,))}
            for i in range(6)}
  opt = date_optax.lamb(1e-3)
  state = dp.TrainState.create(params, opt)
  # The state donated, as the train step donates it; the loss is an input
  # here (the step computes it), so its copy into the metrics is left out.
  text = jax.jit(lambda s, g, loss: ts.apply_gradients(s, g, loss, opt),
                 donate_argnums=0).lower(state, params, jnp.float32(1.0)).compile().as_text()
  copies = [c for c in re.findall(r"= [fs]32\[\]\S* copy\((\S+)\)", text)
            if not c.startswith("%loss")]
  assert len(copies) <= 3, f"{len(copies)} scalar copies: {copies}"
  _, metrics = ts.apply_gradients(state, params, jnp.float32(1.0), opt)
  np.testing.assert_array_equal(np.array(jax.tree.leaves(metrics["trust_ratios"].unpack())),
                                np.array(jax.tree.leaves(date_optax.trust_ratios(
                                    ts.apply_gradients(state, params, jnp.float32(1.0),
                                                       opt)[0].opt_state))))


def test_the_step_reads_leaf_shapes_and_dtypes_from_their_attributes():
  """The compiled-step cache key is read from each leaf's own shape and dtype
  (host time on every call); a Python scalar still gets its JAX dtype."""
  from date_optax._src.parallel.step import step_base

  assert step_base._shape_dtype(jnp.ones((2, 3), jnp.bfloat16)) == ((2, 3), jnp.bfloat16)
  assert step_base._shape_dtype(np.zeros((4,), np.int8)) == ((4,), np.int8)
  assert step_base._shape_dtype(1.5) == ((), jnp.result_type(1.5))


def test_a_returned_state_and_a_placed_batch_skip_the_host_checks(monkeypatch):
  """Host time per call: the state a step returned goes straight to its
  program (no flatten, no checks), and a batch already laid out is not
  walked. Anything else is checked as before: a state the caller changed,
  and a laid-out batch whose shapes do not fit (checked where it is traced)."""
  from date_optax._src.parallel.step import step_base

  checked = []
  real = step_base.check_state
  monkeypatch.setattr(step_base, "check_state",
                      lambda *a, **k: (checked.append(1), real(*a, **k))[1])
  step = dp.make_train_step(pm.loss_fn, date_optax.lamb(1e-2), dp.data_mesh())
  batches = [step.shard_batch(b) for b in BATCHES]
  fast = step.init(pm.init_params())
  for b in batches:
    fast, _ = step(fast, b)
  assert len(checked) == 1, "only the first call (a fresh state) is checked"
  slow = step.init(pm.init_params())
  for b in BATCHES:  # host batches, and a state rebuilt before every call
    slow, _ = step(slow.replace(step=slow.step), b)
  assert len(checked) == 1 + STEPS
  for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(slow)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(ValueError, match="grad_residual"):
    step(fast.replace(grad_residual=fast.params), batches[0])
  placed = {"x": batches[0]["x"], "y": batches[0]["y"][:16]}
  placed["y"] = jax.device_put(placed["y"], step.batch_sharding)
  with pytest.raises(ValueError, match="same number of rows"):
    step(fast, placed)
  micro = dp.make_train_step(pm.loss_fn, optax.sgd(0.1), dp.data_mesh(), microbatches=4)
  with pytest.raises(ValueError, match=r"8 data-parallel replicas x 4 microbatches"):
    micro(micro.init(pm.init_params()),
          jax.device_put(jax.tree.map(lambda x: x[:16], BATCHES[0]), micro.batch_sharding))
