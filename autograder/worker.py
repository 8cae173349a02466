"""The grading worker: runs a learner's code in a process of its own.

The trusted grader starts this file as a script (``python -I worker.py REQ_FD REPLY_FD``)
and sends one JSON request per line; the worker answers each with one JSON line. Only
data crosses, in both directions: JSON, with arrays and tensors as raw bytes plus dtype
and shape (never pickle), so nothing that comes back can run code when it is read.

This file depends on the standard library, NumPy and (lazily) PyTorch only, so that it
can run where the rest of the grader (and the hidden tests) is not visible. Its codec is
shared with the trusted side, which imports it as ``autograder.worker``.
"""

from __future__ import annotations

import base64
import json
import math
import os
import sys
import traceback

import numpy as np

# Dtypes that may cross the boundary. Anything else (object arrays above all) is refused.
DTYPES = (
    "bool", "uint8", "int8", "int16", "int32", "int64",
    "float16", "float32", "float64", "complex64", "complex128",
)
MAX_MESSAGE = 64 * 1024 * 1024  # bytes in one JSON line, either direction
MAX_DEPTH = 32


class CodecError(ValueError):
    """A value that cannot cross the boundary, or a message that breaks the format."""


def _torch():
    import torch

    return torch


def _is_tensor(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _array_payload(arr: np.ndarray) -> dict:
    arr = np.ascontiguousarray(arr)
    if arr.dtype.name not in DTYPES:
        raise CodecError(f"arrays of dtype {arr.dtype} cannot be returned")
    return {
        "dtype": arr.dtype.name,
        "shape": [int(n) for n in arr.shape],
        "data": base64.b64encode(arr.tobytes()).decode("ascii"),
    }


def array_from_payload(p) -> np.ndarray:
    """Rebuild an array from its payload, checking every field: no code, no surprises."""
    if not isinstance(p, dict) or set(p) != {"dtype", "shape", "data"}:
        raise CodecError("malformed array payload")
    dtype, shape, data = p["dtype"], p["shape"], p["data"]
    if dtype not in DTYPES:
        raise CodecError(f"dtype {dtype!r} is not allowed")
    if not isinstance(shape, list) or len(shape) > 16 or not all(
        isinstance(n, int) and not isinstance(n, bool) and 0 <= n for n in shape
    ):
        raise CodecError("malformed shape")
    if not isinstance(data, str):
        raise CodecError("malformed array data")
    raw = base64.b64decode(data.encode("ascii"), validate=True)
    dt = np.dtype(dtype)
    if math.prod(shape) * dt.itemsize != len(raw):
        raise CodecError("array data does not match its shape")
    return np.frombuffer(raw, dtype=dt).reshape(shape).copy()


def tensor_to_payload(t) -> dict:
    torch = _torch()
    # Plain-tensor views of the data: a subclass's overrides cannot change what is sent.
    t = torch.Tensor.detach(t)
    device = str(t.device)
    dtype = str(t.dtype).replace("torch.", "")
    if t.dtype == torch.bfloat16:
        t = t.float()
    p = _array_payload(t.cpu().resolve_conj().resolve_neg().numpy())
    p = {"array": p, "dtype": dtype, "device": device}
    return p


def encode(obj, to_handle=None, depth: int = 0):
    """Python value -> JSON-able structure. Non-data objects become handles via to_handle."""
    if depth > MAX_DEPTH:
        raise CodecError("value nested too deeply")
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int) and type(obj) in (int,):
        return obj
    if type(obj) is float:
        if math.isfinite(obj):
            return obj
        return {"__float__": repr(obj)}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": _array_payload(obj)}
    if isinstance(obj, np.generic) and obj.dtype.name in DTYPES:
        return {"__npscalar__": _array_payload(np.asarray(obj))}
    if _is_tensor(obj):
        return {"__tensor__": tensor_to_payload(obj)}
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(obj, torch.dtype):
            return {"__dtype__": str(obj).replace("torch.", "")}
        if isinstance(obj, torch.device):
            return {"__device__": str(obj)}
    if type(obj) is tuple:
        return {"__tuple__": [encode(x, to_handle, depth + 1) for x in obj]}
    if type(obj) is list:
        return [encode(x, to_handle, depth + 1) for x in obj]
    if type(obj) is dict or type(obj).__name__ == "OrderedDict" and isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise CodecError("only str and int dict keys can cross")
            items.append([k, encode(v, to_handle, depth + 1)])
        return {"__dict__": items}
    if to_handle is not None:
        return to_handle(obj)
    raise CodecError(f"a value of type {type(obj).__name__} cannot cross")


def decode(obj, from_handle=None, make_tensor=None, depth: int = 0):
    """JSON-able structure -> Python value; the inverse of encode."""
    if depth > MAX_DEPTH:
        raise CodecError("value nested too deeply")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [decode(x, from_handle, make_tensor, depth + 1) for x in obj]
    if not isinstance(obj, dict) or len(obj) != 1:
        raise CodecError("malformed value")
    (tag, val), = obj.items()
    if tag == "__float__":
        if val not in ("nan", "inf", "-inf"):
            raise CodecError("malformed float")
        return float(val)
    if tag == "__ndarray__":
        return array_from_payload(val)
    if tag == "__npscalar__":
        return array_from_payload(val)[()]
    if tag == "__tensor__":
        if not isinstance(val, dict) or set(val) != {"array", "dtype", "device"}:
            raise CodecError("malformed tensor payload")
        return (make_tensor or default_make_tensor)(array_from_payload(val["array"]), val["dtype"], val["device"])
    if tag == "__dtype__":
        torch = _torch()
        dt = getattr(torch, str(val), None)
        if not isinstance(dt, torch.dtype):
            raise CodecError("unknown dtype")
        return dt
    if tag == "__device__":
        return _torch().device(str(val))
    if tag == "__tuple__" and isinstance(val, list):
        return tuple(decode(x, from_handle, make_tensor, depth + 1) for x in val)
    if tag == "__dict__" and isinstance(val, list):
        out = {}
        for item in val:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], (str, int))):
                raise CodecError("malformed dict")
            out[item[0]] = decode(item[1], from_handle, make_tensor, depth + 1)
        return out
    if tag == "__handle__" and from_handle is not None:
        return from_handle(val)
    raise CodecError(f"unknown tag {tag!r}")


def default_make_tensor(arr: np.ndarray, dtype: str, device: str):
    torch = _torch()
    t = torch.from_numpy(arr)
    want = getattr(torch, dtype, None)
    if not isinstance(want, torch.dtype):
        raise CodecError("unknown tensor dtype")
    if t.dtype != want:
        t = t.to(want)
    if device != "cpu":
        t = t.to(device)
    return t


# ---------------------------------------------------------------------------------------
# The worker process
# ---------------------------------------------------------------------------------------

class _Reply(Exception):
    def __init__(self, kind: str, etype: str, message: str):
        self.kind, self.etype, self.message = kind, etype, message


def _learner_error(exc: BaseException, kind: str = "learner") -> _Reply:
    if isinstance(exc, NotImplementedError):
        kind = "notimplemented"
    message = ""
    try:
        message = str(exc)[:500]
    except BaseException:  # a hostile __str__
        message = "(message unavailable)"
    where = ""
    try:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<cell")]
        if frames:
            where = f"{frames[-1].filename[1:-1]}, line {frames[-1].lineno}"
    except BaseException:
        pass
    return _Reply(kind, type(exc).__name__, (message + (f" ({where})" if where else "")).strip())


class Worker:
    def __init__(self):
        self.ns: dict = {"__name__": "__learner__", "__builtins__": __builtins__}
        self.handles: dict[int, object] = {}
        self.next_handle = 1

    # handles ---------------------------------------------------------------------------
    def to_handle(self, obj):
        hid = self.next_handle
        self.next_handle += 1
        self.handles[hid] = obj
        try:
            tname = type(obj).__name__
        except BaseException:
            tname = "object"
        return {"__handle__": {"id": hid, "type": str(tname)[:100], "callable": bool(callable(obj))}}

    def from_handle(self, val):
        hid = val.get("id") if isinstance(val, dict) else None
        if hid not in self.handles:
            raise CodecError("unknown handle")
        return self.handles[hid]

    def enc(self, value):
        return encode(value, self.to_handle)

    def dec(self, value):
        return decode(value, self.from_handle)

    def target(self, req):
        t = req.get("target")
        if isinstance(t, dict) and "name" in t:
            name = t["name"]
            if name not in self.ns:
                raise _Reply("missing", "NameError", f"{name} is not defined")
            return self.ns[name]
        if isinstance(t, dict) and "handle" in t:
            return self.from_handle({"id": t["handle"]})
        raise CodecError("malformed target")

    # operations ------------------------------------------------------------------------
    def op_load(self, req):
        errors = []
        for st in req["statements"]:
            code_text = "\n" * (st["line"] - 1) + st["source"]
            try:
                code = compile(code_text, f"<{st['cell']}>", "exec")
                exec(code, self.ns)
            except BaseException as exc:  # the learner's error, reported as data
                if isinstance(exc, (KeyboardInterrupt,)):
                    raise
                e = _learner_error(exc)
                errors.append({"cell": st["cell"], "line": st["line"], "error": f"{e.etype}: {e.message}"[:600]})
        names = sorted(k for k in self.ns if not k.startswith("_"))
        return {"errors": errors, "names": names[:1000]}

    def op_has(self, req):
        return req["name"] in self.ns

    def op_call(self, req):
        fn = self.target(req)
        args = self.dec({"__tuple__": req["args"]})
        kwargs = self.dec({"__dict__": req["kwargs"]})
        try:
            result = fn(*args, **kwargs)
        except _Reply:
            raise
        except BaseException as exc:
            raise _learner_error(exc)
        return self.enc(result)

    def op_getattr(self, req):
        obj = self.target(req)
        try:
            value = getattr(obj, req["attr"])
        except BaseException as exc:
            raise _learner_error(exc)
        return self.enc(value)

    def op_with_grad(self, req):
        torch = _torch()
        fn = self.target(req)
        args = list(self.dec({"__tuple__": req["args"]}))
        kwargs = self.dec({"__dict__": req["kwargs"]})
        cotangents = self.dec({"__tuple__": req["cotangents"]})
        leaves = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                args[i] = a.detach().requires_grad_(True)
                leaves.append(i)
        module = fn if isinstance(fn, torch.nn.Module) else getattr(fn, "__self__", None)
        module = module if isinstance(module, torch.nn.Module) else None
        try:
            if module is not None:
                module.zero_grad(set_to_none=True)
            out = fn(*args, **kwargs)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            pairs = [(o, g) for o, g in zip(outs, cotangents) if g is not None]
            if not pairs or not all(isinstance(o, torch.Tensor) and o.requires_grad for o, _ in pairs):
                raise _Reply("learner", "RuntimeError", "the output does not depend differentiably on the inputs")
            torch.autograd.backward([o for o, _ in pairs], [g.to(o.device, o.dtype) for o, g in pairs])
        except _Reply:
            raise
        except BaseException as exc:
            raise _learner_error(exc)
        arg_grads = [args[i].grad if i in leaves else None for i in range(len(args))]
        param_grads = {}
        if req.get("params") and module is not None:
            param_grads = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
        return {
            "output": self.enc(out),
            "arg_grads": self.enc(arg_grads),
            "param_grads": self.enc(param_grads),
        }

    def handle(self, req):
        op = req.get("op")
        fn = getattr(self, f"op_{op}", None)
        if fn is None:
            raise CodecError(f"unknown op {op!r}")
        return fn(req)


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def main(argv: list[str]) -> int:
    req_fd, reply_fd = int(argv[1]), int(argv[2])
    # Learner code sees /dev/null as stdin; requests and replies use private descriptors.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    requests = os.fdopen(req_fd, "rb", buffering=0)
    os.set_inheritable(reply_fd, False)
    w = Worker()
    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = requests.read(1 << 20)
            if not chunk:
                return 0
            buf += chunk
            if len(buf) > MAX_MESSAGE:
                return 3
        line, buf = buf.split(b"\n", 1)
        req_id = None
        try:
            req = json.loads(line)
            req_id = req.get("id")
            reply = {"id": req_id, "ok": True, "value": w.handle(req)}
        except _Reply as r:
            reply = {"id": req_id, "ok": False, "kind": r.kind, "type": r.etype, "message": r.message}
        except CodecError as exc:
            reply = {"id": req_id, "ok": False, "kind": "codec", "type": "CodecError", "message": str(exc)}
        except BaseException as exc:  # anything else is the learner's doing
            r = _learner_error(exc)
            reply = {"id": req_id, "ok": False, "kind": r.kind, "type": r.etype, "message": r.message}
        try:
            data = json.dumps(reply, allow_nan=False).encode() + b"\n"
        except BaseException as exc:
            data = json.dumps({"id": req_id, "ok": False, "kind": "codec", "type": "CodecError",
                               "message": f"result could not be encoded: {type(exc).__name__}"}).encode() + b"\n"
        if len(data) > MAX_MESSAGE:
            data = json.dumps({"id": req_id, "ok": False, "kind": "codec", "type": "CodecError",
                               "message": "result too large"}).encode() + b"\n"
        _write(reply_fd, data)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
