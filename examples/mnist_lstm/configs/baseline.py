"""The baseline itself: momentum SGD at B0 = 16 (7,680 iterations, 95.24 %)."""

from examples.mnist_lstm.configs import default


def get_config():
  config = default.get_config()
  config.method = "baseline"
  config.batch_size = config.base_batch_size
  config.num_devices = 1
  config.log_every_steps = 500
  return config
