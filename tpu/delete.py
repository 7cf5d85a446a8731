#!/usr/bin/env python3
"""Delete the slice (a queued resource together with its TPU VMs, with --queued
or --num-slices > 1).

Runs without a confirmation prompt (--quiet): check --name first, or look at
the --dry-run output.

  python3 tpu/delete.py --project=my-proj --zone=europe-west4-a \
      --accelerator-type=v3-32 --dry-run
"""

from __future__ import annotations

import sys

import _gcloud


def main(argv=None) -> int:
  return _gcloud.main_step(__doc__, "delete", argv)


if __name__ == "__main__":
  sys.exit(main())
