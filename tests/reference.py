"""NumPy references written from the math in docs/algorithms.md (float64, per layer).

Complex inputs are kept complex (complex128); norms are sqrt(Σ|x|²).

These never import date_optax: each function restates one formula so that the
tests compare the library against the specification, not against itself.
"""

from __future__ import annotations

import numpy as np


def arr(x):
  """float64, or complex128 for complex input."""
  x = np.asarray(x)
  return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def norm(x, axes=None):
  x = arr(x)
  if axes is None:
    return np.sqrt(np.sum(np.abs(x) ** 2))
  return np.sqrt(np.sum(np.abs(x) ** 2, axis=axes, keepdims=True))


def masks(trust, decay, k):
  """The package's rule: one mask given is used for both; none = all."""
  if trust is None and decay is None:
    return True, True
  if trust is None:
    return decay[k], decay[k]
  if decay is None:
    return trust[k], trust[k]
  return trust[k], decay[k]


def ratio(w_norm, d_norm, c=1.0, eps=0.0, lower=None, upper=None, g_norm=None):
  """docs/algorithms.md, "Layers and trust ratios": c‖w‖/(‖d‖+eps); 1 if a norm is 0; then clipped.

  With `g_norm` (sum-of-norms LARS) the zero test is on ‖w‖ and ‖g‖ (MLPerf,
  timm) instead of the whole denominator.
  """
  w_norm = np.asarray(w_norm, np.float64)
  d_norm = np.asarray(d_norm, np.float64)
  zero_d = d_norm == 0 if g_norm is None else np.asarray(g_norm) == 0
  with np.errstate(divide="ignore", invalid="ignore"):
    r = c * w_norm / (d_norm + eps)
  r = np.where((w_norm == 0) | zero_d, 1.0, r)
  if lower is not None:
    r = np.maximum(r, lower)
  if upper is not None:
    r = np.minimum(r, upper)
  return r


class Lars:
  """docs/algorithms.md, "LARS": m = β m + η r (g + λw); w -= m. One layer per array."""

  def __init__(self, lr, wd=0.0, beta=0.9, c=0.001, eps=0.0, nesterov=False,
               sum_of_norms=True, trust=None, decay=None):
    self.lr, self.wd, self.beta, self.c, self.eps = lr, wd, beta, c, eps
    self.nesterov, self.sum_of_norms = nesterov, sum_of_norms
    self.trust, self.decay = trust, decay
    self.m = None
    self.t = 0

  def step(self, params: dict, grads: dict) -> dict:
    if self.m is None:
      self.m = {k: np.zeros_like(arr(v)) for k, v in params.items()}
    lr = self.lr(self.t) if callable(self.lr) else self.lr
    out = {}
    for k in params:
      w = arr(params[k])
      g = arr(grads[k])
      trust, decay = masks(self.trust, self.decay, k)
      wd = self.wd if decay else 0.0
      v = g + wd * w
      if trust:
        if self.sum_of_norms:
          den = norm(g) + wd * norm(w)
          v = ratio(norm(w), den, self.c, self.eps, g_norm=norm(g)) * v
        else:
          v = ratio(norm(w), norm(v), self.c, self.eps) * v
      self.m[k] = self.beta * self.m[k] + lr * v
      upd = lr * v + self.beta * self.m[k] if self.nesterov else self.m[k]
      out[k] = w - upd
    self.t += 1
    return out


class Lamb:
  """docs/algorithms.md, "LAMB"."""

  def __init__(self, lr, b1=0.9, b2=0.999, eps=1e-6, wd=0.0, lower=None,
               upper=None, bias_correction=True, normalize=False, trust=None,
               decay=None, decoupled=False):
    self.__dict__.update(locals())
    del self.__dict__["self"]
    self.m = self.v = None
    self.t = 0

  def step(self, params, grads):
    if self.m is None:
      self.m = {k: np.zeros_like(arr(v)) for k, v in params.items()}
      self.v = {k: np.zeros(np.shape(v), np.float64) for k, v in params.items()}
    self.t += 1
    scale = 1.0
    if self.normalize:
      gn = np.sqrt(sum(np.sum(np.abs(arr(g)) ** 2) for g in grads.values()))
      scale = 1.0 / max(gn, 1.0)
    out = {}
    for k in params:
      w = arr(params[k])
      g = arr(grads[k]) * scale
      self.m[k] = self.b1 * self.m[k] + (1 - self.b1) * g
      self.v[k] = self.b2 * self.v[k] + (1 - self.b2) * np.abs(g) ** 2
      if self.bias_correction:
        mh = self.m[k] / (1 - self.b1**self.t)
        vh = self.v[k] / (1 - self.b2**self.t)
      else:
        mh, vh = self.m[k], self.v[k]
      trust, decay = masks(self.trust, self.decay, k)
      adam = mh / (np.sqrt(vh) + self.eps)
      # Coupled: λw joins u (and the ratio); decoupled: w -= η λ w beside it.
      u = adam + (self.wd * w if decay and not self.decoupled else 0.0)
      r = ratio(norm(w), norm(u), 1.0, 0.0, self.lower, self.upper) if trust else 1.0
      out[k] = w - self.lr * r * u
      if decay and self.decoupled:
        out[k] = out[k] - self.lr * self.wd * w
    return out


class Base:
  """Base solvers' directions without learning rate (docs/algorithms.md, "Bounded LARS")."""

  def __init__(self, kind, beta=0.9, b1=0.9, b2=0.999, eps=None, decay=0.9,
               init_acc=0.1, init_scale=0.0):
    self.kind, self.beta, self.b1, self.b2 = kind, beta, b1, b2
    self.decay, self.init_acc, self.init_scale = decay, init_acc, init_scale
    self.eps = eps if eps is not None else (1e-7 if kind == "adagrad" else 1e-8)
    self.s = {}
    self.t = 0

  def direction(self, k, g):
    g = arr(g)
    if self.kind == "sgd":
      return g
    if self.kind in ("momentum", "nesterov"):
      a = self.beta * self.s.get(k, 0.0) + g
      self.s[k] = a
      return g + self.beta * a if self.kind == "nesterov" else a
    if self.kind == "adagrad":
      acc = self.s.get(k, self.init_acc) + np.abs(g) ** 2
      self.s[k] = acc
      return g / np.sqrt(acc + self.eps)
    if self.kind == "rmsprop":
      nu = self.decay * self.s.get(k, self.init_scale) + (1 - self.decay) * np.abs(g) ** 2
      self.s[k] = nu
      return g / np.sqrt(nu + self.eps)
    if self.kind == "adam":
      m, v = self.s.get(k, (0.0, 0.0))
      m = self.b1 * m + (1 - self.b1) * g
      v = self.b2 * v + (1 - self.b2) * np.abs(g) ** 2
      self.s[k] = (m, v)
      mh = m / (1 - self.b1 ** (self.t + 1))
      vh = v / (1 - self.b2 ** (self.t + 1))
      return mh / (np.sqrt(vh) + self.eps)
    raise ValueError(self.kind)


class BoundedLars:
  """docs/algorithms.md, "Bounded LARS": w -= η clip(‖w‖/‖g‖, lo, hi) base(g + λw)."""

  def __init__(self, lr, base, lower=0.01, upper=10.0, source="gradient",
               wd=0.0, trust=None, decay=None, **kw):
    self.lr, self.lower, self.upper, self.source = lr, lower, upper, source
    self.wd, self.trust, self.decay = wd, trust, decay
    self.base = Base(base, **kw)

  def step(self, params, grads):
    out = {}
    for k in params:
      w = arr(params[k])
      g = arr(grads[k])
      trust, decay = masks(self.trust, self.decay, k)
      d = self.base.direction(k, g + (self.wd * w if decay else 0.0))
      src = g if self.source == "gradient" else d
      r = ratio(norm(w), norm(src), 1.0, 0.0, self.lower, self.upper) if trust else 1.0
      out[k] = w - self.lr * r * d
    self.base.t += 1
    return out
