"""The real-data path on the CPU: a tiny ResNet on a small tfds ArrayRecord ImageNet.

`fake_data_cpu.py` with `dataset = "imagenet2012"`: JPEGs decoded with
Pillow, random-resized crops and flips to 32x32 for training, centre crops
for evaluation, all through grain. Point `--config.data_dir` at a directory
in the tfds layout (input_pipeline.py); tests/fake_tfds.py writes a small
one (320 training and 64 validation 64x64 images of 10 classes), which is
what tests/test_resnet_imagenet_data.py trains on.
"""

from examples.resnet50_imagenet.configs import fake_data_cpu


def get_config():
  config = fake_data_cpu.get_config()
  config.dataset = "imagenet2012"
  config.data_dir = None  # set it: --config.data_dir=/path/to/tensorflow_datasets
  config.num_classes = 10
  config.image_size = 32
  config.num_train_examples = 320
  config.num_eval_examples = 64
  config.batch_size = 32
  config.eval_batch_size = 32
  config.base_batch_size = 8
  config.num_train_steps = 4
  config.steps_per_eval = -1  # the whole (small) validation split
  return config
