"""Claims are tests: every test a document names exists, so a promise in README.md or docs/
(docs/security.md names one per promise) cannot outlive the test behind it.

A document names tests as ``tests/…py::test_name`` or ``tests/…py`` alone; a ``::test_name``
after it is in the last module named before it; a bare ``test_name`` or ``test_file.py`` (as in
"tests/unit/mig/test_cli.py `test_a`, `test_b`") must exist somewhere under tests/. A path may
break across lines after a slash, as prose wraps it."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)(?:::(\w+))?")
_TOKEN = re.compile(
    r"(?P<module>tests/[\w/]+\.py)(?:::(?P<name>\w+(?:::\w+)?))?"
    r"|::(?P<more>(?:[A-Z]\w*::)?test_\w+)"
    r"|\b(?P<file>test_\w+\.py)\b"
    r"|\b(?P<bare>test_\w*[^\W_])\b"  # not a pattern such as test_api_*.py
)
_WRAPPED = re.compile(r"(tests/[\w/]*/)[ \t]*\n\s*")


@functools.cache
def _defined(path: Path) -> frozenset[str]:
    """Test functions of a module, and Class::method pairs."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {
                f"{node.name}::{f.name}"
                for f in node.body
                if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            }
    return frozenset(names)


@functools.cache
def _suite() -> frozenset[str]:
    """Every test module's file name, and every function or method name, under tests/."""
    modules = sorted((REPO / "tests").rglob("*.py"))
    return frozenset(
        {m.name for m in modules} | {n.rpartition("::")[2] for m in modules for n in _defined(m)}
    )


def dangling(text: str) -> list[str]:
    """The test references in a document's ``text`` that name no existing test or module."""
    known = _suite()
    missing: list[str] = []
    module: Path | None = None
    for match in _TOKEN.finditer(_WRAPPED.sub(r"\1", text)):
        ref, name = match.group(0), match.group("name") or match.group("more")
        bare = match.group("file") or match.group("bare")
        if match.group("module"):
            module = REPO / match.group("module")
            if not module.is_file():
                missing.append(ref)
                module = None  # a ``::test_name`` after it has no module to be in
                continue
        if name and (module is None or name not in _defined(module)):
            missing.append(f"{module.relative_to(REPO)}::{name}" if module else ref)
        elif bare and bare not in known:
            missing.append(ref)
    return missing


def test_every_test_a_document_names_exists() -> None:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    missing = [f"{d.relative_to(REPO)}: {ref}" for d in docs for ref in dangling(d.read_text())]
    assert not missing, "documents name tests that do not exist:\n" + "\n".join(missing)


def test_a_name_without_its_test_is_reported() -> None:
    """A made-up document: each kind of reference, once to a test that exists, once not."""
    real = "tests/deploy/test_docs_name_tests.py"
    doc = (
        f"Shown by `{real}::test_a_name_without_its_test_is_reported`, `::test_made_up`,\n"
        "`::test_every_test_a_document_names_exists`; tests/deploy/\ntest_house.py and "
        "`tests/unit/mig/\ntest_nowhere.py::test_a` (wrapped), `::test_b`, "
        "test_cli.py `test_never_written`, `test_gone.py`, `test_house.py`."
    )
    assert dangling(doc) == [
        f"{real}::test_made_up",
        "tests/unit/mig/test_nowhere.py::test_a",
        "::test_b",
        "test_never_written",
        "test_gone.py",
    ]


def test_every_section_of_the_threat_model_names_its_tests() -> None:
    text = (REPO / "docs" / "security.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    bare = [s.splitlines()[0] for s in sections if not _REF.search(s)]
    assert bare == ["What the agent does not promise"], bare
