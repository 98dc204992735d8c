"""Rules of the library's source that a reviewer would otherwise check by grep.

No failure is swallowed: every `except:`, `except Exception` and `except BaseException` in
src/glassllm either re-raises (`raise`, or raise of another, clearer exception) or reports
what happened (a warning, a message through a callback, a print), as the project's guide asks
("real bad input gets a clear error, nothing is lost").
"""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "glassllm"
BROAD = {"Exception", "BaseException"}
REPORTS = {"warn", "print", "on_failure"}  # warnings.warn(...), print(...), a callback
# A worker thread cannot raise into its caller: it hands the exception over with this call,
# and the caller re-raises it (glassllm.engine.parallel).
HANDS_OVER = {"keep_for_caller"}


def broad(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type
    if kinds is None:
        return True
    names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
    return any(isinstance(n, ast.Name) and n.id in BROAD for n in names)


def reraises_or_reports(handler: ast.ExceptHandler) -> bool:
    for node in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in REPORTS or name in HANDS_OVER:
                return True
    return False


def kept_and_raised_later(handler: ast.ExceptHandler, function: ast.AST) -> bool:
    """`except ... as e: error = e` (or `error = error or e`) in a function that later does
    `raise error`: the exception is re-raised once the function is done waiting."""
    if handler.name is None:
        return False
    kept = {target.id for node in handler.body if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Name)
            and any(isinstance(n, ast.Name) and n.id == handler.name
                    for n in ast.walk(node.value))}
    return any(isinstance(node, ast.Raise) and isinstance(node.exc, ast.Name)
               and node.exc.id in kept for node in ast.walk(function))


def swallowing_handlers(source: str, filename: str) -> list[str]:
    tree = ast.parse(source)
    functions = [f for f in ast.walk(tree)
                 if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]

    def enclosing(handler):  # the innermost function holding the handler (or the module)
        holders = [f for f in functions if handler in ast.walk(f)]
        return min(holders, key=lambda f: len(list(ast.walk(f))), default=tree)

    return [f"{filename}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.ExceptHandler) and broad(node)
            and not reraises_or_reports(node)
            and not kept_and_raised_later(node, enclosing(node))]


def test_no_broad_except_swallows_an_error():
    files = sorted(SRC.glob("*.py"))
    assert len(files) > 10
    found = [where for path in files
             for where in swallowing_handlers(path.read_text(encoding="utf-8"), path.name)]
    assert found == [], f"broad except clauses that neither re-raise nor report: {found}"


def test_the_rule_sees_a_swallowed_error():
    swallowed = "try:\n    f()\nexcept Exception:\n    return None\n"
    bare = "try:\n    f()\nexcept:\n    pass\n"
    in_tuple = "try:\n    f()\nexcept (ValueError, BaseException) as e:\n    x = e\n"
    kept_not_raised = "try:\n    f()\nexcept Exception as e:\n    x = e\nraise y\n"
    for source in (swallowed, bare, in_tuple, kept_not_raised):
        assert swallowing_handlers(f"def g():\n{_indent(source)}", "x.py") == ["x.py:4"]
    fine = ["try:\n    f()\nexcept Exception:\n    cleanup()\n    raise\n",
            "try:\n    f()\nexcept Exception as e:\n    raise ValueError(str(e)) from None\n",
            "try:\n    f()\nexcept Exception as e:\n    warnings.warn(str(e))\n",
            "try:\n    f()\nexcept Exception as e:\n    x = e\nraise x\n",  # raised later
            "try:\n    f()\nexcept Exception as e:\n    keep_for_caller(e)\n",
            "try:\n    f()\nexcept ValueError:\n    pass\n"]  # a narrow clause may handle it
    for source in fine:
        assert swallowing_handlers(f"def g():\n{_indent(source)}", "x.py") == []


def _indent(text: str) -> str:
    return "".join("    " + line + "\n" for line in text.splitlines())
