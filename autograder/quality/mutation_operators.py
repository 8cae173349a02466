"""The mutation operators of `autograder.quality.mutants`: each the mistake tensor code invites, as a function
``op_NAME(node, ctx)`` that yields the changed copies of one AST node (the axis of a reduction or a
softmax, a transpose dropped, the 1/sqrt(d) scale dropped or squared, a mask inverted, a fill value
of -inf turned into 0, off-by-one comparisons, indices and ranges, tril <-> triu, operands swapped,
a term dropped from a sum, ``+=`` turned into ``=``, constants perturbed, an intermediate returned,
max <-> min, exp dropped). `contexts` and `locals_at` give what the operators need to know of the
cell (which ints are indices, which floats fill values, the names in scope); `OPERATOR_FUNCS` maps
each name of `OPERATORS` to its function.
"""

from __future__ import annotations

import ast
import copy
import re

DIM_FUNCS = {"softmax", "log_softmax", "sum", "mean", "max", "min", "amax", "amin", "argmax", "argmin",
             "cumsum", "cumprod", "logsumexp", "var", "std", "norm", "size", "unsqueeze", "squeeze",
             "cat", "concatenate", "stack", "flip", "expand_dims", "flatten", "prod", "all", "any"}
DIM_KEYWORDS = {"dim", "axis"}
SWAP_DIMS = {-1: -2, -2: -1, 0: 1, 1: 0}
MAX_MIN = {"max": "min", "min": "max", "amax": "amin", "amin": "amax", "maximum": "minimum",
           "minimum": "maximum", "argmax": "argmin", "argmin": "argmax"}
TRI = {"tril": "triu", "triu": "tril"}
COMPARE_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
ARITH_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}
FILL_FUNCS = {"masked_fill", "masked_fill_", "where"}
# The tensor-specific operators first; the generic ones after.
OPERATORS = ("dim", "keepdim", "transpose", "scale", "mask", "fill", "compare", "off_by_one", "tri",
             "diagonal", "swap_args", "swap_name", "drop_kwarg", "drop_term", "arith", "aug_assign",
             "float_const", "return_intermediate", "max_min", "exp")


# --- the operators: each maps one AST node to the nodes that may replace it --------------------------

def _name(func: ast.expr) -> str:
    """The called name: `softmax` for torch.softmax, F.softmax and x.softmax."""
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _int(node: ast.expr) -> int | None:
    """The value of an int literal, negative ones included; None for anything else."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant)
            and type(node.operand.value) is int):
        return -node.operand.value
    return None


def _int_node(value: int) -> ast.expr:
    return ast.UnaryOp(ast.USub(), ast.Constant(-value)) if value < 0 else ast.Constant(value)


def _other_dim(value: int) -> int:
    return SWAP_DIMS.get(value, value - 1 if value > 0 else value + 1)


def _is_method(call: ast.Call) -> bool:
    """x.f(...) on a value, not mod.f(...) on a module such as torch, np, F or math."""
    f = call.func
    return isinstance(f, ast.Attribute) and not (isinstance(f.value, ast.Name)
                                                 and f.value.id in {"torch", "np", "numpy", "F", "math", "nn"})


def _dim_positions(call: ast.Call) -> list[int]:
    """Indices of the positional arguments of `call` that are axes."""
    name = _name(call.func)
    if name not in DIM_FUNCS:
        return []
    if name in {"size"}:
        return [0]
    index = 0 if _is_method(call) else 1
    return [index] if len(call.args) > index and _int(call.args[index]) is not None else []


def _neg_inf_like(node: ast.expr) -> bool:
    """-inf, float("-inf"), -np.inf, torch.finfo(...).min, -1e9 and the like: a "never attend" fill."""
    text = ast.unparse(node)
    if "inf" in text or re.search(r"finfo\(.*\)\.min$", text):
        return True
    value = node.operand.value if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant) else None
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(value, (int, float)) \
        and value >= 1e4


def _zero(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value == 0


def op_dim(node, ctx):
    if not isinstance(node, ast.Call):
        return
    for i, kw in enumerate(node.keywords):
        if kw.arg in DIM_KEYWORDS and _int(kw.value) is not None:
            new = copy.deepcopy(node)
            new.keywords[i].value = _int_node(_other_dim(_int(kw.value)))
            yield new
    for i in _dim_positions(node):
        new = copy.deepcopy(node)
        new.args[i] = _int_node(_other_dim(_int(node.args[i])))
        yield new
    if _name(node.func) == "transpose" or _name(node.func) == "swapaxes":
        # transpose(a, b) with a dim moved: (-2, -1) -> (-3, -1)
        first = 0 if _is_method(node) else 1
        if len(node.args) >= first + 2 and _int(node.args[first]) is not None:
            new = copy.deepcopy(node)
            a, b = _int(node.args[first]), _int(node.args[first + 1])
            step = -1 if a != 0 else 1
            moved = a + step if a + step != b else a + 2 * step
            new.args[first] = _int_node(moved)
            yield new


def op_keepdim(node, ctx):
    if isinstance(node, ast.Call):
        for i, kw in enumerate(node.keywords):
            if kw.arg in ("keepdim", "keepdims") and isinstance(kw.value, ast.Constant) and kw.value.value is True:
                new = copy.deepcopy(node)
                del new.keywords[i]
                yield new


def op_transpose(node, ctx):
    if isinstance(node, ast.Attribute) and node.attr in ("T", "mT") and isinstance(node.ctx, ast.Load):
        yield copy.deepcopy(node.value)
    if isinstance(node, ast.Call):
        name = _name(node.func)
        if name in ("transpose", "swapaxes", "t") and _is_method(node):
            yield copy.deepcopy(node.func.value)
        elif name in ("transpose", "swapaxes") and node.args:
            yield copy.deepcopy(node.args[0])
        elif name == "permute" and _is_method(node) and len(node.args) >= 2:
            new = copy.deepcopy(node)
            new.args[-1], new.args[-2] = new.args[-2], new.args[-1]
            yield new


def _sqrt_call(node) -> bool:
    return isinstance(node, ast.Call) and _name(node.func) in ("sqrt", "rsqrt") and len(node.args) == 1


def op_scale(node, ctx):
    if _sqrt_call(node) and _name(node.func) == "sqrt":
        yield copy.deepcopy(node.args[0])  # sqrt(d) -> d: the scale squared
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) \
            and isinstance(node.right, (ast.Constant, ast.UnaryOp)):
        text = ast.unparse(node.right)
        if text in ("0.5", "-0.5", "(-0.5)"):
            new = copy.deepcopy(node)
            new.right = ast.Constant(1.0) if text == "0.5" else _neg_float(1.0)
            yield new
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.Mult)):
        right = node.right
        if _sqrt_call(right) or (isinstance(right, ast.BinOp) and isinstance(right.op, ast.Pow)) \
                or (isinstance(right, ast.Name) and "scale" in right.id):
            yield copy.deepcopy(node.left)  # the scale removed


def _neg_float(value: float) -> ast.expr:
    return ast.UnaryOp(ast.USub(), ast.Constant(value))


def op_mask(node, ctx):
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Invert, ast.Not)):
        yield copy.deepcopy(node.operand)
    if isinstance(node, ast.Call) and _name(node.func) == "logical_not" and len(node.args) == 1:
        yield copy.deepcopy(node.args[0])
    if isinstance(node, ast.Call) and _name(node.func) in FILL_FUNCS:
        i = 0 if _is_method(node) and _name(node.func) != "where" else (0 if _name(node.func) == "where" else 1)
        if len(node.args) > i and not (isinstance(node.args[i], ast.UnaryOp)
                                       and isinstance(node.args[i].op, (ast.Invert, ast.Not))):
            new = copy.deepcopy(node)
            new.args[i] = ast.UnaryOp(ast.Invert(), new.args[i])
            yield new


def op_fill(node, ctx):
    if not (isinstance(node, ast.Call) and _name(node.func) in FILL_FUNCS):
        return
    for i, arg in enumerate(node.args):
        if i == 0 and _name(node.func) == "where":
            continue
        if _neg_inf_like(arg):
            new = copy.deepcopy(node)
            new.args[i] = ast.Constant(0.0)
            yield new
        elif _zero(arg):
            new = copy.deepcopy(node)
            new.args[i] = ast.Call(ast.Name("float", ast.Load()), [ast.Constant("-inf")], [])
            yield new


def op_compare(node, ctx):
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in COMPARE_SWAP:
                new = copy.deepcopy(node)
                new.ops[i] = COMPARE_SWAP[type(op)]()
                yield new


def op_off_by_one(node, ctx):
    """Integer constants +/-1 in indices, slices, range() and `i +/- n` (dims are op_dim's)."""
    if id(node) in ctx["index_ints"]:
        for delta in (1, -1):
            yield _int_node(_int(node) + delta)


def op_tri(node, ctx):
    if isinstance(node, ast.Attribute) and node.attr in TRI:
        new = copy.deepcopy(node)
        new.attr = TRI[node.attr]
        yield new


def op_diagonal(node, ctx):
    if isinstance(node, ast.Call) and _name(node.func) in TRI:
        for i, kw in enumerate(node.keywords):
            if kw.arg == "diagonal" and _int(kw.value) is not None:
                for delta in (1, -1):
                    new = copy.deepcopy(node)
                    new.keywords[i].value = _int_node(_int(kw.value) + delta)
                    yield new
        index = 0 if _is_method(node) else 1
        if len(node.args) > index and _int(node.args[index]) is not None:
            for delta in (1, -1):
                new = copy.deepcopy(node)
                new.args[index] = _int_node(_int(node.args[index]) + delta)
                yield new
        elif len(node.args) == index and not any(kw.arg == "diagonal" for kw in node.keywords):
            for delta in (1, -1):
                new = copy.deepcopy(node)
                new.keywords.append(ast.keyword("diagonal", _int_node(delta)))
                yield new


def op_swap_args(node, ctx):
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        yield ast.BinOp(copy.deepcopy(node.right), ast.MatMult(), copy.deepcopy(node.left))
    if not isinstance(node, ast.Call):
        return
    name = _name(node.func)
    if name in ("cat", "stack", "concatenate") and node.args and isinstance(node.args[0], (ast.List, ast.Tuple)) \
            and len(node.args[0].elts) >= 2:
        new = copy.deepcopy(node)
        new.args[0].elts[0], new.args[0].elts[1] = new.args[0].elts[1], new.args[0].elts[0]
        yield new
    plain = (ast.Name, ast.Attribute)
    if name not in ("cat", "stack", "concatenate", "matmul", "bmm", "mm", "einsum", "range") \
            and len(node.args) >= 2 and isinstance(node.args[0], plain) and isinstance(node.args[1], plain) \
            and ast.dump(node.args[0]) != ast.dump(node.args[1]):
        new = copy.deepcopy(node)
        new.args[0], new.args[1] = new.args[1], new.args[0]  # the first two arguments in the wrong order
        yield new
    if name in ("matmul", "bmm", "mm") and not _is_method(node) and len(node.args) == 2:
        new = copy.deepcopy(node)
        new.args.reverse()
        yield new
    if name == "einsum" and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        spec = node.args[0].value.replace(" ", "")
        if "->" in spec and len(node.args) == 3:
            ins, out = spec.split("->")
            a, b = ins.split(",")
            new = copy.deepcopy(node)
            new.args[1], new.args[2] = new.args[2], new.args[1]  # operands swapped, subscripts kept
            yield new
            if len(out) >= 2:
                new = copy.deepcopy(node)
                new.args[0] = ast.Constant(f"{ins}->{out[:-2]}{out[-1]}{out[-2]}")
                yield new


def op_drop_kwarg(node, ctx):
    """A keyword argument forgotten: mask=mask, dropout_p=p, device=x.device ... (dims are op_dim's)."""
    if isinstance(node, ast.Call):
        for i, kw in enumerate(node.keywords):
            if kw.arg and kw.arg not in DIM_KEYWORDS and kw.arg not in ("keepdim", "keepdims") \
                    and isinstance(kw.value, (ast.Name, ast.Attribute, ast.Call)):
                new = copy.deepcopy(node)
                del new.keywords[i]
                yield new


def _family(name: str) -> str | None:
    """Names that play parallel roles (q/k/v, query/key/value, W_q/W_k/W_v/W_o) share a family."""
    if name in ("q", "k", "v"):
        return "q,k,v"
    if name in ("query", "key", "value"):
        return "query,key,value"
    if len(name) >= 3 and name[-2] == "_" and name[-1] in "qkvo":
        return name[:-1]
    return None


def op_swap_name(node, ctx):
    """q used where k belongs, self.W_k where self.W_q belongs: the next name of the same family in the cell."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        name = node.id
    elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        name = node.attr
    else:
        return
    family = _family(name)
    if family is None:
        return
    members = sorted(n for n in ctx["names"] if _family(n) == family)
    if len(members) < 2:
        return
    other = members[(members.index(name) + 1) % len(members)]
    if isinstance(node, ast.Name):
        yield ast.Name(other, ast.Load())
    else:
        new = copy.deepcopy(node)
        new.attr = other
        yield new


def op_drop_term(node, ctx):
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        yield copy.deepcopy(node.left)
        if isinstance(node.op, ast.Add):
            yield copy.deepcopy(node.right)


def op_arith(node, ctx):
    if isinstance(node, ast.BinOp) and type(node.op) in ARITH_SWAP:
        new = copy.deepcopy(node)
        new.op = ARITH_SWAP[type(node.op)]()
        yield new


def op_aug_assign(node, ctx):
    if isinstance(node, ast.AugAssign):
        target = copy.deepcopy(node.target)
        yield ast.copy_location(ast.Assign([target], copy.deepcopy(node.value), lineno=node.lineno), node)


def op_float_const(node, ctx):
    if isinstance(node, ast.Constant) and type(node.value) is float and id(node) not in ctx["fill_args"]:
        value = node.value
        new_value = 1.0 if value == 0.0 else value * 1.5
        if new_value != value and repr(new_value) != "inf":
            yield ast.Constant(new_value)


def op_return_intermediate(node, ctx):
    if isinstance(node, ast.Return) and node.value is not None and not isinstance(node.value, ast.Name):
        if isinstance(node.value, ast.Tuple):
            return  # a tuple of results: one name instead is a different API, not a slip
        for name in _spine(node.value):
            if name in ctx["locals"]:
                yield ast.Return(ast.Name(name, ast.Load()))
                return


def _spine(node: ast.expr) -> list[str]:
    """Names the value is computed from directly: operands, receivers of method chains."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.BinOp):
        return _spine(node.left) + _spine(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return _spine(node.func.value)
    if isinstance(node, (ast.Attribute, ast.Subscript)):
        return _spine(node.value)
    return []


def op_max_min(node, ctx):
    if isinstance(node, ast.Attribute) and node.attr in MAX_MIN and isinstance(node.ctx, ast.Load):
        new = copy.deepcopy(node)
        new.attr = MAX_MIN[node.attr]
        yield new
    if isinstance(node, ast.Name) and node.id in ("max", "min") and isinstance(node.ctx, ast.Load):
        yield ast.Name(MAX_MIN[node.id], ast.Load())


def op_exp(node, ctx):
    if isinstance(node, ast.Call) and _name(node.func) == "exp":
        if _is_method(node) and not node.args:
            yield copy.deepcopy(node.func.value)
        elif len(node.args) == 1:
            yield copy.deepcopy(node.args[0])


OPERATOR_FUNCS = {name: globals()[f"op_{name}"] for name in OPERATORS}


def contexts(tree: ast.AST) -> dict:
    """Which int constants are indices/ranges/offsets, which floats are fill values."""
    index_ints, fill_args = set(), set()
    dim_args = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in DIM_KEYWORDS or kw.arg == "diagonal":
                    dim_args.update(id(n) for n in ast.walk(kw.value))
            for i in _dim_positions(node):
                dim_args.update(id(n) for n in ast.walk(node.args[i]))
            if _name(node.func) in FILL_FUNCS:
                for arg in node.args:
                    if _zero(arg) or _neg_inf_like(arg):
                        fill_args.update(id(n) for n in ast.walk(arg))
    def literal(sub):
        if _int(sub) is not None and not (isinstance(sub, ast.Constant) and id(sub) in negated):
            index_ints.add(id(sub))

    negated = {id(n.operand) for n in ast.walk(tree) if isinstance(n, ast.UnaryOp) and _int(n) is not None}
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            for sub in ast.walk(node.slice):
                literal(sub)
        elif isinstance(node, ast.Call) and _name(node.func) in ("range", "arange"):
            for arg in node.args:
                literal(arg)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            literal(node.left)
            literal(node.right)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
        {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    return {"index_ints": index_ints - dim_args, "fill_args": fill_args, "names": names}


def locals_at(tree: ast.AST, line: int) -> set[str]:
    """Names assigned (not parameters) in the function around `line`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.lineno <= line <= node.end_lineno \
                and not any(isinstance(s, ast.FunctionDef) and s.lineno <= line <= s.end_lineno for s in node.body):
            names = set()
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
            return names
    return set()


__all__ = ["OPERATORS", "OPERATOR_FUNCS", "contexts", "locals_at"]
