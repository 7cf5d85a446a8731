"""The ResNet example's real-data path: tfds ArrayRecord ImageNet through grain.

A small dataset is written at test time in exactly the tfds on-disk layout
(tests/fake_tfds.py: serialized tf.train.Example records of 64x64 JPEGs in
ArrayRecord files, dataset_info.json, features.json). The tests parse it
without TensorFlow, train and evaluate through the real pipeline, check the
2-process split on 127.0.0.1, and check that a resumed run (iterator state in
the checkpoint) is bit-identical, random crops and flips included.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import fake_tfds  # noqa: E402
from workers import WorkerPair  # noqa: E402

import date_optax.parallel as dp  # noqa: E402
from examples.resnet50_imagenet import input_pipeline  # noqa: E402
from examples.resnet50_imagenet.configs import imagenet_cpu  # noqa: E402

TIMEOUT_S = 180


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("tfds")
  names = fake_tfds.write_imagenet(str(root))
  return str(root), names


def _config(data_dir):
  config = imagenet_cpu.get_config()
  config.data_dir = data_dir
  return config


def test_example_proto_wire_format_is_tensorflows():
  # tensorflow/core/example/{example,feature}.proto written out by hand:
  # Example.features (1) > Features.feature map entry (1) {key (1), value (2)}
  # > Feature.int64_list (3) > Int64List.value (1, packed).
  want = b"\x0a\x10\x0a\x0e\x0a\x05label\x12\x05\x1a\x03\x0a\x01\x03"
  assert input_pipeline.serialize_example({"label": 3}) == want
  assert input_pipeline.parse_example(want) == {"label": 3}
  rec = input_pipeline.serialize_example({"image": b"\xff\xd8jpeg", "file_name": "a.JPEG",
                                          "label": [1, 2]})
  assert input_pipeline.parse_example(rec) == {"image": b"\xff\xd8jpeg",
                                               "file_name": b"a.JPEG", "label": [1, 2]}


def test_bad_data_dirs_name_the_path_and_the_layout(data_dir, tmp_path):
  good, _ = data_dir
  with pytest.raises(FileNotFoundError, match=r"/nope does not exist; expected a tfds"):
    input_pipeline.split_files(str(tmp_path / "nope"), "train")
  with pytest.raises(FileNotFoundError, match=r"no imagenet2012/VERSION/dataset_info.json "
                                              r"under .*empty.*array_record"):
    os.makedirs(tmp_path / "empty")
    input_pipeline.split_files(str(tmp_path / "empty"), "train")
  bad = tmp_path / "tfrecord"
  shutil.copytree(good, bad)
  info_path = bad / "imagenet2012" / fake_tfds.VERSION / "dataset_info.json"
  info = json.loads(info_path.read_text())
  info_path.write_text(json.dumps({**info, "fileFormat": "tfrecord"}))
  with pytest.raises(ValueError, match=r"dataset_info.json says fileFormat 'tfrecord'"):
    input_pipeline.split_files(str(bad), "train")
  info_path.write_text(json.dumps(info))
  os.remove(bad / "imagenet2012" / fake_tfds.VERSION /
            "imagenet2012-train.array_record-00001-of-00002")
  with pytest.raises(FileNotFoundError, match=r"train.array_record-00001-of-00002 is missing"):
    input_pipeline.split_files(str(bad), "train")
  with pytest.raises(ValueError, match="no split 'test'"):
    input_pipeline.split_files(good, "test")
  with pytest.raises(ValueError, match=r"has 10 classes but config.num_classes=1000"):
    input_pipeline.split_files(good, "train", num_classes=1000)
  config = _config(str(tmp_path / "nope"))
  with pytest.raises(FileNotFoundError, match="does not exist"):
    input_pipeline.train_loader(config)
  config = _config(good)
  config.batch_size = 30
  with pytest.raises(ValueError, match="global_batch_size=30 does not divide over the 4"):
    input_pipeline.train_loader(config, process_index=0, process_count=4)


def test_pipeline_decodes_augments_and_resumes_bit_exactly(data_dir):
  root, names = data_dir
  config = _config(root)
  it = iter(input_pipeline.train_loader(config, keep_file_name=True))
  batches = [next(it) for _ in range(12)]  # an epoch is 10 batches of 32
  b = batches[0]
  assert b["image"].shape == (32, 32, 32, 3) and b["label"].dtype == np.int32
  first_epoch = [bytes(n).strip().decode() for x in batches[:10] for n in x["file_name"]]
  assert sorted(first_epoch) == sorted(names["train"])  # every image once per epoch
  # Labels are those stored with each record (the class is in the file name).
  for x in batches[:2]:
    want = [int(bytes(n).strip()[1:9]) for n in x["file_name"]]
    np.testing.assert_array_equal(x["label"], want)
  # bf16 images, normalised per channel; the crops are random (two epochs
  # see the same image differently) and flips happen.
  img = np.asarray(b["image"], np.float32)
  assert b["image"].dtype.name == "bfloat16" and -4 < img.mean() < 4
  # A restored iterator continues with the same images, crops and flips.
  it2 = iter(input_pipeline.train_loader(config, keep_file_name=True))
  next(it2)
  saved = dp.iterator_state(it2)
  it3 = iter(input_pipeline.train_loader(config, keep_file_name=True))
  dp.restore_iterator(it3, saved)
  for x in batches[1:12]:
    y = next(it3)
    np.testing.assert_array_equal(np.asarray(y["image"], np.float32),
                                  np.asarray(x["image"], np.float32))
    np.testing.assert_array_equal(y["file_name"], x["file_name"])
  # Evaluation: the centre crop of every validation image, in order, once.
  chunks = list(input_pipeline.eval_chunks(config))
  assert [len(c["label"]) for c in chunks] == [32, 32]
  e = np.asarray(chunks[0]["image"], np.float32)
  again = np.asarray(next(input_pipeline.eval_chunks(config))["image"], np.float32)
  np.testing.assert_array_equal(e, again)


def test_sample_crop_follows_inception_ranges():
  rng = np.random.default_rng(0)
  for _ in range(200):
    top, left, h, w = input_pipeline.sample_crop(60, 70, rng)
    assert 0 <= top and top + h <= 60 and 0 <= left and left + w <= 70
    assert 0.08 * 4200 * 0.8 <= h * w <= 4200
    assert 3 / 4 * 0.8 <= w / h <= 4 / 3 * 1.25
  # An impossible window (a 1-pixel image cannot hold a 3/4..4/3 crop of
  # area >= 8 % in any of the tries) falls back to the centre crop.
  assert input_pipeline.sample_crop(1, 100, rng) is None


# Slow (~25 s): the fake-data smoke and the two-process read cover the default run.
@pytest.mark.slow
def test_trains_and_evaluates_through_the_real_pipeline(data_dir, tmp_path):
  from examples.resnet50_imagenet import train

  root, _ = data_dir
  config = _config(root)
  config.num_train_steps = 2
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result["steps"] == 2 and np.isfinite(result["loss"])
  assert 0.0 <= result["eval_accuracy"] <= 1.0
  meta = json.loads((tmp_path / "checkpoints" / "2" / "meta" / "metadata").read_text())
  data_state = meta["metadata"]["data"]
  assert data_state["process_count"] == 1
  assert "seed=0" in json.loads(data_state["states"][0])["sampler"]


@pytest.mark.slow
def test_stopped_and_resumed_real_data_run_is_bit_identical(data_dir, tmp_path, monkeypatch):
  import test_examples_resume as resume

  from examples.resnet50_imagenet import train

  root, _ = data_dir
  config = _config(root)
  config.num_train_steps = 13  # past the first epoch (10 steps)
  config.checkpoint_every_steps = 4
  train.train_and_evaluate(config, str(tmp_path / "reference"))
  import date_optax.checkpoint as loop

  with monkeypatch.context() as m:
    m.setattr(loop, "PreemptionGuard", resume._stop_at(7))
    assert train.train_and_evaluate(config, str(tmp_path / "resumed")) == {
        "preempted_at_step": 7}
  train.train_and_evaluate(config, str(tmp_path / "resumed"))
  resume._assert_same(tmp_path / "resumed", tmp_path / "reference")
  # The same workdir with another data seed: refused, not restarted.
  config.seed = 5
  config.num_train_steps = 14
  with pytest.raises(ValueError, match=r"does not match this input pipeline.*seed=0.*seed=5"):
    train.train_and_evaluate(config, str(tmp_path / "resumed"))


def test_two_processes_read_disjoint_shards_that_make_the_epoch(data_dir, tmp_path):
  root, names = data_dir
  pair = WorkerPair(
      os.path.join(HERE, "imagenet_worker.py"),
      lambda i: ["--data-dir", root, "--out", str(tmp_path / f"{i}.npz")],
      [tmp_path / f"log{i}.txt" for i in range(2)], cwd=ROOT, timeout=TIMEOUT_S,
      what="the two input workers")
  for i, rc in enumerate(pair.wait()):
    assert rc == 0, pair.log(i)[-3000:]
  out = [np.load(tmp_path / f"{i}.npz") for i in range(2)]
  read = [{bytes(n).strip().decode() for n in o["names"]} for o in out]
  # Each process reads 160 images, 16 per batch (global 32 / 2 processes).
  assert [len(o["names"]) for o in out] == [160, 160]
  assert list(out[0]["shape"]) == [16, 32, 32, 3]
  assert not read[0] & read[1]
  assert read[0] | read[1] == set(names["train"])
