#!/usr/bin/env python3
"""The layering rule over the real sources: every #include "..." of every file under runtime/, comm/, launch/ and
examples/ is resolved as the compiler resolves a quoted include (first against the including file's directory, so a
relative path such as "../nn/module.h" counts where it lands, then against the source root), and the folder it
lands in must be one that tests/layering/folders.txt allows for the including file's folder.

  check_includes.py SOURCE_DIR              exit 0 when every include is allowed; else one line per violation
                                            (FILE:LINE: ...) and exit 1
  check_includes.py SOURCE_DIR --self-test  the check must fail for an upward include written as a relative path
                                            (and as a root path) added in memory to real source files
"""
import os
import re
import sys

CHECKED = ("runtime", "comm", "launch", "examples")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def folder_of(path):
    parts = path.split("/")
    if parts[0] == "runtime":
        return "runtime" if len(parts) == 2 else "runtime/" + parts[1]
    return parts[0]


def read_table(src):
    table = {}
    with open(os.path.join(src, "tests/layering/folders.txt")) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, allowed = line.partition(":")
            table[name.strip()] = set(allowed.split())
    return table


def sources(src):
    """{relative path: text} of every C++/CUDA file under the checked folders."""
    out = {}
    for top in CHECKED:
        for root, _, files in os.walk(os.path.join(src, top)):
            for name in files:
                if name.endswith((".cc", ".h", ".cu", ".cuh")):
                    path = os.path.join(root, name)
                    with open(path, errors="replace") as f:
                        out[os.path.relpath(path, src)] = f.read()
    return out


def resolve(src, rel, inc):
    """The repository path an include of file `rel` lands in, 'proto' for generated headers, or None."""
    for base in (os.path.dirname(rel), ""):
        cand = os.path.normpath(os.path.join(base, inc))
        if not cand.startswith("..") and os.path.isfile(os.path.join(src, cand)):
            return cand
    if inc.endswith(".pb.h"):
        return "proto"
    return None


def check(src, table, files):
    problems = []
    for rel, text in sorted(files.items()):
        own = folder_of(rel)
        if own not in table:
            problems.append(f"{rel}: folder {own} is not in tests/layering/folders.txt")
            continue
        for n, line in enumerate(text.splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = resolve(src, rel, m.group(1))
            if target is None:
                problems.append(f"{rel}:{n}: #include \"{m.group(1)}\" resolves to no file of the repository")
                continue
            dest = "proto" if target == "proto" else folder_of(target)
            if dest != own and dest not in table[own]:
                problems.append(f"{rel}:{n}: #include \"{m.group(1)}\" reaches {target} in {dest}, which {own} may "
                                f"not include (tests/layering/folders.txt)")
    return problems


def self_test(src, table, files):
    ok = True
    cases = [("runtime/amp", '#include "../nn/module.h"', "runtime/nn"),
             ("comm", '#include "../runtime/train/trainer.h"', "runtime/train"),
             ("runtime/kernels", '#include "runtime/train/trainer.h"', "runtime/train")]
    for folder, line, dest in cases:
        victim = next(r for r in sorted(files) if folder_of(r) == folder and r.endswith(".cc"))
        changed = dict(files)
        changed[victim] = line + "\n" + files[victim]
        found = [p for p in check(src, table, changed) if p.startswith(victim + ":1:")]
        if len(found) == 1 and f"in {dest}, which {folder} may not include" in found[0]:
            print(f"ok - an added {line} in {victim} is reported: {found[0]}")
        else:
            print(f"not ok - an added {line} in {victim} was not reported as reaching {dest}: {found}")
            ok = False
    return ok


def main():
    src = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    table = read_table(src)
    files = sources(src)
    if "--self-test" in sys.argv:
        return 0 if self_test(src, table, files) else 1
    problems = check(src, table, files)
    for p in problems:
        print(p)
    print(f"check_includes: {len(files)} files, {len(problems)} disallowed include(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
