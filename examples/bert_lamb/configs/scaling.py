"""The batch-scaling study's run (benchmarks/bert_scaling.py): one stage, small, CPU.

A 2-layer, 64-wide encoder on UTF-8 bytes (the study's losses are per
masked byte), one stage at length 32, no dropout (a run makes less than one
pass over the text), float32 (a CPU without bfloat16 matrix units only
slows down in bf16), a data-only mesh over 2 emulated CPU devices with the
gradient-noise statistics on (2 replicas measure B_simple and the gain even
at B0 = 2), no checkpoints, one evaluation at the end. The study sets the
batch, the learning rate, the rule, the seed and the training tokens with
``--config.<field>=`` overrides.
"""

from examples.bert_lamb.configs import default


def get_config():
  config = default.get_config()
  config.tokenizer = "bytes"
  config.output_bias_init = "zeros"  # as the study's recorded runs
  config.model.update(d_model=64, num_layers=2, num_heads=4, mlp_dim=256, dropout_rate=0.0)
  config.two_stage = False
  config.seq_len = 32
  config.base_batch_size = 2
  config.batch_size = 2
  config.num_train_tokens = 2 * 32 * 32000  # 32000 steps at B0, 500 at 64·B0
  config.weight_decay = 0.01
  config.model_parallel = 1
  config.param_sharding = ()
  config.shard_update = False
  config.microbatches = 1
  config.half_precision = False
  config.grad_stats = True
  config.cpu_devices = 2
  config.save_checkpoints = False
  config.progress_bar = False
  config.eval_batch_size = 256
  config.eval_every_steps = 10**9  # once, at the end
  config.log_every_steps = 100
  return config
