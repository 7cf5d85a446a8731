"""Bad inputs to the trust-ratio transforms are named (issues 22 item 7, 26).

Each case was, before, either taken silently or refused by an error from
deep inside JAX that named nothing the user wrote.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import date_optax

PARAMS = {"w": jnp.ones((3, 4)), "b": jnp.zeros(4)}
GRADS = {"w": jnp.full((3, 4), 0.1), "b": jnp.full(4, 0.1)}

CTORS = {
    "lars": lambda **kw: date_optax.lars(0.1, **kw),
    "lamb": lambda **kw: date_optax.lamb(1e-3, **kw),
    "bounded_lars": lambda **kw: date_optax.bounded_lars(0.1, **kw),
    "scale_by_trust_ratio": lambda **kw: date_optax.scale_by_trust_ratio(**kw),
}
# The weight-decay mask's keyword in each constructor.
WD_MASK = {"lars": "weight_decay_mask", "lamb": "weight_decay_mask",
           "bounded_lars": "weight_decay_mask",
           "scale_by_trust_ratio": "weight_decay_mask"}


def first_update(opt, grads=GRADS, params=PARAMS):
  state = opt.init(params)
  return opt.update(grads, state, params)


def raises_naming(exc, *names):
  class Ctx:
    def __enter__(self):
      self.ctx = pytest.raises(exc)
      self.info = self.ctx.__enter__()
      return self.info

    def __exit__(self, *a):
      out = self.ctx.__exit__(*a)
      for n in names:
        assert n in str(self.info.value), f"{n!r} not in: {self.info.value}"
      return out

  return Ctx()


@pytest.mark.parametrize("ctor", list(CTORS))
def test_layer_axes_string_is_named_at_construction(ctor):
  with raises_naming(TypeError, "layer_axes", "'x'"):
    CTORS[ctor](layer_axes="x")
  with raises_naming(TypeError, "layer_axes", "['w']"):
    CTORS[ctor](layer_axes={"w": "0", "b": None})


@pytest.mark.parametrize("ctor", list(CTORS))
def test_mask_of_another_tree_names_mask_and_path(ctor):
  opt = CTORS[ctor](trust_ratio_mask={"w": True, "kernel": False})
  with raises_naming(ValueError, "trust_ratio_mask", "['b']"):
    first_update(opt)
  opt = CTORS[ctor](trust_ratio_mask={"w": True, "b": False, "extra": True})
  with raises_naming(ValueError, "trust_ratio_mask", "['extra']"):
    opt.init(PARAMS)


@pytest.mark.parametrize("ctor", list(CTORS))
@pytest.mark.parametrize("leaf", ["no", None, 1, np.array([True, False, True, True])],
                         ids=["str", "None", "int", "array"])
def test_mask_leaves_must_be_bools(ctor, leaf):
  name = WD_MASK[ctor]
  with raises_naming(TypeError, name, "['b']"):
    CTORS[ctor](**{name: {"w": True, "b": leaf}})
  # The same leaves from a callable are refused at init, naming the mask.
  opt = CTORS[ctor](**{name: lambda p: {"w": True, "b": leaf}})
  with raises_naming(TypeError, name, "['b']"):
    opt.init(PARAMS)


@pytest.mark.parametrize("ctor", list(CTORS))
def test_bool_scalar_masks_are_accepted(ctor):
  opt = CTORS[ctor](**{WD_MASK[ctor]: {"w": np.bool_(True), "b": jnp.asarray(False)}})
  updates, _ = first_update(opt)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(updates))


@pytest.mark.parametrize("ctor", list(CTORS))
def test_gradients_of_another_shape_name_path_and_shapes(ctor):
  opt = CTORS[ctor]()
  bad = {"w": jnp.ones((4, 3)), "b": jnp.ones(4)}
  with raises_naming(ValueError, "['w']", "(4, 3)", "(3, 4)"):
    first_update(opt, grads=bad)
  missing = {"w": jnp.ones((3, 4)), "c": jnp.ones(4)}
  with raises_naming(ValueError, "['b']"):
    first_update(opt, grads=missing)


@pytest.mark.parametrize("kw", [dict(state_dtype=jnp.int32), dict(state_dtype="float99"),
                                dict(state_dtype=jnp.bool_)])
def test_lamb_state_dtype_must_be_floating(kw):
  with raises_naming(TypeError, "state_dtype"):
    date_optax.lamb(1e-3, **kw)


@pytest.mark.parametrize("dtype", [jnp.int32, "float99", "complex64x"])
def test_lars_accumulator_dtype_must_be_floating(dtype):
  with raises_naming(TypeError, "accumulator_dtype"):
    date_optax.lars(0.1, accumulator_dtype=dtype)


@pytest.mark.parametrize("ctor", ["lars", "bounded_lars", "scale_by_trust_ratio"])
@pytest.mark.parametrize("value", [0.0, -1.0])
def test_trust_coefficient_must_be_positive_everywhere(ctor, value):
  with raises_naming(ValueError, "trust_coefficient"):
    CTORS[ctor](trust_coefficient=value)


@pytest.mark.parametrize("ctor", list(CTORS))
def test_bound_schedules_checked_at_init(ctor):
  opt = CTORS[ctor](lower=lambda c: 2.0, upper=1.0)
  with raises_naming(ValueError, "lower", "upper"):
    opt.init(PARAMS)
  opt = CTORS[ctor](lower=0.1, upper=lambda c: 0.0 * c)
  with raises_naming(ValueError, "upper"):
    opt.init(PARAMS)


@pytest.mark.parametrize("ctor", list(CTORS))
def test_weight_decay_schedule_checked_at_init(ctor):
  opt = CTORS[ctor](weight_decay=lambda c: -1e-4 + 0.0 * c)
  with raises_naming(ValueError, "weight_decay"):
    opt.init(PARAMS)


@pytest.mark.parametrize("ctor", ["lars", "lamb", "bounded_lars"])
def test_learning_rate_schedule_checked_at_init(ctor):
  make = {"lars": date_optax.lars, "lamb": date_optax.lamb,
          "bounded_lars": date_optax.bounded_lars}[ctor]
  opt = make(lambda c: -0.1 + 0.0 * c)
  with raises_naming(ValueError, "learning_rate"):
    opt.init(PARAMS)


def test_good_schedules_pass_and_init_under_jit_is_not_checked():
  opt = date_optax.lars(lambda c: 0.1 * jnp.ones([]), lower=lambda c: 0.0, upper=10.0,
                        weight_decay=lambda c: 1e-4)
  state = jax.jit(opt.init)(PARAMS)
  updates, _ = opt.update(GRADS, state, PARAMS)
  assert np.isfinite(np.asarray(updates["w"])).all()
