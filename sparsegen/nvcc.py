"""Compile CUDA source to a cubin with nvcc, called as an argument list (never a shell string)."""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .errors import CompileError

FLAGS = ("-O3", "-lineinfo", "-std=c++17")
ARCH_RE = re.compile(r"^sm_\d{2,3}[af]?$")
DEFAULT_ARCH = "sm_90"


def nvcc_path() -> str | None:
    """`SPARSEGEN_NVCC` if set, else `nvcc` on PATH, else None."""
    configured = os.environ.get("SPARSEGEN_NVCC")
    if configured:
        return shutil.which(configured) or (configured if Path(configured).is_file() else None)
    return shutil.which("nvcc")


def toolchain_id() -> str:
    """Identifies the nvcc binary without running it (path, size, mtime), for cache keys.

    Running `nvcc --version` costs a process start; a warm compile() must not pay that.
    """
    path = nvcc_path()
    if path is None:
        return "nvcc:none"
    real = os.path.realpath(path)
    st = os.stat(real)
    return f"nvcc:{real}:{st.st_size}:{st.st_mtime_ns}"


@functools.lru_cache(maxsize=4)
def version(path: str | None = None) -> str:
    path = path or nvcc_path()
    if path is None:
        return "none"
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return match.group(2) if match else out.strip().splitlines()[-1] if out.strip() else "unknown"


def check_arch(arch: str) -> str:
    if not ARCH_RE.match(arch or ""):
        raise CompileError(f"architecture {arch!r} is not of the form sm_XY (e.g. sm_90)")
    return arch


def command(source_path: str, out_path: str, arch: str, extra=()) -> list[str]:
    path = nvcc_path()
    if path is None:
        raise CompileError("nvcc not found: put it on PATH or set SPARSEGEN_NVCC")
    return [path, "-cubin", f"-arch={check_arch(arch)}", *FLAGS, *extra, "-o", out_path, source_path]


def compile_cubin(source: str, arch: str, extra=(), name: str = "kernel") -> bytes:
    """nvcc `source` for `arch`; raises CompileError carrying the numbered source and the log."""
    with tempfile.TemporaryDirectory(prefix="sparsegen-nvcc-") as tmp:
        src = os.path.join(tmp, f"{name}.cu")
        out = os.path.join(tmp, f"{name}.cubin")
        Path(src).write_text(source)
        cmd = command(src, out, arch, extra)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not os.path.exists(out):
            first = next((line for line in proc.stderr.splitlines() if "error" in line), proc.stderr.strip()[:200])
            raise CompileError(f"nvcc failed for {name} ({arch}): {first}", source, proc.stdout + proc.stderr, cmd)
        return Path(out).read_bytes()


def sass(cubin_path: str) -> str | None:
    """`cuobjdump -sass` of a cubin, or None when cuobjdump is not on PATH."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        return None
    proc = subprocess.run([tool, "-sass", cubin_path], capture_output=True, text=True, check=False)
    return proc.stdout if proc.returncode == 0 else None
