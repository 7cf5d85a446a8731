"""`date-optax recipe`, run in-process through the console script's main()."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import date_optax
from date_optax._src import cli, cli_recipe

LEGW_FLAGS = [
    "recipe", "--base-batch", "1024", "--lr", "2**2.5", "--warmup-epochs", "0.3125",
    "--epochs", "90", "--num-examples", "1281167", "--decay", "poly", "--power", "2",
    "--batch", "1K,2K,4K,8K,16K,32K",
]


def run_cli(capsys, argv):
  rc = cli.main(argv)
  out, err = capsys.readouterr()
  return rc, out, err


def table_rows(out):
  """Rows of the printed table as lists of strings (header and # skipped)."""
  lines = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]
  assert lines[0].split()[:3] == ["batch", "k", "peak"]
  return [ln.split() for ln in lines[1:]]


def test_legw_table_1_from_the_cli(capsys):
  rc, out, _ = run_cli(capsys, LEGW_FLAGS)
  assert rc == 0
  rows = table_rows(out)
  assert [int(r[0]) for r in rows] == [1024, 2048, 4096, 8192, 16384, 32768]
  for j, r in enumerate(rows):
    batch, k, peak, log2lr, w_epochs, w_ratio, w_steps, total, spe = r
    assert float(k) == 2**j
    np.testing.assert_allclose(float(peak), 2 ** (2.5 + 0.5 * j), rtol=1e-5)
    assert float(log2lr) == 2.5 + 0.5 * j  # Table 1: 2^2.5 .. 2^5.0
    assert float(w_epochs) == [0.3125, 0.625, 1.25, 2.5, 5, 10][j]
    assert w_ratio == f"1/{288 // 2**j}"
    assert int(w_steps) == 391
    assert int(total) == -(-90 * 1281167 // int(batch))
    np.testing.assert_allclose(float(spe), 1281167 / int(batch), rtol=1e-5)


def test_preset_equals_explicit_flags(capsys):
  _, explicit, _ = run_cli(capsys, LEGW_FLAGS)
  _, preset, _ = run_cli(capsys, ["recipe", "--preset", "legw-table1"])
  assert preset == explicit


def test_json_output_matches_scale_recipe(capsys):
  argv = ["recipe", "--preset", "date-example", "--format", "json"]
  rc, out, _ = run_cli(capsys, argv)
  assert rc == 0
  data = json.loads(out)
  base = date_optax.Baseline(batch_size=1024, learning_rate=1.25e-3, warmup_epochs=2,
                             epochs=30, num_examples=59904)
  for row in data["recipes"]:
    r = date_optax.scale_recipe(base, row["batch"])
    assert row["peak_lr"] == r.peak_learning_rate
    assert (row["warmup_steps"], row["total_steps"]) == (r.warmup_steps, r.total_steps)
    assert row["warmup_epochs"] == r.warmup_epochs
  # The DATE worked example: 117 warmup iterations, 220 in all at 8K.
  assert data["recipes"][1] == {
      "batch": 8192, "k": 8.0, "peak_lr": 1.25e-3 * math.sqrt(8),
      "log2_peak_lr": math.log2(1.25e-3 * math.sqrt(8)), "warmup_epochs": 16.0,
      "warmup_ratio": 16 / 30, "warmup_steps": 117, "total_steps": 220,
      "steps_per_epoch": 7.3125,
  }


def test_bert_warmup_ratio_column(capsys):
  rc, out, _ = run_cli(capsys, ["recipe", "--preset", "lamb-bert"])
  assert rc == 0
  rows = table_rows(out)
  assert [r[5] for r in rows] == [f"1/{d}" for d in (320, 160, 80, 40, 20, 10, 5)]
  for j, r in enumerate(rows):
    np.testing.assert_allclose(float(r[2]), 5 / (2 ** (3.0 - 0.5 * j) * 1e3), rtol=1e-5)
    assert int(r[6]) == 3125
  assert int(rows[-1][7]) == 15625


def test_csv_output(capsys):
  argv = ["recipe", "--preset", "lamb-imagenet", "--format", "csv"]
  rc, out, _ = run_cli(capsys, argv)
  assert rc == 0
  lines = out.strip().splitlines()
  assert lines[0].startswith("batch,k,peak_lr")
  assert len(lines) == 8
  last = lines[-1].split(",")
  assert last[0] == "32768" and float(last[2]) == pytest.approx(0.04)
  assert float(last[4]) == 20.0


def test_plot_writes_a_png(capsys, tmp_path):
  path = tmp_path / "sub" / "lr.png"
  path.parent.mkdir()  # a missing directory is refused (test_bad_inputs.py)
  argv = ["recipe", "--preset", "date-example", "--plot", str(path)]
  rc, _, err = run_cli(capsys, argv)
  assert rc == 0 and "wrote" in err
  data = path.read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_decay_flags(capsys):
  common = ["recipe", "--base-batch", "256", "--lr", "0.1", "--warmup-epochs", "1",
            "--epochs", "90", "--num-examples", "1281167", "--batch", "1K",
            "--format", "json"]
  rc, out, _ = run_cli(capsys, common + ["--decay", "multistep", "--boundaries",
                                         "30,60,80", "--factors", "0.1"])
  assert rc == 0 and json.loads(out)["recipes"][0]["warmup_epochs"] == 4.0
  rc, _, err = run_cli(capsys, common + ["--decay", "multistep"])
  assert rc == 2 and "--boundaries" in err
  rc, _, err = run_cli(capsys, common + ["--decay", "exponential"])
  assert rc == 2 and "--start-epoch" in err
  rc, _, _ = run_cli(capsys, common + ["--decay", "exponential", "--start-epoch", "4",
                                       "--factor", "0.5", "--lr-scaling", "linear"])
  assert rc == 0


def test_errors(capsys):
  rc, _, err = run_cli(capsys, ["recipe", "--preset", "date-example", "--batch", "32K"])
  assert rc == 2 and "largest batch size" in err and "15359" in err
  rc, _, err = run_cli(capsys, ["recipe", "--lr", "0.1"])
  assert rc == 2 and "--base-batch" in err and "--num-examples" in err
  rc, _, err = run_cli(capsys, ["recipe", "--preset", "date-example", "--power", "-1",
                                "--decay", "poly"])
  assert rc == 2 and "power" in err
  with pytest.raises(SystemExit) as e:
    cli.main(["recipe", "--lr", "import os"])
  assert e.value.code == 2
  with pytest.raises(SystemExit):
    cli.main(["recipe", "--preset", "legw-table1", "--warmup-epochs", "1",
              "--warmup-ratio", "0.1"])
  with pytest.raises(SystemExit):
    cli.main([])  # a subcommand is required


def test_number_and_batch_parsing():
  assert cli_recipe.parse_number("2**2.5") == 2**2.5
  assert cli_recipe.parse_number("2^2.5") == 2**2.5
  assert cli_recipe.parse_number("5/(2**3.0*10**3)") == 5 / 8000
  assert cli_recipe.parse_number("-1e-3") == -1e-3
  assert cli_recipe.parse_batch_sizes("512,1K,32k") == [512, 1024, 32768]
  for bad in ("__import__('os')", "2**", "1/0", "x"):
    with pytest.raises(Exception, match="not a number"):
      cli_recipe.parse_number(bad)
  with pytest.raises(Exception, match="integer"):
    cli_recipe.parse_batch_sizes("1.5")


def test_subcommands_are_registered_per_module():
  parser = cli.build_parser()
  assert cli_recipe in cli.SUBCOMMANDS
  args = parser.parse_args(["recipe", "--preset", "legw-table1"])
  assert args.func is cli_recipe.run


# -- A growing batch proposed from the critical batch (issue 35).

DATE_EXAMPLE = ["recipe", "--preset", "date-example"]  # B0 = 1024, 30 x 59904 examples


def test_propose_ramp_prints_changes_and_python(capsys):
  from date_optax._src.critical_batch import ramp_changes
  from date_optax.diagnostics import propose_batch_schedule

  _, plain, _ = run_cli(capsys, [*DATE_EXAMPLE, "--critical-batch", "1500"])
  rc, out, _ = run_cli(capsys, [*DATE_EXAMPLE, "--critical-batch", "1500",
                                "--propose-batch-schedule", "ramp"])
  assert rc == 0
  table, proposal = out.split("\n\n", 1)
  assert table + "\n" == plain  # the recipe table is unchanged
  # 1024 <= 1500 < 2048: from B0; 7 increments of 1024 over a quarter of
  # 30·59904 = 1797120 examples, the i-th from ceil(i·449280/7) examples.
  want = [(-(-i * 449280 // 7), 1024 + 1024 * i) for i in range(1, 8)]
  assert want[:3] == [(64183, 2048), (128366, 3072), (192549, 4096)]
  for e, b in [(0, 1024), *want]:
    assert f"from example {e:>7}: batch {b}" in proposal
  assert "up to 1024: fixed at 1024 (B0 itself" in proposal
  line = proposal.strip().splitlines()[-1].strip()
  assert line == "date_optax.BatchSchedule.ramp(1024, 1024, 449280, max_batch=8192)"
  schedule = eval(line, {"date_optax": date_optax})  # noqa: S307 - our own output
  assert schedule == propose_batch_schedule(1500.0, base_batch_size=1024, max_batch=8192,
                                            total_examples=1797120, kind="ramp")
  assert ramp_changes(schedule) == want


def test_propose_adaptive_in_json(capsys):
  rc, out, _ = run_cli(capsys, [*DATE_EXAMPLE, "--batch", "1K,8K,32K", "--epochs", "300",
                                "--critical-batch", "5000", "--propose-batch-schedule",
                                "--format", "json"])
  assert rc == 0
  data = json.loads(out)
  assert [r["batch"] for r in data["recipes"]] == [1024, 8192, 32768]
  # 4096 <= 5000 < 8192: adaptive from 4096.
  assert data["batch_schedules"] == [
      {"max_batch": 1024, "kind": "fixed", "start": 1024, "batch_sizes": [1024],
       "python": "date_optax.BatchSchedule.fixed(1024)"},
      {"max_batch": 8192, "kind": "adaptive", "start": 4096, "batch_sizes": [4096, 8192],
       "python": "date_optax.BatchSchedule.adaptive(4096, max_batch=8192)"},
      {"max_batch": 32768, "kind": "adaptive", "start": 4096,
       "batch_sizes": [4096, 8192, 16384, 32768],
       "python": "date_optax.BatchSchedule.adaptive(4096, max_batch=32768)"},
  ]


def test_noise_scales_file_in_three_formats(capsys, tmp_path):
  from date_optax.diagnostics import MetricWriter

  # The first half is discarded (critical_batch's default): median 1500.
  values = [9000.0, 9000.0, 1400.0, 1500.0, 1600.0]
  text = tmp_path / "noise.txt"
  text.write_text("9000 9000\n1400, 1500\n1600\n")
  listed = tmp_path / "noise.json"
  listed.write_text(json.dumps(values))
  with MetricWriter(str(tmp_path / "run"), tensorboard=False) as w:
    for step, v in enumerate(values):
      w.write_scalars(step, {"grad_noise_scale": v, "loss": 1.0})
  _, want, _ = run_cli(capsys, [*DATE_EXAMPLE, "--critical-batch", "1500",
                                "--propose-batch-schedule", "ramp", "--unit", "256"])
  assert "ramp(1024, 1024, 449280, max_batch=8192)" in want
  for path in (text, listed, w.csv_path):
    rc, out, err = run_cli(capsys, [*DATE_EXAMPLE, "--noise-scales", str(path),
                                    "--propose-batch-schedule", "ramp", "--unit", "256"])
    assert (rc, err, out) == (0, "", want)


def test_propose_errors(capsys, tmp_path):
  rc, _, err = run_cli(capsys, [*DATE_EXAMPLE, "--propose-batch-schedule"])
  assert rc == 2 and "needs the critical batch measured at B0" in err
  rc, _, err = run_cli(capsys, [*DATE_EXAMPLE, "--critical-batch", "100",
                                "--propose-batch-schedule", "--format", "csv"])
  assert rc == 2 and "--format table or json, not csv" in err
  rc, _, err = run_cli(capsys, [*DATE_EXAMPLE, "--critical-batch", "100", "--batch", "3000",
                                "--propose-batch-schedule"])
  assert rc == 2 and "adaptive to --batch 3000: max_batch=3000 must be" in err
  rc, _, err = run_cli(capsys, [*DATE_EXAMPLE, "--critical-batch", "100", "--batch", "32K",
                                "--propose-batch-schedule"])
  assert rc == 2 and "end of training" in err and "propose_batch_schedule proposes" in err
  bad = tmp_path / "bad.txt"
  bad.write_text("12 x")
  rc, _, err = run_cli(capsys, [*DATE_EXAMPLE, "--noise-scales", str(bad)])
  assert rc == 2 and "'x' is not a number" in err
  rc, _, err = run_cli(capsys, [*DATE_EXAMPLE, "--noise-scales", str(tmp_path / "no.txt")])
  assert rc == 2 and "--noise-scales" in err and "no.txt' cannot be read" in err
  rc, _, err = run_cli(capsys, [*DATE_EXAMPLE, "--critical-batch", "100", "--unit", "8"])
  assert rc == 2 and "--unit: shapes a proposed batch schedule; add --propose" in err
  from date_optax.diagnostics import MetricWriter

  with MetricWriter(str(tmp_path / "run"), tensorboard=False) as w:
    w.write_scalars(0, {"loss": 1.0})
  rc, _, err = run_cli(capsys, [*DATE_EXAMPLE, "--noise-scales", w.csv_path])
  assert rc == 2 and "no grad_noise_scale metric" in err
  with pytest.raises(SystemExit) as e:
    run_cli(capsys, [*DATE_EXAMPLE, "--noise-scales", str(bad), "--critical-batch", "5"])
  assert e.value.code == 2
  assert "not allowed with argument" in capsys.readouterr().err
