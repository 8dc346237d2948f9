"""The package's shape: what `import llamactx` loads, one error base, decode's status values."""

from __future__ import annotations

import subprocess
import sys

import pytest

import llamactx
from llamactx import DecodeStatus, LlamactxError


def test_importing_the_api_compiles_and_loads_no_kernel():
    code = ("import sys, llamactx, llamactx.llm\n"
            "print(sorted(m for m in sys.modules if m.startswith('llamactx.ggml.kernels')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_decode_status_equals_llama_decode_ints():
    assert (DecodeStatus.OK, DecodeStatus.NO_SLOT, DecodeStatus.ABORTED) == (0, 1, 2)


@pytest.mark.parametrize("name", ["GGUFError", "ModelLoadError", "ContextParamsError", "DecodeError", "StateError"])
def test_public_errors_share_one_base_and_keep_value_error(name):
    cls = getattr(llamactx, name)
    assert issubclass(cls, LlamactxError) and issubclass(cls, ValueError)


def test_every_llamactx_exception_class_has_the_base():
    import importlib
    import pkgutil

    names = [info.name for info in pkgutil.walk_packages(llamactx.__path__, "llamactx.")]
    assert "llamactx.server.worker" in names  # every package is walked, the server's too
    missing = []
    for name in names:
        if ".kernels" in name or name.endswith("__main__"):
            continue
        mod = importlib.import_module(name)
        for obj in vars(mod).values():
            if (isinstance(obj, type) and issubclass(obj, Exception) and obj.__module__ == name
                    and not issubclass(obj, LlamactxError)):
                missing.append(f"{name}.{obj.__name__}")
    assert missing == []


def _imports(path) -> set[str]:
    """The llamactx modules a source file imports, at its top or inside functions."""
    import ast

    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("llamactx")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("llamactx"):
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


# (modules, what they may not import): the layers only import downwards
FORBIDDEN = [
    ("llamactx.ggml", lambda m: not m.startswith(("llamactx.ggml", "llamactx.gguf", "llamactx.errors"))),
    # the backend computes what it is handed: the KV cache, LoRA and graph inputs reach it as the interfaces of
    # backend/ops.py, never as imports of memory/, lora or models/
    ("llamactx.backend", lambda m: not m.startswith(("llamactx.backend", "llamactx.ggml", "llamactx.gguf",
                                                     "llamactx.errors"))),
    ("llamactx.engine", lambda m: m.startswith(("llamactx.server", "llamactx.api", "llamactx.cli", "llamactx.runtime",
                                                "llamactx.llama_cpp_python", "llamactx.llm"))),
    ("llamactx", lambda m: m.startswith(("llamactx.server", "llamactx.cli"))),  # the library, below the front ends
]


def test_imports_run_downwards_only():
    """ggml/ is arithmetic and imports nothing above it (the file format and the error base only); backend/ imports
    only ggml/, gguf/ and the error base, at its top or inside a function; the engine knows no front end; no
    library module imports the HTTP server or the command line (llamactx.api holds the wire shapes they share)."""
    from pathlib import Path

    root = Path(llamactx.__file__).parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        name = ".".join(("llamactx", *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        if name.startswith(("llamactx.server", "llamactx.cli", "llamactx.cluster", "llamactx.__main__")):
            continue  # the front ends (cluster/ runs the server's app on Ray Serve replicas)
        for prefix, forbidden in FORBIDDEN:
            if name == prefix or name.startswith(prefix + "."):
                bad += [f"{name} -> {m}" for m in sorted(_imports(path)) if forbidden(m)]
    assert bad == []


def test_nothing_outside_the_engine_reaches_into_it():
    """Front ends use Engine's methods (add_request, step, abort, the slot API), never its scheduler or prefix
    cache."""
    import re
    from pathlib import Path

    root = Path(llamactx.__file__).parent
    bad = [str(p.relative_to(root)) for p in root.rglob("*.py")
           if "engine" not in p.relative_to(root).parts and re.search(r"\.scheduler\b|\bPrefixCache\b",
                                                                        p.read_text(encoding="utf-8"))]
    assert bad == []


# file names two modules share on purpose: one concept at two levels, each docstring naming the other
SAME_CONCEPT = {
    "attention.py": ("ggml/attention.py", "ggml/kernels/attention.py"),  # the reference and its compiled kernel
    "embedding.py": ("embedding.py", "cli/embedding.py"),  # Embedder and `llamactx embedding`
    "moe.py": ("ggml/moe.py", "models/moe.py"),  # the router's ops and the MoE block built from them
}


def test_no_two_modules_share_a_name_unless_one_concept_at_two_levels():
    from collections import defaultdict
    from pathlib import Path

    root = Path(llamactx.__file__).parent
    by_name = defaultdict(list)
    for path in root.rglob("*.py"):
        if path.name != "__init__.py":
            by_name[path.name].append(path.relative_to(root).as_posix())
    shared = {name: tuple(sorted(paths)) for name, paths in by_name.items() if len(paths) > 1}
    assert shared == {name: tuple(sorted(paths)) for name, paths in SAME_CONCEPT.items()}
    for a, b in SAME_CONCEPT.values():  # each names the other, as a path or a dotted module name
        doc_a, doc_b = ((root / p).read_text(encoding="utf-8").split('"""')[1] for p in (a, b))
        dotted_a, dotted_b = ("llamactx." + p.removesuffix(".py").replace("/", ".") for p in (a, b))
        assert b in doc_a or dotted_b in doc_a, f"{a} does not name {b}"
        assert f"/{a}" in doc_b or dotted_a in doc_b, f"{b} does not name {a}"


def test_the_cluster_never_imports_the_command_line():
    """cluster/ takes a built ServerConfig and ClusterOptions from cli/serve.py: no module of it imports cli/, at
    its top or inside a function (the command line is the front end above it)."""
    from pathlib import Path

    root = Path(llamactx.__file__).parent
    bad = [f"{path.relative_to(root)} -> {m}" for path in sorted((root / "cluster").rglob("*.py"))
           for m in sorted(_imports(path)) if m.startswith("llamactx.cli")]
    assert bad == []


def _import_graph(top_level_only: bool) -> dict[str, set[str]]:
    """Module -> the llamactx modules it imports: at its top only, or anywhere (inside functions too)."""
    import ast
    from pathlib import Path

    root = Path(llamactx.__file__).parent
    modules = {".".join(("llamactx", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__"): p
               for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets = set()
        for node in tree.body if top_level_only else ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("llamactx"):
                targets |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                            for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name in modules}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    cycles = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for nxt in sorted(graph[name]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [name, nxt]) if nxt in path else f"{name} -> {nxt}")
            elif nxt not in state:
                visit(nxt, path + [name])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    return cycles


def test_top_level_imports_have_no_cycles():
    """The module graph (imports at a module's top) is acyclic: every layer can be read from the bottom up."""
    assert _cycles(_import_graph(top_level_only=True)) == []


# cycles through imports inside functions that are known and still to be broken (reported, owned elsewhere): the
# list may only shrink; a new cycle fails the test
KNOWN_FUNCTION_LEVEL_CYCLES: list[str] = []


def test_imports_inside_functions_make_no_cycle_either():
    """Deferred imports (inside functions, for start-up time or optional extras) still run one way: the graph of
    every import, wherever it is written, is acyclic too (but for the known cycles being broken)."""
    assert _cycles(_import_graph(top_level_only=False)) == KNOWN_FUNCTION_LEVEL_CYCLES


def test_every_package_indexes_every_module_it_holds():
    """Each package's __init__ docstring is its index: every module (`name.py`) and subpackage (`name/`) it holds
    is named there, as `name.py` / `name/` or at the head of an index line, so that a reader finds a module from
    its package's index rather than by grep."""
    import ast
    import re
    from pathlib import Path

    root = Path(llamactx.__file__).parent
    missing = []
    for init in sorted(root.rglob("__init__.py")):
        package = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        held = [p.stem for p in package.glob("*.py") if p.name != "__init__.py"]
        held += [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
        for name in sorted(held):
            is_package = (package / name / "__init__.py").is_file()
            named = f"{name}/" if is_package else f"{name}.py"
            if named not in doc and not re.search(rf"^\s+{re.escape(name)}/?\s", doc, re.MULTILINE):
                missing.append(f"{package.relative_to(root.parent).as_posix()}/{named}")
    assert missing == []
