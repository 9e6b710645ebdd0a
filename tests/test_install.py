"""README's "Install into your own environment", for real: a fresh clone builds the wheel with `make wheel`;
a fresh venv with JupyterLab 4 (not .venv) installs it with the README's notebook-host commands,
verbatim, with Node.js made unavailable; then notebooks/01-quickstart.ipynb runs there under nbclient,
and that venv's JupyterLab shows the sidebar in Debian's headless Chromium.

The clone is of this repository's HEAD with the working tree's uncommitted changes laid over it (what
committing them would give), so the test checks the code under test, not only the last commit.
About 4 to 6 minutes on 2 cores: most of it is pip installing TensorFlow and JupyterLab into the venv.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tests.lab_helpers import SCREENSHOTS, chromium_page, jupyter_lab

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
NODE_TOOLS = ("node", "npm", "npx", "jlpm", "yarn")
pytestmark = [pytest.mark.timeout(1800), pytest.mark.cluster]  # a fresh venv, a wheel build, JupyterLab and a browser


def readme_commands(section: str) -> list[str]:
    """The command lines of the README's bash block after `<!-- install: section -->`."""
    block = README.read_text().split(f"<!-- install: {section} -->", 1)[1]
    text = re.search(r"```bash\n(.*?)```", block, re.S).group(1)
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def run(args, timeout, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("install")


@pytest.fixture(scope="module")
def wheel(workdir) -> Path:
    """`make wheel` in a fresh clone (Node.js builds the JupyterLab bundle there: the clone has none)."""
    clone = workdir / "clone"
    run(["git", "clone", "--quiet", str(REPO), str(clone)], 120)
    listed = run(["git", "-C", str(REPO), "ls-files", "-z", "--modified", "--others", "--exclude-standard"], 60)
    deleted = set(run(["git", "-C", str(REPO), "ls-files", "-z", "--deleted"], 60).stdout.split("\0"))
    for name in filter(None, listed.stdout.split("\0")):
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        if name in deleted:
            (clone / name).unlink(missing_ok=True)
        else:
            shutil.copy2(REPO / name, clone / name)
    assert not (clone / "nbdist" / "labextension").exists()  # a build output: not in a clone
    has_pip = subprocess.run(["python3", "-m", "pip", "--version"], capture_output=True).returncode == 0
    make = ["make", "wheel"] + ([] if has_pip else [f"WHEEL_PY={sys.executable}"])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run(make, 900, cwd=clone, env=env)
    built = sorted((clone / "dist").glob("nbdist-*-py3-none-any.whl"))
    assert len(built) == 1, built
    return built[0]


@pytest.fixture(scope="module")
def fresh_venv(workdir, wheel) -> dict:
    """A new venv with JupyterLab 4, then the README's notebook-host commands run in it, verbatim (from a
    folder holding only dist/), with node/npm/jlpm/yarn on PATH replaced by stubs that record any call."""
    venv, home = workdir / "venv", workdir / "user"
    run([sys.executable, "-m", "venv", str(venv)], 120)
    stubs, calls = workdir / "no-node", workdir / "node-calls.log"
    stubs.mkdir()
    for tool in NODE_TOOLS:
        (stubs / tool).write_text(f"#!/bin/sh\necho {tool} \"$@\" >> {calls}\nexit 127\n")  # as if not installed
        (stubs / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NBDIST_PROGRESS")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{stubs}{os.pathsep}{env['PATH']}", VIRTUAL_ENV=str(venv),
               JUPYTER_CONFIG_DIR=str(home / "jupyter-config"), JUPYTER_DATA_DIR=str(home / "jupyter-data"),
               IPYTHONDIR=str(home / "ipython"), TF_CPP_MIN_LOG_LEVEL="2")
    run([str(venv / "bin" / "pip"), "install", "-q", "jupyterlab>=4.2,<5"], 900, env=env)  # the user's environment
    place = workdir / "here"  # the commands run next to dist/ only, so `import nbdist` finds the installed wheel
    (place / "dist").mkdir(parents=True)
    shutil.copy2(wheel, place / "dist" / wheel.name)
    outputs, node_calls = {}, {}
    for command in readme_commands("notebook host"):
        done = run(["bash", "-c", command], 1200, cwd=place, env=env)
        outputs[command] = done.stdout + done.stderr
        node_calls[command] = calls.read_text() if calls.exists() else ""
        calls.unlink(missing_ok=True)
    return {"python": str(venv / "bin" / "python"), "env": env, "outputs": outputs, "node_calls": node_calls,
            "wheel": wheel, "venv": venv}


def test_wheel_carries_the_prebuilt_extension_and_readme_names_it(wheel):
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    data = f"nbdist-{wheel.name.split('-')[1]}.data/data/share/jupyter/labextensions/nbdist/"
    assert {data + "package.json", data + "install.json"} <= set(names)
    assert any(n.startswith(data + "static/remoteEntry.") for n in names)
    assert any(n == "nbdist/horovod.py" for n in names) and any(n == "nbdist/host/gpus.py" for n in names)
    for section in ("notebook host", "engine hosts", "GPU hosts"):
        assert f"dist/{wheel.name}" in readme_commands(section)[0], section


def test_readme_install_commands_ran_without_node_and_enabled_the_extension(fresh_venv):
    outputs, node_calls = fresh_venv["outputs"], fresh_venv["node_calls"]
    listed = next(command for command in outputs if command.startswith("jupyter labextension list"))
    # Installing never ran Node.js; only JupyterLab's own `labextension list` asks yarn for its config,
    # fails as where there is no Node.js, and lists the prebuilt extension all the same.
    assert all(not calls for command, calls in node_calls.items() if command != listed), node_calls
    assert re.search(r"nbdist v0\.1\.0 \S*enabled\S* \S*OK", outputs[listed]), outputs[listed]
    check = next(text for command, text in outputs.items() if "install --check" in command)
    assert "Gloo yes" in check and "NCCL no" in check, check
    where = run([fresh_venv["python"], "-c", "import nbdist; print(nbdist.__file__)"], 60, env=fresh_venv["env"],
                cwd=fresh_venv["venv"]).stdout
    assert where.startswith(str(fresh_venv["venv"])), where  # the wheel's copy, not a source tree


def test_engine_and_gpu_host_commands_exist_there(fresh_venv):
    """What the other two blocks run beyond the notebook host's commands is present in that environment."""
    from packaging.requirements import Requirement

    env, bin_dir = fresh_venv["env"], Path(fresh_venv["python"]).parent
    for section in ("engine hosts", "GPU hosts"):
        lines = readme_commands(section)
        pip_args = lines[0].split()[2:]
        assert [Requirement(a.strip("'")).name for a in pip_args[1:]] in (["tensorflow-cpu"], ["tensorflow"]), lines[0]
        assert all(line.startswith(("pip install", "python -m nbdist.horovod install", "ipengine ")) for line in lines)
    run([str(bin_dir / "ipengine"), "--help"], 120, env=env)
    run([fresh_venv["python"], "-m", "nbdist.horovod", "--help"], 60, env=env, cwd=fresh_venv["venv"])


def test_quickstart_notebook_runs_in_the_fresh_venv(fresh_venv, workdir):
    clone = workdir / "clone"
    out = workdir / "01-quickstart.ipynb"
    done = run([fresh_venv["python"], str(clone / "scripts" / "run_notebook.py"),
                str(clone / "notebooks" / "01-quickstart.ipynb"), str(out), "--timeout", "600"], 900,
               env={**fresh_venv["env"], "NBDIST_PROGRESS": "text"}, cwd=workdir)
    assert "accuracy above the 0.80 floor: True" in done.stdout, done.stdout[-3000:]
    assert "cluster stopped" in done.stdout


def test_sidebar_appears_in_the_fresh_venvs_jupyterlab(fresh_venv, workdir):
    root = workdir / "lab"
    root.mkdir()
    settings = fresh_venv["venv"] / "share" / "jupyter" / "lab" / "settings"
    settings.mkdir(parents=True, exist_ok=True)  # no news pop-up over the clicks
    (settings / "overrides.json").write_text('{"@jupyterlab/apputils-extension:notification": '
                                             '{"fetchNews": "false", "checkForUpdates": false}}')
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%load_ext nbdist")], metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(notebook, root / "installed.ipynb")
    with jupyter_lab(root, python=fresh_venv["python"], env=fresh_venv["env"]) as server, chromium_page() as page:
        try:
            page.goto(server.url("installed.ipynb"))
            page.wait_for_selector(".jp-Notebook .jp-Cell")
            page.wait_for_selector("text=| Idle")
            page.click(".jp-SideBar .lm-TabBar-tab[data-id='nbdist-sidebar']")
            page.wait_for_selector("#nbdist-sidebar >> text=nbdist is not loaded")
            page.click(".jp-Notebook .jp-Cell >> nth=0 >> .jp-InputArea-editor")
            page.keyboard.press("Shift+Enter")
            page.wait_for_selector("#nbdist-sidebar >> text=No cluster yet")  # the installed kernel side answers
            page.screenshot(path=str(SCREENSHOTS / "install-fresh-venv-sidebar.png"))
            sidebar = page.inner_text("#nbdist-sidebar")
            assert "No cluster yet" in sidebar and "nbdist is not loaded" not in sidebar, sidebar
        except Exception:
            page.screenshot(path=str(SCREENSHOTS / "install-fresh-venv-failure.png"), full_page=True)
            raise
