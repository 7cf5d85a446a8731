"""Flags of the Cloud TPU scripts and their validation.

Every check raises argparse.ArgumentTypeError (or calls parser.error), so a
bad value exits with status 2 and one line on stderr that names the flag.
Standard library only (Python >= 3.8): the gcloud scripts must start on any
machine with the Google Cloud CLI, without JAX.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Sequence

from _slices import GENERATIONS, MULTISLICE_GENERATIONS, parse_accelerator_type

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What the example is launched as; see examples/resnet50_imagenet/.
EXAMPLE_MODULE = "examples.resnet50_imagenet.main"
EXAMPLE_CONFIG_DIR = "examples/resnet50_imagenet/configs"

# Files and folders copied to every worker with --source=local: just what
# `pip install .` and the example need (not .venv/, .git/ or outputs).
LOCAL_SOURCES_REQUIRED = ("pyproject.toml", "date_optax")
LOCAL_SOURCES_OPTIONAL = ("README.md", "LICENSE", "examples")


def checked(fn: Callable[[str], object]) -> Callable[[str], object]:
  """Wraps a parser that raises ValueError into an argparse `type=`."""

  def wrapped(value: str):
    try:
      return fn(value)
    except ValueError as e:
      raise argparse.ArgumentTypeError(str(e)) from None

  wrapped.__name__ = fn.__name__
  return wrapped


def _regex(pattern: str, what: str) -> Callable[[str], str]:
  def check(value: str) -> str:
    if not re.fullmatch(pattern, value):
      raise argparse.ArgumentTypeError(f"invalid {what} {value!r}")
    return value

  check.__name__ = what
  return check


# Google Cloud naming rules (project IDs may carry a "domain:" prefix).
_project = _regex(r"([a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]", "project ID")
_zone = _regex(r"[a-z]+-[a-z]+[0-9]+-[a-z]", "zone (e.g. europe-west4-a)")
_resource_name = _regex(
  r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", "name (lowercase letters, digits, -)"
)
_config_name = _regex(r"[A-Za-z0-9_]+", "config name (a file stem such as v3_32)")
_remote_dir = _regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", "remote directory name")
_worker = _regex(r"all|[0-9]+", "worker (a 0-based index or 'all')")


def _gcs_path(value: str) -> str:
  if not re.fullmatch(r"gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/\S*)?", value):
    raise argparse.ArgumentTypeError(
      f"invalid workdir {value!r}: every worker writes checkpoints and metrics "
      "there, so it must be a Cloud Storage path gs://BUCKET[/PATH]"
    )
  return value.rstrip("/")


def _positive_float(value: str) -> float:
  try:
    x = float(value)
  except ValueError:
    x = float("nan")
  if not x > 0:
    raise argparse.ArgumentTypeError(f"must be a positive number, got {value!r}")
  return x


#: Cloud TPU Multislice joins at most this many slices in one job here (the
#: library's `tpu_slice(num_slices=)` takes the same range).
MAX_SLICES = 64


def _num_slices(value: str) -> int:
  try:
    n = int(value)
  except ValueError:
    n = 0
  if not 1 <= n <= MAX_SLICES:
    raise argparse.ArgumentTypeError(
      f"must be an integer from 1 to {MAX_SLICES}, got {value!r}"
    )
  return n


def add_slice_flags(p: argparse.ArgumentParser) -> None:
  """Flags that say which slice a step works on (every script has them)."""
  g = p.add_argument_group("slice")
  g.add_argument(
    "--project", required=True, type=_project, help="Google Cloud project ID."
  )
  g.add_argument("--zone", required=True, type=_zone, help="Zone, e.g. europe-west4-a.")
  g.add_argument(
    "--accelerator-type",
    type=checked(parse_accelerator_type),
    help="Slice type: v2-32, v3-32, v4-32, ... (also v5p-N, v5litepod-N or v5e-N, "
    "v6e-N). Required by create; elsewhere it only supplies the default "
    "--name/--config and the Multislice check.",
  )
  g.add_argument(
    "--name",
    type=_resource_name,
    help="TPU VM (node) name; default date-optax-<accelerator type>. With "
    "--num-slices S > 1 the nodes are NAME-0 .. NAME-(S-1).",
  )
  g.add_argument(
    "--num-slices",
    type=_num_slices,
    default=1,
    metavar="S",
    help=f"Slices joined by Cloud TPU Multislice (1 to {MAX_SLICES}; v4, v5e, "
    "v5p, v6e). S > 1 is always a queued resource (implies --queued) with S "
    "nodes; every step then runs on every node.",
  )
  g.add_argument(
    "--queued",
    action="store_true",
    help="The slice is (to be) a queued resource (gcloud compute tpus "
    "queued-resources) rather than a plain TPU VM.",
  )
  g.add_argument(
    "--queued-resource-id",
    type=_resource_name,
    help="Queued resource ID with --queued; default <name>-qr.",
  )
  g.add_argument(
    "--dry-run",
    action="store_true",
    help="Print the gcloud commands, one per line, shell-quoted; run nothing.",
  )
  g.add_argument(
    "--gcloud", default="gcloud", help="The gcloud executable (default: on PATH)."
  )


def add_create_flags(p: argparse.ArgumentParser) -> None:
  g = p.add_argument_group("create")
  g.add_argument(
    "--runtime-version",
    help="TPU software version; default per generation: tpu-ubuntu2204-base "
    "(v2, v3, v4), v2-alpha-tpuv5 (v5p), v2-alpha-tpuv5-lite (v5litepod), "
    "v2-alpha-tpuv6e (v6e).",
  )
  g.add_argument(
    "--spot", action="store_true", help="Spot capacity (can be preempted)."
  )
  g.add_argument(
    "--preemptible",
    action="store_true",
    help="Legacy preemptible TPU (plain create only; at most 24 h).",
  )
  g.add_argument(
    "--wait-timeout",
    type=_positive_float,
    default=24 * 3600.0,
    help="With --queued: seconds to wait for the request to become ACTIVE.",
  )
  g.add_argument(
    "--poll-interval",
    type=_positive_float,
    default=30.0,
    help="With --queued: seconds between state checks.",
  )


def add_install_flags(p: argparse.ArgumentParser) -> None:
  g = p.add_argument_group("install")
  g.add_argument(
    "--source",
    choices=("local", "git"),
    default="local",
    help="local: copy this checkout to every worker with `tpu-vm scp --recurse`; "
    "git: clone --git-url on every worker. Either way the package is then "
    "pip-installed there.",
  )
  g.add_argument(
    "--repo-dir",
    default=REPO_ROOT,
    help="With --source=local: the checkout to copy (default: this one).",
  )
  g.add_argument("--git-url", help="With --source=git: repository URL to clone.")
  g.add_argument(
    "--git-ref", default="main", help="With --source=git: branch, tag or commit."
  )
  g.add_argument(
    "--jax-spec",
    default="jax[tpu]",
    help="pip requirement for JAX with TPU support (default: jax[tpu]).",
  )
  g.add_argument(
    "--extras",
    default="examples",
    type=_regex(r"[A-Za-z0-9_,-]*", "extras list"),
    help="date-optax extras to install (default: examples; '' for none).",
  )
  g.add_argument(
    "--pip-package",
    action="append",
    default=[],
    help="Extra pip requirement for every worker (repeatable), e.g. "
    "tensorflow-datasets for the input pipeline.",
  )


def add_remote_flags(p: argparse.ArgumentParser) -> None:
  g = p.add_argument_group("workers")
  g.add_argument(
    "--python",
    default="python3",
    type=_regex(r"[A-Za-z0-9_./~-]+", "python executable"),
    help="Python on the workers (default python3, the image's 3.10 on "
    "tpu-ubuntu2204-base).",
  )
  g.add_argument(
    "--remote-dir",
    default="date_optax",
    type=_remote_dir,
    help="Checkout directory on every worker, relative to $HOME.",
  )


def add_launch_flags(p: argparse.ArgumentParser) -> None:
  g = p.add_argument_group("launch")
  g.add_argument(
    "--config",
    type=_config_name,
    help=f"Config file stem under {EXAMPLE_CONFIG_DIR}/; default: the "
    "accelerator type with '_' for '-' (v3-32 -> v3_32).",
  )
  g.add_argument(
    "--workdir",
    type=_gcs_path,
    help="gs:// directory for checkpoints and metrics (required to launch).",
  )


def add_logs_flags(p: argparse.ArgumentParser, follow_flag: bool = True) -> None:
  g = p.add_argument_group("logs")
  g.add_argument(
    "--worker",
    default="0",
    type=_worker,
    help="Whose log to stream: a worker index (default 0) or 'all'.",
  )
  if follow_flag:
    g.add_argument(
      "--no-follow",
      dest="follow",
      action="store_false",
      help="Print the last 200 lines and return instead of following the log "
      "to the end of training.",
    )
  else:
    p.set_defaults(follow=True)


def split_passthrough(argv: Sequence[str]):
  """Splits `argv` at the first "--": (own flags, flags for the example)."""
  argv = list(argv)
  if "--" in argv:
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]
  return argv, []


def check_passthrough(p: argparse.ArgumentParser, extra: Sequence[str]) -> None:
  # `... -- --dry-run` is a slip that would run everything for real.
  if "--dry-run" in extra:
    p.error(
      "argument --dry-run: put it before `--`; what follows `--` goes to the example"
    )


def finish_args(
  p: argparse.ArgumentParser, args: argparse.Namespace, steps: str
) -> None:
  """Cross-flag checks and derived defaults. `steps` names what will run."""
  layout = args.accelerator_type
  if "create" in steps and layout is None:
    p.error("argument --accelerator-type: required to create a slice")
  if args.name is None:
    if layout is None:
      p.error("argument --name: required when --accelerator-type is not given")
    args.name = f"date-optax-{layout.accelerator_type}"
  if args.num_slices > 1:
    if layout is not None and not GENERATIONS[layout.generation].multislice:
      p.error(
        f"argument --num-slices: {layout.generation} slices cannot be joined "
        f"(Multislice runs on {MULTISLICE_GENERATIONS}); use --num-slices=1"
      )
    last = f"{args.name}-{args.num_slices - 1}"
    if len(last) > 63:
      p.error(
        f"argument --name: the last node would be {last}, over 63 characters; "
        "pick a shorter --name"
      )
    # Multislice exists only as a queued resource (Cloud TPU's "Manage TPU
    # resources": "When using Multislice, you must use queued resources").
    args.queued = True
  if args.queued_resource_id is not None and not args.queued:
    p.error("argument --queued-resource-id: only valid with --queued")
  if args.queued and args.queued_resource_id is None:
    args.queued_resource_id = f"{args.name}-qr"
  if "create" in steps:
    if args.spot and args.preemptible:
      p.error("argument --preemptible: not allowed with --spot")
    if args.preemptible and args.queued:
      why = " (--num-slices > 1 is one)" if args.num_slices > 1 else ""
      p.error(
        f"argument --preemptible: not available for queued resources{why}; use --spot"
      )
    if args.runtime_version is None:
      args.runtime_version = GENERATIONS[layout.generation].runtime
    elif not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", args.runtime_version):
      p.error(f"argument --runtime-version: invalid version {args.runtime_version!r}")
  if "install" in steps:
    if args.source == "git":
      if not args.git_url:
        p.error("argument --git-url: required with --source=git")
      if not re.fullmatch(r"(https://|git@|ssh://|git://|file://)\S+", args.git_url):
        p.error(f"argument --git-url: invalid repository URL {args.git_url!r}")
      if not re.fullmatch(r"[A-Za-z0-9_./-]+", args.git_ref):
        p.error(f"argument --git-ref: invalid ref {args.git_ref!r}")
    else:
      if args.git_url:
        p.error("argument --git-url: only valid with --source=git")
      repo = os.path.abspath(args.repo_dir)
      missing = [
        f for f in LOCAL_SOURCES_REQUIRED if not os.path.exists(os.path.join(repo, f))
      ]
      if missing:
        p.error(
          f"argument --repo-dir: {repo} is not a date_optax checkout "
          f"(missing {', '.join(missing)})"
        )
      args.repo_dir = repo
  if "launch" in steps:
    if args.config is None:
      if layout is None:
        p.error("argument --config: required when --accelerator-type is not given")
      args.config = layout.accelerator_type.replace("-", "_")
    if args.workdir is None:
      p.error("argument --workdir: required to launch (a gs:// path)")


# --------------------------------------------------------------------------
# Running commands.


class _HelpFormatter(
  argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter
):
  pass


class _Parser(argparse.ArgumentParser):
  """Refuses bad flags with one line (`prog: error: argument --x: ...`), status 2.

  argparse's default puts the whole usage (eight lines and more) above the
  one line that says what is wrong; `--help` still prints it.
  """

  def error(self, message: str):
    line = message.replace("\n", " ")
    self.exit(2, f"{self.prog}: error: {line}\n")


def make_parser(description: str) -> argparse.ArgumentParser:
  return _Parser(description=description, formatter_class=_HelpFormatter)
