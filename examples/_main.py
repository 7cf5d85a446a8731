"""The command line every example shares (the `main.py` of flax's examples).

An example's `main.py` calls `define_flags` when it is imported (the flags
are its own: `--help` lists them) and runs `app.run(main)` with a
`main(argv)` that calls `train` here.
The flags: `--config` (a config file, overridable field by field as
`--config.batch_size=...`), `--workdir` (required) and, where the example
asks for it, `--distributed`.
"""

from __future__ import annotations

import glob
import importlib
import os
from collections.abc import Sequence

from absl import app, flags
from ml_collections import config_flags

FLAGS = flags.FLAGS
# The flags `define_flags` defines belong to the example's main.py that calls
# it (its key flags, listed by --help), not to this module.
flags.disclaim_key_flags()


def define_flags(default_config: str, workdir_help: str,
                 distributed: bool | None = None) -> None:
  """Defines `--workdir`, `--config` (default `default_config`) and `--distributed`.

  Args:
    default_config: the config file `--config` reads unless given another.
    workdir_help: what the example writes into `--workdir`.
    distributed: the default of `--distributed` (call
      `jax.distributed.initialize()` first); None: the example has no such flag.
  """
  flags.DEFINE_string("workdir", None, workdir_help)
  if distributed is not None:
    flags.DEFINE_bool("distributed", distributed,
                      "Call jax.distributed.initialize() (multi-host TPU slices).")
  config_flags.DEFINE_config_file(
      "config", default_config, "Training configuration.", lock_config=True,
  )
  flags.mark_flags_as_required(["workdir"])


def _quiet_libtpu() -> None:
  """On a host without TPU chips, libtpu's compile-only settings (kept if set).

  With ``jax[tpu]`` installed, JAX probes for a TPU when it starts and
  libtpu, finding no TPU VM metadata, prints start-up errors before falling
  back to the GPU or the CPU. On a TPU VM (``/dev/accel*``, ``/dev/vfio``)
  nothing is set: training there needs the real metadata.
  """
  if glob.glob("/dev/accel*") or os.path.isdir("/dev/vfio"):
    return
  import date_optax.parallel as dp  # noqa: PLC0415 - JAX has not started yet

  for key, value in dp.TpuSlice.compile_only_env().items():
    os.environ.setdefault(key, value)


def train(argv: Sequence[str], train_module: str, skip_distributed_env: str | None = None
          ) -> None:
  """Runs `train_module.train_and_evaluate(FLAGS.config, FLAGS.workdir)`.

  Before JAX starts: on a host without TPU chips libtpu is told not to look
  for a TPU VM (no start-up errors where ``jax[tpu]`` is installed); a config
  with a nonzero `cpu_devices` emulates that many
  devices when JAX runs on the CPU (an XLA_FLAGS that already sets a device
  count wins); then `--distributed` (where defined) calls
  `jax.distributed.initialize()`, unless the environment variable
  `skip_distributed_env` is set. `train_module` is imported last.
  """
  if len(argv) > 1:
    raise app.UsageError("Too many command-line arguments.")
  _quiet_libtpu()
  cpu_devices = FLAGS.config.get("cpu_devices")
  xla_flags = os.environ.get("XLA_FLAGS", "")
  if cpu_devices and "device_count" not in xla_flags:
    os.environ["XLA_FLAGS"] = (
        f"{xla_flags} --xla_force_host_platform_device_count={cpu_devices}")
  if "distributed" in FLAGS and FLAGS.distributed and not (
      skip_distributed_env and os.environ.get(skip_distributed_env)):
    import jax  # noqa: PLC0415 - after XLA_FLAGS

    jax.distributed.initialize()
  importlib.import_module(train_module).train_and_evaluate(FLAGS.config, FLAGS.workdir)
