"""Masked-language-model batches of the standard library's docstrings.

The text, its hash and the tokenizers (a byte-level BPE vocabulary trained
on the training text, or UTF-8 bytes) are `examples/_text_corpus.py`'s,
shared with the causal language model of `examples/gpt_lm`; their names are
re-exported here (`corpus`, `get_vocab`, `Vocab`, `BYTES`, ...). Modules in
`EVAL_MODULES` are held out for evaluation; the rest is the training text.

Masked-language-model batches follow BERT (Devlin et al., "BERT: Pre-training
of Deep Bidirectional Transformers for Language Understanding", 2019,
https://arxiv.org/abs/1810.04805, §3.1): 15 % of the positions are chosen;
of those 80 % become `MASK`, 10 % a random byte and 10 % stay; the loss is
taken at the chosen positions only. Masking works on whole tokens: a chosen
position is one vocabulary entry (a BPE token, or a byte), replaced
as a whole by `MASK` or by a random non-special token. The training
sequences are the non-overlapping windows of the tokenized training text,
read through grain (`date_optax.parallel.data_loader`: a seeded shuffle
every epoch, one shard per process) and masked afresh each time from the
record's own generator; the iterator's state is saved in each checkpoint,
so a resumed run gets exactly the batches an uninterrupted one got. The
evaluation set is every non-overlapping window of the held-out text with
one fixed mask.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grain
import numpy as np

from examples._text_corpus import (  # noqa: F401 - the example's names for them
  BYTES,
  EVAL_MODULES,
  MASK,
  PAD,
  PINNED_SHA256,
  SPECIAL_TOKENS,
  TRAIN_MODULES,
  VOCAB_SIZE,
  Vocab,
  Windows,
  corpus,
  get_vocab,
  log_unigram_prior,
  module_docstrings,
  token_counts,
  token_ids,
  train_bpe,
  unigram_entropy,
)


def mask_tokens(
    tokens: np.ndarray, rng: np.random.Generator, mask_rate: float = 0.15, *,
    pad_id: int = PAD, mask_id: int = MASK, random_ids: tuple[int, int] = (0, 256),
) -> dict[str, np.ndarray]:
  """BERT's masking of token ids (15 % chosen; 80/10/10), whole tokens at a time.

  Args:
    tokens: int array ``[..., length]`` of ids (``pad_id`` is never chosen).
    rng: the generator that draws the choice and the replacements.
    mask_rate: the fraction of non-pad positions chosen, in (0, 1).
    pad_id: the padding id (default: the byte tokenizer's `PAD`).
    mask_id: the ``[MASK]`` id (default: the byte tokenizer's `MASK`).
    random_ids: ``[low, high)`` of the random replacements (the
      non-special tokens; default: the 256 bytes).

  Returns:
    ``{"inputs", "targets", "weights"}``: the corrupted ids, the original
    ids, and 1 at the chosen positions (0 elsewhere), all int32.
  """
  if not 0.0 < mask_rate < 1.0:
    raise ValueError(f"mask_rate must be in (0, 1), got {mask_rate}.")
  tokens = np.asarray(tokens, np.int32)
  chosen = (rng.random(tokens.shape) < mask_rate) & (tokens != pad_id)
  action = rng.random(tokens.shape)
  random_bytes = rng.integers(*random_ids, tokens.shape, dtype=np.int32)
  inputs = np.where(chosen & (action < 0.8), mask_id, tokens)
  inputs = np.where(chosen & (action >= 0.8) & (action < 0.9), random_bytes, inputs)
  return {"inputs": inputs.astype(np.int32), "targets": tokens,
          "weights": chosen.astype(np.int32)}



class MaskWindow(grain.transforms.RandomMap):
  """BERT's masking of one window, drawn from the record's own generator."""

  def __init__(self, vocab: Vocab, mask_rate: float):
    self.vocab, self.mask_rate = vocab, mask_rate

  def random_map(self, window: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    v = self.vocab
    return mask_tokens(window, rng, self.mask_rate, pad_id=v.pad_id, mask_id=v.mask_id,
                       random_ids=v.random_ids)


def train_loader(vocab: Vocab, batch_size: int, seq_len: int, *, seed: int = 0,
                 mask_rate: float = 0.15):
  """Endless MLM batches of this process's shard of the training windows.

  Args:
    vocab: the run's tokenizer (`get_vocab`).
    batch_size: the global batch (sequences), divisible by the processes.
    seq_len: tokens per sequence.
    seed: the shuffle and masking seed.
    mask_rate: the fraction of positions chosen for prediction.

  Returns:
    A `grain.DataLoader` of ``{"inputs", "targets", "weights"}`` int32
    batches ``[batch_size / process_count, seq_len]``; its iterator's state
    goes into the checkpoints.
  """
  import date_optax.parallel as dp  # noqa: PLC0415

  if not 0.0 < mask_rate < 1.0:
    raise ValueError(f"mask_rate must be in (0, 1), got {mask_rate}.")
  source = Windows(token_ids(vocab, "train"), seq_len, f"train/{vocab.kind}/{vocab.sha256[:12]}")
  return dp.data_loader(source, batch_size, seed=seed,
                        operations=(MaskWindow(vocab, mask_rate),))


class StagedBatches:
  """One iterator over the stages' loaders: stage `stage_of(step)`'s batch at each step.

  Checkpointable as a grain iterator is (`get_state`/`set_state`, for
  `date_optax.parallel.iterator_state` and `restore_iterator`): the state is
  the stage, the steps read and that stage's loader state, which `set_state`
  checks against a fresh loader of the stage (seed, shard, data).

  Args:
    loader: `loader(stage)` builds the stage's grain loader.
    stage_of: the stage of a step (counted from 0), e.g.
      `date_optax.MultiStageRecipe.stage_of`.
  """

  def __init__(self, loader: Callable[[int], Any], stage_of: Callable[[int], int]):
    self._loader, self._stage_of = loader, stage_of
    self._step, self._stage, self._it = 0, 0, iter(loader(0))

  def __iter__(self) -> StagedBatches:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    stage = int(self._stage_of(self._step))
    if stage != self._stage:  # the earlier stage's iterator is done with
      self._stage, self._it = stage, iter(self._loader(stage))
    self._step += 1
    return next(self._it)

  def get_state(self) -> str:
    inner = self._it.get_state()
    inner = inner.decode() if isinstance(inner, bytes) else inner
    return json.dumps({"stage": self._stage, "step": self._step, "loader": inner})

  def set_state(self, state: str | bytes) -> None:
    import jax  # noqa: PLC0415

    import date_optax.parallel as dp  # noqa: PLC0415

    saved = json.loads(state)
    self._stage, self._step = saved["stage"], saved["step"]
    self._it = iter(self._loader(self._stage))
    n = jax.process_count()  # this process's state, in iterator_state's layout
    dp.restore_iterator(self._it, {"process_count": n, "states": [saved["loader"]] * n})


def eval_set(seq_len: int, *, seed: int = 0, mask_rate: float = 0.15,
             max_sequences: int | None = None, vocab: Vocab = BYTES) -> dict[str, np.ndarray]:
  """Every non-overlapping window of the held-out text, masked once.

  Args:
    seq_len: tokens per sequence.
    seed: the seed of the one fixed mask.
    mask_rate: the fraction of positions chosen for prediction.
    max_sequences: keep only the first this many windows (``None``: all).
    vocab: the tokenizer (default: bytes).

  Returns:
    ``{"inputs", "targets", "weights"}`` of shape ``[n, seq_len]``.
  """
  ids = token_ids(vocab, "eval")
  n = len(ids) // seq_len
  if max_sequences is not None:
    n = min(n, max_sequences)
  windows = ids[: n * seq_len].reshape(n, seq_len)
  return mask_tokens(windows, np.random.default_rng([seed, 2**31 - 1]), mask_rate,
                     pad_id=vocab.pad_id, mask_id=vocab.mask_id, random_ids=vocab.random_ids)
