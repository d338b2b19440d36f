#!/usr/bin/env python3
"""Prints the requirement lines of the given requirements files that the running interpreter does
not satisfy yet (scripts/setup.sh installs only those, so a second run costs no pip call and needs
no network). Understands the lines our files use: `name==version` and bare `name`; comments and
blank lines are skipped, anything else is printed (pip decides).

    missing_requirements.py [--present-ok] FILE...
--present-ok: a package installed at any version counts as satisfied (for the torch stack: an
existing torch, e.g. a deliberate CPU build, is not replaced by the pinned one)."""

import importlib.metadata
import re
import sys


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def satisfied(line, present_ok):
    m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*([^\s;]+))?", line)
    if not m:
        return False
    name, version = m.groups()
    try:
        have = importlib.metadata.version(canonical(name))
    except importlib.metadata.PackageNotFoundError:
        return False
    return present_ok or version is None or have == version


def main(args):
    present_ok = "--present-ok" in args
    for path in (a for a in args if a != "--present-ok"):
        with open(path) as f:
            for raw in f:
                line = raw.split("#", 1)[0].strip()
                if line and not satisfied(line, present_ok):
                    print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
