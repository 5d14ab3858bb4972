"""Every import in coverpruner/ points down the layers (docs/architecture.md, "Layers"), also inside function
bodies; no family imports another family; no import cycle between modules.

The imports are read with `ast` (nothing is imported): `import a.b`, `from a.b import c` (c a submodule or a
name), relative imports, at module level and inside functions. `LAYERS` is the one ordered list of the layers,
bottom first; docs/architecture.md's layer picture follows it.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "coverpruner"

# Bottom to top. A module may import its own layer's package and any layer below; packages that share a layer
# do not import each other. Every module of coverpruner/ must fall in exactly one entry.
LAYERS: list[tuple[str, ...]] = [
    ("coverpruner.integers",),  # strict integer text: imported by the layer above it too (staged_dir's pid names)
    ("coverpruner", "coverpruner.errors", "coverpruner.extras", "coverpruner.filehash", "coverpruner.progress",
     "coverpruner.staged_dir"),  # extras: the console scripts, each imported by name (importlib)
    ("coverpruner.images", "coverpruner.video"),
    ("coverpruner.selection",),
    ("coverpruner.families",),
    ("coverpruner.engine_dir",),
    ("coverpruner.export", "coverpruner.engines"),
    ("coverpruner.testing",),  # random checkpoints: test tooling over families + export
    ("coverpruner.runtime",),
    ("coverpruner.serving", "coverpruner.evaluation", "coverpruner.demo"),
    ("coverpruner.doctor",),  # verifies a device: runs the demo's tiny engine dir on every provider
]
FAMILIES = "coverpruner.families"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def unit(module: str) -> str:
    """The LAYERS entry (package or module) a module belongs to: the longest matching prefix."""
    hits = [u for layer in LAYERS for u in layer if module == u or module.startswith(u + ".")]
    if not hits:
        raise AssertionError(f"{module} is in no entry of LAYERS; add it where it belongs")
    return max(hits, key=len)


def level(module: str) -> int:
    u = unit(module)
    return next(i for i, layer in enumerate(LAYERS) if u in layer)


def family_of(module: str) -> str | None:
    """The family package a module belongs to (coverpruner.families.<family>.*), None for the shared modules."""
    parts = module.split(".")
    if module.startswith(FAMILIES + ".") and f"{FAMILIES}.{parts[2]}" in MODULES and \
            MODULES[f"{FAMILIES}.{parts[2]}"].name == "__init__.py":
        return parts[2]
    return None


def imports(module: str) -> list[tuple[str, int]]:
    """(imported coverpruner module, line) for every import statement of `module`, function bodies included."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            # `from pkg import sub` imports the submodule pkg.sub when there is one
            targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES and "." in t:  # `import a.b.c` of a name: its module
                t = t.rpartition(".")[0]
            if t in MODULES and t != module:
                out.append((t, node.lineno))
    return out


def layer_problems() -> list[str]:
    problems = []
    for mod in MODULES:
        for target, line in imports(mod):
            where = f"{MODULES[mod].relative_to(ROOT.parent)}:{line}: {mod} imports {target}"
            lm, lt = level(mod), level(target)
            if lt > lm:
                problems.append(f"{where} (upward: layer {lt} {unit(target)} above layer {lm} {unit(mod)})")
            elif lt == lm and unit(mod) != unit(target):
                problems.append(f"{where} (sideways between {unit(mod)} and {unit(target)})")
            fm, ft = family_of(mod), family_of(target)
            if ft is not None and fm != ft:
                problems.append(f"{where} (family package {ft} imported from "
                                f"{'family ' + fm if fm else 'a shared families module'})")
    return problems


def cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    graph = {m: sorted({t for t, _ in imports(m)}) for m in MODULES}
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for m in graph:
        if m not in index:
            visit(m)
    return out


def test_every_module_has_a_layer():
    assert len(MODULES) > 80
    for mod in MODULES:
        unit(mod)


def test_imports_point_down():
    assert layer_problems() == []


def test_no_import_cycles():
    assert cycles() == []


def test_the_reader_sees_what_it_must(tmp_path, monkeypatch):
    """The checks fail where they should: a function-level import of the runtime from a family, one family
    importing another, a shared families module (families/qwen_vl.py, which both Qwen families import) importing a
    family, a relative upward import and a two-module cycle, each planted in a copy of the tree."""
    import shutil

    root = tmp_path / "coverpruner"
    shutil.copytree(ROOT, root, ignore=shutil.ignore_patterns("__pycache__", "csrc"))
    plant = {
        "families/llava/runtime.py": "\n\ndef _planted():\n    from coverpruner.runtime.errors import ImageError\n",
        "families/qwen2_5_vl/runtime.py": "\nfrom coverpruner.families.llava import LlavaRuntime\n",
        "families/qwen_vl.py":
            "\n\ndef _planted():\n    from coverpruner.families.qwen3_vl.runtime import IMAGE_TOKEN\n",
        "selection/baselines.py": "\nfrom ..engine_dir import MANIFEST\n",
        "export/selector_io.py": "\nfrom coverpruner.export import selector\n",
    }
    for rel, text in plant.items():
        with open(root / rel, "a") as f:
            f.write(text)
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", root)
    monkeypatch.setattr(__import__(__name__, fromlist=["MODULES"]), "MODULES",
                        {module_name(p): p for p in sorted(root.rglob("*.py"))})
    problems = "\n".join(layer_problems())
    assert "coverpruner.families.llava.runtime imports coverpruner.runtime.errors (upward" in problems
    assert "coverpruner.families.qwen2_5_vl.runtime imports coverpruner.families.llava (family package llava " \
           "imported from family qwen2_5_vl)" in problems
    assert "coverpruner.families.qwen_vl imports coverpruner.families.qwen3_vl.runtime (family package qwen3_vl " \
           "imported from a shared families module)" in problems
    assert "coverpruner.selection.baselines imports coverpruner.engine_dir (upward" in problems
    assert any({"coverpruner.export.selector", "coverpruner.export.selector_io"} <= set(c) for c in cycles())


@pytest.mark.parametrize("package", ["coverpruner.families", "coverpruner.selection"])
def test_bottom_layers_import_no_runtime_or_export(package):
    """The issue's acceptance grep, as a test: families/ and selection/ never name runtime/export/serving/evaluation."""
    bad = [f"{m} imports {t}" for m in MODULES if m.startswith(package) for t, _ in imports(m)
           if t.split(".")[1] in ("runtime", "export", "serving", "evaluation")]
    assert bad == []


# engines/ is a layer below runtime/: importing every engines module loads no coverpruner.runtime module
# (kept from tests/engines/test_layering.py: the same rule, checked by importing).
def test_engines_do_not_import_runtime():
    import coverpruner.engines as engines

    modules = [f"coverpruner.engines.{m.name}" for m in pkgutil.iter_modules(engines.__path__)]
    assert "coverpruner.engines.interfaces" in modules and "coverpruner.engines.trt_pipeline" not in modules
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "bad = sorted(m for m in sys.modules if m.startswith('coverpruner.runtime'))\n"
            + "print('runtime modules:', bad)\nraise SystemExit(1 if bad else 0)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def picture_layers(doc: str) -> list[tuple[str, ...]]:
    """The layers of docs/architecture.md's picture (the first code block after "## Layers"), bottom first:
    each line's names before its description (`serving/` -> coverpruner.serving, `demo.py` -> coverpruner.demo,
    `__init__.py` -> coverpruner)."""
    block = doc.split("## Layers", 1)[1].split("```", 2)[1]
    out = []
    for line in block.strip("\n").splitlines():
        words = [w for w in line.split() if w.endswith(("/", ".py"))]
        out.append(tuple("coverpruner" if w == "__init__.py" else "coverpruner." + w.removesuffix("/").removesuffix(".py")
                         for w in words))
    return out[::-1]


def test_architecture_picture_follows_layers():
    """docs/architecture.md's layer picture is LAYERS (the source), top to bottom, nothing more or less."""
    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    assert [sorted(layer) for layer in picture_layers(doc)] == [sorted(layer) for layer in LAYERS]
    swapped = doc.replace(" runtime/ ", " RUNTIME ").replace(" testing/ ", " runtime/ ").replace(" RUNTIME ", " testing/ ")
    assert [sorted(layer) for layer in picture_layers(swapped)] != [sorted(layer) for layer in LAYERS]
