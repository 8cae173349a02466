"""The wire protocol between the trusted grader and the worker that runs learner code.

Both sides import this module: the trusted side as ``autograder.isolation.protocol``, the worker
(which sees only its own folder inside the sandbox) as ``protocol``. It depends on the
standard library and NumPy, and on PyTorch lazily.

Framing: one JSON document per line, each way. The trusted side sends a request
``{"id": N, "op": OP_..., ...}``; the worker answers ``{"id": N, "ok": true, "value": V}``
or ``{"id": N, "ok": false, "kind": KIND_..., "type": "...", "message": "..."}``.

Values: JSON scalars and lists as themselves; everything else as a one-key object whose
key is a tag (``TAG_TUPLE``...). A ``bytes`` value travels as base64 (strictly checked). Arrays
and tensors travel as raw bytes (base64) with an
allow-listed dtype and a shape, never pickle, so reading a reply cannot run code. Reading
is bounded: a reply's size, its number of containers, its nesting and each array's bytes
are checked against limits before anything is built, so the cost of decoding is linear
in the reply's size whatever the sender puts in it.
"""

from __future__ import annotations

import base64
import json
import math
import re
import sys

import numpy as np

# --- message kinds ----------------------------------------------------------------------
OP_LOAD = "load"            # {"cells": [{"label", "source"}], "seed"} -> {"errors": [...], "notes": [...], "more": N}
# (with "reply_bytes": N, the worker refuses to encode a value whose arrays, strings and items alone
# would make a reply larger than N bytes: see payload_bytes)
OP_SEED = "seed"            # {"seed"} -> None: seed the worker's random generators
OP_HAS = "has"              # {"name"} -> bool
OP_CALL = "call"            # {"target", "args", "kwargs", ["device_check"], ["repeat"], ["unchanged"]} -> value
# (with "repeat": N, 1 <= N <= MAX_REPEAT, the call is made N times in a row, its arguments decoded anew
# each time, and the reply is the list of the N values; the first call that raises ends it. With
# "unchanged": true, a call that changes its arguments in place is answered KIND_CHANGED, the
# argument's name as the message)
OP_GETATTR = "getattr"      # {"target", "attr"} -> value
# (a target is {"name": N}, a name of the learner's namespace, {"handle": ID}, an object returned earlier, or
# {"grader": M}, one of the grader's own modules copied beside the worker: see worker.GRADER_MODULES)
OP_WITH_GRAD = "with_grad"  # {"target", "args", "kwargs", "cotangents", "params"} -> {"output", "arg_grads", "param_grads"}
OPS = (OP_LOAD, OP_SEED, OP_HAS, OP_CALL, OP_GETATTR, OP_WITH_GRAD)
MAX_REPEAT = 10_000  # calls in one repeated call (a check that draws samples makes hundreds)

KIND_LEARNER = "learner"                # the learner's code raised
KIND_NOT_IMPLEMENTED = "notimplemented"  # ... NotImplementedError: still the stub
KIND_MISSING = "missing"                # the notebook does not define the name
KIND_CODEC = "codec"                    # a value could not cross the boundary
KIND_CHANGED = "changed"                # the call changed one of its arguments in place
KINDS = (KIND_LEARNER, KIND_NOT_IMPLEMENTED, KIND_MISSING, KIND_CODEC, KIND_CHANGED)

# --- value tags ---------------------------------------------------------------------------
TAG_FLOAT = "__float__"        # "nan", "inf", "-inf"
TAG_BYTES = "__bytes__"        # base64 of a bytes value (not bytearray, not a subclass)
TAG_NDARRAY = "__ndarray__"    # array payload
TAG_NPSCALAR = "__npscalar__"  # array payload of shape ()
TAG_TENSOR = "__tensor__"      # {"dtype", "device", "array"}
TAG_META = "__meta__"          # {"dtype", "shape"}: a tensor on the meta device (no data)
TAG_DTYPE = "__dtype__"        # "float32"
TAG_DEVICE = "__device__"      # "cuda:0"
TAG_TUPLE = "__tuple__"        # [values]
TAG_DICT = "__dict__"          # [[key, value], ...], keys str (or int, towards the worker only)
TAG_HANDLE = "__handle__"      # {"id", "type"}: an object that stays in the worker

# Dtypes that may cross. Anything else (object arrays above all) is refused.
DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64",
          "float16", "float32", "float64", "complex64", "complex128")
TENSOR_DTYPES = DTYPES + ("bfloat16",)  # bfloat16 travels as float32 bytes
_DTYPE_NAMES = {np.dtype(n): n for n in DTYPES}  # native byte order only; NumPy's dtype.name is slow
DEVICE_RE = re.compile(r"^(cpu|meta|cuda(:\d{1,2})?|mps(:0)?)$")


class CodecError(ValueError):
    """A value that cannot cross the boundary, or a message that breaks the format."""


# --- framing ------------------------------------------------------------------------------

def frame(message: dict) -> bytes:
    """One message as one line of JSON."""
    return json.dumps(message, allow_nan=False, separators=(",", ":")).encode() + b"\n"


def parse_frame(line: bytes, *, max_containers: int):
    """Parse one line, refusing before parsing what would cost more than its size."""
    if line.count(b"[") + line.count(b"{") > max_containers:
        raise CodecError(f"the message holds more than {max_containers} lists or objects")
    try:
        return json.loads(line)
    except (ValueError, RecursionError, MemoryError):
        raise CodecError("the message is not valid JSON") from None


# --- arrays -------------------------------------------------------------------------------

def _torch():
    import torch

    return torch


def _is_tensor(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def array_payload(arr: np.ndarray) -> dict:
    # (np.ascontiguousarray alone returns at least one dimension: a 0-d value keeps its shape ())
    arr = np.ascontiguousarray(arr).reshape(np.shape(arr))
    name = _DTYPE_NAMES.get(arr.dtype)
    if name is None:
        raise CodecError(f"arrays of dtype {arr.dtype} cannot cross")
    return {"dtype": name, "shape": [int(n) for n in arr.shape],
            "data": base64.b64encode(arr.tobytes()).decode("ascii")}


def bytes_from_payload(data) -> bytes:
    """A bytes value from its base64 text: only canonical base64 (the encoder's own output), so one
    value has one spelling. Its size is bounded by the frame's."""
    if not isinstance(data, str) or len(data) % 4 or not data.isascii():
        raise CodecError("malformed bytes")
    try:
        raw = base64.b64decode(data, validate=True)
    except ValueError:
        raise CodecError("malformed bytes") from None
    if base64.b64encode(raw).decode("ascii") != data:
        raise CodecError("malformed bytes")
    return raw


def _shape(shape, max_dims: int) -> list[int]:
    if not isinstance(shape, list) or len(shape) > max_dims or not all(
            type(n) is int and 0 <= n < 2**40 for n in shape):
        raise CodecError("malformed shape")
    return shape


def base64_length(n: int) -> int:
    """The length of the base64 text of n bytes."""
    return 4 * ((n + 2) // 3)


def array_from_payload(p, *, max_dims: int = 16) -> np.ndarray:
    """Rebuild an array, checking every field and the size before decoding any byte."""
    if not isinstance(p, dict) or set(p) != {"dtype", "shape", "data"}:
        raise CodecError("malformed array payload")
    dtype, data = p["dtype"], p["data"]
    shape = _shape(p["shape"], max_dims)
    if dtype not in DTYPES:
        raise CodecError(f"dtype {dtype!r} is not allowed")
    if not isinstance(data, str):
        raise CodecError("malformed array data")
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    if len(data) != base64_length(nbytes):
        raise CodecError("array data does not match its dtype and shape")
    try:
        raw = base64.b64decode(data.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise CodecError("malformed array data") from None
    if len(raw) != nbytes:
        raise CodecError("array data does not match its dtype and shape")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def payload_bytes(obj, cap: int, max_depth: int = 32) -> int:
    """A lower bound on the bytes `encode(obj)` takes in a frame, counted without encoding anything,
    and given up once over `cap`: an array or a tensor as its base64 (4 bytes for 3, a bfloat16 as the
    float32 it travels as), a string or bytes value as its length, any other item as 2 bytes. The
    worker refuses a value over its reply limit before it copies, encodes and frames it (a 512 MiB
    array took the whole of a call's time on a slow machine, only to be refused when read)."""
    total, todo, seen = 0, [(obj, 0)], 0
    torch = sys.modules.get("torch")
    while todo and total <= cap:
        x, depth = todo.pop()
        seen += 1
        if depth > max_depth or seen > cap:  # encode refuses the depth; the frame's length bounds the rest
            break
        t = type(x)
        if t is str or t is bytes:
            n = len(x) if t is str else base64_length(len(x))
        elif isinstance(x, np.ndarray):
            n = base64_length(x.nbytes)
        elif torch is not None and isinstance(x, torch.Tensor):
            try:
                size = 4 if x.dtype == torch.bfloat16 else torch.Tensor.element_size(x)
                n = 0 if x.device.type == "meta" else base64_length(torch.Tensor.numel(x) * size)
            except Exception:  # noqa: BLE001 - a tensor without a size to read: encode decides
                n = 0
        elif t in (list, tuple):
            todo.extend((v, depth + 1) for v in x)
            n = 2
        elif t is dict or (isinstance(x, dict) and t.__name__ == "OrderedDict"):
            for k, v in x.items():
                todo.append((k, depth + 1))
                todo.append((v, depth + 1))
            n = 2
        else:
            n = 2
        total += int(n)
    return total


def tensor_payload(t) -> dict:
    torch = _torch()
    # Plain-tensor views of the data: a subclass's overrides cannot change what is sent.
    t = torch.Tensor.detach(t)
    dtype = str(t.dtype).replace("torch.", "")
    if t.dtype == torch.bfloat16:
        t = t.float()
    return {"dtype": dtype, "device": str(t.device),
            "array": array_payload(t.cpu().resolve_conj().resolve_neg().numpy())}


def device_key(device) -> str:
    """A device's name with its index ("cuda" is "cuda:0", "mps" is "mps:0"), to compare devices by."""
    s = str(device)
    return s + ":0" if s in ("cuda", "mps") else s


def make_tensor(arr: np.ndarray, dtype: str, device: str):
    torch = _torch()
    want = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    if dtype not in TENSOR_DTYPES or not isinstance(want, torch.dtype):
        raise CodecError("unknown tensor dtype")
    if not isinstance(device, str) or not DEVICE_RE.match(device):
        raise CodecError("unknown device")
    if device == "meta":
        raise CodecError("a tensor on the meta device cannot carry data")
    # the bytes must be of the tensor's own dtype (bfloat16 travels as float32)
    if arr.dtype != np.dtype("float32" if dtype == "bfloat16" else dtype):
        raise CodecError(f"a {dtype} tensor whose data is {arr.dtype}")
    t = torch.from_numpy(arr)
    if t.dtype != want:
        t = t.to(want)
    if device != "cpu":
        try:
            t = t.to(device)
        except Exception as exc:  # noqa: BLE001 - whatever the device layer raises, the device is not here
            raise CodecError(f"device {device} is not available here ({type(exc).__name__})") from None
    return t


# --- values -------------------------------------------------------------------------------

INT_BITS = 63  # a Python int that crosses fits in an int64 (what a tensor or NumPy holds)


def _odd_tensor(t) -> str:
    """What makes `t` a tensor whose data cannot be sent as one array, or ""."""
    torch = _torch()
    if t.is_nested:
        return "a nested tensor"
    if t.is_quantized:
        return "a quantised tensor"
    if t.layout != torch.strided:
        return f"a tensor of layout {str(t.layout).replace('torch.', '')} (sparse)"
    if t.device.type != "meta" and t.numel() > 0:
        try:
            have = t.untyped_storage().nbytes()
        except Exception:  # noqa: BLE001 - a tensor that has none
            return "a tensor without storage"
        need = (t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * t.element_size()
        if have < need:
            return "a tensor whose storage is smaller than its shape (it holds no data)"
    return ""


def encode(obj, to_handle=None, depth: int = 0, max_depth: int = 32):
    """Python value -> JSON-able structure. Other objects become handles via to_handle."""
    if depth > max_depth:
        raise CodecError("value nested too deeply")
    if obj is None or type(obj) in (bool, str, int):
        return obj
    if type(obj) is float:
        return obj if math.isfinite(obj) else {TAG_FLOAT: repr(obj)}
    if type(obj) is bytes:
        return {TAG_BYTES: base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, np.ndarray):
        return {TAG_NDARRAY: array_payload(obj)}
    if isinstance(obj, np.generic) and obj.dtype.name in DTYPES:
        return {TAG_NPSCALAR: array_payload(np.asarray(obj))}
    if _is_tensor(obj):
        torch = _torch()
        odd = _odd_tensor(obj)
        if odd:
            raise CodecError(f"{odd} cannot cross: return a plain dense tensor")
        if torch.Tensor.detach(obj).device.type == "meta":
            return {TAG_META: {"dtype": str(obj.dtype).replace("torch.", ""), "shape": [int(n) for n in obj.shape]}}
        try:
            return {TAG_TENSOR: tensor_payload(obj)}
        except CodecError:
            raise
        except Exception as exc:  # noqa: BLE001 - a subclass without data (a fake tensor...), a device torch cannot read
            raise CodecError(f"a tensor whose data cannot be read ({type(obj).__name__[:40]}: "
                             f"{type(exc).__name__})") from None
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(obj, torch.dtype):
            return {TAG_DTYPE: str(obj).replace("torch.", "")}
        if isinstance(obj, torch.device):
            return {TAG_DEVICE: str(obj)}
    if type(obj) is tuple:
        return {TAG_TUPLE: [encode(x, to_handle, depth + 1, max_depth) for x in obj]}
    if type(obj) is list:
        return [encode(x, to_handle, depth + 1, max_depth) for x in obj]
    if type(obj) is dict or (isinstance(obj, dict) and type(obj).__name__ == "OrderedDict"):
        items = []
        for k, v in obj.items():
            if type(k) not in (str, int):
                raise CodecError("only str and int dict keys can cross")
            items.append([k, encode(v, to_handle, depth + 1, max_depth)])
        return {TAG_DICT: items}
    if to_handle is not None:
        return to_handle(obj)
    raise CodecError(f"a value of type {type(obj).__name__} cannot cross")


class Decoder:
    """JSON-able structure -> Python value; the inverse of `encode`, with bounds.

    `int_keys` allows int dict keys: only towards the worker. The trusted side refuses
    them (a sender who picks ints with colliding hashes makes building a dict quadratic).

    `devices`: the devices (`device_key` names) a tensor in the value may be on, or None for any.
    The trusted side passes what the request can legitimately get back: the CPU and the devices
    its own arguments were on, "meta" only where it asked for it (a device check). A tensor on
    another device, or a meta tensor elsewhere, is refused here, before any check sees it.
    """

    def __init__(self, from_handle=None, *, max_depth: int = 32, max_dims: int = 16, int_keys: bool = False,
                 devices=None):
        self.from_handle, self.max_depth, self.max_dims, self.int_keys = from_handle, max_depth, max_dims, int_keys
        self.devices = None if devices is None else frozenset(devices)
        # {id(payload): tensor} while one request's arguments are decoded again and again (a repeated call):
        # each decoding then gets a copy of the tensor decoded first, not the bytes decoded anew
        self.memo: dict | None = None

    def _device_allowed(self, device: str) -> None:
        if self.devices is not None and device_key(device) not in self.devices:
            where = ", ".join(sorted(d for d in self.devices if d != "meta")) or "cpu"
            raise CodecError(f"a tensor on the {device} device, where this check's inputs were on {where}"
                             + (" (the meta device holds no data)" if device == "meta" else ""))

    def __call__(self, obj, depth: int = 0):
        if depth > self.max_depth:
            raise CodecError("value nested too deeply")
        if type(obj) is int and obj.bit_length() > INT_BITS:
            raise CodecError(f"an integer of more than {INT_BITS} bits")
        if obj is None or type(obj) in (bool, int, float, str):
            return obj
        if type(obj) is list:
            return [self(x, depth + 1) for x in obj]
        if type(obj) is not dict or len(obj) != 1:
            raise CodecError("malformed value")
        (tag, val), = obj.items()
        if tag == TAG_FLOAT:
            if val not in ("nan", "inf", "-inf"):
                raise CodecError("malformed float")
            return float(val)
        if tag == TAG_BYTES:
            return bytes_from_payload(val)
        if tag == TAG_NDARRAY:
            return array_from_payload(val, max_dims=self.max_dims)
        if tag == TAG_NPSCALAR:
            arr = array_from_payload(val, max_dims=self.max_dims)
            if arr.shape != ():
                raise CodecError("malformed scalar")
            return arr[()]
        if tag == TAG_TENSOR:
            if type(val) is not dict or set(val) != {"array", "dtype", "device"}:
                raise CodecError("malformed tensor payload")
            if not isinstance(val["device"], str) or not DEVICE_RE.match(val["device"]):
                raise CodecError("unknown device")
            self._device_allowed(val["device"])
            if self.memo is not None and id(val) in self.memo:
                return self.memo[id(val)].clone()
            t = make_tensor(array_from_payload(val["array"], max_dims=self.max_dims), val["dtype"], val["device"])
            if self.memo is not None:
                self.memo[id(val)] = t
                return t.clone()
            return t
        if tag == TAG_META:
            if type(val) is not dict or set(val) != {"dtype", "shape"} or val["dtype"] not in TENSOR_DTYPES:
                raise CodecError("malformed meta tensor")
            self._device_allowed("meta")
            shape = _shape(val["shape"], self.max_dims)
            if math.prod(shape) >= 2**62:
                raise CodecError("a meta tensor of more elements than a tensor can have")
            torch = _torch()
            try:
                return torch.empty(shape, dtype=getattr(torch, val["dtype"]), device="meta")
            except Exception:  # noqa: BLE001 - a size torch refuses
                raise CodecError("a meta tensor of a size torch refuses") from None
        if tag == TAG_DTYPE:
            if val not in TENSOR_DTYPES:
                raise CodecError("unknown dtype")
            return getattr(_torch(), val)
        if tag == TAG_DEVICE:
            if not isinstance(val, str) or not DEVICE_RE.match(val):
                raise CodecError("unknown device")
            return _torch().device(val)
        if tag == TAG_TUPLE and type(val) is list:
            return tuple(self(x, depth + 1) for x in val)
        if tag == TAG_DICT and type(val) is list:
            out = {}
            key_types = (str, int) if self.int_keys else (str,)
            for item in val:
                if not (type(item) is list and len(item) == 2 and type(item[0]) in key_types):
                    raise CodecError("malformed dict")
                out[item[0]] = self(item[1], depth + 1)
            return out
        if tag == TAG_HANDLE and self.from_handle is not None:
            return self.from_handle(val)
        raise CodecError("unknown value tag")
