"""Unit tests for queickd.run.loader: the app-directory rule, --allow patterns and resolving."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import uuid
from pathlib import Path

import pytest

from queickd.core.protocol import Code, QueueError
from queickd.run.loader import FunctionLoader


class Modules:
    """Writes uniquely named modules and forgets them (sys.modules, sys.path) afterwards."""

    def __init__(self, tmp_path: Path) -> None:
        self.app_dir = tmp_path / "app"
        self.app_dir.mkdir()
        self.tmp_path = tmp_path
        self.names: list[str] = []

    def unique(self) -> str:
        name = f"qd_loader_{uuid.uuid4().hex[:12]}"
        self.names.append(name)
        return name

    def write(self, source: str, directory: Path | None = None) -> str:
        """Write a module `<unique>.py` (default: into the app dir); return its name."""
        name = self.unique()
        directory = directory or self.app_dir
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{name}.py").write_text(source)
        importlib.invalidate_caches()
        return name

    def marker_module(self, directory: Path) -> tuple[str, Path]:
        """A module that creates a marker file when imported."""
        marker = self.tmp_path / f"imported-{uuid.uuid4().hex[:8]}"
        name = self.write(f"open({str(marker)!r}, 'w').close()\n\ndef f():\n    return 1\n", directory)
        return name, marker

    def forget(self) -> None:
        for mod in list(sys.modules):
            if any(mod == n or mod.startswith(n + ".") for n in self.names):
                del sys.modules[mod]


@pytest.fixture
def mods(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # FunctionLoader inserts the app dir
    m = Modules(tmp_path)
    yield m
    m.forget()


def not_allowed(fn, func):
    with pytest.raises(QueueError) as info:
        fn(func)
    assert info.value.code == Code.NOT_ALLOWED
    return info.value


# --- the app directory ------------------------------------------------------------------------


def test_check_allows_a_module_in_the_app_dir(mods):
    name = mods.write("def f():\n    return 42\n")
    assert FunctionLoader(str(mods.app_dir)).check(f"{name}:f") is None


def test_resolve_returns_the_function_from_the_app_dir(mods):
    name = mods.write("def f(x):\n    return x * 2\n")
    fn = FunctionLoader(str(mods.app_dir)).resolve(f"{name}:f")
    assert fn(21) == 42
    assert fn.__module__ == name


def test_resolve_returns_the_same_function_each_time(mods):
    name = mods.write("def f():\n    return 1\n")
    loader = FunctionLoader(str(mods.app_dir))
    assert loader.resolve(f"{name}:f") is loader.resolve(f"{name}:f")


def test_check_allows_a_package_submodule_in_the_app_dir(mods):
    pkg = mods.unique()
    (mods.app_dir / pkg).mkdir()
    (mods.app_dir / pkg / "__init__.py").write_text("")
    (mods.app_dir / pkg / "tasks.py").write_text("def f():\n    return 'sub'\n")
    importlib.invalidate_caches()
    loader = FunctionLoader(str(mods.app_dir))
    assert loader.resolve(f"{pkg}.tasks:f")() == "sub"


def test_loader_puts_the_app_dir_on_sys_path(mods):
    FunctionLoader(str(mods.app_dir))
    assert os.path.realpath(mods.app_dir) in sys.path


# --- refused functions --------------------------------------------------------------------------


def test_check_refuses_os_system_as_not_allowed(mods):
    not_allowed(FunctionLoader(str(mods.app_dir)).check, "os:system")


def test_resolve_refuses_os_system_as_not_allowed(mods):
    not_allowed(FunctionLoader(str(mods.app_dir)).resolve, "os:system")


def test_check_refuses_a_builtin_module(mods):
    not_allowed(FunctionLoader(str(mods.app_dir)).check, "sys:exit")


def test_check_refuses_a_stdlib_module_that_is_a_file(mods):
    not_allowed(FunctionLoader(str(mods.app_dir)).check, "json:dumps")


def test_not_allowed_message_names_the_function(mods):
    e = not_allowed(FunctionLoader(str(mods.app_dir)).check, "os:system")
    assert "os:system" in e.message


def test_missing_module_is_not_allowed(mods):
    not_allowed(FunctionLoader(str(mods.app_dir)).check, f"{mods.unique()}:f")


def test_missing_package_of_a_dotted_module_is_not_allowed(mods):
    not_allowed(FunctionLoader(str(mods.app_dir)).check, f"{mods.unique()}.sub:f")


def test_module_in_a_sibling_dir_sharing_the_app_dir_prefix_is_not_allowed(mods):
    sibling = mods.tmp_path / "apple"  # "app" is a string prefix of "apple"
    name = mods.write("def f():\n    return 1\n", sibling)
    sys.path.insert(0, str(sibling))
    assert importlib.util.find_spec(name) is not None
    not_allowed(FunctionLoader(str(mods.app_dir)).check, f"{name}:f")


def test_symlink_in_app_dir_to_a_module_outside_is_not_allowed(mods):
    outside = mods.tmp_path / "outside"
    name = mods.write("def f():\n    return 1\n", outside)
    (mods.app_dir / f"{name}.py").symlink_to(outside / f"{name}.py")
    importlib.invalidate_caches()
    not_allowed(FunctionLoader(str(mods.app_dir)).check, f"{name}:f")


# --- --allow patterns ---------------------------------------------------------------------------


def test_allow_exact_module_name_admits_its_functions(mods):
    loader = FunctionLoader(str(mods.app_dir), allow=["json"])
    loader.check("json:dumps")
    assert loader.resolve("json:dumps") is json.dumps


def test_allow_wildcard_admits_the_module(mods):
    FunctionLoader(str(mods.app_dir), allow=["json*"]).check("json:dumps")


def test_allow_wildcard_admits_submodules(mods):
    loader = FunctionLoader(str(mods.app_dir), allow=["json*"])
    assert loader.resolve("json.decoder:JSONDecoder") is json.JSONDecoder


def test_allow_exact_module_name_does_not_admit_its_submodules(mods):
    not_allowed(FunctionLoader(str(mods.app_dir), allow=["json"]).check, "json.decoder:JSONDecoder")


def test_allow_pattern_does_not_admit_other_modules(mods):
    not_allowed(FunctionLoader(str(mods.app_dir), allow=["json*"]).check, "os:system")


def test_allow_pattern_may_name_a_single_function(mods):
    loader = FunctionLoader(str(mods.app_dir), allow=["json:dumps"])
    loader.check("json:dumps")
    not_allowed(loader.check, "json:loads")


def test_allow_pattern_is_case_sensitive(mods):
    not_allowed(FunctionLoader(str(mods.app_dir), allow=["JSON"]).check, "json:dumps")


# --- resolve errors -----------------------------------------------------------------------------


def test_resolve_non_callable_attribute_raises_type_error(mods):
    name = mods.write("VALUE = 3\n")
    with pytest.raises(TypeError, match="not callable"):
        FunctionLoader(str(mods.app_dir)).resolve(f"{name}:VALUE")


def test_resolve_of_a_function_the_module_lacks_raises_not_found(mods):
    name = mods.write("def f():\n    return 1\n")
    with pytest.raises(QueueError) as info:
        FunctionLoader(str(mods.app_dir)).resolve(f"{name}:g")
    assert info.value.code == Code.NOT_FOUND and "defines no function 'g'" in info.value.message


def test_resolve_keeps_the_error_of_a_module_getattr(mods):
    name = mods.write("def __getattr__(attr):\n    raise RuntimeError(f'lazy {attr} failed')\n")
    with pytest.raises(RuntimeError, match="lazy g failed"):
        FunctionLoader(str(mods.app_dir)).resolve(f"{name}:g")


# --- what the module defines, told at check ---------------------------------------------------


def not_found(fn, func):
    with pytest.raises(QueueError) as info:
        fn(func)
    assert info.value.code == Code.NOT_FOUND
    return info.value


def test_check_refuses_a_function_an_imported_module_lacks(mods):
    name = mods.write("def f():\n    return 1\n")
    loader = FunctionLoader(str(mods.app_dir))
    loader.resolve(f"{name}:f")
    assert "defines no function 'nope'" in not_found(loader.check, f"{name}:nope").message


def test_check_refuses_a_function_the_source_lacks_without_importing_it(mods):
    name, marker = mods.marker_module(mods.app_dir)
    not_found(FunctionLoader(str(mods.app_dir)).check, f"{name}:nope")
    assert not marker.exists() and name not in sys.modules


def test_check_refuses_a_function_a_package_module_lacks_without_importing_the_package(mods):
    pkg = mods.unique()
    marker = mods.tmp_path / "pkg-imported"
    (mods.app_dir / pkg).mkdir()
    (mods.app_dir / pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (mods.app_dir / pkg / "tasks.py").write_text("def f():\n    return 1\n")
    loader = FunctionLoader(str(mods.app_dir))
    loader.check(f"{pkg}.tasks:f")
    not_found(loader.check, f"{pkg}.tasks:nope")
    assert not marker.exists()


@pytest.mark.parametrize("source", [
    "globals()['g'] = lambda: 1\n",  # a name a parse cannot see bound: only its string
    "from json import *\n",
    "def __getattr__(name):\n    return lambda: name\n",
    "exec('def ' + 'g' + '(): return 1')\n",
    "# g is made by hand\nsetattr(__import__(__name__), 'g', len)\n",
])
def test_check_accepts_a_name_the_source_may_bind_out_of_sight(mods, source):
    name = mods.write(source)
    FunctionLoader(str(mods.app_dir)).check(f"{name}:g")


def test_check_accepts_an_async_def_without_importing_it(mods):
    name = mods.write("async def a():\n    return 1\n")
    FunctionLoader(str(mods.app_dir)).check(f"{name}:a")  # async jobs run: nothing to refuse
    assert name not in sys.modules


def test_check_finds_a_function_added_to_a_module_not_imported_once_its_file_changes(mods):
    name = mods.write("def f():\n    return 1\n")
    loader = FunctionLoader(str(mods.app_dir))
    not_found(loader.check, f"{name}:g")
    (mods.app_dir / f"{name}.py").write_text("def f():\n    return 1\n\n\ndef g():\n    return 2\n")
    loader.check(f"{name}:g")  # a process job's zygote imports the changed file: no reload needed


# --- nothing outside the app directory runs --------------------------------------------------


def test_check_does_not_import_a_module_outside_the_app_dir(mods):
    outside = mods.tmp_path / "outside"
    name, marker = mods.marker_module(outside)
    sys.path.insert(0, str(outside))
    assert importlib.util.find_spec(name) is not None  # importable, so importing was possible
    not_allowed(FunctionLoader(str(mods.app_dir)).check, f"{name}:f")
    assert not marker.exists()
    assert name not in sys.modules


def test_resolve_does_not_import_a_module_outside_the_app_dir(mods):
    outside = mods.tmp_path / "outside"
    name, marker = mods.marker_module(outside)
    sys.path.insert(0, str(outside))
    not_allowed(FunctionLoader(str(mods.app_dir)).resolve, f"{name}:f")
    assert not marker.exists()


def test_check_does_not_import_a_dotted_module_outside_the_app_dir(mods):
    outside = mods.tmp_path / "outside"
    pkg = mods.unique()
    marker = mods.tmp_path / "pkg-imported"
    (outside / pkg).mkdir(parents=True)
    (outside / pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (outside / pkg / "tasks.py").write_text("def f():\n    return 1\n")
    sys.path.insert(0, str(outside))
    importlib.invalidate_caches()
    not_allowed(FunctionLoader(str(mods.app_dir)).check, f"{pkg}.tasks:f")
    assert not marker.exists()


def test_check_alone_does_not_import_a_module_in_the_app_dir(mods):
    name, marker = mods.marker_module(mods.app_dir)
    FunctionLoader(str(mods.app_dir)).check(f"{name}:f")
    assert not marker.exists()


def test_resolve_imports_a_module_in_the_app_dir(mods):
    name, marker = mods.marker_module(mods.app_dir)
    FunctionLoader(str(mods.app_dir)).resolve(f"{name}:f")
    assert marker.exists()


# --- app modules that would hide standard or installed ones --------------------------------------


def test_an_app_module_named_like_a_stdlib_module_is_refused_when_a_job_names_it(mods):
    (mods.app_dir / "csv.py").write_text("def f():\n    return 'not the csv module'\n")
    e = not_allowed(FunctionLoader(str(mods.app_dir)).check, "csv:f")
    assert "the standard library's csv" in e.message and "rename" in e.message


def test_an_app_module_named_like_a_stdlib_module_does_not_hide_it(mods):
    (mods.app_dir / "csv.py").write_text("raise ImportError('the app csv was imported')\n")
    sys.path.insert(0, str(mods.app_dir))  # as `python -m` puts the cwd first
    sys.modules.pop("csv", None)
    loader = FunctionLoader(str(mods.app_dir))
    try:
        assert importlib.import_module("csv").__file__ != str(mods.app_dir / "csv.py")
        assert sys.path[-1] == loader.app_dir and sys.path.count(loader.app_dir) == 1
    finally:
        sys.modules.pop("csv", None)


def test_an_app_package_named_like_an_installed_module_is_refused_when_a_job_names_it(mods):
    (mods.app_dir / "pytest").mkdir()
    (mods.app_dir / "pytest" / "__init__.py").write_text("")
    e = not_allowed(FunctionLoader(str(mods.app_dir)).check, "pytest:f")
    assert "the installed pytest" in e.message


def test_the_stdlib_test_package_counts_as_the_standard_library(mods):
    (mods.app_dir / "test.py").write_text("def f():\n    return 1\n")
    loader = FunctionLoader(str(mods.app_dir))
    assert loader.shadowing == {"test": "the standard library's test"}


def test_an_app_directory_without_init_named_like_a_stdlib_module_is_allowed(mods):
    (mods.app_dir / "csv").mkdir()  # a namespace portion: the stdlib's csv still wins
    assert FunctionLoader(str(mods.app_dir)).shadowing == {}


# --- reload -------------------------------------------------------------------------------------


def test_reload_picks_up_a_function_added_to_an_imported_module(mods):
    name = mods.write("def f():\n    return 1\n")
    loader = FunctionLoader(str(mods.app_dir))
    assert loader.resolve(f"{name}:f")() == 1
    (mods.app_dir / f"{name}.py").write_text("def f():\n    return 2\n\n\ndef g():\n    return 'new'\n")
    done = loader.reload()
    assert name in done.modules and done.failed == {}
    assert loader.resolve(f"{name}:f")() == 2 and loader.resolve(f"{name}:g")() == "new"


def test_a_module_that_fails_on_reload_keeps_its_old_code(mods, caplog):
    name = mods.write("def f():\n    return 1\n")
    loader = FunctionLoader(str(mods.app_dir))
    assert loader.resolve(f"{name}:f")() == 1
    (mods.app_dir / f"{name}.py").write_text("def f():\n    return 2\n\nraise RuntimeError('half-written file')\n")
    with caplog.at_level("ERROR", logger="queickd.loader"):
        done = loader.reload()
    assert done.modules == [] and "RuntimeError: half-written file" in done.failed[name]
    assert loader.resolve(f"{name}:f")() == 1
    assert f"{name} failed to import, the old code keeps serving" in caplog.text


def test_reload_finds_a_module_added_after_it_was_refused(mods):
    loader = FunctionLoader(str(mods.app_dir))
    name = mods.unique()
    not_allowed(loader.check, f"{name}:f")  # not there yet: refused, and the refusal cached
    (mods.app_dir / f"{name}.py").write_text("def f():\n    return 3\n")
    loader.reload()
    assert loader.resolve(f"{name}:f")() == 3
