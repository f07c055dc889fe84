#!/usr/bin/env python3
"""The module layering, checked from the source side.

usage: layering.py SOURCE_DIR LAYERS_FILE

LAYERS_FILE is written by CMake (one line per module: "name: reachable
modules..."). Every '#include "module/..."' in src/ and kernels/ must name a
module the including module may reach; no module below run/ may name a
command-line flag in a string (the run layer maps spec fields to flags).
Prints every violation as FILE:LINE: message and exits 1 if there is one."""
import os
import re
import sys

root, layers_file = sys.argv[1], sys.argv[2]
reach = {}
with open(layers_file) as f:
    for line in f:
        name, _, mods = line.partition(":")
        if name.strip():
            reach[name.strip()] = set(mods.split())
if "engine" not in reach or "run" not in reach:
    sys.exit(f"{layers_file}: no module table (engine/run missing)")

kernel_headers = set(os.listdir(os.path.join(root, "kernels")))
include = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
flag = re.compile(r'"[^"\n]*(?<![\w-])--[a-z][a-z0-9-]+')
problems, checked = [], 0


def check(path, module):
    global checked
    rel = os.path.relpath(path, root)
    with open(path, encoding="utf-8") as f:
        for n, text in enumerate(f, 1):
            m = include.match(text)
            if m:
                checked += 1
                target = m.group(1)
                if target.startswith("lockstep/") and module == "run":
                    continue  # the installed C API header (include/lockstep), implemented by run
                if "/" in target:
                    dep = target.split("/")[0]
                    if dep in kernel_headers:
                        dep = "kernels"  # a folder of kernels/ (tc/)
                elif target in kernel_headers:
                    dep = "kernels"
                else:
                    continue  # a header beside the file (same module)
                if dep not in reach[module]:
                    problems.append(f"{rel}:{n}: module {module} includes {target} "
                                    f"(module {dep} is not below it)")
            if module not in ("run", "cli") and not text.lstrip().startswith(("*", "/*", "//")) \
                    and "compute-sanitizer" not in text:  # another tool's flag, not ours
                code = re.sub(r"/\*.*?(\*/|$)|//.*$", "", text)  # comments may name flags
                if flag.search(code):
                    problems.append(f"{rel}:{n}: module {module} names a command-line flag: "
                                    f"{text.strip()}")


for module in reach:
    folder = os.path.join(root, "kernels") if module == "kernels" else os.path.join(root, "src", module)
    if not os.path.isdir(folder):
        continue
    # kernels/ has subfolders (kernels/tc: the tensor-core tier, built as its
    # own library); their files obey the kernels module's reach.
    for sub, _, names in sorted(os.walk(folder)) if module == "kernels" else [(folder, None, os.listdir(folder))]:
        for name in sorted(names):
            if name.endswith((".c", ".h", ".cu", ".cuh")):
                check(os.path.join(sub, name), module)
for d in sorted(os.listdir(os.path.join(root, "src"))):
    if os.path.isdir(os.path.join(root, "src", d)) and d not in reach:
        problems.append(f"src/{d}: a folder that is no module of the build")

for p in problems:
    print(p)
print(f"layering: {len(reach)} modules, {checked} includes checked, {len(problems)} problems")
sys.exit(1 if problems else 0)
