#!/usr/bin/env python3
"""Every file path the documents cite exists in the tree, or says whose tree it is in.

Reads README.md, CHANGELOG.md, docs/*.md and python/README.md, and for every token that looks like a
path of this repository (it starts with one of the top-level folders, or names a file by an extension
this tree uses) checks that the tracked tree holds it. Brace lists (`a-{b,c}.json`) are expanded and
globs (`*`) must match at least one file. A bare file name (`bwd_sm90_ws.cu`) must be the name of a
file somewhere in the tree. Accepted without a check: build outputs (`build/...`, `.ab/...`, `$OUT`),
URLs, the files `make` writes or the reader makes (NOT_IN_TREE), templates (`<date>-<card>.json`),
system headers (`<cuda.h>`), and a path named with whose tree it is in: after a peer's name
("FlashMLA's csrc/...", "CUTLASS (`include/...`)"), or with a commit on the same line that holds
it (`e55e504:cuda/...`, "e55e504's cuda/..."), which git confirms where the clone has that commit.
CI runs it (.ci/run); it reads only text and git objects, in about a second.

Exit status 0 when every cited path resolves, 1 with one line per dead path otherwise.
Usage: python3 .ci/doc_paths.py [FILE.md ...]
"""
import fnmatch
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TOP = ("cuda", "src", "bench", "tests", "docs", "dev", "include", "python", "examples", ".ci")
EXTS = ("cu", "cuh", "c", "h", "py", "sh", "md", "json", "png", "toml", "pc")
# a path, a brace list or a glob: no spaces; ends at a backtick, a quote, a bracket or a space
TOKEN = re.compile(r"[A-Za-z0-9_.$*{},/+-]+")
# the projects whose files the documents cite
PEERS = ("FlashMLA", "CUTLASS", "cuDNN", "cuDNN FE", "cudnn-frontend", "FlashAttention",
         "FlashAttention-3", "FA3", "PyTorch", "torch", "DeepGEMM", "ThunderKittens", "CUB", "CCCL",
         "DeepSeek", "vLLM", "SGLang", "TileLang", "Triton", "the CUDA toolkit", "the toolkit", "NVIDIA",
         "Criterion")
_NAMES = "|".join(re.escape(p) for p in PEERS)
# "FlashMLA's csrc/..." (up to three words between), or "CUTLASS (`include/...`)" right after the name
PEER_RE = re.compile(r"\b(?:%s)(?:'s\s+(?:\S+\s+){0,3}\S*|\s*[(`\[]*)$" % _NAMES)
# named without being tree files: what `make` writes (the pkg-config files) and the reader's own
# program in the README's link lines; paths under an install prefix start with lib/
NOT_IN_TREE = {"dsa.pc", "dsa-static.pc", "app.c"}


def tracked():
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True,
                             check=True).stdout
        files = set(out.split())
    except (OSError, subprocess.CalledProcessError):
        files = set()
        for d, _, names in os.walk(ROOT):
            if "/.git" in d or "/build" in d:
                continue
            for n in names:
                files.add(os.path.relpath(os.path.join(d, n), ROOT))
    # a file added but not yet committed counts too
    return {f for f in files if os.path.exists(os.path.join(ROOT, f))}


def expand(tok):
    m = re.search(r"\{([^{}]*)\}", tok)
    if not m:
        return [tok]
    out = []
    for alt in m.group(1).split(","):
        out += expand(tok[:m.start()] + alt + tok[m.end():])
    return out


def in_commit(commit, path):
    r = subprocess.run(["git", "-C", ROOT, "cat-file", "-e", "%s:%s" % (commit, path)],
                       capture_output=True)
    return r.returncode == 0


def history_known(commit):
    r = subprocess.run(["git", "-C", ROOT, "cat-file", "-e", commit + "^{commit}"], capture_output=True)
    return r.returncode == 0


def holders(before, after):
    """The commits a path is named with: `C:path`, "C's path", "C holds path", "path (C holds it)",
    "the tree of C ... path" (a few words apart at most)."""
    near = r"(?:\S+\s+){0,2}[`(]*$"
    pats = [r"\b([0-9a-f]{7,40}):$", r"\b([0-9a-f]{7,40})'s\s+" + near,
            r"\b([0-9a-f]{7,40}) holds\s+" + near, r"\btree of ([0-9a-f]{7,40})\b[^.;]{0,60}$"]
    found = [m.group(1) for p in pats for m in [re.search(p, before)] if m]
    m = re.match(r"[^()]{0,100}\(([0-9a-f]{7,40}) holds", after)
    return found + ([m.group(1)] if m else [])


def looks_like_path(tok):
    if "/" in tok:
        head = tok.split("/", 1)[0]
        if head in TOP:
            return True
        return bool(re.search(r"\.(%s)$" % "|".join(EXTS), tok)) and not tok.startswith(("/", "~"))
    return bool(re.fullmatch(r"[A-Za-z0-9_.*-]+\.(%s)" % "|".join(EXTS), tok))


def check_file(md, files, basenames):
    dead = []
    text = open(os.path.join(ROOT, md), encoding="utf-8").read()
    lines = text.split("\n")
    for lineno, line in enumerate(lines, 1):
        prev = lines[lineno - 2] if lineno > 1 else ""
        for m in TOKEN.finditer(line):
            tok = m.group(0).strip(".,;:")
            start = m.start()
            if tok.startswith("<") or not looks_like_path(tok):
                continue
            if tok in NOT_IN_TREE or tok.startswith(("lib/", "build/", ".ab/", "$", "OUT", "/", "http", "www.")):
                continue
            if "://" in line[max(0, start - 10):start + 3]:
                continue
            # a template (`<date>-<card>-full.json`): the token touches a placeholder
            end = m.end()
            if line[start - 1:start] == ">" or line[end:end + 1] == "<":
                continue
            # a system header (`<cudaTypedefs.h>`)
            if line[start - 1:start] == "<" and line[end:end + 1] == ">":
                continue
            before = line[:start]
            if PEER_RE.search(before) or (not before.strip(" `(") and PEER_RE.search(prev.rstrip() + " ")):
                continue
            commits = holders(before, line[end:])
            for cand in expand(tok):
                cand = cand.strip(".,;:")
                if cand.startswith("./"):
                    cand = cand[2:]
                if md.startswith("docs/") and cand.startswith("img/"):
                    cand = "docs/" + cand
                if md.startswith("python/") and os.path.join("python", cand) in files:
                    continue  # python/README.md names the package's files from python/
                if "/" not in cand:
                    hit = any(fnmatch.fnmatch(b, cand) for b in basenames) if "*" in cand else cand in basenames
                elif "*" in cand:
                    hit = any(fnmatch.fnmatch(f, cand) for f in files) or \
                        any(fnmatch.fnmatch(f, cand + "/*") for f in files)
                else:
                    hit = cand in files or any(f.startswith(cand.rstrip("/") + "/") for f in files)
                if not hit and commits:
                    known = [c for c in commits if history_known(c)]
                    # a shallow clone without the named commit: it cannot be confirmed here
                    hit = not known or any(in_commit(c, cand) for c in known)
                if not hit:
                    dead.append("%s:%d: %s" % (md, lineno, cand))
    return dead


def main(argv):
    files = tracked()
    basenames = {os.path.basename(f) for f in files}
    docs = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    mds = argv[1:] or ["README.md", "CHANGELOG.md", "python/README.md"] + docs
    dead = []
    for md in mds:
        dead += check_file(md, files, basenames)
    for d in dead:
        print("dead path: " + d)
    print("doc paths: %d file(s), %d dead path(s)" % (len(mds), len(dead)))
    return 1 if dead else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
