"""Tests of the Cloud TPU scripts in tpu/.

Every script runs in a subprocess, as a user would run it. With --dry-run the
printed gcloud lines are compared exactly; bad flags must exit non-zero with
a message naming the flag and print no command. The end-to-end wrapper also
runs for real against a fake `gcloud` that executes the workers' commands in
a local bash (HOME = a temporary directory), which checks the shell quoting,
the detached launch, the log streaming, the exit status and the slice
deletion on failure and on SIGTERM. No Google Cloud access is needed.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TPU = ROOT / "tpu"
WHERE = ["--project=my-proj", "--zone=europe-west4-a"]
Q_WHERE = "--project=my-proj --zone=europe-west4-a"

needs_unix_tools = pytest.mark.skipif(
  shutil.which("bash") is None or shutil.which("tail") is None,
  reason="needs bash and tail",
)


def load(script):
  """Imports tpu/<script> as a module (to call its main(argv) in-process)."""
  if str(TPU) not in sys.path:
    sys.path.insert(0, str(TPU))
  name = "tpu_script_" + script[: -len(".py")]
  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(name, TPU / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
  return sys.modules[name]


def run(script, *args, env=None, timeout=60):
  return subprocess.run(
    [sys.executable, str(TPU / script), *args],
    capture_output=True,
    text=True,
    env=env,
    timeout=timeout,
  )


@pytest.fixture(autouse=True, scope="module")
def no_real_gcloud(tmp_path_factory):
  """Puts a `gcloud` that always fails first on PATH: a test that wrongly
  runs a command instead of printing it cannot reach Google Cloud."""
  guard = tmp_path_factory.mktemp("guard")
  (guard / "gcloud").write_text("#!/bin/sh\necho 'guard: real gcloud' >&2\nexit 99\n")
  (guard / "gcloud").chmod(0o755)
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("PATH", f"{guard}{os.pathsep}{os.environ['PATH']}")
    yield


def dry(script, *args):
  res = run(script, *WHERE, "--dry-run", *args)
  assert res.returncode == 0, res.stderr
  return res.stdout.splitlines()


@pytest.fixture
def repo(tmp_path):
  """A minimal checkout: what --source=local copies to the workers."""
  r = tmp_path / "repo"
  (r / "date_optax").mkdir(parents=True)
  (r / "date_optax" / "__init__.py").write_text("")
  (r / "examples" / "resnet50_imagenet" / "configs").mkdir(parents=True)
  (r / "examples" / "resnet50_imagenet" / "configs" / "v3_32.py").write_text("")
  for f in ("pyproject.toml", "README.md", "LICENSE"):
    (r / f).write_text("")
  return r


# ---------------------------------------------------------------- create


def test_create_plain():
  assert dry("create.py", "--accelerator-type=v3-32") == [
    "gcloud compute tpus tpu-vm create date-optax-v3-32 " + Q_WHERE
    + " --accelerator-type=v3-32 --version=tpu-ubuntu2204-base"
  ]


@pytest.mark.parametrize(
  "accel, runtime",
  [
    ("v2-32", "tpu-ubuntu2204-base"),
    ("v3-32", "tpu-ubuntu2204-base"),
    ("v4-32", "tpu-ubuntu2204-base"),
    ("v5p-8", "v2-alpha-tpuv5"),
    ("v5litepod-16", "v2-alpha-tpuv5-lite"),
    ("v6e-8", "v2-alpha-tpuv6e"),
  ],
)
def test_create_default_runtime_per_generation(accel, runtime):
  (line,) = dry("create.py", f"--accelerator-type={accel}")
  words = shlex.split(line)
  assert f"--accelerator-type={accel}" in words
  assert f"--version={runtime}" in words
  assert words[5] == f"date-optax-{accel}"


def test_create_options():
  assert dry(
    "create.py", "--accelerator-type=v2-32", "--name=exp1", "--spot",
    "--runtime-version=tpu-vm-base",
  ) == [
    "gcloud compute tpus tpu-vm create exp1 " + Q_WHERE
    + " --accelerator-type=v2-32 --version=tpu-vm-base --spot"
  ]  # fmt: skip
  assert dry("create.py", "--accelerator-type=v2-32", "--preemptible") == [
    "gcloud compute tpus tpu-vm create date-optax-v2-32 " + Q_WHERE
    + " --accelerator-type=v2-32 --version=tpu-ubuntu2204-base --preemptible"
  ]


def test_create_queued():
  assert dry("create.py", "--accelerator-type=v4-32", "--queued", "--spot") == [
    "gcloud compute tpus queued-resources create date-optax-v4-32-qr " + Q_WHERE
    + " --node-id=date-optax-v4-32 --accelerator-type=v4-32"
    " --runtime-version=tpu-ubuntu2204-base --spot",
    "gcloud compute tpus queued-resources describe date-optax-v4-32-qr " + Q_WHERE
    + " --format='value(state.state)'",
  ]
  lines = dry(
    "create.py", "--accelerator-type=v4-32", "--queued", "--name=n1",
    "--queued-resource-id=req1",
  )  # fmt: skip
  assert lines[0].startswith("gcloud compute tpus queued-resources create req1 ")
  assert "--node-id=n1" in lines[0].split()
  assert "--spot" not in lines[0].split()


# ---------------------------------------------------------------- install


def test_install_local(repo):
  r = str(repo)
  assert dry("install.py", "--accelerator-type=v3-32", f"--repo-dir={r}") == [
    "gcloud compute tpus tpu-vm ssh date-optax-v3-32 " + Q_WHERE
    + " --worker=all --command='rm -rf date_optax && mkdir -p date_optax'",
    f"gcloud compute tpus tpu-vm scp --recurse {r}/pyproject.toml {r}/date_optax"
    f" {r}/README.md {r}/LICENSE {r}/examples date-optax-v3-32:date_optax "
    + Q_WHERE + " --worker=all",
    "gcloud compute tpus tpu-vm ssh date-optax-v3-32 " + Q_WHERE
    + " --worker=all --command='cd date_optax && python3 -m pip install -U pip"
    ' && python3 -m pip install -U "jax[tpu]" ".[examples]"\'',
    "gcloud compute tpus tpu-vm ssh date-optax-v3-32 " + Q_WHERE
    + " --worker=all --command='cd date_optax && python3 -c '\"'\"'import jax;"
    ' print(f"worker {jax.process_index()} of {jax.process_count()}:'
    " {jax.local_device_count()} local / {jax.device_count()} global devices,"
    ' {jax.devices()[0].device_kind}")\'"\'"\'\'',
  ]


def test_install_git_and_options():
  lines = dry(
    "install.py", "--name=exp1", "--source=git",
    "--git-url=https://github.com/org/date_optax.git", "--git-ref=v0.1.0",
    "--python=python3.12", "--remote-dir=dopt", "--extras=",
    "--pip-package=tensorflow-datasets>=4.9",
  )  # fmt: skip
  assert len(lines) == 2
  install = shlex.split(lines[0])
  assert install[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "exp1"]
  assert "--worker=all" in install
  (command,) = [w for w in install if w.startswith("--command=")]
  assert command == (
    "--command=rm -rf dopt && git clone https://github.com/org/date_optax.git dopt"
    " && cd dopt && git checkout v0.1.0 && python3.12 -m pip install -U pip &&"
    ' python3.12 -m pip install -U "jax[tpu]" . "tensorflow-datasets>=4.9"'
  )
  assert "cd dopt && python3.12 -c " in lines[1]


# ---------------------------------------------------------------- launch


def test_launch():
  (line,) = dry(
    "launch.py", "--accelerator-type=v3-32", "--workdir=gs://bkt/runs/v3/"
  )  # fmt: skip
  assert line == (
    "gcloud compute tpus tpu-vm ssh date-optax-v3-32 " + Q_WHERE + " --worker=all"
    " --command='cd date_optax && rm -f \"$HOME/date_optax_train.rc\" && :"
    ' > "$HOME/date_optax_train.log" && { nohup'
    " bash -c '\"'\"'python3 -m examples.resnet50_imagenet.main"
    " --config=examples/resnet50_imagenet/configs/v3_32.py --workdir=gs://bkt/runs/v3;"
    ' echo $? > "$HOME/date_optax_train.rc"\'"\'"\' >> "$HOME/date_optax_train.log"'
    ' 2>&1 < /dev/null & echo $! > "$HOME/date_optax_train.pid"; }\''
  )


def test_launch_config_flag_and_passthrough():
  (line,) = dry(
    "launch.py", "--name=exp1", "--config=default", "--workdir=gs://bkt/x",
    "--", "--config.num_epochs=1", "--config.half_precision=False",
  )  # fmt: skip
  command = shlex.split(line)[-1]
  assert command.startswith("--command=")
  # The worker's shell runs `bash -c INNER`: unpack INNER and check the argv.
  words = shlex.split(command[len("--command=") :])
  inner = words[words.index("-c") + 1]
  train = shlex.split(inner.split(";")[0])
  assert train == [
    "python3", "-m", "examples.resnet50_imagenet.main",
    "--config=examples/resnet50_imagenet/configs/default.py",
    "--workdir=gs://bkt/x", "--config.num_epochs=1", "--config.half_precision=False",
  ]  # fmt: skip


def test_launch_default_config_follows_accelerator():
  for accel in ("v2-32", "v4-32"):
    (line,) = dry("launch.py", f"--accelerator-type={accel}", "--workdir=gs://bkt/w")
    cfg = accel.replace("-", "_")
    assert f"--config=examples/resnet50_imagenet/configs/{cfg}.py" in line


# ---------------------------------------------------------------- logs, delete


def test_logs():
  follow = (
    " --command='tail -n +1 -f --pid=\"$(cat \"$HOME/date_optax_train.pid\")\""
    ' "$HOME/date_optax_train.log"; exit "$(cat "$HOME/date_optax_train.rc"'
    " 2>/dev/null || echo 1)\"'"
  )
  head = "gcloud compute tpus tpu-vm ssh date-optax-v3-32 " + Q_WHERE
  assert dry("logs.py", "--accelerator-type=v3-32") == [head + " --worker=0" + follow]
  assert dry("logs.py", "--accelerator-type=v3-32", "--worker=all") == [
    head + " --worker=all" + follow
  ]
  assert dry("logs.py", "--accelerator-type=v3-32", "--worker=2", "--no-follow") == [
    head + " --worker=2 --command='tail -n 200 \"$HOME/date_optax_train.log\"'"
  ]


def test_delete():
  assert dry("delete.py", "--accelerator-type=v3-32") == [
    "gcloud compute tpus tpu-vm delete date-optax-v3-32 " + Q_WHERE + " --quiet"
  ]
  assert dry("delete.py", "--name=exp1", "--queued") == [
    "gcloud compute tpus queued-resources delete exp1-qr " + Q_WHERE
    + " --force --quiet"
  ]


# ---------------------------------------------------------------- run_all


def test_run_all_dry_run_is_the_steps_in_order(repo):
  common = ["--accelerator-type=v4-32", "--queued"]
  repo_dir = f"--repo-dir={repo}"
  lines = dry(
    "run_all.py", *common, repo_dir, "--workdir=gs://bkt/w", "--", "--config.x=1"
  )  # fmt: skip
  probe = (
    "gcloud compute tpus queued-resources describe date-optax-v4-32-qr " + Q_WHERE
    + " --format='value(name)'"
  )
  expected = (
    [probe]
    + dry("create.py", *common)
    + dry("install.py", *common, repo_dir)
    + dry("launch.py", *common, "--workdir=gs://bkt/w", "--", "--config.x=1")
    + dry("logs.py", *common)
    + dry("delete.py", *common)
  )
  assert lines == expected
  assert len(lines) == 10
  assert lines[-1].endswith("--force --quiet")
  kept = dry(
    "run_all.py", *common, repo_dir, "--workdir=gs://bkt/w", "--keep", "--",
    "--config.x=1",
  )  # fmt: skip
  assert kept == lines[:-1]


def test_v5e_is_v5litepod():
  assert dry("create.py", "--accelerator-type=v5e-16") == (
    dry("create.py", "--accelerator-type=v5litepod-16")
  )
  (line,) = dry("create.py", "--accelerator-type=v5e-16")
  assert line == (
    "gcloud compute tpus tpu-vm create date-optax-v5litepod-16 " + Q_WHERE
    + " --accelerator-type=v5litepod-16 --version=v2-alpha-tpuv5-lite"
  )
  (line,) = dry("launch.py", "--accelerator-type=v5e-16", GS)
  assert "configs/v5litepod_16.py" in line


# ---------------------------------------------------------------- bad flags


V3 = "--accelerator-type=v3-32"
GS = "--workdir=gs://bkt/w"


@pytest.mark.parametrize(
  "script, args, flag",
  [
    ("create.py", ["--accelerator-type=v9-32"], "--accelerator-type"),
    ("create.py", ["--accelerator-type=v3-16"], "--accelerator-type"),
    ("create.py", ["--accelerator-type=tpu"], "--accelerator-type"),
    ("create.py", [], "--accelerator-type"),
    ("create.py", [V3, "--spot", "--preemptible"], "--preemptible"),
    ("create.py", [V3, "--queued", "--preemptible"], "--preemptible"),
    ("create.py", [V3, "--queued-resource-id=r"], "--queued-resource-id"),
    ("create.py", [V3, "--wait-timeout=0"], "--wait-timeout"),
    ("create.py", [V3, "--name=My_TPU"], "--name"),
    ("create.py", [V3, "--runtime-version=a b"], "--runtime-version"),
    ("delete.py", [], "--name"),
    ("install.py", ["--name=n", "--source=git"], "--git-url"),
    ("install.py", ["--name=n", "--source=git", "--git-url=not a url"], "--git-url"),
    ("install.py", ["--name=n", "--source=svn"], "--source"),
    ("install.py", ["--name=n", "--repo-dir=/nonexistent"], "--repo-dir"),
    ("install.py", ["--name=n", "--remote-dir=.."], "--remote-dir"),
    ("install.py", ["--name=n", "--remote-dir=/etc"], "--remote-dir"),
    ("launch.py", [V3], "--workdir"),
    ("launch.py", [V3, "--workdir=/tmp/w"], "--workdir"),
    ("launch.py", ["--name=n", GS], "--config"),
    ("launch.py", ["--name=n", GS, "--config=../x"], "--config"),
    ("logs.py", ["--name=n", "--worker=first"], "--worker"),
    ("run_all.py", [V3], "--workdir"),
    ("run_all.py", ["--accelerator-type=v3-33", GS], "--accelerator-type"),
    # A --dry-run after `--` would go to the example and run the real thing.
    ("launch.py", ["--name=n", "--config=c", GS, "--", "--dry-run"], "--dry-run"),
    ("run_all.py", [V3, GS, "--", "--dry-run"], "--dry-run"),
  ],
)
def test_bad_flags_exit_nonzero_naming_the_flag(script, args, flag, capsys):
  # In-process (the scripts' main(argv)) to keep the suite fast; the exit
  # status of the real command line is checked by the test below.
  with pytest.raises(SystemExit) as exc:
    load(script).main([*WHERE, "--dry-run", *args])
  out, err = capsys.readouterr()
  assert exc.value.code == 2, (out, err)
  assert f"argument {flag}" in err, err
  assert out == ""  # no command printed


def test_bad_flag_exit_status_as_a_command():
  res = run("create.py", *WHERE, "--accelerator-type=v3-31")
  assert res.returncode == 2
  assert "argument --accelerator-type: unknown accelerator type 'v3-31'" in res.stderr
  assert "v3-8, v3-32, v3-64" in res.stderr  # says what is allowed
  assert res.stdout == ""


@pytest.mark.parametrize(
  "args, flag",
  [
    (["--zone=europe-west4-a"], "--project"),
    (["--project=my-proj"], "--zone"),
    (["--project=My Project", "--zone=europe-west4-a"], "--project"),
    (["--project=my-proj", "--zone=europe"], "--zone"),
  ],
)
def test_bad_project_or_zone(args, flag, capsys):
  with pytest.raises(SystemExit) as exc:
    load("create.py").main([*args, "--accelerator-type=v3-32", "--dry-run"])
  out, err = capsys.readouterr()
  assert exc.value.code == 2
  assert flag in err and out == ""


# ---------------------------------------------------------------- plan / README


def test_plan_matches_spec_table_and_readme():
  res = run("plan.py")
  assert res.returncode == 0, res.stderr
  rows = {}
  for line in res.stdout.splitlines():
    cells = [c.strip() for c in line.strip("|").split("|")]
    if len(cells) == 9 and cells[0].isdigit():
      rows[int(cells[0])] = cells
  # LEGW Table 1 (You et al., 2018): B = 1024 * 2^j, LR 2^(2.5 + j/2), warmup
  # 0.3125 * 2^j epochs; 90 epochs of the 1,281,167 ImageNet images.
  n = 1_281_167
  for j in range(6):
    b = 1024 * 2**j
    cells = rows[b]
    assert cells[2] == f"2^{2.5 + 0.5 * j:.1f} = {2 ** (2.5 + 0.5 * j):.3f}"
    assert float(cells[3]) == 0.3125 * 2**j
    assert int(cells[5]) == math.ceil(90 * n / b)
    assert int(cells[6]) == 391  # LEGW keeps the warmup iterations constant
    assert int(cells[7]) == b // 128
  assert "v2-32, v3-32, v4-32" in rows[4096][8]
  readme = (TPU / "README.md").read_text()
  assert res.stdout.strip() in readme, "tpu/README.md tables are stale: rerun plan.py"


def test_readme_dry_run_sample_is_the_real_output(repo):
  readme = (TPU / "README.md").read_text()
  sample = readme.split("```text\n")[1].split("```")[0]
  res = run(
    "run_all.py", "--project=my-project", "--zone=europe-west4-a", "--dry-run",
    "--accelerator-type=v3-32", f"--repo-dir={repo}",
    "--workdir=gs://my-bucket/resnet50/v3-32",
  )  # fmt: skip
  assert res.returncode == 0, res.stderr
  assert sample == res.stdout.replace(str(repo), "/path/to/checkout")


def test_plan_slice_rows():
  res = run("plan.py")
  lines = res.stdout.splitlines()
  # 32 TensorCores x 128 = 4096; v2/v3 expose one JAX device per core (2
  # ghost groups of 64), v4 one per chip (two cores: 256, 4 groups).
  expect = {
    "v2-32": ["16", "32", "32", "4", "8 GiB per TensorCore", "4096", "128",
              "2 ghost groups per device"],
    "v3-32": ["16", "32", "32", "4", "16 GiB per TensorCore", "4096", "128",
              "2 ghost groups per device"],
    "v4-32": ["16", "32", "16", "4", "32 GiB per chip", "4096", "256",
              "4 ghost groups per device"],
  }  # fmt: skip
  for accel, cells in expect.items():
    (row,) = [line for line in lines if line.startswith(f"| {accel} |")]
    assert [c.strip() for c in row.strip("|").split("|")][1:] == cells
  bad = run("plan.py", "--accelerator-type=v3-7")
  assert bad.returncode == 2 and "argument --accelerator-type" in bad.stderr



@pytest.mark.parametrize("accel,per_core", [
    ("v3-32", 96), ("v3-32", 32), ("v4-32", 128), ("v2-8", 16), ("v4-128", 64)])
def test_plan_cells_are_the_librarys(accel, per_core, capsys):
  """Every BN and recipe cell of plan.py is what date_optax itself computes
  (its main in this process; the command line runs in the tests above)."""
  import date_optax
  from date_optax.nn import bn_group_layout

  plan = load("plan.py")
  lay = plan._slices.parse_accelerator_type(accel)
  batch = lay.cores * per_core
  per_device = batch // lay.devices
  cell = plan.bn_cell(batch, lay.devices, 64)
  try:
    layout = bn_group_layout(64, per_device_batch=per_device, num_replicas=lay.devices)
  except ValueError:
    # The plan must refuse exactly where the library refuses.
    assert cell.startswith("no layout of 64"), cell
  else:
    if layout.group_size > 1:
      assert cell == f"distributed BN over {layout.group_size} devices"
    elif layout.ghosts_per_device > 1:
      assert cell == f"{layout.ghosts_per_device} ghost groups per device"
    else:
      assert cell == "1 group per device"
  capsys.readouterr()
  assert plan.main([f"--accelerator-type={accel}", f"--batch-per-core={per_core}"]) == 0
  (row,) = [ln for ln in capsys.readouterr().out.splitlines()
            if ln.startswith(f"| {batch} | ")][:1]
  cells = [c.strip() for c in row.strip("|").split("|")]
  recipe = date_optax.scale_recipe(plan.RESNET50, batch)
  assert cells[2].endswith(f"= {recipe.peak_learning_rate:.3f}")
  assert float(cells[3]) == pytest.approx(recipe.warmup_epochs)
  assert int(cells[5]) == recipe.total_steps
  assert int(cells[6]) == recipe.warmup_steps


def test_plan_refuses_the_bn_layout_the_library_refuses():
  # 96 examples per device cannot hold ghosts of exactly 64: the library
  # refuses, and so does the plan (it once printed "1 group per device").
  res = run("plan.py", "--accelerator-type=v3-32", "--batch-per-core=96")
  (row,) = [ln for ln in res.stdout.splitlines() if ln.startswith("| v3-32 |")]
  assert row.rstrip(" |").endswith("no layout of 64 (nearest: 48, 96)")

# ---------------------------------------------------------------- fake gcloud

# The fakes are bash, not Python: each run starts about fifteen of them.
FAKE_GCLOUD = r'''#!/usr/bin/env bash
set -u
# One write per call: the per-node calls run at once and append to one log.
line=$(printf '%s\t' "$@"); printf '%s\n' "$line" >> "$FAKE_GCLOUD_LOG"
if [ -n "${FAKE_GCLOUD_FAIL:-}" ] && [[ " $* " == *"$FAKE_GCLOUD_FAIL"* ]]; then
  exit 7
fi
# With FAKE_PER_NODE each node (TPU VM) has its own home, $FAKE_HOME/<node>.
home="$FAKE_HOME"
case "$4" in
  ssh)
    for a in "$@"; do
      case "$a" in --command=*) cmd="${a#--command=}" ;; esac
    done
    if [ -n "${FAKE_PER_NODE:-}" ]; then home="$FAKE_HOME/$5"; mkdir -p "$home"; fi
    cd "$home" || exit 1
    if [[ "$cmd" == *nohup* ]]; then
      # The launch. Keep the worker's shell alive to reap the detached job
      # as soon as it ends (as systemd does on a VM; this sandbox's init is
      # slow to reap orphans, which would keep `tail --pid` waiting).
      rm -f date_optax_train.pid
      HOME="$home" bash -c "$cmd; wait" > /dev/null 2>&1 &
      for _ in $(seq 500); do [ -s date_optax_train.pid ] && exit 0; sleep 0.01; done
      exit 1
    fi
    HOME="$home" exec bash -c "$cmd" ;;
  scp)
    words=()
    for a in "${@:5}"; do
      case "$a" in --*) ;; *) words+=("$a") ;; esac
    done
    if [ -n "${FAKE_PER_NODE:-}" ]; then home="$FAKE_HOME/${words[-1]%%:*}"; fi
    dest="$home/${words[-1]#*:}"
    cp -R "${words[@]:0:${#words[@]}-1}" "$dest/" ;;
  describe)
    case " $* " in
      *"value(state.state)"*) echo ACTIVE ;;  # polling a queued request
      *) [ -n "${FAKE_EXISTS:-}" ] || exit 1 ;;  # "not found"
    esac ;;
esac
'''

FAKE_PYTHON = r'''#!/usr/bin/env bash
case "$1 $2" in
  "-m pip"|"-c "*) echo "fake $1"; exit 0 ;;
  "-m examples.resnet50_imagenet.main") ;;
  *) echo "unexpected: $*"; exit 99 ;;
esac
shift 2
config="${1#--config=}"
found=False; [ -f "$config" ] && found=True
echo "training $* config found: $found"
if [ -n "${FAKE_STOP:-}" ]; then
  for _ in $(seq 600); do [ -e "$FAKE_STOP" ] && break; sleep 0.05; done
fi
echo done
exit "${FAKE_TRAIN_RC:-0}"
'''


@pytest.fixture
def fake_cloud(tmp_path, repo):
  home = tmp_path / "home"
  home.mkdir()
  gcloud, python = tmp_path / "gcloud", tmp_path / "python"
  for path, text in ((gcloud, FAKE_GCLOUD), (python, FAKE_PYTHON)):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
  log = tmp_path / "gcloud.jsonl"
  env = dict(os.environ, FAKE_GCLOUD_LOG=str(log), FAKE_HOME=str(home))
  args = [
    *WHERE, "--accelerator-type=v3-32", f"--repo-dir={repo}", f"--gcloud={gcloud}",
    f"--python={python}", "--workdir=gs://bkt/run",
  ]  # fmt: skip

  def calls():
    if not log.exists():
      return []
    # Only complete lines: the fake may be writing one right now.
    return [line.split("\t")[:4] for line in log.read_text().split("\n")[:-1]]

  return env, args, calls, home


def _verbs(calls):
  return [" ".join(c[2:4]) for c in calls]


@needs_unix_tools
def test_run_all_for_real_with_fake_gcloud(fake_cloud):
  env, args, calls, home = fake_cloud
  res = run("run_all.py", *args, "--", "--config.num_epochs=1", env=env)
  assert res.returncode == 0, res.stderr
  assert _verbs(calls()) == [
    "tpu-vm describe", "tpu-vm create", "tpu-vm ssh", "tpu-vm scp", "tpu-vm ssh",
    "tpu-vm ssh", "tpu-vm ssh", "tpu-vm ssh", "tpu-vm delete",
  ]  # fmt: skip
  # The streamed log is the training output of the copied tree.
  assert (
    "training --config=examples/resnet50_imagenet/configs/v3_32.py "
    "--workdir=gs://bkt/run --config.num_epochs=1 config found: True"
  ) in res.stdout
  assert (home / "date_optax" / "date_optax" / "__init__.py").exists()
  assert (home / "date_optax_train.rc").read_text().strip() == "0"


@needs_unix_tools
def test_run_all_deletes_after_failed_training_or_step(fake_cloud):
  env, args, calls, _ = fake_cloud
  res = run("run_all.py", *args, env=dict(env, FAKE_TRAIN_RC="3"))
  assert res.returncode == 3  # the training run's status
  assert _verbs(calls())[-1] == "tpu-vm delete"
  n = len(calls())
  # A failing install: no launch, the slice is still deleted.
  res = run("run_all.py", *args, "--queued", env=dict(env, FAKE_GCLOUD_FAIL=" scp "))
  assert res.returncode == 7
  assert "command failed with exit status 7" in res.stderr
  assert _verbs(calls()[n:]) == [
    "queued-resources describe", "queued-resources create",
    "queued-resources describe", "tpu-vm ssh", "tpu-vm scp", "queued-resources delete",
  ]  # fmt: skip


@needs_unix_tools
def test_run_all_deletes_on_sigterm(fake_cloud, tmp_path):
  env, args, calls, _ = fake_cloud
  stop = tmp_path / "stop"
  proc = subprocess.Popen(
    [sys.executable, str(TPU / "run_all.py"), *args],
    env=dict(env, FAKE_STOP=str(stop)),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    deadline = time.time() + 20
    while len(calls()) < 8 and time.time() < deadline:  # streaming the log
      time.sleep(0.05)
    assert len(calls()) == 8
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
  finally:
    stop.touch()  # ends the fake training run and its log follower
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == 128 + signal.SIGTERM
  assert _verbs(calls())[-1] == "tpu-vm delete"


@needs_unix_tools
def test_run_all_refuses_an_existing_name_and_deletes_nothing(fake_cloud):
  env, args, calls, _ = fake_cloud
  res = run("run_all.py", *args, env=dict(env, FAKE_EXISTS="1"))
  assert res.returncode == 1
  assert "argument --name: date-optax-v3-32 already exists" in res.stderr
  assert _verbs(calls()) == ["tpu-vm describe"]


# ---------------------------------------------------------------- Multislice

S2 = ["--accelerator-type=v4-32", "--num-slices=2"]
NODES = ("date-optax-v4-32-0", "date-optax-v4-32-1")
SSH = "gcloud compute tpus tpu-vm ssh {} " + Q_WHERE + " --worker={} --command="


def test_create_two_slices_is_one_queued_resource_of_two_nodes():
  expected = [
    "gcloud compute tpus queued-resources create date-optax-v4-32-qr " + Q_WHERE
    + " --node-count=2 --node-prefix=date-optax-v4-32 --accelerator-type=v4-32"
    " --runtime-version=tpu-ubuntu2204-base",
    "gcloud compute tpus queued-resources describe date-optax-v4-32-qr " + Q_WHERE
    + " --format='value(state.state)'",
  ]
  assert dry("create.py", *S2) == expected
  assert dry("create.py", *S2, "--queued") == expected  # S > 1 implies --queued
  lines = dry("create.py", *S2, "--name=exp", "--queued-resource-id=req", "--spot")
  assert lines[0] == (
    "gcloud compute tpus queued-resources create req " + Q_WHERE
    + " --node-count=2 --node-prefix=exp --accelerator-type=v4-32"
    " --runtime-version=tpu-ubuntu2204-base --spot"
  )
  # One slice stays --node-id, with --num-slices=1 spelled out or not.
  assert dry("create.py", "--accelerator-type=v4-32", "--queued", "--num-slices=1") == (
    dry("create.py", "--accelerator-type=v4-32", "--queued")
  )


# What every worker of a Multislice run prints after install; double quotes
# only, and valid Python (a test below runs it).
CHECK_MULTISLICE = (
  'import jax, date_optax.parallel as dp; dp.initialize(); d = jax.local_devices()[0];'
  ' s = getattr(d, "slice_index", "?"); print(f"slice {s}, worker'
  " {jax.process_index()} of {jax.process_count()}: {jax.local_device_count()} local /"
  ' {jax.device_count()} global devices, {d.device_kind}")'
)


def test_install_two_slices_runs_every_step_on_every_node(repo):
  r = str(repo)
  lines = dry("install.py", *S2, f"--repo-dir={r}")
  assert len(lines) == 8  # 4 steps x 2 nodes, each step on both nodes
  for first, second in zip(lines[::2], lines[1::2]):
    assert NODES[0] in first and NODES[1] not in first
    assert second == first.replace(NODES[0], NODES[1])
  assert lines[0] == SSH.format(NODES[0], "all") + "'rm -rf date_optax && mkdir -p date_optax'"
  assert lines[2] == (
    f"gcloud compute tpus tpu-vm scp --recurse {r}/pyproject.toml {r}/date_optax"
    f" {r}/README.md {r}/LICENSE {r}/examples {NODES[0]}:date_optax " + Q_WHERE
    + " --worker=all"
  )
  assert lines[4] == SSH.format(NODES[0], "all") + (
    "'cd date_optax && python3 -m pip install -U pip"
    ' && python3 -m pip install -U "jax[tpu]" ".[examples]"\''
  )
  command = shlex.split(lines[6])[-1]
  assert shlex.split(command) == [
    "--command=cd", "date_optax", "&&", "python3", "-c", CHECK_MULTISLICE
  ]


def test_the_multislice_check_runs_where_there_is_no_cluster():
  # One process on CPU: dp.initialize() is a no-op and there is no slice.
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  res = subprocess.run(
    [sys.executable, "-c", CHECK_MULTISLICE], capture_output=True, text=True,
    env=env, timeout=120,
  )  # fmt: skip
  assert res.returncode == 0, res.stderr
  assert res.stdout.startswith("slice ?, worker 0 of 1: ")


def test_launch_logs_delete_two_slices():
  launch = dry("launch.py", *S2, "--config=v3_32", GS, "--", "--config.x=1")
  single = dry("launch.py", "--name=date-optax-v4-32", "--config=v3_32", GS, "--",
               "--config.x=1")  # fmt: skip
  assert launch == [
    single[0].replace("date-optax-v4-32 ", f"{node} ") for node in NODES
  ]
  follow = dry("logs.py", *S2)
  assert len(follow) == 1 and follow[0].startswith(SSH.format(NODES[0], "0"))
  every = dry("logs.py", *S2, "--worker=all", "--no-follow")
  assert every == [
    SSH.format(node, "all") + "'tail -n 200 \"$HOME/date_optax_train.log\"'"
    for node in NODES
  ]
  delete = [
    "gcloud compute tpus queued-resources delete date-optax-v4-32-qr " + Q_WHERE
    + " --force --quiet"
  ]
  assert dry("delete.py", *S2) == delete
  assert dry("delete.py", "--name=date-optax-v4-32", "--num-slices=2") == delete


def test_run_all_two_slices_is_the_steps_in_order(repo):
  repo_dir = f"--repo-dir={repo}"
  lines = dry("run_all.py", *S2, repo_dir, GS, "--config=v3_32")
  expected = (
    [
      "gcloud compute tpus queued-resources describe date-optax-v4-32-qr " + Q_WHERE
      + " --format='value(name)'"
    ]
    + dry("create.py", *S2)
    + dry("install.py", *S2, repo_dir)
    + dry("launch.py", *S2, GS, "--config=v3_32")
    + dry("logs.py", *S2)
    + dry("delete.py", *S2)
  )
  assert lines == expected
  assert len(lines) == 1 + 2 + 8 + 2 + 1 + 1


def test_create_four_v5e_slices():
  lines = dry("create.py", "--accelerator-type=v5e-256", "--num-slices=4")
  assert lines[0] == (
    "gcloud compute tpus queued-resources create date-optax-v5litepod-256-qr "
    + Q_WHERE + " --node-count=4 --node-prefix=date-optax-v5litepod-256"
    " --accelerator-type=v5litepod-256 --runtime-version=v2-alpha-tpuv5-lite"
  )


MULTI = "v4, v5p, v5e (v5litepod), v6e"


@pytest.mark.parametrize(
  "script, args, message",
  [
    ("create.py", ["--accelerator-type=v3-32", "--num-slices=2"],
     f"argument --num-slices: v3 slices cannot be joined (Multislice runs on {MULTI});"
     " use --num-slices=1"),
    ("create.py", ["--accelerator-type=v2-8", "--num-slices=64"],
     f"argument --num-slices: v2 slices cannot be joined (Multislice runs on {MULTI})"),
    ("run_all.py", [V3, GS, "--num-slices=4"], "argument --num-slices: v3 slices"),
    ("install.py", [V3, "--num-slices=2"], "argument --num-slices: v3 slices"),
    ("launch.py", [V3, GS, "--num-slices=2"], "argument --num-slices: v3 slices"),
    ("logs.py", [V3, "--num-slices=2"], "argument --num-slices: v3 slices"),
    ("delete.py", [V3, "--num-slices=2"], "argument --num-slices: v3 slices"),
    ("create.py", [*S2[:1], "--num-slices=0"],
     "argument --num-slices: must be an integer from 1 to 64, got '0'"),
    ("create.py", [*S2[:1], "--num-slices=65"], "from 1 to 64, got '65'"),
    ("create.py", [*S2[:1], "--num-slices=two"], "from 1 to 64, got 'two'"),
    ("create.py", [*S2[:1], "--num-slices=1.5"], "from 1 to 64, got '1.5'"),
    ("create.py", [*S2, "--preemptible"],
     "argument --preemptible: not available for queued resources (--num-slices > 1"
     " is one); use --spot"),
    ("create.py", [*S2, "--name=" + "n" * 62],
     "argument --name: the last node would be " + "n" * 62 + "-1, over 63 characters"),
    ("create.py", ["--accelerator-type=v5e-3"],
     "argument --accelerator-type: unknown accelerator type 'v5e-3'; v5litepod slices"
     " are v5litepod-1, v5litepod-4"),
  ],
)  # fmt: skip
def test_multislice_refusals_are_one_line(script, args, message):
  res = run(script, *WHERE, "--dry-run", *args)
  assert res.returncode == 2
  assert res.stdout == ""
  assert "Traceback" not in res.stderr
  assert res.stderr.count("\n") == 1, res.stderr
  assert res.stderr.startswith(f"{script}: error: argument --"), res.stderr
  assert message in res.stderr


@needs_unix_tools
def test_run_parallel_starts_the_nodes_together(tmp_path, capsys):
  # Each command waits (5 s at most) for the other's file, as each node's
  # JAX waits for every slice: one after the other they would fail.
  load("run_all.py")
  import _gcloud

  a, b = tmp_path / "a", tmp_path / "b"
  wait = "touch {}; for _ in $(seq 500); do [ -e {} ] && exit 0; sleep 0.01; done; exit 1"
  runner = _gcloud.Runner(dry_run=False)
  argvs = [["bash", "-c", wait.format(a, b)], ["bash", "-c", wait.format(b, a)]]
  assert runner.run_parallel(argvs) == 0
  assert capsys.readouterr().err.count("+ bash -c") == 2
  failing = [["true"], ["bash", "-c", "exit 3"], ["bash", "-c", "exit 4"]]
  assert runner.run_parallel(failing, check=False) == 3
  with pytest.raises(_gcloud.StepFailed, match="exit status 3: bash -c 'exit 3'"):
    runner.run_parallel(failing)


@needs_unix_tools
def test_run_all_two_slices_for_real_with_fake_gcloud(fake_cloud):
  env, args, calls, home = fake_cloud
  args = [*args, "--accelerator-type=v4-32", "--num-slices=2", "--config=v3_32"]
  res = run("run_all.py", *args, env=dict(env, FAKE_PER_NODE="1"))
  assert res.returncode == 0, res.stderr
  verbs = _verbs(calls())
  assert verbs[:3] == [
    "queued-resources describe", "queued-resources create", "queued-resources describe",
  ]  # fmt: skip
  assert sorted(verbs[3:-1]) == ["tpu-vm scp"] * 2 + ["tpu-vm ssh"] * 9
  assert verbs[-1] == "queued-resources delete"
  for node in NODES:  # each node got the tree and ran the training
    assert (home / node / "date_optax" / "date_optax" / "__init__.py").exists()
    assert (home / node / "date_optax_train.rc").read_text().strip() == "0"
  assert "config found: True" in res.stdout  # worker 0's log, streamed
