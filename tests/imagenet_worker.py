"""One process of the 2-process ImageNet-input test (not collected by pytest).

    python tests/imagenet_worker.py --port P --process-id I --data-dir D --out FILE

Reads one epoch of this process's training batches through the example's
real pipeline (tfds ArrayRecord -> grain, shard = JAX process), saves the
iterator state of both processes mid-epoch (`iterator_state`, a collective),
restores it into a fresh iterator and checks that the rest of the epoch
comes back bit for bit; writes the file names it read.
"""

from __future__ import annotations

from workers import worker_start

ARGS = worker_start(2, data_dir=str, out=str)

import numpy as np  # noqa: E402

import date_optax.parallel as dp  # noqa: E402
from examples.resnet50_imagenet import input_pipeline  # noqa: E402
from examples.resnet50_imagenet.configs import imagenet_cpu  # noqa: E402


def main():
  args = ARGS
  config = imagenet_cpu.get_config()
  config.data_dir = args.data_dir
  _, n = input_pipeline.split_files(config.data_dir, "train")
  local = config.batch_size // 2
  per_epoch = (n // 2) // local

  def loader():
    return iter(input_pipeline.train_loader(config, keep_file_name=True))

  it = loader()
  batches = [next(it) for _ in range(2)]
  saved = dp.iterator_state(it)  # every process's state, gathered
  assert saved["process_count"] == 2 and len(saved["states"]) == 2
  batches += [next(it) for _ in range(per_epoch - 2)]
  resumed = loader()
  dp.restore_iterator(resumed, saved)
  for b in batches[2:]:
    again = next(resumed)
    for key in ("image", "label", "file_name"):
      np.testing.assert_array_equal(np.asarray(again[key]), np.asarray(b[key]))
  names = np.concatenate([b["file_name"] for b in batches])
  np.savez(args.out, names=names, per_epoch=per_epoch,
           shape=np.asarray(batches[0]["image"].shape))


if __name__ == "__main__":
  main()
