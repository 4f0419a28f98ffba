"""queickd's JSON text (core/jsontext.py): the standard library's output and errors, by a
shorter way through it."""

import json

import pytest

from queickd.core import jsontext

VALUES = [
    {"op": "enqueue", "func": "m:f", "args": [1, 2.5, None, True], "kwargs": {"k": "v"}},
    ["héllo", "日本語", "\u2028", "tab\there", "quote\"s", "back\\slash"],
    {"nested": {"deep": [[[{"x": -1e-7}]]]}, "big": 2**70, "neg": -0.0},
    "a string alone", 42, 1.5, None, [], {},
]


@pytest.mark.parametrize("value", VALUES)
def test_dumps_writes_what_json_dumps_writes_compact_with_non_ascii_kept(value):
    assert jsontext.dumps(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_dumps_refuses_a_circular_value_as_json_does():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        jsontext.dumps(loop)
    jsontext.dumps([[], []])  # the same empty list twice is not a cycle: the marks are per call


def test_dumps_refuses_what_json_cannot_encode():
    with pytest.raises(TypeError, match="not JSON serializable"):
        jsontext.dumps({"when": object()})


def test_a_value_whose_encoding_failed_halfway_encodes_once_mended():
    value: list = [[1], object()]
    with pytest.raises(TypeError):
        jsontext.dumps(value)  # raised inside `value`: its mark is still set
    value.pop()
    assert jsontext.dumps(value) == "[[1]]"  # not taken for a cycle


def test_threads_encoding_at_once_each_get_what_json_writes():
    import threading

    values = [{"t": t, "xs": list(range(t, t + 50)), "s": "é" * t} for t in range(8)]
    wrong: list = []

    def encode(v: dict) -> None:
        want = json.dumps(v, separators=(",", ":"), ensure_ascii=False)
        for _ in range(2_000):
            if jsontext.dumps(v) != want:
                wrong.append(v["t"])

    threads = [threading.Thread(target=encode, args=(v,)) for v in values]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


@pytest.mark.parametrize("value", VALUES)
def test_loads_reads_back_what_dumps_wrote(value):
    assert jsontext.loads(jsontext.dumps(value)) == value


@pytest.mark.parametrize("text", [' {"a": 1}', '{"a": 1} ', "\n[1]\t"])
def test_loads_takes_json_with_whitespace_around_it(text):
    assert jsontext.loads(text) == json.loads(text)


@pytest.mark.parametrize("text", ["", "   ", "nope", '{"a": 1} x', '{"a": 1}{"b": 2}', '{"a": ', '"open'])
def test_loads_refuses_what_json_refuses_with_its_message(text):
    with pytest.raises(json.JSONDecodeError) as ours:
        jsontext.loads(text)
    with pytest.raises(json.JSONDecodeError) as theirs:
        json.loads(text)
    assert str(ours.value) == str(theirs.value)


def test_a_loader_keeps_its_decoders_hooks():
    def no_big(text):
        raise ValueError(f"too big: {text}")

    loads = jsontext.loader(json.JSONDecoder(parse_float=no_big))
    with pytest.raises(ValueError, match="too big: 1e999"):
        loads('{"x": 1e999}')
    with pytest.raises(ValueError, match="too big: 2.5"):
        loads(' [2.5]')  # by the fallback too


@pytest.mark.parametrize("data", [b'{"a": [1, "\xc3\xa9"]}', bytearray(b"[1, 2]"), '{"a": 1}'.encode("utf-16")])
def test_loads_takes_bytes_as_json_loads_does(data):
    assert jsontext.loads(data) == json.loads(data)


def test_loads_refuses_a_byte_order_mark_as_json_loads_does():
    with pytest.raises(json.JSONDecodeError, match="Unexpected UTF-8 BOM"):
        jsontext.loads('\ufeff{"a": 1}')
