"""The package's structure, enforced: layers import downwards only, no import cycles, no module
reads another's private names, adapters stay thin, modules stay small; inside the verdicts, no
arrow runs back up and no rule imports another; every finding is born naming a registered rule;
every option is declared once.

The layers (``docs/architecture.md`` draws them): a module may import its own package and any
package of a *lower* layer, never a higher one nor a sibling of its own layer. Imports made only
for type checking (``if TYPE_CHECKING:``) follow the layering too, and count for cycles too.
Everything is read from the source with ``ast``: nothing is imported.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "src" / "memwatch"

#: Layer of each top-level part of the package (lower numbers are imported by higher ones).
LAYERS: dict[str, int] = {
    "_version": 0,
    "core": 0,
    "probes": 1,
    "timeline": 2,
    "analysis": 3,
    "bundle": 3,
    "runtime": 4,
    "report": 5,
    "sinks": 5,
    "session": 6,
    "integrations": 7,
    "testing": 7,
    "autorun": 8,
    "cli": 9,
    "__init__": 10,  # memwatch/__init__.py: the public facade
    "__main__": 10,  # python -m memwatch: the CLI
}
ADAPTERS = ("lightning", "transformers", "accelerate")
MAX_ADAPTER_CODE_LINES = 150
MAX_MODULE_LINES = 500


# --------------------------------------------------------------------------- reading the tree
def module_name(path: Path, root: Path = PKG) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = PKG) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def part_of(mod: str) -> str:
    """``memwatch.analysis.rules.leak`` -> ``analysis``; ``memwatch`` -> ``__init__``."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            t = node.test
            name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) \
                else None
            if name == "TYPE_CHECKING":
                for child in node.body:
                    lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports(path: Path, known: set[str]) -> Iterator[tuple[str, int, bool]]:
    """(imported memwatch module, line, run-time import?) for every import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = _type_checking_lines(tree)
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                targets.append(sub if sub in known else node.module)
        for t in targets:
            if t == "memwatch" or t.startswith("memwatch."):
                yield t, node.lineno, node.lineno not in typing_only


def import_graph(root: Path = PKG, type_only: bool = True) -> dict[str, set[str]]:
    """Module -> the memwatch modules it imports (``type_only``: imports made only for type
    checking too: a cycle through them is still a tangle a reader has to hold in mind)."""
    mods = modules(root)
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for target, _, runtime in imports(path, known):
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if (runtime or type_only) and target != m:
                graph[m].add(target)
    return graph


def layering_violations(root: Path = PKG) -> list[str]:
    mods = modules(root)
    known = set(mods)
    bad = []
    for m, path in mods.items():
        src_part = part_of(m)
        for target, line, _ in imports(path, known):
            dst_part = part_of(target)
            if dst_part == src_part:
                continue
            if dst_part not in LAYERS or src_part not in LAYERS:
                bad.append(f"{m}:{line} imports {target}: {dst_part!r} or {src_part!r} has no "
                           "layer in LAYERS")
            elif LAYERS[dst_part] >= LAYERS[src_part]:
                bad.append(f"{m}:{line} imports {target} ({dst_part}, layer "
                           f"{LAYERS[dst_part]}) from {src_part} (layer {LAYERS[src_part]})")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def private_reads(root: Path = PKG) -> list[str]:
    """Reads of a private name (``_x``) that another memwatch module defines, from a module that
    does not define it: ``obj._x`` on something other than ``self``/``cls``, and
    ``from memwatch.m import _x``."""
    mods = modules(root)
    defined: dict[str, set[str]] = {}
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in mods.items()}
    for m, tree in trees.items():
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names = [node.attr]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                tgts = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in tgts if isinstance(t, ast.Name)]
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    defined.setdefault(n, set()).add(m)
    bad = []
    for m, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in defined \
                    and m not in defined[node.attr]:
                v = node.value
                if isinstance(v, ast.Name) and v.id in ("self", "cls"):
                    continue
                bad.append(f"{m}:{node.lineno} reads .{node.attr} (defined in "
                           f"{', '.join(sorted(defined[node.attr]))})")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("memwatch"):
                for a in node.names:
                    # A package's private submodule (integrations._driver) is the package's
                    # own business: its modules may import it.
                    own_submodule = f"{node.module}.{a.name}" in mods and \
                        m.rsplit(".", 1)[0] == node.module
                    if a.name.startswith("_") and not a.name.startswith("__") \
                            and node.module != m and not own_submodule:
                        bad.append(f"{m}:{node.lineno} imports private {a.name} from "
                                   f"{node.module}")
    return bad


def code_lines(path: Path) -> int:
    """Lines of code: not blank, not a comment, not part of a docstring."""
    src = path.read_text()
    tree = ast.parse(src)
    doc: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(
                    getattr(body[0], "value", None), ast.Constant) and \
                    isinstance(body[0].value.value, str):
                doc.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    comments = {t.start[0] for t in tokenize.generate_tokens(io.StringIO(src).readline)
                if t.type == tokenize.COMMENT}
    return sum(1 for i, line in enumerate(src.splitlines(), 1)
               if line.strip() and i not in doc
               and not (i in comments and line.strip().startswith("#")))


#: The analyzer's rules and shared statistics read recorded values only: what they may import.
#: Anything that walks the heap, reads /proc or runs tracemalloc lives in analysis/culprits/
#: behind the Evidence port (docs/architecture.md).
PURE_PACKAGES = ("memwatch.analysis.rules", "memwatch.analysis.stats")
PURE_MAY_IMPORT = ("memwatch.core", "memwatch.timeline", "memwatch.analysis.stats",
                   "memwatch.analysis.rules", "memwatch.analysis.context",
                   "memwatch.analysis.evidence", "memwatch.analysis.culprits.wording")
#: Standard-library modules that read the live process: never in a rule.
LIVE_STDLIB = frozenset({"gc", "tracemalloc", "ctypes", "resource", "psutil", "os", "sys",
                         "inspect", "linecache", "mmap", "signal", "subprocess", "threading"})


def live_imports(root: Path = PKG) -> list[str]:
    """Imports of the pure analysis packages that could read the live process."""
    bad = []
    for m, path in modules(root).items():
        if not m.startswith(PURE_PACKAGES):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for n in names:
                top = n.split(".")[0]
                if top in LIVE_STDLIB or (n.startswith("memwatch") and not any(
                        n == ok or n.startswith(ok + ".") for ok in PURE_MAY_IMPORT)):
                    bad.append(f"{m}:{node.lineno} imports {n}")
    return bad


#: The floors of analysis/, lowest first: a module may import its own floor and those below,
#: never one above (type-only imports included). The statistics take plain values; the
#: tuning and context sit on them, the port and its values on those; the culprits' stages come
#: in the order a culprit is found; the rules read the port, the statistics and the culprit
#: wording; the beliefs revise what the rules said; the analyzer runs them all.
ANALYSIS_FLOORS: tuple[tuple[str, ...], ...] = (
    ("memwatch.analysis.stats",),
    ("memwatch.analysis.context",),
    ("memwatch.analysis.evidence",),
    ("memwatch.analysis.culprits.census",),
    ("memwatch.analysis.culprits.growth",),
    ("memwatch.analysis.culprits.holders",),
    ("memwatch.analysis.culprits.attribution", "memwatch.analysis.culprits.wording"),
    ("memwatch.analysis.culprits.live", "memwatch.analysis.rules"),
    ("memwatch.analysis.beliefs",),
    ("memwatch.analysis.analyzer",),
)


def analysis_floor(mod: str) -> int | None:
    """The floor of ``mod`` in :data:`ANALYSIS_FLOORS` (the longest prefix that names it)."""
    best: tuple[int, int] | None = None
    for floor, prefixes in enumerate(ANALYSIS_FLOORS):
        for pre in prefixes:
            if (mod == pre or mod.startswith(pre + ".")) and (best is None or len(pre) > best[1]):
                best = (floor, len(pre))
    return best[0] if best is not None else None


def analysis_back_arrows(root: Path = PKG) -> list[str]:
    """Imports inside analysis/ from a floor to a higher one."""
    mods = modules(root)
    known = set(mods)
    bad = []
    for m, path in mods.items():
        low = analysis_floor(m)
        if low is None:
            continue
        for target, line, _ in imports(path, known):
            high = analysis_floor(target)
            if high is not None and high > low:
                bad.append(f"{m}:{line} imports {target} (floor {high} over floor {low})")
    return bad


#: What every rule shares; a rule imports these, never another rule.
RULES_SHARED = ("memwatch.analysis.rules.base", "memwatch.analysis.rules.words")


def rule_cross_imports(root: Path = PKG) -> list[str]:
    """Imports of one rule by another (a rule's own package, its parts, is its own)."""
    mods = modules(root)
    known = set(mods)
    bad = []
    for m, path in mods.items():
        parts = m.split(".")
        if parts[:3] != ["memwatch", "analysis", "rules"] or len(parts) < 4 or \
                m in RULES_SHARED:
            continue
        own = ".".join(parts[:4])
        for target, line, _ in imports(path, known):
            if not target.startswith("memwatch.analysis.rules") or target in RULES_SHARED or \
                    target == own or target.startswith(own + "."):
                continue
            bad.append(f"{m}:{line} imports the rule {target}")
    return bad


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "text"`` and ``PART = SubRule(name="text"...)`` (as ``PART.name``)."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            for t in targets:
                if not isinstance(t, ast.Name) or value is None:
                    continue
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    out[t.id] = value.value
                elif isinstance(value, ast.Call):
                    name = _keyword(value, "name")
                    if name is not None:
                        text = _resolve(name, out)
                        if text is not None:
                            out[f"{t.id}.name"] = text
    return out


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _resolve(node: ast.expr, strings: dict[str, str]) -> str | None:
    """A rule's name as the code writes it: a literal, ``NAME`` or ``PART.name``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return strings.get(node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return strings.get(f"{node.value.id}.{node.attr}")
    return None


def _kinds_literal(node: ast.expr | None) -> set[str] | None:
    """``frozenset({"a", "b"})`` as a set of its strings."""
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], (ast.Set, ast.List,
                                                                             ast.Tuple)):
        return {e.value for e in node.args[0].elts if isinstance(e, ast.Constant)}
    if isinstance(node, ast.Call) and not node.args:
        return set()
    return None


def finding_births(root: Path = PKG) -> list[str]:
    """Findings not born naming a registered rule of a kind it declares: a ``.finding(...)``
    without ``rule=``; one whose rule (a literal, ``NAME``, ``PART.name``) is no registered
    ``Rule``/``SubRule`` or does not declare its ``kind``; a ``Finding(...)`` built outside
    ``core/findings.py`` (findings are born through ``Origin.finding``); a declared kind that
    is not in ``core.findings.KINDS``, or a kind of ``KINDS`` that no rule declares."""
    mods = modules(root)
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in mods.items()}
    declared: dict[str, set[str]] = {}
    births: list[tuple[str, int, str | None, str | None]] = []
    bad: list[str] = []
    for m, tree in trees.items():
        strings = _module_strings(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            fname = fn.id if isinstance(fn, ast.Name) else fn.attr \
                if isinstance(fn, ast.Attribute) else None
            if fname in ("Rule", "SubRule"):
                name = _keyword(node, "name")
                kinds = _kinds_literal(_keyword(node, "kinds"))
                text = _resolve(name, strings) if name is not None else None
                if text is not None and kinds is not None:
                    declared[text] = kinds
            elif fname == "Finding" and m != "memwatch.core.findings":
                bad.append(f"{m}:{node.lineno} builds a Finding (born through Origin.finding)")
            elif fname == "finding" and isinstance(fn, ast.Attribute):
                rule = _keyword(node, "rule")
                kind = _keyword(node, "kind")
                if rule is None:
                    bad.append(f"{m}:{node.lineno} makes a finding without rule=")
                    continue
                births.append((m, node.lineno, _resolve(rule, strings),
                               kind.value if isinstance(kind, ast.Constant) else None))
    kinds_doc = next((n.value for n in ast.walk(trees.get("memwatch.core.findings", ast.Module(
        body=[], type_ignores=[]))) if isinstance(n, ast.AnnAssign) and
        isinstance(n.target, ast.Name) and n.target.id == "KINDS"), None)
    known_kinds = {e.value for e in kinds_doc.elts} if isinstance(kinds_doc, ast.Tuple) else set()
    every = set().union(*declared.values()) if declared else set()
    for m, line, rule_name, kind in births:
        if rule_name is None:  # a shared wording helper handed the rule by its caller
            if kind is not None and kind not in every:
                bad.append(f"{m}:{line} makes a {kind!r} no rule declares")
            continue
        if rule_name not in declared:
            bad.append(f"{m}:{line} names the unregistered rule {rule_name!r}")
        elif kind is not None and kind not in declared[rule_name]:
            bad.append(f"{m}:{line} makes a {kind!r} that {rule_name} does not declare")
    for rule_name, kinds in sorted(declared.items()):
        for k in sorted(kinds - known_kinds):
            bad.append(f"rule {rule_name} declares {k!r}, not in core.findings.KINDS")
    for k in sorted(known_kinds - every):
        bad.append(f"core.findings.KINDS has {k!r}, which no rule declares")
    return bad


def option_declarations(root: Path = PKG) -> list[str]:
    """An option declared outside ``session/config.py``: one of its flags written out in another
    module, or a class other than the keyword types of ``session/options.py`` (checked against
    the fields by ``tests/session``) annotating a quarter or more of the options (reading one
    through, ``Part("config", name)``, is no declaration)."""
    mods = modules(root)
    config = mods.get("memwatch.session.config")
    if config is None:
        return []
    tree = ast.parse(config.read_text())
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "WatchConfig"),
               None)
    if cls is None:
        return ["memwatch.session.config has no WatchConfig"]
    names = {n.target.id for n in cls.body
             if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    flags = {node.args[0].value for node in ast.walk(cls) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == "Flag" and node.args
             and isinstance(node.args[0], ast.Constant)}
    bad = []
    for m, path in mods.items():
        if m == "memwatch.session.config":
            continue
        t = ast.parse(path.read_text(), str(path))
        for node in ast.walk(t):
            if isinstance(node, ast.Constant) and node.value in flags:
                bad.append(f"{m}:{node.lineno} writes the flag {node.value} out")
            elif isinstance(node, ast.ClassDef) and m != "memwatch.session.options":
                # (a Part(...) reads an option through, as MemWatch.out_dir does: no declaration)
                own = {n.target.id for n in node.body
                       if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                       and not (isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)
                                and n.value.func.id == "Part")}
                if len(own & names) >= max(4, len(names) // 4):
                    bad.append(f"{m}:{node.lineno} declares the options again ({node.name})")
    return bad


#: The session's parts, each the only writer of its attributes (docs/architecture.md), and the
#: names this code base binds them to (``mw.step_count``, ``self._checker.findings``).
SESSION_OWNERS = {
    "memwatch.session.session": ("mw", "memwatch", "session", "given"),
    "memwatch.session.sampling": ("_sampling", "sampling"),
    "memwatch.session.checker": ("_checker", "checker"),
    "memwatch.session.runtime": ("_runtime", "runtime"),
    "memwatch.session.scheduler": ("_scheduler", "scheduler"),
    "memwatch.session.checkpoint": ("_checkpoints", "checkpoints"),
    "memwatch.session.faults": ("_faults", "faults"),
    "memwatch.session.thread": ("_training_thread",),
    "memwatch.session.plan": ("_run_plan",),
}


def foreign_writes(root: Path = PKG) -> list[str]:
    """Assignments to an attribute of a session part (``mw.total_steps = ...``,
    ``self._checker.findings = ...``) from a module that is not the part's own: every
    attribute has one writer."""
    owner_of = {name: m for m, names in SESSION_OWNERS.items() for name in names}
    bad = []
    for m, path in modules(root).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)):
                continue
            v = node.value
            receiver = v.id if isinstance(v, ast.Name) else v.attr \
                if isinstance(v, ast.Attribute) else None
            owner = owner_of.get(receiver or "")
            if owner is not None and owner != m:
                bad.append(f"{m}:{node.lineno} assigns {receiver}.{node.attr} (owned by "
                           f"{owner})")
    return bad


# --------------------------------------------------------------------------- the rules
def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {part_of(m) for m in modules()}
    assert parts <= set(LAYERS), f"give these a layer in LAYERS and docs: {parts - set(LAYERS)}"


def test_imports_point_down_only() -> None:
    assert layering_violations() == []


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_no_module_reads_another_modules_private_names() -> None:
    assert private_reads() == []


def test_adapters_are_thin() -> None:
    sizes = {a: code_lines(PKG / "integrations" / f"{a}.py") for a in ADAPTERS}
    assert all(n <= MAX_ADAPTER_CODE_LINES for n in sizes.values()), sizes


def test_rules_read_recorded_values_only() -> None:
    assert live_imports() == []


def test_every_session_attribute_has_one_writer() -> None:
    assert foreign_writes() == []


def test_no_arrow_runs_back_up_inside_analysis() -> None:
    assert analysis_back_arrows() == []


def test_no_rule_imports_another() -> None:
    assert rule_cross_imports() == []


def test_every_finding_is_born_naming_a_registered_rule() -> None:
    assert finding_births() == []


def test_every_option_is_declared_once() -> None:
    assert option_declarations() == []


def test_no_module_over_the_size_limit() -> None:
    big = {m: n for m, p in modules().items()
           if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert big == {}


# --------------------------------------------------------------------------- the rules can fail
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "memwatch"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_a_planted_upward_import_is_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/units.py": "from memwatch.session.session import MemWatch\n",
        "session/__init__.py": "",
        "session/session.py": "from memwatch.core.units import x\n",
    })
    bad = layering_violations(root)
    assert len(bad) == 1 and "memwatch.core.units:1 imports memwatch.session.session" in bad[0]


def test_a_planted_sibling_import_and_type_only_import_are_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "report/__init__.py": "",
        "report/html.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                          "    from memwatch.sinks.wandb import WandbSink\n",
        "sinks/__init__.py": "",
        "sinks/wandb.py": "",
    })
    assert len(layering_violations(root)) == 1


def test_a_planted_cycle_is_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "analysis/__init__.py": "from memwatch.analysis.analyzer import Analyzer\n",
        "analysis/analyzer.py": "from memwatch.analysis import leak\n",
        "analysis/leak.py": "def f():\n    from memwatch.analysis.analyzer import Analyzer\n",
    })
    assert cycles(import_graph(root)) == [["memwatch.analysis.analyzer",
                                           "memwatch.analysis.leak"]]


def test_a_planted_private_read_is_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "session.py": "class S:\n    def __init__(self):\n        self._tracer = None\n",
        "runtime.py": "def f(s):\n    return s._tracer\n",
        "report.py": "from memwatch.session import _helper\n",
    })
    bad = sorted(private_reads(root))
    assert bad == ["memwatch.report:1 imports private _helper from memwatch.session",
                   "memwatch.runtime:2 reads ._tracer (defined in memwatch.session)"]


@pytest.mark.parametrize("source,expected", [
    ('"""doc\nstring"""\n\n# a comment\nx = 1  # trailing\n\ndef f():\n    """doc"""\n'
     '    return x\n', 3),
])
def test_code_lines_count(tmp_path: Path, source: str, expected: int) -> None:
    p = tmp_path / "m.py"
    p.write_text(source)
    assert code_lines(p) == expected


def test_a_planted_live_import_in_a_rule_is_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "analysis/__init__.py": "",
        "analysis/rules/__init__.py": "",
        "analysis/rules/leak.py": "import gc\nfrom memwatch.analysis.culprits import census\n"
                                  "from memwatch.analysis.stats.held import verdict\n",
    })
    assert live_imports(root) == ["memwatch.analysis.rules.leak:1 imports gc",
                                  "memwatch.analysis.rules.leak:2 imports "
                                  "memwatch.analysis.culprits"]


def test_a_planted_foreign_write_is_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "session/__init__.py": "",
        "session/session.py": "class MemWatch:\n    def __init__(self):\n"
                              "        self._total_steps = None\n",
        "integrations/__init__.py": "",
        "integrations/_driver.py": "def f(mw):\n    mw._total_steps = 5\n",
    })
    assert foreign_writes(root) == ["memwatch.integrations._driver:2 assigns mw._total_steps "
                                    "(owned by memwatch.session.session)"]


def test_a_planted_back_arrow_inside_analysis_is_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "analysis/__init__.py": "",
        "analysis/context.py": "from memwatch.analysis.stats.shapes import EpochStats\n",
        "analysis/stats/__init__.py": "",
        "analysis/stats/shapes.py": "",
        "analysis/stats/held.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from memwatch.analysis.context import CheckContext\n",
        "analysis/culprits/__init__.py": "",
        "analysis/culprits/census/__init__.py": "",
        "analysis/culprits/census/census.py":
            "from memwatch.analysis.culprits.holders.holders import holder_of\n",
        "analysis/culprits/holders/__init__.py": "",
        "analysis/culprits/holders/holders.py":
            "from memwatch.analysis.culprits.census import census\n",
    })
    assert sorted(analysis_back_arrows(root)) == [
        "memwatch.analysis.culprits.census.census:1 imports "
        "memwatch.analysis.culprits.holders.holders (floor 5 over floor 3)",
        "memwatch.analysis.stats.held:3 imports memwatch.analysis.context (floor 1 over floor 0)"]


def test_a_planted_rule_importing_a_rule_is_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "analysis/__init__.py": "",
        "analysis/rules/__init__.py": "from memwatch.analysis.rules import leak, workers\n",
        "analysis/rules/base.py": "",
        "analysis/rules/words.py": "",
        "analysis/rules/leak/__init__.py": "",
        "analysis/rules/leak/rule.py": "from memwatch.analysis.rules.leak import native\n"
                                       "from memwatch.analysis.rules.base import Rule\n",
        "analysis/rules/leak/native.py": "",
        "analysis/rules/workers.py": "from memwatch.analysis.rules.leak.rule import judge\n"
                                     "from memwatch.analysis.rules.words import where\n",
    })
    assert rule_cross_imports(root) == [
        "memwatch.analysis.rules.workers:1 imports the rule memwatch.analysis.rules.leak.rule"]


def test_a_planted_unnamed_or_unregistered_finding_is_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/findings.py": "KINDS: tuple[str, ...] = ('leak', 'plateau', 'near_oom')\n",
        "analysis/__init__.py": "",
        "analysis/rules/__init__.py": "",
        "analysis/rules/leak.py":
            "NAME = 'leak'\n"
            "def judge(inp):\n"
            "    return [inp.ctx.origin.finding(rule=NAME, kind='leak'),\n"
            "            inp.ctx.origin.finding(rule=NAME, kind='plateau'),\n"
            "            inp.ctx.origin.finding(kind='leak'),\n"
            "            inp.ctx.origin.finding(rule='mystery', kind='leak')]\n"
            "RULE = Rule(name=NAME, kinds=frozenset({'leak'}), once=frozenset(), judge=judge)\n",
        "sinks.py": "from memwatch.core.findings import Finding\nF = Finding(kind='leak')\n",
    })
    assert finding_births(root) == [
        "memwatch.analysis.rules.leak:5 makes a finding without rule=",
        "memwatch.sinks:2 builds a Finding (born through Origin.finding)",
        "memwatch.analysis.rules.leak:4 makes a 'plateau' that leak does not declare",
        "memwatch.analysis.rules.leak:6 names the unregistered rule 'mystery'",
        "core.findings.KINDS has 'near_oom', which no rule declares",
        "core.findings.KINDS has 'plateau', which no rule declares"]


def test_a_planted_second_declaration_of_the_options_is_caught(tmp_path: Path) -> None:
    fields = "".join(f"    {n}: int = option(1, flag=Flag('--{n}', 'int', 'h'))\n"
                     for n in ("a", "b", "c", "d"))
    root = _tree(tmp_path, {
        "__init__.py": "",
        "session/__init__.py": "",
        "session/config.py": f"class WatchConfig:\n{fields}",
        "session/options.py": "class WatchOptions:\n    a: int\n    b: int\n    c: int\n"
                              "    d: int\n",
        "cli/__init__.py": "",
        "cli/run.py": "OPTIONS = (('--b', 'b', 'int', 'h'),)\n",
        "integrations/__init__.py": "",
        "integrations/mine.py": "class Mine:\n    a: int\n    b: int\n    c: int\n    d: int\n",
    })
    assert option_declarations(root) == [
        "memwatch.cli.run:1 writes the flag --b out",
        "memwatch.integrations.mine:1 declares the options again (Mine)"]
