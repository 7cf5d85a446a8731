"""Smoke-test config: a tiny ResNet on random 32x32 images, on the CPU.

Same code path as the pod configs (ghost BN over the devices' shares, the
LEGW/LARS recipe, bf16 compute, checkpoints), a few steps in seconds.
"""

from examples.resnet50_imagenet.configs import default


def get_config():
  config = default.get_config()
  config.model = "ResNetTiny"
  config.dataset = "fake"
  config.num_classes = 10
  config.image_size = 32
  config.num_train_examples = 4096
  config.num_eval_examples = 128
  config.batch_size = 64
  config.eval_batch_size = 64
  config.ghost_batch_size = 4
  config.base_batch_size = 16
  config.base_learning_rate = 2.0
  config.num_epochs = 10.0
  config.num_train_steps = 4
  config.steps_per_eval = 2
  config.log_every_steps = 1
  config.checkpoint_every_steps = 2
  return config
