"""Smoke-test config: the default recipe on 512 signals, 16 iterations on 4 devices.

The same code path as `default.py` (DATE at k = 4 from B0 = 16, the
data-parallel step over a `("data",)` mesh, evaluation after each epoch) in
seconds on the CPU; tests/test_examples.py runs it.
"""

from examples.mnist1d_lstm.configs import default


def get_config():
  config = default.get_config()
  config.num_train, config.num_test = 512, 256
  config.base_batch_size, config.batch_size = 16, 64
  config.num_epochs, config.warmup_epochs = 2, 0.25
  config.num_devices = 4
  config.log_every_steps = 1
  config.checkpoint_every_steps = 4  # four checkpoints in the 16 steps
  return config
