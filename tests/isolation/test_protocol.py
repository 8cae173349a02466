"""The wire protocol between the trusted grader and the worker (autograder/isolation/protocol.py), bound by bound.

The worker is the learner's: whatever it sends, reading it must cost no more than its size and
build nothing but allow-listed data. Here, without a worker: framing (one JSON line each way,
refused before parsing when it holds too many containers, refused when it is not JSON), every
value type that may cross and its round trip, and every refusal of the encoder and the decoder
(nesting, integer width, dict keys, array payloads, dtypes, shapes and dimensions, devices, meta
tensors, unknown tags). Then the trusted side's use of it (`Submission`): the limits of
autograder/core/limits.py applied to a reply's value, and, with one unsandboxed worker, to a reply's
bytes and containers.
"""

from __future__ import annotations

import base64
import collections
import json

import numpy as np
import pytest
import torch

from autograder.core.limits import DEFAULT
from autograder.isolation import protocol as P
from autograder.isolation.errors import BoundaryError, LearnerError
from autograder.isolation.remote import Learner
from autograder.isolation.runner import Submission


def nested(depth: int, leaf=1, wrap=list):
    """`leaf` inside `depth` containers made by `wrap` (a list of a list of ... `leaf`)."""
    value = leaf
    for _ in range(depth):
        value = wrap([value])
    return value


def crossed(value, **decoder):
    """`value` after the whole trip: encoded, framed, parsed and decoded."""
    line = P.frame({"id": 1, "ok": True, "value": P.encode(value)})
    return P.Decoder(**decoder)(P.parse_frame(line[:-1], max_containers=DEFAULT.reply_containers)["value"])


def payload(dtype="float32", shape=(2,), data=None):
    """An array payload; its data the right number of zero bytes unless given."""
    if data is None:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        data = base64.b64encode(bytes(n)).decode("ascii")
    return {"dtype": dtype, "shape": list(shape), "data": data}


def refused(value, words, **decoder):
    """Decoding `value` (with these Decoder options) is a CodecError saying `words`."""
    with pytest.raises(P.CodecError, match=words):
        P.Decoder(**decoder)(value)


# --- framing ------------------------------------------------------------------------------------

def test_a_frame_is_one_compact_line_of_json():
    """A message is one line ending in a newline (a newline in a string stays escaped), and parses back."""
    message = {"id": 7, "op": P.OP_CALL, "text": "two\nlines", "args": [1, [2, {"a": None}]]}
    line = P.frame(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and b" " not in line
    assert P.parse_frame(line[:-1], max_containers=10) == message


@pytest.mark.parametrize("message, error", [
    ({"value": float("nan")}, ValueError),   # no NaN on the wire: the encoder tags it
    ({"value": float("inf")}, ValueError),
    ({"value": {1, 2}}, TypeError),          # only what the encoder produces can be framed
    ({"value": b"bytes"}, TypeError),
])
def test_a_frame_refuses_what_json_cannot_hold(message, error):
    with pytest.raises(error):
        P.frame(message)


def test_containers_are_counted_before_parsing():
    """At most `max_containers` lists and objects; one more is refused before json.loads runs (so a
    bracket inside a string counts too: the count is a cost bound, not a parse)."""
    line = json.dumps([[] for _ in range(9)]).encode()  # 10 containers
    assert P.parse_frame(line, max_containers=10) == [[]] * 9
    with pytest.raises(P.CodecError, match="more than 9 lists or objects"):
        P.parse_frame(line, max_containers=9)
    with pytest.raises(P.CodecError, match="more than 3 lists or objects"):
        P.parse_frame(json.dumps({"s": "[[{{"}).encode(), max_containers=3)


def test_the_trusted_side_counts_far_fewer_containers_than_the_worker():
    """A reply may hold 100000 containers (an honest one carries arrays as strings); a request, 10**7."""
    assert DEFAULT.reply_containers == 100_000
    line = b"[" + b",".join([b"[]"] * 100_000) + b"]"
    with pytest.raises(P.CodecError, match="more than 100000"):
        P.parse_frame(line, max_containers=DEFAULT.reply_containers)
    assert len(P.parse_frame(line, max_containers=10**7)) == 100_000


@pytest.mark.parametrize("line", [
    b"",
    b'{"id": 1, "ok": true, "value": [1, 2',        # truncated
    P.frame({"id": 1, "ok": True, "value": "x" * 50})[:40],  # a frame cut short
    b'{"id": 1}{"id": 2}',                            # two messages on one line
    b"{'id': 1}",                                     # not JSON's quotes
    b'"\xff"',                                       # not UTF-8
    b"[" * 200_000 + b"]" * 200_000,                  # within the count, too deep for the parser
])
def test_a_line_that_is_not_json_is_a_codec_error(line):
    with pytest.raises(P.CodecError, match="not valid JSON"):
        P.parse_frame(line, max_containers=10**7)


# --- values that cross, and come back as they were ------------------------------------------------

@pytest.mark.parametrize("value", [
    None, True, False, 0, -5, 2**63 - 1, -(2**63 - 1), 0.1, -0.0, 1e308, "", "héllo\n☃",
    [], [1, "a", None], (), (1, (2, 3)), {"a": 1, "b": [2.5, None]}, {"n": {"m": (1,)}},
])
def test_plain_values_round_trip(value):
    back = crossed(value)
    assert back == value and type(back) is type(value)
    if isinstance(value, float):
        assert str(back) == str(value)  # -0.0 stays negative


@pytest.mark.parametrize("value", [b"", b"abc", bytes(range(256)), b"\xff\xfe invalid UTF-8", "héllo 👋".encode()])
def test_bytes_round_trip(value):
    back = crossed(value)
    assert back == value and type(back) is bytes


@pytest.mark.parametrize("val", [
    None, 5, ["YWJj"], b"YWJj",
    "YWJ",        # not a multiple of four
    "YW*j",       # not base64
    "YWJj\n",     # a newline the decoder would skip
    "YQ==YQ==",   # data after the padding
    "YR==",       # not canonical: bits past the last byte set
    "YWJjé===",   # not ASCII
])
def test_malformed_bytes_are_refused(val):
    refused({P.TAG_BYTES: val}, "malformed bytes")


def test_a_tuple_stays_a_tuple_and_a_list_a_list():
    back = crossed([(1, [2]), [(3,)]])
    assert type(back) is list and type(back[0]) is tuple and type(back[0][1]) is list and type(back[1][0]) is tuple


@pytest.mark.parametrize("x", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_floats_travel_tagged(x):
    assert P.encode(x) == {P.TAG_FLOAT: repr(x)}
    back = crossed(x)
    assert type(back) is float and (back == x or (x != x and back != back))


def test_an_ordered_dict_crosses_as_a_dict_in_its_order():
    back = crossed(collections.OrderedDict([("z", 1), ("a", 2)]))
    assert type(back) is dict and list(back.items()) == [("z", 1), ("a", 2)]


@pytest.mark.parametrize("dtype", P.DTYPES)
def test_arrays_of_every_allowed_dtype_round_trip_bit_for_bit(dtype):
    rng = np.random.default_rng(0)
    arr = (rng.normal(size=(2, 3, 4)) * 100).astype(dtype)
    back = crossed(arr)
    assert type(back) is np.ndarray and back.dtype == arr.dtype and back.shape == arr.shape
    assert back.tobytes() == arr.tobytes()
    assert back.flags.writeable and back.flags.owndata  # a copy, not a view of the message


@pytest.mark.parametrize("shape", [(0,), (3, 0, 2), (1,) * 16])
def test_empty_and_many_dimensional_arrays_round_trip(shape):
    back = crossed(np.ones(shape, dtype=np.float32))
    assert back.shape == shape


def test_a_non_contiguous_array_crosses_as_its_values():
    arr = np.arange(12, dtype=np.int64).reshape(3, 4).T[::2]
    assert np.array_equal(crossed(arr), arr)


@pytest.mark.parametrize("value", [np.float64(2.5), np.int32(3), np.array(2.5), torch.tensor(2.5)],
                         ids=["np.float64", "np.int32", "0-d array", "0-d tensor"])
def test_zero_dimensional_values_keep_their_shape(value):
    back = crossed(value)
    assert type(back) is type(value) and back.shape == () and back.dtype == value.dtype and back == value


@pytest.mark.parametrize("dtype", P.TENSOR_DTYPES)
def test_tensors_of_every_allowed_dtype_round_trip(dtype):
    want = getattr(torch, dtype)
    t = (torch.randn(3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 50).to(want)
    back = crossed(t)
    assert type(back) is torch.Tensor and back.dtype == want and back.shape == t.shape
    assert back.device.type == "cpu" and torch.equal(back, t)
    if dtype == "bfloat16":  # its bytes travel as float32
        assert P.encode(t)[P.TAG_TENSOR]["array"]["dtype"] == "float32"


def test_a_tensor_crosses_as_plain_data():
    """What arrives is a plain tensor of the values: no grad, no conjugate or negative view, contiguous."""
    grad = torch.ones(2, 3, requires_grad=True) * 2
    conj = torch.tensor([1 + 2j, 3 - 1j]).conj()
    for t, plain in [(grad, torch.full((2, 3), 2.0)), (conj, torch.tensor([1 - 2j, 3 + 1j])),
                     (torch.arange(6.0).reshape(2, 3).t(), torch.tensor([[0.0, 3], [1, 4], [2, 5]]))]:
        back = crossed(t)
        assert not back.requires_grad and back.is_contiguous() and not back.is_conj() and torch.equal(back, plain)


def test_dtypes_devices_and_meta_tensors_round_trip():
    assert crossed(torch.float16) is torch.float16 and crossed(torch.bfloat16) is torch.bfloat16
    assert crossed(torch.device("cuda:1")) == torch.device("cuda:1")
    assert crossed(torch.device("cpu")) == torch.device("cpu")
    meta = crossed(torch.empty(2, 3, dtype=torch.float16, device="meta"))
    assert meta.device.type == "meta" and meta.shape == (2, 3) and meta.dtype == torch.float16
    assert P.encode(torch.empty(2, 3, device="meta")) == {P.TAG_META: {"dtype": "float32", "shape": [2, 3]}}


def test_objects_that_cannot_cross_become_handles_and_handles_come_back():
    class Model:
        pass

    model = Model()
    sent = P.encode([model, (1, model)], to_handle=lambda obj: {P.TAG_HANDLE: {"id": 5, "type": type(obj).__name__}})
    assert sent == [{P.TAG_HANDLE: {"id": 5, "type": "Model"}}, {P.TAG_TUPLE: [1, {P.TAG_HANDLE: {"id": 5, "type": "Model"}}]}]
    got = P.Decoder(lambda val: ("handle", val["id"]))(sent)
    assert got == [("handle", 5), (1, ("handle", 5))]


# --- what the encoder refuses -----------------------------------------------------------------------

def test_the_encoder_refuses_values_nested_deeper_than_its_limit():
    assert P.encode(nested(32)) == nested(32)
    with pytest.raises(P.CodecError, match="nested too deeply"):
        P.encode(nested(33))
    with pytest.raises(P.CodecError, match="nested too deeply"):
        P.encode(nested(33, wrap=tuple))
    with pytest.raises(P.CodecError, match="nested too deeply"):
        P.encode(nested(4), max_depth=3)


class _MyList(list):
    pass


class _MyInt(int):
    pass


class _MyStr(str):
    pass


class _MyDict(dict):
    pass


@pytest.mark.parametrize("value, words", [
    ({1, 2}, "type set cannot cross"),
    (bytearray(b"raw"), "type bytearray cannot cross"),
    (object(), "type object cannot cross"),
    (_MyList([1]), "type _MyList cannot cross"),   # a subclass is not its base: its methods are the learner's
    (_MyInt(1), "type _MyInt cannot cross"),
    (_MyStr("s"), "type _MyStr cannot cross"),
    (_MyDict(a=1), "type _MyDict cannot cross"),
    (np.datetime64("2020-01-01"), "type datetime64 cannot cross"),
    (np.str_("s"), "type str_ cannot cross"),
    ({(1, 2): 3}, "only str and int dict keys"),
    ({1.5: 3}, "only str and int dict keys"),
    ({True: 3}, "only str and int dict keys"),
    (np.array([object()]), "arrays of dtype object cannot cross"),
    (np.array(["a"]), "arrays of dtype <U1 cannot cross"),
    (np.array([1.0], dtype=">f8"), "arrays of dtype >f8 cannot cross"),  # native byte order only
    (np.zeros(2, dtype=np.float16).view(np.dtype("V2")), "cannot cross"),
])
def test_the_encoder_refuses_what_is_not_plain_data(value, words):
    with pytest.raises(P.CodecError, match=words):
        P.encode(value)


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch calls these layouts beta, prototype or deprecated
@pytest.mark.parametrize("make, words", [
    (lambda: torch.ones(2, 2).to_sparse(), "layout sparse_coo"),
    (lambda: torch.ones(2, 2).to_sparse_csr(), "layout sparse_csr"),
    (lambda: torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8), "quantised"),
    (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "nested tensor"),
], ids=["sparse_coo", "sparse_csr", "quantised", "nested"])
def test_the_encoder_refuses_tensors_that_are_not_dense_and_strided(make, words):
    with pytest.raises(P.CodecError, match=words):
        P.encode(make())


def test_a_tensor_without_the_storage_its_shape_needs_is_refused():
    t = torch.ones(2, 3)
    t.untyped_storage().resize_(0)
    with pytest.raises(P.CodecError, match="storage is smaller than its shape"):
        P.encode(t)


# --- what the decoder refuses ---------------------------------------------------------------------

def test_the_decoder_refuses_values_nested_deeper_than_its_limit():
    """Lists, tuples and dicts each count one level; the trusted side's limit is reply_depth (32)."""
    assert DEFAULT.reply_depth == 32
    assert P.Decoder()(nested(32)) == nested(32)
    refused(nested(33), "nested too deeply")
    refused(nested(32, leaf={P.TAG_TUPLE: [1]}), "nested too deeply")
    refused(nested(32, leaf={P.TAG_DICT: [["k", 1]]}), "nested too deeply")
    refused(nested(3), "nested too deeply", max_depth=2)
    assert P.Decoder(max_depth=3)(nested(3)) == nested(3)


@pytest.mark.parametrize("n", [2**63, -(2**64), 2**1000, [1, [2**70]], {P.TAG_DICT: [["k", 2**64]]}])
def test_the_decoder_refuses_integers_wider_than_63_bits(n):
    refused(n, "more than 63 bits")


def test_integers_up_to_63_bits_are_accepted():
    assert P.INT_BITS == 63
    assert P.Decoder()([2**63 - 1, -(2**63 - 1), 0]) == [2**63 - 1, -(2**63 - 1), 0]


@pytest.mark.parametrize("value", [
    {}, {"a": 1, "b": 2}, {P.TAG_TUPLE: [1], P.TAG_DICT: []},   # an object is one tag, never a plain dict
])
def test_an_object_that_is_not_one_tag_is_malformed(value):
    refused(value, "malformed value")


@pytest.mark.parametrize("value", [
    {"plain": "dict"}, {"__set__": [1, 2]}, {"__pickle__": "gASVAAAA"}, {"__object__": {}},
    {P.TAG_TUPLE: "not a list"}, {P.TAG_DICT: {"a": 1}},
    {P.TAG_HANDLE: {"id": 1, "type": "Model"}},   # no handles where the decoder has no from_handle
])
def test_an_unknown_tag_is_refused(value):
    refused(value, "unknown value tag")


@pytest.mark.parametrize("val", ["1.5", "NaN", "Infinity", "+inf", None, 1.0, ["nan"]])
def test_a_tagged_float_is_only_nan_or_an_infinity(val):
    refused({P.TAG_FLOAT: val}, "malformed float")


@pytest.mark.parametrize("items", [
    [["a"]], [["a", 1, 2]], ["a"], [[1, "int key"]], [[True, 1]], [[None, 1]], [[1.5, 1]], [[["k"], 1]],
])
def test_a_dict_holds_pairs_with_str_keys(items):
    refused({P.TAG_DICT: items}, "malformed dict")


def test_int_keys_are_allowed_only_towards_the_worker():
    value = {P.TAG_DICT: [[1, "a"], ["b", 2]]}
    refused(value, "malformed dict")  # the trusted side: colliding int hashes would make a dict quadratic
    assert P.Decoder(int_keys=True)(value) == {1: "a", "b": 2}
    with pytest.raises(P.CodecError, match="malformed dict"):
        P.Decoder(int_keys=True)({P.TAG_DICT: [[True, "bool is not int"]]})


# --- arrays: every field checked, the size before any byte is decoded --------------------------------

@pytest.mark.parametrize("p, words", [
    ("data", "malformed array payload"),
    ({"dtype": "float32", "shape": [1]}, "malformed array payload"),
    (dict(payload(), extra=1), "malformed array payload"),
    (payload(shape=(1,) * 17), "malformed shape"),          # more dimensions than array_dims (16)
    (dict(payload(), shape=[-1]), "malformed shape"),
    (dict(payload(), shape=[2**40]), "malformed shape"),     # one dimension of 2**40 or more
    (dict(payload(), shape=[True, 2]), "malformed shape"),
    (dict(payload(), shape=[2.0]), "malformed shape"),
    (dict(payload(), shape="2"), "malformed shape"),
    (dict(payload(), shape=None), "malformed shape"),
    (payload(dtype="object"), "'object' is not allowed"),
    (dict(payload(), dtype="<f4"), "is not allowed"),       # a name from the list, not a spelling of one
    (dict(payload(), dtype="bfloat16"), "is not allowed"),  # only tensors say bfloat16
    (dict(payload(), dtype=["float32"]), "is not allowed"),
    (dict(payload(), data=None), "malformed array data"),
    (dict(payload(), data=b"AAAAAAAAAAA="), "malformed array data"),
    (dict(payload(shape=(2,)), data="AAAAAAA"), "does not match its dtype and shape"),     # short
    (dict(payload(shape=(2,)), data="AAAAAAAAAAAAAAAA"), "does not match its dtype and shape"),  # long
    (payload(shape=(2**39, 2**39 - 1), data=""), "does not match its dtype and shape"),  # a huge claim
    (dict(payload(shape=(2,)), data="AAAAAAA*AAA="), "malformed array data"),  # not base64, right length
    (dict(payload(shape=(2,)), data="AAAAAAAAAAé="), "malformed array data"),  # not ASCII, right length
    (dict(payload(shape=(1,)), data="AAA=AAAA"), "malformed array data"),  # data after the padding
    (dict(payload(dtype="uint8", shape=(3,)), data="AAA="), "does not match its dtype and shape"),  # 2 bytes
])
def test_a_malformed_array_payload_is_refused(p, words):
    refused({P.TAG_NDARRAY: p}, words)


def test_the_dimension_limit_is_the_decoders():
    ok = {P.TAG_NDARRAY: payload(shape=(1,) * 16)}
    assert P.Decoder()(ok).shape == (1,) * 16
    refused(ok, "malformed shape", max_dims=15)
    refused({P.TAG_NPSCALAR: payload(shape=(1,) * 3)}, "malformed shape", max_dims=2)


def test_a_scalar_payload_must_have_no_dimension():
    refused({P.TAG_NPSCALAR: payload(shape=(1,))}, "malformed scalar")
    assert P.Decoder()({P.TAG_NPSCALAR: payload("int16", shape=())}) == np.int16(0)


# --- tensors: payload, dtype, device --------------------------------------------------------------

def tensor_value(**change):
    value = {"dtype": "float32", "device": "cpu", "array": payload("float32", (2, 3))}
    value.update(change)
    return {P.TAG_TENSOR: value}


@pytest.mark.parametrize("value, words", [
    ({P.TAG_TENSOR: [1.0]}, "malformed tensor payload"),
    ({P.TAG_TENSOR: {"dtype": "float32", "array": payload()}}, "malformed tensor payload"),
    (tensor_value(grad=True), "malformed tensor payload"),
    (tensor_value(dtype="float128"), "unknown tensor dtype"),
    (tensor_value(dtype="qint8"), "unknown tensor dtype"),
    (tensor_value(dtype="nn"), "unknown tensor dtype"),       # a torch attribute, not a dtype
    (tensor_value(dtype="float16"), "float16 tensor whose data is float32"),
    (tensor_value(dtype="bfloat16", array=payload("float16", (2,))), "bfloat16 tensor whose data is float16"),
    (tensor_value(device="tpu"), "unknown device"),
    (tensor_value(device="cpu:0"), "unknown device"),
    (tensor_value(device="cuda:100"), "unknown device"),       # at most two digits
    (tensor_value(device="mps:1"), "unknown device"),
    (tensor_value(device="CUDA"), "unknown device"),
    (tensor_value(device=0), "unknown device"),
    (tensor_value(device="meta"), "meta device cannot carry data"),
    (tensor_value(array=payload(shape=(1,) * 17)), "malformed shape"),
    (tensor_value(array=dict(payload(), data="AAAA")), "does not match its dtype and shape"),
])
def test_a_malformed_tensor_is_refused(value, words):
    refused(value, words)


@pytest.mark.parametrize("dtype", [None, 0, ["float32"]])
def test_a_tensor_dtype_that_is_not_a_name_is_a_codec_error(dtype):
    refused(tensor_value(dtype=dtype), "unknown tensor dtype")


@pytest.mark.parametrize("device, allowed", [
    ("cuda:0", {"cpu"}), ("cuda", {"cpu"}), ("cuda:1", {"cpu", "cuda:0"}), ("mps", {"cpu"}), ("cpu", {"cuda:0"}),
])
def test_a_tensor_on_a_device_the_request_did_not_send_is_refused(device, allowed):
    refused(tensor_value(device=device), f"a tensor on the {device} device", devices=allowed)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_a_tensor_on_a_device_this_machine_lacks_is_refused():
    refused(tensor_value(device="cuda"), "device cuda is not available here", devices={"cpu", "cuda:0"})


def test_a_device_names_its_index():
    assert [P.device_key(d) for d in ("cuda", "mps", "cuda:1", "cpu", torch.device("cuda"))] == \
        ["cuda:0", "mps:0", "cuda:1", "cpu", "cuda:0"]


@pytest.mark.parametrize("value, words", [
    ({P.TAG_META: [2, 3]}, "malformed meta tensor"),
    ({P.TAG_META: {"dtype": "float32"}}, "malformed meta tensor"),
    ({P.TAG_META: {"dtype": "float32", "shape": [2], "data": ""}}, "malformed meta tensor"),
    ({P.TAG_META: {"dtype": "object", "shape": [2]}}, "malformed meta tensor"),
    ({P.TAG_META: {"dtype": "float32", "shape": [1] * 17}}, "malformed shape"),
    ({P.TAG_META: {"dtype": "float32", "shape": [2**40]}}, "malformed shape"),
    ({P.TAG_META: {"dtype": "float32", "shape": [2**39, 2**23]}}, "more elements than a tensor can have"),
    ({P.TAG_META: {"dtype": "float32", "shape": [2**31, 2**30]}}, "a size torch refuses"),
])
def test_a_malformed_meta_tensor_is_refused(value, words):
    refused(value, words)


def test_a_meta_tensor_only_where_the_request_asked_for_one():
    value = {P.TAG_META: {"dtype": "float32", "shape": [2, 3]}}
    refused(value, "the meta device holds no data", devices={"cpu"})
    assert P.Decoder(devices={"cpu", "meta"})(value).device.type == "meta"


@pytest.mark.parametrize("value, words", [
    ({P.TAG_DTYPE: "float128"}, "unknown dtype"),
    ({P.TAG_DTYPE: "Tensor"}, "unknown dtype"),
    ({P.TAG_DTYPE: ["float32"]}, "unknown dtype"),
    ({P.TAG_DEVICE: "tpu"}, "unknown device"),
    ({P.TAG_DEVICE: "cuda:123"}, "unknown device"),
    ({P.TAG_DEVICE: 0}, "unknown device"),
])
def test_a_malformed_dtype_or_device_is_refused(value, words):
    refused(value, words)


# --- the trusted side: a reply read under autograder/core/limits.py ---------------------------------------

def test_a_replys_value_is_decoded_under_the_submissions_limits():
    """`Submission.decode` applies reply_depth and array_dims, and the devices the request sent, and
    turns every refusal into the learner's BoundaryError."""
    limits = DEFAULT.replace(reply_depth=3, array_dims=2)
    with Submission([], limits=limits) as sub:
        assert sub.decode(nested(3)) == nested(3)
        for value, words in [(nested(4), "nested too deeply"),
                             ({P.TAG_NDARRAY: payload(shape=(1, 1, 1))}, "malformed shape"),
                             (tensor_value(device="cuda:0"), "cuda:0 device"),
                             ({P.TAG_META: {"dtype": "float32", "shape": [2]}}, "meta device"),
                             ({"a": 1, "b": 2}, "malformed value"),
                             (tensor_value(dtype=None), "unknown tensor dtype")]:
            with pytest.raises(BoundaryError, match=words):
                sub.decode(value, "f")


@pytest.mark.parametrize("reply, words", [
    ([1], "unexpected reply"),
    ({"id": 2, "ok": True, "value": 1}, "unexpected reply"),           # another request's answer
    ({"id": True, "ok": True, "value": 1}, "unexpected reply"),
    ({"id": 1, "ok": True, "value": 1, "more": 0}, "malformed reply"),
    ({"id": 1, "ok": 1, "value": 1}, "malformed reply"),
    ({"id": 1, "ok": False, "kind": "other", "type": "E", "message": "m"}, "malformed reply"),
    ({"id": 1, "ok": False, "kind": P.KIND_LEARNER, "type": 3, "message": "m"}, "malformed reply"),
    ({"id": 1, "ok": False, "kind": P.KIND_LEARNER, "type": "E"}, "malformed reply"),
    ({"id": 1, "ok": False, "kind": P.KIND_CODEC, "type": "CodecError", "message": "too big"}, "too big"),
])
def test_a_reply_that_breaks_the_envelope_is_the_learners_boundary_error(reply, words):
    with Submission([]) as sub:
        with pytest.raises(BoundaryError, match=words):
            sub._check_reply(reply, 1, "f")


WORKER_CODE = ("def text(n):\n    return 'x' * n\n\n\ndef lists(n):\n    return [[] for _ in range(n)]\n\n\n"
               "def nones(n):\n    return [None] * n\n\n\ndef array(n):\n    import numpy\n    return numpy.zeros(n)\n")


def test_a_reply_too_large_or_holding_too_many_containers_is_refused_by_the_trusted_side():
    """With one real (unsandboxed) worker: a reply over reply_bytes is refused as it is read, one with
    more than reply_containers lists before it is parsed; the worker is ended each time and the next
    call starts a fresh one. The worker refuses a value it can tell is too large before encoding it (it
    stays); one that it cannot tell (its `null`s count 2 bytes each), the trusted side refuses as read."""
    limits = DEFAULT.replace(reply_bytes=4096, reply_containers=50)
    with Submission([{"label": "a", "source": WORKER_CODE}], limits=limits) as sub:
        learner = Learner(sub)
        assert learner.text(3000) == "x" * 3000
        proc = sub.proc
        for call in (lambda: learner.text(5000), lambda: learner.array(600), lambda: learner.lists(3000)):
            with pytest.raises(BoundaryError, match="too large to send \\(over 4096 bytes"):
                call()
            assert sub.proc is proc
        with pytest.raises(BoundaryError, match="larger than the grader accepts"):
            learner.nones(1500)
        assert sub.proc is None
        assert learner.lists(40) == [[]] * 40
        with pytest.raises(BoundaryError, match="more than 50 lists or objects"):
            learner.lists(60)
        assert sub.proc is None


def test_the_payload_estimate_is_a_lower_bound_given_up_once_over_the_cap():
    """payload_bytes never counts more than encoding then framing a value takes, and stops walking a
    large value once over its cap (a list of ten million items is not walked to its end)."""
    values = ["x" * 100, b"y" * 100, np.zeros((7, 3)), torch.ones(5, 2, dtype=torch.bfloat16), [1, 2.5, None],
              {"a": (torch.zeros(3, dtype=torch.int64), [True] * 9)}, torch.empty(4, 4, device="meta"),
              {P.TAG_TUPLE: []}, [[[]]] * 40]
    for v in values:
        assert 0 <= P.payload_bytes(v, 10**9) <= len(P.frame({"value": P.encode(v)})), v
    big = [0] * 10_000_000
    assert 1000 < P.payload_bytes(big, 1000) < 1100


REPEAT_CODE = """
import torch
calls = []

def generator(seed):
    return torch.Generator().manual_seed(seed)

def draw(logits, generator=None):
    calls.append(1)
    logits.mul_(2)  # changes its argument: each call of a repeated call gets the argument as it was sent
    return int(torch.multinomial((logits / 2).softmax(-1), 1, generator=generator))

tries = []

def third_raises(x):
    tries.append(1)
    if len(tries) == 3:
        raise ValueError("the third call")
    return x

def count():
    return len(calls), len(tries)
"""


def test_a_repeated_call_gives_what_as_many_calls_give():
    """`learner.f.repeat(n, ...)`, one request for n calls (a check that draws samples makes hundreds): the
    same values as n calls, each call with its arguments as sent, the first that raises ends it; a worker
    that answers with another number of values, or a repeat count out of bounds, is refused."""
    with Submission([{"label": "a", "source": REPEAT_CODE}]) as sub:
        learner = Learner(sub)
        sub.changed.add(("draw", ""))  # not asked whether draw leaves its argument as it was (it does not)
        logits = torch.tensor([0.1, 0.5, -0.3, 0.2, 0.0, 0.4])
        repeated = learner.draw.repeat(200, logits, generator=learner.generator(7))
        g = learner.generator(7)
        one_by_one = [learner.draw(logits, generator=g) for _ in range(200)]
        assert repeated == one_by_one and len(set(repeated)) == 6  # the same draws, from every token
        assert learner.count() == (400, 0) and torch.equal(logits, torch.tensor([0.1, 0.5, -0.3, 0.2, 0.0, 0.4]))
        assert learner.third_raises.repeat(2, "x") == ["x", "x"]
        with pytest.raises(LearnerError, match="the third call"):
            learner.third_raises.repeat(5, "x")
        assert learner.count() == (400, 3)  # the calls after the one that raised were not made
        for n in (0, P.MAX_REPEAT + 1, True, 2.0):
            with pytest.raises(ValueError, match="repeat must be"):
                learner.count.repeat(n)
            with pytest.raises(BoundaryError, match="malformed repeat"):  # a worker refuses it too
                sub.request({"op": P.OP_CALL, "target": {"name": "count"}, "args": [], "kwargs": [], "repeat": n},
                            name="count")
        real = sub.request
        for forged in ([1, 2], 3, None, {"__tuple__": [1, 2, 3]}):
            sub.request = lambda req, name, forged=forged: forged
            with pytest.raises(BoundaryError, match="the 3 values of a repeated call"):
                learner.count.repeat(3)
        sub.request = real
        assert learner.count.repeat(3) == [(400, 3)] * 3


CHANGES_CODE = """
import numpy as np
import torch

def scale_(x, t):
    x /= t  # the caller's tensor
    return x

def fill(x):
    x[0] = -1.0  # the caller's array
    return x.sum()

def pad(batch, pad_id=0):
    width = max(len(s) for s in batch)
    for s in batch:
        s.extend([pad_id] * (width - len(s)))  # the caller's lists
    return batch

def remember(cache, value):
    cache.append(value)  # the caller's cache list
    return len(cache)

def rename(d):
    d["b"] = d.pop("a")
    return d

def view_then_add(x):
    y = x.view(-1)
    y.add_(1)  # through a view: the same storage, the caller's tensor
    return y

def fine(x, xs, d, *, k=2):
    y = x.clone()
    y /= k
    ys = list(xs) + [0]
    return y, ys, dict(d, c=1)

def same_values(xs):
    xs[0] = xs[0] + 0  # an equal int: nothing changed
    return xs

class Model(torch.nn.Module):
    def forward(self, ids, caches=None):
        if caches is not None:
            caches.append(ids.sum())  # the caller's cache list
        return ids
"""


def test_a_call_that_changes_its_arguments_fails_once_per_part():
    """A function that changes what its caller passed (a tensor divided in place, an array written into,
    lists padded, a cache list filled, a dict's keys, a view's storage) fails with ArgumentChanged naming the
    argument, and its hint says to work on a copy; a function that copies first, or writes an equal value, does
    not. The question is asked once per function and part: after a change, the part's later calls run unasked."""
    from autograder.grading.grader import hint_for
    from autograder.isolation.errors import ArgumentChanged

    with Submission([{"label": "a", "source": CHANGES_CODE}]) as sub:
        learner = Learner(sub)
        x, a = torch.tensor([2.0, 4.0]), np.array([1.0, 2.0])
        cases = [("scale_", (x, 2.0), "x"), ("fill", (a,), "x"), ("pad", ([[1], [2, 3]],), "batch"),
                 ("remember", ([1, 2], 3), "cache"), ("rename", ({"a": 1},), "d"),
                 ("view_then_add", (torch.zeros(2, 2),), "x")]
        for part in ("p1", "p2"):
            sub.part = part
            for name, args, argument in cases:
                with pytest.raises(ArgumentChanged) as info:
                    getattr(learner, name)(*args)
                assert info.value.argument == argument
                assert f"`{name}` changed its argument `{argument}` in place" in hint_for(info.value)
                assert "copy" in hint_for(info.value)
            assert learner.pad([[1], [2, 3]]) == [[1, 0], [2, 3]]  # asked once a part: now judged on its value
            model = learner.Model()  # a module's call is named by its forward's parameters
            assert torch.equal(model(torch.ones(2)), torch.ones(2))
            with pytest.raises(ArgumentChanged, match="caches"):
                model(torch.ones(2), [])
        assert learner.fill(a) == 1.0
        sub.part = "p1"
        y, ys, d = learner.fine(x, [1, 2], {"a": 1}, k=4)
        assert torch.equal(y, x / 4) and ys == [1, 2, 0] and d == {"a": 1, "c": 1}
        assert learner.same_values([5, 6]) == [5, 6]
        assert learner.fine.repeat(3, x, [1], {}) is not None
        # a worker may claim any call changed anything: the name it sends is kept to an identifier's
        for message, shown in (("batch", "batch"), ("argument 3", "argument 3"), ("<b>x</b>\nINFO", "(one of them)"),
                               ("a" * 500, "a" * 60)):
            with pytest.raises(ArgumentChanged) as info:
                sub._check_reply({"id": 9, "ok": False, "kind": P.KIND_CHANGED, "type": "", "message": message}, 9, "g")
            assert info.value.argument == shown and ("g", "p1") in sub.changed
        for call in (lambda: learner.scale_.repeat(3, x, 2.0), lambda: learner.scale_(x=x, t=2.0)):
            sub.changed.clear()  # as the grader does for each submission
            with pytest.raises(ArgumentChanged, match="argument x"):
                call()


OPTIMIZER_CODE = """
import sys, time, types
import torch
sys.modules["optimizers"] = types.ModuleType("optimizers")  # a learner's module of the grader's module's name

def model():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2).double()

def train(m, optimizer, steps):
    for _ in range(steps):
        optimizer.zero_grad()
        m(torch.ones(4, 3, dtype=torch.float64)).pow(2).sum().backward()
        optimizer.step()
    return isinstance(optimizer, torch.optim.Optimizer), "torch._dynamo" in sys.modules, m.weight.detach().clone()

def nap(seconds):
    start = time.monotonic()
    time.sleep(seconds)
    return start, time.monotonic()
"""


def test_a_check_builds_the_graders_optimizer_in_the_learners_process_without_the_compiler():
    """`learner.grader_attribute("optimizers", ...)` reaches the grader's own optimizers in the worker, not a module
    of the learner's of the same name: a torch.optim.Optimizer whose steps are torch.optim's, and that never makes
    the learner's process import torch._dynamo (torch.optim's own do, 1.3 s); an unknown grader module is refused."""
    with Submission([{"label": "a", "source": OPTIMIZER_CODE}]) as sub:
        learner = Learner(sub)
        for name, kwargs, steps in (("SGD", {"lr": 0.1}, 2), ("Adam", {"lr": 0.01}, 3)):
            m = learner.model()
            optimizer = learner.grader_attribute("optimizers", name)(m.parameters(), **kwargs)
            is_optimizer, compiler, weight = learner.train(m, optimizer, steps)
            assert is_optimizer is True and compiler is False
            here = torch.nn.Linear(3, 2).double()
            here.load_state_dict(dict(zip(("weight", "bias"), learner.model().state_dict().values())))
            theirs = getattr(torch.optim, name)(here.parameters(), **kwargs)
            for _ in range(steps):
                theirs.zero_grad()
                here(torch.ones(4, 3, dtype=torch.float64)).pow(2).sum().backward()
                theirs.step()
            assert torch.allclose(weight, here.weight.detach(), rtol=0, atol=1e-12)
        with pytest.raises(BoundaryError, match="malformed target"):
            learner.grader_attribute("os", "system")


def test_the_graders_optimizers_step_as_torch_optims_do():
    """autograder.isolation.optimizers' SGD and Adam against torch.optim's (the oracle), in float64, over steps with gradients
    cleared to None or to zero, a parameter without a gradient, and a closure."""
    from autograder.isolation import optimizers
    for name, kwargs in (("SGD", {"lr": 0.3}), ("Adam", {"lr": 0.05}), ("Adam", {"lr": 0.02, "betas": (0.8, 0.9),
                                                                                    "eps": 1e-6})):
        torch.manual_seed(1)
        ours, theirs = torch.nn.Linear(4, 3).double(), torch.nn.Linear(4, 3).double()
        theirs.load_state_dict(ours.state_dict())
        unused = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
        opts = (getattr(optimizers, name)([*ours.parameters(), unused], **kwargs),
                getattr(torch.optim, name)([*theirs.parameters(), unused.detach().clone().requires_grad_()], **kwargs))
        assert isinstance(opts[0], torch.optim.Optimizer) and opts[0].param_groups[0]["lr"] == kwargs["lr"]
        for step in range(4):
            x = torch.randn(5, 4, dtype=torch.float64)
            for model, opt in zip((ours, theirs), opts):
                opt.zero_grad(set_to_none=step % 2 == 0)
                loss = opt.step(lambda m=model, o=opt: (m(x).tanh().sum().backward(), m(x).sum())[1])
                assert loss is not None
        for a, b in zip(ours.parameters(), theirs.parameters()):
            assert torch.allclose(a, b, rtol=0, atol=1e-12), name
        saved = opts[0].state_dict()  # the base class's own methods work on them too (no state for the unused one)
        assert saved["param_groups"][0]["lr"] == kwargs["lr"] and len(saved["state"]) == (2 if name == "Adam" else 0)


def test_meanwhile_runs_trusted_work_while_the_worker_runs_the_next_call():
    """`learner.meanwhile(fn)`: fn runs in this process while the worker runs the next request (the two intervals
    overlap), its value or its exception comes from `result()`, and without a request it runs at `result()`."""
    import time

    def job():
        start = time.monotonic()
        time.sleep(0.3)
        return start, time.monotonic()

    with Submission([{"label": "a", "source": OPTIMIZER_CODE}]) as sub:
        learner = Learner(sub)
        learner.nap(0)  # loaded
        with learner.meanwhile(job) as later:
            theirs = learner.nap(0.3)
        ours = later.result()
        assert ours[0] < theirs[1] and theirs[0] < ours[1]
        with learner.meanwhile(lambda: 1 / 0) as later:
            assert learner.nap(0)
        with pytest.raises(ZeroDivisionError):
            later.result()
        with learner.meanwhile(lambda: "computed at result()") as later:
            pass
        assert sub.meanwhile is None and later.result() == "computed at result()"
