#!/usr/bin/env python3
"""Install jax[tpu] and date_optax (with its `examples` extra) on every worker.

--source=local copies this checkout's package files to all workers with
`gcloud compute tpus tpu-vm scp --recurse --worker=all`; --source=git clones
--git-url there instead. Either way the package is then pip-installed on all
workers in one resolver run with jax[tpu], and a last command prints what JAX
sees on every worker (all workers must report the same global device count).

  python3 tpu/install.py --project=my-proj --zone=europe-west4-a \
      --accelerator-type=v3-32 --dry-run
  python3 tpu/install.py --project=my-proj --zone=europe-west4-a \
      --name=my-slice --source=git --git-url=https://github.com/ORG/date_optax
"""

from __future__ import annotations

import sys

import _gcloud


def main(argv=None) -> int:
  return _gcloud.main_step(__doc__, "install", argv)


if __name__ == "__main__":
  sys.exit(main())
