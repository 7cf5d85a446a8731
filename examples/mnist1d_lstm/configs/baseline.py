"""The baseline itself: the plain solver at B0 = 16 (61,440 iterations)."""

from examples.mnist1d_lstm.configs import default


def as_baseline(config, log_every_steps):
  """`config`'s baseline run: its solver at `base_batch_size` on one device.

  `examples/mnist_lstm/configs/baseline.py` makes its baseline with it too.
  """
  config.method = "baseline"
  config.batch_size = config.base_batch_size
  config.num_devices = 1
  config.log_every_steps = log_every_steps
  return config


def get_config():
  return as_baseline(default.get_config(), log_every_steps=2000)
