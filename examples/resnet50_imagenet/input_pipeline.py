"""ImageNet input for the pods (tensorflow-datasets) and fake data for tests.

On a pod every host reads its own 1/process_count of the training files
(`tfds.split_for_jax_process`), decodes and augments with tf.data, and
yields NumPy batches of `global_batch / process_count` examples; the train
step assembles the global array from the hosts' pieces. The validation set
is read whole by every host, in chunks that `date_optax.parallel.evaluate`
splits over the hosts (it pads and masks the short last chunk). TensorFlow and tfds are
imported only when the real pipeline is built (`pip install
tensorflow-cpu tensorflow-datasets` on the workers, and the ImageNet
TFRecords under `data_dir`, e.g. a gs:// bucket prepared with tfds).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import jax
import numpy as np

MEAN_RGB = np.array([0.485, 0.456, 0.406], np.float32) * 255
STDDEV_RGB = np.array([0.229, 0.224, 0.225], np.float32) * 255


def fake_batches(
    batch_size: int, image_size: int, num_classes: int, *, seed: int = 0, start: int = 0
) -> Iterator[dict[str, np.ndarray]]:
  """Endless batches of standard-normal images, from batch number `start` on.

  Batch `i` is drawn from its own generator seeded by `(seed, i)`, so a
  resumed run gets exactly the batches an uninterrupted one got. The labels
  are a fixed function of the image (the sign pattern of a few pixels) so
  that a model can fit them: a smoke test can check that the loss goes down.
  """
  for i in itertools.count(start):
    rng = np.random.default_rng([seed, i])
    images = rng.standard_normal((batch_size, image_size, image_size, 3), np.float32)
    labels = (images[:, 0, 0, 0] > 0).astype(np.int32) * (num_classes // 2)
    yield {"image": images, "label": labels}


def imagenet_batches(
    *,
    split: str,
    batch_size: int,
    image_size: int,
    data_dir: str | None,
    train: bool,
    dtype: str = "bfloat16",
    shuffle_buffer: int = 16 * 1024,
    seed: int = 0,
    start: int = 0,
) -> Iterator[dict[str, np.ndarray]]:
  """This host's batches of ImageNet from tfds (`imagenet2012`).

  Args:
    split: "train" or "validation".
    batch_size: examples per batch: on this host (global / process count)
      for training, the global evaluation batch for evaluation.
    image_size: side of the square crop.
    data_dir: tfds data directory (a gs:// path on Cloud TPU).
    train: this host's files with random-resized crop, flip, shuffle and
      repeat; else every file, a centre crop and one pass (the last batch
      short).
    dtype: image dtype after normalisation.
    shuffle_buffer: tf.data shuffle buffer.
    seed: shuffle seed (combined with the process index).
    start: for training, the number of batches already consumed (a resumed
      run's step): that many batches of records are skipped before decoding,
      so the run goes on at its position in the shuffled stream. File order
      and shuffling are seeded; tf.data's random crops and flips are not
      reproduced bit for bit across a restart (the fake input is).

  Returns:
    An iterator of {"image", "label"} batches.
  """
  import tensorflow as tf  # noqa: PLC0415  (only on the workers)
  import tensorflow_datasets as tfds  # noqa: PLC0415

  tf.config.set_visible_devices([], "GPU")  # keep TF off accelerators
  builder = tfds.builder("imagenet2012", data_dir=data_dir)
  if train:
    split = tfds.split_for_jax_process(split, drop_remainder=False)
  ds = builder.as_dataset(
      split=split, shuffle_files=train,
      decoders={"image": tfds.decode.SkipDecoding()},
      read_config=tfds.ReadConfig(shuffle_seed=seed + jax.process_index()),
  )
  tf_dtype = tf.bfloat16 if dtype == "bfloat16" else tf.float32

  def decode_train(example):
    image_bytes = example["image"]
    shape = tf.io.extract_jpeg_shape(image_bytes)
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape, tf.zeros([0, 0, 4], tf.float32), area_range=(0.08, 1.0),
        aspect_ratio_range=(3 / 4, 4 / 3), max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    y, x, _ = tf.unstack(begin)
    h, w, _ = tf.unstack(size)
    image = tf.image.decode_and_crop_jpeg(image_bytes, tf.stack([y, x, h, w]), channels=3)
    image = tf.image.resize(image, [image_size, image_size], "bicubic")
    image = tf.image.random_flip_left_right(image)
    return _normalize(image, tf_dtype), example["label"]

  def decode_eval(example):
    image = tf.io.decode_jpeg(example["image"], channels=3)
    shape = tf.shape(image)
    side = tf.cast(
        image_size / (image_size + 32) * tf.cast(tf.minimum(shape[0], shape[1]), tf.float32),
        tf.int32,
    )
    y, x = (shape[0] - side + 1) // 2, (shape[1] - side + 1) // 2
    image = tf.image.crop_to_bounding_box(image, y, x, side, side)
    image = tf.image.resize(image, [image_size, image_size], "bicubic")
    return _normalize(image, tf_dtype), example["label"]

  options = tf.data.Options()
  options.threading.private_threadpool_size = 48
  ds = ds.with_options(options)
  if train:
    ds = ds.repeat().shuffle(shuffle_buffer, seed=seed + jax.process_index())
    ds = ds.skip(start * batch_size)  # still undecoded: skipping is cheap
    ds = ds.map(decode_train, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(batch_size, drop_remainder=True)
  else:
    ds = ds.map(decode_eval, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(batch_size)
  ds = ds.prefetch(tf.data.AUTOTUNE)
  for image, label in tfds.as_numpy(ds):
    yield {"image": image, "label": label}


def _normalize(image, dtype):
  import tensorflow as tf  # noqa: PLC0415

  image = (tf.cast(image, tf.float32) - MEAN_RGB) / STDDEV_RGB
  return tf.cast(image, dtype)
