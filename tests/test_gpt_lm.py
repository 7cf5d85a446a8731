"""examples/gpt_lm: the smoke run learns and resumes exactly, the optimizers and
the growing batch build, one trust ratio per scanned layer, and the 1 B shape
compiles for a TPU slice with FSDP."""

from __future__ import annotations

import importlib.util
import math
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_examples_resume import _assert_same

import date_optax
from examples import _text_corpus
from examples.gpt_lm import input_pipeline, models, train
from examples.gpt_lm.configs import adaptive, date, default, gpt2_small, lamb, llama_1b, llama_8b
from examples.gpt_lm.configs import smoke as smoke_config


def _entropy(ids: np.ndarray) -> float:
  """H = −Σ p log p of the ids' frequencies (nats), written here from the math."""
  _, counts = np.unique(np.asarray(ids), return_counts=True)
  p = counts / counts.sum()
  return float(-(p * np.log(p)).sum())


def test_smoke_learns_past_the_unigram_entropy_and_resumes_exactly(tmp_path):
  config = smoke_config.get_config()
  reference = tmp_path / "reference"
  result = train.train_and_evaluate(config, str(reference))
  # The bar: the unigram entropy of the held-out token stream the run is
  # scored on (every target of every window), the loss of the best
  # predictor that ignores the context.
  vocab = _text_corpus.get_vocab("bpe", vocab_size=config.vocab_size, cache_dir=str(reference))
  targets = input_pipeline.eval_set(vocab, config.seq_len)["targets"]
  assert len(targets) == result["eval_sequences"] > 500
  entropy = _entropy(targets)
  np.testing.assert_allclose(result["eval_unigram_entropy"], entropy, rtol=1e-9)
  assert result["steps"] == 60 and result["tokens"] == 60 * 16 * 32
  assert result["eval_loss"] < entropy - 0.1, (result["eval_loss"], entropy)
  assert math.isclose(result["eval_perplexity"], math.exp(result["eval_loss"]), rel_tol=1e-12)

  # Resumed from the checkpoint of step 30 (the reference's own, its later
  # checkpoints and results removed): the same result, bit for bit, and
  # every metric row once. (The preemption path that writes such a
  # checkpoint is the loop's, tested in test_examples_resume.)
  resumed = tmp_path / "resumed"
  shutil.copytree(reference, resumed)
  (resumed / "results.json").unlink()
  kept = sorted(int(p.name) for p in (resumed / "checkpoints").iterdir() if p.name.isdigit())
  assert kept == [30, 60], kept
  shutil.rmtree(resumed / "checkpoints" / "60")
  again = train.train_and_evaluate(config, str(resumed))
  assert again["params_checksum"] == result["params_checksum"]
  _assert_same(resumed, reference)


def test_next_token_windows_cover_the_text_once():
  ids = np.arange(1000, dtype=np.uint16)
  source = _text_corpus.Windows(ids, 33, "t", stride=32)
  assert len(source) == (1000 - 33) // 32 + 1
  pairs = [input_pipeline.split_window(source[i]) for i in range(len(source))]
  targets = np.concatenate([p["targets"] for p in pairs])
  np.testing.assert_array_equal(targets, np.arange(1, len(source) * 32 + 1))
  for p in pairs:
    np.testing.assert_array_equal(p["targets"][:-1], p["inputs"][1:])
  assert len(_text_corpus.Windows(ids, 32, "t")) == 1000 // 32  # the BERT example's
  with pytest.raises(ValueError, match=r"stride must be an integer in \[1, seq_len=32\]"):
    _text_corpus.Windows(ids, 32, "t", stride=33)


def test_the_model_is_causal_and_computes_in_the_parameters_dtype():
  model = models.CausalLM(vocab_size=64, d_model=32, num_layers=2, num_heads=4,
                          num_kv_heads=2, mlp_dim=64)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 16)), jnp.int32)
  params = jax.jit(model.init)(jax.random.key(0), tokens)["params"]
  apply = jax.jit(lambda p, t: model.apply({"params": p}, t))
  logits = apply(params, tokens)
  changed = apply(params, tokens.at[:, 9].set((tokens[:, 9] + 1) % 64))
  np.testing.assert_array_equal(logits[:, :9], changed[:, :9])  # no peeking ahead
  assert not np.allclose(logits[:, 9:], changed[:, 9:])
  assert params["layers"]["key"]["kernel"].shape == (2, 32, 2, 8)  # grouped-query
  assert "head" in params and params["head"]["kernel"].shape == (32, 64)  # untied
  half = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  out = apply(half, tokens)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, logits, atol=0.05)
  with pytest.raises(ValueError, match="num_heads into groups of num_kv_heads=3"):
    models.CausalLM(vocab_size=64, d_model=32, num_heads=4, num_kv_heads=3).init(
        jax.random.key(0), tokens)


def test_rotary_positions_rotate_pairs_by_their_angle():
  x = np.random.default_rng(1).normal(size=(1, 5, 2, 8)).astype(np.float32)
  out = np.asarray(models.rotary(jnp.asarray(x), 100.0))
  # The reference: channel i and i + 4 of position p rotated by p·100^(−i/4).
  for p in range(5):
    for i in range(4):
      a = p * 100.0 ** (-i / 4)
      c, s = math.cos(a), math.sin(a)
      np.testing.assert_allclose(out[0, p, :, i], c * x[0, p, :, i] - s * x[0, p, :, i + 4],
                                 rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(out[0, p, :, i + 4], c * x[0, p, :, i + 4] + s * x[0, p, :, i],
                                 rtol=1e-5, atol=1e-6)


def test_each_scanned_layer_gets_its_own_trust_ratio():
  config = smoke_config.get_config()
  config.model.num_layers = 3
  model = train.create_model(config, 64)
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  axes = train.layer_axes(params)
  assert axes["layers"]["query"]["kernel"] == 0 and axes["head"]["kernel"] is None
  for name in ("lamb", "date"):
    config.optimizer = name
    tx, _ = train.make_optimizer(config)
    grads = jax.tree.map(jnp.ones_like, params)
    _, state = jax.jit(tx.update)(grads, tx.init(params), params)
    ratios = date_optax.trust_ratios(state)
    assert np.shape(ratios["layers"]["query"]["kernel"]) == (3,), name
    assert np.ndim(ratios["head"]["kernel"]) == 0, name


def test_the_optimizer_and_batch_configs():
  assert (default.get_config().optimizer, default.get_config().batch_size) == ("adamw", 8)
  for module, name in ((lamb, "lamb"), (date, "date"), (adaptive, "date")):
    config = module.get_config()
    assert config.optimizer == name and config.batch_size == 64 * config.base_batch_size
    tx, recipe = train.make_optimizer(config)
    assert recipe.total_steps == 19  # the same tokens: 1,200 steps of B0 in 18.75
  schedule = train.make_batch_schedule(adaptive.get_config())
  assert schedule.kind == "adaptive" and schedule.batch_sizes[-1] == 512
  assert (schedule.threshold, schedule.min_steps) == (3.0, 10)  # the library's defaults
  config = adaptive.get_config()
  config.growth.threshold, config.growth.hold_examples = 12.0, 64
  schedule = train.make_batch_schedule(config)
  assert (schedule.threshold, schedule.hold_examples, schedule.min_steps) == (12.0, 64, 10)
  config.growth.threshold = -1.0
  with pytest.raises(ValueError, match="threshold"):
    train.make_batch_schedule(config)
  assert train.train_steps(adaptive.get_config()) == [None] * 7
  assert train.train_steps(default.get_config()) == [1200]
  config = adaptive.get_config()
  config.optimizer = "adamw"
  with pytest.raises(ValueError, match="needs config.optimizer='date'"):
    train.make_optimizer(config)
  config = default.get_config()
  config.optimizer = "sgd"
  with pytest.raises(ValueError, match="config.optimizer must be one of"):
    train.make_optimizer(config)
  config = default.get_config()
  config.fsdp = 2
  with pytest.raises(ValueError, match="config.fsdp=2 needs config.param_sharding"):
    train.make_mesh(config)


@pytest.mark.parametrize("module,billions", [(gpt2_small, 0.162), (llama_1b, 1.100),
                                             (llama_8b, 8.030)])
def test_the_compile_configs_have_their_sizes(module, billions):
  config = module.get_config()
  model = train.create_model(config)
  params = jax.eval_shape(lambda k: model.init(k, jnp.zeros((1, 8), jnp.int32))["params"],
                          jax.random.key(0))
  assert sum(x.size for x in jax.tree.leaves(params)) / 1e9 == pytest.approx(billions, abs=5e-4)
  # Every large leaf is split over "fsdp" by the rules.
  paths = {"/".join(str(k.key) for k in path): leaf for path, leaf in
           jax.tree_util.tree_leaves_with_path(params)}
  for path, leaf in paths.items():
    if leaf.ndim >= 2 and "norm" not in path:
      assert any(re.fullmatch(r, path) for r, _ in config.param_sharding), path


@pytest.mark.slow  # two compiles of the 1 B shapes: about 90 s of CPU each on libtpu
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu (pip install 'jax[tpu]') is not installed")
@pytest.mark.xdist_group("libtpu")
def test_1b_compiles_for_a_tpu_slice_and_fsdp_cuts_the_bytes_per_device():
  # The 1 B config's shapes per layer (width 2,048, 32/4 heads, SwiGLU
  # 5,632, 32,000-token vocabulary, 2,048-token context, remat) with 2 of
  # its 22 layers, on the 8 chips of a v5e slice split 2 and 4 ways over
  # "fsdp"; one sequence per device in both (FSDP: every device a replica).
  tpu = date_optax.parallel.tpu_slice("v5litepod-8")
  reports = {}
  for fsdp in (2, 4):
    config = llama_1b.get_config()
    config.model.num_layers, config.fsdp, config.microbatches = 2, fsdp, 1
    config.batch_size = config.base_batch_size = 8
    ((name, step, state, batch),) = train.compile_target(config, tpu)
    assert name == f"batch {config.batch_size} (length 2048)"
    reports[fsdp] = date_optax.parallel.compile_report(step, state, batch, tpu=tpu)
  for r in reports.values():
    assert r.fits and r.num_devices == 8 and r.flops > 0
  # Parameters (float32) split over "fsdp", Adam's two moments over "fsdp"
  # and "data" (shard_update): P/f + 2P/8 floats per device for P
  # parameters (the norm scales, replicated, are 0.01 %).
  params = 2 * 2048 * 32000 + 2 * (2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 5632)
  for fsdp, r in reports.items():
    state_bytes = 4 * (params / fsdp + 2 * params / 8)
    assert state_bytes <= r.argument_bytes < 1.02 * state_bytes + 2**20, (fsdp, r.argument_bytes)
  assert reports[4].argument_bytes < 0.7 * reports[2].argument_bytes
  assert reports[4].total_bytes < reports[2].total_bytes
  # FSDP, not tensor parallelism: kernels are gathered over "fsdp" and only
  # the gradients are reduced (over all 8 devices), never activations over
  # an fsdp group; each device does the flops of its own sequence: 8 N T
  # for the blocks (remat: forward twice), 6 N T for the output layer, and
  # attention's two T x T products per layer four times (forward twice,
  # backward two), T = 2,048 tokens.
  blocks, head, t = params - 2 * 2048 * 32000, 2048 * 32000, 2048
  flops = 8 * blocks * t + 6 * head * t + 2 * 4 * (2 * 2 * t * t * 2048)
  for fsdp, r in reports.items():
    assert {c["group_size"] for c in r.collectives if c["kind"] == "all-reduce"} == {8}
    assert any(c["kind"] == "all-gather" and c["group_size"] == fsdp for c in r.collectives)
    np.testing.assert_allclose(r.executed_flops, flops, rtol=0.1)


@pytest.mark.slow  # one more training run (two programs): the default run keeps to the smoke
def test_the_growing_batch_runs_through_the_example(tmp_path):
  config = smoke_config.get_config()
  config.optimizer, config.batch_schedule, config.lr_scaling = "date", "adaptive", "linear"
  config.batch_size = 2 * config.base_batch_size
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result["batch_sizes"] == [16, 32] and result["batch_changes"][0] == [1, 16]
  assert result["examples"] <= 60 * 16 and result["tokens"] == result["examples"] * 32
  assert result["eval_loss"] < result["eval_unigram_entropy"]
