"""The baseline itself: momentum SGD at B0 = 16 (7,680 iterations, 95.24 %)."""

from examples.mnist1d_lstm.configs import baseline
from examples.mnist_lstm.configs import default


def get_config():
  return baseline.as_baseline(default.get_config(), log_every_steps=500)
