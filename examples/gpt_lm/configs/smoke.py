"""Smoke config: the tiny config's code path in seconds (the tests' run).

A 2-layer, 64-wide decoder (4 heads, 2 key/value heads: grouped-query
attention) on the 1,024-token BPE vocabulary, 60 AdamW steps of 16
sequences of 32 tokens at learning rate 1e-2 on a data-only mesh of 2
emulated CPU devices (8 in the tests), bf16 compute, the output bias
starting at the unigram prior; evaluated once, at the end, on every
held-out window (541). Enough to end clearly below the unigram entropy of
the held-out tokens (`tests/test_gpt_lm.py` checks it): measured here on 2
devices, 5.44 nats against 5.67, where 40 steps ended at 5.76 and 100
steps without the unigram start at 5.90.
"""

from examples.gpt_lm.configs import default


def get_config():
  config = default.get_config()
  config.model.update(d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=160)
  config.seq_len = 32
  config.base_batch_size = 16
  config.batch_size = 16
  config.num_train_tokens = 16 * 32 * 60
  config.base_learning_rate = 1e-2
  config.warmup_ratio = 0.05
  config.eval_batch_size = 64
  config.eval_max_sequences = -1
  config.eval_every_steps = 60
  config.checkpoint_every_steps = 30  # and at the end: the tests resume from 30
  config.log_every_steps = 10
  config.progress_bar = False
  return config
