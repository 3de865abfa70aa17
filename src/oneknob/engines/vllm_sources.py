"""A vLLM release's Python sources, read with `ast` (a wheel straight from its zip): what binds a name, a class's
members through its bases, the routes of its HTTP server. Nothing of vLLM is imported. oneknob.engines.vllm_contract
checks its list of points with `check_point`.
"""

from __future__ import annotations

import ast
import re
import zipfile
from functools import cache
from pathlib import Path

from oneknob.engines import vllm_versions

class Tree:
    """The Python files of one vLLM release: a directory holding vllm/ (site-packages, a checkout) or a wheel."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if self.path.is_file():  # a wheel a person gave: what is wrong with it, never a BadZipFile traceback
            from oneknob.engines import vllm_wheels

            vllm_wheels.check(self.path)
        self.zip = zipfile.ZipFile(self.path) if self.path.is_file() else None
        names = self.zip.namelist() if self.zip else [str(p.relative_to(self.path)) for p in
                                                      (self.path / "vllm").rglob("*.py")]
        self.names = {n for n in names if n.startswith("vllm/") and n.endswith(".py")}
        self.memo: dict = {}
        if not self.names:
            raise ValueError(f"{path}: no vllm/ Python package in it")

    def read(self, rel: str) -> str:
        return self.zip.read(rel).decode() if self.zip else (self.path / rel).read_text()

    @property
    def version(self) -> str:
        for node in ast.walk(self.parse("vllm/_version.py") or ast.Module(body=[], type_ignores=[])):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and any(getattr(t, "id", "") == "__version__" for t in node.targets):
                return str(node.value.value)
        found = re.search(r"vllm(?:_cpu)?-([^-/]+?)\.dist-info", " ".join(self.zip.namelist() if self.zip else []))
        return found.group(1) if found else "unknown"

    def file_of(self, module: str) -> str | None:
        base = module.replace(".", "/")
        return next((f for f in (f"{base}.py", f"{base}/__init__.py") if f in self.names), None)

    @cache  # noqa: B019 (one Tree per check)
    def parse(self, rel: str) -> ast.Module | None:
        return ast.parse(self.read(rel)) if rel in self.names else None

    def module(self, module: str) -> ast.Module | None:
        rel = self.file_of(module)
        return self.parse(rel) if rel else None


def _top_level(tree: ast.Module):
    """Top-level statements, into `if`/`try` blocks (TYPE_CHECKING imports, fallbacks)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.If, ast.Try)):
            stack += node.body + node.orelse + getattr(node, "finalbody", []) + \
                [s for h in getattr(node, "handlers", []) for s in h.body]
        else:
            yield node


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join(parts + ([node.module] if node.module else []))


def _binding(tree: Tree, module: str, name: str):
    """What binds `name` at the top of `module`: ("class", ClassDef), ("from", (module, name)), ("other", node)."""
    found = tree.module(module)
    if found is None:
        return None
    package = (tree.file_of(module) or "").endswith("__init__.py")
    for node in _top_level(found):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return ("class" if isinstance(node, ast.ClassDef) else "other", node)
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return ("from", (_absolute(module, node, package), alias.name))
        if isinstance(node, ast.Import) and any((a.asname or a.name.split(".")[0]) == name for a in node.names):
            return ("other", node)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) else []
        if any(getattr(t, "id", None) == name for t in targets):
            return ("other", node)
    for node in _top_level(found):  # vLLM's lazy tables: MODULE_ATTRS = {"LLM": ".entrypoints.llm:LLM"}
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) \
                and any(getattr(t, "id", "") in ("MODULE_ATTRS", "_LAZY_IMPORTS") for t in node.targets):
            for key, value in zip(node.value.keys, node.value.values):
                if getattr(key, "value", None) == name and isinstance(value, ast.Constant):
                    target, _, attr = str(value.value).partition(":")
                    return ("from", ((module + target) if target.startswith(".") else target, attr or name))
    if tree.file_of(f"{module}.{name}"):  # a submodule
        return ("other", None)
    return None


def _resolve_class(tree: Tree, module: str, name: str, depth: int = 0):
    """(module, ClassDef) of `name` as `module` sees it, through re-exports."""
    bound = _binding(tree, module, name)
    if bound is None or depth > 8:
        return None
    if bound[0] == "class":
        return module, bound[1]
    if bound[0] == "from":
        return _resolve_class(tree, bound[1][0], bound[1][1], depth + 1)
    return None


def _members(tree: Tree, module: str, cls: ast.ClassDef, depth: int = 0) -> dict[str, ast.AST]:
    key = ("members", module, cls.name, cls.lineno)
    if key not in tree.memo:
        tree.memo[key] = _find_members(tree, module, cls, depth)
    return tree.memo[key]


def _find_members(tree: Tree, module: str, cls: ast.ClassDef, depth: int) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(node.name, node)
            for sub in ast.walk(node):  # self.x = ... / self.x: T = ...
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] \
                    if isinstance(sub, ast.AnnAssign) else []
                for t in targets:
                    if isinstance(t, ast.Attribute) and getattr(t.value, "id", "") == "self":
                        out.setdefault(t.attr, sub)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.setdefault(node.target.id, node)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out.setdefault(t.id, node)
    for base in cls.bases if depth < 8 else ():
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
        found = _resolve_class(tree, module, name) if name else None
        if found:
            for key, value in _members(tree, found[0], found[1], depth + 1).items():
                out.setdefault(key, value)
    return out


def _routes(tree: Tree) -> dict[tuple[str, str], list]:
    """(method, path) -> [(file, function)] of every routed function under vllm/entrypoints/."""
    if "routes" not in tree.memo:
        routes: dict[tuple[str, str], list] = {}
        for rel in sorted(n for n in tree.names if n.startswith("vllm/entrypoints/")):
            text = tree.read(rel)
            if ".get(" not in text and ".post(" not in text and "api_route(" not in text:
                continue
            for node in ast.walk(tree.parse(rel)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for d in node.decorator_list:
                        if isinstance(d, ast.Call) and d.args and isinstance(d.args[0], ast.Constant) \
                                and isinstance(getattr(d.func, "attr", None), str):
                            routes.setdefault((d.func.attr, d.args[0].value), []).append((rel, node))
        tree.memo["routes"] = routes
    return tree.memo["routes"]


def _params_ok(func: ast.AST, spec: str) -> str | None:
    """None when `func`'s parameters fit spec ("a, b, *, c"), else what does not."""
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return f"not a function ({type(func).__name__})"
    args = func.args
    positional = [a.arg for a in args.posonlyargs + args.args]
    if positional[:1] in (["self"], ["cls"]):
        positional = positional[1:]
    every = set(positional) | {a.arg for a in args.kwonlyargs}
    wanted, _, keywords = spec.partition("*")
    wanted = [w.strip() for w in wanted.split(",") if w.strip()]
    if positional[: len(wanted)] != wanted:
        return f"its parameters are ({', '.join(positional)}), not ({', '.join(wanted)}, ...)"
    missing = [k.strip(" ,") for k in keywords.split(",") if k.strip(" ,") and k.strip(" ,") not in every]
    if missing and args.kwarg is None:
        return f"it takes no {', '.join(missing)}"
    return None


def check_point(tree: Tree, kind: str, target: str) -> tuple[bool, str]:
    """(found, where or what is missing) for one point of the contract (its kinds: vllm_contract's docstring)."""
    if kind == "module":
        main, _, module = target.rpartition(":")
        found = tree.module(module)
        if found is None:
            return False, f"no module {module}"
        if main and "__main__" not in {getattr(n, "value", None) for n in ast.walk(found)}:
            return False, f"{module} has no `if __name__ == '__main__'`"
        return True, tree.file_of(module)
    if kind == "name":
        module, _, name = target.partition(":")
        if tree.module(module) is None:
            return False, f"no module {module}"
        return (True, tree.file_of(module)) if _binding(tree, module, name) else (False, f"{module} has no {name}")
    if kind == "member":
        module, _, rest = target.partition(":")
        cls_name, _, member = rest.partition(".")
        member, _, params = member.partition("(")
        found = _resolve_class(tree, module, cls_name)
        if found is None:
            return False, f"no class {cls_name} in {module}" if tree.module(module) else f"no module {module}"
        node = _members(tree, *found).get(member)
        if node is None:
            return False, f"{found[0]}:{cls_name} has no {member}"
        problem = _params_ok(node, params.rstrip(")")) if params else None
        return (False, f"{found[0]}:{cls_name}.{member}: {problem}") if problem else (True, found[0])
    if kind == "place":
        attr, candidates = vllm_versions.ATTRIBUTE[target], vllm_versions.TABLE[target]
        own = vllm_versions.release(tree.version)
        modules = candidates[own] if own in candidates else vllm_versions.modules(target, tree.version)
        for module in modules:
            if tree.module(module) is not None and _binding(tree, module, attr):
                return True, f"{module}:{attr} (vllm_versions.TABLE[{target!r}][{own!r}])"
        return False, (f"{attr} in none of {', '.join(modules)}" + ("" if own in candidates else
                       f" (release {own} is not in vllm_versions.TABLE)"))
    if kind == "env":
        envs = tree.module("vllm.envs")
        keys = {getattr(k, "value", None) for n in (envs.body if envs else []) if isinstance(n, (ast.Assign,
                ast.AnnAssign)) and getattr(getattr(n, "target", None) or n.targets[0], "id", "") ==
                "environment_variables" and isinstance(n.value, ast.Dict) for k in n.value.keys}
        return (True, "vllm/envs.py") if target in keys else (False, "not in vllm.envs.environment_variables")
    if kind == "flag":
        field = target.removeprefix("--").replace("-", "_")
        serve = next((m for m in vllm_versions.modules("serve_parser", tree.version) if tree.module(m)), None)
        for module, cls in (("vllm.engine.arg_utils", "EngineArgs"), (serve, "FrontendArgs")):
            found = _resolve_class(tree, module, cls) if module else None
            if found and field in _members(tree, *found):
                return True, f"{module}:{cls}.{field}"
        return False, f"no field {field} in EngineArgs or the serve parser's FrontendArgs"
    if kind == "route":
        method, _, path = target.partition(" ")
        path, _, params = path.partition("(")
        for rel, node in _routes(tree).get((method.lower(), path), []):
            names = {a.arg for a in node.args.args + node.args.kwonlyargs}
            if all(p.strip() in names for p in params.rstrip(")").split(",") if p.strip()):
                return True, f"{rel}:{node.name}"
        return False, f"no {method} {path} route" + (f" taking {params.rstrip(')')}" if params else "")
    if kind == "text":
        module, _, text = target.partition(":")
        found = tree.module(module)
        ok = found is not None and text.strip('"') in {getattr(n, "value", None) for n in ast.walk(found)}
        return (True, tree.file_of(module)) if ok else (False, f"no string {text} in {module}")
    raise ValueError(f"unknown contract kind {kind!r}")


@cache
def open_tree(source: Path) -> Tree:
    """One Tree per source in a process: its parsed files are kept for the next check."""
    return Tree(source)
