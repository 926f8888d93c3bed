"""iris.settings parses every variable iris reads, and iris.errors holds every error: the docs list
both as they are, and no other module reads an IRIS_* variable or defines an exception class."""
import ast
import inspect
import re
from pathlib import Path

import pytest

import iris
import iris.errors
from iris import settings
from iris.errors import IrisError, SettingError

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "iris").rglob("*.py"))
OWN = re.compile(r"^(IRIS_[A-Z0-9_]+|TRITON_INTERPRET)$")
ROW = re.compile(r"^\| `([A-Z0-9_]+)` \| (.*?) \| (.*) \|$", re.M)
NODE = re.compile(r"^[├└]── (\w+)\s+\(also ([\w, ]+)\)\s+\S", re.M)


# -- the table ------------------------------------------------------------------------
def test_docs_table_is_the_module_table():
    rows = ROW.findall((ROOT / "docs" / "settings.md").read_text())
    expected = [(s.name, settings.shown(s.default), s.meaning) for s in settings.SETTINGS.values()]
    assert rows == expected, "docs/settings.md's table differs from iris.settings.SETTINGS: rewrite it from the module"


def test_docs_link_the_table():
    assert "settings.md" in (ROOT / "README.md").read_text()
    assert "settings.md" in (ROOT / "docs" / "troubleshooting.md").read_text()


def test_every_setting_has_a_typed_default_and_a_meaning():
    for s in settings.SETTINGS.values():
        assert OWN.match(s.name) and s.meaning and "\n" not in s.meaning, s
        assert s.value_of(None) == s.default and s.value_of("") == s.default and s.value_of("  ") == s.default, s


@pytest.mark.parametrize("text,value", [("1", True), ("true", True), ("YES", True), ("On", True), ("y", True),
                                        ("0", False), ("false", False), ("No", False), ("OFF", False), ("n", False)])
def test_one_flag_rule(text, value):
    for flag in (settings.DEBUG, settings.CCL_PUTS, settings.INTERPRET):
        assert flag.value_of(text) is value, (flag.name, text)


@pytest.mark.parametrize("setting,text", [(settings.DEBUG, "2"), (settings.CCL_PUTS, "maybe"),
                                          (settings.INTERPRET, " 1"), (settings.TIMEOUT, "soon"),
                                          (settings.TIMEOUT, "0"), (settings.PORT, "-5"),
                                          (settings.PLATFORM, "tpu"), (settings.CHECK_SYMMETRY, "always"),
                                          (settings.INDIRECT_PEERS, "1;2")])
def test_bad_values_name_the_variable(setting, text):
    with pytest.raises(SettingError, match=f"^{setting.name}="):
        setting.value_of(text)


def test_typed_values():
    assert settings.TIMEOUT.value_of("2.5") == 2.5 and settings.PORT.value_of("4711") == 4711
    assert settings.PLATFORM.value_of(" Host ") == "host" and settings.CHECK_SYMMETRY.value_of("FULL") == "full"
    assert settings.INDIRECT_PEERS.value_of("all") == "all"
    assert settings.INDIRECT_PEERS.value_of(" 3,1 ") == frozenset({1, 3})
    assert settings.INDIRECT_PEERS.value_of("none") == frozenset()
    assert settings.ADDR.value_of(" 10.0.0.7 ") == "10.0.0.7"


def test_read_at_use_not_at_import(monkeypatch):
    """conftest and tests change variables after iris is imported; the next read sees the change."""
    monkeypatch.setenv("IRIS_TIMEOUT", "7")
    assert settings.TIMEOUT.get() == 7.0
    monkeypatch.setenv("IRIS_TIMEOUT", "9.5")
    assert settings.TIMEOUT.get() == 9.5
    from iris.distributed.bootstrap import timeout_from_env
    assert timeout_from_env(None) == 9.5 and timeout_from_env(3) == 3.0
    monkeypatch.setenv("IRIS_CHECK_SYMMETRY", "full")
    from iris.heap.symmetry import mode_from_env
    assert mode_from_env() == "full"
    monkeypatch.delenv("IRIS_CHECK_SYMMETRY")
    assert mode_from_env() == "cheap"


def test_describe_hides_the_secret_and_reports_bad_values(monkeypatch):
    monkeypatch.setenv("IRIS_JOB_SECRET", "s3cr3t")
    monkeypatch.setenv("IRIS_DEBUG", "sometimes")
    rows = {r["name"]: r for r in settings.describe()}
    assert list(rows) == list(settings.SETTINGS)
    assert rows["IRIS_JOB_SECRET"]["set"] == "<hidden>" and "s3cr3t" not in repr(rows)
    assert rows["IRIS_DEBUG"]["error"].startswith("IRIS_DEBUG='sometimes'")
    assert all("error" not in r for n, r in rows.items() if n != "IRIS_DEBUG")


# -- nobody else reads the environment for iris -----------------------------------------
def _own_reads(source: str) -> list:
    """Lines where source names an iris variable itself: an os.environ / os.getenv access with such a
    key, or the variable's bare name as a string (keys of an environment written for child processes)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and OWN.match(node.value):
            found.append(node.lineno)
    return sorted(set(found))


def test_the_scan_finds_reads():
    for code in ('os.environ.get("IRIS_DEBUG")', 'os.environ["IRIS_RANK"]', '"IRIS_SOCKET_DIR" in os.environ',
                 'os.getenv("TRITON_INTERPRET", "0")', 'env = {"IRIS_RANK": str(r)}'):
        assert _own_reads(code) == [1], code
    assert _own_reads('raise ValueError(f"IRIS_TIMEOUT={x!r} is not a number")') == []


def test_only_settings_names_iris_variables():
    offenders = {str(p.relative_to(ROOT)): lines for p in SOURCES if p.name != "settings.py" or p.parent.name != "iris"
                 for lines in [_own_reads(p.read_text())] if lines}
    assert not offenders, f"read these through iris.settings (add the variable to its table): {offenders}"


# -- the error tree ---------------------------------------------------------------------
def _tree_classes():
    return {name: obj for name, obj in vars(iris.errors).items()
            if inspect.isclass(obj) and issubclass(obj, IrisError) and obj is not IrisError and name == obj.__name__}


def test_docs_tree_is_iris_errors():
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    shown = {name: tuple(b.strip() for b in bases.split(",")) for name, bases in NODE.findall(text)}
    classes = _tree_classes()
    assert set(shown) == set(classes), "docs/troubleshooting.md's tree differs from iris/errors.py"
    for name, cls in classes.items():
        builtins = tuple(b.__name__ for b in cls.__bases__ if b is not IrisError)
        assert cls.__bases__[0] is IrisError and shown[name] == builtins, (name, shown[name], builtins)


def test_every_error_is_exported_from_iris():
    names = set(_tree_classes()) | {"IrisError", "NvshmemUnavailable"}
    for name in names:
        assert name in iris.__all__ and getattr(iris, name) is getattr(iris.errors, name), name
    assert iris.NvshmemUnavailable is iris.ProviderUnavailable


def test_old_import_paths_name_the_same_classes():
    from iris.ccl import CollectiveError, ConfigError, GluonUnavailable
    from iris.device.nvshmem import NvshmemUnavailable
    from iris.weights import CheckpointError
    from iris.weights.loading import ReadError
    assert (CollectiveError, ConfigError, GluonUnavailable, NvshmemUnavailable, CheckpointError, ReadError) == (
        iris.CollectiveError, iris.ConfigError, iris.GluonUnavailable, iris.ProviderUnavailable, iris.CheckpointError,
        iris.ReadError)


def test_no_exception_class_outside_errors():
    defined = []
    for p in SOURCES:
        if p.name == "errors.py" and p.parent.name == "iris":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).split(".")[-1] for b in node.bases}
                if any(b.endswith(("Error", "Exception", "Unavailable", "Warning")) for b in bases):
                    defined.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not defined, f"exception classes belong in iris/errors.py under IrisError: {defined}"
