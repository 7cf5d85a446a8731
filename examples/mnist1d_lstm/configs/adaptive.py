"""A growing batch: the momentum baseline, batch doubled from B0 = 16 to 64·B0.

`BatchSchedule.adaptive` with its defaults doubles the global batch when
the measured critical batch (the smoothed simple noise scale B_simple)
has held at three times the batch, up to 1,024; the learning rate is
`date(baseline, 1024, batch_schedule=...)`, the baseline's schedule counted
in examples times k_t = B_t/B0 (linear: momentum). In
benchmarks/batch_growth.py (20 epochs of 16,384 signals) this row, with
the first rule (threshold 2, no stretch), reached 96.34 % in 637 steps
against 96.44 % for B0 in 20,480 and 82.81 % for a fixed 64·B0. The
baseline is the momentum one of benchmarks/batch_scaling.py (heavy ball
0.9, lr 0.05 tuned at B0); DATE's own default ratio bounds.
"""

from examples.mnist1d_lstm.configs import default


def get_config():
  config = default.get_config()
  config.solver = "momentum"
  config.learning_rate = 0.05
  config.batch_schedule = "adaptive"
  config.ratio_bounds = None  # date()'s default bounds, as in the study
  config.log_every_steps = 10
  return config
