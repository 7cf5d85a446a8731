"""LAMB at a fixed 64·B0 = 512 sequences, the tiny model, the same tokens.

`date_optax.lamb` with one trust ratio per layer of the scanned blocks
(`train.layer_axes`), its learning rate at B0 scaled by √k to the batch
and the warmup ratio by k (LAMB's rule, You et al., "Large Batch
Optimization for Deep Learning: Training BERT in 76 minutes", ICLR 2020,
https://arxiv.org/abs/1904.00962), the baseline's cosine decay. LAMB's
rate at B0 is the BERT example's (2.5e-3, peak 0.02 here): a relative step
per layer, not Adam's absolute one, and not tuned for this model.
"""

from examples.gpt_lm.configs import default


def get_config():
  config = default.get_config()
  config.optimizer = "lamb"
  config.batch_size = 64 * config.base_batch_size
  config.base_learning_rate = 2.5e-3
  config.lr_scaling = "sqrt"
  config.eval_every_steps = 8
  config.log_every_steps = 1
  return config
