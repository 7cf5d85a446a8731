"""v3-32: 32 TensorCores (JAX devices), 4 hosts, 16 GiB HBM per core; 128 per device.

Global batch 32 x 128 = 4096 (we count TensorCores, tpu/README.md), BN over
ghost batches of 64, LEGW from B0 = 1024: peak LR 2^3.5, 1.25 warmup epochs
(391 iterations) of 28,151, 90 epochs.
"""

from examples.resnet50_imagenet.configs import pod


def get_config():
  return pod.get_config("v3-32")
