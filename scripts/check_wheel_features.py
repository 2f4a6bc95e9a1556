#!/usr/bin/env python3
"""Whether maturin's build of the Python package reuses the burn that `cargo test --release
--workspace` compiled.

maturin builds crates/drill-py alone (with the features python/pyproject.toml and CI give it);
cargo unifies a dependency's features over the packages of one build, so a crate under burn
that gets other features there than in the workspace build changes burn's metadata hash, and
burn is compiled a second time (8-9 minutes on 2 cores). This compares, with `cargo tree`
(nothing is compiled), the features of every crate under burn in the two builds, prints the
differences and exits 1 if there are any: add the workspace's features for those crates to
crates/drill-py/Cargo.toml's list.

    python3 scripts/check_wheel_features.py
"""

import os
import subprocess
import sys
import tomllib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def wheel_features():
    """The features maturin builds drill-py with: python/pyproject.toml's, and `atari`, which
    CI adds (MATURIN_PEP517_ARGS)."""
    with open(os.path.join(ROOT, "python", "pyproject.toml"), "rb") as f:
        features = tomllib.load(f)["tool"]["maturin"]["features"]
    return ",".join(["atari", *features])


def tree(*args):
    out = subprocess.run(
        ["cargo", "tree", "-f", "{p}|{f}", *args],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    return out.splitlines()


def parse(line):
    """(depth or None, package, features) of one `cargo tree` line."""
    depth = None
    if line[:1].isdigit():
        digits = len(line) - len(line.lstrip("0123456789"))
        depth, line = int(line[:digits]), line[digits:]
    package, _, features = line.partition("|")
    package = package.replace(" (*)", "").strip()
    features = {f.replace(" (*)", "").strip() for f in features.split(",")} - {""}
    return depth, package, features


def main():
    workspace = {}
    for line in tree("--workspace", "-e", "normal,build,dev", "--prefix", "none"):
        _, package, features = parse(line)
        workspace.setdefault(package, set()).update(features)
    wheel = {}
    under_burn = set()
    burn_depth = None
    for line in tree(
        "-p", "drill-py", "--features", wheel_features(), "-e", "normal,build", "--prefix", "depth"
    ):
        depth, package, features = parse(line)
        wheel.setdefault(package, set()).update(features)
        if burn_depth is not None and depth <= burn_depth:
            burn_depth = None
        if burn_depth is not None:
            under_burn.add(package)
        elif package.startswith("burn v"):
            burn_depth = depth
    if not under_burn:
        sys.exit("no burn in the wheel's dependency tree: has the crate moved?")
    differ = [p for p in sorted(under_burn) if workspace.get(p) != wheel.get(p)]
    for p in differ:
        print(
            f"{p}: the workspace build has {sorted(workspace.get(p, set()) - wheel[p])}, "
            f"the wheel's {sorted(wheel[p] - workspace.get(p, set()))}"
        )
    if differ:
        print(
            "maturin would compile burn again: give crates/drill-py/Cargo.toml these crates "
            "with the workspace build's features",
            file=sys.stderr,
        )
        sys.exit(1)
    print(f"the wheel's {len(under_burn)} crates under burn have the workspace build's features")


if __name__ == "__main__":
    main()
