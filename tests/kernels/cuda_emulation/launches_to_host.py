#!/usr/bin/env python3
"""Rewrites a .cu file of kernels/cuda/ into C++ the host compiler builds against the emulated
device (emulated_device.h): each `Kernel<<<grid, block[, smem[, stream]]>>>(args);` becomes a
call of emu::Launch with a lambda that copies the arguments, as a launch copies its parameters
(a CUDA graph replays the values captured at launch), and `extern __shared__ T name[];` becomes a
pointer to the block's dynamic shared memory. Nothing else changes, so the code the emulator runs
is the code nvcc compiles.

usage: launches_to_host.py IN.cu OUT.cc
"""
import re
import sys


def split_top_level(text):
    """Splits `text` at the commas outside parentheses, brackets and braces."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def matching_paren(text, open_at):
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise SystemExit("unbalanced parentheses after a launch")


def kernel_start(src, open_at):
    """Where the kernel's name, with its template arguments, ends right before `<<<`."""
    i = open_at - 1
    while src[i].isspace():
        i -= 1
    if src[i] == ">":
        depth = 0
        while True:
            if src[i] == ">":
                depth += 1
            elif src[i] == "<":
                depth -= 1
                if depth == 0:
                    break
            i -= 1
        i -= 1
        while src[i].isspace():
            i -= 1
    end = i + 1
    while src[i].isalnum() or src[i] in "_:":
        i -= 1
    if i + 1 == end:
        raise SystemExit("a launch without a kernel name")
    return i + 1


def rewrite_launches(src):
    out, pos = [], 0
    while True:
        open_at = src.find("<<<", pos)
        if open_at < 0:
            out.append(src[pos:])
            return "".join(out)
        start = kernel_start(src, open_at)
        kernel = " ".join(src[start:open_at].split())
        close_at = src.find(">>>", open_at)
        config = split_top_level(src[open_at + 3:close_at])
        if not 2 <= len(config) <= 4:
            raise SystemExit(f"launch of {kernel}: expected 2 to 4 launch parameters")
        grid, block = config[0], config[1]
        smem = config[2] if len(config) > 2 else "0"
        stream = config[3] if len(config) > 3 else "nullptr"
        args_at = close_at + 3
        while src[args_at].isspace():
            args_at += 1
        if src[args_at] != "(":
            raise SystemExit(f"launch of {kernel}: expected its arguments")
        args_end = matching_paren(src, args_at)
        if src[args_end + 1] != ";":
            raise SystemExit(f"launch of {kernel}: expected ';' after its arguments")
        out.append(src[pos:start])
        out.append(f"::emu::Launch(dim3({grid}), dim3({block}), {smem}, {stream}, "
                   f"[=] {{ {kernel}{src[args_at:args_end + 1]}; }});")
        pos = args_end + 2


DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+([\w:\s]+?)\s+(\w+)\s*\[\s*\]\s*;")


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        src = f.read()
    src = DYNAMIC_SHARED.sub(
        lambda m: f"{m.group(1)}* const {m.group(2)} = "
                  f"static_cast<{m.group(1)}*>(::emu::DynamicSharedMemory());", src)
    src = rewrite_launches(src)
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        # Diagnostics and debuggers point at the .cu file (the launches keep their lines).
        f.write(f'#line 1 "{sys.argv[1]}"\n')
        f.write(src)


if __name__ == "__main__":
    main()
