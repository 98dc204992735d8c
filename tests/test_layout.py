"""The shape of the source: modules a person can read.

Each check has its own functions below (other modules may add their own checks here).
"""
import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "glassllm"


# ============================================================ the Trainer's modules
TRAINER_MODULES = ["training/trainer.py", "training/settings.py", "training/events.py",
                   "training/errors.py"]
TRAINER_MAX_LINES = 60
TRAINER_MAX_DEPTH = 5
_BLOCKS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try,
           ast.FunctionDef, ast.AsyncFunctionDef, ast.Match)
if hasattr(ast, "TryStar"):
    _BLOCKS += (ast.TryStar,)


def _trainer_function_length(fn: ast.FunctionDef) -> int:
    """Lines from `def` to the function's last line, its docstring left out."""
    lines = fn.end_lineno - fn.lineno + 1
    first = fn.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
            isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def _trainer_block_depth(node: ast.AST, depth: int = 0) -> int:
    """The deepest nesting of blocks at or under `node`, `node` itself counted when it is one.

    Blocks are if/for/while/with/try/def (and match): a function of straight-line code has
    depth 1 (its def), `def f(): for ...: if ...: x` has depth 3. An `elif` is written at its
    `if`'s level and counts as deep as that `if`. Classes, lambdas and comprehensions are not
    counted.
    """
    if isinstance(node, _BLOCKS):
        depth += 1
    deepest = depth
    for child in ast.iter_child_nodes(node):
        inner = depth
        if isinstance(node, ast.If) and isinstance(child, ast.If) and \
                node.orelse == [child] and child.col_offset == node.col_offset:
            inner -= 1  # `elif` (an `else:` holding an `if` is a level deeper)
        deepest = max(deepest, _trainer_block_depth(child, inner))
    return deepest


def _trainer_functions(path: Path):
    """(qualified name, length, depth) of every top-level function and method of `path`
    (a nested def is measured as part of the function that holds it)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        members = [(f"{node.name}.", n) for n in node.body] \
            if isinstance(node, ast.ClassDef) else [("", node)]
        for prefix, fn in members:
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield (prefix + fn.name, _trainer_function_length(fn),
                       _trainer_block_depth(fn))


@pytest.mark.parametrize("module", TRAINER_MODULES)
def test_trainer_functions_are_short_and_shallow(module):
    """No function of the Trainer's modules is over 60 lines (docstring not counted) or
    nested deeper than 5 blocks, the function's own def counted (rule: _trainer_block_depth;
    nanoGPT's training loop, with DDP, gradient accumulation and a GradScaler, is 4 deep)."""
    measured = list(_trainer_functions(SRC / module))
    if module == "training/trainer.py":  # the measure finds the methods
        assert {"Trainer.run", "Trainer._run", "Trainer._step"} <= {m[0] for m in measured}
    long = [(name, n) for name, n, _ in measured if n > TRAINER_MAX_LINES]
    deep = [(name, d) for name, _, d in measured if d > TRAINER_MAX_DEPTH]
    assert long == [], f"{module}: functions over {TRAINER_MAX_LINES} lines: {long}"
    assert deep == [], f"{module}: functions nested deeper than {TRAINER_MAX_DEPTH}: {deep}"


def test_trainer_layout_rule_measures_what_it_says():
    code = ("def flat():\n    return 1\n\n"
            "def three():\n    for i in x:\n        if i:\n            y = [j for j in i]\n\n"
            "def chain(a):\n    '''doc\n    two lines'''\n    if a:\n        pass\n"
            "    elif b:\n        pass\n    else:\n        if c:\n            pass\n\n"
            "def nested():\n    with a:\n        def inner():\n            try:\n"
            "                while b:\n                    pass\n            finally:\n"
            "                pass\n")
    tree = ast.parse(code)
    depth = {fn.name: _trainer_block_depth(fn) for fn in tree.body}
    length = {fn.name: _trainer_function_length(fn) for fn in tree.body}
    assert depth == {"flat": 1, "three": 3, "chain": 3, "nested": 5}
    assert length == {"flat": 2, "three": 4, "chain": 8, "nested": 8}


# ============================================================ model.py
# It reads like nanoGPT's: the layers come first, each forward fits on a screen, and a traced
# value is one `tap(...)` line, not an `if` block around the computation.
MODEL_FORWARDS = {"__call__", "forward"}


def _model_layout_problems(source: str) -> list[str]:
    """What keeps model.py from reading top-down: the first layer class (a Module subclass)
    past line 80, `if _trace` blocks, a __call__/forward over 12 lines."""
    tree = ast.parse(source)
    problems = []
    first = min((node.lineno for node in tree.body if isinstance(node, ast.ClassDef)
                 and "Module" in map(ast.unparse, node.bases)), default=None)
    if first is None or first > 80:
        problems.append(f"first layer class at line {first}, not within 80 lines of the top")
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "_trace" in ast.unparse(node.test):
            problems.append(f"line {node.lineno}: an `if _trace` block")
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for f in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            lines = _trainer_function_length(f)
            if f.name in MODEL_FORWARDS and lines > 12:  # docstring not counted
                problems.append(f"{cls.name}.{f.name}: {lines} lines (> 12)")
    return problems


def test_model_layers_come_first_and_forwards_are_short():
    assert _model_layout_problems((SRC / "model.py").read_text(encoding="utf-8")) == []


def test_model_layout_rule_sees_the_old_faults():
    """The old model.py's faults: Config and shape tables first, `if _trace` blocks, a
    19-line MLP.__call__."""
    long_forward = "    def __call__(self, x):\n" + "        x = x + 1\n" * 12 + \
        "        return x\n"
    bad = "class Config:\n    x: int = 1\n" + "X = 1\n" * 79 + "class MLP(Module):\n" + \
        long_forward + \
        "def f(x):\n    if _trace is not None:\n        x = _trace.tap('x', x)\n    return x\n"
    problems = _model_layout_problems(bad)
    assert problems == ["first layer class at line 82, not within 80 lines of the top",
                        "line 98: an `if _trace` block", "MLP.__call__: 14 lines (> 12)"]


# ============================================================ the rooms of the data pipeline
# The modules training/data.py became, the tokenizers and the token file format: each function
# on a screen (80 lines, docstring aside) and no deeper than the Trainer's rule.
ROOM_MODULES = ["training/batches.py", "training/corpus.py", "training/prepare.py",
                "training/text.py", "training/data.py", "formats/token_file.py", "config.py",
                "lens/plots.py", "serve/app.py"] + sorted(
    f"tokenizers/{p.name}" for p in (SRC / "tokenizers").glob("*.py"))


@pytest.mark.parametrize("module", ROOM_MODULES)
def test_the_data_and_tokenizer_modules_are_short_and_shallow(module):
    measured = list(_trainer_functions(SRC / module))
    long = [(name, n) for name, n, _ in measured if n > 80]
    deep = [(name, d) for name, _, d in measured if d > TRAINER_MAX_DEPTH]
    assert long == [] and deep == [], f"{module}: over 80 lines {long}; too deep {deep}"
    assert len((SRC / module).read_text(encoding="utf-8").splitlines()) <= 600, module


def test_prepare_reads_as_its_named_steps():
    """prepare() calls its steps by name, in order, and nests no loop of its own."""
    from glassllm.training import prepare
    tree = ast.parse((SRC / "training/prepare.py").read_text(encoding="utf-8"))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "prepare")
    called = [n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Name)]
    steps = ["read_sources", "choose_tokenizer", "write_splits", "publish_together"]
    assert [c for c in called if c in steps] == steps
    assert all(callable(getattr(prepare, s)) for s in steps)
    assert not [n for n in ast.walk(fn) if isinstance(n, (ast.For, ast.While))]


# ============================================================ the command line and the run
# The CLI parses, calls the library and prints: no function of cli/ over 60 lines; the library
# that runs a training (training/) none over 80; neither nested deeper than the Trainer's rule.
CLI_MAX_LINES = 60
LIBRARY_MAX_LINES = 80
CLI_MODULES = sorted(f"cli/{p.name}" for p in (SRC / "cli").glob("*.py"))
TRAINING_MODULES = sorted(f"training/{p.name}" for p in (SRC / "training").glob("*.py"))


@pytest.mark.parametrize("module", CLI_MODULES + TRAINING_MODULES)
def test_the_cli_and_training_functions_are_short_and_shallow(module):
    limit = CLI_MAX_LINES if module.startswith("cli/") else LIBRARY_MAX_LINES
    measured = list(_trainer_functions(SRC / module))
    if module == "cli/train.py":  # the measure finds the command's functions
        assert {"add_train", "run_train"} <= {m[0] for m in measured}
    if module == "training/run.py":
        assert {"execute", "RunResult"} & {m[0] for m in measured} == {"execute"}
    long = [(name, n) for name, n, _ in measured if n > limit]
    deep = [(name, d) for name, _, d in measured if d > TRAINER_MAX_DEPTH]
    assert long == [], f"{module}: functions over {limit} lines: {long}"
    assert deep == [], f"{module}: functions nested deeper than {TRAINER_MAX_DEPTH}: {deep}"


def test_the_cli_is_a_package_of_one_module_per_command():
    """The eight commands each in a module of their own, the package's main the entry point."""
    from glassllm import cli
    commands = {"train", "generate", "prepare", "plot", "convert", "inspect", "serve",
                "features"}
    assert commands <= {p.stem for p in (SRC / "cli").glob("*.py")}
    assert [add.__module__ for add in cli.SUBCOMMANDS] == [
        f"glassllm.cli.{name}" for name in ("train", "generate", "prepare", "plot", "convert",
                                            "inspect", "serve", "features")]
    assert not (SRC / "cli.py").exists() and cli.main.__module__ == "glassllm.cli.entry"
