#!/usr/bin/env python3
"""Start the ResNet-50 example on every worker of the slice, in the background.

Each worker runs

  python3 -m examples.resnet50_imagenet.main \
      --config=examples/resnet50_imagenet/configs/<config>.py --workdir=<gs://...>

detached (nohup), writing ~/date_optax_train.log, .pid and .rc; follow it with
logs.py. Arguments after `--` are passed to the example unchanged, e.g.
`-- --config.num_epochs=1`.

  python3 tpu/launch.py --project=my-proj --zone=europe-west4-a \
      --accelerator-type=v3-32 --workdir=gs://my-bucket/resnet50/v3-32 --dry-run
"""

from __future__ import annotations

import sys

import _gcloud


def main(argv=None) -> int:
  return _gcloud.main_step(__doc__, "launch", argv)


if __name__ == "__main__":
  sys.exit(main())
