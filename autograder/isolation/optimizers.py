"""SGD and Adam as torch.optim has them, without the first use's import of PyTorch's compiler.

`torch.optim.Optimizer` imports `torch._dynamo` when it is built and at its first step: 1.3 s on
one core, and while it runs in a thread of its own it holds the interpreter so that the process's
other thread all but stops (a small-tensor loop ran at 1% of its speed). Exercise 08's checks give
the learner's `train_step` an optimizer of this module instead, built in the learner's process
(the worker reaches this file beside it, `Learner.grader_attribute`), and run the reference's
steps with the same classes here: one update rule on both sides.

Each is a `torch.optim.Optimizer` (isinstance holds) with its interface: `param_groups`, `state`,
`defaults`, `zero_grad(set_to_none=True)` and `step(closure=None)` (the base class's other
methods, such as `state_dict`, work too, and import the compiler as they do there). Only the base
class's constructor is skipped (it is what imports the compiler); `SGD` is torch's without momentum or
weight decay, `Adam` torch's single-tensor Adam with its default betas and eps, not amsgrad.

This file is copied beside the worker (`autograder.isolation.worker_files`) and depends on PyTorch alone.
"""

from __future__ import annotations

import collections
import math

import torch


class SGD(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3):
        # (torch.optim.Optimizer.__init__ is not called: see the module's docstring)
        params = list(params)
        if not params or not all(isinstance(p, torch.Tensor) for p in params):
            raise ValueError("the optimizer needs a non-empty list of tensors")
        self.defaults = {"lr": lr}
        self.param_groups = [{"params": params, **self.defaults}]
        self.state = collections.defaultdict(dict)
        # the base class's hooks, empty, so that its other methods (state_dict, the hook registrations) work
        for name in ("step_pre", "step_post", "state_dict_pre", "state_dict_post", "load_state_dict_pre",
                     "load_state_dict_post"):
            setattr(self, f"_optimizer_{name}_hooks", collections.OrderedDict())

    def _params(self):
        for group in self.param_groups:
            for p in group["params"]:
                yield group, p

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, p in self._params():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    def _closure(self, closure):
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    @torch.no_grad()
    def step(self, closure=None):
        loss = self._closure(closure)
        for group, p in self._params():
            if p.grad is not None:
                p.add_(p.grad, alpha=-group["lr"])
        return loss


class Adam(SGD):
    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        super().__init__(params, lr)
        self.defaults.update(betas=tuple(betas), eps=eps)
        self.param_groups[0].update(betas=tuple(betas), eps=eps)

    @torch.no_grad()
    def step(self, closure=None):
        loss = self._closure(closure)
        for group, p in self._params():
            if p.grad is None:
                continue
            (b1, b2), lr = group["betas"], group["lr"]
            st = self.state[p]
            if not st:
                st.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
            st["step"] += 1
            m, v, t = st["exp_avg"], st["exp_avg_sq"], st["step"]
            m.lerp_(p.grad, 1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            denom = (v.sqrt() / math.sqrt(1 - b2 ** t)).add_(group["eps"])
            p.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))
        return loss
