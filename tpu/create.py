#!/usr/bin/env python3
"""Create a Cloud TPU VM slice: plain (`tpu-vm create`) or a queued resource.

A queued request is polled until it is ACTIVE. Examples:

  python3 tpu/create.py --project=my-proj --zone=europe-west4-a \
      --accelerator-type=v3-32 --dry-run
  python3 tpu/create.py --project=my-proj --zone=us-central2-b \
      --accelerator-type=v4-32 --queued --spot
"""

from __future__ import annotations

import sys

import _gcloud


def main(argv=None) -> int:
  return _gcloud.main_step(__doc__, "create", argv)


if __name__ == "__main__":
  sys.exit(main())
