"""Smoke-test config: the default recipe on 512 digits, 8 iterations on 2 devices.

The same code path as `default.py` (DATE at k = 8 from B0 = 16, the
data-parallel step, evaluation after each epoch) in seconds on the CPU;
tests/test_examples.py runs it.
"""

from examples.mnist_lstm.configs import default


def get_config():
  config = default.get_config()
  config.num_train, config.num_epochs, config.warmup_epochs = 512, 2, 0.05
  config.base_batch_size, config.batch_size = 16, 128
  config.num_devices = 2
  config.log_every_steps = 1
  config.checkpoint_every_steps = 2  # four checkpoints in the 8 steps
  return config
