"""MPI through mpi4py: the job's size from the launcher, the world, the node, and failures agreed on.

mpi4py is imported only when a run over MPI is asked for: `import sparsegen` never needs it.
"""
from __future__ import annotations

import os
import socket

from ..errors import SparsegenError

ROOT = 0
# launchers' size variables: MPICH, Intel MPI and Slurm's PMI (PMI_SIZE), Open MPI (OMPI_COMM_WORLD_SIZE)
LAUNCHER_SIZE = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
INSTALL = "pip install -e \".[mpi]\" (mpi4py and MPICH from PyPI)"


class RankError(SparsegenError):
    """Another rank failed: its rank and its error's one line."""

    def __init__(self, rank: int, message: str):
        self.rank = rank
        super().__init__(f"rank {rank}: {message}")


def launched() -> int:
    """The job size an MPI launcher announces in the environment (1 when none does); mpi4py is not
    imported to learn it."""
    for name in LAUNCHER_SIZE:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1


def world():
    """MPI.COMM_WORLD, or SparsegenError saying how to install mpi4py and an MPI."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise SparsegenError(f"running on MPI needs mpi4py and an MPI library: {INSTALL}") from exc
    return MPI.COMM_WORLD


def library() -> str:
    """The MPI library's name and version (its first line)."""
    from mpi4py import MPI

    return " ".join(MPI.Get_library_version().strip().splitlines()[0].split())


def node(comm):
    """(the node's communicator: ranks sharing memory with this one, this rank on the node); the
    caller frees the communicator."""
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    return local, local.rank


def host() -> str:
    return socket.gethostname()


def collective(comm, fn, *args, **kwargs):
    """fn(*args, **kwargs) on every rank, then agree: when any rank failed, every rank raises (the
    failing one its own exception, the others RankError naming the first failing rank). Raised
    exceptions carry `agreed = True`: every rank knows, so none is left waiting."""
    try:
        value, failure = fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - carried to the other ranks, then raised again
        value, failure = None, exc
    reports = comm.allgather(None if failure is None else one_line(failure))
    bad = [(r, m) for r, m in enumerate(reports) if m is not None]
    if failure is not None:
        failure.agreed = True
        raise failure
    if bad:
        error = RankError(*bad[0])
        error.agreed = True
        raise error
    return value


def one_line(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, SparsegenError) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())


def mpiexec_command(ranks: int, mpiexec: str | None = None) -> list[str]:
    """The command line that starts `ranks` ranks with the MPI next to this Python (the [mpi] extra puts
    MPICH's mpiexec in the environment's bin directory), else the one on PATH. Open MPI's launcher gets
    --oversubscribe (more ranks than cores) and, as root, --allow-run-as-root; MPICH's needs neither.
    SparsegenError when there is none."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    here = Path(sys.executable).parent / "mpiexec"
    path = mpiexec or (str(here) if here.exists() else shutil.which("mpiexec"))
    if path is None:
        raise SparsegenError(f"no mpiexec next to {sys.executable} nor on PATH: {INSTALL}")
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    extra = []
    if "Open MPI" in version or "OpenRTE" in version or "prte" in version.lower():
        extra = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    return [path, *extra, "-n", str(int(ranks))]
