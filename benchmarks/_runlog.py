"""The resumable run log shared by the accuracy studies (standard library only).

Each finished run is one JSON line with an "ident"; a study restarted with
the same log skips the runs it already has.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from collections.abc import Sequence


def command(script: str, argv: Sequence[str] | None = None) -> str:
  """The command line a table cites: `python benchmarks/<script>` and its flags.

  `argv` defaults to the process's; --report-only, which only rewrites the
  table, is left out.
  """
  return " ".join([f"python benchmarks/{script}", *(
      a for a in (argv or sys.argv[1:]) if a != "--report-only")])


def load_runs(path: str) -> dict[str, dict]:
  """The runs logged in `path` so far, by ident (empty if there is no log)."""
  done = {}
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        rec = json.loads(line)
        done[rec.pop("ident")] = rec
  return done


def log_run(path: str, done: dict[str, dict], ident: str, rec: dict) -> None:
  """Adds a finished run to `done` and appends it to the log at `path`.

  One locked write: studies may share a log.
  """
  done[ident] = rec
  with open(path, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.write(json.dumps(dict(ident=ident, **rec)) + "\n")
    fcntl.flock(f, fcntl.LOCK_UN)
