"""The baseline itself: the plain solver at B0 = 16 (61,440 iterations)."""

from examples.mnist1d_lstm.configs import default


def get_config():
  config = default.get_config()
  config.method = "baseline"
  config.batch_size = config.base_batch_size
  config.num_devices = 1
  config.log_every_steps = 2000
  return config
