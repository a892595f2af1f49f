#!/usr/bin/env python3
"""Keeps the shared Cargo target directory from filling the disk.

Every change to a crate's inputs (its code, features or flags) gives its build a new hash,
and Cargo never deletes the artifacts of the old hashes: test binaries of ~500 MB each,
incremental caches of ~400 MB each. One target directory serves every session and every CI
clone (so RocksDB's C++ is compiled once), so without pruning it only grows — it once
filled the disk in the middle of the test suite.

For each of our own crates and test binaries (the targets of this workspace and the
wiki's) in `release/deps` and `release/incremental`, this keeps the newest two builds and
anything touched in the last day, and deletes the rest. Third-party crates are never
touched: they are small, and deleting one that a build script uses (`cc`, `bindgen`)
would make RocksDB's C++ compile again, which takes 20 minutes.

Usage: scripts/prune-target.py [TARGET_DIR]   (default: $CARGO_TARGET_DIR)
       PRUNE_KEEP_HOURS=0 scripts/prune-target.py   (keep only the newest two of each)
"""

import json
import os
import re
import subprocess
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path

KEEP_NEWEST = 2
KEEP_YOUNGER_THAN_SECONDS = float(os.environ.get("PRUNE_KEEP_HOURS", "24")) * 3600
# `name-<hash>` with an optional extension (.d, .rlib, .rmeta, .so, .dwp, …).
ARTIFACT = re.compile(r"^(?P<name>.+)-(?P<hash>[0-9a-z]{13,16})(?P<ext>\..*)?$")


def newest_mtime(path: Path) -> float:
    if path.is_dir():
        return max((entry.stat().st_mtime for entry in path.rglob("*")), default=path.stat().st_mtime)
    return path.stat().st_mtime


def our_targets() -> set:
    """The artifact names of every target (libraries, binaries, tests, benches) of this
    workspace and the wiki's, as Cargo writes them (`-` as `_`)."""
    root = Path(__file__).resolve().parent.parent
    names = set()
    for manifest in (root / "Cargo.toml", root / "apps" / "wiki" / "Cargo.toml"):
        metadata = subprocess.run(
            ["cargo", "metadata", "--no-deps", "--format-version", "1", "--manifest-path", str(manifest)],
            check=True, capture_output=True, text=True,
        )
        for package in json.loads(metadata.stdout)["packages"]:
            for target in package["targets"]:
                name = target["name"].replace("-", "_")
                names.update({name, "lib" + name})
    return names


def prune(directory: Path, ours: set) -> int:
    """Deletes the stale builds of our targets in one artifact directory; returns the
    bytes freed."""
    if not directory.is_dir():
        return 0
    builds = defaultdict(lambda: defaultdict(list))  # name -> hash -> paths
    for path in directory.iterdir():
        match = ARTIFACT.match(path.name)
        if match and match["name"] in ours:
            builds[match["name"]][match["hash"]].append(path)
    now = time.time()
    freed = 0
    for hashes in builds.values():
        by_age = sorted(hashes.values(), key=lambda paths: max(newest_mtime(p) for p in paths), reverse=True)
        for paths in by_age[KEEP_NEWEST:]:
            if now - max(newest_mtime(p) for p in paths) < KEEP_YOUNGER_THAN_SECONDS:
                continue
            for path in paths:
                freed += size_of(path)
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
    return freed


def size_of(path: Path) -> int:
    if path.is_dir():
        return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file())
    return path.stat().st_size


def main() -> None:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ["CARGO_TARGET_DIR"])
    ours = our_targets()
    freed = sum(prune(target / "release" / sub, ours) for sub in ("deps", "incremental"))
    print(f"pruned {freed / 2**30:.1f} GiB of stale builds from {target}")


if __name__ == "__main__":
    main()
