"""Every import under lowvm/ runs the way docs/architecture.md draws the packages (and,
inside ``lowvm.nn``, the wings).

The order is read from the two drawings in the doc's "Packages and the direction of
imports" section, so the doc and this test cannot disagree; the imports are read with
``ast``, function-local ones included. A failure names the file, the line, the import and
the doc line that places the importing package.
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
SECTION = "## Packages and the direction of imports"


@dataclass(frozen=True)
class Order:
    """One drawing: what each package may import, and the doc line that places it."""

    below: dict[str, frozenset[str]]  # package -> every package it may import
    line: dict[str, str]  # package -> the drawing's line naming it (spaces collapsed)

    def allows(self, importer: str, imported: str) -> bool:
        return imported == importer or imported in self.below[importer]


def parse_order(drawing: str) -> Order:
    """The order a drawing states: ``a, b → c`` gives c arrows from a and b; a line that
    starts with an arrow continues from the packages the line above arrives at; an
    indented line without a name continues the description above."""
    above: dict[str, set[str]] = {}
    line_of: dict[str, str] = {}
    last: list[str] = []
    for raw in drawing.splitlines():
        head = re.split(r"\s{2,}", raw.strip(), maxsplit=1)[0]
        if not raw.strip():
            continue
        if raw[0] == " " and "→" not in head:  # more of the description above
            if not line_of:
                raise ValueError(f"a description before any package: {raw!r}")
            continue
        sources, arrow, targets = head.rpartition("→")
        names = _names(targets, raw)
        froms = _names(sources, raw) if sources.strip() else (last if arrow else [])
        if arrow and not froms:
            raise ValueError(f"an arrow from nothing: {raw!r}")
        for name in names:
            if name in above:
                raise ValueError(f"{name!r} is placed twice: {line_of[name]!r}, {raw!r}")
            unknown = [f for f in froms if f not in above]
            if unknown:
                raise ValueError(f"{raw!r} draws from {unknown}, placed nowhere above it")
            above[name], line_of[name] = set(froms), " ".join(raw.split())
        last = names
    below: dict[str, frozenset[str]] = {}
    for name in above:  # in drawing order: every source is done before its targets
        below[name] = frozenset().union(*({s} | below[s] for s in above[name]))
    return Order(below, line_of)


def _names(text: str, raw: str) -> list[str]:
    names = [n.strip() for n in text.split(",")]
    if not all(n.isidentifier() for n in names):
        raise ValueError(f"not a list of package names: {text!r} in {raw!r}")
    return names


@functools.cache
def doc_orders() -> tuple[Order, Order]:
    """(packages of lowvm, wings of lowvm.nn), as docs/architecture.md draws them."""
    text = DOC.read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    drawings = re.findall(r"^```\n(.*?)^```", section, re.S | re.M)
    assert len(drawings) == 2, f"{DOC.name}: expected two drawings under {SECTION!r}"
    return parse_order(drawings[0]), parse_order(drawings[1])


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _place(module: str) -> tuple[str, str | None]:
    """(package, nn wing or None) of a module name under ``lowvm``; ("", None) is the
    root package itself, ("nn", None) ``lowvm.nn``'s ``__init__``."""
    parts = module.split(".")[1:]
    if not parts:
        return "", None
    return parts[0], (parts[1] if parts[0] == "nn" and len(parts) > 1 else None)


def _imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, module) of every lowvm import in ``path`` (``from a import b`` gives
    ``a.b`` where that is a module of the tree, else ``a``)."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub if _in_tree(sub, root) else base))
    return [(line, name) for line, name in found if name.split(".")[0] == root.name]


def _in_tree(module: str, root: Path) -> bool:
    path = root.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def violations(root: Path, packages: Order, wings: Order) -> list[str]:
    """Each import under ``root`` that runs against the orders, as ``file:line: what``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root.parent)
        package, wing = _place(_module_name(path, root))
        if package and package not in packages.below:
            found.append(f"{where}: package {package!r} is placed nowhere in {DOC.name}")
            continue
        if wing and wing not in wings.below:
            found.append(f"{where}: nn wing {wing!r} is placed nowhere in {DOC.name}")
            continue
        for line, name in _imports(path, root):
            rule = _broken_rule(package, wing, _place(name), packages, wings, root.name)
            if rule:
                found.append(f"{where}:{line}: imports {name}; {rule}")
    return found


def _broken_rule(package: str, wing: str | None, target: tuple[str, str | None],
                 packages: Order, wings: Order, top: str) -> str | None:
    """Why importing ``target`` from (``package``, ``wing``) runs against the order
    (which rule it breaks, quoting the drawing), or None."""
    to_package, to_wing = target
    if not package:
        return None  # the root package's __init__ sits above everything
    if not to_package:
        return f"no module inside the package does `import {top}`"
    if to_package not in packages.below:
        return f"package {to_package!r} is placed nowhere in {DOC.name}"
    if package == "nn" == to_package:
        if wing is None or wing == to_wing:
            return None  # lowvm.nn's __init__ sits above its wings; a wing imports itself
        if to_wing is None:
            return f"a wing of nn imports {top}.nn's __init__, which sits above every wing"
        if to_wing not in wings.below:
            return f"nn wing {to_wing!r} is placed nowhere in {DOC.name}"
        if not wings.allows(wing, to_wing):
            return (f"nn wing {wing!r} may import only {sorted(wings.below[wing])} "
                    f"({DOC.name}: {wings.line[wing]!r})")
        return None
    if not packages.allows(package, to_package):
        return (f"package {package!r} may import only {sorted(packages.below[package])} "
                f"({DOC.name}: {packages.line[package]!r})")
    return None


def test_no_import_runs_against_the_documented_order() -> None:
    packages, wings = doc_orders()
    found = violations(ROOT / "lowvm", packages, wings)
    assert not found, "imports against docs/architecture.md's order:\n" + "\n".join(found)


def test_the_drawings_place_every_package_and_nothing_else() -> None:
    """Each package and nn wing the doc draws exists, and each one that exists is drawn."""
    packages, wings = doc_orders()
    lowvm = ROOT / "lowvm"
    tree = {p.stem for p in lowvm.iterdir()
            if p.suffix == ".py" and p.stem != "__init__" or (p / "__init__.py").is_file()}
    nn = {p.stem for p in (lowvm / "nn").iterdir()
          if p.suffix == ".py" and p.stem != "__init__" or (p / "__init__.py").is_file()}
    assert set(packages.below) == tree
    assert set(wings.below) == nn


def test_parse_follows_arrows_continuations_and_lists() -> None:
    order = parse_order(textwrap.dedent("""\
        a, b                 the base
          → c                from a and b
                             (a description going on)
          → d
        c → e, f             e and f from c
          → g                from e and f
        """))
    assert order.below == {"a": set(), "b": set(), "c": {"a", "b"}, "d": {"a", "b", "c"},
                           "e": {"a", "b", "c"}, "f": {"a", "b", "c"},
                           "g": {"a", "b", "c", "e", "f"}}
    assert order.allows("d", "a") and not order.allows("c", "d") and not order.allows("e", "f")
    assert order.line["g"] == "→ g from e and f"
    for bad in ("a\n  → a", "  b", "x → y", "a\na b → c"):
        with pytest.raises(ValueError):
            parse_order(bad)


def test_violations_name_the_file_the_line_and_the_rule(tmp_path: Path) -> None:
    """A stand-in tree: each kind of import against the order is reported, and only
    those."""
    top = tmp_path / "pkg"
    files = {
        "__init__.py": "import pkg.nn.hf\n",  # the root may import anything
        "base.py": "",
        "high.py": "from pkg import base\nimport pkg.base as b\n",
        "nn/__init__.py": "from pkg.nn import hf\n",
        "nn/errors.py": "from pkg.base import x\n",
        "nn/layer/__init__.py": "",
        "nn/layer/core.py": ("from pkg.nn.errors import E\nfrom . import other\n"
                             "def later():\n    from pkg.nn.hf import thing\n"),
        "nn/layer/other.py": "import pkg\n",
        "nn/hf.py": "from pkg.nn import layer\nimport pkg.nn\nfrom pkg.high import h\n",
        "stray.py": "",
    }
    for name, text in files.items():
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_text(text)
    packages = parse_order("base\n  → nn\n  → high\n")
    wings = parse_order("errors\n  → layer\n  → hf\n")
    found = violations(top, packages, wings)
    assert found == [
        "pkg/nn/hf.py:2: imports pkg.nn; a wing of nn imports pkg.nn's __init__, which "
        "sits above every wing",
        "pkg/nn/hf.py:3: imports pkg.high; package 'nn' may import only ['base'] "
        f"({DOC.name}: '→ nn')",
        "pkg/nn/layer/core.py:4: imports pkg.nn.hf; nn wing 'layer' may import only "
        f"['errors'] ({DOC.name}: '→ layer')",
        "pkg/nn/layer/other.py:1: imports pkg; no module inside the package does "
        "`import pkg`",
        f"pkg/stray.py: package 'stray' is placed nowhere in {DOC.name}",
    ]
