#!/usr/bin/env python3
"""The layering rule over the real sources: every #include "..." of every file under runtime/, comm/, launch/ and
examples/ is resolved as the compiler resolves a quoted include (first against the including file's directory, so a
relative path such as "../nn/module.h" counts where it lands, then against the source root), and the folder it
lands in must be one that tests/layering/folders.txt allows for the including file's folder.

  check_includes.py SOURCE_DIR [--links F]  exit 0 when every include is allowed; else one line per violation
                                            (FILE:LINE: ...) and exit 1. With --links (the build's folder-library
                                            links, "LIB PUBLIC|PRIVATE DEP" lines), also every link: its folder
                                            must be allowed by the table, and a PUBLIC link needs a header of the
                                            library's folder that includes the linked folder (else PRIVATE)
  check_includes.py SOURCE_DIR --self-test [--links F]
                                            the check must fail for an upward include written as a relative path
                                            (and as a root path) added in memory to real source files, and, with
                                            --links, for a link the table does not allow and for a PUBLIC link no
                                            header needs
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


def lib_folder(lib):
    """The folder of a folder library: ampdist_comm -> comm, ampdist_proto -> proto, ampdist_amp -> runtime/amp."""
    name = lib[len("ampdist_"):]
    return name if name in ("comm", "proto") else "runtime/" + name


def read_links(path):
    with open(path) as f:
        return [tuple(line.split()) for line in f if line.strip()]


def header_reaches(src, files, own, dest):
    """Whether some header of folder `own` includes a file of folder `dest`."""
    for rel, text in files.items():
        if folder_of(rel) != own or not rel.endswith((".h", ".cuh")):
            continue
        for line in text.splitlines():
            m = INCLUDE.match(line)
            target = resolve(src, rel, m.group(1)) if m else None
            if target is not None and ("proto" if target == "proto" else folder_of(target)) == dest:
                return True
    return False


def check_links(src, table, files, links):
    problems = []
    for lib, kind, dep in links:
        own, dest = lib_folder(lib), lib_folder(dep)
        if dest not in table.get(own, set()):
            problems.append(f"link {lib} -> {dep}: {own} may not use {dest} (tests/layering/folders.txt)")
        elif kind == "PUBLIC" and not header_reaches(src, files, own, dest):
            problems.append(f"link {lib} -> {dep} is PUBLIC, but no header of {own} includes {dest}: link it "
                            f"PRIVATE")
    return problems


def self_test(src, table, files, links=None):
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
    if links is not None:
        cases = [(("ampdist_comm", "PRIVATE", "ampdist_nn"), "comm may not use runtime/nn")]
        # A PUBLIC link the table allows but no header needs: the first such pair of runtime/ folders.
        spare = next(((o, d) for o in sorted(table) for d in sorted(table[o])
                      if o.startswith("runtime/") and d.startswith("runtime/") and not header_reaches(src, files, o, d)),
                     None)
        if spare:
            cases.append((("ampdist_" + spare[0][8:], "PUBLIC", "ampdist_" + spare[1][8:]), "no header of"))
        for added, want in cases:
            hit = [p for p in check_links(src, table, files, links + [added])
                   if p.startswith(f"link {added[0]} -> {added[2]}")]
            if any(want in p for p in hit):
                print(f"ok - an added link {' '.join(added)} is reported: {hit[0]}")
            else:
                print(f"not ok - an added link {' '.join(added)} was not reported ({want}): {hit}")
                ok = False
    return ok


def main():
    src = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    table = read_table(src)
    files = sources(src)
    links = read_links(sys.argv[sys.argv.index("--links") + 1]) if "--links" in sys.argv else None
    if "--self-test" in sys.argv:
        return 0 if self_test(src, table, files, links) else 1
    problems = check(src, table, files)
    link_problems = check_links(src, table, files, links) if links is not None else []
    for p in problems + link_problems:
        print(p)
    print(f"check_includes: {len(files)} files, {len(problems)} disallowed include(s)" +
          (f"; {len(links)} links, {len(link_problems)} disallowed or needlessly PUBLIC" if links is not None else ""))
    return 1 if problems or link_problems else 0


if __name__ == "__main__":
    sys.exit(main())
