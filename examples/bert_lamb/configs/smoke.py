"""Smoke config: the default's code path (two stages, 2-D mesh, LAMB) in seconds.

A 2-layer, 64-wide encoder; stage 1 at length 32 and batch 32 for 24 steps,
stage 2 at length 128 and batch 16 for 8 steps; 8 emulated CPU devices
((4 data, 2 model) mesh), 2 microbatches, bf16 compute. The LAMB-table
baseline is re-based at B0 = 8 with a larger LR and warmup ratio (1/16: the
table's 1/320 would round to no warmup iteration in so short a run), scaled
to each stage's batch by the table's rule (LR x sqrt(k), warmup ratio x k).
"""

from examples.bert_lamb.configs import default


def get_config():
  config = default.get_config()
  config.model.update(d_model=64, num_layers=2, num_heads=4, mlp_dim=256)
  config.seq_len = 32
  config.batch_size = 32
  config.num_train_tokens = 32 * 32 * 24
  config.stage2.update(seq_len=128, batch_size=16, num_train_tokens=16 * 128 * 8)
  config.base_batch_size = 8
  config.base_learning_rate = 0.005
  config.base_warmup_ratio = 1 / 16
  config.eval_batch_size = 64
  config.eval_max_sequences = 64
  config.eval_every_steps = 16
  config.log_every_steps = 1
  config.checkpoint_every_steps = 8
  config.progress_bar = False
  config.vocab_size = 1024
  return config
