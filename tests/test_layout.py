"""The code's layout rules that a reader relies on, checked over the package's source.

- Every statement on ``Job``, ``Lease`` and ``Attempt`` rows is written in the run machinery (``_runs/``) or the
  SQL home (``_sql/``): no manager of those models, no table name of theirs, anywhere else.
- A queue row's states are defined once, in ``_queuestate.py``: no other module spells a state's condition.
- The package's modules import each other without a circle: every import counts, inside a function and under
  ``TYPE_CHECKING`` too, since a reader follows those as well.
"""

import ast
import re
from pathlib import Path

import fabrika_django

PACKAGE = Path(fabrika_django.__file__).parent

_JOB_STATE_SQL = re.compile(
    r"\b(Job|Lease|Attempt|Overview)\.(objects|_default_manager|_base_manager)\b"
    r"|\b(Job|Lease|Attempt)\._meta\.db_table\b"
    r"|\bfabrika_django_(job|lease|attempt)\b"
)
_QUEUE_STATE_PREDICATE = re.compile(
    r"\b(attempts|due)__(lt|lte|gt|gte|isnull)\b"
    r"|\battempts\b[^\n]*(<|>=)[^\n]*max_attempts|\battempts\}?\s*(<|>=)\s"
    r"|\bIS (NOT )?NULL\b[^\n]*\b(due|attempts)\b|\b(due|attempts)\b[^\n]*\bIS (NOT )?NULL\b"
    r"|\bdue\b\s*(<=|<)\s*(now|%s)"
)


def _sources(*allowed: str) -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        homes = ("migrations/", *(home for home in allowed if home.endswith("/")))
        if relative in allowed or relative.startswith(homes):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found.append((relative, number, line))
    return found


def _hits(pattern: re.Pattern[str], *allowed: str) -> list[str]:
    return [f"{path}:{number}: {line.strip()}" for path, number, line in _sources(*allowed) if pattern.search(line)]


def test_job_lease_and_attempt_rows_are_read_and_written_only_in_the_job_state_module():
    assert _hits(_JOB_STATE_SQL, "_runs/", "_sql/") == []


def test_a_queue_rows_state_is_defined_only_in_its_one_home():
    assert _hits(_QUEUE_STATE_PREDICATE, "_queuestate.py") == []


_LEASE_SETTING = re.compile(r"\bLEASE_SECONDS\b")


def test_how_long_a_lease_lasts_is_one_rule():
    """Grants, renewals and the bounds on a frozen or cut-off holder all count in ``_lease_time.lease_seconds``;
    only the settings' defaults and their check name the setting."""
    assert _hits(_LEASE_SETTING, "_lease_time.py", "conf.py", "checks/_settings.py") == []


def test_the_checks_find_what_they_look_for():
    # A check that cannot fail is a defect: each pattern matches what it forbids.
    assert _LEASE_SETTING.search("lease = max(1.0, float(settings.LEASE_SECONDS))")
    assert not _LEASE_SETTING.search("lease_seconds(job)")
    assert _JOB_STATE_SQL.search("Lease.objects.filter(job=name).update(token=None)")
    assert _JOB_STATE_SQL.search("table = quote(Attempt._meta.db_table)")
    assert _JOB_STATE_SQL.search('"UPDATE fabrika_django_job SET pending_since = NULL"')
    assert _QUEUE_STATE_PREDICATE.search("Q(due__isnull=False, attempts__lt=limit)")
    assert _QUEUE_STATE_PREDICATE.search('f"COUNT(CASE WHEN {attempts} >= %s THEN 1 END)"')
    assert _QUEUE_STATE_PREDICATE.search('"WHERE due IS NOT NULL"')
    assert _QUEUE_STATE_PREDICATE.search("row.attempts >= max_attempts_of(type(row))")
    assert _QUEUE_STATE_PREDICATE.search("row.due <= now")


# -- one home for SQL, modules of a readable size, caches that a settings change resets ------------------------

#: A statement starts with one of these words in capitals and goes on (a lone keyword, as the write guard's word
#: lists hold, is not a statement).
_SQL_VERB = re.compile(
    r"^\s*\(?\s*(SELECT|UPDATE|INSERT|DELETE|WITH|BEGIN|LISTEN|UNLISTEN|NOTIFY|PREPARE|EXECUTE|DEALLOCATE|SET|SHOW"
    r"|LOCK|KILL|VACUUM|ANALYZE|CREATE|DROP|ALTER|COMMIT|ROLLBACK|SAVEPOINT)\b\s+\S"
)
_SELECT_FROM = re.compile(r"\bSELECT\b.*\bFROM\b", re.S)
_SQL_HOME = "_sql/"
_MAX_LINES = 400


def _modules() -> list[tuple[str, str]]:
    """(path relative to the package, source) of every module of the package, migrations aside."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if not relative.startswith("migrations/"):
            found.append((relative, path.read_text()))
    return found


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _string_texts(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant and f-string outside docstrings; an f-string's values read as "x"."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    texts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(part) for part in node.values)
            text = "".join(part.value if isinstance(part, ast.Constant) else "x" for part in node.values)
            texts.append((node.lineno, text))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            texts.append((node.lineno, node.value))
    return texts


def _reads_as_sql(text: str) -> bool:
    return bool(_SQL_VERB.match(text) or _SELECT_FROM.search(text))


def _sql_outside_its_home() -> list[str]:
    found = []
    for relative, source in _modules():
        if relative.startswith(_SQL_HOME):
            continue
        for line, text in sorted(_string_texts(source)):
            if _reads_as_sql(text):
                found.append(f"{relative}:{line}: {text.strip().splitlines()[0][:70]}")
    return found


def test_hand_written_sql_lives_only_in_the_sql_home():
    """Every hand-written statement is a named function or constant of ``fabrika_django._sql`` (migrations aside).

    Counted as the reviewers count: a string constant or f-string, outside docstrings, that starts with an SQL
    verb in capitals and goes on, or holds both SELECT and FROM.
    """
    offenders = _sql_outside_its_home()
    assert not offenders, "\n".join(["hand-written SQL outside _sql/:", *offenders])


def test_no_module_is_over_the_limit():
    offenders = [
        f"{relative}: {len(source.splitlines())} lines"
        for relative, source in _modules()
        if len(source.splitlines()) > _MAX_LINES
    ]
    assert not offenders, "\n".join([f"modules over {_MAX_LINES} lines:", *offenders])


#: A module-level cache, as the convention below forbids it: a functools cache, or a name bound at module level to
#: an empty dict (literal, ``dict()``, ``defaultdict``, a weak dictionary).
#: The import of the helpers that make a cache with its reset.
_HELPERS = re.compile(r"^from (\.+|fabrika_django\.)_sql import [^\n]*\bcache\b", re.M)
#: Module-level dicts that are registries, not caches: filled at start-up and made again where settings change.
_REGISTRIES = {
    # The tasks' backends register their queues' claims when they are made (again after a settings change).
    "_running.py": "CLAIMS_AT_START",
    # The sweep's last report, handed from its job's run to ``fabrika_job sweep-files`` in the same process.
    "ops/_sweep_job.py": "_last_reports",
    # The tasks a fabrika backend validated, by path: made once, when their modules are imported, never again.
    "_task_paths.py": "_REGISTERED",
}
_EMPTY_DICT_CALLS = {"dict", "defaultdict", "WeakKeyDictionary", "WeakValueDictionary", "OrderedDict"}


def _name_of(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        return _name_of(node.func)
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _is_the_helper(func: ast.AST, relative: str, source: str) -> bool:
    """Whether a cache decorator is ``_sql.cache`` (by attribute, or by name imported from the SQL home)."""
    if isinstance(func, ast.Attribute):
        return _name_of(func.value) == "_sql"
    helpers = _HELPERS.search(source) or (relative.startswith(_SQL_HOME) and "from . import cache" in source)
    return isinstance(func, ast.Name) and func.id == "cache" and bool(helpers)


def _caches_without_a_reset(relative: str, source: str) -> list[str]:
    tree = ast.parse(source)
    found = set()
    for node in ast.walk(tree):
        candidates = [node.func] if isinstance(node, ast.Call) else []
        candidates += [d for d in getattr(node, "decorator_list", []) if isinstance(d, ast.Name | ast.Attribute)]
        for func in candidates:
            named = isinstance(func, ast.Name | ast.Attribute) and _name_of(func) in {"lru_cache", "cache"}
            if named and relative != "_sql/__init__.py" and not _is_the_helper(func, relative, source):
                found.add(f"{relative}:{func.lineno}: functools {_name_of(func)}")
    for statement in tree.body:
        value = statement.value if isinstance(statement, ast.Assign | ast.AnnAssign) else None
        empty = (isinstance(value, ast.Dict) and not value.keys) or (
            isinstance(value, ast.Call) and _name_of(value) in _EMPTY_DICT_CALLS and not value.keywords
        )
        targets = statement.targets if isinstance(statement, ast.Assign) else [getattr(statement, "target", None)]
        registry = any(_name_of(target) == _REGISTRIES.get(relative) for target in targets if target is not None)
        if empty and relative != "_sql/__init__.py" and not registry:
            found.add(f"{relative}:{statement.lineno}: a module-level dict")
    return sorted(found)


def test_every_module_level_cache_resets_on_setting_changed():
    """The convention: a module-level cache is made with ``fabrika_django._sql.cache`` (a decorator, in place of
    ``functools.lru_cache``) or ``fabrika_django._sql.cache_dict()`` (a dict); both register their reset on
    Django's ``setting_changed``. Any other module-level cache (a functools cache, a module-level empty dict, a
    weak dictionary) is refused here; one that must not reset takes the helper anyway (a reset only costs a
    rebuild)."""
    offenders = [hit for relative, source in _modules() for hit in _caches_without_a_reset(relative, source)]
    assert not offenders, "\n".join(["module-level caches without a reset on setting_changed:", *offenders])


def test_the_sql_home_s_caches_are_emptied_by_a_settings_change():
    from django.test import override_settings

    from fabrika_django._sql import cache, cache_dict

    calls = []

    @cache()
    def built(key):
        calls.append(key)
        return key

    kept = cache_dict()
    kept["statement"] = "built once"
    built("a"), built("a")
    assert calls == ["a"]
    with override_settings(FABRIKA={"LEASE_SECONDS": 30}):
        assert kept == {}
        built("a")
    assert calls == ["a", "a"]


_CONTEXT_PRIVATE = re.compile(r"\b(ctx|context|self\._ctx)\._[a-z]\w*")


def test_no_module_reads_the_job_context_s_private_attributes():
    """What the framework's own code needs of an attempt is on its ``AttemptState`` (``_running``), not read
    out of the ``JobContext``'s private attributes, which stay the context's own."""
    offenders = _hits(_CONTEXT_PRIVATE, "context.py")
    assert not offenders, "\n".join(["private attributes of the JobContext read outside context.py:", *offenders])


def test_the_modules_import_each_other_without_a_circle():
    circles = [sorted(circle) for circle in _circles(_import_graph(_modules())) if len(circle) > 1]
    assert not circles, "\n".join(["modules that import each other in a circle:", *map(", ".join, circles)])


def _module_name(relative: str) -> str:
    name = relative.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__") if name != "__init__" else ""


def _import_graph(modules: list[tuple[str, str]]) -> dict[str, set[str]]:
    """Each module's name inside the package, and the package's modules it imports."""
    imports = {_module_name(relative): _imported(relative, source) for relative, source in modules}
    return {name: {_module_of(target, imports) for target in targets} for name, targets in imports.items()}


def _module_of(name: str, modules: dict[str, set[str]]) -> str:
    """The module that ``name`` (a module, or a name defined in one) stands in: its longest prefix that is one."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def _imported(relative: str, source: str) -> set[str]:
    """The package's modules that ``relative`` imports anywhere in it, by dotted name inside the package."""
    here = _module_name(relative).split(".") if relative != "__init__.py" else []
    package = here if relative.endswith("__init__.py") else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            stem = [*base, *(node.module.split(".") if node.module else [])]
            found.update(".".join([*stem, alias.name]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found.update(name.removeprefix("fabrika_django.") for name in names if name.startswith("fabrika_django."))
    return found


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected parts of ``graph`` (Tarjan's algorithm), names not in the graph left out."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    parts: list[set[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in graph[name]:
            if target not in graph or target == name:
                continue
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            part = set()
            while (top := stack.pop()) != name:
                part.add(top)
            parts.append({*part, name})

    for name in graph:
        if name not in index:
            visit(name)
    return parts


def test_the_layout_checks_find_what_they_look_for():
    # A check that cannot fail is a defect: each rule finds what it forbids, and lets pass what it allows.
    assert _reads_as_sql("SELECT 1")
    assert _reads_as_sql("UPDATE t SET a = 1")
    assert _reads_as_sql("count(*) AS n, (SELECT 1 FROM y) AS z")  # a piece holding SELECT and FROM
    assert _reads_as_sql("  (WITH a AS (SELECT 1) SELECT * FROM a)")
    assert not _reads_as_sql("SELECT")  # a lone keyword (the write guard's word lists)
    assert not _reads_as_sql("Select the rows")
    assert _string_texts('x = f"DELETE FROM {table} WHERE id = %s"') == [(1, "DELETE FROM x WHERE id = %s")]
    assert _string_texts('def f():\n    """SELECT a FROM b, in a docstring."""\n') == []
    source = (
        "import functools\nfrom weakref import WeakKeyDictionary\n_A = {}\n_B: dict = dict()\n"
        "_C = WeakKeyDictionary()\n_D = {'kept': 1}\n@functools.lru_cache(maxsize=2)\ndef f(): pass\n"
    )
    assert len(_caches_without_a_reset("x.py", source)) == 4
    assert _caches_without_a_reset("_running.py", "CLAIMS_AT_START = {}\n_OTHER = {}\n") == [
        "_running.py:2: a module-level dict"
    ]
    allowed = "from ._sql import cache, cache_dict\n_A = cache_dict()\n@cache(maxsize=2)\ndef f(): pass\n"
    assert _caches_without_a_reset("x.py", allowed) == []
    # An import inside a function or under TYPE_CHECKING ties two modules as much as one at the top.
    knot = [
        ("a.py", "from .b import x\n"),
        ("b.py", "def f():\n    from .c import y\n"),
        ("c.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"),
        ("d.py", "from .a import x\n"),
    ]
    assert [sorted(part) for part in _circles(_import_graph(knot)) if len(part) > 1] == [["a", "b", "c"]]
    assert all(len(part) == 1 for part in _circles(_import_graph(knot[1:])))  # without a.py, no circle
    imported = _imported("_runs/claim.py", "from ..models._tables import Job\nfrom .. import _digest\n")
    assert {_module_of(name, {"models": set(), "models._tables": set(), "_digest": set()}) for name in imported} == {
        "models._tables",
        "_digest",
    }
    assert _CONTEXT_PRIVATE.search("ctx._fence.check()") and _CONTEXT_PRIVATE.search("run.context._demand")
    assert not _CONTEXT_PRIVATE.search("ctx.signal.throw_if_aborted()")


#: A citation of a document that is not in the repository: the design notes' sections, the issue tracker.
_OUTSIDE_DOCUMENT = re.compile(r"\bDESIGN(\.md)?\s*§|\bDESIGN\.md\b|\bSTYLE\.md\b|\bissue #?\d+\b", re.I)


def test_no_code_cites_a_document_outside_the_repository():
    """Comments and docstrings say the rule itself, not "DESIGN §N" or "issue N", which a reader cannot open."""
    root = PACKAGE.parent
    offenders = []
    for folder in ("fabrika_django", "tests", "testproject", "bench", "tests_upstream", "bin"):
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in {".py", ""} or not path.is_file() or path == Path(__file__):
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if _OUTSIDE_DOCUMENT.search(line):
                    offenders.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(["citations of documents outside the repository:", *offenders])
    assert _OUTSIDE_DOCUMENT.search("Lanes (DESIGN §11)") and _OUTSIDE_DOCUMENT.search("Targets (issue 14)")
    assert not _OUTSIDE_DOCUMENT.search("the design of the fence") and not _OUTSIDE_DOCUMENT.search("tissue 3")


#: Where an outcome's code may be written as a string: its home (``models.Outcome``) and the error codes the
#: outcomes are made of, which sit below the models (the errors, mail's and ``ctx.fetch``'s codes, the abort
#: signal's reasons), and the test kit, imported before Django's apps are ready.
_OUTCOME_LITERALS_ALLOWED = ("models/_tables.py", "exceptions.py", "mail/", "egress.py", "_signal.py", "testing.py")


def _outcome_literals(relative: str, source: str, codes: set[str]) -> list[str]:
    """String constants equal to an outcome's code where code reads them as one: compared, returned, passed,
    or as a key or member of a dict, set, tuple or list (a label, a dict's value, a docstring is no outcome)."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        places: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            places = [node.left, *node.comparators]
        elif isinstance(node, ast.Return) and node.value is not None:
            places = [node.value]
        elif isinstance(node, ast.Call):
            places = [*node.args, *(keyword.value for keyword in node.keywords)]
        elif isinstance(node, ast.Dict):
            places = [key for key in node.keys if key is not None]
        for place in places:
            members = place.elts if isinstance(place, ast.Tuple | ast.Set | ast.List) else [place]
            for member in members:
                if isinstance(member, ast.Constant) and member.value in codes:
                    found.append(f"{relative}:{member.lineno}: {member.value!r}")
    return found


def test_outcomes_are_written_as_the_outcome_choices_not_as_strings():
    from fabrika_django.models import Outcome

    # "running" is also a column's and a task status's word.
    codes = set(Outcome.values) - {Outcome.RUNNING}
    offenders = [
        hit
        for relative, source in _modules()
        if not relative.startswith(_OUTCOME_LITERALS_ALLOWED)
        for hit in _outcome_literals(relative, source, codes)
    ]
    assert not offenders, "\n".join(["outcome codes written as strings (use models.Outcome):", *offenders])
    sample = 'def f(o):\n    """succeeded"""\n    x = {"a": "succeeded"}\n    return o in ("succeeded", "b")\n'
    assert _outcome_literals("x.py", sample, {"succeeded"}) == ["x.py:4: 'succeeded'"]
    assert _outcome_literals("x.py", 'abort("lease_lost")\n', {"lease_lost"}) == ["x.py:1: 'lease_lost'"]


#: Private names a module still imports from another, each with why; a new one fails the test below.
_PRIVATE_IMPORTS_KNOWN = {
    # The migrations name the outcome field's choices by this function, through the package.
    "models/__init__.py": {"_outcome_choices"},
    # django-stubs' type of a statement's parameter, which Django's own cursor takes (a type only), named once.
    "_sql/__init__.py": {"_SQLType"},
    # sqlparse's type of a token's kind, which its lexer answers (a type only).
    "guards.py": {"_TokenType"},
}


def _private_imports(source: str) -> set[str]:
    """Names with a leading underscore imported by name from another module (a private module itself aside)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            names |= {alias.name for alias in node.names if alias.name.startswith("_") and alias.name[1:2] != "_"}
    return names


def test_no_module_imports_another_modules_private_names():
    """A private name stays its module's: a module imports another's public names (a private *module* is the
    package's own, and its public names are for the package)."""
    modules = {relative.removesuffix(".py").replace("/", ".").removesuffix(".__init__") for relative, _ in _modules()}
    offenders = []
    for relative, source in _modules():
        names = _private_imports(source) - {name.rsplit(".", 1)[-1] for name in modules}
        unexpected = names - _PRIVATE_IMPORTS_KNOWN.get(relative, set())
        offenders += [f"{relative}: {name}" for name in sorted(unexpected)]
    assert not offenders, "\n".join(["private names imported from another module:", *offenders])
    assert _private_imports("from .a import _b, c\nfrom . import _mod\n") == {"_b", "_mod"}
