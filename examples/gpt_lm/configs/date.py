"""DATE from the AdamW baseline at a fixed 64·B0 = 512 sequences, the same tokens.

`date_optax.date(baseline, 512, decay="baseline")`: the AdamW baseline's
direction under per-layer trust ratios bounded to [1/√k, 1], its learning
rate scaled by √k and its warmup by k (LEGW), its cosine decay kept (You et
al., "Large-batch training for LSTM and beyond", SC 2019,
https://arxiv.org/abs/1901.08256). Nothing is retuned at the batch.
"""

from examples.gpt_lm.configs import default


def get_config():
  config = default.get_config()
  config.optimizer = "date"
  config.batch_size = 64 * config.base_batch_size
  config.lr_scaling = "sqrt"
  config.eval_every_steps = 8
  config.log_every_steps = 1
  return config
