"""Generate lenserve_contract.proto (the one package of generated code) from protos/.

    python scripts/gen_protos.py           # regenerate in place
    python scripts/gen_protos.py --check   # exit 1 if the committed code is stale
"""
from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PKG = Path("lenserve_contract") / "proto"


def generate(out_root: Path) -> list[Path]:
    import grpc_tools
    from grpc_tools import protoc  # imported here: only the generator needs grpcio-tools

    protos = sorted((PROTO_ROOT / PKG).glob("*.proto"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out_root / PKG).glob("*_pb2*.py*"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args()
    if not args.check:
        generate(ROOT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = [
            f.name for f in fresh
            if not (ROOT / PKG / f.name).exists() or not filecmp.cmp(f, ROOT / PKG / f.name, False)
        ]
    if stale:
        print("stale generated code (run python scripts/gen_protos.py):", ", ".join(stale))
        return 1
    print("generated code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
