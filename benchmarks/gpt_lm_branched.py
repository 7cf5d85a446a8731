"""The branched check: grow the batch when a short branch at 2B keeps B's loss.

Merrill et al. (2025) measure the critical batch without the noise scale:
from a checkpoint they train short branches at larger batches (Adam's
learning rate scaled with the batch) on the same tokens and take the
largest batch whose loss stays within a tolerance of the smaller ones'.
This script runs that check *as the trigger* of a growing batch on
`examples/gpt_lm`'s tiny decoder, through the public API only:

* the run is cut into segments of `branch_steps` steps at the current
  batch B (``branch_steps · B`` sequences); while ``B < max_batch`` each
  segment is trained twice from the same state on the same sequences: at B
  (`branch_steps` steps) and at 2B (half as many steps, the learning rate
  following the batch as `date()` with the growing batch sets it, linear
  for Adam);
* both branches are scored on the same probe of held-out windows; if the
  2B branch's loss is at most ``(1 + tolerance)`` times B's, the run goes
  on from it at 2B, otherwise from the B branch at B. The batch never
  shrinks. The discarded branch's steps are the check's cost and are
  reported apart from the kept line's steps.

The step is the example's own (`date_optax.parallel.make_train_step` with
`configs/adaptive.py`'s `BatchSchedule.adaptive`, its threshold set so high
that it never grows by itself); a branch at 2B starts from a copy of the
state whose schedule is told to grow at once (``next_batch``,
``next_step``), so the optimizer's clock, the learning rate and the
examples count follow as in any growing run.

    python benchmarks/gpt_lm_branched.py --seed 0 --out /tmp/branched.json
    python benchmarks/gpt_lm_branched.py --config smoke --branch-steps 4

References: Merrill, Arora, Groeneveld and Hajishirzi, `Critical Batch Size
Revisited: A Simple Empirical Approach to Large-Batch Language Model
Training <https://arxiv.org/abs/2505.23971>`_, 2025.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Run:
  """The example's step, data and evaluation, built from a growing-batch config."""

  def __init__(self, config: Any):
    import jax  # noqa: PLC0415 - after the device count is set
    import jax.numpy as jnp  # noqa: PLC0415

    import date_optax.parallel as dp  # noqa: PLC0415
    from examples import _text_corpus  # noqa: PLC0415
    from examples.gpt_lm import input_pipeline, train  # noqa: PLC0415

    self.jax, self.jnp, self.dp, self.train = jax, jnp, dp, train
    config = config.copy_and_resolve_references()
    config.growth.threshold = 1e30  # the schedule never grows by itself
    self.config = config
    vocab = _text_corpus.get_vocab(config.tokenizer, vocab_size=config.vocab_size)
    self.mesh = train.make_mesh(config)
    self.model = train.create_model(config, vocab.size)
    self.schedule = train.make_batch_schedule(config)
    if self.schedule is None:
      raise ValueError("a host trigger needs a growing-batch config (batch_schedule='adaptive').")
    tx, _ = train.make_optimizer(config)
    self.step_fn = train.make_train_step(config, self.mesh, self.model, tx, self.schedule)
    self.length = length = int(config.seq_len)
    params = jax.jit(lambda key: self.model.init(key, jnp.zeros((1, length), jnp.int32))[
        "params"])(jax.random.key(config.seed))
    self.state = self.step_fn.init(train.init_output_bias(config, params, vocab))
    self.eval_data = input_pipeline.eval_set(vocab, length)
    self.entropy = _text_corpus.unigram_entropy(self.eval_data["targets"], vocab.pad_id)
    self.total = train.num_sequences(config)
    self.batches = dp.GrowingBatches(
        iter(input_pipeline.train_loader(vocab, self.schedule.chunk_size, length,
                                         seed=config.seed)), self.schedule.chunk_size)

  def loss_on(self, state, data) -> float:
    """Mean next-token loss of `state` over `data`'s windows."""
    train = self.train
    out = self.dp.evaluate(
        lambda p, b: train.lm_sums(self.model.apply({"params": p}, b["inputs"]), b),
        state.params, data, self.mesh, batch_size=self.config.eval_batch_size,
        data_axes=tuple(self.mesh.axis_names))
    return float(out["nll"])

  def grown(self, state, batch: int):
    """`state` with its schedule told to run `batch` from its next step."""
    jnp = self.jnp
    bs = state.batch_schedule
    return state.replace(batch_schedule=bs.replace(
        examples=jnp.array(bs.examples), next_batch=jnp.int32(batch),
        next_step=jnp.array(state.step, jnp.int32)))

  def step(self, state, rows: dict, batch: int):
    """One step at `batch` (the state's schedule moved there first if needed)."""
    if self.step_fn.next_batch_size(state) != batch:
      state = self.grown(state, batch)
    return self.step_fn(state, rows)


def run_branched(config: Any, *, branch_steps: int, tolerance: float, probe_sequences: int,
                 verbose: bool = True) -> dict[str, Any]:
  """Trains `config` (a growing-batch gpt_lm config) with the branched check.

  Args:
    config: an `examples/gpt_lm` config with ``batch_schedule="adaptive"``
      (its `batch_size` is the largest batch, `base_batch_size` the first).
    branch_steps: steps at the current batch in one segment (even, >= 2).
    tolerance: grow when the 2B branch's probe loss is at most
      ``(1 + tolerance)`` times the B branch's (>= -1).
    probe_sequences: held-out windows the branches are scored on (the first
      ones of the eval set, >= the eval batch).
    verbose: print each check.

  Returns:
    A record: final `eval_loss` (every held-out window), the kept line's
    `steps` and `tokens`, `branch_steps_discarded`, the `batch_changes`
    (``[step, batch]``), every `check` (``[examples, B, loss at B, loss at
    2B, grown]``) and the `eval_curve` (``[tokens, eval_loss]`` after each
    segment).
  """
  if branch_steps < 2 or branch_steps % 2:
    raise ValueError(f"branch_steps must be even and >= 2, got {branch_steps}.")
  if not tolerance >= -1:
    raise ValueError(f"tolerance must be >= -1, got {tolerance}.")
  start_time = time.perf_counter()
  r = _Run(config)
  jax, jnp = r.jax, r.jnp
  if not r.config.eval_batch_size <= probe_sequences <= len(r.eval_data["inputs"]):
    raise ValueError(f"probe_sequences must be in [{r.config.eval_batch_size}, "
                     f"{len(r.eval_data['inputs'])}], got {probe_sequences}.")
  probe = {k: v[:probe_sequences] for k, v in r.eval_data.items()}

  def train_on(state, data, batch, steps):
    for i in range(steps):
      state, _ = r.step(state, {k: v[i * batch:(i + 1) * batch] for k, v in data.items()},
                        batch)
    return state

  state, top = r.state, r.schedule.max_batch
  batch, examples, steps, discarded = r.schedule.start, 0, 0, 0
  changes, checks, curve, path = [[0, batch]], [], [], []
  while examples + batch <= r.total:
    n = min(branch_steps, (r.total - examples) // batch)
    data = r.batches.take(n * batch)
    check = batch < top and n == branch_steps
    wide = jax.tree.map(jnp.copy, state) if check else None
    state = train_on(state, data, batch, n)
    if check:
      wide = train_on(wide, data, 2 * batch, n // 2)
      narrow_loss, wide_loss = r.loss_on(state, probe), r.loss_on(wide, probe)
      grow = wide_loss <= (1 + tolerance) * narrow_loss
      checks.append([examples, batch, round(narrow_loss, 5), round(wide_loss, 5), bool(grow)])
      if verbose:
        print(f"  examples {examples:6d}: B={batch:4d} probe loss {narrow_loss:.4f}, "
              f"2B {wide_loss:.4f}{' -> grow' if grow else ''}", flush=True)
      if grow:
        state, kept = wide, 2 * batch
        steps, discarded = steps + n // 2, discarded + n
        changes.append([steps, kept])
      else:
        kept = batch
        steps, discarded = steps + n, discarded + n // 2
    else:
      kept = batch
      steps += n
    # The kept line's steps over this segment's n·B sequences.
    path += [[(examples + (i + 1) * kept) * r.length, kept, None]
             for i in range(n * batch // kept)]
    examples += n * batch
    batch = kept
    curve.append([examples * r.length, round(r.loss_on(state, r.eval_data), 5)])
  return dict(trigger="branched", eval_loss=curve[-1][1], steps=steps,
              tokens=examples * r.length, branch_steps_discarded=discarded,
              batch_changes=changes, checks=checks, eval_curve=curve, path=path,
              eval_unigram_entropy=r.entropy, branch_steps=branch_steps, tolerance=tolerance,
              probe_sequences=probe_sequences, wall_s=round(time.perf_counter() - start_time, 1))


def noise_scale_bound(mom: dict[str, float], z: float) -> tuple[float, float]:
  """B_simple of smoothed moments and its lower confidence bound.

  Args:
    mom: exponential moving sums with weights ``w_i``: ``w`` (``W = Σw``),
      ``w2`` (``Σw²``), ``g``, ``t`` (``Σw g``, ``Σw t`` of the per-step
      estimates of ``|G|²`` and ``tr Σ``), ``gg``, ``tt``, ``gt`` (of their
      squares and product).
    z: standard errors below the estimate.

  Returns:
    ``(B, B − z·se)``, ``B = max(Σw t, 0) / Σw g`` and ``se`` by the delta
    method, ``se² = (Σw²/W²) · E_w[(t − B g)²] / E_w[g]²``; with
    ``Σw g <= 0`` (the gradient not yet told from its noise) ``(inf or 0,
    -inf)``: no bound, so nothing grows on it.
  """
  mg, mt = mom["g"] / mom["w"], mom["t"] / mom["w"]
  if mg <= 0:
    return (math.inf if mt > 0 else 0.0), -math.inf
  b = max(mt, 0.0) / mg
  spread = (mom["tt"] - 2 * b * mom["gt"] + b * b * mom["gg"]) / mom["w"]
  se = math.sqrt(max(spread, 0.0) * mom["w2"] / mom["w"] ** 2) / mg
  return b, b - z * se


def run_lcb(config: Any, *, z: float, eval_every: int = 200, verbose: bool = True
            ) -> dict[str, Any]:
  """Trains `config` growing on a lower confidence bound of B_simple.

  The library's adaptive rule (threshold, stretch, ``min_steps``, runaway
  guard, the statistics' smoothing per example: `config.growth` or the
  defaults of `date_optax.BatchSchedule.adaptive`) decided on the host,
  with ``B_simple − z·se`` in place of B_simple. The step's smoothed
  statistics are exponential moving averages of per-step estimates ``g_t``
  of ``|G|²`` and ``t_t`` of ``tr Σ``; each step's pair is recovered from
  consecutive states, and the host keeps the same averages of ``g²``,
  ``t²`` and ``g·t`` and of the weights' squares. With weights ``w_i``
  (sum ``W``, squares' sum ``W₂``), ``B = Σw t / Σw g`` and the delta
  method gives ``se(B)² = (W₂/W²) · E_w[(t − B g)²] / (E_w g)²``. At
  ``z = 0`` this is the library's rule decided without its `lag`.

  Returns:
    A record: final `eval_loss`, `steps`, `tokens`, `batch_changes`, the
    `path` (``[tokens, batch, B_simple, its bound]`` each step) and the
    `eval_curve`.
  """
  start_time = time.perf_counter()
  r = _Run(config)
  jax = r.jax
  import date_optax  # noqa: PLC0415

  growth = {k: v for k, v in config.growth.items() if v is not None}  # unset: the defaults
  rule = date_optax.BatchSchedule.adaptive(r.schedule.start, max_batch=r.schedule.max_batch,
                                           **growth)
  decay0 = r.step_fn.grad_stats_decay  # the step's smoothing per start batch
  state, b0, top = r.state, r.schedule.start, r.schedule.max_batch
  batch, examples, steps, last_change, held = b0, 0, 0, 0, 0
  mom = dict(w=0.0, w2=0.0, g=0.0, t=0.0, gg=0.0, tt=0.0, gt=0.0)
  loss_avg = [math.nan, math.nan]
  prev = jax.device_get(state.grad_stats)
  changes, path, curve = [[0, batch]], [], []
  while examples + batch <= r.total:
    state, metrics = r.step(state, r.batches.take(batch), batch)
    steps, examples = steps + 1, examples + batch
    gs, loss = jax.device_get((state.grad_stats, metrics["loss"]))
    d = decay0 ** (batch / b0)
    g = (float(gs.sq_norm) - d * float(prev.sq_norm)) / (1 - d)
    t = (float(gs.trace_cov) - d * float(prev.trace_cov)) / (1 - d)
    prev = gs
    for k, x in (("w", 1.0), ("g", g), ("t", t), ("gg", g * g), ("tt", t * t), ("gt", g * t)):
      mom[k] = d * mom[k] + (1 - d) * x
    mom["w2"] = d * d * mom["w2"] + (1 - d) ** 2
    b_simple, bound = noise_scale_bound(mom, z)
    recent = 0.5 ** (batch / rule.hold_examples)
    loss = float(loss)
    if math.isfinite(loss):
      loss_avg = [loss, loss] if math.isnan(loss_avg[0]) else [
          recent * loss_avg[0] + (1 - recent) * loss, d * loss_avg[1] + (1 - d) * loss]
    calm = loss_avg[0] - loss_avg[1] <= rule.guard_margin * abs(loss_avg[1])
    trigger = math.isfinite(bound) and rule.calibration * bound >= rule.threshold * batch and calm
    held = held + batch if trigger else 0
    path.append([examples * r.length, batch, round(b_simple, 1), round(bound, 1)])
    if (trigger and held >= rule.hold_examples and steps - last_change >= rule.min_steps
        and batch < top):
      batch, last_change, held = min(2 * batch, top), steps, 0
      changes.append([steps, batch])
      if verbose:
        print(f"  step {steps:5d}: B_simple {b_simple:.0f}, bound {bound:.0f} -> {batch}",
              flush=True)
    if examples // (eval_every * b0) > (examples - path[-1][1]) // (eval_every * b0):
      curve.append([examples * r.length, round(r.loss_on(state, r.eval_data), 5)])
  if not curve or curve[-1][0] != examples * r.length:
    curve.append([examples * r.length, round(r.loss_on(state, r.eval_data), 5)])
  return dict(trigger="lcb", z=z, eval_loss=curve[-1][1], steps=steps,
              tokens=examples * r.length, batch_changes=changes, path=path, eval_curve=curve,
              eval_unigram_entropy=r.entropy, wall_s=round(time.perf_counter() - start_time, 1))


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="adaptive",
                      help="a config of examples/gpt_lm/configs (default adaptive)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--trigger", choices=("branched", "lcb"), default="branched")
  parser.add_argument("--z", type=float, default=1.645,
                      help="lcb: standard errors below B_simple (0: the point estimate)")
  parser.add_argument("--branch-steps", type=int, default=16)
  parser.add_argument("--tolerance", type=float, default=0.0)
  parser.add_argument("--probe", type=int, default=256, help="held-out windows to score on")
  parser.add_argument("--set", action="append", default=[],
                      help="config overrides, e.g. --set lr_scaling=sqrt")
  parser.add_argument("--out", default=None, help="write the record as JSON here")
  args = parser.parse_args(argv)
  flags = os.environ.get("XLA_FLAGS", "")
  if "device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=2"
  sys.path.insert(0, ROOT)
  import date_optax.parallel as dp  # noqa: PLC0415 - JAX's backend starts later

  for key, value in dp.TpuSlice.compile_only_env().items():  # no TPU probe here
    os.environ.setdefault(key, value)
  config = importlib.import_module(f"examples.gpt_lm.configs.{args.config}").get_config()
  if config.get("batch_schedule") is None:
    config.optimizer, config.batch_schedule = "date", "adaptive"
  config.seed = args.seed
  for item in args.set:
    key, value = item.split("=", 1)
    node = config
    *path, leaf = key.split(".")
    for p in path:
      node = node[p]
    try:
      node[leaf] = json.loads(value)
    except json.JSONDecodeError:  # a bare string
      node[leaf] = value
  if args.trigger == "lcb":
    rec = run_lcb(config, z=args.z)
  else:
    rec = run_branched(config, branch_steps=args.branch_steps, tolerance=args.tolerance,
                       probe_sequences=args.probe)
  rec["seed"] = args.seed
  print(f"eval loss {rec['eval_loss']:.4f} in {rec['steps']} steps "
        f"(+{rec.get('branch_steps_discarded', 0)} discarded), batches {rec['batch_changes']}, "
        f"{rec['wall_s']:.0f} s", flush=True)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(rec, f)
  if not math.isfinite(rec["eval_loss"]):
    sys.exit(1)


if __name__ == "__main__":
  main()
