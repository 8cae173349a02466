"""The device check: a learner's call run as if on a GPU, on a CPU-only grader (the worker's side).

A check that asks whether the learner's code keeps its tensors on the inputs' device (no
``torch.zeros(n)`` beside a CUDA input) cannot count on a GPU being there; it sends meta
tensors instead, and the worker runs the call under `device_check_mode`, which makes every
operation that mixes a meta tensor with a CPU tensor fail as CUDA would.

This file runs inside the sandbox, beside worker.py (see `autograder.isolation.worker_files`): it depends
on the standard library and PyTorch only, and imports PyTorch when the mode is made, not
before.
"""

from __future__ import annotations


def device_check_mode():
    """A dispatch mode that stands in for a GPU on a CPU-only grader, through the meta device.

    Every operation that mixes a meta tensor with a CPU tensor of one or more dimensions
    fails, as CUDA does with CPU tensors (0-dim CPU tensors mix, as on CUDA; device copies and
    index tensors are allowed): the meta device's own kernels miss some of these (a matmul, a
    gather), so the mode checks every operation itself.

    The operations themselves do not run on the meta device's kernels: many of those are
    written in Python and their first call imports PyTorch's compiler (about 0.7 s, more than
    most checks take). Views (in place too), device copies and detaches run on the meta tensors;
    every other operation on meta tensors runs on CPU stand-ins of the same shape, strides and
    dtype (ones for floating point, zeros otherwise), and its results come back as meta
    tensors, or as the caller's own tensors where the operation writes in place. What depends
    on the values (.item(), `if mask.any():`, a boolean mask's selection) raises
    NotImplementedError, as the meta device cannot run it either: such code gets no verdict."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves, tree_map

    aten = torch.ops.aten
    allowed = {aten._to_copy, aten.copy_, aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_,
               aten.lift_fresh, aten.lift_fresh_copy, aten.detach, aten.alias}
    direct = {aten._to_copy, aten.copy_, aten.detach, aten.alias, aten.lift_fresh, aten.lift_fresh_copy,
              aten.resize_}  # metadata and device copies: the meta device's own kernels are C++
    data_dependent = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten.equal, aten.is_nonzero,
                      aten._unique, aten._unique2, aten.unique_dim, aten.unique_consecutive, aten.bincount,
                      aten.argwhere, aten.nonzero_numpy}
    by_mask = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}

    def on_meta(a) -> bool:
        return isinstance(a, torch.Tensor) and a.device.type == "meta"

    def stand_in(a):
        if isinstance(a, torch.device) and a.type == "meta":
            return torch.device("cpu")
        if not on_meta(a):
            return a
        size, stride, offset = a.size(), a.stride(), a.storage_offset()
        n = 0 if 0 in size else 1 + sum((s - 1) * st for s, st in zip(size, stride))
        fill = 1 if (a.is_floating_point() or a.is_complex()) else 0
        return torch.full((offset + n,), fill, dtype=a.dtype).as_strided(size, stride, offset)

    def as_meta(o):
        if isinstance(o, torch.Tensor):
            return torch.empty_strided(o.size(), o.stride(), dtype=o.dtype, device="meta")
        return o

    def written(func, args, kwargs, i):
        """The caller's argument that return `i` of `func` writes in place (x.add_(y), out=), or None."""
        schema = func._schema
        ret = schema.returns[i].alias_info if i < len(schema.returns) else None
        if ret is None or not ret.is_write:
            return None
        given = dict(zip([a.name for a in schema.arguments], args))
        given.update(kwargs)
        for a in schema.arguments:
            if a.alias_info is not None and a.alias_info.is_write and set(a.alias_info.before_set) & set(
                    ret.before_set):
                return given.get(a.name)
        return None

    class DeviceCheck(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            # PyTorch wraps a mode's __torch_dispatch__ so that its compiler skips it, which
            # imports the compiler on the first call; nothing here is ever compiled
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            packet = func.overloadpacket
            tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
            meta = any(t.device.type == "meta" for t in tensors)
            if meta and packet not in allowed and any(t.device.type == "cpu" and t.dim() > 0 for t in tensors):
                raise RuntimeError("Expected all tensors to be on the same device, but found at least two "
                                   f"devices, meta and cpu! (in {packet.__name__})")
            to_meta = meta or any(isinstance(v, torch.device) and v.type == "meta" for v in kwargs.values())
            if not to_meta or packet in direct or func.is_view or torch.Tag.inplace_view in func.tags:
                return func(*args, **kwargs)
            if packet in data_dependent or (packet in by_mask and any(
                    on_meta(i) and i.dtype in (torch.bool, torch.uint8) for i in tree_leaves(args[1:2]))) or (
                    packet is aten.repeat_interleave and any(on_meta(a) for a in args[1:2])):
                raise NotImplementedError(f"{packet.__name__} depends on the values of a tensor on the meta "
                                          "device, which has none")
            out = func(*tree_map(stand_in, args), **tree_map(stand_in, kwargs))
            outs = out if isinstance(out, tuple) else (out,)
            back = []
            for i, o in enumerate(outs):
                mine = written(func, args, kwargs, i)
                back.append(mine if mine is not None else tree_map(as_meta, o))
            return tuple(back) if isinstance(out, tuple) else back[0]

    return DeviceCheck


def plain_checks_without_symbolic_shapes() -> None:
    """Decide PyTorch's internal checks on plain Python booleans without importing its symbolic-shape module.

    `torch._check_with` (behind `torch._check` and the checks of `nn.MultiheadAttention` on a key
    padding mask, which every Transformer layer given a padding mask runs) imports
    `torch.fx.experimental.symbolic_shapes`, and with it SymPy, on its first call, even for a condition
    that is a plain `bool`: about 0.35 CPU s, a tenth of a check of exercise 08. For a true `bool` this
    returns at once, as `_check_with` does after that import; anything else (a false condition, which
    raises, or a symbolic one) goes to PyTorch's own function. Run in the worker (`worker.preload`)
    and on the grader's side (`autograder.grading.grader`); tests/isolation/test_device_check.py holds it to PyTorch's."""
    import torch

    original = torch._check_with
    if getattr(original, "_plain_first", False):
        return

    def _check_with(error_type, cond, message):
        if type(cond) is bool and cond:
            return None
        return original(error_type, cond, message)

    _check_with._plain_first = True
    _check_with.__wrapped__ = original
    torch._check_with = _check_with
