#!/usr/bin/env bash
# Checks that the documents are true of this commit:
#   * every repository path README.md and docs/*.md name (in `code` or a link) exists;
#   * every `hookgate …` subcommand they show is one the binary accepts;
#   * docs/design.md's file map names every file under src/ (and, by the first check,
#     names no file that does not exist);
#   * every type hookgate exports is imported by one path: a file outside the type's
#     top-level module, and every test and bench, names it the same way;
#   * docs/design.md's layer picture (the one place the layers are written) names every
#     top-level module of src/, and no file imports a module of a layer above its own.
# Usage: scripts/check-docs.sh   (builds the debug binary). Exits non-zero on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --bin hookgate
bin="${CARGO_TARGET_DIR:-target}/debug/hookgate"
python3 - "$bin" <<'PY'
import glob, os, re, subprocess, sys

binary = sys.argv[1]
docs = ["README.md"] + sorted(glob.glob("docs/*.md"))
problems = []

# Repository paths: a top-level folder of the project, then a path.
path_re = re.compile(r"(?<![\w/.~-])((?:src|tests|benches|scripts|config|deploy|docs|\.ci)/[\w./*-]*)")
link_re = re.compile(r"\]\(([^)#\s]+)")
for doc in docs:
    text = open(doc, encoding="utf-8").read()
    spans = re.findall(r"`([^`\n]+)`", text) + re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    named = set()
    for span in spans:
        named.update(path_re.findall(span))
    for target in link_re.findall(text):
        if "://" in target:
            continue
        named.add(os.path.normpath(os.path.join(os.path.dirname(doc), target)))
    for path in sorted(named):
        path = path.rstrip(".,;:")
        if not glob.glob(path):
            problems.append(f"{doc}: names {path}, which does not exist")

# Subcommands: `hookgate a [b]` and `cargo run ... -- a [b]`.
def helps(words):
    run = subprocess.run([binary, *words, "--help"], capture_output=True, text=True)
    return run.returncode == 0, run.stdout

def subcommands(help_text):
    names, inside = set(), False
    for line in help_text.splitlines():
        if line.startswith("Commands:"):
            inside = True
        elif inside and line.startswith("  "):
            names.add(line.split()[0])
        elif inside and line.strip():
            inside = False
    return names

cmd_re = re.compile(r"(?:\bhookgate|cargo run(?: --release)? --)\s+([a-z][a-z-]*)(?:\s+([a-z][a-z-]*))?")
checked = set()
for doc in docs:
    text = open(doc, encoding="utf-8").read()
    spans = re.findall(r"`([^`\n]+)`", text) + re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    for span in spans:
        for first, second in cmd_re.findall(span):
            if (first, second) in checked:
                continue
            checked.add((first, second))
            ok, help_text = helps([first])
            if not ok:
                problems.append(f"{doc}: shows `hookgate {first}`, which the binary does not accept")
                continue
            nested = subcommands(help_text)
            if nested and second and second not in nested:
                problems.append(f"{doc}: shows `hookgate {first} {second}`, not one of {sorted(nested)}")

# The design map: every file under src/ has its row.
design = open("docs/design.md", encoding="utf-8").read()
for path in sorted(glob.glob("src/**/*", recursive=True)):
    if os.path.isfile(path) and f"`{path}`" not in design:
        problems.append(f"docs/design.md: the file map has no row for {path}")

# One path per type: `use crate::…` in src/ (from outside the file's own top-level module)
# and `use hookgate::…` in tests/ and benches/ name each type by one path.
def use_items(text):
    def split(body):
        out, depth, cur = [], 0, ""
        for ch in body:
            depth += (ch == "{") - (ch == "}")
            if ch == "," and depth == 0:
                out.append(cur)
                cur = ""
            else:
                cur += ch
        return [item for item in out + [cur] if item]
    def expand(prefix, body):
        for item in split(body):
            if "{" in item:
                head, rest = item.split("{", 1)
                yield from expand(prefix + head, rest.rsplit("}", 1)[0])
            else:
                yield prefix + item
    head, _, rest = text.partition("{")
    return list(expand(head, rest.rsplit("}", 1)[0])) if rest else [text]

paths_of = {}
for top, root in (("src", "crate"), ("tests", "hookgate"), ("benches", "hookgate")):
    for path in glob.glob(f"{top}/**/*.rs", recursive=True):
        own = path.split("/")[1].removesuffix(".rs") if top == "src" else None
        text = open(path, encoding="utf-8").read()
        for use in re.finditer(r"(?m)^\s*(?:pub(?:\([^)]*\))? )?use (" + root + r"::[^;]*);", text):
            for item in use_items(re.sub(r"\s+", "", re.sub(r"\s+as\s+", "@", use.group(1)))):
                segments = item.split("@")[0].split("::")
                name = segments[-1]
                if not name[:1].isupper() or (own and segments[1] == own):
                    continue
                module = "::".join(["hookgate"] + segments[1:-1])
                paths_of.setdefault(name, {}).setdefault(module, path)
for name, modules in sorted(paths_of.items()):
    if len(modules) > 1:
        each = "; ".join(f"{m}::{name} ({f})" for m, f in sorted(modules.items()))
        problems.append(f"{name} is imported by {len(modules)} paths: {each}")

# Layers: the picture under "## Layers" in docs/design.md, top layer first. A line's first
# column lists modules; a column ending in "," goes on on the next line; "core:" is a label.
picture = design.split("## Layers", 1)[1].split("```", 2)[1]
layers, names = [], ""
for line in picture.strip("\n").splitlines():
    names += " " + line[:31].strip()
    if names.rstrip().endswith(","):
        continue
    layers.append({n.strip() for n in names.replace("core:", "").split(",") if n.strip()})
    names = ""
layer_of = {m: i for i, layer in enumerate(layers) for m in layer}
modules = {os.path.basename(p).removesuffix(".rs") for p in glob.glob("src/*.rs")}
modules |= {os.path.basename(os.path.dirname(p)) for p in glob.glob("src/*/mod.rs")}
modules -= {"lib"}
for module in sorted(modules - set(layer_of)):
    problems.append(f"docs/design.md: the layer picture does not name the module {module}")
for path in sorted(glob.glob("src/**/*.rs", recursive=True)):
    own = path.split("/")[1].removesuffix(".rs")
    if own not in layer_of:
        continue
    text = open(path, encoding="utf-8").read()
    for used in sorted(set(re.findall(r"\bcrate::([a-z_]+)", text))):
        if used in layer_of and layer_of[used] < layer_of[own]:
            problems.append(f"{path} ({own}) imports crate::{used}, a layer above it in docs/design.md")

for problem in problems:
    print(problem, file=sys.stderr)
print(f"check-docs: {len(docs)} documents, {len(checked)} commands checked, {len(problems)} problems")
sys.exit(1 if problems else 0)
PY
