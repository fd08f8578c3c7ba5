#!/usr/bin/env python3
"""Assembles the "real notes" corpus of the paraphrase benchmark (`coffer-bench --only
retrieval-notes`): the markdown documentation that the Rust crates of this workspace ship
(READMEs, guides, the crate docs kept as .md), copied from cargo's registry source folder
(`~/.cargo/registry/src/*/<crate>-<version>/`, filled by any `cargo build` or `cargo fetch` of
this workspace, so the versions are Cargo.lock's).

Usage:
  python3 bench/notes_corpus.py OUT_DIR           copy the pinned files (bench/notes-corpus.lock)
                                                  into OUT_DIR/<crate>/<path>, checking each
                                                  file's sha256; exit 1 naming any file missing
                                                  or changed (run `cargo fetch` first)
  python3 bench/notes_corpus.py --refresh         re-choose the files and rewrite the lock

How the files were chosen (--refresh): every `*.md` of 1 KiB or more under a crate's folder,
leaving out changelogs, licences, codes of conduct, contribution and security policies, release
notes and anything under tests/, benches/, fixtures/, testdata/ or a hidden folder (boilerplate,
not notes; Coffer skips hidden folders); one
version per crate (the highest, so two versions of syn give one set of files); files whose text
is identical to one already taken are skipped. The lock pins each file as
`<crate>-<version>/<path> <sha256>`.
"""
import hashlib
import os
import re
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCK = HERE / "notes-corpus.lock"
SKIP = re.compile(
    r"(changelog|changes|history|license|licence|code[_-]of[_-]conduct|contributing|security|releases?"
    r"|release[_-]notes)[^/]*\.md$|(^|/)(tests?|benches|fixtures?|testdata|\.[^/]*)/",
    re.IGNORECASE,
)
MIN_BYTES = 1024


def registry_roots():
    base = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo")) / "registry" / "src"
    return sorted(p for p in base.glob("*") if p.is_dir())


def version_key(v):
    return [int(x) if x.isdigit() else x for x in re.split(r"[.+-]", v)]


def sha256(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def refresh():
    best = {}  # crate -> (version key, folder)
    for root in registry_roots():
        for d in root.iterdir():
            m = re.match(r"^(.+?)-(\d+\.\d+\.\d+.*)$", d.name)
            if not m or not d.is_dir():
                continue
            name, ver = m.group(1), m.group(2)
            k = version_key(ver)
            if name not in best or k > best[name][0]:
                best[name] = (k, d)
    lines, seen = [], set()
    for name in sorted(best):
        d = best[name][1]
        for f in sorted(d.rglob("*.md")):
            rel = f.relative_to(d).as_posix()
            if not f.is_file() or f.stat().st_size < MIN_BYTES or SKIP.search(rel):
                continue
            h = sha256(f)
            if h in seen:
                continue
            seen.add(h)
            lines.append(f"{d.name}/{rel} {h}")
    LOCK.write_text(
        "# Files of the paraphrase benchmark's notes corpus: <crate>-<version>/<path> <sha256>.\n"
        "# Written by `python3 bench/notes_corpus.py --refresh`; read by `python3 bench/notes_corpus.py OUT_DIR`.\n"
        + "\n".join(lines)
        + "\n"
    )
    print(f"{LOCK}: {len(lines)} files from {len(best)} crates")


def assemble(out):
    entries = [l.split() for l in LOCK.read_text().splitlines() if l and not l.startswith("#")]
    roots = registry_roots()
    out.mkdir(parents=True, exist_ok=True)
    bad = []
    for src_rel, want in entries:
        folder, _, rel = src_rel.partition("/")
        src = next((r / folder / rel for r in roots if (r / folder / rel).is_file()), None)
        if src is None:
            bad.append(f"missing: {src_rel}")
            continue
        if sha256(src) != want:
            bad.append(f"changed: {src_rel}")
            continue
        crate = re.match(r"^(.+?)-\d+\.\d+\.\d+", folder).group(1)
        dst = out / crate / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    if bad:
        sys.exit(f"{len(bad)} of {len(entries)} files not as pinned (run `cargo fetch`):\n  " + "\n  ".join(bad[:20]))
    print(f"{out}: {len(entries)} files")


if __name__ == "__main__":
    if sys.argv[1:] == ["--refresh"]:
        refresh()
    elif len(sys.argv) == 2 and not sys.argv[1].startswith("-"):
        assemble(Path(sys.argv[1]))
    else:
        sys.exit(__doc__)
