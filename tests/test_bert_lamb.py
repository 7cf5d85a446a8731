"""examples/bert_lamb: the LAMB BERT table, two-stage recipe, per-layer ratios,
masking, and the smoke run learning past the unigram entropy (the CLI run and
the study are slow).
"""

from __future__ import annotations

import collections
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from run_outputs import load_benchmark, metrics_by_step, study_outputs  # noqa: E402

import date_optax  # noqa: E402
import date_optax.parallel as dp  # noqa: E402
from examples.bert_lamb import input_pipeline, train  # noqa: E402
from examples.bert_lamb.configs import default, lamb_bert, smoke  # noqa: E402


def test_bert_table_is_the_papers_and_the_cli_preset():
  from date_optax._src import cli_recipe

  # Yang You's slides, Table 1: 512·2^j, LR 5/(2^(3-0.5j)·10^3), warmup 1/320·2^j.
  table = {512: (5e-3 / 8, 1 / 320), 1024: (5e-3 / 2**2.5, 1 / 160),
           2048: (5e-3 / 4, 1 / 80), 4096: (5e-3 / 2**1.5, 1 / 40),
           8192: (5e-3 / 2, 1 / 20), 16384: (5e-3 / 2**0.5, 1 / 10),
           32768: (5e-3, 1 / 5)}
  assert sorted(default.BERT_TABLE) == sorted(table)
  preset = cli_recipe.PRESETS["lamb-bert"]
  assert preset["base_batch"] == default.BERT_BASE_BATCH
  assert cli_recipe.parse_number(preset["lr"]) == pytest.approx(default.BERT_BASE_LR)
  assert cli_recipe.parse_number(preset["warmup_ratio"]) == default.BERT_BASE_WARMUP_RATIO
  for batch, (lr, ratio) in table.items():
    np.testing.assert_allclose(default.BERT_TABLE[batch], (lr, ratio), rtol=1e-12)
    # The example's recipe reproduces each column from the j = 0 one.
    config = lamb_bert.get_config(batch)
    recipe = train.make_recipe(config)
    np.testing.assert_allclose(recipe.stages[0].peak_learning_rate, lr, rtol=1e-12)
    np.testing.assert_allclose(recipe.stages[0].warmup_ratio, ratio, rtol=1e-12)
  with pytest.raises(ValueError, match="batch_size must be one of"):
    lamb_bert.get_config(1000)


def test_two_stage_recipe_rewarms_from_zero():
  config = default.get_config()
  recipe = train.make_recipe(config)
  s1, s2 = recipe.stages
  n1 = config.num_train_tokens // config.seq_len
  n2 = config.stage2.num_train_tokens // config.stage2.seq_len
  assert config.stage2.seq_len == 4 * config.seq_len
  assert (s1.total_steps, s2.total_steps) == (n1 // config.batch_size,
                                              n2 // config.stage2.batch_size)
  assert recipe.boundaries == (0, s1.total_steps)
  assert s1.total_steps > 2 * s2.total_steps  # stage 1 has most of the steps
  assert s2.warmup_steps >= 2
  for stage, batch, n in ((s1, config.batch_size, n1), (s2, config.stage2.batch_size, n2)):
    k = batch / config.base_batch_size
    np.testing.assert_allclose(stage.peak_learning_rate, config.base_learning_rate * math.sqrt(k))
    w = config.base_warmup_ratio * k * n / batch
    assert stage.warmup_steps == math.floor(w + 0.5)
  # BERT's schedule at update i (1-based j = i + 1 within its stage): linear
  # warmup peak·j/W from 0, then peak·(1 - j/T) (unshifted), to 0 at the end.
  b = recipe.boundaries[1]
  for i in (0, 1, s1.warmup_steps, b - 2, b - 1, b, b + 1, b + s2.warmup_steps + 3):
    stage, start = (s1, 0) if i < b else (s2, b)
    j = i - start + 1
    peak, w, t = stage.peak_learning_rate, stage.warmup_steps, stage.total_steps
    want = peak * j / w if j <= w else peak * (1 - j / t)
    np.testing.assert_allclose(float(recipe.schedule(i)), want, rtol=1e-5, atol=1e-9)
  # Stage 1 ends at 0 and stage 2 climbs again from its first warmup step.
  assert float(recipe.schedule(b - 1)) == 0.0
  assert float(recipe.schedule(b)) < float(recipe.schedule(b + s2.warmup_steps - 1))


def _model_params(config, seed=0):
  """The model's parameter tree, random values in the shapes of its init (the
  optimizer checks below need the tree, not an initialised model: no init
  program is compiled)."""
  shapes = jax.eval_shape(lambda k: train.create_model(config).init(
      k, jnp.zeros((1, 8), jnp.int32), train=False)["params"], jax.random.key(0))
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda s: jnp.asarray(0.05 * rng.standard_normal(s.shape), s.dtype), shapes)


def test_each_scanned_layer_gets_its_own_trust_ratio():
  config = smoke.get_config()
  params = _model_params(config)
  kernel = params["layers"]["mlp_in"]["kernel"]
  assert kernel.shape[0] == config.model.num_layers == 2
  # Make the layers differ by a known factor: layer 1's weights x 5.
  params["layers"]["mlp_in"]["kernel"] = kernel.at[1].multiply(5.0)
  grads = jax.tree.map(lambda p: jnp.cos(jnp.arange(p.size, dtype=jnp.float32)
                                         ).reshape(p.shape) * 1e-2, params)
  wd, eps = 0.01, 1e-6
  tx = date_optax.lamb(1e-3, weight_decay=wd, eps=eps, weight_decay_mask=train.NO_DECAY,
                       layer_axes=train.layer_axes)
  state = tx.init(params)
  _, state = jax.jit(tx.update)(grads, state, params)
  ratios = date_optax.trust_ratios(state)
  got = np.asarray(ratios["layers"]["mlp_in"]["kernel"])
  assert got.shape == (2,)
  # First LAMB step: m̂ = g, v̂ = g², u = g / (|g| + eps) + wd·w, r = ‖w‖/‖u‖ per layer.
  w = np.asarray(params["layers"]["mlp_in"]["kernel"], np.float64)
  g = np.asarray(grads["layers"]["mlp_in"]["kernel"], np.float64)
  u = g / (np.abs(g) + eps) + wd * w
  want = [np.linalg.norm(w[i]) / np.linalg.norm(u[i]) for i in range(2)]
  np.testing.assert_allclose(got, want, rtol=1e-4)
  assert got[1] > 3 * got[0]
  # Biases and norms: no trust ratio (1) and no decay.
  np.testing.assert_array_equal(np.asarray(ratios["layers"]["mlp_in"]["bias"]), [1.0, 1.0])
  assert float(ratios["final_norm"]["scale"]) == 1.0
  # Unstacked leaves keep one ratio.
  assert np.shape(ratios["token_embed"]["embedding"]) == ()


def test_bert_masking_and_corpus():
  data = input_pipeline.corpus()
  assert len(data["sha256"]) == 64 and data["pinned"] == (
      data["python"] in input_pipeline.PINNED_SHA256)
  assert len(data["train"]) > 10 * len(data["eval"]) > 0
  tokens = np.random.default_rng(0).integers(0, 256, (400, 250))
  tokens[:, -10:] = input_pipeline.PAD
  b = input_pipeline.mask_tokens(tokens, np.random.default_rng(1))
  chosen = b["weights"] == 1
  assert not chosen[:, -10:].any()
  np.testing.assert_allclose(chosen[:, :-10].mean(), 0.15, atol=0.005)
  masked = b["inputs"][chosen] == input_pipeline.MASK
  kept = b["inputs"][chosen] == tokens[chosen]
  np.testing.assert_allclose(masked.mean(), 0.8, atol=0.01)
  # 10 % unchanged, plus the random replacements that drew the same byte.
  np.testing.assert_allclose(kept.mean(), 0.1 + 0.1 / 256, atol=0.01)
  np.testing.assert_array_equal(b["inputs"][~chosen], tokens[~chosen])
  np.testing.assert_array_equal(b["targets"], tokens)
  e1, e2 = input_pipeline.eval_set(64), input_pipeline.eval_set(64)
  np.testing.assert_array_equal(e1["inputs"], e2["inputs"])
  assert len(e1["inputs"]) == len(data["eval"]) // 64
  with pytest.raises(ValueError, match="mask_rate"):
    input_pipeline.mask_tokens(tokens, np.random.default_rng(0), 1.5)


def test_bpe_tokenizer_is_trained_deterministically_and_cached(tmp_path):
  text = input_pipeline.corpus()["text"]["train"]
  # Two trainings of the same text give the same vocabulary, byte for byte.
  a = input_pipeline.train_bpe(text[:200_000], 600)
  assert a == input_pipeline.train_bpe(text[:200_000], 600)
  v = input_pipeline.get_vocab("bpe", vocab_size=1024, cache_dir=str(tmp_path))
  assert os.path.basename(v.path).startswith("tokenizer-bpe-1024-")
  assert os.path.dirname(v.path) == str(tmp_path)
  with open(v.path, "rb") as f:
    import hashlib

    assert hashlib.sha256(f.read()).hexdigest() == v.sha256
  # Read back from the cache: the same file, not retrained.
  mtime = os.path.getmtime(v.path)
  assert input_pipeline.get_vocab("bpe", vocab_size=1024, cache_dir=str(tmp_path)) == v
  assert os.path.getmtime(v.path) == mtime
  assert (v.size, v.pad_id, v.mask_id, v.random_ids) == (1024, 0, 4, (5, 1024))
  ids = v.encode("The function returns a new list of strings.")
  assert 5 <= len(ids) <= 12  # subwords, not 44 bytes
  assert all(v.random_ids[0] <= i < v.random_ids[1] for i in ids)
  with pytest.raises(ValueError, match="config.tokenizer must be 'bpe' or 'bytes'"):
    input_pipeline.get_vocab("wordpiece")
  with pytest.raises(ValueError, match="config.vocab_size must be an integer >= 512"):
    input_pipeline.train_bpe("abc", 100)


def test_bpe_masking_takes_whole_tokens_and_resumes(tmp_path):
  v = input_pipeline.get_vocab("bpe", vocab_size=1024, cache_dir=str(tmp_path))
  it = iter(input_pipeline.train_loader(v, 64, 32, seed=1))
  batches = [next(it) for _ in range(3)]
  b = batches[0]
  chosen = b["weights"] == 1
  np.testing.assert_allclose(chosen.mean(), 0.15, atol=0.03)
  # A chosen position holds [MASK], a random non-special token or itself:
  # always one whole vocabulary entry.
  got = b["inputs"][chosen]
  assert np.all((got == v.mask_id) | ((got >= v.random_ids[0]) & (got < v.random_ids[1])))
  np.testing.assert_array_equal(b["inputs"][~chosen], b["targets"][~chosen])
  # The windows are consecutive pieces of the tokenized training text.
  ids = input_pipeline.token_ids(v, "train")
  w = b["targets"][0]
  starts = np.flatnonzero(ids[: len(ids) - 32] == w[0])
  assert any(np.array_equal(ids[s : s + 32], w) for s in starts if s % 32 == 0)
  # The iterator's state restores the same windows and the same masks.
  it2 = iter(input_pipeline.train_loader(v, 64, 32, seed=1))
  next(it2)
  saved = dp.iterator_state(it2)
  it3 = iter(input_pipeline.train_loader(v, 64, 32, seed=1))
  dp.restore_iterator(it3, saved)
  for want in batches[1:]:
    got = next(it3)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k])


def test_output_bias_starts_at_the_log_unigram_prior(tmp_path):
  config = smoke.get_config()
  vocab = train.get_vocab(config, str(tmp_path))
  params = {"head_bias": jnp.zeros((vocab.size,)), "other": jnp.ones((2,))}
  got = train.init_output_bias(config, params, vocab)
  ids = input_pipeline.token_ids(vocab, "train")
  counts = np.zeros(vocab.size)
  np.add.at(counts, ids.astype(np.int64), 1)
  want = np.log((counts + 1) / (len(ids) + vocab.size))
  np.testing.assert_allclose(got["head_bias"], want, rtol=1e-6, atol=1e-6)
  assert got["other"] is params["other"]
  config.output_bias_init = "zeros"
  assert train.init_output_bias(config, params, vocab) is params
  config.output_bias_init = "prior"
  with pytest.raises(ValueError, match='output_bias_init must be "unigram" or "zeros"'):
    train.init_output_bias(config, params, vocab)


@pytest.mark.slow  # ~100-200 s on 2 cores; make test-all runs it
def test_bert_smoke_learns_past_the_unigram_entropy(tmp_path):
  """The smoke config, both stages: its eval MLM loss ends below the entropy
  of the held-out tokens' frequencies (no context-free predictor does better)."""
  config = smoke.get_config()
  config.save_checkpoints = False  # the resume tests cover checkpoints
  assert jax.device_count() == 8  # tests/conftest.py
  result = train.train_and_evaluate(config, str(tmp_path))
  recipe = train.make_recipe(config)
  assert result["steps"] == recipe.total_steps
  saved = json.load(open(tmp_path / "results.json"))
  assert saved["params_checksum"] == result["params_checksum"]
  assert result["tokenizer"] == "bpe" and result["vocab_size"] == config.vocab_size
  assert len(result["tokenizer_sha256"]) == 64
  # The unigram entropy of the masked targets' distribution: every token of
  # the evaluated held-out windows can be masked (none is padding), with the
  # same probability, so p_v is the share of token v among them.
  vocab = train.get_vocab(config, str(tmp_path))
  windows = input_pipeline.eval_set(
      config.stage2.seq_len, seed=config.eval_seed, mask_rate=config.mask_rate,
      max_sequences=None if config.eval_max_sequences <= 0 else config.eval_max_sequences,
      vocab=vocab)["targets"]
  assert windows.shape == (result["eval_sequences"], result["eval_seq_len"])
  counts = collections.Counter(windows.ravel().tolist())
  assert vocab.pad_id not in counts
  n = sum(counts.values())
  entropy = -sum(c / n * math.log(c / n) for c in counts.values())
  assert saved["eval_unigram_entropy"] == pytest.approx(entropy, rel=1e-9)
  assert result["eval_loss"] < entropy - 0.05, (result["eval_loss"], entropy)
  # ...and it predicts more masked tokens than always naming the most frequent.
  assert result["eval_accuracy"] > max(counts.values()) / n
  metrics = metrics_by_step(tmp_path / "metrics.csv")
  # The output bias starts at the training tokens' log-frequencies, add-one
  # smoothed: the first step's loss is that prior's cross-entropy on the
  # first batch's masked targets (the other logits start near 0), not ln V.
  train_counts = input_pipeline.token_counts(vocab, "train")
  prior = np.log((train_counts + 1.0) / (train_counts + 1.0).sum())
  first = next(iter(input_pipeline.train_loader(
      vocab, config.batch_size, config.seq_len, seed=config.seed, mask_rate=config.mask_rate)))
  cross_entropy = -prior[first["targets"][first["weights"] == 1]].mean()
  assert abs(metrics["loss"][1] - cross_entropy) < 0.1 < math.log(vocab.size) - cross_entropy
  np.testing.assert_allclose(metrics["learning_rate"][1],
                             recipe.stages[0].peak_learning_rate / recipe.stages[0].warmup_steps,
                             rtol=1e-6)
  assert metrics["skipped"][1] == 0.0 and "trust_ratio/median" in metrics


def test_grad_sync_config_builds_the_step_reduction_and_refuses_bad_values():
  config = smoke.get_config()
  assert train.make_grad_sync(config) == dp.GradSync()  # exact psum by default
  config.grad_sync.update(algorithm="ring", comm_dtype="int8", error_feedback=True)
  assert train.make_grad_sync(config) == dp.GradSync(
      "ring", comm_dtype="int8", block_size=32, error_feedback=True)
  config.grad_sync.update(aps="on", block_size=0, rounding="stochastic")
  sync = train.make_grad_sync(config)
  assert sync.uses_aps and sync.block_size is None and sync.rounding == "stochastic"
  config.grad_sync.aps = "yes"
  with pytest.raises(ValueError, match=r'config.grad_sync.aps must be "auto", "on" or "off"'):
    train.make_grad_sync(config)
  config.grad_sync.update(aps="auto", comm_dtype="float32", rounding="nearest",
                         error_feedback=True)
  with pytest.raises(ValueError, match="error_feedback=True needs a low-precision comm_dtype"):
    train.make_grad_sync(config)


@pytest.mark.slow  # ~40 s; the sharded 4-bit test below runs by default
def test_bert_one_step_with_a_4_bit_ring_and_error_feedback(tmp_path):
  """The study's step: a data-only mesh, the ring with an int4 payload, block
  scales and error feedback (`config.grad_sync`), LAMB, microbatches."""
  config = smoke.get_config()
  config.update(num_train_steps=2, eval_max_sequences=16, eval_batch_size=16,
                model_parallel=1, param_sharding=(), two_stage=False,
                save_checkpoints=False, tokenizer="bytes")
  config.grad_sync.update(algorithm="ring", comm_dtype="int4", error_feedback=True)
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result["steps"] == 2 and result["total_skips"] == 0
  assert np.isfinite(result["eval_loss"]) and np.isfinite(result["loss"])


# Slow (~40 s): tests/test_sharded_low_bit.py covers the library's sharded low-bit step.
@pytest.mark.slow
def test_bert_steps_on_the_sharded_mesh_with_a_4_bit_payload(tmp_path):
  """The default (4 data, 2 model) mesh with its param_sharding rules and
  shard_update: the gradients reduced over "data" in int4 with block scales
  and error feedback, each device its model shard (make_sharded_train_step's
  grad_sync)."""
  config = smoke.get_config()
  config.update(num_train_steps=2, eval_max_sequences=16, eval_batch_size=16,
                two_stage=False, save_checkpoints=False, tokenizer="bytes")
  config.grad_sync.update(algorithm="ring", comm_dtype="int4", error_feedback=True)
  assert config.model_parallel == 2 and config.param_sharding and config.shard_update
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result["steps"] == 2 and result["total_skips"] == 0
  assert np.isfinite(result["eval_loss"]) and np.isfinite(result["loss"])


@pytest.mark.slow
def test_bert_stage2_starts_from_stage1_checkpoint(tmp_path):
  config = smoke.get_config()
  boundary = train.make_recipe(config).boundaries[1]
  config.num_train_steps = boundary  # stage 1 only
  stage1 = train.train_and_evaluate(config, str(tmp_path))
  assert stage1["steps"] == boundary
  assert str(boundary) in os.listdir(tmp_path / "checkpoints")
  config.num_train_steps = -1
  both = train.train_and_evaluate(config, str(tmp_path))
  assert both["steps"] == train.make_recipe(config).total_steps
  metrics = metrics_by_step(tmp_path / "metrics.csv")
  s2 = train.make_recipe(config).stages[1]
  np.testing.assert_allclose(metrics["learning_rate"][boundary + 1],
                             s2.peak_learning_rate / s2.warmup_steps, rtol=1e-6)
  assert sorted(metrics["stage"]) == list(range(1, both["steps"] + 1))


@pytest.mark.slow
def test_bert_smoke_cli_writes_results(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)  # main.py emulates config.cpu_devices = 8
  subprocess.run([sys.executable, "-m", "examples.bert_lamb.main",
                  "--config=examples/bert_lamb/configs/smoke.py", f"--workdir={tmp_path}"],
                 env=env, cwd=ROOT, check=True, timeout=300, capture_output=True)
  result = json.load(open(tmp_path / "results.json"))
  assert result["steps"] == 480 and result["stage_boundaries"] == [0, 450]
  assert np.isfinite(result["eval_loss"]) and 0.0 <= result["eval_accuracy"] <= 1.0
  assert result["eval_seq_len"] == 128


@pytest.mark.slow
def test_bert_scaling_quick_and_resume(tmp_path):
  bench = load_benchmark("bert_scaling")
  out = str(tmp_path / "bs")
  argv = ["--quick", "--out", out]
  # Each run is a subprocess of the example's CLI on 2 emulated devices (the
  # study sets XLA_FLAGS for it; B0 = 4 does not split over the test's 8).
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
             JAX_PLATFORMS="cpu")

  def study():
    subprocess.run([sys.executable, "benchmarks/bert_scaling.py", *argv], env=env,
                   cwd=ROOT, check=True, timeout=1800, capture_output=True)

  study()
  md, lines = study_outputs(out, bench.LABELS.values())
  assert "| iterations | 640 | 160 | 40 | 10 |" in md
  # 2 B0 runs (LAMB, AdamW shared by both rules) + 3 scales x 3 methods, and
  # the two gain rows (DATE lr_scaling="gain", AdaScale) at 64·B0 (quick mode).
  assert len(lines) == 13
  study()  # everything from the log
  assert len(open(out + ".jsonl").read().splitlines()) == 13
  recs = [json.loads(line) for line in lines]
  assert {r["tokens"] for r in recs} == {640 * 4 * 32}
  # Every run measured the gradient noise through the step on 2 replicas.
  assert all(r["key"]["devices"] == 2 and r["curves"]["grad_noise_scale"] for r in recs)
  gain = [r for r in recs if r["key"]["method"] == "date_gain"]
  assert len(gain) == 1 and 1.0 <= gain[0]["final_gain"] <= 64.0


def _scaling_config(batch, **fields):
  from examples.bert_lamb.configs import scaling

  config = scaling.get_config()
  config.base_batch_size, config.batch_size = 2, batch
  config.num_train_tokens = 2 * 32 * 400
  config.base_warmup_ratio = 1 / 20
  config.update(fields)
  return config


def _updates(tx, params, steps, stats):
  state, out = tx.init(params), []
  for i in range(steps):
    grads = jax.tree.map(lambda p, c=i + 1: jnp.sin(c * p + 0.3), params)
    u, state = tx.update(grads, state, params, grad_stats=stats)
    out.append(u)
  return out


def test_bert_gain_optimizers_are_the_lamb_baseline_at_b0_and_scale_by_the_gain():
  config = _scaling_config(2)
  params = _model_params(config)
  sq_norm, trace_cov = 0.5, 40.0  # B_simple = 80
  stats = date_optax.GradStats(sq_norm=jnp.float32(sq_norm),
                               trace_cov=jnp.float32(trace_cov), batch_size=jnp.float32(2))
  ref = _updates(train.make_optimizer(config)[0], params, 4, stats)
  for fields in (dict(lr_scaling="gain"), dict(adascale=True)):
    got = _updates(train.make_optimizer(_scaling_config(2, **fields))[0], params, 4, stats)
    for a, b in zip(ref, got):
      jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-9), a, b)
  # At B = 8 (k = 4): DATE-gain is the LAMB baseline on the unscaled recipe
  # (lr_scaling="none", warmup ratio x k) times sqrt(r), AdaScale's gain
  # r = (1 + B_simple/B0) / (1 + B_simple/B).
  b_simple = trace_cov / sq_norm
  r = (1 + b_simple / 2) / (1 + b_simple / 8)
  stats8 = stats._replace(batch_size=jnp.float32(8)) if hasattr(stats, "_replace") else \
      date_optax.GradStats(sq_norm=stats.sq_norm, trace_cov=stats.trace_cov,
                           batch_size=jnp.float32(8))
  plain = _updates(train.make_optimizer(_scaling_config(8, lr_scaling="none"))[0],
                   params, 3, stats8)
  gain = _updates(train.make_optimizer(_scaling_config(8, lr_scaling="gain"))[0],
                  params, 3, stats8)
  for a, b in zip(plain, gain):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(
        y, np.sqrt(r) * np.asarray(x), rtol=1e-4, atol=1e-9), a, b)
  with pytest.raises(ValueError, match="two_stage"):
    train.make_optimizer(_scaling_config(8, lr_scaling="gain", two_stage=True))
  with pytest.raises(ValueError, match="adascale"):
    train.make_optimizer(_scaling_config(8, lr_scaling="gain", adascale=True))
