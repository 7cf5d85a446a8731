"""ImageNet as tfds prepares it (ArrayRecord), read with grain; fake data for tests.

The data is what `tfds build imagenet2012 --file_format=array_record`
writes (the format users already have in their buckets):

    DATA_DIR/imagenet2012/VERSION/dataset_info.json
    DATA_DIR/imagenet2012/VERSION/features.json
    DATA_DIR/imagenet2012/VERSION/imagenet2012-train.array_record-00000-of-01024
    ...
    DATA_DIR/imagenet2012/VERSION/imagenet2012-validation.array_record-00000-of-00064

Each record is a serialized `tf.train.Example` with the features `image`
(the JPEG bytes), `label` (int64) and `file_name`. TensorFlow is not
needed: the records are parsed with the protobuf package and a copy of the
`tf.train.Example` message definition built here (`example_pb2`), and the
JPEGs are decoded with Pillow.

Training reads through `date_optax.parallel.data_loader` (grain's
`DataLoader`): a seeded global shuffle per epoch, one shard per JAX process,
Inception-style random-resized crop (area 8-100 %, aspect 3/4-4/3, ten
tries, else a centre crop) and a random flip drawn from each record's own
generator, so a run resumed from a checkpoint (which holds the iterator
state) gets exactly the images, crops and flips an uninterrupted run gets.
Evaluation takes the centre crop (the `image_size / (image_size + 32)` of
the shorter side) of every validation image, the same on every host, in
chunks that `date_optax.parallel.evaluate` splits over the hosts.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import re
from collections.abc import Iterator
from typing import Any

import grain
import numpy as np

MEAN_RGB = np.array([0.485, 0.456, 0.406], np.float32) * 255
STDDEV_RGB = np.array([0.229, 0.224, 0.225], np.float32) * 255

DATASET = "imagenet2012"
LAYOUT = (
    "a tfds-prepared ArrayRecord dataset: DATA_DIR/imagenet2012/VERSION/ with "
    "dataset_info.json (fileFormat \"array_record\", the splits and their "
    "shardLengths), features.json (features \"image\" and \"label\") and the "
    "files imagenet2012-SPLIT.array_record-NNNNN-of-MMMMM (e.g. "
    "`tfds build imagenet2012 --file_format=array_record --data_dir=DATA_DIR`)"
)


# ---------------------------------------------------------------------------
# tf.train.Example without TensorFlow.


@functools.cache
def example_pb2():
  """The `tf.train.Example` message class, built from its definition.

  The definition is tensorflow/core/example/{example,feature}.proto
  (package `tensorflow`): `Example{Features features = 1}`,
  `Features{map<string, Feature> feature = 1}`, `Feature{oneof kind:
  BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list =
  3}`, with packed repeated values; the wire format is therefore the one
  TensorFlow writes.
  """
  from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: PLC0415

  f = descriptor_pb2.FileDescriptorProto(
      name="date_optax_examples/tf_example.proto", package="tensorflow", syntax="proto3")
  T = descriptor_pb2.FieldDescriptorProto

  def message(name, fields, nested=()):
    m = f.message_type.add(name=name)
    for spec in fields:
      m.field.add(**spec)
    for n in nested:
      m.nested_type.add().CopyFrom(n)
    return m

  repeated = T.LABEL_REPEATED
  message("BytesList", [dict(name="value", number=1, type=T.TYPE_BYTES, label=repeated)])
  message("FloatList", [dict(name="value", number=1, type=T.TYPE_FLOAT, label=repeated,
                             options=descriptor_pb2.FieldOptions(packed=True))])
  message("Int64List", [dict(name="value", number=1, type=T.TYPE_INT64, label=repeated,
                             options=descriptor_pb2.FieldOptions(packed=True))])
  feature = message("Feature", [
      dict(name=n, number=i, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL,
           type_name=f".tensorflow.{t}", oneof_index=0)
      for i, (n, t) in enumerate((("bytes_list", "BytesList"), ("float_list", "FloatList"),
                                  ("int64_list", "Int64List")), start=1)])
  feature.oneof_decl.add(name="kind")
  entry = descriptor_pb2.DescriptorProto(
      name="FeatureEntry", options=descriptor_pb2.MessageOptions(map_entry=True))
  entry.field.add(name="key", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
  entry.field.add(name="value", number=2, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL,
                  type_name=".tensorflow.Feature")
  message("Features", [dict(name="feature", number=1, type=T.TYPE_MESSAGE, label=repeated,
                            type_name=".tensorflow.Features.FeatureEntry")], [entry])
  message("Example", [dict(name="features", number=1, type=T.TYPE_MESSAGE,
                           label=T.LABEL_OPTIONAL, type_name=".tensorflow.Features")])
  pool = descriptor_pool.DescriptorPool()
  pool.Add(f)
  return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def serialize_example(features: dict[str, Any]) -> bytes:
  """A `tf.train.Example` of bytes (`bytes`/`str`) and integer features.

  Args:
    features: name -> bytes, str, int or a list of ints.

  Returns:
    The serialized proto, as tfds writes each record.
  """
  ex = example_pb2()()
  for name, value in features.items():
    feat = ex.features.feature[name]
    if isinstance(value, str):
      value = value.encode()
    if isinstance(value, bytes):
      feat.bytes_list.value.append(value)
    else:
      feat.int64_list.value.extend(np.atleast_1d(value).astype(np.int64).tolist())
  return ex.SerializeToString()


def parse_example(record: bytes) -> dict[str, Any]:
  """The features of one serialized `tf.train.Example` (bytes, ints or floats)."""
  ex = example_pb2().FromString(record)
  out = {}
  for name, feat in ex.features.feature.items():
    kind = feat.WhichOneof("kind")
    values = list(getattr(feat, kind).value) if kind else []
    out[name] = values[0] if len(values) == 1 else values
  return out


# ---------------------------------------------------------------------------
# The tfds directory.


def split_files(data_dir: str, split: str, *, num_classes: int | None = None
                ) -> tuple[list[str], int]:
  """The ArrayRecord files of `split` in a tfds data directory, and its size.

  Args:
    data_dir: the tfds data directory (holding `imagenet2012/VERSION/`), or
      the `imagenet2012` or `imagenet2012/VERSION` directory itself.
    split: "train" or "validation".
    num_classes: if given, checked against features.json.

  Returns:
    `(paths, num_examples)`.

  Raises:
    FileNotFoundError / ValueError: naming the path and the expected layout.
  """
  if not data_dir:
    raise ValueError(f"config.data_dir is not set; it must point at {LAYOUT}.")
  root = os.path.abspath(os.path.expanduser(str(data_dir)))
  if not os.path.isdir(root):
    raise FileNotFoundError(f"data_dir {root} does not exist; expected {LAYOUT}.")
  version_dir = _version_dir(root)
  info_path = os.path.join(version_dir, "dataset_info.json")
  try:
    with open(info_path) as fh:
      info = json.load(fh)
  except (OSError, ValueError) as e:
    raise ValueError(f"{info_path} is missing or not JSON ({e}); expected {LAYOUT}.") from e
  fmt = info.get("fileFormat", "tfrecord")
  if fmt != "array_record":
    raise ValueError(
        f"{info_path} says fileFormat {fmt!r}; this pipeline reads \"array_record\", "
        f"expected {LAYOUT}.")
  splits = {s.get("name"): s for s in info.get("splits", [])}
  if split not in splits:
    raise ValueError(f"{info_path} has no split {split!r} (it has {sorted(splits)}); "
                     f"expected {LAYOUT}.")
  _check_features(version_dir, num_classes)
  lengths = [int(n) for n in splits[split].get("shardLengths", [])]
  name = info.get("name", DATASET)
  template = splits[split].get("filepathTemplate",
                               "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}")
  paths = []
  for i in range(len(lengths)):
    file = (template.replace("{DATASET}", name).replace("{SPLIT}", split)
            .replace("{FILEFORMAT}", fmt)
            .replace("{SHARD_X_OF_Y}", f"{i:05d}-of-{len(lengths):05d}"))
    path = os.path.join(version_dir, file)
    if not os.path.isfile(path):
      raise FileNotFoundError(f"{path} is missing (listed in {info_path}); expected {LAYOUT}.")
    paths.append(path)
  if not paths or sum(lengths) == 0:
    raise ValueError(f"{info_path} lists no records for split {split!r}; expected {LAYOUT}.")
  return paths, sum(lengths)


def _version_dir(root: str) -> str:
  if os.path.isfile(os.path.join(root, "dataset_info.json")):
    return root
  base = os.path.join(root, DATASET) if os.path.isdir(os.path.join(root, DATASET)) else root
  versions = sorted((d for d in os.listdir(base)
                     if re.fullmatch(r"\d+\.\d+\.\d+", d)
                     and os.path.isfile(os.path.join(base, d, "dataset_info.json"))),
                    key=lambda v: tuple(map(int, v.split("."))))
  if not versions:
    raise FileNotFoundError(
        f"no {DATASET}/VERSION/dataset_info.json under {root}; expected {LAYOUT}.")
  return os.path.join(base, versions[-1])


def _check_features(version_dir: str, num_classes: int | None) -> None:
  path = os.path.join(version_dir, "features.json")
  try:
    with open(path) as fh:
      features = json.load(fh)["featuresDict"]["features"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{path} is missing or has no featuresDict.features ({e}); "
                     f"expected {LAYOUT}.") from e
  if "image" not in features or "label" not in features:
    raise ValueError(f"{path} has features {sorted(features)}, not \"image\" and \"label\"; "
                     f"expected {LAYOUT}.")
  encoding = features["image"].get("image", {}).get("encodingFormat", "jpeg")
  if encoding not in ("jpeg", "png"):
    raise ValueError(f"{path}: image encodingFormat {encoding!r} (expected jpeg or png).")
  have = features["label"].get("classLabel", {}).get("numClasses")
  if num_classes is not None and have is not None and int(have) != num_classes:
    raise ValueError(f"{path} has {have} classes but config.num_classes={num_classes}.")


# ---------------------------------------------------------------------------
# Decoding and augmentation (grain transforms).


def _normalize(image: np.ndarray, dtype: Any) -> np.ndarray:
  return ((image.astype(np.float32) - MEAN_RGB) / STDDEV_RGB).astype(dtype)


def _decode(jpeg: bytes):
  from PIL import Image  # noqa: PLC0415

  return Image.open(io.BytesIO(jpeg)).convert("RGB")


def sample_crop(height: int, width: int, rng: np.random.Generator, *,
                area_range=(0.08, 1.0), aspect_range=(3 / 4, 4 / 3), attempts: int = 10
                ) -> tuple[int, int, int, int] | None:
  """Inception's random-resized crop window `(top, left, h, w)`, or None.

  Up to `attempts` draws of an area fraction (uniform in `area_range`) and
  a log-uniform aspect ratio; the first window that fits is placed
  uniformly. None (after `attempts` misses) means: take the centre crop.
  """
  for _ in range(attempts):
    area = rng.uniform(*area_range) * height * width
    aspect = math.exp(rng.uniform(math.log(aspect_range[0]), math.log(aspect_range[1])))
    w = int(round(math.sqrt(area * aspect)))
    h = int(round(math.sqrt(area / aspect)))
    if 0 < w <= width and 0 < h <= height:
      top = int(rng.integers(0, height - h + 1))
      left = int(rng.integers(0, width - w + 1))
      return top, left, h, w
  return None


def _center_window(height: int, width: int, image_size: int) -> tuple[int, int, int, int]:
  side = int(image_size / (image_size + 32) * min(height, width))
  return (height - side + 1) // 2, (width - side + 1) // 2, side, side


def _crop_resize(image, window, image_size: int) -> np.ndarray:
  from PIL import Image  # noqa: PLC0415

  top, left, h, w = window
  image = image.crop((left, top, left + w, top + h)).resize(
      (image_size, image_size), Image.BICUBIC)
  return np.asarray(image, np.uint8)


class ParseRecord(grain.transforms.Map):
  """A serialized tf.train.Example -> {"jpeg": bytes, "label": int32}."""

  def map(self, record: bytes) -> dict[str, Any]:
    feats = parse_example(record)
    out = {"jpeg": feats["image"], "label": np.int32(feats["label"])}
    if "file_name" in feats:
      out["file_name"] = feats["file_name"]
    return out


class TrainAugment(grain.transforms.RandomMap):
  """Decode, random-resized crop, resize (bicubic), random flip, normalise.

  The random draws come from the record's generator (grain seeds it from
  the loader's seed and the record's position), so they replay after a
  restore.
  """

  def __init__(self, image_size: int, dtype: Any = np.float32, keep_file_name: bool = False):
    self.image_size, self.dtype, self.keep_file_name = image_size, dtype, keep_file_name

  def random_map(self, element: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    image = _decode(element["jpeg"])
    w, h = image.size
    window = sample_crop(h, w, rng) or _center_window(h, w, self.image_size)
    pixels = _crop_resize(image, window, self.image_size)
    if rng.random() < 0.5:
      pixels = pixels[:, ::-1]
    out = {"image": _normalize(pixels, self.dtype), "label": element["label"]}
    if self.keep_file_name:  # for tests that follow records through the pipeline
      out["file_name"] = np.frombuffer(element["file_name"].ljust(64, b" "), np.uint8)
    return out


class EvalPreprocess(grain.transforms.Map):
  """Decode, centre crop, resize (bicubic), normalise."""

  def __init__(self, image_size: int, dtype: Any = np.float32):
    self.image_size, self.dtype = image_size, dtype

  def map(self, element: dict[str, Any]) -> dict[str, Any]:
    image = _decode(element["jpeg"])
    w, h = image.size
    pixels = _crop_resize(image, _center_window(h, w, self.image_size), self.image_size)
    return {"image": _normalize(pixels, self.dtype), "label": element["label"]}


# ---------------------------------------------------------------------------
# Fake data: standard-normal images, a learnable label.


class FakeImages:
  """A grain data source of `n` standard-normal images (no files).

  Record `i` is drawn from its own generator seeded by `(seed, i)`. The
  label is a fixed function of the image (the sign of one pixel) so that a
  model can fit it: a smoke test can check that the loss goes down.
  """

  def __init__(self, n: int, image_size: int, num_classes: int, seed: int = 0,
               dtype: Any = np.float32):
    self.n, self.image_size, self.num_classes, self.seed = n, image_size, num_classes, seed
    self.dtype = dtype

  def __len__(self) -> int:
    return self.n

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([self.seed, int(i)])
    image = rng.standard_normal((self.image_size, self.image_size, 3), np.float32)
    label = np.int32((image[0, 0, 0] > 0) * (self.num_classes // 2))
    return {"image": image.astype(self.dtype), "label": label}

  def __repr__(self) -> str:
    return (f"FakeImages(n={self.n}, image_size={self.image_size}, "
            f"num_classes={self.num_classes}, seed={self.seed})")


# ---------------------------------------------------------------------------
# The pipelines the training loop uses.


def _dtype(config) -> Any:
  if config.half_precision:
    import ml_dtypes  # noqa: PLC0415  (a jax dependency)

    return ml_dtypes.bfloat16
  return np.float32


def train_loader(config, *, process_index: int | None = None,
                 process_count: int | None = None,
                 keep_file_name: bool = False) -> grain.DataLoader:
  """This process's training batches (`batch_size / process_count` each), endless.

  Args:
    config: `dataset` ("fake" or "imagenet2012"), `data_dir`, `image_size`,
      `num_classes`, `batch_size`, `seed`, `half_precision`,
      `num_train_examples` (fake data), `data_workers` (grain worker
      processes, 0 reads in the training process).
    process_index: this process (default `jax.process_index()`).
    process_count: number of processes (default `jax.process_count()`).
    keep_file_name: ImageNet only: add each record's `file_name` (as 64
      space-padded bytes) to the batches, to follow records in tests.

  Returns:
    A `grain.DataLoader`; its iterator's state goes into the checkpoints.
  """
  import date_optax.parallel as dp  # noqa: PLC0415

  dtype = _dtype(config)
  if config.dataset == "fake":
    source = FakeImages(config.num_train_examples, config.image_size, config.num_classes,
                        seed=config.seed, dtype=dtype)
    ops = ()
  else:
    paths, _ = split_files(config.data_dir, "train", num_classes=config.num_classes)
    source = grain.sources.ArrayRecordDataSource(paths)
    ops = (ParseRecord(), TrainAugment(config.image_size, dtype, keep_file_name))
  return dp.data_loader(source, config.batch_size, seed=config.seed, shuffle=True,
                        operations=ops, worker_count=config.get("data_workers", 0),
                        process_index=process_index, process_count=process_count)


def eval_chunks(config) -> Iterator[dict[str, np.ndarray]]:
  """The evaluation set in chunks of `eval_batch_size` (the last one short).

  The same on every host; `date_optax.parallel.evaluate` gives each host its
  part of a chunk and pads and masks the short last one.
  """
  dtype = _dtype(config)
  if config.dataset == "fake":
    source = FakeImages(config.num_eval_examples, config.image_size, config.num_classes,
                        seed=config.seed + 1, dtype=dtype)
    ds = grain.MapDataset.source(source)
  else:
    paths, _ = split_files(config.data_dir, "validation", num_classes=config.num_classes)
    ds = (grain.MapDataset.source(grain.sources.ArrayRecordDataSource(paths))
          .map(ParseRecord()).map(EvalPreprocess(config.image_size, dtype)))
  return iter(ds.batch(config.eval_batch_size, drop_remainder=False))
