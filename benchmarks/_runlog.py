"""The resumable run log shared by the accuracy studies (standard library only).

Each finished run is one JSON line with an "ident"; a study restarted with
the same log skips the runs it already has. A log is kept in shards of at
most about `SHARD_BYTES` (``name.jsonl``, then ``name.2.jsonl``, ...), so no
tracked file grows past the repository's size limit; readers see them as
one log.
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import json
import os
import sys
from collections.abc import Callable, Sequence


def command(script: str, argv: Sequence[str] | None = None) -> str:
  """The command line a table cites: `python benchmarks/<script>` and its flags.

  `argv` defaults to the process's; --report-only, which only rewrites the
  table, is left out.
  """
  return " ".join([f"python benchmarks/{script}", *(
      a for a in (argv or sys.argv[1:]) if a != "--report-only")])


#: A shard of a log is closed for writing once it holds this many bytes.
SHARD_BYTES = 900_000


def _shard(path: str, i: int) -> str:
  """The i-th shard of the log at `path` (1: `path` itself)."""
  stem = path[: -len(".jsonl")] if path.endswith(".jsonl") else path
  return path if i == 1 else f"{stem}.{i}.jsonl"


def shards(path: str) -> list[str]:
  """`path` and its continuations ``<stem>.2.jsonl``, ``<stem>.3.jsonl``, ...
  that exist, in order."""
  out = [path]
  while os.path.exists(_shard(path, len(out) + 1)):
    out.append(_shard(path, len(out) + 1))
  return out


def load_runs(path: str) -> dict[str, dict]:
  """The runs logged in `path` (and its shards) so far, by ident (empty if
  there is no log); a run logged twice reads as its last record."""
  done = {}
  for part in shards(path):
    if os.path.exists(part):
      with open(part) as f:
        for line in f:
          rec = json.loads(line)
          done[rec.pop("ident")] = rec
  return done


def log_run(path: str, done: dict[str, dict], ident: str, rec: dict) -> None:
  """Adds a finished run to `done` and appends it to the log at `path` (to
  its last shard, or a new one once that holds `SHARD_BYTES`).

  One locked write: studies may share a log.
  """
  done[ident] = rec
  parts = shards(path)
  last = parts[-1]
  if os.path.exists(last) and os.path.getsize(last) >= SHARD_BYTES:
    last = _shard(path, len(parts) + 1)
  with open(last, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.write(json.dumps(dict(ident=ident, **rec)) + "\n")
    fcntl.flock(f, fcntl.LOCK_UN)


def run_and_log(path: str, done: dict[str, dict], ident: str, key: dict,
                train: Callable[[], dict], label: str) -> dict | None:
  """Runs `train()` and logs its record under `ident` as ``dict(key=key, **record)``.

  Returns the logged record, or None, after a ``FAILED <label>: <error>``
  line, when `train` raises: a failed cell must not end the study.
  """
  try:
    rec = train()
  except Exception as e:  # noqa: BLE001 - a failed cell must not end the study
    print(f"FAILED {label}: {e!r}", flush=True)
    return None
  rec = dict(key=key, **rec)
  log_run(path, done, ident, rec)
  return rec


def read_metrics(workdir: str) -> dict[str, dict[int, float]]:
  """An example's ``workdir/metrics.csv`` as ``{name: {step: value}}``."""
  out: dict[str, dict[int, float]] = {}
  with open(os.path.join(workdir, "metrics.csv")) as f:
    for row in csv.DictReader(f):
      out.setdefault(row["name"], {})[int(row["step"])] = float(row["value"])
  return out


def rows_parser(description: str, timeout: float) -> argparse.ArgumentParser:
  """The flags of a study whose named rows each run in a child process.

  ``--only`` (rows whose name starts with it), ``--report-only``,
  ``--timeout`` (seconds per row, default `timeout`) and ``--out`` (the
  output prefix), as tpu_compile.py and pods_today.py take them.
  """
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--only", default="", help="rows whose name starts with this")
  parser.add_argument("--report-only", action="store_true")
  parser.add_argument("--timeout", type=float, default=timeout, help="seconds per row")
  parser.add_argument("--out", default=None, help="output prefix (default docs/studies/...)")
  return parser
