#!/usr/bin/env python3
"""The GPU kit's build helper (standard library only; Python >= 3.11 for tomllib; no Python 3.12 needed).

build_kit.sh calls it; tests/unit/test_gpu_kit.py tests it. Subcommands:

  kit.py pins PYPROJECT SGLANG_PINS RUNTIME_PINS   the merged pin list (name==version lines) on stdout, the
                                                    merge on stderr; fails when pyproject.toml disagrees
  kit.py plan PINS LOCK CACHE      the pip requirement lines still to download (with --hash where locked)
  kit.py check PINS LOCK CACHE     the wheel file of each pin; fails on a missing file or a sha256 mismatch
  kit.py unpack STAGE WHEEL...     unzip wheels into a site-packages tree, as `pip install --target` lays it out
  kit.py prune SITE PRUNE_LIST     remove what prune.txt names (globs), then check the tree (REQUIRED below)
  kit.py pack OUTDIR KIT_ID CAP STREAM...   split the concatenated streams (name=path) into the fewest
                                   parts of at most CAP bytes, OUTDIR/pK/{chunk.K,manifest}
  kit.py assemble PARTS_DIR DEST   (for tests and local checks) verify the chunks, write each stream to DEST/

The parts: every stream (the xz'd tar, then the GGUF) is concatenated into one byte sequence, which is
cut into N equal chunks (N = ceil(total / CAP)); each part folder holds its chunk and the manifest, the
same file in every part:
    kit <id>                       the build id (inputs' hash)
    parts <N>
    stream <name> <offset> <length> <sha256>
    chunk <k> <file> <length> <sha256>
setup.sh (bash, on the GPU host) reads it with awk.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import math
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

INSTALLER = b"rljob-gpu-kit\n"
# what the pruned tree must hold (path relative to the site root; a glob where a version is in the name)
REQUIRED = [
    "sglang/__init__.py",
    "sglang/srt/server_args.py",
    "sgl_kernel/sm90/common_ops.abi3.so",
    "ray/__init__.py",
    "ray/_raylet.so",
    "megatron/core/__init__.py",
    "sglang_router/__init__.py",
    "torch_memory_saver/__init__.py",
    "torch_memory_saver_hook_mode_preload_cu13.abi3.so",
    "transformers-5.12.1.dist-info",
    "tokenizers-0.22.2.dist-info",
]
# what the prune must have removed
ABSENT = ["sgl_kernel/flash_ops.abi3.so", "ray/jars", "ray/rllib", "bin"]


# ---- pins -----------------------------------------------------------------------------------------------
def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path) -> list[tuple[str, str]]:
    """`name==version` lines; '#' starts a comment. A name twice is an error."""
    pins, seen = [], set()
    for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9.+!_-]+)", line)
        if not m:
            raise ValueError(f"{path}:{n}: {line!r} is not name==version")
        if canon(m[1]) in seen:
            raise ValueError(f"{path}:{n}: {m[1]} is pinned twice")
        seen.add(canon(m[1]))
        pins.append((m[1], m[2]))
    return pins


def merge_pins(sglang, runtime):
    """The SGLang kit's pins, then the runtime's that it lacks. Where both pin a package, SGLang's version
    wins (it is the set that ran with SGLang). Returns (merged, [(name, runtime_version, sglang_version)])."""
    ours = {canon(n): v for n, v in sglang}
    merged, overridden = list(sglang), []
    for name, ver in runtime:
        if canon(name) in ours:
            if ours[canon(name)] != ver:
                overridden.append((name, ver, ours[canon(name)]))
            continue
        merged.append((name, ver))
    return merged, overridden


# ---- pyproject agreement ---------------------------------------------------------------------------------
def _vkey(v: str) -> tuple:
    """Release numbers of a version (1.2.post3 -> (1, 2)); enough for the pins this kit holds."""
    m = re.match(r"(\d+(?:\.\d+)*)", v.strip())
    if not m:
        raise ValueError(f"version {v!r}")
    parts = [int(x) for x in m[1].split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def satisfies(version: str, spec: str) -> bool:
    """`version` against a comma-separated specifier ('>=0.3,<0.4'); an empty spec accepts anything."""
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = re.fullmatch(r"(===|==|!=|~=|>=|<=|>|<)\s*(\S+)", clause)
        if not m:
            raise ValueError(f"specifier {clause!r}")
        op, want = m.groups()
        if op in ("==", "===") and want.endswith(".*"):
            p = _vkey(want[:-2])
            ok = _vkey(version)[: len(p)] == p
        elif op in ("==", "==="):
            plain = op == "==" and all(re.fullmatch(r"[\d.]+", x) for x in (version, want))
            ok = version == want or (plain and _vkey(version) == _vkey(want))  # 2.0 == 2.0.0
        else:
            a, b = _vkey(version), _vkey(want)
            ok = {"!=": a != b, ">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b}.get(op)
            if op == "~=":
                prefix = _vkey(want)[:-1] or _vkey(want)
                ok = a >= b and a[: len(prefix)] == prefix
        if not ok:
            return False
    return True


def parse_requirement(req: str) -> tuple[str, str]:
    """'ray[default]>=2.40 ; python_version>"3"' -> ('ray', '>=2.40')."""
    req = req.split(";", 1)[0].strip()
    m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)", req)
    if not m:
        raise ValueError(f"requirement {req!r}")
    return m[1], m[3].strip()


def check_pyproject(pyproject, pins) -> list[str]:
    """Problems between pyproject.toml and the kit's pins: the `gpu` extra must pin sglang exactly to the
    kit's version, and every kit pin that pyproject names anywhere must satisfy pyproject's specifier."""
    import tomllib

    data = tomllib.loads(Path(pyproject).read_text())
    project = data.get("project", {})
    groups = {"dependencies": project.get("dependencies", [])}
    groups.update({f"[{k}]": v for k, v in project.get("optional-dependencies", {}).items()})
    kit = {canon(n): v for n, v in pins}
    problems = []
    gpu = [parse_requirement(r) for r in groups.get("[gpu]", [])]
    sg = [spec for name, spec in gpu if canon(name) == "sglang"]
    if "sglang" not in kit:
        problems.append("the kit's pins have no sglang")
    elif not sg:
        problems.append(
            f"pyproject.toml's `gpu` extra names no sglang; the kit carries sglang=={kit['sglang']}"
        )
    elif sg[0].replace(" ", "") != f"=={kit['sglang']}":
        problems.append(
            f"pyproject.toml's `gpu` extra has sglang{sg[0]} but the kit carries exactly sglang=={kit['sglang']}"
            " (images/runtime/sglang-constraints.txt): make them the same (`sglang==X` in pyproject, and the kit's pins and hashes for X)"
        )
    for group, reqs in groups.items():
        for r in reqs:
            name, spec = parse_requirement(r)
            v = kit.get(canon(name))
            if canon(name) != "sglang" and v is not None and spec and not satisfies(v, spec):
                problems.append(f"pyproject.toml {group} wants {name}{spec}; the kit carries {name}=={v}")
    return problems


# ---- wheels: lock, plan, check ------------------------------------------------------------------------------
def read_lock(path) -> dict:
    """sha256sum-style lines -> {(canon name, version): (file name, sha256)}."""
    lock = {}
    if not os.path.exists(path):
        return lock
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        sha, fn = line.split(None, 1)
        fn = fn.lstrip("*")
        dist, ver = fn.split("-")[:2]
        lock[(canon(dist), ver)] = (fn, sha)
    return lock


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def candidates(cache, name, ver) -> list[str]:
    out = []
    for fn in os.listdir(cache) if os.path.isdir(cache) else []:
        if fn.endswith(".whl"):
            dist, v = fn.split("-")[:2]
            if canon(dist) == canon(name) and v == ver:
                out.append(fn)
    return sorted(out)


def plan(pins, lock, cache) -> list[str]:
    """pip requirement lines for what the cache lacks; a cached file that fails its hash is removed."""
    lines = []
    for name, ver in pins:
        locked = lock.get((canon(name), ver))
        if locked:
            fn, sha = locked
            p = os.path.join(cache, fn)
            if os.path.exists(p):
                if sha256(p) == sha:
                    continue
                print(
                    f"cache: {fn} does not match wheels.sha256; removed, to download again", file=sys.stderr
                )
                os.remove(p)
            lines.append(f"{name}=={ver} --hash=sha256:{sha}")
        elif not candidates(cache, name, ver):
            lines.append(f"{name}=={ver}")
    return lines


def check(pins, lock, cache) -> tuple[list[str], list[str], list[str]]:
    """(wheel paths, errors, unlocked sha256 lines to add to the lock)."""
    paths, bad, unlocked = [], [], []
    for name, ver in pins:
        locked = lock.get((canon(name), ver))
        if locked:
            fn, sha = locked
            p = os.path.join(cache, fn)
            if not os.path.exists(p):
                bad.append(f"{name}=={ver}: {fn} missing from {cache}")
            elif sha256(p) != sha:
                bad.append(f"{name}=={ver}: {fn} sha256 differs from wheels.sha256")
            else:
                paths.append(p)
            continue
        c = candidates(cache, name, ver)
        if len(c) != 1:
            bad.append(f"{name}=={ver}: {len(c)} wheels in {cache} ({' '.join(c) or 'none'}); expected 1")
            continue
        p = os.path.join(cache, c[0])
        unlocked.append(f"{sha256(p)}  {c[0]}")
        paths.append(p)
    return paths, bad, unlocked


# ---- unpack (as pip install --target) -------------------------------------------------------------------
def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def unpack(stage, wheels, log=print) -> None:
    """Unzip wheels into a site-packages tree: <name>.data/{purelib,platlib,data} to the root, .data/scripts
    to bin/ (pruned); .dist-info kept, with INSTALLER, REQUESTED and RECORD rewritten to the installed
    paths (no direct_url.json: it would hold the builder's path). Modes 0755 where the zip mode has an x bit,
    else 0644, directories 0755: the tree does not depend on the umask."""
    os.makedirs(stage, exist_ok=True)
    owner = {}
    for whl in sorted(wheels, key=os.path.basename):
        z = zipfile.ZipFile(whl)
        di = sorted({n.split("/", 1)[0] for n in z.namelist() if n.split("/", 1)[0].endswith(".dist-info")})
        if len(di) != 1:
            raise ValueError(f"{whl}: expected one .dist-info, found {di}")
        di = di[0]
        data_dir = di[: -len(".dist-info")] + ".data"
        moved = {}

        def target(name, whl=whl, data_dir=data_dir, moved=moved):
            parts = name.split("/")
            if name.startswith("/") or ".." in parts or "\\" in name:
                raise ValueError(f"{whl}: unsafe path {name!r}")
            if parts[0] != data_dir:
                return name
            kind, rest = parts[1], parts[2:]
            if kind in ("purelib", "platlib", "data"):
                new = "/".join(rest)
            elif kind == "scripts":
                new = "/".join(["bin", *rest])
            else:
                raise ValueError(f"{whl}: {data_dir}/{kind} is not handled")
            moved[name] = new
            return new

        for info in z.infolist():
            if info.filename.endswith("/"):
                continue
            rel = target(info.filename)
            dest = os.path.join(stage, rel)
            if rel in owner:
                print(
                    f"WARNING: {rel} from {os.path.basename(whl)} overwrites the copy from {owner[rel]}",
                    file=sys.stderr,
                )
            owner[rel] = os.path.basename(whl)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.chmod(dest, 0o755 if (info.external_attr >> 16) & 0o111 else 0o644)
        extra = {f"{di}/INSTALLER": INSTALLER, f"{di}/REQUESTED": b""}
        for rel, data in extra.items():
            Path(stage, rel).write_bytes(data)
            os.chmod(os.path.join(stage, rel), 0o644)
        rows = []
        for row in csv.reader(io.StringIO(z.read(f"{di}/RECORD").decode())):
            if not row or row[0] == f"{di}/RECORD":
                continue
            row[0] = moved.get(row[0], row[0])
            rows.append(row)
        rows += [[rel, record_hash(data), str(len(data))] for rel, data in extra.items()]
        rows.append([f"{di}/RECORD", "", ""])
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        Path(stage, di, "RECORD").write_text(buf.getvalue())
        os.chmod(os.path.join(stage, di, "RECORD"), 0o644)
        log(f"  {os.path.basename(whl)}")
    normalize_dirs(stage)


def normalize_dirs(root) -> None:
    for r, dirs, _ in os.walk(root):
        for d in dirs:
            os.chmod(os.path.join(r, d), 0o755)
    os.chmod(root, 0o755)


# ---- prune ---------------------------------------------------------------------------------------------
def read_prune(path) -> list[str]:
    """prune.txt: one path or glob (relative to the site root) per line, then '#' and the reason."""
    out = []
    for raw in Path(path).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            if line.startswith("/") or ".." in line.split("/"):
                raise ValueError(f"prune: unsafe pattern {line!r}")
            out.append(line)
    return out


def prune(site, patterns) -> tuple[int, list[str]]:
    """Remove each pattern's matches (files or folders) and every __pycache__; (bytes freed, unmatched)."""
    site = Path(site)
    freed, unmatched = 0, []
    for pat in patterns:
        hits = sorted(site.glob(pat)) if any(c in pat for c in "*?[") else [site / pat]
        hits = [h for h in hits if h.exists() or h.is_symlink()]
        if not hits:
            unmatched.append(pat)
        for h in hits:
            freed += tree_bytes(h)
            shutil.rmtree(h) if h.is_dir() and not h.is_symlink() else h.unlink()
    for p in sorted(site.rglob("__pycache__"), reverse=True):
        if p.is_dir():
            freed += tree_bytes(p)
            shutil.rmtree(p)
    return freed, unmatched


def tree_bytes(p: Path) -> int:
    if p.is_file() or p.is_symlink():
        return p.lstat().st_size
    return sum(f.lstat().st_size for f in p.rglob("*") if f.is_file())


def verify_site(site, required=REQUIRED, absent=ABSENT) -> list[str]:
    site = Path(site)
    problems = [f"missing: {r}" for r in required if not list(site.glob(r))]
    problems += [f"still present: {a}" for a in absent if (site / a).exists()]
    return problems


# ---- parts ----------------------------------------------------------------------------------------------
def _copy_exactly(reader, out, n: int, short: Exception):
    """Copy exactly ``n`` bytes from ``reader`` to ``out`` in 1 MiB reads; returns their sha256
    (raises ``short`` when the reader ends first)."""
    h = hashlib.sha256()
    while n:
        b = reader.read(min(n, 1 << 20))
        if not b:
            raise short
        out.write(b)
        h.update(b)
        n -= len(b)
    return h


def split_plan(total: int, cap: int) -> list[int]:
    """The fewest chunks of at most `cap` bytes covering `total` bytes, as equal as can be."""
    if total <= 0 or cap <= 0:
        raise ValueError("total and cap must be positive")
    n = math.ceil(total / cap)
    base, extra = divmod(total, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def pack(outdir, kit_id, cap, streams) -> list[Path]:
    """streams: [(name, path)]. Writes outdir/p1..pN (chunk.K + manifest), replacing part folders an earlier
    pack made (those with a manifest) and nothing else. Returns the part folders."""
    outdir = Path(outdir)
    sizes = [os.path.getsize(p) for _, p in streams]
    chunks = split_plan(sum(sizes), cap)
    for old in sorted(outdir.glob("p[0-9]*")):
        if (old / "manifest").is_file():
            shutil.rmtree(old)
    lines = [
        "# rljob GPU kit (benchmarks/gpu/host/build_kit.sh): the same manifest in every part",
        f"kit {kit_id}",
        f"parts {len(chunks)}",
    ]
    off = 0
    for (name, path), size in zip(streams, sizes, strict=True):
        lines.append(f"stream {name} {off} {size} {sha256(path)}")
        off += size
    folders = []
    reader = _concat(p for _, p in streams)
    for k, n in enumerate(chunks, 1):
        d = outdir / f"p{k}"
        d.mkdir(parents=True)
        with open(d / f"chunk.{k}", "wb") as f:
            h = _copy_exactly(reader, f, n, RuntimeError("streams ended early"))
        os.chmod(d / f"chunk.{k}", 0o644)
        lines.append(f"chunk {k} chunk.{k} {n} {h.hexdigest()}")
        folders.append(d)
    text = "\n".join(lines) + "\n"
    for d in folders:
        (d / "manifest").write_text(text)
        os.chmod(d / "manifest", 0o644)
    return folders


class _concat:
    def __init__(self, paths):
        self.paths, self.f = iter(list(paths)), None

    def read(self, n):
        while True:
            if self.f is None:
                p = next(self.paths, None)
                if p is None:
                    return b""
                self.f = open(p, "rb")  # noqa: SIM115 (closed at its end)
            b = self.f.read(n)
            if b:
                return b
            self.f.close()
            self.f = None


def read_manifest(path) -> dict:
    m = {"streams": [], "chunks": []}
    for line in Path(path).read_text().splitlines():
        f = line.split()
        if not f or f[0].startswith("#"):
            continue
        if f[0] == "kit":
            m["kit"] = f[1]
        elif f[0] == "parts":
            m["parts"] = int(f[1])
        elif f[0] == "stream":
            m["streams"].append({"name": f[1], "offset": int(f[2]), "length": int(f[3]), "sha256": f[4]})
        elif f[0] == "chunk":
            m["chunks"].append({"k": int(f[1]), "file": f[2], "length": int(f[3]), "sha256": f[4]})
    if m.get("parts") != len(m["chunks"]) or "kit" not in m:
        raise ValueError(f"{path}: malformed manifest")
    return m


def assemble(parts_dir, dest) -> dict:
    """Check every chunk in parts_dir against the manifest and write each stream to dest/<name>."""
    parts_dir, dest = Path(parts_dir), Path(dest)
    m = read_manifest(parts_dir / "manifest")
    for c in m["chunks"]:
        p = parts_dir / c["file"]
        if not p.is_file() or p.stat().st_size != c["length"] or sha256(p) != c["sha256"]:
            raise ValueError(f"chunk {c['k']}: {p} missing or its sha256 differs")
    reader = _concat(parts_dir / c["file"] for c in m["chunks"])
    dest.mkdir(parents=True, exist_ok=True)
    for s in m["streams"]:
        with open(dest / s["name"], "wb") as f:
            h = _copy_exactly(reader, f, s["length"], ValueError("chunks end early"))
        if h.hexdigest() != s["sha256"]:
            raise ValueError(f"stream {s['name']}: sha256 differs")
    return m


# ---- command line -------------------------------------------------------------------------------------
def main(argv) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, args = argv[0], argv[1:]
    if cmd == "pins":
        pyproject, sg, rt = args
        merged, overridden = merge_pins(read_pins(sg), read_pins(rt))
        for name, rv, sv in overridden:
            print(f"merge: {name} {sv} (SGLang kit) over {rv} (runtime pins)", file=sys.stderr)
        problems = check_pyproject(pyproject, merged)
        if problems:
            for p in problems:
                print(f"ERROR: {p}", file=sys.stderr)
            return 1
        for name, ver in merged:
            print(f"{name}=={ver}")
    elif cmd == "plan":
        pins, lock, cache = args
        for line in plan(read_pins(pins), read_lock(lock), cache):
            print(line)
    elif cmd == "check":
        pins, lock, cache = args
        paths, bad, unlocked = check(read_pins(pins), read_lock(lock), cache)
        if unlocked:
            print("NOTE: not in wheels.sha256 (append these lines to lock them):", file=sys.stderr)
            for u in unlocked:
                print("  " + u, file=sys.stderr)
        for b in bad:
            print("ERROR: " + b, file=sys.stderr)
        if bad:
            return 1
        print("\n".join(paths))
    elif cmd == "unpack":
        unpack(args[0], args[1:], log=lambda s: print(s, flush=True))
    elif cmd == "prune":
        site, plist = args
        freed, unmatched = prune(site, read_prune(plist))
        print(f"pruned {freed / 1e6:.0f} MB")
        for u in unmatched:
            print(f"WARNING: prune pattern matched nothing: {u}", file=sys.stderr)
        problems = verify_site(site)
        for p in problems:
            print(f"ERROR: {p}", file=sys.stderr)
        return 1 if problems else 0
    elif cmd == "pack":
        outdir, kit_id, cap, *streams = args
        folders = pack(outdir, kit_id, int(cap), [tuple(s.split("=", 1)) for s in streams])
        for d in folders:
            print(d)
    elif cmd == "assemble":
        m = assemble(*args)
        print(f"kit {m['kit']}: {m['parts']} chunks checked, streams {[s['name'] for s in m['streams']]}")
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
