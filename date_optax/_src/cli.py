"""The ``date-optax`` command line.

Each subcommand lives in its own module, which exposes
``register(subparsers)``: it adds its parser with ``subparsers.add_parser``
and sets ``func`` (``args -> exit code``) as a parser default. To add a
subcommand, write such a module and append it to :data:`SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from date_optax._src import cli_compile, cli_plan, cli_recipe

#: Modules whose ``register(subparsers)`` adds one subcommand each.
SUBCOMMANDS = [cli_recipe, cli_compile, cli_plan]


def build_parser() -> argparse.ArgumentParser:
  """The top-level parser with every registered subcommand."""
  parser = argparse.ArgumentParser(
      prog="date-optax",
      description="Large-batch training tools for JAX/Optax (LEGW, DATE).",
  )
  subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
  subparsers.required = True
  for module in SUBCOMMANDS:
    module.register(subparsers)
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Runs ``date-optax`` with `argv` (default: ``sys.argv[1:]``).

  Returns:
    The exit code (0 on success).
  """
  args = build_parser().parse_args(argv)
  return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
  raise SystemExit(main())
