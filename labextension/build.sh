#!/usr/bin/env bash
# Build the JupyterLab sidebar into soba_nb/labextension/ (git-ignored).
#
#   bash labextension/build.sh            npm ci + tsc + jupyter-builder (production build)
#   bash labextension/build.sh --develop  the same, then link the build into this Python
#                                         environment so later rebuilds need no reinstall
#
# Needs node >= 20.19 and npm, and JupyterLab >= 4.6 in the active Python (its
# `jupyter-builder` does the bundling). Without --develop, install afterwards with
# `pip install -e .` (or build a wheel): the package ships the build as shared data.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

npm ci --no-audit --no-fund
npm run build:prod

if [ "${1:-}" = "--develop" ]; then
  prefix="$(python -c 'import sys; print(sys.prefix)')"
  dest="$prefix/share/jupyter/labextensions/soba-nb-labextension"
  mkdir -p "$(dirname "$dest")"
  rm -rf "$dest"
  ln -s "$(cd "$here/../soba_nb/labextension" && pwd)" "$dest"
  echo "linked $dest -> soba_nb/labextension"
fi
