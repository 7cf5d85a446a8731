#!/usr/bin/env python3
"""End to end: create -> install -> launch -> stream logs -> delete.

First checks that no slice (or queued request) of that name exists, since
the slice is deleted in a `finally` block whatever happens after the create
command was issued: a failed step, a failed training run, Ctrl-C, SIGTERM or
SIGHUP (the deletion itself ignores further interrupts). --keep skips the
deletion. Exits with the training run's exit status on worker --worker, or
with the status of the first step that failed.

Takes the flags of create.py, install.py, launch.py and logs.py; arguments
after `--` go to the example.

  python3 tpu/run_all.py --project=my-proj --zone=europe-west4-a \
      --accelerator-type=v3-32 --workdir=gs://my-bucket/resnet50/v3-32 --dry-run
"""

from __future__ import annotations

import sys

import _flags
import _gcloud


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  own, extra = _flags.split_passthrough(argv)
  p = _flags.make_parser(__doc__)
  _flags.add_slice_flags(p)
  _flags.add_create_flags(p)
  _flags.add_install_flags(p)
  _flags.add_remote_flags(p)
  _flags.add_launch_flags(p)
  _flags.add_logs_flags(p, follow_flag=False)
  p.add_argument(
    "--keep", action="store_true", help="Do not delete the slice at the end."
  )
  args = p.parse_args(own)
  _flags.check_passthrough(p, extra)
  _flags.finish_args(p, args, "create,install,launch,logs")
  runner = _gcloud.Runner(args.gcloud, args.dry_run)
  _gcloud.raise_on_termination()

  try:
    _gcloud.check_name_is_free(args, runner)
  except _gcloud.NameTaken as e:
    print(f"error: {e}", file=sys.stderr)
    return 1

  rc = 1
  issued_create = False
  try:
    # Set before the create command: a create that fails half-way (a queued
    # request that never becomes ACTIVE, a timeout) can still leave a billed
    # resource behind, and the name was free before it.
    issued_create = True
    _gcloud.create_slice(args, runner)
    _gcloud.install(args, runner)
    _gcloud.launch(args, runner, extra)
    rc = _gcloud.stream_logs(args, runner)
    if rc:
      runner.note(f"training exited with status {rc} on worker {args.worker}")
  except _gcloud.StepFailed as e:
    print(f"error: {e}", file=sys.stderr)
    rc = e.returncode or 1
  except (RuntimeError, TimeoutError) as e:
    print(f"error: {e}", file=sys.stderr)
    rc = 1
  except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    rc = 130
  finally:
    if issued_create and not args.keep:
      if _gcloud.delete_slice(args, runner):
        runner.note(
          f"warning: deleting {args.name} failed; check "
          f"`gcloud compute tpus tpu-vm list --zone={args.zone}` "
          "and delete it by hand"
        )
    elif issued_create:
      runner.note(f"--keep: {args.name} is still running (and billed)")
  return rc


if __name__ == "__main__":
  sys.exit(main())
