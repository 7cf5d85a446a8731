"""Smoke-test config: `fake_data_cpu.py` (a tiny ResNet, 4 steps on random images).

Kept under the name every example uses for its smoke run; tests/test_examples.py
runs it.
"""

from examples.resnet50_imagenet.configs import fake_data_cpu


def get_config():
  return fake_data_cpu.get_config()
