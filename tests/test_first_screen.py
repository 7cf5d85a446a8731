"""A newcomer's first screen: no libtpu start-up errors on a host without a TPU.

The test extra installs ``jax[tpu]`` into the same venv as ``make demo``;
JAX then probes for a TPU in every process that does not pin its platform,
and libtpu, finding no TPU VM, prints errors before JAX falls back to the
CPU. The entry points a newcomer runs must not show them. These run in
fresh interpreters without ``JAX_PLATFORMS`` (which the tests' conftest
sets for the test process itself).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOISE = ("Failed to find host bounds", "E0000", "INVALID_ARGUMENT", "libtpu_init_utils",
         "could not determine TPU worker")

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                       reason="without libtpu there is no TPU probe to quiet"),
    pytest.mark.skipif(bool(glob.glob("/dev/accel*")) or os.path.isdir("/dev/vfio"),
                       reason="a TPU host: libtpu's start-up is real there"),
]


def _env():
  env = {k: v for k, v in os.environ.items()
         if k not in ("JAX_PLATFORMS", "XLA_FLAGS") and not k.startswith("TPU_")
         and k not in ("ALLOW_MULTIPLE_LIBTPU_LOAD", "TPU_SKIP_MDS_QUERY")}
  return dict(env, PYTHONPATH=str(ROOT))


def _run(args, tmp_path):
  proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=_env(), capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return proc


def test_the_probe_would_print_errors_without_the_entry_points_care(tmp_path):
  # The premise: a bare `import jax; jax.devices()` here does print them.
  proc = _run(["-c", "import jax; jax.devices()"], tmp_path)
  assert any(n in proc.stderr for n in NOISE), proc.stderr[-500:]


def test_make_demo_prints_no_libtpu_errors(tmp_path):
  proc = _run(["-m", "benchmarks.demo", "--workdir", str(tmp_path), "--num-train", "32",
               "--num-test", "32", "--epochs", "6", "--base-batch", "8", "--scale", "2",
               "--devices", "1", "--warmup-epochs", "0.25", "--no-progress"], tmp_path)
  assert "| method | batch |" in proc.stdout
  assert not [n for n in NOISE if n in proc.stderr], proc.stderr[-2000:]


def test_the_examples_entry_quiets_libtpu_before_jax_starts(tmp_path):
  code = ("import sys; sys.argv = ['x']\n"
          "from examples import _main\n"
          "_main._quiet_libtpu()\n"
          "import jax; print(jax.devices()[0].platform)\n")
  proc = _run(["-c", code], tmp_path)
  assert proc.stdout.strip() == "cpu"
  assert not [n for n in NOISE if n in proc.stderr], proc.stderr[-2000:]
