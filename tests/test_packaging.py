"""`import ngvi` needs only torch and numpy; the experiments' packages are an extra, and the CLI says so.

The checks that matter run in a throw-away virtual environment that holds exactly ngvi's declared
dependencies (pyproject's ``dependencies``) and what they require in turn: a ``--without-pip`` venv whose
site-packages has one ``.pth`` file naming a folder of symlinks to those installed packages, plus this
checkout's ``src``. Nothing is downloaded or installed, so it is offline and takes a few seconds.
"""

from __future__ import annotations

import ast
import importlib.metadata
import itertools
import subprocess
import sys
import tomllib
import types
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ngvi.experiments import cli

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRA_DISTRIBUTIONS = sorted(
    canonicalize_name(Requirement(r).name) for r in PYPROJECT["optional-dependencies"]["experiments"]
)
# import names of the experiments extra: the distribution names, except these
IMPORT_NAMES = {"pyro-ppl": "pyro", "stable-baselines3": "stable_baselines3", "sb3-contrib": "sb3_contrib"}
EXTRA = sorted(IMPORT_NAMES.get(name, name) for name in EXTRA_DISTRIBUTIONS)
EXTRA_LINE = 'error: this command needs the experiments extra: pip install "ngvi[experiments]" (missing: '


def _installed_closure(requirements: list[str]) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions ``requirements`` need, transitively (no extras, no other platforms)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(requirements)
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            assert req.name not in requirements, f"{req.name}, a dependency of ngvi, is not installed"
            continue  # required on paper but absent here: torch imports without it
        found[name] = dist
        todo.extend(dist.requires or [])
    return found


def _link_top_levels(dist: importlib.metadata.Distribution, into: Path) -> None:
    """Symlink each top-level entry ``dist`` put in site-packages (packages, modules, its dist-info)."""
    assert dist.files is not None, f"{dist.metadata['Name']} lists no files (no RECORD)"
    for top in sorted({f.parts[0] for f in dist.files}):
        if top in ("..", "__pycache__") or top.endswith(".pth"):
            continue  # console scripts, byte code of single-file modules, startup hooks
        source = Path(dist.locate_file(top))
        if source.exists() and not (into / top).exists():
            (into / top).symlink_to(source)


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A venv's python that sees only ngvi's dependencies (torch, numpy, theirs) and this checkout's src."""
    root = tmp_path_factory.mktemp("bare")
    dists = _installed_closure(PYPROJECT["dependencies"])
    leaked = sorted(set(dists) & set(EXTRA_DISTRIBUTIONS))
    assert not leaked, f"ngvi's dependencies pull in the experiments extra: {leaked}"
    links = root / "links"
    links.mkdir()
    for dist in dists.values():
        _link_top_levels(dist, links)
    venv.create(root / "venv", with_pip=False, symlinks=True)  # = python -m venv --without-pip
    site = (
        root / "venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    )
    assert site.is_dir()
    (site / "ngvi_deps.pth").write_text(f"{links}\n{SRC}\n")
    return root / "venv" / "bin" / "python"


def _run(python: Path | str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    # -I: no PYTHONPATH, no user site, no current directory on sys.path; the .pth file is still read
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "LC_ALL": "C.UTF-8"}
    return subprocess.run(
        [str(python), "-I", *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )


BARE_PROBE = f"""
import sys
import ngvi
assert ngvi.__file__.startswith({str(SRC)!r}), ngvi.__file__
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in {EXTRA!r} or m.startswith("ngvi.exp"))
assert not loaded, loaded
for name in {EXTRA!r}:
    try:
        __import__(name)
    except ModuleNotFoundError:
        continue
    raise AssertionError(name + " is importable: the bare venv proves nothing")
import numpy, torch

torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
x, y = torch.randn(16, 3), torch.randn(16, 1)
opt = ngvi.Vadam(model.parameters(), data_size=16, lr=0.1, prior_prec=1.0, init_prec=10.0, seed=0)

def closure():
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y) / 2
    loss.backward()
    return loss

before = model.weight.detach().clone()
loss = opt.step(closure)
post = opt.posterior()
assert torch.isfinite(loss) and not torch.equal(model.weight, before)
assert [m.shape for m in post.mean] == [p.shape for p in model.parameters()]
assert all(torch.isfinite(v).all() and (v > 0).all() for v in post.variance)
print("ok", len(sys.modules))
"""


def test_import_ngvi_and_train_with_only_torch_and_numpy(bare_python, tmp_path):
    result = _run(bare_python, "-c", BARE_PROBE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


@pytest.mark.parametrize(
    "argv",
    [["uci", "--datasets", "yacht", "--splits", "1"], ["demo"], ["bench", "--quick"]],
    ids=" ".join,
)
def test_cli_without_the_extra_is_one_line_and_status_2(bare_python, tmp_path, argv):
    result = _run(bare_python, "-m", "ngvi.experiments.cli", *argv, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    missing = lines[0].removeprefix(f"ngvi {argv[0]}: {EXTRA_LINE}").removesuffix(")")
    assert missing in EXTRA, lines[0]


def test_cli_help_without_the_extra_works(bare_python, tmp_path):
    result = _run(bare_python, "-m", "ngvi.experiments.cli", "uci", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "--datasets" in result.stdout


def test_cli_help_without_the_extra_still_lists_every_command(bare_python, tmp_path):
    result = _run(bare_python, "-m", "ngvi.experiments.cli", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert all(name in result.stdout for name in cli.COMMANDS)


def test_import_ngvi_loads_no_experiment_package_where_all_are_installed(tmp_path):
    """With the extra installed, `import ngvi` still leaves it alone (catches a module-level import of one).

    tqdm is not checked here: torch.hub imports it itself whenever it is installed.
    """
    probe = f"""
import sys
sys.path.insert(0, {str(SRC)!r})
import ngvi
loaded = sorted(m for m in sys.modules
                if m.partition(".")[0] in {sorted(set(EXTRA) - {"tqdm"})!r} or m.startswith("ngvi.exp"))
assert not loaded, loaded
import ngvi.experiments.cli  # the CLI starts without the heavy packages, too
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in {sorted(set(EXTRA) - {"tqdm"})!r})
assert not loaded, loaded
"""
    result = _run(sys.executable, "-c", probe, cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def _from_base(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from X import ...`` in ``package`` names as X, relative imports resolved."""
    if not node.level:
        return node.module
    parts = package.split(".")
    return ".".join([*parts[: len(parts) - node.level + 1], node.module or ""]).rstrip(".")


def _imports(tree: ast.AST, package: str, module_level_only: bool) -> list[tuple[int, str]]:
    """(line, module) for every module an import statement in ``tree`` may load; optionally outside functions.

    Relative imports are resolved against ``package``; ``from a import b`` yields both ``a`` and ``a.b``.
    """
    found = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, package)
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
        if module_level_only and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def _ngvi_modules() -> dict[str, Path]:
    """Every module of ngvi by its dotted name (a package by its own name, for its ``__init__``)."""
    modules = {}
    for path in (SRC / "ngvi").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _import_graph() -> dict[str, dict[str, int]]:
    """module -> {ngvi module it imports: the line}, from every import statement (in functions and under
    ``if TYPE_CHECKING:`` too: a circle hidden in a function is still a circle).

    Each statement points at the most specific module it names: ``from a import b`` at ``a.b`` where that is
    a module, else at ``a`` (b is a name in a). The parent packages that Python loads on the way (``a`` for
    ``a.b``) are not edges: every module would otherwise import ``ngvi/__init__``, which imports them all.
    """
    modules = _ngvi_modules()

    def module_of(dotted: str) -> str:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted

    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(node, package)
                targets = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in map(module_of, targets):
                if target and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def test_library_imports_point_one_way():
    """Outside ngvi/experiments: no import of ngvi.experiments, and the extra's packages only in functions."""
    library = [p for p in (SRC / "ngvi").rglob("*.py") if "experiments" not in p.relative_to(SRC).parts]
    assert len(library) > 20
    problems = []
    for path in library:
        tree = ast.parse(path.read_text(), str(path))
        package = ".".join(path.relative_to(SRC).parts[:-1])  # the package a module (or __init__) is in
        where = path.relative_to(REPO)
        for line, module in _imports(tree, package, module_level_only=False):
            if module == "ngvi.experiments" or module.startswith("ngvi.experiments."):
                problems.append(f"{where}:{line} imports {module}")
        for line, module in _imports(tree, package, module_level_only=True):
            if module.partition(".")[0] in {*EXTRA, "rich"}:
                problems.append(f"{where}:{line} imports {module} at import time")
    assert not problems, "\n".join(sorted(set(problems)))


def _find_cycle(graph: dict[str, dict[str, int]]) -> list[str]:
    """One import circle [a, b, ..., a] of ``graph``, or [] (depth-first search, in sorted order)."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str]:
        path.append(node)
        on_path.add(node)
        for nxt in sorted(graph[node]):
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in done and (cycle := visit(nxt)):
                return cycle
        path.pop()
        on_path.discard(node)
        done.add(node)
        return []

    for start in sorted(graph):
        if start not in done and (cycle := visit(start)):
            return cycle
    return []


def test_find_cycle_finds_a_circle_and_only_a_circle():
    assert _find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {}}) == []
    assert _find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"b": 1}}) == ["b", "c", "b"]


def test_ngvi_modules_import_one_another_without_circles():
    """No import circle among ngvi's modules, counting imports inside functions too (see _import_graph)."""
    graph = _import_graph()
    assert {"ngvi.optim.engine.optimizer", "ngvi.posterior.base", "ngvi.pruning"} <= set(graph)
    cycle = _find_cycle(graph)
    steps = [f"{a} (line {graph[a][b]}) -> {b}" for a, b in itertools.pairwise(cycle)]
    assert not cycle, "import circle:\n" + "\n".join(steps)


# (importer prefix, imported prefixes it must not use, except these)
LAYERS = [
    # the engine never imports an update rule: only its own parts, the functional cores and the diagnostics
    (
        "ngvi.optim.engine",
        ["ngvi.optim"],
        ["ngvi.optim.engine", "ngvi.optim.functional", "ngvi.optim.diagnostics"],
    ),
    # posteriors are built by optimizers and experiments, never the other way round
    ("ngvi.posterior", ["ngvi.optim", "ngvi.baselines", "ngvi.experiments", "ngvi.predict"], []),
    # pruning ranks scores; the posterior calls it (GaussianPosterior.prune_masks), not the reverse
    ("ngvi.pruning", ["ngvi.posterior", "ngvi.optim"], []),
    # the functional cores are pure: nothing of the engine or the rules
    ("ngvi.optim.functional", ["ngvi.optim"], ["ngvi.optim.functional"]),
]


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@pytest.mark.parametrize(("importer", "banned", "allowed"), LAYERS, ids=[layer[0] for layer in LAYERS])
def test_layers_import_one_way(importer, banned, allowed):
    graph = _import_graph()
    modules = [m for m in graph if _under(m, importer)]
    assert modules, f"no module under {importer}"
    problems = [
        f"{m} (line {line}) imports {target}"
        for m in modules
        for target, line in graph[m].items()
        if any(_under(target, b) for b in banned) and not any(_under(target, a) for a in allowed)
    ]
    assert not problems, "\n".join(sorted(problems))


def test_the_old_import_paths_still_work_without_a_warning():
    """Users' imports from before the engine and posterior packages: same objects, no deprecation noise."""
    probe = f"""
import sys, warnings
sys.path.insert(0, {str(SRC)!r})
warnings.simplefilter("error")
import ngvi
from ngvi.optim.base import NonFiniteGradientError, VariationalOptimizer, initial_curvature
from ngvi.posterior import DiagonalGaussian, GaussianPosterior, KroneckerBlock, KroneckerGaussian
from ngvi.posterior import symmetric_kl
from ngvi.posterior import BlockTridiagonalGaussian, FullGaussian, dense_covariance
assert VariationalOptimizer is ngvi.VariationalOptimizer
assert NonFiniteGradientError is ngvi.NonFiniteGradientError
assert (DiagonalGaussian, KroneckerGaussian, FullGaussian, BlockTridiagonalGaussian, GaussianPosterior) == (
    ngvi.DiagonalGaussian, ngvi.KroneckerGaussian, ngvi.FullGaussian, ngvi.BlockTridiagonalGaussian,
    ngvi.GaussianPosterior)
"""
    result = _run(sys.executable, "-c", probe, cwd=REPO)
    assert result.returncode == 0, result.stderr


def test_cli_names_the_extra_when_a_command_imports_it_at_run_time(monkeypatch, capsys):
    import ngvi.experiments as experiments

    def needs(name: str, package: str) -> None:
        module = types.ModuleType(f"ngvi.experiments.{name}")

        def main(args):
            raise ModuleNotFoundError(f"No module named '{package}'", name=package)

        module.COMMAND = types.SimpleNamespace(
            help=name, add_arguments=lambda parser: parser.add_argument("--out"), main=main
        )
        monkeypatch.setitem(sys.modules, module.__name__, module)
        monkeypatch.setitem(experiments.COMMANDS, name.strip("_"), name)

    needs("_plots", "matplotlib.pyplot")
    needs("_compares", "ivon")  # an optional benchmark comparison, not part of the extra: a real error
    assert cli.main(["plots", "--out", "x"]) == 2
    assert capsys.readouterr().err == f"ngvi plots: {EXTRA_LINE}matplotlib)\n"
    with pytest.raises(ModuleNotFoundError, match="ivon"):
        cli.main(["compares"])


def test_extra_matches_pyproject_and_the_library_needs_only_torch_and_numpy():
    assert sorted(cli.EXPERIMENTS_EXTRA) == EXTRA
    assert sorted(canonicalize_name(Requirement(r).name) for r in PYPROJECT["dependencies"]) == [
        "numpy",
        "torch",
    ]
    assert set(PYPROJECT["optional-dependencies"]) >= {"experiments", "dev"}
