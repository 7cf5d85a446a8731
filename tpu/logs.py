#!/usr/bin/env python3
"""Stream the training log of one worker (default 0) or all of them.

Follows the log until the training process on that worker ends and exits
with its exit status; --no-follow prints the last 200 lines instead.

  python3 tpu/logs.py --project=my-proj --zone=europe-west4-a \
      --accelerator-type=v3-32 --dry-run
"""

from __future__ import annotations

import sys

import _gcloud


def main(argv=None) -> int:
  return _gcloud.main_step(__doc__, "logs", argv)


if __name__ == "__main__":
  sys.exit(main())
