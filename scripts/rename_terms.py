"""One word, one meaning: the project's term renames, applied to the working tree it runs in.

    python scripts/rename_terms.py            # apply, print every change, then check
    python scripts/rename_terms.py --check    # change nothing; exit 1 if an old name is left
    python scripts/rename_terms.py --list     # the table: each rename and its reason

Two kinds of rename, both by pattern (never by line), so the script applies to a tree whose
code changed since it was written:

- **module moves** (:data:`MOVES`): ``git mv old new``, then every reference to the module in
  the tree: its dotted name (``a.b.old`` -> ``a.b.new``, imports, ``:mod:`` roles, patch
  strings), relative roles (``:mod:`.old```), its path and file name (``old.py``), the name
  in ``from a.b import (..., old, ...)`` and, in files that import it so, ``old.attr``; where
  the module's stem is a word of nothing else (``bare``), every word ``old``;
- **identifier renames** (:data:`IDENTIFIERS`): a regular expression with word boundaries,
  applied only to the files its globs name.

The files read are the git-tracked and untracked-but-not-ignored ``*.py *.md *.toml *.sh
*.yml`` and ``.ci/run``, except the dated records under ``docs/results/`` and ``results/``
(they keep the names of their day) and this script. Running it twice changes nothing the
second time. Afterwards every rename's check pattern is searched over the same files (the
``git grep`` of the old names); the exit status is 1 if one is found (each printed with file
and line), 2 on a conflict (both a module's old and new files exist), else 0.

The glossary these renames serve is docs/README.md, "Glossary".
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SUFFIXES = (".py", ".md", ".toml", ".sh", ".yml", ".yaml")
EXTRA_FILES = (".ci/run",)
EXCLUDED = ("docs/results/*", "results/*", "scripts/rename_terms.py")


@dataclass(frozen=True)
class Move:
    """A module whose name misleads: ``old`` and ``new`` are paths from the repository root."""

    old: str
    new: str
    reason: str
    bare: bool = False  # the old stem names nothing else: replace the word everywhere


@dataclass(frozen=True)
class Identifier:
    """``pattern`` -> ``repl`` (``re.sub``) in the files ``globs`` name (fnmatch, ``*``
    crosses folders); ``check`` (default ``pattern``) must match nowhere in ``check_globs``
    (default ``globs``) afterwards."""

    pattern: str
    repl: str
    globs: tuple[str, ...]
    reason: str
    check: str | None = None
    check_globs: tuple[str, ...] | None = None
    only_if: str | None = None  # a file is renamed only if this also matches in it

    @property
    def label(self) -> str:
        return self.repl


TRITON = "implementations/_kernels/triton"
TRITON_TESTS = "tests/implementations/_kernels/triton"
ANY = ("*",)

MOVES: tuple[Move, ...] = (
    Move(
        f"{TRITON}/plan_band.py",
        f"{TRITON}/band_plan.py",
        "the band kernels' plan: named like harness/block_plan.py and tiles/tile_plan.py "
        "(<engine>_plan), and its function band_plan",
        bare=True,
    ),
    Move(
        f"{TRITON}/plan_blocks.py",
        f"{TRITON}/blocklist_plan.py",
        "the block-list (BigBird) kernels' CSR plan; 'plan_blocks' read as a twin of "
        "harness/block_plan.py, the mask's one SKIP/FULL/PARTIAL block plan",
        bare=True,
    ),
    Move(
        f"{TRITON}/launches.py",
        f"{TRITON}/attention_launches.py",
        "the softmax attention kernels' launches (forward, backward), not every launch",
    ),
    Move(
        f"{TRITON}/launch_modes.py",
        f"{TRITON}/kernel_launch.py",
        "how any one kernel launch runs (its config: autotuned, pinned, forced; who watches "
        "it); 'mode' is the timing mode of a call",
        bare=True,
    ),
    Move(
        f"{TRITON_TESTS}/test_launch_modes.py",
        f"{TRITON_TESTS}/test_kernel_launch.py",
        "the tests of kernel_launch.py",
    ),
    Move(
        f"{TRITON}/nystrom_fused.py",
        f"{TRITON}/nystrom_path.py",
        "the fused Nystrom path's host side (which calls take it, its launches, workspace); "
        "nystrom_kernels.py is the jit code",
        bare=True,
    ),
    Move(
        f"{TRITON_TESTS}/test_nystrom_fused.py",
        f"{TRITON_TESTS}/test_nystrom_path.py",
        "the tests of nystrom_path.py",
    ),
    Move(
        "harness/maskspec.py",
        "harness/mask_fields.py",
        "MaskSpec's fields and their validation; harness/masks.py is the rules (the public "
        "API, unchanged)",
        bare=True,
    ),
    Move(
        "harness/scenarios/pointmask.py",
        "harness/scenarios/suite_mask.py",
        "a point's mask as its suite wrote it (documents as a rule) and its flat row columns",
        bare=True,
    ),
    Move(
        "harness/scenarios/decode/step_launch.py",
        "harness/scenarios/decode/step_graph.py",
        "decode's static step for a CUDA graph and its decode_graph option: a timing mode, "
        "not a kernel launch",
        bare=True,
    ),
    Move(
        "harness/distributed/launch.py",
        "harness/distributed/launcher.py",
        "the --launcher ray|slurm entry: a launcher hands shards to an engine; 'launch' is "
        "one GPU kernel launch",
    ),
    Move(
        "tests/harness/distributed/test_launch.py",
        "tests/harness/distributed/test_launcher.py",
        "the tests of launcher.py",
    ),
)

CHECKS = r"\bcheck_choice\(|\bCheckChoice\b"  # the files that hold an agreement-check choice
PROOF_FILES = (
    "benchmarks/gpu_proof.sh",
    "benchmarks/warm_cache.py",
    "docs/proof.md",
    "docs/gpu.md",
    "docs/README.md",
    "docs/triton_cache.md",
    "tests/benchmarks/*",
)
PROOF_PLAN_FILES = (
    "benchmarks/warm_cache.py",
    "docs/proof.md",
    "docs/gpu.md",
    "tests/benchmarks/test_gpu_scripts.py",
    "tests/lease/test_warm_steps.py",
)
NOT_A_MASK_PLAN = r"(?<!block )(?<!tile )(?<!band )(?<!flex )\bplan\b"
IDENTIFIERS: tuple[Identifier, ...] = (
    # plan = an engine's iteration space over the mask (the block plan, the CPU tile plan, the
    # Triton band and block-list plans, Flex's plan); the other "plans" get their own words
    Identifier(
        r"\bplan\b",
        "schedule",
        ("harness/execute/session.py", "harness/terminal.py", "tests/harness/test_terminal.py"),
        "the predicted seconds of each (point, pass) still to run: a schedule",
    ),
    Identifier(
        r"``(full|rows|auto)`` plan\b",
        r"``\1`` check",
        ANY,
        "the check choice's docstrings",
    ),
    Identifier(
        NOT_A_MASK_PLAN,
        "choice",
        ANY,
        "the agreement check a point gets: check_choice() returns a CheckChoice",
        only_if=CHECKS,
    ),
    Identifier(
        r"\bplanned_flops\b",
        "predicted_flops",
        ANY,
        "the FLOPs a point's cost model predicts for one call, not a plan",
    ),
    Identifier(r"\bplanned FLOPs\b", "predicted FLOPs", ANY, "the same, in prose"),
    Identifier(r"(?<=cost model )plans(?= for it)", "predicts", ANY, "the same, in prose"),
    Identifier(r"\bplans(?= to execute)", "is predicted", ANY, "the same, in prose"),
    Identifier(
        r"\bsteps still planned\b",
        "steps still scheduled",
        ("harness/terminal.py",),
        "the progress bar's schedule",
    ),
    Identifier(
        r"(?<![\w.-])plan\b",
        "schedule",
        (
            "benchmarks/kernel_sweep.py",
            "benchmarks/peers_linear.py",
            "benchmarks/linear_targets.py",
        ),
        "what a benchmark script will time, in order: a schedule",
    ),
    Identifier(
        r"(?<![A-Za-z])(?<!band_)(?<!tile_)(?<!block_)(?<!blocklist_)(?<!flex_)plan"
        r"(?![A-Za-z])(?!_(tables|shape|workspace|blocks|band)\b)",
        "schedule",
        (
            "tests/benchmarks/test_gpu_scripts.py",
            "tests/lease/test_warm_steps.py",
            "tests/benchmarks/test_kernel_sweep.py",
        ),
        "the GPU proof's and the kernel sweep's schedules, in their tests",
    ),
    Identifier(
        r"--plan-json\b",
        "--schedule-json",
        ANY,
        "the GPU proof's step order and caps: a schedule, not a plan",
    ),
    Identifier(
        r"\bPLAN_JSON\b",
        "SCHEDULE_JSON",
        ("benchmarks/gpu_proof.sh",),
        "the GPU proof's schedule flag",
    ),
    Identifier(
        r"(?<![\w-])plan(s?)\b",
        r"schedule\1",
        ("benchmarks/gpu_proof.sh",),
        "the GPU proof's schedule (function, file, comments)",
    ),
    Identifier(
        r"\bplanned\b",
        "scheduled",
        ("benchmarks/gpu_proof.sh",),
        "the cap the GPU proof's schedule gives a step",
    ),
    Identifier(
        r"\b(its|the proof's) own plan\b|\b(the) plan\b",
        r"\1\2 schedule",
        PROOF_PLAN_FILES,
        "the GPU proof's schedule, in its docs and tests",
    ),
    Identifier(r"\bplan JSON\b", "schedule JSON", PROOF_FILES, "the GPU proof's schedule JSON"),
    # mode = how a timed call is launched (eager, CUDA graph, compile): the timing mode
    Identifier(
        r"\bCHECK_MODES\b",
        "CHECK_EXTENTS",
        ANY,
        "how much output the agreement check compares (full, rows, none): an extent",
    ),
    Identifier(
        r"(?m)^(\s+)mode: str\n(\s+)grads: bool",
        r"\1extent: str\n\2grads: bool",
        ("harness/scenarios/case.py",),
        "CheckChoice's extent field",
    ),
    Identifier(
        r"\bself\.mode\}\{'\+grads'",
        "self.extent}{'+grads'",
        ("harness/scenarios/case.py",),
        "CheckChoice.describe",
    ),
    Identifier(
        r"\b(plan|choice)\.mode\b",
        "choice.extent",
        ANY,
        "CheckChoice's extent, read",
        only_if=CHECKS,
    ),
    Identifier(
        r"(?m)(?<=^def )mode(?=\(\))|(?<== )mode(?=\(\))",
        "setting",
        ("harness/measure/allocator.py",),
        "the allocator setting a process runs with (ATTNBENCH_MALLOC: tuned, default)",
    ),
    Identifier(r"(?<=\ballocator\.)mode(?=\()", "setting", ANY, "the same, where it is read"),
    Identifier(
        r"\bMODES\b", "SETTINGS", ("harness/measure/allocator.py",), "the allocator settings"
    ),
    Identifier(
        r"\bMODE_KEY\b",
        "MASK_KEY",
        ANY,
        "the autotuner key's mask class (which clauses a mask has), not a mode",
    ),
    Identifier(r"\bmode_key\b", "mask_key", ANY, "the same key, computed on the host"),
    # variant = a suite's [[variant]] table (a contract); a scenario's words are what it serves
    Identifier(
        r"\bvariants\b",
        "serves",
        ("harness/scenarios/interface.py",),
        "the suite scenario words a Scenario serves (attention, attention+backward), "
        "not a suite [[variant]]",
    ),
    Identifier(
        r"\bvariants(?=: ClassVar)|(?<=\bscenario\.)variants\b|(?<=\bcls\.)variants\b"
        r"|(?<=\)\.)variants\b",
        "serves",
        ANY,
        "the same, where it is read",
    ),
    # segment = a run of positions a feature-map call holds at once (the segment_bytes cap)
    Identifier(
        r"\bsegment_mean\b",
        "landmark_mean",
        (f"{TRITON}/*", f"{TRITON_TESTS}/*"),
        "a Nystrom landmark: the mean of the rows j with j*m//n == i",
    ),
    Identifier(
        r"\bglobal_segment\b",
        "global_span",
        ANY,
        "a band kernel's loop over partners outside its band: a span",
    ),
    Identifier(r"\bsegment_block\b", "span_block", ANY, "a block of a span"),
    Identifier(r"\bfwd_segments\b", "fwd_spans", ANY, "the forward's spans before its band"),
    Identifier(r"\bprefix_segments\b", "prefix_spans", ANY, "a dilated prefix's span"),
    Identifier(
        r"\b(_?)segment(s?)\b",
        r"\1span\2",
        (f"{TRITON}/aot_check.py",),
        "how many loops a band kernel runs before its band (its spans)",
    ),
    Identifier(
        r"\b(cross|prefix|global|gathered) segment(s?)\b",
        r"\1 span\2",
        ANY,
        "the band kernels' spans, in prose",
    ),
    Identifier(r"\bsegment loop(s?)\b", r"span loop\1", ANY, "the same"),
    Identifier(
        r"(?<![\w.])segment(s?)\b(?!_)",
        r"span\1",
        (
            f"{TRITON}/plan_band.py",
            f"{TRITON}/band_plan.py",
            f"{TRITON}/primitives.py",
            "docs/kernels.md",
        ),
        "the band kernels' spans: every other 'segment' in these files",
    ),
    Identifier(
        r"\bsegment(s?)\b(?![- ]means?\b)",
        r"row group\1",
        (f"{TRITON}/nystrom_kernels.py",),
        "the rows a Nystrom landmark averages",
    ),
    Identifier(
        r"\bone segment: none\b",
        "one document: none",
        ("implementations/flash_tiled.py",),
        "the document spans' comment",
    ),
    Identifier(
        r"\bsegment_means\b",
        "landmark_means",
        ANY,
        "the PyTorch path's landmarks, named as the kernels' landmark_mean",
    ),
    Identifier(
        r"\bsegment[- ]mean(s?)\b",
        r"row-group mean\1",
        (
            "implementations/nystrom.py",
            "docs/linear_attention.md",
            f"{TRITON}/*",
            f"{TRITON_TESTS}/*",
        ),
        "the same, in prose: a landmark is the mean of a group of consecutive rows",
    ),
    Identifier(
        r"(?<![\w.])Segment(s?)\b(?![-_])",
        r"Row group\1",
        ("implementations/nystrom.py", f"{TRITON_TESTS}/test_nystrom_path.py"),
        "the rows a landmark averages",
    ),
    Identifier(
        r"(?<![\w.])segment(s?)\b(?![-_])",
        r"row group\1",
        ("implementations/nystrom.py", f"{TRITON_TESTS}/test_nystrom_path.py"),
        "the same",
    ),
    Identifier(
        r"\b_segment\b",
        "_between_cuts",
        ("implementations/_kernels/tiles/tile_plan_band.py",),
        "the (kind, prefix?, empty?) of the rows between two cuts of a tile band",
    ),
    Identifier(
        r"\bSegments\b",
        "DocSpans",
        ("implementations/flash_tiled.py",),
        "the [start, end) of each document: document spans",
    ),
    Identifier(
        r"(?<![\w.])_segments\b",
        "_doc_spans",
        ("implementations/flash_tiled.py",),
        "the document spans of a mask",
    ),
    Identifier(
        r"(?<![\w.])segments\b", "doc_spans", ("implementations/flash_tiled.py",), "the same"
    ),
    # prefix = the prefix-LM prefix of a mask (prefix_len); a running sum of states is a scan
    Identifier(
        r"\bchunk_prefixes\b",
        "chunk_scan",
        ANY,
        "each chunk's state summed over the chunks before it: a scan (prefix sum)",
    ),
    Identifier(
        r"(?<![\w.])prefixes\b",
        "scanned",
        ("implementations/_feature_maps.py",),
        "the scanned chunk states",
    ),
    Identifier(
        r"\bfeature_prefix\b",
        "feature_scan",
        ANY,
        "the Triton kernel that scans the splits' states",
    ),
)


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def tree_files(root: Path) -> list[str]:
    """The files the renames read: tracked and untracked-not-ignored, of SUFFIXES."""
    names = git("ls-files", "-co", "--exclude-standard", cwd=root).splitlines()
    return sorted(
        {
            n
            for n in names
            if (n.endswith(SUFFIXES) or n in EXTRA_FILES)
            and (root / n).is_file()
            and not any(fnmatch.fnmatch(n, g) for g in EXCLUDED)
        }
    )


def dotted(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def move_rules(move: Move, text: str, name: str) -> list[tuple[str, str]]:
    """The (pattern, replacement) pairs that rewrite references to ``move`` in one file."""
    old_stem, new_stem = Path(move.old).stem, Path(move.new).stem
    parent = dotted(str(Path(move.old).parent))
    rules = [
        (rf"(?<![\w.]){re.escape(dotted(move.old))}(?!\w)", dotted(move.new)),
        (rf"(?<![\w/]){re.escape(move.old)}(?![\w])", move.new),
        (rf"(?<![\w\-]){re.escape(old_stem)}\.py\b", f"{new_stem}.py"),
        (rf"(?<=`)(\.|~\.){re.escape(old_stem)}(?!\w)", rf"\1{new_stem}"),
    ]
    if move.bare:
        rules.append((rf"(?<!\w){re.escape(old_stem)}(?!\w)", new_stem))
        return rules
    imports = rf"from\s+{re.escape(parent)}\s+import\s+(?:\([^)]*\)|[^\n]*)"
    same_package = str(Path(name).parent) == str(Path(move.old).parent)
    if re.search(imports, text) or (same_package and re.search(r"from\s+\.\s+import", text)):
        word = rf"(?<![\w.]){re.escape(old_stem)}(?!\w)"
        if any(re.search(word, m.group(0)) for m in re.finditer(imports, text)):
            rules.append((rf"(?<![\w.]){re.escape(old_stem)}(?=\.[A-Za-z_])", new_stem))
            rules.append(("IMPORT:" + imports, new_stem))
    return rules


def apply_rules(text: str, rules: list[tuple[str, str]], old_stem: str = "") -> str:
    for pattern, repl in rules:
        if pattern.startswith("IMPORT:"):
            word = rf"(?<![\w.]){re.escape(old_stem)}(?!\w)"
            text = re.sub(pattern[7:], lambda m, w=word, r=repl: re.sub(w, r, m.group(0)), text)
        else:
            text = re.sub(pattern, repl, text)
    return text


def selected(name: str, globs: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, g) for g in globs)


def apply(root: Path) -> int:
    """Apply every move and identifier rename; print each change. Returns 2 on a conflict."""
    status = 0
    changed: list[str] = []
    for move in MOVES:
        old, new = root / move.old, root / move.new
        if old.exists() and new.exists():
            print(f"conflict: both {move.old} and {move.new} exist; merge them by hand")
            status = 2
        elif old.exists():
            tracked = git("ls-files", "--", move.old, cwd=root).strip()
            if tracked:
                git("mv", move.old, move.new, cwd=root)
            else:
                old.rename(new)
            print(f"moved {move.old} -> {move.new}")
    for name in tree_files(root):
        path = root / name
        text = original = path.read_text()
        changes = []
        for move in MOVES:
            before = text
            text = apply_rules(text, move_rules(move, text, name), Path(move.old).stem)
            if text != before:
                changes.append(f"{Path(move.old).stem} -> {Path(move.new).stem}")
        for ident in IDENTIFIERS:
            if selected(name, ident.globs) and (
                ident.only_if is None or re.search(ident.only_if, text)
            ):
                text, count = re.subn(ident.pattern, ident.repl, text)
                if count:
                    changes.append(f"{ident.pattern} -> {ident.label} ({count})")
        if text != original:
            path.write_text(text)
            changed.append(name)
            print(f"{name}: " + "; ".join(changes))
    tidy_imports(root, changed)
    return status


def tidy_imports(root: Path, changed: list[str]) -> None:
    """Re-sort the import blocks a rename reordered (``ruff check --fix --select I``), when
    ruff is installed here (the tree's ``.venv`` or PATH); else say what to run."""
    files = [n for n in changed if n.endswith(".py")]
    if not files:
        return
    ruff = root / ".venv" / "bin" / "ruff"
    cmd = str(ruff) if ruff.exists() else shutil.which("ruff")
    if cmd is None:
        print("ruff not found: run `ruff check --fix --select I` on the files above")
        return
    done = subprocess.run([cmd, "check", "--fix", "--select", "I", "--quiet", *files], cwd=root)
    print(f"ruff check --fix --select I on {len(files)} files: exit {done.returncode}")


def check(root: Path) -> list[str]:
    """Every place an old name is still found: ``file:line: what``."""
    found = []
    files = tree_files(root)
    for move in MOVES:
        if (root / move.old).exists():
            found.append(f"{move.old}: the module still exists")
        stem = Path(move.old).stem
        patterns = [
            rf"(?<![\w.]){re.escape(dotted(move.old))}(?!\w)",
            rf"(?<![\w\-/]){re.escape(move.old)}(?!\w)",
            rf"(?<![\w\-]){re.escape(stem)}\.py\b",
        ]
        if move.bare:
            patterns.append(rf"(?<!\w){re.escape(stem)}(?!\w)")
        found += search(root, files, patterns, ANY, stem)
    for ident in IDENTIFIERS:
        found += search(
            root,
            files,
            [ident.check or ident.pattern],
            ident.check_globs or ident.globs,
            ident.label,
            ident.only_if,
        )
    return found


def search(
    root: Path,
    files: list[str],
    patterns: list[str],
    globs: tuple[str, ...],
    label: str,
    only_if: str | None = None,
) -> list[str]:
    out = []
    for name in files:
        if not selected(name, globs):
            continue
        text = (root / name).read_text()
        if only_if is not None and not re.search(only_if, text):
            continue
        for pattern in patterns:
            for m in re.finditer(pattern, text):
                line = text.count("\n", 0, m.start()) + 1
                out.append(f"{name}:{line}: {m.group(0)!r} (-> {label})")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing, only check")
    parser.add_argument("--list", action="store_true", help="print the rename table")
    parser.add_argument("--root", type=Path, default=None, help="the tree (default: git's)")
    args = parser.parse_args(argv)
    if args.list:
        for move in MOVES:
            print(f"move  {move.old} -> {Path(move.new).name}: {move.reason}")
        for ident in IDENTIFIERS:
            print(f"name  {ident.pattern} -> {ident.label}: {ident.reason}")
        return 0
    try:
        root = args.root or Path(git("rev-parse", "--show-toplevel", cwd=Path.cwd()).strip())
    except (subprocess.CalledProcessError, FileNotFoundError):
        print("rename_terms: not inside a git work tree", file=sys.stderr)
        return 2
    status = 0 if args.check else apply(root)
    left = check(root)
    for line in left:
        print(f"old name left: {line}")
    if status:
        return status
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
