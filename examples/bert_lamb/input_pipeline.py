"""Real English text with no download: the docstrings of the Python standard library.

The corpus is the docstrings (module, class and function) of a pinned list of
pure-Python standard-library modules, read with `ast` from the interpreter's
own source files (nothing is imported). They are written English prose about
programming, present on every CPython installation, and distributed under the
PSF licence. Modules in `EVAL_MODULES` are held out for evaluation; the rest
is the training text.

Tokenizers (`config.tokenizer`):

* ``"bpe"`` (the default): a byte-level BPE vocabulary of
  `config.vocab_size` tokens (RoBERTa's and GPT-2's subword scheme: the 256
  byte symbols, then merges; special tokens ``[PAD] [UNK] [CLS] [SEP]
  [MASK]``) trained with the `tokenizers` library on the training text at
  first use. Training is deterministic (the same corpus gives the same
  vocabulary, byte for byte: every symbol is in the sorted byte alphabet,
  so merge ties are broken by fixed ids). The vocabulary is cached in the
  workdir (``tokenizer-bpe-V-CORPUSHASH.json``) and its SHA-256 goes to
  `results.json` (`tokenizer_sha256`). WordPiece is not offered: the
  WordPiece trainer of tokenizers 0.23 gives its ``##`` pieces ids in hash
  order, so two trainings on the same text differ (tokenizers issue #1794).
* ``"bytes"``: UTF-8 bytes (ids 0..255) plus `PAD` and `MASK`; nothing to
  train, the same on every machine.

Reproducibility: the text differs between CPython releases (docstrings get
edited), so `corpus()` hashes it (SHA-256 of the UTF-8 train and eval text)
and compares with `PINNED_SHA256`, recorded per CPython version. On a pinned
version a different hash raises `ValueError` (the standard library was
modified); on another version the run goes on and `results.json` records the
hash it used (`corpus_sha256`), so numbers are comparable only between runs
with the same hash.

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

import ast
import dataclasses
import functools
import hashlib
import json
import os
import platform
import sysconfig
import warnings
from collections.abc import Callable
from typing import Any

import grain
import numpy as np

PAD = 256
MASK = 257
VOCAB_SIZE = 264  # 256 bytes, PAD, MASK, padded to a multiple of 8

#: Training modules (dotted names under the standard library's directory).
TRAIN_MODULES = (
    "_pydecimal", "_pyio", "abc", "argparse", "ast", "asyncio.events", "base64",
    "bdb", "bisect", "cmd", "code", "codecs", "collections", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "difflib", "dis",
    "doctest", "email.message", "enum", "ftplib", "functools", "gettext", "glob",
    "hashlib", "hmac", "http.client", "http.server", "imaplib", "inspect",
    "ipaddress", "json", "locale", "logging", "mailbox", "multiprocessing.pool",
    "numbers", "operator", "optparse", "os", "pathlib", "pdb", "pickle",
    "pickletools", "platform", "poplib", "pprint", "pydoc", "queue", "random",
    "sched", "secrets", "selectors", "shlex", "shutil", "signal", "smtplib",
    "socket", "socketserver", "ssl", "string", "subprocess", "tarfile",
    "tempfile", "threading", "timeit", "tokenize", "trace", "traceback",
    "typing", "unittest.case", "urllib.parse", "uuid", "warnings", "weakref",
    "xml.dom.minidom", "zipfile",
)
#: Held-out modules: the evaluation text.
EVAL_MODULES = ("calendar", "fractions", "heapq", "statistics", "textwrap")

#: SHA-256 of the corpus text, by CPython version (see the module docstring).
PINNED_SHA256 = {
    "3.12.1": "4859aa5127060e994c5eeded06d91540d71ff8508f3ca29890e7de6a43127ed5",
}


def _module_path(lib: str, name: str) -> str:
  base = os.path.join(lib, *name.split("."))
  for path in (base + ".py", os.path.join(base, "__init__.py")):
    if os.path.exists(path):
      return path
  raise FileNotFoundError(
      f"standard-library module {name!r} not found under {lib} (looked for "
      f"{base}.py and {base}/__init__.py)."
  )


def module_docstrings(name: str, lib: str | None = None) -> str:
  """The docstrings of one standard-library module, in source order.

  Args:
    name: a dotted module name, e.g. ``"argparse"`` or ``"http.client"``.
    lib: the standard library's directory (default: this interpreter's).

  Returns:
    The module, class and function docstrings (``ast.get_docstring`` with
    indentation cleaned), separated by blank lines.
  """
  lib = lib or sysconfig.get_paths()["stdlib"]
  with open(_module_path(lib, name), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
  docs = [ast.get_docstring(node, clean=True) for node in ast.walk(tree)
          if isinstance(node, kinds)]
  return "\n\n".join(d for d in docs if d)


@functools.cache
def corpus() -> dict[str, object]:
  """The training and evaluation text as byte ids, with its hash.

  Returns:
    ``{"train": uint16 byte ids, "eval": uint16 byte ids, "sha256": hex
    digest, "python": version, "pinned": whether the version has a pinned
    hash, "text": {"train": str, "eval": str}}``.

  Raises:
    ValueError: on a CPython version with a pinned hash, when the text
      hashes differently.
  """
  text = {split: "\n\n".join(module_docstrings(m) for m in mods)
          for split, mods in (("train", TRAIN_MODULES), ("eval", EVAL_MODULES))}
  digest = hashlib.sha256()
  for split in ("train", "eval"):
    digest.update(text[split].encode("utf-8"))
  sha = digest.hexdigest()
  version = platform.python_version()
  pinned = PINNED_SHA256.get(version)
  if pinned is not None and pinned != sha:
    raise ValueError(
        f"The standard-library docstring corpus of Python {version} hashes to "
        f"{sha}, not the pinned {pinned}: the standard library of this "
        "interpreter was modified."
    )
  if pinned is None:
    warnings.warn(
        f"Python {version} has no pinned corpus hash (pinned: "
        f"{', '.join(PINNED_SHA256)}); its docstrings may differ, results record "
        f"corpus_sha256={sha[:12]}...", stacklevel=2)
  ids = {s: np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.uint16)
         for s, t in text.items()}
  return {**ids, "sha256": sha, "python": version, "pinned": pinned is not None,
          "text": text}


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


@dataclasses.dataclass(frozen=True)
class Vocab:
  """A tokenizer's ids as the model and the masking need them.

  Attributes:
    kind: "bpe" or "bytes".
    size: the embedding table's rows (the vocabulary padded to a multiple of 8).
    pad_id, mask_id: the special ids.
    random_ids: ``[low, high)``, the non-special ids random replacements take.
    sha256: the SHA-256 of the tokenizer file ("" for bytes).
    path: the cached tokenizer file ("" for bytes).
  """

  kind: str
  size: int
  pad_id: int
  mask_id: int
  random_ids: tuple[int, int]
  sha256: str = ""
  path: str = ""

  def encode(self, text: str) -> np.ndarray:
    """The ids of `text` (paragraph by paragraph), uint16."""
    if self.kind == "bytes":
      return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.uint16)
    tok = _load_tokenizer(self.path, self.sha256)
    pieces = tok.encode_batch([p for p in text.split("\n\n") if p.strip()])
    return np.concatenate([np.asarray(e.ids, np.uint16) for e in pieces])


SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BYTES = Vocab("bytes", VOCAB_SIZE, PAD, MASK, (0, 256))


def _pad8(n: int) -> int:
  return -(-n // 8) * 8


@functools.cache
def _load_tokenizer(path: str, sha256: str):
  import tokenizers  # noqa: PLC0415

  del sha256  # part of the cache key
  return tokenizers.Tokenizer.from_file(path)


def train_bpe(text: str, vocab_size: int) -> str:
  """A byte-level BPE vocabulary trained on `text`, as the tokenizer's JSON.

  The scheme of RoBERTa and GPT-2 (Liu et al., "RoBERTa", 2019,
  https://arxiv.org/abs/1907.11692, §4.4): text is split into words with
  their leading space, each word is a sequence of byte symbols, and the
  most frequent adjacent pair is merged until `vocab_size` tokens exist;
  no text is ever unknown. Deterministic: the same text and size give the
  same JSON.

  Args:
    text: the training text (paragraphs separated by blank lines).
    vocab_size: the vocabulary size, >= 512 (the 256 bytes, the special
      tokens and merges).

  Returns:
    The serialized `tokenizers.Tokenizer`.
  """
  if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 512:
    raise ValueError(f"config.vocab_size must be an integer >= 512, got {vocab_size!r}.")
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator([p for p in text.split("\n\n") if p.strip()], trainer)
  return tok.to_str()


def get_vocab(kind: str, *, vocab_size: int = 8192, cache_dir: str | None = None) -> Vocab:
  """The tokenizer of a run: trained (or read from `cache_dir`) for "bpe".

  Args:
    kind: "bpe" or "bytes".
    vocab_size: the BPE vocabulary size.
    cache_dir: where the trained tokenizer is kept (the workdir); None
      trains it again.

  Returns:
    A `Vocab`.
  """
  if kind == "bytes":
    return BYTES
  if kind != "bpe":
    raise ValueError(f"config.tokenizer must be 'bpe' or 'bytes', got {kind!r}.")
  data = corpus()
  name = f"tokenizer-bpe-{vocab_size}-{data['sha256'][:12]}.json"
  path = os.path.join(cache_dir, name) if cache_dir else None
  if path and os.path.exists(path):
    with open(path) as f:
      blob = f.read()
  else:
    blob = train_bpe(data["text"]["train"], vocab_size)
    if path is None:
      import tempfile  # noqa: PLC0415

      path = os.path.join(tempfile.mkdtemp(), name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
      f.write(blob)
    os.replace(tmp, path)
  sha = hashlib.sha256(blob.encode()).hexdigest()
  vocab = json.loads(blob)["model"]["vocab"]
  n = len(vocab)
  return Vocab("bpe", _pad8(n), vocab["[PAD]"], vocab["[MASK]"], (len(SPECIAL_TOKENS), n),
               sha, path)


@functools.cache
def _token_ids(vocab: Vocab, split: str) -> np.ndarray:
  return vocab.encode(corpus()["text"][split])


def token_counts(vocab: Vocab, split: str = "train") -> np.ndarray:
  """How often each id occurs in the tokenized `split` text, ``[vocab.size]`` int64."""
  return np.bincount(_token_ids(vocab, split), minlength=vocab.size).astype(np.int64)


def log_unigram_prior(vocab: Vocab) -> np.ndarray:
  """Log-frequencies of the training tokens, add-one smoothed: the output bias's start.

  .. math:: b_v = \\log \\frac{c_v + 1}{\\sum_u (c_u + 1)}

  with :math:`c_v` the count of id :math:`v` in the training text (0 for
  the special and padding ids). A model whose other logits are near zero
  then predicts the unigram distribution from its first step.

  Args:
    vocab: the run's tokenizer.

  Returns:
    float32 ``[vocab.size]``.
  """
  c = token_counts(vocab, "train").astype(np.float64) + 1.0
  return np.log(c / c.sum()).astype(np.float32)


def unigram_entropy(tokens: np.ndarray, pad_id: int) -> float:
  """The entropy (nats) of the token frequencies of `tokens`, pads left out.

  .. math:: H = -\\sum_v p_v \\log p_v, \\qquad
     p_v = \\frac{\\#\\{i : t_i = v\\}}{\\#\\{i : t_i \\ne \\text{pad}\\}}

  Over the tokens of an evaluation set (`eval_set`'s ``targets``) this is
  the MLM loss of the best context-free predictor of *that* text:
  `mask_tokens` chooses every non-pad position with the same probability,
  so a masked target is distributed as :math:`p`. A model whose eval loss is
  below it uses the context.

  Args:
    tokens: int ids, any shape.
    pad_id: the id that is never masked.

  Returns:
    :math:`H` in nats.
  """
  ids = np.asarray(tokens).ravel()
  ids = ids[ids != pad_id]
  p = np.bincount(ids) / ids.size
  p = p[p > 0]
  return float(-(p * np.log(p)).sum())


class Windows:
  """A grain data source: the non-overlapping `seq_len` windows of token ids."""

  def __init__(self, ids: np.ndarray, seq_len: int, name: str):
    if seq_len >= len(ids):
      raise ValueError(f"seq_len={seq_len} must be shorter than the text ({len(ids)} tokens).")
    self.ids, self.seq_len, self.name = ids, seq_len, name
    self.n = len(ids) // seq_len

  def __len__(self) -> int:
    return self.n

  def __getitem__(self, i: int) -> np.ndarray:
    return self.ids[int(i) * self.seq_len : (int(i) + 1) * self.seq_len]

  def __repr__(self) -> str:
    return f"Windows({self.name}, tokens={len(self.ids)}, seq_len={self.seq_len})"


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
  source = Windows(_token_ids(vocab, "train"), seq_len, f"train/{vocab.kind}/{vocab.sha256[:12]}")
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
  ids = _token_ids(vocab, "eval")
  n = len(ids) // seq_len
  if max_sequences is not None:
    n = min(n, max_sequences)
  windows = ids[: n * seq_len].reshape(n, seq_len)
  return mask_tokens(windows, np.random.default_rng([seed, 2**31 - 1]), mask_rate,
                     pad_id=vocab.pad_id, mask_id=vocab.mask_id, random_ids=vocab.random_ids)
