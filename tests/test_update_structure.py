"""Every public transform's update is straight-line array code (issue 22).

The update of each transform, lowered on a tree with ResNet-50's leaf shapes
(``benchmarks/optimizer_step.py``'s tree with its widths divided by 16: its
28 distinct shapes, at most two leaves of each, so that every shape shared
by several leaves is still a stacked group and lowering stays fast; tracing
costs per leaf, not per shape), must contain no control flow
(``stablehlo.case``/``if``/``while``: a GPU conditional waits for its
predicate once per leaf) and no ``dot_general`` (a norm written as a dot is a
library call that XLA cannot fuse with the reduction's producers).
"""

import functools
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import date_optax  # noqa: E402
from benchmarks import optimizer_step  # noqa: E402
from date_optax._src import grouped_norms  # noqa: E402
from date_optax._src import lars as lars_lib  # noqa: E402

# ResNet-50 v1.5's 161 leaves (conv kernels, BN scale/bias, fc), widths / 16.
SHAPES = optimizer_step.resnet50_shapes(width=4, num_classes=10)
# For the lowered updates: the first two leaves of each shape (46 leaves).
TREE = {k: s for k, s in SHAPES.items()
        if list(SHAPES.values())[:list(SHAPES).index(k)].count(s) < 2}
MASK = {k: len(s) > 1 for k, s in TREE.items()}
BASELINE = date_optax.Baseline(optimizer="momentum", batch_size=256, learning_rate=0.1,
                               warmup_epochs=1.0, epochs=90, num_examples=40960)
ADAM_BASELINE = date_optax.Baseline(optimizer="adam", batch_size=256, learning_rate=1e-3,
                                    warmup_epochs=1.0, epochs=90, num_examples=40960)

TRANSFORMS = {
    "scale_by_trust_ratio": lambda: date_optax.scale_by_trust_ratio(),
    "scale_by_trust_ratio(bounds,wd)": lambda: date_optax.scale_by_trust_ratio(
        0.01, lower=0.01, upper=10.0, weight_decay=1e-4),
    "scale_by_trust_ratio(norm_of_sum)": lambda: date_optax.scale_by_trust_ratio(
        0.01, weight_decay=1e-4, denominator="norm_of_sum"),
    "scale_by_trust_ratio(adam)": lambda: date_optax.scale_by_trust_ratio(
        inner=optax.scale_by_adam(), weight_decay=1e-4, trust_ratio_mask=MASK),
    "scale_by_trust_ratio(adam,gradient)": lambda: date_optax.scale_by_trust_ratio(
        inner=optax.scale_by_adam(), ratio_source="gradient", weight_decay=1e-4,
        denominator="norm_of_sum"),
    "lars": lambda: date_optax.lars(0.1, weight_decay=1e-4),
    "lars(norm_of_sum)": lambda: date_optax.lars(0.1, weight_decay=1e-4,
                                                 denominator="norm_of_sum"),
    "lars(nesterov,masks,bounds)": lambda: date_optax.lars(
        optax.cosine_decay_schedule(0.1, 100), weight_decay=1e-4, nesterov=True,
        trust_ratio_mask=MASK, lower=0.01, upper=10.0),
    "lamb": lambda: date_optax.lamb(1e-3, weight_decay=1e-2),
    "lamb(nvlamb,decoupled)": lambda: date_optax.lamb(
        1e-3, weight_decay=1e-2, normalize_grads=True, decoupled_weight_decay=True,
        weight_decay_mask=MASK, lower=0.0, upper=10.0),
    **{f"bounded_lars({base})": (lambda base=base: date_optax.bounded_lars(
        0.1, base=base, weight_decay=1e-4)) for base in lars_lib.BASES},
    "bounded_lars(adam,update)": lambda: date_optax.bounded_lars(
        1e-3, base="adam", ratio_source="update", trust_ratio_mask=MASK),
    "date(momentum)": lambda: date_optax.date(BASELINE, 4096),
    "date(adam)": lambda: date_optax.date(ADAM_BASELINE, 4096),
}

CONTROL_FLOW = re.compile(r"stablehlo\.(case|if|while)\b")
DOT = re.compile(r"\bdot_general\b|stablehlo\.dot\b")


def lowered_update(tx) -> str:
  rng = np.random.default_rng(0)
  params = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in TREE.items()}
  grads = jax.tree.map(lambda p: 0.01 * p, params)
  state = tx.init(params)
  return jax.jit(tx.update).lower(grads, state, params).as_text()


def test_tree_has_resnet50s_leaves():
  assert len(SHAPES) == 161
  assert len(TREE) == 46 and set(TREE.values()) == set(SHAPES.values())


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_update_has_no_control_flow_and_no_dot(name):
  text = lowered_update(TRANSFORMS[name]())
  control = CONTROL_FLOW.findall(text)
  dots = DOT.findall(text)
  assert not control, f"{name}: {len(control)} control-flow ops in the update"
  assert not dots, f"{name}: {len(dots)} dot_general ops in the update"


def test_the_patterns_see_control_flow_and_dots():
  # The check itself can fail: a per-leaf lax.cond and a dot norm are found.
  def bad(u, s, p):
    del s
    out = jax.tree.map(
        lambda g, w: jax.lax.cond(jnp.vdot(w, w) > 0, lambda: g, lambda: -g), u, p)
    return out, None

  params = {"w": jnp.ones((3, 4)), "b": jnp.ones(4)}
  text = jax.jit(bad).lower(params, None, params).as_text()
  assert len(CONTROL_FLOW.findall(text)) >= 2
  assert len(DOT.findall(text)) >= 2


# --------------------------------------------------------------------------
# Kernel count (issue 31): small leaves of one shape share one stacked
# reduction, and the ratios are recorded in one vector (LayerRatios), so a
# layer-wise update costs its base optimizer's kernels per leaf (LAMB: one
# more, for Adam's direction) and a fixed number per distinct small shape,
# however many leaves share it.

STRUCTURE = {
    # name: (transform, base optax optimizer (a BASES key), extra kernels per leaf)
    "lars": (lambda: date_optax.lars(0.1, weight_decay=1e-4, denominator="norm_of_sum"),
             "momentum", 0),
    "bounded_lars": (lambda: date_optax.bounded_lars(0.1), "momentum", 0),
    "date(momentum)": (lambda: date_optax.date(BASELINE, 4096), "momentum", 0),
    # Adam's direction is formed once for its norm and its update: +1.
    "lamb": (lambda: date_optax.lamb(1e-3, weight_decay=1e-4), "adamw", 1),
    "date(adam)": (lambda: date_optax.date(ADAM_BASELINE, 4096), "adamw", 1),
}
BASES = {"momentum": lambda: optax.sgd(0.1, momentum=0.9),
         "adamw": lambda: optax.adamw(1e-3, weight_decay=1e-4)}


def fusions(tx, shapes) -> int:
  params = optimizer_step.make_tree(shapes, 0)
  grads = optimizer_step.make_tree(shapes, 1)
  return optimizer_step.compile_step(tx, params, grads)[3]["fusions"]


def small_tree(n):
  return optimizer_step.small_leaves_shapes(n, width=8)


def growth(tx_fn, few, many) -> int:
  """Kernels the compiled step gains from `few` small leaves to `many`."""
  return fusions(tx_fn(), small_tree(many)) - fusions(tx_fn(), small_tree(few))


@functools.cache
def base_growth(base: str, few: int, many: int) -> int:
  """`growth` of a BASES optimizer, compiled once for the tests that share it."""
  return growth(BASES[base], few, many)


@pytest.mark.parametrize("name", list(STRUCTURE))
def test_kernel_count_per_leaf_is_the_base_optimizers(name):
  # 40 more leaves of the same two shapes cost the base optimizer's kernels
  # per leaf (plus, for Adam, its direction), and at most a few more for
  # larger stacked reductions: no reduction and no recorded ratio per leaf.
  make, base, per_leaf = STRUCTURE[name]
  extra = growth(make, 20, 60) - base_growth(base, 20, 60) - per_leaf * 40
  assert extra <= 4, f"{name}: {extra} kernels beyond the per-leaf cost for 40 leaves"


# make test-all (~14 s each): the grouped norms these count run in
# test_kernel_count_per_leaf_is_the_base_optimizers (the per-leaf cost, two
# shapes) and test_kernel_count_test_sees_per_leaf_reductions (grouping off
# fails the count); here on ResNet-50's 28 shapes.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_kernel_count_on_resnet50s_161_leaves(name):
  # Beyond the per-leaf cost, a few kernels per distinct small shape.
  make, base, per_leaf = STRUCTURE[name]
  groups = len(set(SHAPES.values()))
  extra = fusions(make(), SHAPES) - fusions(BASES[base](), SHAPES) - per_leaf * len(SHAPES)
  assert extra <= 6 * groups, f"{name}: {extra} extra kernels, {groups} shapes"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_kernel_count_on_1000_leaves(name):
  make, base, per_leaf = STRUCTURE[name]
  shapes = optimizer_step.small_leaves_shapes(1000)
  extra = fusions(make(), shapes) - fusions(BASES[base](), shapes) - per_leaf * len(shapes)
  assert extra <= 16, f"{name}: {extra} extra kernels on 1,000 leaves of two shapes"


def test_kernel_count_test_sees_per_leaf_reductions(monkeypatch):
  # The check can fail: with grouping off (every leaf reduced on its own, the
  # update before issue 31) LARS costs 2-3 kernels per leaf beyond the allowance.
  monkeypatch.setattr(grouped_norms, "GROUP_MAX_ELEMENTS", 0)
  make, base, per_leaf = STRUCTURE["lars"]
  assert growth(make, 20, 60) - base_growth(base, 20, 60) - per_leaf * 40 >= 80


# --------------------------------------------------------------------------
# Temporary memory (issue 31, item 4): the norm of ``g + λw`` is reduced from
# ``g`` and ``w`` themselves, so a large layer's LARS step writes no
# parameter-sized temporary (it used to write ``g + λw`` once for both the
# reduction and the update). LAMB writes Adam's direction once for its norm
# and its update, one large layer at a time: the next layer's direction waits
# for the previous layer's ratio, so the step holds one layer's, not the
# model's (docs/RESULTS.md).

# Above GROUP_MAX_ELEMENTS, so each is reduced on its own; two of one shape,
# whose reductions must not share a broadcast either.
LARGE = {"a": (512, 768), "b": (512, 768), "c": (768, 512)}


@pytest.mark.parametrize("make", [
    lambda: date_optax.lars(0.1, weight_decay=1e-4, denominator="norm_of_sum"),
    lambda: date_optax.scale_by_trust_ratio(0.01, weight_decay=1e-4,
                                            denominator="norm_of_sum"),
    lambda: date_optax.lars(0.1, weight_decay=1e-4),
], ids=["lars(norm_of_sum)", "scale_by_trust_ratio(norm_of_sum)", "lars"])
def test_large_layer_step_writes_no_parameter_sized_temporary(make):
  params = optimizer_step.make_tree(LARGE, 0)
  grads = optimizer_step.make_tree(LARGE, 1)
  temp = optimizer_step.compile_step(make(), params, grads)[3]["temp_bytes"]
  leaf = 4 * 512 * 768
  assert temp < leaf // 8, f"{temp} temporary bytes for {leaf}-byte layers"


# Six large layers: one layer's direction is 1.6 MB, the model's 9.4 MB.
SIX = {f"l{i}": (512, 768) for i in range(6)}


def test_lamb_holds_one_large_layers_direction_at_a_time():
  params = optimizer_step.make_tree(SIX, 0)
  grads = optimizer_step.make_tree(SIX, 1)
  leaf = 4 * 512 * 768
  lamb = date_optax.lamb(1e-3, weight_decay=1e-2)
  temp = optimizer_step.compile_step(lamb, params, grads)[3]["temp_bytes"]
  # Two in flight: a layer's direction waits for the ratio two large layers back.
  assert temp <= 2.25 * leaf, f"{temp} temporary bytes for {leaf}-byte layers"
  # The check can fail: the same arithmetic with Adam's directions made for
  # the whole tree first (a generic inner solver) holds them all on the CPU.
  chained = date_optax.scale_by_trust_ratio(
      inner=optax.scale_by_adam(eps=1e-6), weight_decay=1e-2, denominator="norm_of_sum")
  temp_all = optimizer_step.compile_step(chained, params, grads)[3]["temp_bytes"]
  assert temp_all >= 4 * leaf, f"{temp_all} temporary bytes without the order"


def _mlp_loss(params, batch):
  h = batch["x"]
  for name in ("l0", "l1", "l2"):
    h = jax.nn.gelu(h @ params[name])
  return jnp.mean((h @ params["head"] - batch["y"]) ** 2)


def test_lamb_order_copies_nothing_in_a_sharded_train_step():
  # The order between large layers is a barrier on each layer's moments (the
  # step's inputs). A barrier on its gradient, which a transposed product
  # makes in another layout, made XLA copy the gradient into the barrier's
  # layout: two parameter-sized copies per layer in this step.
  mesh = jax.make_mesh((4, 2), ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  rng = np.random.default_rng(0)
  dims = {"l0": (64, 512), "l1": (512, 512), "l2": (512, 512), "head": (512, 8)}
  params = {k: jnp.asarray(rng.normal(size=s) / np.sqrt(s[0]), jnp.float32)
            for k, s in dims.items()}
  p_sh = {k: NamedSharding(mesh, P("model", None)) for k in dims}
  batch = {"x": jnp.ones((64, 64)), "y": jnp.ones((64, 8))}
  b_sh = NamedSharding(mesh, P("data"))
  opt = date_optax.lamb(1e-3, weight_decay=1e-2)

  def step(params, state, batch):
    grads = jax.grad(_mlp_loss)(params, batch)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  params = jax.device_put(params, p_sh)
  state = opt.init(params)
  text = jax.jit(step, donate_argnums=(0, 1)).lower(
      params, state, jax.device_put(batch, b_sh)).compile().as_text()
  # Copies (alone or fused) that XLA attributes to the barrier.
  copies = [ln for ln in text.splitlines() if "optimization_barrier" in ln
            and re.search(r"\bcopy\(|wrapped_copy", ln.split("metadata=")[0])]
  assert not copies, copies[:2]
  # The three large kernels' norms are all-reduced over "model" in at most
  # two collectives: a layer waits for the ratio two large layers back, so
  # one layer's collective overlaps the next layer's work (waiting for the
  # previous layer's put each layer's collective in series: three).
  norm_collectives = [ln for ln in text.splitlines()
                      if re.search(r"= \(f32\[\](, f32\[\])*\) all-reduce\(", ln)]
  assert len(norm_collectives) <= 2, norm_collectives
