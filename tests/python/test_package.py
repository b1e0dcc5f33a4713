"""`pip install .` into a fresh virtual environment that already has torch: the build finds
that torch through pip's isolated build environment, the `ganc` command runs the installed
tools (not a build tree), and the Python API trains the MLP GAN from that environment. And the
package's layout: no module imports one that imports it."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig

from conftest import ROOT, archive


def test_pip_install_into_a_fresh_environment(tmp_path, datasets):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    # "Already has torch": the test environment's packages (torch, tensorboard, ...) are
    # visible to the fresh one through a .pth file, as a site-wide install would be.
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site, "test-env.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("GANC_BUILD_DIR", "PYTHONPATH", "GANC_PYTHON")}
    # The objects come from the checkout's own build through ccache, whose paths are relative
    # to the checkout: the tree sits one level below it, as ./build does.
    tree = os.path.join(ROOT, "build-package")
    shutil.rmtree(tree, ignore_errors=True)
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "-C", f"build-dir={tree}", ROOT],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    shutil.rmtree(tree, ignore_errors=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    ganc_cmd = str(venv / "bin" / "ganc")
    version = subprocess.run([ganc_cmd, "--version"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("ganc 0.") and "LibTorch 2." in version.stdout
    where = subprocess.run([py, "-c", "import ganc.cli; print(ganc.cli.tools_dir())"], capture_output=True,
                           text=True, env=env, cwd=tmp_path).stdout.strip()
    assert where.startswith(str(venv)), where  # the installed tools, not the build tree
    # The tools link the torch they were built against: after the environment's torch changes
    # (here: the record of the build's torch says another), `ganc` refuses in one line.
    record = subprocess.run([py, "-c", "import ganc._build as b; print(b.__file__)"], capture_output=True,
                            text=True, env=env, cwd=tmp_path, check=True).stdout.strip()
    text = open(record).read()
    with open(record, "w") as f:
        f.write(text.replace("TORCH_VERSION = ", "TORCH_VERSION = '1.0.0' or "))
    other = subprocess.run([ganc_cmd, "--version"], capture_output=True, text=True, env=env, cwd=tmp_path)
    with open(record, "w") as f:
        f.write(text)
    assert other.returncode == 2 and other.stdout == "", other
    assert other.stderr.startswith("ganc: error: ganc was built against torch 1.0.0, this environment has 2.")
    assert len(other.stderr.strip().splitlines()) == 1, other.stderr

    script = f"""
import ganc, json
plan = ganc.compile({archive('mlp')!r}, "mlp.plan")
summary = ganc.train(plan, data={datasets['ring']!r}, nproc=2, steps=10, out="run", log_every=5, quiet=True)
print(json.dumps({{"used": plan.used("d"), "summary": summary}}))
"""
    r = subprocess.run([py, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["used"] and all(n.startswith("discriminator.") for n in result["used"])
    assert result["summary"]["steps"] == 10
    assert any(n.startswith("events.out.tfevents.") for n in os.listdir(tmp_path / "run"))


def _package_imports():
    """The package's own imports, module by module (each `from .x import` or `from . import x`,
    at top level or inside a function): {module: {module it imports}}."""
    import ast
    root = os.path.join(ROOT, "python", "ganc")
    modules = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                modules[dotted.removesuffix(".__init__").removesuffix("__init__") or "ganc"] = path
    graph = {}
    for module, path in modules.items():
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                base = package.split(".") if package not in ("", "ganc") else []
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names if not node.module else [None]:
                    name = ".".join(filter(None, [target, alias.name if alias else None]))
                    if name in modules:
                        edges.add(name)
                    elif target in modules:
                        edges.add(target)
        graph[module] = edges - {module}
    return graph


def test_the_package_has_no_import_cycle():
    """No module of python/ganc imports, directly or through others, a module that imports it
    (deferred imports inside functions count): each imports alone, in any order."""
    graph = _package_imports()
    assert {"hybrid", "tracing", "functions", "probe", "reference", "reference.launch"} <= set(graph), sorted(graph)
    assert "tracing" in graph["hybrid"] and "probe" in graph["tracing"], graph
    state = {}

    def visit(module, path):
        if state.get(module) == "done":
            return
        assert state.get(module) != "open", "import cycle: " + " -> ".join(path + [module])
        state[module] = "open"
        for imported in sorted(graph[module]):
            visit(imported, path + [module])
        state[module] = "done"

    for module in sorted(graph):
        visit(module, [])
    # And the modules that once imported each other import alone in a fresh interpreter.
    for module in ("functions", "hybrid", "tracing", "reference"):
        r = subprocess.run([sys.executable, "-c", f"import ganc.{module}"], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
        assert r.returncode == 0, (module, r.stderr[-2000:])
