#!/usr/bin/env python3
"""Create a Cloud TPU VM slice: plain (`tpu-vm create`) or a queued resource.

A queued request is polled until it is ACTIVE. With --num-slices S > 1 it is
one queued resource of S slices (Multislice), nodes NAME-0 .. NAME-(S-1).
Examples:

  python3 tpu/create.py --project=my-proj --zone=europe-west4-a \
      --accelerator-type=v3-32 --dry-run
  python3 tpu/create.py --project=my-proj --zone=us-central2-b \
      --accelerator-type=v4-32 --queued --spot
  python3 tpu/create.py --project=my-proj --zone=us-west4-a \
      --accelerator-type=v5litepod-256 --num-slices=4 --dry-run
"""

from __future__ import annotations

import sys

import _gcloud


def main(argv=None) -> int:
  return _gcloud.main_step(__doc__, "create", argv)


if __name__ == "__main__":
  sys.exit(main())
