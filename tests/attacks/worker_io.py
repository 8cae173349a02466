"""Round two, classes 1-3: a worker that stalls its pipes, replies that cost more to decode
than their size suggests, and replies whose fields have the wrong shape.

Learner code runs in the worker process, so it owns the worker's end of both pipes and
its protocol module: it can stop the process between two requests, shrink the pipe's
buffer, and rewrite every reply (`sys.modules["protocol"].frame`). Each attack must cost
exactly the checks it touches, within the submission's own time limit, and never show
up as a grader error.
"""

from __future__ import annotations

from conftest import add_cell, reference_notebook

KEY = "03_qkv"

# The pipe's buffer shrunk to one page, then the whole worker stopped (SIGSTOP) right after
# its first reply from scaled_dot_product_attention: the trusted side's next request no
# longer fits in the pipe, and nothing reads it. A blocking write would wait forever.
STOP_AND_STALL = '''
import fcntl, os, signal, sys, threading
_ = fcntl.fcntl(int(sys.argv[1]), 1031, 4096)  # F_SETPIPE_SZ on the request pipe
_sdpa = scaled_dot_product_attention
def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0):
    threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGSTOP)).start()
    return _sdpa(q, k, v, mask, dropout_p)
'''

# Half a reply, then silence: the line never ends.
HALF_REPLY = '''
import os, sys, time
def softmax(x, axis=-1):
    os.write(int(sys.argv[2]), b'{"id": 1, "ok": tr')
    time.sleep(3600)
'''

# A reply that never ends: megabytes without a newline, until the grader's cap.
ENDLESS_REPLY = '''
import os, sys
def softmax(x, axis=-1):
    chunk = b"A" * (1 << 20)
    while True:
        os.write(int(sys.argv[2]), chunk)
'''

_FORGE = '''
import json, sys
_P = sys.modules["protocol"]
_frame = _P.frame
def _forged(msg):
    if not isinstance(msg, dict) or msg.get("id") == 1:
        return _frame(msg)  # the load reply stays honest: the attack is on the checks
    return {body}
_P.frame = _forged
'''


def _forge(body: str) -> str:
    return _FORGE.replace("{body}", body)


FORGED = {
    # Class 2: replies inside the size cap, built (cheaply, on the wire) to be costly to decode:
    # 90,000 int dict keys that all hash to 0, five million empty lists (15 MB of JSON, gigabytes
    # once built), deep nesting, a shape that claims terabytes, bad base64.
    "reply_int_key_collisions": ('b\'{"id":%d,"ok":true,"value":{"__dict__":[\' % msg["id"] + b",".join('
                                 'b"[%d,0]" % (i * (2**61 - 1)) for i in range(90_000)) + b"]}}\\n"'),
    "reply_empty_lists": 'b\'{"id":%d,"ok":true,"value":[\' % msg["id"] + b"[]," * 5_000_000 + b"[]]}\\n"',
    "reply_deep_nesting": 'b\'{"id":%d,"ok":true,"value":\' % msg["id"] + b"[" * 100_000 + b"]" * 100_000 + b"}\\n"',
    "reply_huge_declared_shape": ('_frame({"id": msg["id"], "ok": True, "value": {"__tensor__": {"dtype": "float64", '
                                  '"device": "cpu", "array": {"dtype": "float64", "shape": [10**12], "data": "AAAA"}}}})'),
    "reply_bad_base64": ('_frame({"id": msg["id"], "ok": True, "value": {"__ndarray__": {"dtype": "float64", '
                         '"shape": [3], "data": "!!!!" * 6}}})'),
    # Class 3: every field with the wrong type or value.
    "reply_error_fields_wrong_types": '_frame({"id": msg["id"], "ok": False, "kind": "learner", "type": 12345, "message": ["x"]})',
    "reply_unknown_kind": '_frame({"id": msg["id"], "ok": False, "kind": "grader_bug", "type": "E", "message": "m"})',
    "reply_ok_without_value": '_frame({"id": msg["id"], "ok": True})',
    "reply_ok_not_bool": '_frame({"id": msg["id"], "ok": "yes", "value": 1})',
    "reply_id_as_string": '_frame({"id": str(msg["id"]), "ok": True, "value": 1})',
    "reply_not_an_object": 'b"[1, 2, 3]\\n"',
    "reply_bad_handle": '_frame({"id": msg["id"], "ok": True, "value": {"__handle__": {"id": "x", "type": None}}})',
    "reply_bad_tensor_fields": ('_frame({"id": msg["id"], "ok": True, "value": {"__tensor__": {"dtype": 7, '
                                '"device": ["cpu"], "array": None}}})'),
}


def build(ctx) -> None:
    nbs = ctx.nbs
    nbs["io_stop_and_stall"] = add_cell(reference_notebook(KEY), STOP_AND_STALL)
    nbs["io_half_reply"] = add_cell(reference_notebook(KEY), HALF_REPLY)
    nbs["io_endless_reply"] = add_cell(reference_notebook(KEY), ENDLESS_REPLY)
    for name, body in FORGED.items():
        nbs[name] = add_cell(reference_notebook(KEY), _forge(body))
