#!/usr/bin/env python3
"""Closing summary of scripts/test.sh: reads the JUnit XML files that CTest (--output-junit) and
pytest (--junitxml) wrote for each run of the suite (native, then HANPU_ISA capped), prints every
skipped test with its reason, then one line `N passed, N failed, N skipped` over all of them.

    test_summary.py LABEL=FILE.xml ...
Exit code 1 when a file is missing or counts a failure (scripts/test.sh stops at the first failing
run anyway; this catches a run that wrote no results)."""

import sys
import xml.etree.ElementTree as ET


def skip_reason(case):
    skipped = case.find("skipped")
    message = skipped.get("message", "") if skipped is not None else ""
    out = case.findtext("system-out") or ""
    if message in ("", "SKIP_REGULAR_EXPRESSION_MATCHED"):
        # GoogleTest prints "file:line: Skipped" and then the test's own reason on the next line.
        lines = out.splitlines()
        for i, line in enumerate(lines):
            if line.endswith(": Skipped") and i + 1 < len(lines):
                return lines[i + 1].strip()
    return message or "no reason given"


def main(args):
    passed = failed = skipped = 0
    reasons = []
    ok = True
    for arg in args:
        label, _, path = arg.partition("=")
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as e:
            print(f"test summary: {label}: cannot read {path}: {e}")
            ok = False
            continue
        for case in root.iter("testcase"):
            name = case.get("name", "?")
            if case.get("classname") and case.get("classname") != name:
                name = f"{case.get('classname')}::{name}"
            if case.find("failure") is not None or case.find("error") is not None or case.get("status") == "fail":
                failed += 1
            elif case.find("skipped") is not None or case.get("status") == "notrun":
                skipped += 1
                reasons.append(f"  {label}: {name}: {skip_reason(case)}")
            else:
                passed += 1
    print(f"skipped tests: {skipped}" + (":" if reasons else ""))
    for r in reasons:
        print(r)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 0 if ok and failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
