#!/usr/bin/env bash
# Put Atari ROMs into DIR (default ./roms) from the ale-py wheel, without installing ale-py:
# `pip download` the wheel into a temporary folder, take ale_py/roms/*.bin out of it, remove
# the rest (also on failure). Then `export ALE_ROM_DIR=DIR`.
set -euo pipefail
dir=${1:-roms}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if python3 -m pip --version >/dev/null 2>&1; then
  pip=(python3 -m pip)
else
  python3 -m venv "$tmp/venv"
  pip=("$tmp/venv/bin/pip")
fi
# Every ale-py wheel carries the same ROMs: ask for one binary wheel whatever the local Python.
"${pip[@]}" download -q ale-py==0.12.1 --no-deps --only-binary=:all: \
  --python-version 3.11 --implementation cp --abi cp311 \
  --platform manylinux_2_28_x86_64 -d "$tmp"
mkdir -p "$dir"
python3 - "$tmp" "$dir" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "ale_py-*.whl"))[0]
n = 0
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("ale_py/roms/") and name.endswith(".bin"):
            with open(os.path.join(sys.argv[2], os.path.basename(name)), "wb") as f:
                f.write(z.read(name))
            n += 1
print(f"{n} ROMs in {sys.argv[2]}")
PY
