"""Real English text with no download: the docstrings of the Python standard library.

The text and the tokenizers that the language-model examples share
(`examples/bert_lamb`, masked; `examples/gpt_lm`, causal). Each example's
`input_pipeline.py` builds its own batches from the token ids here.

The corpus is the docstrings (module, class and function) of a pinned list of
pure-Python standard-library modules, read with `ast` from the interpreter's
own source files (nothing is imported). They are written English prose about
programming, present on every CPython installation, and distributed under the
PSF licence. Modules in `EVAL_MODULES` are held out for evaluation; the rest
is the training text.

Tokenizers (an example's `config.tokenizer`):

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
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import functools
import hashlib
import json
import os
import platform
import sysconfig
import warnings

import jax.numpy as jnp
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
  docs = [ast.get_docstring(node, clean=True) for node in _statements_breadth_first(tree)
          if isinstance(node, kinds)]
  return "\n\n".join(d for d in docs if d)


def _statements_breadth_first(tree: ast.AST):
  """`ast.walk`'s order (breadth first) over the nodes a definition can sit in.

  Definitions are statements nested only in statements, `except` handlers
  and `case` blocks, never inside an expression: skipping expressions keeps
  every definition at its depth and in its place among its level's nodes, so
  the docstrings come out as `ast.walk` gives them (the corpus's pinned
  hashes), in about half the time.
  """
  kinds = (ast.stmt, ast.excepthandler, ast.match_case)
  todo = collections.deque([tree])
  while todo:
    node = todo.popleft()
    todo.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, kinds))
    yield node


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



@dataclasses.dataclass(frozen=True)
class Vocab:
  """A tokenizer's ids as the models and BERT's masking need them.

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


@functools.cache
def _trained_bpe(corpus_sha256: str, vocab_size: int) -> str:
  """`train_bpe` of the training text, once per process (training is
  deterministic, so a second workdir gets a copy instead of a retraining)."""
  del corpus_sha256  # the cache key: the text corpus() returns
  return train_bpe(corpus()["text"]["train"], vocab_size)


def get_vocab(kind: str, *, vocab_size: int = 8192, cache_dir: str | None = None) -> Vocab:
  """The tokenizer of a run: trained (or read from `cache_dir`) for "bpe".

  Args:
    kind: "bpe" or "bytes".
    vocab_size: the BPE vocabulary size.
    cache_dir: where the trained tokenizer is kept (the workdir); None:
      a temporary directory. A vocabulary not in `cache_dir` is trained
      once per process and size (deterministic, so later calls copy it).

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
    blob = _trained_bpe(data["sha256"], vocab_size)
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
def token_ids(vocab: Vocab, split: str) -> np.ndarray:
  """The ids of the `split` text ("train" or "eval") under `vocab`, uint16 (cached)."""
  if split not in ("train", "eval"):
    raise ValueError(f"split must be 'train' or 'eval', got {split!r}.")
  return vocab.encode(corpus()["text"][split])


def token_counts(vocab: Vocab, split: str = "train") -> np.ndarray:
  """How often each id occurs in the tokenized `split` text, ``[vocab.size]`` int64."""
  return np.bincount(token_ids(vocab, split), minlength=vocab.size).astype(np.int64)


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


def init_output_bias(init: str, params: dict, vocab: Vocab) -> dict:
  """`params` with `head_bias` started as `init` (`config.output_bias_init`) says.

  Args:
    init: "zeros" (`params` as they are) or "unigram" (`head_bias` set to
      `log_unigram_prior(vocab)` in its own dtype).
    params: the language model's parameters, with a `head_bias` leaf.
    vocab: the run's tokenizer.

  Returns:
    The parameters, a new dict when the bias changes.
  """
  if init == "zeros":
    return params
  if init != "unigram":
    raise ValueError('config.output_bias_init must be "unigram" or "zeros", got '
                     f"{init!r}.")
  prior = jnp.asarray(log_unigram_prior(vocab), params["head_bias"].dtype)
  return {**params, "head_bias": prior}


def unigram_entropy(tokens: np.ndarray, pad_id: int) -> float:
  """The entropy (nats) of the token frequencies of `tokens`, pads left out.

  .. math:: H = -\\sum_v p_v \\log p_v, \\qquad
     p_v = \\frac{\\#\\{i : t_i = v\\}}{\\#\\{i : t_i \\ne \\text{pad}\\}}

  Over the target tokens of an evaluation set this is the loss of the best
  context-free predictor of *that* text: for BERT's masked targets
  (`examples/bert_lamb`: every non-pad position is masked with the same
  probability, so a masked target is distributed as :math:`p`) and for a
  causal model's next tokens (`examples/gpt_lm`: every position is a
  target). A model whose eval loss is below it uses the context.

  Args:
    tokens: int ids, any shape.
    pad_id: the padding id, never a target.

  Returns:
    :math:`H` in nats.
  """
  ids = np.asarray(tokens).ravel()
  ids = ids[ids != pad_id]
  p = np.bincount(ids) / ids.size
  p = p[p > 0]
  return float(-(p * np.log(p)).sum())


class Windows:
  """A grain data source: windows of `seq_len` token ids, one every `stride` ids.

  With the default stride (`seq_len`) the windows do not overlap; a causal
  model reads windows of ``seq_len + 1`` ids at stride ``seq_len``, so
  every id but the first is a target exactly once.

  Args:
    ids: the token ids.
    seq_len: ids per window, shorter than `ids`.
    name: the source's name (in its repr, which grain's state records).
    stride: ids between the starts of two windows, in ``[1, seq_len]``
      (default `seq_len`).
  """

  #: The ids are in memory: `dp.data_loader` reads windows without threads.
  in_memory = True

  def __init__(self, ids: np.ndarray, seq_len: int, name: str, *, stride: int | None = None):
    if seq_len >= len(ids):
      raise ValueError(f"seq_len={seq_len} must be shorter than the text ({len(ids)} tokens).")
    stride = seq_len if stride is None else stride
    if isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= seq_len:
      raise ValueError(f"stride must be an integer in [1, seq_len={seq_len}], got {stride!r}.")
    self.ids, self.seq_len, self.name, self.stride = ids, seq_len, name, stride
    self.n = (len(ids) - seq_len) // stride + 1

  def __len__(self) -> int:
    return self.n

  def __getitem__(self, i: int) -> np.ndarray:
    start = int(i) * self.stride
    return self.ids[start : start + self.seq_len]

  def __repr__(self) -> str:
    step = "" if self.stride == self.seq_len else f", stride={self.stride}"
    return f"Windows({self.name}, tokens={len(self.ids)}, seq_len={self.seq_len}{step})"
