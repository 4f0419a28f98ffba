"""How JobQueue.job names a job's function (clientwire.func_name): 'module:function' for a
top-level function of an importable module, a clear error for anything else, however many
times it is asked."""

import functools

import pytest
import testjobs  # tests/jobs, on the path by conftest

from queickd import JobQueue


def test_a_top_level_function_is_named_module_colon_function():
    assert JobQueue.job(testjobs.add)["func"] == "testjobs:add"
    assert JobQueue.job(testjobs.add)["func"] == "testjobs:add"  # the second time from the cache


def test_a_name_given_as_text_is_normalized():
    assert JobQueue.job("testjobs.add")["func"] == "testjobs:add"


def test_a_nested_function_is_refused_every_time():
    def inner():
        pass

    for _ in range(2):  # an error is not remembered as a name
        with pytest.raises(ValueError, match="not a top-level function"):
            JobQueue.job(inner)


def test_a_lambda_and_a_partial_are_refused():
    with pytest.raises(ValueError, match="not a top-level function"):
        JobQueue.job(lambda: None)
    with pytest.raises(ValueError, match="not a top-level function"):
        JobQueue.job(functools.partial(testjobs.add, 1))


class _Unhashable:
    __hash__ = None  # type: ignore[assignment]

    def __call__(self):
        pass


def test_an_unhashable_callable_is_refused_as_not_a_function_not_a_type_error():
    with pytest.raises(ValueError, match="not a top-level function"):
        JobQueue.job(_Unhashable())
