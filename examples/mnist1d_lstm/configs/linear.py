"""Contrast: linear LR scaling with a 5-epoch warmup at 64·B0 (Goyal et al.)."""

from examples.mnist1d_lstm.configs import default


def get_config():
  config = default.get_config()
  config.method = "linear"
  return config
