"""Writes a small ImageNet in the on-disk layout of a tfds ArrayRecord build.

`tfds build imagenet2012 --file_format=array_record` writes, under
DATA_DIR/imagenet2012/5.1.0/: `dataset_info.json` (name, version,
fileFormat, and per split its shardLengths and filepathTemplate),
`features.json` (a FeaturesDict of image/label/file_name), `label.labels.txt`,
and `imagenet2012-{train,validation}.array_record-NNNNN-of-MMMMM` files whose
records are serialized `tf.train.Example`s (image: JPEG bytes, label: int64,
file_name: bytes), written with `group_size:1` for random access. This
module writes exactly that, with generated 64x64 JPEGs whose colour depends
on the class (so a model can learn them). Not collected by pytest.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter
from PIL import Image

from examples.resnet50_imagenet import input_pipeline

VERSION = "5.1.0"
TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"


def _jpeg(label: int, num_classes: int, size: int, rng: np.random.Generator) -> bytes:
  hue = np.array([np.cos(2 * np.pi * label / num_classes),
                  np.sin(2 * np.pi * label / num_classes), 0.0])
  base = 128 + 80 * hue
  h, w = size + int(rng.integers(-8, 9)), size + int(rng.integers(-8, 9))
  pixels = base + rng.normal(0, 30, (h, w, 3))
  img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
  buf = io.BytesIO()
  img.save(buf, format="JPEG", quality=90)
  return buf.getvalue()


def write_imagenet(data_dir: str, *, num_train: int = 320, num_validation: int = 64,
                   num_classes: int = 10, size: int = 64, train_shards: int = 2,
                   seed: int = 0) -> dict[str, list[str]]:
  """Writes the dataset; returns the file names of each split in record order."""
  root = os.path.join(data_dir, input_pipeline.DATASET, VERSION)
  os.makedirs(root, exist_ok=True)
  rng = np.random.default_rng(seed)
  splits, names = [], {}
  for split, n, shards in (("train", num_train, train_shards),
                           ("validation", num_validation, 1)):
    lengths = [len(part) for part in np.array_split(np.arange(n), shards)]
    names[split] = []
    k = 0
    for s, length in enumerate(lengths):
      path = os.path.join(root, f"{input_pipeline.DATASET}-{split}.array_record-"
                                f"{s:05d}-of-{shards:05d}")
      writer = ArrayRecordWriter(path, "group_size:1")
      for _ in range(length):
        label = int(rng.integers(0, num_classes))
        name = f"n{label:08d}_{split}_{k:05d}.JPEG"
        writer.write(input_pipeline.serialize_example(
            {"image": _jpeg(label, num_classes, size, rng), "label": label,
             "file_name": name}))
        names[split].append(name)
        k += 1
      writer.close()
    splits.append({"name": split, "numBytes": "0",
                   "shardLengths": [str(x) for x in lengths],
                   "filepathTemplate": TEMPLATE})
  info = {"name": input_pipeline.DATASET, "version": VERSION,
          "fileFormat": "array_record",
          "moduleName": "tensorflow_datasets.image_classification.imagenet",
          "splits": splits, "description": "a generated stand-in for tests"}
  with open(os.path.join(root, "dataset_info.json"), "w") as f:
    json.dump(info, f, indent=1)
  tfds = "tensorflow_datasets.core.features."
  features = {"pythonClassName": tfds + "features_dict.FeaturesDict", "featuresDict": {
      "features": {
          "image": {"pythonClassName": tfds + "image_feature.Image",
                    "image": {"shape": {"dimensions": ["-1", "-1", "3"]}, "dtype": "uint8",
                              "encodingFormat": "jpeg"}},
          "label": {"pythonClassName": tfds + "class_label_feature.ClassLabel",
                    "classLabel": {"numClasses": str(num_classes)}},
          "file_name": {"pythonClassName": tfds + "text_feature.Text", "text": {}},
      }}}
  with open(os.path.join(root, "features.json"), "w") as f:
    json.dump(features, f, indent=1)
  with open(os.path.join(root, "label.labels.txt"), "w") as f:
    f.write("".join(f"n{c:08d}\n" for c in range(num_classes)))
  return names
