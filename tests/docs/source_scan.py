"""What the source says about events and drop reasons, read with `ast` (nothing is run or imported).

Theory of operation: the event kinds are declared (`federation.protocol.events.ALL`), but the fields of
an event are only the keyword arguments of the calls that make it, and most drop reasons are string
literals at the place that counts them. So the docs tests read them from the source: a small resolver
follows a name to the literals it can hold (a module constant, an assignment in the same function, the
arguments every caller passes for a parameter, what a called function returns, both arms of a
conditional, an f-string's parts). It understands only these shapes; a value it cannot follow (an
attribute such as `error.reason`) resolves to nothing, so the tests combine it with the registries the
code does declare (`events.ALL`, the envelope's reason tuples). A declared registry of every drop reason
would make the drop half of this unnecessary.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EVENTS_MODULE = "federation.protocol.events"
WRAPPER_EVENTS_MODULE = "federation.daemon.wrapper_events"
"""the kinds only a wrapper makes (its broker connection)"""

Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class Module:
    """One parsed source file, with the names the resolver looks up in it."""

    name: str
    path: Path
    tree: ast.Module
    constants: dict[str, str] = field(default_factory=dict)
    """module-level NAME = "text" """
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)
    """local name -> (module, name) for `from module import name`"""
    aliases: dict[str, str] = field(default_factory=dict)
    """local name -> module for `from package import module` and `import module as alias`"""
    function_of: dict[int, Function | None] = field(default_factory=dict)
    """id(node) -> the innermost function around it"""


@dataclass(frozen=True)
class EmitSite:
    """One place that makes an event: its kind, the fields it always gives, and those it may add."""

    kind: str
    fields: frozenset[str]
    optional: frozenset[str]
    closed: bool
    """False when some fields come from an expression the scanner cannot follow (`**something`)"""
    where: str


class Source:
    """The modules under some folders of the repository, parsed, with a resolver over them."""

    def __init__(self, folders: Iterable[str]) -> None:
        self.modules: dict[str, Module] = {}
        for folder in folders:
            for path in sorted((ROOT / folder).rglob("*.py")):
                name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                self.modules[name] = self._load(name, path)
        self.functions: dict[str, list[tuple[Module, Function]]] = {}
        for module in self.modules.values():
            for node in ast.walk(module.tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    self.functions.setdefault(node.name, []).append((module, node))

    @staticmethod
    def _load(name: str, path: Path) -> Module:
        module = Module(name, path, ast.parse(path.read_text(encoding="utf-8"), str(path)))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for statement in module.tree.body:
            if isinstance(statement, ast.Assign | ast.AnnAssign) and isinstance(statement.value, ast.Constant) \
                    and isinstance(statement.value.value, str):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        module.constants[target.id] = statement.value.value
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + [base]).strip(".")
                for item in node.names:
                    local = item.asname or item.name
                    module.imported[local] = (base, item.name)
                    module.aliases[local] = f"{base}.{item.name}"
            elif isinstance(node, ast.Import):
                for item in node.names:
                    if item.asname:
                        module.aliases[item.asname] = item.name

        def visit(node: ast.AST, function: Function | None) -> None:
            module.function_of[id(node)] = function
            inner = node if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else function
            for child in ast.iter_child_nodes(node):
                visit(child, inner)

        visit(module.tree, None)
        return module

    # ------------------------------------------------------------------ walking

    def calls(self) -> Iterator[tuple[Module, ast.Call]]:
        for module in self.modules.values():
            for node in ast.walk(module.tree):
                if isinstance(node, ast.Call):
                    yield module, node

    def _defined_count(self, name: str) -> int:
        """How many functions or methods named `name` the scanned modules define (a part's base class may live
        in another module than the subclass that calls its methods through `self`)."""
        return sum(1 for module in self.modules.values() for node in ast.walk(module.tree)
                   if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name)

    @staticmethod
    def callee(call: ast.Call) -> str | None:
        if isinstance(call.func, ast.Name):
            return call.func.id
        if isinstance(call.func, ast.Attribute):
            return call.func.attr
        return None

    @staticmethod
    def where(module: Module, node: ast.AST) -> str:
        return f"{module.path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"

    # ------------------------------------------------------------------ constants

    def constant(self, module: Module, expr: ast.expr) -> tuple[str, str] | None:
        """(defining module, text) when `expr` names a module-level string constant, else None."""
        if isinstance(expr, ast.Name):
            if expr.id in module.constants:
                return module.name, module.constants[expr.id]
            if expr.id in module.imported:
                origin, name = module.imported[expr.id]
                source = self.modules.get(origin)
                if source is not None and name in source.constants:
                    return origin, source.constants[name]
        elif isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            aliased = module.aliases.get(expr.value.id)
            holder = self.modules.get(aliased) if aliased else None
            if holder is not None and expr.attr in holder.constants:
                return holder.name, holder.constants[expr.attr]
        return None

    # ------------------------------------------------------------------ the resolver

    def strings(self, module: Module, expr: ast.expr | None, seen: frozenset[int] = frozenset()) -> set[str]:
        """Every string literal `expr` can evaluate to, as far as the shapes in the module docstring go."""
        if expr is None or id(expr) in seen:
            return set()
        seen = seen | {id(expr)}
        if isinstance(expr, ast.Constant):
            return {expr.value} if isinstance(expr.value, str) else set()
        named = self.constant(module, expr)
        if named is not None:
            return {named[1]}
        if isinstance(expr, ast.IfExp):
            return self.strings(module, expr.body, seen) | self.strings(module, expr.orelse, seen)
        if isinstance(expr, ast.BoolOp):
            return set().union(*(self.strings(module, value, seen) for value in expr.values))
        if isinstance(expr, ast.JoinedStr):
            texts = {""}
            for part in expr.values:
                if isinstance(part, ast.Constant):
                    options = {str(part.value)}
                elif isinstance(part, ast.FormattedValue) and part.format_spec is None and part.conversion == -1:
                    options = self.strings(module, part.value, seen)
                else:
                    options = set()
                texts = {text + option for text in texts for option in options}
            return texts
        if isinstance(expr, ast.Call):
            return self._returned(module, expr, seen)
        if isinstance(expr, ast.Name):
            function = module.function_of.get(id(expr))
            if function is not None:
                return self._local(module, function, expr.id, seen)
        return set()

    def _local(self, module: Module, function: Function, name: str, seen: frozenset[int]) -> set[str]:
        """A name inside a function: a parameter (what callers pass) or a local (what is assigned to it)."""
        arguments = function.args
        positional = [*arguments.posonlyargs, *arguments.args]
        names = [argument.arg for argument in positional] + [argument.arg for argument in arguments.kwonlyargs]
        if name in names:
            return self._passed(module, function, name, seen)
        found: set[str] = set()
        for node in ast.walk(function):
            if isinstance(node, ast.Assign):
                targets: list[ast.expr] = node.targets
            elif isinstance(node, ast.AnnAssign | ast.NamedExpr):
                targets = [node.target]
            else:
                continue
            if any(isinstance(target, ast.Name) and target.id == name for target in targets):
                found |= self.strings(module, node.value, seen)
        return found

    def _passed(self, module: Module, function: Function, name: str, seen: frozenset[int]) -> set[str]:
        """What the callers of `function` pass for its parameter `name` (or its default)."""
        arguments = function.args
        positional = [argument.arg for argument in [*arguments.posonlyargs, *arguments.args]]
        is_method = bool(positional) and positional[0] in ("self", "cls")
        index = positional.index(name) - is_method if name in positional else None
        found: set[str] = set()
        for caller, call in self.calls():
            if self.callee(call) != function.name:
                continue
            via_self = isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) \
                and call.func.value.id == "self"
            if via_self and caller is not module and self._defined_count(function.name) > 1:
                continue  # self.f() reaches the f of its own class: another module's only if f is defined once
            keyword = next((k.value for k in call.keywords if k.arg == name), None)
            if keyword is not None:
                found |= self.strings(caller, keyword, seen)
            elif index is not None and index < len(call.args) \
                    and not any(isinstance(a, ast.Starred) for a in call.args[:index + 1]):
                found |= self.strings(caller, call.args[index], seen)
            else:
                found |= self.strings(module, self._default(function, name), seen)
        return found

    @staticmethod
    def _default(function: Function, name: str) -> ast.expr | None:
        arguments = function.args
        positional = [*arguments.posonlyargs, *arguments.args]
        defaults: list[ast.expr | None] = [None] * (len(positional) - len(arguments.defaults))
        defaults += arguments.defaults
        pairs = list(zip(positional, defaults, strict=True)) + list(zip(arguments.kwonlyargs, arguments.kw_defaults,
                                                                      strict=True))
        return next((default for argument, default in pairs if argument.arg == name), None)

    def _definitions(self, module: Module, call: ast.Call) -> list[tuple[Module, Function]]:
        name = self.callee(call)
        via_self = isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) \
            and call.func.value.id == "self"
        return [(m, f) for m, f in self.functions.get(name or "", []) if not via_self or m is module]

    def _returned(self, module: Module, call: ast.Call, seen: frozenset[int]) -> set[str]:
        found: set[str] = set()
        for defining, function in self._definitions(module, call):
            for node in ast.walk(function):
                if isinstance(node, ast.Return) and defining.function_of.get(id(node)) is function:
                    found |= self.strings(defining, node.value, seen)
        return found

    # ------------------------------------------------------------------ events

    def _dict_keys(self, module: Module, expr: ast.expr, site: ast.Call) -> tuple[set[str], set[str], bool]:
        """(keys always there, keys added later, closed) of a dict given to an event."""
        if isinstance(expr, ast.Dict):
            keys = {k.value for k in expr.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            return keys, set(), all(isinstance(k, ast.Constant) for k in expr.keys)
        if isinstance(expr, ast.Call):
            always: set[str] | None = None
            for defining, function in self._definitions(module, expr):
                for node in ast.walk(function):
                    if isinstance(node, ast.Return) and isinstance(node.value, ast.Dict) \
                            and defining.function_of.get(id(node)) is function:
                        keys, _, closed = self._dict_keys(defining, node.value, site)
                        if not closed:
                            return set(), set(), False
                        always = keys if always is None else always & keys
            return (always, set(), True) if always is not None else (set(), set(), False)
        if isinstance(expr, ast.Name):
            around = module.function_of.get(id(site))
            if around is None:
                return set(), set(), False
            given: set[str] = set()
            later: set[str] = set()
            closed, assigned = True, False
            for node in ast.walk(around):
                if not isinstance(node, ast.Assign | ast.AnnAssign):
                    continue
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name) and target.id == expr.id and node.value is not None:
                        keys, _, dict_closed = self._dict_keys(module, node.value, site)
                        given, closed, assigned = given | keys, closed and dict_closed, True
                    elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
                            and target.value.id == expr.id:
                        key = target.slice
                        if isinstance(key, ast.Constant) and isinstance(key.value, str):
                            later.add(key.value)
                        else:
                            closed = False
            return given, later, closed and assigned
        return set(), set(), False

    def event_sites(self, kinds: Iterable[str], declared_in: str = EVENTS_MODULE) -> list[EmitSite]:
        """Every call that makes an event of `kinds`: a positional argument names a constant of `declared_in`, or
        the keyword `event=` does (`Outbox.drop(reason, event=events.X, now=now, **fields)`)."""
        known = set(kinds)
        sites: list[EmitSite] = []
        for module, call in self.calls():
            keyword_event = next((k.value for k in call.keywords if k.arg == "event"), None)
            named = self.constant(module, keyword_event) if keyword_event is not None else None
            if named is not None and named[0] == declared_in and named[1] in known:
                fields = {k.arg for k in call.keywords if k.arg not in (None, "event", "now")}
                sites.append(EmitSite(named[1], frozenset(fields), frozenset(), True, self.where(module, call)))
                continue
            for position, argument in enumerate(call.args):
                named = self.constant(module, argument)
                if named is None or named[0] != declared_in or named[1] not in known:
                    continue
                fields = {k.arg for k in call.keywords if k.arg is not None}
                optional: set[str] = set()
                closed = True
                spread = [k.value for k in call.keywords if k.arg is None]  # emit(kind, now, **fields)
                after = [a for a in call.args[position + 1:] if isinstance(a, ast.Dict | ast.Name)]  # Event(.., fields)
                for expr in spread + after:
                    keys, later, map_closed = self._dict_keys(module, expr, call)
                    if expr in after and not (keys or later or map_closed):
                        continue  # a positional name that is no field map (the time)
                    fields |= keys
                    optional |= later - keys
                    closed = closed and map_closed
                sites.append(EmitSite(named[1], frozenset(fields), frozenset(optional), closed,
                                      self.where(module, call)))
                break
        return sites

    def event_values(self, kind: str, name: str) -> set[str]:
        """Every string the field `name` of events of `kind` can hold, as far as the resolver follows."""
        found: set[str] = set()
        for module, call in self.calls():
            position = next((i for i, a in enumerate(call.args) if self.constant(module, a) == (EVENTS_MODULE, kind)),
                            None)
            keyword_event = next((k.value for k in call.keywords if k.arg == "event"), None)
            if position is None and keyword_event is not None \
                    and self.constant(module, keyword_event) == (EVENTS_MODULE, kind):
                for keyword in call.keywords:  # Outbox.drop(reason, event=events.X, now=now, **fields)
                    if keyword.arg == name:
                        found |= self.strings(module, keyword.value)
                continue
            if position is None:
                continue
            for keyword in call.keywords:
                if keyword.arg == name:
                    found |= self.strings(module, keyword.value)
            maps = [k.value for k in call.keywords if k.arg is None] + list(call.args[position + 1:])
            function = module.function_of.get(id(call))
            for expr in maps:
                dicts = [expr] if isinstance(expr, ast.Dict) else []
                if isinstance(expr, ast.Name) and function is not None:
                    dicts += [node.value for node in ast.walk(function) if isinstance(node, ast.Assign | ast.AnnAssign)
                              and isinstance(node.value, ast.Dict)
                              and any(isinstance(t, ast.Name) and t.id == expr.id
                                      for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))]
                for mapping in dicts:
                    assert isinstance(mapping, ast.Dict)
                    for key, value in zip(mapping.keys, mapping.values, strict=True):
                        if isinstance(key, ast.Constant) and key.value == name:
                            found |= self.strings(module, value)
        return found

    def record_sites(self, prefix: str) -> list[EmitSite]:
        """Calls that write a runner's own record: `event("<prefix>...", node_name, **fields)`."""
        sites = []
        for module, call in self.calls():
            if len(call.args) < 2 or not isinstance(call.args[0], ast.Constant):
                continue
            kind = call.args[0].value
            if not (isinstance(kind, str) and kind.startswith(prefix) and kind.replace("_", "").isalpha()):
                continue
            fields = frozenset(k.arg for k in call.keywords if k.arg is not None)
            closed = all(k.arg is not None for k in call.keywords) and len(call.args) == 2
            sites.append(EmitSite(kind, fields, frozenset(), closed, self.where(module, call)))
        return sites

    # ------------------------------------------------------------------ drop reasons

    def first_arguments(self, callee: str) -> set[str]:
        """The strings passed first to every call of a function or class named `callee`."""
        return {text for module, call in self.calls() if self.callee(call) == callee and call.args
                for text in self.strings(module, call.args[0])}

    def drop_reasons(self) -> dict[str, list[str]]:
        """Reason -> where it is counted: `<x>.drops[reason]`, `<outbox or node>.drop(reason, ...)`,
        `DecodeError(reason, ...)` (the node counts a decoding error under its reason). The store inside a
        `drop` method is the sink every caller goes through: its reasons are its callers' first arguments."""
        found: dict[str, list[str]] = {}
        for module in self.modules.values():
            for node in ast.walk(module.tree):
                reason: ast.expr | None = None
                if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                        and node.value.attr == "drops" and isinstance(node.ctx, ast.Store):
                    function = module.function_of.get(id(node))
                    if function is None or function.name != "drop":
                        reason = node.slice
                elif isinstance(node, ast.Call) and self.callee(node) in ("drop", "DecodeError") and node.args:
                    reason = node.args[0]
                if reason is not None:
                    for text in self.strings(module, reason):
                        found.setdefault(text, []).append(self.where(module, node))
        return found
