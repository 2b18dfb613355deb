"""Compile ampmeter's hot path with mypyc into a copy of the package.

    python scripts/compile_core.py DEST     # DEST/ampmeter: the package, hot modules compiled

The modules every call goes through (the graph, the stats, the limit check, the context) are
compiled to C extensions beside their sources; everything else stays Python. The same source runs
uncompiled (an editable install, or a machine with no C compiler), only slower. The wheel build
(``hatch_build.py``) and ``make compiled`` (what tests and benchmarks import) both use this file.

Every run copies the whole package afresh; mypyc runs again only when the hot modules, this
script or mypy changed since the last compile into DEST (a hash of them is kept beside the
extensions), so a change elsewhere costs a copy, not a compile.

The compile type-checks with ``--platform ampmeter-mypyc``: the arguments ampmeter validates
itself are ``object`` to the compiled code (see ``ampmeter/_argtypes.py``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "ampmeter"
# Order does not matter to mypyc; these are the modules of one llm_call round.
MODULES = (
    "ampmeter/keys.py",
    "ampmeter/stats.py",
    "ampmeter/_limit_check.py",
    "ampmeter/graph.py",
    "ampmeter/context.py",
    "ampmeter/sinks/_lines.py",  # reads every field of every node a JSONL sink writes
)
PLATFORM = "ampmeter-mypyc"  # ampmeter._argtypes.COMPILE_PLATFORM
STAMP = ".compiled-from"


def source_hash() -> str:
    """What the extensions are built from: the hot modules, their annotations, this script and
    the mypy that compiles them."""
    from mypy.version import __version__ as mypy_version

    digest = hashlib.sha256(f"{sys.version}|mypy {mypy_version}|{PLATFORM}".encode())
    for name in (*MODULES, "ampmeter/_argtypes.py"):
        digest.update(name.encode() + b"\0" + (PACKAGE.parent / name).read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()


def _extensions(dest: Path) -> list[Path]:
    return sorted(dest.glob("*__mypyc*.so")) + sorted((dest / "ampmeter").rglob("*.so"))


def sync_into(dest: Path) -> list[Path]:
    """Copy the package to ``dest/ampmeter``, compiling the hot modules only if they changed.

    Returns the extension files (in ``dest`` and under ``dest/ampmeter``).
    """
    dest = dest.resolve()
    wanted = source_hash()
    stamp = dest / STAMP
    built = _extensions(dest)
    if built and stamp.is_file() and stamp.read_text() == wanted:
        with tempfile.TemporaryDirectory(prefix="ampmeter-ext-") as keep:
            kept = []
            for path in built:
                aside = Path(keep) / path.relative_to(dest).as_posix().replace("/", "__")
                shutil.move(path, aside)
                kept.append((aside, path))
            target = dest / "ampmeter"
            shutil.rmtree(target)
            shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
            for aside, path in kept:
                shutil.move(aside, path)
        return built
    stamp.unlink(missing_ok=True)
    built = compile_into(dest)
    stamp.write_text(wanted)
    return built


def compile_into(dest: Path, *, quiet: bool = True) -> list[Path]:
    """Copy the package to ``dest/ampmeter`` and compile the hot modules there.

    Returns the extension files made (in ``dest`` and under ``dest/ampmeter``). Raises
    ``RuntimeError`` with mypyc's output when the compile fails.
    """
    dest = dest.resolve()
    target = dest / "ampmeter"
    if target.exists():
        shutil.rmtree(target)
    for stale in dest.glob("*__mypyc*.so"):
        stale.unlink()
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    with tempfile.TemporaryDirectory(prefix="ampmeter-mypyc-") as scratch:
        env = dict(os.environ, MYPYC_OPT_LEVEL=os.environ.get("MYPYC_OPT_LEVEL", "3"))
        command = [
            sys.executable, "-m", "mypyc", "--strict", "--platform", PLATFORM,
            # The hot modules use only the standard library and ampmeter. Installed packages
            # are left out, so the compile is the same (and quick) in a bare build environment
            # and in a full one; errors in the plain-Python modules it reads are not its business.
            "--no-site-packages", "--follow-imports", "silent",
            "--cache-dir", str(Path(scratch) / "mypy-cache"), *MODULES,
        ]  # fmt: skip
        result = subprocess.run(
            command, cwd=dest, env=env, capture_output=True, text=True, check=False
        )
        shutil.rmtree(dest / "build", ignore_errors=True)
    if result.returncode != 0:
        raise RuntimeError(
            "mypyc could not compile ampmeter's hot path:\n" + result.stdout + result.stderr
        )
    if not quiet:
        print(result.stdout, end="")
    built = _extensions(dest)
    expected = {Path(module).stem for module in MODULES}
    missing = expected - {path.name.split(".")[0] for path in built}
    if missing:
        raise RuntimeError(f"mypyc built no extension for: {', '.join(sorted(missing))}")
    return built


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    dest = Path(argv[0])
    dest.mkdir(parents=True, exist_ok=True)
    try:
        built = sync_into(dest)
    except RuntimeError as error:
        print(error, file=sys.stderr)
        return 1
    print(f"{dest}/ampmeter: the package, with {len(built)} compiled extensions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
