"""The growing batch: the AdamW baseline, batch doubled from B0 = 8 to 64·B0 = 512.

`BatchSchedule.adaptive` with its defaults doubles the global batch when the
measured critical batch (the smoothed simple noise scale B_simple, from the
step's `grad_stats`) has held at three times the batch over a stretch of
32·B0 sequences, up to 512; the learning rate is `date(baseline, 512,
batch_schedule=..., lr_scaling="linear", decay="baseline")`: the
baseline's warmup and cosine decay counted in sequences, times B_t/B0
(linear, the rule measured for Adam with a growing batch). The run trains
on the baseline's tokens in however many steps the schedule takes
(McCandlish et al., "An Empirical Model of Large-Batch Training", 2018,
https://arxiv.org/abs/1812.06162; Merrill et al., "Critical Batch Size
Revisited", 2025, https://arxiv.org/abs/2505.23971).
"""

from examples.gpt_lm.configs import default


def get_config():
  config = default.get_config()
  config.optimizer = "date"
  config.batch_schedule = "adaptive"
  config.batch_size = 64 * config.base_batch_size
  config.lr_scaling = "linear"
  config.log_every_steps = 5
  return config
