"""Smoke-test config of `adaptive.py`: the growing batch on 512 signals, 4 devices.

The same code path as `adaptive.py` (an adaptive batch from B0 = 16 to
4·B0 = 64 through `GrowingBatches`, the step with `grad_stats=True`, the
learning rate following the batch, an evaluation every epoch of examples)
in seconds on the CPU; tests/test_examples.py runs it.
"""

from examples.mnist1d_lstm.configs import adaptive


def get_config():
  config = adaptive.get_config()
  config.num_train, config.num_test = 512, 256
  config.batch_size = 4 * config.base_batch_size
  config.num_epochs, config.warmup_epochs = 2, 0.25
  config.num_devices = 4
  config.log_every_steps = 1
  config.checkpoint_every_steps = 8
  return config
