"""The resumable run log shared by the accuracy studies (standard library only).

Each finished run is one JSON line with an "ident"; a study restarted with
the same log skips the runs it already has.
"""

from __future__ import annotations

import json
import os


def load_runs(path: str) -> dict[str, dict]:
  """The runs logged in `path` so far, by ident (empty if there is no log)."""
  done = {}
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        rec = json.loads(line)
        done[rec.pop("ident")] = rec
  return done
