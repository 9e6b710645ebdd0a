#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian machine: system packages, .venv, nbdist, Horovod.
# Fast when already done: every step checks before it works.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${NBDIST_VENV:-.venv}
PY=${NBDIST_PYTHON:-python3}
CACHE=${NBDIST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nbdist}
TF_PACKAGE=${NBDIST_TF:-tensorflow-cpu==2.21.0}   # GPU hosts: NBDIST_TF='tensorflow[and-cuda]==2.21.0'
HOROVOD_VERSION=0.28.1
export PIP_DISABLE_PIP_VERSION_CHECK=1
export YARN_CACHE_FOLDER="$CACHE/yarn"   # jlpm's downloads, kept across clones and venvs
# This machine's pip config names local indexes that may be absent; keep their warnings out of the log.
pip_quiet() { "$VPY" -m pip "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  ((${#missing[@]})) || return 0
  say "apt-get install ${missing[*]}"
  local sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
}

apt_install dataset-fashion-mnist cmake g++ make chromium   # chromium: the browser tests (Playwright)
command -v node >/dev/null || apt_install nodejs            # builds the JupyterLab extension
"$PY" -c "import ensurepip" >/dev/null 2>&1 || apt_install python3-venv
"$PY" -c "import os, sysconfig; raise SystemExit(not os.path.exists(sysconfig.get_paths()['include'] + '/Python.h'))" \
  || apt_install python3-dev   # Horovod compiles against the Python headers

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

stamp="$VENV/.nbdist-deps"
want="$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-16) $TF_PACKAGE"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing nbdist and its dependencies into $VENV"
  pip_quiet install -q --upgrade pip wheel
  pip_quiet install -q "$TF_PACKAGE"
  pip_quiet install -q -e ".[dev]"
  # KerasHub for its BertBackbone example (tests/keras_io), without its tensorflow-text pin (TF 2.20's)
  pip_quiet install -q --no-deps "keras-hub==0.32.0"
  "$VPY" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (nbdist)" >/dev/null
  mkdir -p "$VENV/share/jupyter/lab/settings"   # no news pop-up over the browser tests' clicks
  echo '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' \
    > "$VENV/share/jupyter/lab/settings/overrides.json"
  echo "$want" > "$stamp"
fi

# Horovod 0.28.1, by nbdist's own recipe (nbdist/horovod.py: the one-line CMake fix TF 2.21 needs; Gloo,
# plus MPI and NCCL where this host has them), the wheel cached in $CACHE; users run the same command.
hvd_stamp="$VENV/.nbdist-horovod"
if [ "$(cat "$hvd_stamp" 2>/dev/null)" != "$HOROVOD_VERSION $TF_PACKAGE" ]; then
  NBDIST_CACHE="$CACHE" "$VPY" -m nbdist.horovod install
  echo "$HOROVOD_VERSION $TF_PACKAGE" > "$hvd_stamp"
fi
# The JupyterLab extension (labextension/): node modules installed once per package.json + yarn.lock,
# the bundle rebuilt only when its sources change, then nbdist reinstalled (seconds) so the venv's
# share/jupyter/labextensions/nbdist holds the new bundle. The first `pip install -e` above already
# builds it through hatch-jupyter-builder; this step keeps it current afterwards.
VBIN="$(cd "$VENV/bin" && pwd)"
quiet_or_fail() { local out; out=$(cd labextension && PATH="$VBIN:$PATH" "$@" 2>&1) || { echo "$out" >&2; return 1; }; }
"$VPY" scripts/options_reference.py --strategies labextension/src/strategies.ts  # the sidebar's list, from the registry
lab_stamp="$VENV/.nbdist-labextension"
lab_want=$(cd labextension && cat package.json yarn.lock .yarnrc.yml tsconfig.json $(find src style -type f | sort) | sha1sum | cut -c1-16)
if [ "$(cat "$lab_stamp" 2>/dev/null)" != "$lab_want" ] || [ ! -f "$VENV/share/jupyter/labextensions/nbdist/package.json" ]; then
  deps_want=$(cat labextension/package.json labextension/yarn.lock | sha1sum | cut -c1-16)
  if [ "$(cat labextension/node_modules/.nbdist-deps 2>/dev/null)" != "$deps_want" ]; then
    say "installing the JupyterLab extension's node modules (about a minute, once)"
    quiet_or_fail jlpm install --immutable
    echo "$deps_want" > labextension/node_modules/.nbdist-deps
  fi
  say "building the JupyterLab extension"
  quiet_or_fail jlpm build:prod
  pip_quiet install -q --no-deps -e .
  echo "$lab_want" > "$lab_stamp"
fi

versions=$("$VPY" -c 'from importlib.metadata import version as v; print(", ".join(p + " " + v(p) for p in ("keras", "horovod", "ipyparallel")))')
say "ready: $VENV ($versions)"
