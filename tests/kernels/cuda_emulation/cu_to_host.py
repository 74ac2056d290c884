#!/usr/bin/env python3
"""Turns a .cu file of kernels/cuda/ into C++ the host compiler builds against the emulated device
(emulated_device.h): `extern __shared__ T name[];` becomes a pointer to the block's dynamic shared
memory. Launches need no rewriting: they all go through device_common.cuh's LaunchKernel, whose
cudaLaunchKernelEx the emulated runtime provides (a `<<<...>>>` launch would not compile here,
which keeps it that way). Nothing else changes, so the code the emulator runs is the code nvcc
compiles.

It also checks what the emulator cannot show: that every kernel waits for the kernel before it
(AfterPreviousKernel) before anything else. A kernel launched programmatically that read memory
first could read its predecessor's output before it is written, on a GPU only.

usage: cu_to_host.py IN.cu OUT.cc
"""
import re
import sys

DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+([\w:\s]+?)\s+(\w+)\s*\[\s*\]\s*;")
# A kernel's head up to its body: `__global__ void [__launch_bounds__(...)] Name(params) {`.
KERNEL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")


def check_kernels_wait_first(path, src):
    for m in KERNEL.finditer(src):
        depth, i = 0, m.end() - 1
        while True:
            depth += {"(": 1, ")": -1}.get(src[i], 0)
            if depth == 0:
                break
            i += 1
        body = src[i + 1:].lstrip()
        if not body.startswith("{"):
            raise SystemExit(f"{path}: kernel {m.group(1)}: expected its body after its parameters")
        if not body[1:].lstrip().startswith("AfterPreviousKernel();"):
            raise SystemExit(f"{path}: kernel {m.group(1)} must call AfterPreviousKernel() first "
                             "(kernels/cuda/device_common.cuh): it may be launched before the "
                             "kernel whose output it reads has finished")


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        src = f.read()
    check_kernels_wait_first(sys.argv[1], src)
    src = DYNAMIC_SHARED.sub(
        lambda m: f"{m.group(1)}* const {m.group(2)} = "
                  f"static_cast<{m.group(1)}*>(::emu::DynamicSharedMemory());", src)
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        # Diagnostics and debuggers point at the .cu file (its lines keep their numbers).
        f.write(f'#line 1 "{sys.argv[1]}"\n')
        f.write(src)


if __name__ == "__main__":
    main()
