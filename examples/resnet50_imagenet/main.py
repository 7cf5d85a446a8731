"""Trains ResNet-50 on ImageNet: one process per host of a TPU slice.

  python3 -m examples.resnet50_imagenet.main \
      --config=examples/resnet50_imagenet/configs/v3_32.py --workdir=gs://BUCKET/run

On a multi-host TPU slice `jax.distributed.initialize()` runs first (it
needs no arguments there); `--nodistributed` skips it, and it is skipped
anyway when the environment variable DATE_OPTAX_NO_DISTRIBUTED is set.
"""

from absl import app

from examples import _main

_main.define_flags("examples/resnet50_imagenet/configs/default.py",
                   "Checkpoints and metrics (gs:// on pods).", distributed=True)


def main(argv):
  _main.train(argv, "examples.resnet50_imagenet.train",
              skip_distributed_env="DATE_OPTAX_NO_DISTRIBUTED")


if __name__ == "__main__":
  app.run(main)
