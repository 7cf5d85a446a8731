"""What the ``date-optax`` subcommands' modules share: how a subcommand is added."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def add_subcommand(subparsers: Any, name: str, run: Callable[[argparse.Namespace], int],
                   help: str, description: str, epilog: str) -> argparse.ArgumentParser:
  """Adds subcommand `name`, which runs ``run(args)``, to `subparsers`.

  `description` and `epilog` are printed by ``--help`` as written (their
  command lines keep their line breaks).
  """
  p = subparsers.add_parser(name, help=help, description=description, epilog=epilog,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
  p.set_defaults(func=run)
  return p
